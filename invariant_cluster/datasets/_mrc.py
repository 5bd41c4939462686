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


_HEADER_GAPS = {"Map ID string not found": "no 'MAP ' ID string",
                "Unrecognised machine stamp": "no machine stamp"}


def _header_gap(message):
    """What a message of ``mrcfile`` says the header lacks, where it is only the ``"MAP "`` ID
    string or the machine stamp (older writers leave them out), else None."""
    return next((gap for start, gap in _HEADER_GAPS.items() if str(message).startswith(start)),
                None)


def _open_mrc(mrcfile, path, read, *, header_only=False):
    """``read(mrc)`` on the open file: strict first, then, where only the ID string or the
    machine stamp is missing, permissively, with a warning naming what is missing (the data
    must still be all there, of a known mode)."""
    try:
        # mrcfile warns about odd but readable headers; the checks of the caller are ours
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with mrcfile.open(path, mode="r", permissive=False,
                              header_only=header_only) as mrc:
                return read(mrc)
    except ValueError as exc:
        if _header_gap(exc) is None:
            raise
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mrcfile.open(path, mode="r", permissive=True, header_only=header_only) as mrc:
            result = read(mrc)
            complete = header_only or mrc.data is not None
    messages = [" ".join(str(w.message).split()) for w in caught]
    if not complete:
        raise ValueError("; ".join(m for m in messages if _header_gap(m) is None)
                         or "no data in the file")
    gaps = [g for g in _HEADER_GAPS.values() if g in map(_header_gap, messages)]
    warnings.warn(f"{path}: the MRC header has {' and '.join(gaps)} (as older programs write "
                  "it); read anyway", RuntimeWarning, stacklevel=3)
    return result


def load_mrc(path, *, return_voxel_size=False, as_stack=False):
    """Read an MRC image stack (``.mrcs``, or a ``.mrc`` holding a stack) as float32 images.

    Needs the optional package ``mrcfile`` (``pip install invariant_cluster[mrc]``). A header
    without the ``"MAP "`` ID string or the machine stamp (not MRC2014-valid, as older programs
    write it) is read anyway, with a ``RuntimeWarning`` that names what is missing.

    Parameters
    ----------
    path : str or os.PathLike
        The file. A ``.mrcs`` file is read as a stack of images whatever its header's space
        group says (the suffix is the field's convention for stacks). Any other name must hold
        a stack by the header (space group 0, ``mrcfile``'s ``is_image_stack()``) or a single
        image; a 3-D volume (``nz > 1`` with a space group other than 0) is refused unless
        ``as_stack`` is True.
    return_voxel_size : bool, default=False
        Also return the voxel size from the header.
    as_stack : bool, default=False
        Read the sections as images whatever the header's space group says: for stacks saved
        as ``.mrc`` with a volume's header (EMPIAR depositions; a STAR file naming
        ``N@file.mrc`` says the file is a stack).

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
    TypeError
        If ``as_stack`` is not a bool.
    ValueError
        If the file is not an MRC file or is truncated, holds complex or unknown pixel modes,
        is a 3-D volume (without ``as_stack``), or holds NaN or infinity. The message names
        the file.

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
    if not isinstance(as_stack, (bool, np.bool_)):
        raise TypeError(f"as_stack: expected a bool, got {type(as_stack).__name__}")
    mrcfile = import_mrcfile()
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a folder, expected an MRC file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")

    def read(mrc):
        mode = int(mrc.header.mode)
        return (mode, int(mrc.header.nz), int(mrc.header.ispg),
                tuple(float(v) for v in mrc.voxel_size.item()),
                None if mode not in _REAL_MODES or mrc.data is None else np.asarray(mrc.data))

    try:
        mode, nz, ispg, voxel, data = _open_mrc(mrcfile, path, read)
    except (ValueError, OSError, EOFError) as exc:
        text = " ".join(str(exc).split())
        if "mode" in text.lower():  # mrcfile refuses modes it does not know
            raise ValueError(f"{path}: unsupported MRC mode ({text}); {_known_modes()}") from None
        raise ValueError(
            f"{path}: cannot read it as an MRC file, it is truncated or not MRC ({text})"
        ) from None
    if data is None:
        raise ValueError(f"{path}: unsupported MRC mode {mode}; {_known_modes()}")
    if nz > 1 and ispg != 0 and path.suffix.lower() != ".mrcs" and not as_stack:
        raise ValueError(
            f"{path}: a 3-D volume of {nz} sections (header space group {ispg}), expected a "
            "stack of 2-D images (space group 0, or the suffix .mrcs; as_stack=True, or "
            "--stack on the command line, reads its sections as images)"
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
    data (a header without the ``"MAP "`` ID or machine stamp as :func:`load_mrc` reads it)."""
    mrcfile = import_mrcfile()
    return _open_mrc(mrcfile, path, lambda mrc: tuple(float(v) for v in mrc.voxel_size.item()),
                     header_only=True)
