"""Growing lists stored as what changed, not the whole list again.

A chat's ``messages`` channel gets one or two messages longer at each step, or slides a
window along; storing the whole list at every version makes storage grow with the square
of the conversation and every ``put`` slower than the last. For such a list, a version is
stored as a *delta* from the channel's latest *snapshot* (a version stored whole):

    delta = (snapshot version, d, tail)      value = snapshot[d:] + tail

so reading any version takes at most two stored rows, which the checkpoint names (its
``_ac_bases`` entry), so one query fetches both. After ``snapshot_every`` deltas, or when
the tail would be large, the next version is a snapshot again, so a delta stays small.

The saver remembers, per (thread, namespace, channel), the latest snapshot it wrote in this
process. A new process (or a fork from an old checkpoint it does not remember) simply
starts with a snapshot: deltas are an optimization, never needed for correctness.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ormsgpack

__all__ = ["DELTA", "BASES_KEY", "Delta", "ListDeltas", "pack_delta", "unpack_delta"]

DELTA = "delta"  # type tag of a delta row (before the codec's suffixes)
BASES_KEY = "_ac_bases"  # in a stored checkpoint: {channel: snapshot version} for deltas


@dataclass(frozen=True)
class Delta:
    """A version of a list stored as ``snapshot[shift:] + tail``."""

    base_version: str
    shift: int
    tail: list[Any]


def pack_delta(base_version: str, shift: int, tail_type: str, tail: bytes) -> bytes:
    return ormsgpack.packb([base_version, shift, tail_type, tail])


def unpack_delta(data: bytes) -> tuple[str, int, str, bytes]:
    base_version, shift, tail_type, tail = ormsgpack.unpackb(data)
    return str(base_version), int(shift), str(tail_type), bytes(tail)


@dataclass
class _Snapshot:
    version: str
    items: list[Any]
    deltas: int = 0


def _same(a: Any, b: Any) -> bool:
    return a is b or bool(a == b)


def window_shift(old: Sequence[Any], new: Sequence[Any], max_shift: int) -> int | None:
    """The ``d`` such that ``new`` starts with ``old[d:]`` (``old`` slid by ``d``, then
    extended), for ``d <= max_shift`` with some overlap left; None if there is none."""
    for d in range(min(max_shift, len(old) - 1) + 1):
        overlap = len(old) - d
        if overlap > len(new) or not _same(old[d], new[0]):
            continue
        if all(_same(a, b) for a, b in zip(old[d:], new[:overlap], strict=False)):
            return d
    return None


class ListDeltas:
    """Decides, per channel version, whether a list is stored whole or as a delta.

    Args:
        min_length: lists shorter than this are always stored whole.
        snapshot_every: a snapshot after this many deltas.
        max_shift: how far a window may slide between a snapshot and a delta.
        size: how many (thread, namespace, channel) snapshots to remember.
    """

    def __init__(
        self,
        *,
        min_length: int = 8,
        snapshot_every: int = 8,
        max_shift: int = 64,
        size: int = 512,
    ) -> None:
        self.min_length = min_length
        self.snapshot_every = snapshot_every
        self.max_shift = max_shift
        self.size = size
        self._snapshots: OrderedDict[tuple[str, str, str], _Snapshot] = OrderedDict()
        self._bases: OrderedDict[tuple[str, str, str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def plan(
        self, key: tuple[str, str, str], version: str, value: Any
    ) -> tuple[Delta | None, Callable[[], None] | None]:
        """How to store ``value`` at ``version``: a delta, or None to store it whole;
        and what to remember once it is stored (call it after the write succeeded, so a
        failed write leaves no snapshot behind that does not exist)."""
        if not isinstance(value, list) or len(value) < self.min_length:
            return None, None
        with self._lock:
            snap = self._snapshots.get(key)
        if snap is not None and snap.version != version and snap.deltas < self.snapshot_every:
            shift = window_shift(snap.items, value, self.max_shift)
            if shift is not None:
                tail = value[len(snap.items) - shift :]
                if len(tail) <= max(self.snapshot_every, len(value) // 4):
                    base = snap.version

                    def remember_delta() -> None:
                        with self._lock:
                            snap.deltas += 1
                            self._bases[key + (version,)] = base
                            while len(self._bases) > self.size * 16:
                                self._bases.popitem(last=False)

                    return Delta(base, shift, list(tail)), remember_delta
        items = list(value)

        def remember_snapshot() -> None:
            # Stored whole: it becomes the snapshot later versions are deltas of.
            with self._lock:
                self._snapshots[key] = _Snapshot(version, items)
                self._snapshots.move_to_end(key)
                while len(self._snapshots) > self.size:
                    self._snapshots.popitem(last=False)

        return None, remember_snapshot

    def forget(self, key: tuple[str, str, str]) -> None:
        """Forget a channel's snapshot (its rows may be gone)."""
        with self._lock:
            self._snapshots.pop(key, None)

    def clear_thread(self, thread_id: str) -> None:
        """Forget every snapshot of a thread (deleted or pruned)."""
        with self._lock:
            for key in [k for k in self._snapshots if k[0] == thread_id]:
                del self._snapshots[key]
            for bkey in [k for k in self._bases if k[0] == thread_id]:
                del self._bases[bkey]

    def bases(self, thread_id: str, ns: str, versions: dict[str, Any]) -> dict[str, str]:
        """For a checkpoint's channel versions: the snapshot each delta version needs,
        where known (so that one query can fetch both)."""
        with self._lock:
            found = {}
            for channel, version in versions.items():
                base = self._bases.get((thread_id, ns, channel, str(version)))
                if base is not None:
                    found[channel] = base
            return found
