"""
Rotated MNIST: invariant means, alignments and the confusion against k-means
============================================================================

A random subset of the MNIST test split, each digit rotated by a random angle within
+-45 degrees, is clustered into ten groups by k-means on the pixels and by invariant attention
searching rotations within +-60 degrees (13 grid angles, refined continuously). The scores are
ACC (accuracy under the best one-to-one matching of clusters to digits), ARI and NMI; the
confusion matrices show *which* digits each method mixes up. The subset is small (n = 250) so
that this page builds quickly; the benchmark ``benchmarks/bench_clustering.py`` makes the same
comparison at n = 2,000 (its table is in :doc:`/benchmarks` and in
:doc:`/user_guide/invariant_attention`).

The last section shows when invariance hurts: with a full-circle search an upright 6 and an
upright 9 are the same shape.
"""

# %%
# The data
# --------
import os
import warnings

import matplotlib.pyplot as plt
import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics.cluster import contingency_matrix

from invariant_cluster import InvariantAttentionClusterer, invariant_distances, warp_se2
from invariant_cluster.datasets import load_digits_images, load_mnist, make_transformed
from invariant_cluster.metrics import clustering_scores
from invariant_cluster.plotting import plot_alignments, plot_images, plot_invariant_means

# The MNIST test split: $INVARIANT_CLUSTER_DATA, else ../../shared/data (next to the clone).
DATA_HOME = os.environ.get("INVARIANT_CLUSTER_DATA", "").split(os.pathsep)[0] or "../../shared/data"
try:
    images, digits = load_mnist(data_home=DATA_HOME, return_X_y=True)
    images = images.reshape(-1, 28, 28)
except FileNotFoundError:
    images, digits = load_digits_images(return_X_y=True)
    images = images.reshape(-1, 8, 8)

N, SEED = 250, 0
rng = np.random.default_rng(SEED)
subset = np.sort(rng.choice(len(images), N, replace=False))
X, angles = make_transformed(images[subset], max_rotation=45.0, random_state=SEED)
y = digits[subset]
plot_images(X[:20], captions=[f"{d}, {a:+.0f}°" for d, a in zip(y[:20], angles[:20, 0])],
            n_cols=10, title="rotated digits (true digit, rotation applied)")
plt.show()

# %%
# k-means against invariant attention
# -----------------------------------
kmeans = KMeans(n_clusters=10, n_init=10, random_state=SEED).fit(X.reshape(N, -1))
invariant = InvariantAttentionClusterer(n_clusters=10, group="rotation", max_rotation=60.0,
                                        n_rotations=13, random_state=SEED)
with warnings.catch_warnings():
    warnings.simplefilter("error", ConvergenceWarning)  # it converges at the defaults
    invariant.fit(X)
predictions = {"k-means (pixels)": kmeans.labels_, "invariant attention": invariant.labels_}
print(f"{'method':<22}{'ACC':>7}{'ARI':>7}{'NMI':>7}")
for name, labels in predictions.items():
    s = clustering_scores(y, labels)
    print(f"{name:<22}{s['ACC']:>7.3f}{s['ARI']:>7.3f}{s['NMI']:>7.3f}")

# %%
# Confusion matrices
# ------------------
# Rows are the true digits, columns the clusters, reordered by the matching that ACC uses
# (cluster ``j`` is put under the digit it is matched to). What lies off the diagonal is what a
# method confuses.


def matched_confusion(y_true, labels):
    """Contingency table with the clusters ordered by their Hungarian match to the digits."""
    table = contingency_matrix(y_true, labels)
    rows, cols = linear_sum_assignment(-table)
    order = cols[np.argsort(rows)]
    rest = np.setdiff1d(np.arange(table.shape[1]), order)  # clusters left unmatched, if any
    return table[:, np.r_[order, rest]]


fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), layout="constrained")
for ax, (name, labels) in zip(axes, predictions.items()):
    table = matched_confusion(y, labels)
    ax.imshow(table, cmap="Blues")
    for (i, j), count in np.ndenumerate(table):
        if count:
            ax.text(j, i, count, ha="center", va="center", fontsize=7,
                    color="white" if count > table.max() / 2 else "black")
    ax.set(title=name, xlabel="cluster (matched order)", ylabel="true digit",
           xticks=range(table.shape[1]), yticks=range(10))
plt.show()

# %%
# Invariant means
# ---------------
# One mean per cluster: the average of its members, each aligned onto the mean first. The caption
# gives the cluster's id and the most common true digit among its members (the id is an index,
# not a digit).
majority = [np.bincount(y[invariant.labels_ == c], minlength=10).argmax()
            for c in range(invariant.n_clusters_)]
plot_invariant_means(invariant, title="invariant attention: invariant means",
                     captions=[f"c{c}: mostly {d}" for c, d in enumerate(majority)])
plt.show()

# %%
# Alignments
# ----------
# Top: inputs; middle: each input rotated by its alignment onto its cluster's mean (caption:
# the angle in degrees, counter-clockwise); bottom: that mean.
plot_alignments(invariant, X, n=10)
plt.show()

# %%
# When invariance hurts: a 6 is a rotated 9
# -----------------------------------------
# Invariance to *every* rotation throws away the information that tells an upright 6 from an
# upright 9. Take 50 unrotated sixes and 50 unrotated nines and count, for each image, how many of
# its 10 nearest invariant neighbours are of the other digit: with no rotation searched, within
# +-60 degrees, and over the full circle.
sixes, nines = np.flatnonzero(digits == 6)[:50], np.flatnonzero(digits == 9)[:50]
upright = images[np.r_[sixes, nines]]
is_nine = np.r_[np.zeros(50, bool), np.ones(50, bool)]
searches = {"no rotation": dict(group="none"),
            "within +-60°": dict(group="rotation", max_rotation=60.0, n_rotations=17),
            "full circle": dict(group="rotation", max_rotation=180.0, n_rotations=36)}
for name, search in searches.items():
    D = invariant_distances(upright, refine=False, **search)
    np.fill_diagonal(D, np.inf)
    neighbours = np.argsort(D, axis=1)[:, :10]
    wrong = (is_nine[neighbours] != is_nine[:, None]).mean()
    print(f"{name:<14} share of the 10 nearest neighbours of the other digit: {wrong:.3f}")

# %%
# Over the full circle, the nine closest to a six is that nine turned upside down:
D, tau = invariant_distances(upright[:50], upright[50:], group="rotation", max_rotation=180.0,
                             n_rotations=36, return_alignments=True)
i = int(np.argmin(D.min(axis=1)))
j = int(np.argmin(D[i]))
aligned = warp_se2(upright[50 + j][None], tau[i, j][None])[0]
fig, ax = plt.subplots(figsize=(5, 2.4), layout="constrained")
plot_images(np.stack([upright[i], upright[50 + j], aligned]), ax=ax, n_cols=3,
            captions=["a six", "a nine", f"the nine, {tau[i, j, 0]:+.0f}°"],
            title="a nine aligned onto a six")
plt.show()

# %%
# Choose ``max_rotation`` from the variation the data has (here +-45 degrees, searched within
# +-60), not the largest the method allows; see :doc:`/user_guide/parameters`.
