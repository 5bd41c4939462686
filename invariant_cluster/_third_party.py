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

from ._threads import start_numba_threads

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
    start_numba_threads()
    return module


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
    Any other distance, or a pynndescent without these names, is passed on untouched. The two
    outer functions, which numba cannot cache at all, run from Python (:func:`_python_nn_descent`):
    a fresh process then compiles nothing (12,000 x 3 random copies, benchmarks/
    bench_first_fit.py: first call 10.0-10.1 s against 20.2-21.8 s, second calls 6.3-7.6 s
    either way).
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
    driver = _python_nn_descent(pnn)
    if driver is None:
        # another layout of pynndescent: left as it is (where its main loop calls ``dist``
        # itself, a pointer would cost an indirect call per distance)
        return False
    try:
        import numba
        from numba import types

        # pynndescent calls it with two rows of a C-contiguous float32 matrix; it sums in
        # float32 (its ``locals``)
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
        else:
            return current(*args, **kwargs)
        return driver(*args, **kwargs)

    nn_descent._invariant_cluster_route = True
    nn_descent.original = current
    nn_descent.driver = driver
    pnn.nn_descent = nn_descent
    return True


# the parameters of pynndescent's compiled pieces that _python_nn_descent calls, in order
_PIECES = {
    "make_heap": ("n_points", "size"),
    "deheap_sort": ("indices", "distances"),
    "init_rp_tree": ("data", "dist", "current_graph", "leaf_array", "n_threads"),
    "init_random": ("n_neighbors", "data", "heap", "dist", "rng_state"),
    "build_candidates_owner": (
        "current_graph", "max_candidates", "rng_state", "n_threads", "new_candidate_indices",
        "new_candidate_priority", "old_candidate_indices", "old_candidate_priority", "active",
        "reverse_dst", "reverse_src", "bucket_bounds"),
    "process_candidates": (
        "data", "dist", "current_graph", "new_candidate_neighbors", "old_candidate_neighbors",
        "n_blocks", "block_size", "n_threads", "update_array", "n_updates_per_thread",
        "sorted_updates", "block_offsets", "kernel"),
}
_NN_DESCENT_PARAMS = ("data", "n_neighbors", "rng_state", "max_candidates", "dist", "n_iters",
                      "delta", "init_graph", "rp_tree_init", "leaf_array", "low_memory",
                      "verbose", "kernel")


def _python_nn_descent(pnn):
    """pynndescent's ``nn_descent`` and ``nn_descent_internal`` run from Python, each step one
    of pynndescent's own compiled functions; None unless every piece has the expected
    parameters.

    Maintenance note: those two functions call ``numba.get_num_threads()`` inside compiled
    code, which embeds an address of the process ("dynamic globals"), so numba compiles them in
    every process: 6-7 s the first time a process builds an index, once the distance goes by
    pointer. Their bodies only allocate work arrays and loop over at most ``n_iters`` rounds;
    here the same steps, in the same order, on the same arrays, call the cacheable pieces
    (tests/test_third_party.py checks the graphs bit for bit against pynndescent's own
    ``nn_descent``).
    """
    import inspect

    try:
        pieces = {name: getattr(pnn, name) for name in _PIECES}
        for name, params in _PIECES.items():
            if tuple(inspect.signature(pieces[name].py_func).parameters) != params:
                return None
        original = pnn.nn_descent
        if tuple(inspect.signature(original.py_func).parameters) != _NN_DESCENT_PARAMS:
            return None
        import numba
    except (AttributeError, TypeError, ValueError, ImportError):
        return None
    make_heap, deheap_sort = pieces["make_heap"], pieces["deheap_sort"]

    def nn_descent(data, n_neighbors, rng_state, max_candidates=50, dist=None, n_iters=10,
                   delta=0.001, init_graph=None, rp_tree_init=True, leaf_array=None,
                   low_memory=True, verbose=False, kernel=0):
        if init_graph is None or init_graph[0].shape[0] == 1:  # pynndescent's EMPTY_GRAPH
            current_graph = make_heap(data.shape[0], n_neighbors)
            if rp_tree_init:
                pieces["init_rp_tree"](data, dist, current_graph, leaf_array,
                                       numba.get_num_threads())
            pieces["init_random"](n_neighbors, data, current_graph, dist, rng_state)
        elif init_graph[0].shape[0] == data.shape[0] and init_graph[0].shape[1] == n_neighbors:
            current_graph = init_graph
        else:
            raise ValueError("Invalid initial graph specified!")
        _nn_descent_rounds(pieces, current_graph, data, n_neighbors, rng_state, max_candidates,
                           dist, n_iters, delta, kernel, numba.get_num_threads())
        return deheap_sort(current_graph[0], current_graph[1])

    return nn_descent


def _nn_descent_rounds(pieces, current_graph, data, n_neighbors, rng_state, max_candidates,
                       dist, n_iters, delta, kernel, n_threads):
    """The rounds of pynndescent's ``nn_descent_internal`` (see :func:`_python_nn_descent`)."""
    import numpy as np

    n_vertices = data.shape[0]
    block_size = 16384
    n_blocks = n_vertices // block_size
    max_updates = int((max_candidates ** 2 + max_candidates * (max_candidates - 1) / 2)
                      * block_size / n_threads) + 1024
    update_array = np.empty((n_threads, max_updates, 3), dtype=np.float32)
    n_updates_per_thread = np.zeros(n_threads, dtype=np.int32)
    shape = (n_threads, 2 * max_updates, 3) if n_threads > 1 else (1, 1, 3)
    sorted_updates = np.empty(shape, dtype=np.float32)
    block_offsets = np.zeros((n_threads, n_threads + 1), dtype=np.int64)
    new_idx = np.full((n_vertices, max_candidates), -1, dtype=np.int32)
    new_pri = np.full((n_vertices, max_candidates), np.inf, dtype=np.float32)
    old_idx = np.full((n_vertices, max_candidates), -1, dtype=np.int32)
    old_pri = np.full((n_vertices, max_candidates), np.inf, dtype=np.float32)
    active = np.ones(n_vertices, dtype=np.uint8)
    reverse_dst = np.empty(n_vertices * n_neighbors, dtype=np.int32)
    reverse_src = np.empty(n_vertices * n_neighbors, dtype=np.int32)
    bucket_bounds = np.zeros((n_threads, n_threads + 1), dtype=np.int64)
    for _ in range(n_iters):
        new_nb, old_nb = pieces["build_candidates_owner"](
            current_graph, max_candidates, rng_state, n_threads, new_idx, new_pri, old_idx,
            old_pri, active, reverse_dst, reverse_src, bucket_bounds)
        c = pieces["process_candidates"](
            data, dist, current_graph, new_nb, old_nb, n_blocks, block_size, n_threads,
            update_array, n_updates_per_thread, sorted_updates, block_offsets, kernel)
        if c <= delta * n_neighbors * data.shape[0]:
            return
