"""Tests of KernelPCAAttention against float64 references written from the formulas."""

import numpy as np
import pytest
import scipy.sparse as sp
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


_FLOAT32_SEARCH = {
    "check_methods_subset_invariance": (
        "the invariant neighbour search runs in float32, and its matrix products' blocking "
        "depends on the number of queries: round-off of about 1e-7 between batches"
    ),
}


def _expected_failed(est):
    if est.kernel == "invariant":
        return _FLOAT32_SEARCH
    return EXPECTED_FAILED_CHECKS if est.n_components is None else {}


@parametrize_with_checks(
    [KernelPCAAttention(device="cpu"),
     KernelPCAAttention(n_components=2, robust=True, device="cpu"),
     KernelPCAAttention(n_components=2, kernel="invariant", device="cpu")],
    expected_failed_checks=_expected_failed,
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


def test_leading_components_by_lanczos_match_dense(data, monkeypatch):
    import invariant_cluster.decomposition as dec

    X, Q = data
    dense = KernelPCAAttention(n_components=3, device="cpu").fit(X)
    monkeypatch.setattr(dec, "_SOFTMAX_DENSE_MAX", 10)  # force the Lanczos path at N = 40
    lanczos = KernelPCAAttention(n_components=3, device="cpu").fit(X)
    np.testing.assert_allclose(lanczos.eigenvalues_, dense.eigenvalues_, rtol=1e-9)
    np.testing.assert_allclose(lanczos.transform(Q), dense.transform(Q), atol=1e-7)


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
        with pytest.raises(ValueError, match="scale"):
            KernelPCAAttention(scale="sqrt").fit(X)
        with pytest.raises(ValueError, match="whiten"):
            KernelPCAAttention(whiten="yes").fit(X)
        assert KernelPCAAttention(scale=None, device="cpu").fit(X).scale_ == 1 / np.sqrt(6)
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


# ----------------------------------------------------------------------------- whitening
def _normalised_cross(Q, X, s):
    """k(q, k_j) / (g(q) g(k_j)) in float64 from the formula (small logits: no overflow)."""
    Ek, Eq = np.exp(s * X @ X.T), np.exp(s * Q @ X.T)
    return Eq / np.outer(Eq.sum(1), Ek.sum(1)), Ek / np.outer(Ek.sum(1), Ek.sum(1))


class TestWhiten:
    def test_default_is_unit_variance_on_keys(self, data):
        X, _ = data
        est = KernelPCAAttention(n_components=6, device="cpu").fit(X)
        assert est.whiten and est.scale_ == pytest.approx(1 / (6 * X.var()))
        H = est.transform(X)
        np.testing.assert_allclose(H.mean(0), 0, atol=1e-10)
        np.testing.assert_allclose(H.var(0), 1, rtol=1e-8)
        np.testing.assert_allclose(H.T @ H / len(X), np.eye(6), atol=1e-8)

    def test_equals_sklearn_transform_over_sqrt_eigenvalue(self, data):
        X, Q = data
        est = KernelPCAAttention(n_components=5, device="cpu").fit(X)
        Kq, Kphi = _normalised_cross(Q, X, est.scale_)
        sk = KernelPCA(5, kernel="precomputed", eigen_solver="dense").fit(Kphi)
        ref = sk.transform(Kq) / np.sqrt(sk.eigenvalues_ / len(X))
        np.testing.assert_allclose(est.transform(Q), _align_signs(est.transform(Q), ref),
                                   atol=1e-8)

    def test_whitened_output_is_attention_with_shifted_values(self, data):
        X, Q = data
        est = KernelPCAAttention(n_components=5, device="cpu").fit(X)
        raw = KernelPCAAttention(n_components=5, whiten=False, device="cpu").fit(X)
        logits = est.scale_ * Q @ X.T
        attn = np.exp(logits - logits.max(1, keepdims=True))
        attn /= attn.sum(1, keepdims=True)
        shifted = (est.values_ - est.mean_) / np.sqrt(est.eigenvalues_)
        np.testing.assert_allclose(est.transform(Q), attn @ shifted, atol=1e-9)
        np.testing.assert_allclose(raw.transform(Q), attn @ raw.values_, atol=1e-14)
        np.testing.assert_allclose(est.transform(Q) * np.sqrt(est.eigenvalues_) + est.mean_,
                                   raw.transform(Q), atol=1e-14)


def test_pipeline_on_digits_reaches_kernel_pca_rbf():
    """The issue's pipeline: the default features are usable by a regularised model."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)

    def cv(step):
        pipe = make_pipeline(StandardScaler(), step, LogisticRegression(max_iter=2000))
        return cross_val_score(pipe, X, y, cv=3).mean()

    ours = cv(KernelPCAAttention(n_components=32))
    assert ours >= cv(KernelPCA(n_components=32, kernel="rbf"))
    assert cv(KernelPCAAttention(n_components=32, whiten=False)) < 0.5  # the scale problem


# ----------------------------------------------------------------------------- invariant kernel
@pytest.fixture(scope="module")
def digits_images():
    from invariant_cluster.datasets import load_digits_images

    X, _ = load_digits_images(return_X_y=True)
    return X.reshape(len(X), -1).astype(np.float64)


def _invariant_reference(X, Q, k, m, **grid):
    """Invariant kernel PCA from dense float64 invariant distances and the formulas."""
    from invariant_cluster import invariant_distances

    n = len(X)
    D = invariant_distances(X, X, refine=False, device="cpu", **grid)
    np.fill_diagonal(D, np.inf)
    nn = np.argsort(D, axis=1)[:, :k]
    sigma2 = 2.0 * np.median(np.take_along_axis(D, nn[:, -1:], 1))
    W = np.zeros((n, n))
    rows = np.repeat(np.arange(n), k)
    W[rows, nn.ravel()] = np.exp(-D[rows, nn.ravel()] / (2 * sigma2))
    W = np.maximum(W, W.T)
    np.fill_diagonal(W, 1.0)
    g = W.sum(1)
    Kphi = W / np.outer(g, g)
    H = np.eye(n) - 1.0 / n
    w, U = np.linalg.eigh(H @ Kphi @ H)
    w, U = w[::-1][:m] / n, U[:, ::-1][:, :m]
    A = U / np.sqrt(n * w)
    Dq = invariant_distances(Q, X, refine=False, device="cpu", **grid)
    nq = np.argsort(Dq, axis=1)[:, : k + 1]
    Wq = np.zeros_like(Dq)
    rq = np.repeat(np.arange(len(Q)), k + 1)
    Wq[rq, nq.ravel()] = np.exp(-Dq[rq, nq.ravel()] / (2 * sigma2))
    proj = (Wq / Wq.sum(1, keepdims=True) / g) @ (A - A.mean(0))
    return w, proj, W, np.sqrt(sigma2)


class TestInvariantKernel:
    def test_matches_float64_reference(self, digits_images):
        X, Q = digits_images[:80], digits_images[80:90]
        grid = dict(group="rotation", max_rotation=60.0, n_rotations=13)
        est = KernelPCAAttention(4, kernel="invariant", whiten=False, n_neighbors=10,
                                 device="cpu", **grid).fit(X)
        w, proj, W, sigma = _invariant_reference(X, Q, 10, 4, **grid)
        assert est.bandwidth_ == pytest.approx(sigma, rel=1e-5)
        np.testing.assert_allclose(est.gram_.toarray(), W, atol=1e-5)
        np.testing.assert_allclose(est.eigenvalues_, w, rtol=1e-4)
        H = est.transform(Q)
        np.testing.assert_allclose(H, _align_signs(H, proj), atol=1e-4 * np.abs(proj).max())
        # ... and it is invariant attention with the values V: softmax(-d_inv / 2 sigma^2) V.
        Kq = est.kernel_matrix(Q).toarray()
        np.testing.assert_allclose(H, Kq / Kq.sum(1, keepdims=True) @ est.values_, atol=1e-14)

    @pytest.mark.parametrize("quarter_turns", [1, 2, 3])
    def test_rotation_invariant_features(self, digits_images, quarter_turns):
        """Default grid: 36 angles over the full circle, which holds 90, 180 and 270 degrees."""
        X, Q = digits_images[:100], digits_images[100:110]
        est = KernelPCAAttention(8, kernel="invariant").fit(X)
        turned = np.rot90(Q.reshape(-1, 8, 8), k=quarter_turns, axes=(1, 2)).reshape(10, -1)
        H, Ht = est.transform(Q), est.transform(turned)
        np.testing.assert_allclose(Ht, H, atol=1e-4)
        assert np.abs(H - H.mean(0)).max() > 0.5  # the features do tell images apart
        plain = KernelPCAAttention(8).fit(X)
        assert np.abs(plain.transform(turned) - plain.transform(Q)).max() > 0.1

    def test_sparse_eigensolver_matches_dense(self):
        from invariant_cluster.decomposition import _leading_eigen

        rng = np.random.RandomState(0)
        n = 700
        W = sp.random(n, n, density=0.02, random_state=rng)
        W = sp.csr_matrix(W.maximum(W.T) + sp.eye(n))
        w, U = _leading_eigen(W, 6)  # n > 512: ARPACK on the centred operator
        dense = W.toarray()
        H = np.eye(n) - 1.0 / n
        w_ref, U_ref = np.linalg.eigh(H @ dense @ H)
        np.testing.assert_allclose(w, w_ref[::-1][:6], rtol=1e-9)
        np.testing.assert_allclose(np.abs(U.T @ U_ref[:, ::-1][:, :6]), np.eye(6), atol=1e-6)

    def test_diagnostics_apply(self, digits_images):
        from invariant_cluster.diagnostics import eigenvector_check, projection_loss

        X, Q = digits_images[:60], digits_images[60:75]
        losses = []
        for m in (3, 20):
            est = KernelPCAAttention(m, kernel="invariant", whiten=False).fit(X)
            out = projection_loss(Q, est.keys_, est.values_, kernel=est.kernel_matrix(Q))
            np.testing.assert_allclose(out["h_sq_norm"], (est.transform(Q) ** 2).sum(1),
                                       rtol=1e-10)
            np.testing.assert_allclose(out["phi_q_sq_norm"],
                                       1 / np.asarray(est.kernel_matrix(Q).sum(1)).ravel() ** 2)
            losses.append(out["mean_j_proj"])
        assert losses[0] > losses[1] and losses[0] > 0
        # The kNN-truncated invariant kernel is indefinite, so varphi lives in a Krein space and
        # J_proj can go below 0 with many components (documented in the Notes).
        assert np.linalg.eigvalsh(est.gram_.toarray())[0] < 0
        # The values of the kernel PCA are eigenvectors (Eq. 11) to round-off; pixels are not.
        exact = eigenvector_check(est.keys_, est.values_[:, :4], kernel=est.gram_, random_state=0)
        np.testing.assert_allclose(exact["gamma_median"], exact["eigenvalue"], rtol=1e-8)
        assert np.all(exact["rel_diff_mean"] < 1e-8)
        linear = est.keys_ @ np.random.RandomState(0).normal(size=(64, 4))  # values W_V x
        pixels = eigenvector_check(est.keys_, linear, kernel=est.gram_, random_state=0)
        assert np.all(pixels["rel_diff_mean"] > 0.1)

    def test_bad_input(self, digits_images):
        X = digits_images[:20]
        with pytest.raises(ValueError, match="kernel"):
            KernelPCAAttention(kernel="rbf").fit(X)
        with pytest.raises(ValueError, match="n_components"):
            KernelPCAAttention(21, kernel="invariant").fit(X)
        with pytest.raises(ValueError, match="robust"):
            KernelPCAAttention(2, kernel="invariant", robust=True).fit(X)
        with pytest.raises(ValueError, match="image_shape"):
            KernelPCAAttention(2, kernel="invariant", image_shape=(4, 4)).fit(X)
        with pytest.raises(ValueError, match="kernel"):
            KernelPCAAttention(2, device="cpu").fit(X).kernel_matrix(X)
        with pytest.raises(ValueError, match="n_neighbors"):
            KernelPCAAttention(2, kernel="invariant", n_neighbors=0).fit(X)
