"""igraph's Leiden runs, in this process or in worker processes.

This module imports NumPy alone (igraph where a run needs it), so that a worker process started
for the runs does not import torch.
"""

from __future__ import annotations

import numpy as np

# Leiden on the whole graph is igraph's (about 10 times faster than leidenalg's optimiser, the
# same objective); leidenalg's optimiser merges the communities of a finer partition.
_IGRAPH_ITERATIONS = 2


def _igraph_leiden(net, resolution, random_state, n_iterations=None, initial=None):
    """Membership from igraph's Leiden (modularity at ``resolution``) seeded by
    ``random_state``, from the membership ``initial`` if given; igraph's process-wide random
    generator is then set back to its default, Python's ``random`` module (igraph has no
    getter for the one in use)."""
    import random

    import igraph as ig

    ig.set_random_number_generator(random.Random(int(random_state)))
    try:
        clusters = net.community_leiden(objective_function="modularity", weights="weight",
                                        resolution=float(resolution),
                                        initial_membership=initial,
                                        n_iterations=(_IGRAPH_ITERATIONS if n_iterations is None
                                                      else n_iterations))
    finally:
        ig.set_random_number_generator(random)
    return list(clusters.membership)


def _graph_edges(graph):
    """The upper triangle of the symmetric sparse ``graph``: ``(n, rows, cols, weights)``, the
    edges of :func:`_igraph_graph` in its order."""
    g = graph.tocoo()
    upper = g.row < g.col
    return (int(graph.shape[0]), g.row[upper].astype(np.int64), g.col[upper].astype(np.int64),
            g.data[upper].astype(np.float64))


def _igraph_from_edges(n, rows, cols, weights):
    """An undirected igraph graph of ``n`` nodes with the given edges, ``weights`` as their
    "weight"."""
    import igraph as ig

    # python-igraph reads a list of int pairs about twice as fast as a NumPy array (1.05
    # million edges: 0.65 s against 1.3 s), with the same edges in the same order
    net = ig.Graph(n=int(n), edges=list(zip(np.asarray(rows).tolist(),
                                            np.asarray(cols).tolist())))
    net.es["weight"] = np.asarray(weights).tolist()
    return net


def _igraph_graph(graph):
    """The symmetric sparse ``graph`` as an undirected igraph graph, its entries as the edges'
    "weight"."""
    return _igraph_from_edges(*_graph_edges(graph))


# Leiden runs go to worker processes (joblib, processes preferred) when one run's graph has at
# least this many edges and more than one CPU thread is allowed (torch's count, which the
# estimators' n_jobs sets): igraph holds the GIL, so threads would run them one at a time. A
# worker rebuilds the graph from its edges and runs its share of the seeds; the runs, and so
# the labels, are those of the serial loop. Below this size a run takes under about 0.1 s and
# a worker's start would cost more than it saves.
PARALLEL_RUNS_MIN_EDGES = 100_000


def leiden_worker(edges, resolution, seeds):
    """Memberships and qualities (modularity at ``resolution``) of igraph's Leiden runs of
    ``seeds`` on the graph of ``edges`` (:func:`_graph_edges`); run in a worker process."""
    net = _igraph_from_edges(*edges)
    out = []
    for seed in seeds:
        membership = _igraph_leiden(net, resolution, seed)
        out.append((np.asarray(membership, dtype=np.int32),
                    net.modularity(membership, weights="weight", resolution=float(resolution))))
    return out


def run_workers(n_runs: int, n_edges: int, threads: int) -> int:
    """Worker processes for ``n_runs`` Leiden runs on a graph of ``n_edges`` edges: ``threads``
    (torch's thread count, which the estimators' ``n_jobs`` sets), at most one per run, and 1
    (in the calling process) below ``PARALLEL_RUNS_MIN_EDGES`` edges."""
    if n_edges < PARALLEL_RUNS_MIN_EDGES:
        return 1
    return max(1, min(int(n_runs), int(threads)))




def _graph_edges(graph):
    """The upper triangle of the symmetric sparse ``graph``: ``(n, rows, cols, weights)``, the
    edges of :func:`_igraph_graph` in its order."""
    g = graph.tocoo()
    upper = g.row < g.col
    return (int(graph.shape[0]), g.row[upper].astype(np.int64), g.col[upper].astype(np.int64),
            g.data[upper].astype(np.float64))


def _igraph_from_edges(n, rows, cols, weights):
    """An undirected igraph graph of ``n`` nodes with the given edges, ``weights`` as their
    "weight"."""
    import igraph as ig

    # python-igraph reads a list of int pairs about twice as fast as a NumPy array (1.05
    # million edges: 0.65 s against 1.3 s), with the same edges in the same order
    net = ig.Graph(n=int(n), edges=list(zip(np.asarray(rows).tolist(),
                                            np.asarray(cols).tolist())))
    net.es["weight"] = np.asarray(weights).tolist()
    return net


def _igraph_graph(graph):
    """The symmetric sparse ``graph`` as an undirected igraph graph, its entries as the edges'
    "weight"."""
    return _igraph_from_edges(*_graph_edges(graph))


def _worker_ready() -> bool:
    """Imports in a worker what :func:`leiden_worker` needs."""
    import igraph  # noqa: F401

    return True


def start_run_workers(workers: int):
    """Start ``workers`` worker processes for the Leiden runs in a background thread, so that
    their start overlaps the search before the grouping (joblib keeps its process pool, and the
    runs' ``Parallel`` call of the same size reuses it). Returns the thread, to be joined before
    the runs, or None for one worker."""
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
