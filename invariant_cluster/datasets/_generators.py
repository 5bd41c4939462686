"""Makers of randomly rotated and translated (SE(2)) images."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from .._utils import as_array, check_images, torch_generator


def _check_range(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return value


def make_transformed(X, max_rotation=45.0, max_translation=0, image_shape=None,
                     random_state=None):
    """Apply a random rotation and translation (an SE(2) element) to each image.

    Image ``i`` is warped by :func:`~invariant_cluster.transforms.warp_se2` with
    ``params[i] = (angle, tx, ty)``: ``angle`` uniform in ``[-max_rotation, max_rotation]``
    degrees (counter-clockwise as displayed), ``tx`` and ``ty`` uniform in
    ``[-max_translation, max_translation]`` pixels (real numbers, bilinear interpolation, zero
    padding). See :mod:`invariant_cluster.transforms` for the convention.

    Parameters
    ----------
    X : array-like or torch.Tensor of shape (n, n_features), (n, H, W) or (n, C, H, W)
        The images. A 2-D input is folded with ``image_shape``.
    max_rotation : float, default=45.0
        Largest absolute angle, in degrees (180 for all orientations).
    max_translation : float, default=0
        Largest absolute shift along each axis, in pixels.
    image_shape : tuple (H, W) or (C, H, W), default=None
        How to fold a 2-D ``X``; None means square single-channel images (a non-square row
        is a 1 x n_features image).
    random_state : int, RandomState instance or None, default=None
        Seeds the draw. The angles depend only on ``random_state`` and ``max_rotation``, not
        on ``max_translation``.

    Returns
    -------
    X_transformed : ndarray or torch.Tensor
        Same shape as ``X``; NumPy in, NumPy out, torch in, torch out on the same device.
        Floating dtypes are kept; integer and boolean inputs give float32 (interpolated
        values are not integers). With ``max_rotation=0`` and ``max_translation=0`` it is a
        copy of ``X``.
    params : ndarray of shape (n, 3), float64
        The ``(angle, tx, ty)`` used: ``warp_se2(X_images, params)`` reproduces
        ``X_transformed`` (with ``X_images`` the images folded to (n, H, W) or (n, C, H, W)).

    Raises
    ------
    TypeError
        If ``X`` is not numeric or a range is not a real number.
    ValueError
        If ``X`` has the wrong number of dimensions, is empty or not finite, ``image_shape``
        does not fit, or a range is negative or infinite.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.datasets import load_digits_images, make_transformed
    >>> X = load_digits_images().images[:5]
    >>> X_rot, params = make_transformed(X, max_rotation=90, max_translation=1, random_state=0)
    >>> X_rot.shape, X_rot.dtype, params.shape
    ((5, 8, 8), dtype('float32'), (5, 3))
    >>> bool(np.all(np.abs(params[:, 0]) <= 90) and np.all(np.abs(params[:, 1:]) <= 1))
    True
    """
    from ..transforms import warp_se2

    max_rotation = _check_range(max_rotation, "max_rotation")
    max_translation = _check_range(max_translation, "max_translation")
    is_torch = isinstance(X, torch.Tensor)
    if not is_torch:
        X = as_array(X, "X")
    in_shape, in_dtype = tuple(X.shape), X.dtype
    # a warp squares nothing, so large values need no bound here
    flat, (c, h, w) = check_images(X, image_shape=image_shape, check_norms=False)
    n = flat.shape[0]

    gen = torch_generator(random_state)
    u = torch.rand((n, 3), generator=gen, dtype=torch.float64).numpy()
    scale = np.array([max_rotation, max_translation, max_translation])
    params = (2.0 * u - 1.0) * scale + 0.0  # "+ 0.0" turns -0.0 into 0.0

    if max_rotation == 0 and max_translation == 0:
        # warp_se2 by the identity is exact only up to round-off
        out = flat.clone() if is_torch else flat.copy()
    else:
        out = warp_se2(flat.reshape(n, c, h, w), params)
    out = out.reshape(in_shape)
    if is_torch:
        if in_dtype.is_floating_point:
            out = out.to(in_dtype)
    elif np.issubdtype(in_dtype, np.floating):
        out = out.astype(in_dtype, copy=False)
    return out, params


def make_transformed_copies(image, n_copies, *, max_rotation=180.0, max_translation=0,
                            random_state=None):
    """Randomly rotated and translated copies of one image (as in the paper's Figure 2).

    Parameters
    ----------
    image : array-like or torch.Tensor of shape (H, W) or (C, H, W)
    n_copies : int
        Number of copies, at least 1.
    max_rotation : float, default=180.0
        Largest absolute angle in degrees (180: all orientations).
    max_translation : float, default=0
        Largest absolute shift along each axis, in pixels.
    random_state : int, RandomState instance or None, default=None

    Returns
    -------
    copies : ndarray or torch.Tensor of shape (n_copies, H, W) or (n_copies, C, H, W)
        ``copies[i] = warp_se2(image[None], params[i])[0]``; dtype as in
        :func:`make_transformed`.
    params : ndarray of shape (n_copies, 3)
        The ``(angle in degrees, tx, ty in pixels)`` of each copy.

    Examples
    --------
    >>> from invariant_cluster.datasets import load_digits_images, make_transformed_copies
    >>> image = load_digits_images().images[0]
    >>> copies, params = make_transformed_copies(image, 6, random_state=0)
    >>> copies.shape, params.shape
    ((6, 8, 8), (6, 3))
    """
    if isinstance(n_copies, bool) or not isinstance(n_copies, numbers.Integral):
        raise TypeError(f"n_copies: expected an int, got {n_copies!r}")
    if n_copies < 1:
        raise ValueError(f"n_copies: expected at least 1, got {n_copies}")
    if isinstance(image, torch.Tensor):
        if image.ndim not in (2, 3):
            raise ValueError(f"image: expected shape (H, W) or (C, H, W), got {tuple(image.shape)}")
        X = image.unsqueeze(0).repeat(n_copies, *([1] * image.ndim))
    else:
        image = np.asarray(image)
        if image.ndim not in (2, 3):
            raise ValueError(f"image: expected shape (H, W) or (C, H, W), got {image.shape}")
        X = np.repeat(image[None], int(n_copies), axis=0)
    return make_transformed(X, max_rotation=max_rotation, max_translation=max_translation,
                            random_state=random_state)
