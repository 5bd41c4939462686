"""InvariantKNeighborsTransformer: scikit-learn's KNeighborsTransformer contract, exact group
elements, a float64 brute-force reference, bad input, and the ``metric="precomputed"``
consumers of the graph (t-SNE, Isomap, spectral clustering, DBSCAN, HDBSCAN, UMAP)."""

import warnings

import numpy as np
import pytest
import torch
from _images import DATA, have_data, random_images, shifted_digit_copies
from scipy import sparse
from scipy.ndimage import gaussian_filter
from sklearn.cluster import DBSCAN, HDBSCAN, KMeans, SpectralClustering
from sklearn.manifold import TSNE, Isomap
from sklearn.metrics import adjusted_rand_score
from sklearn.neighbors import KNeighborsTransformer, NearestNeighbors, kneighbors_graph
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils.estimator_checks import parametrize_with_checks

from invariant_cluster import (
    InvariantKNeighborsTransformer,
    invariant_distances,
    invariant_kneighbors_graph,
)
from invariant_cluster.alignment import make_search_grid
from invariant_cluster.datasets import load_digits_images, make_transformed_copies
from invariant_cluster.kneighbors import symmetrize_graph
from invariant_cluster.transforms import warp_se2


@pytest.fixture(autouse=True, scope="module")
def _one_thread(torch_single_thread):
    yield


def figure2(digits, sizes, seed=0):
    """Groups of copies of one digit each, rotated over the full circle (as the paper's Fig. 2).

    One image of each class in ``digits`` from scikit-learn's bundled 8 x 8 digits; group ``g``
    holds ``sizes[g]`` copies. Returns ``(X (n, 64) float32, group labels)``.
    """
    d = load_digits_images()
    X, y = [], []
    for g, (digit, size) in enumerate(zip(digits, sizes)):
        image = d.images[np.flatnonzero(d.target == digit)[0]]
        copies, _ = make_transformed_copies(image, size, random_state=seed + g)
        X.append(copies.reshape(size, -1))
        y += [g] * size
    return np.concatenate(X).astype(np.float32), np.asarray(y)


SETS = {  # (digits, group sizes): group counts and sizes vary
    "five-unequal": ([0, 1, 2, 3, 4], [12, 10, 14, 8, 11]),
    "three-large": ([5, 6, 7], [20, 15, 25]),
    "ten-small": (list(range(10)), [8] * 10),
}


@pytest.fixture(scope="module", params=list(SETS))
def groups(request):
    return figure2(*SETS[request.param])


def _rows(G):
    """``(data, indices)`` of a CSR graph with the same number of entries per row."""
    n = G.shape[0]
    return G.data.reshape(n, -1), G.indices.reshape(n, -1)


# ----------------------------------------------------------------------------- contract
class TestContract:
    def test_fit_transform_training_set(self, groups):
        X, y = groups
        G = InvariantKNeighborsTransformer().fit_transform(X)
        n = len(X)
        assert sparse.issparse(G) and G.format == "csr" and G.shape == (n, n)
        # distance mode: n_neighbors + 1 entries, each sample its own first neighbour at 0
        assert np.all(np.diff(G.indptr) == 6)
        data, ind = _rows(G)
        np.testing.assert_array_equal(ind[:, 0], np.arange(n))
        np.testing.assert_array_equal(data[:, 0], 0.0)
        assert np.all(np.diff(data, axis=1) >= 0)  # rows sorted by distance
        assert np.all(y[ind] == y[:, None])  # every neighbour a copy of the same digit

    def test_connectivity_mode(self, groups):
        X, _ = groups
        est = InvariantKNeighborsTransformer(mode="connectivity", n_neighbors=4)
        G = est.fit_transform(X)
        assert np.all(np.diff(G.indptr) == 4)
        np.testing.assert_array_equal(G.data, 1.0)
        dist = InvariantKNeighborsTransformer(n_neighbors=4).fit_transform(X)
        # the same neighbours as the distance graph, without its extra last one
        np.testing.assert_array_equal(_rows(G)[1], _rows(dist)[1][:, :4])

    def test_kneighbors_without_query_excludes_self(self, groups):
        X, y = groups
        est = InvariantKNeighborsTransformer().fit(X)
        dist, ind = est.kneighbors()
        assert dist.shape == ind.shape == (len(X), 5)
        assert not np.any(ind == np.arange(len(X))[:, None])
        assert np.all(np.diff(dist, axis=1) >= 0) and np.all(dist > 0)
        G = est.fit_transform(X)
        # the graph of the training set is [self, the kneighbors() neighbours]
        np.testing.assert_array_equal(_rows(G)[1][:, 1:], ind)
        np.testing.assert_allclose(_rows(G)[0][:, 1:], dist, rtol=1e-6)
        only_ind = est.kneighbors(n_neighbors=2, return_distance=False)
        np.testing.assert_array_equal(only_ind, ind[:, :2])

    @pytest.mark.parametrize("mode", ["distance", "connectivity"])
    def test_equals_sklearn_without_a_group(self, mode):
        # group="none" is plain Euclidean: the graph must be KNeighborsTransformer's
        X = random_images((30, 36), seed=3)
        Q = random_images((7, 36), seed=4)
        ours = InvariantKNeighborsTransformer(mode=mode, n_neighbors=4, group="none").fit(X)
        ref = KNeighborsTransformer(mode=mode, n_neighbors=4).fit(X)
        for a, b in [(ours.transform(X), ref.transform(X)), (ours.transform(Q), ref.transform(Q)),
                     (ours.kneighbors_graph(mode=mode), ref.kneighbors_graph(mode=mode))]:
            assert a.shape == b.shape
            np.testing.assert_array_equal(a.indptr, b.indptr)
            np.testing.assert_array_equal(a.indices, b.indices)
            # scikit-learn's self-distances are ~1e-8 from round-off, ours exactly 0
            np.testing.assert_allclose(a.data, b.data, rtol=1e-10, atol=1e-6)
        d1, i1 = ours.kneighbors(Q, n_neighbors=3)
        d2, i2 = ref.kneighbors(Q, n_neighbors=3)
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_allclose(d1, d2, rtol=1e-10)

    @pytest.mark.parametrize("include_self", [False, True, "auto"])
    @pytest.mark.parametrize("mode", ["distance", "connectivity"])
    def test_function_twin(self, mode, include_self):
        X = random_images((25, 16), seed=5)
        A = invariant_kneighbors_graph(X, 3, mode=mode, include_self=include_self, group="none")
        B = kneighbors_graph(X, 3, mode=mode, include_self=include_self)
        np.testing.assert_array_equal(A.indices, B.indices)
        np.testing.assert_allclose(A.data, B.data, rtol=1e-10, atol=1e-6)
        est = InvariantKNeighborsTransformer(n_neighbors=3).fit(X)
        C = invariant_kneighbors_graph(est, 3, mode=mode, include_self=include_self)
        with_self = include_self is True or (include_self == "auto" and mode == "connectivity")
        D = est.kneighbors_graph(X if with_self else None, 3, mode=mode)
        np.testing.assert_array_equal(C.indices, D.indices)

    def test_feature_names_out_and_sparse_interface(self):
        import sklearn

        X = random_images((10, 16), seed=6)
        est = InvariantKNeighborsTransformer(n_neighbors=2).fit(X)
        names = est.get_feature_names_out()
        assert len(names) == 10 and names[0] == "invariantkneighborstransformer0"
        with sklearn.config_context(sparse_interface="sparray"):
            assert isinstance(est.transform(X), sparse.sparray)
        assert isinstance(est.transform(X), sparse.spmatrix)


# ----------------------------------------------------------------------------- exact answers
class TestExactGroupElements:
    # rotations by multiples of 90 degrees and integer shifts are exact on the pixel grid, and
    # both lie on the default grid (36 angles: every 10 degrees)
    CASES = [(90.0, 0, 0), (-90.0, 0, 0), (0.0, 2, -1), (90.0, -1, 2), (-90.0, 1, 1),
             (0.0, 0, 0)]

    def _queries(self, Y):
        Q, taus = [], []
        for i, (angle, tx, ty) in enumerate(self.CASES):
            k = {90.0: 1, -90.0: 3, 0.0: 0}[angle]
            img = np.rot90(Y[i], k=k)  # counter-clockwise as displayed, as warp_se2
            Q.append(np.roll(img, (ty, tx), axis=(0, 1)))
            taus.append((angle, tx, ty))
        return np.stack(Q), np.asarray(taus)

    def test_alignment_is_the_group_element(self):
        Y = random_images((len(self.CASES) + 6, 12, 12), seed=7, border=3)
        Q, taus = self._queries(Y)
        est = InvariantKNeighborsTransformer(max_translation=2).fit(Y)
        dist, ind, tau = est.kneighbors(Q, n_neighbors=2, return_alignments=True)
        np.testing.assert_array_equal(ind[:, 0], np.arange(len(Q)))
        np.testing.assert_allclose(dist[:, 0], 0.0, atol=1e-9)
        np.testing.assert_allclose(tau[:, 0], taus, atol=1e-9)
        assert tau.shape == (len(Q), 2, 3) and tau.dtype == np.float64
        # the direction: warping the neighbour by tau gives the query
        warped = warp_se2(Y[ind[:, 0]], tau[:, 0])
        np.testing.assert_allclose(warped, Q, atol=1e-9)
        # return_distance=False with alignments
        ind2, tau2 = est.kneighbors(Q, n_neighbors=2, return_distance=False,
                                    return_alignments=True)
        np.testing.assert_array_equal(ind2, ind)
        np.testing.assert_array_equal(tau2, tau)

    def test_shortlist_finds_quarter_turns(self):
        # the steerable descriptors hold every 15 degrees, so quarter turns are exact there too;
        # smooth content, as the descriptors sample rings bilinearly
        Y = gaussian_filter(random_images((30, 12, 12), seed=7), (0, 1, 1))
        Y[:, :2], Y[:, -2:], Y[:, :, :2], Y[:, :, -2:] = 0, 0, 0, 0
        turns = np.array([1, 3, 0, 1, 3, 1])
        Q = np.stack([np.rot90(Y[i], k=t) for i, t in enumerate(turns)])
        est = InvariantKNeighborsTransformer(neighbor_search="shortlist", n_candidates=6).fit(Y)
        dist, ind, tau = est.kneighbors(Q, n_neighbors=1, return_alignments=True)
        np.testing.assert_array_equal(ind[:, 0], np.arange(6))
        np.testing.assert_allclose(dist[:, 0], 0.0, atol=1e-9)
        angles = np.where(turns == 3, -90.0, turns * 90.0)  # 3 quarter turns = -90 degrees
        np.testing.assert_allclose(tau[:, 0], np.c_[angles, np.zeros((6, 2))], atol=1e-9)

    def test_image_inputs_and_channels(self):
        Y = random_images((8, 2, 10, 10), seed=8, border=2)
        Q = np.rot90(Y, k=1, axes=(2, 3)).copy()
        est = InvariantKNeighborsTransformer(n_neighbors=1).fit(Y)
        assert est.image_shape_ == (2, 10, 10)
        dist, ind, tau = est.kneighbors(Q, return_alignments=True)
        np.testing.assert_array_equal(ind[:, 0], np.arange(8))
        np.testing.assert_allclose(tau[:, 0, 0], 90.0, atol=1e-9)
        flat = InvariantKNeighborsTransformer(n_neighbors=1, image_shape=(2, 10, 10)).fit(
            Y.reshape(8, -1))
        d2, i2 = flat.kneighbors(torch.as_tensor(Q.reshape(8, -1)))
        np.testing.assert_array_equal(i2, ind)
        np.testing.assert_allclose(d2, dist, atol=1e-9)


# ----------------------------------------------------------------------------- float64 reference
def _reference_knn(Q, Y, grid, k):
    """Brute force in float64: every grid transformation of every key by kornia's warp."""
    n_q, n_y = len(Q), len(Y)
    best = np.full((n_q, n_y), np.inf)
    for angle in grid.angles:
        for tx, ty in grid.shifts:
            params = np.tile([angle, tx, ty], (n_y, 1)).astype(np.float64)
            W = warp_se2(Y, params).reshape(n_y, -1)
            d = ((Q.reshape(n_q, 1, -1) - W[None]) ** 2).sum(-1)
            best = np.minimum(best, d)
    ind = np.argsort(best, axis=1, kind="stable")[:, :k]
    return np.sqrt(np.take_along_axis(best, ind, 1)), ind


class TestReference:
    @pytest.mark.parametrize("kw", [dict(max_rotation=180.0, n_rotations=12),
                                    dict(max_rotation=45.0, n_rotations=7, max_translation=1)])
    def test_grid_distances_equal_brute_force(self, smooth_images, kw):
        Y = smooth_images(24, 12, seed=1)
        Q = smooth_images(9, 12, seed=2)
        grid = make_search_grid("se2", refine=False, **kw)
        ref_d, ref_i = _reference_knn(Q, Y, grid, 4)
        for method in ("exact", "shortlist"):
            est = InvariantKNeighborsTransformer(refine=False, neighbor_search=method,
                                                 n_candidates=len(Y), **kw).fit(Y)
            dist, ind = est.kneighbors(Q, n_neighbors=4)
            assert dist.dtype == np.float64
            np.testing.assert_array_equal(ind, ref_i)
            np.testing.assert_allclose(dist, ref_d, rtol=1e-9, atol=1e-9)

    def test_integer_images_are_searched_in_float32(self):
        # uint8 images (as loaded from MNIST) become float32, as in the clusterer and
        # invariant_distances; float64 input stays float64 (test above)
        X = (np.random.default_rng(9).random((12, 8, 8)) * 255).astype(np.uint8)
        est = InvariantKNeighborsTransformer(n_neighbors=3, n_rotations=4).fit(X)
        dist, _ = est.kneighbors(X)
        assert dist.dtype == np.float32
        ref, _ = InvariantKNeighborsTransformer(n_neighbors=3, n_rotations=4).fit(
            X.astype(np.float32)).kneighbors(X.astype(np.float32))
        np.testing.assert_array_equal(dist, ref)

    def test_refined_distances_are_residuals_and_not_larger(self, smooth_images):
        Y = smooth_images(20, 12, seed=3)
        Q = smooth_images(6, 12, seed=4)
        kw = dict(max_rotation=180.0, n_rotations=12)
        grid_d, _ = _reference_knn(Q, Y, make_search_grid("se2", refine=False, **kw), 3)
        est = InvariantKNeighborsTransformer(**kw).fit(Y)
        dist, ind, tau = est.kneighbors(Q, n_neighbors=3, return_alignments=True)
        assert np.all(dist <= grid_d + 1e-12)  # refinement only lowers the k-th distances
        for j in range(3):
            res = Q - warp_se2(Y[ind[:, j]], tau[:, j])
            np.testing.assert_allclose(dist[:, j], np.sqrt((res ** 2).sum((1, 2))), rtol=1e-6)

    def test_shortlist_recall_on_copies(self, groups):
        X, _ = groups
        exact = InvariantKNeighborsTransformer(neighbor_search="exact").fit(X)
        short = InvariantKNeighborsTransformer(neighbor_search="shortlist",
                                               n_candidates=30).fit(X)
        _, i_exact = exact.kneighbors()
        _, i_short = short.kneighbors()
        recall = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(i_exact, i_short)])
        assert recall >= 0.95


# ----------------------------------------------------------------------------- bad input
class TestBadInput:
    X = random_images((12, 16), seed=9)

    @pytest.mark.parametrize("bad", [np.nan, np.inf])
    def test_non_finite(self, bad):
        Xb = self.X.copy()
        Xb[3, 2] = bad
        with pytest.raises(ValueError, match="X"):
            InvariantKNeighborsTransformer().fit(Xb)
        est = InvariantKNeighborsTransformer().fit(self.X)
        with pytest.raises(ValueError, match="X"):
            est.transform(Xb)

    def test_empty(self):
        with pytest.raises(ValueError, match="X: expected at least 1 sample"):
            InvariantKNeighborsTransformer().fit(np.zeros((0, 16)))
        est = InvariantKNeighborsTransformer().fit(self.X)
        with pytest.raises(ValueError, match="X: expected at least 1 sample"):
            est.transform(np.zeros((0, 16)))

    def test_wrong_image_shape(self):
        with pytest.raises(ValueError, match="image_shape"):
            InvariantKNeighborsTransformer(image_shape=(5, 5)).fit(self.X)
        est = InvariantKNeighborsTransformer().fit(self.X.reshape(12, 4, 4))
        with pytest.raises(ValueError, match="X: expected images of shape"):
            est.transform(self.X.reshape(12, 2, 8))

    def test_too_many_neighbors(self):
        est = InvariantKNeighborsTransformer(n_neighbors=12).fit(self.X)
        with pytest.raises(ValueError, match="n_neighbors"):
            est.transform(self.X)  # distance mode asks for 13 > 12
        with pytest.raises(ValueError, match="n_neighbors"):
            est.kneighbors()  # the training set: at most 11 others
        assert est.kneighbors(self.X)[1].shape == (12, 12)
        with pytest.raises(ValueError, match="n_neighbors"):
            est.kneighbors(self.X, n_neighbors=0)
        with pytest.raises(TypeError, match="n_neighbors"):
            est.kneighbors(self.X, n_neighbors=2.5)

    def test_query_of_another_width(self):
        est = InvariantKNeighborsTransformer().fit(self.X)
        with pytest.raises(ValueError, match="X has 25 features"):
            est.transform(random_images((3, 25)))

    def test_bad_parameters(self):
        with pytest.raises(ValueError, match="mode"):
            InvariantKNeighborsTransformer(mode="weights").fit(self.X)
        with pytest.raises(ValueError, match="neighbor_search"):
            InvariantKNeighborsTransformer(neighbor_search="fast").fit(self.X)
        with pytest.raises(ValueError, match="mode"):
            InvariantKNeighborsTransformer().fit(self.X).kneighbors_graph(mode="weights")
        with pytest.raises(ValueError, match="include_self"):
            invariant_kneighbors_graph(self.X, 2, include_self="yes")
        with pytest.raises(ValueError, match="graph"):
            symmetrize_graph(np.zeros((3, 3)))


# ----------------------------------------------------------------------------- estimator checks
@parametrize_with_checks([InvariantKNeighborsTransformer(),
                          InvariantKNeighborsTransformer(rotation_center="fourier")])
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


# ----------------------------------------------------------------------------- ecosystem
SYM = FunctionTransformer(symmetrize_graph, accept_sparse=True)


def _neighbours_share_group(E, y, k=3):
    ind = NearestNeighbors(n_neighbors=k).fit(E).kneighbors(return_distance=False)
    return bool(np.all(y[ind] == y[:, None]))


def _kmeans_ari(E, y):
    labels = KMeans(len(set(y)), n_init=10, random_state=0).fit_predict(E)
    return adjusted_rand_score(y, labels)


class TestEcosystem:
    def test_spectral_clustering(self, groups):
        X, y = groups
        # the transformer's defaults; the consumer reads the 5 neighbours it was given
        pipe = make_pipeline(InvariantKNeighborsTransformer(),
                             SpectralClustering(len(set(y)), n_neighbors=5, random_state=0,
                                                affinity="precomputed_nearest_neighbors"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "graph is not fully connected"
            labels = pipe.fit_predict(X)
        assert adjusted_rand_score(y, labels) == 1.0

    def test_dbscan(self, groups):
        X, y = groups
        # eps between the within-group and the between-group invariant distances, both from
        # the all-pairs reference; DBSCAN reads only the graph's entries, so the graph must
        # hold a whole group: n_neighbors = the largest group size
        D = np.sqrt(invariant_distances(X))
        same = y[:, None] == y[None]
        np.fill_diagonal(same, False)
        within, between = D[same].max(), D[y[:, None] != y[None]].min()
        assert within < between
        size = int(np.bincount(y).max())
        pipe = make_pipeline(InvariantKNeighborsTransformer(n_neighbors=size),
                             DBSCAN(eps=(within + between) / 2, metric="precomputed"))
        assert adjusted_rand_score(y, pipe.fit_predict(X)) == 1.0

    def test_hdbscan(self, groups):
        X, y = groups
        # HDBSCAN needs a symmetric and connected sparse graph: every pair, symmetrised
        pipe = make_pipeline(InvariantKNeighborsTransformer(n_neighbors=len(X) - 1), SYM,
                             HDBSCAN(metric="precomputed", copy=True))
        assert adjusted_rand_score(y, pipe.fit_predict(X)) == 1.0

    def test_tsne(self):
        X, y = figure2(*SETS["five-unequal"])
        # t-SNE needs 3 x perplexity + 1 neighbours per sample (as scikit-learn's example)
        pipe = make_pipeline(InvariantKNeighborsTransformer(n_neighbors=16),
                             TSNE(metric="precomputed", perplexity=5, init="random",
                                  random_state=0))
        E = pipe.fit_transform(X)
        assert E.shape == (len(X), 2)
        assert _neighbours_share_group(E, y) and _kmeans_ari(E, y) == 1.0

    def test_isomap(self, groups):
        X, y = groups
        # Isomap's geodesics need a connected graph; separated groups need every pair
        n = len(X)
        pipe = make_pipeline(InvariantKNeighborsTransformer(n_neighbors=n - 1),
                             Isomap(n_neighbors=n - 1, metric="precomputed"))
        E = pipe.fit_transform(X)
        assert _neighbours_share_group(E, y) and _kmeans_ari(E, y) == 1.0

    def test_umap(self):
        umap = pytest.importorskip("umap")
        X, y = figure2(*SETS["ten-small"])
        # default transformer: 5 neighbours + self; UMAP counts the sample itself
        pipe = make_pipeline(InvariantKNeighborsTransformer(), SYM,
                             umap.UMAP(n_neighbors=6, metric="precomputed", random_state=0,
                                       n_jobs=1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            E = pipe.fit_transform(X)
        assert E.shape == (len(X), 2)
        assert _neighbours_share_group(E, y) and _kmeans_ari(E, y) == 1.0


@pytest.mark.parametrize("neighbor_search", ["exact", "shortlist"])
def test_dask_client_gives_the_same_graph(neighbor_search):
    distributed = pytest.importorskip("distributed")
    X, _ = figure2(*SETS["five-unequal"])
    kw = dict(neighbor_search=neighbor_search, n_candidates=20, batch_size=16)
    local = InvariantKNeighborsTransformer(**kw).fit(X)
    d0, i0, t0 = local.kneighbors(return_alignments=True)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster:
        with distributed.Client(cluster) as client:
            est = InvariantKNeighborsTransformer(client=client, **kw).fit(X)
            d1, i1, t1 = est.kneighbors(return_alignments=True)
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_allclose(d1, d0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t1, t0, atol=1e-3)


def test_readme_pipeline_runs():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("## Invariant neighbours for the whole scikit-learn ecosystem", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)[0]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["embedding"].shape == (500, 2)


def test_benchmark_runs(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not have_data("mnist"):
        pytest.skip(f"MNIST not found under {DATA}")
    out = tmp_path / "neighbors.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_neighbors.py"),
                           "--n", "150", "--k", "3", "--data", str(DATA), "--out", str(out),
                           "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]  # one JSON per benchmark, its runs by name
    assert len(runs) == 1
    rows = next(iter(runs.values()))["results"]
    assert [r["method"] for r in rows] == ["exact", "shortlist", "pixels"]
    assert rows[0]["recall"] == 1.0 and all(0 <= r["recall"] <= 1 for r in rows)


def test_symmetrize_graph_keeps_smaller_and_zeros():
    G = sparse.csr_matrix((np.array([0.0, 2.0, 0.0, 1.5, 3.0, 0.0]),
                           np.array([0, 1, 1, 0, 2, 2]), np.array([0, 2, 5, 6])), shape=(3, 3))
    S = symmetrize_graph(G)
    np.testing.assert_array_equal(S.toarray(), [[0, 1.5, 0], [1.5, 0, 3], [0, 3, 0]])
    assert S.nnz == 7  # the three explicit zeros of the diagonal are kept
    assert isinstance(symmetrize_graph(sparse.csr_array(G)), sparse.sparray)


# ------------------------------------------------------------------ center=True
@pytest.mark.parametrize("n_shapes, n_copies, seed", [(5, 3, 0), (3, 5, 1)])
def test_center_finds_copies_shifted_beyond_the_search(n_shapes, n_copies, seed):
    # copies shifted within +-3 px differ pairwise by up to 7 px per axis; centred on their
    # centres of mass they differ by a rotation, which a +-1 px search holds
    X, y = shifted_digit_copies(n_shapes, n_copies, 3, seed)
    k = n_copies - 1
    knn = InvariantKNeighborsTransformer(n_neighbors=k, max_translation=1, center=True).fit(X)
    dist, ind, tau = knn.kneighbors(return_alignments=True)
    assert np.all(y[ind] == y[:, None])
    # the alignments warp the images as given (not centred) onto their queries
    warped = np.asarray(warp_se2(X[ind[:, 0]], tau[:, 0]))
    resid = np.linalg.norm((warped - X).reshape(len(X), -1), axis=1)
    apart = np.linalg.norm((X[ind[:, 0]] - X).reshape(len(X), -1), axis=1)
    assert np.all(resid < 0.25 * apart)
    # queries given anew (the training images) find the same neighbours, themselves first
    _, ind_q = knn.kneighbors(X, n_neighbors=n_copies)
    assert np.array_equal(ind_q[:, 0], np.arange(len(X)))
    assert np.all(y[ind_q] == y[:, None])
    assert knn.transform(X).shape == (len(X), len(X))


def test_center_off_is_the_default_auto_decides_and_checked():
    X, y = shifted_digit_copies(3, 4, 3, seed=2)
    assert InvariantKNeighborsTransformer().get_params()["center"] is False
    assert InvariantKNeighborsTransformer(max_translation=1).fit(X).center_ is False
    # "auto" with shifts searched on an empty background: centred, as with center=True
    auto = InvariantKNeighborsTransformer(n_neighbors=3, max_translation=1, center="auto").fit(X)
    forced = InvariantKNeighborsTransformer(n_neighbors=3, max_translation=1, center=True).fit(X)
    assert auto.center_ is True
    np.testing.assert_array_equal(auto.kneighbors()[1], forced.kneighbors()[1])
    assert np.all(y[auto.kneighbors()[1]] == y[:, None])
    assert InvariantKNeighborsTransformer(n_neighbors=3, center="auto").fit(X).center_ is False
    with pytest.raises(ValueError, match="center"):
        InvariantKNeighborsTransformer(center=1).fit(X)


# ----------------------------------------------------------------------------- rotation centre
def _quarter_turn_about_fourier_centre(x):
    """``x`` (H, W even) turned by 90 degrees counter-clockwise about the pixel (W // 2, H // 2)
    (``np.rot90`` turns about the geometric centre; the roll by one row brings that pixel
    back)."""
    return np.roll(np.rot90(x), 1, axis=0)


@pytest.mark.parametrize("reflection", [False, True])
def test_fourier_rotation_center_finds_exact_quarter_turns(reflection):
    rng = np.random.default_rng(3)
    fitted = np.zeros((6, 16, 16))
    fitted[:, 5:12, 5:12] = rng.random((6, 7, 7))
    queries = [fitted[:3]]
    for _ in range(3):
        queries.append(np.stack([_quarter_turn_about_fourier_centre(x) for x in queries[-1]]))
    Q = np.concatenate(queries[1:])  # the turns by 90, 180 and 270 degrees of images 0-2
    # the reference: the turn by 90 degrees is the float64 warp about (W // 2, H // 2)
    ref = warp_se2(fitted[:3], np.tile([[90.0, 0, 0]], (3, 1)), rotation_center="fourier")
    np.testing.assert_allclose(Q[:3], ref, atol=1e-12)
    knn = InvariantKNeighborsTransformer(n_neighbors=2, group="rotation", n_rotations=4,
                                         rotation_center="fourier", reflection=reflection,
                                         device="cpu").fit(fitted)
    dist, ind, tau = knn.kneighbors(Q, n_neighbors=1, return_alignments=True)
    np.testing.assert_array_equal(ind[:, 0], np.tile([0, 1, 2], 3))
    assert dist.max() < 1e-6
    np.testing.assert_allclose(warp_se2(fitted[ind[:, 0]], tau[:, 0], rotation_center="fourier"),
                               Q, atol=1e-10)
    np.testing.assert_allclose(tau[:, 0, 0] % 360, np.repeat([90.0, 180.0, 270.0], 3))
    # about the geometric centre (the default) they are half a pixel off
    geo = InvariantKNeighborsTransformer(n_neighbors=2, group="rotation", n_rotations=4,
                                         reflection=reflection, device="cpu").fit(fitted)
    assert geo.rotation_center == "geometric"
    assert geo.kneighbors(Q[:3], n_neighbors=1)[0].min() > 0.1


def test_rotation_center_is_checked_by_the_transformer():
    with pytest.raises(ValueError, match="rotation_center"):
        InvariantKNeighborsTransformer(rotation_center="middle").fit(np.zeros((3, 16)))
