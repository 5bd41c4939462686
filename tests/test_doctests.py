"""Every ``Examples`` section of the public modules runs as a doctest.

One test per docstring that has examples, so a failure names the function. The examples must
be self-contained (no data files, no network) and quick; they run at the default parameters a
user would use.
"""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

MODULES = [
    "invariant_cluster",
    "invariant_cluster.transforms",
    "invariant_cluster.alignment",
    "invariant_cluster.barycenters",
    "invariant_cluster.steerable",
    "invariant_cluster.cluster",
    "invariant_cluster.decomposition",
    "invariant_cluster.attention",
    "invariant_cluster.diagnostics",
    "invariant_cluster.datasets",
    "invariant_cluster.metrics",
    "invariant_cluster.neighbors",
    "invariant_cluster.plotting",
]
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _public_objects(module):
    """The module itself and each object named in its ``__all__`` that it defines."""
    yield module.__name__, module
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name, None)
        if obj is None or isinstance(obj, type(module)):
            continue
        yield f"{module.__name__}.{name}", obj


def _collect():
    shallow = doctest.DocTestFinder(recurse=False, exclude_empty=True)
    deep = doctest.DocTestFinder(exclude_empty=True)  # a class: its methods too
    seen, cases = set(), []
    for modname in MODULES:
        module = importlib.import_module(modname)
        for qualname, obj in _public_objects(module):
            home = inspect.getmodule(obj) or module
            finder = deep if inspect.isclass(obj) else shallow
            for test in finder.find(obj, qualname, module=home, globs={}):
                key = (test.filename, test.lineno, test.name.rsplit(".", 1)[-1])
                if test.examples and key not in seen and id(test.docstring) not in seen:
                    seen.add(key)
                    seen.add(id(test.docstring))
                    cases.append(test)
    return cases


CASES = _collect()


def test_public_docstrings_have_examples():
    assert len(CASES) >= 20


@pytest.mark.parametrize("test", CASES, ids=[t.name for t in CASES])
def test_docstring_examples(test, torch_single_thread):
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    test.globs = {"__name__": "__doctest__"}
    try:
        runner.run(test, out=report.append)
    finally:
        plt.close("all")
    assert runner.failures == 0, "".join(report)
