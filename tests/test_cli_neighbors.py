"""``invariant-cluster neighbors``: the invariant kNN graph and alignments written to a folder."""

import json

import numpy as np
import pytest
from _images import random_images
from scipy import sparse

from invariant_cluster import InvariantKNeighborsTransformer, warp_se2

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def call(capsys, *args):
    from invariant_cluster.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def twins(tmp_path):
    """Six random images and each one turned by a quarter: every image's nearest other image is
    its twin, at an exact 90-degree rotation."""
    Y = random_images((6, 12, 12), seed=11, border=3).astype(np.float32)
    X = np.concatenate([Y, np.rot90(Y, k=1, axes=(1, 2))])
    path = tmp_path / "images.npy"
    np.save(path, X)
    return X, path


def test_writes_graph_and_alignments(capsys, tmp_path, twins):
    X, path = twins
    out = tmp_path / "knn"
    code, stdout, stderr = call(capsys, "neighbors", path, "--n-neighbors", 3, "--out", out,
                                "--quiet")
    assert code == 0, stderr
    assert "12 images" in stdout and str(out) in stdout
    n, k = len(X), 3
    G = sparse.load_npz(out / "graph.npz")
    ind = np.load(out / "indices.npy")
    dist = np.load(out / "distances.npy")
    tau = np.load(out / "alignments.npy")
    assert G.shape == (n, n) and G.nnz == n * (k + 1)
    assert ind.shape == dist.shape == (n, k + 1) and tau.shape == (n, k + 1, 3)
    np.testing.assert_array_equal(G.indices.reshape(n, -1), ind)
    np.testing.assert_array_equal(G.data.reshape(n, -1), dist)
    # itself first at 0, then its twin at an exact quarter turn
    np.testing.assert_array_equal(ind[:, 0], np.arange(n))
    np.testing.assert_array_equal(dist[:, 0], 0.0)
    np.testing.assert_array_equal(ind[:, 1], (np.arange(n) + 6) % n)
    # the turned twin is turned back onto an original (-90), an original onto its twin (+90)
    np.testing.assert_allclose(tau[:, 1, 0], np.repeat([-90.0, 90.0], 6), atol=1e-4)
    np.testing.assert_allclose(tau[:, 1, 1:], 0.0, atol=1e-4)
    warped = warp_se2(X[ind[:, 1]], tau[:, 1])
    np.testing.assert_allclose(warped, X, atol=1e-4)
    # the same graph as the estimator's fit_transform
    ref = InvariantKNeighborsTransformer(n_neighbors=k).fit_transform(X.reshape(n, -1))
    np.testing.assert_array_equal(ref.indices, G.indices)
    np.testing.assert_allclose(ref.data, G.data, rtol=1e-6)
    info = json.loads((out / "neighbors.json").read_text())
    assert info["n_images"] == n and info["n_neighbors"] == k
    assert info["image_shape"] == [1, 12, 12]


def test_search_options_pass_through(capsys, tmp_path, twins):
    X, path = twins
    out = tmp_path / "knn"
    code, _, stderr = call(capsys, "neighbors", path, "--n-neighbors", 1, "--out", out,
                           "--group", "rotation", "--n-rotations", 4, "--no-refine",
                           "--neighbor-search", "exact", "--n-samples", 12, "-q")
    assert code == 0, stderr
    info = json.loads((out / "neighbors.json").read_text())
    assert info["params"]["n_rotations"] == 4 and info["params"]["refine"] is False
    assert info["params"]["group"] == "rotation"


def test_bad_input_is_one_line(capsys, tmp_path, twins):
    _, path = twins
    code, _, stderr = call(capsys, "neighbors", path, "--n-neighbors", 12, "--out", tmp_path,
                           "-q")
    assert code == 2 and "--n-neighbors" in stderr and len(stderr.strip().splitlines()) == 1
    code, _, stderr = call(capsys, "neighbors", tmp_path / "missing.npy", "-q")
    assert code == 2 and "no such file" in stderr
    code, _, stderr = call(capsys, "neighbors", path, "--n-neighbors", 0)
    assert code == 2 and "--n-neighbors" in stderr
