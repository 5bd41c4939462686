"""
Figure 2, made quantitative: groups of SE(2) copies
===================================================

The paper's Figure 2 takes a few images, copies each under random rotations and translations
(SE(2)), and argues that iterating **invariant attention** collapses the copies of each image
onto one *invariant mean*, whereas plain **kernel attention** (the same attention without the
alignment) mixes them up. Here the experiment is scored: the clusters found are compared with
the images the copies came from by the adjusted Rand index (ARI; 1 is a perfect recovery, 0 is
chance), for invariant attention, kernel attention and k-means on the pixels.

Both attention methods are :class:`~invariant_cluster.InvariantAttentionClusterer`:
``group="none"`` is kernel attention (Gaussian blurring mean shift) and ``group="se2"``
searches rotations and shifts. Neither is told how many source images there are; k-means is.
"""

# %%
# The data: eight random SE(2) copies of each of four digits
# ----------------------------------------------------------
# Rotations are uniform over the full circle, shifts within one pixel (small, so that the
# search, 36 angles x 9 shifts, keeps this page quick to build).
import os

import matplotlib.pyplot as plt
import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_digits_images, load_mnist, make_transformed_copies
from invariant_cluster.plotting import (
    plot_alignments,
    plot_attention_weights,
    plot_images,
    plot_invariant_means,
)

# The MNIST test split: $INVARIANT_CLUSTER_DATA, else ../../shared/data (next to the clone).
DATA_HOME = os.environ.get("INVARIANT_CLUSTER_DATA", "").split(os.pathsep)[0] or "../../shared/data"
try:
    images, targets = load_mnist(data_home=DATA_HOME, return_X_y=True)
    images = images.reshape(-1, 28, 28)
except FileNotFoundError:
    images, targets = load_digits_images(return_X_y=True)
    images = images.reshape(-1, 8, 8)
max_translation = 1

n_copies = 8
picked = [int(np.flatnonzero(targets == digit)[0]) for digit in (1, 3, 4, 7)]
X = np.concatenate([
    make_transformed_copies(images[i], n_copies, max_rotation=180.0,
                            max_translation=max_translation, random_state=k)[0]
    for k, i in enumerate(picked)
]).astype(np.float32)
source = np.repeat(np.arange(len(picked)), n_copies)  # which image each copy came from
plot_images(X, captions=[f"image {k}" for k in source], n_cols=n_copies,
            title="the input: 8 SE(2) copies of each of 4 images")
plt.show()

# %%
# Three clusterings, one score
# ----------------------------
common = dict(random_state=0)  # every other parameter at its default
kernel = InvariantAttentionClusterer(group="none", **common).fit(X)
invariant = InvariantAttentionClusterer(group="se2", max_rotation=180.0, n_rotations=36,
                                        max_translation=max_translation, **common).fit(X)
kmeans = KMeans(n_clusters=len(picked), n_init=10, random_state=0).fit(X.reshape(len(X), -1))

scores = {
    "invariant attention": (invariant.n_clusters_, invariant.labels_),
    "kernel attention": (kernel.n_clusters_, kernel.labels_),
    "k-means (told k = 4)": (len(picked), kmeans.labels_),
}
print(f"{'method':<24}{'clusters':>9}{'ARI':>8}")
for name, (n_found, labels) in scores.items():
    print(f"{name:<24}{n_found:>9}{adjusted_rand_score(source, labels):>8.3f}")

# %%
# The invariant means (one per cluster) next to kernel attention's means: the invariant means
# are sharp digits in one pose, the plain means are blurs of copies in different poses.
fig, axes = plt.subplots(1, 2, figsize=(10, 2.8), layout="constrained")
plot_invariant_means(invariant, ax=axes[0], title="invariant attention: invariant means")
plot_invariant_means(kernel, ax=axes[1], max_clusters=8, title="kernel attention: means")
plt.show()

# %%
# What the attention looked at
# ----------------------------
# Rows are queries and columns keys, both sorted by cluster. Invariant attention's weights stay
# inside the blocks of copies of one image; kernel attention's spread across them.
fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), layout="constrained")
plot_attention_weights(invariant, ax=axes[0], title="invariant attention")
plot_attention_weights(kernel, ax=axes[1], title="kernel attention")
plt.show()

# %%
# The alignments
# --------------
# ``alignments_[i]`` is the transformation (angle in degrees, shift in pixels) that moves copy
# ``i`` onto its cluster's mean: top row the copies, middle row the copies so moved, bottom row
# the mean.
plot_alignments(invariant, X, n=8)
plt.show()
