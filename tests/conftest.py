"""Shared pytest fixtures for the agentcheck test suite.

Layout (append new fixtures in their own section at the end of the file):

* Environment -- set at import time, before any test module imports an agent
  framework, so the suite stays offline and quiet.
* PostgreSQL -- ``pg_server`` (one real throwaway server per session, see
  ``tests/pg_server.py``; set ``AGENTCHECK_TEST_POSTGRES_URL`` to use an existing
  server instead) and ``pg_url`` (a fresh empty database per test).
* SQLite -- ``sqlite_path`` (a new database file path per test).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from pg_server import PostgresServer
from savers_support import is_postgres, open_saver

# --------------------------------------------------------------------------- environment

for _name, _value in {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "OTEL_SDK_DISABLED": "true",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_TRACING": "false",
}.items():
    os.environ.setdefault(_name, _value)


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """A started PostgreSQL server shared by the whole session (stopped at the end)."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    """URL of a fresh, empty database (``postgresql://postgres@127.0.0.1:PORT/test_...``).

    The database is dropped after the test (open connections are terminated).
    """
    url = pg_server.create_database()
    yield url
    with contextlib.suppress(Exception):
        pg_server.drop_database(url)


# --------------------------------------------------------------------------- SQLite


@pytest.fixture
def sqlite_path(tmp_path: Path) -> str:
    """Path (str) of a not-yet-existing SQLite database file in ``tmp_path``."""
    return str(tmp_path / "agent.db")


# --------------------------------------------------------------------------- savers


@pytest.fixture
def db(request: pytest.FixtureRequest, sqlite_path: str) -> dict[str, str]:
    """Where the parametrized ``kind`` stores (a PostgreSQL database only when needed)."""
    kind = request.getfixturevalue("kind")
    pg_url = request.getfixturevalue("pg_url") if is_postgres(kind) else ""
    return {"sqlite_path": sqlite_path, "pg_url": pg_url}


@pytest.fixture
async def saver(kind: str, db: dict[str, str]) -> AsyncIterator[Any]:
    """A set-up saver of the parametrized ``kind`` (see savers_support.open_saver)."""
    async with open_saver(kind, **db) as opened:
        yield opened
