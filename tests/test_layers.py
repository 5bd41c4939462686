"""The package keeps the layers that ``docs/maintainers.rst`` lists: no import runs from a layer
up to a higher one, and no module imports one that imports it back. Imports are read from the
source (``ast``), those placed inside functions included."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "invariant_cluster"
PREFIX = "invariant_cluster"


def _modules():
    """``{dotted name: (path, is_package)}`` of every module of the package."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _imports(modules):
    """``{module: set of package modules it imports}``, from every import statement."""
    edges = {}
    for name, (path, is_package) in modules.items():
        here = name if is_package else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[:len(here.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # ``from . import x`` names the submodule x where there is one
                subs = [f"{target}.{alias.name}" for alias in node.names
                        if f"{target}.{alias.name}" in modules]
                found.update(subs or ([target] if target in modules else []))
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in modules)
        found.discard(name)
        edges[name] = found
    return edges


def _layers():
    """The layer list of ``docs/maintainers.rst``: one set of names per layer, top first."""
    text = (ROOT / "docs" / "maintainers.rst").read_text(encoding="utf-8")
    section = text.split("\nLayers\n======\n", 1)[1].split("\n\n``", 1)[0]
    items = re.split(r"\n#\. ", "\n" + section.split("\n#. ", 1)[1])
    return [set(re.findall(r"``([\w.]+)``", item)) for item in items if item.strip()]


def _layer_of(module, layers):
    """Index of the layer that names ``module`` or the package that holds it (the longest
    name wins); None when no layer names it."""
    rel = module[len(PREFIX) + 1:] if module != PREFIX else "__init__"
    best = None
    for i, names in enumerate(layers):
        for name in names:
            if (rel == name or rel.startswith(name + ".")) and (
                    best is None or len(name) > len(best[1])):
                best = (i, name)
    return None if best is None else best[0]


def test_the_layer_list_names_every_module_once():
    layers = _layers()
    assert len(layers) >= 5
    flat = [name for names in layers for name in names]
    assert len(flat) == len(set(flat)), "a module stands in two layers"
    missing = [m for m in _modules() if _layer_of(m, layers) is None]
    assert not missing, f"modules in no layer of docs/maintainers.rst: {missing}"


def test_no_import_runs_up_a_layer():
    layers = _layers()
    edges = _imports(_modules())
    upward = [f"{a} -> {b}" for a, targets in edges.items() for b in sorted(targets)
              if _layer_of(b, layers) < _layer_of(a, layers)]
    assert not upward, f"imports from a lower layer to a higher one: {upward}"


def _cycles(edges):
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert _cycles(_imports(_modules())) == []


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_the_circle_finder(edges, expected):
    assert _cycles(edges) == expected


def test_imports_inside_functions_are_read(tmp_path, monkeypatch):
    pkg = tmp_path / PREFIX
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from .high import g\n")
    (pkg / "high.py").write_text("from . import low\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", pkg)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    edges = _imports(_modules())
    assert edges[f"{PREFIX}.low"] == {f"{PREFIX}.high"}
    assert _cycles(edges) == [[f"{PREFIX}.high", f"{PREFIX}.low"]]
