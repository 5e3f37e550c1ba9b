"""Safety of what the savers store and read back, on real SQLite files and PostgreSQL.

* values of types not on the msgpack allowlist are refused when written, and nothing
  of the refused checkpoint is stored;
* stored pickles, or msgpack naming an arbitrary callable, are never executed;
* one corrupt row is reported precisely and does not make other threads unreadable;
* hostile metadata keys and values are stored and filtered as plain data;
* with an encryption key, no secret is findable in the raw database files.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pickle
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import ormsgpack
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config
from langgraph.checkpoint.serde import jsonplus

import agentcheck
from agentcheck import CorruptDataError, KeyMismatchError, UnsafeTypeError, generate_key
from agentcheck.savers import PostgresSaver, SqliteSaver

from savers_support import (
    KINDS,
    XorCipher,
    chat_turns,
    compressed,
    every_checkpoint,
    is_async,
    is_postgres,
    open_saver,
    raw_sql,
)

TABLES = (
    "agentcheck_schema",
    "agentcheck_checkpoints",
    "agentcheck_blobs",
    "agentcheck_writes",
    "agentcheck_metadata_terms",
)
SQLITE_TABLES = (*TABLES, "agentcheck_pending_terms")  # see SQL.PENDING_TERMS


@pytest.fixture(autouse=True)
def _no_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # A key in the environment would silently encrypt the "unencrypted" savers.
    monkeypatch.delenv("AGENTCHECK_ENCRYPTION_KEY", raising=False)


# --------------------------------------------------------------------------- helpers


async def call(kind: str, saver: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """``saver.<method>`` through the sync API of sync savers, the async API of async ones."""
    if is_async(kind):
        return await getattr(saver, "a" + method)(*args, **kwargs)
    return getattr(saver, method)(*args, **kwargs)


async def list_all(kind: str, saver: Any, config: Any, **kwargs: Any) -> list[Any]:
    if is_async(kind):
        return [t async for t in saver.alist(config, **kwargs)]
    return list(saver.list(config, **kwargs))


def existing_tables(kind: str, sqlite_path: str, pg_url: str) -> set[str]:
    if is_postgres(kind):
        rows = raw_sql(
            kind,
            sqlite_path,
            pg_url,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'",
        )
    else:
        rows = raw_sql(kind, sqlite_path, pg_url, "SELECT name FROM sqlite_master")
    return {r[0] for r in rows}


def checkpoint_with(values: dict[str, Any], versions: dict[str, Any]) -> dict[str, Any]:
    return generate_checkpoint(channel_values=values, channel_versions=versions)


def child_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config to put the next checkpoint of a thread with (parent = ``config``)."""
    return {"configurable": dict(config["configurable"])}


# --------------------------------------------------------------------------- 1. unknown types


@dataclasses.dataclass
class Unlisted:
    """A user type that is not on the msgpack allowlist."""

    label: str
    count: int


class Mood(enum.Enum):
    CALM = "calm"
    GRUMPY = "grumpy"


UNLISTED_VALUES: dict[str, tuple[type, Callable[[], Any]]] = {
    "dataclass": (Unlisted, lambda: Unlisted(label="x", count=3)),
    "enum": (Mood, lambda: Mood.GRUMPY),
}


@pytest.mark.parametrize("value_kind", sorted(UNLISTED_VALUES))
@pytest.mark.parametrize("kind", KINDS)
async def test_unknown_type_fails_on_write_and_stores_nothing(
    kind: str, value_kind: str, sqlite_path: str, pg_url: str
) -> None:
    cls, make = UNLISTED_VALUES[value_kind]
    qualified = f"{cls.__module__}.{cls.__name__}"
    thread = f"unknown-{uuid.uuid4()}"
    fresh_thread = f"fresh-{uuid.uuid4()}"
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        first = checkpoint_with({"x": "fine"}, {"x": 1})
        first_cfg = await call(kind, saver, "put", generate_config(thread), first, {}, {"x": 1})

        bad = checkpoint_with({"x": make()}, {"x": 2})
        with pytest.raises(UnsafeTypeError) as excinfo:
            await call(kind, saver, "put", child_config(first_cfg), bad, {}, {"x": 2})
        message = str(excinfo.value)
        assert qualified in message
        assert "allowed_types" in message

        # The thread still ends at the first checkpoint; the refused one does not exist.
        latest = await call(kind, saver, "get_tuple", generate_config(thread))
        assert latest is not None
        assert latest.checkpoint["id"] == first["id"]
        assert latest.checkpoint["channel_values"] == {"x": "fine"}
        bad_cfg = generate_config(thread, checkpoint_id=bad["id"])
        assert await call(kind, saver, "get_tuple", bad_cfg) is None
        assert [
            t.checkpoint["id"] for t in await list_all(kind, saver, generate_config(thread))
        ] == [first["id"]]

        # A refused first checkpoint of a thread leaves the thread empty.
        with pytest.raises(UnsafeTypeError):
            await call(kind, saver, "put", generate_config(fresh_thread), bad, {}, {"x": 2})
        assert await call(kind, saver, "get_tuple", generate_config(fresh_thread)) is None

        # Pending writes are checked too, also when the value is nested.
        with pytest.raises(UnsafeTypeError) as excinfo:
            await call(kind, saver, "put_writes", first_cfg, [("w", {"deep": [make()]})], "task")
        assert qualified in str(excinfo.value)
        latest = await call(kind, saver, "get_tuple", generate_config(thread))
        assert latest is not None and latest.pending_writes == []

    stored = raw_sql(
        kind,
        sqlite_path,
        pg_url,
        "SELECT COUNT(*) FROM agentcheck_blobs WHERE thread_id IN (?, ?) AND version = ?",
        (thread, fresh_thread, "2"),
    )
    assert stored == [(0,)]
    stored = raw_sql(
        kind,
        sqlite_path,
        pg_url,
        "SELECT COUNT(*) FROM agentcheck_checkpoints WHERE thread_id IN (?, ?)",
        (thread, fresh_thread),
    )
    assert stored == [(1,)]
    stored = raw_sql(kind, sqlite_path, pg_url, "SELECT COUNT(*) FROM agentcheck_writes")
    assert stored == [(0,)]

    # Allowed explicitly, the same value round-trips.
    async with open_saver(
        kind, sqlite_path=sqlite_path, pg_url=pg_url, allowed_types=[cls]
    ) as allowing:
        value = make()
        good = checkpoint_with({"x": value}, {"x": 2})
        good_cfg = await call(kind, allowing, "put", child_config(first_cfg), good, {}, {"x": 2})
        await call(kind, allowing, "put_writes", good_cfg, [("w", {"deep": [make()]})], "task")
        got = await call(kind, allowing, "get_tuple", generate_config(thread))
        assert got is not None
        assert got.checkpoint["id"] == good["id"]
        assert type(got.checkpoint["channel_values"]["x"]) is cls
        assert got.checkpoint["channel_values"]["x"] == value
        assert got.pending_writes == [("task", "w", {"deep": [make()]})]


# --------------------------------------------------------------------------- 2. no code execution


class _CreatesFileWhenUnpickled:
    """Unpickling this opens (so creates) a file: a stand-in for arbitrary code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _malicious_pickle(marker: Path) -> bytes:
    return pickle.dumps(_CreatesFileWhenUnpickled(marker))


def test_malicious_pickle_payload_really_executes_when_unpickled(tmp_path: Path) -> None:
    """Control for the no-pickle tests: the payload does create its file if unpickled."""
    marker = tmp_path / "control-marker"
    pickle.loads(_malicious_pickle(marker)).close()
    assert marker.exists()


PICKLE_TARGETS = {
    "blob": "UPDATE agentcheck_blobs SET type = ?, blob = ? WHERE thread_id = ?",
    "write": "UPDATE agentcheck_writes SET type = ?, blob = ? WHERE thread_id = ?",
}


@pytest.mark.parametrize("target", sorted(PICKLE_TARGETS))
@pytest.mark.parametrize("kind", KINDS)
async def test_pickle_row_is_never_unpickled(
    kind: str, target: str, sqlite_path: str, pg_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / f"pwned-{kind}-{target}"
    thread = f"pickle-{uuid.uuid4()}"
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        # (a list: small plain values are kept inside the checkpoint row, not in blobs)
        cp = checkpoint_with({"x": ["harmless"]}, {"x": 1})
        cfg = await call(kind, saver, "put", generate_config(thread), cp, {}, {"x": 1})
        await call(kind, saver, "put_writes", cfg, [("w", "harmless")], "task")
        assert (await call(kind, saver, "get_tuple", cfg)) is not None

        raw_sql(
            kind,
            sqlite_path,
            pg_url,
            PICKLE_TARGETS[target],
            ("pickle", _malicious_pickle(marker), thread),
        )

        with pytest.raises(CorruptDataError) as excinfo:
            await call(kind, saver, "get_tuple", cfg)
        assert "pickle" in str(excinfo.value)
        with pytest.raises(CorruptDataError):
            await list_all(kind, saver, generate_config(thread))
    assert not marker.exists()


@pytest.mark.parametrize("kind", KINDS)
async def test_msgpack_naming_an_unlisted_callable_does_not_call_it(
    kind: str, sqlite_path: str, pg_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned-msgpack"
    # LangGraph's msgpack extension "call module.name(arg)", naming builtins.open.
    payload = ormsgpack.packb(
        ormsgpack.Ext(
            jsonplus.EXT_CONSTRUCTOR_POS_ARGS,
            ormsgpack.packb(("builtins", "open", [str(marker), "w"])),
        )
    )
    thread = f"msgpack-{uuid.uuid4()}"
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        # (a list: small plain values are kept inside the checkpoint row, not in blobs)
        cp = checkpoint_with({"x": ["harmless"]}, {"x": 1})
        cfg = await call(kind, saver, "put", generate_config(thread), cp, {}, {"x": 1})
        raw_sql(
            kind,
            sqlite_path,
            pg_url,
            PICKLE_TARGETS["blob"],
            ("msgpack", payload, thread),
        )
        try:
            got = await call(kind, saver, "get_tuple", cfg)
        except CorruptDataError:
            pass  # refusing the row outright is fine too
        else:
            assert got is not None
            assert not hasattr(got.checkpoint["channel_values"].get("x"), "write")
    assert not marker.exists()


# --------------------------------------------------------------------------- 3. corrupt data

GARBAGE = b"\xc1\xc1 this is not msgpack \xff\x00"

CORRUPT_TARGETS = {
    "checkpoint": "UPDATE agentcheck_checkpoints SET checkpoint = ? WHERE thread_id = ?",
    "metadata": "UPDATE agentcheck_checkpoints SET metadata = ? WHERE thread_id = ?",
    "blob": "UPDATE agentcheck_blobs SET blob = ? WHERE thread_id = ?",
    "write": "UPDATE agentcheck_writes SET blob = ? WHERE thread_id = ?",
}


# Bytes that decode, to something that is not a checkpoint's or metadata's mapping.
NOT_A_MAPPING = {
    "an int": b"\x05",
    "a list": b"\x91\x01",
    "versions not a mapping": ormsgpack.packb({"channel_versions": 5}),
}
CORRUPT_CASES = [(target, "garbage", GARBAGE) for target in sorted(CORRUPT_TARGETS)] + [
    (target, name, payload)
    for target in ("checkpoint", "metadata")
    for name, payload in NOT_A_MAPPING.items()
    if target == "checkpoint" or name != "versions not a mapping"
]


@pytest.mark.parametrize(
    ("target", "payload"),
    [pytest.param(t, p, id=f"{t}-{n}") for t, n, p in CORRUPT_CASES],
)
@pytest.mark.parametrize("kind", KINDS)
async def test_corrupt_row_raises_corrupt_data_error_and_other_threads_stay_readable(
    kind: str, target: str, payload: bytes, sqlite_path: str, pg_url: str
) -> None:
    """A row that cannot be read, or that decodes to what a checkpoint or its metadata
    cannot be (which raised AttributeError, naming nothing), is reported as corrupt, with
    its thread and checkpoint; the other threads read as before."""
    broken_thread = f"broken-{uuid.uuid4()}"
    healthy_thread = f"healthy-{uuid.uuid4()}"
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        configs = {}
        checkpoints = {}
        for thread in (broken_thread, healthy_thread):
            # (a list: small plain values are kept inside the checkpoint row, not in blobs)
            cp = checkpoint_with({"x": [f"value of {thread}"]}, {"x": 1})
            cfg = await call(
                kind, saver, "put", generate_config(thread), cp, {"owner": thread}, {"x": 1}
            )
            await call(kind, saver, "put_writes", cfg, [("w", f"write of {thread}")], "task")
            configs[thread], checkpoints[thread] = cfg, cp

        changed = raw_sql(
            kind,
            sqlite_path,
            pg_url,
            CORRUPT_TARGETS[target] + " RETURNING thread_id",
            (payload, broken_thread),
        )
        assert changed == [(broken_thread,)]

        with pytest.raises(CorruptDataError) as excinfo:
            await call(kind, saver, "get_tuple", generate_config(broken_thread))
        message = str(excinfo.value)
        assert broken_thread in message
        assert checkpoints[broken_thread]["id"] in message

        got = await call(kind, saver, "get_tuple", generate_config(healthy_thread))
        assert got is not None
        assert got.checkpoint["id"] == checkpoints[healthy_thread]["id"]
        assert got.checkpoint["channel_values"] == {"x": [f"value of {healthy_thread}"]}
        assert got.metadata["owner"] == healthy_thread
        assert got.pending_writes == [("task", "w", f"write of {healthy_thread}")]
        listed = await list_all(kind, saver, generate_config(healthy_thread))
        assert [t.checkpoint["id"] for t in listed] == [checkpoints[healthy_thread]["id"]]
        assert listed[0].checkpoint["channel_values"] == {"x": [f"value of {healthy_thread}"]}
        filtered = await list_all(kind, saver, None, filter={"owner": healthy_thread})
        assert [t.checkpoint["id"] for t in filtered] == [checkpoints[healthy_thread]["id"]]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_list_hands_out_the_checkpoints_newer_than_a_damaged_one_first(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """list(None) reads a page of 16 checkpoints and decoded it whole: a damaged one
    kept the newer ones of other threads in its page from coming out before its error
    (only those of earlier pages came out). They now all come out, newest first, then
    the error naming the damaged checkpoint."""
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        damaged = checkpoint_with({"x": ["old"]}, {"x": 1})
        await call(kind, saver, "put", generate_config("damaged"), damaged, {}, {"x": 1})
        for i in range(5):  # newer than the damaged one
            cp = checkpoint_with({"x": [i]}, {"x": 1})
            await call(kind, saver, "put", generate_config(f"healthy-{i}"), cp, {}, {"x": 1})
        raw_sql(
            kind, sqlite_path, pg_url,
            "UPDATE agentcheck_checkpoints SET checkpoint = ? WHERE thread_id = 'damaged'",
            (b"\xc1",),
        )  # fmt: skip
        seen: list[str] = []
        with pytest.raises(CorruptDataError, match=damaged["id"]):
            if is_async(kind):
                async for t in saver.alist(None):
                    seen.append(t.config["configurable"]["thread_id"])
            else:
                for t in saver.list(None):
                    seen.append(t.config["configurable"]["thread_id"])
        assert seen == [f"healthy-{i}" for i in reversed(range(5))]


@pytest.mark.parametrize("operation", ["prune", "delete_for_runs"])
@pytest.mark.parametrize("kind", KINDS)
async def test_prune_and_delete_for_runs_report_a_damaged_row_as_corrupt(
    kind: str, operation: str, sqlite_path: str, pg_url: str
) -> None:
    """prune(keep_latest) reads the newest checkpoint's metadata, delete_for_runs the
    checkpoints left (to keep the values they use): a row that decodes to something else
    than a mapping raised a bare AttributeError there. It is reported as corrupt, and
    nothing is deleted."""
    thread = f"t-{uuid.uuid4()}"
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        cfg = generate_config(thread)
        ids = []
        for run in ("r0", "r1", "r2"):
            cp = checkpoint_with({"x": [run]}, {"x": len(ids) + 1})
            cfg = await call(kind, saver, "put", cfg, cp, {"run_id": run}, {"x": len(ids) + 1})
            ids.append(cp["id"])
        if operation == "prune":
            target, args = ids[-1], ([thread],)
            damage = "UPDATE agentcheck_checkpoints SET metadata = ? WHERE checkpoint_id = ?"
        else:
            target, args = ids[0], (["r2"],)
            damage = "UPDATE agentcheck_checkpoints SET checkpoint = ? WHERE checkpoint_id = ?"
        raw_sql(kind, sqlite_path, pg_url, damage, (b"\x93\x01\x02\x03", target))
        with pytest.raises(CorruptDataError, match=target):
            await call(kind, saver, operation, *args)
        left = raw_sql(
            kind, sqlite_path, pg_url,
            "SELECT COUNT(*) FROM agentcheck_checkpoints WHERE thread_id = ?", (thread,),
        )  # fmt: skip
        assert left == [(3,)]


@pytest.mark.parametrize("kind", KINDS)
async def test_metadata_stored_as_json_comes_back_as_written_nothing_revived(
    kind: str, sqlite_path: str, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metadata holding text that is not valid Unicode is stored as JSON, and was read
    back through LangChain's reviver: a mapping shaped like a serialized LangChain
    object was built into one (a HumanMessage), a "secret" one read as None, and a
    "not_implemented" one made the checkpoint unreadable. Input a user controls can
    reach metadata; it now comes back as the plain JSON it was."""
    monkeypatch.setenv("AGENTCHECK_TEST_SECRET", "do not read me")
    envelopes = {
        "message": {
            "lc": 1, "type": "constructor", "kwargs": {"content": "hi"},
            "id": ["langchain", "schema", "messages", "HumanMessage"],
        },
        "secret": {"lc": 1, "type": "secret", "id": ["AGENTCHECK_TEST_SECRET"]},
        "odd": {"lc": 1, "type": "not_implemented", "id": ["x"], "repr": "r"},
    }  # fmt: skip
    metadata = {"name": "caf\udce9", **envelopes}  # a lone surrogate: stored as JSON
    thread = f"t-{uuid.uuid4()}"
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        cp = checkpoint_with({"x": ["a"]}, {"x": 1})
        await call(kind, saver, "put", generate_config(thread), cp, metadata, {"x": 1})
        stored = raw_sql(
            kind, sqlite_path, pg_url,
            "SELECT metadata_type FROM agentcheck_checkpoints WHERE thread_id = ?", (thread,),
        )  # fmt: skip
        assert stored == [("json",)]
        got = await call(kind, saver, "get_tuple", generate_config(thread))
        assert {k: got.metadata[k] for k in metadata} == metadata
        listed = await list_all(kind, saver, None, filter={"secret": envelopes["secret"]})
        assert [t.checkpoint["id"] for t in listed] == [cp["id"]]
        assert listed[0].metadata["message"] == envelopes["message"]


@pytest.mark.parametrize("damage", ["delta built on itself", "bases not a list"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_damaged_delta_chain_is_reported_as_corrupt(
    kind: str, damage: str, sqlite_path: str, pg_url: str
) -> None:
    """A list stored as deltas whose snapshot row is made a delta of itself raised a bare
    RecursionError from get_tuple and list; a checkpoint whose list of bases is not a
    list raised a bare TypeError from get_tuple and prune. Both are CorruptDataError
    naming the thread and checkpoint; the other thread still reads."""
    threads = {"broken": f"b-{uuid.uuid4()}", "healthy": f"h-{uuid.uuid4()}"}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        last: dict[str, Any] = {}
        for name, thread in threads.items():
            cfg: Any = generate_config(thread)
            items = [f"m{i}" for i in range(10)]
            version = None
            for step in range(3):  # a list of 10 and more, one item more each step
                items = [*items, f"new{step}"]
                version = saver.get_next_version(version, None)
                cp = checkpoint_with({"msgs": list(items)}, {"msgs": version})
                cfg = await call(kind, saver, "put", child_config(cfg), cp, {}, {"msgs": version})
            last[name] = (cfg, cp)
        types = raw_sql(
            kind, sqlite_path, pg_url,
            "SELECT type, version FROM agentcheck_blobs WHERE thread_id = ? ORDER BY version",
            (threads["broken"],),
        )  # fmt: skip
        assert [t for t, _ in types] == ["msgpack", "delta", "delta"]
        if damage == "delta built on itself":
            snapshot = types[0][1]
            row = ormsgpack.packb([snapshot, 0, "msgpack", ormsgpack.packb(["x"])])
            raw_sql(
                kind, sqlite_path, pg_url,
                "UPDATE agentcheck_blobs SET type = 'delta', blob = ? "
                "WHERE thread_id = ? AND version = ?", (row, threads["broken"], snapshot),
            )  # fmt: skip
            why = "built on itself"
        else:
            cfg, cp = last["broken"]
            rest = {k: v for k, v in cp.items() if k != "channel_values"}
            raw_sql(
                kind, sqlite_path, pg_url,
                "UPDATE agentcheck_checkpoints SET type = 'msgpack', checkpoint = ? "
                "WHERE thread_id = ?",
                (ormsgpack.packb({**rest, "_ac_bases": {"msgs": 5}}), threads["broken"]),
            )  # fmt: skip
            why = "not a list of versions"
        broken_cfg, broken_cp = last["broken"]
        pattern = rf"{broken_cp['id']}.*{threads['broken']}.*{why}"
        with pytest.raises(CorruptDataError, match=pattern):
            await call(kind, saver, "get_tuple", broken_cfg)
        with pytest.raises(CorruptDataError, match=pattern):
            await list_all(kind, saver, generate_config(threads["broken"]))
        if damage == "bases not a list":
            with pytest.raises(CorruptDataError, match=pattern):
                await call(kind, saver, "prune", [threads["broken"]])
        healthy_cfg, healthy_cp = last["healthy"]
        got = await call(kind, saver, "get_tuple", healthy_cfg)
        assert got.checkpoint["channel_values"] == healthy_cp["channel_values"]


@pytest.mark.timeout(120, method="thread")  # a regression hangs: end the run, not wait
@pytest.mark.parametrize("loop", ["own parent", "two checkpoints"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_parent_chain_that_loops_is_reported_not_walked_forever(
    kind: str, loop: str, sqlite_path: str, pg_url: str
) -> None:
    """A checkpoint put again with its own config is its own parent; a damaged parent
    id can make two checkpoints each other's. get_delta_channel_history's recursive
    query then never ended (on PostgreSQL it ran on in the server after the client
    died) and prune(keep_latest) looped forever for a graph with DeltaChannels. The
    history now reports the loop as corrupt, naming the thread; prune keeps what it
    walked."""
    thread = f"t-{uuid.uuid4()}"
    meta = {"counters_since_delta_snapshot": {"d": 1}}  # as LangGraph's DeltaChannel writes
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        first = checkpoint_with({"x": ["a"]}, {"x": 1})
        cfg = await call(kind, saver, "put", generate_config(thread), first, meta, {"x": 1})
        second = checkpoint_with({"x": ["b"]}, {"x": 2})
        cfg = await call(kind, saver, "put", child_config(cfg), second, meta, {"x": 2})
        if loop == "own parent":
            await call(kind, saver, "put", cfg, second, meta, {})
        else:
            raw_sql(
                kind, sqlite_path, pg_url,
                "UPDATE agentcheck_checkpoints SET parent_checkpoint_id = ? "
                "WHERE checkpoint_id = ?", (second["id"], first["id"]),
            )  # fmt: skip
        with pytest.raises(CorruptDataError, match=rf"{thread}.*comes back to checkpoint"):
            await call(kind, saver, "get_delta_channel_history", config=cfg, channels=["d"])
        await call(kind, saver, "prune", [thread])
        latest = await call(kind, saver, "get_tuple", generate_config(thread))
        assert latest.checkpoint["id"] == second["id"]
        assert latest.checkpoint["channel_values"] == {"x": ["b"]}


@pytest.mark.parametrize(
    ("operation", "args"),
    [
        ("prune", ("AB",)),
        ("prune", ("AB", "delete")),
        ("delete_for_runs", ("AB",)),
        ("prune", (b"AB",)),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
async def test_prune_and_delete_for_runs_refuse_a_single_string(
    kind: str, operation: str, args: tuple[Any, ...], sqlite_path: str, pg_url: str
) -> None:
    """A string is a sequence of one-character strings: prune("AB") pruned, and with
    strategy="delete" deleted, threads "A" and "B" and left "AB" alone (and
    delete_for_runs("AB") deleted the checkpoints of runs "A" and "B"). It is refused with
    a TypeError that says how to name one id, and nothing is touched."""
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        for thread in ("A", "B", "AB"):
            cfg = generate_config(thread)
            for step in range(2):
                cp = checkpoint_with({"x": [thread, step]}, {"x": step + 1})
                meta = {"run_id": thread[:1]}
                cfg = await call(kind, saver, "put", cfg, cp, meta, {"x": step + 1})
        positional, strategy = args[:1], args[1:]
        kwargs = {"strategy": strategy[0]} if strategy else {}
        with pytest.raises(TypeError, match=r"not a single (str|bytes) \(for one id, pass \["):
            await call(kind, saver, operation, *positional, **kwargs)
        for thread in ("A", "B", "AB"):
            listed = await list_all(kind, saver, generate_config(thread))
            assert len(listed) == 2, thread


def _bad_id_calls(bad: Any) -> list[tuple[str, tuple[Any, ...], dict[str, Any], str]]:
    """(method, args, kwargs, the argument the error must name) for an id ``bad``."""
    cp = checkpoint_with({"x": ["v"]}, {"x": 1})
    config = {"configurable": {"thread_id": bad, "checkpoint_ns": ""}}
    return [
        ("put", (config, cp, {}, {"x": 1}), {}, "thread_id"),
        ("get_tuple", (config,), {}, "thread_id"),
        ("delete_thread", (bad,), {}, "thread_id"),
        ("copy_thread", (bad, "bob"), {}, "source_thread_id"),
        ("copy_thread", ("alice", bad), {}, "target_thread_id"),
        ("prune", ([bad],), {}, "each of thread_ids"),
    ]


@pytest.mark.parametrize("bad", [None, b"alice", ["alice"], ("alice",), True], ids=repr)
@pytest.mark.parametrize("kind", KINDS)
async def test_an_id_that_is_no_text_is_refused_naming_the_argument(
    kind: str, bad: Any, sqlite_path: str, pg_url: str
) -> None:
    """Thread ids were made text with str(): put with thread_id=None stored under the
    thread "None" (shared by every such caller), delete_thread(["alice"]) and
    delete_thread(b"alice") deleted nothing and said nothing, copy_thread(None, ...)
    copied the thread "None". Each is now a TypeError naming the argument, and nothing
    is written or deleted; numbers and UUIDs are still stored as their text."""
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        alice = await call(
            kind, saver, "put", generate_config("alice"),
            checkpoint_with({"x": ["a"]}, {"x": 1}), {}, {"x": 1},
        )  # fmt: skip
        for method, args, kwargs, named in _bad_id_calls(bad):
            with pytest.raises(TypeError, match=rf"^{re.escape(named)} must be text"):
                await call(kind, saver, method, *args, **kwargs)
        if bad is not None:
            with pytest.raises(TypeError, match="^thread_id must be text"):
                await list_all(kind, saver, {"configurable": {"thread_id": bad}})
        threads = raw_sql(
            kind, sqlite_path, pg_url, "SELECT DISTINCT thread_id FROM agentcheck_checkpoints"
        )
        assert threads == [("alice",)]
        assert (await call(kind, saver, "get_tuple", alice)).checkpoint["channel_values"] == {
            "x": ["a"]
        }
        for thread_id in (7, uuid.UUID(int=7)):
            cfg = generate_config(thread_id)
            await call(kind, saver, "put", cfg, checkpoint_with({"x": [1]}, {"x": 1}), {}, {"x": 1})
            got = await call(kind, saver, "get_tuple", generate_config(str(thread_id)))
            assert got.config["configurable"]["thread_id"] == str(thread_id)


def _bad_argument_calls() -> list[tuple[str, tuple[Any, ...], dict[str, Any], Any, str]]:
    """(method, args, kwargs, error type, message) of calls with bad arguments."""
    t = generate_config("t")
    cp = checkpoint_with({"x": ["v"]}, {"x": 1})
    return [
        ("get_tuple", (None,), {}, TypeError, "get_tuple's config must be"),
        ("get_tuple", ("t",), {}, TypeError, "get_tuple's config must be"),
        ("get_tuple", ({"configurable": {}},), {}, ValueError, "names no thread"),
        ("get_tuple", ({"configurable": {"thread_id": "t", "checkpoint_id": 5}},), {},
         TypeError, "checkpoint_id must be text"),
        ("put", (t, cp, None, {}), {}, TypeError, "put's metadata must be"),
        ("put", (t, {}, {}, {}), {}, TypeError, "put's checkpoint must be"),
        ("put_writes", (t, [("a", 1)], "task"), {}, ValueError,
         "names no checkpoint"),
        ("prune", (None,), {}, TypeError, "thread_ids must be a list of ids"),
    ]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
async def test_bad_arguments_get_an_error_that_names_them(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """Arguments of the wrong type failed deep inside (AttributeError: 'NoneType' object
    has no attribute 'get', KeyError: 'id', a PostgreSQL operator error for an int
    checkpoint id, which SQLite answered with None). Each is now refused up front with
    an error naming the argument."""
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        for method, args, kwargs, error, message in _bad_argument_calls():
            with pytest.raises(error, match=re.escape(message)):
                await call(kind, saver, method, *args, **kwargs)
        t = generate_config("t")
        for kwargs, message in (
            ({"filter": "x"}, "list's filter must be a dict"),
            ({"before": "x"}, "list's before must be a config"),
            ({"limit": "2"}, "list's limit must be a whole number"),
            ({"limit": 1.5}, "list's limit must be a whole number"),
        ):
            with pytest.raises(TypeError, match=re.escape(message)):
                await list_all(kind, saver, t, **kwargs)


# --------------------------------------------------------------------------- 4. hostile metadata

HOSTILE_STRINGS = [
    "'; DROP TABLE agentcheck_checkpoints; --",
    "'); DELETE FROM agentcheck_metadata_terms; --",
    "' OR '1'='1",
    '" OR ""="',
    "'",
    "''",
    '"',
    "\\",
    "\\'",
    "?",
    "??",
    "%s",
    "%(name)s",
    "%%",
    "%",
    "_",
    "*",
    "$1",
    "$$",
    "--",
    "/*",
    "*/",
    ";",
    ":name",
    "@p1",
    "{}",
    "[]",
    "null",
    "=",
    '["x"]=1',
    '"]=',
    "\u202e\u200b\ufeff",
    "\U0001f4a5\U0001f600",
    "\u00e9t\u00e9 \u4e2d\u6587 \u05e2\u05d1\u05e8\u05d9\u05ea",
    "\u2028\u2029\r\n\t",
    "\x01\x1f\x7f",
    "",
]

# Keys LangGraph gives a meaning to (or drops) when storing metadata.
_RESERVED_KEYS = {"writes", "thread_id", "checkpoint_ns", "checkpoint_id"}

_plain_text = st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=40)
_long_text = st.one_of(
    # incompressible: what a long prompt or document id looks like to the database
    st.binary(min_size=1000, max_size=3000).map(bytes.hex),
    st.builds(lambda s, n: s * n, st.sampled_from(HOSTILE_STRINGS[:10]), st.integers(200, 800)),
)
hostile_text = st.one_of(st.sampled_from(HOSTILE_STRINGS), _plain_text, _long_text)
hostile_keys = st.one_of(st.sampled_from(HOSTILE_STRINGS), _plain_text).filter(
    lambda k: k not in _RESERVED_KEYS
)
_leaves = st.one_of(
    hostile_text,
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
)
hostile_values = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.dictionaries(hostile_keys, children, max_size=3),
        st.lists(children, max_size=3),
    ),
    max_leaves=6,
)


def contains(stored: Any, wanted: Any) -> bool:
    """Whether metadata value ``stored`` matches filter value ``wanted`` (containment for
    non-empty mappings, equality otherwise)."""
    if isinstance(wanted, Mapping) and wanted:
        return isinstance(stored, Mapping) and all(
            k in stored and contains(stored[k], v) for k, v in wanted.items()
        )
    return bool(stored == wanted)


def check_hostile_metadata(saver: Any, key: str, value: Any) -> None:
    thread = f"hostile-{uuid.uuid4()}"
    sentinel = f"sentinel-{uuid.uuid4()}"
    other_key = f"other:{key}"
    matching = checkpoint_with({}, {})
    cfg = saver.put(generate_config(thread), matching, {key: value}, {})
    wrong_value = checkpoint_with({}, {})
    cfg = saver.put(child_config(cfg), wrong_value, {key: sentinel}, {})
    wrong_key = checkpoint_with({}, {})
    saver.put(child_config(cfg), wrong_key, {other_key: value}, {})

    found = list(saver.list(generate_config(thread), filter={key: value}))
    assert [t.checkpoint["id"] for t in found] == [matching["id"]]
    assert found[0].metadata[key] == value

    everywhere = list(saver.list(None, filter={key: value}))
    assert matching["id"] in {t.checkpoint["id"] for t in everywhere}
    assert all(contains(t.metadata.get(key), value) for t in everywhere)

    assert [t.checkpoint["id"] for t in saver.list(generate_config(thread))] == [
        wrong_key["id"],
        wrong_value["id"],
        matching["id"],
    ]


def run_hostile_metadata(saver: Any) -> None:
    @settings(max_examples=50, deadline=None)
    @given(key=hostile_keys, value=hostile_values)
    def check(key: str, value: Any) -> None:
        check_hostile_metadata(saver, key, value)

    check()


def test_hostile_metadata_is_stored_and_filtered_as_data_sqlite(sqlite_path: str) -> None:
    with SqliteSaver.from_conn_string(sqlite_path) as saver:
        saver.setup()
        run_hostile_metadata(saver)
        assert set(SQLITE_TABLES) <= existing_tables("sqlite", sqlite_path, "")
        cfg = saver.put(generate_config("after"), checkpoint_with({}, {}), {"k": "v"}, {})
        assert saver.get_tuple(cfg) is not None


def test_hostile_metadata_is_stored_and_filtered_as_data_postgres(pg_url: str) -> None:
    with PostgresSaver.from_conn_string(pg_url) as saver:
        saver.setup()
        run_hostile_metadata(saver)
        assert set(TABLES) <= existing_tables("postgres", "", pg_url)
        cfg = saver.put(generate_config("after"), checkpoint_with({}, {}), {"k": "v"}, {})
        assert saver.get_tuple(cfg) is not None


@pytest.mark.parametrize("kind", KINDS)
async def test_long_incompressible_metadata_value_is_stored_and_filterable(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """A metadata value of a few KB (a prompt, a document) must not break put or filters."""
    value = os.urandom(2000).hex()  # 4000 characters that do not compress
    thread = f"long-{uuid.uuid4()}"
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        cp = checkpoint_with({}, {})
        await call(kind, saver, "put", generate_config(thread), cp, {"prompt": value}, {})
        found = await list_all(kind, saver, None, filter={"prompt": value})
        assert [t.checkpoint["id"] for t in found] == [cp["id"]]
        assert found[0].metadata["prompt"] == value


# --------------------------------------------------------------------------- 5. encryption at rest


@dataclasses.dataclass
class Secrets:
    channel: str
    inline: str
    big: str
    write: str
    meta: str
    run_id: str

    @classmethod
    def new(cls) -> Secrets:
        tag = uuid.uuid4().hex
        return cls(
            channel=f"SECRET-CHANNEL-{tag}-{uuid.uuid4().hex}",
            inline=f"SECRET-INLINE-{tag}-{uuid.uuid4().hex}",
            big=f"SECRET-BIG-{tag}-{uuid.uuid4().hex}",
            write=f"SECRET-WRITE-{tag}-{uuid.uuid4().hex}",
            meta=f"SECRET-META-{tag}-{uuid.uuid4().hex}",
            run_id=f"SECRET-RUN-{tag}-{uuid.uuid4().hex}",
        )

    def all(self) -> dict[str, bytes]:
        return {name: value.encode() for name, value in dataclasses.asdict(self).items()}


def big_value(secret: str) -> str:
    # > 64 KiB, so it is compressed on PostgreSQL when encrypting; random hex so that
    # PostgreSQL's own TOAST compression leaves it (and its secret) readable in the
    # unencrypted control.
    return secret + " " + os.urandom(40_000).hex()


async def store_secrets(kind: str, saver: Any, thread: str, secrets: Secrets) -> dict[str, Any]:
    big = big_value(secrets.big)
    # "notes" is stored in a row of its own, "flag" (a short string) inside the
    # checkpoint's row, "big" in a row of its own, compressed.
    values = {"notes": [secrets.channel], "flag": secrets.inline, "big": big}
    cp = checkpoint_with(values, {"notes": 1, "flag": 1, "big": 1})
    metadata = {"source": "input", "step": 1, "secret": secrets.meta, "run_id": secrets.run_id}
    cfg = await call(
        kind, saver, "put", generate_config(thread), cp, metadata, {"notes": 1, "flag": 1, "big": 1}
    )
    await call(kind, saver, "put_writes", cfg, [("notes", secrets.write)], "task-1")
    return {"config": cfg, "checkpoint": cp, "big": big}


async def check_secrets_read_back(
    kind: str, saver: Any, thread: str, secrets: Secrets, stored: dict[str, Any]
) -> None:
    got = await call(kind, saver, "get_tuple", generate_config(thread))
    assert got is not None
    assert got.checkpoint["id"] == stored["checkpoint"]["id"]
    assert got.checkpoint["channel_values"] == {
        "notes": [secrets.channel],
        "flag": secrets.inline,
        "big": stored["big"],
    }
    assert got.pending_writes == [("task-1", "notes", secrets.write)]
    assert got.metadata["secret"] == secrets.meta
    assert got.metadata["run_id"] == secrets.run_id
    by_secret = await list_all(kind, saver, None, filter={"secret": secrets.meta})
    assert [t.checkpoint["id"] for t in by_secret] == [stored["checkpoint"]["id"]]
    by_run = await list_all(kind, saver, None, filter={"run_id": secrets.run_id})
    assert [t.checkpoint["id"] for t in by_run] == [stored["checkpoint"]["id"]]
    assert await list_all(kind, saver, None, filter={"secret": secrets.meta + "x"}) == []


def _files_under(root: Path) -> Iterator[Path]:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            yield Path(dirpath) / name


def secrets_found_on_disk(
    kind: str, sqlite_path: str, pg_url: str, pg_server: Any, secrets: Secrets
) -> set[str]:
    """Names of the secrets that occur verbatim in the database's files."""
    if is_postgres(kind):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        files = list(_files_under(pg_server.data_dir))
    else:
        files = [Path(sqlite_path + suffix) for suffix in ("", "-wal")]
    wanted = secrets.all()
    found: set[str] = set()
    for path in files:
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue  # a temporary file that went away, or no -wal after a clean close
        found.update(name for name, secret in wanted.items() if secret in data)
    return found


@pytest.mark.parametrize("kind", KINDS)
async def test_encrypted_secrets_are_not_in_the_raw_database(
    kind: str, sqlite_path: str, pg_url: str, pg_server: Any
) -> None:
    secrets = Secrets.new()
    thread = f"encrypted-{uuid.uuid4()}"
    key = generate_key()
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, encryption_key=key) as s:
        stored = await store_secrets(kind, s, thread, secrets)
        await check_secrets_read_back(kind, s, thread, secrets, stored)

    # Every stored payload is encrypted; the large value compressed first (large
    # checkpoint rows, compressed otherwise, are not when encrypting).
    def of_thread(sql: str) -> list[Any]:
        return raw_sql(kind, sqlite_path, pg_url, sql + " WHERE thread_id = ?", (thread,))

    types = of_thread("SELECT type, metadata_type FROM agentcheck_checkpoints")
    assert types == [("msgpack#aesgcm", "msgpack#aesgcm")]
    blob_types = of_thread("SELECT channel, type FROM agentcheck_blobs")
    # (Compressed on PostgreSQL; SQLite compresses values from 1 MiB up only.)
    big_type = compressed(kind) if is_postgres(kind) else "msgpack"
    assert dict(blob_types) == {"notes": "msgpack#aesgcm", "big": big_type + "#aesgcm"}
    write_types = of_thread("SELECT type FROM agentcheck_writes")
    assert write_types == [("msgpack#aesgcm",)]
    terms = of_thread("SELECT term FROM agentcheck_metadata_terms")
    assert terms and all(t.startswith("h:") for (t,) in terms)

    assert secrets_found_on_disk(kind, sqlite_path, pg_url, pg_server, secrets) == set()


@pytest.mark.parametrize("kind", KINDS)
async def test_unencrypted_secrets_are_in_the_raw_database_control(
    kind: str, sqlite_path: str, pg_url: str, pg_server: Any
) -> None:
    """Control for the test above: the same scan does find the secrets when unencrypted."""
    secrets = Secrets.new()
    thread = f"plain-{uuid.uuid4()}"
    async with open_saver(
        kind, sqlite_path=sqlite_path, pg_url=pg_url, compress_threshold=10**9
    ) as saver:
        stored = await store_secrets(kind, saver, thread, secrets)
        await check_secrets_read_back(kind, saver, thread, secrets, stored)
    # All of them, "inline" too: it is inside the checkpoint's row, which is too small
    # to be compressed (the test above checks that this row is encrypted).
    assert secrets_found_on_disk(kind, sqlite_path, pg_url, pg_server, secrets) == set(
        secrets.all()
    )


@pytest.mark.parametrize("reader_key", ["wrong_key", "no_key"])
@pytest.mark.parametrize("kind", KINDS)
async def test_reading_encrypted_rows_without_the_right_key_raises(
    kind: str, reader_key: str, sqlite_path: str, pg_url: str
) -> None:
    secrets = Secrets.new()
    thread = f"encrypted-{uuid.uuid4()}"
    async with open_saver(
        kind, sqlite_path=sqlite_path, pg_url=pg_url, encryption_key=generate_key()
    ) as saver:
        stored = await store_secrets(kind, saver, thread, secrets)

    kwargs = {"encryption_key": generate_key()} if reader_key == "wrong_key" else {}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, **kwargs) as reader:
        with pytest.raises(CorruptDataError) as excinfo:
            await call(kind, reader, "get_tuple", generate_config(thread))
        message = str(excinfo.value)
        assert thread in message
        assert stored["checkpoint"]["id"] in message
        assert "encryption_key" in message
        with pytest.raises(CorruptDataError):
            await call(kind, reader, "get_tuple", stored["config"])
        # Filters are keyed too: with another key (or none) they would match nothing,
        # and say so instead.
        with pytest.raises(KeyMismatchError, match="written with"):
            await list_all(kind, reader, None, filter={"secret": secrets.meta})


async def _put_runs(kind: str, saver: Any, thread: str) -> None:
    """Two checkpoints of runs r1 and r2, with LangGraph-like metadata."""
    cfg = generate_config(thread)
    for step, run in enumerate(("r1", "r2")):
        cp = checkpoint_with({"x": [run]}, {"x": step + 1})
        meta = {"source": "loop", "step": step, "user": "ann", "run_id": run}
        cfg = await call(kind, saver, "put", cfg, cp, meta, {"x": step + 1})


async def _anns(kind: str, saver: Any) -> list[Any]:
    """The checkpoints a metadata filter on user "ann" finds (those of _put_runs)."""
    return await list_all(kind, saver, None, filter={"user": "ann"})


@pytest.mark.parametrize("written", ["plain", "keyed"])
@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "older-database"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_saver_whose_key_differs_from_the_index_says_so(
    kind: str, written: str, recorded: bool, sqlite_path: str, pg_url: str
) -> None:
    """Index terms (and run ids) are stored plain, or as keyed hashes when encrypting. A
    saver given a key on a database written without one (AGENTCHECK_ENCRYPTION_KEY set
    later), or none on an encrypted one, found nothing in filters and delete_for_runs
    deleted nothing, without a word, and its puts mixed the two forms in the index. The
    form is recorded (or, for a database written before it was, worked out from the
    terms); such a saver now raises KeyMismatchError there, and deletes nothing. Reads
    of rows it can decode still work, and a saver of the right form is left alone."""
    key = generate_key()
    thread = f"t-{uuid.uuid4()}"
    first = {"encryption_key": key} if written == "keyed" else {}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, **first) as saver:
        await _put_runs(kind, saver, thread)
    if not recorded:  # as a database from before the form was recorded
        raw_sql(kind, sqlite_path, pg_url, "DELETE FROM agentcheck_settings")
    other = {} if written == "keyed" else {"encryption_key": generate_key()}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, **other) as wrong:
        if written == "plain":  # a key reads plain rows
            found = await call(kind, wrong, "get_tuple", generate_config(thread))
            assert found is not None and found.metadata["user"] == "ann"
        with pytest.raises(KeyMismatchError, match="metadata filter would miss"):
            await _anns(kind, wrong)
        with pytest.raises(KeyMismatchError, match="delete_for_runs would find no"):
            await call(kind, wrong, "delete_for_runs", ["r1"])
        with pytest.raises(KeyMismatchError, match="a put would add terms"):
            await _put_runs(kind, wrong, f"t-{uuid.uuid4()}")
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, **first) as right:
        assert len(await _anns(kind, right)) == 2
        await call(kind, right, "delete_for_runs", ["r1"])
        assert len(await _anns(kind, right)) == 1


def _settings(kind: str, sqlite_path: str, pg_url: str) -> list[tuple[Any, ...]]:
    return raw_sql(kind, sqlite_path, pg_url, "SELECT name FROM agentcheck_settings")


@pytest.mark.parametrize("kind", KINDS)
async def test_another_key_on_an_older_encrypted_database_is_refused_not_recorded(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """On an encrypted database written before the index form was recorded, a saver
    with another key went on unchecked, and once its own puts had stored terms of its
    key it recorded that key: the right key was then refused. A saver now judges keyed
    terms by decoding the metadata of a checkpoint they belong to: another key's saver is
    refused, records nothing, and the right key's saver records its own on its first put."""
    key = generate_key()
    thread = f"t-{uuid.uuid4()}"
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, encryption_key=key) as s:
        await _put_runs(kind, s, thread)
    raw_sql(kind, sqlite_path, pg_url, "DELETE FROM agentcheck_settings")
    for other in ({"encryption_key": generate_key()}, {}):
        async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, **other) as wrong:
            with pytest.raises(KeyMismatchError, match="metadata filter would miss"):
                await _anns(kind, wrong)
            with pytest.raises(KeyMismatchError, match="a put would add terms"):
                await _put_runs(kind, wrong, f"t-{uuid.uuid4()}")
        assert _settings(kind, sqlite_path, pg_url) == []
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, encryption_key=key) as s:
        assert len(await _anns(kind, s)) == 2
        await _put_runs(kind, s, f"t-{uuid.uuid4()}")
    assert _settings(kind, sqlite_path, pg_url) == [("index_terms",)]
    async with open_saver(
        kind, sqlite_path=sqlite_path, pg_url=pg_url, encryption_key=generate_key()
    ) as wrong:
        with pytest.raises(KeyMismatchError):
            await _anns(kind, wrong)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_look_at_an_empty_database_does_not_decide_its_key(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """The form was recorded by whichever saver set the database up first, written to
    or not: a glance at the journal (agentcheck.connect), or a deploy script run without
    the key, made an empty database plain, and the encrypted app could not write at all.
    It is recorded by the first put, in the form of the saver making it."""
    url = pg_url if is_postgres(kind) else sqlite_path
    with agentcheck.connect(url) as journal:
        assert journal.runs() == []
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as keyless:
        assert await _anns(kind, keyless) == []
    assert _settings(kind, sqlite_path, pg_url) == []
    key = generate_key()
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, encryption_key=key) as s:
        await _put_runs(kind, s, f"t-{uuid.uuid4()}")
        assert len(await _anns(kind, s)) == 2
    assert _settings(kind, sqlite_path, pg_url) == [("index_terms",)]
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as keyless:
        with pytest.raises(KeyMismatchError, match="and this saver has none"):
            await _anns(kind, keyless)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_first_put_rolled_back_leaves_the_index_form_to_be_looked_at_again(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """A keyed saver's first put, refused (an unlisted type) and rolled back with the
    form it recorded, left the saver believing the form settled: a plain saver then
    recorded "plain", and the keyed saver's later puts mixed keyed terms into the index
    without a word. What a put learns of the form is kept only once it has committed."""
    db = {"sqlite_path": sqlite_path, "pg_url": pg_url}
    async with open_saver(kind, **db, encryption_key=generate_key()) as keyed:
        bad = checkpoint_with({"x": Unlisted(label="x", count=1)}, {"x": 1})
        with pytest.raises(UnsafeTypeError):
            await call(kind, keyed, "put", generate_config("t1"), bad, {"user": "ann"}, {"x": 1})
        assert _settings(kind, sqlite_path, pg_url) == []
        async with open_saver(kind, **db) as plain:
            await _put_runs(kind, plain, "t2")
        with pytest.raises(KeyMismatchError, match="without an encryption key"):
            await _put_runs(kind, keyed, "t3")
        with pytest.raises(KeyMismatchError):
            await _anns(kind, keyed)


@pytest.mark.parametrize("kind", KINDS)
async def test_one_damaged_row_does_not_make_the_right_key_look_like_another(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """On an encrypted database written before the form was recorded, the form was
    judged from one checkpoint's metadata: if that row was damaged, the right key was
    taken for another, and refused for good. A few checkpoints are looked at."""
    key = generate_key()
    db = {"sqlite_path": sqlite_path, "pg_url": pg_url}
    async with open_saver(kind, **db, encryption_key=key) as saver:
        for thread in ("t0", "t1", "t2"):
            await _put_runs(kind, saver, thread)
    raw_sql(kind, sqlite_path, pg_url, "DELETE FROM agentcheck_settings")
    damage = "UPDATE agentcheck_checkpoints SET metadata = ? WHERE thread_id = 't0'"
    raw_sql(kind, sqlite_path, pg_url, damage, (b"\x00",))
    async with open_saver(kind, **db, encryption_key=key) as right:
        found = await list_all(kind, right, generate_config("t1"), filter={"user": "ann"})
        assert len(found) == 2
        await _put_runs(kind, right, "t3")
    assert _settings(kind, sqlite_path, pg_url) == [("index_terms",)]


@pytest.mark.parametrize("kind", KINDS)
async def test_plain_rows_from_before_the_key_do_not_vouch_for_a_wrong_key(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """A database written plain, then with key A, before the index form was recorded:
    the form was judged from any checkpoints' metadata, and a plain row decodes with any
    key, so a saver with key B passed, found nothing in its filters, and recorded B (A
    was then refused). Only checkpoints that have keyed terms are looked at."""
    db = {"sqlite_path": sqlite_path, "pg_url": pg_url}
    async with open_saver(kind, **db) as plain:  # checkpoints whose metadata has no terms
        for step in range(8):
            cp = checkpoint_with({"x": [step]}, {"x": step + 1})
            await call(kind, plain, "put", generate_config(f"old-{step}"), cp, {}, {"x": 1})
    raw_sql(kind, sqlite_path, pg_url, "DELETE FROM agentcheck_settings")
    key = generate_key()
    async with open_saver(kind, **db, encryption_key=key) as keyed:
        # As before the form was recorded, when nothing stopped A from writing there.
        record = "INSERT INTO agentcheck_settings (name, value) VALUES ('index_terms', ?)"
        raw_sql(kind, sqlite_path, pg_url, record, (keyed._index_form(),))
        await _put_runs(kind, keyed, "new")
    raw_sql(kind, sqlite_path, pg_url, "DELETE FROM agentcheck_settings")
    async with open_saver(kind, **db, encryption_key=generate_key()) as wrong:
        with pytest.raises(KeyMismatchError):
            await _anns(kind, wrong)
        with pytest.raises(KeyMismatchError):
            await _put_runs(kind, wrong, "other")
    assert _settings(kind, sqlite_path, pg_url) == []


class _OtherXor(XorCipher):
    """LangGraph's EncryptedSerializer cipher with another key: its rows do not decrypt."""

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        return bytes(b ^ 0x33 for b in ciphertext)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_serializer_that_cannot_read_the_metadata_is_not_taken_for_another_key(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """On a database written before the form was recorded, with agentcheck's key and
    LangGraph's EncryptedSerializer, a saver with the right key but a serializer of
    another key was told its encryption_key was another: any failure to load a sampled
    metadata row counted as another key. Only agentcheck's own decryption counts."""
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    key = generate_key()
    db = {"sqlite_path": sqlite_path, "pg_url": pg_url}
    serde = EncryptedSerializer(XorCipher())  # type: ignore[arg-type]
    async with open_saver(kind, **db, encryption_key=key, serde=serde) as saver:
        await _put_runs(kind, saver, "t1")
    raw_sql(kind, sqlite_path, pg_url, "DELETE FROM agentcheck_settings")
    other = EncryptedSerializer(_OtherXor())  # type: ignore[arg-type]
    async with open_saver(kind, **db, encryption_key=key, serde=other) as saver:
        with pytest.raises(CorruptDataError):
            await call(kind, saver, "get_tuple", generate_config("t1"))
        await _put_runs(kind, saver, "t2")  # the index's form is this saver's
    assert _settings(kind, sqlite_path, pg_url) == [("index_terms",)]


# "aes" is LangGraph's own AES; the others are named like agentcheck's codec steps.
@pytest.mark.parametrize("cipher", ["aes", "aesgcm", "z"])
@pytest.mark.parametrize("own_key", [False, True], ids=["their-cipher", "both"])
@pytest.mark.parametrize("kind", KINDS)
async def test_langgraphs_encrypted_serializer_works_as_with_the_official_savers(
    kind: str, own_key: bool, cipher: str, sqlite_path: str, pg_url: str
) -> None:
    """LangGraph's own encryption (``EncryptedSerializer``, whose rows are tagged
    ``msgpack+<cipher>``) given as ``serde`` round-trips, alone or under agentcheck's key,
    whatever its cipher is called: its tags are never taken for agentcheck's."""
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    serde = EncryptedSerializer(XorCipher(cipher))  # type: ignore[arg-type]
    extra: dict[str, Any] = {"encryption_key": generate_key()} if own_key else {}
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url, serde=serde, **extra) as s:
        messages = await chat_turns(kind, s, "encrypted-by-langgraph", 10)
    assert [m.content for m in messages][-2:] == ["question 9", "answer 9 " + "x" * 200]
    assert len(messages) == 20
    blobs = raw_sql(kind, sqlite_path, pg_url, "SELECT type FROM agentcheck_blobs")
    assert any(t.startswith("delta") for (t,) in blobs)  # tails serialized by their serde
    types = {t for (t,) in raw_sql(kind, sqlite_path, pg_url, "SELECT type FROM agentcheck_writes")}
    suffix = f"+{cipher}" + ("#aesgcm" if own_key else "")  # theirs, then ours
    assert types == {"msgpack" + suffix, "null" + suffix}  # "null": a None written


# What a checkpoint row's blob_keys may be made to hold: text that is not the keys' JSON
# (SQLite) or list (PostgreSQL), keys that name the wrong rows, none.
TAMPERED_KEYS = {
    "sqlite": [
        *("not json", '{"messages": 5}', "[1, 2]", "{}", '{"messages": ["nope"]}', None),
        *('{"messages": "x"}', '["x"]', '"a string"', '{"messages": ["x"], "notes": "z"}'),
        '{"messages": ["OTHER"]}',  # another stored version, not the checkpoint's own
    ],
    "postgres": [
        *("", "a", "a\x1fb\x1fc", "{{a,b},{c,d}}", "messages\x1fnope", None),
        "messages\x1fOTHER",
    ],
}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_checkpoint_values_read_back_whatever_their_blob_keys_hold(
    kind: str, sqlite_path: str, pg_url: str
) -> None:
    """A checkpoint row's ``blob_keys`` only spares a read a round trip: whatever it is
    changed to, each checkpoint reads back the same (the values it did not look up, or
    looked up under other keys, are looked up as they were before the column)."""
    async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
        await chat_turns(kind, saver, "chat", 10)
        before = await every_checkpoint(kind, saver, "chat")
    assert len(before) > 25
    [(other,)] = raw_sql(
        kind,
        sqlite_path,
        pg_url,
        "SELECT MIN(version) FROM agentcheck_blobs WHERE channel = 'messages'",
    )
    for keys in TAMPERED_KEYS[kind]:
        if keys is not None:
            keys = keys.replace("OTHER", other)
        raw_sql(
            kind, sqlite_path, pg_url, "UPDATE agentcheck_checkpoints SET blob_keys = ?", (keys,)
        )
        async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as fresh:
            assert await every_checkpoint(kind, fresh, "chat") == before, keys
