"""The approximate shortlist: faiss's inverted file against pynndescent's graph, in one run.

Fashion-MNIST (+-15 degrees, 7 angles, +-1 px; the estimator's default search of these images),
each measurement in a fresh process, with

- the shortlist alone (``approximate_shortlist`` of the steerable descriptors, 96 candidates,
  each image its own key left out): seconds, peak memory, and recall of the exact descriptor
  shortlist (``shortlist``) of ``--queries`` sampled queries;
- the whole kNN search (``neighbor_search``, k = 15, the default approximate path): seconds,
  peak memory, and recall of the exact invariant top-15 (``grid_search``) of
  ``--knn-queries`` sampled queries;
- ``--cold``: a fresh process with ``NUMBA_CACHE_DIR`` pointed at a new empty folder fits
  ``InvariantAttentionClusterer(max_rotation=15, n_rotations=7, max_translation=1)`` on the
  10,000 test images twice (first and second fit).

"pynndescent" runs the code of ``--baseline-ref`` (extracted with ``git archive``: the package
before faiss), "faiss-ivf" this tree's, "faiss-hnsw" this tree's with faiss's ``IndexHNSWFlat``
(M = 32, efConstruction = 40, efSearch = 128) in place of the inverted file. Sizes above
10,000 need Fashion-MNIST train + test (``load_fashion_mnist(split="all")``).

    python benchmarks/bench_shortlist.py --n 10000 --cold
    python benchmarks/bench_shortlist.py --n 70000 --hnsw-n 10000 --append

Writes ``benchmarks/results/shortlist_faiss.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, data_home, environment, print_table, write_json  # noqa: E402

K = 15
NOTE = ("Each row a fresh process, so pynndescent's rows include the numba code it compiles in "
        "every process (its on-disk cache warm). Index choice: IVF-Flat (about 2 sqrt(N) cells, "
        "8 probed, 9 m / U entries per query copy) against faiss's HNSW (M 32, efSearch 128): "
        "HNSW recalls a little more but took twice the shortlist time at 10,000 and its "
        "multi-threaded build is not reproducible. Shared 2-core machine: another benchmark "
        "(one core) and test runs overlapped these measurements; times are comparable within "
        "a row pair only roughly.")


def _images(n, data):
    from invariant_cluster.datasets import load_fashion_mnist

    if n <= 10000:
        X, y = load_fashion_mnist(split="test", return_X_y=True, data_home=str(data))
    else:
        X, y = load_fashion_mnist(split="all", return_X_y=True)
    return np.asarray(X[:n], np.float32).reshape(-1, 1, 28, 28), np.asarray(y[:n])


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _peak_mb():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _hnsw(keys, random_state=0):
    import faiss

    index = faiss.IndexHNSWFlat(keys.shape[1], 32)
    index.hnsw.efConstruction = 40
    index.add(keys)
    index.hnsw.efSearch = 128
    return index


def worker(task):
    """One measurement in this process; returns a dict (arrays saved to task["out"])."""
    import torch

    from invariant_cluster.search import (
        approximate,
        grid_search,
        make_search_grid,
        neighbor_search,
        shortlist,
        shortlist_descriptors,
    )
    from invariant_cluster.search.plan import default_n_candidates

    if task["backend"] == "faiss-hnsw":
        approximate._build_index = _hnsw
    n, kind = task["n"], task["kind"]
    X, y = _images(n, task["data"])
    sub = torch.as_tensor(task["sub"])
    grid = make_search_grid("se2", 15.0, 7, 1, refine=False, image_shape=(1, 28, 28))
    Xt = torch.as_tensor(X)
    own = torch.arange(n)
    m = default_n_candidates(K, n)
    row = {}
    if kind in ("shortlist", "shortlist_exact"):
        Xd, Yd = shortlist_descriptors(Xt, Xt, grid, rotate="auto")
        row["rss_before_mb"] = _rss_mb()
        t = time.perf_counter()
        if kind == "shortlist":
            c = approximate.approximate_shortlist(Xd, Yd, m, exclude=own)[sub]
        else:
            c = shortlist(Xd[sub], Yd, m, exclude=sub)
        row["seconds"] = time.perf_counter() - t
    elif kind == "knn":
        row["rss_before_mb"] = _rss_mb()
        t = time.perf_counter()
        _, idx, _ = neighbor_search(Xt, Xt, grid, k=K, exclude=own)
        row["seconds"] = time.perf_counter() - t
        c = idx[sub]
    elif kind == "knn_exact":
        row["rss_before_mb"] = _rss_mb()
        t = time.perf_counter()
        _, c, _ = grid_search(Xt[sub], Xt, grid, k=K, exclude=sub)
        row["seconds"] = time.perf_counter() - t
    elif kind == "fit":
        from invariant_cluster import InvariantAttentionClusterer
        from invariant_cluster.metrics import clustering_accuracy

        Xf = X.reshape(n, -1)
        for i in range(2):
            t = time.perf_counter()
            est = InvariantAttentionClusterer(max_rotation=15, n_rotations=7,
                                              max_translation=1).fit(Xf)
            row[f"fit{i + 1}_s"] = time.perf_counter() - t
        row["acc"] = float(clustering_accuracy(y, est.labels_))
        c = None
    row["peak_rss_mb"] = _peak_mb()
    if c is not None:
        np.save(task["out"], np.asarray(c))
    return row


def _run(task, tree, env_extra=None):
    """``worker(task)`` in a fresh Python process with ``tree`` first on its path."""
    env = dict(os.environ, PYTHONPATH=str(tree), **(env_extra or {}))
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import bench_shortlist as b; "
            "print('RESULT' + json.dumps(b.worker(json.loads(sys.argv[2]))))")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent),
                        json.dumps(task)], env=env, capture_output=True, text=True, cwd="/tmp")
    if p.returncode:
        raise RuntimeError(p.stderr[-3000:])
    row = json.loads(p.stdout.rsplit("RESULT", 1)[1])
    row["process_s"] = time.perf_counter() - t
    return row


def _recall(found, true):
    return float((found[:, :, None] == true[:, None, :]).any(1).mean())


def _baseline_tree(ref):
    tmp = Path(tempfile.mkdtemp(prefix="ic_baseline_"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "invariant_cluster"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], capture_output=True,
                            text=True, check=True).stdout.strip()
    return tmp, commit


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[10000])
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--knn-queries", type=int, default=300)
    p.add_argument("--hnsw-n", type=int, nargs="*", default=[10000])
    p.add_argument("--cold", action="store_true")
    p.add_argument("--baseline-ref", default="8a65ad1")
    p.add_argument("--data", default=None)
    p.add_argument("--append", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS / "shortlist_faiss.json")
    args = p.parse_args()
    base, commit = _baseline_tree(args.baseline_ref)
    trees = {"pynndescent": base, "faiss-ivf": ROOT, "faiss-hnsw": ROOT}
    data = str(data_home(args.data))
    tmp = Path(tempfile.mkdtemp(prefix="bench_shortlist_"))
    old = json.loads(args.out.read_text()) if args.append and args.out.exists() else {}
    rows = old.get("rows", [])
    for n in args.n:
        rng = np.random.default_rng(0)
        for kind, n_sub in (("shortlist", args.queries), ("knn", args.knn_queries)):
            sub = np.sort(rng.choice(n, min(n, n_sub), replace=False)).tolist()
            task = dict(n=n, kind=kind + "_exact", backend="exact", sub=sub, data=data,
                        out=str(tmp / f"{kind}_exact_{n}.npy"))
            ref_row = _run(task, ROOT)
            true = np.load(task["out"])
            backends = ["pynndescent", "faiss-ivf"] + (["faiss-hnsw"] if n in args.hnsw_n
                                                      else [])
            for backend in backends:
                task = dict(task, kind=kind, backend=backend,
                            out=str(tmp / f"{kind}_{backend}_{n}.npy"))
                row = _run(task, trees[backend])
                row = {"n": n, "stage": kind, "backend": backend,
                       "recall": _recall(np.load(task["out"]), true), "queries": len(sub),
                       "reference_s": ref_row["seconds"], **row}
                rows.append(row)
                print_table([row], ["n", "stage", "backend", "recall", "seconds",
                                    "peak_rss_mb", "rss_before_mb"])
    cold = old.get("cold", [])
    if args.cold:
        for backend in ("pynndescent", "faiss-ivf"):
            cache = tempfile.mkdtemp(prefix="numba_cache_")
            task = dict(n=10000, kind="fit", backend=backend, sub=[], data=data, out="")
            row = {"backend": backend, **_run(task, trees[backend], {"NUMBA_CACHE_DIR": cache})}
            cold.append(row)
            print_table([row], ["backend", "fit1_s", "fit2_s", "acc", "peak_rss_mb"])
    write_json({"benchmark": "bench_shortlist", "baseline_ref": commit, "k": K,
                "grid": "se2, +-15 degrees, 7 angles, +-1 px",
                "environment": environment(), "note": NOTE, "rows": rows, "cold": cold}, args.out)


if __name__ == "__main__":
    main()
