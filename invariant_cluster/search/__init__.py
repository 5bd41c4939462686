"""The alignment search engine: one block kernel, the searches built on it, the refinement.

Layers, bottom up (each module imports only those above it in this list):

- :mod:`.plan`: :class:`SearchPlan`, which search runs (exact or shortlist, blocked or faiss)
  for given sizes and device;
- :mod:`.grid`: :class:`SearchGrid` (angles, integer shifts, bounds) and its decode of grid
  points into parameters;
- :mod:`.kernel`: the block kernel (scores -> distances -> min over the grid -> exclude ->
  top-``k`` merge) and the exact all-pairs search, local or on Dask blocks;
- :mod:`.candidates`: the exact search restricted to candidate keys;
- :mod:`.descriptors`: the rotation-steerable descriptors;
- :mod:`.blocked`: the descriptor shortlist, every query against every key in blocks;
- :mod:`.approximate`: the shortlist by faiss's inverted file, where the plan says so;
- :mod:`.shortlist`: the descriptors, a shortlist, then the exact search (``neighbor_search``);
- :mod:`.refine`: the continuous refinement of grid alignments;
- :mod:`.dispatch`: runs a plan, the one entry of the estimators' kNN searches.

Every warp goes through :mod:`invariant_cluster.transforms`; every block size comes from
:mod:`invariant_cluster._memory`.
"""

from .approximate import approximate_shortlist
from .candidates import candidate_search
from .descriptors import invariant_descriptors, steerable_descriptors
from .dispatch import knn_search
from .grid import GROUPS, SearchGrid, make_search_grid, rotation_limit, translation_limit
from .kernel import (
    blocked_grid_search,
    grid_search,
    shift_energies,
    shift_images,
    shift_margin,
    warp_keys,
)
from .plan import SearchPlan, make_search_plan
from .refine import all_pairs, refine_alignments, refine_pairs

# ``shortlist`` the function (of .blocked), bound after the submodule of that name is loaded
from .shortlist import neighbor_search, shortlist, shortlist_descriptors

__all__ = [
    "GROUPS",
    "SearchGrid",
    "SearchPlan",
    "make_search_plan",
    "make_search_grid",
    "rotation_limit",
    "translation_limit",
    "grid_search",
    "blocked_grid_search",
    "candidate_search",
    "invariant_descriptors",
    "steerable_descriptors",
    "shortlist",
    "approximate_shortlist",
    "shortlist_descriptors",
    "neighbor_search",
    "knn_search",
    "refine_alignments",
    "refine_pairs",
    "all_pairs",
    "warp_keys",
    "shift_images",
    "shift_energies",
    "shift_margin",
]
