"""The transformations searched: :class:`SearchGrid` and its validation."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from ..transforms import rotation_grid, translation_grid

__all__ = ["GROUPS", "SearchGrid", "make_search_grid", "translation_limit"]

GROUPS = ("se2", "rotation", "translation", "none")


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
    ``max_rotation`` is capped at 180.

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
