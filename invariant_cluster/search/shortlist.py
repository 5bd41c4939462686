"""Sub-quadratic invariant nearest neighbours: a descriptor shortlist, then an exact search.

1. :func:`shortlist_descriptors`: rotation-steerable descriptors of the keys at a few rotations
   (about every 15 degrees) and of the queries at a few shifts
   (:mod:`~invariant_cluster.search.descriptors`);
2. :func:`~invariant_cluster.search.blocked.shortlist` (blocked, all pairs) or
   :func:`~invariant_cluster.search.approximate.approximate_shortlist` (faiss): the
   ``n_candidates`` nearest keys of each query by descriptor distance (the smallest over the
   copies);
3. :func:`~invariant_cluster.search.candidates.candidate_search`: the exact grid search
   restricted to each query's candidates.

:func:`neighbor_search` chains them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from .. import _memory
from ..transforms import rotation_grid, translation_grid
from . import approximate as _approximate
from .blocked import check_descriptors, shortlist  # noqa: F401 - importable from here
from .candidates import candidate_search
from .descriptors import invariant_descriptors, steerable_descriptors
from .grid import SearchGrid, check_int
from .kernel import merge_topk
from .plan import HOP_NEIGHBORS, default_n_candidates, uses_faiss

__all__ = ["shortlist", "shortlist_descriptors", "neighbor_search"]

# The steerable shortlist (see shortlist_descriptors): key rotations about every 15 degrees,
# rings 2 px apart, 32 samples per ring, angular frequencies 0..8, a light blur with shifts.
# Chosen on the MNIST measurements of benchmarks/bench_scaling.py --recall (the recall hardly
# moves with finer settings).
_SHORTLIST_ANGLE_STEP = 15.0
_SHORTLIST_ANGULAR = 32
_SHORTLIST_FREQUENCIES = 9
_SHORTLIST_BLUR = 0.5
# Rows of the pass over the neighbours' neighbours whose merged lists are sorted at once.
_HOP_ROWS = 1 << 16


def shortlist_descriptors(X: torch.Tensor, Y: torch.Tensor, grid: SearchGrid, *,
                          descriptor="steerable", rotate="keys"):
    """Query and key descriptors for :func:`shortlist`, chosen from the search ``grid``.

    Parameters
    ----------
    X, Y : torch.Tensor of shape (n_x, C, H, W) and (n_y, C, H, W)
    grid : SearchGrid
    descriptor : {"steerable", "modulus"}, default="steerable"
        "steerable": :func:`steerable_descriptors`, the keys rotated by a subset of the grid
        angles (about every 15 degrees) and the queries shifted by the integer shifts on a
        2-pixel lattice (every shift below 2 pixels); "modulus": :func:`invariant_descriptors`
        (invariant to all rotations, one vector per image: cheaper, lower recall).
    rotate : {"keys", "queries", "auto"}, default="keys"
        Which side carries the rotated copies of the steerable descriptors. "queries": the
        queries are rotated by the opposite angles (a rotation is a unitary phase factor, so
        every distance is the same) and each key has one copy; "auto": the queries when there
        are more rotations than shifts. The approximate shortlist indexes the key copies, so it
        wants few of them.

    Returns
    -------
    X_desc : torch.Tensor of shape (n_x, U, d)
    Y_desc : torch.Tensor of shape (n_y, V, d)

    Notes
    -----
    Measured on MNIST (see ``benchmarks/bench_scaling.py --recall``): the steerable
    shortlist of ``4 k`` keys holds >= 0.95 of the exact top-``k``; the modulus one needs
    several times more candidates for the same recall, because it also matches rotations
    outside the searched range and lets every ring turn on its own.
    """
    if descriptor not in ("steerable", "modulus"):
        raise ValueError(f"descriptor: expected 'steerable' or 'modulus', got {descriptor!r}")
    if grid.reflection:
        # the mirrored keys are more key variants: the shortlist keeps the best of them
        plain = replace(grid, reflection=False)
        X_desc, Y_desc = shortlist_descriptors(X, Y, plain, descriptor=descriptor)
        # (one query image only: the mirror call is for the keys' descriptors)
        Y_mirror = shortlist_descriptors(X[:1], Y.flip(-1), plain, descriptor=descriptor)[1]
        return X_desc, torch.cat([Y_desc, Y_mirror], 1)
    rot, trans, _ = grid.free
    if not rot and not trans:  # plain distances: the pixels are the exact descriptor
        return X.reshape(X.shape[0], 1, -1), Y.reshape(Y.shape[0], 1, -1)
    blur = _SHORTLIST_BLUR if trans else 0.0
    if descriptor == "modulus":
        kw = dict(group=grid.group, max_rotation=grid.max_rotation,
                  max_translation=grid.max_translation)
        X_desc = invariant_descriptors(X, **kw)[:, None]
        Y_desc = X_desc if Y is X else invariant_descriptors(Y, **kw)[:, None]
        return X_desc, Y_desc
    angles, shifts, kw, rotate = _steerable_plan(X.shape[-2:], grid, rotate)
    kw["blur"] = blur
    if rotate == "queries" and angles is not None:
        return (steerable_descriptors(X, shifts=shifts, angles=-angles, **kw),
                steerable_descriptors(Y, **kw))
    return (steerable_descriptors(X, shifts=shifts, **kw),
            steerable_descriptors(Y, angles=angles, **kw))


def _steerable_plan(size, grid: SearchGrid, rotate):
    """``(angles, shifts, kw, rotate)`` of the steerable descriptors of
    :func:`shortlist_descriptors` for images of ``size`` ``(H, W)`` (``rotate`` resolved)."""
    rot, trans, _ = grid.free
    angles = None
    if rot:
        if grid.max_rotation >= 180.0:
            n_ang = int(math.ceil(360.0 / _SHORTLIST_ANGLE_STEP))
        else:
            n_ang = 2 * int(math.ceil(grid.max_rotation / _SHORTLIST_ANGLE_STEP)) + 1
        angles = rotation_grid(grid.max_rotation, min(n_ang, len(grid.angles)))
    shifts = None
    if trans:
        shifts = translation_grid(grid.max_translation)
        if grid.max_translation >= 2:
            shifts = shifts[(shifts % 2 == 0).all(1)]
    h, w = size
    n_rings = max(1, int(round(min(h, w) / 4.0)))  # about 2 pixels apart
    kw = dict(n_rings=n_rings, n_angular=_SHORTLIST_ANGULAR, n_frequencies=_SHORTLIST_FREQUENCIES)
    if rotate not in ("keys", "queries", "auto"):
        raise ValueError(f"rotate: expected 'keys', 'queries' or 'auto', got {rotate!r}")
    if rotate == "auto":
        rotate = "queries" if angles is not None and len(angles) > (
            1 if shifts is None else len(shifts)) else "keys"
    return angles, shifts, kw, rotate


def descriptor_bytes(n_x, n_y, image_shape, grid: SearchGrid, *, rotate="keys",
                     element_size=4) -> int:
    """Bytes of the steerable descriptors :func:`shortlist_descriptors` returns for ``n_x``
    queries and ``n_y`` keys of ``image_shape`` ``(C, H, W)``, computed without them (0 when
    the pixels are the descriptors)."""
    rot, trans, _ = grid.free
    if not rot and not trans:
        return 0
    c, h, w = (int(v) for v in image_shape[-3:])
    angles, shifts, kw, rotate = _steerable_plan((h, w), grid, rotate)
    n_ang = 1 if angles is None else len(angles)
    n_sh = 1 if shifts is None else len(shifts)
    m = min(kw["n_frequencies"], kw["n_angular"] // 2 + 1)
    d = c * kw["n_rings"] * (2 * m - 1)
    per_query = n_sh * (n_ang if rotate == "queries" else 1)
    per_key = grid.n_mirrors * (1 if rotate == "queries" else n_ang)
    return int((int(n_x) * per_query + int(n_y) * per_key) * d * int(element_size))


def neighbor_search(X: torch.Tensor, Y: torch.Tensor, grid: SearchGrid, *, k, n_candidates=None,
                    batch_size=None, exclude=None, client=None, descriptor="steerable",
                    candidates=None, return_candidates=False, approximate=None, hops=None):
    """Approximate top-``k`` invariant neighbours: descriptor shortlist, then exact search.

    Same outputs as ``grid_search(X, Y, grid, k=k)``; a true neighbour is missed only when the
    descriptors do not put it among the query's ``n_candidates`` (recall measured in
    ``benchmarks/bench_scaling.py``). With ``n_candidates >= n_y`` it is the exact search.

    Parameters
    ----------
    X, Y : torch.Tensor of shape (n_x, C, H, W) and (n_y, C, H, W)
        Queries and keys.
    grid : SearchGrid
        The transformations searched.
    k : int
        Neighbours kept per query.
    n_candidates : int, optional
        Shortlist length (None: :func:`~invariant_cluster.search.plan.default_n_candidates`).
    batch_size : int, optional
        Queries per block of the exact search of the candidates (None: from the memory
        budget).
    exclude : torch.Tensor of shape (n_x,), optional
        A key index to leave out for each query.
    client : dask.distributed.Client, optional
        Run the exact search's blocks on dask (identical results).
    descriptor : {"steerable", "modulus"}, default="steerable"
        See :func:`shortlist_descriptors`.
    candidates : torch.Tensor of shape (n_x, c), optional
        A shortlist computed elsewhere (then ``n_candidates`` and ``descriptor`` are unused).
    return_candidates : bool, default=False
        Also return the shortlist.
    approximate : bool, optional
        Find the shortlist with faiss's approximate inverted-file search
        (:func:`~invariant_cluster.search.approximate.approximate_shortlist`, about ``O(n log n)``)
        instead of comparing every query with every key (``O(n^2)``). None: as the search
        plan decides for the keys' device (``search.plan.FAISS_MIN_KEYS``).
    hops : int, optional
        When the queries are the keys (``X is Y``, with ``exclude``) and the shortlist does not
        hold every key: one more exact pass over the ``hops`` nearest neighbours of each
        query's ``hops`` nearest neighbours, those not shortlisted (None:
        ``search.plan.HOP_NEIGHBORS``; 0: none). It recovers neighbours the descriptors missed.

    Returns
    -------
    dist, index, params : as :func:`candidate_search`
    candidates : torch.Tensor of shape (n_x, c), only with ``return_candidates=True``

    Examples
    --------
    >>> import torch
    >>> from invariant_cluster.alignment import grid_search, make_search_grid
    >>> from invariant_cluster.neighbors import neighbor_search
    >>> X = torch.rand(50, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    >>> grid = make_search_grid("rotation", 45.0, 7, refine=False)
    >>> D, I, P = neighbor_search(X, X, grid, k=5, n_candidates=50)   # every key: exact
    >>> bool(torch.equal(I, grid_search(X, X, grid, k=5)[1]))
    True
    """
    k = check_int(k, "k", 1)
    n_x, n_y = X.shape[0], Y.shape[0]
    if candidates is None:
        if n_candidates is None:
            n_candidates = default_n_candidates(k, n_y, device=Y.device)
        n_candidates = max(check_int(n_candidates, "n_candidates", 1), k)
        n_avail = n_y - (1 if exclude is not None else 0)
        approximate = approximate or (approximate is None and uses_faiss(n_y, Y.device))
        described = 0
        if n_candidates < n_avail and descriptor == "steerable":
            described = descriptor_bytes(n_x, n_y, X.shape[1:], grid,
                                         rotate="auto" if approximate else "keys",
                                         element_size=X.element_size())
        _memory.check_search(n_x, n_y, X.shape[1:], grid, k=k,
                             n_candidates=min(n_candidates, n_y), descriptor_bytes=described,
                             element_size=X.element_size(), device=X.device,
                             what=f"the neighbour search of {n_x} x {n_y} images")
        if n_candidates >= n_avail:  # the shortlist would hold every key anyway
            candidates = torch.arange(n_y, device=X.device).expand(X.shape[0], n_y)
        else:  # the descriptors are freed before the exact search
            candidates = _shortlist_of(X, Y, grid, n_candidates, exclude, descriptor,
                                       approximate)
    out = candidate_search(X, Y, candidates, grid, k=k, batch_size=batch_size, exclude=exclude,
                           client=client)
    hops = HOP_NEIGHBORS if hops is None else check_int(hops, "hops", 0)
    if hops and X is Y and exclude is not None and candidates.shape[1] < n_y - 1:
        out = _hop_pass(X, grid, out, candidates, min(hops, k), exclude, batch_size, client)
    return (*out, candidates) if return_candidates else out


class _DescribedRows:
    """The descriptors ``describe(X[rows])`` of the rows of ``X``, computed when indexed: a
    ``(n, U, d)`` stand-in for the query descriptors of the approximate shortlist, which reads
    them one block of rows at a time."""

    ndim = 3

    def __init__(self, X, describe):
        self.X, self.describe = X, describe
        first = describe(X[:1])
        self.shape = (X.shape[0], *first.shape[1:])
        self.device, self.dtype = first.device, first.dtype

    def __getitem__(self, rows):
        return self.describe(self.X[rows])


def _shortlist_of(X, Y, grid, n_candidates, exclude, descriptor, approximate):
    """The ``n_candidates`` nearest keys of each query by descriptor distance (faiss's
    inverted file when ``approximate``, else all pairs)."""
    if approximate:
        # the keys' descriptors go into faiss's index; the queries' are computed block by block
        # as the index is searched (they are U times larger than the keys' where U > V)
        Y_desc = shortlist_descriptors(X[:1], Y, grid, descriptor=descriptor, rotate="auto")[1]
        X_desc = _DescribedRows(
            X, lambda rows: shortlist_descriptors(rows, rows[:1], grid, descriptor=descriptor,
                                                  rotate="auto")[0])
        return _approximate.approximate_shortlist(X_desc, Y_desc, n_candidates,
                                                  exclude=exclude)
    X_desc, Y_desc = shortlist_descriptors(X, Y, grid, descriptor=descriptor)
    return shortlist(X_desc, Y_desc, n_candidates, exclude=exclude)


def _hop_pass(X, grid, found, candidates, hops, exclude, batch_size, client):
    """One more exact pass of a self-search over the neighbours' neighbours: the ``hops``
    nearest neighbours of each query's ``hops`` nearest neighbours that its shortlist did not
    hold, merged into its top-``k`` (see ``search.plan.HOP_NEIGHBORS``)."""
    dist, index, params = found
    n = candidates.shape[0]
    own = exclude.to(index.device)
    parts = []
    for r0 in range(0, n, _HOP_ROWS):  # row blocks: the sorted lists are (rows, c + hops^2)
        rows = slice(r0, min(n, r0 + _HOP_ROWS))
        hop = index[index[rows, :hops]][:, :, :hops].reshape(-1, hops * hops)
        # sort each row's shortlist and hop lists together, shortlist first for equal keys
        # (tag 0); a hop key is new when it is the first of its run and tagged 1
        keyed = torch.cat([candidates[rows].to(index.device) * 2, hop * 2 + 1], 1).sort(1).values
        del hop
        key = keyed // 2
        new = (keyed % 2 == 1)
        del keyed
        new[:, 1:] &= key[:, 1:] != key[:, :-1]
        new &= key != own[rows, None]
        width = int(new.sum(1).max()) if new.numel() else 0
        # the new keys first in each row (stable), padded with the query itself (never
        # computed)
        pos = torch.argsort((~new).to(torch.int8), dim=1, stable=True)[:, :width]
        parts.append(torch.where(new.gather(1, pos), key.gather(1, pos), own[rows, None]))
        del key, new, pos
    width = max((p.shape[1] for p in parts), default=0)
    if width == 0:
        return found
    extra = torch.cat([torch.cat([p, own[r0:r0 + p.shape[0], None].expand(-1, width - p.shape[1])],
                                 1) for r0, p in zip(range(0, n, _HOP_ROWS), parts)])
    del parts
    d2, i2, p2 = candidate_search(X, X, extra, grid, k=min(width, dist.shape[1]),
                                  batch_size=batch_size, exclude=exclude, client=client)
    return merge_topk(found, d2, i2, p2, dist.shape[1])
