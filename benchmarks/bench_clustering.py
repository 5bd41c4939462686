"""Clustering MNIST under rotation (and translation): invariant attention against the baselines.

Random subsets of the MNIST test split (fixed seed), in three variants: rotated uniformly within
+-45 degrees, rotated and shifted within +-2 px, and unrotated. Methods: k-means on pixels,
spectral clustering on the invariant kernel, kernel attention (``group="none"``) and
``InvariantAttentionClusterer(n_clusters=10)``. ACC (Hungarian), ARI, NMI and seconds.

    python benchmarks/bench_clustering.py                 # n = 2000, all variants
    python benchmarks/bench_clustering.py --quick         # n = 200, seconds
    python benchmarks/bench_clustering.py --sweep         # bandwidth / n_neighbors sensitivity
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    environment,
    load_mnist_test,
    peak_rss_mb,
    print_table,
    scores,
    write_json,
)

from invariant_cluster import InvariantAttentionClusterer, invariant_distances  # noqa: E402
from invariant_cluster.datasets import make_transformed  # noqa: E402

VARIANTS = {
    "rotated45": dict(max_rotation=45.0, max_translation=0),
    "rotated45_shift2": dict(max_rotation=45.0, max_translation=2),
    "unrotated": dict(max_rotation=0.0, max_translation=0),
}


def make_variant(images, labels, n, variant, seed):
    rng = np.random.default_rng(seed)
    sel = rng.choice(len(images), n, replace=False)
    X, y = images[sel], labels[sel]
    spec = VARIANTS[variant]
    if spec["max_rotation"] or spec["max_translation"]:
        X, _ = make_transformed(X, random_state=seed, **spec)
    return X.astype(np.float32), y


def estimator_params(variant, args):
    """Search ranges a user would choose knowing the data: +-60 degrees covers +-45 plus slant."""
    spec = VARIANTS[variant]
    return dict(n_clusters=10, max_rotation=args.max_rotation, n_rotations=args.n_rotations,
                max_translation=spec["max_translation"], max_iter=args.max_iter, random_state=0)


def run_kmeans(X, y, seed):
    from sklearn.cluster import KMeans

    t0 = time.perf_counter()
    labels = KMeans(10, n_init=10, random_state=seed).fit_predict(X.reshape(len(X), -1))
    return labels, time.perf_counter() - t0


def run_spectral(X, y, params, seed):
    """Spectral clustering on the invariant kernel with the same k-NN bandwidth rule."""
    from sklearn.cluster import SpectralClustering

    t0 = time.perf_counter()
    D = invariant_distances(X, group="se2", max_rotation=params["max_rotation"],
                            n_rotations=params["n_rotations"],
                            max_translation=params["max_translation"], refine=False)
    D = np.minimum(D, D.T).astype(np.float64)
    k = 32
    sig2 = np.sort(D, 1)[:, k]
    A = np.exp(-D / np.sqrt(sig2[:, None] * sig2[None, :]))
    labels = SpectralClustering(10, affinity="precomputed", random_state=seed,
                                assign_labels="cluster_qr").fit_predict(A)
    return labels, time.perf_counter() - t0


def run_attention(X, params, **over):
    p = dict(params)
    p.update(over)
    est = InvariantAttentionClusterer(**p)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X)
    return est, time.perf_counter() - t0


def run(args):
    images, labels = load_mnist_test(args.data)
    rows = []
    for variant in args.variants:
        X, y = make_variant(images, labels, args.n, variant, args.seed)
        params = estimator_params(variant, args)
        lab, t = run_kmeans(X, y, args.seed)
        rows.append({"variant": variant, "n": args.n, "method": "k-means (pixels)",
                     **scores(y, lab), "seconds": t})
        if not args.skip_spectral:
            lab, t = run_spectral(X, y, params, args.seed)
            rows.append({"variant": variant, "n": args.n, "method": "spectral (invariant kernel)",
                         **scores(y, lab), "seconds": t})
        est, t = run_attention(X, params, group="none", max_rotation=0.0, max_translation=0)
        rows.append({"variant": variant, "n": args.n, "method": "kernel attention",
                     **scores(y, est.labels_), "seconds": t, "n_iter": est.n_iter_})
        est, t = run_attention(X, params)
        rows.append({"variant": variant, "n": args.n, "method": "invariant attention",
                     **scores(y, est.labels_), "seconds": t, "n_iter": est.n_iter_,
                     "peak_rss_mb": peak_rss_mb()})
        print_table([r for r in rows if r["variant"] == variant],
                    ["variant", "n", "method", "acc", "ari", "nmi", "seconds"])
        print()
    return rows


def run_sweep(args):
    """Sensitivity of invariant attention to n_neighbors and the auto-bandwidth factor."""
    import invariant_cluster.cluster as cluster

    images, labels = load_mnist_test(args.data)
    X, y = make_variant(images, labels, args.n, "rotated45", args.seed)
    params = estimator_params("rotated45", args)
    rows = []
    default = cluster._AUTO_FACTOR
    try:
        for factor in (0.05, 0.1, 0.2, 0.5):
            for k in (16, 32, 64):
                cluster._AUTO_FACTOR = factor
                est, t = run_attention(X, params, n_neighbors=k)
                rows.append({"factor": factor, "n_neighbors": k, **scores(y, est.labels_),
                             "seconds": t, "n_iter": est.n_iter_})
                print_table(rows[-1:], ["factor", "n_neighbors", "acc", "nmi", "seconds"])
    finally:
        cluster._AUTO_FACTOR = default
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder with the MNIST test split")
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--max-rotation", type=float, default=60.0)
    p.add_argument("--n-rotations", type=int, default=17)
    p.add_argument("--max-iter", type=int, default=15)
    p.add_argument("--skip-spectral", action="store_true")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.n_rotations = 200, 9
    result = {"benchmark": "clustering", "env": environment(), "args": vars(args)}
    if args.sweep:
        result["sweep"] = run_sweep(args)
        out = args.out or RESULTS / "clustering_sweep.json"
    else:
        result["rows"] = run(args)
        out = args.out or RESULTS / ("clustering_quick.json" if args.quick else "clustering.json")
    write_json(result, Path(out))
    return result


if __name__ == "__main__":
    main()
