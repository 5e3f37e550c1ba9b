"""Which of an update's pending Sends is which of the checkpoint it was made over.

A LangGraph ``update_state`` on a stopped run makes a checkpoint whose pending Sends run
as new tasks; each goes on with the task of the same Send before the update (see
SaverCore._continued_task, docs/effects.md), so its completed calls replay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

__all__ = ["Pairing", "pair_sends"]


# Serializes Send arguments to compare those that do not compare equal by value (NaN,
# objects without equality): LangGraph's own format, deterministic (not the saver's
# serializer, which may encrypt with a fresh nonce each time).
_SEND_SERDE = JsonPlusSerializer(pickle_fallback=False)


def _tool_call_id(arg: Any) -> str | None:
    """The id of the tool call a Send's argument carries: the prebuilt agent's per-call
    Sends (``tool_call_with_context``), or a mapping holding one LangChain tool call
    (``{"name", "args", "id", "type": "tool_call"}``) among its values, as hand-built
    agents send. Such arguments often carry the graph's state too, which an update
    changes: the call's id is what stays."""
    if not isinstance(arg, Mapping):
        return None
    if arg.get("__type") == "tool_call_with_context":
        found = [arg.get("tool_call")]
    else:
        found = [v for v in arg.values() if isinstance(v, Mapping) and v.get("type") == "tool_call"]
    if len(found) != 1 or not isinstance(found[0], Mapping):
        return None
    call_id = found[0].get("id")
    return call_id if isinstance(call_id, str) else None


_UNSERIALIZABLE = object()


class _Sends:
    """One checkpoint's pending Sends, as pair_sends compares them: each one's node,
    its tool call's id when no other Send of the list carries the same (one call fanned
    out to several Sends identifies none of them), and its argument, serialized once
    and only if needed."""

    def __init__(self, sends: list[Any]) -> None:
        self.nodes = [getattr(send, "node", None) for send in sends]
        self.args = [getattr(send, "arg", None) for send in sends]
        ids = [_tool_call_id(arg) for arg in self.args]
        counts: dict[str, int] = {}
        for call_id in ids:
            if call_id is not None:
                counts[call_id] = counts.get(call_id, 0) + 1
        self.ids = [i if i is not None and counts[i] == 1 else None for i in ids]
        self._dumped: dict[int, Any] = {}

    def dumped(self, index: int) -> Any:
        if index not in self._dumped:
            try:
                self._dumped[index] = _SEND_SERDE.dumps_typed(self.args[index])
            except Exception:  # not serializable: equal to nothing
                self._dumped[index] = _UNSERIALIZABLE
        return self._dumped[index]

    def same(self, index: int, other: _Sends, other_index: int) -> bool:
        """Whether Send ``index`` is the other list's ``other_index``: the same node and
        the same tool call (where it identifies the Send on both sides), else equal
        arguments (by value, or serialized alike)."""
        node = self.nodes[index]
        if not isinstance(node, str) or node != other.nodes[other_index]:
            return False
        call_id, other_id = self.ids[index], other.ids[other_index]
        if call_id is not None and other_id is not None:
            return call_id == other_id
        # (A call that identifies its Send on one side only, carried by several Sends on
        # the other: the arguments tell.)
        try:
            if bool(self.args[index] == other.args[other_index]):
                return True
        except Exception:  # an equality that raises (arrays): compare them serialized
            pass
        dumped = self.dumped(index)
        return dumped is not _UNSERIALIZABLE and dumped == other.dumped(other_index)


@dataclass(frozen=True)
class Pairing:
    """How an update's pending Sends pair with those of the checkpoint it was made over
    (see pair_sends)."""

    paired: dict[int, int]
    same_nodes: bool
    count: int

    def earlier(self, index: int) -> int | None:
        """The earlier index of the Send at ``index``, or None if it is new there. One
        left unpaired is taken for the one at its index only if both lists send to the
        same nodes in the same order (an update that changed the graph's state, which
        Sends often carry, but not the fan-out)."""
        if index >= self.count:
            return None
        if index in self.paired:
            return self.paired[index]
        return index if self.same_nodes and index not in self.paired.values() else None


def pair_sends(values: Mapping[str, Any], earlier: Mapping[str, Any]) -> Pairing | None:
    """Pair a checkpoint's pending Sends one to one with an earlier checkpoint's: those
    the same (``_Sends.same``) at the same index, then each remaining one, in order, with
    the first unpaired earlier one the same. None if either holds no list of Sends."""
    try:
        ours = _Sends(list(values.get("__pregel_tasks")))  # type: ignore[arg-type]
        theirs = _Sends(list(earlier["channel_values"].get("__pregel_tasks")))
    except TypeError:  # not lists of Sends
        return None
    paired: dict[int, int] = {
        i: i for i in range(min(len(ours.nodes), len(theirs.nodes))) if ours.same(i, theirs, i)
    }
    used = set(paired.values())
    for i in range(len(ours.nodes)):
        if i in paired:
            continue
        match = next(
            (j for j in range(len(theirs.nodes)) if j not in used and ours.same(i, theirs, j)),
            None,
        )
        if match is not None:
            paired[i] = match
            used.add(match)
    return Pairing(paired, ours.nodes == theirs.nodes, len(ours.nodes))
