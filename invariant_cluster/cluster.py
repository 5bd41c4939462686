"""Invariant-attention clustering: attention with a max-over-transformations similarity.

``fit`` reads as the algorithm: search (the invariant kNN graph of the samples) -> bandwidth
(a per-sample calibration) -> iterate (invariant attention to a fixed point) -> group (the graph
of the converged means) -> centres (each cluster's invariant mean).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import time
import warnings

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from ._grouping import embed_and_cluster, graph_modes, two_hop_candidates
from ._utils import flatten_images, resolve_device, resolve_image_shape
from .alignment import (
    GROUPS,
    all_pairs,
    fast_warp,
    grid_search,
    make_search_grid,
    refine_alignments,
)
from .barycenters import invariant_mean_tensor

__all__ = ["InvariantAttentionClusterer", "invariant_attention_clustering"]

# neighbor_search="auto" searches exactly while n_samples x grid size stays below this (e.g.
# 4,000 samples with 36 angles and no shifts), and shortlists beyond.
_AUTO_EXACT_WORK = 4000 * 36
# Maintenance note: the calibrated scale sigma_i is capped at this fraction of rho_i (the
# distance to the nearest other sample). UMAP's calibration spreads log2(k + 1) of weight over
# the k neighbours whatever the data; when a cluster has fewer than about log2(k + 1) members
# the rest would come from other clusters. The cap keeps far neighbours (d >> rho_i) at a
# negligible weight; on MNIST it binds for few samples (median sigma_i / rho_i is about 0.12).
_SIGMA_CAP = 0.25
# The fixed-point iteration checks its convergence every this many steps (one host-device
# synchronisation per check, none in between).
_CHECK_EVERY = 10
# blurring update: the partition into modes must stay the same this many iterations in a row
_STABLE_ITERS = 3


@contextlib.contextmanager
def _thread_limit(n_jobs):
    """Limit torch's threads and the BLAS/OpenMP pools to ``n_jobs`` (None: leave them as set,
    e.g. by ``OMP_NUM_THREADS`` or threadpoolctl; negative: ``cpu_count + 1 + n_jobs``)."""
    if n_jobs is None:
        yield
        return
    import os

    from threadpoolctl import threadpool_limits

    n = int(n_jobs) if n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + int(n_jobs))
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        torch.set_num_threads(old)


class InvariantAttentionClusterer(ClusterMixin, TransformerMixin, BaseEstimator):
    """Cluster images invariantly to rotations and translations by iterated invariant attention.

    Every image attends to its invariant nearest neighbours with the invariant kernel (the
    neighbours ALIGNED onto it: ``T_tau*(x_i, x_j) x_j``) and moves to their weighted average,
    until a fixed point: each sample's invariant mean, a denoised version of it in its own pose.
    An invariant kNN graph (of the samples by default, or of the converged means) is then
    grouped into clusters, and each cluster's invariant mean is its centre.

    Parameters
    ----------
    n_clusters : int or None, default=None
        The grouping embeds the invariant kNN graph with umap-learn (10 dimensions,
        ``min_dist=0``), then an int runs k-means with ``n_clusters``; None runs HDBSCAN on the
        embedding (the modes of the embedded density; the smallest cluster holds 1% of the
        samples, at least 3; samples HDBSCAN calls noise join their nearest cluster).
    group : {"se2", "rotation", "translation", "none"}, default="se2"
        "none" is plain kernel attention (mean shift on pixels), the baseline.
    max_rotation : float, default=180.0
        Rotations searched within ``+-max_rotation`` degrees. The most sensitive choice: search
        only the range the data has. A full-circle search on upright digits confuses 6 and 9
        (ARI 0.62 against 0.79 for k-means on pixels, measured on unrotated MNIST with the
        first version of this estimator).
    n_rotations : int, default=36
        Grid angles (0 is always included).
    max_translation : float, default=0
        Shifts searched within ``+-max_translation`` pixels (integer grid).
    bandwidth : "auto" or float, default="auto"
        "auto": per sample, umap-learn's calibration on the invariant distances ``d_ij`` to
        the ``n_neighbors`` nearest samples: ``rho_i = d_i1`` (the nearest) and ``sigma_i``
        such that ``sum_j exp(-max(d_ij - rho_i, 0) / sigma_i) = log2(n_neighbors + 1)``,
        capped at ``0.25 rho_i`` so that a cluster smaller than the neighbourhood does not
        borrow weight from other clusters. The attention weight of key ``j`` (and of the
        sample itself, weight 1) is ``exp(-max(d - rho_i, 0) / sigma_i)``. A float is a global
        Gaussian ``sigma``: weights ``exp(-d^2 / (2 sigma^2))`` (plain mean shift).
    n_neighbors : int, default=15
        The other samples each sample attends to (and the kNN graph's degree); on data sets
        smaller than ``n_neighbors + 1`` all other samples are used. The calibrated bandwidth
        adapts to each sample's local scale, so a cluster may be smaller than the
        neighbourhood (the tests use groups of 3 and of 60 copies at the default).
    update : {"fixed", "blurring"}, default="fixed"
        "fixed": the keys stay at the samples (mean shift on each sample's aligned
        neighbourhood): a monotone ascent of a kernel density that converges by construction
        and never merges clusters. "blurring": the keys are the current means (attention
        applied again and again, Gaussian blurring mean shift); it stops when the partition
        into modes has not changed for 3 iterations (Carreira-Perpinan, 2006), before
        well-separated clusters merge.
    graph : {"samples", "means"}, default="samples"
        Which kNN graph is grouped. "samples": the invariant kNN graph of the samples. "means":
        the kNN graph of the converged means, searched among each sample's neighbours and
        their neighbours. The means' graph is purer (on 2,000 MNIST digits rotated within +-45
        degrees, 87.8% of its edges join two digits of the same class, against 84.0% for the
        samples' graph), but umap-learn and k-means group it worse (ACC 0.89-0.90 against
        0.90-0.92 over three seeds), presumably because the denoised means form tight islands
        that the embedding keeps apart. Hence the default; ``benchmarks/bench_clustering.py``
        reports the purity of both graphs.
    max_iter : int, default=300
    tol : float, default=1e-3
        "fixed": converged when the largest move of a mean relative to its bandwidth,
        ``max_i ||m_i(t+1) - m_i(t)|| / sigma_i``, is below ``tol``.
    refine : bool, default=True
        Refine continuously (angle and sub-pixel shift) the alignments of every sample onto its
        cluster centre and the distances of ``transform``/``predict``. The kNN searches use the
        grid only.
    image_shape : tuple (H, W) or (C, H, W), optional
        How to fold rows of ``X``; None: square if ``n_features`` is a perfect square, else a
        ``1 x n_features`` image.
    device : {"auto", "cpu", "cuda", ...}, default="auto"
    batch_size : int, optional
        Queries per block of the alignment search and rows per block of the iteration (None:
        from a memory budget).
    neighbor_search : {"auto", "exact", "shortlist"}, default="auto"
        How the samples' kNN graph is found. "exact": the grid search over all pairs
        (``O(n^2)``). "shortlist": an SE(2)-invariant descriptor shortlists ``n_candidates``
        keys per query and only those are aligned (:mod:`invariant_cluster.neighbors`).
        "auto": exact while ``n_samples x`` (grid size) is at most ``4000 x 36``.
    n_candidates : int, optional
        Shortlist length (None: ``max(4 n_neighbors, 64)``).
    client : dask.distributed.Client, optional
        Run the alignment searches block by block on a Dask cluster (identical results).
    n_jobs : int, optional
        Threads for torch and the BLAS/OpenMP pools during ``fit``/``predict``/``transform``
        (None: as set by ``OMP_NUM_THREADS`` or threadpoolctl; -1: all cores).
    random_state : int, RandomState instance or None
        Seeds umap-learn's layout and k-means' starts (``n_clusters`` given).
    verbose : int, default=0

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        Cluster of each sample, from the grouping of the kNN graph. ``predict(X_train)`` assigns
        each sample to its nearest centre instead, which differs for samples between two
        clusters (a centre is one image per cluster, the graph follows the data's shape): they
        agree on every sample of the test sets of transformed copies, and on 88% (n = 2,000) and
        84% (n = 5,000) of MNIST digits rotated within +-45 degrees
        (``benchmarks/bench_clustering.py`` reports it).
    cluster_centers_ : ndarray of shape (n_clusters_, n_features)
        Each cluster's invariant mean of its samples.
    n_clusters_ : int
    invariant_means_ : ndarray of shape (n_samples, n_features)
        Each sample's converged mean (in the sample's own pose).
    alignments_ : ndarray of shape (n_samples, 3)
        ``(angle, tx, ty)`` that warps each sample onto its cluster centre:
        ``warp_se2(x_i, alignments_[i])`` is close to ``cluster_centers_[labels_[i]]``.
    bandwidth_ : ndarray of shape (n_samples,)
        ``sigma_i`` (a global bandwidth repeated when ``bandwidth`` is a float).
    rho_ : ndarray of shape (n_samples,)
        Distance from each sample to its nearest other sample (0 for a global bandwidth).
    n_iter_ : int
        Iterations until convergence (``max_iter`` when it did not converge).
    history_ : list of float
        Largest relative move ``max_i ||m_i(t+1) - m_i(t)|| / sigma_i`` per iteration.
    neighbors_ : ndarray of shape (n_samples, n_neighbors + 1)
        The samples each sample attended to: itself first, then its invariant nearest
        neighbours, nearest first.
    attention_weights_ : ndarray of shape (n_samples, n_neighbors + 1)
        The last iteration's weights on them (rows sum to 1).
    n_features_in_ : int
    image_shape_ : tuple (C, H, W)

    Notes
    -----
    Cost: one invariant kNN search of the samples (``n^2 R S F`` multiply-adds in blocked matrix
    products for the exact search, ``R`` angles, ``S`` integer shifts, ``F`` pixels), ``n k``
    warps for the attention (done once for the fixed update), one search of the means over each
    sample's two-hop neighbourhood (``n (k + k^2)`` pairs), the embedding and k-means, and one
    invariant mean per cluster. Memory is ``O(n k)`` plus blocks: no ``n x n`` array.
    The calibration, its cap and the grouping are this library's choices; the paper is silent
    on them. What the iteration buys, measured (``benchmarks/bench_clustering.py``): the
    invariant means (denoised samples and the start of each centre) and a purer graph of the
    means; it does not raise the accuracy of the default grouping, which runs on the samples'
    graph (see ``graph``) and then equals the pipeline "invariant kNN -> umap-learn -> k-means"
    with the same seed.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import InvariantAttentionClusterer, warp_se2
    >>> rng = np.random.default_rng(0)
    >>> bar = np.zeros((11, 11), np.float32); bar[2:9, 5] = 1; bar[2, 3:8] = 1   # a "T"
    >>> box = np.zeros((11, 11), np.float32); box[3:8, 3:8] = 1; box[4:7, 4:7] = 0
    >>> angles = rng.uniform(-180, 180, 16)
    >>> params = np.c_[angles, np.zeros((16, 2))]
    >>> X = warp_se2(np.stack([bar] * 8 + [box] * 8), params)
    >>> est = InvariantAttentionClusterer().fit(X)
    >>> len(set(est.labels_[:8])), len(set(est.labels_[8:])), est.n_clusters_
    (1, 1, 2)
    """

    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "group": [StrOptions(set(GROUPS))],
        "max_rotation": [Interval(numbers.Real, 0, None, closed="left")],
        "n_rotations": [Interval(numbers.Integral, 1, None, closed="left")],
        "max_translation": [Interval(numbers.Real, 0, None, closed="left")],
        "bandwidth": [StrOptions({"auto"}), Interval(numbers.Real, 0, None, closed="neither")],
        "n_neighbors": [Interval(numbers.Integral, 1, None, closed="left")],
        "update": [StrOptions({"blurring", "fixed"})],
        "graph": [StrOptions({"samples", "means"})],
        "max_iter": [Interval(numbers.Integral, 0, None, closed="left")],
        "tol": [Interval(numbers.Real, 0, None, closed="left")],
        "refine": ["boolean"],
        "image_shape": [tuple, list, None],
        "device": [str, torch.device],
        "batch_size": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "neighbor_search": [StrOptions({"auto", "exact", "shortlist"})],
        "n_candidates": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "client": "no_validation",
        "n_jobs": [Interval(numbers.Integral, None, -1, closed="right"),
                   Interval(numbers.Integral, 1, None, closed="left"), None],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
    }

    def __init__(self, n_clusters=None, *, group="se2", max_rotation=180.0, n_rotations=36,
                 max_translation=0, bandwidth="auto", n_neighbors=15, update="fixed",
                 graph="samples", max_iter=300, tol=1e-3, refine=True, image_shape=None,
                 device="auto", batch_size=None, neighbor_search="auto", n_candidates=None,
                 client=None, n_jobs=None, random_state=None, verbose=0):
        self.n_clusters = n_clusters
        self.group = group
        self.max_rotation = max_rotation
        self.n_rotations = n_rotations
        self.max_translation = max_translation
        self.bandwidth = bandwidth
        self.n_neighbors = n_neighbors
        self.update = update
        self.graph = graph
        self.max_iter = max_iter
        self.tol = tol
        self.refine = refine
        self.image_shape = image_shape
        self.device = device
        self.batch_size = batch_size
        self.neighbor_search = neighbor_search
        self.n_candidates = n_candidates
        self.client = client
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ helpers
    def _grid(self, refine=False):
        return make_search_grid(self.group, self.max_rotation, self.n_rotations,
                                self.max_translation, refine and self.refine)

    def _validate(self, X, reset):
        X2, shape = flatten_images(X, self.image_shape)
        # integers (uint8 images) become float32; float64 stays float64
        X2 = validate_data(self, X2, reset=reset, dtype=[np.float32, np.float64],
                           ensure_min_samples=1 if not reset else 2)
        if reset:
            self.image_shape_ = shape or resolve_image_shape(X2.shape[1], self.image_shape)
        elif shape is not None and tuple(shape) != tuple(self.image_shape_):
            raise ValueError(
                f"X: expected images of shape {tuple(self.image_shape_)} as in fit, got {shape}"
            )
        return X2

    def _tensor(self, X2, device):
        dtype = torch.float64 if X2.dtype == np.float64 else torch.float32
        # a copy: the input may be read-only, and the fit must never write into it
        return torch.tensor(X2, dtype=dtype, device=device).reshape(-1, *self.image_shape_)

    def _log(self, msg):
        if self.verbose:
            print(f"[InvariantAttentionClusterer] {msg}", flush=True)

    # ------------------------------------------------------------------ fit
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Search, calibrate, iterate invariant attention to its fixed point, group, centre.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)
        y : Ignored

        Returns
        -------
        self : object
        """
        X2 = self._validate(X, reset=True)
        n = X2.shape[0]
        if self.n_clusters is not None and self.n_clusters > n:
            raise ValueError(
                f"n_clusters: expected at most n_samples={n}, got {self.n_clusters}"
            )
        dev = resolve_device(self.device)
        grid = self._grid()
        seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        k = int(min(self.n_neighbors, n - 1))
        t0 = time.perf_counter()
        with _thread_limit(self.n_jobs), torch.no_grad():
            Xt = self._tensor(X2, dev)
            exact = self.neighbor_search == "exact" or (
                self.neighbor_search == "auto" and n * grid.size <= _AUTO_EXACT_WORK)
            # 1. search: the invariant kNN graph of the samples (squared distances)
            D, idx, P = _knn(Xt, grid, k, exact, self.n_candidates, self.batch_size,
                             self.client)
            dist = D.clamp(min=0).sqrt()
            self._log(f"kNN graph ({'exact' if exact else 'shortlist'}, k={k}): "
                      f"{time.perf_counter() - t0:.1f} s")
            # 2. bandwidth
            rho, sigma = calibrate_bandwidth(dist, self.bandwidth)
            # 3. iterate
            if self.update == "fixed":
                M, W, history, converged = mean_shift(
                    Xt, idx, P, rho, sigma, self.bandwidth, max_iter=self.max_iter,
                    tol=self.tol, batch_size=self.batch_size)
            else:
                M, W, history, converged = blurring_mean_shift(
                    Xt, idx, P, rho, sigma, self.bandwidth, max_iter=self.max_iter,
                    tol=self.tol, batch_size=self.batch_size)
            self._log(f"{len(history)} iterations ({time.perf_counter() - t0:.1f} s)")
            # 4. group: umap-learn's embedding of a kNN graph, then k-means (or HDBSCAN)
            if self.graph == "means":  # the converged means' graph, searched within two hops
                Dg, idx_g, _ = _means_graph(M, idx, grid, k, self.batch_size, self.client)
            else:
                Dg, idx_g = D, idx
            dist_g = Dg.clamp(min=0).sqrt().cpu().numpy().astype(np.float64)
            labels = embed_and_cluster(idx_g.cpu().numpy(),
                                       np.where(np.isfinite(dist_g), dist_g, 0.0),
                                       self.n_clusters, seed)
            labels = _relabel_by_size(labels)
            self._log(f"{int(labels.max()) + 1} clusters ({time.perf_counter() - t0:.1f} s)")
            # 5. centres: each cluster's invariant mean, started at its densest converged mean
            centers, params = _cluster_means(Xt, M, labels, self._grid(refine=True),
                                             self.batch_size, Dg)
        if self.max_iter > 0 and not converged:
            warnings.warn(
                f"InvariantAttentionClusterer did not converge in max_iter={self.max_iter} "
                f"iterations (last relative move {history[-1]:.2e} > tol={self.tol}); "
                "increase max_iter or tol.",
                ConvergenceWarning,
                stacklevel=2,
            )
        np_dtype = X2.dtype
        self.labels_ = labels.astype(np.int64)
        self.n_clusters_ = int(labels.max()) + 1
        self.cluster_centers_ = centers.reshape(self.n_clusters_, -1).cpu().numpy().astype(
            np_dtype)
        self.invariant_means_ = M.reshape(n, -1).cpu().numpy().astype(np_dtype)
        self.alignments_ = params.cpu().numpy().astype(np.float64)
        self.bandwidth_ = sigma.cpu().numpy().astype(np.float64)
        self.rho_ = rho.cpu().numpy().astype(np.float64)
        self.neighbors_ = torch.cat(
            [torch.arange(n, device=idx.device)[:, None], idx], 1).cpu().numpy()
        self.attention_weights_ = W.cpu().numpy().astype(np.float64)
        self.history_ = [float(h) for h in history]
        self.n_iter_ = len(history)
        self._log(f"done: {self.n_clusters_} clusters in {time.perf_counter() - t0:.1f} s")
        return self

    def fit_predict(self, X, y=None):
        """Fit and return ``labels_``."""
        return self.fit(X).labels_

    # ------------------------------------------------------------------ predict / transform
    def _distances_to_centers(self, X):
        check_is_fitted(self)
        X2 = self._validate(X, reset=False)
        dev = resolve_device(self.device)
        with _thread_limit(self.n_jobs), torch.no_grad():
            Xt = self._tensor(X2.astype(self.cluster_centers_.dtype, copy=False), dev)
            C = self._tensor(self.cluster_centers_, dev)
            # the samples are warped onto the centres, as in alignments_
            D, _ = all_pairs(C, Xt, self._grid(refine=True), batch_size=self.batch_size)
        return D.T.cpu().numpy().astype(X2.dtype)

    def transform(self, X):
        """Invariant squared distances to the cluster centres, ``min_tau ||c - T_tau x||^2``.

        The sample is warped onto the centre (the direction of ``alignments_``), refined when
        ``refine=True``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)

        Returns
        -------
        D : ndarray of shape (n_samples, n_clusters_)
        """
        return self._distances_to_centers(X)

    def predict(self, X):
        """Index of the nearest cluster centre under the invariant distance of ``transform``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        return np.argmin(self._distances_to_centers(X), axis=1).astype(np.int64)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags


# ---------------------------------------------------------------------- algorithm pieces
def _knn(Xt, grid, k, exact, n_candidates, batch_size, client):
    """The ``k`` nearest other samples of every sample: ``(dist^2, index, params)``."""
    from .neighbors import blocked_grid_search, neighbor_search

    n = Xt.shape[0]
    own = torch.arange(n, device=Xt.device)
    if exact and client is None:
        return grid_search(Xt, Xt, grid, k=k, batch_size=batch_size, exclude=own)
    if exact:
        return blocked_grid_search(Xt, Xt, grid, k=k, batch_size=batch_size, client=client,
                                   exclude=own)
    return neighbor_search(Xt, Xt, grid, k=k, n_candidates=n_candidates, exclude=own,
                           client=client)


def _means_graph(M, idx, grid, k, batch_size, client):
    """The kNN graph of the means, searched among each sample's neighbours' neighbours."""
    from .neighbors import candidate_search

    n = M.shape[0]
    return candidate_search(M, M, two_hop_candidates(idx), grid, k=k, batch_size=batch_size,
                            exclude=torch.arange(n, device=M.device), client=client)


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


def attention_weights(d: torch.Tensor, rho: torch.Tensor, sigma: torch.Tensor, bandwidth):
    """Weights of keys at distances ``d`` (``(b, m)``, not squared), normalised per row."""
    if bandwidth == "auto":
        logits = -(d - rho[:, None]).clamp(min=0) / sigma[:, None]
    else:
        logits = -(d * d) / (2.0 * sigma[:, None] ** 2)
    return torch.softmax(logits, dim=1)


def _rows_per_block(n, k, n_features, element_size, batch_size, device):
    """Rows per block of the iteration: the ``(b, k + 1, F)`` aligned keys and a few copies."""
    from ._memory import block_elements

    if batch_size is not None:
        return int(batch_size)
    per_row = max(1, 4 * (k + 1) * n_features)
    return int(max(1, min(n, block_elements(device, element_size) // per_row)))


def _aligned_keys(keys, rows, idx, P):
    """``(b, k + 1, F)``: each row's own key, then its neighbours warped onto it."""
    b, k = idx.shape
    own = keys[rows].reshape(b, 1, -1)
    if k == 0:
        return own
    warped = fast_warp(keys[idx.reshape(-1)], P.reshape(-1, 3).to(keys.dtype))
    return torch.cat([own, warped.reshape(b, k, -1)], 1)


def mean_shift(Xt, idx, P, rho, sigma, bandwidth, *, max_iter, tol, batch_size=None):
    """Invariant attention with fixed keys, iterated to its fixed point (mean shift).

    Sample ``i`` attends to itself and to its neighbours aligned onto it, ``T_ij x_j``; its
    mean moves to ``m_i <- sum_j w_j(m_i) T_ij x_j``. The weights are a non-increasing function
    of ``||m_i - T_ij x_j||``, so each step is a monotone ascent of a kernel density over the
    aligned neighbourhood (the "shadow" kernel of Cheng, 1995): the means converge, and a mean
    never leaves the convex hull of its own neighbourhood. Rows are independent, so blocks of
    rows run to convergence one after the other, each with its aligned keys warped once.

    Returns ``(means, weights (n, k + 1), history, converged)``.
    """
    n, k = idx.shape
    nf = Xt[0].numel()
    rows_per = _rows_per_block(n, k, nf, Xt.element_size(), batch_size, Xt.device)
    M = Xt.reshape(n, nf).clone()
    W = Xt.new_zeros((n, k + 1))
    moves = Xt.new_zeros(max(max_iter, 1))
    done = 0
    for r0 in range(0, n, rows_per):
        rows = torch.arange(r0, min(n, r0 + rows_per), device=Xt.device)
        keys = _aligned_keys(Xt, rows, idx[rows], P[rows])
        # ||m - key||^2 = ||m||^2 - 2 <m, key> + ||key||^2: one batched product per step
        ksq = (keys * keys).sum(2)
        m = keys[:, 0].clone()
        s, r = sigma[rows], rho[rows]
        # rows still moving: at each check, the rows whose last step was below tol are done
        # and leave the batch (they keep their mean), so late iterations cost little
        act = torch.arange(len(rows), device=Xt.device)
        ka, kq, sa, ra, ma = keys, ksq, s, r, m.clone()
        it = 0
        while it < max_iter:
            mk = torch.bmm(ka, ma[:, :, None])[..., 0]
            d = ((ma * ma).sum(1, keepdim=True) - 2.0 * mk + kq).clamp(min=0).sqrt()
            w = attention_weights(d, ra, sa, bandwidth)
            new = torch.bmm(w[:, None].to(ka.dtype), ka)[:, 0]
            step = torch.linalg.vector_norm(new - ma, dim=1) / sa
            moves[it] = torch.maximum(moves[it], step.max())
            ma = new
            it += 1
            if it % _CHECK_EVERY == 0:
                m[act] = ma
                keep = step >= tol
                if not bool(keep.any()):
                    break
                act, ka, kq, sa, ra, ma = (t[keep] for t in (act, ka, kq, sa, ra, ma))
        m[act] = ma
        d = torch.linalg.vector_norm(m[:, None] - keys, dim=2)
        W[rows] = attention_weights(d, r, s, bandwidth)
        M[rows] = m
        done = max(done, it)
    history = moves[:done].cpu().tolist()
    below = [t for t, h in enumerate(history) if h < tol]
    converged = bool(below) or max_iter == 0
    if below:  # the iteration at which every block had converged
        history = history[:below[0] + 1]
    return M.reshape(Xt.shape), W, history, converged


def blurring_mean_shift(Xt, idx, P, rho, sigma, bandwidth, *, max_iter, tol, batch_size=None):
    """Invariant attention with the current means as keys (Gaussian blurring mean shift) on
    the samples' kNN graph, stopped when the cluster structure stops changing.

    Maintenance note: blurring mean shift first collapses each cluster, then merges clusters
    slowly until one point is left, so "until the means stop moving" over-merges.
    Carreira-Perpinan (ICML 2006) stops when the clustering stops changing; here the partition
    into modes (connected components of means within ``rho_i + sigma_i`` along the graph) must
    stay the same for ``_STABLE_ITERS`` iterations in a row (one host synchronisation per
    iteration for that test), or the largest relative move fall below ``tol``.

    Returns ``(means, weights (n, k + 1), history, converged)``.
    """
    n, k = idx.shape
    nf = Xt[0].numel()
    rows_per = _rows_per_block(n, k, nf, Xt.element_size(), batch_size, Xt.device)
    M = Xt.clone()
    W = Xt.new_zeros((n, k + 1))
    history, converged, stable, previous = [], max_iter == 0, 0, None
    tol_modes = (rho + sigma).cpu().numpy()
    idx_np = idx.cpu().numpy()
    for _ in range(max_iter):
        new = torch.empty_like(M).reshape(n, nf)
        edge = Xt.new_zeros((n, k))
        move = Xt.new_zeros(())
        for r0 in range(0, n, rows_per):
            rows = torch.arange(r0, min(n, r0 + rows_per), device=Xt.device)
            keys = _aligned_keys(M, rows, idx[rows], P[rows])
            d = torch.linalg.vector_norm(keys[:, :1] - keys, dim=2)
            w = attention_weights(d, rho[rows], sigma[rows], bandwidth)
            new[rows] = torch.bmm(w[:, None].to(keys.dtype), keys)[:, 0]
            W[rows] = w
            edge[rows] = d[:, 1:]
            move = torch.maximum(move, (torch.linalg.vector_norm(
                new[rows] - keys[:, 0], dim=1) / sigma[rows]).max())
        M = new.reshape(Xt.shape)
        history.append(float(move))
        labels = _relabel_by_size(graph_modes(idx_np, edge.cpu().numpy(), tol_modes))
        stable = stable + 1 if previous is not None and np.array_equal(labels, previous) else 0
        previous = labels
        if history[-1] < tol or stable >= _STABLE_ITERS - 1:
            converged = True
            break
    return M, W, history, converged


def _relabel_by_size(labels):
    """Labels 0..K-1 ordered by decreasing cluster size (ties: first occurrence)."""
    uniq, first, counts = np.unique(labels, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))
    mapping = np.empty(uniq.max() + 1, dtype=np.int64)
    mapping[uniq[order]] = np.arange(len(uniq))
    return mapping[labels]


def _cluster_means(Xt, M, labels, grid, batch_size, D_knn):
    """Each cluster's invariant mean of its samples, and each sample's alignment onto it.

    The fixed-point iteration of the invariant mean runs on the grid (three rounds, started at
    the cluster's densest converged mean); then two rounds with the continuous refinement
    (``grid.refine``, about 20 warps per sample and round), the centre being the average of the
    members warped with the refined alignments.
    """
    from dataclasses import replace

    coarse = replace(grid, refine=False)
    n_clusters = int(labels.max()) + 1
    centers = []
    params = torch.zeros((Xt.shape[0], 3), dtype=Xt.dtype, device=Xt.device)
    density = torch.nan_to_num(D_knn, posinf=0.0).mean(1)
    for c in range(n_clusters):  # a loop over clusters; each step is batched over its members
        members = torch.as_tensor(np.flatnonzero(labels == c), device=Xt.device)
        w = torch.full((len(members),), 1.0 / len(members), dtype=Xt.dtype, device=Xt.device)
        # start from the converged mean of the member in the densest place
        init = M[members[int(torch.argmin(density[members]))]]
        Xc = Xt[members]
        mu, p, _ = invariant_mean_tensor(Xc, w, coarse, init=init, max_iter=3, tol=1e-4,
                                         batch_size=batch_size)
        for _ in range(2 if grid.refine else 0):  # refined rounds of the same fixed point
            _, p = refine_alignments(mu.expand(len(members), *mu.shape), Xc, p, grid)
            mu = (w[:, None, None, None] * fast_warp(Xc, p)).sum(0)
        centers.append(mu)
        params[members] = p
    return torch.stack(centers), params


def invariant_attention_clustering(X, n_clusters=None, **params):
    """Function twin of :class:`InvariantAttentionClusterer`.

    Returns
    -------
    cluster_centers : ndarray of shape (n_clusters_, n_features)
    labels : ndarray of shape (n_samples,)

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import invariant_attention_clustering
    >>> X = np.zeros((6, 5, 5), np.float32); X[:3, 2, :] = 1; X[3:, 1:4, 1:4] = 1
    >>> centres, labels = invariant_attention_clustering(X, group="rotation", n_rotations=4)
    >>> centres.shape, len(set(labels[:3])), len(set(labels[3:]))
    ((2, 25), 1, 1)
    """
    est = InvariantAttentionClusterer(n_clusters=n_clusters, **params).fit(X)
    return est.cluster_centers_, est.labels_
