"""Datasets: the IDX reader, MNIST / Fashion-MNIST loaders and fetchers, an offline default
(scikit-learn's digits), makers of randomly rotated and translated images, MRC image
stacks (:func:`load_mrc`, :func:`save_mrc`) and folders of images of any sizes
(:func:`load_images`).

Where the data is looked for
----------------------------
:func:`load_mnist` and :func:`load_fashion_mnist` never touch the network. They look for the four
standard files ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (each with or without ``.gz``) in, in
this order:

1. ``data_home`` (the argument),
2. every directory in the environment variable ``INVARIANT_CLUSTER_DATA`` (``os.pathsep``
   separated),
3. ``~/invariant_cluster_data``,
4. Debian's ``/usr/share/datasets/<name>`` (``apt-get install dataset-fashion-mnist`` puts
   Fashion-MNIST in ``/usr/share/datasets/fashion-mnist``).

In each of the first three the files may sit in the subfolder ``mnist/`` (resp.
``fashion-mnist/``), which is tried first, or directly in the directory itself, so that both
``data_home="/data"`` and ``data_home="/data/mnist"`` work. A directory named after the *other*
dataset is not searched directly, so Fashion-MNIST is never read from a folder ``mnist/``.

:func:`fetch_mnist` and :func:`fetch_fashion_mnist` download the missing files first (into
``data_home``, else the first directory of ``INVARIANT_CLUSTER_DATA``, else
``~/invariant_cluster_data``; in the dataset's subfolder) and verify their MD5 checksums against
:data:`CHECKSUMS`.

Layout
------
One private module per concern, all re-exported here: ``_idx`` (the IDX format), ``_mnist``
(MNIST and Fashion-MNIST files and downloads), ``_digits`` (scikit-learn's digits),
``_generators`` (SE(2) makers), ``_mrc`` (MRC stacks), ``_images`` (image folders brought to
one size) and ``_files`` (what the command line reads: arrays, IDX and MRC files, image
folders, label files).
"""

from __future__ import annotations

from ._digits import load_digits_images
from ._generators import make_transformed, make_transformed_copies
from ._idx import load_idx
from ._images import load_images
from ._mnist import CHECKSUMS as _CHECKSUMS
from ._mnist import (
    DATA_ENV as DATA_ENV,
)
from ._mnist import (
    MIRROR_ENV as MIRROR_ENV,
)
from ._mnist import MIRRORS as _MIRRORS
from ._mnist import (
    fetch_fashion_mnist,
    fetch_mnist,
    load_fashion_mnist,
    load_mnist,
)
from ._mrc import load_mrc, mrc_voxel_size, save_mrc

__all__ = [
    "CHECKSUMS",
    "MIRRORS",
    "load_idx",
    "load_mnist",
    "load_fashion_mnist",
    "fetch_mnist",
    "fetch_fashion_mnist",
    "load_digits_images",
    "load_images",
    "load_mrc",
    "save_mrc",
    "mrc_voxel_size",
    "make_transformed",
    "make_transformed_copies",
]

# the same dict objects as in _mnist (patching one patches the other); assigned here so that
# the documentation finds their doc comments
#: Known MD5 checksums of the ``.gz`` files, ``{dataset: {file name: (md5, ...)}}``.
#: A downloaded file must match one of its values. Patch this dict to test against fake data.
CHECKSUMS = _CHECKSUMS
#: Default download mirrors (base URLs, tried in order) per dataset.
MIRRORS = _MIRRORS
