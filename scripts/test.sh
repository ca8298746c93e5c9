#!/usr/bin/env bash
# The project's checks, from scratch: a virtual environment in .venv, lint, format, types, tests.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
py=.venv/bin/python
# torch first, pinned: an unpinned torch makes pip fetch a multi-GB CUDA build where a CPU one would do.
"$py" -m pip install -q --disable-pip-version-check "${MSTAR_TORCH:-torch==2.13.0}"
"$py" -m pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
"$py" -m pytest "$@"
