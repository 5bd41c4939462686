"""Invariant attention iterated to its fixed point: the two updates (fixed keys: mean shift;
current means as keys: blurring), with the weights of :mod:`invariant_cluster._weights`.

The layer between the search (:mod:`invariant_cluster.search`, which gives each sample's
neighbours and their alignments) and the estimator (:mod:`invariant_cluster.cluster`): every
function takes tensors and returns tensors, and every warp goes through
:func:`~invariant_cluster.transforms.fast_warp`.
"""

from __future__ import annotations

import numpy as np
import torch

from ._graph import graph_modes
from ._memory import block_elements
from ._progress import progress_bar
from ._weights import attention_weights, calibrate_bandwidth
from .transforms import fast_warp

__all__ = ["calibrate_bandwidth", "attention_weights", "iterate_attention", "mean_shift",
           "attend_means", "blurring_mean_shift"]

# The fixed-point iteration checks its convergence every this many steps (one host-device
# synchronisation per check, none in between).
_CHECK_EVERY = 10
# blurring update: the partition into modes must stay the same this many iterations in a row
_STABLE_ITERS = 3


def _log_counts(counts, rows, idx):
    """``(b, k + 1)`` log multiplicities of each row's keys (itself, then ``idx``)."""
    if counts is None:
        return None
    return torch.log(torch.cat([counts[rows][:, None], counts[idx]], 1))


def _rows_per_block(n, k, n_features, element_size, batch_size, device):
    """Rows per block of the iteration: the ``(b, k + 1, F)`` aligned keys and a few copies."""
    if batch_size is not None:
        return int(batch_size)
    per_row = max(1, 4 * (k + 1) * n_features)
    return int(max(1, min(n, block_elements(device, element_size) // per_row)))


def _aligned_keys(keys, rows, idx, P):
    """``(b, k + 1, F)``: each row's own key, then its neighbours warped onto it."""
    b, k = idx.shape
    own = keys[rows].reshape(b, 1, -1)
    if k == 0:
        return own
    warped = fast_warp(keys[idx.reshape(-1)], P.reshape(-1, P.shape[-1]).to(keys.dtype))
    return torch.cat([own, warped.reshape(b, k, -1)], 1)


def _gram_distances(G, c):
    """``||m - key_j||`` for ``m = c^T keys``, from the keys' Gram matrix ``G`` ``(b, K, K)``
    and the coefficients ``c`` ``(b, K)``: ``(b, K)``."""
    Gc = torch.bmm(G, c[:, :, None])[..., 0]
    msq = (c * Gc).sum(1, keepdim=True)
    return (msq - 2.0 * Gc + torch.diagonal(G, dim1=1, dim2=2)).clamp(min=0).sqrt()


def _gram_norm(G, c):
    """``||c^T keys||`` from the keys' Gram matrix ``G``: ``(b,)``."""
    return (c * torch.bmm(G, c[:, :, None])[..., 0]).sum(1).clamp(min=0).sqrt()


def iterate_attention(Xt, idx, P, rho, sigma, bandwidth, *, update="fixed", max_iter, tol,
                      batch_size=None, counts=None):
    """:func:`mean_shift` then :func:`attend_means` (``update="fixed"``), or
    :func:`blurring_mean_shift` ("blurring").

    Returns ``(means, weights (n, k + 1), history, converged)``.
    """
    if update == "blurring":
        return blurring_mean_shift(Xt, idx, P, rho, sigma, bandwidth, max_iter=max_iter,
                                   tol=tol, batch_size=batch_size, counts=counts)
    M, W, history, converged = mean_shift(Xt, idx, P, rho, sigma, bandwidth, max_iter=max_iter,
                                          tol=tol, batch_size=batch_size, counts=counts)
    if max_iter > 0:
        # the denoised means attend to each other once (see attend_means)
        M, W_means = attend_means(M, idx, P, bandwidth, batch_size, counts=counts)
        W = W if W_means is None else W_means
    return M, W, history, converged


def mean_shift(Xt, idx, P, rho, sigma, bandwidth, *, max_iter, tol, batch_size=None,
               counts=None):
    """Invariant attention with fixed keys, iterated to its fixed point (mean shift).

    Sample ``i`` attends to itself and to its neighbours aligned onto it, ``T_ij x_j``; its
    mean moves to ``m_i <- sum_j w_j(m_i) T_ij x_j``. The weights are a non-increasing function
    of ``||m_i - T_ij x_j||``, so each step is a monotone ascent of a kernel density over the
    aligned neighbourhood (the "shadow" kernel of Cheng, 1995): the means converge, and a mean
    never leaves the convex hull of its own neighbourhood. Rows are independent, so blocks of
    rows run to convergence one after the other, each with its aligned keys warped once.

    Returns ``(means, weights (n, k + 1), history, converged)``.
    """
    n, k = idx.shape
    nf = Xt[0].numel()
    rows_per = _rows_per_block(n, k, nf, Xt.element_size(), batch_size, Xt.device)
    M = Xt.reshape(n, nf).clone()
    W = Xt.new_zeros((n, k + 1))
    # the (k + 1) x (k + 1) algebra below is in float64 where the device has it (not MPS)
    small = Xt.dtype if Xt.device.type == "mps" else torch.float64
    moves = Xt.new_zeros(max(max_iter, 1), dtype=small)
    done = 0
    # the bar counts the rows that stopped moving (they leave the batch at each check)
    bar = progress_bar(n, "attention iteration", "row")
    for r0 in range(0, n, rows_per):
        rows = torch.arange(r0, min(n, r0 + rows_per), device=Xt.device)
        keys = _aligned_keys(Xt, rows, idx[rows], P[rows])
        # A mean is a convex combination m = c^T keys of its row's keys, so the iteration runs
        # on the coefficients c and the keys' Gram matrix G (one batched product per block):
        # <m, key_j> = (G c)_j and ||m||^2 = c^T G c. A step costs (k + 1)^2 instead of
        # 2 (k + 1) F multiply-adds.
        G = torch.bmm(keys, keys.transpose(1, 2)).to(small)
        s, r = sigma[rows], rho[rows]
        lc = _log_counts(counts, rows, idx[rows])
        c = G.new_zeros((len(rows), k + 1))
        c[:, 0] = 1.0  # each mean starts at its own sample
        # rows still moving: at each check, the rows whose last step was below tol are done
        # and leave the batch (they keep their mean), so late iterations cost little
        act = torch.arange(len(rows), device=Xt.device)
        Ga, sa, ra, ca, la = G, s, r, c.clone(), lc
        it = stopped = 0
        while it < max_iter:
            w = attention_weights(_gram_distances(Ga, ca), ra, sa, bandwidth, la)
            delta = w - ca
            step = _gram_norm(Ga, delta) / sa
            moves[it] = torch.maximum(moves[it], step.max())
            ca = w
            it += 1
            if it % _CHECK_EVERY == 0:
                c[act] = ca
                keep = step >= tol
                n_moving = int(keep.sum())
                bar.update(len(act) - n_moving)
                stopped += len(act) - n_moving
                bar.set_postfix_str(f"iteration {it}, {n_moving} rows of the block moving")
                if not n_moving:
                    break
                act, Ga, sa, ra, ca = (t[keep] for t in (act, Ga, sa, ra, ca))
                la = None if la is None else la[keep]
        bar.update(len(rows) - stopped)  # the rows still moving when max_iter stopped them
        c[act] = ca
        W[rows] = attention_weights(_gram_distances(G, c), r, s, bandwidth, lc).to(W.dtype)
        M[rows] = torch.bmm(c[:, None].to(keys.dtype), keys)[:, 0]
        done = max(done, it)
    bar.close()
    history = moves[:done].cpu().tolist()
    below = [t for t, h in enumerate(history) if h < tol]
    converged = bool(below) or max_iter == 0
    if below:  # the iteration at which every block had converged
        history = history[:below[0] + 1]
    return M.reshape(Xt.shape), W, history, converged


def attend_means(M, idx, P, bandwidth, batch_size=None, counts=None):
    """One step of invariant attention among the converged means: ``m_i <- sum_j w_ij T_ij m_j``
    over the same neighbourhoods, the bandwidth recalibrated on the means' own distances.

    Once a mean is denoised, every noisy neighbour is nearer than ``rho_i`` and the fixed-key
    weights are all 1; between denoised means the distances tell near from far, so the means
    attend to each other once (a second step blurs). Measurements: the user guide's
    convergence page, "What the estimator does".

    Returns ``(means, weights (n, k + 1))``.
    """
    n, k = idx.shape
    if k == 0 or bandwidth != "auto":
        return M, None
    nf = M[0].numel()
    rows_per = _rows_per_block(n, k, nf, M.element_size(), batch_size, M.device)
    out = torch.empty_like(M).reshape(n, nf)
    W = M.new_zeros((n, k + 1))
    for r0 in range(0, n, rows_per):
        rows = torch.arange(r0, min(n, r0 + rows_per), device=M.device)
        keys = _aligned_keys(M, rows, idx[rows], P[rows])
        d = torch.linalg.vector_norm(keys - keys[:, :1], dim=2)
        rho, sigma = calibrate_bandwidth(d[:, 1:].sort(1).values)
        w = attention_weights(d, rho, sigma, bandwidth, _log_counts(counts, rows, idx[rows]))
        out[rows] = torch.bmm(w[:, None].to(keys.dtype), keys)[:, 0]
        W[rows] = w
    return out.reshape(M.shape), W


def blurring_mean_shift(Xt, idx, P, rho, sigma, bandwidth, *, max_iter, tol, batch_size=None,
                        counts=None):
    """Invariant attention with the current means as keys (Gaussian blurring mean shift) on
    the samples' kNN graph, stopped when the cluster structure stops changing.

    Maintenance note: blurring mean shift first collapses each cluster, then merges clusters
    slowly until one point is left, so "until the means stop moving" over-merges.
    Carreira-Perpinan (ICML 2006) stops when the clustering stops changing; here the partition
    into modes (connected components of means within ``rho_i + sigma_i`` along the graph) must
    stay the same for ``_STABLE_ITERS`` iterations in a row (one host synchronisation per
    iteration for that test), or the largest relative move fall below ``tol``.

    Returns ``(means, weights (n, k + 1), history, converged)``.
    """
    n, k = idx.shape
    nf = Xt[0].numel()
    rows_per = _rows_per_block(n, k, nf, Xt.element_size(), batch_size, Xt.device)
    M = Xt.clone()
    W = Xt.new_zeros((n, k + 1))
    history, converged, stable, previous = [], max_iter == 0, 0, None
    tol_modes = (rho + sigma).cpu().numpy()
    idx_np = idx.cpu().numpy()
    bar = progress_bar(max_iter, "blurring iteration", "iteration")
    for _ in range(max_iter):
        bar.update()
        new = torch.empty_like(M).reshape(n, nf)
        edge = Xt.new_zeros((n, k))
        move = Xt.new_zeros(())
        for r0 in range(0, n, rows_per):
            rows = torch.arange(r0, min(n, r0 + rows_per), device=Xt.device)
            keys = _aligned_keys(M, rows, idx[rows], P[rows])
            d = torch.linalg.vector_norm(keys[:, :1] - keys, dim=2)
            w = attention_weights(d, rho[rows], sigma[rows], bandwidth,
                                  _log_counts(counts, rows, idx[rows]))
            new[rows] = torch.bmm(w[:, None].to(keys.dtype), keys)[:, 0]
            W[rows] = w
            edge[rows] = d[:, 1:]
            move = torch.maximum(move, (torch.linalg.vector_norm(
                new[rows] - keys[:, 0], dim=1) / sigma[rows]).max())
        M = new.reshape(Xt.shape)
        history.append(float(move))
        labels = _relabel_by_size(graph_modes(idx_np, edge.cpu().numpy(), tol_modes))
        stable = stable + 1 if previous is not None and np.array_equal(labels, previous) else 0
        previous = labels
        if history[-1] < tol or stable >= _STABLE_ITERS - 1:
            converged = True
            break
    bar.close()
    return M, W, history, converged


def _relabel_by_size(labels):
    """Labels 0..K-1 ordered by decreasing cluster size (ties: first occurrence)."""
    uniq, first, counts = np.unique(labels, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))
    mapping = np.empty(uniq.max() + 1, dtype=np.int64)
    mapping[uniq[order]] = np.arange(len(uniq))
    return mapping[labels]
