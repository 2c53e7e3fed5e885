"""The API reference (docs/api/*.rst) lists every public name of the documented modules, so a
name added to an ``__all__`` cannot go without a page."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[1] / "docs" / "api"
# module -> the reference page that lists its names
PAGES = {
    "asyncckpt": "asyncckpt.rst",
    "asyncckpt.compat": "compat.rst",
    "asyncckpt.torch": "torch.rst",
    "asyncckpt.jax": "jax.rst",
    "asyncckpt.storage": "storage.rst",
    "asyncckpt.compression": "compression.rst",
    "asyncckpt.testing": "testing.rst",
    "schedules": "schedules.rst",
}


def autosummary_entries(page: Path) -> tuple[str | None, list[str]]:
    """The ``currentmodule`` of a reference page and the names in its autosummary tables."""
    text = page.read_text()
    module = re.search(r"^\.\. currentmodule:: (\S+)$", text, re.M)
    names = []
    for table in re.finditer(r"^\.\. autosummary::\n((?:[ \t]+.*\n|\n)*)", text, re.M):
        names += [line.strip() for line in table.group(1).splitlines()
                  if line.strip() and not line.strip().startswith(":")]
    return (module.group(1) if module else None), names


@pytest.mark.parametrize("module_name", sorted(PAGES))
def test_every_public_name_has_a_reference_entry(module_name):
    framework = {"asyncckpt.torch": "torch", "asyncckpt.jax": "jax.numpy"}.get(module_name)
    if framework is not None:
        pytest.importorskip(framework)
    module = importlib.import_module(module_name)
    current, listed = autosummary_entries(API / PAGES[module_name])
    assert current == module_name, f"{PAGES[module_name]} documents {current}, not {module_name}"
    missing = sorted(set(module.__all__) - set(listed))
    stale = sorted(set(listed) - set(module.__all__))
    assert not missing, f"docs/api/{PAGES[module_name]} lacks {', '.join(missing)}"
    assert not stale, f"docs/api/{PAGES[module_name]} lists {', '.join(stale)}, not in __all__"


def test_every_reference_page_is_in_the_index():
    index = (API / "index.rst").read_text()
    assert all(re.search(rf"^\s+{page[:-4]}$", index, re.M) for page in PAGES.values())


def public_members(module_name: str) -> list[tuple[str, object]]:
    """(qualified name, member) of each public method and property of the module's classes."""
    module = importlib.import_module(module_name)
    found = []
    for name in module.__all__:
        cls = getattr(module, name)
        if not inspect.isclass(cls):
            continue
        for attr, value in vars(cls).items():
            if attr.startswith("_") or not (callable(value) or isinstance(value, property)
                                            or isinstance(value, (staticmethod, classmethod))):
                continue
            found.append((f"{module_name}.{name}.{attr}", getattr(cls, attr)))
    return found


@pytest.mark.parametrize("module_name", sorted(PAGES))
def test_every_public_method_has_a_docstring(module_name):
    # 18 had none: compat's Profiler and CRevolve methods, MultiLevelRevolver.n_checkpoints,
    # jax's Plan.segments, schedules' EveryInterval and Replay methods, HRevolve.get_config
    framework = {"asyncckpt.torch": "torch", "asyncckpt.jax": "jax.numpy"}.get(module_name)
    if framework is not None:
        pytest.importorskip(framework)
    bare = [name for name, member in public_members(module_name) if not inspect.getdoc(member)]
    assert not bare, f"public methods without a docstring: {', '.join(bare)}"


def test_every_stats_field_has_an_entry_of_its_own():
    # each field documented by a #: comment is its own attribute entry, with an anchor
    # (asyncckpt.Stats.forward_steps), where an Attributes section rendered one table
    analyzer = pytest.importorskip("sphinx.pycode").ModuleAnalyzer.for_module("asyncckpt.stats")
    documented = {name for (cls, name), lines in analyzer.find_attr_docs().items()
                  if cls == "Stats" and "".join(lines).strip()}
    from asyncckpt import Stats
    fields = {f.name for f in dataclasses.fields(Stats)}
    assert fields - documented == set(), sorted(fields - documented)
