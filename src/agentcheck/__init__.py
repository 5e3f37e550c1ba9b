"""agentcheck: crash-safe LLM agents.

LangGraph checkpointers on SQLite and PostgreSQL (:mod:`agentcheck.savers`), safe
serialization with optional encryption (:mod:`agentcheck.serde`).
"""

from __future__ import annotations

from agentcheck._errors import (
    AgentcheckError,
    CorruptDataError,
    MissingExtraError,
    SchemaVersionError,
    UnsafeTypeError,
)
from agentcheck.serde import Codec, SafeSerializer, generate_key

__version__ = "0.1.0"

__all__ = [
    "AgentcheckError",
    "Codec",
    "CorruptDataError",
    "MissingExtraError",
    "SafeSerializer",
    "SchemaVersionError",
    "UnsafeTypeError",
    "__version__",
    "generate_key",
]
