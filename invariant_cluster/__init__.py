"""invariant_cluster: clustering and analysing images under geometric transformations.

Two estimators with a scikit-learn API, built on PyTorch and kornia:

- :class:`InvariantAttentionClusterer` clusters images invariantly to SE(2) (rotations and
  translations) by iterating invariant attention until each cluster collapses onto its invariant
  mean; with ``group="none"`` it is plain kernel attention (Gaussian blurring mean shift).
- :class:`KernelPCAAttention` reads self-attention as kernel PCA of the keys, with the
  diagnostics that test that reading and RPC-Attention (Principal Attention Pursuit).

Public names are imported lazily so that ``import invariant_cluster`` (and the command line's
``--help``) does not pay for importing torch and kornia.
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "warp_se2": "invariant_cluster.transforms",
    "invariant_distances": "invariant_cluster.alignment",
    "invariant_mean": "invariant_cluster.barycenters",
    "class_averages": "invariant_cluster.barycenters",
    "aligned_neighbors": "invariant_cluster.barycenters",
    "DihedralPCA": "invariant_cluster.denoise",
    "RadialWiener": "invariant_cluster.denoise",
    "SteerableWiener": "invariant_cluster.steerable",
    "InvariantAttentionClusterer": "invariant_cluster.cluster",
    "invariant_attention_clustering": "invariant_cluster.cluster",
    "KernelPCAAttention": "invariant_cluster.decomposition",
    "InvariantKNeighborsTransformer": "invariant_cluster.kneighbors",
    "invariant_kneighbors_graph": "invariant_cluster.kneighbors",
}
_SUBMODULES = {"attention", "ctf", "diagnostics", "datasets", "plotting", "transforms", "alignment",
               "barycenters", "cluster", "denoise", "decomposition", "metrics", "neighbors",
               "kneighbors", "steerable"}

__all__ = sorted([*_LAZY, "attention", "ctf", "diagnostics", "datasets", "plotting", "metrics",
                  "neighbors", "__version__"])


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"invariant_cluster.{name}")
    raise AttributeError(f"module 'invariant_cluster' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
