"""Doing a run: the interpreter of a schedule's actions and its Level-1 slots, the transfer
engine, the links between Level-1 and host memory, the timing of operator calls, the run's meter
and the ranks of an MPI job. It never imports :mod:`asyncckpt._planning` or
:mod:`asyncckpt._tuning`: what a run does is decided there and handed here as a schedule."""
