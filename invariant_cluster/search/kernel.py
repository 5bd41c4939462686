"""The block kernel of every search, and the exact all-pairs search built on it.

One block of the search compares queries with keys warped by every grid transformation:
scores and key energies (one matrix product, the energies its bias) -> min over the grid, then
``||x||^2`` added (:func:`block_distances`) -> the excluded pairs set to ``inf``
(:func:`mask_excluded`) -> merged into a running top-``k`` (:func:`merge_topk`) -> grid points
decoded into parameters (:meth:`SearchGrid.decode`). The exact all-pairs search
(:func:`grid_search`), its Dask twin (:func:`blocked_grid_search`), the candidate search
(:mod:`.candidates`) and the descriptor shortlist (:mod:`.shortlist`) are loops over blocks
around these four steps.

Integer translations are moved onto the queries: each rotated key lives on a canvas with a
margin of ``max |shift|`` pixels, and ``<x, T y> = <P_(m-t) x, Z>`` exactly, so each query is
placed ``S`` times on a zero canvas (:func:`shift_images`) and all inner products of a block are
ONE matrix product ``(b S, F) @ (F, c R)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .. import _memory
from .._dask import blocked_map
from .._progress import progress_bar
from ..transforms import sample_images, sampling_grid
from .grid import SearchGrid, check_int

__all__ = ["grid_search", "blocked_grid_search"]


# ----------------------------------------------------------------------------- the kernel
def mask_excluded(dist: torch.Tensor, keys: torch.Tensor, exclude) -> torch.Tensor:
    """Set ``dist[i, j] = inf`` where the key index of column ``j`` is ``exclude[i]``."""
    if exclude is not None:
        dist.masked_fill_(keys == exclude[:, None], math.inf)
    return dist


def merge_topk(best, dist, index, arg, k):
    """The ``k`` smallest of a running ``best = (dist, index, arg)`` (or None) and a new block.

    ``arg`` is ``(n, c)`` or ``(n, c, ...)`` (e.g. decoded parameters), or None."""
    if best is not None:
        dist = torch.cat([best[0], dist], 1)
        index = torch.cat([best[1], index], 1)
        arg = None if arg is None else torch.cat([best[2], arg], 1)
    top, pos = torch.topk(dist, min(k, dist.shape[1]), dim=1, largest=False, sorted=True)
    if arg is not None:
        arg = arg.gather(1, pos.reshape(*pos.shape, *(1,) * (arg.ndim - 2)).expand(
            *pos.shape, *arg.shape[2:]))
    return top, index.gather(1, pos), arg


def block_distances(Q: torch.Tensor, xsq: torch.Tensor, Kw: torch.Tensor, E: torch.Tensor):
    """The kernel's first steps for ``b`` shifted queries against ``c`` warped keys.

    ``Q`` ``(b, S, F)`` from :func:`shift_images`, ``xsq`` ``(b,)``, ``Kw`` ``(R, c, F)`` the
    keys' warps laid out by angle (:func:`warp_canvas`), ``E`` ``(R, c, S)`` from
    :func:`shift_energies`. Returns ``(dist, arg)`` ``(b, c)`` with ``arg = r * S + s``, the
    first best grid point in that order.

    ``||T y||^2 - 2 <x, T y>`` comes out of one product (the key energies as its bias, the factor
    -2 as its scale); the minimum is taken over the shifts, then over the angles, each along an
    outer axis with the keys contiguous (a reduction that reads whole rows); and ``||x||^2`` is
    added to the ``(b, c)`` minimum: rounding is monotone, so this equals adding it before the
    minimum, bit for bit.
    """
    b, S, nf = Q.shape
    R, c = Kw.shape[:2]
    Kf = Kw.reshape(R * c, nf)
    if S == 1:
        d = torch.addmm(E.reshape(R * c), Q.reshape(b, nf), Kf.T, alpha=-2.0).view(b, R, c)
        dist, arg = d.min(1)
    else:
        # one batched product per shift, each with the energies of that shift as its bias
        d = torch.baddbmm(E.permute(2, 0, 1).reshape(S, 1, R * c), Q.transpose(0, 1),
                          Kf.T.expand(S, nf, R * c), alpha=-2.0).view(S, b, R, c)
        d, s = d.min(0)  # (b, R, c): the best (first) shift at every angle
        dist, r = d.min(1)
        arg = r * S + s.gather(1, r[:, None]).squeeze(1)
    return dist.add_(xsq[:, None]).clamp_(min=0.0), arg


# ----------------------------------------------------------------------------- the canvas
def shift_margin(shifts: np.ndarray) -> int:
    """The canvas margin ``m = max |shift|`` that the shifted search needs."""
    return int(np.abs(shifts).max()) if len(shifts) else 0


# grid_sample calls per call of warp_keys/warp_canvas: each samples at most a quarter of the
# angles (see _fill_warps)
_WARP_ANGLE_CHUNKS = 4


def _warp_plan(angles, square: bool, reflection: bool):
    """Which warps are sampled and which are exact pixel permutations of others.

    Returns ``(sampled, derived)``: ``sampled`` the rows (of the ``R [x 2]`` angle-major
    layout) that ``grid_sample`` computes, ``derived`` a list of ``(row, source_row, k,
    flip)``, to be filled IN ORDER with the source's warp turned by ``k`` quarter turns
    (``torch.rot90(., k, (-2, -1))``) or mirrored (``flip(-1)``).

    Why they are exact: a quarter turn about the centre of a square canvas maps pixel centres
    onto pixel centres, so the bilinear warp by ``a + 90 k`` degrees samples the same source
    points as the warp by ``a``, permuted; and a mirror image rotated by ``a`` is the image
    rotated by ``-a``, mirrored (``R_a M = M R_-a``). 72 angles over the full circle with
    mirrors: 18 of 144 warps sampled. The identity (angle 0) is sampled first, as the key
    itself (exact), so its quarter turns are exact too.
    """
    deg = [float(a) for a in angles]
    R = len(deg)
    order = sorted(range(R), key=lambda i: deg[i] != 0.0)  # the identity first
    source = {}
    bases = []
    for i in order:
        for j in bases if square else ():
            k = ((deg[i] - deg[j]) % 360.0) / 90.0
            if abs(k - round(k)) < 1e-9 and round(k) % 4:
                source[i] = (j, int(round(k)) % 4)
                break
        else:
            bases.append(i)
    sampled = sorted(bases)
    derived = [(i, j, k, False) for i, (j, k) in sorted(source.items())]
    if reflection:
        where = {round(a % 360.0, 9): i for i, a in enumerate(deg)}
        for i, a in enumerate(deg):
            j = where.get(round((-a) % 360.0, 9))
            if j is None:
                sampled.append(R + i)  # sampled from the mirrored keys
            else:
                derived.append((R + i, j, 0, True))
    return sampled, derived


def _fill_warps(Y: torch.Tensor, angles: torch.Tensor, pad: int, reflection: bool, put, get):
    """Compute every warp of :func:`warp_keys` and hand them over row by row.

    ``put(rows, warped)`` receives ``warped`` ``(len(rows), n, C (H + 2 pad) (W + 2 pad))``
    for the rows ``rows`` of the angle-major layout (mirrors after the ``R`` angles);
    ``get(row)`` returns a row already put, ``(n, canvas)``. Rows are sampled (``grid_sample``,
    ONE sampling grid per angle applied to all the keys at once as the channels of one image,
    at most a quarter of the angles per call) or derived exactly from sampled ones
    (:func:`_warp_plan`); the identity is the key itself.
    """
    if pad:
        Y = F.pad(Y, (pad, pad, pad, pad))
    n, c, h, w = Y.shape
    R = angles.shape[0]
    ang = angles.tolist()
    sampled, derived = _warp_plan(ang, h == w, reflection)
    step = -(-R // _WARP_ANGLE_CHUNKS)
    p = torch.zeros((R, 3), dtype=Y.dtype, device=Y.device)
    p[:, 0] = angles.to(Y.dtype)
    grid = sampling_grid(p, h, w)
    for half, src in enumerate([Y, Y.flip(-1)] if reflection else [Y]):
        rows = [r - half * R for r in sampled if half * R <= r < (half + 1) * R]
        flat = src.reshape(1, n * c, h, w)
        for r in rows:
            if ang[r] == 0.0:  # the identity is the key itself, exactly (not sampled)
                put([half * R + r], src.reshape(1, n, c * h * w))
        rows = [r for r in rows if ang[r] != 0.0]
        for i0 in range(0, len(rows), step):
            chunk = rows[i0:i0 + step]
            idx = torch.as_tensor(chunk, device=Y.device)
            warped = sample_images(flat.expand(len(chunk), -1, -1, -1), grid[idx])
            put([half * R + r for r in chunk], warped.reshape(len(chunk), n, c * h * w))
    for row, src_row, k, flip in derived:
        z = get(src_row).reshape(n, c, h, w)
        z = z.flip(-1) if flip else torch.rot90(z, k, (-2, -1))
        put([row], z.reshape(1, n, c * h * w))


def _rows(rows):
    """A list of rows as a slice when consecutive (a plain copy), else as an index."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return rows


def warp_keys(Y: torch.Tensor, angles: torch.Tensor, pad: int = 0,
              reflection: bool = False) -> torch.Tensor:
    """Every image rotated by every angle onto a canvas with a margin of ``pad`` pixels.

    ``(n, C, H, W) -> (n, R, C (H + 2 pad) (W + 2 pad))``; with ``reflection``,
    ``(n, 2 R, ...)``: the ``R`` warps of the image, then the ``R`` warps of its mirror image
    (``Y.flip(-1)``, the mirror of :mod:`invariant_cluster.transforms`' Convention, applied
    before the rotation), so that grid point ``r`` of the second half decodes to mirror bit 1.
    The rotation is about the image's own centre (the canvas is padded symmetrically), and what
    a rotation moves outside ``H x W`` but inside the margin is kept, so that a later shift by
    at most ``pad`` pixels brings it back exactly as one ``warp_se2`` with the composed
    transformation would. Quarter turns of other angles and mirrors are exact pixel
    permutations of sampled warps (see :func:`_warp_plan`). :func:`warp_canvas` is the same
    warps laid out by angle.
    """
    n, c, h, w = Y.shape
    canvas = c * (h + 2 * pad) * (w + 2 * pad)
    R = angles.shape[0] * (2 if reflection else 1)
    out = torch.empty((n, R, canvas), dtype=Y.dtype, device=Y.device)
    if n:
        def put(rows, warped):
            out[:, _rows(rows)] = warped.transpose(0, 1)
        _fill_warps(Y, angles, pad, reflection, put, lambda r: out[:, r])
    return out


def warp_canvas(Y: torch.Tensor, angles: torch.Tensor, pad: int = 0,
                reflection: bool = False) -> torch.Tensor:
    """The warps of :func:`warp_keys` laid out by ANGLE: ``(R [x 2], n canvas)``, row ``r``
    holding the ``n`` canvases of angle ``r`` one after the other.

    This is the layout ``grid_sample`` produces (no transposed copy). The matrix of one key over
    all angles is then a strided view (leading dimension ``n canvas``) that a batched matrix
    product reads without a copy (see ``candidates._key_block``).
    """
    n, c, h, w = Y.shape
    canvas = c * (h + 2 * pad) * (w + 2 * pad)
    R = angles.shape[0] * (2 if reflection else 1)
    out = torch.empty((R, n * canvas), dtype=Y.dtype, device=Y.device)
    if n:
        def put(rows, warped):
            out[_rows(rows)] = warped.reshape(len(rows), -1)
        _fill_warps(Y, angles, pad, reflection, put, lambda r: out[r].view(n, canvas))
    return out


def shift_images(X: torch.Tensor, shifts: np.ndarray) -> torch.Tensor:
    """Each query placed on the search canvas once per shift: ``(b, S, C (H+2m) (W+2m))``.

    Maintenance note: with ``Z`` a key rotated onto the canvas (margin ``m``, see
    :func:`warp_keys`), ``warp_se2(y, (angle, t))(u) = Z(u + m - t)`` exactly (``t = (tx, ty)``,
    ``tx`` along columns, ``ty`` along rows), so ``<x, T y> = <P_(m - t) x, Z>`` where ``P_o``
    places ``x`` at offset ``o`` of a zero canvas. Moving the shift onto the query keeps all
    shifts and angles in ONE matrix product.
    """
    b, c, h, w = X.shape
    m = shift_margin(shifts)
    if m == 0:
        return X.reshape(b, 1, -1)
    out = X.new_zeros((b, len(shifts), c, h + 2 * m, w + 2 * m))
    for s, (tx, ty) in enumerate(shifts):
        out[:, s, :, m - ty:m - ty + h, m - tx:m - tx + w] = X
    return out.reshape(b, len(shifts), -1)


# rows per chunk of sum_squares: a squared chunk of about 1 MB stays in the cache
_SQUARES_CHUNK_ELEMENTS = 1 << 18


def sum_squares(Z: torch.Tensor) -> torch.Tensor:
    """``(Z * Z).sum(-1)``, bit for bit, a cache-sized chunk of rows at a time: the squared
    copy of a whole block of warps (hundreds of MB) was most of the cost (144 angles x 40
    keys of 63 x 63: 7 ms against 60 ms, measured). ``torch.linalg.vector_norm`` squared is
    faster still but not exact: the square root's round-off leaves a copy at a distance
    above 0."""
    f = Z.shape[-1]
    rows = Z.reshape(-1, f)
    out = Z.new_empty(rows.shape[0])
    step = max(1, _SQUARES_CHUNK_ELEMENTS // max(1, f))
    for i in range(0, rows.shape[0], step):
        x = rows[i:i + step]
        torch.sum(x * x, -1, out=out[i:i + step])
    return out.reshape(Z.shape[:-1])


def shift_energies(Kw: torch.Tensor, shifts: np.ndarray, shape) -> torch.Tensor:
    """``||T y||^2`` per grid point: the energy of the canvas ``Z`` in the ``H x W`` window at
    offset ``m - t`` (what the shift brings into the frame). ``Kw`` from :func:`warp_keys` with
    ``pad = m`` (or the same warps angle-major, ``(R, n, canvas)``: the two leading dimensions
    are kept as given); ``shape`` is the original ``(C, H, W)``; returns ``(n, R, S)``."""
    c, h, w = shape
    m = shift_margin(shifts)
    if m == 0:  # one window, the whole image
        return sum_squares(Kw)[..., None]
    sq = (Kw * Kw).reshape(*Kw.shape[:2], c, h + 2 * m, w + 2 * m).sum(2)  # (n, R, Hp, Wp)
    out = [sq[:, :, m - ty:m - ty + h, m - tx:m - tx + w].sum((-1, -2)) for tx, ty in shifts]
    return torch.stack(out, -1)


def _warped_chunk(Y: torch.Tensor, grid: SearchGrid):
    """Keys warped onto the canvas, laid out by angle, and their energies: ``(R, c, F)``,
    ``(R, c, S)``."""
    angles = torch.as_tensor(grid.angles, dtype=Y.dtype, device=Y.device)
    Kw = warp_canvas(Y, angles, pad=shift_margin(grid.shifts), reflection=grid.reflection)
    Kw = Kw.view(Kw.shape[0], Y.shape[0], -1)
    return Kw, shift_energies(Kw, grid.shifts, tuple(Y.shape[1:]))


def _sizes(X: torch.Tensor, n_y: int, grid: SearchGrid, batch_size, budget: int):
    """``(key_chunk, query_block)``: warped keys of a chunk, and a block's scores, ~ budget."""
    m = shift_margin(grid.shifts)
    canvas = X.shape[1] * (X.shape[2] + 2 * m) * (X.shape[3] + 2 * m)
    R, S = grid.n_mirrors * len(grid.angles), len(grid.shifts)
    key_chunk = int(max(1, min(n_y, budget // max(1, R * canvas))))
    if batch_size is None:
        batch_size = int(max(1, min(_memory.MAX_QUERIES_PER_BLOCK,
                                    budget // max(1, S * key_chunk * R))))
    return key_chunk, int(batch_size)


# ----------------------------------------------------------------------------- exact search
def _chunk_distances(Q, xsq, Kw, E, k0, exclude):
    """The kernel on one block, the step of every exact search's loop: the distances and grid
    points of the shifted queries ``Q`` to a chunk of warped keys (key indices from ``k0``),
    each query's excluded key masked. Returns ``(dist, arg, keys)``."""
    keys = torch.arange(k0, k0 + Kw.shape[1], device=Q.device)
    dmin, arg = block_distances(Q, xsq, Kw, E)
    mask_excluded(dmin, keys, exclude)
    return dmin, arg, keys


def grid_search(X: torch.Tensor, Y: torch.Tensor, grid: SearchGrid, *, k=None,
                batch_size=None, exclude=None):
    """Best grid transformation of every key onto every query.

    Parameters
    ----------
    X : torch.Tensor of shape (n_x, C, H, W)
        Queries.
    Y : torch.Tensor of shape (n_y, C, H, W)
        Keys, on the same device and dtype.
    grid : SearchGrid
    k : int or None
        None returns the full ``(n_x, n_y)`` matrices; an int keeps, per query, the ``k``
        smallest distances (streaming, memory ``O(n_x k)``), sorted ascending.
    batch_size : int or None
        Queries per block (None: sized from ``_memory.SCORE_BLOCK_ELEMENTS``).
    exclude : torch.Tensor of shape (n_x,) or None
        Key index to leave out for each query (its own index when ``X is Y``).

    Returns
    -------
    dist : (n_x, n_y) or (n_x, k) tensor of squared distances (clamped at 0)
    index : (n_x, k) long tensor of key indices (only when ``k`` is given)
    params : (n_x, n_y, 3) or (n_x, k, 3) tensor of the best grid transformation (angle, tx, ty)
        that warps the key onto the query
    """
    n_x, n_y = X.shape[0], Y.shape[0]
    device = X.device
    _memory.check_search(n_x, n_y, X.shape[1:], grid, k=k, element_size=X.element_size(),
                         device=device, what=f"the grid search of {n_x} x {n_y} images")
    xsq = (X.reshape(n_x, -1) ** 2).sum(1)
    if k is None:
        dist = X.new_empty((n_x, n_y))
        best = torch.empty((n_x, n_y), dtype=torch.long, device=device)
    else:
        k = int(min(k, n_y - (1 if exclude is not None else 0)))
        tops = [None] * n_x  # running top-k per query block, keyed by its first row
    kc, qb = _sizes(X, n_y, grid, batch_size, _memory.SCORE_BLOCK_ELEMENTS)
    bar = progress_bar(-(-n_y // kc) * -(-n_x // qb), "exact search")
    # keys outside, queries inside: each chunk of keys is warped once
    for k0 in range(0, n_y, kc):
        Kw, E = _warped_chunk(Y[k0:k0 + kc], grid)
        for q0 in range(0, n_x, qb):
            bar.update()
            Q = shift_images(X[q0:q0 + qb], grid.shifts)
            ex = None if exclude is None else exclude[q0:q0 + qb]
            dmin, arg, keys = _chunk_distances(Q, xsq[q0:q0 + qb], Kw, E, k0, ex)
            if k is None:
                dist[q0:q0 + qb, k0:k0 + kc] = dmin
                best[q0:q0 + qb, k0:k0 + kc] = arg
            else:
                tops[q0] = merge_topk(tops[q0], dmin, keys.expand_as(dmin), arg, k)
    bar.close()
    if k is None:
        return dist, grid.decode(best, X)
    if n_x == 0 or n_y == 0:
        return (X.new_zeros((n_x, 0)), torch.zeros((n_x, 0), dtype=torch.long, device=device),
                X.new_zeros((n_x, 0, 3)))
    dist, index, best = (torch.cat([tops[q][i] for q in range(0, n_x, qb)]) for i in range(3))
    return dist, index, grid.decode(best, X)


def _grid_block(block, Kw, E, k, key_chunk, shifts):
    """Exact top-``k`` of one query block against every pre-warped key (a Dask task): the
    step of :func:`grid_search` (:func:`_chunk_distances`) on warps computed once, ``Kw``
    ``(R, n_y, canvas)`` and ``E`` ``(R, n_y, S)``."""
    Xb, ex = block
    xsq = (Xb.reshape(Xb.shape[0], -1) ** 2).sum(1)
    Q = shift_images(Xb, shifts)
    top = None
    for k0 in range(0, Kw.shape[1], key_chunk):
        dmin, arg, keys = _chunk_distances(Q, xsq, Kw[:, k0:k0 + key_chunk],
                                           E[:, k0:k0 + key_chunk], k0, ex)
        top = merge_topk(top, dmin, keys.expand_as(dmin), arg, k)
    return top


def blocked_grid_search(X: torch.Tensor, Y: torch.Tensor, grid: SearchGrid, *, k,
                        batch_size=None, exclude=None, client=None):
    """The exact all-pairs ``grid_search(X, Y, grid, k=k)``, one task per block of queries.

    The keys are warped once (``warp_canvas`` onto the shift canvas, with their energies), sent
    to the workers once, and every block of queries runs ``grid_search``'s kernel against
    them; with or without ``client`` the SAME block calls produce the result, so it is identical
    either way (and equal to ``grid_search`` up to the round-off of differently shaped matrix
    products).

    Parameters
    ----------
    X, Y : torch.Tensor of shape (n_x, C, H, W) and (n_y, C, H, W)
    grid : SearchGrid
    k : int
    batch_size : int, optional
        Queries per block (None: from the memory budget).
    exclude : torch.Tensor of shape (n_x,), optional
    client : dask.distributed.Client, optional

    Returns
    -------
    dist, index, params : as ``grid_search`` with ``k``
    """
    k = check_int(k, "k", 1)
    batch_size = check_int(batch_size, "batch_size", 1, allow_none=True)
    n_x, n_y = X.shape[0], Y.shape[0]
    device, dtype = X.device, X.dtype
    Y = Y.to(device=device, dtype=dtype)
    R, S = grid.n_mirrors * len(grid.angles), len(grid.shifts)
    m = shift_margin(grid.shifts)
    canvas = X.shape[1] * (X.shape[2] + 2 * m) * (X.shape[3] + 2 * m)
    es = X.element_size()
    _memory.check_fits(n_y * R * (canvas + S) * es, device,
                       f"the warped keys ({n_y} x {R} angles)",
                       hint="use neighbor_search (the shortlist, which warps keys block by "
                            "block) or a smaller grid")
    key_chunk, batch_size = _sizes(X, n_y, grid, batch_size, _memory.block_elements(device, es))
    batch_size = min(batch_size, max(1, n_x))
    Kw, E = _warped_chunk(Y, grid)
    blocks = [(X[q:q + batch_size],
               None if exclude is None else exclude[q:q + batch_size].to(device))
              for q in range(0, n_x, batch_size)]
    kk = int(min(k, n_y - (1 if exclude is not None else 0)))
    out = blocked_map(_grid_block, blocks, shared=(Kw, E, kk, key_chunk, grid.shifts),
                      desc="exact search",
                      client=client)
    if not out:
        return (X.new_zeros((0, kk)), torch.zeros((0, kk), dtype=torch.long, device=device),
                X.new_zeros((0, kk, 3)))
    dist, index, best = (torch.cat([o[i].to(device) for o in out], 0) for i in range(3))
    return dist, index, grid.decode(best, X)
