#!/usr/bin/env bash
# The project's checks, from scratch: a virtual environment in .venv, lint, format, types, tests.
# Usage: bash scripts/test.sh [pytest args]
# .venv is the one the README's set-up makes: a torch already in it is kept, whichever build it is.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
py=.venv/bin/python
# torch first, pinned: this project's machines keep a CPU build of torch 2.13.0 beside pip, and an
# unpinned torch would make pip fetch a multi-GB CUDA build. Elsewhere, choose the build with
# MSTAR_TORCH (e.g. MSTAR_TORCH="torch --index-url https://download.pytorch.org/whl/cpu").
read -ra torch_spec <<< "${MSTAR_TORCH:-torch==2.13.0}"
if [ -n "${MSTAR_TORCH:-}" ] || ! "$py" -c "import torch" 2>/dev/null; then
  "$py" -m pip install -q --disable-pip-version-check "${torch_spec[@]}"
fi
"$py" -m pip install -q --disable-pip-version-check -e '.[test]'
# FlashInfer's wheel alone, without its dependencies: tests/attn/test_overflow.py checks the
# overflow-text fixture (tests/attn/flashinfer_overflow.json) against the C++ headers the wheel
# ships, which it finds without importing FlashInfer, so it needs no CUDA and no GPU; without the
# wheel that check would skip. `import flashinfer` may fail here for want of its dependencies:
# the tests that need it (marked gpu or flashinfer) skip cleanly. Pinned to the version the
# fixture was taken from (a pure-Python wheel of about 100 MB).
"$py" -m pip install -q --disable-pip-version-check --no-deps flashinfer-python==0.7.4
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# One worker a core (pytest-xdist); `bash scripts/test.sh -n 0` runs in this process alone.
"$py" -m pytest -n auto "$@"
