"""All 70,000 Fashion-MNIST images, one fit per ``random_state``: how far ACC moves with the seed.

``InvariantAttentionClusterer(n_clusters=10, max_rotation=15, n_rotations=7, max_translation=1,
random_state=seed)`` on train + test (Debian's ``dataset-fashion-mnist``), one row per seed with
seconds, ACC and NMI. ``--ref REF`` fits with the package as of git commit ``REF`` instead
(extracted with ``git archive`` into a temporary folder), so two versions can be compared on the
same seeds and machine:

    python benchmarks/bench_fashion70k_seeds.py --seeds 0 1 2 --label new
    python benchmarks/bench_fashion70k_seeds.py --seeds 0 1 2 --ref ecb1eaa --label old --append

``--n N`` fits the first ``N`` images of train + test instead of all of them.

Writes ``benchmarks/results/fashion70k_seeds.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, environment, print_table, write_json  # noqa: E402

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
from sklearn.metrics import normalized_mutual_info_score
from invariant_cluster import InvariantAttentionClusterer
from invariant_cluster.datasets import load_fashion_mnist
from invariant_cluster.metrics import clustering_accuracy
X, y = load_fashion_mnist(split="all", return_X_y=True)
n = int(sys.argv[1])
X, y = (X[:n], y[:n]) if n else (X, y)
for seed in map(int, sys.argv[2:]):
    t = time.perf_counter()
    est = InvariantAttentionClusterer(n_clusters=10, max_rotation=15, n_rotations=7,
                                      max_translation=1, random_state=seed).fit(X)
    print(json.dumps({"seed": seed, "n": len(X), "seconds": time.perf_counter() - t,
                      "acc": float(clustering_accuracy(y, est.labels_)),
                      "nmi": float(normalized_mutual_info_score(y, est.labels_))}), flush=True)
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--n", type=int, default=0, help="the first N images only (default: all)")
    p.add_argument("--ref", default=None, help="git commit to fit with (default: this tree)")
    p.add_argument("--label", default=None)
    p.add_argument("--append", action="store_true")
    p.add_argument("--out", default=str(RESULTS / "fashion70k_seeds.json"))
    args = p.parse_args(argv)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        commit = subprocess.run(["git", "rev-parse", args.ref or "HEAD"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.strip()
        if args.ref:
            archive = subprocess.run(["git", "archive", commit, "invariant_cluster"], cwd=ROOT,
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            env["PYTHONPATH"] = tmp
        else:
            env["PYTHONPATH"] = str(ROOT)
        proc = subprocess.run([sys.executable, "-c", CHILD, str(args.n), *map(str, args.seeds)],
                              env=env, cwd=tmp, check=True, capture_output=True, text=True)
    rows = [{"label": args.label or commit[:7], "commit": commit, **json.loads(line)}
            for line in proc.stdout.splitlines() if line.startswith("{")]
    print_table(rows, ["label", "seed", "n", "seconds", "acc", "nmi"])
    if args.append and out.exists():
        rows = json.loads(out.read_text())["rows"] + rows
    write_json({"benchmark": "fashion70k_seeds", "env": environment(), "rows": rows,
                "note": "one fresh process per call, its seeds in turn; a shared 2-core machine "
                        "makes the seconds noisy"}, out)


if __name__ == "__main__":
    main()
