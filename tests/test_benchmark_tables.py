"""The benchmarks' tables: each script writes the rows that the committed JSON holds.

Every benchmark writes one JSON, its suites as runs, each with ``"table"``, rows of one schema
(data, method, metric, value, machine, date) that ``benchmarks/make_tables.py`` turns into the
README's and the documentation's tables. Applied to the records of a committed run, each
script's ``table_rows`` gives that run's table again, so a rerun writes the rows the pages and
the README's headline read.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
REPRODUCTIONS = ROOT / "examples" / "reproductions" / "results"
FIELDS = {"data", "method", "metric", "value", "machine", "date"}

# committed run (file, run) -> the script that writes it (and its table function)
WRITERS = {
    ("clustering", "default"): ("benchmarks/bench_clustering.py", "table_rows"),
    ("alignment", "default"): ("benchmarks/bench_alignment.py", "table_rows"),
    ("scaling", "default"): ("benchmarks/bench_scaling.py", "table_rows"),
    ("scaling", "fashion70k"): ("benchmarks/bench_scaling.py", "table_rows"),
    ("noise", "default"): ("benchmarks/bench_noise.py", "table_rows"),
    ("noise", "filter_10000"): ("benchmarks/bench_noise.py", "table_rows"),
    ("count", "default"): ("benchmarks/bench_count.py", "table_rows"),
    ("count", "draws_seed3"): ("benchmarks/bench_count.py", "table_rows"),
    ("count", "jitter"): ("benchmarks/bench_count.py", "table_rows"),
    ("count", "natural_2000"): ("benchmarks/bench_count.py", "table_rows"),
    ("gpu", "default"): ("benchmarks/bench_gpu.py", "table_rows"),
    ("large", "n1050000"): ("benchmarks/bench_large.py", "table_rows"),
    ("kpca_diagnostics", "default"): ("examples/reproductions/kpca_diagnostics.py", "table_rows"),
    ("rpc_robustness", "default"): ("examples/reproductions/rpc_robustness.py", "table_rows"),
    ("kpca_features", "default"): ("examples/reproductions/kpca_features.py", "table_rows"),
    ("kpca_features", "eigencheck"): ("examples/reproductions/kpca_features.py",
                                      "eigencheck_rows"),
}
_modules: dict = {}


def _module(path):
    if path not in _modules:
        full = ROOT / path
        for folder in (str(full.parent), str(ROOT / "benchmarks")):
            if folder not in sys.path:
                sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(f"_table_{full.stem}", full)
        _modules[path] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_modules[path])
    return _modules[path]


def _files():
    return sorted([*RESULTS.glob("*.json"), *REPRODUCTIONS.glob("*.json")])


@pytest.mark.parametrize("name, run", sorted(WRITERS))
def test_script_writes_the_committed_table(name, run):
    path = next(p for p in _files() if p.stem == name)
    result = json.loads(path.read_text())["runs"][run]
    script, function = WRITERS[name, run]
    rows = getattr(_module(script), function)({k: v for k, v in result.items() if k != "table"})
    assert rows == result["table"]


def test_one_json_per_benchmark_script():
    """Each result file is one benchmark's (or reproduction's): its runs, keyed by suite."""
    scripts = {p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py")}
    assert {p.stem for p in RESULTS.glob("*.json")} <= scripts
    reproductions = {p.stem for p in (ROOT / "examples" / "reproductions").glob("*.py")}
    assert {p.stem for p in REPRODUCTIONS.glob("*.json")} <= reproductions
    for path in _files():
        doc = json.loads(path.read_text())
        assert set(doc) == {"benchmark", "runs"} and doc["benchmark"] == path.stem, path.name
        assert doc["runs"] and all(isinstance(r, dict) for r in doc["runs"].values()), path.name


def test_every_table_row_has_the_schema():
    for path in _files():
        for run, result in json.loads(path.read_text())["runs"].items():
            table = result.get("table", [])
            assert all(set(row) == FIELDS for row in table), (path.name, run)
            assert all(isinstance(row["value"], (int, float, str)) for row in table), path.name


def test_write_json_updates_only_its_run(tmp_path, capsys):
    """A suite's rerun replaces its own run in the benchmark's file and keeps the others."""
    common = _module("benchmarks/_common.py")
    path = tmp_path / "count.json"
    env = {"cpu_count": 2, "date": "2026-01-02"}
    common.write_json({"benchmark": "count", "env": env, "rows": [{"n": 1, "acc": 0.5}]}, path,
                      run="jitter")
    common.write_json({"benchmark": "count", "env": env, "rows": [{"n": 2, "acc": 0.7}]}, path)
    common.write_json({"benchmark": "count", "env": env, "rows": [{"n": 2, "acc": 0.9}]}, path)
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "count" and list(doc["runs"]) == ["jitter", "default"]
    assert doc["runs"]["jitter"]["rows"] == [{"n": 1, "acc": 0.5}]
    assert doc["runs"]["default"]["rows"] == [{"n": 2, "acc": 0.9}]
    assert {r["value"] for r in doc["runs"]["default"]["table"]} == {0.9}
    assert "run 'default'" in capsys.readouterr().out
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"benchmark": "count", "rows": []}))
    with pytest.raises(ValueError, match="old.json.*'runs'"):
        common.write_json({"benchmark": "count", "rows": []}, old)
    with pytest.raises(ValueError, match="run"):
        common.write_json({"benchmark": "count", "rows": []}, path, run="")


def test_every_benchmark_script_uses_the_public_api_or_says_why():
    """No script imports a private module of the package, except the few named here."""
    allowed = {"bench_clustering.py", "bench_count.py", "bench_noise.py"}
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        text = path.read_text()
        private = "from invariant_cluster._" in text or "import invariant_cluster._" in text
        assert not private or path.name in allowed, path.name
    assert len(list((ROOT / "benchmarks").glob("*.py"))) <= 12
