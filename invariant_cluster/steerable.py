"""A covariance Wiener filter in a steerable (Fourier-Bessel) basis.

A set of particle images seen in every in-plane rotation has a covariance that commutes with the
rotations. In the Fourier-Bessel basis ``J_k(z_kq r / R) e^{i k theta}`` of the disk of radius
``R`` that covariance is block-diagonal, one small ``q x q`` block per angular frequency ``k``,
shared by the cosine and the sine parts. Each block is estimated from far fewer numbers than the
full pixel covariance, which is why the field's standard single-image denoiser (ASPIRE's
``RotCov2D`` / ``DenoiserCov2D``, Zhao, Shkolnisky and Singer 2013; Bhamre, Zhang and Singer
2016) works in this basis. :class:`SteerableWiener` is that filter without a CTF:

1. each image's disk is expanded in the basis (band limit ``z_kq <= pi R``, the pixel Nyquist
   frequency);
2. per angular frequency, the coefficients' covariance is whitened by the noise's
   (``noise_std ** 2`` times the basis' Gram block, exact for white pixel noise), and its
   eigenvalues are shrunk by the spiked-covariance rule (Marchenko-Pastur edge
   ``(1 + sqrt(gamma)) ** 2``, signal eigenvalue ``ell`` from the sample one, weighted by the
   squared cosine ``c ** 2`` between sample and true eigenvectors; Donoho, Gavish and Johnstone
   2018);
3. each image's coefficients get the Wiener gain ``ell c^2 / (ell c^2 + 1)`` along each
   eigenvector, around the mean (angular frequency 0 only), and go back to pixels.

The filter commutes with the rotations of the basis (quarter turns and mirrors of the pixel
grid exactly), so alignments and class averages computed after it are those of the originals.
Pixels outside the disk carry no signal in this model: the filter sets them to 0, as ASPIRE's
expansion does (centre the particles and choose ``radius`` so that the disk holds them).

Class averages of ``k + 1`` aligned images (:func:`~invariant_cluster.class_averages`) are
images with noise of standard deviation ``noise_std / sqrt(k + 1)``; filtering them with that
noise level is the user guide's cryo-EM recipe (``benchmarks/bench_cryoem.py`` measures it).
"""

from __future__ import annotations

import functools
import math
from numbers import Real

import numpy as np
import torch
from scipy.special import jn_zeros, jv
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ._estimator import ImageInputMixin
from ._utils import check_images, to_tensor
from .denoise import estimate_noise_std
from .transforms import ROTATION_CENTERS, rotation_centre

__all__ = ["SteerableWiener", "fourier_bessel_basis", "steerable_class_averages"]

# rows of images per matrix product (bounds the coefficient buffer: rows x basis size)
_CHUNK = 4096
# the largest dense basis built (a 128 x 128 box's disk: about 1 GiB)
MAX_BASIS_BYTES = 4 * 2 ** 30
# the grid step of the Bessel table (linear interpolation: error below 1e-5 of the peak)
_BESSEL_STEP = 0.005


def _bessel_table(k_max, x_max, step):
    """``J_k(j * step)`` for ``k <= k_max`` and ``j * step <= x_max + step``: all orders at once
    as the Fourier coefficients of ``exp(i x sin t) = sum_k J_k(x) exp(i k t)`` (exact to
    round-off once the FFT's length exceeds ``k_max + x_max`` by a margin), where SciPy's
    ``jv`` costs microseconds per value at high order."""
    x = np.arange(int(math.ceil(x_max / step)) + 2) * step
    m = 1 << int(math.ceil(math.log2(k_max + x_max + 64)))
    t = 2 * math.pi * np.arange(m) / m
    table = np.empty((k_max + 1, len(x)))
    for s in range(0, len(x), 2048):
        e = np.exp(1j * x[s:s + 2048, None] * np.sin(t)[None, :])
        table[:, s:s + 2048] = (np.fft.fft(e, axis=1)[:, :k_max + 1].real / m).T
    return table


def _interpolated(table_k, x, step):
    """``table_k`` (values on the grid ``j * step``) linearly interpolated at ``x >= 0``."""
    u = x / step
    j = np.minimum(u.astype(np.int64), table_k.shape[0] - 2)
    w = u - j
    return table_k[j] * (1 - w) + table_k[j + 1] * w


@functools.lru_cache(maxsize=2)  # a 128 x 128 box's basis is about 1 GiB
def _basis_cached(height, width, radius, rotation_center):
    cx, cy = rotation_centre(height, width, rotation_center)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    x, y = xx - cx, yy - cy
    r = np.hypot(x, y)
    inside = (r < radius).ravel().copy()
    # the radial functions are evaluated once per distinct radius (the pixel grid's symmetries
    # repeat each about eight times), then gathered
    r2 = (x * x + y * y).ravel()[inside]
    r2_unique, back = np.unique(np.round(r2, 9), return_inverse=True)
    rr = np.sqrt(r2_unique) / radius
    th = np.arctan2(y, x).ravel()[inside]
    z_max = math.pi * radius
    zeros = []
    while True:  # the zeros z_kq <= z_max of each order k, until an order has none
        z = jn_zeros(len(zeros), int(z_max / math.pi) + 2)
        z = z[z <= z_max]
        if len(z) == 0:
            break
        zeros.append(z)
    table = _bessel_table(len(zeros) - 1, z_max, _BESSEL_STEP) if zeros else None
    columns, freq, part = [], [], []
    for k, z in enumerate(zeros):
        radial = (_interpolated(table[k], rr[:, None] * z[None, :], _BESSEL_STEP)
                  / (math.sqrt(math.pi) * radius * np.abs(jv(k + 1, z))))[back]
        if k == 0:
            columns.append(radial)
            part += [0] * len(z)
        else:
            columns += [radial * (math.sqrt(2) * np.cos(k * th))[:, None],
                        radial * (math.sqrt(2) * np.sin(k * th))[:, None]]
            part += [0] * len(z) + [1] * len(z)
        freq += [k] * (len(z) if k == 0 else 2 * len(z))
    if not columns:
        basis = np.zeros((int(inside.sum()), 0))
    else:
        basis = np.concatenate(columns, axis=1)
    freq, part = np.asarray(freq, dtype=np.int64), np.asarray(part, dtype=np.int64)
    for a in (inside, basis, freq, part):  # shared by the cache: read-only
        a.setflags(write=False)
    return inside, basis, freq, part


def fourier_bessel_basis(height, width, *, radius=None, rotation_center="fourier"):
    """The real Fourier-Bessel basis of the disk, sampled on the pixels.

    Parameters
    ----------
    height, width : int
    radius : float, optional
        The disk's radius in pixels (None: half the smaller side).
    rotation_center : {"fourier", "geometric"}, default="fourier"
        The disk's centre (see :mod:`invariant_cluster.transforms`).

    Returns
    -------
    inside : ndarray of bool, shape (height * width,)
        The pixels (row-major) strictly inside the disk.
    basis : ndarray of shape (inside.sum(), n_basis)
        ``J_k(z_kq r / R) cos(k theta)`` and ``sin(k theta)`` (``z_kq <= pi R``, the ``q``-th
        zero of ``J_k``), normalised to unit norm over the continuous disk, so that the
        columns are nearly orthonormal over the pixels.
    angular_frequency : ndarray of int, shape (n_basis,)
    sine : ndarray of int, shape (n_basis,)
        1 for the sine parts, 0 for the cosine parts (and ``k = 0``).
    """
    height, width = int(height), int(width)
    if height < 1 or width < 1:
        raise ValueError(f"height, width: expected positive sizes, got {height} x {width}")
    if radius is None:
        radius = min(height, width) / 2
    radius = float(radius)
    if not radius > 0:
        raise ValueError(f"radius: expected a positive number, got {radius!r}")
    # the basis is dense, float64: about 0.8 functions per pixel of the disk
    pixels = math.pi * min(radius, max(height, width)) ** 2
    if 0.8 * pixels * pixels * 8 > MAX_BASIS_BYTES:
        raise ValueError(
            f"radius: a disk of radius {radius:g} px needs a dense basis of about "
            f"{0.8 * pixels * pixels * 8 / 2 ** 30:.0f} GiB (the limit is "
            f"{MAX_BASIS_BYTES / 2 ** 30:.0f} GiB): zoom the images out first "
            f"(invariant_cluster.denoise.downsample) or give a smaller radius")
    return _basis_cached(height, width, radius, rotation_center)


def _shrunk_gain(lam, gamma):
    """Wiener gains of whitened sample eigenvalues ``lam`` (noise 1) under the spiked model:
    0 below the Marchenko-Pastur edge, else ``ell c^2 / (ell c^2 + 1)``."""
    gain = np.zeros_like(lam)
    above = lam > (1 + math.sqrt(gamma)) ** 2
    b = lam[above] + 1 - gamma
    ell = (b + np.sqrt(np.maximum(b * b - 4 * lam[above], 0))) / 2 - 1
    c2 = np.clip((1 - gamma / ell ** 2) / (1 + gamma / ell), 0, 1)
    gain[above] = ell * c2 / (ell * c2 + 1)
    return gain


class SteerableWiener(ImageInputMixin, OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Denoise images with their rotation-invariant covariance, estimated in a steerable basis.

    The single-image covariance Wiener filter of cryo-EM (ASPIRE's ``DenoiserCov2D`` without a
    CTF): the images' covariance is averaged over all in-plane rotations by working in the
    Fourier-Bessel basis, where it is block-diagonal per angular frequency; each block's
    eigenvalues are shrunk above the noise's Marchenko-Pastur edge and each image gets the
    Wiener estimate. See the module's description for the steps.

    Parameters
    ----------
    noise_std : "auto" or float, default="auto"
        The standard deviation of the white noise: "auto" measures it
        (:func:`~invariant_cluster.denoise.estimate_noise_std`); 0 makes the filter the identity.
        For class averages of ``k + 1`` images, pass the single images' value divided by
        ``sqrt(k + 1)``. A value below the true one is costly: the many directions of pure
        noise then stand above the threshold and pass, while a value a little above it only
        shrinks a little more; when in doubt, err high.
    rotation_center : {"fourier", "geometric"}, default="fourier"
        The disk's centre: pixel ``(W // 2, H // 2)``, the field's convention for particle
        images, or the geometric centre ``((W - 1) / 2, (H - 1) / 2)``.
    radius : float, optional
        The disk's radius in pixels (None: half the smaller side).
    image_shape : tuple, optional
        ``(H, W)`` or ``(1, H, W)`` of flat input rows (None: square images).

    Attributes
    ----------
    noise_std_ : float
    n_basis_ : int
        The number of basis functions (the dimension the images are filtered in).
    n_components_ : int
        The number of directions kept above the noise (a cosine and a sine direction count
        twice).
    mean_ : ndarray of shape (n_features_in_,)
        The images' mean as the filter sees it: rotation-averaged in the disk, 0 outside.
    image_shape_ : tuple
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names seen in ``fit``; set only when ``X`` has column names that are all
        strings.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.ndimage import rotate
    >>> from invariant_cluster import SteerableWiener
    >>> rng = np.random.default_rng(0)
    >>> bar = np.zeros((24, 24)); bar[9:15, 4:20] = 1
    >>> clean = np.stack([rotate(bar, a, reshape=False, order=1)
    ...                   for a in rng.uniform(0, 360, 300)])
    >>> noisy = clean + rng.standard_normal(clean.shape)
    >>> f = SteerableWiener().fit(noisy)
    >>> err = lambda Z: float(np.linalg.norm(Z.reshape(300, -1) - clean.reshape(300, -1)))
    >>> err(f.transform(noisy)) < 0.35 * err(noisy)
    True
    """

    _parameter_constraints: dict = {
        "noise_std": [StrOptions({"auto"}), Interval(Real, 0, None, closed="left")],
        "rotation_center": [StrOptions(set(ROTATION_CENTERS))],
        "radius": [Interval(Real, 0, None, closed="neither"), None],
        "image_shape": ["array-like", None],
    }

    def __init__(self, noise_std="auto", *, rotation_center="fourier", radius=None,
                 image_shape=None):
        self.noise_std = noise_std
        self.rotation_center = rotation_center
        self.radius = radius
        self.image_shape = image_shape

    def _images(self, X, reset):
        X2 = self._validate(X, reset)
        if self.image_shape_[0] != 1:
            raise ValueError(f"image_shape: SteerableWiener filters single-channel images, got "
                             f"{self.image_shape_[0]} channels")
        return X2

    def _radius(self):
        return min(self.image_shape_[1:]) / 2 if self.radius is None else float(self.radius)

    def _basis(self):
        _, h, w = self.image_shape_
        return fourier_bessel_basis(h, w, radius=self._radius(),
                                    rotation_center=self.rotation_center)

    def fit(self, X, y=None):
        """Measure the noise and estimate the covariance's blocks.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, 1, H, W)
        y : Ignored

        Returns
        -------
        self : object
        """
        self._validate_params()
        for name in ("noise_std", "radius"):  # (scikit-learn's intervals take True as 1)
            if isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name}: expected a number, got {getattr(self, name)!r} "
                                f"(a bool)")
        X2 = self._images(X, reset=True)
        n = len(X2)
        Xt = to_tensor(X2)
        if self.noise_std == "auto":
            self.noise_std_ = estimate_noise_std(Xt.reshape(n, *self.image_shape_))
        else:
            self.noise_std_ = float(self.noise_std)
        inside, basis, freq, sine = self._basis()
        self.n_basis_ = int(basis.shape[1])
        if self.n_basis_ == 0:
            raise ValueError(
                f"image_shape: images of {self.image_shape_[1]} x {self.image_shape_[2]} pixels "
                f"have no Fourier-Bessel function in a disk of radius {self._radius():g} "
                f"(the first zero of J_0 needs a radius of at least 0.77 pixel)")
        inside_t = torch.from_numpy(inside.copy())
        B = torch.tensor(basis, dtype=Xt.dtype)
        # coefficient sums and second moments per (angular frequency, part) block, float64
        blocks = [(k, np.flatnonzero((freq == k) & (sine == 0)),
                   np.flatnonzero((freq == k) & (sine == 1))) for k in np.unique(freq)]
        total = np.zeros(self.n_basis_)
        moments = [np.zeros((len(c), len(c))) for _, c, _ in blocks]
        for s in range(0, n, _CHUNK):
            chunk = Xt[s:s + _CHUNK]
            A = (chunk[:, inside_t] @ B).double().numpy()
            total += A.sum(0)
            for (_, c, si), M in zip(blocks, moments):
                M += A[:, c].T @ A[:, c]
                if len(si):
                    M += A[:, si].T @ A[:, si]
        # the filter per block, acting on coefficient rows: out = (a - mu) @ op + mu @ rec,
        # rec = G^-1 (coefficients back to the basis' least-squares expansion)
        self._blocks = []
        kept = 0
        for (k, c, si), M in zip(blocks, moments):
            parts = 1 if len(si) == 0 else 2
            count = n * parts
            Bc = basis[:, c]
            G = Bc.T @ Bc
            if len(si):
                G = (G + basis[:, si].T @ basis[:, si]) / 2
            mu = total[c] / n if k == 0 else np.zeros(len(c))
            C = M / count - np.outer(mu, mu)
            g, V = np.linalg.eigh(G)
            rec = (V / g) @ V.T
            if self.noise_std_ > 0:
                white = (V / np.sqrt(g)) @ V.T / self.noise_std_
                lam, U = np.linalg.eigh(white @ C @ white)
                gain = _shrunk_gain(lam, len(c) / count)
                colour = (V * np.sqrt(g)) @ V.T * self.noise_std_
                H = colour @ (U * gain) @ U.T @ white  # signal coefficients from coefficients
                kept += parts * int(np.count_nonzero(gain))
            else:
                H = np.eye(len(c))
            op = (rec @ H).T
            self._blocks.append((c, si, op, mu @ rec - mu @ op))
            if k == 0:  # the only block with a mean
                self.mean_ = np.zeros(self.n_features_in_)
                self.mean_[inside] = basis[:, c] @ (mu @ rec)
        self.n_components_ = kept
        return self

    @property
    def is_identity(self) -> bool:
        """True when the filter returns its input (no noise measured or given)."""
        check_is_fitted(self)
        return self.noise_std_ == 0

    def transform(self, X):
        """The filtered images, flattened.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, 1, H, W)

        Returns
        -------
        Z : ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self)
        X2 = self._images(X, reset=False)
        if self.is_identity:
            return np.array(X2, copy=True)
        inside, basis, _, _ = self._basis()
        Xt = to_tensor(X2)
        dt = Xt.dtype
        inside_t = torch.from_numpy(inside.copy())
        B = torch.tensor(basis, dtype=dt)
        blocks = [(torch.as_tensor(c), torch.as_tensor(si), torch.as_tensor(op, dtype=dt),
                   torch.as_tensor(shift, dtype=dt)) for c, si, op, shift in self._blocks]
        out = torch.zeros(len(Xt), self.n_features_in_, dtype=dt)
        for s in range(0, len(Xt), _CHUNK):
            A = Xt[s:s + _CHUNK][:, inside_t] @ B
            Z = torch.empty_like(A)
            for c, si, op, shift in blocks:
                Z[:, c] = A[:, c] @ op + shift
                if len(si):
                    Z[:, si] = A[:, si] @ op
            out[s:s + _CHUNK, inside_t] = Z @ B.T
        return out.numpy().astype(X2.dtype, copy=False)


# the recorrupted-to-recorrupted factor: the pipelines are scored at (1 + a^2) times the images'
# noise variance, against a target of (1 + 1 / a^2) times it
_RECORRUPTION = 0.5


def steerable_class_averages(X, n_neighbors=10, *, noise_std="auto", rotation_center="fourier",
                             random_state=0, return_choice=False, **search):
    """Each image denoised with its aligned neighbours, alone, or by a blend of the two.

    Two estimates of each image, both filtered by :class:`SteerableWiener`: the plain mean of
    the image and its ``n_neighbors`` aligned invariant neighbours
    (:func:`~invariant_cluster.class_averages`, ``snr=None``) at the noise of a mean of
    ``n_neighbors + 1`` images, and the image alone. Averages win when the neighbours are
    views of the same projection, and lose when the noise hides them: then the search picks
    the images whose noise matches, and their mean adds noise rather than signal. The result
    is ``w single + (1 - w) averages``, the weight ``w`` in [0, 1] chosen on the data by the
    recorrupted-to-recorrupted risk estimate (Pang et al. 2021): with ``z`` white noise of the
    images' level, both pipelines run on ``X + z / 2`` and are scored against ``X - 2 z``,
    whose noise is independent of ``X + z / 2``'s, so the mean squared difference estimates
    each blend's error (at 1.25 times the images' noise variance) up to a constant; the risk
    is quadratic in ``w``, and its minimiser is taken. A pipeline of weight 0 is not run on
    ``X``.

    Parameters
    ----------
    X : array-like of shape (n_samples, H, W), (n, 1, H, W) or (n, H * W) square images
    n_neighbors : int, default=10
    noise_std : "auto" or float, default="auto"
        The images' white noise ("auto": measured, :func:`~invariant_cluster.denoise.
        estimate_noise_std`).
    rotation_center : {"fourier", "geometric"}, default="fourier"
        The centre of the search's rotations and of the filter's disk.
    random_state : int, default=0
        Seed of the recorrupting noise ``z``.
    return_choice : bool, default=False
        Also return a dict: ``"weight_single"`` (``w``), ``"choice"`` ("averages" for
        ``w = 0``, "single" for ``w = 1``, else "blend"), ``"risk"`` (the risk estimates of
        "averages", "single" and "blend": mean squared difference per image) and
        ``"noise_std"``.
    **search
        Passed to :func:`~invariant_cluster.class_averages` (``n_rotations``, ``reflection``,
        ``denoise``, ``max_translation``, ``center``, ``device``, ...).

    Returns
    -------
    images : ndarray of shape (n_samples, H, W)
    choice : dict, only with ``return_choice``
    """
    from .barycenters import class_averages

    for bad in ("labels", "ctf", "snr", "return_alignments", "image_shape"):
        if bad in search:
            raise TypeError(f"{bad}: not a parameter of steerable_class_averages (the plain "
                            f"one-step means of single-channel images, without a CTF)")
    X2, shape = check_images(X)
    if shape[0] != 1:
        raise ValueError(f"X: expected single-channel images, got {shape[0]} channels")
    if np.ndim(X) == 2 and shape[1] != shape[2]:
        raise ValueError(f"X: flat rows must be square images, got {shape[2]} features")
    Xn = np.asarray(X2.cpu() if isinstance(X2, torch.Tensor) else X2).reshape(-1, *shape[1:])
    if noise_std == "auto":
        sigma = estimate_noise_std(torch.from_numpy(Xn)[:, None])
    elif isinstance(noise_std, Real) and not isinstance(noise_std, bool) and noise_std >= 0:
        sigma = float(noise_std)
    else:
        raise ValueError(f"noise_std: expected 'auto' or a number >= 0, got {noise_std!r}")

    def single(Y, s):
        f = SteerableWiener(noise_std=s, rotation_center=rotation_center)
        return f.fit_transform(Y).reshape(Y.shape)

    def averages(Y, s):  # class_averages checks n_neighbors and the search's parameters
        avg = np.asarray(class_averages(Y, n_neighbors=n_neighbors,
                                        rotation_center=rotation_center, **search))
        return single(avg.reshape(Y.shape), s / math.sqrt(n_neighbors + 1))

    # recorrupted pair: X + a z and X - z / a, independent noises; the pipelines see noise of
    # std sigma sqrt(1 + a^2)
    a = _RECORRUPTION
    z = (np.random.default_rng(random_state).standard_normal(Xn.shape) * sigma).astype(Xn.dtype)
    noisier = sigma * math.sqrt(1 + a * a)
    target = (Xn - z / a).reshape(len(Xn), -1).astype(np.float64)
    s_hat = single(Xn + a * z, noisier).reshape(len(Xn), -1).astype(np.float64)
    a_hat = averages(Xn + a * z, noisier).reshape(len(Xn), -1).astype(np.float64)
    # risk(w) = ||w (s - a) + (a - t)||^2 / n, minimised over w in [0, 1]
    d, e = s_hat - a_hat, a_hat - target
    dd = float((d * d).sum())
    w = float(np.clip(-(d * e).sum() / dd, 0.0, 1.0)) if dd > 0 else 1.0
    n = len(Xn)
    risk = {"averages": float((e * e).sum()) / n,
            "single": float(((d + e) ** 2).sum()) / n,
            "blend": float(((w * d + e) ** 2).sum()) / n}
    del s_hat, a_hat, target, d, e
    out = np.zeros_like(Xn)
    if w > 0:
        out += w * single(Xn, sigma)
    if w < 1:
        out += (1 - w) * averages(Xn, sigma)
    if return_choice:
        choice = "averages" if w == 0 else "single" if w == 1 else "blend"
        return out, {"choice": choice, "weight_single": w, "risk": risk, "noise_std": sigma}
    return out
