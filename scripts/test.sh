#!/usr/bin/env bash
# The project's checks, from scratch: a virtual environment in .venv, lint, format, types, tests.
# Usage: bash scripts/test.sh [pytest args]
# .venv is the one the README's set-up makes: a torch already in it is kept, whichever build it is.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
py=.venv/bin/python
# pip compiles nothing (--no-compile: compiling torch's and FlashInfer's every file took longer
# than installing them); Python caches what the checks import, once, under .venv/pycache, even
# where PYTHONDONTWRITEBYTECODE is set: the tests start a few hundred Python processes, and each
# would compile torch's and this package's modules again.
pip_install=("$py" -m pip install -q --disable-pip-version-check --no-compile)
export PYTHONPYCACHEPREFIX="$PWD/.venv/pycache"
unset PYTHONDONTWRITEBYTECODE
# FlashInfer's wheel, downloaded, not installed: tests/attn/test_overflow.py checks the
# overflow-text fixture (mstar_resources/attn/flashinfer_overflow.json) against the C++ headers
# the wheel ships, read from it (tests/flashinfer_sources.py), so it needs no CUDA and no GPU.
# Installed without its dependencies (cuda-python, cutlass and more), `import flashinfer` would
# fail; not installed, it is plainly absent, and the tests that import it skip. Pinned to the
# version the fixture was taken from (a pure-Python wheel of about 100 MB), kept between runs.
# Downloaded while torch and the package install, and waited for before the tests.
wheels=.venv/wheels
download_pid=
if ! compgen -G "$wheels/flashinfer_python-0.7.4-*.whl" > /dev/null; then
  "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$wheels" \
    flashinfer-python==0.7.4 &
  download_pid=$!
fi
mypy_pid=
trap 'kill $download_pid $mypy_pid 2> /dev/null || true' EXIT  # a step that fails ends them
# torch first, pinned: this project's machines keep a CPU build of torch 2.13.0 beside pip, and an
# unpinned torch would make pip fetch a multi-GB CUDA build. Elsewhere, choose the build with
# MSTAR_TORCH (e.g. MSTAR_TORCH="torch --index-url https://download.pytorch.org/whl/cpu").
read -ra torch_spec <<< "${MSTAR_TORCH:-torch==2.13.0}"
if [ -n "${MSTAR_TORCH:-}" ] || ! "$py" -c "import torch" 2>/dev/null; then
  "${pip_install[@]}" "${torch_spec[@]}"
fi
"${pip_install[@]}" -e '.[test]'
# mypy checks types on its own core (one process) beside ruff and the tests; what it finds is
# printed after them, and fails the command as they would.
mypy_report=.venv/mypy-report.txt
.venv/bin/mypy > "$mypy_report" 2>&1 &
mypy_pid=$!
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ -n "$download_pid" ]; then
  wait "$download_pid"  # its status: a download that failed fails the command
  download_pid=
fi
# One worker a core (pytest-xdist); `bash scripts/test.sh -n 0` runs in this process alone. A
# worker that runs out of tests takes some of another's that have not started (worksteal), so
# neither waits at the end while the other still holds a queue.
status=0
"$py" -m pytest -n auto --dist worksteal "$@" || status=$?
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
cat "$mypy_report"
if [ "$mypy_status" -ne 0 ]; then
  echo "mypy failed (status $mypy_status)" >&2
  exit "$mypy_status"
fi
exit "$status"
