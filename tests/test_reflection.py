"""Reflections (the group E(2) = SE(2) x {identity, mirror}) and class averages.

Exact group elements only: the mirror is a horizontal flip about the image centre
(``x[..., ::-1]``, exact on the pixel grid), applied before the rotation; quarter turns
(``np.rot90``) and integer shifts are exact too, so a mirrored copy is at distance 0 (up to
round-off) with the mirror bit set, and warping with the returned parameters reproduces the
query.
"""

import numpy as np
import pytest
import torch
from _images import random_images

from invariant_cluster import (
    InvariantAttentionClusterer,
    InvariantKNeighborsTransformer,
    KernelPCAAttention,
    class_averages,
    invariant_distances,
    invariant_mean,
)
from invariant_cluster.alignment import make_search_grid
from invariant_cluster.transforms import compose_se2, fast_warp, invert_se2, warp_se2


@pytest.fixture(autouse=True, scope="module")
def _one_thread(torch_single_thread):
    yield


def mirror(x):
    return np.ascontiguousarray(x[..., ::-1])


def quarter(x, k=1):
    """``k`` counter-clockwise quarter turns as displayed (rows down), as warp_se2's angle."""
    return np.ascontiguousarray(np.rot90(x, k, axes=(-2, -1)))


class TestTransforms:
    @pytest.mark.parametrize("shape", [(3, 1, 7, 7), (2, 2, 8, 11)])
    def test_mirror_bit_is_flip_then_motion(self, shape):
        x = random_images(shape, seed=1)
        assert np.abs(warp_se2(x, [0.0, 0.0, 0.0, 1.0]) - mirror(x)).max() < 1e-6
        if shape[-1] == shape[-2]:
            got = warp_se2(x, [90.0, 0.0, 0.0, 1.0])
            assert np.abs(got - quarter(mirror(x))).max() < 1e-6
        # integer shift after the flip: content moves right by one pixel
        got = warp_se2(x, [0.0, 1.0, 0.0, 1.0])
        assert np.abs(got[..., 1:] - mirror(x)[..., :-1]).max() < 1e-6

    def test_mirror_bit_zero_is_se2(self):
        x = random_images((4, 1, 9, 9), seed=2)
        p = np.array([[30.0, 1.5, -0.5]] * 4)
        a = warp_se2(x, p)
        b = warp_se2(x, np.c_[p, np.zeros(4)])
        assert np.abs(a - b).max() < 1e-6

    def test_fast_warp_matches_kornia(self):
        x = random_images((5, 1, 9, 12), seed=3)
        p = np.array([[0, 0, 0, 1], [90, 0, 0, 1], [33, 1.5, -0.5, 1], [33, 1.5, -0.5, 0],
                      [-150, -2, 1, 1]], float)
        a = warp_se2(x, p)
        b = fast_warp(torch.as_tensor(x), torch.as_tensor(p)).numpy()
        assert np.abs(a - b).max() < 1e-10

    @pytest.mark.parametrize("a", [[90, 1, 0, 1], [180, 0, 2, 0], [-90, -1, 1, 1]])
    @pytest.mark.parametrize("b", [[90, 0, 1, 1], [0, 2, 0, 1], [-90, 1, 1, 0]])
    def test_compose_and_invert_exact(self, a, b):
        # exact elements on a dark-bordered image: the warps never lose content
        y = random_images((1, 1, 10, 10), seed=4, border=3)
        A, B = np.array([a], float), np.array([b], float)
        two = warp_se2(warp_se2(y, B), A)
        one = warp_se2(y, compose_se2(A, B))
        assert np.abs(two - one).max() < 1e-6
        back = warp_se2(warp_se2(y, A), invert_se2(A))
        assert np.abs(back - y).max() < 1e-6
        assert np.allclose(compose_se2(A, invert_se2(A)), 0.0, atol=1e-9)

    def test_grid(self):
        g = make_search_grid("se2", 180.0, 4, 1, reflection=True)
        assert g.size == 2 * 4 * 9 and g.n_params == 4
        arg = torch.arange(g.size)
        p = g.decode(arg, torch.zeros(1, dtype=torch.float64))
        assert p.shape == (g.size, 4)
        assert p[:, 3].tolist() == [0.0] * 36 + [1.0] * 36
        assert make_search_grid("se2").n_params == 3
        with pytest.raises(TypeError, match="reflection"):
            make_search_grid("se2", reflection="yes")


class TestDistances:
    @pytest.mark.parametrize("shape", [(3, 8, 8), (2, 11, 11)])
    def test_mirror_at_distance_zero_with_bit(self, shape):
        x = random_images(shape, seed=5)
        for y, angle in ((mirror(x), 0.0), (quarter(mirror(x)), 90.0)):
            D, tau = invariant_distances(x, y, n_rotations=4, refine=False, reflection=True,
                                         return_alignments=True)
            diag = np.diag(D)
            assert diag.max() < 1e-6 * (x ** 2).sum(axis=(1, 2)).min()
            assert tau.shape == (len(x), len(x), 4)
            assert np.all(np.diagonal(tau[..., 3]) == 1.0)
            # M R90 M = R-90: warping the mirror of a quarter turn back needs +90 degrees
            assert np.allclose(np.diagonal(tau[..., 0]), angle)
            # warping each key with its parameters reproduces the query
            W = warp_se2(y, tau[np.arange(len(x)), np.arange(len(x))])
            assert np.abs(W - x).max() < 1e-5
        # the same search without mirrors: 3 columns, and a random image is not its mirror
        D, tau = invariant_distances(x, mirror(x), n_rotations=4, refine=False,
                                     return_alignments=True)
        assert tau.shape[-1] == 3 and np.diag(D).min() > 1e-2

    def test_refined_mirror_with_shift(self):
        x = random_images((3, 12, 12), seed=6, border=3)
        y = warp_se2(quarter(mirror(x), 2), [0.0, 1.0, -1.0])  # 180 deg, then a shift
        D, tau = invariant_distances(x, y, n_rotations=4, max_translation=1, reflection=True,
                                     return_alignments=True)
        i = np.arange(3)
        assert D[i, i].max() < 1e-6 and np.all(tau[i, i, 3] == 1.0)
        assert np.abs(warp_se2(y, tau[i, i]) - x).max() < 1e-4


class TestKNeighbors:
    @pytest.mark.parametrize("search", ["exact", "shortlist"])
    @pytest.mark.parametrize("n", [7, 12])
    def test_mirrored_queries(self, search, n):
        X = random_images((n, 10, 10), seed=n)
        Q = quarter(mirror(X), 3)
        knn = InvariantKNeighborsTransformer(n_neighbors=2, n_rotations=4, reflection=True,
                                             neighbor_search=search).fit(X)
        d, ind, tau = knn.kneighbors(Q, n_neighbors=1, return_alignments=True)
        assert ind[:, 0].tolist() == list(range(n))
        assert d.max() < 1e-2
        assert tau.shape == (n, 1, 4) and np.all(tau[:, 0, 3] == 1.0)
        assert np.abs(warp_se2(X[ind[:, 0]], tau[:, 0]) - Q).max() < 1e-4

    def test_default_keeps_three_columns(self):
        X = random_images((6, 8, 8), seed=9)
        knn = InvariantKNeighborsTransformer(n_neighbors=2, n_rotations=4).fit(X)
        _, _, tau = knn.kneighbors(return_alignments=True)
        assert tau.shape == (6, 2, 3)

    def test_reflection_param_validated(self):
        with pytest.raises((ValueError, TypeError), match="reflection"):
            InvariantKNeighborsTransformer(reflection="yes").fit(random_images((4, 6, 6)))


class TestMeansAndEstimators:
    def test_invariant_mean_of_mirrored_copies(self):
        x = random_images((10, 10), seed=10, border=2)
        copies = np.stack([x, mirror(x), quarter(mirror(x)), quarter(x, 2)])
        mu, tau = invariant_mean(copies, n_rotations=4, reflection=True, refine=False)
        assert tau.shape == (4, 4)
        # the mean is one of the copies' poses; all copies warp exactly onto it
        assert np.abs(warp_se2(copies, tau) - mu[None]).max() < 1e-5
        assert tau[:, 3].tolist() in ([0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0])

    def test_clusterer_alignments(self):
        rng = np.random.default_rng(0)
        a = random_images((11, 11), seed=11, border=2)
        b = random_images((11, 11), seed=12, border=2)
        p = np.c_[rng.uniform(-180, 180, 16), np.zeros((16, 2)), rng.integers(0, 2, 16)]
        X = warp_se2(np.stack([a] * 8 + [b] * 8), p).astype(np.float32)
        est = InvariantAttentionClusterer(reflection=True, random_state=0).fit(X)
        assert est.alignments_.shape == (16, 4)
        assert len(set(est.labels_[:8])) == 1 and len(set(est.labels_[8:])) == 1
        assert est.labels_[0] != est.labels_[8]
        assert InvariantAttentionClusterer(max_iter=0).fit(X).alignments_.shape == (16, 3)

    def test_kernel_pca_invariant_to_mirror(self):
        X = random_images((12, 8, 8), seed=13).reshape(12, -1)
        kp = KernelPCAAttention(kernel="invariant", n_rotations=4, reflection=True).fit(X)
        a = kp.transform(X)
        b = kp.transform(mirror(X.reshape(12, 8, 8)).reshape(12, -1))
        assert np.allclose(a, b, atol=1e-4)


class TestClassAverages:
    @pytest.mark.parametrize("n_copies", [4, 6])
    def test_exact_copies_average_to_the_image(self, n_copies):
        clean = random_images((2, 12, 12), seed=14)
        X = np.concatenate([quarter(mirror(clean) if c % 2 else clean, c)
                            for c in range(n_copies)])  # 2 n_copies images
        avg = class_averages(X, n_neighbors=n_copies - 1, n_rotations=4, refine=False,
                             reflection=True)
        assert avg.shape == X.shape
        assert np.abs(avg - X).max() < 1e-5

    def test_denoises_and_keeps_pose(self):
        rng = np.random.default_rng(15)
        clean = random_images((3, 12, 12), seed=15)
        X = np.concatenate([quarter(clean, k) for k in range(4)] * 3).astype(np.float32)
        noisy = X + rng.normal(0, 0.5, X.shape).astype(np.float32)
        avg = class_averages(noisy, n_neighbors=8, n_rotations=4, refine=False)
        assert np.abs(avg - X).mean() < 0.5 * np.abs(noisy - X).mean()
        flat = class_averages(noisy.reshape(len(X), -1), n_neighbors=8, n_rotations=4,
                              refine=False)
        assert flat.shape == (len(X), 144) and np.allclose(flat.reshape(X.shape), avg)

    def test_cluster_averages(self):
        clean = random_images((2, 10, 10), seed=16, border=2)
        X = np.concatenate([quarter(clean, k) for k in range(3)])  # labels 0, 1, 0, 1, 0, 1
        labels = np.array([5, 7] * 3)
        means = class_averages(X, labels=labels, n_rotations=4, refine=False)
        assert means.shape == (2, 10, 10)
        D = invariant_distances(means, clean, n_rotations=4, refine=False)
        assert np.diag(D).max() < 1e-6

    def test_bad_input(self):
        X = random_images((5, 6, 6))
        with pytest.raises(ValueError, match="n_neighbors"):
            class_averages(X, n_neighbors=5)
        with pytest.raises(ValueError, match="labels"):
            class_averages(X, labels=[0, 1])
        with pytest.raises(ValueError, match="X"):
            class_averages(np.full((5, 6, 6), np.nan))


class TestCommandLine:
    """``--reflection`` on the command line: the mirror bit reaches the files it writes."""

    @pytest.fixture()
    def mirrored(self, tmp_path):
        rng = np.random.default_rng(3)
        a = random_images((11, 11), seed=21, border=2)
        b = random_images((11, 11), seed=22, border=2)
        p = np.c_[rng.uniform(-180, 180, 12), np.zeros((12, 2)), np.tile([0, 1], 6)]
        X = warp_se2(np.stack([a] * 6 + [b] * 6), p).astype(np.float32)
        np.save(tmp_path / "x.npy", X)
        return tmp_path, p[:, 3]

    def test_fit_writes_the_mirror_column(self, mirrored, capsys):
        import csv

        from _cli import call

        d, bits = mirrored
        proc = call(capsys, "fit", d / "x.npy", "--reflection", "--device", "cpu", "--quiet",
                    "--out", d / "out")
        assert proc.returncode == 0, proc.stderr
        with open(d / "out" / "alignments.csv") as f:
            rows = list(csv.DictReader(f))
        labels = [int(r["label"]) for r in rows]
        assert len(set(labels[:6])) == 1 and len(set(labels[6:])) == 1 and labels[0] != labels[6]
        mirror = np.array([int(r["mirrored"]) for r in rows])
        # within a cluster the bit onto the mean is the copy's own bit, or its complement for
        # every copy (the mean may be either hand)
        for sl in (slice(0, 6), slice(6, 12)):
            assert (mirror[sl] == bits[sl]).all() or (mirror[sl] != bits[sl]).all()

    def test_fit_without_it_writes_no_mirror_column(self, mirrored, capsys):
        import csv

        from _cli import call

        d, _ = mirrored
        assert call(capsys, "fit", d / "x.npy", "--n-clusters", "2", "--device", "cpu",
                    "--quiet", "--out", d / "out").returncode == 0
        with open(d / "out" / "alignments.csv") as f:
            assert "mirrored" not in next(csv.reader(f))

    def test_neighbors_finds_the_mirror_images(self, mirrored, capsys):
        from _cli import call

        d, bits = mirrored
        proc = call(capsys, "neighbors", d / "x.npy", "--reflection", "--n-neighbors", "5",
                    "--device", "cpu", "--quiet", "--out", d / "nn")
        assert proc.returncode == 0, proc.stderr
        ind = np.load(d / "nn" / "indices.npy")
        dist = np.load(d / "nn" / "distances.npy")
        tau = np.load(d / "nn" / "alignments.npy")
        assert tau.shape[-1] == 4
        # every image's 5 nearest others are the other copies of its shape, at distance ~0,
        # the mirror bit set exactly where the two copies are of opposite hands
        same = (ind[:, 1:] < 6) == (np.arange(12)[:, None] < 6)
        assert same.all()
        assert dist[:, 1:].max() < 0.05 * np.abs(np.load(d / "x.npy")).sum((1, 2)).mean()
        np.testing.assert_array_equal(tau[:, 1:, 3], bits[ind[:, 1:]] != bits[:, None])
