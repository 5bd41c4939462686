"""Tests of InvariantAttentionClusterer: estimator checks, the paper's Figure 2, references, API."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import torch
from _images import digit_images
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score
from sklearn.utils.estimator_checks import parametrize_with_checks

from invariant_cluster import (
    InvariantAttentionClusterer,
    invariant_attention_clustering,
    invariant_distances,
    warp_se2,
)
from invariant_cluster.datasets import make_transformed_copies
from invariant_cluster.search.descriptors import centred_images

pytestmark = pytest.mark.usefixtures("torch_single_thread")

# Every scikit-learn check passes (scikit-learn 1.9, kornia 0.9, torch 2.13, umap-learn 0.5, on
# the CPU), with and without n_clusters, for both updates, both graphs and with translations:
# nothing is expected to fail.
EXPECTED_FAILED_CHECKS: dict[str, str] = {}


@parametrize_with_checks(
    [
        InvariantAttentionClusterer(n_rotations=4, device="cpu"),
        InvariantAttentionClusterer(n_clusters=2, n_rotations=4, max_translation=1,
                                    update="blurring", graph="means", device="cpu"),
        InvariantAttentionClusterer(n_rotations=4, device="cpu", rotation_center="fourier"),
    ],
    expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS,
)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # random data, few samples
        check(estimator)


# ----------------------------------------------------------------------------- data
DIGITS = (0, 1, 2, 4)
N_COPIES = 6


def _digit_images(digits=DIGITS) -> np.ndarray:
    """One scikit-learn digit per class, upsampled 8 -> 12 px (bilinear) and padded to 16 x 16."""
    return digit_images(digits)


@pytest.fixture(scope="module")
def figure2():
    """The paper's Figure 2 as data: 6 SE(2) copies of each of 4 different digits.

    Angles uniform over the full circle, shifts uniform in +-1 px; float32 ``(24, 16, 16)``
    and the group of each copy. The SE(2)-invariant distance separates the groups (largest
    within-group distance about 2.5, smallest between-group distance about 5).
    """
    X, y = [], []
    for c, img in enumerate(_digit_images()):
        copies, _ = make_transformed_copies(img, N_COPIES, max_rotation=180.0, max_translation=1,
                                            random_state=100 + c)
        X.append(copies)
        y += [c] * N_COPIES
    return np.concatenate(X).astype(np.float32), np.array(y)


# every other parameter at its default: no n_neighbors tuned to the group size
FIG2_PARAMS = dict(max_translation=1, random_state=0, device="cpu")


@pytest.fixture(scope="module")
def fitted(figure2):
    """One fit on the Figure 2 data, shared by the API tests below."""
    X, _ = figure2
    est = InvariantAttentionClusterer(n_clusters=len(DIGITS), **FIG2_PARAMS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X)
    return est


def _fit(X, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return InvariantAttentionClusterer(**params).fit(X)


# ----------------------------------------------------------------------------- Figure 2
class TestFigure2:
    def test_invariant_attention_recovers_the_groups(self, figure2, fitted):
        _, y = figure2
        assert fitted.n_clusters_ == len(DIGITS)
        assert adjusted_rand_score(y, fitted.labels_) == 1.0
        assert sorted(np.bincount(fitted.labels_)) == [N_COPIES] * len(DIGITS)

    def test_plain_kernel_attention_does_not(self, figure2, fitted):
        X, y = figure2
        plain = _fit(X, n_clusters=len(DIGITS), group="none", **FIG2_PARAMS)
        ari_plain = adjusted_rand_score(y, plain.labels_)
        assert ari_plain < 0.8
        assert adjusted_rand_score(y, fitted.labels_) - ari_plain > 0.2

    def test_recovers_the_groups_without_n_clusters(self, figure2):
        X, y = figure2
        est = _fit(X, **FIG2_PARAMS)
        assert est.n_clusters_ == len(DIGITS)
        assert adjusted_rand_score(y, est.labels_) == 1.0

    def test_blurring_update_recovers_the_groups(self, figure2):
        X, y = figure2
        est = _fit(X, n_clusters=len(DIGITS), update="blurring", **FIG2_PARAMS)
        assert adjusted_rand_score(y, est.labels_) == 1.0

    def test_means_graph_recovers_the_groups(self, figure2):
        X, y = figure2
        est = _fit(X, n_clusters=len(DIGITS), graph="means", **FIG2_PARAMS)
        assert adjusted_rand_score(y, est.labels_) == 1.0

    def test_predict_on_training_data(self, figure2, fitted):
        X, _ = figure2
        np.testing.assert_array_equal(fitted.predict(X), fitted.labels_)

    def test_predict_new_copies(self, fitted):
        # fresh transformed copies of the same digits go to the clusters of their digit
        imgs = _digit_images()
        new, y_new = [], []
        for c, img in enumerate(imgs):
            copies, _ = make_transformed_copies(img, 3, max_rotation=180.0, max_translation=1,
                                                random_state=500 + c)
            new.append(copies)
            y_new += [c] * 3
        pred = fitted.predict(np.concatenate(new).astype(np.float32))
        assert adjusted_rand_score(y_new, pred) == 1.0

    def test_alignments_warp_each_sample_onto_its_centre(self, figure2, fitted):
        X, _ = figure2
        centres = fitted.cluster_centers_.reshape(-1, 16, 16)[fitted.labels_].astype(np.float64)
        Xd = X.astype(np.float64)
        aligned = warp_se2(Xd, fitted.alignments_)
        d_aligned = ((aligned - centres) ** 2).reshape(len(X), -1).sum(1)
        d_plain = ((Xd - centres) ** 2).reshape(len(X), -1).sum(1)
        assert fitted.alignments_.shape == (len(X), 3)
        assert d_aligned.mean() < 0.25 * d_plain.mean()
        assert np.all(d_aligned < 0.5 * (Xd ** 2).reshape(len(X), -1).sum(1))
        # the alignment is (nearly) the best one: min_tau ||c - T_tau x||^2 on a finer search,
        # and transform() minimises the same quantity (x warped onto the centre; the centre
        # warped onto x by the inverse alignment is 2-17 times as far at 16 x 16, interpolation)
        d_transform = fitted.transform(X)[np.arange(len(X)), fitted.labels_]
        C = fitted.cluster_centers_.reshape(-1, 16, 16).astype(np.float64)
        d_best = invariant_distances(C, Xd, n_rotations=72, max_translation=1)
        d_best = d_best[fitted.labels_, np.arange(len(X))]
        assert np.all(d_aligned <= 1.5 * d_best + 0.01 * d_best.max())
        # transform measures the images as the fit saw them: centred on their centres of mass
        # where the fit centred them (center="auto" on these shapes on an empty background)
        assert fitted.center_ is True
        Xc = centred_images(X.reshape(len(X), -1), (1, 16, 16))[0].reshape(X.shape)
        d_seen = invariant_distances(C, Xc.astype(np.float64), n_rotations=72, max_translation=1)
        d_seen = d_seen[fitted.labels_, np.arange(len(X))]
        assert 0.5 < np.median(d_transform / d_seen) < 1.5

    def test_centres_are_invariant_means_of_their_members(self, figure2, fitted):
        # fixed point: each centre is the average of its members aligned onto it
        X, _ = figure2
        aligned = warp_se2(X.astype(np.float64), fitted.alignments_).reshape(len(X), -1)
        for c in range(fitted.n_clusters_):
            avg = aligned[fitted.labels_ == c].mean(0)
            centre = fitted.cluster_centers_[c]
            assert np.linalg.norm(avg - centre) < 0.05 * np.linalg.norm(centre)


# ------------------------------------------------------- Figure 2 at the defaults, many shapes
def _figure2_set(n_groups, n_copies):
    """``n_groups`` digits, ``n_copies`` SE(2) copies each: full circle, +-2 px shifts."""
    X, y = [], []
    for c, img in enumerate(_digit_images(range(n_groups))):
        copies, _ = make_transformed_copies(img, n_copies, max_rotation=180.0, max_translation=2,
                                            random_state=300 + 7 * c + n_copies)
        X.append(copies)
        y += [c] * n_copies
    return np.concatenate(X).astype(np.float32), np.array(y)


@pytest.mark.parametrize("n_groups, n_copies", [(5, 3), (5, 6), (4, 20), (10, 20), (3, 60)])
@pytest.mark.parametrize("with_k", [False, True], ids=["n_clusters=None", "n_clusters=k"])
def test_figure2_sets_at_default_parameters(n_groups, n_copies, with_k):
    # only the transformation range follows the data; n_neighbors, bandwidth, max_iter, tol:
    # defaults. The fit must report convergence (no ConvergenceWarning).
    X, y = _figure2_set(n_groups, n_copies)
    est = InvariantAttentionClusterer(n_clusters=n_groups if with_k else None,
                                      max_translation=2, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est.fit(X)
    assert est.n_clusters_ == n_groups
    assert adjusted_rand_score(y, est.labels_) == 1.0
    assert est.n_iter_ < est.max_iter and est.history_[-1] < est.tol


def test_blurring_stops_before_two_separated_clusters_merge():
    # Gaussian blurring mean shift with a global bandwidth merges two clusters 3 bandwidths
    # apart if it runs long enough (checked in NumPy below); the stopping rule (the partition
    # into modes unchanged for 3 iterations) must stop while they are two.
    rng = np.random.default_rng(12)
    bw = 1.0
    A = 0.3 * rng.standard_normal((8, 4))
    B = 0.3 * rng.standard_normal((8, 4)) + np.array([3.0, 0, 0, 0])
    X = np.concatenate([A, B])
    M = X.copy()
    for _ in range(3000):
        M = _softmax_rows(-_sqdist(M, M) / (2 * bw ** 2)) @ M
    assert np.ptp(M, axis=0).max() < 1e-2  # the reference merged everything
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        # noise_std=0: the 4 features fold into 2 x 2 "images", whose measured noise would
        # make nearby points one shape
        est = InvariantAttentionClusterer(group="none", bandwidth=bw, update="blurring",
                                          max_iter=3000, tol=0.0, device="cpu",
                                          noise_std=0).fit(X)
    assert est.n_iter_ < 3000
    Mo = est.invariant_means_
    within = max(np.ptp(Mo[:8], axis=0).max(), np.ptp(Mo[8:], axis=0).max())
    between = np.linalg.norm(Mo[:8].mean(0) - Mo[8:].mean(0))
    assert within < 0.1 * between and between > 1.0


def test_random_state_seeds_the_grouping():
    # umap-learn's layout and k-means' starts follow random_state: the same seed gives the same
    # labels, other seeds give other partitions of structureless data; Leiden's runs are drawn
    # from it too (the same seed, the same labels)
    X = np.random.default_rng(13).random((60, 8, 8)).astype(np.float32)
    kw = dict(n_clusters=4, group="rotation", n_rotations=4, device="cpu")
    a = _fit(X, random_state=0, grouping="umap", **kw).labels_
    np.testing.assert_array_equal(a, _fit(X, random_state=0, grouping="umap", **kw).labels_)
    others = [_fit(X, random_state=s, grouping="umap", **kw).labels_ for s in (1, 2, 3)]
    assert min(adjusted_rand_score(a, o) for o in others) < 1.0
    b = _fit(X, random_state=7, **kw).labels_
    np.testing.assert_array_equal(b, _fit(X, random_state=7, **kw).labels_)


def test_n_jobs_limits_threads_and_restores_them():
    X = np.random.default_rng(14).random((20, 8, 8)).astype(np.float32)
    before = torch.get_num_threads()
    a = _fit(X, n_clusters=2, group="rotation", n_rotations=4, n_jobs=1, random_state=0,
             device="cpu")
    assert torch.get_num_threads() == before
    b = _fit(X, n_clusters=2, group="rotation", n_rotations=4, random_state=0, device="cpu")
    np.testing.assert_array_equal(a.labels_, b.labels_)


# ----------------------------------------------------------------------------- references
def _softmax_rows(a):
    a = a - a.max(1, keepdims=True)
    e = np.exp(a)
    return e / e.sum(1, keepdims=True)


def _sqdist(A, B):
    return ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)


class TestPlainKernelAttentionReference:
    """group="none" with a global bandwidth is Gaussian mean shift; checked against NumPy.

    The references work on the pixels as given, so the filter is off (``noise_std=0``):
    random pixels measure as noise, and the default would damp them first."""

    @pytest.mark.parametrize("n_iter", [1, 3])
    def test_blurring_mean_shift(self, n_iter):
        X = np.random.default_rng(0).random((10, 9))
        bw = 0.6
        M = X.copy()
        for _ in range(n_iter):
            M = _softmax_rows(-_sqdist(M, M) / (2 * bw ** 2)) @ M
        est = _fit(X, noise_std=0, group="none", bandwidth=bw, n_neighbors=9, max_iter=n_iter,
                   tol=0.0, update="blurring", device="cpu")
        assert est.n_iter_ == n_iter
        np.testing.assert_allclose(est.invariant_means_, M, atol=1e-6)
        np.testing.assert_allclose(est.bandwidth_, bw, rtol=1e-6)

    @pytest.mark.parametrize("n_iter", [1, 3, 25])
    def test_fixed_mean_shift(self, n_iter):
        X = np.random.default_rng(1).random((10, 9))
        bw = 0.6
        M = X.copy()
        for _ in range(n_iter):
            M = _softmax_rows(-_sqdist(M, X) / (2 * bw ** 2)) @ X
        est = _fit(X, noise_std=0, group="none", bandwidth=bw, n_neighbors=9, max_iter=n_iter,
                   tol=0.0, update="fixed", device="cpu")
        assert est.n_iter_ == n_iter
        np.testing.assert_allclose(est.invariant_means_, M, atol=1e-6)

    @pytest.mark.parametrize("with_counts", [False, True])
    def test_fixed_mean_shift_of_aligned_keys_matches_float64_vectors(self, with_counts):
        # the iteration runs on each row's coefficients and its keys' Gram matrix; the
        # reference moves the mean itself, in float64, over keys warped by kornia
        from invariant_cluster._iteration import mean_shift
        from invariant_cluster.transforms import warp_se2

        g = torch.Generator().manual_seed(4)
        n, k, steps = 30, 6, 12
        X = torch.rand(n, 1, 12, 12, generator=g)
        idx = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(n)])
        P = torch.cat([torch.rand(n, k, 1, generator=g) * 60 - 30,
                       torch.rand(n, k, 2, generator=g) * 2 - 1], 2)
        rho = 1.0 + 0.5 * torch.rand(n, generator=g)
        sigma = 0.3 + 0.5 * torch.rand(n, generator=g)
        counts = torch.randint(1, 4, (n,), generator=g).float() if with_counts else None
        M, W, history, _ = mean_shift(X, idx, P, rho, sigma, "auto", max_iter=steps, tol=0.0,
                                      counts=counts)
        assert len(history) == steps
        X64 = X.double()
        for i in range(n):
            keys = torch.cat([X64[i:i + 1], warp_se2(X64[idx[i]], P[i].double())]).reshape(
                k + 1, -1)
            logc = (torch.zeros(k + 1, dtype=torch.float64) if counts is None else
                    torch.log(counts[torch.cat([torch.tensor([i]), idx[i]])].double()))
            m = keys[0]
            for _ in range(steps):
                d = torch.linalg.vector_norm(m - keys, dim=1)
                w = torch.softmax(-(d - rho[i]).clamp(min=0) / sigma[i] + logc, 0)
                m = w @ keys
            d = torch.linalg.vector_norm(m - keys, dim=1)
            w = torch.softmax(-(d - rho[i]).clamp(min=0) / sigma[i] + logc, 0)
            np.testing.assert_allclose(M[i].reshape(-1).numpy(), m.numpy(), atol=1e-5)
            # the weights carry the float32 error of the mean's distances divided by sigma
            # (0.3 to 0.8): 2.4e-5 on a 16-core machine
            np.testing.assert_allclose(W[i].numpy(), w.numpy(), atol=1e-4)

    def test_fixed_mean_shift_ascends_the_density(self):
        # mean shift with fixed keys is a monotone ascent of the kernel density
        X = np.random.default_rng(11).random((12, 5))
        bw = 0.4
        dens = []
        for n_iter in (1, 2, 4, 8, 16):
            est = _fit(X, noise_std=0, group="none", bandwidth=bw, n_neighbors=11,
                       max_iter=n_iter, tol=0.0, device="cpu")
            d = np.exp(-_sqdist(est.invariant_means_, X) / (2 * bw ** 2)).sum(1)
            dens.append(d)
        assert np.all(np.diff(np.array(dens), axis=0) >= -1e-9)

    @pytest.mark.parametrize("n, n_neighbors", [(8, 3), (30, 5), (30, 15), (12, 40)])
    def test_auto_bandwidth_calibration(self, n, n_neighbors):
        # docstring: rho_i = distance to the nearest other sample, sigma_i solves
        # sum_j exp(-max(d_ij - rho_i, 0) / sigma_i) = log2(k + 1) over the k nearest, capped at
        # 0.25 rho_i. Reference: scipy's brentq in float64.
        from scipy.optimize import brentq

        X = np.random.default_rng(2).random((n, 25))
        est = _fit(X, noise_std=0, group="none", n_neighbors=n_neighbors, max_iter=1, device="cpu")
        k = min(n_neighbors, n - 1)
        d = np.sqrt(np.sort(_sqdist(X, X), axis=1)[:, 1:k + 1])
        rho = d[:, 0]
        sigma = np.array([brentq(lambda s, e=d[i] - rho[i]: np.exp(-e / s).sum()
                                 - np.log2(k + 1), 1e-9, 1e3) for i in range(n)])
        sigma = np.minimum(sigma, 0.25 * rho)
        np.testing.assert_allclose(est.rho_, rho, rtol=1e-5)
        np.testing.assert_allclose(est.bandwidth_, sigma, rtol=1e-4)

    def test_attention_weights_and_neighbours(self):
        X = np.random.default_rng(3).random((8, 16))
        est = _fit(X, noise_std=0, group="none", n_neighbors=4, max_iter=1, device="cpu")
        assert est.neighbors_.shape == (8, 5) and est.attention_weights_.shape == (8, 5)
        np.testing.assert_array_equal(est.neighbors_[:, 0], np.arange(8))  # itself first
        d = np.sqrt(_sqdist(X, X))
        np.testing.assert_array_equal(est.neighbors_[:, 1:], np.argsort(d, 1)[:, 1:5])
        np.testing.assert_allclose(est.attention_weights_.sum(1), 1.0, atol=1e-9)
        assert np.all(est.attention_weights_ >= 0)

    def test_none_equals_no_transformations(self, figure2):
        X, _ = figure2
        a = _fit(X, n_clusters=3, group="none", n_neighbors=6, random_state=0, device="cpu")
        b = _fit(X, n_clusters=3, group="se2", max_rotation=0.0, max_translation=0,
                 n_neighbors=6, random_state=0, device="cpu")
        np.testing.assert_array_equal(a.labels_, b.labels_)
        np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, atol=1e-6)
        np.testing.assert_array_equal(a.alignments_, 0.0)
        np.testing.assert_array_equal(b.alignments_, 0.0)

    def test_none_transform_is_squared_euclidean(self, figure2):
        X, _ = figure2
        X2 = X.reshape(len(X), -1).astype(np.float64)
        est = _fit(X2, n_clusters=3, group="none", n_neighbors=6, device="cpu")
        # between the images as the fit saw them (filtered at the default noise_std) and the
        # centres
        Xf = est.filter_.transform(X2).astype(np.float64)
        np.testing.assert_allclose(est.transform(X2), _sqdist(Xf, est.cluster_centers_),
                                   rtol=1e-6, atol=1e-9)


# ----------------------------------------------------------------------------- API
class TestAPI:
    def test_fitted_attributes(self, figure2, fitted):
        X, _ = figure2
        n = len(X)
        assert fitted.labels_.shape == (n,)
        assert set(fitted.labels_) == set(range(fitted.n_clusters_))
        assert fitted.cluster_centers_.shape == (fitted.n_clusters_, 256)
        assert fitted.invariant_means_.shape == (n, 256)
        assert fitted.alignments_.shape == (n, 3)
        assert fitted.bandwidth_.shape == (n,) and np.all(fitted.bandwidth_ > 0)
        assert fitted.n_features_in_ == 256
        assert tuple(fitted.image_shape_) == (1, 16, 16)
        assert 1 <= fitted.n_iter_ <= fitted.max_iter
        assert len(fitted.history_) == fitted.n_iter_
        for arr in (fitted.labels_, fitted.cluster_centers_, fitted.invariant_means_,
                    fitted.alignments_, fitted.bandwidth_):
            assert isinstance(arr, np.ndarray)

    def test_transform(self, figure2, fitted):
        X, _ = figure2
        D = fitted.transform(X)
        assert D.shape == (len(X), fitted.n_clusters_)
        assert np.all(D >= 0)
        np.testing.assert_array_equal(np.argmin(D, 1), fitted.predict(X))
        assert D.dtype == np.float32

    def test_same_random_state_same_result(self, figure2, fitted):
        X, _ = figure2
        other = _fit(X, n_clusters=len(DIGITS), **FIG2_PARAMS)
        np.testing.assert_array_equal(other.labels_, fitted.labels_)
        np.testing.assert_allclose(other.cluster_centers_, fitted.cluster_centers_, atol=1e-6)

    def test_fit_predict_equals_labels(self, figure2, fitted):
        X, _ = figure2
        est = InvariantAttentionClusterer(n_clusters=len(DIGITS), **FIG2_PARAMS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            labels = est.fit_predict(X)
        np.testing.assert_array_equal(labels, est.labels_)
        np.testing.assert_array_equal(labels, fitted.labels_)

    def test_function_twin(self, figure2, fitted):
        X, _ = figure2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            centres, labels = invariant_attention_clustering(X, len(DIGITS), **FIG2_PARAMS)
        np.testing.assert_array_equal(labels, fitted.labels_)
        np.testing.assert_allclose(centres, fitted.cluster_centers_, atol=1e-6)

    def test_pickle(self, figure2, fitted):
        X, _ = figure2
        restored = pickle.loads(pickle.dumps(fitted))
        np.testing.assert_array_equal(restored.predict(X), fitted.predict(X))
        np.testing.assert_allclose(restored.transform(X), fitted.transform(X), atol=1e-6)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_dtype_preserved(self, dtype):
        X = np.random.default_rng(4).random((8, 6, 6)).astype(dtype)
        est = _fit(X, n_rotations=4, n_neighbors=3, max_iter=3, device="cpu")
        assert est.cluster_centers_.dtype == dtype
        assert est.invariant_means_.dtype == dtype
        assert est.transform(X).dtype == dtype

    @pytest.mark.parametrize("dtype", [np.uint8, np.int64])
    def test_integer_input_becomes_float32(self, dtype):
        X = (np.random.default_rng(5).random((8, 36)) * 5).astype(dtype)
        est = _fit(X, n_rotations=4, n_neighbors=3, max_iter=3, device="cpu")
        assert est.labels_.shape == (8,)
        assert est.cluster_centers_.dtype == np.float32
        assert est.transform(X).dtype == np.float32

    def test_image_inputs_equal_flat_input(self, figure2):
        X, _ = figure2
        X = X[::2]  # 12 samples, 3 copies of each digit
        params = dict(n_clusters=4, n_neighbors=3, n_rotations=12, max_translation=1,
                      random_state=0, device="cpu")
        flat = _fit(X.reshape(len(X), -1), image_shape=(16, 16), **params)
        three = _fit(X, **params)
        four = _fit(X[:, None], **params)
        flat_default = _fit(X.reshape(len(X), -1), **params)  # 256 = 16 x 16, square
        for other in (three, four, flat_default):
            np.testing.assert_array_equal(other.labels_, flat.labels_)
            np.testing.assert_allclose(other.cluster_centers_, flat.cluster_centers_, atol=1e-6)
            np.testing.assert_allclose(other.alignments_, flat.alignments_, atol=1e-6)
        # predict accepts every layout too
        np.testing.assert_array_equal(three.predict(X), flat.predict(X.reshape(len(X), -1)))
        np.testing.assert_array_equal(four.predict(X[:, None]), three.predict(X))

    def test_non_square_and_multichannel_image_shape(self):
        rng = np.random.default_rng(6)
        X = rng.random((8, 2, 5, 7))
        a = _fit(X, n_rotations=4, n_neighbors=3, max_iter=3, random_state=0, device="cpu")
        b = _fit(X.reshape(8, -1), image_shape=(2, 5, 7), n_rotations=4, n_neighbors=3,
                 max_iter=3, random_state=0, device="cpu")
        assert tuple(a.image_shape_) == (2, 5, 7) and tuple(b.image_shape_) == (2, 5, 7)
        np.testing.assert_array_equal(a.labels_, b.labels_)
        np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, atol=1e-6)

    def test_convergence_warning(self, figure2):
        X, _ = figure2
        with pytest.warns(ConvergenceWarning, match="max_iter"):
            InvariantAttentionClusterer(max_iter=1, tol=0.0, **FIG2_PARAMS).fit(X)

    def test_no_warning_when_converged(self):
        # two tight, far apart groups converge in a few iterations
        rng = np.random.default_rng(7)
        X = np.concatenate([np.zeros((5, 16)), np.ones((5, 16))]) + 1e-3 * rng.random((10, 16))
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            est = InvariantAttentionClusterer(group="none", n_neighbors=5, max_iter=100,
                                              device="cpu").fit(X)
        assert est.n_iter_ < 100
        assert adjusted_rand_score([0] * 5 + [1] * 5, est.labels_) == 1.0

    def test_update_blurring(self, figure2):
        X, _ = figure2
        est = _fit(X[::3], n_clusters=2, update="blurring", n_neighbors=4, n_rotations=8,
                   max_iter=5, device="cpu")
        assert est.labels_.shape == (8,) and est.n_clusters_ == 2
        assert est.cluster_centers_.shape == (2, 256)

    def test_read_only_input(self, figure2):
        X, _ = figure2
        X = X[::3].copy()
        X.setflags(write=False)
        # torch warns about non-writable arrays once per process: make it warn every time
        warn_always = torch.is_warn_always_enabled()
        torch.set_warn_always(True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)
                warnings.simplefilter("ignore", ConvergenceWarning)
                est = InvariantAttentionClusterer(n_neighbors=3, n_rotations=4, max_iter=2,
                                                  device="cpu").fit(X)
                est.predict(X)
        finally:
            torch.set_warn_always(warn_always)

    def test_torch_input(self, figure2, fitted):
        X, _ = figure2
        np.testing.assert_array_equal(fitted.predict(torch.as_tensor(X)), fitted.predict(X))

    def test_input_not_modified(self, figure2):
        X, _ = figure2
        X = X[::3].copy()
        X0 = X.copy()
        _fit(X, n_neighbors=3, n_rotations=4, max_iter=2, device="cpu")
        np.testing.assert_array_equal(X, X0)

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_cuda_matches_cpu(self, figure2, fitted):
        X, _ = figure2
        gpu = _fit(X, n_clusters=len(DIGITS), **{**FIG2_PARAMS, "device": "cuda"})
        assert isinstance(gpu.cluster_centers_, np.ndarray)
        assert adjusted_rand_score(gpu.labels_, fitted.labels_) == 1.0


# ----------------------------------------------------------------------------- bad input
class TestErrors:
    def setup_method(self):
        self.X = np.random.default_rng(8).random((6, 64))

    @pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
    def test_non_finite(self, bad):
        X = self.X.copy()
        X[2, 5] = bad
        with pytest.raises(ValueError, match="X"):
            InvariantAttentionClusterer(n_rotations=4).fit(X)
        with pytest.raises(ValueError, match="X"):
            InvariantAttentionClusterer(n_rotations=4).fit(X.reshape(6, 8, 8))

    def test_non_finite_in_predict(self, fitted):
        X = np.zeros((2, 256), dtype=np.float32)
        X[0, 0] = np.nan
        with pytest.raises(ValueError, match="X"):
            fitted.predict(X)

    @pytest.mark.parametrize("shape", [(0, 64), (0, 8, 8), (6, 0)])
    def test_empty(self, shape):
        with pytest.raises(ValueError, match="0 sample|0 feature|empty"):
            InvariantAttentionClusterer(n_rotations=4).fit(np.zeros(shape))

    def test_one_sample(self):
        with pytest.raises(ValueError, match="1 sample"):
            InvariantAttentionClusterer(n_rotations=4).fit(self.X[:1])

    @pytest.mark.parametrize("image_shape", [(7, 7), (2, 8, 8), (8, 0), (65,)])
    def test_wrong_image_shape(self, image_shape):
        with pytest.raises(ValueError, match="image_shape"):
            InvariantAttentionClusterer(n_rotations=4, image_shape=image_shape).fit(self.X)

    def test_image_shape_of_wrong_type(self):
        with pytest.raises((TypeError, ValueError), match="image_shape"):
            InvariantAttentionClusterer(n_rotations=4, image_shape=64).fit(self.X)

    def test_image_shape_disagrees_with_3d_input(self):
        with pytest.raises(ValueError, match="image_shape"):
            InvariantAttentionClusterer(n_rotations=4, image_shape=(7, 7)).fit(
                self.X.reshape(6, 8, 8))

    def test_predict_wrong_number_of_features(self, fitted):
        with pytest.raises(ValueError, match="features"):
            fitted.predict(np.zeros((3, 255), dtype=np.float32))
        with pytest.raises(ValueError, match="features"):
            fitted.transform(np.zeros((3, 15, 15), dtype=np.float32))

    def test_predict_images_of_another_shape(self, fitted):
        # 8 x 32 images have 256 pixels, like the 16 x 16 training images, but are not the same
        with pytest.raises(ValueError, match="shape"):
            fitted.predict(np.zeros((3, 8, 32), dtype=np.float32))

    def test_predict_before_fit(self):
        from sklearn.exceptions import NotFittedError

        with pytest.raises(NotFittedError):
            InvariantAttentionClusterer().predict(self.X)

    def test_complex(self):
        with pytest.raises((TypeError, ValueError), match="[Cc]omplex"):
            InvariantAttentionClusterer(n_rotations=4).fit(self.X.astype(complex))
        with pytest.raises((TypeError, ValueError), match="[Cc]omplex"):
            InvariantAttentionClusterer(n_rotations=4).fit(self.X.reshape(6, 8, 8) + 0j)

    def test_object_dtype_of_strings(self):
        X = np.full((6, 64), "a", dtype=object)
        with pytest.raises((TypeError, ValueError), match="string|float|X"):
            InvariantAttentionClusterer(n_rotations=4).fit(X)

    def test_object_dtype_of_numbers_3d(self):
        # scikit-learn accepts object arrays of numbers (check_dtype_object); so must 3-D input
        X = self.X.reshape(6, 8, 8).astype(object)
        ref = _fit(self.X.reshape(6, 8, 8), n_rotations=4, n_neighbors=3, max_iter=2,
                   random_state=0, device="cpu")
        est = _fit(X, n_rotations=4, n_neighbors=3, max_iter=2, random_state=0, device="cpu")
        np.testing.assert_array_equal(est.labels_, ref.labels_)

    @pytest.mark.parametrize("group", ["affine", "SE2", ""])
    def test_unknown_group(self, group):
        with pytest.raises(ValueError, match="group"):
            InvariantAttentionClusterer(group=group).fit(self.X)

    @pytest.mark.parametrize("param, value", [("update", "sometimes"), ("bandwidth", -1.0),
                                              ("bandwidth", "scott"), ("n_neighbors", 0),
                                              ("n_rotations", 0), ("max_rotation", -5.0),
                                              ("max_translation", -1), ("tol", -1.0),
                                              ("max_iter", -1), ("n_clusters", 0),
                                              ("graph", "pixels"), ("n_jobs", 1.5),
                                              ("n_jobs", 0)])
    def test_bad_parameters(self, param, value):
        with pytest.raises(ValueError, match=param):
            InvariantAttentionClusterer(**{param: value}).fit(self.X)

    def test_bad_device(self):
        with pytest.raises(ValueError, match="device"):
            InvariantAttentionClusterer(n_rotations=4, device="not-a-device").fit(self.X)

    def test_too_many_clusters(self):
        with pytest.raises(ValueError, match="n_clusters"):
            InvariantAttentionClusterer(n_clusters=7, n_rotations=4).fit(self.X)

    @pytest.mark.parametrize("shape", [(64,), (6, 1, 1, 8, 8)])
    def test_wrong_ndim(self, shape):
        with pytest.raises(ValueError):
            InvariantAttentionClusterer(n_rotations=4).fit(np.zeros(shape))


class TestNeighborSearch:
    """The shortlist search and the Dask path give the single-process exact answer."""

    def test_shortlist_of_every_key_is_exact(self, figure2):
        X, _ = figure2
        kw = dict(n_clusters=4, n_rotations=12, max_translation=1, random_state=0,
                  device="cpu")
        a = _fit(X, neighbor_search="exact", **kw)
        b = _fit(X, neighbor_search="shortlist", n_candidates=len(X), **kw)
        np.testing.assert_array_equal(a.labels_, b.labels_)
        np.testing.assert_allclose(a.invariant_means_, b.invariant_means_, atol=1e-5)

    def test_shortlist_recovers_the_groups(self, figure2):
        X, y = figure2
        # the default n_neighbors (15 of 23 others), a shortlist of 16 candidates
        est = _fit(X, n_clusters=4, n_rotations=12, max_translation=1,
                   neighbor_search="shortlist", n_candidates=16, random_state=0, device="cpu")
        assert adjusted_rand_score(y, est.labels_) == 1.0

    def test_dask_local_cluster_gives_the_same_labels(self, figure2):
        distributed = pytest.importorskip("distributed")
        X, _ = figure2
        kw = dict(n_clusters=4, n_rotations=12, max_translation=1, random_state=0,
                  device="cpu")
        ref = _fit(X, **kw)
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                      dashboard_address=":0") as cluster:
            with distributed.Client(cluster) as client:
                out = _fit(X, client=client, **kw)
        np.testing.assert_array_equal(ref.labels_, out.labels_)
        np.testing.assert_allclose(ref.invariant_means_, out.invariant_means_, atol=1e-5)


# ----------------------------------------------------------------------------- rotation centre
def _quarter_turn_about_fourier_centre(x):
    """``x`` (H, W even) turned by 90 degrees counter-clockwise about the pixel (W // 2, H // 2):
    ``np.rot90`` turns about the geometric centre, half a pixel away in each axis, and the
    roll by one row brings the pixel back (checked against a float64 warp below)."""
    return np.roll(np.rot90(x), 1, axis=0)


def _fourier_copies(n_shapes=3, size=16, seed=0):
    """The four exact quarter turns about (W // 2, H // 2) of ``n_shapes`` random float64
    shapes (content within 3 px of that pixel, so no turn or roll reaches the border)."""
    rng = np.random.default_rng(seed)
    c = size // 2
    X, y = [], []
    for s in range(n_shapes):
        x = np.zeros((size, size))
        x[c - 3:c + 4, c - 3:c + 4] = rng.random((7, 7)) * (rng.random((7, 7)) > 0.4)
        for _ in range(4):
            X.append(x)
            y.append(s)
            x = _quarter_turn_about_fourier_centre(x)
    return np.stack(X), np.array(y)


def test_quarter_turn_reference_is_the_fourier_warp():
    X, _ = _fourier_copies(n_shapes=1)
    ref = warp_se2(X[:3], np.tile([[90.0, 0.0, 0.0]], (3, 1)), rotation_center="fourier")
    np.testing.assert_allclose(X[1:4], ref, atol=1e-12)
    # about the geometric centre they are not the same images
    assert np.abs(X[1:4] - np.rot90(X[:3], axes=(1, 2))).max() > 0.1


def test_fourier_rotation_center_aligns_exact_quarter_turns():
    X, y = _fourier_copies()
    est = InvariantAttentionClusterer(group="rotation", n_rotations=4, rotation_center="fourier",
                                      noise_std=0, random_state=0, device="cpu").fit(X)
    assert adjusted_rand_score(y, est.labels_) == 1.0
    assert est.cluster_centers_.shape == (3, 16 * 16)
    assert est.invariant_means_.shape == (12, 16 * 16)
    # each image warped by its alignment about (W // 2, H // 2) is its centre, exactly
    aligned = warp_se2(X, est.alignments_, rotation_center="fourier").reshape(12, -1)
    np.testing.assert_allclose(aligned, est.cluster_centers_[est.labels_], atol=1e-10)
    assert est.transform(X).min(1).max() < 1e-10
    np.testing.assert_array_equal(est.predict(X), est.labels_)
    # about the geometric centre the copies are half a pixel off: none is an exact turn
    geo = InvariantAttentionClusterer(group="rotation", n_rotations=4, noise_std=0,
                                      random_state=0, device="cpu").fit(X)
    assert geo.rotation_center == "geometric"
    d = invariant_distances(X[::4], X, group="rotation", n_rotations=4, refine=False)
    assert np.sort(d, 1)[:, 1].min() > 0.1
    assert geo.n_shapes_ == 12  # no image is a copy of another under those turns


def test_fourier_rotation_center_with_centring_and_duplicates():
    X, y = _fourier_copies()
    X = np.concatenate([X, X[:2]])  # exact duplicates take their copy's results
    est = InvariantAttentionClusterer(group="se2", n_rotations=4, max_translation=1,
                                      center=True, rotation_center="fourier", noise_std=0,
                                      random_state=0, device="cpu").fit(X)
    assert adjusted_rand_score(np.r_[y, y[:2]], est.labels_) == 1.0
    np.testing.assert_array_equal(est.alignments_[-2:], est.alignments_[:2])
    aligned = warp_se2(X, est.alignments_, rotation_center="fourier").reshape(len(X), -1)
    np.testing.assert_allclose(aligned, est.cluster_centers_[est.labels_], atol=1e-6)


def test_fourier_is_geometric_on_odd_sizes():
    X, _ = _fourier_copies(size=16)
    X = X[:, :15, :15]  # the pixel (7, 7) is then the geometric centre too
    fits = [InvariantAttentionClusterer(group="rotation", n_rotations=4, rotation_center=rc,
                                        noise_std=0, random_state=0, device="cpu").fit(X)
            for rc in ("geometric", "fourier")]
    for name in ("labels_", "alignments_", "cluster_centers_", "invariant_means_"):
        np.testing.assert_array_equal(getattr(fits[0], name), getattr(fits[1], name))


@pytest.mark.parametrize("bad", ["centre", "Fourier", 1, None])
def test_rotation_center_is_checked(bad):
    X, _ = _fourier_copies(n_shapes=1)
    with pytest.raises(ValueError, match="rotation_center"):
        InvariantAttentionClusterer(rotation_center=bad, device="cpu").fit(X)
