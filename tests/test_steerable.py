"""SteerableWiener: the covariance Wiener filter in the Fourier-Bessel basis."""

import math

import numpy as np
import pytest
import scipy.linalg
from scipy.ndimage import rotate
from scipy.special import jn_zeros, jv
from sklearn.utils.estimator_checks import parametrize_with_checks

from invariant_cluster import RadialWiener, SteerableWiener
from invariant_cluster.steerable import fourier_bessel_basis

# scikit-learn's checks feed 2-D arrays whose rows fold into 1 x n_features images: a disk of
# radius 0.5 holds no Fourier-Bessel function, and fit says so (a ValueError naming
# image_shape) instead of returning zeros
_NOT_IMAGES = "images of 1 x n_features pixels have no Fourier-Bessel function"
EXPECTED_FAILED = {name: _NOT_IMAGES for name in [
    "check_dict_unchanged", "check_dont_overwrite_parameters", "check_dtype_object",
    "check_estimators_dtypes", "check_estimators_fit_returns_self", "check_estimators_nan_inf",
    "check_estimators_overwrite_params", "check_estimators_pickle",
    "check_estimators_pickle(readonly_memmap=True)", "check_f_contiguous_array_estimator",
    "check_fit2d_1feature", "check_fit2d_1sample", "check_fit2d_predict1d",
    "check_fit_check_is_fitted", "check_fit_idempotent", "check_fit_score_takes_y",
    "check_methods_sample_order_invariance", "check_methods_subset_invariance",
    "check_n_features_in", "check_pipeline_consistency", "check_readonly_memmap_input",
    "check_transformer_data_not_an_array", "check_transformer_general",
    "check_transformer_general(readonly_memmap=True)", "check_transformer_preserve_dtypes",
]}


@parametrize_with_checks([SteerableWiener(), SteerableWiener(noise_std=0.1)],
                         expected_failed_checks=lambda est: EXPECTED_FAILED)
def test_sklearn_compatible(estimator, check):
    check(estimator)


# ----------------------------------------------------------------------------------- helpers
def _bars(n, size, seed, noise):
    """Rotated copies (any angle) of two bars and a blob, and the same with white noise."""
    rng = np.random.default_rng(seed)
    shapes = np.zeros((3, size, size))
    c = size // 2
    shapes[0, c - 2:c + 2, 3:size - 3] = 1
    shapes[1, 3:c, c - 1:c + 2] = 1
    shapes[1, c - 1:c + 2, c:size - 4] = 0.6
    yy, xx = np.mgrid[:size, :size]
    shapes[2] = np.exp(-((yy - c + 3) ** 2 + (xx - c - 2) ** 2) / 8.0)
    clean = np.stack([rotate(shapes[i % 3], a, reshape=False, order=1)
                      for i, a in enumerate(rng.uniform(0, 360, n))])
    return clean, clean + noise * rng.standard_normal(clean.shape)


def _reference_basis(h, w, centre, radius):
    """float64, SciPy's jv at every pixel: J_k(z r / R) (sqrt 2 cos, sqrt 2 sin for k > 0) /
    (sqrt(pi) R |J_{k+1}(z)|), the zeros ``z <= pi R``, ordered as the package orders them."""
    yy, xx = np.mgrid[:h, :w].astype(float)
    x, y = xx - centre[0], yy - centre[1]
    r, th = np.hypot(x, y).ravel(), np.arctan2(y, x).ravel()
    inside = r < radius
    cols, freq = [], []
    for k in range(200):
        z = jn_zeros(k, 40)
        z = z[z <= math.pi * radius]
        if not len(z):
            break
        rad = jv(k, r[inside, None] / radius * z) / (math.sqrt(math.pi) * radius
                                                     * np.abs(jv(k + 1, z)))
        parts = [rad] if k == 0 else [rad * math.sqrt(2) * np.cos(k * th[inside, None]),
                                      rad * math.sqrt(2) * np.sin(k * th[inside, None])]
        cols += parts
        freq += [k] * (len(z) * len(parts))
    return inside, np.concatenate(cols, 1), np.array(freq)


def _reference_filter(X, noise_std, centre, radius):
    """float64: per angular frequency, the generalised eigenvectors of (C, N) (C: the
    coefficients' covariance over images and cosine/sine parts, N = noise_std^2 G, G the
    block's Gram matrix), the spiked-model gain of each eigenvalue, H = N V diag(g) V^T, and
    the image B G^-1 (mu + H (a - mu))."""
    n, h, w = X.shape
    inside, B, freq = _reference_basis(h, w, centre, radius)
    Y = X.reshape(n, -1)[:, inside]
    out = np.zeros((n, int(inside.sum())))
    for k in np.unique(freq):
        idx = np.flatnonzero(freq == k)
        parts = [idx] if k == 0 else [idx[:len(idx) // 2], idx[len(idx) // 2:]]
        q = len(parts[0])
        A = [Y @ B[:, p] for p in parts]
        G = sum(B[:, p].T @ B[:, p] for p in parts) / len(parts)
        mu = A[0].mean(0) if k == 0 else np.zeros(q)
        m = n * len(parts)
        C = sum((a - mu).T @ (a - mu) for a in A) / m
        N = noise_std ** 2 * G
        lam, V = scipy.linalg.eigh(C, N)  # V^T N V = I
        gamma = q / m
        g = np.zeros(q)
        for i, v in enumerate(lam):
            if v > (1 + math.sqrt(gamma)) ** 2:
                b = v + 1 - gamma
                ell = (b + math.sqrt(b * b - 4 * v)) / 2 - 1
                c2 = min(max((1 - gamma / ell ** 2) / (1 + gamma / ell), 0.0), 1.0)
                g[i] = ell * c2 / (ell * c2 + 1)
        H = N @ V @ np.diag(g) @ V.T
        Ginv = np.linalg.inv(G)
        for p, a in zip(parts, A):
            out += (mu + (a - mu) @ H.T) @ Ginv @ B[:, p].T
    full = np.zeros((n, h * w))
    full[:, inside] = out
    return full.reshape(n, h, w)


# ------------------------------------------------------------------------------------- basis
@pytest.mark.parametrize("h, w, centre_name", [(16, 16, "fourier"), (15, 15, "geometric"),
                                               (20, 13, "fourier"), (12, 17, "geometric")])
def test_basis_is_scipys_bessel_functions(h, w, centre_name):
    from invariant_cluster.transforms import rotation_centre

    inside, basis, freq, sine = fourier_bessel_basis(h, w, rotation_center=centre_name)
    ref_inside, ref, ref_freq = _reference_basis(h, w, rotation_centre(h, w, centre_name),
                                                 min(h, w) / 2)
    np.testing.assert_array_equal(inside, ref_inside)
    np.testing.assert_array_equal(freq, ref_freq)
    np.testing.assert_allclose(basis, ref, atol=1e-5)
    assert set(np.unique(sine)) <= {0, 1} and not np.any(sine[freq == 0])


@pytest.mark.parametrize("size, centre", [(64, "fourier"), (31, "geometric"), (20, "fourier")])
def test_basis_is_well_conditioned_over_the_pixels(size, centre):
    """The pixel sums approximate the disk's integrals: the Gram matrix's eigenvalues stay
    within a factor of 2 of 1, so white pixel noise stays nearly white in the coefficients."""
    _, B, _, _ = fourier_bessel_basis(size, size, rotation_center=centre)
    e = np.linalg.eigvalsh(B.T @ B)
    assert 0.5 < e.min() and e.max() < 1.6


# ------------------------------------------------------------------------------------ filter
@pytest.mark.parametrize("size, centre", [(16, "fourier"), (15, "geometric")])
def test_filter_is_the_float64_reference(size, centre):
    from invariant_cluster.transforms import rotation_centre

    _, X = _bars(240, size, seed=1, noise=0.5)
    f = SteerableWiener(noise_std=0.5, rotation_center=centre).fit(X)
    ref = _reference_filter(X, 0.5, rotation_centre(size, size, centre), size / 2)
    np.testing.assert_allclose(f.transform(X).reshape(X.shape), ref, atol=2e-4)
    # the same filter on other images: the fitted operator, not a refit
    _, X2 = _bars(20, size, seed=2, noise=0.5)
    got = f.transform(X2).reshape(X2.shape)
    assert np.abs(got - f.transform(X2).reshape(X2.shape)).max() == 0


@pytest.mark.parametrize("size, centre", [(24, "fourier"), (23, "geometric")])
def test_filter_commutes_with_quarter_turns_and_mirrors(size, centre):
    _, X = _bars(200, size, seed=3, noise=0.7)
    f = SteerableWiener(rotation_center=centre).fit(X)
    Z = f.transform(X).reshape(X.shape)
    shift = 1 if centre == "fourier" else 0  # rot90 turns about (L - 1) / 2; pixel L / 2 is 1 on

    def turn(A):
        return np.roll(np.rot90(A, axes=(1, 2)), shift, axis=1)

    def mirror(A):
        return np.roll(A[:, :, ::-1], shift, axis=2)

    for op in (turn, mirror):
        np.testing.assert_allclose(f.transform(op(X)).reshape(X.shape), op(Z), atol=1e-4)


@pytest.mark.parametrize("n, size, noise", [(300, 24, 1.0), (120, 20, 0.5), (600, 17, 2.0)])
def test_denoises_rotated_copies_better_than_the_radial_filter(n, size, noise):
    clean, X = _bars(n, size, seed=n, noise=noise)
    f = SteerableWiener().fit(X)
    assert abs(f.noise_std_ - noise) < 0.05 * noise

    def err(Z):
        return float(np.linalg.norm(np.asarray(Z).reshape(n, -1) - clean.reshape(n, -1)))

    ours = err(f.transform(X))
    assert ours < 0.5 * err(X)
    assert ours < err(RadialWiener(power=1.0).fit_transform(X.reshape(n, -1)))
    assert 0 < f.n_components_ < f.n_basis_


def test_class_average_noise_level_recipe():
    """Averages of k + 1 images filtered with noise_std / sqrt(k + 1): closer to the clean
    images than the averages, and than the single images' filter."""
    n, k = 400, 8
    clean, X = _bars(n, 20, seed=5, noise=2.0)
    rng = np.random.default_rng(0)
    extra = clean[:, None] + 2.0 * rng.standard_normal((n, k, 20, 20))
    avg = (X + extra.sum(1)) / (k + 1)
    single = SteerableWiener(noise_std=2.0).fit_transform(X)
    f = SteerableWiener(noise_std=2.0 / math.sqrt(k + 1)).fit(avg)

    def err(Z):
        return float(np.linalg.norm(np.asarray(Z).reshape(n, -1) - clean.reshape(n, -1)))

    assert err(f.transform(avg)) < min(err(avg), err(single))


def test_zero_noise_is_the_identity_and_float32_stays_float32():
    _, X = _bars(50, 16, seed=0, noise=0.1)
    X32 = X.astype(np.float32)
    f = SteerableWiener(noise_std=0.0).fit(X32)
    assert f.is_identity
    np.testing.assert_array_equal(f.transform(X32), X32.reshape(50, -1))
    g = SteerableWiener().fit(X32)
    assert g.transform(X32).dtype == np.float32 and not g.is_identity


def test_outside_the_disk_is_zero():
    _, X = _bars(60, 16, seed=0, noise=0.3)
    inside, *_ = fourier_bessel_basis(16, 16)
    Z = SteerableWiener().fit_transform(X)
    assert np.all(Z[:, ~inside] == 0)


def test_bad_input_names_the_argument():
    _, X = _bars(30, 16, seed=0, noise=0.3)
    with pytest.raises(ValueError, match="image_shape: SteerableWiener filters single-channel"):
        SteerableWiener(image_shape=(2, 16, 8)).fit(X.reshape(30, -1))
    with pytest.raises(ValueError, match="image_shape: images of 1 x 10 pixels have no"):
        SteerableWiener().fit(np.ones((5, 10)))
    with pytest.raises(ValueError, match="radius"):
        SteerableWiener(radius=-1.0).fit(X)
    with pytest.raises(ValueError, match="radius: a disk of radius 256 px needs"):
        fourier_bessel_basis(512, 512)
    with pytest.raises(ValueError, match="rotation_center"):
        SteerableWiener(rotation_center="middle").fit(X)
    f = SteerableWiener().fit(X)
    with pytest.raises(ValueError, match="expecting 256 features"):
        f.transform(np.ones((2, 1, 15, 15)))
    with pytest.raises(ValueError, match="225 features"):
        f.transform(np.ones((2, 225)))


# -------------------------------------------------------------------- steerable_class_averages
def _distinct(n, size, seed):
    """Smooth random images, no two alike (no image has a neighbour that shows the same)."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(seed)
    return np.stack([gaussian_filter(rng.standard_normal((size, size)), 2.0) * 4
                     for _ in range(n)])


def _pipelines(X, sigma, k, **kw):
    """The two estimates steerable_class_averages blends, computed independently: the image
    filtered alone, and the plain mean of it and its k neighbours filtered at sigma / sqrt(k+1)."""
    from invariant_cluster import class_averages

    single = SteerableWiener(noise_std=sigma).fit_transform(X).reshape(X.shape)
    avg = class_averages(X, n_neighbors=k, rotation_center="fourier", **kw)
    means = SteerableWiener(noise_std=sigma / math.sqrt(k + 1)).fit_transform(avg)
    return single, means.reshape(X.shape)


def _error(Z, clean):
    return float(np.linalg.norm((Z - clean).reshape(len(Z), -1)))


def test_steerable_class_averages_leans_on_the_averages_when_neighbours_are_copies():
    from invariant_cluster.steerable import steerable_class_averages

    clean, X = _bars(150, 16, seed=7, noise=0.5)
    kw = dict(n_rotations=36, refine=False, device="cpu")
    out, info = steerable_class_averages(X, n_neighbors=6, noise_std=0.5, return_choice=True,
                                         **kw)
    w = info["weight_single"]
    assert 0 <= w < 0.5 and info["risk"]["blend"] <= min(info["risk"]["averages"],
                                                         info["risk"]["single"])
    single, means = _pipelines(X, 0.5, 6, **kw)
    np.testing.assert_allclose(out, w * single + (1 - w) * means, atol=1e-5)
    assert _error(out, clean) < 0.9 * _error(single, clean)


def test_steerable_class_averages_leans_on_the_image_alone_without_neighbours():
    from invariant_cluster.steerable import steerable_class_averages

    rng = np.random.default_rng(1)
    clean = _distinct(150, 16, seed=2)
    X = clean + 2.0 * rng.standard_normal(clean.shape)
    kw = dict(n_rotations=8, refine=False, device="cpu")
    out, info = steerable_class_averages(X, n_neighbors=6, return_choice=True, **kw)
    w = info["weight_single"]
    assert 0.5 < w <= 1 and abs(info["noise_std"] - 2.0) < 0.2
    single, means = _pipelines(X, info["noise_std"], 6, **kw)
    np.testing.assert_allclose(out, w * single + (1 - w) * means, atol=1e-5)
    assert _error(out, clean) < 0.97 * _error(means, clean)


def test_steerable_class_averages_without_noise_is_the_identity():
    # no noise given: the filter is the identity and the image alone has no error (weight 1,
    # and the averages are not computed on X)
    from invariant_cluster.steerable import steerable_class_averages

    _, X = _bars(60, 16, seed=3, noise=0.05)
    out, info = steerable_class_averages(X, n_neighbors=5, noise_std=0.0, return_choice=True,
                                         n_rotations=36, refine=False, device="cpu")
    assert info["weight_single"] == 1 and info["choice"] == "single"
    assert info["risk"]["single"] == 0
    np.testing.assert_array_equal(out, X.reshape(out.shape))


def test_steerable_class_averages_bad_input():
    from invariant_cluster.steerable import steerable_class_averages

    _, X = _bars(20, 16, seed=0, noise=0.3)
    with pytest.raises(TypeError, match="ctf"):
        steerable_class_averages(X, ctf=None)
    with pytest.raises(ValueError, match="n_neighbors"):
        steerable_class_averages(X, n_neighbors=20)
    with pytest.raises(ValueError, match="X: flat rows must be square"):
        steerable_class_averages(np.ones((20, 10)))
    with pytest.raises(ValueError, match="noise_std"):
        steerable_class_averages(X, noise_std=-1.0)
