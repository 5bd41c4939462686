"""The large-n path: the approximate shortlist (faiss) and the progress bars."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _search import assert_shortlist_contract, count_calls
from _search import recall as _recall

from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import make_transformed
from invariant_cluster.search import approximate as approx_module
from invariant_cluster.search import (
    grid_search,
    make_search_grid,
    neighbor_search,
    shortlist,
    shortlist_descriptors,
)
from invariant_cluster.search import plan as plan_module
from invariant_cluster.search.approximate import approximate_shortlist


def _copies(smooth_images, n_protos, n_copies, size, seed):
    """Transformed copies (+-30 degrees, +-1 px) of smooth prototype images, float32."""
    protos = smooth_images(n_protos, size, seed=seed)
    X = np.repeat(protos, n_copies, axis=0)
    X, _ = make_transformed(X, max_rotation=30.0, max_translation=1, random_state=seed)
    return torch.as_tensor(X.astype(np.float32))[:, None]


@pytest.mark.parametrize("n_protos, n_copies, size", [(30, 10, 20), (24, 17, 24)])
def test_default_search_beyond_threshold_is_approximate_and_recalls_exact_top_k(
        smooth_images, monkeypatch, n_protos, n_copies, size):
    # the threshold patched low, so that the approximate path runs on a small set
    monkeypatch.setitem(plan_module.FAISS_MIN_KEYS, "cpu", 100)
    calls = count_calls(monkeypatch, approx_module, "approximate_shortlist")
    X = _copies(smooth_images, n_protos, n_copies, size, seed=n_protos)
    n = X.shape[0]
    grid = make_search_grid("se2", 30.0, 9, 1, refine=False)
    own = torch.arange(n)
    k = 15
    _, exact, _ = grid_search(X, X, grid, k=k, exclude=own)
    _, found, _, cand = neighbor_search(X, X, grid, k=k, exclude=own, return_candidates=True)
    assert calls, "the approximate shortlist did not run"
    assert cand.shape == (n, plan_module.default_n_candidates(k, n))
    assert not bool((cand == own[:, None]).any())
    assert _recall(exact, found) >= 0.95


@pytest.mark.parametrize("n_protos, n_copies, size, k", [(20, 12, 20, 10), (30, 9, 16, 6)])
def test_pass_over_the_neighbours_neighbours_recovers_missed_neighbours(
        smooth_images, n_protos, n_copies, size, k):
    X = _copies(smooth_images, n_protos, n_copies, size, seed=size)
    n = X.shape[0]
    grid = make_search_grid("se2", 30.0, 9, 1, refine=False)
    own = torch.arange(n)
    De, exact, _ = grid_search(X, X, grid, k=k, exclude=own)
    # a short shortlist: the descriptors alone miss some of the exact top-k
    kw = dict(k=k, exclude=own, n_candidates=k + 2)
    D0, I0, _ = neighbor_search(X, X, grid, hops=0, **kw)
    D1, I1, P1 = neighbor_search(X, X, grid, **kw)
    r0, r1 = _recall(exact, I0), _recall(exact, I1)
    assert r0 < 1.0 and r1 > r0
    # still a kNN list: ascending, distinct keys, never the query, each distance the pair's own
    assert bool((D1[:, 1:] >= D1[:, :-1]).all())
    srt = I1.sort(1).values
    assert not bool((srt[:, 1:] == srt[:, :-1]).any())
    assert not bool((I1 == own[:, None]).any())
    assert bool((D1 <= D0 + 1e-4).all()), "a row got worse"
    for i in (0, n // 2, n - 1):  # each distance is the pair's own grid distance
        Dp, _ = grid_search(X[i:i + 1], X[I1[i]], grid)
        assert torch.allclose(D1[i], Dp[0].clamp(min=0), rtol=1e-4, atol=1e-4)
    # another query set than the keys: no pass (the keys' own neighbours are unknown)
    Dq, Iq, _ = neighbor_search(X[:7].clone(), X, grid, k=k, n_candidates=k + 2)
    Dq0, Iq0, _ = neighbor_search(X[:7].clone(), X, grid, k=k, n_candidates=k + 2, hops=0)
    assert torch.equal(Iq, Iq0)


def _random_descriptors(seed, n, copies, d):
    """Query and key descriptors ``(n, U, d)``, ``(n, V, d)`` of Gaussian noise, and the
    index of each query's own key."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, copies[0], d, generator=g), torch.randn(n, copies[1], d, generator=g),
            torch.arange(n))


def test_approximate_shortlist_contract_and_agreement_with_the_exact_shortlist():
    n, m = 500, 40
    Xd, Yd, own = _random_descriptors(seed=3, n=n, copies=(4, 3), d=16)
    exact = shortlist(Xd, Yd, m, exclude=own)
    cand = approximate_shortlist(Xd, Yd, m, exclude=own)
    assert_shortlist_contract(cand, n, m, own)
    assert _recall(exact[:, :10], cand) >= 0.9


def test_rows_the_graph_search_leaves_short_fall_back_to_the_exact_shortlist(monkeypatch):
    # one graph entry per query copy: most rows hold fewer distinct keys than asked
    monkeypatch.setattr(approx_module, "_ENTRIES_PER_CANDIDATE", 0.01)
    n, m = 300, 30
    Xd, Yd, own = _random_descriptors(seed=5, n=n, copies=(2, 2), d=12)
    cand = approximate_shortlist(Xd, Yd, m, exclude=own)
    exact = shortlist(Xd, Yd, m, exclude=own)
    assert torch.equal(cand, exact)


def test_short_rows_are_asked_again_before_the_exact_fallback(monkeypatch):
    # few graph entries per query copy: the first ask leaves rows short of distinct keys, the
    # second (3x the entries) serves them without comparing them with every key
    monkeypatch.setattr(approx_module, "_ENTRIES_PER_CANDIDATE", 1.0)
    n, m = 400, 30
    Xd, Yd, own = _random_descriptors(seed=7, n=n, copies=(3, 2), d=12)
    asked = []
    real = approx_module._distinct_keys
    monkeypatch.setattr(approx_module, "_distinct_keys",
                        lambda *a: asked.append(a[2]) or real(*a))

    def no_exact(*a, **k):
        raise AssertionError("the exact fallback ran")

    monkeypatch.setattr(approx_module, "shortlist", no_exact)  # the name its fallback calls
    cand = approximate_shortlist(Xd, Yd, m, exclude=own)
    assert len(asked) >= 2 and asked[1] == 3 * asked[0]
    assert_shortlist_contract(cand, n, m, own)
    monkeypatch.undo()
    assert _recall(shortlist(Xd, Yd, m, exclude=own)[:, :10], cand) >= 0.9


def test_rotations_on_the_query_side_give_the_same_shortlist(smooth_images):
    X = _copies(smooth_images, 12, 5, 20, seed=1)
    grid = make_search_grid("rotation", 60.0, 13, refine=False)
    Xk, Yk = shortlist_descriptors(X, X, grid, rotate="keys")
    Xq, Yq = shortlist_descriptors(X, X, grid, rotate="queries")
    assert Yq.shape[1] == 1 and Xq.shape[1] == Yk.shape[1]
    own = torch.arange(X.shape[0])
    a = shortlist(Xk, Yk, 10, exclude=own)
    b = shortlist(Xq, Yq, 10, exclude=own)
    assert torch.equal(a.sort(1).values, b.sort(1).values)
    with pytest.raises(ValueError, match="rotate"):
        shortlist_descriptors(X, X, grid, rotate="both")


def _fit(verbose, smooth_images):
    X = _copies(smooth_images, 4, 6, 16, seed=2).numpy()
    est = InvariantAttentionClusterer(n_clusters=4, max_rotation=30.0, n_rotations=5,
                                      max_translation=1, random_state=0, verbose=verbose)
    return est.fit(X)


def test_progress_bars_show_with_verbose(smooth_images, capsys):
    _fit(1, smooth_images)
    err = capsys.readouterr().err
    for stage in ("exact search", "attention iteration", "grouping", "cluster centres"):
        assert stage in err


def test_no_progress_by_default(smooth_images, capsys):
    _fit(0, smooth_images)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


@pytest.mark.parametrize("n_protos, n_copies, size", [(12, 12, 16), (9, 25, 14)])
def test_union_searches_the_means_with_the_plain_shortlist(smooth_images, monkeypatch,
                                                           n_protos, n_copies, size):
    # beyond the approximate threshold (patched low) the samples' search keeps max(6 k, 96)
    # candidates and the means' search of the union max(4 k, 64): the same shortlists the
    # knn_search of each receives
    import invariant_cluster.cluster as cluster_module

    monkeypatch.setitem(plan_module.FAISS_MIN_KEYS, "cpu", 100)
    monkeypatch.setitem(plan_module.EXACT_WORK, "cpu", 100)
    seen = []
    real = cluster_module.knn_search

    def spy(Q, K, grid, k, **kwargs):
        seen.append(kwargs["plan"])
        return real(Q, K, grid, k, **kwargs)

    monkeypatch.setattr(cluster_module, "knn_search", spy)
    # distinct digits (copies would be collapsed onto their shapes, a set too small for the
    # shortlist): scikit-learn's 8 x 8 digits, upsampled to ``size``
    from scipy.ndimage import zoom

    from invariant_cluster.datasets import load_digits_images

    digits = load_digits_images().images[:n_protos * n_copies].astype(np.float64)
    X = np.stack([zoom(d, size / 8, order=1) for d in digits]).astype(np.float32)
    est = InvariantAttentionClusterer(n_clusters=n_protos, max_rotation=30.0, n_rotations=9,
                                      max_translation=1, graph="both", random_state=0,
                                      device="cpu").fit(X)  # the CPU's thresholds, patched
    k = est.n_neighbors
    n = X.shape[0]
    assert [p.n_candidates for p in seen] == [max(6 * k, 96), max(4 * k, 64)]
    assert [p.hops for p in seen] == [plan_module.HOP_NEIGHBORS, 0]
    assert seen[0] == est.search_plan_ and est.search_plan_.shortlist == "faiss"
    assert est.search_plan_.n_keys == n
    assert est.graph_ == "both"
