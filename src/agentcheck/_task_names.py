"""Which node a LangGraph task runs, by task id, as seen while it runs.

A ``Send`` task's writes name it only by its index among the checkpoint's pending
Sends, and LangGraph may store those writes before the checkpoint that lists them. The
LangGraph adapter records each task's node when the task starts (from its callback
metadata); the saver reads it back when it journals the task's writes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

_names: OrderedDict[str, str] = OrderedDict()
_lock = threading.Lock()
_SIZE = 16_384


def remember(task_id: str, node: str) -> None:
    """Record the node of a running task (the oldest entries are forgotten)."""
    with _lock:
        _names[task_id] = node
        while len(_names) > _SIZE:
            _names.popitem(last=False)


def lookup(task_id: str) -> str | None:
    """The node of a task seen running in this process, if any."""
    with _lock:
        return _names.get(task_id)
