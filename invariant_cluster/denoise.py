"""Denoising before the search: a PCA whose subspace every quarter turn and mirror maps onto itself.

Noisy images are compared badly pixel by pixel: the noise fills the high frequencies and the
many small principal directions, which carry little of what tells two views apart. Cryo-EM's
class-averaging software (ASPIRE's ``RIRClass2D``) therefore compares images after a steerable
PCA. :class:`DihedralPCA` is the cheap version of that step:

1. each image is zoomed out to ``output_size x output_size`` pixels (optional; an
   anti-aliased, uniform zoom about the centre, so the down-sampling commutes with the
   rotations about the centre and with the mirror, see :func:`downsample`);
2. the images are projected onto the ``n_components`` leading eigenvectors of their covariance
   averaged over the dihedral group of the canvas (quarter turns and mirrors for a square
   image; half turn and mirrors otherwise), around the group-averaged mean.

The covariance so averaged commutes with every element of the group, so the projection does
too: a quarter turn or a mirror of an image is denoised into the same turn or mirror of its
denoised version (exactly, up to round-off; the test suite checks it), and other rotations
approximately (the images' own statistics are nearly rotation-invariant). Alignments found on
the denoised copy are alignments of the originals, once the shifts are scaled by ``scale_``.

Maintenance note, measured on ASPIRE's simulated projections (2,000 images of 63 x 63 pixels,
72 angles with mirrors, 10 neighbours, one thread; ``benchmarks/bench_cryoem.py``): the share
of the 10 nearest neighbours within 10 degrees of viewing direction was, on the pixels / after
``DihedralPCA(40, output_size=24)``: 0.72 / 0.96 at SNR 4 and 0.24 / 0.68 at SNR 1 (ASPIRE 0.84
and 0.10), with the search in 3 s instead of 11 s. With offsets of +-2 px, add ``center=True``
to the search (:func:`~invariant_cluster.barycenters.aligned_neighbors`): 0.92 and 0.61.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
import scipy.linalg
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ._duplicates import canonical_order
from ._estimator import ImageInputMixin
from ._utils import evenly_spaced_indices, to_tensor

__all__ = ["DihedralPCA", "RadialWiener", "downsample", "estimate_noise_std"]

# the covariance is F x F float64: beyond this many values per (down-sampled) image, ask for
# output_size instead of allocating gigabytes
MAX_FEATURES = 8192
# n_components="auto" computes every eigenvalue (64 x 64 output pixels: a few seconds)
MAX_AUTO_FEATURES = 4096


def downsample(X: torch.Tensor, size: int) -> torch.Tensor:
    """``(n, C, H, W)`` images (``H == W``) seen through a uniform zoom onto ``size x size``.

    Anti-aliased bilinear resampling (``F.interpolate(..., antialias=True,
    align_corners=False)``): output pixel ``i`` is centred on input coordinate
    ``(i + 1/2) H / size - 1/2`` and averages its neighbourhood with a symmetric triangle
    filter ``H / size`` pixels wide. The zoom is the same everywhere, so a rotation or a shift of
    ``t`` output pixels is the same rotation or a shift of ``t H / size`` input pixels; the
    canvas's centre ``(H - 1) / 2`` lands on ``(size - 1) / 2``, so the result commutes with the
    quarter turns and mirrors.

    Maintenance note: the first version used ``adaptive_avg_pool2d``, whose windows are uneven
    when ``size`` does not divide ``H`` (63 -> 32 mixes windows of 2 and 3 pixels): it commutes
    with the quarter turns, but the zoom is not uniform, so other rotations of the copy are not
    rotations of the image. On ASPIRE's projections (``benchmarks/bench_cryoem.py``, SNR 1/4,
    63 -> 32, ``DihedralPCA(40)``) the share of neighbours within 10 degrees went from 0.156 to
    0.220 with the uniform zoom (0.204 and 0.208 at 63 -> 21, where the windows are even).
    """
    if X.shape[-1] == size and X.shape[-2] == size:
        return X
    return F.interpolate(X, size=(size, size), mode="bilinear", antialias=True,
                         align_corners=False)


def _group_average(C: np.ndarray, shape) -> np.ndarray:
    """``C`` (an ``F x F`` matrix on images of ``shape`` ``(c, h, w)``) averaged over the
    dihedral group of the canvas: ``mean_g P_g C P_g^T``."""
    c, h, w = shape
    A = C.reshape(c, h, w, c, h, w)
    out = np.zeros_like(A)
    mirrors = (A, A[:, :, ::-1][..., ::-1])  # the mirror (x -> -x) acting on both sides
    if h == w:
        for B in mirrors:
            for k in range(4):
                out += np.rot90(np.rot90(B, k, axes=(1, 2)), k, axes=(4, 5))
        out /= 8.0
    else:
        for B in mirrors:
            out += B
            out += B[:, ::-1, ::-1][:, :, :, :, ::-1, ::-1]
        out /= 4.0
    return out.reshape(C.shape)


def _mean_average(m: np.ndarray, shape) -> np.ndarray:
    """The image ``m`` (``(c, h, w)`` flattened) averaged over the dihedral group."""
    c, h, w = shape
    A = m.reshape(c, h, w)
    mirrors = (A, A[:, :, ::-1])
    if h == w:
        out = sum(np.rot90(B, k, axes=(1, 2)) for B in mirrors for k in range(4)) / 8.0
    else:
        out = sum(B + B[:, ::-1, ::-1] for B in mirrors) / 4.0
    return np.ascontiguousarray(out).reshape(-1)


def _hard_threshold_rank(eigenvalues: np.ndarray, n_samples: int) -> int:
    """How many of the covariance's ``eigenvalues`` (descending) lie above the optimal hard
    threshold of Gavish and Donoho (2014, "The optimal hard threshold for singular values is
    4/sqrt(3)") for noise of unknown level: singular values ``sqrt(eigenvalue)`` above
    ``omega(beta)`` times their median, ``beta = min(f, n) / max(f, n)``."""
    f = eigenvalues.size
    sv = np.sqrt(np.clip(eigenvalues[:min(f, n_samples)], 0.0, None))
    beta = min(f, n_samples) / max(f, n_samples)
    omega = 0.56 * beta ** 3 - 0.95 * beta ** 2 + 1.82 * beta + 1.43
    return int(np.count_nonzero(sv > omega * np.median(sv)))


class DihedralPCA(ImageInputMixin, TransformerMixin, BaseEstimator):
    """Denoise images by a PCA whose covariance is averaged over quarter turns and mirrors.

    The search for neighbours in noisy images (cryo-EM particles, noisy digits) is more reliable
    on a denoised copy: put this transformer before
    :class:`~invariant_cluster.InvariantKNeighborsTransformer` in a pipeline, or pass it as
    ``denoise`` to :func:`~invariant_cluster.class_averages` (which searches on the copy and
    averages the original images).

    Parameters
    ----------
    n_components : int or "auto", default=40
        Principal directions kept. One more is kept where the next eigenvalue equals the last
        one (a degenerate pair of the group: cutting it would break the symmetry); at most the
        number of values per output image. "auto": those above the optimal hard threshold of
        Gavish and Donoho (2014) for white noise of unknown level, ``omega(beta)`` times the
        median singular value, ``beta`` the values per output image over the images (the
        full spectrum is computed: at most ``MAX_AUTO_FEATURES`` values per image). The
        fewer the noisier the images: on 2,000 cryo-EM projections zoomed to 32 x 32, 143
        directions at SNR 4 down to 20 at SNR 1/16 with the CTF, 55 down to 5 without
        (``benchmarks/results/cryoem.json`` run ``ctf``). ``n_components_`` says how many were
        kept.
    output_size : int, optional
        Zoom square images out to ``output_size x output_size`` pixels first (see
        :func:`downsample`); None keeps the size. Only for square images. The search on the
        copy is then ``(H / output_size)^2`` times cheaper, and a shift range of ``t`` pixels
        is ``t output_size / H`` pixels there: below one pixel, the search needs no grid of
        shifts (the refinement finds them), which is what makes it fast on shifted images.
    image_shape : tuple, optional
        ``(H, W)`` or ``(C, H, W)`` of flat input rows (None: square single-channel images).

    Attributes
    ----------
    mean_ : ndarray of shape (n_features_out,)
        The group-averaged mean image (of the down-sampled images).
    components_ : ndarray of shape (n_components_, n_features_out)
        Orthonormal principal directions, largest variance first.
    explained_variance_ : ndarray of shape (n_components_,)
    n_components_ : int
    image_shape_ : tuple
        ``(C, H, W)`` of the input images.
    image_shape_out_ : tuple
        ``(C, h, w)`` of the transformed images.
    scale_ : float
        Input pixels per output pixel (``H / h``): a shift found on the transformed images is
        ``scale_`` times as long on the input.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names seen in ``fit``; set only when ``X`` has column names that are all
        strings (a data frame).

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.denoise import DihedralPCA
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(50, 16, 16)).astype(np.float32)
    >>> pca = DihedralPCA(n_components=8, output_size=8).fit(X)
    >>> pca.transform(X).shape, pca.image_shape_out_, pca.scale_
    ((50, 64), (1, 8, 8), 2.0)
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "output_size": [Interval(Integral, 1, None, closed="left"), None],
        "image_shape": ["array-like", None],
    }

    def __init__(self, n_components=40, *, output_size=None, image_shape=None):
        self.n_components = n_components
        self.output_size = output_size
        self.image_shape = image_shape

    def _images(self, X, reset):
        """``(dtype, rows)``: the validated input's dtype and its (down-sampled) images as flat
        rows of a tensor."""
        X2 = self._validate(X, reset)
        c, h, w = self.image_shape_
        Xt = to_tensor(X2).reshape(-1, c, h, w)
        if self.output_size is not None:
            if h != w:
                raise ValueError(f"output_size: down-sampling needs square images, got "
                                 f"{h} x {w} (image_shape_={self.image_shape_})")
            if self.output_size > h:
                raise ValueError(f"output_size: expected at most the image size {h}, got "
                                 f"{self.output_size}")
            Xt = downsample(Xt, int(self.output_size))
        return X2.dtype, Xt.reshape(Xt.shape[0], -1)

    def fit(self, X, y=None):
        """Fit the group-averaged mean and principal directions.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)
        y : Ignored

        Returns
        -------
        self : object
        """
        self._validate_params()
        dtype, Z = self._images(X, reset=True)
        n, f = Z.shape
        if f > MAX_FEATURES:
            raise ValueError(
                f"output_size: {f} values per image would need a {f} x {f} covariance "
                f"({8 * f * f / 1e9:.1f} GB); set output_size so that at most {MAX_FEATURES} "
                "remain")
        c, h, w = self.image_shape_
        if self.output_size is not None:
            h = w = int(self.output_size)
        shape = (c, h, w)
        Z = Z.to(torch.float64)
        mean = _mean_average(Z.mean(0).numpy(), shape)
        Zc = Z - torch.from_numpy(mean)
        # the covariance of all the images' quarter turns and mirrors around the averaged
        # mean is the group average of the images' second moment around it (P_g mean = mean),
        # without making the copies
        C = (Zc.T @ Zc).numpy() / max(n, 1)
        C = _group_average(C, shape)
        if self.n_components == "auto":
            if f > MAX_AUTO_FEATURES:
                raise ValueError(
                    f"n_components: 'auto' needs the full spectrum of a {f} x {f} covariance; "
                    f"set output_size so that at most {MAX_AUTO_FEATURES} values per image "
                    "remain, or give a number")
            vals, vecs = scipy.linalg.eigh(C)
            vals, vecs = vals[::-1], vecs[:, ::-1]
            r, top = max(1, _hard_threshold_rank(vals, n)), f
        else:
            r = min(int(self.n_components), f)
            top = min(r + 1, f)
            vals, vecs = scipy.linalg.eigh(C, subset_by_index=[f - top, f - 1])
            vals, vecs = vals[::-1], vecs[:, ::-1]
        # keep a degenerate pair whole: the projection then still commutes with the group
        if r < top and vals[r] >= vals[r - 1] - 1e-6 * max(abs(vals[0]), 1e-300):
            r += 1
        self.mean_ = mean.astype(dtype)
        self.components_ = np.ascontiguousarray(vecs[:, :r].T).astype(dtype)
        self.explained_variance_ = np.clip(vals[:r], 0.0, None)
        self.n_components_ = r
        self.image_shape_out_ = shape
        self.scale_ = float(self.image_shape_[1]) / float(h)
        return self

    def transform(self, X):
        """The denoised (and down-sampled) images, flattened.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)

        Returns
        -------
        Z : ndarray of shape (n_samples, C * h * w)
            ``mean_ + P (x - mean_)`` with ``P`` the projection onto ``components_``; fold
            with ``image_shape_out_``.
        """
        check_is_fitted(self)
        dtype, Z = self._images(X, reset=False)
        V = torch.from_numpy(self.components_).to(Z.dtype)
        mu = torch.from_numpy(self.mean_).to(Z.dtype)
        out = ((Z - mu) @ V.T) @ V + mu
        return out.numpy().astype(dtype, copy=False)

    def get_feature_names_out(self, input_features=None):
        """``dihedralpca0``, ... one name per output pixel."""
        check_is_fitted(self)
        return np.asarray([f"dihedralpca{i}" for i in range(math.prod(self.image_shape_out_))],
                          dtype=object)


# ---------------------------------------------------------------------------------------------
# The radial Wiener filter: white noise measured on the images, then damped frequency by frequency

# Donoho and Johnstone's (1994) factor: the median of |N(0, s^2)| is 0.6745 s
_MAD_FACTOR = 0.6744897501960817
# the noise and the power spectrum are measured on at most this many images (evenly spaced):
# both are averages, and 10,000 images pin them to a fraction of a percent
NOISE_SUBSET = 10_000
# images filtered per block (their spectra are complex: 2 x the images' bytes)
_FILTER_BLOCK = 4096

# Why a filter before the search, why the square root of Wiener's gain, and how the noise is
# measured, with the measurements: docs/user_guide/convergence.rst ("Noise: the filter before
# the search"), benchmarks/bench_noise.py and benchmarks/results/noise.json (runs filter_*).



def _check_image_tensor(Xt, name: str) -> None:
    """Refuses anything but a floating-point tensor of images ``(n, C, H, W)``."""
    if not isinstance(Xt, torch.Tensor) or Xt.ndim != 4 or not Xt.is_floating_point():
        got = (f"a {Xt.ndim}-D {Xt.dtype} tensor" if isinstance(Xt, torch.Tensor)
               else type(Xt).__name__)
        raise TypeError(f"{name}: expected a float torch.Tensor of shape (n, C, H, W), "
                        f"got {got}")


def _image_tensor(X) -> torch.Tensor:
    X = torch.as_tensor(X)
    if X.ndim != 4:
        raise ValueError(f"X: expected images of shape (n, C, H, W), got shape {tuple(X.shape)}")
    return X


def _subset_rows(n: int, device) -> torch.Tensor:
    """At most :data:`NOISE_SUBSET` evenly spaced rows (no random state: the same rows every
    time)."""
    if n <= NOISE_SUBSET:
        return torch.arange(n, device=device)
    return evenly_spaced_indices(n, NOISE_SUBSET, device)


def _haar_noise_std(X: torch.Tensor) -> float:
    """``median |HH| / 0.6745`` over the diagonal Haar details of every 2 x 2 block of ``X``
    ``(n, C, H, W)``, ``H, W >= 2`` (Donoho and Johnstone, 1994).

    An odd side is tiled from both ends (offsets 0 and 1), so that a quarter turn or a mirror of
    the images, which maps one tiling onto the other, measures the same."""
    n, _, h, w = X.shape
    Z = X[_subset_rows(n, X.device)].to(torch.float64)
    details = []
    for dy in range(1 + h % 2):
        for dx in range(1 + w % 2):
            T = Z[..., dy:dy + h // 2 * 2, dx:dx + w // 2 * 2]
            details.append(((T[..., 0::2, 0::2] - T[..., 0::2, 1::2] - T[..., 1::2, 0::2]
                             + T[..., 1::2, 1::2]) / 2).abs().flatten())
    return float(torch.cat(details).median()) / _MAD_FACTOR


# the fewest values (images x channels x cells of the full plane) of a band of frequencies the
# noise floor is read from: white noise's mean power over that many is within sqrt(2 / 200),
# 10%, of its own, and fewer values of the half the band is measured on are no measure
_MIN_BAND_VALUES = 200


def _band_means(P: torch.Tensor, ring: torch.Tensor, weight: torch.Tensor) -> np.ndarray:
    """Mean power per cell of the full plane of each band ``r = 1 ... R`` (the rings of
    radius ``r`` and beyond) of the spectrum ``P`` ``(H, W // 2 + 1)``."""
    power = torch.bincount(ring, P.flatten() * weight)[1:].cpu().numpy()
    cells = torch.bincount(ring, weight)[1:].cpu().numpy()
    return np.cumsum(power[::-1])[::-1] / np.cumsum(cells[::-1])[::-1]


def _quiet_band(means: np.ndarray, values: np.ndarray) -> int:
    """The widest band (the lowest ``r``) whose mean power is within one standard error of
    the quietest band's, among the bands of at least :data:`_MIN_BAND_VALUES` values (or the
    widest alone): white noise's mean over ``v`` values has a relative standard error of
    ``sqrt(2 / v)``, so a wider band at the same floor is not set aside for a narrower band's
    lucky draw."""
    ok = np.flatnonzero(values >= min(_MIN_BAND_VALUES, values[0]))
    q = ok[np.argmin(means[ok])]
    level = means[q] * (1.0 + math.sqrt(2.0 / values[q]))
    return int(ok[np.argmax(means[ok] <= level)])


def _halves(X: torch.Tensor, rows: torch.Tensor):
    """``rows`` of ``X`` ``(n, C, H, W)`` dealt alternately into two halves in the content's
    canonical order (``_duplicates.canonical_order``): set by the images, not by the order of
    the samples, where copies are stored, or a quarter turn of them all."""
    order = canonical_order(X, rows)
    order = rows[torch.as_tensor(order, device=rows.device)]
    return order[0::2], order[1::2]


def _spectral_noise_std(X: torch.Tensor) -> float:
    """The square root of the mean power per pixel of the quietest band of the highest
    frequencies of ``X`` ``(n, C, H, W)``, ``H W >= 2``: the band is chosen on half of the
    images and measured on the other half (both ways, averaged), so that the choice does not
    pick the noise's own low draws."""
    n, c, h, w = X.shape
    rows = _subset_rows(n, X.device)
    halves = _halves(X, rows) if len(rows) > 1 else (rows, rows)
    ring = _radius(h, w, X.device).flatten()
    # a cell of rfft2's half plane stands for itself and its mirror, except in the columns
    # that are their own mirror (the first, and the last of an even width)
    weight = torch.full((h, w // 2 + 1), 2.0, dtype=torch.float64, device=X.device)
    weight[:, 0] = 1.0
    if w % 2 == 0:
        weight[:, -1] = 1.0
    weight = weight.flatten()
    # |DFT|^2 of white noise of variance s^2 is s^2 H W in every cell
    means = [_band_means(_mean_power(X, half).sum(0) / (c * h * w), ring, weight)
             for half in halves]
    cells = np.cumsum(torch.bincount(ring, weight)[1:].cpu().numpy()[::-1])[::-1]
    values = cells * c * len(halves[1])
    chosen = [_quiet_band(m, values) for m in means]
    return math.sqrt(max(0.5 * float(means[1][chosen[0]] + means[0][chosen[1]]), 0.0))


NOISE_METHODS = ("auto", "haar", "spectrum")


def estimate_noise_std(X, *, method="auto") -> float:
    """Standard deviation of white noise in images, read where the images have least power.

    Each estimate measures the noise plus a share of the images' own detail, which only adds,
    so ``"auto"``, the default, takes the smaller:

    - ``"haar"``: ``median |HH| / 0.6745``, ``HH = (a - b - c + d) / 2`` the diagonal Haar
      detail of each 2 x 2 block of pixels ``[[a, b], [c, d]]`` (Donoho and Johnstone, 1994):
      white noise of standard deviation ``s`` gives ``HH`` the same deviation and a flat
      background gives 0, so it reads the noise where most blocks are background (exactly 0
      on clean images with a flat background), and the edges where few are (small images).
    - ``"spectrum"``: the square root of the mean power per pixel of the quietest band of the
      highest spatial frequencies (the rings of the power spectrum, averaged over the images,
      from radius ``r`` out to the corners): white noise puts ``s^2`` into every frequency
      and the images' power falls with the frequency, so the quietest band is the noise floor
      (plus the images' own power there), with as few rings as small images have.

    Pooled over all channels and at most :data:`NOISE_SUBSET` images. The measured numbers
    are in the user guide (``benchmarks/results/noise.json`` run ``estimate``).

    Parameters
    ----------
    X : tensor or ndarray of shape (n, C, H, W)
    method : {"auto", "haar", "spectrum"}, default="auto"

    Returns
    -------
    sigma : float
        0 for no images, and for images under 2 pixels on a side (the Haar detail needs 2 x
        2 pixels, and a line of pixels is no image to tell noise from).
    """
    if not isinstance(method, str) or method not in NOISE_METHODS:
        raise ValueError(f"method: expected one of {NOISE_METHODS}, got {method!r}")
    X = _image_tensor(X)
    n, _, h, w = X.shape
    if n == 0 or h < 2 or w < 2:
        return 0.0
    if method == "haar":
        return _haar_noise_std(X)
    if method == "spectrum":
        return _spectral_noise_std(X)
    return min(_haar_noise_std(X), _spectral_noise_std(X))


def _radius(h: int, w: int, device) -> torch.Tensor:
    """Integer radius (in units of the larger side's frequency step) of every cell of
    ``rfft2``'s ``(h, w // 2 + 1)`` grid, rounded half up: a non-square grid has cells
    exactly half-way (10 x 15 pixels: frequencies (1/10, 2/15) are 2.5 steps out), which
    round-off would otherwise send either way."""
    fy = torch.fft.fftfreq(h, device=device, dtype=torch.float64)[:, None]
    fx = torch.fft.rfftfreq(w, device=device, dtype=torch.float64)[None, :]
    return torch.floor(torch.sqrt(fy * fy + fx * fx) * max(h, w) + (0.5 + 1e-9)).long()


def _mean_power(X: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``|rfft2|^2`` of the images ``X[rows]`` (``X``: ``(n, C, H, W)``) averaged over them:
    ``(C, H, W // 2 + 1)``, float64."""
    _, c, h, w = X.shape
    P = torch.zeros(c, h, w // 2 + 1, dtype=torch.float64, device=X.device)
    for start in range(0, len(rows), _FILTER_BLOCK):
        F_ = torch.fft.rfft2(X[rows[start:start + _FILTER_BLOCK]].to(torch.float64))
        P += (F_.real ** 2 + F_.imag ** 2).sum(0)
    return P / max(len(rows), 1)


def radial_power(X) -> np.ndarray:
    """The images' power spectrum ``|DFT|^2`` averaged over the images and over each circle of
    integer radius: ``(C, R)``, float64 (at most :data:`NOISE_SUBSET` images)."""
    X = _image_tensor(X)
    n, c, h, w = X.shape
    P = _mean_power(X, _subset_rows(n, X.device))
    r = _radius(h, w, X.device).flatten()
    R = int(r.max()) + 1
    # every cell of the half plane counts once (the other half mirrors it)
    count = torch.bincount(r, minlength=R).to(torch.float64)
    prof = torch.stack([torch.bincount(r, P[ch].flatten(), minlength=R) for ch in range(c)])
    return (prof / count.clamp(min=1)).cpu().numpy()


def wiener_gain(power_profile, noise_std, image_size, power=0.5) -> np.ndarray:
    """``(max(P - N, 0) / P) ** power`` per channel and radius, ``N = noise_std^2 H W``; 1
    where ``P`` is 0 (nothing to damp)."""
    P = np.asarray(power_profile, dtype=np.float64)
    h, w = image_size
    N = float(noise_std) ** 2 * h * w
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where(P > 0, np.clip(P - N, 0.0, None) / P, 1.0)
    return g ** float(power)


def apply_radial_gain(X, gain, out=None) -> torch.Tensor:
    """Images ``X`` ``(n, C, H, W)`` filtered by a radial gain ``(C, R)`` (circular convolution:
    exactly equivariant to integer shifts and quarter turns of square images), in blocks;
    ``out`` may be ``X`` itself (filtered in place)."""
    X = _image_tensor(X)
    n, c, h, w = X.shape
    g = torch.as_tensor(np.asarray(gain, dtype=np.float64), device=X.device)
    G = g[:, _radius(h, w, X.device)]                       # (C, h, w // 2 + 1)
    cdtype = torch.float64 if X.dtype == torch.float64 else torch.float32
    G = G.to(cdtype)
    if out is None:
        out = torch.empty_like(X)
    for start in range(0, n, _FILTER_BLOCK):
        block = X[start:start + _FILTER_BLOCK].to(cdtype)
        F_ = torch.fft.rfft2(block) * G
        out[start:start + _FILTER_BLOCK] = torch.fft.irfft2(F_, s=(h, w)).to(out.dtype)
    return out


class RadialWiener(ImageInputMixin, OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Damp white noise in images, frequency by frequency, by the share of each frequency's
    power that is signal.

    The noise is measured on the images themselves (:func:`estimate_noise_std`), and the gain
    ``(max(P(f) - N, 0) / P(f)) ** power`` (``P``: the images' power spectrum averaged over
    each circle ``|f| = r``; ``N``: the noise's) is isotropic, so the filter commutes with
    rotations and shifts: alignments found on the filtered images are alignments of the
    originals. :class:`~invariant_cluster.InvariantAttentionClusterer` runs it first
    (``noise_std="auto"``); put it before
    :class:`~invariant_cluster.InvariantKNeighborsTransformer` in a pipeline to search noisy
    images the same way. With no noise measured it is the identity.

    Parameters
    ----------
    noise_std : "auto" or float, default="auto"
        "auto": measured where the images have least power (:func:`estimate_noise_std`): 0 on
        clean images with a flat background (no filter), and the level of their own detail on
        images with detail up to the highest frequencies (small images), which the filter
        then damps little; a float: the known standard deviation of the noise (0: no
        filter).
    power : float, default=0.5
        1 is Wiener's filter (the least squared error of each image); 0.5, the default, weighs
        each frequency's part of a squared distance between two images by its signal's share
        (the user guide's convergence page gives the measurements).
    image_shape : tuple, optional
        ``(H, W)`` or ``(C, H, W)`` of flat input rows (None: square single-channel images).

    Attributes
    ----------
    noise_std_ : float
    gain_ : ndarray of shape (C, R)
        The gain per channel and integer radius (in steps of ``1 / max(H, W)`` cycles per
        pixel); all ones when ``noise_std_`` is 0.
    power_spectrum_ : ndarray of shape (C, R)
        The images' radially averaged power spectrum (noise included).
    image_shape_ : tuple
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names seen in ``fit``; set only when ``X`` has column names that are all
        strings (a data frame).

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.denoise import RadialWiener
    >>> rng = np.random.default_rng(0)
    >>> clean = np.zeros((200, 16, 16), np.float32); clean[:, 4:12, 6:10] = 1
    >>> noisy = clean + 0.5 * rng.standard_normal(clean.shape).astype(np.float32)
    >>> f = RadialWiener().fit(noisy)
    >>> round(f.noise_std_, 1)
    0.5
    >>> err = lambda Z: float(np.linalg.norm(Z.reshape(200, -1) - clean.reshape(200, -1)))
    >>> err(f.transform(noisy)) < 0.5 * err(noisy)
    True
    """

    _parameter_constraints: dict = {
        "noise_std": [StrOptions({"auto"}), Interval(Real, 0, None, closed="left")],
        "power": [Interval(Real, 0, None, closed="neither")],
        "image_shape": ["array-like", None],
    }

    def __init__(self, noise_std="auto", *, power=0.5, image_shape=None):
        self.noise_std = noise_std
        self.power = power
        self.image_shape = image_shape

    def _images(self, X, reset):
        X2 = self._validate(X, reset)
        return X2, to_tensor(X2).reshape(-1, *self.image_shape_)

    def fit(self, X, y=None):
        """Measure the noise and the images' power spectrum.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)
        y : Ignored

        Returns
        -------
        self : object
        """
        self._validate_params()
        _, Xt = self._images(X, reset=True)
        return self.fit_tensor(Xt)

    def fit_tensor(self, Xt, feature_names_in=None):
        """``fit`` on images that are a tensor already, on any device: the path of an
        estimator that runs the filter on its own validated copy of the input.

        Parameters
        ----------
        Xt : torch.Tensor of shape (n, C, H, W)
            Float images.
        feature_names_in : array-like of str, optional
            The column names of the flat rows the images came from (None: none).

        Returns
        -------
        self : object
        """
        self._validate_params()
        _check_image_tensor(Xt, "Xt")
        self.image_shape_ = tuple(int(v) for v in Xt.shape[1:])
        self.n_features_in_ = math.prod(self.image_shape_)
        if feature_names_in is not None:
            self.feature_names_in_ = np.asarray(feature_names_in, dtype=object)
        self.power_spectrum_ = radial_power(Xt)
        if self.noise_std == "auto":
            self.noise_std_ = estimate_noise_std(Xt)
        else:
            self.noise_std_ = float(self.noise_std)
        if self.noise_std_ > 0:
            self.gain_ = wiener_gain(self.power_spectrum_, self.noise_std_, Xt.shape[2:],
                                     self.power)
        else:
            self.gain_ = np.ones_like(self.power_spectrum_)
        return self

    @property
    def is_identity(self) -> bool:
        """True when the fitted gain is 1 everywhere (no noise measured or given)."""
        check_is_fitted(self)
        return bool(np.all(self.gain_ == 1.0))

    def filter_tensor(self, Xt, in_place=False):
        """``transform`` on images that are a tensor already, on any device.

        Parameters
        ----------
        Xt : torch.Tensor of shape (n, C, H, W)
            Float images of the fitted ``image_shape_``.
        in_place : bool, default=False
            Filter ``Xt`` itself (for a caller's own copy; nothing to do when the gain is 1)
            instead of returning a new tensor.

        Returns
        -------
        Zt : torch.Tensor of shape (n, C, H, W)
        """
        check_is_fitted(self)
        _check_image_tensor(Xt, "Xt")
        if tuple(Xt.shape[1:]) != tuple(self.image_shape_):
            raise ValueError(f"Xt: expected images of shape {tuple(self.image_shape_)} as in "
                             f"fit, got {tuple(Xt.shape[1:])}")
        if self.is_identity:
            return Xt if in_place else Xt.clone()
        return apply_radial_gain(Xt, self.gain_, out=Xt if in_place else None)

    def transform(self, X):
        """The filtered images, flattened.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)

        Returns
        -------
        Z : ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self)
        X2, Xt = self._images(X, reset=False)
        return self.filter_tensor(Xt).reshape(len(X2), -1).numpy().astype(X2.dtype,
                                                                            copy=False)
