"""The search plan: which search runs for given sizes and device, recorded by the estimators."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _search import count_calls

from invariant_cluster import InvariantAttentionClusterer, InvariantKNeighborsTransformer
from invariant_cluster.search import knn_search, make_search_grid
from invariant_cluster.search import plan as plan_module
from invariant_cluster.search.plan import SearchPlan, make_search_plan


@pytest.mark.parametrize("device", ["cpu", "cuda", torch.device("cpu"), "mps"])
def test_exact_up_to_the_devices_work_limit(device):
    kind = torch.device(device).type
    limit = plan_module.EXACT_WORK.get(kind, plan_module.EXACT_WORK["cpu"])
    grid = 36
    n_exact = limit // grid
    p = make_search_plan(n_exact, n_exact, grid, 15, device=device)
    assert (p.method, p.shortlist, p.n_candidates, p.hops) == ("exact", "none", 0, 0)
    assert p.device == kind
    p = make_search_plan(n_exact + 1, n_exact + 1, grid, 15, device=device)
    assert p.method == "shortlist" and p.hops == plan_module.HOP_NEIGHBORS


def test_cuda_searches_exactly_where_the_cpu_shortlists():
    n, grid = 10_000, 36
    assert make_search_plan(n, n, grid, 15, device="cpu").method == "shortlist"
    assert make_search_plan(n, n, grid, 15, device="cuda").method == "exact"


@pytest.mark.parametrize("n, device, route, candidates", [
    (9_999, "cpu", "blocked", 64),
    (10_000, "cpu", "faiss", 96),
    (70_000, "cpu", "faiss", 96),
    (9_999, "cuda", "blocked", 96),      # on a card, the wider margin at every size
    (70_000, "cuda", "blocked", 96),     # the descriptor products stay on the card
    (199_999, "cuda", "blocked", 96),
    (200_000, "cuda", "faiss", 96),
])
def test_shortlist_route_per_device(n, device, route, candidates):
    p = make_search_plan(n, n, 63, 15, device=device, method="shortlist")
    assert (p.shortlist, p.n_candidates, p.approximate) == (route, candidates, route == "faiss")
    assert p.reason.startswith("shortlist: asked for")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_purposes(device):
    n, k = 70_000, 15
    means = make_search_plan(n, n, 63, k, device=device, purpose="means")
    graph = make_search_plan(n, n, 63, k, device=device, purpose="graph")
    assert (means.n_candidates, means.hops) == (64, 0)
    assert (graph.n_candidates, graph.hops) == (8 * k, plan_module.HOP_NEIGHBORS)
    # queries that are not the keys: no pass over the neighbours' neighbours
    other = make_search_plan(500, n, 63, k, device=device, self_search=False)
    assert other.hops == 0
    # a given length is kept, clipped to [k, n_keys]
    assert make_search_plan(n, n, 63, k, device=device, n_candidates=7).n_candidates == k
    assert make_search_plan(200, 200, 9999, k, device=device,
                            n_candidates=10 ** 6).n_candidates == 200


def test_forced_methods_and_bad_arguments():
    assert make_search_plan(10 ** 6, 10 ** 6, 999, 5, method="exact").method == "exact"
    assert make_search_plan(10, 10, 1, 5, method="shortlist").method == "shortlist"
    with pytest.raises(ValueError, match="method"):
        make_search_plan(10, 10, 1, 5, method="fast")
    with pytest.raises(ValueError, match="purpose"):
        make_search_plan(10, 10, 1, 5, purpose="other")


def _images(n, size=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, size, size, generator=g)


@pytest.mark.parametrize("method", ["auto", "exact", "shortlist"])
def test_knn_search_with_its_plan_is_the_search_without(method):
    X = _images(120)
    grid = make_search_grid("se2", 30.0, 5, 1, refine=False)
    own = torch.arange(120)
    plan = make_search_plan(120, 120, grid.size, 5, method=method, n_candidates=20)
    a = knn_search(X, X, grid, 5, method=method, n_candidates=20, exclude=own)
    b = knn_search(X, X, grid, 5, plan=plan, exclude=own)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_cuda_plan_keeps_the_shortlist_off_faiss(monkeypatch):
    """The device decision, on a stubbed device: a plan made for CUDA runs the blocked
    descriptor shortlist where the CPU's plan runs faiss (here on CPU tensors, thresholds
    lowered so that a small set crosses them)."""
    import invariant_cluster.search.approximate as approximate

    calls = count_calls(monkeypatch, approximate, "approximate_shortlist")
    monkeypatch.setitem(plan_module.FAISS_MIN_KEYS, "cpu", 100)
    X = _images(300, seed=1)
    grid = make_search_grid("se2", 30.0, 5, 1, refine=False)
    own = torch.arange(300)
    cpu = make_search_plan(300, 300, grid.size, 5, method="shortlist", device="cpu")
    cuda = make_search_plan(300, 300, grid.size, 5, method="shortlist", device="cuda")
    assert (cpu.shortlist, cuda.shortlist) == ("faiss", "blocked")
    knn_search(X, X, grid, 5, plan=cuda, exclude=own)
    assert not calls
    knn_search(X, X, grid, 5, plan=cpu, exclude=own)
    assert calls


def test_the_estimators_record_their_plan():
    rng = np.random.default_rng(0)
    X = rng.random((60, 10, 10)).astype(np.float32)
    est = InvariantAttentionClusterer(3, n_rotations=8, random_state=0).fit(X)
    assert isinstance(est.search_plan_, SearchPlan)
    # device="auto": the card where one is visible
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    assert est.search_plan_ == make_search_plan(60, 60, est._grid(refine=False).size,
                                                est.n_neighbors, device=kind)
    assert est.search_plan_.method == "exact"
    forced = InvariantAttentionClusterer(3, n_rotations=8, neighbor_search="shortlist",
                                         n_candidates=20, random_state=0).fit(X)
    assert (forced.search_plan_.method, forced.search_plan_.shortlist,
            forced.search_plan_.n_candidates) == ("shortlist", "blocked", 20)
    # copies are searched once: the plan is made for the distinct images
    doubled = InvariantAttentionClusterer(3, n_rotations=8, random_state=0).fit(
        np.concatenate([X, X]))
    assert doubled.search_plan_.n_keys == 60
    tr = InvariantKNeighborsTransformer(n_neighbors=5, n_rotations=8,
                                        neighbor_search="shortlist").fit(X)
    assert (tr.search_plan_.method, tr.search_plan_.n_keys) == ("shortlist", 60)
    assert tr.search_plan_.to_dict()["k"] == 5


@pytest.mark.parametrize("batch_size", [1, 3, 7, 50])
def test_batch_size_is_queries_per_block_in_the_candidate_search(monkeypatch, batch_size):
    """``batch_size`` means queries per block in every search: the candidate search splits its
    queries into blocks of ``batch_size`` (each block's keys sized by memory), with the same
    result as one block."""
    import invariant_cluster.search.candidates as cand_module
    from invariant_cluster.search import candidate_search

    g = torch.Generator().manual_seed(7)
    X = torch.rand(20, 1, 9, 9, generator=g, dtype=torch.float64)
    grid = make_search_grid("se2", 90.0, 6, 1, refine=False)
    ex = torch.arange(20)
    cand = torch.stack([torch.randperm(20, generator=g)[:8] for _ in range(20)])
    ref = candidate_search(X, X, cand, grid, k=4, exclude=ex)
    seen = []
    real = cand_module.blocked_map

    def spy(fn, blocks, **kwargs):
        blocks = list(blocks)  # a generator: each block is gathered when it runs
        seen.append([set(q[q >= 0].tolist()) for _, q, _ in blocks])
        return real(fn, blocks, **kwargs)

    monkeypatch.setattr(cand_module, "blocked_map", spy)
    out = candidate_search(X, X, cand, grid, k=4, exclude=ex, batch_size=batch_size)
    assert torch.equal(ref[1], out[1]) and torch.equal(ref[2], out[2])
    assert torch.allclose(ref[0], out[0], rtol=1e-12, atol=1e-12)
    # every block's queries lie within one block of batch_size consecutive queries
    for rows in seen[0]:
        assert len({r // batch_size for r in rows}) == 1
