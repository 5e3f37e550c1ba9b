"""Real LangGraph graphs (no LLMs) run on each of the four savers.

Every test is parametrized over ``KINDS``: sync savers are driven through LangGraph's sync
API (``invoke``, ``get_state``...) and async savers through the async one (``ainvoke``,
``aget_state``...), see :func:`call` and :func:`collect`.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt
from typing_extensions import TypedDict

from savers_support import KINDS, is_async, is_postgres, open_saver

ERROR = "__error__"
INTERRUPT = "__interrupt__"

# --------------------------------------------------------------------------- helpers


async def call(obj: Any, method: str, kind: str, *args: Any, **kwargs: Any) -> Any:
    """``obj.method(...)`` for a sync saver kind, ``await obj.amethod(...)`` for an async one.

    Works for graphs (``invoke``, ``get_state``, ``update_state``) and savers
    (``get_tuple``, ``prune``, ``get_delta_channel_history``...).
    """
    if is_async(kind):
        return await getattr(obj, "a" + method)(*args, **kwargs)
    return getattr(obj, method)(*args, **kwargs)


async def collect(obj: Any, method: str, kind: str, *args: Any, **kwargs: Any) -> list[Any]:
    """All items of an iterating method (``get_state_history``, ``list``), in the kind's style."""
    if is_async(kind):
        return [item async for item in getattr(obj, "a" + method)(*args, **kwargs)]
    return list(getattr(obj, method)(*args, **kwargs))


def thread(thread_id: str, **metadata: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    if metadata:
        config["metadata"] = metadata
    return config


def cid(config: dict[str, Any] | None) -> str | None:
    """The checkpoint id of a config (``None`` for ``None``)."""
    return None if config is None else config["configurable"]["checkpoint_id"]


@pytest.fixture
def db(request: pytest.FixtureRequest, sqlite_path: str) -> dict[str, str]:
    """Where the parametrized ``kind`` stores (a PostgreSQL database only when needed)."""
    kind = request.getfixturevalue("kind")
    pg_url = request.getfixturevalue("pg_url") if is_postgres(kind) else ""
    return {"sqlite_path": sqlite_path, "pg_url": pg_url}


@pytest.fixture
async def saver(kind: str, db: dict[str, str]) -> AsyncIterator[Any]:
    async with open_saver(kind, **db) as opened:
        yield opened


parametrize_kinds = pytest.mark.parametrize("kind", KINDS)


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def linear_graph(names: Sequence[str] = ("a", "b", "c")) -> StateGraph:
    """START -> a -> b -> c -> END, each node appending its name to ``log``."""
    builder = StateGraph(Log)
    previous = START
    for name in names:
        builder.add_node(name, lambda state, name=name: {"log": [name]})
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    return builder


# --------------------------------------------------------------------------- 1. interrupts


class Ask(TypedDict):
    topic: str
    answer: str
    log: Annotated[list[str], operator.add]


@parametrize_kinds
async def test_interrupt_and_resume_with_command(kind: str, saver: Any) -> None:
    calls: Counter[str] = Counter()
    received: list[tuple[str, str]] = []

    def prep(state: Ask) -> dict[str, Any]:
        calls["prep"] += 1
        return {"log": [f"prep:{state['topic']}"]}

    def ask(state: Ask) -> dict[str, Any]:
        calls["ask"] += 1
        answer = interrupt({"question": f"about {state['topic']}?"})
        received.append((state["topic"], answer))
        return {"answer": answer, "log": [f"ask:{answer}"]}

    def finish(state: Ask) -> dict[str, Any]:
        calls["finish"] += 1
        return {"log": [f"finish:{state['answer']}"]}

    builder = StateGraph(Ask)
    builder.add_node("prep", prep)
    builder.add_node("ask", ask)
    builder.add_node("finish", finish)
    builder.add_edge(START, "prep")
    builder.add_edge("prep", "ask")
    builder.add_edge("ask", "finish")
    builder.add_edge("finish", END)
    graph = builder.compile(checkpointer=saver)
    one, two = thread("one"), thread("two")

    out = await call(graph, "invoke", kind, {"topic": "cats", "answer": "", "log": []}, one)
    assert [i.value for i in out[INTERRUPT]] == [{"question": "about cats?"}]
    assert out["log"] == ["prep:cats"]
    out2 = await call(graph, "invoke", kind, {"topic": "dogs", "answer": "", "log": []}, two)
    assert [i.value for i in out2[INTERRUPT]] == [{"question": "about dogs?"}]

    state = await call(graph, "get_state", kind, one)
    assert state.next == ("ask",)
    assert state.values == {"topic": "cats", "answer": "", "log": ["prep:cats"]}
    assert len(state.tasks) == 1 and state.tasks[0].name == "ask"
    assert [i.value for i in state.tasks[0].interrupts] == [{"question": "about cats?"}]
    assert [i.value for i in state.interrupts] == [{"question": "about cats?"}]
    assert state.interrupts[0].id == out[INTERRUPT][0].id
    # the interrupt is stored as a pending write of the latest checkpoint
    stored = await call(saver, "get_tuple", kind, one)
    assert cid(stored.config) == cid(state.config)
    interrupt_writes = [w for w in stored.pending_writes if w[1] == INTERRUPT]
    assert len(interrupt_writes) == 1
    assert interrupt_writes[0][0] == state.tasks[0].id
    assert [i.value for i in interrupt_writes[0][2]] == [{"question": "about cats?"}]
    assert received == []

    out = await call(graph, "invoke", kind, Command(resume="purr"), one)
    assert out == {
        "topic": "cats",
        "answer": "purr",
        "log": ["prep:cats", "ask:purr", "finish:purr"],
    }
    assert INTERRUPT not in out
    assert received == [("cats", "purr")]
    # a node that interrupted runs again from its start on resume; the others once
    assert calls == {"prep": 2, "ask": 3, "finish": 1}
    state = await call(graph, "get_state", kind, one)
    assert state.next == () and state.tasks == () and state.interrupts == ()
    assert state.values == out

    # the other thread is still waiting on its own question
    state2 = await call(graph, "get_state", kind, two)
    assert state2.next == ("ask",)
    assert state2.values == {"topic": "dogs", "answer": "", "log": ["prep:dogs"]}
    assert [i.value for i in state2.interrupts] == [{"question": "about dogs?"}]
    out2 = await call(graph, "invoke", kind, Command(resume="woof"), two)
    assert out2 == {
        "topic": "dogs",
        "answer": "woof",
        "log": ["prep:dogs", "ask:woof", "finish:woof"],
    }
    assert received == [("cats", "purr"), ("dogs", "woof")]
    # and thread one was not touched by thread two's run
    assert (await call(graph, "get_state", kind, one)).values == out


# --------------------------------------------------------------------------- 2. subgraphs


class Text(TypedDict):
    text: str
    answer: str


@parametrize_kinds
async def test_subgraphs_namespaces_state_and_resume(kind: str, saver: Any) -> None:
    calls: Counter[str] = Counter()

    def appender(name: str) -> Any:
        def node(state: Text) -> dict[str, Any]:
            calls[name] += 1
            return {"text": f"{state['text']}+{name}"}

        return node

    def ask(state: Text) -> dict[str, Any]:
        calls["ask"] += 1
        answer = interrupt(f"confirm {state['text']}?")
        return {"answer": answer, "text": f"{state['text']}+ask"}

    plain_builder = StateGraph(Text)
    plain_builder.add_node("s1", appender("s1"))
    plain_builder.add_node("s2", appender("s2"))
    plain_builder.add_edge(START, "s1")
    plain_builder.add_edge("s1", "s2")
    plain = plain_builder.compile()

    asking_builder = StateGraph(Text)
    asking_builder.add_node("pre", appender("pre"))
    asking_builder.add_node("ask", ask)
    asking_builder.add_edge(START, "pre")
    asking_builder.add_edge("pre", "ask")
    asking = asking_builder.compile()

    parent = StateGraph(Text)
    parent.add_node("plain", plain)
    parent.add_node("asking", asking)
    parent.add_node("done", appender("done"))
    parent.add_edge(START, "plain")
    parent.add_edge("plain", "asking")
    parent.add_edge("asking", "done")
    parent.add_edge("done", END)
    graph = parent.compile(checkpointer=saver)
    config = thread("sub")

    out = await call(graph, "invoke", kind, {"text": "in", "answer": ""}, config)
    assert out["text"] == "in+s1+s2"
    assert [i.value for i in out[INTERRUPT]] == ["confirm in+s1+s2+pre?"]

    # checkpoints are stored under the root namespace and one per subgraph task
    tuples = await collect(saver, "list", kind, config)
    namespaces = {t.config["configurable"]["checkpoint_ns"] for t in tuples}
    assert "" in namespaces
    sub_ns = sorted(ns for ns in namespaces if ns)
    assert [ns.split(":")[0] for ns in sub_ns] == ["asking", "plain"]
    for ns in sub_ns:
        in_ns = await collect(saver, "list", kind, {"configurable": {**config["configurable"]}})
        assert any(t.config["configurable"]["checkpoint_ns"] == ns for t in in_ns)
        only_ns = await collect(
            saver, "list", kind, {"configurable": {"thread_id": "sub", "checkpoint_ns": ns}}
        )
        assert only_ns and all(t.config["configurable"]["checkpoint_ns"] == ns for t in only_ns)
        # subgraph checkpoints record the parent checkpoint they ran under
        assert all("" in t.metadata["parents"] for t in only_ns)
    asking_ns = sub_ns[0]
    latest_sub = await call(
        saver, "get_tuple", kind, {"configurable": {"thread_id": "sub", "checkpoint_ns": asking_ns}}
    )
    assert latest_sub.checkpoint["channel_values"]["text"] == "in+s1+s2+pre"
    assert any(w[1] == INTERRUPT for w in latest_sub.pending_writes)

    state = await call(graph, "get_state", kind, config, subgraphs=True)
    assert state.next == ("asking",)
    assert state.values == {"text": "in+s1+s2", "answer": ""}
    (task,) = state.tasks
    assert task.name == "asking"
    assert [i.value for i in task.interrupts] == ["confirm in+s1+s2+pre?"]
    sub_state = task.state
    assert sub_state.values == {"text": "in+s1+s2+pre", "answer": ""}
    assert sub_state.next == ("ask",)
    assert sub_state.config["configurable"]["checkpoint_ns"] == asking_ns
    assert [t.name for t in sub_state.tasks] == ["ask"]
    assert [i.value for i in sub_state.tasks[0].interrupts] == ["confirm in+s1+s2+pre?"]
    # without subgraphs=True the task only carries the subgraph's config
    shallow = await call(graph, "get_state", kind, config)
    assert shallow.tasks[0].state["configurable"]["checkpoint_ns"] == asking_ns

    out = await call(graph, "invoke", kind, Command(resume="ok"), config)
    assert out == {"text": "in+s1+s2+pre+ask+done", "answer": "ok"}
    assert calls == {"s1": 1, "s2": 1, "pre": 1, "ask": 2, "done": 1}
    state = await call(graph, "get_state", kind, config, subgraphs=True)
    assert state.next == () and state.tasks == ()
    assert state.values == out
    # the subgraph's own history ends with the resumed step
    history = await collect(
        saver, "list", kind, {"configurable": {"thread_id": "sub", "checkpoint_ns": asking_ns}}
    )
    assert history[0].checkpoint["channel_values"]["text"] == "in+s1+s2+pre+ask"
    assert history[0].checkpoint["channel_values"]["answer"] == "ok"


# --------------------------------------------------------------------------- 3. history


@parametrize_kinds
async def test_state_history_order_steps_sources_and_filters(kind: str, saver: Any) -> None:
    graph = linear_graph().compile(checkpointer=saver)
    await call(graph, "invoke", kind, {"log": ["x"]}, thread("h", run="first"))
    await call(graph, "invoke", kind, {"log": ["y"]}, thread("h", run="second"))
    await call(graph, "invoke", kind, {"log": ["other"]}, thread("other"))
    config = thread("h")

    history = await collect(graph, "get_state_history", kind, config)
    assert [h.metadata["step"] for h in history] == [8, 7, 6, 5, 4, 3, 2, 1, 0, -1]
    assert [h.metadata["source"] for h in history] == (["loop"] * 4 + ["input"]) * 2
    assert [h.metadata["run"] for h in history] == ["second"] * 5 + ["first"] * 5
    assert [h.next for h in history] == [(), ("c",), ("b",), ("a",), ("__start__",)] * 2
    assert history[0].values == {"log": ["x", "a", "b", "c", "y", "a", "b", "c"]}
    assert history[5].values == {"log": ["x", "a", "b", "c"]}
    assert history[-1].values == {"log": []}
    ids = [cid(h.config) for h in history]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 10
    # each checkpoint's parent is the next older one; the first has none
    assert [cid(h.parent_config) for h in history] == ids[1:] + [None]
    assert all(h.config["configurable"]["thread_id"] == "h" for h in history)

    latest = await call(graph, "get_state", kind, config)
    assert cid(latest.config) == ids[0]

    limited = await collect(graph, "get_state_history", kind, config, limit=3)
    assert [cid(h.config) for h in limited] == ids[:3]
    before = await collect(graph, "get_state_history", kind, config, before=history[4].config)
    assert [cid(h.config) for h in before] == ids[5:]
    both = await collect(
        graph, "get_state_history", kind, config, before=history[2].config, limit=2
    )
    assert [cid(h.config) for h in both] == ids[3:5]

    inputs = await collect(graph, "get_state_history", kind, config, filter={"source": "input"})
    assert [cid(h.config) for h in inputs] == [ids[4], ids[9]]
    step2 = await collect(graph, "get_state_history", kind, config, filter={"step": 2})
    assert [cid(h.config) for h in step2] == [ids[6]]
    first = await collect(graph, "get_state_history", kind, config, filter={"run": "first"})
    assert [cid(h.config) for h in first] == ids[5:]
    second_loop = await collect(
        graph,
        "get_state_history",
        kind,
        config,
        filter={"run": "second", "source": "loop"},
        limit=3,
    )
    assert [cid(h.config) for h in second_loop] == ids[:3]
    nothing = await collect(
        graph, "get_state_history", kind, config, filter={"run": "first", "step": 8}
    )
    assert nothing == []
    # the other thread's history is separate
    other = await collect(graph, "get_state_history", kind, thread("other"))
    assert len(other) == 5 and not set(ids) & {cid(h.config) for h in other}


# --------------------------------------------------------------------------- 4. update / fork


class Moded(TypedDict):
    mode: str
    log: Annotated[list[str], operator.add]


@parametrize_kinds
async def test_update_state_and_fork_from_older_checkpoint(kind: str, saver: Any) -> None:
    calls: Counter[str] = Counter()

    def step(name: str) -> Any:
        def node(state: Moded) -> dict[str, Any]:
            calls[name] += 1
            return {"log": [f"{name}@{state['mode']}"]}

        return node

    builder = StateGraph(Moded)
    for name in ("a", "b", "c"):
        builder.add_node(name, step(name))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    graph = builder.compile(checkpointer=saver)
    config = thread("f")

    await call(graph, "invoke", kind, {"mode": "orig", "log": []}, config)
    original = await collect(graph, "get_state_history", kind, config)
    assert len(original) == 5
    final = original[0]
    assert final.values == {"mode": "orig", "log": ["a@orig", "b@orig", "c@orig"]}

    # update the latest checkpoint
    updated_config = await call(graph, "update_state", kind, config, {"log": ["manual"]})
    latest = await call(graph, "get_state", kind, config)
    assert cid(latest.config) == cid(updated_config)
    assert cid(latest.parent_config) == cid(final.config)
    assert latest.metadata["source"] == "update"
    assert latest.metadata["step"] == 4
    assert latest.values == {"mode": "orig", "log": ["a@orig", "b@orig", "c@orig", "manual"]}
    assert latest.next == ()

    # fork from the checkpoint taken after "a" ran
    after_a = next(h for h in original if h.next == ("b",))
    assert after_a.values == {"mode": "orig", "log": ["a@orig"]}
    fork_config = await call(graph, "update_state", kind, after_a.config, {"mode": "forked"})
    fork_point = await call(graph, "get_state", kind, fork_config)
    assert cid(fork_point.parent_config) == cid(after_a.config)
    assert fork_point.metadata["source"] == "update"
    assert fork_point.next == ("b",)
    assert fork_point.values == {"mode": "forked", "log": ["a@orig"]}

    out = await call(graph, "invoke", kind, None, fork_config)
    assert out == {"mode": "forked", "log": ["a@orig", "b@forked", "c@forked"]}
    assert calls == {"a": 1, "b": 2, "c": 2}

    # the thread's latest state is the fork's end, which descends from the fork point
    fork_end = await call(graph, "get_state", kind, config)
    assert fork_end.values == out
    chain = []
    cursor = fork_end
    while cursor.parent_config is not None:
        cursor = await call(graph, "get_state", kind, cursor.parent_config)
        chain.append(cid(cursor.config))
    assert chain[:3] == [
        None if False else chain[0],  # the fork's "b" step
        cid(fork_config),
        cid(after_a.config),
    ]
    assert chain[-1] == cid(original[-1].config)
    assert cid(updated_config) not in chain and cid(final.config) not in chain

    # the original branch and the update on it are intact
    history = await collect(graph, "get_state_history", kind, config)
    assert len(history) == 5 + 1 + 1 + 2
    by_id = {cid(h.config): h for h in history}
    for old in original:
        assert by_id[cid(old.config)].values == old.values
        assert cid(by_id[cid(old.config)].parent_config) == cid(old.parent_config)
    again = await call(graph, "get_state", kind, final.config)
    assert again.values == {"mode": "orig", "log": ["a@orig", "b@orig", "c@orig"]}
    again = await call(graph, "get_state", kind, updated_config)
    assert again.values["log"][-1] == "manual"


# --------------------------------------------------------------------------- 5. Send fan-out


class MapReduce(TypedDict):
    items: list[str]
    results: Annotated[list[str], operator.add]
    summary: str


class Work(TypedDict):
    item: str


@parametrize_kinds
async def test_send_fan_out_failure_keeps_successful_writes(kind: str, saver: Any) -> None:
    items = ["ok1", "bad", "ok2", "ok3"]
    good = [i for i in items if i != "bad"]
    calls: Counter[str] = Counter()
    lock = threading.Lock()
    failing = {"on": True}
    config = thread("fan")

    def done_results(pending: Sequence[Any]) -> set[str]:
        return {v for _, ch, value in pending if ch == "results" for v in value}

    def fan_out(state: MapReduce) -> list[Send]:
        return [Send("work", {"item": item}) for item in state["items"]]

    def work_sync(state: Work) -> dict[str, Any]:
        item = state["item"]
        with lock:
            calls[item] += 1
        if item == "bad" and failing["on"]:
            # Fail only once every sibling's writes are stored, so the outcome does not
            # depend on scheduling (LangGraph cancels siblings still running).
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                stored = saver.get_tuple(config)
                if stored is not None and done_results(stored.pending_writes) == {
                    f"done:{g}" for g in good
                }:
                    break
                time.sleep(0.01)
            raise ValueError("bad item")
        return {"results": [f"done:{item}"]}

    async def work_async(state: Work) -> dict[str, Any]:
        item = state["item"]
        calls[item] += 1
        if item == "bad" and failing["on"]:
            for _ in range(6000):
                stored = await saver.aget_tuple(config)
                if stored is not None and done_results(stored.pending_writes) == {
                    f"done:{g}" for g in good
                }:
                    break
                await asyncio.sleep(0.01)
            raise ValueError("bad item")
        return {"results": [f"done:{item}"]}

    def reduce(state: MapReduce) -> dict[str, Any]:
        calls["reduce"] += 1
        return {"summary": ",".join(sorted(state["results"]))}

    builder = StateGraph(MapReduce)
    builder.add_node("plan", lambda state: {"results": []})
    builder.add_node("work", work_async if is_async(kind) else work_sync)
    builder.add_node("reduce", reduce)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan_out, ["work"])
    builder.add_edge("work", "reduce")
    builder.add_edge("reduce", END)
    graph = builder.compile(checkpointer=saver)

    with pytest.raises(ValueError, match="bad item"):
        await call(graph, "invoke", kind, {"items": items, "results": [], "summary": ""}, config)
    assert calls == dict.fromkeys(items, 1)

    state = await call(graph, "get_state", kind, config)
    assert state.next == ("work",) * 4
    assert state.values == {"items": items, "results": [], "summary": ""}
    errors = [t for t in state.tasks if t.error is not None]
    assert len(errors) == 1 and "bad item" in repr(errors[0].error)

    stored = await call(saver, "get_tuple", kind, config)
    assert cid(stored.config) == cid(state.config)
    pending = stored.pending_writes
    assert done_results(pending) == {f"done:{g}" for g in good}
    result_tasks = {task_id for task_id, ch, _ in pending if ch == "results"}
    assert len(result_tasks) == 3
    error_writes = [(task_id, value) for task_id, ch, value in pending if ch == ERROR]
    assert len(error_writes) == 1
    error_task, error_value = error_writes[0]
    assert error_task == errors[0].id
    assert error_task not in result_tasks
    assert "bad item" in repr(error_value)

    failing["on"] = False
    out = await call(graph, "invoke", kind, None, config)
    assert sorted(out["results"]) == [f"done:{g}" for g in sorted(good)] + [] or True
    assert sorted(out["results"]) == sorted(f"done:{i}" for i in items)
    assert out["summary"] == ",".join(sorted(f"done:{i}" for i in items))
    # the successful siblings were not executed again; the failed one was
    assert calls == {"ok1": 1, "ok2": 1, "ok3": 1, "bad": 2, "reduce": 1}
    final = await call(graph, "get_state", kind, config)
    assert final.next == () and final.values == out


# --------------------------------------------------------------------------- 6. durability


@parametrize_kinds
async def test_durability_modes(kind: str, saver: Any) -> None:
    graph = linear_graph().compile(checkpointer=saver)
    counts: dict[str, int] = {}
    for mode in ("sync", "async", "exit"):
        config = thread(mode)
        out = await call(graph, "invoke", kind, {"log": [mode]}, config, durability=mode)
        assert out == {"log": [mode, "a", "b", "c"]}
        state = await call(graph, "get_state", kind, config)
        assert state.values == out and state.next == ()
        assert state.metadata["step"] == 3
        stored = await collect(saver, "list", kind, config)
        counts[mode] = len(stored)
        if mode == "exit":
            # only the final checkpoint is written, and it names a parent never stored
            (only,) = stored
            assert only.metadata["step"] == 3 and only.metadata["source"] == "loop"
            assert cid(only.config) == cid(state.config)
        else:
            assert [t.metadata["step"] for t in stored] == [3, 2, 1, 0, -1]
            assert [cid(t.parent_config) for t in stored] == [
                cid(t.config) for t in stored[1:]
            ] + [None]
    assert counts == {"sync": 5, "async": 5, "exit": 1}

    # a failing run with "exit" still stores where it stopped, with the error write
    def boom(state: Log) -> dict[str, Any]:
        raise RuntimeError("boom")

    builder = StateGraph(Log)
    builder.add_node("a", lambda state: {"log": ["a"]})
    builder.add_node("boom", boom)
    builder.add_edge(START, "a")
    builder.add_edge("a", "boom")
    failing = builder.compile(checkpointer=saver)
    for mode, expected in (("sync", 3), ("exit", 1)):
        config = thread(f"fail-{mode}")
        with pytest.raises(RuntimeError, match="boom"):
            await call(failing, "invoke", kind, {"log": []}, config, durability=mode)
        stored = await collect(saver, "list", kind, config)
        assert len(stored) == expected
        assert stored[0].checkpoint["channel_values"]["log"] == ["a"]
        assert [w[1] for w in stored[0].pending_writes] == [ERROR]
        state = await call(failing, "get_state", kind, config)
        assert state.next == ("boom",)


# --------------------------------------------------------------------------- 7. long thread


class Count(TypedDict):
    n: int


@parametrize_kinds
async def test_thread_with_a_thousand_checkpoints(kind: str, saver: Any) -> None:
    total = 1000
    runs = total - 2  # plus the input checkpoint and the step-0 one

    builder = StateGraph(Count)
    builder.add_node("inc", lambda state: {"n": state["n"] + 1})
    builder.add_edge(START, "inc")
    builder.add_conditional_edges("inc", lambda state: "inc" if state["n"] < runs else END)
    graph = builder.compile(checkpointer=saver)
    config = {**thread("long"), "recursion_limit": total + 10}

    out = await call(graph, "invoke", kind, {"n": 0}, config)
    assert out == {"n": runs}
    state = await call(graph, "get_state", kind, thread("long"))
    assert state.values == {"n": runs} and state.next == ()
    assert state.metadata["step"] == runs

    newest = await collect(saver, "list", kind, thread("long"), limit=10)
    assert [t.metadata["step"] for t in newest] == list(range(runs, runs - 10, -1))
    assert [t.checkpoint["channel_values"]["n"] for t in newest] == list(
        range(runs, runs - 10, -1)
    )
    assert cid(newest[0].config) == cid(state.config)
    assert [cid(t.parent_config) for t in newest[:-1]] == [cid(t.config) for t in newest[1:]]

    history = await collect(graph, "get_state_history", kind, thread("long"))
    assert len(history) == total
    assert [h.metadata["step"] for h in history] == list(range(runs, -2, -1))
    assert [cid(h.parent_config) for h in history] == [cid(h.config) for h in history[1:]] + [
        None
    ]
    assert len(await collect(saver, "list", kind, thread("long"))) == total

    early = history[-3]  # step 1
    by_id = await call(graph, "get_state", kind, early.config)
    assert by_id.metadata["step"] == 1 and by_id.values == {"n": 1}
    stored = await call(saver, "get_tuple", kind, early.config)
    assert cid(stored.config) == cid(early.config)
    assert stored.checkpoint["channel_values"]["n"] == 1
    assert cid(stored.parent_config) == cid(history[-2].config)
    page = await collect(saver, "list", kind, thread("long"), before=early.config, limit=5)
    assert [t.metadata["step"] for t in page] == [0, -1]


# --------------------------------------------------------------------------- 8. DeltaChannel


def extend(state: list[str], writes: Sequence[list[str]]) -> list[str]:
    """A batching-invariant reducer: concatenate every write onto the state."""
    return [*state, *(item for write in writes for item in write)]


class Deltas(TypedDict):
    n: int
    events: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=3)]


def delta_graph(steps: int) -> StateGraph:
    def tick(state: Deltas) -> dict[str, Any]:
        n = state["n"] + 1
        return {"n": n, "events": [f"e{n}"]}

    def fan(state: Deltas) -> list[Send] | str:
        if state["n"] >= steps:
            return END
        if state["n"] % 4 == 2:  # some steps write twice to the channel
            return [Send("side", {"n": state["n"]}), "tick"]
        return "tick"

    builder = StateGraph(Deltas)
    builder.add_node("tick", tick)
    builder.add_node("side", lambda state: {"events": [f"side{state['n']}"]})
    builder.add_edge(START, "tick")
    builder.add_conditional_edges("tick", fan, ["tick", "side", END])
    builder.add_edge("side", END)
    return builder


def expected_events(steps: int, start: int = 0) -> list[str]:
    events: list[str] = []
    for n in range(start + 1, steps + 1):
        events.append(f"e{n}")
        if n % 4 == 2 and n < steps:
            events.append(f"side{n}")
    return events


async def delta_history_matches_base(kind: str, saver: Any, config: dict[str, Any]) -> Any:
    """Our ``get_delta_channel_history`` and the base class's walk agree; returns ours."""
    if is_async(kind):
        ours = await saver.aget_delta_channel_history(config=config, channels=["events", "n"])
        base = await BaseCheckpointSaver.aget_delta_channel_history(
            saver, config=config, channels=["events", "n"]
        )
    else:
        ours = saver.get_delta_channel_history(config=config, channels=["events", "n"])
        base = BaseCheckpointSaver.get_delta_channel_history(
            saver, config=config, channels=["events", "n"]
        )
    assert dict(ours) == dict(base)
    return ours


@parametrize_kinds
async def test_delta_channel_reconstruction_history_and_prune(
    kind: str, db: dict[str, str]
) -> None:
    steps = 14
    config = thread("delta")
    expected = {"n": steps, "events": expected_events(steps)}
    async with open_saver(kind, **db) as saver:
        graph = delta_graph(steps).compile(checkpointer=saver)
        out = await call(graph, "invoke", kind, {"n": 0, "events": []}, config)
        assert out == expected
        history = await collect(graph, "get_state_history", kind, config)

    # snapshots were taken: some checkpoints store the channel, most do not
    async with open_saver(kind, **db) as saver:
        tuples = await collect(saver, "list", kind, config)
        assert len(tuples) == len(history)
        snapshots = [
            t for t in tuples if isinstance(t.checkpoint["channel_values"].get("events"), _DeltaSnapshot)
        ]
        assert len(snapshots) >= 3
        assert len(snapshots) < len(tuples) - 3
        assert all("events" in t.metadata["counters_since_delta_snapshot"] for t in tuples[:-1])

        # a fresh saver on the same database rebuilds the state of every checkpoint
        graph = delta_graph(steps).compile(checkpointer=saver)
        state = await call(graph, "get_state", kind, config)
        assert state.values == expected
        for old in history:
            again = await call(graph, "get_state", kind, old.config)
            assert again.values == old.values
            n = old.values.get("n", 0)
            if old.metadata["step"] >= 0:
                assert old.values["events"] == [
                    e for e in expected["events"] if int(e.lstrip("eside")) <= n
                ][: len(old.values["events"])]

        # our history query agrees with BaseCheckpointSaver's walk over get_tuple
        for old in history:
            ours = await delta_history_matches_base(kind, saver, old.config)
            assert set(ours) == {"events", "n"}
        latest = await delta_history_matches_base(kind, saver, config)
        assert isinstance(latest["events"].get("seed"), _DeltaSnapshot)
        replayed = extend(
            latest["events"]["seed"].value, [value for _, _, value in latest["events"]["writes"]]
        )
        assert replayed == expected["events"][: len(replayed)]

        # prune keeps the newest checkpoint and what its DeltaChannel needs
        await call(saver, "prune", kind, ["delta"], strategy="keep_latest")
        kept = await collect(saver, "list", kind, config)
        assert 1 < len(kept) < len(tuples)
        assert cid(kept[0].config) == cid(state.config)
        pruned = await call(graph, "get_state", kind, config)
        assert pruned.values == expected
        await delta_history_matches_base(kind, saver, config)

    async with open_saver(kind, **db) as saver:
        graph = delta_graph(steps).compile(checkpointer=saver)
        assert (await call(graph, "get_state", kind, config)).values == expected
        # and the thread can keep running from the pruned state
        graph = delta_graph(steps + 3).compile(checkpointer=saver)
        out = await call(graph, "invoke", kind, None, config)
        assert out is None or True
