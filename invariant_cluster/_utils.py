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
    "resolve_image_shape",
    "torch_dtype_for",
]


def resolve_device(device) -> torch.device:
    """Resolve ``"auto"`` to CUDA when available, else CPU; validate anything else.

    Parameters
    ----------
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device
    """
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(
            f"device: expected 'auto', 'cpu', 'cuda[:N]' or a torch.device, got {device!r}"
        )
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(
            f"device: expected 'auto', 'cpu', 'cuda[:N]' or a torch.device, got {device!r}"
        ) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} was requested but CUDA is not available")
    return dev


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


def check_images(X, *, name="X", image_shape=None, allow_torch=True, min_samples=1):
    """Validate an image array and return ``(X_flat, image_shape)``.

    Accepts ``(n, n_features)`` (folded with ``image_shape``), ``(n, H, W)`` or ``(n, C, H, W)``,
    as NumPy or torch. Returns a 2-D array of the same kind (NumPy stays NumPy; float64 stays
    float64, any other real dtype becomes float32) and the ``(C, H, W)`` shape.

    Raises ``TypeError`` for complex, object or non-numeric dtypes and ``ValueError`` for wrong
    dimensions, empty arrays, too few samples and non-finite values, naming ``name``.
    """
    if isinstance(X, torch.Tensor):
        if not allow_torch:
            raise TypeError(f"{name}: expected a NumPy array, got a torch.Tensor")
        if X.is_complex():
            raise TypeError(f"{name}: complex data is not supported, got dtype {X.dtype}")
        if not (X.is_floating_point() or X.dtype in (torch.uint8, torch.int16, torch.int32,
                                                     torch.int64, torch.int8, torch.bool)):
            raise TypeError(f"{name}: expected a real numeric dtype, got {X.dtype}")
        dtype = torch.float64 if X.dtype == torch.float64 else torch.float32
        X = X.to(dtype)
        finite = bool(torch.isfinite(X).all()) if X.numel() else True
    else:
        X = np.asarray(X)
        if X.dtype == object:
            raise TypeError(f"{name}: expected a real numeric array, got dtype object")
        if np.iscomplexobj(X):
            raise TypeError(f"{name}: complex data is not supported, got dtype {X.dtype}")
        if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
            raise TypeError(f"{name}: expected a real numeric array, got dtype {X.dtype}")
        X = X.astype(np.float64 if X.dtype == np.float64 else np.float32, copy=False)
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
    return X, tuple(int(s) for s in shape)


def flatten_images(X, image_shape):
    """Flatten ``(n, H, W)``/``(n, C, H, W)`` input; return ``(X2d, image_shape or None)``."""
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().numpy()
    if getattr(X, "ndim", 0) in (3, 4):
        shape = tuple(X.shape[1:]) if X.ndim == 4 else (1, *X.shape[1:])
        if image_shape is not None:
            shape = resolve_image_shape(math.prod(shape), image_shape)
        return np.asarray(X).reshape(X.shape[0], math.prod(X.shape[1:])), shape
    return X, None
