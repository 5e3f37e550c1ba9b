"""PostgreSQL connections that break: server restarts and killed backends.

A saver on a pool detects a broken connection, replaces it and carries on, whether the
pool is agentcheck's own (``from_conn_string``) or one the user made (without a health
check, with any row factory). A saver on a single connection cannot reconnect; its error
says to use a pool. A write that fails inside the caller's pipeline leaves the connection
usable.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from agentcheck.backends.base import Query
from agentcheck.savers import AsyncPostgresSaver, PostgresSaver

# --------------------------------------------------------------------------- helpers


def other_backends(pg_url: str) -> set[int]:
    """Pids of the server processes connected to this database, except the asker's."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return {r[0] for r in rows}


def terminate_other_backends(pg_url: str) -> set[int]:
    """Kill every other backend of this database and wait until they are gone."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, pg_terminate_backend(pid, 30000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    assert all(ok for _pid, ok in rows), rows
    return {pid for pid, _ok in rows}


def new_checkpoint(value: str, version: int) -> dict[str, Any]:
    return generate_checkpoint(channel_values={"x": value}, channel_versions={"x": version})


def child_config(config: dict[str, Any]) -> dict[str, Any]:
    return {"configurable": dict(config["configurable"])}


def check_sync_saver_recovers(saver: PostgresSaver, break_connections: Any) -> set[int]:
    """Put, break every connection, then read and write again; returns the killed pids
    (empty when the breaker does not report them)."""
    thread = f"recover-{uuid.uuid4()}"
    first = new_checkpoint("before", 1)
    cfg = saver.put(generate_config(thread), first, {"step": 1}, {"x": 1})
    saver.put_writes(cfg, [("x", "pending")], "task")

    killed = break_connections() or set()

    got = saver.get_tuple(cfg)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"x": "before"}
    assert got.pending_writes == [("task", "x", "pending")]
    second = new_checkpoint("after", 2)
    cfg2 = saver.put(child_config(cfg), second, {"step": 2}, {"x": 2})
    latest = saver.get_tuple(generate_config(thread))
    assert latest is not None and latest.checkpoint["id"] == second["id"]
    assert latest.parent_config is not None
    assert latest.parent_config["configurable"]["checkpoint_id"] == first["id"]
    assert [t.checkpoint["id"] for t in saver.list(generate_config(thread))] == [
        second["id"],
        first["id"],
    ]
    assert cfg2["configurable"]["checkpoint_id"] == second["id"]
    return killed


async def check_async_saver_recovers(saver: AsyncPostgresSaver, break_connections: Any) -> set[int]:
    """The async twin of :func:`check_sync_saver_recovers`."""
    thread = f"recover-{uuid.uuid4()}"
    first = new_checkpoint("before", 1)
    cfg = await saver.aput(generate_config(thread), first, {"step": 1}, {"x": 1})
    await saver.aput_writes(cfg, [("x", "pending")], "task")

    killed = break_connections() or set()

    got = await saver.aget_tuple(cfg)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"x": "before"}
    assert got.pending_writes == [("task", "x", "pending")]
    second = new_checkpoint("after", 2)
    await saver.aput(child_config(cfg), second, {"step": 2}, {"x": 2})
    latest = await saver.aget_tuple(generate_config(thread))
    assert latest is not None and latest.checkpoint["id"] == second["id"]
    assert [t.checkpoint["id"] async for t in saver.alist(generate_config(thread))] == [
        second["id"],
        first["id"],
    ]
    return killed


@contextmanager
def user_pool(pg_url: str, **kwargs: Any) -> Iterator[ConnectionPool]:
    """A pool the way users make one: psycopg_pool defaults (4 connections, no check=)."""
    pool = ConnectionPool(pg_url, open=False, **kwargs)
    pool.open(wait=True, timeout=30)
    try:
        yield pool
    finally:
        pool.close()


@asynccontextmanager
async def async_user_pool(pg_url: str, **kwargs: Any) -> AsyncIterator[AsyncConnectionPool]:
    pool = AsyncConnectionPool(pg_url, open=False, **kwargs)
    await pool.open(wait=True, timeout=30)
    try:
        yield pool
    finally:
        await pool.close()


# --------------------------------------------------------------------------- 1. server restart


def test_from_conn_string_pool_survives_server_restart(pg_server: Any, pg_url: str) -> None:
    with PostgresSaver.from_conn_string(pg_url) as saver:
        saver.setup()
        check_sync_saver_recovers(saver, pg_server.restart)


async def test_async_from_conn_string_pool_survives_server_restart(
    pg_server: Any, pg_url: str
) -> None:
    async with AsyncPostgresSaver.from_conn_string(pg_url) as saver:
        await saver.setup()
        await check_async_saver_recovers(saver, pg_server.restart)


def test_user_pool_without_check_survives_server_restart(pg_server: Any, pg_url: str) -> None:
    with user_pool(pg_url) as pool:
        assert pool.get_stats().get("pool_available", 0) > 1  # several idle connections to break
        saver = PostgresSaver(pool)
        saver.setup()
        check_sync_saver_recovers(saver, pg_server.restart)


def test_user_pool_with_dict_row_factory_works(pg_url: str) -> None:
    for autocommit in (False, True):
        kwargs = {"row_factory": dict_row, "autocommit": autocommit}
        with user_pool(pg_url, kwargs=kwargs, min_size=1, max_size=2) as pool:
            saver = PostgresSaver(pool)
            saver.setup()
            thread = f"dict-row-{uuid.uuid4()}"
            first = new_checkpoint("one", 1)
            cfg = saver.put(generate_config(thread), first, {"who": thread}, {"x": 1})
            saver.put_writes(cfg, [("x", "pending")], "task")
            second = new_checkpoint("two", 2)
            saver.put(child_config(cfg), second, {"who": thread}, {"x": 2})

            got = saver.get_tuple(cfg)
            assert got is not None
            assert got.checkpoint["channel_values"] == {"x": "one"}
            assert got.metadata["who"] == thread
            assert got.pending_writes == [("task", "x", "pending")]
            listed = list(saver.list(None, filter={"who": thread}))
            assert [t.checkpoint["id"] for t in listed] == [second["id"], first["id"]]
            assert listed[0].checkpoint["channel_values"] == {"x": "two"}
            saver.delete_thread(thread)
            assert saver.get_tuple(generate_config(thread)) is None
            # The pool's own connections keep their row factory.
            with pool.connection() as conn:
                assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}


# --------------------------------------------------------------------------- 2. single connection


def test_single_connection_broken_by_restart_says_to_use_a_pool(
    pg_server: Any, pg_url: str
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        cfg = saver.put(generate_config("single"), new_checkpoint("v", 1), {}, {"x": 1})
        pg_server.restart()
        with pytest.raises(psycopg.OperationalError) as excinfo:
            saver.get_tuple(cfg)
    message = str(excinfo.value)
    assert "single connection" in message
    assert "psycopg_pool.ConnectionPool" in message
    assert "from_conn_string" in message


async def test_async_single_connection_broken_by_restart_says_to_use_a_pool(
    pg_server: Any, pg_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        cfg = await saver.aput(generate_config("single"), new_checkpoint("v", 1), {}, {"x": 1})
        pg_server.restart()
        with pytest.raises(psycopg.OperationalError) as excinfo:
            await saver.aget_tuple(cfg)
    message = str(excinfo.value)
    assert "single connection" in message
    assert "psycopg_pool.AsyncConnectionPool" in message
    assert "from_conn_string" in message


# --------------------------------------------------------------------------- 3. killed backends


def _killer(pg_url: str) -> Any:
    def kill() -> set[int]:
        killed = terminate_other_backends(pg_url)
        assert killed  # the pool had connections to kill
        return killed

    return kill


def test_from_conn_string_pool_survives_killed_backends(pg_url: str) -> None:
    with PostgresSaver.from_conn_string(pg_url) as saver:
        saver.setup()
        killed = check_sync_saver_recovers(saver, _killer(pg_url))
        current = other_backends(pg_url)
        assert current and not killed & current  # the pool's connections are new ones


async def test_async_from_conn_string_pool_survives_killed_backends(pg_url: str) -> None:
    async with AsyncPostgresSaver.from_conn_string(pg_url) as saver:
        await saver.setup()
        killed = await check_async_saver_recovers(saver, _killer(pg_url))
        current = other_backends(pg_url)
        assert current and not killed & current


def test_user_pool_without_check_survives_killed_backends(pg_url: str) -> None:
    with user_pool(pg_url) as pool:
        saver = PostgresSaver(pool)
        saver.setup()
        killed = check_sync_saver_recovers(saver, _killer(pg_url))
        assert len(killed) > 1  # several idle pooled connections were broken


async def test_async_user_pool_without_check_survives_killed_backends(pg_url: str) -> None:
    async with async_user_pool(pg_url) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        killed = await check_async_saver_recovers(saver, _killer(pg_url))
        assert len(killed) > 1  # several idle pooled connections were broken


# ------------------------------------------------ a failed write in the caller's pipeline


def _duplicate() -> Any:
    """One statement that fails (a unique violation)."""
    yield Query("INSERT INTO uniq VALUES (?)", (1,))


def _duplicate_after_update() -> Any:
    """Two statements that cannot be joined into one, the second failing."""
    yield Query("UPDATE uniq SET n = n WHERE n = 0", ())
    yield Query("INSERT INTO uniq VALUES (?)", (1,))


def _note(n: int) -> Any:
    yield Query("INSERT INTO notes VALUES (?)", (n,))


def _tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (n INTEGER)")
        conn.execute("CREATE TABLE uniq (n INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO uniq VALUES (1)")


def _notes(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT n FROM notes ORDER BY n")]


@pytest.mark.parametrize(
    ("failing", "durable"),
    [(_duplicate, False), (_duplicate_after_update, True)],
    ids=["relaxed-one-statement", "durable-two-statements"],
)
def test_a_failed_write_in_the_callers_pipeline_leaves_the_connection_usable(
    pg_url: str, failing: Any, durable: bool
) -> None:
    """A write of the saver's own transaction that fails inside the caller's pipeline,
    on a connection with prepare_threshold=0 (as LangGraph's docs advise), raises its
    error and is rolled back so that psycopg forgets its prepared statements at once:
    sent as a statement, the ROLLBACK was only answered at the next operation, whose
    first statement the server then deallocated while psycopg still named it, and every
    later write failed. (A relaxed write is framed by BEGIN ... COMMIT even when it is
    one statement: it sets synchronous_commit for its own transaction.)"""
    _tables(pg_url)
    with psycopg.connect(pg_url, autocommit=True, prepare_threshold=0) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        with conn.pipeline():
            with pytest.raises(psycopg.errors.UniqueViolation):
                saver.run_op(failing, True, durable=durable)
            for n in range(4):
                saver.run_op(lambda n=n: _note(n), True, durable=n % 2 == 1)
    assert _notes(pg_url) == [0, 1, 2, 3]


async def test_a_failed_write_in_the_callers_async_pipeline_leaves_the_connection_usable(
    pg_url: str,
) -> None:
    """The same on an AsyncConnection."""
    _tables(pg_url)
    conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True, prepare_threshold=0)
    try:
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        async with conn.pipeline():
            with pytest.raises(psycopg.errors.UniqueViolation):
                await saver.arun_op(_duplicate, True, durable=False)
            for n in range(4):
                await saver.arun_op(lambda n=n: _note(n), True, durable=n % 2 == 1)
    finally:
        await conn.close()
    assert _notes(pg_url) == [0, 1, 2, 3]


# ------------------------------------- a write that commits with its last statement


def _final_note(n: int) -> Any:
    """A write that commits with its last statement (Query.final), then reads."""
    yield Query("INSERT INTO notes VALUES (?)", (n,))
    rows = yield Query(
        "INSERT INTO notes VALUES (?) RETURNING n", (n + 100,), fetch=True, final=True
    )
    (count,) = (yield Query("SELECT count(*) FROM notes", (), fetch=True))[0]
    return rows[0][0], count


def _final_duplicate() -> Any:
    """A write whose final statement fails: the statement before it must go too."""
    yield Query("INSERT INTO notes VALUES (?)", (7,))
    yield Query("INSERT INTO uniq VALUES (?) RETURNING n", (1,), fetch=True, final=True)


def _write_after_final() -> Any:
    yield Query("INSERT INTO notes VALUES (?) RETURNING n", (8,), fetch=True, final=True)
    yield Query("INSERT INTO notes VALUES (?)", (9,))


@contextmanager
def _connection_in(mode: str, url: str) -> Iterator[tuple[Any, Any]]:
    """(connection, the caller's block around the saver's operations) for ``mode``."""
    if mode == "pool":
        with ConnectionPool(url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
            yield pool, contextlib.nullcontext()
        return
    autocommit = mode != "not-autocommit"
    with psycopg.connect(url, autocommit=autocommit, prepare_threshold=0) as conn:
        if mode == "callers-pipeline":
            yield conn, conn.pipeline()
        elif mode == "callers-transaction":
            yield conn, conn.transaction()
        else:
            yield conn, contextlib.nullcontext()


@pytest.mark.parametrize(
    "mode",
    ["pool", "connection", "callers-pipeline", "callers-transaction", "not-autocommit"],
)
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "relaxed"])
def test_a_write_that_commits_with_its_final_statement(
    pg_url: str, mode: str, durable: bool
) -> None:
    """Query.final (the operation writes nothing after that statement): the write and
    its answer are one round trip with the commit where the saver frames the write
    itself, and a plain statement of the caller's transaction otherwise. Either way the
    answer comes back, a read may follow, a failing final statement takes the whole
    write back with it, and the connection goes on working."""
    _tables(pg_url)
    with _connection_in(mode, pg_url) as (conn, block):
        saver = PostgresSaver(conn)
        saver.setup()
        with block:
            assert saver.run_op(lambda: _final_note(1), True, durable=durable) == (101, 2)
            if mode != "callers-transaction":  # a failure there aborts the caller's too
                with pytest.raises(psycopg.errors.UniqueViolation):
                    saver.run_op(_final_duplicate, True, durable=durable)
            assert saver.run_op(lambda: _final_note(2), True, durable=durable) == (102, 4)
        if mode == "not-autocommit":
            conn.commit()
    assert _notes(pg_url) == [1, 2, 101, 102]


def test_a_write_after_the_final_statement_is_refused(pg_url: str) -> None:
    """An operation that writes after its final statement (a mistake: it has committed
    already) gets an error naming it, not a write outside its transaction."""
    _tables(pg_url)
    with PostgresSaver.from_conn_string(pg_url) as saver:
        with pytest.raises(RuntimeError, match="a write after its operation's final statement"):
            saver.run_op(_write_after_final, True)
    assert _notes(pg_url) == [8]


async def test_a_write_that_commits_with_its_final_statement_async(pg_url: str) -> None:
    """The same on an AsyncConnection, framed by the saver and in the caller's pipeline."""
    _tables(pg_url)
    conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True, prepare_threshold=0)
    try:
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        for durable in (True, False):
            assert await saver.arun_op(lambda: _final_note(1), True, durable=durable) == (101, 2)
            with pytest.raises(psycopg.errors.UniqueViolation):
                await saver.arun_op(_final_duplicate, True, durable=durable)
            async with conn.pipeline():
                assert await saver.arun_op(lambda: _final_note(2), True, durable=durable) == (
                    102,
                    4,
                )
            await conn.execute("DELETE FROM notes")
    finally:
        await conn.close()
