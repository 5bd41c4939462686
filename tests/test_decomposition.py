"""Tests of KernelPCAAttention against float64 references written from the formulas."""

import numpy as np
import pytest
import torch
from sklearn.decomposition import KernelPCA
from sklearn.utils.estimator_checks import parametrize_with_checks

from invariant_cluster import KernelPCAAttention

# rng.normal(loc=100, size=(n, 2)) in these checks gives s ||k||^2 of about 14,000: every entry of
# the normalised Gram matrix is about exp(-14,000), zero in float64, so there is no component to
# keep and ``fit`` raises a ValueError that says so (instead of an empty projection).
_UNDERFLOW = (
    "keys around 100 make the normalised Gram matrix underflow to 0 in float64, so fit raises a "
    "clear ValueError rather than returning an empty projection"
)
EXPECTED_FAILED_CHECKS = {
    "check_fit_idempotent": _UNDERFLOW,
    "check_fit_check_is_fitted": _UNDERFLOW,
    "check_n_features_in": _UNDERFLOW,
}


@parametrize_with_checks(
    [KernelPCAAttention(device="cpu"), KernelPCAAttention(n_components=2, robust=True,
                                                          device="cpu")],
    expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS if est.n_components is None else {},
)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def _reference(X, Q, n_components=None, scale=None):
    """Kernel PCA of varphi and the projections of Q, straight from the formulas.

    The exponentials and normalisers are formed in extended precision (``np.longdouble``, whose
    exponent range reaches past exp(11000) on x86) so that the reference needs no log-sum-exp
    trick; the eigendecomposition is float64.
    """
    n, d = X.shape
    s = 1 / np.sqrt(d) if scale is None else scale
    E = np.exp(s * X.astype(np.longdouble) @ X.T)
    g = E.sum(1)
    Kphi = (E / np.outer(g, g)).astype(np.float64)
    H = np.eye(n) - 1.0 / n
    w, U = np.linalg.eigh(H @ Kphi @ H)
    w, U = w[::-1] / n, U[:, ::-1]
    m = int((w > w[0] * n * np.finfo(float).eps).sum()) if n_components is None else n_components
    w, U = w[:m], U[:, :m]
    A = U / np.sqrt(n * w)
    Eq = np.exp(s * Q.astype(np.longdouble) @ X.T)
    gq = Eq.sum(1)
    proj = np.zeros((Q.shape[0], m), dtype=np.longdouble)
    for d_ in range(m):  # sum over keys of (a_dj - mean a_d) k(q, k_j) / (g(q) g(k_j))
        for j in range(n):
            proj[:, d_] += (A[j, d_] - A[:, d_].mean()) * Eq[:, j] / (gq * g[j])
    return w, A, proj.astype(np.float64), Kphi


def _align_signs(A, B):
    """Flip the columns of B so they correlate positively with those of A."""
    return B * np.sign((A * B).sum(0))


# The Eq.-6 identity: the attention convention's scale and the raw (unwhitened) projections.
EXACT = dict(scale="attention", whiten=False, device="cpu")


@pytest.fixture
def data():
    rng = np.random.RandomState(0)
    return rng.normal(size=(40, 6)), rng.normal(size=(15, 6))


def test_transform_matches_formula_reference(data):
    X, Q = data
    est = KernelPCAAttention(n_components=7, **EXACT).fit(X)
    w, A, proj, _ = _reference(X, Q, n_components=7)
    np.testing.assert_allclose(est.eigenvalues_, w, rtol=1e-10)
    H = est.transform(Q)
    assert H.shape == (15, 7)
    np.testing.assert_allclose(H, _align_signs(H, proj), atol=1e-10, rtol=0)
    np.testing.assert_allclose(est.eigenvectors_, _align_signs(est.eigenvectors_, A), atol=1e-10)


def test_transform_is_softmax_attention_with_values(data):
    X, Q = data
    est = KernelPCAAttention(**EXACT).fit(X)
    logits = est.scale_ * Q @ X.T
    attn = np.exp(logits - logits.max(1, keepdims=True))
    attn /= attn.sum(1, keepdims=True)
    np.testing.assert_allclose(est.transform(Q), attn @ est.values_, atol=1e-14, rtol=1e-10)
    assert est.scale_ == pytest.approx(1 / np.sqrt(6))
    np.testing.assert_array_equal(est.keys_, X)
    np.testing.assert_array_equal(est.sparse_, 0)


def test_matches_sklearn_kernel_pca(data):
    X, _ = data
    n = X.shape[0]
    est = KernelPCAAttention(**EXACT).fit(X)
    *_, Kphi = _reference(X, X)
    sk = KernelPCA(kernel="precomputed", eigen_solver="dense")
    Z = sk.fit_transform(Kphi)
    m = est.eigenvalues_.shape[0]
    assert Z.shape[1] == m == n - 1
    # Documented scaling: eigenvalues times N, eigenvectors times sqrt(N lambda).
    np.testing.assert_allclose(sk.eigenvalues_, n * est.eigenvalues_, rtol=1e-9)
    scaled = est.eigenvectors_ * np.sqrt(n * est.eigenvalues_)
    np.testing.assert_allclose(scaled, _align_signs(scaled, sk.eigenvectors_), atol=1e-9)
    # scikit-learn also centres varphi(q); on the training keys that is the column mean.
    H = est.transform(X)
    Hc = H - H.mean(axis=0)
    np.testing.assert_allclose(Hc, _align_signs(Hc, Z), atol=1e-10)
    # Same sign convention (svd_flip) on well separated components.
    np.testing.assert_allclose(Hc[:, :5], Z[:, :5], atol=1e-10)


def test_eigenvector_normalisation_gives_unit_axes(data):
    X, _ = data
    n = X.shape[0]
    est = KernelPCAAttention(**EXACT).fit(X)
    A, lam = est.eigenvectors_, est.eigenvalues_
    np.testing.assert_allclose((A * A).sum(0), 1 / (n * lam), rtol=1e-8)
    *_, Kphi = _reference(X, X)
    H = np.eye(n) - 1.0 / n
    # <u_d, u_e> = a_d^T Kc a_e must be the identity.
    gram_axes = A.T @ H @ Kphi @ H @ A
    np.testing.assert_allclose(gram_axes, np.eye(len(lam)), atol=1e-8)
    assert np.all(np.diff(lam) <= 0)
    # svd_flip convention: the largest entry of each eigenvector is positive.
    idx = np.abs(A).argmax(0)
    assert np.all(A[idx, np.arange(A.shape[1])] > 0)


def test_near_zero_eigenvalues_are_dropped():
    rng = np.random.RandomState(1)
    base = rng.normal(size=(3, 5))
    X = base[rng.randint(0, 3, size=30)]  # 3 distinct keys: centred rank <= 2
    est = KernelPCAAttention(**EXACT).fit(X)
    assert est.eigenvalues_.shape == (2,)
    assert np.all(est.eigenvalues_ > 0)
    with pytest.warns(UserWarning, match="below the tolerance"):
        est4 = KernelPCAAttention(n_components=4, **EXACT).fit(X)
    assert est4.transform(X).shape == (30, 4)
    np.testing.assert_array_equal(est4.eigenvalues_[2:], 0)
    np.testing.assert_array_equal(est4.transform(X)[:, 2:], 0)
    np.testing.assert_allclose(est4.transform(X)[:, :2], est.transform(X), atol=1e-12)


@pytest.mark.skipif(np.finfo(np.longdouble).maxexp <= 1024, reason="needs extended precision")
def test_large_logits_do_not_overflow():
    rng = np.random.RandomState(2)
    X = rng.normal(size=(20, 4)) * 12
    Q = X * 1.1
    scale = 1 / np.sqrt(4)
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(scale * Q @ X.T)).any()  # the naive float64 formula overflows
    est = KernelPCAAttention(n_components=2, **EXACT).fit(X)
    H = est.transform(Q)
    assert np.isfinite(H).all() and np.isfinite(est.values_).all()
    w, _, proj, _ = _reference(X, Q, n_components=2)
    np.testing.assert_allclose(est.eigenvalues_, w, rtol=1e-8)
    np.testing.assert_allclose(H, _align_signs(H, proj), rtol=1e-8, atol=1e-10 * np.abs(H).max())


def test_robust_removes_sparse_part():
    rng = np.random.RandomState(3)
    X = rng.normal(size=(32, 8)) @ rng.normal(size=(8, 8)) * 0.3
    X[rng.rand(*X.shape) < 0.05] += 3.0
    est = KernelPCAAttention(n_components=4, robust=True, **EXACT).fit(X)
    assert est.sparse_.shape == X.shape
    assert np.count_nonzero(est.sparse_) > 0
    np.testing.assert_allclose(est.keys_, X - est.sparse_)
    assert np.isfinite(est.transform(X)).all()
    # No shrinkage (lam huge) and one iteration: nothing removed, same fit as the plain one.
    est_inf = KernelPCAAttention(n_components=4, robust=True, lam=1e300, n_iter=1,
                                 **EXACT).fit(X)
    np.testing.assert_array_equal(est_inf.sparse_, 0)
    plain = KernelPCAAttention(n_components=4, **EXACT).fit(X)
    np.testing.assert_allclose(est_inf.transform(X), plain.transform(X), atol=1e-12)


def test_feature_names_out(data):
    X, _ = data
    est = KernelPCAAttention(n_components=3, **EXACT).fit(X)
    assert list(est.get_feature_names_out()) == [f"kernelpcaattention{i}" for i in range(3)]


class TestBadInput:
    def test_n_components_larger_than_keys(self, data):
        X, _ = data
        with pytest.raises(ValueError, match="n_components"):
            KernelPCAAttention(n_components=41, device="cpu").fit(X)

    def test_nan(self, data):
        X, _ = data
        X = X.copy()
        X[3, 2] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            KernelPCAAttention(device="cpu").fit(X)

    def test_mismatched_query_dimension(self, data):
        X, Q = data
        est = KernelPCAAttention(device="cpu").fit(X)
        with pytest.raises(ValueError, match="features"):
            est.transform(Q[:, :5])

    def test_bad_parameters(self, data):
        X, _ = data
        with pytest.raises(ValueError, match="scale"):
            KernelPCAAttention(scale=-1.0).fit(X)
        with pytest.raises(ValueError, match="n_components"):
            KernelPCAAttention(n_components=0).fit(X)
        with pytest.raises(ValueError, match="device"):
            KernelPCAAttention(device="tpu").fit(X)

    def test_identical_keys(self):
        with pytest.raises(ValueError, match="X: the centred"):
            KernelPCAAttention(device="cpu").fit(np.ones((5, 3)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(data):
    X, Q = data
    cpu = KernelPCAAttention(n_components=5, device="cpu").fit(X)
    gpu = KernelPCAAttention(n_components=5, device="cuda").fit(X)
    np.testing.assert_allclose(gpu.transform(Q), cpu.transform(Q), atol=1e-8)
    cpu = KernelPCAAttention(n_components=5, **EXACT).fit(X)
    gpu = KernelPCAAttention(n_components=5, **{**EXACT, "device": "cuda"}).fit(X)
    assert isinstance(gpu.eigenvectors_, np.ndarray)
    np.testing.assert_allclose(gpu.transform(Q), cpu.transform(Q), atol=1e-10)
