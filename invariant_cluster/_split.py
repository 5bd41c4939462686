"""A count given above the shapes found: the shapes split where their images hold them least.

With ``n_clusters`` given, the clusters are groups of shapes, so a fit whose shapes are fewer
than the count cannot reach it: two images that are no copies of each other were joined into
one shape (8 x 8 digits nearer each other than the noise the estimate reads in them). The
count says so, and :func:`split_to_count` undoes the joins the images hold least, the lowest
normalized cut of a shape's own graph over all shapes first, until the shapes are as many as
the count. The measurements: ``docs/design/shapes.rst`` ("A count above the shapes").
"""

from __future__ import annotations

import heapq

import numpy as np
import scipy.linalg
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from . import _memory
from ._duplicates import first_of_each
from ._shapes import align, pair_distances

# a shape's graph of at most this many images is split by a dense eigendecomposition (m^2
# floats), a larger one by the sparse solver (Lanczos)
_DENSE_EIGEN = 256


def split_to_count(X, rep, idx, count, grid, refine_grid, batch_size=None, random_state=0):
    """``rep`` (each image's shape as its first image) once its shapes are split into
    ``count`` where there are fewer. A count given above the shapes found says copies of
    distinct images were joined: the part of a shape its images hold least to the rest is
    split off, the lowest normalized cut over all shapes first, until there are ``count``.
    Each shape's graph is the kNN graph's edges (``idx`` ``(n, k)``, neighbours of the images
    ``X``) within it, all its pairs where it is no larger than a kNN list, at their refined
    squared distance ``d^2`` (``grid``, ``refine_grid``; the lower of the two directions),
    weighted ``exp(-d^2 / median d^2)`` (the median over the edges within every shape); its
    cut the best sweep of its second eigenvector."""
    n = rep.size
    labels = np.unique(rep, return_inverse=True)[1]
    need = count - (int(labels.max()) + 1 if n else 0)
    if need <= 0:
        return rep
    nb = idx.cpu().numpy()
    rows = np.repeat(np.arange(n), nb.shape[1])
    cols = nb.ravel()
    keep = (cols >= 0) & (rows != cols)
    keep[keep] = labels[rows[keep]] == labels[cols[keep]]
    pairs = [np.stack([rows[keep], cols[keep]], 1)]
    # the images of each shape
    shapes = np.split(np.argsort(labels, kind="stable"), np.cumsum(np.bincount(labels))[:-1])
    # a shape no larger than a kNN list could hold: all its pairs
    for members in shapes:
        if 2 < members.size <= nb.shape[1] + 1:
            a, b = np.triu_indices(members.size, 1)
            pairs.append(np.stack([members[a], members[b]], 1))
    pairs = np.unique(np.sort(np.concatenate(pairs), axis=1), axis=0)
    w = np.empty(len(pairs))
    starts, step = _memory.pair_blocks(len(pairs), X[0].numel())
    for s0 in starts:
        a = torch.as_tensor(pairs[s0:s0 + step, 0], device=X.device)
        b = torch.as_tensor(pairs[s0:s0 + step, 1], device=X.device)
        # the lower of the two directions: a turn crops each image's corners differently
        d2 = [pair_distances(X, q, k, align(X[q], X[k], grid, refine_grid, batch_size))
              for q, k in ((a, b), (b, a))]
        w[s0:s0 + len(a)] = torch.minimum(*d2).clamp(min=0).cpu().numpy()
    # one above the squared distance: an edge of distance 0 (an exact copy) is no stored zero
    graph = coo_matrix((w + 1.0, (pairs[:, 0], pairs[:, 1])), shape=(n, n)).tocsr()
    graph = graph.maximum(graph.T).tocsr()
    # one scale for every shape: the median squared distance of two images within a shape
    scale = max(float(np.median(w)) if w.size else 1.0, 1e-12)
    rng = np.random.default_rng(random_state)
    heap = []

    def push(members):
        if members.size > 1:
            cut, side = _best_cut(graph[members][:, members], scale, rng)
            heapq.heappush(heap, (cut, int(members[0]), members, side))

    for members in shapes:
        push(members)
    piece = labels.copy()
    top = int(piece.max()) + 1
    while need > 0 and heap:
        _, _, members, side = heapq.heappop(heap)
        piece[members[side]] = top
        top += 1
        need -= 1
        if need > 0:
            push(members[side])
            push(members[~side])
    piece = np.unique(piece, return_inverse=True)[1]
    return first_of_each(piece)[piece]


def _best_cut(G, scale, rng):
    """``(ncut, side)``: the lowest normalized cut of the graph ``G`` (one above the squared
    distances, CSR, symmetric; weights ``exp(-d^2 / scale)``) among the sweeps of its second
    eigenvector, and the side split off (a part no edge joins to the rest, at cut 0, first;
    ``rng`` starts the sparse eigensolver of a large graph)."""
    m = G.shape[0]
    n_parts, part = connected_components(G, directed=False)
    if n_parts > 1:
        return 0.0, part == part[m - 1]
    # a long edge is a weak edge, never none: its weight stays above 0
    W = G.copy()
    W.data = np.maximum(np.exp(-(W.data - 1.0) / scale), np.finfo(np.float64).tiny)
    deg = np.asarray(W.sum(1)).ravel()
    root = 1.0 / np.sqrt(deg)
    A = W.multiply(root[:, None]).multiply(root[None, :]).tocsr()
    if m <= _DENSE_EIGEN:
        f = scipy.linalg.eigh(A.toarray(), subset_by_index=[m - 2, m - 2])[1][:, 0]
    else:
        from scipy.sparse.linalg import eigsh

        values, vectors = eigsh(A, k=2, which="LA", v0=rng.standard_normal(m))
        f = vectors[:, np.argmin(values)]
    # the sweep: the cut and the volume of each prefix of the images in the order of the
    # eigenvector (on the random walk's scale); an edge is cut while one end is in the prefix
    order = np.argsort(f * root, kind="stable")
    pos = np.empty(m, dtype=np.int64)
    pos[order] = np.arange(m)
    Wc = W.tocoo()
    a, b = pos[Wc.row], pos[Wc.col]
    upper = a < b
    diff = np.zeros(m + 1)
    np.add.at(diff, a[upper] + 1, Wc.data[upper])
    np.add.at(diff, b[upper] + 1, -Wc.data[upper])
    cut = np.cumsum(diff)[1:m]
    vol = np.cumsum(deg[order])[:m - 1]
    ncut = cut / vol + cut / (float(deg.sum()) - vol)
    t = int(np.argmin(ncut)) + 1
    side = np.zeros(m, dtype=bool)
    side[order[:t]] = True
    return float(ncut[t - 1]), side
