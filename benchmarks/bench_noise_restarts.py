"""Noisy rotated MNIST: two post-processings of the default grouping, measured and not adopted.

On the data and stages of ``bench_noise.py`` (``n`` digits rotated within +-45 degrees plus
Gaussian noise ``sigma``; the invariant kNN search, the iteration and the means' search run
once per seed), the estimator's default grouping (``graph="auto"``, Leiden with the resolution
searched to give 10 parts) is compared with

- ``best of R by modularity``: the whole resolution search restarted with ``R`` seeds, the
  10-part partition of the highest modularity (resolution 1, igraph) kept; also the restarts'
  mean ACC and the ACC of the lowest modularity, and the correlation of modularity and ACC over
  the restarts;
- ``consensus of the restarts``: Leiden on the union graph with each edge's weight multiplied
  by the share of the ``R`` restarts that put its ends in one part;
- ``smoothed (r rounds)``: each node takes the label of the largest weight among itself and its
  neighbours in the union graph, ``r`` rounds.

    python benchmarks/bench_noise_restarts.py --n 2000 --seeds 0 1 2 3 4 5 6 \\
        --out benchmarks/results/noise_restarts_2000.json
    python benchmarks/bench_noise_restarts.py --n 10000 --seeds 0 1 2 \\
        --out benchmarks/results/noise_restarts_10000.json
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table  # noqa: E402
from bench_noise import default_grouping, noisy, seeds_main, stages  # noqa: E402


def smooth(G, labels, rounds):
    """Labels after ``rounds`` of the weighted majority of each node and its neighbours."""
    G = G.tocsr()
    k = int(labels.max()) + 1
    for _ in range(rounds):
        onehot = np.eye(k)[labels]
        new = np.asarray(G @ onehot + onehot).argmax(1)
        if (new == labels).all():
            break
        labels = new
    return labels


def run(args):
    import igraph as ig
    from scipy.sparse import csr_matrix

    from invariant_cluster._grouping import leiden
    from invariant_cluster.metrics import clustering_accuracy

    rows = []
    for sigma in args.sigmas:
        for seed in args.seeds:
            X, _, y = noisy(args.n, sigma, seed, args.data)
            st = stages(X, seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                labels, used, G = default_grouping(st, seed)
                g = G.tocoo()
                up = g.row < g.col
                net = ig.Graph(n=args.n, edges=np.c_[g.row[up], g.col[up]],
                               edge_attrs={"weight": g.data[up]})
                accs, mods, agree = [], [], np.zeros(len(g.row))
                for r in range(args.restarts):
                    lab = leiden(G, 10, seed + 1000 * r)
                    accs.append(float(clustering_accuracy(y, lab)))
                    mods.append(float(net.modularity(list(lab), weights="weight")))
                    agree += lab[g.row] == lab[g.col]
                C = csr_matrix((g.data * agree / args.restarts, (g.row, g.col)), shape=G.shape)
                C.eliminate_zeros()
                consensus = leiden(C, 10, seed)
            row = {"sigma": sigma, "seed": seed, "n": args.n, "graph_used": used,
                   "default": float(clustering_accuracy(y, labels)),
                   f"best of {args.restarts} by modularity": accs[int(np.argmax(mods))],
                   "restarts' mean": float(np.mean(accs)),
                   "lowest modularity": accs[int(np.argmin(mods))],
                   "corr(modularity, acc)": float(np.corrcoef(mods, accs)[0, 1]),
                   "consensus of the restarts": float(clustering_accuracy(y, consensus)),
                   "restart_acc": accs, "restart_modularity": mods}
            for r in (1, 3, 10):
                row[f"smoothed ({r} rounds)"] = float(
                    clustering_accuracy(y, smooth(G, labels, r)))
            rows.append(row)
            print_table(rows[-1:], [c for c in row if not c.startswith("restart_")])
    methods = [c for c in rows[0] if c not in ("sigma", "seed", "n", "graph_used")
               and not c.startswith("restart_") and not c.startswith("corr")]
    return rows, methods


def main(argv=None):
    return seeds_main(__doc__.splitlines()[0], "noise_restarts", run, argv,
                      extra=[("--restarts", dict(type=int, default=8))])


if __name__ == "__main__":
    main()
