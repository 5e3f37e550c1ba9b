"""Schema set-up and migrations: idempotent, refuses a newer schema, works inside a
caller's transaction, and is safe when several processes set up one database at once."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import psycopg_pool
import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config

from agentcheck import SchemaVersionError, effect_scope, side_effect
from agentcheck.backends import postgres as pg_backend
from agentcheck.backends import sqlite as sqlite_backend
from agentcheck.backends.base import SQL
from agentcheck.savers import AsyncPostgresSaver, AsyncSqliteSaver, PostgresSaver, SqliteSaver

from savers_support import (
    KINDS,
    SYNC_KINDS,
    chat_graph,
    chat_turns,
    every_checkpoint,
    is_async,
    is_postgres,
    open_saver,
    raw_sql,
    run_chat,
)

TABLES = {
    "agentcheck_schema",
    "agentcheck_checkpoints",
    "agentcheck_blobs",
    "agentcheck_writes",
    "agentcheck_metadata_terms",
}
SQLITE_TABLES = TABLES | {"agentcheck_pending_terms"}  # see SQL.PENDING_TERMS


# --------------------------------------------------------------------------- helpers


def migrations_of(kind: str) -> tuple[tuple[str, ...], ...]:
    return pg_backend.MIGRATIONS if is_postgres(kind) else sqlite_backend.MIGRATIONS


def schema_versions(kind: str, sqlite_path: str, pg_url: str) -> list[int]:
    """Every recorded version, duplicates included, in order."""
    rows = raw_sql(
        kind, sqlite_path, pg_url, "SELECT version FROM agentcheck_schema ORDER BY version"
    )
    return [int(r[0]) for r in rows]


def existing_tables(kind: str, sqlite_path: str, pg_url: str) -> set[str]:
    if is_postgres(kind):
        sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    else:
        sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
    return {r[0] for r in raw_sql(kind, sqlite_path, pg_url, sql)}


@asynccontextmanager
async def open_without_setup(kind: str, *, sqlite_path: str, pg_url: str) -> AsyncIterator[Any]:
    """A saver of ``kind`` on which setup() has not been called."""
    if kind == "sqlite":
        with SqliteSaver.from_conn_string(sqlite_path) as saver:
            yield saver
    elif kind == "postgres":
        with PostgresSaver.from_conn_string(pg_url) as saver:
            yield saver
    elif kind == "async_sqlite":
        async with AsyncSqliteSaver.from_conn_string(sqlite_path) as saver:
            yield saver
    else:
        async with AsyncPostgresSaver.from_conn_string(pg_url) as saver:
            yield saver


async def call(kind: str, saver: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """``saver.<method>`` through the sync API of sync savers, the async API of async ones."""
    if is_async(kind):
        return await getattr(saver, "a" + method)(*args, **kwargs)
    return getattr(saver, method)(*args, **kwargs)


async def setup(kind: str, saver: Any) -> None:
    if is_async(kind):
        await saver.setup()
    else:
        saver.setup()


# --------------------------------------------------------------------------- 1. idempotent


@pytest.mark.parametrize("kind", KINDS)
async def test_setup_twice_is_idempotent_and_records_each_version_once(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    expected = list(range(1, len(migrations_of(kind)) + 1))
    assert expected  # there is at least one migration to record
    thread = f"setup-{uuid.uuid4()}"
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        assert schema_versions(kind, sqlite_path, pg_url) == expected
        cp = generate_checkpoint(channel_values={"x": 1}, channel_versions={"x": 1})
        cfg = await call(kind, saver, "put", generate_config(thread), cp, {}, {"x": 1})

        await setup(kind, saver)
        await setup(kind, saver)
        assert schema_versions(kind, sqlite_path, pg_url) == expected
        got = await call(kind, saver, "get_tuple", cfg)
        assert got is not None and got.checkpoint["channel_values"] == {"x": 1}

    # A second saver on the same, already set-up database changes nothing either.
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as again:
        assert schema_versions(kind, sqlite_path, pg_url) == expected
        got = await call(kind, again, "get_tuple", cfg)
        assert got is not None and got.checkpoint["id"] == cp["id"]
    assert (TABLES if is_postgres(kind) else SQLITE_TABLES) <= existing_tables(
        kind, sqlite_path, pg_url
    )


# --------------------------------------------------------------------------- 2. newer schema


@pytest.mark.parametrize("kind", KINDS)
async def test_schema_newer_than_code_raises_schema_version_error(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url):
        pass
    raw_sql(
        kind,
        sqlite_path,
        pg_url,
        "INSERT INTO agentcheck_schema (version, applied_at) VALUES (?, ?)",
        (999, "2099-01-01T00:00:00+00:00"),
    )

    async with open_without_setup(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        with pytest.raises(SchemaVersionError) as excinfo:
            await setup(kind, saver)
        message = str(excinfo.value)
        assert "999" in message
        assert "upgrade" in message.lower()

    # First use without an explicit setup() refuses the database the same way.
    async with open_without_setup(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        with pytest.raises(SchemaVersionError) as excinfo:
            await call(kind, saver, "get_tuple", generate_config("any-thread"))
        assert "999" in str(excinfo.value)
        cp = generate_checkpoint()
        with pytest.raises(SchemaVersionError):
            await call(kind, saver, "put", generate_config("any-thread"), cp, {}, {})

    # Nothing was written and the newer version is left as it was.
    assert raw_sql(kind, sqlite_path, pg_url, "SELECT COUNT(*) FROM agentcheck_checkpoints") == [
        (0,)
    ]
    assert schema_versions(kind, sqlite_path, pg_url)[-1] == 999


# ----------------------------------------------------------------- 3. inside a transaction


def _sqlite_user_connection(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE user_rows (name TEXT NOT NULL)")
    return conn


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_sqlite_setup_inside_open_transaction_leaves_the_outcome_to_the_caller(
    outcome: str, sqlite_path: str
) -> None:
    conn = _sqlite_user_connection(sqlite_path)
    try:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO user_rows (name) VALUES ('mine')")
        saver = SqliteSaver(conn)
        saver.setup()
        assert conn.in_transaction  # agentcheck did not commit or end the caller's transaction
        cp = generate_checkpoint(channel_values={"x": "v"}, channel_versions={"x": 1})
        cfg = saver.put(generate_config("in-tx"), cp, {}, {"x": 1})
        assert saver.get_tuple(cfg) is not None  # visible inside the transaction
        assert conn.in_transaction
        conn.execute(outcome.upper())
    finally:
        conn.close()

    rows = raw_sql("sqlite", sqlite_path, "", "SELECT name FROM user_rows")
    if outcome == "rollback":
        assert rows == []
        assert "agentcheck_checkpoints" not in existing_tables("sqlite", sqlite_path, "")
    else:
        assert rows == [("mine",)]
        assert SQLITE_TABLES <= existing_tables("sqlite", sqlite_path, "")
        assert schema_versions("sqlite", sqlite_path, "") == list(
            range(1, len(sqlite_backend.MIGRATIONS) + 1)
        )
        with SqliteSaver.from_conn_string(sqlite_path) as reader:
            got = reader.get_tuple(generate_config("in-tx"))
            assert got is not None and got.checkpoint["channel_values"] == {"x": "v"}


class _UserAbort(Exception):
    pass


@pytest.mark.parametrize("autocommit", [False, True], ids=["transactions", "autocommit"])
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_postgres_setup_inside_open_transaction_leaves_the_outcome_to_the_caller(
    outcome: str, autocommit: bool, pg_url: str
) -> None:
    """Inside the caller's transaction (psycopg's block, on a connection in autocommit or
    not), agentcheck's writes become part of it: they never commit it, and its rollback
    takes them back."""
    thread = f"in-tx-{uuid.uuid4()}"
    cp = generate_checkpoint(channel_values={"x": "v"}, channel_versions={"x": 1})
    with psycopg.connect(pg_url, autocommit=autocommit) as conn:
        conn.execute("CREATE TABLE user_rows (name TEXT NOT NULL)")
        if not autocommit:
            conn.commit()
        try:
            with conn.transaction():
                conn.execute("INSERT INTO user_rows (name) VALUES ('mine')")
                saver = PostgresSaver(conn)
                saver.setup()
                cfg = saver.put(generate_config(thread), cp, {"k": "v"}, {"x": 1})
                got = saver.get_tuple(cfg)
                assert got is not None and got.checkpoint["channel_values"] == {"x": "v"}
                assert [t.checkpoint["id"] for t in saver.list(None, filter={"k": "v"})] == [
                    cp["id"]
                ]
                if outcome == "rollback":
                    raise _UserAbort
        except _UserAbort:
            pass
        assert not conn.closed and not conn.broken

    rows = raw_sql("postgres", "", pg_url, "SELECT name FROM user_rows")
    if outcome == "rollback":
        assert rows == []
        assert "agentcheck_checkpoints" not in existing_tables("postgres", "", pg_url)
    else:
        assert rows == [("mine",)]
        assert TABLES <= existing_tables("postgres", "", pg_url)
        with PostgresSaver.from_conn_string(pg_url) as reader:
            got = reader.get_tuple(generate_config(thread))
            assert got is not None and got.checkpoint["id"] == cp["id"]


async def test_async_postgres_setup_inside_open_transaction_works(pg_url: str) -> None:
    thread = f"in-tx-{uuid.uuid4()}"
    cp = generate_checkpoint(channel_values={"x": "v"}, channel_versions={"x": 1})
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=False) as conn:
        async with conn.transaction():
            await conn.execute("CREATE TABLE user_rows (name TEXT NOT NULL)")
            await conn.execute("INSERT INTO user_rows (name) VALUES ('mine')")
            saver = AsyncPostgresSaver(conn)
            await saver.setup()
            cfg = await saver.aput(generate_config(thread), cp, {}, {"x": 1})
            got = await saver.aget_tuple(cfg)
            assert got is not None and got.checkpoint["channel_values"] == {"x": "v"}
    assert raw_sql("postgres", "", pg_url, "SELECT name FROM user_rows") == [("mine",)]
    async with AsyncPostgresSaver.from_conn_string(pg_url) as reader:
        got = await reader.aget_tuple(generate_config(thread))
        assert got is not None and got.checkpoint["id"] == cp["id"]


# --------------------------------------------------------------------------- 4. two processes

# Each worker opens its saver, says "ready", then blocks reading its stdin. All workers
# share one pipe as stdin, so closing its write end releases them at the same moment.
_WORKER = """
import sys
kind, target = sys.argv[1], sys.argv[2]
if kind == "sqlite":
    from agentcheck.savers import SqliteSaver as Saver
else:
    from agentcheck.savers import PostgresSaver as Saver
with Saver.from_conn_string(target) as saver:
    print("ready", flush=True)
    sys.stdin.read()
    saver.setup()
    print("done", flush=True)
"""

WORKERS = 2


def _setup_from_processes_at_once(kind: str, target: str) -> None:
    read_fd, write_fd = os.pipe()
    procs = []
    try:
        for _ in range(WORKERS):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _WORKER, kind, target],
                    stdin=read_fd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        os.close(read_fd)
        read_fd = -1
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.communicate(timeout=60)
        os.close(write_fd)  # the barrier: every worker's read() returns now
        write_fd = -1
        results = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert out.strip() == "done", (out, err)


def test_two_processes_set_up_a_fresh_sqlite_file_at_once(sqlite_path: str) -> None:
    _setup_from_processes_at_once("sqlite", sqlite_path)
    assert schema_versions("sqlite", sqlite_path, "") == list(
        range(1, len(sqlite_backend.MIGRATIONS) + 1)
    )
    assert SQLITE_TABLES <= existing_tables("sqlite", sqlite_path, "")


def test_two_processes_set_up_a_fresh_postgres_database_at_once(pg_url: str) -> None:
    _setup_from_processes_at_once("postgres", pg_url)
    assert schema_versions("postgres", "", pg_url) == list(range(1, len(pg_backend.MIGRATIONS) + 1))
    assert TABLES <= existing_tables("postgres", "", pg_url)


# --------------------------------------------------------------------------- 5. upgrades


def downgrade_to_version_2(kind: str, sqlite_path: str, pg_url: str) -> None:
    """The database as version 2 left it: the columns of migrations 3, 4 and 8 dropped,
    the run index of version 1 back, and the later migrations' records deleted."""
    raw_sql(kind, sqlite_path, pg_url, "ALTER TABLE agentcheck_checkpoints DROP COLUMN blob_keys")
    raw_sql(kind, sqlite_path, pg_url, "ALTER TABLE agentcheck_steps DROP COLUMN interrupts")
    raw_sql(kind, sqlite_path, pg_url, "ALTER TABLE agentcheck_steps DROP COLUMN asked_at")
    raw_sql(kind, sqlite_path, pg_url, "ALTER TABLE agentcheck_steps DROP COLUMN attempt_task")
    raw_sql(kind, sqlite_path, pg_url, "DROP INDEX agentcheck_checkpoints_run_idx")
    raw_sql(kind, sqlite_path, pg_url, RUN_INDEX_V1)
    raw_sql(kind, sqlite_path, pg_url, "DELETE FROM agentcheck_schema WHERE version >= 3")


RUN_INDEX_V1 = "CREATE INDEX agentcheck_checkpoints_run_idx ON agentcheck_checkpoints (run_id)"


def run_index(kind: str, sqlite_path: str, pg_url: str) -> tuple[str, str]:
    """The checkpoints' run index as the database defines it, and how it reads the
    checkpoints of given runs (delete_for_runs' look-up)."""
    # delete_for_runs' own look-up, with its placeholders.
    select = SQL.SELECT_RUN_CHECKPOINTS.format(runs="?, ?")
    runs = ("r-1", "r-2")
    if is_postgres(kind):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            (definition,) = conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'agentcheck_checkpoints_run_idx'"
            ).fetchone()
            conn.execute("SET enable_seqscan = off")  # a tiny table: the planner could scan
            explain = "EXPLAIN " + select.replace("?", "%s")
            plan = "\n".join(row[0] for row in conn.execute(explain, runs))
        return definition, plan
    with sqlite3.connect(sqlite_path) as conn:
        (definition,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'agentcheck_checkpoints_run_idx'"
        ).fetchone()
        plan = "\n".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + select, runs))
    return definition, plan


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_steps_completed_before_version_4_replay_after_the_upgrade(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """Migration 4 adds the steps' ``interrupts``: NULL in rows written before, read as
    none asked; migration 8 their ``asked_at``: NULL, no question of the ask policy."""
    runs: list[int] = []

    @side_effect
    def charge(amount: int) -> int:
        runs.append(amount)
        return amount

    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        with effect_scope(saver.journal, "order-1"):
            assert charge(5) == 5
    downgrade_to_version_2(kind, sqlite_path, pg_url)
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as upgraded:
        assert schema_versions(kind, sqlite_path, pg_url) == [1, 2, 3, 4, 5, 6, 7, 8]
        (step,) = upgraded.journal.steps(scope="order-1")
        assert (step.status, step.interrupts, step.result) == ("completed", 0, 5)
        assert (step.asked_at, step.attempt_task) == (None, None)
        with effect_scope(upgraded.journal, "order-1"):
            assert charge(5) == 5  # replayed
    assert runs == [5]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_version_2_database_is_upgraded_and_its_rows_read_back(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """Migration 3 adds the checkpoints' ``blob_keys`` (what a read looks up, so that one
    statement reads a checkpoint and its values). Rows written before have none: they
    are read as before, in two steps, and read back the same."""
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        await chat_turns(kind, saver, "chat", 12)  # deltas, snapshots, pending writes
        before = await every_checkpoint(kind, saver, "chat")
    assert len(before) > 30
    # The database as version 2 left it: no columns, no record of migrations 3 and 4.
    downgrade_to_version_2(kind, sqlite_path, pg_url)

    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as upgraded:
        assert schema_versions(kind, sqlite_path, pg_url) == [1, 2, 3, 4, 5, 6, 7, 8]
        keys = raw_sql(kind, sqlite_path, pg_url, "SELECT blob_keys FROM agentcheck_checkpoints")
        assert keys and all(k is None for (k,) in keys)
        assert await every_checkpoint(kind, upgraded, "chat") == before
        # New checkpoints get their keys, and the thread goes on.
        graph = chat_graph().compile(checkpointer=upgraded)
        await run_chat(graph, kind, "chat", 14, start=12)
        state = await call(kind, graph, "get_state", {"configurable": {"thread_id": "chat"}})
        contents = [str(m.content).split(" x")[0] for m in state.values["messages"]]
        assert contents == [f"{q} {n}" for n in range(14) for q in ("question", "answer")]
    keys = raw_sql(kind, sqlite_path, pg_url, "SELECT blob_keys FROM agentcheck_checkpoints")
    assert sum(k is not None for (k,) in keys) == len(keys) - len(before)


@pytest.mark.parametrize("kind", ["postgres", "async_postgres"])
async def test_an_upgrade_leaves_prepared_statements_working(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """Connections that prepare every statement (prepare_threshold=0, as LangGraph's docs
    advise) keep working after setup() applied a migration that alters a table: psycopg
    drops its prepared statements after an ALTER, and in pipeline mode would drop the
    next one it prepares too, making every later put fail."""
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        await chat_turns(kind, saver, "chat", 2)
    downgrade_to_version_2(kind, sqlite_path, pg_url)

    # A pool as LangGraph's docs make one (agentcheck's own pools check each connection
    # they hand out, a query that happens to send the DEALLOCATE ALL first).
    kwargs = {"autocommit": True, "prepare_threshold": 0}
    if is_async(kind):
        pool: Any = psycopg_pool.AsyncConnectionPool(
            pg_url, min_size=1, max_size=1, kwargs=kwargs, open=False
        )
        await pool.open()
        upgraded: Any = AsyncPostgresSaver(pool)
    else:
        pool = psycopg_pool.ConnectionPool(
            pg_url, min_size=1, max_size=1, kwargs=kwargs, open=False
        )
        pool.open()
        upgraded = PostgresSaver(pool)
    try:
        await setup(kind, upgraded)
        assert schema_versions(kind, sqlite_path, pg_url) == [1, 2, 3, 4, 5, 6, 7, 8]
        graph = chat_graph().compile(checkpointer=upgraded)
        await run_chat(graph, kind, "chat", 6, start=2)
        state = await call(kind, graph, "get_state", {"configurable": {"thread_id": "chat"}})
        assert len(state.values["messages"]) == 12
    finally:
        await pool.close() if is_async(kind) else pool.close()


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_migration_5_leaves_checkpoints_without_a_run_out_of_the_run_index(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """The run index becomes partial (a put of a checkpoint without a run id writes no
    entry), still serves delete_for_runs' look-up, which deletes exactly the runs asked."""
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        for thread, run_id in (("a", "r-1"), ("b", "r-2"), ("c", None), ("d", "r-3")):
            metadata = {"source": "loop", "step": 1} | ({"run_id": run_id} if run_id else {})
            saver.put(generate_config(thread), generate_checkpoint(), metadata, {})
    downgrade_to_version_2(kind, sqlite_path, pg_url)
    assert "WHERE" not in run_index(kind, sqlite_path, pg_url)[0]

    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as upgraded:
        assert schema_versions(kind, sqlite_path, pg_url) == [1, 2, 3, 4, 5, 6, 7, 8]
        definition, plan = run_index(kind, sqlite_path, pg_url)
        assert "WHERE" in definition and "run_id IS NOT NULL" in definition
        assert "agentcheck_checkpoints_run_idx" in plan, plan
        upgraded.delete_for_runs(["r-1", "r-2"])
        left = raw_sql(kind, sqlite_path, pg_url, "SELECT thread_id FROM agentcheck_checkpoints")
        assert sorted(thread for (thread,) in left) == ["c", "d"]


# -- read-only connections -----------------------------------------------------------------


def _read_only(kind: str, sqlite_path: str, pg_url: str) -> str:
    """A connection string to the same database that cannot write."""
    if is_postgres(kind):
        return pg_url + "?options=-c%20default_transaction_read_only%3Don"
    return f"file:{sqlite_path}?mode=ro"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_database_set_up_opens_on_a_read_only_connection(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """setup() wrote even when nothing was to change (on PostgreSQL its CREATE TABLE IF
    NOT EXISTS is refused in a read-only transaction): a dashboard on a read-only
    connection could not open a database. One already at this version is now set up by
    reads alone."""
    saver_cls: Any = PostgresSaver if is_postgres(kind) else SqliteSaver
    writable = pg_url if is_postgres(kind) else sqlite_path
    with saver_cls.from_conn_string(writable) as saver:
        saver.setup()
        cfg = generate_config("t1")
        saver.put(cfg, generate_checkpoint(), {"source": "input", "user": "ann"}, {})
    with saver_cls.from_conn_string(_read_only(kind, sqlite_path, pg_url)) as reader:
        reader.setup()
        assert reader.get_tuple(generate_config("t1")) is not None
        assert len(list(reader.list(None, filter={"user": "ann"}))) == 1


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_an_older_schema_on_a_read_only_connection_says_what_to_do(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """A database at an older schema version, opened read-only, failed with the database's
    own "readonly" error; it now says that setup() needs write access to upgrade it."""
    saver_cls: Any = PostgresSaver if is_postgres(kind) else SqliteSaver
    writable = pg_url if is_postgres(kind) else sqlite_path
    with saver_cls.from_conn_string(writable) as saver:
        saver.setup()
    raw_sql(kind, sqlite_path, pg_url, "DELETE FROM agentcheck_schema WHERE version >= 7")
    raw_sql(kind, sqlite_path, pg_url, "DROP TABLE agentcheck_settings")
    raw_sql(kind, sqlite_path, pg_url, "ALTER TABLE agentcheck_steps DROP COLUMN asked_at")
    raw_sql(kind, sqlite_path, pg_url, "ALTER TABLE agentcheck_steps DROP COLUMN attempt_task")
    with saver_cls.from_conn_string(_read_only(kind, sqlite_path, pg_url)) as reader:
        with pytest.raises(SchemaVersionError, match="read-only, so setup\\(\\) cannot upgrade"):
            reader.setup()
    with saver_cls.from_conn_string(writable) as writer:
        writer.setup()
    assert schema_versions(kind, sqlite_path, pg_url) == [1, 2, 3, 4, 5, 6, 7, 8]
