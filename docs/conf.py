"""Sphinx configuration for asyncckpt's documentation (``scripts/build_docs.sh`` builds it)."""
from __future__ import annotations

import importlib
import logging
import os
import sys
import types

# the packages from this checkout, not from an installed copy
sys.path.insert(0, os.path.abspath(".."))

import asyncckpt  # noqa: E402
from sphinx.ext.autodoc.mock import mock  # noqa: E402



def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # absent, or broken (a CuPy without its CUDA libraries)
        return False
    return True


#: the frameworks of the extras: the docs extra alone builds the site, their names mocked
#: where they do not import (the reference then reads the adapters' docstrings as written)
autodoc_mock_imports = [name for name in ("torch", "jax", "jaxlib", "cupy", "devito", "mpi4py")
                        if not _importable(name)]

project = "asyncckpt"
author = "the asyncckpt authors"
copyright = "2026, the asyncckpt authors"
release = asyncckpt.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
templates_path = ["_templates"]

# the reference: one page per public name, generated from the docstrings at build time
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"  # the numpydoc sections carry the types
autodoc_member_order = "bysource"
# numpydoc's own member tables would list each method a second time beside autosummary's
numpydoc_show_class_members = False
numpydoc_xref_param_type = False

# Every cross reference must resolve: a broken link in a docstring fails the build. The
# exceptions are classes named only in "Bases:" lines that have no page here: the standard
# library's (the build fetches no inventory from python.org) and the private bases of the
# pyrevolve compatibility layer.
nitpicky = True
nitpick_ignore = [
    ("py:class", "abc.ABC"),
    ("py:class", "enum.Enum"),
    ("py:class", "asyncckpt.compat.storage.Storage"),
    ("py:class", "asyncckpt.compat._levels._LeveledRevolver"),
    ("py:class", "schedules.classic.ClassicRevolveError"),
    ("py:class", "asyncckpt._lifetime.Closing"),
    ("py:class", "asyncckpt.storage.file_records.FileRecords"),
]

# the user guide: the Markdown pages of docs/, with GitHub's heading anchors (#a-heading-2026-11-26)
myst_heading_anchors = 4

html_theme = "pydata_sphinx_theme"
html_title = f"asyncckpt {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}

# The reference documents each public name where the user imports it, and several names are one
# object re-exported by two public modules (``asyncckpt.Storage`` is ``asyncckpt.storage.Storage``;
# the errors are in ``asyncckpt`` and ``schedules``). autodoc then notes the object's home
# (``asyncckpt.storage.base.Storage``) as a cross-reference alias on both pages, and Sphinx calls
# the second alias a duplicate; the warning has no type to suppress it by. Drop that warning
# only where the duplicated name is such a home, never a documented public name, so a name
# documented twice still fails the build.
REFERENCE_MODULES = ("asyncckpt", "asyncckpt.compat", "asyncckpt.torch", "asyncckpt.jax",
                     "asyncckpt.storage", "asyncckpt.compression", "asyncckpt.testing",
                     "schedules")


def _documented_names() -> set[str]:
    with mock(autodoc_mock_imports):
        return {f"{module}.{name}" for module in REFERENCE_MODULES
                for name in importlib.import_module(module).__all__}


class _ReExportAliases(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.documented = _documented_names()

    def filter(self, record: logging.LogRecord) -> bool:
        duplicate = str(record.msg).startswith("duplicate object description of %s")
        return not (duplicate and record.args and record.args[0] not in self.documented)


logging.getLogger("sphinx.sphinx.domains.python").addFilter(_ReExportAliases())


def _union_alias_doc(app, what, name, obj, options, lines) -> None:
    """A type alias such as ``schedules.Action`` (a union) has no docstring of its own, only
    ``types.UnionType``'s; take its ``#:`` comment from the module that defines its members."""
    if what != "data" or not isinstance(obj, types.UnionType):
        return
    from sphinx.pycode import ModuleAnalyzer

    home = obj.__args__[0].__module__
    comment = ModuleAnalyzer.for_module(home).find_attr_docs().get(("", name.rpartition(".")[2]))
    if comment:
        lines[:] = list(comment)


def setup(app) -> None:
    app.connect("autodoc-process-docstring", _union_alias_doc)
