"""Invariant distances and alignments under SE(2): grid search by matrix products, then refinement.

The search for ``min_tau ||x - T_tau y||^2`` over all pairs is the whole cost of invariant
clustering, so it is organised as dense linear algebra, never as a Python loop over pairs:

1. every key ``y_j`` is warped once per grid angle (one batched warp, ``n_y x R`` images);
2. integer translations are moved onto the queries: each rotated key lives on a canvas with a
   margin of ``max |shift|`` pixels, and ``<x, T y> = <P_(m-t) x, Z>`` exactly, so each query is
   placed ``S`` times on a zero canvas (see :func:`shift_images`);
3. all inner products ``<S_-t x_i, R_r y_j>`` are ONE matrix product per block,
   ``(b S, F) @ (F, c R)``; with ``||S_t z||^2`` (the energy of ``z`` that stays in the frame,
   an ``(n_y, R, S)`` table) this gives every grid distance, and a min over ``(S, R)`` the best
   grid point of every pair;
4. the best grid point of each kept pair is refined continuously (angle and sub-pixel shift) by
   a few batched Levenberg-Marquardt steps on the warped image (analytic Jacobian from the image
   gradient, step accepted only when the residual drops).

Memory is bounded by blocks: keys are processed in chunks and queries in blocks whose score
matrix stays under a byte budget (``batch_size`` fixes the number of queries per block).

The engine lives in :mod:`invariant_cluster.search` (the block kernel, the searches, the
refinement). This module is a public layer over it, kept on purpose: it defines
:func:`invariant_distances` and re-exports the names a user of the alignment search needs
(``SearchGrid``, ``make_search_grid``, the grid limits), so that code written against the API
page does not depend on how the engine is organised inside.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from ._heap import reusing_heap
from ._utils import check_images, resolve_device, to_tensor, torch_dtype_for
from .search import (  # noqa: F401 - this public layer's names
    GROUPS,
    SearchGrid,
    all_pairs,
    grid_search,
    make_search_grid,
    refine_alignments,
    refine_pairs,
    rotation_limit,
    shift_energies,
    shift_images,
    shift_margin,
    translation_limit,
    warp_keys,
)
from .transforms import fast_warp  # noqa: F401 - importable from this layer

__all__ = ["invariant_distances", "SearchGrid", "make_search_grid", "rotation_limit",
           "translation_limit"]


# ----------------------------------------------------------------------------- public
def to_images(X, *, name, image_shape=None, device, min_samples=1):
    """Validate and convert to a ``(n, C, H, W)`` tensor on ``device``; also return the kind."""
    is_numpy = not isinstance(X, torch.Tensor)
    Xf, shape = check_images(X, name=name, image_shape=image_shape, min_samples=min_samples)
    t = to_tensor(Xf) if is_numpy else Xf
    dtype = torch_dtype_for(Xf)
    return t.to(device=device, dtype=dtype).reshape(-1, *shape), shape, is_numpy


@reusing_heap
def invariant_distances(X, Y=None, *, group="se2", max_rotation=180.0, n_rotations=36,
                        max_translation=0, refine=True, image_shape=None, device="auto",
                        batch_size=None, return_alignments=False, reflection=False):
    """Invariant squared distances ``D[i, j] = min_tau ||X_i - T_tau Y_j||^2``.

    Parameters
    ----------
    X : array-like or torch.Tensor of shape (n_x, n_features), (n_x, H, W) or (n_x, C, H, W)
        Query images (flat rows are folded with ``image_shape``).
    Y : same kinds as ``X``, optional
        Key images; None means ``X``.
    group : {"se2", "rotation", "translation", "none"}
        The transformations searched. "none" gives plain squared Euclidean distances.
    max_rotation : float, default=180.0
        Angles are searched within ``+-max_rotation`` degrees (180: the full circle).
    n_rotations : int, default=36
        Number of grid angles (see :func:`transforms.rotation_grid`; 0 is always on the grid).
        At most :func:`rotation_limit` (the angles the image size can tell apart, at least
        360); more get a ``ValueError``.
    max_translation : float, default=0
        Shifts are searched on the integer grid within ``+-max_translation`` pixels, then refined
        continuously within that bound. Values beyond :func:`translation_limit` (a little more
        than the image size) are capped there: larger shifts give the same distances.
    refine : bool, default=True
        Refine every pair's best grid point continuously (Levenberg-Marquardt on the warp).
    image_shape : tuple (H, W) or (C, H, W), optional
        How to fold flat rows; None means square single-channel images.
    device : {"auto", "cpu", "cuda", ...}, default="auto"
    batch_size : int, optional
        Queries per block of the grid search; None sizes blocks from a memory budget.
    return_alignments : bool, default=False
        Also return ``tau`` of shape ``(n_x, n_y, 3)``: the parameters (angle in degrees,
        tx, ty in pixels) that warp ``Y_j`` onto ``X_i``, so ``warp_se2(Y[j], tau[i, j])`` is the
        aligned image; ``(n_x, n_y, 4)`` with ``reflection=True``, the 4th column the mirror bit.
    reflection : bool, default=False
        Also search the mirrored keys (the group E(2): a horizontal flip about the image
        centre, before the rotation; see :mod:`invariant_cluster.transforms`), at twice the
        cost of the search.

    Returns
    -------
    D : ndarray or torch.Tensor of shape (n_x, n_y)
        NumPy for NumPy input (float64 for float64 input, else float32), torch (on ``device``)
        for torch input.
    tau : same kind, shape (n_x, n_y, 3) or (n_x, n_y, 4), only with ``return_alignments=True``

    Raises
    ------
    InsufficientMemoryError
        Before anything of the request's size is allocated, when the least the search needs
        does not fit in the device's memory; the message names what to lower
        (``n_rotations``/``max_translation``, or the number of images).

    Notes
    -----
    Cost: one batched warp of the keys per grid angle, and ``n_x n_y R S F`` multiply-adds in
    matrix products (``R`` angles, ``S`` integer shifts, ``F`` pixels), plus ``~8`` warps per pair
    when ``refine=True`` (the refinement of all ``n_x n_y`` pairs dominates for large inputs;
    :class:`InvariantAttentionClusterer` refines only the kept neighbours).
    Distances from the grid are computed as ``||x||^2 + ||T y||^2 - 2 <x, T y>`` (clamped at 0);
    refined ones directly from the residual. ``||T y||^2`` counts only what stays in the frame.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import invariant_distances
    >>> x = np.random.default_rng(0).random((1, 8, 8))
    >>> y = np.rot90(x, k=1, axes=(1, 2)).copy()       # a quarter turn
    >>> D = invariant_distances(x, y, group="rotation", n_rotations=4, refine=False)
    >>> bool(D[0, 0] < 1e-6)
    True
    >>> D, tau = invariant_distances(x, y[:, :, ::-1], group="rotation", n_rotations=4,
    ...                              refine=False, reflection=True, return_alignments=True)
    >>> bool(D[0, 0] < 1e-6), tau[0, 0, 3]                # a mirror image: the mirror bit
    (True, np.float64(1.0))
    """
    dev = resolve_device(device)
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, numbers.Integral)
                                   or batch_size < 1):
        raise ValueError(f"batch_size: expected None or an int >= 1, got {batch_size!r}")
    Xt, shape, is_numpy = to_images(X, name="X", image_shape=image_shape, device=dev)
    grid = make_search_grid(group, max_rotation, n_rotations, max_translation, refine,
                            reflection, image_shape=shape)
    if Y is None:
        Yt = Xt
    else:
        Yt, yshape, _ = to_images(Y, name="Y", image_shape=image_shape, device=dev)
        if yshape != shape:
            raise ValueError(f"Y: expected images of shape {shape} like X, got {yshape}")
        if Yt.dtype != Xt.dtype:
            Xt, Yt = Xt.double(), Yt.double()
    with torch.no_grad():
        D, P = all_pairs(Xt, Yt, grid, batch_size=batch_size)
    if is_numpy:
        D = D.cpu().numpy()
        P = P.cpu().numpy().astype(np.float64)
    return (D, P) if return_alignments else D
