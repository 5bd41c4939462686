"""
Attention as kernel PCA, and KernelPCAAttention in a pipeline
=============================================================

Softmax attention ``h_i = sum_j softmax_j(s q_i . k_j) v_j`` is the projection of the query's
normalised feature ``varphi(q_i)`` onto the kernel-PCA axes of the keys **when the values have a
particular form**, ``V = G^-1 (I - 1_N) A``. :class:`~invariant_cluster.KernelPCAAttention`
computes that form in ``fit`` and projects with one softmax attention in ``transform``. This
example checks the identity, then uses the estimator as a feature step in a scikit-learn
pipeline, where the size of its outputs matters. :doc:`/user_guide/kernel_pca` says which parts
of the reading hold for trained networks.
"""

# %%
# The identity, on random keys
# ----------------------------
# Softmax attention with the fitted values against the kernel-PCA projection, in float64.
import matplotlib.pyplot as plt
import numpy as np
from sklearn.decomposition import KernelPCA
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from invariant_cluster import KernelPCAAttention
from invariant_cluster.datasets import load_digits_images

rng = np.random.default_rng(0)
keys = rng.normal(size=(64, 16))         # N = 64 keys of dimension D = 16
queries = rng.normal(size=(10, 16))
kpca = KernelPCAAttention(n_components=8, device="cpu").fit(keys)
logits = kpca.scale_ * queries @ keys.T
weights = np.exp(logits - logits.max(axis=1, keepdims=True))
weights /= weights.sum(axis=1, keepdims=True)
attention_output = weights @ kpca.values_
print("largest |attention - projection|:", np.abs(attention_output - kpca.transform(queries)).max())

# %%
# A feature step in a pipeline
# ----------------------------
# The keys are 600 of scikit-learn's 8 x 8 digits (flattened, in [0, 1]; fitting is an
# eigendecomposition of an ``N x N`` matrix, so N stays small here); the downstream model is a
# logistic regression, scored by 5-fold cross-validation. The normalised exponential kernel
# ``exp(s x.y) / (g(x) g(y))`` has tiny eigenvalues, so the projections are tiny numbers too;
# standardising them before a regularised model is what makes them usable.
X, y = load_digits_images(return_X_y=True)
X, y = X[:600], y[:600]
fitted = KernelPCAAttention(n_components=32, device="cpu").fit(X)
print(f"largest eigenvalue {fitted.eigenvalues_[0]:.2e}, "
      f"output standard deviation {fitted.transform(X).std():.2e}")

pipelines = {
    "KernelPCAAttention -> logistic": make_pipeline(
        KernelPCAAttention(n_components=32, device="cpu"), LogisticRegression(max_iter=2000)),
    "KernelPCAAttention -> scale -> logistic": make_pipeline(
        KernelPCAAttention(n_components=32, device="cpu"), StandardScaler(),
        LogisticRegression(max_iter=2000)),
    "KernelPCA(rbf) -> logistic": make_pipeline(
        KernelPCA(n_components=32, kernel="rbf"), LogisticRegression(max_iter=2000)),
}
print(f"{'pipeline':<42}{'CV accuracy':>12}")
for name, pipe in pipelines.items():
    print(f"{name:<42}{cross_val_score(pipe, X, y, cv=5).mean():>12.3f}")

# %%
# The spectrum and the first two components
# -----------------------------------------
fig, axes = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
axes[0].semilogy(np.arange(1, 33), fitted.eigenvalues_, "o-")
axes[0].set(title="eigenvalues of the centred kernel / N", xlabel="component", ylabel="lambda_d")
Z = fitted.transform(X)
axes[1].scatter(Z[:, 0], Z[:, 1], c=y, cmap="tab10", s=6)
axes[1].set(title="digits on the first two axes (softmax attention output)",
            xlabel="component 1", ylabel="component 2")
plt.show()
