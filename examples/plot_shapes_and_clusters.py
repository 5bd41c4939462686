"""
Shapes, then clusters: what a count stands on
==============================================

A fit has two levels. The **shapes** are the groups of samples that are transformed copies of
one image (``shape_labels_``, ``n_shapes_``, ``shape_means_``); the **clusters** group the
shapes (``labels_``). Here six of scikit-learn's 8 x 8 digits are each
stored in 4 to 20 copies at arbitrary angles, next to 40 other digits stored once. The fit
finds every set of copies as one shape, then groups the shapes; the plot shows each cluster's
shapes by their invariant means, the picture to check before trusting a count.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.metrics import adjusted_rand_score

from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_digits_images, make_transformed_copies
from invariant_cluster.plotting import plot_shapes

digits = load_digits_images()
rng = np.random.default_rng(0)
picks = rng.choice(len(digits.images), 46, replace=False)
n_copies = [4, 6, 8, 12, 16, 20] + [1] * 40
X, shape = [], []
for j, (i, c) in enumerate(zip(picks, n_copies)):
    copies = (make_transformed_copies(digits.images[i], c, max_rotation=180, random_state=j)[0]
              if c > 1 else digits.images[i][None])
    X.append(copies)
    shape += [j] * c
X, shape = np.concatenate(X).astype(np.float32), np.asarray(shape)

est = InvariantAttentionClusterer(random_state=0).fit(X)
print(f"{len(X)} images: {est.n_shapes_} shapes (46 drawn), {est.n_clusters_} clusters "
      f"({est.count_rule_}); shapes against the truth: ARI "
      f"{adjusted_rand_score(shape, est.shape_labels_):.3f}")

# %%
# Each row is a cluster, each tile one of its shapes (its invariant mean) with its number of
# samples: a set of copies is one tile, whatever its size.
plot_shapes(est, max_clusters=8, max_shapes=8)
plt.tight_layout()
plt.show()
