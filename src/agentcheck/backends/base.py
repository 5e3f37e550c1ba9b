"""What the backends share: the query type, the portable SQL and the migration runner.

The savers' logic is written once, free of I/O, as generators ("operations") that yield
:class:`Query` objects and receive their rows back. Each backend supplies a tiny driver
that executes the queries on its connection, inside one transaction per operation, in
sync or async style. So no logic and no SQL text is copied between sync and async code.

SQL here uses ``?`` placeholders and only syntax that SQLite (>= 3.35) and PostgreSQL
(>= 12) both accept; a backend may translate placeholders (PostgreSQL gets ``$1, $2``).
Statements are composed from fixed fragments only: user data always travels as
parameters, never as SQL text.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from agentcheck._errors import SchemaVersionError

__all__ = [
    "SQL",
    "Batch",
    "Later",
    "OnCommit",
    "Operation",
    "Query",
    "Rows",
    "adrive",
    "batch",
    "drive",
    "get_tuple_statements",
    "id_text",
    "in_list",
    "migrate",
]

# json.dumps with arguments builds an encoder at every call: one, made once, for a value
# written at every put.
_KEYS_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
# Put between the terms of a pending row of metadata terms, and before and after them
# (SQL.encode_terms).
_TERM_SEPARATOR = chr(31)

T = TypeVar("T")
Rows = list[tuple[Any, ...]]


def _refuse_non_text(value: object, what: str) -> None:
    """TypeError naming ``what`` for a value no id should be: None, a bool, bytes, a
    collection. ``str()`` would make ``"None"``, ``"True"``, ``"b'...'"`` or ``"['a']"``
    of them: one key shared by every caller that passed them, or none that was meant."""
    if (
        value is None
        or isinstance(value, bool | bytes | bytearray | memoryview | Mapping)
        or (isinstance(value, Iterable) and not isinstance(value, str))
    ):
        raise TypeError(
            f"{what} must be text (a number or a UUID is stored as its text), "
            f"not {type(value).__name__}"
        )


def id_text(value: object, what: str) -> str:
    """An id (a thread id, a run id, a ledger scope: one rule for all, since a LangGraph
    run's id and its ledger scope are its thread id) as stored: ``str(value)``, the text
    LangGraph makes of a thread id too (``"Color.RED"`` for a member of a ``(str, Enum)``,
    ``"red"`` for a ``StrEnum``'s); see :func:`_refuse_non_text` for what is refused."""
    _refuse_non_text(value, what)
    return str(value)


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__,
# ~1.5 us for a Query, and every operation makes several. Treat it as immutable.
@dataclass(slots=True)
class Query:
    """One statement to execute.

    Attributes:
        sql: statement text with ``?`` placeholders.
        params: parameters, or a sequence of parameter rows when ``many`` is set.
        many: execute once per parameter row (executemany).
        fetch: return the result rows.
        disjoint: the statement touches no row that a later statement of the same
            operation touches (a delete of the rows an insert will not write again):
            a backend may run them as parts of one statement.
        check: the statement changes nothing and fails if something it reads is not
            as expected; what it reads, no later statement of the operation writes. A
            backend may run it as part of one statement with those.
        final: the operation writes nothing after this statement (it may still read):
            a backend may commit the operation's transaction with it, so that the
            statement, its answer and the commit take one round trip (PostgreSQL).
    """

    sql: str
    params: Sequence[Any] = field(default_factory=tuple)
    # Keyword-only: a bare True in third place would say "many", whatever was meant.
    many: bool = field(default=False, kw_only=True)
    fetch: bool = field(default=False, kw_only=True)
    disjoint: bool = field(default=False, kw_only=True)
    check: bool = field(default=False, kw_only=True)
    final: bool = field(default=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class Batch:
    """Queries that do not depend on each other's answers, answered by a list of their
    rows: PostgreSQL sends them in one round trip (see :func:`batch`)."""

    queries: tuple[Query, ...]


@dataclass(frozen=True, slots=True)
class OnCommit:
    """A callback to run once the operation's transaction has committed, and never if it
    fails: for in-memory state that must only describe what is stored. (A backend may
    send statements whose rows are not read only later, at the next read or at commit,
    so an operation's code after a write does not mean the write succeeded.)"""

    callback: Callable[[], None]


@dataclass(frozen=True, slots=True)
class Later:
    """A statement whose rows only matter once the transaction has committed: they are
    handed to ``callback`` then (never if it fails). PostgreSQL sends it with the
    statements held back, so it costs no round trip of its own."""

    query: Query
    callback: Callable[[Rows], None]

    def __post_init__(self) -> None:
        if not self.query.fetch or self.query.many:
            raise ValueError("a Later statement is one statement whose rows are read (fetch=True)")


# An operation yields queries and is sent back each query's rows (empty when not fetched),
# or yields a Batch and is sent back a list of rows, one per query, or an OnCommit or a
# Later (sent back None).
Step = Query | Batch | OnCommit | Later
Operation = Generator[Step, Any, T]
# Sends a Later's query and gives a function that returns its rows after the commit.
ExecuteLater = Callable[[Query], Callable[[], Rows]]


def _sent_now(execute: Callable[[Query], Rows]) -> ExecuteLater:
    """An ``execute_later`` that runs the statement at once (SQLite: no round trips)."""

    def send(query: Query) -> Callable[[], Rows]:
        rows = execute(query)
        return lambda: rows

    return send


def _after_commit(step: OnCommit | Later, execute_later: ExecuteLater) -> Callable[[], None]:
    """What to run once the transaction has committed; a Later's statement is sent now."""
    if isinstance(step, OnCommit):
        return step.callback
    rows = execute_later(step.query)
    return lambda: step.callback(rows())


def batch(queries: Sequence[Query]) -> Generator[Step, Any, list[Rows]]:
    """Run independent queries together; ``yield from batch(...)`` gives their rows."""
    if len(queries) == 1:
        return [(yield queries[0])]
    answers: list[Rows] = yield Batch(tuple(queries))
    return answers


def drive(
    op: Operation[T],
    execute: Callable[[Query], Rows],
    execute_batch: Callable[[Sequence[Query]], list[Rows]] | None = None,
    on_commit: list[Callable[[], None]] | None = None,
    execute_later: ExecuteLater | None = None,
) -> T:
    """Run an operation to completion with a synchronous ``execute`` (and
    ``execute_batch`` for batches; without it their queries run one by one).

    The operation's :class:`OnCommit` callbacks (and those of its :class:`Later`
    statements, run now by ``execute`` unless ``execute_later`` defers them) are
    appended to ``on_commit``, for the caller to run after its commit; without a list
    they run when the operation ends.
    """
    callbacks: list[Callable[[], None]] = [] if on_commit is None else on_commit
    later = execute_later or _sent_now(execute)
    try:
        step = next(op)
        while True:
            if isinstance(step, Query):
                step = op.send(execute(step))
            elif isinstance(step, OnCommit | Later):
                callbacks.append(_after_commit(step, later))
                step = op.send(None)
            elif execute_batch is not None:
                step = op.send(execute_batch(step.queries))
            else:
                step = op.send([execute(query) for query in step.queries])
    except StopIteration as stop:
        if on_commit is None:
            for callback in callbacks:
                callback()
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()  # after a failed query: the operation's own cleanup runs now


async def adrive(
    op: Operation[T],
    execute: Callable[[Query], Awaitable[Rows]],
    execute_batch: Callable[[Sequence[Query]], Awaitable[list[Rows]]] | None = None,
    on_commit: list[Callable[[], None]] | None = None,
    *,
    execute_later: ExecuteLater,
) -> T:
    """Run an operation to completion with an asynchronous ``execute`` (see :func:`drive`;
    here ``execute_later`` is required: it only queues a statement, it never waits)."""
    callbacks: list[Callable[[], None]] = [] if on_commit is None else on_commit
    try:
        step = next(op)
        while True:
            if isinstance(step, Query):
                step = op.send(await execute(step))
            elif isinstance(step, OnCommit | Later):
                callbacks.append(_after_commit(step, execute_later))
                step = op.send(None)
            elif execute_batch is not None:
                step = op.send(await execute_batch(step.queries))
            else:
                step = op.send([await execute(query) for query in step.queries])
    except StopIteration as stop:
        if on_commit is None:
            for callback in callbacks:
                callback()
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()


def in_list(n: int) -> str:
    """``?, ?, ?`` with ``n`` placeholders (``n`` >= 1)."""
    return ", ".join("?" * n)


def pair_list(n: int) -> str:
    """``(?, ?), (?, ?)`` with ``n`` pairs of placeholders (``n`` >= 1)."""
    return ", ".join(["(?, ?)"] * n)


# A checkpoint and all that a read of it needs, in one statement (one round trip on
# PostgreSQL): the checkpoint row (part 0), the stored values its ``blob_keys`` name
# (part 1: {blobs}, per database, expands the keys and looks each up), and its pending
# writes (part 2). {where}: which checkpoint.
_GET_TUPLE = (
    "WITH c AS (SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
    "type, checkpoint, metadata_type, metadata, blob_keys FROM agentcheck_checkpoints "
    "WHERE thread_id = ? AND checkpoint_ns = ? {where}) "
    "SELECT 0, c.checkpoint_id, c.parent_checkpoint_id, c.metadata_type, "
    "CAST(NULL AS INTEGER), c.type, c.checkpoint, c.metadata, c.blob_keys FROM c "
    "UNION ALL SELECT 1, {blobs} "
    "UNION ALL SELECT 2, w.task_id, w.channel, w.task_path, w.idx, w.type, w.blob, "
    "NULL, NULL FROM c JOIN agentcheck_writes w ON w.thread_id = c.thread_id "
    "AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id"
)


def get_tuple_statements(blobs: str) -> tuple[str, str]:
    """The statements reading a checkpoint by id and the latest one, given the
    database's ``{blobs}`` part (see ``SQL._BLOBS_OF_KEYS``)."""
    by_id = _GET_TUPLE.format(where="AND checkpoint_id = ?", blobs=blobs)
    latest = _GET_TUPLE.format(where="ORDER BY checkpoint_id DESC LIMIT 1", blobs=blobs)
    return by_id, latest


class SQL:
    """Statements shared by every backend. Table names are fixed, never user input."""

    SCHEMA_TABLE = (
        "CREATE TABLE IF NOT EXISTS agentcheck_schema ("
        "version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    SCHEMA_VERSION = "SELECT MAX(version) FROM agentcheck_schema"
    # Whether agentcheck_schema exists (read before setup writes anything: a database
    # already at this version is then set up by reads alone, on a read-only connection
    # too).
    SCHEMA_TABLE_EXISTS = (
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'agentcheck_schema'"
    )
    SELECT_SETTING = "SELECT value FROM agentcheck_settings WHERE name = ?"
    RECORD_SETTING = (
        "INSERT INTO agentcheck_settings (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING"
    )
    REPLACE_SETTING = "UPDATE agentcheck_settings SET value = ? WHERE name = ? AND value = ?"
    # One index term of the database, if any; with PENDING_TERMS, a pending row's terms.
    SAMPLE_TERM = "SELECT term FROM agentcheck_metadata_terms LIMIT 1"
    SAMPLE_PENDING_TERMS = "SELECT terms FROM agentcheck_pending_terms LIMIT 1"
    # The metadata of a few checkpoints whose index terms are keyed ("h:..."), to tell
    # whose key encrypted them (a checkpoint written before a key was given is plain, and
    # any key reads it); on SQLite, of pending rows too (given the separator and "h:").
    _KEYED_METADATA = (
        "SELECT c.metadata_type, c.metadata, c.thread_id, c.checkpoint_ns, c.checkpoint_id "
        "FROM (SELECT DISTINCT thread_id, checkpoint_ns, checkpoint_id FROM {table} "
        "WHERE {keyed} LIMIT 8) AS k JOIN agentcheck_checkpoints AS c "
        "ON c.thread_id = k.thread_id AND c.checkpoint_ns = k.checkpoint_ns "
        "AND c.checkpoint_id = k.checkpoint_id"
    )
    SAMPLE_KEYED_METADATA = _KEYED_METADATA.format(
        table="agentcheck_metadata_terms", keyed="term LIKE 'h:%'"
    )
    SAMPLE_KEYED_PENDING_METADATA = _KEYED_METADATA.format(
        table="agentcheck_pending_terms", keyed="instr(terms, ?) > 0"
    )
    RECORD_VERSION = "INSERT INTO agentcheck_schema (version, applied_at) VALUES (?, ?)"
    # Taken before reading the schema version, so two processes that call setup() at
    # once apply each migration once. SQLite needs nothing: BEGIN IMMEDIATE already
    # serializes writers.
    MIGRATION_LOCK: str | None = None

    UPSERT_CHECKPOINT = (
        "INSERT INTO agentcheck_checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
        "parent_checkpoint_id, run_id, type, checkpoint, metadata_type, metadata, blob_keys) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET "
        "parent_checkpoint_id = excluded.parent_checkpoint_id, run_id = excluded.run_id, "
        "type = excluded.type, checkpoint = excluded.checkpoint, "
        "metadata_type = excluded.metadata_type, metadata = excluded.metadata, "
        "blob_keys = excluded.blob_keys"
    )
    INSERT_BLOB = (
        "INSERT INTO agentcheck_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
    )
    # How many of the given stored values are still there: for each delta of a put,
    # the snapshot its chain starts from and the value it is built on (another saver may
    # have deleted the thread, or pruned it; the values between them are kept as long as
    # both are). Both, because a value written while another saver deleted the thread
    # can escape that delete, and the snapshot it is built from does not. {pairs}: a
    # "(?, ?)" per (channel, version). Parameters: the pairs, thread, namespace. Driven
    # from the pairs, each a primary-key look-up (an IN over row values would scan the
    # thread's values on PostgreSQL).
    # SQLite reads the answer; a backend that sends a write's statements without waiting
    # for answers (PostgreSQL) sets CHECK_BLOBS, a statement (Query.check) given the same
    # parameters and the count expected that fails with SQLSTATE 22012 (division by
    # zero) if fewer are found.
    COUNT_BLOBS = (
        "SELECT COUNT(*) FROM (VALUES {pairs}) AS k CROSS JOIN agentcheck_blobs AS b "
        "WHERE b.thread_id = ? AND b.checkpoint_ns = ? "
        "AND b.channel = k.column1 AND b.version = k.column2"
    )
    CHECK_BLOBS: str | None = None
    # Taken first by what deletes stored values of a thread (delete_thread, prune,
    # delete_for_runs), where a database runs writers side by side (PostgreSQL): every
    # value row of the thread locked in one order, so that a put building deltas on them
    # (CHECK_BLOBS locks the rows it counts, in the same order) either commits first,
    # and is then seen by the deletion's next statements, or waits for the deletion and
    # finds its values gone. None on SQLite, whose writers take turns.
    LOCK_THREAD_VALUES: str | None = None
    # Taken before that by a deletion, per thread: two deletions of one thread take
    # turns (each would otherwise lock the rows a put added after the other's lock, and
    # wait for the other's). None on SQLite.
    LOCK_THREAD_DELETION: str | None = None
    # Where a put's metadata terms go. With PENDING_TERMS (SQLite), into
    # agentcheck_pending_terms, one row per checkpoint (one B-tree page), moved into the
    # index, agentcheck_metadata_terms, a few dozen checkpoints at a time (by the saver,
    # see SaverCore._move_pending_terms): written one checkpoint at a time, each of a
    # checkpoint's terms costs a page of its own in the term index (docs/savers.md,
    # "Storage"). A checkpoint's pending row, when it has one, supersedes its terms in the
    # index (it was stored again): a filtered list takes a checkpoint from the index only
    # if it has none (LIST_NOT_PENDING), and from the pending rows (LIST_PENDING_KEYS);
    # the move replaces the checkpoint's terms in the index. Without (PostgreSQL, see
    # there), a put replaces its terms in the index directly.
    PENDING_TERMS = True
    DELETE_TERMS_OF = (
        "DELETE FROM agentcheck_metadata_terms "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
    )
    # The terms a checkpoint stored again no longer has ({terms}: the ones it has now).
    DELETE_TERMS_EXCEPT = DELETE_TERMS_OF + " AND term NOT IN ({terms})"
    INSERT_TERM = (
        "INSERT INTO agentcheck_metadata_terms (thread_id, checkpoint_ns, checkpoint_id, term) "
        "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
    )
    DELETE_PENDING_TERMS_OF = (
        "DELETE FROM agentcheck_pending_terms "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
    )
    UPSERT_PENDING_TERMS = (
        "INSERT INTO agentcheck_pending_terms (thread_id, checkpoint_ns, checkpoint_id, terms) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) "
        "DO UPDATE SET terms = excluded.terms"
    )
    # The pending rows, and whether their checkpoint is still there (a process of an
    # earlier agentcheck deletes checkpoints without their pending rows).
    SELECT_PENDING_TERMS = (
        "SELECT p.thread_id, p.checkpoint_ns, p.checkpoint_id, p.terms, EXISTS (SELECT 1 "
        "FROM agentcheck_checkpoints c WHERE c.thread_id = p.thread_id "
        "AND c.checkpoint_ns = p.checkpoint_ns AND c.checkpoint_id = p.checkpoint_id) "
        "FROM agentcheck_pending_terms p"
    )
    DELETE_PENDING_TERMS = "DELETE FROM agentcheck_pending_terms"
    _WRITE_INSERT = (
        "INSERT INTO agentcheck_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
        "idx, channel, type, blob, task_path) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    )
    UPSERT_WRITE = _WRITE_INSERT + (
        "ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET "
        "channel = excluded.channel, type = excluded.type, blob = excluded.blob, "
        "task_path = excluded.task_path"
    )
    INSERT_WRITE_IF_ABSENT = _WRITE_INSERT + "ON CONFLICT DO NOTHING"

    SELECT_LATEST_CHECKPOINT = (
        "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
        "checkpoint, metadata_type, metadata FROM agentcheck_checkpoints "
        "WHERE thread_id = ? AND checkpoint_ns = ? ORDER BY checkpoint_id DESC LIMIT 1"
    )
    # Part 1 has a row for each key the statement looked up, found or not (then without
    # type and value), so the reader knows what it need not look up again, whatever the
    # column holds. Here the keys are a JSON object, channel -> versions, expanded by
    # SQLite's JSON functions (PostgreSQL's keys are in its class); a text that is not
    # JSON, or not of that shape, names no key (json_each would fail on a bare string).
    # CROSS JOIN fixes SQLite's join order: the keys first, each then a primary-key
    # look-up, not a scan of the thread's values testing each against them.
    _BLOBS_OF_KEYS = (
        "ch.key, v.value, NULL, NULL, b.type, b.blob, NULL, NULL FROM c "
        "CROSS JOIN json_each(CASE WHEN json_valid(c.blob_keys) THEN c.blob_keys END) AS ch "
        "CROSS JOIN json_each(CASE WHEN ch.type = 'array' THEN ch.value END) AS v "
        "LEFT JOIN agentcheck_blobs b ON b.thread_id = c.thread_id "
        "AND b.checkpoint_ns = c.checkpoint_ns AND b.channel = ch.key AND b.version = v.value"
    )
    GET_TUPLE_BY_ID, GET_TUPLE_LATEST = get_tuple_statements(_BLOBS_OF_KEYS)

    @staticmethod
    def encode_blob_keys(keys: Mapping[str, Sequence[str]]) -> Any:
        """The ``blob_keys`` column's value for these keys."""
        return _KEYS_ENCODER.encode(keys)

    @staticmethod
    def encode_terms(terms: Sequence[str]) -> str:
        """A pending row's ``terms`` column: each term followed by the unit separator,
        the first preceded by it too, so that a term is found by :data:`PENDING_TERM`
        with one substring search (no term holds the separator: JSON escapes it, and
        long or encrypted terms are hex digests)."""
        return _TERM_SEPARATOR + "".join(term + _TERM_SEPARATOR for term in terms)

    @staticmethod
    def pending_term(term: str) -> str:
        """What :data:`PENDING_TERM` is given to find ``term`` in a pending row."""
        return _TERM_SEPARATOR + term + _TERM_SEPARATOR

    @staticmethod
    def decode_terms(text: Any) -> list[str]:
        """The terms of a pending row's ``terms`` column (none from one that is no text,
        damaged)."""
        return [term for term in text.split(_TERM_SEPARATOR) if term] if type(text) is str else []

    # List queries are assembled from these fragments by the saver core. A filtered list
    # is driven from the metadata terms index (its first term), not from a scan of the
    # checkpoints (nor of the index; only the pending terms, up to 31 small rows per
    # saver writing, are read whole).
    LIST_SELECT = (
        "SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.type, "
        "c.checkpoint, c.metadata_type, c.metadata FROM agentcheck_checkpoints c"
    )
    LIST_KEYS_BY_TERM = (
        "SELECT t0.thread_id, t0.checkpoint_ns, t0.checkpoint_id FROM agentcheck_metadata_terms t0"
    )
    LIST_IN_KEYS = (
        " WHERE (c.thread_id, c.checkpoint_ns, c.checkpoint_id) IN ({keys})"
        " ORDER BY c.checkpoint_id DESC"
    )
    LIST_FIRST_TERM = "t0.term = ?"
    # How many rows a term matches, counted no further than 2,000 (an index range
    # scan): a filter with several terms is driven from its rarest one.
    TERM_COUNT = (
        "(SELECT COUNT(*) FROM (SELECT 1 FROM agentcheck_metadata_terms "
        "WHERE term = ? LIMIT 2000) AS n)"
    )
    # The most common terms and their frequencies, where the database keeps such
    # statistics: one row (values, frequencies), or none.
    TERM_STATS: str | None = None
    LIST_TERM = (
        "EXISTS (SELECT 1 FROM agentcheck_metadata_terms t WHERE t.term = ? "
        "AND t.thread_id = t0.thread_id AND t.checkpoint_ns = t0.checkpoint_ns "
        "AND t.checkpoint_id = t0.checkpoint_id)"
    )
    # With PENDING_TERMS: a checkpoint the index gives must have no pending row (which
    # would supersede its terms there); the pending rows matching the filter (alias p,
    # PENDING_TERM once per term, given SQL.pending_term of it) whose checkpoint is
    # still there are added: ({indexed}) is the index's query, its own order and limit
    # kept. The pending rows are read whole: at most 31 per saver writing, each of at
    # most 800 characters of terms (SaverCore._put).
    LIST_NOT_PENDING = (
        "NOT EXISTS (SELECT 1 FROM agentcheck_pending_terms q WHERE q.thread_id = t0.thread_id "
        "AND q.checkpoint_ns = t0.checkpoint_ns AND q.checkpoint_id = t0.checkpoint_id)"
    )
    LIST_PENDING_KEYS = (
        "SELECT thread_id, checkpoint_ns, checkpoint_id FROM ({indexed}) AS i UNION "
        "SELECT p.thread_id, p.checkpoint_ns, p.checkpoint_id FROM agentcheck_pending_terms p "
        "WHERE EXISTS (SELECT 1 FROM agentcheck_checkpoints x WHERE x.thread_id = p.thread_id "
        "AND x.checkpoint_ns = p.checkpoint_ns AND x.checkpoint_id = p.checkpoint_id)"
    )
    PENDING_TERM = "instr(p.terms, ?) > 0"
    # Their checkpoints, each a primary-key look-up (CROSS JOIN fixes SQLite's join
    # order: given the union as an IN list, it scans every checkpoint against it).
    LIST_FROM_KEYS = (
        "SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.type, "
        "c.checkpoint, c.metadata_type, c.metadata FROM ({keys}) AS k "
        "CROSS JOIN agentcheck_checkpoints c WHERE c.thread_id = k.thread_id "
        "AND c.checkpoint_ns = k.checkpoint_ns AND c.checkpoint_id = k.checkpoint_id "
        "ORDER BY c.checkpoint_id DESC"
    )

    # Look-ups of many keys at once, across threads (the values and pending writes of
    # the checkpoints a read returns): ``{rows}`` becomes one ``(?, ...)`` per key. A join
    # driven from a VALUES list is one primary-key look-up per key on both databases; a
    # row-value IN list is not (both scan all of a thread's rows for it, so reads would
    # slow down as a thread grows).
    SELECT_BLOBS_ANY = (
        "SELECT b.thread_id, b.checkpoint_ns, b.channel, b.version, b.type, b.blob "
        "FROM (VALUES {rows}) AS k CROSS JOIN agentcheck_blobs AS b "
        "WHERE b.thread_id = k.column1 AND b.checkpoint_ns = k.column2 "
        "AND b.channel = k.column3 AND b.version = k.column4"
    )
    SELECT_WRITES_ANY = (
        "SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, w.type, "
        "w.blob, w.task_path, w.idx FROM (VALUES {rows}) AS k CROSS JOIN agentcheck_writes AS w "
        "WHERE w.thread_id = k.column1 AND w.checkpoint_ns = k.column2 "
        "AND w.checkpoint_id = k.column3"
    )
    # The writes of a checkpoint's tasks: which paused, where they ran, and which had an
    # update written in their name (see SaverCore._continued_task).
    SELECT_TASK_WRITES = (
        "SELECT task_id, channel, task_path FROM agentcheck_writes WHERE thread_id = ? "
        "AND checkpoint_ns = ? AND checkpoint_id = ?"
    )
    SELECT_WRITES_FOR_CHANNELS = (
        "SELECT checkpoint_id, task_id, channel, type, blob, task_path, idx "
        "FROM agentcheck_writes WHERE thread_id = ? AND checkpoint_ns = ? "
        "AND checkpoint_id IN ({ids}) AND channel IN ({channels})"
    )
    # Whether a checkpoint is stored, and whether its namespace has any checkpoint.
    CHECKPOINT_STORED = (
        "SELECT checkpoint_id = ? FROM agentcheck_checkpoints WHERE thread_id = ? "
        "AND checkpoint_ns = ? AND (checkpoint_id = ? OR checkpoint_id < ?) "
        "ORDER BY checkpoint_id DESC LIMIT 1"
    )
    # Whether the ledger holds a call of a task, by its calls' keys: from ``<prefix>|``
    # up to (not including) ``<prefix>}`` ("}" follows "|"), an index range in SQLite's
    # binary order.
    TASK_HAS_CALLS = (
        "SELECT 1 FROM agentcheck_steps WHERE scope = ? AND step_key >= ? AND step_key < ? LIMIT 1"
    )
    SELECT_CHILDREN = (
        "SELECT checkpoint_id, metadata_type, metadata FROM agentcheck_checkpoints "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND parent_checkpoint_id = ?"
    )
    # The ancestors of a checkpoint, in one recursive query (the caller orders them by
    # their parent links). UNION, not UNION ALL: a row met again is dropped, so a
    # damaged chain that loops ends the query instead of running it forever.
    SELECT_CHAIN = (
        "WITH RECURSIVE chain(checkpoint_id, parent_checkpoint_id) AS ("
        "SELECT checkpoint_id, parent_checkpoint_id FROM agentcheck_checkpoints "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
        "UNION SELECT c.checkpoint_id, c.parent_checkpoint_id "
        "FROM agentcheck_checkpoints c JOIN chain "
        "ON c.checkpoint_id = chain.parent_checkpoint_id "
        "WHERE c.thread_id = ? AND c.checkpoint_ns = ?) "
        "SELECT chain.checkpoint_id, chain.parent_checkpoint_id, c.type, c.checkpoint "
        "FROM chain JOIN agentcheck_checkpoints c ON c.thread_id = ? AND c.checkpoint_ns = ? "
        "AND c.checkpoint_id = chain.checkpoint_id"
    )

    DELETE_THREAD: tuple[str, ...] = (
        "DELETE FROM agentcheck_writes WHERE thread_id = ?",
        "DELETE FROM agentcheck_blobs WHERE thread_id = ?",
        "DELETE FROM agentcheck_pending_terms WHERE thread_id = ?",
        "DELETE FROM agentcheck_metadata_terms WHERE thread_id = ?",
        "DELETE FROM agentcheck_checkpoints WHERE thread_id = ?",
    )
    # A deleted thread's journal: the LangGraph runs of the thread, their events, and the
    # ledger steps its graphs made. THREAD_RUNS finds the runs, the thread's and the run
    # named after it (a LangGraph thread's run id is the thread id, also where an
    # effect_scope made that row first, under its own framework: that row is kept), and
    # on PostgreSQL locks them: a put under way that ends or starts the run has locked
    # the row, and what it logged is then committed, and seen by the deletes after.
    # {runs}: placeholders for the run ids. An effect_scope's step key is
    # "|{kind}:{name}#{n}" (kind: tool or llm), a graph's "{ns}|{task id}|...": the
    # steps of an effect_scope whose run is the thread's (an order id used for both)
    # are kept, since deleting them would make their calls again.
    THREAD_RUNS = (
        "SELECT run_id FROM agentcheck_runs "
        "WHERE (thread_id = ? AND framework = 'langgraph') OR run_id = ?"
    )
    DELETE_THREAD_JOURNAL: tuple[str, ...] = (
        "DELETE FROM agentcheck_events WHERE run_id IN ({runs})",
        "DELETE FROM agentcheck_steps WHERE run_id IN ({runs}) "
        "AND step_key NOT LIKE '|tool:%' AND step_key NOT LIKE '|llm:%'",
    )
    DELETE_THREAD_RUNS = (
        "DELETE FROM agentcheck_runs WHERE thread_id = ? AND framework = 'langgraph'"
    )
    DELETE_CHECKPOINT: tuple[str, ...] = (
        "DELETE FROM agentcheck_writes "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
        "DELETE FROM agentcheck_pending_terms "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
        "DELETE FROM agentcheck_metadata_terms "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
        "DELETE FROM agentcheck_checkpoints "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
    )
    DELETE_BLOB = (
        "DELETE FROM agentcheck_blobs "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ?"
    )
    SELECT_RUN_CHECKPOINTS = (
        "SELECT thread_id, checkpoint_ns, checkpoint_id FROM agentcheck_checkpoints "
        "WHERE run_id IN ({runs})"
    )
    # A kept checkpoint whose parent a deletion removed is left with no parent (as the
    # official PostgresSaver's prune leaves it), not naming a checkpoint that is gone.
    CLEAR_PARENT = (
        "UPDATE agentcheck_checkpoints SET parent_checkpoint_id = NULL "
        "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
    )
    SELECT_NS_CHECKPOINTS = (
        "SELECT checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata_type, "
        "metadata FROM agentcheck_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
        "ORDER BY checkpoint_id DESC"
    )
    SELECT_THREAD_NAMESPACES = (
        "SELECT DISTINCT checkpoint_ns FROM agentcheck_checkpoints WHERE thread_id = ?"
    )
    SELECT_BLOB_KEYS = (
        "SELECT channel, version, type FROM agentcheck_blobs "
        "WHERE thread_id = ? AND checkpoint_ns = ?"
    )
    # A thread copied: given (target, source), the checkpoints the target does not have
    # (one it has keeps its own row), the stored values (a version is the same value in
    # both threads) and the pending writes, which a checkpoint the target has gets too
    # where it lacks them (LangGraph rebuilds a DeltaChannel from its ancestors' writes).
    # Then (COPY_THREAD_TERMS, given (target, target, source)) the metadata terms, and on
    # SQLite the pending terms, of each source checkpoint the target now holds with the
    # same metadata: the ones just copied, or an equal one it had (whose terms are the
    # same), not one of its own with other metadata. After the checkpoints, not before:
    # a checkpoint another writer commits in the source in between (PostgreSQL reads
    # each statement's own snapshot) would be copied without its terms, and a filtered
    # list of the copy would miss it.
    COPY_THREAD_TERMS: tuple[str, ...] = (
        "INSERT INTO agentcheck_metadata_terms (thread_id, checkpoint_ns, checkpoint_id, term) "
        "SELECT ?, s.checkpoint_ns, s.checkpoint_id, s.term FROM agentcheck_metadata_terms s "
        "JOIN agentcheck_checkpoints t ON t.thread_id = ? AND t.checkpoint_ns = s.checkpoint_ns "
        "AND t.checkpoint_id = s.checkpoint_id JOIN agentcheck_checkpoints c "
        "ON c.thread_id = s.thread_id AND c.checkpoint_ns = s.checkpoint_ns "
        "AND c.checkpoint_id = s.checkpoint_id AND c.metadata = t.metadata "
        "WHERE s.thread_id = ? ON CONFLICT DO NOTHING",
        "INSERT INTO agentcheck_pending_terms (thread_id, checkpoint_ns, checkpoint_id, terms) "
        "SELECT ?, s.checkpoint_ns, s.checkpoint_id, s.terms FROM agentcheck_pending_terms s "
        "JOIN agentcheck_checkpoints t ON t.thread_id = ? AND t.checkpoint_ns = s.checkpoint_ns "
        "AND t.checkpoint_id = s.checkpoint_id JOIN agentcheck_checkpoints c "
        "ON c.thread_id = s.thread_id AND c.checkpoint_ns = s.checkpoint_ns "
        "AND c.checkpoint_id = s.checkpoint_id AND c.metadata = t.metadata "
        "WHERE s.thread_id = ? ON CONFLICT DO NOTHING",
    )
    COPY_THREAD = (
        "INSERT INTO agentcheck_checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
        "parent_checkpoint_id, run_id, type, checkpoint, metadata_type, metadata, blob_keys) "
        "SELECT ?, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, "
        "checkpoint, metadata_type, metadata, blob_keys FROM agentcheck_checkpoints "
        "WHERE thread_id = ? ON CONFLICT DO NOTHING",
        "INSERT INTO agentcheck_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
        "SELECT ?, checkpoint_ns, channel, version, type, blob FROM agentcheck_blobs "
        "WHERE thread_id = ? ON CONFLICT DO NOTHING",
        "INSERT INTO agentcheck_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
        "idx, channel, type, blob, task_path) SELECT ?, checkpoint_ns, checkpoint_id, "
        "task_id, idx, channel, type, blob, task_path FROM agentcheck_writes "
        "WHERE thread_id = ? ON CONFLICT DO NOTHING",
    )
    # A thread's pending rows whose checkpoint is gone (a process of an earlier version
    # deleted it): dropped before the thread gets copied checkpoints, which they would
    # otherwise supersede.
    DELETE_ORPHAN_PENDING_TERMS = (
        "DELETE FROM agentcheck_pending_terms WHERE thread_id = ? AND NOT EXISTS (SELECT 1 "
        "FROM agentcheck_checkpoints c WHERE c.thread_id = agentcheck_pending_terms.thread_id "
        "AND c.checkpoint_ns = agentcheck_pending_terms.checkpoint_ns "
        "AND c.checkpoint_id = agentcheck_pending_terms.checkpoint_id)"
    )

    # -- journal: runs, events, steps ---------------------------------------------------
    # (Re)start a run. An existing run restarts (attempt + 1) unless it is already running
    # under the same owner: so concurrent writers of one process start it once, while a
    # new process taking over a run left "running" by a crashed one does restart it. The
    # row comes back only when something changed.
    START_RUN = (
        "INSERT INTO agentcheck_runs (run_id, framework, name, thread_id, status, attempt, "
        "owner, lease_until, created_at, updated_at, metadata_type, metadata) "
        "VALUES (?, ?, ?, ?, 'running', 1, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (run_id) DO UPDATE SET status = 'running', "
        "attempt = agentcheck_runs.attempt + 1, owner = excluded.owner, "
        "lease_until = excluded.lease_until, updated_at = excluded.updated_at, "
        "ended_at = NULL, error = NULL "
        "WHERE agentcheck_runs.status <> 'running' OR agentcheck_runs.owner IS NULL "
        "OR agentcheck_runs.owner <> excluded.owner "
        "RETURNING attempt"
    )
    # A run's status, creating the row if a late writer finds none yet.
    SET_RUN_STATUS = (
        "INSERT INTO agentcheck_runs (run_id, framework, status, attempt, owner, created_at, "
        "updated_at, ended_at, error) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?) "
        "ON CONFLICT (run_id) DO UPDATE SET status = excluded.status, "
        "updated_at = excluded.updated_at, ended_at = excluded.ended_at, error = excluded.error"
    )
    # Only a running run can succeed (a failed or restarted one is not overwritten).
    MARK_SUCCEEDED = (
        "UPDATE agentcheck_runs SET status = 'succeeded', updated_at = ?, ended_at = ? "
        "WHERE run_id = ? AND status = 'running' RETURNING run_id"
    )
    # A paused run resumed (Command(resume=...)) through a saver that does not know its
    # status: restarted only if it is paused, so that a resume with nothing paused (an
    # approval sent twice) leaves a finished run as it is.
    RESUME_PAUSED_RUN = (
        "UPDATE agentcheck_runs SET status = 'running', attempt = attempt + 1, owner = ?, "
        "lease_until = NULL, updated_at = ?, ended_at = NULL, error = NULL "
        "WHERE run_id = ? AND status = 'interrupted' RETURNING attempt"
    )
    # Where the database can (PostgreSQL): the run transition and its event in one
    # statement, the event appended only if the transition applied (see PostgresSQL).
    START_RUN_LOGGED: str | None = None
    MARK_SUCCEEDED_LOGGED: str | None = None
    # Likewise a step's claim, take-over or completion and its event (parameters: the
    # step's, then the event's row).
    CLAIM_STEP_LOGGED: str | None = None
    RECLAIM_STEP_LOGGED: str | None = None
    COMPLETE_STEP_LOGGED: str | None = None
    SELECT_RUN = (
        "SELECT run_id, framework, name, thread_id, status, attempt, owner, lease_until, "
        "created_at, updated_at, ended_at, metadata_type, metadata, error "
        "FROM agentcheck_runs WHERE run_id = ?"
    )
    SELECT_RUNS = (
        "SELECT run_id, framework, name, thread_id, status, attempt, owner, lease_until, "
        "created_at, updated_at, ended_at, metadata_type, metadata, error "
        "FROM agentcheck_runs"
    )
    INSERT_EVENT = (
        "INSERT INTO agentcheck_events (run_id, ts, kind, phase, name, step_key, parent_seq, "
        "input_tokens, output_tokens, cost, payload_type, payload, error) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    SELECT_EVENTS = (
        "SELECT seq, run_id, ts, kind, phase, name, step_key, parent_seq, input_tokens, "
        "output_tokens, cost, payload_type, payload, error FROM agentcheck_events "
        "WHERE run_id = ? AND seq > ? ORDER BY seq"
    )
    _STEP_COLUMNS = (
        "scope, step_key, run_id, kind, name, effect, status, idempotency_key, attempts, "
        "owner, started_at, finished_at, args_type, args, result_type, result, error, "
        "interrupts, asked_at, attempt_task"
    )
    # A row comes back when the claim inserted one (none when the step existed): a claim
    # is one statement, not an insert and a read.
    CLAIM_STEP = (
        "INSERT INTO agentcheck_steps (scope, step_key, run_id, kind, name, effect, status, "
        "idempotency_key, attempts, owner, started_at, args_type, args, attempt_task) "
        "VALUES (?, ?, ?, ?, ?, ?, 'started', ?, 1, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING "
        "RETURNING owner"
    )
    # (Constant text joined: no input is formatted in.)
    SELECT_STEPS = "SELECT " + _STEP_COLUMNS + " FROM agentcheck_steps"  # noqa: S608
    SELECT_STEP = SELECT_STEPS + " WHERE scope = ? AND step_key = ?"
    # Take over a step from the owner we saw (compare-and-set on the owner), so two
    # workers recovering the same step cannot both run it.
    RECLAIM_STEP = (
        "UPDATE agentcheck_steps SET status = 'started', attempts = attempts + 1, owner = ?, "  # noqa: S608
        "started_at = ?, finished_at = NULL, error = NULL, run_id = ?, asked_at = NULL, "
        "attempt_task = ? "
        "WHERE scope = ? AND step_key = ? AND owner = ? AND status <> 'completed' "
        "RETURNING " + _STEP_COLUMNS
    )
    # A completed step is never overwritten: only the owner of a started step finishes it.
    COMPLETE_STEP = (
        "UPDATE agentcheck_steps SET status = 'completed', finished_at = ?, result_type = ?, "
        "result = ?, interrupts = ? "
        "WHERE scope = ? AND step_key = ? AND owner = ? AND status = 'started' RETURNING owner"
    )
    FAIL_STEP = (
        "UPDATE agentcheck_steps SET status = 'failed', finished_at = ?, error = ? "
        "WHERE scope = ? AND step_key = ? AND owner = ? AND status = 'started'"
    )
    COMPLETED_STEPS_AMONG = (
        SELECT_STEPS + " WHERE scope = ? AND status = 'completed' AND step_key IN ({keys})"
    )
    # The "ask" policy's question about a step's unknown outcome: where it is among
    # the task's interrupts, so that its answer is found there again (see _V8).
    MARK_ASKED = (
        "UPDATE agentcheck_steps SET asked_at = ?, attempt_task = ? "
        "WHERE scope = ? AND step_key = ? AND owner = ? AND status = 'started'"
    )
    PAUSE_STEP = (
        "UPDATE agentcheck_steps SET status = 'paused', asked_at = ?, attempt_task = ? "
        "WHERE scope = ? AND step_key = ? AND owner = ? AND status = 'started'"
    )
    RELEASE_STEP = (
        "DELETE FROM agentcheck_steps "
        "WHERE scope = ? AND step_key = ? AND owner = ? AND status = 'started'"
    )


# Migration 1, written once for both databases; ``{blob}`` is the binary column type.
_V1 = (
    "CREATE TABLE IF NOT EXISTS agentcheck_checkpoints ("
    " thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL DEFAULT '',"
    " checkpoint_id TEXT NOT NULL, parent_checkpoint_id TEXT, run_id TEXT,"
    " type TEXT NOT NULL, checkpoint {blob} NOT NULL,"
    " metadata_type TEXT NOT NULL, metadata {blob} NOT NULL,"
    " PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id))",
    "CREATE INDEX IF NOT EXISTS agentcheck_checkpoints_run_idx ON agentcheck_checkpoints (run_id)",
    "CREATE TABLE IF NOT EXISTS agentcheck_blobs ("
    " thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL DEFAULT '',"
    " channel TEXT NOT NULL, version TEXT NOT NULL, type TEXT NOT NULL, blob {blob},"
    " PRIMARY KEY (thread_id, checkpoint_ns, channel, version))",
    "CREATE TABLE IF NOT EXISTS agentcheck_writes ("
    " thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL DEFAULT '',"
    " checkpoint_id TEXT NOT NULL, task_id TEXT NOT NULL, idx INTEGER NOT NULL,"
    " channel TEXT NOT NULL, type TEXT NOT NULL, blob {blob},"
    " task_path TEXT NOT NULL DEFAULT '',"
    " PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx))",
    # One row per metadata (key path, value) pair: filters become index look-ups, on
    # both databases, and work unchanged when the metadata itself is encrypted.
    "CREATE TABLE IF NOT EXISTS agentcheck_metadata_terms ("
    " thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL DEFAULT '',"
    " checkpoint_id TEXT NOT NULL, term TEXT NOT NULL,"
    " PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, term))",
    "CREATE INDEX IF NOT EXISTS agentcheck_metadata_terms_term_idx"
    " ON agentcheck_metadata_terms (term, checkpoint_id)",
)


# Migration 2: the journal (docs/journal.md). ``{serial}`` is an auto-assigned integer key.
_V2 = (
    "CREATE TABLE IF NOT EXISTS agentcheck_runs ("
    " run_id TEXT PRIMARY KEY, framework TEXT NOT NULL, name TEXT, thread_id TEXT,"
    " status TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,"
    " owner TEXT, lease_until TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,"
    " ended_at TEXT, metadata_type TEXT, metadata {blob}, error TEXT)",
    "CREATE INDEX IF NOT EXISTS agentcheck_runs_thread_idx ON agentcheck_runs (thread_id)",
    "CREATE INDEX IF NOT EXISTS agentcheck_runs_status_idx ON agentcheck_runs (status, updated_at)",
    "CREATE TABLE IF NOT EXISTS agentcheck_events ("
    " seq {serial}, run_id TEXT NOT NULL, ts TEXT NOT NULL,"
    " kind TEXT NOT NULL, phase TEXT NOT NULL, name TEXT, step_key TEXT, parent_seq INTEGER,"
    " input_tokens INTEGER, output_tokens INTEGER, cost DOUBLE PRECISION,"
    " payload_type TEXT, payload {blob}, error TEXT)",
    "CREATE INDEX IF NOT EXISTS agentcheck_events_run_idx ON agentcheck_events (run_id, seq)",
    "CREATE TABLE IF NOT EXISTS agentcheck_steps ("
    " scope TEXT NOT NULL, step_key TEXT NOT NULL, run_id TEXT,"
    " kind TEXT NOT NULL, name TEXT NOT NULL, effect TEXT NOT NULL, status TEXT NOT NULL,"
    " idempotency_key TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 1,"
    " owner TEXT NOT NULL, started_at TEXT NOT NULL, finished_at TEXT,"
    " args_type TEXT, args {blob}, result_type TEXT, result {blob}, error TEXT,"
    " PRIMARY KEY (scope, step_key))",
    "CREATE INDEX IF NOT EXISTS agentcheck_steps_run_idx ON agentcheck_steps (run_id)",
    "CREATE INDEX IF NOT EXISTS agentcheck_steps_status_idx ON agentcheck_steps (status)",
)


# Migration 3: which stored values a checkpoint reads (its channels' versions and the
# versions their deltas are built from; see SQL.encode_blob_keys), so that one statement
# reads the checkpoint and its values. NULL in rows written before: they are read in two
# steps, as then.
_V3 = ("ALTER TABLE agentcheck_checkpoints ADD COLUMN blob_keys TEXT",)


# Migration 4: how many of the task's interrupt() calls a completed step made (a tool
# that asked a human, the "ask" policy). A replay of the step, which calls nothing,
# moves LangGraph's count of the task's interrupts on by as many, so the interrupts after
# it still get their own answers. NULL in rows written before: none.
_V4 = ("ALTER TABLE agentcheck_steps ADD COLUMN interrupts INTEGER",)


# Migration 5: the checkpoints' run index leaves out checkpoints without a run id (most
# LangGraph metadata has none): a put of one then writes one B-tree page less (SQLite)
# or one index entry less (PostgreSQL). delete_for_runs looks up given run ids, which
# the partial index serves (``run_id IN (...)`` implies ``run_id IS NOT NULL``).
_V5 = (
    "DROP INDEX IF EXISTS agentcheck_checkpoints_run_idx",
    "CREATE INDEX IF NOT EXISTS agentcheck_checkpoints_run_idx"
    " ON agentcheck_checkpoints (run_id) WHERE run_id IS NOT NULL",
)


# Migration 6: on SQLite, the metadata terms of recent checkpoints, one row per checkpoint,
# until they are moved into agentcheck_metadata_terms (see SQL.PENDING_TERMS); nothing on
# PostgreSQL, which writes the index directly (the version is recorded all the same).
_V6 = (
    "CREATE TABLE IF NOT EXISTS agentcheck_pending_terms ("
    " thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL DEFAULT '',"
    " checkpoint_id TEXT NOT NULL, terms TEXT NOT NULL,"
    " PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)) WITHOUT ROWID",
)


# Migration 7: settings of the database as a whole, a row each. "index_terms": the form
# of the metadata index's terms and of the run_id column, "plain" or a keyed check value
# standing for the encryption key they were written with (see SaverCore._settle_index).
_V7 = (
    "CREATE TABLE IF NOT EXISTS agentcheck_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


# Migration 8: the task (LangGraph's task id) a step's latest attempt ran in
# (attempt_task; update_state makes a paused node a new task, whose answers start
# again), and where, among that task's interrupt() calls, the "ask" policy's question
# about the attempt's unknown outcome is, or a paused call's own questions begin
# (asked_at; cleared when the step is taken over again). The answer is found there
# when the task runs again; without one, the answers already given to the task's later
# questions were used by the attempts that crashed, and a new question goes after them.
_V8 = (
    "ALTER TABLE agentcheck_steps ADD COLUMN asked_at INTEGER",
    "ALTER TABLE agentcheck_steps ADD COLUMN attempt_task TEXT",
)


def portable_migrations(
    blob_type: str, serial_type: str, *, pending_terms: bool
) -> tuple[tuple[str, ...], ...]:
    """The migrations, written once for both databases, given the binary column type,
    the type of an auto-assigned integer primary key, and whether the database keeps
    pending metadata terms (SQLite; migration 6 is empty without)."""
    return tuple(
        tuple(stmt.format(blob=blob_type, serial=serial_type) for stmt in migration)
        for migration in (_V1, _V2, _V3, _V4, _V5, _V6 if pending_terms else (), _V7, _V8)
    )


def schema_version(sql: type[SQL] | SQL) -> Operation[int | None]:
    """The schema version in force, 0 if none is recorded; None if there is no
    agentcheck_schema table (nothing set up)."""
    if not (yield Query(sql.SCHEMA_TABLE_EXISTS, fetch=True)):
        return None
    rows = yield Query(sql.SCHEMA_VERSION, fetch=True)
    return int(rows[0][0] or 0) if rows else 0


def migrate(sql: type[SQL] | SQL, migrations: Sequence[Sequence[str]]) -> Operation[int]:
    """Bring the schema up to date; returns the version now in force.

    Migration ``i`` (1-based) is ``migrations[i - 1]``; each one applied is recorded in
    ``agentcheck_schema`` in the same transaction, so it is applied exactly once.
    """
    if sql.MIGRATION_LOCK:
        yield Query(sql.MIGRATION_LOCK)
    yield Query(sql.SCHEMA_TABLE)
    rows = yield Query(sql.SCHEMA_VERSION, fetch=True)
    current = int(rows[0][0] or 0) if rows else 0
    latest = len(migrations)
    if current > latest:
        raise SchemaVersionError(
            f"the database schema is at version {current}, but this agentcheck only knows "
            f"versions up to {latest}: upgrade agentcheck (pip install -U agentcheck) "
            "before using this database"
        )
    for version in range(current + 1, latest + 1):
        for statement in migrations[version - 1]:
            yield Query(statement)
        yield Query(sql.RECORD_VERSION, (version, datetime.now(timezone.utc).isoformat()))
    return latest
