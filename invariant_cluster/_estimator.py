"""What the three estimators that search on SE(2) share: parameters, the grid, input checks.

As scikit-learn's ``KNeighborsTransformer`` inherits ``NeighborsBase._parameter_constraints``,
:class:`~invariant_cluster.InvariantAttentionClusterer`,
:class:`~invariant_cluster.InvariantKNeighborsTransformer` and
:class:`~invariant_cluster.KernelPCAAttention` take their common constraints, ``_grid`` and
``_validate`` from :class:`SE2SearchMixin`; :class:`~invariant_cluster.DihedralPCA` takes only
``_validate``, from :class:`ImageInputMixin`.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import validate_data

from ._utils import check_magnitude, flatten_images, resolve_image_shape
from .search import GROUPS, make_search_grid
from .search.descriptors import border_density, centred_images
from .transforms import ROTATION_CENTERS, centre_padding, pad_for_centre

# center="auto" centres the images when shifts are searched and the mean image's band of
# ceil(max_translation) pixels along the frame is at most this fraction as bright as the whole
# frame: the content then stays inside the frame, and its centre of mass moves with it
# (measured ratios: docs/design/defaults.rst).
EMPTY_BORDER = 0.1


def shift_params(offsets) -> np.ndarray:
    """``(n, 3)`` SE(2) parameters ``(0, tx, ty)`` of the pure shifts ``offsets`` ``(n, 2)``
    (e.g. the centring offsets of ``_centred``, to compose with alignments)."""
    offsets = np.asarray(offsets, dtype=np.float64)
    return np.concatenate([np.zeros((len(offsets), 1)), offsets], 1)


# every estimator that searches on the grid
SEARCH_CONSTRAINTS = {
    "group": [StrOptions(set(GROUPS))],
    "max_rotation": [Interval(numbers.Real, 0, None, closed="left")],
    "n_rotations": [Interval(numbers.Integral, 1, None, closed="left")],
    "max_translation": [Interval(numbers.Real, 0, None, closed="left")],
    "n_neighbors": [Interval(numbers.Integral, 1, None, closed="left")],
    "n_candidates": [Interval(numbers.Integral, 1, None, closed="left"), None],
    "image_shape": [tuple, list, None],
    "device": [str, torch.device],
    "reflection": ["boolean"],
}
# the estimators whose search the user steers (exact or shortlist, blocks, Dask, refinement)
# the estimators whose rotations may turn about the pixel (W // 2, H // 2) of particle stacks
ROTATION_CENTER_CONSTRAINTS = {"rotation_center": [StrOptions(set(ROTATION_CENTERS))]}
ENGINE_CONSTRAINTS = {
    "refine": ["boolean"],
    "neighbor_search": [StrOptions({"auto", "exact", "shortlist"})],
    "batch_size": [Interval(numbers.Integral, 1, None, closed="left"), None],
    "client": "no_validation",
}


class ImageInputMixin:
    """``_validate``: the input checks of every estimator that takes images (an
    ``image_shape`` parameter, an ``image_shape_`` attribute)."""

    # the fewest samples ``fit`` accepts
    _min_fit_samples = 1
    # the dtype whose range bounds the input's squared norms (None: float64 for float64 input,
    # float32 otherwise; see the user guide's reliability page)
    _magnitude_dtype = None

    def _validate(self, X, reset):
        """Flat float rows of ``X`` (images folded with ``image_shape``); sets ``image_shape_``
        in ``fit`` and checks it afterwards."""
        X2, shape = flatten_images(X, self.image_shape)
        dims = tuple(getattr(X2, "shape", ()))
        if len(dims) == 2 and dims[0] == 0:
            raise ValueError(f"X: expected at least 1 sample, got 0 samples (shape {dims})")
        # integers (uint8 images) become float32; float64 stays float64
        X2 = validate_data(self, X2, reset=reset, dtype=[np.float32, np.float64],
                           ensure_min_samples=self._min_fit_samples if reset else 1)
        if reset:
            self.image_shape_ = shape or resolve_image_shape(X2.shape[1], self.image_shape)
        elif shape is not None and tuple(shape) != tuple(self.image_shape_):
            raise ValueError(
                f"X: expected images of shape {tuple(self.image_shape_)} as in fit, got {shape}"
            )
        check_magnitude(X2, dtype=self._magnitude_dtype, image_shape=self.image_shape_)
        return X2


class SE2SearchMixin(ImageInputMixin):
    """``_parameter_constraints``, ``_grid``, ``_validate`` and ``_centred`` of the SE(2)
    estimators."""

    _parameter_constraints: dict = dict(SEARCH_CONSTRAINTS)

    def _grid(self, refine):
        """The validated :class:`~invariant_cluster.alignment.SearchGrid` of the parameters,
        with the continuous refinement when ``refine`` (the caller passes ``self.refine``
        where the estimator has that parameter)."""
        return make_search_grid(self.group, self.max_rotation, self.n_rotations,
                                self.max_translation, bool(refine), self.reflection,
                                image_shape=getattr(self, "image_shape_", None))

    def _rotation_center(self) -> str:
        """The estimator's ``rotation_center`` ("geometric" for one without the parameter)."""
        return getattr(self, "rotation_center", "geometric")

    def _frame_shape(self) -> tuple:
        """``(C, H, W)`` of the images the search works on: ``image_shape_`` with the zero row
        and column that ``rotation_center="fourier"`` appends to an even side
        (:func:`~invariant_cluster.transforms.centre_padding`), whose geometric centre is then
        the pixel ``(W // 2, H // 2)``."""
        c, h, w = self.image_shape_
        ph, pw = centre_padding(h, w, self._rotation_center())
        return c, h + ph, w + pw

    def _framed(self, Xt: torch.Tensor) -> torch.Tensor:
        """Images ``(n, C, H, W)`` in the search's frame (:meth:`_frame_shape`): ``Xt`` itself
        for the geometric centre."""
        return pad_for_centre(Xt, self._rotation_center())

    def _unframed(self, Xt: torch.Tensor) -> torch.Tensor:
        """Images of the search's frame cropped back to ``image_shape_``."""
        h, w = self.image_shape_[-2:]
        return Xt if tuple(Xt.shape[-2:]) == (h, w) else Xt[..., :h, :w]

    def _centred(self, X2, reset=False):
        """``(X2, offsets)``: the validated rows centred on their centres of mass where the
        estimator centres (``center=True``, or "auto" on images whose frame is empty where
        the searched shifts move them; decided at fit, ``reset=True``, into ``center_``),
        with the offsets ``(n, 2)`` of those centres from the rotation centre, else
        ``(X2, None)``."""
        if reset:
            self.center_ = self._centres_images(X2)
        if not self.center_:
            return X2, None
        shape, frame = tuple(self.image_shape_), self._frame_shape()
        if frame == shape:
            out, offsets = centred_images(X2, shape)
            return out.astype(X2.dtype, copy=False), offsets
        # centred in the search's frame, whose geometric centre is the rotation centre, and
        # cropped back (the appended zeros move no mass)
        Z = X2.reshape(-1, *shape)
        Z = np.pad(Z, ((0, 0), (0, 0), (0, frame[1] - shape[1]), (0, frame[2] - shape[2])))
        out, offsets = centred_images(Z.reshape(len(Z), -1), frame)
        out = out.reshape(-1, *frame)[..., :shape[1], :shape[2]].reshape(len(Z), -1)
        return np.ascontiguousarray(out, dtype=X2.dtype), offsets

    def _centres_images(self, X2) -> bool:
        """Whether the fit centres ``X2`` (:func:`centres_images` of the parameters)."""
        return centres_images(X2, tuple(self.image_shape_), getattr(self, "center", False),
                              self.group, self.max_translation)


def centres_images(X2, image_shape, center, group, max_translation) -> bool:
    """Whether images ``X2`` (flat rows of ``image_shape``) are centred on their centres of
    mass: ``center`` when a bool; for "auto", when shifts are searched (``max_translation >
    0``, ``group`` "se2" or "translation") and the mean image's band of
    ``ceil(max_translation)`` pixels along the frame is at most ``EMPTY_BORDER`` as bright as
    its whole frame."""
    if not isinstance(center, str):
        return bool(center)
    if group not in ("se2", "translation") or not max_translation > 0:
        return False
    width = int(np.ceil(max_translation))
    return border_density(X2, tuple(image_shape), width) <= EMPTY_BORDER
