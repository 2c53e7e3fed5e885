"""Every schedule yields, action for action, what it yielded before its generators were made
cheap (flattened, memoised splits, actions built without ``object.__setattr__``): the full
action lists of each family, for every n from 1 to 200, hashed and compared with the digests
recorded in ``action_digests.json`` from the code as it stood at commit 275032d.

The fast test covers every n up to 40 and a spread up to 200 (AsyncMultistage's family at
every interval up to 64); the slow one every n. To record
the digests again (only where a schedule is meant to change):
``python tests/test_schedules/test_actions_unchanged.py --record``.
"""
from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from schedules import (
    AsyncMultistage,
    Chen,
    EveryInterval,
    OnlineMultistage,
    Replay,
    Revolve,
)
from schedules.hrevolve import HRevolve, Level
from schedules.multistage import reverse_stored

DIGESTS = Path(__file__).with_name("action_digests.json")
TAPING = (True, False)
SLOTS = range(1, 7)


def revolve(n: int) -> Iterator[Iterable[object]]:
    for snaps in sorted({*SLOTS, max(1, n - 1), n, n + 1}):
        for taping in TAPING:
            yield Revolve(n, snaps, taping=taping)


def multistage(n: int) -> Iterator[Iterable[object]]:
    for interval in range(1, n + 1):
        for slots in SLOTS:
            for taping in TAPING:
                yield AsyncMultistage(n, interval, slots, taping=taping)


def chen(n: int) -> Iterator[Iterable[object]]:
    for segment in sorted({1, 2, 3, 5, max(1, n // 2), n} & set(range(1, n + 1))):
        for taping in TAPING:
            yield Chen(n, segment, taping=taping)
    for taping in TAPING:
        yield Chen(n, taping=taping)


def online(n: int) -> Iterator[Iterable[object]]:
    for interval in sorted({1, 2, 3, 5, 8, n}):
        for slots in (1, 2, 3, 6):
            for min_interval in (1, 2, 4):
                for taping in TAPING:
                    yield OnlineMultistage(slots, EveryInterval(interval), n_steps=n,
                                           min_interval=min_interval, taping=taping)
                yield OnlineMultistage(
                    slots, EveryInterval(interval, stop=lambda t: t >= n),
                    min_interval=min_interval, taping=slots % 2 == 0)


def replay(n: int) -> Iterator[Iterable[object]]:
    draw = random.Random(n)
    for _ in range(6):
        stores = [0] + sorted(draw.sample(range(1, n), draw.randint(0, min(n - 1, 12))))
        pauses = sorted(draw.sample(range(1, n + 1), draw.randint(0, min(n, 8))))
        for slots in (1, 3):
            for taping in TAPING:
                yield OnlineMultistage(slots, Replay(stores, n, pauses), n_steps=n,
                                       taping=taping)
                yield OnlineMultistage(slots, Replay(stores, n, pauses), taping=taping)


def stored(n: int) -> Iterator[Iterable[object]]:
    for interval in sorted({1, 2, 3, 7, n}):
        for snaps in (1, 2, 4, 7):
            for taping in TAPING:
                yield reverse_stored(range(0, n, interval), n, snaps, taping)


def hrevolve(n: int) -> Iterator[Iterable[object]]:
    for levels in ([Level(1)], [Level(3)], [Level(1, 0, 0), Level(4, 1, 1)],
                   [Level(2, 0.5, 0.5), Level(5, 3, 2)], [Level(0), Level(3, 0.1, 0.1)]):
        for taping in TAPING:
            yield HRevolve(n, levels, forward_cost=1, reverse_cost=2, taping=taping)


FAMILIES: dict[str, Callable[[int], Iterator[Iterable[object]]]] = {
    "revolve": revolve, "multistage": multistage, "chen": chen, "online": online,
    "replay": replay, "stored": stored, "hrevolve": hrevolve}
FAST_N = [*range(1, 41), 47, 64, 99, 128, 173, 200]
#: AsyncMultistage's family at every interval grows as n^3 (5 s at n = 200): the fast test
#: takes its smaller n, the slow one the rest
FAST = [(family, n) for family in FAMILIES for n in FAST_N
        if family != "multistage" or n <= 64]


def digest(family: str, n: int) -> str:
    """The first 16 hex digits of the SHA-256 of every action's repr, schedule after schedule."""
    hashed = hashlib.sha256()
    for schedule in FAMILIES[family](n):
        hashed.update(repr(list(schedule)).encode())
        hashed.update(b";")
    return hashed.hexdigest()[:16]


def recorded(family: str, n: int) -> str:
    return json.loads(DIGESTS.read_text())[family][str(n)]


@pytest.mark.parametrize(("family", "n"), FAST)
def test_every_schedule_yields_the_recorded_actions(family: str, n: int) -> None:
    assert digest(family, n) == recorded(family, n)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "n"), [(family, n) for family in FAMILIES
                                           for n in range(1, 201) if (family, n) not in FAST])
def test_every_schedule_yields_the_recorded_actions_at_every_n(family: str, n: int) -> None:
    assert digest(family, n) == recorded(family, n)


def main() -> None:
    if sys.argv[1:] != ["--record"]:
        raise SystemExit(f"usage: python {sys.argv[0]} --record")
    table = {family: {str(n): digest(family, n) for n in range(1, 201)} for family in FAMILIES}
    DIGESTS.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
