"""Keep scikit-learn-style prose such as "the fitted n_clusters_" from breaking the build.

In reStructuredText a word ending in ``_`` is a hyperlink reference, so a docstring that
mentions a fitted attribute outside double backticks ("n_clusters_ clusters") fails a
``-W`` build with "Unknown target name". Before numpydoc parses a docstring, this hook escapes
the trailing underscore of such words (``n_clusters\\_``, rendered as written) everywhere except
inside inline literals and roles, and except on numpydoc's parameter header lines
("labels_ : ndarray of shape (n_clusters_,)"), where only the type after " : " is escaped
and numpydoc reads the name itself.
"""

from __future__ import annotations

import re

_CODE = re.compile(r"(``.*?``|:\w+:`[^`]*`|`[^`]*`_?)")
_WORD = re.compile(r"(?<![\w\\])([A-Za-z][A-Za-z0-9_]*?)_(?=$|[\s.,;:)\]'\"])")
_HEADER = re.compile(r"^\s*\*{0,2}[A-Za-z_][\w]*(\s*,\s*\*{0,2}[A-Za-z_]\w*)*\s*(:\s.*|:)?$")


def escape_trailing_underscores(line: str) -> str:
    """Escape ``word_`` outside inline literals and roles; on header lines only in the type."""
    if _HEADER.match(line):
        name, sep, kind = line.partition(" : ")
        return name + sep + escape_trailing_underscores(kind) if sep else line
    parts = _CODE.split(line)
    return "".join(p if i % 2 else _WORD.sub(r"\1\\_", p) for i, p in enumerate(parts))


def _process(app, what, name, obj, options, lines):
    lines[:] = [escape_trailing_underscores(line) for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _process, priority=100)  # before numpydoc (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
