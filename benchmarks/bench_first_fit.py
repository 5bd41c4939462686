"""First use: a small fit in fresh processes, with and without numba's on-disk cache.

umap-learn and pynndescent compile their numba functions on first use in every process.
``invariant_cluster._third_party.import_cached`` turns numba's on-disk cache on for them, so
that a second process loads the machine code instead. This benchmark fits
``InvariantAttentionClusterer(n_clusters=10, max_rotation=30, n_rotations=5)`` on 300 of
scikit-learn's digits in fresh Python processes: twice with the cache switched off (each pays
the compilation), then twice with it on (the first may fill the cache, the second reads it),
and checks that no "Tensorflow not installed" warning reaches standard error.

From 10,000 keys on, the kNN search builds faiss's inverted file (compiled code shipped with
faiss: nothing to compile on first use). The second part builds the approximate shortlist of
12,000 random descriptors (3 copies each) twice in each of two fresh processes; where
Fashion-MNIST train + test is installed, it then fits 10,000 of its images twice in each of two
fresh processes.

    python benchmarks/bench_first_fit.py

Writes ``benchmarks/results/first_fit.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, write_json  # noqa: E402

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
if sys.argv[1] == "off":
    import invariant_cluster._third_party as tp
    tp._enable_numba_cache = lambda package: 0
from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_digits_images
X, _ = load_digits_images(return_X_y=True)
t1 = time.perf_counter()
InvariantAttentionClusterer(n_clusters=10, max_rotation=30, n_rotations=5,
                            random_state=0).fit(X[:300])
print(json.dumps({"import_s": t1 - t0, "fit_s": time.perf_counter() - t1}))
"""


SHORTLIST_CHILD = r"""
import json, time
import torch
import invariant_cluster.search.approximate as approximate
queries = []
distinct_keys = approximate._distinct_keys
def timed_queries(*args, **kwargs):  # the index searches, timed apart
    t = time.perf_counter()
    try:
        return distinct_keys(*args, **kwargs)
    finally:
        queries[-1] += time.perf_counter() - t
approximate._distinct_keys = timed_queries
X = torch.rand(12000, 3, 64, generator=torch.Generator().manual_seed(0))
times, out = [], []
for _ in range(2):
    queries.append(0.0)
    t = time.perf_counter()
    out.append(approximate.approximate_shortlist(X, X, 64, exclude=torch.arange(12000)))
    times.append(time.perf_counter() - t)
print(json.dumps({"first_s": times[0], "second_s": times[1],
                  "first_queries_s": queries[0], "second_queries_s": queries[1],
                  "same_shortlist": bool(torch.equal(out[0], out[1])),
                  "checksum": int(out[0].sum())}))
"""


FIT_CHILD = r"""
import json, time
import numpy as np
from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_fashion_mnist
X, _ = load_fashion_mnist(split="all", return_X_y=True)
times, labels = [], []
for _ in range(2):
    t = time.perf_counter()
    est = InvariantAttentionClusterer(n_clusters=10, max_rotation=15, n_rotations=7,
                                      max_translation=1, random_state=0).fit(X[:10000])
    times.append(time.perf_counter() - t)
    labels.append(est.labels_)
print(json.dumps({"first_fit_s": times[0], "second_fit_s": times[1],
                  "same_labels": bool((labels[0] == labels[1]).all()),
                  # the same partition in every process: a position-weighted sum of the labels
                  "labels_checksum": int((labels[0] * (1 + np.arange(labels[0].size))).sum())}))
"""


def fashion_available():
    try:
        from invariant_cluster.datasets import load_fashion_mnist

        load_fashion_mnist(split="all", return_X_y=True)
        return True
    except Exception:  # noqa: BLE001 - the larger part needs Debian's dataset-fashion-mnist
        return False


def run_child(code, arg, env):
    """Run ``code`` in a fresh Python with ``arg``: (its last line of JSON, its stderr)."""
    p = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True,
                       env=env, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def main():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    for cache in ("off", "off", "on", "on"):
        out, err = run_child(CHILD, cache, env)
        row = {"numba_cache": cache, **out,
               "tensorflow_warning": "Tensorflow not installed" in err,
               "loadavg": os.getloadavg()}
        rows.append(row)
        print_table(rows[-1:], ["numba_cache", "import_s", "fit_s", "tensorflow_warning"])
    shortlist_rows = []
    for route in ("1", "2"):
        row = {"stage": "approximate shortlist, 12,000 keys x 3 copies", "process": route,
               **run_child(SHORTLIST_CHILD, route, env)[0], "loadavg": os.getloadavg()}
        shortlist_rows.append(row)
        print_table(shortlist_rows[-1:], ["process", "first_s", "first_queries_s",
                                          "second_s", "second_queries_s", "same_shortlist"])
    fit_rows = []
    if fashion_available():
        for route in ("1", "2"):
            row = {"fit": "10,000 Fashion-MNIST images, the scaling benchmark's parameters",
                   "process": route, **run_child(FIT_CHILD, route, env)[0],
                   "loadavg": os.getloadavg()}
            fit_rows.append(row)
            print_table(fit_rows[-1:], ["process", "first_fit_s", "second_fit_s",
                                        "same_labels", "labels_checksum"])
    else:
        print("Fashion-MNIST train + test not found (apt-get install dataset-fashion-mnist): "
              "the 10,000-image fits are left out")
    write_json({"benchmark": "first_fit", "env": environment(), "rows": rows,
                "shortlist_rows": shortlist_rows, "fit_rows": fit_rows,
                "note": "fresh processes in this order; a shared machine makes the times noisy"},
               RESULTS / "first_fit.json")


if __name__ == "__main__":
    main()
