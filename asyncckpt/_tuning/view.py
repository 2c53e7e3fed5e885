"""The tuner's costs as the public :class:`~asyncckpt.MeasuredCosts` shows them, and
costs a user sets taken back into the tuner."""
from __future__ import annotations

from ..errors import InvalidTypeError, InvalidValueError
from .measured import MeasuredCosts
from .residual import Residual
from .tuner import IntervalTuner

__all__ = ["assume", "view"]


def view(tuner: IntervalTuner) -> MeasuredCosts:
    """What ``tuner`` prices plans with, frozen."""
    tiers = tuner.tier_costs
    return MeasuredCosts(
        n_steps=tuner.n_steps, runs=tuner.runs,
        tf=tuner.tf, tb=tuner.tb, tcall=tuner.tcall, tc=tuner.tc, tw=tuner.tw, tr=tuner.tr,
        tf_busy=tuner.tf_busy, tb_busy=tuner.tb_busy, tcall_busy=tuner.tcall_busy,
        tc_busy=tuner.tc_busy,
        tier_costs=None if tiers is None else tuple((tw, tr) for tw, tr in tiers),
        tx=tuner.tx, fault_s=tuner.fault_s, codec=tuner.codec, tq=tuner.tq)


def assume(tuner: IntervalTuner, costs: MeasuredCosts) -> None:
    """Price the next plans with ``costs``: each is taken as measured, and what earlier runs
    took beyond their price (the residuals) and the floors they set are dropped, since they
    were measured against the costs ``costs`` replaces.

    Raises
    ------
    InvalidTypeError
        If ``costs`` is not a :class:`MeasuredCosts`.
    InvalidValueError
        If its ``tier_costs`` do not match Level-2's tiers.
    """
    if not isinstance(costs, MeasuredCosts):
        raise InvalidTypeError(f"costs must be a MeasuredCosts (ckp.costs.replace(...)), got "
                               f"{type(costs).__name__}")
    tiers, known = costs.tier_costs, tuner.tier_costs
    if (tiers is None) != (known is None) or len(tiers or ()) != len(known or ()):
        raise InvalidValueError(f"costs.tier_costs must give (tw, tr) for each of Level-2's "
                                f"{len(known or ())} tiers (None for an untiered one), got "
                                f"{tiers!r}")
    for name in ("n_steps", "runs", "tf", "tb", "tcall", "tc", "tw", "tr", "tf_busy", "tb_busy",
                 "tcall_busy", "tc_busy", "tx", "fault_s", "codec", "tq"):
        setattr(tuner, name, getattr(costs, name))
    tuner.tier_costs = None if tiers is None else [(tw, tr) for tw, tr in tiers]
    tuner.loaded_costs = None
    tuner.misses = Residual()
