"""Device limits are the warp owner's job: every ``grid_sample`` call stays below cuDNN's batch
limit (65,536 images, PyTorch issue 88380) whatever the data size.

On the CPU the limit is simulated: ``torch.nn.functional.grid_sample`` is replaced by a version
that raises, as cuDNN does, on a batch of 65,536 images or more (or on an input, grid or output
of 2**31 elements, beyond 32-bit indexing).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import invariant_cluster._memory as _memory
from invariant_cluster import InvariantAttentionClusterer, InvariantKNeighborsTransformer
from invariant_cluster._utils import resolve_device
from invariant_cluster.transforms import fast_warp, warp_se2

pytestmark = pytest.mark.usefixtures("torch_single_thread")

CUDNN_BATCH_LIMIT = 65536


def _guard(monkeypatch, limit):
    """Make ``grid_sample`` refuse batches of ``limit`` images or more; return the batches."""
    real = F.grid_sample
    batches = []

    def grid_sample(input, grid, *args, **kwargs):
        if input.shape[0] >= limit:
            raise RuntimeError(f"CUDNN_STATUS_NOT_SUPPORTED: grid_sample on a batch of "
                               f"{input.shape[0]} images (limit {limit})")
        if max(input.numel(), grid.numel(), input.shape[1] * grid[0, ..., 0].numel()) >= 2 ** 31:
            raise RuntimeError("grid_sample: input too large for 32-bit indexing")
        batches.append(input.shape[0])
        return real(input, grid, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "grid_sample", grid_sample)
    return batches


def _digits(n, size, seed):
    """``n`` images of 3 shapes (a bar, a corner, a dot pair), each randomly turned."""
    rng = np.random.default_rng(seed)
    base = np.zeros((3, size, size), np.float32)
    c = size // 2
    base[0, 2:size - 2, c] = 1.0
    base[1, 2, 2:size - 2] = 1.0
    base[1, 2:size - 2, 2] = 1.0
    base[2, c - 2, c - 2] = base[2, c + 1, c + 1] = 1.0
    labels = rng.integers(0, 3, n)
    params = np.c_[rng.uniform(-180, 180, n), np.zeros((n, 2))]
    X = warp_se2(base[labels], params) + 0.05 * rng.random((n, size, size), dtype=np.float32)
    return X.reshape(n, -1), labels


def _thirds(idx, dist, idx_means, dist_means, n_clusters, graph, grouping, seed, sizes=None,
            complete_distances=None):
    """A stand-in for the grouping: three clusters by index (the warps are what is tested)."""
    return np.arange(idx.shape[0]) % 3, "samples", "given"


def test_clusterer_on_10000_images_stays_below_the_batch_limit(monkeypatch):
    import invariant_cluster.cluster as cluster

    # the grouping (Leiden on the fuzzy graph) warps nothing and would take most of the time
    monkeypatch.setattr(cluster, "group", _thirds)
    batches = _guard(monkeypatch, CUDNN_BATCH_LIMIT)
    X, labels = _digits(10_000, 8, seed=0)
    # a small grid keeps the search short; the warps that trip the limit are the iteration's
    est = InvariantAttentionClusterer(group="rotation", n_rotations=4).fit(X)
    assert max(batches) < CUDNN_BATCH_LIMIT
    # the fit warped far more images than one call may hold: the split is what made it pass
    assert sum(batches) >= CUDNN_BATCH_LIMIT
    assert est.labels_.shape == (10_000,) and est.invariant_means_.shape == X.shape


def test_kneighbors_transformer_on_5000_images_stays_below_the_batch_limit(monkeypatch):
    batches = _guard(monkeypatch, CUDNN_BATCH_LIMIT)
    X, _ = _digits(5_000, 10, seed=1)
    G = InvariantKNeighborsTransformer().fit_transform(X)
    assert max(batches) < CUDNN_BATCH_LIMIT
    assert G.shape == (5_000, 5_000) and G.nnz == 5_000 * 6
    # each image is its own nearest neighbour, at distance 0 (stored first in its row)
    ind, dist = G.indices.reshape(5_000, 6), G.data.reshape(5_000, 6)
    assert np.array_equal(ind[:, 0], np.arange(5_000)) and np.all(dist[:, 0] == 0)
    assert np.all(dist[:, 1:] > 0)


def test_a_smaller_limit_is_honoured_and_splitting_changes_no_value(monkeypatch):
    X = torch.rand(1000, 1, 9, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    params = torch.rand(1000, 3, generator=torch.Generator().manual_seed(1),
                        dtype=torch.float64) * torch.tensor([360.0, 4.0, 4.0]) - torch.tensor(
        [180.0, 2.0, 2.0], dtype=torch.float64)
    whole = fast_warp(X, params)
    batches = _guard(monkeypatch, 100)
    monkeypatch.setattr(_memory, "GRID_SAMPLE_MAX_BATCH", 99)
    split = fast_warp(X, params)
    assert max(batches) <= 99 and sum(batches) == 1000
    assert torch.allclose(split, whole, rtol=0, atol=1e-12)
    turned = warp_se2(X, params)  # the kornia path is split too
    assert max(batches) <= 99 and torch.allclose(turned, whole, atol=1e-10)


def test_kneighbors_transformer_under_a_small_limit(monkeypatch):
    X, _ = _digits(1_500, 8, seed=2)
    expected = InvariantKNeighborsTransformer(n_neighbors=4).fit_transform(X)
    batches = _guard(monkeypatch, 512)
    monkeypatch.setattr(_memory, "GRID_SAMPLE_MAX_BATCH", 511)
    G = InvariantKNeighborsTransformer(n_neighbors=4).fit_transform(X)
    assert max(batches) < 512
    if resolve_device("auto").type == "cpu":
        assert (G != expected).nnz == 0
    else:
        # a card's matrix products pick their kernels by the blocks' shapes: the same
        # distances to the rounding of ||x||^2 + ||y||^2 - 2 <x, y> in float32 (an H200:
        # 1.3e-4 relative at a distance of 0.14; near ties may swap neighbours)
        rows = lambda A: np.sort(A.data.reshape(A.shape[0], -1), axis=1)  # noqa: E731
        np.testing.assert_allclose(rows(G), rows(expected), rtol=1e-3, atol=1e-5)


# --------------------------------------------------------------- the whole fit's memory estimate
@pytest.mark.parametrize("n, shape", [(40, (8, 8)), (150, (12, 10))])
def test_fit_estimate_covers_what_the_fit_keeps(n, shape):
    # the fitted arrays alone (computed from the fitted estimator, independently of the
    # estimate's terms) must be below the estimate, and the estimate grows with n
    X = np.random.default_rng(n).random((n, *shape)).astype(np.float32)
    est = InvariantAttentionClusterer(n_clusters=3, group="rotation", n_rotations=8,
                                      random_state=0, device="cpu").fit(X)
    kept = sum(a.nbytes for a in (X, est.invariant_means_, est.attention_weights_,
                                  est.neighbors_, est.alignments_, est.labels_))
    k = est.neighbors_.shape[1] - 1
    estimate = _memory.estimate_fit_bytes(n, X[0].size, k)
    assert kept < estimate
    assert _memory.estimate_fit_bytes(2 * n, X[0].size, k) > estimate
    # the count's search of the means' graph and the filter add to it
    assert _memory.estimate_fit_bytes(n, X[0].size, k, grouping_means=True) > estimate
    assert _memory.estimate_fit_bytes(n, X[0].size, k, filtered=True) > estimate


def test_fit_that_cannot_fit_fails_before_it_starts(monkeypatch):
    calls = []
    monkeypatch.setattr(_memory, "memory_budget", lambda device="cpu": 100_000)
    import invariant_cluster.cluster as cluster

    monkeypatch.setattr(cluster, "knn_search", lambda *a, **k: calls.append(1))
    X = np.random.default_rng(0).random((500, 16, 16)).astype(np.float32)
    with pytest.raises(_memory.InsufficientMemoryError,
                       match="InvariantAttentionClusterer.fit on 500 images"):
        InvariantAttentionClusterer(n_clusters=3, device="cpu").fit(X)
    assert not calls
    # it is a ValueError too: a request the machine cannot serve
    assert issubclass(_memory.InsufficientMemoryError, ValueError)
