"""How many entries faiss's inverted file returns per query copy, against the kNN recall.

The approximate shortlist (``search.approximate``) asks faiss for ``kq = E m / U`` key copies
per query copy (``m`` candidates, ``U`` query copies). For each size n of Fashion-MNIST train +
test (+-15 degrees, 7 angles, +-1 px, the estimator's default search of these images) and each
``E``, one process:

- the shortlist of ``m = 96`` candidates (``approximate_shortlist`` of the steerable
  descriptors, each image its own key left out): seconds, and the share of the exact invariant
  top-15 it holds;
- the kNN graph from it (``neighbor_search`` with these candidates and the default pass over
  the neighbours' neighbours, k = 15): seconds, and the recall of the exact top-15.

The exact top-15 of ``--queries`` random queries comes from ``grid_search`` against all n
images (the grid without refinement, so that both sides search the same transformations).
Sizes above 10,000 need Debian's ``dataset-fashion-mnist`` (``load_fashion_mnist("all")``).

    python benchmarks/bench_shortlist_entries.py --n 10000 20000 70000 --entries 9 6

Writes ``benchmarks/results/shortlist_entries.json``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, write_json  # noqa: E402

K = 15
CANDIDATES = 96


def _recall(exact, found, queries):
    got = found[queries]
    return float(np.mean([len(set(exact[i].tolist()) & set(got[i].tolist())) / K
                          for i in range(len(queries))]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[10000, 20000, 70000])
    p.add_argument("--entries", type=float, nargs="+", default=[9.0, 6.0])
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--out", default=str(RESULTS / "shortlist_entries.json"))
    args = p.parse_args(argv)

    from invariant_cluster.alignment import grid_search, make_search_grid
    from invariant_cluster.datasets import load_fashion_mnist
    approximate = importlib.import_module("invariant_cluster.search.approximate")
    shortlist = importlib.import_module("invariant_cluster.search.shortlist")

    X_all, _ = load_fashion_mnist(split="all", return_X_y=True)
    grid = make_search_grid("se2", 15.0, 7, max_translation=1, refine=False)
    rows = []
    for n in args.n:
        X = torch.as_tensor(np.asarray(X_all[:n], np.float32).reshape(-1, 1, 28, 28))
        q = np.sort(np.random.default_rng(0).choice(n, args.queries, replace=False))
        exclude = torch.arange(n)
        with torch.no_grad():
            _, exact, _ = grid_search(X[q], X, grid, k=K, exclude=torch.as_tensor(q))
            X_desc, Y_desc = shortlist.shortlist_descriptors(X, X, grid, rotate="auto")
            for entries in args.entries:
                t0 = time.perf_counter()
                cand = approximate.approximate_shortlist(X_desc, Y_desc, CANDIDATES,
                                                         exclude=exclude,
                                                         entries_per_candidate=entries)
                t1 = time.perf_counter()
                _, idx, _ = shortlist.neighbor_search(X, X, grid, k=K, candidates=cand,
                                                      exclude=exclude)
                t2 = time.perf_counter()
                rows.append({"n": n, "entries_per_candidate": float(entries),
                             "kq": int(min(2 * CANDIDATES,
                                           np.ceil(entries * CANDIDATES / X_desc.shape[1]))),
                             "shortlist_s": t1 - t0, "knn_s": t2 - t1,
                             "shortlist_recall": _recall(exact, cand, q),
                             "knn_recall": _recall(exact, idx, q)})
                print_table(rows[-1:], ["n", "entries_per_candidate", "kq", "shortlist_s",
                                        "knn_s", "shortlist_recall", "knn_recall"])
    write_json({"benchmark": "shortlist_entries", "env": environment(), "args": vars(args),
                "k": K, "n_candidates": CANDIDATES, "rows": rows,
                "note": "recall of the exact top-15 of the sampled queries; a shared 2-core "
                        "machine makes the seconds noisy"}, Path(args.out))


if __name__ == "__main__":
    main()
