"""The benchmark tables of the README and the documentation, from the JSON in ``results/``.

A file holds one benchmark (``benchmarks/results/NAME.json``) or paper reproduction
(``examples/reproductions/results/``): ``{"benchmark": NAME, "runs": {RUN: result}}``. Each run
is a table, ``NAME`` (run ``default``) or ``NAME_RUN``, of rows of one schema, ``{"data",
"method", "metric", "value", "machine", "date"}``: the run's ``"table"`` (written by
``_common.write_json``), else rows derived from its ``"rows"`` records. One table per data set,
a line per method and a column per metric, then the machines, dates and command. The README's
headline table picks single rows out of several runs (``HEADLINE``), each linked to its JSON.

    python benchmarks/make_tables.py                       # print every table (markdown)
    python benchmarks/make_tables.py --update README.md    # rewrite the marked blocks
    python benchmarks/make_tables.py --rst docs/_generated # the documentation's includes

``--update`` replaces each block ``<!-- bench:NAME -->`` ... ``<!-- /bench:NAME -->`` by the
table ``NAME`` (or the headline); ``docs/_ext/bench_tables.py`` writes the includes at builds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = (ROOT / "benchmarks" / "results", ROOT / "examples" / "reproductions" / "results")
DOCS_PAGE = "docs/benchmarks.rst"
# a record's fields naming its data set and method (no "table"); LABELLED: "n 70000"
DATA_KEYS = ("variant", "dataset", "data", "kind", "row", "n", "snr", "ctf", "shift", "sigma")
METHOD_KEYS = ("method",)
LABELLED = ("n", "seed", "copies", "snr", "ctf", "shift", "sigma", "k")


def fmt(value) -> str:
    """A cell: numbers to four significant digits, booleans as yes / no, text as it is."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "n/a"
        return f"{value:.2e}" if value and not 1e-3 <= abs(value) < 1e5 else f"{value:.4g}"
    return "" if value is None else str(value)


def machine(result) -> str:
    env = result.get("env") or result.get("environment") or {}
    cores = f"{env['cpu_count']} CPU cores" if env.get("cpu_count") else None
    return ", ".join(x for x in (env.get("cuda"), cores) if x) or "CPU"


def derived_rows(result, data_keys=DATA_KEYS, method_keys=METHOD_KEYS, skip=(), records=None):
    """Rows of the schema from a JSON's ``rows`` records (or ``records``): the data-set fields
    joined as the data, the method fields as the method, and every other scalar a metric."""
    env = result.get("env") or result.get("environment") or {}
    recs = result.get("rows") if records is None else records
    out = []
    for rec in recs if isinstance(recs, list) else []:
        if not isinstance(rec, dict):
            continue
        data = ", ".join(f"{k} {rec[k]}" if k in LABELLED else str(rec[k])
                         for k in data_keys if rec.get(k) not in (None, ""))
        method = ", ".join(str(rec[k]) if k in ("method", "path", "caches", "order") else
                           f"{k}={rec[k]}" for k in method_keys if rec.get(k) not in (None, ""))
        for key, value in rec.items():
            if (key in data_keys or key in method_keys or key in skip or value in (None, "")
                    or not isinstance(value, (int, float, str))):
                continue
            out.append({"data": data or result.get("benchmark", ""),
                        "method": method or "default", "metric": key, "value": value,
                        "machine": machine(result), "date": env.get("date", "")})
    return out


def rows(result) -> list[dict]:
    return result["table"] if isinstance(result.get("table"), list) else derived_rows(result)


def tables(results_dirs=RESULTS) -> dict:
    """``{table name: (source, run result)}`` for every run with rows of the folders' JSON;
    the source names the file (relative to the repository) and the run."""
    out = {}
    for path in sorted(p.resolve() for d in results_dirs for p in Path(d).glob("*.json")):
        doc = json.loads(path.read_text())
        rel = (path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT)
               else f"benchmarks/results/{path.name}")
        for run, result in doc["runs"].items():
            if rows(result):
                out[path.stem if run == "default" else f"{path.stem}_{run}"] = (rel, run), result
    return out


def source(src, q="``") -> str:
    return f"{q}{src[0]}{q}" + ("" if src[1] == "default" else f", run {q}{src[1]}{q}")


def pivot(table):
    """``[(data, metrics, [(method, {metric: value})])]`` in the order the rows come."""
    groups: dict = {}
    for row in table:
        metrics, methods = groups.setdefault(row["data"], ({}, {}))
        metrics.setdefault(row["metric"], None)
        methods.setdefault(row["method"], {})[row["metric"]] = row["value"]
    return [(data, list(metrics), list(methods.items()))
            for data, (metrics, methods) in groups.items()]


def footer(result, table) -> str:
    where = sorted({(r.get("machine") or "", r.get("date") or "") for r in table})
    line = "Measured on " + "; ".join(", ".join(x for x in w if x) for w in where) + "."
    if isinstance(result.get("command"), str):
        line += f" Command: ``{result['command']}``."
    return line


def markdown(src, result) -> str:
    table = rows(result)
    out = [f"_From {source(src, '`')}._", ""]
    for data, metrics, methods in pivot(table):
        out += [f"**{data}**", "", "| method | " + " | ".join(metrics) + " |",
                "| --- |" + " ---: |" * len(metrics)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in [method] + [
            fmt(vals.get(m)) for m in metrics]) + " |" for method, vals in methods]
        out.append("")
    out.append(footer(result, table).replace("``", "`"))
    return "\n".join(out)


def _rst_cell(text) -> str:
    """A cell as reStructuredText: text in backticks a literal, markup characters escaped."""
    esc = {ord("\\"): "\\\\", ord("*"): "\\*", ord("|"): "\\|"}
    return "".join(f"`{p}`" if p.startswith("`") else re.sub(r"(\w)_(?!\w)", r"\1\\_",
                   p.translate(esc)) for p in re.split(r"(`[^`]+`)", str(text))) or ".."


def rst(src, result) -> str:
    table = rows(result)
    out = [f"From {source(src)}.", ""]
    for data, metrics, methods in pivot(table):
        out += [_rst_cell(data), "", ".. list-table::", "   :header-rows: 1", ""]
        for cells in [["method", *metrics],
                      *([method] + [fmt(vals.get(m)) for m in metrics]
                        for method, vals in methods)]:
            out.append(f"   * - {_rst_cell(cells[0])}")
            out += [f"     - {_rst_cell(c)}" for c in cells[1:]]
        out.append("")
    out.append(footer(result, table))
    return "\n".join(out) + "\n"


# The README's headline rows: (task, measure, anchor on the benchmarks page, the figures of
# ours, the baselines'). A figure is (table name, data, method, metric, template); the template
# formats the value ``v``.
SEC = "seconds against n; exponent: the slope of log seconds against log n"
CL = ("clustering", "rotated45 (n = 10000)")
NOISE = ("noise_filter_10000", "grouping (ACC, mean of 3 seeds, n = 10,000)")
FA, FA_S = ("scaling_fashion70k", "Fashion-MNIST train + test"), ("scaling_fashion70k", SEC)
GPU = ("gpu", "fashion, Fashion-MNIST train + test, n 70000")
CRYO = ("cryoem_ctf", "snr 1.0, ctf True, shift 0.0")
OURS = ("ours: class_averages(72 angles, mirrors, DihedralPCA('auto', output_size=32), "
        "rotation_center='fourier', ctf, ctf_groups=4, snr='auto'), k=10")
COV, RIR = "ASPIRE DenoiserCov2D (FFBBasis2D, true noise variance)", "ASPIRE RIRClass2D neighbours"
COUNT, ALL = "Copy sets with the exact count and ARI >= 0.95", "all 150 (largest count error)"
AL = ("alignment", "image pairs (MNIST digits), 36 rot x 1 shifts")
HEADLINE = [
    ("10,000 MNIST test digits rotated within ±45°", "ACC (fit seconds)",
     "clustering-rotated-mnist-and-fashion-mnist",
     [(*CL, "invariant attention", "ACC", "{v:.3f}"),
      (*CL, "invariant attention", "seconds", "({v:.0f} s)")],
     [(*CL, "k-means (pixels)", "ACC", "k-means {v:.3f};"),
      (*CL, "kNN + UMAP + k-means", "ACC", "invariant kNN -> umap-learn -> k-means {v:.3f}"),
      (*CL, "kNN + UMAP + k-means", "seconds", "({v:.0f} s)")]),
    ("The same with Gaussian noise of std 0.8 (mean of 3 seeds)", "ACC", "noisy-rotated-mnist",
     [(*NOISE, "estimator (default grouping)", "sigma 0.8", "{v:.3f}")],
     [(*NOISE, "leiden (samples)", "sigma 0.8", "Leiden on the invariant kNN graph {v:.3f}")]),
    ("All 70,000 Fashion-MNIST images", "ACC (fit seconds, peak memory)",
     "the-invariant-knn-graph",
     [(*FA, "InvariantAttentionClusterer, n=70000", "ACC", "{v:.3f}"),
      (*FA_S, "InvariantAttentionClusterer", "n = 70000", "({v:.0f} s,"),
      (*FA, "InvariantAttentionClusterer, n=70000", "peak RSS (GB)", "{v:.1f} GB)")],
     [(*FA, "umap-learn -> k-means (pixels), n=70000", "ACC", "umap-learn -> k-means {v:.3f};"),
      (*FA, "k-means (pixels), n=70000", "ACC", "k-means {v:.3f}")]),
    ("All 70,000 Fashion-MNIST images on one GPU", "fit seconds", "scaling-on-a-gpu",
     [(*GPU, "default (second fit)", "seconds", "{v:.1f} s,"),
      (*GPU, "default (first fit in process)", "seconds", "the first fit in a process {v:.1f} s"),
      ("gpu", "fresh, " + GPU[1][9:], "new empty folders, fit-first", "first_fit_s",
       "({v:.1f} s on a fresh machine), ACC"),
      (*GPU, "default (second fit)", "acc", "{v:.3f};"),
      ("gpu", "transformer, n 70000", "default", "seconds",
       "`InvariantKNeighborsTransformer` {v:.1f} s")],
     [(*FA_S, "InvariantAttentionClusterer", "n = 70000",
       "the same fit on 2 CPU cores {v:.0f} s")]),
    ("Cryo-EM: 2,000 simulated 64 x 64 projections with a CTF, SNR 1",
     "detail correlation of the averages with the projections without CTF (seconds)",
     "cryo-em-with-a-ctf-against-aspire-s-denoiser",
     [(*CRYO, OURS, "corr_detail", "{v:.3f}"), (*CRYO, OURS, "seconds", "({v:.0f} s)")],
     [(*CRYO, COV, "corr_detail", "ASPIRE DenoiserCov2D {v:.3f}"),
      (*CRYO, COV, "seconds", "({v:.0f} s)")]),
    ("The same: each image's 10 nearest neighbours", "share within 10° of the view (seconds)",
     "cryo-em-with-a-ctf-against-aspire-s-denoiser",
     [(*CRYO, OURS, "nbr10", "{v:.3f}"),
      (*CRYO, OURS, "seconds", "({v:.0f} s, with the averages)")],
     [(*CRYO, RIR + " (phase-flipped)", "nbr10", "ASPIRE RIRClass2D {v:.3f}"),
      (*CRYO, RIR + " (phase-flipped)", "seconds_neighbors", "({v:.0f} s)")]),
    ("Counting clusters: 150 sets of copies at any angle, shapes drawn after the design",
     "sets with the exact count and ARI >= 0.95 (largest count error)", "how-many-clusters",
     [("count_draws_seed191_kept_refined", COUNT, "`n_clusters=None`", ALL, "{v}")],
     [("count_draws_seed191_kept_refined", COUNT, "HDBSCAN on `invariant_distances`", ALL,
       "HDBSCAN on the invariant distances {v};"),
      ("count_draws_seed191_kept_refined", COUNT, "Leiden (modularity) on the kNN graph", ALL,
       "Leiden on the samples' graph {v}")]),
    ("Aligning image pairs (36 rot x 1 shifts)", "pairs per second", "alignment-search",
     [(*AL, "ours, the same pairs", "pairs/s", "{v:.2g}"),
      (*AL, "ours, the same pairs", "speed-up", "({v};"),
      (*AL, "ours, 1000 x 1000 pairs", "pairs/s", "{v:.2g} at scale)")],
     [(*AL, "kornia, one pair at a time", "pairs/s", "kornia, one pair at a time: {v:.2g}")]),
]


def _figure(found, name, data, method, metric, template):
    for row in rows(found[name][1]) if name in found else []:
        if (row["data"], row["method"], row["metric"]) == (data, method, metric):
            return template.format(v=row["value"]), row
    raise LookupError(f"no table {name!r} with the row {data!r} / {method!r} / {metric!r}")


def headline(results_dirs=RESULTS) -> str:
    """The README's table of headline figures, each linked to its JSON and the docs page."""
    found = tables(results_dirs)
    lines = ["| task | measure | invariant_cluster | baselines | data (measured) | details |",
             "| --- " * 6 + "|"]
    for task, measure, anchor, ours, theirs in HEADLINE:
        try:
            a = [_figure(found, *f) for f in ours]
            b = [_figure(found, *f) for f in theirs]
        except LookupError as exc:
            print(f"headline: {exc}", file=sys.stderr)
            continue
        (rel, run), row = found[ours[0][0]][0], a[0][1]
        link = f"[`{Path(rel).name}`]({rel})" + ("" if run == "default" else f" run `{run}`")
        lines.append(" | ".join([f"| {task}", measure, " ".join(t for t, _ in a),
                                 " ".join(t for t, _ in b), f"{link} ({row['date']}, "
                                 f"{row['machine']})", f"[benchmarks]({DOCS_PAGE}#{anchor}) |"]))
    return "\n".join(lines)


def blocks(results_dirs=RESULTS) -> dict[str, str]:
    out = {name: markdown(src, r) for name, (src, r) in tables(results_dirs).items()}
    out["headline"] = headline(results_dirs)
    return out


def update(path, results_dirs=RESULTS) -> list[str]:
    """Rewrite each marked block of the markdown file ``path``; return the names rewritten."""
    text, done, made = Path(path).read_text(), [], blocks(results_dirs)
    for name in dict.fromkeys(re.findall(r"<!-- bench:([\w-]+) -->", text)):
        if (block := made.get(name)) is None:
            print(f"{path}: no table for the block {name!r}", file=sys.stderr)
            continue
        pattern = re.compile(rf"(<!-- bench:{name} -->\n).*?(\n<!-- /bench:{name} -->)", re.S)
        text = pattern.sub(lambda m, b=block: m.group(1) + b + m.group(2), text)
        done.append(name)
    Path(path).write_text(text)
    return done


def write_includes(target, results_dirs=RESULTS) -> list[str]:
    """Write ``target/bench_NAME.inc`` for every table, only where its text changed (Sphinx
    then rebuilds only what moved); return the names."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    found = tables(results_dirs)
    for name, (src, result) in found.items():
        text, inc = rst(src, result), target / f"bench_{name}.inc"
        if not inc.exists() or inc.read_text(encoding="utf-8") != text:
            inc.write_text(text, encoding="utf-8")
    return list(found)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", nargs="+", default=RESULTS, help="folders of the JSON files")
    p.add_argument("--update", nargs="+", metavar="FILE", help="markdown files to rewrite")
    p.add_argument("--rst", metavar="DIR", help="write the includes bench_NAME.inc into DIR")
    args = p.parse_args(argv)
    if args.rst:
        print(f"wrote {len(write_includes(args.rst, args.results))} includes into {args.rst}")
    for path in args.update or []:
        print(f"updated {path}: {', '.join(update(path, args.results)) or 'nothing'}")
    if not (args.rst or args.update):
        print("\n\n".join(blocks(args.results).values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
