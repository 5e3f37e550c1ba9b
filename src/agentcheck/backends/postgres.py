"""PostgreSQL: pools, migrations, reconnects and the drivers that run operations.

psycopg is imported here only, so ``import agentcheck`` works without the
``postgres`` extra.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import lru_cache
from typing import Any, TypeVar

from agentcheck._extras import require
from agentcheck.backends.base import (
    SQL,
    Operation,
    Query,
    Rows,
    adrive,
    drive,
    portable_migrations,
)

__all__ = ["MIGRATIONS", "AsyncRunner", "PostgresSQL", "SyncRunner"]

T = TypeVar("T")


class PostgresSQL(SQL):
    """PostgreSQL adds a transaction-scoped advisory lock around migrations."""

    # 0x61676e74 = "agnt": an arbitrary constant shared by every agentcheck process.
    MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(1634168436)"


MIGRATIONS = portable_migrations("BYTEA")


def _psycopg() -> Any:
    return require("psycopg", "postgres")


def _pool_module() -> Any:
    return require("psycopg_pool", "postgres")


@lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    """Our portable ``?`` placeholders in psycopg's ``%s`` style."""
    return sql.replace("?", "%s")


def _is_disconnect(exc: BaseException, conn: Any) -> bool:
    psycopg = _psycopg()
    return isinstance(exc, psycopg.OperationalError) and (
        conn is None or conn.closed or conn.broken
    )


class SyncRunner:
    """Runs operations on a psycopg ``Connection`` or ``ConnectionPool``.

    With a pool, connections are health-checked when taken out, and an operation that
    fails because its connection broke mid-way (a server restart, a killed backend) is
    retried once on a fresh connection: every operation is idempotent (upserts and
    deletes), so a retry cannot store anything twice. A lone connection cannot be
    replaced; its error says to use a pool.
    """

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.is_pool = isinstance(conn, _pool_module().ConnectionPool)
        self._lock = threading.Lock()

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        if self.is_pool:
            with self.conn.connection() as conn:
                yield conn
        else:
            with self._lock:
                yield self.conn

    def run(self, make_op: Callable[[], Operation[T]], write: bool) -> T:
        tuple_row = _psycopg().rows.tuple_row
        attempts = 2 if self.is_pool else 1
        for attempt in range(attempts):
            conn = None
            try:
                with self._connection() as conn:
                    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
                        return drive(make_op(), lambda q: _execute(cur, q))
            except Exception as exc:
                if attempt + 1 < attempts and _is_disconnect(exc, conn):
                    continue
                if not self.is_pool and _is_disconnect(exc, conn):
                    raise _psycopg().OperationalError(
                        f"{exc} (agentcheck was given a single connection, which cannot be "
                        "replaced once broken: pass a psycopg_pool.ConnectionPool, or use "
                        "PostgresSaver.from_conn_string, to reconnect automatically)"
                    ) from exc
                raise
        raise AssertionError("unreachable")


class AsyncRunner:
    """The async twin of :class:`SyncRunner`, for ``AsyncConnection`` / ``AsyncConnectionPool``."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.is_pool = isinstance(conn, _pool_module().AsyncConnectionPool)
        self._lock: asyncio.Lock | None = None

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        if self.is_pool:
            async with self.conn.connection() as conn:
                yield conn
        else:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                yield self.conn

    async def run(self, make_op: Callable[[], Operation[T]], write: bool) -> T:
        tuple_row = _psycopg().rows.tuple_row
        attempts = 2 if self.is_pool else 1
        for attempt in range(attempts):
            conn = None
            try:
                async with self._connection() as conn:
                    async with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
                        return await adrive(make_op(), lambda q: _aexecute(cur, q))
            except Exception as exc:
                if attempt + 1 < attempts and _is_disconnect(exc, conn):
                    continue
                if not self.is_pool and _is_disconnect(exc, conn):
                    raise _psycopg().OperationalError(
                        f"{exc} (agentcheck was given a single connection, which cannot be "
                        "replaced once broken: pass a psycopg_pool.AsyncConnectionPool, or "
                        "use AsyncPostgresSaver.from_conn_string, to reconnect automatically)"
                    ) from exc
                raise
        raise AssertionError("unreachable")


def _execute(cur: Any, query: Query) -> Rows:
    if query.many:
        cur.executemany(_pg(query.sql), query.params)
        return []
    cur.execute(_pg(query.sql), tuple(query.params))
    return cur.fetchall() if query.fetch else []


async def _aexecute(cur: Any, query: Query) -> Rows:
    if query.many:
        await cur.executemany(_pg(query.sql), query.params)
        return []
    await cur.execute(_pg(query.sql), tuple(query.params))
    return await cur.fetchall() if query.fetch else []


def pool_kwargs() -> dict[str, Any]:
    """Connection settings for pools agentcheck creates: autocommit (each operation
    opens its own transaction)."""
    return {"autocommit": True}


def make_pool(conn_string: str, *, max_size: int, **kwargs: Any) -> Any:
    """An opened ``ConnectionPool`` that health-checks each connection it hands out."""
    pool_cls = _pool_module().ConnectionPool
    pool = pool_cls(
        conn_string,
        min_size=1,
        max_size=max_size,
        kwargs={**pool_kwargs(), **kwargs},
        check=pool_cls.check_connection,
        open=False,
    )
    pool.open(wait=True, timeout=30)
    return pool


async def amake_pool(conn_string: str, *, max_size: int, **kwargs: Any) -> Any:
    """The async twin of :func:`make_pool`."""
    pool_cls = _pool_module().AsyncConnectionPool
    pool = pool_cls(
        conn_string,
        min_size=1,
        max_size=max_size,
        kwargs={**pool_kwargs(), **kwargs},
        check=pool_cls.check_connection,
        open=False,
    )
    await pool.open(wait=True, timeout=30)
    return pool
