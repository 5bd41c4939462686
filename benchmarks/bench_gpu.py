"""The default path on a GPU: fits, the kNN stage, the transformer, and TF32 against FP32.

One command on a machine with a CUDA card (a fresh process; the first fit pays CUDA's start):

    python benchmarks/bench_gpu.py                      # Fashion-MNIST train + test if installed
    python benchmarks/bench_gpu.py --data-home DIR      # else the test splits under DIR

Rows, each timed with ``torch.cuda.synchronize()``:

- ``fashion``: ``InvariantAttentionClusterer(n_clusters=10, max_rotation=15, n_rotations=7,
  max_translation=1)`` on all Fashion-MNIST images found (70,000 with
  ``apt-get install dataset-fashion-mnist``), the default plan (``search_plan_``), then
  ``neighbor_search="exact"``; ACC of each;
- ``fashion_knn``: the kNN stage alone (``knn_search`` with the fit's plan) in FP32 and with TF32
  matrix products (``torch.set_float32_matmul_precision("high")``, put back afterwards): seconds,
  the largest relative change of the kept distances, and the recall of the FP32 top-15 on 500
  queries; the recall of the exact top-15 (those 500 queries against every image); then the
  fit with TF32, its ACC;
- ``mnist_rotated``: 10,000 MNIST test digits rotated within +-45 degrees,
  ``max_rotation=60, n_rotations=24`` (the clustering benchmark's row), the default plan and
  the descriptor shortlist;
- ``transformer``: ``InvariantKNeighborsTransformer(n_neighbors=15, max_rotation=15,
  n_rotations=7, max_translation=1).fit_transform`` on the Fashion-MNIST images;
- ``fresh``: the first fit of a new Python process whose caches are new, empty folders
  (matplotlib's, numba's, CUDA's compiled-kernel cache, ``XDG_CACHE_HOME``), as on a fresh
  machine: the import, the card's start, the first and the second fit; then the same with
  ``matplotlib.pyplot`` imported (and its font cache built) before the fit, because
  ``import igraph`` (the grouping's Leiden) imports it.

Targets (one H100 or H200): 70,000 Fashion-MNIST fit under 10 s with the search under 3 s;
10,000 rotated MNIST under 1 s; the transformer at 70,000 under 5 s. Writes
``benchmarks/results/gpu.json``, naming the card. ``--device cpu --quick`` checks the script
on a small set without a card.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    data_home,
    environment,
    print_table,
    scores,
    write_json,
)
from make_tables import derived_rows  # noqa: E402


def table_rows(result):
    """One table per measurement (the row's kind, its data and size), a line per path."""
    return derived_rows(result, ("row", "data", "n"), ("path", "caches", "order"))


def _sync(device):
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device):
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t


def fashion(args):
    from invariant_cluster.datasets import load_fashion_mnist

    try:
        X, y = load_fashion_mnist(split="all", return_X_y=True)
        source = "Fashion-MNIST train + test"
    except (OSError, ValueError):
        X, y = load_fashion_mnist(split="test", return_X_y=True,
                                  data_home=str(data_home(args.data_home)))
        source = "Fashion-MNIST test"
    n = min(len(X), args.n) if args.n else len(X)
    return np.ascontiguousarray(X[:n], np.float32), y[:n], source


def rotated_mnist(args, n):
    from invariant_cluster.datasets import load_mnist, make_transformed

    X, y = load_mnist(split="test", return_X_y=True, data_home=str(data_home(args.data_home)))
    X, y = X[:n].astype(np.float32), y[:n]
    X, _ = make_transformed(X.reshape(-1, 28, 28), max_rotation=45.0, random_state=0)
    return np.asarray(X, np.float32).reshape(n, -1), y


class matmul_precision:
    """``torch.set_float32_matmul_precision(value)`` within the block, put back after."""

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        import torch

        self.before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.value)

    def __exit__(self, *exc):
        import torch

        torch.set_float32_matmul_precision(self.before)


_FRESH = """
import json, sys, time
t = time.perf_counter()
import numpy as np, torch
from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_fashion_mnist
out = {"import_s": time.perf_counter() - t}
if sys.argv[1] == "plot-first":
    t = time.perf_counter()
    import matplotlib.pyplot  # noqa: F401
    out["matplotlib_pyplot_import_s"] = time.perf_counter() - t
cuda = sys.argv[2].startswith("cuda")
sync = torch.cuda.synchronize if cuda else (lambda: None)
t = time.perf_counter(); torch.zeros(1, device=sys.argv[2]); sync()
out["device_init_s"] = time.perf_counter() - t
X, y = load_fashion_mnist(split=sys.argv[3], return_X_y=True, data_home=sys.argv[4] or None)
X = X[:int(sys.argv[5])] if int(sys.argv[5]) else X
params = dict(n_clusters=10, max_rotation=15, n_rotations=7, max_translation=1,
              random_state=0, device="auto" if cuda else sys.argv[2])
for name in ("first_fit_s", "second_fit_s"):
    t = time.perf_counter()
    InvariantAttentionClusterer(**params).fit(X)
    sync()
    out[name] = time.perf_counter() - t
out["n"] = len(X)
print("FRESH" + json.dumps(out))
"""


def fresh_process(args, split, order):
    """The first fits of a new process with new, empty cache folders (see ``fresh``)."""
    import json
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        for var in ("MPLCONFIGDIR", "NUMBA_CACHE_DIR", "CUDA_CACHE_PATH", "XDG_CACHE_HOME",
                    "TORCHINDUCTOR_CACHE_DIR"):
            env[var] = os.path.join(tmp, var.lower())
            os.makedirs(env[var])
        home = str(data_home(args.data_home)) if split == "test" else ""
        run = subprocess.run(
            [sys.executable, "-c", _FRESH, order, args.device, split, home, str(args.n or 0)],
            env=env, capture_output=True, text=True, check=True)
    line = [s for s in run.stdout.splitlines() if s.startswith("FRESH")][-1]
    return json.loads(line[len("FRESH"):])


def profile_fit(X, params, device, folder, prefix=""):
    """One more default fit under cProfile and torch.profiler; text summaries in ``folder``."""
    import cProfile
    import io
    import pstats

    import torch
    from torch.profiler import ProfilerActivity, profile

    from invariant_cluster import InvariantAttentionClusterer

    folder.mkdir(parents=True, exist_ok=True)
    prof = cProfile.Profile()
    _sync(device)
    prof.enable()
    InvariantAttentionClusterer(**params).fit(X)
    _sync(device)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(60)
    (folder / f"{prefix}fit_cprofile.txt").write_text(buf.getvalue())
    activities = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as tp:
        InvariantAttentionClusterer(**params).fit(X)
        _sync(device)
    key = "cuda_time_total" if torch.device(device).type == "cuda" else "cpu_time_total"
    (folder / f"{prefix}fit_kernels.txt").write_text(
        tp.key_averages().table(sort_by=key, row_limit=40))


def main(argv=None):
    import torch

    from invariant_cluster import InvariantAttentionClusterer, InvariantKNeighborsTransformer
    from invariant_cluster.search import knn_search
    from invariant_cluster.search.plan import make_search_plan

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-home", default=None, help="folder with the MNIST test splits")
    p.add_argument("--device", default="cuda")
    p.add_argument("--n", type=int, default=None, help="Fashion-MNIST images (default: all)")
    p.add_argument("--quick", action="store_true", help="2,000 images per row")
    p.add_argument("--out", default=None, help="the JSON (default: results/gpu.json)")
    p.add_argument("--run", default=None,
                   help="the run's key in the JSON (default: 'quick' with --quick, else 'default')")
    p.add_argument("--rows", default="fashion,exact,knn,tf32,mnist,transformer,fresh",
                   help="rows to run, comma separated (default: all)")
    p.add_argument("--profile", default=None,
                   help="folder for profiles of one more default fit of each data set run "
                        "(Fashion-MNIST, and rotated MNIST with the 'mnist' row): Python's "
                        "cumulative times and the device's kernels (torch.profiler)")
    args = p.parse_args(argv)
    wanted = set(args.rows.split(","))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible: run on a GPU machine, or --device cpu --quick")
    if args.quick:
        args.n = args.n or 2000
    dev = args.device
    out = Path(args.out or RESULTS / "gpu.json")
    run = args.run or ("quick" if args.quick else "default")
    result = {"benchmark": "gpu", "env": environment(), "args": vars(args), "rows": []}
    rows = result["rows"]

    def add(row):
        rows.append(row)
        print_table([row], [k for k in row if k not in ("plan",)])
        write_json(result, out, table_rows, run=run)

    X, y, source = fashion(args)
    n = len(X)
    if "fresh" in wanted:  # first, before this process warms any cache
        split = "all" if source.endswith("train + test") else "test"
        for order in ("fit-first", "plot-first"):
            add({"row": "fresh", "data": source, "caches": "new empty folders",
                 "order": order, **fresh_process(args, split, order)})
    params = dict(n_clusters=10, max_rotation=15, n_rotations=7, max_translation=1,
                  random_state=0, device="auto" if dev == "cuda" else dev)
    # the process's first use of the card (its context), timed apart from the first fit
    _, t_init = timed(lambda: torch.zeros(1, device=dev), dev)
    est, t = timed(lambda: InvariantAttentionClusterer(**params).fit(X), dev)
    plan = est.search_plan_
    add({"row": "fashion", "data": source, "n": n, "path": "default (first fit in process)",
         "seconds": t, "device_init_s": t_init, **scores(y, est.labels_),
         "plan": plan.to_dict()})
    est2, t = timed(lambda: InvariantAttentionClusterer(**params).fit(X), dev)
    add({"row": "fashion", "data": source, "n": n, "path": "default (second fit)",
         "seconds": t, **scores(y, est2.labels_),
         "same_labels": bool(np.array_equal(est.labels_, est2.labels_))})
    if "exact" in wanted:
        ex, t = timed(
            lambda: InvariantAttentionClusterer(neighbor_search="exact", **params).fit(X), dev)
        add({"row": "fashion", "data": source, "n": n, "path": "neighbor_search='exact'",
             "seconds": t, **scores(y, ex.labels_), "plan": ex.search_plan_.to_dict()})

    # the kNN stage alone with the fit's plan, its recall of the exact top-15 on 500 queries
    # (those queries against every image), and the same in TF32
    grid = est._grid(refine=False)
    Xt = torch.as_tensor(X, device=dev).reshape(n, 1, 28, 28)
    own = torch.arange(n, device=dev)
    q = torch.as_tensor(np.random.default_rng(0).choice(n, min(500, n), replace=False),
                        device=dev)
    if "knn" in wanted or "tf32" in wanted:
        with torch.no_grad():
            (D32, I32, _), t32 = timed(
                lambda: knn_search(Xt, Xt, grid, 15, plan=plan, exclude=own), dev)
            exact_plan = make_search_plan(len(q), n, grid.size, 15, device=dev,
                                          method="exact", self_search=False)
            _, Iex, _ = knn_search(Xt[q], Xt, grid, 15, plan=exact_plan, exclude=q)
        row = {"row": "fashion_knn", "n": n, "fp32_s": t32,
               "recall_of_exact_top15": float((I32[q][:, :, None] == Iex[:, None, :])
                                              .any(1).double().mean())}
        if "tf32" in wanted:
            with torch.no_grad(), matmul_precision("high"):
                (D19, I19, _), t19 = timed(
                    lambda: knn_search(Xt, Xt, grid, 15, plan=plan, exclude=own), dev)
            with matmul_precision("high"):
                tf, t = timed(lambda: InvariantAttentionClusterer(**params).fit(X), dev)
            row.update({
                "tf32_s": t19,
                "tf32_recall_of_fp32_top15": float((I19[q][:, :, None] == I32[q][:, None, :])
                                                   .any(1).double().mean()),
                "tf32_max_rel_distance_change": float(
                    ((D19 - D32).abs() / D32.abs().clamp(min=1e-12)).max()),
                "tf32_fit_s": t, "tf32_acc": scores(y, tf.labels_)["acc"]})
        add({**row, "plan": plan.to_dict()})

    if "mnist" in wanted:
        m = 2000 if args.quick else 10_000
        Xm, ym = rotated_mnist(args, m)
        mp = dict(n_clusters=10, max_rotation=60.0, n_rotations=24, random_state=0,
                  device=params["device"])
        em, t = timed(lambda: InvariantAttentionClusterer(**mp).fit(Xm), dev)
        add({"row": "mnist_rotated", "n": m, "path": "default", "seconds": t,
             **scores(ym, em.labels_), "plan": em.search_plan_.to_dict()})
        es, t = timed(
            lambda: InvariantAttentionClusterer(neighbor_search="shortlist", **mp).fit(Xm), dev)
        add({"row": "mnist_rotated", "n": m, "path": "neighbor_search='shortlist'",
             "seconds": t, **scores(ym, es.labels_), "plan": es.search_plan_.to_dict()})
        if args.profile:
            profile_fit(Xm, mp, dev, Path(args.profile), "mnist_")

    if "transformer" in wanted:
        tr = InvariantKNeighborsTransformer(n_neighbors=15, max_rotation=15, n_rotations=7,
                                            max_translation=1, device=dev)
        _, t = timed(lambda: tr.fit_transform(X), dev)
        add({"row": "transformer", "n": n, "seconds": t, "plan": tr.search_plan_.to_dict()})
    if args.profile:
        profile_fit(X, params, dev, Path(args.profile), "fashion_")
    return result


if __name__ == "__main__":
    main()
