"""How many clusters ``InvariantAttentionClusterer(n_clusters=None)`` finds, against the truth.

Copy sets (the sweep): ``k`` shapes (k in 2, 3, 5, 8, 12) picked with
``np.random.default_rng(seed).choice(len(pool), k, replace=False)``, each repeated ``c`` times
(c in 3, 4, 12, 40, 100) by ``make_transformed_copies(image, c, max_rotation=180,
max_translation=..., random_state=seed * 1000 + j)``; the truth is the shape. Three kinds:

- ``digits8``: scikit-learn's 8x8 digits, copies at arbitrary angles (estimator defaults);
- ``mnist_rot``: 28x28 MNIST test digits, copies at arbitrary angles (estimator defaults);
- ``mnist_shift``: MNIST, arbitrary angles and shifts within +-2 px (``max_translation=2``).

Each set clean and with Gaussian noise of std 0.1 (``default_rng(seed + 1)``): 150 sets.
Each set records ``closest_shapes``, the invariant distance between its two closest clean
shapes, and for noisy sets ``closest_over_noise``, that distance over the distance noise puts
between two copies of one shape (``0.1 * sqrt(2 * n_pixels)``: 1.13 for 8 x 8, 3.96 for
28 x 28); the summary counts the sets where it is at least 1 (``resolved_sets``). With
``--given`` the estimator is also fitted with the true count (``ari_given_k``).

Natural classes (``--natural``): MNIST rotated within +-45 degrees (``bench_clustering``'s
``rotated45`` variant and search range), n = ``--natural-n`` for each of ``--natural-seeds``; and
Fashion-MNIST 10,000 with ``--fashion``. The estimator is also fitted with ``n_clusters=10``
there (``acc_given_k``).

Methods, in the same run on the same data (every baseline uses the estimator's search range):

- ``estimator``: ``InvariantAttentionClusterer(n_clusters=None)``; ``count_rule``,
  ``n_shapes`` and ``center`` are its ``count_rule_``, ``n_shapes_`` and ``center_`` (None
  where they do not exist);
- ``estimator_no_center``: the same with ``center=False`` (no image centred on its centre of
  mass first), on the kinds with shifts only, where the default ``center="auto"`` can centre:
  copies shifted within +-2 px differ pairwise by up to 2 (1 + sqrt 2) px per axis, beyond
  ``max_translation=2``;
- ``hdbscan_invariant``: scikit-learn's HDBSCAN (``min_cluster_size=3``) on the dense invariant
  grid distances (``sqrt`` of ``invariant_distances(refine=False)``, made symmetric by the
  minimum); n <= 5,000;
  noise (-1) is one more label for ARI/ACC and is not counted as a cluster; with ``--given``,
  its row's ``ari_given_k`` is average linkage (scikit-learn's ``AgglomerativeClustering``)
  on the same distances with the true count;
- ``leiden_modularity``: Leiden (leidenalg, modularity, resolution 1) on the invariant 15-NN
  graph (``InvariantKNeighborsTransformer``), weights ``exp(-d / median(d))`` made symmetric
  by the maximum;
- ``hdbscan_umap``: umap-learn (10 components, 15 neighbours, ``min_dist=0``, precomputed) on
  the same dense distances, then HDBSCAN (``min_cluster_size=max(3, n // 100)``); n <= 5,000.

Exact copies (``--exact``): each shape in ``c`` quarter turns (``np.rot90``, the fifth and later
stored again), at the estimator's defaults. Augmented sets (``--augmented C ...``): rotated MNIST
2,000 (``rotated45``), and with ``--fashion`` Fashion-MNIST 3,000 within +-15 degrees and +-1 px
(``bench_large``'s search), each image stored in ``C`` warped copies, next to ``C = 1``; the
estimator is also fitted with ``n_clusters=10``. ``--single-warps W`` also fits the single set
under the warps ``j = 1 .. W - 1`` of the copies, each alone: the spread of its ACC over the
warps is the resolution of a comparison of the copies with the single set.

Copy residuals (``--copy-residual rotated45 fashion``, the augmented sets' variants): in the
set of ``C = 2`` copies, the pairs of copies the default fit splits, those of them beyond the
searched range, and the ratio of each pair's refined squared distance to its resampling
residual (the copy test's ``d^2 / e^2``, :mod:`invariant_cluster._shapes`; for the split pairs
also aligned on a grid of twice the searched range) next to the same ratio for two fresh
copies of each observed image made within the searched range, and for each image's nearest
other image.

Duplicates and order (``--duplicates``): on copy sets (k in 2, 5, 12; c in 3, 12, 40; digits8
and mnist_rot; clean) and on rotated MNIST (``--duplicates-natural-n``, seed 0), the estimator
(``n_clusters=None`` and the true k) is fitted on X, on X twice, on X plus a copy moved by
1e-4 noise and on X permuted; on rotated MNIST also with 10% and 50% of the images appended
again.

    python benchmarks/bench_count.py --quick --kinds digits8 --out /tmp/count_quick.json
    python benchmarks/bench_count.py                      # the 150 copy sets (long)
    python benchmarks/bench_count.py --seed 1 --methods estimator --given   # run draws_seed1
    python benchmarks/bench_count.py --no-sweep --natural --fashion        # run natural_2000
    python benchmarks/bench_count.py --no-sweep --exact --given --seed 7  # run exact_seed7
    python benchmarks/bench_count.py --no-sweep --augmented 2 8 16 32 --fashion \
        --methods estimator leiden_modularity --seed 7                    # run augmented_seed7
    python benchmarks/bench_count.py --no-sweep --augmented 8 --fashion --single-warps 8 \
        --methods estimator --seed 47 --run augmented8_seed47_warps
    python benchmarks/bench_count.py --no-sweep --copy-residual rotated45 fashion --seed 47
                                                                      # run copy_residual_seed47
    python benchmarks/bench_count.py --no-sweep --duplicates --duplicates-all \
        --duplicates-natural-n 0                                          # run duplicates

Each suite is a run of ``benchmarks/results/count.json``, named after its options (``--run``).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    environment,
    load_mnist_test,
    print_table,
    table,
    write_json,
)
from bench_clustering import VARIANTS, make_variant  # noqa: E402
from make_tables import derived_rows  # noqa: E402

from invariant_cluster import InvariantAttentionClusterer  # noqa: E402

KINDS = ("digits8", "mnist_rot", "mnist_shift")
SHAPES = (2, 3, 5, 8, 12)
COPIES = (3, 4, 12, 40, 100)
NOISES = (0.0, 0.1)
METHODS = ("estimator", "estimator_no_center", "hdbscan_invariant", "leiden_modularity",
           "hdbscan_umap")
MAX_DENSE = 5000  # the dense baselines hold an n x n matrix
COLUMNS = ["set", "n", "method", "k", "count", "ari", "acc", "seconds", "count_rule",
           "noise_fraction", "error"]


# --------------------------------------------------------------------------------------- data


def search_params(kind):
    """The estimator's search range for a kind of copy set (the rest are its defaults)."""
    return dict(max_translation=2) if kind == "mnist_shift" else {}


_POOLS = {}


def pool(kind, data=None):
    if kind not in _POOLS:
        if kind == "digits8":
            from invariant_cluster.datasets import load_digits_images

            images = load_digits_images().images.astype(np.float32)
        else:
            images, _ = load_mnist_test(data)
            if images.max() > 1:
                images = images / 255.0
        _POOLS[kind] = images.astype(np.float32)
    return _POOLS[kind]


def picked_shapes(kind, k, seed, data=None):
    """The ``k`` images of ``pool(kind)`` a copy set is made of."""
    images = pool(kind, data)
    return images[np.random.default_rng(seed).choice(len(images), k, replace=False)]


def closest_shapes(kind, k, noise, seed, data=None):
    """The invariant distance between the two closest of a set's ``k`` clean shapes, over the
    distance that noise of std ``noise`` puts between two copies of one shape,
    ``noise * sqrt(2 * n_pixels)`` (None for clean sets): under 1, two of the shapes are
    closer to each other than two noisy copies of either are. Returns ``(distance, ratio)``.
    The grid distance (``refine=False``, as the dense baselines), made symmetric by the
    minimum."""
    from invariant_cluster.alignment import invariant_distances

    shapes = picked_shapes(kind, k, seed, data)
    D = invariant_distances(shapes.reshape(k, -1), image_shape=shapes.shape[1:],
                            refine=False, **search_params(kind))
    D = np.asarray(D, dtype=np.float64)
    D = np.minimum(D, D.T)
    np.fill_diagonal(D, np.inf)
    distance = float(np.sqrt(max(D.min(), 0.0)))
    ratio = distance / (noise * np.sqrt(2 * shapes[0].size)) if noise else None
    return distance, ratio


def exact_copy_set(kind, k, c, seed, data=None):
    """``c`` exact copies of each of ``k`` shapes: quarter turns (``np.rot90``) in turn, the
    fifth and later repeats stored again as they are; and the shape of each copy."""
    X = np.concatenate([np.stack([np.rot90(image, j % 4) for j in range(c)])
                        for image in picked_shapes(kind, k, seed, data)])
    return X.astype(np.float32), np.repeat(np.arange(k), c)


def augmented_search(variant):
    """The search range of ``variant``'s augmented sets: the variant's own, or
    ``bench_large``'s for Fashion-MNIST."""
    if variant == "fashion":
        return dict(max_rotation=15.0, n_rotations=7, max_translation=1)
    return VARIANTS[variant]["search"]


def augmented_set(variant, n, copies, seed, data=None, first=0, return_params=False):
    """``bench_clustering``'s ``variant`` set of ``n`` images, each stored in ``copies``
    warped copies (``make_transformed`` of the whole set, seeds ``seed * 100 + j`` for ``j``
    from ``first``, within the variant's own range, or +-15 degrees and +-1 px for
    Fashion-MNIST); and the classes (and with ``return_params`` each copy's warp, ``(copies,
    n, 3)``)."""
    from invariant_cluster.datasets import make_transformed

    X, y = make_variant(variant, n, seed, data)
    spec = VARIANTS[variant]
    rot, shift = (spec["rotate"], spec["shift"]) if spec["rotate"] else (15.0, 1.0)
    made = [make_transformed(X, max_rotation=rot, max_translation=shift,
                             random_state=seed * 100 + j) for j in range(first, first + copies)]
    X = np.concatenate([m[0] for m in made]).astype(np.float32)
    if return_params:
        return X, np.tile(y, copies), np.stack([np.asarray(m[1]) for m in made])
    return X, np.tile(y, copies)


def copy_set(kind, k, c, noise, seed, data=None):
    from invariant_cluster.datasets import make_transformed_copies

    shift = search_params(kind).get("max_translation", 0)
    X = np.concatenate([make_transformed_copies(image, c, max_rotation=180,
                                                max_translation=shift,
                                                random_state=seed * 1000 + j)[0]
                        for j, image in enumerate(picked_shapes(kind, k, seed, data))])
    if noise:
        X = X + noise * np.random.default_rng(seed + 1).standard_normal(X.shape)
    return X.astype(np.float32), np.repeat(np.arange(k), c)


# ------------------------------------------------------------------------------------ helpers


def plain(v):
    """A JSON-able copy of a fitted attribute (NumPy scalars and arrays, dicts, tuples)."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        return {str(a): plain(b) for a, b in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    return str(v)


def measure(y, labels):
    from sklearn.metrics import adjusted_rand_score

    from invariant_cluster.metrics import clustering_accuracy

    labels = np.asarray(labels)
    return {"count": int(np.unique(labels[labels >= 0]).size),
            "ari": float(adjusted_rand_score(y, labels)),
            "acc": float(clustering_accuracy(y, labels))}


def timed(fn, *a, **kw):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(*a, **kw)
    return out, time.perf_counter() - t0


def error_text(e):
    return f"{type(e).__name__}: {e}"[:500]


def fit_estimator(X, n_clusters, seed, search, **params):
    est = InvariantAttentionClusterer(n_clusters=n_clusters, random_state=seed, **search,
                                      **params)
    return est.fit(X.reshape(len(X), -1))


# ---------------------------------------------------------------------------------- baselines


def dense_distances(X, search):
    """Invariant distances (not squared) on the search grid (``refine=False``: the refinement of
    every pair of 1,200 images would take minutes a set), symmetric by the minimum, zero
    diagonal."""
    from invariant_cluster import invariant_distances

    D = np.asarray(invariant_distances(X.reshape(len(X), -1), refine=False, **search),
                   dtype=np.float64)
    D = np.sqrt(np.clip(D, 0, None))
    D = np.minimum(D, D.T)
    np.fill_diagonal(D, 0.0)
    return D


def hdbscan_invariant(D):
    from sklearn.cluster import HDBSCAN

    # copy=True: HDBSCAN otherwise writes its mutual reachability distances into D, which
    # the umap-learn baseline and true_separation read afterwards
    return HDBSCAN(metric="precomputed", min_cluster_size=3, copy=True).fit_predict(D)


def average_linkage(D, n_clusters):
    """``n_clusters`` groups of the dense distances ``D`` by average linkage (scikit-learn)."""
    from sklearn.cluster import AgglomerativeClustering

    return AgglomerativeClustering(n_clusters=n_clusters, metric="precomputed",
                                   linkage="average").fit_predict(D)


def leiden_modularity(X, search, seed):
    import igraph
    import leidenalg
    from scipy.sparse import csr_matrix, triu

    from invariant_cluster import InvariantKNeighborsTransformer

    n = len(X)
    G = InvariantKNeighborsTransformer(n_neighbors=min(15, n - 1), **search)
    G = G.fit_transform(X.reshape(n, -1)).tocoo()
    off = G.row != G.col  # the graph stores each sample as its own zero-distance neighbour
    r, c, d = G.row[off], G.col[off], G.data[off].astype(np.float64)
    med = np.median(d[d > 0]) if np.any(d > 0) else 1.0
    W = csr_matrix((np.exp(-d / med), (r, c)), shape=(n, n))
    W = triu(W.maximum(W.T), k=1).tocoo()
    g = igraph.Graph(n=n, edges=list(zip(W.row.tolist(), W.col.tolist())),
                     edge_attrs={"weight": W.data.tolist()})
    part = leidenalg.find_partition(g, leidenalg.ModularityVertexPartition, weights="weight",
                                    seed=seed)
    return np.asarray(part.membership)


def hdbscan_umap(D, seed):
    import umap
    from sklearn.cluster import HDBSCAN

    n = len(D)
    emb = umap.UMAP(n_components=10, n_neighbors=15, min_dist=0.0, metric="precomputed",
                    random_state=seed).fit_transform(D)
    return HDBSCAN(min_cluster_size=max(3, n // 100)).fit_predict(emb)


def run_methods(X, y, search, seed, base, given_k=None, methods=METHODS):
    """Rows of the estimator and the three baselines (those of ``methods``) on one data set."""
    n, k = len(X), int(np.unique(y).size)
    rows = []

    def add(method, labels=None, seconds=None, error=None, **extra):
        row = {**base, "n": n, "k": k, "method": method, "count": None, "ari": None,
               "acc": None, "seconds": seconds, "error": error}
        if labels is not None:
            row.update(measure(y, labels))
            row["count_error"] = row["count"] - k
        row.update(extra)
        rows.append(row)
        print_table(rows[-1:], COLUMNS)

    try:
        est, t = timed(fit_estimator, X, None, seed, search)
        extra = {"n_clusters_": int(est.n_clusters_),
                 "count_rule": plain(getattr(est, "count_rule_", None)),
                 "n_shapes": plain(getattr(est, "n_shapes_", None)),
                 "graph_used": plain(getattr(est, "graph_", None)),
                 "center": plain(getattr(est, "center_", None))}
        if given_k is not None:
            try:
                est_k, t_k = timed(fit_estimator, X, given_k, seed, search)
                given = measure(y, est_k.labels_)
                extra.update(acc_given_k=given["acc"], ari_given_k=given["ari"],
                             seconds_given_k=t_k)
            except Exception as e:
                extra.update(acc_given_k=None, error_given_k=error_text(e))
        add("estimator", est.labels_, t, **extra)
    except Exception as e:
        add("estimator", error=error_text(e))
    if "estimator_no_center" in methods and search.get("max_translation", 0) > 0:
        try:
            est, t = timed(fit_estimator, X, None, seed, search, center=False)
            add("estimator_no_center", est.labels_, t, n_clusters_=int(est.n_clusters_),
                count_rule=plain(getattr(est, "count_rule_", None)),
                n_shapes=plain(getattr(est, "n_shapes_", None)))
        except Exception as e:
            add("estimator_no_center", error=error_text(e))

    dense = {"hdbscan_invariant", "hdbscan_umap"} & set(methods)
    D, t_dist, dist_error = None, None, None
    if dense and n <= MAX_DENSE:
        try:
            D, t_dist = timed(dense_distances, X, search)
        except Exception as e:
            dist_error = error_text(e)
    skipped = f"skipped: n > {MAX_DENSE}" if n > MAX_DENSE else None

    if "hdbscan_invariant" in methods:
        if D is None:
            add("hdbscan_invariant", error=skipped or dist_error)
        else:
            try:
                lab, t = timed(hdbscan_invariant, D)
                extra = {}
                if given_k is not None:
                    # the count given: average linkage on the same distances
                    lab_k, t_k = timed(average_linkage, D, given_k)
                    given = measure(y, lab_k)
                    extra.update(acc_given_k=given["acc"], ari_given_k=given["ari"],
                                 seconds_given_k=t_dist + t_k)
                add("hdbscan_invariant", lab, t_dist + t, dist_seconds=t_dist,
                    noise_fraction=float(np.mean(lab < 0)), **extra)
            except Exception as e:
                add("hdbscan_invariant", error=error_text(e))

    if "leiden_modularity" in methods:
        try:
            lab, t = timed(leiden_modularity, X, search, seed)
            add("leiden_modularity", lab, t)
        except Exception as e:
            add("leiden_modularity", error=error_text(e))

    if "hdbscan_umap" in methods:
        if D is None:
            add("hdbscan_umap", error=skipped or dist_error)
        else:
            try:
                lab, t = timed(hdbscan_umap, D, seed)
                add("hdbscan_umap", lab, t_dist + t, dist_seconds=t_dist,
                    noise_fraction=float(np.mean(lab < 0)))
            except Exception as e:  # umap-learn's precomputed metric on tiny sets (n < 20)
                add("hdbscan_umap", error=error_text(e))
    if D is not None and base.get("copies") is not None:
        ratio = true_separation(D, y)
        for row in rows:
            row["true_separation"] = ratio
    return rows


def true_separation(D, y):
    """The smallest, over the true groups, of a group's shortest invariant distance to an image
    of another group over the longest edge of its own minimum spanning tree (dense ``D``, the
    images as given; single linkage's Dunn index). Under 1, some group's copies are farther
    from each other than it is from another shape: no partition of the samples' distances
    finds that group."""
    from scipy.sparse.csgraph import minimum_spanning_tree

    D = np.asarray(D, dtype=np.float64)
    ratios = []
    for g in np.unique(y):
        inside = y == g
        between = D[inside][:, ~inside]
        if between.size == 0:
            continue
        within = D[inside][:, inside]
        pos = within[within > 0]
        # exact copies (distance 0) raised to a tiny positive length, which sparse graphs keep
        tree = minimum_spanning_tree(np.where(within > 0, within,
                                              1e-9 * (pos.min() if pos.size else 1.0)))
        longest = float(tree.max()) if tree.nnz else 0.0
        ratios.append(float(between.min()) / longest if longest > 0 else np.inf)
    return float(min(ratios)) if ratios else None


def copy_residual(variant, n, seed, data=None, quantiles=(10, 50, 90, 99)):
    """The ``--copy-residual`` row of ``variant``'s set of ``n`` images in 2 copies."""
    import torch

    from invariant_cluster._shapes import align, alignment_residual, copy_grid, pair_distances
    from invariant_cluster.datasets import make_transformed
    from invariant_cluster.search import knn_search, make_search_grid

    search = augmented_search(variant)
    X, _, made = augmented_set(variant, n, 2, seed, data, return_params=True)
    rel = made[1] - made[0]
    beyond = ((np.abs(rel[:, 0]) > search["max_rotation"])
              | (np.abs(rel[:, 1:]).max(1) > search["max_translation"] + 0.5))
    est = InvariantAttentionClusterer(**search, random_state=seed).fit(X)
    split = est.shape_labels_[:n] != est.shape_labels_[n:]
    grid, refine_grid = est._grid(False), copy_grid(est._grid(True))

    # a grid of twice the searched range, at the same step: the split pairs aligned again
    wide = make_search_grid(grid.group, min(180.0, 2.0 * search["max_rotation"]),
                            2 * search["n_rotations"] - 1, 2 * search["max_translation"],
                            refine=False, image_shape=est.image_shape_)

    def ratios(A, B, on=grid):  # d^2 / e^2 of the pairs (A[i], B[i]), B aligned onto A
        i = torch.arange(len(A))
        p = align(A, B, on, refine_grid)
        AB = torch.cat([A, B])
        d2 = pair_distances(AB, i, i + len(A), p)
        e2 = alignment_residual(AB, i, i + len(A), p).double().pow(2)
        return (d2 / e2.clamp(min=1e-12)).numpy()

    def q(r):
        return [round(float(v), 3) for v in np.percentile(r, quantiles)]

    shape = (-1, 1, *est.image_shape_[1:])
    with torch.no_grad():
        T = torch.as_tensor(X.reshape(shape).copy())
        A, B = T[:n], T[n:]
        fresh = [torch.as_tensor(np.asarray(make_transformed(
            A.numpy(), max_rotation=search["max_rotation"],
            max_translation=search["max_translation"], random_state=seed * 100 + 50 + j)[0],
            np.float32)).reshape(shape) for j in (0, 1)]
        _, idx, _ = knn_search(A, A, grid, 1, exclude=torch.arange(n))
        pairs, again, nearest = ratios(A, B), ratios(*fresh), ratios(A, A[idx[:, 0]])
        cut = torch.as_tensor(np.flatnonzero(split))
        widened = ratios(A[cut], B[cut], wide) if len(cut) else None
    return {"set": f"{variant} n={n} x2 seed={seed}", "n_shapes": int(est.n_shapes_),
            "pairs": n, "split": int(split.sum()), "beyond_range": int(beyond.sum()),
            "split_beyond_range": int((split & beyond).sum()), "quantiles": list(quantiles),
            "ratio_pairs": q(pairs), "ratio_pairs_split": q(pairs[split]) if split.any() else None,
            "ratio_pairs_split_wide_grid": None if widened is None else q(widened),
            "ratio_fresh_copies": q(again), "ratio_nearest_other": q(nearest),
            "pairs_above_nearest_p10": int((pairs > np.percentile(nearest, 10)).sum())}


def warm_up(seed):
    """Import the baselines' libraries and compile umap-learn's kernels before any timing."""
    import igraph  # noqa: F401
    import leidenalg  # noqa: F401

    rng = np.random.default_rng(seed)
    try:  # the first fit of a process also pays torch's lazy set-up
        timed(fit_estimator, rng.random((8, 8, 8), dtype=np.float32), None, seed, {})
    except Exception as e:
        print(f"warm-up: {error_text(e)}")
    P = rng.standard_normal((60, 4))
    D = np.sqrt(((P[:, None] - P[None]) ** 2).sum(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            hdbscan_invariant(D)
            hdbscan_umap(D, seed)
        except Exception as e:
            print(f"warm-up: {error_text(e)}")


# ------------------------------------------------------------------------------------ summary


def summarize(rows):
    """Per method, over the copy sets: the exact counts (with ARI >= 0.95), the worst miss."""
    copies = [r for r in rows if r.get("copies") is not None]
    out = []
    kinds = sorted({r["kind"] for r in copies})
    noises = sorted({r["noise"] for r in copies})
    groups = [("all", "all")] + [(kd, "all") for kd in kinds] + [("all", s) for s in noises]
    groups += [(kd, s) for kd in kinds for s in noises] if len(kinds) > 1 and len(noises) > 1 \
        else []
    for method in METHODS:
        for kd, s in groups:
            sel = [r for r in copies if r["method"] == method
                   and kd in ("all", r["kind"]) and s in ("all", r["noise"])]
            if not sel:
                continue
            done = [r for r in sel if r["count"] is not None]
            apart = [r for r in done if (r.get("true_separation") or 0) > 1]
            # sets none of whose shapes are closer than two noisy copies of one shape
            resolved = [r for r in done if r.get("closest_over_noise") is None
                        or r["closest_over_noise"] >= 1]
            out.append({
                "method": method, "kind": kd, "noise": s, "sets": len(sel),
                "exact": sum(r["count"] == r["k"] and r["ari"] >= 0.95 for r in done),
                "exact_count": sum(r["count"] == r["k"] for r in done),
                "max_abs_count_error": max((abs(r["count"] - r["k"]) for r in done),
                                           default=None),
                "mean_ari": float(np.mean([r["ari"] for r in done])) if done else None,
                "failed": len(sel) - len(done),
                # sets whose true groups are separated by distance (true_separation > 1)
                "separated_sets": len(apart),
                "exact_separated": sum(r["count"] == r["k"] and r["ari"] >= 0.95 for r in apart),
                "max_abs_count_error_separated": max(
                    (abs(r["count"] - r["k"]) for r in apart), default=None),
                "resolved_sets": len(resolved),
                "exact_resolved": sum(r["count"] == r["k"] and r["ari"] >= 0.95
                                      for r in resolved),
                "max_abs_count_error_resolved": max(
                    (abs(r["count"] - r["k"]) for r in resolved), default=None),
                "seconds": float(sum(r["seconds"] or 0.0 for r in sel)),
            })
    return out


# --------------------------------------------------------------------------------- duplicates


def _fit_into(row, name, Z, *, n_clusters, seed, search):
    """Fit the estimator on ``Z``: its labels, or None when it raised (recorded in ``row``)."""
    try:
        est, t = timed(fit_estimator, Z, n_clusters, seed, search)
    except Exception as e:
        row.update({f"{name}_crashed": True, f"{name}_error": error_text(e)})
        return None
    row.update({f"{name}_crashed": False, f"{name}_seconds": t})
    return est.labels_


def duplicate_rows(X, y, search, seed, base, fractions=(), jitters=()):
    """The estimator on X, X twice, X plus a 1e-4 copy, that copy alone, X plus its quarter
    turns and X permuted; n_clusters None and k.

    ``fractions``: also fit X with a random share of its images appended again (ACC on the
    whole set, to compare with ``single_acc``). ``jitters``: seeds of further 1e-4 jitters of
    X, each fitted alone (``more_jitters_ari_vs_single``). ``<fit>_crashed``/``<fit>_error``:
    whether a fit raised, and its message.
    """
    from sklearn.metrics import adjusted_rand_score

    n, k = len(X), int(np.unique(y).size)
    rng = np.random.default_rng(seed + 2)
    near = (X + 1e-4 * rng.standard_normal(X.shape)).astype(np.float32)
    perm = rng.permutation(n)
    inv = np.argsort(perm)
    appended = [np.random.default_rng(seed + 3 + i).choice(n, int(round(f * n)), replace=False)
               for i, f in enumerate(fractions)]
    rows = []
    for n_clusters in (None, k):
        row = {**base, "n": n, "k": k, "n_clusters": n_clusters}
        fit = partial(_fit_into, row, n_clusters=n_clusters, seed=seed, search=search)
        ref = fit("single", X)
        if ref is not None:
            row.update({f"single_{m}": v for m, v in measure(y, ref).items()})
        turned = np.ascontiguousarray(np.rot90(X, 1, axes=(-2, -1)))
        near_labels = None
        for name, Z in (("doubled", np.concatenate([X, X])),
                        ("near", np.concatenate([X, near])),
                        ("rot90", np.concatenate([X, turned]))):
            lab = fit(name, Z)
            if lab is not None:
                row[f"{name}_count"] = measure(np.concatenate([y, y]), lab)["count"]
                row[f"{name}_pairs_same"] = float(np.mean(lab[:n] == lab[n:]))
                if ref is not None:
                    row[f"{name}_ari_first_half_vs_single"] = float(
                        adjusted_rand_score(ref, lab[:n]))
                if name == "near":
                    near_labels = lab
        # the jittered copy alone, no duplicates: how far a 1e-4 change of every image moves
        # the partition by itself (Leiden's result depends on the nodes' order, which the
        # images' content sets)
        lab = fit("jittered", near)
        if lab is not None and ref is not None:
            row["jittered_ari_vs_single"] = float(adjusted_rand_score(ref, lab))
        if lab is not None and near_labels is not None:
            row["near_ari_first_half_vs_jittered"] = float(
                adjusted_rand_score(lab, near_labels[:n]))
        # more jitters of the same size, each fitted alone (natural classes: the spread)
        more = []
        for j in jitters:
            lab = fit(f"jittered_{j}", (X + 1e-4 * np.random.default_rng(j).standard_normal(
                X.shape)).astype(np.float32))
            if lab is not None and ref is not None:
                more.append(float(adjusted_rand_score(ref, lab)))
        if jitters:
            row["more_jitters_ari_vs_single"] = more
        lab = fit("permuted", X[perm])
        if lab is not None:
            lab = lab[inv]
            row["permuted_count"] = measure(y, lab)["count"]
            if ref is not None:
                row["permuted_ari_vs_single"] = float(adjusted_rand_score(ref, lab))
        for f, sel in zip(fractions, appended):
            tag = f"dup{int(round(100 * f))}"
            lab = fit(tag, np.concatenate([X, X[sel]]))
            if lab is not None:
                m = measure(np.concatenate([y, y[sel]]), lab)
                row.update({f"{tag}_acc": m["acc"], f"{tag}_count": m["count"]})
        rows.append(row)
        print_table(rows[-1:], [c for c in row if not c.endswith(("_error", "_seconds"))])
    return rows


# ----------------------------------------------------------------------------------------- run


NAMES = {"estimator": "`n_clusters=None`", "estimator_center": "`n_clusters=None, center=True`",
         "estimator_no_center": "`n_clusters=None, center=False`",
         "hdbscan_invariant": "HDBSCAN on `invariant_distances`",
         "leiden_modularity": "Leiden (modularity) on the kNN graph",
         "hdbscan_umap": "HDBSCAN on umap-learn's layout"}
KIND_NAMES = {"digits8": "8 x 8 digits", "mnist_rot": "MNIST digits",
              "mnist_shift": "MNIST digits, shifts within ±2 px",
              "digits8_exact": "8 x 8 digits, quarter turns",
              "mnist_rot_exact": "MNIST digits, quarter turns"}
DUPLICATES = {"doubled_ari_first_half_vs_single": "stored twice",
              "near_ari_first_half_vs_single": "with a copy jittered by 1e-4",
              "jittered_ari_vs_single": "jittered by 1e-4, alone",
              "near_ari_first_half_vs_jittered": "the stacked fit against the jittered alone",
              "rot90_ari_first_half_vs_single": "with its quarter turns",
              "permuted_ari_vs_single": "permuted"}


def table_rows(result):
    """The copy sets counted right (exact count, ARI >= 0.95) per method and kind of set;
    the duplicates' ARI against the fit of the data as it is; else each natural set's fits."""
    summary = [x for x in result.get("summary", []) if x.get("noise") == "all"]
    if not summary:
        natural = [x for x in result.get("duplicates", []) if x.get("copies") is None]
        if natural:
            return table(result, natural, lambda r: "ARI against the fit of the data as it is",
                         lambda r: f"{r['set']}, n_clusters={r['n_clusters']}",
                         {name: key for key, name in DUPLICATES.items()})
        return derived_rows(result, ("set",), ("method",), ("kind", "copies", "noise", "seed",
                            "n", "k", "error", "count_error", "n_clusters_", "center"))
    sets = {x["kind"]: x["sets"] for x in summary}
    kinds = {k: f"all {n} (largest count error)" if k == "all"
             else f"{KIND_NAMES.get(k, k)} ({n} sets)" for k, n in sets.items()}
    data = "Copy sets with the exact count and ARI >= 0.95"
    cells = {label: (lambda r, k=k: None if r["kind"] != k else r["exact"] if k != "all"
                     else f"{r['exact']} ({r['max_abs_count_error']})")
             for k, label in kinds.items()}
    everyone, more = [x for x in summary if x["kind"] == "all"], {}
    for key, label in (("separated", "sets whose groups the distances separate"),
                       ("resolved", "sets with no two shapes closer than two noisy copies")):
        if all(x.get(f"{key}_sets") is not None for x in everyone) and (
                key == "resolved" or any(r.get("true_separation") is not None
                                         for r in result.get("rows", []))):
            more[f"{label} (largest count error)"] = (
                lambda r, key=key:
                f"{r[f'exact_{key}']} of {r[f'{key}_sets']} ({r[f'max_abs_count_error_{key}']})")
    name = lambda r: NAMES.get(r["method"], r["method"])  # noqa: E731
    return (table(result, summary, lambda r: data, name, cells)
            + table(result, everyone, lambda r: data, name, more))

def default_run(args) -> str:
    """The run's key named after the suite the options select."""
    if args.quick:
        return "quick"
    if args.exact:
        return f"exact_seed{args.seed}"
    if args.augmented:
        return f"augmented_seed{args.seed}"
    if args.copy_residual:
        return f"copy_residual_seed{args.seed}"
    if args.natural:
        return "natural_" + "_".join(str(n) for n in args.natural_n)
    if args.duplicates:
        return "jitter" if args.kinds == ["mnist_shift"] else "duplicates"
    return f"draws_seed{args.seed}" if args.seed else "default"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder with the MNIST/Fashion-MNIST test splits")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--shapes", nargs="+", type=int, default=list(SHAPES))
    p.add_argument("--copies", nargs="+", type=int, default=list(COPIES))
    p.add_argument("--noise", nargs="+", type=float, default=list(NOISES))
    p.add_argument("--quick", action="store_true",
                   help="k in 2, 5; c in 3, 40; clean only (intersected with the lists given)")
    p.add_argument("--no-sweep", action="store_true", help="skip the copy sets")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                   help="the methods run (default: all)")
    p.add_argument("--given", action="store_true",
                   help="copy sets: the estimator also fitted with the true count "
                        "(ari_given_k, acc_given_k)")
    p.add_argument("--natural", action="store_true", help="rotated MNIST rows")
    p.add_argument("--natural-n", nargs="+", type=int, default=[2000])
    p.add_argument("--natural-seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--fashion", action="store_true", help="Fashion-MNIST 10,000 row")
    p.add_argument("--exact", action="store_true",
                   help="exact copy sets: quarter turns and repeats (--kinds, --shapes, --copies)")
    p.add_argument("--augmented", nargs="+", type=int, default=[],
                   help="natural sets each stored in C warped copies, for each C given "
                        "(rotated MNIST 2,000; with --fashion also Fashion-MNIST 3,000)")
    p.add_argument("--single-warps", type=int, default=1,
                   help="with --augmented: the single set (C = 1) also under warps 1 to W - 1, "
                        "each fitted alone (kind VARIANT_warps)")
    p.add_argument("--copy-residual", nargs="+", default=[], choices=["rotated45", "fashion"],
                   help="the copy test's d^2 / e^2 on these augmented variants in 2 copies")
    p.add_argument("--duplicates", action="store_true",
                   help="duplicates and order (copy sets filtered by --kinds/--shapes/--copies)")
    p.add_argument("--duplicates-all", action="store_true",
                   help="with --duplicates: every copy set of the sweep (--kinds, --shapes, "
                        "--copies, --noise), not the subset")
    p.add_argument("--duplicates-natural-n", type=int, default=2000,
                   help="rotated MNIST size of the duplicate checks (0: skip)")
    p.add_argument("--out", default=str(RESULTS / "count.json"))
    p.add_argument("--run", default=None, help="the run's key in the JSON (default: from the "
                   "options: quick, natural_N, jitter, duplicates, draws_seedN or default)")
    args = p.parse_args(argv)
    run = args.run or default_run(args)
    if args.quick:
        args.shapes = [s for s in args.shapes if s in (2, 5)] or [2, 5]
        args.copies = [c for c in args.copies if c in (3, 40)] or [3, 40]
        args.noise = [0.0]

    out = Path(args.out)
    command = ["python", *sys.argv] if argv is None else ["python", sys.argv[0], *argv]
    result = {"benchmark": "count", "env": environment(), "command": " ".join(command),
              "args": vars(args), "rows": [], "duplicates": [], "summary": []}

    warm_up(args.seed)

    def save():
        result["summary"] = summarize(result["rows"])
        write_json(result, out, table_rows, run=run)

    if not args.no_sweep:
        for kind in args.kinds:
            for k in args.shapes:
                for c in args.copies:
                    for noise in args.noise:
                        X, y = copy_set(kind, k, c, noise, args.seed, args.data)
                        close, ratio = closest_shapes(kind, k, noise, args.seed, args.data)
                        base = {"set": f"{kind} k={k} c={c} s={noise:g}", "kind": kind,
                                "copies": c, "noise": noise, "seed": args.seed,
                                "closest_shapes": close, "closest_over_noise": ratio}
                        result["rows"] += run_methods(X, y, search_params(kind), args.seed, base,
                                                      given_k=k if args.given else None,
                                                      methods=args.methods)
                        save()  # after every set: a long run keeps what it measured

    if args.exact:
        for kind in [kd for kd in args.kinds if kd != "mnist_shift"]:
            for k in args.shapes:
                for c in args.copies:
                    X, y = exact_copy_set(kind, k, c, args.seed, args.data)
                    base = {"set": f"{kind} exact k={k} c={c}", "kind": f"{kind}_exact",
                            "copies": c, "noise": 0.0, "seed": args.seed}
                    result["rows"] += run_methods(X, y, {}, args.seed, base,
                                                  given_k=k if args.given else None,
                                                  methods=args.methods)
                    save()

    augmented = [("rotated45", 2000)] + ([("fashion", 3000)] if args.fashion else [])
    for variant, n in augmented if args.augmented else []:
        search = augmented_search(variant)
        for c in [1, *args.augmented]:
            X, y = augmented_set(variant, n, c, args.seed, args.data)
            base = {"set": f"{variant} n={n} x{c} seed={args.seed}", "kind": f"{variant}_aug",
                    "copies": c, "noise": 0.0, "seed": args.seed}
            result["rows"] += run_methods(X, y, search, args.seed, base, given_k=10,
                                          methods=args.methods)
            save()
        # the single set under each other warp: how far its ACC moves with the warp alone
        for j in range(1, args.single_warps):
            X, y = augmented_set(variant, n, 1, args.seed, args.data, first=j)
            base = {"set": f"{variant} n={n} x1 warp={j} seed={args.seed}",
                    "kind": f"{variant}_warps", "copies": 1, "noise": 0.0, "seed": args.seed}
            result["rows"] += run_methods(X, y, search, args.seed, base, given_k=10,
                                          methods=args.methods)
            save()

    natural = []
    if args.natural:
        natural += [("rotated45", n, s) for n in args.natural_n for s in args.natural_seeds]
    if args.fashion:
        natural.append(("fashion", 10000, args.seed))
    for variant, n, seed in natural:
        X, y = make_variant(variant, n, seed, args.data)
        base = {"set": f"{variant} n={n} seed={seed}", "kind": variant, "copies": None,
                "noise": 0.0, "seed": seed}
        result["rows"] += run_methods(X, y, VARIANTS[variant]["search"], seed, base,
                                      given_k=10, methods=args.methods)
        save()

    if args.copy_residual:
        result["copy_residual"] = []
        for variant in args.copy_residual:
            n = 3000 if variant == "fashion" else 2000
            result["copy_residual"].append(copy_residual(variant, n, args.seed, args.data))
            print(result["copy_residual"][-1])
            save()

    if args.duplicates:
        every = args.duplicates_all
        for kind in [kd for kd in args.kinds if every or kd in ("digits8", "mnist_rot")]:
            for k in [s for s in args.shapes if every or s in (2, 5, 12)]:
                for c in [c for c in args.copies if every or c in (3, 12, 40)]:
                    for noise in (args.noise if every else [0.0]):
                        X, y = copy_set(kind, k, c, noise, args.seed, args.data)
                        base = {"set": f"{kind} k={k} c={c} s={noise:g}", "kind": kind,
                                "copies": c, "noise": noise}
                        result["duplicates"] += duplicate_rows(X, y, search_params(kind),
                                                               args.seed, base)
                        save()
        if args.duplicates_natural_n:
            n = args.duplicates_natural_n
            X, y = make_variant("rotated45", n, 0, args.data)
            search = VARIANTS["rotated45"]["search"]
            base = {"set": f"rotated45 n={n} seed=0", "kind": "rotated45", "copies": None}
            result["duplicates"] += duplicate_rows(X, y, search, 0, base, fractions=(0.1, 0.5),
                                                   jitters=(12, 13))
            save()

    if not (result["rows"] or result["duplicates"] or result.get("copy_residual")):
        save()
    if result["rows"]:
        print()
        print_table(result["rows"], COLUMNS)
    if result["summary"]:  # copy sets only
        print()
        print_table(result["summary"], ["method", "kind", "noise", "sets", "exact",
                                        "exact_count", "max_abs_count_error", "mean_ari",
                                        "failed", "seconds"])
    if result["duplicates"]:
        print()
        cols = list(dict.fromkeys(c for r in result["duplicates"] for c in r
                                  if not c.endswith(("_error", "_seconds", "_crashed"))))
        print_table(result["duplicates"], cols)
    return result


if __name__ == "__main__":
    main()
