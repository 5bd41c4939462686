"""The invariant k-nearest-neighbour graph as a scikit-learn transformer.

:class:`InvariantKNeighborsTransformer` follows the contract of scikit-learn's
:class:`~sklearn.neighbors.KNeighborsTransformer`: ``transform`` returns a sparse CSR graph
``(n_queries, n_samples_fit)`` whose rows hold the distances to the nearest fitted images, so
every estimator that accepts ``metric="precomputed"`` (t-SNE, Isomap, spectral clustering, DBSCAN,
HDBSCAN, umap-learn's UMAP) can consume it in a :class:`~sklearn.pipeline.Pipeline`. The only
difference is the distance: the invariant Euclidean distance ``sqrt(min_tau ||x - T_tau y||^2)``
over rotations and translations. :func:`invariant_kneighbors_graph` is the function twin, as
:func:`~sklearn.neighbors.kneighbors_graph` is scikit-learn's.

The searches themselves live in :mod:`invariant_cluster.alignment` (exact grid search,
refinement) and :mod:`invariant_cluster.neighbors` (descriptor shortlist, dask blocks); this
module only composes them.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
from scipy import sparse
from sklearn import get_config
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.validation import check_is_fitted

from . import _memory
from ._dask import DaskClientMixin
from ._estimator import (
    ENGINE_CONSTRAINTS,
    ROTATION_CENTER_CONSTRAINTS,
    SE2SearchMixin,
    shift_params,
)
from ._heap import reusing_heap
from ._utils import resolve_device, to_tensor
from .search import knn_search, make_search_plan, refine_pairs
from .transforms import compose_se2

__all__ = ["InvariantKNeighborsTransformer", "invariant_kneighbors_graph", "symmetrize_graph",
           "csr_graph"]

# The searches, their exact/shortlist threshold and the shortlist length (8 k here, twice the
# clusterer's) are the engine's (invariant_cluster.search; the plan's purpose "graph").
# With refinement, the n_neighbors + 1 nearest keys on the grid (what the graph holds) are
# refined and re-sorted (why not more: docs/design/defaults.rst).


def csr_graph(data, ind, n_fit):
    """The sparse ``(n_queries, n_fit)`` graph of a kNN search, ``k`` entries per row
    (``data[i, j]`` at column ``ind[i, j]``), in the sparse interface scikit-learn is set to
    (``csr_matrix``, or ``csr_array`` under ``sklearn.set_config(sparse_interface=...)``)."""
    n_q, k = ind.shape
    indptr = np.arange(0, n_q * k + 1, k)
    A = sparse.csr_array((np.ravel(data), np.ravel(ind), indptr), shape=(n_q, n_fit))
    if get_config().get("sparse_interface", "spmatrix") == "spmatrix":
        A = sparse.csr_matrix(A)
    return A


def _identity_check(Q, K, qi, ind, D, P, max_elements=None):
    """Keep the identity where it is at least as close as the search's answer.

    Maintenance note: the identity is on every grid, but the grid distance
    ``||x||^2 + ||y||^2 - 2 <x, y>`` and a bilinear warp by the identity are exact only up to
    round-off, so a training image would be its own neighbour at ~1e-6 instead of 0. The
    plain residual ``||x - y||^2`` of each kept pair (chunked, ``O(max_elements)`` memory)
    restores exact zeros and never increases a distance.
    """
    if max_elements is None:
        max_elements = _memory.IDENTITY_CHECK_ELEMENTS
    n_q, kk = ind.shape
    flat_j = ind.reshape(-1)
    D = D.reshape(-1).clone()
    P = P.reshape(-1, P.shape[-1]).clone()
    chunk = max(1, max_elements // max(1, Q[0].numel()))
    for p0 in range(0, flat_j.shape[0], chunk):
        sl = slice(p0, p0 + chunk)
        e = ((Q[qi[sl]] - K[flat_j[sl]]) ** 2).reshape(-1, Q[0].numel()).sum(1)
        better = e <= D[sl]
        D[sl] = torch.where(better, e, D[sl])
        P[sl] = torch.where(better[:, None], torch.zeros_like(P[sl]), P[sl])
    return D.reshape(n_q, kk), P.reshape(n_q, kk, -1)


class InvariantKNeighborsTransformer(DaskClientMixin, SE2SearchMixin,
                                     ClassNamePrefixFeaturesOutMixin, TransformerMixin,
                                     BaseEstimator):
    """Transform images into the sparse graph of their invariant k nearest neighbours.

    The graph has the contract of :class:`sklearn.neighbors.KNeighborsTransformer`, with the
    invariant Euclidean distance

    ``d(x, y) = sqrt(min_tau ||x - T_tau y||^2)``

    over the rotations and translations ``tau`` of the search grid (then refined), so that any
    estimator accepting ``metric="precomputed"`` can follow it in a pipeline.

    Parameters
    ----------
    mode : {"distance", "connectivity"}, default="distance"
        "distance": the entries are invariant distances; "connectivity": ones. As in
        scikit-learn, "distance" computes one extra neighbour, so that each training sample can
        be its own (first, zero-distance) neighbour: rows then hold ``n_neighbors + 1`` entries.
    n_neighbors : int, default=5
        Neighbours per sample in the graph (plus one in "distance" mode).
    group : {"se2", "rotation", "translation", "none"}, default="se2"
        The transformations searched; "none" gives plain Euclidean distances.
    max_rotation : float, default=180.0
        Angles are searched within ``+-max_rotation`` degrees (180: the full circle).
    n_rotations : int, default=36
        Grid angles (0 is always on the grid). At most
        :func:`~invariant_cluster.alignment.rotation_limit` (the angles the image size can tell
        apart, at least 360); more get a ``ValueError``.
    max_translation : float, default=0
        Integer shifts within ``+-max_translation`` pixels are searched, then refined.
    refine : bool, default=True
        Refine the best grid transformation of each kept pair continuously (angle, sub-pixel
        shift): the ``n_neighbors + 1`` nearest keys on the grid get their refined distances
        and are re-sorted (refinement lowers distances and may reorder neighbours; the keys
        are the grid's nearest).
    neighbor_search : {"auto", "exact", "shortlist"}, default="auto"
        "exact": every fitted image is aligned onto every query
        (:func:`~invariant_cluster.alignment.grid_search`). "shortlist": rotation-steerable
        descriptors shortlist ``n_candidates`` fitted images per query and only those are
        aligned exactly (:func:`~invariant_cluster.neighbors.neighbor_search`; recall of the
        exact top-k measured in ``benchmarks/bench_neighbors.py``). "auto": exact while
        ``n_samples_fit x`` (grid size) is at most ``4000 x 36`` on a CPU (five times that on
        a GPU), else the shortlist; the choice is recorded in ``search_plan_``.
    n_candidates : int, optional
        Shortlist length (None: ``max(8 k, 64)`` for ``k`` searched neighbours, ``k`` =
        ``n_neighbors + 1``).
    image_shape : tuple (H, W) or (C, H, W), optional
        How to fold flat rows; None means square single-channel images (a non-square row is a
        ``1 x n_features`` image).
    device : {"auto", "cpu", "cuda", ...}, default="auto"
        Where the search runs ("auto": CUDA when available). Fitted attributes stay NumPy.
    batch_size : int, optional
        Queries per block of the search, exact or of the shortlist's candidates; None sizes
        blocks from the available memory. Memory is
        ``O(n_queries k)`` plus one block, never ``n_queries x n_samples_fit``.
    client : dask.distributed.Client, optional
        Run the blocks of the search on a dask cluster (identical results).
    reflection : bool, default=False
        Also search the mirror images of the fitted images (the group E(2) = SE(2) x
        {identity, mirror}; the mirror is a horizontal flip about the image centre, applied
        before the rotation, see :mod:`invariant_cluster.transforms`): twice the search's cost.
        In cryo-EM, the projection from the opposite direction is a mirror image. The
        alignments of :meth:`kneighbors` then have a 4th column, the mirror bit.
    center : bool or "auto", default=False
        Shift every image (fitted or queried) so that the centre of mass of its positive part
        lies at the image centre before the search, which then need only cover the shifts the
        centring leaves: for shapes that move on an empty background, whose copies shifted
        within ``+-s`` pixels differ by up to ``s (1 + sqrt(2))`` pixels per axis. The
        distances are those of the centred images; the alignments of :meth:`kneighbors` warp
        the images as given. The centring interpolates each image once (bilinear), which smooths
        its finest detail and its noise. "auto" decides from the fitted images as
        :class:`~invariant_cluster.InvariantAttentionClusterer`'s default does (``center_``
        says what the fit did). Off by default: the graph's distances are then the grid's
        minimum over the images as given.
    rotation_center : {"geometric", "fourier"}, default="geometric"
        The centre of rotations and mirrors: the geometric centre ``((W - 1) / 2, (H - 1) / 2)``,
        or the pixel ``(W // 2, H // 2)`` about which cryo-EM particles are rotated (the same
        pixel on odd sizes). The alignments of :meth:`kneighbors` turn about it:
        ``warp_se2(y, tau, rotation_center=...)``. See :ref:`parameters-rotation-center`.

    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during ``fit``.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names seen in ``fit``; set only when ``X`` has column names that are all
        strings (a data frame).
    center_ : bool
        Whether the images are centred on their centres of mass (``center``).
    n_samples_fit_ : int
        Number of fitted images (the number of columns of the graph).
    search_plan_ : SearchPlan
        How the graph of the fitted images (``kneighbors()``, ``fit_transform``) is searched,
        from the sizes and the device (:func:`~invariant_cluster.neighbors.make_search_plan`);
        queries given to ``transform`` get the plan of their own size.
    image_shape_ : tuple (C, H, W)
        How rows are folded into images.

    See Also
    --------
    invariant_kneighbors_graph : The function twin.
    sklearn.neighbors.KNeighborsTransformer : The same graph with Euclidean distances.
    invariant_cluster.invariant_distances : All pairwise invariant squared distances.

    Notes
    -----
    Direction: the query ``x`` stays fixed and the fitted image ``y`` is warped onto it, so the
    alignment ``tau`` returned by :meth:`kneighbors` satisfies
    ``warp_se2(y, tau, rotation_center=rotation_center) ~ x`` (angle in degrees,
    counter-clockwise as displayed; ``tx, ty`` in pixels; see
    :mod:`invariant_cluster.transforms`). For rotations over the full circle and no translation,
    ``d(x, y) = d(y, x)`` up to interpolation and the grid; with translations the zero padding
    makes it only approximately symmetric, and the graph (as any kNN graph) is not
    symmetric. Grid distances are ``||x||^2 + ||T y||^2 - 2 <x, T y>`` clamped at 0, refined
    ones come from the residual; the square root is taken last.

    Cost: the exact search is ``n_queries x n_samples_fit x`` (grid size) warped inner
    products in blocked matrix products; the shortlist makes the exact part linear in
    ``n_samples_fit``.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import InvariantKNeighborsTransformer
    >>> rng = np.random.default_rng(0)
    >>> X = rng.random((6, 8, 8))
    >>> X_rot = np.rot90(X, k=1, axes=(1, 2))           # each image turned by a quarter
    >>> knn = InvariantKNeighborsTransformer(n_neighbors=1, group="rotation", n_rotations=4)
    >>> G = knn.fit(X).transform(X_rot.reshape(6, -1))
    >>> G.shape, G.nnz                                   # n_neighbors + 1 entries per row
    ((6, 6), 12)
    >>> dist, ind = knn.kneighbors(X_rot.reshape(6, -1), n_neighbors=1)
    >>> ind.ravel().tolist(), bool(dist.max() < 1e-3)
    ([0, 1, 2, 3, 4, 5], True)
    """

    _parameter_constraints: dict = {
        **SE2SearchMixin._parameter_constraints,
        **ENGINE_CONSTRAINTS,
        **ROTATION_CENTER_CONSTRAINTS,
        "mode": [StrOptions({"distance", "connectivity"})],
        "center": ["boolean", StrOptions({"auto"})],
    }

    def __init__(self, *, mode="distance", n_neighbors=5, group="se2", max_rotation=180.0,
                 n_rotations=36, max_translation=0, refine=True, neighbor_search="auto",
                 n_candidates=None, image_shape=None, device="auto", batch_size=None,
                 client=None, reflection=False, center=False, rotation_center="geometric"):
        self.mode = mode
        self.n_neighbors = n_neighbors
        self.group = group
        self.max_rotation = max_rotation
        self.n_rotations = n_rotations
        self.max_translation = max_translation
        self.refine = refine
        self.neighbor_search = neighbor_search
        self.n_candidates = n_candidates
        self.image_shape = image_shape
        self.device = device
        self.batch_size = batch_size
        self.client = client
        self.reflection = reflection
        self.center = center
        self.rotation_center = rotation_center

    # ------------------------------------------------------------------ fit
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Store the images the neighbours are searched among.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)
            Training images. Integers (``uint8`` included) and bools are taken at their
            values in float32, not rescaled (the distances are in the units of ``X``).
        y : Ignored

        Returns
        -------
        self : object
        """
        X2, self._fit_offsets = self._centred(self._validate(X, reset=True), reset=True)
        grid = self._grid(self.refine)  # validates the search parameters now, not at transform
        dev = resolve_device(self.device)
        self._fit_X = np.array(X2, copy=True)
        self.n_samples_fit_ = int(X2.shape[0])
        self._n_features_out = self.n_samples_fit_
        # the plan of the graph of the fitted images (kneighbors(), fit_transform)
        _, self.search_plan_ = self._search_plan(grid, self.n_samples_fit_, self.n_neighbors,
                                                 dev, exclude_self=True)
        return self

    def _search_plan(self, grid, n_queries, k, device, *, exclude_self):
        """``(k_search, plan)``: the neighbours searched for ``k`` kept, and the search plan of
        ``n_queries`` queries against the fitted images. With refinement the pool depends on
        the constructor's n_neighbors, not on k, so that the graphs of one estimator agree on
        their common prefix whatever k is asked for (connectivity with k, distance with k + 1,
        kneighbors() without self)."""
        k_search = k
        if grid.refine and any(grid.free):
            pool = max(k, self.n_neighbors + 1 - (1 if exclude_self else 0))
            k_search = min(self.n_samples_fit_ - (1 if exclude_self else 0), pool)
        plan = make_search_plan(n_queries, self.n_samples_fit_, grid.size, k_search,
                                device=device, method=self.neighbor_search,
                                n_candidates=self.n_candidates, purpose="graph",
                                self_search=exclude_self)
        return k_search, plan

    # ------------------------------------------------------------------ search
    @reusing_heap
    def _kneighbors(self, Q2, k, exclude_self):
        """``(dist, ind, tau)`` NumPy arrays of the ``k`` nearest fitted images of each row."""
        dev = resolve_device(self.device)
        grid = self._grid(self.refine)
        dtype = torch.float64 if np.float64 in (Q2.dtype, self._fit_X.dtype) else torch.float32
        K = self._framed(torch.as_tensor(self._fit_X).to(device=dev, dtype=dtype).reshape(
            -1, *self.image_shape_))
        Q = K if exclude_self else self._framed(to_tensor(Q2).to(
            device=dev, dtype=dtype).reshape(-1, *self.image_shape_))
        n_q = Q.shape[0]
        exclude = torch.arange(n_q, device=dev) if exclude_self else None
        refine = grid.refine and any(grid.free)
        k_search, plan = self._search_plan(grid, n_q, k, dev, exclude_self=exclude_self)
        with torch.no_grad():
            D, ind, P = knn_search(Q, K, grid, k_search, plan=plan, batch_size=self.batch_size,
                                   exclude=exclude, client=self.client)
            qi = torch.arange(n_q, device=dev).repeat_interleave(ind.shape[1])
            if refine and n_q:
                d, p = refine_pairs(Q, K, qi, ind.reshape(-1), P.reshape(-1, P.shape[-1]), grid)
                D, P = d.reshape(n_q, -1), p.reshape(n_q, -1, P.shape[-1])
            D, P = _identity_check(Q, K, qi, ind, D, P)
            order = torch.argsort(D, dim=1, stable=True)[:, :k]
            D, ind = D.gather(1, order), ind.gather(1, order)
            P = P.gather(1, order[..., None].expand(-1, -1, P.shape[-1]))
        np_dtype = np.float64 if dtype == torch.float64 else np.float32
        dist = np.sqrt(np.clip(D.cpu().numpy(), 0.0, None)).astype(np_dtype, copy=False)
        return dist, ind.cpu().numpy().astype(np.intp), P.cpu().numpy().astype(np.float64)

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True,
                   return_alignments=False):
        """The invariant nearest fitted images of each query, as ``NearestNeighbors`` has it.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features), (n, H, W) or (n, C, H, W), optional
            Query images. None: the fitted images, each NOT counted as its own neighbour.
        n_neighbors : int, optional
            Neighbours per query (default: the constructor's ``n_neighbors``).
        return_distance : bool, default=True
            Return the invariant distances.
        return_alignments : bool, default=False
            Also return the ``(angle, tx, ty)`` that warps each neighbour onto its query:
            ``warp_se2(fitted[ind[i, j]], tau[i, j])`` approximates ``X[i]``; with
            ``reflection=True`` a 4th column, the mirror bit (1: the neighbour is flipped
            horizontally about its centre before the rotation).

        Returns
        -------
        neigh_dist : ndarray of shape (n_queries, n_neighbors)
            Invariant distances, ascending along each row (only with ``return_distance``).
        neigh_ind : ndarray of shape (n_queries, n_neighbors)
            Indices of the neighbours among the fitted images.
        tau : ndarray of shape (n_queries, n_neighbors, 3) or (n_queries, n_neighbors, 4)
            Angle in degrees, ``tx``, ``ty`` in pixels, and the mirror bit with
            ``reflection=True`` (only with ``return_alignments``).
        """
        check_is_fitted(self)
        if n_neighbors is None:
            n_neighbors = self.n_neighbors
        if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, numbers.Integral):
            raise TypeError(f"n_neighbors: expected an int >= 1, got {n_neighbors!r}")
        if n_neighbors < 1:
            raise ValueError(f"n_neighbors: expected an int >= 1, got {n_neighbors!r}")
        query_is_train = X is None
        if query_is_train:
            Q2, offsets = self._fit_X, self._fit_offsets
        else:
            Q2, offsets = self._centred(self._validate(X, reset=False))
        n_fit = self.n_samples_fit_
        limit = n_fit - 1 if query_is_train else n_fit
        if n_neighbors > limit:
            relation = "n_neighbors < n_samples_fit" if query_is_train else \
                "n_neighbors <= n_samples_fit"
            raise ValueError(
                f"n_neighbors: expected {relation}, but n_neighbors = {n_neighbors}, "
                f"n_samples_fit = {n_fit}, n_samples = {Q2.shape[0]}"
            )
        dist, ind, tau = self._kneighbors(Q2, int(n_neighbors), query_is_train)
        out = (dist, ind) if return_distance else (ind,)
        if return_alignments:
            if offsets is not None:
                # T_(0, d_i) T_tau T_(0, -d_j): centre the neighbour, un-centre onto the query
                to_i = shift_params(offsets)[:, None]
                from_j = shift_params(-self._fit_offsets)[ind]
                full = compose_se2(np.broadcast_to(to_i, from_j.shape), compose_se2(tau, from_j))
                tau = full[..., :tau.shape[-1]]
            out = (*out, tau)
        return out if len(out) > 1 else out[0]

    def kneighbors_graph(self, X=None, n_neighbors=None, mode="connectivity"):
        """The sparse graph of the invariant k nearest neighbours (CSR).

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features), (n, H, W) or (n, C, H, W), optional
            Query images; None: the fitted images, each not its own neighbour.
        n_neighbors : int, optional
            Entries per row (default: the constructor's ``n_neighbors``).
        mode : {"connectivity", "distance"}, default="connectivity"
            Ones, or the invariant distances.

        Returns
        -------
        A : sparse matrix of shape (n_queries, n_samples_fit)
            ``n_neighbors`` explicit entries per row, sorted by distance within the row.
        """
        if mode not in ("connectivity", "distance"):
            raise ValueError(f"mode: expected 'connectivity' or 'distance', got {mode!r}")
        check_is_fitted(self)
        dist, ind = self.kneighbors(X, n_neighbors, return_distance=True)
        data = np.ones(ind.size) if mode == "connectivity" else dist
        return csr_graph(data, ind, self.n_samples_fit_)

    def transform(self, X):
        """The invariant neighbour graph of ``X`` among the fitted images.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features), (n, H, W) or (n, C, H, W)

        Returns
        -------
        Xt : sparse matrix of shape (n_queries, n_samples_fit)
            CSR; ``n_neighbors + 1`` entries per row in "distance" mode (a training image is
            its own first neighbour at distance 0), ``n_neighbors`` in "connectivity" mode.
        """
        check_is_fitted(self)
        add_one = self.mode == "distance"
        return self.kneighbors_graph(X, mode=self.mode, n_neighbors=self.n_neighbors + add_one)

    def fit_transform(self, X, y=None):
        """``fit(X).transform(X)``, for the ``X`` and ``y`` of :meth:`fit`.

        Returns
        -------
        Xt : sparse matrix of shape (n_samples, n_samples)
        """
        return self.fit(X).transform(X)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.input_tags.sparse = False
        return tags


def invariant_kneighbors_graph(X, n_neighbors, *, mode="connectivity", include_self=False,
                               **params):
    """The graph of the invariant k nearest neighbours of each image, as ``kneighbors_graph``.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W), or a fitted
        :class:`InvariantKNeighborsTransformer`
        The images (or a transformer fitted on them).
    n_neighbors : int
        Neighbours per image.
    mode : {"connectivity", "distance"}, default="connectivity"
        Ones, or the invariant distances ``sqrt(min_tau ||x_i - T_tau x_j||^2)``.
    include_self : bool or "auto", default=False
        Whether each image is its own first neighbour ("auto": True for "connectivity").
    **params
        Parameters of :class:`InvariantKNeighborsTransformer` (``group``, ``max_rotation``,
        ``n_rotations``, ``max_translation``, ``refine``, ``neighbor_search``, ...), when ``X``
        is an array.

    Returns
    -------
    A : sparse matrix of shape (n_samples, n_samples)
        CSR, ``n_neighbors`` entries per row sorted by distance; entry ``(i, j)`` says that the
        image ``j``, warped onto ``i``, is among ``i``'s nearest.

    See Also
    --------
    InvariantKNeighborsTransformer : The transformer, with ``kneighbors`` and the alignments.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import invariant_kneighbors_graph
    >>> x = np.random.default_rng(0).random((2, 8, 8))
    >>> X = np.concatenate([x, np.rot90(x, k=2, axes=(1, 2))])   # 0, 1, 0 turned, 1 turned
    >>> A = invariant_kneighbors_graph(X, 1, group="rotation", n_rotations=4)
    >>> A.indices.tolist()
    [2, 3, 0, 1]
    """
    if include_self not in (True, False, "auto"):
        raise ValueError(f"include_self: expected True, False or 'auto', got {include_self!r}")
    if include_self == "auto":
        include_self = mode == "connectivity"
    if isinstance(X, InvariantKNeighborsTransformer):
        if params:
            raise ValueError(f"params: a fitted transformer was given, so {sorted(params)} "
                             "cannot be applied")
        est = X
        check_is_fitted(est)
    else:
        est = InvariantKNeighborsTransformer(n_neighbors=n_neighbors, **params).fit(X)
    query = est._fit_X if include_self else None
    return est.kneighbors_graph(query, n_neighbors=n_neighbors, mode=mode)


def symmetrize_graph(graph):
    """The union of a neighbour graph and its transpose, keeping the smaller of two distances.

    A kNN graph is not symmetric (``j`` among ``i``'s nearest does not make ``i`` among
    ``j``'s), and the invariant distance is only approximately symmetric (interpolation and
    the grid). Some ``metric="precomputed"`` consumers require a symmetric sparse matrix:
    scikit-learn's :class:`~sklearn.cluster.HDBSCAN` and umap-learn's ``UMAP``. Put this
    function in the pipeline as ``FunctionTransformer(symmetrize_graph, accept_sparse=True)``.

    Parameters
    ----------
    graph : sparse matrix of shape (n, n)
        A distance graph, as :meth:`InvariantKNeighborsTransformer.transform` returns for the
        training images (explicit zeros, such as each image's distance to itself, are kept).

    Returns
    -------
    sym : sparse matrix of shape (n, n)
        CSR, same interface (matrix or array) as the input; entry ``(i, j)`` is present when
        ``(i, j)`` or ``(j, i)`` is, with the smaller of their values; each row sorted by
        value (as scikit-learn's precomputed neighbour graphs expect).

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.sparse import csr_matrix
    >>> from invariant_cluster.kneighbors import symmetrize_graph
    >>> G = csr_matrix(np.array([[0, 2.0, 0], [1.5, 0, 3.0], [0, 0, 0]]))
    >>> symmetrize_graph(G).toarray()
    array([[0. , 1.5, 0. ],
           [1.5, 0. , 3. ],
           [0. , 3. , 0. ]])
    """
    if not sparse.issparse(graph) or graph.ndim != 2 or graph.shape[0] != graph.shape[1]:
        raise ValueError(f"graph: expected a square sparse matrix, got "
                         f"{type(graph).__name__} of shape {getattr(graph, 'shape', None)}")
    coo = graph.tocoo()
    rows = np.concatenate([coo.row, coo.col])
    cols = np.concatenate([coo.col, coo.row])
    vals = np.concatenate([coo.data, coo.data])
    # sort by (row, col, value): the first of each (row, col) run is the smaller value
    order = np.lexsort((vals, cols, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
    rows, cols, vals = rows[first], cols[first], vals[first]
    order = np.lexsort((vals, rows))  # each row sorted by value
    rows, cols, vals = rows[order], cols[order], vals[order]
    n = graph.shape[0]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    out = sparse.csr_array((vals, cols, indptr), shape=graph.shape)
    return out if isinstance(graph, sparse.sparray) else sparse.csr_matrix(out)
