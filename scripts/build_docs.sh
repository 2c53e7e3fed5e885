#!/usr/bin/env bash
# Build the documentation site from scratch into OUTDIR (default docs/_build/html; the API
# reference's pages are generated from the docstrings into docs/api/generated). Any warning
# fails the build: a fresh build, since an incremental one would not repeat the warnings of
# pages it does not read again. Further arguments go to sphinx-build.
#
# Usage: scripts/build_docs.sh [OUTDIR] [SPHINX-OPTIONS...]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/docs/_build/html"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    OUT="$1"
    shift
fi
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
cd "$ROOT"
PYTHON=${PYTHON:-.venv/bin/python}
if ! "$PYTHON" -c "import sphinx, numpydoc, myst_parser, pydata_sphinx_theme" 2>/dev/null; then
    scripts/setup_env.sh
fi
# a folder of anything but an earlier build (Sphinx leaves .buildinfo there) is never removed
if [ -d "$OUT" ] && [ ! -f "$OUT/.buildinfo" ] && [ -n "$(ls -A "$OUT")" ]; then
    echo "build_docs.sh: $OUT holds files that are not a site built here; name an empty or new folder" >&2
    exit 2
fi
rm -rf docs/api/generated "$OUT"
exec "$PYTHON" -m sphinx -W --keep-going -q -b html -d "$OUT/.doctrees" docs "$OUT" "$@"
