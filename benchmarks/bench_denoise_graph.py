"""Noisy rotated MNIST: the samples' kNN graph searched on the pixels or on a DihedralPCA copy.

The data of ``bench_noise.py`` (``n`` MNIST test digits rotated within +-45 degrees plus
Gaussian noise of standard deviation ``sigma``; the search over +-60 degrees, 24 angles, k =
15). For each (sigma, seed) the invariant kNN graph of the samples is searched twice: on the
noisy pixels, and on ``DihedralPCA(n_components).fit_transform(X)`` (the PCA of the images'
covariance averaged over quarter turns and mirrors; the seconds include it). Each graph is
grouped by the noise benchmark's two baselines: the pipeline (umap-learn -> k-means, the estimator's
``embed_and_cluster``) and Leiden on umap-learn's fuzzy graph (resolution searched for 10
clusters), with the seed of the data. Columns: graph purity (share of edges joining two digits of
one class), ACC, NMI, seconds.

This measures the denoised search as a candidate for the clusterer's own search; the clusterer
does not use it (yet).

    python benchmarks/bench_denoise_graph.py                      # n = 2,000, 3 sigmas, 3 seeds
    python benchmarks/bench_denoise_graph.py --n 10000 --sigmas 0.5 0.8 --seeds 0  # about 4 min
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, scores, write_json  # noqa: E402
from bench_noise import SEARCH, K, noisy, purity  # noqa: E402

from invariant_cluster import DihedralPCA  # noqa: E402
from invariant_cluster._grouping import embed_and_cluster, fuzzy_graph, leiden  # noqa: E402
from invariant_cluster.search import knn_search, make_search_grid  # noqa: E402


def search(Z, shape, grid):
    Zt = torch.as_tensor(Z).reshape(len(Z), *shape)
    with torch.no_grad():
        D, idx, _ = knn_search(Zt, Zt, grid, K, exclude=torch.arange(len(Z)))
    return idx.numpy(), D.clamp(min=0).sqrt().numpy().astype(np.float64)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.5, 0.8])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--components", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    grid = make_search_grid("se2", refine=False, **SEARCH)
    rows = []
    for sigma in args.sigmas:
        for seed in args.seeds:
            X, _, y = noisy(args.n, sigma, seed)
            for graph in ("pixels", f"DihedralPCA({args.components})"):
                t0 = time.perf_counter()
                if graph == "pixels":
                    idx, dist = search(X, (1, *X.shape[1:]), grid)
                else:
                    pca = DihedralPCA(args.components).fit(X)
                    idx, dist = search(pca.transform(X), pca.image_shape_out_, grid)
                t_search = time.perf_counter() - t0
                for grouping in ("pipeline", "leiden"):
                    t0 = time.perf_counter()
                    if grouping == "pipeline":
                        labels = embed_and_cluster(idx, dist, 10, seed)
                    else:
                        labels = leiden(fuzzy_graph(idx, dist, seed), 10, seed)
                    row = {"n": args.n, "sigma": sigma, "seed": seed, "graph": graph,
                           "grouping": grouping, "purity": purity(idx, y),
                           **scores(y, labels),
                           "seconds": t_search + time.perf_counter() - t0}
                    rows.append(row)
                    print_table([row], list(row))
    summary = []
    for sigma in args.sigmas:
        for graph in ("pixels", f"DihedralPCA({args.components})"):
            for grouping in ("pipeline", "leiden"):
                sel = [r for r in rows if r["sigma"] == sigma and r["graph"] == graph
                       and r["grouping"] == grouping]
                summary.append({"sigma": sigma, "graph": graph, "grouping": grouping,
                                **{c: float(np.mean([r[c] for r in sel]))
                                   for c in ("purity", "acc", "nmi", "seconds")}})
    print()
    print_table(summary, ["sigma", "graph", "grouping", "purity", "acc", "nmi", "seconds"])
    write_json({"benchmark": "denoise_graph", "env": environment(), "args": vars(args),
                "rows": rows, "summary": summary},
               Path(args.out or RESULTS / f"denoise_graph_{args.n}.json"))


if __name__ == "__main__":
    main()
