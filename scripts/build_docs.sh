#!/usr/bin/env bash
# Build the documentation site into docs/_build/html from scratch (the API reference's pages are
# generated from the docstrings). Any warning fails the build: a fresh build, since an
# incremental one would not repeat the warnings of pages it does not read again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if ! "$PYTHON" -c "import sphinx, numpydoc, myst_parser, pydata_sphinx_theme" 2>/dev/null; then
    scripts/setup_env.sh
fi
rm -rf docs/_build docs/api/generated
exec "$PYTHON" -m sphinx -W --keep-going -q -b html docs docs/_build/html "$@"
