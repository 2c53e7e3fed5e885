"""The plans ``interval="auto"`` chooses among: for each split of the memory between Level-1
slots and Level-2, the intervals the model finds fastest, and Revolve in the slots alone, each
priced with and without the faults of fresh memory (:class:`~asyncckpt._tuning.choice.Plan`).
:class:`~asyncckpt._tuning.auto.AutoPlanner` chooses one of them."""
from __future__ import annotations

import logging
from collections.abc import Callable

from schedules import AsyncMultistage
from schedules.model import IntervalChoice

from .._planning.budget import slot_candidates
from .._planning.plan import Planner
from ..errors import InvalidValueError, MemoryBudgetError
from .choice import Plan
from .pricing import Pricing

__all__ = ["PRICED_INTERVALS", "candidate_plans", "codec_choices", "log_plans"]

#: Intervals "auto" prices one by one for each slot count, before a grid 10% apart and every
#: interval beside the grid's best (see :func:`schedules.model.choose_interval`): as good as
#: pricing every interval, at a fraction of the cost (docs/measurements.md).
PRICED_INTERVALS = 16


def codec_choices(tuner: Pricing, has_codec: bool, compress_auto: bool) -> tuple[bool, ...]:
    """Whether plans are priced compressed, uncompressed or both: with ``"auto"``
    (``compress_auto``), both once a run has measured the codec on its states."""
    if not has_codec:
        return (False,)
    if not compress_auto:
        return (True,)
    if tuner.codec is not None:
        return (False, True)
    return (False,)


def candidate_plans(tuner: Pricing, planner: Planner, codecs: tuple[bool, ...], *,
                    slots_fixed: bool, compress_auto: bool,
                    level2_required: bool = False) -> list[Plan]:
    """For each slot count, the intervals the model finds fastest with and without faults
    priced, and Revolve in the Level-1 slots alone; ``codecs``: whether each plan's states go
    through the codec (:func:`codec_choices`). Under a budget without fixed slots the slot
    counts span the splits of the budget between slots and the DRAM tier.
    ``level2_required`` (a run directory's run, which commits what Level-2 holds): plans that
    store states on Level-2 alone, u_0 alone included."""
    budget = planner.memory.budget
    budgeted = budget is not None and not slots_fixed
    if budgeted:
        assert budget is not None
        candidates = slot_candidates(min(budget.max_slots_with_level2, tuner.n_steps))
    else:
        candidates = [planner.l1_slots]
    plans: list[Plan] = []
    seen: set[tuple[int, int, bool]] = set()

    def add(slots: int) -> list[Plan]:
        """The plans of ``slots`` slots, added."""
        capacities, added = planner.capacities(slots), []
        for compressed in codecs:
            found = _chosen_intervals(tuner, planner, slots, capacities, compressed, budgeted)
            if found is None:
                continue
            choices, intervals = found
            # Level-1 alone moves no state through the codec: priced once
            if (planner.n_timesteps is not None and not (compressed and compress_auto)
                    and not level2_required):
                intervals.add(0)
            for interval in intervals:  # each priced once, the warm choice's baselines kept
                plan = _priced(tuner, planner, (slots, capacities), interval, compressed,
                               choices[0], budgeted, seen, keep_single=level2_required)
                if plan is not None:
                    added.append(plan)
        plans.extend(added)
        return added

    _search_slots(candidates, add)
    if budgeted and planner.n_timesteps is not None and not level2_required:
        _add_revolve_alone(tuner, planner, plans)
    if not plans:
        raise MemoryBudgetError(
            f"memory_budget={None if budget is None else budget.nbytes} bytes leaves no "
            f"room on Level-2 {planner.storage!r}")
    return plans


def _search_slots(candidates: list[int], add: Callable[[int], list[Plan]]) -> None:
    """Price the plans of every other slot count of ``candidates`` (the first three and the
    last included), then of the counts beside those whose plans are the fastest (once warm,
    and with faults): the price moves slowly with the slots, so the counts skipped elsewhere
    are never the fastest, and a long run prices half as many."""
    coarse = sorted({*candidates[:3], *candidates[::2], candidates[-1]})
    fastest: dict[int, tuple[float, float]] = {}
    for slots in coarse:
        added = add(slots)
        if added:
            fastest[slots] = (min(p.warm_s for p in added), min(p.total_s for p in added))
    nearby: set[int] = set()
    for which in (0, 1):
        if fastest:
            at = candidates.index(min(fastest, key=lambda slots: fastest[slots][which]))
            nearby.update(candidates[max(0, at - 1):at + 2])
    for slots in sorted(nearby - set(coarse)):
        add(slots)


def _chosen_intervals(tuner: Pricing, planner: Planner, slots: int,
                      capacities: list[int | None] | None, compressed: bool,
                      budgeted: bool) -> tuple[list[IntervalChoice], set[int]] | None:
    """The model's choices with ``slots`` slots and the tiers' ``capacities`` (with and
    without faults priced) and their intervals; None where a budget's split leaves the tiers
    no room beside the slots."""
    # pricing faults changes the choice only where a fault cost was measured
    pricings = (False, True) if tuner.fresh() is not None else (False,)
    try:
        choices = [tuner.choose(slots, capacities, fresh=fresh,
                                max_candidates=PRICED_INTERVALS, compressed=compressed)
                   for fresh in pricings]
    except InvalidValueError:  # these tiers hold no state beside so many slots
        if budgeted:
            return None
        if planner.n_timesteps is None:
            raise
        # Revolve in the fixed slots alone is left (priced by the caller), its baselines
        # without the tiers
        alone = tuner.choose(slots, None, fresh=False, max_candidates=PRICED_INTERVALS)
        return [alone], set()
    return choices, {choice.interval for choice in choices}


def _priced(tuner: Pricing, planner: Planner,
            split: tuple[int, list[int | None] | None], interval: int, compressed: bool,
            choice: IntervalChoice, budgeted: bool, seen: set[tuple[int, int, bool]], *,
            keep_single: bool = False) -> Plan | None:
    """The plan of ``interval`` with the slots and the tiers' capacities of ``split``,
    priced; None where it was priced before or can never be the fastest (``keep_single``:
    u_0 alone on Level-2 is kept)."""
    slots, capacities = split
    used = slots
    if budgeted and interval and not planner.adaptive:
        # an interval's schedule is the same with more than I slots: the budget they would
        # take goes to the DRAM tier instead of sending states to disk
        used = min(slots, interval)
    if (used, interval, compressed) in seen:
        return None
    seen.add((used, interval, compressed))
    room = capacities if used == slots else planner.capacities(used)
    transfers = AsyncMultistage(tuner.n_steps, interval, used).l2_states if interval else 0
    if budgeted and interval and transfers <= 1 and planner.n_timesteps and not keep_single:
        # u_0 alone on Level-2 is Revolve in fewer slots than the budget gives Revolve in
        # Level-1 alone (priced apart): never the faster
        return None
    warm_s = tuner.price(used, interval, room, fresh=False, compressed=compressed)
    total_s = tuner.price(used, interval, room, compressed=compressed)
    return Plan(used, interval, choice, warm_s, total_s, transfers,
                compressed=compressed and interval > 0)


def _add_revolve_alone(tuner: Pricing, planner: Planner, plans: list[Plan]) -> None:
    """Add Revolve in Level-1 alone under a budget, where the plans lack it: it holds no
    staging or prefetch buffers, so every buffer of the budget is a slot."""
    budget = planner.memory.budget
    assert budget is not None
    alone = min(budget.buffers, max(1, tuner.n_steps - (1 if tuner.taping else 0)))
    if any(plan.slots == alone and plan.interval == 0 for plan in plans):
        return
    # its baselines, for the run's record: no tier has room beside so many slots
    choice = tuner.choose(alone, None, fresh=False, max_candidates=PRICED_INTERVALS)
    plans.append(Plan(alone, 0, choice, tuner.price(alone, 0, fresh=False),
                      tuner.price(alone, 0), 0))


def log_plans(log: logging.Logger, tuner: Pricing, plans: list[Plan], chosen: Plan) -> None:
    """Log the fastest plans once memory is warm, then the one chosen and the costs."""
    for plan in sorted(plans, key=lambda plan: plan.warm_s)[:6]:
        log.debug("auto considers %d slots, I=%d%s: %.3f s warm, %.3f s of faults, "
                  "%d Level-2 writes", plan.slots, plan.interval,
                  " compressed" if plan.compressed else "", plan.warm_s, plan.faults_s,
                  plan.transfers)
    log.debug("auto: %d slots, %s%s, predicted %.3f s (%.3f s of faults), %d warm "
              "buffers, tf %.3g s, tb %.3g s, tcall %.3g s, tw %.3g s, tr %.3g s, "
              "fault %s s", chosen.slots,
              f"I={chosen.interval}" if chosen.interval else "Level-1 alone",
              " compressed" if chosen.compressed else "", chosen.total_s, chosen.faults_s,
              tuner.warm_buffers, tuner.tf or 0.0,
              tuner.costs().tb, tuner.tcall, tuner.tw, tuner.tr, tuner.fault_s)
