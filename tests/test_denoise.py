"""DihedralPCA and class_averages(denoise=...): against an explicit float64 PCA of the group's
copies, exact group elements (quarter turns, mirrors, integer shifts) and scikit-learn's checks."""

import numpy as np
import pytest
import torch
from sklearn.utils.estimator_checks import parametrize_with_checks

from invariant_cluster import (
    DihedralPCA,
    InvariantKNeighborsTransformer,
    RadialWiener,
    aligned_neighbors,
    class_averages,
)
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


@parametrize_with_checks([DihedralPCA(), DihedralPCA(n_components=2),
                          DihedralPCA(n_components="auto")])
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

    @pytest.mark.parametrize("rank,n,h", [(1, 300, 12), (4, 400, 16), (7, 600, 16)])
    def test_auto_keeps_the_signal_directions(self, rank, n, h):
        # images drawn from `rank` radially symmetric patterns (each maps onto itself under
        # every quarter turn and mirror, so it is one direction of the averaged covariance)
        # plus white noise: the hard threshold keeps exactly those directions
        rng = np.random.default_rng(rank)
        yy, xx = np.mgrid[:h, :h] - (h - 1) / 2
        r = np.hypot(yy, xx)
        patterns = np.stack([np.cos(np.pi * (j + 1) * r / h) * np.exp(-r / h)
                             for j in range(rank)]).reshape(rank, -1)
        X = rng.normal(size=(n, rank)) @ patterns + 0.05 * rng.normal(size=(n, h * h))
        pca = DihedralPCA(n_components="auto").fit(X.reshape(n, h, h))
        assert pca.n_components_ == rank
        # the kept subspace is the patterns' span (float64 reference: numpy's QR)
        Q = np.linalg.qr(patterns.T)[0]
        np.testing.assert_allclose(pca.components_.T @ pca.components_, Q @ Q.T, atol=0.05)

    def test_auto_on_white_noise_keeps_one(self):
        X = np.random.default_rng(0).normal(size=(500, 16, 16))
        assert DihedralPCA(n_components="auto").fit(X).n_components_ == 1

    def test_dtype_and_shapes(self):
        X = _images(20, 10, seed=2).astype(np.float32)
        pca = DihedralPCA(n_components=3, output_size=5).fit(X[:, None])  # (n, C, H, W)
        Z = pca.transform(X[:, None])
        assert Z.dtype == np.float32 and Z.shape == (20, 25)
        assert pca.image_shape_ == (1, 10, 10) and pca.image_shape_out_ == (1, 5, 5)
        assert pca.scale_ == 2.0
        assert pca.get_feature_names_out().shape == (25,)


class TestDownsample:
    @pytest.mark.parametrize("h,size", [(63, 32), (63, 24), (13, 6), (28, 14)])
    def test_the_zoom_is_uniform(self, h, size):
        # the coordinate ramps x and y land, away from the border, on the output pixels'
        # centres mapped back by the uniform scale H / size, (i + 1/2) H / size - 1/2, to
        # within 0.1 input pixel (the sampled triangle filter's centroid is off by a few
        # hundredths; the uneven windows of adaptive pooling are off by 0.42 px at 63 -> 32)
        i = torch.arange(h, dtype=torch.float64)
        ramps = torch.stack([i[None, :].expand(h, h), i[:, None].expand(h, h)])[:, None]
        c = (torch.arange(size, dtype=torch.float64) + 0.5) * h / size - 0.5
        ref = torch.stack([c[None, :].expand(size, size), c[:, None].expand(size, size)])
        e = 2
        err = (downsample(ramps, size)[:, 0] - ref)[:, e:-e, e:-e].abs().max()
        assert err < 0.1

    def test_constant_stays_constant(self):
        X = torch.full((2, 1, 17, 17), 3.5, dtype=torch.float64)
        torch.testing.assert_close(downsample(X, 7), torch.full((2, 1, 7, 7), 3.5,
                                                                dtype=torch.float64))

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
        with pytest.raises(ValueError, match="n_components"):
            DihedralPCA(n_components="most").fit(_images(10, 6))
        with pytest.raises(ValueError, match="n_components: 'auto'.*output_size"):
            DihedralPCA(n_components="auto").fit(np.zeros((2, 65, 65), np.float32))


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


class TestAlignedNeighbors:
    @pytest.mark.parametrize("h,shifts", [(16, (-2, 0, 2)), (20, (-4, -2, 0, 2))])
    def test_shifts_on_the_copy_come_back_in_input_pixels(self, h, shifts):
        # copies of one image shifted by even integers along x, searched on the half-size
        # copy: each neighbour's reported shift is the difference of the known shifts
        base = np.zeros((h, h))
        base[5:h - 5, 5:h - 5] = _images(1, h - 10, seed=h)[0]
        X = np.stack([np.roll(base, t, 1) for t in shifts])
        pca = DihedralPCA(n_components=h * h, output_size=h // 2)
        ind, tau = aligned_neighbors(X, n_neighbors=len(shifts) - 1, group="translation",
                                     max_translation=max(shifts) - min(shifts), refine=False,
                                     denoise=pca)
        assert tau.shape == (len(shifts), len(shifts) - 1, 3)
        t = np.asarray(shifts, float)
        # the neighbour's content moved onto the image: tx = t_i - t_j
        np.testing.assert_allclose(tau[..., 1], t[:, None] - t[ind], atol=1e-5)
        np.testing.assert_allclose(tau[..., 2], 0.0, atol=1e-5)

    @pytest.mark.parametrize("n_images", [2, 3])
    def test_quarter_turns_and_mirrors(self, n_images):
        # the 8 dihedral copies of each image: the 7 neighbours of a copy are the others, each
        # with a mirror bit that says whether the two differ by a mirror
        base = _images(n_images, 12, seed=n_images)
        X = np.concatenate([np.rot90(base[:, :, ::-1] if m else base, r, axes=(1, 2))
                            for m in (0, 1) for r in range(4)])
        y = np.tile(np.arange(n_images), 8)
        mirror = np.repeat([0, 1], 4 * n_images)
        ind, tau = aligned_neighbors(X, n_neighbors=7, n_rotations=4, refine=False,
                                     reflection=True)
        assert tau.shape == (8 * n_images, 7, 4)
        assert (y[ind] == y[:, None]).all()
        np.testing.assert_array_equal(tau[..., 3], mirror[ind] != mirror[:, None])

    def test_is_the_search_of_class_averages(self):
        from invariant_cluster.neighbors import aligned_weighted_sum

        X = _images(30, 10, seed=3).astype(np.float32)
        kw = dict(n_neighbors=4, n_rotations=8, max_translation=1)
        ind, tau = aligned_neighbors(X, **kw)
        Xt = torch.as_tensor(X)[:, None]
        idx = torch.cat([torch.arange(30)[:, None], torch.as_tensor(ind)], 1)
        params = torch.cat([torch.zeros(30, 1, 3), torch.as_tensor(tau)], 1)
        ref = aligned_weighted_sum(Xt, idx, params, torch.full(idx.shape, 0.2))[:, 0]
        np.testing.assert_allclose(class_averages(X, **kw), ref.numpy(), atol=1e-5)

    def test_errors(self):
        X = _images(6, 8)
        for bad in (0, 6, 2.0, True):
            with pytest.raises(ValueError, match="n_neighbors"):
                aligned_neighbors(X, n_neighbors=bad)
        with pytest.raises(TypeError, match="denoise"):
            aligned_neighbors(X, n_neighbors=2, denoise="pca")
        with pytest.raises(ValueError, match="X"):
            aligned_neighbors(np.full((6, 8, 8), np.nan), n_neighbors=2)


def _blob_objects(n_objects, h, seed, spread=2.5, width=3.0):
    """Compact, asymmetric, positive objects (three Gaussian blobs each, within ``spread`` px of
    the centre) well inside an ``h x h`` canvas, so that shifts of a few pixels keep them
    whole."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :h].astype(np.float64)
    c = (h - 1) / 2.0
    out = np.zeros((n_objects, h, h))
    for i in range(n_objects):
        for _ in range(3):
            x0, y0 = c + rng.uniform(-spread, spread, 2)
            out[i] += rng.uniform(0.5, 1.0) * np.exp(-((xx - x0) ** 2 + (yy - y0) ** 2) / width)
    return out


class TestCenter:
    @pytest.mark.parametrize("h,reflection", [(24, False), (25, True)])
    def test_off_centre_copies_are_aligned_exactly(self, h, reflection):
        # quarter turns (and mirrors) of 3 objects, each copy shifted by up to 4 integer pixels:
        # the centre of mass moves with the object exactly, so after centring the copies differ
        # by a grid rotation only; searched with max_translation=1 (the shifts themselves are
        # out of that range), the alignments returned map the ORIGINAL neighbours onto the
        # images
        from invariant_cluster.transforms import warp_se2

        base = _blob_objects(3, h, seed=h)
        rng = np.random.default_rng(h)
        copies, y = [], []
        for m in ((0, 1) if reflection else (0,)):
            for r in range(4):
                for o in range(3):
                    img = np.rot90(base[o][:, ::-1] if m else base[o], r)
                    tx, ty = rng.integers(-4, 5, 2)
                    copies.append(np.roll(np.roll(img, ty, 0), tx, 1))
                    y.append(o)
        X, y = np.stack(copies).astype(np.float32), np.asarray(y)
        k = 4 * (2 if reflection else 1) - 1
        kw = dict(n_neighbors=k, n_rotations=4, max_translation=1, refine=False,
                  reflection=reflection)
        ind, tau = aligned_neighbors(X, center=True, **kw)
        assert (y[ind] == y[:, None]).all()
        warped = warp_se2(X[ind.ravel()], tau.reshape(-1, tau.shape[-1]).astype(np.float32))
        np.testing.assert_allclose(warped.reshape(X.shape[0], k, h, h),
                                   np.broadcast_to(X[:, None], (X.shape[0], k, h, h)),
                                   atol=1e-4)
        # without the centring the same search range does not reach the shifts
        ind0, _ = aligned_neighbors(X, **kw)
        assert (y[ind0] == y[:, None]).mean() < 1.0

    @pytest.mark.parametrize("n_objects,n_copies", [(4, 12), (6, 10)])
    def test_with_denoise_on_noisy_shifted_copies(self, n_objects, n_copies):
        # smooth objects, quarter-turned and shifted by up to 3 px, under noise of half their
        # standard deviation, searched with max_translation=1 on a half-size denoised copy:
        # centring that copy finds copies of the same object far more often than no centring,
        # and more often than centring the noisy pixels (measured 0.94 / 0.41 / 0.83 and
        # 0.87 / 0.29 / 0.73)
        base = _blob_objects(n_objects, 32, seed=1, spread=4.0, width=8.0)
        rng = np.random.default_rng(2)
        X, y = [], []
        for rep in range(n_copies):
            for o in range(n_objects):
                tx, ty = rng.integers(-3, 4, 2)
                X.append(np.roll(np.roll(np.rot90(base[o], rep % 4), ty, 0), tx, 1))
                y.append(o)
        X, y = np.stack(X), np.asarray(y)
        X = (X + rng.normal(0, 0.5 * X.std(), X.shape)).astype(np.float32)
        kw = dict(n_neighbors=5, n_rotations=8, max_translation=1, reflection=True)
        pca = DihedralPCA(20, output_size=16)
        pur = lambda ind: float((y[ind] == y[:, None]).mean())  # noqa: E731
        p_centred = pur(aligned_neighbors(X, center=True, denoise=pca, **kw)[0])
        p_plain = pur(aligned_neighbors(X, denoise=pca, **kw)[0])
        p_pixels = pur(aligned_neighbors(X, center=True, **kw)[0])
        assert p_centred >= 0.85 and p_centred > p_plain + 0.3 and p_centred > p_pixels

    def test_errors(self):
        X = _images(10, 8)
        with pytest.raises(TypeError, match="center"):
            aligned_neighbors(X, n_neighbors=3, center="mass")
        with pytest.raises(ValueError, match="center"):
            class_averages(X, labels=np.zeros(10, int), center=True)


# ------------------------------------------------------------------ RadialWiener (issue 20)
def _shapes(n, h, w, seed):
    """Bright bars and blobs on a flat black background (the clean images) ``(n, h, w)``."""
    rng = np.random.default_rng(seed)
    X = np.zeros((n, h, w))
    for i in range(n):
        r0, c0 = rng.integers(1, h // 2), rng.integers(1, w // 2)
        X[i, r0:r0 + h // 3, c0:c0 + 2] = 1.0
        X[i, r0, c0:c0 + w // 3] = 1.0
    return X


def _reference_gain(X, noise_std, power):
    """float64 NumPy: the power spectrum over the half plane of ``rfft2``, averaged per integer
    radius (in steps of 1 / max(H, W)), and ``(max(P - N, 0) / P) ** power``."""
    n, h, w = X.shape
    P = (np.abs(np.fft.rfft2(X)) ** 2).mean(0)
    fy, fx = np.meshgrid(np.fft.fftfreq(h), np.fft.rfftfreq(w), indexing="ij")
    r = np.floor(np.hypot(fy, fx) * max(h, w) + 0.5 + 1e-9).astype(int)  # half up
    prof = np.array([P[r == b].mean() if np.any(r == b) else 0.0 for b in range(r.max() + 1)])
    N = noise_std ** 2 * h * w
    return np.where(prof > 0, np.clip(prof - N, 0, None) / np.where(prof > 0, prof, 1), 1.0) \
        ** power, r


@parametrize_with_checks([RadialWiener(), RadialWiener(noise_std=0.1, power=1.0)])
def test_radial_wiener_sklearn_compatible(estimator, check):
    check(estimator)


class TestRadialWiener:
    @pytest.mark.parametrize("n,h,w,sigma", [(300, 16, 16, 0.1), (200, 28, 28, 0.5),
                                             (150, 12, 20, 0.8)])
    def test_measures_the_noise(self, n, h, w, sigma):
        clean = _shapes(n, h, w, seed=h)
        X = clean + sigma * np.random.default_rng(n).standard_normal(clean.shape)
        f = RadialWiener().fit(X)
        assert abs(f.noise_std_ - sigma) < 0.05 * sigma

    @pytest.mark.parametrize("n,h,w", [(30, 16, 16), (12, 9, 14)])
    def test_clean_images_pass_unchanged(self, n, h, w):
        X = _shapes(n, h, w, seed=n).astype(np.float32)
        f = RadialWiener().fit(X)
        assert f.noise_std_ == 0.0 and f.is_identity
        np.testing.assert_array_equal(f.transform(X), X.reshape(n, -1))

    @pytest.mark.parametrize("n,h,w,power", [(40, 16, 16, 0.5), (25, 10, 15, 1.0)])
    def test_equals_the_float64_reference(self, n, h, w, power):
        X = _shapes(n, h, w, seed=3) + 0.4 * np.random.default_rng(1).standard_normal((n, h, w))
        f = RadialWiener(power=power).fit(X)
        g, r = _reference_gain(X, f.noise_std_, power)
        np.testing.assert_allclose(f.gain_[0], g, rtol=1e-9, atol=1e-12)
        ref = np.fft.irfft2(np.fft.rfft2(X) * g[r], s=(h, w))
        np.testing.assert_allclose(f.transform(X), ref.reshape(n, -1), atol=1e-10)

    def test_commutes_with_quarter_turns_mirrors_and_shifts(self):
        X = (_shapes(20, 14, 14, seed=5)
             + 0.5 * np.random.default_rng(2).standard_normal((20, 14, 14))).astype(np.float32)
        f = RadialWiener().fit(X)
        Y = f.transform(X).reshape(X.shape)
        for op in (lambda A: np.rot90(A, 1, axes=(1, 2)), lambda A: np.rot90(A, 2, axes=(1, 2)),
                   lambda A: A[:, :, ::-1], lambda A: np.roll(A, (3, -2), axis=(1, 2))):
            np.testing.assert_allclose(f.transform(op(X)).reshape(X.shape), op(Y), atol=1e-5)

    def test_brings_noisy_images_nearer_the_clean_ones(self):
        clean = _shapes(200, 16, 16, seed=8)
        X = clean + 0.5 * np.random.default_rng(8).standard_normal(clean.shape)
        for power in (0.5, 1.0):
            Y = RadialWiener(power=power).fit(X).transform(X).reshape(X.shape)
            assert np.linalg.norm(Y - clean) < 0.7 * np.linalg.norm(X - clean)

    def test_given_noise_and_channels(self):
        X = np.random.default_rng(0).standard_normal((30, 3, 8, 8))
        f = RadialWiener(noise_std=0.3).fit(X)
        assert f.noise_std_ == 0.3 and f.gain_.shape[0] == 3
        assert f.transform(X).shape == (30, 192)
        assert RadialWiener(noise_std=0.0).fit(X).is_identity

    @pytest.mark.parametrize("bad", [-0.1, "high", np.nan])
    def test_bad_noise_std_names_the_argument(self, bad):
        with pytest.raises((ValueError, TypeError), match="noise_std"):
            RadialWiener(noise_std=bad).fit(np.zeros((5, 4, 4)))

    def test_nan_images_name_x(self):
        X = np.zeros((5, 4, 4))
        X[1, 2, 2] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            RadialWiener().fit(X)

    def test_in_a_pipeline_before_the_neighbour_search(self):
        # the filter's flat rows feed InvariantKNeighborsTransformer; quarter turns of one noisy
        # shape are filtered into quarter turns of one image, found as neighbours at distance 0
        from sklearn.pipeline import make_pipeline

        base = _shapes(1, 12, 12, seed=4)[0] + 0.3 * np.random.default_rng(4).standard_normal(
            (12, 12))
        others = _shapes(8, 12, 12, seed=9) + 0.3 * np.random.default_rng(9).standard_normal(
            (8, 12, 12))
        X = np.concatenate([np.stack([np.rot90(base, k) for k in range(4)]), others])
        pipe = make_pipeline(RadialWiener(),
                             InvariantKNeighborsTransformer(n_neighbors=3, n_rotations=4,
                                                            refine=False, device="cpu"))
        G = pipe.fit_transform(X.reshape(len(X), -1).astype(np.float32)).tocsr()
        for i in range(4):
            row = G[i]
            near = set(row.indices[row.data < 1e-3 * X.var() * 144]) - {i}
            assert near == set(range(4)) - {i}
