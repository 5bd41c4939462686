"""The invariant kNN graph (``InvariantKNeighborsTransformer``): exact search against the
descriptor shortlist, with scikit-learn's ``NearestNeighbors`` on pixels as the lower bound.

For each n, one kNN graph of n images (``fit_transform``: ``k + 1`` entries per row, self
included) with the transformer's defaults (full circle, 36 angles, refinement) and
``n_neighbors = k`` (15, as UMAP uses):

- ``exact``: ``neighbor_search="exact"`` (every image aligned onto every image);
- ``shortlist``: ``neighbor_search="shortlist"`` (default ``n_candidates``);
- ``pixels``: ``sklearn.neighbors.NearestNeighbors`` (Euclidean on the pixels, brute force).

Reported: seconds, queries per second, peak resident memory above the start (psutil RSS sampled
in a thread, as ``bench_scaling.py``), the recall of the exact top-k (self left out), and the
share of neighbours with the query's label. Where the exact graph is not computed (n above
``--exact-max``), the recall is measured on ``--recall-queries`` random queries searched exactly
against all n images.

Data:

- ``--dataset mnist`` (default): the MNIST test split, each digit rotated by a uniform angle over
  the full circle (``make_transformed(max_rotation=180, random_state=0)``), first n images;
- ``--dataset fashion70k``: Fashion-MNIST train + test (70,000 images, as they are), from
  Debian's package, which is NOT installed by CI::

      apt-get update && apt-get install -y dataset-fashion-mnist   # files: /usr/share/datasets
      python benchmarks/bench_neighbors.py --dataset fashion70k --n 70000 --methods shortlist pixels

Commands::

    python benchmarks/bench_neighbors.py                       # n = 2000, 10000 (MNIST)
    python benchmarks/bench_neighbors.py --quick               # n = 300: seconds
    python benchmarks/bench_neighbors.py --n 2000 --run n2000

Writes the run ``default`` of ``benchmarks/results/neighbors.json`` (``quick`` with ``--quick``,
or the one ``--run`` names).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    data_home,
    environment,
    load_mnist_test,
    print_table,
    write_json,
)
from bench_scaling import timed  # noqa: E402
from make_tables import derived_rows  # noqa: E402

from invariant_cluster import InvariantKNeighborsTransformer  # noqa: E402
from invariant_cluster.datasets import load_fashion_mnist, make_transformed  # noqa: E402

METHODS = ("exact", "shortlist", "pixels")
COLUMNS = ["dataset", "n", "method", "seconds", "queries_per_s", "peak_mb", "recall",
           "label_agreement"]


def load(dataset, n, path):
    if dataset == "mnist":
        X, y = load_mnist_test(path)
        X, y = X[:n], y[:n]
        X, _ = make_transformed(X, max_rotation=180.0, random_state=0)
        return X.reshape(len(X), -1), y
    # Debian's dataset-fashion-mnist puts the files under /usr/share/datasets/fashion-mnist,
    # which the loader searches after data_home
    b = load_fashion_mnist(split="all", data_home=str(data_home(path)))
    X = (b.data if b.data.dtype != np.uint8 else b.data / 255.0).astype(np.float32)
    return X[:n].reshape(min(n, len(X)), -1), b.target[:n].astype(np.int64)


def _others(ind, n_rows, rows):
    """Neighbour lists without the query itself (the graph holds it as the first entry)."""
    out = []
    for r, row in zip(rows, ind):
        out.append([j for j in row if j != r])
    return out


def _recall(found, truth, k):
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(found, truth)]))


def _label_agreement(lists, rows, y, k):
    return float(np.mean([np.mean(y[np.asarray(lst[:k])] == y[r]) for r, lst in zip(rows, lists)]))


def graph(method, X, k):
    if method == "pixels":
        from sklearn.neighbors import NearestNeighbors

        return NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(X).kneighbors_graph(
            X, mode="distance")
    est = InvariantKNeighborsTransformer(n_neighbors=k, neighbor_search=method)
    return est.fit_transform(X)


def run(dataset, n, k, methods, exact_max, recall_queries, path, seed=0):
    X, y = load(dataset, n, path)
    n = len(X)
    rows, lists = [], {}
    for method in methods:
        if method == "exact" and n > exact_max:
            print(f"n={n}: exact graph skipped (> --exact-max {exact_max})", flush=True)
            continue
        load_before = os.getloadavg()[0]
        G, seconds, peak = timed(graph, method, X, k)
        ind = G.indices.reshape(n, -1)
        lists[method] = _others(ind, n, range(n))
        row = {"dataset": dataset, "n": n, "method": method, "k": k,
               "seconds": seconds, "queries_per_s": n / seconds, "peak_mb": peak,
               # the machine is shared: the 1-minute load before and after the measurement
               "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
               "label_agreement": _label_agreement(lists[method], range(n), y, k)}
        rows.append(row)
        print_table([row], COLUMNS)
    if "exact" in lists:
        for row in rows:
            row["recall"] = _recall(lists[row["method"]], lists["exact"], k)
            row["recall_queries"] = n
    elif any(m in lists for m in ("shortlist", "pixels")):
        # the exact top-k of a random subset of queries against all n images
        q = np.sort(np.random.default_rng(seed).choice(n, min(recall_queries, n),
                                                          replace=False))
        est = InvariantKNeighborsTransformer(n_neighbors=k, neighbor_search="exact").fit(X)
        t0 = time.perf_counter()
        _, ind = est.kneighbors(X[q], n_neighbors=k + 1)
        t_exact = time.perf_counter() - t0
        truth = _others(ind, len(q), q)
        for row in rows:
            row["recall"] = _recall([lists[row["method"]][i] for i in q], truth, k)
            row["recall_queries"] = int(len(q))
        rows.append({"dataset": dataset, "n": n, "method": "exact (recall queries only)",
                     "k": k, "seconds": t_exact, "queries_per_s": len(q) / t_exact,
                     "label_agreement": _label_agreement(truth, q, y, k),
                     "recall_queries": int(len(q))})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=["mnist", "fashion70k"], default="mnist")
    p.add_argument("--n", type=int, nargs="+", default=None)
    p.add_argument("--k", type=int, default=15)
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--exact-max", type=int, default=10000,
                   help="largest n for the exact graph (beyond: recall from a query subset)")
    p.add_argument("--recall-queries", type=int, default=1000)
    p.add_argument("--data", default=None, help="folder holding mnist/ (default ../shared/data)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="n = 300")
    p.add_argument("--out", default=None, help="the JSON (default: results/neighbors.json)")
    p.add_argument("--run", default=None,
                   help="the run's key in the JSON (default: 'quick' with --quick, else 'default')")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = args.n or ([300] if args.quick else
                       [70000] if args.dataset == "fashion70k" else [2000, 10000])
    rows = []
    for n in sizes:
        rows += run(args.dataset, n, args.k, args.methods, args.exact_max, args.recall_queries,
                    args.data)
    print()
    print_table(rows, COLUMNS)
    out = Path(args.out) if args.out else RESULTS / "neighbors.json"
    if not out.is_absolute() and args.out:
        out = Path(__file__).resolve().parent / out
    write_json({"benchmark": "bench_neighbors", "argv": sys.argv[1:], "k": args.k,
                "environment": environment(), "results": rows}, out,
               lambda r: derived_rows(r, ("dataset", "n"), records=r["results"]),
               run=args.run or ("quick" if args.quick else "default"))


if __name__ == "__main__":
    main()
