"""Sub-quadratic invariant nearest neighbours: a descriptor shortlist, then an exact search.

The exact top-``k`` search (:func:`~invariant_cluster.alignment.grid_search` with ``k``) costs
``n_x n_y R S F`` multiply-adds (``R`` grid angles, ``S`` integer shifts, ``F`` pixels). Only the
``k`` nearest keys of each query matter, so the search is split in two:

1. descriptors (:func:`shortlist_descriptors`): the polar angular spectrum of every image
   (rings about the centre, FFT over the angle, low frequencies), a linear compression to
   ``d ~ 120`` values in which a rotation is a phase factor; the keys are described at a few
   rotations (about every 15 degrees, :func:`steerable_descriptors`) and the queries at a few
   shifts. :func:`invariant_descriptors` (the moduli: invariant to every rotation) is the
   cheaper, less selective alternative;
2. :func:`shortlist`: the ``n_candidates`` nearest keys of each query by descriptor distance
   (the smallest over the copies; ``n_x n_y U V d`` multiply-adds in blocked matrix products);
3. :func:`candidate_search`: the exact grid search restricted to each query's candidates
   (``n_x n_candidates R S F``), with ``grid_search``'s semantics and numbers.

:func:`neighbor_search` chains them. With ``n_candidates`` a fixed multiple of ``k`` (default
``4 k``) the exact part is linear in ``n_y``; the shortlist stays quadratic with a constant about
``R S F / (U V d)`` times smaller than the exact search (~12 for 28 x 28 images and 17 angles,
~35 with +-2 px shifts).

Memory is bounded by blocks sized from the available memory; a request that cannot fit fails
early with :class:`InsufficientMemoryError`. The blocks of the exact search may run on a dask
cluster (``client=``, see :mod:`invariant_cluster._dask`), with identical results.

The engine lives in :mod:`invariant_cluster.search`. This module is a public layer over it,
kept on purpose: it re-exports the neighbour searches under one documented name, so that code
written against the API page does not depend on how the engine is organised inside, and defines
:func:`aligned_weighted_sum` (one attention step as Dask tasks). The memory policy
(``memory_budget``, ``block_elements``, ``check_fits``) stays importable from here but is
internal (:mod:`invariant_cluster._memory`), not part of the documented API.
"""

from __future__ import annotations

import torch

from ._dask import blocked_map
from ._heap import reusing_heap
from ._memory import (  # noqa: F401 - importable from here, internal
    InsufficientMemoryError,
    block_elements,
    check_fits,
    memory_budget,
)
from .search import (  # noqa: F401 - this public layer's names
    approximate_shortlist,
    blocked_grid_search,
    candidate_search,
    invariant_descriptors,
    neighbor_search,
    shortlist,
    shortlist_descriptors,
    steerable_descriptors,
)
from .search.grid import check_int
from .search.plan import (  # noqa: F401 - this public layer's names
    SearchPlan,
    default_n_candidates,
    make_search_plan,
)
from .transforms import fast_warp

__all__ = [
    "invariant_descriptors",
    "steerable_descriptors",
    "shortlist_descriptors",
    "shortlist",
    "approximate_shortlist",
    "candidate_search",
    "neighbor_search",
    "blocked_grid_search",
    "aligned_weighted_sum",
    "default_n_candidates",
    "make_search_plan",
    "SearchPlan",
    "InsufficientMemoryError",
]


def _weighted_block(block, keys):
    """``sum_j W[i, j] warp(keys[idx[i, j]], params[i, j])`` for one block of rows (a task)."""
    idx, params, W = block
    b, k = idx.shape
    warped = fast_warp(keys[idx.reshape(-1)], params.reshape(-1, params.shape[-1])).reshape(
        b, k, -1)
    return torch.bmm(W[:, None, :].to(warped.dtype), warped)[:, 0].reshape(b, *keys.shape[1:])


@reusing_heap
def aligned_weighted_sum(keys: torch.Tensor, idx: torch.Tensor, params: torch.Tensor,
                         W: torch.Tensor, *, batch_size=None, client=None) -> torch.Tensor:
    """One attention step: ``out[i] = sum_j W[i, j] T_(params[i, j]) keys[idx[i, j]]``.

    Row blocks are independent, so they run as :func:`~invariant_cluster._dask.blocked_map`
    tasks on a dask cluster when ``client`` is given (or joblib's dask backend is active), with
    the same result as here.

    Parameters
    ----------
    keys : torch.Tensor of shape (n_y, C, H, W)
    idx : torch.Tensor of shape (n, k), long
    params : torch.Tensor of shape (n, k, 3) or (n, k, 4)
        ``(angle, tx, ty)`` warping each key onto its query (as :func:`candidate_search`), and
        the mirror bit when the search had reflections.
    W : torch.Tensor of shape (n, k)
        Weights (rows usually sum to 1).
    batch_size : int, optional
        Rows per block (None: from the memory budget).
    client : dask.distributed.Client, optional

    Returns
    -------
    out : torch.Tensor of shape (n, C, H, W)
    """
    n, k = idx.shape
    if params.shape not in ((n, k, 3), (n, k, 4)) or W.shape != (n, k):
        raise ValueError(f"idx, params, W: expected shapes (n, k), (n, k, 3 or 4), (n, k), got "
                         f"{tuple(idx.shape)}, {tuple(params.shape)}, {tuple(W.shape)}")
    batch_size = check_int(batch_size, "batch_size", 1, allow_none=True)
    nf = keys[0].numel()
    if batch_size is None:
        # the warped keys of a row and their sampling grids (2 coordinates per pixel)
        per_row = max(1, 4 * k * nf)
        batch_size = int(max(1, min(n, block_elements(keys.device, keys.element_size())
                                    // per_row)))
    blocks = [(idx[r:r + batch_size], params[r:r + batch_size], W[r:r + batch_size])
              for r in range(0, n, batch_size)]
    out = blocked_map(_weighted_block, blocks, shared=(keys,), client=client)
    if not out:
        return keys.new_zeros((0, *keys.shape[1:]))
    return torch.cat([o.to(keys.device) for o in out], 0)
