"""A first fit in a fresh process, as a new installation, container or CI runner has it.

The default fit imports no package that compiles code on first use (numba, pynndescent,
umap-learn): numba's cache, pointed at a new empty folder, is still empty afterwards, and
nothing on standard error comes from them (umap-learn's "Tensorflow not installed").
"""

import json
import os
import subprocess
import sys

_CHILD = '''
import json, sys
import numpy as np
from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_digits_images
X, _ = load_digits_images(return_X_y=True)
labels = [InvariantAttentionClusterer(max_rotation=30, n_rotations=5, random_state=0)
          .fit(X[:300]).labels_ for _ in range(2)]
print(json.dumps({"imported": sorted(m for m in ("numba", "pynndescent", "umap")
                                     if m in sys.modules),
                  "same_labels": bool(np.array_equal(*labels))}))
'''


def test_first_fit_compiles_nothing(tmp_path):
    cache = tmp_path / "numba_cache"
    cache.mkdir()
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, NUMBA_CACHE_DIR=str(cache)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["imported"] == []
    assert not any(cache.iterdir()), "numba compiled on the first fit"
    assert "Tensorflow" not in proc.stderr
    # the second fit in the same process gives the first fit's labels
    assert out["same_labels"]
