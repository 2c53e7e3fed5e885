#!/usr/bin/env bash
# Create .venv beside the project and install asyncckpt with its test, experiment, devito, mpi
# and compression extras (Devito compiles its operators with the system's C compiler at run
# time).
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel
.venv/bin/python -m pip install --quiet -e '.[test,experiments,devito,mpi,compression,torch,jax]'
