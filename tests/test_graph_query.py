"""The parallel graph search of a pynndescent index (``search._graph_query``)."""

import os
import subprocess
import sys

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from invariant_cluster._third_party import import_cached  # noqa: E402

pynndescent = import_cached("pynndescent")
from invariant_cluster.search import _graph_query as gq  # noqa: E402


def _blobs(n, d, seed, centres=12):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, d)) * 3
    return (c[rng.integers(0, centres, n)] + rng.standard_normal((n, d))).astype(np.float32)


def _exact(Q, X, k):
    d2 = ((Q[:, None, :].astype(np.float64) - X[None].astype(np.float64)) ** 2).sum(-1)
    return np.argsort(d2, axis=1, kind="stable")[:, :k], d2


def _recall(found, exact):
    return np.mean([len(np.intersect1d(a, b)) / exact.shape[1] for a, b in zip(found, exact)])


@pytest.mark.parametrize("n, d, k, seed", [(1500, 16, 10, 0), (4000, 40, 30, 1), (700, 8, 25, 2)])
def test_answers_like_pynndescent_and_the_exact_search(n, d, k, seed):
    """The same search as pynndescent's: the recall of the exact top-k is pynndescent's own (to
    0.01), the distances are the Euclidean distances of the returned rows (float64 reference),
    nearest first, without repeats."""
    X, Q = np.split(_blobs(n + 300, d, seed), [n])
    index = pynndescent.NNDescent(X, n_neighbors=20, random_state=seed, n_jobs=1, low_memory=True)
    assert gq.supported(index)
    found, dist = gq.query(index, Q, k)
    ref, _ = index.query(Q, k=k, epsilon=0.1)
    exact, d2 = _exact(Q, X, k)
    assert found.shape == dist.shape == (300, k)
    assert (found >= 0).all()
    assert _recall(found, exact) >= _recall(ref, exact) - 0.01
    assert _recall(found, exact) >= 0.9
    np.testing.assert_allclose(dist, np.sqrt(np.take_along_axis(d2, found, 1)), rtol=1e-4,
                               atol=1e-4)
    assert (np.diff(dist, axis=1) >= 0).all()
    assert all(len(np.unique(row)) == k for row in found)


def test_answer_is_the_same_for_any_threads_and_any_batch():
    """A row's answer is its own: one thread or two, the whole batch or a part of it, and the
    same query twice gets the same answer twice."""
    X, Q = np.split(_blobs(4100, 24, 3), [3000])
    index = pynndescent.NNDescent(X, n_neighbors=20, random_state=0, n_jobs=1, low_memory=True)
    one = gq.query(index, Q, 15, n_threads=1)
    two = gq.query(index, Q, 15, n_threads=2)
    part = gq.query(index, Q[517:900], 15, n_threads=2)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    twice = gq.query(index, np.concatenate([Q[:50], Q[:50]]), 15)
    for a, b, c in zip(one, part, twice):
        np.testing.assert_array_equal(a[517:900], b)
        np.testing.assert_array_equal(c[:50], c[50:])
        np.testing.assert_array_equal(c[:50], a[:50])
    # numba's thread count is put back
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS


def test_exact_copies_are_found_at_distance_zero():
    """Indexed points as queries (each stored three times): the copies come first, at 0."""
    base = _blobs(400, 12, 5)
    X = np.repeat(base, 3, axis=0)
    index = pynndescent.NNDescent(X, n_neighbors=20, random_state=0, n_jobs=1, low_memory=True)
    found, dist = gq.query(index, base[:100], 6)
    np.testing.assert_array_equal(dist[:, :3], 0)
    np.testing.assert_array_equal(np.sort(found[:, :3], axis=1) // 3,
                                  np.repeat(np.arange(100)[:, None], 3, axis=1))


def test_other_indexes_are_queried_by_pynndescent():
    """An index it does not search itself (several leaves of the first search tree) answers
    through ``index.query``."""
    X = _blobs(800, 10, 6)
    index = pynndescent.NNDescent(X, n_neighbors=15, random_state=0, n_jobs=1, low_memory=True,
                                  search_tree_leaf_budget=3)
    assert not gq.supported(index)
    found, dist = gq.query(index, X[:40], 5)
    ref = index.query(X[:40], k=5, epsilon=0.1)
    np.testing.assert_array_equal(found, ref[0])
    np.testing.assert_array_equal(dist, ref[1])


def test_bad_query_shape_names_the_argument():
    X = _blobs(500, 10, 7)
    index = pynndescent.NNDescent(X, n_neighbors=15, random_state=0, n_jobs=1, low_memory=True)
    with pytest.raises(ValueError, match="queries"):
        gq.query(index, X[:5, :9], 5)



def _distinct_reference(found, dist, copies, per_key, m, exclude):
    """Per query, a dictionary of each key's smallest distance, sorted in Python."""
    out = []
    for i in range(found.shape[0] // copies):
        best = {}
        for f, d in zip(found[i * copies:(i + 1) * copies].ravel(),
                        dist[i * copies:(i + 1) * copies].ravel()):
            key = f // per_key
            if f >= 0 and key != exclude[i] and d < best.get(key, np.inf):
                best[key] = d
        out.append([key for key, _ in sorted(best.items(), key=lambda kv: kv[1])][:m])
    return out


@pytest.mark.parametrize("copies, per_key, kq, m", [(9, 3, 12, 20), (1, 1, 30, 30), (4, 2, 5, 8)])
def test_distinct_keys_are_each_keys_nearest_copy(copies, per_key, kq, m):
    """The merge of a query's copies: its ``m`` nearest distinct keys by their nearest copy,
    without the excluded key; rows with fewer are reported short and padded with -1."""
    rng = np.random.default_rng(copies + kq)
    n_q, n_keys = 400, 60
    found = rng.integers(0, n_keys * per_key, (n_q * copies, kq))
    found[rng.random(found.shape) < 0.05] = -1
    # distinct distances, so that the order is defined
    dist = rng.permutation(found.size).reshape(found.shape).astype(np.float32) / found.size
    exclude = rng.integers(0, n_keys, n_q)
    out, short = gq.distinct_keys(found, dist, copies, per_key, m, n_keys, exclude)
    ref = _distinct_reference(found, dist, copies, per_key, m, exclude)
    assert out.shape == (n_q, m)
    np.testing.assert_array_equal(short, [i for i, r in enumerate(ref) if len(r) < m])
    for row, r in zip(out, ref):
        np.testing.assert_array_equal(row[:len(r)], r)
        assert (row[len(r):] == -1).all()
    # no exclusion
    out2, _ = gq.distinct_keys(found, dist, copies, per_key, m, n_keys)
    ref2 = _distinct_reference(found, dist, copies, per_key, m, np.full(n_q, -1))
    for row, r in zip(out2, ref2):
        np.testing.assert_array_equal(row[:len(r)], r)

_RUN = """
import numpy as np
from invariant_cluster._third_party import import_cached
pnn = import_cached("pynndescent")
from invariant_cluster.search import _graph_query as gq
X = np.random.default_rng(0).standard_normal((600, 8)).astype(np.float32)
index = pnn.NNDescent(X, n_neighbors=10, random_state=0, n_jobs=1, low_memory=True)
found, _ = gq.query(index, X[:20], 5)
print(int(found[:, 0].sum()), len(gq._search.stats.cache_hits))
"""


def test_search_is_compiled_once_per_installation():
    """The search loop is numba's on-disk cache's: a later process loads it (the first one of
    an installation compiles it, unless an earlier test's process did)."""
    outs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _RUN], env=dict(os.environ),
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        outs.append(out.stdout.split())
    assert outs[0][0] == outs[1][0] == str(sum(range(20)))
    assert outs[1][1] == "1"
