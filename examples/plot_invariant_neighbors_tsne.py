"""
Invariant neighbours -> t-SNE
=============================

The invariant distance gives every image a list of nearest neighbours that ignores its pose.
Written as a sparse k-nearest-neighbour graph, in the format of scikit-learn's
:class:`~sklearn.neighbors.KNeighborsTransformer` (a CSR matrix with one row per sample and the
distances to its ``k`` neighbours), it feeds any estimator that takes ``metric="precomputed"``:
here :class:`~sklearn.manifold.TSNE`, on MNIST digits rotated within +-45 degrees, against
t-SNE on the pixels. umap-learn's ``UMAP(precomputed_knn=(index, distance, None))`` and
scikit-learn's spectral clustering and DBSCAN take the same graph; see
:doc:`/user_guide/neighbor_graph`.

The neighbours come from :func:`invariant_cluster.neighbors.neighbor_search`: a shortlist by
rotation-invariant descriptors, then the exact search over rotations of the shortlisted
candidates only.
"""

# %%
# Rotated digits
# --------------
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy.sparse import csr_matrix
from sklearn.manifold import TSNE
from sklearn.neighbors import NearestNeighbors

from invariant_cluster.alignment import make_search_grid
from invariant_cluster.datasets import load_digits_images, load_mnist, make_transformed
from invariant_cluster.neighbors import neighbor_search

# The MNIST test split: $INVARIANT_CLUSTER_DATA, else ../../shared/data (next to the clone).
DATA_HOME = os.environ.get("INVARIANT_CLUSTER_DATA", "").split(os.pathsep)[0] or "../../shared/data"
try:
    images, digits = load_mnist(data_home=DATA_HOME, return_X_y=True)
    images = images.reshape(-1, 28, 28)
except FileNotFoundError:
    images, digits = load_digits_images(return_X_y=True)
    images = images.reshape(-1, 8, 8)

N, K, SEED = 500, 32, 0
subset = np.sort(np.random.default_rng(SEED).choice(len(images), N, replace=False))
X, _ = make_transformed(images[subset], max_rotation=45.0, random_state=SEED)
y = digits[subset]

# %%
# Two k-nearest-neighbour graphs
# ------------------------------
# Euclidean neighbours of the pixels, and invariant neighbours searched over 24 angles within
# +-60 degrees. Both are sparse: ``N x K`` distances, never an ``N x N`` matrix.
euclidean = NearestNeighbors(n_neighbors=K).fit(X.reshape(N, -1)).kneighbors_graph(
    mode="distance")

images_t = torch.as_tensor(X, dtype=torch.float32)[:, None]  # (N, C, H, W)
grid = make_search_grid("rotation", max_rotation=60.0, n_rotations=24, refine=False)
sq_dist, index, _ = neighbor_search(images_t, images_t, grid, k=K,
                                    exclude=torch.arange(N))  # leave each image out of its list
invariant = csr_matrix((sq_dist.sqrt().numpy().ravel(), index.numpy().ravel(),
                        np.arange(0, N * K + 1, K)), shape=(N, N))


def same_digit(graph, k=10):
    """Share of each sample's k nearest neighbours that show the same digit."""
    graph = graph.tocsr()
    order = np.argsort(graph.data.reshape(N, -1), axis=1)[:, :k]
    neighbours = graph.indices.reshape(N, -1)[np.arange(N)[:, None], order]
    return (y[neighbours] == y[:, None]).mean()


for name, graph in (("euclidean (pixels)", euclidean), ("invariant", invariant)):
    print(f"{name:<20} neighbours with the same digit: {same_digit(graph):.3f}")

# %%
# t-SNE on each graph
# -------------------
# ``metric="precomputed"`` with a sparse graph: t-SNE uses only the listed neighbours (it needs
# about ``3 * perplexity`` of them per sample: ``K = 32`` for ``perplexity=10``).
fig, axes = plt.subplots(1, 2, figsize=(11, 5), layout="constrained")
for ax, (name, graph) in zip(axes, (("euclidean neighbours", euclidean),
                                    ("invariant neighbours", invariant))):
    embedding = TSNE(perplexity=10, metric="precomputed", init="random", max_iter=500,
                     random_state=SEED).fit_transform(graph)
    ax.scatter(*embedding.T, c=y, cmap="tab10", s=8)
    for digit in range(10):
        cx, cy = np.median(embedding[y == digit], axis=0)
        ax.text(cx, cy, str(digit), fontsize=14, weight="bold", ha="center", va="center")
    ax.set(title=f"t-SNE on {name}", xticks=[], yticks=[])
plt.show()

# %%
# The rotations spread each digit over several islands of the pixel embedding; the invariant
# graph links the rotated copies of a digit directly, so each digit gathers in one place.
