"""The journal of LangGraph runs, kept by the savers as they store checkpoints.

A mixin of :class:`~agentcheck.savers._core.SaverCore`, free of I/O like it: each method
is part of an operation and yields the journal's queries in the same transaction as the
checkpoint or writes that caused them (docs/journal.md, "What LangGraph runs write").
"""

from __future__ import annotations

import binascii
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME

from agentcheck import _task_names as task_names
from agentcheck.backends.base import OnCommit, Operation
from agentcheck.journal import EventSpec, JournalOps

__all__ = [
    "OUTSIDE_EDITS",
    "UPDATE_PATH",
    "RunJournal",
    "node_name",
    "push_index",
    "push_nodes_of",
    "root_task",
    "task_id_at",
    "task_key_prefix",
    "triggers",
    "with_push_index",
]


def _path_parts(task_path: str) -> list[str]:
    return [p.strip() for p in task_path.lstrip("~").split(",")]


def node_name(task_path: str, push_nodes: Sequence[str] | None = None) -> str | None:
    """The node of a task path: ``~__pregel_pull, agent`` names it; a Send task's
    ``~__pregel_push, 0000000002, ...`` indexes the checkpoint's pending Sends."""
    parts = _path_parts(task_path)
    if len(parts) >= 3 and parts[2] == _ERROR_HANDLER:
        return None  # a node's error handler, whose path is the failed node's
    if len(parts) >= 2 and parts[0] == "__pregel_pull":
        return parts[1]
    index = _push_index(parts)
    if index is not None and push_nodes and index < len(push_nodes) and push_nodes[index]:
        return push_nodes[index]
    return None


def push_index(task_path: str | None) -> int | None:
    """The index among the checkpoint's pending Sends of a Send's task, from its path
    (``~__pregel_push, 0000000002, ...``); None for any other task."""
    return _push_index(_path_parts(task_path)) if task_path else None


def with_push_index(task_path: str, index: int) -> str:
    """A Send task's path with another index among the pending Sends."""
    parts = task_path.split(", ")
    parts[1] = f"{index:010d}"
    return ", ".join(parts)


def _push_index(parts: Sequence[str]) -> int | None:
    if len(parts) >= 2 and parts[0] == "__pregel_push" and parts[1].isdigit():
        return int(parts[1])
    return None


def task_key_prefix(parent_ns: str, node: str, task_id: str) -> str:
    """The key prefix of a task's wrapped calls, as the LangGraph adapter makes it: the
    task's checkpoint namespace (``<node>:<task id>`` under ``parent_ns``), then its id."""
    own = f"{node}:{task_id}"
    return f"{parent_ns}|{own}|{task_id}" if parent_ns else f"{own}|{task_id}"


def task_id_at(
    checkpoint: Mapping[str, Any],
    step: int,
    parent_ns: str,
    node: str,
    path: str | None,
    node_triggers: Sequence[str] | None,
) -> str | None:
    """The id LangGraph gives the task of ``node`` that runs from ``checkpoint`` at
    ``step``: a node's own task by the node's triggers, a Send's task by its index among
    the pending Sends (from ``path``). None where it cannot tell (a functional API
    call, no triggers, another LangGraph's layout). Its callers check the id against
    what is stored, so an id LangGraph would make otherwise only finds nothing."""
    try:
        from langgraph._internal._constants import PULL, PUSH
        from langgraph.pregel._algo import _uuid5_str, _xxhash_str
    except ImportError:  # pragma: no cover - another LangGraph layout
        return None
    try:
        id_bytes = binascii.unhexlify(str(checkpoint["id"]).replace("-", ""))
        version = int(checkpoint.get("v", 1))
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None
    make = _xxhash_str if version > 1 else _uuid5_str
    ns = f"{parent_ns}|{node}" if parent_ns else node
    index = push_index(path)
    if index is not None:
        return make(id_bytes, ns, str(step), node, PUSH, str(index))
    if node_triggers is None or (path is not None and not path.startswith("~" + PULL)):
        return None
    return make(id_bytes, ns, str(step), node, PULL, *node_triggers)


def push_nodes_of(pending: Any) -> list[str] | None:
    """The node names of a checkpoint's pending Send tasks (its ``__pregel_tasks``), in
    order: a Send task's path names it by its index here. None if there are none."""
    try:
        return [str(getattr(send, "node", "")) for send in pending]
    except TypeError:  # not a list of Sends
        return None


# Checkpoints written from outside the graph: update_state.
OUTSIDE_EDITS = ("update",)
# Checkpoints that are no step of a run: those, and LangGraph's copies ("fork").
_NOT_A_STEP = ("update", "fork")
# The task path LangGraph gives the writes of update_state: ~__interrupt__, <index>.
UPDATE_PATH = "~__interrupt__"
_JOIN = "join:"
# The task id of writes that belong to no task: a Command's resume value for the whole
# run (LangGraph's NULL_TASK_ID, which it does not export).
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
# The name LangGraph gives those writes (and a Command's goto or update) as it applies
# them: its INPUT.
INPUT = "__input__"
# Written with a task's ERROR when the node has an error handler, which LangGraph runs
# next (its ERROR_SOURCE_NODE, which it does not export).
ERROR_SOURCE_NODE = "__error_source_node__"
# The third part of an error handler's task path (``~__pregel_pull, <failed node>,
# node_error_handler, False``).
_ERROR_HANDLER = "node_error_handler"


def _triggers_a_node(values: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's channel values trigger a node: a branch to it
    (``branch:to:<node>``), or a join whose every source has written
    (``join:<a>+<b>:<node>``, add_edge with a list of sources)."""
    for channel, value in values.items():
        if channel.startswith("branch:to:"):
            return True
        if channel.startswith(_JOIN) and _join_complete(channel, value):
            return True
    return False


def root_task(ns: str) -> str:
    """The id of the root graph's task a subgraph's checkpoint namespace runs under
    (``<node>:<task id>|...``; "" at the root). A subgraph compiled with
    ``checkpointer=True`` stores its writes under ``<node>|...``, without task ids: its
    root task is then known by its node only, as :func:`node_token` of it."""
    root = ns.split("|", 1)[0]
    _, colon, task_id = root.rpartition(":")
    return task_id if colon or not root else node_token(root)


def node_token(node: str) -> str:
    """What stands for a root task known only by its node's name, among task ids (which
    are UUIDs: none starts so)."""
    return "node=" + node


def _called(task_path: str) -> bool:
    """Whether a task was called from another task (a functional API ``@task``): its path
    is ``~__pregel_push, <the caller's path>, ...`` (``~__pregel_push, ~__pregel_pull,
    <caller>, ...``, or ``~__pregel_push, ~__pregel_push, ...`` from a Send's task); a
    ``Send``'s own is ``~__pregel_push, <index>``."""
    return task_path.startswith("~__pregel_push, ~")


def triggers(values: Mapping[str, Any], node: str) -> bool:
    """Whether a checkpoint's channel values trigger ``node`` (see _triggers_a_node)."""
    if f"branch:to:{node}" in values:
        return True
    return any(
        channel.startswith(_JOIN) and channel.endswith(":" + node) and _join_complete(channel, v)
        for channel, v in values.items()
    )


def _join_complete(channel: str, value: Any) -> bool:
    """Whether a join's barrier has heard from all its sources: the names seen spell the
    channel's ``<a>+<b>`` (node names have no ':', but may have '+'). A deferred node's
    barrier is ``(seen, finished)`` and waits for ``finished`` too."""
    sources = channel[len(_JOIN) : channel.rfind(":")]
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], bool):
        value, finished = value
        if not finished:
            return False
    try:
        seen = [str(name) for name in value]
    except TypeError:
        return True  # not a barrier as we know it: never take the run for finished
    return (
        bool(seen)
        and all(name in sources for name in seen)
        and (sum(map(len, seen)) + len(seen) - 1 == len(sources))
    )


class RunJournal:
    """Run transitions and node events of the graphs that use a saver."""

    journal_nodes: bool
    journal_ops: JournalOps
    # Per thread: the run's status as this saver last wrote it, and the checkpoint id of
    # that transition.
    _run_status: dict[str, tuple[str, str | None]]
    # Per thread: the tasks whose writes paused or failed the run, at that checkpoint. A
    # later write of one of them is the task run again: the run was retried or resumed.
    _stopped_by: dict[str, frozenset[str]]
    # Per thread: the checkpoint a stopped run was given a Command's goto or update at
    # (its input): the tasks that run from there carry the run on.
    _commanded: dict[str, str]
    # Per thread: the latest checkpoint that had writes of no task (a Command's), and how
    # many, besides a resume value.
    _null_writes: dict[str, tuple[str, int]]
    # Per thread: the latest checkpoint update_state wrote (or a copy), and whether a
    # node is still to run from it.
    _edited_at: dict[str, tuple[str, bool]]
    # Per thread: the checkpoint at which a task's write (re)started the stopped run
    # before any writes of no task were seen there. A Command's or a resume's own writes
    # may reach the saver after the tasks they ran (they are stored in the background):
    # they then belong to that attempt, even if it has paused again since.
    _task_started: dict[str, str]
    # The per-thread maps above, together.
    _per_thread: tuple[dict[str, Any], ...]
    # Node names of the Send tasks pending at recent checkpoints, by checkpoint.
    _push_nodes: OrderedDict[tuple[str, str, str], list[str]]

    # The run of a thread moves through running -> interrupted / failed / succeeded ->
    # running (a resume) ... Each transition is tied to the checkpoint it concerns, and
    # LangGraph may store checkpoints and task writes in any order (``durability="async"``,
    # or concurrently on pooled connections), so a transition only applies when its
    # checkpoint is not older than the one of the last transition: a late, older write
    # never undoes a newer state. (Checkpoint ids grow with time.) The savers serialize
    # these operations per thread within a process; across processes the SQL itself is
    # conditional (see START_RUN, MARK_SUCCEEDED).

    def _start_if_due(
        self, thread_id: str, checkpoint_id: str, *, force: bool = False
    ) -> Operation[str]:
        """Start or restart the run if it is not running as of ``checkpoint_id``."""
        status, at = self._run_status.get(thread_id, (None, None))
        due = status is None or (status != "running" and (at is None or checkpoint_id >= at))
        if due or force:
            yield from self.journal_ops.start_run(
                thread_id, framework="langgraph", thread_id=thread_id
            )
            yield from self._set_status(thread_id, "running", checkpoint_id)
            return "running"
        return status or "running"

    def _journal_checkpoint(
        self,
        thread_id: str,
        checkpoint_id: str,
        meta: Mapping[str, Any],
        values: Mapping[str, Any],
    ) -> Operation[None]:
        """A root checkpoint: (re)start the thread's run (on new input, on the first
        checkpoint this process writes for it: a resume after a crash, or on a checkpoint
        after a pause), and end it when nothing is left to run."""
        pending = values.get("__pregel_tasks")
        if pending:
            self._remember_push_nodes((thread_id, "", checkpoint_id), pending)
        if meta.get("source") in _NOT_A_STEP:
            # update_state from outside the graph, or a copy of a checkpoint (LangGraph's
            # "fork": update_state(as_node="__copy__"), or running again from an earlier
            # checkpoint): the run (paused, failed or ended) stays as it is; whatever
            # runs next from here restarts it (_journal_task). Whether a node is still
            # to run from it decides what a resume sent there does.
            live = bool(pending) or _triggers_a_node(values) or "__start__" in values
            yield OnCommit(partial(self._edited_at.__setitem__, thread_id, (checkpoint_id, live)))
            return None
        status, at = self._run_status.get(thread_id, (None, None))
        if status != "running" and at is not None and checkpoint_id <= at:
            return None  # a late write of the checkpoint the run paused or ended at
        if meta.get("source") == "input":
            yield OnCommit(self._forget_task_start(thread_id))
        # New input starts an attempt in the input checkpoint's own statement. (So does
        # update_state(as_node="__input__"), which writes one too and runs nothing.)
        status = yield from self._start_if_due(
            thread_id, checkpoint_id, force=meta.get("source") == "input"
        )
        if (
            status == "running"
            and meta.get("source") == "loop"
            and not pending
            and not _triggers_a_node(values)
        ):
            # No node is triggered and no task is pending: the graph has finished.
            yield from self.journal_ops.mark_succeeded(
                thread_id, self._remember_status(thread_id, "succeeded", checkpoint_id)
            )
        return None

    def _push_nodes_at(self, thread_id: str, ns: str, checkpoint_id: str) -> list[str] | None:
        """The nodes of the Sends pending at a checkpoint, if it was written already."""
        return self._push_nodes.get((thread_id, ns, checkpoint_id))

    def _remember_push_nodes(self, key: tuple[str, str, str], pending: Any) -> None:
        """Keep the node names of a checkpoint's pending Send tasks: their writes name the
        task only by its index in this list."""
        nodes = push_nodes_of(pending)
        if nodes is None:
            return
        self._push_nodes[key] = nodes
        while len(self._push_nodes) > 1024:
            self._push_nodes.popitem(last=False)

    def _ensure_run(
        self, run_id: str, framework: str, position: tuple[str, str] | None = None
    ) -> Operation[None]:
        """Start the run in the journal unless this process already did: called before a
        wrapped call's first event, so a resumed attempt's events follow its start.

        ``position``: the (root checkpoint id, root task id) of a LangGraph call. A call
        of a task of the step the run stopped at, other than the tasks that stopped it
        (a parallel branch still running after its sibling failed or paused), or of an
        older step, is no new attempt.
        """
        status, at = self._run_status.get(run_id, (None, None))
        if status == "running":
            return None
        if position is not None and at is not None and not self._goes_on(run_id, *position):
            return None
        yield from self.journal_ops.start_run(run_id, framework=framework, thread_id=run_id)
        yield from self._set_status(run_id, "running", at)
        if position is not None:  # as a task's write would: its Command's writes may follow
            yield from self._started_by_task(run_id, position[0])
        return None

    def _started_by_task(self, run_id: str, checkpoint_id: str) -> Operation[None]:
        """A task's write (or a wrapped call) started the stopped run, from
        ``checkpoint_id``: remember it (``_task_started``), unless a Command was seen
        there already, so that the Command's own writes, if they come later, start
        nothing."""
        if self._commanded.get(run_id) != checkpoint_id:
            yield OnCommit(partial(self._task_started.__setitem__, run_id, checkpoint_id))

    def _loaded(self, config: Mapping[str, Any]) -> None:
        """A root checkpoint of a thread is read: LangGraph does so as an invocation
        begins, and the one before stored all its writes before it returned, so what
        ``_task_started`` remembers of it is past (a late write of it can no longer
        come). (Read by another caller while a run goes on, it is forgotten early: a
        late write is then taken as new, as it was before that memory.)"""
        conf = config.get("configurable") if isinstance(config, Mapping) else None
        if isinstance(conf, Mapping) and not conf.get("checkpoint_ns") and "thread_id" in conf:
            self._task_started.pop(str(conf["thread_id"]), None)

    def _subgraph_goes_on(
        self, run_id: str, ns: str, at: str, root_checkpoint: str | None
    ) -> str | None:
        """Where a subgraph's write carries the stopped run on (the checkpoint to start
        it at), or None. By the rule of its root task's own write (_goes_on), from the
        root checkpoint that task runs from; or, whatever that checkpoint, if its root
        task is one that stopped the run: resumed at a checkpoint the thread has moved
        past, LangGraph runs it again from there (no fork), and stores nothing of the
        root before its subgraph's writes."""
        root = root_task(ns)
        if root_checkpoint is not None and self._goes_on(run_id, root_checkpoint, root):
            return max(root_checkpoint, at)
        if root in self._stopped_by.get(run_id, ()) or (
            root_checkpoint is None and self._goes_on(run_id, at, root)
        ):
            return at
        return None

    def _goes_on(self, run_id: str, checkpoint_id: str, task_id: str) -> bool:
        """Whether a task of a stopped run carries it on: it runs from a later checkpoint
        than the one the run stopped at (after a fork: running again from an earlier
        checkpoint), or it is one of the tasks that stopped it there, running again (a
        resume by its interrupt's id, whose value comes with its writes; invoke(None)
        after an error). Not any task of that step: one of several paused may pause
        again, and a parallel branch may still run after its sibling failed."""
        status, at = self._run_status.get(run_id, (None, None))
        if status == "running" or at is None:
            return False
        return checkpoint_id > at or (
            checkpoint_id == at
            and (
                # Nothing of the run that ended there runs from its last checkpoint: a
                # task there is new input's (a Command's goto or update, which LangGraph
                # may store only when the run exits: durability="exit").
                status == "succeeded"
                or task_id in self._stopped_by.get(run_id, ())
                or self._commanded.get(run_id) == checkpoint_id
            )
        )

    def _journal_task(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        task_id: str,
        task_path: str,
        writes: Sequence[tuple[str, Any]],
        root_checkpoint: str | None = None,
    ) -> Operation[None]:
        """A task's writes: it ended, failed or paused for an interrupt.
        ``root_checkpoint``: for a subgraph's task, the root checkpoint its root task runs
        from (LangGraph's ``checkpoint_map``), where known."""
        channels = {channel for channel, _ in writes}
        status, at = self._run_status.get(thread_id, (None, None))
        if task_path.startswith(UPDATE_PATH):
            # Writes of update_state (or of a Command's update from outside): recorded,
            # and the run's status is left to the checkpoint that follows them.
            kind = "task" if ns else "node"
            name = task_names.lookup(task_id)
            yield from self.journal_ops.log(
                EventSpec(thread_id, kind, "update", name=name, step_key=task_id)
            )
            return None
        # Writes of a step older than the run's last transition are still logged, but
        # change the run's status no more.
        stale = bool(ns) or (status != "running" and at is not None and checkpoint_id < at)
        commanded = self._commanded.get(thread_id)
        if ns and status is None:
            # The first write this saver sees of the thread, a subgraph's (a resume sent
            # through another worker, a restarted process): this process's invocation
            # runs it, as for a root task's first write below.
            first_at = root_checkpoint or checkpoint_id
            status = yield from self._start_if_due(thread_id, first_at)
            yield from self._started_by_task(thread_id, first_at)
        elif ns and commanded is not None and status != "running":
            # A subgraph's task, run by a Command sent to a stopped run (a goto to a
            # subgraph node): a graph's invoke returns once all its writes are stored, so
            # what comes after the Command is the new invocation's. It starts the run as
            # the Command's checkpoint would.
            status = yield from self._start_if_due(thread_id, commanded)
        elif (
            ns
            and status not in (None, "running")
            and at is not None
            and (started_at := self._subgraph_goes_on(thread_id, ns, at, root_checkpoint))
        ):
            # A subgraph of a root task that carries the stopped run on (_goes_on: one
            # that paused or failed it, running again after a resume by interrupt id or
            # invoke(None); or one of a later root checkpoint, after update_state or a
            # fork): LangGraph stores nothing of the root before it.
            status = yield from self._start_if_due(thread_id, started_at)
            # Where the Command's own writes come: the root checkpoint the task runs from
            # (older than the stop, for a resume sent to a checkpoint moved past).
            yield from self._started_by_task(thread_id, root_checkpoint or started_at)
        stopped = self._stopped_by.get(thread_id, frozenset())
        was = status
        # Writes of no task: a Command's resume value for the whole run, goto or update,
        # which LangGraph applies as the run's input. They run nothing themselves: a
        # goto or update leaves the run to the tasks that run from this same checkpoint
        # (_goes_on; a goto may send to nothing that runs: END), and a resume starts the
        # run only if it is paused here (see _resumes).
        null = task_id == NULL_TASK_ID
        command = null and not channels <= {RESUME}
        # The Command's or resume's tasks may have started the run already (see
        # _task_started): these are its own writes, come late.
        late = not stale and null and self._task_started.get(thread_id) == checkpoint_id
        if late:
            yield OnCommit(self._forget_task_start(thread_id))
        if not stale and null and RESUME in channels and status != "running" and not late:
            resumes = self._resumes(thread_id, checkpoint_id)
            if resumes is None:  # this process cannot tell: the database has it paused?
                if (yield from self.journal_ops.resume_paused_run(thread_id)):
                    yield from self._set_status(thread_id, "running", checkpoint_id)
                    status = "running"
            elif resumes:
                status = yield from self._start_if_due(thread_id, checkpoint_id)
        if (
            not stale
            and not null
            # the first write this saver sees of the thread, or one that carries it on
            and (status is None or self._goes_on(thread_id, checkpoint_id, task_id))
        ):
            status = yield from self._start_if_due(thread_id, checkpoint_id)
            yield from self._started_by_task(thread_id, checkpoint_id)
        if channels <= {RESUME}:
            return None
        if command:
            if not stale and status != "running" and not late:
                yield OnCommit(self._remember_command(thread_id, checkpoint_id))
            # LangGraph stores a checkpoint's earlier writes of no task again with each
            # new Command there: only more of them are a new update.
            given = sum(1 for channel, _ in writes if channel != RESUME)
            seen_at, seen = self._null_writes.get(thread_id, ("", 0))
            if seen_at != checkpoint_id or given > seen:
                seen_now = (checkpoint_id, given)
                yield OnCommit(partial(self._null_writes.__setitem__, thread_id, seen_now))
                yield from self.journal_ops.log(EventSpec(thread_id, "node", "update", name=INPUT))
            return None
        new_status: str | None
        if ERROR in channels and (_called(task_path) or ERROR_SOURCE_NODE in channels):
            # A @task of the functional API, called from another task: the caller may
            # catch its error; if not, the caller's own error fails the run. Or a node
            # with an error handler (add_node(..., error_handler=...)), which LangGraph
            # runs next, in the same invocation: if it fails too, its error fails the run.
            phase, new_status = "error", None
        elif ERROR in channels:
            phase, new_status = "error", "failed"
        elif INTERRUPT in channels:
            phase, new_status = "interrupt", "interrupted"
        else:
            phase, new_status = "end", None
        error = next((repr(v) for c, v in writes if c == ERROR), None)
        name = node_name(task_path, self._push_nodes_at(thread_id, ns, checkpoint_id))
        name = name or task_names.lookup(task_id)
        yield from self.journal_ops.log(
            EventSpec(
                thread_id,
                "task" if ns else "node",
                phase,
                name=name or task_id,
                step_key=task_id,
                error=error,
            )
        )
        if stale:
            return None
        # What stands for this task in _stopped_by: its id, and at the root its node too,
        # for a subgraph of it compiled with checkpointer=True (see root_task).
        mine = {task_id, node_token(name)} if name and not ns else {task_id}
        if status == "running" and was != "running":
            stopped = frozenset()  # started again just now: what stopped it is past
        if new_status is None:
            if phase == "error" and ERROR_SOURCE_NODE not in channels:
                # A called task failed: its caller may catch it; if not, running it
                # again (invoke(None)) goes on with the run. (A node whose error its
                # handler takes is never run again: the handler is, and its own pause or
                # error stops the run.)
                yield OnCommit(self._remember_stopped(thread_id, stopped | mine))
            return None
        if status == new_status and at == checkpoint_id:
            # Another task of the same step paused too (parallel interrupts): one
            # transition for the step, but each of its tasks resumes it.
            yield OnCommit(self._remember_stopped(thread_id, stopped | mine))
            return None
        if status != "running" and not (
            at == checkpoint_id and status in ("interrupted", "failed")
        ):
            stopped = frozenset()
        # Kept: called tasks that failed while it ran, or, in the step it stopped at, the
        # task that paused it when another now fails it (or the other way round).
        yield from self.journal_ops.set_run_status(
            thread_id,
            new_status,  # type: ignore[arg-type]
            error=error,
            framework="langgraph",
        )
        yield from self._set_status(thread_id, new_status, checkpoint_id)
        yield OnCommit(self._remember_stopped(thread_id, stopped | mine))
        return None

    def _resumes(self, thread_id: str, checkpoint_id: str) -> bool | None:
        """Whether a resume sent to ``checkpoint_id`` resumes the thread's paused run:
        it was paused there, or update_state edited it there (or copied it) and left a
        node to run. False: nothing is paused there (the run finished or failed there,
        or update_state answered for the paused node). None where this process cannot
        tell: it knows no status, or not that checkpoint (written by another process,
        which may have run the thread on and paused it again)."""
        status, at = self._run_status.get(thread_id, (None, None))
        edited_at, live = self._edited_at.get(thread_id, ("", False))
        if checkpoint_id == edited_at and not live:
            return False  # nothing is left to run from there, whatever the status
        if status is None or at is None:
            return None
        if checkpoint_id == at:
            return status == "interrupted"
        if checkpoint_id == edited_at:
            return status == "interrupted" and live
        return None

    def _set_status(self, run_id: str, status: str, at: str | None) -> Operation[None]:
        """Remember a run's status once the transaction that wrote it has committed (a
        failed or retried write must not leave this process believing it was written)."""
        yield OnCommit(self._remember_status(run_id, status, at))

    def _remember_status(self, run_id: str, status: str, at: str | None) -> Callable[[], None]:
        def remember() -> None:
            self._run_status[run_id] = (status, at)
            self._stopped_by.pop(run_id, None)
            self._commanded.pop(run_id, None)

        return remember

    def _forget_thread(self, thread_id: str) -> Callable[[], None]:
        """Once a thread is deleted: all this saver remembers of its run, so that a new
        conversation under the same id starts a run of its own."""

        def forget() -> None:
            for per_thread in self._per_thread:
                per_thread.pop(thread_id, None)
            # list() copies the keys in one step: other threads' puts may add some.
            for key in list(self._push_nodes):
                if key[0] == thread_id:
                    self._push_nodes.pop(key, None)

        return forget

    def _forget_task_start(self, run_id: str) -> Callable[[], None]:
        def forget() -> None:
            self._task_started.pop(run_id, None)

        return forget

    def _remember_command(self, run_id: str, checkpoint_id: str) -> Callable[[], None]:
        def remember() -> None:
            self._commanded[run_id] = checkpoint_id

        return remember

    def _remember_stopped(self, run_id: str, tasks: frozenset[str]) -> Callable[[], None]:
        def remember() -> None:
            self._stopped_by[run_id] = tasks

        return remember
