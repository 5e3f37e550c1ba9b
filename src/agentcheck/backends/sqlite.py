"""SQLite: connection set-up, migrations and the driver that runs operations.

One function, :func:`run`, executes a whole operation inside one transaction on a
``sqlite3`` connection. The sync saver calls it under a lock; the async saver calls it
on aiosqlite's worker thread, so an operation costs one thread hop, not one per statement.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from agentcheck.backends.base import SQL, Operation, Query, Rows, drive, portable_migrations

__all__ = ["MIGRATIONS", "PRAGMAS", "SqliteSQL", "configure", "connect", "run", "sqlite_path"]

T = TypeVar("T")


class SqliteSQL(SQL):
    """SQLite uses the portable SQL as it is."""


# INTEGER PRIMARY KEY is the rowid: assigned in insert order.
MIGRATIONS = portable_migrations("BLOB", "INTEGER PRIMARY KEY", pending_terms=True)

# Set in one place, on every connection agentcheck opens:
# - WAL lets readers run while one writer commits, across processes;
# - synchronous=FULL makes a committed checkpoint survive power loss, not only a crash
#   of the process (agentcheck is about surviving crashes; it costs one more fsync);
# - busy_timeout makes a second process wait for the write lock instead of failing.
PRAGMAS = (
    "PRAGMA busy_timeout=30000",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
)


def sqlite_path(conn_string: str) -> tuple[str, bool]:
    """``(database, uri)`` for sqlite3.connect from a path, ``file:`` URI or ``sqlite:///`` URL."""
    if conn_string.startswith("sqlite:///"):
        return conn_string[len("sqlite:///") :] or ":memory:", False
    if conn_string.startswith("sqlite://"):
        return ":memory:", False
    return conn_string, conn_string.startswith("file:")


def configure(conn: sqlite3.Connection) -> None:
    """Apply :data:`PRAGMAS` to a connection agentcheck owns."""
    for pragma in PRAGMAS:
        # Switching a new file to WAL needs an exclusive lock and SQLite may answer BUSY
        # at once, without waiting, when another process is opening the file too.
        for attempt in range(100):
            try:
                conn.execute(pragma)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 99:
                    raise
                time.sleep(0.05)


def connect(conn_string: str) -> sqlite3.Connection:
    """Open and configure a connection for a sync saver (autocommit mode: agentcheck
    opens its own transactions)."""
    database, uri = sqlite_path(conn_string)
    conn = sqlite3.connect(database, uri=uri, check_same_thread=False, isolation_level=None)
    configure(conn)
    return conn


def _execute(conn: sqlite3.Connection, query: Query) -> Rows:
    if query.many:
        conn.executemany(query.sql, query.params)
        return []
    cursor = conn.execute(query.sql, tuple(query.params))
    return cursor.fetchall() if query.fetch else []


_FULL = 2  # PRAGMA synchronous: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA
# Connections a relaxed commit (run's durable=False) has set to NORMAL: the level to put
# back and the run that set it. Recorded before the switch and removed by that run once
# it has put the level back, so that a run stopped in between (a KeyboardInterrupt, or a
# ROLLBACK that failed and left a transaction open) is repaired by the connection's next
# run, instead of every later commit running at NORMAL. (sqlite3 connections take no
# weak references: an entry lives from one statement to the next, unless a run was
# stopped; entries of closed connections are dropped by the next repair.)
_RELAXED: dict[sqlite3.Connection, tuple[int, object]] = {}
_RELAXED_LOCK = threading.Lock()


def _relax(conn: sqlite3.Connection, token: object) -> int | None:
    """Switch to NORMAL if the connection is in WAL mode at FULL or EXTRA; the level it
    had, or None if nothing was changed."""
    level = int(conn.execute("PRAGMA synchronous").fetchone()[0])
    # In WAL mode only: with a rollback journal, NORMAL risks corruption, not a loss.
    if level < _FULL or str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        return None
    with _RELAXED_LOCK:
        _RELAXED[conn] = (level, token)
    conn.execute("PRAGMA synchronous=NORMAL")
    return level


def _restore(conn: sqlite3.Connection, level: int, token: object) -> None:
    """Put the level back, unless a transaction is open (the level cannot change in one:
    the connection's next run does it), and forget the entry if it is still this run's."""
    try:
        if conn.in_transaction:
            return
        conn.execute(f"PRAGMA synchronous={level}")  # an int read from SQLite
    except sqlite3.Error:
        return  # a closed connection, say: not worth hiding the error being raised
    with _RELAXED_LOCK:
        if _RELAXED.get(conn, (None, None))[1] is token:
            del _RELAXED[conn]


def _repair(conn: sqlite3.Connection) -> None:
    """Put back a level a stopped run left relaxed on ``conn``, and drop the entries of
    connections closed since."""
    with _RELAXED_LOCK:
        entries = list(_RELAXED.items())
    for other, (level, token) in entries:
        if other is conn:
            _restore(conn, level, token)
            continue
        try:
            other.in_transaction  # noqa: B018 (raises once the connection is closed)
        except sqlite3.ProgrammingError as exc:
            if "closed" in str(exc):  # not: another thread's connection
                with _RELAXED_LOCK:
                    _RELAXED.pop(other, None)


def _roll_back_savepoint(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK TO agentcheck")
    except sqlite3.OperationalError as exc:
        if "no such savepoint" in str(exc):
            return  # SAVEPOINT itself was not made
        raise
    conn.execute("RELEASE agentcheck")


def run(
    conn: sqlite3.Connection,
    make_op: Callable[[], Operation[T]],
    write: bool,
    durable: bool = True,
) -> T:
    """Run one operation in one transaction, then its OnCommit callbacks.

    Writers take the write lock up front (``BEGIN IMMEDIATE``) so that two processes
    never deadlock upgrading read locks. Inside a transaction the caller already opened,
    a savepoint is used and the caller's commit decides; the callbacks are then dropped,
    since nothing is known to be stored (the saver only forgoes what they would have
    remembered: the next version of a list is stored whole, not as a delta).

    ``durable=False``: the commit does not wait for the disk (``synchronous=NORMAL`` for
    this transaction, on a connection in WAL mode at FULL or EXTRA). The write still
    survives a crash of the process; a power failure may lose it, until the next durable
    commit makes every earlier one durable too (the log is written in order).
    """
    nested = conn.in_transaction
    if _RELAXED and not nested:
        _repair(conn)  # a level left relaxed by a run stopped before it could put it back
    callbacks: list[Callable[[], None]] = []
    token = object()
    relaxed_from: int | None = None
    try:
        # The level can only change outside a transaction (SQLite refuses it inside).
        if not durable and write and not nested:
            relaxed_from = _relax(conn, token)
        try:
            # Inside the try: a KeyboardInterrupt raised as BEGIN returns must not leave
            # the transaction open (every later run would only make savepoints in it).
            conn.execute(
                "SAVEPOINT agentcheck" if nested else ("BEGIN IMMEDIATE" if write else "BEGIN")
            )
            result = drive(make_op(), lambda q: _execute(conn, q), on_commit=callbacks)
            conn.execute("RELEASE agentcheck" if nested else "COMMIT")
        except BaseException:
            if nested:
                _roll_back_savepoint(conn)
            elif conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        # Whether or not the entry is still there (a run of another thread sharing the
        # connection may have repaired it meanwhile): this run switched, it switches back.
        if relaxed_from is not None:
            _restore(conn, relaxed_from, token)
    if not nested:
        for callback in callbacks:
            callback()
    return result
