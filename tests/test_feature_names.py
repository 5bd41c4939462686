"""Column names through every estimator that takes flat rows, as scikit-learn's own estimators
handle them (issue 40, item 9): ``fit`` on a data frame of string columns sets
``feature_names_in_``, later calls check the names, every transformer names its output columns
(``get_feature_names_out``) and so supports ``set_output(transform="pandas")``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.base import clone

from invariant_cluster import (
    DihedralPCA,
    InvariantAttentionClusterer,
    InvariantKNeighborsTransformer,
    KernelPCAAttention,
    RadialWiener,
    SteerableWiener,
)

pd = pytest.importorskip("pandas")

N, H = 24, 4
ESTIMATORS = [
    RadialWiener(),
    RadialWiener(noise_std=0.1),
    SteerableWiener(noise_std=0.1),
    DihedralPCA(n_components=3),
    InvariantKNeighborsTransformer(n_neighbors=3, n_rotations=4, device="cpu"),
    KernelPCAAttention(n_components=2, n_neighbors=5, n_rotations=4, device="cpu"),
    InvariantAttentionClusterer(n_clusters=2, n_neighbors=5, n_rotations=4, device="cpu",
                                random_state=0),
]
IDS = ["RadialWiener", "RadialWiener(0.1)", "SteerableWiener(0.1)", "DihedralPCA",
       "InvariantKNeighborsTransformer", "KernelPCAAttention", "InvariantAttentionClusterer"]


def _frame(columns=None, seed=0):
    X = np.random.default_rng(seed).random((N, H * H)).astype(np.float32)
    columns = [f"px{i}" for i in range(H * H)] if columns is None else columns
    return pd.DataFrame(X, columns=columns, index=np.arange(100, 100 + N))


def _fit(est, X):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence on random pixels
        return clone(est).fit(X)


@pytest.mark.parametrize("est", ESTIMATORS, ids=IDS)
def test_fit_on_a_frame_sets_feature_names_in(est):
    df = _frame()
    est = _fit(est, df)
    np.testing.assert_array_equal(est.feature_names_in_, df.columns)
    assert est.n_features_in_ == H * H


@pytest.mark.parametrize("est", ESTIMATORS, ids=IDS)
def test_other_names_after_fit_are_refused(est):
    est = _fit(est, _frame())
    other = _frame(columns=[f"q{i}" for i in range(H * H)])
    with pytest.raises(ValueError, match="feature names"):
        est.transform(other)


@pytest.mark.parametrize("est", ESTIMATORS, ids=IDS)
def test_arrays_set_no_names_and_a_frame_then_warns(est):
    df = _frame()
    est = _fit(est, df.to_numpy())
    assert not hasattr(est, "feature_names_in_")
    with pytest.warns(UserWarning, match="feature names"):
        est.transform(df)


# InvariantKNeighborsTransformer returns a sparse graph, which pandas output refuses as for
# scikit-learn's KNeighborsTransformer
DENSE = [(e, i) for e, i in zip(ESTIMATORS, IDS) if i != "InvariantKNeighborsTransformer"]


@pytest.mark.parametrize("est", [e for e, _ in DENSE], ids=[i for _, i in DENSE])
def test_set_output_pandas_names_the_columns(est):
    df = _frame()
    est = _fit(est, df).set_output(transform="pandas")
    out = est.transform(df)
    assert isinstance(out, pd.DataFrame)
    np.testing.assert_array_equal(out.columns, est.get_feature_names_out())
    np.testing.assert_array_equal(out.index, df.index)


def test_radial_wiener_keeps_the_pixel_names():
    df = _frame()
    f = RadialWiener(noise_std=0.1).fit(df)
    np.testing.assert_array_equal(f.get_feature_names_out(), df.columns)
    g = RadialWiener().fit(df.to_numpy())
    np.testing.assert_array_equal(g.get_feature_names_out(), [f"x{i}" for i in range(H * H)])
    with pytest.raises(ValueError, match="input_features"):
        f.get_feature_names_out([f"q{i}" for i in range(H * H)])


def test_clusterer_names_its_distances_and_its_filter_the_pixels():
    df = _frame()
    est = _fit(ESTIMATORS[-1], df)
    names = est.get_feature_names_out()
    assert list(names) == [f"invariantattentionclusterer{i}" for i in range(est.n_clusters_)]
    np.testing.assert_array_equal(est.filter_.feature_names_in_, df.columns)


def test_integer_columns_set_no_names():
    # scikit-learn records names only when every column name is a string
    est = RadialWiener().fit(pd.DataFrame(_frame().to_numpy()))
    assert not hasattr(est, "feature_names_in_")
