"""Side-effect-aware calls: a completed call never runs twice (docs/effects.md).

``@side_effect`` and ``@idempotent`` wrap a function (sync or async, used alone or under
LangChain's ``@tool``). Each call is a step in the journal's ledger, keyed
deterministically by where it runs, never by its arguments:

* before it runs, the step is claimed ("started"); after, its result is recorded
  ("completed") or its exception ("failed");
* when the same call runs again (crash resume, interrupt resume, node retry), a completed
  step returns its recorded result without running; a failed one runs again;
* a step that started and never finished has an *unknown outcome*: a per-tool policy
  decides (raise :class:`ToolOutcomeUnknown`, ``retry`` for idempotent calls, ``ask`` a
  human, or a ``reconcile`` callable that looks the effect up).

Where a call runs is found by *resolvers* registered by the framework adapters (LangGraph:
the saver compiled into the graph, the thread, the task) or given explicitly with
:func:`effect_scope`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import logging
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, TypeVar, cast, overload

from agentcheck._errors import AgentcheckError
from agentcheck.backends.base import id_text
from agentcheck.journal import (
    Claim,
    Effect,
    EventSpec,
    Journal,
    Step,
    new_owner,
    owner_alive,
)

__all__ = [
    "CallContext",
    "NOT_DONE",
    "ToolOutcomeUnknown",
    "UnknownOutcome",
    "current_idempotency_key",
    "effect_scope",
    "idempotency_key_for",
    "idempotent",
    "note_interrupt",
    "register_resolver",
    "side_effect",
]

logger = logging.getLogger("agentcheck")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
OnUnknown = Literal["raise", "retry", "ask"]
KEY_PARAM = "idempotency_key"


class ToolOutcomeUnknown(AgentcheckError):
    """A side-effecting call started earlier and never finished: agentcheck cannot know
    whether its effect happened, so it refuses to run it again blindly."""

    def __init__(self, outcome: UnknownOutcome) -> None:
        self.outcome = outcome
        super().__init__(
            f"the outcome of {outcome.tool}({_short(outcome.args)}) is unknown: it started at "
            f"{outcome.started_at} (attempt {outcome.attempts}) and never finished. It was "
            f"not run again. Idempotency key: {outcome.idempotency_key} (step "
            f"{outcome.step_key!r} in scope {outcome.scope!r}). Check the external system "
            "with that key, then give the tool a reconcile= callable, mark it @idempotent "
            "if repeating it is harmless, or use on_unknown='ask'."
        )


class _NotDone:
    def __repr__(self) -> str:
        return "NOT_DONE"


NOT_DONE: Any = _NotDone()
"""Returned by a ``reconcile`` callable: the effect did not happen, run the call."""


@dataclass(frozen=True)
class UnknownOutcome:
    """What is known of a call whose outcome is unknown; given to ``reconcile``."""

    tool: str
    args: Any
    idempotency_key: str
    started_at: str
    attempts: int
    step_key: str
    scope: str


@dataclass
class CallContext:
    """Where a call runs: the journal, the ledger scope and a deterministic key prefix.

    Attributes:
        journal: the journal to record in.
        scope: the ledger scope (LangGraph: the thread id).
        key_prefix: the deterministic position of the caller (LangGraph: checkpoint
            namespace and task id).
        run_id: the journal run to log events under.
        call_id: an id the framework gives this very call (a model's tool-call id).
        counters: per-attempt ordinals of calls by name; must be new for each attempt.
        ask: asks a human and returns the answer (LangGraph: ``interrupt``).
        framework: when set, the journal run is started (as this framework's) before
            the first call this process makes in it.
        count_interrupts: makes the framework report each time the code running in
            this context asks a human (see :func:`note_interrupt`); False if it cannot.
        skip_interrupts: passes over that many: a replayed call asks nothing, and the
            framework matches answers to questions by their order (LangGraph). With
            ``fill``, the questions were answered in another task (this one continues
            it after update_state): none of this task's answers is theirs.
        task: the framework's id of the task the call runs in (LangGraph's task id).
        interrupt_position: (the index the task's next question gets, how many of its
            questions are answered), or None if the framework cannot tell: after a
            crash, the answers past that index were used by the attempt that crashed.
        position: where the call runs in its framework's run (LangGraph: the root
            checkpoint and task), for when it starts the run (see ``framework``).
        resolve_prefix: a journal operation giving the key prefix to use instead of
            ``key_prefix``, run before the first call (LangGraph: the task a task
            continues after update_state).
        stored_first: (thread, namespace, checkpoint) that must be stored before a call
            is claimed, since its keys derive from it (LangGraph, ``durability="async"``:
            the checkpoint of the task, which LangGraph stores in the background while
            the task runs; a crash before it is stored makes the task new, with new keys).
    """

    journal: Journal
    scope: str
    key_prefix: str
    run_id: str | None = None
    call_id: str | None = None
    counters: dict[str, int] = field(default_factory=dict)
    ask: Callable[[Any], Any] | None = None
    framework: str | None = None
    count_interrupts: Callable[[], bool] | None = None
    skip_interrupts: Callable[[int, bool], None] | None = None
    task: str | None = None
    interrupt_position: Callable[[], tuple[int, int] | None] | None = None
    resolve_prefix: Callable[[], Any] | None = None
    position: tuple[str, str] | None = None
    stored_first: tuple[str, str, str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # As the journal stores them (a framework's resolver may give a UUID or an enum).
        self.scope = id_text(self.scope, "scope")
        if self.run_id is not None:
            self.run_id = id_text(self.run_id, "run_id")

    def questions(self) -> tuple[int, int] | None:
        """:attr:`interrupt_position`'s answer, or None where the framework gives none."""
        return self.interrupt_position() if self.interrupt_position is not None else None

    def take_ordinal(self, kind: str, name: str) -> tuple[str, int]:
        """The next call of ``name`` here: its call id (if any) and its ordinal. Taken as
        the call starts, before any I/O, so that calls started one after another (in one
        thread, or by ``asyncio.gather``) are numbered in that order, however their I/O
        then interleaves."""
        base = f"{kind}:{name}" + (f"@{self.call_id}" if self.call_id else "")
        with self.lock:
            n = self.counters.get(base, 0)
            self.counters[base] = n + 1
        return base, n

    def skip_past(self, base: str, n: int) -> None:
        """Number the next call of ``base`` after ``n`` (a failed call replayed as its
        retry #``n``: the calls after it keep the numbers they had)."""
        with self.lock:
            self.counters[base] = max(self.counters.get(base, 0), n + 1)

    def key_at(self, ordinal: tuple[str, int]) -> str:
        """The step key of a call given its :meth:`take_ordinal`."""
        return f"{self.key_prefix}|{ordinal[0]}#{ordinal[1]}"


Resolver = Callable[[], "CallContext | None"]
_resolvers: list[Resolver] = []
_pause_errors: tuple[type[BaseException], ...] = ()
_explicit: ContextVar[CallContext | None] = ContextVar("agentcheck_effect_scope", default=None)
_current_key: ContextVar[str | None] = ContextVar("agentcheck_idempotency_key", default=None)
_warned: set[str] = set()


def register_resolver(
    resolver: Resolver, *, pause_errors: tuple[type[BaseException], ...] = ()
) -> None:
    """Register how a framework tells where a call runs (used by the adapters).

    ``pause_errors`` are exceptions by which the framework pauses a call rather than
    failing it (LangGraph's interrupts): the claim is released, not marked failed.
    """
    global _pause_errors
    if resolver not in _resolvers:
        _resolvers.append(resolver)
    _pause_errors = tuple({*_pause_errors, *pause_errors})


def resolve_context() -> CallContext | None:
    """The context of the current call: an explicit :func:`effect_scope` first, then
    the registered framework resolvers."""
    explicit = _explicit.get()
    if explicit is not None:
        return explicit
    for resolver in _resolvers:
        ctx = resolver()
        if ctx is not None:
            return ctx
    return None


@contextmanager
def effect_scope(journal: Journal, scope: str, *, run_id: str | None = None) -> Iterator[None]:
    """Protect calls made outside a framework: calls inside are keyed by their ordinal.

    Run the same code again in the same scope (after a crash) and the calls line up with
    the recorded ones in order. Use one scope per logical run. ``scope`` and ``run_id``
    are stored as text: an order number or a UUID as its text (``42`` and ``"42"`` are
    one scope); None or bytes raise ``TypeError``.
    """
    run_id = None if run_id is None else id_text(run_id, "run_id")
    scope = id_text(scope, "effect_scope's scope")
    context = CallContext(journal=journal, scope=scope, key_prefix="", run_id=run_id)
    token = _explicit.set(context)
    try:
        yield
    finally:
        _explicit.reset(token)


def current_idempotency_key() -> str | None:
    """The idempotency key of the wrapped call now running (None outside one).

    Stable across crashes and resumes: forward it to an API that deduplicates by key
    (a payment provider's ``Idempotency-Key`` header)."""
    return _current_key.get()


def idempotency_key_for(scope: str, step_key: str) -> str:
    """The idempotency key of a step: derived from its position, never its arguments."""
    digest = hashlib.sha256(f"{scope}\x00{step_key}".encode()).hexdigest()
    return f"ac-{digest[:40]}"


def _short(args: Any, limit: int = 200) -> str:
    if isinstance(args, dict):
        text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    else:
        text = repr(args)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _warn_unprotected(name: str) -> None:
    if name not in _warned:
        _warned.add(name)
        logger.warning(
            "agentcheck: %s ran without a journal (no agentcheck saver compiled into the "
            "graph and no effect_scope), so it is not protected against running twice",
            name,
        )


# -- the protocol, written once for sync and async --------------------------------------


@dataclass(frozen=True)
class _Db:
    make_op: Callable[[], Any]
    # False: a write that may be lost to a power failure (see _protocol's claims).
    durable: bool = True
    write: bool = True
    # What the write does to the step (see ProtocolRun.ato_call): "claim" (a claim or a
    # take-over: whether it is held must be known), "settle" (records how a claim held
    # ended: its result, its failure, or its release), or None.
    role: Literal["claim", "settle"] | None = None


@dataclass(frozen=True)
class _Reconcile:
    outcome: UnknownOutcome


@dataclass(frozen=True)
class _Ask:
    payload: dict[str, Any]


@dataclass(frozen=True)
class _Call:
    idempotency_key: str


@dataclass(frozen=True)
class _Wait:
    done: threading.Event


@dataclass(frozen=True)
class _Pause:
    seconds: float
    # False: what it waits for may need this thread's event loop (a put LangGraph runs
    # on it): a sync call made on that loop's thread gives up the wait (_CannotWait).
    on_loop: bool = True


class _CannotWait(Exception):
    """Thrown into a protocol whose pause would block the event loop it waits on."""


class _NotBegun(BaseException):
    """Thrown into a protocol at its call when the task making it was cancelled before
    the call began (while a journal write was on its way): its claim is given up as a
    paused call's is, and the driver raises ``asyncio.CancelledError``."""


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


Action = _Db | _Reconcile | _Ask | _Call | _Wait | _Pause

# How long after a call started in another process on this machine, still running, a
# call of the same step waits for it to finish (and then replays its result), rather than
# taking its outcome for unknown: it is the same call, made twice at once (two workers
# resuming one thread, say), and the first may well finish. A longer call than that
# (or one the other process gave up without ending) goes to the tool's policy.
OTHER_PROCESS_WAIT = 120.0
_POLL = 0.05

# The calls running in this process, by their claim's owner token, with the event set
# once their outcome is recorded. A call that finds its step started by one of them waits
# for it rather than taking it for a call cut short: LangGraph's async ToolNode leaves a
# tool running when a sibling fails, and a RetryPolicy then runs the task again.
_running: dict[str, threading.Event] = {}
_running_lock = threading.Lock()


@dataclass(frozen=True)
class EffectSpec:
    """How a wrapped function behaves (attached to it as ``__agentcheck__``)."""

    name: str
    effect: Effect
    on_unknown: OnUnknown
    reconcile: Callable[[UnknownOutcome], Any] | None
    kind: str = "tool"
    # Token usage of a result, for the end event (model calls).
    usage: Callable[[Any], tuple[int | None, int | None]] | None = None
    # Whether the start event repeats the arguments (the ledger has them anyway; a
    # model's prompt is large and already in the checkpoint).
    log_args: bool = True


# The times the wrapped call running in this context (its thread, its asyncio task) has
# asked a human: counted by the framework (note_interrupt), so that a call counts its own
# questions and not those of a sibling running beside it in the same task.
_asked: ContextVar[list[int] | None] = ContextVar("agentcheck_asked", default=None)


def note_interrupt() -> None:
    """Count one question asked by the wrapped call running in this context (called by
    a framework adapter each time its code asks a human: LangGraph's ``interrupt()``)."""
    tally = _asked.get()
    if tally is not None:
        tally[0] += 1


def protocol(
    spec: EffectSpec, ctx: CallContext, args: Any, ordinal: tuple[str, int] | None = None
) -> Generator[Action, Any, tuple[Any, str]]:
    """The ledger protocol of one call. Yields actions; a driver performs them.

    ``ordinal``: the call's :meth:`CallContext.take_ordinal`, when it was taken where the
    call started (a model call, before LangChain's callbacks); else it is taken as the
    protocol starts.

    Returns ``(result, idempotency_key)``. The driver performs ``_CALL`` by running the
    wrapped function (and throws its exception back in).

    The questions asked while it runs (its own, or the ``ask`` policy's) are counted in
    the driver's context, where the call runs; a call made inside another one adds its
    count to the outer one's.
    """
    counted = ctx.count_interrupts() if ctx.count_interrupts is not None else False
    tally = [0]
    outer = _asked.get()
    token = _asked.set(tally)
    # Known as running before it claims anything: a call of the same step that finds
    # the claim must find it here too (between the claim's commit and the protocol's
    # next step, another task or thread may look), or it takes the claim for one cut
    # short and runs the call a second time.
    owner = new_owner()
    done = threading.Event()
    with _running_lock:
        _running[owner] = done
    try:
        return (yield from _protocol(spec, ctx, args, tally if counted else None, ordinal, owner))
    finally:
        with _running_lock:  # its outcome is recorded (or never will be): waiters look again
            _running.pop(owner, None)
        done.set()
        try:
            _asked.reset(token)
        except ValueError:  # closed from another context: the value dies with it
            pass
        if outer is not None:
            outer[0] += tally[0]


def _protocol(
    spec: EffectSpec,
    ctx: CallContext,
    args: Any,
    asked: list[int] | None,
    ordinal: tuple[str, int] | None,
    owner: str,
) -> Generator[Action, Any, tuple[Any, str]]:
    ops = ctx.journal.ops
    # Before the first I/O (finding a resumed task's prefix is one), which calls started
    # together (asyncio.gather) may finish in any order.
    ordinal = ordinal or ctx.take_ordinal(spec.kind, spec.name)
    own_prefix = ctx.key_prefix
    if ctx.resolve_prefix is not None:
        ctx.key_prefix = yield _Db(ctx.resolve_prefix)
        ctx.resolve_prefix = None

    def this_task(step: Step) -> bool:
        """Whether the step's latest attempt ran in this very task. A step written
        before its task was recorded: unless this task continues another (its keys
        are that one's, after update_state)."""
        if step.attempt_task is not None:
            return step.attempt_task == ctx.task
        return ctx.key_prefix == own_prefix

    if ctx.stored_first is not None:
        yield from _until_stored(ctx, ctx.stored_first)
    step_key = ctx.key_at(ordinal)
    key = idempotency_key_for(ctx.scope, step_key)
    run_id = ctx.run_id or ctx.scope

    def event(phase: str, **kw: Any) -> EventSpec:
        kw.setdefault("name", spec.name)
        return EventSpec(run_id, spec.kind, phase, step_key=step_key, **kw)

    start_payload = args if spec.log_args else None
    # A claim says the call has started, so that a crash leaves its outcome unknown. A
    # call that is simply run again when that happens (idempotent, "retry", nothing to
    # reconcile: a model call, say) loses nothing if its claim is lost too, which only a
    # power failure can do: its claim is committed without waiting for the disk. Its
    # completion, like any side effect's claim, waits.
    durable_claim = not (
        spec.effect != "side_effect" and spec.on_unknown == "retry" and spec.reconcile is None
    )

    def claim_again(step: Step) -> _Db:
        return _Db(
            lambda: ops.reclaim(
                ctx.scope,
                step_key,
                seen_owner=step.owner,
                owner=owner,
                run_id=run_id,
                event=event("start", payload=start_payload),
                task=ctx.task,
            ),
            durable_claim,
            role="claim",
        )

    def claim_step() -> Any:
        return ops.claim(
            ctx.scope,
            step_key,
            run_id=run_id,
            kind=spec.kind,
            name=spec.name,
            effect=spec.effect,
            idempotency_key=key,
            args=args,
            owner=owner,
            event=event("start", payload=start_payload),
            ensure_run=ctx.framework,
            position=ctx.position,
            task=ctx.task,
        )

    claim: Claim = yield _Db(claim_step, durable_claim, role="claim")
    while not claim.owned and claim.step.status == "started":
        with _running_lock:
            running = _running.get(claim.step.owner)
        if running is not None:
            yield _Wait(running)
        elif owner_alive(claim.step.owner) and _recent(claim.step.started_at):
            yield _Pause(_POLL)  # running in another process of this machine
        else:
            break  # started by a call no longer running: its outcome is unknown
        claim = yield _Db(claim_step, durable_claim, role="claim")
    step = claim.step
    if not claim.owned:
        if step.status == "completed":
            if step.interrupts and ctx.skip_interrupts is not None:
                # The call asked a human when it ran; the questions after it in the task
                # must still meet their own answers.
                ctx.skip_interrupts(step.interrupts, not this_task(step))
            # Only a note in the journal: losing it to a power failure loses nothing.
            yield _Db(lambda: ops.log(event("replay")), False)
            return step.result, key
        outcome = UnknownOutcome(
            tool=spec.name,
            args=step.args,
            idempotency_key=key,
            started_at=step.started_at,
            attempts=step.attempts,
            step_key=step_key,
            scope=ctx.scope,
        )
        if step.status == "paused":
            # Taken over once, then paused at its own question: it runs again after the
            # same questions as then (the policy's, the answers passed over).
            _pass_used_answers(ctx, step, this_task(step))
            claim = yield claim_again(step)
        elif step.status == "failed":
            # The next 16 calls of the same name, by key (a retry loop's).
            first, last = ordinal[1] + 1, ordinal[1] + 16
            later = {ctx.key_at((ordinal[0], n)): n for n in range(first, last + 1)}
            done = yield _Db(lambda: ops.completed_among(ctx.scope, list(later)), write=False)
            retry = _its_retry(step, sorted(done, key=lambda s: later[s.step_key]))
            if retry is not None:
                # The code retried it (its own loop, a .with_retry()) and the retry
                # completed: the retry's result is this call's, and the calls after it
                # are numbered after the retry, as they were. Running this one anew
                # would make the effect again and never reach the retry's record.
                ctx.skip_past(ordinal[0], later[retry.step_key])
                if retry.interrupts and ctx.skip_interrupts is not None:
                    ctx.skip_interrupts(retry.interrupts, not this_task(retry))
                yield _Db(lambda: ops.log(event("replay")), False)
                return retry.result, idempotency_key_for(ctx.scope, retry.step_key)
            # It raised last time: it reported its own failure, so running it is safe.
            claim = yield claim_again(step)
        elif spec.reconcile is not None:
            found = yield _Reconcile(outcome)
            claim = yield claim_again(step)
            if claim.owned and found is not NOT_DONE:
                # Not run again: the questions the crashed attempt had answered are
                # passed over, as a replay of this step will (they are its own).
                _pass_used_answers(ctx, step, this_task(step))
                yield _Db(
                    lambda: ops.complete(
                        ctx.scope,
                        step_key,
                        owner=owner,
                        result=found,
                        event=event("end", name=f"{spec.name} (reconciled)", payload=found),
                        interrupts=asked[0] if asked else 0,
                    ),
                    role="settle",
                )
                return found, key
        elif spec.on_unknown == "retry":
            claim = yield claim_again(step)
        elif spec.on_unknown == "ask" and ctx.ask is not None:
            seen = step.owner

            def mark_asked(at: int) -> _Db:
                return _Db(
                    lambda: ops.mark_asked(ctx.scope, step_key, owner=seen, at=at, task=ctx.task)
                )

            at = _pass_used_answers(ctx, step, this_task(step))
            if at is not None and (at, ctx.task) != (step.asked_at, step.attempt_task):
                yield mark_asked(at)
            question: dict[str, Any] = {
                "type": "agentcheck.unknown_outcome",
                "tool": spec.name,
                "args": step.args,
                "idempotency_key": key,
                "started_at": step.started_at,
                "attempts": step.attempts,
                "step_key": step_key,
                "choices": {
                    "retry": "run the call again",
                    "result": "do not run it; use the given result",
                    "skip": "do not run it; the result is None",
                },
            }
            while True:
                answer = yield _Ask(question)
                try:
                    action, value = _parse_answer(answer)
                    break
                except ValueError as exc:
                    # An answer it cannot understand is kept by LangGraph as that
                    # question's: asked again, as the next question (saying why), or
                    # the thread would meet the same answer at every resume.
                    position = ctx.questions()
                    if position is None:
                        raise
                    yield mark_asked(position[0])
                    question = {**question, "error": str(exc)}
            claim = yield claim_again(step)
            if claim.owned and action != "retry":
                yield _Db(
                    lambda: ops.complete(
                        ctx.scope,
                        step_key,
                        owner=owner,
                        result=value,
                        event=event(
                            "end", name=f"{spec.name} ({action} by a human)", payload=value
                        ),
                        interrupts=asked[0] if asked else 0,
                    ),
                    role="settle",
                )
                return value, key
        else:
            raise ToolOutcomeUnknown(outcome)
        if not claim.owned:
            # Someone else took the step between our look and our claim.
            raise ToolOutcomeUnknown(outcome)

    # Where among the task's questions the call's own begin: after a take-over, past
    # the ones the policy asked or passed over in this execution. (Only then: a first
    # attempt that pauses is forgotten, and asks its questions where it did.)
    position = ctx.questions() if claim.step.attempts > 1 else None
    # Stopped before its effect began: paused (an interrupt), or cancelled as its claim
    # was being stored.
    not_begun: tuple[type[BaseException], ...] = (_NotBegun, *_pause_errors)
    try:
        result = yield _Call(key)
    except not_begun:
        if claim.step.attempts > 1:
            # A take-over is kept (paused), not forgotten: a claim made anew would not
            # pass over the questions before it, and the call's own would meet their
            # answers; and its attempts stay counted. The next attempt takes it over.
            start = position[0] if position is not None else None
            yield _Db(
                lambda: ops.pause(ctx.scope, step_key, owner=owner, at=start, task=ctx.task),
                role="settle",
            )
        else:
            yield _Db(lambda: ops.release(ctx.scope, step_key, owner=owner), role="settle")
        raise
    except Exception as exc:
        # The call reported its own failure. (A cancellation or KeyboardInterrupt is
        # not caught here: the call may have had its effect, so the step stays
        # "started" and its outcome unknown.)
        error = f"{type(exc).__name__}: {exc}"
        yield _Db(
            lambda: ops.fail(
                ctx.scope, step_key, owner=owner, error=error, event=event("error", error=error)
            ),
            role="settle",
        )
        raise
    tokens_in, tokens_out = spec.usage(result) if spec.usage else (None, None)
    end = event("end", payload=result, input_tokens=tokens_in, output_tokens=tokens_out)
    questions = asked[0] if asked else 0
    yield _Db(
        lambda: ops.complete(
            ctx.scope, step_key, owner=owner, result=result, event=end, interrupts=questions
        ),
        role="settle",
    )
    return result, key


# How long a call waits for its task's checkpoint to be stored (see CallContext's
# stored_first) before it goes on anyway (a put that failed: the graph reports it).
STORED_WAIT = 2.0
_STORED = "\x00stored"  # in a task attempt's counters: its checkpoint was seen stored


def _until_stored(ctx: CallContext, where: tuple[str, str, str]) -> Generator[Action, Any, None]:
    """Wait until the checkpoint the call's keys derive from is stored (once per task
    attempt: its calls share ``counters``). Not for a namespace with no checkpoint
    stored before it: a subgraph compiled with ``checkpointer=False`` stores none (its
    tasks still carry the saver), nor does a subgraph's first step; and not for a sync
    call made on the event loop the put would run on."""
    if ctx.counters.get(_STORED):
        return
    ops = ctx.journal.ops
    thread_id, ns, _ = where
    deadline = time.monotonic() + STORED_WAIT
    while (stored := (yield _Db(lambda: ops.checkpoint_stored(*where), write=False))) != 1:
        if stored < 0 and ns:
            break
        if time.monotonic() > deadline:
            logger.warning(
                "agentcheck: checkpoint %s of thread %s was not stored within %s s; the "
                "call goes on, and would run again after a crash", where[2], thread_id,
                STORED_WAIT,
            )  # fmt: skip
            break
        try:
            yield _Pause(0.002, on_loop=False)
        except _CannotWait:
            break
    with ctx.lock:
        ctx.counters[_STORED] = 1


def _pass_used_answers(ctx: CallContext, step: Step, this_task: bool) -> int | None:
    """Before a step whose outcome is unknown is settled without running it, before
    the "ask" policy's question about it, or before a paused call runs again: pass over
    the answers its crashed attempt used (the task's answers past its next question;
    LangGraph keeps a task's answers across crashes and matches them to questions by
    their order), or up to the step's ``asked_at`` (the policy's question already
    asked, whose answer is the one to use; a paused call's own first question). Else an
    old answer (its own approval, the human's "retry" of an attempt that then crashed
    as well) would answer a new question. Only for an attempt made in this very task
    (``this_task``): in one that continues it after update_state, a new task with
    answers of its own, none of them was used. Returns the index of the next question,
    or None if the framework cannot tell."""
    position = ctx.questions()
    if position is None or ctx.skip_interrupts is None:
        return None
    next_index, answered = position
    asked_at = step.asked_at
    if not this_task:
        at = next_index
    elif asked_at is not None and next_index <= asked_at <= answered:
        at = asked_at
    else:
        at = max(next_index, answered)
    ctx.skip_interrupts(at - next_index, False)
    return at


def _its_retry(failed: Step, completed: list[Step]) -> Step | None:
    """The first of the later calls of the same name (in their order) that completed
    with the same arguments as the failed one: a retry of it (a call with other
    arguments is another call, and the failed one runs again)."""
    for step in completed:
        try:
            if step.args == failed.args:
                return step
        except Exception:  # arguments that cannot be compared (or read): not a retry
            continue
    return None


def _recent(started_at: str) -> bool:
    """Whether a step started less than :data:`OTHER_PROCESS_WAIT` seconds ago."""
    try:
        started = datetime.fromisoformat(started_at)
    except (TypeError, ValueError):
        return False
    if started.tzinfo is None:
        started = started.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - started).total_seconds() < OTHER_PROCESS_WAIT


def _parse_answer(answer: Any) -> tuple[str, Any]:
    """A human's answer to an unknown outcome: "retry", "skip", or {"result": value}."""
    if isinstance(answer, str) and answer in ("retry", "skip"):
        return answer, None
    if isinstance(answer, dict):
        action = answer.get("action", "result" if "result" in answer else None)
        if action in ("retry", "skip", "result"):
            return action, answer.get("result")
    raise ValueError(
        f"cannot understand the answer {answer!r} to an unknown outcome: resume with "
        "'retry', 'skip' or {'result': <the call's result>}"
    )


@dataclass(frozen=True)
class Done:
    """A protocol that finished: the call's result (recorded or fresh)."""

    result: Any


class ProtocolRun:
    """Performs a protocol's journal, reconcile and ask actions, stopping at the call.

    The caller makes the call itself (so a model can stream while it runs) and hands
    back its value or its exception.
    """

    def __init__(
        self, gen: Generator[Action, Any, tuple[Any, str]], ctx: CallContext, spec: EffectSpec
    ) -> None:
        self.gen, self.ctx, self.spec = gen, ctx, spec
        self._started = False
        # The (async) task was cancelled while a journal write was on its way.
        self._cancelled = False

    def _refuse_on_saver_loop(self) -> None:
        """Refuse, before anything is claimed or called, a sync call made on the event
        loop of the async saver that journals it: its journal writes would wait for
        that loop, which the call itself is blocking."""
        refuses = getattr(self.ctx.journal.saver, "refuses_sync_calls", None)
        if refuses is None or not refuses():
            return
        self.gen.close()
        raise asyncio.InvalidStateError(
            f"the wrapped call {self.spec.name!r} ({self.spec.kind}) was made synchronously "
            "on the event loop of the async saver that journals it (a sync function, or a "
            "model's invoke, called in an `async def` node), and its journal writes would "
            "have to wait for that loop, which the call blocks. Await its async form (wrap "
            "an `async def` function the same way; a model's ainvoke), run it in a thread "
            "(`await asyncio.to_thread(...)`), make the node a plain `def` (LangGraph runs "
            "those in a worker thread), or compile the graph with a sync saver"
        )

    def _next(self, value: Any, error: BaseException | None) -> Action | Done:
        try:
            return self.gen.throw(error) if error is not None else self.gen.send(value)
        except StopIteration as stop:
            return Done(stop.value[0])

    def to_call(self, value: Any = None, error: BaseException | None = None) -> _Call | Done:
        """Advance synchronously to the call, or to the end."""
        if not self._started:
            self._refuse_on_saver_loop()
            self._started = True
        while True:
            action = self._next(value, error)
            if isinstance(action, (_Call, Done)):
                return action
            value, error = None, None
            try:
                if isinstance(action, _Db):
                    value = self.ctx.journal.run_op(
                        action.make_op, action.write, durable=action.durable
                    )
                elif isinstance(action, _Wait):
                    action.done.wait()
                elif isinstance(action, _Pause):
                    if not action.on_loop and _on_event_loop():
                        raise _CannotWait
                    time.sleep(action.seconds)
                elif isinstance(action, _Reconcile):
                    assert self.spec.reconcile is not None
                    value = _sync_answer(self.spec.reconcile(action.outcome), self.spec)
                else:
                    assert self.ctx.ask is not None
                    value = self.ctx.ask(action.payload)
            except BaseException as exc:  # thrown back into the protocol
                error = exc

    async def ato_call(self, value: Any = None, error: BaseException | None = None) -> _Call | Done:
        """Advance to the call, or to the end, awaiting journal I/O and async callables.

        A cancellation of the task does not cut a claim or the record of its end short:
        whether a claim is held, or a result was stored, must be known (else a call that
        never began, or whose result was in hand, is left with an unknown outcome). Such
        a write is awaited to its end (up to :data:`CANCELLED_WRITE_WAIT` seconds), then
        the cancellation goes on: nothing more is claimed, the claim of a call not begun
        is given up, a result is kept, and ``asyncio.CancelledError`` is raised."""
        while True:
            try:
                action = self._next(value, error)
            except _NotBegun:
                raise asyncio.CancelledError from None
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                if self._cancelled:
                    raise asyncio.CancelledError from exc
                raise
            value, error = None, None
            if self._cancelled and not (isinstance(action, _Db) and action.role == "settle"):
                if isinstance(action, Done):
                    raise asyncio.CancelledError
                # The call (its claim is given up), or anything else but what settles a
                # claim held: a new claim, a look-up, a wait, a question, a reconcile.
                error = _NotBegun() if isinstance(action, _Call) else asyncio.CancelledError()
                continue
            if isinstance(action, (_Call, Done)):
                return action
            try:
                if isinstance(action, _Db):
                    op = self.ctx.journal.arun_op(
                        action.make_op, action.write, durable=action.durable
                    )
                    if action.role is not None:
                        value, cancelled = await _to_its_end(op)
                        self._cancelled = self._cancelled or cancelled
                    else:
                        value = await op
                elif isinstance(action, _Wait):
                    while not action.done.is_set():  # the call may run on this event loop
                        await asyncio.sleep(0.002)
                elif isinstance(action, _Pause):
                    await asyncio.sleep(action.seconds)
                elif isinstance(action, _Reconcile):
                    assert self.spec.reconcile is not None
                    value = self.spec.reconcile(action.outcome)
                    if inspect.isawaitable(value):
                        value = await value
                else:
                    assert self.ctx.ask is not None
                    value = self.ctx.ask(action.payload)
            except BaseException as exc:
                error = exc


# How long a journal write (a claim, or how a claim ended) is still awaited after the
# task awaiting it was cancelled, before the cancellation goes on without knowing its
# outcome (a database lock held elsewhere, a lost connection).
CANCELLED_WRITE_WAIT = 5.0


async def _to_its_end(op: Awaitable[T]) -> tuple[T, bool]:
    """A journal write's result, and whether the task awaiting it was cancelled
    meanwhile: then the write is still awaited, up to :data:`CANCELLED_WRITE_WAIT`
    seconds, and a write that failed or did not end in time raises
    ``asyncio.CancelledError`` (the cancellation goes on)."""
    task = asyncio.ensure_future(op)
    try:
        return await asyncio.shield(task), False
    except asyncio.CancelledError:
        if task.cancelled():  # the write itself was cancelled (its loop closing)
            raise
    task.add_done_callback(_retrieved)  # if given up on: its error is dropped
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CANCELLED_WRITE_WAIT
    while not task.done():
        left = deadline - loop.time()
        if left <= 0:
            raise asyncio.CancelledError
        try:
            await asyncio.wait({task}, timeout=left)
        except asyncio.CancelledError:
            # Cancelled again: LangGraph cancels a failing step's other tasks more than
            # once, so only the deadline ends the wait.
            continue
    try:
        return task.result(), True
    except BaseException as exc:
        raise asyncio.CancelledError from exc


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _sync_answer(value: Any, spec: EffectSpec) -> Any:
    """A sync reconcile's answer; one that must be awaited (a callable object with an
    ``async __call__``, which the decorators cannot tell from a sync function) is
    refused, not recorded as the call's result."""
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if callable(close):
            close()  # never awaited: no "was never awaited" warning
        raise TypeError(
            f"the reconcile of {spec.name!r} returned an awaitable, which a sync call "
            f"cannot await: give it a sync reconcile (or make the call async)"
        )
    return value


def drive_sync(
    gen: Generator[Action, Any, tuple[Any, str]],
    ctx: CallContext,
    spec: EffectSpec,
    call: Callable[[str], Any],
) -> Any:
    """Run a protocol synchronously; ``call(idempotency_key)`` makes the call."""
    run = ProtocolRun(gen, ctx, spec)
    step = run.to_call()
    if isinstance(step, _Call):
        try:
            value = call(step.idempotency_key)
        except BaseException as exc:
            step = run.to_call(error=exc)  # records the failure and re-raises
        else:
            step = run.to_call(value=value)
    assert isinstance(step, Done)
    return step.result


async def drive_async(
    gen: Generator[Action, Any, tuple[Any, str]],
    ctx: CallContext,
    spec: EffectSpec,
    call: Callable[[str], Any],
) -> Any:
    """Run a protocol asynchronously; ``await call(idempotency_key)`` makes the call."""
    run = ProtocolRun(gen, ctx, spec)
    step = await run.ato_call()
    if isinstance(step, _Call):
        try:
            value = await call(step.idempotency_key)
        except BaseException as exc:
            step = await run.ato_call(error=exc)
        else:
            step = await run.ato_call(value=value)
    assert isinstance(step, Done)
    return step.result


# -- the decorators ----------------------------------------------------------------------


def _resolved_annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s annotations, those written as text (``from __future__ import
    annotations``) evaluated in its module, as ``typing.get_type_hints`` would: the
    wrapper is another function, of this module, and LangChain's ``@tool`` reads its
    annotations to make the tool's schema. One that cannot be evaluated yet (a name
    defined later, or only under TYPE_CHECKING) stays text, as it was."""
    annotations = dict(getattr(fn, "__annotations__", None) or {})
    namespace = getattr(inspect.unwrap(fn), "__globals__", {})
    for name, value in annotations.items():
        if isinstance(value, str):
            try:
                annotations[name] = eval(value, namespace)  # as typing does
            except Exception:  # left as text: whoever reads it decides
                continue
    return annotations


def _wrap(fn: F, spec: EffectSpec) -> F:
    sig = inspect.signature(fn)
    wants_key = KEY_PARAM in sig.parameters
    annotations = _resolved_annotations(fn)
    public_sig = sig.replace(
        parameters=[
            p.replace(annotation=annotations.get(n, p.annotation))
            for n, p in sig.parameters.items()
            if n != KEY_PARAM
        ],
        return_annotation=annotations.get("return", sig.return_annotation),
    )

    def recorded_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = public_sig.bind_partial(*args, **kwargs)
        return dict(bound.arguments)

    def with_key(kwargs: dict[str, Any], key: str) -> dict[str, Any]:
        return {**kwargs, KEY_PARAM: key} if wants_key else kwargs

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop(KEY_PARAM, None)
            ctx = resolve_context()
            if ctx is None:
                _warn_unprotected(spec.name)
                return await fn(*args, **with_key(kwargs, f"ac-unprotected-{uuid.uuid4().hex}"))

            async def call(key: str) -> Any:
                token = _current_key.set(key)
                try:
                    return await fn(*args, **with_key(kwargs, key))
                finally:
                    _current_key.reset(token)

            gen = protocol(spec, ctx, recorded_args(args, kwargs))
            return await drive_async(gen, ctx, spec, call)

        wrapper: Callable[..., Any] = async_wrapper
    else:

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop(KEY_PARAM, None)
            ctx = resolve_context()
            if ctx is None:
                _warn_unprotected(spec.name)
                return fn(*args, **with_key(kwargs, f"ac-unprotected-{uuid.uuid4().hex}"))

            def call(key: str) -> Any:
                token = _current_key.set(key)
                try:
                    return fn(*args, **with_key(kwargs, key))
                finally:
                    _current_key.reset(token)

            gen = protocol(spec, ctx, recorded_args(args, kwargs))
            return drive_sync(gen, ctx, spec, call)

        wrapper = sync_wrapper

    # The key is supplied by agentcheck: hide it from signatures (and so from the tool
    # schema LangChain's @tool shows a model).
    wrapper.__signature__ = public_sig  # type: ignore[attr-defined]
    wrapper.__annotations__ = {k: v for k, v in annotations.items() if k != KEY_PARAM}
    del wrapper.__wrapped__  # type: ignore[attr-defined]  # else inspect follows it back
    wrapper.__agentcheck__ = spec  # type: ignore[attr-defined]
    return cast(F, wrapper)


def _decorator(
    fn: F | None,
    effect: Effect,
    on_unknown: OnUnknown,
    reconcile: Callable[[UnknownOutcome], Any] | None,
    name: str | None,
) -> F | Callable[[F], F]:
    if on_unknown not in ("raise", "retry", "ask"):
        raise ValueError(f"on_unknown must be 'raise', 'retry' or 'ask', not {on_unknown!r}")
    if on_unknown == "retry" and effect != "idempotent":
        raise ValueError(
            "on_unknown='retry' re-runs a call whose outcome is unknown; only @idempotent "
            "calls may do that. For a side effect use reconcile= or on_unknown='ask'."
        )

    def decorate(f: F) -> F:
        if (
            reconcile is not None
            and inspect.iscoroutinefunction(reconcile)
            and not inspect.iscoroutinefunction(f)
        ):
            # A sync call's driver cannot await it: the coroutine would be its result.
            raise TypeError(
                f"reconcile={getattr(reconcile, '__name__', reconcile)!r} is async, and "
                f"{getattr(f, '__name__', f)!r} is not: a sync call needs a sync "
                f"reconcile (or make the call async)"
            )
        spec = EffectSpec(
            name=name or str(getattr(f, "__name__", "call")),
            effect=effect,
            on_unknown=on_unknown,
            reconcile=reconcile,
        )
        return _wrap(f, spec)

    return decorate(fn) if fn is not None else decorate


@overload
def side_effect(fn: F) -> F: ...
@overload
def side_effect(
    *,
    on_unknown: OnUnknown = "raise",
    reconcile: Callable[[UnknownOutcome], Any] | None = None,
    name: str | None = None,
) -> Callable[[F], F]: ...
def side_effect(
    fn: F | None = None,
    *,
    on_unknown: OnUnknown = "raise",
    reconcile: Callable[[UnknownOutcome], Any] | None = None,
    name: str | None = None,
) -> F | Callable[[F], F]:
    """Mark a call as having an external effect: never re-run once completed.

    A call that started and never finished (the process died inside it) is not re-run
    blindly. By default it raises :class:`ToolOutcomeUnknown` (fail closed: nothing is
    repeated and nobody has to be online to answer). ``on_unknown="ask"`` asks a human
    through LangGraph's ``interrupt`` instead; ``reconcile=f`` calls ``f(outcome)`` to look
    the effect up (by ``outcome.idempotency_key``): return the call's result if it
    happened, or :data:`NOT_DONE` to run it.

    A parameter named ``idempotency_key`` receives a key that is the same across crashes
    and resumes; it is hidden from the signature (and from an LLM's tool schema).
    """
    return _decorator(fn, "side_effect", on_unknown, reconcile, name)


@overload
def idempotent(fn: F) -> F: ...
@overload
def idempotent(
    *,
    on_unknown: OnUnknown = "retry",
    reconcile: Callable[[UnknownOutcome], Any] | None = None,
    name: str | None = None,
) -> Callable[[F], F]: ...
def idempotent(
    fn: F | None = None,
    *,
    on_unknown: OnUnknown = "retry",
    reconcile: Callable[[UnknownOutcome], Any] | None = None,
    name: str | None = None,
) -> F | Callable[[F], F]:
    """Mark a call as safe to repeat: completed calls still replay their recorded result
    (so a resumed run sees what the first attempt saw), and a call whose outcome is
    unknown is simply run again."""
    return _decorator(fn, "idempotent", on_unknown, reconcile, name)


class _AttemptRegistry:
    """Per-attempt counters keyed by an object's identity (LangGraph's scratchpad of a
    task attempt, which takes no attributes and no weak references).

    An entry holds its object, so that the id cannot be reused while the entry lives,
    and lives as long as anything else holds the object: an attempt still running keeps
    its counters however many others start meanwhile (its next call must not be numbered
    #0 again, which is the key of its first call). Entries of ended attempts are dropped
    when the registry fills; it grows if they are all alive.
    """

    def __init__(self, size: int = 4096) -> None:
        self.min_size = self.size = size
        self.entries: dict[int, tuple[object, dict[str, int]]] = {}
        self.lock = threading.Lock()

    def counters_for(self, owner: object) -> dict[str, int]:
        with self.lock:
            entry = self.entries.get(id(owner))
            if entry is None or entry[0] is not owner:
                if len(self.entries) >= self.size:
                    self._drop_ended()
                entry = (owner, {})
                self.entries[id(owner)] = entry
            return entry[1]

    def _drop_ended(self) -> None:
        # An object referenced only by its entry, by ``held`` and by getrefcount's own
        # argument is one nobody else holds: its attempt has ended.
        for key, (held, _) in list(self.entries.items()):
            if sys.getrefcount(held) <= _ONLY_OURS:
                del self.entries[key]
        self.size = max(self.min_size, 2 * len(self.entries))


_ONLY_OURS = 3
attempt_counters = _AttemptRegistry()
