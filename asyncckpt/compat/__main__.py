"""``python -m asyncckpt.compat PROGRAM [ARGS]`` or ``python -m asyncckpt.compat -m MODULE
[ARGS]``: run a program written for pyrevolve on asyncckpt, unedited (``import pyrevolve`` gives
:mod:`asyncckpt.compat`; see :func:`asyncckpt.compat.install`)."""
from __future__ import annotations

import os
import runpy
import sys

from . import install

USAGE = "usage: python -m asyncckpt.compat PROGRAM [ARGS] | -m MODULE [ARGS]"


def main(argv: list[str]) -> int:
    """Run ``argv`` (a program's path and arguments, or ``-m`` and a module's) with the switch
    installed; 2 on a bad command line."""
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if not argv or argv == ["-m"]:
        print(USAGE, file=sys.stderr)
        return 2
    install()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
