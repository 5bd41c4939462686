"""Self-attention as kernel PCA of the keys: :class:`KernelPCAAttention`.

Convention
----------
One head: keys ``k_j`` (``j = 1..N``), width ``D``, scale ``s`` (``1 / sqrt(D)`` by default).
Kernel ``k(x, y) = exp(s x.y)`` with feature map ``phi``; normalised feature map
``varphi(x) = phi(x) / g(x)`` with ``g(x) = sum_j exp(s x.k_j)`` (the softmax denominator).
Normalised Gram ``K_phi[i, j] = exp(s k_i.k_j) / (g(k_i) g(k_j))``, centred
``Kc = (I - 1_N) K_phi (I - 1_N)``, eigenproblem ``Kc a_d = N lambda_d a_d``. With the values
``V = G^-1 (I - 1_N) A`` (``G = diag(g(k_j))``, ``A = [a_1 .. a_m]``) softmax attention returns the
projections of ``varphi(q)`` onto the principal axes ``u_d = sum_j a_dj (varphi(k_j) - mean)``.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np
import torch
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils._param_validation import Interval
from sklearn.utils.extmath import svd_flip
from sklearn.utils.validation import check_is_fitted, validate_data

from ._utils import resolve_device

__all__ = ["KernelPCAAttention"]

# Rows of queries handled at once in ``transform`` (bounds memory at _CHUNK x n_keys floats).
_CHUNK = 2048


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


class KernelPCAAttention(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Kernel PCA of the keys' normalised exponential feature map, computed by softmax attention.

    ``fit(X)`` takes the keys ``X`` and finds the principal axes of ``varphi(k_j)``;
    ``transform(Q)`` projects queries onto them with one softmax attention,
    ``softmax(s Q K^T) V``, using the values ``V = G^-1 (I - 1_N) A`` that make the two equal.

    Parameters
    ----------
    n_components : int, default=None
        Number of principal components. None keeps every component whose eigenvalue is above the
        tolerance ``lambda_1 * N * eps`` (float64 machine epsilon, the convention of
        :func:`numpy.linalg.matrix_rank`), at most ``N - 1`` since centring removes one direction.
        Must not exceed the number of keys.
    scale : float, default=None
        Attention scale ``s``. None means ``1 / sqrt(n_features)``.
    robust : bool, default=False
        Fit on the keys cleaned by Principal Attention Pursuit: the sparse part ``S`` found by
        :func:`invariant_cluster.attention.principal_attention_pursuit` (run with the keys as
        their own values, ``mu = N n_features / (4 ||X||_1)``) is removed,
        ``keys_ = X - sparse_``.
    n_iter : int, default=4
        PAP iterations when ``robust``.
    lam : float, default=4.0
        PAP sparsity weight when ``robust``.
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device, default="auto"
        Where the maths runs (always in float64); "auto" is CUDA when available. Fitted
        attributes are NumPy arrays on the CPU.

    Attributes
    ----------
    eigenvalues_ : ndarray of shape (n_components,)
        ``lambda_d``, descending: eigenvalues of ``Kc`` divided by ``N``.
    eigenvectors_ : ndarray of shape (n_samples, n_components)
        ``a_d`` scaled so that each principal axis has unit norm, ``||a_d||^2 = 1 / (N lambda_d)``;
        signs fixed as :func:`sklearn.utils.extmath.svd_flip` does (largest entry positive).
    values_ : ndarray of shape (n_samples, n_components)
        ``V = G^-1 (I - 1_N) A``.
    keys_ : ndarray of shape (n_samples, n_features)
        The keys the kernel PCA was computed on (``X``, or ``X - sparse_`` when ``robust``).
    sparse_ : ndarray of shape (n_samples, n_features)
        Sparse part removed by PAP (zeros when not ``robust``).
    log_normalisers_ : ndarray of shape (n_samples,)
        ``log g(k_j)``.
    scale_ : float
        The scale used.
    n_features_in_ : int
        Number of features seen in ``fit``.

    See Also
    --------
    sklearn.decomposition.KernelPCA : generic kernel PCA.
    invariant_cluster.diagnostics.projection_loss : reconstruction loss of an attention layer.

    Notes
    -----
    Maths is in float64. ``exp(s k_i.k_j)`` can overflow, so ``g`` is kept as ``log g``
    (log-sum-exp with the row maximum subtracted) and every kernel value is formed as
    ``exp(s x.y - log g(x) - log g(y))``; ``transform`` uses the same combined exponential
    rather than ``softmax(...) @ values_`` so that a tiny ``1 / g(k_j)`` cannot underflow.

    Relation to :class:`sklearn.decomposition.KernelPCA` with ``kernel="precomputed"`` on
    ``K_phi`` (checked by the tests): its ``eigenvalues_`` are ``N * eigenvalues_`` here, its
    ``eigenvectors_`` are ``sqrt(N lambda_d) * eigenvectors_`` here, and its
    ``fit_transform`` equals ``transform(keys_)`` minus its column means (scikit-learn centres
    the test feature ``varphi(q)`` too; the attention reading does not).

    Components requested through ``n_components`` whose eigenvalue is below the tolerance get
    ``eigenvalues_ = 0`` and zero eigenvectors and values (their projections are 0), with a
    warning, as scikit-learn's KernelPCA does for a zero eigenvalue.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import KernelPCAAttention
    >>> X = np.random.RandomState(0).normal(size=(50, 8))
    >>> kpca = KernelPCAAttention(n_components=3, device="cpu").fit(X)
    >>> kpca.transform(X[:4]).shape
    (4, 3)
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "scale": [Interval(numbers.Real, 0, None, closed="neither"), None],
        "robust": ["boolean"],
        "n_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "lam": [Interval(numbers.Real, 0, None, closed="neither")],
        "device": [str, torch.device],
    }

    def __init__(
        self, n_components=None, *, scale=None, robust=False, n_iter=4, lam=4.0, device="auto"
    ):
        self.n_components = n_components
        self.scale = scale
        self.robust = robust
        self.n_iter = n_iter
        self.lam = lam
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Kernel PCA of the keys ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Keys, one per row (at least 2).
        y : None
            Ignored.

        Returns
        -------
        self : KernelPCAAttention
        """
        X = validate_data(self, X, dtype=np.float64, ensure_min_samples=2)
        n, n_features = X.shape
        if self.n_components is not None and self.n_components > n:
            raise ValueError(
                f"n_components: must not exceed the number of keys (rows of X), "
                f"got n_components={self.n_components} with X of shape {X.shape}"
            )
        device = resolve_device(self.device)
        scale = 1.0 / math.sqrt(n_features) if self.scale is None else float(self.scale)
        keys = torch.tensor(X, dtype=torch.float64, device=device)
        sparse = torch.zeros_like(keys)
        if self.robust:
            from .attention import principal_attention_pursuit

            _, sparse = principal_attention_pursuit(
                keys, keys, n_iter=self.n_iter, lam=self.lam, scale=scale, return_sparse=True
            )
            keys = keys - sparse
        gram, log_g = _normalised_gram(keys, scale)
        evals, evecs = torch.linalg.eigh(_centre(gram))
        evals = evals.flip(0).cpu().numpy() / n
        evecs = evecs.flip(1).cpu().numpy()
        tol = max(float(evals[0]), 0.0) * n * np.finfo(np.float64).eps
        keep = evals > tol
        if self.n_components is None:
            m = int(keep.sum())
            if m == 0:
                top = scale * float((X * X).sum(axis=1).max())
                raise ValueError(
                    "X: the centred normalised Gram matrix of the keys has no eigenvalue above "
                    f"the tolerance {tol:.3g}, X has shape {X.shape}. Either the keys are all "
                    "identical, or the scaled squared norms (up to s ||k||^2 = "
                    f"{top:.3g}) are so large that K_phi underflows in float64; a smaller "
                    "`scale` helps then"
                )
        else:
            m = self.n_components
            if not keep[:m].all():
                warnings.warn(
                    f"n_components={m} asks for {m - int(keep[:m].sum())} component(s) with an "
                    f"eigenvalue below the tolerance {tol:.3g}; their eigenvectors are set to 0",
                    UserWarning,
                    stacklevel=2,
                )
        evals, evecs, keep = evals[:m], evecs[:, :m], keep[:m]
        evecs, _ = svd_flip(evecs, None)
        evals = np.where(keep, evals, 0.0)
        A = evecs * np.where(keep, 1.0 / np.sqrt(n * np.where(keep, evals, 1.0)), 0.0)
        log_g = log_g.cpu().numpy()
        self.eigenvalues_ = evals
        self.eigenvectors_ = A
        self.values_ = np.exp(-log_g)[:, None] * (A - A.mean(axis=0))
        self.keys_ = keys.cpu().numpy()
        self.sparse_ = sparse.cpu().numpy()
        self.log_normalisers_ = log_g
        self.scale_ = scale
        return self

    @property
    def _n_features_out(self):
        return self.eigenvalues_.shape[0]

    def transform(self, X):
        """Project queries onto the principal axes: ``softmax(s X K^T) V``.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Queries.

        Returns
        -------
        H : ndarray of shape (n_queries, n_components)
            ``H[i, d] = varphi(q_i).u_d = sum_j (a_dj - mean a_d) k(q_i, k_j) / (g(q_i) g(k_j))``.
        """
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        device = resolve_device(self.device)
        keys = torch.as_tensor(self.keys_, device=device)
        log_gk = torch.as_tensor(self.log_normalisers_, device=device)
        A = torch.as_tensor(self.eigenvectors_, device=device)
        A = A - A.mean(dim=0)
        out = []
        for start in range(0, X.shape[0], _CHUNK):
            q = torch.tensor(X[start : start + _CHUNK], device=device)
            logits = self.scale_ * (q @ keys.T)
            log_gq = torch.logsumexp(logits, dim=1, keepdim=True)
            out.append((torch.exp(logits - log_gq - log_gk[None, :]) @ A).cpu().numpy())
        if not out:
            return np.zeros((0, self.eigenvalues_.shape[0]))
        return np.concatenate(out)
