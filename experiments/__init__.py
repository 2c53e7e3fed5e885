"""Experiments of the paper, run as scripts (``python -m experiments.lstm``); not imported by the
packages."""
