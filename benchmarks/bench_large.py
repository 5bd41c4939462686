"""Beyond 70,000 images on the CPU: Fashion-MNIST in random rotated and shifted copies.

Each of the 70,000 Fashion-MNIST images (train + test, ``apt-get install
dataset-fashion-mnist``) is drawn ``--copies`` times, each copy rotated uniformly within +-15
degrees and shifted within +-1 px (``make_transformed``), and
``InvariantAttentionClusterer(n_clusters=10, max_rotation=15, n_rotations=7,
max_translation=1)`` is fitted on all of them in a fresh process with an empty numba cache.
Recorded: seconds, the process's peak resident memory, and the largest resident memory of its
child processes (the grouping's Leiden workers) and of all together, sampled every 0.5 s,
ACC / NMI against the classes, the
search plan, and the recall of the exact top-15 (the grid search of ``--recall-queries``
random images against all of them, on the fit's filtered images) by the fit's graph; where the
fit found shapes of several copies, whose graph is searched among one image of each shape, its
representative (a sample's copies are its shape, no neighbours), also the recall of the exact
top-15 among the shapes' invariant means (``recall_shapes_top15``) and among the
representatives (``recall_representatives_top15``: those that appear in ``neighbors_``, the
query's shape's own as the query).

    python benchmarks/bench_large.py --copies 3          # 210,000 images
    python benchmarks/bench_large.py --copies 15         # 1,050,000 images
    python benchmarks/bench_large.py --copies 15 --graph samples   # without the means' search

Writes the run ``n<images>`` (``n1050000`` for 15 copies) of ``benchmarks/results/large.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, scores, write_json  # noqa: E402
from make_tables import derived_rows  # noqa: E402


def copies_of_fashion(n_copies, seed=0):
    from invariant_cluster.datasets import load_fashion_mnist, make_transformed

    X, y = load_fashion_mnist(split="all", return_X_y=True)
    X = X.reshape(-1, 28, 28).astype(np.float32)
    parts = [np.asarray(make_transformed(X, max_rotation=15.0, max_translation=1,
                                         random_state=seed + c)[0], np.float32)
             for c in range(n_copies)]
    return np.concatenate(parts).reshape(-1, 784), np.tile(y, n_copies)


class TreeRSS:
    """Samples, every ``every`` seconds in a thread, the resident memory of this process and of
    its descendants (the grouping's Leiden workers) from ``/proc``: the largest sum of the
    descendants' and the largest sum of all. ``ru_maxrss`` cannot give the workers' own peak: a
    child forked from this process starts with its resident memory counted."""

    def __init__(self, every=0.5):
        import threading

        self.children_mb = self.total_mb = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    @staticmethod
    def _rss_mb(pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    @staticmethod
    def _descendants(pid):
        found, stack = [], [pid]
        while stack:
            p = stack.pop()
            try:
                tasks = os.listdir(f"/proc/{p}/task")
            except OSError:
                continue
            for t in tasks:
                try:
                    with open(f"/proc/{p}/task/{t}/children") as f:
                        kids = [int(c) for c in f.read().split()]
                except OSError:
                    kids = []
                found += kids
                stack += kids
        return found

    def _run(self, every):
        me = os.getpid()
        while not self._done.wait(every):
            children = sum(self._rss_mb(p) for p in self._descendants(me))
            self.children_mb = max(self.children_mb, children)
            self.total_mb = max(self.total_mb, children + self._rss_mb(me))

    def stop(self):
        self._done.set()
        self._thread.join()


def mean_overlap(exact, found, k=15):
    """The share of each row of ``exact`` found in the same row of ``found``, averaged."""
    return float(np.mean([len(set(a) & set(b)) / float(k) for a, b in zip(exact, found)]))


def shapes_recall(est, queries, found, k=15):
    """The share of the exact ``k`` nearest shapes of each query's shape (the grid search of
    its invariant mean against the others', ``est.shape_means_``) among the shapes of the
    samples it attended to (``found``), averaged over the queries."""
    import torch

    from invariant_cluster.search import grid_search

    shape = est.shape_labels_
    means = torch.as_tensor(np.asarray(est.shape_means_, dtype=np.float32)).reshape(
        est.n_shapes_, 1, 28, 28)
    own = torch.as_tensor(shape[queries])
    with torch.no_grad():
        _, exact, _ = grid_search(means[own], means, est._grid(refine=False), k=k, exclude=own)
    return mean_overlap(exact.numpy().tolist(), [shape[b].tolist() for b in found], k)


def representatives_recall(est, Xf, queries, k=15):
    """``(recall, n)``: the share of the exact ``k`` nearest representatives of each query's
    shape's representative (the grid search among the images the shapes' graph was searched
    on, known as the samples that appear in ``est.neighbors_``) among the shapes it attended
    to, averaged over the ``n`` queries whose shape's representative is known."""
    import torch

    from invariant_cluster.search import grid_search

    shape = est.shape_labels_
    known_reps = np.unique(est.neighbors_[:, 1:])
    rep_of = np.full(est.n_shapes_, -1)
    rep_of[shape[known_reps]] = known_reps
    known = np.flatnonzero(rep_of >= 0)
    picked = np.array([i for i in queries if rep_of[shape[i]] >= 0])
    keys = Xf[torch.as_tensor(rep_of[known])]
    own = torch.as_tensor(np.searchsorted(known, shape[picked]))
    with torch.no_grad():
        _, exact, _ = grid_search(keys[own], keys, est._grid(refine=False), k=k, exclude=own)
    found = est.neighbors_[picked, 1:k + 1]
    return mean_overlap([known[a].tolist() for a in exact.numpy()],
                        [shape[b].tolist() for b in found], k), len(picked)


def table_rows(result):
    """One table: the fit of the rotated copies, its memory, scores and recall."""
    return [{**r, "data": f"Fashion-MNIST, rotated copies, {r['data']}",
             "method": "InvariantAttentionClusterer"}
            for r in derived_rows(result, ("n", "copies"), ())]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=3)
    p.add_argument("--recall-queries", type=int, default=100)
    p.add_argument("--verbose", type=int, default=0, help="the estimator's verbose (stage times)")
    p.add_argument("--graph", default="auto", help="the estimator's graph (default: its default)")
    p.add_argument("--run", default=None,
                   help="the run's key in the JSON (default: nN for N images, nN_GRAPH for a "
                        "--graph other than auto)")
    args = p.parse_args(argv)
    import torch

    from invariant_cluster import InvariantAttentionClusterer
    from invariant_cluster.search import grid_search

    t0 = time.perf_counter()
    X, y = copies_of_fashion(args.copies)
    n = len(X)
    data_s = time.perf_counter() - t0
    est = InvariantAttentionClusterer(n_clusters=10, max_rotation=15, n_rotations=7,
                                      max_translation=1, random_state=0,
                                      graph=args.graph, verbose=args.verbose)
    sampler = TreeRSS()
    t0 = time.perf_counter()
    est.fit(X)
    fit_s = time.perf_counter() - t0
    sampler.stop()
    row = {"n": n, "copies": args.copies, "data_s": data_s, "fit_s": fit_s,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "peak_children_rss_mb": sampler.children_mb, "peak_total_rss_mb": sampler.total_mb,
           **scores(y, est.labels_), "plan": est.search_plan_.to_dict(),
           "graph": args.graph, "graph_used": est.graph_,
           "loadavg": os.getloadavg()}
    print_table([row], ["n", "fit_s", "peak_rss_mb", "peak_children_rss_mb", "peak_total_rss_mb",
                        "acc", "nmi"])
    # recall of the exact top-15 on the filtered images the fit searched
    q = np.random.default_rng(0).choice(n, args.recall_queries, replace=False)
    Xf = torch.as_tensor(est.filter_.transform(X), dtype=torch.float32).reshape(n, 1, 28, 28)
    t0 = time.perf_counter()
    with torch.no_grad():
        _, exact, _ = grid_search(Xf[q], Xf, est._grid(refine=False), k=15,
                                  exclude=torch.as_tensor(q))
    found = est.neighbors_[q, 1:16]
    row["recall_exact_top15"] = mean_overlap(exact.numpy().tolist(), found.tolist())
    row["n_shapes"] = int(est.n_shapes_)
    if est.n_shapes_ < n:
        # a fit of shapes searches one image of each shape (a sample's copies are its shape,
        # not its neighbours): the recall of the exact top-15 of the query's shape, among the
        # shapes' means and among the images searched
        row["recall_shapes_top15"] = shapes_recall(est, q, found)
        row["recall_representatives_top15"], row["recall_representatives_queries"] = (
            representatives_recall(est, Xf, q))
    row["recall_queries"] = int(args.recall_queries)
    row["recall_check_s"] = time.perf_counter() - t0
    print_table([row], ["n", "n_shapes", "recall_exact_top15", "recall_shapes_top15",
                        "recall_representatives_top15", "recall_check_s"])
    write_json({"benchmark": "large", "env": environment(), "args": vars(args), "rows": [row],
                "note": "one fresh process; the machine's other load is in loadavg"},
               RESULTS / "large.json", table_rows,
               run=args.run or (f"n{n}" if args.graph == "auto" else f"n{n}_{args.graph}"))


if __name__ == "__main__":
    main()
