"""The block computations on dask.distributed give the same numbers as in this process."""

from __future__ import annotations

import pytest
import torch

from invariant_cluster._dask import blocked_map, resolve_client
from invariant_cluster.alignment import make_search_grid
from invariant_cluster.neighbors import candidate_search, neighbor_search

distributed = pytest.importorskip("distributed")


def _square_plus(block, offset):
    return block * block + offset


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as c:
            yield c


def _data():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 1, 12, 12, generator=g)
    grid = make_search_grid("se2", 45.0, 5, 1, refine=False)
    return X, grid


def test_local_map_without_client():
    assert resolve_client(None) is None
    assert blocked_map(_square_plus, [1, 2, 3], shared=(10,)) == [11, 14, 19]
    assert blocked_map(_square_plus, [], shared=(10,)) == []


def test_resolve_client_type_error():
    with pytest.raises(TypeError, match="client"):
        resolve_client(object())


def test_blocked_map_order(client):
    blocks = list(range(12))
    assert blocked_map(_square_plus, blocks, shared=(1,), client=client) == [
        b * b + 1 for b in blocks
    ]


def _shared_sum_plus(block, shared):
    return float(shared.sum()) + block


def test_same_shared_data_call_after_call(client):
    """Calls that scatter the same data one after the other (a second fit, the next test) each
    get their own keys: with dask's default content-hash key, a call reused the key that the
    previous call's release was still forgetting, and most calls failed with "lost
    dependencies"."""
    shared = torch.rand(50, 50, generator=torch.Generator().manual_seed(1))
    expected = [float(shared.sum()) + b for b in range(4)]
    for _ in range(60):
        assert blocked_map(_shared_sum_plus, range(4), shared=(shared,),
                           client=client) == expected


def test_neighbor_search_identical_on_cluster(client):
    X, grid = _data()
    ref = neighbor_search(X, X, grid, k=5, n_candidates=15, batch_size=6)
    out = neighbor_search(X, X, grid, k=5, n_candidates=15, batch_size=6, client=client)
    for a, b in zip(ref, out):
        assert torch.equal(a, b)


def test_exact_search_identical_on_cluster(client):
    from invariant_cluster.alignment import grid_search
    from invariant_cluster.neighbors import blocked_grid_search

    X, grid = _data()
    ex = torch.arange(40)
    ref = blocked_grid_search(X, X, grid, k=4, batch_size=9, exclude=ex)
    out = blocked_grid_search(X, X, grid, k=4, batch_size=9, exclude=ex, client=client)
    for a, b in zip(ref, out):
        assert torch.equal(a, b)
    D, idx, _ = grid_search(X, X, grid, k=4, exclude=ex)
    assert torch.allclose(ref[0], D, rtol=1e-5, atol=1e-5) and torch.equal(ref[1], idx)


def test_attention_step_identical_on_cluster(client):
    from invariant_cluster.neighbors import aligned_weighted_sum

    X, grid = _data()
    D, idx, P = neighbor_search(X, X, grid, k=4, n_candidates=12)
    W = torch.softmax(-D, 1)
    ref = aligned_weighted_sum(X, idx, P, W, batch_size=9)
    assert torch.equal(ref, aligned_weighted_sum(X, idx, P, W, batch_size=9, client=client))


def test_joblib_dask_backend_is_used(client, monkeypatch):
    joblib = pytest.importorskip("joblib")
    import invariant_cluster._dask as dk

    X, grid = _data()
    cand = torch.arange(40).expand(40, 40)
    ref = candidate_search(X, X, cand, grid, k=4, batch_size=7)
    seen = []
    real = dk.resolve_client

    def spy(c=None):
        out = real(c)
        seen.append(out)
        return out

    monkeypatch.setattr(dk, "resolve_client", spy)
    with joblib.parallel_config(backend="dask"):
        out = candidate_search(X, X, cand, grid, k=4, batch_size=7)
    assert seen and seen[-1] is client
    for a, b in zip(ref, out):
        assert torch.equal(a, b)


def test_worker_processes():
    X, grid = _data()
    ref = neighbor_search(X, X, grid, k=3, n_candidates=10, batch_size=10)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as c:
            out = neighbor_search(X, X, grid, k=3, n_candidates=10, batch_size=10, client=c)
    for a, b in zip(ref, out):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# estimators holding a client: clone, model selection, pickle, a closed client
# ---------------------------------------------------------------------------------------------


def _copies():
    """Rotated copies of a T and a box (11 x 11), three of each, and which shape each is."""
    import numpy as np
    from _images import t_and_box

    shapes = t_and_box()
    X = np.stack([np.rot90(s, r) for s in shapes for r in range(3)]).astype(np.float32)
    return X.reshape(len(X), -1), np.repeat([0, 1], 3)


def _estimators(client):
    from invariant_cluster import InvariantAttentionClusterer, InvariantKNeighborsTransformer

    return [InvariantAttentionClusterer(2, n_rotations=4, max_translation=0, device="cpu",
                                        random_state=0, client=client),
            InvariantKNeighborsTransformer(n_neighbors=2, n_rotations=4, max_translation=0,
                                           device="cpu", client=client)]


def test_clone_keeps_the_client(client):
    from sklearn.base import clone

    X, _ = _copies()
    for est in _estimators(client):
        est.set_params(n_rotations=8)
        twin = clone(est.fit(X))
        assert twin.client is client and est.client is client
        assert twin.get_params() == est.get_params()
        assert not hasattr(twin, "image_shape_")  # a clone is not fitted


def test_grid_search_with_a_client(client):
    from sklearn.model_selection import GridSearchCV, KFold

    X, y = _copies()
    scores = []
    for c in (client, None):
        search = GridSearchCV(_estimators(c)[0], {"n_rotations": [2, 4]},
                              cv=KFold(2, shuffle=True, random_state=0),
                              scoring="adjusted_rand_score")
        with distributed.get_task_stream(client) as tasks:
            search.fit(X, y)
        assert bool(tasks.data) == (c is not None)  # the clones' fits ran on the cluster
        assert search.best_estimator_.client is c
        scores.append(search.cv_results_["mean_test_score"])
    # the cluster changes where each block runs, never the result
    assert scores[0].tolist() == scores[1].tolist()


def test_fitted_estimator_pickles_without_its_client(client):
    import pickle

    import numpy as np

    X, _ = _copies()
    cluster, knn = _estimators(client)
    for est in (cluster.fit(X), knn.fit(X)):
        back = pickle.loads(pickle.dumps(est))
        assert back.client is None and est.client is client
        assert {k: v for k, v in back.get_params().items() if k != "client"} == {
            k: v for k, v in est.get_params().items() if k != "client"}
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(cluster)).predict(X),
                                  cluster.predict(X))
    back = pickle.loads(pickle.dumps(knn)).set_params(client=client)
    for a, b in zip(back.kneighbors(X), knn.kneighbors(X)):
        np.testing.assert_array_equal(a, b)


def test_closed_client_is_named():
    X, _ = _copies()
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster:
        c = distributed.Client(cluster)
        fitted = _estimators(c)[1].fit(X)
        c.close()
    for est in _estimators(c):
        with pytest.raises(ValueError, match="client: the Dask client is closed"):
            est.fit(X)
    with pytest.raises(ValueError, match="client: the Dask client is closed"):
        fitted.kneighbors(X)
    with pytest.raises(ValueError, match="client: the Dask client is closed"):
        blocked_map(_square_plus, [1, 2], shared=(1,), client=c)
