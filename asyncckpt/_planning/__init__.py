"""Deciding what a run does from what the user said: options, the taping protocol, the memory
budget and its split, and the plan of the next run. It never imports :mod:`asyncckpt._tuning`,
which learns what runs cost and chooses among plans by it."""
