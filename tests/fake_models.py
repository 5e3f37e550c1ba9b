"""Deterministic, offline chat models for tests (built on LangChain's fake chat models).

``ScriptedChatModel`` answers with its scripted messages in order, supports
``bind_tools`` (so ``durable_model(...).bind_tools(...)`` and ``create_react_agent`` work),
streams word by word, reports token usage, and counts its real calls in a file when
``calls_file`` is set, so that a test can tell, across processes, whether a call was paid
for again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool


class ScriptedChatModel(FakeMessagesListChatModel):
    """Replies with ``responses`` in order; the n-th real call gets ``responses[n]``.

    The position is the number of calls recorded in ``calls_file`` (when given), so a
    new process continues the script where the killed one stopped, like a real provider
    that has already been paid for the earlier calls.
    """

    calls_file: str | None = None
    bound_tools: list[dict[str, Any]] = []

    def _position(self) -> int:
        if self.calls_file is None:
            return self.i
        path = Path(self.calls_file)
        return len(path.read_text().splitlines()) if path.exists() else 0

    def _count_call(self) -> None:
        if self.calls_file is None:
            self.i += 1
        else:
            with open(self.calls_file, "a") as f:
                f.write("call\n")

    def _next(self) -> AIMessage:
        n = self._position()
        if n >= len(self.responses):
            raise RuntimeError(f"the script has only {len(self.responses)} responses")
        message = self.responses[n]
        self._count_call()
        assert isinstance(message, AIMessage)
        return message.model_copy(
            update={"usage_metadata": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}}
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        from langchain_core.outputs import ChatGeneration

        return ChatResult(generations=[ChatGeneration(message=self._next())])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        message = self._next()
        words = str(message.content).split(" ")
        for i, word in enumerate(words):
            last = i == len(words) - 1
            yield ChatGenerationChunk(
                message=AIMessageChunk(
                    content=word + ("" if last else " "),
                    id=message.id,
                    tool_call_chunks=(
                        [
                            {
                                "name": tc["name"],
                                "args": __import__("json").dumps(tc["args"]),
                                "id": tc["id"],
                                "index": j,
                                "type": "tool_call_chunk",
                            }  # fmt: skip
                            for j, tc in enumerate(message.tool_calls)
                        ]
                        if last
                        else []
                    ),
                    usage_metadata=message.usage_metadata if last else None,
                )
            )

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    @property
    def _llm_type(self) -> str:
        return "scripted-chat-model"


def tool_call_message(*calls: tuple[str, dict[str, Any], str], content: str = "") -> AIMessage:
    """An AIMessage asking for tool calls: ``(name, args, id)`` each."""
    return AIMessage(
        content=content,
        tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in calls],
    )
