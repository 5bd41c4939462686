"""A fuzz of the public API (issue 19): odd arrays in, a valid answer or a clear error out.

Two parts:

- regression tests, one or more per finding of the fuzz that opened issue 19 (each fails on
  the code before the fix);
- property tests with hypothesis over random shapes, dtypes, strides, values and parameters at
  their edges, for every public function and estimator, with one oracle: a finite output of the
  promised shape, or a ``ValueError``/``TypeError`` whose message names an argument of the call.
  Plus the invariances: 90-degree rotations and integer shifts leave distances unchanged, and
  permuting the samples permutes the neighbour graph.

The examples are few and small (images of at most 12 x 12, a handful of samples) and the
search is derandomised, so the file is reproducible and runs in about a minute on one core.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from _images import random_images
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from scipy import sparse

from invariant_cluster import (
    InvariantAttentionClusterer,
    InvariantKNeighborsTransformer,
    KernelPCAAttention,
    invariant_distances,
    invariant_kneighbors_graph,
    invariant_mean,
    warp_se2,
)
from invariant_cluster._utils import magnitude_limit
from invariant_cluster.alignment import make_search_grid, translation_limit
from invariant_cluster.datasets import make_transformed, make_transformed_copies

# a longer local run: FUZZ_SCALE=20 python -m pytest tests/test_fuzz.py
_SCALE = int(os.environ.get("FUZZ_SCALE", "1"))
FUZZ = settings(max_examples=25 * _SCALE, deadline=None, derandomize=_SCALE == 1,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(FUZZ, max_examples=12 * _SCALE)

DTYPES = [np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64, np.bool_,
          np.complex64]
VALUES = ["random", "nan", "inf", "constant", "zero", "huge", "tiny", "large"]
LAYOUTS = ["c", "samples reversed", "columns reversed", "fortran", "strided", "read-only"]


# ------------------------------------------------------------------------------ generators
def _values(rng, shape, kind):
    """float64 values of one kind; the cast to the dtype happens in :func:`_array`."""
    x = rng.random(shape)
    if kind == "nan":
        x.flat[rng.integers(x.size)] = np.nan
    elif kind == "inf":
        x.flat[rng.integers(x.size)] = -np.inf if rng.random() < 0.5 else np.inf
    elif kind == "constant":
        x[:] = 0.7
    elif kind == "zero":
        x[:] = 0.0
    elif kind == "huge":
        x *= 1e30  # overflows the squared norm in float32 (and float16 itself)
    elif kind == "tiny":
        x *= 1e-30  # squared norms underflow to 0 in float32
    elif kind == "large":
        x *= 1e6  # large, and still representable
    return x


def _cast(x, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":  # pixel levels; NaN becomes 0, inf and 1e30 saturate
        info = np.iinfo(dtype)
        with np.errstate(invalid="ignore"):
            x = np.nan_to_num(x * 255.0, nan=0.0, posinf=info.max, neginf=info.min)
            return np.clip(x, info.min, info.max).astype(dtype)
    if dtype.kind == "b":
        return np.nan_to_num(x) > 0.5
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dtype)


def _layout(x, layout):
    """The same values in another memory layout (strides, order, writeability)."""
    if layout == "samples reversed":
        return np.ascontiguousarray(x[::-1])[::-1]
    if layout == "columns reversed":
        return np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    if layout == "fortran":
        return np.asfortranarray(x)
    if layout == "strided":
        big = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype)
        big[..., ::2] = x
        return big[..., ::2]
    if layout == "read-only":
        x = x.copy()
        x.setflags(write=False)
    return x


@st.composite
def image_arrays(draw, *, min_samples=1, max_samples=6, max_side=8, dims=(2, 3, 4),
                 dtypes=DTYPES, values=VALUES):
    """``(array, description)``: an image array of random shape, dtype, values and layout."""
    n = draw(st.integers(min_samples, max_samples))
    h = draw(st.integers(1, max_side))
    w = draw(st.integers(1, max_side))
    ndim = draw(st.sampled_from(dims))
    c = draw(st.integers(1, 2)) if ndim == 4 else 1
    shape = {2: (n, h * w), 3: (n, h, w), 4: (n, c, h, w)}[ndim]
    dtype = draw(st.sampled_from(dtypes))
    kind = draw(st.sampled_from(values))
    layout = draw(st.sampled_from(LAYOUTS))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = _layout(_cast(_values(rng, shape, kind), dtype), layout)
    return x, dict(shape=shape, dtype=np.dtype(dtype).name, values=kind, layout=layout)


# ------------------------------------------------------------------------------ the oracle
def _outcome(call, names):
    """Run ``call``; return its result, or None after a clear ValueError/TypeError.

    Anything else (a crash inside torch, an AttributeError, a warning from torch about the
    input) fails; so does an error whose message names none of ``names``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*n_components.*")
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        warnings.filterwarnings("ignore", message=".*did not converge.*")
        warnings.filterwarnings("ignore", module="umap")
        warnings.filterwarnings("ignore", module="sklearn")
        try:
            out = call()
        except (ValueError, TypeError) as exc:
            msg = str(exc)
            assert any(name in msg for name in names), f"no argument named in: {msg!r}"
            event(f"refused: {type(exc).__name__} {msg.split(',')[0][:40]}")
            return None
    event("answered")
    return out


def _finite(*arrays):
    for a in arrays:
        a = a.toarray() if sparse.issparse(a) else np.asarray(a.detach().cpu()
                                                             if isinstance(a, torch.Tensor)
                                                             else a)
        assert np.isfinite(a).all(), "non-finite output"


def _check_graph(A, n_rows, n_cols, k):
    """A neighbour graph: k entries per row, distinct columns, sorted, finite, >= 0."""
    A = sparse.csr_matrix(A)
    assert A.shape == (n_rows, n_cols)
    assert (np.diff(A.indptr) == k).all()
    for i in range(n_rows):
        cols = A.indices[A.indptr[i]:A.indptr[i + 1]]
        vals = A.data[A.indptr[i]:A.indptr[i + 1]]
        assert len(set(cols.tolist())) == len(cols), "a neighbour repeated in one row"
        assert (np.diff(vals) >= 0).all(), "row not sorted by distance"
    _finite(A)
    assert (A.data >= 0).all()


# ------------------------------------------------------------------------------ properties
@FUZZ
@given(image_arrays(), st.sampled_from(["se2", "rotation", "translation", "none"]),
       st.sampled_from([1, 4, 7]), st.sampled_from([0, 0.5, 2, 1e6]), st.booleans())
def test_fuzz_invariant_distances(data, group, n_rotations, max_translation, refine):
    X, desc = data
    D = _outcome(lambda: invariant_distances(X, group=group, n_rotations=n_rotations,
                                             max_translation=max_translation, refine=refine,
                                             device="cpu"), ["X"])
    if D is not None:
        n = desc["shape"][0]
        assert D.shape == (n, n)
        _finite(D)
        assert (D >= 0).all()
        assert D.dtype == (np.float64 if desc["dtype"] == "float64" else np.float32)


@FEW
@given(image_arrays(max_samples=4), st.sampled_from([1, 2]), st.booleans(),
       st.sampled_from([None, "ones", "huge", "one-hot"]), st.sampled_from([0.0, 1e-5, 0.5]))
def test_fuzz_invariant_mean(data, max_iter, refine, weights, tol):
    X, desc = data
    n = desc["shape"][0]
    w = {None: None, "ones": np.ones(n), "huge": np.full(n, 1e308),
         "one-hot": np.eye(n)[0]}[weights]
    out = _outcome(lambda: invariant_mean(X, w, n_rotations=4, max_translation=1, refine=refine,
                                          max_iter=max_iter, tol=tol, device="cpu"),
                   ["X", "weights"])
    if out is not None:
        mean, tau = out
        assert mean.shape == ((int(np.prod(desc["shape"][1:])),) if len(desc["shape"]) == 2
                              else desc["shape"][1:])
        assert tau.shape == (n, 3)
        _finite(mean, tau)


@FUZZ
@given(image_arrays(dims=(3, 4)), st.sampled_from(["float", "int32", "int16", "uint8", "row",
                                                   "nan", "bool", "wrong"]))
def test_fuzz_warp_se2(data, params_kind):
    X, desc = data
    n = desc["shape"][0]
    rng = np.random.default_rng(n)
    params = {"float": rng.uniform(-180, 180, (n, 3)),
              "int32": rng.integers(-90, 90, (n, 3)).astype(np.int32),
              "int16": rng.integers(-90, 90, (n, 3)).astype(np.int16),
              "uint8": rng.integers(0, 90, (n, 3)).astype(np.uint8),
              "row": [90.0, 1.0, -1.0],
              "nan": np.full((n, 3), np.nan),
              "bool": np.ones((n, 3), bool),
              "wrong": np.zeros((n, 2))}[params_kind]
    out = _outcome(lambda: warp_se2(X, params), ["images", "params"])
    if out is not None:
        assert out.shape == X.shape
        _finite(out)


@FUZZ
@given(image_arrays(), st.sampled_from([0.0, 45.0, 180.0]), st.sampled_from([0, 1.5]))
def test_fuzz_make_transformed(data, max_rotation, max_translation):
    X, desc = data
    out = _outcome(lambda: make_transformed(X, max_rotation, max_translation, random_state=0),
                   ["X"])
    if out is not None:
        Xt, params = out
        assert Xt.shape == X.shape and params.shape == (desc["shape"][0], 3)
        _finite(Xt, params)


@FEW
@given(image_arrays(min_samples=1, max_samples=1, dims=(3,)), st.integers(1, 4))
def test_fuzz_make_transformed_copies(data, n_copies):
    X, desc = data
    out = _outcome(lambda: make_transformed_copies(X[0], n_copies, random_state=0),
                   ["image", "X", "n_copies"])
    if out is not None:
        copies, params = out
        assert copies.shape == (n_copies, *X.shape[1:])
        _finite(copies, params)


@FUZZ
@given(image_arrays(min_samples=2), st.integers(1, 6), st.sampled_from(["distance",
                                                                       "connectivity"]),
       st.sampled_from(["exact", "shortlist"]), st.sampled_from([0, 1]), st.booleans())
def test_fuzz_kneighbors(data, k, mode, search, max_translation, refine):
    X, desc = data
    n = desc["shape"][0]
    params = dict(n_rotations=4, max_translation=max_translation, refine=refine,
                  neighbor_search=search, device="cpu")

    def call():
        est = InvariantKNeighborsTransformer(n_neighbors=k, mode=mode, **params)
        return est, est.fit_transform(X), est.kneighbors(X[:1])
    out = _outcome(call, ["X", "n_neighbors"])
    if out is not None:
        est, A, (dist, ind) = out
        _check_graph(A, n, n, k + (mode == "distance"))
        assert (np.diff(dist, axis=1) >= 0).all()
        _finite(dist)
    G = _outcome(lambda: invariant_kneighbors_graph(X, k, mode="distance", **params),
                 ["X", "n_neighbors"])
    if G is not None:
        _check_graph(G, n, n, k)


@FEW
@given(image_arrays(min_samples=2, max_samples=8), st.sampled_from([None, 2]),
       st.sampled_from(["samples", "means"]), st.sampled_from(["fixed", "blurring"]),
       st.sampled_from([0, 1]))
def test_fuzz_clusterer(data, n_clusters, graph, update, max_iter):
    X, desc = data
    n = desc["shape"][0]

    def call():
        est = InvariantAttentionClusterer(n_clusters=n_clusters, graph=graph, update=update,
                                          n_rotations=4, max_iter=max_iter * 20, device="cpu",
                                          random_state=0)
        est.fit(X)
        return est, est.predict(X), est.transform(X)
    out = _outcome(call, ["X", "n_clusters"])
    if out is not None:
        est, pred, dist = out
        assert est.labels_.shape == (n,) and pred.shape == (n,)
        assert 0 <= est.labels_.min() and est.labels_.max() < est.n_clusters_
        assert dist.shape == (n, est.n_clusters_)
        _finite(est.cluster_centers_, est.invariant_means_, est.alignments_, dist,
                est.bandwidth_, est.attention_weights_)


@FEW
@given(image_arrays(min_samples=2, max_samples=8, dims=(2,)),
       st.sampled_from(["softmax", "invariant"]), st.booleans(),
       st.sampled_from(["auto", 1e-10]), st.sampled_from([1.0, 255.0]))
def test_fuzz_kernel_pca(data, kernel, robust, bandwidth, query_scale):
    X, desc = data
    robust = robust and kernel == "softmax"

    def call():
        est = KernelPCAAttention(kernel=kernel, robust=robust, bandwidth=bandwidth,
                                 n_rotations=4, device="cpu").fit(X)
        return est, est.transform(np.asarray(X, dtype=np.float64) * query_scale)
    out = _outcome(call, ["X", "bandwidth"])
    if out is not None:
        est, H = out
        assert H.shape == (desc["shape"][0], est.eigenvalues_.shape[0])
        _finite(H)


# ------------------------------------------------------------------------------ invariances
@FUZZ
@given(st.integers(2, 4), st.integers(5, 12), st.sampled_from([4, 8, 12, 36]),
       st.sampled_from(["rotation", "se2"]), st.booleans(), st.integers(0, 2**16))
def test_quarter_turns_leave_distances_unchanged(n, side, n_rotations, group, refine, seed):
    X = random_images((n, side, side), seed=seed).astype(np.float32)
    Y = random_images((n + 1, side, side), seed=seed + 1).astype(np.float32)
    k = seed % 4
    params = dict(group=group, n_rotations=n_rotations, refine=refine, device="cpu")
    D = invariant_distances(X, Y, **params).astype(np.float64)
    D_turned = invariant_distances(X, np.rot90(Y, k, axes=(1, 2)), **params)
    scale = float((X**2).sum((1, 2)).max())
    np.testing.assert_allclose(D_turned, D, atol=2e-4 * scale)


@FUZZ
@given(st.integers(2, 4), st.integers(7, 12), st.integers(1, 2), st.booleans(),
       st.integers(0, 2**16))
def test_integer_shifts_leave_distances_unchanged(n, side, max_translation, refine, seed):
    # content kept off the border (the shift of the test, the searched shifts, one pixel of
    # bilinear reach and one of the refinement's image gradient), so nothing meets the frame
    border = max_translation + 3
    assume(side > 2 * border)
    X = random_images((n, side, side), seed=seed, border=border)
    Y = random_images((n, side, side), seed=seed + 1, border=border)
    rng = np.random.default_rng(seed)
    tx, ty = rng.integers(-1, 2, 2)
    shift = lambda A: np.roll(A, (int(ty), int(tx)), axis=(1, 2))  # noqa: E731
    params = dict(group="translation", max_translation=max_translation, refine=refine,
                  device="cpu")
    D = invariant_distances(X, Y, **params)
    np.testing.assert_allclose(invariant_distances(shift(X), shift(Y), **params), D,
                               rtol=1e-6, atol=1e-8)


@FUZZ
@given(st.integers(4, 9), st.integers(5, 10), st.integers(1, 3), st.integers(0, 2**16),
       st.sampled_from(["exact", "shortlist"]))
def test_permuting_samples_permutes_neighbours(n, side, k, seed, search):
    assume(k < n)
    X = random_images((n, side, side), seed=seed)
    perm = np.random.default_rng(seed).permutation(n)
    params = dict(n_neighbors=k, n_rotations=4, neighbor_search=search, device="cpu")
    dist, ind = InvariantKNeighborsTransformer(**params).fit(X).kneighbors()
    dist_p, ind_p = InvariantKNeighborsTransformer(**params).fit(X[perm]).kneighbors()
    # row i of the permuted set is sample perm[i]; its neighbour j there is sample perm[j]
    np.testing.assert_allclose(dist_p, dist[perm], rtol=1e-5, atol=1e-6)
    same = perm[ind_p] == ind[perm]
    tied = np.isclose(dist_p, np.roll(dist_p, 1, axis=1), rtol=1e-5) | np.isclose(
        dist_p, np.roll(dist_p, -1, axis=1), rtol=1e-5)
    assert (same | tied).all()


# ------------------------------------------------------------------------------ regressions
def _views(X):
    """Views of ``X`` that torch cannot share: negative strides on each axis."""
    return {"X[::-1]": X[::-1], "rot90": np.rot90(X, 2, axes=(1, 2)),
            "columns": X[..., ::-1]}


def _equal_after_copy(fn, view):
    out_view = fn(view)
    out_copy = fn(np.ascontiguousarray(view))
    for a, b in zip(out_view if isinstance(out_view, tuple) else (out_view,),
                    out_copy if isinstance(out_copy, tuple) else (out_copy,), strict=True):
        np.testing.assert_array_equal(a, b)


_NEGATIVE_STRIDE_CALLS = {
    "invariant_distances": lambda X: invariant_distances(X, n_rotations=4, device="cpu"),
    "warp_se2": lambda X: warp_se2(X, [30.0, 0.5, 0.0]),
    "invariant_mean": lambda X: invariant_mean(X, n_rotations=4, max_iter=2, device="cpu"),
    "make_transformed": lambda X: make_transformed(X, random_state=0),
    "fit": lambda X: InvariantAttentionClusterer(n_rotations=4, random_state=0,
                                                 device="cpu").fit(X).labels_,
    "predict": lambda X: InvariantAttentionClusterer(n_rotations=4, random_state=0,
                                                     device="cpu").fit(
        np.ascontiguousarray(X)).predict(X),
    "flat fit": lambda X: InvariantAttentionClusterer(n_rotations=4, random_state=0,
                                                      device="cpu").fit(
        X.reshape(len(X), -1)[:, ::-1]).labels_,
}


@pytest.mark.parametrize("call", list(_NEGATIVE_STRIDE_CALLS))
def test_negative_strides_are_accepted(call):
    """F2: ``X[::-1]``, ``np.rot90`` views and ``flat[:, ::-1]`` give the answer of a copy."""
    X = random_images((7, 9, 9), seed=3).astype(np.float32)
    for view in _views(X).values():
        _equal_after_copy(_NEGATIVE_STRIDE_CALLS[call], view)


def _huge(shape=(4, 4, 4), scale=1e20, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).random(shape) * scale).astype(dtype)


_HUGE_CALLS = {
    "invariant_distances": lambda X: invariant_distances(X, device="cpu"),
    "invariant_distances refine=False": lambda X: invariant_distances(X, refine=False,
                                                                      device="cpu"),
    "invariant_mean": lambda X: invariant_mean(X, n_rotations=4, device="cpu"),
    "kneighbors": lambda X: InvariantKNeighborsTransformer(n_neighbors=2,
                                                           device="cpu").fit_transform(X),
    "kneighbors_graph": lambda X: invariant_kneighbors_graph(X, 2, device="cpu"),
    "fit": lambda X: InvariantAttentionClusterer(device="cpu").fit(X),
    "fit graph=means": lambda X: InvariantAttentionClusterer(graph="means",
                                                             device="cpu").fit(X),
    "kpca invariant": lambda X: KernelPCAAttention(kernel="invariant",
                                                   device="cpu").fit(X.reshape(len(X), -1)),
}


@pytest.mark.parametrize("call", list(_HUGE_CALLS))
@pytest.mark.parametrize("data", ["float32 1e20", "float32 1e30", "int64 2^62"])
def test_huge_finite_values_are_refused(call, data):
    """F3, F6: a finite input whose squared norm overflows float32 is refused, naming X."""
    if data == "int64 2^62":
        X = (np.random.default_rng(0).random((6, 4, 4)) * 2.0**62).astype(np.int64)
    else:
        X = _huge((6, 4, 4), scale=float(data.split()[1]))
    with pytest.raises(ValueError, match=r"^X: .*squared norm"):
        _HUGE_CALLS[call](X)


@pytest.mark.parametrize("call", list(_HUGE_CALLS))
def test_large_values_below_the_bound_give_finite_answers(call):
    """Just under the bound the answers are finite (and the kNN graph well formed)."""
    shape = (6, 4, 4)
    limit = magnitude_limit(np.float32, (1, 4, 4))
    X = _huge(shape, scale=1.0)
    X *= np.float32(0.5 * np.sqrt(limit / (X.reshape(6, -1) ** 2).sum(1).max()))
    out = _HUGE_CALLS[call](X)
    if isinstance(out, tuple):
        _finite(*out)
    elif sparse.issparse(out):
        _check_graph(out, 6, 6, 3 if "graph" not in call else 2)
    elif isinstance(out, np.ndarray):
        _finite(out)
    elif hasattr(out, "labels_"):
        _finite(out.cluster_centers_, out.invariant_means_)
    else:
        _finite(out.transform(X.reshape(6, -1)))


def test_huge_values_refused_in_predict_and_transform():
    X = random_images((8, 6, 6), seed=1).astype(np.float32)
    est = InvariantAttentionClusterer(n_rotations=4, device="cpu", random_state=0).fit(X)
    with pytest.raises(ValueError, match="^X: .*squared norm"):
        est.predict(X * np.float32(1e20))
    knn = InvariantKNeighborsTransformer(n_neighbors=2, device="cpu").fit(X)
    with pytest.raises(ValueError, match="^X: .*squared norm"):
        knn.transform(X * np.float32(1e20))


@pytest.mark.parametrize("group", ["translation", "se2"])
def test_max_translation_beyond_the_image_is_capped(group):
    """F4: shifts past the frame change nothing, so the search stops there (no 27 GB)."""
    X = random_images((4, 6, 6), seed=2)
    cap = translation_limit((1, 6, 6), group)
    grid = make_search_grid(group, n_rotations=4, max_translation=100, image_shape=(1, 6, 6))
    assert grid.max_translation == cap
    assert np.abs(grid.shifts).max() == cap
    params = dict(group=group, n_rotations=4, refine=False, device="cpu")
    D = invariant_distances(X, max_translation=100, **params)
    np.testing.assert_array_equal(D, invariant_distances(X, max_translation=cap, **params))


def test_translation_cap_is_exact():
    """The cap loses nothing: brute force over every integer shift up to twice the image."""
    X = random_images((3, 5, 7), seed=4)
    D = invariant_distances(X, group="translation", max_translation=1e9, refine=False,
                            device="cpu")
    h, w = X.shape[1:]
    pad = 2 * max(h, w)
    P = np.pad(X, ((0, 0), (pad, pad), (pad, pad)))
    ref = np.full((3, 3), np.inf)
    for ty in range(-pad, pad + 1):
        for tx in range(-pad, pad + 1):
            S = P[:, pad - ty:pad - ty + h, pad - tx:pad - tx + w]  # S(u) = X(u - t)
            ref = np.minimum(ref, ((X[:, None] - S[None]) ** 2).sum((2, 3)))
    np.testing.assert_allclose(D, ref, rtol=1e-5, atol=1e-6)


def test_estimators_cap_max_translation():
    X = random_images((6, 6, 6), seed=5).astype(np.float32)
    A = InvariantKNeighborsTransformer(n_neighbors=2, group="translation", max_translation=100,
                                       refine=False, device="cpu").fit_transform(X)
    B = InvariantKNeighborsTransformer(n_neighbors=2, group="translation", max_translation=6,
                                       refine=False, device="cpu").fit_transform(X)
    np.testing.assert_array_equal(A.toarray(), B.toarray())


class TestKernelPCAInvariantEdges:
    """F5: the invariant kernel's transform stays finite; robust PAP on zero keys is clear."""

    X = random_images((12, 6, 6), seed=6).reshape(12, -1)

    def test_query_far_from_every_key(self):
        est = KernelPCAAttention(3, kernel="invariant", n_rotations=4, device="cpu").fit(self.X)
        H = est.transform(self.X * 255)
        _finite(H)

    def test_tiny_bandwidth(self):
        est = KernelPCAAttention(3, kernel="invariant", n_rotations=4, bandwidth=1e-10,
                                 device="cpu").fit(self.X)
        _finite(est.transform(self.X))

    def test_shares_equal_the_normalised_kernel_rows(self):
        # where the row sums are not 0, the stable shares are the kernel rows divided by them
        est = KernelPCAAttention(3, kernel="invariant", n_rotations=4, whiten=False,
                                 device="cpu").fit(self.X)
        Kq = est.kernel_matrix(self.X[:4])
        g = np.asarray(Kq.sum(axis=1)).ravel()
        A = est.eigenvectors_ - est.eigenvectors_.mean(axis=0)
        ref = (Kq.toarray() / g[:, None]) @ (np.exp(-est.log_normalisers_)[:, None] * A)
        np.testing.assert_allclose(est.transform(self.X[:4]), ref, rtol=1e-10, atol=1e-14)

    @pytest.mark.parametrize("robust", [False, True])
    def test_zero_keys(self, robust):
        with pytest.raises(ValueError, match="X"):
            KernelPCAAttention(robust=robust, device="cpu").fit(np.zeros((5, 4)))
        with pytest.warns(UserWarning, match="n_components"):
            est = KernelPCAAttention(2, robust=robust, device="cpu").fit(np.zeros((5, 4)))
        _finite(est.transform(np.zeros((2, 4))), est.keys_)


class TestInvariantMeanEdges:
    """F7."""

    X = random_images((4, 7, 7), seed=7)

    def test_nested_list_of_images(self):
        params = dict(n_rotations=4, max_iter=2, device="cpu")
        X4 = self.X[:, None]  # (n, C, H, W)
        mean_list, tau_list = invariant_mean([x for x in X4], **params)
        mean, tau = invariant_mean(X4, **params)
        np.testing.assert_array_equal(mean_list, mean)
        assert mean.shape == (1, 7, 7)
        np.testing.assert_array_equal(tau_list, tau)

    def test_huge_weights(self):
        params = dict(n_rotations=4, max_iter=2, device="cpu")
        mean, _ = invariant_mean(self.X, np.full(4, 1e308), **params)
        ref, _ = invariant_mean(self.X, **params)
        np.testing.assert_allclose(mean, ref, rtol=1e-12, atol=1e-12)

    @pytest.mark.parametrize("tol, error", [("a", TypeError), (None, TypeError),
                                            (-1.0, ValueError), (float("nan"), ValueError),
                                            (float("inf"), ValueError)])
    def test_tol(self, tol, error):
        with pytest.raises(error, match="tol"):
            invariant_mean(self.X, tol=tol, n_rotations=4, device="cpu")


@pytest.mark.parametrize("estimator", [
    InvariantAttentionClusterer(n_rotations=4, random_state=0, device="cpu"),
    InvariantKNeighborsTransformer(n_neighbors=2, n_rotations=4, device="cpu"),
])
def test_estimators_accept_a_list_of_images(estimator):
    """F8: a list of (H, W) (or (C, H, W)) images is the same input as their stack."""
    X = random_images((6, 7, 7), seed=8).astype(np.float32)
    for imgs in (X, X[:, None]):
        a = estimator.fit_transform(imgs)
        b = estimator.fit_transform([x for x in imgs])
        a = a.toarray() if sparse.issparse(a) else a
        b = b.toarray() if sparse.issparse(b) else b
        np.testing.assert_array_equal(a, b)


def test_ragged_lists_are_refused_by_name():
    ragged = [np.zeros((4, 4)), np.zeros((5, 5))]
    with pytest.raises(ValueError, match="X"):
        invariant_distances(ragged)
    with pytest.raises(ValueError, match="X"):
        InvariantAttentionClusterer().fit(ragged)
    with pytest.raises(ValueError, match="images"):
        warp_se2(ragged, [0, 0, 0])


class TestWarpSE2Minor:
    x = random_images((2, 5, 5), seed=9)

    @pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
    def test_non_finite_images(self, bad):
        x = self.x.copy()
        x[1, 2, 3] = bad
        with pytest.raises(ValueError, match="images"):
            warp_se2(x, [0.0, 0.0, 0.0])
        with pytest.raises(ValueError, match="images"):
            warp_se2(torch.as_tensor(x), [0.0, 0.0, 0.0])

    @pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64])
    def test_integer_params_of_any_width(self, dtype):
        params = np.array([[90, 1, 0], [0, 0, 2]], dtype=dtype)
        np.testing.assert_array_equal(warp_se2(self.x, params),
                                      warp_se2(self.x, params.astype(np.float64)))

    def test_bool_params_are_refused(self):
        with pytest.raises(TypeError, match="params"):
            warp_se2(self.x, np.ones((2, 3), bool))


def test_read_only_input_raises_no_torch_warning():
    """torch warns once per process on a read-only array, so this runs in a fresh one."""
    code = """
import warnings
import numpy as np
warnings.simplefilter("error")
from invariant_cluster import (InvariantKNeighborsTransformer, invariant_distances,
                               invariant_mean, warp_se2)
from invariant_cluster.datasets import make_transformed
from invariant_cluster.diagnostics import projection_loss
X = np.random.default_rng(0).random((5, 6, 6)).astype(np.float32)
X.setflags(write=False)
P = np.zeros((5, 3)); P.setflags(write=False)
warp_se2(X, P)
invariant_distances(X, n_rotations=4, device="cpu")
invariant_mean(X, n_rotations=4, max_iter=1, device="cpu")
make_transformed(X, random_state=0)
knn = InvariantKNeighborsTransformer(n_neighbors=2, n_rotations=4, device="cpu").fit(X)
knn.transform(X)
F = X.reshape(5, -1).astype(np.float64); F.setflags(write=False)
projection_loss(F, F, F[:, :4])
"""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-2000:]


_COMPLEX_CALLS = {
    "invariant_distances": lambda Z: invariant_distances(Z),
    "invariant_mean": lambda Z: invariant_mean(Z),
    "warp_se2 images": lambda Z: warp_se2(Z, [0, 0, 0]),
    "warp_se2 params": lambda Z: warp_se2(Z.real, np.zeros((len(Z), 3), complex)),
    "make_transformed": lambda Z: make_transformed(Z),
    "clusterer fit": lambda Z: InvariantAttentionClusterer().fit(Z),
    "clusterer fit list": lambda Z: InvariantAttentionClusterer().fit(list(Z)),
    "kneighbors fit": lambda Z: InvariantKNeighborsTransformer().fit(Z),
    "kneighbors_graph": lambda Z: invariant_kneighbors_graph(Z, 2),
    "kpca fit": lambda Z: KernelPCAAttention().fit(Z.reshape(len(Z), -1)),
    "torch": lambda Z: invariant_distances(torch.as_tensor(Z)),
}


@pytest.mark.parametrize("call", list(_COMPLEX_CALLS))
def test_complex_input_is_one_value_error(call):
    """Minor finding: complex data is a ValueError everywhere, naming the argument.

    ValueError because scikit-learn's estimator checks require it of every estimator
    (``check_complex_data``), and functions answer as the estimators do.
    """
    Z = random_images((4, 5, 5), seed=10).astype(np.complex64)
    with pytest.raises(ValueError, match=r"^(X|images|params): Complex data not supported"):
        _COMPLEX_CALLS[call](Z)


# ------------------------------------------------------------------------------ more surfaces
@FEW
@given(image_arrays(min_samples=1, max_samples=8), st.sampled_from(["auto", 0.0, 0.1, 5.0]),
       st.sampled_from([0.5, 1.0]))
def test_fuzz_radial_wiener(data, noise_std, power):
    from invariant_cluster import RadialWiener

    X, desc = data

    def call():
        est = RadialWiener(noise_std=noise_std, power=power).fit(X)
        return est, est.transform(X)
    out = _outcome(call, ["X", "noise_std", "power"])
    if out is not None:
        est, Y = out
        assert np.shape(Y) == (desc["shape"][0], int(np.prod(desc["shape"][1:])))  # flattened
        assert np.isfinite(est.noise_std_) and est.noise_std_ >= 0
        _finite(Y)


@FEW
@given(image_arrays(min_samples=1, max_samples=8, dims=(3, 4)), st.sampled_from([1, 3, 40]),
       st.sampled_from([None, 4]))
def test_fuzz_dihedral_pca(data, n_components, output_size):
    from invariant_cluster import DihedralPCA

    X, desc = data

    def call():
        est = DihedralPCA(n_components, output_size=output_size).fit(X)
        return est, est.transform(X)
    out = _outcome(call, ["X", "n_components", "output_size"])
    if out is not None:
        est, Y = out
        assert np.shape(Y)[0] == desc["shape"][0]
        _finite(Y)


@FEW
@given(image_arrays(min_samples=2, max_samples=7), st.integers(1, 4), st.booleans(),
       st.sampled_from(["se2", "rotation", "translation", "none"]))
def test_fuzz_class_averages(data, k, with_labels, group):
    from invariant_cluster import class_averages

    X, desc = data
    n = desc["shape"][0]
    labels = np.arange(n) % 2 if with_labels else None

    def call():
        return class_averages(X, n_neighbors=k, labels=labels, group=group, n_rotations=4,
                              max_translation=1)
    out = _outcome(call, ["X", "n_neighbors", "labels"])
    if out is not None:
        assert np.shape(out) == ((len(np.unique(labels)), *desc["shape"][1:]) if with_labels
                                 else desc["shape"])
        _finite(out)


@FEW
@given(image_arrays(min_samples=2, max_samples=7), st.integers(1, 4), st.booleans())
def test_fuzz_aligned_neighbors(data, k, reflection):
    from invariant_cluster import aligned_neighbors

    X, desc = data
    n = desc["shape"][0]

    def call():
        return aligned_neighbors(X, n_neighbors=k, n_rotations=4, reflection=reflection)
    out = _outcome(call, ["X", "n_neighbors"])
    if out is not None:
        ind, tau = out
        assert ind.shape == (n, k) and tau.shape == (n, k, 4 if reflection else 3)
        assert ((ind >= 0) & (ind < n)).all()
        assert (ind != np.arange(n)[:, None]).all(), "an image is its own neighbour"
        assert all(len(set(row)) == k for row in ind.tolist()), "a neighbour repeated"
        _finite(tau)


@FEW
@given(st.sampled_from(["valid", "truncated", "garbage", "empty", "header only", "nan",
                        "volume"]),
       st.sampled_from([np.float32, np.int16, np.int8, np.uint16, np.float16]),
       st.integers(1, 4), st.integers(1, 9), st.integers(0, 2**16))
def test_fuzz_load_mrc(kind, dtype, n, side, seed):
    mrcfile = pytest.importorskip("mrcfile")
    import tempfile
    from pathlib import Path

    from invariant_cluster.datasets import load_mrc

    rng = np.random.default_rng(seed)
    data = (rng.random((n, side, side)) * 100).astype(dtype)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stack.mrcs"
        if kind in ("valid", "truncated", "header only", "nan"):
            if kind == "nan":
                data = data.astype(np.float32)
                data.flat[seed % data.size] = np.nan
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # mrcfile's, on NaN
                with mrcfile.new(path) as mrc:
                    mrc.set_data(data)
            raw = path.read_bytes()
            if kind == "truncated":
                path.write_bytes(raw[:-max(1, data.nbytes // 2)])
            elif kind == "header only":
                path.write_bytes(raw[:1024])
        elif kind == "volume":
            path = Path(tmp) / "volume.mrc"
            with mrcfile.new(path) as mrc:
                mrc.set_data(np.zeros((max(n, 2), side, side), np.float32))
                mrc.set_volume()
        elif kind == "garbage":
            path.write_bytes(rng.integers(0, 256, 1024 + side * 7, dtype=np.uint8).tobytes())
        else:
            path.write_bytes(b"")
        try:
            images = load_mrc(path)
        except ValueError as exc:
            assert str(path) in str(exc), str(exc)
            assert kind != "valid", str(exc)
            return
    assert kind == "valid", f"{kind} file read without an error"
    assert images.dtype == np.float32 and images.shape == (n, side, side)
    np.testing.assert_array_equal(images, data.astype(np.float32))


# ------------------------------------------------------------------------------ metamorphic
def _copy_set(k, copies, side, seed, noise=0.0):
    """``k`` random shapes, each in ``copies`` exact quarter turns (on every grid of a multiple
    of 4 angles), with a little noise: a set whose partition is the shape."""
    rng = np.random.default_rng(seed)
    shapes = random_images((k, side, side), seed=seed, border=2).astype(np.float32)
    X = np.stack([np.rot90(shapes[j], int(rng.integers(4))) for j in range(k)
                  for _ in range(copies)])
    X = X + noise * rng.standard_normal(X.shape).astype(np.float32)
    return X, np.repeat(np.arange(k), copies)


def _partition_fit(X, n_clusters=None, **kw):
    params = dict(n_clusters=n_clusters, group="rotation", n_rotations=8, device="cpu",
                  random_state=0)
    params.update(kw)
    return InvariantAttentionClusterer(**params).fit(X)


@FEW
@given(st.integers(2, 4), st.integers(3, 6), st.integers(8, 12), st.sampled_from([None, "k"]),
       st.integers(0, 2**16))
def test_quarter_turns_of_every_image_leave_the_partition(k, copies, side, given_k, seed):
    """A quarter turn of every image permutes each image's pixels: the content's canonical
    order and the noise estimate stay, and the search's distances change by float rounding
    only, which cannot move a partition with a margin (on images without structure any
    partition is a tie, and rounding may break it either way)."""
    from sklearn.metrics import adjusted_rand_score

    X, _ = _copy_set(k, copies, side, seed, noise=0.02)
    n_clusters = k if given_k else None
    ref = _partition_fit(X, n_clusters).labels_
    turned = _partition_fit(np.rot90(X, 1 + seed % 3, axes=(1, 2)), n_clusters).labels_
    assert adjusted_rand_score(ref, turned) == 1.0


@FEW
@given(st.integers(4, 14), st.integers(5, 10), st.sampled_from([None, 2]), st.booleans(),
       st.integers(0, 2**16))
def test_permutation_and_stacking_leave_the_partition(n, side, n_clusters, structured, seed):
    """Any images, structured or not: the fit runs on the distinct images in an order set by
    their content, so permuting the samples or storing the set twice cannot move it."""
    from sklearn.metrics import adjusted_rand_score

    if structured:
        X, _ = _copy_set(max(2, n // 4), 4, side, seed, noise=0.02)
    else:
        X = random_images((n, side, side), seed=seed).astype(np.float32)
    assume(n_clusters is None or n_clusters <= len(X))
    ref = _partition_fit(X, n_clusters)
    perm = np.random.default_rng(seed).permutation(len(X))
    permuted = _partition_fit(X[perm], n_clusters).labels_
    assert adjusted_rand_score(ref.labels_[perm], permuted) == 1.0
    twice = _partition_fit(np.concatenate([X, X]), n_clusters).labels_
    np.testing.assert_array_equal(twice[:len(X)], twice[len(X):])
    assert adjusted_rand_score(ref.labels_, twice[:len(X)]) == 1.0


@FEW
@given(st.integers(4, 14), st.integers(1, 2), st.sampled_from([None, 2]), st.integers(0, 2**16))
def test_a_common_integer_shift_leaves_the_translation_partition(n, shift, n_clusters, seed):
    """Every image moved by the same integer shift, content inside the frame: a symmetry of
    the translation search, so the partition stays (se2 differs: the reliability page)."""
    from sklearn.metrics import adjusted_rand_score

    X = random_images((n, 12, 12), seed=seed, border=4).astype(np.float32)
    params = dict(group="translation", max_translation=1)
    ref = _partition_fit(X, n_clusters, **params).labels_
    moved = _partition_fit(np.roll(X, shift, axis=2), n_clusters, **params).labels_
    assert adjusted_rand_score(ref, moved) == 1.0


@FEW
@given(st.integers(4, 12), st.integers(5, 10), st.integers(0, 2**16))
def test_uint8_images_equal_their_float32_values(n, side, seed):
    """Integer images are taken at their values (no rescaling), in every estimator."""
    from invariant_cluster import RadialWiener

    X8 = (random_images((n, side, side), seed=seed) * 255).round().clip(0, 255).astype(
        np.uint8)
    X32 = X8.astype(np.float32)
    a, b = _partition_fit(X8, 2), _partition_fit(X32, 2)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    params = dict(n_neighbors=min(3, n - 1), n_rotations=4, device="cpu")
    np.testing.assert_array_equal(
        InvariantKNeighborsTransformer(**params).fit(X8).kneighbors()[0],
        InvariantKNeighborsTransformer(**params).fit(X32).kneighbors()[0])
    np.testing.assert_array_equal(RadialWiener().fit_transform(X8),
                                  RadialWiener().fit_transform(X32))


@pytest.mark.parametrize("out", ["", " ", "\t"])
def test_cli_empty_out_is_a_usage_error(tmp_path, monkeypatch, capsys, out):
    """``--out "$UNSET"``: exit status 2, and nothing written into the current folder."""
    from invariant_cluster.cli import main

    np.save(tmp_path / "x.npy", random_images((6, 8, 8), seed=0).astype(np.float32))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(SystemExit) as exc:
        code = main(["fit", str(tmp_path / "x.npy"), "--out", out])
        raise SystemExit(code)
    assert exc.value.code == 2
    assert "--out" in capsys.readouterr().err
    assert list(work.iterdir()) == []
