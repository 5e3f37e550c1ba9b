"""LangGraph checkpointers on SQLite and PostgreSQL.

The PostgreSQL savers are imported lazily so that this package works without the
``postgres`` extra; using them without it raises an error naming the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentcheck.savers.sqlite import AsyncSqliteSaver, SqliteSaver

if TYPE_CHECKING:
    from agentcheck.savers.postgres import AsyncPostgresSaver, PostgresSaver

__all__ = ["AsyncPostgresSaver", "AsyncSqliteSaver", "PostgresSaver", "SqliteSaver"]


def __getattr__(name: str) -> Any:
    if name in ("PostgresSaver", "AsyncPostgresSaver"):
        from agentcheck.savers import postgres

        return getattr(postgres, name)
    raise AttributeError(f"module 'agentcheck.savers' has no attribute {name!r}")
