"""First use: fits in fresh processes with an empty numba cache, as a new installation has it.

The default fit compiles nothing on first use: the approximate shortlist is faiss's inverted
file (compiled code shipped with faiss) and the grouping builds umap-learn's graph itself, so
neither umap-learn, pynndescent nor numba is imported. Each child process gets its own new,
empty ``NUMBA_CACHE_DIR`` and fits

- 300 of scikit-learn's digits (``n_clusters=10, max_rotation=30, n_rotations=5``);
- where Fashion-MNIST train + test is installed (``apt-get install dataset-fashion-mnist``),
  10,000 of its images twice in the same process (``max_rotation=15, n_rotations=7,
  max_translation=1``, the scaling benchmark's parameters), the default ``n_clusters=None``;
- then all 70,000 of them once (``n_clusters=10``, the same search): seconds, ACC, NMI and the
  process's peak resident memory.

It records the seconds, whether numba, pynndescent or umap-learn were imported, and whether
"Tensorflow not installed" reached standard error. The target: the first 10,000-image fit under
1.5 times the second and under 30 s on 2 cores.

    python benchmarks/bench_first_fit.py

Writes ``benchmarks/results/first_fit.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, write_json  # noqa: E402

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_digits_images, load_fashion_mnist
t1 = time.perf_counter()
out = {"import_s": t1 - t0}
if sys.argv[1] == "digits":
    X, _ = load_digits_images(return_X_y=True)
    est = InvariantAttentionClusterer(n_clusters=10, max_rotation=30, n_rotations=5,
                                      random_state=0).fit(X[:300])
    out["first_fit_s"] = time.perf_counter() - t1
elif sys.argv[1] == "fashion70k":
    import resource
    from sklearn.metrics import normalized_mutual_info_score
    from invariant_cluster.metrics import clustering_accuracy
    X, y = load_fashion_mnist(split="all", return_X_y=True)
    est = InvariantAttentionClusterer(n_clusters=10, max_rotation=15, n_rotations=7,
                                      max_translation=1, random_state=0).fit(X)
    out["first_fit_s"] = time.perf_counter() - t1
    out["n"] = len(X)
    out["acc"] = float(clustering_accuracy(y, est.labels_))
    out["nmi"] = float(normalized_mutual_info_score(y, est.labels_))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["search_plan_"] = est.search_plan_.to_dict()
else:
    X, _ = load_fashion_mnist(split="all", return_X_y=True)
    labels = []
    for name in ("first_fit_s", "second_fit_s"):
        t = time.perf_counter()
        est = InvariantAttentionClusterer(max_rotation=15, n_rotations=7, max_translation=1,
                                          random_state=0).fit(X[:10000])
        out[name] = time.perf_counter() - t
        labels.append(est.labels_)
    out["n_clusters_"] = int(est.n_clusters_)
    out["same_labels"] = bool(np.array_equal(labels[0], labels[1]))
    out["search_plan_"] = est.search_plan_.to_dict()
out["imported"] = sorted(m for m in ("numba", "pynndescent", "umap") if m in sys.modules)
print(json.dumps(out))
"""


def fashion_available():
    try:
        from invariant_cluster.datasets import load_fashion_mnist

        load_fashion_mnist(split="all", return_X_y=True)
        return True
    except Exception:  # noqa: BLE001 - the larger part needs Debian's dataset-fashion-mnist
        return False


def run_child(arg, env):
    """Run CHILD in a fresh Python with an empty numba cache: (its JSON, its stderr)."""
    with tempfile.TemporaryDirectory() as cache:
        p = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True,
                           env=dict(env, NUMBA_CACHE_DIR=cache), check=True)
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def main():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    sets = ["digits", "digits"] + (["fashion", "fashion", "fashion70k"]
                                   if fashion_available() else [])
    if "fashion" not in sets:
        print("Fashion-MNIST train + test not found (apt-get install dataset-fashion-mnist): "
              "the 10,000-image fits are left out")
    rows = []
    for data in sets:
        out, err = run_child(data, env)
        row = {"data": data, "numba_cache": "new and empty", **out,
               "tensorflow_warning": "Tensorflow not installed" in err,
               "loadavg": os.getloadavg()}
        if "second_fit_s" in row:
            row["first_over_second"] = row["first_fit_s"] / row["second_fit_s"]
        rows.append(row)
        print_table(rows[-1:], ["data", "import_s", "first_fit_s", "second_fit_s",
                                "first_over_second", "acc", "peak_rss_mb", "imported"])
    write_json({"benchmark": "first_fit", "env": environment(), "rows": rows,
                "note": "fresh processes in this order, each with a new empty NUMBA_CACHE_DIR; "
                        "a shared machine makes the times noisy"},
               RESULTS / "first_fit.json")


if __name__ == "__main__":
    main()
