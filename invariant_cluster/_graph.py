"""Graph utilities shared by the iteration and the grouping: a kNN graph given as ``(n, k)``
arrays of indices and distances, never an ``n x n`` matrix."""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

__all__ = ["graph_modes"]


def graph_modes(index: np.ndarray, dist: np.ndarray, tol: np.ndarray) -> np.ndarray:
    """Labels of the connected components of the edges ``i - index[i, j]`` with
    ``dist[i, j] <= tol[i]``; an edge counts in either direction."""
    n = index.shape[0]
    rows, cols = np.nonzero(dist <= tol[:, None])
    graph = coo_matrix((np.ones(len(rows)), (rows, index[rows, cols])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return labels
