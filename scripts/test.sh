#!/usr/bin/env bash
# The project's checks, from scratch: a virtual environment in .venv, lint, format, types, tests.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
py=.venv/bin/python
# torch first, pinned: this project's machines keep a CPU build of torch 2.13.0 beside pip, and an
# unpinned torch would make pip fetch a multi-GB CUDA build. Elsewhere, choose the build with
# MSTAR_TORCH (e.g. MSTAR_TORCH="torch --index-url https://download.pytorch.org/whl/cpu").
read -ra torch_spec <<< "${MSTAR_TORCH:-torch==2.13.0}"
"$py" -m pip install -q --disable-pip-version-check "${torch_spec[@]}"
"$py" -m pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
"$py" -m pytest "$@"
