"""The API reference (docs/api/*.rst) lists every public name of the documented modules, so a
name added to an ``__all__`` cannot go without a page."""
from __future__ import annotations

import importlib
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
