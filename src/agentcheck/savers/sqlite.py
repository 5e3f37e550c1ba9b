"""SQLite savers: the embedded default, one file, no server."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import aiosqlite
from langgraph.checkpoint.serde.base import SerializerProtocol

from agentcheck.backends import sqlite as backend
from agentcheck.backends.base import Operation
from agentcheck.savers.base import AsyncSaver, SyncSaver

__all__ = ["AsyncSqliteSaver", "SqliteSaver"]

T = TypeVar("T")


class SqliteSaver(SyncSaver):
    """A LangGraph checkpointer in a SQLite file (drop-in for ``langgraph-checkpoint-sqlite``).

    ```python
    with SqliteSaver.from_conn_string("agent.db") as saver:
        graph = builder.compile(checkpointer=saver)
    ```

    Args:
        conn: a ``sqlite3.Connection``. Create it with ``check_same_thread=False`` if
            the graph runs nodes in threads. Connections opened by
            :meth:`from_conn_string` use WAL and ``synchronous=FULL``.
        serde, allowed_types, encryption_key, compress_threshold, journal_nodes: see
            :class:`~agentcheck.savers._core.SaverCore`.
    """

    sql = backend.SqliteSQL
    migrations = backend.MIGRATIONS

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[tuple[str, ...] | type] | None = None,
        encryption_key: bytes | str | None = None,
        compress_threshold: int | None = None,
        journal_nodes: bool = True,
    ) -> None:
        super().__init__(
            serde=serde,
            allowed_types=allowed_types,
            encryption_key=encryption_key,
            compress_threshold=compress_threshold,
            journal_nodes=journal_nodes,
        )
        self.conn = conn
        self.lock = threading.RLock()

    @classmethod
    @contextmanager
    def from_conn_string(cls, conn_string: str, **kwargs: Any) -> Iterator[SqliteSaver]:
        """Open a saver on a path (``"agent.db"``, ``":memory:"``, a ``file:`` URI or a
        ``sqlite:///`` URL), closed on exit. Keyword arguments go to the constructor."""
        conn = backend.connect(conn_string)
        try:
            yield cls(conn, **kwargs)
        finally:
            conn.close()

    def _run(self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True) -> T:
        with self.lock:
            return backend.run(self.conn, make_op, write, durable)


class AsyncSqliteSaver(AsyncSaver):
    """The asyncio SQLite saver (drop-in for ``langgraph-checkpoint-sqlite``'s ``aio``).

    ```python
    async with AsyncSqliteSaver.from_conn_string("agent.db") as saver:
        graph = builder.compile(checkpointer=saver)
    ```

    Each operation runs as one call on aiosqlite's worker thread: one thread hop per
    checkpoint operation, not one per statement.
    """

    sql = backend.SqliteSQL
    migrations = backend.MIGRATIONS

    def __init__(
        self,
        conn: aiosqlite.Connection,
        *,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[tuple[str, ...] | type] | None = None,
        encryption_key: bytes | str | None = None,
        compress_threshold: int | None = None,
        journal_nodes: bool = True,
    ) -> None:
        super().__init__(
            serde=serde,
            allowed_types=allowed_types,
            encryption_key=encryption_key,
            compress_threshold=compress_threshold,
            journal_nodes=journal_nodes,
        )
        self.conn = conn
        self._bind_loop()

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls, conn_string: str, **kwargs: Any
    ) -> AsyncIterator[AsyncSqliteSaver]:
        """Open a saver on a path or URL (see :meth:`SqliteSaver.from_conn_string`)."""
        database, uri = backend.sqlite_path(conn_string)
        async with aiosqlite.connect(database, uri=uri, isolation_level=None) as conn:
            await conn._execute(backend.configure, conn._conn)  # type: ignore[no-untyped-call]
            yield cls(conn, **kwargs)

    async def _arun(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        # aiosqlite's _execute runs a function on the connection's own thread; the whole
        # transaction happens there, so concurrent tasks cannot interleave inside it.
        result: T = await self.conn._execute(  # type: ignore[no-untyped-call]
            backend.run, self.conn._conn, make_op, write, durable
        )
        return result
