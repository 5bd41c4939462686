"""A quiet import of umap-learn, with numba's on-disk cache for its functions.

umap-learn (and pynndescent, which it imports) compile their numba functions on first use in
every process (about 30 s of a first small fit, most of the demo's "kernel attention" row); only
some of them ask numba to keep the machine code on disk. :func:`import_cached` turns numba's
cache on for the compiled functions of the package's modules before anything is compiled, so
that the cost is paid once per installation. numba writes the cache next to the package's
sources, or, where that is read-only, in its user-wide cache directory (``NUMBA_CACHE_DIR``
overrides both); a function numba cannot cache (a closure, a dynamic global) is compiled per
process as before, and so is a specialisation that takes another compiled function as an
argument (see ``_FunctionSafeCache``). The package's own nearest-neighbour search does not use
numba (see ``search.approximate``). umap-learn's import-time warning that TensorFlow (for
ParametricUMAP, unused here) is missing is silenced.
"""

from __future__ import annotations

import importlib
import sys
import warnings

from ._threads import start_numba_threads

_PREPARED: set = set()


def _passes_functions(sig) -> bool:
    """Whether a numba signature (a tuple of argument types) holds a compiled function."""
    from numba.core import types

    stack = list(sig) if isinstance(sig, (tuple, list)) else [sig]
    while stack:
        t = stack.pop()
        # a first-class function type (a function pointer's signature) is the same in every
        # process: those specialisations are cached (a numba cfunc, for example)
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
    """Import ``package`` ("umap") without its import-time noise, with numba's
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
    start_numba_threads()
    return module
