#!/usr/bin/env bash
# The package as users get it: mypy clean on both packages, a wheel and sdist that build, twine's
# metadata check, and the wheel holding each package's py.typed (PEP 561).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
PY=.venv/bin/python
$PY -m mypy asyncckpt schedules
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# no build isolation: the venv already has setuptools and wheel, and CI need not fetch them again
$PY -m build --no-isolation --outdir "$OUT" . >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
$PY -m twine check --strict "$OUT"/*.whl "$OUT"/*.tar.gz
$PY - "$OUT" <<'PY'
import pathlib, sys, zipfile
wheel, = pathlib.Path(sys.argv[1]).glob("*.whl")
names = set(zipfile.ZipFile(wheel).namelist())
missing = [p for p in ("asyncckpt/py.typed", "schedules/py.typed") if p not in names]
if missing:
    sys.exit(f"{wheel.name} lacks {', '.join(missing)}")
print(f"{wheel.name}: {len(names)} files, py.typed in both packages")
PY
