"""Averaging under alignment: the weighted invariant mean of a set of images, and of each
cluster (the algorithms; :mod:`invariant_cluster.barycenters` is their public face)."""

from __future__ import annotations

import math
import numbers
from dataclasses import replace

import numpy as np
import torch

from ._progress import progress_bar
from ._utils import check_real_dtype, resolve_device
from .alignment import to_images
from .search import grid_search, make_search_grid, refine_alignments
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


def cluster_means(Xt, M, labels, grid, batch_size, D_knn):
    """Each cluster's invariant mean of its samples, and each sample's alignment onto it.

    The fixed-point iteration of the invariant mean runs on the grid (three rounds, started at
    the cluster's densest converged mean); then two rounds with the continuous refinement
    (``grid.refine``, about 20 warps per sample and round), the centre being the average of the
    members warped with the refined alignments.
    """
    coarse = replace(grid, refine=False)
    n_clusters = int(labels.max()) + 1
    centers = []
    params = torch.zeros((Xt.shape[0], grid.n_params), dtype=Xt.dtype, device=Xt.device)
    density = torch.nan_to_num(D_knn, posinf=0.0).mean(1)
    bar = progress_bar(n_clusters, "cluster centres", "cluster")
    for c in range(n_clusters):  # a loop over clusters; each step is batched over its members
        members = torch.as_tensor(np.flatnonzero(labels == c), device=Xt.device)
        w = torch.full((len(members),), 1.0 / len(members), dtype=Xt.dtype, device=Xt.device)
        # start from the converged mean of the member in the densest place
        init = M[members[int(torch.argmin(density[members]))]]
        Xc = Xt[members]
        mu, p, _ = invariant_mean_tensor(Xc, w, coarse, init=init, max_iter=3, tol=1e-4,
                                         batch_size=batch_size)
        for _ in range(2 if grid.refine else 0):  # refined rounds of the same fixed point
            _, p = refine_alignments(mu.expand(len(members), *mu.shape), Xc, p, grid)
            mu = (w[:, None, None, None] * fast_warp(Xc, p)).sum(0)
        centers.append(mu)
        params[members] = p
        bar.update()
    bar.close()
    return torch.stack(centers), params
