"""Thread settings: a fit runs with the threads the user set and leaves them as it found them."""

from __future__ import annotations

import contextlib
import os
import sys

import torch


def resolve_n_jobs(n_jobs) -> int:
    """The number of threads ``n_jobs`` asks for (negative: ``cpu_count + 1 + n_jobs``)."""
    n_jobs = int(n_jobs)
    return n_jobs if n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + n_jobs)


def start_numba_threads() -> None:
    """Start numba's thread pool without changing torch's thread count.

    numba's OpenMP threading layer sets OpenMP's thread count to its own when it starts its pool
    (once per process, at the first parallel call), and torch's CPU thread count is OpenMP's: a
    first call into umap-learn or pynndescent would otherwise move torch from the count the user
    set (``torch.set_num_threads``) to numba's.
    """
    numba = sys.modules.get("numba")
    if numba is None:
        return
    before = torch.get_num_threads()
    numba.get_num_threads()  # starts the pool (public API; a no-op once started)
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@contextlib.contextmanager
def thread_limit(n_jobs=None):
    """Run with ``n_jobs`` threads in torch, the BLAS/OpenMP pools and numba, and restore all of
    them afterwards; ``None`` runs with the threads as set (``OMP_NUM_THREADS``,
    ``torch.set_num_threads``, threadpoolctl) and restores torch's and numba's counts too."""
    start_numba_threads()
    torch_before = torch.get_num_threads()
    numba = sys.modules.get("numba")
    numba_before = numba.get_num_threads() if numba is not None else None
    try:
        if n_jobs is None:
            yield
            return
        from threadpoolctl import threadpool_limits

        n = resolve_n_jobs(n_jobs)
        torch.set_num_threads(n)
        if numba is not None:
            numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
        with threadpool_limits(limits=n):
            yield
    finally:
        if torch.get_num_threads() != torch_before:
            torch.set_num_threads(torch_before)
        numba = sys.modules.get("numba")
        if numba is not None:
            if numba_before is None:
                start_numba_threads()
            elif numba.get_num_threads() != numba_before:
                numba.set_num_threads(numba_before)
