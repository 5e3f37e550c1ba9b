"""PostgreSQL: pools, migrations, reconnects and the drivers that run operations.

psycopg is imported here only, so ``import agentcheck`` works without the
``postgres`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any, TypeVar

from agentcheck._extras import require
from agentcheck.backends.base import (
    SQL,
    Operation,
    Query,
    Rows,
    adrive,
    drive,
    get_tuple_statements,
    portable_migrations,
)

__all__ = ["MIGRATIONS", "AsyncRunner", "PostgresSQL", "SyncRunner"]

T = TypeVar("T")


class PostgresSQL(SQL):
    """PostgreSQL adds a transaction-scoped advisory lock around migrations, and keeps
    filter checks from being planned as joins."""

    # A put replaces its terms in the index itself (see SQL.PENDING_TERMS): here a
    # table of pending rows, added and deleted at every put, fills with dead row
    # versions until autovacuum comes, and a filtered list reads it whole (measured:
    # 313 pages for 31 live rows after 20,000 puts; the benchmark's filtered list went
    # from 1.04 to 1.34 ms).
    PENDING_TERMS = False
    DELETE_THREAD = tuple(q for q in SQL.DELETE_THREAD if "agentcheck_pending_terms" not in q)
    DELETE_CHECKPOINT = tuple(
        q for q in SQL.DELETE_CHECKPOINT if "agentcheck_pending_terms" not in q
    )
    COPY_THREAD_TERMS = tuple(
        q for q in SQL.COPY_THREAD_TERMS if "agentcheck_pending_terms" not in q
    )
    # 0x61676e74 = "agnt": an arbitrary constant shared by every agentcheck process.
    MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(1634168436)"
    # "OFFSET 0" keeps the planner from turning the check into a hash semi-join over
    # every row of a common term: it stays a primary-key probe per candidate, so a
    # filtered list walks its rarest term in order and stops at the limit.
    LIST_TERM = (
        "EXISTS (SELECT 1 FROM agentcheck_metadata_terms t WHERE t.term = ? "
        "AND t.thread_id = t0.thread_id AND t.checkpoint_ns = t0.checkpoint_ns "
        "AND t.checkpoint_id = t0.checkpoint_id OFFSET 0)"
    )
    TERM_STATS = (
        "SELECT most_common_vals::text::text[], most_common_freqs FROM pg_stats "
        "WHERE schemaname = current_schema() AND tablename = 'agentcheck_metadata_terms' "
        "AND attname = 'term'"
    )
    # A run's start or success and its event as one statement (a data-modifying CTE):
    # the event is appended only if the transition applied, without reading its answer
    # first, so a checkpoint that starts or ends a run is still one round trip. (Typed
    # placeholders: in a SELECT list PostgreSQL would take an untyped one as text.)
    _EVENT_SELECT = (
        "INSERT INTO agentcheck_events (run_id, ts, kind, phase, name, step_key, "
        "parent_seq, input_tokens, output_tokens, cost, payload_type, payload, error) "
        "SELECT {run_id}, ?::text, ?::text, ?::text, ?::text, ?::text, ?::bigint, ?::bigint, "
        "?::bigint, ?::double precision, ?::text, ?::bytea, ?::text FROM changed "
        "RETURNING seq"
    )
    _EVENT_FROM = _EVENT_SELECT.format(run_id="run_id")
    START_RUN_LOGGED = (
        "WITH changed AS ("
        + SQL.START_RUN.replace("RETURNING attempt", "RETURNING run_id")
        + ") "
        + _EVENT_FROM
    )
    MARK_SUCCEEDED_LOGGED = "WITH changed AS (" + SQL.MARK_SUCCEEDED + ") " + _EVENT_FROM
    # A step's claim, take-over or completion and its event, likewise: each is one
    # round trip (with Query.final, the commit included), and a retry after a commit
    # whose answer was lost appends no second event. The event names its own run (a
    # step may have none).
    _EVENT_IF_CHANGED = _EVENT_SELECT.format(run_id="?::text")
    CLAIM_STEP_LOGGED = "WITH changed AS (" + SQL.CLAIM_STEP + ") " + _EVENT_IF_CHANGED
    COMPLETE_STEP_LOGGED = "WITH changed AS (" + SQL.COMPLETE_STEP + ") " + _EVENT_IF_CHANGED
    # A take-over answers with the step as it left it (RECLAIM_STEP's columns): the
    # event is a part of its own. (Constant text joined: no input is formatted in.)
    RECLAIM_STEP_LOGGED = (
        "WITH changed AS ("  # noqa: S608
        + SQL.RECLAIM_STEP
        + "), logged AS ("
        + _EVENT_IF_CHANGED.removesuffix(" RETURNING seq")
        + ") SELECT * FROM changed"
    )
    # An insert of nothing, unless a value is missing: then a division by zero (of a
    # value the planner cannot fold) fails it, and the put with it. Written as an insert
    # so that it joins the put's statement (see _parts). The rows are locked (FOR KEY
    # SHARE) to be counted: under READ COMMITTED a plain count still sees a row that
    # another transaction has deleted but not yet committed, and the delta would then
    # be stored on a value about to be gone; locked, the count waits for that
    # transaction and leaves the row out once it is deleted. One statement for all the
    # put's deltas, locking in LOCK_THREAD_VALUES' order: a put and a deletion never
    # wait for each other both. (Blob rows are never updated: the lock holds up only a
    # delete of those very rows.) Parameters as COUNT_BLOBS', then the count expected.
    # ({pairs} is placeholders: no input is formatted in.)
    CHECK_BLOBS = (
        "INSERT INTO agentcheck_blobs (thread_id, checkpoint_ns, channel, version, type) "
        "SELECT '', '', '', '', (1 / (c.n - c.n))::text FROM (SELECT COUNT(*) AS n "
        # LATERAL: a primary-key look-up per pair, in the pairs' order (the planner,
        # left to join them, may scan the thread's values instead).
        "FROM (VALUES {pairs}) AS k CROSS JOIN LATERAL (SELECT 1 FROM agentcheck_blobs AS b "
        "WHERE b.thread_id = ? AND b.checkpoint_ns = ? AND b.channel = k.column1 "
        "AND b.version = k.column2 FOR KEY SHARE) AS l) AS c WHERE c.n < ?"
    )
    # The range in code point order, whatever the database's collation orders "|" and
    # "}" by (the scope's rows are found by the index, the range is a filter on them).
    TASK_HAS_CALLS = (
        'SELECT 1 FROM agentcheck_steps WHERE scope = ? AND step_key COLLATE "C" >= ? '
        'AND step_key COLLATE "C" < ? LIMIT 1'
    )
    THREAD_RUNS = SQL.THREAD_RUNS + " FOR UPDATE"
    SCHEMA_TABLE_EXISTS = "SELECT 1 WHERE to_regclass('agentcheck_schema') IS NOT NULL"
    # A transaction-level advisory lock keyed by the thread id's hash (the key of another
    # thread may be the same: two deletions of those then take turns, which is all).
    LOCK_THREAD_DELETION = (
        "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended(?, 0))) AS l"
    )
    # In code point order (COLLATE "C"), the order Python sorts CHECK_BLOBS' pairs in:
    # the database's own collation may order names otherwise.
    LOCK_THREAD_VALUES = (
        "SELECT COUNT(*) FROM (SELECT 1 FROM agentcheck_blobs WHERE thread_id = ? "
        'ORDER BY checkpoint_ns COLLATE "C", channel COLLATE "C", version COLLATE "C" '
        "FOR UPDATE) AS v"
    )
    # The keys as one text, channel and version after channel and version, separated by
    # the unit separator (chr(31)), split here into an array: no text can make the
    # statement fail (a JSON one could fail to parse). Sent as a string: psycopg takes
    # ~30 us to send a Python list as an array. The keys are split once, in a subquery
    # that "OFFSET 0" keeps apart (flattened, the split ran twice per key: 2 us a key),
    # and each is looked up by a lateral subquery: the planner cannot tell how few keys
    # a row names, and would hash the thread's values otherwise.
    _BLOBS_OF_KEYS = (
        "kv.channel, kv.version, NULL, NULL, b.type, b.blob, NULL, NULL FROM c "
        "CROSS JOIN LATERAL (SELECT s.k[2 * i - 1] AS channel, s.k[2 * i] AS version "
        "FROM (SELECT string_to_array(c.blob_keys, chr(31)) AS k) AS s, "
        "generate_series(1, cardinality(s.k) / 2) AS i OFFSET 0) AS kv "
        "LEFT JOIN LATERAL (SELECT x.type, x.blob FROM agentcheck_blobs x "
        "WHERE x.thread_id = c.thread_id AND x.checkpoint_ns = c.checkpoint_ns "
        "AND x.channel = kv.channel AND x.version = kv.version OFFSET 0) AS b ON true"
    )
    GET_TUPLE_BY_ID, GET_TUPLE_LATEST = get_tuple_statements(_BLOBS_OF_KEYS)

    @staticmethod
    def encode_blob_keys(keys: Mapping[str, Sequence[str]]) -> Any:
        parts = [x for channel, versions in keys.items() for v in versions for x in (channel, v)]
        if any(_UNIT_SEPARATOR in x for x in parts):
            return None  # a name holding the separator: the row is read the older way
        return _UNIT_SEPARATOR.join(parts)


_UNIT_SEPARATOR = chr(31)


def _in_do_block(statement: str) -> str:
    """An ALTER or DROP statement run from a DO block. psycopg forgets its prepared statements
    when a statement's status is ALTER (or DROP), and tells the server to as well
    (DEALLOCATE ALL) with its next command: in pipeline mode, after the statement it
    prepares in that command. The saver's next write then names a statement the server
    no longer has, on every call (seen with prepare_threshold=0, as LangGraph's docs
    advise). A DO block's status is DO; PostgreSQL itself replans prepared statements
    after a change of the tables they use."""
    if not statement.startswith(("ALTER ", "DROP ")):
        return statement
    return "DO $$ BEGIN " + statement + "; END $$"


MIGRATIONS = tuple(
    tuple(_in_do_block(statement) for statement in migration)
    for migration in portable_migrations(
        "BYTEA", "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", pending_terms=False
    )
)


# Cached: every operation asks for the module several times (cursors, status checks).
@cache
def _psycopg() -> Any:
    return require("psycopg", "postgres")


@cache
def _pool_module() -> Any:
    return require("psycopg_pool", "postgres")


@lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    """Our portable ``?`` placeholders as PostgreSQL's own ``$1, $2, ...``.

    Queries run on psycopg's raw cursors (:func:`_cursor`), which pass them on as they
    are: psycopg's ``%s`` style is parsed in Python at every execution of a long query
    (the look-up of many keys, say), about 3 us per placeholder.
    """
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))


def _cursor(conn: Any) -> Any:
    """A raw cursor (native placeholders) returning tuples, on a sync or async connection."""
    psycopg = _psycopg()
    raw = psycopg.AsyncRawCursor if isinstance(conn, psycopg.AsyncConnection) else psycopg.RawCursor
    return raw(conn, row_factory=psycopg.rows.tuple_row)


def _is_disconnect(exc: BaseException, conn: Any) -> bool:
    psycopg = _psycopg()
    return isinstance(exc, psycopg.OperationalError) and (
        conn is None or conn.closed or conn.broken
    )


@dataclass
class _Attempt:
    """How one attempt at an operation uses its connection (the same for both runners).

    Inside a transaction of the caller's, its commit decides: agentcheck's writes join
    it (a savepoint) and nothing is known stored afterwards, so the operation's OnCommit
    callbacks are dropped. Otherwise a write on an autocommit connection is framed by
    BEGIN/COMMIT statements of its own (:func:`_framed`).
    """

    outer: bool
    explicit: bool
    # Statements sent outside pipeline mode unless several go together (see _pipeline):
    # a write framed by its own BEGIN/COMMIT, on a connection not in the caller's own
    # pipeline (where a lone statement's error would only come at the caller's sync).
    lazy: bool
    callbacks: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def on(cls, conn: Any, write: bool) -> _Attempt:
        """How to run on ``conn``; in the caller's pipeline, only once it has synced (a
        BEGIN still queued there leaves the transaction status ACTIVE, not INTRANS)."""
        outer = _in_transaction(conn)
        explicit = write and conn.autocommit and not outer
        return cls(outer, explicit, explicit and not _in_pipeline(conn))

    def must_roll_back(self, conn: Any) -> bool:
        """After an error: whether our own transaction is still open on the server."""
        return self.explicit and _in_transaction(conn)

    def committed(self) -> None:
        if not self.outer:
            for callback in self.callbacks:
                callback()


# A transaction the server aborted to break a deadlock (or a serialization failure) left
# nothing behind: the operation is made again, from the start, a few times. Deadlocks
# can happen between a put and a deletion of the same thread, which lock rows of several
# tables (a run's row, its values) in the order their statements reach them.
_CONFLICT_RETRIES = 5
_CONFLICTS = frozenset(("40P01", "40001"))  # deadlock_detected, serialization_failure


def _retry_conflict(exc: Exception, runner: SyncRunner | AsyncRunner) -> bool:
    """Whether ``exc`` aborted our own transaction only, for a conflict: not inside a
    transaction of the caller's (which the server aborted too), on a lone connection."""
    if getattr(exc, "sqlstate", None) not in _CONFLICTS:
        return False
    return runner.is_pool or not _in_transaction(runner.conn)


def _conflict_pause(conflicts: int) -> float:
    """Seconds before the next try: growing, and random, so the two do not meet again."""
    return float(random.uniform(0.005, 0.02) * 2**conflicts)  # (int ** int is Any to mypy)


def _retry_or_raise(exc: Exception, conn: Any, is_pool: bool, last: bool, pool: str) -> None:
    """Return if the operation should be retried on another connection, else raise."""
    if not _is_disconnect(exc, conn):
        raise exc
    if not is_pool:
        raise _single_connection_error(exc, pool) from exc
    if last:
        raise exc


class SyncRunner:
    """Runs operations on a psycopg ``Connection`` or ``ConnectionPool``.

    With a pool, an operation that fails because its connection broke (a server restart,
    a killed backend) is retried on another connection, after asking the pool to drop
    its dead ones: every operation is idempotent (upserts and deletes), so a retry cannot
    store anything twice. A lone connection cannot be replaced; its error says to use a
    pool.
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

    def run(self, make_op: Callable[[], Operation[T]], write: bool, durable: bool = True) -> T:
        for conflicts in range(_CONFLICT_RETRIES + 1):
            try:
                return self._run(make_op, write, durable)
            except Exception as exc:
                if conflicts == _CONFLICT_RETRIES or not _retry_conflict(exc, self):
                    raise
                time.sleep(_conflict_pause(conflicts))
        raise AssertionError("unreachable")

    def _run(self, make_op: Callable[[], Operation[T]], write: bool, durable: bool) -> T:
        attempts = self.conn.max_size + 1 if self.is_pool else 1
        for tried in range(1, attempts + 1):
            conn = None
            try:
                with self._connection() as conn:
                    if _in_pipeline(conn):
                        with conn.pipeline() as pipeline:
                            pipeline.sync()  # the caller's BEGIN may be queued there
                    # A write is one round trip (see _Statements and _framed).
                    attempt = _Attempt.on(conn, write)
                    try:
                        with (
                            _pipeline(conn, write, attempt.lazy),
                            _transaction(conn, write, attempt.explicit),
                            _cursor(conn) as cur,
                        ):
                            statements = _Statements(conn, cur, write and not attempt.lazy)
                            result = drive(
                                _framed(make_op, attempt.explicit, relaxed=not durable),
                                statements.execute,
                                statements.execute_batch,
                                on_commit=attempt.callbacks,
                                execute_later=statements.execute_later,
                            )
                            statements.flush()
                        statements.collect()
                    except BaseException:
                        if attempt.must_roll_back(conn):
                            with contextlib.suppress(Exception):
                                conn.rollback()
                        raise
                attempt.committed()
                return result
            except Exception as exc:
                _retry_or_raise(exc, conn, self.is_pool, tried == attempts, "ConnectionPool")
                # A pool made without check= may hold more dead connections: drop them.
                self.conn.check()
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

    async def run(
        self, make_op: Callable[[], Operation[T]], write: bool, durable: bool = True
    ) -> T:
        for conflicts in range(_CONFLICT_RETRIES + 1):
            try:
                return await self._run(make_op, write, durable)
            except Exception as exc:
                if conflicts == _CONFLICT_RETRIES or not _retry_conflict(exc, self):
                    raise
                await asyncio.sleep(_conflict_pause(conflicts))
        raise AssertionError("unreachable")

    async def _run(self, make_op: Callable[[], Operation[T]], write: bool, durable: bool) -> T:
        attempts = self.conn.max_size + 1 if self.is_pool else 1
        for tried in range(1, attempts + 1):
            conn = None
            try:
                async with self._connection() as conn:
                    if _in_pipeline(conn):
                        async with conn.pipeline() as pipeline:
                            await pipeline.sync()
                    attempt = _Attempt.on(conn, write)
                    try:
                        async with (
                            _pipeline(conn, write, attempt.lazy),
                            _transaction(conn, write, attempt.explicit),
                            _cursor(conn) as cur,
                        ):
                            statements = _AsyncStatements(conn, cur, write and not attempt.lazy)
                            result = await adrive(
                                _framed(make_op, attempt.explicit, relaxed=not durable),
                                statements.execute,
                                statements.execute_batch,
                                on_commit=attempt.callbacks,
                                execute_later=statements.execute_later,
                            )
                            await statements.flush()
                        await statements.collect()
                    except BaseException:
                        if attempt.must_roll_back(conn):
                            with contextlib.suppress(Exception):
                                await conn.rollback()
                        raise
                attempt.committed()
                return result
            except Exception as exc:
                _retry_or_raise(exc, conn, self.is_pool, tried == attempts, "AsyncConnectionPool")
                await self.conn.check()
        raise AssertionError("unreachable")


def _pipeline(conn: Any, write: bool, lazy: bool) -> Any:
    """Pipeline mode for a write: its statements go out without waiting for each answer
    (in psycopg's transaction block, its BEGIN and COMMIT too). A ``lazy`` write (see
    _Attempt) enters it only for a burst of several statements (see :class:`_Statements`):
    a lone statement sent outside it (the joined put, a put_writes) is one round trip
    without the pipeline's own sync, about 20 us less per write. (One more round trip,
    once per statement shape and connection, when psycopg prepares it: outside pipeline
    mode it waits for the Parse.) A read waits for each answer anyway, and leaving
    pipeline mode costs one more round trip (its final sync)."""
    return conn.pipeline() if write and not lazy else _NO_BLOCK


def _transaction(conn: Any, write: bool, explicit: bool) -> Any:
    """psycopg's transaction block (a savepoint inside the caller's transaction), except
    for a write framed by :func:`_framed` and for a read on an autocommit connection,
    which needs none: under READ COMMITTED each statement sees its own snapshot anyway.
    (Without a block psycopg would leave a transaction open on a connection not in
    autocommit.)"""
    if explicit or (conn.autocommit and not write):
        return _NO_BLOCK
    return conn.transaction()


def _framed(
    make_op: Callable[[], Operation[T]], explicit: bool, *, relaxed: bool = False
) -> Operation[T]:
    """The operation, between BEGIN and COMMIT statements of its own when ``explicit``.

    In pipeline mode they go out with the operation's statements, so a write is one
    round trip; psycopg's transaction block waits for the server at BEGIN and at COMMIT.

    ``relaxed`` (a run's ``durable=False``): the commit does not wait for the WAL to
    reach the disk (``synchronous_commit`` off for this transaction only). The write
    survives a crash of the client, not always one of the server; a later durable
    commit makes it durable too (the WAL is flushed in order). Only in a transaction of
    our own, framed here (an autocommit connection): set in the caller's, it would relax
    the caller's commit.
    """
    if explicit:
        yield _BEGIN
        if relaxed:
            yield _RELAXED
    result = yield from make_op()
    if explicit:
        yield _COMMIT
    return result


_BEGIN, _COMMIT = Query("BEGIN"), Query("COMMIT")
_RELAXED = Query("SET LOCAL synchronous_commit TO OFF")
# A block that does nothing, for `with` and `async with` alike.
_NO_BLOCK = contextlib.nullcontext()


def _one_statement(queries: Sequence[Query], *, answer_last: bool = False) -> Query | None:
    """The queries as one statement, if that changes nothing, else None.

    One query of one row is sent as it is. Plain inserts (``VALUES``; DO UPDATE for one
    row only) and deletes, none reading another table or returning rows, are joined as
    data-modifying CTEs. The parts of one statement share a snapshot and none sees
    another's changes, so two of them may touch the same table only if the earlier one
    is marked ``disjoint`` (see Query). The last query may also be any other DML (one
    that reads, or returns rows): it becomes the main part, whose rows are the joined
    statement's, if it names no table an earlier part writes. With ``answer_last`` its
    rows are read (a Later).
    """
    if len(queries) == 1 and (not queries[0].many or len(queries[0].params) == 1):
        query = queries[0]
        return Query(query.sql, query.params[0]) if query.many else query
    if any(q.many and not q.params for q in queries):
        return None
    count = sum(len(q.params) * len(q.params[0]) if q.many else len(q.params) for q in queries)
    if count > _MAX_PARAMS:
        return None  # PostgreSQL takes at most 65,535 parameters in one statement
    shape = tuple(
        (q.sql, len(q.params) if q.many else 0, q.disjoint or q.check, q.check) for q in queries
    )
    sql = _joined(shape, answer_last)
    if sql is None:
        return None
    params: list[Any] = []
    for query in queries:
        if query.many:
            for row in query.params:
                params.extend(row)
        else:
            params.extend(query.params)
    return Query(sql, params, fetch=answer_last)


_MAX_PARAMS = 65535


@lru_cache(maxsize=256)
def _joined(
    shape: tuple[tuple[str, int, bool, bool], ...], answer_last: bool = False
) -> str | None:
    """``WITH s0 AS (part 0), ... part n`` for statements of ``(sql, rows, disjoint)``
    (rows 0: a single statement; n: an insert of n rows), or None (see _one_statement)."""
    built = None if answer_last else _parts(shape)
    if built is not None:
        parts = built[0]
    else:
        # The last statement as the main part: any DML, reading or returning rows too
        # (a run's transition and its event), if it names no table the others write.
        *head, (last, rows, _, _) = shape
        built = _parts(head)
        if rows or not head or not last.startswith(_DML) or built is None:
            return None
        if re.match(r"WITH\s+RECURSIVE\b", last, re.I) or _OUR_CTE.search(last):
            return None  # would not merge into our CTE list as it is
        parts, written = built
        if set(_TABLE.findall(last)) & written:
            return None  # it would not see what the earlier parts write
        if last.startswith("WITH "):  # its own CTEs follow the earlier parts
            ctes = ", ".join(f"s{i} AS ({part})" for i, part in enumerate(parts))
            return f"WITH {ctes}, {last[len('WITH ') :]}"
        parts.append(last)
    if len(parts) == 1:
        return parts[0]
    ctes = ", ".join(f"s{i} AS ({part})" for i, part in enumerate(parts[:-1]))
    return f"WITH {ctes} {parts[-1]}"


def _parts(
    shape: Sequence[tuple[str, int, bool, bool]],
) -> tuple[list[str], set[str]] | None:
    """The statements of ``(sql, rows, disjoint, check)`` as parts of one statement (an
    insert of n rows as one of n ``VALUES`` groups; a check as it is) and the tables they
    write, or None."""
    parts: list[str] = []
    touched: dict[str, bool] = {}  # table -> whether every statement on it so far is disjoint
    for sql, rows, disjoint, check in shape:
        if check:  # reads what no later part writes, writes nothing: any statement
            parts.append(sql)
            continue
        if "RETURNING" in sql or "SELECT" in sql:
            return None  # an answer to read, or a read of rows another part may change
        insert, delete = _PLAIN_INSERT.match(sql), _PLAIN_DELETE.match(sql)
        if insert is not None:
            table, group = insert.group(1), insert.group(2)
            if "DO UPDATE" in sql and rows > 1:
                return None  # one statement may not update a row twice
            if rows:
                sql = sql.replace(group, ", ".join([group] * rows), 1)
        elif delete is not None and not rows:
            table = delete.group(1)
        else:
            return None
        if table in touched and not touched[table]:
            return None
        touched[table] = touched.get(table, True) and disjoint
        parts.append(sql)
    return parts, set(touched)


# INSERT INTO table (columns) VALUES (one group of values, no parentheses inside) ...
_PLAIN_INSERT = re.compile(r"INSERT INTO (\w+) \([^()]*\) VALUES (\([^()]*\))(?: |$)")
_PLAIN_DELETE = re.compile(r"DELETE FROM (\w+) WHERE ")
_TABLE = re.compile(r"\bagentcheck_\w+")  # every table agentcheck's SQL names
_DML = ("WITH ", "INSERT ", "UPDATE ", "DELETE ", "SELECT ")
_OUR_CTE = re.compile(r"\bs\d+\s*(\(|AS\b)", re.I)  # a name the joined parts take


def _in_pipeline(conn: Any) -> bool:
    """Whether the caller has put the connection in pipeline mode."""
    return bool(conn.pgconn.pipeline_status != _psycopg().pq.PipelineStatus.OFF)


def _in_transaction(conn: Any) -> bool:
    """Whether the connection is inside a transaction (or one that failed)."""
    status = _psycopg().pq.TransactionStatus
    return not conn.closed and conn.info.transaction_status in (status.INTRANS, status.INERROR)


def _single_connection_error(exc: Exception, pool: str) -> Exception:
    error: Exception = _psycopg().OperationalError(
        f"{exc} (agentcheck was given a single connection, which cannot be replaced once "
        f"broken: pass a psycopg_pool.{pool}, or use from_conn_string, to reconnect "
        "automatically)"
    )
    return error


class _Held:
    """The statements an operation has not sent yet, for both statement runners."""

    def __init__(self, conn: Any, cur: Any, pipelined: bool) -> None:
        self.conn = conn
        self.cur = cur
        # Whether the whole operation runs in pipeline mode (see _pipeline); if not, a
        # burst of held statements enters it on its own.
        self.pipelined = pipelined
        self.held: list[tuple[Query, Any]] = []  # (statement, cursor to send it on)
        self.late: list[tuple[Any, Rows]] = []  # (cursor, rows) of Later statements
        self.framed = False  # the operation is framed by BEGIN/COMMIT of its own
        self.committed = False  # ... and committed already, with a final statement

    def _burst(self, statements: int) -> Any:
        """The block to send that many statements in: a pipeline of their own when they
        are several and the operation is not in one already (``with`` or ``async with``)."""
        return self.conn.pipeline() if statements > 1 and not self.pipelined else _NO_BLOCK

    def hold(self, query: Query) -> None:
        """Hold a statement whose rows are not read. The COMMIT of a write committed
        already (see take_final) is dropped; any other write after it is a mistake."""
        if query is _BEGIN:
            self.framed = True
        elif query is _COMMIT and self.committed:
            return
        self._refuse_after_final()
        self.held.append((query, self.cur))

    def _refuse_after_final(self) -> None:
        if self.committed:
            raise RuntimeError("agentcheck: a write after its operation's final statement")

    def commits_with(self, query: Query) -> bool:
        """Whether the write commits with this statement: a
        :attr:`~agentcheck.backends.base.Query.final` one, in a write framed by
        :func:`_framed` (in a transaction of the caller's, the caller commits)."""
        return query.final and self.framed and not self.committed

    def take_final(self, query: Query, own: Any) -> list[tuple[Query, Any]]:
        """The statements to send for a statement the write commits with: the held
        ones, it (on ``own``, the cursor its rows are read from) and the COMMIT, joined
        as :meth:`take_held` joins them, so that its answer comes with the commit."""
        self.held += [(query, own), (_COMMIT, self.cur)]
        self.committed = True
        return self.take_held()

    def take_held(self) -> list[tuple[Query, Any]]:
        """The held statements, to send now.

        A whole write whose statements can be one (see :func:`_one_statement`) goes as
        one, without the BEGIN and COMMIT that frame it: on an autocommit connection a
        lone statement is a transaction of its own, all or nothing, and the server runs
        one statement instead of four or five.
        """
        held, self.held = self.held, []
        if len(held) >= 3 and held[0][0] is _BEGIN and held[-1][0] is _COMMIT:
            if held[1][0] is not _RELAXED:
                one = self._as_one(held[1:-1])
                if one is not None:
                    return [one]
            elif len(held) > 3:
                # The setting needs a transaction: BEGIN and COMMIT stay around it.
                one = self._as_one(held[2:-1])
                if one is not None:
                    return [*held[:2], one, held[-1]]
        return held

    def _as_one(self, body: list[tuple[Query, Any]]) -> tuple[Query, Any] | None:
        """The statements of a write between its BEGIN and COMMIT as one, and the cursor
        to send it on (see take_held), or None."""
        # A Later statement may come last: the joined statement is then sent on its
        # cursor, and its rows are the Later's (collect reads them after the commit).
        cur = body[-1][1]
        if not all(own is self.cur for _, own in body[:-1]):
            return None
        one = _one_statement([query for query, _ in body], answer_last=cur is not self.cur)
        return None if one is None else (one, cur)

    def execute_later(self, query: Query) -> Callable[[], Rows]:
        self._refuse_after_final()
        own = _cursor(self.conn)
        self.held.append((query, own))
        rows: Rows = []
        self.late.append((own, rows))
        return lambda: rows


class _Statements(_Held):
    """Executes an operation's queries on one connection.

    Statements whose rows are not read are held back and sent in one burst, just before
    the next statement whose rows are, or at the end (with the COMMIT that ends a
    write): sent one by one, as the operation's Python work between them allows, each
    would wake the server's backend up again, which costs more than the round trip on
    a busy machine. Their errors surface at that burst, inside the transaction. A
    :class:`~agentcheck.backends.base.Later` statement is held back too, on a cursor of
    its own that :meth:`collect` reads once the pipeline has synced.
    """

    def execute(self, query: Query) -> Rows:
        if not query.fetch:
            self.hold(query)
            return []
        if self.commits_with(query):
            with _cursor(self.conn) as own:
                final = self.take_final(query, own)
                with self._burst(len(final)):
                    for held_query, cur in final:
                        _send(cur, held_query)
                return own.fetchall()  # type: ignore[no-any-return]
        held = self.take_held()
        # Rows come in binary format: text format sends each stored value hex-encoded,
        # twice its size. A read alone outside pipeline mode is answered before the next
        # statement is sent: the operation's cursor serves them all.
        if not held and not self.pipelined:
            self.cur.execute(_pg(query.sql), tuple(query.params), binary=True)
            return self.cur.fetchall()  # type: ignore[no-any-return]
        # Else it goes out with the held statements, one round trip. In pipeline mode a
        # cursor's fetchall() may still hold an earlier statement's result: a statement
        # whose rows we read gets a cursor of its own.
        with _cursor(self.conn) as own:
            with self._burst(len(held) + 1):
                for held_query, cur in held:
                    _send(cur, held_query)
                own.execute(_pg(query.sql), tuple(query.params), binary=True)
            return own.fetchall()  # type: ignore[no-any-return]

    def execute_batch(self, queries: Sequence[Query]) -> list[Rows]:
        """Send the held statements and all the queries, then read all the answers: one
        round trip (pipeline mode: entered here, or nested in a write's own; leaving the
        block syncs)."""
        with contextlib.ExitStack() as stack:
            cursors = [stack.enter_context(_cursor(self.conn)) for _ in queries]
            with self.conn.pipeline():
                for held_query, cur in self.take_held():
                    _send(cur, held_query)
                for cur, query in zip(cursors, queries, strict=True):
                    _send(cur, query)
            return [
                cur.fetchall() if query.fetch else []
                for cur, query in zip(cursors, queries, strict=True)
            ]

    def flush(self) -> None:
        held = self.take_held()
        with self._burst(len(held)):
            for query, cur in held:
                _send(cur, query)

    def collect(self) -> None:
        """Read the rows of the Later statements (after the pipeline's final sync)."""
        late, self.late = self.late, []
        for own, rows in late:
            with own:  # a statement without a result (no RETURNING) gives none, as on SQLite
                rows.extend(own.fetchall() if own.description is not None else [])


def _send(cur: Any, query: Query) -> Any:
    if query.many:
        return cur.executemany(_pg(query.sql), query.params)
    return cur.execute(_pg(query.sql), tuple(query.params), binary=query.fetch)


class _AsyncStatements(_Held):
    """The async twin of :class:`_Statements`."""

    async def execute(self, query: Query) -> Rows:
        if not query.fetch:
            self.hold(query)
            return []
        if self.commits_with(query):
            async with _cursor(self.conn) as own:
                final = self.take_final(query, own)
                async with self._burst(len(final)):
                    for held_query, cur in final:
                        await _send(cur, held_query)
                return await own.fetchall()  # type: ignore[no-any-return]
        held = self.take_held()
        if not held and not self.pipelined:
            await self.cur.execute(_pg(query.sql), tuple(query.params), binary=True)
            return await self.cur.fetchall()  # type: ignore[no-any-return]
        async with _cursor(self.conn) as own:
            async with self._burst(len(held) + 1):
                for held_query, cur in held:
                    await _send(cur, held_query)
                await own.execute(_pg(query.sql), tuple(query.params), binary=True)
            return await own.fetchall()  # type: ignore[no-any-return]

    async def execute_batch(self, queries: Sequence[Query]) -> list[Rows]:
        async with contextlib.AsyncExitStack() as stack:
            cursors = [await stack.enter_async_context(_cursor(self.conn)) for _ in queries]
            async with self.conn.pipeline():
                for held_query, cur in self.take_held():
                    await _send(cur, held_query)
                for cur, query in zip(cursors, queries, strict=True):
                    await _send(cur, query)
            return [
                await cur.fetchall() if query.fetch else []
                for cur, query in zip(cursors, queries, strict=True)
            ]

    async def flush(self) -> None:
        held = self.take_held()
        async with self._burst(len(held)):
            for query, cur in held:
                await _send(cur, query)

    async def collect(self) -> None:
        late, self.late = self.late, []
        for own, rows in late:
            async with own:
                rows.extend(await own.fetchall() if own.description is not None else [])


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
