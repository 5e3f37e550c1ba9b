"""A child process for the crash tests (tests/effects/test_crash.py): runs one scenario.

    python crash_worker.py SCENARIO DB WORKDIR PHASE [ANSWER_JSON]

* ``SCENARIO``: ``agent`` / ``agent_react`` / ``agent_unwrapped``, ``interrupt``, ``fanout``,
  ``model``,
  ``tool_<variant>`` (``raise``, ``reconcile``, ``reconcile_absent``, ``idempotent``, ``ask``),
  ``approve_<variant>`` (``reconcile``, ``ask``: a charge that asks its own approval, then
  the node's own question), ``confirm_<variant>`` (the same policies: the node's own
  question first, then the charge).
* ``DB``: a SQLite path (``SqliteSaver``) or a ``postgresql://`` URL (``PostgresSaver``).
  Scenario ``agent_unwrapped`` uses the official ``langgraph.checkpoint.sqlite.SqliteSaver``
  and no agentcheck wrapper at all (the contrast: what happens without agentcheck).
* ``WORKDIR``: the "external systems" (payment provider, email server, LLM provider) are
  append-only files there, one JSON line per real effect with its idempotency key, so the
  test counts real effects across processes.
* ``PHASE``: ``crash`` (start the run and block forever at the scenario's kill point, after
  printing its marker), ``start`` (start the run, no blocking), ``resume`` (continue the
  thread: ``invoke(None)``), ``edit`` (an operator's update_state first: the model's last
  message written again as the ``agent`` node's, or for ``fanout`` a note as the ``plan``
  node's, then ``invoke(None)``), ``reorder`` (``fanout``: the items changed as the
  ``plan`` node's, then ``invoke(None)``), ``answer``
  (``invoke(Command(resume=ANSWER_JSON))``) or ``answer_crash`` (the same, blocking at
  the scenario's kill point as ``crash`` does).

The worker prints ``MARKER <name> <json>`` lines (flushed) at chosen points and, when the
run returns, one JSON line last: ``{"status": "done" | "interrupted" | "error", ...}``
(exit status 0, or 3 for "error"). Graphs run with ``durability="sync"``.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fake_models

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, Send, interrupt

from agentcheck import (
    NOT_DONE,
    UnknownOutcome,
    idempotent,
    side_effect,
)
from agentcheck.adapters.langgraph import durable_model
from fake_models import ScriptedChatModel, tool_call_message

# create_react_agent is deprecated in favour of langchain.agents (not installed); it is
# still LangGraph's prebuilt ReAct agent.
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=".*create_react_agent.*")

THREAD_ID = "order-1001"
CONFIG: dict[str, Any] = {"configurable": {"thread_id": THREAD_ID}}
BLOCK_SECONDS = 120  # the parent kills us long before this

SCENARIO, DB, WORKDIR_ARG, PHASE = sys.argv[1:5]
ANSWER = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
WORKDIR = Path(WORKDIR_ARG)
CHARGES = WORKDIR / "charges.jsonl"  # the payment provider
RECEIPTS = WORKDIR / "receipts.jsonl"  # the email server
LLM_CALLS = WORKDIR / "llm_calls.txt"  # the LLM provider (ScriptedChatModel's calls_file)

SAVER: Any = None  # the saver the graph runs on (set in main)
_PRINT_LOCK = threading.Lock()


# -- the external systems -----------------------------------------------------------------


def record_effect(path: Path, **fields: Any) -> None:
    """One real effect: one line, written and flushed to disk before going on."""
    with open(path, "a") as f:
        f.write(json.dumps({**fields, "pid": os.getpid()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def effects(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def marker(name: str, *, kill_point: bool = False, **info: Any) -> None:
    """Tell the parent where we are; at a kill point of the ``crash`` phase, block."""
    with _PRINT_LOCK:  # tools may run in parallel threads: one whole line each
        sys.stdout.write(f"MARKER {name} {json.dumps(info)}\n")
        sys.stdout.flush()
    if kill_point and PHASE in ("crash", "answer_crash"):
        time.sleep(BLOCK_SECONDS)


def wait_until(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting until {what}")
        time.sleep(0.02)


def charge_completed_in_journal() -> bool:
    steps = SAVER.journal.steps(scope=THREAD_ID, status=["completed"])
    return any(s.name == "charge_card" for s in steps)


# -- scenario 1 (and 5): a tool-calling agent, two tools called in one model message -----


def find_receipt(outcome: UnknownOutcome) -> Any:
    """Reconcile send_receipt: ask the email server whether this key was sent."""
    for line in effects(RECEIPTS):
        if line["key"] == outcome.idempotency_key:
            return f"receipt sent to {line['email']}"
    return NOT_DONE


def agent_tools(wrapped: bool) -> list[Any]:
    def charge_card_body(amount: int, key: str) -> str:
        record_effect(CHARGES, key=key, amount=amount)
        marker("CHARGED", key=key)
        return f"charged {amount}"

    def send_receipt_body(email: str, key: str) -> str:
        # ToolNode runs both calls in parallel threads: die only once the charge is done
        # and (with agentcheck) recorded as completed.
        if PHASE == "crash":
            wait_until(lambda: len(effects(CHARGES)) >= 1, "the card is charged")
            if wrapped:
                wait_until(charge_completed_in_journal, "the charge step is completed")
        record_effect(RECEIPTS, key=key, email=email)
        marker("RECEIPT_SENT", kill_point=True, key=key)
        return f"receipt sent to {email}"

    if not wrapped:

        @tool
        def charge_card(amount: int) -> str:
            """Charge the customer's card."""
            return charge_card_body(amount, "none")

        @tool
        def send_receipt(email: str) -> str:
            """Email the receipt to the customer."""
            return send_receipt_body(email, "none")

        return [charge_card, send_receipt]

    @tool
    @side_effect
    def charge_card(amount: int, idempotency_key: str) -> str:  # type: ignore[no-redef]
        """Charge the customer's card."""
        return charge_card_body(amount, idempotency_key)

    @tool
    @side_effect(reconcile=find_receipt)
    def send_receipt(email: str, idempotency_key: str) -> str:  # type: ignore[no-redef]
        """Email the receipt to the customer."""
        return send_receipt_body(email, idempotency_key)

    return [charge_card, send_receipt]


AGENT_SCRIPT = [
    tool_call_message(
        ("charge_card", {"amount": 42}, "call_charge"),
        ("send_receipt", {"email": "ada@example.com"}, "call_receipt"),
    ),
    AIMessage(content="Charged 42 and sent the receipt."),
]


def build_agent(wrapped: bool, react: bool = False) -> Any:
    """The classic agent graph (``agent`` node + one ``ToolNode`` task running both calls
    in parallel threads) or, with ``react``, the prebuilt ``create_react_agent`` (one
    ``Send`` task per tool call)."""
    tools = agent_tools(wrapped)
    inner = ScriptedChatModel(responses=AGENT_SCRIPT, calls_file=str(LLM_CALLS))
    chat = durable_model(inner) if wrapped else inner
    if react:
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(chat, tools, checkpointer=SAVER)
    model = chat.bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=SAVER)


def agent_input() -> dict[str, Any]:
    return {"messages": [HumanMessage("Charge 42 to my card and email me the receipt.")]}


# -- scenario 2: a node that charges, then asks a human (interrupt) ------------------------


class OrderState(TypedDict, total=False):
    amount: int
    charge: dict[str, Any]
    status: str


@side_effect
def charge(amount: int, idempotency_key: str) -> dict[str, Any]:
    record_effect(CHARGES, key=idempotency_key, amount=amount)
    return {"amount": amount, "key": idempotency_key}


def build_interrupt() -> Any:
    def checkout(state: OrderState) -> dict[str, Any]:
        receipt = charge(state["amount"])
        marker("CHARGED_BEFORE_INTERRUPT", kill_point=True, key=receipt["key"])
        answer = interrupt({"question": "Ship the order?", "charged": receipt["amount"]})
        return {"charge": receipt, "status": f"shipping: {answer}"}

    builder = StateGraph(OrderState)
    builder.add_node("checkout", checkout)
    builder.add_edge(START, "checkout")
    builder.add_edge("checkout", END)
    return builder.compile(checkpointer=SAVER)


# -- scenario 2b: a fan-out (Send) whose second branch dies after its charge -------------


class FanOutState(TypedDict, total=False):
    items: list[int]
    note: str
    charged: Annotated[list[int], operator.add]


def build_fanout() -> Any:
    def plan(state: FanOutState) -> dict[str, Any]:
        return {}

    def fan_out(state: FanOutState) -> list[Send]:
        return [Send("work", {"items": [item]}) for item in state["items"]]

    def work(state: FanOutState) -> dict[str, Any]:
        [item] = state["items"]
        if item == 2 and PHASE == "crash":  # the other branch charges first
            wait_until(lambda: len(effects(CHARGES)) >= 1, "the first branch charged")
        receipt = charge(item * 10)
        if item == 2:
            marker("BRANCH_CHARGED", kill_point=True, key=receipt["key"])
        return {"charged": [receipt["amount"]]}

    builder = StateGraph(FanOutState)
    builder.add_node("plan", plan)
    builder.add_node("work", work)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan_out, ["work"])
    builder.add_edge("work", END)
    return builder.compile(checkpointer=SAVER)


# -- scenario 3: a node that calls the durable model and dies before it finishes ----------


class ThinkState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


MODEL_SCRIPT = [
    tool_call_message(("lookup_order", {"order": 1001}, "call_first")),
    tool_call_message(("lookup_order", {"order": 1001}, "call_second_paid_call")),
]


def build_model() -> Any:
    model = durable_model(ScriptedChatModel(responses=MODEL_SCRIPT, calls_file=str(LLM_CALLS)))

    def think(state: ThinkState) -> dict[str, Any]:
        message = model.invoke(state["messages"])
        marker(
            "MODEL_RETURNED",
            kill_point=True,
            id=message.id,
            tool_call_ids=[tc["id"] for tc in message.tool_calls],
        )
        return {"messages": [message]}

    builder = StateGraph(ThinkState)
    builder.add_node("think", think)
    builder.add_edge(START, "think")
    builder.add_edge("think", END)
    return builder.compile(checkpointer=SAVER)


# -- scenario 4: killed inside a side-effecting tool -------------------------------------


def find_charge(outcome: UnknownOutcome) -> Any:
    """Reconcile charge_card: ask the payment provider about this idempotency key."""
    for line in effects(CHARGES):
        if line["key"] == outcome.idempotency_key:
            return f"charged {line['amount']} (found by key)"
    return NOT_DONE


def tool_variant(variant: str) -> Any:
    """charge_card as each variant declares it; killed inside, after (or before) its effect."""
    before_effect = variant == "reconcile_absent"

    def body(amount: int, key: str) -> str:
        if before_effect:
            marker("INSIDE_TOOL", kill_point=True, key=key)
        record_effect(CHARGES, key=key, amount=amount)
        if not before_effect:
            marker("INSIDE_TOOL", kill_point=True, key=key)
        return f"charged {amount}"

    if variant == "raise":
        decorator: Any = side_effect
    elif variant in ("reconcile", "reconcile_absent"):
        decorator = side_effect(reconcile=find_charge)
    elif variant == "idempotent":
        decorator = idempotent
    elif variant == "ask":
        decorator = side_effect(on_unknown="ask")
    else:
        raise SystemExit(f"unknown tool variant {variant!r}")

    @tool
    @decorator
    def charge_card(amount: int, idempotency_key: str) -> str:
        """Charge the customer's card."""
        return body(amount, idempotency_key)

    return charge_card


def build_tool(variant: str) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([tool_variant(variant)]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=SAVER)


def charge_policy(variant: str) -> Any:
    """The decorator of a charge whose outcome a crash leaves unknown: ``reconcile``
    (looks the charge up by its key) or ``ask`` (asks a human)."""
    if variant == "reconcile":
        return side_effect(reconcile=find_charge)
    if variant == "ask":
        return side_effect(on_unknown="ask")
    raise SystemExit(f"unknown policy {variant!r}")


def build_approve(variant: str) -> Any:
    """A checkout whose charge asks its own approval (interrupt() inside the wrapped
    call, before the effect; killed after it), then the node asks whether to ship."""

    def body(amount: int, key: str) -> str:
        if interrupt({"question": f"Charge {amount}?"}) != "approve":
            return "not approved"
        record_effect(CHARGES, key=key, amount=amount)
        marker("INSIDE_TOOL", kill_point=True, key=key)
        return f"charged {amount}"

    @charge_policy(variant)
    def charge_card(amount: int, idempotency_key: str) -> str:
        return body(amount, idempotency_key)

    def checkout(state: OrderState) -> dict[str, Any]:
        charged = charge_card(state["amount"])
        ship = interrupt({"question": "Ship the order?"})
        return {"status": f"{charged}; shipping: {ship}"}

    builder = StateGraph(OrderState)
    builder.add_node("prep", lambda state: {})  # (an operator's edit is made as this node)
    builder.add_node("checkout", checkout)
    builder.add_edge(START, "prep")
    builder.add_edge("prep", "checkout")
    builder.add_edge("checkout", END)
    return builder.compile(checkpointer=SAVER)


def build_confirm(variant: str) -> Any:
    """The node asks its own question first, then makes a charge (killed after it)."""

    @charge_policy(variant)
    def charge_card(amount: int, idempotency_key: str) -> str:
        record_effect(CHARGES, key=idempotency_key, amount=amount)
        marker("INSIDE_TOOL", kill_point=True, key=idempotency_key)
        return f"charged {amount}"

    def checkout(state: OrderState) -> dict[str, Any]:
        confirmed = interrupt({"question": "Confirm the order?"})
        return {"status": f"{confirmed}; {charge_card(state['amount'])}"}

    builder = StateGraph(OrderState)
    builder.add_node("checkout", checkout)
    builder.add_edge(START, "checkout")
    builder.add_edge("checkout", END)
    return builder.compile(checkpointer=SAVER)


def tool_input() -> dict[str, Any]:
    return {
        "messages": [
            HumanMessage("Pay order 1001."),
            tool_call_message(("charge_card", {"amount": 42}, "call_pay")),
        ]
    }


# -- running --------------------------------------------------------------------------------


def build() -> tuple[Any, Any]:
    """The graph of the scenario and its initial input."""
    if SCENARIO == "agent":
        return build_agent(wrapped=True), agent_input()
    if SCENARIO == "agent_react":
        return build_agent(wrapped=True, react=True), agent_input()
    if SCENARIO == "agent_unwrapped":
        return build_agent(wrapped=False), agent_input()
    if SCENARIO == "interrupt":
        return build_interrupt(), {"amount": 42}
    if SCENARIO == "fanout":
        return build_fanout(), {"items": [1, 2]}
    if SCENARIO == "model":
        return build_model(), {"messages": [HumanMessage("Where is order 1001?")]}
    if SCENARIO.startswith("tool_"):
        return build_tool(SCENARIO.removeprefix("tool_")), tool_input()
    if SCENARIO.startswith("confirm_"):
        return build_confirm(SCENARIO.removeprefix("confirm_")), {"amount": 42}
    if SCENARIO.startswith("approve_"):
        return build_approve(SCENARIO.removeprefix("approve_")), {"amount": 42}
    raise SystemExit(f"unknown scenario {SCENARIO!r}")


def message_json(m: BaseMessage) -> dict[str, Any]:
    return {
        "type": m.type,
        "content": m.content,
        "id": m.id,
        "tool_call_ids": [tc["id"] for tc in getattr(m, "tool_calls", None) or []],
        "tool_call_id": getattr(m, "tool_call_id", None),
    }


def jsonable(values: Any) -> Any:
    out: dict[str, Any] = {}
    for k, v in (values or {}).items():
        if k == "__interrupt__":
            continue
        if k == "messages":
            out[k] = [message_json(m) for m in v]
        else:
            out[k] = v
    return out


def run(graph: Any, inputs: Any) -> dict[str, Any]:
    if PHASE in ("crash", "start"):
        arg = inputs
    elif PHASE == "resume":
        arg = None
    elif PHASE == "reorder":  # fanout: a new item first, the earlier ones swapped
        graph.update_state(CONFIG, {"items": [3, 2, 1]}, as_node="plan")
        arg = None
    elif PHASE == "edit":
        # An operator looks at the stopped run and resumes it after an edit: the model's
        # last message (its tool calls) is written again, unchanged, as the agent's.
        if SCENARIO == "fanout":  # a note as the planner's: it sends the branches again
            graph.update_state(CONFIG, {"note": "checked"}, as_node="plan")
        elif SCENARIO.startswith("approve_"):  # a note as the node before the checkout's
            graph.update_state(CONFIG, {"charge": {"checked": True}}, as_node="prep")
        else:
            last = graph.get_state(CONFIG).values["messages"][-1]
            graph.update_state(CONFIG, {"messages": [last]}, as_node="agent")
        arg = None
    elif PHASE in ("answer", "answer_crash"):
        arg = Command(resume=ANSWER)
    else:
        raise SystemExit(f"unknown phase {PHASE!r}")
    try:
        result = graph.invoke(arg, CONFIG, durability="sync")
    except Exception as exc:
        return {"status": "error", "error_type": type(exc).__name__, "error": str(exc)}
    interrupts = result.get("__interrupt__") if isinstance(result, dict) else None
    if interrupts:
        return {
            "status": "interrupted",
            "interrupts": [i.value for i in interrupts],
            "values": jsonable(result),
        }
    return {"status": "done", "values": jsonable(result)}


def main() -> int:
    global SAVER
    if SCENARIO == "agent_unwrapped":
        from langgraph.checkpoint.sqlite import SqliteSaver as OfficialSqliteSaver

        opener: Any = OfficialSqliteSaver.from_conn_string(DB)
    elif DB.startswith(("postgresql://", "postgres://")):
        from agentcheck.savers import PostgresSaver

        opener = PostgresSaver.from_conn_string(DB, pool_size=4)
    else:
        from agentcheck.savers import SqliteSaver

        opener = SqliteSaver.from_conn_string(DB)
    with opener as saver:
        SAVER = saver
        graph, inputs = build()
        outcome = run(graph, inputs)
    print(json.dumps(outcome, default=repr), flush=True)
    return 3 if outcome["status"] == "error" else 0


if __name__ == "__main__":
    sys.exit(main())
