"""numba's on-disk cache for umap-learn's functions (``_third_party``)."""

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
