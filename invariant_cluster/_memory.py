"""The memory policy: how many bytes a device has free, whether a request fits, how large a
block of work may be, and the limits of the backends. Every search and iteration sizes its blocks
here (never an ``n x n`` array where a block will do); requests that cannot fit fail early with a
clear message. Every block size of the package is a name of this module, read by the search
engine (:mod:`invariant_cluster.search`), the warp owner (:mod:`invariant_cluster.transforms`)
and the estimators; which search runs is decided by :mod:`invariant_cluster.search.plan`.
"""

from __future__ import annotations

import torch

# Cap on a block's elements: beyond this, larger blocks do not speed the products up, they only
# delay the first page faults (CPU); GPUs profit from larger blocks.
_CAP_ELEMENTS = {"cpu": 64 * 1024 * 1024, "cuda": 512 * 1024 * 1024}

# ----------------------------------------------------------------------------- backend limits
# cuDNN's grid sampler refuses a batch of 65,536 images or more (CUDNN_STATUS_NOT_SUPPORTED,
# PyTorch issue 88380; PyTorch sends bilinear, zero-padded, align_corners=True sampling to cuDNN),
# so every ``grid_sample`` call of the package stays below it (transforms.sample_images).
GRID_SAMPLE_MAX_BATCH = 65535
# 32-bit indexing: kernels index a tensor of fewer than 2**31 elements with int32; one
# ``grid_sample`` call keeps its input, grid and output below this many elements.
INDEX_LIMIT = 2 ** 31 - 1

# ----------------------------------------------------------------------------- block sizes
# Maintenance note: the score block ``(b * S, c * R)`` of the grid search dominates memory; 64 M
# elements (256 MB in float32) keeps the GEMM efficient while leaving room for a few copies.
# The warped keys of one chunk stay under the same budget.
SCORE_BLOCK_ELEMENTS = 64 * 1024 * 1024
# Queries per block of the grid search, at most (beyond this the products are no faster).
MAX_QUERIES_PER_BLOCK = 4096
# Pairs refined at once: each pair holds about 8 images' worth of work (warps, residuals,
# Jacobians), so a batch of pairs stays under the score block's budget.
REFINE_PAIR_ELEMENTS = SCORE_BLOCK_ELEMENTS // 8

# The identity check of the kNN transformer (plain residuals of the kept pairs), per chunk.
IDENTITY_CHECK_ELEMENTS = 1 << 24
# Rows of queries of the softmax KernelPCAAttention.transform at once (a rows x keys block).
SOFTMAX_QUERY_ROWS = 2048


def pair_blocks(n, image_elements):
    """``(starts, step)``: blocks of at most ``step`` of ``n`` images (or pairs of them) of
    ``image_elements`` elements each, as many as ``REFINE_PAIR_ELEMENTS`` allows."""
    step = max(1, REFINE_PAIR_ELEMENTS // max(1, int(image_elements)))
    return range(0, n, step), step


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


def search_terms(n_queries, n_keys, image_shape, grid, *, k=None, n_candidates=0,
                 descriptor_bytes=0, element_size=4) -> dict:
    """Bytes a search on ``grid`` needs at least, beyond its input images, by what sets them.

    The engine sizes its blocks from the free memory, but a block holds at least one key and
    one query, and the results grow with the samples; these are the terms that no block size
    can shrink:

    - ``"grid"``: one key warped at every grid angle onto the shift canvas, with its energies,
      and one query placed at every integer shift, with their scores (set by ``n_rotations``,
      ``max_translation`` and the image size);
    - ``"pairs"``: the ``n_queries x n_keys`` distances and alignments returned by an
      all-pairs search (``k=None``) and the refinement's pair indices;
    - ``"neighbors"``: the ``n_queries x k`` results, the shortlist of ``n_candidates`` per
      query and its distances, and the shortlist's descriptors (``descriptor_bytes``).

    Parameters
    ----------
    n_queries, n_keys : int
    image_shape : tuple (C, H, W)
    grid : SearchGrid
    k : int, optional
        Neighbours kept per query; None: the all-pairs matrices.
    n_candidates : int, default=0
        Shortlist length per query (0: no shortlist).
    descriptor_bytes : int, default=0
        The shortlist's descriptors of the queries and keys.
    element_size : int, default=4

    Returns
    -------
    terms : dict of str to int
        ``{"grid": ..., "pairs": ..., "neighbors": ...}``.
    """
    nq, nk, es = int(n_queries), int(n_keys), int(element_size)
    c, h, w = (int(v) for v in image_shape[-3:])
    f = c * h * w
    R, S = int(grid.n_mirrors) * len(grid.angles), len(grid.shifts)
    m = int(max(abs(int(v)) for v in grid.shifts.reshape(-1))) if S > 1 else 0
    canvas = c * (h + 2 * m) * (w + 2 * m)
    per_key = R * (2 * canvas + canvas // 4 + 2 * S) + (R * S * f if m else 0)
    terms = {"grid": (per_key + S * f + 3 * R * S) * es, "pairs": 0, "neighbors": 0}
    p = int(grid.n_params)
    if k is None:
        terms["pairs"] = nq * nk * (es + 8 + p * es + (16 if grid.refine else 0))
    else:
        kk, cc = min(int(k), nk), min(int(n_candidates), nk)
        terms["neighbors"] = (nq * kk * (2 * es + 8 + p * es) + nq * cc * (2 * es + 16)
                              + int(descriptor_bytes))
    return terms


# Searches that need less than this are not checked: any device has it, and asking the device
# what it has free (about 1 ms) would be paid by every one of the many small searches of a fit
# (the invariant means of every cluster).
UNCHECKED_SEARCH_BYTES = 16 * 1024 * 1024

# what to lower when a term of search_terms is too large
_SEARCH_HINTS = {
    "grid": "lower n_rotations or max_translation (or use smaller images: the search of a "
            "single key at every grid point does not fit)",
    "pairs": "search fewer images at once (X, Y: the n_x x n_y distances and alignments are "
             "returned whole), or use the nearest-neighbour search instead of all pairs",
    "neighbors": "search fewer images (n_samples), or lower n_neighbors / n_candidates",
}


def check_search(n_queries, n_keys, image_shape, grid, *, k=None, n_candidates=0,
                 descriptor_bytes=0, element_size=4, device="cpu", what="the search"):
    """Raise :class:`InsufficientMemoryError` naming the parameter to lower when the least a
    search needs (:func:`search_terms`) does not fit on ``device``; call it before anything
    of that size is allocated. Returns the bytes when they fit (requests below
    :data:`UNCHECKED_SEARCH_BYTES` are not checked).
    """
    terms = search_terms(n_queries, n_keys, image_shape, grid, k=k, n_candidates=n_candidates,
                         descriptor_bytes=descriptor_bytes, element_size=element_size)
    total = sum(terms.values())
    if total <= UNCHECKED_SEARCH_BYTES:
        return int(total)
    largest = max(terms, key=terms.get)
    return check_fits(total, device, what, hint=_SEARCH_HINTS[largest])


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


# ----------------------------------------------------------------------------- whole-fit estimate
# Maintenance note: bytes a fit holds per edge of its kNN graph in the grouping (the fuzzy graph's
# CSR copies and the edge lists handed to igraph), and per pair of the candidate search beyond
# its candidates (the pairs grouped by key, the excluded pairs' copy, the sort's indices and the
# best grid point: four int64 and the distance). Calibrated on fresh processes' peak RSS
# (Fashion-MNIST, max_rotation=15, n_rotations=7, max_translation=1, n_clusters=10 and None,
# 10,000 and 70,000 images): docs/design/cpu_search.rst has the measured peaks and the estimate
# beside them; tests/test_memory_estimate.py checks the estimate within 2x.
GROUPING_BYTES_PER_EDGE = 40
PAIR_BYTES = 4 * 8


def estimate_fit_bytes(n, n_features, k, n_candidates=0, *, element_size=4, device="cpu",
                       filtered=False, grouping_means=False):
    """Bytes an :class:`~invariant_cluster.InvariantAttentionClusterer` fit allocates at its
    peak, beyond what the process holds before it (an estimate, within 2x of the measured peak).

    The terms, each linear in ``n``: two images per sample (the fit's tensor of the distinct
    images and the means, or ``invariant_means_`` once both are freed), one more when filtered
    (the filtered images' copy in their own content's order, and the means' next values while
    they attend to each other once; ``tests/test_memory_estimate.py`` measures with the
    filter on); the kNN graph with its alignments and attention
    weights; the candidate search's pairs (the shortlist's ``n_candidates`` per sample); the
    grouping's graphs (:data:`GROUPING_BYTES_PER_EDGE` per edge); with ``grouping_means``
    (``n_clusters=None``), the search of the means' graph among the ``k + k^2`` neighbours of
    neighbours; and, once, the search and iteration blocks (at most
    :data:`SCORE_BLOCK_ELEMENTS`, twice: the scores and the warped keys).

    Parameters
    ----------
    n, n_features, k : int
        Samples, pixels per sample (all channels), neighbours.
    n_candidates : int, default=0
        Candidates per query of the shortlist (0: the exact search).
    element_size : int, default=4
        4 for float32, 8 for float64.
    device : str or torch.device, default="cpu"
        The blocks are a quarter of this device's free memory at most.
    filtered : bool, default=False
        The images are filtered (``noise_std``): one image more per sample.
    grouping_means : bool, default=False
        The count (``n_clusters=None``) searches the converged means' graph.

    Returns
    -------
    n_bytes : int
    """
    n, f, k, c, es = int(n), int(n_features), int(k), int(n_candidates), int(element_size)
    images = (3 if filtered else 2) * n * f * es
    graph = n * k * (8 + 4 * es) + n * (k + 1) * (8 + es) + n * c * (8 + PAIR_BYTES + es)
    grouping = n * k * 2 * GROUPING_BYTES_PER_EDGE
    if grouping_means:
        grouping += n * (k + k * k) * (8 + PAIR_BYTES + 2 * es)
    blocks = 2 * min(block_elements(device, es), SCORE_BLOCK_ELEMENTS) * es
    return int(images + graph + grouping + blocks)
