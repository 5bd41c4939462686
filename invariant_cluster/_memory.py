"""The memory policy: how many bytes a device has free, whether a request fits, and how large a
block of work may be. Every search and iteration sizes its blocks here (never an ``n x n``
array where a block will do); requests that cannot fit fail early with a clear message.
"""

from __future__ import annotations

import torch

# Cap on a block's elements: beyond this, larger blocks do not speed the products up, they only
# delay the first page faults (CPU); GPUs profit from larger blocks.
_CAP_ELEMENTS = {"cpu": 64 * 1024 * 1024, "cuda": 512 * 1024 * 1024}


class InsufficientMemoryError(MemoryError, ValueError):
    """A requested computation does not fit in the memory available on its device.

    Both a :class:`MemoryError` and a :class:`ValueError` (the request is what is wrong).
    """


def memory_budget(device="cpu") -> int:
    """Bytes available for new allocations on ``device``.

    CPU: ``psutil.virtual_memory().available`` (without psutil, ``os.sysconf`` physical pages;
    failing that 4 GiB), or less when a container's cgroup limit leaves less. CUDA: the free
    memory reported by ``torch.cuda.mem_get_info`` plus what torch's caching allocator holds but
    does not use.

    Parameters
    ----------
    device : str or torch.device

    Returns
    -------
    n_bytes : int
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} was requested but CUDA is not available")
        free, _ = torch.cuda.mem_get_info(dev)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return int(free + max(cached, 0))
    try:
        import psutil

        avail = int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is installed with the benchmarks
        import os

        try:
            avail = int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            avail = 4 * 1024 ** 3
    limit = _cgroup_headroom()
    return avail if limit is None else min(avail, limit)


def _cgroup_headroom():
    """Bytes left under a container's memory limit (cgroup v2, then v1), or None."""
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                raw = f.read().strip()
            if raw == "max":
                return None
            with open(usage_path) as f:
                usage = int(f.read().strip())
            limit = int(raw)
        except (OSError, ValueError):
            continue
        if limit >= 1 << 60:  # cgroup v1 writes "no limit" as a huge number
            return None
        return max(0, limit - usage)
    return None


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0
    return f"{n:.1f} TiB"  # pragma: no cover


def check_fits(n_bytes, device="cpu", what="this computation", *, fraction=0.9, hint=None):
    """Raise :class:`InsufficientMemoryError` if ``n_bytes`` exceed ``fraction`` of the budget.

    Call it BEFORE allocating, with the size of the allocation (or of the peak of a step).

    Parameters
    ----------
    n_bytes : int
        The bytes the computation will need.
    device : str or torch.device
    what : str
        Named in the message ("the warped keys", ...).
    fraction : float, default=0.9
        Share of :func:`memory_budget` that may be used.
    hint : str, optional
        How to fix it; the default names ``batch_size`` and the shortlist.

    Returns
    -------
    n_bytes : int
        Unchanged, when it fits.
    """
    budget = memory_budget(device)
    if n_bytes > fraction * budget:
        if hint is None:
            hint = ("lower batch_size (fewer queries per block), use the candidate shortlist "
                    "(neighbor_search / fewer n_candidates) instead of the all-pairs search, "
                    "or run on a device with more memory")
        raise InsufficientMemoryError(
            f"{what} needs {_fmt_bytes(n_bytes)} but only {_fmt_bytes(budget)} are available "
            f"on {torch.device(device)} (limit {fraction:.0%} of it): {hint}"
        )
    return int(n_bytes)


def block_elements(device="cpu", bytes_per_element=4, fraction=0.25, *, cap=None) -> int:
    """How many elements a working block may hold: ``fraction`` of the free memory, capped.

    Parameters
    ----------
    device : str or torch.device
    bytes_per_element : int
        4 for float32, 8 for float64 (times the number of live copies of the block).
    fraction : float, default=0.25
    cap : int, optional
        Upper bound (default 64 M elements on CPU, 512 M on CUDA).

    Returns
    -------
    n_elements : int, at least 1
    """
    dev = torch.device(device)
    if cap is None:
        cap = _CAP_ELEMENTS["cuda" if dev.type == "cuda" else "cpu"]
    n = int(fraction * memory_budget(dev) // max(1, int(bytes_per_element)))
    return int(max(1, min(n, cap)))
