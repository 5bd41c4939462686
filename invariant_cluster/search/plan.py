"""The search plan: how one kNN search runs, decided once from its sizes and its device.

A search of ``n_queries`` images against ``n_keys`` images on a grid of ``grid_size``
transformations, keeping ``k`` neighbours, runs either

- "exact": every query is aligned onto every key at every grid point (blocked matrix products,
  ``n_queries x n_keys x grid_size`` warped inner products), or
- "shortlist": rotation-steerable descriptors pick ``n_candidates`` keys per query, and only
  those are aligned exactly, followed (for a self-search) by one exact pass over the
  neighbours' neighbours (``hops``). The shortlist itself is found either by comparing every
  query descriptor with every key descriptor in blocked matrix products on the search's device
  ("blocked"), or by faiss's inverted file on the CPU ("faiss", about ``O(n log n)``).

:func:`make_search_plan` makes the decision with a cost model per kind of device; the
estimators record the plan of their fit (``search_plan_``), size their memory check from it and
pass it to :func:`~invariant_cluster.search.dispatch.knn_search`. The thresholds are names of
this module; :mod:`invariant_cluster._memory` keeps the byte counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

__all__ = ["SearchPlan", "make_search_plan", "default_n_candidates"]

# ----------------------------------------------------------------------------- exact or shortlist
# Work (keys x grid size) up to which neighbor_search="auto" searches exactly, per kind of
# device. The exact search costs n_queries x n_keys x grid size warped inner products; the
# shortlist's exact part is linear in n_keys. A card runs the products much faster than a CPU
# but its warps, top-k merges and blocks much less so (measured: docs/design/gpu_plan.rst).
EXACT_WORK = {"cpu": 4000 * 36, "cuda": 5 * 4000 * 36}

# Keys from which the descriptor shortlist is found by faiss's inverted file instead of the
# blocked all-pairs products (which cost n^2), per kind of device; on a card the blocked
# products stay on the card, where faiss-cpu would copy the descriptors to the host (measured:
# docs/design/cpu_search.rst).
FAISS_MIN_KEYS = {"cpu": 10_000, "cuda": 200_000}
# Kinds of device whose samples' shortlist always takes the wider margin (see below).
WIDE_SHORTLIST_KINDS = ("cuda",)

# ----------------------------------------------------------------------------- shortlist length
# Candidates per searched neighbour of the shortlist, and the fewest (measured recall:
# docs/design/defaults.rst).
CANDIDATES_PER_NEIGHBOR = 4
MIN_CANDIDATES = 64
# Where faiss's approximate search finds the shortlist, and on a card for the blocked
# shortlist too (WIDE_SHORTLIST_KINDS, where the exact search of the candidates is cheap), a
# wider margin: 6 k candidates, at least 96 (measured recall: docs/design/cpu_search.rst).
APPROXIMATE_CANDIDATES_PER_NEIGHBOR = 6
APPROXIMATE_MIN_CANDIDATES = 96
# The kNN transformer shortlists for twice as many neighbours (8 k candidates, without the
# approximate margin): the exact search of the candidates is a small part of its time
# (measured recall: docs/design/defaults.rst).
GRAPH_CANDIDATE_FACTOR = 2
# A self-search with a shortlist takes one more exact pass over the HOP_NEIGHBORS nearest
# neighbours of each query's HOP_NEIGHBORS nearest neighbours. The search of the converged
# means (purpose "means") takes none: it only adds edges to the union graph, and the means are
# denoised; it keeps max(4 k, 64) candidates (measured recall: docs/design/cpu_search.rst).
HOP_NEIGHBORS = 10

_PURPOSES = ("samples", "means", "graph")


@dataclass(frozen=True)
class SearchPlan:
    """How one kNN search runs (see the module's description).

    Attributes
    ----------
    method : {"exact", "shortlist"}
    shortlist : {"none", "blocked", "faiss"}
        How the descriptor shortlist is found ("none" for the exact search).
    n_candidates : int
        Keys per query aligned exactly after the shortlist (0 for the exact search).
    hops : int
        Neighbours' neighbours searched again after the shortlist (0: none).
    device : {"cpu", "cuda", ...}
        The kind of device the search runs on.
    n_queries, n_keys, grid_size, k : int
        The sizes the plan was made for.
    reason : str
        Why, in one sentence.
    """

    method: str
    shortlist: str
    n_candidates: int
    hops: int
    device: str
    n_queries: int
    n_keys: int
    grid_size: int
    k: int
    reason: str

    @property
    def approximate(self) -> bool:
        """Whether faiss's inverted file finds the shortlist."""
        return self.shortlist == "faiss"

    def to_dict(self) -> dict:
        return asdict(self)


def _kind(device) -> str:
    """``"cpu"``, ``"cuda"``, ...: the kind of a device, a device string or a tensor's device."""
    if isinstance(device, torch.Tensor):
        device = device.device
    return torch.device(device).type


def _per_kind(table: dict, kind: str):
    # a device kind without its own measurement (mps, xpu) is planned as the CPU
    return table.get(kind, table["cpu"])


def uses_faiss(n_keys, device="cpu") -> bool:
    """Whether the descriptor shortlist of ``n_keys`` keys on ``device`` is found by faiss."""
    return int(n_keys) >= _per_kind(FAISS_MIN_KEYS, _kind(device))


def default_n_candidates(k, n_keys, *, margin=True, device="cpu") -> int:
    """The shortlist length used when none is given: ``max(4 k, 64)``, at most ``n_keys``;
    ``max(6 k, 96)`` with ``margin`` where faiss finds the shortlist or on a card."""
    if margin and (uses_faiss(n_keys, device) or _kind(device) in WIDE_SHORTLIST_KINDS):
        per, least = APPROXIMATE_CANDIDATES_PER_NEIGHBOR, APPROXIMATE_MIN_CANDIDATES
    else:
        per, least = CANDIDATES_PER_NEIGHBOR, MIN_CANDIDATES
    return int(min(int(n_keys), max(per * int(k), least)))


def make_search_plan(n_queries, n_keys, grid_size, k, *, device="cpu", method="auto",
                     n_candidates=None, purpose="samples", self_search=None) -> SearchPlan:
    """The plan of one kNN search.

    Parameters
    ----------
    n_queries, n_keys, grid_size, k : int
        The search's sizes (``grid_size``: the grid's transformations per pair).
    device : str, torch.device or torch.Tensor, default="cpu"
        Where the search runs; only its kind ("cpu", "cuda") matters.
    method : {"auto", "exact", "shortlist"}, default="auto"
        "auto": exact while ``n_keys x grid_size`` is at most ``EXACT_WORK`` of the device's
        kind.
    n_candidates : int, optional
        Shortlist length; None: from ``purpose`` (:func:`default_n_candidates`).
    purpose : {"samples", "means", "graph"}, default="samples"
        "samples": the clusterer's graph of its samples (``max(6 k, 96)`` candidates where
        faiss finds them or on a card, else ``max(4 k, 64)``); "means": the graph of the
        converged means (``max(4 k, 64)``, no pass over the neighbours' neighbours); "graph":
        the kNN transformer's (``max(8 k, 64)``).
    self_search : bool, optional
        Whether the queries are the keys, each left out of its own list (the pass over the
        neighbours' neighbours needs it). None: ``n_queries == n_keys``.

    Returns
    -------
    plan : SearchPlan
    """
    if method not in ("auto", "exact", "shortlist"):
        raise ValueError(f"method: expected 'auto', 'exact' or 'shortlist', got {method!r}")
    if purpose not in _PURPOSES:
        raise ValueError(f"purpose: expected one of {_PURPOSES}, got {purpose!r}")
    nq, nk, g, k = int(n_queries), int(n_keys), int(grid_size), int(k)
    kind = _kind(device)
    self_search = nq == nk if self_search is None else bool(self_search)
    sizes = dict(device=kind, n_queries=nq, n_keys=nk, grid_size=g, k=k)
    limit = _per_kind(EXACT_WORK, kind)
    if method == "exact" or (method == "auto" and nk * g <= limit):
        why = ("asked for" if method == "exact" else
               f"{nk} keys x {g} grid points <= {limit} on {kind}")
        return SearchPlan("exact", "none", 0, 0, reason=f"exact: {why}", **sizes)
    if n_candidates is None:
        if purpose == "graph":
            c = default_n_candidates(GRAPH_CANDIDATE_FACTOR * k, nk, margin=False)
        else:
            c = default_n_candidates(k, nk, margin=purpose == "samples", device=kind)
    else:
        c = int(n_candidates)
    c = int(min(max(c, k), nk))
    route = "faiss" if uses_faiss(nk, kind) else "blocked"
    hops = HOP_NEIGHBORS if self_search and purpose != "means" and c < nk - 1 else 0
    why = ("asked for" if method == "shortlist" else
           f"{nk} keys x {g} grid points > {limit} on {kind}")
    where = (f"faiss's inverted file ({nk} keys >= {_per_kind(FAISS_MIN_KEYS, kind)})"
             if route == "faiss" else f"blocked products on {kind}")
    return SearchPlan("shortlist", route, c, hops,
                      reason=f"shortlist: {why}; {c} candidates by {where}", **sizes)
