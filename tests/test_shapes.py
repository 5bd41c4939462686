"""The two levels of a fit: shapes (groups of transformed copies of one image) and clusters
(groups of shapes). Each test asserts against the data's own truth: the image each copy was
made from, the exact group elements that made it, or a fit of the data as it was."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _images import DATA, have_data
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score

from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import make_transformed_copies

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _fit(X, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return InvariantAttentionClusterer(random_state=0, **params).fit(X)


def _mnist():
    from invariant_cluster.datasets import load_mnist

    images = load_mnist("test", data_home=DATA).images.astype(np.float32)
    return images / 255.0 if images.max() > 1 else images


def _copy_set(images, k, sizes, seed, noise=0.0, shift=0):
    """``sizes[j]`` copies at any angle (within +-``shift`` px) of each of ``k`` images picked
    by ``seed``; noise drawn after; and the image each copy came from."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(images), k, replace=False)
    X = np.concatenate([make_transformed_copies(images[i], int(c), max_rotation=180,
                                                max_translation=shift,
                                                random_state=seed * 1000 + j)[0]
                        for j, (i, c) in enumerate(zip(picks, sizes))])
    if noise:
        X = X + noise * rng.standard_normal(X.shape)
    return X.astype(np.float32), np.repeat(np.arange(k), sizes)


def _same_partition(a, b):
    return adjusted_rand_score(a, b) == 1.0


# ------------------------------------------------------------------ exact copies
@pytest.mark.parametrize("k, c", [(2, 3), (6, 5), (12, 8)])
def test_exact_quarter_turns_are_one_shape_each(k, c):
    from invariant_cluster.datasets import load_digits_images

    images = load_digits_images().images.astype(np.float32)
    picks = np.random.default_rng(k).choice(len(images), k, replace=False)
    X = np.concatenate([np.stack([np.rot90(images[i], j % 4) for j in range(c)])
                        for i in picks])
    y = np.repeat(np.arange(k), c)
    est = _fit(X)
    assert est.n_shapes_ == k and _same_partition(y, est.shape_labels_)
    assert est.n_clusters_ == k and _same_partition(y, est.labels_)
    assert est.count_rule_ == "shapes"
    # each shape's mean is its (filtered) image in one of its quarter turns: exact copies
    # average to themselves
    Xf = est.filter_.transform(X).reshape(X.shape)
    for s in range(k):
        first = Xf[np.flatnonzero(est.shape_labels_ == s)[0]]
        assert min(np.abs(est.shape_means_[s] - np.rot90(first, r).ravel()).max()
                   for r in range(4)) < 1e-4


@pytest.mark.parametrize("seed, k, sizes", [(3, 8, (3, 4, 2, 5, 3, 4, 6, 1)),
                                           (17, 12, (4,) * 12), (29, 10, (2, 9) * 5)])
def test_exact_copies_of_small_digits_are_their_images(seed, k, sizes):
    # 8 x 8 digits whose detail the noise estimate reads as noise: their exact copies scatter
    # not at all, so no noise joins two of them (groups of several sizes, one single image)
    from invariant_cluster.datasets import load_digits_images

    images = load_digits_images().images.astype(np.float32)
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(images), k, replace=False)
    X = np.concatenate([np.stack([np.rot90(images[i], int(r)) for r in rng.permutation(4)[:c]]
                                 if c <= 4 else
                                 [np.rot90(images[i], j % 4) for j in range(c)])
                        for i, c in zip(picks, sizes)])
    y = np.repeat(np.arange(k), sizes)
    order = rng.permutation(len(X))
    est = _fit(X[order])
    assert est.noise_std_ > 0
    assert est.n_shapes_ == k and _same_partition(y[order], est.shape_labels_)
    assert est.n_clusters_ == k and _same_partition(y[order], est.labels_)


def test_noise_shares_are_the_gamma_laws_extremes():
    from scipy.stats import gamma

    from invariant_cluster._shapes import Noise

    noise = Noise(power=2.0, power_std=0.5)
    shape, scale = (1 / 0.25) ** 2, 0.25 ** 2
    assert noise.lowest_share(9) == pytest.approx(gamma.ppf(0.1, shape, scale=scale))
    assert noise.highest_share(9) == pytest.approx(gamma.ppf(0.9, shape, scale=scale))
    assert noise.lowest_share(9) < 1 < noise.highest_share(9)
    assert Noise().lowest_share(9) == Noise().highest_share(9) == 1.0


def test_given_count_on_exact_copies():
    from invariant_cluster.datasets import load_digits_images

    images = load_digits_images().images.astype(np.float32)[:6]
    X = np.concatenate([np.stack([np.rot90(x, r) for r in range(4)] + [x]) for x in images])
    y = np.repeat(np.arange(6), 5)
    est = _fit(X, n_clusters=6)
    assert est.n_shapes_ == 6 and _same_partition(y, est.labels_)


# ------------------------------------------------------------------ copies at any angle
@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
@pytest.mark.parametrize("k, sizes, noise, shift, seed", [
    (2, (3, 20), 0.0, 0, 41), (5, (4, 4, 12, 12, 40), 0.0, 0, 42),
    (8, (3, 5, 7, 9, 11, 13, 15, 17), 0.1, 0, 43), (12, (6,) * 12, 0.1, 0, 44),
    (4, (10, 3, 25, 6), 0.0, 2, 45),
    # more noisy copies than the shortest edge's cap keeps together: pieces joined by means
    (3, (60, 80, 100), 0.1, 0, 48),
    (6, (40,) * 6, 0.1, 2, 49)])
def test_copies_at_any_angle_are_their_shapes(k, sizes, noise, shift, seed):
    X, y = _copy_set(_mnist(), k, sizes, seed, noise, shift)
    est = _fit(X, max_translation=shift)
    assert est.n_shapes_ == k
    assert adjusted_rand_score(y, est.shape_labels_) >= 0.95
    assert est.n_clusters_ == k and adjusted_rand_score(y, est.labels_) >= 0.95
    given = _fit(X, max_translation=shift, n_clusters=k)
    assert adjusted_rand_score(y, given.labels_) >= 0.95


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
@pytest.mark.parametrize("seed", [60, 61, 62, 63])
@pytest.mark.parametrize("k, sizes", [(8, (3,) * 8), (5, (4, 12, 3, 40, 6)), (12, (3,) * 12)])
def test_clean_shifted_copies_are_their_shapes(k, sizes, seed):
    # centring moves each copy by its own fraction of a pixel: on the centred images two
    # copies differ by three interpolations, on the images as given by one, as copies that
    # are not centred do, which the edge's own round trip bounds
    X, y = _copy_set(_mnist(), k, sizes, seed, shift=2)
    est = _fit(X, max_translation=2)
    assert est.center_ is True
    assert est.n_shapes_ == k and _same_partition(y, est.shape_labels_)
    assert est.n_clusters_ == k and _same_partition(y, est.labels_)


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
@pytest.mark.parametrize("seed", [60, 61])
def test_clean_shifted_mirrored_copies_are_their_shapes(seed):
    # every other copy mirrored: the alignment composed with the centring shifts keeps its
    # mirror (E(2))
    X, y = _copy_set(_mnist(), 5, (4, 3, 6, 3, 5), seed, shift=2)
    X[::2] = X[::2, :, ::-1]
    est = _fit(X, max_translation=2, reflection=True)
    assert est.center_ is True
    assert est.n_shapes_ == 5 and _same_partition(y, est.shape_labels_)
    assert est.n_clusters_ == 5 and _same_partition(y, est.labels_)


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
@pytest.mark.parametrize("k, c, seed", [(3, 4, 51), (6, 3, 52), (10, 8, 53)])
def test_exact_turns_and_shifts_of_centred_images_are_one_shape_each(k, c, seed):
    # quarter turns and whole-pixel shifts are exact group elements, whatever fraction of a
    # pixel the centring moves each copy by
    rng = np.random.default_rng(seed)
    images = _mnist()
    # digits 2 px or more from the frame, which the shifts of 2 px keep whole
    ink = images > 0
    rows, cols = ink.any(2), ink.any(1)
    inside = ~(rows[:, :2].any(1) | rows[:, -2:].any(1) | cols[:, :2].any(1)
               | cols[:, -2:].any(1))
    picks = rng.choice(np.flatnonzero(inside), k, replace=False)
    X = np.stack([np.roll(np.rot90(images[i], j % 4), tuple(rng.integers(-2, 3, 2)), (0, 1))
                  for i in picks for j in range(c)])
    y = np.repeat(np.arange(k), c)
    est = _fit(X, max_translation=2)
    assert est.center_ is True
    assert est.n_shapes_ == k and _same_partition(y, est.shape_labels_)
    assert est.n_clusters_ == k and _same_partition(y, est.labels_)


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
@pytest.mark.parametrize("k, seed", [(4, 70), (8, 71)])
def test_copies_within_the_searched_range_of_one_image_are_its_shape(k, seed):
    # each copy within +-15 degrees and +-1 px of its image, the copies up to 28 degrees and
    # 2 px apart, not centred: the copies' refinement spans the range two searched
    # transformations compose to (before it, every copy was a shape of its own)
    import torch

    from invariant_cluster.transforms import warp_se2

    images = _mnist()
    picks = np.random.default_rng(seed).choice(len(images), k, replace=False)
    base = torch.as_tensor(images[picks][:, None])
    poses = [(-14.0, -1.0, 0.9), (14.0, 1.0, -0.9), (0.0, 0.9, 1.0)]
    X = torch.cat([warp_se2(base, torch.tensor([p] * k)) for p in poses], 1)
    X = X.reshape(k * len(poses), 28, 28).numpy()
    y = np.repeat(np.arange(k), len(poses))
    est = _fit(X, max_rotation=15, n_rotations=7, max_translation=1, center=False)
    assert est.n_shapes_ == k and _same_partition(y, est.shape_labels_)
    assert est.n_clusters_ == k and _same_partition(y, est.labels_)


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
def test_noise_is_measured_before_centring():
    # centring shifts each image by a fraction of a pixel, whose interpolation takes the
    # noise's highest frequencies, where it is read (0.035 for 0.1 when read after)
    from invariant_cluster.denoise import estimate_noise_std

    X, _ = _copy_set(_mnist(), 4, (30,) * 4, 50, noise=0.1, shift=2)
    est = _fit(X, max_translation=2)
    assert est.center_ is True
    assert est.noise_std_ == pytest.approx(estimate_noise_std(X[:, None]))
    assert est.noise_std_ == pytest.approx(0.1, rel=0.1)


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
def test_natural_images_are_shapes_of_their_own():
    from invariant_cluster.datasets import make_transformed

    images = _mnist()
    X, _ = make_transformed(images[np.random.default_rng(0).choice(len(images), 600,
                                                                   replace=False)],
                            max_rotation=45, random_state=0)
    est = _fit(X.astype(np.float32), max_rotation=60, n_rotations=24)
    assert est.n_shapes_ >= 0.98 * len(X)
    assert est.count_rule_ == "modularity"


def _moved(image, dy, dx):
    """``image`` moved by whole pixels in its frame: what leaves the frame is lost, what
    enters it is zero (no interpolation)."""
    out = np.zeros_like(image)
    h, w = image.shape
    out[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        image[max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def _fields(k, seed):
    """``k`` smooth random 28 x 28 images that fill their frames to the edges."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(seed)
    return gaussian_filter(rng.standard_normal((k, 28, 28)), sigma=(0, 2, 2)).astype(np.float32)


def test_the_copy_test_compares_the_pixels_both_frames_hold():
    # two whole-pixel moves of one frame-filling image: aligned, they differ only where one
    # frame lost what the other holds (the float64 sum below), and not at all on the pixels
    # the warp keeps inside the moved copy's frame
    import torch

    from invariant_cluster._shapes import align, kept_distances, pair_distances
    from invariant_cluster.search import make_search_grid

    x = _fields(1, 3)[0]
    X = torch.as_tensor(np.stack([x, _moved(x, 0, 2)])[:, None])
    grid = make_search_grid("translation", max_translation=3, refine=False,
                            image_shape=(1, 28, 28))
    p = align(X[:1], X[1:], grid, grid)
    assert torch.equal(p, torch.tensor([[0.0, -2.0, 0.0]]))
    i, j = torch.tensor([0]), torch.tensor([1])
    lost = float((x[:, 26:].astype(np.float64) ** 2).sum())
    assert float(pair_distances(X, i, j, p)[0]) == pytest.approx(lost, rel=1e-4)
    assert float(kept_distances(X, i, j, p)[0]) <= 1e-8 * lost


@pytest.mark.parametrize("mirror", [False, True])
@pytest.mark.parametrize("dy, dx", [(0, 2), (2, -1), (-1, -2)])
def test_the_copies_refinement_on_the_kept_pixels_finds_whole_pixel_moves(dy, dx, mirror):
    # the whole frame's residual is lowest where the moved copy loses less of the frame (a
    # 2 px move refined to 1.7 px); on the pixels the warp keeps, the move itself is the
    # minimum, and the refinement's distance is the kept distance at what it returns
    import torch

    from invariant_cluster._shapes import kept_distances
    from invariant_cluster.search import make_search_grid, refine_pairs

    x = _fields(1, 3)[0]
    y = _moved(x, dy, dx)
    # with a mirror bit, the key is stored mirrored and the bit stays as it is
    X = torch.as_tensor(np.stack([x, y[:, ::-1] if mirror else y])[:, None].copy())
    grid = make_search_grid("se2", max_rotation=30, n_rotations=7, max_translation=3,
                            image_shape=(1, 28, 28))
    i, j = torch.tensor([0]), torch.tensor([1])
    move = torch.tensor([[0.0, -dx, -dy] + ([1.0] if mirror else [])])
    start = move + torch.tensor([[3.0, 0.3, -0.3] + ([0.0] if mirror else [])])
    _, whole = refine_pairs(X, X, i, j, start, grid)
    d, kept = refine_pairs(X, X, i, j, whole, grid, kept=True)
    assert float((whole - move).abs().max()) > 0.1
    np.testing.assert_allclose(kept.numpy(), move.numpy(), atol=0.01)
    assert float(d[0]) == pytest.approx(float(kept_distances(X, i, j, kept)[0]), rel=1e-3,
                                        abs=1e-6)
    assert float(d[0]) <= 1e-4 * float((x.astype(np.float64) ** 2).sum())


@pytest.mark.parametrize("k, c, seed", [(5, 4, 0), (3, 9, 1)])
@pytest.mark.parametrize("noise_std", [
    0.0,
    pytest.param("auto", marks=pytest.mark.xfail(strict=True, reason=(
        "the noise estimate reads the smooth fields' detail as noise (power 0.022), and its "
        "filter makes the pixels near each frame depend on what that frame holds beyond "
        "them: at the exact moves, kept distances of 4e-4 to 2e-3 where the resampling "
        "leaves 0"))),
])
def test_copies_that_lose_different_parts_to_the_frame_are_one_shape(k, c, seed, noise_std):
    # frame-filling images, each in c whole-pixel moves within +-2 px: copies equal on the
    # pixels both frames hold (without the refinement on those pixels, 15 and 6 shapes)
    moves = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)]
    picks = np.random.default_rng(seed).permutation(len(moves))[:c]
    X = np.stack([_moved(f, *moves[m]) for f in _fields(k, 10 + seed) for m in picks])
    y = np.repeat(np.arange(k), c)
    est = _fit(X, max_translation=2, noise_std=noise_std)
    assert est.n_shapes_ == k and _same_partition(y, est.shape_labels_)
    assert est.n_clusters_ == k and _same_partition(y, est.labels_)


@pytest.mark.xfail(strict=True, reason=(
    "the copies' scatter about their pieces' means, measured on the whole frames, is beyond the "
    "largest draw of the noise, so the edges are tested again without the noise: 20 shapes"))
def test_noisy_copies_that_lose_different_parts_to_the_frame_are_one_shape():
    # the frame-filling copies above with white noise of a tenth of the fields' spread: the
    # clusters are right, and each copy is its own shape
    k, c = 5, 4
    moves = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)]
    picks = np.random.default_rng(0).permutation(len(moves))[:c]
    fields = _fields(k, 10)
    X = np.stack([_moved(f, *moves[m]) for f in fields for m in picks])
    X += (0.1 * fields.std() * np.random.default_rng(99).standard_normal(X.shape)).astype(
        np.float32)
    y = np.repeat(np.arange(k), c)
    est = _fit(X, max_translation=2)
    assert est.n_clusters_ == k and _same_partition(y, est.labels_)
    assert est.n_shapes_ == k and _same_partition(y, est.shape_labels_)


# ------------------------------------------------------------------ quotient invariance
@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
def test_a_fit_is_the_fit_of_its_shapes():
    X, y = _copy_set(_mnist(), 5, (6, 9, 4, 12, 7), seed=46)
    est = _fit(X)
    assert est.n_shapes_ == 5
    rng = np.random.default_rng(0)
    # stored twice, permuted, and with more copies of one image (at other angles)
    more = make_transformed_copies(X[0], 10, max_rotation=180, random_state=7)[0]
    for Z, truth in [(np.concatenate([X, X]), np.tile(est.labels_, 2)),
                     (X[perm := rng.permutation(len(X))], est.labels_[perm]),
                     (np.concatenate([X, more.astype(np.float32)]),
                      np.r_[est.labels_, np.full(10, est.labels_[0])])]:
        other = _fit(Z)
        assert other.n_shapes_ == 5
        assert _same_partition(truth, other.labels_)
        assert _same_partition(truth, other.shape_labels_)


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
def test_the_copies_means_and_poses_do_not_depend_on_the_memory_blocks(monkeypatch):
    # the shapes' means and the copies' poses align, warp and add a block of copies at a time
    # (_memory.pair_blocks); blocks of two images give the fit of one block
    from invariant_cluster import _memory

    X, y = _copy_set(_mnist(), 3, (7, 4, 9), seed=50)
    whole = _fit(X)
    monkeypatch.setattr(_memory, "REFINE_PAIR_ELEMENTS", 2 * X[0].size)
    assert _memory.pair_blocks(20, X[0].size)[1] == 2
    blocked = _fit(X)
    assert whole.n_shapes_ == blocked.n_shapes_ == 3
    np.testing.assert_array_equal(whole.shape_labels_, blocked.shape_labels_)
    np.testing.assert_array_equal(whole.labels_, blocked.labels_)
    for name in ("shape_means_", "invariant_means_", "cluster_centers_", "alignments_"):
        np.testing.assert_allclose(getattr(blocked, name), getattr(whole, name), atol=1e-4,
                                   err_msg=name)


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_the_copy_test_measures_only_edges_that_join_groups(monkeypatch, noise):
    # the copy test measures the kNN lists a window of columns at a time, only the edges
    # between groups the measured copy edges leave apart: the fit is the fit that measures
    # every edge at once, with at most half the edges measured
    from invariant_cluster import _shapes

    X, y = _copy_set(_mnist(), 3, (12, 30, 40), seed=51, noise=noise)
    measured = []
    measure = _shapes._CopyEdges.measure

    def counted(self, flat):
        measured.append(len(flat))
        return measure(self, flat)

    monkeypatch.setattr(_shapes._CopyEdges, "measure", counted)
    windowed = _fit(X)
    n_windowed = sum(measured)
    measured.clear()
    monkeypatch.setattr(_shapes, "_FIRST_WINDOW", 1 << 20)
    whole = _fit(X)
    assert len(measured) == 1  # every edge that may be a copy's, in one window
    assert n_windowed <= 0.5 * measured[0]
    assert windowed.n_shapes_ == whole.n_shapes_ == 3
    assert _same_partition(windowed.shape_labels_, y)
    np.testing.assert_array_equal(windowed.labels_, whole.labels_)
    np.testing.assert_allclose(windowed.shape_means_, whole.shape_means_, atol=1e-4)


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
def test_jittered_copies_keep_the_partition():
    X, y = _copy_set(_mnist(), 4, (5, 8, 3, 6), seed=47)
    est = _fit(X)
    jitter = X + 1e-4 * np.random.default_rng(1).standard_normal(X.shape).astype(np.float32)
    both = _fit(np.concatenate([X, jitter]))
    assert both.n_shapes_ == est.n_shapes_
    assert _same_partition(np.tile(est.labels_, 2), both.labels_)


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
def test_the_shapes_graph_sees_past_each_shapes_copies():
    # 20 copies of each of 18 images: more copies than n_neighbors=15, and more shapes than a
    # neighbourhood; each sample's neighbours are other shapes, never its own copies
    X, y = _copy_set(_mnist(), 18, (20,) * 18, seed=48)
    est = _fit(X)
    assert est.n_shapes_ == 18
    nbrs = est.neighbors_[:, 1:]
    own = est.shape_labels_[:, None]
    assert np.all(est.shape_labels_[nbrs] != own)
    assert all(len(set(row)) == est.n_neighbors for row in est.shape_labels_[nbrs])


# ------------------------------------------------------------------ what a user sees
def test_plot_shapes_draws_every_shape_once():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from invariant_cluster.datasets import load_digits_images
    from invariant_cluster.plotting import plot_shapes

    images = load_digits_images().images.astype(np.float32)[:4]
    X = np.concatenate([np.stack([np.rot90(x, r) for r in range(4)]) for x in images])
    est = _fit(X)
    ax = plot_shapes(est)
    assert len(ax.images) == est.n_shapes_ == 4
    with pytest.raises(ValueError, match="max_shapes"):
        plot_shapes(est, max_shapes=0)


def _best_explained_case(alt_excess):
    # pieces: 0 of 4 images, 1 of 3, and single images 2, 3, 4; 2 passes into both pieces,
    # 3 and 4 into piece 0; the edges (2, 4) and (3, 4) join single images
    from invariant_cluster._shapes import _best_explained

    size = np.array([4, 3, 1, 1, 1])
    pairs = np.array([[0, 2], [1, 2], [0, 3], [0, 1], [0, 4]])
    excess = np.array([1.5, 1.2, 1.1, 0.9, 1.0])
    ok = np.ones(len(pairs), dtype=bool)
    a, b = np.array([2, 3]), np.array([4, 4])
    return _best_explained(pairs, size, excess, ok, a, b, np.array([alt_excess, 0.0]), 0.5)


def test_a_single_image_joins_the_piece_that_explains_it_best():
    # scores, each less the noise of a mean (s2 = 0.5): 2 -> 0: 1.5 - 0.5 (1 + 1/4) = 0.875,
    # 2 -> 1: 1.2 - 0.5 (1 + 1/3) = 0.533, 3 -> 0: 0.475, 4 -> 0: 0.375. Two pieces always
    # stay joined; 2 joins piece 1 only; the edge (3, 4) is no alternative for either, since
    # piece 0 takes both
    far = _best_explained_case(alt_excess=10.0)
    np.testing.assert_array_equal(far, [False, True, True, True, True])
    # image 4 nearer 2 (excess 1.2, less the noise of two images: 0.2) than piece 1's mean
    # explains 2 (0.533), and piece 1 does not take 4: 2 joins no piece; and 2 is nearer 4
    # than piece 0's mean explains 4 (0.375), so 4 joins none either
    near = _best_explained_case(alt_excess=1.2)
    np.testing.assert_array_equal(near, [False, False, True, True, False])


@pytest.mark.skipif(not have_data("mnist"), reason=f"MNIST not found under {DATA}")
@pytest.mark.parametrize("draw", range(6))
def test_noisy_even_sized_copies_stored_once_or_twice(draw):
    # 4 MNIST digits enlarged to 64 x 64, 6 copies each at any angle within +-2 px, noise 0.1
    # (draw: its seed), centred by the fit: the copies the cap leaves single join where each is
    # the other's best. On 6c24b46 the draws 0 to 5 gave 19, 15, 9, 9, 21 and 17 shapes; with
    # the pieces' scatter measured on 2 copies and its bound the largest of 2 draws, the draws
    # 1, 4 and 5 gave 5, 18 and 9 (the bound now covers as many draws as pairs it tests)
    import torch

    images = _mnist()[np.random.default_rng(5).choice(10000, 4, replace=False)]
    big = torch.nn.functional.interpolate(torch.as_tensor(images[:, None]), size=(48, 48),
                                          mode="bilinear").numpy()[:, 0]
    big = np.pad(big, ((0, 0), (8, 8), (8, 8)))
    X = np.concatenate([make_transformed_copies(b, 6, max_rotation=180, max_translation=2,
                                                random_state=10 + j)[0]
                        for j, b in enumerate(big)])
    y = np.repeat(np.arange(4), 6)
    X = (X + 0.1 * np.random.default_rng(100 + draw).standard_normal(X.shape)).astype(
        np.float32)
    for Z, truth in ((X, y), (np.concatenate([X, X[::-1]]), np.r_[y, y[::-1]])):
        est = _fit(Z, max_translation=2)
        assert est.center_ and est.n_shapes_ == 4
        assert _same_partition(truth, est.shape_labels_)
        assert _same_partition(truth, est.labels_)


def test_exact_quarter_turns_joined_by_the_defaults_are_split_by_their_count():
    # 12 8 x 8 digits x 8 quarter turns: two digits are one shape at the defaults (marked
    # above); with the count given they are split where their turns hold them least
    from invariant_cluster.datasets import load_digits_images

    images = load_digits_images().images.astype(np.float32)
    picks = np.random.default_rng(12).choice(len(images), 12, replace=False)
    X = np.concatenate([np.stack([np.rot90(images[i], j % 4) for j in range(8)])
                        for i in picks])
    y = np.repeat(np.arange(12), 8)
    est = _fit(X, n_clusters=12)
    assert est.n_shapes_ == 12 and _same_partition(y, est.shape_labels_)
    assert _same_partition(y, est.labels_)


# ------------------------------------------------------------------ a count above the shapes
def _line_images(points, k):
    """Flat 4 x 4 images of the values ``points`` and their exact kNN lists (no
    transformation: the identity group)."""
    import torch

    from invariant_cluster.alignment import make_search_grid

    X = torch.as_tensor(np.repeat(points, 16).reshape(-1, 1, 4, 4), dtype=torch.float64)
    d2 = (points[:, None] - points[None, :]) ** 2
    np.fill_diagonal(d2, np.inf)
    idx = torch.as_tensor(np.argsort(d2, axis=1, kind="stable")[:, :k])
    grid = make_search_grid("none", refine=False)
    return X, idx, grid


def test_a_count_above_the_shapes_splits_the_joined_shape():
    from invariant_cluster._split import split_to_count

    # three groups of 5 images, the first two joined into one shape; exact copies (distance
    # 0) make the third: split into 3, the joined shape is cut between its two groups
    points = np.r_[np.linspace(0, 1, 5), np.linspace(10, 11, 5), np.zeros(5) + 30.0]
    rep = np.r_[np.zeros(10, dtype=np.int64), np.full(5, 10)]
    X, idx, grid = _line_images(points, 6)
    split = split_to_count(X, rep, idx, 3, grid, grid)
    np.testing.assert_array_equal(split, np.repeat([0, 5, 10], 5))
    # as many shapes as the count, or more: unchanged
    np.testing.assert_array_equal(split_to_count(X, rep, idx, 2, grid, grid), rep)
    np.testing.assert_array_equal(split_to_count(X, rep, idx, 1, grid, grid), rep)
    # the order of the images changes no part
    perm = np.random.default_rng(0).permutation(15)
    X2, idx2, _ = _line_images(points[perm], 6)
    first = np.array([np.flatnonzero(rep[perm] == r).min() for r in rep[perm]])
    split = split_to_count(X2, first, idx2, 3, grid, grid)
    assert _same_partition(split, np.repeat([0, 1, 2], 5)[perm])


def test_a_count_above_the_images_splits_every_shape_into_its_images():
    from invariant_cluster._split import split_to_count

    points = np.r_[np.zeros(3), np.zeros(3) + 5.0]
    X, idx, grid = _line_images(points, 5)
    split = split_to_count(X, np.repeat([0, 3], 3), idx, 10, grid, grid)
    assert len(np.unique(split)) == 6


def test_a_large_joined_shape_is_split_by_the_sparse_eigensolver():
    import torch

    from invariant_cluster._split import _DENSE_EIGEN, split_to_count
    from invariant_cluster.alignment import make_search_grid

    # one shape of two blobs of 4 x 4 images (pixels drawn about two levels), more images
    # than the dense eigendecomposition takes, some kNN edges between the blobs
    m = _DENSE_EIGEN // 2 + 100
    rng = np.random.default_rng(0)
    Z = rng.standard_normal((2 * m, 16)) + np.repeat([0.0, 1.2], m)[:, None]
    d2 = ((Z[:, None] - Z[None]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    idx = np.argsort(d2, axis=1)[:, :10]
    y = np.repeat([0, 1], m)
    assert (y[idx] != y[:, None]).any()
    X = torch.as_tensor(Z.reshape(-1, 1, 4, 4))
    grid = make_search_grid("none", refine=False)
    split = split_to_count(X, np.zeros(2 * m, dtype=np.int64), torch.as_tensor(idx), 2, grid,
                           grid)
    assert adjusted_rand_score(y, split) > 0.9
