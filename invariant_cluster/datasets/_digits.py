"""The offline default: scikit-learn's bundled digits as images in [0, 1]."""

from __future__ import annotations

import numpy as np
from sklearn.utils import Bunch


def load_digits_images(return_X_y=False):
    """scikit-learn's bundled handwritten digits as images in [0, 1] (works offline).

    1797 images of 8 x 8 pixels from the UCI "Optical Recognition of Handwritten Digits"
    data set, as :func:`sklearn.datasets.load_digits` ships them, with the grey levels 0..16
    scaled to [0, 1].

    Parameters
    ----------
    return_X_y : bool, default=False
        Return ``(data, target)`` instead of a Bunch.

    Returns
    -------
    bunch : :class:`sklearn.utils.Bunch`
        With ``data`` of shape (1797, 64) float32 in [0, 1]; ``images`` of shape
        (1797, 8, 8), a view of ``data``; ``target`` of shape (1797,) int64;
        ``target_names``; ``feature_names``; ``DESCR``.
    (data, target) : tuple
        If ``return_X_y`` is True.

    Examples
    --------
    >>> from invariant_cluster.datasets import load_digits_images
    >>> digits = load_digits_images()
    >>> digits.images.shape, digits.data.shape, digits.images.dtype
    ((1797, 8, 8), (1797, 64), dtype('float32'))
    >>> float(digits.data.min()), float(digits.data.max())
    (0.0, 1.0)
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    data = (digits.data / 16.0).astype(np.float32)
    target = digits.target.astype(np.int64)
    if return_X_y:
        return data, target
    return Bunch(
        data=data,
        images=data.reshape(-1, 8, 8),
        target=target,
        target_names=np.asarray(digits.target_names),
        feature_names=list(digits.feature_names),
        DESCR=digits.DESCR
        + "\n\ninvariant_cluster: pixel values are scaled from 0..16 to [0, 1] (float32).\n",
    )


