"""Quiet imports of umap-learn and pynndescent, with numba's on-disk cache for their functions.

umap-learn and pynndescent compile their numba functions on first use in every process (about
30 s of a first small fit, most of the demo's "kernel attention" row); only some of them ask
numba to keep the machine code on disk. :func:`import_cached` turns numba's cache on for the
compiled functions of the package's modules before anything is compiled, so that the cost is
paid once per installation. numba writes the cache next to the package's sources, or, where that
is read-only, in its user-wide cache directory (``NUMBA_CACHE_DIR`` overrides both); a function
numba cannot cache (a closure, a dynamic global) is compiled per process as before, and so is a
specialisation that takes another compiled function as an argument (see ``_FunctionSafeCache``);
pynndescent's NN-descent therefore gets its distance as a function pointer, which can be cached
(see ``_route_distance_by_pointer``). umap-learn's
import-time warning that TensorFlow (for ParametricUMAP, unused here) is missing is silenced.
"""

from __future__ import annotations

import importlib
import sys
import warnings

_PREPARED: set = set()


def _passes_functions(sig) -> bool:
    """Whether a numba signature (a tuple of argument types) holds a compiled function."""
    from numba.core import types

    stack = list(sig) if isinstance(sig, (tuple, list)) else [sig]
    while stack:
        t = stack.pop()
        # a first-class function type (a function pointer's signature) is the same in every
        # process: those specialisations are cached (see _route_distance_by_pointer)
        if isinstance(t, (types.Dispatcher, types.Function)):
            return True
        if isinstance(t, types.BaseTuple):
            stack.extend(t.types)
    return False


def _function_safe_cache(py_func):
    """numba's on-disk ``FunctionCache`` of ``py_func``, without the specialisations that take a
    compiled function as an argument.

    Maintenance note: pynndescent passes its distance (a numba dispatcher) to five of its
    functions (``generate_leaf_updates``, ``init_random``, ``init_rp_tree``,
    ``process_candidates``, ``generate_graph_update_array``). numba keys a cache entry by the
    argument types, and a dispatcher's type is the dispatcher object itself, which the next
    process does not share: the entry never matched again, every process compiled those
    functions anew and wrote one more file for each (129 copies each in this machine's
    site-packages), and rewriting the grown index re-pickled dead dispatchers:
    ``ReferenceError: underlying object has vanished`` from ``neighbor_search`` and
    ``InvariantKNeighborsTransformer`` at 12,000 images in a fresh process. Those
    specialisations are neither looked up nor saved; everything else is cached as before.
    """
    from numba.core.caching import FunctionCache

    class _FunctionSafeCache(FunctionCache):
        def load_overload(self, sig, target_context):
            return None if _passes_functions(sig) else super().load_overload(sig,
                                                                              target_context)

        def save_overload(self, sig, data):
            # numba cannot keep code that embeds this process's addresses ("dynamic
            # globals": pynndescent's nn_descent and nn_descent_internal, which call
            # numba.get_num_threads() inside compiled code) and would warn
            if _passes_functions(sig) or getattr(getattr(data, "library", None),
                                                 "has_dynamic_globals", False):
                return
            super().save_overload(sig, data)

    return _FunctionSafeCache(py_func)


def _enable_numba_cache(package: str) -> int:
    """Turn numba's on-disk cache on for every compiled function of the loaded ``package``
    modules that has none; return how many were turned on."""
    try:
        from numba.core.dispatcher import Dispatcher
    except ImportError:  # pragma: no cover - numba comes with umap-learn and pynndescent
        return 0
    count = 0
    for name in [m for m in list(sys.modules) if m == package or m.startswith(package + ".")]:
        for obj in list(vars(sys.modules[name]).values()):
            if not isinstance(obj, Dispatcher) or type(getattr(obj, "_cache", None)).__name__ \
                    != "NullCache":
                continue
            try:
                obj._cache = _function_safe_cache(obj.py_func)
                count += 1
            except Exception:  # noqa: BLE001 - numba refuses some functions: they stay uncached
                continue
    return count


def import_cached(package: str):
    """Import ``package`` ("umap" or "pynndescent") without its import-time noise, with numba's
    on-disk cache turned on for its compiled functions (once per process)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tensorflow not installed")
        warnings.filterwarnings("ignore", category=ImportWarning)
        module = importlib.import_module(package)
        if package == "umap":
            importlib.import_module("pynndescent")
    if package not in _PREPARED:
        _PREPARED.add(package)
        _enable_numba_cache(package)
        if package == "umap":
            _PREPARED.add("pynndescent")
            _enable_numba_cache("pynndescent")
        _route_distance_by_pointer()
    return module


# The signature pynndescent's NN-descent calls its squared Euclidean distance with: two rows of
# a C-contiguous float32 matrix; the distance sums in float32 (its ``locals``).
_ROW = "array(float32, 1d, C)"


def _route_distance_by_pointer() -> bool:
    """Pass pynndescent's squared Euclidean distance to its NN-descent as a function pointer
    (a numba ``cfunc`` of the same source, flags and local types) instead of as a dispatcher;
    True when the route is in place.

    Maintenance note: NN-descent (``pynndescent_.nn_descent`` and the functions it calls with
    ``dist``) was compiled in every process, because a dispatcher argument cannot be cached
    (see ``_function_safe_cache``): 13-15 s the first time a process built an index (12,000
    random 64-d descriptors x 3 copies: 22 s first, 7 s second). A function pointer's type is
    its signature, the same in every process, so these specialisations are cached like any
    other. The indexes are the same: the main loop uses pynndescent's batched kernel chosen
    from the real dispatcher (``kernel``), and the pointer serves the random and tree
    initialisations with the same arithmetic (tests/test_third_party.py compares the graphs).
    Any other distance, or a pynndescent without these names, is passed on untouched.
    """
    pnn = sys.modules.get("pynndescent.pynndescent_")
    dists = sys.modules.get("pynndescent.distances")
    if pnn is None or dists is None:
        return False
    current = getattr(pnn, "nn_descent", None)
    if getattr(current, "_invariant_cluster_route", False):
        return True
    target = getattr(dists, "squared_euclidean", None)
    py_func = getattr(target, "py_func", None)
    if current is None or py_func is None:
        return False
    try:
        import numba
        from numba import types

        row = types.Array(types.float32, 1, "C")
        pointer = numba.cfunc(types.float32(row, row), fastmath=True, cache=True,
                              locals={"result": types.float32, "diff": types.float32,
                                      "dim": types.intp})(py_func)
    except Exception:  # noqa: BLE001 - an older numba or another source: leave it as it is
        return False

    def nn_descent(*args, **kwargs):
        if len(args) > 4 and args[4] is target:
            args = args[:4] + (pointer,) + args[5:]
        elif kwargs.get("dist") is target:
            kwargs["dist"] = pointer
        return current(*args, **kwargs)

    nn_descent._invariant_cluster_route = True
    nn_descent.original = current
    nn_descent.pointer = pointer
    pnn.nn_descent = nn_descent
    return True

