"""Test images shared by the test modules."""

import numpy as np


def random_images(shape, seed=0, border=0):
    """Uniform random images; ``border`` dark pixels on every side (content never leaves)."""
    x = np.random.default_rng(seed).random(shape)
    if border:
        x[..., :border, :] = 0
        x[..., -border:, :] = 0
        x[..., :, :border] = 0
        x[..., :, -border:] = 0
    return x


def digit_images(digits):
    """One scikit-learn digit per class, upsampled 8 -> 12 px (bilinear) and padded to 16 x 16."""
    from scipy.ndimage import zoom

    from invariant_cluster.datasets import load_digits_images

    bunch = load_digits_images()
    out = []
    for d in digits:
        img = bunch.images[np.flatnonzero(bunch.target == d)[0]].astype(np.float64)
        out.append(np.pad(zoom(img, 1.5, order=1), 2))
    return np.stack(out)


def t_and_box():
    """Two 11 x 11 float32 shapes with no rotational symmetry between them: a "T" and the
    outline of a box (the exact-copies example of issue 19)."""
    t = np.zeros((11, 11), np.float32)
    t[2:9, 5] = 1
    t[2, 3:8] = 1
    box = np.zeros((11, 11), np.float32)
    box[3:8, 3:8] = 1
    box[4:7, 4:7] = 0
    return t, box
