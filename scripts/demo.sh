#!/usr/bin/env bash
# The agentcheck demo: bash scripts/demo.sh
# Works from a clean clone: creates .venv, installs agentcheck (core only: SQLite, no
# server, no API key) and runs examples/crash_demo.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check -e .
exec python examples/crash_demo.py "$@"
