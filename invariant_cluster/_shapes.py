"""Shapes: the groups of samples that are transformed copies of one image.

Two samples are copies when their continuously refined invariant distance is within what the
resampling and the noise put between two copies of one image, both measured on the data:

- the **resampling residual of the edge's own alignment** ``T`` (warping ``x_j`` onto
  ``x_i``): ``e_ij = min(||x_j - T^-1 T x_j||, ||x_i - T T^-1 x_i||)`` on the pixels both warps
  keep inside the frame, the blur bilinear interpolation puts into a copy turned by ``T``
  (zero for a quarter turn or an integer shift, which move whole pixels;
  :func:`alignment_residual`);
- the **noise** left in the filtered images: ``2 nu^2``, ``nu^2 = E ||F n||^2`` for white noise
  ``n`` of the measured standard deviation through the fit's filter ``F``
  (:func:`measure_noise`), the distance two independent noises put between two copies; at
  most the graph's shortest edge that the resampling does not explain, since two independent
  noises leave no two images closer (the estimate also reads an image's own fine detail as
  noise).

An edge is a copy edge when ``d_ij^2 <= e_ij^2 + noise``, or when the resampling alone explains
it on the pixels both frames hold (``d_ij^2 <= e_ij^2`` there, :func:`kept_distances`): two
copies lose different parts of their image to their frames, and on those pixels, where ``e_ij``
is measured, they hold the same part; the noise's tolerance is the whole frame's. The refinement
of the whole frame's residual moves an alignment to lose less of the frames (a 2 px move of a
frame-filling image refined to 1.7 px); an edge it leaves unexplained by no more than the frames
lose is refined again on the kept pixels (their residual's mean, which moving pixels out of the
frame does not lower) and tested there; on the kept pixels, a distance within its float
precision ``eps ||x||^2`` counts as explained (whole-pixel moves leave a residual of rounding
alone). The connected components of the copy edges are the shapes' first pieces (an exact
duplicate is a copy under the identity). Where the fit centred the images, ``d_ij`` and ``e_ij``
are measured on the images as given, under the edge's alignment composed with the two centring
shifts: a centred copy carries the blur of its own shift, and two of them differ by three
interpolations where the round trip counts two. Only the edges whose grid distance can still be
a copy's are refined: by the triangle inequality the grid leaves a copy at most ``g_j = ||x_j -
T_g x_j||`` (``T_g``: half a grid step of rotation, half a pixel of shift) farther than the
refinement, and the residual of a turn is bounded by the larger of the two images' residuals
under a turn of ``min(45, max_rotation)`` degrees (:func:`resampling_residual`). Of those, only
the edges that can join two groups are measured: the kNN lists' columns nearest first, in
windows of 1, 1, 2, 4, ... columns, each measuring the edges between the groups the copy edges
so far leave apart, then every edge between two of the groups the measured edges make, until
none is left; where the groups leave out no edge of a window (no copies so far), the columns
left join that window. A copy's edges to its group's other copies are never refined, and the
noise's cap below is the shortest unexplained edge among those measured.

With many noisy copies the shortest edge is the lowest of many draws of the noise, and its cap
cuts one image's copies into pieces, or leaves them single. Two pieces an edge joins within the
noise are one shape when their means are as close as two means of copies are, two single images
only where each is the other's best explanation (:func:`_merge_pieces`): the copies' own scatter
about their pieces' means measures the noise there, so detail the noise estimate read as noise
joins nothing. Where the copies scatter less than the lowest of as many draws of the
estimated noise (exact copies: not at all), the estimate read the images' own detail as
noise, as it does on 8 x 8 digits: their scatter is then the noise, and the edges are tested
again with it. Where they scatter more than the largest draw, the noise joined distinct images,
and where the alignments are refined (the grid's alone scatter copies beyond the noise) the
edges are tested again without it. The measurements behind the rule:
``docs/design/shapes.rst``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.stats import gamma

from . import _memory
from ._duplicates import first_of_each
from .search import candidate_search, refine_pairs
from .transforms import KEPT_WEIGHT, compose_se2, fast_warp, invert_se2, kept_pixels

# The turn that bounds the resampling residual of any alignment, for the shortlist of edges
# refined, in degrees (at most the searched range): bilinear interpolation blurs alike at any
# angle away from a quarter turn (docs/design/shapes.rst)
PROBE_ROTATION = 45.0
# White-noise images drawn to measure the filtered noise's power and its spread
_NOISE_DRAWS = 64
# The copy test measures the kNN lists' first column, then windows of as many columns as it
# has measured: a copy's edges to the copies its group already holds are never measured
_FIRST_WINDOW = 1


def copy_grid(refine_grid):
    """``refine_grid`` with the bounds of the transformations between two copies of one image,
    each within its searched range: twice the turn (at most the full circle) and ``1 + sqrt 2``
    times the shift (a shift within ``+-s`` turned by any angle reaches ``s sqrt 2`` on an
    axis). The copies' refinement and alignments move within them."""
    return dataclasses.replace(
        refine_grid, max_rotation=min(180.0, 2.0 * float(refine_grid.max_rotation)),
        max_translation=(1.0 + np.sqrt(2.0)) * float(refine_grid.max_translation))


def _probe_params(grid, n, half_step=False):
    """``(n, 3)`` parameters of the probe (``half_step``: half a grid step of rotation and half
    a pixel of shift, the grid's worst miss; else a turn of ``min(45, max_rotation)`` degrees,
    or half a pixel of shift for the translation group), or None where the group has no
    transformation."""
    rot, trans, _ = grid.free
    h = np.zeros(3)
    if rot:
        if half_step:
            h[0] = 0.5 * (float(np.diff(np.sort(grid.angles)).min())
                          if len(grid.angles) > 1 else 2.0 * grid.max_rotation)
        else:
            h[0] = min(PROBE_ROTATION, float(grid.max_rotation))
    if trans and (half_step or not rot):
        h[1:] = 0.5
    if not h.any():
        return None
    return np.tile(h, (n, 1))


def _round_trip_residual(x, p):
    """``||x - T_p^-1 T_p x||`` on the pixels both warps keep inside the frame, per row."""
    ones = torch.ones_like(x[:, :1])
    inverse = invert_se2(p)
    kept = fast_warp(fast_warp(ones, p), inverse) >= KEPT_WEIGHT
    back = fast_warp(fast_warp(x, p), inverse)
    return torch.linalg.vector_norm(((x - back) * kept).reshape(len(x), -1), dim=1)


def _blocks(n, X):
    return _memory.pair_blocks(n, X[0].numel())


def resampling_residual(X: torch.Tensor, grid, *, half_step=False) -> torch.Tensor:
    """The probe's residual for every image of ``X`` ``(n, C, H, W)``: ``||x - T^-1 T x||``
    (on the pixels kept in the frame), or with ``half_step`` the one-way ``||x - T_g x||``;
    zeros where the group has no transformation."""
    n = X.shape[0]
    out = torch.zeros(n, dtype=X.dtype, device=X.device)
    h = _probe_params(grid, n, half_step)
    if h is None or n == 0:
        return out
    h = torch.as_tensor(h, dtype=X.dtype, device=X.device)
    starts, step = _blocks(n, X)
    for i in starts:
        x = X[i:i + step]
        if half_step:
            out[i:i + len(x)] = torch.linalg.vector_norm(
                (x - fast_warp(x, h[:len(x)])).reshape(len(x), -1), dim=1)
        else:
            out[i:i + len(x)] = _round_trip_residual(x, h[:len(x)])
    return out


def alignment_residual(X, qi, kj, params):
    """``e_ij`` of the module's docstring for the pairs ``(qi, kj)`` whose alignments
    ``params`` warp ``X[kj]`` onto ``X[qi]``, in memory-bounded blocks of pairs."""
    m = qi.shape[0]
    out = torch.empty(m, dtype=X.dtype, device=X.device)
    p = params[:, :3].to(X.dtype)
    starts, step = _blocks(m, X)
    for s in starts:
        sl = slice(s, s + step)
        out[sl] = torch.minimum(_round_trip_residual(X[kj[sl]], p[sl]),
                                _round_trip_residual(X[qi[sl]], invert_se2(p[sl])))
    return out


class Noise(NamedTuple):
    """The noise of a fit's filtered images, drawn through its filter (0 without noise):
    ``power``, ``E ||F n||^2`` for white noise ``n`` of the measured standard deviation, and
    ``power_std``, its standard deviation over the draws."""

    power: float = 0.0
    power_std: float = 0.0

    def highest_share(self, n_draws: int) -> float:
        """The largest of ``n_draws`` draws of a noise's squared norm over its mean: the
        ``1 - 1 / (n_draws + 1)`` quantile of the gamma law of mean 1 and the relative spread
        ``power_std / power`` (1 without noise). The difference of two independent noises,
        and of two means of them, is white noise of the same pixels: the same relative
        spread."""
        return self._share(1.0 - 1.0 / (n_draws + 1))

    def lowest_share(self, n_draws: int) -> float:
        """The smallest of ``n_draws`` draws of a noise's squared norm over its mean: the
        ``1 / (n_draws + 1)`` quantile of the same gamma law (1 without noise)."""
        return self._share(1.0 / (n_draws + 1))

    def _share(self, q: float) -> float:
        if self.power <= 0:
            return 1.0
        return _gamma_quantile(1.0, self.power_std / self.power, q)


def _gamma_quantile(mean, std, q):
    if mean <= 0:
        return 0.0
    if std <= 0:
        return float(mean)
    return float(gamma.ppf(q, (mean / std) ** 2, scale=std * std / mean))


def measure_noise(filt, image_shape, device, dtype, pad=None) -> Noise:
    """The :class:`Noise` of the measured standard deviation through the fit's filter
    ``filt``, from ``_NOISE_DRAWS`` white-noise images of a generator of its own (no global
    state is touched). ``pad``: the search's framing."""
    sigma = float(getattr(filt, "noise_std_", 0.0) or 0.0)
    if sigma <= 0:
        return Noise()
    gen = torch.Generator(device="cpu").manual_seed(0)
    noise = torch.randn((_NOISE_DRAWS, *image_shape), generator=gen, dtype=torch.float64)
    noise = (sigma * noise).to(device=device, dtype=dtype)
    if not filt.is_identity:
        noise = filt.filter_tensor(noise, in_place=True)
    if pad is not None:
        noise = pad(noise)
    power = torch.linalg.vector_norm(noise.reshape(_NOISE_DRAWS, -1), dim=1).double().pow(2)
    return Noise(float(power.mean()), float(power.std()))


def align(Q: torch.Tensor, K: torch.Tensor, grid, refine_grid, batch_size=None):
    """The alignments ``(m, 3)`` that warp each image of ``K`` onto the image of ``Q`` in its
    row: the grid search, then the refinement (none where ``refine_grid`` has none)."""
    one_each = torch.arange(Q.shape[0], device=Q.device)
    _, _, p = candidate_search(Q, K, one_each[:, None], grid, k=1, batch_size=batch_size)
    p = p[:, 0]
    if refine_grid.refine and any(refine_grid.free):
        _, p = refine_pairs(Q, K, one_each, one_each, p, refine_grid)
    return p.to(Q.dtype)


def pair_distances(X, qi, kj, params):
    """``||X[qi] - T X[kj]||^2`` (float64) for the pairs ``(qi, kj)`` and their alignments
    ``params`` ``(m, 3)``, or ``(m, 4)`` with mirror bits, in memory-bounded blocks of pairs."""
    return _distances(X, qi, kj, params)[0]


def _distances(X, qi, kj, params, kept=False):
    """``(d^2, d^2 kept)``: :func:`pair_distances`, and with ``kept`` the same on the pixels
    whose source the warp keeps inside ``X[kj]``'s frame (:func:`kept_distances`; else None),
    each pair warped once."""
    m = qi.shape[0]
    out = torch.empty(m, dtype=torch.float64, device=X.device)
    inside = torch.empty_like(out) if kept else None
    p = params.to(X.dtype)
    starts, step = _blocks(m, X)
    for s in starts:
        sl = slice(s, s + step)
        K = X[kj[sl]]
        r = X[qi[sl]] - fast_warp(K, p[sl])
        out[sl] = torch.linalg.vector_norm(r.reshape(r.shape[0], -1), dim=1).double().pow(2)
        if kept:
            r = r * kept_pixels(K, p[sl])
            inside[sl] = torch.linalg.vector_norm(r.reshape(r.shape[0], -1),
                                                  dim=1).double().pow(2)
    return out, inside


class Given(NamedTuple):
    """The images of a centred fit as given: ``images(rows)``, those of the rows (a NumPy
    array of indices of the fit's images) filtered and framed as the fit's, made when asked
    (a block of pairs at a time, not a second copy of the data), and ``shifts``, the ``(n, 3)``
    centring shifts with ``X = warp(images, shifts)``."""

    images: Callable[[np.ndarray], torch.Tensor]
    shifts: torch.Tensor


def kept_distances(X, qi, kj, params):
    """``||X[qi] - T X[kj]||^2`` (float64) for the pairs ``(qi, kj)`` and their alignments
    ``params``, on the pixels whose source the warp keeps inside ``X[kj]``'s frame. Two copies
    of one image lose different parts of it to their frames; on these pixels both hold the
    same part."""
    return _distances(X, qi, kj, params, kept=True)[1]


def _given_distances(given, qi, kj, params, X):
    """``(d^2, d^2 kept, e^2)`` of the pairs ``(qi, kj)`` on the images as given under
    ``params`` (:func:`pair_distances`, :func:`kept_distances`, :func:`alignment_residual`;
    float64), the images of each memory-bounded block of pairs made and warped once."""
    m = qi.shape[0]
    d2 = torch.empty(m, dtype=torch.float64, device=X.device)
    k2, e2 = torch.empty_like(d2), torch.empty_like(d2)
    starts, step = _blocks(m, X)
    for s in starts:
        sl = slice(s, s + step)
        nq = qi[sl].shape[0]
        rows, local = torch.unique(torch.cat([qi[sl], kj[sl]]), return_inverse=True)
        G = given.images(rows.cpu().numpy())
        lq, lk = local[:nq], local[nq:]
        d2[sl], k2[sl] = _distances(G, lq, lk, params[sl], kept=True)
        e2[sl] = alignment_residual(G, lq, lk, params[sl]).double().pow(2)
    return d2, k2, e2


def find_shapes(X: torch.Tensor, D: torch.Tensor, idx: torch.Tensor, P: torch.Tensor, grid,
                refine_grid, noise: Noise, batch_size=None, given=None):
    """The shapes of the images ``X`` from their invariant kNN graph on the grid (``D``:
    squared distances, ``idx``: neighbours, ``P``: alignments, each ``(n, k)``): ``rep``, each
    image's shape as its first image (lowest index), or None where every image is its own
    shape. ``refine_grid``: the grid of the refinement (none where ``refine=False``);
    ``noise``: :func:`measure_noise`; ``batch_size``: the search's. ``given``: where ``X``
    was centred, the :class:`Given` images: the copy test then compares the images as given,
    under the alignment composed with the two centring shifts (one interpolation, as for
    uncentred copies, not three)."""
    n, k = idx.shape
    if n < 2 or k == 0:
        return None
    d2 = D.double()
    finite = torch.isfinite(d2)
    # the graph's edges are as many draws of the pair noise
    n_draws = int(finite.sum())
    nu2 = float(noise.power)
    share = noise.highest_share(n_draws)
    # the edges the grid leaves within reach of a copy's tolerance, the means' included
    e = resampling_residual(X, grid).double()
    g = resampling_residual(X, grid, half_step=True).double()
    bound = (torch.maximum(e[:, None], e[idx]).pow(2) + 2.0 * share * nu2).sqrt() + g[idx]
    maybe = finite & (d2.clamp(min=0).sqrt() <= bound)
    if not bool(maybe.any()):
        return None
    edges = _CopyEdges(X, d2, idx, P, copy_grid(refine_grid), given)
    # the edges not refined are no copy's, at their grid distance
    rest = d2[finite & ~maybe]
    rest_min = float(rest.min()) if rest.numel() else float("inf")
    # the columns of the kNN lists nearest first, in windows of w, w, 2 w, 4 w, ... columns: only
    # the edges between two groups the copy edges so far leave apart are measured (an edge
    # within a group adds no join), then, until none is left, every edge that may join two
    # of the groups the measured edges make; where the groups leave out no edge of a window
    # (no copies so far), the columns left join that window
    comp, near = np.arange(n), None
    maybe_np = maybe.cpu().numpy().reshape(-1)
    idx_np = idx.cpu().numpy().reshape(-1)

    def apart(flat):
        return flat[comp[flat // k] != comp[idx_np[flat]]]

    def close(todo, start, width, nu2):
        nonlocal comp, near
        while todo.size:
            if start < k:
                in_window = todo[todo % k < start + width]
                window = apart(in_window)
                if start > 0 and window.size == in_window.size:
                    window, start = apart(todo), k
                else:
                    start, width = start + width, start + width
            else:
                window = apart(todo)
                if not window.size:
                    break
            if window.size:
                edges.measure(window)
                comp, near = _copy_components(edges, n, nu2, share, rest_min)
            todo = todo[~edges.done[todo]]

    close(np.flatnonzero(maybe_np), 0, _FIRST_WINDOW, nu2)
    # groups of copies that the cap split: joined where their means are within their copies'
    # own scatter (the pairs of groups tested are those an edge joins within the noise)
    if nu2 > 0:
        comp, quiet = _merge_pieces(X, comp, *near, noise, grid, copy_grid(refine_grid),
                                    batch_size, check_quiet=True)
        if quiet is not None:
            # the copies scatter less than the lowest draw of the estimated noise: the
            # estimate read the images' own detail as noise, and the copies' scatter is the
            # noise; or more than the largest (0): the noise joined distinct images. The
            # edges are tested again with it (those it leaves apart measured too)
            comp, near = _copy_components(edges, n, quiet, share, rest_min)
            close(np.flatnonzero(maybe_np & ~edges.done), k, 0, quiet)
            if quiet > 0:
                noise = Noise(quiet, noise.power_std * quiet / noise.power)
                comp, _ = _merge_pieces(X, comp, *near, noise, grid, copy_grid(refine_grid),
                                        batch_size)
    if comp.max() + 1 == n:
        return None
    return first_of_each(comp)[comp]


class _CopyEdges:
    """The copy test's measurements of the kNN graph's edges (flat indices ``i k + r`` of
    ``idx``; ``d2``: their squared grid distances, float64), made when asked: each edge refined
    within ``refine_grid`` from its grid alignment (kept where the refinement does no better),
    then its squared distance and resampling residual, on the images as given where ``given``
    is (see :func:`find_shapes`)."""

    def __init__(self, X, d2, idx, P, refine_grid, given):
        n, k = idx.shape
        self.X, self.k, self.given, self.refine_grid = X, k, given, refine_grid
        self.idx = idx.reshape(-1)
        self.d2 = d2.reshape(-1)
        self.P = P.reshape(n * k, -1)
        self.done = np.zeros(n * k, dtype=bool)
        self.parts = []
        self.energy = torch.linalg.vector_norm(X.flatten(1), dim=1).double().pow(2)

    def measure(self, flat):
        flat = np.asarray(flat, dtype=np.int64)
        t = torch.as_tensor(flat, device=self.X.device)
        qi = torch.div(t, self.k, rounding_mode="floor")
        kj = self.idx[t]
        d_pair, p_pair = self.d2[t], self.P[t]
        grid = self.refine_grid
        refined = grid.refine and any(grid.free)
        if refined:
            d_ref, p_ref = refine_pairs(self.X, self.X, qi, kj, p_pair, grid)
            better = d_ref.double() < d_pair
            d_pair = torch.where(better, d_ref.double(), d_pair)
            p_pair = torch.where(better[:, None], p_ref.to(p_pair.dtype), p_pair)
        d_whole, d_kept, resampled = self._distances(qi, kj, p_pair)
        if self.given is not None:
            d_pair = d_whole
        # the resampling explains the pair where it does on the pixels both frames hold,
        # those its residual is measured on (the noise's tolerance is the whole frame's), up
        # to the float precision of a squared distance of these images, ``eps ||x||^2``: two
        # exact copies' distance is its rounding, as is the residual of whole-pixel moves
        floor = torch.finfo(self.X.dtype).eps * torch.maximum(self.energy[qi], self.energy[kj])
        explained = d_kept <= torch.maximum(resampled, floor)
        if refined:
            # where the frames lose part of a pair, the whole frame's refinement moves its
            # alignment to lose less, and pays for it on the kept pixels with at most what it
            # saves (taken as at most what the frames still lose): the pairs it leaves
            # unexplained by no more than that are refined again on the kept pixels
            again = torch.nonzero(~explained & (d_kept - resampled <= d_whole - d_kept)).flatten()
            if again.numel():
                _, p_kept = refine_pairs(self.X, self.X, qi[again], kj[again], p_pair[again],
                                         grid, kept=True)
                _, d_again, e_again = self._distances(qi[again], kj[again],
                                                      p_kept.to(p_pair.dtype))
                explained[again] = d_again <= torch.maximum(e_again, floor[again])
        d_pair = torch.where(explained, torch.minimum(d_pair, resampled), d_pair)
        self.done[flat] = True
        self.parts.append((flat // self.k, kj.cpu().numpy(), d_pair.cpu().numpy(),
                           resampled.cpu().numpy()))

    def _distances(self, qi, kj, p):
        """``(d^2, d^2 kept, e^2)`` of the pairs ``(qi, kj)`` under their alignments ``p`` of
        the fit's images, on the images as given where the fit centred them (float64)."""
        if self.given is not None:
            c = self.given.shifts.to(device=p.device, dtype=p.dtype)
            return _given_distances(self.given, qi, kj,
                                    compose_se2(invert_se2(c[qi]), compose_se2(p, c[kj])),
                                    self.X)
        d2, k2 = _distances(self.X, qi, kj, p, kept=True)
        return d2, k2, alignment_residual(self.X, qi, kj, p).double().pow(2)

    def measured(self):
        """``(qi, kj, d^2, e^2)`` of every edge measured so far (NumPy)."""
        if len(self.parts) > 1:
            self.parts = [tuple(np.concatenate(a) for a in zip(*self.parts))]
        return self.parts[0]


def _copy_components(edges, n, nu2, share, rest_min):
    """``(comp, near)``: the groups the copy edges among the measured ``edges`` make, and
    ``(qi, kj, excess)`` of the edges within ``2 share nu2`` of the resampling (those the
    pieces' test reads)."""
    qi, kj, d_pair, resampled = edges.measured()
    # the noise: as measured, and no more than the shortest edge the resampling leaves
    # unexplained (the edges not refined are such edges, at their grid distance)
    beyond = d_pair[d_pair > resampled]
    shortest = min(float(beyond.min()) if beyond.size else float("inf"), rest_min)
    noise2 = min(2.0 * nu2, shortest)
    # explained by the resampling, or by the noise; where the shortest unexplained edge caps
    # the noise, that edge (and every copy of it) is the bound's evidence, not a copy
    copy = (d_pair <= resampled) | ((d_pair - resampled <= noise2)
                                    & ((noise2 < shortest) | (d_pair > shortest)))
    comp = np.arange(n)
    if copy.any():
        _, comp = connected_components(
            coo_matrix((np.ones(int(copy.sum())), (qi[copy], kj[copy])), shape=(n, n)),
            directed=False)
    excess = d_pair - resampled
    near = excess <= 2.0 * share * nu2
    return comp, (qi[near], kj[near], excess[near])


def _merge_pieces(X, comp, qa, kb, excess_ab, noise, grid, refine_grid, batch_size,
                  check_quiet=False):
    """``comp`` once the pieces (its labels) that are copies of one image are joined, in
    rounds until none joins. Two pieces ``A``, ``B`` joined by one of the edges ``(qa, kb)``
    are one shape when the invariant distance of their means is within the resampling
    residual of their alignment and the noise of two means, ``s^2 (1 / n_A + 1 / n_B)``:
    ``s^2`` the scatter of a copy about its piece's mean, pooled over every piece of several
    images the copy edges made (:func:`_piece_means`), at most the largest of as many draws
    of it as copies were measured or pairs the first round tests, whichever is more (a gamma
    law of its mean and spread; one bound for every round): the bound must hold for every
    pair tested, however few copies measured the scatter. It is used only where the scatter
    is within the measured ``noise``. The copies measure their noise themselves:
    detail the noise estimate took for noise is no copy's scatter. A single image joins at
    most one piece, the one that explains it best (:func:`_best_explained`), and two single
    images join only where each is the other's best explanation (:func:`_mutual_singles`):
    where the shortest edge that caps the noise is a copy pair itself (a near copy of every
    image), the cap leaves every copy single. ``excess_ab``: each edge's squared distance less
    its resampling residual.

    Returns ``(comp, quiet)``: ``quiet`` is None, or with ``check_quiet``, where the copies'
    scatter (measured where a pair is left to test) is below the lowest of as many draws of
    ``noise`` (the estimate took the images' own detail for noise), that scatter's mean, and
    where it is above the largest and the alignments are refined, 0 (the noise joined distinct
    images), with ``comp`` as given."""
    comp = np.unique(comp, return_inverse=True)[1]
    measured = None
    while True:
        size = np.bincount(comp)
        a, b = comp[qa], comp[kb]
        keep = a != b
        if not keep.any():
            return comp, None
        pairs, inverse = np.unique(np.stack([np.minimum(a, b), np.maximum(a, b)], 1)[keep],
                                   axis=0, return_inverse=True)
        # two single images: the excess of their edge (the lower of its two directions)
        lone = (size[pairs[:, 0]] == 1) & (size[pairs[:, 1]] == 1)
        excess = np.full(len(pairs), np.inf)
        np.minimum.at(excess, inverse.ravel(), excess_ab[keep])
        pieces = np.unique(pairs[~lone])
        if measured is None:
            # the scatter is measured on every piece of several images
            pieces = np.union1d(pieces, np.flatnonzero(size > 1))
        at = np.full(size.size, -1, dtype=np.int64)
        at[pieces] = np.arange(pieces.size)
        M, scatter = _piece_means(X, comp, size, pieces, at, grid, refine_grid, batch_size,
                                  scatter=measured is None)
        if measured is None:
            # measured once, on the pieces as the copy edges made them (a joined piece's
            # scatter would hold what joined it), and used only where it is the noise: pieces
            # that scatter more than the measured noise lets copies scatter hold distinct
            # images (their copy edges joined what the estimate could not tell apart)
            if scatter.size == 0:
                return comp, None
            if scatter.mean() > noise.power * noise.highest_share(scatter.size):
                # where the alignments are refined, no copy scatters beyond the noise: the
                # noise joined distinct images, and the copies are those the resampling explains
                refined = refine_grid.refine and any(refine_grid.free)
                return comp, (0.0 if check_quiet and refined else None)
            if check_quiet and scatter.mean() < noise.power * noise.lowest_share(scatter.size):
                return comp, float(scatter.mean())
            measured = float(scatter.mean()), float(scatter.std())
            # the largest of as many draws as copies were measured or pairs are tested
            unit = _gamma_quantile(*measured, 1.0 - 1.0 / (max(scatter.size, len(pairs)) + 1))
        # pairs with a piece of several images: the excess of the pieces' means
        means = pairs[~lone]
        rest = np.empty(len(means))
        starts, step = _blocks(len(means), X)
        for s0 in starts:
            A = torch.as_tensor(at[means[s0:s0 + step, 0]], device=X.device)
            B = torch.as_tensor(at[means[s0:s0 + step, 1]], device=X.device)
            p = align(M[A], M[B], grid, refine_grid, batch_size)
            d2 = pair_distances(M, A, B, p)
            e2 = alignment_residual(M, A, B, p).double().pow(2)
            rest[s0:s0 + len(A)] = (d2 - e2).cpu().numpy()
        excess[~lone] = rest
        tol = unit * (1.0 / size[pairs[:, 0]] + 1.0 / size[pairs[:, 1]])
        ok = excess <= tol
        ok &= _best_explained(pairs, size, excess, ok, comp[qa], comp[kb], excess_ab,
                              measured[0])
        ok &= _mutual_singles(pairs, size, excess, ok, lone, measured[0])
        if not ok.any():
            return comp, None
        m = size.size
        _, joined = connected_components(
            coo_matrix((np.ones(int(ok.sum())), (pairs[ok, 0], pairs[ok, 1])), shape=(m, m)),
            directed=False)
        comp = joined[comp]


def _best_explained(pairs, size, excess, ok, a, b, excess_ab, s2):
    """Which of the pairs of pieces ``pairs`` that passed (``ok``) stay joined: all those of
    two pieces of several images, and for a single image, only its pair with the piece whose
    mean explains it best, and only where that mean explains it better than any other single
    image near it that the same piece does not take. Each explanation is the distance less
    the noise it holds, the pair's ``excess`` less ``s2 (1 + 1 / n_A)`` for a piece's mean,
    and ``excess_ab`` less ``2 s2`` for an edge ``(a, b)`` of two single images: a copy of
    another image that lies within the copies' scatter of a piece's mean is still nearer the
    other copies of its own image. ``s2``: the copies' measured scatter."""
    keep = ok.copy()
    single = size[pairs] == 1
    one = ok & (single[:, 0] != single[:, 1])
    if not one.any():
        return keep
    lone = np.where(single[:, 0], pairs[:, 0], pairs[:, 1])[one]
    piece = np.where(single[:, 0], pairs[:, 1], pairs[:, 0])[one]
    score = excess[one] - s2 * (1.0 + 1.0 / size[piece])
    # the best piece of each single image: the lowest score, the lowest label on ties
    order = np.lexsort((piece, score, lone))
    first = np.ones(order.size, dtype=bool)
    first[1:] = lone[order][1:] != lone[order][:-1]
    best = np.full(size.size, -1, dtype=np.int64)
    best[lone[order][first]] = piece[order][first]
    # the other single images near each: their edges, less the noise of two images, where
    # the best piece of the one does not take the other too
    both = (a != b) & (size[a] == 1) & (size[b] == 1)
    u = np.concatenate([a[both], b[both]])
    v = np.concatenate([b[both], a[both]])
    alt_score = np.tile(excess_ab[both] - 2.0 * s2, 2)
    taken = (best[u] >= 0) & (best[v] == best[u])
    alternative = np.full(size.size, np.inf)
    np.minimum.at(alternative, u[~taken], alt_score[~taken])
    stays = (piece == best[lone]) & (score < alternative[lone])
    keep[np.flatnonzero(one)] = stays
    return keep


def _mutual_singles(pairs, size, excess, ok, lone, s2):
    """Which of the pairs ``pairs`` that passed (``ok``) stay joined: all but those of two
    single images (``lone``), which stay only where each is the other's best explanation
    among the pairs that passed (a piece's mean scored ``excess - s2 (1 + 1 / n_A)``, a single
    image ``excess - 2 s2``, as :func:`_best_explained` scores them)."""
    keep = ok.copy()
    both = ok & lone
    if not both.any():
        return keep
    u = np.concatenate([pairs[:, 0], pairs[:, 1]])
    v = np.concatenate([pairs[:, 1], pairs[:, 0]])
    score = np.tile(excess, 2) - s2 * (1.0 + 1.0 / size[v])
    sel = np.tile(ok, 2) & (size[u] == 1)
    u, v, score = u[sel], v[sel], score[sel]
    # each single image's best partner over the pairs that passed, from either end
    order = np.lexsort((v, score, u))
    first = np.ones(order.size, dtype=bool)
    first[1:] = u[order][1:] != u[order][:-1]
    best = np.full(size.size, -1, dtype=np.int64)
    best[u[order][first]] = v[order][first]
    a, b = pairs[both, 0], pairs[both, 1]
    keep[np.flatnonzero(both)] = (best[a] == b) & (best[b] == a)
    return keep


def _piece_means(X, comp, size, pieces, at, grid, refine_grid, batch_size, scatter=True):
    """``(M, scatter)``: the mean of each piece of ``pieces`` (labels of ``comp``; ``at``:
    their rows), its images aligned onto its first image, in memory-bounded blocks; and each
    image's scatter about its piece's mean, ``||x_i - T_i^-1 mu_A||^2 n_A / (n_A - 1)``
    (NumPy; ``T_i`` its alignment onto the first image), over the pieces of several images
    (None with ``scatter=False``)."""
    first = first_of_each(comp)
    dev = X.device
    own = first[pieces]
    M = X[torch.as_tensor(own, device=dev)].clone()
    others = np.flatnonzero((at[comp] >= 0) & (first[comp] != np.arange(comp.size)))
    starts, step = _blocks(others.size, X)
    blocks = [others[s0:s0 + step] for s0 in starts]
    poses = []
    for mb in blocks:
        K = X[torch.as_tensor(mb, device=dev)]
        p = align(X[torch.as_tensor(first[comp[mb]], device=dev)], K, grid, refine_grid,
                  batch_size)
        poses.append(p)
        M.index_add_(0, torch.as_tensor(at[comp[mb]], device=dev), fast_warp(K, p))
    n = torch.as_tensor(size[pieces], dtype=M.dtype, device=dev)
    M = M / n[:, None, None, None]
    if not scatter:
        return M, None
    # the scatter, unbiased by n_A / (n_A - 1): each first image against its mean as it is
    factor = np.where(size > 1, size / np.maximum(size - 1, 1), 0.0)
    multi = np.flatnonzero(size[pieces] > 1)
    r = X[torch.as_tensor(own[multi], device=dev)] - M[torch.as_tensor(multi, device=dev)]
    r2 = torch.linalg.vector_norm(r.flatten(1), dim=1).double().pow(2)
    spread = [r2.cpu().numpy() * factor[pieces[multi]]]
    for mb, p in zip(blocks, poses):
        # each copy as it is against the mean in its pose: its own noise, unsmoothed by a warp
        mean = M[torch.as_tensor(at[comp[mb]], device=dev)]
        back = invert_se2(p)
        r = X[torch.as_tensor(mb, device=dev)] - fast_warp(mean, back)
        r2 = torch.linalg.vector_norm(r.reshape(len(mb), -1), dim=1).double().pow(2)
        # less the blur the warp puts into the mean (its round trip), as the pairs' test has
        r2 = (r2 - _round_trip_residual(mean, back).double().pow(2)).clamp(min=0)
        spread.append(r2.cpu().numpy() * factor[comp[mb]])
    return M, np.concatenate(spread)
