"""A card is charged, the process is killed, and the resume does not charge it again.

    python examples/crash_demo.py [--db PATH]

The parent starts a worker process that runs a small checkout graph with an agentcheck
SqliteSaver. The ``checkout`` node charges a card (a ``@side_effect`` tool; the "payment
provider" is a file that gets one line per real charge) and then sends a receipt. While the
receipt is being sent, the parent kills the worker with SIGKILL: no cleanup, no exception
handler runs, as in a crash, an OOM kill or a power cut.

LangGraph resumes a node from its start, so a second worker re-runs ``checkout``: with a
plain tool the card would be charged twice. With agentcheck the charge is found completed
in the journal and its recorded result is returned; the receipt, which never finished,
is sent. Then the journal of the run is printed.
"""

from __future__ import annotations

import argparse
import operator
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph

from agentcheck import connect, idempotent, side_effect
from agentcheck.savers import SqliteSaver

THREAD = {"configurable": {"thread_id": "order-1001"}}


class State(TypedDict):
    order: str
    amount: int
    log: Annotated[list[str], operator.add]


def say(text: str) -> None:
    print(f"  [pid {os.getpid()}] {text}", flush=True)


def provider_file() -> Path:
    return Path(os.environ["DEMO_PROVIDER"])


@tool
@side_effect
def charge_card(order: str, amount: int, idempotency_key: str) -> str:
    """Charge the customer's card."""
    with provider_file().open("a") as ledger:  # the payment provider records the charge
        ledger.write(f"charge {order} ${amount} key={idempotency_key}\n")
    say(f"charge_card: charged ${amount} for {order} (idempotency key {idempotency_key[:16]}...)")
    return f"payment ok: ${amount}"


@tool
@idempotent
def send_receipt(order: str) -> str:
    """Email the receipt (sending it twice is harmless)."""
    say("send_receipt: sending...")
    if os.environ.get("DEMO_SLOW_RECEIPT"):
        time.sleep(60)  # the parent kills us here
    say("send_receipt: sent")
    return f"receipt sent for {order}"


def checkout(state: State) -> dict[str, Any]:
    say("checkout: started")
    paid = charge_card.invoke({"order": state["order"], "amount": state["amount"]})
    receipt = send_receipt.invoke({"order": state["order"]})
    return {"log": [paid, receipt]}


def build(saver: SqliteSaver) -> Any:
    builder = StateGraph(State)
    builder.add_node("checkout", checkout)
    builder.add_edge(START, "checkout")
    builder.add_edge("checkout", END)
    return builder.compile(checkpointer=saver)


def worker(db: str, resume: bool) -> None:
    # durability="sync": each finished step is on disk before the next one starts.
    # LangGraph's default ("async") writes checkpoints in the background, so a crash
    # can lose the newest ones and those steps run again (their effects do not).
    with SqliteSaver.from_conn_string(db) as saver:
        graph = build(saver)
        if resume:
            state = graph.get_state(THREAD)
            say(f"resuming {THREAD['configurable']['thread_id']}: next to run {list(state.next)}")
            final = graph.invoke(None, THREAD, durability="sync")
        else:
            inputs = {"order": "order-1001", "amount": 42, "log": []}
            final = graph.invoke(inputs, THREAD, durability="sync")
        say(f"finished: {final['log']}")


def print_journal(db: str) -> None:
    with connect(db) as journal:
        run = journal.get_run("order-1001")
        assert run is not None
        print(f"   run {run.run_id}: {run.status}, attempt {run.attempt}")
        for event in journal.events(run.run_id):
            print(f"   {event.seq:>3}  {event.kind:<5} {event.phase:<9} {event.name or ''}")
        for step in journal.steps(run_id=run.run_id):
            print(f"   step {step.name}: {step.status}, attempts {step.attempts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", help="SQLite file (default: a new temporary file)")
    parser.add_argument("--worker", choices=("start", "resume"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.db, resume=args.worker == "resume")
        return 0

    workdir = Path(tempfile.mkdtemp(prefix="agentcheck-demo-"))
    db = args.db or str(workdir / "agent.db")
    provider = workdir / "payment-provider.txt"
    env = {**os.environ, "DEMO_PROVIDER": str(provider)}
    me = [sys.executable, os.path.abspath(__file__), "--db", db, "--worker"]

    print(f"1. A worker process runs the checkout graph (checkpoints and journal in {db})")
    child = subprocess.Popen(
        [*me, "start"], stdout=subprocess.PIPE, text=True, env={**env, "DEMO_SLOW_RECEIPT": "1"}
    )
    assert child.stdout is not None
    for line in child.stdout:
        print(line, end="")
        if "send_receipt: sending" in line:
            break
    print(f"2. Killing worker pid {child.pid} with SIGKILL while the receipt is being sent")
    child.send_signal(signal.SIGKILL)
    child.wait()
    print(f"   worker exit status: {child.returncode} (killed by signal {-child.returncode})")

    print("3. A new worker process resumes from the same SQLite file")
    resumed = subprocess.run([*me, "resume"], text=True, capture_output=True, check=True, env=env)
    print(resumed.stdout, end="")

    charges = provider.read_text().splitlines()
    print(f"4. The payment provider saw {len(charges)} charge(s):")
    for charge in charges:
        print(f"   {charge}")
    print("5. The journal of the run:")
    print_journal(db)
    return 0 if len(charges) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
