"""How values are stored: once per channel version, large ones compressed, and metadata
filters answered from an index on both databases."""

from __future__ import annotations

import asyncio
import enum
import operator
import re
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph

from agentcheck import CorruptDataError, generate_key
from agentcheck.backends import postgres as pg_backend
from agentcheck.backends.base import SQL, Later, OnCommit, Query, batch, drive
from agentcheck.backends.postgres import PostgresSQL
from agentcheck.savers._terms import metadata_terms
from agentcheck.serde import MESSAGE_LIST

from savers_support import (
    KINDS,
    SYNC_KINDS,
    XorCipher,
    call,
    chat_turns,
    collect,
    compressed,
    is_async,
    is_postgres,
    open_saver,
    raw_sql,
)


class State(TypedDict):
    document: str
    steps: Annotated[list[int], operator.add]


def build_graph(n_steps: int) -> StateGraph[State]:
    builder: StateGraph[State] = StateGraph(State)
    for i in range(n_steps):
        builder.add_node(f"n{i}", lambda _s, i=i: {"steps": [i]})
    builder.add_edge(START, "n0")
    for i in range(n_steps - 1):
        builder.add_edge(f"n{i}", f"n{i + 1}")
    builder.add_edge(f"n{n_steps - 1}", END)
    return builder


@pytest.mark.parametrize("kind", KINDS)
async def test_unchanged_channel_value_is_stored_once(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    document = "a long document " * 2000  # ~32 KB, set once, never changed
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        graph = build_graph(10).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "t"}}
        inputs = {"document": document, "steps": []}
        if is_async(kind):
            final = await graph.ainvoke(inputs, config)
        else:
            final = graph.invoke(inputs, config)
        assert final["steps"] == list(range(10))
        checkpoints = raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "SELECT COUNT(*) FROM agentcheck_checkpoints WHERE thread_id = ?",
            ("t",),
        )
        assert checkpoints[0][0] == 12  # input + 11 loop steps
        per_channel = dict(
            raw_sql(
                kind,
                sqlite_path,
                pg_url,
                "SELECT channel, COUNT(*) FROM agentcheck_blobs WHERE thread_id = ? "
                "GROUP BY channel",
                ("t",),
            )
        )
        # The document is written once although 12 checkpoints carry it; the list
        # channel gets one row per version it went through.
        assert per_channel["document"] == 1
        assert per_channel["steps"] == 11
        # ... and every checkpoint still reads back the full state.
        history = (
            [s async for s in graph.aget_state_history(config)]
            if is_async(kind)
            else list(graph.get_state_history(config))
        )
        assert len(history) == 12
        loop_states = [s for s in history if s.metadata["source"] == "loop"]
        assert len(loop_states) == 11  # the input checkpoint holds only pending input
        assert all(s.values["document"] == document for s in loop_states)


@pytest.mark.parametrize(
    ("size", "on_sqlite", "on_postgres", "encrypted_on_postgres"),
    [
        # From 1 MiB up on SQLite: below, zlib costs more time than the bytes it saves.
        (1_100_000, "msgpack#z", "msgpack#zs", "msgpack#zs"),
        (90_000, "msgpack", "msgpack#zs", "msgpack#zs"),
        # From 2 KiB up on PostgreSQL: the server would compress it otherwise (slower).
        # Not when encrypting: compressed lengths could give the plaintext away.
        (8_000, "msgpack", "msgpack#zs", "msgpack"),
        (1_500, "msgpack", "msgpack", "msgpack"),
    ],
)
@pytest.mark.parametrize("encrypted", [False, True])
@pytest.mark.parametrize("kind", KINDS)
async def test_large_values_are_compressed(
    kind: str,
    sqlite_path: str,
    pg_url: str,
    encrypted: bool,
    size: int,
    on_sqlite: str,
    on_postgres: str,
    encrypted_on_postgres: str,
) -> None:
    document = ("compressible text " * (size // 18 + 1))[:size]
    key = generate_key() if encrypted else None
    async with open_saver(
        kind, sqlite_path=sqlite_path, pg_url=pg_url, encryption_key=key
    ) as saver:
        graph = build_graph(1).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "t"}}
        inputs = {"document": document, "steps": []}
        if is_async(kind):
            await graph.ainvoke(inputs, config)
        else:
            graph.invoke(inputs, config)
        rows = raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "SELECT type, blob FROM agentcheck_blobs WHERE thread_id = ? AND channel = ?",
            ("t", "document"),
        )
        assert len(rows) == 1
        type_, blob = rows[0]
        if not is_postgres(kind):
            expected = on_sqlite
        else:
            expected = encrypted_on_postgres if encrypted else on_postgres
        assert type_ == expected + ("#aesgcm" if encrypted else "")
        if "#z" in type_:
            assert len(bytes(blob)) < len(document) // 10
        state = await call(graph, "get_state", kind, config)
        assert state.values["document"] == document


def index_terms(kind: str, db: dict[str, str]) -> list[str]:
    """The terms in the metadata index, sorted."""
    rows = raw_sql(kind, **db, sql="SELECT term FROM agentcheck_metadata_terms")
    return sorted(t for (t,) in rows)


def pending_terms(kind: str, db: dict[str, str]) -> dict[str, list[str]]:
    """The pending terms by checkpoint id (SQLite; PostgreSQL has none, see
    SQL.PENDING_TERMS)."""
    if is_postgres(kind):
        return {}
    rows = raw_sql(kind, **db, sql="SELECT checkpoint_id, terms FROM agentcheck_pending_terms")
    return {cid: SQL.decode_terms(terms) for cid, terms in rows}


async def move_pending_terms(kind: str, saver: Any) -> None:
    """A put whose turn it is to move the pending terms into the index (of a thread of
    its own, with no metadata)."""
    saver._terms_puts = 0
    config: Any = {"configurable": {"thread_id": "mover", "checkpoint_ns": ""}}
    await call(saver, "put", kind, config, generate_checkpoint(), {}, {})


@pytest.mark.parametrize("moved_before", [False, True], ids=["pending", "moved"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_checkpoint_stored_again_is_found_by_its_new_metadata_only(
    kind: str, saver: Any, db: dict[str, str], moved_before: bool
) -> None:
    """LangGraph stores a checkpoint a second time under the same id (durability="exit"
    does at the end): its index terms are replaced, not added to, whether its first
    terms were still pending or already in the index, before and after the move."""
    checkpoint = generate_checkpoint()
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    saver._terms_puts = 1  # the puts below leave their terms pending
    stored = await call(saver, "put", kind, config, checkpoint, {"step": 1, "who": "a", "x": 1}, {})
    if moved_before:
        await move_pending_terms(kind, saver)
    await call(saver, "put", kind, config, checkpoint, {"step": 1, "who": "b"}, {})

    async def found(flt: dict[str, Any]) -> list[str]:
        tuples = await collect(saver, "list", kind, None, filter=flt)
        return [t.config["configurable"]["checkpoint_id"] for t in tuples]

    new_terms = ['["step"]=1', '["who"]="b"']
    for moved in (False, True):
        if moved:
            await move_pending_terms(kind, saver)
        assert await found({"who": "a"}) == []
        assert await found({"x": 1}) == []
        assert await found({"who": "b"}) == [checkpoint["id"]]
        assert await found({"step": 1, "who": "b"}) == [checkpoint["id"]]
        if moved or not saver.sql.PENDING_TERMS:  # PostgreSQL: written to the index
            assert index_terms(kind, db) == new_terms
            assert pending_terms(kind, db) == {}
        else:
            assert pending_terms(kind, db) == {checkpoint["id"]: new_terms}
    assert stored["configurable"]["checkpoint_id"] == checkpoint["id"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_filtered_list_merges_pending_and_indexed_terms_in_order(
    kind: str, saver: Any
) -> None:
    """Checkpoints whose terms are pending and checkpoints whose terms were moved into
    the index come back together, newest first, cut at the limit, under the thread and
    ``before`` conditions: the same as filtering every checkpoint's metadata by hand."""
    saver.move_terms_every = 7  # some moved, some pending (SQLite)
    stored: list[tuple[str, str, dict[str, Any]]] = []  # (thread, id, metadata)
    for i in range(40):
        thread = f"t{i % 3}"
        metadata = {"step": i, "user": f"u-{i % 4}", "parity": i % 2, "tags": {"k": i % 5}}
        config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        checkpoint = generate_checkpoint()
        await call(saver, "put", kind, config, checkpoint, metadata, {})
        stored.append((thread, checkpoint["id"], metadata))
    newest_first = sorted(stored, key=lambda row: row[1], reverse=True)
    middle = newest_first[len(newest_first) // 2][1]

    filters: list[dict[str, Any]] = [
        {"user": "u-1"},
        {"parity": 0, "user": "u-2"},
        {"tags": {"k": 3}},
        {"step": 13},
        {"step": 3},  # a term that begins others: steps 36 to 39 are pending
    ]
    for flt in filters:
        for thread in (None, "t1"):
            for before in (None, middle):
                for limit in (None, 3):
                    expected = [
                        cid
                        for t, cid, meta in newest_first
                        if all(meta[k] == v for k, v in flt.items())
                        and (thread is None or t == thread)
                        and (before is None or cid < before)
                    ][:limit]
                    config = None if thread is None else {"configurable": {"thread_id": thread}}
                    before_config = (
                        None if before is None else {"configurable": {"checkpoint_id": before}}
                    )
                    tuples = await collect(
                        saver, "list", kind, config, filter=flt, before=before_config, limit=limit
                    )
                    found = [t.config["configurable"]["checkpoint_id"] for t in tuples]
                    assert found == expected, (flt, thread, before, limit)


@pytest.mark.parametrize("kind", KINDS)
async def test_copies_prunes_and_deletes_take_pending_terms_along(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """A thread copied, pruned or deleted while its terms are pending is filtered as if
    they were in the index, before the move and after it."""
    saver._terms_puts = 1  # pending until moved
    ids = []
    for i in range(5):
        config: Any = {"configurable": {"thread_id": "a", "checkpoint_ns": ""}}
        checkpoint = generate_checkpoint()
        await call(saver, "put", kind, config, checkpoint, {"user": "x", "step": i}, {})
        ids.append(checkpoint["id"])

    async def found(thread: str) -> list[str]:
        config = {"configurable": {"thread_id": thread}}
        tuples = await collect(saver, "list", kind, config, filter={"user": "x"})
        return [t.config["configurable"]["checkpoint_id"] for t in tuples]

    await call(saver, "copy_thread", kind, "a", "b")
    await call(saver, "prune", kind, ["a"], strategy="keep_latest")
    assert await found("a") == [ids[-1]]
    assert await found("b") == ids[::-1]
    await call(saver, "delete_thread", kind, "b")
    assert await found("b") == []
    if saver.sql.PENDING_TERMS:
        pending = raw_sql(
            kind, **db, sql="SELECT thread_id, checkpoint_id FROM agentcheck_pending_terms"
        )
        assert pending == [("a", ids[-1])]
    await move_pending_terms(kind, saver)
    assert await found("a") == [ids[-1]]
    assert await found("b") == []
    rows = raw_sql(kind, **db, sql="SELECT DISTINCT thread_id FROM agentcheck_metadata_terms")
    assert sorted(t for (t,) in rows) == ["a"]  # the mover's checkpoint has no metadata


@pytest.mark.parametrize("kind", KINDS)
async def test_a_kept_checkpoint_whose_parent_was_deleted_has_no_parent(
    kind: str, saver: Any
) -> None:
    """prune(keep_latest) and delete_for_runs leave a checkpoint whose parent they
    deleted with no parent (as the official PostgresSaver's prune does), not naming a
    checkpoint that is gone. A parent that was never stored is not theirs to clear."""

    async def put(thread: str, parent: str | None, run_id: str) -> str:
        conf = {"thread_id": thread, "checkpoint_ns": ""}
        if parent is not None:
            conf["checkpoint_id"] = parent
        checkpoint = generate_checkpoint()
        meta = {"run_id": run_id, "step": 0}
        await call(saver, "put", kind, {"configurable": conf}, checkpoint, meta, {})
        return str(checkpoint["id"])

    async def parent_of(thread: str, checkpoint_id: str) -> str | None:
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": "",
                                   "checkpoint_id": checkpoint_id}}  # fmt: skip
        found = await call(saver, "get_tuple", kind, config)
        assert found is not None
        return (
            None
            if found.parent_config is None
            else found.parent_config["configurable"]["checkpoint_id"]
        )

    first = await put("p", None, "r1")
    second = await put("p", first, "r1")
    latest = await put("p", second, "r2")
    await call(saver, "prune", kind, ["p"], strategy="keep_latest")
    assert await parent_of("p", latest) is None
    listed = await collect(saver, "list", kind, {"configurable": {"thread_id": "p"}})
    assert [(t.checkpoint["id"], t.parent_config) for t in listed] == [(latest, None)]

    first = await put("d", None, "r1")
    second = await put("d", first, "r1")
    third = await put("d", second, "r2")
    fourth = await put("d", third, "r2")
    stray = await put("d", "never-stored", "r3")
    await call(saver, "delete_for_runs", kind, ["r1"])
    assert await parent_of("d", third) is None
    assert await parent_of("d", fourth) == third
    assert await parent_of("d", stray) == "never-stored"


@pytest.mark.parametrize("kind", ["sqlite", "async_sqlite"])
async def test_pending_terms_left_behind_are_moved_by_the_next_saver(
    kind: str, db: dict[str, str]
) -> None:
    """Terms a process left pending (it stopped before its turn to move them) are moved
    by the first put of the next saver on the database. Damaged pending rows fail no
    filter and no move: one whose terms are no text moves none, nor does one whose
    checkpoint is gone (a process of an earlier agentcheck deleted it)."""
    async with open_saver(kind, **db) as first:
        first._terms_puts = 1
        for i in range(4):
            config: Any = {"configurable": {"thread_id": f"t{i}", "checkpoint_ns": ""}}
            await call(first, "put", kind, config, generate_checkpoint(), {"user": "x"}, {})
    raw_sql(
        kind,
        **db,
        sql="INSERT INTO agentcheck_pending_terms VALUES ('t9', '', 'c9', ?)",
        params=(SQL.encode_terms(['["user"]="x"']),),
    )
    raw_sql(
        kind, **db, sql="UPDATE agentcheck_pending_terms SET terms = x'00ff' WHERE thread_id = 't3'"
    )
    async with open_saver(kind, **db) as second:
        found = await collect(second, "list", kind, None, filter={"user": "x"})
        assert sorted(t.config["configurable"]["thread_id"] for t in found) == ["t0", "t1", "t2"]
        found = await collect(second, "list", kind, None, filter={"user": "x"}, limit=3)
        assert len(found) == 3  # the row without a checkpoint takes no place
        assert pending_terms_count(kind, db) == 5
        config = {"configurable": {"thread_id": "other", "checkpoint_ns": ""}}
        await call(second, "put", kind, config, generate_checkpoint(), {"user": "y"}, {})
        assert pending_terms_count(kind, db) == 0
        assert index_terms(kind, db) == ['["user"]="x"'] * 3 + ['["user"]="y"']
        found = await collect(second, "list", kind, None, filter={"user": "x"})
        assert sorted(t.config["configurable"]["thread_id"] for t in found) == ["t0", "t1", "t2"]


def pending_terms_count(kind: str, db: dict[str, str]) -> int:
    return int(raw_sql(kind, **db, sql="SELECT COUNT(*) FROM agentcheck_pending_terms")[0][0])


@pytest.mark.parametrize("kind", ["sqlite", "async_sqlite"])
async def test_large_metadata_goes_to_the_index_directly(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """Metadata whose terms exceed 800 characters is not left pending (every filtered list reads
    the pending rows whole): its terms go into the index at once, and a checkpoint
    stored again switches between the two ways with its terms replaced each time."""
    saver._terms_puts = 1  # no move of its own below
    checkpoint = generate_checkpoint()
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    large = {"who": "big", "cfg": {f"option-{j}": j for j in range(100)}}

    async def found(flt: dict[str, Any]) -> list[str]:
        tuples = await collect(saver, "list", kind, None, filter=flt)
        return [t.config["configurable"]["checkpoint_id"] for t in tuples]

    await call(saver, "put", kind, config, checkpoint, {"who": "small"}, {})
    assert pending_terms(kind, db) == {checkpoint["id"]: ['["who"]="small"']}
    await call(saver, "put", kind, config, checkpoint, large, {})
    assert pending_terms(kind, db) == {}
    assert len(index_terms(kind, db)) == 101
    assert await found({"who": "big", "cfg": {"option-7": 7}}) == [checkpoint["id"]]
    assert await found({"who": "small"}) == []
    await call(saver, "put", kind, config, checkpoint, {"who": "again"}, {})
    assert await found({"who": "again"}) == [checkpoint["id"]]
    assert await found({"who": "big"}) == []
    await move_pending_terms(kind, saver)
    assert index_terms(kind, db) == ['["who"]="again"']


@pytest.mark.parametrize("kind", KINDS)
async def test_copy_thread_onto_a_checkpoint_the_target_has_keeps_its_own_terms(
    kind: str, saver: Any
) -> None:
    """copy_thread keeps a checkpoint the target already has (its row, so its metadata):
    its filter terms stay the target's, neither replaced nor added to by the source's,
    whether those are pending or in the index."""
    checkpoint = generate_checkpoint()

    def config(thread: str) -> Any:
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}

    async def found(thread: str, who: str) -> list[str]:
        tuples = await collect(
            saver, "list", kind, {"configurable": {"thread_id": thread}}, filter={"who": who}
        )
        return [t.config["configurable"]["checkpoint_id"] for t in tuples]

    await call(saver, "put", kind, config("a"), checkpoint, {"who": "a"}, {})  # moved
    await call(saver, "copy_thread", kind, "a", "b")
    await call(saver, "put", kind, config("b"), checkpoint, {"who": "b"}, {})  # b's own
    await move_pending_terms(kind, saver)
    await call(saver, "put", kind, config("a"), checkpoint, {"who": "a2"}, {})  # pending
    for moved in (False, True):
        if moved:
            await move_pending_terms(kind, saver)
        await call(saver, "copy_thread", kind, "a", "b")
        stored = await call(saver, "get_tuple", kind, config("b"))
        assert stored is not None and stored.metadata["who"] == "b"
        assert await found("b", "b") == [checkpoint["id"]]
        assert await found("b", "a2") == []
        assert await found("b", "a") == []
        assert await found("a", "a2") == [checkpoint["id"]]


@pytest.mark.parametrize("moved", [False, True], ids=["pending", "moved"])
@pytest.mark.parametrize("kind", ["sqlite", "async_sqlite"])
async def test_a_copy_is_not_superseded_by_pending_terms_left_on_the_target(
    kind: str, saver: Any, db: dict[str, str], moved: bool
) -> None:
    """Pending terms a process of an earlier version left on the target thread (it
    deleted the checkpoint, not its pending row) do not supersede the terms of the
    checkpoint copied there, whether the source's are pending or in the index."""
    saver._terms_puts = 1
    checkpoint = generate_checkpoint()
    source: Any = {"configurable": {"thread_id": "src", "checkpoint_ns": ""}}
    await call(saver, "put", kind, source, checkpoint, {"who": "new"}, {})
    if moved:
        await move_pending_terms(kind, saver)
    raw_sql(
        kind,
        **db,
        sql="INSERT INTO agentcheck_pending_terms VALUES ('dst', '', ?, ?)",
        params=(checkpoint["id"], SQL.encode_terms(['["who"]="old"'])),
    )
    await call(saver, "copy_thread", kind, "src", "dst")
    target = {"configurable": {"thread_id": "dst"}}
    for who, expected in (("old", []), ("new", [checkpoint["id"]])):
        tuples = await collect(saver, "list", kind, target, filter={"who": who})
        assert [t.config["configurable"]["checkpoint_id"] for t in tuples] == expected, who


@pytest.mark.parametrize("kind", ["sqlite", "async_sqlite"])
async def test_a_copy_takes_no_pending_terms_of_checkpoints_the_source_lacks(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """Pending terms left on the source by an earlier version (of a checkpoint deleted
    since) are not copied to the target."""
    saver._terms_puts = 1
    checkpoint = generate_checkpoint()
    source: Any = {"configurable": {"thread_id": "src", "checkpoint_ns": ""}}
    await call(saver, "put", kind, source, checkpoint, {"who": "a"}, {})
    raw_sql(
        kind,
        **db,
        sql="INSERT INTO agentcheck_pending_terms VALUES ('src', '', 'gone', ?)",
        params=(SQL.encode_terms(['["who"]="old"']),),
    )
    await call(saver, "copy_thread", kind, "src", "dst")
    rows = raw_sql(
        kind, **db, sql="SELECT checkpoint_id FROM agentcheck_pending_terms WHERE thread_id = 'dst'"
    )
    assert rows == [(checkpoint["id"],)]


@pytest.mark.parametrize("kind", ["sqlite", "async_sqlite"])
async def test_the_first_put_of_a_saver_moves_what_others_left_whatever_its_metadata(
    kind: str, db: dict[str, str]
) -> None:
    """A saver's first put moves the pending terms earlier savers left, and counts
    towards the next move, also when its own terms go into the index directly."""
    config: Any = {"configurable": {"thread_id": "a", "checkpoint_ns": ""}}
    async with open_saver(kind, **db) as first:
        first._terms_puts = 1
        await call(first, "put", kind, config, generate_checkpoint(), {"who": "a"}, {})
    assert pending_terms_count(kind, db) == 1
    large = {"who": "big", "cfg": {f"option-{j}": j for j in range(100)}}
    async with open_saver(kind, **db) as second:
        await call(second, "put", kind, config, generate_checkpoint(), large, {})
        assert second._terms_puts == 1
    assert pending_terms_count(kind, db) == 0


class _Frozen(Mapping[str, Any]):
    """A Mapping that is no dict."""

    def __init__(self, **items: Any) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@pytest.mark.parametrize(
    "mapping",
    [dict, OrderedDict, lambda **kw: MappingProxyType(kw), _Frozen],
    ids=["dict", "OrderedDict", "MappingProxyType", "Mapping"],
)
def test_every_kind_of_mapping_in_metadata_gives_the_same_terms(mapping: Any) -> None:
    """A nested mapping is walked, an empty one is a term of its own, whatever its class
    (the terms test plain values by exact type first)."""
    metadata = {"source": "loop", "step": 3, "parents": mapping(), "who": mapping(a=1, b="x")}
    assert sorted(metadata_terms(metadata)) == [
        '["parents"]={}',
        '["source"]="loop"',
        '["step"]=3',
        '["who","a"]=1',
        '["who","b"]="x"',
    ]


@pytest.mark.parametrize("kind", KINDS)
async def test_ordinary_writes_keep_their_first_values_and_special_ones_are_replaced(
    kind: str, saver: Any
) -> None:
    """A retried task cannot change what it wrote; an error or interrupt write replaces
    the earlier one."""
    from langgraph.checkpoint.serde.types import ERROR

    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    stored = await call(saver, "put", kind, config, generate_checkpoint(), {}, {})
    first = [("a", 1), ("b", [2, "two"]), ("c", None)]
    await call(saver, "put_writes", kind, stored, first, "task-1")
    await call(saver, "put_writes", kind, stored, [("a", 9), ("b", 9), ("c", 9)], "task-1")
    await call(saver, "put_writes", kind, stored, [("x", b"\x00bytes")], "task-2")
    await call(saver, "put_writes", kind, stored, [(ERROR, "first failure")], "task-3")
    await call(saver, "put_writes", kind, stored, [(ERROR, "second failure")], "task-3")
    found = await call(saver, "get_tuple", kind, stored)
    assert found.pending_writes == [
        ("task-1", "a", 1),
        ("task-1", "b", [2, "two"]),
        ("task-1", "c", None),
        ("task-2", "x", b"\x00bytes"),
        ("task-3", ERROR, "second failure"),
    ]


@pytest.mark.parametrize("channels", [3, 60])
@pytest.mark.parametrize("kind", KINDS)
async def test_checkpoint_rows_are_compressed_only_when_large(
    kind: str, saver: Any, db: dict[str, str], channels: int
) -> None:
    """A checkpoint row of a few channels is stored as it is (compressing it costs more
    time than its bytes are worth); one of many channels is compressed. Both read back."""
    values = {f"channel-{i}": i for i in range(channels)}
    versions = {ch: saver.get_next_version(None, None) for ch in values}
    checkpoint = generate_checkpoint(channel_values=values)
    checkpoint["channel_versions"] = versions
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    stored = await call(saver, "put", kind, config, checkpoint, {}, versions)
    [(type_,)] = raw_sql(kind, **db, sql="SELECT type FROM agentcheck_checkpoints")
    assert type_ == ("msgpack" if channels == 3 else compressed(kind))
    found = await call(saver, "get_tuple", kind, stored)
    assert found.checkpoint["channel_values"] == values


def test_versions_sort_as_strings_in_counter_order(sqlite_path: str) -> None:
    """LangGraph compares channel versions as strings: each next version sorts after the
    last, across digit boundaries and after a version of the official savers' form."""
    from agentcheck.savers import SqliteSaver

    with SqliteSaver.from_conn_string(sqlite_path) as saver:
        official_form = f"{41:032}.{0.5:016}"
        version = saver.get_next_version(official_form, None)
        assert version > official_form and version.startswith(f"{42:016}.")
        seen = []
        for current in (9, 99, 10**6 - 1, 10**15 - 2):
            seen.append(saver.get_next_version(f"{current:016}.{0:013x}", None))
            assert seen[-1] > f"{current:016}.{2**52 - 1:013x}"
        assert seen == sorted(seen)
        assert saver.get_next_version(None, None).startswith(f"{1:016}.")
        assert saver.get_next_version(7, None).startswith(f"{8:016}.")
        randoms = {saver.get_next_version(None, None) for _ in range(1000)}
        assert len(randoms) == 1000  # two forks do not pick the same version
        assert {len(v) for v in randoms} == {30}


@pytest.mark.parametrize("kind", KINDS)
async def test_metadata_filter_is_answered_from_an_index(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_config, generate_metadata

    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        for i in range(300):
            config = generate_config(f"thread-{i % 30}")
            metadata = generate_metadata(step=i, user=f"user-{i % 7}")
            if is_async(kind):
                await saver.aput(config, generate_checkpoint(), metadata, {})
            else:
                saver.put(config, generate_checkpoint(), metadata, {})
        found = (
            [t async for t in saver.alist(None, filter={"user": "user-3", "step": 10})]
            if is_async(kind)
            else list(saver.list(None, filter={"user": "user-3", "step": 10}))
        )
        assert [t.metadata["step"] for t in found] == [10]

        # The SQL the saver runs for a filtered list, explained by the database itself.
        op = saver._list(None, {"user": "user-3"}, None, 10)
        query = next(op)
        op.close()
        # Planner cost settings do not matter for a 300-row table; PostgreSQL is kept off
        # the sequential scan so the plan shows whether an index *can* answer it.
        db = {"sqlite_path": sqlite_path, "pg_url": pg_url}
        plan = _explain(kind, db, query.sql, query.params, no_seqscan=True)
        if is_postgres(kind):
            assert "agentcheck_metadata_terms" in plan
            assert "Seq Scan" not in plan, plan
        else:
            assert "agentcheck_metadata_terms_term_idx" in plan, plan
            assert "SCAN c" not in plan, plan


def _explain(
    kind: str, db: dict[str, str], sql: str, params: Sequence[Any], *, no_seqscan: bool = False
) -> str:
    """The database's plan for one of the saver's statements."""
    if is_postgres(kind):
        with psycopg.connect(db["pg_url"], autocommit=True) as conn:
            conn.execute("ANALYZE")
            if no_seqscan:
                conn.execute("SET enable_seqscan = off")
            raw = psycopg.RawCursor(conn)  # the saver's native $n placeholders
            rows = raw.execute("EXPLAIN " + pg_backend._pg(sql), tuple(params)).fetchall()
        return "\n".join(r[0] for r in rows)
    conn = sqlite3.connect(db["sqlite_path"])
    try:
        rows = conn.execute("EXPLAIN QUERY PLAN " + sql, tuple(params)).fetchall()
    finally:
        conn.close()
    return "\n".join(str(r[-1]) for r in rows)


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_reads_look_values_and_writes_up_by_primary_key(
    kind: str, saver: Any, db: dict[str, str]
) -> None:
    """A read finds each stored value and pending write it needs with a primary-key
    look-up, not by scanning the thread's rows: otherwise reads slow down as a thread
    grows (SQLite scans all of a thread's rows for a row-value IN list)."""
    config: Any = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
    versions: dict[str, str] = {}
    for i in range(300):
        new = {ch: saver.get_next_version(versions.get(ch), None) for ch in ("a", "b")}
        versions.update(new)
        checkpoint = generate_checkpoint(channel_values={"a": i, "b": [i]})
        checkpoint["channel_versions"] = dict(versions)
        config = saver.put(config, checkpoint, {"step": i}, new)
        saver.put_writes(config, [("a", i)], f"task-{i}")
    latest = saver.get_tuple({"configurable": {"thread_id": "long", "checkpoint_ns": ""}})
    assert latest.checkpoint["channel_values"] == {"a": 299, "b": [299]}
    assert latest.pending_writes == [("task-299", "a", 299)]

    # One statement reads the checkpoint, the values it names and its writes.
    queries, _ = _recorded(saver, saver._get_tuple(latest.config))
    assert len(queries) == 1, [q.sql for q in queries]
    plan = _explain(kind, db, queries[0].sql, queries[0].params)
    if is_postgres(kind):
        assert "Seq Scan" not in plan, plan
        for index in ("agentcheck_blobs_pkey", "agentcheck_writes_pkey"):
            assert re.search(rf"Index Scan using {index} [^\n]*\n\s*Index Cond: ", plan), plan
    else:
        for table, key_column in (("b", "version"), ("w", "checkpoint_id")):
            assert re.search(rf"SEARCH {table} USING INDEX .*{key_column}=\?\)", plan), plan
        assert "SCAN agentcheck" not in plan and "SCAN b" not in plan, plan
        assert "SCAN w" not in plan, plan


def _recorded(saver: Any, op: Any) -> tuple[list[Query], Any]:
    """Run a sync saver's read operation query by query; the queries and its result."""
    queries: list[Query] = []

    def replay(query: Query) -> Any:
        rows = yield query
        return rows

    def answer(query: Query) -> Any:
        queries.append(query)
        return saver.run_op(lambda: replay(query), write=False)

    return queries, drive(op, answer)


def _failing_put(saver: Any, thread_id: str, failure: str) -> Any:
    """An operation that stores a checkpoint row, then fails: by SQL or by Python."""
    checkpoint_row = (
        *(thread_id, "", "cp-1", None, None),
        *("msgpack", b"\x80", "msgpack", b"\x80", None),
    )

    def op() -> Any:
        yield Query(saver.sql.UPSERT_CHECKPOINT, checkpoint_row)
        if failure == "sql":
            yield Query("SELECT no_such_column FROM agentcheck_checkpoints", fetch=True)
        if failure == "python-after-read":
            # A read makes PostgreSQL send the held-back upsert first: it is in the
            # transaction when the Python error comes.
            rows = yield Query("SELECT COUNT(*) FROM agentcheck_checkpoints", fetch=True)
            assert rows[0][0] == 1
        raise ValueError("the operation failed after its first statement")

    return op


@pytest.mark.parametrize("failure", ["sql", "python", "python-after-read"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_failed_write_stores_nothing_and_the_saver_goes_on(
    kind: str, saver: Any, failure: str, db: dict[str, str]
) -> None:
    """Every write runs in one transaction: a failure part-way leaves no trace and the
    connection usable (on PostgreSQL autocommit connections agentcheck sends BEGIN and
    COMMIT itself, with the statements they frame)."""
    make_op = _failing_put(saver, "t-fail", failure)
    with pytest.raises((ValueError, Exception)) as info:
        await call(saver, "run_op", kind, make_op, write=True)
    if failure.startswith("python"):
        assert isinstance(info.value, ValueError)
    else:
        assert "no_such_column" in str(info.value)
    assert raw_sql(kind, **db, sql="SELECT * FROM agentcheck_checkpoints") == []
    # The same connections serve the next operations.
    config = {"configurable": {"thread_id": "t-ok", "checkpoint_ns": ""}}
    for _ in range(3):
        if is_async(kind):
            stored = await saver.aput(config, generate_checkpoint(), {}, {})
            assert await saver.aget_tuple(stored) is not None
        else:
            stored = saver.put(config, generate_checkpoint(), {}, {})
            assert saver.get_tuple(stored) is not None


@pytest.mark.parametrize("autocommit", [True, False])
def test_a_failed_write_on_a_user_connection_stores_nothing(pg_url: str, autocommit: bool) -> None:
    from agentcheck.savers import PostgresSaver

    with psycopg.connect(pg_url, autocommit=autocommit) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        with pytest.raises(ValueError):
            saver.run_op(_failing_put(saver, "t-fail", "python"), write=True)
        with pytest.raises(psycopg.errors.UndefinedColumn):
            saver.run_op(_failing_put(saver, "t-fail", "sql"), write=True)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        config: Any = {"configurable": {"thread_id": "t-ok", "checkpoint_ns": ""}}
        stored = saver.put(config, generate_checkpoint(), {}, {})
        assert saver.get_tuple(stored) is not None
    with psycopg.connect(pg_url) as check:
        rows = check.execute("SELECT thread_id FROM agentcheck_checkpoints").fetchall()
    assert rows == [("t-ok",)]


@pytest.mark.parametrize("write", [False, True], ids=["read", "write"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_batch_of_queries_answers_each_in_order(kind: str, saver: Any, write: bool) -> None:
    """Independent queries yielded together (PostgreSQL pipelines them, in a write's
    transaction or on their own) each get their own answer, in order."""
    for thread in ("a", "b"):
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        checkpoint = generate_checkpoint()
        if is_async(kind):
            stored = await saver.aput(config, checkpoint, {"who": thread}, {})
            await saver.aput_writes(stored, [("x", thread)], "task")
        else:
            stored = saver.put(config, checkpoint, {"who": thread}, {})
            saver.put_writes(stored, [("x", thread)], "task")

    select = "SELECT thread_id FROM agentcheck_writes WHERE thread_id = ?"

    def op() -> Any:
        queries = [Query(select, ("b",), fetch=True), Query(select, ("a",), fetch=True)]
        if write:
            queries.insert(1, Query("DELETE FROM agentcheck_writes WHERE thread_id = ?", ("b",)))
        answers = yield from batch(queries)
        after = yield Query(select, ("b",), fetch=True)
        return answers, after

    answers, after = await call(saver, "run_op", kind, op, write=write)
    expected = [[("b",)], [], [("a",)]] if write else [[("b",)], [("a",)]]
    assert [list(map(tuple, rows)) for rows in answers] == expected
    assert after == ([] if write else [("b",)])


def test_a_later_statement_must_be_one_whose_rows_are_read() -> None:
    with pytest.raises(ValueError, match="fetch=True"):
        Later(Query("INSERT INTO t VALUES (?)", ("x",)), lambda rows: None)
    with pytest.raises(ValueError, match="fetch=True"):
        Later(Query("INSERT INTO t VALUES (?)", [("x",)], many=True, fetch=True), lambda rows: None)


@pytest.mark.parametrize("fails", [False, True], ids=["commits", "fails"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_later_statement_hands_its_rows_over_after_the_commit(
    kind: str, saver: Any, fails: bool, db: dict[str, str]
) -> None:
    """A Later statement is executed in the transaction (PostgreSQL: without a round
    trip of its own), and its rows reach the callback only once the transaction has
    committed, in order with the OnCommit callbacks; never when the operation fails."""
    got: list[Any] = []
    insert = (
        "INSERT INTO agentcheck_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
        "idx, channel, type, blob, task_path) VALUES (?, '', 'c', 't', ?, 'x', 'null', ?, '') "
        "RETURNING idx"
    )

    no_result = "UPDATE agentcheck_writes SET task_path = 'p' WHERE thread_id = ?"

    def op() -> Any:
        yield Later(Query(insert, ("later", 7, b""), fetch=True), lambda rows: got.append(rows))
        yield OnCommit(lambda: got.append("on-commit"))
        yield Later(Query(insert, ("later", 8, b""), fetch=True), lambda rows: got.append(rows))
        # A statement without RETURNING hands over no rows, on both databases.
        yield Later(Query(no_result, ("later",), fetch=True), lambda rows: got.append(rows))
        assert got == []  # nothing is known to be stored yet
        if fails:
            yield Query("SELECT no_such_column FROM agentcheck_writes", fetch=True)
        return "done"

    async def run() -> Any:
        return await call(saver, "run_op", kind, op, write=True)

    if fails:
        with pytest.raises(Exception, match="no_such_column"):
            await run()
        assert got == []
        assert raw_sql(kind, **db, sql="SELECT idx FROM agentcheck_writes") == []
    else:
        assert await run() == "done"
        assert [x if isinstance(x, str) else [tuple(r) for r in x] for x in got] == [
            [(7,)],
            "on-commit",
            [(8,)],
            [],
        ]
        stored = raw_sql(kind, **db, sql="SELECT idx FROM agentcheck_writes ORDER BY idx")
        assert [tuple(r) for r in stored] == [(7,), (8,)]


def _sent_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of every statement the PostgreSQL runners send from now on, in order."""
    sent: list[str] = []
    original = pg_backend._send

    def recording(cur: Any, query: Query) -> Any:
        sent.append(query.sql)
        return original(cur, query)

    monkeypatch.setattr(pg_backend, "_send", recording)
    return sent


@pytest.mark.parametrize("kind", [k for k in KINDS if is_postgres(k)])
async def test_a_write_of_plain_inserts_is_sent_as_one_statement(
    kind: str, saver: Any, db: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an autocommit connection a lone statement is its own transaction: agentcheck
    sends no BEGIN/COMMIT around it, and joins plain inserts into different tables (a
    task's writes and its event) into one statement, all or nothing. Statements that
    could see each other's rows (the same table) keep BEGIN/COMMIT, and stay atomic."""
    sent = _sent_statements(monkeypatch)
    insert = (
        "INSERT INTO agentcheck_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
        "idx, channel, type, blob, task_path) VALUES (?, '', 'c', 't', ?, 'x', 'null', NULL, '')"
    )

    def one() -> Any:
        yield Query(insert, ("one", 1))

    def two_then_fail() -> Any:
        yield Query(insert, ("two", 1))
        yield Query(insert, ("two", 1))  # the same key again: a unique violation

    async def run(op: Any) -> None:
        await call(saver, "run_op", kind, op, write=True)

    await run(one)
    assert sent == [insert]
    sent.clear()
    with pytest.raises(psycopg.errors.UniqueViolation):
        await run(one)  # alone, and failing: nothing to roll back
    assert sent == [insert]
    sent.clear()
    with pytest.raises(psycopg.errors.UniqueViolation):
        await run(two_then_fail)
    assert sent == ["BEGIN", insert, insert, "COMMIT"]
    rows = raw_sql(kind, **db, sql="SELECT thread_id FROM agentcheck_writes")
    assert [tuple(r) for r in rows] == [("one",)]
    # The connections serve the next write.
    sent.clear()
    await run(lambda: (yield Query(insert, ("three", 1))))
    assert sent == [insert]

    # Rows of one insert, and inserts into two tables: one statement each time.
    sent.clear()
    await run(lambda: (yield Query(insert, [("four", 1), ("four", 2)], many=True)))
    assert len(sent) == 1 and sent[0].count("), (") == 1, sent

    def event(kind_: str | None) -> tuple[Any, ...]:
        return ("r5", "2026-01-01", kind_, "end", "n", *[None] * 8)

    def write_and_event(kind_: str | None) -> Any:
        def op() -> Any:
            yield Query(insert, [("five", 1), ("five", 2)], many=True)
            yield Query(saver.sql.INSERT_EVENT, event(kind_))

        return op

    sent.clear()
    with pytest.raises(psycopg.errors.NotNullViolation):
        await run(write_and_event(None))  # the event fails: the writes are not stored
    assert len(sent) == 1 and sent[0].startswith("WITH "), sent
    assert raw_sql(kind, **db, sql="SELECT 1 FROM agentcheck_writes WHERE thread_id = 'five'") == []
    await run(write_and_event("node"))
    assert (
        len(raw_sql(kind, **db, sql="SELECT 1 FROM agentcheck_writes WHERE thread_id = 'five'"))
        == 2
    )
    assert raw_sql(kind, **db, sql="SELECT kind FROM agentcheck_events WHERE run_id = 'r5'") == [
        ("node",)
    ]


@pytest.mark.parametrize("kind", [k for k in KINDS if is_postgres(k)])
async def test_a_put_in_the_middle_of_a_run_is_one_statement(
    kind: str, saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint row, its values and its index terms go as one statement, and so
    does a put that starts or ends the run: its transition and event (which read and
    return rows) are the statement's main part, after the others as CTEs."""
    # The database's first put records the form of its index terms, in statements of
    # its own.
    other = {"configurable": {"thread_id": "other", "checkpoint_ns": ""}}
    await call(saver, "put", kind, other, generate_checkpoint(), {"source": "input"}, {})
    sent = _sent_statements(monkeypatch)
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    sources = ["input", "update", "loop"]  # starts the run, goes on, ends it (nothing next)
    for step, source in enumerate(sources):
        checkpoint = generate_checkpoint(channel_values={"big": "x" * 1000, "n": step})
        versions = {ch: saver.get_next_version(None, None) for ch in ("big", "n")}
        checkpoint["channel_versions"] = versions
        metadata = {"source": source, "step": step, "who": "me"}
        sent.clear()
        config = await call(saver, "put", kind, config, checkpoint, metadata, versions)
        assert len(sent) == 1 and sent[0].startswith("WITH "), sent
        if source != "update":
            assert "changed AS (" in sent[0]  # the run's transition, in the same statement
    found = await collect(saver, "list", kind, None, filter={"who": "me", "step": 1})
    assert [t.checkpoint["channel_values"]["n"] for t in found] == [1]
    run = await call(saver.journal, "get_run", kind, "t")
    assert run is not None and run.status == "succeeded"
    events = await call(saver.journal, "events", kind, "t")
    assert [(e.kind, e.phase) for e in events] == [("run", "start"), ("run", "end")]


@pytest.mark.parametrize("kind", [k for k in KINDS if is_postgres(k)])
async def test_a_write_of_more_parameters_than_one_statement_takes_is_stored(
    kind: str, saver: Any
) -> None:
    """Rows are joined into one statement only up to PostgreSQL's 65,535 parameters: a
    task writing 8,000 Sends (9 parameters each) is stored row by row, as before."""
    from langgraph.types import Send

    config: Any = {"configurable": {"thread_id": "fan-out", "checkpoint_ns": ""}}
    stored = await call(saver, "put", kind, config, generate_checkpoint(), {}, {})
    sends = [("__pregel_tasks", Send("work", {"i": i})) for i in range(8000)]
    await call(saver, "put_writes", kind, stored, sends, "task-1")
    found = await call(saver, "get_tuple", kind, stored)
    assert [w[2].arg["i"] for w in found.pending_writes] == list(range(8000))


def test_only_statements_that_cannot_see_each_other_are_joined() -> None:
    """PostgreSQL joins a write's statements into one only when running them as parts
    of one statement (one snapshot, no part seeing another's changes) changes nothing."""
    write, event, terms = SQL.INSERT_WRITE_IF_ABSENT, SQL.INSERT_EVENT, SQL.INSERT_TERM

    def joined(shape: tuple[tuple[Any, ...], ...], answer: bool = False) -> str | None:
        """(sql, rows, disjoint), or (sql, rows, disjoint, check)."""
        return pg_backend._joined(tuple((*p, False)[:4] for p in shape), answer)

    assert joined(((write, 2, False), (event, 0, False))) is not None
    assert joined(((SQL.UPSERT_CHECKPOINT, 0, False), (event, 0, False))) is not None
    assert joined(((event, 0, False), (event, 0, False))) is None  # the same table
    assert joined(((SQL.UPSERT_WRITE, 2, False), (event, 0, False))) is None  # a row twice
    assert joined(((SQL.START_RUN, 0, False), (write, 0, False))) is None  # RETURNING
    assert joined(((SQL.DELETE_TERMS_OF, 0, False), (terms, 3, False))) is None
    assert joined(((SQL.DELETE_TERMS_OF, 0, True), (terms, 3, False))) is not None  # disjoint
    assert joined(((SQL.DELETE_TERMS_OF, 0, True), (terms, 3, False), (terms, 1, False))) is None
    reads = "DELETE FROM agentcheck_blobs WHERE version IN (SELECT version FROM agentcheck_writes)"
    assert joined(((write, 0, False), (reads, 0, False))) is None  # reads another table
    # A statement that reads or returns rows may come last, as the main part, if it names
    # no table the others write: its rows are the joined statement's.
    start, done = PostgresSQL.START_RUN_LOGGED, PostgresSQL.MARK_SUCCEEDED_LOGGED
    assert start is not None and done is not None
    for answer in (False, True):
        one = joined(
            ((SQL.UPSERT_CHECKPOINT, 0, False), (terms, 2, False), (start, 0, False)), answer
        )
        assert one is not None and one.startswith("WITH s0 AS (INSERT INTO agentcheck_checkpoints")
        assert ", changed AS (INSERT INTO agentcheck_runs" in one and one.endswith("RETURNING seq")
    assert joined(((event, 0, False), (done, 0, False))) is None  # it reads events too
    assert joined(((start, 0, False), (SQL.UPSERT_CHECKPOINT, 0, False))) is None  # not last
    assert joined(((write, 0, False), ("CREATE TABLE x (y INT)", 0, False))) is None  # not DML
    assert joined(((write, 0, False), (reads.replace("writes", "runs"), 0, False))) is not None
    recursive = "WITH RECURSIVE r AS (SELECT 1) DELETE FROM agentcheck_runs WHERE run_id = ?"
    assert joined(((write, 0, False), (recursive, 0, False))) is None
    delete = "DELETE FROM agentcheck_runs WHERE run_id = ?"
    for clash in ("WITH s0 AS (SELECT 1) ", "WITH s0(x) AS (SELECT 1) ", "with S1 as (select 1) "):
        assert joined(((write, 0, False), (clash + delete, 0, False))) is None  # our CTE name
    lower = "with recursive r as (select 1) DELETE FROM agentcheck_runs WHERE run_id = ?"
    assert joined(((write, 0, False), (lower, 0, False))) is None
    # A check (Query.check: changes nothing, fails if what it reads is not as expected)
    # joins whatever it reads, before the statements that write the same table.
    assert PostgresSQL.CHECK_BLOBS is not None
    check, blob = PostgresSQL.CHECK_BLOBS.format(pairs="(?, ?), (?, ?)"), SQL.INSERT_BLOB
    put = joined(((check, 0, True, True), (blob, 2, False), (SQL.UPSERT_CHECKPOINT, 0, False)))
    assert put is not None and put.startswith("WITH s0 AS (INSERT INTO agentcheck_blobs")
    assert put.count("SELECT") == 3  # the check's own


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_a_filter_is_driven_from_its_rarest_term(kind: str, saver: Any) -> None:
    """With several terms, a filtered list walks the rarest one. On PostgreSQL the
    common terms are ranked from its statistics, without counting their rows; the
    others (and every term on SQLite) are counted."""
    for i in range(400):
        config: Any = {"configurable": {"thread_id": f"t{i % 20}", "checkpoint_ns": ""}}
        metadata = {"kind": "common", "step": i, "ref": f"r{i}"}
        saver.put(config, generate_checkpoint(), metadata, {})
    if is_postgres(kind):
        with saver.conn.connection() as conn:
            conn.execute("ANALYZE agentcheck_metadata_terms")
        saver._term_stats = None  # as if a minute had passed

    def planned(flt: dict[str, Any]) -> tuple[list[Query], Any]:
        return _recorded(saver, saver._list(None, flt, None, 5))

    queries, found = planned({"kind": "common", "step": 7})
    assert [t.metadata["step"] for t in found] == [7]
    counted = [q for q in queries if "COUNT(*)" in q.sql]
    listed = next(q for q in queries if "t0.term" in q.sql)
    assert listed.params[0] == saver._term('["step"]=7')  # driven from the rare term
    if is_postgres(kind):
        assert counted == []  # "kind" is among the most common values: not counted
    else:
        assert len(counted) == 1

    queries, found = planned({"kind": "common", "step": 9, "ref": "r9"})
    assert [t.metadata["step"] for t in found] == [9]
    counted = [q for q in queries if "COUNT(*)" in q.sql]
    assert len(counted) == 1  # the uncommon terms are counted against each other
    kind_term = saver._term('["kind"]="common"')
    assert (kind_term in counted[0].params) == (not is_postgres(kind))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["flat", "nested"])
async def test_a_filter_with_thousands_of_values_is_answered(
    kind: str, saver: Any, shape: str
) -> None:
    """A filter has a term per value in it: with 1,200 (a large mapping under one key,
    or 1,200 keys), SQLite refused the list ("Expression tree is too large", a chain of
    ANDs nests a level per term) and counting the terms ("too many columns")."""
    values = {f"k{i}": {"v": i} for i in range(1_200)}
    wanted = {"cfg": values} if shape == "nested" else values
    other = {"cfg": {**values, "k0": {"v": -1}}} if shape == "nested" else {**values, "k0": -1}
    for thread, metadata in (("wanted", wanted), ("other", other)):
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        await call(saver, "put", kind, config, generate_checkpoint(), metadata, {})
    found = await collect(saver, "list", kind, None, filter=wanted)
    assert [t.config["configurable"]["thread_id"] for t in found] == ["wanted"]
    # Again once SQLite has moved every put's terms from its pending rows into the term
    # index (every 32 puts): the list then reads them from the index alone.
    for _ in range(32):
        config = {"configurable": {"thread_id": "filler", "checkpoint_ns": ""}}
        await call(saver, "put", kind, config, generate_checkpoint(), {"n": 1}, {})
    found = await collect(saver, "list", kind, None, filter=wanted)
    assert [t.config["configurable"]["thread_id"] for t in found] == ["wanted"]


def _keys(tuples: list[Any]) -> list[tuple[str, str, str]]:
    return [
        (t.config["configurable"]["thread_id"], t.config["configurable"]["checkpoint_ns"],
         t.config["configurable"]["checkpoint_id"])
        for t in tuples
    ]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
async def test_a_long_list_is_read_a_page_at_a_time_newest_first(kind: str, saver: Any) -> None:
    """A list without a limit is read in pages (16 checkpoints, then 64, 256...), each
    handed out before the next is read: the first checkpoints of a long history come
    after one small read, not after reading and decoding all of it. Pages of a list
    across threads that hold the same checkpoint ids (copies) hand out each once."""
    config: Any = {"configurable": {"thread_id": "a", "checkpoint_ns": ""}}
    for step in range(100):
        config = await call(saver, "put", kind, config, generate_checkpoint(), {"step": step}, {})
    await call(saver, "copy_thread", kind, "a", "b")
    whole = _keys(await collect(saver, "list", kind, None, limit=1_000))  # one page
    assert len(whole) == len(set(whole)) == 200

    reads: list[int] = []
    read_page = saver._list

    def counted(*args: Any) -> Any:
        reads.append(args[3])  # the rows asked for
        return read_page(*args)

    saver._list = counted
    if is_async(kind):
        newest = await saver.alist({"configurable": {"thread_id": "a"}}).__anext__()
    else:
        newest = next(iter(saver.list({"configurable": {"thread_id": "a"}})))
    assert newest.metadata["step"] == 99
    assert reads == [16]
    for limit in (None, 1, 16, 17, 33, 150):
        reads.clear()
        paged = _keys(await collect(saver, "list", kind, None, limit=limit))
        expected = whole if limit is None else whole[:limit]
        assert [k[2] for k in paged] == [k[2] for k in expected]  # newest first
        # Each once (which thread's copy of an id a limit cuts between is either).
        assert len(set(paged)) == len(paged) and set(paged) <= set(whole)
        if limit is None:
            # Each id is held by both threads: a page starts at the id the last one
            # ended at and asks for the 2 rows handed out there besides its own.
            assert reads == [16, 64 + 2, 256 + 2]


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_a_filtered_list_ranks_its_terms_once_for_all_its_pages(
    kind: str, saver: Any
) -> None:
    """Each page of a filtered list counted the filter's terms again (a count of up to
    2,000 index entries per term); the first page's ranking is kept for the others."""
    for _ in range(40):
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saver.put(config, generate_checkpoint(), {"user": "u", "source": "loop"}, {})
    ranked: list[int] = []
    rank = saver._rarest_first

    def counted(terms: list[str]) -> Any:
        ranked.append(len(terms))
        return rank(terms)

    saver._rarest_first = counted
    found = list(saver.list(None, filter={"user": "u", "source": "loop"}))
    assert len(found) == 40  # two pages: 16, then 24 of 64
    assert ranked == [2]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("way", ["own", "other"])
async def test_a_list_hands_out_the_newer_checkpoints_before_a_damaged_one(
    kind: str, saver: Any, db: dict[str, str], way: str
) -> None:
    """A damaged row 25 checkpoints back raised before any checkpoint was handed out:
    the list read everything first. Now every newer checkpoint comes out, then the
    error: the first page's 16, and the 8 before it in its own page (which came out
    with it only once that page was decoded row by row); also through the other style's
    method (alist of a sync saver, list of an async one, called from another thread)."""
    config: Any = {"configurable": {"thread_id": "a", "checkpoint_ns": ""}}
    ids = []
    for step in range(40):
        config = await call(saver, "put", kind, config, generate_checkpoint(), {"step": step}, {})
        ids.append(config["configurable"]["checkpoint_id"])
    damaged = ids[-25]
    sql = "UPDATE agentcheck_checkpoints SET checkpoint = ? WHERE checkpoint_id = ?"
    raw_sql(kind, db["sqlite_path"], db["pg_url"], sql, (b"\xc1 not msgpack", damaged))
    handed: list[Any] = []
    thread_config = {"configurable": {"thread_id": "a"}}

    def sync_list() -> None:
        for t in saver.list(thread_config):
            handed.append(t)

    with pytest.raises(CorruptDataError, match=damaged):
        if is_async(kind) == (way == "own"):
            async for t in saver.alist(thread_config):
                handed.append(t)
        elif is_async(kind):
            await asyncio.to_thread(sync_list)  # not on the saver's own event loop
        else:
            sync_list()
    assert [t.metadata["step"] for t in handed] == list(range(39, 15, -1))  # all but 15


class Color(str, enum.Enum):
    RED = "red"


@pytest.mark.parametrize("kind", KINDS)
async def test_small_plain_values_are_kept_in_the_checkpoint_row(
    kind: str, db: dict[str, str]
) -> None:
    """None, booleans, numbers and strings up to 256 characters travel inside the
    checkpoint's row (no row of their own); anything else, a str subclass included, gets
    its own row. Both read back exactly, types included."""
    async with open_saver(kind, **db, allowed_types=[Color]) as saver:
        await _check_small_plain_values(kind, saver, db)


async def _check_small_plain_values(kind: str, saver: Any, db: dict[str, str]) -> None:
    values = {
        "none": None,
        "flag": True,
        "count": 3,
        "ratio": 1.0,
        "short": "x" * 256,
        "long": "y" * 257,
        "color": Color.RED,
        "items": [1, 2],
    }
    versions = {ch: saver.get_next_version(None, None) for ch in values}
    checkpoint = generate_checkpoint(channel_values=values, channel_versions=versions)
    config: Any = {"configurable": {"thread_id": "inline", "checkpoint_ns": ""}}
    stored = await call(saver, "put", kind, config, checkpoint, {}, versions)
    rows = raw_sql(
        kind,
        **db,
        sql="SELECT channel FROM agentcheck_blobs WHERE thread_id = ?",
        params=("inline",),
    )
    assert sorted(r[0] for r in rows) == ["color", "items", "long"]
    got = await call(saver, "get_tuple", kind, stored)
    assert got.checkpoint["channel_values"] == values
    read = got.checkpoint["channel_values"]
    assert type(read["flag"]) is bool and type(read["ratio"]) is float
    assert type(read["color"]) is Color
    assert "_ac_inline" not in got.checkpoint

    # A copy of the thread, and a fresh saver, read the same.
    await call(saver, "copy_thread", kind, "inline", "inline-copy")
    copied = await call(saver, "get_tuple", kind, {"configurable": {"thread_id": "inline-copy"}})
    assert copied.checkpoint["channel_values"] == values


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_inline_values_of_channels_without_a_version_are_not_returned(
    kind: str, saver: Any
) -> None:
    """A value whose channel has no version is not part of the checkpoint (as with the
    official savers), small or not."""
    version = saver.get_next_version(None, None)
    checkpoint = generate_checkpoint(
        channel_values={"a": 1, "stray": 2, "stray_list": [3]},
        channel_versions={"a": version},
    )
    config: Any = {"configurable": {"thread_id": "stray", "checkpoint_ns": ""}}
    stored = saver.put(config, checkpoint, {}, {"a": version})
    assert saver.get_tuple(stored).checkpoint["channel_values"] == {"a": 1}


@pytest.mark.parametrize("kind", SYNC_KINDS)
async def test_prune_keep_latest_finds_a_delta_channel_seed_kept_inline(
    kind: str, saver: Any
) -> None:
    """keep_latest keeps the ancestors a DeltaChannel needs back to its seed, and no
    further, when the seed is a small value inside a checkpoint's row."""
    v = saver.get_next_version(None, None)
    shapes = [
        ({"other": [0]}, {"other": v}, {}),  # the root: before the seed
        ({"d": 5}, {"d": v}, {}),  # the seed, inline
        ({}, {"d": v}, {}),  # the channel's value rebuilt from writes from here on
        ({}, {"d": v}, {"counters_since_delta_snapshot": {"d": 2}}),
    ]
    config: Any = {"configurable": {"thread_id": "delta-seed", "checkpoint_ns": ""}}
    ids = []
    for values, versions, extra in shapes:
        checkpoint = generate_checkpoint(channel_values=values, channel_versions=versions)
        config = saver.put(config, checkpoint, {"source": "loop", **extra}, versions)
        ids.append(checkpoint["id"])
    saver.prune(["delta-seed"], strategy="keep_latest")
    kept = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "delta-seed"}})]
    assert sorted(kept) == sorted(ids[1:])


@pytest.mark.parametrize("kind", KINDS)
async def test_a_chat_is_stored_as_message_lists_any_serializer_reads(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """The messages channel is stored as whole message lists (snapshots) and deltas whose
    tails are message lists; a saver given another serializer later still reads them."""
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        messages = await chat_turns(kind, saver, "chat", 12)
    assert len(messages) == 24
    types = {
        t
        for (t,) in raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "SELECT type FROM agentcheck_blobs WHERE channel = 'messages'",
        )
    }
    # (the larger lists compressed on PostgreSQL: "#zs")
    assert {t.split("#")[0] for t in types} == {MESSAGE_LIST, "delta"}
    other = JsonPlusSerializer(pickle_fallback=False)
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, serde=other) as saver:
        config: Any = {"configurable": {"thread_id": "chat", "checkpoint_ns": ""}}
        found = await call(saver, "get_tuple", kind, config)
        assert found.checkpoint["channel_values"]["messages"] == messages


class Tone(enum.Enum):
    CALM = "calm"


def test_a_message_list_read_by_another_serializer_uses_its_allowlist(sqlite_path: str) -> None:
    """Values inside a stored message list are decoded by the reading serializer's own
    hook: an enum its allowlist names comes back as the enum, not as its plain value."""
    from langchain_core.messages import AIMessage

    from agentcheck.savers import SqliteSaver

    messages = [AIMessage("x", id="a", additional_kwargs={"tone": Tone.CALM})] * 8
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with SqliteSaver.from_conn_string(sqlite_path, allowed_types=[Tone]) as saver:
        saver.setup()
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages}
        checkpoint["channel_versions"] = {"messages": saver.get_next_version(None, None)}
        stored = saver.put(config, checkpoint, {}, checkpoint["channel_versions"])
        assert saver.get_tuple(stored).checkpoint["channel_values"]["messages"] == messages
    allowed = [(Tone.__module__, "Tone")]
    other = JsonPlusSerializer(pickle_fallback=False, allowed_msgpack_modules=allowed)
    wrapping = EncryptedSerializer(XorCipher("none"), other)  # type: ignore[arg-type]
    for serde in (other, wrapping):  # the allowlist of the one it wraps, for a wrapper
        with SqliteSaver.from_conn_string(sqlite_path, serde=serde) as saver:
            found = saver.get_tuple(stored)
        read = found.checkpoint["channel_values"]["messages"]
        assert read[0].additional_kwargs == {"tone": Tone.CALM}
    [(type_,)] = raw_sql("sqlite", sqlite_path, "", "SELECT type FROM agentcheck_blobs")
    assert type_ == MESSAGE_LIST


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_write_inside_the_callers_own_pipeline_fails_in_the_call(
    pg_url: str, asynchronous: bool
) -> None:
    """On a connection the caller has put in pipeline mode, a write's error still comes
    out of the saver's call, and its OnCommit callbacks do not run: a lone statement sent
    there would only be answered at the caller's sync."""
    from agentcheck.savers import AsyncPostgresSaver, PostgresSaver

    committed: list[str] = []

    def duplicate(saver: Any) -> Callable[[], Any]:
        row = ("t-dup", "", "cp-1", None, None, "msgpack", b"\x80", "msgpack", b"\x80", None)
        insert = saver.sql.UPSERT_CHECKPOINT.split(" ON CONFLICT")[0]  # a plain insert

        def op() -> Any:
            yield Query(insert, row)
            yield OnCommit(lambda: committed.append("callback"))

        return op

    if asynchronous:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as aconn:
            asaver = AsyncPostgresSaver(aconn)
            await asaver.setup()
            await asaver.arun_op(duplicate(asaver), write=True)  # the row, once
            async with aconn.pipeline():
                with pytest.raises(psycopg.errors.UniqueViolation):
                    await asaver.arun_op(duplicate(asaver), write=True)
            assert aconn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    else:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            saver = PostgresSaver(conn)
            saver.setup()
            saver.run_op(duplicate(saver), write=True)
            with conn.pipeline():
                with pytest.raises(psycopg.errors.UniqueViolation):
                    saver.run_op(duplicate(saver), write=True)
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert committed == ["callback"]


def test_a_filtered_list_keeps_its_generic_plan_on_postgres(pg_url: str) -> None:
    """A filtered list asked again and again is planned once per connection, not at each
    call (its planning cost more than running it). PostgreSQL keeps a prepared
    statement's generic plan only if it looks no costlier than the plans made for the
    values given; a LIMIT it could not see made it re-plan every time."""
    from agentcheck.savers import PostgresSaver

    # Every statement prepared at once (as LangGraph's docs advise): the server counts
    # each prepared statement's generic and custom plans.
    with psycopg.connect(pg_url, autocommit=True, prepare_threshold=0) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        for i in range(60):
            metadata: Any = {"source": "loop", "step": i, "user": f"u-{i % 3}"}
            config: Any = {"configurable": {"thread_id": f"t-{i % 4}", "checkpoint_ns": ""}}
            saver.put(config, generate_checkpoint(), metadata, {})
        # The index of a database in use: many more terms, of other checkpoints.
        conn.execute(
            "INSERT INTO agentcheck_metadata_terms (thread_id, checkpoint_ns, checkpoint_id, term) "
            "SELECT 'other-' || (g % 1000), '', 'cp-' || g, '[\"step\"]=' || (g % 500) "
            "FROM generate_series(1, 100000) AS g"
        )
        conn.execute("ANALYZE")
        for _ in range(12):
            found = list(saver.list(None, filter={"user": "u-1", "step": 4}, limit=5))
            assert [t.metadata["step"] for t in found] == [4]
            assert len(list(saver.list(None, filter={"user": "u-2"}, limit=5))) == 5
        plans = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%' || 'agentcheck_metadata_terms' || ' t0%'"
        ).fetchall()
    assert len(plans) == 2, plans  # the two filters' statements
    # At most the 5 custom plans PostgreSQL makes before it compares; the rest generic.
    assert all(custom <= 5 and generic >= 7 for generic, custom in plans), plans


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_write_joins_a_transaction_the_caller_began_in_its_own_pipeline(
    pg_url: str, asynchronous: bool
) -> None:
    """A BEGIN the caller has queued in its pipeline is a transaction of the caller's: the
    saver's write joins it (a savepoint), and the caller's ROLLBACK takes it back. While
    queued, the connection reads ACTIVE, not in a transaction: the saver syncs first."""
    from agentcheck.savers import AsyncPostgresSaver, PostgresSaver

    config: Any = {"configurable": {"thread_id": "t-pipe", "checkpoint_ns": ""}}
    # A graph's last checkpoint: its run ends in the journal, so the put is several
    # statements, framed by BEGIN and COMMIT unless a transaction is open.
    meta: Any = {"source": "loop", "step": 3}
    if asynchronous:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as aconn:
            asaver = AsyncPostgresSaver(aconn)
            await asaver.setup()
            async with aconn.pipeline():
                await aconn.execute("BEGIN")
                await asaver.aput(config, generate_checkpoint(), meta, {})
                await aconn.execute("ROLLBACK")
            assert await asaver.aget_tuple(config) is None
            await asaver.aput(config, generate_checkpoint(), meta, {})  # and it goes on
            assert await asaver.aget_tuple(config) is not None
    else:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            saver = PostgresSaver(conn)
            saver.setup()
            with conn.pipeline():
                conn.execute("BEGIN")
                saver.put(config, generate_checkpoint(), meta, {})
                conn.execute("ROLLBACK")
            assert saver.get_tuple(config) is None
            saver.put(config, generate_checkpoint(), meta, {})
            assert saver.get_tuple(config) is not None
