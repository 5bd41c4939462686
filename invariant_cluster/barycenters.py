"""Averaging under alignment: the weighted invariant mean of a set of images."""

from __future__ import annotations

import math
import numbers
from dataclasses import replace

import numpy as np
import torch

from ._heap import reusing_heap
from ._progress import progress_bar
from ._utils import check_real_dtype, resolve_device
from .alignment import to_images
from .search import grid_search, make_search_grid, refine_alignments
from .transforms import (
    check_rotation_center,
    compose_se2,
    fast_warp,
    image_centre,
    invert_se2,
    pad_for_centre,
)

__all__ = ["invariant_mean", "class_averages", "aligned_neighbors"]


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
        p = invert_se2(p[:, 0])
        _, params = refine_alignments(mu.expand(n, *mu.shape), X, p, grid)
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


def _check_labels(labels, n: int) -> np.ndarray:
    """``labels`` as an array of shape (n,) with no missing value (NaN or None)."""
    lab = np.asarray(labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels)
    if lab.shape != (n,):
        raise ValueError(f"labels: expected shape ({n},), got {lab.shape}")
    if lab.dtype.kind == "c":
        raise TypeError("labels: expected integers or strings, got complex numbers")
    missing = (~np.isfinite(lab)) if lab.dtype.kind == "f" else np.array(
        [x is None or (isinstance(x, float) and not np.isfinite(x)) for x in lab], bool) \
        if lab.dtype.kind == "O" else np.zeros(n, bool)
    if missing.any():
        raise ValueError(f"labels: {int(missing.sum())} missing (NaN, infinite or None) value(s), "
                         f"first at position {int(np.flatnonzero(missing)[0])}; give every "
                         "image a label")
    if lab.dtype.kind == "O":
        try:
            np.unique(lab)
        except TypeError as exc:
            raise TypeError("labels: values of one kind expected (all numbers or all "
                            f"strings): {exc}") from None
    return lab


@reusing_heap
def class_averages(X, n_neighbors=10, *, labels=None, group="se2", max_rotation=180.0,
                   n_rotations=36, max_translation=0, refine=True, reflection=False,
                   neighbor_search="auto", denoise=None, center=False, ctf=None, snr=None,
                   rotation_center="auto", image_shape=None, device="auto", batch_size=None,
                   return_alignments=False):
    """Class averages: denoised images by averaging under alignment.

    Two kinds, as cryo-electron microscopy's "2D classification" has them:

    - ``labels=None``: **each image's class average, in its own pose**: the image and its
      ``n_neighbors`` invariant nearest neighbours
      (:class:`~invariant_cluster.InvariantKNeighborsTransformer`), each neighbour warped onto
      the image by its alignment, averaged with equal weights (one step, no iteration).
      :attr:`InvariantAttentionClusterer.invariant_means_
      <invariant_cluster.InvariantAttentionClusterer>` is the iterated, attention-weighted
      version of the same average.
    - ``labels`` given: **the average of each cluster**, its :func:`invariant_mean` (in the pose
      of its medoid), one per label in ``np.unique(labels)`` order (the ``cluster_centers_`` of
      :class:`~invariant_cluster.InvariantAttentionClusterer` are these, for its own labels).

    Parameters
    ----------
    X : array-like or torch.Tensor of shape (n, n_features), (n, H, W) or (n, C, H, W)
    n_neighbors : int, default=10
        Neighbours averaged with each image (``labels=None``; at most ``n - 1``).
    labels : array-like of shape (n,), optional
        Cluster of each image; None: one class average per image.
    group, max_rotation, n_rotations, max_translation, refine, image_shape, device, batch_size
        As in :func:`invariant_distances`.
    reflection : bool, default=False
        Also align mirror images (E(2)): a projection from the opposite direction is the
        mirror image of another particle.
    neighbor_search : {"auto", "exact", "shortlist"}, default="auto"
        As in :class:`~invariant_cluster.InvariantKNeighborsTransformer`.
    denoise : DihedralPCA, optional
        Search for the neighbours on a denoised copy (``labels=None`` only):
        :class:`~invariant_cluster.denoise.DihedralPCA`, fitted on ``X`` here unless it is
        fitted already. The alignments it finds (its shifts scaled by ``scale_``,
        ``max_translation`` divided by it for the search) then warp the ORIGINAL images, which
        are averaged. For noisy images: on 2,000 simulated cryo-EM projections of 63 x 63
        pixels, ``DihedralPCA(40, output_size=24)`` lifted the share of neighbours within 10
        degrees of viewing direction from 0.72 to 0.96 at SNR 4 and from 0.24 to 0.68 at SNR 1,
        in a third of the time (``benchmarks/bench_cryoem.py``). Clean images lose detail by it.
    center : bool, default=False
        Centre each image (its denoised copy, with ``denoise``) on its centre of mass before
        the search (``labels=None`` only); see :func:`aligned_neighbors`.
    ctf : invariant_cluster.ctf.CTF, optional
        Each image's contrast transfer function (single-channel images; from a RELION STAR
        file: :func:`invariant_cluster.ctf.read_star`). The search then runs on the
        phase-flipped images, and each average is the Wiener estimate
        ``sum_j C_j F(y_j) / (sum_j C_j^2 + 1 / snr_k)`` of the aligned images, ``C_j`` the CTF of
        image ``j`` turned with its alignment (:func:`invariant_cluster.ctf.wiener_average`),
        ``snr`` per frequency: an estimate of the projection without CTF.
    snr : None, "auto" or float, default=None
        The Wiener term of the averages (``labels=None`` and given: single-channel images):
        with the images' power spectrum, the noise measured on them (``"auto"``) or one image's
        signal-to-noise ratio gives the signal-to-noise ratio at each frequency
        (:func:`invariant_cluster.ctf.spectral_snr`). Without ``ctf`` it makes each average the
        Wiener estimate ``sum_j F(y_j) / (k + 1 / snr_k)`` instead of the plain mean. None:
        ``"auto"`` with ``ctf``, the plain mean without.
    rotation_center : {"auto", "geometric", "fourier"}, default="auto"
        Centre of rotations and mirrors (:mod:`invariant_cluster.transforms`' Convention):
        ``"fourier"``, the pixel ``(W // 2, H // 2)`` of cryo-EM particle stacks, or the
        geometric ``((W - 1) / 2, (H - 1) / 2)``; ``"auto"`` is ``"fourier"`` when ``ctf`` is
        given, else ``"geometric"``. It matters for even sizes only. With ``"fourier"`` the
        search (and ``denoise``'s fit) sees the images with one zero row and column appended.
    return_alignments : bool, default=False
        Also return the alignments: ``labels=None``: the neighbours' indices ``(n, k)`` and
        alignments ``(n, k, 3 or 4)`` (:func:`aligned_neighbors`); ``labels`` given: each
        image's alignment onto its class's average, ``(n, 3 or 4)``.

    Returns
    -------
    averages : ndarray or torch.Tensor
        ``labels=None``: the shape of ``X`` (row ``i`` is image ``i``'s class average);
        ``labels`` given: ``(n_labels, ...)``, one row or image per label. NumPy for NumPy
        input, torch (on ``device``) for torch input.
    indices, alignments : ndarray
        Only with ``return_alignments=True`` (``labels`` given: the alignments only).

    Notes
    -----
    With ``k`` neighbours that show the same object (same viewing direction) and independent
    noise, the average has ``k + 1`` times less noise variance; neighbours of another view
    blur it. ``benchmarks/bench_cryoem.py`` measures both kinds by their correlation with the
    clean images, against ASPIRE's class averages. Cost: one invariant kNN search (see
    :class:`~invariant_cluster.InvariantKNeighborsTransformer`) and ``n k`` warps.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.barycenters import class_averages
    >>> rng = np.random.default_rng(0)
    >>> clean = rng.random((2, 12, 12)).astype(np.float32)
    >>> X = np.concatenate([np.rot90(clean, k, axes=(1, 2)) for k in range(4)] * 5)  # 40
    >>> noisy = X + rng.normal(0, 0.5, X.shape).astype(np.float32)
    >>> avg = class_averages(noisy, n_neighbors=9, n_rotations=4, refine=False)
    >>> err_noisy, err_avg = np.abs(noisy - X).mean(), np.abs(avg - X).mean()
    >>> bool(err_avg < 0.5 * err_noisy)
    True
    """
    dev = resolve_device(device)
    is_numpy = not isinstance(X, torch.Tensor)
    Xt, shape, _ = to_images(X, name="X", image_shape=image_shape, device=dev, min_samples=2)
    n = Xt.shape[0]
    ndim = np.ndim(X) if is_numpy else X.ndim
    if labels is not None and denoise is not None:
        raise ValueError("denoise: only with labels=None (each image's class average); the "
                         "average of each cluster aligns all its members to one mean")
    if labels is not None and center:
        raise ValueError("center: only with labels=None (each image's class average)")
    ctf, rc = _check_ctf_options(ctf, snr, rotation_center, Xt)
    Xs = Xt if ctf is None else _phase_flipped(Xt, ctf)
    wiener = ctf is not None or snr is not None
    if wiener:
        from .ctf import spectral_snr

        # the Wiener term at each frequency
        reg = 1.0 / spectral_snr(Xt[:, 0], ctf, snr="auto" if snr is None else snr)
    Xp, Xs = pad_for_centre(Xt, rc), pad_for_centre(Xs, rc)  # the search's frame (Convention)
    h, w = Xt.shape[-2:]
    if labels is not None:
        lab = _check_labels(labels, n)
        grid = make_search_grid(group, max_rotation, n_rotations, max_translation, refine,
                                reflection, image_shape=tuple(Xs.shape[1:]))
        means = []
        params = torch.zeros((n, grid.n_params), dtype=Xt.dtype, device=dev)
        with torch.no_grad():
            for c in np.unique(lab):  # a loop over clusters, each batched over its members
                members = torch.as_tensor(np.flatnonzero(lab == c), device=dev)
                w_ = torch.full((len(members),), 1.0 / len(members), dtype=Xt.dtype, device=dev)
                mu, p, _ = invariant_mean_tensor(Xs[members], w_, grid, batch_size=batch_size)
                if wiener:
                    warped = fast_warp(Xp[members], p)[..., :h, :w]
                    mu = _ctf_corrected(warped[None, :, 0], _subset(ctf, members), p,
                                        reg)[0][None]
                means.append(mu[..., :h, :w])
                params[members] = p
        out = torch.stack(means)
        out_shape = (len(means), -1) if ndim == 2 else (len(means), *tuple(X.shape[1:]))
        extra = (params.cpu().numpy().astype(np.float64),)
    else:
        ind, tau = _aligned_neighbors(
            Xs, tuple(Xs.shape[1:]), n_neighbors, denoise=denoise, center=center, device=dev,
            max_translation=max_translation, group=group, max_rotation=max_rotation,
            n_rotations=n_rotations, refine=refine, reflection=reflection,
            batch_size=batch_size, neighbor_search=neighbor_search)
        if wiener:
            out = _one_step_ctf_average(Xp, ind, tau, ctf, reg, (h, w))
        else:
            out = _one_step_average(Xp, ind, tau, batch_size=batch_size)[..., :h, :w]
        out_shape = tuple(X.shape)
        extra = (ind, tau)
    out = out.reshape(out_shape)
    out = out.cpu().numpy() if is_numpy else out
    return (out, *extra) if return_alignments else out


def _check_ctf_options(ctf, snr, rotation_center, Xt):
    """``(ctf, rotation_center)`` checked, ``"auto"`` resolved."""
    from .ctf import _check_ctf, _check_snr

    if not (isinstance(rotation_center, str) and rotation_center == "auto"):
        check_rotation_center(rotation_center)
    if ctf is not None:
        _check_ctf(ctf, Xt.shape[0])
        if Xt.shape[1] != 1:
            raise ValueError(f"ctf: only for single-channel images, got {Xt.shape[1]} channels")
    if snr is not None:
        if not (isinstance(snr, str) and snr == "auto"):
            _check_snr(snr)
        if Xt.shape[1] != 1:
            raise ValueError(f"snr: only for single-channel images, got {Xt.shape[1]} channels")
    if rotation_center == "auto":
        rotation_center = "geometric" if ctf is None else "fourier"
    return ctf, rotation_center


def _phase_flipped(Xt, ctf):
    from .ctf import phase_flip

    return phase_flip(Xt[:, 0], ctf)[:, None]


def _subset(ctf, index):
    return None if ctf is None else ctf[torch.as_tensor(index).cpu().numpy()]


def _ctf_corrected(warped, ctf, params, reg):
    """Wiener estimates ``(b, H, W)`` of groups of aligned images ``warped`` ``(b, k, H, W)``
    whose CTFs are ``ctf`` (``b k`` images; None: no CTF) turned by their alignments
    ``params`` ``(b k, 3 or 4)``."""
    from .ctf import ctf_images, wiener_combine

    b, k, h, w = warped.shape
    if ctf is None:
        return wiener_combine(warped, warped.new_ones((b, k, 1, 1)), reg)
    C = ctf_images(ctf.warped(params.reshape(b * k, -1)), (h, w), dtype=warped.dtype,
                   device=warped.device, half=True)
    return wiener_combine(warped, C.reshape(b, k, *C.shape[-2:]), reg)


def _one_step_ctf_average(Xp, ind, tau, ctf, reg, shape):
    """:func:`_one_step_average` with each group combined by :func:`_ctf_corrected`: ``Xp``
    the (padded) original images ``(n, 1, H', W')``, the averages ``(n, 1, H, W)``."""
    n, dev = Xp.shape[0], Xp.device
    h, w = shape
    idx = torch.cat([torch.arange(n)[:, None], torch.as_tensor(ind)], 1)
    tau = torch.as_tensor(tau, dtype=Xp.dtype)
    params = torch.cat([torch.zeros_like(tau[:, :1]), tau], 1)
    k = idx.shape[1]
    # rows per block: the warped images, their spectra and CTFs, about 8 copies of b k H W
    step = int(max(1, min(n, 2 ** 25 // max(1, 8 * k * h * w))))
    out = []
    with torch.no_grad():
        for r in range(0, n, step):  # blocks of rows; each block batched over its pairs
            i, p = idx[r:r + step], params[r:r + step]
            warped = fast_warp(Xp[i.reshape(-1).to(dev)], p.reshape(-1, p.shape[-1]).to(dev))
            warped = warped[:, 0, :h, :w].reshape(len(i), k, h, w)
            out.append(_ctf_corrected(warped, _subset(ctf, i.reshape(-1)),
                                      p.reshape(-1, p.shape[-1]), reg))
    return torch.cat(out)[:, None]


def aligned_neighbors(X, n_neighbors=10, *, group="se2", max_rotation=180.0, n_rotations=36,
                      max_translation=0, refine=True, reflection=False, neighbor_search="auto",
                      denoise=None, center=False, ctf=None, rotation_center="auto",
                      image_shape=None, device="auto", batch_size=None):
    """Each image's invariant nearest neighbours and their alignments, optionally found on a
    denoised copy: the search of :func:`class_averages` (``labels=None``), without the average.

    Parameters
    ----------
    X : array-like or torch.Tensor of shape (n, n_features), (n, H, W) or (n, C, H, W)
    n_neighbors : int, default=10
        Neighbours per image (at most ``n - 1``; the image itself is not one).
    group, max_rotation, n_rotations, max_translation, refine, reflection, neighbor_search, \
image_shape, device, batch_size
        As in :func:`class_averages`.
    denoise : DihedralPCA, optional
        As in :func:`class_averages`: the search runs on the denoised copy, and the shifts it
        finds are returned in the pixels of ``X``.
    center : bool, default=False
        Before the search, shift each image (its denoised copy, with ``denoise``) so that the
        centre of mass of its positive part is at the image centre; ``max_translation`` is
        then the range searched around that. The alignments returned include both
        centrings, so they still map the original neighbour onto the original image. For
        objects off-centre by more than one wants to search (particles picked with offsets):
        on 2,000 simulated cryo-EM projections with offsets of +-2 px (SNR 4,
        ``DihedralPCA(40, output_size=24)``, ``benchmarks/bench_cryoem.py``) it lifted the
        share of neighbours within 10 degrees from 0.49 to 0.92, at no extra cost. The centre
        of a noisy image is itself noisy: on centred images at SNR 1/4 it lowered that share
        from 0.21 to 0.14.
    ctf : invariant_cluster.ctf.CTF, optional
        Each image's CTF: the search runs on the phase-flipped images.
    rotation_center : {"auto", "geometric", "fourier"}, default="auto"
        As in :func:`class_averages` (``"auto"``: ``"fourier"`` with ``ctf``, else
        ``"geometric"``); the alignments follow it.

    Returns
    -------
    indices : ndarray of shape (n, n_neighbors)
        Nearest first.
    alignments : ndarray of shape (n, n_neighbors, 3), or 4 with ``reflection=True``
        ``(angle in degrees, tx, ty[, mirror])`` warping neighbour ``indices[i, j]`` onto image
        ``i`` (the convention of :mod:`invariant_cluster.transforms`), shifts in the pixels of
        ``X``.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.barycenters import aligned_neighbors
    >>> rng = np.random.default_rng(0)
    >>> clean = rng.random((3, 12, 12)).astype(np.float32)
    >>> X = np.concatenate([np.rot90(clean, k, axes=(1, 2)) for k in range(4)])  # 12 images
    >>> ind, tau = aligned_neighbors(X, n_neighbors=3, n_rotations=4, refine=False)
    >>> bool((ind % 3 == np.arange(12)[:, None] % 3).all()), tau.shape
    (True, (12, 3, 3))
    """
    dev = resolve_device(device)
    Xt, _, _ = to_images(X, name="X", image_shape=image_shape, device=dev, min_samples=2)
    ctf, rc = _check_ctf_options(ctf, None, rotation_center, Xt)
    Xt = pad_for_centre(Xt if ctf is None else _phase_flipped(Xt, ctf), rc)
    return _aligned_neighbors(
        Xt, tuple(Xt.shape[1:]), n_neighbors, denoise=denoise, center=center, device=dev,
        max_translation=max_translation, group=group, max_rotation=max_rotation,
        n_rotations=n_rotations, refine=refine, reflection=reflection, batch_size=batch_size,
        neighbor_search=neighbor_search)


def _aligned_neighbors(Xt, shape, n_neighbors, *, denoise, center, device, max_translation,
                       **search_kw):
    """:func:`aligned_neighbors` on validated images ``Xt`` ``(n, C, H, W)`` (both public
    functions' checks of ``n_neighbors`` and ``center`` are here)."""
    from .kneighbors import InvariantKNeighborsTransformer

    n = Xt.shape[0]
    if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, numbers.Integral) \
            or not 1 <= n_neighbors < n:
        raise ValueError(f"n_neighbors: expected an int in [1, n_samples - 1 = {n - 1}], "
                         f"got {n_neighbors!r}")
    if not isinstance(center, (bool, np.bool_)):
        raise TypeError(f"center: expected a bool, got {type(center).__name__}")
    search, search_shape, scale = Xt.reshape(n, -1).cpu().numpy(), shape, 1.0
    if denoise is not None:
        pca = _fitted_denoiser(denoise, Xt)
        search = pca.transform(Xt.cpu().numpy())
        search_shape, scale = pca.image_shape_out_, pca.scale_
    offsets = None
    if center:
        search, offsets = _centred(search, search_shape)
    knn = InvariantKNeighborsTransformer(n_neighbors=int(n_neighbors),
                                         max_translation=max_translation / scale,
                                         image_shape=search_shape, device=device, **search_kw)
    _, ind, tau = knn.fit(search).kneighbors(return_alignments=True)
    if offsets is not None:
        # T_(0, d_i) T_tau T_(0, -d_j): un-centre the image, centre the neighbour
        zero = np.zeros((n, 1))
        to_i = np.concatenate([zero, offsets, zero], 1)[:, None]
        from_j = np.concatenate([zero, -offsets, zero], 1)[ind]
        full = compose_se2(np.broadcast_to(to_i, from_j.shape),
                           compose_se2(tau.astype(np.float64), from_j))
        tau = full[..., :tau.shape[-1]].astype(tau.dtype)  # (the mirror bit is kept as is)
    tau[..., 1:3] *= scale  # shifts on the denoised copy's pixels, in the input's
    return ind, tau


def _one_step_average(Xt, ind, tau, batch_size=None):
    """Each image of ``Xt`` ``(n, C, H, W)`` and its neighbours ``ind`` ``(n, k)``, warped onto
    it by ``tau`` ``(n, k, 3 or 4)``, averaged with equal weights (the image itself at the
    identity): the second half of :func:`class_averages`."""
    from .neighbors import aligned_weighted_sum

    n, dev = Xt.shape[0], Xt.device
    idx = torch.cat([torch.arange(n)[:, None], torch.as_tensor(ind)], 1).to(dev)
    tau = torch.as_tensor(tau, dtype=Xt.dtype, device=dev)
    params = torch.cat([torch.zeros_like(tau[:, :1]), tau], 1)
    W = torch.full(idx.shape, 1.0 / idx.shape[1], dtype=Xt.dtype, device=dev)
    with torch.no_grad():
        return aligned_weighted_sum(Xt, idx, params, W, batch_size=batch_size)


def _centred(flat: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray]:
    """Images (flat rows of ``shape`` ``(C, H, W)``) shifted so that the centre of mass of their
    positive part (channels summed) is at the image centre, and the ``(n, 2)`` offsets
    ``(dx, dy)`` of those centres from the image centre (an image with no positive value is
    left as it is)."""
    from .search.descriptors import _centres

    Z = torch.as_tensor(flat).reshape(-1, *shape)
    h, w = shape[-2:]
    d = _centres(Z, "mass") - torch.tensor(image_centre(h, w), dtype=Z.dtype)
    params = torch.cat([torch.zeros_like(d[:, :1]), -d], 1)
    with torch.no_grad():
        out = fast_warp(Z, params)
    return out.reshape(flat.shape).numpy(), d.double().numpy()


def _fitted_denoiser(denoise, Xt):
    """``denoise`` fitted on the images ``Xt`` ``(n, C, H, W)`` (a clone), or as given when it
    is fitted already."""
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    from .denoise import DihedralPCA

    if not isinstance(denoise, DihedralPCA):
        raise TypeError(f"denoise: expected None or a DihedralPCA, got {type(denoise).__name__}")
    try:
        check_is_fitted(denoise)
    except NotFittedError:
        return clone(denoise).fit(Xt.cpu().numpy())
    if tuple(denoise.image_shape_) != tuple(Xt.shape[1:]):
        raise ValueError(f"denoise: fitted on images of shape {tuple(denoise.image_shape_)}, "
                         f"got {tuple(Xt.shape[1:])}")
    return denoise
