"""The Journal API (runs, events, the step ledger) on each of the four savers.

Runs and node events come from real LangGraph graphs compiled with the saver; steps are
written through the journal's own operations (``journal.run_op(lambda: journal.ops...)``),
as the effect wrappers write them. Sync savers are driven through the sync API, async
savers through the async one (``ainvoke``, ``aruns``, ``arun_op``...).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import operator
import pickle
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any

import psycopg
import pytest
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, Send, interrupt
from typing_extensions import TypedDict

import agentcheck
from agentcheck import CorruptDataError, effect_scope, side_effect
from agentcheck.journal import Claim, Event, EventSpec, Journal, Step
from agentcheck.savers.base import _FifoLock

from savers_support import KINDS, call, is_async, is_postgres, open_saver, raw_sql

parametrize_kinds = pytest.mark.parametrize("kind", KINDS)


# --------------------------------------------------------------------------- helpers


async def run_op(journal: Journal, kind: str, make_op: Callable[[], Any]) -> Any:
    """Run a journal operation in one transaction, in the kind's style."""
    if is_async(kind):
        return await journal.arun_op(make_op, True)
    return journal.run_op(make_op, True)


# Each checkpoint is written before the next step runs: the journal's view of a run is
# then settled when a node runs and when invoke returns.
SYNC = {"durability": "sync"}


def config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def claim_op(
    journal: Journal, scope: str, key: str, owner: str, *, run_id: str = "r1", args: Any = None
) -> Callable[[], Any]:
    return lambda: journal.ops.claim(
        scope,
        key,
        run_id=run_id,
        kind="tool",
        name="charge",
        effect="side_effect",
        idempotency_key=f"ac-{scope}-{key}",
        args=args,
        owner=owner,
    )


def complete_op(
    journal: Journal, scope: str, key: str, owner: str, result: Any
) -> Callable[[], Any]:
    return lambda: journal.ops.complete(scope, key, owner=owner, result=result, event=None)


def fail_op(journal: Journal, scope: str, key: str, owner: str, error: str) -> Callable[[], Any]:
    return lambda: journal.ops.fail(scope, key, owner=owner, error=error, event=None)


class Log(TypedDict, total=False):
    log: list[str]


def merge_sorted(left: list[str] | None, right: list[str] | None) -> list[str]:
    return sorted([*(left or []), *(right or [])])


class Fanned(TypedDict, total=False):
    items: list[str]
    done: Annotated[list[str], merge_sorted]


def linear_graph(saver: Any, names: tuple[str, ...] = ("fetch", "think", "write")) -> Any:
    """START -> each name -> END; each node returns its name in ``log``."""
    builder = StateGraph(Log)
    previous = START
    for name in names:
        builder.add_node(name, lambda state, name=name: {"log": [*state.get("log", []), name]})
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    return builder.compile(checkpointer=saver)


def one_node_graph(saver: Any, node: Callable[[Log], Log], name: str = "ask") -> Any:
    builder = StateGraph(Log)
    builder.add_node(name, node)
    builder.add_edge(START, name)
    builder.add_edge(name, END)
    return builder.compile(checkpointer=saver)


def failing_graph(saver: Any, fail: list[bool]) -> Any:
    """START -> prepare -> explode -> END; ``explode`` raises while ``fail[0]`` is true."""

    def explode(state: Log) -> Log:
        if fail[0]:
            raise RuntimeError("the warehouse API said no")
        return {"log": [*state.get("log", []), "explode"]}

    builder = StateGraph(Log)
    builder.add_node("prepare", lambda state: {"log": ["prepare"]})
    builder.add_node("explode", explode)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "explode")
    builder.add_edge("explode", END)
    return builder.compile(checkpointer=saver)


async def run_of(saver: Any, kind: str, thread_id: str = "t1") -> tuple[str, int]:
    """The status and attempt of a thread's run."""
    run = await call(saver.journal, "get_run", kind, thread_id)
    return run.status, run.attempt


def ask_approval(state: Log) -> Log:
    """A node that pauses for a human's answer."""
    return {"log": [interrupt("approve?")]}


# The run events of a run that paused once, then was resumed to its end.
PAUSED_THEN_DONE = [
    ("start", None),
    ("interrupt", "interrupted"),
    ("start", None),
    ("end", "succeeded"),
]


def run_events(events: list[Event]) -> list[tuple[str, str | None]]:
    return [(e.phase, e.name) for e in events if e.kind == "run"]


def node_names(events: list[Event], phase: str = "end") -> list[str | None]:
    return [e.name for e in events if e.kind == "node" and e.phase == phase]


# --------------------------------------------------------------------------- runs


@parametrize_kinds
async def test_runs_lists_runs_and_filters_by_status_framework_and_limit(
    kind: str, saver: Any
) -> None:
    journal = saver.journal
    await call(linear_graph(saver), "invoke", kind, {"log": []}, config("ok-thread"))
    with pytest.raises(RuntimeError):
        await call(failing_graph(saver, [True]), "invoke", kind, {}, config("bad-thread"), **SYNC)
    await call(
        journal,
        "start_run",
        kind,
        "custom-1",
        framework="custom",
        name="nightly batch",
        metadata={"team": "ops", "size": 3},
    )

    everything = await call(journal, "runs", kind)
    assert {r.run_id for r in everything} == {"ok-thread", "bad-thread", "custom-1"}
    assert [r.updated_at for r in everything] == sorted(
        (r.updated_at for r in everything), reverse=True
    )
    assert [r.run_id for r in await call(journal, "runs", kind, status="failed")] == ["bad-thread"]
    assert [r.run_id for r in await call(journal, "runs", kind, status="succeeded")] == [
        "ok-thread"
    ]
    langgraph_runs = await call(journal, "runs", kind, framework="langgraph")
    assert {r.run_id for r in langgraph_runs} == {"ok-thread", "bad-thread"}
    (custom,) = await call(journal, "runs", kind, framework="custom")
    assert (custom.run_id, custom.name, custom.status) == ("custom-1", "nightly batch", "running")
    assert custom.metadata == {"team": "ops", "size": 3}
    assert await call(journal, "runs", kind, framework="custom", status="failed") == []
    limited = await call(journal, "runs", kind, limit=2)
    assert limited == everything[:2]


@parametrize_kinds
async def test_get_run_returns_the_run_or_none(kind: str, saver: Any) -> None:
    await call(linear_graph(saver), "invoke", kind, {"log": []}, config("t1"))

    run = await call(saver.journal, "get_run", kind, "t1")
    assert (run.run_id, run.framework, run.thread_id) == ("t1", "langgraph", "t1")
    assert (run.status, run.attempt, run.error) == ("succeeded", 1, None)
    assert run.ended_at is not None and run.created_at <= run.updated_at
    assert await call(saver.journal, "get_run", kind, "no-such-run") is None


@parametrize_kinds
async def test_run_status_goes_running_interrupted_running_succeeded(kind: str, saver: Any) -> None:
    seen_inside: list[tuple[str, int]] = []

    def record(run: Any) -> None:
        seen_inside.append((run.status, run.attempt))

    if is_async(kind):

        async def ask(state: Log) -> Log:
            if not seen_inside:
                record(await saver.journal.aget_run("t1"))
            return {"log": [interrupt("approve?")]}

    else:

        def ask(state: Log) -> Log:  # type: ignore[misc]
            if not seen_inside:
                record(saver.journal.get_run("t1"))
            return {"log": [interrupt("approve?")]}

    graph = one_node_graph(saver, ask)

    await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    assert seen_inside == [("running", 1)]
    paused = await call(saver.journal, "get_run", kind, "t1")
    assert (paused.status, paused.attempt, paused.ended_at) == ("interrupted", 1, None)

    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), **SYNC)
    assert final == {"log": ["yes"]}
    done = await call(saver.journal, "get_run", kind, "t1")
    assert (done.status, done.attempt) == ("succeeded", 2)
    assert done.ended_at is not None
    events = await call(saver.journal, "events", kind, "t1")
    assert run_events(events) == PAUSED_THEN_DONE
    assert ("interrupt", "ask") in [(e.phase, e.name) for e in events if e.kind == "node"]


@parametrize_kinds
async def test_every_resumed_run_ends_succeeded_on_its_second_attempt(
    kind: str, saver: Any
) -> None:
    """The resume value and the next checkpoint are stored concurrently: together they
    restart the run once, and the run ends succeeded."""

    graph = one_node_graph(saver, ask_approval)
    for i in range(60):
        await call(graph, "invoke", kind, {"log": []}, config(f"t{i}"), **SYNC)
        await call(graph, "invoke", kind, Command(resume="yes"), config(f"t{i}"), **SYNC)

    runs = await call(saver.journal, "runs", kind)
    assert sorted((r.status, r.attempt) for r in runs) == [("succeeded", 2)] * 60


@parametrize_kinds
async def test_failing_node_marks_the_run_failed_with_the_error_text(kind: str, saver: Any) -> None:
    fail = [True]
    graph = failing_graph(saver, fail)
    with pytest.raises(RuntimeError, match="warehouse"):
        await call(graph, "invoke", kind, {}, config("t1"), **SYNC)

    run = await call(saver.journal, "get_run", kind, "t1")
    assert run.status == "failed"
    assert run.error is not None and "the warehouse API said no" in run.error
    assert run.ended_at is not None
    events = await call(saver.journal, "events", kind, "t1")
    (node_error,) = [e for e in events if e.kind == "node" and e.phase == "error"]
    assert node_error.name == "explode"
    assert node_error.error is not None and "the warehouse API said no" in node_error.error
    assert run_events(events)[-1] == ("error", "failed")

    # Invoked again once the cause is fixed: the same run goes on, and succeeds.
    fail[0] = False
    await call(graph, "invoke", kind, None, config("t1"), **SYNC)
    again = await call(saver.journal, "get_run", kind, "t1")
    assert (again.status, again.attempt, again.error) == ("succeeded", 2, None)


@parametrize_kinds
async def test_failed_runs_stay_failed_when_checkpoints_are_written_in_the_background(
    kind: str, saver: Any
) -> None:
    """With LangGraph's default durability ("async") an earlier step's checkpoint can be
    written after the failing task's error: that late checkpoint is no restart."""
    graph = failing_graph(saver, [True])
    for i in range(20):
        with pytest.raises(RuntimeError):
            await call(graph, "invoke", kind, {}, config(f"t{i}"))
    runs = await call(saver.journal, "runs", kind)
    assert sorted((r.status, r.attempt) for r in runs) == [("failed", 1)] * 20


class Joined(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def branches_graph(saver: Any, **nodes: Callable[[Any], Any]) -> Any:
    """START -> each node -> END: parallel branches of one step."""
    builder = StateGraph(Joined)
    for name, node in nodes.items():
        builder.add_node(name, node)
        builder.add_edge(START, name)
        builder.add_edge(name, END)
    return builder.compile(checkpointer=saver)


def joined_graph(saver: Any, *, defer: bool = False, skip_q: bool = False) -> Any:
    """START -> p, q; [p, q] -> join -> after -> END (add_edge with a list: a barrier).
    With ``skip_q`` a condition sends START to ``other`` instead of ``q``: the join
    never completes and the graph ends with it half full."""

    def node(name: str) -> Callable[[Joined], Joined]:
        return lambda state: {"log": [name]}

    builder = StateGraph(Joined)
    for name in ("p", "q", "after", "other"):
        builder.add_node(name, node(name))
    builder.add_node("join", node("join"), defer=defer)
    builder.add_edge(START, "p")
    if skip_q:
        builder.add_conditional_edges(START, lambda state: "other", ["q", "other"])
    else:
        builder.add_edge(START, "q")
    builder.add_edge(["p", "q"], "join")
    builder.add_edge("join", "after")
    builder.add_edge("after", END)
    builder.add_edge("other", END)
    return builder.compile(checkpointer=saver)


@parametrize_kinds
@pytest.mark.parametrize("durability", ["sync", "async"])
@pytest.mark.parametrize("defer", [False, True], ids=["join", "deferred-join"])
async def test_a_run_through_a_join_ends_once_after_its_last_node(
    kind: str, saver: Any, durability: str, defer: bool
) -> None:
    """The step after p and q triggers ``join`` through its barrier channel alone (no
    branch:to channel): the run ended there, then started again (attempt 2)."""
    graph = joined_graph(saver, defer=defer)
    result = await call(graph, "invoke", kind, {"log": []}, config("t1"), durability=durability)
    assert sorted(result["log"]) == ["after", "join", "p", "q"]

    assert await run_of(saver, kind) == ("succeeded", 1)
    events = await call(saver.journal, "events", kind, "t1")
    assert run_events(events) == [("start", None), ("end", "succeeded")]
    assert [e.name for e in events][-3:] == ["join", "after", "succeeded"]


@parametrize_kinds
async def test_a_run_ends_with_a_join_whose_other_source_never_ran(kind: str, saver: Any) -> None:
    graph = joined_graph(saver, skip_q=True)
    result = await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    assert sorted(result["log"]) == ["other", "p"]
    assert await run_of(saver, kind) == ("succeeded", 1)


@parametrize_kinds
async def test_each_retry_of_a_failed_run_is_an_attempt_with_its_own_start(
    kind: str, saver: Any
) -> None:
    """invoke(None) runs the failed node again from the same checkpoint, with no new
    checkpoint first: its writes restart the run."""
    fail = [True]
    graph = failing_graph(saver, fail)
    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match="warehouse"):
            await call(graph, "invoke", kind, None if attempt > 1 else {}, config("t1"), **SYNC)
        assert await run_of(saver, kind) == ("failed", attempt)
    fail[0] = False
    await call(graph, "invoke", kind, None, config("t1"), **SYNC)
    run = await call(saver.journal, "get_run", kind, "t1")
    assert (run.status, run.attempt, run.error) == ("succeeded", 3, None)

    events = await call(saver.journal, "events", kind, "t1")
    steps = [(e.kind, e.phase, e.name) for e in events if e.name != "__start__"]
    assert steps == [
        ("run", "start", None),
        ("node", "end", "prepare"),
        ("node", "error", "explode"),
        ("run", "error", "failed"),
        ("run", "start", None),
        ("node", "error", "explode"),
        ("run", "error", "failed"),
        ("run", "start", None),
        ("node", "end", "explode"),
        ("run", "end", "succeeded"),
    ]


@parametrize_kinds
async def test_resuming_parallel_interrupts_one_by_one_counts_each_resume(
    kind: str, saver: Any
) -> None:
    """Two nodes pause in one step; each resume names its interrupt (a map of ids), so
    LangGraph stores the resume value with the task's own writes."""

    def asker(name: str) -> Callable[[Joined], Joined]:
        return lambda state: {"log": [f"{name}={interrupt(name)}"]}

    graph = branches_graph(saver, x=asker("x"), y=asker("y"))

    await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    for attempt, name in ((2, "x"), (3, "y")):
        state = await call(graph, "get_state", kind, config("t1"))
        (pending,) = [i for i in state.interrupts if i.value == name]
        await call(graph, "invoke", kind, Command(resume={pending.id: "ok"}), config("t1"), **SYNC)
        run = await call(saver.journal, "get_run", kind, "t1")
        assert run.attempt == attempt
    assert run.status == "succeeded"
    events = await call(saver.journal, "events", kind, "t1")
    assert run_events(events) == [
        ("start", None),
        ("interrupt", "interrupted"),  # once for the step, though two nodes paused
        ("start", None),
        ("interrupt", "interrupted"),
        ("start", None),
        ("end", "succeeded"),
    ]


async def assert_partly_resumed(saver: Any, kind: str, graph: Any) -> None:
    """Run ``graph`` (branches x and y both pause), then resume x alone by its
    interrupt's id: y pauses again, and the run reads interrupted in its second attempt."""
    await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    state = await call(graph, "get_state", kind, config("t1"))
    (x,) = [i for i in state.interrupts if i.value == "x"]
    await call(graph, "invoke", kind, Command(resume={x.id: "ok"}), config("t1"), **SYNC)
    state = await call(graph, "get_state", kind, config("t1"))
    assert state.next == ("y",)
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert await run_of(saver, kind) == ("interrupted", 2), events


@parametrize_kinds
async def test_a_partial_resume_that_leaves_a_node_paused_reads_interrupted(
    kind: str, saver: Any
) -> None:
    """x and y pause in one step; x alone is resumed (by its interrupt's id), and y,
    run again, pauses again while x finishes: one new attempt, which pauses. (y pausing
    again was taken for a restart, then x's resume for another, and the run read
    "running" while the graph waited.)"""

    def slow_x(state: Joined) -> Joined:
        answer = interrupt("x")
        time.sleep(0.2)  # y pauses again meanwhile
        return {"log": [f"x={answer}"]}

    graph = branches_graph(saver, x=slow_x, y=lambda state: {"log": [f"y={interrupt('y')}"]})

    await assert_partly_resumed(saver, kind, graph)


@parametrize_kinds
@pytest.mark.parametrize("fails", [False, True], ids=["replays", "fails-on-replay"])
async def test_running_again_from_an_earlier_checkpoint_is_a_new_attempt(
    kind: str, saver: Any, fails: bool
) -> None:
    """invoke(None, <an earlier checkpoint>): LangGraph writes a "fork" checkpoint of its
    own and runs on from there. (It was taken for an edit from outside: no new start, and
    a failure was booked on the attempt that had succeeded.)"""
    fail = [False]
    graph = failing_graph(saver, fail)
    await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    history = await collect_history(graph, kind, config("t1"))
    prepared = next(h for h in history if h.next == ("explode",))
    fail[0] = fails
    if fails:
        with pytest.raises(RuntimeError, match="warehouse"):
            await call(graph, "invoke", kind, None, prepared.config, **SYNC)
    else:
        await call(graph, "invoke", kind, None, prepared.config, **SYNC)
    assert await run_of(saver, kind) == ("failed" if fails else "succeeded", 2)
    events = await call(saver.journal, "events", kind, "t1")
    assert run_events(events) == [
        ("start", None),
        ("end", "succeeded"),
        ("start", None),
        ("error", "failed") if fails else ("end", "succeeded"),
    ]
    steps = [(e.kind, e.phase, e.name) for e in events]
    restart = len(steps) - 1 - steps[::-1].index(("run", "start", None))
    assert ("node", "error" if fails else "end", "explode") in steps[restart:]  # the new attempt


async def collect_history(graph: Any, kind: str, cfg: Any) -> list[Any]:
    if is_async(kind):
        return [h async for h in graph.aget_state_history(cfg)]
    return list(graph.get_state_history(cfg))


@parametrize_kinds
async def test_a_copy_made_by_update_state_leaves_the_run_as_it_was(kind: str, saver: Any) -> None:
    """update_state(as_node="__copy__") writes a "fork" checkpoint with no new values:
    an edit from outside, not LangGraph running again from an earlier checkpoint."""

    graph = one_node_graph(saver, ask_approval)
    await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    await call(graph, "update_state", kind, config("t1"), None, as_node="__copy__")
    assert await run_of(saver, kind) == ("interrupted", 1)
    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), **SYNC)
    await call(graph, "update_state", kind, config("t1"), None, as_node="__copy__")
    assert await run_of(saver, kind) == ("succeeded", 2)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])  # an async graph cancels the branch
async def test_a_call_in_a_branch_still_running_after_its_sibling_failed_is_no_restart(
    kind: str, saver: Any
) -> None:
    """The branch that is still running when its sibling has failed the run makes a
    wrapped call: it started the run again (attempt 2, read "running" for good)."""

    @agentcheck.idempotent
    def lookup(x: int) -> int:
        return x * 2

    def boom(state: Log) -> Log:
        raise RuntimeError("boom")

    def slow(state: Log) -> Log:
        time.sleep(0.3)
        return {"log": [str(lookup(1))]}

    graph = branches_graph(saver, boom=boom, slow=slow)
    with pytest.raises(RuntimeError, match="boom"):
        await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    time.sleep(0.5)  # the branch finishes after invoke raised
    assert await run_of(saver, kind) == ("failed", 1)


@parametrize_kinds
async def test_a_resume_sent_to_a_finished_thread_leaves_its_run_as_it_was(
    kind: str, saver: Any
) -> None:
    """A stray Command(resume=...) (an approval submitted twice) runs nothing, also
    after update_state wrote a later checkpoint."""
    graph = one_node_graph(saver, lambda state: {"log": ["done"]})
    await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    await call(graph, "invoke", kind, Command(resume="again"), config("t1"), **SYNC)
    assert await run_of(saver, kind) == ("succeeded", 1)
    await call(graph, "update_state", kind, config("t1"), {"log": ["edited"]})
    await call(graph, "invoke", kind, Command(resume="again"), config("t1"), **SYNC)
    assert await run_of(saver, kind) == ("succeeded", 1)


class Notes(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]


def graph_with_a_side_node(saver: Any) -> Any:
    """START -> ask (pauses for an answer) -> END, and a node ``side`` that only a
    Command's goto runs."""
    builder = StateGraph(Notes)
    builder.add_node("ask", lambda state: {"notes": [interrupt("approve?")]})
    builder.add_node("side", lambda state: {"notes": ["side"]})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    builder.add_edge("side", END)
    return builder.compile(checkpointer=saver)


@parametrize_kinds
@pytest.mark.parametrize("durability", ["sync", "async"])
async def test_a_command_goto_starts_an_attempt_before_the_node_it_runs(
    kind: str, saver: Any, durability: str
) -> None:
    """Command(goto=...) sent to a paused or finished thread is its input: logged as an
    update of ``__input__``, and the run starts again before the node it sends to is
    logged (LangGraph runs that node from the same checkpoint, writing no new one
    first). A Command(update=...) that triggers no node runs nothing: logged, and the
    run is left as it was."""
    graph = graph_with_a_side_node(saver)
    how = {"durability": durability}
    await call(graph, "invoke", kind, {"notes": []}, config("t1"), **how)
    await call(graph, "invoke", kind, Command(goto="side", resume="yes"), config("t1"), **how)
    assert await run_of(saver, kind) == ("succeeded", 2)
    await call(graph, "invoke", kind, Command(goto="side"), config("t1"), **how)
    assert await run_of(saver, kind) == ("succeeded", 3)
    done = await call(graph, "invoke", kind, Command(update={"notes": ["late"]}), config("t1"))
    assert done["notes"] == ["yes", "side", "side", "late"]
    assert await run_of(saver, kind) == ("succeeded", 3)

    events = await call(saver.journal, "events", kind, "t1")
    shown = [(e.kind, e.phase, e.name) for e in events if e.name != "__start__"]
    assert shown[:5] == [
        ("run", "start", None),
        ("node", "interrupt", "ask"),
        ("run", "interrupt", "interrupted"),
        # Resumed, and sent to ``side`` as well: the two run in one step.
        ("run", "start", None),
        ("node", "update", "__input__"),
    ]
    assert sorted(shown[5:7]) == [("node", "end", "ask"), ("node", "end", "side")]
    assert shown[7:] == [
        ("run", "end", "succeeded"),
        # Sent to ``side`` once it had finished.
        ("node", "update", "__input__"),
        ("run", "start", None),
        ("node", "end", "side"),
        ("run", "end", "succeeded"),
        # An update that triggers nothing.
        ("node", "update", "__input__"),
    ]


@parametrize_kinds
async def test_a_resume_sent_through_another_saver_starts_only_what_it_resumes(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """A Command(resume=...) sent through another saver (another process) does not
    know the run's status: sent to a finished thread, it runs nothing and leaves the run
    as it was; sent to a paused one, the task it resumes starts the next attempt."""
    await call(one_node_graph(saver, ask_approval), "invoke", kind, {"log": []}, config("t1"))
    done = one_node_graph(saver, lambda state: {"log": ["done"]})
    await call(done, "invoke", kind, {"log": []}, config("t2"))
    async with open_saver(kind, **db) as other:
        stray = one_node_graph(other, lambda state: {"log": ["done"]})
        await call(stray, "invoke", kind, Command(resume="again"), config("t2"))
        assert await run_of(saver, kind, "t2") == ("succeeded", 1)
        resumed = one_node_graph(other, ask_approval)
        await call(resumed, "invoke", kind, Command(resume="yes"), config("t1"))
        assert await run_of(saver, kind, "t1") == ("succeeded", 2)
    events = await call(saver.journal, "events", kind, "t1")
    assert run_events(events) == PAUSED_THEN_DONE


# ------------------------------------------- Commands: resumes, gotos and updates (review)


def graph_with_a_charging_side_node(saver: Any, kind: str) -> Any:
    """START -> ask (pauses) -> END, and ``side`` (a @side_effect call) that only a
    Command's goto runs."""
    builder = StateGraph(Notes)
    builder.add_node("ask", lambda state: {"notes": [interrupt("approve?")]})
    if is_async(kind):

        @agentcheck.side_effect(name="charge")
        async def acharge(n: int) -> str:
            return f"charged {n}"

        async def aside(state: Notes) -> Notes:
            return {"notes": [await acharge(len(state.get("notes", [])))]}

        builder.add_node("side", aside)
    else:

        @agentcheck.side_effect
        def charge(n: int) -> str:
            return f"charged {n}"

        builder.add_node("side", lambda state: {"notes": [charge(len(state.get("notes", [])))]})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    builder.add_edge("side", END)
    return builder.compile(checkpointer=saver)


def shown(events: list[Any]) -> list[tuple[str, str, str | None]]:
    return [(e.kind, e.phase, e.name) for e in events if e.name != "__start__"]


@parametrize_kinds
@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_a_call_in_the_node_a_goto_runs_follows_the_start_of_its_attempt(
    kind: str, saver: Any, durability: str
) -> None:
    """Command(goto="side") to a finished thread: the @side_effect call made in ``side``
    belongs to the new attempt, so its events follow the attempt's start."""
    graph = graph_with_a_charging_side_node(saver, kind)
    how = {"durability": durability}
    await call(graph, "invoke", kind, {"notes": []}, config("t1"), **how)
    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), **how)
    assert await run_of(saver, kind) == ("succeeded", 2)
    done = await call(graph, "invoke", kind, Command(goto="side"), config("t1"), **how)
    assert done["notes"] == ["yes", "charged 1"]
    assert await run_of(saver, kind) == ("succeeded", 3)
    events = shown(await call(saver.journal, "events", kind, "t1"))
    third = events[events.index(("run", "end", "succeeded")) + 1 :]
    assert third.index(("run", "start", None)) < third.index(("tool", "start", "charge"))


@parametrize_kinds
@pytest.mark.parametrize("how", ["delete_thread", "prune"])
async def test_deleting_a_thread_deletes_its_journal(kind: str, saver: Any, how: str) -> None:
    """delete_thread (and prune with strategy="delete") removed the checkpoints and left
    the thread's runs, events and ledger steps, tool arguments and results included; a
    new conversation under the same id went on as the old run's next attempt. Now the
    journal of the thread goes too, another thread's stays, and the id starts afresh."""
    graph = graph_with_a_charging_side_node(saver, kind)
    for thread in ("t1", "t2"):
        await call(graph, "invoke", kind, {"notes": []}, config(thread), **SYNC)
        await call(graph, "invoke", kind, Command(resume="yes"), config(thread), **SYNC)
        await call(graph, "invoke", kind, Command(goto="side"), config(thread), **SYNC)
    journal = saver.journal
    for thread in ("t1", "t2"):
        assert await run_of(saver, kind, thread) == ("succeeded", 3)
        assert [s.name for s in await call(journal, "steps", kind, scope=thread)] == ["charge"]
    if how == "prune":
        await call(saver, "prune", kind, ["t1"], strategy="delete")
    else:
        await call(saver, "delete_thread", kind, "t1")
    assert await call(journal, "get_run", kind, "t1") is None
    assert await call(journal, "events", kind, "t1") == []
    assert await call(journal, "steps", kind, scope="t1") == []
    assert await call(journal, "steps", kind, run_id="t1") == []
    assert await run_of(saver, kind, "t2") == ("succeeded", 3)
    assert [s.name for s in await call(journal, "steps", kind, scope="t2")] == ["charge"]
    assert ("tool", "end", "charge") in shown(await call(journal, "events", kind, "t2"))
    await call(graph, "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    assert await run_of(saver, kind, "t1") == ("interrupted", 1)
    assert shown(await call(journal, "events", kind, "t1"))[0] == ("run", "start", None)
    assert ("tool", "end", "charge") not in shown(await call(journal, "events", kind, "t1"))


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("first", ["scope", "thread"])
@pytest.mark.parametrize("tool", ["charge", "stripe|charge"])
async def test_deleting_a_thread_keeps_an_effect_scope_ledger_of_the_same_id(
    kind: str, saver: Any, first: str, tool: str
) -> None:
    """An order id used as a LangGraph thread id and as an effect_scope (a fulfilment
    job's): delete_thread deleted the scope's ledger with the thread's, and the job, run
    again after a crash, charged the card a second time (also, later, when the tool's
    name held a "|"). The scope's completed call is kept, and replayed; the graph's
    journal goes."""
    charges: list[int] = []

    @agentcheck.side_effect(name=tool)
    def charge(amount: int) -> int:
        charges.append(amount)
        return amount

    def job() -> None:
        with agentcheck.effect_scope(saver.journal, "order-42"):
            charge(10)

    graph = graph_with_a_charging_side_node(saver, kind)

    def conversation() -> None:
        graph.invoke({"notes": []}, config("order-42"), **SYNC)
        graph.invoke(Command(resume="yes"), config("order-42"), **SYNC)
        graph.invoke(Command(goto="side"), config("order-42"), **SYNC)

    for part in (job, conversation) if first == "scope" else (conversation, job):
        part()
    keys = {s.step_key for s in saver.journal.steps(scope="order-42")}
    scopes = f"|tool:{tool}#0"  # the scope's step; the graph's is keyed by its node's task
    assert scopes in keys and [k.startswith("side:") for k in keys - {scopes}] == [True]
    assert charges == [10]  # the job's (the graph's node has a charge of its own)
    saver.delete_thread("order-42")
    kept = saver.journal.steps(scope="order-42")
    assert [(s.step_key, s.status) for s in kept] == [(scopes, "completed")]
    job()  # run again: replayed, not charged
    assert charges == [10]
    assert saver.get_tuple(config("order-42")) is None


def test_postgres_deleting_a_thread_during_a_put_deletes_what_the_put_logged(
    pg_url: str,
) -> None:
    """A put that ends the run, under way in a transaction of the caller's, and a
    delete_thread from another saver: the deletion deleted the events before it waited
    for the run's row, with a snapshot taken before the put committed, and the put's
    events outlived the thread. It now locks the run's rows first."""
    from agentcheck.savers import PostgresSaver

    with (
        psycopg.connect(pg_url, autocommit=True) as conn,
        PostgresSaver.from_conn_string(pg_url) as deleter,
    ):
        writer = PostgresSaver(conn)
        writer.setup()
        graph = one_node_graph(writer, lambda state: {"log": ["done"]})
        graph.invoke({"log": []}, config("t1"), **SYNC)
        assert writer.journal.events("t1") != []
        with conn.transaction():
            graph.invoke({"log": []}, config("t1"), **SYNC)  # starts and ends an attempt
            deleting = threading.Thread(target=deleter.delete_thread, args=("t1",))
            deleting.start()
            time.sleep(0.5)
            assert deleting.is_alive()  # it waits for the run's row
        deleting.join(30)
        assert not deleting.is_alive()
        assert deleter.journal.get_run("t1") is None
        assert deleter.journal.events("t1") == []
        assert deleter.get_tuple(config("t1")) is None


@parametrize_kinds
async def test_a_resume_sent_through_another_saver_reads_running_while_the_node_runs(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """The approval of a paused thread arrives in another process (an API worker, or
    after a restart): while the resumed node runs, once the resume is stored (LangGraph
    stores it beside the node, in the background), its run is running, in its second
    attempt (a crash there must leave it running, for the recovery workers)."""
    seen: list[tuple[str, int]] = []
    await call(one_node_graph(saver, watching_node(saver.journal, kind, seen)), "invoke", kind,
               {"log": []}, config("t1"))  # fmt: skip
    async with open_saver(kind, **db) as other:
        resumed = one_node_graph(other, watching_node(other.journal, kind, seen))
        await call(resumed, "invoke", kind, Command(resume="yes"), config("t1"))
    assert seen == [("running", 2)]
    assert await run_of(saver, kind) == ("succeeded", 2)


def subgraph(*names: str, pause: bool = False) -> Any:
    """START -> each name -> END (the first pauses for an answer if ``pause``)."""
    builder = StateGraph(Notes)
    previous = START
    for i, name in enumerate(names):
        if pause and i == 0:
            builder.add_node(name, lambda state: {"notes": [interrupt("approve?")]})
        else:
            builder.add_node(name, lambda state, name=name: {"notes": [name]})
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    return builder.compile()


def graph_with_subgraphs(saver: Any) -> Any:
    """START -> outer (a subgraph: inner_ask pauses, then inner_after) -> END, and
    ``side`` (a subgraph: inner_side) that only a Command's goto runs."""
    builder = StateGraph(Notes)
    builder.add_node("outer", subgraph("inner_ask", "inner_after", pause=True))
    builder.add_node("side", subgraph("inner_side"))
    builder.add_edge(START, "outer")
    builder.add_edge("outer", END)
    builder.add_edge("side", END)
    return builder.compile(checkpointer=saver)


def after_last_stop(events: list[Any]) -> list[tuple[str, str, str | None]]:
    steps = shown(events)
    stops = [i for i, s in enumerate(steps) if s[0] == "run" and s[1] in ("end", "interrupt")]
    return steps[stops[-2] + 1 :]


async def assert_started_before(saver: Any, kind: str, event: tuple[str, str, str]) -> None:
    """In thread t1's last attempt, the run's start comes before ``event``."""
    steps = after_last_stop(await call(saver.journal, "events", kind, "t1"))
    assert steps.index(("run", "start", None)) < steps.index(event), steps


@parametrize_kinds
async def test_a_resume_sent_through_another_saver_starts_before_the_subgraph_it_resumes(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """A thread paused inside a subgraph, resumed through another saver: the run's
    start comes before the events of the subgraph's nodes that run on."""
    await call(graph_with_subgraphs(saver), "invoke", kind, {"notes": []}, config("t1"))
    async with open_saver(kind, **db) as other:
        resumed = graph_with_subgraphs(other)
        await call(resumed, "invoke", kind, Command(resume="yes"), config("t1"), durability="sync")
    assert await run_of(saver, kind) == ("succeeded", 2)
    await assert_started_before(saver, kind, ("task", "end", "inner_ask"))


@parametrize_kinds
@pytest.mark.parametrize("through", ["this saver", "another saver"])
async def test_a_command_goto_to_a_subgraph_starts_before_its_nodes(
    kind: str, saver: Any, db: dict[str, str], through: str
) -> None:
    """Command(goto="side") to a finished thread, ``side`` a subgraph: the new attempt
    starts before the events of the subgraph's nodes. Also when the Command is sent
    through a saver that does not know the run's status (another API worker, a restarted
    process)."""
    graph = graph_with_subgraphs(saver)
    await call(graph, "invoke", kind, {"notes": []}, config("t1"), durability="sync")
    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), durability="sync")
    goto = Command(goto="side")
    if through == "this saver":
        await call(graph, "invoke", kind, goto, config("t1"), durability="sync")
    else:
        async with open_saver(kind, **db) as other:
            there = graph_with_subgraphs(other)
            await call(there, "invoke", kind, goto, config("t1"), durability="sync")
    assert await run_of(saver, kind) == ("succeeded", 3)
    await assert_started_before(saver, kind, ("task", "end", "inner_side"))


@parametrize_kinds
async def test_a_resume_sent_after_update_state_finished_the_paused_node_starts_nothing(
    kind: str, saver: Any
) -> None:
    """update_state(as_node="ask") answers for the paused node: nothing is paused any
    more. A resume sent after it (an approval submitted late) runs nothing, and the run
    is left as it was (not restarted, never to end)."""
    graph = one_node_graph(saver, lambda state: {"log": [interrupt("approve?")]})
    await call(graph, "invoke", kind, {"log": []}, config("t1"), durability="sync")
    await call(graph, "update_state", kind, config("t1"), {"log": ["by hand"]}, as_node="ask")
    await call(graph, "invoke", kind, Command(resume="late"), config("t1"), durability="sync")
    assert (await call(graph, "get_state", kind, config("t1"))).next == ()
    assert await run_of(saver, kind) == ("interrupted", 1)


@parametrize_kinds
async def test_a_resume_after_an_update_is_no_second_update(kind: str, saver: Any) -> None:
    """Command(update=...) then Command(resume=...) at the same checkpoint: one update of
    ``__input__`` (LangGraph saves the null task's earlier writes again with the resume)."""
    graph = one_node_graph(saver, lambda state: {"log": ["done"]})
    await call(graph, "invoke", kind, {"log": []}, config("t1"), durability="sync")
    await call(graph, "invoke", kind, Command(update={"log": ["late"]}), config("t1"))
    await call(graph, "invoke", kind, Command(resume="again"), config("t1"))
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert events.count(("node", "update", "__input__")) == 1, events


@parametrize_kinds
async def test_a_command_that_opens_a_thread_starts_the_run_before_its_nodes(
    kind: str, saver: Any
) -> None:
    """Command(update=..., goto=...) as the first input of a new thread: logged as an
    update of ``__input__``, then the run starts before the node it sends to."""
    graph = one_node_graph(saver, lambda state: {"log": ["done"]})
    await call(graph, "invoke", kind, Command(update={"log": ["x"]}, goto="ask"), config("t1"),
               durability="sync")  # fmt: skip
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert events[:3] == [
        ("node", "update", "__input__"),
        ("run", "start", None),
        ("node", "end", "ask"),
    ], events
    assert await run_of(saver, kind) == ("succeeded", 1)


@parametrize_kinds
async def test_a_stray_resume_after_another_process_finished_the_thread_starts_nothing(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """Paused through ``saver``, resumed to its end through another saver (another API
    worker); the approval submitted twice reaches the first: nothing is paused, nothing
    runs, and the run stays succeeded (``saver`` still remembers it interrupted)."""
    graph = one_node_graph(saver, lambda state: {"log": [interrupt("approve?")]})
    await call(graph, "invoke", kind, {"log": []}, config("t1"), durability="sync")
    async with open_saver(kind, **db) as other:
        resumed = one_node_graph(other, lambda state: {"log": [interrupt("approve?")]})
        await call(resumed, "invoke", kind, Command(resume="yes"), config("t1"), durability="sync")
    assert await run_of(saver, kind) == ("succeeded", 2)
    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), durability="sync")
    assert await run_of(saver, kind) == ("succeeded", 2)


def run_once_running(journal: Any) -> tuple[str, int]:
    """Thread t1's run as (status, attempt), once it reads running, or after 5 s: a
    resume may be stored in the background, beside the node it resumes."""
    for _ in range(500):
        run = journal.get_run("t1")
        if run.status == "running":
            break
        time.sleep(0.01)
    return run.status, run.attempt


async def arun_once_running(journal: Any) -> tuple[str, int]:
    """The async twin of run_once_running."""
    for _ in range(500):
        run = await journal.aget_run("t1")
        if run.status == "running":
            break
        await asyncio.sleep(0.01)
    return run.status, run.attempt


def watching_node(journal: Any, kind: str, seen: list[tuple[str, int]]) -> Any:
    """A node that pauses for an answer, then records the run's (status, attempt) as it
    runs on (run_once_running)."""
    if is_async(kind):

        async def aask(state: Any) -> Any:
            answer = interrupt("approve?")
            seen.append(await arun_once_running(journal))
            return {"log": [answer]}

        return aask

    def ask(state: Any) -> Any:
        answer = interrupt("approve?")
        seen.append(run_once_running(journal))
        return {"log": [answer]}

    return ask


@parametrize_kinds
async def test_a_goto_to_end_leaves_a_finished_run_as_it_was(kind: str, saver: Any) -> None:
    """Command(goto=END) sent to a finished thread runs nothing (LangGraph ignores the
    write to branch:to:__end__ and writes no checkpoint): the run must not be started
    again, to read running for good."""
    graph = one_node_graph(saver, lambda state: {"log": ["done"]})
    await call(graph, "invoke", kind, {"log": []}, config("t1"), durability="sync")
    await call(graph, "invoke", kind, Command(goto=END), config("t1"), durability="sync")
    assert await run_of(saver, kind) == ("succeeded", 1)


async def assert_resumed_after_an_edit(
    saver: Any, kind: str, graph: Any, seen: list[tuple[str, int]], node: str, values: Any
) -> None:
    """Thread t1 paused at ``node`` (a watching one, recording into ``seen``):
    update_state writes ``values`` (None: a copy of the checkpoint, as_node="__copy__"),
    leaving ``node`` pending; a resume then runs it on. While it runs, the run reads
    running in its second attempt, which ends well."""
    if values is None:
        await call(graph, "update_state", kind, config("t1"), None, as_node="__copy__")
    else:
        await call(graph, "update_state", kind, config("t1"), values)
    assert (await call(graph, "get_state", kind, config("t1"))).next == (node,)
    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), durability="sync")
    assert seen == [("running", 2)]
    assert await run_of(saver, kind) == ("succeeded", 2)


@parametrize_kinds
@pytest.mark.parametrize("edit", ["values", "copy"])
async def test_a_resume_after_an_edit_that_left_the_node_paused_reads_running(
    kind: str, saver: Any, edit: str
) -> None:
    """Paused; update_state edits the state (or copies the checkpoint) but leaves the
    paused node pending; Command(resume=...) then resumes it (LangGraph runs it again from
    the edit's checkpoint). While the resumed node runs, its run must read running
    (a crash there must leave it running, for the recovery workers)."""
    seen: list[tuple[str, int]] = []
    graph = one_node_graph(saver, watching_node(saver.journal, kind, seen))
    await call(graph, "invoke", kind, {"log": []}, config("t1"), durability="sync")
    edited = {"log": ["edited"]} if edit == "values" else None
    await assert_resumed_after_an_edit(saver, kind, graph, seen, "ask", edited)


@parametrize_kinds
async def test_a_resume_through_a_saver_whose_status_is_stale_reads_running(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """``saver`` paused the thread (it remembers it interrupted); another API worker
    resumed it to its end and then paused it again on new input. A resume reaching
    ``saver`` now resumes the paused node at a checkpoint later than the one ``saver``
    remembers: the run must read running while the node runs."""
    seen: list[tuple[str, int]] = []
    graph = one_node_graph(saver, watching_node(saver.journal, kind, seen))
    await call(graph, "invoke", kind, {"log": []}, config("t1"), durability="sync")
    async with open_saver(kind, **db) as other:
        there = one_node_graph(other, watching_node(other.journal, kind, []))
        await call(there, "invoke", kind, Command(resume="yes"), config("t1"), durability="sync")
        await call(there, "invoke", kind, {"log": []}, config("t1"), durability="sync")
    assert await run_of(saver, kind) == ("interrupted", 3)
    await call(graph, "invoke", kind, Command(resume="again"), config("t1"), durability="sync")
    assert seen == [("running", 4)]
    assert await run_of(saver, kind) == ("succeeded", 4)


def paused_again_by_late_resume(saver: Any, graph: Any, command: Any, cfg: Any) -> None:
    """Send ``command`` with durability="async", the saver storing its writes of no task
    once the run has paused again (at "two?")."""
    stored_when = delay_writes_of_no_task(saver)
    out = graph.invoke(command, cfg, durability="async")  # returns once all are stored
    assert [i.value for i in out["__interrupt__"]] == ["two?"]
    assert stored_when == ["interrupted"]  # the writes did come late


def delay_writes_of_no_task(saver: Any, until: str = "interrupted") -> list[str | None]:
    """From now on, the saver stores writes of no task (a Command's, a resume's) late, as
    LangGraph's background writes may reach it after the tasks they ran: once thread
    t1's run reads ``until`` in a later attempt than now (the tasks started it, then
    paused or ended it), waiting up to 5 s. Returns the run's status as each was stored,
    ``until`` or what it read at the deadline, for the test to check they came late."""
    put_writes = saver.put_writes
    journal = saver.journal

    def now() -> tuple[str | None, int]:
        run = journal.get_run("t1")
        return (None, 0) if run is None else (str(run.status), int(run.attempt))

    before = now()[1]
    stored_when: list[str | None] = []

    def late_put_writes(config: Any, writes: Any, task_id: str, task_path: str = "") -> Any:
        if task_id == "00000000-0000-0000-0000-000000000000":  # LangGraph's NULL_TASK_ID
            for _ in range(500):
                status, attempt = now()
                if status == until and attempt > before:
                    break
                time.sleep(0.01)
            stored_when.append(status if attempt > before else None)
        return put_writes(config, writes, task_id, task_path)

    saver.put_writes = late_put_writes
    return stored_when


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_goto_stored_after_the_node_it_ran_paused_is_no_restart(
    kind: str, saver: Any
) -> None:
    """durability="async": LangGraph stores the Command's writes in the background,
    beside the node they run. If they reach the saver after that node paused the run
    (simulated: the saver's put_writes of the null task waits for the pause), the late
    goto starts nothing: the run stays paused in its second attempt (not running for
    good, in a third)."""
    stored_when = delay_writes_of_no_task(saver)
    builder = StateGraph(Notes)
    builder.add_node("ask", lambda state: {"notes": ["ask"]})
    builder.add_node("side", lambda state: {"notes": [interrupt("side?")]})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    builder.add_edge("side", END)
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"notes": []}, config("t1"), durability="sync")
    graph.invoke(Command(goto="side"), config("t1"), durability="async")
    assert stored_when == ["interrupted"]  # the goto's writes did come late
    assert run_of_sync(saver) == ("interrupted", 2)


def run_of_sync(saver: Any) -> tuple[str, int]:
    run = saver.journal.get_run("t1")
    return run.status, run.attempt


# ------------------------------------------------ resumes and gotos, a third review


@parametrize_kinds
async def test_a_resume_after_a_copy_of_a_paused_entrypoint_reads_running(
    kind: str, saver: Any
) -> None:
    """Functional API: the entrypoint pauses; update_state(as_node="__copy__") copies the
    checkpoint, which leaves the entrypoint pending (through ``__start__``, not a
    ``branch:to:`` channel); Command(resume=...) resumes it from the copy. While it runs,
    its run must read running (as for a StateGraph, test_a_resume_after_an_edit_...)."""
    seen: list[tuple[str, int]] = []
    journal = saver.journal
    if is_async(kind):

        @entrypoint(checkpointer=saver)
        async def workflow(x: int) -> int:
            answer = interrupt("approve?")
            seen.append(await arun_once_running(journal))
            return x + len(answer)

    else:

        @entrypoint(checkpointer=saver)
        def workflow(x: int) -> int:
            answer = interrupt("approve?")
            seen.append(run_once_running(journal))
            return x + len(answer)

    await call(workflow, "invoke", kind, 1, config("t1"), durability="sync")
    await assert_resumed_after_an_edit(saver, kind, workflow, seen, "workflow", None)


@parametrize_kinds
async def test_a_late_resume_after_a_restarted_saver_answered_the_paused_node_starts_nothing(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """As test_a_resume_sent_after_update_state_finished_the_paused_node_starts_nothing,
    but the process restarted after the pause: the new saver wrote the edit itself, so
    it knows nothing is left to run from it, and the late resume restarts nothing (the
    run would read running for good)."""
    graph = one_node_graph(saver, lambda state: {"log": [interrupt("approve?")]})
    await call(graph, "invoke", kind, {"log": []}, config("t1"), durability="sync")
    async with open_saver(kind, **db) as restarted:
        again = one_node_graph(restarted, lambda state: {"log": [interrupt("approve?")]})
        await call(again, "update_state", kind, config("t1"), {"log": ["by hand"]}, as_node="ask")
        await call(again, "invoke", kind, Command(resume="late"), config("t1"), durability="sync")
        assert (await call(again, "get_state", kind, config("t1"))).next == ()
    assert await run_of(saver, kind) == ("interrupted", 1)


async def assert_resumed_by_interrupt_id(saver: Any, kind: str, graph: Any) -> None:
    """Run ``graph`` (paused inside its subgraph's ``inner_ask``) and resume it by the
    interrupt's id: the second attempt starts before the subgraph's events and ends."""
    out = await call(graph, "invoke", kind, {"notes": []}, config("t1"), durability="sync")
    (pending,) = out["__interrupt__"]
    await call(graph, "invoke", kind, Command(resume={pending.id: "yes"}), config("t1"),
               durability="sync")  # fmt: skip
    assert await run_of(saver, kind) == ("succeeded", 2)
    await assert_started_before(saver, kind, ("task", "end", "inner_ask"))


@parametrize_kinds
async def test_a_resume_by_interrupt_id_starts_before_the_subgraph_it_resumes(
    kind: str, saver: Any
) -> None:
    """A thread paused inside a subgraph, resumed by interrupt id: the run's start comes
    before the events of the subgraph's nodes that run on."""
    graph = graph_with_subgraphs(saver)
    await assert_resumed_by_interrupt_id(saver, kind, graph)


@task
def risky(x: int) -> int:
    """A functional-API task that always fails (its callers catch it, or not)."""
    raise RuntimeError("risky failed")


@parametrize_kinds
async def test_a_task_error_its_entrypoint_catches_does_not_fail_the_run(
    kind: str, saver: Any
) -> None:
    """Functional API: a @task's error, caught by the entrypoint that called it."""

    @task
    def fine(x: int) -> int:
        return x + 1

    @entrypoint(checkpointer=saver)
    def workflow(x: int) -> int:
        try:
            risky(x).result()
        except RuntimeError:
            pass
        return fine(x).result()

    if is_async(kind):
        assert await workflow.ainvoke(1, config("t1"), **SYNC) == 2
    else:
        assert workflow.invoke(1, config("t1"), **SYNC) == 2
    assert await run_of(saver, kind) == ("succeeded", 1)
    events = await call(saver.journal, "events", kind, "t1")
    assert run_events(events) == [("start", None), ("end", "succeeded")]
    assert ("error", "risky") in [(e.phase, e.name) for e in events if e.kind == "node"]


@parametrize_kinds
async def test_retrying_a_workflow_whose_task_failed_starts_before_the_task_runs(
    kind: str, saver: Any
) -> None:
    """Functional API: a @task raises and its entrypoint does not catch it; invoke(None)
    runs the task again, and the new attempt starts before the task's events."""
    fail = [True]

    @task
    def flaky(x: int) -> int:
        if fail[0]:
            raise ValueError("flaky")
        return x * 10

    @entrypoint(checkpointer=saver)
    def workflow(x: int) -> int:
        return flaky(x).result()

    async def run(value: Any) -> Any:
        if is_async(kind):
            return await workflow.ainvoke(value, config("t1"), **SYNC)
        return workflow.invoke(value, config("t1"), **SYNC)

    with pytest.raises(ValueError, match="flaky"):
        await run(1)
    fail[0] = False
    assert await run(None) == 10
    assert await run_of(saver, kind) == ("succeeded", 2)
    steps = [(e.kind, e.phase, e.name) for e in await call(saver.journal, "events", kind, "t1")]
    restart = len(steps) - 1 - steps[::-1].index(("run", "start", None))
    assert ("node", "end", "flaky") in steps[restart:]


@parametrize_kinds
async def test_a_task_error_caught_by_a_node_reached_through_send_does_not_fail_the_run(
    kind: str, saver: Any
) -> None:
    def work(arg: dict[str, Any]) -> Joined:
        try:
            risky(1).result()
        except RuntimeError:
            return {"log": ["caught"]}
        return {"log": ["not caught"]}

    builder = StateGraph(Joined)
    builder.add_node("plan", lambda state: {"log": []})
    builder.add_node("work", work)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", lambda state: [Send("work", {})], ["work"])
    builder.add_edge("work", END)
    graph = builder.compile(checkpointer=saver)
    result = await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    assert result["log"] == ["caught"]
    assert await run_of(saver, kind) == ("succeeded", 1)


@parametrize_kinds
async def test_update_state_leaves_the_run_as_it_was(kind: str, saver: Any) -> None:
    graph = one_node_graph(saver, ask_approval)
    await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    await call(graph, "update_state", kind, config("t1"), {"log": ["edited"]})
    assert await run_of(saver, kind) == ("interrupted", 1)

    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), **SYNC)
    await call(graph, "update_state", kind, config("t1"), {"log": ["after the end"]})
    done = await call(saver.journal, "get_run", kind, "t1")
    assert (done.status, done.attempt) == ("succeeded", 2)
    assert done.ended_at is not None

    events = await call(saver.journal, "events", kind, "t1")
    assert run_events(events) == PAUSED_THEN_DONE
    node_events = [(e.phase, e.name) for e in events if e.kind == "node"]
    assert ("update", None) in node_events  # recorded, not taken for a node that ran


@parametrize_kinds
async def test_run_succeeds_after_a_graph_that_fanned_out_with_send(kind: str, saver: Any) -> None:
    """``Send`` leaves an empty ``__pregel_tasks`` list in later checkpoints (as the
    default ``create_react_agent`` does): a finished graph must still end its run."""

    builder = StateGraph(Fanned)
    builder.add_node("plan", lambda state: {"items": ["a", "b"]})
    builder.add_node("work", lambda arg: {"done": [arg["item"]]})
    builder.add_edge(START, "plan")
    builder.add_conditional_edges(
        "plan", lambda state: [Send("work", {"item": i}) for i in state["items"]], ["work"]
    )
    builder.add_edge("work", END)
    graph = builder.compile(checkpointer=saver)

    final = await call(graph, "invoke", kind, {"items": []}, config("t1"))
    assert final["done"] == ["a", "b"]
    state = await call(graph, "get_state", kind, config("t1"))
    assert state.next == ()
    run = await call(saver.journal, "get_run", kind, "t1")
    assert run.status == "succeeded"


# ---------------------------- late writes of a Command, own checkpointers (a fourth review)


def failing_subgraph_with_a_slow_branch() -> Any:
    """START -> inner_boom (raises) and inner_slow (sleeps 0.3 s) in parallel -> END."""

    def inner_boom(state: Notes) -> Notes:
        raise RuntimeError("boom")

    def inner_slow(state: Notes) -> Notes:
        time.sleep(0.3)
        return {"notes": ["slow"]}

    builder = StateGraph(Notes)
    builder.add_node("inner_boom", inner_boom)
    builder.add_node("inner_slow", inner_slow)
    builder.add_edge(START, "inner_boom")
    builder.add_edge(START, "inner_slow")
    builder.add_edge("inner_boom", END)
    builder.add_edge("inner_slow", END)
    return builder.compile()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])  # an async graph cancels the branch
async def test_a_late_write_of_a_failed_subgraph_does_not_restart_the_run(
    kind: str, saver: Any
) -> None:
    """outer is a subgraph whose inner_boom fails while inner_slow still runs: inner_slow's
    write (ns "outer:<outer's task id>") comes while the run still runs (LangGraph waits
    for the subgraph's branches before it stores outer's error), then outer's error
    fails the run. One failed attempt (a guard: it passed before this change too)."""
    builder = StateGraph(Notes)
    builder.add_node("outer", failing_subgraph_with_a_slow_branch())
    builder.add_edge(START, "outer")
    builder.add_edge("outer", END)
    graph = builder.compile(checkpointer=saver)
    with pytest.raises(RuntimeError, match="boom"):
        graph.invoke({"notes": []}, config("t1"), durability="sync")
    events = shown(saver.journal.events("t1"))
    assert events.index(("task", "end", "inner_slow")) < events.index(("node", "error", "outer"))
    assert run_of_sync(saver) == ("failed", 1), events


def pausing_subgraph(name: str, delay: float = 0.0) -> Any:
    """START -> inner_<name> (pauses for an answer, then waits ``delay`` s) -> END."""

    def inner(state: Joined) -> Joined:
        answer = interrupt(name)
        time.sleep(delay)
        return {"log": [f"{name}={answer}"]}

    builder = StateGraph(Joined)
    builder.add_node(f"inner_{name}", inner)
    builder.add_edge(START, f"inner_{name}")
    builder.add_edge(f"inner_{name}", END)
    return builder.compile()


@parametrize_kinds
async def test_a_partial_resume_of_parallel_subgraphs_reads_interrupted(
    kind: str, saver: Any
) -> None:
    """As test_a_partial_resume_that_leaves_a_node_paused_reads_interrupted, the two
    paused nodes being subgraphs: x alone is resumed by its interrupt's id; y, run again,
    pauses again while x finishes. One new attempt, which pauses."""
    graph = branches_graph(saver, x=pausing_subgraph("x", 0.2), y=pausing_subgraph("y"))
    await assert_partly_resumed(saver, kind, graph)


@parametrize_kinds
async def test_a_resume_by_interrupt_id_starts_before_a_subgraph_with_its_own_checkpointer(
    kind: str, saver: Any
) -> None:
    """As test_a_resume_by_interrupt_id_starts_before_the_subgraph_it_resumes, ``outer``
    compiled with checkpointer=True: LangGraph stores its writes under "outer" (the
    task id removed), so the namespace names no root task."""
    inner = StateGraph(Notes)
    inner.add_node("inner_ask", lambda state: {"notes": [interrupt("approve?")]})
    inner.add_node("inner_after", lambda state: {"notes": ["after"]})
    inner.add_edge(START, "inner_ask")
    inner.add_edge("inner_ask", "inner_after")
    inner.add_edge("inner_after", END)
    builder = StateGraph(Notes)
    builder.add_node("outer", inner.compile(checkpointer=True))
    builder.add_edge(START, "outer")
    builder.add_edge("outer", END)
    graph = builder.compile(checkpointer=saver)
    await assert_resumed_by_interrupt_id(saver, kind, graph)


def run_with_late_writes(
    saver: Any, graph: Any, command: Command[Any]
) -> tuple[tuple[str, int], list[tuple[str, str, str | None]]]:
    """Thread t1's run, as (status, attempt), and its events, after a first invoke and
    then ``command`` with durability="async", whose writes of no task reach the saver
    once the run has paused again."""
    graph.invoke({"notes": []}, config("t1"), durability="sync")
    stored_when = delay_writes_of_no_task(saver)
    graph.invoke(command, config("t1"), durability="async")  # returns once all are stored
    assert stored_when == ["interrupted"]  # the writes did come late
    return run_of_sync(saver), shown(saver.journal.events("t1"))


def asking(question: str) -> Callable[[Notes], Notes]:
    """A node that pauses with ``question``, then notes the answer."""
    return lambda state: {"notes": [interrupt(question)]}


def asking_twice_in_a_subgraph(
    saver: Any, inner_two: Any | None, checkpointer: bool | None = None
) -> Any:
    """START -> outer -> END, outer a subgraph (compiled with ``checkpointer``):
    inner_one (pauses) -> ``inner_two`` (if any)."""
    inner = StateGraph(Notes)
    inner.add_node("inner_one", lambda state: {"notes": [interrupt("one?")]})
    inner.add_edge(START, "inner_one")
    if inner_two is None:
        inner.add_edge("inner_one", END)
    else:
        inner.add_node("inner_two", inner_two)
        inner.add_edge("inner_one", "inner_two")
        inner.add_edge("inner_two", END)
    builder = StateGraph(Notes)
    builder.add_node("outer", inner.compile(checkpointer=checkpointer))
    builder.add_edge(START, "outer")
    builder.add_edge("outer", END)
    return builder.compile(checkpointer=saver)


def slow_subgraph() -> Any:
    """START -> inner_slow (waits 0.6 s) -> END."""

    def inner_slow(state: Notes) -> Notes:
        time.sleep(0.6)
        return {"notes": ["slow"]}

    builder = StateGraph(Notes)
    builder.add_node("inner_slow", inner_slow)
    builder.add_edge(START, "inner_slow")
    builder.add_edge("inner_slow", END)
    return builder.compile()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_late_goto_does_not_let_a_sibling_subgraph_restart_the_run(
    kind: str, saver: Any
) -> None:
    """Command(goto=["ask", "slow"]) to a finished thread, durability="async": ``ask``
    pauses the run (attempt 2) at once; the Command's writes reach the saver late
    (simulated: stored once the run has paused again), then ``slow`` (a subgraph)
    stores its node's write. Both belong to the invocation that paused the run: it
    stays interrupted in attempt 2 (not running for good, in a third)."""
    builder = StateGraph(Notes)
    builder.add_node("done", lambda state: {"notes": ["done"]})
    builder.add_node("ask", lambda state: {"notes": [interrupt("ask?")]})
    builder.add_node("slow", slow_subgraph())
    builder.add_edge(START, "done")
    builder.add_edge("done", END)
    builder.add_edge("ask", END)
    builder.add_edge("slow", END)
    graph = builder.compile(checkpointer=saver)
    run, events = run_with_late_writes(saver, graph, Command(goto=["ask", "slow"]))
    assert run == ("interrupted", 2), events


@parametrize_kinds
async def test_a_resume_after_update_state_answered_a_paused_entrypoint_starts_nothing(
    kind: str, saver: Any
) -> None:
    """Functional API, as test_a_resume_sent_after_update_state_finished_the_paused_node_
    starts_nothing: update_state answers for the paused entrypoint; a late resume runs
    nothing and leaves the run as it was."""
    if is_async(kind):

        @entrypoint(checkpointer=saver)
        async def workflow(x: int) -> int:
            return x + len(interrupt("approve?"))

    else:

        @entrypoint(checkpointer=saver)
        def workflow(x: int) -> int:
            return x + len(interrupt("approve?"))

    await call(workflow, "invoke", kind, 1, config("t1"), durability="sync")
    await call(workflow, "update_state", kind, config("t1"), 5)
    state = await call(workflow, "get_state", kind, config("t1"))
    await call(workflow, "invoke", kind, Command(resume="late"), config("t1"), durability="sync")
    after = await call(workflow, "get_state", kind, config("t1"))
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert (state.next, after.next, after.values) == ((), (), 5)
    assert await run_of(saver, kind) == ("interrupted", 1), events


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("name", ["sub_task", "sub|task"])
async def test_retrying_a_task_that_runs_a_subgraph_starts_before_its_nodes(
    kind: str, saver: Any, name: str
) -> None:
    """Functional API: a @task runs a subgraph whose second node fails (the run fails);
    invoke(None) runs the task again: the new attempt starts before the subgraph's
    events. (The task's name may have '|': LangGraph checks only graph node names.)"""
    fail = [True]

    def inner_boom(state: Notes) -> Notes:
        if fail[0]:
            raise RuntimeError("boom")
        return {"notes": ["ok"]}

    inner = StateGraph(Notes)
    inner.add_node("inner_first", lambda state: {"notes": ["first"]})
    inner.add_node("inner_boom", inner_boom)
    inner.add_edge(START, "inner_first")
    inner.add_edge("inner_first", "inner_boom")
    inner.add_edge("inner_boom", END)
    sub = inner.compile()

    @task(name=name)
    def run_sub(x: int) -> int:
        return len(sub.invoke({"notes": []})["notes"])

    @entrypoint(checkpointer=saver)
    def workflow(x: int) -> int:
        return run_sub(x).result()

    with pytest.raises(RuntimeError, match="boom"):
        workflow.invoke(1, config("t1"), durability="sync")
    fail[0] = False
    assert workflow.invoke(None, config("t1"), durability="sync") == 2
    everything = shown(saver.journal.events("t1"))
    assert run_of_sync(saver) == ("succeeded", 2), everything
    steps = everything[everything.index(("run", "error", "failed")) + 1 :]
    assert steps.index(("run", "start", None)) < steps.index(("task", "end", "inner_boom")), (
        everything
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_late_resume_of_a_subgraph_that_pauses_again_is_no_restart(
    kind: str, saver: Any
) -> None:
    """``outer`` (a subgraph) pauses twice. Command(resume="yes") with
    durability="async", its write reaching the saver late (simulated: stored once the
    run has paused again): the subgraph's first write starts attempt 2, outer pauses
    again, then the late resume arrives. It belongs to that attempt: the run stays
    interrupted in attempt 2."""
    graph = asking_twice_in_a_subgraph(saver, asking("two?"))
    run, events = run_with_late_writes(saver, graph, Command(resume="yes"))
    assert ("task", "interrupt", "inner_two") in events, events
    assert run == ("interrupted", 2), events


@parametrize_kinds
async def test_a_plain_resume_after_a_resume_by_interrupt_id_reads_running(
    kind: str, saver: Any
) -> None:
    """``ask`` pauses twice. The first answer goes by its interrupt's id (no write of no
    task: the node's own write starts attempt 2, which pauses again at the same
    checkpoint); the second is a plain Command(resume=...), a new invocation: its write
    is no late write of attempt 2, and the run reads running in attempt 3 while the
    node runs on."""
    seen: list[tuple[str, int]] = []
    journal = saver.journal
    if is_async(kind):

        async def ask(state: Notes) -> Notes:
            answers = [interrupt("one?"), interrupt("two?")]
            seen.append(await arun_once_running(journal))
            return {"notes": answers}

    else:

        def ask(state: Notes) -> Notes:
            answers = [interrupt("one?"), interrupt("two?")]
            seen.append(run_once_running(journal))
            return {"notes": answers}

    builder = StateGraph(Notes)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)
    out = await call(graph, "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    (first,) = out["__interrupt__"]
    out = await call(graph, "invoke", kind, Command(resume={first.id: "A"}), config("t1"), **SYNC)
    assert [i.value for i in out["__interrupt__"]] == ["two?"]
    assert await run_of(saver, kind) == ("interrupted", 2)
    out = await call(graph, "invoke", kind, Command(resume="B"), config("t1"), **SYNC)
    assert out["notes"] == ["A", "B"]
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert seen == [("running", 3)], events
    assert await run_of(saver, kind) == ("succeeded", 3), events


def answered_then_asking_graph(saver: Any, kind: str, seen: list[tuple[str, int]]) -> Any:
    """START -> first (pauses) -> second (pauses, then records the run as it runs on)."""
    builder = StateGraph(Log)
    builder.add_node("first", ask_approval)
    builder.add_node("second", watching_node(saver.journal, kind, seen))
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=saver)


@parametrize_kinds
async def test_a_plain_resume_after_update_state_and_invoke_none_reads_running(
    kind: str, saver: Any
) -> None:
    """``first`` pauses; update_state answers for it (as_node="first"), invoke(None) runs
    ``second`` from the edit's checkpoint (its write starts attempt 2) and it pauses
    there. A plain Command(resume=...) then resumes it: while it runs, the run must read
    running in attempt 3 (the resume's write is no late write of attempt 2)."""
    seen: list[tuple[str, int]] = []
    graph = answered_then_asking_graph(saver, kind, seen)
    await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    await call(graph, "update_state", kind, config("t1"), {"log": ["by hand"]}, as_node="first")
    await call(graph, "invoke", kind, None, config("t1"), **SYNC)
    assert await run_of(saver, kind) == ("interrupted", 2)
    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), **SYNC)
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert seen == [("running", 3)], events
    assert await run_of(saver, kind) == ("succeeded", 3), events


@parametrize_kinds
async def test_a_plain_resume_after_running_again_from_an_earlier_checkpoint_reads_running(
    kind: str, saver: Any
) -> None:
    """Time travel: a finished thread is run again from the checkpoint before its paused
    node (a fork; the node's write starts attempt 3 and it pauses there). A plain
    Command(resume=...) then resumes it: while it runs, the run reads running (attempt 4)."""
    seen: list[tuple[str, int]] = []
    graph = one_node_graph(saver, watching_node(saver.journal, kind, seen))
    await call(graph, "invoke", kind, {"log": []}, config("t1"), **SYNC)
    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), **SYNC)
    assert (seen, await run_of(saver, kind)) == ([("running", 2)], ("succeeded", 2))
    history = await collect_history(graph, kind, config("t1"))
    paused = next(h for h in history if h.next == ("ask",))
    await call(graph, "invoke", kind, None, paused.config, **SYNC)
    assert await run_of(saver, kind) == ("interrupted", 3)
    await call(graph, "invoke", kind, Command(resume="again"), config("t1"), **SYNC)
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert seen == [("running", 2), ("running", 4)], events
    assert await run_of(saver, kind) == ("succeeded", 4), events


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_resume_whose_late_write_came_while_running_is_not_taken_again(
    kind: str, saver: Any
) -> None:
    """``outer`` (a subgraph) pauses twice. The first Command(resume="A") has its write
    of no task reach the saver late, but while the attempt it belongs to still runs
    (once the run reads running; inner_two waits 0.6 s before it pauses). The second, plain
    Command(resume="B"), sent with nothing delayed, is a new resume: while inner_two runs
    on, the run reads running in attempt 3."""
    seen: list[tuple[str, int]] = []
    journal = saver.journal

    def inner_two(state: Notes) -> Notes:
        time.sleep(0.6)
        answer = interrupt("two?")
        seen.append(run_once_running(journal))
        return {"notes": [answer]}

    graph = asking_twice_in_a_subgraph(saver, inner_two)
    graph.invoke({"notes": []}, config("t1"), durability="sync")
    stored_when = delay_writes_of_no_task(saver, until="running")
    graph.invoke(Command(resume="A"), config("t1"), durability="async")
    assert stored_when == ["running"]  # late, and before the pause
    del saver.put_writes  # nothing delayed from now on
    events = shown(saver.journal.events("t1"))
    assert run_of_sync(saver) == ("interrupted", 2), events
    graph.invoke(Command(resume="B"), config("t1"), durability="sync")
    events = shown(saver.journal.events("t1"))
    assert seen == [("running", 3)], events
    assert run_of_sync(saver) == ("succeeded", 3), events


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_late_resume_after_a_wrapped_call_started_the_attempt_is_no_restart(
    kind: str, saver: Any
) -> None:
    """As test_a_late_resume_of_a_subgraph_that_pauses_again_is_no_restart, the resumed
    node a root node whose wrapped call (not a task's write) starts attempt 2 before it
    pauses again: the late resume belongs to attempt 2 (the run must not read running
    for good, in a third)."""

    @agentcheck.idempotent
    def lookup(x: int) -> int:
        return x * 2

    def ask(state: Notes) -> Notes:
        first = interrupt("one?")
        lookup(1)
        return {"notes": [first, interrupt("two?")]}

    builder = StateGraph(Notes)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)
    run, events = run_with_late_writes(saver, graph, Command(resume="A"))
    assert ("node", "interrupt", "ask") in events[3:], events
    assert run == ("interrupted", 2), events


async def failed_twice(saver: Any, kind: str, side: Any) -> Any:
    """START -> prepare -> explode -> END, and ``side`` -> END (reached by a goto only):
    explode fails, and again on invoke(None) (attempt 2, at the same checkpoint); the
    graph, once explode is fixed (it then ends after 0.3 s, side going first)."""
    fail = [True]

    def explode(state: Notes) -> Notes:
        if fail[0]:
            raise RuntimeError("the warehouse API said no")
        time.sleep(0.3)
        return {"notes": ["explode"]}

    builder = StateGraph(Notes)
    builder.add_node("prepare", lambda state: {"notes": ["prepare"]})
    builder.add_node("explode", explode)
    builder.add_node("side", side)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "explode")
    builder.add_edge("explode", END)
    builder.add_edge("side", END)
    graph = builder.compile(checkpointer=saver)
    for first in (True, False):
        with pytest.raises(RuntimeError, match="warehouse"):
            await call(graph, "invoke", kind, {"notes": []} if first else None, config("t1"),
                       **SYNC)  # fmt: skip
    assert await run_of(saver, kind) == ("failed", 2)
    fail[0] = False
    return graph


@parametrize_kinds
async def test_a_goto_after_a_failed_retry_starts_before_the_call_of_the_node_it_runs(
    kind: str, saver: Any
) -> None:
    """explode fails, and fails again on invoke(None) (its write starts attempt 2 at the
    same checkpoint). Once fixed, Command(goto="side") is sent: side's @side_effect call
    belongs to attempt 3, so its events follow the attempt's start (as they do without
    the failed retry)."""
    side = graph_with_a_charging_side_node(saver, kind).nodes["side"].bound
    graph = await failed_twice(saver, kind, side)
    done = await call(graph, "invoke", kind, Command(goto="side"), config("t1"), **SYNC)
    assert sorted(done["notes"]) == ["charged 1", "explode", "prepare"]
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert await run_of(saver, kind) == ("succeeded", 3), events
    steps = events[len(events) - 1 - events[::-1].index(("run", "error", "failed")) :]
    assert steps.index(("run", "start", None)) < steps.index(("tool", "start", "charge")), steps


@parametrize_kinds
async def test_a_goto_to_a_pausing_node_after_a_failed_retry_reads_interrupted(
    kind: str, saver: Any
) -> None:
    """explode fails, and fails again on invoke(None) (attempt 2, at the same
    checkpoint). Once fixed, Command(goto="side") is sent: side pauses at once while
    explode, run again, ends 0.3 s later. The Command's invocation is attempt 3, which
    pauses: the run must read interrupted (not running for good)."""
    graph = await failed_twice(saver, kind, lambda state: {"notes": [interrupt("side?")]})
    out = await call(graph, "invoke", kind, Command(goto="side"), config("t1"), **SYNC)
    state = await call(graph, "get_state", kind, config("t1"))
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert [i.value for i in out["__interrupt__"]] == ["side?"], (out, state)
    assert await run_of(saver, kind) == ("interrupted", 3), events


def resumed_late_after_an_edit(saver: Any, graph: Any) -> list[tuple[str, str, str | None]]:
    """Thread t1's events once ``graph`` (outer pauses at "one?", then "two?") has paused,
    update_state has edited its state (outer left pending), and Command(resume="yes")
    with durability="async", its write of no task 0.3 s late, has paused it again."""
    graph.invoke({"notes": []}, config("t1"), durability="sync")
    graph.update_state(config("t1"), {"notes": ["edited"]})
    assert graph.get_state(config("t1")).next == ("outer",)
    paused_again_by_late_resume(saver, graph, Command(resume="yes"), config("t1"))
    return shown(saver.journal.events("t1"))


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_late_resume_of_an_own_subgraph_after_an_edit_is_no_restart(
    kind: str, saver: Any
) -> None:
    """``outer`` (checkpointer=True) pauses twice. After the first pause update_state
    edits the state and leaves ``outer`` pending (a later checkpoint C2). A plain
    Command(resume="yes") (durability="async", its write of no task reaching the saver
    late) runs outer again from C2: its subgraph's first write starts attempt 2 (known by
    its node among the tasks that stopped the run) and outer pauses again at C2; the
    late resume belongs to attempt 2. The run must read interrupted in attempt 2, not
    running for good in a third (the subgraph's write remembered the pause's checkpoint,
    not C2, where the late write comes)."""
    events = resumed_late_after_an_edit(
        saver, asking_twice_in_a_subgraph(saver, asking("two?"), checkpointer=True)
    )
    assert run_of_sync(saver) == ("interrupted", 2), events


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_late_resume_through_a_saver_that_does_not_know_the_run_is_no_restart(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """As test_a_late_resume_of_a_subgraph_that_pauses_again_is_no_restart, the resume
    sent through another saver (an API worker, a restarted process) that knows nothing of
    the run: the first write it sees (``ask``'s, pausing again) starts attempt 2, then
    the resume's own write arrives late (simulated: stored once the run has paused
    again). It belongs to attempt 2: the run must read interrupted, not running for good
    in a third."""

    def ask(state: Notes) -> Notes:
        return {"notes": [interrupt("one?"), interrupt("two?")]}

    def build(on: Any) -> Any:
        builder = StateGraph(Notes)
        builder.add_node("ask", ask)
        builder.add_edge(START, "ask")
        builder.add_edge("ask", END)
        return builder.compile(checkpointer=on)

    build(saver).invoke({"notes": []}, config("t1"), durability="sync")
    async with open_saver(kind, **db) as other:
        paused_again_by_late_resume(other, build(other), Command(resume="A"), config("t1"))
    events = shown(saver.journal.events("t1"))
    assert run_of_sync(saver) == ("interrupted", 2), events


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_late_resume_of_a_subgraph_after_an_edit_starts_before_its_nodes(
    kind: str, saver: Any
) -> None:
    """``outer`` (a subgraph) pauses twice. After the first pause update_state edits the
    state and leaves ``outer`` pending (LangGraph runs it as a new task of the edit's
    checkpoint). A plain Command(resume="yes") whose write of no task reaches the saver
    late (simulated: stored once the run has paused again): attempt 2 must start before
    the events of the subgraph's nodes it runs (as it does when the resume's write is
    not late), and end paused."""
    graph = asking_twice_in_a_subgraph(saver, asking("two?"))
    events = resumed_late_after_an_edit(saver, graph)
    assert run_of_sync(saver) == ("interrupted", 2), events
    steps = after_last_stop(saver.journal.events("t1"))
    assert steps.index(("run", "start", None)) < steps.index(("task", "end", "inner_one")), events


@parametrize_kinds
async def test_a_resume_at_a_superseded_checkpoint_starts_before_an_own_subgraph(
    kind: str, saver: Any
) -> None:
    """``outer`` (checkpointer=True) pauses at C1; resumed, the run ends; new input pauses
    it again at C3. A Command(resume=...) addressed to C1 (a checkpoint the thread has
    moved past: LangGraph runs outer again from C1, no fork) resumes the subgraph: its
    first write starts attempt 4 before its events (its node is among the tasks that
    stopped the run, whatever the root checkpoint)."""
    graph = asking_twice_in_a_subgraph(saver, None, checkpointer=True)  # pauses once
    await call(graph, "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    first = (await call(graph, "get_state", kind, config("t1"))).config
    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"), **SYNC)
    await call(graph, "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    assert await run_of(saver, kind) == ("interrupted", 3)
    await call(graph, "invoke", kind, Command(resume="again"), first, **SYNC)
    events = await call(saver.journal, "events", kind, "t1")
    steps = after_last_stop(events)
    assert await run_of(saver, kind) == ("succeeded", 4), steps
    assert steps.index(("run", "start", None)) < steps.index(("task", "end", "inner_one")), steps


@parametrize_kinds
async def test_a_resume_at_a_superseded_checkpoint_of_an_own_subgraph_is_an_attempt(
    kind: str, saver: Any
) -> None:
    """``outer`` (checkpointer=True) pauses twice per run. Run 1 pauses at C1, is resumed
    twice and ends; new input pauses it at a later checkpoint (attempt 4). A
    Command(resume=...) addressed to C1 runs outer again from C1 and it pauses at "two?":
    an invocation that ran nodes and paused, attempt 5, interrupted."""
    graph = asking_twice_in_a_subgraph(saver, asking("two?"), checkpointer=True)
    await call(graph, "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    first = (await call(graph, "get_state", kind, config("t1"))).config
    for answer in ("a", "b"):
        await call(graph, "invoke", kind, Command(resume=answer), config("t1"), **SYNC)
    await call(graph, "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    assert await run_of(saver, kind) == ("interrupted", 4)
    out = await call(graph, "invoke", kind, Command(resume="redo"), first, **SYNC)
    assert [i.value for i in out["__interrupt__"]] == ["two?"]
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert await run_of(saver, kind) == ("interrupted", 5), events


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_late_resume_through_another_saver_starts_before_the_subgraph_it_resumes(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """As test_a_resume_sent_through_another_saver_starts_before_the_subgraph_it_resumes,
    durability="async" with the resume's write of no task reaching that saver only once
    the run has ended: that saver does not know the run, and the first write it sees, a
    subgraph's, starts it before the subgraph's events (not ``outer``'s own write,
    after them)."""
    await call(graph_with_subgraphs(saver), "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    async with open_saver(kind, **db) as other:
        stored_when = delay_writes_of_no_task(other, until="succeeded")
        graph_with_subgraphs(other).invoke(Command(resume="yes"), config("t1"), durability="async")
        assert stored_when == ["succeeded"]  # the resume's write did come late
    steps = after_last_stop(saver.journal.events("t1"))
    assert run_of_sync(saver) == ("succeeded", 2), steps
    assert steps.index(("run", "start", None)) < steps.index(("task", "end", "inner_ask")), steps


@parametrize_kinds
async def test_a_node_error_its_error_handler_recovers_is_one_attempt(
    kind: str, saver: Any
) -> None:
    """``boom`` fails and its error_handler (add_node(..., error_handler=...)) recovers: one
    invocation that ends well: one attempt, succeeded (boom's error is logged, and fails
    nothing: LangGraph writes it with the handler's marker)."""

    def boom(state: Notes) -> Notes:
        raise RuntimeError("boom")

    builder = StateGraph(Notes)
    builder.add_node("boom", boom, error_handler=lambda state: {"notes": ["handled"]})
    builder.add_edge(START, "boom")
    builder.add_edge("boom", END)
    graph = builder.compile(checkpointer=saver)
    out = await call(graph, "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    assert out["notes"] == ["handled"]
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert await run_of(saver, kind) == ("succeeded", 1), events


@parametrize_kinds
async def test_a_node_error_its_error_handler_fails_on_fails_the_run(kind: str, saver: Any) -> None:
    """``boom`` fails and its error handler fails too: the handler's error fails the run,
    in its first attempt."""

    def boom(state: Notes) -> Notes:
        raise RuntimeError("boom")

    def handler(state: Notes) -> Notes:
        raise RuntimeError("the handler gave up")

    builder = StateGraph(Notes)
    builder.add_node("boom", boom, error_handler=handler)
    builder.add_edge(START, "boom")
    builder.add_edge("boom", END)
    graph = builder.compile(checkpointer=saver)
    with pytest.raises(RuntimeError, match="gave up"):
        await call(graph, "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert await run_of(saver, kind) == ("failed", 1), events
    assert events.count(("run", "error", "failed")) == 1, events


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_late_resume_at_a_superseded_checkpoint_of_an_own_subgraph_is_no_restart(
    kind: str, saver: Any
) -> None:
    """As test_a_resume_at_a_superseded_checkpoint_of_an_own_subgraph_is_an_attempt, the
    resume sent with durability="async" and its write of no task reaching the saver late
    (0.3 s, after outer paused again at "two?"): it belongs to attempt 5, which paused;
    the run must read interrupted in attempt 5, not running for good in a sixth."""
    graph = asking_twice_in_a_subgraph(saver, asking("two?"), checkpointer=True)
    graph.invoke({"notes": []}, config("t1"), durability="sync")
    first = graph.get_state(config("t1")).config
    for answer in ("a", "b"):
        graph.invoke(Command(resume=answer), config("t1"), durability="sync")
    graph.invoke({"notes": []}, config("t1"), durability="sync")
    assert run_of_sync(saver) == ("interrupted", 4)
    paused_again_by_late_resume(saver, graph, Command(resume="redo"), first)
    events = after_last_stop(saver.journal.events("t1"))
    assert run_of_sync(saver) == ("interrupted", 5), events


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_handled_error_of_an_own_subgraph_lets_no_later_sibling_restart_the_run(
    kind: str, saver: Any
) -> None:
    """``boom`` (a subgraph compiled with checkpointer=True) fails and its error handler
    recovers, sending on to ``ask`` (pauses at once) and ``boom`` again (ends 0.3 s
    later, in the same step). One invocation, which paused: attempt 1, interrupted. (The
    handled error must not leave boom among the tasks that stop the run: its subgraph's
    write after ask's pause would start a second attempt that reads running for good.)"""
    fail = [True]

    def inner_boom(state: Notes) -> Notes:
        if fail[0]:
            fail[0] = False
            raise RuntimeError("boom")
        time.sleep(0.3)
        return {"notes": ["boom ok"]}

    inner = StateGraph(Notes)
    inner.add_node("inner_boom", inner_boom)
    inner.add_edge(START, "inner_boom")
    inner.add_edge("inner_boom", END)
    builder = StateGraph(Notes)
    builder.add_node(
        "boom",
        inner.compile(checkpointer=True),
        error_handler=lambda state: Command(update={"notes": ["handled"]}, goto=["ask", "boom"]),
    )
    builder.add_node("ask", asking("ask?"))
    builder.add_edge(START, "boom")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)
    out = graph.invoke({"notes": []}, config("t1"), durability="sync")
    assert [i.value for i in out["__interrupt__"]] == ["ask?"]
    events = shown(saver.journal.events("t1"))
    assert run_of_sync(saver) == ("interrupted", 1), events


@parametrize_kinds
async def test_an_error_handlers_events_are_named_after_the_handler(kind: str, saver: Any) -> None:
    """``boom`` fails and its error handler recovers: the handler's end is its own node's
    event (LangGraph's ``__error_handler__boom``), not a second event of ``boom``, which
    would read as boom retried and ending well."""

    def boom(state: Notes) -> Notes:
        raise RuntimeError("boom")

    builder = StateGraph(Notes)
    builder.add_node("boom", boom, error_handler=lambda state: {"notes": ["handled"]})
    builder.add_edge(START, "boom")
    builder.add_edge("boom", END)
    graph = builder.compile(checkpointer=saver)
    await call(graph, "invoke", kind, {"notes": []}, config("t1"), **SYNC)
    events = shown(await call(saver.journal, "events", kind, "t1"))
    assert ("node", "end", "boom") not in events, events
    assert ("node", "error", "boom") in events, events
    assert ("node", "end", "__error_handler__boom") in events, events


# --------------------------------------------------------------------------- events


@parametrize_kinds
@pytest.mark.parametrize("durability", ["sync", "async"])
async def test_node_end_events_are_named_after_the_nodes(
    kind: str, saver: Any, durability: str
) -> None:
    await call(
        linear_graph(saver), "invoke", kind, {"log": []}, config("t1"), durability=durability
    )

    events = await call(saver.journal, "events", kind, "t1")
    names = [n for n in node_names(events) if n != "__start__"]
    assert names == ["fetch", "think", "write"]
    task_ids = [e.step_key for e in events if e.kind == "node" and e.name in names]
    assert len(set(task_ids)) == 3 and all(task_ids)


@parametrize_kinds
@pytest.mark.parametrize("durability", ["sync", "async"])
async def test_node_events_follow_the_order_the_nodes_ran(
    kind: str, saver: Any, durability: str
) -> None:
    """Task writes are stored from worker threads while the graph runs on; a node's event
    is still written before the next node's (with a plain lock the thread that arrived
    last often went first: 45 runs in 50 had two nodes swapped)."""
    names = tuple(f"n{i}" for i in range(10))
    graph = linear_graph(saver, names)
    for run in range(10):
        await call(graph, "invoke", kind, {"log": []}, config(f"t{run}"), durability=durability)
        events = await call(saver.journal, "events", kind, f"t{run}")
        assert node_names(events) == ["__start__", *names], f"run {run}"
        assert run_events(events) == [("start", None), ("end", "succeeded")]


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_the_thread_lock_is_granted_in_the_order_it_was_asked_for() -> None:
    lock = _FifoLock()
    order: list[int] = []

    def take(i: int) -> None:
        with lock:
            order.append(i)

    with lock:
        threads = []
        for i in range(6):
            threads.append(threading.Thread(target=take, args=(i,)))
            threads[-1].start()
            wait_for(lambda i=i: len(lock._waiters) == i + 1)  # queued before the next starts
    for t in threads:
        t.join(30)
    assert order == list(range(6))
    assert not lock._held and not lock._waiters


def test_a_wait_for_the_thread_lock_interrupted_by_a_signal_gives_up_its_turn() -> None:
    lock = _FifoLock()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait(30)

    def interrupt(signum: int, frame: Any) -> None:
        raise TimeoutError("interrupted")

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(30)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(TimeoutError), lock:
            pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not lock._waiters  # the interrupted wait left the queue
    release.set()
    holder.join(30)
    assert not lock._held  # and the holder's release left the lock free
    with lock:
        assert lock._held


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("name", ["sub|task", "a:b", "plain"])
async def test_functional_api_tasks_are_named_after_their_name(
    kind: str, saver: Any, name: str
) -> None:
    """A functional API @task's events carry its name, also one holding '|' or ':'
    (LangGraph checks only graph node names): its namespace ends "<name>:<task id>"."""

    @task(name=name)
    def step(x: int) -> int:
        return x + 1

    @entrypoint(checkpointer=saver)
    def workflow(x: int) -> int:
        return step(x).result()

    assert workflow.invoke(1, config("t1"), durability="sync") == 2
    events = shown(saver.journal.events("t1"))
    assert ("node", "end", name) in events, events


@parametrize_kinds
async def test_node_events_of_send_tasks_are_named_after_their_node(kind: str, saver: Any) -> None:
    builder = StateGraph(MessagesState)
    builder.add_node("plan", lambda state: {"messages": []})
    builder.add_node("work", lambda arg: {"messages": []})
    builder.add_edge(START, "plan")
    builder.add_conditional_edges(
        "plan", lambda state: [Send("work", {"n": 1}), Send("work", {"n": 2})], ["work"]
    )
    builder.add_edge("work", END)
    graph = builder.compile(checkpointer=saver)
    await call(graph, "invoke", kind, {"messages": []}, config("t1"))

    names = node_names(await call(saver.journal, "events", kind, "t1"))
    assert sorted(n for n in names if n != "__start__") == ["plan", "work", "work"]


@parametrize_kinds
async def test_events_have_strictly_increasing_seq_and_after_filters(kind: str, saver: Any) -> None:
    graph = linear_graph(saver)
    await call(graph, "invoke", kind, {"log": []}, config("t1"))
    await call(graph, "invoke", kind, {"log": []}, config("t2"))
    await call(graph, "invoke", kind, {"log": []}, config("t1"))

    events = await call(saver.journal, "events", kind, "t1")
    seqs = [e.seq for e in events]
    assert all(a < b for a, b in zip(seqs, seqs[1:], strict=False))
    assert {e.run_id for e in events} == {"t1"}
    assert run_events(events)[0] == ("start", None)
    assert run_events(events)[-1] == ("end", "succeeded")
    other = await call(saver.journal, "events", kind, "t2")
    assert not {e.seq for e in other} & set(seqs)
    assert await call(saver.journal, "events", kind, "t1", after=seqs[2]) == events[3:]
    assert await call(saver.journal, "events", kind, "t1", after=seqs[-1]) == []
    assert await call(saver.journal, "events", kind, "no-such-run") == []


@parametrize_kinds
async def test_append_returns_each_events_seq(kind: str, saver: Any) -> None:
    """``Journal.append`` stores an event and returns its ``seq`` (a custom adapter
    uses it as the parent of the events that follow)."""
    first = await call(saver.journal, "append", kind, EventSpec("r1", "agent", "start"))
    second = await call(
        saver.journal,
        "append",
        kind,
        EventSpec("r1", "llm", "end", name="m", payload={"a": 1}, input_tokens=3, parent_seq=first),
    )
    assert isinstance(first, int) and first < second
    events = await call(saver.journal, "events", kind, "r1")
    assert [(e.seq, e.kind, e.phase) for e in events] == [
        (first, "agent", "start"),
        (second, "llm", "end"),
    ]
    assert events[1].payload == {"a": 1} and events[1].input_tokens == 3
    assert events[1].parent_seq == first


@parametrize_kinds
async def test_a_checkpoint_that_starts_and_ends_a_run_waits_for_no_answer(
    kind: str, saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-step graph's only checkpoint starts its run and ends it. On PostgreSQL the
    transitions and their events travel with the checkpoint, with no statement whose
    answer is awaited before the COMMIT: the put is one round trip."""
    from agentcheck.backends import postgres as pg_backend

    awaited: list[str] = []
    for cls in (pg_backend._Statements, pg_backend._AsyncStatements):
        original = cls.execute

        def recording(self: Any, query: Any, _original: Any = original) -> Any:
            if query.fetch:
                awaited.append(query.sql)
            return _original(self, query)

        monkeypatch.setattr(cls, "execute", recording)

    graph = one_node_graph(saver, lambda state: {"log": ["done"]})
    # The database's first put records the form of its index terms (read back: awaited).
    await call(graph, "invoke", kind, {"log": []}, config("t0"), durability="exit")
    awaited.clear()
    await call(graph, "invoke", kind, {"log": []}, config("t1"), durability="exit")
    awaited_by_the_graph = list(awaited)
    assert await run_of(saver, kind) == ("succeeded", 1)
    events = await call(saver.journal, "events", kind, "t1")
    assert run_events(events) == [("start", None), ("end", "succeeded")]
    if is_postgres(kind):
        # The first read (get_tuple of the empty thread) is the only answer awaited.
        assert len(awaited_by_the_graph) == 1, awaited_by_the_graph
        assert "FROM agentcheck_checkpoints" in awaited_by_the_graph[0]

    # The run is over: marking it succeeded again changes nothing and logs nothing.
    applied: list[bool] = []
    ops = saver.journal.ops

    def mark() -> Any:
        return ops.mark_succeeded("t1", lambda: applied.append(True))

    await run_op(saver.journal, kind, mark)
    assert applied == []
    assert await call(saver.journal, "events", kind, "t1") == events
    # A running one is marked, once, and the callback runs after the commit.
    await run_op(saver.journal, kind, lambda: ops.start_run("t1", framework="langgraph"))
    await run_op(saver.journal, kind, mark)
    assert applied == [True]
    assert run_events(await call(saver.journal, "events", kind, "t1"))[2:] == [
        ("start", None),
        ("end", "succeeded"),
    ]
    assert await run_of(saver, kind) == ("succeeded", 2)


# --------------------------------------------------------------------------- steps


async def ledger(journal: Journal, kind: str) -> None:
    """s1/k1 completed, s1/k2 failed, s1/k3 started (run r1); s2/k1 completed (run r2)."""
    for scope, key, run_id in (("s1", "k1", "r1"), ("s1", "k2", "r1"), ("s1", "k3", "r1")):
        claim = await run_op(
            journal, kind, claim_op(journal, scope, key, "w1", run_id=run_id, args={"k": key})
        )
        assert claim.owned
    await run_op(journal, kind, claim_op(journal, "s2", "k1", "w2", run_id="r2"))
    assert await run_op(journal, kind, complete_op(journal, "s1", "k1", "w1", {"ok": 1}))
    assert await run_op(journal, kind, complete_op(journal, "s2", "k1", "w2", [1, 2]))
    await run_op(journal, kind, fail_op(journal, "s1", "k2", "w1", "Timeout: no answer"))


def keys(steps: list[Step]) -> set[tuple[str, str]]:
    return {(s.scope, s.step_key) for s in steps}


@parametrize_kinds
async def test_steps_filter_by_run_scope_and_status(kind: str, saver: Any) -> None:
    journal = saver.journal
    await ledger(journal, kind)

    def steps(**kwargs: Any) -> Any:
        return call(journal, "steps", kind, **kwargs)

    assert keys(await steps()) == {("s1", "k1"), ("s1", "k2"), ("s1", "k3"), ("s2", "k1")}
    assert keys(await steps(scope="s1")) == {("s1", "k1"), ("s1", "k2"), ("s1", "k3")}
    assert keys(await steps(run_id="r2")) == {("s2", "k1")}
    assert keys(await steps(status=["completed"])) == {("s1", "k1"), ("s2", "k1")}
    assert keys(await steps(scope="s1", status=["failed", "started"])) == {
        ("s1", "k2"),
        ("s1", "k3"),
    }
    assert keys(await steps(run_id="r1", scope="s2")) == set()

    k1 = await call(journal, "get_step", kind, "s1", "k1")
    assert (k1.status, k1.result, k1.args, k1.attempts) == ("completed", {"ok": 1}, {"k": "k1"}, 1)
    assert (k1.kind, k1.name, k1.effect, k1.owner) == ("tool", "charge", "side_effect", "w1")
    assert k1.idempotency_key == "ac-s1-k1" and k1.finished_at is not None
    k2 = await call(journal, "get_step", kind, "s1", "k2")
    assert (k2.status, k2.error, k2.outcome_unknown) == ("failed", "Timeout: no answer", False)
    k3 = await call(journal, "get_step", kind, "s1", "k3")
    assert (k3.status, k3.finished_at, k3.outcome_unknown) == ("started", None, True)
    assert (await call(journal, "get_step", kind, "s2", "k1")).result == [1, 2]
    assert await call(journal, "get_step", kind, "s1", "nope") is None


@parametrize_kinds
async def test_a_claim_and_a_take_over_return_the_step_as_stored(kind: str, saver: Any) -> None:
    """A claim that inserts its step builds it from what it inserted (no read back), a
    lost claim and a take-over read it: each Step equals the stored row, arguments too."""
    journal = saver.journal
    args = {"amount": 5, "to": ("acct", 7), "note": "é"}
    won = await run_op(journal, kind, claim_op(journal, "s", "pay", "owner-a", args=args))
    lost = await run_op(journal, kind, claim_op(journal, "s", "pay", "owner-b", args={"x": 1}))
    stored = await call(journal, "get_step", kind, "s", "pay")
    assert won.owned and not lost.owned
    assert won.step == stored == lost.step
    assert won.step.args == stored.args == lost.step.args == args

    await run_op(journal, kind, fail_op(journal, "s", "pay", "owner-a", "timeout"))
    took = await run_op(
        journal,
        kind,
        lambda: journal.ops.reclaim("s", "pay", seen_owner="owner-a", owner="owner-b", run_id="r"),
    )
    stored = await call(journal, "get_step", kind, "s", "pay")
    assert took.owned and took.step == stored
    assert (stored.owner, stored.status, stored.attempts, stored.run_id) == (
        "owner-b",
        "started",
        2,
        "r",
    )


@parametrize_kinds
async def test_a_completed_step_is_never_overwritten(kind: str, saver: Any) -> None:
    journal = saver.journal
    first = await run_op(journal, kind, claim_op(journal, "s", "pay", "owner-a"))
    assert first.owned and first.step.status == "started"
    assert await run_op(journal, kind, complete_op(journal, "s", "pay", "owner-a", {"v": 1}))

    # Another owner cannot complete it; its own owner cannot change its result.
    assert not await run_op(journal, kind, complete_op(journal, "s", "pay", "owner-b", {"v": 2}))
    await run_op(journal, kind, complete_op(journal, "s", "pay", "owner-a", {"v": 3}))
    # Neither a new claim, a take-over, a failure nor a release changes it.
    again = await run_op(journal, kind, claim_op(journal, "s", "pay", "owner-b"))
    assert not again.owned and again.step.result == {"v": 1}
    took = await run_op(
        journal,
        kind,
        lambda: journal.ops.reclaim("s", "pay", seen_owner="owner-a", owner="owner-b", run_id="r"),
    )
    assert not took.owned
    await run_op(journal, kind, fail_op(journal, "s", "pay", "owner-a", "late failure"))
    await run_op(journal, kind, lambda: journal.ops.release("s", "pay", owner="owner-a"))

    step = await call(journal, "get_step", kind, "s", "pay")
    assert (step.status, step.result, step.owner, step.error) == (
        "completed",
        {"v": 1},
        "owner-a",
        None,
    )
    assert step.attempts == 1


def traced_claim_op(
    journal: Journal, key: str, owner: str, *, seen: str | None = None
) -> Callable[[], Any]:
    """A claim (or, with ``seen``, a take-over from that owner) with its start event."""
    event = EventSpec("r1", "tool", "start", name=f"charge by {owner}", step_key=key)
    if seen is not None:
        return lambda: journal.ops.reclaim(
            "s", key, seen_owner=seen, owner=owner, run_id="r1", event=event
        )
    return lambda: journal.ops.claim(
        "s",
        key,
        run_id="r1",
        kind="tool",
        name="charge",
        effect="side_effect",
        idempotency_key=f"ac-{key}",
        args={"amount": 5},
        owner=owner,
        event=event,
    )


def traced_complete_op(journal: Journal, key: str, owner: str) -> Callable[[], Any]:
    event = EventSpec("r1", "tool", "end", name=f"charge by {owner}", step_key=key, payload=7)
    return lambda: journal.ops.complete("s", key, owner=owner, result=7, event=event)


@parametrize_kinds
async def test_an_operation_made_again_after_its_commit_appends_its_event_once(
    kind: str, saver: Any
) -> None:
    """A pool makes an operation again on another connection when its connection
    breaks, even as it commits (the commit stored, its answer lost): a claim, a
    take-over or a completion made again finds its own work done and appends no second
    event. (Before, a claim or take-over made again appended its start event twice.)"""
    journal = saver.journal
    for _ in range(2):
        claim = await run_op(journal, kind, traced_claim_op(journal, "pay", "w1"))
        assert claim.owned and claim.step.attempts == 1
    await run_op(journal, kind, fail_op(journal, "s", "pay", "w1", "Timeout: no answer"))
    for _ in range(2):
        took = await run_op(journal, kind, traced_claim_op(journal, "pay", "w2", seen="w1"))
        assert took.owned and took.step.attempts == 2
    assert await run_op(journal, kind, traced_complete_op(journal, "pay", "w2"))
    assert not await run_op(journal, kind, traced_complete_op(journal, "pay", "w2"))

    events = await call(journal, "events", kind, "r1")
    assert [(e.phase, e.name) for e in events] == [
        ("start", "charge by w1"),
        ("start", "charge by w2"),
        ("end", "charge by w2"),
    ]
    step = await call(journal, "get_step", kind, "s", "pay")
    assert (step.status, step.owner, step.result, step.attempts) == ("completed", "w2", 7, 2)


@parametrize_kinds
async def test_a_completion_whose_event_fails_stores_nothing_and_the_journal_goes_on(
    kind: str, saver: Any
) -> None:
    """The step's completion and its end event commit together or not at all (on
    PostgreSQL one statement sent with its COMMIT): an event the database refuses (a
    token count past a 64-bit integer) leaves the step started, and the next operation
    on the same saver works."""
    journal = saver.journal
    assert (await run_op(journal, kind, traced_claim_op(journal, "pay", "w1"))).owned
    bad = EventSpec("r1", "tool", "end", name="charge", step_key="pay", input_tokens=2**70)
    with pytest.raises((OverflowError, psycopg.Error)):
        await run_op(
            journal,
            kind,
            lambda: journal.ops.complete("s", "pay", owner="w1", result=7, event=bad),
        )
    step = await call(journal, "get_step", kind, "s", "pay")
    assert (step.status, step.result) == ("started", None)
    assert await run_op(journal, kind, traced_complete_op(journal, "pay", "w1"))
    events = await call(journal, "events", kind, "r1")
    assert [(e.phase, e.name) for e in events] == [
        ("start", "charge by w1"),
        ("end", "charge by w1"),
    ]


def round_trips(trace: str) -> int:
    """Round trips in a libpq trace: each waits for the server at a Sync message."""
    return sum(1 for line in trace.splitlines() if line.split("\t")[::2] == ["F", "Sync"])


@pytest.mark.parametrize("kind", ["postgres", "async_postgres"])
async def test_a_wrapped_calls_claim_and_completion_take_one_round_trip_each(
    kind: str, pg_url: str, tmp_path: Any
) -> None:
    """On PostgreSQL a claim with its start event, a completion with its end event and
    a take-over with its start event are one statement each, sent with their commit:
    one round trip each (they took two: the step's statement, whose answer decides on
    the event, then the event and the COMMIT). A claim that finds the step taken reads
    it afterwards."""
    from agentcheck.savers import AsyncPostgresSaver, PostgresSaver

    path = tmp_path / "trace.txt"
    if is_async(kind):
        conn: Any = await psycopg.AsyncConnection.connect(
            pg_url, autocommit=True, prepare_threshold=0
        )
        saver: Any = AsyncPostgresSaver(conn)
        await saver.setup()
    else:
        conn = psycopg.Connection.connect(pg_url, autocommit=True, prepare_threshold=0)
        saver = PostgresSaver(conn)
        saver.setup()
    journal = saver.journal

    async def traced(make_op: Callable[[], Any]) -> tuple[Any, int]:
        with path.open("w") as out:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                result = await run_op(journal, kind, make_op)
            finally:
                conn.pgconn.untrace()
        return result, round_trips(path.read_text())

    try:
        # prepare_threshold=0 (as LangGraph's docs advise): each statement is prepared
        # at its first use on the connection, a round trip more, once.
        await run_op(journal, kind, traced_claim_op(journal, "warm", "w0"))
        await run_op(journal, kind, traced_complete_op(journal, "warm", "w0"))
        await run_op(journal, kind, traced_claim_op(journal, "warm", "w9"))
        await run_op(journal, kind, traced_claim_op(journal, "warm-2", "w0"))
        await run_op(journal, kind, traced_claim_op(journal, "warm-2", "w8", seen="w0"))

        claim, trips = await traced(traced_claim_op(journal, "pay", "w1"))
        assert claim.owned and trips == 1
        done, trips = await traced(traced_complete_op(journal, "pay", "w1"))
        assert done and trips == 1
        taken, trips = await traced(traced_claim_op(journal, "pay", "w2"))
        assert not taken.owned and taken.step.status == "completed" and trips == 2
        # A take-over (of a call whose outcome is unknown) with its start event: one too.
        await run_op(journal, kind, traced_claim_op(journal, "ship", "w1"))
        took, trips = await traced(traced_claim_op(journal, "ship", "w3", seen="w1"))
        assert took.owned and took.step.attempts == 2 and trips == 1
        events = await call(journal, "events", kind, "r1")
        assert [(e.phase, e.name, e.step_key) for e in events][-4:] == [
            ("start", "charge by w1", "pay"),
            ("end", "charge by w1", "pay"),
            ("start", "charge by w1", "ship"),
            ("start", "charge by w3", "ship"),
        ]
    finally:
        await conn.close() if is_async(kind) else conn.close()


@parametrize_kinds
async def test_two_concurrent_claims_of_one_step_give_exactly_one_owner(
    kind: str, saver: Any
) -> None:
    journal = saver.journal
    n_keys = 12
    barrier = threading.Barrier(2)

    def contender(owner: str) -> list[Claim]:
        claims = []
        for i in range(n_keys):
            barrier.wait()
            claims.append(journal.run_op(claim_op(journal, "s", f"k{i}", owner), True))
        return claims

    # Two threads (sync calls; an async saver takes them from threads other than its loop).
    if is_async(kind):
        a, b = await asyncio.gather(
            asyncio.to_thread(contender, "thread-a"), asyncio.to_thread(contender, "thread-b")
        )
    else:
        results: dict[str, list[Claim]] = {}
        threads = [
            threading.Thread(target=lambda o=o: results.__setitem__(o, contender(o)))
            for o in ("thread-a", "thread-b")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        a, b = results["thread-a"], results["thread-b"]

    for i, (ca, cb) in enumerate(zip(a, b, strict=True)):
        assert [ca.owned, cb.owned].count(True) == 1, i
        assert ca.step.owner == cb.step.owner
        assert ca.step.owner == ("thread-a" if ca.owned else "thread-b")
    stored = await call(journal, "steps", kind, scope="s")
    assert len(stored) == n_keys and {s.attempts for s in stored} == {1}

    if is_async(kind):
        # And two coroutines on the saver's own loop.
        x, y = await asyncio.gather(
            journal.arun_op(claim_op(journal, "s", "coro", "coro-x"), True),
            journal.arun_op(claim_op(journal, "s", "coro", "coro-y"), True),
        )
        assert [x.owned, y.owned].count(True) == 1
        assert x.step.owner == y.step.owner


# --------------------------------------------------------------------------- connect


@parametrize_kinds
async def test_connect_reads_the_same_data_as_the_saver(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    await call(linear_graph(saver), "invoke", kind, {"log": []}, config("t1"))
    with pytest.raises(RuntimeError):
        await call(failing_graph(saver, [True]), "invoke", kind, {}, config("t2"), **SYNC)
    await ledger(saver.journal, kind)

    expected = (
        await call(saver.journal, "runs", kind),
        await call(saver.journal, "events", kind, "t1"),
        await call(saver.journal, "events", kind, "t2"),
        await call(saver.journal, "steps", kind),
        await call(saver.journal, "get_run", kind, "t2"),
        await call(saver.journal, "get_step", kind, "s1", "k1"),
    )
    assert len(expected[0]) == 2 and expected[1] and expected[3]
    targets = (
        [db["pg_url"]]
        if is_postgres(kind)
        else [db["sqlite_path"], "sqlite:///" + db["sqlite_path"]]
    )
    for target in targets:
        with agentcheck.connect(target) as journal:
            assert isinstance(journal, Journal)
            seen = (
                journal.runs(),
                journal.events("t1"),
                journal.events("t2"),
                journal.steps(),
                journal.get_run("t2"),
                journal.get_step("s1", "k1"),
            )
        assert seen == expected, target


# --------------------------------------------------------------------------- damaged rows


@parametrize_kinds
async def test_a_damaged_run_fails_where_it_is_read_not_every_listing(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """A run's metadata was decoded as its row was read: one damaged row made runs()
    fail for every run (a recovery worker listing running runs saw none of them). It
    is now decoded when read, with an error naming the run; so is an event's payload."""
    journal = saver.journal
    for run_id in ("run-a", "run-b", "run-c"):
        await call(journal, "start_run", kind, run_id, framework="custom", metadata={"n": run_id})
        await call(journal, "append", kind, EventSpec(run_id, "tool", "end", payload=[run_id]))
    for table, column in (("agentcheck_runs", "metadata"), ("agentcheck_events", "payload")):
        damage = f"UPDATE {table} SET {column} = ? WHERE run_id = 'run-b'"  # noqa: S608
        raw_sql(kind, **db, sql=damage, params=(b"\xc1 not msgpack",))

    runs = await call(journal, "runs", kind, status="running")
    assert sorted(r.run_id for r in runs) == ["run-a", "run-b", "run-c"]
    by_id = {r.run_id: r for r in runs}
    assert by_id["run-a"].metadata == {"n": "run-a"}
    with pytest.raises(CorruptDataError, match="cannot read the metadata of run 'run-b'"):
        by_id["run-b"].metadata  # noqa: B018
    events = {run_id: await call(journal, "events", kind, run_id) for run_id in by_id}
    (tool_event,) = [e for e in events["run-b"] if e.kind == "tool"]
    with pytest.raises(CorruptDataError, match=r"the payload of event \d+ of run 'run-b'"):
        tool_event.payload  # noqa: B018
    assert [e.payload for e in events["run-c"] if e.kind == "tool"] == [["run-c"]]


@pytest.mark.parametrize("kind", [k for k in KINDS if not is_postgres(k)])
async def test_a_damaged_count_fails_where_it_is_read_not_every_listing(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """A count damaged by hand (SQLite keeps any value in an INTEGER column; PostgreSQL
    refuses the damage itself) made runs() and steps() raise for the whole listing: one
    bad run hid every other one from a recovery worker. A count is now read as a
    payload is: the listing holds every row, and the damaged field raises a
    CorruptDataError naming its row when read."""
    journal = saver.journal
    for name in ("a", "b", "c"):
        await call(journal, "start_run", kind, f"run-{name}", framework="custom")
        await run_op(journal, kind, claim_op(journal, "s", f"k-{name}", "me", args={"n": name}))
    raw_sql(kind, **db, sql="UPDATE agentcheck_runs SET attempt = 'x' WHERE run_id = 'run-b'")
    damage = "UPDATE agentcheck_steps SET attempts = 'y', interrupts = 'z' WHERE step_key = 'k-b'"
    raw_sql(kind, **db, sql=damage)

    runs = {r.run_id: r for r in await call(journal, "runs", kind)}
    assert sorted(runs) == ["run-a", "run-b", "run-c"]
    assert (runs["run-a"].attempt, runs["run-c"].attempt) == (1, 1)
    assert runs["run-b"].status == "running"
    with pytest.raises(CorruptDataError, match="the attempt of run 'run-b': 'x' is not a count"):
        runs["run-b"].attempt  # noqa: B018
    assert "attempt=<unreadable: " in repr(runs["run-b"])
    assert len(set(runs.values())) == 3  # hashable as before

    steps = {s.step_key: s for s in await call(journal, "steps", kind, scope="s")}
    assert sorted(steps) == ["k-a", "k-b", "k-c"]
    assert [steps[k].attempts for k in ("k-a", "k-c")] == [1, 1]
    assert steps["k-b"].args == {"n": "b"}
    with pytest.raises(CorruptDataError, match=r"the attempts of step 'k-b' in scope 's'"):
        steps["k-b"].attempts  # noqa: B018
    with pytest.raises(CorruptDataError, match=r"the interrupts of step 'k-b'.*'z' is not"):
        steps["k-b"].interrupts  # noqa: B018


@parametrize_kinds
async def test_journal_rows_decoded_when_read_are_still_plain_dataclasses(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """Runs, events and steps decode their payloads when read (so that one damaged row
    does not fail a whole listing). Their first form of it (private loader fields)
    broke pickling, left the payloads out of dataclasses.asdict, repr and equality (two
    runs of different metadata compared equal). Those see the decoded values again,
    and repr shows a damaged payload instead of raising."""
    journal = saver.journal
    await call(journal, "start_run", kind, "r1", framework="custom", metadata={"u": "alice"})
    await call(journal, "start_run", kind, "r2", framework="custom", metadata={"u": "mallory"})
    await call(journal, "append", kind, EventSpec("r1", "tool", "end", payload=[1, (2, 3)]))
    await run_op(journal, kind, claim_op(journal, "s", "k1", "me", args={"amount": 5}))
    await run_op(
        journal, kind, lambda: journal.ops.complete("s", "k1", owner="me", result=7, event=None)
    )
    runs = {r.run_id: r for r in await call(journal, "runs", kind)}
    (event,) = [e for e in await call(journal, "events", kind, "r1") if e.kind == "tool"]
    (step,) = await call(journal, "steps", kind, scope="s")
    for row, name, value in (
        (runs["r1"], "metadata", {"u": "alice"}),
        (event, "payload", [1, (2, 3)]),
        (step, "args", {"amount": 5}),
        (step, "result", 7),
    ):
        assert pickle.loads(pickle.dumps(row)) == row
        assert copy.deepcopy(row) == row
        assert dataclasses.asdict(row)[name] == value
        assert f"{name}={value!r}" in repr(row)
    assert runs["r1"] != runs["r2"]
    assert dataclasses.replace(runs["r1"], run_id="r2") != runs["r2"]  # metadata differs

    # Hashable as before (the payloads, a dict or a list, are left out of the hash).
    assert len({runs["r1"], runs["r2"], event, step, copy.copy(step)}) == 4

    damage = "UPDATE agentcheck_runs SET metadata = ? WHERE run_id = 'r2'"
    raw_sql(kind, **db, sql=damage, params=(b"\xc1",))
    (damaged,) = [r for r in await call(journal, "runs", kind) if r.run_id == "r2"]
    assert "metadata=<unreadable: cannot read the metadata of run 'r2'" in repr(damaged)
    with pytest.raises(CorruptDataError, match="the metadata of run 'r2'"):
        pickle.dumps(damaged)


_DAMAGES = {
    "no-type": ("result_type = NULL", "stored without its type"),
    "repr-not-text": ("result_type = 'repr', result = ?", "can't decode"),
    # (SQLite only: PostgreSQL's INTEGER column refuses the damage itself.)
    "interrupts": ("interrupts = 'x'", "'x' is not a count"),
}


@pytest.mark.parametrize(
    ("kind", "damage", "why"),
    [
        pytest.param(kind, *_DAMAGES[name], id=f"{name}-{kind}")
        for name in _DAMAGES
        for kind in KINDS
        if not (name == "interrupts" and is_postgres(kind))
    ],
)
async def test_a_damaged_completed_call_is_a_clear_error_and_never_runs_again(
    kind: str, saver: Any, db: dict[str, str], damage: str, why: str
) -> None:
    """A completed call whose row is damaged: its result with no type came back as None
    (a silent wrong answer), a repr that is not text and a count that is not one raised
    bare TypeError / UnicodeDecodeError / ValueError naming nothing. Each is now a
    CorruptDataError naming the step and its scope; the call is never made again."""
    calls: list[int] = []

    def body(amount: int) -> int:
        calls.append(amount)
        return amount * 10

    if is_async(kind):

        @side_effect(name="charge")
        async def charge(amount: int) -> int:
            return body(amount)

    else:

        @side_effect(name="charge")  # type: ignore[no-redef]
        def charge(amount: int) -> int:
            return body(amount)

    async def charge_in(scope: str) -> Any:
        with effect_scope(saver.journal, scope):
            result = charge(5)
            return await result if is_async(kind) else result

    assert await charge_in("damaged") == 50
    assert await charge_in("healthy") == 50
    params = (b"\xff\xfe",) if "?" in damage else ()
    update = f"UPDATE agentcheck_steps SET {damage} WHERE scope = 'damaged'"  # noqa: S608
    raw_sql(kind, **db, sql=update, params=params)

    with pytest.raises(CorruptDataError, match=rf"of step '.*' in scope 'damaged': .*{why}"):
        await charge_in("damaged")
    assert await charge_in("healthy") == 50
    assert calls == [5, 5]  # once in each scope, never again


# --------------------------------------------------------------------------- arguments


@parametrize_kinds
async def test_status_filters_take_one_status_or_several_and_refuse_others(
    kind: str, saver: Any
) -> None:
    """steps(status="completed") filtered by the string's letters and found nothing;
    runs(status=["running"]) was an SQL error on SQLite and found nothing on PostgreSQL.
    Both take one status or several now; a word that is no status is refused by name,
    as are a negative limit and an event seq that is not a number (a driver error on
    PostgreSQL, and on SQLite no events or every run)."""
    journal = saver.journal
    await call(journal, "start_run", kind, "r1", framework="custom")
    await call(journal, "start_run", kind, "r2", framework="custom")
    await call(journal, "set_run_status", kind, "r2", "failed", error="boom")
    await run_op(journal, kind, claim_op(journal, "s", "k1", "me"))
    await run_op(journal, kind, claim_op(journal, "s", "k2", "me"))
    await run_op(
        journal, kind, lambda: journal.ops.complete("s", "k2", owner="me", result=7, event=None)
    )

    for status in ("running", ["running"], ("running",), {"running"}):
        assert [r.run_id for r in await call(journal, "runs", kind, status=status)] == ["r1"]
    both = await call(journal, "runs", kind, status=["running", "failed"])
    assert sorted(r.run_id for r in both) == ["r1", "r2"]
    assert await call(journal, "runs", kind, status=[]) == []
    for status in ("completed", ["completed"]):
        assert [s.step_key for s in await call(journal, "steps", kind, status=status)] == ["k2"]
    started_or_done = await call(journal, "steps", kind, status=("started", "completed"))
    assert sorted(s.step_key for s in started_or_done) == ["k1", "k2"]

    with pytest.raises(ValueError, match=r"steps\(status=...\): 'complete' is not a status"):
        await call(journal, "steps", kind, status="complete")
    with pytest.raises(ValueError, match=r"runs\(status=...\): 'done' is not a status"):
        await call(journal, "runs", kind, status=["running", "done"])
    with pytest.raises(TypeError, match=r"runs\(status=...\) must be a status"):
        await call(journal, "runs", kind, status=3)
    with pytest.raises(ValueError, match=r"runs\(limit=...\) must be a whole number"):
        await call(journal, "runs", kind, limit=-1)
    with pytest.raises(TypeError, match=r"events\(after=...\) must be an event's seq"):
        await call(journal, "events", kind, "r1", after="x")


@parametrize_kinds
async def test_a_payload_read_first_by_two_threads_is_one_value(
    kind: str, saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads reading a step's result for the first time at once got two objects,
    the step keeping the last one. They now get the one value stored first (each may
    decode it: no lock is held while decoding, which may wait for an event loop)."""
    journal = saver.journal
    await run_op(journal, kind, claim_op(journal, "s", "k1", "me"))
    await run_op(
        journal,
        kind,
        lambda: journal.ops.complete("s", "k1", owner="me", result={"n": 1}, event=None),
    )
    (step,) = await call(journal, "steps", kind, scope="s")
    load, decodes = journal.ops.load, []

    def slow_load(*args: Any) -> Any:
        decodes.append(1)
        time.sleep(0.2)  # both threads ask while the first decodes
        return load(*args)

    monkeypatch.setattr(journal.ops, "load", slow_load)
    seen: list[Any] = []
    readers = [threading.Thread(target=lambda: seen.append(step.result)) for _ in range(2)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert 1 <= len(decodes) <= 2
    assert seen[0] is seen[1] is step.result
    assert step.result == {"n": 1}


@parametrize_kinds
async def test_the_journal_api_takes_any_id_the_savers_take(kind: str, saver: Any) -> None:
    """get_run, start_run, set_run_status and append passed a run id as it was to the
    driver: a UUID was an SQLite binding error, an int or a UUID an operator error on
    PostgreSQL (text = smallint), where events() and steps() took them as their text.
    Every run id and scope is now stored and looked up as str() of it, as the savers
    store a thread id (a LangGraph run's id)."""
    journal = saver.journal
    for run_id in (42, uuid.UUID(int=9), "plain"):
        await call(journal, "start_run", kind, run_id, framework="custom", thread_id=run_id)
        await call(journal, "append", kind, EventSpec(run_id, "tool", "end", payload=1))
        await call(journal, "set_run_status", kind, run_id, "failed", error="boom")
        run = await call(journal, "get_run", kind, run_id)
        assert (run.run_id, run.thread_id, run.status) == (str(run_id), str(run_id), "failed")
        kinds = [e.kind for e in await call(journal, "events", kind, run_id)]
        assert kinds == ["run", "tool", "run"]
    with pytest.raises(TypeError, match="run_id must be text"):
        await call(journal, "get_run", kind, None)


class _FollowsRefs(agentcheck.SafeSerializer):
    """Reads a stored {"$ref": [scope, step key]} as that other step's result, looked up
    through the saver's sync API (from a worker thread: on the async saver's loop)."""

    saver: Any = None

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        value = super().loads_typed(data)
        if isinstance(value, dict) and "$ref" in value:
            time.sleep(0.2)  # the decode takes a moment: another read comes meanwhile
            scope, key = value["$ref"]
            return self.saver.journal.get_step(scope, key).result
        return value


@pytest.mark.timeout(60, method="thread")  # a regression deadlocks: end the run, not wait
@pytest.mark.parametrize("kind", ["async_sqlite", "async_postgres"])
async def test_a_payload_decoded_in_a_thread_does_not_block_the_savers_loop(
    kind: str, db: dict[str, str]
) -> None:
    """A first read of a payload was decoded under one lock for the whole process: a
    decode in a worker thread that waits for the async saver's loop (a serializer that
    reads another row) held it while the loop, reading any other payload, waited for
    it: a deadlock. Nothing is decoded under a lock now."""
    serde = _FollowsRefs()
    async with open_saver(kind, **db, serde=serde) as saver:
        serde.saver = saver

        @side_effect
        async def make(value: Any) -> Any:
            return value

        with effect_scope(saver.journal, "s"):
            await make({"n": 1})
            await make({"other": 2})
        first, second = await saver.journal.asteps(scope="s")
        with effect_scope(saver.journal, "t"):
            await make({"$ref": ["s", first.step_key]})
        (pointing,) = await saver.journal.asteps(scope="t")
        # (By key: == would read its result now.)
        (other,) = [
            s for s in await saver.journal.asteps(scope="s") if s.step_key == second.step_key
        ]
        worker = asyncio.create_task(asyncio.to_thread(lambda: pointing.result))
        await asyncio.sleep(0.05)  # the worker is decoding
        assert other.result == {"other": 2}  # read on the loop meanwhile
        assert await worker == {"n": 1}
