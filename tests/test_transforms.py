"""Tests of invariant_cluster.transforms: the SE(2) convention, warps, composition and grids."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from kornia.geometry.transform import get_affine_matrix2d, get_rotation_matrix2d, rotate

from invariant_cluster import warp_se2
from invariant_cluster.transforms import (
    compose_se2,
    invert_se2,
    rotation_grid,
    se2_matrices,
    translation_grid,
)

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _shift_zero_fill(img: np.ndarray, tx: int, ty: int) -> np.ndarray:
    """Content moved ``tx`` px right and ``ty`` px down, zeros coming in (np.roll + zero fill)."""
    out = np.roll(img, shift=(ty, tx), axis=(-2, -1))
    if ty > 0:
        out[..., :ty, :] = 0
    elif ty < 0:
        out[..., ty:, :] = 0
    if tx > 0:
        out[..., :, :tx] = 0
    elif tx < 0:
        out[..., :, tx:] = 0
    return out


def _random_images(shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).random(shape).astype(dtype)


def _interior(a: np.ndarray, margin: int) -> np.ndarray:
    return a[..., margin:-margin, margin:-margin]


# ----------------------------------------------------------------------------- kornia convention
class TestKorniaConvention:
    """Facts about kornia that transforms.py relies on (kornia 0.9)."""

    def test_get_rotation_matrix2d_degrees_counter_clockwise(self):
        center = torch.tensor([[2.0, 2.0]], dtype=torch.float64)
        M = get_rotation_matrix2d(center, torch.tensor([90.0], dtype=torch.float64),
                                  torch.ones(1, 2, dtype=torch.float64))
        # [[cos, sin], [-sin, cos]] at 90 degrees (y down): a point right of the centre goes up
        np.testing.assert_allclose(M[0, :, :2].numpy(), [[0.0, 1.0], [-1.0, 0.0]], atol=1e-12)
        right_of_centre = torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64)
        np.testing.assert_allclose((M[0] @ right_of_centre).numpy(), [2.0, 0.0], atol=1e-12)

    def test_rotate_positive_is_counter_clockwise_as_displayed(self):
        img = torch.zeros(1, 1, 5, 5)
        img[0, 0, 2, 4] = 1.0  # right of the centre
        out = rotate(img, torch.tensor([90.0]))
        assert tuple(np.unravel_index(int(out[0, 0].argmax()), (5, 5))) == (0, 2)  # above
        # np.rot90 with k=1 is also counter-clockwise as displayed
        np.testing.assert_allclose(out[0, 0].numpy(), np.rot90(img[0, 0].numpy()), atol=1e-5)

    def test_get_affine_matrix2d_uses_the_opposite_sign(self):
        center = torch.tensor([[2.0, 2.0]], dtype=torch.float64)
        angle = torch.tensor([30.0], dtype=torch.float64)
        scale = torch.ones(1, 2, dtype=torch.float64)
        A = get_affine_matrix2d(torch.zeros(1, 2, dtype=torch.float64), center, scale, angle)
        R = get_rotation_matrix2d(center, angle, scale)
        R_neg = get_rotation_matrix2d(center, -angle, scale)
        np.testing.assert_allclose(A[0, :2, :].numpy(), R_neg[0].numpy(), atol=1e-12)
        assert not np.allclose(A[0, :2, :2].numpy(), R[0, :, :2].numpy())

    @pytest.mark.parametrize("height, width", [(5, 5), (6, 9)])
    def test_se2_matrices_is_rotation_matrix_plus_translation(self, height, width):
        params = torch.tensor([[0.0, 0.0, 0.0], [37.5, 1.25, -2.0], [-120.0, -0.5, 3.0],
                               [90.0, 2.0, 0.0]], dtype=torch.float64)
        M = se2_matrices(params, height, width)
        center = torch.tensor([[(width - 1) / 2.0, (height - 1) / 2.0]],
                              dtype=torch.float64).expand(4, 2)
        R = get_rotation_matrix2d(center, params[:, 0], torch.ones(4, 2, dtype=torch.float64))
        expected = R.clone()
        expected[:, :, 2] += params[:, 1:]
        assert M.shape == (4, 2, 3)
        np.testing.assert_allclose(M.numpy(), expected.numpy(), atol=1e-12)

    def test_warp_se2_equals_kornia_rotate(self):
        x = torch.as_tensor(_random_images((3, 2, 7, 7), seed=1))
        angles = torch.tensor([15.0, -70.0, 133.0], dtype=torch.float64)
        params = torch.stack([angles, torch.zeros(3, dtype=torch.float64),
                              torch.zeros(3, dtype=torch.float64)], 1)
        expected = rotate(x, angles, mode="bilinear", padding_mode="zeros", align_corners=True)
        np.testing.assert_allclose(warp_se2(x, params).numpy(), expected.numpy(), atol=1e-10)


# ----------------------------------------------------------------------------- exact group elements
class TestWarpExact:
    @pytest.mark.parametrize("size", [7, 8])
    @pytest.mark.parametrize("angle, k", [(90.0, 1), (180.0, 2), (270.0, 3), (-90.0, 3),
                                          (-180.0, 2), (360.0, 0)])
    def test_quarter_turns_equal_rot90(self, size, angle, k):
        x = _random_images((3, size, size), seed=size)
        out = warp_se2(x, np.tile([angle, 0.0, 0.0], (3, 1)))
        np.testing.assert_allclose(out, np.rot90(x, k=k, axes=(1, 2)), atol=1e-5)

    def test_quarter_turns_multichannel_float32(self):
        x = _random_images((2, 3, 8, 8), seed=3, dtype=np.float32)
        out = warp_se2(x, [[90.0, 0.0, 0.0], [-90.0, 0.0, 0.0]])
        np.testing.assert_allclose(out[0], np.rot90(x[0], k=1, axes=(1, 2)), atol=1e-5)
        np.testing.assert_allclose(out[1], np.rot90(x[1], k=-1, axes=(1, 2)), atol=1e-5)

    @pytest.mark.parametrize("tx, ty", [(1, 0), (0, 1), (-2, 0), (0, -3), (2, -1), (-1, 2)])
    def test_integer_shifts_equal_roll_with_zero_fill(self, tx, ty):
        x = _random_images((2, 6, 9), seed=4)
        out = warp_se2(x, [[0.0, tx, ty]] * 2)
        np.testing.assert_allclose(out, _shift_zero_fill(x, tx, ty), atol=1e-5)

    def test_shift_direction(self):
        # tx is to the right (+column), ty downwards (+row)
        x = np.zeros((1, 5, 5))
        x[0, 2, 2] = 1.0
        out = warp_se2(x, [[0.0, 1.0, 2.0]])
        assert tuple(np.unravel_index(out[0].argmax(), (5, 5))) == (4, 3)

    def test_rotation_then_translation(self):
        # T_tau rotates about the centre first, then translates
        x = _random_images((1, 8, 8), seed=5)
        out = warp_se2(x, [[90.0, 1.0, -1.0]])
        np.testing.assert_allclose(out[0], _shift_zero_fill(np.rot90(x[0]), 1, -1), atol=1e-5)

    def test_identity_is_exact(self):
        x = _random_images((2, 1, 6, 5), seed=6)
        np.testing.assert_allclose(warp_se2(x, np.zeros((2, 3))), x, atol=1e-6)

    def test_per_image_params(self):
        x = _random_images((3, 8, 8), seed=7)
        out = warp_se2(x, [[90.0, 0, 0], [0.0, 1, 0], [180.0, 0, 0]])
        np.testing.assert_allclose(out[0], np.rot90(x[0]), atol=1e-5)
        np.testing.assert_allclose(out[1], _shift_zero_fill(x[1], 1, 0), atol=1e-5)
        np.testing.assert_allclose(out[2], np.rot90(x[2], 2), atol=1e-5)


# ----------------------------------------------------------------------------- types and shapes
class TestWarpTypes:
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    @pytest.mark.parametrize("shape", [(2, 6, 6), (2, 3, 5, 7)])
    def test_numpy_in_numpy_out(self, dtype, shape):
        x = _random_images(shape, dtype=dtype)
        out = warp_se2(x, [[10.0, 0.5, -0.5], [-30.0, 0.0, 1.0]])
        assert isinstance(out, np.ndarray)
        assert out.shape == shape
        assert out.dtype == dtype

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    @pytest.mark.parametrize("shape", [(2, 6, 6), (2, 3, 5, 7)])
    def test_torch_in_torch_out(self, dtype, shape):
        x = torch.rand(shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
        out = warp_se2(x, torch.tensor([[10.0, 0.5, -0.5], [-30.0, 0.0, 1.0]]))
        assert isinstance(out, torch.Tensor)
        assert out.shape == shape
        assert out.dtype == dtype
        assert out.device == x.device

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_cuda_in_cuda_out(self):
        x = torch.rand((2, 8, 8), dtype=torch.float64, device="cuda")
        out = warp_se2(x, [[90.0, 0.0, 0.0]] * 2)
        assert out.device == x.device and out.dtype == torch.float64
        np.testing.assert_allclose(out.cpu().numpy(), np.rot90(x.cpu().numpy(), axes=(1, 2)),
                                   atol=1e-5)

    def test_single_param_row_is_broadcast(self):
        x = _random_images((3, 8, 8), seed=8)
        a = warp_se2(x, [20.0, 0.5, 0.0])
        b = warp_se2(x, [[20.0, 0.5, 0.0]] * 3)
        c = warp_se2(x, [[20.0, 0.5, 0.0]])
        np.testing.assert_allclose(a, b, atol=1e-12)
        np.testing.assert_allclose(c, b, atol=1e-12)

    def test_integer_images_become_float(self):
        x = (np.arange(2 * 5 * 5).reshape(2, 5, 5) % 7).astype(np.int64)
        out = warp_se2(x, [[90.0, 0.0, 0.0]] * 2)
        assert np.issubdtype(out.dtype, np.floating)
        np.testing.assert_allclose(out, np.rot90(x, axes=(1, 2)), atol=1e-4)

    def test_input_not_modified(self):
        x = _random_images((2, 6, 6), seed=9)
        x0 = x.copy()
        warp_se2(x, [[33.0, 1.0, 0.0]] * 2)
        np.testing.assert_array_equal(x, x0)

    def test_empty_batch(self):
        out = warp_se2(np.zeros((0, 4, 4)), np.zeros((0, 3)))
        assert out.shape == (0, 4, 4)


# ----------------------------------------------------------------------------- differentiability
class TestWarpGradients:
    def test_gradcheck_params(self):
        x = torch.as_tensor(_random_images((2, 1, 5, 5), seed=10))
        # away from the bilinear kinks (integer sample positions)
        p = torch.tensor([[13.7, 0.31, -0.22], [-41.3, -0.17, 0.43]], dtype=torch.float64,
                         requires_grad=True)
        assert torch.autograd.gradcheck(lambda q: warp_se2(x, q), (p,), eps=1e-6, atol=1e-5)

    def test_gradcheck_images(self):
        x = torch.as_tensor(_random_images((2, 4, 5), seed=11)).requires_grad_(True)
        p = torch.tensor([[13.7, 0.31, -0.22], [-41.3, -0.17, 0.43]], dtype=torch.float64)
        assert torch.autograd.gradcheck(lambda im: warp_se2(im, p), (x,), eps=1e-6, atol=1e-5)

    def test_gradient_flows_to_both(self):
        x = torch.rand((1, 2, 6, 6), dtype=torch.float64, requires_grad=True)
        p = torch.tensor([[20.0, 0.3, 0.2]], dtype=torch.float64, requires_grad=True)
        warp_se2(x, p).sum().backward()
        assert x.grad is not None and p.grad is not None
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- composition
class TestComposeInvert:
    def test_warp_then_inverse_is_identity_inside(self, smooth_images):
        # two bilinear warps blur a little: the error shrinks with the resolution (10% of the
        # peak at 16 x 16, 4% at 32 x 32, 2% at 64 x 64), a wrong inverse stays near 50%
        x = smooth_images(3, 32, seed=1)
        tau = np.array([[23.0, 1.4, -0.8], [-75.0, -2.4, 1.0], [140.0, 0.6, 2.2]])
        back = warp_se2(warp_se2(x, tau), invert_se2(tau))
        err = np.abs(_interior(back - x, 6)).max()
        assert err < 0.06 * np.abs(x).max()
        # and the inverse undoes nothing it should not: far from the identity for a bad inverse
        wrong = warp_se2(warp_se2(x, tau), -tau)
        assert np.abs(_interior(wrong - x, 6)).max() > 5 * err

    def test_compose_matches_sequential_warps(self, smooth_images):
        x = smooth_images(3, 32, seed=2)
        a = np.array([[30.0, 2.0, 0.0], [-60.0, 0.0, -3.0], [100.0, 1.6, 0.8]])
        b = np.array([[45.0, 0.0, 2.0], [20.0, 2.6, 0.4], [-170.0, -1.2, 1.8]])
        seq = warp_se2(warp_se2(x, b), a)  # b first, then a
        one = warp_se2(x, compose_se2(a, b))
        assert np.abs(_interior(seq - one, 6)).max() < 0.06 * np.abs(x).max()
        # the order matters (rotations and translations do not commute)
        other = warp_se2(x, compose_se2(b, a))
        assert np.abs(_interior(seq - other, 6)).max() > 0.2 * np.abs(x).max()

    def test_compose_exact_on_quarter_turns_and_shifts(self):
        x = _random_images((1, 9, 9), seed=12)
        a = np.array([[90.0, 1.0, 0.0]])
        b = np.array([[180.0, 0.0, -1.0]])
        p = compose_se2(a, b)
        # R(90) (0, -1) + (1, 0) = (-1, 0) + (1, 0): up, turned a quarter counter-clockwise, is left
        np.testing.assert_allclose(p, [[-90.0, 0.0, 0.0]], atol=1e-9)
        seq = warp_se2(warp_se2(x, b), a)
        np.testing.assert_allclose(_interior(warp_se2(x, p), 1), _interior(seq, 1), atol=1e-5)

    def test_group_laws(self):
        rng = np.random.default_rng(13)
        a = np.c_[rng.uniform(-170, 170, 5), rng.normal(size=(5, 2))]
        b = np.c_[rng.uniform(-170, 170, 5), rng.normal(size=(5, 2))]
        c = np.c_[rng.uniform(-170, 170, 5), rng.normal(size=(5, 2))]
        np.testing.assert_allclose(compose_se2(a, invert_se2(a)), np.zeros((5, 3)), atol=1e-9)
        np.testing.assert_allclose(compose_se2(invert_se2(a), a), np.zeros((5, 3)), atol=1e-9)
        np.testing.assert_allclose(invert_se2(invert_se2(a)), a, atol=1e-9)
        left = compose_se2(compose_se2(a, b), c)
        right = compose_se2(a, compose_se2(b, c))
        np.testing.assert_allclose(left, right, atol=1e-9)

    def test_compose_torch_matches_numpy(self):
        rng = np.random.default_rng(14)
        a = np.c_[rng.uniform(-170, 170, 4), rng.normal(size=(4, 2))]
        b = np.c_[rng.uniform(-170, 170, 4), rng.normal(size=(4, 2))]
        out = compose_se2(torch.as_tensor(a), torch.as_tensor(b))
        assert isinstance(out, torch.Tensor)
        np.testing.assert_allclose(out.numpy(), compose_se2(a, b), atol=1e-12)
        inv = invert_se2(torch.as_tensor(a))
        assert isinstance(inv, torch.Tensor)
        np.testing.assert_allclose(inv.numpy(), invert_se2(a), atol=1e-12)

    def test_composed_matrices_multiply(self):
        # the affine matrices compose like the transformations: M(a o b) = M(a) M(b)
        rng = np.random.default_rng(15)
        a = np.c_[rng.uniform(-170, 170, 3), rng.normal(size=(3, 2))]
        b = np.c_[rng.uniform(-170, 170, 3), rng.normal(size=(3, 2))]

        def full(p):
            M = se2_matrices(torch.as_tensor(p), 7, 10).numpy()
            return np.concatenate([M, np.tile([[[0.0, 0.0, 1.0]]], (len(p), 1, 1))], 1)

        np.testing.assert_allclose(full(compose_se2(a, b)), full(a) @ full(b), atol=1e-9)


# ----------------------------------------------------------------------------- grids
class TestGrids:
    @pytest.mark.parametrize("n", [1, 2, 4, 7, 8, 36])
    def test_rotation_grid_full_circle(self, n):
        g = rotation_grid(180.0, n)
        assert g.shape == (n,)
        assert np.any(np.isclose(g, 0.0))
        assert np.all(g >= -180.0) and np.all(g < 180.0)
        assert len(np.unique(np.round(g, 9))) == n
        if n > 1:
            np.testing.assert_allclose(np.diff(np.sort(g)), 360.0 / n, atol=1e-9)
        if n % 4 == 0:
            for q in (-180.0, -90.0, 0.0, 90.0):
                assert np.any(np.isclose(g, q))

    @pytest.mark.parametrize("max_rotation, n", [(45.0, 1), (45.0, 5), (45.0, 6), (60.0, 17),
                                                 (10.0, 2), (179.0, 9)])
    def test_rotation_grid_bounded(self, max_rotation, n):
        g = rotation_grid(max_rotation, n)
        assert g.shape == (n,)
        assert np.any(np.isclose(g, 0.0))
        assert np.all(np.abs(g) <= max_rotation + 1e-9)
        assert len(np.unique(np.round(g, 9))) == n
        if n > 1 and n % 2 == 1:
            assert np.isclose(g.min(), -max_rotation) and np.isclose(g.max(), max_rotation)
        if n > 1:
            d = np.diff(np.sort(g))
            np.testing.assert_allclose(d, d[0], atol=1e-9)

    def test_rotation_grid_zero_range(self):
        np.testing.assert_array_equal(rotation_grid(0.0, 8), [0.0])

    @pytest.mark.parametrize("m, side", [(0, 1), (1, 3), (1.5, 3), (2, 5), (2.999, 5), (3, 7)])
    def test_translation_grid(self, m, side):
        g = translation_grid(m)
        assert g.shape == (side * side, 2)
        np.testing.assert_array_equal(g[0], [0.0, 0.0])
        np.testing.assert_array_equal(g, np.round(g))
        assert np.abs(g).max() == (side - 1) // 2
        assert len({tuple(r) for r in g}) == side * side


# ----------------------------------------------------------------------------- bad input
class TestWarpErrors:
    def setup_method(self):
        self.x = np.zeros((2, 5, 5))

    # 4 columns are E(2) parameters with a mirror bit (tests/test_reflection.py); 5 are wrong
    @pytest.mark.parametrize("params", [np.zeros((2, 2)), np.zeros((3, 3)), np.zeros((2, 3, 1)),
                                        np.zeros(5), np.zeros((2, 5)),
                                        np.array([[0.0, 0.0, 0.0, 0.5]] * 2)])
    def test_wrong_param_shape(self, params):
        with pytest.raises(ValueError, match="params"):
            warp_se2(self.x, params)

    @pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
    def test_non_finite_params(self, bad):
        params = np.zeros((2, 3))
        params[1, 0] = bad
        with pytest.raises(ValueError, match="params"):
            warp_se2(self.x, params)

    def test_complex_params(self):
        with pytest.raises(ValueError, match="params"):
            warp_se2(self.x, np.zeros((2, 3), dtype=complex))

    def test_complex_images(self):
        with pytest.raises(ValueError, match="images"):
            warp_se2(self.x.astype(complex), np.zeros((2, 3)))
        with pytest.raises(ValueError, match="images"):
            warp_se2(torch.zeros((2, 5, 5), dtype=torch.complex64), np.zeros((2, 3)))

    @pytest.mark.parametrize("shape", [(5, 5), (25,), (1, 1, 1, 5, 5)])
    def test_wrong_image_ndim(self, shape):
        with pytest.raises(ValueError, match="images"):
            warp_se2(np.zeros(shape), np.zeros((1, 3)))

    def test_object_images(self):
        with pytest.raises((TypeError, ValueError), match="images"):
            warp_se2(np.empty((2, 5, 5), dtype=object), np.zeros((2, 3)))

    @pytest.mark.parametrize("bad", [np.nan, np.inf])
    def test_non_finite_images_are_not_silently_warped(self, bad):
        # refused, as by every other function of the package (issue 19)
        x = np.zeros((1, 5, 5))
        x[0, 2, 2] = bad
        with pytest.raises(ValueError, match="images"):
            warp_se2(x, [[0.0, 0.0, 0.0]])


def test_degrees_not_radians():
    # a quarter turn is 90, not pi / 2
    x = _random_images((1, 8, 8), seed=16)
    out = warp_se2(x, [[math.pi / 2, 0.0, 0.0]])
    assert not np.allclose(out, np.rot90(x, axes=(1, 2)), atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_warp_jacobian_matches_finite_differences(dtype):
    # the refinement's Jacobian (central differences of the warped image times the velocity
    # field) against central finite differences of the bilinear warp itself, at exact group
    # elements (quarter turns, integer shifts: every sample on a pixel centre, where the
    # bilinear warp's central difference IS the image's), on a smooth off-centre blob
    from invariant_cluster.transforms import fast_warp, warp_jacobian

    H = W = 33
    ys, xs = torch.meshgrid(torch.arange(H, dtype=torch.float64),
                            torch.arange(W, dtype=torch.float64), indexing="ij")
    blob = torch.exp(-((xs - 19.0) ** 2 + (ys - 13.0) ** 2) / (2 * 3.0 ** 2))
    Y = torch.stack([blob, blob.T, blob, blob.T])[:, None]  # (4, 1, H, W)
    tau = torch.tensor([[0.0, 0.0, 0.0], [90.0, 1.0, -2.0], [180.0, 0.0, 1.0],
                        [-90.0, -2.0, 1.0]], dtype=torch.float64)
    J = warp_jacobian(fast_warp(Y.to(dtype), tau.to(dtype)), tau.to(dtype)).double()
    for j, eps in enumerate((0.01, 0.01, 0.01)):
        d = torch.zeros(3, dtype=torch.float64)
        d[j] = eps
        fd = ((fast_warp(Y, tau + d) - fast_warp(Y, tau - d)) / (2 * eps)).reshape(4, -1)
        err = (J[..., j] - fd).norm(dim=1) / fd.norm(dim=1)
        assert bool((err < 0.01).all()), (j, err)
