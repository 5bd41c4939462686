"""Shapes: the groups of samples that are transformed copies of one image.

Two samples are copies when their continuously refined invariant distance is within what
the resampling and the noise put between two copies of one image, both measured on the data:

- the **resampling residual** ``e_i = ||x_i - T_h^-1 T_h x_i||`` of each image, ``T_h`` a
  rotation by ``min(45, max_rotation)`` degrees (a half-pixel shift for the translation group):
  the blur of bilinear interpolation, with what the rotation moves out of the frame, that a
  copy made by warping carries (:func:`resampling_residual`);
- the **noise** left in the filtered images, ``nu^2 = E ||F n||^2`` for white noise ``n`` of
  the measured standard deviation through the fit's filter ``F`` (:func:`noise_power`); two
  noisy copies differ by about ``2 nu^2`` more.

An edge ``(i, j)`` of the invariant kNN graph is a copy edge when
``d_ij^2 <= max(e_i, e_j)^2 + 2 nu^2``, and the shapes are the connected components of the
copy edges (an exact duplicate is a copy under the identity). Only the edges whose grid
distance can still be a copy's are refined: by the triangle inequality the grid leaves a copy
at most ``g_j = ||x_j - T_g x_j||`` (``T_g`` half a grid step of rotation) farther than the
refinement does. The measurements behind the rule: ``docs/design/shapes.rst``.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from . import _memory
from ._duplicates import first_of_each
from .search import refine_pairs
from .transforms import fast_warp

# The rotation of the resampling probe, in degrees (at most the searched range): the blur of
# bilinear interpolation is the same at any angle away from a quarter turn (docs/design/shapes.rst)
PROBE_ROTATION = 45.0
# White-noise images drawn to measure the filtered noise's power
_NOISE_DRAWS = 8


def _probe_params(grid, n, half_step=False):
    """``(n, 3)`` parameters of the probe ``T_h`` (``half_step``: ``T_g``, half a grid step of
    rotation, the grid's worst miss), or None where the group has no transformation."""
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


def resampling_residual(X: torch.Tensor, grid, *, half_step=False) -> torch.Tensor:
    """``||x - T^-1 T x||`` for every image of ``X`` ``(n, C, H, W)`` (``T``: the probe of the
    module's docstring; ``half_step``: ``||x - T_g x||``), in memory-bounded blocks; zeros where
    the group has no transformation."""
    n = X.shape[0]
    out = torch.zeros(n, dtype=X.dtype, device=X.device)
    h = _probe_params(grid, n, half_step)
    if h is None or n == 0:
        return out
    h = torch.as_tensor(h, dtype=X.dtype, device=X.device)
    # the pixels the probe keeps inside the frame: a copy made by warping has lost what left
    # the frame, and so has the copy it is compared with
    ones = torch.ones_like(X[:1])
    kept = fast_warp(ones, h[:1])
    kept = kept if half_step else fast_warp(kept, -h[:1])
    kept = (kept >= 1 - 1e-3).to(X.dtype)
    step = max(1, _memory.REFINE_PAIR_ELEMENTS // max(1, X[0].numel()))
    for i in range(0, n, step):
        x = X[i:i + step]
        y = fast_warp(x, h[:len(x)])
        if not half_step:
            y = fast_warp(y, -h[:len(x)])
        out[i:i + len(x)] = torch.linalg.vector_norm(((x - y) * kept).reshape(len(x), -1),
                                                     dim=1)
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
    shape. ``nu2``: :func:`noise_power`."""
    n, k = idx.shape
    if n < 2 or k == 0:
        return None
    e = resampling_residual(X, grid).double()
    g = resampling_residual(X, grid, half_step=True).double()
    tol2 = torch.minimum(e[:, None], e[idx]).pow(2)  # (n, k): the resampling's part
    d2 = D.double()
    # two independent noises put 2 nu^2 between two copies, and no two images closer than
    # that unless they are copies under the resampling alone: the smallest other edge bounds
    # the noise as measured (the estimate reads an image's own fine detail as noise too: the
    # edges of 8 x 8 digits)
    beyond = torch.isfinite(d2) & (d2 > tol2)
    noise2 = min(2.0 * float(nu2), float(d2[beyond].min())) if bool(beyond.any()) else 0.0
    tol2 = tol2 + noise2
    # the grid's distance can still be a copy's: d_grid <= sqrt(tol2) + g_j
    maybe = torch.isfinite(d2) & (d2.clamp(min=0).sqrt() <= tol2.sqrt() + g[idx])
    pairs = torch.nonzero(maybe.reshape(-1)).ravel()
    if pairs.numel() == 0:
        return None
    qi = torch.div(pairs, k, rounding_mode="floor")
    kj = idx.reshape(-1)[pairs]
    d_grid = d2.reshape(-1)[pairs]
    if refine_grid.refine and any(refine_grid.free):
        d_ref, _ = refine_pairs(X, X, qi, kj, P.reshape(n * k, -1)[pairs], refine_grid)
        d_ref = torch.minimum(d_grid, d_ref.double())
    else:
        d_ref = d_grid
    copy = d_ref <= tol2.reshape(-1)[pairs]
    if not bool(copy.any()):
        return None
    rows, cols = qi[copy].cpu().numpy(), kj[copy].cpu().numpy()
    _, comp = connected_components(
        coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n)), directed=False)
    return first_of_each(comp)[comp]
