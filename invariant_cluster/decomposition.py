"""Self-attention as kernel PCA of the keys: :class:`KernelPCAAttention`.

Convention
----------
One head: keys ``k_j`` (``j = 1..N``), width ``D``, scale ``s``. Kernel ``k(x, y) = exp(s x.y)``
with feature map ``phi``; normalised feature map ``varphi(x) = phi(x) / g(x)`` with
``g(x) = sum_j k(x, k_j)`` (the softmax denominator). Normalised Gram
``K_phi[i, j] = k(k_i, k_j) / (g(k_i) g(k_j))``, centred ``Kc = (I - 1_N) K_phi (I - 1_N)``,
eigenproblem ``Kc a_d = N lambda_d a_d``. With the values ``V = G^-1 (I - 1_N) A``
(``G = diag(g(k_j))``, ``A = [a_1 .. a_m]``) softmax attention returns the projections of
``varphi(q)`` onto the principal axes ``u_d = sum_j a_dj (varphi(k_j) - mean)``.

The invariant kernel (``kernel="invariant"``) is ``k(x, y) = exp(-d_inv(x, y) / (2 sigma^2))``
with ``d_inv(x, y) = min_tau ||x - T_tau y||^2`` (Part A of the project's reference), kept on the
symmetrised invariant k-nearest-neighbour graph. Everything above holds with that kernel; the
attention weights ``k(q, k_j) / g(q)`` are then invariant attention's weights.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import LinearOperator, eigsh
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.extmath import svd_flip
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _memory
from ._estimator import SE2SearchMixin
from ._utils import check_magnitude, refuse_complex, resolve_device, resolve_image_shape
from .search import knn_search

__all__ = ["KernelPCAAttention"]

# kernel="invariant", n_components=None: the sparse eigensolver finds the leading components
# only, so None means this many (at most n - 1).
_INVARIANT_COMPONENTS = 64
# Below this many keys (or when nearly every component is asked for) the centred invariant Gram
# matrix is decomposed densely; above, by ARPACK on the sparse operator.
_DENSE_MAX = 512
# kernel="softmax": above this many keys, a request for at most N / 10 components is solved by
# ARPACK on the dense centred Gram matrix instead of a full eigendecomposition (O(N^3)).
_SOFTMAX_DENSE_MAX = 2000
# Maintenance note: the "auto" bandwidth of the invariant kernel. sigma^2 = _BANDWIDTH_FACTOR x
# the median squared invariant distance to the n_neighbors-th neighbour (so the weights fall
# gently within the neighbourhood and the graph sets the locality); chosen on MNIST rotated
# within +-45 degrees (examples/reproductions/kpca_features.py --sweep).
_BANDWIDTH_FACTOR = 2.0


def _log_normalisers(Q: torch.Tensor, K: torch.Tensor, scale: float) -> torch.Tensor:
    """``log g(q_i) = logsumexp_j(s q_i.k_j)`` for ``Q`` ``(..., M, D)``, ``K`` ``(..., N, D)``.

    Returns ``(..., M)``. The log-sum-exp subtracts the row maximum, so ``g`` never overflows.
    """
    return torch.logsumexp(scale * (Q @ K.transpose(-2, -1)), dim=-1)


def _normalised_gram(K: torch.Tensor, scale: float):
    """``K_phi`` ``(..., N, N)`` and ``log g(k_j)`` ``(..., N)`` of keys ``K`` ``(..., N, D)``.

    ``K_phi[i, j] = exp(s k_i.k_j - log g(k_i) - log g(k_j))``: the normalisers are divided out
    inside the exponential, so nothing overflows even when ``exp(s k_i.k_j)`` would.
    """
    logits = scale * (K @ K.transpose(-2, -1))
    log_g = torch.logsumexp(logits, dim=-1)
    return torch.exp(logits - log_g[..., :, None] - log_g[..., None, :]), log_g


def _centre(M: torch.Tensor) -> torch.Tensor:
    """``(I - 1_N) M (I - 1_N)`` for ``M`` ``(..., N, N)``."""
    M = M - M.mean(dim=-1, keepdim=True)
    return M - M.mean(dim=-2, keepdim=True)


def _sparse_normalised_gram(W):
    """``K_phi = G^-1 W G^-1`` (CSR) and ``log g`` of a sparse symmetric kernel matrix ``W``."""
    W = sp.csr_matrix(W, dtype=np.float64)
    g = np.asarray(W.sum(axis=1)).ravel()
    if not np.all(g > 0):
        raise ValueError("kernel: every key needs a positive kernel value (its row sum is 0)")
    inv = sp.diags(1.0 / g)
    return sp.csr_matrix(inv @ W @ inv), np.log(g)


def _centred_apply(Kphi, M: np.ndarray) -> np.ndarray:
    """``Kc M = (I - 1_N) K_phi (I - 1_N) M`` for a sparse ``K_phi`` without forming ``Kc``."""
    M = np.asarray(M, dtype=np.float64)
    out = Kphi @ (M - M.mean(axis=0))
    return out - out.mean(axis=0)


def _leading_eigen(Kphi, m: int):
    """The ``m`` largest eigenpairs of ``Kc`` of a sparse ``K_phi``, descending.

    Dense for small problems; otherwise ARPACK (Lanczos) on the centred operator, started from a
    fixed vector (not ``1``, which ``Kc`` maps to 0) so that the result is deterministic.
    """
    n = Kphi.shape[0]
    if n <= _DENSE_MAX or m >= n - 1:
        dense = Kphi.toarray()
        dense = dense - dense.mean(axis=1, keepdims=True)
        dense = dense - dense.mean(axis=0, keepdims=True)
        w, U = np.linalg.eigh(dense)
        return w[::-1][:m].copy(), U[:, ::-1][:, :m].copy()
    op = LinearOperator((n, n), matvec=lambda v: _centred_apply(Kphi, v.reshape(-1, 1)).ravel(),
                        matmat=lambda V: _centred_apply(Kphi, V), dtype=np.float64)
    v0 = np.random.RandomState(0).standard_normal(n)
    w, U = eigsh(op, k=m, which="LA", v0=v0, tol=1e-10)
    order = np.argsort(w)[::-1]
    return w[order], U[:, order]


class KernelPCAAttention(SE2SearchMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin,
                         BaseEstimator):
    """Kernel PCA of the keys' normalised kernel feature map, computed by one attention.

    ``fit(X)`` takes the keys ``X`` and finds the principal axes of ``varphi(k_j)``;
    ``transform(Q)`` projects queries onto them with one attention, ``softmax(s Q K^T) V``
    (``kernel="softmax"``) or invariant attention over the invariant k-nearest neighbours
    (``kernel="invariant"``), using the values ``V = G^-1 (I - 1_N) A`` that make the two equal.
    By default (``whiten=True``) the projections are then centred and scaled to unit variance on
    the training keys, so that the output is ready for a downstream estimator.

    Parameters
    ----------
    n_components : int, default=None
        Number of principal components. None keeps, with ``kernel="softmax"``, every component
        whose eigenvalue is above the tolerance ``lambda_1 * N * eps`` (float64 machine epsilon,
        the convention of :func:`numpy.linalg.matrix_rank`), at most ``N - 1`` since centring
        removes one direction; with ``kernel="invariant"``, the leading ``min(64, N - 1)``
        (the sparse eigensolver finds leading components only). Must not exceed the number of
        keys.
    kernel : {"softmax", "invariant"}, default="softmax"
        "softmax": ``k(x, y) = exp(s x.y)``, the kernel of softmax attention. "invariant":
        ``k(x, y) = exp(-d_inv(x, y) / (2 sigma^2))`` with the invariant squared distance
        ``d_inv(x, y) = min_tau ||x - T_tau y||^2`` over the transformations of ``group``,
        kept on the symmetrised invariant ``n_neighbors``-nearest-neighbour graph (sparse: memory
        ``O(N n_neighbors)``). Rows of ``X`` are then images (see ``image_shape``).
    scale : float or {"auto", "attention"}, default="auto"
        Attention scale ``s`` of the softmax kernel. "auto": ``1 / (n_features * X.var())``,
        scikit-learn's ``gamma="scale"`` rule, which makes ``s ||k_i - k_j||^2`` of order 1 for
        typical pairs of keys. "attention": ``1 / sqrt(n_features)``, the transformer's
        convention (None means the same, the default of earlier versions). Unused with
        ``kernel="invariant"``.
    whiten : bool, default=True
        True: output ``(H - mean_) / sqrt(eigenvalues_)``, the projections ``H`` centred and
        scaled to unit variance on the training keys (as scikit-learn's ``PCA(whiten=True)``).
        False: output ``H`` itself, exactly ``softmax(s Q K^T) values_``.
    robust : bool, default=False
        Fit on the keys cleaned by Principal Attention Pursuit: the sparse part ``S`` found by
        :func:`invariant_cluster.attention.principal_attention_pursuit` (run with the keys as
        their own values, ``mu = N n_features / (4 ||X||_1)``) is removed,
        ``keys_ = X - sparse_``. Only with ``kernel="softmax"``.
    n_iter : int, default=4
        PAP iterations when ``robust``.
    lam : float, default=4.0
        PAP sparsity weight when ``robust``.
    group : {"se2", "rotation", "translation", "none"}, default="se2"
        Transformations of the invariant kernel (``kernel="invariant"``).
    max_rotation : float, default=180.0
        Angles searched within ``+-max_rotation`` degrees (180: the full circle).
    n_rotations : int, default=36
        Number of grid angles (0 is always on the grid; 36 over the full circle holds the multiples
        of 90 degrees). At most :func:`~invariant_cluster.alignment.rotation_limit` (the angles the
        image size can tell apart, at least 360); more get a ``ValueError``.
    max_translation : float, default=0
        Integer shifts searched within ``+-max_translation`` pixels.
    n_neighbors : int, default=15
        Neighbours of each key in the invariant kernel's graph (at most ``N - 1``); a query is
        compared with its ``n_neighbors + 1`` nearest keys (a key's own row holds itself and its
        ``n_neighbors`` neighbours).
    bandwidth : "auto" or float, default="auto"
        ``sigma`` of the invariant kernel. "auto": ``sigma^2 = 2 x`` the median over keys of
        the squared invariant distance to the ``n_neighbors``-th neighbour.
    image_shape : tuple (H, W) or (C, H, W), default=None
        How rows of ``X`` fold into images for ``kernel="invariant"``; None means square
        single-channel images.
    n_candidates : int, default=None
        Shortlist length of the invariant neighbour search
        (:func:`invariant_cluster.neighbors.neighbor_search`; None: ``max(4 n_neighbors, 64)``;
        the search is exact when the shortlist would hold every key).
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device, default="auto"
        Where the maths runs (float64; the invariant neighbour search in float32); "auto" is
        CUDA when available. Fitted attributes are NumPy arrays on the CPU.
    reflection : bool, default=False
        The invariant kernel's search also covers the mirror images (E(2), see
        :mod:`invariant_cluster.transforms`).

    Attributes
    ----------
    eigenvalues_ : ndarray of shape (n_components,)
        ``lambda_d``, descending: eigenvalues of ``Kc`` divided by ``N``; the variance of
        component ``d`` of the projections on the training keys.
    eigenvectors_ : ndarray of shape (n_samples, n_components)
        ``a_d`` scaled so that each principal axis has unit norm, ``||a_d||^2 = 1 / (N lambda_d)``;
        signs fixed as :func:`sklearn.utils.extmath.svd_flip` does (largest entry positive).
    values_ : ndarray of shape (n_samples, n_components)
        ``V = G^-1 (I - 1_N) A``.
    mean_ : ndarray of shape (n_components,)
        Mean of the projections ``H`` over the training keys (the projection of the mean
        feature), subtracted when ``whiten``.
    keys_ : ndarray of shape (n_samples, n_features)
        The keys the kernel PCA was computed on (``X``, or ``X - sparse_`` when ``robust``).
    sparse_ : ndarray of shape (n_samples, n_features)
        Sparse part removed by PAP (zeros when not ``robust``).
    log_normalisers_ : ndarray of shape (n_samples,)
        ``log g(k_j)``.
    scale_ : float or None
        The scale ``s`` used (None with ``kernel="invariant"``).
    gram_ : scipy.sparse.csr_matrix of shape (n_samples, n_samples) or None
        ``kernel="invariant"``: the kernel values ``k(k_i, k_j)`` on the symmetrised
        neighbour graph (diagonal 1). None with ``kernel="softmax"``.
    bandwidth_ : float or None
        ``sigma`` of the invariant kernel (None with ``kernel="softmax"``).
    image_shape_ : tuple (C, H, W) or None
        The image shape (``kernel="invariant"``).
    n_features_in_ : int
        Number of features seen in ``fit``.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names seen in ``fit``; set only when ``X`` has column names that are all
        strings (a data frame).

    See Also
    --------
    sklearn.decomposition.KernelPCA : generic kernel PCA.
    invariant_cluster.diagnostics.projection_loss : reconstruction loss of an attention layer.
    invariant_cluster.diagnostics.eigenvector_check : are values kernel-PCA eigenvectors?

    Notes
    -----
    **Why whiten by default.** The normalised Gram matrix divides every kernel value by two
    softmax denominators, so its eigenvalues are tiny (about ``5e-8`` on scikit-learn's digits)
    and so are the raw projections (standard deviation ``sqrt(lambda_d)``, about ``2e-4``): a
    regularised downstream model sees zeros (3-fold accuracy 0.17 with ``LogisticRegression`` on
    standardised digits). Whitened, the same features are usable; measured on digits
    (``examples/reproductions/kpca_features.py``), ``StandardScaler -> KernelPCAAttention(32) ->
    LogisticRegression`` reaches the accuracy of ``KernelPCA(32, kernel="rbf")`` in the same
    place. Whitening is exact attention too: since attention weights sum to 1, the whitened
    output is ``softmax(s Q K^T) W`` with the values ``W = (values_ - mean_) / sqrt(lambda)``.
    Use ``whiten=False`` for the Eq.-6 identity itself, ``transform(Q) = softmax(s Q K^T)
    values_``.

    **Why ``scale="auto"``.** ``1 / sqrt(D)`` keeps the logits of *random* unit-variance queries
    and keys of order 1, but for data (standardised digits, ``D = 64``) ``s ||k||^2`` is about
    8: each key's kernel row is dominated by the key itself and the components generalise
    worse (3-fold accuracy 0.85 whitened, against 0.90 with ``"auto"``).

    Maths is in float64. ``exp(s k_i.k_j)`` can overflow, so ``g`` is kept as ``log g``
    (log-sum-exp with the row maximum subtracted) and every kernel value is formed as
    ``exp(s x.y - log g(x) - log g(y))``; ``transform`` uses the same combined exponential
    rather than ``softmax(...) @ values_`` so that a tiny ``1 / g(k_j)`` cannot underflow.

    Relation to :class:`sklearn.decomposition.KernelPCA` with ``kernel="precomputed"`` on
    ``K_phi`` (checked by the tests): its ``eigenvalues_`` are ``N * eigenvalues_`` here, its
    ``eigenvectors_`` are ``sqrt(N lambda_d) * eigenvectors_`` here, and its ``transform``
    equals the whitened output here times ``sqrt(eigenvalues_)`` (scikit-learn centres the
    query's feature ``varphi(q)``; the attention reading does not, which is what ``mean_``
    accounts for).

    The invariant kernel is this library's choice where the papers are silent: one global
    ``sigma`` (so that the kernel is symmetric and the attention weights ``k(q, k_j) / g(q)``
    are exactly invariant attention's, ``softmax_j(-d_inv(q, k_j) / (2 sigma^2))``), the graph
    symmetrised by the larger of ``k(k_i, k_j)`` and ``k(k_j, k_i)`` (equal up to the grid;
    a pair kept by either end), the grid's best transformation without continuous refinement.
    ``transform`` is invariant to any transformation ``tau`` of the query that maps the grid onto
    itself (e.g. 90 degrees on a full-circle grid of 36 angles), up to the float32 search and
    to the shortlist's recall when ``n_candidates`` is smaller than ``N``. A training key's
    query row holds its ``n_neighbors + 1`` nearest keys, its Gram row also its reverse
    neighbours, so ``transform(keys_)`` is close to, not equal to, ``K_phi (A - mean A)``.

    The kNN-truncated invariant kernel is not positive semi-definite (neither truncation nor
    the max over transformations preserves it): ``Kc`` has negative eigenvalues, and only the
    leading (positive) components have the projection reading. With many components the
    projection loss of :func:`~invariant_cluster.diagnostics.projection_loss` can then be
    negative (measured on scikit-learn's digits: positive with 3 components, negative for some
    queries with 20 of 60).

    Components requested through ``n_components`` whose eigenvalue is below the tolerance get
    ``eigenvalues_ = 0`` and zero eigenvectors and values (their projections are 0, also when
    whitened), with a warning, as scikit-learn's KernelPCA does for a zero eigenvalue.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import KernelPCAAttention
    >>> X = np.random.RandomState(0).normal(size=(50, 8))
    >>> kpca = KernelPCAAttention(n_components=3, device="cpu").fit(X)
    >>> H = kpca.transform(X)
    >>> H.shape, bool(np.allclose(H.std(axis=0), 1.0, atol=0.1))
    ((50, 3), True)

    The invariant kernel on images: features of a quarter turn equal those of the original.

    >>> imgs = np.random.RandomState(0).random((30, 8, 8))
    >>> inv = KernelPCAAttention(4, kernel="invariant", group="rotation", device="cpu")
    >>> inv = inv.fit(imgs.reshape(30, -1))
    >>> turned = np.rot90(imgs[:2], k=1, axes=(1, 2)).reshape(2, -1)
    >>> bool(np.allclose(inv.transform(turned), inv.transform(imgs[:2].reshape(2, -1)),
    ...                  atol=1e-4))
    True
    """

    _parameter_constraints: dict = {
        **SE2SearchMixin._parameter_constraints,
        "n_components": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "kernel": [StrOptions({"softmax", "invariant"})],
        "scale": [Interval(numbers.Real, 0, None, closed="neither"),
                  StrOptions({"auto", "attention"}), None],
        "whiten": ["boolean"],
        "robust": ["boolean"],
        "n_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "lam": [Interval(numbers.Real, 0, None, closed="neither")],
        "bandwidth": [StrOptions({"auto"}), Interval(numbers.Real, 0, None, closed="neither")],
    }

    def __init__(
        self, n_components=None, *, kernel="softmax", scale="auto", whiten=True, robust=False,
        n_iter=4, lam=4.0, group="se2", max_rotation=180.0, n_rotations=36, max_translation=0,
        n_neighbors=15, bandwidth="auto", image_shape=None, n_candidates=None, device="auto",
        reflection=False,
    ):
        self.n_components = n_components
        self.kernel = kernel
        self.scale = scale
        self.whiten = whiten
        self.robust = robust
        self.n_iter = n_iter
        self.lam = lam
        self.group = group
        self.max_rotation = max_rotation
        self.n_rotations = n_rotations
        self.max_translation = max_translation
        self.n_neighbors = n_neighbors
        self.bandwidth = bandwidth
        self.image_shape = image_shape
        self.n_candidates = n_candidates
        self.device = device
        self.reflection = reflection

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Kernel PCA of the keys ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Keys, one per row (at least 2); flattened images with ``kernel="invariant"``.
            Integers (``uint8`` included) and bools are taken at their values, not rescaled.
        y : None
            Ignored.

        Returns
        -------
        self : KernelPCAAttention
        """
        refuse_complex(X)
        X = np.ascontiguousarray(validate_data(self, X, dtype=np.float64, ensure_min_samples=2))
        n, n_features = X.shape
        self._check_magnitude(X)
        if self.n_components is not None and self.n_components > n:
            raise ValueError(
                f"n_components: must not exceed the number of keys (rows of X), "
                f"got n_components={self.n_components} with X of shape {X.shape}"
            )
        device = resolve_device(self.device)
        if self.kernel == "invariant":
            if self.robust:
                raise ValueError("robust: Principal Attention Pursuit is available with "
                                 "kernel='softmax' only, got robust=True with kernel='invariant'")
            return self._fit_invariant(X, device)
        # the dense n x n Gram matrix, its centred copy, the eigenvectors and eigh's workspace
        _memory.check_fits(4 * n * n * 8, device,
                           f"KernelPCAAttention.fit on {n} keys (dense {n} x {n} matrices)",
                           hint="fit fewer keys (rows of X), or use kernel='invariant' (a "
                                "sparse kNN kernel)")
        if self.scale is None or self.scale == "attention":
            scale = 1.0 / math.sqrt(n_features)
        elif self.scale == "auto":
            var = float(X.var())
            scale = 1.0 / (n_features * var) if var > 0 else 1.0 / n_features
        else:
            scale = float(self.scale)
        keys = torch.tensor(X, dtype=torch.float64, device=device)
        sparse = torch.zeros_like(keys)
        if self.robust:
            from .attention import principal_attention_pursuit

            _, sparse = principal_attention_pursuit(
                keys, keys, n_iter=self.n_iter, lam=self.lam, scale=scale, return_sparse=True
            )
            keys = keys - sparse
        gram, log_g = _normalised_gram(keys, scale)
        m_req = self.n_components
        if m_req is not None and n > _SOFTMAX_DENSE_MAX and m_req <= n // 10:
            # a few leading components of a large problem: Lanczos on the dense Kc
            Kc = _centre(gram).cpu().numpy()
            w, U = eigsh(Kc, k=m_req, which="LA", v0=np.random.RandomState(0).standard_normal(n),
                         tol=1e-10)
            order = np.argsort(w)[::-1]
            evals, evecs = w[order], U[:, order]
            del Kc
        else:
            evals, evecs = torch.linalg.eigh(_centre(gram))
            evals = evals.flip(0).cpu().numpy()
            evecs = evecs.flip(1).cpu().numpy()
        m = self._n_kept(evals, n, X, scale=scale)
        self._set_components(evals[:m], evecs[:, :m], n, lambda M: gram.cpu().numpy() @ M)
        self.log_normalisers_ = log_g.cpu().numpy()
        self._set_values()
        self.keys_ = keys.cpu().numpy()
        self.sparse_ = sparse.cpu().numpy()
        self.scale_ = scale
        self.gram_ = self.bandwidth_ = self.image_shape_ = None
        return self

    # ------------------------------------------------------------------ shared pieces
    def _n_kept(self, evals, n, X, scale=None):
        """How many components to keep; raises when none is above the tolerance."""
        tol = max(float(evals[0]), 0.0) * n * np.finfo(np.float64).eps
        self._tol = tol / n  # in the units of eigenvalues_
        if self.n_components is not None:
            return self.n_components
        m = int((evals > tol).sum())
        if m == 0:
            if self.kernel == "invariant":
                raise ValueError(
                    f"X: the centred normalised invariant Gram matrix has no eigenvalue above "
                    f"the tolerance {tol / n:.3g}, X has shape {X.shape}: the images are all "
                    "identical up to the searched transformations"
                )
            top = scale * float((X * X).sum(axis=1).max())
            raise ValueError(
                "X: the centred normalised Gram matrix of the keys has no eigenvalue above "
                f"the tolerance {tol / n:.3g}, X has shape {X.shape}. Either the keys are all "
                "identical, or the scaled squared norms (up to s ||k||^2 = "
                f"{top:.3g}) are so large that K_phi underflows in float64; a smaller "
                "`scale` helps then"
            )
        return m

    def _set_components(self, evals, evecs, n, apply_gram):
        """Eigenvalues / N, unit-axis eigenvectors and ``mean_`` from eigenpairs of ``Kc``."""
        evals = np.asarray(evals, dtype=np.float64) / n
        keep = evals > self._tol
        m = evals.shape[0]
        if not keep.all():
            warnings.warn(
                f"n_components={m} asks for {m - int(keep.sum())} component(s) with an "
                f"eigenvalue below the tolerance {self._tol:.3g}; their eigenvectors are set to 0",
                UserWarning,
                stacklevel=3,
            )
        evecs, _ = svd_flip(np.ascontiguousarray(evecs), None)
        evals = np.where(keep, evals, 0.0)
        A = evecs * np.where(keep, 1.0 / np.sqrt(n * np.where(keep, evals, 1.0)), 0.0)
        self.eigenvalues_ = evals
        self.eigenvectors_ = A
        # H on the training keys is K_phi (A - mean A); its mean is the projection of the mean.
        self.mean_ = np.asarray(apply_gram(A - A.mean(axis=0))).mean(axis=0)
        del self._tol

    def _set_values(self):
        A = self.eigenvectors_
        self.values_ = np.exp(-self.log_normalisers_)[:, None] * (A - A.mean(axis=0))

    def _finish(self, H):
        """Whiten the projections ``H`` when asked."""
        if not self.whiten:
            return H
        lam = self.eigenvalues_
        inv = np.where(lam > 0, 1.0 / np.sqrt(np.where(lam > 0, lam, 1.0)), 0.0)
        return (H - self.mean_) * inv

    def _check_magnitude(self, X):
        """Refuse keys or queries whose squared norm would overflow the kernel's dtype."""
        if self.kernel == "invariant":  # its neighbour search runs in float32
            check_magnitude(X, dtype=np.float32,
                            image_shape=resolve_image_shape(X.shape[1], self.image_shape))
        else:
            check_magnitude(X, dtype=np.float64)

    # ------------------------------------------------------------------ invariant kernel
    def _search(self, Xq, k, exclude=False):
        """Invariant kNN of the image rows ``Xq`` among ``keys_``: ``(dist, index)`` in NumPy.

        Always the shortlist (with ``n_candidates``, None:
        :func:`~invariant_cluster.search.plan.default_n_candidates`), which searches every key
        exactly when the shortlist would hold them all."""
        device = resolve_device(self.device)
        shape = self.image_shape_
        q = torch.tensor(Xq, dtype=torch.float32, device=device).reshape(-1, *shape)
        keys = q if exclude else torch.tensor(self.keys_, dtype=torch.float32,
                                              device=device).reshape(-1, *shape)
        ex = torch.arange(q.shape[0], device=device) if exclude else None
        with torch.no_grad():
            # KernelPCAAttention has no refine parameter: the grid's alignments
            dist, idx, _ = knn_search(q, keys, self._grid(refine=False), k, method="shortlist",
                                      exclude=ex, n_candidates=self.n_candidates)
        return dist.double().cpu().numpy(), idx.cpu().numpy()

    def _fit_invariant(self, X, device):
        n, n_features = X.shape
        self.image_shape_ = resolve_image_shape(n_features, self.image_shape)
        self.keys_ = X
        k = min(int(self.n_neighbors), n - 1)
        dist, idx = self._search(X, k, exclude=True)
        if self.bandwidth == "auto":
            sigma2 = _BANDWIDTH_FACTOR * float(np.median(dist[:, -1]))
            if not sigma2 > 0:
                raise ValueError(
                    "X: the median invariant distance to the n_neighbors-th neighbour is 0 (the "
                    "images repeat up to the searched transformations), so bandwidth='auto' has "
                    "nothing to scale; give a float bandwidth or more distinct images"
                )
        else:
            sigma2 = float(self.bandwidth) ** 2
        rows = np.repeat(np.arange(n), k)
        vals = np.exp(-dist.ravel() / (2.0 * sigma2))
        ok = np.isfinite(dist.ravel())
        W = sp.csr_matrix((vals[ok], (rows[ok], idx.ravel()[ok])), shape=(n, n))
        W = W.maximum(W.T).tolil()
        W.setdiag(1.0)  # d_inv(x, x) = 0: the identity is on every grid
        W = sp.csr_matrix(W)
        Kphi, log_g = _sparse_normalised_gram(W)
        m_max = n - 1 if self.n_components is None else self.n_components
        m_ask = min(m_max, _INVARIANT_COMPONENTS) if self.n_components is None else m_max
        evals, evecs = _leading_eigen(Kphi, min(m_ask, n))
        m = self._n_kept(evals, n, X)
        self._set_components(evals[:m], evecs[:, :m], n, lambda M: Kphi @ M)
        self.log_normalisers_ = log_g
        self._set_values()
        self.sparse_ = np.zeros_like(X)
        self.scale_ = None
        self.gram_ = W
        self.bandwidth_ = math.sqrt(sigma2)
        return self

    def kernel_matrix(self, X):
        """Invariant kernel values ``k(x_i, k_j)`` of new images over their nearest keys.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Query images (flattened as in ``fit``).

        Returns
        -------
        Kq : scipy.sparse.csr_matrix of shape (n_queries, n_samples)
            ``exp(-d_inv(x_i, k_j) / (2 sigma^2))`` for the ``n_neighbors + 1`` nearest keys
            of each query, 0 elsewhere. Row ``i`` divided by its sum is the invariant attention
            weights of ``x_i``, and ``transform(X)`` with ``whiten=False`` is those weights
            times ``values_``. Pass it to
            :func:`invariant_cluster.diagnostics.projection_loss` as ``kernel``.
        """
        check_is_fitted(self)
        if self.kernel != "invariant":
            raise ValueError(f"kernel: kernel_matrix needs kernel='invariant', got "
                             f"{self.kernel!r} (the softmax kernel is exp(s X keys_^T))")
        refuse_complex(X)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        self._check_magnitude(X)
        return self._kernel_rows(X, normalise=False)

    def _kernel_rows(self, X, normalise):
        """Kernel values over each query's nearest keys, or (``normalise``) their row shares."""
        n = self.keys_.shape[0]
        k = min(int(self.n_neighbors) + 1, n)
        if X.shape[0] == 0:
            return sp.csr_matrix((0, n))
        dist, idx = self._search(X, k)
        logits = -dist / (2.0 * self.bandwidth_**2)
        if normalise:
            # shares computed relative to the nearest key: a query far from every key (or a
            # tiny bandwidth) would otherwise divide zero kernel values by a zero row sum
            vals = np.exp(logits - logits.max(axis=1, keepdims=True))
            vals /= vals.sum(axis=1, keepdims=True)
        else:
            vals = np.exp(logits)
        rows = np.repeat(np.arange(X.shape[0]), k)
        return sp.csr_matrix((vals.ravel(), (rows, idx.ravel())), shape=(X.shape[0], n))

    # ------------------------------------------------------------------ transform
    @property
    def _n_features_out(self):
        return self.eigenvalues_.shape[0]

    def transform(self, X):
        """Project queries onto the principal axes with one attention, then whiten if asked.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Queries.

        Returns
        -------
        H : ndarray of shape (n_queries, n_components)
            ``whiten=False``: ``H[i, d] = varphi(q_i).u_d
            = sum_j (a_dj - mean a_d) k(q_i, k_j) / (g(q_i) g(k_j))``, i.e. softmax attention
            (or invariant attention) with the values ``values_``. ``whiten=True``:
            ``(H - mean_) / sqrt(eigenvalues_)``.
        """
        check_is_fitted(self)
        # a view such as np.rot90's has negative strides, which torch refuses
        refuse_complex(X)
        X = np.ascontiguousarray(validate_data(self, X, dtype=np.float64, reset=False))
        self._check_magnitude(X)
        A = self.eigenvectors_ - self.eigenvectors_.mean(axis=0)
        if X.shape[0] == 0:
            return np.zeros((0, A.shape[1]))
        if self.kernel == "invariant":
            shares = self._kernel_rows(X, normalise=True)
            weights = shares @ sp.diags(np.exp(-self.log_normalisers_))
            return self._finish(np.asarray(weights @ A))
        device = resolve_device(self.device)
        keys = torch.as_tensor(self.keys_, device=device)
        log_gk = torch.as_tensor(self.log_normalisers_, device=device)
        At = torch.as_tensor(A, device=device)
        out = []
        rows = _memory.SOFTMAX_QUERY_ROWS  # a rows x keys block of logits at a time
        for start in range(0, X.shape[0], rows):
            q = torch.tensor(X[start : start + rows], device=device)
            logits = self.scale_ * (q @ keys.T)
            log_gq = torch.logsumexp(logits, dim=1, keepdim=True)
            out.append((torch.exp(logits - log_gq - log_gk[None, :]) @ At).cpu().numpy())
        return self._finish(np.concatenate(out))
