"""Side-effect-aware calls inside one process: ``@side_effect``, ``@idempotent``,
``durable_model`` and their unknown-outcome policies.

No process is killed here (see ``test_crash.py``): a node runs again because of an
``interrupt()`` resume, a ``RetryPolicy`` retry, or because it raised after the call and
the graph was invoked again. The "started, never finished" state a crash leaves behind is
produced by setting a completed step back to ``started`` with plain SQL on the database.

Tests that run a graph are parametrized over the four savers (``KINDS``): sync savers run
sync graphs with sync wrapped functions (``invoke``), async savers run async graphs with
async wrapped functions (``ainvoke``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import operator
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import psycopg
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableBinding, RunnableLambda
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent
from langgraph.prebuilt.chat_agent_executor import AgentState
from langgraph.types import Command, RetryPolicy, Send, interrupt
from pydantic import BaseModel
from typing_extensions import TypedDict

from agentcheck import (
    NOT_DONE,
    ToolOutcomeUnknown,
    UnknownOutcome,
    current_idempotency_key,
    effect_scope,
    generate_key,
    idempotent,
    side_effect,
)
from agentcheck.adapters.langgraph import durable_model
from agentcheck.backends.base import Query
from agentcheck.effects import (
    CallContext,
    Done,
    EffectSpec,
    ProtocolRun,
    _AttemptRegistry,
    attempt_counters,
    protocol,
)
from agentcheck.journal import Claim, Event, Step
from agentcheck.savers import SqliteSaver
from fake_models import ScriptedChatModel, tool_call_message

from savers_support import (
    ASYNC_KINDS,
    KINDS,
    SYNC_KINDS,
    call,
    collect,
    is_async,
    is_postgres,
    open_saver,
)

parametrize_kinds = pytest.mark.parametrize("kind", KINDS)
no_deprecation_noise = pytest.mark.filterwarnings(
    "ignore::langgraph.warnings.LangGraphDeprecationWarning"
)


# --------------------------------------------------------------------------- helpers


async def stream(graph: Any, kind: str, *args: Any, **kwargs: Any) -> list[Any]:
    """All items of ``graph.stream`` / ``graph.astream``."""
    if is_async(kind):
        return [item async for item in graph.astream(*args, **kwargs)]
    return list(graph.stream(*args, **kwargs))


def config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


class Flaky(Exception):
    """Raised on purpose by a node or a tool on its first attempt."""


class Log(TypedDict):
    out: Annotated[list[Any], operator.add]


class Branches(TypedDict):
    """A run's thread id, and the item a Send gives each branch."""

    out: Annotated[list[Any], operator.add]
    thread: str
    n: int


def charge_fn(
    kind: str,
    calls: list[Any],
    *,
    decorate: Callable[[Any], Any] = side_effect,
    fail_first: int = 0,
) -> Any:
    """A wrapped ``charge(amount)`` (async for async kinds) that appends to ``calls`` each
    time it really runs, and raises :class:`Flaky` on its first ``fail_first`` runs."""

    def body(amount: int) -> dict[str, int]:
        calls.append(amount)
        if len(calls) <= fail_first:
            raise Flaky(f"card network down (run {len(calls)})")
        return {"charged": amount, "run": len(calls)}

    if is_async(kind):

        async def charge(amount: int) -> dict[str, int]:
            return body(amount)

    else:

        def charge(amount: int) -> dict[str, int]:  # type: ignore[misc]
            return body(amount)

    return decorate(charge)


def calling_node(kind: str, fn: Any, args: tuple[Any, ...], after: Callable[[Any], Any]) -> Any:
    """A node that calls ``fn(*args)`` (awaited for async kinds), then ``after(result)``."""
    if is_async(kind):

        async def node(state: Any) -> Any:
            return after(await fn(*args))

    else:

        def node(state: Any) -> Any:  # type: ignore[misc]
            return after(fn(*args))

    return node


def one_node_graph(node: Any, saver: Any, *, retry: RetryPolicy | None = None) -> Any:
    builder = StateGraph(Log)
    builder.add_node("work", node, retry_policy=retry)
    builder.add_edge(START, "work")
    builder.add_edge("work", END)
    return builder.compile(checkpointer=saver)


def retry_twice(on: type[BaseException] = Flaky) -> RetryPolicy:
    return RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False, retry_on=on)


def of_kind(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


def phases(events: list[Event], kind: str = "tool") -> list[str]:
    return [e.phase for e in of_kind(events, kind)]


async def only_step(saver: Any, kind: str, scope: str) -> Step:
    steps = await call(saver.journal, "steps", kind, scope=scope)
    assert len(steps) == 1, steps
    return steps[0]


def charge_tool(kind: str, calls: list[int], *, delay: float = 0.0) -> Any:
    """A ``@tool @side_effect`` charge (async for async kinds) that appends to ``calls``
    each time it really runs, after ``delay`` seconds."""
    if is_async(kind):

        @tool
        @side_effect
        async def charge(amount: int) -> str:
            """Charge the customer's card."""
            calls.append(amount)
            await asyncio.sleep(delay)
            return f"charged {amount}"

    else:

        @tool
        @side_effect
        def charge(amount: int) -> str:  # type: ignore[misc]
            """Charge the customer's card."""
            calls.append(amount)
            time.sleep(delay)
            return f"charged {amount}"

    return charge


def asking_tools_graph(saver: Any, asking: AIMessage, tools: list[Any]) -> Any:
    """An agent node that answers ``asking`` (its tool calls), then a ToolNode."""
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [asking]})
    builder.add_node("tools", ToolNode(tools, handle_tool_errors=False))
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=saver)


def approve_tool(kind: str, *, delay: float) -> Any:
    """A tool that asks a human (interrupt) after ``delay`` seconds."""
    if is_async(kind):

        @tool
        async def approve(what: str) -> str:
            """Ask a human."""
            await asyncio.sleep(delay)
            return f"approved={interrupt(f'approve {what}?')}"

    else:

        @tool
        def approve(what: str) -> str:  # type: ignore[misc]
            """Ask a human."""
            time.sleep(delay)
            return f"approved={interrupt(f'approve {what}?')}"

    return approve


def charges_done(steps: list[Step]) -> int:
    return sum(1 for s in steps if s.kind == "tool" and s.name == "charge")


async def wait_for_completed_charges(saver: Any, kind: str, scope: str, n: int) -> None:
    """Wait until ``n`` charge steps of ``scope`` are completed.

    A tool that fails or interrupts the tools node waits for its sibling calls first, so
    that the node stops with their steps finished (as a sequential run would)."""
    for _ in range(2000):
        done = await call(saver.journal, "steps", kind, scope=scope, status=["completed"])
        if charges_done(done) >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{n} charges of {scope!r} never completed")


def wait_for_completed_charges_sync(saver: Any, scope: str, n: int) -> None:
    for _ in range(2000):
        if charges_done(saver.journal.steps(scope=scope, status=["completed"])) >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"{n} charges of {scope!r} never completed")


def set_steps_started(kind: str, db: dict[str, str], scope: str) -> int:
    """What a crash inside a call leaves behind: the step row back at ``started``, with no
    result and no end time. Plain SQL on a connection of its own; returns the row count."""
    sql = (
        "UPDATE agentcheck_steps SET status = 'started', finished_at = NULL, "
        "result_type = NULL, result = NULL, error = NULL WHERE scope = {p}"
    )
    if is_postgres(kind):
        with psycopg.connect(db["pg_url"], autocommit=True) as conn:
            return conn.execute(sql.format(p="%s"), (scope,)).rowcount
    with contextlib.closing(sqlite3.connect(db["sqlite_path"])) as conn, conn:
        return conn.execute(sql.format(p="?"), (scope,)).rowcount


# --------------------------------------------------------------------------- 1. interrupt


@parametrize_kinds
async def test_interrupt_resume_does_not_repeat_an_effect(kind: str, saver: Any) -> None:
    calls: list[int] = []
    charge = charge_fn(kind, calls)
    seen: list[Any] = []

    def after(result: Any) -> dict[str, Any]:
        seen.append(result)
        answer = interrupt("charged: confirm the order?")
        return {"out": [(result, answer)]}

    graph = one_node_graph(calling_node(kind, charge, (5,), after), saver)
    first = await call(graph, "invoke", kind, {"out": []}, config("t1"))
    assert first["__interrupt__"][0].value == "charged: confirm the order?"
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))

    assert calls == [5]
    assert seen == [{"charged": 5, "run": 1}] * 2
    assert final["out"] == [({"charged": 5, "run": 1}, "yes")]
    events = await call(saver.journal, "events", kind, "t1")
    tool_events = of_kind(events, "tool")
    assert [e.phase for e in tool_events] == ["start", "end", "replay"]
    assert {e.step_key for e in tool_events} == {tool_events[0].step_key}
    assert tool_events[0].payload == {"amount": 5}
    assert tool_events[1].payload == {"charged": 5, "run": 1}
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.attempts, step.result) == ("completed", 1, seen[0])


@parametrize_kinds
async def test_interrupts_after_a_replayed_call_that_asked_get_their_own_answers(
    kind: str, saver: Any
) -> None:
    """LangGraph matches answers to a task's interrupt() calls by their order. A replayed
    call asks nothing, so the questions after it moved up one and got the answer meant
    for the one before: bob's email was sent on the human's "no"."""
    sent: list[str] = []

    def decide(to: str, answer: Any) -> str:
        if answer != "yes":
            return f"NOT sent to {to}"
        sent.append(to)
        return f"sent to {to}"

    if is_async(kind):

        @side_effect
        async def send_email(to: str) -> str:
            return decide(to, interrupt(f"send the email to {to}?"))

        async def node(state: Log) -> dict[str, Any]:
            done = [await send_email("alice"), await send_email("bob")]
            return {"out": [*done, interrupt("anything else?")]}

    else:

        @side_effect
        def send_email(to: str) -> str:  # type: ignore[misc]
            return decide(to, interrupt(f"send the email to {to}?"))

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            done = [send_email("alice"), send_email("bob")]
            return {"out": [*done, interrupt("anything else?")]}

    graph = one_node_graph(node, saver)
    asked = await call(graph, "invoke", kind, {"out": []}, config("t1"))
    questions = [asked["__interrupt__"][0].value]
    for answer in ("yes", "no"):
        asked = await call(graph, "invoke", kind, Command(resume=answer), config("t1"))
        questions.append(asked["__interrupt__"][0].value)
    final = await call(graph, "invoke", kind, Command(resume="that's all"), config("t1"))

    assert questions == ["send the email to alice?", "send the email to bob?", "anything else?"]
    assert final["out"] == ["sent to alice", "NOT sent to bob", "that's all"]
    assert sent == ["alice"]
    steps = await call(saver.journal, "steps", kind, scope="t1")
    assert sorted((s.result, s.interrupts) for s in steps) == [
        ("NOT sent to bob", 1),
        ("sent to alice", 1),
    ]


class Unlisted:
    """A type on no allowlist: a result of it is recorded as its repr."""

    def __repr__(self) -> str:
        return "Unlisted()"


class NoRepr(Unlisted):
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Bulky(Unlisted):
    """One whose repr compresses (a small one is stored as is, being no smaller)."""

    def __repr__(self) -> str:
        return "Bulky(" + "x" * 500 + ")"


@parametrize_kinds
@pytest.mark.parametrize("stored", ["as is", "compressed", "encrypted"])
async def test_replayed_results_are_what_the_calls_returned_or_their_repr(
    kind: str, db: dict[str, str], stored: str
) -> None:
    """Tuples come back as tuples (a content_and_artifact tool must return a 2-tuple: its
    replay failed as a list); a value that cannot be stored safely comes back as its repr,
    and one whose repr raises is still recorded (the call has had its effect). Also when
    the rows are compressed or encrypted: a repr stored so was unreadable ("unknown
    serialization type tag 'repr'"), and the run could never go on."""
    options: dict[str, Any] = {
        "as is": {},
        "compressed": {"compress_threshold": 1},
        "encrypted": {"encryption_key": generate_key()},
    }[stored]
    async with open_saver(kind, **db, **options) as saver:
        await _replay_results(kind, saver)


async def _replay_results(kind: str, saver: Any) -> None:
    results = {
        "pair": ("found x", {"hits": [1, 2]}),
        "nested": {"k": (1, (2, "3")), "l": [(4,)]},
        "unlisted": Unlisted(),
        "no_repr": NoRepr(),
        "bulky": Bulky(),
    }
    runs: list[str] = []

    def body(what: str) -> Any:
        runs.append(what)
        return results[what]

    if is_async(kind):

        @side_effect
        async def fetch(what: str) -> Any:
            return body(what)

        async def node(state: Log) -> dict[str, Any]:
            got = {what: await fetch(what) for what in results}
            return {"out": [(got, interrupt("go on?"))]}

    else:

        @side_effect
        def fetch(what: str) -> Any:  # type: ignore[misc]
            return body(what)

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            got = {what: fetch(what) for what in results}
            return {"out": [(got, interrupt("go on?"))]}

    graph = one_node_graph(node, saver)
    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))
    (got, _) = final["out"][0]
    assert runs == list(results)  # each ran once, then was replayed
    assert got["pair"] == ("found x", {"hits": [1, 2]}) and type(got["pair"]) is tuple
    assert got["nested"] == {"k": (1, (2, "3")), "l": [(4,)]}
    assert type(got["nested"]["k"][1]) is tuple and type(got["nested"]["l"][0]) is tuple
    assert got["unlisted"] == "Unlisted()"
    assert got["no_repr"] == "<NoRepr: repr() raised RuntimeError>"
    assert got["bulky"] == repr(Bulky())
    steps = await call(saver.journal, "steps", kind, scope="t1")
    assert {s.status for s in steps} == {"completed"}


@parametrize_kinds
async def test_a_content_and_artifact_tool_replays_its_pair(kind: str, saver: Any) -> None:
    searches: list[str] = []

    if is_async(kind):

        @tool(response_format="content_and_artifact")
        @side_effect
        async def search(query: str) -> tuple[str, dict[str, Any]]:
            """Search the catalogue."""
            searches.append(query)
            return f"found {query}", {"hits": [1, 2]}

    else:

        @tool(response_format="content_and_artifact")
        @side_effect
        def search(query: str) -> tuple[str, dict[str, Any]]:  # type: ignore[misc]
            """Search the catalogue."""
            searches.append(query)
            return f"found {query}", {"hits": [1, 2]}

    tool_call = {"name": "search", "args": {"query": "x"}, "id": "c1", "type": "tool_call"}
    seen: list[ToolMessage] = []

    def after(message: ToolMessage) -> dict[str, Any]:
        seen.append(message)  # the tool's message, made from the (replayed) pair
        return {"out": [interrupt("ok?")]}

    if is_async(kind):

        async def node(state: Log) -> dict[str, Any]:
            return after(await search.ainvoke(tool_call))

    else:

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            return after(search.invoke(tool_call))

    graph = one_node_graph(node, saver)
    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))
    assert searches == ["x"]
    assert len(seen) == 2
    for message in seen:
        assert (message.content, message.artifact) == ("found x", {"hits": [1, 2]})


class Order(BaseModel):
    """A tool's argument of a class of this module (whose annotations are text)."""

    sku: str
    qty: int


@pytest.mark.parametrize("kind", ["sqlite", "async_sqlite"])
async def test_a_wrapped_tool_of_a_module_with_postponed_annotations(kind: str, saver: Any) -> None:
    """This module has ``from __future__ import annotations``: its annotations are text.
    @tool over @side_effect evaluated them in agentcheck's module, where a class of the
    tool's module (Order), ``Annotated`` or LangChain's InjectedToolCallId are not
    names: defining such a tool raised NameError. They are evaluated in the tool's own
    module now, as for a plain @tool: same schema, the argument validated into its
    class, the injected id given, the key hidden."""
    got: list[tuple[Order, str | None, str, str]] = []

    def record(order: Order, note: str | None, call_id: str, key: str) -> str:
        got.append((order, note, call_id, key))
        return f"charged {order.qty} x {order.sku}"

    # (One sync tool for both kinds: the annotations are read where either wrapper is
    # made, and an async graph runs a sync tool as well.)
    @tool
    @side_effect
    def charge(
        order: Order,
        call_id: Annotated[str, InjectedToolCallId],
        note: str | None = None,
        idempotency_key: str = "",
    ) -> str:
        """Charge an order."""
        return record(order, note, call_id, idempotency_key)

    @tool
    def plain(order: Order, note: str | None = None) -> str:
        """Charge an order."""
        return ""

    schema = charge.tool_call_schema.model_json_schema()
    assert schema["properties"] == plain.tool_call_schema.model_json_schema()["properties"]
    assert sorted(schema["properties"]) == ["note", "order"]

    asking = tool_call_message(("charge", {"order": {"sku": "tea", "qty": 2}}, "c1"))
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [asking]})
    builder.add_node("tools", ToolNode([charge]))
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(checkpointer=saver)
    final = await call(graph, "invoke", kind, {"messages": [HumanMessage("go")]}, config("t1"))
    assert final["messages"][-1].content == "charged 2 x tea"
    ((order, note, call_id, key),) = got
    assert (order, note, call_id) == (Order(sku="tea", qty=2), None, "c1")
    assert key.startswith("ac-")


async def charge_beside_a_jammed_printer(
    saver: Any, kind: str, decorate: Any, charge_seconds: float
) -> None:
    """An async ToolNode calls a charge and a printer; the printer jams on its first
    call, and the node's RetryPolicy runs both again at once, while the first charge
    (which the failed gather leaves running) is still running. The charge is made once,
    and both attempts answer with its result."""
    runs: list[str] = []
    jams: list[int] = []

    @tool
    @decorate
    async def charge(amount: int) -> str:
        """Charge the card."""
        runs.append("start")
        await asyncio.sleep(charge_seconds)
        runs.append("done")
        return f"charged {amount}"

    @tool
    async def printer(what: str) -> str:
        """Print a receipt."""
        jams.append(1)
        if len(jams) == 1:
            raise Flaky("paper jam")
        return "printed"

    asking = tool_call_message(("charge", {"amount": 1}, "c1"), ("printer", {"what": "x"}, "c2"))
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [asking]})
    tools = ToolNode([charge, printer], handle_tool_errors=False)
    builder.add_node("tools", tools, retry_policy=retry_twice())
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(checkpointer=saver)

    final = await graph.ainvoke({"messages": [HumanMessage("go")]}, config("t1"))
    answers = [m.content for m in final["messages"] if isinstance(m, ToolMessage)]
    assert answers == ["charged 1", "printed"]
    assert runs == ["start", "done"]  # once
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.result, step.attempts) == ("completed", "charged 1", 1)


@pytest.mark.parametrize("kind", ASYNC_KINDS)
@pytest.mark.parametrize("decorate", [side_effect, idempotent], ids=["side_effect", "idempotent"])
async def test_a_retried_tool_node_waits_for_a_sibling_still_running(
    kind: str, saver: Any, decorate: Any
) -> None:
    """The charge's step is started by a call still running in this process when the
    retry claims it. It was taken for a call cut short (ToolOutcomeUnknown for a side
    effect; an idempotent call ran twice at once); the retry now waits for it and
    replays its result."""
    await charge_beside_a_jammed_printer(saver, kind, decorate, charge_seconds=0.3)


@pytest.mark.parametrize("kind", ASYNC_KINDS)
@pytest.mark.parametrize("decorate", [side_effect, idempotent], ids=["side_effect", "idempotent"])
async def test_a_retry_that_looks_just_after_the_first_call_claimed_waits_for_it(
    kind: str, saver: Any, decorate: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above failed now and then: the first charge was known as running only
    once its protocol went on after its claim's commit, and the retry's charge, which
    looked in between, took the claim for one cut short (ToolOutcomeUnknown for a side
    effect; an idempotent charge ran twice). Here the first claim's answer comes back
    late on purpose, so the retry always looks in between: a call is now known as
    running before it claims."""
    journal = saver.journal
    arun_op = journal.arun_op
    held: list[bool] = []

    async def first_claim_late(make_op: Any, write: bool, durable: bool = True) -> Any:
        result = await arun_op(make_op, write, durable=durable)
        if isinstance(result, Claim) and result.owned and not held:
            held.append(True)
            await asyncio.sleep(0.3)  # the node fails and its retry claims meanwhile
        return result

    monkeypatch.setattr(journal, "arun_op", first_claim_late)
    await charge_beside_a_jammed_printer(saver, kind, decorate, charge_seconds=0.05)
    assert held == [True]


@parametrize_kinds
@pytest.mark.parametrize(
    ("updates", "prune", "same_base"),
    [(1, False, False), (2, False, False), (1, True, False), (2, True, True)],
)
async def test_update_state_while_paused_does_not_repeat_an_effect(
    kind: str, saver: Any, updates: int, prune: bool, same_base: bool
) -> None:
    """A reviewer edits the state of a node paused after its charge (update_state), then
    resumes it: LangGraph runs the node as a new task of the update's checkpoint, whose
    calls got new keys, so the card was charged twice, under two keys. With ``prune``,
    prune(keep_latest) runs between the edit and the resume: it keeps the checkpoint
    the edit was made over (with the paused task's writes), which the resumed task needs
    to go on with it, and deletes the older ones. With ``same_base``, each edit is of
    the paused checkpoint itself (two edits side by side, not one over the other): an
    edit beside it is no step the run went on to, so it is no fork either."""
    calls: list[int] = []
    charge = charge_fn(kind, calls)

    def after(result: Any) -> dict[str, Any]:
        return {"out": [result, interrupt("review the order?")]}

    graph = one_node_graph(calling_node(kind, charge, (5,), after), saver)
    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    paused = await collect(saver, "list", kind, config("t1"))
    for i in range(updates):
        edited = paused[0].config if same_base else config("t1")
        await call(graph, "update_state", kind, edited, {"out": [f"note {i}"]})
    if prune:
        await call(saver, "prune", kind, ["t1"], strategy="keep_latest")
        kept = await collect(saver, "list", kind, config("t1"))
        assert [t.config for t in kept[1:]] == [paused[0].config] and len(paused) > 1
    final = await call(graph, "invoke", kind, Command(resume="approved"), config("t1"))

    assert calls == [5]
    assert final["out"][-2:] == [{"charged": 5, "run": 1}, "approved"]
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.attempts) == ("completed", 1)
    events = await call(saver.journal, "events", kind, "t1")
    assert phases(events) == ["start", "end", "replay"]


class Fan(TypedDict, total=False):
    items: list[dict[str, Any]]
    out: Annotated[list[Any], operator.add]


def fan_out_graph(kind: str, charge: Any, saver: Any, *, as_calls: str = "") -> Any:
    """plan -> one Send to ``work`` per item; each charges its amount, and an item with
    ``ask`` then asks a human. ``as_calls``: each Send also carries a tool call. "own":
    its own, beside the whole list of items (as hand-built tool-calling agents send the
    state along), which an edit of the items changes in every Send; "shared": one call
    that all the Sends answer, which tells none of them apart."""

    def after(item: dict[str, Any]) -> Callable[[Any], dict[str, Any]]:
        def done(receipt: Any) -> dict[str, Any]:
            if item.get("ask"):
                interrupt("approve the big one?")
            return {"out": [(item["amount"], receipt["run"])]}

        return done

    def node_for(state: Fan) -> Any:
        [item] = state["items"]
        return calling_node(kind, charge, (item["amount"],), after(item))

    if is_async(kind):

        async def work(state: Fan) -> Any:
            return await node_for(state)(state)

    else:

        def work(state: Fan) -> Any:  # type: ignore[misc]
            return node_for(state)(state)

    builder = StateGraph(Fan)
    builder.add_node("plan", lambda state: {})
    builder.add_node("work", work)
    builder.add_edge(START, "plan")

    def fan_out(state: Fan) -> list[Send]:
        if not as_calls:
            return [Send("work", {"items": [item]}) for item in state["items"]]
        carried = {"all": state["items"]} if as_calls == "own" else {}
        return [
            Send("work", {"items": [item], **carried, "call": tool_call(item)})
            for item in state["items"]
        ]

    def tool_call(item: dict[str, Any]) -> dict[str, Any]:
        call_id = "call-all" if as_calls == "shared" else f"call-{item['amount']}"
        return {"name": "work", "args": item, "id": call_id, "type": "tool_call"}

    builder.add_conditional_edges("plan", fan_out)
    builder.add_edge("work", END)
    return builder.compile(checkpointer=saver)


@parametrize_kinds
@pytest.mark.parametrize(
    ("edited", "charged"),
    [
        # a new item first: every Send is at another index; only the new one charges
        ([7, 5, "big"], [5, 99, 7]),
        # a second item equal to one that ran: its own Send, its own charge
        ([5, 5, "big"], [5, 99, 5]),
        # the same Sends again: all replay
        ([5, "big"], [5, 99]),
        # equal by value (5.0 is 5), one added: only the new one charges
        ([5.0, "big", 7], [5, 99, 7]),
        # Sends carrying every item and a tool call each: the first item dropped changes
        # every Send but the call ids; the paused one replays its charge
        (["big", "own"], [5, 99]),
        # every Send carrying the one tool call they all answer: a new item first still
        # charges, and each of the others replays its own receipt
        ([7, 5, "big", "shared"], [5, 99, 7]),
        # ... and one Send left: the call is its alone now, not before; it replays
        (["big", "shared"], [5, 99]),
    ],
    ids=[
        "new-first",
        "equal-added",
        "unchanged",
        "equal-by-value",
        "tool-calls",
        "one-call",
        "one-call-left",
    ],
)
async def test_an_edit_of_the_sends_pairs_each_with_the_same_send_before(
    kind: str, saver: Any, edited: list[Any], charged: list[int]
) -> None:
    """Sends paused beside one that asks a human; the planner's edit (update_state as
    ``plan``) sends them again, maybe changed. Each Send goes on with the same Send of
    before, one to one, wherever it now is: a Send new there, or a second one equal to
    one that ran, makes its call; the others replay theirs."""
    calls: list[int] = []
    as_calls = next((i for i in edited if i in ("own", "shared")), "")
    graph = fan_out_graph(kind, charge_fn(kind, calls), saver, as_calls=as_calls)
    big = {"amount": 99, "ask": True}
    await call(graph, "invoke", kind, {"items": [{"amount": 5}, big]}, config("t1"))
    assert sorted(calls) == [5, 99]
    items = [big if i == "big" else {"amount": i} for i in edited if i not in ("own", "shared")]
    await call(graph, "update_state", kind, config("t1"), {"items": items}, as_node="plan")
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))

    assert sorted(calls) == sorted(charged)
    receipts = [run for _, run in final["out"]]
    assert len(set(receipts)) == len(receipts) == len(items)  # no call's result twice


@parametrize_kinds
@no_deprecation_noise
async def test_an_edit_while_a_prebuilt_agents_tool_asks_does_not_repeat_a_charge(
    kind: str, saver: Any
) -> None:
    """create_react_agent sends each tool call as its own task, the graph's state in its
    argument. An edit of the state while one tool asks a human sends them again with the
    new state: each is still the same tool call (its id), so the completed charge
    replays."""
    calls: list[int] = []

    @tool
    @side_effect
    def charge(amount: int) -> str:
        """Charge the card."""
        calls.append(amount)
        return f"charged {amount} (run {len(calls)})"

    @tool
    def approve(what: str) -> str:
        """Ask a human."""
        return f"approved={interrupt(f'approve {what}?')}"

    class Noted(AgentState):
        note: str

    model = ScriptedChatModel(
        responses=[
            tool_call_message(("charge", {"amount": 5}, "c1"), ("approve", {"what": "it"}, "c2")),
            AIMessage("done"),
        ]
    )
    agent = create_react_agent(model, [charge, approve], checkpointer=saver, state_schema=Noted)
    start = {"messages": [HumanMessage("buy")], "note": ""}
    await call(agent, "invoke", kind, start, config("t1"))
    assert calls == [5]
    await call(agent, "update_state", kind, config("t1"), {"note": "checked"})
    final = await call(agent, "invoke", kind, Command(resume="yes"), config("t1"))

    assert calls == [5]
    tool_messages = [m.content for m in final["messages"] if isinstance(m, ToolMessage)]
    assert tool_messages == ["charged 5 (run 1)", "approved=yes"]


@parametrize_kinds
async def test_two_edits_each_before_an_answer_do_not_repeat_an_effect(
    kind: str, saver: Any
) -> None:
    """A node charges, then asks two questions; a reviewer edits the state before each
    answer. The second resume's task goes on with the first resume's, which itself went
    on with the task that charged: its calls were keyed after the first resume's task,
    and the card was charged a second time under a new key."""
    calls: list[int] = []
    charge = charge_fn(kind, calls)

    def after(result: Any) -> dict[str, Any]:
        return {"out": [result, interrupt("approve?"), interrupt("confirm?")]}

    graph = one_node_graph(calling_node(kind, charge, (5,), after), saver)
    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    await call(graph, "update_state", kind, config("t1"), {"out": ["note 1"]})
    paused = await call(graph, "invoke", kind, Command(resume="approved"), config("t1"))
    assert [i.value for i in paused["__interrupt__"]] == ["confirm?"]
    await call(graph, "update_state", kind, config("t1"), {"out": ["note 2"]})
    # LangGraph starts the node over with this answer only (the first went with the task
    # the edit replaced), so it asks again, as it does with no agentcheck saver.
    again = await call(graph, "invoke", kind, Command(resume="confirmed"), config("t1"))
    assert [i.value for i in again["__interrupt__"]] == ["confirm?"]
    assert calls == [5]
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))

    assert calls == [5]
    assert final["out"][-3:] == [{"charged": 5, "run": 1}, "confirmed", "yes"]
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.attempts) == ("completed", 1)


@parametrize_kinds
async def test_an_edit_while_a_sibling_is_paused_does_not_repeat_a_finished_nodes_effect(
    kind: str, saver: Any
) -> None:
    """Two nodes run side by side: one charges and finishes, the other asks a human. A
    reviewer edits the state, then answers. LangGraph runs both nodes again as tasks of
    the edit's checkpoint (the finished one's writes are not carried over), and the
    finished node's charge ran a second time, under a new key."""
    calls: list[int] = []
    charge = charge_fn(kind, calls)
    builder = StateGraph(Log)
    builder.add_node("pay", calling_node(kind, charge, (5,), lambda r: {"out": [r]}))
    builder.add_node("ask", lambda state: {"out": [interrupt("approve?")]})
    builder.add_edge(START, "pay")
    builder.add_edge(START, "ask")
    builder.add_edge("pay", END)
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)

    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    await call(graph, "update_state", kind, config("t1"), {"out": ["note"]})
    final = await call(graph, "invoke", kind, Command(resume="approved"), config("t1"))

    assert calls == [5]
    assert sorted(map(str, final["out"])) == sorted(
        map(str, ["note", {"charged": 5, "run": 1}, "approved"])
    )
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.attempts) == ("completed", 1)


@parametrize_kinds
async def test_an_edit_while_a_send_branch_is_paused_repeats_no_branchs_effect(
    kind: str, saver: Any
) -> None:
    """Three Send branches of one node each charge; the second then asks a human. A
    reviewer edits the state, then answers. LangGraph runs all three branches again as
    new tasks, and every charge ran a second time: the branches of one node could not be
    told apart. Each now goes on with the branch of the same Send (its task's path)."""
    calls: list[int] = []
    charge = charge_fn(kind, calls)

    def after(i: int) -> Callable[[Any], dict[str, Any]]:
        def then(result: Any) -> dict[str, Any]:
            answer = interrupt("approve?") if i == 1 else None
            return {"out": [(i, result["charged"], answer)]}

        return then

    if is_async(kind):

        async def branch(state: dict[str, Any]) -> dict[str, Any]:
            return after(state["i"])(await charge(state["amount"]))

    else:

        def branch(state: dict[str, Any]) -> dict[str, Any]:  # type: ignore[misc]
            return after(state["i"])(charge(state["amount"]))

    def fan(state: Log) -> list[Send]:
        return [Send("branch", {"i": i, "amount": 10 * (i + 1)}) for i in range(3)]

    builder = StateGraph(Log)
    builder.add_node("branch", branch)
    builder.add_conditional_edges(START, fan)
    builder.add_edge("branch", END)
    graph = builder.compile(checkpointer=saver)

    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    assert sorted(calls) == [10, 20, 30]
    await call(graph, "update_state", kind, config("t1"), {"out": ["note"]})
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))

    assert sorted(calls) == [10, 20, 30]  # none again
    branches = sorted(tuple(x) for x in final["out"] if x != "note")
    assert branches == [(0, 10, None), (1, 20, "yes"), (2, 30, None)]
    steps = await call(saver.journal, "steps", kind, scope="t1")
    assert sorted((s.status, s.attempts) for s in steps) == [("completed", 1)] * 3


@parametrize_kinds
@pytest.mark.parametrize("first", ["resumed", "edited, then resumed", "resumed, then pruned"])
async def test_an_edit_of_an_older_checkpoint_is_a_fork_whose_calls_are_new(
    kind: str, saver: Any, first: str
) -> None:
    """update_state on a checkpoint the run has gone on from (time travel) starts a new
    branch: its node runs as a new task, and its calls run, under new keys, whether the
    run went on from it directly or through an earlier edit of it. Only an edit of the
    step a run is paused at goes on with the task that ran there. A prune between the
    fork and its run (keep_latest) must not make it look like such an edit."""
    calls: list[int] = []
    charge = charge_fn(kind, calls)

    def after(result: Any) -> dict[str, Any]:
        return {"out": [result, interrupt("approve?")]}

    graph = one_node_graph(calling_node(kind, charge, (5,), after), saver)
    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    paused_at = (await call(graph, "get_state", kind, config("t1"))).config
    if first != "resumed":
        await call(graph, "update_state", kind, config("t1"), {"out": ["first edit"]})
    await call(graph, "invoke", kind, Command(resume="approved"), config("t1"))
    assert calls == [5]

    fork = await call(graph, "update_state", kind, paused_at, {"out": ["retry"]})
    if first.endswith("pruned"):
        await call(saver, "prune", kind, ["t1"], strategy="keep_latest")
    forked = await call(graph, "invoke", kind, None, fork)
    assert [i.value for i in forked["__interrupt__"]] == ["approve?"]
    assert calls == [5, 5]
    steps = await call(saver.journal, "steps", kind, scope="t1")
    assert len({step.idempotency_key for step in steps}) == 2


@parametrize_kinds
async def test_a_call_counts_only_its_own_questions_not_a_sibling_tools(
    kind: str, saver: Any
) -> None:
    """Two tool calls of one ToolNode step run side by side: a slow charge that asks
    nothing, and an approval that asks while the charge runs. The charge recorded the
    approval's question as its own, its replay passed over it, and the resume failed
    inside LangGraph's interrupt()."""
    calls: list[int] = []
    charge = charge_tool(kind, calls, delay=0.3)
    approve = approve_tool(kind, delay=0.1)

    asking = tool_call_message(
        ("charge", {"amount": 5}, "call_a"), ("approve", {"what": "order"}, "call_b")
    )
    graph = asking_tools_graph(saver, asking, [charge, approve])

    paused = await call(graph, "invoke", kind, {"messages": []}, config("t1"))
    assert [i.value for i in paused["__interrupt__"]] == ["approve order?"]
    # (An async node stops at the interrupt while the charge still runs: the resume
    # waits for it, see test_a_retried_tool_node_waits_for_a_sibling_still_running.)
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))
    answers = [m.content for m in final["messages"] if isinstance(m, ToolMessage)]
    assert answers == ["charged 5", "approved=yes"]
    assert calls == [5]
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.interrupts) == ("completed", 0)


@parametrize_kinds
async def test_tools_that_invoke_a_wrapped_tool_side_by_side_replay_their_own_results(
    kind: str, saver: Any
) -> None:
    """Two checkout tool calls of one ToolNode step each invoke the wrapped charge tool;
    a third asks a human. The charge runs had no tool-call id of their own (only the
    checkouts have one), so they were keyed by the order they started in: c2's charge
    started first at the first run, c1's at the resume, and c1 replayed c2's charge."""
    charges: list[int] = []
    first_run = [True]

    def delay(amount: int) -> float:
        # c1 (amount 1) is the slower one at the first run, the faster one at the resume.
        return 0.2 if (amount == 1) == first_run[0] else 0.0

    charge = charge_tool(kind, charges)
    approve = approve_tool(kind, delay=0.3)

    if is_async(kind):

        @tool
        async def checkout(amount: int) -> str:
            """Check out."""
            await asyncio.sleep(delay(amount))
            return str(await charge.ainvoke({"amount": amount}))

    else:

        @tool
        def checkout(amount: int) -> str:  # type: ignore[misc]
            """Check out."""
            time.sleep(delay(amount))
            return str(charge.invoke({"amount": amount}))

    asking = tool_call_message(
        ("checkout", {"amount": 1}, "c1"),
        ("checkout", {"amount": 2}, "c2"),
        ("approve", {"what": "order"}, "c3"),
    )
    graph = asking_tools_graph(saver, asking, [checkout, approve])

    paused = await call(graph, "invoke", kind, {"messages": []}, config("t1"))
    assert [i.value for i in paused["__interrupt__"]] == ["approve order?"]
    assert charges == [2, 1]
    first_run[0] = False
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))
    answers = {m.tool_call_id: m.content for m in final["messages"] if isinstance(m, ToolMessage)}
    assert answers == {"c1": "charged 1", "c2": "charged 2", "c3": "approved=yes"}
    assert charges == [2, 1]  # replayed, not run again
    steps = await call(saver.journal, "steps", kind, scope="t1")
    assert sorted(step.step_key.rpartition("|")[2] for step in steps) == [
        "tool:charge@c1#0",
        "tool:charge@c2#0",
    ]


class Looped(TypedDict, total=False):
    out: Annotated[list[Any], operator.add]
    n: int


@parametrize_kinds
@pytest.mark.parametrize("updates", [("x",), ("y", "x")], ids=["as-x", "as-y-then-x"])
async def test_a_new_run_of_a_node_after_update_state_as_that_node_makes_its_calls(
    kind: str, saver: Any, updates: tuple[str, ...]
) -> None:
    """update_state(as_node=<the paused node>) says the node is done: the node that runs
    next (a loop back to it) is a new run, whose calls are new (it got the paused run's
    keys, and its charge of 20 returned the recorded charge of 10 without running)."""
    calls: list[int] = []
    charge = charge_fn(kind, calls)

    def after(n: int) -> Callable[[Any], dict[str, Any]]:
        return lambda result: {"out": [result, interrupt(f"approve {n}?")], "n": n}

    if is_async(kind):

        async def step(state: Looped) -> dict[str, Any]:
            n = state.get("n", 0) + 1
            return after(n)(await charge(10 * n))

    else:

        def step(state: Looped) -> dict[str, Any]:  # type: ignore[misc]
            n = state.get("n", 0) + 1
            return after(n)(charge(10 * n))

    builder = StateGraph(Looped)
    builder.add_node("x", step)
    builder.add_node("y", lambda state: {})
    builder.add_edge(START, "x")
    builder.add_conditional_edges("x", lambda s: "x" if s.get("n", 0) < 2 else END, ["x", END])
    builder.add_edge("y", END)
    graph = builder.compile(checkpointer=saver)
    await call(graph, "invoke", kind, {"out": [], "n": 0}, config("t1"))
    done = {"out": ["reviewed"], "n": 1}
    for node in updates:  # as y: x is not pending any more; then as x: x runs anew
        await call(graph, "update_state", kind, config("t1"), done, as_node=node)
    asked = await call(graph, "invoke", kind, None, config("t1"))

    assert asked["__interrupt__"][0].value == "approve 2?"
    assert calls == [10, 20]


@parametrize_kinds
async def test_durable_model_of_a_model_that_cannot_stream_streams_its_answer(
    kind: str, saver: Any
) -> None:
    """A chat model with no _stream of its own (LangChain then calls _generate): the
    wrapper claimed it could stream, and stream_mode="messages" raised
    NotImplementedError."""
    inner = FakeMessagesListChatModel(responses=[AIMessage("hi there"), AIMessage("again")])
    model = durable_model(inner)

    def node(state: MessagesState) -> dict[str, Any]:
        answer = model.invoke(state["messages"])
        interrupt("go on?")
        return {"messages": [answer]}

    if is_async(kind):

        async def anode(state: MessagesState) -> dict[str, Any]:
            answer = await model.ainvoke(state["messages"])
            interrupt("go on?")
            return {"messages": [answer]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", anode if is_async(kind) else node)
    builder.add_edge(START, "chat")
    builder.add_edge("chat", END)
    graph = builder.compile(checkpointer=saver)
    chunks = await stream(
        graph, kind, {"messages": [HumanMessage("hi")]}, config("t1"), stream_mode="messages"
    )
    assert [c[0].content for c in chunks] == ["hi there"]
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))
    assert final["messages"][-1].content == "hi there"
    assert inner.i == 1  # called once (the next answer would be "again"), then replayed


@parametrize_kinds
async def test_a_call_retried_inside_the_node_is_not_made_again_after_a_resume(
    kind: str, saver: Any
) -> None:
    """The node retries a charge that raised (its own loop), then asks a human. On the
    resume the first, failed call ran again (a failed step runs again), succeeded, and
    charged a second time, never reaching the recorded retry. A failed call whose retry
    (a later call of the same name, with the same arguments) completed now returns the
    retry's recorded result."""
    calls: list[int] = []
    charge = charge_fn(kind, calls, fail_first=1)

    def after(result: Any) -> dict[str, Any]:
        return {"out": [result, interrupt("ship it?")]}

    if is_async(kind):

        async def node(state: Log) -> dict[str, Any]:
            for _ in range(3):
                try:
                    return after(await charge(5))
                except Flaky:
                    continue
            raise AssertionError("unreachable")

    else:

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            for _ in range(3):
                try:
                    return after(charge(5))
                except Flaky:
                    continue
            raise AssertionError("unreachable")

    graph = one_node_graph(node, saver)
    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    assert calls == [5, 5]  # failed, then charged
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))
    assert calls == [5, 5]
    assert final["out"][-2:] == [{"charged": 5, "run": 2}, "yes"]
    steps = await call(saver.journal, "steps", kind, scope="t1")
    assert sorted(s.status for s in steps) == ["completed", "failed"]


@parametrize_kinds
async def test_a_node_retry_after_its_own_retries_failed_retries_them_for_real(
    kind: str, saver: Any
) -> None:
    """The node tries a charge three times, then gives up (raises); a RetryPolicy runs
    the node again. Those failures were followed by no success, so the second attempt's
    calls run for real, not as replays of the first attempt's failures (which would
    leave it one real try instead of three)."""
    calls: list[int] = []
    charge = charge_fn(kind, calls, fail_first=4)

    if is_async(kind):

        async def node(state: Log) -> dict[str, Any]:
            for attempt in range(3):
                try:
                    return {"out": [await charge(5)]}
                except Flaky:
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    else:

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            for attempt in range(3):
                try:
                    return {"out": [charge(5)]}
                except Flaky:
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    graph = one_node_graph(node, saver, retry=retry_twice())
    final = await call(graph, "invoke", kind, {"out": []}, config("t1"))
    assert calls == [5] * 5  # 3 failures, then in the node's second attempt 1 more and 1 good
    assert final["out"] == [{"charged": 5, "run": 5}]


@parametrize_kinds
async def test_a_failed_call_followed_by_another_call_of_the_name_runs_again(
    kind: str, saver: Any
) -> None:
    """A charge to one card fails (the node goes on), a charge to another completes,
    then the node fails and its RetryPolicy runs it again: the later charge, with other
    arguments, is no retry of the failed one, which runs again (and goes through)."""
    calls: list[int] = []
    charge = charge_fn(kind, calls, fail_first=1)
    node_runs: list[int] = []

    def finish(results: list[Any]) -> dict[str, Any]:
        node_runs.append(1)
        if len(node_runs) == 1:
            raise Flaky("the node's own trouble, after both charges")
        return {"out": results}

    if is_async(kind):

        async def node(state: Log) -> dict[str, Any]:
            results: list[Any] = []
            for amount in (1, 2):
                try:
                    results.append(await charge(amount))
                except Flaky:
                    results.append("declined")
            return finish(results)

    else:

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            results: list[Any] = []
            for amount in (1, 2):
                try:
                    results.append(charge(amount))
                except Flaky:
                    results.append("declined")
            return finish(results)

    graph = one_node_graph(node, saver, retry=retry_twice())
    final = await call(graph, "invoke", kind, {"out": []}, config("t1"))
    assert calls == [1, 2, 1]  # the declined charge tried again; the other replayed
    assert final["out"] == [{"charged": 1, "run": 3}, {"charged": 2, "run": 2}]


class ProviderError(Exception):
    """Like a provider SDK's error: its constructor wants more than a message."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class RateLimited(BaseChatModel):
    """Answers "answer <n>" with n its real calls, after refusing the first (a 429)."""

    calls: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "rate-limited"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.calls.append(str(messages[-1].content))
        if len(self.calls) == 1:
            raise ProviderError("rate limited", status=429)
        answer = AIMessage(f"answer {len(self.calls)}")
        return ChatResult(generations=[ChatGeneration(message=answer)])


@parametrize_kinds
async def test_a_model_call_retried_with_with_retry_is_not_paid_again_after_a_resume(
    kind: str, saver: Any
) -> None:
    """durable_model(model).with_retry() around a provider that refuses the first call:
    on the resume the refused call was made again, succeeded, and was paid for (a
    different answer than the one recorded, whose tool calls would have new ids)."""
    inner = RateLimited(calls=[])
    model = durable_model(inner).with_retry(
        retry_if_exception_type=(ProviderError,),  # raised again as its own class
        stop_after_attempt=3,
        wait_exponential_jitter=False,
    )

    def after(answer: Any) -> dict[str, Any]:
        return {"out": [answer.content, interrupt("send it?")]}

    if is_async(kind):

        async def node(state: Log) -> dict[str, Any]:
            return after(await model.ainvoke("hello"))

    else:

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            return after(model.invoke("hello"))

    graph = one_node_graph(node, saver)
    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    assert len(inner.calls) == 2
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))
    assert len(inner.calls) == 2  # not paid again
    assert final["out"][-2:] == ["answer 2", "yes"]


@parametrize_kinds
async def test_node_retry_does_not_repeat_a_completed_effect(kind: str, saver: Any) -> None:
    calls: list[int] = []
    charge = charge_fn(kind, calls)
    attempts: list[Any] = []

    def after(result: Any) -> dict[str, Any]:
        attempts.append(result)
        if len(attempts) == 1:
            raise Flaky("the node fails after the charge")
        return {"out": [result]}

    graph = one_node_graph(calling_node(kind, charge, (7,), after), saver, retry=retry_twice())
    final = await call(graph, "invoke", kind, {"out": []}, config("t1"))

    assert calls == [7]
    assert attempts == [{"charged": 7, "run": 1}] * 2
    assert final["out"] == [{"charged": 7, "run": 1}]
    events = await call(saver.journal, "events", kind, "t1")
    assert phases(events) == ["start", "end", "replay"]
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.attempts) == ("completed", 1)


@parametrize_kinds
async def test_node_retry_reruns_an_effect_that_raised(kind: str, saver: Any) -> None:
    calls: list[int] = []
    charge = charge_fn(kind, calls, fail_first=1)
    graph = one_node_graph(
        calling_node(kind, charge, (9,), lambda r: {"out": [r]}), saver, retry=retry_twice()
    )
    final = await call(graph, "invoke", kind, {"out": []}, config("t1"))

    assert calls == [9, 9]
    assert final["out"] == [{"charged": 9, "run": 2}]
    events = await call(saver.journal, "events", kind, "t1")
    assert phases(events) == ["start", "error", "start", "end"]
    error = of_kind(events, "tool")[1].error
    assert error is not None and "Flaky" in error and "card network down" in error
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.attempts, step.error) == ("completed", 2, None)
    assert step.result == {"charged": 9, "run": 2}


# --------------------------------------------------------------------------- 3. @tool and keys


def email_tool(kind: str, keys: list[str], inside: list[str | None]) -> Any:
    """``send_email`` under ``@tool``, failing on its first run, recording its keys."""

    def body(to: str, idempotency_key: str) -> str:
        keys.append(idempotency_key)
        inside.append(current_idempotency_key())
        if len(keys) == 1:
            raise ConnectionError("the mail server is down")
        return f"sent to {to}"

    if is_async(kind):

        @tool
        @side_effect
        async def send_email(to: str, subject: str, idempotency_key: str) -> str:
            """Send an email to someone."""
            return body(to, idempotency_key)

    else:

        @tool
        @side_effect
        def send_email(to: str, subject: str, idempotency_key: str) -> str:  # type: ignore[misc]
            """Send an email to someone."""
            return body(to, idempotency_key)

    return send_email


@pytest.mark.parametrize("kind", ["sqlite", "async_sqlite"], ids=["sync", "async"])
def test_tool_schema_hides_the_idempotency_key_and_keeps_the_description(kind: str) -> None:
    send_email = email_tool(kind, [], [])
    assert send_email.name == "send_email"
    assert send_email.description == "Send an email to someone."
    assert set(send_email.args) == {"to", "subject"}
    schema = send_email.tool_call_schema.model_json_schema()
    assert set(schema["properties"]) == {"to", "subject"}
    assert "idempotency_key" not in schema.get("required", [])
    assert "idempotency_key" not in str(send_email.args_schema.model_json_schema())
    assert (send_email.coroutine if is_async(kind) else send_email.func) is not None


def test_decorated_function_keeps_name_doc_and_a_signature_without_the_key() -> None:
    @side_effect
    def refund(order: str, cents: int, idempotency_key: str) -> str:
        """Refund an order."""
        return idempotency_key

    assert refund.__name__ == "refund"
    assert refund.__doc__ == "Refund an order."
    assert list(inspect.signature(refund).parameters) == ["order", "cents"]


@parametrize_kinds
async def test_idempotency_key_is_stable_across_resume_and_is_the_current_key(
    kind: str, saver: Any
) -> None:
    keys: list[str] = []
    inside: list[str | None] = []
    send_email = email_tool(kind, keys, inside)
    args = {"to": "ann@example.com", "subject": "hello"}

    def finish(sent: str | None) -> dict[str, Any]:
        if sent is None:
            interrupt("the mail server is down: try again?")
        return {"out": [sent]}

    if is_async(kind):

        async def node(state: Log) -> dict[str, Any]:
            try:
                sent = await send_email.ainvoke(args)
            except ConnectionError:
                sent = None
            return finish(sent)

    else:

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            try:
                sent = send_email.invoke(args)
            except ConnectionError:
                sent = None
            return finish(sent)

    graph = one_node_graph(node, saver)
    first = await call(graph, "invoke", kind, {"out": []}, config("t1"))
    assert "__interrupt__" in first
    final = await call(graph, "invoke", kind, Command(resume="retry"), config("t1"))

    assert final["out"] == ["sent to ann@example.com"]
    assert len(keys) == 2 and keys[0] == keys[1]
    assert keys[0].startswith("ac-")
    assert inside == keys
    assert current_idempotency_key() is None
    step = await only_step(saver, kind, "t1")
    assert step.idempotency_key == keys[0]
    assert (step.status, step.attempts, step.args) == ("completed", 2, args)


@parametrize_kinds
async def test_two_calls_in_one_node_get_different_keys(kind: str, saver: Any) -> None:
    keys: list[str] = []

    if is_async(kind):

        @side_effect
        async def notify(who: str, idempotency_key: str) -> str:
            keys.append(idempotency_key)
            return who

        async def node(state: Log) -> dict[str, Any]:
            return {"out": [await notify("a"), await notify("b")]}

    else:

        @side_effect
        def notify(who: str, idempotency_key: str) -> str:  # type: ignore[misc]
            keys.append(idempotency_key)
            return who

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            return {"out": [notify("a"), notify("b")]}

    await call(one_node_graph(node, saver), "invoke", kind, {"out": []}, config("t1"))
    steps = await call(saver.journal, "steps", kind, scope="t1")
    assert len(set(keys)) == 2
    assert sorted(s.idempotency_key for s in steps) == sorted(keys)
    assert sorted(s.step_key.rsplit("|", 1)[1] for s in steps) == [
        "tool:notify#0",
        "tool:notify#1",
    ]


@parametrize_kinds
async def test_a_long_task_keeps_its_call_numbers_while_many_others_run(
    kind: str, saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-attempt call counters outlive any number of other attempts: a task whose
    counters were dropped numbered its second charge #0, got its first charge's key and
    returned that charge's result without charging (helper repro: 4,200 other runs)."""
    monkeypatch.setattr(attempt_counters, "min_size", 8)
    monkeypatch.setattr(attempt_counters, "size", 8)
    monkeypatch.setattr(attempt_counters, "entries", type(attempt_counters.entries)())
    calls: list[int] = []
    charge = charge_fn(kind, calls)
    lookups: list[int] = []
    lookup = charge_fn(kind, lookups, decorate=idempotent)
    go_on = threading.Event()

    if is_async(kind):

        async def checkout(state: Log) -> dict[str, Any]:
            first = await charge(1)
            while not go_on.is_set():
                await asyncio.sleep(0.001)
            return {"out": [first, await charge(2)]}

    else:

        def checkout(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            first = charge(1)
            assert go_on.wait(60)
            return {"out": [first, charge(2)]}

    slow = one_node_graph(checkout, saver)
    fast = one_node_graph(calling_node(kind, lookup, (0,), lambda r: {"out": [r]}), saver)

    async def others() -> None:
        while not calls:
            await asyncio.sleep(0.001)
        for i in range(40):  # other conversations served meanwhile
            await call(fast, "invoke", kind, {"out": []}, config(f"other-{i}"))
        go_on.set()

    if is_async(kind):
        result, _ = await asyncio.gather(slow.ainvoke({"out": []}, config("t1")), others())
    else:
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(slow.invoke, {"out": []}, config("t1"))
            await others()
            result = future.result(60)
    assert calls == [1, 2]
    assert [r["charged"] for r in result["out"]] == [1, 2]
    assert len(lookups) == 40


def test_the_attempt_registry_drops_only_attempts_nobody_holds() -> None:
    class Attempt:
        pass

    registry = _AttemptRegistry(size=4)
    live = [Attempt() for _ in range(6)]
    for attempt in live:
        registry.counters_for(attempt)["tool:x"] = 1
    for _ in range(20):  # ended attempts: nothing else holds them
        registry.counters_for(Attempt())["tool:x"] = 1
    assert all(registry.counters_for(a) == {"tool:x": 1} for a in live)
    assert len(registry.entries) <= 2 * len(live) + 1


# --------------------------------------------------------------------------- 4. ToolNode


def third_tool(kind: str, saver: Any, thread_id: str, how: str) -> Any:
    """A tool that, once both charges are recorded, interrupts or fails once."""
    runs: list[str] = []

    def act(what: str) -> str:
        runs.append(what)
        if how == "interrupt":
            return str(interrupt(f"approve {what}?"))
        if len(runs) == 1:
            raise Flaky("the receipt printer jammed")
        return f"printed {what}"

    if is_async(kind):

        @tool
        async def receipt(what: str) -> str:
            """Print or approve a receipt."""
            await wait_for_completed_charges(saver, kind, thread_id, 2)
            return act(what)

    else:

        @tool
        def receipt(what: str) -> str:  # type: ignore[misc]
            """Print or approve a receipt."""
            wait_for_completed_charges_sync(saver, thread_id, 2)
            return act(what)

    return receipt


@parametrize_kinds
@pytest.mark.parametrize("how", ["interrupt", "retry"])
async def test_tool_node_parallel_calls_of_one_tool_are_keyed_by_call_id_and_replayed(
    kind: str, saver: Any, how: str
) -> None:
    calls: list[int] = []
    charge = charge_tool(kind, calls)
    receipt = third_tool(kind, saver, "t1", how)
    request = tool_call_message(
        ("charge", {"amount": 1}, "call_a"),
        ("charge", {"amount": 2}, "call_b"),
        ("receipt", {"what": "order 1"}, "call_c"),
    )
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [request]})
    builder.add_node(
        "tools",
        ToolNode([charge, receipt], handle_tool_errors=False),
        retry_policy=retry_twice() if how == "retry" else None,
    )
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(checkpointer=saver)

    result = await call(graph, "invoke", kind, {"messages": [HumanMessage("pay")]}, config("t1"))
    if how == "interrupt":
        assert result["__interrupt__"][0].value == "approve order 1?"
        assert sorted(calls) == [1, 2]
        result = await call(graph, "invoke", kind, Command(resume="ok"), config("t1"))

    assert sorted(calls) == [1, 2]
    tool_messages = {m.tool_call_id: m.content for m in result["messages"] if m.type == "tool"}
    assert tool_messages == {
        "call_a": "charged 1",
        "call_b": "charged 2",
        "call_c": "ok" if how == "interrupt" else "printed order 1",
    }
    steps = await call(saver.journal, "steps", kind, scope="t1")
    assert len(steps) == 2
    by_call = {("call_a" if "@call_a#" in s.step_key else "call_b"): s for s in steps}
    assert set(by_call) == {"call_a", "call_b"}
    assert "@call_b#" in by_call["call_b"].step_key
    assert by_call["call_a"].args == {"amount": 1} and by_call["call_b"].args == {"amount": 2}
    assert {s.status for s in steps} == {"completed"}
    events = of_kind(await call(saver.journal, "events", kind, "t1"), "tool")
    for step in steps:
        assert sorted(e.phase for e in events if e.step_key == step.step_key) == [
            "end",
            "replay",
            "start",
        ]


def fail_once() -> Callable[[BaseMessage], BaseMessage]:
    """After the model answers, fail the first time (the agent node raises)."""
    seen: list[BaseMessage] = []

    def check(message: BaseMessage) -> BaseMessage:
        seen.append(message)
        if len(seen) == 1:
            raise Flaky("post-processing of the model's answer failed")
        return message

    return check


def paid_calls(calls_file: Path) -> int:
    return len(calls_file.read_text().splitlines()) if calls_file.exists() else 0


@no_deprecation_noise
@parametrize_kinds
async def test_react_agent_reexecuted_repeats_neither_effects_nor_model_calls(
    kind: str, saver: Any, tmp_path: Path
) -> None:
    calls: list[int] = []
    charge = charge_tool(kind, calls)
    receipt = third_tool(kind, saver, "t1", "retry")
    calls_file = tmp_path / "model_calls"
    scripted = ScriptedChatModel(
        responses=[
            tool_call_message(
                ("charge", {"amount": 1}, "call_a"),
                ("charge", {"amount": 2}, "call_b"),
                ("receipt", {"what": "order 1"}, "call_c"),
            ),
            AIMessage("all paid", id="answer-2"),
        ],
        calls_file=str(calls_file),
    )
    model = durable_model(scripted).bind_tools([charge, receipt]) | RunnableLambda(fail_once())
    agent = create_react_agent(
        model,
        ToolNode([charge, receipt], handle_tool_errors=False),
        checkpointer=saver,
        version="v1",
    )

    # 1: the model is called, then the agent node fails after it.
    with pytest.raises(Flaky, match="post-processing"):
        await call(agent, "invoke", kind, {"messages": [HumanMessage("pay")]}, config("t1"))
    assert paid_calls(calls_file) == 1
    # 2: invoked again: the model call is replayed; the tools node charges, then fails.
    with pytest.raises(Flaky, match="receipt printer"):
        await call(agent, "invoke", kind, None, config("t1"))
    assert paid_calls(calls_file) == 1
    assert sorted(calls) == [1, 2]
    # 3: invoked again: the charges are replayed, the model answers a second time.
    result = await call(agent, "invoke", kind, None, config("t1"))

    assert sorted(calls) == [1, 2]
    assert paid_calls(calls_file) == 2
    assert result["messages"][-1].content == "all paid"
    assert [m.content for m in result["messages"] if isinstance(m, ToolMessage)] == [
        "charged 1",
        "charged 2",
        "printed order 1",
    ]
    events = await call(saver.journal, "events", kind, "t1")
    assert phases(events, "llm") == ["start", "end", "replay", "start", "end"]
    assert sorted(phases(events, "tool")) == ["end", "end", "replay", "replay", "start", "start"]


# --------------------------------------------------------------------------- 5. unknown outcome


async def left_started(
    kind: str, saver: Any, db: dict[str, str], fn: Any, thread_id: str = "t1"
) -> Any:
    """Run a graph whose node calls ``fn(5)`` and then fails (first run only), then set
    the call's step back to ``started``: the state a crash inside the call leaves. The
    graph invoked again (``None``) re-executes the node. Returns the graph."""
    runs: list[int] = []

    def after(result: Any) -> dict[str, Any]:
        runs.append(1)
        if len(runs) == 1:
            raise Flaky("the node fails after the call")
        return {"out": [result]}

    graph = one_node_graph(calling_node(kind, fn, (5,), after), saver)
    with pytest.raises(Flaky):
        await call(graph, "invoke", kind, {"out": []}, config(thread_id))
    assert set_steps_started(kind, db, thread_id) == 1
    step = await only_step(saver, kind, thread_id)
    assert step.outcome_unknown
    return graph


@parametrize_kinds
async def test_unknown_outcome_raises_by_default_and_does_not_rerun(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    calls: list[int] = []
    graph = await left_started(kind, saver, db, charge_fn(kind, calls))
    step = await only_step(saver, kind, "t1")

    with pytest.raises(ToolOutcomeUnknown) as info:
        await call(graph, "invoke", kind, None, config("t1"))

    assert calls == [5]
    message = str(info.value)
    for part in ("charge", "amount=5", step.idempotency_key, step.started_at, "never finished"):
        assert part in message
    outcome = info.value.outcome
    assert (outcome.tool, outcome.args, outcome.step_key) == (
        "charge",
        {"amount": 5},
        step.step_key,
    )
    assert (outcome.idempotency_key, outcome.scope) == (step.idempotency_key, "t1")
    after = await only_step(saver, kind, "t1")
    assert (after.status, after.attempts, after.owner) == ("started", 1, step.owner)


def reconciler(kind: str, seen: list[UnknownOutcome], answer: Any) -> Any:
    """A reconcile callable (async for async kinds) returning ``answer``."""
    if is_async(kind):

        async def look_up(outcome: UnknownOutcome) -> Any:
            seen.append(outcome)
            return answer

        return look_up

    def look_up_sync(outcome: UnknownOutcome) -> Any:
        seen.append(outcome)
        return answer

    return look_up_sync


@parametrize_kinds
async def test_unknown_outcome_reconciled_to_a_result_is_not_rerun(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    calls: list[int] = []
    seen: list[UnknownOutcome] = []
    found = {"charged": 5, "found_by": "lookup"}
    fn = charge_fn(kind, calls, decorate=side_effect(reconcile=reconciler(kind, seen, found)))
    graph = await left_started(kind, saver, db, fn)
    step = await only_step(saver, kind, "t1")

    final = await call(graph, "invoke", kind, None, config("t1"))

    assert calls == [5]
    assert final["out"] == [found]
    assert len(seen) == 1
    assert (seen[0].tool, seen[0].args, seen[0].idempotency_key) == (
        "charge",
        {"amount": 5},
        step.idempotency_key,
    )
    done = await only_step(saver, kind, "t1")
    assert (done.status, done.result, done.attempts) == ("completed", found, 2)
    events = of_kind(await call(saver.journal, "events", kind, "t1"), "tool")
    assert events[-1].phase == "end" and events[-1].name == "charge (reconciled)"
    assert events[-1].payload == found


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_an_async_reconcile_of_a_sync_call_is_refused_not_recorded(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """A sync call's driver cannot await its reconcile: an async one's coroutine object
    was recorded as the call's result (completed, for good). An async function is now
    refused where the call is decorated; a callable whose __call__ is async (which
    cannot be told from a sync one there) raises a TypeError naming the call when it
    answers, and the step stays started."""

    async def find_charge(outcome: UnknownOutcome) -> Any:
        return {"charged": 5}

    with pytest.raises(TypeError, match="reconcile='find_charge' is async, and 'charge'"):

        @side_effect(reconcile=find_charge)
        def charge(amount: int) -> int:
            return amount

    class Lookup:
        async def __call__(self, outcome: UnknownOutcome) -> Any:
            return {"charged": 5}

    calls: list[int] = []
    graph = await left_started(
        kind, saver, db, charge_fn(kind, calls, decorate=side_effect(reconcile=Lookup()))
    )
    with pytest.raises(TypeError, match="the reconcile of 'charge' returned an awaitable"):
        await call(graph, "invoke", kind, None, config("t1"))
    assert calls == [5]
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.result) == ("started", None)


@parametrize_kinds
async def test_unknown_outcome_reconciled_not_done_is_rerun(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    calls: list[int] = []
    seen: list[UnknownOutcome] = []
    fn = charge_fn(kind, calls, decorate=side_effect(reconcile=reconciler(kind, seen, NOT_DONE)))
    graph = await left_started(kind, saver, db, fn)

    final = await call(graph, "invoke", kind, None, config("t1"))

    assert calls == [5, 5]
    assert len(seen) == 1
    assert final["out"] == [{"charged": 5, "run": 2}]
    done = await only_step(saver, kind, "t1")
    assert (done.status, done.result, done.attempts) == ("completed", final["out"][0], 2)


@parametrize_kinds
async def test_unknown_outcome_of_an_idempotent_call_is_rerun(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    calls: list[int] = []
    graph = await left_started(kind, saver, db, charge_fn(kind, calls, decorate=idempotent))

    final = await call(graph, "invoke", kind, None, config("t1"))

    assert calls == [5, 5]
    assert final["out"] == [{"charged": 5, "run": 2}]
    done = await only_step(saver, kind, "t1")
    assert (done.status, done.effect, done.attempts) == ("completed", "idempotent", 2)


@parametrize_kinds
@pytest.mark.parametrize("answer", ["retry", "result", "skip"])
async def test_unknown_outcome_ask_interrupts_and_follows_the_answer(
    kind: str, saver: Any, db: dict[str, str], answer: str
) -> None:
    calls: list[int] = []
    fn = charge_fn(kind, calls, decorate=side_effect(on_unknown="ask"))
    graph = await left_started(kind, saver, db, fn)
    step = await only_step(saver, kind, "t1")

    asked = await call(graph, "invoke", kind, None, config("t1"))
    payload = asked["__interrupt__"][0].value
    assert calls == [5]
    assert payload["type"] == "agentcheck.unknown_outcome"
    assert (payload["tool"], payload["args"]) == ("charge", {"amount": 5})
    assert (payload["idempotency_key"], payload["step_key"]) == (
        step.idempotency_key,
        step.step_key,
    )
    assert payload["started_at"] == step.started_at
    assert set(payload["choices"]) == {"retry", "result", "skip"}

    resume = {"result": {"charged": 5, "by": "a human"}} if answer == "result" else answer
    final = await call(graph, "invoke", kind, Command(resume=resume), config("t1"))

    expected = {
        "retry": {"charged": 5, "run": 2},
        "result": {"charged": 5, "by": "a human"},
        "skip": None,
    }[answer]
    assert calls == ([5, 5] if answer == "retry" else [5])
    assert final["out"] == [expected]
    done = await only_step(saver, kind, "t1")
    assert (done.status, done.result) == ("completed", expected)


@parametrize_kinds
async def test_a_node_interrupt_after_an_answered_ask_gets_its_own_answer(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """The "ask" policy asks through the task's interrupt(): once answered, the step is
    completed and is not asked again, and the node's own question after it still meets
    its own answer (it got the answer to the ask)."""
    calls: list[int] = []
    fn = charge_fn(kind, calls, decorate=side_effect(on_unknown="ask"))
    shipped: list[Any] = []

    def ship(result: Any) -> dict[str, Any]:
        shipped.append(interrupt("ship the order?"))
        return {"out": [result, shipped[-1]]}

    await left_started(kind, saver, db, fn)
    graph = one_node_graph(calling_node(kind, fn, (5,), ship), saver)
    asked = await call(graph, "invoke", kind, None, config("t1"))
    assert asked["__interrupt__"][0].value["type"] == "agentcheck.unknown_outcome"
    resume = Command(resume={"result": "charged 5 (confirmed by a human)"})
    asked = await call(graph, "invoke", kind, resume, config("t1"))
    assert asked["__interrupt__"][0].value == "ship the order?"
    final = await call(graph, "invoke", kind, Command(resume="yes, ship it"), config("t1"))

    assert final["out"] == ["charged 5 (confirmed by a human)", "yes, ship it"]
    assert calls == [5]
    step = await only_step(saver, kind, "t1")
    assert (step.status, step.interrupts) == ("completed", 1)


class EditedOrder(TypedDict, total=False):
    note: str
    out: list[Any]


@parametrize_kinds
async def test_after_an_edit_a_replayed_approval_leaves_the_next_answer_to_its_question(
    kind: str, saver: Any
) -> None:
    """A charge asks its own approval, is approved and completes; the node then asks
    "Ship?". An operator edits the state (update_state as the node before), and LangGraph
    runs the node as a new task, with no answers: the charge's replay passed over its
    question by taking the human's next answer (given for "Ship?"), and "Ship?" was asked
    again (before that, LangGraph failed an assertion). The replay now keeps the place
    of a question answered in the task it continues."""
    calls: list[int] = []

    def approved(amount: int) -> str:
        if interrupt(f"Charge {amount}?") != "approve":
            return "denied"
        calls.append(amount)
        return f"charged {amount}"

    if is_async(kind):

        @side_effect(on_unknown="ask")
        async def charge(amount: int) -> str:
            return approved(amount)

        async def checkout(state: EditedOrder) -> dict[str, Any]:
            charged = await charge(42)
            return {"out": [charged, "ship: " + interrupt("Ship?")]}

    else:

        @side_effect(on_unknown="ask")  # type: ignore[no-redef]
        def charge(amount: int) -> str:
            return approved(amount)

        def checkout(state: EditedOrder) -> dict[str, Any]:  # type: ignore[misc]
            charged = charge(42)
            return {"out": [charged, "ship: " + interrupt("Ship?")]}

    builder = StateGraph(EditedOrder)
    builder.add_node("prep", lambda state: {})
    builder.add_node("checkout", checkout)
    builder.add_edge(START, "prep")
    builder.add_edge("prep", "checkout")
    builder.add_edge("checkout", END)
    graph = builder.compile(checkpointer=saver)

    def asked(result: Any) -> list[Any]:
        return [i.value for i in result["__interrupt__"]]

    assert asked(await call(graph, "invoke", kind, {"out": []}, config("t1"))) == ["Charge 42?"]
    assert asked(await call(graph, "invoke", kind, Command(resume="approve"), config("t1"))) == [
        "Ship?"
    ]
    await call(graph, "update_state", kind, config("t1"), {"note": "edited"}, as_node="prep")
    assert asked(await call(graph, "invoke", kind, None, config("t1"))) == ["Ship?"]
    final = await call(graph, "invoke", kind, Command(resume="yes"), config("t1"))
    assert final["out"] == ["charged 42", "ship: yes"]
    assert calls == [42]


@parametrize_kinds
async def test_unknown_outcome_ask_asks_again_after_an_unclear_answer(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """An answer the policy cannot understand raised a ValueError, and LangGraph kept it
    as that question's answer: every later resume met it again, the thread stuck for
    good. The question is now asked again, saying why, and its next answer is used."""
    calls: list[int] = []
    fn = charge_fn(kind, calls, decorate=side_effect(on_unknown="ask"))
    graph = await left_started(kind, saver, db, fn)
    await call(graph, "invoke", kind, None, config("t1"))

    again = await call(graph, "invoke", kind, Command(resume="maybe"), config("t1"))
    question = again["__interrupt__"][0].value
    assert question["type"] == "agentcheck.unknown_outcome"
    assert "cannot understand the answer 'maybe'" in question["error"]
    assert "'retry', 'skip' or {'result'" in question["error"]
    assert calls == [5]
    assert (await only_step(saver, kind, "t1")).status == "started"

    still = await call(graph, "invoke", kind, None, config("t1"))  # a resume with no answer
    assert still["__interrupt__"][0].value["error"] == question["error"]
    final = await call(graph, "invoke", kind, Command(resume={"result": "ok"}), config("t1"))
    assert final["out"] == ["ok"]
    assert calls == [5]
    assert (await only_step(saver, kind, "t1")).status == "completed"


def test_side_effect_refuses_on_unknown_retry_at_decoration() -> None:
    with pytest.raises(ValueError, match="only @idempotent"):

        @side_effect(on_unknown="retry")
        def charge(amount: int) -> None: ...

    with pytest.raises(ValueError, match="on_unknown must be"):
        idempotent(on_unknown="later")  # type: ignore[call-overload]


@parametrize_kinds
async def test_cancelled_call_leaves_an_unknown_outcome_not_a_failure(
    kind: str, saver: Any
) -> None:
    """A call cancelled while in flight (a timeout) may have had its effect: it did not
    report a failure, so it must not be re-run blindly."""
    started = asyncio.Event()
    calls: list[int] = []

    @side_effect
    async def charge(amount: int) -> int:
        calls.append(amount)
        started.set()
        await asyncio.Event().wait()  # the provider never answers
        return amount

    with effect_scope(saver.journal, "scope-cancel"):
        running = asyncio.ensure_future(charge(3))
        await started.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    step = await only_step(saver, kind, "scope-cancel")
    assert step.status == "started"
    with effect_scope(saver.journal, "scope-cancel"), pytest.raises(ToolOutcomeUnknown):
        await charge(3)
    assert calls == [3]


def gate_journal_write(
    saver: Any, n: int, *, after: bool, fail: BaseException | None = None
) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the ``n``-th journal write (1-based) of async wrapped calls at a gate, before
    it is made or after it is committed; returns (reached, gate). The write goes on in
    the database's own worker (aiosqlite's thread, a sync saver's worker) whatever
    happens to the task awaiting it: the gate stands for the time it takes. ``fail``:
    raised instead of making the write, once the gate opens (``after=False``)."""
    real = saver.arun_op
    reached, gate = asyncio.Event(), asyncio.Event()
    writes = 0

    async def gated(make_op: Any, write: bool, *, durable: bool = True) -> Any:
        nonlocal writes
        held = False
        if write:
            writes += 1
            held = writes == n
        if held and not after:
            reached.set()
            await gate.wait()
            if fail is not None:
                raise fail
        result = await real(make_op, write, durable=durable)
        if held and after:
            reached.set()
            await gate.wait()
        return result

    saver.arun_op = gated
    return reached, gate


def counting_charge(calls: list[int], *, fails: int = 0, times: int = 1) -> Any:
    """An async ``@side_effect`` charge that appends its amount to ``calls`` each time
    it really runs; its first ``fails`` runs raise ConnectionError, the others return
    the amount ``times`` over."""

    @side_effect
    async def charge(amount: int) -> int:
        calls.append(amount)
        if len(calls) <= fails:
            raise ConnectionError("the provider hung up")
        return amount * times

    return charge


async def cancel_at(
    running: asyncio.Future[Any], reached: asyncio.Event, gate: asyncio.Event
) -> None:
    """Cancel ``running`` once it waits at the gate, then open the gate."""
    await asyncio.wait_for(reached.wait(), 30)
    running.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await running


async def fail_then_cancel_at(saver: Any, charge: Any, scope: str, n: int) -> None:
    """``charge(3)`` in ``scope``, which fails (ConnectionError), then again, cancelled
    after its ``n``-th journal write is committed."""
    with effect_scope(saver.journal, scope), pytest.raises(ConnectionError):
        await charge(3)
    reached, gate = gate_journal_write(saver, n, after=True)
    with effect_scope(saver.journal, scope):
        await cancel_at(asyncio.ensure_future(charge(3)), reached, gate)


@parametrize_kinds
async def test_a_call_cancelled_as_its_claim_is_stored_has_not_begun(kind: str, saver: Any) -> None:
    """A task cancelled (a timeout, a client gone) while the claim of its call is on its
    way: the call never began, so its claim is given up, not left to look like a call
    cut short (whose outcome would be unknown, and the next attempt refused)."""
    calls: list[int] = []
    charge = counting_charge(calls)

    reached, gate = gate_journal_write(saver, 1, after=True)  # the claim, committed
    with effect_scope(saver.journal, "scope-cancel-claim"):
        await cancel_at(asyncio.ensure_future(charge(3)), reached, gate)
    assert calls == []
    assert await call(saver.journal, "steps", kind, scope="scope-cancel-claim") == []
    with effect_scope(saver.journal, "scope-cancel-claim"):
        assert await charge(3) == 3
    assert calls == [3]
    step = await only_step(saver, kind, "scope-cancel-claim")
    assert (step.status, step.attempts, step.result) == ("completed", 1, 3)


@parametrize_kinds
async def test_a_call_cancelled_as_its_result_is_stored_keeps_its_result(
    kind: str, saver: Any
) -> None:
    """A task cancelled while its call's result is on its way to the journal: the call
    has had its effect and its result is in hand, so it is stored (and the cancellation
    goes on); the next attempt replays it instead of finding an unknown outcome."""
    calls: list[int] = []
    charge = counting_charge(calls, times=10)

    reached, gate = gate_journal_write(saver, 2, after=False)  # the result, not yet made
    with effect_scope(saver.journal, "scope-cancel-result"):
        await cancel_at(asyncio.ensure_future(charge(3)), reached, gate)
    assert calls == [3]
    step = await only_step(saver, kind, "scope-cancel-result")
    assert (step.status, step.result) == ("completed", 30)
    with effect_scope(saver.journal, "scope-cancel-result"):
        assert await charge(3) == 30
    assert calls == [3]


@parametrize_kinds
async def test_a_retry_cancelled_as_it_takes_a_failed_call_over_has_not_begun(
    kind: str, saver: Any
) -> None:
    """The same for a call that failed before: cancelled while its retry takes the step
    over, the retry has not begun, and the next attempt runs it."""
    calls: list[int] = []
    charge = counting_charge(calls, fails=1)

    # The retry's claim (which finds the step failed), then its take-over.
    await fail_then_cancel_at(saver, charge, "scope-cancel-retry", 2)
    assert calls == [3]
    # Kept, not deleted: its attempts stay counted.
    step = await only_step(saver, kind, "scope-cancel-retry")
    assert (step.status, step.attempts) == ("paused", 2)
    with effect_scope(saver.journal, "scope-cancel-retry"):
        assert await charge(3) == 3
    assert calls == [3, 3]
    step = await only_step(saver, kind, "scope-cancel-retry")
    assert (step.status, step.attempts, step.result) == ("completed", 3, 3)


@parametrize_kinds
async def test_a_call_cancelled_as_it_finds_a_failed_call_takes_nothing_over(
    kind: str, saver: Any
) -> None:
    """Cancelled while its claim is on its way, a call that finds the step failed (its
    claim takes nothing) goes no further: it neither takes the step over nor logs a
    start, and the failure stays as it was."""
    calls: list[int] = []
    charge = counting_charge(calls, fails=2)

    await fail_then_cancel_at(saver, charge, "scope-cancel-look", 1)
    assert calls == [3]
    step = await only_step(saver, kind, "scope-cancel-look")
    assert (step.status, step.attempts) == ("failed", 1)
    events = await call(saver.journal, "events", kind, "scope-cancel-look")
    assert phases(events) == ["start", "error"]


@parametrize_kinds
async def test_a_cancelled_call_whose_claim_then_fails_is_cancelled(kind: str, saver: Any) -> None:
    """A claim that fails after the task was cancelled (a lock held elsewhere, a lost
    connection) does not turn the cancellation into that error: the task is cancelled
    (so a timeout still says it timed out), the error chained, and nothing runs."""
    calls: list[int] = []
    charge = counting_charge(calls)

    lost = ConnectionError("the database went away")
    reached, gate = gate_journal_write(saver, 1, after=False, fail=lost)
    with effect_scope(saver.journal, "scope-cancel-fail"):
        running = asyncio.ensure_future(charge(3))
        await asyncio.wait_for(reached.wait(), 30)
        running.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError) as raised:
            await running
    assert raised.value.__cause__ is lost
    assert calls == []
    assert await call(saver.journal, "steps", kind, scope="scope-cancel-fail") == []


@parametrize_kinds
async def test_a_cancelled_call_does_not_wait_for_its_claim_for_ever(
    kind: str, saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that does not end (a lock held elsewhere) is awaited only so long after
    a cancellation (effects.CANCELLED_WRITE_WAIT): then the cancellation goes on, and the
    claim, stored after all, is a call cut short, as a crash would leave it."""
    monkeypatch.setattr("agentcheck.effects.CANCELLED_WRITE_WAIT", 0.05)

    @side_effect
    async def charge(amount: int) -> int:
        return amount

    reached, gate = gate_journal_write(saver, 1, after=True)
    with effect_scope(saver.journal, "scope-cancel-stuck"):
        running = asyncio.ensure_future(charge(3))
        await asyncio.wait_for(reached.wait(), 30)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(running, 30)
        assert not gate.is_set()  # given up while the claim was still held up
    gate.set()
    for _ in range(3):
        await asyncio.sleep(0)
    step = await only_step(saver, kind, "scope-cancel-stuck")
    assert step.status == "started"


@pytest.mark.parametrize("kind", ASYNC_KINDS)
async def test_a_run_cancelled_as_a_charge_is_recorded_replays_it_when_resumed(
    kind: str, saver: Any
) -> None:
    """A server cancels a run's task when its client goes away. If that happens while a
    charge's result is on its way to the journal, resuming the thread replays the charge
    (it was made) instead of refusing it as an unknown outcome."""
    calls: list[int] = []
    charge = counting_charge(calls)

    node = calling_node(kind, charge, (3,), lambda charged: {"out": [f"charged {charged}"]})
    graph = one_node_graph(node, saver)
    config: Any = {"configurable": {"thread_id": "cancelled-run"}}
    reached, gate = gate_journal_write(saver, 2, after=False)  # the claim, then the result
    await cancel_at(asyncio.ensure_future(graph.ainvoke({"out": []}, config)), reached, gate)
    assert calls == [3]
    assert (await graph.ainvoke(None, config))["out"] == ["charged 3"]
    assert calls == [3]


@pytest.mark.parametrize("kind", ASYNC_KINDS)
async def test_a_node_cancelled_by_a_failing_sibling_as_it_claims_runs_its_call_when_resumed(
    kind: str, saver: Any
) -> None:
    """LangGraph cancels the tasks still running in a step when one fails, and cancels
    them more than once. A node cancelled so while its charge's claim is on its way has
    not charged: its claim is given up, and resuming the thread charges once."""
    calls: list[int] = []
    failed: list[bool] = []

    @side_effect
    async def charge(amount: int) -> int:
        calls.append(amount)
        return amount

    reached, gate = gate_journal_write(saver, 1, after=True)  # the claim, committed

    async def flaky(state: Log) -> Log:
        if not failed:
            failed.append(True)
            await asyncio.wait_for(reached.wait(), 30)
            asyncio.get_running_loop().call_later(0.05, gate.set)  # after the cancels
            raise ValueError("the inventory service is down")
        return {"out": ["checked"]}

    async def charging(state: Log) -> Log:
        return {"out": [f"charged {await charge(3)}"]}

    builder = StateGraph(Log)
    builder.add_node("check", flaky)
    builder.add_node("charge", charging)
    builder.add_edge(START, "check")
    builder.add_edge(START, "charge")
    graph = builder.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "failing-sibling"}}
    with pytest.raises(ValueError, match="inventory"):
        await graph.ainvoke({"out": []}, config)
    assert calls == []
    assert await call(saver.journal, "steps", kind, scope="failing-sibling") == []
    assert sorted((await graph.ainvoke(None, config))["out"]) == ["charged 3", "checked"]
    assert calls == [3]


# --------------------------------------------------------------------------- 6. where it works


@pytest.mark.parametrize(
    ("kind", "shape"),
    [(kind, "subgraph without checkpointer") for kind in KINDS]
    # (An async saver refuses a sync call made on its own loop: InvalidStateError.)
    + [(kind, "sync call, async node") for kind in SYNC_KINDS],
)
async def test_no_call_waits_for_a_checkpoint_nothing_will_store(
    kind: str, saver: Any, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With LangGraph's default durability a call waits for its task's checkpoint to be
    stored. A subgraph compiled with checkpointer=False stores none (its tasks still
    carry the saver), and a sync call made in an async node runs on the event loop that
    would store it: each such call waited out STORED_WAIT (2 s) and warned."""
    caplog.set_level(logging.WARNING, logger="agentcheck")
    calls: list[int] = []
    charge = side_effect(lambda amount: calls.append(amount) or len(calls))

    if shape == "subgraph without checkpointer":
        inner = StateGraph(Log)
        inner.add_node("pay", lambda state: {"out": [charge(5)]})
        inner.add_edge(START, "pay")
        inner.add_edge("pay", END)
        graph = one_node_graph(inner.compile(checkpointer=False), saver)
    else:

        async def pay(state: Log) -> dict[str, Any]:
            return {"out": [charge(5)]}

        graph = one_node_graph(pay, saver)
    if shape == "sync call, async node":
        final = await graph.ainvoke({"out": []}, config("t1"))  # the sync saver's aput
    else:
        final = await call(graph, "invoke", kind, {"out": []}, config("t1"))
    assert final["out"] == [1]
    assert calls == [5]
    assert not [r for r in caplog.records if "was not stored" in r.getMessage()]


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_a_sync_saver_under_ainvoke_stores_while_sync_nodes_wait(
    kind: str, saver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Under ainvoke LangGraph runs sync nodes in the event loop's default thread pool,
    and a wrapped call in one waits there for its task's checkpoint. A sync saver's
    aput ran in that same pool: with every thread of it taken by a waiting call, the put
    queued behind them until their waits ran out (2 s each), and then every call went on
    with nothing stored. Its async methods now run in agentcheck's own threads."""
    caplog.set_level(logging.WARNING, logger="agentcheck")
    calls: list[tuple[str, int]] = []
    lock = threading.Lock()

    @side_effect
    def charge(thread: str, n: int) -> str:
        with lock:
            calls.append((thread, n))
        return f"{thread}:{n}"

    def prepare(state: Branches) -> dict[str, Any]:
        return {"out": [charge(state["thread"], -1)]}

    def work(state: Branches) -> dict[str, Any]:
        return {"out": [charge(state["thread"], state["n"])]}

    builder = StateGraph(Branches)
    builder.add_node("prepare", prepare)
    builder.add_node("work", work)
    builder.add_edge(START, "prepare")

    def fan_out(state: Branches) -> list[Send]:
        return [Send("work", {"out": [], "thread": state["thread"], "n": i}) for i in range(4)]

    builder.add_conditional_edges("prepare", fan_out, ["work"])
    builder.add_edge("work", END)
    graph = builder.compile(checkpointer=saver)
    # A pool of 4 threads (as on a 1-core machine; 6 on 2 cores): 6 runs' nodes fill it.
    pool = ThreadPoolExecutor(4)
    asyncio.get_running_loop().set_default_executor(pool)
    try:
        threads = [f"t{i}" for i in range(6)]
        finals = await asyncio.gather(
            *(
                graph.ainvoke({"out": [], "thread": t, "n": 0}, config(t), durability="async")
                for t in threads
            )
        )
    finally:
        pool.shutdown(wait=False)
    for thread, final in zip(threads, finals, strict=True):
        assert sorted(final["out"]) == sorted(f"{thread}:{n}" for n in range(-1, 4))
    assert sorted(calls) == sorted((t, n) for t in threads for n in range(-1, 4))
    assert not [r for r in caplog.records if "was not stored" in r.getMessage()]


@pytest.mark.parametrize("kind", ASYNC_KINDS)
@pytest.mark.parametrize("wrapped", ["side effect", "model"])
async def test_a_sync_call_on_the_async_savers_own_loop_is_refused_naming_it(
    kind: str, saver: Any, wrapped: str
) -> None:
    """A sync wrapped call made in an `async def` node runs on the event loop of the
    async saver that journals it, which its journal writes would have to wait for: it
    is refused before anything is claimed or called, with an error that names the call
    and says what to do (it used to fail with the saver's generic refusal)."""
    calls: list[int] = []
    charge = side_effect(name="charge")(lambda amount: calls.append(amount) or amount)
    model = durable_model(ScriptedChatModel(responses=[AIMessage("hi")]))

    async def node(state: Log) -> dict[str, Any]:
        if wrapped == "side effect":
            return {"out": [charge(5)]}
        return {"out": [model.invoke([HumanMessage("hello")]).content]}

    graph = one_node_graph(node, saver)
    with pytest.raises(asyncio.InvalidStateError) as caught:
        await graph.ainvoke({"out": []}, config("t1"))
    message = str(caught.value)
    name = "charge" if wrapped == "side effect" else model._spec().name
    assert f"wrapped call {name!r}" in message
    assert "`async def` node" in message and "asyncio.to_thread" in message
    assert calls == []
    assert await saver.journal.asteps() == []


class ThreadName(str, enum.Enum):
    MAIN = "main"


@parametrize_kinds
async def test_a_thread_id_of_a_str_enum_is_one_thread_everywhere(
    kind: str, saver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A (str, Enum) member as the thread id is stored under str() of it, as LangGraph
    (get_state_history, update_state) and the adapter (the ledger's scope) name it: the
    savers stored it under its value for a while, which split one thread in two (an
    empty history, an update sent elsewhere, every wrapped call waiting 2 s for a
    checkpoint under the other name, a journal left behind by delete_thread)."""
    caplog.set_level(logging.WARNING, logger="agentcheck")
    calls: list[int] = []
    charge = charge_fn(kind, calls)
    if is_async(kind):

        async def node(state: Log) -> dict[str, Any]:
            return {"out": [await charge(5)]}

    else:

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            return {"out": [charge(5)]}

    graph = one_node_graph(node, saver)
    cfg = config(ThreadName.MAIN)  # type: ignore[arg-type]
    await call(graph, "invoke", kind, {"out": []}, cfg)
    assert calls == [5]
    assert not [r for r in caplog.records if "was not stored" in r.getMessage()]
    history = [s async for s in graph.aget_state_history(cfg)]
    assert len(history) == 3
    if is_async(kind):
        await graph.aupdate_state(cfg, {"out": ["edited"]})
        state = await graph.aget_state(cfg)
    else:
        graph.update_state(cfg, {"out": ["edited"]})
        state = graph.get_state(cfg)
    assert state.values["out"][-1] == "edited"
    assert [s.scope for s in await call(saver.journal, "steps", kind)] == ["ThreadName.MAIN"]
    # The journal's API names the thread's run and ledger by the same id as the graph.
    run = await call(saver.journal, "get_run", kind, ThreadName.MAIN)
    assert (run.run_id, run.status) == ("ThreadName.MAIN", "succeeded")
    assert len(await call(saver.journal, "steps", kind, scope=ThreadName.MAIN)) == 1
    assert await call(saver.journal, "events", kind, ThreadName.MAIN)
    if is_async(kind):
        await saver.adelete_thread(ThreadName.MAIN)
    else:
        saver.delete_thread(ThreadName.MAIN)
    assert await call(saver.journal, "steps", kind) == []
    assert await call(saver.journal, "runs", kind) == []


@parametrize_kinds
async def test_functional_api_task_and_entrypoint_replay(
    kind: str, saver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """(With LangGraph's default durability, "async": each call first finds its task's
    checkpoint stored; a @task's map names its entrypoint's namespace with the root's
    checkpoint, which a look-up in that namespace never found, and every call waited
    out agentcheck.effects.STORED_WAIT.)"""
    caplog.set_level(logging.WARNING, logger="agentcheck")
    calls: list[int] = []
    charge = charge_fn(kind, calls)

    if is_async(kind):

        @task
        async def book(x: int) -> Any:
            charged = await charge(x)
            return {"charged": charged, "answer": interrupt("book it?")}

        @entrypoint(checkpointer=saver)
        async def workflow(x: int) -> Any:
            deposit = await charge(x + 100)
            booked = await book(x)
            return [deposit, booked, interrupt("all done?")]

    else:

        @task
        def book(x: int) -> Any:  # type: ignore[misc]
            charged = charge(x)
            return {"charged": charged, "answer": interrupt("book it?")}

        @entrypoint(checkpointer=saver)
        def workflow(x: int) -> Any:  # type: ignore[misc]
            deposit = charge(x + 100)
            booked = book(x).result()
            return [deposit, booked, interrupt("all done?")]

    first = await call(workflow, "invoke", kind, 1, config("t1"))
    assert first["__interrupt__"][0].value == "book it?"
    second = await call(workflow, "invoke", kind, Command(resume="booked"), config("t1"))
    assert second["__interrupt__"][0].value == "all done?"
    final = await call(workflow, "invoke", kind, Command(resume="yes"), config("t1"))

    assert not [r for r in caplog.records if "was not stored" in r.getMessage()]
    assert calls == [101, 1]
    assert final == [
        {"charged": 101, "run": 1},
        {"charged": {"charged": 1, "run": 2}, "answer": "booked"},
        "yes",
    ]
    steps = await call(saver.journal, "steps", kind, scope="t1")
    assert len(steps) == 2 and {s.status for s in steps} == {"completed"}
    in_task = [s for s in steps if "|book:" in s.step_key]
    assert len(in_task) == 1 and in_task[0].args == {"amount": 1}
    events = of_kind(await call(saver.journal, "events", kind, "t1"), "tool")
    replays = [e.step_key for e in events if e.phase == "replay"]
    assert sorted(replays.count(s.step_key) for s in steps) == [1, 2]


@parametrize_kinds
async def test_subgraph_node_replays_after_interrupt_resume(kind: str, saver: Any) -> None:
    calls: list[int] = []
    charge = charge_fn(kind, calls)

    def after(result: Any) -> dict[str, Any]:
        return {"out": [result, interrupt("inside the subgraph: go on?")]}

    inner = StateGraph(Log)
    inner.add_node("pay", calling_node(kind, charge, (3,), after))
    inner.add_edge(START, "pay")
    inner.add_edge("pay", END)
    outer = StateGraph(Log)
    outer.add_node("checkout", inner.compile())
    outer.add_edge(START, "checkout")
    outer.add_edge("checkout", END)
    graph = outer.compile(checkpointer=saver)

    first = await call(graph, "invoke", kind, {"out": []}, config("t1"))
    assert first["__interrupt__"][0].value == "inside the subgraph: go on?"
    final = await call(graph, "invoke", kind, Command(resume="go"), config("t1"))

    assert calls == [3]
    assert final["out"] == [{"charged": 3, "run": 1}, "go"]
    step = await only_step(saver, kind, "t1")
    assert step.step_key.startswith("checkout:") and "|pay:" in step.step_key
    events = await call(saver.journal, "events", kind, "t1")
    assert phases(events) == ["start", "end", "replay"]


@pytest.mark.parametrize("kind", ASYNC_KINDS)
async def test_sync_wrapped_function_in_a_sync_node_of_an_async_graph(
    kind: str, saver: Any
) -> None:
    """An async saver's journal takes the sync wrapper's calls from the node's thread."""
    calls: list[int] = []
    charge = charge_fn("sqlite", calls)

    def node(state: Log) -> dict[str, Any]:
        result = charge(4)
        return {"out": [result, interrupt("ok?")]}

    graph = one_node_graph(node, saver)
    await graph.ainvoke({"out": []}, config("t1"))
    final = await graph.ainvoke(Command(resume="ok"), config("t1"))
    assert calls == [4]
    assert final["out"] == [{"charged": 4, "run": 1}, "ok"]
    assert phases(await saver.journal.aevents("t1")) == ["start", "end", "replay"]


# --------------------------------------------------------------------------- 7. durable_model


def scripted(tmp_path: Path, *messages: AIMessage) -> ScriptedChatModel:
    return ScriptedChatModel(responses=list(messages), calls_file=str(tmp_path / "model_calls"))


def answer_with_tool_call(message_id: str | None = "answer-1") -> AIMessage:
    message = tool_call_message(
        ("charge", {"amount": 1}, "call_a"), ("charge", {"amount": 2}, "call_b"),
        content="paying both now",
    )  # fmt: skip
    message.id = message_id
    return message


def model_graph(kind: str, saver: Any, use: Callable[[list[BaseMessage]], Any], seen: list) -> Any:
    """A graph whose node gets the model's answer with ``use`` (awaited for async kinds),
    records it, then interrupts: the resume re-executes the node and the model call."""

    def after(message: Any) -> dict[str, Any]:
        seen.append(message)
        interrupt("model answered: go on?")
        return {"messages": [message]}

    if is_async(kind):

        async def node(state: MessagesState) -> dict[str, Any]:
            return after(await use(state["messages"]))

    else:

        def node(state: MessagesState) -> dict[str, Any]:  # type: ignore[misc]
            return after(use(state["messages"]))

    builder = StateGraph(MessagesState)
    builder.add_node("agent", node)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=saver)


def model_user(kind: str, model: Any, how: str) -> Callable[[list[BaseMessage]], Any]:
    """How the node calls the model: ``invoke`` or by ``stream`` (summing the chunks)."""
    if how in ("invoke", "graph_stream"):
        return model.ainvoke if is_async(kind) else model.invoke
    if is_async(kind):

        async def astreamed(messages: list[BaseMessage]) -> Any:
            total = None
            async for chunk in model.astream(messages):
                total = chunk if total is None else total + chunk
            return total

        return astreamed

    def streamed(messages: list[BaseMessage]) -> Any:
        total = None
        for chunk in model.stream(messages):
            total = chunk if total is None else total + chunk
        return total

    return streamed


@parametrize_kinds
@pytest.mark.parametrize("how", ["invoke", "model_stream", "graph_stream"])
async def test_durable_model_is_not_called_again_and_replays_the_same_message(
    kind: str, saver: Any, tmp_path: Path, how: str
) -> None:
    inner = scripted(tmp_path, answer_with_tool_call())
    seen: list[Any] = []
    graph = model_graph(kind, saver, model_user(kind, durable_model(inner), how), seen)
    start = {"messages": [HumanMessage("pay for both orders")]}

    if how == "graph_stream":
        first = await stream(graph, kind, start, config("t1"), stream_mode="messages")
        again = await stream(graph, kind, Command(resume=1), config("t1"), stream_mode="messages")
        streamed = [
            "".join(
                str(chunk.content) for chunk, meta in items if meta["langgraph_node"] == "agent"
            )
            for items in (first, again)
        ]
        assert streamed == ["paying both now", "paying both now"]
        # Every chunk of the replay is of the one message: LangChain ended a replayed
        # stream with an empty chunk of its own, under another id (a UI grouping chunks
        # by id showed a second message). (The scripted model's live stream gets one.)
        ids = [
            {c.id for c, m in items if m["langgraph_node"] == "agent"} for items in (first, again)
        ]
        assert "answer-1" in ids[0]
        assert ids[1] == {"answer-1"}
    else:
        await call(graph, "invoke", kind, start, config("t1"))
        await call(graph, "invoke", kind, Command(resume=1), config("t1"))

    assert paid_calls(tmp_path / "model_calls") == 1
    assert len(seen) == 2
    original, replayed = seen
    assert replayed.content == original.content == "paying both now"
    assert replayed.id == original.id == "answer-1"
    assert [tc["id"] for tc in replayed.tool_calls] == ["call_a", "call_b"]
    assert replayed.tool_calls == original.tool_calls
    assert replayed.usage_metadata == original.usage_metadata
    final = await call(graph, "get_state", kind, config("t1"))
    assert [tc["id"] for tc in final.values["messages"][-1].tool_calls] == ["call_a", "call_b"]
    events = await call(saver.journal, "events", kind, "t1")
    assert phases(events, "llm") == ["start", "end", "replay"]
    step = await only_step(saver, kind, "t1")
    assert (step.kind, step.name, step.effect) == ("llm", "scripted-chat-model", "idempotent")
    assert "|llm:scripted-chat-model#0" in step.step_key


@parametrize_kinds
async def test_durable_model_replays_the_message_id_when_the_provider_gives_none(
    kind: str, saver: Any, tmp_path: Path
) -> None:
    """A provider that returns no message id gets one from LangChain (from the run id):
    the replayed message must carry the id of the message the first call produced."""
    inner = scripted(tmp_path, answer_with_tool_call(message_id=None))
    seen: list[Any] = []
    graph = model_graph(kind, saver, model_user(kind, durable_model(inner), "invoke"), seen)
    await call(graph, "invoke", kind, {"messages": [HumanMessage("pay")]}, config("t1"))
    await call(graph, "invoke", kind, Command(resume=1), config("t1"))

    assert paid_calls(tmp_path / "model_calls") == 1
    original, replayed = seen
    assert original.id is not None
    assert replayed.id == original.id


@parametrize_kinds
async def test_durable_model_records_tokens_on_the_end_event_not_on_replay(
    kind: str, saver: Any, tmp_path: Path
) -> None:
    inner = scripted(tmp_path, answer_with_tool_call())
    seen: list[Any] = []
    graph = model_graph(kind, saver, model_user(kind, durable_model(inner), "invoke"), seen)
    await call(graph, "invoke", kind, {"messages": [HumanMessage("pay")]}, config("t1"))
    await call(graph, "invoke", kind, Command(resume=1), config("t1"))

    llm = {e.phase: e for e in of_kind(await call(saver.journal, "events", kind, "t1"), "llm")}
    assert set(llm) == {"start", "end", "replay"}
    assert (llm["end"].input_tokens, llm["end"].output_tokens) == (10, 5)
    assert (llm["replay"].input_tokens, llm["replay"].output_tokens) == (None, None)
    assert (llm["start"].input_tokens, llm["start"].output_tokens) == (None, None)


@parametrize_kinds
@pytest.mark.parametrize("record_prompt", [False, True])
async def test_durable_model_records_the_prompts_size_and_last_message_or_all_of_it(
    kind: str, saver: Any, tmp_path: Path, record_prompt: bool
) -> None:
    """By default a model call's step keeps the prompt's length and last message (the
    checkpoints hold the conversation: whole prompts at every call would grow the journal
    with the square of its length); ``record_prompt=True`` keeps the whole prompt."""
    inner = scripted(tmp_path, answer_with_tool_call())
    model = durable_model(inner, record_prompt=record_prompt)
    seen: list[Any] = []
    graph = model_graph(kind, saver, model_user(kind, model, "invoke"), seen)
    prompt = [SystemMessage("be brief", id="s"), HumanMessage("pay", id="h")]
    await call(graph, "invoke", kind, {"messages": prompt}, config("t1"))
    step = await only_step(saver, kind, "t1")
    if record_prompt:
        assert step.args == {"messages": prompt}
    else:
        assert step.args == {"messages": 2, "last": prompt[-1]}
    # Wrapping again keeps the setting unless one is given, and the wrapper's own settings.
    assert durable_model(model) is model
    assert durable_model(model, record_prompt=record_prompt) is model
    tagged = model.model_copy(update={"tags": ["audit"]})
    other = durable_model(tagged, record_prompt=not record_prompt)
    assert (other.record_prompt, other.tags, other.inner) == (not record_prompt, ["audit"], inner)


@parametrize_kinds
async def test_durable_model_bind_tools_binds_and_replays(
    kind: str, saver: Any, tmp_path: Path
) -> None:
    calls: list[int] = []
    charge = charge_tool(kind, calls)
    inner = scripted(tmp_path, answer_with_tool_call())
    bound = durable_model(inner).bind_tools([charge])
    assert isinstance(bound, RunnableBinding)
    assert [t["function"]["name"] for t in bound.kwargs["tools"]] == ["charge"]

    seen: list[Any] = []
    graph = model_graph(kind, saver, model_user(kind, bound, "invoke"), seen)
    await call(graph, "invoke", kind, {"messages": [HumanMessage("pay")]}, config("t1"))
    await call(graph, "invoke", kind, Command(resume=1), config("t1"))

    assert paid_calls(tmp_path / "model_calls") == 1
    assert seen[0].tool_calls == seen[1].tool_calls
    assert calls == []  # binding tools runs none of them


class Invoice(BaseModel):
    customer: str
    cents: int


@parametrize_kinds
async def test_durable_model_with_structured_output_is_replayed(
    kind: str, saver: Any, tmp_path: Path
) -> None:
    inner = scripted(
        tmp_path,
        tool_call_message(("Invoice", {"customer": "ann", "cents": 1250}, "call_s")),
    )
    structured = durable_model(inner).with_structured_output(Invoice)
    results: list[Any] = []

    def after(invoice: Any) -> dict[str, Any]:
        results.append(invoice)
        return {"out": [invoice.model_dump(), interrupt("invoice ok?")]}

    use = structured.ainvoke if is_async(kind) else structured.invoke
    graph = one_node_graph(calling_node(kind, use, ("bill ann",), after), saver)
    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    final = await call(graph, "invoke", kind, Command(resume="ok"), config("t1"))

    assert paid_calls(tmp_path / "model_calls") == 1
    assert results == [Invoice(customer="ann", cents=1250)] * 2
    assert final["out"] == [{"customer": "ann", "cents": 1250}, "ok"]
    assert phases(await call(saver.journal, "events", kind, "t1"), "llm") == [
        "start",
        "end",
        "replay",
    ]


@contextlib.contextmanager
def traced_transactions(conn: sqlite3.Connection) -> Iterator[list[list[str]]]:
    """Records the statements run on a connection inside the block, grouped by
    transaction: each group is what ran from one BEGIN to its COMMIT, with the PRAGMAs
    just before and after it."""
    groups: list[list[str]] = [[]]

    def trace(sql: str) -> None:
        restore = sql.startswith("PRAGMA synchronous=") and sql != "PRAGMA synchronous=NORMAL"
        if restore and not groups[-1] and len(groups) > 1:
            groups[-2].append(sql)  # the level put back after a commit
            return
        groups[-1].append(sql)
        if sql == "COMMIT":
            groups.append([])

    conn.set_trace_callback(trace)
    try:
        yield groups
    finally:
        conn.set_trace_callback(None)


def relaxed(group: list[str]) -> bool:
    return "PRAGMA synchronous=NORMAL" in group


def wal_saver(
    path: Path,
    level: str,
    factory: type[sqlite3.Connection] = sqlite3.Connection,
    *,
    wal: bool = True,
) -> tuple[Any, SqliteSaver]:
    """A saver on a connection of ours at the given synchronous level, in WAL mode unless
    told otherwise (then SQLite's default rollback journal)."""
    conn = sqlite3.connect(path, factory=factory, isolation_level=None, check_same_thread=False)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={level}")
    saver = SqliteSaver(conn)
    saver.setup()
    return conn, saver


@pytest.mark.parametrize("wal", [True, False], ids=["wal", "rollback-journal"])
def test_a_claim_that_may_simply_run_again_does_not_wait_for_the_disk(
    tmp_path: Path, wal: bool
) -> None:
    """SQLite: the claim of a model call or of an idempotent call that is run again after
    a crash commits at synchronous=NORMAL (it survives a crash of the process; a power
    failure may lose it, which only means running it again). A side effect's claim, a
    claim whose unknown outcome goes to a human or is reconciled, and every completion
    wait for the disk, as does everything on a connection not in WAL mode. A replay's
    note in the journal does not wait either."""
    conn, saver = wal_saver(tmp_path / "ledger.db", "FULL", wal=wal)

    @side_effect
    def charge(amount: int) -> int:
        return amount

    @idempotent
    def lookup(amount: int) -> int:
        return amount

    @idempotent(on_unknown="raise")
    def strict_lookup(amount: int) -> int:
        return amount

    @idempotent(reconcile=lambda outcome: NOT_DONE)
    def reconciled_lookup(amount: int) -> int:
        return amount

    model = durable_model(scripted(tmp_path, AIMessage("hi", id="m1")))
    calls: dict[str, Callable[[], Any]] = {
        "charge": lambda: charge(1),
        "lookup": lambda: lookup(1),
        "strict_lookup": lambda: strict_lookup(1),
        "reconciled_lookup": lambda: reconciled_lookup(1),
        "model": lambda: model.invoke([HumanMessage("hello")]),
    }
    claims: dict[str, bool] = {}
    completions: dict[str, bool] = {}
    for name, make_call in calls.items():
        with traced_transactions(conn) as groups, effect_scope(saver.journal, f"scope-{name}"):
            make_call()
        claim = [g for g in groups if any("INSERT INTO agentcheck_steps" in q for q in g)]
        done = [g for g in groups if any("SET status = 'completed'" in q for q in g)]
        assert len(claim) == len(done) == 1, groups
        claims[name], completions[name] = relaxed(claim[0]), relaxed(done[0])
        # The level is put back after the claim, before anything else runs.
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert claims == {
        "charge": False,
        "lookup": wal,
        "strict_lookup": False,
        "reconciled_lookup": False,
        "model": wal,
    }
    assert completions == dict.fromkeys(calls, False)
    steps = saver.journal.steps()
    assert sorted(s.status for s in steps) == ["completed"] * len(calls)
    # Called again: each replays, noting it in the journal, a note that need not wait.
    for name, make_call in calls.items():
        with traced_transactions(conn) as groups, effect_scope(saver.journal, f"scope-{name}"):
            make_call()
        notes = [g for g in groups if any("INSERT INTO agentcheck_events" in q for q in g)]
        assert len(notes) == 1, groups  # the replay event; the claim found the step done
        assert relaxed(notes[0]) == wal
        assert not any("SET status = 'completed'" in q for g in groups for q in g)
    assert [e.phase for e in saver.journal.events("scope-charge")] == ["start", "end", "replay"]
    conn.close()


def noting() -> Any:
    """An operation that writes a note."""
    yield Query("CREATE TABLE IF NOT EXISTS notes (n INTEGER)")
    yield Query("INSERT INTO notes VALUES (1)")


def test_a_relaxed_write_leaves_the_connection_as_it_found_it(tmp_path: Path) -> None:
    """The level comes back after a failed operation, is left alone inside the caller's
    own transaction (it cannot change there), and a connection already below FULL keeps
    its level."""
    conn, saver = wal_saver(tmp_path / "levels.db", "EXTRA")

    def failing() -> Any:
        yield Query("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        saver.run_op(failing, True, durable=False)
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 3
    assert not conn.in_transaction

    with traced_transactions(conn) as groups:
        conn.execute("BEGIN")
        saver.run_op(noting, True, durable=False)  # inside the caller's transaction
        conn.execute("COMMIT")
        saver.run_op(noting, True, durable=False)
    assert [relaxed(g) for g in groups if g] == [False, True]
    assert groups[1][-1] == "PRAGMA synchronous=3"
    conn.execute("PRAGMA synchronous=NORMAL")
    with traced_transactions(conn) as groups:
        saver.run_op(noting, True, durable=False)
    assert not any(q.startswith("PRAGMA synchronous=") for g in groups for q in g)
    assert conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0] == 3
    conn.close()


class InterruptedConnection(sqlite3.Connection):
    """Raises KeyboardInterrupt as a chosen statement returns, once: a Ctrl-C that came
    while it ran (Python raises it right after the call)."""

    interrupt_after: str | None = None

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        cursor = super().execute(sql, *args)
        if sql == self.interrupt_after:
            self.interrupt_after = None
            raise KeyboardInterrupt
        return cursor


@pytest.mark.parametrize(
    ("statement", "durable"),
    [
        ("PRAGMA synchronous=NORMAL", False),
        ("BEGIN IMMEDIATE", False),
        ("BEGIN IMMEDIATE", True),
        ("COMMIT", False),
    ],
)
def test_a_relaxed_write_stopped_midway_leaves_no_connection_relaxed(
    tmp_path: Path, statement: str, durable: bool
) -> None:
    """A relaxed commit stopped between switching to NORMAL and switching back (Ctrl-C in
    a notebook) is put back by the connection's next run at the latest: later commits
    (checkpoints, completions) wait for the disk again. Any write stopped as its BEGIN
    returns leaves no transaction open."""
    conn, saver = wal_saver(tmp_path / "ctrl-c.db", "FULL", InterruptedConnection)
    conn.interrupt_after = statement
    with pytest.raises(KeyboardInterrupt):
        saver.run_op(noting, True, durable=durable)
    assert not conn.in_transaction
    with traced_transactions(conn) as groups:
        saver.run_op(noting, True)  # a durable write
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert not relaxed(groups[0])
    # The durable write itself ran at FULL: any putting back came before its BEGIN.
    begin = groups[0].index("BEGIN IMMEDIATE")
    assert all(q == "PRAGMA synchronous=2" for q in groups[0][:begin])
    conn.close()


class PausingConnection(sqlite3.Connection):
    """Holds thread "A" just before it switches to NORMAL, until told to go on."""

    at_switch = threading.Event()
    go_on = threading.Event()

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if sql == "PRAGMA synchronous=NORMAL" and threading.current_thread().name == "A":
            self.at_switch.set()
            self.go_on.wait(10)
        return super().execute(sql, *args)


def test_two_savers_sharing_a_connection_leave_it_at_its_level(tmp_path: Path) -> None:
    """A durable write of one saver, run while another saver's relaxed write on the same
    connection is about to switch to NORMAL, does not end with the connection relaxed."""
    conn, first = wal_saver(tmp_path / "shared.db", "FULL", PausingConnection)
    second = SqliteSaver(conn)  # its own lock: the two runs may interleave
    relaxed_write = threading.Thread(
        target=lambda: first.run_op(noting, True, durable=False), name="A"
    )
    relaxed_write.start()
    assert PausingConnection.at_switch.wait(10)
    second.run_op(noting, True)
    PausingConnection.go_on.set()
    relaxed_write.join(10)
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0] == 2
    conn.close()


def test_a_write_stopped_as_its_savepoint_is_made_leaves_the_callers_transaction(
    tmp_path: Path,
) -> None:
    conn, saver = wal_saver(tmp_path / "savepoint.db", "FULL", InterruptedConnection)
    conn.execute("CREATE TABLE notes (n INTEGER)")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO notes VALUES (0)")
    conn.interrupt_after = "SAVEPOINT agentcheck"
    with pytest.raises(KeyboardInterrupt):
        saver.run_op(noting, True)
    # The savepoint is gone, the caller's transaction and its row are still there.
    assert conn.in_transaction
    with pytest.raises(sqlite3.OperationalError, match="no such savepoint"):
        conn.execute("RELEASE agentcheck")
    saver.run_op(noting, True)
    conn.execute("COMMIT")
    assert [r[0] for r in conn.execute("SELECT n FROM notes ORDER BY n")] == [0, 1]
    conn.close()


def commit_setting(rows: int) -> Any:
    """An operation that inserts ``rows`` rows into ``notes`` (statements the saver may
    join into one) and answers the transaction's synchronous_commit, read after them."""
    for n in range(rows):
        yield Query("INSERT INTO notes VALUES (?)", (n,))
    answer = yield Query("SHOW synchronous_commit", fetch=True)
    return answer[0][0]


def inserting(rows: int) -> Any:
    """An operation that only inserts into ``notes``: sent at its end, with its COMMIT."""
    for n in range(rows):
        yield Query("INSERT INTO notes VALUES (?)", (n,))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_relaxed_write_on_postgres_does_not_wait_for_the_wal(
    pg_url: str, asynchronous: bool
) -> None:
    """PostgreSQL: a relaxed write (a claim that may simply run again, see the SQLite
    test above) commits with synchronous_commit off, for its own transaction only: the
    connection's next write waits for the WAL again, after a failed relaxed write too.
    Its statements are still sent together, joined where they can be, and stored."""
    from agentcheck.savers import AsyncPostgresSaver, PostgresSaver

    def failing() -> Any:
        yield Query("INSERT INTO notes VALUES (?)", ("not a number",))

    async def run(saver: Any, make_op: Any, durable: bool) -> Any:
        if asynchronous:
            return await saver.arun_op(make_op, True, durable=durable)
        return await asyncio.to_thread(saver.run_op, make_op, True, durable=durable)

    # One connection, so that every operation below runs on the same session.
    if asynchronous:
        aconn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
        saver: Any = AsyncPostgresSaver(aconn)
        await saver.setup()
    else:
        conn = psycopg.connect(pg_url, autocommit=True)
        saver = PostgresSaver(conn)
        saver.setup()
    try:
        with psycopg.connect(pg_url, autocommit=True) as setup:
            setup.execute("CREATE TABLE notes (n INTEGER)")
        assert await run(saver, lambda: commit_setting(2), False) == "off"
        assert await run(saver, lambda: commit_setting(1), True) == "on"
        await run(saver, lambda: inserting(3), False)
        assert await run(saver, lambda: commit_setting(0), True) == "on"
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            await run(saver, failing, False)
        assert await run(saver, lambda: commit_setting(0), True) == "on"
        with psycopg.connect(pg_url) as check:
            stored = check.execute("SELECT n FROM notes ORDER BY n").fetchall()
        assert [r[0] for r in stored] == [0, 0, 0, 1, 1, 2]
    finally:
        if asynchronous:
            await aconn.close()
        else:
            conn.close()


def test_a_relaxed_write_inside_the_callers_postgres_transaction_is_not_relaxed(
    pg_url: str,
) -> None:
    """Inside a transaction the caller opened, the caller's commit decides: a relaxed
    write of agentcheck's does not turn synchronous_commit off for it."""
    from agentcheck.savers import PostgresSaver

    with psycopg.connect(pg_url, autocommit=True) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        conn.execute("CREATE TABLE notes (n INTEGER)")
        with conn.transaction():
            assert saver.run_op(lambda: commit_setting(1), True, durable=False) == "on"
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert conn.execute("SELECT count(*) FROM notes").fetchone() == (1,)


class Echo(BaseChatModel):
    """Answers "answer to <the prompt's last text>"; counts its calls."""

    calls: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "echo"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        prompt = str(messages[-1].content)
        self.calls.append(prompt)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(f"answer to {prompt}"))])


class Jitter(BaseCallbackHandler):
    """A tracing handler that holds each model call back before it starts, longest for
    the first prompt at the first run and for the last one at the resume: the calls
    reach the model in the opposite orders (LangChain runs a sync handler in a thread
    pool for an async call; a batch's calls run in threads)."""

    def __init__(self, prompts: list[str]) -> None:
        self.prompts = prompts
        self.first_run = True

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        i = self.prompts.index(str(messages[0][-1].content))
        time.sleep(0.05 * (len(self.prompts) - 1 - i if self.first_run else i))


@pytest.mark.parametrize(
    ("kind", "how"),
    [(kind, how) for kind in KINDS for how in ("batch", "as_completed")]
    + [(kind, "gather") for kind in ASYNC_KINDS],
)
async def test_model_calls_made_together_replay_each_its_own_answer(
    kind: str, saver: Any, how: str
) -> None:
    """A node asks the model three prompts at once (batch, or asyncio.gather of ainvoke),
    then interrupts. The calls were numbered in the order they reached the model, which
    a tracing handler (or the threads of a batch) can turn around: the resume handed
    each prompt another prompt's recorded answer."""
    prompts = ["A", "B", "C"]
    inner = Echo(calls=[])
    model = durable_model(inner)
    jitter = Jitter(prompts)

    def after(answers: list[Any]) -> dict[str, Any]:
        return {"out": [a.content for a in answers] + [interrupt("go on?")]}

    if is_async(kind):

        async def node(state: Log) -> dict[str, Any]:
            if how == "batch":
                return after(await model.abatch(prompts))
            if how == "as_completed":
                done = [x async for x in model.abatch_as_completed(prompts)]
                return after([answer for _, answer in sorted(done, key=lambda x: x[0])])
            return after(await asyncio.gather(*(model.ainvoke(p) for p in prompts)))

    else:

        def node(state: Log) -> dict[str, Any]:  # type: ignore[misc]
            if how == "as_completed":
                done = sorted(model.batch_as_completed(prompts), key=lambda x: x[0])
                return after([answer for _, answer in done])
            return after(model.batch(prompts))

    graph = one_node_graph(node, saver)
    run_config = {**config("t1"), "callbacks": [jitter]}
    await call(graph, "invoke", kind, {"out": []}, run_config)
    assert inner.calls == ["C", "B", "A"]  # they reached the model in reverse
    jitter.first_run = False
    final = await call(graph, "invoke", kind, Command(resume="yes"), run_config)
    assert inner.calls == ["C", "B", "A"]  # each paid for once
    assert final["out"] == ["answer to A", "answer to B", "answer to C", "yes"]


def test_calls_started_together_are_numbered_in_the_order_they_started(tmp_path: Path) -> None:
    """Three calls of a resumed task start together (asyncio.gather), and each first
    looks up its task's key prefix: they were numbered after that look-up, in the order
    it answered them, so the resume could swap their recorded results."""
    spec = EffectSpec(name="charge", effect="side_effect", on_unknown="raise", reconcile=None)
    counters: dict[str, int] = {}

    def prefix() -> Iterator[Any]:
        return "p"
        yield  # a journal operation with no statement

    with SqliteSaver.from_conn_string(str(tmp_path / "j.db")) as saver:
        runs = []
        for amount in (1, 2, 3):
            ctx = CallContext(
                journal=saver.journal, scope="s", key_prefix="", counters=counters,
                resolve_prefix=prefix,
            )  # fmt: skip
            run = ProtocolRun(protocol(spec, ctx, {"amount": amount}), ctx, spec)
            assert isinstance(run._next(None, None).make_op, type(prefix))  # the look-up
            runs.append(run)
        for amount, run in reversed(list(zip((1, 2, 3), runs, strict=True))):  # answered
            run.to_call(value="p")  # claims its step, up to the call
            assert run.to_call(value=f"charged {amount}") == Done(f"charged {amount}")
        steps = {s.step_key: s.args for s in saver.journal.steps(scope="s")}
    assert steps == {f"p|tool:charge#{i}": {"amount": i + 1} for i in range(3)}


# --------------------------------------------------------------------------- 8. unprotected


def unique_charge(is_coroutine: bool, calls: list[int]) -> Any:
    """A ``@side_effect`` function with a name no other test uses (the warning about an
    unprotected call is given once per name and process)."""
    name = f"charge_{uuid.uuid4().hex[:8]}"
    if is_coroutine:

        async def fn(amount: int, idempotency_key: str) -> str:
            calls.append(amount)
            return idempotency_key

    else:

        def fn(amount: int, idempotency_key: str) -> str:  # type: ignore[misc]
            calls.append(amount)
            return idempotency_key

    fn.__name__ = fn.__qualname__ = name
    return side_effect(fn)


def unprotected_warnings(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "agentcheck" and r.levelno == logging.WARNING and name in r.getMessage()
    ]


@pytest.mark.parametrize("is_coroutine", [False, True], ids=["sync", "async"])
async def test_outside_a_graph_every_call_runs_with_one_warning(
    is_coroutine: bool, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []
    charge = unique_charge(is_coroutine, calls)
    caplog.set_level(logging.WARNING, logger="agentcheck")

    keys = []
    for amount in (1, 1, 2):
        key = charge(amount)
        keys.append(await key if is_coroutine else key)

    assert calls == [1, 1, 2]
    assert len(set(keys)) == 3  # no stable key without a journal
    records = unprotected_warnings(caplog, charge.__name__)
    assert len(records) == 1
    assert "not protected against running twice" in records[0].getMessage()


@pytest.mark.parametrize("is_coroutine", [False, True], ids=["sync", "async"])
async def test_with_a_non_agentcheck_saver_every_call_runs_with_one_warning(
    is_coroutine: bool, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []
    charge = unique_charge(is_coroutine, calls)
    caplog.set_level(logging.WARNING, logger="agentcheck")
    kind = "async_sqlite" if is_coroutine else "sqlite"
    graph = one_node_graph(
        calling_node(kind, charge, (6,), lambda key: {"out": [key, interrupt("ok?")]}),
        InMemorySaver(),
    )

    await call(graph, "invoke", kind, {"out": []}, config("t1"))
    await call(graph, "invoke", kind, Command(resume="ok"), config("t1"))

    assert calls == [6, 6]
    assert len(unprotected_warnings(caplog, charge.__name__)) == 1


@pytest.mark.parametrize("kind", ["sqlite"])
async def test_a_call_context_of_a_framework_names_its_scope_and_run_as_text(
    kind: str, saver: Any
) -> None:
    """A framework's resolver may give its CallContext a UUID or an enum member: they
    went to the database as they were (a UUID an SQLite binding error; an enum member
    stored by its value while its run was started under str() of it, one id naming
    two runs). They are now the text every other id is."""

    class Color(str, enum.Enum):
        RED = "red"

    scope = uuid.UUID(int=5)
    ctx = CallContext(journal=saver.journal, scope=scope, key_prefix="p", run_id=Color.RED)  # type: ignore[arg-type]
    assert (ctx.scope, ctx.run_id) == (str(scope), "Color.RED")
    with pytest.raises(TypeError, match="scope must be text"):
        CallContext(journal=saver.journal, scope=None, key_prefix="p")  # type: ignore[arg-type]


@parametrize_kinds
async def test_an_effect_scope_given_as_a_number_is_its_text(kind: str, saver: Any) -> None:
    """An order number given as an int names the same scope as its text: the step is
    stored under "42", replays under 42 or "42", and what a claim returns is the row."""
    calls: list[int] = []
    charge = charge_fn(kind, calls)

    async def pay(scope: Any, amount: int) -> Any:
        with effect_scope(saver.journal, scope, run_id=7):  # type: ignore[arg-type]
            return await charge(amount) if is_async(kind) else charge(amount)

    first = await pay(42, 5)
    assert await pay(42, 6) == first == await pay("42", 7)
    assert calls == [5]
    (step,) = await call(saver.journal, "steps", kind, scope="42")
    assert (step.scope, step.run_id, step.status) == ("42", "7", "completed")
    # The journal's reads take the number too.
    assert await call(saver.journal, "steps", kind, scope=42, run_id=7) == [step]
    assert await call(saver.journal, "get_step", kind, 42, step.step_key) == step

    # A member of a (str, Enum) is str() of it, as LangGraph names a thread id (and as
    # the savers store one): one rule for every id, so that the journal of a thread is
    # found by the id given to the graph.
    class Shop(str, enum.Enum):
        EU = "shop-eu"

    await pay(Shop.EU, 8)
    assert await pay(str(Shop.EU), 9) == {"charged": 8, "run": 2}
    assert calls == [5, 8]
    assert [s.scope for s in await call(saver.journal, "steps", kind, scope=Shop.EU)] == [
        str(Shop.EU)
    ]
    # None and bytes would each become one key shared by every caller: refused.
    for bad in (None, b"order-1"):
        with pytest.raises(TypeError, match="scope must be text"):
            await pay(bad, 10)
    assert calls == [5, 8]


@parametrize_kinds
async def test_effect_scope_journals_by_ordinal_and_replays_in_order(kind: str, saver: Any) -> None:
    calls: list[int] = []
    charge = charge_fn(kind, calls)

    async def pass_(*amounts: int) -> list[Any]:
        with effect_scope(saver.journal, "scope-1"):
            if is_async(kind):
                return [await charge(a) for a in amounts]
            return [charge(a) for a in amounts]

    first = await pass_(1, 2)
    # A second pass in the same scope (after a crash): the calls line up by position,
    # whatever their arguments; a call past the recorded ones runs.
    second = await pass_(10, 20, 3)

    assert first == [{"charged": 1, "run": 1}, {"charged": 2, "run": 2}]
    assert second == [*first, {"charged": 3, "run": 3}]
    assert calls == [1, 2, 3]
    steps = await call(saver.journal, "steps", kind, scope="scope-1")
    assert sorted(s.step_key for s in steps) == [
        "|tool:charge#0",
        "|tool:charge#1",
        "|tool:charge#2",
    ]
    events = await call(saver.journal, "events", kind, "scope-1")
    assert [(e.phase, e.step_key) for e in events] == [
        ("start", "|tool:charge#0"),
        ("end", "|tool:charge#0"),
        ("start", "|tool:charge#1"),
        ("end", "|tool:charge#1"),
        ("replay", "|tool:charge#0"),
        ("replay", "|tool:charge#1"),
        ("start", "|tool:charge#2"),
        ("end", "|tool:charge#2"),
    ]
