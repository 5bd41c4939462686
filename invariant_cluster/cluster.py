"""Invariant-attention clustering: attention with a max-over-transformations similarity."""

from __future__ import annotations

import math
import numbers
import time
import warnings

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from ._utils import resolve_device, resolve_image_shape, torch_generator
from .alignment import (
    GROUPS,
    all_pairs,
    fast_warp,
    grid_search,
    make_search_grid,
)
from .barycenters import invariant_mean_tensor
from .transforms import compose_se2

__all__ = ["InvariantAttentionClusterer", "invariant_attention_clustering"]

# Maintenance note: the "auto" bandwidth. sigma_i^2 = _AUTO_FACTOR * d_k(i), with d_k(i) the
# invariant squared distance from x_i to its n_neighbors-th nearest neighbour (not counting
# itself). The factor trades how far a sample reaches against how fast clusters collapse;
# benchmarks/bench_clustering.py --sweep shows the sensitivity.
_AUTO_FACTOR = 0.1
# Converged means closer than this times the smaller of their two sigma^2 are one mode (as
# scikit-learn's MeanShift merges modes within one bandwidth).
_MODE_EPS = 4.0
# Largest n for which the final linkage runs on every sample's mean (an n x n matrix).
_FULL_LINKAGE_MAX = 12000
# neighbor_search="auto" searches exactly while n_samples x grid size stays below this (e.g.
# 4,000 samples with 36 angles and no shifts), and shortlists beyond.
_AUTO_EXACT_WORK = 4000 * 36
# Clusters smaller than this fraction of the mean cluster size are stragglers in the final cut.
_MIN_CLUSTER_FRACTION = 0.1
# Contributions of an original to a mean below this weight are dropped.
_COEF_EPS = 1e-6


def _to_2d(X, image_shape):
    """Flatten ``(n, H, W)``/``(n, C, H, W)`` input; return ``(X2d, image_shape or None)``."""
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().numpy()
    if getattr(X, "ndim", 0) in (3, 4):
        shape = tuple(X.shape[1:]) if X.ndim == 4 else (1, *X.shape[1:])
        if image_shape is not None:
            shape = resolve_image_shape(math.prod(shape), image_shape)
        return np.asarray(X).reshape(X.shape[0], math.prod(X.shape[1:])), shape
    return X, None


class InvariantAttentionClusterer(ClusterMixin, TransformerMixin, BaseEstimator):
    """Cluster images invariantly to rotations and translations by iterated invariant attention.

    Every image attends to the others with the invariant kernel
    ``k(x, y) = max_tau exp(-||x - T_tau y||^2 / (2 sigma^2))`` and moves to the weighted
    average of their ALIGNED versions, ``x_i <- sum_j w_ij T_tau*(x_i, x_j) x_j`` (its own pose
    kept). Iterating collapses each cluster onto its invariant mean; clusters are then read off
    the converged means.

    Parameters
    ----------
    n_clusters : int or None, default=None
        None: clusters are the connected components of converged means closer than two
        bandwidths (``d_inv < 4 min(sigma_i^2, sigma_j^2)``).
        An int: average linkage on the invariant distance between the converged means, cut at
        ``n_clusters`` (every sample's mean is a point up to 12,000 samples; beyond, one
        representative per mode weighted by the mode's size). The all-pairs distances are
        exact while ``n_samples x`` (grid size) is at most ``3 x 4000 x 36``; beyond, only each
        mean's nearest means are known and the other pairs count as twice the largest known
        distance.
    group : {"se2", "rotation", "translation", "none"}, default="se2"
        "none" is plain kernel attention (Gaussian blurring mean shift), the baseline.
    max_rotation : float, default=180.0
        Rotations searched within ``+-max_rotation`` degrees.
    n_rotations : int, default=36
        Grid angles (0 is always included).
    max_translation : float, default=0
        Shifts searched within ``+-max_translation`` pixels (integer grid, then refined).
    bandwidth : "auto" or float, default="auto"
        "auto": a per-sample bandwidth ``sigma_i^2 = 0.1 * d_k(i)`` where ``d_k(i)`` is the
        invariant squared distance from sample ``i`` to its ``k``-th nearest neighbour (itself
        not counted), ``k = min(n_neighbors, (n_samples - 1) // 4)`` (at least 1), so that on
        small data sets the bandwidth stays inside a cluster. A float is a global ``sigma``
        (same units as the pixels).
    n_neighbors : int, default=32
        Only the ``n_neighbors`` nearest keys (the query itself included) carry weight.
    update : {"blurring", "fixed"}, default="blurring"
        "blurring": the keys are the current means (attention applied again and again);
        "fixed": the keys stay at the samples (mean shift).
    max_iter : int, default=50
    tol : float, default=1e-4
        Stop when the largest move of a mean, ``max_i ||m_i(t+1) - m_i(t)|| / sigma_i``
        (relative to its own bandwidth), is below ``tol``.
    refine : bool, default=True
        Refine the alignments continuously after the grid search.
    image_shape : tuple (H, W) or (C, H, W), optional
        How to fold rows of ``X``; None: square if ``n_features`` is a perfect square, else a
        ``1 x n_features`` image.
    device : {"auto", "cpu", "cuda", ...}, default="auto"
    batch_size : int, optional
        Queries per block of the alignment search (None: from a memory budget).
    neighbor_search : {"auto", "exact", "shortlist"}, default="auto"
        How each iteration finds the ``n_neighbors`` nearest keys of every mean. "exact": the
        grid search over all pairs (``O(n^2)``). "shortlist": an SE(2)-invariant descriptor
        shortlists ``n_candidates`` keys per query and only those are aligned exactly
        (:mod:`invariant_cluster.neighbors`; recall of the exact neighbours >= 0.95 measured on
        MNIST with the default). "auto": exact while ``n_samples x`` (grid size) is at most
        ``4000 x 36`` (e.g. 4,000 samples and 36 angles without shifts), shortlist beyond.
    n_candidates : int, optional
        Shortlist length (None: ``max(4 n_neighbors, 64)``).
    client : dask.distributed.Client, optional
        Run the alignment searches block by block on a Dask cluster (identical results); None
        also uses joblib's dask backend when it is active (see :mod:`invariant_cluster._dask`).
    random_state : int, RandomState instance or None
        Seeds the torch generator that breaks exact ties between equidistant keys (a jitter far
        below round-off); results are deterministic for a fixed value.
    verbose : int, default=0

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
    cluster_centers_ : ndarray of shape (n_clusters_, n_features)
        Each cluster's invariant mean of its samples.
    n_clusters_ : int
    invariant_means_ : ndarray of shape (n_samples, n_features)
        Each sample's converged mean (in the sample's own pose).
    alignments_ : ndarray of shape (n_samples, 3)
        ``(angle, tx, ty)`` that warps each sample onto its cluster centre.
    bandwidth_ : ndarray of shape (n_samples,)
        The ``sigma_i`` used for each sample.
    n_iter_ : int
    history_ : list of float
        Largest move per iteration, ``max_i ||m_i(t+1) - m_i(t)|| / sigma_i``.
    neighbors_ : ndarray of shape (n_samples, n_neighbors)
        The keys each sample attended to in the last iteration (its own index first).
    attention_weights_ : ndarray of shape (n_samples, n_neighbors)
        Their weights (rows sum to 1).
    n_features_in_ : int
    image_shape_ : tuple (C, H, W)

    Notes
    -----
    Cost per iteration: one grid search over all pairs (``n^2 R S F`` multiply-adds in blocked
    matrix products, ``R`` grid angles, ``S`` integer shifts, ``F`` pixels) and ``n k`` warps
    to gather the aligned neighbours. Memory is ``O(n k + block)``. The alignment of each pair
    is the grid optimum during the iterations; the continuous refinement (``refine=True``)
    is applied to the final alignments, distances and centres, where its precision is visible.
    The bandwidth rule, the mode tolerance and the final average linkage are this library's
    choices; the paper is silent on them. In one development run on MNIST (n = 2000, +-45
    degrees, the same converged means) average linkage on the means reached ACC 0.77, linking one
    representative per connected component 0.65 (components chain neighbouring digits) and
    complete linkage 0.44; ``benchmarks/bench_clustering.py`` measures the current default.

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
    >>> est = InvariantAttentionClusterer(n_clusters=2, n_neighbors=8).fit(X)
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
        "max_iter": [Interval(numbers.Integral, 0, None, closed="left")],
        "tol": [Interval(numbers.Real, 0, None, closed="left")],
        "refine": ["boolean"],
        "image_shape": [tuple, list, None],
        "device": [str, torch.device],
        "batch_size": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "neighbor_search": [StrOptions({"auto", "exact", "shortlist"})],
        "n_candidates": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "client": "no_validation",
        "random_state": ["random_state"],
        "verbose": ["verbose"],
    }

    def __init__(self, n_clusters=None, *, group="se2", max_rotation=180.0, n_rotations=36,
                 max_translation=0, bandwidth="auto", n_neighbors=32, update="blurring",
                 max_iter=50, tol=1e-4, refine=True, image_shape=None, device="auto",
                 batch_size=None, neighbor_search="auto", n_candidates=None, client=None,
                 random_state=None, verbose=0):
        self.n_clusters = n_clusters
        self.group = group
        self.max_rotation = max_rotation
        self.n_rotations = n_rotations
        self.max_translation = max_translation
        self.bandwidth = bandwidth
        self.n_neighbors = n_neighbors
        self.update = update
        self.max_iter = max_iter
        self.tol = tol
        self.refine = refine
        self.image_shape = image_shape
        self.device = device
        self.batch_size = batch_size
        self.neighbor_search = neighbor_search
        self.n_candidates = n_candidates
        self.client = client
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ helpers
    def _grid(self):
        return make_search_grid(self.group, self.max_rotation, self.n_rotations,
                                self.max_translation, self.refine)

    def _validate(self, X, reset):
        X2, shape = _to_2d(X, self.image_shape)
        X2 = validate_data(self, X2, reset=reset, dtype=[np.float64, np.float32],
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
        """Run invariant attention to convergence and form the clusters.

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
        gen = torch_generator(self.random_state)
        Xt = self._tensor(X2, dev)
        k = int(min(self.n_neighbors, n))
        t0 = time.perf_counter()
        with torch.no_grad():
            exact = self.neighbor_search == "exact" or (
                self.neighbor_search == "auto" and n * grid.size <= _AUTO_EXACT_WORK)
            search = _make_search(grid, self.batch_size, exact, self.n_candidates, self.client)
            result = _iterate(Xt, grid, search, k=k, bandwidth=self.bandwidth,
                              update=self.update, max_iter=self.max_iter, tol=self.tol,
                              generator=gen, log=self._log)
            M, sigma2, D, idx, W, history = result
            if self.update != "blurring":  # the last search had the samples as keys
                D, idx_m, _ = search(M, M, k)
            else:
                idx_m = idx
            labels, modes = _find_modes(M, D, idx_m, sigma2)
            self._log(f"{len(modes)} modes after {len(history)} iterations "
                      f"({time.perf_counter() - t0:.1f} s)")
            if self.n_clusters is not None:
                # the exact all-pairs distances of the means when affordable, else the kNN graph
                affordable = exact or n * grid.size <= _AUTO_EXACT_WORK * 3
                sparse = None if affordable else (D, idx_m)
                labels = _merge_modes(M, labels, modes, self.n_clusters, grid,
                                      self.batch_size, self._log, sparse=sparse)
            labels = _relabel_by_size(labels)
            centers, params = _cluster_means(Xt, M, labels, grid, self.batch_size, D)
        if self.max_iter > 0 and len(history) >= self.max_iter and history[-1] > self.tol:
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
        self.bandwidth_ = np.sqrt(sigma2.cpu().numpy().astype(np.float64))
        self.neighbors_ = idx.cpu().numpy()
        self.attention_weights_ = W.cpu().numpy().astype(np.float64)
        self.history_ = [float(h) for h in history]
        self.n_iter_ = len(history)
        self._log(f"done: {self.n_clusters_} clusters in {time.perf_counter() - t0:.1f} s")
        return self

    def fit_predict(self, X, y=None):
        """Fit and return ``labels_``."""
        return self.fit(X).labels_

    # ------------------------------------------------------------------ predict / transform
    def _distances_to_centers(self, X, return_alignments=False):
        check_is_fitted(self)
        X2 = self._validate(X, reset=False)
        dev = resolve_device(self.device)
        grid = self._grid()
        Xt = self._tensor(X2.astype(self.cluster_centers_.dtype, copy=False), dev)
        C = self._tensor(self.cluster_centers_, dev)
        with torch.no_grad():
            D, P = all_pairs(Xt, C, grid, batch_size=self.batch_size)
        D = D.cpu().numpy().astype(X2.dtype)
        return (D, P.cpu().numpy()) if return_alignments else D

    def transform(self, X):
        """Invariant squared distances to the cluster centres.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)

        Returns
        -------
        D : ndarray of shape (n_samples, n_clusters_)
        """
        return self._distances_to_centers(X)

    def predict(self, X):
        """Index of the nearest cluster centre under the invariant distance.

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
def _rms_scale(X: torch.Tensor) -> float:
    s = float(torch.sqrt((X.reshape(X.shape[0], -1) ** 2).sum(1).mean()))
    return s if s > 0 else 1.0


def _bandwidth_neighbor(n_neighbors: int, n: int) -> int:
    """Which neighbour sets the auto bandwidth: the n_neighbors-th, at most a quarter of the
    other samples, so that on small data sets the bandwidth stays inside a cluster."""
    return int(max(1, min(n_neighbors, (n - 1) // 4)))


def _bandwidth2(d_k: torch.Tensor, bandwidth) -> torch.Tensor:
    """Per-sample sigma^2 from the distances to the k-th neighbour, or a global value."""
    if bandwidth != "auto":
        return torch.full_like(d_k, float(bandwidth) ** 2)
    s2 = _AUTO_FACTOR * d_k
    pos = s2[s2 > 0]
    fallback = float(pos.median()) if pos.numel() else 1.0
    return torch.where(s2 > 0, s2, torch.full_like(s2, fallback))


def _softmax_weights(D: torch.Tensor, sigma2: torch.Tensor) -> torch.Tensor:
    return torch.softmax(-D / (2.0 * sigma2[:, None]), dim=1)


def _gather_aligned(keys: torch.Tensor, idx: torch.Tensor, params: torch.Tensor,
                    W: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """``sum_j W[i, j] warp(keys[idx[i, j]], params[i, j])`` for all i, in memory-bounded chunks."""
    n, k = idx.shape
    out = torch.empty((n, *keys.shape[1:]), dtype=keys.dtype, device=keys.device)
    rows = max(1, chunk // k)
    for r0 in range(0, n, rows):
        sl = slice(r0, r0 + rows)
        b = idx[sl].shape[0]
        p = params[sl].reshape(-1, 3)
        gathered = keys[idx[sl].reshape(-1)]
        # the identity needs no interpolation (plain kernel attention, or exact self-alignments)
        warped = fast_warp(gathered, p) if bool(p.any()) else gathered
        out[sl] = torch.bmm(W[sl].reshape(b, 1, k).to(keys.dtype),
                            warped.reshape(b, k, -1)).reshape(b, *keys.shape[1:])
    return out


class _ComposedMeans:
    """Means kept as weighted sums of warped ORIGINAL samples, never as warps of warps.

    Maintenance note: a blurring step ``m_i <- sum_j w_ij T_ij m_j`` applied to pixel arrays
    would re-interpolate every mean at every iteration, and bilinear interpolation blurs (about
    1/6 px^2 of variance per warp), so after 20 iterations all means are smooth blobs. Instead each
    mean is ``m_i = sum_l c_il T_(theta_il) x_l`` over at most ``L`` originals; a step composes the
    transformations (``T_ij T_theta_jl``), sums the coefficients of repeated originals
    (transformations averaged with those weights), keeps the ``L`` largest and renormalises.
    """

    def __init__(self, X: torch.Tensor, L: int):
        n = X.shape[0]
        self.X = X
        self.L = L
        dev = X.device
        self.src = torch.arange(n, device=dev)[:, None].repeat(1, L)
        self.coef = torch.zeros((n, L), dtype=X.dtype, device=dev)
        self.coef[:, 0] = 1.0
        self.theta = torch.zeros((n, L, 3), dtype=X.dtype, device=dev)

    def means(self, chunk: int = 16384) -> torch.Tensor:
        """The means, warping only the originals that carry weight."""
        X = self.X
        n = X.shape[0]
        r, l = torch.nonzero(self.coef > 0, as_tuple=True)
        out = torch.zeros((n, X[0].numel()), dtype=X.dtype, device=X.device)
        for e0 in range(0, r.shape[0], chunk):
            rr, ll = r[e0:e0 + chunk], l[e0:e0 + chunk]
            p = self.theta[rr, ll]
            imgs = X[self.src[rr, ll]]
            warped = fast_warp(imgs, p) if bool(p.any()) else imgs
            out.index_add_(0, rr, warped.reshape(rr.shape[0], -1) * self.coef[rr, ll, None])
        return out.reshape(X.shape)

    def step(self, idx: torch.Tensor, W: torch.Tensor, tau: torch.Tensor):
        n, k = idx.shape
        L = self.L
        coef = W[:, :, None] * self.coef[idx]  # (n, k, L)
        # contributions below _COEF_EPS are dropped (their mass is renormalised away)
        i, j, l = torch.nonzero(coef > _COEF_EPS, as_tuple=True)
        kj = idx[i, j]
        coef = coef[i, j, l]
        src = self.src[kj, l]
        theta = compose_se2(tau[i, j], self.theta[kj, l])
        rows = i
        # merge repeated (row, original) entries: coefficients add up, and the transformation
        # of the largest contribution is kept (averaging them would be wrong for symmetric
        # shapes, whose paths can differ by a symmetry of the image). One sort on a key that
        # orders by (row, original), then by decreasing coefficient (coefficients are <= 1).
        key = rows * n + src
        order = torch.argsort(key.double() + 0.5 * (1.0 - coef.double()))
        key = key[order]
        start = torch.ones_like(key, dtype=torch.bool)
        start[1:] = key[1:] != key[:-1]
        seg = torch.cumsum(start.long(), 0) - 1
        m = int(seg[-1]) + 1
        csum = torch.zeros(m, dtype=coef.dtype, device=coef.device).index_add_(0, seg,
                                                                              coef[order])
        heads = order[start]
        mtheta = theta[heads]
        mrow, msrc = rows[heads], src[heads]
        # keep the L largest coefficients of every row (row sums are 1, so csum <= 1)
        order = torch.argsort(mrow.double() + 0.5 * (1.0 - csum.double().clamp(max=1.0)))
        mrow, msrc, csum, mtheta = mrow[order], msrc[order], csum[order], mtheta[order]
        counts = torch.bincount(mrow, minlength=n)
        first = torch.cumsum(counts, 0) - counts
        rank = torch.arange(m, device=mrow.device) - first[mrow]
        sel = rank < L
        self.coef.zero_()
        self.src = torch.arange(n, device=idx.device)[:, None].repeat(1, L)
        self.theta.zero_()
        self.coef[mrow[sel], rank[sel]] = csum[sel]
        self.src[mrow[sel], rank[sel]] = msrc[sel]
        self.theta[mrow[sel], rank[sel]] = mtheta[sel]
        self.coef /= self.coef.sum(1, keepdim=True)


def _make_search(grid, batch_size, exact, n_candidates, client):
    """``search(queries, keys, k) -> (dist, index, params)``: the top-k invariant neighbours."""
    from .neighbors import blocked_grid_search, neighbor_search

    def search(Q, K, k):
        if exact and client is None:
            return grid_search(Q, K, grid, k=k, batch_size=batch_size)
        if exact:  # one dask task per block of queries, keys warped and sent once
            return blocked_grid_search(Q, K, grid, k=k, batch_size=batch_size, client=client)
        return neighbor_search(Q, K, grid, k=k, n_candidates=n_candidates, client=client)

    return search


def _iterate(Xt, grid, search, *, k, bandwidth, update, max_iter, tol, generator, log):
    """Invariant attention iterated to convergence.

    Returns ``(means, sigma2, D, idx, W, history)`` with ``D, idx, W`` the distances, keys and
    weights of the last search (queries the final means, keys the final keys).
    """
    n = Xt.shape[0]
    scale = _rms_scale(Xt)
    # tie-breaking jitter, far below round-off relative to real distances
    jitter = torch.rand((n,), generator=generator, dtype=torch.float64).to(Xt) * 1e-12
    M = Xt.clone()
    composed = _ComposedMeans(Xt, L=max(2 * k, 8)) if update == "blurring" else None
    history = []
    # the first search is also the bandwidth's: the n_neighbors nearest keys, self included
    k_bw = _bandwidth_neighbor(k, n)
    D, idx, P = search(M, Xt, max(k, k_bw + 1))
    # D[:, 0] is the sample itself, so D[:, k_bw] is its k_bw-th nearest other sample
    sigma2 = _bandwidth2(D[:, k_bw], bandwidth) + jitter * scale ** 2
    D, idx, P = D[:, :k], idx[:, :k], P[:, :k]
    W = _softmax_weights(D, sigma2)
    for it in range(max_iter):
        if composed is not None:
            composed.step(idx, W, P)
            new = composed.means()
        else:
            new = _gather_aligned(Xt, idx, P, W)
        move = float(((new - M).reshape(n, -1).norm(dim=1) / sigma2.sqrt()).max())
        M = new
        history.append(move)
        keys = M if update == "blurring" else Xt
        D, idx, P = search(M, keys, k)
        W = _softmax_weights(D, sigma2)
        log(f"iteration {it + 1}: largest relative move {move:.3e}")
        if move < tol:
            break
    return M, sigma2, D, idx, W, history


def _find_modes(M, D, nidx, sigma2):
    """Connected components of near-identical means (within ``_MODE_EPS sigma^2``).

    ``D, nidx``: the invariant distances from each mean to its nearest means.
    """
    n = M.shape[0]
    thr = _MODE_EPS * torch.minimum(sigma2[:, None], sigma2[nidx])
    rows, cols = torch.nonzero(D <= thr, as_tuple=True)
    i = rows.cpu().numpy()
    j = nidx[rows, cols].cpu().numpy()
    graph = coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    # one sort instead of a pass over all samples per mode (there can be thousands of modes)
    order = np.argsort(labels, kind="stable")
    modes = np.split(order, np.cumsum(np.bincount(labels))[:-1])
    return labels, modes


def _weighted_average_linkage(D: np.ndarray, sizes: np.ndarray, n_clusters: int) -> np.ndarray:
    """Size-weighted average linkage (UPGMA on weighted points) down to ``n_clusters``.

    The distance between two groups is the size-weighted mean of the distances between their
    modes, as if each mode's samples were all present.
    """
    m = D.shape[0]
    D = D.astype(np.float64).copy()
    np.fill_diagonal(D, np.inf)
    sizes = sizes.astype(np.float64).copy()
    members = [[i] for i in range(m)]
    alive = np.ones(m, dtype=bool)
    for _ in range(m - n_clusters):
        a, b = np.unravel_index(np.argmin(D), D.shape)
        a, b = min(a, b), max(a, b)
        wa, wb = sizes[a], sizes[b]
        D[a] = (wa * D[a] + wb * D[b]) / (wa + wb)
        D[:, a] = D[a]
        D[a, a] = np.inf
        D[b] = np.inf
        D[:, b] = np.inf
        sizes[a] += wb
        members[a] += members[b]
        alive[b] = False
    out = np.empty(m, dtype=np.int64)
    for c, a in enumerate(np.flatnonzero(alive)):
        out[members[a]] = c
    return out


def _merge_modes(M, labels, modes, n_clusters, grid, batch_size, log, sparse=None):
    """Average linkage on the invariant distance between the converged means.

    Up to ``_FULL_LINKAGE_MAX`` samples, every sample's mean is a point of the linkage (means of
    one mode are at distance ~0, so they merge first): measured on MNIST this is far better than
    linking one representative per mode, because connected components of means can chain two
    digits together. Beyond that, one representative per mode, weighted by the mode's size.
    """
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    from .neighbors import check_fits

    n = M.shape[0]
    if n <= _FULL_LINKAGE_MAX:
        check_fits(n * n * 12, M.device if sparse is None else "cpu",
                   "the all-pairs distances of the final linkage")
        if sparse is None:
            D, _ = grid_search(M, M, grid, batch_size=batch_size)
            D = D.to(torch.float64).cpu().numpy()
        else:
            # only each mean's nearest means are known (shortlist search): the other pairs
            # count as twice the largest known distance
            Dk, Ik = (t.cpu().numpy() for t in sparse)
            finite = np.isfinite(Dk)
            D = np.full((n, n), 2.0 * float(Dk[finite].max()) if finite.any() else 1.0)
            rows = np.repeat(np.arange(n), Dk.shape[1])
            D[rows[finite.ravel()], Ik.ravel()[finite.ravel()]] = Dk[finite]
        D = np.minimum(D, D.T)
        np.fill_diagonal(D, 0.0)
        Z = linkage(squareform(D, checks=False), method="average")
        return _cut_tree(Z, D, n_clusters)
    if len(modes) < n_clusters:
        raise ValueError(
            f"n_clusters: invariant attention found only {len(modes)} modes among {n} samples, "
            f"fewer than n_clusters={n_clusters}; use a smaller bandwidth or n_neighbors"
        )
    log(f"linking {len(modes)} mode representatives")
    reps = torch.stack([M[int(m[0])] for m in modes])
    D, _ = grid_search(reps, reps, grid, batch_size=batch_size)
    D = torch.minimum(D, D.T).cpu().numpy()
    sizes = np.array([len(m) for m in modes])
    mode_labels = _weighted_average_linkage(D, sizes, n_clusters)
    return mode_labels[labels]


def _cut_tree(Z, D, n_clusters):
    """Cut a linkage tree into ``n_clusters`` clusters that are not stragglers.

    Average linkage leaves far-away samples as clusters of their own until the very last merges,
    so a plain cut at ``n_clusters`` can spend clusters on a handful of outliers. The tree is cut
    at the smallest count that yields ``n_clusters`` clusters of at least ``_MIN_CLUSTER_FRACTION``
    of the mean cluster size; samples of the smaller clusters join the cluster at the smallest
    average invariant distance.
    """
    from scipy.cluster.hierarchy import fcluster

    n = D.shape[0]
    min_size = max(2, int(_MIN_CLUSTER_FRACTION * n / n_clusters))
    for c in range(n_clusters, n + 1):
        lab = fcluster(Z, c, criterion="maxclust") - 1
        sizes = np.bincount(lab)
        big = np.flatnonzero(sizes >= min_size)
        if len(big) >= n_clusters or c == n:
            break
    if len(big) < n_clusters:  # tiny data: no cut has enough large clusters
        return fcluster(Z, n_clusters, criterion="maxclust") - 1
    keep = big[np.argsort(-sizes[big], kind="stable")[:n_clusters]]
    onehot = (lab[:, None] == keep[None, :]).astype(np.float64)
    nearest = np.argmin(D @ onehot / onehot.sum(0), axis=1)
    mapping = np.full(sizes.shape[0], -1)
    mapping[keep] = np.arange(n_clusters)
    out = mapping[lab]
    return np.where(out >= 0, out, nearest)


def _relabel_by_size(labels):
    """Labels 0..K-1 ordered by decreasing cluster size (ties: first occurrence)."""
    uniq, first, counts = np.unique(labels, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))
    mapping = np.empty(uniq.max() + 1, dtype=np.int64)
    mapping[uniq[order]] = np.arange(len(uniq))
    return mapping[labels]


def _cluster_means(Xt, M, labels, grid, batch_size, D_knn):
    """Each cluster's invariant mean of its samples, and each sample's alignment onto it."""
    n_clusters = int(labels.max()) + 1
    centers = []
    params = torch.zeros((Xt.shape[0], 3), dtype=Xt.dtype, device=Xt.device)
    for c in range(n_clusters):  # a loop over clusters; each step is batched over its members
        members = torch.as_tensor(np.flatnonzero(labels == c), device=Xt.device)
        Xc = Xt[members]
        w = torch.full((len(members),), 1.0 / len(members), dtype=Xt.dtype, device=Xt.device)
        # start from the converged mean of the member in the densest place (smallest mean
        # distance to its nearest means): O(n) instead of a search over all member pairs
        density = torch.nan_to_num(D_knn[members], posinf=0.0).mean(1)
        init = M[members[int(torch.argmin(density))]]
        mu, p, _ = invariant_mean_tensor(Xc, w, grid, init=init, max_iter=5, tol=1e-4,
                                         batch_size=batch_size)
        centers.append(mu)
        params[members] = p
    return torch.stack(centers), params


def invariant_attention_clustering(X, n_clusters=None, **params):
    """Function twin of :class:`InvariantAttentionClusterer`.

    Returns
    -------
    cluster_centers : ndarray of shape (n_clusters_, n_features)
    labels : ndarray of shape (n_samples,)
    """
    est = InvariantAttentionClusterer(n_clusters=n_clusters, **params).fit(X)
    return est.cluster_centers_, est.labels_
