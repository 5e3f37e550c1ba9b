"""Deterministic data: chat messages and the checkpoints LangGraph writes for a chat.

Every saver gets the same messages, the same checkpoint ids and the same metadata; only
the channel versions differ, because each saver makes its own (``get_next_version``).
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone
from typing import Any, NamedTuple

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.base.id import uuid6

__all__ = ["ChatThread", "MessageCorpus", "PutArgs", "new_checkpoint_id"]

# English-like text: zlib compresses it about as much as real chat text (~3x).
_WORDS = (
    "the a to of and in is it you that for on with as this be are was can your have not "
    "but or we will from at by an they if more about which when what there so all one would "
    "their how also use some time these like just into data other than then only its could "
    "very model make may any over need new first way because each work should file code run "
    "state example value function return error change call set test user question answer "
    "agent tool result step memory thread database query python list string order payment "
    "customer invoice refund shipping address account balance report summary document search "
    "weather forecast meeting calendar email message reply draft review approve reject retry "
    "timeout network server client request response status header token limit budget price "
    "product catalog inventory warehouse delivery tracking number date month year week today "
    "tomorrow yesterday morning evening please thanks sorry sure great okay maybe probably "
    "think know want see look find check update create delete open close start stop send"
).split()


def new_checkpoint_id(step: int) -> str:
    """A LangGraph checkpoint id (time-ordered uuid6), shared by every saver's copy."""
    return str(uuid6(clock_seq=step))


class MessageCorpus:
    """An endless, reproducible conversation: message ``i`` is the same for every saver.

    Even indexes are the user's (``HumanMessage``), odd ones the agent's (``AIMessage``);
    ``content_chars`` of text make a message of about 1.1 KB once serialized.
    """

    def __init__(self, seed: int = 7, content_chars: int = 1000) -> None:
        self.seed = seed
        self.content_chars = content_chars
        self._cache: dict[int, BaseMessage] = {}

    def text(self, i: int) -> str:
        rng = random.Random(self.seed * 1_000_003 + i)
        words: list[str] = []
        length = 0
        while length < self.content_chars:
            word = rng.choice(_WORDS)
            if rng.random() < 0.03:
                word = f"{word}-{rng.randrange(10_000)}"
            words.append(word)
            length += len(word) + 1
        return " ".join(words)[: self.content_chars]

    def message(self, i: int) -> BaseMessage:
        if i not in self._cache:
            cls = HumanMessage if i % 2 == 0 else AIMessage
            self._cache[i] = cls(content=self.text(i), id=f"msg-{self.seed}-{i}")
        return self._cache[i]

    def window(self, end: int, size: int) -> list[BaseMessage]:
        """Messages ``end - size`` .. ``end - 1``."""
        return [self.message(i) for i in range(max(0, end - size), end)]


class PutArgs(NamedTuple):
    config: RunnableConfig
    checkpoint: Checkpoint
    metadata: CheckpointMetadata
    new_versions: dict[str, Any]


class ChatThread:
    """One saver's copy of a simulated chat thread, written the way LangGraph writes it.

    Each step appends the next message of the corpus to ``messages`` (kept to the last
    ``window`` messages when set, growing otherwise) and sets the small ``turn`` channel.
    A user message leaves ``branch:to:agent`` pending (the agent node runs next; metadata
    ``source="input"``); an agent reply consumes it and ends the run (``source="loop"``).
    ``new_versions`` holds the channels changed in the step, with versions made by the
    saver's own ``get_next_version``. The thread may start with ``initial`` messages.
    """

    def __init__(
        self,
        saver: BaseCheckpointSaver[Any],
        thread_id: str,
        corpus: MessageCorpus,
        *,
        user: str,
        window: int | None = None,
        initial: int = 0,
    ) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.corpus = corpus
        self.user = user
        self.window = window
        self.messages: list[BaseMessage] = corpus.window(initial, initial)
        self.next_message = initial
        self.step = 0
        self.versions: dict[str, Any] = {}
        self.seen: dict[str, dict[str, Any]] = {"__input__": {}}
        self.config: RunnableConfig = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ""}
        }
        self.checkpoint_ids: list[str] = []

    def prepare(self, checkpoint_id: str) -> PutArgs:
        """The arguments of the next ``put`` (built outside any timing)."""
        message = self.corpus.message(self.next_message)
        messages = [*self.messages, message]
        if self.window is not None:
            messages = messages[-self.window :]
        from_user = isinstance(message, HumanMessage)
        changed = ("messages", "turn", "branch:to:agent")
        new_versions = {
            ch: self.saver.get_next_version(self.versions.get(ch), None) for ch in changed
        }
        versions = {**self.versions, **new_versions}
        values: dict[str, Any] = {"messages": messages, "turn": self.step, "user": self.user}
        seen = {k: dict(v) for k, v in self.seen.items()}
        if from_user:
            values["branch:to:agent"] = None  # the trigger of the agent node
        else:
            seen["agent"] = {"branch:to:agent": self.versions.get("branch:to:agent")}
        if "user" not in self.versions:
            new_versions["user"] = versions["user"] = self.saver.get_next_version(None, None)
        checkpoint: Checkpoint = {
            "v": 4,
            "id": checkpoint_id,
            "ts": datetime.now(timezone.utc).isoformat(),
            "channel_values": values,
            "channel_versions": versions,
            "versions_seen": seen,
            "updated_channels": sorted(new_versions),
        }
        metadata: CheckpointMetadata = {
            "source": "input" if from_user else "loop",
            "step": self.step,
            "parents": {},
            "user": self.user,  # type: ignore[typeddict-unknown-key]
        }
        return PutArgs(self.config, checkpoint, metadata, new_versions)

    def put(self, args: PutArgs) -> int:
        """Store the prepared checkpoint; returns the duration of ``saver.put`` in ns."""
        start = time.perf_counter_ns()
        config = self.saver.put(*args)
        elapsed = time.perf_counter_ns() - start
        self.config = config
        self.versions = dict(args.checkpoint["channel_versions"])
        self.seen = args.checkpoint["versions_seen"]
        self.messages = args.checkpoint["channel_values"]["messages"]
        self.next_message += 1
        self.step += 1
        self.checkpoint_ids.append(args.checkpoint["id"])
        return elapsed

    def advance(self, checkpoint_id: str) -> int:
        """Prepare and store the next step; returns the duration of ``saver.put`` in ns."""
        return self.put(self.prepare(checkpoint_id))
