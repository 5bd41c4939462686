"""The heap policy of the searches (invariant_cluster._heap): set once, restored once."""

import pytest
import torch

from invariant_cluster import _heap
from invariant_cluster.search import candidate_search, make_search_grid


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def fake(monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(_heap, "_glibc", lambda: libc)
    monkeypatch.delenv("INVARIANT_CLUSTER_HEAP_REUSE", raising=False)
    return libc


def test_thresholds_raised_inside_and_settled_after(fake):
    with _heap.heap_reuse():
        assert fake.calls == [("mallopt", _heap._M_TRIM_THRESHOLD, _heap._REUSE_BYTES),
                              ("mallopt", _heap._M_MMAP_THRESHOLD, _heap._REUSE_BYTES)]
        with _heap.heap_reuse():  # nested: nothing more
            pass
        assert len(fake.calls) == 2
    assert fake.calls[2:] == [("mallopt", _heap._M_MMAP_THRESHOLD, 32 << 20),
                              ("mallopt", _heap._M_TRIM_THRESHOLD, 64 << 20),
                              ("malloc_trim", 0)]
    assert _heap._depth == 0


def test_restored_when_the_call_raises(fake):
    @_heap.reusing_heap
    def boom():
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        boom()
    assert fake.calls[-1] == ("malloc_trim", 0) and _heap._depth == 0


def test_opt_out(fake, monkeypatch):
    monkeypatch.setenv("INVARIANT_CLUSTER_HEAP_REUSE", "0")
    with _heap.heap_reuse():
        pass
    assert fake.calls == []


@pytest.mark.parametrize("var", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_user_malloc_settings_are_left_alone(monkeypatch, var):
    monkeypatch.setenv(var, "1000000")
    _heap._glibc.cache_clear()
    try:
        assert _heap._glibc() is None
    finally:
        monkeypatch.delenv(var)
        _heap._glibc.cache_clear()


def test_a_search_runs_inside_it(fake):
    # the engine's entry point is wrapped: one raise, one settle, same result as unwrapped
    from invariant_cluster.search import knn_search

    X = torch.rand(12, 1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grid = make_search_grid("rotation", 90.0, 5, refine=False)
    D, I, _ = knn_search(X, X, grid, 3, method="exact", exclude=torch.arange(12))
    D2, I2, _ = candidate_search(X, X, torch.arange(12).expand(12, 12), grid, k=3,
                                 exclude=torch.arange(12))
    assert torch.equal(I, I2) and torch.allclose(D, D2, rtol=1e-12, atol=1e-12)
    assert [c[0] for c in fake.calls] == ["mallopt"] * 4 + ["malloc_trim"]


def test_release_and_suspended_only_inside(fake):
    _heap.release()
    with _heap.suspended():
        pass
    assert fake.calls == []  # outside a search: the user's heap is left alone
    with _heap.heap_reuse():
        n = len(fake.calls)
        _heap.release()
        assert fake.calls[n:] == [("malloc_trim", 0)]
        n = len(fake.calls)
        with _heap.suspended():
            assert fake.calls[n:] == [("mallopt", _heap._M_MMAP_THRESHOLD, 32 << 20),
                                      ("mallopt", _heap._M_TRIM_THRESHOLD, 64 << 20),
                                      ("malloc_trim", 0)]
        assert fake.calls[-2:] == [("mallopt", _heap._M_TRIM_THRESHOLD, _heap._REUSE_BYTES),
                                   ("mallopt", _heap._M_MMAP_THRESHOLD, _heap._REUSE_BYTES)]
    assert _heap._depth == 0


def test_the_real_glibc_calls_succeed():
    # on this machine (Linux, glibc) the calls go through and leave the heap as they found it
    libc = _heap._glibc()
    if libc is None:
        pytest.skip("not glibc, or malloc tuned in the environment")
    with _heap.heap_reuse():
        x = torch.ones(1 << 22)
        del x
        _heap.release()
    assert _heap._depth == 0


def test_held_defers_the_trims_to_its_end(fake):
    with _heap.heap_reuse():
        n = len(fake.calls)
        with _heap.held():
            _heap.release()
            with _heap.held():  # nested: still held
                _heap.release()
            assert fake.calls[n:] == []
        assert fake.calls[n:] == [("malloc_trim", 0)]  # one trim on the way out
        n = len(fake.calls)
        _heap.release()
        assert fake.calls[n:] == [("malloc_trim", 0)]
    assert _heap._held == 0
