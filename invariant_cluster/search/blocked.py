"""The blocked descriptor shortlist: every query against every key, in blocks.

The exact shortlist of :func:`~invariant_cluster.search.shortlist.neighbor_search` and the
fallback of :func:`~invariant_cluster.search.approximate.approximate_shortlist`, so both import
it from here.
"""

from __future__ import annotations

import torch

from .. import _memory
from .._progress import progress_bar
from .grid import check_int
from .kernel import mask_excluded, merge_topk

__all__ = ["check_descriptors", "shortlist"]


def check_descriptors(X_desc, Y_desc, n_candidates, exclude):
    """``(X_desc, Y_desc, m)`` of a shortlist: the descriptors as ``(n, copies, d)`` (the keys'
    on the queries' device and dtype) and the shortlist length ``m``, clipped to the keys left
    (one fewer with ``exclude``); refuses mismatched shapes and an empty choice."""
    Xd = X_desc[:, None] if X_desc.ndim == 2 else X_desc
    Yd = Y_desc[:, None] if Y_desc.ndim == 2 else Y_desc
    if Xd.ndim != 3 or Yd.ndim != 3 or Xd.shape[-1] != Yd.shape[-1]:
        raise ValueError(f"X_desc, Y_desc: expected (n, [copies,] d) tensors with the same d, "
                         f"got {tuple(X_desc.shape)} and {tuple(Y_desc.shape)}")
    n_candidates = check_int(n_candidates, "n_candidates", 1)
    n_y = Yd.shape[0]
    m = min(n_candidates, n_y - (1 if exclude is not None else 0))
    if m < 1:
        raise ValueError(f"n_candidates: no key left to choose from ({n_y} keys)")
    return Xd, Yd.to(device=Xd.device, dtype=Xd.dtype), m


def shortlist(X_desc: torch.Tensor, Y_desc: torch.Tensor, n_candidates, *, batch_size=None,
              exclude=None) -> torch.Tensor:
    """The ``n_candidates`` nearest keys of every query by descriptor distance.

    Blocked: squared distances ``||x||^2 + ||y||^2 - 2 <x, y>`` of a block of queries against a
    chunk of keys (one matrix product, ``||y||^2`` its bias), minimised over the copies of each
    image, and merged into a running top-``n_candidates`` (memory
    ``O(n_x n_candidates + block)``).

    Parameters
    ----------
    X_desc : torch.Tensor of shape (n_x, d) or (n_x, U, d)
        Query descriptors; with ``U`` copies per query (e.g. its shifts).
    Y_desc : torch.Tensor of shape (n_y, d) or (n_y, V, d)
        Key descriptors; with ``V`` copies per key (e.g. its rotations). The distance of a pair is
        the smallest over the ``U x V`` pairs of copies.
    n_candidates : int
        Clipped to ``n_y`` (minus one with ``exclude``).
    batch_size : int, optional
        Queries per block (None: from the memory budget).
    exclude : torch.Tensor of shape (n_x,), optional
        A key index to leave out for each query.

    Returns
    -------
    candidates : torch.Tensor of shape (n_x, n_candidates), long
        Distinct key indices, nearest first.
    """
    Xd, Yd, m = check_descriptors(X_desc, Y_desc, n_candidates, exclude)
    batch_size = check_int(batch_size, "batch_size", 1, allow_none=True)
    n_x, U, d = Xd.shape
    n_y, V = Yd.shape[:2]
    device = Xd.device
    budget = _memory.block_elements(device, 3 * Xd.element_size())
    # keys per chunk: a few times the shortlist, so that merging stays cheap
    kc = int(max(1, min(n_y, max(4 * m, 1024))))
    qb = batch_size or int(max(1, min(n_x, budget // max(1, U * kc * V + 2 * (kc + m)))))
    # each chunk of keys laid out by copy, ``(V kc, d)``, and its squared norms: the minimum
    # over the copies then reads whole rows of the scores
    chunks = []
    for k0 in range(0, n_y, kc):
        Yc = Yd[k0:k0 + kc].transpose(0, 1).reshape(-1, d)
        chunks.append((k0, min(n_y, k0 + kc), Yc, (Yc * Yc).sum(1)))
    out = torch.empty((n_x, m), dtype=torch.long, device=device)
    exclude = None if exclude is None else exclude.to(device)
    bar = progress_bar(-(-n_x // qb), "descriptor shortlist")
    for q0 in range(0, n_x, qb):
        bar.update()
        Q = Xd[q0:q0 + qb].reshape(-1, d)
        b = Q.shape[0] // U
        qsq = (Q * Q).sum(1).reshape(b, U, 1)
        ex = None if exclude is None else exclude[q0:q0 + b]
        top = None
        for k0, k1, Yc, ysq in chunks:
            # ||y||^2 - 2 <x, y>, minimised over the key's copies, then ||x||^2 added and
            # minimised over the query's copies (rounding is monotone: the same minimum as
            # adding both before)
            D = torch.addmm(ysq, Q, Yc.T, alpha=-2.0).view(b, U, V, k1 - k0)
            D = D.amin(2).add_(qsq).amin(1).clamp_(min=0.0)
            keys = torch.arange(k0, k1, device=device)
            mask_excluded(D, keys, ex)
            top = merge_topk(top, D, keys.expand(b, -1), None, m)
        out[q0:q0 + b] = top[1]
    bar.close()
    return out
