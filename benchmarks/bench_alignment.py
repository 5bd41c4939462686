"""Alignment search: ``invariant_distances`` against a straightforward per-pair kornia search.

The reference loops over pairs in Python and, for each pair, warps the key by every grid
transformation in one kornia call (``warp_se2``) and takes the smallest squared distance: what
one writes without the matrix-product formulation. Both search the same grid with no refinement,
so their distances must agree to round-off. Prints a table and writes
``benchmarks/results/alignment.json``.

    python benchmarks/bench_alignment.py            # MNIST digits, 28 x 28
    python benchmarks/bench_alignment.py --quick
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    environment,
    load_mnist_test,
    print_table,
    table,
    write_json,
)

from invariant_cluster import invariant_distances, warp_se2  # noqa: E402
from invariant_cluster.alignment import make_search_grid  # noqa: E402


def per_pair_search(X, Y, grid):
    """Loop over pairs; one batched kornia warp of the key per pair over the whole grid."""
    params = np.array([[a, tx, ty] for a in grid.angles for tx, ty in grid.shifts],
                      dtype=np.float32)
    P = torch.as_tensor(params)
    Xt, Yt = torch.as_tensor(X), torch.as_tensor(Y)
    D = np.empty((len(X), len(Y)))
    for i in range(len(X)):
        for j in range(len(Y)):
            warped = warp_se2(Yt[j:j + 1].expand(len(P), -1, -1), P)
            D[i, j] = float(((warped - Xt[i]) ** 2).sum((1, 2)).min())
    return D


def run(args):
    images, _ = load_mnist_test(args.data)
    rng = np.random.default_rng(0)
    rows = []
    for max_translation in (0, 2):
        grid = make_search_grid("se2", 180.0, args.n_rotations, max_translation, False)
        X = images[rng.choice(len(images), args.n_ref, replace=False)]
        t0 = time.perf_counter()
        D_ref = per_pair_search(X, X, grid)
        t_ref = time.perf_counter() - t0
        invariant_distances(X[:8], n_rotations=args.n_rotations,
                            max_translation=max_translation, refine=False)  # warm-up
        t0 = time.perf_counter()
        D = invariant_distances(X, n_rotations=args.n_rotations,
                                max_translation=max_translation, refine=False, device="cpu")
        t_ours = time.perf_counter() - t0
        Xl = images[rng.choice(len(images), args.n_large, replace=False)]
        t0 = time.perf_counter()
        invariant_distances(Xl, n_rotations=args.n_rotations, max_translation=max_translation,
                            refine=False, device="cpu")
        t_large = time.perf_counter() - t0
        work_ref = len(X) ** 2 * grid.size
        work_large = len(Xl) ** 2 * grid.size
        rows.append({
            "grid": f"{len(grid.angles)} rot x {len(grid.shifts)} shifts",
            "n_ref": len(X),
            "per_pair_s": t_ref,
            "per_pair_rate": work_ref / t_ref,
            "ours_s_same": t_ours,
            "ours_rate_same": work_ref / t_ours,
            "n_large": len(Xl),
            "ours_s_large": t_large,
            "ours_rate_large": work_large / t_large,
            "speedup_same": t_ref / t_ours,
            "speedup_rate": (work_large / t_large) / (work_ref / t_ref),
            "max_abs_diff": float(np.abs(D - D_ref).max()),
            "max_rel_diff": float(np.abs(D - D_ref).max() / np.abs(D_ref).max()),
        })
    print_table(rows, ["grid", "n_ref", "per_pair_rate", "ours_rate_same", "ours_rate_large",
                       "speedup_same", "speedup_rate", "max_abs_diff"])
    print("rates are pairs x transformations per second")
    return {"benchmark": "alignment", "env": environment(), "args": vars(args), "rows": rows}


def table_rows(result):
    """One table per grid of transformations: the pairs per second of each search."""
    recs = []
    for r in result.get("rows", []):
        n = r.get("n_large", "n")
        recs += [{"grid": r["grid"], "method": "kornia, one pair at a time",
                  "pairs/s": r["per_pair_rate"]},
                 {"grid": r["grid"], "method": "ours, the same pairs",
                  "pairs/s": r["ours_rate_same"], "speed-up": f"{r['speedup_same']:.0f}x",
                  "max rel. difference": r["max_rel_diff"]},
                 {"grid": r["grid"], "method": f"ours, {n} x {n} pairs",
                  "pairs/s": r["ours_rate_large"], "speed-up": f"{r['speedup_rate']:.0f}x"}]
    return table(result, recs, lambda r: f"image pairs (MNIST digits), {r['grid']}",
                 lambda r: r["method"], {k: k for k in ("pairs/s", "speed-up",
                                                        "max rel. difference")})

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder with the MNIST test split")
    p.add_argument("--n-rotations", type=int, default=36)
    p.add_argument("--n-ref", type=int, default=30, help="images for the per-pair search")
    p.add_argument("--n-large", type=int, default=1000, help="images for our rate at scale")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(RESULTS / "alignment.json"))
    p.add_argument("--run", default=None,
                   help="the run's key in the JSON (default: 'quick' with --quick, else 'default')")
    args = p.parse_args(argv)
    if args.quick:
        args.n_ref, args.n_large, args.n_rotations = 6, 60, 8
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = run(args)
    write_json(result, __import__("pathlib").Path(args.out), table_rows,
               run=args.run or ("quick" if args.quick else "default"))
    return result


if __name__ == "__main__":
    main()
