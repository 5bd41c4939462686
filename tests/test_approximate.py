"""The approximate shortlist by faiss's inverted file (``search.approximate``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from _search import assert_shortlist_contract
from _search import recall as _recall

faiss = pytest.importorskip("faiss")

from invariant_cluster.datasets import make_transformed  # noqa: E402
from invariant_cluster.search import approximate as approx_module  # noqa: E402
from invariant_cluster.search import (  # noqa: E402
    make_search_grid,
    shortlist,
    shortlist_descriptors,
)
from invariant_cluster.search.approximate import approximate_shortlist  # noqa: E402


def _descriptors(smooth_images, n_protos, n_copies, size, grid, rotate, seed):
    protos = smooth_images(n_protos, size, seed=seed)
    X = np.repeat(protos, n_copies, axis=0)
    X, _ = make_transformed(X, max_rotation=grid.max_rotation,
                            max_translation=grid.max_translation, random_state=seed)
    X = torch.as_tensor(X.astype(np.float32))[:, None]
    return shortlist_descriptors(X, X, grid, rotate=rotate)


@pytest.fixture
def few_cells(monkeypatch):
    """A truly approximate search even of a small index: 8 cells, whatever their size."""
    monkeypatch.setattr(approx_module, "_MIN_SCANNED", 0)


@pytest.mark.parametrize("group, rot, n_rot, shift, rotate, n_protos, n_copies, size", [
    ("se2", 15.0, 7, 1, "auto", 40, 15, 20),       # 9 query copies, 3 key copies
    ("rotation", 60.0, 13, 0, "queries", 30, 20, 16),  # rotations on the queries, 1 key copy
    ("rotation", 60.0, 13, 0, "keys", 25, 16, 24),     # rotations on the keys
    ("translation", 0.0, 1, 2, "auto", 50, 12, 16),    # shifts only
])
def test_recall_of_the_exact_shortlist_on_several_shapes(
        smooth_images, few_cells, group, rot, n_rot, shift, rotate, n_protos, n_copies, size):
    grid = make_search_grid(group, rot, n_rot, shift, refine=False)
    Xd, Yd = _descriptors(smooth_images, n_protos, n_copies, size, grid, rotate, seed=size)
    n, m = Xd.shape[0], 48
    own = torch.arange(n)
    exact = shortlist(Xd, Yd, m, exclude=own)
    cand = approximate_shortlist(Xd, Yd, m, exclude=own)
    assert_shortlist_contract(cand, n, m, own)
    assert _recall(exact, cand) >= 0.95
    assert _recall(exact[:, :15], cand) >= 0.98


def test_without_exclude_and_with_other_queries(few_cells):
    g = torch.Generator().manual_seed(1)
    centres = torch.randn(20, 24, generator=g) * 4
    Y = (centres.repeat_interleave(60, 0) + torch.randn(1200, 24, generator=g))[:, None]
    X = (centres.repeat_interleave(5, 0) + torch.randn(100, 24, generator=g))[:, None]
    cand = approximate_shortlist(X, Y, 30)
    assert _recall(shortlist(X, Y, 30), cand) >= 0.95


def test_same_shortlist_for_a_fixed_random_state_and_any_thread_count(smooth_images,
                                                                      few_cells):
    grid = make_search_grid("se2", 15.0, 7, 1, refine=False)
    Xd, Yd = _descriptors(smooth_images, 30, 15, 20, grid, "auto", seed=3)
    own = torch.arange(Xd.shape[0])
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (2, 1, 2):
            torch.set_num_threads(threads)
            runs.append(approximate_shortlist(Xd, Yd, 40, exclude=own, random_state=7))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_faiss_runs_on_torch_threads_and_its_setting_is_put_back(monkeypatch):
    seen = []
    real = approx_module._build_index

    def spy(keys, random_state=0):
        seen.append(faiss.omp_get_max_threads())
        return real(keys, random_state)

    monkeypatch.setattr(approx_module, "_build_index", spy)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 2, 8, generator=g)
    faiss_before, torch_before = faiss.omp_get_max_threads(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        # faiss and torch may share one OpenMP runtime (then this moves torch too)
        faiss.omp_set_num_threads(3)
        threads = torch.get_num_threads()
        approximate_shortlist(X, X, 10, exclude=torch.arange(300))
        assert seen == [threads]
        assert faiss.omp_get_max_threads() == 3
        assert torch.get_num_threads() == threads
    finally:
        faiss.omp_set_num_threads(faiss_before)
        torch.set_num_threads(torch_before)


def test_exact_fallback_serves_rows_the_index_leaves_short(monkeypatch):
    # a single cell searched and one entry per copy: rows short of distinct keys end exact
    monkeypatch.setattr(approx_module, "_MIN_SCANNED", 0)
    monkeypatch.setattr(approx_module, "_PROBES", 1)
    monkeypatch.setattr(approx_module, "_ENTRIES_PER_CANDIDATE", 0.01)
    monkeypatch.setattr(approx_module, "_REQUERY_GROWTH", ())
    g = torch.Generator().manual_seed(5)
    Xd, Yd = torch.randn(300, 2, 12, generator=g), torch.randn(300, 2, 12, generator=g)
    own = torch.arange(300)
    assert torch.equal(approximate_shortlist(Xd, Yd, 30, exclude=own),
                       shortlist(Xd, Yd, 30, exclude=own))


_IMPORT = '''
import sys
before = {}
if sys.argv[1] == "pre":
    import numba, pynndescent  # noqa: F401
    pnn = sys.modules["pynndescent.pynndescent_"]
    before = {name: getattr(pnn, name) for name in dir(pnn)}
import torch
import invariant_cluster
from invariant_cluster.search import approximate_shortlist
X = torch.randn(400, 3, 8, generator=torch.Generator().manual_seed(0))
approximate_shortlist(X, X, 10, exclude=torch.arange(400))
if sys.argv[1] == "pre":
    pnn = sys.modules["pynndescent.pynndescent_"]
    changed = [n for n in dir(pnn) if getattr(pnn, n) is not before.get(n)]
    print("changed:" + ",".join(changed))
else:
    print("loaded:" + ",".join(m for m in ("numba", "pynndescent", "umap") if m in sys.modules))
'''


@pytest.mark.parametrize("mode", ["fresh", "pre"])
def test_importing_and_the_shortlist_patch_nothing_outside_the_package(mode):
    """Importing invariant_cluster and running the approximate shortlist loads neither numba
    nor pynndescent, and leaves a pynndescent imported before as it was."""
    if mode == "pre":
        pytest.importorskip("pynndescent")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_IMPORT), mode], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line in ("loaded:", "changed:"), line
