"""The hypothesis settings every profile of the attack suite runs under."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

__all__ = ["profile"]


def profile(examples: int, variable: str) -> settings:
    """Settings of a profile of ``examples`` draws, the same ones every time unless
    ``$variable`` asks for a long profile (drawn at random); failures reported as drawn."""
    return settings(max_examples=examples, deadline=None,
                    derandomize=variable not in os.environ,
                    phases=(Phase.explicit, Phase.reuse, Phase.generate),
                    report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
