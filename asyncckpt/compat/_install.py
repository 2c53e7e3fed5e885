"""The switch that runs programs written for pyrevolve on asyncckpt, unedited: after
:func:`install`, ``import pyrevolve`` (and its submodules ``storage``, ``compression``,
``profiling``, ``crevolve``, ``pyrevolve``) gives :mod:`asyncckpt.compat`."""
from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

__all__ = ["install", "uninstall", "ALIASES"]

#: pyrevolve's module names and the compat modules that stand for them.
ALIASES = {
    "pyrevolve": "asyncckpt.compat",
    "pyrevolve.pyrevolve": "asyncckpt.compat",
    "pyrevolve.storage": "asyncckpt.compat.storage",
    "pyrevolve.compression": "asyncckpt.compat.compression",
    "pyrevolve.profiling": "asyncckpt.compat.profiling",
    "pyrevolve.crevolve": "asyncckpt.compat.crevolve",
}

_displaced: dict[str, ModuleType] = {}


def install() -> ModuleType:
    """Make ``import pyrevolve`` give :mod:`asyncckpt.compat` in this process, and return it.

    Call it before anything imports pyrevolve (Devito imports it with ``import devito``): a
    module that already holds pyrevolve's names keeps them, so installing after pyrevolve was
    imported warns. Idempotent; :func:`uninstall` undoes it.
    """
    if "pyrevolve" in sys.modules and sys.modules["pyrevolve"].__name__ != ALIASES["pyrevolve"]:
        warnings.warn("asyncckpt.compat.install() after pyrevolve was imported: modules that "
                      "imported from it keep pyrevolve's classes; install before importing them",
                      RuntimeWarning, stacklevel=2)
    for name, target in ALIASES.items():
        module = sys.modules.get(name)
        if module is not None and module.__name__ != target:
            _displaced[name] = module
        sys.modules[name] = importlib.import_module(target)
    return sys.modules["pyrevolve"]


def uninstall() -> None:
    """Undo :func:`install`: ``import pyrevolve`` imports pyrevolve again (or what was imported
    before)."""
    for name, target in ALIASES.items():
        module = sys.modules.get(name)
        if module is not None and module.__name__ == target:
            del sys.modules[name]
    sys.modules.update(_displaced)
    _displaced.clear()
