"""The plots render with the Agg backend and draw what they say."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from sklearn.exceptions import NotFittedError  # noqa: E402

from invariant_cluster import InvariantAttentionClusterer, warp_se2  # noqa: E402
from invariant_cluster import plotting as P  # noqa: E402


def _shapes():
    bar = np.zeros((11, 11), np.float32)
    bar[2:9, 5] = 1
    bar[2, 3:8] = 1  # a "T"
    box = np.zeros((11, 11), np.float32)
    box[3:8, 3:8] = 1
    box[4:7, 4:7] = 0
    return bar, box


@pytest.fixture(scope="module")
def fitted():
    """Quarter-turn copies of a T (7 copies) and a box (5): exact group elements, 2 clusters."""
    bar, box = _shapes()
    angles = np.array([0, 90, 180, 270, 90, 0, 180, 0, 90, 180, 270, 0], dtype=np.float32)
    X = np.stack([bar] * 7 + [box] * 5)
    X = warp_se2(X, np.c_[angles, np.zeros((12, 2), np.float32)])
    est = InvariantAttentionClusterer(n_clusters=2, group="rotation", n_rotations=4,
                                      n_neighbors=5, max_iter=10, random_state=0).fit(X)
    return est, X


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _texts(ax):
    return [t.get_text() for t in ax.texts]


class TestPlotInvariantMeans:
    def test_one_image_per_cluster_with_ids_and_sizes(self, fitted):
        est, _ = fitted
        ax = P.plot_invariant_means(est)
        assert len(ax.images) == est.n_clusters_ == 2
        sizes = np.bincount(est.labels_)
        assert _texts(ax) == [f"c{c} (n={sizes[c]})" for c in range(2)]
        assert ax.get_title() == "invariant means"
        shown = ax.images[0].get_array()
        assert shown.shape == (11, 11)
        ax.figure.canvas.draw()

    def test_draws_into_given_axes_and_max_clusters(self, fitted):
        est, _ = fitted
        fig, axs = plt.subplots(1, 2)
        ax = P.plot_invariant_means(est, ax=axs[1], max_clusters=1, title=None)
        assert ax is axs[1]
        assert len(ax.images) == 1 and len(axs[0].images) == 0

    def test_captions(self, fitted):
        est, _ = fitted
        ax = P.plot_invariant_means(est, captions=["a T", "a box"])
        assert _texts(ax) == ["a T", "a box"]
        with pytest.raises(ValueError, match="captions"):
            P.plot_invariant_means(est, captions=["one"])

    def test_unfitted(self):
        with pytest.raises(NotFittedError):
            P.plot_invariant_means(InvariantAttentionClusterer())


class TestPlotAlignments:
    def test_originals_aligned_and_means(self, fitted):
        est, X = fitted
        ax = P.plot_alignments(est, X, n=4)
        assert len(ax.images) == 3 * 4
        texts = _texts(ax)
        # samples taken round-robin over the clusters: both cluster ids appear
        assert {t.split()[1] for t in texts[:4]} == {"c0", "c1"}
        assert all(t.endswith("°") for t in texts[4:8])
        assert [lab.get_text() for lab in ax.get_yticklabels()] == [
            "original", "aligned", "cluster mean"]

    def test_aligned_image_is_the_warped_original(self, fitted):
        est, X = fitted
        ax = P.plot_alignments(est, X, indices=[1])
        expected = warp_se2(X[1:2], est.alignments_[1:2].astype(np.float32))[0]
        shown = ax.images[1].get_array()
        lo, hi = expected.min(), expected.max()
        np.testing.assert_allclose(shown, (expected - lo) / (hi - lo), atol=1e-5)
        assert _texts(ax)[1] == f"{int(round(est.alignments_[1, 0])):+d}°"

    def test_accepts_flat_rows(self, fitted):
        est, X = fitted
        ax = P.plot_alignments(est, X.reshape(len(X), -1), n=2)
        assert len(ax.images) == 6

    def test_wrong_number_of_samples(self, fitted):
        est, X = fitted
        with pytest.raises(ValueError, match="12 samples"):
            P.plot_alignments(est, X[:5])

    def test_bad_indices(self, fitted):
        est, X = fitted
        with pytest.raises(ValueError, match="indices"):
            P.plot_alignments(est, X, indices=[100])


class TestPlotAttentionWeights:
    def test_matrix_sorted_by_cluster(self, fitted):
        est, _ = fitted
        ax = P.plot_attention_weights(est)
        assert len(ax.images) == 1
        A = np.asarray(ax.images[0].get_array())
        n = len(est.labels_)
        assert A.shape == (n, n)
        # rows sum to 1 (each query's softmax) and the weights stay inside the clusters
        np.testing.assert_allclose(A.sum(1), 1.0, atol=1e-6)
        # the exact copies are fitted as two images that attend to each other: the weights
        # are sorted by cluster, the diagonal blocks first
        labels = np.sort(est.labels_)
        assert A[labels[:, None] == labels[None, :]].sum() > 0
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1"]
        assert "cluster" in ax.get_xlabel() and "cluster" in ax.get_ylabel()
        ax.figure.canvas.draw()

    def test_dense_matrix_matches_sparse_weights(self, fitted):
        est, _ = fitted
        ax = P.plot_attention_weights(est, colorbar=False, gamma=1.0)
        A = np.asarray(ax.images[0].get_array())
        order = np.argsort(est.labels_, kind="stable")
        pos = np.empty_like(order)
        pos[order] = np.arange(len(order))
        i, m = 3, 1
        j = est.neighbors_[i, m]
        w = est.attention_weights_[i][est.neighbors_[i] == j].sum()
        assert A[pos[i], pos[j]] == pytest.approx(w)


class TestPlotConvergence:
    def test_history_on_log_scale(self, fitted):
        est, _ = fitted
        ax = P.plot_convergence(est)
        assert ax.get_yscale() == "log"
        x, y = ax.lines[0].get_data()
        np.testing.assert_array_equal(x, np.arange(1, est.n_iter_ + 1))
        assert len(y) == len(est.history_)
        assert ax.get_xlabel() == "iteration"

    def test_no_iterations(self, fitted):
        est, X = fitted
        est0 = InvariantAttentionClusterer(n_clusters=2, group="rotation", n_rotations=4,
                                           n_neighbors=5, max_iter=0).fit(X)
        ax = P.plot_convergence(est0)
        assert len(ax.lines[0].get_xdata()) == 0
        assert any("max_iter=0" in t for t in _texts(ax))


class TestPlotImages:
    def test_tiles_and_captions(self):
        ax = P.plot_images(np.random.default_rng(0).random((7, 5, 6)), captions=list("abcdefg"),
                           n_cols=3, title="t")
        assert len(ax.images) == 7
        assert _texts(ax) == list("abcdefg")

    def test_rgb_and_flat(self):
        ax = P.plot_images(np.random.default_rng(0).random((2, 3, 4, 4)))
        assert ax.images[0].get_array().shape == (4, 4, 3)
        ax = P.plot_images(np.zeros((3, 16)))
        assert ax.images[0].get_array().shape == (4, 4)

    def test_errors(self):
        with pytest.raises(ValueError, match="captions"):
            P.plot_images(np.zeros((3, 4, 4)), captions=["a"])
        with pytest.raises(ValueError, match="image_shape"):
            P.plot_images(np.zeros((3, 10)))


class TestDiagnosticsPlots:
    def test_reexported(self):
        from invariant_cluster import _plot_diagnostics

        assert P.plot_projection_loss is _plot_diagnostics.plot_projection_loss
        assert P.plot_eigenvector_check is _plot_diagnostics.plot_eigenvector_check

    def test_render_diagnostics(self):
        from invariant_cluster.diagnostics import eigenvector_check, projection_loss

        rng = np.random.default_rng(0)
        Q, K, V = rng.normal(size=(8, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 3))
        ax = P.plot_projection_loss(projection_loss(Q, K, V))
        assert len(ax.lines) >= 3  # J_proj and its two terms
        ax = P.plot_eigenvector_check(eigenvector_check(K, V, random_state=0))
        assert ax.get_yscale() == "log"
        ax.figure.canvas.draw()

    def test_public_names(self):
        for name in P.__all__:
            assert callable(getattr(P, name))
