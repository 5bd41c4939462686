"""The one dispatcher of the estimators' kNN searches: ``exact | shortlist | auto``."""

from __future__ import annotations

from .. import _memory
from .._heap import reusing_heap
from .grid import SearchGrid
from .kernel import blocked_grid_search, grid_search
from .shortlist import neighbor_search

__all__ = ["knn_search"]


@reusing_heap
def knn_search(Q, K, grid: SearchGrid, k, *, method="auto", n_candidates=None,
               batch_size=None, exclude=None, client=None, hops=None):
    """The ``k`` nearest keys of every query on the grid: ``(dist^2, index, params)``.

    ``method``: "exact" (:func:`~invariant_cluster.search.kernel.grid_search`, or its Dask
    twin :func:`~invariant_cluster.search.kernel.blocked_grid_search` with ``client``),
    "shortlist" (:func:`~invariant_cluster.search.shortlist.neighbor_search`, ``n_candidates``
    None: :func:`~invariant_cluster._memory.default_n_candidates`) or "auto" (exact while
    ``n_keys x grid.size <= _memory.AUTO_EXACT_WORK``). ``hops``: the shortlist's pass over the
    neighbours' neighbours (see :func:`~invariant_cluster.search.shortlist.neighbor_search`).
    """
    if _memory.use_exact_search(method, K.shape[0], grid.size):
        if client is None:
            return grid_search(Q, K, grid, k=k, batch_size=batch_size, exclude=exclude)
        return blocked_grid_search(Q, K, grid, k=k, batch_size=batch_size, exclude=exclude,
                                   client=client)
    return neighbor_search(Q, K, grid, k=k, n_candidates=n_candidates, batch_size=batch_size,
                           exclude=exclude, client=client, hops=hops)
