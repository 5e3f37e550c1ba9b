"""The public face: an explicit, sorted __all__ whose names all exist."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "agentcheck",
    "agentcheck.savers",
    "agentcheck.serde",
    "agentcheck.journal",
    "agentcheck.effects",
    "agentcheck.adapters.langgraph",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_every_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert getattr(module, attr) is not None, f"{name}.{attr} is missing"


def test_importing_agentcheck_needs_no_postgres_extra() -> None:
    import subprocess
    import sys

    # psycopg is blocked: importing agentcheck and its SQLite savers must still work,
    # and using a PostgreSQL saver must name the extra to install.
    code = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "import agentcheck, agentcheck.savers\n"
        "from agentcheck.savers import SqliteSaver\n"
        "try:\n"
        "    agentcheck.savers.PostgresSaver('postgresql://x')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "agentcheck[postgres]" in out.stdout, out.stdout + out.stderr
