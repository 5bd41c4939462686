"""The transformations searched: :class:`SearchGrid` and its validation."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from .. import _memory
from ..transforms import rotation_grid, translation_grid

__all__ = ["GROUPS", "SearchGrid", "make_search_grid", "rotation_limit", "translation_limit"]

GROUPS = ("se2", "rotation", "translation", "none")

# Maintenance note: two grid angles are told apart when they move the image's farthest pixel
# (from the centre) by at least a quarter of a pixel; a finer grid costs its time and finds
# nothing the continuous refinement does not. Any image may have a one-degree grid (360 angles).
ROTATION_SUBPIXEL = 4
MIN_ROTATION_LIMIT = 360
_LARGEST_SIDE = math.isqrt(_memory.INDEX_LIMIT)


@dataclass(frozen=True)
class SearchGrid:
    """The transformations searched: angles in degrees, integer shifts, and refinement bounds.

    Build it with :func:`make_search_grid`, which validates the parameters.

    Examples
    --------
    >>> from invariant_cluster.alignment import make_search_grid
    >>> grid = make_search_grid("rotation", max_rotation=45.0, n_rotations=3)
    >>> grid.angles.tolist(), grid.shifts.tolist(), grid.size
    ([-45.0, 0.0, 45.0], [[0, 0]], 3)
    """

    group: str
    angles: np.ndarray  # (R,)
    shifts: np.ndarray  # (S, 2) integer (tx, ty), zero first
    max_rotation: float
    max_translation: float
    refine: bool
    reflection: bool = False  # also the mirrored keys: E(2) = SE(2) x {identity, mirror}

    @property
    def n_mirrors(self) -> int:
        """1, or 2 with reflections: the keys' warps are ``n_mirrors x R`` images."""
        return 2 if self.reflection else 1

    @property
    def free(self) -> tuple[bool, bool, bool]:
        rot = self.group in ("se2", "rotation") and self.max_rotation > 0
        trans = self.group in ("se2", "translation") and self.max_translation > 0
        return (rot, trans, trans)

    @property
    def size(self) -> int:
        return self.n_mirrors * len(self.angles) * len(self.shifts)

    @property
    def n_params(self) -> int:
        """Columns of the alignments: 3 ``(angle, tx, ty)``, or 4 with the mirror bit."""
        return 4 if self.reflection else 3

    def decode(self, arg: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Grid points ``arg = (mirror * R + r) * S + s`` -> parameters ``(..., 3)`` =
        (angle, tx, ty), or ``(..., 4)`` with the mirror bit when ``reflection``, with
        ``like``'s device and dtype."""
        angles = torch.as_tensor(self.angles, dtype=like.dtype, device=like.device)
        shifts = torch.as_tensor(self.shifts, dtype=like.dtype, device=like.device)
        S, R = len(self.shifts), len(self.angles)
        s = arg % S
        r = arg // S
        cols = [angles[r % R], shifts[s, 0], shifts[s, 1]]
        if self.reflection:
            cols.append((r // R).to(like.dtype))
        return torch.stack(cols, -1)


def translation_limit(image_shape, group="se2") -> int:
    """The shift (pixels) at which every transformed copy of an image has left the frame.

    A larger shift cannot change any distance (the image then only meets zeros), while the
    search costs grow as ``max_translation^2`` shifts on a canvas that grows too, so
    :func:`make_search_grid` caps ``max_translation`` here. "translation": ``max(H, W)``;
    "se2": ``ceil((max(H, W) - 1) / 2 + hypot(H - 1, W - 1) / 2) + 1``, because a rotation
    moves the corners out to the circumscribed circle (and a bilinear sample reaches one pixel
    beyond).

    Examples
    --------
    >>> from invariant_cluster.alignment import translation_limit
    >>> translation_limit((1, 28, 28), "translation"), translation_limit((1, 28, 28), "se2")
    (28, 34)
    """
    h, w = int(image_shape[-2]), int(image_shape[-1])
    if group == "translation":
        return max(h, w)
    return int(math.ceil((max(h, w) - 1) / 2.0 + math.hypot(h - 1, w - 1) / 2.0)) + 1


def rotation_limit(image_shape, max_rotation=180.0) -> int:
    """The most grid angles ``n_rotations`` that images of ``image_shape`` can tell apart.

    ``max(360, ceil(span * 4 r))``, with ``span`` the range searched in radians (the full
    circle for ``max_rotation >= 180``, else ``2 max_rotation``) and ``r`` the distance of
    the farthest pixel centre from the image centre, ``hypot(H - 1, W - 1) / 2``: angles
    closer than that move no pixel by a quarter of a pixel (:data:`ROTATION_SUBPIXEL`), so
    more of them only cost time (the continuous refinement finds the angles in between). A
    one-degree grid over the full circle (360 angles) is allowed on any image.

    Examples
    --------
    >>> from invariant_cluster.alignment import rotation_limit
    >>> rotation_limit((1, 8, 8)), rotation_limit((1, 28, 28)), rotation_limit((1, 64, 64))
    (360, 480, 1120)
    """
    h, w = int(image_shape[-2]), int(image_shape[-1])
    span = 2.0 * math.pi if max_rotation >= 180.0 else 2.0 * math.radians(max_rotation)
    r = math.hypot(h - 1, w - 1) / 2.0
    return int(max(MIN_ROTATION_LIMIT, math.ceil(span * ROTATION_SUBPIXEL * r)))


def make_search_grid(group="se2", max_rotation=180.0, n_rotations=36, max_translation=0,
                     refine=True, reflection=False, *, image_shape=None) -> SearchGrid:
    """Validate the search parameters and build the :class:`SearchGrid`.

    The parameters are those of :func:`invariant_cluster.invariant_distances`: the ``group``
    (``"se2"``, ``"rotation"``, ``"translation"`` or ``"none"``), ``n_rotations`` angles within
    ``+-max_rotation`` degrees (:func:`~invariant_cluster.transforms.rotation_grid`), integer
    shifts within ``+-max_translation`` pixels
    (:func:`~invariant_cluster.transforms.translation_grid`), whether to ``refine``, and
    whether the mirrored images are searched too (``reflection``; see the Convention of
    :mod:`invariant_cluster.transforms`).
    With ``image_shape`` (``(C, H, W)`` or ``(H, W)``), ``max_translation`` is capped at
    :func:`translation_limit` (the distances are the same, the cost is not), as
    ``max_rotation`` is capped at 180. ``n_rotations`` beyond :func:`rotation_limit` (more
    angles than the images can tell apart; without ``image_shape``, than the largest image one
    warp can hold, 46,340 pixels square) gets a ``ValueError``. A grid whose own
    arrays do not fit in memory gets an
    :class:`~invariant_cluster.neighbors.InsufficientMemoryError` before it is built.

    Examples
    --------
    >>> from invariant_cluster.alignment import make_search_grid
    >>> grid = make_search_grid("se2", max_rotation=180.0, n_rotations=36, max_translation=2)
    >>> len(grid.angles), len(grid.shifts), grid.size
    (36, 25, 900)
    >>> make_search_grid("none").size  # nothing searched: plain Euclidean distances
    1
    """
    if not isinstance(group, str) or group not in GROUPS:
        raise ValueError(f"group: expected one of {GROUPS}, got {group!r}")
    for name, val in (("max_rotation", max_rotation), ("max_translation", max_translation)):
        if isinstance(val, bool) or not isinstance(val, numbers.Real):
            raise TypeError(f"{name}: expected a real number, got {val!r}")
        if not math.isfinite(val) or val < 0:
            raise ValueError(f"{name}: expected a finite number >= 0, got {val!r}")
    if not isinstance(reflection, (bool, np.bool_)):
        raise TypeError(f"reflection: expected a bool, got {reflection!r}")
    if isinstance(n_rotations, bool) or not isinstance(n_rotations, numbers.Integral):
        raise TypeError(f"n_rotations: expected an int >= 1, got {n_rotations!r}")
    if n_rotations < 1:
        raise ValueError(f"n_rotations: expected an int >= 1, got {n_rotations!r}")
    max_rotation = float(min(max_rotation, 180.0))
    rot = group in ("se2", "rotation")
    trans = group in ("se2", "translation")
    if trans and image_shape is not None:
        max_translation = min(max_translation, translation_limit(image_shape, group))
    if rot and max_rotation > 0:
        # without a shape: the largest image one warp can hold (2**31 elements)
        shape = (_LARGEST_SIDE, _LARGEST_SIDE) if image_shape is None else image_shape
        limit = rotation_limit(shape, max_rotation)
        if n_rotations > limit:
            raise ValueError(
                f"n_rotations: images of {int(shape[-2])} x {int(shape[-1])} pixels tell at "
                f"most {limit} angles apart within +-{max_rotation:g} degrees (closer angles "
                f"move no pixel by a quarter of a pixel, and the refinement finds the angles "
                f"in between), got {n_rotations}; lower n_rotations")
    n_angles = int(n_rotations) if rot and max_rotation > 0 else 1
    side = 2 * int(math.floor(max_translation + 1e-9)) + 1 if trans else 1
    # the angles (float64), the shifts (float64 and int64 pairs) and their sorting temporaries
    grid_bytes = 8 * n_angles + 64 * side * side
    if grid_bytes > _memory.UNCHECKED_SEARCH_BYTES:
        _memory.check_fits(grid_bytes, "cpu",
                           f"the transformation grid ({n_angles} angles x {side * side} shifts)",
                           hint="lower n_rotations or max_translation")
    angles = rotation_grid(max_rotation, int(n_rotations)) if rot else np.zeros(1)
    shifts = translation_grid(max_translation) if trans else np.zeros((1, 2))
    return SearchGrid(group, angles, shifts.astype(np.int64),
                      max_rotation if rot else 0.0,
                      float(max_translation) if trans else 0.0, bool(refine),
                      bool(reflection))


def check_int(value, name, minimum, allow_none=False):
    """``value`` as an int ``>= minimum`` (or None), else a ValueError naming it."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        expected = f"None or an int >= {minimum}" if allow_none else f"an int >= {minimum}"
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return int(value)
