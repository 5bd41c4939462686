"""Clustering MNIST and Fashion-MNIST: invariant attention against the strongest pipelines.

Rows (MNIST test split, random subsets with a fixed seed, transformed with a fixed seed):

- ``rotated45``: rotated uniformly within +-45 degrees (n = 2,000, 5,000, 10,000);
- ``rotated45_shift2``: rotated within +-45 degrees and shifted within +-2 px (10,000);
- ``rotated360``: rotated over the full circle (10,000);
- ``fashion``: Fashion-MNIST test as it is (10,000).

Methods, in the same run on the same data:

- ``k-means (pixels)``;
- ``kNN + UMAP + k-means``: this library's exact (or shortlisted) invariant kNN, k = 15, grid
  only (on the images centred on their centres of mass where the estimator's default
  ``center="auto"`` centres them: ``centred``), fed to umap-learn (``n_components=10,
  min_dist=0, precomputed_knn``) and k-means; the pipeline a user can assemble from our kNN.
  Its seconds include the kNN search;
- ``kNN + spectral``: scikit-learn's SpectralClustering on the same kNN graph (symmetrised
  connectivity);
- ``kNN + Leiden``: Leiden (leidenalg) on umap-learn's fuzzy graph of the same kNN graph, the
  resolution bisected to give 10 clusters (single-cell analysis' standard);
- ``invariant attention``: ``InvariantAttentionClusterer(n_clusters=10)``, ONE parameter set for
  every row; only the transformation range follows the data, as the pipeline's does;
- ``invariant attention (modes)``: the same with ``n_clusters=None`` (rotated45 rows).

The ablation of the iteration is the ``kNN + Leiden`` row: the estimator's default grouping is
Leiden on the samples' graph, or on its union with the converged means' graph when the
iteration replaced most neighbours (``graph_used``; ``benchmarks/bench_noise.py`` measures it on
noisy images).

    python benchmarks/bench_clustering.py --rows rotated45:2000       # one row
    python benchmarks/bench_clustering.py                              # every row (long)
    python benchmarks/bench_clustering.py --quick                      # n = 500, a minute
    python benchmarks/bench_clustering.py --estimator-only --rows rotated45_shift2:10000
        # the estimator alone in this process: its own peak RSS
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
    table,
    write_json,
)

from invariant_cluster import InvariantAttentionClusterer  # noqa: E402
from invariant_cluster.datasets import make_transformed  # noqa: E402

# data transformation, and the search range a user would choose knowing the data
VARIANTS = {
    "rotated45": dict(data="mnist", rotate=45.0, shift=0,
                      search=dict(max_rotation=60.0, n_rotations=24, max_translation=0)),
    "rotated45_shift2": dict(data="mnist", rotate=45.0, shift=2,
                             search=dict(max_rotation=60.0, n_rotations=24, max_translation=2)),
    "rotated360": dict(data="mnist", rotate=180.0, shift=0,
                       search=dict(max_rotation=180.0, n_rotations=72, max_translation=0)),
    "fashion": dict(data="fashion", rotate=0.0, shift=0,
                    search=dict(max_rotation=15.0, n_rotations=7, max_translation=1)),
}
DEFAULT_ROWS = ["rotated45:2000", "rotated45:5000", "rotated45:10000",
                "rotated45_shift2:10000", "rotated360:10000", "fashion:10000"]
N_NEIGHBORS = 15


def make_variant(variant, n, seed, data=None):
    spec = VARIANTS[variant]
    images, labels = load_mnist_test(data, dataset="mnist" if spec["data"] == "mnist"
                                     else "fashion-mnist")
    rng = np.random.default_rng(seed)
    sel = rng.choice(len(images), n, replace=False) if n < len(images) else np.arange(n)
    X, y = images[sel], labels[sel]
    if spec["rotate"] or spec["shift"]:
        X, _ = make_transformed(X, max_rotation=spec["rotate"], max_translation=spec["shift"],
                                random_state=seed)
    return X.astype(np.float32), y


def centred_as_the_estimator(X, search) -> bool:
    """Whether the estimator's default ``center="auto"`` centres the images ``X`` on their
    centres of mass (its own rule), so that the pipelines search the images it searches."""
    from invariant_cluster._estimator import centres_images

    return centres_images(X.reshape(len(X), -1), (1, *X.shape[1:]), "auto", "se2",
                          search.get("max_translation", 0))


def invariant_knn(X, search, k=N_NEIGHBORS, centre=False):
    """The pipeline's kNN: the same search the estimator runs (exact or shortlist, grid only),
    on the images centred on their centres of mass first where ``centre``."""
    import torch

    from invariant_cluster.search import knn_search, make_search_grid
    from invariant_cluster.search.descriptors import centred_images

    if centre:
        X = centred_images(X.reshape(len(X), -1), (1, *X.shape[1:]))[0].reshape(X.shape)
    grid = make_search_grid("se2", refine=False, **search)
    Xt = torch.as_tensor(X).reshape(len(X), 1, *X.shape[1:])
    with torch.no_grad():
        D, idx, _ = knn_search(Xt, Xt, grid, k, exclude=torch.arange(len(X)))
    return idx.numpy(), D.clamp(min=0).sqrt().numpy().astype(np.float64)


def run_kmeans(X, seed):
    from sklearn.cluster import KMeans

    return KMeans(10, n_init=10, random_state=seed).fit_predict(X.reshape(len(X), -1))


def run_spectral(idx, seed):
    from scipy.sparse import csr_matrix
    from sklearn.cluster import SpectralClustering

    n, k = idx.shape
    A = csr_matrix((np.ones(n * k), (np.repeat(np.arange(n), k), idx.ravel())), shape=(n, n))
    A = ((A + A.T) > 0).astype(np.float64)
    return SpectralClustering(10, affinity="precomputed", random_state=seed,
                              assign_labels="cluster_qr").fit_predict(A)


def run_leiden(idx, dist, seed):
    from invariant_cluster._grouping import fuzzy_graph, leiden

    return leiden(fuzzy_graph(idx, dist, seed, calibration="umap"), 10, seed)


def timed(fn, *a, **kw):
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*a, **kw)
    return out, time.perf_counter() - t0, caught


def run_row(variant, n, seed, data=None):
    from invariant_cluster._grouping import embed_and_cluster

    X, y = make_variant(variant, n, seed, data)
    search = VARIANTS[variant]["search"]
    rows = []
    centred = centred_as_the_estimator(X, search)
    base = {"variant": variant, "n": n, "centred": centred}

    def add(method, labels, seconds, **extra):
        rows.append({**base, "method": method, **scores(y, labels), "seconds": seconds,
                     "peak_rss_mb": peak_rss_mb(), **extra})
        print_table(rows[-1:], ["variant", "n", "method", "acc", "nmi", "ari", "seconds"])

    lab, t, _ = timed(run_kmeans, X, seed)
    add("k-means (pixels)", lab, t)
    (idx, dist), t_knn, _ = timed(invariant_knn, X, search, centre=centred)
    lab, t, _ = timed(embed_and_cluster, idx, dist, 10, seed)
    add("kNN + UMAP + k-means", lab, t_knn + t, knn_seconds=t_knn)
    lab, t, _ = timed(run_spectral, idx, seed)
    add("kNN + spectral", lab, t_knn + t)
    lab, t, _ = timed(run_leiden, idx, dist, seed)
    add("kNN + Leiden", lab, t_knn + t)
    purity = float((y[idx] == y[:, None]).mean())
    # the number of clusters found (n_clusters=None) on the MNIST rows rotated within +-45 degrees
    for n_clusters in (10, None) if variant == "rotated45" else (10,):
        est = InvariantAttentionClusterer(n_clusters=n_clusters, n_jobs=None, random_state=seed,
                                          **search)
        _, t, caught = timed(est.fit, X)
        warned = any("did not converge" in str(w.message) for w in caught)
        pred_agree = None
        extra = {}
        if n_clusters is not None:
            # the ablation: purity of the samples' graph against the converged means' graph
            extra = _means_graph_purity(est, y, search)
            pred_agree = float(np.mean(est.predict(X) == est.labels_)) if n <= 5000 else None
        add("invariant attention" if n_clusters else "invariant attention (modes)", est.labels_,
            t, n_iter=est.n_iter_, converged=not warned, n_clusters_found=est.n_clusters_,
            graph_used=est.graph_,
            knn_purity=purity, predict_agreement=pred_agree, **extra)
    return rows


def _means_graph_purity(est, y, search):
    """Share of kNN-graph edges joining two samples of the same label, for the graph the
    estimator groups (the converged means', searched within two hops)."""
    import torch

    from invariant_cluster._grouping import two_hop_candidates
    from invariant_cluster.search import candidate_search, make_search_grid

    grid = make_search_grid("se2", refine=False, **search)
    M = torch.as_tensor(est.invariant_means_).reshape(-1, *est.image_shape_)
    idx = torch.as_tensor(est.neighbors_[:, 1:])
    with torch.no_grad():
        _, idx_m, _ = candidate_search(M, M, two_hop_candidates(idx), grid, k=idx.shape[1],
                                       exclude=torch.arange(len(M)))
    return {"means_graph_purity": float((y[idx_m.numpy()] == y[:, None]).mean())}


def run_estimator_only(args):
    rows = []
    for spec in args.rows or ["rotated45_shift2:10000"]:
        variant, n = spec.split(":")
        X, y = make_variant(variant, int(n), args.seed, args.data)
        base_mb = peak_rss_mb()
        est = InvariantAttentionClusterer(n_clusters=10, random_state=args.seed,
                                          **VARIANTS[variant]["search"])
        _, t, _ = timed(est.fit, X)
        rows.append({"variant": variant, "n": int(n), "method": "invariant attention",
                     **scores(y, est.labels_), "seconds": t, "peak_rss_mb": peak_rss_mb(),
                     "peak_rss_before_fit_mb": base_mb, "n_iter": est.n_iter_})
        print_table(rows[-1:], ["variant", "n", "acc", "seconds", "peak_rss_mb"])
    result = {"benchmark": "clustering_estimator_memory", "env": environment(),
              "args": vars(args), "rows": rows}
    write_json(result, Path(args.out or RESULTS / "clustering.json"),
               run=args.run or "estimator_memory")
    return result


def table_rows(result):
    """The tables: one per data set, a line per method."""
    def iterations(r):
        if r.get("n_iter") is not None:
            return f"{r['n_iter']} ({'yes' if r.get('converged') else 'no'})"
    return table(result, result.get("rows", []), lambda r: f"{r['variant']} (n = {r['n']})",
                 lambda r: r["method"],
                 {"ACC": "acc", "NMI": "nmi", "ARI": "ari", "seconds": "seconds",
                  "process peak RSS (MB)": "peak_rss_mb", "clusters": "n_clusters_found",
                  "iterations (converged)": iterations})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder with the MNIST/Fashion-MNIST test splits")
    p.add_argument("--rows", nargs="+", default=None,
                   help="variant:n pairs, e.g. rotated45:2000 (default: every row)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--estimator-only", action="store_true",
                   help="fit only InvariantAttentionClusterer(n_clusters=10): its own peak RSS")
    p.add_argument("--out", default=None, help="the JSON (default: results/clustering.json)")
    p.add_argument("--run", default=None,
                   help="the run's key in the JSON (default: 'quick' with --quick, "
                        "'estimator_memory' with --estimator-only, else 'default')")
    args = p.parse_args(argv)
    if args.estimator_only:
        return run_estimator_only(args)
    rows_spec = args.rows or (["rotated45:500"] if args.quick else DEFAULT_ROWS)
    result = {"benchmark": "clustering", "env": environment(), "args": vars(args), "rows": []}
    out = Path(args.out or RESULTS / "clustering.json")
    run = args.run or ("quick" if args.quick else "default")
    for spec in rows_spec:
        variant, n = spec.split(":")
        result["rows"] += run_row(variant, int(n), args.seed, args.data)
        write_json(result, out, table_rows, run=run)  # after every row: a long run keeps it
    print()
    print_table(result["rows"], ["variant", "n", "method", "acc", "nmi", "ari", "seconds",
                                 "peak_rss_mb"])
    return result


if __name__ == "__main__":
    main()
