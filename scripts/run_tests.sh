#!/usr/bin/env bash
# Set up the environment, then run the test suite (every test under a timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m pytest "$@"
