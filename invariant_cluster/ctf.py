"""The contrast transfer function (CTF) of cryo-electron micrographs, on torch (CPU or GPU).

Convention
----------
- RELION's: defocus ``U``, ``V`` in ångström, **positive for underfocus**; the astigmatism angle
  in degrees from the ``x`` axis (columns) towards the ``y`` axis (rows, pointing down as an
  image is displayed); voltage in kV, spherical aberration ``Cs`` in mm, the amplitude contrast
  ``A`` as a fraction, an optional phase shift in degrees, the pixel size in ångström.
- The CTF at spatial frequency ``k`` (cycles per ångström, at angle ``phi``) is
  ``sqrt(1 - A^2) sin(chi) + A cos(chi)`` with
  ``chi = pi lambda df(phi) k^2 - pi / 2 Cs lambda^3 k^4 + phase_shift`` and
  ``df(phi) = (U + V) / 2 + (U - V) / 2 cos(2 (phi - angle))``: RELION's ``CTF::getCTF``, positive
  at low frequencies (images of protein in white, as RELION's extraction writes them). ASPIRE's
  ``CTFFilter`` is its negative (dark protein, the raw micrograph's contrast).
- Frequencies are those of ``torch.fft.fft2`` on the image's pixel grid: the CTF multiplies the
  Fourier transform of the whole box, so it does not depend on the rotation centre.
- A warp of :mod:`invariant_cluster.transforms` by ``(angle, tx, ty, mirror)`` turns an image's
  CTF with it: the astigmatism angle becomes ``(-a if mirror else a) - angle``
  (:meth:`CTF.warped`); shifts leave it unchanged.

Averages
--------
Images ``y_i = IFFT(C_i F(p)) + noise`` of one projection ``p`` are combined as the Wiener
estimate ``sum_i C_i F(y_i) / (sum_i C_i^2 + 1 / snr)`` (:func:`wiener_average`), which estimates
``p`` itself, without the CTF. The search for neighbours runs on phase-flipped images
(:func:`phase_flip`, ``F(y_i) sign(C_i)``), whose low frequencies all have the projection's sign,
compared across groups of similar defocus (:func:`ctf_groups`): an image of group ``g`` and one
of group ``h`` are filtered by ``|C_h|`` and ``|C_g|`` (:func:`cross_ctf_filters`), which makes
two images of one projection equal whatever their defoci.
"""

from __future__ import annotations

import math
import numbers
import os
import reprlib
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ._utils import as_array, resolve_device, to_tensor

__all__ = ["CTF", "ctf_images", "apply_ctf", "phase_flip", "wiener_filter", "wiener_average",
           "spectral_snr", "ctf_groups", "cross_ctf_filters", "read_star", "read_cs",
           "write_star", "star_tables", "electron_wavelength"]

_STAR_HINT = "pip install invariant_cluster[cryoem] (or: pip install starfile)"
# RELION's label of each CTF field (the optics group holds the last four in RELION >= 3.1)
STAR_COLUMNS = {
    "defocus_u": "rlnDefocusU",
    "defocus_v": "rlnDefocusV",
    "defocus_angle": "rlnDefocusAngle",
    "voltage": "rlnVoltage",
    "spherical_aberration": "rlnSphericalAberration",
    "amplitude_contrast": "rlnAmplitudeContrast",
    "pixel_size": "rlnImagePixelSize",
    "phase_shift": "rlnPhaseShift",
}
_OPTIONAL = {"phase_shift": 0.0}


def electron_wavelength(voltage_kv):
    """Relativistic electron wavelength in ångström for an acceleration voltage in kV."""
    v = np.asarray(voltage_kv, dtype=np.float64) * 1e3
    return 12.2643247 / np.sqrt(v * (1.0 + 0.978466e-6 * v))


@dataclass(frozen=True)
class CTF:
    """CTF parameters of ``n`` images (arrays of shape ``(n,)``; scalars are broadcast).

    Parameters
    ----------
    defocus_u, defocus_v : array-like of shape (n,)
        Defocus along and across the astigmatism angle, in ångström, positive for underfocus
        (``defocus_v`` None: equal to ``defocus_u``, no astigmatism). 0 (no CTF, as files of
        data without one carry it) or at least 100 Å: a value in between is refused as
        micrometres given for ångström.
    defocus_angle : float or array-like, default=0
        Astigmatism angle in degrees (see the module's Convention).
    voltage : float or array-like, default=300
        Acceleration voltage in kV, at most 1,000 (more is refused as volts given for kV).
    spherical_aberration : float or array-like, default=2.7
        ``Cs`` in mm.
    amplitude_contrast : float or array-like, default=0.1
        In ``[0, 1)``.
    pixel_size : float or array-like, default=1.0
        Ångström per pixel, positive.
    phase_shift : float or array-like, default=0
        Additional phase shift in degrees (phase plates).

    Every field takes real numbers (ints or floats, NumPy or torch); text, booleans and
    complex numbers are refused with a ``TypeError`` naming the field.

    Examples
    --------
    >>> from invariant_cluster.ctf import CTF, ctf_images
    >>> ctf = CTF([15000.0, 20000.0], voltage=200, spherical_aberration=2.0, pixel_size=5.0)
    >>> len(ctf), ctf_images(ctf, (64, 64)).shape
    (2, torch.Size([2, 64, 64]))
    >>> round(float(ctf_images(ctf, (64, 64))[0, 0, 0]), 6)   # A at zero frequency
    0.1
    """

    defocus_u: np.ndarray
    defocus_v: np.ndarray | None = None
    defocus_angle: np.ndarray | float = 0.0
    voltage: np.ndarray | float = 300.0
    spherical_aberration: np.ndarray | float = 2.7
    amplitude_contrast: np.ndarray | float = 0.1
    pixel_size: np.ndarray | float = 1.0
    phase_shift: np.ndarray | float = 0.0

    def __post_init__(self):
        if self.defocus_v is None:
            object.__setattr__(self, "defocus_v", self.defocus_u)
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                v = v.detach().cpu().numpy()
            arr = _real_values(v, f.name)
            if arr.ndim > 1:
                raise ValueError(f"{f.name}: expected a number or an array of shape (n,), got "
                                 f"shape {arr.shape}")
            values[f.name] = arr
        # the number of images: defocus_u's, else the longest array given
        n = values["defocus_u"].shape[0] if values["defocus_u"].ndim == 1 else max(
            (a.shape[0] for a in values.values() if a.ndim == 1), default=1)
        for name, arr in values.items():
            if arr.ndim == 1 and arr.shape[0] != n:
                raise ValueError(f"{name}: expected {n} values (one per image), got "
                                 f"{arr.shape[0]}")
            arr = np.broadcast_to(arr, (n,)).copy()
            arr.setflags(write=False)
            if not np.isfinite(arr).all():
                raise ValueError(f"{name}: contains NaN or infinity")
            object.__setattr__(self, name, arr)
        for name in ("defocus_u", "defocus_v"):
            arr = getattr(self, name)
            _check_range(arr, name, lambda a: a >= 0, "non-negative (underfocus, in ångström)")
            _check_unit(arr, name, (arr > 0) & (arr < _MIN_DEFOCUS),
                        "ångström: 0 (no CTF) or at least 100 Å",
                        lambda x: f"µm given for Å? ({x:g} µm is {x * 1e4:g} Å)")
        _check_range(self.voltage, "voltage", lambda a: a > 0, "positive (kV)")
        _check_unit(self.voltage, "voltage", self.voltage > _MAX_VOLTAGE,
                    "kV, at most 1000 kV",
                    lambda x: f"looks like volts ({x:g} V is {x / 1e3:g} kV)")
        _check_range(self.spherical_aberration, "spherical_aberration", lambda a: a >= 0,
                     "non-negative (mm)")
        _check_range(self.amplitude_contrast, "amplitude_contrast",
                     lambda a: (a >= 0) & (a < 1), "in [0, 1)")
        _check_range(self.pixel_size, "pixel_size", lambda a: a > 0, "positive (ångström)")

    def __len__(self) -> int:
        return int(self.defocus_u.shape[0])

    def __getitem__(self, index) -> CTF:
        """The parameters of the images ``index`` (an int, a slice or an index array)."""
        idx = np.atleast_1d(np.arange(len(self))[index])
        return CTF(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    def warped(self, params) -> CTF:
        """The CTF of each image once warped by ``params`` ``(n, 3)`` ``(angle, tx, ty)`` or
        ``(n, 4)`` ``(angle, tx, ty, mirror)`` (the convention of
        :mod:`invariant_cluster.transforms`): the astigmatism turns with it."""
        p = _real_values(params.detach().cpu().numpy() if isinstance(params, torch.Tensor)
                         else params, "params")
        if p.ndim != 2 or p.shape[1] not in (3, 4) or p.shape[0] != len(self):
            raise ValueError(f"params: expected shape ({len(self)}, 3) (angle, tx, ty) or "
                             f"({len(self)}, 4) (angle, tx, ty, mirror), one row per image, got "
                             f"shape {p.shape}")
        if not np.isfinite(p).all():
            raise ValueError("params: contains NaN or infinity")
        angle = self.defocus_angle
        if p.shape[1] == 4:
            angle = np.where(p[:, 3] > 0.5, -angle, angle)
        new = {f.name: getattr(self, f.name) for f in fields(self)}
        new["defocus_angle"] = angle - p[:, 0]
        return CTF(**new)


# the units' plausible ranges: a voltage in kV, a non-zero defocus in ångström
_MAX_VOLTAGE = 1000.0
_MIN_DEFOCUS = 100.0


def _real_values(v, name) -> np.ndarray:
    """``v`` as a float64 array, or a ``TypeError`` naming ``name`` where it holds anything
    but real numbers (text such as ``"20000"``, booleans and complex numbers included: a
    number read from text is the caller's conversion to make)."""
    try:
        raw = np.asarray(v)
    except (TypeError, ValueError):
        raw = None
    ok = raw is not None and (raw.dtype.kind in "iuf" or raw.dtype.kind == "O" and all(
        isinstance(e, numbers.Real) and not isinstance(e, (bool, np.bool_))
        for e in raw.ravel()))
    if not ok:
        kind = "" if raw is None else f" (dtype {raw.dtype})"
        raise TypeError(f"{name}: expected real numbers, got {reprlib.repr(v)}{kind}")
    return raw.astype(np.float64)


def _check_range(arr, name, ok, expected):
    bad = ~ok(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: expected {expected} values, got {arr[i]!r} at image {i}")


def _check_unit(arr, name, bad, unit, hint):
    """A ``ValueError`` naming ``name`` and its ``unit`` at the first ``bad`` value."""
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        x = float(arr[i])
        raise ValueError(f"{name}: expected {unit}; got {x:g} at image {i}, {hint(x)}")


def _check_ctf(ctf, n=None, name="ctf") -> CTF:
    if not isinstance(ctf, CTF):
        raise TypeError(f"{name}: expected an invariant_cluster.ctf.CTF, got "
                        f"{type(ctf).__name__}")
    if n is not None and len(ctf) != n:
        raise ValueError(f"{name}: expected the parameters of {n} images, got {len(ctf)}")
    return ctf


def _check_shape(shape):
    try:
        h, w = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape: expected (H, W), got {shape!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"shape: expected positive (H, W), got {shape!r}")
    return h, w


def _frequencies(h, w, *, half, dtype, device):
    """``(ky, kx)`` grids in cycles per pixel, ``(H, W)`` or ``(H, W // 2 + 1)`` (``half``)."""
    ky = torch.fft.fftfreq(h, dtype=dtype, device=device)
    kx = (torch.fft.rfftfreq if half else torch.fft.fftfreq)(w, dtype=dtype, device=device)
    return torch.meshgrid(ky, kx, indexing="ij")


def ctf_images(ctf: CTF, shape, *, dtype=torch.float64, device="cpu", half=False):
    """The CTF of each image on the FFT grid of ``shape`` ``(H, W)`` pixels.

    Parameters
    ----------
    ctf : CTF
        ``n`` images' parameters.
    shape : (int, int)
        ``(H, W)``.
    dtype : torch.dtype, default=torch.float64
        A floating-point dtype. float16 and bfloat16 values are computed in float32 and
        rounded (the phase's ``Cs k^4`` term overflows float16).
    device : str or torch.device, default="cpu"
        As :func:`invariant_cluster._utils.resolve_device` reads it ("auto", "cpu",
        "cuda[:N]", "mps", a torch.device); a device that is not available is a
        ``ValueError``.
    half : bool, default=False
        Only the ``W // 2 + 1`` columns of ``torch.fft.rfft2`` (the CTF is even in ``k``).

    Returns
    -------
    values : torch.Tensor of shape (n, H, W) or (n, H, W // 2 + 1)
        Zero frequency at ``[0, 0]`` (``torch.fft.fftfreq`` order; ``torch.fft.fftshift``
        centres it).
    """
    ctf = _check_ctf(ctf)
    h, w = _check_shape(shape)
    out_dtype = _check_dtype(dtype)
    dtype = _working_dtype(out_dtype)
    device = resolve_device(device)
    ky, kx = _frequencies(h, w, half=half, dtype=dtype, device=device)

    def col(a):
        return torch.tensor(np.asarray(a), dtype=dtype, device=device)[:, None, None]

    px = col(ctf.pixel_size)
    lam = col(electron_wavelength(ctf.voltage))
    mean = col((ctf.defocus_u + ctf.defocus_v) / 2.0)
    diff = col((ctf.defocus_u - ctf.defocus_v) / 2.0)
    angle = col(np.deg2rad(ctf.defocus_angle))
    cs = col(ctf.spherical_aberration * 1e7)  # mm -> ångström
    shift = col(np.deg2rad(ctf.phase_shift))
    amp = col(ctf.amplitude_contrast)

    def values(ky, kx):
        k2 = (kx ** 2 + ky ** 2)[None] / px ** 2  # (cycles per ångström)^2
        defocus = mean + diff * torch.cos(2.0 * (torch.atan2(ky, kx)[None] - angle))
        chi = (math.pi * lam * defocus * k2 - 0.5 * math.pi * cs * lam ** 3 * k2 ** 2 + shift)
        return torch.sqrt(1.0 - amp ** 2) * torch.sin(chi) + amp * torch.cos(chi)

    C = values(ky, kx)
    # Maintenance note: on an even axis the Nyquist frequency -1/2 is also +1/2; with
    # astigmatism the CTF differs there off the other axis, and a filter that is not the same at
    # both would not map real images to real images. It is the mean of the two.
    if h % 2 == 0:
        i = h // 2
        C[:, i] = 0.5 * (values(ky[i:i + 1], kx[i:i + 1])
                         + values(-ky[i:i + 1], kx[i:i + 1]))[:, 0]
    if w % 2 == 0:
        j = w // 2
        C[:, :, j] = 0.5 * (values(ky[:, j:j + 1], kx[:, j:j + 1])
                            + values(ky[:, j:j + 1], -kx[:, j:j + 1]))[:, :, 0]
        if h % 2 == 0:  # the corner: the mean over its four aliases
            i = h // 2
            C[:, i, j] = 0.25 * sum(values(sy * ky[i:i + 1, j:j + 1], sx * kx[i:i + 1, j:j + 1])
                                    for sy in (1, -1) for sx in (1, -1))[:, 0, 0]
    return C.to(out_dtype)


def _check_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating-point torch.dtype, got {dtype!r}")
    return dtype


def _working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the filters compute in: float32 for float16 and bfloat16 (which torch's FFT
    does not take on the CPU, and whose range the CTF's phase and the power spectra exceed),
    else ``dtype``."""
    return torch.float32 if torch.finfo(dtype).bits < 32 else dtype


def _as_image_tensor(images, n=None, name="images"):
    """``(tensor (n, H, W), is_numpy, dtype)``: the images in the dtype the filters compute in
    (:func:`_working_dtype`; float32 for integers), whether they came as NumPy, and the dtype
    of the results (the input's floating dtype, float32 for integers); 2-D input is one image.
    NumPy views of any strides (``np.rot90``, ``X[:, ::-1]``) and byte order are taken."""
    is_numpy = not isinstance(images, torch.Tensor)
    if is_numpy:
        arr = as_array(images, name)
        if arr.dtype.kind not in "biufc":
            raise TypeError(f"{name}: expected real numbers, got dtype {arr.dtype}")
        x = to_tensor(arr)
    else:
        x = images
    if x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"{name}: expected real numbers, got dtype {x.dtype}")
    if not x.is_floating_point():
        x = x.to(torch.float32)
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3:
        raise ValueError(f"{name}: expected shape (n, H, W), got {tuple(x.shape)}")
    if 0 in x.shape[1:]:
        raise ValueError(f"{name}: expected images of at least 1 x 1 pixels, got shape "
                         f"{tuple(x.shape)}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name}: expected {n} images (one per CTF), got {x.shape[0]}")
    dtype = x.dtype
    return x.to(_working_dtype(dtype)), is_numpy, dtype


def _returned(out: torch.Tensor, is_numpy, dtype):
    out = out.to(dtype)
    return out.cpu().numpy() if is_numpy else out


_NO_SNR = object()  # _filtered's filters without a regulariser


def _filtered(images, ctf, gain, snr=_NO_SNR):
    """``IFFT(gain(C, reg) F(images))`` for images ``(n, H, W)``, ``reg`` the regulariser of
    ``snr`` (:func:`_regulariser`; None for the filters without one); NumPy in, NumPy out, in
    the images' dtype."""
    ctf = _check_ctf(ctf)
    x, is_numpy, dtype = _as_image_tensor(images, len(ctf))
    h, w = x.shape[-2:]
    if x.shape[0] == 0:  # (torch's FFT refuses empty batches)
        if snr is not _NO_SNR and not _is_auto(snr):
            _regulariser(snr, x)
        return _returned(x.clone(), is_numpy, dtype)
    reg = None if snr is _NO_SNR else _regulariser(snr, x, ctf)
    C = ctf_images(ctf, (h, w), dtype=x.dtype, device=x.device, half=True)
    out = torch.fft.irfft2(torch.fft.rfft2(x) * gain(C, reg), s=(h, w))
    return _returned(out, is_numpy, dtype)


def apply_ctf(images, ctf):
    """Each image filtered by its CTF (a simulation of the microscope), ``(n, H, W)``, in the
    images' floating dtype (as :func:`phase_flip`)."""
    return _filtered(images, ctf, lambda C, _: C)


def phase_flip(images, ctf):
    """Each image with the sign of its CTF undone in Fourier space: ``IFFT(sign(C) F(y))``.

    Parameters
    ----------
    images : array-like or torch.Tensor of shape (n, H, W)
    ctf : CTF of length n

    Returns
    -------
    flipped : same type and shape as ``images``
        In the images' floating dtype (float16 stays float16, computed in float32), float32
        for integer images.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.ctf import CTF, apply_ctf, phase_flip
    >>> rng = np.random.default_rng(0)
    >>> p = rng.random((1, 32, 32))
    >>> ctf = CTF([20000.0], voltage=200, pixel_size=3.0)
    >>> y = phase_flip(apply_ctf(p, ctf), ctf)          # |C| F(p): no sign changes left
    >>> bool(np.corrcoef(y.ravel(), p.ravel())[0, 1] > 0)
    True
    """
    return _filtered(images, ctf, lambda C, _: torch.sign(C))


# The neighbour search's CTF groups: images of at most this many distinct CTFs are compared
# across groups exactly (cross_ctf_filters); more are split into this many groups of equal
# size at the quantiles of their mean defocus (measured: docs/design/defaults.rst).
CTF_GROUPS = 4
# Frequencies where neither group's CTF carries signal are not amplified: the cross filters'
# denominator C_g^2 + C_h^2 is raised by this much (the CTF is at most 1).
_CROSS_EPS = 1e-3


def ctf_groups(ctf, max_groups: int = CTF_GROUPS):
    """The groups of images whose CTFs the neighbour search tells apart, and one radial CTF
    per group.

    Images with equal parameters share a group when there are at most ``max_groups``
    distinct CTFs; otherwise the mean defocus ``(U + V) / 2`` is cut at its
    ``max_groups``-quantiles (equal values stay together, so there may be fewer groups).
    Each group is represented by its median member (by mean defocus) without astigmatism:
    the defocus ``(U + V) / 2``, the member's other parameters.

    Parameters
    ----------
    ctf : CTF
        ``n`` images' parameters.
    max_groups : int, default=CTF_GROUPS
        At least 1.

    Returns
    -------
    labels : ndarray of shape (n,)
        Each image's group, ``0 .. G - 1`` in the order of the groups' mean defocus.
    representatives : CTF
        ``G`` radial CTFs, one per group (none for a CTF of no images).
    """
    ctf = _check_ctf(ctf)
    max_groups = _check_max_groups(max_groups)
    n = len(ctf)
    if n == 0:
        return np.zeros(0, dtype=np.int64), ctf
    mean = (ctf.defocus_u + ctf.defocus_v) / 2.0
    rows = np.stack([getattr(ctf, f.name) for f in fields(ctf)], axis=1)
    # by mean defocus, then by all the parameters (equal CTFs adjacent)
    order = np.lexsort((*rows.T[::-1], mean))
    distinct, inverse = np.unique(rows[order], axis=0, return_inverse=True)
    labels = np.empty(n, dtype=np.int64)
    if len(distinct) <= max_groups:
        # np.unique sorts its rows by the first column, defocus_u: renumber in mean defocus
        first = np.full(len(distinct), n)
        np.minimum.at(first, inverse.ravel(), np.arange(n))
        rank = np.empty(len(distinct), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(distinct))
        labels[order] = rank[inverse.ravel()]
    else:
        # cut at the quantiles of the mean defocus: equal defocus values stay together
        cuts = np.quantile(mean, np.arange(1, max_groups) / max_groups)
        labels = np.unique(np.searchsorted(cuts, mean, side="right"), return_inverse=True)[1]
        labels = labels.reshape(n).astype(np.int64)
    n_groups = int(labels.max()) + 1
    median = np.empty(n_groups, dtype=np.int64)
    for g in range(n_groups):
        members = order[labels[order] == g]
        median[g] = members[(len(members) - 1) // 2]
    rep = {f.name: getattr(ctf, f.name)[median] for f in fields(ctf)}
    rep["defocus_u"] = rep["defocus_v"] = mean[median]
    rep["defocus_angle"] = np.zeros(n_groups)
    return labels, CTF(**rep)


def _check_max_groups(max_groups) -> int:
    """``ctf_groups``' value as an int, or a ``ValueError`` naming it."""
    if isinstance(max_groups, bool) or not isinstance(max_groups, numbers.Integral) \
            or max_groups < 1:
        raise ValueError(f"ctf_groups: expected a positive int, got {max_groups!r}")
    return int(max_groups)


def cross_ctf_filters(representatives, shape, *, dtype=torch.float64, device="cpu"):
    """Filters ``(G, G, H, W // 2 + 1)`` (``torch.fft.rfft2``'s grid) that make phase-flipped
    images of two CTF groups comparable: entry ``[g, h]``,
    ``|C_h| / sqrt(C_g^2 + C_h^2 + eps)``, filters an image of group ``g`` compared with one
    of group ``h``, which gets entry ``[h, g]``.

    For one projection ``p`` seen through ``C_g`` and ``C_h`` (phase-flipped: ``|C_g| p`` and
    ``|C_h| p``), both filtered images are ``|C_g C_h| p / sqrt(C_g^2 + C_h^2 + eps)``: equal,
    whatever the two defocus values, where phase-flipped images alone differ by
    ``(|C_g| - |C_h|) p``. White noise of variance ``s^2`` in both images leaves their
    difference white, of variance ``s^2 (C_g^2 + C_h^2) / (C_g^2 + C_h^2 + eps)``, so that
    distances between groups compare with distances within one.

    Parameters
    ----------
    representatives : CTF
        One radial CTF per group (:func:`ctf_groups`).
    shape : (int, int)
        ``(H, W)``.
    dtype, device
        Of the filters.
    """
    C = ctf_images(representatives, shape, dtype=dtype, device=device, half=True).abs()
    denom = torch.sqrt(C[:, None] ** 2 + C[None, :] ** 2 + _CROSS_EPS)
    return C[None, :] / denom


def wiener_filter(images, ctf, *, snr=1.0):
    """Each image Wiener-filtered by its own CTF: ``IFFT(C F(y) / (C^2 + 1 / snr))``.

    ``snr``: a number (the same at every frequency; a 0-d array is one), per frequency an
    array of shape ``(H, W // 2 + 1)`` (``torch.fft.rfft2``'s grid), e.g.
    :func:`spectral_snr`'s, or ``"auto"``: :func:`spectral_snr` of these images with the
    noise measured on them. The result is in the images' floating dtype (as
    :func:`phase_flip`).
    """
    return _filtered(images, ctf, lambda C, reg: C / (C ** 2 + reg), snr=snr)


def _is_auto(snr) -> bool:
    return isinstance(snr, str) and snr == "auto"


def _scalar(snr):
    """A 0-d NumPy array or tensor as its number; anything else as it is."""
    if isinstance(snr, (np.ndarray, torch.Tensor)) and snr.ndim == 0 \
            and snr.dtype not in (np.bool_, torch.bool):
        return snr.item()
    return snr


def _check_snr(snr):
    snr = _scalar(snr)
    if isinstance(snr, bool) or not isinstance(snr, numbers.Real):
        raise TypeError(f"snr: expected a positive number, got {snr!r}")
    if not (math.isfinite(snr) and snr > 0):
        raise ValueError(f"snr: expected a positive finite number, got {snr!r}")
    return float(snr)


def _regulariser(snr, x: torch.Tensor, ctf=None):
    """``1 / snr`` as a number or a ``(H, W // 2 + 1)`` tensor like ``x`` ``(..., H, W)``;
    ``"auto"``: of :func:`spectral_snr` of the images ``x`` ``(n, H, W)`` under ``ctf``."""
    snr = _scalar(snr)
    if isinstance(snr, numbers.Real) and not isinstance(snr, bool):
        return 1.0 / _check_snr(snr)
    if _is_auto(snr):
        return 1.0 / spectral_snr(x, ctf, snr="auto").to(device=x.device, dtype=x.dtype)
    if isinstance(snr, (str, bytes, bool)) or snr is None:
        raise TypeError(f"snr: expected 'auto', a positive number or an array of positive "
                        f"numbers, got {snr!r}")
    h, w = x.shape[-2:]
    if isinstance(snr, torch.Tensor):
        s = snr
    else:
        arr = as_array(snr, "snr")
        if arr.dtype.kind not in "biufc":
            raise TypeError(f"snr: expected 'auto', a positive number or an array of positive "
                            f"numbers, got dtype {arr.dtype}")
        s = to_tensor(arr)
    if s.dtype.is_complex or s.dtype == torch.bool:
        raise TypeError(f"snr: expected real numbers, got dtype {s.dtype}")
    if tuple(s.shape) != (h, w // 2 + 1):
        raise ValueError(f"snr: expected a number or an array of shape {(h, w // 2 + 1)} (the "
                         f"rfft2 grid), got shape {tuple(s.shape)}")
    if not bool(torch.isfinite(s).all()) or bool((s <= 0).any()):
        raise ValueError("snr: expected positive finite values")
    return 1.0 / s.to(device=x.device, dtype=x.dtype)


def spectral_snr(images, ctf=None, *, snr="auto"):
    """The signal-to-noise ratio at each frequency, ``(H, W // 2 + 1)`` (``rfft2``'s grid), for
    the Wiener filters: the projections' radially averaged power over the noise's.

    The noise is taken white. Its variance is measured on the images
    (:func:`invariant_cluster.denoise.estimate_noise_std`) with ``snr="auto"``, or is
    ``var / (1 + snr)`` for a number ``snr`` (the images' overall signal-to-noise ratio,
    signal variance over noise variance; ``var`` their mean pixel variance). The projections'
    power at radius ``r`` is the images' mean power there less the noise's, divided by the
    mean ``C^2`` there (at least 1e-3), and at least 1e-6 of its largest value. The means on
    each ring are those of the full Fourier transform: on ``rfft2``'s half grid a coefficient
    of the columns between ``kx = 0`` and the Nyquist column stands for itself and its
    conjugate, those columns' for themselves alone. A regulariser
    ``1 / snr`` that is the same at every frequency over-smooths the low frequencies, where a
    projection has most of its power, and lets the noise of the high ones through.

    Parameters
    ----------
    images : array-like or torch.Tensor of shape (n, H, W)
        At least one image.
    ctf : CTF of length n, optional
        None: no CTF (``C = 1``).
    snr : "auto" or float, default="auto"

    Returns
    -------
    snr_k : torch.Tensor of shape (H, W // 2 + 1)
        On the images' device and dtype (float32 for integer images, and for float16 and
        bfloat16 ones: the ratio spans more than their range); infinity where there is no
        noise.
    """
    if ctf is not None:
        ctf = _check_ctf(ctf)
    x, _, _ = _as_image_tensor(images, None if ctf is None else len(ctf))
    n, h, w = x.shape
    if n == 0:
        raise ValueError("images: expected at least one image to measure the spectral SNR "
                         f"on, got shape {tuple(x.shape)}")
    if _is_auto(snr):
        from .denoise import estimate_noise_std

        sigma2 = estimate_noise_std(x[:, None]) ** 2
    else:
        sigma2 = float(x.reshape(n, -1).var(1).mean()) / (1.0 + _check_snr(snr))
    ky, kx = _frequencies(h, w, half=True, dtype=x.dtype, device=x.device)
    r = torch.round(torch.sqrt((ky * h) ** 2 + (kx * w) ** 2)).long()  # radius in pixels^-1
    nbin = int(r.max()) + 1
    # the number of full-grid coefficients each half-grid one stands for: 2 (itself and its
    # conjugate), 1 in the kx = 0 column and, for even W, the Nyquist column
    weight = torch.full((w // 2 + 1,), 2.0, dtype=x.dtype, device=x.device)
    weight[0] = 1.0
    if w % 2 == 0:
        weight[-1] = 1.0
    weight = weight.expand(h, -1).reshape(-1)
    counts = torch.zeros(nbin, dtype=x.dtype, device=x.device).index_add_(0, r.reshape(-1),
                                                                          weight)

    def radial(v):  # (H, W//2+1) -> its mean on each ring of the full grid, put back on it
        sums = torch.zeros(nbin, dtype=v.dtype, device=v.device).index_add_(
            0, r.reshape(-1), v.reshape(-1) * weight)
        return (sums / counts.clamp_min(1))[r]

    noise = sigma2 * h * w  # white noise's power per coefficient (unnormalised FFT)
    if noise == 0.0:
        return torch.full((h, w // 2 + 1), math.inf, dtype=x.dtype, device=x.device)
    power = torch.zeros((h, w // 2 + 1), dtype=x.dtype, device=x.device)
    c2 = torch.zeros_like(power) if ctf is not None else torch.ones_like(power) * n
    for i in range(0, n, 256):  # blocks of images: the spectra of all n at once may not fit
        power += (torch.fft.rfft2(x[i:i + 256]).abs() ** 2).sum(0)
        if ctf is not None:
            c2 += (ctf_images(ctf[i:i + 256], (h, w), dtype=x.dtype, device=x.device,
                              half=True) ** 2).sum(0)
    signal = (radial(power / n) - noise).clamp_min(0) / radial(c2 / n).clamp_min(1e-3)
    signal = signal.clamp_min(1e-6 * float(signal.max()) + 1e-30)
    return signal / noise


def wiener_combine(images: torch.Tensor, C: torch.Tensor, reg) -> torch.Tensor:
    """Tensor core of :func:`wiener_average`: ``images`` ``(..., k, H, W)`` aligned, ``C``
    ``(..., k, H, W // 2 + 1)`` their CTFs (half grid), ``reg`` ``1 / snr`` (a number or
    ``(H, W // 2 + 1)``); the ``(..., H, W)`` estimates."""
    h, w = images.shape[-2:]
    F = torch.fft.rfft2(images)
    num = (C * F).sum(-3)
    den = (C ** 2).sum(-3) + reg
    return torch.fft.irfft2(num / den, s=(h, w))


def wiener_average(images, ctf, *, snr=1.0):
    """CTF-corrected average of aligned images: ``IFFT(sum_i C_i F(y_i) / (sum_i C_i^2 +
    1 / snr))``, an estimate of the image without CTF.

    Parameters
    ----------
    images : array-like or torch.Tensor of shape (k, H, W)
        Images of one object, already aligned with one another.
    ctf : CTF of length k
        Each image's CTF (for images warped into alignment: :meth:`CTF.warped`).
    snr : float, array-like of shape (H, W // 2 + 1) or "auto", default=1.0
        Signal-to-noise ratio of one image (variance of the signal over that of the noise), or
        per frequency (:func:`spectral_snr`; ``"auto"``: its estimate from these ``k``
        images, noise measured on them): the regularisation ``1 / snr`` keeps the
        frequencies where every CTF vanishes at zero.

    Returns
    -------
    average : ndarray or torch.Tensor of shape (H, W)
        In the images' floating dtype (as :func:`phase_flip`).

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.ctf import CTF, apply_ctf, wiener_average
    >>> rng = np.random.default_rng(0)
    >>> p = rng.random((32, 32))
    >>> ctf = CTF([10000.0, 15000.0, 20000.0, 25000.0], voltage=200, pixel_size=3.0)
    >>> y = apply_ctf(np.stack([p] * 4), ctf)
    >>> avg = wiener_average(y, ctf, snr=1e6)
    >>> bool(np.corrcoef(avg.ravel(), p.ravel())[0, 1] > 0.99)
    True
    """
    ctf = _check_ctf(ctf)
    x, is_numpy, dtype = _as_image_tensor(images, len(ctf))
    if x.shape[0] == 0:
        raise ValueError(f"images: expected at least one image to average, got shape "
                         f"{tuple(x.shape)}")
    reg = _regulariser(snr, x, ctf)
    C = ctf_images(ctf, x.shape[-2:], dtype=x.dtype, device=x.device, half=True)
    out = wiener_combine(x, C, reg)
    return _returned(out, is_numpy, dtype)


# ----------------------------------------------------------------------------- STAR files
def _starfile():
    try:
        import starfile
    except ImportError:
        raise ImportError(f"reading or writing STAR files needs starfile: {_STAR_HINT}") \
            from None
    return starfile


# RELION's default amplitude contrast, taken where a RELION 3.0 file has no column for it
RELION_AMPLITUDE_CONTRAST = 0.1


def _existing_file(path, what):
    """``path`` as a Path, a FileNotFoundError or IsADirectoryError naming it otherwise."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a folder, expected {what}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return path


def _blocks(path):
    """``{name: DataFrame}`` of a STAR file's data blocks: its loops, and its blocks of
    key/value pairs (one particle written without ``loop_``) as one-row tables."""
    import pandas as pd

    starfile = _starfile()
    path = _existing_file(path, "a STAR file")
    try:
        data = starfile.read(path, always_dict=True)
    except Exception as exc:  # starfile raises many kinds on malformed input
        raise ValueError(f"{path}: cannot read it as a STAR file ({exc})") from None
    blocks = {}
    for name, block in data.items():
        if isinstance(block, dict):
            block = pd.DataFrame({k: [v] for k, v in block.items()})
        if isinstance(block, pd.DataFrame):
            blocks[name] = block
    return blocks


def _particles_block(blocks, path):
    for name in ("particles", "images"):
        if name in blocks:
            return blocks[name]
    loops = [df for name, df in blocks.items() if name != "optics"]
    if len(loops) == 1:
        return loops[0]
    raise ValueError(f"{path}: expected a data_particles block (or a single table), got "
                     f"blocks {sorted(blocks)}")


def _missing(value):
    """Whether a value of a table read by starfile is missing (a short row leaves NaN in
    number columns and an empty string in text ones)."""
    return value is None or (isinstance(value, str) and not value) or (
        isinstance(value, float) and math.isnan(value))


def _check_complete(table, name, path):
    """A ValueError naming the first row of ``table`` whose last values are missing: the file
    was cut short or a row lost its last fields (not a silent NaN further on)."""
    if table.empty or not len(table.columns):
        return
    last = table.iloc[:, -1]
    short = [i for i, v in enumerate(last.tolist()) if _missing(v)]
    if not short:
        return
    i = short[0]
    row = table.iloc[i].tolist()
    n = len(row)
    while n and _missing(row[n - 1]):
        n -= 1
    where = "the last row" if i == len(table) - 1 else f"row {i + 1}"
    raise ValueError(f"{path}: {where} of data_{name} is incomplete, {n} of its "
                     f"{len(row)} values (is the file truncated?)")


def _group_key(series, path, block):
    """``rlnOpticsGroup`` as comparable keys: whole numbers as ints (``1``, ``1.0`` and the
    text ``"1"`` are one group), other text as the stripped text (group names)."""
    def key(v):
        if isinstance(v, (bool, np.bool_)):
            return str(v)
        if isinstance(v, numbers.Real):
            if not math.isfinite(v):
                raise ValueError(f"{path}: data_{block}: rlnOpticsGroup holds a missing value")
            return int(v) if float(v).is_integer() else float(v)
        text = str(v).strip()
        try:
            f = float(text)
        except ValueError:
            return text
        return int(f) if math.isfinite(f) and f.is_integer() else text
    return series.map(key)


def _join_optics(table, optics, path):
    """The particles' table with the columns of their optics group (RELION >= 3.1)."""
    key = "rlnOpticsGroup"
    groups = _group_key(optics[key], path, "optics")
    dup = sorted(set(groups[groups.duplicated()]), key=str)
    if dup:
        raise ValueError(f"{path}: data_optics lists {key} {', '.join(map(str, dup))} more "
                         "than once (expected each optics group once)")
    own = _group_key(table[key], path, "particles")
    unknown = sorted(set(own) - set(groups), key=str)
    if unknown:
        raise ValueError(f"{path}: {key} {unknown} not in the data_optics block (it lists "
                         f"{list(groups)})")
    extra = [c for c in optics.columns if c not in table.columns]
    rows = dict(zip(groups, range(len(groups))))
    at = [rows[g] for g in own]
    merged = table.copy()
    for c in extra:
        merged[c] = optics[c].to_numpy()[at]
    return merged


def _pixel_size(table, path):
    if "rlnImagePixelSize" in table:
        return table["rlnImagePixelSize"]
    if "rlnDetectorPixelSize" in table and "rlnMagnification" in table:
        # RELION 3.0: pixel size = detector pixel (um) * 1e4 / magnification
        return table["rlnDetectorPixelSize"] * 1e4 / table["rlnMagnification"]
    return None


def _check_n_images(n_images):
    if n_images is None:
        return None
    if isinstance(n_images, (bool, np.bool_)) or not isinstance(n_images, numbers.Integral):
        raise TypeError(f"n_images: expected an int, got {type(n_images).__name__} "
                        f"{n_images!r}")
    if n_images < 0:
        raise ValueError(f"n_images: expected a non-negative int, got {n_images}")
    return int(n_images)


def _check_pixel_size(pixel_size):
    if pixel_size is None:
        return None
    if isinstance(pixel_size, (bool, np.bool_)) or not isinstance(pixel_size, numbers.Real):
        raise TypeError(f"pixel_size: expected a positive number (ångström), got "
                        f"{type(pixel_size).__name__} {pixel_size!r}")
    if not (math.isfinite(pixel_size) and pixel_size > 0):
        raise ValueError(f"pixel_size: expected a positive number (ångström), got "
                         f"{pixel_size!r}")
    return float(pixel_size)


def _check_rows(n_rows, n_images, path):
    if n_images is not None and n_rows != n_images:
        raise ValueError(f"{path}: has {n_rows} particle rows, expected {n_images} (one per "
                         "image of the stack)")


def _make_ctf(values, path, names, kind):
    """``CTF(**values)``; its range errors name the file's ``kind`` (column, field)
    ``names[field]``."""
    try:
        return CTF(**values)
    except ValueError as exc:
        field, _, rest = str(exc).partition(":")
        raise ValueError(f"{path}: {kind} {names.get(field, field)}: {rest.strip()}") from None


def read_star(path, *, n_images=None, pixel_size=None):
    """The CTF of each particle of a RELION STAR file (``_data.star``, ``particles.star``).

    Needs the optional package ``starfile`` (``pip install invariant_cluster[cryoem]``).
    RELION >= 3.1 files (a ``data_optics`` block joined on ``rlnOpticsGroup``), 3.0 files
    (every column in the particles' table) and a single particle written as key/value pairs
    (a data block without ``loop_``) are read. A file without ``rlnAmplitudeContrast`` (RELION
    3.0 leaves it out at its default) gets RELION's 0.1, with a warning.

    Parameters
    ----------
    path : str or os.PathLike
    n_images : int, optional
        The number of images of the stack the file describes: a different number of particle
        rows is a ``ValueError``.
    pixel_size : float, optional
        The pixel size in ångström, instead of the file's (``rlnImagePixelSize``, or RELION
        3.0's ``rlnDetectorPixelSize`` x 1e4 / ``rlnMagnification``). Needed where the file
        gives none (cryoDRGN's files).

    Returns
    -------
    ctf : CTF
        One row per particle, in the file's order.
    table : pandas.DataFrame
        The particles' table as read (for :func:`write_star`).

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        ``path`` is not a file.
    TypeError
        ``n_images`` not an int, ``pixel_size`` not a number.
    ValueError
        A column missing or holding something else than numbers (the message names the column
        and the file), an incomplete row (a truncated file), a ``data_optics`` block listing an
        optics group twice or not listing one of the particles', rows not matching
        ``n_images``, or values out of range (negative defocus, non-positive pixel size).

    Warns
    -----
    UserWarning
        Where the file has no ``rlnAmplitudeContrast`` and RELION's 0.1 is taken.
    """
    ctf, table, _ = _read_star(path, n_images, pixel_size)
    return ctf, table


def _read_star(path, n_images, pixel_size):
    """:func:`read_star`'s ``(ctf, table)`` and the file's ``data_optics`` block (None where
    it has none), from one reading of the file."""
    import warnings

    n_images = _check_n_images(n_images)
    pixel_size = _check_pixel_size(pixel_size)
    blocks = _blocks(path)
    table = _particles_block(blocks, path)
    name = next(k for k, v in blocks.items() if v is table)
    _check_complete(table, name or "", path)
    optics = blocks.get("optics")
    merged = table
    if optics is not None and "rlnOpticsGroup" in table and "rlnOpticsGroup" in optics:
        _check_complete(optics, "optics", path)
        merged = _join_optics(table, optics, path)
    _check_rows(len(merged), n_images, path)
    values = {}
    for field, column in STAR_COLUMNS.items():
        if field == "pixel_size":
            col = _pixel_size(merged, path) if pixel_size is None else pixel_size
            if col is None:
                raise ValueError(f"{path}: no pixel size (missing column rlnImagePixelSize, "
                                 "or rlnDetectorPixelSize and rlnMagnification): pass "
                                 "pixel_size= (--pixel-size on the command line)")
        else:
            col = merged.get(column)
        if col is None and field == "amplitude_contrast":
            warnings.warn(f"{path}: no column rlnAmplitudeContrast; taking RELION's default "
                          f"{RELION_AMPLITUDE_CONTRAST}", UserWarning, stacklevel=3)
            col = RELION_AMPLITUDE_CONTRAST
        if col is None:
            if field in _OPTIONAL:
                continue
            raise ValueError(f"{path}: missing column {column} ({field.replace('_', ' ')})")
        try:
            values[field] = np.broadcast_to(np.asarray(col, dtype=np.float64), (len(merged),))
        except (TypeError, ValueError):
            raise ValueError(f"{path}: column {column} holds values that are not numbers") \
                from None
        if not np.isfinite(values[field]).all():
            raise ValueError(f"{path}: column {column} holds missing or infinite values")
    return _make_ctf(values, path, STAR_COLUMNS, "column"), table, optics


# cryoSPARC's field of each CTF field, and the factor to this package's units
CS_FIELDS = {
    "defocus_u": ("ctf/df1_A", 1.0),
    "defocus_v": ("ctf/df2_A", 1.0),
    "defocus_angle": ("ctf/df_angle_rad", 180.0 / math.pi),
    "voltage": ("ctf/accel_kv", 1.0),
    "spherical_aberration": ("ctf/cs_mm", 1.0),
    "amplitude_contrast": ("ctf/amp_contrast", 1.0),
    "pixel_size": ("blob/psize_A", 1.0),
    "phase_shift": ("ctf/phase_shift_rad", 180.0 / math.pi),
}


def read_cs(path, *, pixel_size=None, n_images=None):
    """The CTF of each particle of a cryoSPARC ``.cs`` file (a NumPy structured array).

    The fields read are ``ctf/df1_A``, ``ctf/df2_A``, ``ctf/df_angle_rad`` (radians, turned into
    RELION's degrees), ``ctf/accel_kv``, ``ctf/cs_mm``, ``ctf/amp_contrast``,
    ``ctf/phase_shift_rad`` (0 where absent) and ``blob/psize_A``; ``blob/idx`` (0-based) and
    ``blob/path`` name each particle's image. The same particles' RELION STAR file gives the
    same CTF (:func:`read_star`).

    Parameters
    ----------
    path : str or os.PathLike
    pixel_size : float, optional
        The pixel size in ångström, instead of ``blob/psize_A``.
    n_images : int, optional
        The number of images of the stack the file describes: a different number of rows is a
        ``ValueError``.

    Returns
    -------
    ctf : CTF
        One row per particle, in the file's order.
    table : pandas.DataFrame
        The particles in RELION's labels (``rlnImageName`` as ``N@path``, 1-based, where the
        file has ``blob/idx`` and ``blob/path``; the CTF's columns as :data:`STAR_COLUMNS`),
        which :func:`write_star` writes as a STAR file RELION reads.

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        ``path`` is not a file.
    TypeError
        ``n_images`` not an int, ``pixel_size`` not a number.
    ValueError
        Not a structured NumPy array, a field missing (the message names the field and the
        file), rows not matching ``n_images``, or values out of range.
    """
    import pandas as pd

    n_images = _check_n_images(n_images)
    pixel_size = _check_pixel_size(pixel_size)
    path = _existing_file(path, "a cryoSPARC .cs file")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:  # NumPy raises many kinds on a file that is not .npy
        raise ValueError(f"{path}: cannot read it as a cryoSPARC .cs file (a NumPy structured "
                         f"array): {' '.join(str(exc).split())}") from None
    if not isinstance(data, np.ndarray):  # an .npz archive
        data.close()
        raise ValueError(f"{path}: expected a cryoSPARC .cs file (a NumPy structured array), "
                         "got an .npz archive")
    names = data.dtype.names
    if not names or data.ndim != 1:
        raise ValueError(f"{path}: expected a cryoSPARC .cs file (a 1-D NumPy structured "
                         f"array), got an array of dtype {data.dtype} and shape {data.shape}")
    _check_rows(len(data), n_images, path)
    values, columns = {}, {f: name for f, (name, _) in CS_FIELDS.items()}
    for field, (name, factor) in CS_FIELDS.items():
        if field == "pixel_size" and pixel_size is not None:
            values[field] = np.full(len(data), pixel_size)
            continue
        if name not in names:
            if field in _OPTIONAL:
                continue
            hint = " (or pass pixel_size=, --pixel-size on the command line)" \
                if field == "pixel_size" else ""
            raise ValueError(f"{path}: missing field {name} ({field.replace('_', ' ')}){hint}")
        col = data[name]
        if col.ndim != 1 or col.dtype.kind not in "iuf":
            raise ValueError(f"{path}: field {name}: expected one number per particle, got "
                             f"dtype {col.dtype} of shape {col.shape}")
        values[field] = _decimal(col) * factor
        if not np.isfinite(values[field]).all():
            raise ValueError(f"{path}: field {name} holds missing or infinite values")
    ctf = _make_ctf(values, path, columns, "field")
    table = pd.DataFrame()
    if "blob/idx" in names and "blob/path" in names:
        table["rlnImageName"] = [f"{int(i) + 1:06d}@{_cs_text(p)}"
                                 for i, p in zip(data["blob/idx"], data["blob/path"])]
    for field, column in STAR_COLUMNS.items():
        table[column] = getattr(ctf, field)
    return ctf, table


def _decimal(col):
    """float64 values of a field: float32 values as the shortest decimal that is the same
    float32 (cryoSPARC stores 0.07 as float32; it reads back as 0.07, as a STAR file says)."""
    if col.dtype != np.float32:
        return col.astype(np.float64)
    unique, inverse = np.unique(col, return_inverse=True)
    return unique.astype(str).astype(np.float64)[inverse.reshape(-1)]


def _cs_text(value):
    """A path of a ``.cs`` file as text (cryoSPARC marks imported files with a leading ``>``)."""
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text[1:] if text.startswith(">") else text


_OPTICS_FIELDS = ("voltage", "spherical_aberration", "amplitude_contrast", "pixel_size")


def star_tables(ctf: CTF):
    """RELION >= 3.1 tables of ``ctf``: ``(optics, particles)`` pandas DataFrames, one optics
    group per distinct (voltage, Cs, amplitude contrast, pixel size), the particles' defocus,
    angle and phase shift with their ``rlnOpticsGroup`` (for :func:`write_star`)."""
    import pandas as pd

    ctf = _check_ctf(ctf)
    key = np.stack([getattr(ctf, f) for f in _OPTICS_FIELDS], 1)
    groups, inverse = np.unique(key, axis=0, return_inverse=True)
    optics = pd.DataFrame({"rlnOpticsGroupName": [f"opticsGroup{i + 1}"
                                                  for i in range(len(groups))],
                           "rlnOpticsGroup": np.arange(1, len(groups) + 1)})
    for j, f in enumerate(_OPTICS_FIELDS):
        optics[STAR_COLUMNS[f]] = groups[:, j]
    particles = pd.DataFrame({STAR_COLUMNS[f]: getattr(ctf, f) for f in
                              ("defocus_u", "defocus_v", "defocus_angle", "phase_shift")})
    particles["rlnOpticsGroup"] = inverse.reshape(-1) + 1
    return optics, particles


def _exact_text(table):
    """``table`` with its float columns as the shortest text that reads back as the same
    float64 (``repr``), so that a STAR file keeps every digit (starfile's own format keeps 6
    decimals); missing values stay missing."""
    out = table.copy()
    for c in out.columns:
        if out[c].dtype.kind == "f":
            out[c] = [None if math.isnan(v) else repr(float(v)) for v in out[c].tolist()]
    return out


def write_star(path, table, *, optics=None, overwrite=True):
    """Write a particles table (a pandas DataFrame, RELION's labels as columns) as a STAR
    file, through a temporary file in the same folder renamed at the end (nothing is left
    half-written).

    Numbers are written with every digit they have (the shortest text that reads back as the
    same float64). A symbolic link is written through: its target is replaced and the link
    kept. An existing file keeps its permissions; a new one is readable by all (``0644``).

    Parameters
    ----------
    path : str or os.PathLike
    table : pandas.DataFrame
        Written as ``data_particles``.
    optics : pandas.DataFrame, optional
        Written first as ``data_optics`` (RELION >= 3.1).
    overwrite : bool, default=True

    Raises
    ------
    OSError
        The file cannot be written; the message names ``path`` (the link's target for a link).
    """
    import stat

    import pandas as pd

    starfile = _starfile()
    for name, t in (("table", table), ("optics", optics)):
        if t is not None and not isinstance(t, pd.DataFrame):
            raise TypeError(f"{name}: expected a pandas DataFrame, got {type(t).__name__}")
    path = Path(path)
    target = Path(os.path.realpath(path))  # through symbolic links, to the file itself
    if target.is_dir():
        raise IsADirectoryError(f"{path}: a folder, expected a STAR file's path")
    if target.exists() and not overwrite:
        raise FileExistsError(f"{path}: exists (overwrite=False)")
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o644
    blocks = {} if optics is None else {"optics": _exact_text(optics)}
    blocks["particles"] = _exact_text(table)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(suffix=".star", prefix=f".{target.name}.",
                                   dir=target.parent)
        os.close(fd)
        starfile.write(blocks, tmp, overwrite=True)
        os.chmod(tmp, mode)  # mkstemp's 0600 would hide the result from others
        os.replace(tmp, target)
    except OSError as exc:
        reason = exc.strerror or " ".join(str(exc).split()) or type(exc).__name__
        raise type(exc)(f"{target}: cannot write the STAR file ({reason})") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
