"""Noisy rotated MNIST: what the iteration of invariant attention buys, grouping by grouping.

Data: ``n`` digits of the MNIST test split (a random subset per seed), rotated uniformly within
+-45 degrees, plus Gaussian noise of standard deviation ``sigma`` (pixels in [0, 1], not
clipped). The search range is the one ``bench_clustering.py`` uses for that row (+-60 degrees,
24 angles).

For each (sigma, seed) the invariant kNN search (k = 15), the iteration and the means' graph run
ONCE, and every grouping reuses them; a grouping's seconds add the stages it needs (the search for
the samples' graph; the search, the iteration and the means' graph for the others). Rows:

- ``pipeline``: umap-learn (``n_components=10, min_dist=0``, precomputed kNN) -> k-means(10) on the
  samples' graph, the pipeline a user assembles from our kNN;
- ``leiden (samples)``: Leiden (leidenalg, RB configuration) on umap-learn's fuzzy graph of the
  samples, the resolution bisected to give 10 clusters (single-cell analysis' standard);
- ``estimator fit``: ``InvariantAttentionClusterer(n_clusters=10 or None, random_state=seed)``
  at its defaults (only the search range set), its own fit from scratch (clean row);
- the candidates on the converged means: their kNN graph (searched within two hops, as
  ``graph="means"``) grouped by umap-learn + k-means, umap-learn + a Gaussian mixture, Leiden;
  Leiden on the union of the samples' and the means' fuzzy graphs, with the two-hop means'
  graph (capped calibration: the earlier default) and with the means' graph searched again among
  all means (umap-learn's calibration: the estimator's union now); a consensus (Leiden on the
  union graph, each edge weighted by the share of the base partitions that join its ends).
- ``estimator (default grouping)``: what ``fit`` does: the noise filter
  (:class:`~invariant_cluster.denoise.RadialWiener`, ``noise_std="auto"``), the stages on the
  filtered images, then ``graph="auto"`` decides on the two-hop means' graph, and groups the
  samples' graph or the union with the means' graph searched again;
- ``estimator without filter (noise_std=0)``: the same on the images as given (the default
  before the filter);
- ``pipeline (filtered)``, ``leiden (samples) (filtered)``: the two baselines on the filtered
  images, what a user gets from our filter and kNN graph without the iteration. The baselines
  without the suffix (and every other candidate) run on the images as given. Where no noise is
  measured (clean MNIST: the filter is the identity) the filtered rows are not repeated.

Columns: ACC (Hungarian), NMI, seconds, the noise measured, the purity of the samples' and the
means' kNN graphs (share of edges joining two digits of one class) and the mean correlation with
the clean rotated digit of the noisy sample, of the one-step aligned average of its neighbourhood
and of its invariant mean; the same on the filtered images (``_filtered``).

    python benchmarks/bench_noise.py                         # n = 2,000, 4 sigmas, 3 seeds
    python benchmarks/bench_noise.py --n 10000 --sigmas 0 0.5 0.8 --groupings final \\
        --run n10000

Each is a run of ``benchmarks/results/noise.json`` (``--run``; ``default`` without it).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, environment, print_table, scores, table, write_json  # noqa: E402
from bench_clustering import VARIANTS, make_variant  # noqa: E402

from invariant_cluster import InvariantAttentionClusterer  # noqa: E402

SEARCH = VARIANTS["rotated45"]["search"]
K = 15


def noisy(n, sigma, seed, data=None):
    """``(X_noisy, X_clean, y)``: rotated digits and the same plus Gaussian noise."""
    Xc, y = make_variant("rotated45", n, seed, data)
    noise = np.random.default_rng(seed + 1000).standard_normal(Xc.shape).astype(np.float32)
    return (Xc + np.float32(sigma) * noise).astype(np.float32), Xc, y


def corr(A, B) -> float:
    """Mean over samples of the Pearson correlation of two images."""
    A = A.reshape(len(A), -1).astype(np.float64)
    B = B.reshape(len(B), -1).astype(np.float64)
    A = A - A.mean(1, keepdims=True)
    B = B - B.mean(1, keepdims=True)
    den = np.sqrt((A * A).sum(1) * (B * B).sum(1))
    return float(np.mean((A * B).sum(1) / np.where(den > 0, den, 1.0)))


def purity(index, y) -> float:
    return float((y[index] == y[:, None]).mean())


def stages(X, seed, compare_candidates=None):
    """The estimator's stages run once: search, calibration, iteration, means' graph."""
    import torch

    from invariant_cluster._grouping import two_hop_candidates
    from invariant_cluster._iteration import (
        _aligned_keys,
        calibrate_bandwidth,
        iterate_attention,
    )
    from invariant_cluster.cluster import _search_means
    from invariant_cluster.search import (
        candidate_search,
        knn_search,
        make_search_grid,
        make_search_plan,
    )

    grid = make_search_grid("se2", refine=False, **SEARCH)
    n = len(X)
    Xt = torch.as_tensor(X).reshape(n, 1, *X.shape[1:])
    own = torch.arange(n)
    out = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        D, idx, P = knn_search(Xt, Xt, grid, K, exclude=own)
        out["t_search"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dist = D.clamp(min=0).sqrt()
        rho, sigma = calibrate_bandwidth(dist)
        M, W, history, _ = iterate_attention(Xt, idx, P, rho, sigma, "auto", max_iter=300,
                                             tol=1e-3)
        out["t_iterate"] = time.perf_counter() - t0
        out["n_iter"] = len(history)
        out["neff"] = float((1.0 / (W * W).sum(1)).mean())
        avg = _aligned_keys(Xt, own, idx, P).mean(1)
        t0 = time.perf_counter()
        Dm, idx_m, _ = candidate_search(M, M, two_hop_candidates(idx), grid, k=K, exclude=own)
        out["t_means_graph"] = time.perf_counter() - t0
        # the means' graph searched again among all means: the estimator's own search of the
        # union (no pass over the neighbours' neighbours, the shortlist of denoised keys)
        t0 = time.perf_counter()
        Df, idx_f = _search_means(M, grid, K,
                                  make_search_plan(n, n, grid.size, K, purpose="means"))
        out["t_means_search"] = time.perf_counter() - t0
        if compare_candidates:
            # the same search with the earlier shortlist length, for the comparison row
            t0 = time.perf_counter()
            Dc, idx_c = _search_means(M, grid, K, make_search_plan(
                n, n, grid.size, K, purpose="means", n_candidates=compare_candidates))
            out["t_means_search_compare"] = time.perf_counter() - t0
            out.update(idx_c=idx_c.numpy(),
                       dist_c=Dc.clamp(min=0).sqrt().numpy().astype(np.float64))
    out.update(idx=idx.numpy(), dist=dist.numpy().astype(np.float64), M=M.reshape(n, -1).numpy(),
               W=W.numpy().astype(np.float64),
               avg=avg.numpy(), idx_m=idx_m.numpy(),
               dist_m=Dm.clamp(min=0).sqrt().numpy().astype(np.float64), idx_f=idx_f.numpy(),
               dist_f=Df.clamp(min=0).sqrt().numpy().astype(np.float64))
    return out


def groupings(st, seed, which, consensus_too=True):
    """Every grouping on the shared stages: ``{name: (labels, seconds)}``."""
    from sklearn.cluster import KMeans
    from sklearn.mixture import GaussianMixture

    from invariant_cluster._grouping import (
        embed_fuzzy_graph,
        embed_graph,
        fuzzy_graph,
        leiden,
    )

    t_s = st["t_search"]
    t_m = st["t_search"] + st["t_iterate"] + st["t_means_graph"]
    res = {}

    def timed(fn):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn()
        return out, time.perf_counter() - t0

    emb_s, te_s = timed(lambda: embed_graph(st["idx"], st["dist"], seed))
    lab, t = timed(lambda: KMeans(10, n_init=10, random_state=seed).fit_predict(emb_s))
    res["pipeline"] = (lab, t_s + te_s + t)
    # the baseline as single-cell analysis runs it: umap-learn's fuzzy graph, then Leiden
    G_su, tg_su = timed(lambda: fuzzy_graph(st["idx"], st["dist"], seed, calibration="umap"))
    lab, t = timed(lambda: leiden(G_su, 10, seed))
    res["leiden (samples)"] = (lab, t_s + tg_su + t)
    # the candidates: the attention's capped calibration (the estimator's fuzzy graph)
    G_s, tg_s = timed(lambda: fuzzy_graph(st["idx"], st["dist"], seed))
    if which == "final":
        return res
    lab, t = timed(lambda: GaussianMixture(10, random_state=seed).fit(emb_s).predict(emb_s))
    res["UMAP + GMM (samples)"] = (lab, t_s + te_s + t)
    emb_m, te_m = timed(lambda: embed_graph(st["idx_m"], st["dist_m"], seed))
    lab, t = timed(lambda: KMeans(10, n_init=10, random_state=seed).fit_predict(emb_m))
    res["UMAP + k-means (means)"] = (lab, t_m + te_m + t)
    lab, t = timed(lambda: GaussianMixture(10, random_state=seed).fit(emb_m).predict(emb_m))
    res["UMAP + GMM (means)"] = (lab, t_m + te_m + t)
    G_m, tg_m = timed(lambda: fuzzy_graph(st["idx_m"], st["dist_m"], seed))
    lab, t = timed(lambda: leiden(G_m, 10, seed))
    res["leiden (means)"] = (lab, t_m + tg_m + t)
    G_u = G_s.maximum(G_m)
    lab, t = timed(lambda: leiden(G_u, 10, seed))
    res["leiden (samples + means)"] = (lab, t_m + tg_s + tg_m + t)
    G_f, tg_f = timed(lambda: fuzzy_graph(st["idx_f"], st["dist_f"], seed, calibration="umap"))
    lab, t = timed(lambda: leiden(G_s.maximum(G_f), 10, seed))
    res["leiden (samples + means searched again)"] = (
        lab, t_m + st["t_means_search"] + tg_s + tg_f + t)
    emb_u, te_u = timed(lambda: embed_fuzzy_graph(G_u, seed))
    lab, t = timed(lambda: KMeans(10, n_init=10, random_state=seed).fit_predict(emb_u))
    res["UMAP + k-means (samples + means)"] = (lab, t_m + tg_s + tg_m + te_u + t)
    base = [res[k][0] for k in ("pipeline", "leiden (samples)", "UMAP + k-means (means)",
                                "leiden (means)")]

    def consensus():
        g = G_u.tocoo()
        agree = np.mean([b[g.row] == b[g.col] for b in base], axis=0)
        from scipy.sparse import csr_matrix

        C = csr_matrix((g.data * agree, (g.row, g.col)), shape=G_u.shape)
        C.eliminate_zeros()
        return leiden(C, 10, seed)

    if consensus_too:
        lab, t = timed(consensus)
        # the base partitions' own seconds, the shared stages counted once
        res["consensus"] = (lab, t_m + tg_s + tg_m + t + sum(
            res[k][1] for k in ("pipeline", "leiden (samples)", "UMAP + k-means (means)",
                                "leiden (means)")) - 2 * t_s - 2 * t_m)
    return res


def filtered_stages(X, seed, st, compare_candidates=None):
    """The stages on the images as ``fit`` sees them at its default ``noise_std="auto"``
    (:class:`~invariant_cluster.denoise.RadialWiener` first; the filter's seconds count in the
    search's), and the measured noise. ``st`` (the stages on ``X``) is reused when the filter
    is the identity (no noise measured)."""
    from invariant_cluster import RadialWiener

    t0 = time.perf_counter()
    filt = RadialWiener().fit(X)
    if filt.is_identity:
        return st, filt.noise_std_
    Xf = filt.transform(X).reshape(X.shape)
    t_filter = time.perf_counter() - t0
    st_f = stages(Xf, seed, compare_candidates)
    st_f["t_search"] += t_filter
    return st_f, filt.noise_std_


def run(args):
    rows, datasets = [], []
    for sigma in args.sigmas:
        for seed in args.seeds:
            X, Xc, y = noisy(args.n, sigma, seed, args.data)
            st = stages(X, seed, args.compare_means_candidates)
            st_f, noise = filtered_stages(X, seed, st, args.compare_means_candidates)
            info = {"sigma": sigma, "seed": seed, "n": args.n, "noise_measured": noise,
                    "purity_samples": purity(st["idx"], y),
                    "purity_means": purity(st["idx_m"], y),
                    "purity_samples_filtered": purity(st_f["idx"], y),
                    "purity_means_filtered": purity(st_f["idx_m"], y),
                    "corr_noisy": corr(X, Xc), "corr_one_step": corr(st["avg"], Xc),
                    "corr_means": corr(st["M"], Xc),
                    "corr_one_step_filtered": corr(st_f["avg"], Xc),
                    "corr_means_filtered": corr(st_f["M"], Xc), "n_iter": st_f["n_iter"],
                    "effective_keys": st_f["neff"],
                    **{k: st_f[k] for k in ("t_search", "t_iterate", "t_means_graph",
                                            "t_means_search")}}
            datasets.append(info)
            print_table([info], list(info))
            # the baselines (and every candidate grouping with "all") on the images as given,
            # then the baselines on the filtered images: what a user gets from our filter and
            # kNN with umap-learn or Leiden, without the iteration
            named = list(groupings(st, seed, args.groupings, args.consensus).items())
            if st_f is not st:
                named += [(f"{name} (filtered)", out)
                          for name, out in groupings(st_f, seed, "final").items()]
            for name, (labels, seconds) in named:
                rows.append({"sigma": sigma, "seed": seed, "n": args.n, "method": name,
                             **scores(y, labels), "seconds": seconds})
                print_table(rows[-1:], ["sigma", "seed", "method", "acc", "nmi", "seconds"])
            if args.estimator:
                rows += run_estimator(X, y, sigma, seed, args, st_f)
                if st_f is not st:
                    rows += run_estimator(X, y, sigma, seed, args, st, fits=False,
                                          name="estimator without filter (noise_std=0)")
    summary = summarise(rows, datasets)
    print_table(summary, list(summary[0]))
    return {"benchmark": "noise", "env": environment(), "args": vars(args),
            "load_note": args.note, "datasets": datasets, "rows": rows, "summary": summary}


def default_graphs(st):
    """What ``fit`` groups on the shared stages: ``(graph_used, idx_m, dist_m)``. "auto"
    decides on the two-hop means' graph; the union's means' graph is the one searched again
    among all means."""
    from invariant_cluster._grouping import resolve_graph

    used = resolve_graph("auto", st["idx"], st["idx_m"])
    if used == "both":
        return used, st["idx_f"], st["dist_f"]
    return used, st["idx_m"], st["dist_m"]


def run_estimator(X, y, sigma, seed, args, st, fits=True,
                  name="estimator (default grouping)"):
    """The estimator's default grouping on the shared stages (what ``fit`` runs after them:
    Leiden, ``graph="auto"``); with ``fits``, on every seed of the clean row, whole fits with
    ``n_clusters=10`` (with predict's agreement with its labels_) and ``n_clusters=None``."""
    from invariant_cluster._grouping import group, shared_edges

    t_m = st["t_search"] + st["t_iterate"] + st["t_means_graph"]
    t0 = time.perf_counter()
    used, idx_m, dist_m = default_graphs(st)
    t_m += st["t_means_search"] if used == "both" else 0.0
    labels, used, _ = group(st["idx"], st["dist"], idx_m, dist_m, 10, used, "leiden", seed)
    out = [{"sigma": sigma, "seed": seed, "n": args.n, "method": name,
            **scores(y, labels), "seconds": t_m + time.perf_counter() - t0,
            "graph_used": used, "shared_edges": shared_edges(st["idx"], st["idx_m"])}]
    print_table(out[-1:], ["sigma", "seed", "method", "acc", "nmi", "seconds", "graph_used"])
    if "idx_c" in st and used == "both" and fits:
        t0 = time.perf_counter()
        labels, _, _ = group(st["idx"], st["dist"], st["idx_c"], st["dist_c"], 10, used,
                                "leiden", seed)
        c = args.compare_means_candidates
        out.append({"sigma": sigma, "seed": seed, "n": args.n,
                    "method": f"estimator (default grouping, means' shortlist {c})",
                    **scores(y, labels), "seconds": t_m - st["t_means_search"]
                    + st["t_means_search_compare"] + time.perf_counter() - t0,
                    "graph_used": used})
        print_table(out[-1:], ["sigma", "seed", "method", "acc", "nmi", "seconds"])
    if sigma == 0 and args.fits and fits:
        for n_clusters in (10, None):
            est = InvariantAttentionClusterer(n_clusters=n_clusters, random_state=seed, **SEARCH)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(X)
            row = {"sigma": sigma, "seed": seed, "n": args.n,
                   "method": f"estimator fit (n_clusters={n_clusters})",
                   **scores(y, est.labels_), "seconds": time.perf_counter() - t0,
                   "n_clusters_found": int(est.n_clusters_), "graph_used": est.graph_}
            if n_clusters:
                row["predict_agreement"] = float(np.mean(est.predict(X) == est.labels_))
            out.append(row)
            print_table(out[-1:], ["sigma", "seed", "method", "acc", "seconds",
                                   "n_clusters_found", "predict_agreement"])
    return out


def summarise(rows, datasets):
    """Means over seeds per (sigma, method), with the dataset columns alongside."""
    out = []
    for sigma in sorted({r["sigma"] for r in rows}):
        ds = [d for d in datasets if d["sigma"] == sigma]
        extra = {k: float(np.mean([d[k] for d in ds])) for k in
                 ("noise_measured", "purity_samples", "purity_means", "purity_samples_filtered",
                  "purity_means_filtered", "corr_noisy", "corr_one_step", "corr_means",
                  "corr_one_step_filtered", "corr_means_filtered") if k in ds[0]}
        for method in dict.fromkeys(r["method"] for r in rows):
            rs = [r for r in rows if r["sigma"] == sigma and r["method"] == method]
            if not rs:
                continue
            out.append({"sigma": sigma, "method": method, "seeds": len(rs),
                        "acc": float(np.mean([r["acc"] for r in rs])),
                        "acc_min": float(np.min([r["acc"] for r in rs])),
                        "nmi": float(np.mean([r["nmi"] for r in rs])),
                        "seconds": float(np.mean([r["seconds"] for r in rs])), **extra})
    return out


GRAPHS = [("noise_measured", "noise measured"), ("purity_samples", "purity, samples' graph"),
          ("purity_means", "purity, means' graph"), ("corr_noisy", "corr(noisy, clean)"),
          ("corr_one_step", "corr(one-step average, clean)"),
          ("corr_means", "corr(invariant mean, clean)"),
          ("purity_samples_filtered", "filtered: purity, samples' graph"),
          ("purity_means_filtered", "filtered: purity, means' graph"),
          ("corr_one_step_filtered", "filtered: corr(one-step average, clean)"),
          ("corr_means_filtered", "filtered: corr(invariant mean, clean)")]


def table_rows(result):
    """Two tables: ACC per grouping and noise level (means over the seeds, and the mean
    seconds), then the graphs' purity and the means' correlation per noise level."""
    summary = result.get("summary", [])
    seeds = max((r.get("seeds", 0) for r in summary), default=0)
    n = next((r["n"] for r in result.get("rows", []) if "n" in r), None)
    data = f"grouping (ACC, mean of {seeds} seeds" + (f", n = {n:,})" if n else ")")
    rows = table(result, summary, lambda r: data, lambda r: r["method"],
                 {f"sigma {s:.1f}": (lambda r, s=s: r["acc"] if r["sigma"] == s else None)
                  for s in dict.fromkeys(r["sigma"] for r in summary)})
    methods = {r["method"]: [x["seconds"] for x in summary if x["method"] == r["method"]]
               for r in summary}
    rows += table(result, [{"method": m} for m in methods], lambda r: data,
                  lambda r: r["method"], {"seconds (mean)": lambda r: float(
                      np.mean(methods[r["method"]]))})
    first = [next(r for r in summary if r["sigma"] == s)
             for s in dict.fromkeys(r["sigma"] for r in summary)]
    return rows + table(result, first, lambda r: "graphs and means per noise level",
                        lambda r: f"sigma {r['sigma']:.1f}", dict((b, a) for a, b in GRAPHS))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.3, 0.5, 0.8])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--groupings", choices=["all", "final"], default="all")
    p.add_argument("--no-consensus", dest="consensus", action="store_false")
    p.add_argument("--no-estimator", dest="estimator", action="store_false")
    p.add_argument("--no-fits", dest="fits", action="store_false",
                   help="skip the whole fits (n_clusters=None, predict) on the clean row")
    p.add_argument("--compare-means-candidates", type=int, default=None, metavar="C",
                   help="also group the union with the means' graph searched with a shortlist "
                        "of C (a row of its own, where the union is chosen)")
    p.add_argument("--data", default=None)
    p.add_argument("--note", default="", help="what else ran on the machine (load)")
    p.add_argument("--out", default=None, help="the JSON (default: results/noise.json)")
    p.add_argument("--run", default=None,
                   help="the run's key in the JSON (default: 'default'; the other committed runs: "
                        "n10000, filter_2000, filter_10000, count_runs, estimate)")
    args = p.parse_args(argv)
    result = run(args)
    write_json(result, Path(args.out or RESULTS / "noise.json"), table_rows,
               run=args.run or "default")
    return result


if __name__ == "__main__":
    main()
