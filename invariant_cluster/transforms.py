"""SE(2) transformations of images: parameters, affine matrices, warps and search grids.

Convention
----------
This module is the one place that fixes the convention, the one place that calls kornia and the
one place that calls ``torch.nn.functional.grid_sample``: every warp of the package (the search's
rotated keys, the refinement, the attention's aligned keys, the means, the polar rings of the
shortlist's descriptors) goes through :func:`fast_warp`, :func:`sample_images` or
:func:`warp_se2`, which split their batches below the backends' limits (see
:mod:`invariant_cluster._memory`).

- A transformation is ``tau = (angle, tx, ty)``: ``angle`` in **degrees**, positive is
  **counter-clockwise as the image is displayed** (row 0 at the top), ``tx`` and ``ty`` in
  **pixels**, ``tx`` to the right and ``ty`` downwards.
- Pixel ``(x, y)`` has its origin at the centre of the top-left pixel; the image centre is
  ``c = ((W - 1) / 2, (H - 1) / 2)``, as ``kornia.geometry.transform.rotate`` uses (the
  ``"geometric"`` rotation centre).
- The rotation centre of cryo-EM particle stacks (RELION, ASPIRE, cryoSPARC) is instead the
  pixel ``(W // 2, H // 2)``, the origin of the centred Fourier transform (``"fourier"``): half a
  pixel away from ``c`` in each even dimension, the same pixel in an odd one. Functions that
  warp take ``rotation_center="geometric" | "fourier"``; ``"fourier"`` on an even dimension
  is run as ``"geometric"`` on the image with one zero row (column) appended at the bottom
  (right), whose geometric centre is that pixel, and the result is cropped back: the same
  bilinear, zero-padded warp about ``(W // 2, H // 2)``, and the mirror is then
  ``x -> W - x``.
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

Reflections (the group E(2) = SE(2) x {identity, mirror})
----------------------------------------------------------
- A transformation with a mirror is ``tau = (angle, tx, ty, mirror)``, ``mirror`` 0 or 1.
  ``T_tau = T_(angle, tx, ty) M^mirror``, where ``M`` is the **horizontal flip about the image
  centre** (column ``x -> 2 cx - x = W - 1 - x``: ``images.flip(-1)``, exact on the pixel grid),
  applied **before** the rotation and the translation. Every function here that takes
  parameters accepts 3 columns (SE(2)) or 4 (E(2)); 4 columns with ``mirror = 0`` are the
  3-column transformation.
- ``M R(a) = R(-a) M`` and ``M t = (-tx, ty) M``, so ``T_(a, t, 1)`` composes as
  ``(a, t, 1) o (b, s, m) = (a - b, t + R_a (-sx, sy), 1 - m)`` and is inverted as
  ``(a, (-ux, uy), 1)`` with ``(-a, u)`` the SE(2) inverse of ``(a, t)`` (a mirror about a line
  is its own inverse: ``(a, 0, 1)`` is an involution).
- The searches encode the mirror as a second set of key warps (the key, and its flip, each
  rotated by every grid angle) and report it as the fourth column of their alignments.
- A projection of a 3-D object along the direction ``-v`` is the mirror image of its projection
  along ``v`` (cryo-electron microscopy's "reflections"), which is why E(2) matters there.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from . import _memory
from ._utils import as_array, check_real_dtype, to_tensor

__all__ = [
    "warp_se2",
    "rotation_centre",
    "se2_matrices",
    "compose_se2",
    "invert_se2",
    "rotation_grid",
    "translation_grid",
]


def cos_sin(angle):
    """``(cos, sin)`` of angles in degrees (arrays or tensors): the package's one unit change."""
    lib = torch if isinstance(angle, torch.Tensor) else np
    rad = angle * (math.pi / 180.0)
    return lib.cos(rad), lib.sin(rad)


def image_centre(height: int, width: int) -> tuple[float, float]:
    """The geometric rotation centre ``(cx, cy) = ((W - 1) / 2, (H - 1) / 2)`` in pixels."""
    return (width - 1) / 2.0, (height - 1) / 2.0


ROTATION_CENTERS = ("geometric", "fourier")


def check_rotation_center(rotation_center) -> str:
    """``rotation_center`` checked: one of :data:`ROTATION_CENTERS`."""
    if not isinstance(rotation_center, str) or rotation_center not in ROTATION_CENTERS:
        raise ValueError(f"rotation_center: expected one of {list(ROTATION_CENTERS)}, got "
                         f"{rotation_center!r}")
    return rotation_center


def rotation_centre(height: int, width: int, rotation_center="geometric") -> tuple[float, float]:
    """The rotation centre ``(cx, cy)`` in pixels of an ``H x W`` image (module Convention).

    Examples
    --------
    >>> from invariant_cluster.transforms import rotation_centre
    >>> rotation_centre(64, 64), rotation_centre(64, 64, "fourier")
    ((31.5, 31.5), (32.0, 32.0))
    >>> rotation_centre(63, 63, "fourier")
    (31.0, 31.0)
    """
    if check_rotation_center(rotation_center) == "fourier":
        return float(width // 2), float(height // 2)
    return image_centre(height, width)


def centre_padding(height: int, width: int, rotation_center="geometric") -> tuple[int, int]:
    """Rows and columns ``(pad_h, pad_w)`` of zeros appended so that the geometric centre of the
    padded image is ``rotation_center``'s centre of the original (1 per even dimension for
    ``"fourier"``, else 0)."""
    if check_rotation_center(rotation_center) == "fourier":
        return 1 - height % 2, 1 - width % 2
    return 0, 0


def pad_for_centre(x: torch.Tensor, rotation_center="geometric") -> torch.Tensor:
    """Images ``(..., H, W)`` with :func:`centre_padding`'s zero rows and columns appended
    (``x`` itself when there are none); crop back with ``[..., :H, :W]``."""
    ph, pw = centre_padding(x.shape[-2], x.shape[-1], rotation_center)
    return F.pad(x, (0, pw, 0, ph)) if ph or pw else x


def normalised_scale(height: int, width: int) -> tuple[float, float]:
    """``(sx, sy)`` such that pixel ``x`` is ``x sx - 1`` in ``grid_sample``'s coordinates
    (``align_corners=True``: pixel centres 0 and ``W - 1`` are -1 and 1)."""
    return 2.0 / max(width - 1, 1), 2.0 / max(height - 1, 1)


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
    cos, sin = cos_sin(params[:, 0])
    cx, cy = image_centre(height, width)
    tx = params[:, 1] + cx - (cos * cx + sin * cy)
    ty = params[:, 2] + cy - (-sin * cx + cos * cy)
    if params.shape[-1] == 4:  # M first: x -> 2 cx - x, i.e. M_affine = A [[-1, 0, 2 cx], ...]
        sign = 1.0 - 2.0 * params[:, 3]
        tx = tx + (1.0 - sign) * cx * cos
        ty = ty - (1.0 - sign) * cx * sin
        row0 = torch.stack([sign * cos, sin, tx], dim=-1)
        row1 = torch.stack([-sign * sin, cos, ty], dim=-1)
        return torch.stack([row0, row1], dim=-2)
    row0 = torch.stack([cos, sin, tx], dim=-1)
    row1 = torch.stack([-sin, cos, ty], dim=-1)
    return torch.stack([row0, row1], dim=-2)


def _as_params(params, n, like: torch.Tensor) -> torch.Tensor:
    p = params if isinstance(params, torch.Tensor) else to_tensor(as_array(params, "params"))
    check_real_dtype(p.dtype, "params")
    if p.dtype == torch.bool:
        raise TypeError(f"params: expected real numbers (angle, tx, ty), got dtype {p.dtype}")
    p = p.to(device=like.device, dtype=like.dtype)
    if p.ndim == 1 and p.shape[0] in (3, 4):
        p = p[None]
    if p.ndim != 2 or p.shape[1] not in (3, 4) or p.shape[0] not in (1, n):
        raise ValueError(
            f"params: expected shape ({n}, 3) = (angle in degrees, tx, ty) or ({n}, 4) with a "
            f"mirror bit, got {tuple(p.shape)}"
        )
    if not torch.isfinite(p).all():
        raise ValueError("params: contains NaN or infinity")
    if p.shape[1] == 4 and not ((p[:, 3] == 0) | (p[:, 3] == 1)).all():
        raise ValueError("params: the mirror bit (4th column) must be 0 or 1")
    return p.expand(n, p.shape[1])


def warp_se2(images, params, *, rotation_center="geometric"):
    """Warp each image by its SE(2) transformation (rotation about the centre, then translation).

    Parameters
    ----------
    images : array-like or torch.Tensor of shape (B, H, W) or (B, C, H, W)
    params : array-like or torch.Tensor of shape (B, 3), (3,), (B, 4) or (4,)
        ``(angle in degrees counter-clockwise, tx, ty in pixels)`` per image (a single row is
        broadcast), and optionally a 4th column, the mirror bit (0 or 1): the image is flipped
        horizontally about its centre before the rotation. See the module's Convention.
    rotation_center : {"geometric", "fourier"}, default="geometric"
        The centre of rotations and mirrors: ``((W - 1) / 2, (H - 1) / 2)``, or the pixel
        ``(W // 2, H // 2)`` of cryo-EM particle stacks (see the module's Convention).

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
    >>> out = warp_se2(img, [[90.0, 0.0, 0.0, 1.0]])   # mirrored first: left of centre, then up
    >>> [int(v) for v in np.unravel_index(out[0].argmax(), (5, 5))]
    [4, 2]
    """
    from kornia.geometry.transform import warp_affine

    is_numpy = not isinstance(images, torch.Tensor)
    if is_numpy:
        images = as_array(images, "images")
    check_real_dtype(images.dtype, "images")
    x = to_tensor(images) if is_numpy else images
    if not x.is_floating_point():
        x = x.to(torch.float32)
    if x.ndim not in (3, 4):
        raise ValueError(f"images: expected shape (B, H, W) or (B, C, H, W), got {tuple(x.shape)}")
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError("images: contains NaN or infinity")
    check_rotation_center(rotation_center)
    squeeze = x.ndim == 3
    if squeeze:
        x = x.unsqueeze(1)
    h0, w0 = x.shape[-2:]
    x = pad_for_centre(x, rotation_center)
    n, _, h, w = x.shape
    p = _as_params(params, n, x)
    if n == 0:
        out = x
    else:
        M = se2_matrices(p, h, w)
        step = _batch_step(x[0].numel() + 2 * h * w)
        out = torch.cat([warp_affine(x[i:i + step], M[i:i + step], (h, w), mode="bilinear",
                                     padding_mode="zeros", align_corners=True)
                         for i in range(0, n, step)])
    if (h, w) != (h0, w0):
        out = out[..., :h0, :w0].contiguous()
    if squeeze:
        out = out.squeeze(1)
    return out.detach().cpu().numpy() if is_numpy else out


def compose_se2(a, b):
    """Parameters of ``T_a T_b`` (apply ``b`` first), for ``(..., 3)`` or ``(..., 4)`` arrays
    or tensors (4 columns: with mirror bits, see the module's Convention; the result has 4
    columns when either has).

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.transforms import compose_se2
    >>> turn, right = np.array([90.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])
    >>> (np.round(compose_se2(turn, right), 6) + 0.0).tolist()  # the shift turns upwards
    [90.0, 0.0, -1.0]
    """
    lib = torch if isinstance(a, torch.Tensor) else np
    cos, sin = cos_sin(a[..., 0])
    if a.shape[-1] == 3 and b.shape[-1] == 3:
        bx, bang = b[..., 1], b[..., 0]
    else:  # M R_b = R_(-b) M and M s = (-sx, sy) M: a's mirror passes through b
        ma, mb = _mirror_bit(a), _mirror_bit(b)
        sign = 1.0 - 2.0 * ma
        bx, bang = sign * b[..., 1], sign * b[..., 0]
    tx = cos * bx + sin * b[..., 2] + a[..., 1]
    ty = -sin * bx + cos * b[..., 2] + a[..., 2]
    out = [wrap_degrees(a[..., 0] + bang), tx, ty]
    if a.shape[-1] == 4 or b.shape[-1] == 4:
        out.append((ma + mb) % 2)
    return lib.stack(out, -1)


def _mirror_bit(a):
    return a[..., 3] if a.shape[-1] == 4 else a[..., 0] * 0


def invert_se2(a):
    """Parameters of ``T_a^-1``, for ``(..., 3)`` or ``(..., 4)`` (with mirror bits) arrays or
    tensors.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.transforms import compose_se2, invert_se2
    >>> a = np.array([30.0, 2.0, -1.0])
    >>> bool(np.allclose(compose_se2(a, invert_se2(a)), 0.0))
    True
    >>> m = np.array([30.0, 2.0, -1.0, 1.0])                # a mirror, then the same motion
    >>> bool(np.allclose(compose_se2(m, invert_se2(m)), 0.0))
    True
    """
    lib = torch if isinstance(a, torch.Tensor) else np
    cos, sin = cos_sin(a[..., 0])
    # R^-1 = R^T = [[cos, -sin], [sin, cos]]
    tx = -(cos * a[..., 1] - sin * a[..., 2])
    ty = -(sin * a[..., 1] + cos * a[..., 2])
    if a.shape[-1] == 3:
        return lib.stack([-a[..., 0], tx, ty], -1)
    # (T M)^-1 = M T^-1 = T_(a, (-ux, uy)) M with T^-1 = T_(-a, u)
    m = a[..., 3]
    sign = 1.0 - 2.0 * m
    return lib.stack([wrap_degrees(sign * -a[..., 0]), sign * tx, ty, m], -1)


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


# ----------------------------------------------------------------------------- fast warps
def _batch_step(per_image: int) -> int:
    """Images per ``grid_sample`` call: below cuDNN's batch limit and 32-bit indexing."""
    return int(max(1, min(_memory.GRID_SAMPLE_MAX_BATCH,
                          _memory.INDEX_LIMIT // max(1, int(per_image)))))


def sample_images(images: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Bilinear, zero-padded sampling (``align_corners=True``) of ``(B, C, H, W)`` images at a
    ``(B, H', W', 2)`` grid of normalised coordinates: ``grid_sample``, in calls of at most
    ``_memory.GRID_SAMPLE_MAX_BATCH`` images and fewer than ``2**31`` elements each."""
    h, w = images.shape[-2:]
    if h == 1 or w == 1:
        # align_corners=True normalises by the side less one, so grid_sample maps every
        # coordinate of a one-pixel side onto that pixel: the side gets a zero pixel at each
        # end, and its pixel x, at 2 x - 1 in the grid (normalised_scale), is x + 1 of three
        images = F.pad(images, (int(w == 1),) * 2 + (int(h == 1),) * 2)
        grid = torch.stack([(g + 1.0) * 0.5 if one else g
                            for g, one in ((grid[..., 0], w == 1), (grid[..., 1], h == 1))], -1)
    n = images.shape[0]
    c, ho, wo = images.shape[1], grid.shape[1], grid.shape[2]
    step = _batch_step(max(images[0].numel(), grid[0].numel(), c * ho * wo))
    kw = dict(mode="bilinear", padding_mode="zeros", align_corners=True)
    if n <= step:
        return F.grid_sample(images, grid, **kw)
    return torch.cat([F.grid_sample(images[i:i + step], grid[i:i + step], **kw)
                      for i in range(0, n, step)])


def sampling_grid(params: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Sampling grid ``(B, H, W, 2)`` in normalised coordinates for SE(2) ``params`` ``(B, 3)``
    (or E(2), ``(B, 4)`` with the mirror bit).

    Maintenance note: this is the inverse map of :func:`se2_matrices` (destination ``u`` ->
    source ``R^-1 (u - c - t) + c``) folded with the normalisation into one ``2 x 3`` matrix per
    image, then applied to all pixels as ONE ``(B, 6) @ (6, 2 HW)`` product whose result is the
    grid in ``grid_sample``'s own layout (contiguous ``(B, H, W, 2)``; the ``6 x 2 HW`` operand
    holds the pixel coordinates twice, interleaved with zeros, so each output sums the same
    three products as a ``2 x 3`` matrix would). kornia's ``warp_affine`` (like
    ``F.affine_grid``) does a batched ``3 x 3`` product per image, which costs ~90% of a
    small-image warp on CPU, and a grid in another layout makes ``grid_sample`` about 1.6 times
    slower on the CPU; ``tests/test_alignment.py`` pins this path to kornia's.
    """
    dtype, device = params.dtype, params.device
    n = params.shape[0]
    cos, sin = cos_sin(params[:, 0])
    cx, cy = image_centre(height, width)
    sx, sy = normalised_scale(height, width)
    ox, oy = cx + params[:, 1], cy + params[:, 2]
    bx = (-cos * ox + sin * oy + cx) * sx - 1.0
    by = (-sin * ox - cos * oy + cy) * sy - 1.0
    theta = torch.stack([cos * sx, -sin * sx, bx, sin * sy, cos * sy, by], 1)  # (B, 6)
    if params.shape[-1] == 4:
        # the mirror acts first on the source, x -> 2 cx - x: in grid_sample's coordinates
        # (centre at 0) it is the sign of the source's x row
        theta[:, :3] = theta[:, :3] * (1.0 - 2.0 * params[:, 3:4])
    ys, xs = torch.meshgrid(torch.arange(height, dtype=dtype, device=device),
                            torch.arange(width, dtype=dtype, device=device), indexing="ij")
    base = torch.stack([xs.reshape(-1), ys.reshape(-1), torch.ones_like(xs).reshape(-1)], 0)
    # row (c, k) of the operand: coordinate k of every pixel in output channel c, 0 in the other
    operand = torch.zeros((2, 3, height * width, 2), dtype=dtype, device=device)
    operand[0, :, :, 0] = base
    operand[1, :, :, 1] = base
    return (theta @ operand.reshape(6, -1)).view(n, height, width, 2)


def fast_warp(images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """:func:`warp_se2` for ``(B, C, H, W)`` tensors, same convention, bilinear, zero padding.

    No input checks and no kornia: the warp of the search, the refinement and the iterations.
    Batches are split below the backends' limits (:func:`sample_images`).
    """
    b, _, h, w = images.shape
    if b == 0:
        return images
    step = _batch_step(max(images[0].numel(), 2 * h * w))
    out = [sample_images(images[i:i + step], sampling_grid(params[i:i + step].to(images.dtype),
                                                            h, w))
           for i in range(0, b, step)]
    return out[0] if len(out) == 1 else torch.cat(out)


# A frame pixel is kept by a warp where the warp keeps at least this much of its weight: its
# source lies inside the frame (bilinear weights are exact to well within this)
KEPT_WEIGHT = 1 - 1e-3


def kept_pixels(images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """``(B, 1, H, W)`` booleans: the pixels of ``fast_warp(images, params)`` whose source lies
    inside the frame of ``images`` ``(B, C, H, W)``, where the warp brings in no zero padding."""
    return fast_warp(torch.ones_like(images[:, :1]), params) >= KEPT_WEIGHT


def warp_jacobian(warped: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """``d fast_warp(y, tau) / d tau`` from the warped image's gradient: ``(P, C H W, 3)``.

    The rotation velocity field: content at ``u`` moves with velocity ``(1, 0)``/``(0, 1)`` per
    pixel of ``tx``/``ty`` and ``G (u - c - t) * pi / 180`` per degree, ``G w = (w_y, -w_x)``
    (counter-clockwise as displayed, y down), so ``d (T y)(u) = -grad(T y)(u) . velocity``.
    Gradients are central differences (zero on the border rows and columns).
    """
    P, C, H, Wd = warped.shape
    # written in place into one (P, 3, C, H, W) buffer (rows: angle, tx, ty), returned as
    # (P, C H W, 3): the refinement's normal equations J^T J and J^T r are then dense row
    # products; no stacked copy of three full-size temporaries (a third of a refinement's time)
    J = torch.empty((P, 3, C, H, Wd), dtype=warped.dtype, device=warped.device)
    ngx, ngy = J[:, 1], J[:, 2]  # -d/dx, -d/dy: the derivatives along tx and ty
    torch.sub(warped[..., :-2], warped[..., 2:], out=ngx[..., 1:-1]).mul_(0.5)
    ngx[..., 0] = 0.0
    ngx[..., -1] = 0.0
    torch.sub(warped[..., :-2, :], warped[..., 2:, :], out=ngy[..., 1:-1, :]).mul_(0.5)
    ngy[..., 0, :] = 0.0
    ngy[..., -1, :] = 0.0
    cx, cy = image_centre(H, Wd)
    ys = torch.arange(H, dtype=warped.dtype, device=warped.device)[None, None, :, None]
    xs = torch.arange(Wd, dtype=warped.dtype, device=warped.device)[None, None, None, :]
    wx = xs - cx - params[:, 1, None, None, None]
    wy = ys - cy - params[:, 2, None, None, None]
    # d/d angle = -(gx wy - gy wx) pi / 180 = (ngx wy - ngy wx) pi / 180
    d_ang = J[:, 0]
    torch.mul(ngx, wy, out=d_ang)
    d_ang.sub_(ngy * wx).mul_(math.pi / 180.0)
    return J.view(P, 3, C * H * Wd).transpose(1, 2)


# ----------------------------------------------------------------------------- polar sampling
def polar_grid(centres: torch.Tensor, radii: torch.Tensor, n_angular: int, height: int,
               width: int) -> torch.Tensor:
    """Normalised sampling grid ``(n, U * nr, A, 2)`` of rings about ``centres`` ``(n, U, 2)``.

    Sample ``a`` of ring ``r`` is at ``centre + radii[r] (cos phi_a, sin phi_a)`` pixels with
    ``phi_a = 2 pi a / A``: with y pointing down, ``phi`` grows clockwise as displayed, so a
    counter-clockwise rotation by ``theta`` shifts each ring's samples by ``+theta`` and
    multiplies angular frequency ``m`` by :func:`rotation_phases`.
    """
    n, U = centres.shape[:2]
    phi = torch.arange(n_angular, dtype=radii.dtype, device=radii.device) * (
        2.0 * math.pi / n_angular)
    offx = radii[:, None] * torch.cos(phi)[None]  # (nr, A)
    offy = radii[:, None] * torch.sin(phi)[None]
    sx, sy = normalised_scale(height, width)
    gx = (centres[:, :, 0, None, None] + offx) * sx - 1.0  # (n, U, nr, A)
    gy = (centres[:, :, 1, None, None] + offy) * sy - 1.0
    return torch.stack([gx, gy], -1).reshape(n, U * radii.shape[0], n_angular, 2)


def rotation_phases(angles: torch.Tensor, n_frequencies: int) -> torch.Tensor:
    """``exp(i m theta)``, ``(V, M)`` complex: how a rotation by ``angles`` (degrees,
    counter-clockwise) acts on the angular frequencies ``m < M`` of :func:`polar_grid`'s rings."""
    m = torch.arange(n_frequencies, dtype=angles.dtype, device=angles.device)
    return torch.polar(torch.ones((angles.shape[0], n_frequencies), dtype=angles.dtype,
                                  device=angles.device),
                       angles[:, None] * (math.pi / 180.0) * m[None])
