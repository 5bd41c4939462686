"""Quiet imports of umap-learn and pynndescent, with numba's on-disk cache for their functions.

umap-learn and pynndescent compile their numba functions on first use in every process (about
30 s of a first small fit, most of the demo's "kernel attention" row); only some of them ask
numba to keep the machine code on disk. :func:`import_cached` turns numba's cache on for the
compiled functions of the package's modules before anything is compiled, so that the cost is
paid once per installation. numba writes the cache next to the package's sources, or, where that
is read-only, in its user-wide cache directory (``NUMBA_CACHE_DIR`` overrides both); a function
numba cannot cache (a closure, a dynamic global) is compiled per process as before. umap-learn's
import-time warning that TensorFlow (for ParametricUMAP, unused here) is missing is silenced.
"""

from __future__ import annotations

import importlib
import sys
import warnings

_PREPARED: set = set()


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
                obj.enable_caching()
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
    return module
