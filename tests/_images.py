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
