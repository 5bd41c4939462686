"""Noisy rotated MNIST: the estimator on the pixels against the estimator on a DihedralPCA copy.

A route measured for noisy images: ``DihedralPCA(40)`` (no zoom) denoises the
digits, and ``InvariantAttentionClusterer(n_clusters=10, random_state=seed)`` at its defaults
(only the search range of ``bench_noise.py`` set) is fitted on the copy, against the same
estimator on the noisy pixels, on the same images (``bench_noise.noisy``: ``n`` MNIST test
digits rotated within +-45 degrees, Gaussian noise ``sigma``). Seconds include the PCA.

    python benchmarks/bench_noise_pca.py               # n = 2,000, sigma 0.5 0.8 0, 3 seeds

Writes ``benchmarks/results/noise_pca_<n>.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, scores, write_json  # noqa: E402
from bench_noise import SEARCH, noisy  # noqa: E402

from invariant_cluster import DihedralPCA, InvariantAttentionClusterer  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 0.8, 0.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--components", type=int, default=40)
    p.add_argument("--data", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = []
    for sigma in args.sigmas:
        for seed in args.seeds:
            X, _, y = noisy(args.n, sigma, seed, args.data)
            for name in ("pixels", f"DihedralPCA({args.components})"):
                t0 = time.perf_counter()
                Z = X if name == "pixels" else DihedralPCA(args.components).fit_transform(
                    X.reshape(len(X), -1))
                est = InvariantAttentionClusterer(n_clusters=10, random_state=seed,
                                                  **SEARCH).fit(Z)
                seconds = time.perf_counter() - t0
                rows.append({"sigma": sigma, "seed": seed, "input": name,
                             **scores(y, est.labels_), "seconds": seconds})
                print_table(rows[-1:], ["sigma", "seed", "input", "acc", "nmi", "seconds"])
    summary = []
    for sigma in args.sigmas:
        for name in dict.fromkeys(r["input"] for r in rows):
            sel = [r for r in rows if r["sigma"] == sigma and r["input"] == name]
            summary.append({"sigma": sigma, "input": name,
                            **{f"{m}_mean": float(np.mean([r[m] for r in sel]))
                               for m in ("acc", "nmi", "seconds")}})
    print_table(summary, ["sigma", "input", "acc_mean", "nmi_mean", "seconds_mean"])
    out = Path(args.out) if args.out else RESULTS / f"noise_pca_{args.n}.json"
    write_json({"benchmark": "noise_pca", "n": args.n, "search": SEARCH,
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "environment": environment(), "summary": summary, "rows": rows}, out)


if __name__ == "__main__":
    main()
