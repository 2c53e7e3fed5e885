"""NUMA nodes through libnuma (ctypes): the nodes that hold memory, their sizes, and a mapping
bound to one node with ``mbind`` before its first touch, so that every page it faults in comes
from that node (docs/numa.md).

libnuma is loaded by its soname (``libnuma.so.1``, what the runtime package installs; the
``libnuma.so`` link comes only with the development package) at the first use, never at
import: a run that names no node needs neither libnuma nor a NUMA machine. Through ctypes,
not a binding from the package index: numa 1.4.6, python-numa 0.5, py-libnuma 1.2 and
python3-libnuma 2.3.2 saw their last releases between 2018 and 2021; npynuma 0.1.0 (alpha) is
a C extension built against libnuma's development headers that allocates arrays of its own
(``numa_alloc_onnode``), outside the mappings, huge-page advice and pool every other buffer
here comes from; pyhwloc 3.0.1 needs Python 3.12 and hwloc. Four libnuma calls are all this
needs (``mbind``, ``get_mempolicy``, ``numa_available``, ``numa_node_size64``).
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import threading
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..errors import InvalidTypeError, InvalidValueError

__all__ = ["NodeMemory", "bind", "check_node", "distances", "hwloc_tiers", "kernel_tiers",
           "memory_nodes", "node_memory", "node_of", "node_of_buffer", "parse_node_list"]

#: where the kernel lists the nodes
SYSFS = Path("/sys/devices/system/node")
#: mbind's mode: pages come from the nodes of the mask alone (set_mempolicy(2))
MPOL_BIND = 2
#: get_mempolicy's flag: the policy of the mapping at an address, not of the thread
MPOL_F_ADDR = 2
#: bits of the node masks passed to the kernel (1024 nodes: more than any machine has)
_MASK_BITS = 1024
_WORD_BITS = 8 * ctypes.sizeof(ctypes.c_ulong)

#: whether a mapping of this process has been bound (until then no buffer needs asking)
_bound = threading.Event()


def parse_node_list(text: str) -> list[int]:
    """The nodes of a kernel node list such as ``"0-1,4"`` (sysfs's format)."""
    nodes: list[int] = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            nodes.extend(range(int(first), int(last or first) + 1))
    return nodes


def memory_nodes() -> list[int]:
    """The NUMA nodes that hold memory, as the kernel lists them (``[0]`` where it lists none:
    a kernel built without NUMA has one node)."""
    try:
        return parse_node_list((SYSFS / "has_memory").read_text()) or [0]
    except OSError:
        return [0]


#: libnuma's soname since version 2.0 (2008)
LIBNUMA = "libnuma.so.1"


@functools.cache
def _libnuma(name: str = LIBNUMA) -> Any:
    """libnuma (``name``), loaded once, with the signatures used here; raise where it is
    missing or the kernel has no NUMA support."""
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise InvalidValueError(
            f"binding memory to a NUMA node needs libnuma ({name}), which is not installed "
            f"(apt-get install libnuma1, dnf install numactl-libs); this machine's nodes "
            f"with memory: {_listed(memory_nodes())}") from None
    if lib.numa_available() < 0:
        raise InvalidValueError("libnuma says this kernel has no NUMA support (numa_available "
                                "returned -1); leave l1_node and 'numa:N' out here")
    mask = ctypes.POINTER(ctypes.c_ulong)
    lib.mbind.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, mask, ctypes.c_ulong,
                          ctypes.c_uint]
    lib.get_mempolicy.argtypes = [ctypes.POINTER(ctypes.c_int), mask, ctypes.c_ulong,
                                  ctypes.c_void_p, ctypes.c_ulong]
    lib.numa_node_size64.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_longlong)]
    lib.numa_node_size64.restype = ctypes.c_longlong
    return lib


def _listed(nodes: list[int]) -> str:
    return ", ".join(map(str, nodes))


def check_node(node: object, given: str) -> int:
    """``node`` as a NUMA node of this machine that holds memory, with libnuma loaded to bind
    to it; else raise naming what was ``given`` (``"l1_node=3"``) and the nodes there are."""
    if isinstance(node, bool) or not isinstance(node, int):
        raise InvalidTypeError(f"{given}: a NUMA node is a node number (an int), got {node!r}")
    nodes = memory_nodes()
    if node not in nodes:
        raise InvalidValueError(f"{given}: this machine has no NUMA node {node} with memory; "
                                f"its nodes: {_listed(nodes)} (python -m asyncckpt nodes)")
    _libnuma()
    return node


def bind(address: int, length: int, node: int) -> None:
    """Bind the pages of the mapping at ``address`` (page-aligned, ``length`` bytes) to
    ``node``: each is faulted in from that node, or the fault fails (MPOL_BIND), never
    silently elsewhere."""
    mask = (ctypes.c_ulong * (_MASK_BITS // _WORD_BITS))()
    mask[node // _WORD_BITS] = 1 << (node % _WORD_BITS)
    if _libnuma().mbind(address, length, MPOL_BIND, mask, _MASK_BITS, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mbind of {length} bytes to NUMA node {node} failed: "
                             f"{os.strerror(error)}")
    _bound.set()


def node_of(address: int) -> int | None:
    """The node the mapping at ``address`` is bound to (the lowest of its mask), or None where
    it follows the default policy; None without asking where no mapping was ever bound."""
    if not _bound.is_set():
        return None
    mode = ctypes.c_int()
    mask = (ctypes.c_ulong * (_MASK_BITS // _WORD_BITS))()
    if _libnuma().get_mempolicy(ctypes.byref(mode), mask, _MASK_BITS, address,
                                MPOL_F_ADDR) != 0 or mode.value != MPOL_BIND:
        return None
    for index, word in enumerate(mask):
        if word:
            return index * _WORD_BITS + (word & -word).bit_length() - 1
    return None


def node_of_buffer(buffer: Any) -> int | None:
    """:func:`node_of` the memory of ``buffer``, its address not asked for where no mapping
    was ever bound (``ndarray.ctypes`` costs microseconds, and stores ask for every state)."""
    return node_of(buffer.ctypes.data) if _bound.is_set() else None


@dataclass(frozen=True)
class NodeMemory:
    """One node's memory in bytes: all of it, what is free now, and what is available (free,
    and the page cache and kernel caches the kernel would reclaim for a fault there)."""

    node: int
    total: int
    free: int
    available: int


#: what a node's meminfo lists that the kernel can reclaim (``Shmem``, counted among the file
#: pages, cannot be)
_RECLAIMABLE = {"FilePages": 1, "SReclaimable": 1, "Shmem": -1}


def node_memory(node: int) -> NodeMemory:
    """``node``'s memory: its size and free bytes from libnuma (``numa_node_size64``), what is
    available from the kernel's meminfo of the node (the free bytes where it has none); on a
    machine of one node, at least the system's size and available memory."""
    free = ctypes.c_longlong()
    total = _libnuma().numa_node_size64(node, ctypes.byref(free))
    if total < 0:
        raise InvalidValueError(f"libnuma cannot size NUMA node {node}; this machine's nodes "
                                f"with memory: {_listed(memory_nodes())}")
    available = free.value
    try:
        for line in (SYSFS / f"node{node}" / "meminfo").read_text().splitlines():
            _, _, name, value, *_ = line.replace(":", " ").split() + ["", ""]
            available += _RECLAIMABLE.get(name, 0) * int(value or 0) * 1024
    except (OSError, ValueError):
        available = free.value
    if memory_nodes() == [node]:
        # the only node holds all memory; some virtual machines' node counts miss memory
        # added after boot, which the system's count has
        system = psutil.virtual_memory()
        total, available = max(total, system.total), max(available, system.available)
    return NodeMemory(node, int(total), int(free.value), max(int(free.value), available))


def kernel_tiers() -> dict[int, str]:
    """Each node's memory tier as the kernel ranks them for demotion (Linux 6.1 and later:
    ``memory_tier4`` for DRAM, higher numbers for slower memory); empty where it does not."""
    tiers: dict[int, str] = {}
    for tier in sorted(Path("/sys/devices/virtual/memory_tiering").glob("memory_tier*")):
        try:
            tiers.update(dict.fromkeys(parse_node_list((tier / "nodelist").read_text()),
                                       tier.name))
        except (OSError, ValueError):
            continue
    return tiers


def hwloc_tiers(lstopo: str = "lstopo-no-graphics") -> dict[int, str]:
    """Each node's kind and tier as hwloc 2.10 and later names them (``"HBM tier 0"``, from
    ``subtype`` and the ``MemoryTier`` info of its NUMANode objects); empty where ``lstopo``
    is not installed or names none."""
    path = shutil.which(lstopo)
    if path is None:
        return {}
    try:
        text = subprocess.run([path, "--of", "xml", "-"], capture_output=True, text=True,
                              timeout=30, check=True).stdout
        root = ElementTree.fromstring(text)
    except (OSError, subprocess.SubprocessError, ElementTree.ParseError):
        return {}
    names: dict[int, str] = {}
    for node in root.iter("object"):
        if node.get("type") != "NUMANode" or node.get("os_index") is None:
            continue
        infos = {info.get("name"): info.get("value") for info in node.iter("info")}
        words = [node.get("subtype") or "",
                 f"tier {infos['MemoryTier']}" if infos.get("MemoryTier") else ""]
        if any(words):
            names[int(str(node.get("os_index")))] = " ".join(w for w in words if w)
    return names


def distances(node: int) -> list[int]:
    """The kernel's distances from ``node`` to every node (10: local), or empty."""
    try:
        return [int(d) for d in (SYSFS / f"node{node}" / "distance").read_text().split()]
    except (OSError, ValueError):
        return []
