"""umap-learn's layout of a kNN graph or of a fuzzy graph, and the clusters of a layout
(``grouping="umap"``): k-means with the count given, HDBSCAN without.

Everything here works on a kNN graph given as ``(index, dist)`` arrays of shape ``(n, k)``
(each row sorted by distance, the sample itself left out), or on a sparse fuzzy graph.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.sparse.csgraph import connected_components

from ._third_party import import_quietly

# HDBSCAN's min_samples: its default merged small groups of copies (the user guide's rules)
_MIN_SAMPLES = 2


def embed_and_cluster(index: np.ndarray, dist: np.ndarray, n_clusters, random_state,
                      n_components: int = 10) -> np.ndarray:
    """UMAP embedding of the kNN graph (``min_dist=0``), then k-means with ``n_clusters``, or
    HDBSCAN when ``n_clusters`` is None (the modes of the embedded density).

    ``index``/``dist``: ``(n, k)`` without the sample itself; umap-learn wants it in column 0.
    ``random_state`` is an int (it seeds umap-learn's layout and k-means' starts). HDBSCAN's
    smallest cluster is 1% of the samples (at least 3); the samples it calls noise join the
    cluster of their nearest clustered sample in the embedding.
    """
    n, k = index.shape
    if n_clusters is not None and n <= n_clusters:
        return np.arange(n)
    emb = embed_graph(index, dist, random_state, n_components)
    return _cluster_embedding(emb, n_clusters, random_state)


def _cluster_embedding(emb, n_clusters, random_state):
    """k-means with ``n_clusters`` on an embedding, or HDBSCAN for None (see
    :func:`embed_and_cluster`)."""
    from sklearn.cluster import HDBSCAN, KMeans
    from sklearn.neighbors import NearestNeighbors

    n = emb.shape[0]
    if n_clusters is not None:
        return KMeans(n_clusters, n_init=10, random_state=random_state).fit_predict(emb)
    labels = HDBSCAN(min_cluster_size=max(3, int(round(0.01 * n))), min_samples=_MIN_SAMPLES,
                     copy=True).fit_predict(emb.astype(np.float64))
    noise = labels < 0
    if noise.all():
        return np.zeros(n, dtype=np.int64)
    if noise.any():
        nn = NearestNeighbors(n_neighbors=1).fit(emb[~noise])
        labels[noise] = labels[~noise][nn.kneighbors(emb[noise], return_distance=False)[:, 0]]
    return labels


def _positive(dist: np.ndarray) -> np.ndarray:
    """The kNN distances with zeros raised to a tiny positive value.

    umap-learn's calibration takes ``rho_i`` as the first positive distance, which would give a
    sample's exact copies no say and the nearest other shape the full weight; with zeros raised
    to ``1e-6`` of the smallest positive distance, ``rho_i`` is the distance to the copies.
    """
    dist = np.asarray(dist, dtype=np.float64)
    pos = dist[(dist > 0) & np.isfinite(dist)]
    tiny = 1e-6 * (float(pos.min()) if pos.size else 1.0)
    return np.where(dist > tiny, dist, tiny)


def embed_graph(index: np.ndarray, dist: np.ndarray, random_state,
                n_components: int = 10) -> np.ndarray:
    """umap-learn's embedding (``min_dist=0``) of a kNN graph given as ``(n, k)`` arrays."""
    n, k = index.shape
    idx = np.concatenate([np.arange(n)[:, None], index], 1).astype(np.int64)
    dst = np.concatenate([np.zeros((n, 1)), _positive(dist)], 1).astype(np.float32)
    n_components = int(max(1, min(n_components, n - 2)))
    if n <= n_components + 2 or k < 2:
        # too small for a layout: each sample's graph distances to all samples
        emb = np.full((n, n), float(dst.max()) * 2.0 + 1.0)
        np.put_along_axis(emb, idx, dst, axis=1)
        return emb
    return _umap_embedding(idx, dst, n_components, random_state)


def _umap_embedding(idx, dst, n_components, random_state):
    """umap-learn's layout (``min_dist=0``) of a kNN graph, the sample itself in column 0: a
    ``UMAP(metric="precomputed")`` fitted on the graph's sparse symmetric distance matrix, with
    the graph itself as its ``precomputed_knn``."""
    return _fit_umap(_distance_matrix(idx, dst), idx, dst, n_components, random_state)


def _distance_matrix(idx, dst):
    """The symmetric sparse distance matrix of a kNN graph ``(idx, dst)`` (the sample itself in
    column 0): every edge in both directions, the shorter distance where both directions were
    found, and a zero diagonal, as umap-learn's ``metric="precomputed"`` takes it."""
    from scipy.sparse import csr_matrix

    n, k = idx.shape
    rows = np.repeat(np.arange(n), k)
    cols, vals = idx.ravel(), np.asarray(dst, dtype=np.float32).ravel()
    keep = (cols != rows) & (cols >= 0)
    r = np.concatenate([rows[keep], cols[keep]])
    c = np.concatenate([cols[keep], rows[keep]])
    v = np.concatenate([vals[keep], vals[keep]])
    # the shortest of each pair's distances first, then one entry a pair
    order = np.lexsort((v, c, r))
    r, c, v = r[order], c[order], v[order]
    first = np.ones(r.size, dtype=bool)
    first[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
    return csr_matrix((v[first], (r[first], c[first])), shape=(n, n))


# connected parts of a graph up to which umap-learn's layout starts from its spectral embedding;
# beyond, at random: with precomputed distances it places the parts by their average linkage,
# one sparse slice per pair of parts
SPECTRAL_MAX_PARTS = 50


def _fit_umap(D, idx, dst, n_components, random_state):
    """``UMAP(metric="precomputed", precomputed_knn=(idx, dst))`` fitted on the sparse distance
    matrix ``D``; its 10-D layout with ``min_dist=0``."""
    umap = import_quietly("umap")

    n, k = idx.shape
    spectral = n > 3 * n_components and connected_components(
        D, directed=False)[0] <= SPECTRAL_MAX_PARTS
    with warnings.catch_warnings():
        # umap-learn warns that a seed disables its parallel layout, about tiny graphs and that
        # a precomputed metric has no inverse transform
        warnings.simplefilter("ignore")
        reducer = umap.UMAP(n_components=n_components, n_neighbors=k, min_dist=0.0,
                            metric="precomputed", precomputed_knn=(idx, dst),
                            random_state=random_state,
                            init="spectral" if spectral else "random", n_jobs=1)
        return reducer.fit_transform(D)


def embed_fuzzy_graph(graph, random_state, n_components: int = 10) -> np.ndarray:
    """umap-learn's layout (``min_dist=0``) of a given fuzzy graph, e.g. a union of two.

    The graph's memberships become distances ``-log w_ij``; each sample keeps its ``m``
    nearest, ``m`` the fewest edges a sample has, and ``UMAP(metric="precomputed")`` lays out
    that kNN graph (:func:`_umap_embedding`).
    """
    G = graph.tocsr(copy=True)
    G.setdiag(0)
    G.eliminate_zeros()
    n = G.shape[0]
    degree = np.diff(G.indptr)
    m = int(degree[degree > 0].min()) if degree.any() else 0
    idx = np.full((n, m + 1), -1, dtype=np.int64)
    dst = np.full((n, m + 1), np.inf, dtype=np.float32)
    idx[:, 0], dst[:, 0] = np.arange(n), 0.0
    # each row's entries by decreasing membership, and their rank within the row
    rows = np.repeat(np.arange(n), degree)
    order = np.lexsort((-G.data, rows))
    rank = np.arange(G.nnz) - G.indptr[rows]
    near = rank < m
    idx[rows[near], 1 + rank[near]] = G.indices[order[near]]
    dst[rows[near], 1 + rank[near]] = -np.log(np.minimum(G.data[order[near]], 1.0))
    dst[:, 1:] = _positive(dst[:, 1:])
    n_components = int(max(1, min(n_components, n - 2)))
    if n <= n_components + 2 or m < 1:
        return embed_graph(idx[:, 1:], dst[:, 1:], random_state, n_components)
    return _umap_embedding(idx, dst, n_components, random_state)
