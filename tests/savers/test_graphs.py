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
from collections.abc import Sequence
from typing import Annotated, Any

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt
from typing_extensions import TypedDict

from savers_support import KINDS, call, collect, is_async, open_saver

ERROR = "__error__"
INTERRUPT = "__interrupt__"

# --------------------------------------------------------------------------- helpers


def thread(thread_id: str, **metadata: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    if metadata:
        config["metadata"] = metadata
    return config


def cid(config: dict[str, Any] | None) -> str | None:
    """The checkpoint id of a config (``None`` for ``None``)."""
    return None if config is None else config["configurable"]["checkpoint_id"]


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
    by_ns: dict[str, list[Any]] = {}
    for t in await collect(saver, "list", kind, config):  # every namespace of the thread
        by_ns.setdefault(t.config["configurable"]["checkpoint_ns"], []).append(t)
    assert sorted(ns.split(":")[0] for ns in by_ns) == ["", "asking", "plain"]
    plain_ns = next(ns for ns in by_ns if ns.startswith("plain:"))
    asking_ns = next(ns for ns in by_ns if ns.startswith("asking:"))
    root = by_ns[""]
    assert [t.metadata["step"] for t in root] == [1, 0, -1]
    assert [t.metadata["step"] for t in by_ns[plain_ns]] == [2, 1, 0, -1]
    assert [t.metadata["step"] for t in by_ns[asking_ns]] == [1, 0, -1]
    # a subgraph's checkpoints name the root checkpoint whose task ran them
    assert all(t.metadata["parents"] == {"": cid(root[1].config)} for t in by_ns[plain_ns])
    assert all(t.metadata["parents"] == {"": cid(root[0].config)} for t in by_ns[asking_ns])
    assert all(t.metadata["parents"] == {} for t in root)
    # listing one namespace returns exactly its checkpoints
    for ns, group in by_ns.items():
        only = await collect(
            saver, "list", kind, {"configurable": {"thread_id": "sub", "checkpoint_ns": ns}}
        )
        assert [cid(t.config) for t in only] == [cid(t.config) for t in group]
    assert by_ns[plain_ns][0].checkpoint["channel_values"]["text"] == "in+s1+s2"
    latest_sub = await call(
        saver, "get_tuple", kind, {"configurable": {"thread_id": "sub", "checkpoint_ns": asking_ns}}
    )
    assert cid(latest_sub.config) == cid(by_ns[asking_ns][0].config)
    assert latest_sub.checkpoint["channel_values"]["text"] == "in+s1+s2+pre"
    assert [w[1] for w in latest_sub.pending_writes] == [INTERRUPT]

    state = await call(graph, "get_state", kind, config, subgraphs=True)
    assert state.next == ("asking",)
    assert state.values == {"text": "in+s1+s2", "answer": ""}
    (task,) = state.tasks
    assert task.name == "asking"
    assert [i.value for i in task.interrupts] == ["confirm in+s1+s2+pre?"]
    assert asking_ns == f"asking:{task.id}"
    sub_state = task.state
    assert cid(sub_state.config) == cid(latest_sub.config)
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


def _extend_in_place(left: list[str], right: list[str]) -> list[str]:
    left.extend(right)  # impure, but common: the reducer changes the list it is given
    return left


class InPlace(TypedDict):
    items: Annotated[list[str], _extend_in_place]


@parametrize_kinds
async def test_history_snapshots_do_not_share_a_list(kind: str, saver: Any) -> None:
    """Checkpoints read together that hold one version of a list each get their own
    list, as with the official savers: LangGraph applying a pending Command's update
    with a reducer that extends in place changes that checkpoint's snapshot only, and
    so does a caller changing one snapshot's list."""
    builder = StateGraph(InPlace)
    builder.add_node("a", lambda state: {})
    builder.add_node("ask", lambda state: {"items": [interrupt("q")]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)
    config = thread("shared")
    await call(graph, "invoke", kind, {"items": ["x"]}, config)
    await call(graph, "invoke", kind, Command(resume="answer", update={"items": ["upd"]}), config)

    history = await collect(graph, "get_state_history", kind, config)
    steps = {h.metadata["step"]: h.values.get("items") for h in history}
    assert steps[2] == ["x", "upd", "answer"]
    assert steps[1] == ["x", "upd"]  # its pending update, applied to it alone
    assert steps[0] == ["x"]
    tuples = await collect(saver, "list", kind, config)
    lists = [t.checkpoint["channel_values"]["items"] for t in tuples[-3:-1]]
    assert lists[0] == lists[1] == ["x"] and lists[0] is not lists[1]
    lists[0].append("changed")
    assert lists[1] == ["x"]


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
    # fork end <- fork's "b" step <- the update (fork point) <- after "a" <- ...
    assert chain[1:3] == [cid(fork_config), cid(after_a.config)]
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
    assert again.values == {"mode": "orig", "log": ["a@orig", "b@orig", "c@orig", "manual"]}


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
    # only the failed task is left to run; get_state applies the siblings' saved writes
    assert state.next == ("work",)
    assert state.values == {"items": items, "results": [f"done:{g}" for g in good], "summary": ""}
    assert [t.name for t in state.tasks] == ["work"] * 4
    errors = [t for t in state.tasks if t.error is not None]
    assert len(errors) == 1 and "bad item" in repr(errors[0].error)
    assert [t.result for t in state.tasks if t.error is None] == [
        {"results": [f"done:{g}"]} for g in good
    ]

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
    # writes are applied in task order, so the resumed task's result lands in its slot
    assert out["results"] == [f"done:{i}" for i in items]
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
            # only the final checkpoint is written, with no parent (none was stored)
            (only,) = stored
            assert only.metadata["step"] == 3 and only.metadata["source"] == "loop"
            assert cid(only.config) == cid(state.config)
            assert only.parent_config is None
        else:
            assert [t.metadata["step"] for t in stored] == [3, 2, 1, 0, -1]
            assert [cid(t.parent_config) for t in stored] == [cid(t.config) for t in stored[1:]] + [
                None
            ]
    assert counts == {"sync": 5, "async": 5, "exit": 1}

    # a second "exit" run on the thread adds one checkpoint, child of the first run's
    first = await call(saver, "get_tuple", kind, thread("exit"))
    out = await call(graph, "invoke", kind, {"log": ["again"]}, thread("exit"), durability="exit")
    assert out == {"log": ["exit", "a", "b", "c", "again", "a", "b", "c"]}
    stored = await collect(saver, "list", kind, thread("exit"))
    assert [t.metadata["step"] for t in stored] == [8, 3]
    assert cid(stored[0].parent_config) == cid(first.config)
    # while "sync" keeps every step of the second run too
    await call(graph, "invoke", kind, {"log": ["again"]}, thread("sync"), durability="sync")
    assert len(await collect(saver, "list", kind, thread("sync"))) == 10

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
    assert [t.checkpoint["channel_values"]["n"] for t in newest] == list(range(runs, runs - 10, -1))
    assert cid(newest[0].config) == cid(state.config)
    assert [cid(t.parent_config) for t in newest[:-1]] == [cid(t.config) for t in newest[1:]]

    history = await collect(graph, "get_state_history", kind, thread("long"))
    assert len(history) == total
    assert [h.metadata["step"] for h in history] == list(range(runs, -2, -1))
    assert [cid(h.parent_config) for h in history] == [cid(h.config) for h in history[1:]] + [None]
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


def expected_events(n: int) -> list[str]:
    """``events`` once ``tick`` has run ``n`` times: "side" k runs in the step of tick k+1,
    after it (LangGraph orders a step's pull tasks before its ``Send`` tasks)."""
    events: list[str] = []
    for m in range(1, n + 1):
        events.append(f"e{m}")
        if (m - 1) % 4 == 2:
            events.append(f"side{m - 1}")
    return events


async def delta_history_matches_base(kind: str, saver: Any, config: dict[str, Any]) -> Any:
    """Our ``get_delta_channel_history`` and the base class's walk agree; returns ours."""
    channels = ["events", "n"]
    if is_async(kind):
        ours = await saver.aget_delta_channel_history(config=config, channels=channels)
        base = await BaseCheckpointSaver.aget_delta_channel_history(
            saver, config=config, channels=channels
        )
    else:
        ours = saver.get_delta_channel_history(config=config, channels=channels)
        base = BaseCheckpointSaver.get_delta_channel_history(
            saver, config=config, channels=channels
        )
    assert dict(ours) == dict(base)
    assert set(ours) == set(channels)
    return ours


DELTA_STEPS = 13  # snapshots at steps 2, 5, 8 and 11; the last checkpoint is not one


async def run_delta_thread(kind: str, db: dict[str, str]) -> list[Any]:
    """Run the DeltaChannel graph on thread "delta"; return its history (newest first)."""
    async with open_saver(kind, **db) as saver:
        graph = delta_graph(DELTA_STEPS).compile(checkpointer=saver)
        out = await call(graph, "invoke", kind, {"n": 0, "events": []}, thread("delta"))
        assert out == {"n": DELTA_STEPS, "events": expected_events(DELTA_STEPS)}
        return await collect(graph, "get_state_history", kind, thread("delta"))


@parametrize_kinds
async def test_delta_channel_state_rebuilt_by_fresh_saver(kind: str, db: dict[str, str]) -> None:
    history = await run_delta_thread(kind, db)
    assert [h.metadata["step"] for h in history] == list(range(DELTA_STEPS, -2, -1))
    expected = {"n": DELTA_STEPS, "events": expected_events(DELTA_STEPS)}

    # a new saver on the same database (as a new process would) rebuilds every checkpoint
    async with open_saver(kind, **db) as saver:
        graph = delta_graph(DELTA_STEPS).compile(checkpointer=saver)
        state = await call(graph, "get_state", kind, thread("delta"))
        assert state.values == expected
        for old in history[:-1]:  # all but the input checkpoint, which has no values
            n = old.metadata["step"]
            again = await call(graph, "get_state", kind, old.config)
            assert again.values == {"n": n, "events": expected_events(n)}

        # the channel is stored only as periodic snapshots; other checkpoints count updates
        tuples = await collect(saver, "list", kind, thread("delta"))
        snapshot_steps = []
        for t in tuples:
            stored = t.checkpoint["channel_values"].get("events")
            if stored is None:
                assert "events" in t.metadata["counters_since_delta_snapshot"]
            else:
                assert isinstance(stored, _DeltaSnapshot)
                step = t.metadata["step"]
                assert stored.value == expected_events(step)
                snapshot_steps.append(step)
        assert snapshot_steps == [11, 8, 5, 2]


@parametrize_kinds
async def test_delta_channel_history_matches_base_walk(kind: str, db: dict[str, str]) -> None:
    history = await run_delta_thread(kind, db)
    async with open_saver(kind, **db) as saver:
        # our query agrees with BaseCheckpointSaver's get_tuple walk at every checkpoint
        for old in history:
            await delta_history_matches_base(kind, saver, old.config)
        latest = await delta_history_matches_base(kind, saver, thread("delta"))
        # latest (step 13) = snapshot at step 11 + the writes of steps 12 and 13
        assert latest["events"]["seed"] == _DeltaSnapshot(expected_events(11))
        assert [value for _, _, value in latest["events"]["writes"]] == [["e12"], ["e13"]]
        # a plain channel is seeded by its value at the parent checkpoint
        assert latest["n"]["seed"] == 12
        assert [value for _, _, value in latest["n"]["writes"]] == [13]
        # a checkpoint before the first snapshot replays from the start, with no seed
        step1 = next(h for h in history if h.metadata["step"] == 1)
        early = await delta_history_matches_base(kind, saver, step1.config)
        assert "seed" not in early["events"]
        assert [value for _, _, value in early["events"]["writes"]] == [[], ["e1"]]
        # unknown channels and no channels
        empty = await call(
            saver, "get_delta_channel_history", kind, config=thread("delta"), channels=[]
        )
        assert dict(empty) == {}


@parametrize_kinds
async def test_delta_channel_prune_keep_latest_keeps_state(kind: str, db: dict[str, str]) -> None:
    await run_delta_thread(kind, db)
    config = thread("delta")
    async with open_saver(kind, **db) as saver:
        graph = delta_graph(DELTA_STEPS).compile(checkpointer=saver)
        before = await call(graph, "get_state", kind, config)
        tuples = await collect(saver, "list", kind, config)
        await call(saver, "copy_thread", kind, "delta", "unpruned")

        await call(saver, "prune", kind, ["delta"], strategy="keep_latest")
        kept = await collect(saver, "list", kind, config)
        # the newest checkpoint and its ancestors back to the last snapshot (step 11)
        assert [t.metadata["step"] for t in kept] == [13, 12, 11]
        assert cid(kept[0].config) == cid(before.config)
        assert len(tuples) == DELTA_STEPS + 2
        after = await call(graph, "get_state", kind, config)
        assert after.values == before.values
        assert cid(after.config) == cid(before.config)
        await delta_history_matches_base(kind, saver, config)
        # the copy was left alone
        assert len(await collect(saver, "list", kind, thread("unpruned"))) == len(tuples)

    async with open_saver(kind, **db) as saver:
        graph = delta_graph(DELTA_STEPS).compile(checkpointer=saver)
        assert (await call(graph, "get_state", kind, config)).values == before.values
        # the pruned thread runs on exactly like the unpruned copy
        graph = delta_graph(DELTA_STEPS + 3).compile(checkpointer=saver)
        out = await call(graph, "invoke", kind, {"n": DELTA_STEPS}, config)
        copy = await call(graph, "invoke", kind, {"n": DELTA_STEPS}, thread("unpruned"))
        assert out == copy
        assert out == {"n": DELTA_STEPS + 3, "events": expected_events(DELTA_STEPS + 3)}


@parametrize_kinds
async def test_a_thread_copied_again_carries_the_writes_a_delta_channel_needs(
    kind: str, saver: Any
) -> None:
    """A thread copied while paused, resumed, then copied again: the checkpoint it paused
    at, which the copy has already, gets the writes its task made since, so the copy
    rebuilds the DeltaChannel from its ancestors' writes as the source does."""

    def tick(state: Deltas) -> dict[str, Any]:
        n = state["n"] + 1
        return {"n": n, "events": [f"e{n}"]}

    builder = StateGraph(Deltas)
    builder.add_node("tick", tick)
    builder.add_edge(START, "tick")
    builder.add_conditional_edges("tick", lambda s: END if s["n"] >= 4 else "tick", ["tick", END])
    graph = builder.compile(checkpointer=saver, interrupt_before=["tick"])
    await call(graph, "invoke", kind, {"n": 0, "events": []}, thread("src"))
    await call(saver, "copy_thread", kind, "src", "dst")
    await call(graph, "invoke", kind, None, thread("src"))  # tick runs, then pauses again
    await call(saver, "copy_thread", kind, "src", "dst")
    source = await call(graph, "get_state", kind, thread("src"))
    copy = await call(graph, "get_state", kind, thread("dst"))
    assert source.values == {"n": 1, "events": ["e1"]}
    assert copy.values == source.values
