"""``center=True`` against the default on natural classes with shifts searched, count given.

``InvariantAttentionClusterer(n_clusters=10, random_state=seed, center=...)`` with
``bench_clustering``'s search range on two of its variants: ``rotated45_shift2`` (MNIST test
digits rotated within +-45 degrees and shifted within +-2 px, an empty background) and
``fashion`` (Fashion-MNIST test, clothing that fills the frame), 10,000 images each, one row
per (variant, seed, center) with ACC, NMI and seconds. Where the centre of mass is not a stable
landmark, centring can cost accuracy; that is why it is not the default.

    python benchmarks/bench_center.py                    # seeds 0 1 2, both variants
    python benchmarks/bench_center.py --variants fashion --seeds 0

Writes ``benchmarks/results/center.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, write_json  # noqa: E402
from bench_clustering import VARIANTS, make_variant  # noqa: E402


def main(argv=None):
    from sklearn.metrics import normalized_mutual_info_score

    from invariant_cluster import InvariantAttentionClusterer
    from invariant_cluster.metrics import clustering_accuracy

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder with the MNIST/Fashion-MNIST test splits")
    p.add_argument("--variants", nargs="+", default=["fashion", "rotated45_shift2"],
                   choices=sorted(VARIANTS))
    p.add_argument("--n", type=int, default=10000)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", default=str(RESULTS / "center.json"))
    args = p.parse_args(argv)
    command = ["python", *sys.argv] if argv is None else ["python", sys.argv[0], *argv]
    rows = []
    for variant in args.variants:
        search = VARIANTS[variant]["search"]
        for seed in args.seeds:
            X, y = make_variant(variant, args.n, seed, args.data)
            for center in (False, True):
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    est = InvariantAttentionClusterer(n_clusters=10, random_state=seed,
                                                      center=center, **search).fit(X)
                rows.append({"variant": variant, "n": args.n, "seed": seed, "center": center,
                             "search": search, "seconds": time.perf_counter() - t0,
                             "acc": float(clustering_accuracy(y, est.labels_)),
                             "nmi": float(normalized_mutual_info_score(y, est.labels_))})
                print_table(rows[-1:], ["variant", "seed", "center", "acc", "nmi", "seconds"])
    write_json({"benchmark": "center", "env": environment(), "command": " ".join(command),
                "args": vars(args), "rows": rows}, Path(args.out))
    print_table(rows, ["variant", "seed", "center", "acc", "nmi", "seconds"])
    return rows


if __name__ == "__main__":
    main()
