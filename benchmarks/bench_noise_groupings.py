"""Noisy rotated MNIST: six more groupings of the iteration's graphs, measured and not adopted.

On the data and stages of ``bench_noise.py`` (``n`` digits rotated within +-45 degrees plus
Gaussian noise ``sigma``; the invariant kNN search, the iteration and the means' search run
once per seed), beside the estimator's default grouping (``graph="auto"``: Leiden on the union
of the samples' and the means' fuzzy graphs, the resolution searched to give 10 parts) and
Leiden on umap-learn's fuzzy graph of the samples (the baseline):

- ``jaccard``: the union's weights times the Jaccard index of the ends' neighbourhoods in it
  (PhenoGraph's shared-neighbour weighting), then Leiden;
- ``spectral``: the 10 leading eigenvectors of the union's normalised adjacency, rows
  normalised, k-means (spectral clustering);
- ``fine + merge``: Leiden to 40 parts, then average linkage of the parts on their mean
  connecting weight;
- ``leiden, 5 / until stable``: igraph's Leiden with 5 iterations or until no node moves on
  the whole graph (the default: 2);
- ``attention weights``: the converged attention weights ``w_ij`` (made symmetric by the
  maximum) as the graph, alone and in a union with the means' fuzzy graph;
- ``means -> samples``: each converged mean's 15 nearest noisy samples (the invariant search,
  means as queries), umap-learn's fuzzy graph, alone and in a union with the means' graph.

    python benchmarks/bench_noise_groupings.py --seeds 0 1 2 3 4 5 6 \\
        --out benchmarks/results/noise_groupings_2000.json
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table  # noqa: E402
from bench_noise import SEARCH, K, default_grouping, noisy, seeds_main, stages  # noqa: E402


def jaccard(G):
    """``G``'s weights times the Jaccard index of the closed neighbourhoods of each edge's ends."""
    from scipy.sparse import csr_matrix, identity

    B = G.copy().tocsr()
    B.data[:] = 1.0
    B = (B + identity(G.shape[0], format="csr")).tocsr()
    deg = np.asarray(B.sum(1)).ravel()
    g = G.tocoo()
    inter = np.asarray(B[g.row].multiply(B[g.col]).sum(1)).ravel()
    J = inter / (deg[g.row] + deg[g.col] - inter)
    return csr_matrix((g.data * J, (g.row, g.col)), shape=G.shape)


def spectral(G, n_clusters, seed):
    """Spectral clustering of a weighted graph (normalised adjacency, k-means on the rows)."""
    from scipy.sparse import diags
    from scipy.sparse.linalg import eigsh
    from sklearn.cluster import KMeans

    d = np.asarray(G.sum(1)).ravel()
    Dm = diags(1.0 / np.sqrt(np.maximum(d, 1e-12)))
    v0 = np.random.RandomState(seed).uniform(-1, 1, G.shape[0])
    _, V = eigsh(Dm @ G @ Dm, k=n_clusters, which="LA", v0=v0)
    V = V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-12)
    return KMeans(n_clusters, n_init=10, random_state=seed).fit_predict(V)


def fine_merge(G, n_clusters, seed, parts=40):
    """Leiden to ``parts`` parts, merged by average linkage on the mean connecting weight."""
    from scipy.sparse import csr_matrix
    from sklearn.cluster import AgglomerativeClustering

    from invariant_cluster._grouping import leiden

    fine = leiden(G, parts, seed)
    m = int(fine.max()) + 1
    P = csr_matrix((np.ones(len(fine)), (np.arange(len(fine)), fine)), shape=(len(fine), m))
    A = (P.T @ G @ P).toarray()
    sizes = np.bincount(fine).astype(np.float64)
    S = A / np.outer(sizes, sizes)
    D = S.max() - S
    np.fill_diagonal(D, 0.0)
    merged = AgglomerativeClustering(n_clusters, metric="precomputed",
                                     linkage="average").fit_predict(D)
    return merged[fine]


def attention_graph(idx, W):
    """The converged attention weights (``W[:, 0]`` is the sample's own) as a symmetric graph."""
    from scipy.sparse import csr_matrix

    n, k = idx.shape
    A = csr_matrix((W[:, 1:].ravel(), (np.repeat(np.arange(n), k), idx.ravel())), shape=(n, n))
    A = A.maximum(A.T).tocsr()
    return A.multiply(1.0 / A.max()).tocsr()


def cross_graph(X, M, seed):
    """umap-learn's fuzzy graph of each mean's ``K`` nearest noisy samples (self left out)."""
    import torch

    from invariant_cluster._grouping import fuzzy_graph
    from invariant_cluster.search import knn_search, make_search_grid

    grid = make_search_grid("se2", refine=False, **SEARCH)
    n = len(X)
    Xt = torch.as_tensor(X).reshape(n, 1, *X.shape[1:])
    Mt = torch.as_tensor(M, dtype=Xt.dtype).reshape(Xt.shape)
    with torch.no_grad():
        D, idx, _ = knn_search(Mt, Xt, grid, K, exclude=torch.arange(n))
    dist = D.clamp(min=0).sqrt().numpy().astype(np.float64)
    return fuzzy_graph(idx.numpy(), dist, seed, calibration="umap")


def run(args):
    import invariant_cluster._grouping as grouping
    from invariant_cluster._grouping import _means_graph, fuzzy_graph, leiden
    from invariant_cluster.metrics import clustering_accuracy

    rows = []
    for sigma in args.sigmas:
        for seed in args.seeds:
            X, _, y = noisy(args.n, sigma, seed, args.data)
            st = stages(X, seed)
            res = {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res["default"], used, G = default_grouping(st, seed)
                res["leiden (samples)"] = leiden(
                    fuzzy_graph(st["idx"], st["dist"], seed, calibration="umap"), 10, seed)
                res["jaccard"] = leiden(jaccard(G), 10, seed)
                res["spectral"] = spectral(G, 10, seed)
                res["fine + merge"] = fine_merge(G, 10, seed)
                before = grouping._IGRAPH_ITERATIONS
                try:
                    for it, name in ((5, "leiden, 5 iterations"), (-1, "leiden, until stable")):
                        grouping._IGRAPH_ITERATIONS = it
                        res[name] = leiden(G, 10, seed)
                finally:
                    grouping._IGRAPH_ITERATIONS = before
                Gm = _means_graph(st["idx_f"], st["dist_f"], seed)
                A = attention_graph(st["idx"], st["W"])
                res["attention weights"] = leiden(A, 10, seed)
                res["attention weights + means"] = leiden(A.maximum(Gm).tocsr(), 10, seed)
                C = cross_graph(X, st["M"], seed)
                res["means -> samples"] = leiden(C, 10, seed)
                res["means -> samples + means"] = leiden(C.maximum(Gm).tocsr(), 10, seed)
            row = {"sigma": sigma, "seed": seed, "n": args.n, "graph_used": used}
            row.update({m: float(clustering_accuracy(y, lab)) for m, lab in res.items()})
            rows.append(row)
            print_table(rows[-1:], list(row))
    methods = [c for c in rows[0] if c not in ("sigma", "seed", "n", "graph_used")]
    return rows, methods


def main(argv=None):
    return seeds_main(__doc__.splitlines()[0], "noise_groupings", run, argv)


if __name__ == "__main__":
    main()
