"""Attention weights on a kNN graph: the per-sample bandwidth calibration and the weights.

Shared by the iteration (:mod:`invariant_cluster._iteration`) and the grouping's fuzzy graph
(:mod:`invariant_cluster._grouping`), which both weigh a sample's neighbours the same way.
"""

from __future__ import annotations

import math

import torch

__all__ = ["calibrate_bandwidth", "attention_weights"]

# sigma_i is capped at this fraction of rho_i (the distance to the nearest other sample), so
# that a cluster smaller than the neighbourhood does not borrow weight from other clusters
# (docs/user_guide/convergence.rst, "What the estimator does").
_SIGMA_CAP = 0.25


def calibrate_bandwidth(dist: torch.Tensor, bandwidth="auto", n_steps: int = 64):
    """Per-sample ``(rho, sigma)`` from the distances to the ``k`` nearest other samples.

    ``dist``: ``(n, k)`` invariant distances (not squared), ascending, ``inf`` for missing
    neighbours. "auto": ``rho_i = dist[i, 0]`` and ``sigma_i`` solving
    ``sum_j exp(-max(dist_ij - rho_i, 0) / sigma_i) = log2(k + 1)`` by bisection (a fixed number
    of vectorised steps: no host synchronisation), capped at ``0.25 rho_i`` and floored at
    ``1e-3`` of the median positive ``rho``. A float: ``rho = 0``, ``sigma = bandwidth``.
    """
    n, k = dist.shape
    if bandwidth != "auto":
        return dist.new_zeros(n), dist.new_full((n,), float(bandwidth))
    if k == 0:  # one distinct image: nothing to calibrate on
        return dist.new_zeros(n), dist.new_ones(n)
    d = dist.double()
    finite = torch.isfinite(d)
    rho = torch.where(finite[:, 0], d[:, 0], torch.zeros_like(d[:, 0]))
    excess = torch.where(finite, (d - rho[:, None]).clamp(min=0), torch.full_like(d, math.inf))
    target = math.log2(k + 1)
    lo = torch.zeros(n, dtype=d.dtype, device=d.device)
    scale = excess[finite].mean() if bool(finite.any()) else d.new_tensor(1.0)
    hi = torch.full_like(lo, 1.0) * (scale * 1e3 + 1.0)
    for _ in range(n_steps):
        mid = 0.5 * (lo + hi)
        total = torch.exp(-excess / mid[:, None]).sum(1)
        too_wide = total > target
        hi = torch.where(too_wide, mid, hi)
        lo = torch.where(too_wide, lo, mid)
    sigma = 0.5 * (lo + hi)
    pos = rho[rho > 0]
    floor = 1e-3 * (pos.median() if pos.numel() else scale.clamp(min=1e-12))
    sigma = torch.maximum(torch.minimum(sigma, _SIGMA_CAP * rho), floor)
    return rho.to(dist.dtype), sigma.to(dist.dtype)


def attention_weights(d: torch.Tensor, rho: torch.Tensor, sigma: torch.Tensor, bandwidth,
                      log_counts=None):
    """Weights of keys at distances ``d`` (``(b, m)``, not squared), normalised per row;
    ``log_counts`` (``(b, m)``): the log of how many samples each key stands for."""
    if bandwidth == "auto":
        logits = -(d - rho[:, None]).clamp(min=0) / sigma[:, None]
    else:
        logits = -(d * d) / (2.0 * sigma[:, None] ** 2)
    if log_counts is not None:
        logits = logits + log_counts
    return torch.softmax(logits, dim=1)
