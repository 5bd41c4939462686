"""Input checks, device resolution and random generators shared by the package."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

__all__ = [
    "resolve_device",
    "torch_generator",
    "check_images",
    "check_magnitude",
    "check_real_dtype",
    "evenly_spaced_indices",
    "magnitude_limit",
    "resolve_image_shape",
    "to_tensor",
    "torch_dtype_for",
]

_TORCH_REAL = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)
# Maintenance note: the bound on a sample's squared norm ``N`` is ``finfo.max / (16 L^2)`` with
# ``L = max(H, W)``. The grid distance ``||x||^2 + ||T y||^2 - 2 <x, T y>`` and the refined
# residual ``||x - T y||^2`` stay below ``9 N`` (a bilinear warp can raise the energy a little),
# and the refinement's normal equations hold the squared image gradient times squared pixel
# coordinates (at most about ``L^2 N``, the shift being capped at the image size), scaled by the
# Levenberg-Marquardt damping. ``16 L^2`` covers all of them with room to spare, and still
# admits pixel values up to ~1e15 for 28 x 28 float32 images, far beyond any real image.
_MAGNITUDE_MARGIN = 16.0


def resolve_device(device) -> torch.device:
    """Resolve ``"auto"`` to CUDA when available, else CPU; validate anything else.

    A device that this torch cannot use (``"mps"`` off Apple silicon or without torch's MPS
    support, ``"cuda"`` without CUDA, ``"cuda:N"`` past the last GPU) is a ``ValueError``
    naming ``device``, as a string or a :class:`torch.device`.

    Parameters
    ----------
    device : {"auto", "cpu", "cuda", "cuda:N", "mps"} or torch.device
    """
    expected = "'auto', 'cpu', 'cuda[:N]', 'mps' or a torch.device"
    if isinstance(device, torch.device):
        dev = device
    elif not isinstance(device, str):
        raise TypeError(f"device: expected {expected}, got {device!r}")
    elif device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"device: expected {expected}, got {device!r}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} was requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device!r} was requested but there are "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device: {device!r} was requested but MPS (Apple's Metal) is "
                             "not available to this torch")
    elif dev.type != "cpu":  # other backends (xpu, ...) that say whether they are there
        available = getattr(getattr(torch, dev.type, None), "is_available", None)
        if callable(available) and not available():
            raise ValueError(f"device: {device!r} was requested but {dev.type} is not "
                             "available to this torch")
    return dev


def evenly_spaced_indices(n: int, m: int, device="cpu") -> torch.Tensor:
    """``m`` evenly spaced indices of ``range(n)``, first and last included (``m <= n``):
    ``round(i (n - 1) / (m - 1))`` in int64 arithmetic.

    A float ``linspace`` cannot serve as an index: float32 rounds ``n - 1`` up to ``n`` once
    ``n > 2**24``, an index out of bounds.

    Examples
    --------
    >>> from invariant_cluster._utils import evenly_spaced_indices
    >>> evenly_spaced_indices(10, 4).tolist()
    [0, 3, 6, 9]
    >>> int(evenly_spaced_indices(2**25 + 1, 3)[-1]) == 2**25
    True
    """
    n, m = int(n), int(m)
    if m <= 1:
        return torch.zeros(min(m, n), dtype=torch.long, device=device)
    i = torch.arange(m, dtype=torch.long, device=device)
    # round half up: (2 i (n - 1) + (m - 1)) // (2 (m - 1)), exact in integers
    return (2 * i * (n - 1) + (m - 1)) // (2 * (m - 1))


def torch_generator(random_state, device="cpu") -> torch.Generator:
    """A local :class:`torch.Generator` seeded from ``random_state`` (never the global seed).

    ``random_state`` may be None, an int or a :class:`numpy.random.RandomState`/``Generator``.
    """
    from sklearn.utils import check_random_state

    if isinstance(random_state, np.random.Generator):
        seed = int(random_state.integers(0, 2**31 - 1))
    else:
        seed = int(check_random_state(random_state).randint(0, 2**31 - 1))
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def check_real_dtype(dtype, name="X"):
    """Refuse dtypes that hold no real numbers, naming the argument.

    Complex data gets a ``ValueError`` ("Complex data not supported", the wording and the type
    scikit-learn's estimator checks require of every estimator, so that functions and
    estimators answer alike); object, string and other non-numeric dtypes a ``TypeError``.
    ``dtype`` is a NumPy or torch dtype.
    """
    if isinstance(dtype, torch.dtype):
        if dtype.is_complex:
            raise ValueError(f"{name}: Complex data not supported, got dtype {dtype}")
        if not (dtype.is_floating_point or dtype in _TORCH_REAL):
            raise TypeError(f"{name}: expected a real numeric dtype, got {dtype}")
        return
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        raise ValueError(f"{name}: Complex data not supported, got dtype {dtype}")
    if dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected a real numeric array, got dtype {dtype}")


def refuse_complex(X, name="X"):
    """:func:`check_real_dtype`'s answer for complex ``X`` (array, tensor or array-like)."""
    if getattr(getattr(X, "dtype", None), "kind", "") == "c" or (
            isinstance(X, torch.Tensor) and X.is_complex()):
        check_real_dtype(X.dtype, name)


def as_array(X, name="X") -> np.ndarray:
    """``np.asarray(X)``, with ragged nested sequences refused by a message naming ``name``."""
    try:
        return np.asarray(X)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name}: could not be read as one array ({exc})") from exc


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor of a NumPy array, sharing its memory only where that is safe.

    ``torch.as_tensor`` refuses negative strides (``X[::-1]``, ``np.rot90`` views) and
    non-native byte order, and warns on read-only arrays (which torch could then write into);
    such arrays are copied first. Others are shared, as ``torch.as_tensor`` does.
    """
    array = np.asarray(array)
    if (not array.flags.writeable or not array.dtype.isnative
            or any(s < 0 for s in array.strides)):
        array = np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)
    return torch.as_tensor(array)


def magnitude_limit(dtype, image_shape=None) -> float:
    """Largest squared norm of one sample that computations in ``dtype`` can carry.

    ``finfo(dtype).max / (16 max(H, W)^2)`` for images of shape ``(C, H, W)``, ``finfo.max / 16``
    without a shape. See :func:`check_magnitude`.
    """
    side = max(image_shape[1:]) if image_shape is not None else 1
    big = float(torch.finfo(dtype).max if isinstance(dtype, torch.dtype) else np.finfo(dtype).max)
    return big / (_MAGNITUDE_MARGIN * side * side)


def check_magnitude(X, *, name="X", dtype=None, image_shape=None):
    """Refuse samples whose squared norm would overflow the working dtype.

    Every distance is built from squared norms, so a finite input whose ``||x||^2`` overflows
    (``1e20`` in float32) would give ``inf`` or NaN distances, and from them a wrong neighbour
    graph or clustering. Such input is refused with a ``ValueError`` naming ``name`` and the
    bound of :func:`magnitude_limit`; rescale it (e.g. divide by its maximum).

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n, n_features)
    name : str
    dtype : NumPy or torch dtype, optional
        The dtype the computation runs in (None: float64 for float64 input, else float32).
    image_shape : tuple (C, H, W), optional
    """
    if dtype is None:
        dtype = torch_dtype_for(X)
    if X.shape[0] == 0 or X.shape[1] == 0:
        return
    if isinstance(X, torch.Tensor):
        sq = float(torch.linalg.vector_norm(X, dim=1, dtype=torch.float64).max()) ** 2
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            # in the input's dtype first (a float64 accumulator makes einsum buffer every row:
            # 20 times slower on 20,000,000 one-pixel images); float64 only where that overflows
            sq = float(np.einsum("ij,ij->i", X, X).max()) if X.dtype.kind == "f" else math.inf
            if not math.isfinite(sq):  # (integers would wrap round instead)
                sq = float(np.einsum("ij,ij->i", X, X, dtype=np.float64).max())
    limit = magnitude_limit(dtype, image_shape)
    if not sq <= limit:
        kind = str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) \
            else np.dtype(dtype).name
        raise ValueError(
            f"{name}: a sample's squared norm is {sq:.3g}, above {limit:.3g}, the most that "
            f"computations in {kind} can carry for this image size; rescale the data "
            "(e.g. divide by its largest absolute value)"
        )


def torch_dtype_for(array) -> torch.dtype:
    """float64 stays float64; every other real dtype computes in float32."""
    return torch.float64 if array.dtype in (np.float64, torch.float64) else torch.float32


def resolve_image_shape(n_features: int, image_shape=None, *, name="image_shape"):
    """The ``(C, H, W)`` that folds ``n_features`` values into an image.

    ``None`` means a square single-channel image when ``n_features`` is a perfect square and a
    ``1 x n_features`` image otherwise (so that any 2-D array is accepted, as scikit-learn's
    estimator checks expect).
    """
    if image_shape is None:
        side = math.isqrt(n_features)
        if side * side == n_features:
            return (1, side, side)
        return (1, 1, n_features)
    if isinstance(image_shape, numbers.Integral) or not hasattr(image_shape, "__len__"):
        raise TypeError(f"{name}: expected a tuple (H, W) or (C, H, W), got {image_shape!r}")
    shape = tuple(image_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3 or not all(isinstance(s, numbers.Integral) and s > 0 for s in shape):
        raise ValueError(
            f"{name}: expected a tuple of positive ints (H, W) or (C, H, W), got {image_shape!r}"
        )
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != n_features:
        raise ValueError(
            f"{name}: {image_shape!r} holds {math.prod(shape)} values but the input has "
            f"{n_features} features per sample"
        )
    return shape


def check_images(X, *, name="X", image_shape=None, allow_torch=True, min_samples=1,
                 check_norms=True):
    """Validate an image array and return ``(X_flat, image_shape)``.

    Accepts ``(n, n_features)`` (folded with ``image_shape``), ``(n, H, W)`` or ``(n, C, H, W)``,
    as NumPy or torch. Returns a 2-D array of the same kind (NumPy stays NumPy; float64 stays
    float64, any other real dtype becomes float32) and the ``(C, H, W)`` shape.

    Raises ``TypeError`` for object or non-numeric dtypes and ``ValueError`` for complex data,
    wrong dimensions, empty arrays, too few samples, non-finite values and (``check_norms``)
    values whose squared norm would overflow (:func:`check_magnitude`), naming ``name``. NumPy
    input of any strides, byte order or writeability comes back C-contiguous and safe to hand
    to torch.
    """
    if isinstance(X, torch.Tensor):
        if not allow_torch:
            raise TypeError(f"{name}: expected a NumPy array, got a torch.Tensor")
        check_real_dtype(X.dtype, name)
        dtype = torch.float64 if X.dtype == torch.float64 else torch.float32
        X = X.to(dtype)
        finite = bool(torch.isfinite(X).all()) if X.numel() else True
    else:
        X = as_array(X, name)
        check_real_dtype(X.dtype, name)
        # C order: torch cannot share negative strides (np.rot90 views, X[::-1])
        X = X.astype(np.float64 if X.dtype == np.float64 else np.float32, order="C",
                     copy=False)
        finite = bool(np.isfinite(X).all()) if X.size else True
    if X.ndim not in (2, 3, 4):
        raise ValueError(
            f"{name}: expected shape (n_samples, n_features), (n, H, W) or (n, C, H, W), "
            f"got an array with shape {tuple(X.shape)}"
        )
    n = X.shape[0]
    if n < min_samples:
        raise ValueError(
            f"{name}: expected at least {min_samples} sample(s), got shape {tuple(X.shape)}"
        )
    if X.ndim == 2:
        if X.shape[1] == 0:
            raise ValueError(f"{name}: got 0 features per sample, shape {tuple(X.shape)}")
        shape = resolve_image_shape(X.shape[1], image_shape)
    else:
        shape = (1, *X.shape[1:]) if X.ndim == 3 else tuple(X.shape[1:])
        if 0 in shape:
            raise ValueError(f"{name}: got an empty image shape {tuple(X.shape)}")
        if image_shape is not None:
            shape = resolve_image_shape(math.prod(shape), image_shape)
        X = X.reshape(n, -1)
    if not finite:
        raise ValueError(f"{name}: contains NaN or infinity")
    shape = tuple(int(s) for s in shape)
    if check_norms:
        check_magnitude(X, name=name, image_shape=shape)
    return X, shape


def flatten_images(X, image_shape, name="X"):
    """Flatten ``(n, H, W)``/``(n, C, H, W)`` input; return ``(X2d, image_shape or None)``.

    The estimators' first step, before scikit-learn's ``validate_data``: nested lists and
    tuples become arrays (so a list of ``(H, W)`` images is accepted like their stack), complex
    data is refused as everywhere in the package (:func:`check_real_dtype`), and NumPy arrays
    come back C-contiguous (torch cannot share negative strides). Other 2-D inputs (data frames,
    sparse matrices) pass unchanged, for ``validate_data`` to judge.
    """
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().numpy()
    elif isinstance(X, (list, tuple)):
        X = as_array(X, name)
    refuse_complex(X, name)
    if getattr(X, "ndim", 0) in (3, 4):
        shape = tuple(X.shape[1:]) if X.ndim == 4 else (1, *X.shape[1:])
        if image_shape is not None:
            shape = resolve_image_shape(math.prod(shape), image_shape)
        X = np.asarray(X).reshape(X.shape[0], math.prod(X.shape[1:]))
        return np.ascontiguousarray(X), shape
    if isinstance(X, np.ndarray) and X.ndim == 2:
        X = np.ascontiguousarray(X)
    return X, None
