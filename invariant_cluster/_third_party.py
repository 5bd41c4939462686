"""A quiet import of umap-learn, the one package of the library that compiles code on first use.

umap-learn is used only where asked for (``grouping="umap"``) and where Leiden finds no
resolution with ``n_clusters`` parts (its layout of the graph, then k-means); the default
grouping builds umap-learn's graph itself (:func:`invariant_cluster._grouping.umap_bandwidth`).
umap-learn (and pynndescent) compile their numba functions in the first process that calls
them; nothing here changes numba's or pynndescent's settings. umap-learn's import-time warning
that TensorFlow (for ParametricUMAP, unused here) is missing is silenced, and numba's thread
pool is started without moving torch's thread count (:mod:`invariant_cluster._threads`).
"""

from __future__ import annotations

import importlib
import warnings

from ._threads import start_numba_threads


def import_quietly(package: str):
    """Import ``package`` ("umap") without its import-time noise, numba's threads started."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tensorflow not installed")
        warnings.filterwarnings("ignore", category=ImportWarning)
        try:
            module = importlib.import_module(package)
        except ImportError as exc:
            raise ImportError(
                'grouping="umap" needs umap-learn, an optional dependency: '
                'pip install "invariant_cluster[umap]"') from exc
    start_numba_threads()
    return module
