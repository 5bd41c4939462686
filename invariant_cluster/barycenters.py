"""Averaging under alignment, the public face: the weighted invariant mean of a set of images
(:func:`invariant_mean`, the algorithm in ``_means``) and class averages
(:func:`class_averages`, :func:`aligned_neighbors`), which compose the invariant kNN
transformer and the denoiser, so this module sits with the estimators, above them."""

from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

from ._estimator import shift_params
from ._heap import reusing_heap
from ._means import invariant_mean, invariant_mean_tensor
from ._utils import resolve_device
from .alignment import to_images
from .ctf import (
    CTF_GROUPS,
    _check_ctf,
    _check_max_groups,
    _check_snr,
    cross_ctf_filters,
    ctf_groups,
    ctf_images,
    phase_flip,
    spectral_snr,
    wiener_combine,
)
from .denoise import DihedralPCA
from .kneighbors import InvariantKNeighborsTransformer
from .neighbors import aligned_weighted_sum
from .search import candidate_search, make_search_grid, make_search_plan, refine_pairs
from .search.descriptors import centred_images, shifted_images
from .search.shortlist import _shortlist_of
from .transforms import (
    centre_padding,
    check_rotation_center,
    compose_se2,
    fast_warp,
    pad_for_centre,
)

__all__ = ["invariant_mean", "class_averages", "aligned_neighbors"]

# The search across CTF groups, shortlisted: of each image's candidates aligned on the grid
# with the groups' filters, the nearest this many per neighbour are refined (refine=True).
REFINE_POOL_PER_NEIGHBOR = 2


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
                   neighbor_search="auto", denoise=None, center=False, ctf=None,
                   ctf_groups=CTF_GROUPS, snr=None, rotation_center="auto", image_shape=None,
                   device="auto", batch_size=None, return_alignments=False):
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
        ``DihedralPCA("auto", output_size=32)`` keeps as many directions as stand above the
        noise: with a CTF it found better neighbours than 40 directions at SNR 4 to 1/4 and
        worse at 1/16 (``benchmarks/results/cryoem.json`` run ``ctf``).
    center : bool, default=False
        Centre each image (its denoised copy, with ``denoise``) on its centre of mass before
        the search (``labels=None`` only); see :func:`aligned_neighbors`.
    ctf : invariant_cluster.ctf.CTF, optional
        Each image's contrast transfer function (single-channel images; from a RELION STAR
        file: :func:`invariant_cluster.ctf.read_star`). The search then runs on the
        phase-flipped images compared across CTF groups (``ctf_groups``), and each average is
        the Wiener estimate
        ``sum_j C_j F(y_j) / (sum_j C_j^2 + 1 / snr_k)`` of the aligned images, ``C_j`` the CTF of
        image ``j`` turned with its alignment (:func:`invariant_cluster.ctf.wiener_average`),
        ``snr`` per frequency: an estimate of the projection without CTF.
    ctf_groups : int, default=4
        With ``ctf``: the images are put in at most this many groups of similar defocus
        (:func:`invariant_cluster.ctf.ctf_groups`), and the images of two groups ``g`` and
        ``h`` are compared filtered by ``|C_h|`` and ``|C_g|`` respectively (whitened,
        :func:`invariant_cluster.ctf.cross_ctf_filters`), so that two images of one view under
        different defoci match; phase-flipped images alone differ there by ``(|C_g| - |C_h|)
        p``, and the search prefers images of the image's own defocus. 1: the phase-flipped
        images alone. Where the search is shortlisted (``neighbor_search``), the descriptors of
        the phase-flipped images list each image's candidates once and only those are aligned
        with their groups' filters, one search per group; where it is exact, each pair of
        groups is one search, and the cost grows with the number of groups.
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
    cross = _cross_ctf(Xs, ctf, ctf_groups, rc)
    wiener = ctf is not None or snr is not None
    if wiener:
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
            batch_size=batch_size, neighbor_search=neighbor_search, cross=cross)
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
    return phase_flip(Xt[:, 0], ctf)[:, None]


def _cross_ctf(Xs, ctf, max_groups, rotation_center):
    """The search's comparison across CTF groups for the phase-flipped images ``Xs``
    ``(n, 1, H, W)`` (see :func:`_cross_ctf_neighbors`), or None: no ``ctf``, or one group
    (``max_groups`` checked either way)."""
    max_groups = _check_max_groups(max_groups)
    if ctf is None:
        return None
    groups, representatives = ctf_groups(ctf, max_groups)
    if len(representatives) == 1:
        return None
    filters = cross_ctf_filters(representatives, tuple(Xs.shape[-2:]), dtype=Xs.dtype,
                                device=Xs.device)
    return Xs, groups, filters, rotation_center


def _subset(ctf, index):
    return None if ctf is None else ctf[torch.as_tensor(index).cpu().numpy()]


def _ctf_corrected(warped, ctf, params, reg, C=None):
    """Wiener estimates ``(b, H, W)`` of groups of aligned images ``warped`` ``(b, k, H, W)``
    whose CTFs are ``ctf`` (``b k`` images; None: no CTF) turned by their alignments
    ``params`` ``(b k, 3 or 4)``; ``C``: those turned CTFs ``(b k, H, W // 2 + 1)`` if known."""
    b, k, h, w = warped.shape
    if ctf is None:
        return wiener_combine(warped, warped.new_ones((b, k, 1, 1)), reg)
    if C is None:
        C = ctf_images(ctf.warped(params.reshape(b * k, -1)), (h, w), dtype=warped.dtype,
                       device=warped.device, half=True)
    return wiener_combine(warped, C.reshape(b, k, *C.shape[-2:]), reg)


def _turned_ctfs(ctf, index, params, radial, shape, like):
    """The CTFs ``(m, H, W // 2 + 1)`` of images ``index`` ``(m,)`` turned by ``params``
    ``(m, 3 or 4)``: those without astigmatism (``radial``: the row of each image in
    ``radial[1]``, the CTFs ``(r, H, W // 2 + 1)`` of those images, or -1) are the same turned
    (a turn changes only the astigmatism's angle), the others are computed."""
    rows, values = radial
    at = torch.as_tensor(rows[index.cpu().numpy()], device=like.device)
    C = values[at.clamp(min=0)]
    turned = torch.nonzero(at < 0).flatten()
    if len(turned):
        sub = turned.cpu().numpy()
        C[turned] = ctf_images(_subset(ctf, index[sub]).warped(params[sub]), shape,
                               dtype=like.dtype, device=like.device, half=True)
    return C


def _one_step_ctf_average(Xp, ind, tau, ctf, reg, shape):
    """:func:`_one_step_average` with each group combined by :func:`_ctf_corrected`: ``Xp``
    the (padded) original images ``(n, 1, H', W')``, the averages ``(n, 1, H, W)``."""
    n, dev = Xp.shape[0], Xp.device
    h, w = shape
    idx = torch.cat([torch.arange(n)[:, None], torch.as_tensor(ind)], 1)
    tau = torch.as_tensor(tau, dtype=Xp.dtype)
    params = torch.cat([torch.zeros_like(tau[:, :1]), tau], 1)
    k = idx.shape[1]
    # the CTFs of the images without astigmatism, once: turned by any alignment they are the
    # same
    radial = None
    if ctf is not None:
        round_ = np.flatnonzero(np.asarray(ctf.defocus_u) == np.asarray(ctf.defocus_v))
        rows = np.full(n, -1, dtype=np.int64)
        rows[round_] = np.arange(len(round_))
        radial = (rows, ctf_images(ctf[round_], (h, w), dtype=Xp.dtype, device=dev, half=True)
                  if len(round_) else Xp.new_zeros((1, h, w // 2 + 1)))
    # rows per block: the warped images, their spectra and CTFs, about 8 copies of b k H W
    step = int(max(1, min(n, 2 ** 25 // max(1, 8 * k * h * w))))
    out = []
    with torch.no_grad():
        for r in range(0, n, step):  # blocks of rows; each block batched over its pairs
            i, p = idx[r:r + step], params[r:r + step]
            flat, pf = i.reshape(-1), p.reshape(-1, p.shape[-1])
            warped = fast_warp(Xp[flat.to(dev)], pf.to(dev))
            warped = warped[:, 0, :h, :w].reshape(len(i), k, h, w)
            C = None if ctf is None else _turned_ctfs(ctf, flat, pf, radial, (h, w), warped)
            out.append(_ctf_corrected(warped, ctf, pf, reg, C=C))
    return torch.cat(out)[:, None]


def aligned_neighbors(X, n_neighbors=10, *, group="se2", max_rotation=180.0, n_rotations=36,
                      max_translation=0, refine=True, reflection=False, neighbor_search="auto",
                      denoise=None, center=False, ctf=None, ctf_groups=CTF_GROUPS,
                      rotation_center="auto", image_shape=None, device="auto", batch_size=None):
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
        Each image's CTF: the search runs on the phase-flipped images, compared across CTF
        groups.
    ctf_groups : int, default=4
        As in :func:`class_averages`.
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
    Xs = Xt if ctf is None else _phase_flipped(Xt, ctf)
    cross = _cross_ctf(Xs, ctf, ctf_groups, rc)
    Xt = pad_for_centre(Xs, rc)
    return _aligned_neighbors(
        Xt, tuple(Xt.shape[1:]), n_neighbors, denoise=denoise, center=center, device=dev,
        max_translation=max_translation, group=group, max_rotation=max_rotation,
        n_rotations=n_rotations, refine=refine, reflection=reflection, batch_size=batch_size,
        neighbor_search=neighbor_search, cross=cross)


def _aligned_neighbors(Xt, shape, n_neighbors, *, denoise, center, device, max_translation,
                       cross=None, **search_kw):
    """:func:`aligned_neighbors` on validated images ``Xt`` ``(n, C, H, W)`` (both public
    functions' checks of ``n_neighbors`` and ``center`` are here); ``cross``: compared across
    CTF groups (:func:`_cross_ctf_neighbors`; ``Xt`` then only fits ``denoise``)."""
    n = Xt.shape[0]
    if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, numbers.Integral) \
            or not 1 <= n_neighbors < n:
        raise ValueError(f"n_neighbors: expected an int in [1, n_samples - 1 = {n - 1}], "
                         f"got {n_neighbors!r}")
    if not isinstance(center, (bool, np.bool_)):
        raise TypeError(f"center: expected a bool, got {type(center).__name__}")
    pca = None if denoise is None else _fitted_denoiser(denoise, Xt)
    if cross is not None:
        return _cross_ctf_neighbors(cross, Xt, int(n_neighbors), pca, center=center,
                                    device=device, max_translation=max_translation, **search_kw)
    _, ind, tau = _search_copies(Xt, Xt, True, int(n_neighbors), pca, shape, center=center,
                                 device=device, max_translation=max_translation, **search_kw)
    return ind, tau


def _search_copies(Q, K, same, k, pca, shape, *, center, device, max_translation, offsets=None,
                   **search_kw):
    """``(dist, ind, tau)`` of the ``k`` invariant nearest images of ``K`` ``(m, C, H, W)`` to
    each of ``Q`` (``same``: ``Q`` is ``K``, each image not its own neighbour), searched on
    their ``pca`` copies (None: as they are); shifts in the pixels of the images given.
    ``offsets``: ``(d_q, d_k)``, each copy's centring offsets ``(dx, dy)`` in the search's
    pixels, applied instead of ``center``'s own (the alignments still map the images given)."""
    def copy(Y, d):
        if pca is None:
            flat, out_shape = Y.reshape(Y.shape[0], -1).cpu().numpy(), shape
        else:
            flat, out_shape = pca.transform(Y.cpu().numpy()), pca.image_shape_out_
        if d is not None:
            flat = shifted_images(flat, out_shape, d)
        return flat, out_shape

    d_q, d_k = (None, None) if offsets is None else offsets
    keys, search_shape = copy(K, d_k)
    scale = 1.0 if pca is None else pca.scale_
    # with center, the transformer centres the search images and gives alignments of them
    # as given (uncentred)
    knn = InvariantKNeighborsTransformer(n_neighbors=k, max_translation=max_translation / scale,
                                         image_shape=search_shape, device=device,
                                         center=bool(center) and offsets is None,
                                         **search_kw).fit(keys)
    dist, ind, tau = knn.kneighbors(None if same else copy(Q, d_q)[0], return_alignments=True)
    if offsets is not None:
        tau = _uncentred(tau, ind, d_q, d_k)
    tau[..., 1:3] *= scale  # shifts on the denoised copy's pixels, in the input's
    return dist, ind, tau


def _uncentred(tau, ind, d_q, d_k):
    """Alignments ``tau`` ``(n, k, 3 or 4)`` of centred copies (query ``i`` by its offset
    ``d_q[i]``, key ``ind[i, j]`` by ``d_k[ind[i, j]]``) as alignments of the images given:
    ``T_(0, d_i) T_tau T_(0, -d_j)``, as the transformer composes its own centring."""
    to_i = shift_params(d_q)[:, None]
    from_j = shift_params(-np.asarray(d_k))[ind]
    return compose_se2(np.broadcast_to(to_i, from_j.shape),
                       compose_se2(tau, from_j))[..., :tau.shape[-1]]


def _cross_ctf_neighbors(cross, padded, k, pca, *, center, device, max_translation, refine,
                         neighbor_search, **search_kw):
    """:func:`_aligned_neighbors` of phase-flipped images compared across CTF groups.

    The images of two groups ``g`` and ``h`` are compared filtered by ``filters[g, h]`` and
    ``filters[h, g]`` (:func:`~invariant_cluster.ctf.cross_ctf_filters`). Where the search plan
    of the images is exact (few images, or ``neighbor_search="exact"``), every pair of groups
    is searched (:func:`_cross_ctf_exhaustive`). Otherwise the rotation-steerable descriptors
    of the phase-flipped images shortlist the plan's candidates for each image, as the search
    of the phase-flipped images alone does, and only those pairs are aligned on the grid with
    their groups' filters (:func:`~invariant_cluster.search.candidate_search`, one search per
    group of queries), refined where ``refine`` asks, and ranked: one search instead of one per
    pair of groups. ``cross``: ``(flipped, groups, filters, rotation_center)``, the
    phase-flipped images ``(n, 1, H, W)`` before the rotation centre's padding, each one's
    group, the filters; ``padded``: the same images padded (the search's frame). With
    ``center``, each image is centred by the centre of mass of its phase-flipped copy, the same
    in every comparison (a filtered copy's own centre depends on the filter).
    """
    flipped, groups, filters, rc = cross
    n, (h, w) = flipped.shape[0], flipped.shape[-2:]
    n_groups = filters.shape[0]
    shape = tuple(padded.shape[1:])
    search_shape = shape if pca is None else tuple(pca.image_shape_out_)
    scale = 1.0 if pca is None else pca.scale_
    grid = make_search_grid(search_kw["group"], search_kw["max_rotation"],
                            search_kw["n_rotations"], max_translation / scale, refine,
                            search_kw["reflection"], image_shape=search_shape)
    plan = make_search_plan(n, n, grid.size, k, device=device, method=neighbor_search,
                            purpose="graph", self_search=True)
    if plan.method == "exact":
        return _cross_ctf_exhaustive(cross, padded, k, pca, center=center, device=device,
                                     max_translation=max_translation, refine=refine,
                                     neighbor_search=neighbor_search, **search_kw)

    def copies(Y):
        """The search's copies (flat NumPy rows) of images ``Y`` ``(m, 1, H', W')``."""
        return Y.reshape(Y.shape[0], -1).cpu().numpy() if pca is None else pca.transform(
            Y.cpu().numpy())

    base = copies(padded)
    d = centred_images(base, search_shape)[1] if center else None
    if d is not None:
        base = shifted_images(base, search_shape, d)
    # the candidates: the descriptor shortlist of the phase-flipped copies
    Xc = torch.as_tensor(base, device=device).reshape(-1, *search_shape)
    cand = _shortlist_of(Xc, Xc, grid, plan.n_candidates, torch.arange(n, device=device),
                         "steerable", plan.approximate).cpu().numpy()
    del Xc, base
    c = cand.shape[1]
    spectra = torch.fft.rfft2(flipped[:, 0])
    lab = torch.as_tensor(groups, device=spectra.device)

    def filtered(rows, filt):
        """The search's copies ``(m, *search_shape)`` of images ``rows`` filtered by ``filt``
        (one filter, or one per row), centred by their offsets."""
        rows = torch.as_tensor(rows, device=spectra.device)
        Y = pad_for_centre(torch.fft.irfft2(spectra[rows] * filt, s=(h, w))[:, None], rc)
        flat = copies(Y)
        if d is not None:
            flat = shifted_images(flat, search_shape, d[rows.cpu().numpy()])
        return torch.as_tensor(flat, device=device).reshape(-1, *search_shape)

    pool = min(c, REFINE_POOL_PER_NEIGHBOR * k)
    dist = np.full((n, k), np.inf)
    ind = np.zeros((n, k), dtype=np.int64)
    tau = np.zeros((n, k, grid.n_params))
    with torch.no_grad():
        for g in range(n_groups):  # query groups; each batched over its images and all keys
            q = np.flatnonzero(groups == g)
            if len(q) == 0:
                continue
            # every image j as a key of group g's queries: filtered by filters[h_j, g]
            keys = filtered(np.arange(n), filters[lab, g])
            # each query once per key group hh (filtered by filters[g, hh]), listing its
            # candidates of that group, padded with its own index (left out: never computed)
            queries = torch.cat([filtered(q, filters[g, hh]) for hh in range(n_groups)])
            cq = cand[q]
            cg = groups[cq]
            counts = np.stack([(cg == hh).sum(1) for hh in range(n_groups)], 1)
            width = max(1, int(counts.max()))
            order = np.argsort(cg, axis=1, kind="stable")
            cg_sorted = np.take_along_axis(cg, order, 1)
            starts = np.cumsum(counts, 1) - counts
            slot = np.arange(cq.shape[1])[None] - np.take_along_axis(starts, cg_sorted, 1)
            lists = np.broadcast_to(q[None, :, None], (n_groups, len(q), width)).copy()
            rows = np.broadcast_to(np.arange(len(q))[:, None], cq.shape)
            lists[cg_sorted, rows, slot] = np.take_along_axis(cq, order, 1)
            own = torch.as_tensor(np.tile(q, n_groups), device=device)
            dd, ii, pp = candidate_search(
                queries, keys, torch.as_tensor(lists.reshape(-1, width), device=device), grid,
                batch_size=search_kw.get("batch_size"), exclude=own)
            # per query, its lists of all key groups, the pool nearest on the grid
            dd = dd.reshape(n_groups, len(q), width).transpose(0, 1).reshape(len(q), -1)
            ii = ii.reshape(n_groups, len(q), width).transpose(0, 1).reshape(len(q), -1)
            pp = pp.reshape(n_groups, len(q), width, -1).transpose(0, 1).reshape(
                len(q), n_groups * width, -1)
            kk = min(pool, dd.shape[1])
            top = torch.topk(dd, kk, dim=1, largest=False, sorted=True).indices
            dd, ii = dd.gather(1, top), ii.gather(1, top)
            pp = pp.gather(1, top[..., None].expand(-1, -1, pp.shape[-1]))
            if grid.refine and any(grid.free):
                real = torch.isfinite(dd)
                a = torch.arange(len(q), device=device)[:, None].expand_as(ii)
                qi = (lab.to(device)[ii] * len(q) + a)[real]
                dr, pr = refine_pairs(queries, keys, qi, ii[real], pp[real], grid)
                dd[real], pp[real] = dr, pr
            best = torch.argsort(dd, dim=1, stable=True)[:, :k]
            dist[q] = dd.gather(1, best).cpu().numpy()
            ind[q] = ii.gather(1, best).cpu().numpy()
            tau[q] = pp.gather(1, best[..., None].expand(-1, -1, pp.shape[-1])).cpu().numpy()
    if d is not None:
        tau = _uncentred(tau, ind, d, d)
    tau[..., 1:3] *= scale  # shifts on the denoised copy's pixels, in the input's
    return ind, tau


def _cross_ctf_exhaustive(cross, padded, k, pca, *, center, **search_kw):
    """:func:`_cross_ctf_neighbors` with every pair compared: for each pair of groups
    ``(g, h)``, the images of ``g`` filtered by ``filters[g, h]`` are searched
    among those of ``h`` filtered by ``filters[h, g]`` (:func:`~invariant_cluster.ctf.
    cross_ctf_filters`), and each image keeps the ``k`` nearest of all its groups' lists.
    ``cross``: ``(flipped, groups, filters, rotation_center)``, the phase-flipped images
    ``(n, 1, H, W)`` before the rotation centre's padding, each one's group, the filters;
    ``padded``: the same images padded (the search's frame). With ``center``, each image is
    centred by the centre of mass of its phase-flipped copy, the same in every pair of groups
    (a filtered copy's own centre depends on the filter)."""
    flipped, groups, filters, rc = cross
    n, (h, w) = flipped.shape[0], flipped.shape[-2:]
    spectra = torch.fft.rfft2(flipped[:, 0])
    n_groups = filters.shape[0]
    dist = np.full((n, n_groups * k), np.inf)
    ind = np.zeros((n, n_groups * k), dtype=np.int64)
    tau = None
    members = [np.flatnonzero(groups == g) for g in range(n_groups)]
    shape = tuple(padded.shape[1:])
    d = None
    if center:
        base = (padded.reshape(n, -1).cpu().numpy() if pca is None
                else pca.transform(padded.cpu().numpy()))
        d = centred_images(base, shape if pca is None else pca.image_shape_out_)[1]

    def filtered(rows, filt):
        rows = torch.as_tensor(rows, device=spectra.device)
        return pad_for_centre(torch.fft.irfft2(spectra[rows] * filt, s=(h, w))[:, None], rc)

    for g, q in enumerate(members):
        for g2, keys in enumerate(members):
            kk = min(k, len(keys) - int(g == g2))
            if len(q) == 0 or kk < 1:
                continue
            K = filtered(keys, filters[g2, g])
            Q = K if g == g2 else filtered(q, filters[g, g2])
            dd, i, t = _search_copies(Q, K, g == g2, kk, pca, shape, center=False,
                                      offsets=None if d is None else (d[q], d[keys]),
                                      **search_kw)
            if tau is None:
                tau = np.zeros((n, n_groups * k, t.shape[-1]), dtype=t.dtype)
            cols = slice(g2 * k, g2 * k + kk)
            dist[q, cols], ind[q, cols], tau[q, cols] = dd, keys[i], t
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return (np.take_along_axis(ind, order, 1),
            np.take_along_axis(tau, order[..., None], 1))


def _one_step_average(Xt, ind, tau, batch_size=None):
    """Each image of ``Xt`` ``(n, C, H, W)`` and its neighbours ``ind`` ``(n, k)``, warped onto
    it by ``tau`` ``(n, k, 3 or 4)``, averaged with equal weights (the image itself at the
    identity): the second half of :func:`class_averages`."""
    n, dev = Xt.shape[0], Xt.device
    idx = torch.cat([torch.arange(n)[:, None], torch.as_tensor(ind)], 1).to(dev)
    tau = torch.as_tensor(tau, dtype=Xt.dtype, device=dev)
    params = torch.cat([torch.zeros_like(tau[:, :1]), tau], 1)
    W = torch.full(idx.shape, 1.0 / idx.shape[1], dtype=Xt.dtype, device=dev)
    with torch.no_grad():
        return aligned_weighted_sum(Xt, idx, params, W, batch_size=batch_size)


def _fitted_denoiser(denoise, Xt):
    """``denoise`` fitted on the images ``Xt`` ``(n, C, H, W)`` (a clone), or as given when it
    is fitted already."""

    if not isinstance(denoise, DihedralPCA):
        raise TypeError(f"denoise: expected None or a DihedralPCA, got {type(denoise).__name__}")
    try:
        check_is_fitted(denoise)
    except NotFittedError:
        return clone(denoise).fit(Xt.cpu().numpy())
    fitted, frame = tuple(denoise.image_shape_), tuple(Xt.shape[1:])
    if fitted != frame:
        pad = (frame[1] - fitted[1], frame[2] - fitted[2])
        if fitted[0] == frame[0] and pad != (0, 0) \
                and pad == centre_padding(fitted[1], fitted[2], "fourier"):
            # Maintenance note: the search turns the images about the Fourier centre by
            # turning them about the geometric centre of the padded frame; a DihedralPCA
            # fitted on the unpadded box is symmetric about the box's own geometric centre,
            # half a pixel away, and its copies would not turn with the images.
            raise ValueError(
                f"denoise: fitted on images of shape {fitted}, but with rotation_center="
                f"'fourier' (the default with ctf) the search runs on them padded to {frame}, "
                f"a zero row and column appended so that its quarter turns and mirrors are "
                f"about the Fourier centre: pass denoise unfitted (it is then fitted on the "
                f"padded images) or fit it on the images padded so, "
                f"np.pad(X, ((0, 0), (0, {pad[0]}), (0, {pad[1]})))")
        raise ValueError(f"denoise: fitted on images of shape {fitted}, got {frame}")
    return denoise
