"""A LangGraph run killed mid-way, resumed by another process from the SQLite file.

    python examples/crash_demo.py [--db PATH]

The parent starts a worker process that runs a four-step graph with an agentcheck
SqliteSaver. While the third step runs, the parent kills the worker with SIGKILL (no
cleanup, no exception handler runs: what a crash, an OOM kill or a power cut does). A
second worker process then opens the same file and resumes: the finished steps are not
run again, the interrupted step runs, and the run completes.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from agentcheck.savers import SqliteSaver

THREAD = {"configurable": {"thread_id": "report-42"}}
STEPS = ("plan", "research", "write", "review")


class State(TypedDict):
    topic: str
    log: Annotated[list[str], lambda a, b: a + b]


def make_node(name: str):  # type: ignore[no-untyped-def]
    def node(state: State) -> dict[str, list[str]]:
        print(f"  [pid {os.getpid()}] {name}: started", flush=True)
        if name == "write" and os.environ.get("DEMO_SLOW_WRITE"):
            time.sleep(60)  # a long LLM call; the parent kills us here
        print(f"  [pid {os.getpid()}] {name}: done", flush=True)
        return {"log": [f"{name} (pid {os.getpid()})"]}

    return node


def build(saver: SqliteSaver):  # type: ignore[no-untyped-def]
    builder = StateGraph(State)
    for name in STEPS:
        builder.add_node(name, make_node(name))
    builder.add_edge(START, STEPS[0])
    for a, b in zip(STEPS, STEPS[1:], strict=False):
        builder.add_edge(a, b)
    builder.add_edge(STEPS[-1], END)
    return builder.compile(checkpointer=saver)


def worker(db: str, resume: bool) -> None:
    # durability="sync": each finished step is on disk before the next one starts.
    # LangGraph's default ("async") writes checkpoints in the background, so a crash
    # can lose the newest ones and those steps run again.
    with SqliteSaver.from_conn_string(db) as saver:
        graph = build(saver)
        if resume:
            state = graph.get_state(THREAD)
            print(f"  [pid {os.getpid()}] found the run in {db}: done so far {state.values['log']}")
            print(f"  [pid {os.getpid()}] next to run: {list(state.next)}")
            final = graph.invoke(None, THREAD, durability="sync")
        else:
            inputs = {"topic": "crash-safe agents", "log": []}
            final = graph.invoke(inputs, THREAD, durability="sync")
        print(f"  [pid {os.getpid()}] finished: {final['log']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="SQLite file (default: a new temporary file)")
    parser.add_argument("--worker", choices=("start", "resume"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.db, resume=args.worker == "resume")
        return 0

    db = args.db or os.path.join(tempfile.mkdtemp(prefix="agentcheck-demo-"), "agent.db")
    me = [sys.executable, os.path.abspath(__file__), "--db", db, "--worker"]
    print(f"1. Starting a run in a worker process (checkpoints in {db})")
    child = subprocess.Popen(
        [*me, "start"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DEMO_SLOW_WRITE": "1"},
    )
    assert child.stdout is not None
    for line in child.stdout:
        print(line, end="")
        if "write: started" in line:
            break
    print(f"2. Killing worker pid {child.pid} with SIGKILL in the middle of 'write'")
    child.send_signal(signal.SIGKILL)
    child.wait()
    print(f"   worker exit status: {child.returncode} (killed by signal {-child.returncode})")
    print("3. Resuming in a new process from the same SQLite file")
    resumed = subprocess.run([*me, "resume"], text=True, capture_output=True, check=True)
    print(resumed.stdout, end="")
    print("   plan and research ran once, in the killed process; write and review ran in the")
    print("   new one. Nothing finished was lost and nothing finished was repeated.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
