"""Plots of a fitted :class:`~invariant_cluster.InvariantAttentionClusterer` and of the
kernel-PCA diagnostics.

Every function takes ``ax=None`` (None makes a new figure) and returns the Axes it drew on.
matplotlib is imported inside the functions, so importing this module costs nothing.

Images are drawn as tiles in ONE Axes, one ``AxesImage`` per image (``len(ax.images)`` is the
number of images shown), each scaled to its own grey range, with a caption above each tile.
Multi-channel images with 3 channels are drawn in colour; other channel counts as the mean over
the channels.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._plot_diagnostics import plot_eigenvector_check, plot_projection_loss

__all__ = [
    "plot_images",
    "plot_invariant_means",
    "plot_shapes",
    "plot_alignments",
    "plot_attention_weights",
    "plot_convergence",
    "plot_projection_loss",
    "plot_eigenvector_check",
]

_GAP = 0.15  # space between tiles, as a fraction of the tile size


def _new_axes(ax, figsize):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _check_fitted(estimator, attributes):
    from sklearn.utils.validation import check_is_fitted

    check_is_fitted(estimator, attributes)


def _displayable(image):
    """``(H, W)`` or ``(H, W, 3)`` in [0, 1] from a ``(C, H, W)`` or ``(H, W)`` image."""
    a = np.asarray(image, dtype=np.float64)
    if a.ndim == 3:
        a = np.moveaxis(a, 0, -1) if a.shape[0] == 3 else a.mean(0)
    lo, hi = np.nanmin(a), np.nanmax(a)
    return (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)


def _fold(X, image_shape, name):
    """``(n, C, H, W)`` images from 2-D rows or already folded arrays."""
    X = np.asarray(X)
    if X.ndim == 2:
        if image_shape is None:
            side = math.isqrt(X.shape[1])
            if side * side != X.shape[1]:
                raise ValueError(
                    f"{name}: rows of {X.shape[1]} values are not square images; pass "
                    "image_shape=(H, W) or (C, H, W)"
                )
            image_shape = (1, side, side)
        image_shape = tuple(image_shape)
        if len(image_shape) == 2:
            image_shape = (1, *image_shape)
        if math.prod(image_shape) != X.shape[1]:
            raise ValueError(
                f"image_shape: {image_shape} holds {math.prod(image_shape)} values but {name} "
                f"has {X.shape[1]} per row"
            )
        return X.reshape(X.shape[0], *image_shape)
    if X.ndim == 3:
        return X[:, None]
    if X.ndim == 4:
        return X
    raise ValueError(f"{name}: expected shape (n, n_features), (n, H, W) or (n, C, H, W), "
                     f"got {X.shape}")


def _draw_tiles(ax, images, captions, n_cols, *, cmap="gray", row_labels=None, fontsize=8):
    """Draw ``images`` (``(n, C, H, W)``) as a grid of tiles in one Axes, row-major."""
    n = len(images)
    h, w = images.shape[-2:]
    n_cols = max(1, min(n_cols, n)) if n else 1
    n_rows = max(1, math.ceil(n / n_cols))
    gx, gy = _GAP * w, (_GAP + 0.35) * h  # room for a caption above each tile
    for k in range(n):
        r, c = divmod(k, n_cols)
        x0, y0 = c * (w + gx), r * (h + gy) + 0.35 * h
        ax.imshow(_displayable(images[k]), cmap=cmap, interpolation="nearest",
                  extent=(x0, x0 + w, y0 + h, y0))
        if captions is not None:
            ax.text(x0 + w / 2, y0 - 0.05 * h, captions[k], ha="center", va="bottom",
                    fontsize=fontsize)
    ax.set_xlim(-0.5 * gx, n_cols * (w + gx) - 0.5 * gx)
    ax.set_ylim(n_rows * (h + gy), 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    if row_labels is not None:
        ax.set_yticks([r * (h + gy) + 0.35 * h + h / 2 for r in range(len(row_labels))])
        ax.set_yticklabels(row_labels)
        ax.tick_params(axis="y", length=0)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    else:
        ax.set_axis_off()
    return ax


def plot_images(images, ax=None, *, captions=None, n_cols=None, image_shape=None, cmap="gray",
                title=None):
    """Draw images as a grid of tiles in one Axes.

    Parameters
    ----------
    images : array-like of shape (n, n_features), (n, H, W) or (n, C, H, W)
    ax : matplotlib.axes.Axes, default=None
        Where to draw; None makes a new figure.
    captions : sequence of str, default=None
        One caption per image, written above it.
    n_cols : int, default=None
        Tiles per row; None: ``ceil(sqrt(n))`` up to 10.
    image_shape : tuple (H, W) or (C, H, W), default=None
        How to fold 2-D rows; None means square single-channel images.
    cmap : str, default="gray"
    title : str, default=None

    Returns
    -------
    ax : matplotlib.axes.Axes
        With one ``AxesImage`` per image (``ax.images``).

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster.plotting import plot_images
    >>> ax = plot_images(np.random.default_rng(0).random((6, 8, 8)), captions=list("abcdef"))
    >>> len(ax.images)
    6
    """
    X = _fold(images, image_shape, "images")
    if captions is not None and len(captions) != len(X):
        raise ValueError(f"captions: expected {len(X)} captions, got {len(captions)}")
    if n_cols is None:
        n_cols = min(10, max(1, math.ceil(math.sqrt(len(X)))))
    n_rows = max(1, math.ceil(len(X) / n_cols))
    ax = _new_axes(ax, (1.1 * min(n_cols, len(X) or 1) + 0.4, 1.3 * n_rows + 0.4))
    _draw_tiles(ax, X, captions, n_cols, cmap=cmap)
    if title is not None:
        ax.set_title(title)
    return ax


def plot_invariant_means(estimator, ax=None, *, n_cols=None, max_clusters=None, cmap="gray",
                         title="invariant means", captions=None):
    """Draw each cluster's invariant mean (``cluster_centers_``), captioned with its id and size.

    Parameters
    ----------
    estimator : fitted InvariantAttentionClusterer
        Uses ``cluster_centers_``, ``labels_`` and ``image_shape_``.
    ax : matplotlib.axes.Axes, default=None
        Where to draw; None makes a new figure.
    n_cols : int, default=None
        Tiles per row; None: up to 10.
    max_clusters : int, default=None
        Draw only the first (largest) clusters; None draws all.
    cmap : str, default="gray"
    title : str, default="invariant means"
    captions : sequence of str, default=None
        One caption per drawn cluster, e.g. the class most of its members belong to. None
        writes ``"c<id> (n=<size>)"``: ``c3`` is cluster 3 (an index, not a class), with its
        number of samples.

    Returns
    -------
    ax : matplotlib.axes.Axes
        One ``AxesImage`` per drawn cluster, with its caption.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import InvariantAttentionClusterer
    >>> from invariant_cluster.datasets import load_digits_images, make_transformed_copies
    >>> digits = load_digits_images()
    >>> X = np.concatenate([make_transformed_copies(digits.images[i], 6, max_rotation=180,
    ...                                             random_state=i)[0] for i in range(2)])
    >>> est = InvariantAttentionClusterer(group="rotation", random_state=0).fit(X)
    >>> from invariant_cluster.plotting import plot_invariant_means
    >>> ax = plot_invariant_means(est)
    >>> len(ax.images) == est.n_clusters_, ax.texts[0].get_text().startswith("c0 (n=")
    (True, True)
    """
    _check_fitted(estimator, ["cluster_centers_", "labels_"])
    centers = np.asarray(estimator.cluster_centers_)
    shape = getattr(estimator, "image_shape_", None)
    X = _fold(centers, shape, "cluster_centers_")
    sizes = np.bincount(np.asarray(estimator.labels_), minlength=len(X))
    k = len(X) if max_clusters is None else max(0, min(int(max_clusters), len(X)))
    X = X[:k]
    if captions is None:
        captions = [f"c{c} (n={sizes[c]})" for c in range(k)]
    else:
        captions = [str(c) for c in captions]
        if len(captions) != k:
            raise ValueError(f"captions: expected {k} captions (one per drawn cluster), got "
                             f"{len(captions)}")
    if n_cols is None:
        n_cols = min(10, max(1, k))
    n_rows = max(1, math.ceil(k / n_cols))
    ax = _new_axes(ax, (1.1 * min(n_cols, k or 1) + 0.4, 1.4 * n_rows + 0.5))
    _draw_tiles(ax, X, captions, n_cols, cmap=cmap)
    if title:
        ax.set_title(title)
    return ax


def plot_shapes(estimator, ax=None, *, max_clusters=None, max_shapes=10, cmap="gray",
                title="shapes of each cluster"):
    """Draw each cluster's shapes by their invariant means: one row per cluster.

    The picture to check before trusting a count: a row holds the shapes (groups of
    transformed copies, ``shape_means_``) the cluster joined, largest first, each captioned
    with its number of samples; a shape split across two rows, or two shapes that look alike
    in two rows, show a count to doubt.

    Parameters
    ----------
    estimator : fitted InvariantAttentionClusterer
        Uses ``shape_means_``, ``shape_labels_``, ``labels_`` and ``image_shape_``.
    ax : matplotlib.axes.Axes, default=None
    max_clusters : int, default=None
        Draw only the first (largest) clusters; None draws all.
    max_shapes : int, default=10
        Shapes drawn per cluster (its largest).
    cmap : str, default="gray"
    title : str, default="shapes of each cluster"

    Returns
    -------
    ax : matplotlib.axes.Axes
        One ``AxesImage`` per drawn shape; the rows are labelled ``c<id> (<shapes> shapes)``.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import InvariantAttentionClusterer
    >>> from invariant_cluster.datasets import load_digits_images, make_transformed_copies
    >>> digits = load_digits_images()
    >>> X = np.concatenate([make_transformed_copies(digits.images[i], 6, max_rotation=180,
    ...                                             random_state=i)[0] for i in range(2)])
    >>> est = InvariantAttentionClusterer(group="rotation", random_state=0).fit(X)
    >>> from invariant_cluster.plotting import plot_shapes
    >>> ax = plot_shapes(est)
    >>> len(ax.images) == est.n_shapes_
    True
    """
    _check_fitted(estimator, ["shape_means_", "shape_labels_", "labels_"])
    if not isinstance(max_shapes, numbers.Integral) or max_shapes < 1:
        raise ValueError(f"max_shapes: expected a positive integer, got {max_shapes!r}")
    shape = getattr(estimator, "image_shape_", None)
    means = _fold(np.asarray(estimator.shape_means_), shape, "shape_means_")
    shapes = np.asarray(estimator.shape_labels_)
    labels = np.asarray(estimator.labels_)
    n_clusters = int(labels.max()) + 1
    k = n_clusters if max_clusters is None else max(0, min(int(max_clusters), n_clusters))
    copies = np.bincount(shapes, minlength=len(means))
    # each shape's cluster (all its samples share one)
    cluster_of = np.zeros(len(means), dtype=np.int64)
    cluster_of[shapes] = labels
    rows, captions, row_labels = [], [], []
    n_cols = 1
    for c in range(k):
        members = np.flatnonzero(cluster_of == c)
        members = members[np.argsort(-copies[members], kind="stable")]
        n_cols = max(n_cols, min(int(max_shapes), len(members)))
        rows.append(members[:max_shapes])
        row_labels.append(f"c{c} ({len(members)} shapes)")
    tiles, blank = [], np.zeros_like(means[:1])
    for members in rows:
        for j in range(n_cols):
            if j < len(members):
                tiles.append(means[members[j]:members[j] + 1])
                captions.append(f"n={copies[members[j]]}")
            else:
                tiles.append(None)
                captions.append("")
    ax = _new_axes(ax, (1.1 * n_cols + 1.6, 1.4 * max(1, k) + 0.5))
    drawn = [t for t in tiles if t is not None]
    if drawn:
        grid = np.concatenate([blank if t is None else t for t in tiles])
        _draw_tiles(ax, grid, captions, n_cols, cmap=cmap, row_labels=row_labels)
        # the blank tiles drawn to square the grid are taken out again
        for image, t in zip(list(ax.images), tiles):
            if t is None:
                image.remove()
    if title:
        ax.set_title(title)
    return ax


def _pick_per_cluster(labels, n):
    """Up to ``n`` sample indices, taken round-robin over the clusters (largest first)."""
    groups = [list(np.flatnonzero(labels == c)) for c in range(int(labels.max()) + 1)]
    out = []
    while len(out) < n and any(groups):
        for g in groups:
            if g and len(out) < n:
                out.append(g.pop(0))
    return np.array(out, dtype=np.int64)


def plot_alignments(estimator, X, n=8, ax=None, *, indices=None, cmap="gray",
                    title="alignments"):
    """Draw samples next to their aligned versions and their cluster's invariant mean.

    Column ``j`` shows sample ``i = indices[j]``: the original ``X[i]`` (top row),
    ``warp_se2(X[i], estimator.alignments_[i])``, i.e. the sample moved into its cluster
    centre's pose (middle row), and the centre ``cluster_centers_[labels_[i]]`` (bottom row).

    Parameters
    ----------
    estimator : fitted InvariantAttentionClusterer
    X : array-like of shape (n_samples, n_features), (n, H, W) or (n, C, H, W)
        The samples the estimator was fitted on (the alignments are per fitted sample).
    n : int, default=8
        Number of samples shown, taken round-robin over the clusters; ignored if ``indices``
        is given.
    ax : matplotlib.axes.Axes, default=None
    indices : sequence of int, default=None
        Which samples to show.
    cmap : str, default="gray"
    title : str, default="alignments"

    Returns
    -------
    ax : matplotlib.axes.Axes
        ``3 * len(indices)`` images; each original's caption reads
        ``"#<index> c<cluster>"`` and each aligned one's ``"<angle>°"``.

    Raises
    ------
    ValueError
        If ``X`` does not hold as many samples as the estimator was fitted on, or an index is
        out of range.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import InvariantAttentionClusterer
    >>> from invariant_cluster.datasets import load_digits_images, make_transformed_copies
    >>> digits = load_digits_images()
    >>> X = np.concatenate([make_transformed_copies(digits.images[i], 6, max_rotation=180,
    ...                                             random_state=i)[0] for i in range(2)])
    >>> est = InvariantAttentionClusterer(group="rotation", random_state=0).fit(X)
    >>> from invariant_cluster.plotting import plot_alignments
    >>> ax = plot_alignments(est, X, n=4)
    >>> len(ax.images)  # originals, aligned copies, cluster means
    12
    """
    from .transforms import warp_se2

    _check_fitted(estimator, ["alignments_", "labels_", "cluster_centers_"])
    labels = np.asarray(estimator.labels_)
    shape = getattr(estimator, "image_shape_", None)
    images = _fold(np.asarray(X), shape, "X")
    if len(images) != len(labels):
        raise ValueError(
            f"X: expected the {len(labels)} samples the estimator was fitted on, got "
            f"{len(images)}"
        )
    if indices is None:
        if isinstance(n, bool) or int(n) != n or n < 1:
            raise ValueError(f"n: expected a positive int, got {n!r}")
        idx = _pick_per_cluster(labels, int(n))
    else:
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if idx.size == 0 or idx.min() < -len(labels) or idx.max() >= len(labels):
            raise ValueError(f"indices: expected indices in [0, {len(labels)}), got {idx}")
        idx = idx % len(labels)
    params = np.asarray(estimator.alignments_)[idx]
    originals = images[idx].astype(np.float32)
    aligned = warp_se2(originals, params.astype(np.float32))
    centers = _fold(np.asarray(estimator.cluster_centers_), shape, "cluster_centers_")[labels[idx]]
    m = len(idx)
    tiles = np.concatenate([originals, aligned, centers.astype(np.float32)])
    captions = ([f"#{i} c{labels[i]}" for i in idx]
                + [f"{int(round(p[0])):+d}°" for p in params]
                + [f"mean c{labels[i]}" for i in idx])
    ax = _new_axes(ax, (1.0 * m + 2.0, 4.3))
    _draw_tiles(ax, tiles, captions, m, cmap=cmap,
                row_labels=["original", "aligned", "cluster mean"])
    if title:
        ax.set_title(title)
    return ax


def plot_attention_weights(estimator, ax=None, *, cmap="magma_r", gamma=0.5,
                           title="attention weights", colorbar=True):
    """Draw the sparse attention weights as an ``n x n`` matrix, rows and columns by cluster.

    Entry ``(i, j)`` is the weight sample ``i`` gives to key ``j`` in the last iteration
    (``attention_weights_[i, m]`` with ``j = neighbors_[i, m]``; zero outside the neighbours).
    Samples are sorted by cluster (stably, so the original order is kept inside a cluster);
    thin lines separate the clusters and the ticks name them.

    Parameters
    ----------
    estimator : fitted InvariantAttentionClusterer
        Uses ``neighbors_``, ``attention_weights_`` and ``labels_``.
    ax : matplotlib.axes.Axes, default=None
    cmap : str, default="magma_r"
    gamma : float, default=0.5
        Exponent of the colour scale (:class:`matplotlib.colors.PowerNorm`), so that small
        weights stay visible; 1 is linear.
    title : str, default="attention weights"
    colorbar : bool, default=True

    Returns
    -------
    ax : matplotlib.axes.Axes
        One ``AxesImage``; the tick labels are the cluster ids.

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import InvariantAttentionClusterer
    >>> from invariant_cluster.datasets import load_digits_images, make_transformed_copies
    >>> digits = load_digits_images()
    >>> X = np.concatenate([make_transformed_copies(digits.images[i], 6, max_rotation=180,
    ...                                             random_state=i)[0] for i in range(2)])
    >>> est = InvariantAttentionClusterer(group="rotation", random_state=0).fit(X)
    >>> from invariant_cluster.plotting import plot_attention_weights
    >>> ax = plot_attention_weights(est)
    >>> ax.images[0].get_array().shape == (len(X), len(X))
    True
    """
    from matplotlib.colors import PowerNorm

    _check_fitted(estimator, ["neighbors_", "attention_weights_", "labels_"])
    labels = np.asarray(estimator.labels_)
    nbrs = np.asarray(estimator.neighbors_)
    W = np.asarray(estimator.attention_weights_, dtype=np.float64)
    n = len(labels)
    if nbrs.shape != W.shape or nbrs.shape[0] != n:
        raise ValueError(
            f"neighbors_ {nbrs.shape} and attention_weights_ {W.shape}: expected the same "
            f"shape (n_samples={n}, n_neighbors)"
        )
    A = np.zeros((n, n))
    np.add.at(A, (np.repeat(np.arange(n), nbrs.shape[1]), nbrs.ravel()), W.ravel())
    order = np.argsort(labels, kind="stable")
    A = A[order][:, order]
    ax = _new_axes(ax, (5.2, 4.4))
    vmax = float(A.max()) if A.size and A.max() > 0 else 1.0
    im = ax.imshow(A, cmap=cmap, norm=PowerNorm(gamma, vmin=0.0, vmax=vmax),
                   interpolation="nearest")
    sizes = np.bincount(labels)
    edges = np.concatenate([[0], np.cumsum(sizes)])
    for e in edges[1:-1]:
        ax.axhline(e - 0.5, color="0.6", lw=0.5)
        ax.axvline(e - 0.5, color="0.6", lw=0.5)
    centres = (edges[:-1] + edges[1:]) / 2 - 0.5
    shown = sizes > 0
    ax.set_xticks(centres[shown])
    ax.set_yticks(centres[shown])
    ids = [str(c) for c in np.flatnonzero(shown)]
    ax.set_xticklabels(ids, fontsize=7)
    ax.set_yticklabels(ids, fontsize=7)
    ax.set_xlabel("key (by cluster)")
    ax.set_ylabel("query (by cluster)")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, label="weight", shrink=0.8)
    return ax


def plot_convergence(estimator, ax=None, *, title="convergence"):
    """Draw the largest relative move of a mean per iteration (``history_``), log scale.

    Parameters
    ----------
    estimator : fitted InvariantAttentionClusterer
        Uses ``history_`` and, when present, the ``tol`` parameter (a dashed line).
    ax : matplotlib.axes.Axes, default=None
    title : str, default="convergence"

    Returns
    -------
    ax : matplotlib.axes.Axes
        One line with ``len(history_)`` points (iterations 1, 2, ...).

    Examples
    --------
    >>> import numpy as np
    >>> from invariant_cluster import InvariantAttentionClusterer
    >>> from invariant_cluster.datasets import load_digits_images, make_transformed_copies
    >>> digits = load_digits_images()
    >>> X = np.concatenate([make_transformed_copies(digits.images[i], 6, max_rotation=180,
    ...                                             random_state=i)[0] for i in range(2)])
    >>> est = InvariantAttentionClusterer(group="rotation", random_state=0).fit(X)
    >>> from invariant_cluster.plotting import plot_convergence
    >>> ax = plot_convergence(est)
    >>> len(ax.lines[0].get_xdata()) == len(est.history_)
    True
    """
    _check_fitted(estimator, ["history_"])
    history = np.asarray(estimator.history_, dtype=np.float64)
    ax = _new_axes(ax, (4.5, 3.2))
    its = np.arange(1, history.size + 1)
    # a move of exactly 0 cannot be drawn on a log axis: show it at the smallest positive float
    ax.plot(its, np.maximum(history, np.finfo(np.float64).tiny), "o-", ms=3,
            label="largest relative move")
    tol = getattr(estimator, "tol", None)
    if tol is not None and tol > 0:
        ax.axhline(tol, ls="--", color="0.5", lw=1, label=f"tol = {tol:g}")
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("relative move")
    if history.size == 0:
        ax.text(0.5, 0.5, "no iterations (max_iter=0)", transform=ax.transAxes, ha="center")
    if title:
        ax.set_title(title)
    ax.legend(fontsize="small")
    return ax
