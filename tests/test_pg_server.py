"""Tests of the PostgreSQL test harness itself (tests/pg_server.py, tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from pg_server import ENV_URL, PostgresServer

owned_only = pytest.mark.skipif(
    bool(os.environ.get(ENV_URL)), reason=f"{ENV_URL} is set: server not owned by the harness"
)


def test_server_is_running(pg_server: PostgresServer) -> None:
    assert pg_server.running
    assert pg_server.url().endswith("/postgres")
    with psycopg.connect(pg_server.url()) as conn:
        row = conn.execute("SELECT current_user, current_setting('server_version_num')").fetchone()
    assert row is not None
    assert int(row[1]) >= 130000  # DROP DATABASE ... WITH (FORCE) needs 13+


@owned_only
def test_owned_server_settings(pg_server: PostgresServer) -> None:
    assert pg_server.url() == f"postgresql://postgres@127.0.0.1:{pg_server.port}/postgres"
    with psycopg.connect(pg_server.url()) as conn:
        settings = {
            name: conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
            for name in ("fsync", "max_connections", "listen_addresses", "shared_buffers")
        }
    assert settings == {
        "fsync": ("on",),
        "max_connections": ("200",),
        "listen_addresses": ("127.0.0.1",),
        "shared_buffers": ("128MB",),
    }


def test_select_one(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_create_database_gives_distinct_databases(pg_server: PostgresServer) -> None:
    url_a = pg_server.create_database()
    url_b = pg_server.create_database()
    try:
        assert url_a != url_b
        with psycopg.connect(url_a, autocommit=True) as conn_a:
            conn_a.execute("CREATE TABLE only_in_a (x int)")
            name_a = conn_a.execute("SELECT current_database()").fetchone()
        with psycopg.connect(url_b, autocommit=True) as conn_b:
            name_b = conn_b.execute("SELECT current_database()").fetchone()
            found = conn_b.execute("SELECT to_regclass('only_in_a')").fetchone()
        assert name_a != name_b
        assert found == (None,)
    finally:
        pg_server.drop_database(url_a)
        pg_server.drop_database(url_b)


def test_create_database_quotes_names(pg_server: PostgresServer) -> None:
    name = 'Odd "name"; DROP'
    url = pg_server.create_database(name)
    try:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == (name,)
    finally:
        pg_server.drop_database(name)


@owned_only
def test_restart_breaks_open_connections(pg_server: PostgresServer, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE survivors (x int)")
        setup.execute("INSERT INTO survivors VALUES (42)")

    conn = psycopg.connect(pg_url, autocommit=True)
    try:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        pg_server.restart()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()

    with psycopg.connect(pg_url) as fresh:
        assert fresh.execute("SELECT x FROM survivors").fetchall() == [(42,)]


def test_external_url_mode(pg_server: PostgresServer) -> None:
    external = PostgresServer(pg_server.url())
    assert external.external
    external.start()  # no server is started; only checks it is reachable
    assert external.url("other db") == pg_server.url("other db")
    with pytest.raises(RuntimeError, match="harness-owned server"):
        external.restart()
    url = external.create_database()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    external.stop()  # drops the databases it created
    with psycopg.connect(pg_server.url()) as conn:
        name = url.rsplit("/", 1)[1]
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert row is None


@owned_only
def test_context_manager_starts_and_cleans_up() -> None:
    with PostgresServer(from_env=False) as server:
        base = server.data_dir.parent
        assert (server.data_dir / "postmaster.pid").exists()
        with psycopg.connect(server.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not server.running
    assert not base.exists()


def test_sqlite_path(sqlite_path: str, tmp_path: Path) -> None:
    assert sqlite_path == str(tmp_path / "agent.db")
    assert not Path(sqlite_path).exists()
