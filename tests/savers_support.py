"""Opening each of the four savers the same way, for the parametrized suites.

``KINDS`` names them; :func:`open_saver` yields a ready saver of a kind on a real SQLite
file or a real PostgreSQL database. Sync savers are meant to be driven through their
sync API; :class:`SyncDriven` lets async harnesses (the conformance suite) do exactly that.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Any, TypedDict
from unittest.mock import patch

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from agentcheck import serde
from agentcheck.savers import AsyncPostgresSaver, AsyncSqliteSaver, PostgresSaver, SqliteSaver

KINDS = ("sqlite", "async_sqlite", "postgres", "async_postgres")
SYNC_KINDS = ("sqlite", "postgres")
ASYNC_KINDS = ("async_sqlite", "async_postgres")


def is_async(kind: str) -> bool:
    return kind.startswith("async_")


def is_postgres(kind: str) -> bool:
    return kind.endswith("postgres")


@asynccontextmanager
async def open_saver(
    kind: str, *, sqlite_path: str, pg_url: str, **kwargs: Any
) -> AsyncIterator[Any]:
    """A set-up saver of ``kind``; sync ones are opened with their sync context manager."""
    if kind == "sqlite":
        with SqliteSaver.from_conn_string(sqlite_path, **kwargs) as saver:
            saver.setup()
            yield saver
    elif kind == "postgres":
        with PostgresSaver.from_conn_string(pg_url, **kwargs) as saver:
            saver.setup()
            yield saver
    elif kind == "async_sqlite":
        async with AsyncSqliteSaver.from_conn_string(sqlite_path, **kwargs) as saver:
            await saver.setup()
            yield saver
    elif kind == "async_postgres":
        async with AsyncPostgresSaver.from_conn_string(pg_url, **kwargs) as saver:
            await saver.setup()
            yield saver
    else:  # pragma: no cover
        raise ValueError(kind)


class SyncDriven(BaseCheckpointSaver[str]):
    """Exposes a sync saver's *sync* methods under the async names the conformance
    suite calls, so the sync code path is what gets tested."""

    def __init__(self, inner: BaseCheckpointSaver[str]) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    async def aget_tuple(self, config: Any) -> Any:
        return self.inner.get_tuple(config)

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[Any]:
        for item in self.inner.list(config, **kwargs):
            yield item

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return self.inner.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        self.inner.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.inner.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.inner.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.inner.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.inner.prune(thread_ids, strategy=strategy)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)


async def call(obj: Any, method: str, kind: str, *args: Any, **kwargs: Any) -> Any:
    """``obj.method(...)`` for a sync kind, ``await obj.amethod(...)`` for an async one:
    graphs (``invoke``, ``get_state``...), savers and journals alike."""
    if is_async(kind):
        return await getattr(obj, "a" + method)(*args, **kwargs)
    return getattr(obj, method)(*args, **kwargs)


async def collect(obj: Any, method: str, kind: str, *args: Any, **kwargs: Any) -> list[Any]:
    """All items of an iterating method (``get_state_history``, ``list``), in the kind's style."""
    if is_async(kind):
        return [item async for item in getattr(obj, "a" + method)(*args, **kwargs)]
    return list(getattr(obj, method)(*args, **kwargs))


async def every_checkpoint(kind: str, saver: Any, thread_id: str) -> dict[str, Any]:
    """Each checkpoint of a thread read alone (get_tuple), by id: (values, writes)."""
    config = {"configurable": {"thread_id": thread_id}}
    ids = [
        t.config["configurable"]["checkpoint_id"]
        for t in await collect(saver, "list", kind, config)
    ]
    found = {}
    for checkpoint_id in ids:
        got = await checkpoint_at(saver, kind, thread_id, checkpoint_id)
        found[checkpoint_id] = (got.checkpoint["channel_values"], got.pending_writes)
    return found


async def checkpoint_at(saver: Any, kind: str, thread_id: str, checkpoint_id: str) -> Any:
    """The checkpoint tuple of ``checkpoint_id``, read alone (``get_tuple``)."""
    conf = {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
    got = await call(saver, "get_tuple", kind, {"configurable": conf})
    assert got is not None
    return got


def compressed(kind: str) -> str:
    """The type tag of a compressed msgpack value: zstd on PostgreSQL, zlib on SQLite."""
    return "msgpack#zs" if is_postgres(kind) else "msgpack#z"


@contextmanager
def recorded_revivals() -> Iterator[list[Any]]:
    """What the fast path of message revival returns from now on, a message or None for
    each stored message it was given (None: it declined, and validation built it)."""
    seen: list[Any] = []
    original = serde._revive_message

    def spy(row: Any) -> Any:
        seen.append(result := original(row))
        return result

    with patch.object(serde, "_revive_message", spy):
        yield seen


def raw_sql(
    kind: str, sqlite_path: str, pg_url: str, sql: str, params: tuple[Any, ...] = ()
) -> list[tuple[Any, ...]]:
    """Run one statement on a separate, plain connection (``?`` placeholders); commit."""
    if is_postgres(kind):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []
    conn = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


# -- a chat graph: one node answering each question ---------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turn: int


def chat_graph() -> StateGraph[Chat]:
    def reply(state: Chat) -> dict[str, Any]:
        n = state["turn"]
        return {"messages": [AIMessage(content=f"answer {n} " + "x" * 200, id=f"a{n}")]}

    builder: StateGraph[Chat] = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder


async def run_chat(
    graph: Any, kind: str, thread: str, end: int, *, start: int = 0, run_id: str | None = None
) -> None:
    """Turns ``start`` to ``end - 1`` of the chat, as one graph invocation each; with
    ``run_id``, turn n runs as run ``f"{run_id}-{n}"`` (kept in its checkpoints' metadata;
    LangGraph takes a repeated run id for a re-entry into the same run)."""
    for n in range(start, end):
        config: dict[str, Any] = {"configurable": {"thread_id": thread}}
        if run_id is not None:
            config["metadata"] = {"run_id": f"{run_id}-{n}"}
        question = HumanMessage(content=f"question {n}", id=f"q{n}")
        await call(graph, "invoke", kind, {"messages": [question], "turn": n}, config)


async def chat_turns(kind: str, saver: Any, thread_id: str, turns: int) -> list[Any]:
    """The chat graph run on ``saver`` for ``turns`` turns; the thread's messages."""
    graph = chat_graph().compile(checkpointer=saver)
    await run_chat(graph, kind, thread_id, turns)
    state = await call(graph, "get_state", kind, {"configurable": {"thread_id": thread_id}})
    return list(state.values["messages"])


@dataclasses.dataclass
class XorCipher:
    """A stand-in for pycryptodome's AES in LangGraph's EncryptedSerializer: reversible,
    not secret, under any cipher name."""

    name: str = "aes"

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return self.name, bytes(b ^ 0x5A for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == self.name
        return bytes(b ^ 0x5A for b in ciphertext)
