"""Execute every notebook in ``notebooks/`` (in its own folder, kernel python3) with nbclient.

They run in the default ``pytest``; ``pytest -m "not notebook"`` leaves them out.
"""

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
TIMEOUT = 600  # seconds per cell; the notebooks together take a few minutes on 2 CPU cores


def test_notebooks_exist():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # the benchmarks' helpers and the library must not depend on the caller's threads setting
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name}: outputs must be stripped before committing"
    client = nbclient.NotebookClient(book, timeout=TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
