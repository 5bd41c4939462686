"""The samples in a canonical order, and their duplicates: what makes a fit independent of the
order of the samples and of how many times an image is stored.

- :func:`unique_in_canonical_order`: the distinct images, sorted by their content (fixed
  projections of their sorted values, then of the images), and where each sample's copy lies
  among them.

A fit runs on the distinct images in the canonical order (and then on one image of each shape,
:mod:`invariant_cluster._shapes`), and gives every sample its representative's cluster:
stacking a data set twice, or permuting it, gives the same partition.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def content_keys(flat, rows=None):
    """Two fixed random projections (float64) of each row of ``flat`` ``(n, ...)`` (an array or
    a tensor on any device; each row flattened), or of the rows ``rows`` of it: of its values
    sorted, which no permutation of the pixels changes (a quarter turn, an integer shift of
    content inside the frame), and of the row itself.

    The values are sorted in their own dtype where they lie (on the card for a CUDA tensor):
    sorting is exact, so the keys are the same on every device."""
    direction = np.random.RandomState(0).standard_normal(math.prod(flat.shape[1:]))
    n = flat.shape[0] if rows is None else len(rows)
    invariant, raw = [], []
    # in blocks: a float64 copy of all the images at once would double the memory
    for i in range(0, n, 8192):
        b = flat[i:i + 8192] if rows is None else flat[rows[i:i + 8192]]
        if isinstance(b, torch.Tensor) and b.device.type != "cpu":
            b = b.reshape(len(b), -1)
            ordered = torch.sort(b, dim=1).values.cpu().numpy()
            b = b.cpu().numpy()
        else:
            b = np.asarray(b.cpu() if isinstance(b, torch.Tensor) else b).reshape(len(b), -1)
            ordered = np.sort(b, axis=1)
        raw.append(b.astype(np.float64) @ direction)
        invariant.append(ordered.astype(np.float64) @ direction)
    return np.concatenate(invariant), np.concatenate(raw)


def canonical_order(flat, rows=None) -> np.ndarray:
    """The order of :func:`unique_in_canonical_order` of distinct rows ``flat`` ``(n, ...)``
    (an array or a tensor on any device), or of its rows ``rows`` (positions in ``rows``): by
    the projection of the sorted values, then of the row. A permutation of the pixels of every
    image (turning or shifting the whole data set by an element of the search grid) leaves the
    order, and so the fit, as it was."""
    invariant, raw = content_keys(flat, rows)
    return np.lexsort((raw, invariant))


def unique_in_canonical_order(X2: np.ndarray):
    """``(first, inverse)``: ``X2[first]`` are the distinct rows of ``X2`` in an order that
    depends on their content only, and ``X2[first][inverse]`` equals ``X2``.

    Equal rows are found exactly, by sorting the rows' bytes; the distinct rows are then put in
    the order of :func:`canonical_order`, computed on them in their byte order, so that the
    order depends on the content only. (A projection alone does not find
    equal rows: a BLAS product can round the same row differently at another position.)
    """
    n = X2.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    flat = np.ascontiguousarray(X2.reshape(n, -1))
    rows = flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel()
    order = np.argsort(rows, kind="stable")
    same = np.zeros(n, dtype=bool)
    for i in range(1, n, 8192):  # in blocks: a comparison of all rows at once is n x d
        j = min(n, i + 8192)
        same[i:j] = (flat[order[i:j]] == flat[order[i - 1:j - 1]]).all(1)
    run = np.cumsum(~same) - 1
    byte_first = order[~same]  # the first of each run of equal rows, in byte order
    rank_order = canonical_order(flat, byte_first)
    rank = np.empty_like(rank_order)
    rank[rank_order] = np.arange(len(rank_order))
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = rank[run]
    return byte_first[rank_order].astype(np.int64), inverse


def first_of_each(parts: np.ndarray) -> np.ndarray:
    """The first (lowest) index holding each label of ``parts`` (labels ``0 .. p - 1``)."""
    first = np.full(int(parts.max()) + 1, parts.size, dtype=np.int64)
    np.minimum.at(first, parts, np.arange(parts.size))
    return first
