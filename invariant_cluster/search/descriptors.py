"""Low-dimensional descriptors for the shortlist: polar angular spectra and Fourier moduli.

The polar angular spectrum (rings about the centre, FFT over the angle, low frequencies) is a
linear, rotation-equivariant compression of an image: a rotation is a phase factor
(:func:`~invariant_cluster.transforms.rotation_phases`), so :func:`steerable_descriptors`
describes every grid rotation of a key without a warp. :func:`invariant_descriptors` (the
moduli: invariant to every rotation) is the cheaper, less selective alternative. The rings are
sampled through :func:`~invariant_cluster.transforms.polar_grid` and
:func:`~invariant_cluster.transforms.sample_images`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .._memory import block_elements
from ..transforms import fast_warp, image_centre, polar_grid, rotation_phases, sample_images
from .grid import check_int as _check_int

__all__ = ["invariant_descriptors", "steerable_descriptors"]


def _gaussian_blur(X: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur with zero padding (a contraction, commutes with shifts)."""
    if sigma <= 0:
        return X
    radius = max(1, int(math.ceil(3.0 * sigma)))
    t = torch.arange(-radius, radius + 1, dtype=X.dtype, device=X.device)
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    g = g / g.sum()
    n, c, h, w = X.shape
    Y = X.reshape(n * c, 1, h, w)
    Y = F.conv2d(Y, g.reshape(1, 1, 1, -1), padding=(0, radius))
    Y = F.conv2d(Y, g.reshape(1, 1, -1, 1), padding=(radius, 0))
    return Y.reshape(n, c, h, w)


def _ring_radii(h: int, w: int, n_rings, dtype, device) -> tuple[torch.Tensor, float]:
    r_max = (min(h, w) - 1) / 2.0 + 0.5  # the inscribed disc, to the edge of the pixels
    if n_rings is None:
        n_rings = max(1, int(round(r_max)))
    dr = r_max / n_rings
    radii = (torch.arange(n_rings, dtype=dtype, device=device) + 0.5) * dr
    return radii, dr


def _centres(X: torch.Tensor, center: str) -> torch.Tensor:
    """``(n, 2)`` centre ``(cx, cy)`` of the polar sampling, in pixels."""
    n, _, h, w = X.shape
    cx, cy = image_centre(h, w)
    out = torch.empty((n, 2), dtype=X.dtype, device=X.device)
    out[:, 0], out[:, 1] = cx, cy
    if center == "mass":
        m = X.clamp(min=0).sum(1)  # (n, H, W), channels summed
        tot = m.sum((1, 2))
        ys = torch.arange(h, dtype=X.dtype, device=X.device)
        xs = torch.arange(w, dtype=X.dtype, device=X.device)
        mx = (m.sum(1) * xs).sum(1)
        my = (m.sum(2) * ys).sum(1)
        ok = tot > 0
        out[ok, 0] = mx[ok] / tot[ok]
        out[ok, 1] = my[ok] / tot[ok]
    return out


def centred_images(flat: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray]:
    """Images (flat rows of ``shape`` ``(C, H, W)``) shifted so that the centre of mass of their
    positive part (channels summed) is at the geometric image centre, and the ``(n, 2)``
    offsets ``(dx, dy)`` of those centres from it (an image with no positive value is left as
    it is)."""
    Z = torch.as_tensor(flat).reshape(-1, *shape)
    h, w = shape[-2:]
    d = _centres(Z, "mass") - torch.tensor(image_centre(h, w), dtype=Z.dtype)
    return shifted_images(flat, shape, d), d.double().numpy()


def shifted_images(flat: np.ndarray, shape, offsets) -> np.ndarray:
    """Images (flat rows of ``shape`` ``(C, H, W)``) each moved by minus its offset ``(dx, dy)``
    (``offsets`` ``(n, 2)``): :func:`centred_images` with the offsets given."""
    Z = torch.as_tensor(flat).reshape(-1, *shape)
    d = torch.as_tensor(offsets, dtype=Z.dtype)
    params = torch.cat([torch.zeros_like(d[:, :1]), -d], 1)
    with torch.no_grad():
        out = fast_warp(Z, params)
    return out.reshape(flat.shape).numpy()


def border_density(flat: np.ndarray, shape, width: int) -> float:
    """The mean intensity of the mean image (channels summed, float64) in the band of
    ``width`` pixels along the frame, over its mean intensity in the whole frame, of images
    (flat rows of ``shape`` ``(C, H, W)``); ``inf`` where the mean image is not mass on a
    dark background (its sum not positive, or its negative part over a tenth of its
    positive part). Zero-mean noise cancels in the mean image, so the ratio is that of the clean
    images: about 0 for shapes on an empty background, 1 for a uniform one."""
    h, w = shape[-2:]
    flat = flat.reshape(flat.shape[0], -1)
    mean = np.zeros(math.prod(shape), dtype=np.float64)
    for i in range(0, flat.shape[0], 8192):  # in blocks: no float64 copy of all the images
        mean += flat[i:i + 8192].sum(0, dtype=np.float64)
    m = mean.reshape(-1, h, w).sum(0)
    total = float(m.sum())
    # a mean image that is not mass on a dark background (all but rounding at zero, as in a
    # standardised stack, or a tenth of it negative) has no band density to speak of
    if not total > 0 or float(np.clip(-m, 0, None).sum()) > 0.1 * float(np.clip(m, 0, None).sum()):
        return math.inf
    width = max(1, min(int(width), (min(h, w) - 1) // 2))
    inner = m[width:h - width, width:w - width]
    band_area = h * w - inner.size
    return ((total - float(inner.sum())) / band_area) / (total / (h * w))


def _polar_spectrum(X, n_rings, n_angular, n_frequencies, centres):
    """Weighted angular spectra of rings about ``centres``: ``(n, U, C * n_rings, M)`` complex.

    ``centres`` is ``(n, U, 2)`` in pixels (several centres per image: its shifted copies).
    Maintenance note, the weights: ``sum_a f(a)^2 = (1/A) sum_m mult_m |F_m|^2`` (Parseval, ``mult``
    2 for the frequencies that stand for a conjugate pair) and each polar sample stands for the
    area ``r dr 2 pi / A``; inner products of spectra are then those of the images.
    """
    n, c, h, w = X.shape
    dtype, device = X.dtype, X.device
    radii, dr = _ring_radii(h, w, n_rings, dtype, device)
    nr = radii.shape[0]
    U = centres.shape[1]
    rings = sample_images(X, polar_grid(centres, radii, n_angular, h, w))
    spec = torch.fft.rfft(rings.reshape(n, c, U, nr, n_angular), dim=-1)
    n_freq = spec.shape[-1]
    mult = torch.full((n_freq,), 2.0, dtype=dtype, device=device)
    mult[0] = 1.0
    if n_angular % 2 == 0:
        mult[-1] = 1.0
    wgt = (radii * dr * 2.0 * math.pi / n_angular ** 2)[:, None] * mult[None]  # (nr, M)
    spec = spec * wgt.sqrt()
    if n_frequencies is not None:
        spec = spec[..., :n_frequencies]
    return spec.permute(0, 2, 1, 3, 4).reshape(n, U, c * nr, spec.shape[-1])


def _realify(spec: torch.Tensor) -> torch.Tensor:
    """Complex spectra ``(..., K, M)`` -> real vectors with the same inner products."""
    re, im = spec.real, spec.imag[..., 1:]  # the imaginary part of frequency 0 is zero
    return torch.cat([re, im], -1).flatten(-2)


def _polar_descriptors(X, n_rings, n_angular, n_frequencies, center):
    ctr = _centres(X, center)[:, None]  # (n, 1, 2)
    spec = _polar_spectrum(X, n_rings, n_angular, n_frequencies, ctr)
    return spec[:, 0].abs().reshape(X.shape[0], -1)


def steerable_descriptors(X: torch.Tensor, *, angles=None, shifts=None, n_rings=None,
                          n_angular=32, n_frequencies=None, blur=0.0, center="image",
                          batch_size=None) -> torch.Tensor:
    """Low-dimensional descriptors of rotated (and shifted) copies of every image.

    The polar angular spectrum (rings about the image centre, FFT over the angle, low
    frequencies kept) is a linear, rotation-equivariant compression of the image: a rotation by
    ``theta`` multiplies frequency ``m`` by ``exp(i m theta)``. So the descriptor of ``T y`` for
    every grid angle is a phase factor away, and ``||d(x) - d(R_theta y)||^2`` approximates
    ``||x - R_theta y||^2`` with no warp.

    Parameters
    ----------
    X : torch.Tensor of shape (n, C, H, W)
    angles : array-like of shape (V,), optional
        Rotations in degrees (the kornia convention of the package; None: only 0).
    shifts : array-like of shape (U, 2), optional
        Integer ``(tx, ty)``: copy ``u`` is ``S_-t x`` (``x(v + t)``, as
        :func:`~invariant_cluster.alignment.shift_images`), sampled by moving the ring centre.
    n_rings, n_angular, n_frequencies, blur, batch_size
        As :func:`invariant_descriptors`.

    Returns
    -------
    desc : torch.Tensor of shape (n, U * V, d)
        Copy ``u * V + v`` is image shifted by ``shifts[u]``, then rotated by ``angles[v]``.
    """
    if not isinstance(X, torch.Tensor) or X.ndim != 4:
        raise ValueError(f"X: expected a torch.Tensor of shape (n, C, H, W), got "
                         f"{type(X).__name__} of shape {tuple(getattr(X, 'shape', ()))}")
    X, n_rings, n_angular, n_frequencies, batch_size = _checked(
        X, n_rings, n_angular, n_frequencies, batch_size)
    dtype, device = X.dtype, X.device
    n, c, h, w = X.shape
    ang = torch.zeros(1, dtype=dtype, device=device) if angles is None else torch.as_tensor(
        np.asarray(angles, dtype=np.float64), dtype=dtype, device=device).reshape(-1)
    sh = torch.zeros((1, 2), dtype=dtype, device=device) if shifts is None else torch.as_tensor(
        np.asarray(shifts, dtype=np.float64), dtype=dtype, device=device).reshape(-1, 2)
    U, V = sh.shape[0], ang.shape[0]
    M = n_angular // 2 + 1 if n_frequencies is None else min(n_frequencies, n_angular // 2 + 1)
    phase = rotation_phases(ang, M)  # (V, M)
    nr = _ring_radii(h, w, n_rings, dtype, "cpu")[0].shape[0]
    # the values of one image's copies, times 8: its temporaries (the sampled rings, their
    # complex spectrum, the rotated copies and their real view, the sampling grid) measured
    # about 8 times these counts; 70,000 Fashion-MNIST images, 9 shifts: peak 0.7-0.9 GB and
    # 2.3-6.3 s with the factor, 2.4-4.2 GB and 7.2-9.1 s without
    per_image = 8 * c * (h * w + 3 * U * nr * n_angular + 2 * U * V * nr * M)
    if batch_size is None:
        batch_size = max(1, block_elements(device, X.element_size()) // per_image)
    base = torch.tensor(image_centre(h, w), dtype=dtype, device=device)
    # one output, filled block by block (a list and a cat held it twice, and interleaved the
    # blocks' temporaries with their results)
    out = None
    for i0 in range(0, n, batch_size):
        Xb = _gaussian_blur(X[i0:i0 + batch_size], float(blur))
        b = Xb.shape[0]
        if center == "mass":
            ctr = _centres(Xb, "mass")[:, None] + sh
        else:
            ctr = (base + sh).expand(b, U, 2)
        spec = _polar_spectrum(Xb, n_rings, n_angular, n_frequencies, ctr)  # (b, U, K, M)
        rot = spec[:, :, None] * phase[None, None, :, None, :]  # (b, U, V, K, M)
        block = _realify(rot).reshape(b, U * V, -1)
        del spec, rot
        if out is None:
            out = block.new_empty((n, U * V, block.shape[-1]))
        out[i0:i0 + b] = block
    if out is None:
        return X.new_zeros((0, U * V, 0))
    return out


def _checked(X, n_rings, n_angular, n_frequencies, batch_size):
    """The sampling sizes as ints (ValueError naming a bad one), and ``X`` as floats."""
    return (X if X.is_floating_point() else X.float(),
            _check_int(n_rings, "n_rings", 1, allow_none=True),
            _check_int(n_angular, "n_angular", 2),
            _check_int(n_frequencies, "n_frequencies", 1, allow_none=True),
            _check_int(batch_size, "batch_size", 1, allow_none=True))


def _fourier_modulus(X, pad):
    """``|DFT|`` of the image zero-padded by ``pad``, Parseval-weighted: shift invariant."""
    n, c, h, w = X.shape
    P = F.pad(X, (pad, pad, pad, pad)) if pad > 0 else X
    H, W = P.shape[-2:]
    spec = torch.fft.rfft2(P).abs()  # (n, C, H, W // 2 + 1)
    mult = torch.full((spec.shape[-1],), 2.0, dtype=X.dtype, device=X.device)
    mult[0] = 1.0
    if W % 2 == 0:
        mult[-1] = 1.0
    return (spec * (mult / (H * W)).sqrt()).reshape(n, -1)


def invariant_descriptors(X: torch.Tensor, *, n_rings=None, n_angular=64, n_frequencies=None,
                          group="se2", max_rotation=180.0, max_translation=0, blur=None,
                          center="auto", batch_size=None) -> torch.Tensor:
    """A cheap descriptor per image whose Euclidean distance bounds the invariant distance.

    Parameters
    ----------
    X : torch.Tensor of shape (n, C, H, W)
        Images (float32 or float64; the descriptors follow its device and dtype).
    n_rings : int, optional
        Concentric rings sampled about the centre, evenly spaced up to the inscribed circle
        (None: one per pixel of radius, 14 for 28 x 28 images).
    n_angular : int, default=64
        Samples per ring (bilinear interpolation).
    n_frequencies : int, optional
        Keep the angular frequencies ``0 .. n_frequencies - 1`` (None: all ``n_angular//2+1``).
    group : {"se2", "rotation", "translation", "none"}, default="se2"
        The invariance wanted (as :func:`~invariant_cluster.alignment.make_search_grid`).
    max_rotation : float, default=180.0
        0 turns "se2" into "translation" and "rotation" into "none".
    max_translation : float, default=0
        Largest shift searched, in pixels; sets the default blur and centre.
    blur : float, optional
        Gaussian blur (standard deviation in pixels) applied first. None: ``0.5 max_translation``
        for "se2", 0 otherwise.
    center : {"auto", "image", "mass"}, default="auto"
        Centre of the rings: the image centre, or each image's intensity centroid (which moves
        with the content, so the rings follow a shift). "auto": "mass" for "se2" with
        ``max_translation > 0``, else "image".
    batch_size : int, optional
        Images per block (None: from the memory budget).

    Returns
    -------
    desc : torch.Tensor of shape (n, d)
        ``d = C n_rings n_frequencies`` for rotations, ``C H' (W'//2+1)`` for "translation"
        (padded size), ``C H W`` for "none".

    Notes
    -----
    Rotations ("se2", "rotation"): each ring ``f_r(phi)`` of the (blurred) image is sampled at
    ``n_angular`` angles; a rotation about the centre shifts it cyclically, so ``|FFT_phi f_r|``
    is invariant. The magnitudes are weighted so that, by Parseval and the polar area element
    ``r dr dphi``, ``||desc(x) - desc(y)||^2`` is a LOWER BOUND of ``min_theta ||x - R_theta y||^2``
    (each ring may rotate on its own, and ``| |a| - |b| | <= |a - e^{i t} b|``), up to sampling:
    the descriptor distance is in the units of the invariant distance, and the ranking it gives
    is a relaxation of the true one. It is invariant to ALL angles, so with a limited rotation
    range it also matches e.g. a "6" to a "9": the shortlist then needs more candidates.
    Translations are absorbed by blurring (a Gaussian blur commutes with shifts and rotations and
    never increases a distance, so the bound still holds) and, with ``center="mass"``, by
    sampling about the intensity centroid, which follows the content.
    "translation": the Parseval-weighted ``|DFT|`` of the image padded by
    ``ceil(max_translation)``: exactly invariant to shifts that keep the content in the padded
    frame, and again a lower bound of the shift-invariant distance.
    "none": the (blurred) pixels; the descriptor distance is then the distance itself.
    The descriptor is this library's choice (the paper is silent on neighbour search).

    Examples
    --------
    >>> import torch
    >>> from invariant_cluster.neighbors import invariant_descriptors
    >>> x = torch.rand(1, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    >>> d = invariant_descriptors(torch.cat([x, torch.rot90(x, 1, (2, 3))]))
    >>> bool((d[0] - d[1]).norm() < 0.05 * d[0].norm())
    True
    """
    if not isinstance(X, torch.Tensor) or X.ndim != 4:
        raise ValueError(f"X: expected a torch.Tensor of shape (n, C, H, W), got "
                         f"{type(X).__name__} of shape {tuple(getattr(X, 'shape', ()))}")
    if group not in ("se2", "rotation", "translation", "none"):
        raise ValueError(f"group: expected one of ('se2', 'rotation', 'translation', 'none'), "
                         f"got {group!r}")
    if center not in ("auto", "image", "mass"):
        raise ValueError(f"center: expected 'auto', 'image' or 'mass', got {center!r}")
    X, n_rings, n_angular, n_frequencies, batch_size = _checked(
        X, n_rings, n_angular, n_frequencies, batch_size)
    if max_rotation == 0:
        group = {"se2": "translation", "rotation": "none"}.get(group, group)
    if group in ("rotation", "none"):
        max_translation = 0
    if blur is None:
        blur = 0.5 * float(max_translation) if group == "se2" else 0.0
    if center == "auto":
        center = "mass" if group == "se2" and max_translation > 0 else "image"
    n, c, h, w = X.shape
    pad = int(math.ceil(max_translation))
    if group in ("se2", "rotation"):
        nr = _ring_radii(h, w, n_rings, X.dtype, "cpu")[0].shape[0]
        per_image = c * (h * w + 3 * nr * n_angular)
    elif group == "translation":
        per_image = 4 * c * (h + 2 * pad) * (w + 2 * pad)
    else:
        per_image = c * h * w
    if batch_size is None:
        batch_size = max(1, block_elements(X.device, X.element_size()) // per_image)
    out = []
    for i0 in range(0, n, batch_size):
        Xb = _gaussian_blur(X[i0:i0 + batch_size], float(blur))
        if group in ("se2", "rotation"):
            out.append(_polar_descriptors(Xb, n_rings, n_angular, n_frequencies, center))
        elif group == "translation":
            out.append(_fourier_modulus(Xb, pad))
        else:
            out.append(Xb.reshape(Xb.shape[0], -1).clone())
    if not out:
        return X.new_zeros((0, 0))
    return torch.cat(out, 0)
