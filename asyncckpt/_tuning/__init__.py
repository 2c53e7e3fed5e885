"""Learning what a run costs: the probes, the costs learned from runs and their residuals, what
the process remembers of them, the model's choice among plans, and the planner of
``interval="auto"`` and ``"adaptive"`` that asks them."""
