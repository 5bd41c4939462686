"""The approximate shortlist: pynndescent's graph search instead of comparing every pair.

:func:`~invariant_cluster.search.shortlist.shortlist` compares every query descriptor with every
key descriptor (``n_x n_y U V d`` multiply-adds: quadratic in ``n``). Beyond
``_memory.APPROXIMATE_MIN_KEYS`` keys the shortlist instead

1. indexes every key copy with pynndescent (NN-descent, a kNN graph of the copies built in about
   ``O(n^1.1)``), and
2. searches that graph for the ``kq`` nearest key copies of every query copy, on every core,
   with an answer of each query's own (:mod:`._graph_query`: pynndescent's own queries run one
   after another),
3. keeps per key the smallest distance over its copies, then the ``n_candidates`` nearest keys.

Rows for which the graph search found fewer distinct keys than asked fall back to the exact
blocked shortlist, row by row, so the contract of ``shortlist`` holds: ``n_candidates`` distinct
keys per query, nearest first.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from .._heap import release, suspended
from .._progress import progress_bar
from .._third_party import import_cached

__all__ = ["approximate_shortlist"]

# Maintenance note: measured on 10,000 Fashion-MNIST test images (+-15 degrees, 7 angles, +-1 px:
# 9 query copies, 3 key copies) and 10,000 MNIST test digits rotated within +-45 degrees (+-60
# degrees, 24 angles: 9 rotations moved onto the queries, 1 key copy), k = 15, 1,000 queries
# checked against every key: about 4.5 c graph entries per query (kq = 4.5 c / copies) keep the
# recall of the exact descriptor shortlist (Fashion 0.977 with c = 96 and kq = 48, MNIST 0.960
# with c = 64 and kq = 30, equal to the exact shortlist's 0.961); 3 c entries (kq = 30) lost
# 0.01-0.02 on Fashion. The search epsilon is pynndescent's usual value. The index degree is 20
# (pynndescent's usual 30 before): on the 70,000 Fashion-MNIST images (210,000 key copies) the
# index was built in 8.4 s instead of 14.6 s, and the shortlists of 2,000 queries held 0.8996
# of the exact descriptor shortlist's 96 keys instead of 0.9004.
_ENTRIES_PER_CANDIDATE = 4.5
_INDEX_NEIGHBORS = 20
_QUERY_EPSILON = 0.1


# rows short of distinct keys are asked again with this many times the graph entries, twice
_REQUERY_GROWTH = (3, 3)


def _distinct_keys(index, queries, kq, U, V, m, exclude, n_keys, seed=0):
    """The ``m`` nearest distinct keys of each query found by a graph search of ``index`` with
    ``kq`` entries per query copy: ``(keys (n_x, m), rows short of m distinct keys)``."""
    from ._graph_query import distinct_keys, query  # numba: imported after pynndescent

    found, dist = query(index, queries, kq, epsilon=_QUERY_EPSILON, seed=seed,
                        n_threads=torch.get_num_threads())
    out, short = distinct_keys(found, dist, U, V, m, n_keys,
                               None if exclude is None else exclude.numpy())
    return torch.from_numpy(out), torch.from_numpy(short)


def approximate_shortlist(X_desc: torch.Tensor, Y_desc: torch.Tensor, n_candidates, *,
                          exclude=None, random_state=0, batch_size=None) -> torch.Tensor:
    """:func:`~invariant_cluster.search.shortlist.shortlist` by an approximate graph search.

    Parameters
    ----------
    X_desc : torch.Tensor of shape (n_x, d) or (n_x, U, d)
        Query descriptors, ``U`` copies per query.
    Y_desc : torch.Tensor of shape (n_y, d) or (n_y, V, d)
        Key descriptors, ``V`` copies per key; the distance of a pair is the smallest over the
        ``U x V`` pairs of copies (as in ``shortlist``).
    n_candidates : int
        Clipped to ``n_y`` (minus one with ``exclude``).
    exclude : torch.Tensor of shape (n_x,), optional
        A key index to leave out for each query.
    random_state : int, default=0
        Seeds pynndescent's random projection trees.
    batch_size : int, optional
        Queries per block of the exact fallback.

    Returns
    -------
    candidates : torch.Tensor of shape (n_x, n_candidates), long
        Distinct key indices, nearest first (by descriptor distance).
    """
    from .shortlist import check_descriptors, shortlist

    Xd, Yd, m = check_descriptors(X_desc, Y_desc, n_candidates, exclude)
    n_x, U, d = Xd.shape
    n_y, V = Yd.shape[:2]
    device = Xd.device
    n_index = n_y * V
    # graph entries per query copy: ~4.5 m per query over its U copies (at most 2 m per copy)
    kq = int(max(1, min(n_index - 1, 2 * m, math.ceil(_ENTRIES_PER_CANDIDATE * m / U))))
    pynndescent = import_cached("pynndescent")
    keys = np.ascontiguousarray(Yd.reshape(n_index, d).detach().cpu().numpy(), np.float32)
    queries = np.ascontiguousarray(Xd.reshape(n_x * U, d).detach().cpu().numpy(), np.float32)
    with warnings.catch_warnings(), progress_bar(2, "approximate shortlist", "step") as bar, \
            suspended():  # numba's own allocations: glibc's usual thresholds (see _heap)
        # numba's notes on what it could not cache or parallelise are not the user's business
        warnings.simplefilter("ignore")
        bar.set_postfix_str(f"indexing {n_index} key copies")
        index = pynndescent.NNDescent(keys, n_neighbors=min(_INDEX_NEIGHBORS, n_index - 1),
                                      random_state=random_state,
                                      n_jobs=torch.get_num_threads(), low_memory=True)
        bar.update()
        bar.set_postfix_str(f"querying {n_x * U} query copies")
        ex = None if exclude is None else exclude.cpu()
        out, short = _distinct_keys(index, queries, kq, U, V, m, ex, n_y, random_state)
        # rows whose copies found the same keys again and again: asked again, with more
        # entries per copy (on 20,000 Fashion-MNIST images, 1,950 rows, which the exact
        # fallback below took 5.6 s to serve; 21 s at 70,000)
        for grow in _REQUERY_GROWTH:
            if not short.numel() or kq >= n_index - 1:
                break
            kq = int(min(n_index - 1, kq * grow))
            rows = queries.reshape(n_x, U, d)[short.numpy()].reshape(-1, d)
            again, still = _distinct_keys(index, rows, kq, U, V, m,
                                          None if ex is None else ex[short], n_y,
                                          random_state)
            out[short] = again
            short = short[still]
        bar.update()
    del index
    release()
    if short.numel():  # the graph search came back with too few distinct keys: search exactly
        ex = None if exclude is None else exclude.to(device)[short.to(device)]
        out[short] = shortlist(Xd[short.to(device)], Yd, m, exclude=ex,
                               batch_size=batch_size).cpu()
    return out.to(device)

