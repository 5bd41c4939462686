"""MRC image stacks (``.mrcs``/``.mrc``, the format of cryo-electron microscopy) through
`mrcfile <https://mrcfile.readthedocs.io>`_, an optional dependency
(``pip install invariant_cluster[mrc]``)."""

from __future__ import annotations

import warnings

import numpy as np

from ._idx import _as_path

_MRC_HINT = "pip install invariant_cluster[mrc] (or: pip install mrcfile)"
# MRC modes holding real pixels: int8, int16, float32, uint16, float16
_REAL_MODES = {0: "int8", 1: "int16", 2: "float32", 6: "uint16", 12: "float16"}


def import_mrcfile():
    """The ``mrcfile`` module; an ImportError that says how to install it when it is missing
    (a command can call it first, to fail before a long run rather than at the end)."""
    try:
        import mrcfile
    except ImportError:
        raise ImportError(f"reading or writing MRC files needs mrcfile: {_MRC_HINT}") from None
    return mrcfile


def _known_modes():
    return "expected real pixels, one of the modes " + ", ".join(
        f"{m} ({name})" for m, name in _REAL_MODES.items())


def load_mrc(path, *, return_voxel_size=False):
    """Read an MRC image stack (``.mrcs``, or a ``.mrc`` holding a stack) as float32 images.

    Needs the optional package ``mrcfile`` (``pip install invariant_cluster[mrc]``).

    Parameters
    ----------
    path : str or os.PathLike
        The file. A ``.mrcs`` file is read as a stack of images whatever its header's space
        group says (the suffix is the field's convention for stacks). Any other name must hold
        a stack by the header (space group 0, ``mrcfile``'s ``is_image_stack()``) or a single
        image; a 3-D volume (``nz > 1`` with a space group other than 0) is refused.
    return_voxel_size : bool, default=False
        Also return the voxel size from the header.

    Returns
    -------
    images : ndarray of shape (n, H, W), float32
        One image per section (``nz`` of them, 1 for a single image), rows along the file's
        ``y`` axis. The file's values as they are (no rescaling). Particle boxes are centred
        on the pixel ``(W // 2, H // 2)``: warp them with ``rotation_center="fourier"``
        (:mod:`invariant_cluster.transforms`).
    voxel_size : tuple of float (x, y, z)
        The header's voxel size in ångström (0 where the file does not say), only if
        ``return_voxel_size`` is True.

    Raises
    ------
    ImportError
        If ``mrcfile`` is not installed; the message says how to install it.
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not an MRC file or is truncated, holds complex or unknown pixel modes,
        is a 3-D volume, or holds NaN or infinity. The message names the file.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import mrcfile
    >>> from invariant_cluster.datasets import load_mrc
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = os.path.join(tmp, "particles.mrcs")
    ...     with mrcfile.new(path) as mrc:
    ...         mrc.set_data(np.zeros((3, 16, 16), np.float32))
    ...     load_mrc(path).shape
    (3, 16, 16)
    """
    path = _as_path(path, "path")
    mrcfile = import_mrcfile()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        # mrcfile warns about odd but readable headers; the checks below are ours
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with mrcfile.open(path, mode="r", permissive=False) as mrc:
                mode = int(mrc.header.mode)
                nz = int(mrc.header.nz)
                ispg = int(mrc.header.ispg)
                voxel = tuple(float(v) for v in mrc.voxel_size.item())
                data = None if mode not in _REAL_MODES else np.asarray(mrc.data)
    except (ValueError, OSError, EOFError) as exc:
        text = " ".join(str(exc).split())
        if "mode" in text.lower():  # mrcfile refuses modes it does not know
            raise ValueError(f"{path}: unsupported MRC mode ({text}); {_known_modes()}") from None
        raise ValueError(
            f"{path}: cannot read it as an MRC file, it is truncated or not MRC ({text})"
        ) from None
    if data is None:
        raise ValueError(f"{path}: unsupported MRC mode {mode}; {_known_modes()}")
    if nz > 1 and ispg != 0 and path.suffix.lower() != ".mrcs":
        raise ValueError(
            f"{path}: a 3-D volume of {nz} sections (header space group {ispg}), expected a "
            "stack of 2-D images (space group 0, or the suffix .mrcs)"
        )
    images = data.astype(np.float32).reshape(-1, *data.shape[-2:])
    if not np.isfinite(images).all():
        raise ValueError(f"{path}: contains NaN or infinity")
    return (images, voxel) if return_voxel_size else images


def save_mrc(path, images, voxel_size=None):
    """Write images as an MRC image stack (space group 0), as :func:`load_mrc` reads it.

    ``path`` is replaced only once the whole file is written (a temporary file in the same
    folder, renamed), so a failed write leaves no half file.

    Parameters
    ----------
    path : str or path-like
    images : array-like of shape (n, H, W)
        Written as float32.
    voxel_size : float or tuple of 3 floats, optional
        The header's voxel size in ångström (None: mrcfile's default).
    """
    import os
    import tempfile
    from pathlib import Path

    mrcfile = import_mrcfile()
    path = Path(path)
    fd, tmp = tempfile.mkstemp(suffix=".mrcs", dir=path.parent)
    os.close(fd)
    try:
        with mrcfile.new(tmp, overwrite=True) as mrc:
            mrc.set_data(np.ascontiguousarray(images, dtype=np.float32))
            mrc.set_image_stack()
            if voxel_size is not None:
                mrc.voxel_size = voxel_size
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the result from others
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def mrc_voxel_size(path):
    """The header's voxel size ``(x, y, z)`` in ångström of an MRC file, read without the
    data."""
    mrcfile = import_mrcfile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mrcfile.open(path, mode="r", header_only=True) as mrc:
            return tuple(float(v) for v in mrc.voxel_size.item())
