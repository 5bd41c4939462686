"""The grouping's Leiden runs in worker processes: the same runs as in the calling process,
the number of workers, and an adjusted Rand index equal to scikit-learn's."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from sklearn.metrics import adjusted_rand_score

from invariant_cluster import _grouping, _leiden
from invariant_cluster._threads import thread_limit


def _knn_graph(n, k, n_groups, seed):
    """A weighted symmetric kNN graph of ``n`` points in ``n_groups`` overlapping blobs."""
    from sklearn.neighbors import kneighbors_graph

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)) + 3.0 * rng.integers(0, n_groups, n)[:, None] * [[1.0, 0.3]]
    A = kneighbors_graph(X, k, mode="distance")
    A.data = np.exp(-A.data ** 2)
    return A.maximum(A.T).tocsr()


@pytest.mark.parametrize("seed", [0, 1])
def test_runs_in_workers_are_the_runs_in_process(seed, monkeypatch):
    # the runs' memberships and qualities, and so the count-given and the count-free labels,
    # are the same whether the runs go to two worker processes or stay in this process
    G = _knn_graph(1500, 10, 6, seed)
    edges = _leiden._graph_edges(G)
    net = _leiden._igraph_from_edges(*edges)
    seeds = _grouping._run_seeds(seed)
    with thread_limit(2):
        monkeypatch.setattr(_leiden, "PARALLEL_RUNS_MIN_EDGES", 10 ** 12)
        runs_1, q_1 = _grouping._leiden_runs(net, edges, 1.0, seeds)
        labels_1 = [_grouping.leiden(G, c, random_state=seed) for c in (None, 4)]
        monkeypatch.setattr(_leiden, "PARALLEL_RUNS_MIN_EDGES", 1)
        assert _leiden.run_workers(len(seeds), net.ecount(), 2) == 2
        runs_2, q_2 = _grouping._leiden_runs(net, edges, 1.0, seeds)
        labels_2 = [_grouping.leiden(G, c, random_state=seed) for c in (None, 4)]
    assert [list(r) for r in runs_1] == [list(r) for r in runs_2]
    assert q_1 == q_2
    for a, b in zip(labels_1, labels_2):
        np.testing.assert_array_equal(a, b)
    # the runs differ from each other: the test compares runs, not one partition
    assert len({tuple(r) for r in runs_1}) > 1


def test_graph_edges_round_trip():
    # the igraph graph has the sparse graph's edges and weights, each once
    G = _knn_graph(300, 6, 3, 2)
    n, rows, cols, weights = _leiden._graph_edges(G)
    net = _leiden._igraph_from_edges(n, rows, cols, weights)
    A = coo_matrix((net.es["weight"], tuple(np.asarray(net.get_edgelist()).T)), shape=G.shape)
    np.testing.assert_array_equal((A + A.T).toarray(), G.toarray())
    assert net.vcount() == G.shape[0] and net.ecount() == (G.nnz - (G.diagonal() != 0).sum()) // 2


@pytest.mark.parametrize("n_runs, n_edges, threads, expected", [
    (10, 10 ** 6, 16, 10),   # one worker per run at most
    (10, 10 ** 6, 2, 2),     # the threads allowed
    (10, 10 ** 6, 1, 1),     # one thread: in this process
    (10, _leiden.PARALLEL_RUNS_MIN_EDGES - 1, 16, 1),  # smaller graphs stay in this process
    (10, _leiden.PARALLEL_RUNS_MIN_EDGES, 4, 4),
])
def test_run_workers(n_runs, n_edges, threads, expected):
    assert _leiden.run_workers(n_runs, n_edges, threads) == expected


def test_run_workers_within_a_quarter_of_the_memory():
    # each worker is counted at WORKER_BASE_BYTES + WORKER_BYTES_PER_EDGE n_edges, and together
    # they take at most WORKER_MEMORY_FRACTION of the memory available
    n_edges = 10 ** 6
    each = _leiden.WORKER_BASE_BYTES + _leiden.WORKER_BYTES_PER_EDGE * n_edges
    quarter = _leiden.WORKER_MEMORY_FRACTION
    assert _leiden.run_workers(10, n_edges, 16, available=100 * each / quarter) == 10
    assert _leiden.run_workers(10, n_edges, 16, available=3.5 * each / quarter) == 3
    assert _leiden.run_workers(10, n_edges, 16, available=1.5 * each / quarter) == 1
    assert _leiden.run_workers(10, n_edges, 16, available=0) == 1
    with _leiden.leiden_workers(True, n_edges, 10, 16, available=1.5 * each / quarter) as t:
        assert t is None  # not even two fit: nothing started


def test_start_run_workers():
    assert _leiden.start_run_workers(1) is None
    thread = _leiden.start_run_workers(2)
    thread.join(timeout=120)
    assert not thread.is_alive()


def test_leiden_workers_started_lower_the_threshold():
    # workers started for a fit on a card serve the runs from STARTED_RUNS_MIN_EDGES edges;
    # outside the block, and where none were started, the runs start their own from
    # PARALLEL_RUNS_MIN_EDGES
    mid = (_leiden.STARTED_RUNS_MIN_EDGES + _leiden.PARALLEL_RUNS_MIN_EDGES) // 2
    assert _leiden.run_workers(10, mid, 2) == 1
    with _leiden.leiden_workers(True, mid, 10, 2) as thread:
        assert thread is not None
        assert _leiden.run_workers(10, mid, 2) == 2
    assert not thread.is_alive()
    assert _leiden.run_workers(10, mid, 2) == 1
    with _leiden.leiden_workers(False, mid, 10, 2) as thread:
        assert thread is None
        assert _leiden.run_workers(10, mid, 2) == 1
    with _leiden.leiden_workers(True, _leiden.STARTED_RUNS_MIN_EDGES - 1, 10, 2) as thread:
        assert thread is None  # too small a graph: nothing started
        assert _leiden.run_workers(10, mid, 2) == 1


def test_worker_module_does_not_import_torch():
    # a worker process unpickles leiden_worker from invariant_cluster._leiden: that import
    # must stay light (no torch)
    code = ("import sys, invariant_cluster._leiden; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("seed", range(6))
def test_pair_ari_is_scikit_learns(seed):
    # the same float as adjusted_rand_score, bit for bit, on labelings of several shapes
    rng = np.random.default_rng(seed)
    n = [2, 7, 100, 1000, 20000, 70000][seed]
    k = [1, 2, 5, 30, 12, 40][seed]
    a = rng.integers(0, k, n)
    b = a.copy()
    moved = rng.random(n) < 0.3
    b[moved] = rng.integers(0, k + 2, moved.sum())
    a, b = (np.unique(x, return_inverse=True)[1] for x in (a, b))
    for x, y in ((a, b), (b, a), (a, a), (a, np.arange(n)), (a, np.zeros(n, np.int64))):
        assert _grouping._pair_ari(x, y) == adjusted_rand_score(x, y)
