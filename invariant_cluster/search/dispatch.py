"""The one dispatcher of the estimators' kNN searches: ``exact | shortlist | auto``."""

from __future__ import annotations

from .._heap import reusing_heap
from .grid import SearchGrid
from .kernel import blocked_grid_search, grid_search
from .plan import SearchPlan, make_search_plan
from .shortlist import neighbor_search

__all__ = ["knn_search"]


@reusing_heap
def knn_search(Q, K, grid: SearchGrid, k, *, method="auto", n_candidates=None,
               batch_size=None, exclude=None, client=None, plan: SearchPlan | None = None):
    """The ``k`` nearest keys of every query on the grid: ``(dist^2, index, params)``.

    ``plan`` (:class:`~invariant_cluster.search.plan.SearchPlan`) says how; None: made here
    from ``method`` ("auto", "exact" or "shortlist") and ``n_candidates`` by
    :func:`~invariant_cluster.search.plan.make_search_plan`. The exact plan runs
    :func:`~invariant_cluster.search.kernel.grid_search` (or its Dask twin
    :func:`~invariant_cluster.search.kernel.blocked_grid_search` with ``client``), the
    shortlist plan :func:`~invariant_cluster.search.shortlist.neighbor_search`.
    """
    if plan is None:
        plan = make_search_plan(Q.shape[0], K.shape[0], grid.size, k, device=Q.device,
                                method=method, n_candidates=n_candidates,
                                self_search=Q is K and exclude is not None)
    if plan.method == "exact":
        if client is None:
            return grid_search(Q, K, grid, k=k, batch_size=batch_size, exclude=exclude)
        return blocked_grid_search(Q, K, grid, k=k, batch_size=batch_size, exclude=exclude,
                                   client=client)
    return neighbor_search(Q, K, grid, k=k, n_candidates=plan.n_candidates,
                           batch_size=batch_size, exclude=exclude, client=client,
                           approximate=plan.approximate, hops=plan.hops)
