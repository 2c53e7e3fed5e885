#!/usr/bin/env bash
# Create .venv beside the project and install asyncckpt with its test, experiment, devito, mpi,
# compression and docs extras (Devito compiles its operators with the system's C compiler at run
# time).
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel
# the frameworks first, at the versions the suite is run on: the CPU builds, which pip takes
# from the local wheel store in seconds (the extras' ranges would admit a CUDA build of
# several GB); the extras below then find them installed
.venv/bin/python -m pip install --quiet torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 devito==4.8.23
.venv/bin/python -m pip install --quiet -e '.[test,experiments,devito,mpi,compression,torch,jax,docs,check]'
