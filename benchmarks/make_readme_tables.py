"""Tables from the JSON files in ``benchmarks/results/``: the README's headline figures and the
documentation's benchmark tables.

Each JSON file ``results/<name>.json`` becomes one section. Known benchmarks (``clustering``,
``alignment``, ``scaling``, ``count``, ``kpca_diagnostics``, ``rpc_robustness``,
``kpca_features``, ``noise``, ``cryoem``, ``first_fit``) get a dedicated table; any other file
gets a generic one (its ``rows`` or ``sweep`` records, else its top-level numbers). Every section
ends with the hardware the numbers were measured on, as the JSON records it. One more section,
``headline``, picks a few figures out of several files for the README, each row linked to its
JSON file and to the benchmarks page of the documentation.

The documentation includes the sections as ``docs/_generated/bench_<name>.inc`` (written at
every build by ``docs/_ext/bench_tables.py``, which calls :func:`write_includes`); the README
holds only ``headline``, between ``<!-- bench:headline -->`` and ``<!-- /bench:headline -->``.

    python benchmarks/make_readme_tables.py                  # print every section (markdown)
    python benchmarks/make_readme_tables.py --update README.md
        # replace the text between each pair of markers already in README.md
    python benchmarks/make_readme_tables.py --rst docs/_generated
        # write the reStructuredText includes that the documentation build writes
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


# ---------------------------------------------------------------------------------- formatting
def fmt(v, digits=3):
    if isinstance(v, bool) or v is None:
        return "" if v is None else ("yes" if v else "no")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:  # NaN
            return "n/a"
        if v != 0 and (abs(v) >= 1e4 or abs(v) < 10 ** -digits):
            return f"{v:.2e}"
        return f"{v:.{digits}f}"
    return str(v)


def md_table(header, rows, align=None):
    """A markdown table; ``align``: one of 'l'/'r' per column (default: text left, else right)."""
    if align is None:
        first = rows[0] if rows else [""] * len(header)
        align = ["l" if isinstance(c, str) and not _numeric(c) else "r" for c in first]
    cells = [[(fmt(c) if not isinstance(c, str) else c).replace("|", "\\|") for c in r]
             for r in rows]
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(lines)


def _numeric(s):
    try:
        float(s)
    except ValueError:
        return False
    return True


def hardware(result):
    """One line on where the numbers were measured, from ``env`` or ``config``."""
    env = result.get("env") or result.get("environment") or {}
    cfg = result.get("config") or result.get("args") or {}
    parts = []
    if env.get("cuda"):
        parts.append(f"GPU {env['cuda']}")
    if env.get("cpu_count"):
        parts.append(f"{env['cpu_count']} CPU cores")
    threads = env.get("torch_threads", cfg.get("threads"))
    if threads:
        parts.append(f"{threads} torch thread(s)")
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    if env.get("date"):
        parts.append(env["date"])
    wall = result.get("wall_s")
    if isinstance(wall, (int, float)):
        parts.append(f"wall time {wall:.0f} s")
    line = "Measured on: " + (", ".join(parts) if parts else "(not recorded in the JSON)") + "."
    command = result.get("command")
    if isinstance(command, str):
        line += f" Command: `{command}`."
    return line


# ------------------------------------------------------------------------------- per benchmark
def table_clustering(r):
    rows = r.get("rows", [])
    out = []
    for key in dict.fromkeys((row.get("variant", ""), row.get("n", "")) for row in rows):
        sub = [row for row in rows if (row.get("variant", ""), row.get("n", "")) == key]
        out.append(f"**{key[0]}** (n = {key[1]})\n")
        out.append(md_table(
            ["method", "ACC", "NMI", "ARI", "seconds", "process peak RSS (MB)", "clusters",
             "iterations (converged)"],
            [[row["method"], row.get("acc", row.get("ACC")), row.get("nmi", row.get("NMI")),
              row.get("ari", row.get("ARI")), row.get("seconds"), row.get("peak_rss_mb"),
              row.get("n_clusters_found", ""),
              (f"{row['n_iter']} ({'yes' if row.get('converged') else 'no'})"
               if row.get("n_iter") is not None else "")] for row in sub]))
        extra = [row for row in sub if row.get("means_graph_purity") is not None]
        for row in extra:
            agree = row.get("predict_agreement")
            out.append(f"\nkNN-graph purity (edges joining two samples of one class): samples "
                       f"{fmt(row.get('knn_purity'))}, converged means "
                       f"{fmt(row.get('means_graph_purity'))}"
                       + (f"; predict(X) agrees with the fitted labels on {fmt(agree)}"
                          if agree is not None else "") + ".")
        out.append("")
    if "sweep" in r:
        out.append(table_generic({"rows": r["sweep"]}))
    if r.get("note"):
        out.append(r["note"])
    return "\n".join(out).strip()


def table_kpca(r):
    claims = r.get("claims", {})
    hist = r.get("history", {})
    acc = hist.get("test_accuracy", [])
    lines = []
    if acc:
        lines.append(f"ViT test accuracy after {len(acc) - 1} epoch(s): {fmt(acc[-1])}.\n")
    keys = [("official_loss_falls", "official J_proj (log mean) falls"),
            ("consistent_j_falls", "consistent J_proj falls"),
            ("fraction_negative_j_final", "fraction of queries with J_proj < 0"),
            ("h_over_phi_final_medians", "median ||h||^2 / ||varphi(q)||^2"),
            ("eigvec_ratio_trained", "eigenvector check / random baseline (trained)"),
            ("eigvec_rel_ratio_trained", "relative check / random baseline (trained)"),
            ("eigvec_far_below_random", "eigenvector check far below random")]
    layers = list(claims)
    rows = [[label] + [claims[layer].get(k) for layer in layers]
            for k, label in keys if any(k in claims[layer] for layer in layers)]
    if rows:
        lines.append(md_table(["quantity", *layers], rows, ["l"] + ["r"] * len(layers)))
    return "\n".join(lines)


def table_rpc(r):
    out = []
    summary = r.get("summary", {})
    n_seeds = len(r.get("config", {}).get("seeds", [])) or "?"
    for name, conds in summary.items():
        out.append(f"**{name}** (accuracy, mean ± std over {n_seeds} seed(s); "
                   "diff = RPC − Sym, paired by seed)\n")
        rows = []
        for cond, s in conds.items():
            rows.append([cond,
                         f"{s['SymViT_mean']:.3f} ± {s['SymViT_std']:.3f}",
                         f"{s['RPC-SymViT_mean']:.3f} ± {s['RPC-SymViT_std']:.3f}",
                         f"{s['diff_mean']:+.3f} ± {s['diff_std']:.3f}",
                         f"{s['rpc_better_in_seeds']}/{s['rpc_worse_in_seeds']}"])
        out.append(md_table(["condition", "SymViT", "RPC-SymViT", "diff", "RPC better/worse"],
                            rows, ["l", "r", "r", "r", "r"]))
        out.append("")
    return "\n".join(out).strip()


def table_alignment(r):
    rows = r.get("rows", [])
    if not rows or "per_pair_rate" not in rows[0]:
        return table_generic(r)
    n_large = rows[0].get("n_large", "n")
    return md_table(
        ["grid", "per-pair kornia (pairs/s)", "ours, same pairs (pairs/s)",
         f"ours, {n_large} x {n_large} (pairs/s)", "speed-up (same pairs / at scale)",
         "max rel. difference"],
        [[row["grid"], f"{row['per_pair_rate']:.3g}", f"{row['ours_rate_same']:.3g}",
          f"{row['ours_rate_large']:.3g}",
          f"{row.get('speedup_same', float('nan')):.0f}x / {row['speedup_rate']:.0f}x",
          f"{row['max_rel_diff']:.1e}"] for row in rows],
        ["l", "r", "r", "r", "r", "r"])


def table_scaling(r):
    rows = r.get("rows", [])
    if not rows or "method" not in rows[0] or "seconds" not in rows[0]:
        return table_generic(r)
    ns = sorted({row["n"] for row in rows})
    methods = list(dict.fromkeys(row["method"] for row in rows))
    exps = r.get("exponents", {})
    cell = {(row["method"], row["n"]): row for row in rows}
    body = []
    for m in methods:
        line = [m] + [fmt(cell[(m, n)].get("seconds"), 2) if (m, n) in cell else "–" for n in ns]
        e = exps.get(m, {}).get("exponent")
        line.append(fmt(e, 2) if e is not None else "")
        body.append(line)
    out = ["Seconds per method and n (–: not run at that size); exponent of the log-log "
           "fit of seconds against n.\n",
           md_table(["method", *[f"n = {n}" for n in ns], "exponent"], body,
                    ["l"] + ["r"] * (len(ns) + 1))]
    scored = [row for row in rows if "acc" in row]
    if scored:
        out.append("")
        out.append(md_table(["method", "n", "ACC", "ARI", "NMI"],
                            [[row["method"], row["n"], row["acc"], row.get("ari"),
                              row.get("nmi")] for row in scored]))
    return "\n".join(out)


def table_kpca_features(r):
    rows = r.get("rows", [])
    variants = list(dict.fromkeys(row["data"] for row in rows))
    feats = list(dict.fromkeys(row["features"] for row in rows))
    cell = {(row["data"], row["features"]): row for row in rows}
    out = []
    if rows:
        sizes = ", ".join(f"{v}: {cell[(v, feats[0])]['n_train']:,} train / "
                          f"{cell[(v, feats[0])]['n_test']:,} test" for v in variants
                          if (v, feats[0]) in cell)
        out.append(f"Test accuracy of `LogisticRegression` on each feature map (seconds of fit "
                   f"+ predict in brackets); {sizes}.\n")
        body = [[f] + [f"{fmt(cell[(v, f)]['accuracy'])} ({cell[(v, f)]['seconds']:.0f} s)"
                       if (v, f) in cell else "–" for v in variants] for f in feats]
        out.append(md_table(["features", *variants], body, ["l"] + ["r"] * len(variants)))
    digits = r.get("digits_cv", [])
    if digits:
        out.append("\nscikit-learn digits, 3-fold cross-validation:\n")
        out.append(md_table(["pipeline", "accuracy"],
                            [[d["pipeline"], d["cv3_accuracy"]] for d in digits], ["l", "r"]))
    return "\n".join(out) or table_generic(r)


def table_noise(r):
    """ACC per grouping (rows) and noise level (columns), means over the seeds; then the
    graphs' purity and the means' correlation with the clean digits per noise level."""
    summary = r.get("summary", [])
    sigmas = list(dict.fromkeys(row["sigma"] for row in summary))
    methods = list(dict.fromkeys(row["method"] for row in summary))
    by = {(row["sigma"], row["method"]): row for row in summary}
    seeds = max((row.get("seeds", 0) for row in summary), default=0)
    n = next((row["n"] for row in r.get("rows", []) if "n" in row), None)
    head = ([f"grouping (ACC, mean of {seeds} seeds" + (f", n = {n:,}" if n else "") + ")"]
            + [f"sigma {fmt(s, 1)}" for s in sigmas] + ["seconds (mean)"])
    rows = [[m] + [by[(s, m)]["acc"] if (s, m) in by else "" for s in sigmas]
            + [float(np.mean([by[(s, m)]["seconds"] for s in sigmas if (s, m) in by]))]
            for m in methods]
    out = [md_table(head, rows), ""]
    first = {s: next(row for row in summary if row["sigma"] == s) for s in sigmas}
    cols = [("purity_samples", "purity, samples' graph"), ("purity_means", "purity, means' graph"),
            ("corr_noisy", "corr(noisy, clean)"),
            ("corr_one_step", "corr(one-step average, clean)"),
            ("corr_means", "corr(invariant mean, clean)")]
    if "noise_measured" in first[sigmas[0]]:
        # the runs with the noise filter: the same on the filtered images, which fit sees
        cols = [("noise_measured", "noise measured")] + cols + [
            ("purity_samples_filtered", "filtered: purity, samples' graph"),
            ("purity_means_filtered", "filtered: purity, means' graph"),
            ("corr_one_step_filtered", "filtered: corr(one-step average, clean)"),
            ("corr_means_filtered", "filtered: corr(invariant mean, clean)")]
    out.append(md_table(["sigma"] + [c[1] for c in cols],
                        [[fmt(s, 1)] + [first[s][c[0]] for c in cols] for s in sigmas]))
    fits = [row for row in r.get("rows", []) if row.get("n_clusters_found") is not None]
    for row in fits:
        agree = row.get("predict_agreement")
        out.append(f"\n{row['method']} (sigma {fmt(row['sigma'], 1)}, seed {row['seed']}): "
                   f"ACC {fmt(row['acc'])}, {row['n_clusters_found']} clusters"
                   + (f", predict(X) agrees with the fitted labels on {fmt(agree)}"
                      if agree is not None else "") + ".")
    if r.get("load_note"):
        out.append(f"\nLoad: {r['load_note']}.")
    return "\n".join(out).strip()


def _cryoem_kind(method):
    if method == "noisy":
        return "noisy"
    if method.startswith("mean of all"):
        return "global"
    if method.startswith("ASPIRE"):
        return "aspire"
    if method.startswith("ours: invariant kNN"):
        if "searched again" in method:
            return "means_search"
        if "blur" in method:
            return "knn_blur"
        if "DihedralPCA" in method:
            return "knn_pca_center" if "centred" in method else "knn_pca"
        return "knn_mirror" if "mirrors" in method else "knn"
    if method.startswith("ours: InvariantAttentionClusterer"):
        return "means_mirror" if "reflection=True" in method else "means"
    return method


def table_cryoem(r):
    """Two pivots of bench_cryoem's rows, one line per (shift, SNR): neighbours, averages."""
    cells = {}
    for row in r.get("rows", []):
        key = (row.get("shift"), row.get("snr"))
        cells.setdefault(key, {})[_cryoem_kind(row.get("method", ""))] = row

    def get(c, kind, field, digits=None):
        v = c.get(kind, {}).get(field)
        if v is None:
            return ""
        return f"{v:.0f}" if digits == 0 else fmt(v)

    def snr(v):
        return f"1/{1 / v:.0f}" if v < 1 else f"{v:g}"

    nbr, avg, detail = [], [], []
    for (shift, s), c in sorted(cells.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        sh = f"+-{shift:g} px" if shift else "none"
        nbr.append([snr(s), sh,
                    f"{get(c, 'aspire', 'nbr10')} ({get(c, 'aspire', 'med_angle', 0)} deg)",
                    f"{get(c, 'knn_pca', 'nbr10')} ({get(c, 'knn_pca', 'med_angle', 0)} deg)"
                    if "knn_pca" in c else "",
                    f"{get(c, 'knn_pca_center', 'nbr10')} "
                    f"({get(c, 'knn_pca_center', 'med_angle', 0)} deg)"
                    if "knn_pca_center" in c else "",
                    f"{get(c, 'knn_mirror', 'nbr10')} ({get(c, 'knn_mirror', 'med_angle', 0)} deg)"
                    if "knn_mirror" in c else "",
                    f"{get(c, 'knn', 'nbr10')} ({get(c, 'knn', 'med_angle', 0)} deg)"
                    if "knn" in c else "",
                    f"{get(c, 'means_search', 'nbr10')} "
                    f"({get(c, 'means_search', 'med_angle', 0)} deg)"
                    if "means_search" in c else "",
                    get(c, "aspire", "seconds_neighbors", 0),
                    get(c, "knn_pca", "seconds_neighbors", 0),
                    get(c, "knn_pca_center", "seconds_neighbors", 0),
                    get(c, "knn_mirror", "seconds_neighbors", 0),
                    get(c, "knn", "seconds_neighbors", 0)])
        if any("corr_detail" in v for v in c.values()):
            detail.append([snr(s), sh] + [get(c, kind, "corr_detail") for kind in
                                          ("noisy", "global", "aspire", "knn_pca",
                                           "knn_pca_center", "knn_mirror", "means")])
        avg.append([snr(s), sh, get(c, "noisy", "corr"), get(c, "global", "corr"),
                    get(c, "aspire", "corr"), get(c, "knn_pca", "corr"),
                    get(c, "knn_pca_center", "corr"),
                    get(c, "knn_mirror", "corr"), get(c, "knn", "corr"), get(c, "means", "corr"),
                    get(c, "aspire", "seconds_averages_all_n", 0),
                    get(c, "knn_pca", "seconds_averages", 0),
                    get(c, "knn_mirror", "seconds_averages", 0),
                    get(c, "means", "seconds_fit", 0)])
    if not nbr:
        return table_generic(r)
    k = r.get("k", 10)
    # the DihedralPCA of the '-pca' rows, as their method name gives it
    pca_names = {m[m.index("DihedralPCA"):m.index(")", m.index("DihedralPCA")) + 1]
                 for m in (x["method"] for x in r["rows"]) if "DihedralPCA" in m}
    pca_name = " / ".join(sorted(pca_names)) or "DihedralPCA"
    t1 = md_table(["SNR", "shifts", "ASPIRE (mirrors)",
                   f"ours, mirrors, search on {pca_name}", "the same, centred",
                   "ours, mirrors, search on the pixels", "ours, no mirrors",
                   "ours, mirrors, searched again on the invariant means",
                   "s ASPIRE classify", "s ours, DihedralPCA + search", "s the same, centred",
                   "s ours, mirrors", "s ours, no mirrors"], nbr,
                  ["l", "l"] + ["r"] * 11)
    t2 = md_table(["SNR", "shifts", "noisy image", "mean of all images (no alignment)", "ASPIRE",
                   f"ours, one-step k={k}, mirrors, DihedralPCA search", "the same, centred",
                   f"ours, one-step k={k}, mirrors", f"ours, one-step k={k}",
                   "ours, invariant_means_", "s ASPIRE (all n, extrapolated)",
                   "s ours one-step (DihedralPCA search)", "s ours one-step",
                   "s ours fit (means)"],
                  avg, ["l", "l"] + ["r"] * 12)
    return ("Share of the 10 nearest neighbours within 10 degrees of viewing direction "
            "(median angle):\n\n" + t1 +
            f"\n\nMedian correlation of the class averages (k = {k} neighbours + the image) "
            f"with the clean projections, over the first {r.get('n_avg', '')} images:\n\n" + t2
            + ("" if not detail else
               "\n\nThe same once the mean of all clean images (the particle's common shape) is "
               "subtracted from both (`corr_detail`; empty: not run with that metric):\n\n"
               + md_table(["SNR", "shifts", "noisy image", "mean of all images", "ASPIRE",
                           f"ours, one-step k={k}, mirrors, DihedralPCA search",
                           "the same, centred", f"ours, one-step k={k}, mirrors",
                           "ours, invariant_means_"],
                          detail, ["l", "l"] + ["r"] * 7)))


def table_generic(r):
    for key in ("rows", "sweep", "results"):
        rows = r.get(key)
        if isinstance(rows, list) and rows and all(isinstance(x, dict) for x in rows):
            cols = list(dict.fromkeys(k for x in rows for k, v in x.items()
                                      if not isinstance(v, (dict, list))))
            return md_table(cols, [[x.get(c) for c in cols] for x in rows])
    scalars = [[k, v] for k, v in r.items()
               if isinstance(v, (int, float, str, bool)) and k not in ("benchmark",)]
    return md_table(["key", "value"], scalars, ["l", "r"]) if scalars else "(no table)"


def table_first_fit(r):
    return md_table(
        ["data", "import (s)", "first fit (s)", "second fit (s)", "first / second", "ACC",
         "peak RSS (MB)", "numba, pynndescent or umap-learn imported", "TensorFlow warning"],
        [[x["data"], x["import_s"], x["first_fit_s"], x.get("second_fit_s"),
          x.get("first_over_second"), x.get("acc"), x.get("peak_rss_mb"),
          ", ".join(x.get("imported", [])) or "none", x["tensorflow_warning"]]
         for x in r["rows"]])


def _table_duplicates(rows):
    """The natural sets' rows of ``bench_count --duplicates``: each variant's ARI against the
    fit of the data as it is (first half, for the stacked variants)."""
    cols = [("doubled_ari_first_half_vs_single", "stored twice"),
            ("near_ari_first_half_vs_single", "with a copy jittered by 1e-4"),
            ("jittered_ari_vs_single", "jittered by 1e-4, alone"),
            ("near_ari_first_half_vs_jittered", "the stacked fit against the jittered alone"),
            ("rot90_ari_first_half_vs_single", "with its quarter turns"),
            ("permuted_ari_vs_single", "permuted")]
    natural = [x for x in rows if x.get("copies") is None]
    cols = [(c, name) for c, name in cols if any(c in x for x in natural)]
    return ("ARI against the fit of the data as it is:\n\n"
            + md_table(["set", "n_clusters", *[name for _, name in cols]],
                       [[x["set"], "None" if x["n_clusters"] is None else str(x["n_clusters"]),
                         *[x.get(c) for c, _ in cols]] for x in natural],
                       ["l", "l"] + ["r"] * len(cols)))


def table_count(r):
    """Copy sets whose count came out exact with ARI >= 0.95, per kind of set and method."""
    summary = [x for x in r.get("summary", []) if x.get("noise") == "all"]
    methods = list(dict.fromkeys(x["method"] for x in summary))
    kinds = list(dict.fromkeys(x["kind"] for x in summary))
    if not summary:
        if any(x.get("copies") is None for x in r.get("duplicates", [])):
            return _table_duplicates(r["duplicates"])
        return table_generic(r)
    cell = {(x["kind"], x["method"]): x for x in summary}
    names = {"estimator": "`n_clusters=None`",
             "estimator_center": "`n_clusters=None, center=True`",
             "estimator_no_center": "`n_clusters=None, center=False`",
             "hdbscan_invariant": "HDBSCAN on `invariant_distances`",
             "leiden_modularity": "Leiden (modularity) on the kNN graph",
             "hdbscan_umap": "HDBSCAN on umap-learn's layout"}
    kind_names = {"digits8": "8 x 8 digits", "mnist_rot": "MNIST digits",
                  "mnist_shift": "MNIST digits, shifts within ±2 px"}
    body = []
    for kind in kinds:
        sets = next(x["sets"] for x in summary if x["kind"] == kind)
        label = (f"all {sets} (largest count error)" if kind == "all"
                 else f"{kind_names.get(kind, kind)} ({sets} sets)")
        row = [label]
        for m in methods:
            x = cell.get((kind, m))
            if x is None:
                row.append("–")
            elif kind == "all":
                row.append(f"{x['exact']} ({x['max_abs_count_error']})")
            else:
                row.append(str(x["exact"]))
        body.append(row)
    cell_all = {m: cell.get(("all", m)) for m in methods}
    measured = any(x.get("true_separation") is not None for x in r.get("rows", []))
    if measured and all(x is not None and x.get("separated_sets") is not None
                        for x in cell_all.values()):
        # the sets whose true groups the invariant distances separate (bench_count's
        # true_separation > 1)
        body.append(["sets whose groups the distances separate (largest count error)"]
                    + [f"{x['exact_separated']} of {x['separated_sets']} "
                       f"({x['max_abs_count_error_separated']})" for x in cell_all.values()])
    if all(x is not None and x.get("resolved_sets") is not None for x in cell_all.values()):
        # the sets none of whose clean shapes are closer to each other than two noisy copies
        # of one shape (bench_count's closest_over_noise >= 1; clean sets all count)
        body.append(["sets with no two shapes closer than two noisy copies (largest count "
                     "error)"]
                    + [f"{x['exact_resolved']} of {x['resolved_sets']} "
                       f"({x['max_abs_count_error_resolved']})" for x in cell_all.values()])
    given = [x for x in r.get("rows", []) if x.get("copies") is not None
             and x.get("ari_given_k") is not None]
    note = ""
    if given:
        hits = sum(x["ari_given_k"] >= 0.95 for x in given)
        note = (f"\n\nWith the true count given (`--given`), {hits} of {len(given)} sets "
                "reach ARI >= 0.95.")
    return ("Copy sets with the exact count and ARI >= 0.95:\n\n"
            + md_table(["copy sets", *[names.get(m, m) for m in methods]], body,
                       ["l"] + ["r"] * len(methods)) + note)


def _cryoem_ctf_kind(method):
    if method.startswith("ASPIRE DenoiserCov2D"):
        return "cov2d"
    if method.startswith("ASPIRE RIRClass2D"):
        return "rir"
    if method.startswith("ours: SteerableWiener alone (noise_std ="):
        return "steerable_given " + method.split("= ", 1)[1].split(" x", 1)[0]
    if method.startswith("ours: SteerableWiener alone"):
        return "steerable"
    if method.startswith("ours: steerable_class_averages"):
        return "steerable_choice"
    if method.startswith("ours: the same averages (plain means) + SteerableWiener"):
        return "ours_fourier_plain_steerable"
    if "alone" in method:
        return "filter"
    if method.startswith("ours: class_averages"):
        centre = "fourier" if "rotation_center='fourier'" in method else "geometric"
        snr = method.rsplit("snr=", 1)[1].split(")")[0]
        kind = {"'auto'": "auto", "None": "plain"}.get(snr, "true")
        pca = "_pcaauto" if "DihedralPCA('auto'" in method else ""
        # phase-flipped images alone: ctf_groups=1 (rows from before the groups: no mention)
        flip = "_flip" if "ctf_groups=1," in method else ""
        return f"ours_{centre}_{kind}{pca}{flip}"
    return method


def table_cryoem_ctf(r):
    """bench_cryoem --suite ctf: one line per (CTF, SNR); averages against the projection
    without CTF, neighbours, seconds."""
    cells = {}
    for row in r.get("rows", []):
        cells.setdefault((row["ctf"], row["snr"]), {})[_cryoem_ctf_kind(row["method"])] = row

    def get(c, kind, field, digits=3):
        v = c.get(kind, {}).get(field)
        return "" if v is None else (f"{v:.0f}" if digits == 0 else fmt(v, digits))

    def both(c, k):
        return f"{get(c, k, 'corr')} / {get(c, k, 'corr_detail')}" if k in c else "–"

    def snr(v):
        return f"1/{1 / v:.0f}" if v < 1 else f"{v:g}"

    avg, nbr = [], []
    for (ctf, s), c in sorted(cells.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        label = [snr(s), "yes" if ctf else "no"]
        auto = "ours_fourier_auto_pcaauto"
        avg.append(label + [both(c, k) for k in ("noisy", "cov2d", "filter", "steerable",
                                                 "ours_fourier_plain", "ours_fourier_auto",
                                                 "ours_fourier_true", auto,
                                                 "ours_fourier_plain_steerable",
                                                 "steerable_choice")]
                   + [get(c, k, "rel_mse", 4) for k in ("cov2d", "ours_fourier_auto")])
        nbr.append(label + [get(c, "rir", "nbr10"), get(c, "ours_fourier_auto", "nbr10"),
                            get(c, "ours_geometric_auto", "nbr10")
                            or get(c, "ours_geometric_plain", "nbr10"),
                            get(c, auto, "nbr10"), get(c, auto + "_flip", "nbr10") or "–",
                            get(c, auto, "n_components", 0),
                            get(c, "cov2d", "seconds", 1), get(c, "rir", "seconds_neighbors", 1),
                            get(c, "ours_fourier_auto", "seconds", 1), get(c, auto, "seconds", 1)])
    if not avg:
        return table_generic(r)
    t1 = md_table(["SNR", "CTF", "noisy image", "ASPIRE DenoiserCov2D",
                   "ours: radial filter alone", "ours: SteerableWiener alone",
                   "ours: plain mean", "ours: Wiener, snr='auto'", "ours: Wiener, true SNR",
                   "ours: Wiener 'auto', search on DihedralPCA('auto', 32)",
                   "ours: plain mean + SteerableWiener",
                   "ours: steerable_class_averages (risk-weighted blend)",
                   "rel. MSE Cov2D", "rel. MSE ours (auto)"], avg, ["l", "l"] + ["r"] * 12)
    t2 = md_table(["SNR", "CTF", "ASPIRE RIRClass2D", "ours, rotation_center='fourier'",
                   "ours, 'geometric'", "ours, DihedralPCA('auto', 32)",
                   "the same, phase-flipped images alone (ctf_groups=1)", "its components",
                   "s Cov2D", "s RIRClass2D", "s ours (search + averages)",
                   "s ours, DihedralPCA('auto', 32)"],
                  nbr, ["l", "l"] + ["r"] * 10)
    return ("Median correlation / detail correlation (the mean projection removed from both) "
            "with the projection without CTF, and the median relative squared error. Ours "
            "search on DihedralPCA(40, output_size=24) unless named:\n\n"
            + t1 + "\n\nShare of the 10 nearest neighbours within 10 degrees of viewing "
            "direction, and seconds on all images:\n\n" + t2)


FORMATTERS = {
    "cryoem_ctf": table_cryoem_ctf,
    "count": table_count,
    "first_fit": table_first_fit,
    "clustering": table_clustering,
    "alignment": table_alignment,
    "scaling": table_scaling,
    "kpca_diagnostics": table_kpca,
    "rpc_robustness": table_rpc,
    "kpca_features": table_kpca_features,
    "noise": table_noise,
    "cryoem": table_cryoem,
}


# ------------------------------------------------------------------------------------ headline
DOCS_PAGE = "docs/benchmarks.rst"


def _load(results_dir, name):
    try:
        return json.loads((Path(results_dir) / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def _row(rows, **match):
    return next((x for x in rows if all(x.get(k) == v for k, v in match.items())), None)


def _headline_clustering(r):
    rows = r["rows"]
    ours = _row(rows, variant="rotated45", n=10000, method="invariant attention")
    km = _row(rows, variant="rotated45", n=10000, method="k-means (pixels)")
    pipe = _row(rows, variant="rotated45", n=10000, method="kNN + UMAP + k-means")
    return ("10,000 MNIST test digits rotated within ±45°", "ACC",
            f"{ours['acc']:.3f} ({ours['seconds']:.0f} s)",
            f"k-means on pixels {km['acc']:.3f}; invariant kNN -> umap-learn -> k-means "
            f"{pipe['acc']:.3f} ({pipe['seconds']:.0f} s)",
            "clustering-rotated-mnist-and-fashion-mnist")


def _headline_noise(r):
    s = [x for x in r["summary"] if x["sigma"] == 0.8]
    ours = _row(s, method="estimator (default grouping)")
    base = max((x for x in s if x["method"] in ("pipeline", "leiden (samples)")),
               key=lambda x: x["acc"])
    names = {"pipeline": "invariant kNN -> umap-learn -> k-means",
             "leiden (samples)": "Leiden on the invariant kNN graph"}
    return (f"The same with Gaussian noise of std 0.8 (mean of {ours['seeds']} seeds)", "ACC",
            f"{ours['acc']:.3f}", f"{names[base['method']]} {base['acc']:.3f}",
            "noisy-rotated-mnist")


def _headline_fashion(r):
    rows = r["rows"]
    ours = _row(rows, n=70000, method="InvariantAttentionClusterer")
    umap = _row(rows, n=70000, method="umap-learn -> k-means (pixels)")
    km = _row(rows, n=70000, method="k-means (pixels)")
    return ("All 70,000 Fashion-MNIST images", "ACC (fit time, peak memory)",
            f"{ours['acc']:.3f} ({ours['seconds']:.0f} s, {ours['peak_mb'] / 1024:.1f} GB)",
            f"umap-learn -> k-means {umap['acc']:.3f}; k-means {km['acc']:.3f}",
            "the-invariant-knn-graph")


def _headline_gpu(r, cpu):
    """The card's row; ``cpu``: ``scaling_fashion70k.json`` (or None), the same fit on a CPU.
    The ``fresh`` rows of ``gpu.json``, where it has them, give a new process's first fit
    with empty caches."""
    rows = r["rows"]
    first = _row(rows, row="fashion", path="default (first fit in process)")
    second = _row(rows, row="fashion", path="default (second fit)")
    tr = _row(rows, row="transformer")
    on_cpu = cpu and _row(cpu["rows"], n=first["n"], method="InvariantAttentionClusterer")
    cores = ((cpu or {}).get("env") or {}).get("cpu_count")
    new = [x for x in rows if x.get("row") == "fresh" and x.get("order") == "fit-first"
           and x.get("n") == first["n"]]
    cold = f", {new[0]['first_fit_s']:.1f} s on a fresh machine" if new else ""
    # measured on another day, the CPU's figure may be another version's: its date is given
    cpu_date = ((cpu or {}).get("env") or {}).get("date")
    when = (f" ({cpu_date}, another version)"
            if cpu_date and cpu_date != (r.get("env") or {}).get("date") else "")
    return (f"All {first['n']:,} Fashion-MNIST images on one {r['env']['cuda']}",
            "fit seconds (ACC)",
            f"{second['seconds']:.1f} s, the first fit in a process {first['seconds']:.1f} s"
            f"{cold} ({first['acc']:.3f}); `InvariantKNeighborsTransformer` "
            f"{tr['seconds']:.1f} s",
            (f"the same fit on {cores} CPU cores {on_cpu['seconds']:.0f} s{when}"
             if on_cpu and cores else ""),
            "scaling-on-a-gpu")


def _cryoem_ctf_at_snr1(r, peer):
    """Our class averages' row and the ASPIRE ``peer``'s row at SNR 1 with a CTF."""
    rows = r["rows"]
    m = "ours: class_averages(72 angles, mirrors, DihedralPCA('auto', output_size=32), "
    # the default search: across CTF groups (not ctf_groups=1), or rows from before them
    ours = next(x for x in rows if x["snr"] == 1.0 and x["ctf"]
                and x["method"].startswith(m + "rotation_center='fourier', ctf")
                and x["method"].endswith(", snr='auto'), k=10")
                and "ctf_groups=1," not in x["method"])
    theirs = next(x for x in rows if x["snr"] == 1.0 and x["ctf"]
                  and x["method"].startswith(peer))
    return ours, theirs


def _headline_cryoem_ctf(r):
    ours, cov = _cryoem_ctf_at_snr1(r, "ASPIRE DenoiserCov2D")
    return (f"Cryo-EM: {r['n']:,} simulated {r['L']} x {r['L']} projections with a CTF, SNR 1",
            "detail correlation of the averages with the projections without CTF (seconds)",
            f"{ours['corr_detail']:.3f} ({ours['seconds']:.0f} s)",
            f"ASPIRE DenoiserCov2D {cov['corr_detail']:.3f} ({cov['seconds']:.0f} s)",
            "cryo-em-with-a-ctf-against-aspire-s-denoiser")


def _headline_cryoem_ctf_neighbours(r):
    ours, rir = _cryoem_ctf_at_snr1(r, "ASPIRE RIRClass2D")
    return ("The same: each image's 10 nearest neighbours",
            "share within 10° of the view (seconds)",
            f"{ours['nbr10']:.3f} ({ours['seconds']:.0f} s, with the averages)",
            f"ASPIRE RIRClass2D {rir['nbr10']:.3f} ({rir['seconds_neighbors']:.0f} s)",
            "cryo-em-with-a-ctf-against-aspire-s-denoiser")


def _headline_count(r, *draws):
    """``count.json`` (the shapes drawn with seed 0), and ``draws``: the estimator's rows on
    the shapes of other seeds (``count_draws_seed*.json``, None where absent)."""
    s = [x for x in r["summary"] if x["kind"] == "all" and x["noise"] == "all"]
    ours = _row(s, method="estimator")
    hdb = _row(s, method="hdbscan_invariant")
    draws = [d for d in draws if d is not None]
    other = [_row(d["summary"], method="estimator", kind="all", noise="all") for d in draws]
    other_hdb = [_row(d["summary"], method="hdbscan_invariant", kind="all", noise="all")
                 for d in draws]
    seed = r.get("args", {}).get("seed", 0)
    more = ""
    if other:
        seeds = ", ".join(str(d["args"]["seed"]) for d in draws)
        more = (f"; other shapes (seeds {seeds}): "
                + ", ".join(str(x["exact"]) for x in other))
    measured = [(x, d) for x, d in zip(other_hdb, draws) if x is not None]
    hdb_more = ""
    if measured:
        hdb_more = (f"(seeds {', '.join(str(d['args']['seed']) for _, d in measured)}: "
                    + ", ".join(str(x["exact"]) for x, _ in measured) + ")")
    return (f"Counting clusters: {ours['sets']} sets of rotated copies",
            "sets with the exact count and ARI >= 0.95",
            f"{ours['exact']} (the shapes of seed {seed}){more}",
            f"HDBSCAN on `invariant_distances` {hdb['exact']}"
            + (f" {hdb_more}" if hdb_more else ""), "how-many-clusters")


def _headline_alignment(r):
    row = r["rows"][0]
    return (f"Aligning image pairs ({row['grid']})", "pairs per second",
            f"{row['ours_rate_same']:.2g} ({row['speedup_same']:.0f}x)",
            f"kornia, one pair at a time: {row['per_pair_rate']:.2g}", "alignment-search")


# (JSON name, row maker[, names of further JSON files the maker reads, each passed as an
# argument: None where absent])
HEADLINES = [("clustering", _headline_clustering), ("noise_filter_10000", _headline_noise),
             ("scaling_fashion70k", _headline_fashion),
             ("gpu", _headline_gpu, "scaling_fashion70k"),
             ("cryoem_ctf", _headline_cryoem_ctf),
             ("cryoem_ctf", _headline_cryoem_ctf_neighbours),
             ("count", _headline_count, "count_draws_seed1", "count_draws_seed2",
              "count_draws_seed3", "count_draws_seed4", "count_draws_seed5",
              "count_draws_seed6"),
             ("alignment", _headline_alignment)]


def headline(results_dir=RESULTS):
    """The README's table of headline figures, each linked to its JSON and the docs page."""
    rows = []
    for name, make, *also in HEADLINES:
        r = _load(results_dir, name)
        if r is None:
            continue
        try:
            task, measure, ours, others, anchor = make(
                r, *(_load(results_dir, other) for other in also))
        except (KeyError, TypeError, ValueError, StopIteration):
            print(f"headline: {name}.json lacks the fields its row needs", file=sys.stderr)
            continue
        env = r.get("env") or r.get("environment") or {}
        where = (env.get("cuda") or
                 (f"{env['cpu_count']} CPU cores" if env.get("cpu_count") else None))
        when = ", ".join(str(x) for x in (env.get("date"), where) if x)
        rows.append([task, measure, ours, others,
                     f"[`{name}.json`](benchmarks/results/{name}.json)"
                     + (f" ({when})" if when else ""),
                     f"[benchmarks]({DOCS_PAGE}#{anchor})"])
    if not rows:
        return "(no results)"
    return md_table(["task", "measure", "invariant_cluster", "baselines", "data (measured)",
                     "details"], rows, ["l"] * 6)


_ROUNDS = [(re.compile(r"\s*\((?:the )?\w+ session\)"), ""),
           (re.compile(r"\((?:the )?\w+ session; "), "("),
           (re.compile(r" in the \w+ session\b"), ""),
           (re.compile(r"\bthe \w+ session's run\b"), "an earlier run of the same command"),
           (re.compile(r"\bthe session's time\b"), "the time available")]


def _without_rounds(text):
    """The JSON's free-text notes without the internal round of work that some of them name
    (the table's last line dates the numbers by the JSON's date and machine instead)."""
    for pattern, repl in _ROUNDS:
        text = pattern.sub(repl, text)
    return text


def section(name, result):
    kind = result.get("benchmark", name)
    body = _without_rounds(FORMATTERS.get(kind, table_generic)(result))
    return (f"<!-- bench:{name} -->\n"
            f"_From `benchmarks/results/{name}.json`._\n\n{body}\n\n{hardware(result)}\n"
            f"<!-- /bench:{name} -->")


def sections(results_dir=RESULTS):
    out = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"skipping {path}: {exc}", file=sys.stderr)
            continue
        if isinstance(result, dict):
            out[path.stem] = section(path.stem, result)
    out["headline"] = ("<!-- bench:headline -->\n" + headline(results_dir)
                       + "\n<!-- /bench:headline -->")
    return out


def update(readme, secs):
    """Replace each ``<!-- bench:NAME -->...<!-- /bench:NAME -->`` block present in ``readme``.

    Returns the new text and the names of the blocks replaced; a marker without a section is
    reported on stderr.
    """
    text = Path(readme).read_text()
    updated = []
    for name, block in secs.items():
        tag = re.escape(name)
        pattern = re.compile(rf"<!-- bench:{tag} -->.*?<!-- /bench:{tag} -->", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _m, b=block: b, text)
            updated.append(name)
    for name in re.findall(r"<!-- bench:([\w-]+) -->", text):
        if name not in secs:
            print(f"{readme}: no results/{name}.json for the markers '{name}'", file=sys.stderr)
    return text, updated


# ------------------------------------------------------------------ reStructuredText includes
def _inline_rst(text):
    """Markdown inline markup -> reStructuredText (code, italics, links; bold is the same)."""
    # a whole-line italic note such as "_From `file.json`._": rst cannot nest code in emphasis
    text = re.sub(r"^_(.*)_(\.?)$", r"\1\2", text)
    text = re.sub(r"`([^`]+)`", r"``\1``", text)
    text = re.sub(r"(?<![\w*`])_([^_]+?)_(?![\w])", r"*\1*", text)
    # outside literals, a word ending in "_" (``labels_``) would be a reference to a target
    parts = re.split(r"(``.*?``)", text)
    text = "".join(part if part.startswith("``") else re.sub(r"(\w)_(?!\w)", r"\1\\_", part)
                   for part in parts)
    # a bare "|" would start a substitution reference; the tables escape it as "\|" already
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def _cells(line):
    inner = line.strip()[1:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def markdown_to_rst(body):
    """One generated section (paragraphs and pipe tables) as reStructuredText."""
    out = []
    lines = body.strip("\n").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|") and i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: "):
            header = _cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out += ["", ".. list-table::", "   :header-rows: 1", ""]
            for row in [header, *rows]:
                out.append(f"   * - {_inline_rst(row[0]) or '..'}")
                out += [f"     - {_inline_rst(c) or '..'}" for c in row[1:]]
            out.append("")
            continue
        out.append(_inline_rst(line))
        i += 1
    return "\n".join(out).strip() + "\n"


def write_includes(target, results_dir=RESULTS):
    """Write ``target/bench_<name>.inc`` for every JSON file; return the names written.

    A file is rewritten only when its text changes, so that Sphinx rebuilds only what moved.
    """
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    names = []
    for name, block in sections(results_dir).items():
        if name == "headline":
            continue  # its links are the README's
        body = re.sub(r"^<!-- /?bench:[\w-]+ -->\n?", "", block, flags=re.M)
        text = markdown_to_rst(body)
        path = target / f"bench_{name}.inc"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        names.append(name)
    return names


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(RESULTS), help="folder of the JSON files")
    p.add_argument("--update", metavar="README", help="rewrite the marked blocks of this file")
    p.add_argument("--rst", metavar="DIR",
                   help="write the documentation's includes bench_<name>.inc into DIR")
    args = p.parse_args(argv)
    if args.rst:
        names = write_includes(args.rst, args.results)
        print(f"wrote {len(names)} includes into {args.rst}")
        if not args.update:
            return 0
    secs = sections(args.results)
    if args.update:
        text, updated = update(args.update, secs)
        Path(args.update).write_text(text)
        print(f"updated {args.update}: {', '.join(updated) or 'nothing'}")
    else:
        print("\n\n".join(secs.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
