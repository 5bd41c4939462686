"""Grouping of converged invariant means: from a sparse invariant kNN graph to cluster labels.

Everything here works on a kNN graph given as ``(index, dist)`` arrays of shape ``(n, k)``
(each row sorted by distance, the sample itself left out): never an ``n x n`` matrix.

- :func:`two_hop_candidates`: the neighbours and the neighbours' neighbours of every sample, the
  shortlist on which the graph of the means is searched again.
- :func:`graph_modes`: connected components of the edges shorter than a per-sample tolerance
  (the partition whose stability stops the blurring update).
- :func:`embed_and_cluster`: umap-learn's fuzzy simplicial set of the graph, a 10-D embedding and
  k-means in it, or HDBSCAN when the number of clusters is not given (``grouping="umap"``).
- :func:`fuzzy_graph`, :func:`leiden`, :func:`group`: the estimator's default, Leiden on the
  fuzzy graph of the samples' kNN graph or of its union with the means' graph
  (``benchmarks/bench_noise.py`` measures every grouping tried).
- :func:`count_groups`: ``n_clusters=None``: the separated groups of the samples' kNN graph
  (:func:`finest_separated`: one cut of the single-linkage tree with a gap,
  :func:`separated_groups`, or HDBSCAN's clusters of it, each with its own gap,
  :func:`density_groups`), where the noise dominates the refined distances the finest clusters
  each separated by their own gap on them (:func:`noise_dominated_groups`), or of the
  converged means' graph (the cut), where the noise is
  material raised by the graph's eigengap (:func:`eigengap_count`), else
  modularity's communities merged where the iteration collapsed them onto one mean
  (:func:`merge_by_modes`).
- :func:`vote`: ``predict``'s majority among the nearest fitted samples.

Each rule's measurements: the user guide's convergence page, "The grouping's rules, and how
they were chosen" (``docs/user_guide/convergence.rst``), and ``benchmarks/bench_noise.py``.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from ._graph import graph_modes  # noqa: F401 - importable from here, as the docstring lists it
from ._leiden import (  # noqa: F401 - _igraph_graph: the tests build graphs with it
    _graph_edges,
    _igraph_from_edges,
    _igraph_graph,
    _igraph_leiden,
    leiden_runs,
    leiden_worker,
    run_workers,
)
from ._third_party import import_quietly
from ._weights import calibrate_bandwidth

# HDBSCAN's min_samples: its default merged small groups of copies (the user guide's rules)
_MIN_SAMPLES = 2


def two_hop_candidates(index: torch.Tensor, rows=None) -> torch.Tensor:
    """Distinct key indices within two hops of every query, ``(n, w)``; with ``rows`` (a 1-D
    index tensor), of those queries only, ``(len(rows), w)``.

    ``w <= k + k^2`` is the largest number of distinct keys of a row: shorter rows are padded
    with the query's own index (searches leave it out with ``exclude``), so every row has the
    same width and no key twice apart from the query itself (the pad is searched like any key,
    so it is kept to the widest row, not ``k + k^2``).
    """
    k = index.shape[1]
    if rows is None:
        rows = torch.arange(index.shape[0], device=index.device)
    first = index[rows]
    cand = torch.cat([first, index[first].reshape(len(rows), k * k)], 1)
    cand, _ = cand.sort(1)
    dup = torch.zeros_like(cand, dtype=torch.bool)
    dup[:, 1:] = cand[:, 1:] == cand[:, :-1]
    dup |= cand == rows[:, None]
    # the distinct keys first (stable: in order), then the pad
    order = torch.argsort(dup.to(torch.int8), dim=1, stable=True)
    width = int((~dup).sum(1).max()) if len(rows) else 0
    order = order[:, :max(width, 1)]
    return torch.where(dup.gather(1, order), rows[:, None].expand_as(order),
                       cand.gather(1, order))


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


def fuzzy_graph(index: np.ndarray, dist: np.ndarray, random_state=0, calibration="capped"):
    """The fuzzy graph of a kNN graph: a symmetric sparse ``(n, n)`` matrix of membership
    strengths in [0, 1], ``w_ij = exp(-max(d_ij - rho_i, 0) / sigma_i)`` made symmetric by the
    fuzzy union ``w_ij + w_ji - w_ij w_ji`` (umap-learn's construction).

    ``calibration="capped"``: ``(rho_i, sigma_i)`` from :func:`calibrate_bandwidth`, the
    attention's own calibration, whose cap keeps a group smaller than the neighbourhood from
    borrowing weight from other groups. "umap": umap-learn's calibration
    (:func:`umap_bandwidth`), the graph of its ``fuzzy_simplicial_set``.
    """
    n, k = index.shape
    if calibration == "umap":
        dst = np.concatenate([np.zeros((n, 1)), _positive(dist)], 1).astype(np.float32)
        rho, sigma = umap_bandwidth(dst)
        d = dst[:, 1:] - rho[:, None]
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            w = np.where((d <= 0) | (sigma[:, None] == 0), np.float32(1.0),
                         np.exp(-(d / sigma[:, None]))).astype(np.float32)
        w[index == np.arange(n)[:, None]] = 0.0
        return _fuzzy_union(w, index)
    d = torch.as_tensor(np.asarray(dist, dtype=np.float64))
    rho, sigma = calibrate_bandwidth(d)
    w = torch.exp(-(d - rho[:, None]).clamp(min=0) / sigma[:, None]).numpy()
    return _fuzzy_union(w, index)


def _fuzzy_union(w: np.ndarray, index: np.ndarray):
    """The fuzzy union ``W + W^T - W * W^T`` of the directed memberships ``w[i, j]`` of the
    edges ``i -> index[i, j]``, as a CSR matrix without explicit zeros."""
    from scipy.sparse import csr_matrix

    n, k = index.shape
    W = csr_matrix((w.ravel(), (np.repeat(np.arange(n), k), index.ravel())), shape=(n, n))
    W.sum_duplicates()
    W.eliminate_zeros()
    Wt = W.T.tocsr()
    G = (W + Wt - W.multiply(Wt)).tocsr()
    G.eliminate_zeros()
    return G


# umap-learn's constants of its bandwidth search (umap/umap_.py)
_UMAP_TOLERANCE = 1e-5
_UMAP_MIN_SCALE = 1e-3
_UMAP_ITERATIONS = 64


def umap_bandwidth(dst: np.ndarray):
    """umap-learn's calibration (``smooth_knn_dist``, ``local_connectivity=1``) of a kNN graph
    whose ``(n, k + 1)`` distances hold the sample itself (0) in column 0: ``(rho, sigma)``.

    ``rho_i`` is the distance to the nearest other sample, and ``sigma_i`` solves
    ``sum_j exp(-max(d_ij - rho_i, 0) / sigma_i) = log2(k + 1)`` by the same 64-step bisection
    in float32, vectorised over the samples: the default grouping needs no compiled code of
    umap-learn (``tests/test_grouping.py`` checks it against umap-learn's).
    """
    dst = np.asarray(dst, dtype=np.float32)
    n, width = dst.shape
    target = np.float32(np.log2(width))
    pos = dst > 0
    has = pos.any(1)
    rho = np.where(has, dst[np.arange(n), np.argmax(pos, 1)], 0).astype(np.float32)
    big = np.float32(np.finfo(np.float32).max)
    lo = np.zeros(n, np.float32)
    hi = np.full(n, big, np.float32)
    mid = np.ones(n, np.float32)
    active = np.ones(n, dtype=bool)
    R = dst[:, 1:] - rho[:, None]
    for _ in range(_UMAP_ITERATIONS):
        rows = np.flatnonzero(active)
        if not rows.size:
            break
        r, m = R[rows], mid[rows]
        psum = np.where(r > 0, np.exp(-(r / m[:, None])), np.float32(1.0)).sum(
            1, dtype=np.float32)
        close = np.abs(psum - target) < _UMAP_TOLERANCE
        above = psum > target
        l_, h_ = lo[rows], hi[rows]
        h_ = np.where(above, m, h_)
        l_ = np.where(above, l_, m)
        m = np.where(above | (h_ < big), (l_ + h_) / np.float32(2.0), m * np.float32(2.0))
        keep = ~close
        lo[rows[keep]], hi[rows[keep]], mid[rows[keep]] = l_[keep], h_[keep], m[keep]
        active[rows[close]] = False
    floor = np.where(rho > 0, dst.mean(1, dtype=np.float32), dst.mean(dtype=np.float32))
    sigma = np.maximum(mid, np.float32(_UMAP_MIN_SCALE) * floor).astype(np.float32)
    return rho, sigma


# Secant search of the resolution, the probes below a finer partition on its aggregate graph
# (milliseconds each instead of seconds on the whole graph).
_RESOLUTION_RANGE = (1e-4, 1e4)

# With n_clusters, a community under this fraction of n / n_clusters (pairs of near-copies)
# is not a cluster: it is not counted, and joins its most strongly joined counted community.
_MIN_PART_FRACTION = 0.02


# Leiden runs (seeds drawn from random_state, _run_seeds) of which the typical one of highest
# quality is taken (_best_partition), at resolution 1 for n_clusters=None and at each
# resolution the count-given search runs on the whole graph: one run's partition depends on
# its seed and on the order of the nodes (measured: docs/design/leiden.rst).
COUNT_RUNS = 10


def _run_seeds(random_state) -> list[int]:
    """The seeds of the ``COUNT_RUNS`` Leiden runs of ``random_state``: drawn from
    ``np.random.SeedSequence(random_state)``, so that two random states share no run."""
    return [int(s) for s in np.random.SeedSequence(int(random_state)).generate_state(COUNT_RUNS)]


def _leiden_runs(net, edges, resolution, seeds):
    """``(memberships, qualities)`` of igraph's Leiden runs of ``seeds`` at ``resolution`` on
    ``net`` (whose edges are ``edges``, :func:`_graph_edges`; None: read from ``net`` where
    they are needed), in worker processes where :func:`run_workers` gives more than one; the
    same runs either way."""
    from ._memory import memory_budget

    workers = run_workers(len(seeds), net.ecount(), torch.get_num_threads(),
                          available=memory_budget("cpu"))
    if workers > 1:
        from joblib import Parallel, delayed

        if edges is None:
            pairs = np.asarray(net.get_edgelist(), dtype=np.int64).reshape(-1, 2)
            edges = (net.vcount(), pairs[:, 0], pairs[:, 1],
                     np.asarray(net.es["weight"], dtype=np.float64))
        shares = [list(s) for s in np.array_split(np.asarray(seeds, dtype=np.int64), workers)]
        done = Parallel(n_jobs=workers, prefer="processes")(
            delayed(leiden_worker)(edges, resolution, [int(x) for x in share])
            for share in shares)
        pairs = [(m.tolist(), q) for part in done for m, q in part]
    else:
        pairs = leiden_runs(net, resolution, seeds)
    return [m for m, _ in pairs], [q for _, q in pairs]


def _best_partition(net, resolution, random_state, edges=None) -> np.ndarray:
    """Labels of the partition of highest quality (modularity at ``resolution``) among the
    typical ones of ``COUNT_RUNS`` runs of igraph's Leiden (``_IGRAPH_ITERATIONS`` iterations
    each) on the weighted igraph graph ``net``, then iterated from there until stable: the
    first iterations gain most of the quality at a fraction of the time (the user guide's
    convergence page). ``edges``: ``net``'s edges (:func:`_graph_edges`), with which large
    graphs' runs go to worker processes (:func:`_leiden_runs`); None: read from ``net``.

    The typical runs agree with the others (mean adjusted Rand index) at least as well as the
    median run does (:func:`_typical_runs`): near-optimal partitions differ in quality by less
    than the runs' own spread, so the best run alone can make a split the others do not."""
    runs, quality = _leiden_runs(net, edges, resolution, _run_seeds(random_state))
    candidates = _typical_runs(runs)
    best = runs[int(candidates[np.argmax(np.asarray(quality)[candidates])])]
    best = _igraph_leiden(net, resolution, int(random_state), n_iterations=-1, initial=best)
    return np.unique(best, return_inverse=True)[1].astype(np.int64)


def _pair_ari(a: np.ndarray, b: np.ndarray) -> float:
    """The adjusted Rand index of two labelings of ``0..max`` ints, from the pair counts as
    scikit-learn's ``adjusted_rand_score`` computes them (same integers, same final formula, so
    the same float), with one ``bincount`` for the contingency table instead of a sparse
    matrix (at 10,000 samples about 0.4 ms against 17 ms a pair)."""
    n = int(a.size)
    width = int(b.max()) + 1
    table = np.bincount(a * width + b)
    # every count below is a sum of squares of counts, at most n ** 2: exact in int64
    s = int(np.dot(table, table))
    rows, cols = np.bincount(a), np.bincount(b)
    fp = int(np.dot(cols, cols)) - s
    fn = int(np.dot(rows, rows)) - s
    tp = s - n
    tn = n * n - fp - fn - s
    if fn == 0 and fp == 0:
        return 1.0
    return 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))


def _typical_runs(runs) -> np.ndarray:
    """Indices of the partitions ``runs`` whose mean adjusted Rand index with the other runs
    is at least the median of those means: the runs the ensemble supports (stability), the
    others being splits or merges that only some runs make."""
    r = len(runs)
    if r < 3:
        return np.arange(r)
    # each converted once, not once per pair; labels renumbered 0.. (Leiden's already are)
    runs = [np.unique(np.asarray(m), return_inverse=True)[1].astype(np.int64) for m in runs]
    agree = np.eye(r)
    for i in range(r):
        for j in range(i + 1, r):
            agree[i, j] = agree[j, i] = _pair_ari(runs[i], runs[j])
    mean = (agree.sum(1) - 1.0) / (r - 1)
    return np.flatnonzero(mean >= np.median(mean))


def leiden(graph, n_clusters, random_state=0, max_steps: int = 40):
    """Leiden (RB configuration model) on a weighted sparse graph.

    ``n_clusters=None``: resolution 1 (modularity), the typical best of ``COUNT_RUNS`` runs
    of igraph's Leiden (:func:`_best_partition`). An int: the resolution is searched (from 1,
    secant steps in log-log; the typical best of igraph's Leiden runs on the whole graph, then
    leidenalg merging the communities of a finer probe) until the partition has
    ``n_clusters`` parts; if none is found, the partition with the closest count not above
    ``n_clusters``. Communities under ``_MIN_PART_FRACTION`` of ``n / n_clusters`` nodes are
    not counted and join the counted community they are most strongly joined to.
    """
    import leidenalg as la

    edges = _graph_edges(graph)
    net = _igraph_from_edges(*edges)
    if n_clusters is None:
        return _best_partition(net, 1.0, random_state, edges)
    optimiser = la.Optimiser()
    optimiser.set_rng_seed(int(random_state))

    def run(resolution, finer=None):
        """Leiden at ``resolution``: on the whole graph (igraph's), or merging the communities
        of the partition ``finer`` (leidenalg on its aggregate graph). Returns
        ``(labels, partition)``."""
        if finer is None:
            membership = _best_partition(net, resolution, random_state, edges)
            part = la.RBConfigurationVertexPartition(net, weights="weight",
                                                     resolution_parameter=resolution,
                                                     initial_membership=membership)
        else:
            coarse = finer.aggregate_partition()
            coarse.resolution_parameter = resolution
            optimiser.optimise_partition(coarse, n_iterations=2)
            part = la.RBConfigurationVertexPartition(
                net, weights="weight", resolution_parameter=resolution,
                initial_membership=finer.membership)
            part.from_coarse_partition(coarse)
        return np.unique(part.membership, return_inverse=True)[1].astype(np.int64), part

    min_size = max(1, math.ceil(_MIN_PART_FRACTION * graph.shape[0] / int(n_clusters)))
    labels = _search_resolution(run, int(n_clusters), max_steps, min_size)
    return _absorb_small_parts(labels, graph, min_size)


def _count_parts(labels: np.ndarray, min_size: int) -> int:
    """Number of parts of ``labels`` with at least ``min_size`` members."""
    return int((np.bincount(labels) >= min_size).sum())


def _absorb_small_parts(labels: np.ndarray, graph, min_size: int) -> np.ndarray:
    """``labels`` with every part under ``min_size`` members merged into the part of at least
    ``min_size`` to which the sum of its edge weights is largest (repeated while that joins
    more; a small part joined to none stays apart). Labels renumbered from 0."""
    labels = np.asarray(labels, dtype=np.int64)
    if min_size <= 1:
        return labels
    A = graph.tocsr()
    for _ in range(int(labels.max()) + 1):
        sizes = np.bincount(labels)
        big = sizes >= min_size
        small_rows = np.flatnonzero(~big[labels])
        if small_rows.size == 0 or not big.any():
            break
        # weight from each small part (rows) to each counted part (columns): a dense array of
        # (small parts x counted parts), never (parts x parts)
        big_parts = np.flatnonzero(big)
        column = np.full(sizes.size, -1)
        column[big_parts] = np.arange(big_parts.size)
        parts, row = np.unique(labels[small_rows], return_inverse=True)
        sub = A[small_rows].tocoo()
        to_big = big[labels[sub.col]]
        strength = coo_matrix((sub.data[to_big], (row[sub.row[to_big]],
                                                  column[labels[sub.col[to_big]]])),
                              shape=(parts.size, big_parts.size)).toarray()
        joined = strength.max(1) > 0
        if not joined.any():
            break
        target = np.arange(sizes.size)
        target[parts[joined]] = big_parts[strength[joined].argmax(1)]
        labels = target[labels]
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def _search_resolution(run, n_clusters, max_steps, min_size=1):
    """Secant search for the resolution at which ``run(resolution, finer)`` gives
    ``n_clusters`` parts of at least ``min_size`` members (the count grows with the
    resolution); ``finer`` is the partition of the finest probe with too many parts so far (None
    before there is one). See :func:`leiden`."""
    target = math.log(n_clusters)
    lo_r, hi_r = (math.log(r) for r in _RESOLUTION_RANGE)
    below = above = None  # (log r, log count, partition) of the nearest probes either side
    best, best_count, x, prev = None, 0, 0.0, None
    for _ in range(max_steps):
        # only merging is asked of a finer partition: a probe above its resolution starts over
        finer = above[2] if above is not None and x < above[0] else None
        labels, part = run(math.exp(x), finer)
        c = _count_parts(labels, min_size)
        if c <= n_clusters and (best is None or c > best_count):
            best, best_count = labels, c
        if c == n_clusters:
            break
        point = (x, math.log(max(c, 1)), part)
        if c > n_clusters:
            if finer is None:
                # from now on the probes merge this partition's communities: counts from the
                # whole graph below it are of another function and would bracket nothing
                below = None
            above = point
        else:
            below = point
        if below is not None and above is not None:
            if above[0] - below[0] < 1e-3:
                break
            # secant between the bracket's ends, kept in its middle 80%
            dy = above[1] - below[1]
            t = 0.5 if dy <= 0 else min(max((target - below[1]) / dy, 0.1), 0.9)
            nxt = below[0] + t * (above[0] - below[0])
        else:
            # one side only: the count grows about as the resolution (slope 1 in log-log)
            step = target - point[1]
            if prev is not None and prev[1] != point[1] and point[0] != prev[0]:
                slope = (point[1] - prev[1]) / (point[0] - prev[0])
                if 0.2 <= slope <= 5.0:
                    step /= slope
            nxt = min(max(x + step, lo_r), hi_r)
            if nxt == x:  # at the end of the range
                break
        prev, x = point, nxt
    return best if best is not None else labels


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


# "auto" groups the union of the two graphs when the means' graph shares fewer than this
# fraction of its edges with the samples' graph (the iteration replaced most neighbours).
_UNION_BELOW = 0.44

# "auto" decides on this many rows at most (a seeded subset beyond): enough for +-0.005.
DECIDE_ROWS = 2000

# In the union the means' graph is searched again among all means, with umap-learn's
# calibration: one more kNN search, only where "auto" chose the union.

def shared_edges(index: np.ndarray, index_means: np.ndarray) -> float:
    """Fraction of the means' kNN edges that are also edges of the samples' kNN graph.

    The two arrays are row-aligned (row ``i`` of each belongs to the same sample), so they may
    hold a subset of the samples' rows.
    """
    if index_means.shape[0] == 0 or index_means.shape[1] == 0:
        return 1.0
    same = (np.asarray(index_means)[:, :, None] == np.asarray(index)[:, None, :]).any(2)
    return float(same.mean())


def resolve_graph(graph, index, index_means):
    """``graph`` with "auto" resolved: "both" when the means' graph (searched within two hops)
    shares fewer than ``_UNION_BELOW`` of its edges with the samples' graph, else "samples"."""
    if graph != "auto":
        return graph
    return "both" if (index_means is not None and index.shape[1] > 0
                      and shared_edges(index, index_means) < _UNION_BELOW) else "samples"


def group(index, dist, index_means, dist_means, n_clusters, graph, grouping, random_state,
          modes=None, means_edges=None, connect=None, refined=None, refined_means=None):
    """Labels from the samples' and the means' kNN graphs (``(n, k)`` arrays, self left out).

    ``graph``: "samples", "means", "both" (the union of their fuzzy graphs) or "auto" ("both"
    when the means' graph shares fewer than ``_UNION_BELOW`` of its edges with the samples'
    graph, else "samples"). ``grouping``: "leiden" (resolution bisected to give
    ``n_clusters``; None: resolution 1, modularity) or "umap" (umap-learn's layout of the graph,
    then k-means, or HDBSCAN for ``n_clusters=None``). ``modes``: the converged means' modes
    (:func:`graph_modes`) and ``means_edges`` every edge searched between them, used by
    ``n_clusters=None`` with "leiden" (:func:`count_groups`). ``connect``: where no resolution
    gives ``n_clusters`` parts, a function of ``n_clusters`` that returns the modes of the
    converged means (more than ``n_clusters``), one node per mode and the kNN graph among those
    nodes (:func:`group_components`), or None. ``refined``, ``refined_means``: the samples' and
    the means' edges' refined distances, lazily, for the count (:func:`count_groups`).
    With ``n_clusters`` and "leiden", a separated partition of the samples' graph with that
    many groups is taken when there is one (copy sets: Leiden's resolution search cuts chains
    of copies at arbitrary places). Returns ``(labels, graph_used, rule, separation)``: ``rule``
    says what decided the count ("given", "separated", "separated_refined", "separated_means",
    "eigengap", "modularity" or "hdbscan", see :func:`count_groups`); ``separation`` the gap
    ratio of the separated partition tested (None where none was).
    """
    n = index.shape[0]
    graph = resolve_graph(graph, index, index_means)
    if n <= 1 or index.shape[1] == 0:  # one distinct image
        return (np.zeros(n, dtype=np.int64), graph, "given" if n_clusters else "separated",
                None)
    if n_clusters is not None and n <= n_clusters:
        return np.arange(n), graph, "given", None
    if n_clusters is None and grouping == "leiden":
        labels, rule, separation = count_groups(index, dist, index_means, dist_means, graph,
                                                modes, random_state, means_edges, refined,
                                                refined_means)
        return labels, graph, rule, separation
    if grouping == "leiden":
        labels, separation = separated_groups(index, dist, n_groups=int(n_clusters))
        if labels is not None:
            return labels, graph, "given", separation
    rule = "given" if n_clusters is not None else "hdbscan"
    if grouping == "umap" and graph != "both":
        idx, dst = (index, dist) if graph == "samples" else (index_means, dist_means)
        return embed_and_cluster(idx, dst, n_clusters, random_state), graph, rule, None
    G = _union_graph(index, dist, index_means, dist_means, graph, random_state)
    if grouping == "umap":
        emb = embed_fuzzy_graph(G, random_state)
        return _cluster_embedding(emb, n_clusters, random_state), graph, rule, None
    labels = leiden(G, n_clusters, random_state)
    if n_clusters is not None and int(labels.max()) + 1 != n_clusters:
        # no resolution gives n_clusters parts. Copy sets that only see each other (larger
        # than the neighbourhood): the modes of the converged means are grouped, by the kNN
        # graph of one mean each; else spectral clustering
        contracted = None if connect is None else connect(n_clusters)
        if contracted is not None:
            return group_components(*contracted, n_clusters, random_state), graph, rule, None
        labels = spectral_labels(G, n_clusters, random_state)
    return labels, graph, rule, None


def group_components(parts, nodes, index_c, dist_c, n_clusters, random_state):
    """``n_clusters`` groups of the parts (labels ``parts``, e.g. the converged means' modes)
    of a graph, each part one node: Leiden on the fuzzy graph of the parts' kNN graph
    (``index_c``, ``dist_c``: each part's nearest other parts, by the node ``nodes`` standing
    for it; umap-learn's calibration, as the means' graph), spectral clustering where no
    resolution gives that count. Returns the labels of the graph's nodes."""
    if len(nodes) <= n_clusters:
        return np.asarray(parts, dtype=np.int64)
    C = fuzzy_graph(index_c, dist_c, random_state, calibration="umap")
    labels = leiden(C, n_clusters, random_state)
    if int(labels.max()) + 1 != n_clusters:
        labels = spectral_labels(C, n_clusters, random_state)
    return np.asarray(labels, dtype=np.int64)[parts]


# Nodes up to which the spectral embedding uses ARPACK (scikit-learn's default); beyond, LOBPCG:
# ARPACK's shift-invert LU factorisation of the Laplacian fills in (measured:
# docs/design/defaults.rst).
SPECTRAL_ARPACK_MAX_NODES = 10_000


def spectral_labels(graph, n_clusters: int, random_state) -> np.ndarray:
    """k-means on the spectral embedding of a fuzzy graph (scikit-learn's
    ``spectral_embedding``, the normalised Laplacian's first ``n_clusters`` eigenvectors):
    spectral clustering, for a graph on which no Leiden resolution gives ``n_clusters`` parts.
    The eigenvectors come from ARPACK up to ``SPECTRAL_ARPACK_MAX_NODES`` nodes, from LOBPCG
    beyond (memory linear in the nodes).
    """
    from sklearn.cluster import KMeans
    from sklearn.manifold import spectral_embedding

    n = graph.shape[0]
    n_components = int(max(1, min(n_clusters, n - 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Graph is not fully connected"
        emb = spectral_embedding(
            graph, n_components=n_components, drop_first=False, random_state=random_state,
            eigen_solver="arpack" if n <= SPECTRAL_ARPACK_MAX_NODES else "lobpcg")
    return KMeans(int(n_clusters), n_init=10, random_state=random_state).fit_predict(emb)


def _means_graph(index_means, dist_means, random_state):
    """The means' fuzzy graph. It takes umap-learn's calibration: the capped one cuts the
    denoised means into islands."""
    return fuzzy_graph(index_means, dist_means, random_state, "umap")


def _union_graph(index, dist, index_means, dist_means, graph, random_state, means=None):
    """The fuzzy graph that ``graph`` names ("samples", "means" or "both"); ``means``: the
    means' fuzzy graph if it is already built."""
    parts = []
    if graph in ("samples", "both"):
        parts.append(fuzzy_graph(index, dist, random_state))
    if graph in ("means", "both"):
        parts.append(_means_graph(index_means, dist_means, random_state)
                     if means is None else means)
    return parts[0] if len(parts) == 1 else parts[0].maximum(parts[1])


def merge_by_modes(labels: np.ndarray, modes) -> np.ndarray:
    """``labels`` merged along ``modes`` when the modes are a strict coarsening of them.

    With ``n_clusters=None`` modularity at resolution 1 splits groups whose copies are far
    apart (lossy rotations of small images), while the iteration collapsed each group onto one
    mean: communities are merged where the means say they are one (the meet of the means'
    modes and of their graph's communities), and only when every community lies inside one
    mode and there are at least two modes.
    """
    if modes is None or not _strict_coarsening(labels, modes):
        return labels
    return np.unique(np.asarray(modes), return_inverse=True)[1].astype(np.int64)


def _strict_coarsening(labels: np.ndarray, modes) -> bool:
    """Whether ``modes`` is a strict coarsening of ``labels`` into at least two parts: fewer
    modes than communities, and no community straddling two modes."""
    modes = np.asarray(modes)
    n_modes = int(np.unique(modes).size)
    if n_modes < 2 or n_modes >= int(labels.max()) + 1:
        return False
    return _refines(labels, modes)


def _refines(fine: np.ndarray, coarse: np.ndarray) -> bool:
    """Whether every part of ``fine`` lies within one part of ``coarse`` (labels of the same
    nodes)."""
    pairs = np.unique(np.c_[np.asarray(fine), np.asarray(coarse)], axis=0)
    return np.unique(pairs[:, 0]).size == pairs.shape[0]


# The count of separated groups (n_clusters=None): groups of at least SEPARATED_MIN_SIZE
# distinct images whose shortest edge between groups is at least SEPARATED_MIN_GAP times the
# longest edge that holds a group together (a single-linkage Dunn index); copies of a few
# shapes give such partitions, natural classes do not. Images of tiny parts (at most
# SEPARATED_MAX_OUTLIERS of all, or SEPARATED_MIN_SIZE images where that is fewer: on a graph
# of 24 nodes, a fraction alone would let no group of 3 fail the gap) join the group they meet
# first.
SEPARATED_MIN_GAP = 1.25
# The converged means' graph needs a wider gap: the iteration contracts natural classes'
# neighbourhoods too (measured: docs/design/count.rst).
SEPARATED_MEANS_MIN_GAP = 1.5
# ... and counts only where the measured noise is a material part of the images: noise_std_
# at least this fraction of the images' standard deviation (measured: docs/design/count.rst).
NOISY_FRACTION = 0.1
SEPARATED_MIN_SIZE = 3
SEPARATED_MAX_OUTLIERS = 0.1


def _outlier_limit(n: int, max_outliers: float, min_size: int) -> float:
    """How many of ``n`` nodes may be left outside the groups: ``max_outliers`` of them, and at
    least one group's worth (``min_size``)."""
    return max(max_outliers * n, min_size)


def _symmetric_distances(index: np.ndarray, dist: np.ndarray):
    """The kNN graph as a symmetric sparse ``(n, n)`` matrix of distances (the smaller of the
    two directions; zeros raised to a tiny positive value, which sparse graphs would drop)."""
    from scipy.sparse import csr_matrix

    n, k = index.shape
    rows = np.repeat(np.arange(n), k)
    cols = np.asarray(index, dtype=np.int64).ravel()
    d = np.asarray(dist, dtype=np.float64).ravel()
    keep = (rows != cols) & np.isfinite(d)
    rows, cols, d = rows[keep], cols[keep], d[keep]
    if d.size == 0:
        return csr_matrix((n, n))
    pos = d[d > 0]
    d = np.maximum(d, 1e-9 * (pos.min() if pos.size else 1.0))
    # both directions of every edge, keyed row-major; the smaller distance of each pair; the
    # CSR arrays written directly (six times faster than a sort by row, column and distance)
    key = np.r_[rows * n + cols, cols * n + rows]
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    data = np.minimum.reduceat(np.r_[d, d][order], first)
    key = key[first]
    r = key // n
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    return csr_matrix((data, key - r * n, indptr), shape=(n, n))


def _tree_edges(S):
    """The minimum spanning tree (forest) of the symmetric sparse graph ``S``: its edges
    ``(ei, ej, ew)``, shortest first (ties in the tree's own order)."""
    from scipy.sparse.csgraph import minimum_spanning_tree

    T = minimum_spanning_tree(S).tocoo()
    order = np.argsort(T.data, kind="stable")
    return T.row[order], T.col[order], T.data[order]


def separated_groups(index: np.ndarray, dist: np.ndarray, min_gap: float = SEPARATED_MIN_GAP,
                     min_size: int = SEPARATED_MIN_SIZE,
                     max_outliers: float = SEPARATED_MAX_OUTLIERS, n_groups=None,
                     accept=None):
    """The finest separated partition of a kNN graph, if it has one.

    The minimum spanning tree of the graph (its single-linkage tree) is built edge by edge,
    shortest first. Just before each edge that joins two parts of at least ``min_size`` nodes
    (at most half the nodes, for tiny graphs), the parts of that size are a candidate
    partition, its separation the ratio of that edge to the longest edge inside any of them;
    parts of the graph that are not connected at all are separated infinitely. Returns
    ``(labels, separation)`` for the candidate with the most groups (with ``n_groups``: with
    that many groups, the best separated) among those separated by at least ``min_gap`` with
    at most ``max_outliers`` of the nodes (and at least ``min_size``) in smaller parts (each of
    those joins the group it meets first along the tree), or ``(None, best separation seen)``.

    Sizes count nodes: the fit passes one node per distinct image, so that duplicates do not
    turn a pair into a group. ``accept``: a test of a candidate's labels (the finest candidate
    that passes it is returned).
    """
    n = index.shape[0]
    min_size = max(1, min(int(min_size), n // 2))
    if n < 2 or index.shape[1] == 0:
        return None, 1.0
    ei, ej, ew = _tree_edges(_symmetric_distances(index, dist))
    # the loop below runs once per tree edge: on Python lists, not NumPy scalars
    parent = list(range(n))
    size = [1] * n
    inner = [0.0] * n  # longest tree edge inside each part
    n_big = n if min_size <= 1 else 0
    covered, longest = n_big, 0.0
    best_ratio = 1.0
    found = []  # (groups, ratio, edges taken) of every candidate

    def consider(count, edges, ratio):
        if ratio >= min_gap and (n_groups is None or count == n_groups):
            found.append((count, ratio, edges))

    limit = _outlier_limit(n, max_outliers, min_size)
    for e, (i, j, w) in enumerate(zip(ei.tolist(), ej.tolist(), ew.tolist())):
        a, b = _find(parent, i), _find(parent, j)
        big_a, big_b = size[a] >= min_size, size[b] >= min_size
        if big_a and big_b and n - covered <= limit:
            ratio = w / longest if longest > 0 else math.inf
            best_ratio = max(best_ratio, ratio)
            consider(n_big, e, ratio)
        if size[a] < size[b]:
            a, b = b, a
        parent[b] = a
        before = (size[a] if big_a else 0) + (size[b] if big_b else 0)
        size[a] += size[b]
        inner[a] = max(inner[a], inner[b], w)
        if size[a] >= min_size:
            n_big += 1 - int(big_a) - int(big_b)
            covered += size[a] - before
            longest = max(longest, inner[a])
    if n_big >= 2 and n - covered <= limit:
        best_ratio = math.inf
        consider(n_big, len(ew), math.inf)
    # the most groups first, the better separated on a tie (the earlier cut on a tie of both)
    for _, _, edges in sorted(found, key=lambda c: (-c[0], -c[1], c[2])):
        labels = _cut_tree(n, ei, ej, edges, min_size)
        if accept is None or accept(labels):
            return labels, best_ratio
    return None, best_ratio


def density_groups(index: np.ndarray, dist: np.ndarray, min_gap: float = SEPARATED_MIN_GAP,
                   min_size: int = SEPARATED_MIN_SIZE,
                   max_outliers: float = SEPARATED_MAX_OUTLIERS, demote: bool = True,
                   refined=None):
    """The clusters of a kNN graph's single-linkage tree that scikit-learn's HDBSCAN selects
    (excess of mass, ``min_cluster_size=min_size``, ``min_samples=1``), if each is separated by
    its own gap.

    Where :func:`separated_groups` asks one gap of all groups at one cut of the tree, groups
    whose spreads differ (a few copies of each of many shapes, one shape's copies further apart
    than another's) are cut at different heights here. A group is separated when its shortest
    edge to any other image is at least ``min_gap`` times the longest edge of its own minimum
    spanning tree (the group's own single-linkage Dunn index). With ``demote``, a group that is
    not separated is not a group: its images, with HDBSCAN's noise, join the group they meet
    first along the tree, while they are at most ``max_outliers`` of the nodes (or
    ``min_size`` nodes, where that is more). Returns
    ``(labels, separation)``, ``separation`` the smallest ratio of the groups kept, or
    ``(None, smallest ratio)`` when fewer than two groups remain. ``refined``: the same graph
    with other distances (symmetric sparse, as :func:`_symmetric_distances` gives), on which
    each group must be separated by ``min_gap`` too.
    """
    from sklearn.cluster import HDBSCAN

    n = index.shape[0]
    min_size = max(2, min(int(min_size), n // 2))
    if n < 2 * min_size or index.shape[1] == 0:
        return None, 1.0
    S = _symmetric_distances(index, dist)
    n_comp, comp = connected_components(S, directed=False)
    G = S
    if n_comp > 1:
        # HDBSCAN wants one connected graph: the components joined in a chain by edges far
        # longer than any edge of the graph, which only ever separate whole components
        first = np.unique(comp, return_index=True)[1]
        far = float(S.data.max()) * 100.0 if S.nnz else 1.0
        chain = coo_matrix((np.full(2 * (n_comp - 1), far),
                            (np.r_[first[:-1], first[1:]], np.r_[first[1:], first[:-1]])),
                           shape=(n, n))
        G = (S + chain).tocsr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        labels = HDBSCAN(min_cluster_size=min_size, min_samples=1, metric="precomputed",
                         copy=True).fit_predict(G)
    limit = _outlier_limit(n, max_outliers, min_size)
    if labels.max() < 1 or (labels < 0).sum() > limit:
        return None, 1.0
    ratio = _group_ratios(S, labels)
    keep = ratio >= min_gap
    if refined is not None:
        keep &= _group_ratios(refined, labels) >= min_gap
    if not keep.all():
        if not demote:
            return None, float(ratio.min())
        labels = np.where(keep[labels] & (labels >= 0), labels, -1)
        if keep.sum() < 2 or (labels < 0).sum() > limit:
            return None, float(ratio.min())
    ei, ej, _ = _tree_edges(S)
    return _join_first_met(labels, ei, ej), float(ratio[keep].min())


def _group_ratios(S, labels: np.ndarray) -> np.ndarray:
    """Each group's (``labels >= 0``; -1 is no group) shortest edge to an image outside it
    over the longest edge of its own minimum spanning tree, on the symmetric sparse graph
    ``S`` (infinite inner edge for a group its own edges do not connect)."""
    from scipy.sparse.csgraph import minimum_spanning_tree

    n_groups = int(labels.max()) + 1
    S = S.tocoo()
    lab = np.where(labels >= 0, labels, n_groups + np.arange(labels.size))
    same = lab[S.row] == lab[S.col]
    outer = np.full(n_groups, np.inf)
    for a in (S.row, S.col):
        m = ~same & (labels[a] >= 0)
        np.minimum.at(outer, labels[a][m], S.data[m])
    inside = coo_matrix((S.data[same], (S.row[same], S.col[same])), shape=S.shape)
    T = minimum_spanning_tree(inside).tocoo()
    inner = np.zeros(n_groups)
    m = labels[T.row] >= 0
    np.maximum.at(inner, labels[T.row][m], T.data[m])
    # a group in several pieces of its own edges is not held together
    pieces = connected_components(inside, directed=False)[1]
    grouped = labels >= 0
    n_pieces = np.zeros(n_groups)
    np.add.at(n_pieces, np.unique(np.c_[labels[grouped], pieces[grouped]], axis=0)[:, 0], 1)
    inner[n_pieces > 1] = np.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inner > 0, outer / inner, np.inf)


def _join_first_met(labels: np.ndarray, ei, ej) -> np.ndarray:
    """``labels`` with every node of no group (-1) in the group it meets first along the
    tree edges ``(ei, ej)`` (shortest first); nodes that meet none form groups of their own.
    Returned as consecutive labels. The nodes are images, or the parts of a cut of the tree
    (:func:`_cut_tree`)."""
    n = labels.size
    parent = np.arange(n)
    group = np.asarray(labels, dtype=np.int64).copy()
    for i, j in zip(ei.tolist(), ej.tolist()):
        a, b = _find(parent, i), _find(parent, j)
        if a == b or (group[a] >= 0 and group[b] >= 0):
            continue
        parent[b] = a
        group[a] = group[a] if group[a] >= 0 else group[b]
    roots = np.array([_find(parent, i) for i in range(n)])
    out = np.where(group[roots] >= 0, group[roots], int(labels.max()) + 1 + roots)
    return np.unique(out, return_inverse=True)[1].astype(np.int64)


def _find(parent, a: int) -> int:
    """The root of ``a`` in the union-find forest ``parent`` (a list or an array), the path to
    it compressed."""
    root = a
    while parent[root] != root:
        root = parent[root]
    while parent[a] != root:
        parent[a], a = root, parent[a]
    return root


def _cut_tree(n, ei, ej, n_edges, min_size):
    """Labels of the parts of at least ``min_size`` nodes joined by the tree's first
    ``n_edges`` edges; a smaller part joins the first of them it meets along the later
    edges (single linkage), and stays alone if it meets none."""
    parts = connected_components(
        coo_matrix((np.ones(n_edges), (ei[:n_edges], ej[:n_edges])), shape=(n, n)),
        directed=False)[1]
    sizes = np.bincount(parts)
    group = np.where(sizes >= min_size, np.arange(sizes.size), -1)
    return _join_first_met(group, parts[ei[n_edges:]], parts[ej[n_edges:]])[parts]


def _cut_separated_on(index, dist, labels, separation, min_gap, S):
    """The single cut ``(labels, separation)`` of :func:`separated_groups` on ``(index,
    dist)`` where each of its groups is also separated by ``min_gap`` on ``S`` (the same
    edges with other distances, symmetric sparse), else the finest cut of ``(index, dist)``
    whose groups are separated on both: ``(None, ...)`` where there is none."""
    def accept(candidate):
        return bool(_group_ratios(S, candidate).min() >= min_gap)

    if labels is None or accept(labels):
        return labels, separation
    return separated_groups(index, dist, min_gap=min_gap, accept=accept)


def _separated_on_refined(index, dist, labels, separation, min_gap, refined):
    """The single cut ``(labels, separation)`` of :func:`separated_groups` on ``(index,
    dist)``, tested on the same edges' refined distances (``refined()``, as ``dist``; None: no
    test) by :func:`_cut_separated_on`; where no cut is separated on both, ``(labels,
    separation)`` as given (the refined distances tell no split of the grid from another)."""
    if refined is None or labels is None:
        return labels, separation
    both = _cut_separated_on(index, dist, labels, separation, min_gap,
                             _symmetric_distances(index, refined()))
    return both if both[0] is not None else (labels, separation)


def finest_separated(index, dist, min_gap: float = SEPARATED_MIN_GAP, refined=None):
    """The finer of the two separated partitions of a kNN graph: one cut of its single-linkage
    tree (:func:`separated_groups`, one gap for all groups) and HDBSCAN's clusters of the tree,
    each separated by its own gap (:func:`density_groups`). Either may be None; returns
    ``(labels, separation)`` as they do, the cut on a tie.

    ``refined``: None, or a function that returns the distances of the same edges
    continuously refined (``(n, k)``, as ``dist``), called only where a partition is
    separated on ``dist``. The partitions are then those whose groups are separated on both
    distances, where there are any. A grid search leaves each pair up to half a grid step
    off: a dozen copies of one shape whose angles fall in two sets half a step apart are two
    groups on the grid's distances, and one on the refined ones, where distinct shapes stay
    apart. Where no partition is separated on the refined distances (noisy shapes that the
    refinement brings as close as two noisy copies of one), they tell no split of the grid
    from another, and the grid's partitions stand.
    """
    labels, separation = separated_groups(index, dist, min_gap=min_gap)
    labels_d, separation_d = density_groups(index, dist, min_gap=min_gap)
    if refined is not None and (labels is not None or labels_d is not None):
        S = _symmetric_distances(index, refined())
        both = _cut_separated_on(index, dist, labels, separation, min_gap, S)
        both_d = (labels_d, separation_d)
        # the refined test only demotes groups: where HDBSCAN's clusters gave no partition on
        # the grid's distances, they give none on both
        if labels_d is not None:
            both_d = density_groups(index, dist, min_gap=min_gap, refined=S)
        if both[0] is not None or both_d[0] is not None:
            (labels, separation), (labels_d, separation_d) = both, both_d
    if labels_d is not None and (labels is None or labels_d.max() > labels.max()):
        return labels_d, separation_d
    if labels is None:
        return None, max(separation, separation_d)
    return labels, separation


# The median ratio of each sample's nearest to second-nearest refined kNN distance from which
# the distances are dominated by noise. There a group has no separated sub-groups of its own,
# and the finest partition whose groups are each separated by their own gap on the refined
# distances is the shapes (:func:`noise_dominated_groups`); and only there do the converged
# means count (:func:`count_groups`), which elsewhere would split a shape into its modes
# (measured: docs/design/count.rst).
NOISE_DOMINATED_MIN_RATIO = 0.85


def noise_dominated(dist: np.ndarray) -> bool:
    """Whether a kNN graph's distances ``(n, k)`` (k >= 2, rows in any order: refined distances
    are not in the grid's order) are dominated by noise: the median ratio of each sample's
    nearest to its second-nearest distance is at least ``NOISE_DOMINATED_MIN_RATIO``."""
    dist = np.asarray(dist, dtype=np.float64)
    if dist.ndim != 2 or dist.shape[1] < 2 or dist.shape[0] == 0:
        return False
    dist = np.sort(dist, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(dist[:, 1] > 0, dist[:, 0] / dist[:, 1], 1.0)
    ratio = ratio[np.isfinite(ratio)]
    return bool(ratio.size) and float(np.median(ratio)) >= NOISE_DOMINATED_MIN_RATIO


def finest_own_gap_groups(index: np.ndarray, dist: np.ndarray,
                          min_gap: float = SEPARATED_MIN_GAP,
                          min_size: int = SEPARATED_MIN_SIZE,
                          max_outliers: float = SEPARATED_MAX_OUTLIERS):
    """The partition of a kNN graph into the most clusters of its single-linkage tree that are
    each separated by their own gap, if it has one.

    A cluster of the tree (a set of nodes it joins below some height) is separated when the
    height at which it joins the rest, its shortest edge to any other node, is at least
    ``min_gap`` times its own height, the longest edge of its minimum spanning tree. Among the
    sets of disjoint clusters of at least ``min_size`` nodes that leave at most
    ``max_outliers`` of the nodes (or ``min_size`` nodes, where that is more) outside them,
    the one with the most clusters is found by dynamic programming over the tree (the fewest
    nodes left out on a tie); the nodes left out join the cluster they meet first along the
    tree. Where :func:`density_groups` takes HDBSCAN's excess-of-mass clusters, which prefer
    large ones and join two close shapes, this takes the finest: right where a group has no
    separated sub-groups (distances dominated by noise, :func:`noise_dominated`), not on
    clean copies at nearby angles. Returns ``(labels, separation)`` as
    :func:`separated_groups`, or ``(None, 1.0)`` with fewer than two clusters.
    """
    n = index.shape[0]
    min_size = max(2, min(int(min_size), n // 2))
    if n < 2 * min_size or index.shape[1] == 0:
        return None, 1.0
    ei, ej, ew = _tree_edges(_symmetric_distances(index, dist))
    # the tree's clusters: nodes 0..n-1 the samples, then one per tree edge, in order
    parent = list(range(n))
    top = list(range(n))  # each union-find root's cluster
    size = [1] * n
    height = [0.0] * n
    children = [None] * n
    for i, j, w in zip(ei.tolist(), ej.tolist(), ew.tolist()):
        a, b = _find(parent, i), _find(parent, j)
        children.append((top[a], top[b]))
        size.append(size[top[a]] + size[top[b]])
        height.append(w)
        parent[b] = a
        top[a] = len(size) - 1
    joins = [math.inf] * len(size)
    for v in range(n, len(size)):
        for c in children[v]:
            joins[c] = height[v]
    limit = int(_outlier_limit(n, max_outliers, min_size))  # at least min_size, so >= 2
    none = -1  # no selection leaves that many nodes out
    # best[v][u]: the most clusters within v's subtree with u of its nodes left out; a sample
    # alone (smaller than min_size) is one node left out
    best = [None] * len(size)
    chosen = [False] * len(size)
    for v in range(len(size)):
        chosen[v] = size[v] >= min_size and joins[v] >= min_gap * height[v]
        if v < n:
            front = np.array([none, 0], dtype=np.int64)
        else:
            front = _combine_fronts(*(best[c] for c in children[v]), limit, none)
        if chosen[v]:
            front[0] = max(front[0], 1)
        best[v] = front
    roots = sorted({top[_find(parent, i)] for i in range(n)})
    # the roots (parts of the graph not connected at all) are combined as one more tree level
    total = np.zeros(1, dtype=np.int64)
    prefix = [total]
    for r in roots:
        total = _combine_fronts(total, best[r], limit, none)
        prefix.append(total)
    if total.max() < 2:
        return None, 1.0
    u = int(np.flatnonzero(total == total.max())[0])
    labels = np.full(n, -1, dtype=np.int64)
    stack = []
    for pos in range(len(roots) - 1, -1, -1):
        before = _split_front(prefix[pos], best[roots[pos]], u, int(prefix[pos + 1][u]), none)
        stack.append((roots[pos], u - before))
        u = before
    n_groups, separation = 0, math.inf
    while stack:
        v, u = stack.pop()
        want = int(best[v][u])
        if chosen[v] and u == 0 and want == 1:
            labels[_tree_leaves(v, children, n)] = n_groups
            n_groups += 1
            # the cluster's shortest edge out over its longest edge in
            separation = min(separation, joins[v] / height[v])
            continue
        if v < n:
            continue  # a node left out
        a, b = children[v]
        ua = _split_front(best[a], best[b], u, want, none)
        stack += [(a, ua), (b, u - ua)]
    return _join_first_met(labels, ei, ej), float(separation)


def _combine_fronts(a: np.ndarray, b: np.ndarray, limit: int, none: int) -> np.ndarray:
    """The front of two disjoint subtrees: for each number ``u <= limit`` of nodes left out,
    the most clusters (``none`` where impossible), a max-plus convolution looped over the
    shorter front."""
    if a.size < b.size:
        a, b = b, a
    out = np.full(min(a.size + b.size - 1, limit + 1), none, dtype=np.int64)
    ia = np.flatnonzero(a != none)
    for ub in np.flatnonzero(b != none).tolist():
        u = ia + ub
        keep = u <= limit
        np.maximum.at(out, u[keep], a[ia[keep]] + b[ub])
    return out


def _split_front(a: np.ndarray, b: np.ndarray, u: int, want: int, none: int) -> int:
    """How many of ``u`` nodes left out fall in the first of two subtrees (fronts ``a``,
    ``b``) in a selection of ``want`` clusters: the fewest."""
    for ua in range(min(u, a.size - 1) + 1):
        ub = u - ua
        if ub < b.size and a[ua] != none and b[ub] != none and a[ua] + b[ub] == want:
            return ua
    raise AssertionError("no split of the front")  # the fronts were built from these


def _tree_leaves(v: int, children, n: int) -> list:
    """The samples (nodes below ``n``) of the tree's cluster ``v``."""
    out, stack = [], [v]
    while stack:
        x = stack.pop()
        if x < n:
            out.append(x)
        else:
            stack.extend(children[x])
    return out


def noise_dominated_groups(index: np.ndarray, refined: np.ndarray,
                           min_gap: float = SEPARATED_MIN_GAP, separated=None):
    """The finest of the separated partitions on the refined distances ``(n, k)`` of the kNN
    edges alone: the single cut, HDBSCAN's clusters and the finest clusters each separated by
    its own gap (:func:`finest_own_gap_groups`); ``(None, 1.0)`` where none is. For distances
    dominated by noise (:func:`noise_dominated`, tested by the caller): the grid leaves each
    pair of noisy copies up to half a step off, by its own amount, which blurs the gaps between
    shapes closer than the noise; the refined distances bring each pair to the noise's own
    distance. ``separated``: :func:`finest_separated`'s ``(labels, separation)`` on ``refined``
    at ``min_gap``, where the caller has it already."""
    labels, separation = (finest_separated(index, refined, min_gap=min_gap)
                          if separated is None else separated)
    labels_t, separation_t = finest_own_gap_groups(index, refined, min_gap=min_gap)
    if labels_t is not None and (labels is None or labels_t.max() > labels.max()):
        return labels_t, separation_t
    return labels, separation


# Where the measured noise is material, a separated group can hold two or three shapes that
# are closer to each other than two noisy copies of one shape (their copies chain together in
# the single-linkage tree), and modularity's communities of a set with no separated partition
# can hold them too. Each such shape adds one small eigenvalue to the normalised Laplacian of
# the graph: the count is raised to the number of eigenvalues below the largest gap among the
# first EIGENGAP_EIGENVALUES when that is at most EIGENGAP_MAX_EXTRA above the count found (a
# larger jump is the poses within big groups of copies, not shapes; on noisy natural classes
# the gap falls below modularity's count or far above it: docs/benchmarks.rst, "How many
# clusters").
EIGENGAP_EIGENVALUES = 40
EIGENGAP_MAX_EXTRA = 3
# ... and only where that gap is a gap (the normalised Laplacian's eigenvalues lie in [0, 2];
# measured: docs/design/count.rst)
EIGENGAP_MIN_GAP = 0.1
# up to this many nodes the eigenvalues come from a dense symmetric solver (deterministic);
# above it, from ARPACK on the sparse graph with a fixed start vector
EIGENGAP_DENSE_MAX = 2000


def eigengap_count(graph, max_eigenvalues: int = EIGENGAP_EIGENVALUES,
                   min_gap: float = EIGENGAP_MIN_GAP):
    """The number of eigenvalues of the normalised Laplacian of the symmetric weighted graph
    ``graph`` (sparse ``(n, n)``) below the largest gap between consecutive ones, among the
    smallest ``m + 1``, ``m = min(max_eigenvalues, n // SEPARATED_MIN_SIZE)`` (at least 2; the
    gap above the first eigenvalue, 0, is not counted). None where that gap is under
    ``min_gap`` (a spectrum with no gap), for graphs too small to have 3 groups, or with more
    than ``m`` connected parts (the ``m + 1`` smallest are all 0)."""
    from scipy.sparse import csr_matrix

    n = graph.shape[0]
    m = min(int(max_eigenvalues), n // SEPARATED_MIN_SIZE)
    if m < 3:
        return None
    A = csr_matrix(graph, dtype=np.float64)
    A = (A + A.T) * 0.5
    n_parts, part = connected_components(A, directed=False)
    if n_parts > m:
        return None
    if n <= EIGENGAP_DENSE_MAX:
        values = _smallest_laplacian_eigenvalues(A, m + 1)
    else:
        # the spectrum is the union of the connected parts' spectra: each part on its own,
        # so that the repeated eigenvalue 0 of several parts is not lost to the sparse solver
        order = np.argsort(part, kind="stable")
        bounds = np.r_[0, np.cumsum(np.bincount(part))]
        values = np.sort(np.concatenate([
            _smallest_laplacian_eigenvalues(A[nodes][:, nodes], m + 1)
            for nodes in (order[a:b] for a, b in zip(bounds[:-1], bounds[1:]))]))[:m + 1]
    gaps = np.diff(values)[1:]
    best = int(np.argmax(gaps))
    return best + 2 if gaps[best] >= min_gap else None


def _smallest_laplacian_eigenvalues(A, count: int) -> np.ndarray:
    """The ``count`` smallest eigenvalues (fewer for a smaller graph) of the normalised
    Laplacian of the CONNECTED symmetric sparse graph ``A``, ascending: dense up to
    ``EIGENGAP_DENSE_MAX`` nodes, else ARPACK (the largest of ``D^-1/2 A D^-1/2``, one minus
    them) with a fixed start vector."""
    from scipy.sparse import diags
    from scipy.sparse.csgraph import laplacian

    n = A.shape[0]
    if n <= EIGENGAP_DENSE_MAX:
        return np.linalg.eigvalsh(laplacian(A.toarray(), normed=True))[:count]
    from scipy.sparse.linalg import eigsh

    degree = np.asarray(A.sum(axis=1)).ravel()
    scale = diags(1.0 / np.sqrt(np.maximum(degree, np.finfo(np.float64).tiny)))
    top = eigsh(scale @ A @ scale, k=min(count, n - 1), which="LA",
                v0=np.random.default_rng(0).standard_normal(n), return_eigenvectors=False)
    return np.sort(1.0 - top)


def _eigengap_refined(labels, G, random_state):
    """Where the eigengap count of the grouped graph ``G`` (:func:`eigengap_count`) is one to
    ``EIGENGAP_MAX_EXTRA`` above the number of groups of ``labels`` (a separated partition, or
    modularity's communities), Leiden's partition into that many (as with ``n_clusters``
    given) if each of its parts has at least ``SEPARATED_MIN_SIZE`` nodes; else None."""
    count = eigengap_count(G)
    found = int(labels.max()) + 1
    if count is None or not found < count <= found + EIGENGAP_MAX_EXTRA:
        return None
    finer = leiden(G, count, random_state)
    # a group is at least SEPARATED_MIN_SIZE distinct images, as for the separated partitions
    if int(finer.max()) + 1 != count or np.bincount(finer).min() < SEPARATED_MIN_SIZE:
        return None
    return finer


def count_groups(index, dist, index_means, dist_means, graph, modes, random_state,
                 means_edges=None, refined=None, refined_means=None):
    """``n_clusters=None``: the finer of the separated partitions of the samples' kNN graph
    (gap ``SEPARATED_MIN_GAP``, :func:`finest_separated`) and of the converged means' graph
    (gap ``SEPARATED_MEANS_MIN_GAP``, the single cut alone: HDBSCAN's clusters of the means
    split copies whose means converged in two modes, 6 copies of an 11 x 11 random image, 3 of
    them mirrored, into 2 groups at a ratio of 1.70, and got no more of the 150 copy sets of
    ``bench_count.py`` right); else modularity's communities
    merged along the converged means (:func:`_leiden_count`). Where ``refined`` is given and
    the grid's distances have a separated partition, a finer one of the refined distances
    alone is taken where its groups are separated more widely there (rule
    "separated_refined", :func:`_wider_on_refined`): clean shifted MNIST, 12 shapes x 3-4
    copies and 8 x 3, counted 10, 11 and 7 (``count.json``, runs
    ``draws_seed3`` and ``draws_seed4``).

    The means' graph is the fixed point's own count: where the iteration collapsed each group
    of noisy copies onto one invariant mean, the spread within a group shrinks while the
    distance between groups stays, so the means are separated where the noisy samples are not.
    The iteration contracts every neighbourhood, natural classes' too, so the means must show
    a wider gap. ``means_edges``: ``(index, dist)`` of every edge searched between the means
    (within two hops: the means' graph is then connected wherever the samples' graph is, and
    a mode that collapsed onto more than ``k`` means is not cut off by its kNN lists); the fit
    passes them only where the measured noise is material (``NOISY_FRACTION``): on clean
    copies the samples' graph is already exact, and the means, which the iteration leaves in
    several nearly identical modes per shape, split it (3 shapes x 40 clean copies: 4 or 5).
    None: the samples' graph alone. The means count only where the samples' distances (the
    refined ones, where given) are dominated by noise (:func:`noise_dominated`): clean 8 x 8
    copies, whose interpolation artefacts the filter measures as material noise, are not (2
    shapes x 12 clean copies, one shape's means in two modes: 3 groups at a ratio of 3.23 on
    the means, where the samples' 2 are separated by 2.56). Where ``means_edges`` and
    ``refined`` are given and the refined distances are dominated by noise, the finest
    partition on them alone (:func:`noise_dominated_groups`) is taken when it is finer than
    the samples' separated partition (rule "separated_refined"): 8 and 12 shapes x 3-4 noisy
    copies whose closest shapes are nearer than the noise, counted 6-11 before
    (``count.json``, ``draws_seed*``). ``refined_means``: None, or a function that returns the
    refined distances of ``means_edges`` (as ``refined`` does the samples'): where the means'
    cut is finer than the samples' partition, its groups must be separated on those too
    (:func:`_separated_on_refined`): one shape's means settled in two modes that the grid's
    distances separate and the refined ones do not (noisy MNIST copies, 5 x 40 and 12 x 100,
    counted one too many). Where the samples' graph has a separated partition, the means'
    must refine it: the means may split its groups (shapes the noise chains together), not
    join images across its gaps (5 shapes x 4 noisy copies, one stray mean from each of three
    shapes collapsed together into a sixth group, where the samples' 5 are exact and separated
    by 1.79). The samples' graph decides on a tie. Where the samples' graph has no
    separated partition, the means' partition is taken only if it has at least as many groups as
    modularity's: the means' graph of natural classes can split off one class from a continuum
    of the others (1,797 8 x 8 digits at +-45 degrees, seed 1: 2 groups at a gap of 1.54, where
    modularity gives 14), a count the fixed points do not support; on the noisy copy sets whose
    count the means get right, modularity gives as many groups or fewer
    (``benchmarks/results/count.json``). Where the noise is material
    (``means_edges`` given), the partition (separated, or modularity's) is refined by the
    graph's eigengap (:func:`_eigengap_refined`): shapes closer to each other than two noisy
    copies of one chain together in the tree and in the means, and modularity merges them.
    Returns ``(labels, rule, separation)``: ``rule`` "separated" (the samples' graph),
    "separated_refined", "separated_means", "eigengap" or "modularity"; ``separation`` the
    separated partition's gap ratio, or where none is separated the largest ratio seen on the
    samples' graph.
    """
    # built once, where needed: modularity and the eigengap read the same graph
    grouped_graph = functools.cache(
        lambda: _union_graph(index, dist, index_means, dist_means, graph, random_state))

    def modularity():
        return _leiden_count(index, dist, index_means, dist_means, graph, modes, random_state,
                             G=grouped_graph())

    if refined is not None:
        refined = functools.cache(refined)  # computed once, where first needed
        # the separated partitions of the refined distances alone, read by two rules below
        alone = functools.cache(lambda: finest_separated(index, refined()))
    labels, separation = finest_separated(index, dist, refined=refined)
    rule = "separated"
    if refined is not None and labels is not None:
        labels_w, separation_w = _wider_on_refined(index, labels, refined(), alone())
        if labels_w is not None:
            labels, separation, rule = labels_w, separation_w, "separated_refined"
    # where the noise is material (means_edges given), whether it dominates the samples'
    # distances (the refined ones where there are any): only there do the refined distances
    # alone and the converged means count, where the noise hides groups the iteration
    # averaged out
    dominated = means_edges is not None and noise_dominated(
        dist if refined is None else refined())
    if dominated and refined is not None:
        labels_r, separation_r = noise_dominated_groups(index, refined(), separated=alone())
        if labels_r is not None and (labels is None or labels_r.max() > labels.max()):
            labels, separation, rule = labels_r, separation_r, "separated_refined"
    if dominated and means_edges[0].shape[1] > 0:
        labels_m, separation_m = separated_groups(*means_edges,
                                                  min_gap=SEPARATED_MEANS_MIN_GAP)
        if labels_m is not None and (labels is None or labels_m.max() > labels.max()):
            labels_m, separation_m = _separated_on_refined(
                means_edges[0], means_edges[1], labels_m, separation_m,
                SEPARATED_MEANS_MIN_GAP, refined_means)
        if labels_m is not None and labels is not None and not _refines(labels_m, labels):
            # the means may split the samples' separated groups, not join images across the
            # gaps that separate them
            labels_m = None
        if labels_m is not None and (labels is None or labels_m.max() > labels.max()):
            # never fewer groups than modularity would give
            coarse = modularity() if labels is None else None
            if coarse is not None and coarse.max() > labels_m.max():
                labels, rule = coarse, "modularity"
            else:
                labels, separation, rule = labels_m, separation_m, "separated_means"
    if labels is None:
        labels, rule = modularity(), "modularity"
    if means_edges is not None:
        finer = _eigengap_refined(labels, grouped_graph(), random_state)
        if finer is not None:
            return finer, "eigengap", separation
    return labels, rule, separation


def _wider_on_refined(index, labels, refined, alone=None):
    """The finest separated partition of the refined distances ``refined`` alone
    (:func:`finest_separated`), where it has more groups than ``labels`` (the grid's separated
    partition) and its groups are more widely separated on those distances than the groups of
    ``labels`` are (and by at least ``SEPARATED_MIN_GAP``): ``(labels, separation)``, else
    ``(None, None)``.

    Both partitions are judged on the same, more exact distances, by the same single-linkage
    Dunn index (each group's shortest edge out over its longest edge in, the smallest over the
    groups). A grid that leaves a pair of copies half a step off can chain two shapes together
    (clean shifted MNIST, 12 shapes x 3 copies: 10 groups, the joined shapes separated by 3.7
    or more on the refined distances); where the refined distances split a shape into the runs
    of angles its interpolation artefacts set apart (clean copies of 12 or more a shape),
    those runs are closer than the grid's groups are to each other. ``alone``:
    :func:`finest_separated`'s ``(labels, separation)`` on ``refined``, where the caller has it
    already."""
    finer, separation = finest_separated(index, refined) if alone is None else alone
    if finer is None or finer.max() <= labels.max():
        return None, None
    S = _symmetric_distances(index, refined)
    wider = float(_group_ratios(S, finer).min())
    if wider >= SEPARATED_MIN_GAP and wider > float(_group_ratios(S, labels).min()):
        return finer, separation
    return None, None


def _leiden_count(index, dist, index_means, dist_means, graph, modes, random_state, G=None):
    """``n_clusters=None`` with Leiden: resolution 1 on the graph, merged along the means'
    own communities (see :func:`merge_by_modes`); then, as with ``n_clusters`` given, a
    community under ``_MIN_PART_FRACTION`` of the typical community size is not a cluster and
    joins the community it is most strongly joined to (:func:`_absorb_tiny_communities`).
    ``G``: the grouped graph (:func:`_union_graph`) if it is already built."""
    merge = not (modes is None or index_means is None or index_means.shape[1] == 0)
    Gm = (_means_graph(index_means, dist_means, random_state)
          if merge and graph != "samples" else None)
    if G is None:
        G = _union_graph(index, dist, index_means, dist_means, graph, random_state, means=Gm)
    labels = leiden(G, None, random_state)
    # the meet of the modes and the means' communities is finer than the modes: where the
    # modes alone merge nothing, neither does the meet, and the means' Leiden is not run
    if merge and _could_merge(labels, modes):
        # on the means' graph alone the communities are those labels already
        if graph == "means":
            coarse = labels
        else:
            coarse = leiden(_means_graph(index_means, dist_means, random_state)
                            if Gm is None else Gm, None, random_state)
        # the means' modes AND their graph's communities must both join two communities
        both = np.unique(np.c_[np.asarray(modes), coarse], axis=0, return_inverse=True)[1]
        labels = merge_by_modes(labels, both.ravel())
    return _absorb_tiny_communities(labels, G)


def _could_merge(labels: np.ndarray, modes) -> bool:
    """Whether :func:`merge_by_modes` could merge ``labels`` along a partition at least as fine
    as ``modes``: a single mode (the finer partition may have several), or a strict
    coarsening."""
    return int(np.unique(np.asarray(modes)).size) < 2 or _strict_coarsening(labels, modes)


def _absorb_tiny_communities(labels: np.ndarray, graph) -> np.ndarray:
    """``labels`` with the communities under ``_MIN_PART_FRACTION`` of the size of a node's
    community, on average over the nodes (``sum(size^2) / n``: the tiny communities
    themselves do not lower it), absorbed (:func:`_absorb_small_parts`)."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0 or labels.max() < 1:
        return labels
    sizes = np.bincount(labels).astype(np.float64)
    typical = float((sizes ** 2).sum()) / labels.size
    return _absorb_small_parts(labels, graph, max(1, math.ceil(_MIN_PART_FRACTION * typical)))


def vote(labels_fit: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Majority label among each query's fitted neighbours ``index`` ``(m, k)`` (ties: the
    label of the nearer neighbour)."""
    m, k = index.shape
    n_labels = int(labels_fit.max()) + 1
    counts = np.zeros((m, n_labels))
    # a tiny bonus by rank breaks ties in favour of the nearest neighbours
    np.add.at(counts, (np.repeat(np.arange(m), k), labels_fit[index].ravel()),
              np.tile(1.0 + 1e-3 * (k - np.arange(k)) / k, m))
    return counts.argmax(1).astype(np.int64)
