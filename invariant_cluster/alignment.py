"""Invariant distances and alignments under SE(2): grid search by matrix products, then refinement.

The search for ``min_tau ||x - T_tau y||^2`` over all pairs is the whole cost of invariant
clustering, so it is organised as dense linear algebra, never as a Python loop over pairs:

1. every key ``y_j`` is warped once per grid angle (one batched warp, ``n_y x R`` images);
2. integer translations are moved onto the queries: each rotated key lives on a canvas with a
   margin of ``max |shift|`` pixels, and ``<x, T y> = <P_(m-t) x, Z>`` exactly, so each query is
   placed ``S`` times on a zero canvas (see :func:`shift_images`);
3. all inner products ``<S_-t x_i, R_r y_j>`` are ONE matrix product per block,
   ``(b S, F) @ (F, c R)``; with ``||S_t z||^2`` (the energy of ``z`` that stays in the frame,
   an ``(n_y, R, S)`` table) this gives every grid distance, and a min over ``(S, R)`` the best
   grid point of every pair;
4. the best grid point of each kept pair is refined continuously (angle and sub-pixel shift) by
   a few batched Levenberg-Marquardt steps on the warped image (analytic Jacobian from the image
   gradient, step accepted only when the residual drops).

Memory is bounded by blocks: keys are processed in chunks and queries in blocks whose score
matrix stays under a byte budget (``batch_size`` fixes the number of queries per block).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ._utils import check_images, resolve_device, torch_dtype_for
from .transforms import rotation_grid, translation_grid, wrap_degrees

__all__ = ["invariant_distances", "SearchGrid", "make_search_grid"]

GROUPS = ("se2", "rotation", "translation", "none")
# Maintenance note: the score block ``(b * S, c * R)`` dominates memory; 64 M elements
# (256 MB in float32) keeps the GEMM efficient while leaving room for a few copies.
_BLOCK_ELEMENTS = 64 * 1024 * 1024


@dataclass(frozen=True)
class SearchGrid:
    """The transformations searched: angles in degrees, integer shifts, and refinement bounds.

    Build it with :func:`make_search_grid`, which validates the parameters.

    Examples
    --------
    >>> from invariant_cluster.alignment import make_search_grid
    >>> grid = make_search_grid("rotation", max_rotation=45.0, n_rotations=3)
    >>> grid.angles.tolist(), grid.shifts.tolist(), grid.size
    ([-45.0, 0.0, 45.0], [[0, 0]], 3)
    """

    group: str
    angles: np.ndarray  # (R,)
    shifts: np.ndarray  # (S, 2) integer (tx, ty), zero first
    max_rotation: float
    max_translation: float
    refine: bool

    @property
    def free(self) -> tuple[bool, bool, bool]:
        rot = self.group in ("se2", "rotation") and self.max_rotation > 0
        trans = self.group in ("se2", "translation") and self.max_translation > 0
        return (rot, trans, trans)

    @property
    def size(self) -> int:
        return len(self.angles) * len(self.shifts)


def make_search_grid(group="se2", max_rotation=180.0, n_rotations=36, max_translation=0,
                     refine=True) -> SearchGrid:
    """Validate the search parameters and build the :class:`SearchGrid`.

    The parameters are those of :func:`invariant_cluster.invariant_distances`: the ``group``
    (``"se2"``, ``"rotation"``, ``"translation"`` or ``"none"``), ``n_rotations`` angles within
    ``+-max_rotation`` degrees (:func:`~invariant_cluster.transforms.rotation_grid`), integer
    shifts within ``+-max_translation`` pixels
    (:func:`~invariant_cluster.transforms.translation_grid`), and whether to ``refine``.

    Examples
    --------
    >>> from invariant_cluster.alignment import make_search_grid
    >>> grid = make_search_grid("se2", max_rotation=180.0, n_rotations=36, max_translation=2)
    >>> len(grid.angles), len(grid.shifts), grid.size
    (36, 25, 900)
    >>> make_search_grid("none").size  # nothing searched: plain Euclidean distances
    1
    """
    if not isinstance(group, str) or group not in GROUPS:
        raise ValueError(f"group: expected one of {GROUPS}, got {group!r}")
    for name, val in (("max_rotation", max_rotation), ("max_translation", max_translation)):
        if isinstance(val, bool) or not isinstance(val, numbers.Real):
            raise TypeError(f"{name}: expected a real number, got {val!r}")
        if not math.isfinite(val) or val < 0:
            raise ValueError(f"{name}: expected a finite number >= 0, got {val!r}")
    if isinstance(n_rotations, bool) or not isinstance(n_rotations, numbers.Integral):
        raise TypeError(f"n_rotations: expected an int >= 1, got {n_rotations!r}")
    if n_rotations < 1:
        raise ValueError(f"n_rotations: expected an int >= 1, got {n_rotations!r}")
    max_rotation = float(min(max_rotation, 180.0))
    rot = group in ("se2", "rotation")
    trans = group in ("se2", "translation")
    angles = rotation_grid(max_rotation, int(n_rotations)) if rot else np.zeros(1)
    shifts = translation_grid(max_translation) if trans else np.zeros((1, 2))
    return SearchGrid(group, angles, shifts.astype(np.int64),
                      max_rotation if rot else 0.0,
                      float(max_translation) if trans else 0.0, bool(refine))


# ----------------------------------------------------------------------------- warps
def _affine_grid(params: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Sampling grid ``(B, H, W, 2)`` in normalised coordinates for SE(2) ``params``.

    Maintenance note: this is the inverse map of :func:`transforms.se2_matrices`
    (destination ``u`` -> source ``R^-1 (u - c - t) + c``) folded with the normalisation into one
    ``(B, 2, 3)`` matrix, then applied to all pixels as ONE ``(HW, 3) @ (3, 2B)`` product. kornia's
    ``warp_affine`` (like ``F.affine_grid``) does a batched ``3 x 3`` product per image, which costs
    ~90% of a small-image warp on CPU; ``tests/test_alignment.py`` pins this path to kornia's.
    """
    dtype, device = params.dtype, params.device
    n = params.shape[0]
    ang = params[:, 0] * (math.pi / 180.0)
    cos, sin = torch.cos(ang), torch.sin(ang)
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    sx, sy = 2.0 / max(width - 1, 1), 2.0 / max(height - 1, 1)
    ox, oy = cx + params[:, 1], cy + params[:, 2]
    bx = (-cos * ox + sin * oy + cx) * sx - 1.0
    by = (-sin * ox - cos * oy + cy) * sy - 1.0
    theta = torch.stack([torch.stack([cos * sx, -sin * sx, bx], 0),
                         torch.stack([sin * sy, cos * sy, by], 0)], 1)  # (3, 2, B)
    ys, xs = torch.meshgrid(torch.arange(height, dtype=dtype, device=device),
                            torch.arange(width, dtype=dtype, device=device), indexing="ij")
    base = torch.stack([xs.reshape(-1), ys.reshape(-1), torch.ones_like(xs).reshape(-1)], 1)
    grid = base @ theta.permute(0, 2, 1).reshape(3, n * 2)  # (HW, B * 2)
    return grid.reshape(height, width, n, 2).permute(2, 0, 1, 3)


def fast_warp(images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """:func:`warp_se2` for ``(B, C, H, W)`` tensors, same convention, bilinear, zero padding."""
    b, _, h, w = images.shape
    if b == 0:
        return images
    grid = _affine_grid(params.to(images.dtype), h, w)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros",
                         align_corners=True)


def shift_margin(shifts: np.ndarray) -> int:
    """The canvas margin ``m = max |shift|`` that the shifted search needs."""
    return int(np.abs(shifts).max()) if len(shifts) else 0


def warp_keys(Y: torch.Tensor, angles: torch.Tensor, pad: int = 0) -> torch.Tensor:
    """Every image rotated by every angle onto a canvas with a margin of ``pad`` pixels.

    ``(n, C, H, W) -> (n, R, C (H + 2 pad) (W + 2 pad))``. The rotation is about the image's own
    centre (the canvas is padded symmetrically), and what a rotation moves outside ``H x W`` but
    inside the margin is kept, so that a later shift by at most ``pad`` pixels brings it back
    exactly as one ``warp_se2`` with the composed transformation would.
    """
    if pad:
        Y = F.pad(Y, (pad, pad, pad, pad))
    n = Y.shape[0]
    R = angles.shape[0]
    out = torch.empty((n, R, Y[0].numel()), dtype=Y.dtype, device=Y.device)
    for r in range(R):  # a loop over the (few) angles, each one batched warp of all keys
        if float(angles[r]) == 0.0:
            out[:, r] = Y.reshape(n, -1)
        else:
            p = torch.zeros((n, 3), dtype=Y.dtype, device=Y.device)
            p[:, 0] = angles[r]
            out[:, r] = fast_warp(Y, p).reshape(n, -1)
    return out


def shift_images(X: torch.Tensor, shifts: np.ndarray) -> torch.Tensor:
    """Each query placed on the search canvas once per shift: ``(b, S, C (H+2m) (W+2m))``.

    Maintenance note: with ``Z`` a key rotated onto the canvas (margin ``m``, see
    :func:`warp_keys`), ``warp_se2(y, (angle, t))(u) = Z(u + m - t)`` exactly, so
    ``<x, T y> = <P_(m - t) x, Z>`` where ``P_o`` places ``x`` at offset ``o`` of a zero canvas.
    Moving the shift onto the query keeps all shifts and angles in ONE matrix product.
    """
    b, c, h, w = X.shape
    m = shift_margin(shifts)
    if m == 0:
        return X.reshape(b, 1, -1)
    out = X.new_zeros((b, len(shifts), c, h + 2 * m, w + 2 * m))
    for s, (tx, ty) in enumerate(shifts):
        out[:, s, :, m - ty:m - ty + h, m - tx:m - tx + w] = X
    return out.reshape(b, len(shifts), -1)


def shift_energies(Kw: torch.Tensor, shifts: np.ndarray, shape) -> torch.Tensor:
    """``||T y||^2`` per grid point: the energy of the canvas ``Z`` in the ``H x W`` window at
    offset ``m - t`` (what the shift brings into the frame). ``Kw`` from :func:`warp_keys` with
    ``pad = m``; ``shape`` is the original ``(C, H, W)``; returns ``(n, R, S)``."""
    c, h, w = shape
    m = shift_margin(shifts)
    sq = (Kw * Kw).reshape(*Kw.shape[:2], c, h + 2 * m, w + 2 * m).sum(2)  # (n, R, Hp, Wp)
    out = [sq[:, :, m - ty:m - ty + h, m - tx:m - tx + w].sum((-1, -2)) for tx, ty in shifts]
    return torch.stack(out, -1)


# ----------------------------------------------------------------------------- grid search
def _query_block_size(n_keys_chunk: int, grid: SearchGrid, batch_size) -> int:
    if batch_size is not None:
        return int(batch_size)
    per_query = max(1, len(grid.shifts) * n_keys_chunk * len(grid.angles))
    return int(max(1, min(4096, _BLOCK_ELEMENTS // per_query)))


def _key_chunk_size(n_keys: int, n_features: int, grid: SearchGrid) -> int:
    # warped keys of one chunk stay under the same element budget as a score block
    per_key = max(1, len(grid.angles) * n_features)
    return int(max(1, min(n_keys, _BLOCK_ELEMENTS // per_key)))


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
        Queries per block (None: sized from a memory budget).
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
    shape = tuple(X.shape[1:])
    m = shift_margin(grid.shifts)
    nf = X.shape[1] * (X.shape[2] + 2 * m) * (X.shape[3] + 2 * m)  # canvas size
    device, dtype = X.device, X.dtype
    angles = torch.as_tensor(grid.angles, dtype=dtype, device=device)
    shifts_t = torch.as_tensor(grid.shifts, dtype=dtype, device=device)
    R, S = len(grid.angles), len(grid.shifts)
    xsq = (X.reshape(n_x, -1) ** 2).sum(1)
    if k is None:
        dist = torch.empty((n_x, n_y), dtype=dtype, device=device)
        best = torch.empty((n_x, n_y), dtype=torch.long, device=device)
    else:
        k = int(min(k, n_y - (1 if exclude is not None else 0)))
        dist = torch.full((n_x, k), math.inf, dtype=dtype, device=device)
        best = torch.zeros((n_x, k), dtype=torch.long, device=device)
        index = torch.zeros((n_x, k), dtype=torch.long, device=device)
    kc = _key_chunk_size(n_y, nf, grid)
    for k0 in range(0, n_y, kc):
        Kw = warp_keys(Y[k0:k0 + kc], angles, pad=m)  # (c, R, F)
        c = Kw.shape[0]
        E = shift_energies(Kw, grid.shifts, shape).permute(1, 2, 0)  # (R, S, c)
        Kflat = Kw.reshape(c * R, nf)
        qb = _query_block_size(c, grid, batch_size)
        for q0 in range(0, n_x, qb):
            Q = shift_images(X[q0:q0 + qb], grid.shifts)  # (b, S, F)
            b = Q.shape[0]
            scores = (Q.reshape(b * S, nf) @ Kflat.T).reshape(b, S, c, R)
            d = scores.permute(0, 3, 1, 2).mul_(-2.0)  # (b, R, S, c) view
            d = d + E[None] + xsq[q0:q0 + b, None, None, None]
            d = d.reshape(b, R * S, c)
            dmin, arg = d.min(1)  # (b, c); arg = r * S + s
            dmin.clamp_(min=0.0)
            if exclude is not None:
                ex = exclude[q0:q0 + b] - k0
                rows = torch.nonzero((ex >= 0) & (ex < c)).flatten()
                dmin[rows, ex[rows]] = math.inf
            if k is None:
                dist[q0:q0 + b, k0:k0 + c] = dmin
                best[q0:q0 + b, k0:k0 + c] = arg
            else:
                cand_d = torch.cat([dist[q0:q0 + b], dmin], 1)
                cand_i = torch.cat([index[q0:q0 + b],
                                    torch.arange(k0, k0 + c, device=device).expand(b, c)], 1)
                cand_a = torch.cat([best[q0:q0 + b], arg], 1)
                top_d, pos = torch.topk(cand_d, k, dim=1, largest=False, sorted=True)
                dist[q0:q0 + b] = top_d
                index[q0:q0 + b] = cand_i.gather(1, pos)
                best[q0:q0 + b] = cand_a.gather(1, pos)
    r_idx, s_idx = best // S, best % S
    params = torch.stack([angles[r_idx], shifts_t[s_idx, 0], shifts_t[s_idx, 1]], -1)
    if k is None:
        return dist, params
    return dist, index, params


# ----------------------------------------------------------------------------- refinement
def _image_gradients(W: torch.Tensor):
    """Central-difference gradients ``(d/dx, d/dy)`` of ``(P, C, H, W)`` images."""
    gx = torch.zeros_like(W)
    gy = torch.zeros_like(W)
    gx[..., 1:-1] = 0.5 * (W[..., 2:] - W[..., :-2])
    gy[..., 1:-1, :] = 0.5 * (W[..., 2:, :] - W[..., :-2, :])
    return gx, gy


def _jacobian(W: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """d warp(y, tau) / d tau from the warped image's gradient: ``(P, F, 3)``.

    Content at ``u`` moves with velocity ``(1, 0)``/``(0, 1)`` per pixel of ``tx``/``ty`` and
    ``G (u - c - t) * pi / 180`` per degree, ``G w = (w_y, -w_x)`` (counter-clockwise as
    displayed, y down), so ``d (T y)(u) = -grad(T y)(u) . velocity``.
    """
    P, C, H, Wd = W.shape
    gx, gy = _image_gradients(W)
    ys = torch.arange(H, dtype=W.dtype, device=W.device)[None, None, :, None]
    xs = torch.arange(Wd, dtype=W.dtype, device=W.device)[None, None, None, :]
    wx = xs - (Wd - 1) / 2.0 - params[:, 1, None, None, None]
    wy = ys - (H - 1) / 2.0 - params[:, 2, None, None, None]
    d_ang = -(gx * wy - gy * wx) * (math.pi / 180.0)
    return torch.stack([d_ang.reshape(P, -1), -gx.reshape(P, -1), -gy.reshape(P, -1)], -1)


def refine_alignments(Xp: torch.Tensor, Yp: torch.Tensor, params: torch.Tensor,
                      grid: SearchGrid, n_steps: int = 8):
    """Refine ``params`` so that ``fast_warp(Yp, params)`` matches ``Xp``, pair by pair.

    Batched Levenberg-Marquardt over all pairs at once: a step is accepted only where it lowers
    the pair's residual, so the result is never worse than the start. Angles stay within
    ``+-max_rotation`` (no bound for the full circle) and shifts within ``+-max_translation``.

    Returns ``(dist, params)`` with ``dist[p] = ||Xp[p] - warp(Yp[p], params[p])||^2``.
    """
    P = Xp.shape[0]
    free = torch.tensor(grid.free, device=Xp.device)
    if P == 0 or not grid.refine or not bool(free.any()):
        W = fast_warp(Yp, params)
        return ((Xp - W) ** 2).reshape(P, -1).sum(1), params
    dtype = Xp.dtype
    params = params.clone()
    Xf = Xp.reshape(P, -1)
    W = fast_warp(Yp, params)
    res = Xf - W.reshape(P, -1)
    loss = (res * res).sum(1)
    J = _jacobian(W, params) * free.to(dtype)
    lam = torch.full((P,), 1e-3, dtype=dtype, device=Xp.device)
    fixed = (~free).to(dtype)
    for _ in range(n_steps):
        JtJ = J.transpose(1, 2) @ J
        g = (J.transpose(1, 2) @ res[..., None])[..., 0]
        diag = torch.diagonal(JtJ, dim1=1, dim2=2)
        A = JtJ + torch.diag_embed(lam[:, None] * diag + 1e-9 + fixed)
        step = torch.linalg.solve(A, g) * free.to(dtype)
        cand = params + step
        cand = _clamp_params(cand, grid)
        Wc = fast_warp(Yp, cand)
        rc = Xf - Wc.reshape(P, -1)
        lc = (rc * rc).sum(1)
        better = lc < loss
        if bool(better.any()):
            bi = torch.nonzero(better).flatten()
            params[bi] = cand[bi]
            loss[bi] = lc[bi]
            res[bi] = rc[bi]
            J[bi] = _jacobian(Wc[bi], cand[bi]) * free.to(dtype)
        lam = torch.where(better, lam / 3.0, lam * 4.0)
    return loss, params


def _clamp_params(p: torch.Tensor, grid: SearchGrid) -> torch.Tensor:
    out = p.clone()
    if grid.max_rotation >= 180.0:
        out[:, 0] = wrap_degrees(out[:, 0])
    else:
        out[:, 0] = out[:, 0].clamp(-grid.max_rotation, grid.max_rotation)
    out[:, 1:] = out[:, 1:].clamp(-grid.max_translation, grid.max_translation)
    return out


def refine_pairs(X: torch.Tensor, Y: torch.Tensor, qi: torch.Tensor, kj: torch.Tensor,
                 params: torch.Tensor, grid: SearchGrid, *, max_pairs=None):
    """Refine the pairs ``(X[qi], Y[kj])`` in memory-bounded batches; flat ``(P,)`` inputs."""
    P = qi.shape[0]
    nf = X[0].numel()
    if max_pairs is None:
        max_pairs = max(1, (_BLOCK_ELEMENTS // 8) // nf)
    dist = torch.empty(P, dtype=X.dtype, device=X.device)
    out = torch.empty_like(params)
    for p0 in range(0, P, max_pairs):
        sl = slice(p0, p0 + max_pairs)
        d, p = refine_alignments(X[qi[sl]], Y[kj[sl]], params[sl], grid)
        dist[sl], out[sl] = d, p
    return dist, out


def all_pairs(X: torch.Tensor, Y: torch.Tensor, grid: SearchGrid, *, batch_size=None):
    """Grid search over every pair, then (``grid.refine``) refinement of every pair.

    Returns ``(D (n_x, n_y), params (n_x, n_y, 3))``.
    """
    D, P = grid_search(X, Y, grid, batch_size=batch_size)
    if grid.refine and any(grid.free):
        n_x, n_y = D.shape
        qi = torch.arange(n_x, device=X.device).repeat_interleave(n_y)
        kj = torch.arange(n_y, device=X.device).repeat(n_x)
        d, p = refine_pairs(X, Y, qi, kj, P.reshape(-1, 3), grid)
        D, P = d.reshape(n_x, n_y), p.reshape(n_x, n_y, 3)
    return D, P


# ----------------------------------------------------------------------------- public
def to_images(X, *, name, image_shape=None, device, min_samples=1):
    """Validate and convert to a ``(n, C, H, W)`` tensor on ``device``; also return the kind."""
    is_numpy = not isinstance(X, torch.Tensor)
    Xf, shape = check_images(X, name=name, image_shape=image_shape, min_samples=min_samples)
    t = torch.as_tensor(Xf) if is_numpy else Xf
    dtype = torch_dtype_for(Xf)
    return t.to(device=device, dtype=dtype).reshape(-1, *shape), shape, is_numpy


def invariant_distances(X, Y=None, *, group="se2", max_rotation=180.0, n_rotations=36,
                        max_translation=0, refine=True, image_shape=None, device="auto",
                        batch_size=None, return_alignments=False):
    """Invariant squared distances ``D[i, j] = min_tau ||X_i - T_tau Y_j||^2``.

    Parameters
    ----------
    X : array-like or torch.Tensor of shape (n_x, n_features), (n_x, H, W) or (n_x, C, H, W)
        Query images (flat rows are folded with ``image_shape``).
    Y : same kinds as ``X``, optional
        Key images; None means ``X``.
    group : {"se2", "rotation", "translation", "none"}
        The transformations searched. "none" gives plain squared Euclidean distances.
    max_rotation : float, default=180.0
        Angles are searched within ``+-max_rotation`` degrees (180: the full circle).
    n_rotations : int, default=36
        Number of grid angles (see :func:`transforms.rotation_grid`; 0 is always on the grid).
    max_translation : float, default=0
        Shifts are searched on the integer grid within ``+-max_translation`` pixels, then refined
        continuously within that bound.
    refine : bool, default=True
        Refine every pair's best grid point continuously (Levenberg-Marquardt on the warp).
    image_shape : tuple (H, W) or (C, H, W), optional
        How to fold flat rows; None means square single-channel images.
    device : {"auto", "cpu", "cuda", ...}, default="auto"
    batch_size : int, optional
        Queries per block of the grid search; None sizes blocks from a memory budget.
    return_alignments : bool, default=False
        Also return ``tau`` of shape ``(n_x, n_y, 3)``: the parameters (angle in degrees,
        tx, ty in pixels) that warp ``Y_j`` onto ``X_i``, so ``warp_se2(Y[j], tau[i, j])`` is the
        aligned image.

    Returns
    -------
    D : ndarray or torch.Tensor of shape (n_x, n_y)
        NumPy for NumPy input (float64 for float64 input, else float32), torch (on ``device``)
        for torch input.
    tau : same kind, shape (n_x, n_y, 3), only with ``return_alignments=True``

    Notes
    -----
    Cost: one batched warp of the keys per grid angle, and ``n_x n_y R S F`` multiply-adds in
    matrix products (``R`` angles, ``S`` integer shifts, ``F`` pixels), plus ``~8`` warps per pair
    when ``refine=True`` (the refinement of all ``n_x n_y`` pairs dominates for large inputs;
    :class:`InvariantAttentionClusterer` refines only the kept neighbours).
    Distances from the grid are computed as ``||x||^2 + ||T y||^2 - 2 <x, T y>`` (clamped at 0);
    refined ones directly from the residual. ``||T y||^2`` counts only what stays in the frame.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import invariant_distances
    >>> x = np.random.default_rng(0).random((1, 8, 8))
    >>> y = np.rot90(x, k=1, axes=(1, 2)).copy()       # a quarter turn
    >>> D = invariant_distances(x, y, group="rotation", n_rotations=4, refine=False)
    >>> bool(D[0, 0] < 1e-6)
    True
    """
    dev = resolve_device(device)
    grid = make_search_grid(group, max_rotation, n_rotations, max_translation, refine)
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, numbers.Integral)
                                   or batch_size < 1):
        raise ValueError(f"batch_size: expected None or an int >= 1, got {batch_size!r}")
    Xt, shape, is_numpy = to_images(X, name="X", image_shape=image_shape, device=dev)
    if Y is None:
        Yt = Xt
    else:
        Yt, yshape, _ = to_images(Y, name="Y", image_shape=image_shape, device=dev)
        if yshape != shape:
            raise ValueError(f"Y: expected images of shape {shape} like X, got {yshape}")
        if Yt.dtype != Xt.dtype:
            Xt, Yt = Xt.double(), Yt.double()
    with torch.no_grad():
        D, P = all_pairs(Xt, Yt, grid, batch_size=batch_size)
    if is_numpy:
        D = D.cpu().numpy()
        P = P.cpu().numpy().astype(np.float64)
    return (D, P) if return_alignments else D
