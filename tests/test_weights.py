"""Samples that stand for several: ``sample_weight`` and the data stored more than once. A
weight of ``w`` fits as the image stored ``w`` times, a weight of 0 as the image left out, and a
shape's copies replaced by one of them weighted by their number fit as the copies do. Each test
compares a fit with the fit of the data it stands for."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _images import DATA, have_data
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score

from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_digits_images, make_transformed_copies

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _fit(X, sample_weight=None, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return InvariantAttentionClusterer(random_state=0, **params).fit(
            X, sample_weight=sample_weight)


def _digits():
    return load_digits_images().images.astype(np.float32)


def _copies(k, sizes, seed, noise=0.0):
    """``sizes[j]`` copies at any angle of each of ``k`` 8 x 8 digits picked by ``seed``, noise
    drawn after; and the digit each copy came from."""
    images = _digits()
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(images), k, replace=False)
    X = np.concatenate([make_transformed_copies(images[i], int(c), max_rotation=180,
                                                random_state=seed * 100 + j)[0]
                        for j, (i, c) in enumerate(zip(picks, sizes))])
    if noise:
        X = X + noise * rng.standard_normal(X.shape).astype(np.float32)
    return X.astype(np.float32), np.repeat(np.arange(k), sizes)


def _natural(n, seed):
    images = _digits()
    return images[np.random.default_rng(seed).choice(len(images), n, replace=False)]


SETS = {
    "copies": lambda: _copies(5, (3, 7, 1, 4, 12), seed=3),
    "noisy copies": lambda: _copies(4, (6, 2, 9, 4), seed=11, noise=0.1),
    "natural": lambda: (_natural(150, seed=5), None),
}


@pytest.mark.parametrize("name", list(SETS))
@pytest.mark.parametrize("n_clusters", [None, 4])
def test_integer_weights_fit_as_the_samples_repeated(name, n_clusters):
    X, _ = SETS[name]()
    rng = np.random.default_rng(len(X))
    w = rng.integers(1, 4, len(X))
    order = rng.permutation(len(X))
    repeated = _fit(np.repeat(X, w, axis=0), n_clusters=n_clusters)
    weighted = _fit(X[order], sample_weight=w[order], n_clusters=n_clusters)
    first = np.concatenate([[0], np.cumsum(w)[:-1]])  # each image's first repeat
    back = np.argsort(order)
    np.testing.assert_array_equal(weighted.labels_[back], repeated.labels_[first])
    np.testing.assert_array_equal(weighted.shape_labels_[back], repeated.shape_labels_[first])
    assert weighted.n_shapes_ == repeated.n_shapes_
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_,
                               rtol=1e-5, atol=1e-5)
    fresh = _natural(40, seed=99)
    np.testing.assert_array_equal(weighted.predict(fresh), repeated.predict(fresh))


@pytest.mark.parametrize("name", list(SETS))
def test_predict_of_the_data_stored_twice(name):
    # an image stored twice is one neighbour that votes twice: the vote does not change
    X, _ = SETS[name]()
    order = np.random.default_rng(1).permutation(2 * len(X))
    once = _fit(X, n_clusters=4)
    twice = _fit(np.concatenate([X, X])[order], n_clusters=4)
    fresh = _natural(60, seed=7)
    np.testing.assert_array_equal(once.predict(fresh), twice.predict(fresh))


@pytest.mark.skipif(not have_data("mnist"), reason="shared MNIST not present")
@pytest.mark.parametrize("exact, n_clusters", [(True, None), (True, 3), (False, None)])
@pytest.mark.parametrize("seed, sizes", [(3, (4,) * 6), (8, (2, 9, 3, 1, 6)),
                                         (5, (3, 12, 2, 5, 7, 4, 1, 8))])
def test_copies_replaced_by_one_of_them_weighted(exact, n_clusters, seed, sizes):
    # MNIST digits in groups of copies of several sizes (exact: quarter turns and repeats;
    # else at any angle), each group replaced by one of its copies weighted by the group's
    # size: the same clusters of the groups. (At any angle with a count given that ties
    # unrelated digits, the copy kept, in its own pose, may tip the tie.)
    from invariant_cluster.datasets import load_mnist

    images = load_mnist("test", data_home=DATA).images.astype(np.float32)
    images = images / 255.0 if images.max() > 1 else images
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(images), len(sizes), replace=False)
    if exact:
        X = np.concatenate([[np.rot90(images[i], j % 4) for j in range(c)]
                            for i, c in zip(picks, sizes)])
    else:
        X = np.concatenate([make_transformed_copies(images[i], c, max_rotation=180,
                                                    random_state=seed * 10 + j)[0]
                            for j, (i, c) in enumerate(zip(picks, sizes))])
    y = np.repeat(np.arange(len(sizes)), sizes)
    full = _fit(X.astype(np.float32), n_clusters=n_clusters)
    assert full.n_shapes_ == len(sizes) and adjusted_rand_score(y, full.shape_labels_) == 1.0
    one = np.array([rng.choice(np.flatnonzero(y == g)) for g in range(len(sizes))])
    reduced = _fit(X[one].astype(np.float32), sample_weight=np.asarray(sizes, dtype=float),
                   n_clusters=n_clusters)
    assert reduced.n_clusters_ == full.n_clusters_
    assert adjusted_rand_score(full.labels_[one], reduced.labels_) == 1.0


@pytest.mark.parametrize("n_clusters", [None, 3])
def test_weight_zero_is_the_sample_left_out(n_clusters):
    X, _ = _copies(4, (5, 3, 6, 4), seed=21)
    w = np.random.default_rng(0).integers(0, 3, len(X)).astype(float)
    kept = np.flatnonzero(w > 0)
    left = np.flatnonzero(w == 0)
    est = _fit(X, sample_weight=w, n_clusters=n_clusters)
    alone = _fit(X[kept], sample_weight=w[kept], n_clusters=n_clusters)
    np.testing.assert_array_equal(est.labels_[kept], alone.labels_)
    np.testing.assert_array_equal(est.shape_labels_[kept], alone.shape_labels_)
    np.testing.assert_allclose(est.cluster_centers_, alone.cluster_centers_)
    np.testing.assert_array_equal(est.neighbors_[kept], kept[alone.neighbors_])
    # the left-out samples: predict's label, no shape, no part in the attention
    np.testing.assert_array_equal(est.labels_[left], alone.predict(X[left]))
    assert (est.shape_labels_[left] == -1).all() and (est.neighbors_[left] == -1).all()
    assert np.isnan(est.invariant_means_[left]).all()
    assert np.isnan(est.alignments_[left]).all()
    assert np.isfinite(est.invariant_means_[kept]).all()


@pytest.mark.parametrize("weights, error, match", [
    (lambda n: -np.ones(n), ValueError, "sample_weight: expected non-negative"),
    (lambda n: np.r_[np.nan, np.ones(n - 1)], ValueError, "sample_weight: expected finite"),
    (lambda n: np.ones(n + 1), ValueError, r"sample_weight: expected shape \(20,\)"),
    (lambda n: np.ones((n, 1)), ValueError, r"sample_weight: expected shape \(20,\)"),
    (lambda n: np.zeros(n), ValueError, "sample_weight: expected at least one positive"),
    (lambda n: ["heavy"] * n, TypeError, "sample_weight: expected an array of numbers"),
])
def test_bad_sample_weight_is_refused_by_name(weights, error, match):
    X, _ = _copies(4, (5,) * 4, seed=2)
    with pytest.raises(error, match=match):
        InvariantAttentionClusterer().fit(X, sample_weight=weights(len(X)))


def test_weights_of_one_fit_as_none():
    X, _ = _copies(3, (4, 2, 5), seed=4)
    a = _fit(X)
    b = _fit(X, sample_weight=np.ones(len(X)))
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.invariant_means_, b.invariant_means_)
