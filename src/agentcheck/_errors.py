"""Exceptions raised by agentcheck.

Every error says what was wrong and, where there is one, what to do about it.
"""

from __future__ import annotations

__all__ = [
    "AgentcheckError",
    "CorruptDataError",
    "KeyMismatchError",
    "MissingExtraError",
    "SchemaVersionError",
    "UnsafeTypeError",
]


class AgentcheckError(Exception):
    """Base class of every error agentcheck raises on purpose."""


class MissingExtraError(AgentcheckError, ImportError):
    """An optional dependency is not installed; the message names the extra."""

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(
            f"{module!r} is not installed: install it with `pip install 'agentcheck[{extra}]'`"
        )
        self.extra = extra


class SchemaVersionError(AgentcheckError):
    """The database schema is not at this agentcheck's version and cannot be brought to
    it: it is newer than this version understands, or older on a read-only connection."""


class UnsafeTypeError(AgentcheckError, TypeError):
    """A value of a type that is not on the deserialization allowlist was written."""


class CorruptDataError(AgentcheckError, ValueError):
    """A stored row could not be decoded (corrupt bytes, unknown type tag, wrong key)."""


class KeyMismatchError(AgentcheckError, ValueError):
    """The saver's encryption key, or its having none, is not the one the database's
    metadata index was written with: a metadata filter or ``delete_for_runs`` would
    silently miss checkpoints, and a put would mix the two forms in the index."""
