"""The README's quick start runs as written, its links hold, and its headline table is generated."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _quick_start():
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "no ```python block under '## Quick start'"
    return blocks[0]


def test_quick_start_runs(monkeypatch, capsys):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    code = _quick_start()
    assert len(code.strip().splitlines()) <= 12
    namespace = {"__name__": "__readme__"}
    exec(compile(code, str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert out.strip()
    # what the prose under the code block says: five clusters, one per digit
    est = namespace["est"]
    assert est.n_clusters_ == 5
    labels = est.labels_.reshape(5, 12)
    assert all(len(set(row)) == 1 for row in labels)
    assert len({row[0] for row in labels}) == 5


def test_commands_and_links():
    text = README.read_text()
    assert "pip install -e . && invariant-cluster demo" in text
    assert 'pip install -e ".[dev]" && pytest' in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to a missing file: {target}"


def test_headline_table_is_generated_from_the_json():
    """The README keeps one generated table (the headline figures); the rest is in the docs."""
    import importlib.util

    text = README.read_text()
    assert text.count("<!-- bench:headline -->") == 1
    assert text.count("<!-- /bench:headline -->") == 1
    assert set(re.findall(r"<!-- bench:([\w-]+) -->", text)) == {"headline"}
    spec = importlib.util.spec_from_file_location(
        "make_tables", ROOT / "benchmarks" / "make_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    block = text.split("<!-- bench:headline -->\n", 1)[1].split("\n<!-- /bench:headline -->")[0]
    assert block == tables.headline(), \
        "out of date: python benchmarks/make_tables.py --update README.md"
    assert block.count("](benchmarks/results/") >= 5
    # every headline figure is read from a committed JSON: none of the rows was left out
    assert block.count("\n| ") == len(tables.HEADLINE) + 1


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 250


def test_no_internal_rounds_in_user_facing_text():
    """Figures are dated by date, machine, command and JSON, not by rounds of work."""
    pattern = re.compile(r"\bsessions?\b|\b(?:ninth|tenth|eleventh|twelfth)'s\b"
                         r"|(?<!PyTorch )\bissue \d+", re.I)
    paths = [README, *sorted((ROOT / "docs").rglob("*.rst")),
             *sorted((ROOT / "invariant_cluster").rglob("*.py"))]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in paths
            if "_build" not in p.parts and "generated" not in p.parts
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


def test_tables_script_updates_markers(tmp_path):
    """The script rewrites a marked block with the table of one JSON's rows (the schema: data,
    method, metric, value, machine, date), one line per method and one column per metric."""
    import json
    import subprocess
    import sys

    results = tmp_path / "results"
    results.mkdir()
    row = {"data": "rotated45 (n = 100)", "machine": "2 CPU cores", "date": "2026-01-02"}
    (results / "clustering.json").write_text(json.dumps({"benchmark": "clustering", "runs": {
        "default": {
            "benchmark": "clustering", "command": "python benchmarks/bench_clustering.py",
            "table": [{**row, "method": "k-means (pixels)", "metric": "ACC", "value": 0.5},
                      {**row, "method": "k-means (pixels)", "metric": "seconds", "value": 1.25},
                      {**row, "method": "invariant attention", "metric": "ACC", "value": 0.9}]},
        "quick": {"benchmark": "clustering", "table": [
            {**row, "method": "k-means (pixels)", "metric": "ACC", "value": 0.25}]}}}))
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- bench:clustering -->\nold\n<!-- /bench:clustering -->\nb\n"
                      "<!-- bench:clustering_quick -->\nold\n<!-- /bench:clustering_quick -->\n")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_tables.py"),
                           "--results", str(results), "--update", str(readme)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    new = readme.read_text()
    assert "old" not in new and new.startswith("a\n")
    assert "| method | ACC | seconds |" in new
    assert "| k-means (pixels) | 0.5 | 1.25 |" in new
    assert "| invariant attention | 0.9 |  |" in new
    assert "2 CPU cores, 2026-01-02" in new and "bench_clustering.py" in new
    # each run is a table of its own: NAME for the run "default", NAME_RUN for the others
    default, quick = new.split("<!-- bench:clustering_quick -->")
    assert "_From `benchmarks/results/clustering.json`._" in default and "0.25" not in default
    assert "_From `benchmarks/results/clustering.json`, run `quick`._" in quick
    assert "| k-means (pixels) | 0.25 |" in quick


def test_tables_script_is_short():
    lines = (ROOT / "benchmarks" / "make_tables.py").read_text().splitlines()
    assert len(lines) < 300
