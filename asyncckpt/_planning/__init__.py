"""Deciding what a run does: options, the memory budget and its split, the measured costs and
the model's choice of plan, the calibration probes, adaptive decisions, and the one function
that builds a checkpointer's parts (:func:`.build.build`)."""
