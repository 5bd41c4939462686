"""The memory check's estimate of a fit against the fit's measured peak.

``fit`` compares :func:`invariant_cluster._memory.estimate_fit_bytes` with the free memory
before it starts. The estimate claims to be within 2x of what the fit adds to the process's
peak resident set; measured here in a fresh process on rotated and shifted copies of
scikit-learn's digits zoomed to 16 x 16: Linux's high-water mark of the resident set is reset
after the imports (``/proc/self/clear_refs``), so that their own transient peak cannot hide the
fit's.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

_CHILD = '''
import json
from pathlib import Path
import numpy as np
import faiss, igraph, leidenalg, scipy.sparse.csgraph, sklearn.cluster, torch  # noqa: F401
from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster._memory import estimate_fit_bytes
from invariant_cluster.datasets import load_digits_images, make_transformed
from invariant_cluster.search import make_search_plan

n, n_clusters = {n}, {n_clusters}
X = np.kron(load_digits_images().images, np.ones((1, 2, 2)))[:n].reshape(n, -1)
X = make_transformed(X, max_rotation=15, random_state=0)[0].reshape(n, 16, 16)
X = np.ascontiguousarray(X, dtype=np.float32)
est = InvariantAttentionClusterer(n_clusters=n_clusters, max_rotation=15, n_rotations=7,
                                  max_translation=1, random_state=0)
k = est.n_neighbors
plan = make_search_plan(n, n, est._grid(refine=False).size, k, method=est.neighbor_search,
                        n_candidates=est.n_candidates)
estimate = estimate_fit_bytes(n, X[0].size, k, plan.n_candidates, filtered=est.noise_std != 0,
                              grouping_means=n_clusters is None)


def status_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])


Path("/proc/self/clear_refs").write_text("5")  # the high-water mark back to the resident set
before = status_kib("VmRSS")
est.fit(X)
peak = status_kib("VmHWM")
print(json.dumps({{"estimate": estimate, "added": (peak - before) * 1024}}))
'''


def test_estimate_is_within_2x_of_the_fits_peak():
    if not sys.platform.startswith("linux"):
        pytest.skip("the peak is read from Linux's /proc/self/status")
    code = textwrap.dedent(_CHILD.format(n=1000, n_clusters=None))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["added"] > 0
    assert out["added"] / 2 <= out["estimate"] <= 2 * out["added"], out
