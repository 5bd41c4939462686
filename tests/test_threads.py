"""A fit leaves the thread settings as it found them: torch's, numba's and the BLAS/OpenMP pools'.

Each case runs in a fresh process, since numba's pool starts once per process (its OpenMP layer
then sets OpenMP's thread count, which is torch's).
"""

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")

_SCRIPT = '''
import json
import torch
torch.set_num_threads(1)
from threadpoolctl import threadpool_info, threadpool_limits
import invariant_cluster as ic
from invariant_cluster.datasets import load_digits_images

def pools():
    return {i["filepath"]: i["num_threads"] for i in threadpool_info()}

X = load_digits_images().images[:N]
with threadpool_limits(limits=1):
    before = pools()
    est = CALL
    after = pools()
torch_after = torch.get_num_threads()
import numba
print(json.dumps({"torch": torch_after, "numba": numba.get_num_threads(),
                  "numba_default": numba.config.NUMBA_NUM_THREADS,
                  "pools": [[p, before[p], after[p]] for p in before]}))
'''

CASES = {
    # the default fit's count (modularity on digits) calls umap-learn's numba code
    "clusterer_default": (400, "ic.InvariantAttentionClusterer().fit(X)"),
    "clusterer_n_jobs": (200, "ic.InvariantAttentionClusterer(n_jobs=2).fit(X)"),
    "clusterer_umap": (200, "ic.InvariantAttentionClusterer(grouping='umap', n_jobs=None).fit(X)"),
    "knn_transformer_shortlist": (
        600, "ic.InvariantKNeighborsTransformer(n_neighbors=5, n_rotations=8, "
             "neighbor_search='shortlist').fit_transform(X)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fit_leaves_thread_settings(case):
    n, call = CASES[case]
    script = textwrap.dedent(_SCRIPT.replace("N]", f"{n}]").replace("CALL", call))
    out = subprocess.run([sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    state = json.loads(out.stdout.strip().splitlines()[-1])
    assert state["torch"] == 1
    # numba's count: its default, as the process had it before the fit
    assert state["numba"] == state["numba_default"]
    for path, before, after in state["pools"]:
        assert after == before, path
