"""The savers' logic, free of I/O, shared by all four savers: encoding, put, put_writes
and the reads. (Deletion and retention: ``_retention.py``; list deltas: ``_deltas.py``;
metadata index terms: ``_terms.py``; the journal of graph runs: ``_runs.py``.)

Each public checkpoint operation is written once as an *operation*: a generator that
yields :class:`~agentcheck.backends.base.Query` objects and receives rows back (see
:mod:`agentcheck.backends.base`). The sync and async savers only drive them.

Storage layout (see docs/savers.md):

* ``agentcheck_checkpoints``: one row per checkpoint, holding the checkpoint *without*
  its channel values, and its metadata;
* ``agentcheck_blobs``: one row per (channel, version): a value is stored once however
  many checkpoints carry it;
* ``agentcheck_writes``: pending writes;
* ``agentcheck_metadata_terms``: one row per metadata (key path, value) for indexed filters;
* ``agentcheck_pending_terms`` (SQLite): the terms of recent checkpoints, one row each,
  until they are moved into the index (see SQL.PENDING_TERMS).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agentcheck._errors import CorruptDataError, KeyMismatchError
from agentcheck.backends.base import (
    SQL,
    OnCommit,
    Operation,
    Query,
    Rows,
    batch,
    id_text,
    in_list,
    migrate,
    pair_list,
    schema_version,
)
from agentcheck.journal import Journal, JournalOps, new_owner
from agentcheck.savers._deltas import BASES_KEY, DELTA, ListDeltas, pack_delta, unpack_delta
from agentcheck.savers._runs import (
    OUTSIDE_EDITS,
    UPDATE_PATH,
    RunJournal,
    node_name,
    push_index,
    push_nodes_of,
    task_id_at,
    task_key_prefix,
    triggers,
    with_push_index,
)
from agentcheck.savers._sends import Pairing, pair_sends
from agentcheck.savers._terms import metadata_terms
from agentcheck.serde import (
    MESSAGE_LIST,
    Codec,
    SafeSerializer,
    loads_message_list,
    message_rows,
    revive_rows,
)

__all__ = ["SaverCore"]

# A channel with a version but no value, as earlier agentcheck versions recorded it (such
# channels get no row now); reads skip these rows.
_EMPTY = "empty"
_COMMON_KEYS = ('["source"]=', '["step"]=', '["parents"')  # terms shared by many rows
_MAX_TERM = 512  # longer metadata terms are stored as their SHA-256
# The setting (agentcheck_settings) that records the form of the index terms: plain,
# a saver's keyed check value (_index_form), or some key's (recorded by a saver that has
# none, which cannot tell whose).
_INDEX_SETTING = "index_terms"
_PLAIN_INDEX, _ANOTHER_KEY = "plain", "h:?"
_TERM_STATS_TTL = 60.0  # seconds a saver keeps the database's statistics of terms
_CHUNK = 200  # keys per IN (...) list, well under every database's parameter limit
# A checkpoint's metadata terms are left pending (SQL.PENDING_TERMS) up to this many
# characters (ASCII: as many bytes), with which the row, key included, still fits its
# page (SQLite keeps about 1,000 bytes of a row of a WITHOUT ROWID table there): every
# filtered list reads the pending rows whole.
_PENDING_TERMS_MAX = 800
_ROW_COMPRESS_MIN = 2048  # checkpoint rows from this size up are compressed
# When encrypting, values are compressed only from this size up: compressing before
# encrypting lets the ciphertext's length tell how compressible a value is, which gives
# something away when a value mixes text of different sources (docs/savers.md).
_ENCRYPTED_COMPRESS_MIN = 65536


_NOT_PAIRED = object()  # SaverCore._pairing: the Sends of an update not paired yet
_CONTAINERS = (list, dict, set)  # values a read gives each checkpoint a copy of
INLINE_KEY = "_ac_inline"  # in a stored checkpoint: {channel: small plain value}
_INLINE_TEXT = 256  # strings up to this long are kept inside the checkpoint row


def _inlined(value: Any) -> bool:
    """Whether a channel value is stored inside its checkpoint's row (exact types only:
    a subclass, an enum say, needs the serializer's own encoding)."""
    return (
        value is None
        or type(value) in (bool, int, float)
        or (type(value) is str and len(value) <= _INLINE_TEXT)
    )


_MESSAGE_READER = SafeSerializer()


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# Not frozen: a frozen dataclass's __init__ costs 4x as much, once per delta read.
@dataclass(slots=True)
class _Header:
    """A delta row, decoded: ``value = snapshot(base_version)[shift:] + tail``."""

    base_version: str
    shift: int
    tail_type: str
    tail: bytes


@dataclass(slots=True)
class _Rows:
    """A stored message list, unpacked but not yet made messages (see ``_value``)."""

    rows: list[Any]


class ListPages:
    """The pages a list is read in, newest first: each is one operation, and the tuples
    of one are handed out before the next is read. Without a limit the first page is
    small (taking the newest checkpoints of a long history, ``next(get_state_history())``,
    reads and decodes only those, and a damaged row further back does not keep the
    newer ones from being read), and each next one larger.

    A page ends at a checkpoint id and the next starts at that id again, passing over
    the tuples already handed out (several threads may hold the same id: a copy).
    """

    FIRST, MAX = 16, 1024

    def __init__(self, limit: int | None) -> None:
        self.remaining = limit
        self.size, self.done = self.FIRST, False  # (set from the limit by reads)
        self.until: str | None = None
        self.seen: set[tuple[str, str, str]] = set()  # handed out, of id ``until``
        self.asked = 0  # rows the page being read asks for
        self.terms: list[str] | None = None  # the filter's, rarest first (see _list)
        # A damaged checkpoint met in the page being read: raised once the checkpoints
        # before it (newer) are handed out (see _list).
        self.error: CorruptDataError | None = None

    def reads(
        self,
        list_page: Callable[..., Operation[list[CheckpointTuple]]],
        config: RunnableConfig | None,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
    ) -> Iterator[Callable[[], Operation[list[CheckpointTuple]]]]:
        """The operations that read the pages (``SaverCore._list``), one after another:
        each page's tuples go through :meth:`take` before the next is asked for. The
        list's arguments are checked first; a damaged checkpoint's error is raised once
        the newer ones are handed out."""
        _check_list_args(config, filter, before, self.remaining)
        limit = self.remaining
        self.size = self.FIRST if limit is None else min(limit, self.MAX)
        self.done = limit is not None and limit <= 0
        while not self.done:
            size = self.size if self.remaining is None else min(self.size, self.remaining)
            self.asked = size + len(self.seen)
            yield partial(list_page, config, filter, before, self.asked, self)
        if self.error is not None:
            raise self.error

    def take(self, tuples: list[CheckpointTuple]) -> list[CheckpointTuple]:
        """The tuples of a page not handed out yet (at most what is left of the limit)."""
        if len(tuples) < self.asked or self.error is not None:
            self.done = True  # nothing older, or a damaged one next
        fresh = [t for t in tuples if _key_of(t) not in self.seen]
        if self.remaining is not None:
            fresh = fresh[: self.remaining]
            self.remaining -= len(fresh)
            self.done = self.done or self.remaining <= 0
        if fresh:
            last = fresh[-1].config["configurable"]["checkpoint_id"]
            if last != self.until:
                self.until, self.seen = last, set()
            self.seen.update(_key_of(t) for t in fresh if _key_of(t)[2] == last)
        self.size = min(self.size * 4, self.MAX)
        return fresh


def _key_of(t: CheckpointTuple) -> tuple[str, str, str]:
    conf = t.config["configurable"]
    return (conf["thread_id"], conf["checkpoint_ns"], conf["checkpoint_id"])


def _sends_to(values: Mapping[str, Any], index: int, node: str) -> bool:
    """Whether a checkpoint's pending Sends hold one to ``node`` at ``index``."""
    nodes = push_nodes_of(values.get("__pregel_tasks"))
    return nodes is not None and index < len(nodes) and nodes[index] == node


def _all_of(conditions: Sequence[str]) -> str:
    """``a AND b AND ...``, parenthesized as a balanced tree: SQLite nests a chain of
    ANDs one level per condition and refuses more than 1,000 levels (a filter on a large
    mapping has a condition per value in it)."""
    if len(conditions) <= 32:
        return " AND ".join(conditions)
    half = len(conditions) // 2
    return f"({_all_of(conditions[:half])}) AND ({_all_of(conditions[half:])})"


def _unreadable(what: str, where: tuple[str, str, str], why: object) -> CorruptDataError:
    """The error for a stored ``what`` of a checkpoint that cannot be read."""
    thread_id, ns, checkpoint_id = where
    return CorruptDataError(
        f"cannot read {what} of checkpoint {checkpoint_id!r} in thread {thread_id!r} "
        f"(namespace {ns!r}): {why}"
    )


def _configurable(config: Any, what: str) -> Mapping[str, Any]:
    """The ``configurable`` mapping of a config given to the saver, or a TypeError
    naming ``what`` (instead of an AttributeError or KeyError deep inside)."""
    if not isinstance(config, Mapping):
        raise TypeError(
            f"{what} must be a config (a dict with a 'configurable' dict naming the "
            f"thread_id), not {type(config).__name__}"
        )
    conf = config.get("configurable")
    if not isinstance(conf, Mapping):
        raise TypeError(f"{what}['configurable'] must be a dict, not {type(conf).__name__}")
    return conf


def config_keys(
    config: Any, what: str, *, thread: bool = True, checkpoint: bool = False
) -> tuple[str, str, str | None]:
    """(thread id, namespace, checkpoint id or None) of a config given to the saver,
    each checked: a ValueError if ``thread`` (``checkpoint``) and it names none, a
    TypeError naming the key if one is not text."""
    conf = _configurable(config, what)
    if thread and "thread_id" not in conf:
        raise ValueError(f"{what} names no thread: its 'configurable' has no thread_id")
    thread_id = id_text(conf["thread_id"], "thread_id") if "thread_id" in conf else ""
    ns = conf.get("checkpoint_ns")
    if ns is None:
        ns = ""
    elif not isinstance(ns, str):
        raise TypeError(f"checkpoint_ns must be text, not {type(ns).__name__}")
    checkpoint_id = conf.get("checkpoint_id")
    if checkpoint_id is not None and not isinstance(checkpoint_id, str):
        raise TypeError(f"checkpoint_id must be text, not {type(checkpoint_id).__name__}")
    if checkpoint and not checkpoint_id:
        raise ValueError(f"{what} names no checkpoint: its 'configurable' has no checkpoint_id")
    return thread_id, str.__str__(ns), str.__str__(checkpoint_id) if checkpoint_id else None


def _check_list_args(config: Any, filter: Any, before: Any, limit: Any) -> None:
    """The arguments of ``list``, checked before anything is read."""
    if config is not None:
        config_keys(config, "list's config", thread=False)
    if filter is not None and not isinstance(filter, Mapping):
        raise TypeError(f"list's filter must be a dict, not {type(filter).__name__}")
    if before is not None:
        config_keys(before, "list's before", thread=False)
    if limit is not None and (type(limit) is not int):
        raise TypeError(f"list's limit must be a whole number or None, not {limit!r}")


def _check_put_args(checkpoint: Any, metadata: Any, new_versions: Any) -> None:
    if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("id"), str):
        raise TypeError("put's checkpoint must be a LangGraph Checkpoint (a dict with an 'id')")
    for name in ("channel_values", "channel_versions"):
        if not isinstance(checkpoint.get(name, {}), Mapping):
            raise TypeError(f"put's checkpoint[{name!r}] must be a dict")
    if not isinstance(metadata, Mapping):
        raise TypeError(f"put's metadata must be a dict, not {type(metadata).__name__}")
    if not isinstance(new_versions, Mapping):
        raise TypeError(f"put's new_versions must be a dict, not {type(new_versions).__name__}")


def _parent_chain(
    rows: Sequence[Sequence[Any]], start: str, where: tuple[str, str]
) -> list[Sequence[Any]]:
    """The rows of a checkpoint's ancestors (id and parent id first), nearest first, from
    ``start``; CorruptDataError if the parent links loop (a damaged row, or a put that
    named a checkpoint as its own parent)."""
    by_id = {row[0]: row for row in rows}
    chain: list[Sequence[Any]] = []
    seen: set[str] = set()
    cursor: str | None = start
    while cursor is not None and cursor in by_id:
        if cursor in seen:
            raise _unreadable(
                "the parent chain", (*where, start), f"it comes back to checkpoint {cursor!r}"
            )
        seen.add(cursor)
        chain.append(by_id[cursor])
        cursor = by_id[cursor][1]
    return chain


@dataclass
class _Fetched:
    """What the statement that read a checkpoint row brought along: the stored values
    it looked up (``asked``: the keys its ``blob_keys`` named, found or not), and the
    checkpoint's writes."""

    blobs: dict[tuple[str, str], tuple[str, Any]]
    asked: set[tuple[str, str]]
    writes: Rows


def _blob_keys(
    versions: Mapping[str, Any], inline: Mapping[str, Any], bases: Mapping[str, list[str]]
) -> dict[str, list[str]]:
    """The stored values a read of the checkpoint looks up (those of its channels not
    kept in its row, and the versions their deltas are built from), for its
    ``blob_keys`` column."""
    keys: dict[str, list[str]] = {ch: [str(v)] for ch, v in versions.items() if ch not in inline}
    for ch, chain in bases.items():
        keys.setdefault(ch, []).extend(chain)
    return keys


def _storable(text: Any) -> Any:
    """An encoded ``blob_keys`` value, or None if a name in it cannot be stored as text
    (a lone surrogate): the row is then read the older way. ASCII (most names, and our
    versions) always encodes."""
    if text is None or text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return None
    return text


@dataclass
class _Decoded:
    """The values one read has decoded, by (channel, version). ``lazy`` for a read of
    one checkpoint: see ``_stored``."""

    lazy: bool
    values: dict[tuple[str, str], Any] = field(default_factory=dict)
    # The deltas being rebuilt now, each waiting for its base: one met again is a loop.
    building: set[tuple[str, str]] = field(default_factory=set)


class StaleDeltaBase(Exception):
    """A delta's stored base is gone (see SaverCore._check_bases); never escapes a put."""


class SaverCore(RunJournal, BaseCheckpointSaver[str]):
    """Non-I/O base class of every agentcheck saver.

    Args:
        serde: serializer for values; defaults to :class:`~agentcheck.serde.SafeSerializer`
            (strict msgpack, no pickle).
        allowed_types: extra types the default serializer may store and revive.
        encryption_key: encrypt every stored payload (checkpoints, channel values,
            pending writes, metadata) with AES-256-GCM; needs ``agentcheck[encryption]``.
            Defaults to the ``AGENTCHECK_ENCRYPTION_KEY`` environment variable.
        compress_threshold: payloads of at least this many bytes are compressed; by
            default the saver's ``default_compress_threshold`` (1 MiB on SQLite, 2 KiB
            on PostgreSQL), and at least 64 KiB when encrypting (see docs/savers.md,
            "Storage").
        compression: how: ``"zlib"`` or ``"zstd"`` (see :class:`~agentcheck.serde.Codec`).
        journal_nodes: record runs and node events of the graphs using this saver in the
            journal (docs/journal.md), in the same transaction as their checkpoints.
    """

    sql: type[SQL] = SQL
    # Values from this size up are compressed, unless the saver is told otherwise. On
    # SQLite only a value of a MiB or more: zlib costs far more time than writing the
    # bytes it saves (docs/savers.md, "Storage"), and list deltas already keep a chat's
    # history small.
    default_compress_threshold = 1 << 20

    def __init__(
        self,
        *,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[tuple[str, ...] | type] | None = None,
        encryption_key: bytes | str | None = None,
        compress_threshold: int | None = None,
        compression: str = "zlib",
        journal_nodes: bool = True,
    ) -> None:
        super().__init__(serde=serde or SafeSerializer(allowed_types=allowed_types))
        self.codec = Codec(
            encryption_key=encryption_key,
            compress_threshold=_ENCRYPTED_COMPRESS_MIN,
            compression=compression,
        )
        if compress_threshold is not None:
            self.codec.compress_threshold = compress_threshold
        elif not self.codec.encrypted:
            self.codec.compress_threshold = self.default_compress_threshold
        else:  # never lower than the saver's own threshold
            self.codec.compress_threshold = max(
                _ENCRYPTED_COMPRESS_MIN, self.default_compress_threshold
            )
        self.journal_nodes = journal_nodes
        self.journal_ops = JournalOps(self)
        self.list_deltas = ListDeltas()
        # Run status per thread as this saver last wrote it: a run is (re)started in the
        # journal on its first checkpoint in this process and after it paused or ended.
        self._run_status: dict[str, tuple[str, str | None]] = {}
        self._stopped_by: dict[str, frozenset[str]] = {}
        self._commanded: dict[str, str] = {}
        self._null_writes: dict[str, tuple[str, int]] = {}
        self._edited_at: dict[str, tuple[str, bool]] = {}
        self._task_started: dict[str, str] = {}
        # All of the above, which a deleted thread's run is forgotten from.
        self._per_thread: tuple[dict[str, Any], ...] = (
            self._run_status,
            self._stopped_by,
            self._commanded,
            self._null_writes,
            self._edited_at,
            self._task_started,
        )
        # Node names of the Send tasks pending at recent checkpoints, by checkpoint.
        self._push_nodes: OrderedDict[tuple[str, str, str], list[str]] = OrderedDict()
        # The form of the database's index terms when it is not this saver's (see
        # _settle_index): what it writes and looks up there would miss. Looked at again
        # until it is recorded.
        self._index_mismatch: str | None = None
        self._index_recorded = False
        # Names this process in the runs it drives (agentcheck_runs.owner).
        self.owner = new_owner()
        self._terms_puts = 0

    _journal: Journal | None = None
    # Puts of a saver between two moves of the pending metadata terms into the index
    # (SQL.PENDING_TERMS); its first put moves what earlier savers left. A filtered list
    # reads the pending rows whole: up to 31 per saver writing.
    move_terms_every = 32

    @property
    def journal(self) -> Journal:
        """The journal (runs, events, step ledger) in this saver's database."""
        if self._journal is None:
            self._journal = Journal(self)
        return self._journal

    # -- encoding -------------------------------------------------------------------

    def _dump(self, value: Any) -> tuple[str, bytes]:
        return self.codec.encode(*self.serde.dumps_typed(value))

    def _check_bases(
        self, thread_id: str, ns: str, planned: Mapping[str, Sequence[str]]
    ) -> Operation[None]:
        """Fail with :class:`StaleDeltaBase` (or, on PostgreSQL, SQLSTATE 22012 when the
        statements are answered) if the stored value a delta is built on, or the
        snapshot its chain starts from, is gone: the thread was deleted or pruned by
        another saver, whose memory this one does not share. The put is then made again
        with every value stored whole."""
        keys = sorted({(ch, v) for ch, chain in planned.items() for v in (chain[0], chain[-1])})
        params = (*(part for key in keys for part in key), thread_id, ns)
        pairs = pair_list(len(keys))
        if self.sql.CHECK_BLOBS is not None:
            check = self.sql.CHECK_BLOBS.format(pairs=pairs)
            yield Query(check, (*params, len(keys)), check=True)
        else:
            rows = yield Query(self.sql.COUNT_BLOBS.format(pairs=pairs), params, fetch=True)
            if rows[0][0] < len(keys):
                raise StaleDeltaBase(thread_id)
        return None

    def _retry_stale(self, exc: BaseException, config: RunnableConfig) -> bool:
        """Whether a failed put is one :meth:`_check_bases` stopped; if so, this saver
        forgets the thread's lists, so that the put made again stores them whole."""
        if not isinstance(exc, StaleDeltaBase) and getattr(exc, "sqlstate", None) != "22012":
            return False
        self.list_deltas.clear_thread(str(config["configurable"]["thread_id"]))
        return True

    def _load(
        self,
        type_: str,
        data: Any,
        what: str,
        cfg: tuple[str, str, str],
        *,
        row: bool = True,
        lazy: bool = False,
        plain_json: bool = False,
    ) -> Any:
        """A stored value, decoded; ``row=False`` for one the codec did not encode (the
        tail inside a delta row, whose serializer's tag is taken as it is). With
        ``lazy``, a message list comes back as :class:`_Rows`. ``plain_json``: a "json"
        row is read as plain JSON whatever the serializer (metadata, see _put)."""
        try:
            decoded = self.codec.decode(type_, data) if row else (type_, bytes(data))
            if lazy and decoded[0] == MESSAGE_LIST:
                return _Rows(message_rows(decoded[1], self._rows_hook()))
            if plain_json and decoded[0] == "json":
                return json.loads(decoded[1])
            return self._loads(decoded)
        except Exception as exc:
            raise _unreadable(what, cfg, exc) from exc

    def _loads(self, decoded: tuple[str, bytes]) -> Any:
        """A value from its serializer's tag and bytes (the codec's steps undone)."""
        if decoded[0] == MESSAGE_LIST and not isinstance(self.serde, SafeSerializer):
            # Written by the default serializer, read by another one given since.
            return loads_message_list(decoded[1], self._ext_hook_of_serde())
        return self.serde.loads_typed(decoded)

    def _load_checkpoint(self, type_: str, data: Any, key: tuple[str, str, str]) -> Any:
        """A stored checkpoint (without its values), checked to have a checkpoint's shape:
        a row that decodes to something else is as unreadable as one that does not."""
        rest = self._load(type_, data, "the checkpoint", key)
        if type(rest) is not dict:
            raise _unreadable(
                "the checkpoint", key, f"it decodes to {type(rest).__name__}, not a mapping"
            )
        for name in ("channel_versions", "versions_seen", BASES_KEY, INLINE_KEY):
            value = rest.get(name)
            if value is not None and type(value) is not dict:
                why = f"its {name} is {type(value).__name__}, not a mapping"
                raise _unreadable("the checkpoint", key, why)
        for channel, chain in (rest.get(BASES_KEY) or {}).items():
            if type(chain) is not list or not all(type(v) is str for v in chain):
                why = f"its {BASES_KEY} of channel {channel!r} is not a list of versions"
                raise _unreadable("the checkpoint", key, why)
        return rest

    def _load_metadata(self, type_: str, data: Any, key: tuple[str, str, str]) -> Any:
        """A checkpoint's stored metadata, checked to be a mapping."""
        meta = self._load(type_, data, "the metadata", key, plain_json=True)
        if type(meta) is not dict:
            why = f"it decodes to {type(meta).__name__}, not a mapping"
            raise _unreadable("the metadata", key, why)
        return meta

    def _rows_hook(self) -> Any:
        """The msgpack extension hook for the rows of a stored message list."""
        serde = self.serde
        if isinstance(serde, SafeSerializer):
            return serde._ext_hook()
        return self._ext_hook_of_serde()

    def _ext_hook_of_serde(self) -> Any:
        """The msgpack extension hook of the saver's serializer, with its allowlist: its
        own (LangGraph's JsonPlusSerializer), or that of the one it wraps
        (EncryptedSerializer's ``serde``); else the default serializer's."""
        inner: Any = self.serde
        for _ in range(8):  # wrappers of wrappers, but never a cycle
            hook = getattr(inner, "_unpack_ext_hook", None)
            if hook is not None:
                return hook
            inner = getattr(inner, "serde", None)
            if inner is None:
                break
        return _MESSAGE_READER._ext_hook()

    def _term(self, text: str) -> str:
        """The stored form of an index term: long ones are hashed, because index entries
        are size-limited (PostgreSQL's btree refuses entries over ~2.7 KB)."""
        term = self.codec.term(text)
        if len(term) > _MAX_TERM:
            term = "l:" + hashlib.sha256(term.encode()).hexdigest()
        return term

    # -- setup: the schema, and the form of the index terms ---------------------------

    def _setup_op(self, migrations: Sequence[Sequence[str]]) -> Operation[None]:
        """Bring the schema up to date, then look at the index terms' form."""
        yield from migrate(self.sql, migrations)
        yield from self._settle_index(record=False)
        return None

    def _set_up_op(self, migrations: Sequence[Sequence[str]]) -> Operation[bool]:
        """Whether the schema is at this version already; if so, look at the index
        terms' form (reads only: a set-up database needs no write to open)."""
        if (yield from schema_version(self.sql)) != len(migrations):
            return False
        yield from self._settle_index(record=False)
        return True

    def _index_form(self) -> str:
        """The form of this saver's index terms: plain, or keyed by its encryption key
        (a keyed check value stands for the key, and tells nothing of it)."""
        return self.codec.term("agentcheck/index-terms") if self.codec.encrypted else _PLAIN_INDEX

    def _settle_index(self, *, record: bool) -> Operation[str | None]:
        """Find the form the database's index terms are in, and remember whether it is
        not this saver's; returns the other form (None if the same, or not known). With
        ``record`` (a put, about to write terms), record it if it is not yet: a database
        with no terms takes this saver's form.

        The form is read from agentcheck_settings; until a saver records it, from the
        terms stored (a database written before it was recorded): plain ones are plain;
        keyed ones are this saver's if it can decode the metadata of a checkpoint they
        belong to (it has the key that wrote them), another key's if not. A saver without
        a key records keyed terms as some key's; the first saver of that key records its
        own over it.
        """
        ours = self._index_form()
        stored = yield from self._index_setting()
        form = stored
        if stored is None or (stored == _ANOTHER_KEY and self.codec.encrypted):
            found = yield from self._stored_terms_form()
            if stored is None:
                form = found
                # (Keyed terms a saver with a key cannot decode: whose, it cannot tell.)
                if record and not (found == _ANOTHER_KEY and self.codec.encrypted):
                    yield Query(self.sql.RECORD_SETTING, (_INDEX_SETTING, found or ours))
                    stored = form = yield from self._index_setting()
            elif found == ours:
                form = ours
                if record:
                    yield Query(self.sql.REPLACE_SETTING, (ours, _INDEX_SETTING, stored))
                    stored = form = yield from self._index_setting()
        mismatch = None if form in (None, ours) else form
        # Remembered once committed: a first put that fails is rolled back, record and
        # all, and the form is then looked at again.
        recorded = stored is not None and form == stored
        yield OnCommit(partial(self._remember_index, recorded, mismatch))
        return mismatch

    def _remember_index(self, recorded: bool, mismatch: str | None) -> None:
        self._index_recorded, self._index_mismatch = recorded, mismatch

    def _check_index(self, what: str, *, record: bool = False) -> Operation[None]:
        """Raise KeyMismatchError if the index terms are in another form than this
        saver's (see _settle_index): ``what`` (a filter, a put...) would be wrong without
        a word. ``record``: a put, which records the form where none is yet."""
        mismatch = self._index_mismatch
        if not self._index_recorded:
            mismatch = yield from self._settle_index(record=record)
        self._raise_key_mismatch(mismatch, what)
        return None

    def _index_setting(self) -> Operation[str | None]:
        rows = yield Query(self.sql.SELECT_SETTING, (_INDEX_SETTING,), fetch=True)
        return str(rows[0][0]) if rows else None

    def _stored_terms_form(self) -> Operation[str | None]:
        """The form of the stored index terms: plain, this saver's keyed form, or another
        key's; None if there are none. Keyed terms are this saver's if it can decode the
        metadata of one of a few checkpoints that have keyed terms (encrypted with the
        key that keyed them): one damaged row does not make the right key look like
        another, nor a plain row written before the key the wrong one look right."""
        rows = yield Query(self.sql.SAMPLE_TERM, fetch=True)
        if not rows and self.sql.PENDING_TERMS:
            rows = yield Query(self.sql.SAMPLE_PENDING_TERMS, fetch=True)
        if not rows:
            return None
        # (A pending row holds all of its checkpoint's terms, each after a separator.)
        if not str(rows[0][0]).lstrip(self.sql.encode_terms([])).startswith("h:"):
            return _PLAIN_INDEX
        if not self.codec.encrypted:
            return _ANOTHER_KEY
        rows = list((yield Query(self.sql.SAMPLE_KEYED_METADATA, fetch=True)))
        if self.sql.PENDING_TERMS:
            keyed = self.sql.encode_terms([]) + "h:"
            rows += yield Query(self.sql.SAMPLE_KEYED_PENDING_METADATA, (keyed,), fetch=True)
        for meta_type, meta_data, *_key in rows:
            try:
                # The codec's decryption only: it is agentcheck's key that keys the terms
                # (a serializer of the caller's that cannot read the row is another error,
                # which reads report).
                self.codec.decode(meta_type, meta_data)
            except CorruptDataError:
                continue
            return self._index_form()
        return _ANOTHER_KEY

    def _raise_key_mismatch(self, stored: str | None, what: str) -> None:
        """KeyMismatchError for index terms of the form ``stored`` (None: no error)."""
        if stored is None:
            return
        if stored == _PLAIN_INDEX:
            how = "without an encryption key, and this saver has one"
        elif not self.codec.encrypted:
            how = "with an encryption key, and this saver has none"
        else:
            how = "with another encryption key than this saver's"
        raise KeyMismatchError(
            f"the database's metadata index was written {how}: {what}. Give the saver the "
            "encryption_key the database was written with, or none if it was written "
            "without one (AGENTCHECK_ENCRYPTION_KEY counts too)"
        )

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Next channel version: a counter zero-padded to 16 digits (LangGraph compares
        versions as strings), a dot, and 52 random bits in hex.

        The random part keeps versions written on two forks of one thread distinct, since
        stored values are keyed by (channel, version). Versions fill most of a checkpoint
        row: these take 30 characters where the official savers' take 51 (32 digits and
        a random fraction). A version of theirs, or of an earlier agentcheck, is followed
        by a greater one of this form: fewer leading zeros sort after more.
        """
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(str(current).split(".")[0])
        return f"{current_v + 1:016}.{random.getrandbits(52):013x}"

    def _move_terms_due(self) -> bool:
        """Whether this put moves the pending terms. (The saver's operations run one at
        a time; were two to count at once, a move more or less would only change when
        the index catches up.)"""
        puts = self._terms_puts
        self._terms_puts = puts + 1
        return puts % self.move_terms_every == 0

    def _move_pending_terms(self) -> Operation[None]:
        """Move every pending row into the index: the checkpoint's terms there replaced
        by the row's (SQL.PENDING_TERMS). A row whose checkpoint is gone moves nothing.
        (SQLite only: one writer at a time, so no row is added meanwhile.)"""
        rows = yield Query(self.sql.SELECT_PENDING_TERMS, fetch=True)
        if not rows:
            return None
        yield Query(self.sql.DELETE_TERMS_OF, [tuple(row[:3]) for row in rows], many=True)
        terms = [
            (*row[:3], term) for row in rows if row[4] for term in self.sql.decode_terms(row[3])
        ]
        if terms:
            yield Query(self.sql.INSERT_TERM, terms, many=True)
        yield Query(self.sql.DELETE_PENDING_TERMS)
        return None

    def _put_terms(self, key: tuple[str, str, str], terms: list[str]) -> Operation[None]:
        """A put's metadata terms: one pending row (SQL.PENDING_TERMS), or rows of the
        index (PostgreSQL, and metadata too large to be read whole by every filtered
        list while pending); every so many puts, the pending rows move into the index."""
        pending = self.sql.encode_terms(terms) if self.sql.PENDING_TERMS else ""
        if 0 < len(pending) <= _PENDING_TERMS_MAX:
            # It supersedes the terms the index may hold for this checkpoint, if it is
            # stored again.
            yield Query(self.sql.UPSERT_PENDING_TERMS, (*key, pending))
        else:
            if pending:  # a pending row of an earlier store of it would supersede these
                yield Query(self.sql.DELETE_PENDING_TERMS_OF, key)
            if 0 < len(terms) <= _CHUNK:
                # The terms it had and no longer has (a checkpoint stored again), then
                # the new ones: different rows (see Query.disjoint).
                delete = self.sql.DELETE_TERMS_EXCEPT.format(terms=in_list(len(terms)))
                yield Query(delete, (*key, *terms), disjoint=True)
            else:
                yield Query(self.sql.DELETE_TERMS_OF, key)
            if terms:
                yield Query(self.sql.INSERT_TERM, [(*key, term) for term in terms], many=True)
        if pending and self._move_terms_due():
            yield from self._move_pending_terms()
        return None

    # -- put ------------------------------------------------------------------------

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Operation[RunnableConfig]:
        yield from self._check_index(
            "a put would add terms of another form to it, which filters would then miss",
            record=True,
        )
        thread_id, ns, parent_id = config_keys(config, "put's config")
        _check_put_args(checkpoint, metadata, new_versions)
        checkpoint_id = checkpoint["id"]

        values = checkpoint["channel_values"]
        blob_rows = []
        remember: list[Callable[[], None]] = []
        planned: dict[str, list[str]] = {}  # channel -> rows it is built from, for deltas now
        # Small plain values (counters, flags, short strings, the None of a trigger
        # channel) travel inside the checkpoint row: a row of their own would cost more
        # (its key, two B-trees) than repeating them in each checkpoint.
        versions = checkpoint["channel_versions"]
        inline = {ch: v for ch, v in values.items() if ch in versions and _inlined(v)}
        for channel, version in new_versions.items():
            if channel in inline:
                continue
            # A channel with a new version but no value (consumed, or a DeltaChannel step)
            # gets no row: reads treat a missing row as no value.
            if channel in values:
                delta, after = self.list_deltas.plan(
                    (thread_id, ns, channel), str(version), values[channel]
                )
                if after is not None:
                    remember.append(after)
                if delta is not None:
                    planned[channel] = list(delta.chain)
                    tail_type, tail = self.serde.dumps_typed(delta.tail)
                    packed = pack_delta(delta.base_version, delta.shift, tail_type, tail)
                    type_, data = self.codec.encode(DELTA, packed)
                else:
                    type_, data = self._dump(values[channel])
                blob_rows.append((thread_id, ns, channel, str(version), type_, data))
        rest: dict[str, Any] = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        if inline:
            rest[INLINE_KEY] = inline
        bases = self.list_deltas.bases(thread_id, ns, checkpoint["channel_versions"])
        bases.update(planned)
        if bases:
            rest[BASES_KEY] = bases
        blob_keys = _storable(self.sql.encode_blob_keys(_blob_keys(versions, inline, bases)))
        # A large checkpoint row (a graph of many channels) is compressed; a small one is
        # not worth the time at every put and read (docs/savers.md, "Storage"). Not when
        # encrypting: the row may mix short values from different sources, and compressed
        # lengths could then tell an observer of the ciphertext whether two of them match.
        cp_type, cp_data = self.serde.dumps_typed(rest)
        cp_type, cp_data = self.codec.encode(
            cp_type,
            cp_data,
            compress=len(cp_data) >= _ROW_COMPRESS_MIN and not self.codec.encrypted,
        )
        meta = get_serializable_checkpoint_metadata(config, metadata)
        try:
            if isinstance(self.serde, SafeSerializer):
                meta_type, meta_data = self.codec.encode(
                    *self.serde.dumps_typed(meta, exact_text=True)
                )
            else:
                meta_type, meta_data = self._dump(meta)
        except TypeError:
            # Text that is not valid Unicode (lone surrogates, which filters may name):
            # msgpack would store "?" for them; JSON escapes them and gives them back.
            # Read back as plain JSON (never through LangChain's reviver, which would
            # build objects from {"lc": ...} mappings in it).
            text = json.dumps(meta, default=repr).encode()
            meta_type, meta_data = self.codec.encode("json", text)
        run_id = meta.get("run_id")
        run_term = self._term(str(run_id)) if run_id is not None else None
        key = (thread_id, ns, checkpoint_id)
        if self.codec.encrypted:
            terms = sorted({self._term(t) for t in metadata_terms(meta)})
        else:  # most terms are their own stored form (see _term)
            terms = sorted(
                {t if len(t) <= _MAX_TERM else self._term(t) for t in metadata_terms(meta)}
            )

        if planned:
            yield from self._check_bases(thread_id, ns, planned)
        if blob_rows:
            yield Query(self.sql.INSERT_BLOB, blob_rows, many=True)
        yield Query(
            self.sql.UPSERT_CHECKPOINT,
            (*key, parent_id, run_term, cp_type, cp_data, meta_type, meta_data, blob_keys),
        )
        yield from self._put_terms(key, terms)
        for after in remember:
            yield OnCommit(after)
        if self.journal_nodes:
            if not ns:
                yield from self._journal_checkpoint(thread_id, checkpoint_id, meta, values)
            elif values.get("__pregel_tasks"):
                self._remember_push_nodes((thread_id, ns, checkpoint_id), values["__pregel_tasks"])
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Operation[None]:
        thread_id, ns, named = config_keys(config, "put_writes' config", checkpoint=True)
        checkpoint_id = cast(str, named)  # (checkpoint=True: never None)
        conf = config["configurable"]
        if not isinstance(task_id, str):
            raise TypeError(f"put_writes' task_id must be text, not {type(task_id).__name__}")
        rows = []
        for i, (channel, value) in enumerate(writes):
            type_, data = self._dump(value)
            idx = WRITES_IDX_MAP.get(channel, i)
            rows.append(
                (thread_id, ns, checkpoint_id, task_id, idx, channel, type_, data, task_path)
            )
        if not rows:
            return None
        # Special writes (errors, interrupts, resumes) replace an earlier one; ordinary
        # writes are kept as first written, so a retried task cannot change history.
        special = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        statement = self.sql.UPSERT_WRITE if special else self.sql.INSERT_WRITE_IF_ABSENT
        yield Query(statement, rows, many=True)
        if self.journal_nodes:
            root_checkpoint = (conf.get("checkpoint_map") or {}).get("") if ns else None
            yield from self._journal_task(
                thread_id,
                ns,
                checkpoint_id,
                task_id,
                task_path,
                writes,
                root_checkpoint=None if root_checkpoint is None else str(root_checkpoint),
            )
        return None

    # -- reads ----------------------------------------------------------------------

    def _continued_task(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        node: str,
        path: str | None = None,
        node_triggers: Sequence[str] | None = None,
    ) -> Operation[str | None]:
        """The task that ``node`` continues at ``checkpoint_id``, if that checkpoint was
        written by update_state over one where the node was paused at an interrupt (or
        had finished beside a task that paused, or before a crash): LangGraph then runs
        the node again as a new task of the new checkpoint (a new task id), which is
        still the one that ran going on. None otherwise, and for an update of an older
        checkpoint, from which the run had gone on (a fork: its calls are new).

        The task may itself have gone on with an earlier one (an edit before each of two
        answers): the chain is followed back to the task that first ran.

        ``path``: the resumed task's path (LangGraph's ``langgraph_path``, as stored with
        writes): the task that ran there is the one of the same path, which tells apart
        the tasks of one node that Sends made: the task of the same Send (node and
        argument) among the earlier checkpoint's pending Sends, wherever the update left
        it. Without it, the one task of ``node``.

        A task cut short by a crash stored no writes: it is then found by the id
        LangGraph gave it there (from ``node_triggers``, the node's, or its Send's
        index), if the ledger holds calls of it."""
        push = push_index(path)
        found_task: str | None = None
        parent: CheckpointTuple | None = None
        for _ in range(16):  # updates made one after another
            found = parent
            if found is None or found.config["configurable"]["checkpoint_id"] != checkpoint_id:
                found = yield from self._get_tuple(
                    {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                      "checkpoint_id": checkpoint_id}}
                )  # fmt: skip
            if found is None or found.metadata.get("source") not in OUTSIDE_EDITS:
                return found_task
            values = found.checkpoint["channel_values"]
            if not (triggers(values, node) if push is None else _sends_to(values, push, node)):
                return found_task  # an update after which the node was not pending any more
            if found.parent_config is None:
                return found_task
            ours = found.config["configurable"]["checkpoint_id"]
            checkpoint_id = found.parent_config["configurable"]["checkpoint_id"]
            params = (thread_id, ns, checkpoint_id)
            if (yield from self._went_on(thread_id, ns, checkpoint_id, ours)):
                return found_task  # the run went on from there: this is a fork
            if push is not None and path is not None:
                # The same Send there, at whatever index (an update may send others, or
                # the same in another order); none: this task is new.
                parent = yield from self._get_tuple(found.parent_config)
                pairing = None if parent is None else self._pairing(found, parent)
                earlier = None if pairing is None else pairing.earlier(push)
                if earlier is None:
                    return found_task
                push, path = earlier, with_push_index(path, earlier)
            rows = yield Query(self.sql.SELECT_TASK_WRITES, params, fetch=True)
            # update_state(as_node=<the paused node>) writes in the paused task's name:
            # the node is done, and what runs next is a new run of it, not this one.
            updated = {str(task_id) for task_id, _, path in rows if path.startswith(UPDATE_PATH)}
            # The tasks of that node that ran there: the one that paused, or one that
            # finished beside a task that paused (LangGraph runs it again too, its writes
            # not carried over by the update).
            ran = {
                str(task_id)
                for task_id, _, at in rows
                if (at == path if path else node_name(at) == node)
                and not at.startswith(UPDATE_PATH)
            }
            if not ran:  # none stored writes there: one may have been cut short
                if parent is None or parent.config["configurable"]["checkpoint_id"] != (
                    checkpoint_id
                ):
                    parent = yield from self._get_tuple(found.parent_config)
                crashed = yield from self._crashed_task(
                    thread_id, ns, parent, node, path, node_triggers
                )
                ran = {crashed} if crashed else ran
            if ran & updated:
                return found_task
            if len(ran) != 1:
                # Several of that node ran there (Send: which one is unclear), or none:
                # an update of an update, to look further back past.
                if ran:
                    return found_task
                continue
            # That task went on with an earlier one if its checkpoint is an update too.
            found_task = ran.pop()
        return found_task

    # Pairings of Sends across an update (see pair_sends), by (thread, namespace,
    # update, checkpoint it was made over): each resumed Send task of the update asks.
    _pairings: OrderedDict[tuple[str, str, str, str], Pairing | None] | None = None

    def _pairing(self, update: CheckpointTuple, parent: CheckpointTuple) -> Pairing | None:
        conf, parent_conf = update.config["configurable"], parent.config["configurable"]
        key = (
            str(conf["thread_id"]),
            str(conf.get("checkpoint_ns", "")),
            str(conf["checkpoint_id"]),
            str(parent_conf["checkpoint_id"]),
        )
        pairings = self._pairings
        if pairings is None:
            pairings = self._pairings = OrderedDict()
        known = pairings.get(key, _NOT_PAIRED)  # (another thread may drop it meanwhile)
        if known is not _NOT_PAIRED:
            return cast("Pairing | None", known)
        # (Two tasks resumed at once may both pair them: the same answer, made twice.)
        pairing = pair_sends(update.checkpoint["channel_values"], parent.checkpoint)
        pairings[key] = pairing
        while len(pairings) > 64:
            with contextlib.suppress(KeyError):
                pairings.popitem(last=False)
        return pairing

    def _crashed_task(
        self,
        thread_id: str,
        ns: str,
        at: CheckpointTuple | None,
        node: str,
        path: str | None,
        node_triggers: Sequence[str] | None,
    ) -> Operation[str | None]:
        """The task of ``node`` that ran from checkpoint ``at`` and stored no writes (a
        crash cut it short), if it made calls the ledger holds: its id is the one
        LangGraph gave it there (see task_id_at)."""
        if at is None:
            return None
        step = at.metadata.get("step")
        if type(step) is not int:
            return None
        task_id = task_id_at(at.checkpoint, step + 1, ns, node, path, node_triggers)
        if task_id is None:
            return None
        prefix = task_key_prefix(ns, node, task_id)
        params = (thread_id, prefix + "|", prefix + "}")
        return task_id if (yield Query(self.sql.TASK_HAS_CALLS, params, fetch=True)) else None

    def _went_on(self, thread_id: str, ns: str, checkpoint_id: str, ours: str) -> Operation[bool]:
        """Whether a run went on from ``checkpoint_id`` other than through ``ours`` (the
        update being resumed): a step written after it, or after an update of it (an
        earlier edit that was resumed). Looks at most 64 checkpoints down."""
        todo, seen = [checkpoint_id], 0
        while todo and seen < 64:
            parent = todo.pop()
            params = (thread_id, ns, parent)
            for child_id, m_type, m_data in (
                yield Query(self.sql.SELECT_CHILDREN, params, fetch=True)
            ):
                seen += 1
                if child_id == ours:
                    continue
                meta = self._load_metadata(m_type, m_data, (thread_id, ns, child_id))
                if meta.get("source") not in OUTSIDE_EDITS:
                    return True
                todo.append(child_id)
        return False

    def _get_tuple(self, config: RunnableConfig) -> Operation[CheckpointTuple | None]:
        thread_id, ns, checkpoint_id = config_keys(config, "get_tuple's config")
        if checkpoint_id:
            query = Query(self.sql.GET_TUPLE_BY_ID, (thread_id, ns, checkpoint_id), fetch=True)
        else:
            query = Query(self.sql.GET_TUPLE_LATEST, (thread_id, ns), fetch=True)
        # One statement: the checkpoint, the values it names in blob_keys, its writes.
        rows = yield query
        checkpoint: tuple[Any, ...] = ()
        asked: set[tuple[str, str]] = set()
        blobs: dict[tuple[str, str], tuple[str, Any]] = {}
        writes: list[tuple[Any, ...]] = []
        for part, a, b, c, d, type_, data, m_data, _ in rows:
            if part == 0:  # (checkpoint_id, parent_checkpoint_id, metadata_type)
                checkpoint = (thread_id, ns, a, b, type_, data, c, m_data)
            elif part == 1:  # (channel, version): looked up, maybe not found
                asked.add((a, b))
                if type_ is not None:
                    blobs[(a, b)] = (type_, data)
            else:  # (task_id, channel, task_path, idx)
                writes.append((a, b, type_, data, c, d))
        if not checkpoint:
            return None
        where = (thread_id, ns, checkpoint[2])
        fetched = _Fetched(blobs, asked, [(*where, *w) for w in writes])
        tuples = yield from self._assemble([checkpoint], fetched)
        return tuples[0]

    def _list(
        self,
        config: RunnableConfig | None,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
        pages: ListPages | None = None,
    ) -> Operation[list[CheckpointTuple]]:
        """One page of a list (see :class:`ListPages`: it starts at the checkpoint id the
        page before ended at). The filter's terms are ranked for the first page only."""
        until = None if pages is None else pages.until
        if pages is not None and pages.terms is not None:
            terms = pages.terms
        else:
            terms = sorted({self._term(t) for t in metadata_terms(filter or {})})
            if terms:
                yield from self._check_index("a metadata filter would miss checkpoints")
            if len(terms) > 1:
                terms = yield from self._rarest_first(terms)
            if pages is not None:
                pages.terms = terms
        # With a filter, the matching keys are found in the terms index (driven from the
        # rarest term, in checkpoint order, stopping at the limit) and, on SQLite, in the
        # pending terms, then their checkpoints are read; without one, the checkpoints
        # table is walked.
        alias = "t0" if terms else "c"
        where, params = self._list_where(alias, config, before, until)
        if terms:
            where[:0] = [self.sql.LIST_FIRST_TERM] + [self.sql.LIST_TERM] * (len(terms) - 1)
            params[:0] = terms
        # With pending terms (SQL.PENDING_TERMS), matches come from the index and from
        # the pending rows, which the same conditions then select.
        pending = bool(terms) and self.sql.PENDING_TERMS
        if pending:
            where.append(self.sql.LIST_NOT_PENDING)
        sql = self.sql.LIST_KEYS_BY_TERM if terms else self.sql.LIST_SELECT
        if where:
            sql += " WHERE " + _all_of(where)
        # A literal, not a placeholder: PostgreSQL estimates a LIMIT it cannot see as a
        # tenth of the rows, so it re-planned a filtered list at every call (120 us, more
        # than running it) rather than keep its generic plan. int() leaves nothing but
        # digits and a sign to put in the text.
        limited = "" if limit is None else f" LIMIT {int(limit)}"
        sql += f" ORDER BY {alias}.checkpoint_id DESC{limited}"
        if pending:
            more, more_params = self._list_where("p", config, before, until)
            sql = (
                self.sql.LIST_PENDING_KEYS.format(indexed=sql)
                + " AND "
                + _all_of([self.sql.PENDING_TERM] * len(terms) + more)
            )
            sql += f" ORDER BY checkpoint_id DESC{limited}"
            params += [self.sql.pending_term(term) for term in terms] + more_params
            sql = self.sql.LIST_FROM_KEYS.format(keys=sql)
        elif terms:
            sql = self.sql.LIST_SELECT + self.sql.LIST_IN_KEYS.format(keys=sql)
        rows = yield Query(sql, params, fetch=True)
        if not rows:
            return []
        try:
            return (yield from self._assemble(rows))
        except CorruptDataError:
            if pages is None or len(rows) == 1:
                raise
        # A damaged checkpoint in the page: the ones before it (newer) are handed out
        # first, then its error (ListPages.error), as for one in a later page.
        good: list[CheckpointTuple] = []
        for row in rows:
            try:
                good += yield from self._assemble([row])
            except CorruptDataError as exc:
                pages.error = exc
                break
        return good

    @staticmethod
    def _list_where(
        alias: str,
        config: RunnableConfig | None,
        before: RunnableConfig | None,
        until: str | None = None,
    ) -> tuple[list[str], list[Any]]:
        """A list's conditions on the keys of table ``alias``, and their parameters."""
        where: list[str] = []
        params: list[Any] = []
        if config is not None:
            thread_id, ns, checkpoint_id = config_keys(config, "list's config", thread=False)
            conf = config["configurable"]
            if "thread_id" in conf:
                where.append(f"{alias}.thread_id = ?")
                params.append(thread_id)
            if conf.get("checkpoint_ns") is not None:
                where.append(f"{alias}.checkpoint_ns = ?")
                params.append(ns)
            if checkpoint_id:
                where.append(f"{alias}.checkpoint_id = ?")
                params.append(checkpoint_id)
        if before is not None and (
            before_id := config_keys(before, "list's before", thread=False)[2]
        ):
            where.append(f"{alias}.checkpoint_id < ?")
            params.append(before_id)
        if until is not None:
            where.append(f"{alias}.checkpoint_id <= ?")
            params.append(until)
        return where, params

    _term_stats: tuple[float, dict[str, float]] | None = None

    def _rarest_first(self, terms: list[str]) -> Operation[list[str]]:
        """A filter's terms, the rarest first (the list is driven from it).

        Where the database keeps statistics (PostgreSQL: the column's most common values
        and their frequencies, refreshed by autovacuum, read at most once a minute), a
        common term is ranked by its frequency, without counting its rows: a count
        visits each index entry, and its table row too until the table is vacuumed.
        The other terms are rarer than any common one; when several are left they are
        counted, up to 2,000 (an index range scan).
        """
        frequency: dict[str, float] = {}
        if self.sql.TERM_STATS:
            now = time.monotonic()
            cached = self._term_stats
            if cached is None or now - cached[0] > _TERM_STATS_TTL:
                rows = yield Query(self.sql.TERM_STATS, fetch=True)
                values, freqs = rows[0] if rows else (None, None)
                cached = (now, dict(zip(values or (), freqs or (), strict=False)))
                self._term_stats = cached
            frequency = {t: cached[1][t] for t in terms if t in cached[1]}
        rare = [t for t in terms if t not in frequency]
        counts: dict[str, int] = {}
        if len(rare) > 1:
            # A column per term, at most 500 a statement (SQLite allows 2,000 columns).
            parts = [rare[i : i + 500] for i in range(0, len(rare), 500)]
            count = self.sql.TERM_COUNT
            answers = yield from batch(
                [Query("SELECT " + ", ".join([count] * len(p)), p, fetch=True) for p in parts]
            )
            for part, rows in zip(parts, answers, strict=True):
                counts.update(zip(part, rows[0], strict=True))
        # Ties (both past the count's cap): LangGraph's own keys with few values last.
        return sorted(
            terms,
            key=lambda t: (
                t in frequency,
                frequency.get(t, 0.0),
                counts.get(t, 0),
                t.startswith(_COMMON_KEYS),
                t,
            ),
        )

    def _assemble(
        self, rows: Rows, fetched: _Fetched | None = None
    ) -> Operation[list[CheckpointTuple]]:
        """Turn checkpoint rows into tuples, fetching their values and pending writes
        (those of a single row may have been ``fetched`` with it already).

        Values are fetched once per (thread, namespace) and decoded once per
        (channel, version), however many of the rows share them.
        """
        decoded: list[
            tuple[tuple[str, str, str], str | None, dict[str, Any], Any, dict[str, Any]]
        ] = []
        wanted: dict[tuple[str, str], set[tuple[str, str]]] = {}
        ids: dict[tuple[str, str], list[str]] = {}
        for thread_id, ns, checkpoint_id, parent_id, cp_type, cp_data, m_type, m_data in rows:
            key = (thread_id, ns, checkpoint_id)
            rest = self._load_checkpoint(cp_type, cp_data, key)
            meta = self._load_metadata(m_type, m_data, key)
            bases = rest.pop(BASES_KEY, None) or {}
            inline = rest.pop(INLINE_KEY, None) or {}
            if bases:
                self.list_deltas.learn(thread_id, ns, bases, rest.get("channel_versions", {}))
            decoded.append((key, parent_id, rest, meta, inline))
            pairs = wanted.setdefault((thread_id, ns), set())
            pairs.update(
                (ch, str(v))
                for ch, v in rest.get("channel_versions", {}).items()
                if ch not in inline
            )
            pairs.update((ch, str(v)) for ch, chain in bases.items() for v in chain)
            ids.setdefault((thread_id, ns), []).append(checkpoint_id)

        # One query for the values and one for the writes of all rows, whatever threads
        # they come from (a filtered list spans many), sent together.
        if fetched is None:
            keys = [(t, ns, cid) for (t, ns), id_list in ids.items() for cid in id_list]
            write_queries = list(self._key_queries(keys, self.sql.SELECT_WRITES_ANY))
            values, write_answers = yield from self._fetch_blobs_of(wanted, write_queries)
        else:
            values, _ = yield from self._fetch_blobs_of(wanted, (), {tn: fetched for tn in wanted})
            write_answers = [fetched.writes]

        writes: dict[tuple[str, str, str], list[tuple[tuple[str, str, int], PendingWrite]]] = {}
        for write_rows in write_answers:
            for (
                thread_id,
                ns,
                checkpoint_id,
                task_id,
                channel,
                type_,
                data,
                path,
                idx,
            ) in write_rows:
                key = (thread_id, ns, checkpoint_id)
                value = self._load(type_, data, f"pending write {channel!r}", key)
                writes.setdefault(key, []).append(
                    (writes_sort_key(path, task_id, idx), (task_id, channel, value))
                )

        caches: dict[tuple[str, str], _Decoded] = {}
        # A value shared by several of the rows (decoded once) is given to each but the
        # first as a copy, as reading it again would: a caller, or a reducer LangGraph
        # applies in place to a checkpoint's pending writes, changing one checkpoint's
        # list must not change another's. (Their items stay shared, as do a list's
        # versions' items.)
        handed: set[int] = set()
        result = []
        for key, parent_id, rest, meta, inline in decoded:
            thread_id, ns, checkpoint_id = key
            found = values[(thread_id, ns)]
            ns_cache = caches.get((thread_id, ns))
            if ns_cache is None:
                ns_cache = caches[(thread_id, ns)] = _Decoded(lazy=len(decoded) == 1)
            channel_values = dict(inline)
            for channel, version in rest.get("channel_versions", {}).items():
                if channel in inline:
                    continue
                pair = (channel, str(version))
                if pair not in found:
                    continue
                value = self._value(found, pair, key, ns_cache)
                if type(value) in _CONTAINERS:
                    if id(value) in handed:
                        value = copy.copy(value)
                    else:
                        handed.add(id(value))
                channel_values[channel] = value
            checkpoint = cast(Checkpoint, {**rest, "channel_values": channel_values})
            pending = [w for _, w in sorted(writes.get(key, []), key=lambda item: item[0])]
            result.append(
                CheckpointTuple(
                    config={
                        "configurable": {
                            "thread_id": thread_id,
                            "checkpoint_ns": ns,
                            "checkpoint_id": checkpoint_id,
                        }
                    },
                    checkpoint=checkpoint,
                    metadata=cast(CheckpointMetadata, meta),
                    parent_config=(
                        {
                            "configurable": {
                                "thread_id": thread_id,
                                "checkpoint_ns": ns,
                                "checkpoint_id": parent_id,
                            }
                        }
                        if parent_id
                        else None
                    ),
                    pending_writes=pending,
                )
            )
        return result

    def _key_queries(self, keys: Sequence[tuple[str, ...]], sql: str) -> Iterable[Query]:
        """Queries looking ``keys`` up with ``sql`` (a ``SQL.SELECT_*_ANY``), in chunks."""
        unique = list(dict.fromkeys(keys))  # a key twice would return its rows twice
        if not unique:
            return
        row = "(" + ", ".join("?" * len(unique[0])) + ")"
        for chunk in _chunks(unique):
            params = [x for key in chunk for x in key]
            yield Query(sql.format(rows=", ".join([row] * len(chunk))), params, fetch=True)

    def _fetch_blobs(
        self, thread_id: str, ns: str, pairs: Iterable[tuple[str, str]]
    ) -> Operation[dict[tuple[str, str], tuple[str, Any]]]:
        """Stored values of one (thread, namespace) by (channel, version)."""
        found, _ = yield from self._fetch_blobs_of({(thread_id, ns): set(pairs)})
        return found.get((thread_id, ns), {})

    def _fetch_blobs_of(
        self,
        wanted: Mapping[tuple[str, str], Iterable[tuple[str, str]]],
        extra: Sequence[Query] = (),
        fetched: Mapping[tuple[str, str], _Fetched] | None = None,
    ) -> Operation[
        tuple[dict[tuple[str, str], dict[tuple[str, str], tuple[str, Any]]], list[Rows]]
    ]:
        """Stored values, per (thread, namespace), by (channel, version), without "empty"
        ones, plus the snapshots their delta rows need: primary-key look-ups, and one
        more round only for snapshots the caller did not already ask for. The ``extra``
        queries go out with the first round; their rows are returned too. What was
        ``fetched`` already is not looked up again."""
        found: dict[tuple[str, str], dict[tuple[str, str], tuple[str, Any]]] = {
            tn: {} for tn in wanted
        }
        todo: set[tuple[str, str, str, str]] = set()
        for (t, ns), pairs in wanted.items():
            done = fetched.get((t, ns)) if fetched else None
            if done is not None:
                found[(t, ns)].update(
                    (pair, row) for pair, row in done.blobs.items() if row[0] != _EMPTY
                )
            asked = done.asked if done is not None else ()
            todo.update((t, ns, ch, v) for ch, v in pairs if (ch, v) not in asked)
        extra_rows: list[Rows] | None = None
        while todo or extra_rows is None:
            queries = list(self._key_queries(sorted(todo), self.sql.SELECT_BLOBS_ANY))
            n_blobs = len(queries)
            if extra_rows is None:
                queries += extra
            answers = (yield from batch(queries)) if queries else []
            if extra_rows is None:
                extra_rows = answers[n_blobs:]
            for rows in answers[:n_blobs]:
                for thread_id, ns, channel, version, type_, data in rows:
                    if type_ != _EMPTY:
                        found[(thread_id, ns)][(channel, version)] = (type_, data)
            todo = set()
            for (thread_id, ns), by_pair in found.items():
                for (channel, version), (type_, data) in list(by_pair.items()):
                    if type_.startswith(DELTA) and not isinstance(data, _Header):
                        header = self._delta_header(type_, data, (thread_id, ns, channel), version)
                        by_pair[(channel, version)] = (type_, header)
                        if (channel, header.base_version) not in by_pair:
                            todo.add((thread_id, ns, channel, header.base_version))
        return found, extra_rows

    def _delta_header(
        self, type_: str, data: Any, where: tuple[str, str, str], version: str
    ) -> _Header:
        thread_id, ns, channel = where
        try:
            inner_type, packed = self.codec.decode(type_, data)
            base, shift, tail_type, tail = unpack_delta(packed)
        except Exception as exc:
            raise CorruptDataError(
                f"cannot read the stored version {version!r} of channel {channel!r} in "
                f"thread {thread_id!r} (namespace {ns!r}): {exc}"
            ) from exc
        return _Header(base, shift, tail_type, tail)

    def _value(
        self,
        found: Mapping[tuple[str, str], tuple[str, Any]],
        pair: tuple[str, str],
        where: tuple[str, str, str],
        decoded: _Decoded,
    ) -> Any:
        """The value stored at (channel, version), decoded once per read, a delta
        rebuilt from the version before it."""
        value = self._stored(found, pair, where, decoded)
        if type(value) is _Rows:
            return self._messages(value, pair[0], where)
        return value

    def _stored(
        self,
        found: Mapping[tuple[str, str], tuple[str, Any]],
        pair: tuple[str, str],
        where: tuple[str, str, str],
        decoded: _Decoded,
    ) -> Any:
        """``_value``, but, when ``decoded.lazy``, a message list is left as its rows: a
        version built from another keeps only the rows it needs, so the messages a
        window slid past (up to one per delta along the chain) are never built. A read
        of several checkpoints decodes eagerly: the versions along a chain are then
        mostly returned too, and share the messages of the one they are built from."""
        cache = decoded.values
        if pair in cache:
            return cache[pair]
        channel = pair[0]
        type_, data = found[pair]
        if isinstance(data, _Header):
            base_pair = (channel, data.base_version)
            if base_pair not in found:
                raise _unreadable(
                    f"channel {channel!r}",
                    where,
                    f"the stored version it is built from, {data.base_version!r}, is missing",
                )
            building = decoded.building
            if pair in building:  # a damaged chain that comes back to a version on it
                raise _unreadable(
                    f"channel {channel!r}",
                    where,
                    f"its stored version {pair[1]!r} is built on itself",
                )
            building.add(pair)
            try:
                base = self._stored(found, base_pair, where, decoded)
            finally:
                building.discard(pair)
            if type(base) is _Rows and data.tail_type == MESSAGE_LIST:
                # Rows on rows (a chat's deltas): no message is made yet.
                try:
                    rows = message_rows(data.tail, self._rows_hook())
                except Exception as exc:
                    raise _unreadable(f"channel {channel!r}", where, exc) from exc
                value: Any = _Rows([*base.rows[data.shift :], *rows])
            else:
                head: list[Any] = (
                    self._messages(_Rows(base.rows[data.shift :]), channel, where)
                    if type(base) is _Rows
                    else base[data.shift :]
                )
                tail = self._load(
                    data.tail_type, data.tail, f"channel {channel!r}", where, row=False
                )
                value = [*head, *tail]
        else:
            value = self._load(type_, data, f"channel {channel!r}", where, lazy=decoded.lazy)
        cache[pair] = value
        return value

    def _messages(self, value: _Rows, channel: str, where: tuple[str, str, str]) -> list[Any]:
        try:
            return revive_rows(value.rows)
        except Exception as exc:
            raise _unreadable(f"channel {channel!r}", where, exc) from exc

    def _delta_channel_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Operation[dict[str, DeltaChannelHistory]]:
        """Writes and seed per channel along the parent chain, in a constant number of
        queries: one recursive query for the chain, one for the writes, one for seeds."""
        result: dict[str, DeltaChannelHistory] = {ch: {"writes": []} for ch in channels}
        if not channels:
            return result
        thread_id, ns, checkpoint_id = config_keys(config, "get_delta_channel_history's config")
        if not checkpoint_id:
            rows = yield Query(self.sql.SELECT_LATEST_CHECKPOINT, (thread_id, ns), fetch=True)
            if not rows:
                return result
            checkpoint_id = rows[0][2]
        rows = yield Query(
            self.sql.SELECT_CHAIN,
            (thread_id, ns, checkpoint_id, thread_id, ns, thread_id, ns),
            fetch=True,
        )
        chain = _parent_chain(rows, checkpoint_id, (thread_id, ns))
        if len(chain) < 2:
            return result
        ancestors = chain[1:]  # the target's own writes are pending for its next step
        # Which ancestors each channel needs: up to and including its seed (a stored
        # value: a row of its own, or a small one inside the ancestor's checkpoint row).
        blob_keys: dict[str, list[tuple[int, str]]] = {ch: [] for ch in channels}
        inlined: dict[tuple[str, int], Any] = {}
        for depth, (cid, _parent, cp_type, cp_data) in enumerate(ancestors):
            rest = self._load_checkpoint(cp_type, cp_data, (thread_id, ns, cid))
            versions = rest.get("channel_versions", {})
            inline = rest.get(INLINE_KEY) or {}
            for ch in channels:
                if ch in inline:
                    inlined[(ch, depth)] = inline[ch]
                if ch in versions:
                    blob_keys[ch].append((depth, str(versions[ch])))
        pairs = sorted({(ch, v) for ch in channels for _, v in blob_keys[ch]})
        stored = yield from self._fetch_blobs(thread_id, ns, pairs)
        seed_depth: dict[str, int] = {}
        for ch in channels:
            for depth, version in blob_keys[ch]:
                if (ch, depth) in inlined:
                    seed_depth[ch] = depth
                    result[ch]["seed"] = inlined[(ch, depth)]
                    break
                if (ch, version) in stored:
                    seed_depth[ch] = depth
                    key = (thread_id, ns, ancestors[depth][0])
                    result[ch]["seed"] = self._value(
                        stored, (ch, version), key, _Decoded(lazy=True)
                    )
                    break
        deepest = max((seed_depth.get(ch, len(ancestors) - 1) for ch in channels), default=0)
        depth_of = {row[0]: d for d, row in enumerate(ancestors[: deepest + 1])}
        id_list = list(depth_of)
        collected: dict[str, list[tuple[int, tuple[str, str, int], PendingWrite]]] = {
            ch: [] for ch in channels
        }
        for chunk in _chunks(id_list):
            write_rows = yield Query(
                self.sql.SELECT_WRITES_FOR_CHANNELS.format(
                    ids=in_list(len(chunk)), channels=in_list(len(channels))
                ),
                (thread_id, ns, *chunk, *channels),
                fetch=True,
            )
            for cid, task_id, channel, type_, data, task_path, idx in write_rows:
                depth = depth_of[cid]
                if depth > seed_depth.get(channel, len(ancestors)):
                    continue  # older than the seed: already folded into it
                value = self._load(type_, data, f"pending write {channel!r}", (thread_id, ns, cid))
                collected[channel].append(
                    (depth, writes_sort_key(task_path, task_id, idx), (task_id, channel, value))
                )
        for ch in channels:
            # oldest checkpoint first; within one checkpoint, live execution order
            ordered = sorted(collected[ch], key=lambda item: (-item[0], item[1]))
            result[ch]["writes"] = [w for _, _, w in ordered]
        return result
