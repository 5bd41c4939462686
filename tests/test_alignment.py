"""Tests of invariant_distances: exact group elements, a float64 brute force, refinement, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _images import random_images

from invariant_cluster import invariant_distances, warp_se2
from invariant_cluster.alignment import fast_warp
from invariant_cluster.transforms import invert_se2, rotation_grid, translation_grid

pytestmark = pytest.mark.usefixtures("torch_single_thread")


_random = random_images


def _brute_force(X, Y, angles, shifts):
    """``min`` over the grid of ``||X_i - warp_se2(Y_j, tau)||^2``, pair by pair, in float64.

    Every grid point is one full warp of ``Y_j`` (no decomposition into rotation and shift).
    """
    taus = np.array([(a, tx, ty) for a in angles for tx, ty in shifts], dtype=np.float64)
    D = np.full((len(X), len(Y)), np.inf)
    T = np.zeros((len(X), len(Y), 3))
    for j in range(len(Y)):
        yj = np.repeat(Y[j][None].astype(np.float64), len(taus), axis=0)
        warped = warp_se2(yj, taus)  # (G, H, W): Y_j under every grid point
        for i in range(len(X)):
            d = ((X[i][None] - warped) ** 2).reshape(len(taus), -1).sum(1)
            g = int(np.argmin(d))  # first minimum, in grid order
            D[i, j], T[i, j] = d[g], taus[g]
    return D, T


def _aligned_residuals(X, Y, tau):
    """``||X_i - warp_se2(Y_j, tau_ij)||^2`` for every pair, from the returned alignments."""
    n_x, n_y = tau.shape[:2]
    out = np.empty((n_x, n_y))
    for i in range(n_x):
        w = warp_se2(np.asarray(Y, dtype=np.float64), tau[i])
        out[i] = ((X[i][None] - w) ** 2).reshape(n_y, -1).sum(1)
    return out


# ----------------------------------------------------------------------------- exact elements
class TestExactGroupElements:
    @pytest.mark.parametrize("k", [0, 1, 2, 3])
    @pytest.mark.parametrize("n_rotations", [4, 36])
    def test_quarter_turns(self, k, n_rotations):
        x = _random((2, 9, 9), seed=k)
        y = np.rot90(x, k=k, axes=(1, 2)).copy()
        D, tau = invariant_distances(x, y, group="rotation", n_rotations=n_rotations,
                                     return_alignments=True)
        assert np.abs(np.diag(D)).max() < 1e-6
        # y = R(90 k) x, so R(-90 k) brings it back
        ang = (tau[[0, 1], [0, 1], 0] + 90.0 * k + 180.0) % 360.0 - 180.0
        np.testing.assert_allclose(ang, 0.0, atol=1e-3)
        for i in range(2):
            np.testing.assert_allclose(warp_se2(y[i][None], tau[i, i][None])[0], x[i], atol=1e-5)
        # two different random images stay far apart
        assert D[0, 1] > 1.0 and D[1, 0] > 1.0

    @pytest.mark.parametrize("tx, ty", [(1, 0), (0, -2), (2, 1), (-1, -1)])
    def test_integer_shifts(self, tx, ty):
        x = _random((2, 10, 10), seed=5, border=2)
        y = warp_se2(x, [[0.0, tx, ty]] * 2)
        D, tau = invariant_distances(x, y, group="translation", max_translation=2,
                                     return_alignments=True)
        assert np.abs(np.diag(D)).max() < 1e-8
        np.testing.assert_allclose(tau[[0, 1], [0, 1]], [[0.0, -tx, -ty]] * 2, atol=1e-4)
        for i in range(2):
            np.testing.assert_allclose(warp_se2(y[i][None], tau[i, i][None])[0], x[i], atol=1e-5)

    @pytest.mark.parametrize("angle, tx, ty", [(90.0, 1, 0), (180.0, -1, 2), (-90.0, 2, -2)])
    def test_quarter_turn_and_shift(self, angle, tx, ty):
        x = _random((1, 12, 12), seed=6, border=3)
        g = np.array([[angle, tx, ty]])
        y = warp_se2(x, g)
        D, tau = invariant_distances(x, y, n_rotations=8, max_translation=2,
                                     return_alignments=True)
        assert D[0, 0] < 1e-8
        inv = invert_se2(g)[0]
        np.testing.assert_allclose((tau[0, 0, 0] - inv[0] + 180) % 360 - 180, 0.0, atol=1e-3)
        np.testing.assert_allclose(tau[0, 0, 1:], inv[1:], atol=1e-3)
        np.testing.assert_allclose(warp_se2(y, tau[0]), x, atol=1e-5)


# ----------------------------------------------------------------------------- brute force
class TestBruteForce:
    @pytest.mark.parametrize("border", [2, 0], ids=["dark-border", "full-frame"])
    def test_grid_equals_brute_force(self, border):
        # D[i, j] = min over the grid of ||X_i - T_tau Y_j||^2, with T_tau ONE warp (warp_se2)
        X = _random((4, 12, 12), seed=10, border=border)
        Y = _random((5, 12, 12), seed=11, border=border)
        angles, shifts = rotation_grid(180.0, 8), translation_grid(1)
        D_ref, T_ref = _brute_force(X, Y, angles, shifts)
        D, T = invariant_distances(X, Y, n_rotations=8, max_translation=1, refine=False,
                                   return_alignments=True)
        np.testing.assert_allclose(D, D_ref, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(T, T_ref, atol=1e-9)

    def test_bounded_rotations_equal_brute_force(self):
        X = _random((3, 10, 10), seed=12)
        Y = _random((4, 10, 10), seed=13)
        D_ref, _ = _brute_force(X, Y, rotation_grid(40.0, 5), [(0, 0)])
        D = invariant_distances(X, Y, group="rotation", max_rotation=40.0, n_rotations=5,
                                refine=False)
        np.testing.assert_allclose(D, D_ref, rtol=1e-9, atol=1e-9)

    def test_translation_group_equals_brute_force(self):
        X = _random((3, 9, 11), seed=14)
        Y = _random((4, 9, 11), seed=15)
        D_ref, T_ref = _brute_force(X, Y, [0.0], translation_grid(2))
        D, T = invariant_distances(X, Y, group="translation", max_translation=2, refine=False,
                                   return_alignments=True)
        np.testing.assert_allclose(D, D_ref, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(T, T_ref, atol=1e-9)
        assert np.all(T[..., 0] == 0)


# ----------------------------------------------------------------------------- refinement
class TestRefinement:
    @pytest.mark.parametrize("border", [2, 0], ids=["dark-border", "full-frame"])
    def test_refine_never_worse(self, border):
        X = _random((4, 12, 12), seed=20, border=border)
        Y = _random((5, 12, 12), seed=21, border=border)
        kw = dict(n_rotations=8, max_translation=1)
        D0 = invariant_distances(X, Y, refine=False, **kw)
        D1 = invariant_distances(X, Y, refine=True, **kw)
        assert np.all(D1 <= D0 + 1e-9 * (1 + D0))

    def test_refine_never_worse_smooth(self, smooth_images):
        X = smooth_images(3, 16, seed=22)
        Y = smooth_images(4, 16, seed=23)
        for kw in (dict(n_rotations=12), dict(n_rotations=8, max_translation=1.5),
                   dict(group="rotation", max_rotation=30.0, n_rotations=3)):
            D0 = invariant_distances(X, Y, refine=False, **kw)
            D1 = invariant_distances(X, Y, refine=True, **kw)
            assert np.all(D1 <= D0 + 1e-9 * (1 + D0)), kw
            assert D1.sum() < D0.sum()

    def test_recovers_a_continuous_transform(self, smooth_images):
        x = smooth_images(1, 24, seed=3)
        g = np.array([[7.3, 0.4, -0.3]])
        y = warp_se2(x, g)
        # y is exactly a warp of x, so aligning x onto y must find g itself
        D, tau = invariant_distances(y, x, max_translation=1, return_alignments=True)
        np.testing.assert_allclose(tau[0, 0], g[0], atol=1e-3)
        assert D[0, 0] < 1e-8 * (y ** 2).sum()
        D_grid = invariant_distances(y, x, max_translation=1, refine=False)
        assert D_grid[0, 0] > 1e3 * max(D[0, 0], 1e-12)
        # the other way round only up to the interpolation error of one bilinear warp
        D2, tau2 = invariant_distances(x, y, max_translation=1, return_alignments=True)
        inv = invert_se2(g)[0]
        assert abs(tau2[0, 0, 0] - inv[0]) < 0.5
        np.testing.assert_allclose(tau2[0, 0, 1:], inv[1:], atol=0.1)
        assert D2[0, 0] < 0.25 * invariant_distances(x, y, max_translation=1, refine=False)[0, 0]

    def test_refinement_respects_bounds(self, smooth_images):
        X = smooth_images(3, 16, seed=24)
        Y = warp_se2(smooth_images(3, 16, seed=25), [[50.0, 2.0, -2.0]] * 3)
        _, tau = invariant_distances(X, Y, max_rotation=20.0, n_rotations=5,
                                     max_translation=1, return_alignments=True)
        assert np.all(np.abs(tau[..., 0]) <= 20.0 + 1e-6)
        assert np.all(np.abs(tau[..., 1:]) <= 1.0 + 1e-6)


# ----------------------------------------------------------------------------- group variants
class TestGroups:
    def test_none_is_squared_euclidean(self):
        X = _random((4, 7, 7), seed=30)
        Y = _random((3, 7, 7), seed=31)
        D, tau = invariant_distances(X, Y, group="none", return_alignments=True)
        ref = ((X[:, None] - Y[None]) ** 2).reshape(4, 3, -1).sum(-1)
        np.testing.assert_allclose(D, ref, rtol=1e-10, atol=1e-10)
        np.testing.assert_array_equal(tau, 0.0)

    def test_none_ignores_search_parameters(self):
        X = _random((3, 6, 6), seed=32)
        D1 = invariant_distances(X, group="none")
        D2 = invariant_distances(X, group="none", n_rotations=7, max_translation=2)
        np.testing.assert_allclose(D1, D2, atol=1e-12)

    def test_translation_finds_shifts_only(self):
        x = _random((1, 10, 10), seed=33, border=2)
        y = np.rot90(warp_se2(x, [[0.0, 1.0, -1.0]]), axes=(1, 2)).copy()
        D_t, tau_t = invariant_distances(x, y, group="translation", max_translation=2,
                                         return_alignments=True)
        assert tau_t[0, 0, 0] == 0.0
        assert D_t[0, 0] > 1.0  # a quarter turn cannot be undone by shifts
        shifted = warp_se2(x, [[0.0, 1.0, -1.0]])
        D_s, tau_s = invariant_distances(x, shifted, group="translation", max_translation=2,
                                         return_alignments=True)
        assert D_s[0, 0] < 1e-8
        np.testing.assert_allclose(tau_s[0, 0], [0.0, -1.0, 1.0], atol=1e-4)

    def test_rotation_finds_rotations_only(self):
        x = _random((1, 10, 10), seed=34, border=2)
        y = warp_se2(x, [[0.0, 1.0, 0.0]])
        D, tau = invariant_distances(x, y, group="rotation", max_translation=2,
                                     return_alignments=True)
        np.testing.assert_array_equal(tau[0, 0, 1:], 0.0)
        assert D[0, 0] > 1.0
        D_se2 = invariant_distances(x, y, group="se2", max_translation=2)
        assert D_se2[0, 0] < 1e-8

    def test_distances_ordered_by_group_size(self):
        # a larger group can only give a smaller minimum (same grid points included)
        X = _random((3, 10, 10), seed=35)
        Y = _random((3, 10, 10), seed=36)
        kw = dict(n_rotations=4, max_translation=1, refine=False)
        d_none = invariant_distances(X, Y, group="none", **kw)
        d_rot = invariant_distances(X, Y, group="rotation", **kw)
        d_tr = invariant_distances(X, Y, group="translation", **kw)
        d_se2 = invariant_distances(X, Y, group="se2", **kw)
        assert np.all(d_rot <= d_none + 1e-9) and np.all(d_tr <= d_none + 1e-9)
        assert np.all(d_se2 <= d_rot + 1e-9) and np.all(d_se2 <= d_tr + 1e-9)


# ----------------------------------------------------------------------------- API properties
class TestProperties:
    def test_self_distances(self, smooth_images):
        X = smooth_images(5, 32, seed=40)
        D = invariant_distances(X, n_rotations=12, max_translation=1)
        assert D.shape == (5, 5)
        assert np.abs(np.diag(D)).max() < 1e-6
        off = D[~np.eye(5, dtype=bool)]
        assert off.min() > 100 * max(np.abs(np.diag(D)).max(), 1e-9)
        # d(x, y) and d(y, x) differ by the energy a bilinear warp loses (4% of ||x||^2 at
        # 16 x 16, 1% at 32 x 32): about 26% of the largest distance at 16 x 16, 7% at 32 x 32
        assert np.abs(D - D.T).max() < 0.15 * D.max()

    def test_y_none_equals_y_is_x(self, smooth_images):
        X = smooth_images(4, 12, seed=41)
        np.testing.assert_allclose(invariant_distances(X, n_rotations=6),
                                   invariant_distances(X, X, n_rotations=6), atol=1e-12)

    @pytest.mark.parametrize("refine", [False, True])
    def test_alignments_consistent_with_distances_smooth(self, smooth_images, refine):
        X = smooth_images(3, 16, seed=42)
        Y = smooth_images(4, 16, seed=43)
        D, tau = invariant_distances(X, Y, n_rotations=8, max_translation=1, refine=refine,
                                     return_alignments=True)
        assert tau.shape == (3, 4, 3)
        np.testing.assert_allclose(_aligned_residuals(X, Y, tau), D, rtol=1e-6, atol=1e-9)

    @pytest.mark.parametrize("refine", [False, True])
    def test_alignments_consistent_with_distances_full_frame(self, refine):
        X = _random((3, 10, 10), seed=44)
        Y = _random((4, 10, 10), seed=45)
        D, tau = invariant_distances(X, Y, n_rotations=8, max_translation=1, refine=refine,
                                     return_alignments=True)
        np.testing.assert_allclose(_aligned_residuals(X, Y, tau), D, rtol=1e-6, atol=1e-9)

    def test_batch_size_does_not_change_the_result(self, smooth_images):
        X = smooth_images(5, 12, seed=46)
        Y = smooth_images(3, 12, seed=47)
        kw = dict(n_rotations=6, max_translation=1, return_alignments=True)
        D, tau = invariant_distances(X, Y, **kw)
        for bs in (1, 2, 3, 5, 100):
            D_b, tau_b = invariant_distances(X, Y, batch_size=bs, **kw)
            np.testing.assert_allclose(D_b, D, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(tau_b, tau, atol=1e-8)

    def test_flat_and_image_inputs_agree(self, smooth_images):
        X = smooth_images(3, 10, seed=48)
        Y = smooth_images(2, 10, seed=49)
        D3 = invariant_distances(X, Y, n_rotations=4)
        D2 = invariant_distances(X.reshape(3, -1), Y.reshape(2, -1), n_rotations=4)
        D2s = invariant_distances(X.reshape(3, -1), Y.reshape(2, -1), n_rotations=4,
                                  image_shape=(10, 10))
        D4 = invariant_distances(X[:, None], Y[:, None], n_rotations=4)
        np.testing.assert_allclose(D2, D3, atol=1e-12)
        np.testing.assert_allclose(D2s, D3, atol=1e-12)
        np.testing.assert_allclose(D4, D3, atol=1e-12)

    def test_multichannel_is_sum_over_channels(self):
        X = _random((2, 3, 8, 8), seed=50)
        Y = np.rot90(X, k=1, axes=(2, 3)).copy()
        D = invariant_distances(X, Y, group="rotation", n_rotations=4, refine=False)
        np.testing.assert_allclose(np.diag(D), 0.0, atol=1e-8)
        # a rotation shared by all channels: rotating one channel only is not undone
        Z = Y.copy()
        Z[:, 0] = X[:, 0]
        assert np.all(np.diag(invariant_distances(X, Z, group="rotation", n_rotations=4,
                                                  refine=False)) > 1.0)

    def test_non_square_images_with_image_shape(self):
        X = _random((2, 6, 9), seed=51, border=1)
        Y = warp_se2(X, [[0.0, 1.0, 0.0]] * 2)
        D = invariant_distances(X.reshape(2, -1), Y.reshape(2, -1), image_shape=(6, 9),
                                group="translation", max_translation=1)
        np.testing.assert_allclose(np.diag(D), 0.0, atol=1e-8)


# ----------------------------------------------------------------------------- types
class TestTypes:
    def test_numpy_float64_preserved(self):
        X = _random((3, 8, 8), seed=60)
        D, tau = invariant_distances(X, n_rotations=4, return_alignments=True)
        assert isinstance(D, np.ndarray) and D.dtype == np.float64 and D.shape == (3, 3)
        assert isinstance(tau, np.ndarray) and tau.shape == (3, 3, 3)

    def test_numpy_float32(self):
        X = _random((3, 8, 8), seed=61).astype(np.float32)
        D = invariant_distances(X, n_rotations=4)
        assert isinstance(D, np.ndarray) and D.dtype == np.float32
        D64 = invariant_distances(X.astype(np.float64), n_rotations=4)
        np.testing.assert_allclose(D, D64, rtol=1e-3, atol=1e-3)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_torch_in_torch_out(self, dtype):
        X = torch.rand((3, 8, 8), dtype=dtype, generator=torch.Generator().manual_seed(0))
        D, tau = invariant_distances(X, X[:2], n_rotations=4, device="cpu",
                                     return_alignments=True)
        assert isinstance(D, torch.Tensor) and isinstance(tau, torch.Tensor)
        assert D.dtype == dtype and D.shape == (3, 2) and tau.shape == (3, 2, 3)
        assert D.device.type == "cpu"
        D_np = invariant_distances(X.numpy(), X[:2].numpy(), n_rotations=4)
        np.testing.assert_allclose(D.numpy(), D_np, rtol=1e-6, atol=1e-6)

    def test_integer_input(self):
        X = (np.random.default_rng(62).random((3, 6, 6)) * 10).astype(np.int64)
        D = invariant_distances(X, group="none")
        ref = ((X[:, None] - X[None]).astype(np.float64) ** 2).reshape(3, 3, -1).sum(-1)
        np.testing.assert_allclose(D, ref, rtol=1e-6)

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_cuda_matches_cpu(self, smooth_images):
        X = smooth_images(4, 12, seed=63)
        D_cpu, T_cpu = invariant_distances(X, n_rotations=8, max_translation=1, device="cpu",
                                           return_alignments=True)
        D_gpu, T_gpu = invariant_distances(X, n_rotations=8, max_translation=1, device="cuda",
                                           return_alignments=True)
        assert isinstance(D_gpu, np.ndarray)
        np.testing.assert_allclose(D_gpu, D_cpu, rtol=1e-5, atol=1e-6)
        Xt = torch.as_tensor(X, device="cuda")
        D_t = invariant_distances(Xt, n_rotations=8, max_translation=1, device="cuda")
        assert D_t.device.type == "cuda"


# ----------------------------------------------------------------------------- fast_warp
class TestFastWarp:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    @pytest.mark.parametrize("shape", [(5, 1, 8, 8), (4, 3, 7, 10), (3, 2, 1, 9), (3, 1, 9, 1)])
    def test_equals_warp_se2(self, dtype, shape):
        gen = torch.Generator().manual_seed(1)
        x = torch.rand(shape, dtype=dtype, generator=gen)
        n = shape[0]
        params = torch.cat([torch.rand((n, 1), generator=gen, dtype=dtype) * 360 - 180,
                            torch.rand((n, 2), generator=gen, dtype=dtype) * 4 - 2], 1)
        params[0] = torch.tensor([90.0, 1.0, 0.0])
        np.testing.assert_allclose(fast_warp(x, params).numpy(), warp_se2(x, params).numpy(),
                                   atol=1e-5)


# ----------------------------------------------------------------------------- bad input
class TestErrors:
    def setup_method(self):
        self.X = _random((3, 8, 8), seed=70)

    @pytest.mark.parametrize("bad", [np.nan, np.inf])
    def test_non_finite(self, bad):
        X = self.X.copy()
        X[1, 2, 3] = bad
        with pytest.raises(ValueError, match="X"):
            invariant_distances(X)
        with pytest.raises(ValueError, match="Y"):
            invariant_distances(self.X, X)

    @pytest.mark.parametrize("shape", [(0, 64), (0, 8, 8), (3, 0)])
    def test_empty(self, shape):
        with pytest.raises(ValueError, match="X"):
            invariant_distances(np.zeros(shape))

    def test_wrong_ndim(self):
        with pytest.raises(ValueError, match="X"):
            invariant_distances(np.zeros(64))
        with pytest.raises(ValueError, match="X"):
            invariant_distances(np.zeros((1, 1, 1, 8, 8)))

    @pytest.mark.parametrize("image_shape", [(7, 7), (2, 8, 8), (8, 0)])
    def test_wrong_image_shape(self, image_shape):
        with pytest.raises(ValueError, match="image_shape"):
            invariant_distances(self.X.reshape(3, -1), image_shape=image_shape)

    def test_image_shape_of_wrong_type(self):
        with pytest.raises((TypeError, ValueError), match="image_shape"):
            invariant_distances(self.X.reshape(3, -1), image_shape=64)

    @pytest.mark.parametrize("group", ["SE2", "affine", "", None, 3])
    def test_unknown_group(self, group):
        with pytest.raises(ValueError, match="group"):
            invariant_distances(self.X, group=group)

    def test_complex(self):
        # complex is a ValueError everywhere, as scikit-learn's estimator checks require
        with pytest.raises(ValueError, match="X"):
            invariant_distances(self.X.astype(complex))
        with pytest.raises(ValueError, match="Y"):
            invariant_distances(self.X, self.X.astype(np.complex64))
        with pytest.raises(ValueError, match="X"):
            invariant_distances(torch.zeros((2, 4, 4), dtype=torch.complex64))

    def test_object_dtype(self):
        X = np.empty((2, 4, 4), dtype=object)
        X[:] = 1.0
        with pytest.raises(TypeError, match="X"):
            invariant_distances(X)
        with pytest.raises((TypeError, ValueError), match="X"):
            invariant_distances([["a", "b"], ["c", "d"]])

    @pytest.mark.parametrize("value", [-1.0, np.nan, np.inf])
    def test_bad_max_rotation(self, value):
        with pytest.raises(ValueError, match="max_rotation"):
            invariant_distances(self.X, max_rotation=value)

    @pytest.mark.parametrize("value", [-1.0, np.nan])
    def test_bad_max_translation(self, value):
        with pytest.raises(ValueError, match="max_translation"):
            invariant_distances(self.X, max_translation=value)

    @pytest.mark.parametrize("value", [0, -3])
    def test_bad_n_rotations(self, value):
        with pytest.raises(ValueError, match="n_rotations"):
            invariant_distances(self.X, n_rotations=value)

    def test_non_integer_n_rotations(self):
        with pytest.raises(TypeError, match="n_rotations"):
            invariant_distances(self.X, n_rotations=4.5)

    @pytest.mark.parametrize("value", [0, -1, 2.5])
    def test_bad_batch_size(self, value):
        with pytest.raises(ValueError, match="batch_size"):
            invariant_distances(self.X, batch_size=value)

    def test_bad_device(self):
        with pytest.raises(ValueError, match="device"):
            invariant_distances(self.X, device="not-a-device")

    @pytest.mark.parametrize("Y_shape", [(2, 9, 9), (2, 2, 8, 8), (2, 63)])
    def test_x_y_mismatch(self, Y_shape):
        with pytest.raises(ValueError, match="Y"):
            invariant_distances(self.X, np.zeros(Y_shape))


class TestWarpKeys:
    """The keys' warps of the search (``warp_keys``/``warp_canvas``): quarter turns and mirrors
    are copied from sampled warps (``_warp_plan``); every one must still be ``warp_se2``."""

    @pytest.mark.parametrize("shape, reflection, pad", [((2, 9, 9), False, 0),
                                                         ((1, 10, 10), True, 0),
                                                         ((1, 9, 9), True, 2),
                                                         ((3, 7, 11), True, 1)])
    def test_every_warp_is_warp_se2(self, shape, reflection, pad):
        from invariant_cluster.search.kernel import _warp_plan, warp_canvas, warp_keys
        from invariant_cluster.transforms import warp_se2

        g = torch.Generator().manual_seed(7)
        Y = torch.rand(4, *shape, generator=g, dtype=torch.float64)
        angles = torch.arange(-180.0, 180.0, 15.0, dtype=torch.float64)  # 24, quarter turns
        R = len(angles)
        Kw = warp_keys(Y, angles, pad=pad, reflection=reflection)
        c, h, w = shape
        Yp = torch.nn.functional.pad(Y, (pad, pad, pad, pad))
        mirrors = [0.0, 1.0] if reflection else [0.0]
        ref = torch.stack([warp_se2(Yp, torch.tensor([float(a), 0.0, 0.0, m],
                                                     dtype=torch.float64).expand(4, 4))
                           for m in mirrors for a in angles], 1)
        assert torch.allclose(Kw, ref.reshape(Kw.shape), rtol=0, atol=1e-12)
        # the identity is the key itself, exactly, and so are its exact quarter turns
        zero = int(torch.nonzero(angles == 0))
        assert torch.equal(Kw[:, zero], Yp.reshape(4, -1))
        if h == w:
            half = int(torch.nonzero(angles == 90.0))
            assert torch.equal(Kw[:, half], torch.rot90(Yp, 1, (2, 3)).reshape(4, -1))
        # only the warps that are not permutations of others are sampled
        sampled, derived = _warp_plan(angles.tolist(), h + 2 * pad == w + 2 * pad, reflection)
        assert len(sampled) + len(derived) == R * len(mirrors)
        assert len(sampled) == (R // 4 if h == w else R)
        # the angle-major layout holds the same warps
        canvas = Kw.shape[-1]
        Kc = warp_canvas(Y, angles, pad=pad, reflection=reflection)
        assert torch.equal(Kc.view(-1, 4, canvas).transpose(0, 1), Kw)
