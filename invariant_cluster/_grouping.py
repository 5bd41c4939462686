"""Grouping of converged invariant means: from a sparse invariant kNN graph to cluster labels.

Everything here works on a kNN graph given as ``(index, dist)`` arrays of shape ``(n, k)``
(each row sorted by distance, the sample itself left out): never an ``n x n`` matrix.

- :func:`two_hop_candidates`: the neighbours and the neighbours' neighbours of every sample, the
  shortlist on which the graph of the means is searched again.
- :func:`embed_and_cluster` (from :mod:`invariant_cluster._embedding`): umap-learn's layout
  of the graph, a 10-D embedding and k-means in it, or HDBSCAN when the number of clusters is
  not given (``grouping="umap"``).
- :func:`fuzzy_graph`, :func:`leiden`, :func:`group`: Leiden on the fuzzy graph of the shapes'
  kNN graph or of its union with the means' graph (``benchmarks/bench_noise.py``), each shape
  weighing as the samples it stands for (:func:`quotient_graph`); ``n_clusters=None`` by one
  principle: each shape alone where that graph is complete (it shows no community), else
  modularity's communities.
- :func:`vote`: ``predict``'s majority among the nearest fitted samples.

The shapes themselves (the groups of copies, one node each here) are found before, by
:mod:`invariant_cluster._shapes`; the count's measurements are in ``docs/design/count.rst``
and ``benchmarks/results/count.json``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from scipy.sparse import coo_matrix, diags
from scipy.sparse.csgraph import connected_components

from ._embedding import (  # noqa: F401 - the benchmarks and tests import them from here
    SPECTRAL_MAX_PARTS,
    _cluster_embedding,
    _positive,
    embed_and_cluster,
    embed_fuzzy_graph,
    embed_graph,
)
from ._leiden import (  # noqa: F401 - _igraph_graph: the tests build graphs with it
    _graph_edges,
    _igraph_from_edges,
    _igraph_graph,
    _igraph_leiden,
    leiden_runs,
    leiden_worker,
    run_workers,
)
from ._weights import calibrate_bandwidth


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


def leiden(graph, n_clusters, random_state=0, max_steps: int = 40, sizes=None):
    """Leiden (RB configuration model) on a weighted sparse graph (self-loops included), its
    nodes standing for ``sizes`` samples each (None: one).

    ``n_clusters=None``: resolution 1 (modularity), the typical best of ``COUNT_RUNS`` runs
    of igraph's Leiden (:func:`_best_partition`). An int: the resolution is searched (from 1,
    secant steps in log-log; the typical best of igraph's Leiden runs on the whole graph, then
    leidenalg merging the communities of a finer probe) until the partition has
    ``n_clusters`` parts; if none is found, the partition with the closest count not above
    ``n_clusters``. Communities under ``_MIN_PART_FRACTION`` of ``n / n_clusters`` samples
    are not counted and join the counted community they are most strongly joined to.
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

    total = graph.shape[0] if sizes is None else float(np.sum(sizes))
    min_size = max(1.0, _MIN_PART_FRACTION * total / int(n_clusters))
    labels = _search_resolution(run, int(n_clusters), max_steps, min_size, sizes)
    return _absorb_small_parts(labels, graph, min_size, sizes)


def _part_sizes(labels: np.ndarray, sizes=None) -> np.ndarray:
    """The samples in each part of ``labels``, its nodes standing for ``sizes`` each (None:
    one)."""
    return np.bincount(labels, weights=sizes)


def _count_parts(labels: np.ndarray, min_size, sizes=None) -> int:
    """Number of parts of ``labels`` of at least ``min_size`` samples."""
    return int((_part_sizes(labels, sizes) >= min_size).sum())


def _absorb_small_parts(labels: np.ndarray, graph, min_size, sizes=None) -> np.ndarray:
    """``labels`` with every part under ``min_size`` samples (its nodes standing for ``sizes``
    each; None: one) merged into the part of at least ``min_size`` to which the sum of its
    edge weights is largest (repeated while that joins more; a small part joined to none
    stays apart). Labels renumbered from 0."""
    labels = np.asarray(labels, dtype=np.int64)
    if min_size <= 1:
        return labels
    A = graph.tocsr()
    for _ in range(int(labels.max()) + 1):
        big = _part_sizes(labels, sizes) >= min_size
        small_rows = np.flatnonzero(~big[labels])
        if small_rows.size == 0 or not big.any():
            break
        # weight from each small part (rows) to each counted part (columns): a dense array of
        # (small parts x counted parts), never (parts x parts)
        big_parts = np.flatnonzero(big)
        column = np.full(big.size, -1)
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
        target = np.arange(big.size)
        target[parts[joined]] = big_parts[strength[joined].argmax(1)]
        labels = target[labels]
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def _search_resolution(run, n_clusters, max_steps, min_size=1, sizes=None):
    """Secant search for the resolution at which ``run(resolution, finer)`` gives
    ``n_clusters`` parts of at least ``min_size`` samples (nodes of ``sizes``; the count grows
    with the resolution); ``finer`` is the partition of the finest probe with too many parts so
    far (None before there is one). See :func:`leiden`."""
    target = math.log(n_clusters)
    lo_r, hi_r = (math.log(r) for r in _RESOLUTION_RANGE)
    below = above = None  # (log r, log count, partition) of the nearest probes either side
    best, best_count, x, prev = None, 0, 0.0, None
    for _ in range(max_steps):
        # only merging is asked of a finer partition: a probe above its resolution starts over
        finer = above[2] if above is not None and x < above[0] else None
        labels, part = run(math.exp(x), finer)
        c = _count_parts(labels, min_size, sizes)
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
          sizes=None, complete_distances=None):
    """Labels of the shapes from their kNN graph and their converged means' (``(n, k)``
    arrays, self left out), each shape standing for ``sizes`` samples (None: one each).

    ``graph``: "samples", "means", "both" (the union of their fuzzy graphs) or "auto" ("both"
    when the means' graph shares fewer than ``_UNION_BELOW`` of its edges with the samples'
    graph, else "samples"). ``grouping``: "leiden" (resolution searched to give
    ``n_clusters``, spectral clustering where none does) or "umap" (umap-learn's layout, then
    k-means). ``n_clusters=None``, the one count principle: where every shape's neighbourhood
    holds all the others (a complete kNN graph, no more shapes than ``n_neighbors + 1``), the
    graph shows no community and each shape is a cluster (rule "shapes"); else the
    communities of Leiden at resolution 1, modularity (rule "modularity"; HDBSCAN on the
    layout, "hdbscan", with "umap"). ``complete_distances``: a callable giving the
    ``(index, dist)`` of all pairs that a complete graph is cut on to the given count (None:
    ``index, dist``). Returns ``(labels, graph_used, rule)``.
    """
    n = index.shape[0]
    graph = resolve_graph(graph, index, index_means)
    if n <= 1 or index.shape[1] == 0:  # one shape
        return np.zeros(n, dtype=np.int64), graph, "given" if n_clusters else "shapes"
    if n_clusters is not None and n <= n_clusters:
        return np.arange(n), graph, "given"
    if index.shape[1] >= n - 1:
        # a complete graph holds no community: each shape alone, or the given count's
        # single-linkage partition (the groups farthest apart)
        if n_clusters is None:
            return np.arange(n), graph, "shapes"
        if complete_distances is not None:
            index, dist = complete_distances()
        return _single_linkage(index, dist, int(n_clusters)), graph, "given"
    rule = "given" if n_clusters is not None else (
        "modularity" if grouping == "leiden" else "hdbscan")
    if grouping == "umap" and graph != "both":
        idx, dst = (index, dist) if graph == "samples" else (index_means, dist_means)
        return embed_and_cluster(idx, dst, n_clusters, random_state), graph, rule
    G = _union_graph(index, dist, index_means, dist_means, graph, random_state)
    if grouping == "umap":
        emb = embed_fuzzy_graph(G, random_state)
        return _cluster_embedding(emb, n_clusters, random_state), graph, rule
    G = quotient_graph(G, sizes)
    labels = leiden(G, n_clusters, random_state, sizes=sizes)
    if n_clusters is None:
        return _absorb_tiny_communities(labels, G, sizes), graph, rule
    if int(labels.max()) + 1 != n_clusters:
        labels = spectral_labels(G, n_clusters, random_state)
    return labels, graph, rule


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


def _union_graph(index, dist, index_means, dist_means, graph, random_state):
    """The fuzzy graph that ``graph`` names ("samples", "means" or "both"). The means' graph
    takes umap-learn's calibration: the capped one cuts the denoised means into islands."""
    parts = []
    if graph in ("samples", "both"):
        parts.append(fuzzy_graph(index, dist, random_state))
    if graph in ("means", "both"):
        parts.append(fuzzy_graph(index_means, dist_means, random_state, "umap"))
    return parts[0] if len(parts) == 1 else parts[0].maximum(parts[1])


def _single_linkage(index: np.ndarray, dist: np.ndarray, n_groups: int) -> np.ndarray:
    """The ``n_groups`` parts of the kNN graph's minimum spanning tree without its
    ``n_groups - 1`` longest edges (single linkage; ties in the tree's order)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import minimum_spanning_tree

    n, k = index.shape
    rows = np.repeat(np.arange(n), k)
    d = np.asarray(dist, dtype=np.float64).ravel()
    keep = np.isfinite(d) & (rows != index.ravel())
    # distances of 0 would be no edge to scipy: raised to a tiny positive length
    d = np.maximum(d[keep], 1e-12)
    S = csr_matrix((d, (rows[keep], index.ravel()[keep])), shape=(n, n))
    T = minimum_spanning_tree(S.maximum(S.T)).tocoo()
    order = np.argsort(T.data, kind="stable")
    cut = order[len(order) - (n_groups - 1):] if n_groups > 1 else order[:0]
    mask = np.ones(len(order), dtype=bool)
    mask[cut] = False
    _, labels = connected_components(
        coo_matrix((np.ones(mask.sum()), (T.row[mask], T.col[mask])), shape=(n, n)),
        directed=False)
    return labels.astype(np.int64)


def _absorb_tiny_communities(labels: np.ndarray, graph, sizes=None) -> np.ndarray:
    """``labels`` with the communities under ``_MIN_PART_FRACTION`` of the size of a sample's
    community, on average over the samples (``sum(size^2) / n``, sizes in samples, a node
    standing for ``sizes`` each: the tiny communities themselves do not lower it), absorbed
    (:func:`_absorb_small_parts`)."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0 or labels.max() < 1:
        return labels
    part = _part_sizes(labels, sizes)
    typical = float((part ** 2).sum()) / float(part.sum())
    return _absorb_small_parts(labels, graph, max(1.0, _MIN_PART_FRACTION * typical), sizes)


def quotient_graph(graph, sizes=None):
    """The shapes' fuzzy ``graph`` with each shape weighing as the ``sizes`` samples it stands
    for (None: one each, ``graph`` itself): the edges between shapes are unchanged, and a shape
    of ``s`` samples, ``s / median(sizes)`` median nodes, gets a self-loop that adds the
    median strength for each node beyond the first, as its copies would have brought into
    modularity's null model. Storing every sample twice leaves this graph unchanged."""
    if sizes is None:
        return graph
    s = np.asarray(sizes, dtype=np.float64)
    extra = np.maximum(s / np.median(s) - 1.0, 0.0)
    if not extra.any():
        return graph
    strength = np.asarray(graph.sum(1)).ravel()
    # a loop's weight counts twice in its node's strength
    loops = 0.5 * extra * float(np.median(strength))
    return (graph + diags(loops, format="csr")).tocsr()


def vote(labels_fit: np.ndarray, index: np.ndarray, weights=None) -> np.ndarray:
    """Majority label among each query's fitted neighbours ``index`` ``(m, k)``, each counted
    ``weights`` times (None: once; ties: the label of the nearer neighbour)."""
    m, k = index.shape
    n_labels = int(labels_fit.max()) + 1
    counts = np.zeros((m, n_labels))
    # a tiny bonus by rank breaks ties in favour of the nearest neighbours
    votes = np.tile(1.0 + 1e-3 * (k - np.arange(k)) / k, m)
    if weights is not None:
        votes = votes * np.asarray(weights, dtype=np.float64)[index.ravel()]
    np.add.at(counts, (np.repeat(np.arange(m), k), labels_fit[index].ravel()), votes)
    return counts.argmax(1).astype(np.int64)
