"""Shapes: the groups of samples that are transformed copies of one image.

Two samples are copies when their continuously refined invariant distance is within what the
resampling and the noise put between two copies of one image, both measured on the data:

- the **resampling residual of the edge's own alignment** ``T`` (warping ``x_j`` onto
  ``x_i``): ``e_ij = min(||x_j - T^-1 T x_j||, ||x_i - T T^-1 x_i||)`` on the pixels both warps
  keep inside the frame, the blur bilinear interpolation puts into a copy turned by ``T``
  (zero for a quarter turn or an integer shift, which move whole pixels;
  :func:`alignment_residual`);
- the **noise** left in the filtered images: ``2 nu^2``, ``nu^2 = E ||F n||^2`` for white noise
  ``n`` of the measured standard deviation through the fit's filter ``F``
  (:func:`noise_power`), the distance two independent noises put between two copies; at most
  the graph's shortest edge that the resampling does not explain, since two independent noises
  leave no two images closer (the estimate also reads an image's own fine detail as noise).

An edge is a copy edge when ``d_ij^2 <= e_ij^2 + noise``; the shapes are the connected
components of the copy edges (an exact duplicate is a copy under the identity). Only the edges
whose grid distance can still be a copy's are refined: by the triangle inequality the grid
leaves a copy at most ``g_j = ||x_j - T_g x_j||`` (``T_g``: half a grid step of rotation, half
a pixel of shift) farther than the refinement, and the residual of a turn is bounded by the
larger of the two images' residuals under a turn of ``min(45, max_rotation)`` degrees
(:func:`resampling_residual`). The measurements behind the rule: ``docs/design/shapes.rst``.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from . import _memory
from ._duplicates import first_of_each
from .search import refine_pairs
from .transforms import fast_warp, invert_se2

# The turn that bounds the resampling residual of any alignment, for the shortlist of edges
# refined, in degrees (at most the searched range): bilinear interpolation blurs alike at any
# angle away from a quarter turn (docs/design/shapes.rst)
PROBE_ROTATION = 45.0
# White-noise images drawn to measure the filtered noise's power
_NOISE_DRAWS = 8
# Frame pixels count as kept by a warp where it keeps at least this much of their weight
_KEPT = 1 - 1e-3


def _probe_params(grid, n, half_step=False):
    """``(n, 3)`` parameters of the probe (``half_step``: half a grid step of rotation and half
    a pixel of shift, the grid's worst miss; else a turn of ``min(45, max_rotation)`` degrees,
    or half a pixel of shift for the translation group), or None where the group has no
    transformation."""
    rot, trans, _ = grid.free
    h = np.zeros(3)
    if rot:
        if half_step:
            h[0] = 0.5 * (float(np.diff(np.sort(grid.angles)).min())
                          if len(grid.angles) > 1 else 2.0 * grid.max_rotation)
        else:
            h[0] = min(PROBE_ROTATION, float(grid.max_rotation))
    if trans and (half_step or not rot):
        h[1:] = 0.5
    if not h.any():
        return None
    return np.tile(h, (n, 1))


def _round_trip_residual(x, p):
    """``||x - T_p^-1 T_p x||`` on the pixels both warps keep inside the frame, per row."""
    ones = torch.ones_like(x[:, :1])
    inverse = invert_se2(p)
    kept = fast_warp(fast_warp(ones, p), inverse) >= _KEPT
    back = fast_warp(fast_warp(x, p), inverse)
    return torch.linalg.vector_norm(((x - back) * kept).reshape(len(x), -1), dim=1)


def _blocks(n, X):
    step = max(1, _memory.REFINE_PAIR_ELEMENTS // max(1, X[0].numel()))
    return range(0, n, step), step


def resampling_residual(X: torch.Tensor, grid, *, half_step=False) -> torch.Tensor:
    """The probe's residual for every image of ``X`` ``(n, C, H, W)``: ``||x - T^-1 T x||``
    (on the pixels kept in the frame), or with ``half_step`` the one-way ``||x - T_g x||``;
    zeros where the group has no transformation."""
    n = X.shape[0]
    out = torch.zeros(n, dtype=X.dtype, device=X.device)
    h = _probe_params(grid, n, half_step)
    if h is None or n == 0:
        return out
    h = torch.as_tensor(h, dtype=X.dtype, device=X.device)
    starts, step = _blocks(n, X)
    for i in starts:
        x = X[i:i + step]
        if half_step:
            out[i:i + len(x)] = torch.linalg.vector_norm(
                (x - fast_warp(x, h[:len(x)])).reshape(len(x), -1), dim=1)
        else:
            out[i:i + len(x)] = _round_trip_residual(x, h[:len(x)])
    return out


def alignment_residual(X, qi, kj, params):
    """``e_ij`` of the module's docstring for the pairs ``(qi, kj)`` whose alignments
    ``params`` warp ``X[kj]`` onto ``X[qi]``, in memory-bounded blocks of pairs."""
    m = qi.shape[0]
    out = torch.empty(m, dtype=X.dtype, device=X.device)
    p = params[:, :3].to(X.dtype)
    starts, step = _blocks(m, X)
    for s in starts:
        sl = slice(s, s + step)
        out[sl] = torch.minimum(_round_trip_residual(X[kj[sl]], p[sl]),
                                _round_trip_residual(X[qi[sl]], invert_se2(p[sl])))
    return out


def noise_power(filt, image_shape, device, dtype, pad=None) -> float:
    """``E ||F n||^2``: the squared norm white noise of the measured standard deviation keeps
    through the fit's filter ``filt`` (0 without noise), over ``_NOISE_DRAWS`` draws of a
    generator of its own (no global state is touched). ``pad``: the search's framing."""
    sigma = float(getattr(filt, "noise_std_", 0.0) or 0.0)
    if sigma <= 0:
        return 0.0
    gen = torch.Generator(device="cpu").manual_seed(0)
    noise = torch.randn((_NOISE_DRAWS, *image_shape), generator=gen, dtype=torch.float64)
    noise = (sigma * noise).to(device=device, dtype=dtype)
    if not filt.is_identity:
        noise = filt.filter_tensor(noise, in_place=True)
    if pad is not None:
        noise = pad(noise)
    return float(torch.linalg.vector_norm(noise.reshape(_NOISE_DRAWS, -1), dim=1).pow(2).mean())


def find_shapes(X: torch.Tensor, D: torch.Tensor, idx: torch.Tensor, P: torch.Tensor, grid,
                refine_grid, nu2: float):
    """The shapes of the images ``X`` from their invariant kNN graph on the grid (``D``:
    squared distances, ``idx``: neighbours, ``P``: alignments, each ``(n, k)``): ``rep``, each
    image's shape as its first image (lowest index), or None where every image is its own
    shape. ``refine_grid``: the grid of the refinement (none where ``refine=False``);
    ``nu2``: :func:`noise_power`."""
    n, k = idx.shape
    if n < 2 or k == 0:
        return None
    d2 = D.double()
    finite = torch.isfinite(d2)
    # the edges the grid leaves within reach of a copy's tolerance
    e = resampling_residual(X, grid).double()
    g = resampling_residual(X, grid, half_step=True).double()
    bound = (torch.maximum(e[:, None], e[idx]).pow(2) + 2.0 * nu2).sqrt() + g[idx]
    maybe = finite & (d2.clamp(min=0).sqrt() <= bound)
    pairs = torch.nonzero(maybe.reshape(-1)).ravel()
    if pairs.numel() == 0:
        return None
    qi = torch.div(pairs, k, rounding_mode="floor")
    kj = idx.reshape(-1)[pairs]
    d_pair = d2.reshape(-1)[pairs]
    p_pair = P.reshape(n * k, -1)[pairs]
    if refine_grid.refine and any(refine_grid.free):
        d_ref, p_ref = refine_pairs(X, X, qi, kj, p_pair, refine_grid)
        better = d_ref.double() < d_pair
        d_pair = torch.where(better, d_ref.double(), d_pair)
        p_pair = torch.where(better[:, None], p_ref.to(p_pair.dtype), p_pair)
    resampled = alignment_residual(X, qi, kj, p_pair).double().pow(2)
    # the noise: as measured, and no more than the shortest edge the resampling leaves
    # unexplained (the edges not refined are such edges, at their grid distance)
    rest = d2[finite & ~maybe]
    beyond = torch.cat([d_pair[d_pair > resampled], rest])
    shortest = float(beyond.min()) if beyond.numel() else float("inf")
    noise2 = min(2.0 * float(nu2), shortest)
    # explained by the resampling, or by the noise; where the shortest unexplained edge caps
    # the noise, that edge (and every copy of it) is the bound's evidence, not a copy
    copy = (d_pair <= resampled) | ((d_pair - resampled <= noise2)
                                    & ((noise2 < shortest) | (d_pair > shortest)))
    if not bool(copy.any()):
        return None
    rows, cols = qi[copy].cpu().numpy(), kj[copy].cpu().numpy()
    _, comp = connected_components(
        coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n)), directed=False)
    return first_of_each(comp)[comp]
