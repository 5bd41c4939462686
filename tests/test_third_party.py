"""Third-party packages through their public API only: nothing patched, nothing compiled by
the default fit."""

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

_DEFAULT_FIT = '''
import sys
import numpy as np
import invariant_cluster
from invariant_cluster import InvariantAttentionClusterer, InvariantKNeighborsTransformer
from invariant_cluster.datasets import load_digits_images, make_transformed_copies
X, _ = load_digits_images(return_X_y=True)
Xc = np.concatenate([make_transformed_copies(X[i].reshape(8, 8), 12, random_state=i)[0]
                     for i in range(6)]).reshape(72, -1)
for graph in ("auto", "both"):
    est = InvariantAttentionClusterer(n_rotations=12, graph=graph, random_state=0).fit(Xc)
    InvariantAttentionClusterer(3, n_rotations=12, graph=graph, random_state=0).fit(Xc)
InvariantKNeighborsTransformer(n_neighbors=5, n_rotations=8).fit_transform(Xc)
print(sorted(m for m in ("numba", "pynndescent", "umap") if m in sys.modules))
'''


def test_default_fit_imports_no_compiling_package():
    """The default fit and the transformer never import umap-learn, pynndescent or numba, so
    a fresh installation compiles nothing on first use."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_DEFAULT_FIT)],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "[]"


def test_umap_grouping_leaves_umap_and_pynndescent_unpatched():
    """``grouping="umap"`` uses umap-learn as it is: every public attribute of its and
    pynndescent's modules is the same object after the fit as before."""
    umap_ = pytest.importorskip("umap.umap_")
    pynndescent_ = pytest.importorskip("pynndescent.pynndescent_")
    from invariant_cluster import InvariantAttentionClusterer

    def snapshot():
        return {(m.__name__, k): id(v) for m in (umap_, pynndescent_)
                for k, v in vars(m).items() if not k.startswith("__")}

    before = snapshot()
    rng = np.random.default_rng(0)
    X = np.repeat(rng.random((4, 64)), 25, axis=0) + 0.2 * rng.random((100, 64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        InvariantAttentionClusterer(4, group="translation", grouping="umap",
                                    random_state=0).fit(X)
    assert snapshot() == before


def test_umap_grouping_without_umap_learn_names_the_extra(monkeypatch):
    """Without umap-learn (an optional extra), ``grouping="umap"`` fails with an ImportError
    that says how to install it; the default grouping does not need it."""
    from invariant_cluster import InvariantAttentionClusterer

    monkeypatch.setitem(sys.modules, "umap", None)  # "import umap" raises ImportError
    rng = np.random.default_rng(1)
    X = np.repeat(rng.random((3, 36)), 30, axis=0) + 0.2 * rng.random((90, 36))
    with pytest.raises(ImportError, match=r"invariant_cluster\[umap\]"):
        InvariantAttentionClusterer(3, group="translation", grouping="umap",
                                    random_state=0).fit(X)
    est = InvariantAttentionClusterer(3, group="translation", random_state=0).fit(X)
    assert len(set(est.labels_)) == 3
