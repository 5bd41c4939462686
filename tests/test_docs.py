"""The documentation: the API page lists every public name, and the site builds without warnings.

The build (``sphinx-build -W -b html docs docs/_build/html``, which also executes the gallery in
``examples/``) is marked ``docs``; ``pytest -m "not docs"`` leaves it out.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PUBLIC_MODULES = ["transforms", "ctf", "alignment", "barycenters", "cluster", "decomposition",
                  "attention", "diagnostics", "datasets", "metrics", "neighbors", "plotting",
                  "steerable"]


def _documented() -> tuple[set[str], set[str]]:
    """Fully qualified names in api.rst's autosummary lists, and the modules given sections."""
    names, modules, current = set(), set(), "invariant_cluster"
    lines = (DOCS / "api.rst").read_text().splitlines()
    in_list = False
    for line in lines:
        m = re.match(r"\.\. currentmodule:: ([\w.]+)", line)
        if m:
            current = m.group(1)
            modules.add(current)
            continue
        if line.startswith(".. autosummary::"):
            in_list = True
            continue
        if in_list:
            entry = re.match(r"   ([A-Za-z_][\w.]*)\s*$", line)
            if entry:
                names.add(f"{current}.{entry.group(1)}")
            elif line.strip() and not line.startswith("   :"):
                in_list = False
    return names, modules


def test_api_page_lists_every_public_name():
    import invariant_cluster

    names, modules = _documented()
    missing = []
    for name in invariant_cluster.__all__:
        if name == "__version__":
            continue
        obj = getattr(invariant_cluster, name)
        if isinstance(obj, types.ModuleType):
            if obj.__name__ not in modules:
                missing.append(f"a section for {obj.__name__}")
        elif f"invariant_cluster.{name}" not in names:
            missing.append(f"invariant_cluster.{name}")
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(f"invariant_cluster.{modname}")
        for name in module.__all__:
            obj = getattr(module, name)
            top = getattr(invariant_cluster, name, None) if name in invariant_cluster.__all__ \
                else None
            if f"{module.__name__}.{name}" not in names and not (
                    top is obj and f"invariant_cluster.{name}" in names):
                missing.append(f"{module.__name__}.{name}")
    assert not missing, f"docs/api.rst does not list: {missing}"


def test_every_gallery_example_has_a_title_and_is_linked_from_notebooks_page():
    examples = sorted((ROOT / "examples").glob("plot_*.py"))
    assert len(examples) >= 5
    for path in examples:
        text = path.read_text()
        assert text.startswith('"""\n'), f"{path.name}: sphinx-gallery needs a docstring title"
    notebooks = (DOCS / "notebooks.rst").read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert nb.name in notebooks, f"docs/notebooks.rst does not mention {nb.name}"


def test_index_quick_start_is_the_readme_one():
    """The home page shows the README's quick start (which tests/test_readme.py runs)."""
    import textwrap

    readme = (ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    code = re.findall(r"```python\n(.*?)```", readme, re.S)[0]
    index = (DOCS / "index.rst").read_text().split("Quick start\n=", 1)[1]
    block = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", index).group(1)
    assert textwrap.dedent(block).strip() == code.strip()


def test_benchmark_tables_come_from_committed_json(tmp_path):
    """Every benchmark include names a committed JSON file's run, and the generator writes it."""
    import importlib.util

    pages = [p for p in DOCS.rglob("*.rst") if "_build" not in p.parts]
    names = {m for p in pages
             for m in re.findall(r"\.\. include:: /_generated/bench_([\w-]+)\.inc", p.read_text())}
    assert {"clustering", "noise", "cryoem", "count", "scaling"} <= names
    spec = importlib.util.spec_from_file_location(
        "make_tables", ROOT / "benchmarks" / "make_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    # NAME is a committed run: benchmarks/results/FILE.json, run default (NAME = FILE) or RUN
    # (NAME = FILE_RUN), or a reproduction's under examples/reproductions/results
    assert not names - set(tables.tables())
    written = set(tables.write_includes(tmp_path))
    assert names <= written
    assert "2 CPU cores" in (tmp_path / "bench_clustering.inc").read_text()
    # the JSON's notes are dated by the JSON's date and machine, not by a round of work
    assert not [p.name for p in tmp_path.glob("*.inc")
                if re.search(r"\bsessions?\b", p.read_text(), re.I)]
    assert "benchmarks" in (DOCS / "index.rst").read_text().split(".. toctree::", 1)[1]


@pytest.mark.docs
def test_sphinx_build_without_warnings():
    pytest.importorskip("sphinx")
    pytest.importorskip("pydata_sphinx_theme")
    pytest.importorskip("numpydoc")
    pytest.importorskip("sphinx_gallery")
    env = dict(os.environ, MPLBACKEND="Agg")
    cmd = [sys.executable, "-m", "sphinx", "-W", "-b", "html", "docs", "docs/_build/html"]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    html = DOCS / "_build" / "html"
    for page in ("index.html", "api.html", "auto_examples/index.html",
                 "auto_examples/plot_figure2_invariant_attention.html",
                 "generated/invariant_cluster.InvariantAttentionClusterer.html"):
        assert (html / page).is_file(), page
    # the gallery pages show the figures their scripts drew
    gallery = (html / "auto_examples" / "plot_rotated_mnist.html").read_text()
    assert gallery.count("sphx_glr_plot_rotated_mnist_") >= 4
