"""Sphinx configuration: pydata-sphinx-theme, numpydoc, autosummary and sphinx-gallery.

Build with ``sphinx-build -W -b html docs docs/_build/html`` from the repository root (a warning
fails the build). The gallery in ``examples/`` is executed at every build.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Document (and run the gallery against) this checkout, not another installed copy.
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
os.environ.setdefault("MPLBACKEND", "Agg")

import invariant_cluster  # noqa: E402

project = "invariant_cluster"
author = "the invariant_cluster developers"
copyright = "the invariant_cluster developers"
version = release = invariant_cluster.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "bench_tables",  # docs/_ext: the benchmark tables from benchmarks/results/*.json
    "docstring_fixes",  # docs/_ext: fitted-attribute names such as ``labels_`` in prose
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "auto_examples/*.ipynb",
                    "auto_examples/*.py", "auto_examples/*.zip", "auto_examples/*.md5",
                    "auto_examples/*.codeobj.json"]
html_static_path = ["_static"]
html_css_files = ["custom.css"]

# -- API reference -----------------------------------------------------------------------------
autosummary_generate = True
autodoc_typehints = "none"            # the numpydoc sections carry the types
autodoc_inherit_docstrings = False    # no torch / scikit-learn docstrings on our overrides
autodoc_member_order = "bysource"
toc_object_entries_show_parents = "hide"  # the page's table of contents reads "fit", not "Cls.fit"
numpydoc_show_class_members = False   # the class template lists the methods itself
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# -- HTML --------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"invariant_cluster {release}"
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    # the API pages need the width for signatures more than a table of contents
    "secondary_sidebar_items": {"*": ["page-toc", "sourcelink"],
                                "user_guide/*": ["page-toc", "sourcelink"],
                                "auto_examples/*": ["page-toc", "sourcelink"],
                                "generated/*": []},
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
# no section navigation on the home page, the API index (its own table of contents groups the
# names by module) and the gallery's example pages (their code needs the width)
html_sidebars = {"index": [], "api": [], "auto_examples/plot_*": []}
html_show_sourcelink = True

# -- Gallery -----------------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",
    "doc_module": ("invariant_cluster",),
    "backreferences_dir": "generated/backreferences",
    "reference_url": {"invariant_cluster": None},
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "show_memory": False,
    "matplotlib_animations": False,
}
