"""Exactness from the source: a state's checksum is taken where it is staged and every later
copy (a retried write included) is checked against it; arrays that cannot be copied as bytes
or written back are refused at construction; a forward step that does not replay (rebound
arrays, hidden state) is caught before a gradient returns."""
from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import (AsyncCheckpointer, FileStorage, HostMemoryStorage, TieredStorage,
                       TransferError)
from asyncckpt.compat import Revolver
from workloads import Forward, RecurrentCell, Reverse, forward_reverse, store_all_reference

pytestmark = pytest.mark.timeout(60)

N, INTERVAL, SLOTS = 40, 4, 2


class DamageThenRaise:
    """A backend whose ``put`` number ``at`` (1-based) writes into its input and then raises."""

    def __init__(self, *args, at: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.at, self.puts = at, 0

    def put(self, key: int, buf: np.ndarray) -> None:
        self.puts += 1
        if self.puts == self.at:
            buf[: buf.nbytes // 2] ^= 0x5A
            raise OSError(errno.EIO, "Input/output error after a partial write")
        super().put(key, buf)


class DamagingMemory(DamageThenRaise, HostMemoryStorage):
    """DRAM Level-2 whose third put damages its input and fails."""


class DamagingFile(DamageThenRaise, FileStorage):
    """File Level-2 whose third put damages its input and fails."""


def _storages(disk: Path) -> dict:
    return {
        "memory": lambda at: DamagingMemory(at=at),
        "file": lambda at: DamagingFile(disk, at=at),
        "tiers": lambda at: TieredStorage([HostMemoryStorage(), DamagingFile(disk, at=at)],
                                          capacities=[3, None]),
    }


def _driver(model, storage, compat: bool, **options):
    if compat:
        return Revolver(model, Forward(model), Reverse(model), SLOTS, N, storage=storage,
                        interval=INTERVAL, **options)
    return AsyncCheckpointer(model, Forward(model), Reverse(model), N, l1_slots=SLOTS,
                             interval=INTERVAL, storage=storage, **options)


@pytest.mark.parametrize("where", ["memory", "file", "tiers", "compat"])
@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize("verify", [True, False])
def test_a_put_that_damages_its_buffer_then_fails_is_never_stored_under_a_good_checksum(
        disk_dir: Path, where: str, at: int, verify: bool) -> None:
    model = RecurrentCell(N)
    reference = store_all_reference(model)
    storage = _storages(disk_dir)["memory" if where == "compat" else where](at)
    with _driver(model, storage, where == "compat", verify=verify,
                 on_level2_error="recompute") as ckp:
        try:
            got = forward_reverse(model, ckp)
        except TransferError:
            assert at == 1 and where != "tiers"  # u_0: nothing earlier can rebuild it
            return
        finally:
            ckp.close()
            storage.close()
        assert (ckp.checkpointer if where == "compat" else ckp).stats.l2_failures >= 1
    for mine, want in zip(got, reference):
        assert mine.tobytes() == want.tobytes()
