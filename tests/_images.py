"""Test images shared by the test modules, and where the MNIST-like test splits lie."""

import os
from pathlib import Path

import numpy as np

# the first folder of $INVARIANT_CLUSTER_DATA, else ../shared/data beside the repository
_ENV = os.environ.get("INVARIANT_CLUSTER_DATA")
DATA = (Path(_ENV.split(os.pathsep)[0]) if _ENV
        else Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()


def have_data(*names, labels=False):
    """Whether the test split of each data set ``names`` ("mnist", "fashion-mnist") is under
    ``DATA`` (its labels too with ``labels``)."""
    files = ("t10k-images-idx3-ubyte.gz",) + (("t10k-labels-idx1-ubyte.gz",) if labels else ())
    return all((DATA / n / f).is_file() for n in names for f in files)


def random_images(shape, seed=0, border=0):
    """Uniform random images; ``border`` dark pixels on every side (content never leaves)."""
    x = np.random.default_rng(seed).random(shape)
    if border:
        x[..., :border, :] = 0
        x[..., -border:, :] = 0
        x[..., :, :border] = 0
        x[..., :, -border:] = 0
    return x


def digit_images(digits):
    """One scikit-learn digit per class, upsampled 8 -> 12 px (bilinear) and padded to 16 x 16."""
    from scipy.ndimage import zoom

    from invariant_cluster.datasets import load_digits_images

    bunch = load_digits_images()
    out = []
    for d in digits:
        img = bunch.images[np.flatnonzero(bunch.target == d)[0]].astype(np.float64)
        out.append(np.pad(zoom(img, 1.5, order=1), 2))
    return np.stack(out)


def t_and_box():
    """Two 11 x 11 float32 shapes with no rotational symmetry between them: a "T" and the
    outline of a box (the exact-copies example of issue 19)."""
    t = np.zeros((11, 11), np.float32)
    t[2:9, 5] = 1
    t[2, 3:8] = 1
    box = np.zeros((11, 11), np.float32)
    box[3:8, 3:8] = 1
    box[4:7, 4:7] = 0
    return t, box


def shifted_digit_copies(n_shapes, n_copies, shift, seed=0):
    """Copies at any angle, shifted within ``+-shift`` px, of scikit-learn digits picked at
    random and drawn at twice their size on a 28 x 28 canvas; and the shape of each copy."""
    from invariant_cluster.datasets import load_digits_images, make_transformed_copies

    digits = load_digits_images().images
    rng = np.random.default_rng(seed)
    shapes = [np.pad(np.kron(digits[i], np.ones((2, 2))), 6)
              for i in rng.choice(len(digits), n_shapes, replace=False)]
    X = np.concatenate([make_transformed_copies(s, n_copies, max_rotation=180,
                                                max_translation=shift,
                                                random_state=seed * 1000 + j)[0]
                        for j, s in enumerate(shapes)])
    return X.astype(np.float32), np.repeat(np.arange(n_shapes), n_copies)
