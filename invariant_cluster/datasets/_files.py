"""The command line's readers: image arrays (``.npy``/``.npz``), IDX files, MRC stacks, folders
of images (PNG, JPEG, TIFF, BMP) and label files, turned into float32 images ``(n, C, H, W)``.

Every error is a ValueError (or FileNotFoundError, ImportError) whose message names the file and
what is wrong, in one line: the command line prints it as it is and exits with status 2.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ._idx import load_idx
from ._images import image_files, load_images, read_image
from ._mrc import load_mrc

MRC_SUFFIXES = {".mrc", ".mrcs"}
_KINDS = {".npy": "a NumPy .npy file", ".npz": "a NumPy .npz archive", ".mrc": "an MRC file",
          ".mrcs": "an MRC stack"}


def _one_line(exc):
    return " ".join(str(exc).split()) or type(exc).__name__


def as_images(array, source, image_shape=None):
    """Float32 images ``(n, C, H, W)`` from a numeric array, with clear errors."""
    a = np.asarray(array)
    if a.dtype == bool:
        a = a.astype(np.float32)
    if not np.issubdtype(a.dtype, np.number) or np.iscomplexobj(a):
        raise ValueError(f"{source}: expected a real numeric array, got dtype {a.dtype}")
    if a.ndim not in (2, 3, 4):
        raise ValueError(
            f"{source}: expected an array of shape (n, n_features), (n, H, W) or (n, C, H, W), "
            f"got shape {a.shape}"
        )
    if a.shape[0] < 2:
        raise ValueError(f"{source}: expected at least 2 images, got {a.shape[0]}")
    n, size = a.shape[0], math.prod(a.shape[1:])
    if size == 0:
        raise ValueError(f"{source}: expected images of at least one pixel, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{source}: contains NaN or infinity")
    # the estimators' bound on a squared norm in float32 (reliability page), as a bound on |x|
    from .._utils import magnitude_limit

    side = max(a.shape[-2:]) if a.ndim > 2 else max(image_shape or (math.isqrt(size),))
    limit = math.sqrt(magnitude_limit(np.float32, (1, side, side)) / size)
    peak = max(abs(float(a.max())), abs(float(a.min())))
    if peak >= limit:
        raise ValueError(
            f"{source}: values up to {peak:.3g} overflow float32 in the squared distance "
            f"between two images of {size} values; expected |x| < {limit:.3g} (rescale, e.g. "
            "to [0, 1])"
        )
    # at their values, as the Python API takes them: uint8 grey levels stay 0..255
    a = a.astype(np.float32)
    if image_shape is not None:
        shape = tuple(image_shape)
        if len(shape) == 2:
            shape = (1, *shape)
        if math.prod(shape) != size:
            raise ValueError(
                f"--image-shape: {' '.join(map(str, image_shape))} holds {math.prod(shape)} "
                f"values but each sample of {source} has {size}"
            )
        return a.reshape(n, *shape)
    if a.ndim == 2:
        side = math.isqrt(a.shape[1])
        if side * side != a.shape[1]:
            raise ValueError(
                f"{source}: rows of {a.shape[1]} values are not square images; give "
                "--image-shape H W (or C H W)"
            )
        return a.reshape(n, 1, side, side)
    return a.reshape(n, 1, *a.shape[1:]) if a.ndim == 3 else a


def _npz_member(z, path, names, what):
    key = next((k for k in names if k in z), None)
    if key is None and what is not None:
        raise ValueError(f"{path}: expected an array named {what} in the .npz file, found "
                         f"{', '.join(z.keys()) or 'no arrays'}")
    return None if key is None else z[key]


def load_folder(path, invert=False):
    """Grey-level images ``(n, H, W)`` uint8 of a folder's images of one size, sorted by name
    (``invert``: ``255 - x``), and the file names."""
    path = Path(path)
    files = image_files(path)
    images, first = [], None
    for f in files:
        a = read_image(f, lambda im: np.asarray(im.convert("L"), dtype=np.uint8))
        if first is None:
            first = (f, a.shape)
        elif a.shape != first[1]:
            raise ValueError(
                f"{path}: all images must have the same size, but {first[0].name} is "
                f"{first[1][1]}x{first[1][0]} and {f.name} is {a.shape[1]}x{a.shape[0]} "
                "(width x height); give --image-size N to scale each to N x N"
            )
        images.append(255 - a if invert else a)
    return np.stack(images), [f.name for f in files]


def _sniff(path) -> str | None:
    """The suffix of the format a file's first bytes announce (``.npy``, ``.npz``, ``.mrc``), or
    None: an MRC file named ``.bin`` or ``.dat`` is read as MRC, not as IDX."""
    try:
        with open(path, "rb") as f:
            head = f.read(212)
    except OSError:
        return None
    if head.startswith(b"\x93NUMPY"):
        return ".npy"
    if head.startswith(b"PK\x03\x04"):
        return ".npz"
    if head[208:212] == b"MAP ":
        return ".mrc"
    return None


def _read_file(path, as_stack=False):
    """The array (and labels) of one file; any failure to parse it is a ValueError naming it
    (``as_stack``: an MRC file's sections as images, :func:`load_mrc`'s)."""
    suffix = path.suffix.lower()
    if suffix not in _KINDS:
        suffix = _sniff(path) or suffix
    try:
        if suffix == ".npy":
            return np.load(path, allow_pickle=False), None
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return (_npz_member(z, path, ("X", "data", "x", "images"), "'X' or 'data'"),
                        _npz_member(z, path, ("y", "target", "labels"), None))
        if suffix in MRC_SUFFIXES:
            return load_mrc(path, as_stack=as_stack), None
        return load_idx(path), None
    except ImportError:
        raise
    except Exception as exc:  # a corrupt file fails anywhere in NumPy's or zipfile's parsers
        msg = _one_line(exc)
        if str(path) not in msg:
            msg = f"{path}: cannot read it as {_KINDS.get(suffix, 'an IDX file')} ({msg})"
        raise ValueError(msg) from None


def load_labels(path):
    """One label per sample from ``.npy``, ``.npz``, ``.csv``/``.txt`` (one per line) or IDX."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--labels {path}: no such file")
    suffix = path.suffix.lower()
    if suffix not in _KINDS and suffix not in (".csv", ".txt"):
        suffix = _sniff(path) or suffix
    try:
        if suffix == ".npy":
            y = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                y = _npz_member(z, path, ("y", "target", "labels"), "'y' or 'target'")
        elif suffix in (".csv", ".txt"):
            y = np.loadtxt(path, dtype=str, delimiter=",", ndmin=1)
        else:
            y = load_idx(path)
    except Exception as exc:
        raise ValueError(f"--labels {path}: cannot read it ({_one_line(exc)})") from None
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"--labels {path}: expected one label per sample, got shape {y.shape}")
    return y


def load_input(path, labels=None, image_shape=None, image_size=None, invert=False,
               as_stack=False):
    """Read the input of the commands ``fit``, ``neighbors`` and ``class-averages``.

    Parameters
    ----------
    path : str or Path
        A ``.npy`` array, a ``.npz`` archive (images under ``X`` or ``data``, optional labels
        under ``y`` or ``target``), an MRC stack (``.mrcs``/``.mrc``, see
        :func:`~invariant_cluster.datasets.load_mrc`), an IDX file (``*-idx3-ubyte[.gz]``; any
        other name is read by what its first bytes announce: NumPy, zip, MRC, else IDX) or a
        folder of images (PNG, JPEG, TIFF, BMP; read as grey levels, sorted by file name) of
        one size, or of any sizes with ``image_size``.
    labels : str or Path, optional
        Labels: ``.npy``, ``.npz``, ``.csv``/``.txt`` (one per line) or IDX.
    image_shape : tuple of int, optional
        ``(H, W)`` or ``(C, H, W)`` to fold 2-D rows (default: square single-channel images).
    image_size : int, optional
        For a folder: each image scaled and centred on an ``image_size`` square
        (:func:`~invariant_cluster.datasets.load_images`, values in [0, 1]).
    invert : bool, default=False
        For a folder: dark objects on a light background made bright on a dark one.
    as_stack : bool, default=False
        For an MRC file: its sections read as images whatever its header says
        (:func:`~invariant_cluster.datasets.load_mrc`).

    Returns
    -------
    X : ndarray of shape (n, C, H, W), float32
        uint8 input is scaled to [0, 1]; other types are converted as they are.
    y : ndarray of shape (n,) or None
    names : list of str or None
        File names for a folder input.

    Raises
    ------
    ValueError, FileNotFoundError, ImportError
        With a one-line message that names the file and what is wrong.
    """
    path = Path(path)
    names, y = None, None
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir():
        if image_size is not None:
            bunch = load_images(path, image_size, invert=invert)
            array, names = bunch.images, bunch.filenames
        else:
            array, names = load_folder(path, invert)
    elif image_size is not None or invert:
        option = "--image-size" if image_size is not None else "--invert"
        raise ValueError(f"{option}: applies to a folder of images, got the file {path}")
    else:
        array, y = _read_file(path, as_stack)
    X = as_images(array, path, image_shape)
    if labels is not None:
        y = load_labels(labels)
    if y is not None:
        y = np.asarray(y)
        y = y.ravel() if y.ndim > 1 else y
        if len(y) != len(X):
            raise ValueError(f"labels: expected one label per image ({len(X)}), got {len(y)}")
    return X, y, names
