"""Tests of the neighbour shortlist: descriptors, shortlist, exact candidate search, memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from invariant_cluster.alignment import fast_warp, grid_search, make_search_grid
from invariant_cluster.neighbors import (
    InsufficientMemoryError,
    block_elements,
    candidate_search,
    check_fits,
    default_n_candidates,
    invariant_descriptors,
    memory_budget,
    neighbor_search,
    shortlist,
    shortlist_descriptors,
    steerable_descriptors,
)

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _images(smooth_images, n=6, size=16, seed=0, dtype=torch.float64):
    return torch.as_tensor(smooth_images(n, size, seed=seed), dtype=dtype)[:, None]


def _shift(X, dy, dx, border=3):
    """Zero-bordered images (``border`` dark pixels added) moved by ``(dy, dx)`` pixels."""
    P = torch.nn.functional.pad(X, (border,) * 4)
    return P, torch.roll(P, shifts=(dy, dx), dims=(2, 3))  # the roll only moves zeros around


def _rotate(X, angle):
    p = torch.zeros((X.shape[0], 3), dtype=X.dtype)
    p[:, 0] = angle
    return fast_warp(X, p)


# ----------------------------------------------------------------------------- memory
class TestMemory:
    def test_budget_is_positive(self):
        assert isinstance(memory_budget("cpu"), int)
        assert memory_budget("cpu") > 0

    def test_block_elements_bounds(self):
        n = block_elements("cpu", 4)
        assert 1 <= n <= 64 * 1024 * 1024
        assert block_elements("cpu", 4, cap=10) == 10
        assert block_elements("cpu", 8) <= block_elements("cpu", 4)

    def test_small_request_passes(self):
        assert check_fits(1024, "cpu", "a tiny block") == 1024

    def test_absurd_request_raises_clear_error(self):
        with pytest.raises(InsufficientMemoryError) as info:
            check_fits(10 ** 18, "cpu", "the warped keys")
        msg = str(info.value)
        assert "the warped keys" in msg and "batch_size" in msg and "shortlist" in msg
        assert isinstance(info.value, MemoryError) and isinstance(info.value, ValueError)

    def test_candidate_search_checks_before_allocating(self, monkeypatch):
        import invariant_cluster._memory as memory

        monkeypatch.setattr(memory, "memory_budget", lambda device="cpu": 1000)
        X = torch.rand(4, 1, 8, 8)
        grid = make_search_grid("rotation", 45.0, 5, refine=False)
        with pytest.raises(MemoryError, match="needs .* available"):
            candidate_search(X, X, torch.arange(4).expand(4, 4), grid, k=2)


# ----------------------------------------------------------------------------- descriptors
class TestInvariantDescriptors:
    def test_quarter_turn_invariance(self, smooth_images):
        X = _images(smooth_images)
        d0 = invariant_descriptors(X)
        for Xr in (torch.rot90(X, 1, (2, 3)), _rotate(X, 90.0), torch.rot90(X, 2, (2, 3))):
            d1 = invariant_descriptors(Xr)
            assert torch.allclose(d0, d1, atol=1e-6 * float(d0.abs().max()))

    def test_small_rotation_nearly_invariant(self, smooth_images):
        X = _images(smooth_images, size=24)
        d0, d1 = invariant_descriptors(X), invariant_descriptors(_rotate(X, 33.0))
        rel = (d0 - d1).norm(dim=1) / d0.norm(dim=1)
        assert float(rel.max()) < 0.05

    def test_distance_bounded_by_euclidean(self, smooth_images):
        # a lower bound of the invariant distance, which is at most the plain distance
        X = _images(smooth_images, n=8, size=24)
        d = invariant_descriptors(X)
        D_desc = torch.cdist(d, d) ** 2
        D_pix = torch.cdist(X.reshape(8, -1), X.reshape(8, -1)) ** 2
        assert bool((D_desc <= 1.1 * D_pix + 1e-9).all())

    def test_norm_matches_image_norm(self, smooth_images):
        X = _images(smooth_images, size=32)
        d = invariant_descriptors(X, n_angular=128)
        ratio = d.norm(dim=1) / X.reshape(X.shape[0], -1).norm(dim=1)
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=0.05)

    def test_translation_exact_for_integer_shifts(self, smooth_images):
        X, Xs = _shift(_images(smooth_images, size=16), 2, -1)
        kw = dict(group="translation", max_translation=2)
        d0, d1 = invariant_descriptors(X, **kw), invariant_descriptors(Xs, **kw)
        assert torch.allclose(d0, d1, atol=1e-9 * float(d0.abs().max()))

    def test_none_is_pixels_and_dtype_device_follow(self, smooth_images):
        X = _images(smooth_images, dtype=torch.float32)
        d = invariant_descriptors(X, group="none")
        assert torch.equal(d, X.reshape(X.shape[0], -1))
        assert invariant_descriptors(X).dtype == torch.float32

    def test_batches_agree(self, smooth_images):
        X = _images(smooth_images, n=7)
        assert torch.allclose(invariant_descriptors(X, batch_size=2), invariant_descriptors(X))

    @pytest.mark.parametrize("kw, match", [
        (dict(group="affine"), "group"),
        (dict(center="middle"), "center"),
        (dict(n_angular=1), "n_angular"),
        (dict(n_rings=0), "n_rings"),
    ])
    def test_errors(self, kw, match):
        with pytest.raises(ValueError, match=match):
            invariant_descriptors(torch.zeros(2, 1, 8, 8), **kw)

    def test_shape_error(self):
        with pytest.raises(ValueError, match=r"\(n, C, H, W\)"):
            invariant_descriptors(torch.zeros(8, 8))


class TestSteerableDescriptors:
    def test_rotated_copy_matches_rotated_image(self, smooth_images):
        X = _images(smooth_images, size=24)
        kw = dict(n_angular=64)
        d_rot = steerable_descriptors(X, angles=[0.0, 30.0, 90.0], **kw)  # (n, 3, d)
        for v, angle in enumerate((0.0, 30.0, 90.0)):
            d_img = steerable_descriptors(_rotate(X, angle), **kw)[:, 0]
            rel = (d_rot[:, v] - d_img).norm(dim=1) / d_img.norm(dim=1)
            assert float(rel.max()) < (1e-6 if angle in (0.0, 90.0) else 0.05)

    def test_shifted_copy_matches_shifted_image(self, smooth_images):
        shifts = np.array([[0, 0], [1, -2]])
        # copy u is S_-t x: x(v + t), i.e. the content moved by -t
        X, Xs = _shift(_images(smooth_images, size=20), 2, -1)
        d = steerable_descriptors(X, shifts=shifts)
        d_img = steerable_descriptors(Xs)[:, 0]
        assert torch.allclose(d[:, 1], d_img, atol=1e-6 * float(d_img.abs().max()))
        assert d.shape[:2] == (X.shape[0], 2)


# ----------------------------------------------------------------------------- shortlist
class TestShortlist:
    def test_equals_brute_force(self):
        g = torch.Generator().manual_seed(0)
        Xd, Yd = torch.rand(30, 5, generator=g), torch.rand(40, 5, generator=g)
        cand = shortlist(Xd, Yd, 7, batch_size=4)
        ref = torch.topk(torch.cdist(Xd, Yd), 7, largest=False).indices
        assert torch.equal(cand, ref)

    def test_copies_take_the_minimum(self):
        g = torch.Generator().manual_seed(1)
        Xd, Yd = torch.rand(20, 3, 4, generator=g), torch.rand(25, 2, 4, generator=g)
        D = ((Xd[:, None, :, None] - Yd[None, :, None]) ** 2).sum(-1).amin((2, 3))
        ref = torch.topk(D, 6, largest=False).indices
        assert torch.equal(shortlist(Xd, Yd, 6), ref)

    def test_exclude_and_clipping(self):
        Xd = torch.rand(10, 3, generator=torch.Generator().manual_seed(2))
        cand = shortlist(Xd, Xd, 50, exclude=torch.arange(10))
        assert cand.shape == (10, 9)
        assert not bool((cand == torch.arange(10)[:, None]).any())
        assert torch.equal(shortlist(Xd, Xd, 1)[:, 0], torch.arange(10))

    def test_errors(self):
        with pytest.raises(ValueError, match="same d"):
            shortlist(torch.zeros(3, 4), torch.zeros(3, 5), 2)
        with pytest.raises(ValueError, match="n_candidates"):
            shortlist(torch.zeros(3, 4), torch.zeros(3, 4), 0)

    def test_recall_on_rotated_digits(self):
        from invariant_cluster.datasets import load_digits_images, make_transformed

        X, _ = make_transformed(load_digits_images().images[:300], max_rotation=45,
                                random_state=0)
        X = torch.as_tensor(X, dtype=torch.float64)[:, None]
        grid = make_search_grid("se2", 60.0, 9, refine=False)
        _, true_idx, _ = grid_search(X, X, grid, k=10)
        recall = {}
        for desc in ("steerable", "modulus"):
            Xd, Yd = shortlist_descriptors(X, X, grid, descriptor=desc)
            cand = shortlist(Xd, Yd, 40)
            recall[desc] = float((cand[:, :, None] == true_idx[:, None]).any(1).double().mean())
        assert recall["steerable"] >= 0.95
        assert recall["steerable"] > recall["modulus"]


# ----------------------------------------------------------------------------- exact search
class TestCandidateSearch:
    @pytest.mark.parametrize("group, max_translation", [("rotation", 0), ("se2", 1),
                                                        ("translation", 2), ("none", 0)])
    @pytest.mark.parametrize("with_exclude", [False, True])
    def test_all_candidates_equal_grid_search(self, group, max_translation, with_exclude):
        g = torch.Generator().manual_seed(3)
        X = torch.rand(13, 1, 10, 10, generator=g, dtype=torch.float64)
        Y = torch.rand(11, 1, 10, 10, generator=g, dtype=torch.float64)
        grid = make_search_grid(group, 60.0, 5, max_translation, refine=False)
        ex = torch.arange(13) % 11 if with_exclude else None
        D, I, P = grid_search(X, Y, grid, k=4, exclude=ex)
        cand = torch.arange(11).expand(13, 11)
        D2, I2, P2 = candidate_search(X, Y, cand, grid, k=4, exclude=ex, batch_size=3)
        assert torch.allclose(D, D2, rtol=1e-12, atol=1e-12)
        assert torch.equal(I, I2)
        assert torch.equal(P, P2)

    # elements per block: 5 angles x 9 shifts on 9 x 9 images cost 5,095 per key and 216 per
    # pair, so these hold 1, 60 and all 200 queries of a key
    @pytest.mark.parametrize("budget, per_block", [(1, 1), (5095 + 60 * 216, 60),
                                                   (10**9, 200)])
    def test_a_key_of_many_queries_is_split(self, monkeypatch, budget, per_block):
        # a key listed by more queries than one block holds (a centre searched by all the
        # members of its cluster) runs in blocks of its own; the result is grid_search's
        import invariant_cluster.search.candidates as candidates_module

        g = torch.Generator().manual_seed(5)
        X = torch.rand(200, 1, 9, 9, generator=g, dtype=torch.float64)
        Y = torch.rand(3, 1, 9, 9, generator=g, dtype=torch.float64)
        grid = make_search_grid("se2", 40.0, 5, 1, refine=False)
        D, I, P = grid_search(X, Y, grid, k=2)
        blocks = []
        real = candidates_module._key_blocks

        def spy(counts, per_key, per_pair, limit):
            out = real(counts, per_key, per_pair, limit)
            blocks.extend(out)
            return out

        monkeypatch.setattr(candidates_module._memory, "block_elements",
                            lambda *a, **kw: budget)
        monkeypatch.setattr(candidates_module, "_key_blocks", spy)
        cand = torch.stack([torch.randperm(3, generator=g) for _ in range(200)])
        D2, I2, P2 = candidate_search(X, Y, cand, grid, k=2)
        assert torch.allclose(D, D2, rtol=1e-12, atol=1e-12)
        assert torch.equal(I, I2) and torch.equal(P, P2)
        pairs = [e for b in blocks for e in b]
        # every key's 200 queries covered once, in slices of at most one block each
        for key in range(3):
            mine = sorted((o, m) for j, o, m in pairs if j == key)
            assert sum(m for _, m in mine) == 200 and mine[0][0] == 0
            assert all(a + m == b for (a, m), (b, _) in zip(mine, mine[1:]))
            assert max(m for _, m in mine) == per_block

    def test_float32_and_multichannel(self):
        g = torch.Generator().manual_seed(4)
        X = torch.rand(9, 2, 8, 8, generator=g)
        grid = make_search_grid("se2", 45.0, 4, 1, refine=False)
        D, I, P = grid_search(X, X, grid, k=3)
        D2, I2, P2 = candidate_search(X, X, torch.arange(9).expand(9, 9), grid, k=3)
        assert D2.dtype == torch.float32
        assert torch.allclose(D, D2, rtol=1e-4, atol=1e-4)
        assert torch.equal(I, I2) and torch.equal(P, P2)

    @pytest.mark.parametrize("channels, max_translation", [(2, 0), (3, 2)])
    def test_mirrors_and_channels_equal_grid_search(self, channels, max_translation):
        # the window-less path (no shift: the key's angles read as one strided matrix) and the
        # copied windows, with mirror images as more angles, several channels, uneven blocks
        g = torch.Generator().manual_seed(6)
        X = torch.rand(10, channels, 9, 11, generator=g, dtype=torch.float64)
        grid = make_search_grid("se2", 180.0, 8, max_translation, refine=False, reflection=True)
        ex = torch.arange(10)
        D, I, P = grid_search(X, X, grid, k=5, exclude=ex)
        cand = torch.arange(10).expand(10, 10)
        D2, I2, P2 = candidate_search(X, X, cand, grid, k=5, exclude=ex, batch_size=3)
        assert torch.allclose(D, D2, rtol=1e-12, atol=1e-12)
        assert torch.equal(I, I2) and torch.equal(P, P2)

    def test_restricted_candidates(self):
        g = torch.Generator().manual_seed(5)
        X = torch.rand(8, 1, 8, 8, generator=g, dtype=torch.float64)
        grid = make_search_grid("rotation", 90.0, 5, refine=False)
        Dfull, Pfull = grid_search(X, X, grid)
        cand = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(8)])
        D, I, P = candidate_search(X, X, cand, grid)  # k=None: all candidates, sorted
        assert I.shape == (8, 3)
        assert torch.equal(torch.sort(I, 1).values, torch.sort(cand, 1).values)
        assert torch.allclose(D, Dfull.gather(1, I), rtol=1e-12, atol=1e-12)
        assert torch.equal(P, Pfull[torch.arange(8)[:, None], I])
        assert bool((D[:, 1:] >= D[:, :-1]).all())

    def test_exact_quarter_turns_found(self, smooth_images):
        X = _images(smooth_images, n=4, size=16)
        Y = torch.cat([X, torch.rot90(X, 1, (2, 3))])
        grid = make_search_grid("rotation", 180.0, 4, refine=False)
        D, I, P = candidate_search(Y, Y, torch.arange(8).expand(8, 8), grid, k=2,
                                   exclude=torch.arange(8))
        assert torch.equal(I[:, 0], torch.cat([torch.arange(4, 8), torch.arange(4)]))
        assert float(D[:, 0].max()) < 1e-10
        assert bool((P[:, 0, 0].abs() == 90.0).all())

    def test_errors(self):
        X = torch.zeros(3, 1, 8, 8)
        grid = make_search_grid("rotation", 45.0, 3, refine=False)
        with pytest.raises(ValueError, match="candidates"):
            candidate_search(X, X, torch.full((3, 2), 5), grid)
        with pytest.raises(ValueError, match="candidates"):
            candidate_search(X, X, torch.zeros((2, 2), dtype=torch.long), grid)
        with pytest.raises(ValueError, match="image shape"):
            candidate_search(X, torch.zeros(3, 1, 9, 9), torch.zeros((3, 1), dtype=torch.long),
                             grid)


class TestNeighborSearch:
    def test_every_key_is_exact(self):
        g = torch.Generator().manual_seed(6)
        X = torch.rand(20, 1, 10, 10, generator=g, dtype=torch.float64)
        grid = make_search_grid("se2", 45.0, 5, 1, refine=False)
        D, I, P = grid_search(X, X, grid, k=4, exclude=torch.arange(20))
        D2, I2, P2, cand = neighbor_search(X, X, grid, k=4, n_candidates=100,
                                           exclude=torch.arange(20), return_candidates=True)
        assert cand.shape == (20, 20)
        assert torch.allclose(D, D2, rtol=1e-12, atol=1e-12) and torch.equal(I, I2)

    def test_shortlisted_search_shapes(self, smooth_images):
        X = _images(smooth_images, n=30, size=16)
        grid = make_search_grid("se2", 30.0, 5, 1, refine=False)
        D, I, P, cand = neighbor_search(X, X, grid, k=3, n_candidates=8, return_candidates=True)
        assert D.shape == (30, 3) and I.shape == (30, 3) and P.shape == (30, 3, 3)
        assert cand.shape == (30, 8)
        assert bool((I[:, :, None] == cand[:, None]).any(2).all())
        assert torch.equal(I[:, 0], torch.arange(30))  # each image is its own nearest

    def test_default_n_candidates(self):
        assert default_n_candidates(32, 9_999) == 128
        assert default_n_candidates(4, 9_999) == 64
        assert default_n_candidates(32, 50) == 50
        # from 10,000 keys on the approximate shortlist keeps max(6 k, 96)
        assert default_n_candidates(32, 10_000) == 192
        assert default_n_candidates(4, 70_000) == 96
        # without the approximate margin (the converged means, the kNN transformer): the plain
        # length at every size
        assert default_n_candidates(32, 70_000, margin=False) == 128
        assert default_n_candidates(4, 70_000, margin=False) == 64
        assert default_n_candidates(4, 50, margin=False) == 50

    def test_default_means_candidates(self):
        from invariant_cluster.search.plan import make_search_plan

        def means(k, n):
            return make_search_plan(n, n, 36 * 9, k, method="shortlist",
                                    purpose="means").n_candidates

        assert means(15, 70_000) == 64
        assert means(32, 70_000) == 128
        assert means(15, 20) == 20


class TestAlignedWeightedSum:
    def test_equals_pair_by_pair(self):
        from invariant_cluster.neighbors import aligned_weighted_sum

        g = torch.Generator().manual_seed(7)
        keys = torch.rand(10, 2, 8, 8, generator=g, dtype=torch.float64)
        idx = torch.randint(0, 10, (6, 3), generator=g)
        params = torch.rand(6, 3, 3, generator=g, dtype=torch.float64) * 20 - 10
        W = torch.softmax(torch.rand(6, 3, generator=g, dtype=torch.float64), 1)
        out = aligned_weighted_sum(keys, idx, params, W, batch_size=4)
        for i in range(6):
            ref = sum(W[i, j] * fast_warp(keys[idx[i, j]][None], params[i, j][None])[0]
                      for j in range(3))
            assert torch.allclose(out[i], ref, rtol=1e-12, atol=1e-12)
        assert out.shape == (6, 2, 8, 8)
        assert torch.equal(out, aligned_weighted_sum(keys, idx, params, W))

    def test_shape_error(self):
        from invariant_cluster.neighbors import aligned_weighted_sum

        with pytest.raises(ValueError, match="params"):
            aligned_weighted_sum(torch.zeros(3, 1, 4, 4), torch.zeros((2, 2), dtype=torch.long),
                                 torch.zeros(2, 3, 3), torch.zeros(2, 2))


def test_blocked_grid_search_equals_grid_search():
    from invariant_cluster.neighbors import blocked_grid_search

    g = torch.Generator().manual_seed(8)
    X = torch.rand(17, 1, 10, 10, generator=g, dtype=torch.float64)
    Y = torch.rand(12, 1, 10, 10, generator=g, dtype=torch.float64)
    grid = make_search_grid("se2", 45.0, 5, 1, refine=False)
    D, I, P = grid_search(X, Y, grid, k=3)
    D2, I2, P2 = blocked_grid_search(X, Y, grid, k=3, batch_size=5)
    assert torch.allclose(D, D2, rtol=1e-12, atol=1e-12)
    assert torch.equal(I, I2) and torch.equal(P, P2)
