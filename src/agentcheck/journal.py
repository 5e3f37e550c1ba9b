"""The journal: runs, an append-only event log, and the step ledger (docs/journal.md).

It lives in the same database as the checkpoints and is reached through a saver:
``saver.journal`` (a :class:`Journal`), or :func:`connect` for reading a database.

* **runs**: one row per run (for LangGraph, per thread), with status and attempt count.
* **events**: append-only, ordered by ``seq``: runs, nodes, LLM calls with tokens, tools.
* **steps**: the ledger of calls with effects, one row per ``(scope, step_key)``. Claiming
  a step is one atomic insert on that unique key, so two workers cannot both start it, and
  a completed step is never overwritten.
"""

from __future__ import annotations

import builtins
import functools
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast, get_args

from agentcheck._errors import CorruptDataError, UnsafeTypeError
from agentcheck.backends.base import (
    Later,
    OnCommit,
    Operation,
    Query,
    Rows,
    id_text,
    in_list,
)
from agentcheck.serde import SafeSerializer

if TYPE_CHECKING:
    from agentcheck.savers._core import SaverCore

__all__ = [
    "Claim",
    "Event",
    "Journal",
    "Run",
    "Step",
    "connect",
]

T = TypeVar("T")
RunStatus = Literal["running", "succeeded", "failed", "interrupted", "crashed"]
StepStatus = Literal["started", "completed", "failed", "paused"]
Effect = Literal["pure", "idempotent", "side_effect"]

_REPR = "repr"  # type tag of a payload stored as its repr() because it could not be serialized


def _limit(value: Any, what: str) -> int:
    """A limit: a whole number, at least 0."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{what} must be a whole number, 0 or more, not {value!r}")
    return value


def _statuses(value: str | Sequence[str], allowed: tuple[str, ...], what: str) -> list[str]:
    """A status filter: one status, or several (a list, a tuple, a set), each one of
    ``allowed``; ValueError or TypeError naming ``what`` otherwise. (A string taken as
    a sequence would filter by its letters, and match nothing without a word.)"""
    given = [value] if isinstance(value, str) else value
    if not isinstance(given, Iterable) or isinstance(given, (bytes, Mapping)):
        raise TypeError(f"{what} must be a status or a list of statuses, not {given!r}")
    found = list(given)
    for status in found:
        if status not in allowed:
            raise ValueError(
                f"{what}: {status!r} is not a status; the statuses are {', '.join(allowed)}"
            )
    return found


def now() -> str:
    """Current UTC time, ISO 8601 (sorts as text on both databases)."""
    return datetime.now(timezone.utc).isoformat()


def new_owner() -> str:
    """A token naming this process and this claim, recorded on the steps it starts:
    ``host:pid:random`` and, where the system tells it, ``:the process's start time``
    (so that another process can tell whether the claim's process still runs, see
    :func:`owner_alive`)."""
    head, tail = _this_process(os.getpid())
    return f"{head}:{uuid.uuid4().hex[:12]}{tail}"


@functools.cache
def _host() -> str:
    return socket.gethostname()


@functools.lru_cache(maxsize=4)  # by pid: a forked child has its own
def _this_process(pid: int) -> tuple[str, str]:
    """``host:pid`` and ``:start time`` (or nothing) of an owner token of ``pid``."""
    started = process_start(pid)
    return f"{_host()}:{pid}", f":{started}" if started else ""


def process_start(pid: int) -> str | None:
    """A process's start time as Linux counts it (clock ticks since boot, from
    ``/proc/<pid>/stat``), telling it from a later process given the same pid; None
    where there is no such file, or the process is a zombie (it has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the name, which may hold spaces
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return fields[19]


def owner_alive(owner: str) -> bool:
    """Whether a step's owner token names another process on this machine that is
    still running (the same one: its start time matches, where recorded). False for
    this process, another machine's, or a token of another shape."""
    parts = owner.split(":")
    if len(parts) < 3 or parts[0] != _host() or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    started = process_start(pid)
    if started is None:
        # No /proc (not Linux): the pid exists. On Linux: a zombie, or gone meanwhile.
        return not os.path.exists("/proc/self/stat")
    return len(parts) < 4 or parts[3] == started


def _none() -> Any:
    # (A default factory, not a default: a default would be a class attribute, found
    # before _DecodedWhenRead.__getattr__ is asked.)
    return None


R = TypeVar("R", bound="_DecodedWhenRead")


class _DecodedWhenRead:
    """Base of the journal's rows, whose stored payloads (a step's arguments and result,
    a run's metadata, an event's payload) and counts (attempts, interrupts) are decoded
    when first read: a claim looks at a step's status and most of the time never needs
    them, and one damaged row fails only where it is read, not every listing it is in
    (CorruptDataError naming it).

    Otherwise they are plain frozen dataclasses: equality, copies, pickling and
    ``dataclasses.asdict`` see the decoded values; ``repr`` shows an unreadable one as
    such instead of raising. The hash leaves those fields out (a dict cannot be hashed,
    and hashing would decode them): rows go in sets and dicts as before."""

    @classmethod
    def _stored(cls: type[R], decoders: Mapping[str, Callable[[], Any]], **fields: Any) -> R:
        """A row whose fields named in ``decoders`` are decoded by them when read."""
        row = cls(**fields)
        state = row.__dict__
        for name in decoders:
            del state[name]  # so that a read asks __getattr__
        state["_decoders"] = decoders
        return row

    if not TYPE_CHECKING:  # (for mypy, the fields are plain attributes)

        def __getattr__(self, name: str) -> Any:
            decode = self.__dict__.get("_decoders", {}).get(name)
            if decode is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            # Decoded outside any lock (a decoder may wait for an event loop, or read
            # another row); two threads reading it first at once may both decode it,
            # and both get the value stored first.
            value = decode()
            return self.__dict__.setdefault(name, value)

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k != "_decoders"}
        for name in self.__dict__.get("_decoders", ()):
            state[name] = getattr(self, name)
        return state

    def __repr__(self) -> str:
        parts = []
        for f in fields(cast(Any, self)):
            try:
                shown = repr(getattr(self, f.name))
            except CorruptDataError as exc:
                shown = f"<unreadable: {exc}>"
            parts.append(f"{f.name}={shown}")
        return f"{type(self).__name__}({', '.join(parts)})"


@dataclass(frozen=True, repr=False)
class Run(_DecodedWhenRead):
    """A row of ``agentcheck_runs``."""

    run_id: str
    framework: str
    name: str | None
    thread_id: str | None
    status: str
    attempt: int = field(hash=False)  # (a count damaged by hand fails where it is read)
    owner: str | None
    lease_until: str | None
    created_at: str
    updated_at: str
    ended_at: str | None
    error: str | None
    metadata: Any = field(default_factory=_none, hash=False)  # as given to start_run


@dataclass(frozen=True, repr=False)
class Event(_DecodedWhenRead):
    """A row of the append-only ``agentcheck_events`` log."""

    seq: int
    run_id: str
    ts: str
    kind: str
    phase: str
    name: str | None
    step_key: str | None
    parent_seq: int | None
    input_tokens: int | None
    output_tokens: int | None
    cost: float | None
    error: str | None
    payload: Any = field(default_factory=_none, hash=False)  # a call's result, a run's outcome...


@dataclass(frozen=True, repr=False)
class Step(_DecodedWhenRead):
    """A row of the ``agentcheck_steps`` ledger."""

    scope: str
    step_key: str
    run_id: str | None
    kind: str
    name: str
    effect: str
    status: str
    idempotency_key: str
    attempts: int = field(hash=False)  # (a count damaged by hand fails where it is read)
    owner: str
    started_at: str
    finished_at: str | None
    error: str | None
    # How many interrupt() calls of its task the call made (LangGraph), when completed.
    interrupts: int = field(hash=False)
    # Started: the index among its task's interrupt() calls of the "ask" policy's
    # question about this attempt's unknown outcome, once asked; paused: that of the
    # call's own first question; else None.
    asked_at: int | None = field(default_factory=_none, hash=False)
    # The framework's task its latest attempt ran in (LangGraph's task id).
    attempt_task: str | None = None
    args: Any = field(default_factory=_none, hash=False)  # the call's recorded arguments
    # Its recorded result (None unless completed).
    result: Any = field(default_factory=_none, hash=False)

    @property
    def outcome_unknown(self) -> bool:
        """Started and never finished: the call may or may not have had its effect."""
        return self.status == "started"


@dataclass(frozen=True)
class Claim:
    """The answer to a claim: the step as stored, and whether the caller now owns it."""

    step: Step
    owned: bool


@dataclass(frozen=True)
class EventSpec:
    """An event to append in the same transaction as a step change."""

    run_id: str
    kind: str
    phase: str
    name: str | None = None
    step_key: str | None = None
    payload: Any = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None
    error: str | None = None
    parent_seq: int | None = None


def _repr(value: Any) -> str:
    """``repr(value)``, or a description of the value if its repr fails: the call it is
    the result of has had its effect, and must still be recorded as completed."""
    try:
        return repr(value)
    except Exception as exc:
        return f"<{type(value).__qualname__}: repr() raised {type(exc).__name__}>"


class JournalOps:
    """The journal's operations, free of I/O, on a saver's SQL and encoding."""

    def __init__(self, core: SaverCore) -> None:
        self.core = core
        self.sql = core.sql

    # -- encoding ---------------------------------------------------------------------

    def dump(self, value: Any) -> tuple[str | None, bytes | None]:
        """Serialize a payload; one that cannot be stored safely is kept as its repr."""
        if value is None:
            return None, None
        try:
            serde = self.core.serde
            if isinstance(serde, SafeSerializer):  # a recorded result comes back as it was
                return self.core.codec.encode(*serde.dumps_typed(value, keep_tuples=True))
            return self.core._dump(value)
        except (UnsafeTypeError, TypeError):
            return self.core.codec.encode(_REPR, _repr(value).encode(errors="replace"))

    def load(self, type_: str | None, data: Any, what: str) -> Any:
        """A stored payload (a step's arguments or result, a run's metadata, an event's
        payload), decoded; :class:`CorruptDataError` naming ``what`` if it cannot be."""
        if type_ is None:
            if data is None:
                return None
            raise CorruptDataError(f"cannot read {what}: it is stored without its type")
        try:
            # The codec's marks (compressed, encrypted) follow the serializer's tag.
            decoded = self.core.codec.decode(type_, data)
            if decoded[0] == _REPR:
                return decoded[1].decode()
            return self.core._loads(decoded)
        except Exception as exc:
            raise CorruptDataError(f"cannot read {what}: {exc}") from exc

    @staticmethod
    def _count(value: Any, what: str) -> int:
        """An integer column (attempts, interrupts), or CorruptDataError naming it."""
        try:
            return int(value or 0)
        except (TypeError, ValueError):
            raise CorruptDataError(f"cannot read {what}: {value!r} is not a count") from None

    def _step(self, row: Sequence[Any]) -> Step:
        (scope, key, run_id, kind, name, effect, status, idem, attempts, owner, started,
         finished, args_type, args, result_type, result, error, interrupts, asked,
         attempt_task) = row  # fmt: skip
        where = f"step {key!r} in scope {scope!r}"
        decoders = {
            "args": lambda: self.load(args_type, args, f"the arguments of {where}"),
            "result": lambda: self.load(result_type, result, f"the result of {where}"),
            "attempts": lambda: self._count(attempts, f"the attempts of {where}"),
            "interrupts": lambda: self._count(interrupts, f"the interrupts of {where}"),
            "asked_at": lambda: (
                None if asked is None else self._count(asked, f"the question of {where}")
            ),
        }
        return Step._stored(
            decoders,
            scope=scope,
            step_key=key,
            run_id=run_id,
            kind=kind,
            name=name,
            effect=effect,
            status=status,
            idempotency_key=idem,
            attempts=None,
            owner=owner,
            started_at=started,
            finished_at=finished,
            error=error,
            interrupts=None,
            asked_at=None,
            attempt_task=attempt_task,
        )

    def _run(self, row: Sequence[Any]) -> Run:
        (run_id, framework, name, thread_id, status, attempt, owner, lease, created, updated,
         ended, meta_type, meta, error) = row  # fmt: skip
        what = f"the metadata of run {run_id!r}"
        attempt_of = f"the attempt of run {run_id!r}"
        return Run._stored(
            {
                "metadata": lambda: self.load(meta_type, meta, what),
                "attempt": lambda: self._count(attempt, attempt_of),
            },
            run_id=run_id,
            framework=framework,
            name=name,
            thread_id=thread_id,
            status=status,
            attempt=None,
            owner=owner,
            lease_until=lease,
            created_at=created,
            updated_at=updated,
            ended_at=ended,
            error=error,
        )

    def _event(self, row: Sequence[Any]) -> Event:
        (seq, run_id, ts, kind, phase, name, key, parent, tin, tout, cost, ptype, payload,
         error) = row  # fmt: skip
        what = f"the payload of event {seq} of run {run_id!r}"
        return Event._stored(
            {"payload": lambda: self.load(ptype, payload, what)},
            seq=self._count(seq, f"the seq of an event of run {run_id!r}"),
            run_id=run_id,
            ts=ts,
            kind=kind,
            phase=phase,
            name=name,
            step_key=key,
            parent_seq=parent,
            input_tokens=tin,
            output_tokens=tout,
            cost=cost,
            error=error,
        )

    # -- writes -----------------------------------------------------------------------

    def append(self, event: EventSpec) -> Operation[int]:
        """Append an event; returns its ``seq``."""
        if type(event.run_id) is not str:
            event = replace(event, run_id=id_text(event.run_id, "run_id"))
        row = self._event_row(event)
        rows = yield Query(self.sql.INSERT_EVENT + " RETURNING seq", row, fetch=True)
        return int(rows[0][0])

    def log(
        self,
        event: EventSpec,
        dumped: tuple[str | None, bytes | None] | None = None,
        ts: str | None = None,
    ) -> Operation[None]:
        """Append an event whose ``seq`` nobody needs: no row comes back, so on
        PostgreSQL it travels in the operation's pipeline without a round trip.
        ``dumped``: its payload, serialized already; ``ts``: its time, if taken already
        (a step's own time, written in the same transaction)."""
        yield Query(self.sql.INSERT_EVENT, self._event_row(event, dumped, ts))
        return None

    def _event_row(
        self,
        event: EventSpec,
        dumped: tuple[str | None, bytes | None] | None = None,
        ts: str | None = None,
    ) -> tuple[Any, ...]:
        ptype, payload = dumped if dumped is not None else self.dump(event.payload)
        return (
            event.run_id,
            ts or now(),
            event.kind,
            event.phase,
            event.name,
            event.step_key,
            event.parent_seq,
            event.input_tokens,
            event.output_tokens,
            event.cost,
            ptype,
            payload,
            event.error,
        )

    def start_run(
        self,
        run_id: str,
        *,
        framework: str,
        name: str | None = None,
        thread_id: str | None = None,
        metadata: Any = None,
        owner: str | None = None,
        lease_until: str | None = None,
    ) -> Operation[None]:
        """Create a run as ``running``, or restart an existing one (attempt + 1).

        A run already running under the same ``owner`` (default: this saver's process
        token) is left alone, so concurrent writers of one process start it once; the
        start event is appended only when the run was (re)started.
        """
        mtype, meta = self.dump(metadata)
        ts = now()
        owner = owner or self.core.owner
        run_id = id_text(run_id, "run_id")
        if thread_id is not None:
            thread_id = id_text(thread_id, "thread_id")
        params = (run_id, framework, name, thread_id, owner, lease_until, ts, ts, mtype, meta)
        event = EventSpec(run_id, "run", "start", name=name)
        if self.sql.START_RUN_LOGGED is not None:
            yield Query(self.sql.START_RUN_LOGGED, (*params, *self._event_row(event)[1:]))
            return None
        if (yield Query(self.sql.START_RUN, params, fetch=True)):
            yield from self.log(event)
        return None

    def resume_paused_run(self, run_id: str) -> Operation[bool]:
        """Restart a run only if it is ``interrupted`` (attempt + 1, with its start
        event); whether it was."""
        rows = yield Query(self.sql.RESUME_PAUSED_RUN, (self.core.owner, now(), run_id), fetch=True)
        if rows:
            yield from self.log(EventSpec(run_id, "run", "start"))
        return bool(rows)

    def mark_succeeded(
        self, run_id: str, on_applied: Callable[[], None] | None = None
    ) -> Operation[None]:
        """Mark a running run ``succeeded`` (a failed or restarted one is left as it is),
        with an event saying so; ``on_applied`` runs after the commit if it applied."""
        ts = now()
        event = EventSpec(run_id, "run", "end", name="succeeded")

        def applied(rows: Rows) -> None:
            if rows and on_applied is not None:
                on_applied()

        if self.sql.MARK_SUCCEEDED_LOGGED is not None:
            params = (ts, ts, run_id, *self._event_row(event)[1:])
            yield Later(Query(self.sql.MARK_SUCCEEDED_LOGGED, params, fetch=True), applied)
            return None
        if (yield Query(self.sql.MARK_SUCCEEDED, (ts, ts, run_id), fetch=True)):
            yield from self.log(event)
            if on_applied is not None:
                yield OnCommit(on_applied)
        return None

    def set_run_status(
        self,
        run_id: str,
        status: RunStatus,
        *,
        error: str | None = None,
        framework: str = "custom",
    ) -> Operation[None]:
        """Record a run's new status and an event saying so (``succeeded``: see
        :meth:`mark_succeeded`)."""
        run_id = id_text(run_id, "run_id")
        if status == "succeeded":
            yield from self.mark_succeeded(run_id)
            return None
        ts = now()
        ended = ts if status in ("failed", "crashed") else None
        yield Query(
            self.sql.SET_RUN_STATUS,
            (run_id, framework, status, self.core.owner, ts, ts, ended, error),
        )
        phase = {"failed": "error", "crashed": "error", "interrupted": "interrupt"}.get(
            status, "end"
        )
        yield from self.log(EventSpec(run_id, "run", phase, name=status, error=error))
        return None

    def checkpoint_stored(self, thread_id: str, ns: str, checkpoint_id: str) -> Operation[int]:
        """Whether a checkpoint has been stored (a put LangGraph made in the background,
        with ``durability="async"``, may still be on its way): 1 if so; 0 if not, but an
        earlier one of its namespace is; -1 if its namespace has none before it."""
        params = (checkpoint_id, thread_id, ns, checkpoint_id, checkpoint_id)
        rows = yield Query(self.sql.CHECKPOINT_STORED, params, fetch=True)
        return -1 if not rows else (1 if rows[0][0] else 0)

    def claim(
        self,
        scope: str,
        step_key: str,
        *,
        run_id: str | None,
        kind: str,
        name: str,
        effect: Effect,
        idempotency_key: str,
        args: Any,
        owner: str,
        event: EventSpec | None = None,
        ensure_run: str | None = None,
        position: tuple[str, str] | None = None,
        task: str | None = None,
    ) -> Operation[Claim]:
        """Start a step unless it exists: one atomic insert on ``(scope, step_key)``.
        ``task``: the framework's task the attempt runs in (LangGraph's task id).

        Returns the stored step and whether this caller owns it. The start event is
        appended in the same transaction, only when the claim succeeds. With
        ``ensure_run`` (a framework name), the run is first started in the journal if
        this process has not started it yet (``position``: see SaverCore._ensure_run).
        """
        if ensure_run is not None and run_id is not None:
            yield from self.core._ensure_run(run_id, ensure_run, position)
        atype, adata = self.dump(args)
        started_at = now()
        params = (scope, step_key, run_id, kind, name, effect, idempotency_key, owner,
                  started_at, atype, adata, task)  # fmt: skip
        # The row as inserted, in SELECT_STEP's columns.
        row = (scope, step_key, run_id, kind, name, effect, "started", idempotency_key, 1,
               owner, started_at, None, atype, adata, None, None, None, None, None,
               task)  # fmt: skip
        # The start event usually carries the arguments: serialized once, stored twice.
        dumped = (atype, adata) if event is not None and event.payload is args else None
        if event is not None and self.sql.CLAIM_STEP_LOGGED is not None:
            # The event comes with the claim, only if it inserted the step: nothing is
            # written after it (a step found instead is only read).
            event_row = self._event_row(event, dumped, started_at)
            inserted = yield Query(
                self.sql.CLAIM_STEP_LOGGED, (*params, *event_row), fetch=True, final=True
            )
            return (yield from self._claimed([row] if inserted else [], scope, step_key, owner))
        inserted = yield Query(self.sql.CLAIM_STEP, params, fetch=True, final=event is None)
        return (
            yield from self._claimed(
                [row] if inserted else [], scope, step_key, owner, event, dumped, started_at
            )
        )

    def reclaim(
        self,
        scope: str,
        step_key: str,
        *,
        seen_owner: str,
        owner: str,
        run_id: str | None,
        event: EventSpec | None = None,
        task: str | None = None,
    ) -> Operation[Claim]:
        """Take over a failed, paused or unknown-outcome step from the owner seen,
        atomically (``task``: as for :meth:`claim`)."""
        params = (owner, now(), run_id, task, scope, step_key, seen_owner)
        if event is not None and self.sql.RECLAIM_STEP_LOGGED is not None:
            # As in claim: the event comes with the take-over, only if it applied.
            logged = (*params, *self._event_row(event))
            rows = yield Query(self.sql.RECLAIM_STEP_LOGGED, logged, fetch=True, final=True)
            return (yield from self._claimed(rows, scope, step_key, owner))
        rows = yield Query(self.sql.RECLAIM_STEP, params, fetch=True, final=event is None)
        return (yield from self._claimed(rows, scope, step_key, owner, event))

    def mark_asked(
        self, scope: str, step_key: str, *, owner: str, at: int, task: str | None
    ) -> Operation[None]:
        """Record where among the interrupts of its ``task`` the "ask" policy's question
        about the unknown outcome of a step (still the ``owner``'s) is."""
        yield Query(self.sql.MARK_ASKED, (at, task, scope, step_key, owner))

    def _claimed(
        self,
        rows: Rows,
        scope: str,
        step_key: str,
        owner: str,
        event: EventSpec | None = None,
        dumped: tuple[str | None, bytes | None] | None = None,
        ts: str | None = None,
    ) -> Operation[Claim]:
        """The claim a claim or a take-over made: the step as its statement returned it,
        or, when it returned none (another owner has it, or it is done), as it is; the
        start event appended when its statement made it ours (``dumped``, ``ts``: see
        :meth:`log`). A step found ours without it was claimed by this very operation
        made before: a pool makes an operation again when its connection breaks, even
        as it commits, and the answer is lost; its event is stored already."""
        changed = bool(rows)
        if not changed:
            rows = yield Query(self.sql.SELECT_STEP, (scope, step_key), fetch=True)
        step = self._step(rows[0])
        owned = step.owner == owner and step.status == "started"
        if owned and changed and event is not None:
            yield from self.log(event, dumped, ts)
        return Claim(step, owned)

    def complete(
        self,
        scope: str,
        step_key: str,
        *,
        owner: str,
        result: Any,
        event: EventSpec | None,
        interrupts: int = 0,
    ) -> Operation[bool]:
        """Record a step's result; False if the step was not ours to finish.
        ``interrupts``: how many interrupt() calls of its task the call made."""
        rtype, rdata = self.dump(result)
        finished_at = now()
        params = (finished_at, rtype, rdata, interrupts or None, scope, step_key, owner)
        # The end event usually carries the result: serialized once, stored twice.
        dumped = (rtype, rdata) if event is not None and event.payload is result else None
        # A row back: it was ours and started, and is completed now.
        if event is not None and self.sql.COMPLETE_STEP_LOGGED is not None:
            event_row = self._event_row(event, dumped, finished_at)
            logged = self.sql.COMPLETE_STEP_LOGGED
            return bool((yield Query(logged, (*params, *event_row), fetch=True, final=True)))
        done = bool((yield Query(self.sql.COMPLETE_STEP, params, fetch=True, final=event is None)))
        if done and event is not None:
            yield from self.log(event, dumped, finished_at)
        return done

    def fail(
        self, scope: str, step_key: str, *, owner: str, error: str, event: EventSpec | None
    ) -> Operation[None]:
        """Record that a step raised: its outcome is known (it reported failure)."""
        yield Query(self.sql.FAIL_STEP, (now(), error, scope, step_key, owner))
        if event is not None:
            yield from self.log(event)
        return None

    def completed_among(self, scope: str, step_keys: Sequence[str]) -> Operation[list[Step]]:
        """Those of these steps that are completed."""
        sql = self.sql.COMPLETED_STEPS_AMONG.format(keys=in_list(len(step_keys)))
        return [self._step(row) for row in (yield Query(sql, (scope, *step_keys), fetch=True))]

    def release(self, scope: str, step_key: str, *, owner: str) -> Operation[None]:
        """Forget a claim whose call never began its effect (it paused for an interrupt)."""
        yield Query(self.sql.RELEASE_STEP, (scope, step_key, owner))
        return None

    def pause(
        self, scope: str, step_key: str, *, owner: str, at: int | None, task: str | None
    ) -> Operation[None]:
        """A call taken over (after a crash or a failure) that paused for an interrupt
        before its effect: kept as ``paused``, with where among its task's questions its
        own begin (``asked_at``, in ``task``), so that it runs again after the same ones.
        Also a take-over cancelled before its call began (``at``: None where the
        framework does not number its questions)."""
        yield Query(self.sql.PAUSE_STEP, (at, task, scope, step_key, owner))
        return None

    # -- reads ------------------------------------------------------------------------

    def get_step(self, scope: str, step_key: str) -> Operation[Step | None]:
        scope = id_text(scope, "scope")
        rows = yield Query(self.sql.SELECT_STEP, (scope, step_key), fetch=True)
        return self._step(rows[0]) if rows else None

    def get_run(self, run_id: str) -> Operation[Run | None]:
        rows = yield Query(self.sql.SELECT_RUN, (id_text(run_id, "run_id"),), fetch=True)
        return self._run(rows[0]) if rows else None

    def runs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        framework: str | None = None,
        limit: int | None = None,
    ) -> Operation[list[Run]]:
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            wanted = _statuses(status, get_args(RunStatus), "runs(status=...)")
            where.append(f"status IN ({in_list(len(wanted))})" if wanted else "1 = 0")
            params.extend(wanted)
        if framework is not None:
            where.append("framework = ?")
            params.append(framework)
        sql = self.sql.SELECT_RUNS
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY updated_at DESC, run_id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(_limit(limit, "runs(limit=...)"))
        rows = yield Query(sql, tuple(params), fetch=True)
        return [self._run(r) for r in rows]

    def events(self, run_id: str, *, after: int = 0) -> Operation[list[Event]]:
        if type(after) is not int:
            raise TypeError(f"events(after=...) must be an event's seq (an int), not {after!r}")
        params = (id_text(run_id, "run_id"), after)
        rows = yield Query(self.sql.SELECT_EVENTS, params, fetch=True)
        return [self._event(r) for r in rows]

    def steps(
        self,
        *,
        run_id: str | None = None,
        scope: str | None = None,
        status: str | Sequence[str] | None = None,
    ) -> Operation[list[Step]]:
        where: list[str] = []
        params: list[Any] = []
        if run_id is not None:
            where.append("run_id = ?")
            params.append(id_text(run_id, "run_id"))
        if scope is not None:
            where.append("scope = ?")
            params.append(id_text(scope, "scope"))
        if status is not None:
            wanted = _statuses(status, get_args(StepStatus), "steps(status=...)")
            where.append(f"status IN ({in_list(len(wanted))})" if wanted else "1 = 0")
            params.extend(wanted)
        sql = self.sql.SELECT_STEPS
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at, step_key"
        rows = yield Query(sql, tuple(params), fetch=True)
        return [self._step(r) for r in rows]


class Journal:
    """The journal of one database, reached through a saver on it.

    Every method exists in a sync and an async (``a``-prefixed) form; either works with
    either kind of saver (a sync saver's journal runs async calls in a worker thread; an
    async saver's journal takes sync calls from threads other than its event loop's).
    """

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self.ops: JournalOps = saver.journal_ops

    def _sync(self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True) -> T:
        return cast(T, self.saver.run_op(make_op, write, durable=durable))

    async def _async(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        return cast(T, await self.saver.arun_op(make_op, write, durable=durable))

    # writes
    def start_run(self, run_id: str, *, framework: str, **kwargs: Any) -> None:
        """Create or restart a run (see :meth:`JournalOps.start_run`)."""
        self._sync(lambda: self.ops.start_run(run_id, framework=framework, **kwargs), True)

    async def astart_run(self, run_id: str, *, framework: str, **kwargs: Any) -> None:
        await self._async(lambda: self.ops.start_run(run_id, framework=framework, **kwargs), True)

    def set_run_status(self, run_id: str, status: RunStatus, *, error: str | None = None) -> None:
        """Record a run's status."""
        self._sync(lambda: self.ops.set_run_status(run_id, status, error=error), True)

    async def aset_run_status(
        self, run_id: str, status: RunStatus, *, error: str | None = None
    ) -> None:
        await self._async(lambda: self.ops.set_run_status(run_id, status, error=error), True)

    def append(self, event: EventSpec) -> int:
        """Append an event; returns its ``seq``."""
        return self._sync(lambda: self.ops.append(event), True)

    async def aappend(self, event: EventSpec) -> int:
        return await self._async(lambda: self.ops.append(event), True)

    # reads
    def get_step(self, scope: str, step_key: str) -> Step | None:
        """One step of the ledger."""
        return self._sync(lambda: self.ops.get_step(scope, step_key), False)

    async def aget_step(self, scope: str, step_key: str) -> Step | None:
        return await self._async(lambda: self.ops.get_step(scope, step_key), False)

    def get_run(self, run_id: str) -> Run | None:
        """One run."""
        return self._sync(lambda: self.ops.get_run(run_id), False)

    async def aget_run(self, run_id: str) -> Run | None:
        return await self._async(lambda: self.ops.get_run(run_id), False)

    def runs(self, **kwargs: Any) -> builtins.list[Run]:
        """Runs, most recently updated first (filters: ``status``, one status or a list
        of them; ``framework``; ``limit``)."""
        return self._sync(lambda: self.ops.runs(**kwargs), False)

    async def aruns(self, **kwargs: Any) -> builtins.list[Run]:
        return await self._async(lambda: self.ops.runs(**kwargs), False)

    def events(self, run_id: str, *, after: int = 0) -> builtins.list[Event]:
        """A run's events in order (those with ``seq > after``)."""
        return self._sync(lambda: self.ops.events(run_id, after=after), False)

    async def aevents(self, run_id: str, *, after: int = 0) -> builtins.list[Event]:
        return await self._async(lambda: self.ops.events(run_id, after=after), False)

    def steps(self, **kwargs: Any) -> builtins.list[Step]:
        """Ledger rows (filters: ``run_id``, ``scope``, ``status``: one status or a list
        of them)."""
        return self._sync(lambda: self.ops.steps(**kwargs), False)

    async def asteps(self, **kwargs: Any) -> builtins.list[Step]:
        return await self._async(lambda: self.ops.steps(**kwargs), False)

    def run_op(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        """Run any journal operation synchronously (used by the effect wrappers).

        ``durable=False`` is for writes whose loss is harmless: the commit then need not
        wait for the disk, where the database allows it (SQLite in WAL mode; PostgreSQL,
        in a transaction of the saver's own). Such a write survives a crash of the
        process, not always a power failure."""
        return self._sync(make_op, write, durable=durable)

    async def arun_op(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        """Run any journal operation asynchronously (see :meth:`run_op`)."""
        return await self._async(make_op, write, durable=durable)


@contextmanager
def connect(url: str, **kwargs: Any) -> Iterator[Journal]:
    """Open the journal of a database for reading (and writing): a SQLite path or
    ``sqlite:///`` URL, or a ``postgresql://`` URL (needs ``agentcheck[postgres]``).

    ```python
    with agentcheck.connect("agent.db") as journal:
        for run in journal.runs():
            print(run.run_id, run.status)
    ```
    """
    if url.startswith(("postgresql://", "postgres://")):
        from agentcheck.savers.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(url, pool_size=2, **kwargs) as pg:
            yield pg.journal
    else:
        from agentcheck.savers.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(url, **kwargs) as lite:
            yield lite.journal
