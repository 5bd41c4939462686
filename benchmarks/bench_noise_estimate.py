"""The noise estimate of ``RadialWiener`` (``noise_std="auto"``) at 8 x 8 to 64 x 64 pixels.

Clean images, and the same images with Gaussian noise of standard deviation ``sigma`` added,
measured by :func:`~invariant_cluster.denoise.estimate_noise_std` as ``RadialWiener().fit``
uses it (``auto``), by each of its two parts (``haar``: the median absolute deviation of the
diagonal Haar detail, the baseline; ``spectrum``: the quietest band of the highest
frequencies), and by the rule before issue 40 (``previous``: the Haar estimate, taken as 0
when the rings beyond 0.8 of the largest radius hold less than 0.75 of that noise's power).

The sets, ``n`` images each (all 1,797 digits, and their first 200 as in issue 40):

- 8 x 8: scikit-learn's digits (grey levels / 16);
- 16 x 16: the digits zoomed x2 (bilinear), and MNIST zoomed out 28 -> 16 (anti-aliased);
- 28 x 28: MNIST (test split, / 255);
- 64 x 64: MNIST zoomed 28 -> 64 (bilinear), and smooth random ellipses (1-3 per image,
  logistic edges one pixel wide).

    python benchmarks/bench_noise_estimate.py      # n = 2,000, 3 noise seeds: about 1 min

Writes ``benchmarks/results/noise_estimate.json``; ``--rst`` prints the user guide's table
(``docs/user_guide/convergence.rst``) from that file.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, load_mnist_test, print_table, write_json  # noqa: E402

from invariant_cluster import RadialWiener  # noqa: E402
from invariant_cluster.datasets import load_digits_images  # noqa: E402
from invariant_cluster.denoise import estimate_noise_std, radial_power  # noqa: E402

OUT = RESULTS / "noise_estimate.json"
SIGMAS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)


def resize(X: np.ndarray, size: int) -> np.ndarray:
    """``(n, H, W)`` images zoomed to ``size x size`` (bilinear, anti-aliased when smaller)."""
    t = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float64))[:, None]
    return F.interpolate(t, size=(size, size), mode="bilinear", antialias=True,
                         align_corners=False)[:, 0].numpy()


def ellipses(n: int, size: int = 64, seed: int = 0) -> np.ndarray:
    """``n`` smooth shapes: 1-3 random ellipses per image, logistic edges about 1 px wide."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size].astype(np.float64)
    X = np.zeros((n, size, size))
    for i in range(n):
        for _ in range(int(rng.integers(1, 4))):
            cy, cx = rng.uniform(size / 4, 3 * size / 4, 2)
            a, b = rng.uniform(size / 16, size / 4.5, 2)
            th = rng.uniform(0, np.pi)
            u = (yy - cy) * np.cos(th) + (xx - cx) * np.sin(th)
            v = -(yy - cy) * np.sin(th) + (xx - cx) * np.cos(th)
            d = np.sqrt((u / a) ** 2 + (v / b) ** 2)
            X[i] += rng.uniform(0.4, 1.0) / (1.0 + np.exp((d - 1.0) * min(a, b)))
    return np.clip(X, 0.0, 1.0)


def image_sets(n: int, data=None) -> dict:
    """``{name: (n, H, W) float64 images in [0, 1]}``."""
    digits = load_digits_images().images.astype(np.float64)
    mnist = load_mnist_test(data)[0][:n].astype(np.float64)
    return {
        "digits 8, first 200": digits[:200],
        "digits 8": digits[:n],
        "digits 8 -> 16": resize(digits[:n], 16),
        "MNIST 28 -> 16": resize(mnist, 16),
        "MNIST 28": mnist,
        "MNIST 28 -> 64": resize(mnist, 64),
        "ellipses 64": ellipses(n),
    }


def previous_rule(X: np.ndarray) -> float:
    """The estimate before issue 40: Haar, or 0 when the rings beyond 0.8 of the largest
    radius hold less than 0.75 of the power white noise of that level puts there."""
    sigma = estimate_noise_std(X, method="haar")
    P = radial_power(X)
    top = P[:, int(math.ceil(0.8 * (P.shape[1] - 1))):]
    h, w = X.shape[2:]
    return sigma if sigma > 0 and top.mean() >= 0.75 * sigma ** 2 * h * w else 0.0


def measure(sets: dict, sigmas, seeds) -> list[dict]:
    rows = []
    for name, clean in sets.items():
        for sigma in sigmas:
            for seed in (seeds if sigma > 0 else seeds[:1]):
                rng = np.random.default_rng(seed)
                X = (clean + sigma * rng.standard_normal(clean.shape))[:, None]
                t0 = time.perf_counter()
                auto = RadialWiener().fit(X).noise_std_
                seconds = time.perf_counter() - t0
                rows.append({"set": name, "size": clean.shape[-1], "n": len(clean),
                             "sigma": sigma, "seed": seed, "auto": auto,
                             "haar": estimate_noise_std(X, method="haar"),
                             "spectrum": estimate_noise_std(X, method="spectrum"),
                             "previous": previous_rule(X), "fit_seconds": seconds})
                print_table(rows[-1:], ["set", "sigma", "seed", "auto", "haar", "spectrum",
                                        "previous"])
    return rows


def summarise(rows) -> list[dict]:
    """Mean over the noise seeds per set and sigma, with the relative error of ``auto``."""
    out = []
    for key in dict.fromkeys((r["set"], r["sigma"]) for r in rows):
        sel = [r for r in rows if (r["set"], r["sigma"]) == key]
        s = {"set": key[0], "size": sel[0]["size"], "n": sel[0]["n"], "sigma": key[1]}
        for m in ("auto", "haar", "spectrum", "previous"):
            s[m] = float(np.mean([r[m] for r in sel]))
        s["auto_rel_error"] = (s["auto"] / key[1] - 1.0) if key[1] > 0 else None
        out.append(s)
    return out


def rst_table(result: dict) -> str:
    """The user guide's table: one row per set, ``auto / haar / previous`` per sigma."""
    summary = result["summary"]
    sigmas = list(dict.fromkeys(s["sigma"] for s in summary))
    lines = [".. list-table::", "   :header-rows: 1", "",
             "   * - images", *[f"     - sigma {s:g}" for s in sigmas]]
    for name in dict.fromkeys(s["set"] for s in summary):
        sel = {s["sigma"]: s for s in summary if s["set"] == name}
        lines.append(f"   * - {name} ({sel[sigmas[0]]['n']:,} images)")
        lines += [f"     - {sel[s]['auto']:.3f} / {sel[s]['haar']:.3f} / {sel[s]['previous']:.3f}"
                  for s in sigmas]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--sigmas", type=float, nargs="+", default=list(SIGMAS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--data", default=None)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--rst", action="store_true",
                   help="print the user guide's table from --out and exit")
    args = p.parse_args(argv)
    if args.rst:
        import json

        print(rst_table(json.loads(Path(args.out).read_text())), end="")
        return
    torch.set_num_threads(1)
    rows = measure(image_sets(args.n, args.data), args.sigmas, args.seeds)
    summary = summarise(rows)
    print_table(summary, ["set", "sigma", "auto", "haar", "spectrum", "previous",
                          "auto_rel_error"])
    write_json({"benchmark": "noise_estimate", "command": " ".join(
        ["python benchmarks/bench_noise_estimate.py", *(argv or sys.argv[1:])]),
        "config": vars(args), "env": environment(), "rows": rows, "summary": summary},
        Path(args.out))


if __name__ == "__main__":
    main()
