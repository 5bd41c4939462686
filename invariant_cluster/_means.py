"""Averaging under alignment: the weighted invariant mean of a set of images, and of each
cluster (the algorithms; :mod:`invariant_cluster.barycenters` is their public face)."""

from __future__ import annotations

import math
import numbers
from dataclasses import replace

import numpy as np
import torch

from . import _heap, _memory
from ._progress import progress_bar
from ._utils import check_real_dtype, resolve_device
from .alignment import to_images
from .search import (
    candidate_search,
    grid_search,
    make_search_grid,
    refine_alignments,
    refine_pairs,
)
from .transforms import check_rotation_center, fast_warp, invert_se2, pad_for_centre

__all__ = ["invariant_mean", "invariant_mean_tensor", "cluster_means"]


def invariant_mean_tensor(X: torch.Tensor, w: torch.Tensor, grid, *, init=None, max_iter=20,
                          tol=1e-5, batch_size=None):
    """Tensor core of :func:`invariant_mean`: ``X`` ``(n, C, H, W)``, ``w`` ``(n,)`` summing to 1.

    Returns ``(mean (C, H, W), params (n, grid.n_params), n_iter)``.
    """
    n = X.shape[0]
    if init is None:
        # weighted medoid under the invariant distance: a start that is one of the samples
        D, _ = grid_search(X, X, grid, batch_size=batch_size)
        score = D @ w
        # near-ties (transformed copies of one image) go to the heaviest sample
        energy = float((X.reshape(n, -1) ** 2).sum(1).mean())
        tie = score <= score.min() + 1e-5 * max(energy, 1e-12)
        init = X[int(torch.argmax(torch.where(tie, w, torch.full_like(w, -1.0))))]
    mu = init
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007 - n_iter is returned
        # warp the one mean rather than all samples (R warps instead of n R): the best grid
        # point of mu onto x_j, inverted, starts the refinement of x_j onto mu
        _, p = grid_search(X, mu[None], grid, batch_size=batch_size)
        params = invert_se2(p[:, 0])
        if grid.refine:  # (without it, refine_alignments would only warp to measure)
            _, params = refine_alignments(mu.expand(n, *mu.shape), X, params, grid)
        new = (w[:, None, None, None] * fast_warp(X, params)).sum(0)
        move = float(torch.linalg.vector_norm(new - mu))
        scale = float(torch.linalg.vector_norm(new)) or 1.0
        mu = new
        if move <= tol * scale:
            break
    return mu, params, n_iter


def invariant_mean(X, weights=None, *, group="se2", max_rotation=180.0, n_rotations=36,
                   max_translation=0, refine=True, image_shape=None, device="auto",
                   batch_size=None, max_iter=20, tol=1e-5, reflection=False,
                   rotation_center="geometric"):
    """Weighted invariant mean: align every sample onto the mean, average, repeat.

    Minimises ``sum_j w_j ||mu - T_tau_j x_j||^2`` over ``mu`` and the ``tau_j`` by alternating
    (the fixed point is the weighted average of the samples, each aligned onto the mean). The
    ORIGINAL samples are warped at every step, so the mean is not blurred by repeated warps.

    Parameters
    ----------
    X : array-like or torch.Tensor of shape (n, n_features), (n, H, W) or (n, C, H, W)
    weights : array-like of shape (n,), optional
        Non-negative weights (normalised to sum to 1); None gives equal weights.
    group, max_rotation, n_rotations, max_translation, refine, image_shape, device, batch_size
        As in :func:`invariant_distances`.
    reflection : bool, default=False
        Also align the mirror images of the samples (E(2), as in :func:`invariant_distances`).
    max_iter : int, default=20
    tol : float, default=1e-5
        Stop when the mean moves by less than ``tol`` times its norm.
    rotation_center : {"geometric", "fourier"}, default="geometric"
        The centre of rotations and mirrors (:mod:`invariant_cluster.transforms`' Convention):
        ``"fourier"`` for cryo-EM particles, whose centre is the pixel ``(W // 2, H // 2)``.

    Returns
    -------
    mean : ndarray or torch.Tensor
        Shape ``(n_features,)`` for flat input, else the image shape of one sample.
    alignments : ndarray or torch.Tensor of shape (n, 3), or (n, 4) with ``reflection=True``
        ``(angle, tx, ty)`` that warps each sample onto the mean (``warp_se2(X[j], tau[j])``),
        and the mirror bit with reflections.

    Notes
    -----
    The invariant mean is unique only up to a transformation of ``mu``; it starts from the
    weighted invariant medoid, so it stays in that sample's pose. Starting there costs one
    ``n x n`` grid search; each iteration costs one ``1 x n`` grid search and ``~8`` warps per
    sample for the refinement.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import invariant_mean, warp_se2
    >>> img = np.zeros((9, 9), np.float32); img[2:7, 4] = 1.0
    >>> copies = warp_se2(np.stack([img] * 4), [[0, 0, 0], [90, 0, 0], [180, 0, 0], [-90, 0, 0]])
    >>> mean, tau = invariant_mean(copies, n_rotations=4, refine=False)
    >>> bool(np.abs(mean - img).max() < 1e-4)
    True
    """
    dev = resolve_device(device)
    if isinstance(max_iter, bool) or not isinstance(max_iter, numbers.Integral) or max_iter < 1:
        raise ValueError(f"max_iter: expected an int >= 1, got {max_iter!r}")
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real):
        raise TypeError(f"tol: expected a real number >= 0, got {tol!r}")
    if not (math.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol: expected a finite number >= 0, got {tol!r}")
    check_rotation_center(rotation_center)
    Xt, _, is_numpy = to_images(X, name="X", image_shape=image_shape, device=dev)
    h0, w0 = Xt.shape[-2:]
    Xt = pad_for_centre(Xt, rotation_center)
    grid = make_search_grid(group, max_rotation, n_rotations, max_translation, refine,
                            reflection, image_shape=tuple(Xt.shape[1:]))
    n = Xt.shape[0]
    if weights is None:
        w = torch.full((n,), 1.0 / n, dtype=Xt.dtype, device=dev)
    else:
        w = np.asarray(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights)
        check_real_dtype(w.dtype, "weights")
        if w.shape != (n,):
            raise ValueError(f"weights: expected shape ({n},), got {w.shape}")
        w = w.astype(np.float64)
        if not np.isfinite(w).all() or (w < 0).any() or not (w > 0).any():
            raise ValueError("weights: expected finite non-negative values with a positive sum")
        # divided by the largest first: the sum of n weights near 1e308 would overflow
        w = w / w.max()
        w = torch.as_tensor(w / w.sum(), dtype=Xt.dtype, device=dev)
    with torch.no_grad():
        mu, params, _ = invariant_mean_tensor(Xt, w, grid, max_iter=max_iter, tol=tol,
                                              batch_size=batch_size)
    mu = mu[..., :h0, :w0]
    # the sample's own layout: flat rows stay flat, (H, W) and (C, H, W) images keep theirs
    # (np.shape, not X.shape: X may be a nested list)
    in_shape = tuple(np.shape(X) if is_numpy else X.shape)
    out_shape = (-1,) if len(in_shape) == 2 else in_shape[1:]
    mu = mu.reshape(out_shape)
    if is_numpy:
        return mu.cpu().numpy(), params.cpu().numpy().astype(np.float64)
    return mu, params


# Pairs per batch of the centres' refinement, per kind of device (None: as many as the memory
# budget allows, one batch of every sample on a card): on a CPU, batches that stay in the cache
# are faster (measured: docs/design/defaults.rst).
_REFINE_PAIRS = {"cpu": 2048}


def cluster_means(Xt, M, labels, grid, batch_size, D_knn):
    """Each cluster's invariant mean of its samples, and each sample's alignment onto it.

    The fixed-point iteration of the invariant mean (as :func:`invariant_mean_tensor`, each
    sample weighted ``1 / size`` of its cluster) runs on the grid (at most three rounds, started
    at the cluster's densest converged mean; a cluster stops when its mean moves by less than
    1e-4 of its norm); then two rounds with the continuous refinement (``grid.refine``, about
    20 warps per sample and round), the centre being the average of the members warped with the
    refined alignments. Every round is one batched step over all the clusters: the search of
    each sample against its own cluster's mean (:func:`~invariant_cluster.search.candidate_search`
    with one candidate), the refinement in memory-bounded batches of pairs, and the averages by
    ``index_add_``.
    """
    coarse = replace(grid, refine=False)
    dev, dtype = Xt.device, Xt.dtype
    n = Xt.shape[0]
    labels = np.asarray(labels)
    n_clusters = int(labels.max()) + 1
    lab = torch.as_tensor(labels, dtype=torch.long, device=dev)
    counts = torch.bincount(lab, minlength=n_clusters).to(dtype)
    w = 1.0 / counts[lab]
    # start from the converged mean of the member in the densest place (the first such member)
    density = torch.nan_to_num(D_knn, posinf=0.0).mean(1).cpu().numpy()
    start = [int(m[np.argmin(density[m])]) for m in
             (np.flatnonzero(labels == c) for c in range(n_clusters))]
    mu = M[torch.as_tensor(start, device=dev)]
    own = lab[:, None]
    with _heap.held(), progress_bar(3 + (2 if grid.refine else 0), "cluster centres",
                                   "round") as bar:
        done = torch.zeros(n_clusters, dtype=torch.bool, device=dev)
        params = None
        for _ in range(3):  # the fixed point on the grid
            _, _, p = candidate_search(Xt, mu, own, coarse, k=1, batch_size=batch_size)
            p = invert_se2(p[:, 0])
            new = _cluster_average(Xt, p, lab, w, n_clusters)
            move = torch.linalg.vector_norm((new - mu).reshape(n_clusters, -1), dim=1)
            scale = torch.linalg.vector_norm(new.reshape(n_clusters, -1), dim=1)
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            # a cluster that stopped keeps its mean and its members' alignments
            mu = torch.where(done[:, None, None, None], mu, new)
            params = p if params is None else torch.where(done[lab][:, None], params, p)
            done |= move <= 1e-4 * scale
            bar.update()
            if bool(done.all()):
                break
        for _ in range(2 if grid.refine else 0):  # refined rounds of the same fixed point
            _, params = refine_pairs(mu, Xt, lab, torch.arange(n, device=dev), params, grid,
                                     max_pairs=_REFINE_PAIRS.get(dev.type))
            mu = _cluster_average(Xt, params, lab, w, n_clusters)
            bar.update()
    return mu, params


def _cluster_average(X, params, lab, w, n_clusters):
    """``sum_j w_j warp(X_j, params_j)`` per cluster ``lab``, warped in memory-bounded blocks."""
    out = X.new_zeros((n_clusters, *X.shape[1:]))
    starts, step = _memory.pair_blocks(X.shape[0], X[0].numel())
    for i in starts:
        W = fast_warp(X[i:i + step], params[i:i + step])
        out.index_add_(0, lab[i:i + step], W * w[i:i + step, None, None, None])
    return out
