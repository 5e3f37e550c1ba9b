"""Growing lists stored as what changed, not the whole list again.

A chat's ``messages`` channel gets one or two messages longer at each step, or slides a
window along; storing the whole list at every version makes storage grow with the square
of the conversation and every ``put`` slower than the last. For such a list, a version is
stored as a *delta* of the version before it:

    delta = (previous version, d, tail)      value = previous[d:] + tail

After ``snapshot_every`` deltas in a row (more for a long list: one per 8 items, up to
``max_chain``), or when the tail would be large, the next version is stored whole (a
*snapshot*), so reading a version takes at most that many rows and one; the checkpoint
names them all (its ``_ac_bases`` entry), so one query fetches them. A longer list gets
a longer chain because its snapshot costs more to write, while what a delta adds to a
read stays the same: a put then writes about 8 items' worth of snapshot on average,
whatever the length, and the chain stays a small part of a read (on the benchmark's
machine a 200-message version reads in 1.1-1.3 ms, each delta adding about 5 µs).

The saver remembers, per (thread, namespace, channel), the latest version it wrote in this
process: each item's type and a shallow copy of what it holds (a message's fields and
extra fields, a dict's entries), as they were when stored. An item is unchanged if its
type and those are equal now: a graph may change an item in place (a message's content,
a dict's key) and hand back the very same object, and 1, 1.0 and True are equal but are
not the same value; a thread read back from the database (the next turn of a chat) holds
equal copies. Strings, ints, bools, bytes, None, UUIDs and enum members are compared by
value; floats, dates, times and decimals by their exact text (``==`` is not exact for
them: ``-0.0 == 0.0``); any other item that is not a dict, a list or a model (a tuple,
an object of a class of its own) by identity.
Comparing whole serialized items would cost every put the serialization of the whole
list, which deltas are there to avoid; a change made in place deeper inside an item
(appending to a message's list of tool calls) is not seen: hand back a new object for
that, as LangGraph's reducers do. A new process (or a fork from an old checkpoint it
does not remember) simply starts with a snapshot: deltas are an optimization, never
needed for correctness.
Before a delta is stored, the put checks that the rows it is built from still exist:
another saver (another process) may have deleted or pruned the thread.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import operator
import sys
import threading
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ormsgpack
from pydantic import BaseModel

__all__ = ["DELTA", "BASES_KEY", "Delta", "ListDeltas", "pack_delta", "unpack_delta"]

DELTA = "delta"  # type tag of a delta row (before the codec's suffixes)
# In a stored checkpoint: {channel: [versions]}, the rows a delta-stored version is
# built from (its snapshot first).
BASES_KEY = "_ac_bases"


@dataclass(frozen=True)
class Delta:
    """A version of a list stored as ``previous[shift:] + tail``; ``chain`` lists the
    versions it is built from, its snapshot first, ``base_version`` last."""

    base_version: str
    shift: int
    tail: list[Any]
    chain: tuple[str, ...]


def pack_delta(base_version: str, shift: int, tail_type: str, tail: bytes) -> bytes:
    return ormsgpack.packb([base_version, shift, tail_type, tail])


def unpack_delta(data: bytes) -> tuple[str, int, str, bytes]:
    base_version, shift, tail_type, tail = ormsgpack.unpackb(data)
    return str(base_version), int(shift), str(tail_type), bytes(tail)


@dataclass(frozen=True)
class _Latest:
    """The latest version written of a channel: its items' types and what they held
    then (see :func:`states_of`), and what it is built from."""

    version: str
    types: list[type]
    states: list[Any]
    chain: tuple[str, ...]


# What an item of a type holds, for comparing it with what it held when stored:
_SAME = 0  # the item itself, compared by ==, which is exact for these (str, int, None...)
_ENTRIES = 1  # a dict's or a list's entries
_FIELDS = 2  # a pydantic model's or a dataclass's fields (its __dict__): a message's
_MODEL = 3  # a pydantic model that allows extra fields (a message): its fields and extras
# An item whose == is not exact (-0.0 == 0.0, a time == the same instant in another zone,
# Decimal("4.0") == Decimal("4"), all stored differently) is compared by what is stored of
# it (its text: float.hex, isoformat, str), so that an equal copy read back still is.
_TEXT = 5
# Any other item (a tuple, an object of a class of its own) is compared by identity.
_OTHER = 4
_EXACT = frozenset({str, int, bool, bytes, type(None), uuid.UUID})
_AS_TEXT: dict[type, Callable[[Any], str]] = {
    float: float.hex,
    datetime.datetime: datetime.datetime.isoformat,
    datetime.date: datetime.date.isoformat,
    datetime.time: datetime.time.isoformat,
    datetime.timedelta: repr,
    decimal.Decimal: str,
}
_KINDS: dict[type, int] = {}
# Where a model's extra fields go in its state: no field name is a tuple.
_EXTRA_KEY = ("__pydantic_extra__",)


def _kind(kind: type) -> int:
    found = _KINDS.get(kind)
    if found is None:
        if kind is dict or kind is list:
            found = _ENTRIES
        elif issubclass(kind, BaseModel):
            found = _MODEL if kind.model_config.get("extra") == "allow" else _FIELDS
        elif dataclasses.is_dataclass(kind) and getattr(kind, "__dictoffset__", 0) != 0:
            # Instances with a __dict__ (a class's __slots__ may be inherited, from
            # Generic or ABC, while its instances still have one).
            found = _FIELDS
        elif kind in _EXACT or issubclass(kind, enum.Enum):  # members are singletons
            found = _SAME
        else:
            found = _TEXT if kind in _AS_TEXT else _OTHER
        _KINDS[kind] = found
    return found


class _Ident:
    """An item compared by identity (see ``_OTHER``); holding it keeps its id unique."""

    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item

    def __eq__(self, other: object) -> bool:
        return type(other) is _Ident and other.item is self.item

    __hash__ = None  # type: ignore[assignment]


_DICT_OF = operator.attrgetter("__dict__")
_EXTRA_OF = operator.attrgetter("__pydantic_extra__")


def _with_extras(item: Any) -> Any:
    """A model's state: its ``__dict__``, or a copy with its extra fields too."""
    extra = item.__pydantic_extra__
    if not extra:
        return item.__dict__
    state = dict(item.__dict__)
    state[_EXTRA_KEY] = dict(extra)
    return state


def _state(item: Any) -> Any:
    kind = _kind(type(item))
    if kind == _FIELDS:
        return item.__dict__
    if kind == _MODEL:
        return _with_extras(item)
    if kind == _TEXT:
        return _AS_TEXT[type(item)](item)
    return _Ident(item) if kind == _OTHER else item


def states_of(items: Sequence[Any], types: Sequence[type]) -> list[Any]:
    """What each item holds now, not copied: a dict or list itself, a model's
    ``__dict__`` (with its extra fields, if it has any), the item, or the item to be
    compared by identity (see :func:`snapshot`)."""
    kinds = {_kind(kind) for kind in set(types)}
    if kinds == {_MODEL}:  # a list of messages
        if any(map(_EXTRA_OF, items)):
            return list(map(_with_extras, items))
        return list(map(_DICT_OF, items))
    if kinds == {_FIELDS}:
        return list(map(_DICT_OF, items))
    if kinds <= {_SAME, _ENTRIES}:
        return list(items)
    return list(map(_state, items))


def snapshot(state: Any, kind: type) -> Any:
    """A shallow copy of a state from :func:`states_of`, kept to compare with later."""
    return state if _kind(kind) in (_SAME, _OTHER, _TEXT) else state.copy()


def window_shift(
    old_types: Sequence[type],
    old_states: Sequence[Any],
    new_types: Sequence[type],
    new_states: Sequence[Any],
    max_shift: int,
) -> int | None:
    """The ``d`` such that the new items start with the old ones from ``d`` on (the old
    list slid by ``d``, then extended), for ``d <= max_shift`` with some overlap left;
    None if there is none. Items match if their types are the same and their states
    (:func:`states_of`; kept as :func:`snapshot` for the old list) are equal: lists
    compared in C, identity first. One that cannot be compared (a numpy array) matches
    nothing."""
    old_types, old_states, new_types, new_states = (
        x if type(x) is list else list(x) for x in (old_types, old_states, new_types, new_states)
    )
    try:
        for d in range(min(max_shift, len(old_types) - 1) + 1):
            n = len(old_types) - d
            if (
                n <= len(new_types)
                and old_types[d] is new_types[0]
                and old_states[d] == new_states[0]
                # Slices are copies: the old list whole where it can be (a list that grew).
                and (old_types if d == 0 else old_types[d:]) == new_types[:n]
                and (old_states if d == 0 else old_states[d:]) == new_states[:n]
            ):
                return d
    except Exception:  # an ambiguous comparison (arrays): store the list whole
        return None
    return None


class ListDeltas:
    """Decides, per channel version, whether a list is stored whole or as a delta.

    Args:
        min_length: lists shorter than this are always stored whole.
        snapshot_every: a snapshot after this many deltas, or one per ``items_per_delta``
            items of the list if that is more, up to ``max_chain``.
        max_shift: how far a window may slide between a snapshot and a delta.
        size: how many (thread, namespace, channel) snapshots to remember.
    """

    def __init__(
        self,
        *,
        min_length: int = 8,
        snapshot_every: int = 8,
        items_per_delta: int = 8,
        max_chain: int = 32,
        max_shift: int = 64,
        size: int = 512,
    ) -> None:
        self.min_length = min_length
        self.snapshot_every = snapshot_every
        self.items_per_delta = items_per_delta
        self.max_chain = max_chain
        self.max_shift = max_shift
        self.size = size
        self._latest: OrderedDict[tuple[str, str, str], _Latest] = OrderedDict()
        self._chains: OrderedDict[tuple[str, str, str, str], tuple[str, ...]] = OrderedDict()
        # How many of those each (thread, namespace) has: most puts are of a graph with
        # no list stored as deltas, whose channels need no look-up (see bases).
        self._chained: Counter[tuple[str, str]] = Counter()
        # Counts the threads cleared: a put planned before a concurrent delete or prune
        # (and committed after it) must not leave a base behind whose rows may be gone.
        # One counter for all threads (bounded memory): a clear only costs the puts in
        # flight a snapshot instead of a delta next time.
        self._clears = 0
        self._lock = threading.Lock()

    def plan(
        self, key: tuple[str, str, str], version: str, value: Any
    ) -> tuple[Delta | None, Callable[[], None] | None]:
        """How to store ``value`` at ``version``: a delta, or None to store it whole;
        and what to remember once it is stored (call it after the write succeeded, so a
        failed write leaves nothing behind to build on that does not exist)."""
        if not isinstance(value, list) or len(value) < self.min_length:
            return None, None
        with self._lock:
            latest = self._latest.get(key)
            clears = self._clears
        types = list(map(type, value))
        states = states_of(value, types)
        kept: list[Any] = []  # snapshots of the items kept from the latest version
        chain: tuple[str, ...] = ()
        delta = None
        if latest is not None and latest.version != version:
            shift = window_shift(latest.types, latest.states, types, states, self.max_shift)
            if shift is not None:
                kept = latest.states[shift:]  # equal to what those items hold now
                tail = value[len(kept) :]
                if len(latest.chain) < self.chain_limit(len(value)) and len(tail) <= max(
                    self.snapshot_every, len(value) // 4
                ):
                    chain = (*latest.chain, latest.version)
                    delta = Delta(latest.version, shift, list(tail), chain)
        # Copied now: the graph may change the items in place once this put returns.
        snapshots = kept + [snapshot(states[i], types[i]) for i in range(len(kept), len(value))]

        def remember() -> None:
            with self._lock:
                if self._clears != clears:
                    return  # a thread was deleted or pruned meanwhile
                self._latest[key] = _Latest(version, types, snapshots, chain)
                self._latest.move_to_end(key)
                while len(self._latest) > self.size:
                    self._latest.popitem(last=False)
                if chain:
                    self._keep_chain(key + (version,), chain)

        return delta, remember

    def chain_limit(self, length: int) -> int:
        """How many deltas in a row a list of ``length`` items may be stored as."""
        return max(self.snapshot_every, min(self.max_chain, length // self.items_per_delta))

    def clear_thread(self, thread_id: str) -> None:
        """Forget everything of a thread (deleted or pruned: its rows may be gone)."""
        with self._lock:
            self._clears += 1
            for key in [k for k in self._latest if k[0] == thread_id]:
                del self._latest[key]
            for ckey in [k for k in self._chains if k[0] == thread_id]:
                del self._chains[ckey]
            for tkey in [k for k in self._chained if k[0] == thread_id]:
                del self._chained[tkey]

    def learn(
        self,
        thread_id: str,
        ns: str,
        bases: Mapping[str, Sequence[str]],
        versions: Mapping[str, Any],
    ) -> None:
        """Remember the rows the versions of a checkpoint just read are built from (its
        ``_ac_bases``): a checkpoint this process writes next that keeps such a version
        (one that does not change the list: update_state, an input) names them too, so
        that reading it stays one query, even in a process that did not write them."""
        with self._lock:
            for channel, chain in bases.items():
                version = versions.get(channel)
                if version is None or not isinstance(chain, (list, tuple)) or not chain:
                    continue
                if not all(type(v) is str for v in chain):
                    continue  # not what a saver writes: no hint is better than a bad one
                key = (thread_id, ns, channel, str(version))
                if key not in self._chains:
                    # Interned: the chains read of one thread repeat the same versions
                    # (decoded anew at each read), as those a saver writes share them.
                    self._keep_chain(key, tuple(map(sys.intern, chain)))

    def _keep_chain(self, key: tuple[str, str, str, str], chain: tuple[str, ...]) -> None:
        """Remember a version's chain, forgetting the oldest beyond the bound (under the
        lock)."""
        if key not in self._chains:
            self._chained[key[:2]] += 1
        self._chains[key] = chain
        while len(self._chains) > self.size * 16:
            old = self._chains.popitem(last=False)[0][:2]
            self._chained[old] -= 1
            if not self._chained[old]:
                del self._chained[old]

    def bases(self, thread_id: str, ns: str, versions: dict[str, Any]) -> dict[str, list[str]]:
        """For a checkpoint's channel versions: the rows each delta-stored version is built
        from, where known (so that one query can fetch them all)."""
        with self._lock:
            found: dict[str, list[str]] = {}
            if (thread_id, ns) not in self._chained:
                return found
            for channel, version in versions.items():
                chain = self._chains.get((thread_id, ns, channel, str(version)))
                if chain:
                    found[channel] = list(chain)
            return found
