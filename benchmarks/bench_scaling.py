"""Scaling with n: the shortlisted neighbour search against the exact all-pairs search.

MNIST test digits rotated uniformly within +-45 degrees (optionally also shifted within +-2 px),
searched over +-60 degrees (17 angles). For every n:

- the neighbour search of ONE attention iteration (k = 32 nearest keys of every sample):
  descriptor shortlist (``shortlist_descriptors`` + ``shortlist``) then the exact search of the
  candidates (``candidate_search``), and the exact all-pairs ``grid_search(k=32)`` where it
  finishes (``--exact-max``); the recall of the exact top-k by the shortlisted search;
- ``InvariantAttentionClusterer(n_clusters=10)``: fit time and ACC / NMI, with the exact
  search up to ``--estimator-max`` samples and, when the estimator has a ``neighbor_search``
  parameter (checked with ``inspect.signature``), with ``neighbor_search="shortlist"`` up to
  ``--shortlist-estimator-max``;
- scikit-learn's ``MeanShift`` (estimated bandwidth, bin seeding; up to ``--meanshift-max``) and
  ``SpectralClustering`` (10 clusters, 32-NN affinity on the pixels; up to ``--spectral-max``);

with wall time, the peak resident memory above the start of the measurement (psutil RSS sampled
every 10 ms in a thread: torch's allocations are invisible to tracemalloc) and the log-log
slope of time against n for each method. ``--recall`` instead measures the recall of the exact
top-k against the shortlist length (the data behind ``neighbors.default_n_candidates``).

    python benchmarks/bench_scaling.py                  # n = 500 ... 10000 (long on a laptop)
    python benchmarks/bench_scaling.py --quick          # n = 200, 400: seconds
    python benchmarks/bench_scaling.py --n 500 1000 2000 --run medium
    python benchmarks/bench_scaling.py --recall         # n = 2000, 17 and 24 angles, +-2 px

``--fashion`` runs the large-scale check on Fashion-MNIST train + test (70,000 images;
``apt-get install dataset-fashion-mnist`` puts them in ``/usr/share/datasets/fashion-mnist``,
where the loader finds them, or ``fetch_fashion_mnist(download=True)``):
``InvariantAttentionClusterer(n_clusters=10, max_rotation=15, n_rotations=7, max_translation=1)``
at ``--fashion-n`` sizes (default 10,000 and 70,000) with the time of each stage of ``fit``, the
peak RSS and ACC / NMI, the log-log slope of the fit time and of each stage, the recall of the
exact top-15 on 500 random queries checked exactly, k-means and umap-learn -> k-means on the
pixels in the same run, ``InvariantKNeighborsTransformer(n_neighbors=15)`` at the largest size,
and the load average of the machine (a shared machine makes the timings slower)::

    python benchmarks/bench_scaling.py --fashion --threads 2     # about 20 minutes

``--dask N`` (with ``--fashion``) also runs the fit's kNN search at the largest size on a
``dask.distributed.LocalCluster`` of ``N`` single-threaded worker processes and checks that its
graph (indices, distances, alignments) is identical to the local search's; ``--dask-only``
skips everything else::

    python benchmarks/bench_scaling.py --fashion --dask 2 --dask-only --threads 2 \
        --run fashion70k_dask

Writes ``benchmarks/results/scaling.json``, a run per suite (``default``, ``quick``, ``recall``,
``fashion70k``, or the one ``--run`` names), and a log-log PNG next to it.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS,
    environment,
    load_mnist_test,
    print_table,
    scores,
    table,
    write_json,
)

from invariant_cluster import InvariantAttentionClusterer  # noqa: E402
from invariant_cluster.alignment import grid_search, make_search_grid  # noqa: E402
from invariant_cluster.datasets import make_transformed  # noqa: E402
from invariant_cluster.neighbors import (  # noqa: E402
    candidate_search,
    default_n_candidates,
    shortlist,
    shortlist_descriptors,
)

K = 32


# ----------------------------------------------------------------------------- measurement
def _release_memory():
    """Return freed heap pages to the OS, so that the next peak starts from a clean baseline."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the baseline includes retained memory
        pass


class PeakRSS:
    """Peak resident memory (MB) above the value at entry, sampled in a background thread."""

    def __init__(self, interval=0.01):
        import psutil

        self._proc = psutil.Process()
        self.interval = interval
        self.peak_mb = 0.0

    def _run(self):
        while not self._stop.is_set():
            self._peak = max(self._peak, self._proc.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self):
        _release_memory()
        self._base = self._proc.memory_info().rss
        self._peak = self._base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._proc.memory_info().rss)
        self.peak_mb = (self._peak - self._base) / 2 ** 20
        return False


def timed(fn, *args, **kwargs):
    """``(result, seconds, peak_mb)`` of one call."""
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds = time.perf_counter() - t0
    return out, seconds, mem.peak_mb


def make_data(images, labels, n, max_translation, seed):
    rng = np.random.default_rng(seed)
    sel = rng.choice(len(images), n, replace=False)
    X, _ = make_transformed(images[sel], max_rotation=45.0, max_translation=max_translation,
                            random_state=seed)
    return X.astype(np.float32), labels[sel]


def recall(true_idx: torch.Tensor, found_idx: torch.Tensor) -> float:
    """Share of the exact top-k found (by key index; order and ties aside)."""
    return float((found_idx[:, :, None] == true_idx[:, None, :]).any(1).double().mean())


def pipeline(X, grid, k, n_candidates, descriptor="steerable"):
    """One iteration's search: shortlist then exact search; returns results and stage times."""
    t0 = time.perf_counter()
    Xd, Yd = shortlist_descriptors(X, X, grid, descriptor=descriptor)
    cand = shortlist(Xd, Yd, n_candidates)
    t1 = time.perf_counter()
    D, idx, P = candidate_search(X, X, cand, grid, k=k)
    t2 = time.perf_counter()
    return (D, idx, P, cand), t1 - t0, t2 - t1


def slope(ns, ts):
    """Least-squares slope of log(time) against log(n) (None with fewer than two points)."""
    pts = [(n, t) for n, t in zip(ns, ts) if t is not None and t > 0]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


# ----------------------------------------------------------------------------- baselines
def run_meanshift(X, seed):
    from sklearn.cluster import MeanShift, estimate_bandwidth

    Xf = X.reshape(len(X), -1)
    bw = estimate_bandwidth(Xf, quantile=0.2, n_samples=min(len(Xf), 500), random_state=seed)
    return MeanShift(bandwidth=bw, bin_seeding=True).fit_predict(Xf)


def run_spectral(X, seed):
    from sklearn.cluster import SpectralClustering

    return SpectralClustering(10, affinity="nearest_neighbors", n_neighbors=K,
                              assign_labels="cluster_qr", random_state=seed
                              ).fit_predict(X.reshape(len(X), -1))


def estimator_supports_shortlist() -> bool:
    return "neighbor_search" in inspect.signature(InvariantAttentionClusterer).parameters


def run_estimator(X, max_translation, args, shortlisted):
    """``shortlisted``: True/False select neighbor_search="shortlist"/"exact"; None: the
    estimator has no such parameter (it searches exactly)."""
    params = dict(n_clusters=10, max_rotation=args.max_rotation, n_rotations=args.n_rotations,
                  max_translation=max_translation, max_iter=args.max_iter, random_state=0)
    if shortlisted is not None:
        params["neighbor_search"] = "shortlist" if shortlisted else "exact"
    est = InvariantAttentionClusterer(**params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X)
    return est


# ----------------------------------------------------------------------------- scaling
def run_scaling(args):
    images, labels = load_mnist_test(args.data)
    grid = make_search_grid("se2", args.max_rotation, args.n_rotations, args.max_translation,
                            refine=False)
    shortlisted = estimator_supports_shortlist()
    rows = []
    X, _ = make_data(images, labels, 2 * K, args.max_translation, args.seed)
    with torch.no_grad():  # warm-up: first calls pay for lazy initialisation
        pipeline(torch.as_tensor(X)[:, None], grid, K, K + 1)
    for n in args.n:
        X, y = make_data(images, labels, n, args.max_translation, args.seed)
        Xt = torch.as_tensor(X).reshape(n, 1, *X.shape[-2:])
        c = args.n_candidates or default_n_candidates(K, n)
        with torch.no_grad():
            with PeakRSS() as mem:
                (D, idx, _, _), t_short, t_cand = pipeline(Xt, grid, K, c)
        row = {"n": n, "method": "shortlist + candidate search", "n_candidates": c,
               "seconds": t_short + t_cand, "shortlist_s": t_short, "candidates_s": t_cand,
               "peak_mb": mem.peak_mb}
        if n <= args.exact_max:
            with torch.no_grad():
                (De, Ie, _), t, mb = timed(grid_search, Xt, Xt, grid, k=K)
            row["recall"] = recall(Ie, idx)
            rows.append(row)
            rows.append({"n": n, "method": "exact grid search", "seconds": t, "peak_mb": mb})
        else:
            rows.append(row)
        if shortlisted and n <= args.shortlist_estimator_max:
            est, t, mb = timed(run_estimator, X, args.max_translation, args, True)
            rows.append({"n": n, "method": "invariant attention (shortlist)", "seconds": t,
                         "peak_mb": mb, **scores(y, est.labels_), "n_iter": est.n_iter_})
        if n <= args.estimator_max:
            est, t, mb = timed(run_estimator, X, args.max_translation, args,
                               False if shortlisted else None)
            rows.append({"n": n, "method": "invariant attention (exact)", "seconds": t,
                         "peak_mb": mb, **scores(y, est.labels_), "n_iter": est.n_iter_})
        if n <= args.meanshift_max:
            lab, t, mb = timed(run_meanshift, X, args.seed)
            rows.append({"n": n, "method": "MeanShift (pixels)", "seconds": t, "peak_mb": mb,
                         **scores(y, lab)})
        if n <= args.spectral_max:
            lab, t, mb = timed(run_spectral, X, args.seed)
            rows.append({"n": n, "method": "SpectralClustering (pixels)", "seconds": t,
                         "peak_mb": mb, **scores(y, lab)})
        print_table([r for r in rows if r["n"] == n],
                    ["n", "method", "seconds", "peak_mb", "recall", "acc", "nmi"])
        print(flush=True)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    exponents = {}
    for m in methods:
        pts = [(r["n"], r["seconds"]) for r in rows if r["method"] == m]
        exponents[m] = {"exponent": slope(*zip(*pts)) if pts else None,
                        "n": [p[0] for p in pts]}
    for stage, key in (("  stage 1: descriptors + shortlist", "shortlist_s"),
                       ("  stage 2: candidate search", "candidates_s")):
        pts = [(r["n"], r[key]) for r in rows if key in r]
        exponents[stage.strip()] = {"exponent": slope(*zip(*pts)) if pts else None,
                                    "n": [p[0] for p in pts]}
    print_table([{"method": m, "exponent": e["exponent"], "n": str(e["n"])}
                 for m, e in exponents.items()], ["method", "exponent", "n"])
    return rows, exponents, shortlisted


def plot(rows, path, title="Time against n"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for m in dict.fromkeys(r["method"] for r in rows):
        pts = sorted((r["n"], r["seconds"]) for r in rows if r["method"] == m)
        ax.loglog(*zip(*pts), marker="o", label=m)
    for key, label in (("shortlist_s", "  stage 1: descriptors + shortlist"),
                       ("candidates_s", "  stage 2: candidate search")):
        pts = sorted((r["n"], r[key]) for r in rows if key in r)
        if pts:
            ax.loglog(*zip(*pts), ls="--", marker=".", color="tab:blue", alpha=0.5, label=label)
    ax.set_xlabel("n (images)")
    ax.set_ylabel("seconds")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


# ----------------------------------------------------------------------------- Fashion-MNIST
FASHION = dict(n_clusters=10, max_rotation=15.0, n_rotations=7, max_translation=1)
# published accuracies on Fashion-MNIST, for the table (not run here)
PUBLISHED = {"DTI clustering (published)": 0.612, "N2D (published, about)": 0.67}


def _staged_fit(est, X):
    """Fit with the wall time of each stage, read off the estimator's stage log lines."""
    marks = [("start", time.perf_counter())]
    est._log = lambda msg: marks.append((msg, time.perf_counter()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X)
    del est._log
    # each log line closes a stage; the noise filter's line comes only when it filters
    rest = iter(["search", "iteration", "grouping", "centres"])
    out = {"filter_s": 0.0}
    for (msg, t1), (_, t0) in zip(marks[1:], marks[:-1]):
        name = "filter" if msg.startswith("noise") else next(rest, None)
        if name:
            out[f"{name}_s"] = t1 - t0
    return out


def _fashion_recall(X, neighbors, grid, n_queries, seed):
    """Share of the exact top-k (exact grid search over every key) among the fit's graph."""
    rng = np.random.default_rng(seed)
    q = np.sort(rng.choice(len(X), n_queries, replace=False))
    Xt = torch.as_tensor(X).reshape(len(X), 1, 28, 28)
    k = neighbors.shape[1]
    with torch.no_grad():
        _, Ie, _ = grid_search(Xt[q], Xt, grid, k=k, exclude=torch.as_tensor(q))
    found = torch.as_tensor(neighbors[q])
    return recall(Ie, found), len(q)


def run_dask_identity(X, grid, n_workers):
    """The fit's kNN search of ``X`` on ``grid`` here and on a LocalCluster: times and
    identity."""
    from dask.distributed import Client, LocalCluster

    from invariant_cluster.search import knn_search

    n, k = len(X), 15
    Xt = torch.as_tensor(X).reshape(n, 1, 28, 28)
    own = torch.arange(n)
    with torch.no_grad():
        t0 = time.perf_counter()
        local = knn_search(Xt, Xt, grid, k, exclude=own)
        t_local = time.perf_counter() - t0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            client = Client(cluster)
        try:
            client.run(torch.set_num_threads, 1)
            t0 = time.perf_counter()
            remote = knn_search(Xt, Xt, grid, k, exclude=own, client=client)
            t_dask = time.perf_counter() - t0
        finally:
            client.close()
            cluster.close()
    same = [bool(torch.equal(a, b)) for a, b in zip(local, remote)]
    row = {"n": n, "method": f"kNN search on a dask LocalCluster ({n_workers} workers x 1 thread)",
           "seconds": t_dask, "local_seconds": t_local, "identical_index": same[1],
           "identical_dist": same[0], "identical_params": same[2]}
    print_table([row], list(row))
    return row


FASHION_IMAGES = 70000


def _stack_shifted(X, y, n):
    """``X`` (``(m, side * side)``, square images) extended to ``n`` images by copies shifted by
    whole pixels (1 px right, then down, left, up, ...; zero fill), a stand-in
    for 140,000 images. It is NOT a larger set of the same kind for the clusterer: each copy is
    within the search's +-1 px of its original, at distance 0, so every ``rho_i`` is 0 and the
    calibration leaves a graph of disconnected pairs that Leiden cannot group into 10 (see
    docs/user_guide/scaling.rst). It times the stages; its labels mean nothing."""
    m = len(X)
    if n <= m:
        return X, y
    side = int(round(np.sqrt(X.shape[1])))
    imgs = X.reshape(m, side, side)
    offsets = [(0, 1), (1, 0), (0, -1), (-1, 0), (1, 1), (-1, -1), (1, -1), (-1, 1)]
    parts, labels = [X], [y]
    for c in range(-(-n // m) - 1):
        dy, dx = offsets[c % len(offsets)]
        S = np.zeros_like(imgs)
        S[:, max(dy, 0):side + min(dy, 0), max(dx, 0):side + min(dx, 0)] = \
            imgs[:, max(-dy, 0):side + min(-dy, 0), max(-dx, 0):side + min(-dx, 0)]
        parts.append(S.reshape(m, -1))
        labels.append(y)
    return np.concatenate(parts)[:n], np.concatenate(labels)[:n]


def run_fashion(args):
    import os

    from sklearn.cluster import KMeans

    from invariant_cluster import InvariantKNeighborsTransformer
    from invariant_cluster.datasets import load_fashion_mnist

    X_all, y_all = load_fashion_mnist(split="all", return_X_y=True)
    X_all, y_all = _stack_shifted(X_all, y_all, max(args.fashion_n))
    rows = []
    grid = make_search_grid("se2", FASHION["max_rotation"], FASHION["n_rotations"],
                            FASHION["max_translation"], refine=False)
    if args.dask_only:
        rows.append(run_dask_identity(X_all[:max(args.fashion_n)], grid, args.dask))
        return rows, {}, {"dask_identical": all(rows[-1][f"identical_{w}"]
                                                for w in ("index", "dist", "params"))}
    # first use: numba compiles umap-learn's and pynndescent's functions (partly cached on
    # disk by invariant_cluster._third_party); paid here once, so that it does not bend the slope
    from invariant_cluster.search.approximate import approximate_shortlist

    t0 = time.perf_counter()
    _staged_fit(InvariantAttentionClusterer(**FASHION, random_state=0), X_all[:1000])
    desc = torch.randn(2000, 3, 64, generator=torch.Generator().manual_seed(0))
    approximate_shortlist(desc, desc, 32, exclude=torch.arange(2000))
    rows.append({"n": 1000, "method": "warm-up (first use: numba compilation)",
                 "seconds": time.perf_counter() - t0})
    for n in args.fashion_n:
        X, y = X_all[:n], y_all[:n]
        load = os.getloadavg()
        est = InvariantAttentionClusterer(**FASHION, random_state=0)
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            stages = _staged_fit(est, X)
            seconds = time.perf_counter() - t0
        row = {"n": n, "method": "InvariantAttentionClusterer", "seconds": seconds,
               "peak_mb": mem.peak_mb, **stages, **scores(y, est.labels_),
               "noise_std": est.noise_std_, "graph_used": est.graph_, "loadavg_before": load,
               "loadavg_after": os.getloadavg()}
        if n in args.fashion_recall_n:
            t0 = time.perf_counter()
            row["recall"], row["recall_queries"] = _fashion_recall(
                X, est.neighbors_[:, 1:], grid, args.recall_queries, args.seed)
            row["recall_check_s"] = time.perf_counter() - t0
        rows.append(row)
        print_table(rows[-1:], ["n", "method", "seconds", "filter_s", "search_s", "iteration_s",
                                "grouping_s", "centres_s", "peak_mb", "recall", "acc", "nmi"])
        print(flush=True)
    # the baselines, the transformer and the Dask check run at the largest real size
    n = min(max(args.fashion_n), FASHION_IMAGES)
    X, y = X_all[:n], y_all[:n]
    if not args.skip_baselines:
        lab, t, mb = timed(lambda: KMeans(10, n_init=10, random_state=0).fit_predict(X))
        rows.append({"n": n, "method": "k-means (pixels)", "seconds": t, "peak_mb": mb,
                     **scores(y, lab), "loadavg_after": os.getloadavg()})

        def umap_kmeans():
            with warnings.catch_warnings():  # umap-learn's import-time noise
                warnings.simplefilter("ignore")
                import numba
                import umap
            before = torch.get_num_threads()
            numba.get_num_threads()  # numba's pool started: torch keeps its thread count
            torch.set_num_threads(before)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                emb = umap.UMAP(n_components=10, n_neighbors=15, min_dist=0.0,
                                random_state=0).fit_transform(X)
            return KMeans(10, n_init=10, random_state=0).fit_predict(emb)

        lab, t, mb = timed(umap_kmeans)
        rows.append({"n": n, "method": "umap-learn -> k-means (pixels)", "seconds": t,
                     "peak_mb": mb, **scores(y, lab), "loadavg_after": os.getloadavg()})
    if not args.skip_transformer:
        tr = InvariantKNeighborsTransformer(n_neighbors=15, max_rotation=15, n_rotations=7,
                                            max_translation=1)
        _, t, mb = timed(lambda: tr.fit_transform(X))
        rows.append({"n": n, "method": "InvariantKNeighborsTransformer(n_neighbors=15)",
                     "seconds": t, "peak_mb": mb, "loadavg_after": os.getloadavg()})
    if args.dask:
        rows.append(run_dask_identity(X, grid, args.dask))
    for name, acc in PUBLISHED.items():
        rows.append({"n": FASHION_IMAGES, "method": name, "acc": acc})
    print_table(rows, ["n", "method", "seconds", "peak_mb", "recall", "acc", "nmi"])
    fits = [r for r in rows if r["method"] == "InvariantAttentionClusterer"]
    exponents = {}
    for key in ("seconds", "search_s", "iteration_s", "grouping_s", "centres_s"):
        pts = [(r["n"], r.get(key)) for r in fits]
        exponents[key] = slope(*zip(*pts)) if len(pts) > 1 else None
    # between consecutive sizes too (with a stacked size beyond 70,000: 70,000 -> 140,000)
    exponents["pairs"] = {
        f"{a['n']}->{b['n']}": {key: slope([a["n"], b["n"]], [a[key], b[key]])
                                for key in ("seconds", "search_s", "iteration_s", "grouping_s",
                                            "centres_s")}
        for a, b in zip(fits, fits[1:])} if len(fits) > 2 else None
    print("log-log slopes of the fit and its stages:", exponents)
    targets = {"fit_under_5_min": None, "fit_peak_under_4_gb": None, "slope_at_most_1.15": None,
               "transformer_under_3_min": None, "recall_at_least_0.95": None}
    big = next((r for r in fits if r["n"] == FASHION_IMAGES), None)
    if big is not None:
        targets["fit_under_5_min"] = big["seconds"] < 300
        targets["fit_peak_under_4_gb"] = big["peak_mb"] < 4096
        if "recall" in big:
            targets["recall_at_least_0.95"] = big["recall"] >= 0.95
    if exponents["seconds"] is not None:
        targets["slope_at_most_1.15"] = exponents["seconds"] <= 1.15
    tr_row = next((r for r in rows if r["method"].startswith("InvariantKNeighbors")), None)
    if tr_row is not None:
        targets["transformer_under_3_min"] = tr_row["seconds"] < 180
    print("targets:", targets)
    return rows, exponents, targets


# ----------------------------------------------------------------------------- recall
def run_recall(args):
    """Recall of the exact top-k against the shortlist length, descriptor and grid."""
    images, labels = load_mnist_test(args.data)
    rows = []
    n = args.n[0]
    multiples = (1, 2, 3, 4, 6, 8)
    for max_translation in args.recall_translations:
        X, _ = make_data(images, labels, n, max_translation, args.seed)
        Xt = torch.as_tensor(X).reshape(n, 1, *X.shape[-2:])
        for n_rot in args.recall_rotations:
            grid = make_search_grid("se2", args.max_rotation, n_rot, max_translation,
                                    refine=False)
            with torch.no_grad():
                (_, Ie, _), t_exact, _ = timed(grid_search, Xt, Xt, grid, k=K)
                for desc in ("steerable", "modulus"):
                    t0 = time.perf_counter()
                    Xd, Yd = shortlist_descriptors(Xt, Xt, grid, descriptor=desc)
                    cand = shortlist(Xd, Yd, min(n, max(multiples) * K))
                    t_short = time.perf_counter() - t0
                    row = {"n": n, "max_translation": max_translation, "n_rotations": n_rot,
                           "descriptor": desc, "exact_s": t_exact, "shortlist_s": t_short}
                    for mlt in multiples:
                        row[f"recall@{mlt}k"] = recall(Ie, cand[:, :mlt * K])
                    c = default_n_candidates(K, n)
                    _, idx, _ = candidate_search(Xt, Xt, cand[:, :c], grid, k=K)
                    row["recall_default"] = recall(Ie, idx)
                    rows.append(row)
                    print_table(rows[-1:], list(row))
                    print(flush=True)
    ok = {}
    for mlt in multiples:
        vals = [r[f"recall@{mlt}k"] for r in rows if r["descriptor"] == "steerable"]
        ok[mlt] = min(vals) if vals else None
    choice = next((m for m in multiples if ok[m] is not None and ok[m] >= 0.95), None)
    print(f"smallest multiple of k with recall >= 0.95 in every setting (steerable): {choice}")
    return rows, {"min_recall_by_multiple": ok, "smallest_multiple_for_0.95": choice,
                  "default_n_candidates": default_n_candidates(K, n)}


SECONDS = "seconds against n; exponent: the slope of log seconds against log n"


def table_rows(result):
    """Two tables: the seconds of each method against n (with the exponent of the log-log
    fit), and the scores of the methods that cluster."""
    recs = [r for r in result.get("rows", []) if "method" in r]
    exps = result.get("exponents", {})
    data = ("Fashion-MNIST train + test" if result.get("args", {}).get("fashion")
            else "MNIST test digits rotated within ±45°")
    rows = []
    for n in sorted({r["n"] for r in recs}):
        rows += table(result, [r for r in recs if r["n"] == n], lambda r: SECONDS,
                      lambda r: r["method"], {f"n = {n}": "seconds"})
    rows += table(result, list({r["method"]: r for r in recs}.values()), lambda r: SECONDS,
                  lambda r: r["method"],
                  {"exponent": lambda r: exps.get(r["method"], {}).get("exponent")})
    return rows + table(result, [r for r in recs if "acc" in r], lambda r: data,
                        lambda r: f"{r['method']}, n={r['n']}",
                        {"ACC": "acc", "ARI": "ari", "NMI": "nmi", "peak RSS (GB)": lambda r:
                         r["peak_mb"] / 1024 if r.get("peak_mb") is not None else None})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder with the MNIST test split")
    p.add_argument("--n", type=int, nargs="+", default=[500, 1000, 2000, 5000, 10000])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-rotation", type=float, default=60.0)
    p.add_argument("--n-rotations", type=int, default=17)
    p.add_argument("--max-translation", type=int, default=0)
    p.add_argument("--n-candidates", type=int, default=None)
    p.add_argument("--exact-max", type=int, default=10000,
                   help="largest n for the exact all-pairs search")
    p.add_argument("--estimator-max", type=int, default=2000,
                   help="largest n for the estimator with the exact search")
    p.add_argument("--shortlist-estimator-max", type=int, default=10000,
                   help="largest n for the estimator with neighbor_search='shortlist' (when "
                        "the estimator has that parameter)")
    p.add_argument("--meanshift-max", type=int, default=2000)
    p.add_argument("--spectral-max", type=int, default=5000)
    p.add_argument("--recall", action="store_true")
    p.add_argument("--recall-rotations", type=int, nargs="+", default=[17, 24])
    p.add_argument("--recall-translations", type=int, nargs="+", default=[0, 2])
    p.add_argument("--max-iter", type=int, default=50,
                   help="the estimator's max_iter (bench_clustering uses 15)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's); 1 is steadier on a busy "
                        "machine")
    p.add_argument("--fashion", action="store_true",
                   help="Fashion-MNIST train + test at --fashion-n sizes")
    p.add_argument("--fashion-n", type=int, nargs="+", default=[10000, 70000])
    p.add_argument("--fashion-recall-n", type=int, nargs="+", default=[10000, 70000],
                   help="sizes at which the recall is checked exactly on --recall-queries")
    p.add_argument("--recall-queries", type=int, default=500)
    p.add_argument("--skip-baselines", action="store_true")
    p.add_argument("--skip-transformer", action="store_true")
    p.add_argument("--dask", type=int, default=0,
                   help="with --fashion: workers of a LocalCluster that reruns the search")
    p.add_argument("--dask-only", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None, help="the JSON (default: results/scaling.json)")
    p.add_argument("--run", default=None,
                   help="the run's key in the JSON (default: fashion70k with --fashion, recall "
                        "with --recall, quick or recall_quick with --quick, else default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.n = [400] if args.recall else [200, 400]
        args.recall_rotations = [9]
        args.n_rotations = 9
    elif args.recall and argv is None and "--n" not in sys.argv:
        args.n = [2000]
    result = {"benchmark": "scaling", "env": environment(), "args": vars(args), "k": K,
              "note": "wall times on the machine in env; a shared machine makes them noisy"}
    if args.fashion:
        import os

        result["note"] += ("; loadavg_* are os.getloadavg() (1, 5, 15 min) on a machine shared "
                           "with other jobs: the timings are under that load")
        result["rows"], result["exponents"], result["targets"] = run_fashion(args)
        result["loadavg_end"] = os.getloadavg()
        run = "fashion70k"
    elif args.recall:
        result["rows"], result["summary"] = run_recall(args)
        run = "recall_quick" if args.quick else "recall"
    else:
        rows, exponents, shortlisted = run_scaling(args)
        result.update(rows=rows, exponents=exponents, estimator_shortlist=shortlisted)
        run = args.run or ("quick" if args.quick else "default")
        out = Path(args.out or RESULTS / "scaling.json")
        png = out.with_name(out.stem + ("" if run == "default" else f"_{run}") + ".png")
        what = "rotated +-45 degrees" + (f", shifted +-{args.max_translation} px"
                                         if args.max_translation else "")
        plot(rows, png,
             f"One search (k={K}) / one fit against n: MNIST {what}")
    write_json(result, Path(args.out or RESULTS / "scaling.json"), table_rows,
               run=args.run or run)
    return result


if __name__ == "__main__":
    main()
