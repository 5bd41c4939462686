"""The benchmarks' tables: each script writes the rows that the committed JSON holds.

Every benchmark writes its JSON with ``"table"``, rows of one schema (data, method, metric,
value, machine, date) that ``benchmarks/make_tables.py`` turns into the README's and the
documentation's tables. Applied to the records of its committed JSON, each script's
``table_rows`` gives that JSON's table again, so a rerun writes the rows the pages and the
README's headline read.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIELDS = {"data", "method", "metric", "value", "machine", "date"}

# committed JSON -> the script that writes it (and its table function)
WRITERS = {
    "clustering": ("benchmarks/bench_clustering.py", "table_rows"),
    "alignment": ("benchmarks/bench_alignment.py", "table_rows"),
    "scaling": ("benchmarks/bench_scaling.py", "table_rows"),
    "scaling_fashion70k": ("benchmarks/bench_scaling.py", "table_rows"),
    "noise": ("benchmarks/bench_noise.py", "table_rows"),
    "noise_filter_10000": ("benchmarks/bench_noise.py", "table_rows"),
    "count": ("benchmarks/bench_count.py", "table_rows"),
    "count_draws_seed3": ("benchmarks/bench_count.py", "table_rows"),
    "count_jitter": ("benchmarks/bench_count.py", "table_rows"),
    "count_natural": ("benchmarks/bench_count.py", "table_rows"),
    "gpu": ("benchmarks/bench_gpu.py", "table_rows"),
    "large_1050000": ("benchmarks/bench_large.py", "table_rows"),
    "kpca_diagnostics": ("examples/reproductions/kpca_diagnostics.py", "table_rows"),
    "rpc_robustness": ("examples/reproductions/rpc_robustness.py", "table_rows"),
    "kpca_features": ("examples/reproductions/kpca_features.py", "table_rows"),
    "kpca_invariant_eigencheck": ("examples/reproductions/kpca_features.py", "eigencheck_rows"),
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


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_script_writes_the_committed_table(name):
    result = json.loads((RESULTS / f"{name}.json").read_text())
    path, function = WRITERS[name]
    rows = getattr(_module(path), function)({k: v for k, v in result.items() if k != "table"})
    assert rows == result["table"]


def test_every_table_row_has_the_schema():
    for path in sorted(RESULTS.glob("*.json")):
        table = json.loads(path.read_text()).get("table", [])
        assert all(set(row) == FIELDS for row in table), path.name
        assert all(isinstance(row["value"], (int, float, str)) for row in table), path.name


def test_every_benchmark_script_uses_the_public_api_or_says_why():
    """No script imports a private module of the package, except the few named here."""
    allowed = {"bench_clustering.py", "bench_count.py", "bench_noise.py"}
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        text = path.read_text()
        private = "from invariant_cluster._" in text or "import invariant_cluster._" in text
        assert not private or path.name in allowed, path.name
    assert len(list((ROOT / "benchmarks").glob("*.py"))) <= 12
