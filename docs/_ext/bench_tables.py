"""The benchmark tables as reStructuredText includes, generated from the committed JSON.

At every build this extension writes ``docs/_generated/bench_NAME.inc`` for each run of
``benchmarks/results/*.json`` and ``examples/reproductions/results/*.json`` with
``benchmarks/make_tables.py`` (the one owner of the tables' layout; the README's headline table
comes from the same script), so a page shows the measured numbers without a typed copy that
could fall out of date. Pages use ``.. include:: /_generated/bench_NAME.inc`` (``NAME``: the
file's name, with ``_RUN`` for a run other than ``default``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "make_tables.py"


def _tables():
    spec = importlib.util.spec_from_file_location("make_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _on_builder_inited(app):
    _tables().write_includes(Path(app.srcdir) / "_generated")


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
