"""The exact grid search restricted to each query's candidate keys, organised by key."""

from __future__ import annotations

import math

import torch

from .. import _memory
from .._dask import blocked_map
from .._heap import release
from .grid import SearchGrid, check_int
from .kernel import mask_excluded, merge_topk, shift_energies, shift_margin, warp_canvas

__all__ = ["candidate_search"]


def _key_block(block, X, xsq, shifts, angles, reflection=False):
    """Exact grid search of one block of keys against the queries that list them (a dask task).

    ``block = (Yb, qidx, pairs)``: ``kb`` key images and, per key, the indices of the queries
    that have it as a candidate, padded with -1 to ``(kb, m)`` (``pairs``, where the caller puts
    the results, is not read). Returns ``(dist, arg)`` of shape ``(kb, m)``, ``arg = r * S + s``
    the best grid point (first minimum in that order).
    """
    Yb, qidx = block[:2]
    kb, m = qidx.shape
    c, h, w = Yb.shape[1:]
    nf = c * h * w
    pad = shift_margin(shifts)
    hp, wp = h + 2 * pad, w + 2 * pad
    canvas = c * hp * wp
    # (R, kb canvas): every key rotated (and with reflection, mirrored) onto a padded canvas,
    # angle-major as grid_sample writes it
    Kw = warp_canvas(Yb, angles, pad=pad, reflection=reflection)
    R, S = Kw.shape[0], len(shifts)
    by_key = Kw.view(R, kb, canvas).transpose(0, 1)  # (kb, R, canvas), a view
    # ||T_(r, s) y||^2, the energy in each shift's window, summed from the squared canvas (as
    # the all-pairs search does), not from the copied windows below (P^2 times the data)
    E = shift_energies(Kw.view(R, kb, canvas), shifts, (c, h, w)).transpose(0, 1).reshape(
        kb, 1, R * S)
    # the queries of every key (kb, m, F); index_select, not ``X[qi]``: a third of the time
    qi = qidx.clamp(min=0).reshape(-1)
    Xg = torch.index_select(X.reshape(X.shape[0], nf), 0, qi).view(kb, m, nf)
    if pad == 0:
        # the key's matrix over all angles is a strided view of the warps (leading dimension
        # ``kb canvas``) that the batched product reads as is: no copy
        # ||T y||^2 - 2 <x, T y> in one batched product, the energies its bias: (kb, m, R)
        scores = torch.baddbmm(E, Xg, by_key.transpose(1, 2), alpha=-2.0)
    else:
        # <P_(m - t) x, Z> = <x, the H x W window of Z at offset m - t>: the shifts are crops of
        # the key's canvas and the gathered queries stay H x W. All (2m + 1)^2 windows are
        # copied in their natural order (one copy; measured faster than one product per shift
        # on strided windows, which reads the queries S times), and the score columns are put
        # in grid order afterwards.
        P = 2 * pad + 1
        win = by_key.reshape(kb, R, c, hp, wp).unfold(3, h, 1).unfold(4, w, 1)
        Z = win.permute(0, 1, 3, 4, 2, 5, 6).reshape(kb, R * P * P, nf)
        off = torch.as_tensor((pad - shifts[:, 1]) * P + (pad - shifts[:, 0]), device=Kw.device)
        cols = (torch.arange(R, device=Kw.device)[:, None] * (P * P) + off[None]).reshape(-1)
        scores = torch.index_select(torch.bmm(Xg, Z.transpose(1, 2)), 2, cols)
        scores = torch.add(E, scores, alpha=-2.0, out=scores)
    # ||x||^2 added to the minimum over the grid (rounding is monotone: the same as before it)
    dist, arg = scores.min(2)
    dist = dist.add_(torch.index_select(xsq, 0, qi).view(kb, m)).clamp_(min=0.0)
    dist[qidx < 0] = math.inf
    return dist, arg


def _key_blocks(counts: torch.Tensor, per_key: int, per_pair: int, budget: int):
    """Split the keys (ascending in-degree) into blocks of bounded padded size: each block a
    list of ``(key, first pair, pairs)``. A key listed by more queries than one block holds
    (a cluster's centre searched by all its members) is split into blocks of its own."""
    order = torch.argsort(counts, stable=True)
    order = order[counts[order] > 0].tolist()
    cnt = counts.tolist()
    cap = max(1, (budget - per_key) // per_pair)
    blocks, cur = [], []
    for j in order:  # m grows along ``order``: the block's padded width is the last count
        if cnt[j] > cap:
            if cur:
                blocks.append(cur)
                cur = []
            blocks.extend([(j, o, min(cap, cnt[j] - o))] for o in range(0, cnt[j], cap))
            continue
        size = (len(cur) + 1) * (per_key + cnt[j] * per_pair)
        if cur and size > budget:
            blocks.append(cur)
            cur = []
        cur.append((j, 0, cnt[j]))
    if cur:
        blocks.append(cur)
    return blocks


def candidate_search(X: torch.Tensor, Y: torch.Tensor, candidates: torch.Tensor,
                     grid: SearchGrid, *, k=None, batch_size=None, exclude=None, client=None):
    """The exact grid search of :func:`~invariant_cluster.alignment.grid_search`, restricted to
    each query's candidate keys.

    The work is organised by KEY: every key is warped once per grid angle (``warp_canvas``,
    block by block; quarter turns and mirrors copied from sampled warps), shifted by every
    integer shift, and compared with all the queries that list it in ONE batched product
    ``(kb, m, F) @ (kb, F, R S)`` (``m`` the queries per key, padded within a block of keys of
    similar in-degree; without shifts the keys' side is a strided view of the warps, no copy).
    Energies ``||S_t T_r y||^2`` come from ``shift_energies`` and the distance is
    ``||x||^2 + ||S_t T_r y||^2 - 2 <x, S_t T_r y>``, as in ``grid_search``, minimised over the
    grid (first minimum in grid order). Memory is bounded by the key blocks.

    Parameters
    ----------
    X : torch.Tensor of shape (n_x, C, H, W)
        Queries.
    Y : torch.Tensor of shape (n_y, C, H, W)
        Keys, same device (cast to ``X``'s dtype).
    candidates : torch.Tensor of shape (n_x, c), long
        Distinct key indices per query (e.g. from :func:`shortlist`).
    grid : SearchGrid
    k : int, optional
        Keep the ``k`` nearest candidates (None: all ``c``), sorted ascending.
    batch_size : int, optional
        Queries per block (None: all at once); within a block of queries the keys are
        blocked by the memory budget. Smaller blocks bound the memory and make more Dask
        tasks, at the cost of warping a key once per block of queries that lists it.
    exclude : torch.Tensor of shape (n_x,), optional
        A key index to leave out for each query (its own index when ``X is Y``).
    client : dask.distributed.Client, optional
        Run the key blocks as dask tasks (see :mod:`invariant_cluster._dask`); None runs them
        here unless joblib's dask backend is active. Results are identical either way.

    Returns
    -------
    dist : torch.Tensor of shape (n_x, k)
        Squared distances at the best grid point (clamped at 0), ascending; ``inf`` where
        ``exclude`` removed a candidate and fewer than ``k`` remained.
    index : torch.Tensor of shape (n_x, k), long
        Key indices.
    params : torch.Tensor of shape (n_x, k, 3)
        ``(angle, tx, ty)`` that warps the key onto the query.

    Notes
    -----
    Why by key: gathering each query's ``c`` candidates' ``R`` warps would move ``c R F`` values
    per query through memory (slower, measured, than the dense all-pairs product at
    ``n = 2000``); gathering each key's queries moves ``F`` values per pair and keeps the
    products dense. ``<S_-t x, z> = <x, S_t z>`` holds exactly with zero padding, so shifting
    the key instead of the query changes only the order of the summation (round-off).
    """
    if X.ndim != 4 or Y.ndim != 4 or X.shape[1:] != Y.shape[1:]:
        raise ValueError(f"X, Y: expected (n, C, H, W) tensors of the same image shape, got "
                         f"{tuple(X.shape)} and {tuple(Y.shape)}")
    n_x, n_y = X.shape[0], Y.shape[0]
    if candidates.ndim != 2 or candidates.shape[0] != n_x:
        raise ValueError(f"candidates: expected shape ({n_x}, c), got {tuple(candidates.shape)}")
    k = check_int(k, "k", 1, allow_none=True)
    batch_size = check_int(batch_size, "batch_size", 1, allow_none=True)
    release()  # what the previous stage left free in the heap (see _heap.release)
    device, dtype = X.device, X.dtype
    Y = Y.to(device=device, dtype=dtype)
    candidates = candidates.to(device=device, dtype=torch.long)
    if candidates.numel() and (int(candidates.min()) < 0 or int(candidates.max()) >= n_y):
        raise ValueError(f"candidates: expected key indices in [0, {n_y}), got values in "
                         f"[{int(candidates.min())}, {int(candidates.max())}]")
    c = candidates.shape[1]
    angles = torch.as_tensor(grid.angles, dtype=dtype, device=device)
    R, S = grid.n_mirrors * len(grid.angles), len(grid.shifts)
    es = X.element_size()
    kk = c if k is None else min(k, c)
    _memory.check_fits(n_x * c * (2 * es + 2 * 8) + n_x * kk * (4 * es + 8), device,
                       "the candidate lists and their distances", hint="use fewer n_candidates")
    # per key: its warps on the padded canvas (angle-major, and a quarter of them as sampled),
    # their crops (R S F) and energies; per (key, query) pair: the gathered query (F) and the
    # scores (R S, twice)
    m = shift_margin(grid.shifts)
    canvas = X.shape[1] * (X.shape[2] + 2 * m) * (X.shape[3] + 2 * m)
    nf = X[0].numel()
    per_key = R * (2 * canvas + canvas // 4 + (S * nf if m else 0) + 2 * S)
    per_pair = nf + 3 * R * S
    budget = _memory.block_elements(device, es)
    _memory.check_fits((per_key + per_pair) * es, device, "the search of a single key",
                       hint="use a smaller grid (n_rotations, max_translation) or smaller images")
    # an excluded pair is never computed: its key becomes n_y, sorted past every real key
    # (lists padded with the query's own index cost nothing)
    step = max(1, n_x) if batch_size is None else batch_size
    own = None if exclude is None else exclude.to(device)

    def keyed(q0):
        """The candidates of the query block at ``q0``, flat, the excluded ones as ``n_y``."""
        block = candidates[q0:q0 + step]
        if own is not None:
            block = torch.where(block == own[q0:q0 + step, None], n_y, block)
        return block.reshape(-1)

    plans = []  # per query block: its pairs' counts by key, and its key blocks
    for q0 in range(0, n_x, step):  # query blocks; within each, key blocks from the budget
        counts = torch.bincount(keyed(q0), minlength=n_y + 1)[:n_y]
        plans.append((q0, counts, _key_blocks(counts.cpu(), per_key, per_pair, budget)))

    def blocks():
        # one key block at a time: its keys and the queries that list them are gathered when
        # it runs, so the search holds one block's copies, not the whole work list's
        for q0, counts, key_blocks in plans:
            flat = keyed(q0)
            order = torch.argsort(flat, stable=True)  # pairs grouped by key, queries ascending
            del flat
            starts = torch.cumsum(counts, 0) - counts
            for entries in key_blocks:
                kt, first, cnt = torch.as_tensor(entries, device=device).T
                slot = torch.arange(int(cnt.max()), device=device)
                pos = starts[kt, None] + first[:, None] + slot[None]  # (kb, m) in ``order``
                valid = slot[None] < cnt[:, None]
                pos = torch.where(valid, pos, torch.zeros_like(pos))
                pair = order[pos]
                # the task's inputs, and (not read by the task) where its results go
                yield (Y[kt], torch.where(valid, torch.div(pair, c, rounding_mode="floor") + q0,
                                          -1),
                       torch.where(valid, pair + q0 * c, -1))

    dist_all = torch.full((n_x * c,), math.inf, dtype=dtype, device=device)
    arg_all = torch.zeros((n_x * c,), dtype=torch.long, device=device)

    def scatter(block, result):
        pid = block[2]
        ok = pid >= 0
        dist_all[pid[ok]] = result[0].to(device)[ok]
        arg_all[pid[ok]] = result[1].to(device)[ok]

    xsq = (X.reshape(n_x, -1) ** 2).sum(1)
    blocked_map(_key_block, blocks(), shared=(X, xsq, grid.shifts, angles, grid.reflection),
                desc="exact search of the candidates", client=client, each=scatter,
                n_blocks=sum(len(p[2]) for p in plans))
    dist_all = mask_excluded(dist_all.reshape(n_x, c), candidates, own)
    dist, index, best = merge_topk(None, dist_all, candidates, arg_all.reshape(n_x, c), kk)
    return dist, index, grid.decode(best, X)
