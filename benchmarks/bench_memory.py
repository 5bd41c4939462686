"""Peak memory of a fit against the estimate behind the memory check.

Each size runs in a FRESH process (peak RSS is a process' high-water mark): the resident set
after the imports and the data, the estimate :func:`invariant_cluster._memory.estimate_fit_bytes`
of the fit's own allocations, and the peak resident set of the fit
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``). The ratio compares the estimate with the
measured increase (peak minus the resident set before the fit): within 2x is the target.

Data: Fashion-MNIST train + test (``apt-get install dataset-fashion-mnist``), else its test split
in ``../shared/data`` (sizes up to 10,000); the estimator as the scaling benchmark runs it:
``InvariantAttentionClusterer(n_clusters=10, max_rotation=15, n_rotations=7,
max_translation=1)``.

    python benchmarks/bench_memory.py                      # 2,000, 5,000 and 10,000 images
    python benchmarks/bench_memory.py --n 70000 --out benchmarks/results/memory_70k.json
    python benchmarks/bench_memory.py --n 10000 70000 --n-clusters 10 none   # and the count
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, write_json  # noqa: E402

PARAMS = dict(n_clusters=10, max_rotation=15, n_rotations=7, max_translation=1, random_state=0)


def _rss_mb():
    import psutil

    return psutil.Process().memory_info().rss / 2 ** 20


def child(n, data, n_clusters=10):
    import numpy as np

    from invariant_cluster import InvariantAttentionClusterer
    from invariant_cluster._memory import estimate_fit_bytes
    from invariant_cluster.datasets import load_fashion_mnist
    from invariant_cluster.search import make_search_plan

    try:
        X, _ = load_fashion_mnist(split="all", return_X_y=True)
        source = "fashion-mnist train + test"
    except (OSError, ValueError):
        X, _ = load_fashion_mnist(split="test", return_X_y=True, data_home=data)
        source = "fashion-mnist test (../shared/data)"
    if n > len(X):
        raise SystemExit(f"--n: {n} images requested, {len(X)} available in {source}")
    X = np.ascontiguousarray(X[:n], dtype=np.float32)
    est = InvariantAttentionClusterer(**{**PARAMS, "n_clusters": n_clusters})
    k = est.n_neighbors
    c = make_search_plan(n, n, est._grid(refine=False).size, k, method=est.neighbor_search,
                         n_candidates=est.n_candidates).n_candidates
    # as fit calls it (the default noise_std measures the noise: the filtered copy is kept)
    estimate = estimate_fit_bytes(n, X[0].size, k, c, filtered=est.noise_std != 0,
                                  grouping_means=n_clusters is None) / 2 ** 20
    before = _rss_mb()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    est.fit(X)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    used = peak - before
    print(json.dumps({"n": n, "n_clusters": n_clusters, "source": source, "n_candidates": c,
                      "rss_before_mb": before,
                      "peak_before_fit_mb": peak_before, "peak_mb": peak,
                      "fit_increase_mb": used, "estimate_mb": estimate,
                      "estimate_over_measured": estimate / used, "seconds": seconds}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[2000, 5000, 10000])
    p.add_argument("--data", default=None)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--n-clusters", nargs="+", default=["10"],
                   help="the estimator's n_clusters, each in turn ('none': the count)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    counts = [None if v.lower() == "none" else int(v) for v in args.n_clusters]
    if args.child is not None:
        from _common import data_home

        return child(args.child, str(data_home(args.data)), counts[0])
    rows = []
    for n_clusters, n in [(c, n) for c in args.n_clusters for n in args.n]:
        cmd = [sys.executable, __file__, "--child", str(n), "--n-clusters", n_clusters] + (
            ["--data", args.data] if args.data else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            raise SystemExit(proc.returncode)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print_table(rows[-1:], list(rows[-1]))
    result = {"benchmark": "memory", "env": environment(),
              "params": {k: v for k, v in PARAMS.items() if k != "n_clusters"},
              "n_clusters": counts, "rows": rows}
    write_json(result, Path(args.out or RESULTS / "memory.json"))
    return result


if __name__ == "__main__":
    main()
