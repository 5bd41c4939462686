"""
Class averages of noisy projections (cryo-EM style)
===================================================

Cryo-electron microscopy images one molecule many times, each copy seen from an unknown
direction and turned by an unknown angle in the image plane, at a signal-to-noise ratio below 1.
Its "2D classification" finds, for each image, the images of the same view (whatever their
in-plane angle) and averages them, aligned, into a denoised **class average**.

:func:`~invariant_cluster.class_averages` does exactly this: the image's invariant nearest
neighbours, each warped onto it, averaged. A projection from the opposite direction is the
mirror image of another one, so the search also covers mirror images (``reflection=True``, the
group E(2) = rotations, translations and a mirror).

The data here come from a small simulator written below (no cryo-EM package needed): a
"molecule" of Gaussian blobs in 3-D, projected along random directions. The measured comparison
with ASPIRE, the field's Python library, on its own simulated projections is
``benchmarks/bench_cryoem.py`` (its table is in :doc:`/benchmarks`).
"""

# %%
# Projections of a synthetic molecule
# -----------------------------------
# 24 Gaussian blobs at random positions (an asymmetric molecule); each image is the projection
# along the third row of a uniformly random rotation, so the in-plane angle is random too.
import matplotlib.pyplot as plt
import numpy as np
from scipy.spatial.transform import Rotation

from invariant_cluster import DihedralPCA, class_averages

rng = np.random.default_rng(0)
L, n, n_blobs = 32, 300, 24
centres = rng.normal(0, 4.0, (n_blobs, 3))
widths = rng.uniform(1.2, 2.2, n_blobs)
rotations = Rotation.random(n, random_state=0).as_matrix()  # (n, 3, 3)

xy = np.arange(L) - (L - 1) / 2
px, py = np.meshgrid(xy, xy, indexing="xy")
# blob b lands at (R[0] . c_b, R[1] . c_b) in image i, a 2-D Gaussian of the same width
c2 = np.einsum("nij,bj->nbi", rotations[:, :2], centres)  # (n, blobs, 2)
d2 = (px[None, None] - c2[..., 0, None, None]) ** 2 + (py[None, None] - c2[..., 1, None, None]) ** 2
clean = np.exp(-d2 / (2 * widths[None, :, None, None] ** 2)).sum(1).astype(np.float32)

snr = 0.5  # signal power / noise variance
noise_sd = np.sqrt(clean.var(axis=(1, 2)).mean() / snr)
noisy = clean + rng.normal(0, noise_sd, clean.shape).astype(np.float32)

# %%
# Class averages
# --------------
# Each image with its 10 invariant nearest neighbours (36 angles, refined, mirrors allowed),
# aligned onto it and averaged. The class average stays in the image's own pose, so it is
# compared with the image's clean projection directly.
averages = class_averages(noisy, n_neighbors=10, reflection=True)

# %%
# The search on a denoised copy
# -----------------------------
# Pixel by pixel, two noisy images of one view differ mostly by their noise. Searching on a
# denoised copy finds better neighbours: :class:`~invariant_cluster.denoise.DihedralPCA` averages
# the images down to 16 x 16 pixels and keeps 20 principal directions of their covariance,
# averaged over quarter turns and mirrors so that the denoising commutes with them. The
# alignments found there (shifts scaled back) then average the ORIGINAL noisy images.
denoised_search = class_averages(noisy, n_neighbors=10, reflection=True,
                                 denoise=DihedralPCA(20, output_size=16))


def corr(a, b):
    a = a.reshape(len(a), -1) - a.reshape(len(a), -1).mean(1, keepdims=True)
    b = b.reshape(len(b), -1) - b.reshape(len(b), -1).mean(1, keepdims=True)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


print(f"median correlation with the clean projection: noisy {np.median(corr(noisy, clean)):.3f}, "
      f"class average {np.median(corr(averages, clean)):.3f}, with the search on the denoised "
      f"copy {np.median(corr(denoised_search, clean)):.3f}")

# %%
# Side by side
# ------------
# Top: the noisy images; then their class averages, searched on the pixels and on the denoised
# copy; bottom: the clean projections (which a real experiment never sees).
show = np.arange(8)
fig, axes = plt.subplots(4, len(show), figsize=(1.4 * len(show), 5.8))
for col, i in enumerate(show):
    for row, (img, name) in enumerate(((noisy, "noisy"), (averages, "class average"),
                                       (denoised_search, "denoised search"),
                                       (clean, "clean"))):
        ax = axes[row, col]
        ax.imshow(img[i], cmap="gray")
        ax.set_xticks([])
        ax.set_yticks([])
        if col == 0:
            ax.set_ylabel(name, fontsize=8)
fig.tight_layout()
plt.show()
