"""Turn the README's generated benchmark blocks into reStructuredText includes.

The README holds the benchmark tables between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``
markers (written from ``benchmarks/results/*.json`` by ``benchmarks/make_readme_tables.py``).
At every build this extension converts each block to ``docs/_generated/bench_NAME.inc`` (pipe
tables become ``list-table`` directives), so the user guide shows the same measured numbers as
the README without a copy that could fall out of date. Pages use
``.. include:: /_generated/bench_NAME.inc``.
"""

from __future__ import annotations

import re
from pathlib import Path

_BLOCK = re.compile(r"<!-- bench:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /bench:(?P=name) -->",
                    re.S)


def _inline(text: str) -> str:
    """Markdown inline markup -> reStructuredText (code, italics; bold is the same)."""
    # a whole-line italic note such as "_From `file.json`._": rst cannot nest code in emphasis
    text = re.sub(r"^_(.*)_(\.?)$", r"\1\2", text)
    text = re.sub(r"`([^`]+)`", r"``\1``", text)
    text = re.sub(r"(?<![\w*])_([^_]+?)_(?![\w])", r"*\1*", text)
    # a bare "|" would start a substitution reference; the README escapes it as "\|" already
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def _cells(line: str) -> list[str]:
    inner = line.strip()[1:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def markdown_block_to_rst(body: str) -> str:
    """Convert one README benchmark block (paragraphs and pipe tables) to rst."""
    out: list[str] = []
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
                out.append(f"   * - {_inline(row[0]) or '..'}")
                out += [f"     - {_inline(c) or '..'}" for c in row[1:]]
            out.append("")
            continue
        out.append(_inline(line))
        i += 1
    return "\n".join(out).strip() + "\n"


def write_includes(readme: Path, target: Path) -> list[str]:
    """Write ``target/bench_NAME.inc`` for every block in ``readme``; return the names."""
    target.mkdir(parents=True, exist_ok=True)
    names = []
    for match in _BLOCK.finditer(readme.read_text(encoding="utf-8")):
        name = match["name"]
        text = markdown_block_to_rst(match["body"])
        path = target / f"bench_{name}.inc"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        names.append(name)
    return names


def _on_builder_inited(app):
    src = Path(app.srcdir)
    write_includes(src.parent / "README.md", src / "_generated")


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
