#!/usr/bin/env bash
# Set up the environment, then run the main job: the LSTM experiment of the paper on its quick
# default (a table on stdout, results and figures in results/lstm/). Extra arguments go to it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m experiments.lstm --quick --out results/lstm "$@"
