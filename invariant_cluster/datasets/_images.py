"""A folder of images of any sizes, brought to one square size (:func:`load_images`)."""

from __future__ import annotations

import numbers
from pathlib import Path

import numpy as np
from sklearn.utils import Bunch

#: File name endings read as images (case-insensitive), by Pillow.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")


def image_files(folder) -> list[Path]:
    """The image files of ``folder`` (by :data:`IMAGE_SUFFIXES`), sorted by name; other files
    are left out. A ValueError when there is none, FileNotFoundError when there is no folder."""
    folder = Path(folder)
    if not folder.exists():
        raise FileNotFoundError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise ValueError(f"{folder}: expected a folder of images, got a file")
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"{folder}: no images ({', '.join('*' + s for s in IMAGE_SUFFIXES)}) "
                         "in this folder")
    return files


def read_image(path, read):
    """``read(image)`` of the image file ``path`` opened by Pillow; a ValueError naming the
    file when Pillow cannot read it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return read(im)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read this image ({exc})") from None


def _grey(im) -> np.ndarray:
    if im.mode.startswith("I;16"):
        return np.asarray(im, dtype=np.float32) / np.float32(65535.0)
    return np.asarray(im.convert("L"), dtype=np.float32) / np.float32(255.0)


def read_grey(path) -> np.ndarray:
    """One image file in grey levels, float32 in [0, 1] (16-bit files by 65535, others by 255);
    a ValueError naming the file when Pillow cannot read it."""
    return read_image(path, _grey)


def border_median(image: np.ndarray) -> float:
    """The median of an image's outermost rows and columns: its background's value."""
    border = np.concatenate([image[0], image[-1], image[1:-1, 0], image[1:-1, -1]])
    return float(np.median(border))


def fit_to_square(image: np.ndarray, size: int, fill: float) -> np.ndarray:
    """``image`` (2-D, float32) with its longest side scaled to ``size`` (aspect kept, Lanczos,
    antialiased when shrinking) and centred on a ``size x size`` canvas of value ``fill``."""
    from PIL import Image

    h, w = image.shape
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    if (nh, nw) != (h, w):
        resized = Image.fromarray(image).resize((nw, nh), Image.Resampling.LANCZOS)
        # Lanczos rings a little beyond the input's range at sharp edges
        image = np.clip(np.asarray(resized, dtype=np.float32), 0.0, 1.0)
    canvas = np.full((size, size), fill, dtype=np.float32)
    top, left = (size - nh) // 2, (size - nw) // 2
    canvas[top:top + nh, left:left + nw] = image
    return canvas


def load_images(folder, size, *, invert=False):
    """Load a folder of images of any sizes as square grey images of one size.

    Each image is read in grey levels (in [0, 1]), its longest side is scaled to ``size``
    (the aspect ratio kept; antialiased) and it is centred on a ``size x size`` canvas filled
    with its background's value, the median of its outermost rows and columns. Image sets
    such as plankton, cells or galaxies rarely share one size; the original sizes are
    returned too, since an object's size can matter.

    Parameters
    ----------
    folder : str or os.PathLike
        A folder of PNG, JPEG, TIFF or BMP files (:data:`IMAGE_SUFFIXES`), read in the order
        of their names; other files are left out.
    size : int
        Side of the square images, at least 2.
    invert : bool, default=False
        Map each value ``x`` to ``1 - x``: dark objects on a light background become bright
        objects on a dark one (a white background becomes 0, as in MNIST), which the
        transformations' zero padding expects.

    Returns
    -------
    bunch : :class:`sklearn.utils.Bunch`
        With ``images`` of shape (n, size, size), float32 in [0, 1]; ``data`` of shape
        (n, size * size), a view of ``images``; ``filenames``, the file names in that order;
        ``original_shapes`` of shape (n, 2), int64, each file's ``(height, width)``; and
        ``background`` of shape (n,), float32, the canvas's value of each image (after
        ``invert``).

    Raises
    ------
    FileNotFoundError
        If ``folder`` does not exist.
    ValueError
        If ``folder`` is a file or holds no images, a file cannot be read as an image, or
        ``size`` is below 2.
    TypeError
        If ``size`` is not an int or ``invert`` not a bool.

    Examples
    --------
    >>> from invariant_cluster.datasets import load_images
    >>> photos = load_images("plankton/", size=64, invert=True)  # doctest: +SKIP
    >>> photos.images.shape, photos.original_shapes[0]  # doctest: +SKIP
    ((120, 64, 64), array([ 31, 60]))
    """
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise TypeError(f"size: expected an int, got {type(size).__name__}")
    if size < 2:
        raise ValueError(f"size: expected an int >= 2, got {size}")
    if not isinstance(invert, (bool, np.bool_)):
        raise TypeError(f"invert: expected a bool, got {type(invert).__name__}")
    size = int(size)
    files = image_files(folder)
    images = np.empty((len(files), size, size), dtype=np.float32)
    shapes = np.empty((len(files), 2), dtype=np.int64)
    background = np.empty(len(files), dtype=np.float32)
    for i, f in enumerate(files):
        grey = read_grey(f)
        if invert:
            grey = np.float32(1.0) - grey
        shapes[i] = grey.shape
        background[i] = border_median(grey)
        images[i] = fit_to_square(grey, size, background[i])
    return Bunch(images=images, data=images.reshape(len(files), -1),
                 filenames=[f.name for f in files], original_shapes=shapes,
                 background=background)
