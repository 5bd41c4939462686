"""The continuous refinement of grid alignments: batched Levenberg-Marquardt on the warp.

The best grid point of each kept pair is refined continuously (angle and sub-pixel shift) by a
few batched Levenberg-Marquardt steps on the warped image: the Jacobian is the image gradient
times the rotation velocity field (:func:`~invariant_cluster.transforms.warp_jacobian`), and a
step is accepted only when the residual drops.
"""

from __future__ import annotations

import torch

from .. import _memory
from .._heap import release
from .._progress import progress_bar
from ..transforms import fast_warp, kept_pixels, warp_jacobian, wrap_degrees
from .grid import SearchGrid
from .kernel import grid_search

__all__ = ["refine_alignments", "refine_pairs", "all_pairs"]


def refine_alignments(Xp: torch.Tensor, Yp: torch.Tensor, params: torch.Tensor,
                      grid: SearchGrid, n_steps: int = 8, kept: bool = False):
    """Refine ``params`` so that ``fast_warp(Yp, params)`` matches ``Xp``, pair by pair.

    Batched Levenberg-Marquardt over all pairs at once: a step is accepted only where it lowers
    the pair's residual, so the result is never worse than the start. Angles stay within
    ``+-max_rotation`` (no bound for the full circle) and shifts within ``+-max_translation``.

    Returns ``(dist, params)`` with ``dist[p] = ||Xp[p] - warp(Yp[p], params[p])||^2``. With
    ``(P, 4)`` parameters (E(2)) the mirror bit stays as it is: the pair's key is mirrored, and
    its angle and shift are refined. With ``kept``, the residual is that of the pixels whose
    source the warp keeps inside ``Yp``'s frame (:func:`~invariant_cluster.transforms.kept_pixels`):
    each step lowers its mean over those pixels (a sum would gain by moving the image out of
    the frame), and ``dist`` is its sum there.
    """
    P = Xp.shape[0]
    if params.shape[-1] == 4:
        mirror = params[:, 3:]
        flip = mirror[:, 0, None, None, None] > 0.5
        d, p = refine_alignments(Xp, torch.where(flip, Yp.flip(-1), Yp), params[:, :3], grid,
                                 n_steps=n_steps, kept=kept)
        return d, torch.cat([p, mirror], 1)
    free = torch.tensor(grid.free, device=Xp.device)
    Xf = Xp.reshape(P, -1)

    def residual(Y, p, rows=slice(None)):
        # (warped, residual, loss, kept pixels, their count): the residual zeroed outside
        # the kept pixels
        W = fast_warp(Y, p)
        res = Xf[rows] - W.reshape(W.shape[0], -1)
        if not kept:
            return W, res, (res * res).sum(1), None, None
        inside = kept_pixels(Y, p).to(res.dtype).expand_as(W).reshape(W.shape[0], -1)
        res = res * inside
        count = inside.sum(1).clamp(min=1)
        return W, res, (res * res).sum(1) / count, inside, count

    if P == 0 or not grid.refine or not bool(free.any()):
        _, _, loss, _, count = residual(Yp, params)
        return loss if count is None else loss * count, params
    dtype = Xp.dtype
    params = params.clone()
    W, res, loss, inside, count = residual(Yp, params)
    mask = free.to(dtype)
    # each pair keeps its normal equations (J^T J, J^T r: 12 numbers), not its Jacobian
    # (3 values a pixel), so a step gathers and scatters only those for the pairs still moving
    JtJ, g = _normal_equations(W, params, res, mask, inside)
    del W, res, inside
    lam = torch.full((P,), 1e-3, dtype=dtype, device=Xp.device)
    fixed = (~free).to(dtype)
    rejected = torch.zeros(P, dtype=torch.long, device=Xp.device)
    # the pairs still moving (see REFINE_STOP_NOTE): each step warps only those
    active = torch.arange(P, device=Xp.device)
    for _ in range(n_steps):
        if active.numel() == 0:
            break
        Ha, la = JtJ[active], lam[active]
        diag = torch.diagonal(Ha, dim1=1, dim2=2)
        A = Ha + torch.diag_embed(la[:, None] * diag + 1e-9 + fixed)
        step = torch.linalg.solve(A, g[active]) * mask
        cand = _clamp_params(params[active] + step, grid)
        Wc, rc, lc, ic, cc = residual(Yp[active], cand, active)
        old = loss[active]
        better = lc < old
        bi = torch.nonzero(better).flatten()
        if bi.numel():
            ai = active[bi]
            params[ai] = cand[bi]
            loss[ai] = lc[bi]
            if kept:
                count[ai] = cc[bi]
            JtJ[ai], g[ai] = _normal_equations(Wc[bi], cand[bi], rc[bi], mask,
                                               None if ic is None else ic[bi])
        lam[active] = torch.where(better, la / 3.0, la * 4.0)
        rejected[active] = torch.where(better, torch.zeros_like(rejected[active]),
                                       rejected[active] + 1)
        gain = (old - lc) / old.clamp(min=torch.finfo(dtype).tiny)
        moving = torch.where(better, gain > _REFINE_GAIN, rejected[active] < _REFINE_REJECTIONS)
        active = active[moving]
    return (loss if count is None else loss * count), params


# Maintenance note (REFINE_STOP_NOTE): a pair leaves the Levenberg-Marquardt loop when an
# accepted step lowered its residual by less than _REFINE_GAIN (relative), or after
# _REFINE_REJECTIONS rejected steps in a row; the others take up to ``n_steps`` steps
# (measured: docs/design/defaults.rst).
_REFINE_GAIN = 1e-3
_REFINE_REJECTIONS = 1


def _normal_equations(W: torch.Tensor, params: torch.Tensor, res: torch.Tensor,
                      mask: torch.Tensor, inside: torch.Tensor | None = None):
    """``(J^T J, J^T r)`` of the warp's Jacobian at ``W = fast_warp(Y, params)``, the fixed
    parameters' rows and columns zeroed by ``mask``: ``(P, 3, 3)`` and ``(P, 3)``; only the
    pixels ``inside`` ``(P, F)`` (0 or 1) count where it is given."""
    Jt = warp_jacobian(W, params).transpose(1, 2)  # (P, 3, F), rows contiguous
    if inside is not None:
        Jt.mul_(inside[:, None, :])  # a fresh buffer: no second copy of the Jacobian
    JtJ = (Jt @ Jt.transpose(1, 2)) * (mask[:, None] * mask[None, :])
    g = (Jt @ res[..., None])[..., 0] * mask
    return JtJ, g


def _clamp_params(p: torch.Tensor, grid: SearchGrid) -> torch.Tensor:
    out = p.clone()
    if grid.max_rotation >= 180.0:
        out[:, 0] = wrap_degrees(out[:, 0])
    else:
        out[:, 0] = out[:, 0].clamp(-grid.max_rotation, grid.max_rotation)
    out[:, 1:] = out[:, 1:].clamp(-grid.max_translation, grid.max_translation)
    return out


def refine_pairs(X: torch.Tensor, Y: torch.Tensor, qi: torch.Tensor, kj: torch.Tensor,
                 params: torch.Tensor, grid: SearchGrid, *, max_pairs=None, kept=False):
    """Refine the pairs ``(X[qi], Y[kj])`` in memory-bounded batches; flat ``(P,)`` inputs;
    ``kept``: :func:`refine_alignments`'s."""
    release()  # what the search left free in the heap (see _heap.release)
    P = qi.shape[0]
    nf = X[0].numel()
    if max_pairs is None:
        # the kept pixels' masks and their warps add about 3 images' worth to a pair's 8
        max_pairs = max(1, _memory.REFINE_PAIR_ELEMENTS // (2 * nf if kept else nf))
    dist = torch.empty(P, dtype=X.dtype, device=X.device)
    out = torch.empty_like(params)
    with progress_bar(P, "refinement", "pair") as bar:
        for p0 in range(0, P, max_pairs):
            sl = slice(p0, p0 + max_pairs)
            d, p = refine_alignments(torch.index_select(X, 0, qi[sl]),
                                     torch.index_select(Y, 0, kj[sl]), params[sl], grid,
                                     kept=kept)
            dist[sl], out[sl] = d, p
            bar.update(d.shape[0])
    return dist, out


def all_pairs(X: torch.Tensor, Y: torch.Tensor, grid: SearchGrid, *, batch_size=None):
    """Grid search over every pair, then (``grid.refine``) refinement of every pair.

    Returns ``(D (n_x, n_y), params (n_x, n_y, grid.n_params))``.
    """
    D, P = grid_search(X, Y, grid, batch_size=batch_size)
    if grid.refine and any(grid.free):
        n_x, n_y = D.shape
        qi = torch.arange(n_x, device=X.device).repeat_interleave(n_y)
        kj = torch.arange(n_y, device=X.device).repeat(n_x)
        d, p = refine_pairs(X, Y, qi, kj, P.reshape(-1, P.shape[-1]), grid)
        D, P = d.reshape(n_x, n_y), p.reshape(n_x, n_y, -1)
    return D, P
