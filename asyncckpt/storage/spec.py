"""The Level-2 grammar: what a user may write as ``storage=`` (None, "dram", a path, a backend,
a list of tiers; a private directory per MPI rank) and the backends it opens; backends rebuilt
from their config dicts."""
from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._memory.numa import check_node
from ..errors import InvalidTypeError, InvalidValueError
from .base import Storage, WrapperStorage
from .compressed import CompressedStorage
from .files import FileStorage
from .kept import ram_backed
from .memory import HostMemoryStorage, PinnedMemoryStorage
from .tiered import TieredStorage

__all__ = ["from_config", "in_host_memory", "level2_spec", "names_host_memory", "open_level2",
           "open_storage", "per_rank"]


def _backends() -> dict[str, type[Storage]]:
    """Every concrete Storage subclass defined so far, by class name (the first one wins)."""
    found: dict[str, type[Storage]] = {}
    pending: list[type[Storage]] = list(reversed(Storage.__subclasses__()))
    while pending:
        sub = pending.pop()
        if not getattr(sub, "__abstractmethods__", None):
            found.setdefault(sub.__name__, sub)
        pending.extend(reversed(sub.__subclasses__()))
    return found


def from_config(config: dict[str, Any]) -> Storage:
    """Rebuild a backend from its ``get_config()`` dict: ``config["name"]`` names the class
    (any Storage subclass defined in the process), the other items are its keyword arguments.

    Raises
    ------
    InvalidValueError
        If ``config["name"]`` is not a backend's name.
    """
    backends = _backends()
    name = config.get("name")
    if name not in backends:
        raise InvalidValueError(f"config name {name!r} is not a storage backend; expected one of "
                                f"{', '.join(sorted(backends))}")
    backend: type[Any] = backends[str(name)]
    return backend(**{k: v for k, v in config.items() if k != "name"})


def open_storage(storage: Any, device: Any = None) -> tuple[Storage, bool]:
    """Resolve a Level-2 spec: None or "dram" (any case) for host DRAM (page-locked, a
    :class:`PinnedMemoryStorage`, where Level-1 is a ``device``), a path for a
    :class:`FileStorage` with a nameless file under it, a :class:`Storage` instance, or a list
    or tuple of those: tiers, fastest first, as one :class:`TieredStorage` (a list of one is
    that one tier).

    Returns
    -------
    (Storage, bool)
        The backend, and whether this call made it (and so whoever called must close it; a
        TieredStorage made here closes only the tiers made here).

    Raises
    ------
    InvalidTypeError
        If ``storage`` is none of those.
    """
    if isinstance(storage, (list, tuple)):
        if not storage:
            raise InvalidValueError("storage is an empty list; expected tiers, fastest first, "
                                    "such as ['dram', '/scratch']")
        opened: list[tuple[Storage, bool]] = []
        try:
            for spec in storage:
                if isinstance(spec, (list, tuple)):
                    raise InvalidTypeError(f"storage tiers cannot nest, got {spec!r}")
                opened.append(open_storage(spec, device))
        except BaseException:
            for tier, owned in opened:
                if owned:
                    tier.close()
            raise
        if len(opened) == 1:
            return opened[0]
        return TieredStorage([t for t, _ in opened], owned=[o for _, o in opened]), True
    if storage is None or (isinstance(storage, str) and storage.strip().lower() == "dram"):
        return (HostMemoryStorage() if device is None else PinnedMemoryStorage(device)), True
    node = numa_node(storage)
    if node is not None:  # a node's memory is bound, not page-locked, whatever Level-1 is
        return HostMemoryStorage(node), True
    if isinstance(storage, (str, os.PathLike)):
        return FileStorage(level2_path(storage)), True
    if isinstance(storage, Storage):
        return storage, False
    raise InvalidTypeError(
        f"storage must be None or 'dram' (host DRAM), 'numa:N' (NUMA node N's memory), a path, "
        f"an asyncckpt.storage.Storage instance, or a list of those (tiers); got "
        f"{type(storage).__name__}")


_NUMA = re.compile(r"\s*numa:(.*)", re.IGNORECASE)


def numa_node(spec: Any) -> int | None:
    """The node N of a ``"numa:N"`` tier (any case), or None for any other spec.

    Raises
    ------
    InvalidValueError
        For ``"numa:"`` followed by anything but a node number.
    """
    match = _NUMA.fullmatch(spec) if isinstance(spec, str) else None
    if match is None:
        return None
    text = match.group(1).strip()
    if not text.isdigit():
        raise InvalidValueError(f"storage={spec!r} is not a NUMA tier; expected 'numa:N' with N "
                                "a node number, such as 'numa:1' (python -m asyncckpt nodes "
                                "lists them)")
    return check_node(int(text), f"storage={spec!r}")


#: words that read as a kind of memory, not a directory: refused as paths, with the spelling
#: that means host DRAM
_MEMORY_WORDS = ("ram", "mem", "memory", "host", "dram", "hostmemory", "cpu")


def level2_path(storage: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``storage=`` as a directory: ``~`` and environment variables expanded, and a bare word
    that names no existing directory refused (``"ram"`` would otherwise become a directory
    under the current one).

    Raises
    ------
    InvalidValueError
        For an undefined environment variable, or a bare word that is not a directory here.
    """
    if not isinstance(storage, str):
        return storage
    text = os.path.expanduser(os.path.expandvars(storage.strip()))
    if "$" in text:
        raise InvalidValueError(f"storage={storage!r} names an environment variable that is not "
                                "set; set it, or give the directory itself")
    if os.sep not in text and not os.path.isdir(text):
        hint = ("'dram' (host DRAM)" if text.lower().replace("_", "") in _MEMORY_WORDS
                else f"'./{text}' to make that directory here")
        raise InvalidValueError(
            f"storage={storage!r} is neither a backend's name nor an existing directory; "
            f"accepted: None or 'dram' (host DRAM), a path to a directory (a ramdisk or an "
            f"SSD), a Storage, or a list of those; did you mean {hint}?")
    return text


def per_rank(storage: Any, rank: int) -> Any:
    """A Level-2 spec with every path replaced by a private directory of this rank under it
    (``rank00003``); "dram", "numa:N", None and Storage objects stay as they are."""
    if isinstance(storage, Sequence) and not isinstance(storage, str):
        return [per_rank(tier, rank) for tier in storage]
    if _in_memory(storage):
        return storage
    if isinstance(storage, (str, Path)) or hasattr(storage, "__fspath__"):
        return Path(storage) / f"rank{rank:05d}"
    return storage


def _holds_memory(spec: Any) -> bool:
    """Whether one tier's spec keeps states in host memory: by name, a backend that holds
    process memory, or a directory on a RAM-backed filesystem."""
    if isinstance(spec, Storage):
        return spec.holds_process_memory
    if isinstance(spec, (str, os.PathLike)) and not _in_memory(spec):
        return ram_backed(os.path.realpath(level2_path(spec)))
    return _in_memory(spec)


def _only_memory(spec: Any) -> bool:
    """Whether every tier of one spec keeps states in host memory (a tiered backend's
    every tier)."""
    if isinstance(spec, Storage) and spec.tiers is not None:
        return all(_holds_memory(tier) for tier in spec.tiers)
    return _holds_memory(spec)


def _in_memory(spec: Any) -> bool:
    """Whether one tier's spec is host memory by name: None, "dram" or "numa:N" (any case)."""
    return (spec is None or (isinstance(spec, str) and spec.strip().lower() == "dram")
            or numa_node(spec) is not None)


def names_host_memory(storage: Any) -> bool:
    """Whether ``storage=`` puts Level-2 in host memory by name: None, "dram", "numa:N", or
    tiers of which one is (the memory a default bound must cover where no budget is given)."""
    if isinstance(storage, (list, tuple)):
        return any(_in_memory(spec) for spec in storage)
    return _in_memory(storage)


def in_host_memory(storage: Any) -> bool:
    """Whether ``storage=`` puts Level-2, or a tier of it, in host memory: by name (see
    :func:`names_host_memory`), a backend that holds this process's memory (a
    ``HostMemoryStorage`` built by the user, alone or as a tier), or a directory on a
    RAM-backed filesystem (tmpfs, ramfs): what the default bound covers where no budget is
    given."""
    if isinstance(storage, (list, tuple)):
        return any(_holds_memory(spec) for spec in storage)
    return _holds_memory(storage)


def level2_spec(storage: Any, bounded: bool, *, by_default: bool = False) -> Any:
    """``storage=`` as given, or where a memory budget bounds Level-2 and none is given, host
    DRAM up to the budget and the temporary directory beyond it. ``by_default``: the bound is
    the default one (no budget was given), and host memory alone (``"dram"``, ``"numa:N"``,
    a backend in memory, a tmpfs directory, or tiers of them only: the first kept) spills
    there too: the user asked for no limit, the default bound sets one."""
    tiers = list(storage) if isinstance(storage, (list, tuple)) else [storage]
    alone = bool(tiers) and all(_only_memory(spec) for spec in tiers)
    if bounded and (storage is None or (by_default and alone)):
        return ["dram" if tiers[0] is None else tiers[0], tempfile.gettempdir()]
    return storage


def open_level2(storage: Any, device: Any = None, *, bounded: bool = False,
                codec: Any = None) -> tuple[Storage, bool]:
    """:func:`open_storage` for a checkpointer. ``bounded``: a memory budget bounds what Level-2
    keeps in process memory, so a backend in process memory (whatever its class: a wrapper
    around DRAM too) becomes a tier of its own whose bytes the budget can limit (see
    :func:`memory_tier`). ``codec``: states are compressed in front of it all (a
    :class:`CompressedStorage`, which closes what it wraps where this call opened it)."""
    opened, owned = open_storage(storage, device)
    if bounded and opened.tiers is None and opened.holds_process_memory:
        opened, owned = TieredStorage([opened], owned=[owned]), True
    if codec is not None:
        opened = CompressedStorage(opened, codec, close_inner=owned)
    return opened, owned


def tiers_of(storage: Storage) -> list[Storage]:
    """The backends ``storage`` places states on, fastest first (itself, for one device)."""
    tiers = storage.tiers
    return [storage] if tiers is None else list(tiers)


def remove_directories(storage: Storage) -> None:
    """Remove the directories the files of ``storage`` (each tier's, within wrappers) were
    given where missing, each once empty, touching nothing a call may still use: their files
    have no name there (see :meth:`FileStorage.remove_directories`)."""
    for tier in tiers_of(storage):
        while isinstance(tier, WrapperStorage):
            tier = tier.inner
        if isinstance(tier, FileStorage):
            tier.remove_directories()


def memory_tier(storage: Storage) -> int | None:
    """Which of :func:`tiers_of` keeps its states in this process's memory (the first such), or
    None."""
    return next((index for index, tier in enumerate(tiers_of(storage))
                 if tier.holds_process_memory), None)
