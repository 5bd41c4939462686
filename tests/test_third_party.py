"""numba's on-disk cache for umap-learn's and pynndescent's functions (``_third_party``)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from invariant_cluster._third_party import _passes_functions  # noqa: E402

# the pattern of pynndescent: a compiled distance passed to another compiled function
_PACKAGE = '''
import numba
import numpy as np


@numba.njit
def dist(a, b):
    return ((a - b) ** 2).sum()


@numba.njit
def apply(f, x):
    return f(x, x + 1.0)


@numba.njit
def plain(x):
    return x.sum()


@numba.njit
def apply_pointer(f, x):
    return f(x, x + 1.0)


# the distance as a function pointer: its type is its signature, the same in every process
pointer = numba.cfunc("float64(float64[::1], float64[::1])")(dist.py_func)
'''

_RUN = '''
import numpy as np
import fakepkg
from invariant_cluster._third_party import _enable_numba_cache
assert _enable_numba_cache("fakepkg") == 4
x = np.arange(4.0)
print(fakepkg.apply(fakepkg.dist, x), fakepkg.plain(x), fakepkg.apply_pointer(fakepkg.pointer, x),
      fakepkg.apply_pointer.stats.cache_hits[fakepkg.apply_pointer.signatures[0]])
'''


def test_passes_functions_finds_dispatchers_in_tuples():
    from numba import njit, typeof, types

    @njit
    def f(x):
        return x

    arr = typeof(np.zeros(3))
    assert _passes_functions((arr, typeof(f)))
    assert _passes_functions((types.Tuple((arr, typeof(f))), arr))
    assert not _passes_functions((arr, types.int64, types.Tuple((arr, arr))))
    # a function pointer's type is its signature: cacheable
    pointer = types.FunctionType(types.float64(arr, arr))
    assert not _passes_functions((arr, pointer))


def test_cache_skips_specialisations_that_take_functions(tmp_path):
    """A function given another compiled function used to write one more cache file in every
    process (its key holds the dispatcher object, which no later process shares), until
    re-pickling the grown index failed; it is now compiled per process and never written, and
    the plain function is cached once."""
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text(_PACKAGE)
    cache = tmp_path / "cache"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
    counts, outputs = [], []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(_RUN)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        outputs.append(out.stdout.split())
        counts.append(sorted(p.name for p in cache.rglob("*.nbc")))
    # the pointer-taking function is compiled in the first process, loaded in the next two
    assert outputs == [["4.0", "6.0", "4.0", "0"], ["4.0", "6.0", "4.0", "1"],
                       ["4.0", "6.0", "4.0", "1"]]
    assert counts[0] == counts[1] == counts[2]
    assert any("plain" in name for name in counts[0])
    assert any("apply_pointer" in name for name in counts[0])
    assert not any(".apply-" in name for name in counts[0])


@pytest.mark.filterwarnings("error::numba.NumbaWarning")
@pytest.mark.parametrize("n, d, seed, init, copies", [(600, 16, 0, False, False),
                                                      (1500, 40, 1, False, False),
                                                      (800, 24, 2, True, False),
                                                      (900, 16, 3, False, True)])
def test_nn_descent_by_pointer_builds_the_same_index(n, d, seed, init, copies):
    """pynndescent's NN-descent given its squared Euclidean distance as a function pointer
    (cacheable), its outer loop run from Python, builds the same graph, bit for bit, as
    pynndescent's own compiled ``nn_descent`` given the dispatcher (compiled in every process),
    and answers queries the same."""
    from invariant_cluster._third_party import import_cached

    pynndescent = import_cached("pynndescent")
    pnn = sys.modules["pynndescent.pynndescent_"]
    routed = pnn.nn_descent
    if not getattr(routed, "_invariant_cluster_route", False):
        pytest.skip("this pynndescent's NN-descent has another layout: left as it is")
    assert routed.driver is not None  # the outer loop runs from Python
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    if copies:  # every point three times: distances of exactly 0, ties everywhere
        X = np.repeat(X[: n // 3], 3, axis=0)
    # a given initial graph (random neighbours) takes the other branch of nn_descent
    start = rng.integers(0, n, (n, 10)) if init else None
    graphs = []
    try:
        for build in (routed, routed.original):
            pnn.nn_descent = build
            index = pynndescent.NNDescent(X, n_neighbors=10, random_state=seed, n_jobs=1,
                                          low_memory=True, init_graph=start)
            graphs.append((*index.neighbor_graph, *index.query(X[:50], k=12, epsilon=0.1)))
    finally:
        pnn.nn_descent = routed
    for a, b in zip(*graphs):
        np.testing.assert_array_equal(a, b)
    # the routed specialisations take the pointer, a cacheable type
    sigs = [sig for sig in pnn.init_random.signatures
            if any(isinstance(t, numba.core.types.FunctionType) for t in sig)]
    assert sigs and not any(_passes_functions(sig) for sig in sigs)


def test_other_pynndescent_layouts_are_left_alone():
    """The Python loop only stands in for pynndescent's own when every compiled piece it calls
    has the expected parameters."""
    import types as pytypes

    from invariant_cluster._third_party import _NN_DESCENT_PARAMS, _PIECES, _python_nn_descent

    class Piece:
        def __init__(self, params):
            ns = {}
            exec(f"def f({', '.join(params)}): pass", ns)
            self.py_func = ns["f"]

    full = {name: Piece(params) for name, params in _PIECES.items()}
    full["nn_descent"] = Piece(_NN_DESCENT_PARAMS)
    assert _python_nn_descent(pytypes.SimpleNamespace(**full)) is not None
    # no batched kernel (older layouts), a piece missing, a piece with other parameters
    assert _NN_DESCENT_PARAMS[-1] == "kernel"
    no_kernel = dict(full, nn_descent=Piece(_NN_DESCENT_PARAMS[:-1]))
    missing = {k: v for k, v in full.items() if k != "build_candidates_owner"}
    other = dict(full, init_random=Piece(("n_neighbors", "data", "heap", "dist")))
    for layout in (no_kernel, missing, other):
        assert _python_nn_descent(pytypes.SimpleNamespace(**layout)) is None
