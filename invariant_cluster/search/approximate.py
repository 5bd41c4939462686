"""The approximate shortlist: an inverted-file index (faiss) instead of comparing every pair.

:func:`~invariant_cluster.search.blocked.shortlist` compares every query descriptor with every
key descriptor (``n_x n_y U V d`` multiply-adds: quadratic in ``n``). Beyond
``search.plan.FAISS_MIN_KEYS`` keys (on the CPU) the shortlist instead

1. partitions the key copies into ``nlist`` cells by k-means and files each copy in its cell,
   as a 4-bit product-quantised code of its offset from the cell's centre (two dimensions a
   code; faiss's ``IndexIVFPQFastScan``, whose SIMD scan of the codes is the search's speed)
   and as it is (``IndexRefineFlat``),
2. searches the ``nprobe`` cells nearest to every query copy for its ``kq`` nearest key copies:
   the codes' ``_REFINE_FACTOR kq`` nearest, ranked again by their exact distances,
3. keeps per key the smallest distance over its copies, then the ``n_candidates`` nearest keys.

Rows for which the search found fewer distinct keys than asked are asked again with more
entries, then fall back to the exact blocked shortlist, row by row, so the contract of
``shortlist`` holds: ``n_candidates`` distinct keys per query, nearest first.

faiss ships compiled code (nothing is compiled on first use) and is used through its public
API only. Its k-means is seeded by ``random_state`` and the search is exact within the probed
cells and parallel over queries, so the shortlist is the same from run to run and for any
number of threads. faiss runs on torch's thread count (``torch.get_num_threads()``); its
OpenMP setting is put back afterwards.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from .._heap import release
from .._progress import progress_bar
from .blocked import check_descriptors, shortlist

__all__ = ["approximate_shortlist"]

# Maintenance note: an inverted file of about 2 sqrt(N) cells for N key copies, 8 of them
# searched per query copy, each query copy asking for about 6 m / U key copies. The cells
# searched hold at least about _MIN_SCANNED key copies: a small index (tests) is searched more
# widely, which unstructured data needs (measured: docs/design/cpu_search.rst).
_ENTRIES_PER_CANDIDATE = 6.0
_CELLS_PER_SQRT = 2.0
_PROBES = 8
_MIN_SCANNED = 1024
# k-means samples at most this many key copies per cell (faiss's own default is 256)
_TRAIN_PER_CELL = 64
# the codes' nearest entries ranked again exactly, per entry returned (docs/design/large_fits.rst)
_REFINE_FACTOR = 4.0
# entries (query copies x kq) searched per block: bounds the search's temporary memory
_BLOCK_ENTRIES = 1 << 22

# rows short of distinct keys are asked again with this many times the entries, twice
_REQUERY_GROWTH = (3, 3)


@contextlib.contextmanager
def _faiss_threads(n):
    """faiss on ``n`` OpenMP threads for the duration of the block, put back afterwards
    (``omp_set_num_threads`` is process-wide)."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _width(d):
    """The index's dimension for descriptors of ``d``: even, two dimensions a code."""
    return d + d % 2


def _build_index(keys: np.ndarray, random_state=0):
    """The index of the rows of ``keys`` (float32, C-contiguous, :func:`_rows` of width
    :func:`_width`): an inverted file of 4-bit product-quantised codes, ranked again by the
    exact distances, with its ``nprobe`` set (see the note above)."""
    import faiss

    n, width = keys.shape
    nlist = int(max(1, min(n // 39, round(_CELLS_PER_SQRT * math.sqrt(n)))))
    codes = faiss.IndexIVFPQFastScan(faiss.IndexFlatL2(width), width, nlist, width // 2, 4,
                                     faiss.METRIC_L2)
    seed = int(random_state) % (2 ** 31)
    codes.cp.seed = codes.pq.cp.seed = seed
    codes.cp.max_points_per_centroid = _TRAIN_PER_CELL
    # the codes' 16 centres a sub-space train on every key copy there is (the cells already
    # ask 39 a cell): faiss's warning below 39 points a centre would only repeat that
    codes.pq.cp.min_points_per_centroid = 1
    codes.nprobe = int(min(nlist, max(_PROBES, math.ceil(_MIN_SCANNED * nlist / n))))
    index = faiss.IndexRefineFlat(codes)
    index.k_factor = _REFINE_FACTOR
    index.train(keys)
    index.add(keys)
    return index


def _rows(desc, width=None):
    """Descriptors ``(b, U, d)`` as the C-contiguous float32 ``(b U, width)`` array faiss
    reads, zero columns after the ``d`` (distances unchanged; ``width`` None: ``d``)."""
    d = desc.shape[-1]
    rows = desc.reshape(-1, d).detach().cpu().numpy()
    if width is None or width == d:
        return np.ascontiguousarray(rows, np.float32)
    out = np.zeros((rows.shape[0], width), np.float32)
    out[:, :d] = rows
    return out


def _distinct_keys(index, queries, kq, U, V, m, exclude):
    """The ``m`` nearest distinct keys of each query among the ``kq`` nearest key copies (key
    ``i // V``) of each of its ``U`` copies (``queries``, ``(n_x, U, d)``, read one block of
    rows at a time), leaving out ``exclude[query]``: ``(keys (n_x, m) long, -1 where missing;
    rows short of m keys)``."""
    n_x = queries.shape[0]
    out = torch.full((n_x, m), -1, dtype=torch.long)
    # the codes return _REFINE_FACTOR kq entries a query copy before the exact ranking
    step = max(1, int(_BLOCK_ENTRIES // (U * kq * _REFINE_FACTOR)))
    for q0 in range(0, n_x, step):
        q1 = min(n_x, q0 + step)
        D, Ind = index.search(_rows(queries[q0:q1], index.d), kq)
        ex = None if exclude is None else exclude[q0:q1]
        out[q0:q1] = _reduce(torch.from_numpy(D), torch.from_numpy(Ind), U, V, m, ex)
    return out, torch.nonzero(out[:, -1] < 0).flatten()


def _reduce(D, Ind, U, V, m, exclude):
    """Per query, the ``m`` keys of its smallest distances over its ``U`` copies' entries
    (``D``, ``Ind`` of shape ``(b U, kq)``, -1 where missing), nearest first; -1 where fewer."""
    b = D.shape[0] // U
    key = torch.div(Ind.reshape(b, -1), V, rounding_mode="floor")  # -1 stays -1
    bad = key < 0
    if exclude is not None:
        bad |= key == exclude[:, None]
    dist = torch.where(bad, math.inf, D.reshape(b, -1))
    # nearest first (stable: ties keep faiss's order), then each key's first entry
    dist, order = torch.sort(dist, dim=1, stable=True)
    key = key.gather(1, order)
    by_key, pos = torch.sort(key, dim=1, stable=True)
    first = torch.ones_like(by_key, dtype=torch.bool)
    first[:, 1:] = by_key[:, 1:] != by_key[:, :-1]
    first &= torch.isfinite(dist.gather(1, pos))
    width = key.shape[1]
    # the m first entries in distance order: the m smallest positions (distinct, so topk's
    # sorted prefix is the full sort's)
    rank = torch.where(first, pos, width)
    rank = rank.topk(min(m, width), dim=1, largest=False, sorted=True).values
    if rank.shape[1] < m:
        rank = torch.cat([rank, rank.new_full((b, m - rank.shape[1]), width)], 1)
    found = rank < width
    return torch.where(found, key.gather(1, rank.clamp(max=width - 1)), -1)


def approximate_shortlist(X_desc: torch.Tensor, Y_desc: torch.Tensor, n_candidates, *,
                          exclude=None, random_state=0, batch_size=None,
                          entries_per_candidate=None) -> torch.Tensor:
    """:func:`~invariant_cluster.search.blocked.shortlist` by an approximate index search.

    Parameters
    ----------
    X_desc : torch.Tensor of shape (n_x, d) or (n_x, U, d)
        Query descriptors, ``U`` copies per query; or an object with ``ndim``, ``shape``,
        ``device`` and ``dtype`` whose rows, indexed (``X_desc[a:b]``, ``X_desc[rows]``), are
        computed when read: the index is searched one block of queries at a time, so only that
        block's descriptors are held.
    Y_desc : torch.Tensor of shape (n_y, d) or (n_y, V, d)
        Key descriptors, ``V`` copies per key; the distance of a pair is the smallest over the
        ``U x V`` pairs of copies (as in ``shortlist``).
    n_candidates : int
        Clipped to ``n_y`` (minus one with ``exclude``).
    exclude : torch.Tensor of shape (n_x,), optional
        A key index to leave out for each query.
    random_state : int, default=0
        Seeds the k-means of faiss's inverted file.
    batch_size : int, optional
        Queries per block of the exact fallback.
    entries_per_candidate : float, optional
        The index returns about ``entries_per_candidate * n_candidates / U`` key copies per
        query copy (None: the module's ``_ENTRIES_PER_CANDIDATE``, see its note).

    Returns
    -------
    candidates : torch.Tensor of shape (n_x, n_candidates), long
        Distinct key indices, nearest first (by descriptor distance).
    """
    Xd, Yd, m = check_descriptors(X_desc, Y_desc, n_candidates, exclude)
    n_x, U = Xd.shape[:2]
    n_y, V = Yd.shape[:2]
    device = Xd.device
    n_index = n_y * V
    # entries per query copy: about per * m per query, spread over its U copies (at most 2 m
    # per copy)
    per = _ENTRIES_PER_CANDIDATE if entries_per_candidate is None else float(
        entries_per_candidate)
    if not (math.isfinite(per) and per > 0):
        raise ValueError(f"entries_per_candidate: expected a positive number, got "
                         f"{entries_per_candidate!r}")
    kq = int(max(1, min(n_index, 2 * m, math.ceil(per * m / U))))
    ex = None if exclude is None else exclude.cpu().long()
    with _faiss_threads(torch.get_num_threads()), \
            progress_bar(2, "approximate shortlist", "step") as bar:
        bar.set_postfix_str(f"indexing {n_index} key copies")
        index = _build_index(_rows(Yd, _width(Yd.shape[-1])), random_state)
        bar.update()
        bar.set_postfix_str(f"querying {n_x * U} query copies")
        out, short = _distinct_keys(index, Xd, kq, U, V, m, ex)
        # rows whose copies found the same keys again and again: asked again, with more
        # entries per copy
        for grow in _REQUERY_GROWTH:
            if not short.numel() or kq >= n_index:
                break
            kq = int(min(n_index, kq * grow))
            rows = Xd[short.to(Xd.device)]
            again, still = _distinct_keys(index, rows, kq, U, V, m,
                                          None if ex is None else ex[short])
            out[short] = again
            short = short[still]
        bar.update()
    del index
    release()
    if short.numel():  # the index search came back with too few distinct keys: search exactly
        ex = None if exclude is None else exclude.to(device)[short.to(device)]
        out[short] = shortlist(Xd[short.to(device)], Yd, m, exclude=ex,
                               batch_size=batch_size).cpu()
    return out.to(device)
