"""Crash tests with real process kills: a worker process (crash_worker.py) is SIGKILLed at a
chosen point of a run, and a NEW process resumes the run from the same database.

The external systems (payment provider, email server, LLM provider) are append-only files
written by the worker, one line per real effect with its idempotency key, so these tests
count what really happened across processes. Every scenario runs on SQLite and on
PostgreSQL, except the contrast without agentcheck (official SqliteSaver, plain tools).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import agentcheck
from agentcheck.journal import Event, Step

WORKER = Path(__file__).resolve().with_name("crash_worker.py")
THREAD_ID = "order-1001"  # the worker's thread (journal run id and ledger scope)
TIMEOUT = 90


# -- harness --------------------------------------------------------------------------------


@dataclass
class Env:
    db: str
    workdir: Path

    @property
    def charges(self) -> list[dict[str, Any]]:
        return _lines(self.workdir / "charges.jsonl")

    @property
    def receipts(self) -> list[dict[str, Any]]:
        return _lines(self.workdir / "receipts.jsonl")

    @property
    def llm_calls(self) -> int:
        path = self.workdir / "llm_calls.txt"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def steps(self) -> list[Step]:
        with agentcheck.connect(self.db) as journal:
            return journal.steps(scope=THREAD_ID)

    def step(self, name: str) -> Step:
        found = [s for s in self.steps() if s.name == name]
        assert len(found) == 1, f"expected one {name} step, got {found}"
        return found[0]

    def events(self) -> list[Event]:
        with agentcheck.connect(self.db) as journal:
            return journal.events(THREAD_ID)

    def run_status(self) -> str | None:
        with agentcheck.connect(self.db) as journal:
            run = journal.get_run(THREAD_ID)
        return run.status if run else None


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """A database (SQLite file or fresh PostgreSQL database) and a work directory."""
    if request.param == "sqlite":
        db = str(tmp_path / "agent.db")
    else:
        db = request.getfixturevalue("pg_url")
    workdir = tmp_path / "external"
    workdir.mkdir()
    yield Env(db=db, workdir=workdir)


def _command(scenario: str, env: Env, phase: str, answer: Any = None) -> list[str]:
    cmd = [sys.executable, str(WORKER), scenario, env.db, str(env.workdir), phase]
    if answer is not None:
        cmd.append(json.dumps(answer))
    return cmd


def kill_at(
    scenario: str, env: Env, marker: str, *, answer: Any = None, phase: str = "crash"
) -> dict[str, Any]:
    """Start the scenario in a child (``phase`` "crash", or "answer_crash": resumed with
    ``answer``), read its stdout until ``marker``, SIGKILL it.

    Returns the marker's JSON info. Asserts that the child really died of signal 9.
    """
    stderr_path = env.workdir / f"stderr-{scenario}-{phase}.txt"
    with open(stderr_path, "w") as stderr:
        child = subprocess.Popen(
            _command(scenario, env, phase, answer),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert child.stdout is not None
        info: dict[str, Any] | None = None
        seen: list[str] = []
        try:
            for line in child.stdout:
                seen.append(line)
                if line.startswith(f"MARKER {marker} "):
                    info = json.loads(line.split(" ", 2)[2])
                    break
            assert info is not None, (
                f"the worker ended before {marker}: stdout={''.join(seen)!r} "
                f"stderr={stderr_path.read_text()!r}"
            )
            os.kill(child.pid, signal.SIGKILL)
        finally:
            if child.poll() is None and info is None:
                child.kill()
            child.wait(timeout=TIMEOUT)
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL, f"exit status {child.returncode}"
    return info


@dataclass
class Finished:
    returncode: int
    result: dict[str, Any]
    markers: list[tuple[str, dict[str, Any]]]


def run_phase(scenario: str, env: Env, phase: str, answer: Any = None) -> Finished:
    """Run a phase of the scenario in a new process to its end; its last line is JSON."""
    proc = subprocess.run(
        _command(scenario, env, phase, answer), capture_output=True, text=True, timeout=TIMEOUT
    )
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), (
        f"no result (exit {proc.returncode}): stdout={proc.stdout!r} stderr={proc.stderr!r}"
    )
    markers = [
        (line.split(" ", 2)[1], json.loads(line.split(" ", 2)[2]))
        for line in lines
        if line.startswith("MARKER ")
    ]
    return Finished(proc.returncode, json.loads(lines[-1]), markers)


def tool_reply(done: Finished) -> Any:
    """The content of the one tool message of a run that finished."""
    assert done.returncode == 0, done.result
    assert done.result["status"] == "done"
    [tool_message] = [m for m in done.result["values"]["messages"] if m["type"] == "tool"]
    return tool_message["content"]


def by_name(events: list[Event], kind: str, name: str) -> list[str]:
    """The phases of the events of one wrapped call, in order."""
    return [e.phase for e in events if e.kind == kind and (e.name or "").startswith(name)]


# -- 1. a tool-calling agent killed between its two tool calls -----------------------------


@pytest.mark.parametrize("scenario", ["agent", "agent_react"], ids=["toolnode", "react"])
def test_agent_killed_after_charge_charges_once_and_does_not_pay_the_model_again(
    env: Env, scenario: str
) -> None:
    # The model asks for charge_card and send_receipt in one message. "agent": one ToolNode
    # task runs both (in threads); "agent_react": create_react_agent, one Send task per
    # call. The process dies after the charge completed, while send_receipt (which had
    # already sent its email) has not returned.
    killed = kill_at(scenario, env, "RECEIPT_SENT")
    assert len(env.charges) == 1
    assert len(env.receipts) == 1
    assert env.llm_calls == 1
    assert env.step("charge_card").status == "completed"
    assert env.step("send_receipt").status == "started"  # outcome unknown

    done = run_phase(scenario, env, "resume")

    assert done.returncode == 0, done.result
    assert done.result["status"] == "done"
    # The card was charged exactly once, with the key the ledger recorded.
    charge = env.step("charge_card")
    assert len(env.charges) == 1
    assert env.charges[0]["key"] == charge.idempotency_key
    assert charge.status == "completed"
    # send_receipt's outcome was unknown: its reconcile found the email by its key, so it
    # was not sent again.
    receipt = env.step("send_receipt")
    assert len(env.receipts) == 1
    assert env.receipts[0]["key"] == receipt.idempotency_key == killed["key"]
    assert receipt.status == "completed"
    assert receipt.result == "receipt sent to ada@example.com"
    # charge_card ran once. With one ToolNode task, that task ran again on resume and the
    # charge was replayed from the ledger; with one task per call, LangGraph may keep the
    # finished charge task's writes and not run it again at all.
    events = env.events()
    charge_events = by_name(events, "tool", "charge_card")
    if scenario == "agent":
        assert charge_events == ["start", "end", "replay"]
    else:
        assert charge_events in (["start", "end"], ["start", "end", "replay"])
    assert "send_receipt (reconciled)" in [e.name for e in events if e.phase == "end"]
    # The model was paid for the first call once, and for the final answer once.
    assert env.llm_calls == 2
    assert by_name(events, "llm", "scripted-chat-model") == ["start", "end", "start", "end"]
    messages = done.result["values"]["messages"]
    tool_results = {m["tool_call_id"]: m["content"] for m in messages if m["type"] == "tool"}
    assert tool_results == {
        "call_charge": "charged 42",
        "call_receipt": "receipt sent to ada@example.com",
    }
    assert messages[-1]["content"] == "Charged 42 and sent the receipt."
    assert env.run_status() == "succeeded"


def test_agent_killed_then_edited_with_update_state_charges_once(env: Env) -> None:
    # As above, but before resuming, an operator writes the model's tool-call message
    # again (update_state as the agent node): LangGraph then runs the tools as a new task
    # of the update's checkpoint. The task cut short by the kill (no writes stored) is
    # still the one going on: its calls keep their keys, so the completed charge replays
    # and the receipt's unknown outcome is reconciled by its key. (With create_react_agent
    # the same edit ends the run: the finished charge's message then comes last.)
    killed = kill_at("agent", env, "RECEIPT_SENT")
    assert len(env.charges) == 1 and len(env.receipts) == 1

    done = run_phase("agent", env, "edit")

    assert done.returncode == 0, done.result
    assert done.result["status"] == "done"
    charge, receipt = env.step("charge_card"), env.step("send_receipt")
    assert [c["key"] for c in env.charges] == [charge.idempotency_key]
    assert [r["key"] for r in env.receipts] == [receipt.idempotency_key] == [killed["key"]]
    assert charge.status == receipt.status == "completed"
    assert env.llm_calls == 2
    messages = done.result["values"]["messages"]
    tool_results = {m["tool_call_id"]: m["content"] for m in messages if m["type"] == "tool"}
    assert tool_results == {
        "call_charge": "charged 42",
        "call_receipt": "receipt sent to ada@example.com",
    }
    assert env.run_status() == "succeeded"


def test_send_branch_killed_then_edited_with_update_state_charges_once(env: Env) -> None:
    # Two Send branches each charge; the second dies after its charge completed. An edit
    # as the planner sends both branches again as new tasks of the update's checkpoint:
    # each is the branch of the same index going on, so both charges replay.
    killed = kill_at("fanout", env, "BRANCH_CHARGED")
    assert sorted(c["amount"] for c in env.charges) == [10, 20]

    done = run_phase("fanout", env, "edit")

    assert done.returncode == 0, done.result
    assert done.result["status"] == "done"
    steps = {s.idempotency_key: s for s in env.steps() if s.name == "charge"}
    assert sorted(c["amount"] for c in env.charges) == [10, 20]
    assert {c["key"] for c in env.charges} == set(steps)
    assert killed["key"] in steps
    assert all(s.status == "completed" for s in steps.values())
    assert 20 in done.result["values"]["charged"]


def test_send_branches_reordered_by_update_state_each_keep_their_own_calls(env: Env) -> None:
    # As above, but the planner's edit adds an item and swaps the two: every Send is at
    # another index now. Each branch goes on with the one of the same Send, not of the
    # same index: 10 and 20 are charged once each, the new 30 once.
    killed = kill_at("fanout", env, "BRANCH_CHARGED")

    done = run_phase("fanout", env, "reorder")

    assert done.returncode == 0, done.result
    assert sorted(c["amount"] for c in env.charges) == [10, 20, 30]
    steps = {s.idempotency_key: s for s in env.steps() if s.name == "charge"}
    assert {c["key"] for c in env.charges} == set(steps)
    assert killed["key"] == next(c["key"] for c in env.charges if c["amount"] == 20)
    assert set(done.result["values"]["charged"]) == {10, 20, 30}


# -- 2. a node that charges, then interrupts ---------------------------------------------


def test_charge_then_interrupt_resumed_in_a_new_process_charges_once(env: Env) -> None:
    first = run_phase("interrupt", env, "start")
    assert first.returncode == 0, first.result
    assert first.result["status"] == "interrupted"
    assert first.result["interrupts"] == [{"question": "Ship the order?", "charged": 42}]
    assert len(env.charges) == 1
    assert env.run_status() == "interrupted"

    second = run_phase("interrupt", env, "answer", "yes")

    assert second.returncode == 0, second.result
    assert second.result["status"] == "done"
    assert second.result["values"]["status"] == "shipping: yes"
    # The node ran again from its start; the charge was replayed, not repeated.
    assert len(env.charges) == 1
    step = env.step("charge")
    assert step.status == "completed"
    assert second.result["values"]["charge"] == {"amount": 42, "key": step.idempotency_key}
    assert env.charges[0]["key"] == step.idempotency_key
    assert by_name(env.events(), "tool", "charge") == ["start", "end", "replay"]
    assert env.run_status() == "succeeded"


def test_charge_then_killed_before_interrupt_charges_once_over_three_processes(
    env: Env,
) -> None:
    killed = kill_at("interrupt", env, "CHARGED_BEFORE_INTERRUPT")
    assert len(env.charges) == 1
    assert env.step("charge").status == "completed"

    # A new process: the node runs again, the charge is replayed, the interrupt surfaces.
    second = run_phase("interrupt", env, "resume")
    assert second.returncode == 0, second.result
    assert second.result["status"] == "interrupted"
    assert second.result["interrupts"] == [{"question": "Ship the order?", "charged": 42}]
    assert len(env.charges) == 1

    # A third process answers the interrupt and finishes the run.
    third = run_phase("interrupt", env, "answer", "yes")
    assert third.returncode == 0, third.result
    assert third.result["status"] == "done"
    assert third.result["values"]["status"] == "shipping: yes"

    assert len(env.charges) == 1
    assert env.charges[0]["key"] == killed["key"] == env.step("charge").idempotency_key
    assert by_name(env.events(), "tool", "charge") == ["start", "end", "replay", "replay"]
    assert env.run_status() == "succeeded"


# -- 3. killed after a model call, before the node finished ---------------------------------


def test_model_call_is_replayed_not_paid_again_after_a_kill(env: Env) -> None:
    killed = kill_at("model", env, "MODEL_RETURNED")
    assert env.llm_calls == 1
    assert killed["tool_call_ids"] == ["call_first"]

    done = run_phase("model", env, "resume")

    assert done.returncode == 0, done.result
    assert done.result["status"] == "done"
    # Not paid again: the provider saw one call.
    assert env.llm_calls == 1
    # The node's output is the very message the killed process received.
    [_, message] = done.result["values"]["messages"]
    assert message["id"] == killed["id"]
    assert message["tool_call_ids"] == killed["tool_call_ids"] == ["call_first"]
    # The journal: one paid call with its tokens, one free replay.
    llm = [e for e in env.events() if e.kind == "llm"]
    ends = [e for e in llm if e.phase == "end"]
    replays = [e for e in llm if e.phase == "replay"]
    assert [e.phase for e in llm] == ["start", "end", "replay"]
    assert [(e.input_tokens, e.output_tokens) for e in ends] == [(10, 5)]
    assert [(e.input_tokens, e.output_tokens) for e in replays] == [(None, None)]
    assert env.run_status() == "succeeded"


# -- 4. killed inside a side-effecting tool ------------------------------------------------


def test_killed_inside_side_effect_resume_raises_tool_outcome_unknown(env: Env) -> None:
    killed = kill_at("tool_raise", env, "INSIDE_TOOL")
    assert len(env.charges) == 1

    done = run_phase("tool_raise", env, "resume")

    assert done.returncode == 3
    assert done.result["status"] == "error"
    assert done.result["error_type"] == "ToolOutcomeUnknown"
    step = env.step("charge_card")
    message = done.result["error"]
    assert "charge_card(amount=42)" in message
    assert step.idempotency_key == killed["key"]
    assert killed["key"] in message
    assert step.started_at in message
    # Not repeated, and still unknown.
    assert len(env.charges) == 1
    assert step.status == "started"
    assert env.run_status() == "failed"


def test_killed_inside_side_effect_with_reconcile_finds_the_effect_by_key(env: Env) -> None:
    killed = kill_at("tool_reconcile", env, "INSIDE_TOOL")
    assert len(env.charges) == 1

    done = run_phase("tool_reconcile", env, "resume")

    assert tool_reply(done) == "charged 42 (found by key)"
    assert len(env.charges) == 1
    step = env.step("charge_card")
    assert step.status == "completed"
    assert step.idempotency_key == killed["key"] == env.charges[0]["key"]
    assert step.result == "charged 42 (found by key)"
    assert by_name(env.events(), "tool", "charge_card") == ["start", "start", "end"]


def test_killed_before_the_effect_reconcile_not_done_runs_it_once(env: Env) -> None:
    killed = kill_at("tool_reconcile_absent", env, "INSIDE_TOOL")
    assert env.charges == []  # died before the payment provider saw anything

    done = run_phase("tool_reconcile_absent", env, "resume")

    assert tool_reply(done) == "charged 42"
    # Reconcile said NOT_DONE, so the call ran again: exactly one effect, same key.
    assert len(env.charges) == 1
    step = env.step("charge_card")
    assert step.status == "completed"
    assert step.attempts == 2
    assert env.charges[0]["key"] == step.idempotency_key == killed["key"]


def test_killed_inside_idempotent_tool_reruns_it_with_the_same_key(env: Env) -> None:
    killed = kill_at("tool_idempotent", env, "INSIDE_TOOL")
    assert len(env.charges) == 1

    done = run_phase("tool_idempotent", env, "resume")

    assert done.returncode == 0, done.result
    assert done.result["status"] == "done"
    # Idempotent: run again blindly, with the same key (a provider that deduplicates by
    # key charges once).
    charges = env.charges
    assert len(charges) == 2
    assert charges[0]["key"] == charges[1]["key"] == killed["key"]
    assert charges[0]["pid"] != charges[1]["pid"]
    step = env.step("charge_card")
    assert step.status == "completed"
    assert step.idempotency_key == killed["key"]
    assert step.attempts == 2


def test_killed_inside_ask_tool_asks_a_human_and_uses_the_answer(env: Env) -> None:
    killed = kill_at("tool_ask", env, "INSIDE_TOOL")
    assert len(env.charges) == 1

    asked = run_phase("tool_ask", env, "resume")

    assert asked.returncode == 0, asked.result
    assert asked.result["status"] == "interrupted"
    [question] = asked.result["interrupts"]
    assert question["type"] == "agentcheck.unknown_outcome"
    assert question["tool"] == "charge_card"
    assert question["args"] == {"amount": 42}
    assert question["idempotency_key"] == killed["key"]
    assert len(env.charges) == 1
    assert env.step("charge_card").status == "started"

    done = run_phase("tool_ask", env, "answer", {"result": "charged 42 (confirmed by ops)"})

    assert tool_reply(done) == "charged 42 (confirmed by ops)"
    assert len(env.charges) == 1
    step = env.step("charge_card")
    assert step.status == "completed"
    assert step.result == "charged 42 (confirmed by ops)"
    assert env.run_status() == "succeeded"


def test_a_retry_a_human_allowed_is_made_once_then_a_new_crash_asks_again(env: Env) -> None:
    """The human answers "retry" to the unknown outcome, and the retried charge is
    killed as well. LangGraph keeps the task's answers across the crash: the same
    "retry" answered the question about the second crash, and the card was charged a
    third time without asking. A new crash now asks a new question."""
    kill_at("tool_ask", env, "INSIDE_TOOL")
    first = run_phase("tool_ask", env, "resume")
    assert first.result["status"] == "interrupted", first.result
    assert first.result["interrupts"][0]["attempts"] == 1

    kill_at("tool_ask", env, "INSIDE_TOOL", phase="answer_crash", answer="retry")
    assert len(env.charges) == 2

    again = run_phase("tool_ask", env, "resume")
    assert again.result["status"] == "interrupted", again.result
    [question] = again.result["interrupts"]
    assert (question["type"], question["attempts"]) == ("agentcheck.unknown_outcome", 2)
    assert len(env.charges) == 2
    done = run_phase("tool_ask", env, "answer", {"result": "charged 42 (confirmed by ops)"})
    assert tool_reply(done) == "charged 42 (confirmed by ops)"
    assert len(env.charges) == 2


@pytest.mark.parametrize("variant", ["reconcile", "ask"])
def test_a_charge_that_asked_its_approval_then_was_killed_uses_no_answer_twice(
    env: Env, variant: str
) -> None:
    """The charge asks its own approval, is approved, charges and is killed. On resume
    the approval was used again: with reconcile=, the node's next question ("Ship the
    order?") got "approve" and the order shipped unasked; with on_unknown="ask", the
    policy's question got "approve", refused it, and the thread was stuck. The answers
    the killed attempt used are now passed over, and each question gets its own."""
    scenario = f"approve_{variant}"
    asked = run_phase(scenario, env, "start")
    assert asked.result["interrupts"] == [{"question": "Charge 42?"}], asked.result
    kill_at(scenario, env, "INSIDE_TOOL", phase="answer_crash", answer="approve")
    assert len(env.charges) == 1

    resumed = run_phase(scenario, env, "resume")
    assert resumed.result["status"] == "interrupted", resumed.result
    [question] = resumed.result["interrupts"]
    if variant == "ask":
        assert question["type"] == "agentcheck.unknown_outcome"
        resumed = run_phase(scenario, env, "answer", {"result": "charged 42 (by ops)"})
        assert resumed.result["status"] == "interrupted", resumed.result
        [question] = resumed.result["interrupts"]
    assert question == {"question": "Ship the order?"}

    done = run_phase(scenario, env, "answer", "yes")
    assert done.result["status"] == "done", done.result
    charged = "charged 42 (found by key)" if variant == "reconcile" else "charged 42 (by ops)"
    assert done.result["values"]["status"] == f"{charged}; shipping: yes"
    assert len(env.charges) == 1
    assert env.step("charge_card").status == "completed"


def test_after_a_retry_the_call_asks_its_approval_again_and_a_denial_holds(env: Env) -> None:
    """The charge is approved, charges and is killed; the human answers the unknown
    outcome with "retry"; the retried charge asks its approval again, and is denied.
    Its claim was forgotten when it paused at that question, and the next execution,
    claiming it anew, gave its question the first approval: the card was charged a
    second time, and "Ship the order?" got "retry" unasked. A call taken over that
    pauses is now kept (paused) with where its own questions begin."""
    run_phase("approve_ask", env, "start")
    kill_at("approve_ask", env, "INSIDE_TOOL", phase="answer_crash", answer="approve")
    asked = run_phase("approve_ask", env, "resume")
    assert asked.result["interrupts"][0]["type"] == "agentcheck.unknown_outcome"

    again = run_phase("approve_ask", env, "answer", "retry")
    assert again.result["interrupts"] == [{"question": "Charge 42?"}], again.result
    assert env.step("charge_card").status == "paused"
    denied = run_phase("approve_ask", env, "answer", "deny")
    assert denied.result["interrupts"] == [{"question": "Ship the order?"}], denied.result
    done = run_phase("approve_ask", env, "answer", "yes")
    assert done.result["values"]["status"] == "not approved; shipping: yes", done.result
    assert len(env.charges) == 1


def test_an_edit_while_the_policy_asks_leaves_the_next_answer_to_it(env: Env) -> None:
    """An operator edits the state (update_state) while the unknown outcome's question
    waits: LangGraph runs the node as a new task, with no answers yet. The question's
    place was taken from the old task, and the human's next answer was passed over as
    used: the question came back. It is asked anew in the new task, and answered."""
    run_phase("approve_ask", env, "start")
    kill_at("approve_ask", env, "INSIDE_TOOL", phase="answer_crash", answer="approve")
    run_phase("approve_ask", env, "resume")
    edited = run_phase("approve_ask", env, "edit")
    assert edited.result["interrupts"][0]["type"] == "agentcheck.unknown_outcome", edited.result

    answered = run_phase("approve_ask", env, "answer", {"result": "charged 42 (by ops)"})
    assert answered.result["interrupts"] == [{"question": "Ship the order?"}], answered.result
    done = run_phase("approve_ask", env, "answer", "yes")
    assert done.result["values"]["status"] == "charged 42 (by ops); shipping: yes"
    assert len(env.charges) == 1


@pytest.mark.parametrize("variant", ["reconcile", "ask"])
def test_a_question_answered_before_a_killed_charge_is_not_asked_again(
    env: Env, variant: str
) -> None:
    """The node's own question is answered with Command(resume=...), then its charge is
    killed. Passing over the answers the killed execution used counted that answer
    twice (LangGraph still shows it once used): the human was shown a question with no
    value, and their answer to it was lost, even with reconcile=, which needs no one."""
    scenario = f"confirm_{variant}"
    asked = run_phase(scenario, env, "start")
    assert asked.result["interrupts"] == [{"question": "Confirm the order?"}], asked.result
    kill_at(scenario, env, "INSIDE_TOOL", phase="answer_crash", answer="ok")

    resumed = run_phase(scenario, env, "resume")
    if variant == "ask":
        [question] = resumed.result["interrupts"]
        assert question["type"] == "agentcheck.unknown_outcome", resumed.result
        resumed = run_phase(scenario, env, "answer", {"result": "charged 42 (by ops)"})
        assert resumed.result["values"]["status"] == "ok; charged 42 (by ops)", resumed.result
    else:
        assert resumed.result["status"] == "done", resumed.result
        assert resumed.result["values"]["status"] == "ok; charged 42 (found by key)"
    assert len(env.charges) == 1
    assert env.step("charge_card").status == "completed"


@pytest.mark.parametrize("variant", ["reconcile", "ask"])
def test_a_charge_killed_after_an_edit_uses_no_answer_twice(env: Env, variant: str) -> None:
    """An operator edits the state while the charge waits for its approval (LangGraph
    runs the node as a new task); the charge is then approved, charges and is killed.
    The answers of a task that continues another were all taken as unused, so the
    approval the killed attempt had used answered "Ship the order?" (or the policy's
    question). The attempt's task is now recorded with the step."""
    scenario = f"approve_{variant}"
    run_phase(scenario, env, "start")
    edited = run_phase(scenario, env, "edit")
    assert edited.result["interrupts"] == [{"question": "Charge 42?"}], edited.result
    kill_at(scenario, env, "INSIDE_TOOL", phase="answer_crash", answer="approve")

    resumed = run_phase(scenario, env, "resume")
    [question] = resumed.result["interrupts"]
    if variant == "ask":
        assert question["type"] == "agentcheck.unknown_outcome", resumed.result
        assert "error" not in question
        resumed = run_phase(scenario, env, "answer", {"result": "charged 42 (by ops)"})
        [question] = resumed.result["interrupts"]
    assert question == {"question": "Ship the order?"}, resumed.result
    done = run_phase(scenario, env, "answer", "yes")
    assert done.result["values"]["status"].endswith("; shipping: yes"), done.result
    assert len(env.charges) == 1


def forget_attempt_tasks(env: Env) -> None:
    """The ledger as a version before schema 8 left it: no attempt's task recorded."""
    sql = "UPDATE agentcheck_steps SET attempt_task = NULL"
    if env.db.startswith("postgresql"):
        import psycopg

        with psycopg.connect(env.db, autocommit=True) as conn:
            conn.execute(sql)
    else:
        import sqlite3

        with sqlite3.connect(env.db) as conn:
            conn.execute(sql)


def test_a_step_written_before_its_task_was_recorded_uses_no_answer_twice(env: Env) -> None:
    """A charge approved and killed under a version that did not record the attempt's
    task (schema before 8), resumed after the upgrade: the step was taken for another
    task's, and its approval answered "Ship the order?". Such a step is of this task
    unless this task continues another."""
    run_phase("approve_reconcile", env, "start")
    kill_at("approve_reconcile", env, "INSIDE_TOOL", phase="answer_crash", answer="approve")
    forget_attempt_tasks(env)
    resumed = run_phase("approve_reconcile", env, "resume")
    assert resumed.result["interrupts"] == [{"question": "Ship the order?"}], resumed.result
    done = run_phase("approve_reconcile", env, "answer", "yes")
    assert done.result["values"]["status"] == "charged 42 (found by key); shipping: yes"
    assert len(env.charges) == 1


# -- 5. the contrast: the same crash without agentcheck ------------------------------------


def test_without_agentcheck_official_sqlite_saver_charges_the_card_twice(tmp_path: Path) -> None:
    """Scenario 1 with plain @tool functions and langgraph-checkpoint-sqlite's SqliteSaver:
    the killed tools task runs again from its checkpoint, so the card IS charged twice
    (and the receipt sent twice). This is the problem agentcheck solves."""
    workdir = tmp_path / "external"
    workdir.mkdir()
    env = Env(db=str(tmp_path / "official.db"), workdir=workdir)

    kill_at("agent_unwrapped", env, "RECEIPT_SENT")
    assert len(env.charges) == 1
    assert len(env.receipts) == 1

    done = run_phase("agent_unwrapped", env, "resume")

    assert done.returncode == 0, done.result
    assert done.result["status"] == "done"
    assert len(env.charges) == 2  # charged twice
    assert env.charges[0]["pid"] != env.charges[1]["pid"]
    assert len(env.receipts) == 2
    assert env.llm_calls == 2  # the checkpoint did save the model's answer


# -- the same call made at once by two processes ------------------------------------------

TWIN = """
import json, os, sys, time
from agentcheck import effect_scope, side_effect
from agentcheck.savers import PostgresSaver, SqliteSaver

db, effects, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])

@side_effect
def charge(amount, idempotency_key):
    print("MARKER inside {}", flush=True)
    time.sleep(delay)  # the provider is slow
    with open(effects, "a") as f:
        f.write(json.dumps({"key": idempotency_key, "pid": os.getpid()}) + "\\n")
    return {"charged": amount, "by": os.getpid()}

saver_class = PostgresSaver if db.startswith("postgresql") else SqliteSaver
with saver_class.from_conn_string(db) as saver:
    saver.setup()
    with effect_scope(saver.journal, scope="job-1"):
        print(json.dumps(charge(42)), flush=True)
"""


def test_a_call_another_process_is_making_is_waited_for_not_made_again(env: Env) -> None:
    """Two workers make the same call at once (two deliveries of one job, or two resumes
    of one thread): the second found the step started by a process it could not see
    running, took its outcome for unknown and raised, or, with a reconcile that found
    nothing yet, ran the call a second time. It now waits for the process still running
    on this machine, and replays its result."""
    effects = env.workdir / "charges.jsonl"

    def start(delay: float) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-c", TWIN, env.db, str(effects), str(delay)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)

    first = start(1.5)
    assert first.stdout is not None
    assert first.stdout.readline().startswith("MARKER inside")  # claimed, not done
    second = start(0.0)
    out_second, _ = second.communicate(timeout=TIMEOUT)
    out_first, _ = first.communicate(timeout=TIMEOUT)
    assert first.returncode == second.returncode == 0, (out_first, out_second)
    assert "MARKER" not in out_second  # the second never ran the call
    assert json.loads(out_second) == json.loads(out_first) == {"charged": 42, "by": first.pid}
    assert len(_lines(effects)) == 1
    with agentcheck.connect(env.db) as journal:
        (step,) = journal.steps(scope="job-1")
    assert (step.status, step.attempts) == ("completed", 1)


# -- LangGraph's default durability ("async") ------------------------------------------------

ASYNC_DURABILITY = """
import json, os, sys, time
from typing import TypedDict
from langgraph.graph import END, START, StateGraph
from agentcheck import side_effect
from agentcheck.savers import PostgresSaver, SqliteSaver

db, effects, phase = sys.argv[1], sys.argv[2], sys.argv[3]
base = PostgresSaver if db.startswith("postgresql") else SqliteSaver


class SlowPuts(base):
    # A checkpoint takes 0.5 s to reach the database (a busy disk or server): LangGraph
    # stores it in the background while the next step's tasks already run.
    def put(self, *args, **kwargs):
        time.sleep(0.5)
        return super().put(*args, **kwargs)


@side_effect
def charge(amount, idempotency_key):
    with open(effects, "a") as f:
        f.write(json.dumps({"key": idempotency_key}) + "\\n")
    return f"charged {amount}"


class State(TypedDict, total=False):
    amount: int
    out: str


def pay(state):
    out = charge(state["amount"])
    if phase == "crash":
        print("MARKER charged {}", flush=True)
        time.sleep(120)  # killed here
    return {"out": out}


builder = StateGraph(State)
builder.add_node("pay", pay)
builder.add_edge(START, "pay")
builder.add_edge("pay", END)
saver_class = SlowPuts if phase == "crash" else base
with saver_class.from_conn_string(db) as saver:
    saver.setup()
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "t1"}}
    # A worker resumes the job's thread where it stopped, or starts it again if nothing
    # of it was stored. No durability given: LangGraph's default, "async".
    started = phase == "resume" and graph.get_state(config).next
    print(json.dumps(graph.invoke(None if started else {"amount": 42}, config)))
"""


def test_default_durability_killed_after_a_charge_charges_once(env: Env) -> None:
    """With LangGraph's default durability ("async") the task's checkpoint is stored in
    the background while the task runs, and its calls' keys derive from it: killed after
    the charge but before that checkpoint was stored, the resumed run made the task
    anew, with new keys, and charged again. A call now waits for its task's checkpoint
    to be stored before it is claimed."""
    effects = env.workdir / "charges.jsonl"

    def cmd(phase: str) -> list[str]:
        return [sys.executable, "-c", ASYNC_DURABILITY, env.db, str(effects), phase]

    child = subprocess.Popen(cmd("crash"), stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        assert child.stdout.readline().startswith("MARKER charged")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=TIMEOUT)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert len(_lines(effects)) == 1

    resumed = subprocess.run(cmd("resume"), capture_output=True, text=True, timeout=TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["out"] == "charged 42"  # replayed
    assert len(_lines(effects)) == 1
