"""Tests of invariant_mean: exact recovery from transformed copies, weights, types and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _images import random_images

from invariant_cluster import class_averages, invariant_distances, invariant_mean, warp_se2

pytestmark = pytest.mark.usefixtures("torch_single_thread")


_random = random_images


def _closest_copy(mean, copies):
    d = ((copies - mean[None]) ** 2).reshape(len(copies), -1).sum(1)
    return int(np.argmin(d)), float(d.min())


# ----------------------------------------------------------------------------- exact recovery
class TestRecovery:
    @pytest.mark.parametrize("refine", [False, True])
    def test_quarter_turn_copies(self, refine):
        img = _random((9, 9), seed=1)
        k = [0, 1, 2, 3, 1, 3]
        copies = np.stack([np.rot90(img, kk) for kk in k])
        mean, tau = invariant_mean(copies, n_rotations=4, refine=refine)
        assert mean.shape == (9, 9) and tau.shape == (6, 3)
        # the mean is the image itself, in the pose of one of the copies (the medoid)
        m, d = _closest_copy(mean, copies)
        assert d < 1e-8
        # every copy, warped by its alignment, lands on the mean
        np.testing.assert_allclose(warp_se2(copies, tau), np.repeat(mean[None], 6, 0),
                                   atol=1e-5)
        # and the alignments are quarter turns relative to the medoid's pose
        rel = (tau[:, 0] - 90.0 * (np.array(k[m]) - np.array(k)) + 180.0) % 360.0 - 180.0
        np.testing.assert_allclose(rel, 0.0, atol=1e-3)

    def test_quarter_turns_and_shifts(self):
        img = _random((12, 12), seed=2, border=3)
        params = np.array([[0, 0, 0], [90, 1, 0], [180, -1, 2], [-90, 2, -1], [90, 0, -2]],
                          dtype=np.float64)
        copies = warp_se2(np.repeat(img[None], 5, 0), params)
        mean, tau = invariant_mean(copies, n_rotations=4, max_translation=2)
        _, d = _closest_copy(mean, copies)
        assert d < 1e-8
        np.testing.assert_allclose(warp_se2(copies, tau), np.repeat(mean[None], 5, 0),
                                   atol=1e-5)

    def test_multichannel_copies(self):
        img = _random((2, 8, 8), seed=3)
        copies = np.stack([np.rot90(img, kk, axes=(1, 2)) for kk in (0, 1, 2, 3)])
        mean, tau = invariant_mean(copies, n_rotations=4, refine=False)
        assert mean.shape == (2, 8, 8)
        _, d = _closest_copy(mean, copies)
        assert d < 1e-8
        np.testing.assert_allclose(warp_se2(copies, tau), np.repeat(mean[None], 4, 0),
                                   atol=1e-5)

    def test_continuous_rotations_of_a_smooth_image(self, smooth_images):
        img = smooth_images(1, 24, seed=4)[0]
        angles = np.array([0.0, 37.0, -112.0, 71.5, 160.0, -23.0])
        copies = warp_se2(np.repeat(img[None], 6, 0), np.c_[angles, np.zeros((6, 2))])
        mean, tau = invariant_mean(copies, n_rotations=12)
        aligned = warp_se2(copies, tau)
        # each copy aligned onto the mean agrees with it up to interpolation
        res = ((aligned - mean[None]) ** 2).reshape(6, -1).sum(1)
        unaligned = ((copies - mean[None]) ** 2).reshape(6, -1).sum(1)
        assert np.all(res < 0.05 * (img ** 2).sum())
        assert res.sum() < 0.1 * unaligned.sum()
        # the mean is the image, in some copy's pose: its invariant distance to img is small
        d = invariant_distances(mean[None], img[None], n_rotations=36)[0, 0]
        assert d < 0.02 * (img ** 2).sum()
        # the alignments undo the rotations up to the medoid's own angle
        rel = (tau[:, 0] + angles + 180.0) % 360.0 - 180.0
        assert np.ptp(np.sort(rel)[1:-1]) < 2.0

    def test_fixed_point(self, smooth_images):
        # the returned mean is the weighted average of the samples aligned onto it
        X = smooth_images(5, 16, seed=5)
        w = np.array([0.1, 0.3, 0.2, 0.25, 0.15])
        mean, tau = invariant_mean(X, w, n_rotations=12, max_translation=1, max_iter=50,
                                   tol=1e-9)
        avg = (w[:, None, None] * warp_se2(X, tau)).sum(0)
        np.testing.assert_allclose(mean, avg, atol=1e-3 * np.abs(mean).max())

    def test_group_none_is_weighted_average(self):
        X = _random((4, 6, 6), seed=6)
        w = np.array([1.0, 2.0, 3.0, 4.0])
        mean, tau = invariant_mean(X, w, group="none")
        np.testing.assert_allclose(mean, np.average(X, axis=0, weights=w), atol=1e-10)
        np.testing.assert_array_equal(tau, 0.0)
        mean_eq, _ = invariant_mean(X, group="none")
        np.testing.assert_allclose(mean_eq, X.mean(0), atol=1e-10)


# ----------------------------------------------------------------------------- weights
class TestWeights:
    @pytest.mark.parametrize("k", [0, 2, 4])
    def test_one_hot_weights_return_that_sample(self, k):
        X = _random((5, 8, 8), seed=10)
        w = np.zeros(5)
        w[k] = 1.0
        mean, tau = invariant_mean(X, w, n_rotations=8, max_translation=1)
        np.testing.assert_allclose(mean, X[k], atol=1e-6)  # its pose and its content
        np.testing.assert_allclose(tau[k], 0.0, atol=1e-6)

    def test_one_hot_weight_on_a_transformed_copy(self):
        img = _random((9, 9), seed=11)
        copies = np.stack([np.rot90(img, kk) for kk in (0, 1, 2, 3)])
        w = np.array([0.0, 0.0, 1.0, 0.0])
        mean, _ = invariant_mean(copies, w, n_rotations=4)
        np.testing.assert_allclose(mean, copies[2], atol=1e-6)

    def test_weights_pull_the_mean(self):
        X = _random((2, 8, 8), seed=12)
        mean, _ = invariant_mean(X, [0.9, 0.1], group="none")
        d = ((X - mean[None]) ** 2).reshape(2, -1).sum(1)
        assert d[0] < d[1]
        mean_se2, _ = invariant_mean(X, [0.9, 0.1], n_rotations=4)
        d_inv = invariant_distances(mean_se2[None], X, n_rotations=4)[0]
        assert d_inv[0] < d_inv[1]

    def test_weights_are_normalised(self, smooth_images):
        X = smooth_images(4, 12, seed=13)
        w = np.array([1.0, 2.0, 0.5, 3.0])
        m1, t1 = invariant_mean(X, w, n_rotations=8)
        m2, t2 = invariant_mean(X, 7.0 * w, n_rotations=8)
        np.testing.assert_allclose(m1, m2, atol=1e-8)
        np.testing.assert_allclose(t1, t2, atol=1e-6)

    def test_none_means_equal_weights(self, smooth_images):
        X = smooth_images(4, 12, seed=14)
        m1, t1 = invariant_mean(X, n_rotations=8)
        m2, t2 = invariant_mean(X, np.ones(4), n_rotations=8)
        np.testing.assert_allclose(m1, m2, atol=1e-8)
        np.testing.assert_allclose(t1, t2, atol=1e-6)

    def test_torch_weights(self):
        X = _random((3, 6, 6), seed=15)
        m, _ = invariant_mean(X, torch.tensor([1.0, 0.0, 0.0]), group="none")
        np.testing.assert_allclose(m, X[0], atol=1e-10)


# ----------------------------------------------------------------------------- types
class TestTypes:
    def test_flat_input_gives_flat_mean(self):
        X = _random((4, 36), seed=20)
        mean, tau = invariant_mean(X, n_rotations=4)
        assert mean.shape == (36,) and tau.shape == (4, 3)
        mean_img, _ = invariant_mean(X.reshape(4, 6, 6), n_rotations=4)
        np.testing.assert_allclose(mean, mean_img.reshape(-1), atol=1e-10)

    def test_flat_input_with_image_shape(self):
        X = _random((3, 2, 4, 5), seed=21)
        mean, _ = invariant_mean(X.reshape(3, -1), image_shape=(2, 4, 5), group="none")
        assert mean.shape == (40,)
        np.testing.assert_allclose(mean, X.mean(0).reshape(-1), atol=1e-10)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_numpy_dtype(self, dtype):
        X = _random((3, 8, 8), seed=22).astype(dtype)
        mean, tau = invariant_mean(X, n_rotations=4)
        assert isinstance(mean, np.ndarray) and mean.dtype == dtype
        assert isinstance(tau, np.ndarray)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_torch_in_torch_out(self, dtype):
        X = torch.rand((3, 8, 8), dtype=dtype, generator=torch.Generator().manual_seed(0))
        mean, tau = invariant_mean(X, n_rotations=4, device="cpu")
        assert isinstance(mean, torch.Tensor) and isinstance(tau, torch.Tensor)
        assert mean.dtype == dtype and mean.shape == (8, 8) and tau.shape == (3, 3)

    def test_single_sample(self):
        X = _random((1, 6, 6), seed=23)
        mean, tau = invariant_mean(X, n_rotations=4)
        np.testing.assert_allclose(mean, X[0], atol=1e-6)
        np.testing.assert_allclose(tau, 0.0, atol=1e-6)

    def test_input_not_modified(self):
        X = _random((3, 6, 6), seed=24)
        X0 = X.copy()
        invariant_mean(X, n_rotations=4)
        np.testing.assert_array_equal(X, X0)


# ----------------------------------------------------------------------------- bad input
class TestErrors:
    def setup_method(self):
        self.X = _random((3, 6, 6), seed=30)

    @pytest.mark.parametrize("w", [[1.0, 2.0], [1.0, 2.0, 3.0, 4.0], [[1.0, 2.0, 3.0]]])
    def test_weights_wrong_shape(self, w):
        with pytest.raises(ValueError, match="weights"):
            invariant_mean(self.X, w)

    @pytest.mark.parametrize("w", [[1.0, -1.0, 1.0], [0.0, 0.0, 0.0], [np.nan, 1.0, 1.0],
                                   [np.inf, 1.0, 1.0]])
    def test_weights_bad_values(self, w):
        with pytest.raises(ValueError, match="weights"):
            invariant_mean(self.X, w)

    def test_weights_complex(self):
        with pytest.raises(ValueError, match="weights"):
            invariant_mean(self.X, np.ones(3, dtype=complex))

    def test_weights_not_numbers(self):
        with pytest.raises(TypeError, match="weights"):
            invariant_mean(self.X, ["a", "b", "c"])

    def test_non_finite_x(self):
        X = self.X.copy()
        X[0, 0, 0] = np.nan
        with pytest.raises(ValueError, match="X"):
            invariant_mean(X)

    def test_empty_x(self):
        with pytest.raises(ValueError, match="X"):
            invariant_mean(np.zeros((0, 6, 6)))

    def test_unknown_group(self):
        with pytest.raises(ValueError, match="group"):
            invariant_mean(self.X, group="affine")

    @pytest.mark.parametrize("max_iter", [0, -1, 2.5])
    def test_bad_max_iter(self, max_iter):
        with pytest.raises(ValueError, match="max_iter"):
            invariant_mean(self.X, max_iter=max_iter)


@pytest.mark.parametrize("labels", [[0, np.nan, 1, 1], [0, None, 1, 1], [0, 1, np.inf, 1],
                                    np.array([0.0, 1.0, 1.0, np.nan])])
def test_class_averages_missing_labels_named(labels):
    X = np.random.default_rng(0).random((4, 8, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="labels: 1 missing"):
        class_averages(X, labels=labels, n_rotations=4)


def test_class_averages_float_labels_are_classes():
    X = np.random.default_rng(0).random((4, 8, 8)).astype(np.float32)
    a = class_averages(X, labels=[1.0, 1.0, 0.0, 0.0], n_rotations=4)
    b = class_averages(X, labels=[1, 1, 0, 0], n_rotations=4)
    np.testing.assert_array_equal(a, b)
