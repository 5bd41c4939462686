"""Invariant-attention clustering: attention with a max-over-transformations similarity.

``fit`` reads as the algorithm: search (the invariant kNN graph of the samples) -> bandwidth
(a per-sample calibration) -> iterate (invariant attention to a fixed point) -> group (the graph
of the converged means) -> centres (each cluster's invariant mean).
"""

from __future__ import annotations

import numbers
import time
import warnings
from dataclasses import dataclass, replace
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from . import _memory
from ._dask import DaskClientMixin
from ._duplicates import canonical_order, unique_in_canonical_order
from ._estimator import (
    ENGINE_CONSTRAINTS,
    ROTATION_CENTER_CONSTRAINTS,
    SE2SearchMixin,
    shift_params,
)
from ._grouping import (
    COUNT_RUNS,
    DECIDE_ROWS,
    group,
    resolve_graph,
    two_hop_candidates,
    vote,
)
from ._heap import release, reusing_heap
from ._iteration import (  # noqa: F401 - the iteration's names, importable from here as before
    _relabel_by_size,
    attend_means,
    blurring_mean_shift,
    iterate_attention,
    mean_shift,
)
from ._leiden import leiden_workers
from ._means import cluster_means
from ._progress import progress, progress_bar
from ._shapes import Given, align, copy_grid, find_shapes, measure_noise
from ._split import split_to_count
from ._threads import thread_limit
from ._utils import resolve_device, torch_dtype_for
from ._weights import attention_weights, calibrate_bandwidth  # noqa: F401 - as before
from .denoise import RadialWiener, estimate_noise_std
from .denoise import _subset_rows as _noise_rows
from .search import all_pairs, candidate_search, knn_search, make_search_plan, refine_pairs
from .transforms import compose_se2, fast_warp, invert_se2

__all__ = ["InvariantAttentionClusterer", "invariant_attention_clustering"]


class InvariantAttentionClusterer(DaskClientMixin, SE2SearchMixin, ClusterMixin,
                                  ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Cluster images invariantly to rotations and translations by iterated invariant attention.

    Every image attends to its invariant nearest neighbours, each aligned onto it
    (``T_tau*(x_i, x_j) x_j``), and moves to their weighted average until a fixed point: the
    sample's invariant mean, a denoised version of it in its own pose. The invariant kNN graph
    of the samples (on noisy images, its union with the graph of the means) is grouped by
    Leiden, and each cluster's invariant mean is its centre. Why and how each stage behaves:
    :doc:`/user_guide/invariant_attention` and :doc:`/user_guide/parameters`.

    Parameters
    ----------
    n_clusters : int or None, default=None
        The fit has two levels: the **shapes** (groups of transformed copies of one image,
        ``shape_labels_``) and the **clusters**, groups of shapes. None: the data decide how
        many, by one principle: where the kNN graph of the shapes is complete (no more shapes
        than ``n_neighbors + 1``) it shows no community and each shape is a cluster; else
        Leiden's communities at resolution 1 (modularity). ``count_rule_`` says which. An
        int: that many groups of shapes (Leiden's resolution searched for that count); where
        fewer shapes are found, the count says distinct images were joined, and the shapes
        are split at their lowest normalized cuts until there are that many. A fit equals
        the fit of its shapes: storing the data twice, permuting it or adding copies changes
        neither level. See :ref:`parameters-n-clusters`.
    group : {"se2", "rotation", "translation", "none"}, default="se2"
        The transformations searched; "none" is plain kernel attention (mean shift on
        pixels), the baseline. See :ref:`parameters-group`.
    max_rotation : float, default=180.0
        Rotations searched within ``+-max_rotation`` degrees. The most sensitive choice:
        search only the range the data has (a full circle confuses 6 and 9 on upright digits).
        See :ref:`parameters-angles`.
    n_rotations : int, default=36
        Grid angles (0 is always included). At most
        :func:`~invariant_cluster.alignment.rotation_limit` (the angles the image size can tell
        apart, at least 360); more get a ``ValueError``.
    max_translation : float, default=0
        Shifts searched within ``+-max_translation`` pixels (integer grid) between two
        samples: copies shifted within ``+-s`` pixels at any angle are up to
        ``s (1 + sqrt(2))`` pixels apart. Search that range, or centre the images first
        (``center``). See :ref:`parameters-shifts`.
    center : "auto" or bool, default="auto"
        Shift every image (fitted, predicted or transformed) so that the centre of mass of its
        positive part lies at the rotation centre, so that the search need only cover the
        shifts the centring leaves. For shapes on an empty background; where the content
        reaches the frame it costs accuracy. "auto": centre when shifts are searched and the
        band along the frame that they move through is dark. ``center_`` says what the fit
        did; ``alignments_`` and ``invariant_means_`` stay in the input's frame. See
        :ref:`parameters-shifts`.
    bandwidth : "auto" or float, default="auto"
        "auto": per sample, umap-learn's calibration on the invariant distances to the
        ``n_neighbors`` nearest samples (``rho_i`` the nearest, ``sigma_i`` capped at
        ``0.25 rho_i``), weights ``exp(-max(d - rho_i, 0) / sigma_i)``. A float: a global
        Gaussian ``sigma`` (plain mean shift). See :ref:`parameters-neighbourhood`.
    n_neighbors : int, default=15
        The other samples each sample attends to (and the kNN graph's degree); all others on
        data sets smaller than ``n_neighbors + 1``. A cluster may be smaller than the
        neighbourhood; with augmented data, search more neighbours than the copies of an
        image. See :ref:`parameters-neighbourhood`.
    update : {"fixed", "blurring"}, default="fixed"
        "fixed": the keys stay at the samples (mean shift on each sample's aligned
        neighbourhood), a monotone ascent that never merges clusters. "blurring": the keys are
        the current means (Gaussian blurring mean shift), stopped when the partition into modes
        has not changed for 3 iterations. See :doc:`/user_guide/convergence`.
    graph : {"auto", "samples", "means", "both"}, default="auto"
        Which kNN graph is grouped: the samples' invariant kNN graph, the converged means'
        (searched among each sample's neighbours and theirs), or the union of the samples'
        graph and the means' graph searched again among all means. "auto": "both" when the
        iteration replaced most neighbours (noisy images), else "samples"; ``graph_`` says
        which. See :ref:`parameters-graph`.
    grouping : {"leiden", "umap"}, default="leiden"
        "leiden": Leiden (leidenalg, RB configuration model) on the fuzzy graph with the
        attention's own calibration. "umap": umap-learn's layout and k-means (or HDBSCAN),
        which needs the optional umap-learn (``pip install "invariant_cluster[umap]"``).
    max_iter : int, default=300
    tol : float, default=1e-3
        "fixed": converged when the largest move of a mean relative to its bandwidth,
        ``max_i ||m_i(t+1) - m_i(t)|| / sigma_i``, is below ``tol``.
    refine : bool, default=True
        Refine continuously (angle and sub-pixel shift) the alignments of every sample onto its
        cluster centre and the distances of ``transform``/``predict``, and, with
        ``n_clusters=None``, the kNN graph's distances on which a count is tested. The kNN
        searches use the grid only.
    image_shape : tuple (H, W) or (C, H, W), optional
        How to fold rows of ``X``; None: square if ``n_features`` is a perfect square, else a
        ``1 x n_features`` image.
    device : {"auto", "cpu", "cuda", ...}, default="auto"
    batch_size : int, optional
        Queries per block of the alignment search (exact or of the shortlist's candidates)
        and rows per block of the iteration: one meaning everywhere, images on the query side
        (None: from a memory budget).
    neighbor_search : {"auto", "exact", "shortlist"}, default="auto"
        How the samples' kNN graph is found. "exact": the grid search over all pairs
        (``O(n^2)``). "shortlist": an SE(2)-invariant descriptor shortlists ``n_candidates``
        keys per query and only those are aligned (:mod:`invariant_cluster.neighbors`).
        "auto": exact while ``n_samples x`` (grid size) is at most ``4000 x 36`` on a CPU,
        five times that on a GPU; the choice is recorded in ``search_plan_``.
    n_candidates : int, optional
        Shortlist length (None: ``max(4 n_neighbors, 64)``; ``max(6 n_neighbors, 96)`` where
        faiss's approximate search finds the shortlist (from 10,000 images on a CPU) and on a
        GPU, except for the search of the converged means, which keeps
        ``max(4 n_neighbors, 64)``).
    client : dask.distributed.Client, optional
        Run the alignment searches block by block on a Dask cluster (identical results).
    n_jobs : int, optional
        Threads for torch and the BLAS/OpenMP pools during ``fit``/``predict``/``transform``
        (None: as set by ``OMP_NUM_THREADS`` or threadpoolctl; -1: all cores). On large graphs
        as many worker processes run the grouping's Leiden runs, with the same labels as one
        process. See :doc:`/user_guide/scaling`.
    random_state : int, RandomState instance or None
        Seeds the grouping (Leiden's optimiser; umap-learn's layout and k-means' starts with
        ``grouping="umap"``).
    verbose : int, default=0
        1: tqdm progress bars on standard error over the blocks of the searches, the rows of
        the attention iteration still moving, the grouping and the centres, and a line per
        stage with its time. 0: silent.
    noise_std : "auto" or float, default="auto"
        White noise in the images, damped before anything else by
        :class:`~invariant_cluster.denoise.RadialWiener` (an isotropic filter). "auto":
        measured where the images have least power
        (:func:`~invariant_cluster.denoise.estimate_noise_std`, on the images as given: the
        centring's sub-pixel shifts would interpolate the noise away; 0 on clean images, and
        the filter is then the identity); a float: the known standard deviation (0: no filter).
        The search, the iteration, the centres, ``predict`` and ``transform`` all see the
        filtered images. See :ref:`parameters-noise`.
    reflection : bool, default=False
        Also search the mirror images (the group E(2) = SE(2) x {identity, mirror}; the
        mirror is a horizontal flip about the rotation centre, before the rotation, see
        :mod:`invariant_cluster.transforms`), at twice the search's cost. ``alignments_``
        gains a 4th column, the mirror bit.
    rotation_center : {"geometric", "fourier"}, default="geometric"
        The centre of rotations and mirrors: the geometric centre ``((W - 1) / 2, (H - 1) / 2)``,
        or the pixel ``(W // 2, H // 2)`` about which cryo-EM particles are rotated (the
        origin of the centred Fourier transform; the same pixel on odd sizes). Searches,
        means, centres and ``alignments_`` all turn about it: reproduce an alignment with
        ``warp_se2(x, tau, rotation_center=...)``. See :ref:`parameters-rotation-center`.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        Cluster of each sample, from the grouping of the kNN graph (largest cluster first, in
        samples, or in their ``sample_weight``; ties in an order set by the images' content,
        not by the samples'). ``predict`` votes among the nearest fitted images instead.
    graph_ : str
        The graph that was grouped: "samples", "means" or "both".
    count_rule_ : str
        What decided the number of clusters: "given" (``n_clusters``), "shapes" (each shape a
        cluster: a complete graph of the shapes), "modularity" (Leiden at resolution 1) or
        "hdbscan" (``grouping="umap"``). See :ref:`parameters-n-clusters`.
    shape_labels_ : ndarray of shape (n_samples,)
        The shape of each sample: samples whose refined invariant distance is within what the
        resampling and the measured noise put between two copies of one image are one shape
        (largest first, as ``labels_``; -1 for a sample of weight 0). See
        :ref:`parameters-shapes`.
    n_shapes_ : int
    shape_means_ : ndarray of shape (n_shapes_, n_features)
        Each shape's invariant mean, in the pose of its first image.
    search_plan_ : SearchPlan
        How the kNN graph of the distinct images was searched (exact or shortlist, the
        shortlist blocked on the device or by faiss, its length, the device), decided from
        the sizes and the device by :func:`~invariant_cluster.neighbors.make_search_plan`.
    center_ : bool
        Whether the images were centred on their centres of mass (``center``; "auto"
        decides at fit, and ``predict`` and ``transform`` centre as the fit did).
    cluster_centers_ : ndarray of shape (n_clusters_, n_features)
        Each cluster's invariant mean of its samples.
    n_clusters_ : int
    invariant_means_ : ndarray of shape (n_samples, n_features)
        Each sample's converged mean (in the sample's own pose).
    alignments_ : ndarray of shape (n_samples, 3), or (n_samples, 4) with ``reflection=True``
        ``(angle, tx, ty)`` that warps each sample onto its cluster centre:
        ``warp_se2(x_i, alignments_[i], rotation_center=rotation_center)`` is close to
        ``cluster_centers_[labels_[i]]``; the 4th column is the mirror bit.
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
    noise_std_ : float
        The noise's standard deviation, measured or as given.
    filter_ : RadialWiener
        The fitted filter (the identity when ``noise_std_`` is 0); ``filter_.transform(X)`` gives
        the images as the fit saw them.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names seen in ``fit``; set only when ``X`` has column names that are all
        strings (a data frame).
    image_shape_ : tuple (C, H, W)

    Notes
    -----
    Cost: one invariant kNN search of the samples (``n^2 R S F`` multiply-adds in blocked matrix
    products for the exact search, ``R`` angles, ``S`` integer shifts, ``F`` pixels), ``n k``
    warps for the attention (done once for the fixed update), one search of the means over each
    sample's two-hop neighbourhood (``n (k + k^2)`` pairs) and, when the union is grouped, a
    second kNN search among the means, Leiden (a few runs to find the resolution), and one
    invariant mean per cluster. Memory is ``O(n k)`` plus blocks: no ``n x n`` array; the
    fitted images are kept for ``predict``. The calibration, its cap, the noise filter and the
    grouping are this library's choices; the paper is silent on them (measured in
    :doc:`/benchmarks`).

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
        **SE2SearchMixin._parameter_constraints,
        **ENGINE_CONSTRAINTS,
        **ROTATION_CENTER_CONSTRAINTS,
        "n_clusters": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "bandwidth": [StrOptions({"auto"}), Interval(numbers.Real, 0, None, closed="neither")],
        "update": [StrOptions({"blurring", "fixed"})],
        "graph": [StrOptions({"auto", "samples", "means", "both"})],
        "grouping": [StrOptions({"leiden", "umap"})],
        "max_iter": [Interval(numbers.Integral, 0, None, closed="left")],
        "tol": [Interval(numbers.Real, 0, None, closed="left")],
        "n_jobs": [Interval(numbers.Integral, None, -1, closed="right"),
                   Interval(numbers.Integral, 1, None, closed="left"), None],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "noise_std": [StrOptions({"auto"}), Interval(numbers.Real, 0, None, closed="left")],
        "center": ["boolean", StrOptions({"auto"})],
    }
    _min_fit_samples = 2
    # float32 whatever the input: the grouping runs umap-learn in float32
    _magnitude_dtype = np.float32

    def __init__(self, n_clusters=None, *, group="se2", max_rotation=180.0, n_rotations=36,
                 max_translation=0, bandwidth="auto", n_neighbors=15, update="fixed",
                 graph="auto", grouping="leiden", max_iter=300, tol=1e-3, refine=True,
                 image_shape=None, device="auto", batch_size=None, neighbor_search="auto",
                 n_candidates=None, client=None, n_jobs=None, random_state=None, verbose=0,
                 reflection=False, noise_std="auto", center="auto",
                 rotation_center="geometric"):
        self.n_clusters = n_clusters
        self.group = group
        self.max_rotation = max_rotation
        self.n_rotations = n_rotations
        self.max_translation = max_translation
        self.bandwidth = bandwidth
        self.n_neighbors = n_neighbors
        self.update = update
        self.graph = graph
        self.grouping = grouping
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
        self.reflection = reflection
        self.noise_std = noise_std
        self.center = center
        self.rotation_center = rotation_center

    # ------------------------------------------------------------------ helpers
    def _tensor(self, X2, device, copy=True):
        """``X2`` as images; a copy unless ``copy=False`` (for a new array of the fit's own:
        the input may be read-only, and the fit must never write into it)."""
        make = torch.tensor if copy else torch.as_tensor
        return make(X2, dtype=torch_dtype_for(X2), device=device).reshape(-1, *self.image_shape_)

    def _filtered(self, Xt):
        """New images as the fit saw them: filtered in place by ``filter_`` (``Xt`` is a
        copy made by ``_tensor``)."""
        return self.filter_.filter_tensor(Xt, in_place=True)

    def _log(self, msg):
        if self.verbose:
            print(f"[InvariantAttentionClusterer] {msg}", flush=True)

    # ------------------------------------------------------------------ fit
    @_fit_context(prefer_skip_nested_validation=True)
    @reusing_heap
    def fit(self, X, y=None, sample_weight=None):
        """Search, calibrate, iterate invariant attention to its fixed point, group, centre.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)
            Training images. Integers (``uint8`` included) and bools are taken at their
            values in float32, not rescaled (the results are in the units of ``X``).
        y : Ignored
        sample_weight : array-like of shape (n_samples,), default=None
            How many samples each image stands for (non-negative; None: one each). A weight
            of ``w`` fits as the image stored ``w`` times: it weighs in the attention, the
            shapes' means, the count and the vote of ``predict``, so a shape's copies replaced
            by one of them, weighted by their number, fit as the copies do. A sample of
            weight 0 takes no part in the fit, as if left out: its label is ``predict``'s,
            its shape -1, and its other per-sample attributes NaN (-1 in ``neighbors_``).

        Returns
        -------
        self : object
        """
        X1 = self._validate(X, reset=True)
        weights = _check_sample_weight(sample_weight, X1.shape[0])
        kept = None
        if weights is not None and (weights == 0).any():
            # a sample of weight 0 is left out of the fit and labelled by predict after it
            kept = np.flatnonzero(weights > 0)
            X_all, X1, weights = X1, X1[kept], weights[kept]
        if weights is not None and (weights == 1.0).all():
            weights = None  # one sample each, as without weights
        X2, offsets = self._centred(X1, reset=True)
        dev = resolve_device(self.device)
        grid = self._grid(refine=False)
        seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        self._check_fits(X2, grid, dev)
        # the distinct images in an order set by their content: the fit does not depend on the
        # order of the samples or on how often an image is stored (see _duplicates)
        rows = _Rows.distinct(X2, weights)
        Xu = self._tensor(X2[rows.distinct_samples], dev, copy=False)  # a new array
        # 0. the noise, measured on (at most 10,000 of) the distinct images
        filt = RadialWiener(self._noise_level(X1, offsets, rows, dev),
                            image_shape=self.image_shape_).fit_tensor(
            Xu, getattr(self, "feature_names_in_", None))
        # where the fit centres, the copies are told apart on the images as given (_shapes):
        # the validated input is held until the shapes are found, and its images are filtered
        # a block of pairs at a time
        given = (X1, offsets) if offsets is not None else None
        del X1
        t0 = time.perf_counter()
        # the grouping's Leiden runs on a large graph go to worker processes: on a card they
        # start now, while the search runs there (the graph has about n k edges; on the CPU
        # the search keeps the cores busy, and they start when the runs do)
        with thread_limit(self.n_jobs), torch.no_grad(), progress(self.verbose), \
                leiden_workers(self.grouping == "leiden" and torch.device(dev).type == "cuda",
                               rows.n_rows * self._k(rows.n_rows), COUNT_RUNS,
                               torch.get_num_threads(), _memory.memory_budget("cpu")) as workers:
            Xu, rows = self._filter_stage(Xu, rows, filt, t0)
            # 1. search: the invariant kNN graph of one representative of each group of (near)
            # duplicates, in the search's frame (rotations turn about its geometric centre)
            Xt, Xown, rows, knn, plan, noise = self._search_stage(self._framed(Xu), rows, grid,
                                                                  filt, t0, given, seed)
            del given
            del Xu
            release()
            # 2. bandwidth
            D, idx, P = knn
            rho, sigma = calibrate_bandwidth(D.clamp(min=0).sqrt(), self.bandwidth)
            # 3. iterate (a representative of duplicates weighs as all its copies)
            M, W, history, converged = iterate_attention(
                Xt, idx, P, rho, sigma, self.bandwidth, update=self.update,
                max_iter=self.max_iter, tol=self.tol, batch_size=self.batch_size,
                counts=rows.counts(Xt))
            # a shape with copies converges onto its invariant mean: the fixed point of the
            # attention among its copies, whose kNN lists the shapes' graph no longer holds
            shaped = self._shape_means(Xt, Xown, rows)
            poses = None
            if shaped is not None:
                poses = shaped[2]
                M[shaped[0]] = shaped[1].to(M.dtype)
            self._log(f"{len(history)} iterations ({time.perf_counter() - t0:.1f} s)")
            # each stage allocates blocks of its own sizes: what the last one left free in the
            # heap goes back to the kernel (see _heap.release)
            release()
            # 4. group: Leiden on the samples' graph or its union with the means' graph
            grouped = self._group_stage(Xt, knn, M, grid, seed, workers, t0, rows, shaped, noise)
            release()
            shape_means = self._unframed(Xt).reshape(rows.n_rows, -1).cpu().numpy().copy()
            if shaped is not None:
                shape_means[shaped[0].cpu().numpy()] = self._unframed(shaped[1]).reshape(
                    len(shaped[0]), -1).cpu().numpy()
            del shaped
            # 5. centres: each cluster's invariant mean, started at its densest converged mean;
            # a near duplicate takes its own pose (its rows: Mown, Pown)
            centers, params = cluster_means(Xt, M, grouped.labels, self._grid(self.refine),
                                            self.batch_size, grouped.distances)
            Mown, Pown = self._copies_pose(Xt, Xown, M, centers, grouped.labels, rows,
                                           poses, params)
            # the fit's copy of the images is freed before the results are copied out
            # (predict filters the fitted input, _fit_X, again)
            Xt = Xown = None
            release()
        self._warn_unconverged(converged, history)
        means = self._unframed(M).reshape(rows.n_rows, -1).cpu().numpy()
        del M
        # 6. the fitted attributes, per sample
        fitted = self._fitted_attributes(X2, offsets, rows, grouped.labels, centers, params,
                                         means, Mown, Pown, rho, sigma, idx, W, history)
        fitted.update(filter_=filt, noise_std_=float(filt.noise_std_), search_plan_=plan,
                      graph_=grouped.graph, count_rule_=grouped.count_rule,
                      shape_labels_=rows.by_size(np.arange(rows.n_rows)),
                      n_shapes_=rows.n_rows)
        order = np.zeros(rows.n_rows, dtype=np.int64)
        order[fitted["shape_labels_"]] = rows.rows_of_samples
        fitted["shape_means_"] = shape_means[order].astype(X2.dtype, copy=False)
        for name, value in fitted.items():
            setattr(self, name, value)
        if kept is not None:
            self._add_weightless(X_all, kept)
        self._log(f"done: {self.n_clusters_} clusters in {time.perf_counter() - t0:.1f} s")
        return self

    # the per-sample attributes, and what a sample of weight 0 holds in each
    _PER_SAMPLE = dict(labels_=None, shape_labels_=-1, invariant_means_=np.nan,
                       alignments_=np.nan, bandwidth_=np.nan, rho_=np.nan, neighbors_=-1,
                       attention_weights_=np.nan)

    def _add_weightless(self, X_all, kept):
        """The per-sample attributes of the samples of weight 0 (those of ``X_all``, the
        validated input, not in ``kept``): ``predict``'s label, and no part in the fit."""
        n = X_all.shape[0]
        left = np.setdiff1d(np.arange(n), kept)
        for name, fill in self._PER_SAMPLE.items():
            value = getattr(self, name)
            if name == "neighbors_":
                value = kept[value]
            full = np.empty((n, *value.shape[1:]), dtype=value.dtype)
            full[kept] = value
            if fill is None:
                full[left] = self._vote(self._centred(X_all[left])[0])
            else:
                full[left] = fill
            setattr(self, name, full)

    def _noise_level(self, X1, offsets, rows, dev):
        """``noise_std`` as given, or where the fit centres the images (``offsets``) measured
        on (at most 10,000 of) the distinct images as given (``X1``): a shift by a fraction of
        a pixel interpolates the noise's highest frequencies away, where it is read."""
        if offsets is None or not isinstance(self.noise_std, str):
            return self.noise_std
        sub = rows.distinct_samples[_noise_rows(rows.n_distinct, "cpu").numpy()]
        return estimate_noise_std(self._tensor(X1[sub], dev, copy=False))

    def _k(self, n_rows):
        """Neighbours searched among ``n_rows`` images (all others on a small set)."""
        return int(min(self.n_neighbors, n_rows - 1))

    def _check_fits(self, X2, grid, dev):
        """A fit that cannot fit fails now, not after an hour of search: before anything of the
        data's size is allocated, for all n samples (the distinct ones are not known yet) and
        with the filtered copy (the noise is not measured yet)."""
        n = X2.shape[0]
        if self.n_clusters is not None and self.n_clusters > n:
            raise ValueError(
                f"n_clusters: expected at most n_samples={n}, got {self.n_clusters}"
            )
        k = self._k(n)
        c = self._plan(n, grid, k, dev).n_candidates
        what = f"InvariantAttentionClusterer.fit on {n} images"
        _memory.check_search(n, n, self._frame_shape(), grid, k=k, n_candidates=c,
                             element_size=X2.dtype.itemsize, device=dev, what=what)
        _memory.check_fits(
            _memory.estimate_fit_bytes(n, int(np.prod(self._frame_shape())), k, c,
                                       element_size=X2.dtype.itemsize, device=dev,
                                       filtered=self.noise_std != 0,
                                       grouping_means=self.n_clusters is None),
            dev, what,
            hint="fit a subset, lower n_neighbors, or run on a machine with more memory")

    def _filter_stage(self, Xu, rows, filt, t0):
        """``(Xu, rows)``: the distinct images filtered in place by ``filt``, in the order of
        the filtered images' own content, as a fit of them with the filter off takes them (the
        default fit is that fit; the order sets ties). Unchanged where the filter is the
        identity."""
        if filt.is_identity:
            return Xu, rows
        filt.filter_tensor(Xu, in_place=True)
        order = canonical_order(Xu)
        Xu = Xu[torch.as_tensor(order, device=Xu.device)]
        self._log(f"noise {float(filt.noise_std_):.3g} filtered "
                  f"({time.perf_counter() - t0:.1f} s)")
        return Xu, rows.reordered(order)

    def _search_stage(self, Xu, rows, grid, filt, t0, given=None, seed=0):
        """``(Xt, Xown, rows, (D, idx, P), plan, noise)``: the invariant kNN graph (squared
        distances, neighbours, grid alignments) of the representatives ``Xt``, the first image
        of each shape (:mod:`~invariant_cluster._shapes`: the groups of copies) of the
        distinct images ``Xu`` (whose rows they reuse), the other copies' own images ``Xown``
        (None without any), ``rows`` with the representatives, and the plan of the last full
        search. With ``n_clusters`` above the shapes found, the shapes are split into that many
        (:func:`~invariant_cluster._split.split_to_count`, its eigenvectors started from
        ``seed``). ``filt``: the fitted noise filter, whose noise sets the copies' tolerance;
        ``given``: ``(X1, offsets)``, the validated samples and their centring offsets where
        the fit centres them. ``noise``: the filtered images'
        :class:`~invariant_cluster._shapes.Noise`."""
        k = self._k(rows.n_rows)
        plan, knn = self._search(Xu, grid, k)
        noise = measure_noise(filt, self.image_shape_, Xu.device, Xu.dtype, pad=self._framed)
        dup = find_shapes(Xu, *knn, grid, self._grid(self.refine), noise,
                          batch_size=self.batch_size,
                          given=self._given_images(given, rows, filt, Xu.device))
        Xt, Xown = Xu, None
        if dup is not None and self.n_clusters is not None:
            found = np.unique(dup).size
            dup = split_to_count(Xu, dup, knn[1], self.n_clusters, self._grid(refine=False),
                                 self._grid(self.refine), self.batch_size, random_state=seed)
            split = np.unique(dup).size
            if split > found:
                self._log(f"{found} shapes split into {split}, the count given")
        if dup is not None:
            rows = rows.with_representatives(dup)
            # the near duplicates' own images are set aside, and the representatives
            # gathered in place: a few near duplicates cost no copy of the images
            Xown = Xu[torch.as_tensor(rows.own, device=Xu.device)]
            Xt = _gather_rows_in_place(Xu, rows.representatives)
            k = self._k(rows.n_rows)
            plan, knn = self._search_representatives(Xt, rows.representatives, knn, grid, k,
                                                     plan=plan)
            self._log(f"{rows.n_rows} shapes of {rows.n_distinct} distinct images")
        self._log(f"kNN graph (k={k}): {time.perf_counter() - t0:.1f} s")
        return Xt, Xown, rows, knn, plan, noise

    def _given_images(self, given, rows, filt, dev):
        """:class:`~invariant_cluster._shapes.Given` for :func:`find_shapes`: the distinct
        images as given, filtered and framed as the fit's when asked, and the shifts that
        centred them; None where the fit does not centre."""
        if given is None:
            return None
        X1, offsets = given
        samples = rows.distinct_samples

        def images(picked):
            G = self._tensor(X1[samples[picked]], dev)
            if not filt.is_identity:
                filt.filter_tensor(G, in_place=True)
            return self._framed(G)

        return Given(images, torch.as_tensor(shift_params(-offsets[samples]),
                                             dtype=torch_dtype_for(X1), device=dev))

    def _group_stage(self, Xt, knn, M, grid, seed, workers, t0, rows, shaped, noise):
        """The grouping (:class:`_Grouped`) of the kNN graph ``knn`` of the images ``Xt``
        and their converged means ``M`` (the shapes of ``rows``; ``shaped``: the invariant
        means of those with copies, :meth:`_shape_means`; ``noise``: the filtered images'),
        once the Leiden workers (if any) have started."""
        stage = progress_bar(1, "grouping", "stage")
        if workers is not None:
            workers.join()
        grouped = self._group(Xt, knn, M, grid, seed, rows, shaped, noise)
        stage.update()
        stage.close()
        self._log(f"{int(grouped.labels.max()) + 1} clusters "
                  f"({time.perf_counter() - t0:.1f} s)")
        return grouped

    def _warn_unconverged(self, converged, history):
        if self.max_iter > 0 and not converged:
            warnings.warn(
                f"InvariantAttentionClusterer did not converge in max_iter={self.max_iter} "
                f"iterations (last relative move {history[-1]:.2e} > tol={self.tol}); "
                "increase max_iter or tol.",
                ConvergenceWarning,
                stacklevel=3,
            )

    def _fitted_attributes(self, X2, offsets, rows, labels, centers, params, means, Mown, Pown,
                           rho, sigma, idx, W, history):
        """The per-sample fitted attributes, from the results on the fit's rows (``means``:
        the converged means, NumPy; ``Mown``, ``Pown``: the near duplicates' own means and
        alignments), in the input's frame."""
        np_dtype = X2.dtype
        n = X2.shape[0]
        out = {}
        # labels by decreasing size, ties in the order of the rows (set by their content)
        out["labels_"] = rows.by_size(labels)
        n_clusters = int(labels.max()) + 1
        out["n_clusters_"] = n_clusters
        order = np.zeros(n_clusters, dtype=np.int64)
        order[out["labels_"]] = rows.to_samples(labels)
        out["cluster_centers_"] = self._unframed(
            centers[torch.as_tensor(order, device=centers.device)]).reshape(
            n_clusters, -1).cpu().numpy().astype(np_dtype)
        invariant_means = rows.to_samples(means, Mown).astype(np_dtype, copy=False)
        alignments = rows.to_samples(params.cpu().numpy(), Pown).astype(np.float64)
        if offsets is not None:  # back to the input's frame: T_tau T_(0, -d) and T_(0, d) mu
            shifts = shift_params(offsets)
            alignments = compose_se2(alignments, shift_params(-offsets))[
                ..., :alignments.shape[-1]]
            with torch.no_grad():
                invariant_means = fast_warp(
                    torch.from_numpy(invariant_means).reshape(n, *self.image_shape_),
                    torch.from_numpy(shifts.astype(np_dtype))).reshape(n, -1).numpy()
        out["invariant_means_"] = invariant_means
        out["alignments_"] = alignments
        out["bandwidth_"] = rows.to_samples(sigma.cpu().numpy().astype(np.float64))
        out["rho_"] = rows.to_samples(rho.cpu().numpy().astype(np.float64))
        # predict votes among the nearest distinct fitted images, each as often as it is
        # stored: the vote of KNeighborsClassifier, unchanged by storing the data twice (the
        # input as validated and centred, filtered again by predict)
        distinct = rows.distinct_samples
        out["_fit_X"] = X2[distinct]
        out["_fit_labels"] = out["labels_"][distinct]
        out["_fit_weights"] = rows.stored
        # the samples each attended to, as indices of the input (a representative's original)
        out["neighbors_"] = np.concatenate(
            [np.arange(n)[:, None], rows.to_samples(rows.original(idx.cpu().numpy()))], 1)
        out["attention_weights_"] = rows.to_samples(W.cpu().numpy().astype(np.float64))
        out["history_"] = [float(h) for h in history]
        out["n_iter_"] = len(history)
        return out

    def _plan(self, n, grid, k, device, *, purpose="samples", n_queries=None):
        """The search plan of ``n_queries`` (None: ``n``, a self-search) against ``n``
        images."""
        return make_search_plan(n if n_queries is None else n_queries, n, grid.size, k,
                                device=device, method=self.neighbor_search,
                                n_candidates=self.n_candidates, purpose=purpose,
                                self_search=n_queries is None)

    def _search(self, Xt, grid, k):
        """``(plan, (D, idx, P))``: the invariant kNN graph of ``Xt`` (each sample left out of
        its own list) and the plan it was searched by."""
        plan = self._plan(Xt.shape[0], grid, k, Xt.device)
        return plan, knn_search(Xt, Xt, grid, k, plan=plan, batch_size=self.batch_size,
                                exclude=torch.arange(Xt.shape[0], device=Xt.device),
                                client=self.client)

    def _search_representatives(self, Xt, rep, found, grid, k, plan=None):
        """``(plan, (D, idx, P))``: the kNN graph of the representatives ``Xt`` (rows ``rep``
        of the images whose graph ``found`` is, searched by ``plan``): a row whose ``k``
        nearest were all representatives keeps them (they are its ``k`` nearest among the
        representatives too); the others are searched again. All rows are searched again,
        with a plan of their own, when every row lost a neighbour (a data set stored
        twice)."""
        D, idx, P = found
        dev = Xt.device
        m = Xt.shape[0]
        keep = torch.as_tensor(rep, device=dev)
        new_id = torch.full((idx.shape[0],), -1, dtype=torch.long, device=dev)
        new_id[keep] = torch.arange(m, device=dev)
        mapped = new_id[idx[keep, :k]]
        redo = torch.nonzero(~(mapped >= 0).all(1)).flatten()
        if k == 0 or len(redo) == m:
            return self._search(Xt, grid, k)
        D, idx, P = D[keep, :k].clone(), mapped, P[keep, :k].clone()
        if len(redo):
            plan_redo = self._plan(m, grid, k, dev, n_queries=len(redo))
            D[redo], idx[redo], P[redo] = knn_search(
                Xt[redo], Xt, grid, k, plan=plan_redo, batch_size=self.batch_size, exclude=redo,
                client=self.client)
        return plan, (D, idx, P)

    def _copies_pose(self, Xt, Xown, M, centers, labels, rows, poses, params):
        """The means and alignments of the copies ``rows.own`` (their own images ``Xown``;
        their shapes' first images are rows of ``Xt`` and of their means ``M``): a copy takes
        its first image's mean warped into its own pose, and its own alignment onto its
        cluster's centre. ``poses``: each copy's alignment onto its shape's mean
        (:meth:`_shape_means`), whose inverse starts the refinement of the first image onto the
        copy, and which, composed with the first image's alignment onto its centre
        (``params``), starts the copy's. ``(None, None)`` without any."""
        own = rows.own
        if own.size == 0:
            return None, None
        dev = Xt.device
        reps = torch.as_tensor(rows.row_of_distinct[own], device=dev)
        lab = torch.as_tensor(labels[rows.row_of_distinct[own]], device=dev)
        Mown = Pown = None
        starts, step = _memory.pair_blocks(len(own), Xown[0].numel())
        for s0 in starts:  # a block of copies at a time: no second copy of them
            K, r = Xown[s0:s0 + step], reps[s0:s0 + step]
            # the representative warped onto the copy (its pose, refined: a copy may be turned
            # by any angle), then the copy onto its centre
            pose = poses[s0:s0 + step]
            to_own = self._refined(K, Xt[r], invert_se2(pose))
            p = self._refined(centers[lab[s0:s0 + step]], K,
                              compose_se2(params[r].to(pose.dtype), pose), copies=False)
            m = self._unframed(fast_warp(M[r], to_own.to(M.dtype))).reshape(len(K), -1).cpu()
            p = p.cpu()
            if Mown is None:
                Mown = m.new_empty((len(own), m.shape[1]))
                Pown = p.new_empty((len(own), p.shape[1]))
            Mown[s0:s0 + len(K)] = m
            Pown[s0:s0 + len(K)] = p
        return Mown.numpy(), Pown.numpy()

    def _group(self, Xt, knn, M, grid, seed, rows, shaped=None, noise=None):
        """The grouping (:class:`_Grouped`: labels, largest cluster first) of the shapes'
        kNN graph ``knn = (D, idx, P)`` of the images ``Xt``, the graph of their converged
        means ``M``, or their union (see ``graph``), each shape weighing as the samples of
        ``rows`` it stands for, with the distances of the graph that ranks each cluster's
        densest member. A complete graph cut to a given count is cut on the shapes' invariant
        means (``shaped``) less the ``noise`` they hold (:meth:`_means_excess`)."""
        D, idx, _ = knn
        k = self._k(Xt.shape[0])
        complete = None
        if shaped is not None and noise is not None and noise.power > 0:
            def complete():
                return self._means_excess(Xt, shaped, rows, noise)
        idx_m = dist_m = None
        Dg = D
        graph = self.graph
        n = M.shape[0]
        own = torch.arange(n, device=M.device)
        if graph != "samples" and k > 0:
            if graph in ("auto", "means"):
                # the means' graph within two hops: for every shape when it is grouped itself
                # ("means"); "auto" only decides on it, from at most DECIDE_ROWS shapes
                picked = own
                if graph == "auto" and n > DECIDE_ROWS:
                    pick = np.random.default_rng(seed).choice(n, DECIDE_ROWS, replace=False)
                    picked = torch.as_tensor(np.sort(pick), device=M.device)
                Dm, idx_mt, _ = candidate_search(M if picked is own else M[picked], M,
                                                 two_hop_candidates(idx, picked), grid, k=k,
                                                 batch_size=self.batch_size,
                                                 client=self.client, exclude=picked)
                idx_m, dist_m = idx_mt.cpu().numpy(), _finite_dist(Dm)
                graph = resolve_graph(graph, idx[picked].cpu().numpy(), idx_m)
                if picked is not own:
                    idx_m = dist_m = None  # a subset's graph decided; it is not grouped
            if graph == "both":
                # the union's means' graph is searched again among ALL means: the denoised
                # means find neighbours the noisy samples' graph never offered (the user
                # guide's convergence page)
                Dm, idx_mt = _search_means(
                    M, grid, k, self._plan(M.shape[0], grid, k, M.device, purpose="means"),
                    batch_size=self.batch_size, client=self.client)
                idx_m, dist_m = idx_mt.cpu().numpy(), _finite_dist(Dm)
            if graph == "means":
                Dg = Dm
        labels, graph, count_rule = group(
            idx.cpu().numpy(), _finite_dist(D), idx_m, dist_m, self.n_clusters, graph,
            self.grouping, seed, sizes=rows.sizes.astype(np.float64),
            complete_distances=complete)
        return _Grouped(_relabel_by_size(labels), Dg, graph, count_rule)

    def _means_excess(self, Xt, shaped, rows, noise):
        """``(index, dist)`` ``(n, n - 1)``: every other shape, and the invariant squared
        distance of the two shapes' means (``Xt``, with ``shaped`` for the shapes with copies)
        less the noise two means of ``c_A`` and ``c_B`` distinct copies hold,
        ``nu^2 (1 / c_A + 1 / c_B)``, raised by one constant to be positive (the single
        linkage reads only their order): a single noisy copy is as near its shape's mean as
        the noise lets it be, not the farthest of the shapes."""
        S = Xt.clone()
        S[shaped[0]] = shaped[1].to(S.dtype)
        Dm, _ = all_pairs(S, S, self._grid(self.refine), batch_size=self.batch_size)
        Dm = torch.minimum(Dm, Dm.T).double().cpu().numpy()
        n = Dm.shape[0]
        c = np.bincount(rows.row_of_distinct, minlength=n).astype(np.float64)
        excess = Dm - float(noise.power) * (1.0 / c[:, None] + 1.0 / c[None, :])
        excess -= excess.min() - 1e-12
        np.fill_diagonal(excess, np.inf)
        index = np.argsort(excess, axis=1, kind="stable")[:, :n - 1]
        return index, np.take_along_axis(excess, index, axis=1)

    def _shape_means(self, Xt, Xown, rows):
        """``(multi, means, poses)``: the rows of the shapes with copies (a long tensor),
        their invariant means in the pose of their first image (a row of ``Xt``), and each copy's
        alignment onto its shape's mean (in the order of ``rows.own``); None without copies. A
        shape's copies (``Xown``, the images of ``rows.own``) are aligned onto its first image
        and averaged, each weighted by how often it is stored, then all its images are aligned
        again onto that average (refined from their first alignments: the average is in the
        first image's pose) and averaged: two rounds of the invariant mean's fixed point, the
        fixed point of invariant attention restricted to the copies."""
        if Xown is None or not len(rows.own):
            return None
        dev = Xt.device
        stored = rows.stored
        own_row = rows.row_of_distinct[rows.own]
        multi = np.unique(own_row)
        at = np.full(rows.n_rows, -1, dtype=np.int64)
        at[multi] = np.arange(len(multi))
        lab = torch.as_tensor(at[own_row], device=dev)
        weight = np.bincount(rows.row_of_distinct, weights=stored, minlength=rows.n_rows)[multi]
        w_first = torch.as_tensor(stored[rows.representatives[multi]] / weight, device=dev)
        w_own = torch.as_tensor(stored[rows.own] / weight[at[own_row]], device=dev)
        multi = torch.as_tensor(multi, device=dev)
        first = Xt[multi]
        target = first
        w_first, w_own = w_first.to(Xt.dtype), w_own.to(Xt.dtype)
        starts, step = _memory.pair_blocks(len(Xown), Xown[0].numel())
        poses = None
        for round_ in range(2):
            if round_ == 0:
                total = first
            else:
                identity = torch.zeros((len(first), poses.shape[1]), dtype=poses.dtype,
                                       device=dev)
                total = fast_warp(first, self._refined(target, first, identity))
            total = total * w_first[:, None, None, None]
            for s0 in starts:  # a block of copies at a time: no second copy of them
                K, at_k = Xown[s0:s0 + step], lab[s0:s0 + step]
                if round_ == 0:
                    p = self._align(target[at_k], K, copies=True)
                else:
                    p = self._refined(target[at_k], K, poses[s0:s0 + step])
                if poses is None:
                    poses = p.new_empty((len(Xown), p.shape[1]))
                poses[s0:s0 + len(K)] = p
                total.index_add_(0, at_k, fast_warp(K, p) * w_own[s0:s0 + step, None, None, None])
            target = total
        return multi, target, poses

    def _refined(self, Q, K, start, copies=True):
        """:meth:`_align`, refined from the alignments ``start`` instead of the grid's where
        they lie within the range searched (the grid search elsewhere, and where the fit does
        not refine)."""
        refine_grid = self._refine_grid(copies)
        if not (refine_grid.refine and any(refine_grid.free)):
            return self._align(Q, K, copies=copies)
        start = start.to(Q.dtype)
        inside = (start[:, 1:3].abs() <= float(refine_grid.max_translation)).all(1)
        if float(refine_grid.max_rotation) < 180.0:
            inside &= start[:, 0].abs() <= float(refine_grid.max_rotation)
        rows = torch.nonzero(inside).flatten()
        p = start.clone()
        _, p[rows] = refine_pairs(Q, K, rows, rows, start[rows], refine_grid)
        outside = torch.nonzero(~inside).flatten()
        if len(outside):
            p[outside] = self._align(Q[outside], K[outside], copies=copies)
        return p

    def _align(self, Q, K, copies=False):
        """The alignments ``(m, 3)`` that warp each image of ``K`` onto the image of ``Q`` in
        its row: the grid search, then the refinement (``refine``; with ``copies``, within the
        range two copies of one image span, :func:`~invariant_cluster._shapes.copy_grid`)."""
        return align(Q, K, self._grid(refine=False), self._refine_grid(copies), self.batch_size)

    def _refine_grid(self, copies):
        """The refinement's grid (``refine``), with ``copies`` within the range two copies of
        one image span."""
        refine_grid = self._grid(self.refine)
        return copy_grid(refine_grid) if copies else refine_grid

    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit and return ``labels_`` (``sample_weight``: as in :meth:`fit`)."""
        return self.fit(X, sample_weight=sample_weight).labels_

    # ------------------------------------------------------------------ predict / transform
    def _distances_to_centers(self, X):
        check_is_fitted(self)
        X2, _ = self._centred(self._validate(X, reset=False))
        dev = resolve_device(self.device)
        with thread_limit(self.n_jobs), torch.no_grad():
            Xt = self._framed(self._filtered(
                self._tensor(X2.astype(self.cluster_centers_.dtype, copy=False), dev)))
            C = self._framed(self._tensor(self.cluster_centers_, dev))
            # the samples are warped onto the centres, as in alignments_
            D, _ = all_pairs(C, Xt, self._grid(self.refine), batch_size=self.batch_size)
        return D.T.cpu().numpy().astype(X2.dtype)

    @property
    def _n_features_out(self):
        """Columns of ``transform`` (one per cluster), for ``get_feature_names_out``."""
        return self.n_clusters_

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

    @reusing_heap
    def predict(self, X):
        """The cluster most common among the ``n_neighbors`` invariant nearest fitted images.

        As scikit-learn's ``KNeighborsClassifier`` with ``labels_`` as targets (ties: the label
        of the nearer neighbours): a cluster follows the shape of the kNN graph, which one
        centre per cluster cannot. An image stored several times is one neighbour that votes
        as often as it is stored, so the data stored twice predict as the data once.
        ``transform`` gives the distances to the centres.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        check_is_fitted(self)
        return self._vote(self._centred(self._validate(X, reset=False))[0])

    def _vote(self, X2):
        """:meth:`predict` of the validated, centred images ``X2``."""
        dev = resolve_device(self.device)
        fit_X = self._fit_X
        k = int(min(self.n_neighbors, len(fit_X)))
        with thread_limit(self.n_jobs), torch.no_grad():
            Xq = self._framed(self._filtered(self._tensor(X2.astype(fit_X.dtype, copy=False),
                                                          dev)))
            grid = self._grid(refine=False)
            plan = self._plan(len(fit_X), grid, k, dev, n_queries=Xq.shape[0])
            Xf = self._framed(self._filtered(self._tensor(fit_X, dev)))
            _, idx, _ = knn_search(Xq, Xf, grid, k,
                                   plan=plan, batch_size=self.batch_size, client=self.client)
        return vote(self._fit_labels, idx.cpu().numpy(), self._fit_weights)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags


def _check_sample_weight(sample_weight, n):
    """``sample_weight`` as float64 ``(n,)`` (None where it is None): finite, non-negative,
    one of them positive."""
    if sample_weight is None:
        return None
    if isinstance(sample_weight, numbers.Number) and not isinstance(sample_weight, bool):
        sample_weight = np.full(n, sample_weight)
    try:
        w = np.array(sample_weight, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"sample_weight: expected an array of numbers, got "
                        f"{type(sample_weight).__name__}") from e
    if w.shape != (n,):
        raise ValueError(f"sample_weight: expected shape ({n},), one weight per sample of X, "
                         f"got {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("sample_weight: expected finite weights, got NaN or infinity")
    if (w < 0).any():
        raise ValueError(f"sample_weight: expected non-negative weights, got {w.min():g}")
    if not (w > 0).any():
        raise ValueError("sample_weight: expected at least one positive weight, got every "
                         "weight zero")
    return w


class _Grouped(NamedTuple):
    """What the grouping stage gives: the labels of the fit's rows (largest cluster first),
    the squared distances of the grouped graph (each cluster's densest member), and the
    ``graph_`` and ``count_rule_`` it reports."""

    labels: np.ndarray
    distances: torch.Tensor
    graph: str
    count_rule: str


@dataclass
class _Rows:
    """How the samples map to the rows the fit works on, and back.

    The fit works on the distinct images, in an order set by their content
    (``distinct_samples``: the sample each one is; ``inverse``: each sample's distinct image),
    and of those on one representative of each group of near duplicates
    (``representatives``: the distinct images kept, increasing; ``row_of_distinct``: each
    distinct image's row among them, its representative's for a near duplicate; ``own``: the
    near duplicates, which keep their own pose). Without near duplicates every distinct image
    is a row.
    """

    distinct_samples: np.ndarray
    inverse: np.ndarray
    representatives: np.ndarray
    row_of_distinct: np.ndarray
    own: np.ndarray

    weights: np.ndarray | None = None

    @classmethod
    def distinct(cls, X2, weights=None):
        """The rows of the distinct rows of ``X2``, in an order set by their content; each
        sample standing for ``weights`` samples (None: one)."""
        first, inverse = unique_in_canonical_order(X2)
        return cls(first, inverse, np.arange(len(first)), np.arange(len(first)),
                   np.zeros(0, np.int64), weights)

    def reordered(self, order):
        """The distinct images taken in ``order`` (before any representative is chosen)."""
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return replace(self, distinct_samples=self.distinct_samples[order],
                       inverse=rank[self.inverse])

    def with_representatives(self, dup):
        """The rows once each distinct image ``i`` is represented by ``dup[i]`` (itself, or
        the distinct image it is a near duplicate of)."""
        rep = np.unique(dup)
        core = np.zeros(self.n_distinct, dtype=np.int64)
        core[rep] = np.arange(len(rep))
        return replace(self, representatives=rep, row_of_distinct=core[dup],
                       own=np.flatnonzero(dup != np.arange(len(dup))))

    @property
    def n_samples(self):
        return len(self.inverse)

    @property
    def n_distinct(self):
        return len(self.distinct_samples)

    @property
    def n_rows(self):
        return len(self.representatives)

    @cached_property
    def rows_of_samples(self):
        """Each sample's row in the fit's arrays."""
        return self.row_of_distinct[self.inverse]

    @cached_property
    def sizes(self):
        """The samples each row stands for (NumPy: int64, float64 with ``weights``)."""
        return np.bincount(self.rows_of_samples, weights=self.weights, minlength=self.n_rows)

    @cached_property
    def stored(self):
        """The samples each distinct image stands for, how often it is stored (float64)."""
        return np.bincount(self.inverse, weights=self.weights,
                           minlength=self.n_distinct).astype(np.float64)

    def by_size(self, labels):
        """Each sample's label of ``labels`` (one per row, ``0..K-1``), numbered by decreasing
        size in samples (ties: the lower label; the rows' order is set by their content, so
        the numbering does not depend on the order of the samples)."""
        own = labels[self.rows_of_samples]
        size = np.bincount(own, weights=self.weights, minlength=int(labels.max()) + 1)
        order = np.lexsort((np.arange(size.size), -size))
        number = np.empty(size.size, dtype=np.int64)
        number[order] = np.arange(size.size)
        return number[own]

    def counts(self, Xt):
        """The samples each row stands for (a tensor like ``Xt``'s), None where each stands
        for one: a representative of duplicates weighs as all its copies."""
        if self.weights is None and self.n_rows >= self.n_samples:
            return None
        return torch.as_tensor(self.sizes, device=Xt.device, dtype=Xt.dtype)

    def to_samples(self, values, own_values=None):
        """Each sample's row of ``values`` (one per row); with ``own_values`` (one per near
        duplicate, in the order of ``own``), a near duplicate's own row instead."""
        if own_values is None:
            return values[self.rows_of_samples]
        return _per_sample(values, self.rows_of_samples,
                           _rows_of(self.own, self.n_distinct, self.inverse), own_values)

    def original(self, row_indices):
        """Indices of rows (such as the kNN graph's neighbours) as samples of the input: each
        row's representative's original."""
        return self.distinct_samples[self.representatives][row_indices]

_GATHER_ROWS = 4096


def _gather_rows_in_place(X, rows):
    """``X[rows]`` written into the first ``len(rows)`` rows of ``X`` and returned as a view:
    ``rows`` is increasing, so ``rows[j] >= j`` and no row is overwritten before it is read.
    One block of rows is held at a time instead of a copy of all."""
    if len(rows) == X.shape[0]:
        return X
    for start in range(0, len(rows), _GATHER_ROWS):
        block = torch.as_tensor(rows[start:start + _GATHER_ROWS], device=X.device)
        X[start:start + len(block)] = X[block]
    return X[:len(rows)]


def _rows_of(own, n_distinct, inverse):
    """For each sample, its row in ``own`` (the near duplicates among the ``n_distinct``
    distinct images, ``inverse`` each sample's distinct image), -1 for the others."""
    at = np.full(n_distinct, -1, dtype=np.int64)
    at[own] = np.arange(len(own))
    return at[inverse]


def _per_sample(values, sample, own_sample, own_values):
    """Each sample's row of ``values`` (one per representative; row ``sample[i]``), a near
    duplicate's own row of ``own_values`` (row ``own_sample[i] >= 0``) instead."""
    out = values[sample]
    hit = own_sample >= 0
    if hit.any():
        out[hit] = np.asarray(own_values).reshape(-1, *out.shape[1:])[own_sample[hit]]
    return out


def _search_means(M, grid, k, plan, *, batch_size=None, client=None):
    """The kNN graph of the converged means ``M`` among all means, as the union of
    ``graph="both"`` takes it: ``(dist^2, index)``, self left out.

    ``plan``: the means' search plan (``purpose="means"``: no pass over the neighbours'
    neighbours, ``max(4 k, 64)`` candidates; see ``search.plan.HOP_NEIGHBORS``).
    ``benchmarks/bench_noise.py`` runs this same search for its union rows.
    """
    n = M.shape[0]
    D, idx, _ = knn_search(M, M, grid, k, plan=plan, batch_size=batch_size,
                           exclude=torch.arange(n, device=M.device), client=client)
    return D, idx


def _finite_dist(D):
    """Distances (not squared) of a kNN search as float64 NumPy, missing neighbours at 0."""
    d = D.clamp(min=0).sqrt().cpu().numpy().astype(np.float64)
    return np.where(np.isfinite(d), d, 0.0)


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
