"""Requests too large for the machine fail before they start, and indices stay exact at any n.

Nothing here allocates much: huge sample counts are torch tensors expanded from a tiny one (no
copy), and the memory budget is replaced by a fixed one so that "too much" means the same on
every machine.
"""

from __future__ import annotations

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
