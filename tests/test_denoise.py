"""DihedralPCA and class_averages(denoise=...): against an explicit float64 PCA of the group's
copies, exact group elements (quarter turns, mirrors, integer shifts) and scikit-learn's checks."""

import numpy as np
import pytest
import torch
from sklearn.utils.estimator_checks import parametrize_with_checks

from invariant_cluster import DihedralPCA, InvariantKNeighborsTransformer, class_averages
from invariant_cluster.denoise import downsample


def _images(n, h, w=None, seed=0):
    """Smooth random images with a dark border (what a shift keeps inside the canvas)."""
    w = h if w is None else w
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, h, w))
    X[:, :, 1:] += X[:, :, :-1]
    X[:, 1:, :] += X[:, :-1, :]
    return X


def _group_copies(X):
    """All quarter turns and mirrors of square images ``(n, h, h)``: ``(8 n, h, h)``."""
    return np.concatenate([np.rot90(B, k, axes=(1, 2)) for B in (X, X[:, :, ::-1])
                           for k in range(4)])


@parametrize_with_checks([DihedralPCA(), DihedralPCA(n_components=2)])
def test_sklearn_compatible(estimator, check):
    check(estimator)


class TestProjection:
    @pytest.mark.parametrize("n,h,r", [(40, 9, 5), (120, 12, 17), (25, 8, 3)])
    def test_equals_pca_of_the_group_copies(self, n, h, r):
        # the float64 reference: numpy's SVD of the 8 n explicit copies, centred on their mean
        X = _images(n, h, seed=n)
        A = _group_copies(X).reshape(8 * n, -1)
        mu = A.mean(0)
        _, s, Vt = np.linalg.svd(A - mu, full_matrices=False)
        pca = DihedralPCA(n_components=r).fit(X)
        k = pca.n_components_
        assert k in (r, r + 1)  # one more only to keep a degenerate pair whole
        if k == r + 1:
            assert np.isclose(s[r - 1], s[r], rtol=1e-6)
        P_ref = Vt[:k].T @ Vt[:k]
        P = pca.components_.T @ pca.components_
        np.testing.assert_allclose(P, P_ref, atol=1e-9)
        np.testing.assert_allclose(pca.mean_, mu, atol=1e-12)
        np.testing.assert_allclose(pca.explained_variance_, s[:k] ** 2 / n / 8, rtol=1e-9)
        Z = pca.transform(X)
        np.testing.assert_allclose(Z, (X.reshape(n, -1) - mu) @ P_ref + mu, atol=1e-9)

    @pytest.mark.parametrize("h,size", [(12, None), (15, 7), (16, 8)])
    def test_commutes_with_quarter_turns_and_mirrors(self, h, size):
        X = _images(60, h, seed=h)
        pca = DihedralPCA(n_components=6, output_size=size).fit(X)
        s = pca.image_shape_out_[1]
        Z = pca.transform(X).reshape(-1, s, s)
        for g in (lambda A: np.rot90(A, 1, axes=(1, 2)), lambda A: A[:, :, ::-1],
                  lambda A: np.rot90(A[:, :, ::-1], 3, axes=(1, 2))):
            np.testing.assert_allclose(pca.transform(np.ascontiguousarray(g(X))).reshape(Z.shape),
                                       g(Z), atol=1e-10)

    def test_rectangular_images_half_turn_and_mirrors(self):
        X = _images(50, 8, 11, seed=3)
        pca = DihedralPCA(n_components=4).fit(X)
        Z = pca.transform(X).reshape(X.shape)
        for g in (lambda A: A[:, ::-1, ::-1], lambda A: A[:, :, ::-1], lambda A: A[:, ::-1]):
            np.testing.assert_allclose(pca.transform(np.ascontiguousarray(g(X))).reshape(Z.shape),
                                       g(Z), atol=1e-10)

    def test_all_components_is_the_identity(self):
        X = _images(30, 5, seed=1)
        pca = DihedralPCA(n_components=100).fit(X)
        assert pca.n_components_ == 25
        np.testing.assert_allclose(pca.transform(X), X.reshape(30, -1), atol=1e-10)

    def test_dtype_and_shapes(self):
        X = _images(20, 10, seed=2).astype(np.float32)
        pca = DihedralPCA(n_components=3, output_size=5).fit(X[:, None])  # (n, C, H, W)
        Z = pca.transform(X[:, None])
        assert Z.dtype == np.float32 and Z.shape == (20, 25)
        assert pca.image_shape_ == (1, 10, 10) and pca.image_shape_out_ == (1, 5, 5)
        assert pca.scale_ == 2.0
        assert pca.get_feature_names_out().shape == (25,)


class TestDownsample:
    def test_integer_factor_is_the_block_mean(self):
        X = torch.as_tensor(_images(4, 12, seed=5))[:, None]
        ref = X.reshape(4, 1, 4, 3, 4, 3).mean((3, 5))
        torch.testing.assert_close(downsample(X, 4), ref)

    @pytest.mark.parametrize("h,size", [(63, 32), (13, 6), (28, 14)])
    def test_commutes_with_the_group(self, h, size):
        X = torch.as_tensor(_images(3, h, seed=h))[:, None]
        D = downsample(X, size)
        torch.testing.assert_close(downsample(torch.rot90(X, 1, (2, 3)), size),
                                   torch.rot90(D, 1, (2, 3)))
        torch.testing.assert_close(downsample(X.flip(-1), size), D.flip(-1))


class TestErrors:
    def test_output_size_needs_square_images(self):
        with pytest.raises(ValueError, match="output_size"):
            DihedralPCA(output_size=4).fit(_images(10, 8, 10))

    def test_output_size_at_most_the_image(self):
        with pytest.raises(ValueError, match="output_size"):
            DihedralPCA(output_size=9).fit(_images(10, 8))

    def test_too_many_features_asks_for_output_size(self):
        with pytest.raises(ValueError, match="output_size"):
            DihedralPCA().fit(np.zeros((2, 91, 91), np.float32))

    def test_bad_input(self):
        X = _images(10, 6)
        X[0, 0, 0] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            DihedralPCA().fit(X)
        pca = DihedralPCA(n_components=2).fit(_images(10, 6))
        with pytest.raises(ValueError, match="features|shape"):
            pca.transform(_images(10, 7))
        with pytest.raises(ValueError, match="n_components"):
            DihedralPCA(n_components=0).fit(_images(10, 6))


class TestClassAveragesDenoised:
    @pytest.mark.parametrize("h,shifts", [(16, (-2, 0, 2)), (20, (-4, -2, 0))])
    def test_shifts_found_on_the_copy_are_scaled_back(self, h, shifts):
        # copies shifted by even integers: on the half-size copy the shifts are integers, and
        # scaled back they align the originals exactly, so each average IS its image (every
        # component kept: a truncated PCA commutes with the group, not with the shifts)
        base = np.zeros((2, h, h))
        base[:, 5:h - 5, 5:h - 5] = _images(2, h - 10, seed=h)
        X = np.concatenate([np.roll(np.roll(base, t, 2), -t, 1) for t in shifts])
        pca = DihedralPCA(n_components=h * h, output_size=h // 2)
        avg = class_averages(X, n_neighbors=len(shifts) - 1, group="translation",
                             max_translation=4, refine=False, denoise=pca)
        np.testing.assert_allclose(avg, X, atol=1e-5)

    @pytest.mark.parametrize("n_copies", [8, 12])
    def test_noisy_rotated_copies(self, n_copies):
        # quarter turns and mirrors of 3 smooth images under white noise of twice their
        # standard deviation: on the denoised copy the neighbours are copies of the same image
        # far more often, and the averages of the ORIGINALS are closer to the clean images
        from scipy.ndimage import gaussian_filter

        clean = gaussian_filter(np.random.default_rng(7).normal(size=(3, 16, 16)), (0, 2, 2))
        clean /= clean.std()
        X = np.concatenate([np.rot90(clean[:, :, ::-1] if c % 2 else clean, c, axes=(1, 2))
                            for c in range(n_copies)]).astype(np.float32)
        y = np.tile(np.arange(3), n_copies)
        noisy = X + np.random.default_rng(n_copies).normal(0, 2.0, X.shape).astype(np.float32)
        kw = dict(n_neighbors=n_copies - 1, n_rotations=4, refine=False, reflection=True)
        pca = DihedralPCA(6, output_size=8).fit(noisy)
        ind = InvariantKNeighborsTransformer(**kw).fit(noisy).kneighbors()[1]
        ind_d = InvariantKNeighborsTransformer(image_shape=pca.image_shape_out_, **kw).fit(
            pca.transform(noisy)).kneighbors()[1]
        purity, purity_d = (y[ind] == y[:, None]).mean(), (y[ind_d] == y[:, None]).mean()
        assert purity_d >= 0.9 and purity_d > purity + 0.15
        err = lambda A: float(np.abs(A - X).mean())  # noqa: E731
        plain = class_averages(noisy, **kw)
        assert err(class_averages(noisy, denoise=pca, **kw)) < err(plain) < err(noisy)

    def test_errors(self):
        X = _images(10, 8)
        with pytest.raises(TypeError, match="denoise"):
            class_averages(X, n_neighbors=3, denoise=5)
        with pytest.raises(ValueError, match="denoise"):
            class_averages(X, labels=np.zeros(10, int), denoise=DihedralPCA())
        with pytest.raises(ValueError, match="denoise"):
            class_averages(X, n_neighbors=3, denoise=DihedralPCA(2).fit(_images(10, 6)))
