"""Metadata index terms: one ``path=value`` string per metadata leaf.

A filtered ``list`` finds checkpoints through these terms (``agentcheck_metadata_terms``,
and on SQLite ``agentcheck_pending_terms`` until they are moved there), on both
databases, and the same way when the metadata itself is encrypted (the saver then stores
a keyed hash of each term). See docs/savers.md, "Storage".
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["metadata_terms"]

_CACHED_TEXT = 64  # metadata keys and values up to this long have their JSON cached
_PLAIN = frozenset((str, int, float, bool, type(None), list))


def _canonical(value: Any) -> str:
    """JSON text of a metadata value, the same for equal values (1 and 1.0 alike)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def metadata_terms(metadata: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterable[str]:
    """Index terms of a metadata mapping: one per leaf ``path=value``.

    Nested mappings are walked, so a filter on a partial nested mapping matches the
    way PostgreSQL's ``@>`` containment does; any other value matches by equality.
    """
    for key, value in metadata.items():
        path = (*prefix, str(key))
        kind = type(value)
        # Most values are plain: an exact type test spares them the ABC check.
        mapping = kind is dict or (kind not in _PLAIN and isinstance(value, Mapping))
        if mapping and value:
            yield from metadata_terms(value, path)
        elif sum(map(len, path)) > _CACHED_TEXT:
            yield json.dumps(path, separators=(",", ":")) + "=" + _canonical(value)
        elif mapping:  # empty
            yield _path_json(path) + "={}"
        elif type(value) is int:  # a counter (the step): JSON's text is Python's
            yield _path_json(path) + "=" + str(value)
        elif (
            value is None
            or type(value) in (bool, float)
            or (type(value) is str and len(value) <= _CACHED_TEXT)
        ):
            yield _path_json(path) + "=" + _scalar_json(value)
        else:
            yield _path_json(path) + "=" + _canonical(value)


# Most terms repeat (source, step, user...): their JSON is made once. typed=True keeps 1
# and True apart (JSON ``1`` and ``true``); 1 and 1.0 still give the same text. Only
# short strings are kept: metadata text stays out of a process-wide cache.
@functools.lru_cache(maxsize=1024)
def _path_json(path: tuple[str, ...]) -> str:
    return json.dumps(path, separators=(",", ":"))


@functools.lru_cache(maxsize=4096, typed=True)
def _scalar_json(value: str | int | bool | float | None) -> str:
    return _canonical(value)
