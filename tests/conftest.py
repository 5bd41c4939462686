"""Shared fixtures: smooth test images and a small set of clearly different shapes."""

from __future__ import annotations

import numpy as np
import pytest


def _smooth_images(n: int, size: int, seed: int = 0, channels: int | None = None) -> np.ndarray:
    """``n`` smooth float64 images (sums of Gaussian blobs) that vanish towards the border.

    Smooth content makes bilinear warps nearly exact, and a dark border makes zero padding
    irrelevant: what sub-pixel and round-trip tests need.
    """
    rng = np.random.default_rng(seed)
    c = (size - 1) / 2.0
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    shape = (n,) if channels is None else (n, channels)
    out = np.zeros((*shape, size, size))
    for idx in np.ndindex(*shape):
        for _ in range(3):
            mx, my = c + rng.uniform(-0.2, 0.2, 2) * size
            s = rng.uniform(0.12, 0.2) * size
            out[idx] += rng.uniform(0.5, 1.0) * np.exp(-((xx - mx) ** 2 + (yy - my) ** 2)
                                                       / (2 * s * s))
    # fade to zero towards the frame (a radial window), keeping the middle untouched
    r = np.hypot(xx - c, yy - c) / (size / 2.0)
    return out * np.clip(1.5 - 1.5 * r, 0.0, 1.0) ** 2


@pytest.fixture
def smooth_images():
    """Factory ``smooth_images(n, size, seed=0, channels=None) -> float64 ndarray``."""
    return _smooth_images


def _shapes(size: int = 16) -> np.ndarray:
    """Four clearly different, asymmetric binary shapes, float64, ``(4, size, size)``.

    An "L", a "T", a "P"-like loop with a tail, and a diagonal "Z"-like stroke; none of them is
    invariant under a nontrivial rotation, and their pixel masses differ.
    """
    s = size
    out = np.zeros((4, s, s))
    a, b = s // 4, s - s // 4  # the shapes live in the central [a, b) window
    # "L": long vertical bar and a short foot to the right
    out[0, a:b, a + 1] = 1.0
    out[0, b - 1, a + 1:a + 5] = 1.0
    # "T": a bar across the top and a stem
    out[1, a, a:b] = 1.0
    out[1, a:b, s // 2] = 1.0
    # loop (a filled ring) with a tail
    out[2, a:a + 5, a:a + 5] = 1.0
    out[2, a + 1:a + 4, a + 1:a + 4] = 0.0
    out[2, a + 5:b, a] = 1.0
    # "Z"-like: top bar, diagonal, bottom bar, plus a dot that breaks the 180-degree symmetry
    out[3, a, a:b] = 1.0
    out[3, b - 1, a:b] = 1.0
    for i in range(b - a):
        out[3, a + i, b - 1 - i] = 1.0
    out[3, s // 2, a] = 1.0
    return out


@pytest.fixture
def shapes():
    """Factory ``shapes(size=16) -> (4, size, size)`` float64 binary images."""
    return _shapes


@pytest.fixture(scope="module")
def torch_single_thread():
    """One intra-op thread for the module, restored afterwards.

    The test images are tiny, so threading gains nothing, while on a shared, loaded machine an
    OpenMP barrier per small kernel made a 24 x 24 warp 50 times slower (23 ms instead of 0.4).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
