"""Shared fixtures: smooth test images, and one torch thread for small-tensor tests."""

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
