"""Requests too large for the machine fail before they start, and indices stay exact at any n.

Nothing here allocates much: huge sample counts are torch tensors expanded from a tiny one (no
copy), and the memory budget is replaced by a fixed one so that "too much" means the same on
every machine.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from invariant_cluster._utils import evenly_spaced_indices
from invariant_cluster.denoise import NOISE_SUBSET, _subset_rows, estimate_noise_std, radial_power

pytestmark = pytest.mark.usefixtures("torch_single_thread")


# --------------------------------------------------------------- evenly spaced rows at large n
@pytest.mark.parametrize("n", [NOISE_SUBSET + 1, 2 ** 24 + 1, 2 ** 25, 20_000_000, 10 ** 12])
def test_evenly_spaced_indices_are_exact_integers(n):
    rows = evenly_spaced_indices(n, NOISE_SUBSET)
    assert rows.dtype == torch.long and rows.shape == (NOISE_SUBSET,)
    assert int(rows[0]) == 0 and int(rows[-1]) == n - 1
    assert bool((rows.diff() > 0).all())
    # round(i (n - 1) / (m - 1)), checked in Python's exact integers
    m = NOISE_SUBSET
    for i in (1, m // 3, m // 2, m - 2):
        assert int(rows[i]) == (2 * i * (n - 1) + (m - 1)) // (2 * (m - 1))


def test_noise_subset_of_2_to_the_25_images_stays_in_bounds():
    # float32 linspace rounded n - 1 up to n here: an IndexError in radial_power
    n = 2 ** 25
    assert int(_subset_rows(n, "cpu").max()) == n - 1
    X = torch.zeros(1, 1, 2, 2).expand(n, 1, 2, 2)  # a view: nothing allocated
    assert radial_power(X).shape == (1, 2)
    assert estimate_noise_std(X) == 0.0


def test_evenly_spaced_indices_small_cases():
    assert evenly_spaced_indices(5, 1).tolist() == [0]
    assert evenly_spaced_indices(5, 2).tolist() == [0, 4]
    assert evenly_spaced_indices(5, 5).tolist() == [0, 1, 2, 3, 4]


# --------------------------------------------------------------- too much fails before it starts
# "Too much" is measured against a fixed budget, so that it means the same on every machine; the
# steps that allocate in proportion to the request are replaced by sentinels, so that a check
# that comes too late (or not at all) fails here at once instead of allocating.
BUDGET = 1 << 30
HUGE_N = 1_000_000


class Allocated(AssertionError):
    """A step of the size of the request was reached before any check refused it."""


def _sentinel(name):
    def refuse(*args, **kwargs):
        raise Allocated(f"{name} ran before the request was refused")
    return refuse


@pytest.fixture
def guarded(monkeypatch):
    """A 1 GiB budget, and sentinels in place of the steps that allocate for the request."""
    # (import_module: the package's ``shortlist`` is also the name of a function)
    _memory, cluster, decomposition, grid, kernel, shortlist = (
        importlib.import_module(f"invariant_cluster.{name}")
        for name in ("_memory", "cluster", "decomposition", "search.grid", "search.kernel",
                     "search.shortlist"))

    monkeypatch.setattr(_memory, "memory_budget", lambda device="cpu": BUDGET)
    for module, name in ((kernel, "warp_keys"), (kernel, "shift_images"),
                         (shortlist, "steerable_descriptors"),
                         (shortlist, "invariant_descriptors"),
                         (cluster, "unique_in_canonical_order"),
                         (decomposition, "_normalised_gram")):
        monkeypatch.setattr(module, name, _sentinel(f"{module.__name__}.{name}"))
    real = grid.rotation_grid

    def rotation_grid(max_rotation, n_rotations):
        if n_rotations > 100_000:
            raise Allocated(f"a grid of {n_rotations} angles was built before it was refused")
        return real(max_rotation, n_rotations)

    monkeypatch.setattr(grid, "rotation_grid", rotation_grid)


def _tiny(n, side=1):
    """``n`` images of ``side x side`` pixels as a torch view of one image (no copy)."""
    return torch.zeros(1, 1, side, side).expand(n, 1, side, side)


def _tiny_rows(n, side=1):
    """``n`` flat rows of ``side x side`` images as a NumPy view of one row (no copy)."""
    return np.broadcast_to(np.zeros((1, side * side), np.float32), (n, side * side))


def _big_images(n=4, side=512):
    return np.random.default_rng(0).random((n, side, side), dtype=np.float32)


def _requests():
    """``(id, call, error, pattern)``: every public entry point asked for too much."""
    import invariant_cluster as ic
    from invariant_cluster.neighbors import neighbor_search
    from invariant_cluster.search import make_search_grid

    small = np.random.default_rng(0).random((6, 8, 8), dtype=np.float32)
    many_rotations = dict(n_rotations=10 ** 9)
    # 512 x 512 pixels tell 9,080 angles apart; one key at 2,000 of them needs ~4.7 GB
    fine_grid = dict(group="rotation", n_rotations=2000, refine=False)
    mem, val = "InsufficientMemoryError", "ValueError"
    return [
        # the resolution rule (time): more angles than the images can tell apart
        ("distances-rotations", lambda: ic.invariant_distances(small, **many_rotations),
         val, "n_rotations"),
        ("mean-rotations", lambda: ic.invariant_mean(small, **many_rotations), val, "n_rotations"),
        ("class_averages-rotations",
         lambda: ic.class_averages(small, n_neighbors=2, **many_rotations), val, "n_rotations"),
        ("class_averages-labels-rotations",
         lambda: ic.class_averages(small, labels=np.zeros(6), **many_rotations),
         val, "n_rotations"),
        ("aligned_neighbors-rotations",
         lambda: ic.aligned_neighbors(small, n_neighbors=2, **many_rotations),
         val, "n_rotations"),
        ("clusterer-rotations",
         lambda: ic.InvariantAttentionClusterer(n_rotations=10 ** 5).fit(small),
         val, "n_rotations"),
        ("clustering-rotations",
         lambda: ic.invariant_attention_clustering(small, n_rotations=10 ** 9),
         val, "n_rotations"),
        ("knn-rotations",
         lambda: ic.InvariantKNeighborsTransformer(**many_rotations).fit(small), val,
         "n_rotations"),
        ("graph-rotations",
         lambda: ic.invariant_kneighbors_graph(small, 2, **many_rotations), val, "n_rotations"),
        ("kpca-rotations",
         lambda: ic.KernelPCAAttention(kernel="invariant", n_rotations=10 ** 9).fit(
             small.reshape(6, -1)), val, "n_rotations"),
        ("grid-rotations", lambda: make_search_grid("se2", 180.0, 10 ** 9), val, "n_rotations"),
        ("grid-translations", lambda: make_search_grid("se2", 180.0, 36, 10 ** 9),
         mem, "max_translation"),
        # one key at every grid point does not fit
        ("distances-grid", lambda: ic.invariant_distances(_big_images(2), **fine_grid),
         mem, "n_rotations"),
        ("distances-shifts",
         lambda: ic.invariant_distances(_big_images(2, 64), max_translation=40, refine=False),
         mem, "max_translation"),
        ("clusterer-grid",
         lambda: ic.InvariantAttentionClusterer(**fine_grid).fit(_big_images()),
         mem, "n_rotations"),
        ("knn-grid",
         lambda: ic.InvariantKNeighborsTransformer(n_neighbors=2, **fine_grid).fit_transform(
             _big_images().reshape(4, -1)), mem, "n_rotations"),
        ("class_averages-grid",
         lambda: ic.class_averages(_big_images(), n_neighbors=2, **fine_grid), mem,
         "n_rotations"),
        # too many images
        ("distances-pairs", lambda: ic.invariant_distances(_tiny(200_000, 2)),
         mem, "fewer images"),
        ("mean-images", lambda: ic.invariant_mean(_tiny(200_000, 2)), mem, "fewer images"),
        ("class_averages-labels-images",
         lambda: ic.class_averages(_tiny(200_000, 2), labels=torch.zeros(200_000)),
         mem, "fewer images"),
        ("class_averages-images", lambda: ic.class_averages(_tiny(HUGE_N)), mem, "n_neighbors"),
        ("aligned_neighbors-images", lambda: ic.aligned_neighbors(_tiny(HUGE_N)),
         mem, "n_neighbors"),
        ("knn-images",
         lambda: ic.InvariantKNeighborsTransformer().fit_transform(_tiny_rows(HUGE_N)),
         mem, "n_neighbors"),
        ("graph-images", lambda: ic.invariant_kneighbors_graph(_tiny_rows(HUGE_N), 5),
         mem, "n_neighbors"),
        ("clusterer-images",
         lambda: ic.InvariantAttentionClusterer().fit(_tiny_rows(HUGE_N)), mem, "n_neighbors"),
        ("kpca-softmax-keys", lambda: ic.KernelPCAAttention().fit(_tiny_rows(200_000, 2)),
         mem, "fewer keys"),
        ("kpca-invariant-keys",
         lambda: ic.KernelPCAAttention(kernel="invariant").fit(_tiny_rows(HUGE_N)),
         mem, "n_neighbors"),
        ("neighbor_search-images",
         lambda: neighbor_search(_tiny(HUGE_N), _tiny(HUGE_N),
                                 make_search_grid("rotation", 180.0, 36), k=10),
         mem, "n_neighbors"),
        ("dihedral_pca-size",
         lambda: ic.DihedralPCA(4).fit(_tiny_rows(2, 128)), val, "output_size"),
    ]


@pytest.mark.parametrize("case", _requests(), ids=lambda c: c[0])
def test_every_entry_point_refuses_too_much_before_allocating(guarded, case):
    from invariant_cluster._memory import InsufficientMemoryError

    _, call, error, pattern = case
    expected = InsufficientMemoryError if error == "InsufficientMemoryError" else ValueError
    with pytest.raises(expected, match=pattern) as info:
        call()
    assert not isinstance(info.value, Allocated)
