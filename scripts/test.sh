#!/usr/bin/env bash
# The agentcheck test command: bash scripts/test.sh [pytest args...]
#
# Works from a clean clone: creates .venv, installs the package with the dev
# extra, installs the PostgreSQL server if initdb is missing, then runs
# ruff, mypy (strict) and pytest.  Any failing phase makes the script exit non-zero.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

phase() { printf '\n==> %s\n' "$*"; }

phase "python environment (.venv)"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check -e '.[dev]'

have_initdb() {
    command -v initdb >/dev/null 2>&1 && return 0
    local bin
    for bin in /usr/lib/postgresql/*/bin/initdb; do
        [ -x "$bin" ] && return 0
    done
    return 1
}

phase "postgresql server"
if have_initdb; then
    echo "initdb found"
else
    echo "initdb not found; installing postgresql with apt-get"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "error: not root and sudo is missing; install postgresql manually" >&2
            exit 1
        fi
        # Prompt for a password only when someone can answer (not in CI).
        if [ -t 0 ]; then SUDO="sudo"; else SUDO="sudo -n"; fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq postgresql
    have_initdb || { echo "error: initdb still not found after install" >&2; exit 1; }
fi

phase "ruff check src tests examples"
ruff check src tests examples

phase "mypy src"
mypy src

phase "pytest $*"
python -m pytest "$@"
