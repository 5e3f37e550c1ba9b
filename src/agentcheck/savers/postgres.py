"""PostgreSQL savers: for work shared by many processes or machines.

Requires ``pip install 'agentcheck[postgres]'`` (psycopg 3, psycopg-pool and zstandard).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from langgraph.checkpoint.serde.base import SerializerProtocol

from agentcheck.backends import postgres as backend
from agentcheck.backends.base import Operation
from agentcheck.savers.base import AsyncSaver, SyncSaver

__all__ = ["AsyncPostgresSaver", "PostgresSaver"]

T = TypeVar("T")

# Values from 2 KiB up are compressed here, with zstd, rather than by the server: PostgreSQL
# compresses a row of that size itself (pglz) when it stores it, about 5x slower than zstd
# (0.8 ms for a 57 KB chat, which zstd compresses to 10% fewer bytes), and decompresses
# it for every read before sending the whole of it (docs/savers.md, "Storage").
PG_COMPRESS_THRESHOLD = 2048


class PostgresSaver(SyncSaver):
    """A LangGraph checkpointer in PostgreSQL (drop-in for ``langgraph-checkpoint-postgres``).

    ```python
    with PostgresSaver.from_conn_string("postgresql://...") as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)
    ```

    Args:
        conn: a psycopg ``Connection`` or, recommended, a ``psycopg_pool.ConnectionPool``
            (broken connections are then replaced and the operation retried). Any
            ``row_factory`` and autocommit setting works.
        compress_threshold: values of at least this many bytes are compressed with
            zstd before they are sent: by default 2 KiB, or 64 KiB when encrypting.
        serde, allowed_types, encryption_key, journal_nodes: see
            :class:`~agentcheck.savers._core.SaverCore`.
    """

    sql = backend.PostgresSQL
    migrations = backend.MIGRATIONS
    default_compress_threshold = PG_COMPRESS_THRESHOLD

    def __init__(
        self,
        conn: Any,
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
            compression="zstd",
            journal_nodes=journal_nodes,
        )
        self.conn = conn
        self._runner = backend.SyncRunner(conn)

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        pipeline: bool = False,
        pool_size: int = 10,
        connection_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Iterator[PostgresSaver]:
        """Open a saver on a health-checked connection pool, closed on exit.

        Args:
            conn_string: a libpq URL or DSN.
            pipeline: accepted for compatibility with the official saver; agentcheck
                batches each operation's statements itself.
            pool_size: maximum connections in the pool.
            connection_kwargs: extra ``psycopg.connect`` arguments (for pgbouncer in
                transaction mode: ``{"prepare_threshold": None}``).
            **kwargs: passed to the constructor.
        """
        del pipeline
        pool = backend.make_pool(conn_string, max_size=pool_size, **(connection_kwargs or {}))
        try:
            yield cls(pool, **kwargs)
        finally:
            pool.close()

    def _run(self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True) -> T:
        return self._runner.run(make_op, write, durable)


class AsyncPostgresSaver(AsyncSaver):
    """The asyncio PostgreSQL saver (drop-in for the official ``AsyncPostgresSaver``).

    Accepts a psycopg ``AsyncConnection`` or, recommended, a
    ``psycopg_pool.AsyncConnectionPool``.
    """

    sql = backend.PostgresSQL
    migrations = backend.MIGRATIONS
    default_compress_threshold = PG_COMPRESS_THRESHOLD

    def __init__(
        self,
        conn: Any,
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
            compression="zstd",
            journal_nodes=journal_nodes,
        )
        self.conn = conn
        self._runner = backend.AsyncRunner(conn)
        self._bind_loop()

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str,
        *,
        pipeline: bool = False,
        pool_size: int = 10,
        connection_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AsyncPostgresSaver]:
        """Open a saver on a health-checked async pool (see
        :meth:`PostgresSaver.from_conn_string`)."""
        del pipeline
        pool = await backend.amake_pool(
            conn_string, max_size=pool_size, **(connection_kwargs or {})
        )
        try:
            yield cls(pool, **kwargs)
        finally:
            await pool.close()

    async def _arun(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        return await self._runner.run(make_op, write, durable)
