"""Savers on fresh databases, with the same durability settings for agentcheck and the
official savers, and the helpers the workloads time with."""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver as OfficialPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver as OfficialSqliteSaver
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from agentcheck.backends import sqlite as sqlite_backend
from agentcheck.savers import PostgresSaver, SqliteSaver

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from pg_server import PostgresServer  # noqa: E402

__all__ = [
    "DBS",
    "IMPLS",
    "POOL_KWARGS",
    "pool_of",
    "Databases",
    "Db",
    "Impl",
    "Progress",
    "PostgresServer",
    "Store",
    "choices",
    "interleaved",
]

T = TypeVar("T")
Impl = Literal["agentcheck", "official"]
Db = Literal["sqlite", "postgres"]
IMPLS: tuple[Impl, Impl] = ("agentcheck", "official")
DBS: tuple[Db, ...] = ("sqlite", "postgres")

# What the official docs pass to psycopg for PostgresSaver; both savers get the same pool.
POOL_KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
POOL_MAX_SIZE = 10


def choices(
    parser: argparse.ArgumentParser, option: str, value: str, allowed: Sequence[str]
) -> tuple[Any, ...]:
    """The items of a comma-separated option, in ``allowed``'s order; an unknown or an
    empty list is an error naming the option."""
    chosen = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        parser.error(f"{option}: unknown {unknown or value!r}; choose from {', '.join(allowed)}")
    return tuple(v for v in allowed if v in chosen)


class Progress:
    """Progress lines on stderr, with the time since the start."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)


@dataclass
class Store:
    """A saver on a database of its own.

    ``size_bytes()`` is what the saver occupies: the SQLite file (after a WAL checkpoint)
    or the total size (tables, TOAST, indexes) of the PostgreSQL tables in its database.
    ``bulk()`` gives a saver on the same database with durability off, to fill it fast
    (PostgreSQL: ``synchronous_commit=off`` on its own pool), then ``analyze()``s it.
    ``analyze()`` refreshes PostgreSQL's planner statistics after a fill, as autovacuum
    would within a minute; SQLite keeps none unless asked, and neither saver asks.
    """

    impl: Impl
    db: Db
    saver: BaseCheckpointSaver[Any]
    size_bytes: Callable[[], int]
    bulk: Callable[[], AbstractContextManager[BaseCheckpointSaver[Any]]]
    analyze: Callable[[], None]
    path: Path | None = None  # the SQLite file


def sqlite_settings(conn: sqlite3.Connection) -> dict[str, Any]:
    """The durability settings a SQLite connection actually runs with."""
    return {
        "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
        "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
        "busy_timeout": conn.execute("PRAGMA busy_timeout").fetchone()[0],
    }


def open_official_sqlite(path: Path) -> sqlite3.Connection:
    """The connection ``SqliteSaver.from_conn_string`` opens (``check_same_thread=False``,
    sqlite3's default deferred transactions), with agentcheck's PRAGMAs applied so that
    both savers run with WAL, ``synchronous=FULL`` and the same ``busy_timeout``."""
    conn = sqlite3.connect(str(path), check_same_thread=False)
    for pragma in sqlite_backend.PRAGMAS:
        conn.execute(pragma)
    return conn


@dataclass
class Databases:
    """Where stores are made: SQLite files in a temp dir, databases on a PostgreSQL server."""

    tmp: Path
    pg: PostgresServer | None
    settings: dict[str, Any] = field(default_factory=dict)

    @contextmanager
    def open(self, impl: Impl, db: Db, name: str) -> Iterator[Store]:
        opener = self._sqlite if db == "sqlite" else self._postgres
        with opener(impl, name) as store:
            yield store

    @contextmanager
    def _sqlite(self, impl: Impl, name: str) -> Iterator[Store]:
        path = self.tmp / f"{name}-{impl}.db"
        saver: BaseCheckpointSaver[Any]
        if impl == "agentcheck":
            conn = sqlite_backend.connect(str(path))  # what SqliteSaver.from_conn_string opens
            saver = SqliteSaver(conn)
            saver.setup()
        else:
            conn = open_official_sqlite(path)
            saver = OfficialSqliteSaver(conn)
            saver.setup()
        self.settings.setdefault(f"sqlite_{impl}", sqlite_settings(conn))

        def size_bytes() -> int:
            if conn.in_transaction:
                conn.commit()
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            wal = Path(f"{path}-wal")
            return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

        @contextmanager
        def bulk() -> Iterator[BaseCheckpointSaver[Any]]:
            conn.execute("PRAGMA synchronous=OFF")
            try:
                yield saver
            finally:
                conn.execute("PRAGMA synchronous=FULL")

        try:
            yield Store(impl, "sqlite", saver, size_bytes, bulk, lambda: None, path)
        finally:
            conn.close()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

    @contextmanager
    def _postgres(self, impl: Impl, name: str) -> Iterator[Store]:
        if self.pg is None:
            raise RuntimeError("PostgreSQL was not started")
        server = self.pg
        url = server.create_database(f"bench_{name}_{impl}")
        pool = pool_of(url, POOL_MAX_SIZE)
        saver = _postgres_saver(impl, pool)

        def size_bytes() -> int:
            with pool.connection() as conn:
                row = conn.execute(
                    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) AS size "
                    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind = 'r'"
                ).fetchone()
                assert row is not None
                return int(row["size"])

        @contextmanager
        def bulk() -> Iterator[BaseCheckpointSaver[Any]]:
            fast = pool_of(url, 2, options="-c synchronous_commit=off")
            try:
                yield _postgres_saver(impl, fast, setup=False)
            finally:
                fast.close()
            analyze()

        def analyze() -> None:
            with pool.connection() as conn:
                conn.execute("ANALYZE")

        try:
            yield Store(impl, "postgres", saver, size_bytes, bulk, analyze)
        finally:
            pool.close()
            server.drop_database(url)


def pool_of(url: str, max_size: int, **extra: Any) -> ConnectionPool[Any]:
    pool: ConnectionPool[Any] = ConnectionPool(
        url, min_size=1, max_size=max_size, kwargs={**POOL_KWARGS, **extra}, open=False
    )
    pool.open(wait=True, timeout=30)
    return pool


def _postgres_saver(
    impl: Impl, pool: ConnectionPool[Any], *, setup: bool = True
) -> BaseCheckpointSaver[Any]:
    saver: BaseCheckpointSaver[Any]
    if impl == "agentcheck":
        saver = PostgresSaver(pool)
        if setup:
            saver.setup()
    else:
        official = OfficialPostgresSaver(pool)
        if setup:
            official.setup()
        saver = official
    return saver


def interleaved(rounds: int, names: tuple[T, ...]) -> Iterator[tuple[int, T]]:
    """``(round, name)`` for every round, the order of names rotating each round, so that
    no saver is always measured first (or always right after the other)."""
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            yield r, name


def timed_ms(fn: Callable[[], object]) -> float:
    """Run ``fn`` once; its duration in milliseconds."""
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e6
