"""Growing lists stored as deltas of a snapshot: every version reads back exactly, from
the saver that wrote it and from a fresh one, across forks, pruning, copies, deletion of
runs, and with encryption."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import operator
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Annotated, Any, Generic, TypedDict, TypeVar

import ormsgpack
import psycopg
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from agentcheck import CorruptDataError, generate_key
from agentcheck.savers import PostgresSaver
from agentcheck.savers._deltas import (
    ListDeltas,
    pack_delta,
    snapshot,
    states_of,
    unpack_delta,
    window_shift,
)
from agentcheck.serde import MESSAGE_LIST

from savers_support import (
    KINDS,
    SYNC_KINDS,
    call,
    chat_graph,
    checkpoint_at,
    collect,
    is_async,
    open_saver,
    raw_sql,
    recorded_revivals,
    run_chat,
)

TURNS = 30


def expected(turns: int) -> list[str]:
    out = []
    for n in range(turns):
        out += [f"question {n}", f"answer {n} " + "x" * 200]
    return out


async def history(graph: Any, kind: str, config: Any) -> list[Any]:
    if is_async(kind):
        return [s async for s in graph.aget_state_history(config)]
    return list(graph.get_state_history(config))


def contents(state: Any) -> list[str]:
    return [str(m.content) for m in state.values.get("messages", [])]


async def messages_at(graph: Any, kind: str, config: Any) -> list[str]:
    """The contents of the messages in the graph's state at ``config``."""
    return contents(await call(graph, "get_state", kind, config))


def check_history(states: list[Any], turns: int) -> None:
    """Every checkpoint of the chat holds exactly the messages written up to it."""
    loops = [s for s in states if s.metadata["source"] == "loop" and s.values.get("messages")]
    assert len(loops) == 2 * turns  # after the question, and after the answer
    for state in loops:
        n = len(state.values["messages"])
        assert contents(state) == expected(turns)[:n]


def shift(old: list[Any], new: list[Any], max_shift: int = 8) -> int | None:
    """window_shift of two lists of items, the old one as a saver keeps it."""
    old_types, new_types = list(map(type, old)), list(map(type, new))
    kept = [snapshot(s, t) for s, t in zip(states_of(old, old_types), old_types, strict=True)]
    return window_shift(old_types, kept, new_types, states_of(new, new_types), max_shift)


def test_window_shift_matches_items_by_type_and_contents_as_they_were() -> None:
    old = [HumanMessage(f"m{i}", id=f"m{i}") for i in range(6)]
    assert shift(old, [*old[2:], AIMessage("new")]) == 2
    assert shift(old, [m.model_copy() for m in old[1:]]) == 1  # read back: copies
    assert shift(old, [*old[:3], AIMessage("edited"), *old[4:]]) is None
    assert shift(old, old[5:], 4) is None  # slid further than allowed
    assert shift([1, 2, 3], [2, 3, 4], 2) == 1
    assert shift([1, 2, 3], [2.0, 3.0], 2) is None  # 2 == 2.0, but not the same value
    todos = [{"n": i} for i in range(3)]
    assert shift(todos, [{"n": 1}, {"n": 2}], 2) == 1
    # Floats, times, decimals: by their exact text, so copies read back still match.
    floats = [i + 0.5 for i in range(3)]
    assert shift(floats, [float(str(x)) for x in floats[1:]] + [9.5], 2) == 1
    assert shift([0.0, 1.0, 2.0], [-0.0, 1.0, 2.0, 3.0], 2) is None
    times = [datetime(2026, 1, 1, i, tzinfo=timezone.utc) for i in range(3)]
    assert shift(times, [datetime.fromisoformat(t.isoformat()) for t in times[1:]], 2) == 1
    elsewhere = timezone(timedelta(hours=1))
    assert shift(times, [t.astimezone(elsewhere) for t in times[1:]], 2) is None
    assert shift([Decimal(i) for i in range(3)], [Decimal(i) for i in range(1, 4)], 2) == 1
    ids = [uuid.uuid4() for _ in range(3)]
    assert shift(ids, [uuid.UUID(str(u)) for u in ids[1:]], 2) == 1
    scored = [AIMessage(f"a{i}", id=f"a{i}", score=i) for i in range(3)]
    assert shift(scored, [m.model_copy() for m in scored[1:]], 2) == 1


class Uncomparable:
    """Compares like a numpy array: == gives something with no truth value."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        raise ValueError("the truth value of an array is ambiguous")

    __hash__ = None  # type: ignore[assignment]


def test_window_shift_of_items_that_cannot_be_compared_is_none() -> None:
    assert shift([Uncomparable() for _ in range(3)], [Uncomparable() for _ in range(4)], 2) is None


T = TypeVar("T")


@dataclasses.dataclass
class Task(Generic[T]):
    n: int
    done: bool = False


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # a dict of the list changed in place, in the same list
        ("todos", "todos[0] done"),
        # a message's content changed in place, the same object handed back
        ("messages", "last message redacted"),
        # a dataclass's field changed in place (its class inherits __slots__ = () from
        # Generic, its instances still have a __dict__)
        ("tasks", "tasks[0] done"),
        # equal values of other types: 1 == 1.0 == True
        ("ints", "floats"),
        ("floats", "bools"),
        # equal values of one type, stored differently: the same instants in another
        # zone, another precision, another sign
        ("times", "times elsewhere"),
        ("decimals", "decimals, more digits"),
        ("zeros", "negative zeros"),
        # new messages equal to the old ones but for an extra field
        ("scored", "scored again"),
    ],
)
def test_an_item_changed_in_place_or_equal_but_not_the_same_is_no_delta(
    before: str, after: str
) -> None:
    todos = [{"n": i, "done": False} for i in range(10)]
    messages = [HumanMessage(f"draft {i}", id=f"m{i}") for i in range(10)]
    tasks = [Task(n=i) for i in range(10)]
    lists: dict[str, Any] = {
        "todos": todos,
        "messages": messages,
        "ints": [1] * 10,
        "floats": [1.0] * 10,
        "bools": [True] * 10,
        "tasks": tasks,
        "times": [datetime(2026, 1, 1, i, tzinfo=timezone.utc) for i in range(10)],
        "times elsewhere": [
            datetime(2026, 1, 1, i + 1, tzinfo=timezone(timedelta(hours=1))) for i in range(10)
        ],
        "decimals": [Decimal(i) for i in range(10)],
        "decimals, more digits": [Decimal(f"{i}.000") for i in range(10)],
        "zeros": [0.0] * 10,
        "negative zeros": [-0.0] * 10,
        "scored": [AIMessage(f"a{i}", id=f"a{i}", score=0.1) for i in range(10)],
        "scored again": [AIMessage(f"a{i}", id=f"a{i}", score=0.9) for i in range(10)],
    }
    deltas = ListDeltas()
    key = ("t", "", "items")
    _, remember = deltas.plan(key, "v1", lists[before])
    assert remember is not None
    remember()
    if after == "todos[0] done":
        todos[0]["done"] = True
        new = todos
    elif after == "tasks[0] done":
        tasks[0].done = True
        new = tasks
    elif after == "last message redacted":
        messages[-1].content = "REDACTED"
        new = messages
    else:
        new = lists[after]
    delta, _ = deltas.plan(key, "v2", [*new, new[-1]])
    assert delta is None  # stored whole: no stored version holds these items


def test_the_chains_remembered_are_found_per_thread_until_forgotten() -> None:
    """bases() finds the chains learned for a thread's versions, of that thread and
    namespace only; the oldest are forgotten beyond the bound, and all of a thread's
    when it is cleared (a thread with none left is skipped without a look-up)."""
    deltas = ListDeltas(size=1)  # at most 16 chains
    looked_up: list[Any] = []
    chains = deltas._chains

    class CountingChains(type(chains)):  # type: ignore[misc]
        def get(self, key: Any, default: Any = None) -> Any:
            looked_up.append(key)
            return super().get(key, default)

    deltas._chains = CountingChains(chains)
    deltas.learn("a", "", {"items": ["a0", "a1"]}, {"items": "a2"})
    deltas.learn("a", "sub", {"items": ["s0"]}, {"items": "s1"})
    for i in range(15):
        deltas.learn("b", "", {"items": [f"b{i}"]}, {"items": f"b{i + 1}"})
    assert dict(deltas._chained) == {("a", "sub"): 1, ("b", ""): 15}
    looked_up.clear()
    assert deltas.bases("a", "", {"items": "a2", "other": "x"}) == {}  # the oldest: gone
    assert looked_up == []  # none left for ("a", ""): skipped
    assert deltas.bases("a", "sub", {"items": "s1"}) == {"items": ["s0"]}
    assert deltas.bases("b", "", {"items": "b15"}) == {"items": ["b14"]}
    assert deltas.bases("b", "sub", {"items": "b15"}) == {}
    assert len(looked_up) == 2
    deltas.clear_thread("b")
    assert dict(deltas._chained) == {("a", "sub"): 1}
    assert deltas.bases("b", "", {"items": "b15"}) == {}
    deltas.learn("b", "", {"items": ["b0"]}, {"items": "b1"})
    assert dict(deltas._chained) == {("a", "sub"): 1, ("b", ""): 1}
    assert deltas.bases("b", "", {"items": "b1"}) == {"items": ["b0"]}
    assert deltas.bases("a", "sub", {"items": "s1"}) == {"items": ["s0"]}


def delta_runs(deltas: ListDeltas, lists: list[list[Any]]) -> list[tuple[int, int]]:
    """Plans each list as the next version of one channel; for each run of deltas
    between two snapshots: (its length, the length of the list the run ended before)."""
    key = ("t", "", "items")
    runs: list[tuple[int, int]] = []
    run = 0
    for version, items in enumerate(lists):
        delta, remember = deltas.plan(key, f"v{version:04}", items)
        assert remember is not None
        remember()
        if delta is None:
            if run:
                runs.append((run, len(items)))
            run = 0
        else:
            run += 1
            assert len(delta.chain) == run  # the snapshot, then each delta since
    return runs


def named_versions(blob_keys: str, channel: str) -> int:
    """How many stored versions a checkpoint's ``blob_keys`` names for a channel (JSON on
    SQLite; channel and version pairs, unit-separated, on PostgreSQL)."""
    if blob_keys.startswith("{"):
        return len(json.loads(blob_keys).get(channel, []))
    return blob_keys.split(chr(31))[0::2].count(channel)


def test_a_long_list_goes_longer_between_snapshots() -> None:
    deltas = ListDeltas()
    assert [deltas.chain_limit(n) for n in (8, 50, 71, 72, 200, 256, 10_000)] == [
        8,
        8,
        8,
        9,
        25,
        32,
        32,
    ]
    # A window of 50 items: a snapshot after 8 deltas, as for any list of up to 71.
    window = [[f"m{i}" for i in range(v, v + 50)] for v in range(40)]
    assert {run for run, _ in delta_runs(ListDeltas(), window)} == {8}
    # A list growing from 100 to 400 items: the runs get longer with it, up to 32.
    growing = [[f"m{i}" for i in range(n)] for n in range(100, 400)]
    runs = delta_runs(ListDeltas(), growing)
    for run, length in runs:
        # The run stopped when the chain reached the limit of the list it had then.
        assert run == deltas.chain_limit(length - 1)
    assert [run for run, _ in runs][:3] == [14, 16, 18]
    assert max(run for run, _ in runs) == 32


@pytest.mark.parametrize("kind", KINDS)
async def test_a_long_chat_reads_back_along_its_longer_chains(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    turns = 70  # up to 140 messages: chains of up to 17 deltas
    config = {"configurable": {"thread_id": "long"}}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, kind, "long", turns)
        check_history(await history(graph, kind, config), turns)
    rows = raw_sql(
        kind,
        sqlite_path,
        pg_url,
        "SELECT blob_keys FROM agentcheck_checkpoints WHERE thread_id = ?",
        ("long",),
    )
    # The rows each checkpoint names for its messages: the longest chains are past 8.
    chains = [named_versions(keys, "messages") for (keys,) in rows if keys]
    assert max(chains) > 9
    # A fresh saver (another process) reads every version the same.
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        graph = chat_graph().compile(checkpointer=fresh)
        check_history(await history(graph, kind, config), turns)


@contextlib.contextmanager
def count_rounds(saver: Any) -> Iterator[list[Any]]:
    """The statements and batches a sync saver's operations send, in order: each is a
    round (a batch is one round trip on PostgreSQL)."""
    rounds: list[Any] = []
    run = saver._run

    def counting(make_op: Any, write: bool, **kwargs: Any) -> Any:
        def op() -> Any:
            gen = make_op()
            try:
                step = next(gen)
                while True:
                    rounds.append(step)
                    step = gen.send((yield step))
            except StopIteration as stop:
                return stop.value

        return run(op, write, **kwargs)

    saver._run = counting
    try:
        yield rounds
    finally:
        del saver._run


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_checkpoint_that_keeps_a_list_written_by_another_process_reads_in_one_query(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """A saver that did not write a list's chain learns it when it reads the checkpoint:
    a checkpoint it then writes keeping that version (update_state of another channel)
    names the whole chain too, and reading it is not a query per delta."""
    config = {"configurable": {"thread_id": "other"}}
    turns = 36  # 72 messages and more: chains of 9 deltas and more

    def latest_chain() -> int:
        rows = raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "SELECT blob_keys FROM agentcheck_checkpoints WHERE thread_id = ? "
            "ORDER BY checkpoint_id DESC LIMIT 1",
            ("other",),
        )
        return named_versions(rows[0][0], "messages")

    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, kind, "other", turns)
        while latest_chain() < 9:
            await run_chat(graph, kind, "other", turns + 1, start=turns)
            turns += 1
        depth = latest_chain()
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        graph = chat_graph().compile(checkpointer=fresh)
        await call(graph, "update_state", kind, config, {"turn": 999})
        assert latest_chain() == depth  # the new checkpoint names the chain it keeps
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as reader:
        with count_rounds(reader) as rounds:
            state = await call(chat_graph().compile(checkpointer=reader), "get_state", kind, config)
        assert contents(state) == expected(turns)
        assert state.values["turn"] == 999
        assert len(rounds) <= 2, rounds


@pytest.mark.parametrize("kind", KINDS)
async def test_growing_chat_is_stored_as_deltas_and_every_version_reads_back(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, kind, "t", TURNS)
        config = {"configurable": {"thread_id": "t"}}
        assert await messages_at(graph, kind, config) == expected(TURNS)
        check_history(await history(graph, kind, config), TURNS)
        types = [
            r[0]
            for r in raw_sql(
                kind,
                sqlite_path,
                pg_url,
                "SELECT type FROM agentcheck_blobs WHERE thread_id = ? AND channel = ?",
                ("t", "messages"),
            )
        ]
        deltas = [t for t in types if t.startswith("delta")]
        # Most versions are deltas; whole copies only now and then.
        assert len(deltas) > len(types) // 2
        assert len(types) - len(deltas) < len(types) // 3

    # A fresh saver, knowing nothing of the snapshots, reads the same (as a new process).
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        graph = chat_graph().compile(checkpointer=fresh)
        check_history(await history(graph, kind, config), TURNS)
        # ... and continues the thread correctly.
        question = HumanMessage(content=f"question {TURNS}", id=f"q{TURNS}")
        await call(graph, "invoke", kind, {"messages": [question], "turn": TURNS}, config)
        assert await messages_at(graph, kind, config) == expected(TURNS + 1)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fork_from_an_old_checkpoint_reads_its_own_branch(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, kind, "t", 20)
        config = {"configurable": {"thread_id": "t"}}
        states = await history(graph, kind, config)
        old = next(s for s in states if len(s.values.get("messages", [])) == 20)
        forked = await call(
            graph,
            "update_state",
            kind,
            old.config,
            {"messages": [HumanMessage(content="forked", id="f")]},
        )
        assert await messages_at(graph, kind, forked) == expected(10) + ["forked"]
        # the fork is now the head
        assert await messages_at(graph, kind, config) == expected(10) + ["forked"]
        assert await messages_at(graph, kind, states[0].config) == expected(20)


@pytest.mark.parametrize("kind", KINDS)
async def test_prune_copy_and_delete_for_runs_keep_deltas_readable(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, kind, "t", 21)
        config = {"configurable": {"thread_id": "t"}}
        copy = {"configurable": {"thread_id": "copy"}}
        await call(saver, "copy_thread", kind, "t", "copy")
        assert await messages_at(graph, kind, copy) == expected(21)

        # A run's checkpoints deleted: the copy is back where it was, every remaining
        # version still reads (its delta bases were kept), and writing goes on.
        await run_chat(graph, kind, "copy", 26, start=21, run_id="extra-run")
        assert await messages_at(graph, kind, copy) == expected(26)
        await call(saver, "delete_for_runs", kind, [f"extra-run-{n}" for n in range(21, 26)])
        assert await messages_at(graph, kind, copy) == expected(21)
        check_history(await history(graph, kind, copy), 21)
        await run_chat(graph, kind, "copy", 23, start=21)
        assert await messages_at(graph, kind, copy) == expected(23)

        await call(saver, "prune", kind, ["t"], strategy="keep_latest")
        assert await messages_at(graph, kind, config) == expected(21)
        # Writing on after the prune (the saver's snapshot memory was dropped with it).
        await run_chat(graph, kind, "t", 25, start=21)
        assert await messages_at(graph, kind, config) == expected(25)

    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        graph = chat_graph().compile(checkpointer=fresh)
        assert await messages_at(graph, kind, config) == expected(25)
        assert await messages_at(graph, kind, copy) == expected(23)


@pytest.mark.parametrize("kind", KINDS)
async def test_deltas_are_encrypted_too(kind: str, sqlite_path: str, pg_url: str) -> None:
    key = generate_key()
    async with open_saver(
        kind, sqlite_path=sqlite_path, pg_url=pg_url, encryption_key=key
    ) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, kind, "t", 12)
        types = {
            r[0]
            for r in raw_sql(
                kind,
                sqlite_path,
                pg_url,
                "SELECT type FROM agentcheck_blobs WHERE thread_id = ? AND channel = ?",
                ("t", "messages"),
            )
        }
        assert any(t.startswith("delta") for t in types)
        assert all(t.endswith("#aesgcm") for t in types)
    async with open_saver(
        kind, sqlite_path=sqlite_path, pg_url=pg_url, encryption_key=key
    ) as fresh:
        graph = chat_graph().compile(checkpointer=fresh)
        config = {"configurable": {"thread_id": "t"}}
        check_history(await history(graph, kind, config), 12)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_put_leaves_nothing_to_build_deltas_on(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """The saver remembers a stored list (to store the next version as a delta of it)
    only once its transaction has committed: a put that fails, even at the very end
    (PostgreSQL sends a write's statements in one burst at commit), must not become
    the base of later deltas, or the later checkpoints would be unreadable."""
    config = {"configurable": {"thread_id": "t"}}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, kind, "t", 12)
        broken = type(
            "BrokenSQL",
            (saver.sql,),
            {"UPSERT_CHECKPOINT": saver.sql.UPSERT_CHECKPOINT.replace("agentcheck_", "nowhere_")},
        )
        original = saver._put

        def put_failing_with_messages(*args: Any) -> Any:
            # Only a put that stores a new version of the list fails.
            if "messages" in args[3]:
                saver.sql = broken
            try:
                return (yield from original(*args))
            finally:
                saver.__dict__.pop("sql", None)

        # A failure at several places of the snapshot/delta cycle, each turn then redone.
        for turn in range(12, 17):
            saver._put = put_failing_with_messages
            with pytest.raises(Exception, match="nowhere_checkpoints"):
                await run_chat(graph, kind, "t", turn + 1, start=turn)
            del saver._put
            await run_chat(graph, kind, "t", turn + 1, start=turn)
        await run_chat(graph, kind, "t", 20, start=17)
        assert await messages_at(graph, kind, config) == expected(20)

    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        graph = chat_graph().compile(checkpointer=fresh)
        states = await history(graph, kind, config)
        assert contents(states[0]) == expected(20)
        for state in states:  # every checkpoint reads back (none built on the failed put)
            n = len(state.values.get("messages", []))
            assert contents(state) == expected(20)[:n]


def test_a_delete_while_a_put_is_in_flight_leaves_no_base_behind() -> None:
    """A put planned before a thread is deleted or pruned, and committed after, must
    not be remembered as the base of the next delta (its rows may be gone)."""
    deltas = ListDeltas()
    key = ("t", "", "messages")
    first = [f"m{i}" for i in range(10)]
    _, remember = deltas.plan(key, "v1", first)
    assert remember is not None
    remember()
    delta, remember = deltas.plan(key, "v2", [*first, "m10"])
    assert delta is not None and delta.base_version == "v1"
    deltas.clear_thread("t")  # a delete of the thread, between the plan and the commit
    assert remember is not None
    remember()  # the put's commit
    delta, _ = deltas.plan(key, "v3", [*first, "m10", "m11"])
    assert delta is None  # stored whole: nothing remembered to build on


# -- a sliding window: versions that drop messages from the front --------------------------

WINDOW = 10  # lists from 8 items on are stored as deltas


def slide(old: list[Any], new: list[Any]) -> list[Any]:
    return (old + new)[-WINDOW:]


class Window(TypedDict):
    messages: Annotated[list[Any], slide]


def window_graph() -> Any:
    def answer(state: Window) -> dict[str, Any]:
        n = len([m for m in state["messages"] if isinstance(m, HumanMessage)])
        return {"messages": [AIMessage(content=f"answer {n}", id=f"a-{uuid.uuid4()}")]}

    builder = StateGraph(Window)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder


async def slide_window(graph: Any, kind: str, config: Any, turns: range) -> None:
    for n in turns:
        question = HumanMessage(content=f"question {n}", id=f"q-{n}")
        await call(graph, "invoke", kind, {"messages": [question]}, config)


def messages_in(value: Any) -> int:
    """How many messages a value holds, at any depth."""
    if isinstance(value, BaseMessage):
        return 1
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return sum(messages_in(v) for v in value)
    return 0


@pytest.mark.parametrize("kind", KINDS)
async def test_a_sliding_window_reads_back_and_builds_only_the_messages_it_holds(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """Each version of a window that slides is stored as a delta dropping messages from
    the front of the one before; a read builds only the messages its version holds,
    not those of the snapshot the window has since slid past."""
    config = {"configurable": {"thread_id": "w"}}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = window_graph().compile(checkpointer=saver)
        await slide_window(graph, kind, config, range(12))
        written = {
            s.config["configurable"]["checkpoint_id"]: s.values.get("messages", [])
            for s in await history(graph, kind, config)
        }
    stored = [
        saver.codec.decode(t, d)
        for t, d in raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "SELECT type, blob FROM agentcheck_blobs WHERE thread_id = ? AND channel = ?",
            ("w", "messages"),
        )
    ]
    deltas = [unpack_delta(data) for type_, data in stored if type_ == "delta"]
    assert deltas and max(shift for _, shift, _, _ in deltas) >= 1  # the window slid
    # The message rows stored: whole lists, and the tails of deltas.
    rows = sum(len(ormsgpack.unpackb(data)) for type_, data in stored if type_ == MESSAGE_LIST)
    rows += sum(len(ormsgpack.unpackb(tail)) for _, _, _, tail in deltas)

    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        with recorded_revivals() as revived:
            for checkpoint_id, messages in written.items():
                before = len(revived)
                got = await checkpoint_at(fresh, kind, "w", checkpoint_id)
                assert got.checkpoint["channel_values"].get("messages", []) == messages
                # Every message it returns was built once: those of the window (which the
                # others below do not share), the input's, the pending writes'.
                assert len(revived) - before == messages_in(
                    [got.checkpoint["channel_values"], got.pending_writes]
                )
            # Listing them all builds each stored row once: the versions built from one
            # snapshot share their messages. (Within a page of the list, see ListPages: a
            # limit makes it one page.)
            before = len(revived)
            listed = await collect(fresh, "list", kind, config, limit=len(written))
            windows = [t.checkpoint["channel_values"].get("messages", []) for t in listed]
            assert windows == [written[t.config["configurable"]["checkpoint_id"]] for t in listed]
            assert len({id(m) for window in windows for m in window}) == rows
            others = [
                (
                    {k: v for k, v in t.checkpoint["channel_values"].items() if k != "messages"},
                    t.pending_writes,
                )
                for t in listed
            ]
            assert len(revived) - before == rows + messages_in(others)


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_a_window_holding_other_values_than_messages_reads_back(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """A delta whose new items are not all messages stores them in the serializer's own
    format, built on a message list; while such an item is in the window, deltas of
    messages are built on a list in that format. Every version reads back, alone
    (``get_tuple``) and listed."""
    config = {"configurable": {"thread_id": "m"}}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = window_graph().compile(checkpointer=saver)
        await slide_window(graph, kind, config, range(6))
        note = {"note": "not a message"}
        await call(graph, "update_state", kind, config, {"messages": [note]})
        await slide_window(graph, kind, config, range(6, 9))
        written = {
            s.config["configurable"]["checkpoint_id"]: s.values.get("messages", [])
            for s in await history(graph, kind, config)
        }
        assert any(note in m for m in written.values())
    by_version = {
        version: saver.codec.decode(t, d)
        for version, t, d in raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "SELECT version, type, blob FROM agentcheck_blobs WHERE thread_id = ? AND channel = ?",
            ("m", "messages"),
        )
    }

    def all_message_rows(version: str) -> bool:
        """Whether a version is stored as message rows all along its chain."""
        type_, data = by_version[version]
        if type_ != "delta":
            return type_ == MESSAGE_LIST
        base, _, tail_type, _ = unpack_delta(data)
        return tail_type == MESSAGE_LIST and all_message_rows(base)

    pairs = set()  # for each delta: (its base is message rows, its tail is)
    for type_, data in by_version.values():
        if type_ == "delta":
            base, _, tail_type, _ = unpack_delta(data)
            pairs.add((all_message_rows(base), tail_type == MESSAGE_LIST))
    assert {(True, False), (False, True)} <= pairs

    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        for checkpoint_id, messages in written.items():
            got = await checkpoint_at(fresh, kind, "m", checkpoint_id)
            assert got.checkpoint["channel_values"].get("messages", []) == messages
        graph = window_graph().compile(checkpointer=fresh)
        listed = await history(graph, kind, config)
        assert {
            s.config["configurable"]["checkpoint_id"]: s.values.get("messages", []) for s in listed
        } == written


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_a_corrupt_message_in_a_delta_names_its_channel_and_checkpoint(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    config = {"configurable": {"thread_id": "c"}}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = window_graph().compile(checkpointer=saver)
        await slide_window(graph, kind, config, range(7))
        latest = (await call(saver, "get_tuple", kind, config)).config["configurable"]
        rows = raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "SELECT version, type, blob FROM agentcheck_blobs WHERE thread_id = ? "
            "AND channel = ? ORDER BY version DESC",
            ("c", "messages"),
        )
        version, type_, data = rows[0]
        assert type_.startswith("delta")
        base, shift, _, _ = unpack_delta(saver.codec.decode(type_, data)[1])
        bogus = ormsgpack.packb([["langchain_core.messages.ai", "NoSuchMessage", {}]])
        raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "UPDATE agentcheck_blobs SET blob = ? WHERE thread_id = ? AND version = ?",
            (pack_delta(base, shift, MESSAGE_LIST, bogus), "c", version),
        )
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        with pytest.raises(CorruptDataError) as excinfo:
            await call(fresh, "get_tuple", kind, config)
        message = str(excinfo.value)
        assert "channel 'messages'" in message and "'c'" in message
        assert repr(latest["checkpoint_id"]) in message
        assert "NoSuchMessage" in message


# -- lists changed in place, and deltas on rows another saver deleted ----------------------


class Edited(TypedDict, total=False):
    todos: list[dict[str, Any]]
    messages: Annotated[list[BaseMessage], add_messages]


def editing_graph() -> StateGraph[Edited]:
    """``plan`` writes 10 todos and 10 messages; ``edit`` changes the first todo and the
    last message in place and hands the very same objects back."""

    def plan(state: Edited) -> Edited:
        return {
            "todos": [{"n": i, "done": False} for i in range(10)],
            "messages": [AIMessage(f"draft {i}", id=f"a{i}") for i in range(10)],
        }

    def edit(state: Edited) -> Edited:
        todos = state["todos"]
        todos[0]["done"] = True
        last = state["messages"][-1]
        last.content = "REDACTED"
        return {"todos": todos, "messages": [last]}

    return two_nodes(StateGraph(Edited), plan, edit)


def two_nodes(builder: StateGraph[Any], first: Any, second: Any) -> StateGraph[Any]:
    """``first`` then ``second`` (nodes named after the functions), then the end."""
    builder.add_node(first.__name__, first)
    builder.add_node(second.__name__, second)
    builder.add_edge(START, first.__name__)
    builder.add_edge(first.__name__, second.__name__)
    builder.add_edge(second.__name__, END)
    return builder


@pytest.mark.parametrize("kind", KINDS)
async def test_items_a_node_changed_in_place_read_back_changed(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """The saver compared a list with the version it remembered by the items' identity:
    the same objects, changed in place, were taken for unchanged and the change was lost
    (the official savers store it)."""
    config = {"configurable": {"thread_id": "t1"}}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = editing_graph().compile(checkpointer=saver)
        await call(graph, "invoke", kind, {"messages": []}, config, durability="sync")
        seen = [await call(graph, "get_state", kind, config)]
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        reader = editing_graph().compile(checkpointer=fresh)
        seen.append(await call(reader, "get_state", kind, config))
    for state in seen:
        assert state.values["todos"][0] == {"n": 0, "done": True}
        assert [m.content for m in state.values["messages"]][-2:] == ["draft 8", "REDACTED"]


class Rated(TypedDict, total=False):
    messages: Annotated[list[BaseMessage], add_messages]
    times: list[datetime]


def rating_graph() -> StateGraph[Rated]:
    """``draft`` writes 10 messages and 10 times; ``rate`` replaces the last message
    (by id, as add_messages does) with a new one that differs only in an extra field,
    and the times with the same instants written in another zone."""

    def draft(state: Rated) -> Rated:
        return {
            "messages": [AIMessage(f"draft {i}", id=f"a{i}", confidence=0.1) for i in range(10)],
            "times": [datetime(2026, 1, 1, i, tzinfo=timezone.utc) for i in range(10)],
        }

    def rate(state: Rated) -> Rated:
        cet = timezone(timedelta(hours=1))
        return {
            "messages": [AIMessage("draft 9", id="a9", confidence=0.9)],
            "times": [t.astimezone(cet) for t in state["times"]],
        }

    return two_nodes(StateGraph(Rated), draft, rate)


@pytest.mark.parametrize("kind", KINDS)
async def test_items_replaced_by_equal_ones_stored_differently_read_back_as_replaced(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """An item was unchanged if == to the one remembered: a message replaced by one that
    differs only in an extra field (kept out of its __dict__), or a time by the same
    instant in another zone, read back as the old one (the official savers store the
    new ones)."""
    config = {"configurable": {"thread_id": "t1"}}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = rating_graph().compile(checkpointer=saver)
        await call(graph, "invoke", kind, {"messages": []}, config, durability="sync")
        state = await call(graph, "get_state", kind, config)
    assert state.values["messages"][-1].model_dump()["confidence"] == 0.9
    offsets = {t.utcoffset() for t in state.values["times"]}
    assert offsets == {timedelta(hours=1)}


class Tools(TypedDict, total=False):
    question: str
    tools: list[str]
    docs: Annotated[list[str], operator.add]


def tools_graph() -> StateGraph[Tools]:
    """Every turn sets the same 10 tools and adds 3 documents."""

    def setup(state: Tools) -> Tools:
        docs = [f"doc about {state['question']} #{i}" for i in range(3)]
        return {"tools": [f"tool_{i}" for i in range(10)], "docs": docs}

    builder = StateGraph(Tools)
    builder.add_node("setup", setup)
    builder.add_edge(START, "setup")
    builder.add_edge("setup", END)
    return builder


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("delete", ["delete_thread", "delete_for_runs"])
async def test_a_thread_deleted_through_another_saver_stays_readable(
    kind: str, delete: str, sqlite_path: str, pg_url: str
) -> None:
    """Two savers on one database (two workers): B deletes the thread, or A's last run;
    A, which remembered the deleted rows, goes on. Its next put built deltas on them and
    the thread could not be read any more; the put now finds them gone and stores the
    values whole."""
    config = {"configurable": {"thread_id": "t1"}}

    def turn(question: str) -> tuple[Tools, Any]:
        run = {**config, "metadata": {"run_id": f"run-{question}"}}
        return {"question": question}, run

    async with (
        open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as a,
        open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as b,
    ):
        graph = tools_graph().compile(checkpointer=a)
        for question in ("q1", "q2", "q3", "q4"):
            await call(graph, "invoke", kind, *turn(question))
        forgotten: list[str] = []
        clear_thread = a.list_deltas.clear_thread

        def spy(thread_id: str) -> None:  # A forgets the thread only when a put found out
            forgotten.append(thread_id)
            clear_thread(thread_id)

        a.list_deltas.clear_thread = spy
        if delete == "delete_thread":
            await call(b, "delete_thread", kind, "t1")
            expected = 3
        else:
            await call(b, "delete_for_runs", kind, ["run-q4"])
            expected = 12  # q1-q3, and q4 again
        await call(graph, "invoke", kind, *turn("q4"))
        assert forgotten == ["t1"]  # its first put after the delete was made again, whole
        readers = [graph, tools_graph().compile(checkpointer=b)]
        for reader in readers:
            state = await call(reader, "get_state", kind, config)
            assert state.values["tools"] == [f"tool_{i}" for i in range(10)]
            assert len(state.values["docs"]) == expected
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
        state = await call(tools_graph().compile(checkpointer=fresh), "get_state", kind, config)
        assert len(state.values["docs"]) == expected
        for snapshot in await history(tools_graph().compile(checkpointer=fresh), kind, config):
            assert snapshot.values.get("tools") in (None, [f"tool_{i}" for i in range(10)])


def _tools_turn(question: str) -> tuple[Tools, Any]:
    return {"question": question}, {"configurable": {"thread_id": "t1"}}


def _four_turns(saver: PostgresSaver) -> Any:
    """The tools graph on ``saver``, after four turns of thread t1 (deltas stored)."""
    saver.setup()
    graph = tools_graph().compile(checkpointer=saver)
    for question in ("q1", "q2", "q3", "q4"):
        graph.invoke(*_tools_turn(question))
    return graph


@pytest.mark.parametrize("kind", KINDS)
async def test_a_delta_whose_snapshot_escaped_nothing_else_is_stored_whole(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """A value written while another saver deleted the thread escapes that delete (on
    PostgreSQL the delete's statement does not see a row committed after it began); the
    snapshot that value's chain starts from does not. Only the value a delta was built
    on was checked: A's next put stored a delta on the escaped row, and the thread could
    not be read. The put now also checks the chain's snapshot, finds it gone and stores
    the values whole. (The escaped row is left by raw SQL here; the race that leaves it
    is timing.)"""
    config = {"configurable": {"thread_id": "t1"}}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as a:
        graph = tools_graph().compile(checkpointer=a)
        for question in ("q1", "q2", "q3", "q4"):
            await call(graph, "invoke", kind, *_tools_turn(question))
        newest = "SELECT MAX(version) FROM agentcheck_blobs WHERE thread_id = 't1' AND channel = ?"
        [(escaped,)] = raw_sql(kind, sqlite_path, pg_url, newest, ("tools",))
        for table in ("agentcheck_writes", "agentcheck_metadata_terms", "agentcheck_checkpoints"):
            raw_sql(kind, sqlite_path, pg_url, f"DELETE FROM {table} WHERE thread_id = 't1'")  # noqa: S608
        raw_sql(
            kind, sqlite_path, pg_url,
            "DELETE FROM agentcheck_blobs WHERE thread_id = 't1' "
            "AND NOT (channel = 'tools' AND version = ?)", (escaped,),
        )  # fmt: skip
        count = "SELECT COUNT(*) FROM agentcheck_blobs WHERE thread_id = 't1'"
        [(kept,)] = raw_sql(kind, sqlite_path, pg_url, count)
        assert kept == 1
        await call(graph, "invoke", kind, *_tools_turn("q5"))
        state = await call(graph, "get_state", kind, config)
        assert state.values["tools"] == [f"tool_{i}" for i in range(10)]
        assert len(state.values["docs"]) == 3


def test_postgres_a_put_during_another_savers_delete_waits_for_it(pg_url: str) -> None:
    """PostgreSQL, two workers: B's delete_thread has deleted the thread's values and
    waits (here for a row a third connection holds) before it commits; A goes on with
    the thread meanwhile. A's put counted the value its delta is built on, saw it (the
    delete was not committed) and stored the delta; B then committed, and A's checkpoint
    could not be read. The count now locks the rows it counts: A's put waits for B,
    finds the value gone and stores the values whole. (B also deletes the run's row,
    which A's put updates in the same statement: B deletes it before it locks the values,
    the order A's statement takes them in, else the two deadlocked.)"""
    config = {"configurable": {"thread_id": "t1"}}
    with (
        PostgresSaver.from_conn_string(pg_url) as a,
        PostgresSaver.from_conn_string(pg_url) as b,
        psycopg.connect(pg_url) as holder,
    ):
        graph = _four_turns(a)
        holder.execute(
            "SELECT 1 FROM agentcheck_checkpoints WHERE thread_id = 't1' LIMIT 1 FOR UPDATE"
        )
        errors: list[BaseException] = []

        def run(fn: Any, *args: Any) -> threading.Thread:
            def target() -> None:
                try:
                    fn(*args)
                except BaseException as exc:  # reported by the assertion below
                    errors.append(exc)

            thread = threading.Thread(target=target)
            thread.start()
            return thread

        deleting = run(b.delete_thread, "t1")
        time.sleep(1.0)  # B has deleted the values and waits for the held row
        going_on = run(graph.invoke, *_tools_turn("q5"))
        time.sleep(1.0)  # A's put is under way
        holder.rollback()  # B commits
        deleting.join(30)
        going_on.join(30)
        assert not deleting.is_alive() and not going_on.is_alive()
        assert errors == []
        # A read q4's checkpoint before B committed: q5 goes on from it (12 + 3 docs).
        for reader in (graph, tools_graph().compile(checkpointer=b)):
            state = reader.get_state(config)
            assert state.values["tools"] == [f"tool_{i}" for i in range(10)]
            assert len(state.values["docs"]) == 15


def test_postgres_a_put_aborted_by_a_deadlock_is_made_again(pg_url: str) -> None:
    """PostgreSQL aborts one of two transactions that wait for each other. A put that
    ends a run updates the run's row, then locks the value its delta is built on; here
    another transaction holds that value and then asks for the run's row. The server
    aborts the put (it waited first), which left nothing behind and is made again once
    the other has finished; with no retry, the graph's invoke failed."""
    config = {"configurable": {"thread_id": "t1"}}
    with PostgresSaver.from_conn_string(pg_url) as saver, psycopg.connect(pg_url) as other:
        graph = _four_turns(saver)
        other.execute(
            "SELECT 1 FROM agentcheck_blobs WHERE thread_id = 't1' AND channel = 'tools' "
            "AND version = (SELECT MAX(version) FROM agentcheck_blobs "
            "WHERE thread_id = 't1' AND channel = 'tools') FOR UPDATE"
        )
        errors: list[BaseException] = []

        def turn() -> None:
            try:
                graph.invoke(*_tools_turn("q5"), durability="sync")
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        going_on = threading.Thread(target=turn)
        going_on.start()
        time.sleep(0.5)  # the put has updated the run's row and waits for the value
        other.execute("SELECT 1 FROM agentcheck_runs WHERE run_id = 't1' FOR UPDATE")
        other.rollback()  # reached once the server has aborted the put
        going_on.join(30)
        assert not going_on.is_alive()
        assert errors == []
        state = graph.get_state(config)
        assert len(state.values["docs"]) == 15
        assert saver.journal.get_run("t1").status == "succeeded"


# --------------------------------------------------------------- PostgreSQL, concurrently


def after_statement(op: Any, starts: str, hook: Any) -> Any:
    """The operation ``op`` (a generator of queries), calling ``hook()`` once the first
    statement whose text starts with ``starts`` was answered: what another writer does
    between two statements of one operation (PostgreSQL reads each in its own snapshot)."""
    answer: Any = None
    hooked = False
    try:
        while True:
            query = op.send(answer)
            answer = yield query
            statements = [query] if hasattr(query, "sql") else list(query)
            if not hooked and any(q.sql.startswith(starts) for q in statements):
                hooked = True
                hook()
    except StopIteration as stop:
        return stop.value


def another_worker_turn(pg_url: str, thread: str, n: int) -> None:
    """A chat turn by another worker (its own saver, which has not seen the thread), to
    its end, from a thread of its own."""

    def turn() -> None:
        with PostgresSaver.from_conn_string(pg_url) as other:
            graph = chat_graph().compile(checkpointer=other)
            question = HumanMessage(content=f"question {n}", id=f"q{n}")
            graph.invoke(
                {"messages": [question], "turn": n}, {"configurable": {"thread_id": thread}}
            )

    worker = threading.Thread(target=turn)
    worker.start()
    worker.join(30)


@pytest.mark.parametrize("op", ["prune", "delete_for_runs"])
async def test_a_checkpoint_stored_while_a_deletion_runs_keeps_its_values(
    pg_url: str, op: str
) -> None:
    """A deletion read the thread's checkpoints, then (another statement) its stored
    values: a turn another worker committed in between had its values read but not its
    checkpoint, and they were deleted as unused. Its newest checkpoint named a message
    list it no longer had, and after one more prune the thread read back no messages.
    The values are now read first."""
    with PostgresSaver.from_conn_string(pg_url) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, "postgres", "t", 6, run_id="r")
        collect_garbage = saver._collect_garbage

        def hooked(thread_id: str, ns: str, deleted: set[str]) -> Any:
            return after_statement(
                collect_garbage(thread_id, ns, deleted),
                "SELECT",
                lambda: another_worker_turn(pg_url, "t", 6),
            )

        saver._collect_garbage = hooked  # type: ignore[method-assign]
        if op == "prune":
            saver.prune(["t"], strategy="keep_latest")
        else:
            saver.delete_for_runs(["r-0", "r-1"])

    with PostgresSaver.from_conn_string(pg_url) as fresh:
        graph = chat_graph().compile(checkpointer=fresh)
        config = {"configurable": {"thread_id": "t"}}
        latest = fresh.get_tuple(config)
        assert latest is not None
        assert "messages" in latest.checkpoint["channel_values"]
        assert contents(graph.get_state(config))[-2:] == ["question 6", "answer 6 " + "x" * 200]
        fresh.prune(["t"], strategy="keep_latest")
        assert len(contents(graph.get_state(config))) == 14


async def test_a_prune_started_during_a_copy_of_the_thread_waits_for_it(pg_url: str) -> None:
    """copy_thread copies the checkpoints, then their values, in statements of their
    own: a prune of the source committed in between left copied checkpoints without
    their values. The copy now takes the thread's deletion lock first; a prune waits."""
    with PostgresSaver.from_conn_string(pg_url) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, "postgres", "t", 6, run_id="r")
        pruned: list[bool] = []

        def prune() -> None:
            with PostgresSaver.from_conn_string(pg_url) as other:
                other.prune(["t"], strategy="keep_latest")
            pruned.append(True)

        pruner = threading.Thread(target=prune)

        def start_pruning() -> None:
            pruner.start()
            pruner.join(1.0)
            assert not pruned, "the prune did not wait for the copy"

        copy_thread = saver._copy_thread

        def hooked(source: str, target: str) -> Any:
            # (Held back by the saver until the burst that ends the copy: the locks,
            # whose rows are read, are taken before.)
            return after_statement(
                copy_thread(source, target), "INSERT INTO agentcheck_checkpoints", start_pruning
            )

        saver._copy_thread = hooked  # type: ignore[method-assign]
        saver.copy_thread("t", "copy")
        pruner.join(30)
        assert pruned == [True]
        states = list(graph.get_state_history({"configurable": {"thread_id": "copy"}}))
        assert len(states) > 6
        for state in states:
            if state.metadata["source"] == "loop":
                assert contents(state) == expected(6)[: len(contents(state))]
                assert state.values.get("messages"), state.config


async def test_a_checkpoint_stored_while_its_thread_is_copied_is_copied_with_its_terms(
    pg_url: str,
) -> None:
    """copy_thread copied the metadata terms, then the checkpoints, each statement
    reading its own snapshot: a checkpoint another writer committed in between was
    copied without its terms, and a filtered list of the copy missed it. The terms are
    now copied after the checkpoints, for the checkpoints copied. (The statements run
    here one at a time, each in its own snapshot as PostgreSQL reads them, with the
    other writer's turn after the first.)"""
    from agentcheck.backends.postgres import _pg

    with PostgresSaver.from_conn_string(pg_url) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, "postgres", "t", 4, run_id="r")
        op = saver._copy_thread("t", "copy")
        with psycopg.connect(pg_url, autocommit=True, cursor_factory=psycopg.RawCursor) as conn:
            answer: Any = None
            turned = False
            try:
                while True:
                    query = op.send(answer)
                    cursor = conn.execute(_pg(query.sql), query.params)
                    answer = cursor.fetchall() if query.fetch else None
                    if query.sql.startswith("INSERT") and not turned:
                        turned = True
                        another_worker_turn(pg_url, "t", 4)
            except StopIteration:
                pass
        assert turned
        copy = {"configurable": {"thread_id": "copy"}}
        copied = list(saver.list(copy))
        assert copied
        for found in copied:
            step = found.metadata["step"]
            by_filter = list(
                saver.list(copy, filter={"step": step, "source": found.metadata["source"]})
            )
            assert found.config in [t.config for t in by_filter], (step, found.metadata)


@pytest.mark.parametrize("kind", KINDS)
async def test_values_only_deleted_checkpoints_used_are_deleted_with_them(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """delete_for_runs of a thread's newest run kept that run's values (its input, its
    message list): each channel's newest stored value was always kept, for a writer
    that might build on it, so a secret the run was given stayed in the database. They
    are deleted now; a saver that still builds on one stores its list whole instead."""
    secret = "SSN 078-05-1120"
    async with (
        open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver,
        open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as other,
    ):
        graph = chat_graph().compile(checkpointer=saver)
        await run_chat(graph, kind, "t", 12, run_id="r")
        # The secret turn is written by another saver, which remembers its message list.
        other_graph = chat_graph().compile(checkpointer=other)
        config = {"configurable": {"thread_id": "t"}, "metadata": {"run_id": "r-secret"}}
        question = HumanMessage(content=secret, id="secret")
        await call(other_graph, "invoke", kind, {"messages": [question], "turn": 12}, config)
        await call(saver, "delete_for_runs", kind, ["r-secret"])
        thread = {"configurable": {"thread_id": "t"}}
        stored = raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "SELECT type, blob FROM agentcheck_blobs WHERE thread_id = ?",
            ("t",),
        )
        # (Decompressed: PostgreSQL's are stored compressed.)
        payloads = [saver.codec.decode(type_, bytes(blob))[1] for type_, blob in stored]
        assert payloads and not any(secret.encode() in payload for payload in payloads)
        assert await messages_at(graph, kind, thread) == expected(12)

        # Writing goes on, in the saver that remembered the deleted list and in this one.
        await run_chat(other_graph, kind, "t", 13, start=12)
        assert await messages_at(graph, kind, thread) == expected(13)
        await run_chat(graph, kind, "t", 14, start=13)
        assert await messages_at(other_graph, kind, thread) == expected(14)
