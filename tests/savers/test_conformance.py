"""langgraph-checkpoint-conformance on all four savers: every capability, none skipped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from savers_support import KINDS, SyncDriven, is_async, open_saver

EXPECTED_TESTS = 81


# On SQLite a put's metadata terms stay pending until every 32nd put moves them into
# the index (SQL.PENDING_TERMS): the suite runs once more with each put moving them.
@pytest.mark.parametrize(
    ("kind", "move_terms_every"),
    [(kind, 32) for kind in KINDS] + [("sqlite", 1), ("async_sqlite", 1)],
)
async def test_conformance_all_capabilities(
    kind: str, move_terms_every: int, pg_url: str, sqlite_path: str
) -> None:
    @checkpointer_test(name=f"agentcheck-{kind}")
    async def factory() -> AsyncIterator[Any]:
        async with open_saver(kind, sqlite_path=sqlite_path, pg_url=pg_url) as saver:
            saver.move_terms_every = move_terms_every
            yield saver if is_async(kind) else SyncDriven(saver)

    report = await validate(factory)
    failures = {cap: result.failures for cap, result in report.results.items() if not result.passed}
    assert not failures, failures
    assert set(report.results) == {c.value for c in ALL_CAPABILITIES}
    assert all(r.detected and r.tests_skipped == 0 for r in report.results.values())
    passed = sum(r.tests_passed for r in report.results.values())
    assert passed == EXPECTED_TESTS
