"""LangGraph glue: where a wrapped call runs, tool-call ids, and durable model calls.

Nothing needs configuring: inside a graph compiled with an agentcheck saver, LangGraph's
runtime config names the saver (``__pregel_checkpointer``), the thread, the checkpoint
namespace and the task; the task id is derived from the parent checkpoint, so a node
executed again from the same checkpoint (crash resume, interrupt resume, retry) gets the
same id and its calls get the same step keys.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.callbacks.manager import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig
from langchain_core.runnables.config import get_config_list, patch_config
from langchain_core.tracers.context import register_configure_hook
from langgraph.config import get_config
from langgraph.errors import GraphBubbleUp
from langgraph.types import interrupt

from agentcheck import _task_names as task_names
from agentcheck.effects import (
    CallContext,
    Done,
    EffectSpec,
    ProtocolRun,
    attempt_counters,
    drive_async,
    drive_sync,
    note_interrupt,
    protocol,
    register_resolver,
    resolve_context,
)
from agentcheck.savers._runs import root_task, task_key_prefix
from agentcheck.savers.base import AsyncSaver, SyncSaver

__all__ = ["DurableChatModel", "durable_model", "langgraph_context"]


class _ToolCallIds(BaseCallbackHandler):
    """Remembers the tool-call id of each running tool, by the tool's run id, and the
    node of each LangGraph task that starts.

    LangChain gives a tool's callbacks the model's tool-call id but not the tool's
    function; a wrapped function finds its own through the run id of its parent run.
    A run started inside a tool run (a tool the tool invokes, a chain it runs) has the
    tool's id too: calls made inside two tool calls that run side by side are keyed
    apart by it, not by the order they happen to start in.
    """

    run_inline = True
    raise_error = False
    ignore_llm = True
    ignore_retriever = True
    ignore_chat_model = True
    ignore_custom_event = True
    ignore_retry = True

    def __init__(self, size: int = 10_000) -> None:
        self.ids: OrderedDict[UUID, str] = OrderedDict()
        self.size = size
        self.lock = threading.Lock()

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        # (A tool invoked inside a tool call has no id of its own: it takes its parent's.)
        self._remember(run_id, kwargs.get("tool_call_id"), kwargs.get("parent_run_id"))

    def _remember(self, run_id: UUID, tool_call_id: Any, parent_run_id: UUID | None) -> None:
        """Keep the run's tool-call id: its own, else its parent run's, if either."""
        if not tool_call_id and parent_run_id is not None:
            tool_call_id = self.ids.get(parent_run_id)
        if not tool_call_id:
            return
        with self.lock:
            self.ids[run_id] = str(tool_call_id)
            while len(self.ids) > self.size:
                self.ids.popitem(last=False)

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._remember(run_id, None, parent_run_id)  # a chain run inside a tool run
        # A task's callback metadata carries its namespace, "node:task_id" last. (Task
        # ids hold no ':'; a functional API @task's name may hold '|' or ':'.)
        ns = (metadata or {}).get("langgraph_checkpoint_ns")
        node = (metadata or {}).get("langgraph_node")
        if isinstance(ns, str) and isinstance(node, str) and node:
            head, _, task_id = ns.rpartition(":")
            if task_id and (head == node or head.endswith("|" + node)):
                task_names.remember(task_id, node)

    def _forget(self, run_id: UUID) -> None:
        with self.lock:
            self.ids.pop(run_id, None)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if run_id in self.ids:  # a chain run inside a tool run
            self._forget(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.on_chain_end(None, run_id=run_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._forget(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._forget(run_id)

    def lookup(self, run_id: UUID | None) -> str | None:
        if run_id is None:
            return None
        with self.lock:
            return self.ids.get(run_id)


_tool_call_ids = _ToolCallIds()
# A configure hook whose variable always holds the handler: LangChain adds it to every
# callback manager, so every tool run reports its tool-call id.
_hook_var: ContextVar[_ToolCallIds | None] = ContextVar(
    "agentcheck_tool_call_ids", default=_tool_call_ids
)
register_configure_hook(_hook_var, inheritable=True)


def langgraph_context() -> CallContext | None:
    """The :class:`~agentcheck.effects.CallContext` of the LangGraph task running now,
    or None outside a graph or in a graph without an agentcheck saver."""
    try:
        config = get_config()
    except RuntimeError:
        return None
    conf = config.get("configurable") or {}
    saver = conf.get("__pregel_checkpointer")
    thread_id = conf.get("thread_id")
    if not isinstance(saver, (SyncSaver, AsyncSaver)) or thread_id is None:
        return None
    task_id = conf.get("__pregel_task_id", "")
    ns = conf.get("checkpoint_ns", "")
    # The scratchpad is replaced for each attempt of a task (LangGraph retries), so
    # ordinals restart with each attempt, as the node's code does.
    scratchpad = conf.get("__pregel_scratchpad")
    counters = attempt_counters.counters_for(scratchpad) if scratchpad is not None else {}
    callbacks = config.get("callbacks")
    parent_run_id = getattr(callbacks, "parent_run_id", None)
    # The task's own checkpoint: that of the graph (namespace) that runs it.
    checkpoints = conf.get("checkpoint_map") or {}
    parent_ns, _, own = str(ns).rpartition("|")
    own_checkpoint = checkpoints.get(parent_ns) if task_id else None
    resolve_prefix = None
    if conf.get("__pregel_resuming") and own_checkpoint:
        # Resumed: this task may go on with one that paused before an update_state.
        node = own.partition(":")[0]
        if node:
            resolve_prefix = partial(
                _continued_prefix, saver, str(thread_id), parent_ns, str(own_checkpoint),
                node, str(ns), str(task_id), _task_path(config), _task_triggers(config),
            )  # fmt: skip
    stored_first = None
    if own_checkpoint and conf.get("__pregel_durability", "async") == "async":  # the default
        # The task's checkpoint may still be on its way to the database. It is stored
        # under the outermost namespace the map gives it: a functional API @task's map
        # names its entrypoint's task with the root's checkpoint.
        stored_ns = min((k for k, v in checkpoints.items() if v == own_checkpoint), key=len)
        stored_first = (str(thread_id), str(stored_ns), str(own_checkpoint))
    root_checkpoint = checkpoints.get("")
    root = root_task(str(ns))
    return CallContext(
        stored_first=stored_first,
        journal=saver.journal,
        scope=str(thread_id),
        key_prefix=f"{ns}|{task_id}",
        resolve_prefix=resolve_prefix,
        position=(str(root_checkpoint), root) if root_checkpoint and root else None,
        run_id=str(thread_id),
        call_id=_tool_call_ids.lookup(parent_run_id),
        counters=counters,
        ask=interrupt,
        framework="langgraph",
        count_interrupts=lambda: _count_interrupts(scratchpad),
        skip_interrupts=lambda n, fill: _skip_interrupts(scratchpad, n, fill),
        task=str(task_id) if task_id else None,
        interrupt_position=lambda: _interrupt_position(scratchpad),
    )


# How LangGraph writes a task's path with its writes.
_path_str: Callable[[Any], str] | None
try:
    from langgraph.pregel._algo import task_path_str as _lg_task_path_str

    _path_str = _lg_task_path_str
except ImportError:  # pragma: no cover - another LangGraph layout
    _path_str = None

# Key prefixes of resumed tasks, by (thread, namespace, task id): found once per task.
_continued: OrderedDict[tuple[str, str, str], str] = OrderedDict()
_continued_lock = threading.Lock()


def _task_path(config: Any) -> str | None:
    """The running task's path as LangGraph stores it with the task's writes (from the
    ``langgraph_path`` of its callback metadata); None if it cannot tell."""
    path = (config.get("metadata") or {}).get("langgraph_path")
    if not isinstance(path, (tuple, list)) or _path_str is None:
        return None
    try:
        return str(_path_str(tuple(path)))
    except Exception:  # another LangGraph's shape: look the task up by its node
        return None


def _task_triggers(config: Any) -> tuple[str, ...] | None:
    """The running task's triggers (its callback metadata's ``langgraph_triggers``), with
    which LangGraph made its id; None if it cannot tell."""
    found = (config.get("metadata") or {}).get("langgraph_triggers")
    if not isinstance(found, (tuple, list)) or not all(isinstance(t, str) for t in found):
        return None
    return tuple(found)


def _continued_prefix(
    saver: SyncSaver | AsyncSaver,
    thread_id: str,
    parent_ns: str,
    checkpoint_id: str,
    node: str,
    ns: str,
    task_id: str,
    path: str | None,
    node_triggers: tuple[str, ...] | None = None,
) -> Generator[Any, Any, str]:
    """The key prefix of a resumed task's calls (a journal operation): that of the task
    it goes on with, when update_state was called while the node was paused at an
    interrupt (LangGraph then runs it as a new task of the update's checkpoint, and its
    calls would get new keys and run again), else its own."""
    key = (thread_id, ns, task_id)
    with _continued_lock:
        found = _continued.get(key)
    if found is not None:
        return found
    earlier = yield from saver._continued_task(
        thread_id, parent_ns, checkpoint_id, node, path, node_triggers
    )
    prefix = f"{ns}|{task_id}" if earlier is None else task_key_prefix(parent_ns, node, earlier)
    with _continued_lock:
        _continued[key] = prefix
        while len(_continued) > 4096:
            _continued.popitem(last=False)
    return prefix


class _Counting:
    """LangGraph's count of a task's interrupt() calls, which also tells agentcheck of
    each (effects.note_interrupt): a wrapped call counts the questions asked in its own
    context, not those of a tool running beside it."""

    __slots__ = ("inner",)

    def __init__(self, inner: Callable[[], int]) -> None:
        self.inner = inner

    def __call__(self) -> int:
        n = self.inner()
        note_interrupt()
        return n


def _counter_lock() -> Any:
    """The lock under which LangGraph makes a counter on first use, so that a tool's
    first interrupt() at the same moment cannot replace the hook (ours if it moved)."""
    try:
        from langgraph.pregel import _algo
    except ImportError:  # pragma: no cover - another LangGraph layout
        return _own_lock
    return getattr(_algo, "LAZY_ATOMIC_COUNTER_LOCK", _own_lock)


_own_lock = threading.Lock()


def _count_interrupts(scratchpad: Any) -> bool:
    """Have the task attempt's interrupt() calls counted (see :class:`_Counting`): its
    ``interrupt_counter`` is LangGraph's ``LazyAtomicCounter``, whose ``_counter`` is the
    ``next`` of an ``itertools.count``, made on first use. False if it is not that shape
    (another LangGraph version): questions are then not counted."""
    counter = getattr(scratchpad, "interrupt_counter", None)
    if counter is None or not hasattr(type(counter), "_counter"):
        return False
    with _counter_lock():
        inner = counter._counter
        if isinstance(inner, _Counting):
            return True
        if inner is None:
            inner = itertools.count(0).__next__
        elif not callable(inner):
            return False
        counter._counter = _Counting(inner)
    return True


def _skip_interrupts(scratchpad: Any, n: int, fill: bool = False) -> None:
    """Pass over the task's next ``n`` questions as ``n`` answered interrupt() calls
    would (a replayed call that asked a human when it ran). One whose answer is kept
    with the task is only counted. Else, an answer given with ``Command(resume=...)``
    and not yet used is taken as that question's, as LangGraph would (an execution that
    crashed had used it there), unless ``fill``: the questions were answered in another
    task (this one continues it after update_state), and the answer is for a later
    question. The place is then kept with an empty answer, so that LangGraph gives the
    next question its own (it takes such an answer only at the place after the kept
    ones)."""
    counter = getattr(scratchpad, "interrupt_counter", None)
    if counter is None:
        return
    answers = getattr(scratchpad, "resume", None)
    for _ in range(n):
        position = _interrupt_position(scratchpad)
        if position is None or not isinstance(answers, list):
            counter()
        elif position[0] < len(answers):
            counter()  # its answer is kept
        elif not fill and position[0] < position[1]:
            interrupt(None)  # takes the pending answer as this question's
        else:
            index = counter()
            if fill:
                while len(answers) <= index:
                    answers.append(None)


def _null_resume_unused(scratchpad: Any) -> bool:
    """Whether the answer given with ``Command(resume=...)`` (no interrupt id) is there
    and not yet used in this execution. ``get_null_resume(False)`` cannot tell: it still
    returns the answer once an interrupt() has used it. Read from the function's
    closure, as LangGraph's ``_scratchpad`` makes it (the answer is unused while it is
    still among the pending writes; a subgraph's falls back on its parent's); False
    for another shape, so that no answer is taken for one."""
    get_null_resume = getattr(scratchpad, "get_null_resume", None)
    code = getattr(get_null_resume, "__code__", None)
    cells = getattr(get_null_resume, "__closure__", None)
    if code is None or cells is None:
        return False
    try:
        env = {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells, strict=True)}
    except ValueError:  # an empty cell
        return False
    write = env.get("null_resume_write")
    if write is None:
        parent = env.get("parent_scratchpad")
        return parent is not None and _null_resume_unused(parent)
    pending = env.get("pending_writes")
    return isinstance(pending, list) and any(w is write for w in pending)


def _interrupt_position(scratchpad: Any) -> tuple[int, int] | None:
    """(The index the task's next interrupt() gets, how many of its questions have an
    answer: those kept with the task, plus one given with ``Command(resume=...)`` and
    not yet used, which LangGraph gives to the first question past them), or None if
    LangGraph's scratchpad is not of the shape this reads: its counter the ``next`` of
    an ``itertools.count`` (read from its repr, ``count(3)``), its answers a list."""
    counter = getattr(scratchpad, "interrupt_counter", None)
    answers = getattr(scratchpad, "resume", None)
    if counter is None or not isinstance(answers, list):
        return None
    answered = len(answers) + _null_resume_unused(scratchpad)
    inner = getattr(counter, "_counter", None)
    if isinstance(inner, _Counting):
        inner = inner.inner
    if inner is None:
        return 0, answered
    count = getattr(inner, "__self__", None)
    if not isinstance(count, itertools.count):
        return None
    text = repr(count)
    try:
        next_index = int(text[text.index("(") + 1 : -1])
    except ValueError:
        return None
    return next_index, answered


register_resolver(langgraph_context, pause_errors=(GraphBubbleUp,))


# -- durable model calls ------------------------------------------------------------------


def _record(result: ChatResult, run_id: Any = None) -> dict[str, Any]:
    # LangChain gives a message without an id one derived from the run id, after we
    # return it; a replay runs under another run id. Give it its id now, so that the
    # recorded message and every replay of it carry the same one.
    for i, generation in enumerate(result.generations):
        if generation.message.id is None:
            generation.message.id = f"lc_run--{run_id or uuid.uuid4()}-{i}"
    return {
        "messages": [g.message for g in result.generations],
        "generation_info": [g.generation_info for g in result.generations],
        "llm_output": result.llm_output,
    }


def _replay(recorded: Any) -> ChatResult:
    if not isinstance(recorded, dict) or "messages" not in recorded:
        raise TypeError(f"the recorded model call cannot be replayed: {recorded!r:.200}")
    infos = recorded.get("generation_info") or [None] * len(recorded["messages"])
    return ChatResult(
        generations=[
            ChatGeneration(message=m, generation_info=i)
            for m, i in zip(recorded["messages"], infos, strict=False)
        ],
        llm_output=recorded.get("llm_output"),
    )


def _usage(recorded: Any) -> tuple[int | None, int | None]:
    """Tokens of a recorded model call, as the model reported them."""
    tin = tout = None
    for message in recorded.get("messages", []) if isinstance(recorded, dict) else []:
        usage = getattr(message, "usage_metadata", None)
        if usage:
            tin = (tin or 0) + int(usage.get("input_tokens", 0))
            tout = (tout or 0) + int(usage.get("output_tokens", 0))
    return tin, tout


# A model call's ordinal (CallContext.take_ordinal), taken where the call starts: in
# invoke or ainvoke, before LangChain's callbacks run (an async handler, or a sync one
# LangChain runs in a thread pool, lets calls started together by asyncio.gather reach
# _generate in another order), or by batch for each input (whose calls run in threads).
# The context is kept with it: resolving it again in _generate would cost a second look-up.
_reserved: ContextVar[tuple[CallContext, tuple[str, int]] | None] = ContextVar(
    "agentcheck_model_call", default=None
)
# Where batch hands each input's ordinal to invoke ("__": kept out of tracing metadata).
_ORDINAL_KEY = "__agentcheck_model_ordinal"


def _call_context() -> tuple[CallContext | None, tuple[str, int] | None]:
    """The context of the model call being made, and its ordinal if it was reserved
    (once: a second model call under the same invoke, none is expected, takes its own)."""
    reserved = _reserved.get()
    if reserved is None:
        return resolve_context(), None
    _reserved.set(None)
    return reserved


class DurableChatModel(BaseChatModel):
    """A chat model whose calls are journaled and, when a task runs again, replayed.

    Replays cost no tokens and return the very message recorded, with the same tool-call
    ids, which is what keeps the step keys of the tools it calls stable. Outside a graph
    with an agentcheck saver it simply calls the wrapped model.

    A call's ledger step records how many messages the prompt had and its last one
    (usually the newest input: the user's message, a tool's result), not the whole
    prompt: the thread's checkpoints already hold the conversation's state, and a prompt
    stored at every call would make the journal grow with the square of the
    conversation. A prompt built inside the node (a system prompt, retrieved context, a
    trimmed window) is then not kept as sent: ``record_prompt=True`` stores each prompt
    whole, for an audit of exactly what the model was sent.
    """

    inner: BaseChatModel
    record_prompt: bool = False

    @property
    def _llm_type(self) -> str:
        return f"agentcheck-durable:{self.inner._llm_type}"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"inner": self.inner._identifying_params}

    def _should_stream(
        self,
        *,
        async_api: bool,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> bool:
        """Stream when the wrapped model would: one that cannot stream (no ``_stream``),
        or has streaming disabled, is called through ``_generate`` instead."""
        return self.inner._should_stream(async_api=async_api, run_manager=run_manager, **kwargs)

    def _spec(self) -> EffectSpec:
        return EffectSpec(
            name=self.inner._llm_type, effect="idempotent", on_unknown="retry",
            reconcile=None, kind="llm", usage=_usage, log_args=False,
        )  # fmt: skip

    def _protocol(
        self, ctx: CallContext, messages: list[BaseMessage], ordinal: tuple[str, int] | None
    ) -> Generator[Any, Any, tuple[Any, str]]:
        args: dict[str, Any] = (
            {"messages": messages}
            if self.record_prompt
            else {"messages": len(messages), "last": messages[-1] if messages else None}
        )
        return protocol(self._spec(), ctx, args, ordinal)

    @contextmanager
    def _reservation(self, config: RunnableConfig | None) -> Iterator[None]:
        """This call's ordinal, taken now (or the one batch took for it), for its
        _generate to use, with its context (nothing outside a journaled graph)."""
        ctx = resolve_context()
        if ctx is None:
            yield
            return
        ordinal = ((config or {}).get("configurable") or {}).get(_ORDINAL_KEY)
        if ordinal is None:
            spec = self._spec()
            ordinal = ctx.take_ordinal(spec.kind, spec.name)
        token = _reserved.set((ctx, (str(ordinal[0]), int(ordinal[1]))))
        try:
            yield
        finally:
            _reserved.reset(token)

    def _reserve_each(
        self, inputs: Sequence[Any], config: RunnableConfig | Sequence[RunnableConfig] | None
    ) -> Any:
        """The configs of a batch, each with its input's ordinal, taken in input order."""
        ctx = resolve_context()
        if ctx is None or not inputs:
            return config
        spec = self._spec()
        return [
            patch_config(c, configurable={_ORDINAL_KEY: ctx.take_ordinal(spec.kind, spec.name)})
            for c in get_config_list(config, len(inputs))
        ]

    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        with self._reservation(config):
            return super().invoke(input, config, stop=stop, **kwargs)

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        with self._reservation(config):  # before the first await: in the calls' order
            return await super().ainvoke(input, config, stop=stop, **kwargs)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        configs = self._reserve_each(inputs, config)
        return super().batch(inputs, configs, return_exceptions=return_exceptions, **kwargs)

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        configs = self._reserve_each(inputs, config)
        return await super().abatch(inputs, configs, return_exceptions=return_exceptions, **kwargs)

    def batch_as_completed(  # type: ignore[override]  # (its overloads by return_exceptions)
        self,
        inputs: Sequence[LanguageModelInput],
        config: RunnableConfig | Sequence[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> Iterator[tuple[int, AIMessage | Exception]]:
        configs = self._reserve_each(inputs, config)
        yield from super().batch_as_completed(  # type: ignore[call-overload]
            inputs, configs, return_exceptions=return_exceptions, **kwargs
        )

    async def abatch_as_completed(  # type: ignore[override]
        self,
        inputs: Sequence[LanguageModelInput],
        config: RunnableConfig | Sequence[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> AsyncIterator[tuple[int, AIMessage | Exception]]:
        configs = self._reserve_each(inputs, config)
        async for item in super().abatch_as_completed(  # type: ignore[call-overload]
            inputs, configs, return_exceptions=return_exceptions, **kwargs
        ):
            yield item

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        ctx, ordinal = _call_context()
        if ctx is None:
            return self.inner._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

        def call(_key: str) -> dict[str, Any]:
            result = self.inner._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
            return _record(result, run_manager.run_id if run_manager else None)

        recorded = drive_sync(self._protocol(ctx, messages, ordinal), ctx, self._spec(), call)
        return _replay(recorded)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        ctx, ordinal = _call_context()
        if ctx is None:
            return await self.inner._agenerate(
                messages, stop=stop, run_manager=run_manager, **kwargs
            )

        async def call(_key: str) -> dict[str, Any]:
            result = await self.inner._agenerate(
                messages, stop=stop, run_manager=run_manager, **kwargs
            )
            return _record(result, run_manager.run_id if run_manager else None)

        run = self._protocol(ctx, messages, ordinal)
        recorded = await drive_async(run, ctx, self._spec(), call)
        return _replay(recorded)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        ctx, ordinal = _call_context()
        if ctx is None:
            yield from self.inner._stream(messages, stop=stop, run_manager=run_manager, **kwargs)
            return
        run = ProtocolRun(self._protocol(ctx, messages, ordinal), ctx, self._spec())
        step = run.to_call()
        if isinstance(step, Done):  # recorded: replay the message, no call
            yield from _replay_chunks(step.result)
            return
        total: ChatGenerationChunk | None = None
        try:
            for chunk in self.inner._stream(messages, stop=stop, run_manager=run_manager, **kwargs):
                yield chunk  # streamed live, as it arrives
                total = chunk if total is None else total + chunk
            recorded = _record_stream(total, run_manager)
        except BaseException as exc:
            run.to_call(error=exc)  # records the failure and re-raises
            raise
        run.to_call(value=recorded)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        ctx, ordinal = _call_context()
        if ctx is None:
            async for chunk in self.inner._astream(
                messages, stop=stop, run_manager=run_manager, **kwargs
            ):
                yield chunk
            return
        run = ProtocolRun(self._protocol(ctx, messages, ordinal), ctx, self._spec())
        step = await run.ato_call()
        if isinstance(step, Done):
            for chunk in _replay_chunks(step.result):
                yield chunk
            return
        total: ChatGenerationChunk | None = None
        try:
            async for chunk in self.inner._astream(
                messages, stop=stop, run_manager=run_manager, **kwargs
            ):
                yield chunk
                total = chunk if total is None else total + chunk
            recorded = _record_stream(total, run_manager)
        except BaseException as exc:
            await run.ato_call(error=exc)
            raise
        await run.ato_call(value=recorded)

    def bind_tools(
        self,
        tools: Sequence[Any],
        *,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools as the wrapped model formats them; calls still go through here."""
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        bound = self.inner.bind_tools(tools, **kwargs)
        if not isinstance(bound, RunnableBinding):
            raise TypeError(
                f"{type(self.inner).__name__}.bind_tools returned {type(bound).__name__}, "
                "not a RunnableBinding; wrap the bound model instead: "
                "durable_model(model.bind_tools(...)) is not supported, "
                "durable_model(model).bind_tools(...) is"
            )
        return self.bind(**bound.kwargs)


def _record_stream(total: ChatGenerationChunk | None, run_manager: Any) -> dict[str, Any]:
    if total is None:
        raise ValueError("the model streamed nothing")
    message = _chunk_to_message(total.message)
    run_id = getattr(run_manager, "run_id", None)
    return _record(ChatResult(generations=[ChatGeneration(message=message)]), run_id)


def _chunk_to_message(chunk: BaseMessage) -> BaseMessage:
    if isinstance(chunk, AIMessageChunk):
        return AIMessage(
            content=chunk.content,
            additional_kwargs=chunk.additional_kwargs,
            response_metadata=chunk.response_metadata,
            tool_calls=chunk.tool_calls,
            invalid_tool_calls=chunk.invalid_tool_calls,
            usage_metadata=chunk.usage_metadata,
            id=chunk.id,
        )
    return chunk


# A chunk marked last (langchain-core 1.x): else LangChain ends a stream with an empty
# chunk of its own, under another message id than the replayed message's.
_LAST: dict[str, Any] = (
    {"chunk_position": "last"} if "chunk_position" in AIMessageChunk.model_fields else {}
)


def _replay_chunks(recorded: Any) -> Iterator[ChatGenerationChunk]:
    generations = _replay(recorded).generations
    for n, generation in enumerate(generations, 1):
        m = generation.message
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content=m.content,
                additional_kwargs=m.additional_kwargs,
                response_metadata=m.response_metadata,
                tool_call_chunks=[
                    {
                        "name": tc["name"],
                        "args": _json(tc["args"]),
                        "id": tc["id"],
                        "index": i,
                        "type": "tool_call_chunk",
                    }  # fmt: skip
                    for i, tc in enumerate(getattr(m, "tool_calls", []) or [])
                ],
                usage_metadata=getattr(m, "usage_metadata", None),
                id=m.id,
                **(_LAST if n == len(generations) else {}),
            )
        )


def _json(value: Any) -> str:
    return json.dumps(value)


def durable_model(model: BaseChatModel, *, record_prompt: bool | None = None) -> DurableChatModel:
    """Wrap any LangChain chat model so that its calls inside a graph are journaled and
    replayed when the task runs again (crash resume, interrupt resume, retry).

    ```python
    model = durable_model(ChatOpenAI(model="gpt-4o")).bind_tools(tools)
    ```

    ``record_prompt=True`` keeps each call's whole prompt in its ledger step (by default:
    the number of messages and the last one; see :class:`DurableChatModel`). A model
    wrapped already is returned as it is, or a copy with the setting given.
    """
    if isinstance(model, DurableChatModel):
        if record_prompt is None or model.record_prompt == record_prompt:
            return model
        return model.model_copy(update={"record_prompt": record_prompt})
    return DurableChatModel(inner=model, record_prompt=bool(record_prompt))
