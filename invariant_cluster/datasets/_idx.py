"""The IDX file format (MNIST's): :func:`load_idx`."""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

# IDX element types: the third byte of the magic number.
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


def _as_path(path, name: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a str or os.PathLike, got {type(path).__name__}")
    return Path(path).expanduser()


def load_idx(path) -> np.ndarray:
    """Read an IDX file (the format of MNIST), gzip-compressed or not.

    Compression is detected from the gzip magic bytes, not from the file name.

    Parameters
    ----------
    path : str or os.PathLike
        The file.

    Returns
    -------
    array : ndarray
        The array with the shape given by the header and the header's element type
        (uint8, int8, int16, int32, float32 or float64), converted from the file's big-endian
        layout to the native byte order. A writable copy.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is a broken gzip stream, is truncated, has a wrong magic number, an
        unsupported type code, or holds more or fewer bytes than its header announces. The
        message names the file and what is wrong.

    Notes
    -----
    An IDX file is a big-endian header -- two zero bytes, one byte for the element type
    (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64), one byte for
    the number of dimensions, then one uint32 per dimension -- followed by the raw data in
    C order.

    Examples
    --------
    >>> import os, struct, tempfile
    >>> import numpy as np
    >>> from invariant_cluster.datasets import load_idx
    >>> header = bytes([0, 0, 0x08, 2]) + struct.pack(">II", 2, 3)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = os.path.join(tmp, "tiny-idx2-ubyte")
    ...     with open(path, "wb") as f:
    ...         _ = f.write(header + bytes(range(6)))
    ...     load_idx(path)
    array([[0, 1, 2],
           [3, 4, 5]], dtype=uint8)
    """
    path = _as_path(path, "path")
    raw = path.read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise ValueError(
                f"{path}: broken gzip stream, the file is truncated or corrupt ({exc})"
            ) from exc
    if len(raw) < 4:
        raise ValueError(
            f"{path}: truncated IDX file, expected a header of at least 4 bytes, "
            f"got {len(raw)} byte(s)"
        )
    if raw[0] != 0 or raw[1] != 0:
        raise ValueError(
            f"{path}: wrong magic number 0x{raw[:4].hex()}, an IDX file starts with two zero "
            "bytes, the type code and the number of dimensions (e.g. 0x00000803)"
        )
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        known = ", ".join(f"0x{c:02x} ({d.name})" for c, d in _IDX_DTYPES.items())
        raise ValueError(f"{path}: unsupported IDX type code 0x{code:02x}, expected one of {known}")
    dtype = _IDX_DTYPES[code]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(
            f"{path}: truncated IDX header, {ndim} dimension(s) need a {header}-byte header, "
            f"the file holds {len(raw)} byte(s)"
        )
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    count = math.prod(shape)
    expected = count * dtype.itemsize
    actual = len(raw) - header
    if actual < expected:
        raise ValueError(
            f"{path}: truncated IDX data, the header announces shape {shape} of {dtype.name} "
            f"({expected} bytes) but only {actual} bytes follow"
        )
    if actual > expected:
        raise ValueError(
            f"{path}: size does not match the header, shape {shape} of {dtype.name} needs "
            f"{expected} bytes but {actual} bytes follow ({actual - expected} too many)"
        )
    array = np.frombuffer(raw, dtype=dtype, count=count, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="))
