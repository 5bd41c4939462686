"""SE(2) transformations of images: parameters, affine matrices, warps and search grids.

Convention
----------
This module is the one place that fixes the convention, and the one place that calls kornia.

- A transformation is ``tau = (angle, tx, ty)``: ``angle`` in **degrees**, positive is
  **counter-clockwise as the image is displayed** (row 0 at the top), ``tx`` and ``ty`` in
  **pixels**, ``tx`` to the right and ``ty`` downwards.
- Pixel ``(x, y)`` has its origin at the centre of the top-left pixel; the image centre is
  ``c = ((W - 1) / 2, (H - 1) / 2)``, as ``kornia.geometry.transform.rotate`` uses.
- ``T_tau`` moves the content at ``p`` to ``c + R(angle) (p - c) + t``, i.e.
  ``(T_tau x)(u) = x(R^-1 (u - c - t) + c)``: rotate about the centre, then translate.
  In pixel coordinates (y pointing down) ``R(angle) = [[cos, sin], [-sin, cos]]``, which is
  ``kornia.geometry.transform.get_rotation_matrix2d`` (and OpenCV's ``getRotationMatrix2D``).
  Note that ``kornia.geometry.transform.get_affine_matrix2d`` uses the opposite sign in kornia 0.9;
  a unit test pins both facts.
- Sampling is bilinear with zero padding (``align_corners=True``), so rotations by multiples of
  90 degrees of a square image and integer translations are exact up to round-off.
- Composition: ``T_a T_b = T_(a o b)`` with ``a o b = (angle_a + angle_b, R_a t_b + t_a)``;
  inverse ``(-angle, -R^-1 t)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "warp_se2",
    "se2_matrices",
    "compose_se2",
    "invert_se2",
    "rotation_grid",
    "translation_grid",
]


def se2_matrices(params: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Forward affine matrices ``(B, 2, 3)`` of SE(2) parameters ``(B, 3)`` (degrees, pixels).

    The matrix maps a source pixel to its destination (kornia's ``warp_affine`` convention).
    Differentiable in ``params``; follows its device and dtype.

    Examples
    --------
    >>> import torch
    >>> from invariant_cluster.transforms import se2_matrices
    >>> M = se2_matrices(torch.tensor([[90.0, 0.0, 0.0]]), 5, 5)  # a quarter turn about (2, 2)
    >>> [[round(v, 6) + 0.0 for v in row] for row in M[0].tolist()]
    [[0.0, 1.0, 0.0], [-1.0, 0.0, 4.0]]
    """
    angle = params[:, 0] * (math.pi / 180.0)
    cos, sin = torch.cos(angle), torch.sin(angle)
    cx = (width - 1) / 2.0
    cy = (height - 1) / 2.0
    tx = params[:, 1] + cx - (cos * cx + sin * cy)
    ty = params[:, 2] + cy - (-sin * cx + cos * cy)
    row0 = torch.stack([cos, sin, tx], dim=-1)
    row1 = torch.stack([-sin, cos, ty], dim=-1)
    return torch.stack([row0, row1], dim=-2)


def _as_params(params, n, like: torch.Tensor) -> torch.Tensor:
    p = params if isinstance(params, torch.Tensor) else torch.as_tensor(np.asarray(params))
    if p.is_complex() or not (p.is_floating_point() or p.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"params: expected real numbers, got dtype {p.dtype}")
    p = p.to(device=like.device, dtype=like.dtype)
    if p.ndim == 1 and p.shape[0] == 3:
        p = p.expand(n, 3)
    if p.ndim != 2 or p.shape[1] != 3 or p.shape[0] not in (1, n):
        raise ValueError(
            f"params: expected shape ({n}, 3) = (angle in degrees, tx, ty), got {tuple(p.shape)}"
        )
    if not torch.isfinite(p).all():
        raise ValueError("params: contains NaN or infinity")
    return p.expand(n, 3)


def warp_se2(images, params):
    """Warp each image by its SE(2) transformation (rotation about the centre, then translation).

    Parameters
    ----------
    images : array-like or torch.Tensor of shape (B, H, W) or (B, C, H, W)
    params : array-like or torch.Tensor of shape (B, 3) or (3,)
        ``(angle in degrees counter-clockwise, tx, ty in pixels)`` per image (a single row is
        broadcast). See the module's Convention.

    Returns
    -------
    warped : same type and shape as ``images``
        NumPy in, NumPy out; torch in, torch out on the same device and dtype, differentiable
        with respect to both ``images`` and ``params``.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import warp_se2
    >>> img = np.zeros((1, 5, 5), dtype=np.float32); img[0, 2, 4] = 1.0  # right of centre
    >>> out = warp_se2(img, [[90.0, 0.0, 0.0]])                          # counter-clockwise
    >>> [int(v) for v in np.unravel_index(out[0].argmax(), (5, 5))]      # now above the centre
    [0, 2]
    """
    from kornia.geometry.transform import warp_affine

    is_numpy = not isinstance(images, torch.Tensor)
    if is_numpy:
        images = np.asarray(images)
        if images.dtype == object or not (np.issubdtype(images.dtype, np.number)
                                          or images.dtype == bool):
            raise TypeError(f"images: expected a real numeric array, got dtype {images.dtype}")
    x = torch.as_tensor(images) if is_numpy else images
    if x.is_complex() or not x.is_floating_point():
        if x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"images: expected a real floating dtype, got {x.dtype}")
        x = x.to(torch.float32)
    if x.ndim not in (3, 4):
        raise ValueError(f"images: expected shape (B, H, W) or (B, C, H, W), got {tuple(x.shape)}")
    squeeze = x.ndim == 3
    if squeeze:
        x = x.unsqueeze(1)
    n, _, h, w = x.shape
    p = _as_params(params, n, x)
    if n == 0:
        out = x
    else:
        out = warp_affine(x, se2_matrices(p, h, w), (h, w), mode="bilinear",
                          padding_mode="zeros", align_corners=True)
    if squeeze:
        out = out.squeeze(1)
    return out.detach().cpu().numpy() if is_numpy else out


def compose_se2(a, b):
    """Parameters of ``T_a T_b`` (apply ``b`` first), for ``(..., 3)`` arrays or tensors.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.transforms import compose_se2
    >>> turn, right = np.array([90.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])
    >>> (np.round(compose_se2(turn, right), 6) + 0.0).tolist()  # the shift turns upwards
    [90.0, 0.0, -1.0]
    """
    lib = torch if isinstance(a, torch.Tensor) else np
    ang = a[..., 0] * (math.pi / 180.0)
    cos, sin = lib.cos(ang), lib.sin(ang)
    tx = cos * b[..., 1] + sin * b[..., 2] + a[..., 1]
    ty = -sin * b[..., 1] + cos * b[..., 2] + a[..., 2]
    return lib.stack([wrap_degrees(a[..., 0] + b[..., 0]), tx, ty], -1)


def invert_se2(a):
    """Parameters of ``T_a^-1``, for ``(..., 3)`` arrays or tensors.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.transforms import compose_se2, invert_se2
    >>> a = np.array([30.0, 2.0, -1.0])
    >>> bool(np.allclose(compose_se2(a, invert_se2(a)), 0.0))
    True
    """
    lib = torch if isinstance(a, torch.Tensor) else np
    ang = a[..., 0] * (math.pi / 180.0)
    cos, sin = lib.cos(ang), lib.sin(ang)
    # R^-1 = R^T = [[cos, -sin], [sin, cos]]
    tx = -(cos * a[..., 1] - sin * a[..., 2])
    ty = -(sin * a[..., 1] + cos * a[..., 2])
    return lib.stack([-a[..., 0], tx, ty], -1)


def wrap_degrees(angle):
    """Angles wrapped into ``[-180, 180)``."""
    return (angle + 180.0) % 360.0 - 180.0


def rotation_grid(max_rotation: float, n_rotations: int) -> np.ndarray:
    """The searched angles in degrees: ``n_rotations`` evenly spaced in ``[-max, max]``.

    With ``max_rotation >= 180`` the full circle is covered without repeating -180 = 180
    (``n_rotations`` angles ``k * 360 / n_rotations`` wrapped to ``[-180, 180)``, which include 0
    and, when ``n_rotations`` is a multiple of 4, the quarter turns). Otherwise 0 is always on the
    grid: an odd ``n_rotations`` spans ``[-max, max]`` with both end points; an even one uses the
    spacing ``2 max / n_rotations`` from ``-max`` to ``max - spacing`` (the continuous refinement
    still reaches ``+max``).

    Examples
    --------
    >>> from invariant_cluster.transforms import rotation_grid
    >>> rotation_grid(60.0, 5).tolist()
    [-60.0, -30.0, 0.0, 30.0, 60.0]
    >>> rotation_grid(180.0, 4).tolist()  # the full circle: -180 and 180 are the same angle
    [-180.0, -90.0, 0.0, 90.0]
    """
    if n_rotations == 1 or max_rotation == 0:
        return np.zeros(1)
    if max_rotation >= 180.0:
        return np.sort(wrap_degrees(np.arange(n_rotations) * (360.0 / n_rotations)))
    if n_rotations % 2:
        return np.linspace(-max_rotation, max_rotation, n_rotations)
    step = 2.0 * max_rotation / n_rotations
    return (np.arange(n_rotations) - n_rotations // 2) * step


def translation_grid(max_translation: float) -> np.ndarray:
    """Integer shifts ``(tx, ty)`` with ``|tx|, |ty| <= floor(max_translation)``, ``(S, 2)``.

    The zero shift comes first.

    Examples
    --------
    >>> from invariant_cluster.transforms import translation_grid
    >>> grid = translation_grid(1)
    >>> grid.shape, grid[0].tolist()
    ((9, 2), [0.0, 0.0])
    """
    m = int(math.floor(max_translation + 1e-9))
    r = np.arange(-m, m + 1)
    grid = np.stack(np.meshgrid(r, r, indexing="xy"), -1).reshape(-1, 2).astype(np.float64)
    order = np.argsort(np.abs(grid).sum(1), kind="stable")
    return grid[order]
