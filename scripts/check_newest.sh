#!/usr/bin/env bash
# The extras against the newest frameworks: a fresh venv takes the newest torch pip will install
# and the newest jax and jaxlib, then asyncckpt with its torch, jax and test extras on top; fails
# if the extras changed a framework's version, then runs the PyTorch, JAX and first-contact tests
# there. It downloads gigabytes (torch's wheel is a CUDA build), so CI does not run it.
#   NEWEST_VENV  the venv, made anew (default /tmp/asyncckpt-newest; removed at the end)
#   PYTHON       its interpreter (default python3)
#   FRAMEWORKS   the frameworks to install (default "torch jax"; "jax" alone on a Python for
#                which torch would be a download of several GB)
#   KEEP_VENV=1  keeps the venv afterwards
# Arguments go to pytest (-x, -k ...).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEWEST_VENV:-/tmp/asyncckpt-newest}
PYTHON=${PYTHON:-python3}
FRAMEWORKS=${FRAMEWORKS:-torch jax}

packages=() extras=test tests=(tests/test_asyncckpt/test_first_contact.py)
for fw in $FRAMEWORKS; do
    case $fw in
        torch) packages+=(torch) extras+=,torch tests+=(tests/test_asyncckpt/pytorch) ;;
        jax) packages+=(jax jaxlib) extras+=,jax tests+=(tests/test_asyncckpt/jax) ;;
        *) echo "FRAMEWORKS: unknown framework '$fw' (expected torch and/or jax)" >&2; exit 2 ;;
    esac
done
if [ ${#packages[@]} -eq 0 ]; then
    echo "FRAMEWORKS is empty (expected torch and/or jax)" >&2; exit 2
fi

# never remove a folder that is not a venv
if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
    echo "NEWEST_VENV=$VENV exists and is not a virtual environment" >&2; exit 2
fi
rm -rf "$VENV"
if [ "${KEEP_VENV:-0}" != 1 ]; then
    trap 'rm -rf "$VENV"' EXIT
fi
"$PYTHON" -m venv "$VENV"
PY=$VENV/bin/python
$PY -m pip install --quiet --upgrade pip setuptools wheel

versions() {
    $PY -c 'import importlib.metadata as m, sys
print(" ".join(f"{p}=={m.version(p)}" for p in sys.argv[1:]))' "${packages[@]}"
}
# the newest each framework pip will take here (a pip constraint, where there is one, applies)
$PY -m pip install --quiet --upgrade "${packages[@]}"
before=$(versions)
echo "frameworks: $before ($($PY -V))"
$PY -m pip install --quiet -e ".[$extras]"
after=$(versions)
if [ "$after" != "$before" ]; then
    echo "asyncckpt[$extras] changed the frameworks: $before -> $after" >&2; exit 1
fi
echo "asyncckpt[$extras] kept them"
$PY -m pytest -q "${tests[@]}" "$@"
