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
from numbers import Integral

import numpy as np
import scipy.linalg
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from ._estimator import ImageInputMixin
from ._utils import to_tensor

__all__ = ["DihedralPCA", "downsample"]

# the covariance is F x F float64: beyond this many values per (down-sampled) image, ask for
# output_size instead of allocating gigabytes
MAX_FEATURES = 8192


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


class DihedralPCA(ImageInputMixin, TransformerMixin, BaseEstimator):
    """Denoise images by a PCA whose covariance is averaged over quarter turns and mirrors.

    The search for neighbours in noisy images (cryo-EM particles, noisy digits) is more reliable
    on a denoised copy: put this transformer before
    :class:`~invariant_cluster.InvariantKNeighborsTransformer` in a pipeline, or pass it as
    ``denoise`` to :func:`~invariant_cluster.class_averages` (which searches on the copy and
    averages the original images).

    Parameters
    ----------
    n_components : int, default=40
        Principal directions kept. One more is kept where the next eigenvalue equals the last
        one (a degenerate pair of the group: cutting it would break the symmetry); at most the
        number of values per output image. ``n_components_`` says how many were kept.
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
        "n_components": [Interval(Integral, 1, None, closed="left")],
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
