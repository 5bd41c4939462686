"""igraph's Leiden runs, in this process or in worker processes.

This module imports NumPy alone (igraph where a run needs it), so that a worker process started
for the runs does not import torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading

import numpy as np

# Leiden on the whole graph is igraph's (about 10 times faster than leidenalg's optimiser, the
# same objective); leidenalg's optimiser merges the communities of a finer partition.
_IGRAPH_ITERATIONS = 2

# Maintenance note: igraph's Leiden draws from igraph's one process-wide generator, which
# python-igraph can set but not read. Each run sets a generator of its own seed and then sets
# back igraph's default (Python's ``random`` module), under this lock so that runs in threads do
# not seed each other. A generator a user set with ``igraph.set_random_number_generator`` is
# replaced by that default; leidenalg's ``seed=`` would leave it alone at about ten times the
# cost a run (docs/design/leiden.rst).
_RNG_LOCK = threading.Lock()


def _igraph_leiden(net, resolution, random_state, n_iterations=None, initial=None):
    """Membership from igraph's Leiden (modularity at ``resolution``) seeded by
    ``random_state``, from the membership ``initial`` if given; igraph's process-wide random
    generator is then set back to its default, Python's ``random`` module (igraph has no
    getter for the one in use)."""
    import random

    import igraph as ig

    with _RNG_LOCK:
        ig.set_random_number_generator(random.Random(int(random_state)))
        try:
            # igraph's Leiden leaves self-loops out of the nodes' strengths
            # (igraph/igraph#1475): a graph with loops passes them in as node weights
            clusters = net.community_leiden(
                objective_function="modularity", weights="weight", resolution=float(resolution),
                node_weights="strength" if "strength" in net.vs.attributes() else None,
                initial_membership=initial,
                n_iterations=_IGRAPH_ITERATIONS if n_iterations is None else n_iterations)
        finally:
            ig.set_random_number_generator(random)
    return list(clusters.membership)


def _graph_edges(graph):
    """The upper triangle of the symmetric sparse ``graph``, its diagonal (self-loops) included:
    ``(n, rows, cols, weights)``, the edges of :func:`_igraph_graph` in its order."""
    g = graph.tocoo()
    upper = (g.row < g.col) | ((g.row == g.col) & (g.data != 0))
    return (int(graph.shape[0]), g.row[upper].astype(np.int64), g.col[upper].astype(np.int64),
            g.data[upper].astype(np.float64))


# edges handed to igraph per call when a graph is built: a list of int pairs costs about 100
# bytes an edge while it exists, so a graph of 12 million edges is added 1 million at a time
_EDGE_CHUNK = 1_000_000


def _igraph_from_edges(n, rows, cols, weights):
    """An undirected igraph graph of ``n`` nodes with the given edges in their order,
    ``weights`` as their "weight"; where some are self-loops, each node's strength (a loop
    counted twice, as modularity counts it) as its "strength"."""
    import igraph as ig

    # python-igraph reads a list of int pairs about twice as fast as a NumPy array (1.05
    # million edges: 0.65 s against 1.3 s); added in chunks, the edges keep their order
    rows, cols = np.asarray(rows), np.asarray(cols)
    net = ig.Graph(n=int(n))
    for start in range(0, rows.size, _EDGE_CHUNK):
        stop = start + _EDGE_CHUNK
        net.add_edges(list(zip(rows[start:stop].tolist(), cols[start:stop].tolist())))
    net.es["weight"] = np.asarray(weights).tolist()
    if (rows == cols).any():
        net.vs["strength"] = net.strength(weights="weight", loops=True)
    return net


def _igraph_graph(graph):
    """The symmetric sparse ``graph`` as an undirected igraph graph, its entries as the edges'
    "weight"."""
    return _igraph_from_edges(*_graph_edges(graph))


# Leiden runs go to worker processes (joblib, processes preferred) when one run's graph has at
# least this many edges and more than one CPU thread is allowed (torch's count, which the
# estimators' n_jobs sets): igraph holds the GIL, so threads would run them one at a time. A
# worker rebuilds the graph from its edges and runs its share of the seeds; the runs, and so
# the labels, are those of the serial loop. Where the workers were started while the search
# ran on a card (:func:`leiden_workers`), from STARTED_RUNS_MIN_EDGES (the costs behind both:
# docs/design/leiden.rst).
PARALLEL_RUNS_MIN_EDGES = 400_000
STARTED_RUNS_MIN_EDGES = 100_000

_MIN_EDGES = contextvars.ContextVar("invariant_cluster_leiden_min_edges", default=None)

# A worker's resident memory: a base and a share per edge (measured: docs/design/leiden.rst).
# The workers are a speed-up the runs can do without: together they take at most a quarter of
# the memory available, else fewer of them run (none: the runs stay in the calling process).
WORKER_BASE_BYTES = 100 * 2 ** 20
WORKER_BYTES_PER_EDGE = 250
WORKER_MEMORY_FRACTION = 0.25


def leiden_runs(net, resolution, seeds):
    """``[(membership, quality), ...]``: igraph's Leiden run of each of ``seeds`` at
    ``resolution`` on ``net``, and its modularity at that resolution."""
    out = []
    for seed in seeds:
        membership = _igraph_leiden(net, resolution, seed)
        out.append((membership,
                    net.modularity(membership, weights="weight", resolution=float(resolution))))
    return out


def leiden_worker(edges, resolution, seeds):
    """:func:`leiden_runs` on the graph of ``edges`` (:func:`_graph_edges`), the memberships as
    int32 arrays (a tenth of a pickled list); run in a worker process."""
    return [(np.asarray(m, dtype=np.int32), q)
            for m, q in leiden_runs(_igraph_from_edges(*edges), resolution, seeds)]


def run_workers(n_runs: int, n_edges: int, threads: int, min_edges=None,
                available=None) -> int:
    """Worker processes for ``n_runs`` Leiden runs on a graph of ``n_edges`` edges: ``threads``
    (torch's thread count, which the estimators' ``n_jobs`` sets), at most one per run, and 1
    (in the calling process) below ``min_edges`` edges (None: ``STARTED_RUNS_MIN_EDGES`` within
    :func:`leiden_workers` that started workers, else ``PARALLEL_RUNS_MIN_EDGES``); with
    ``available`` (bytes of memory), no more than ``WORKER_MEMORY_FRACTION`` of it holds, at
    ``WORKER_BASE_BYTES + WORKER_BYTES_PER_EDGE n_edges`` each."""
    if min_edges is None:
        min_edges = _MIN_EDGES.get()
        if min_edges is None:
            min_edges = PARALLEL_RUNS_MIN_EDGES
    if n_edges < min_edges:
        return 1
    workers = max(1, min(int(n_runs), int(threads)))
    if available is not None:
        each = WORKER_BASE_BYTES + WORKER_BYTES_PER_EDGE * int(n_edges)
        workers = min(workers, int(WORKER_MEMORY_FRACTION * float(available) // each))
    return max(1, workers)


def _worker_ready() -> bool:
    """Imports in a worker what :func:`leiden_worker` needs."""
    import igraph  # noqa: F401

    return True


def start_run_workers(workers: int):
    """Start ``workers`` worker processes for the Leiden runs in a background thread (joblib
    keeps its process pool, and the runs' ``Parallel`` call of the same size reuses it). Returns
    the thread, to be joined before the runs, or None for one worker."""
    if workers <= 1:
        return None
    import threading

    def start():
        from joblib import Parallel, delayed

        try:
            Parallel(n_jobs=workers, prefer="processes")(
                delayed(_worker_ready)() for _ in range(workers))
        except Exception:  # noqa: BLE001 - the runs start their own workers if this failed
            pass

    thread = threading.Thread(target=start, name="invariant_cluster-leiden-workers",
                              daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def leiden_workers(start: bool, n_edges: int, n_runs: int, threads: int, available=None):
    """Within the block, where ``start`` is true and a graph of about ``n_edges`` edges calls
    for workers (``STARTED_RUNS_MIN_EDGES``), they start now in the background, so that their
    start overlaps what runs before the grouping (a search on a card, which leaves the CPU
    cores free), and the runs use them from ``STARTED_RUNS_MIN_EDGES`` edges; ``available``:
    as :func:`run_workers`. Yields the starting thread (join it before the runs) or None."""
    workers = (run_workers(n_runs, n_edges, threads, STARTED_RUNS_MIN_EDGES, available)
               if start else 1)
    thread = start_run_workers(workers)
    token = _MIN_EDGES.set(STARTED_RUNS_MIN_EDGES if thread is not None else None)
    try:
        yield thread
    finally:
        if thread is not None:
            thread.join()
        _MIN_EDGES.reset(token)
