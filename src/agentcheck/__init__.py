"""agentcheck: crash-safe LLM agents.

* :mod:`agentcheck.savers`: LangGraph checkpointers on SQLite and PostgreSQL.
* :mod:`agentcheck.journal`: runs, events and the step ledger, in the same database
  (:func:`connect` opens it).
* :mod:`agentcheck.effects`: ``@side_effect`` / ``@idempotent``: a completed call never
  runs twice; an unknown outcome goes to a policy.
* :mod:`agentcheck.adapters.langgraph`: ``durable_model`` and the LangGraph glue
  (registered on import, so the wrappers work inside any graph compiled with an
  agentcheck saver).
"""

from __future__ import annotations

from agentcheck._errors import (
    AgentcheckError,
    CorruptDataError,
    KeyMismatchError,
    MissingExtraError,
    SchemaVersionError,
    UnsafeTypeError,
)
from agentcheck.effects import (
    NOT_DONE,
    ToolOutcomeUnknown,
    UnknownOutcome,
    current_idempotency_key,
    effect_scope,
    idempotent,
    side_effect,
)
from agentcheck.journal import Event, Journal, Run, Step, connect
from agentcheck.serde import Codec, SafeSerializer, generate_key

# Registers the LangGraph resolver (langgraph is a core dependency).
from agentcheck.adapters import langgraph as _langgraph  # noqa: F401  # isort: skip

__version__ = "0.1.0"

__all__ = [
    "AgentcheckError",
    "Codec",
    "CorruptDataError",
    "Event",
    "Journal",
    "KeyMismatchError",
    "MissingExtraError",
    "NOT_DONE",
    "Run",
    "SafeSerializer",
    "SchemaVersionError",
    "Step",
    "ToolOutcomeUnknown",
    "UnknownOutcome",
    "UnsafeTypeError",
    "__version__",
    "connect",
    "current_idempotency_key",
    "effect_scope",
    "generate_key",
    "idempotent",
    "side_effect",
]
