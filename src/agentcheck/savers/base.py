"""Sync and async savers: the public checkpoint API, driving the operations of
:class:`~agentcheck.savers._core.SaverCore`.

A sync saver implements ``_run``; an async saver implements ``_arun``. Everything else
(every method of ``BaseCheckpointSaver``, in both styles) is here once. A sync saver's
async methods run the sync call in a worker thread; an async saver's sync methods submit
to its event loop from another thread, as the official async savers do.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, ParamSpec, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)

from agentcheck._errors import SchemaVersionError
from agentcheck.backends.base import Operation
from agentcheck.savers._core import ListPages
from agentcheck.savers._retention import RetentionCore

__all__ = ["AsyncSaver", "SyncSaver"]

T = TypeVar("T")
P = ParamSpec("P")
_STRIPES = 64


def _raise_if_read_only(exc: Exception) -> None:
    """setup() failed: if because the connection is read-only while the schema needs
    upgrading (SQLite's "readonly database", PostgreSQL's SQLSTATE 25006), say so."""
    read_only = getattr(exc, "sqlstate", None) == "25006" or "readonly database" in str(exc)
    if read_only:
        raise SchemaVersionError(
            "this database's schema is older than this agentcheck's, and the connection is "
            "read-only, so setup() cannot upgrade it: open it once with write access (or "
            f"let a process that writes to it set it up first). The database said: {exc}"
        ) from exc


def _stripe_of(config: Any) -> int:
    """The lock stripe of a config's thread (any, for a config that names none: the
    operation then refuses it, saying what is wrong)."""
    try:
        return hash(str(config["configurable"]["thread_id"])) % _STRIPES
    except (TypeError, KeyError):
        return 0


_workers: tuple[int, ThreadPoolExecutor] | None = None  # (the pid that made it, the pool)
_workers_lock = threading.Lock()


def _worker_pool() -> ThreadPoolExecutor:
    """The threads the sync savers' async methods run their calls in (made once per
    process: a forked child has none of its parent's threads)."""
    global _workers
    with _workers_lock:
        if _workers is None or _workers[0] != os.getpid():
            _workers = (os.getpid(), ThreadPoolExecutor(32, "agentcheck-saver"))
        return _workers[1]


async def _in_worker(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in a thread of agentcheck's own pool, with the caller's
    context variables (as ``asyncio.to_thread``, which uses the loop's default pool).

    Not the default pool: LangGraph runs a graph's sync nodes there, and a wrapped call
    in one waits for its task's checkpoint to be stored (docs/effects.md,
    "Durability"). With as many such nodes as the pool has threads, a put queued
    behind them could not run until their waits ran out: every call waited 2 s, and
    went on unprotected."""
    context = contextvars.copy_context()
    call = partial(context.run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_worker_pool(), call)


class _FifoLock:
    """A lock granted in the order it was asked for.

    LangGraph stores a step's writes from worker threads while the graph runs on
    (``durability="async"``, its default): ``threading.Lock`` lets the thread that
    arrives last take the lock first, which wrote one node's journal event after the
    next node's (asyncio's lock, used by the async savers, is already first come, first
    served). The holder hands the lock straight to the oldest waiter.
    """

    __slots__ = ("_mutex", "_held", "_waiters")

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiters: collections.deque[threading.Lock] = collections.deque()

    def __enter__(self) -> None:
        with self._mutex:
            if not self._held:
                self._held = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        try:
            turn.acquire()  # released by the holder that hands the lock over
        except BaseException:  # interrupted (KeyboardInterrupt): give up the turn
            with self._mutex:
                if turn in self._waiters:
                    self._waiters.remove(turn)
                    raise
            self.__exit__()  # the lock was handed over meanwhile: pass it on
            raise

    def __exit__(self, *exc: object) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._held = False


class SyncSaver(RetentionCore):
    """Base of the sync savers (:class:`SqliteSaver`, :class:`PostgresSaver`)."""

    migrations: tuple[tuple[str, ...], ...] = ()
    _is_setup = False
    # One thread's checkpoint writes are serialized in this process, in the order they
    # arrive, so that the journal's run transitions are decided and written in one piece
    # (see _core) and its events follow the graph's steps.
    _thread_locks: tuple[_FifoLock, ...] = tuple(_FifoLock() for _ in range(_STRIPES))

    def _run(self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True) -> T:
        raise NotImplementedError

    def _call(self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True) -> T:
        if not self._is_setup:
            self.setup()
        return self._run(make_op, write, durable=durable)

    def setup(self) -> None:
        """Create or upgrade the tables. Idempotent, safe to call from several processes
        at once and inside an open transaction. Called automatically on first use."""
        if not self._run(lambda: self._set_up_op(self.migrations), False):
            try:
                self._run(lambda: self._setup_op(self.migrations), True)
            except Exception as exc:
                _raise_if_read_only(exc)
                raise
        self._is_setup = True

    def refuses_sync_calls(self) -> bool:
        """Never: a sync saver takes sync calls from any thread (see AsyncSaver)."""
        return False

    def run_op(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        """Run an operation in one transaction (for the journal). ``durable=False``: a
        write that may be lost to a power failure (not to a crash of the process), for
        what is safe to lose (see Journal.run_op); the commit need not wait for the disk."""
        return self._call(make_op, write, durable=durable)

    async def arun_op(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        """The same from async code: the sync call in a worker thread."""
        return await _in_worker(partial(self._call, make_op, write, durable=durable))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint of ``config`` (the latest of the thread when no id is given)."""
        self._loaded(config)
        return self._call(lambda: self._get_tuple(config), False)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints matching ``config``, metadata ``filter`` and ``before``, newest first
        (read a page at a time, see :class:`~agentcheck.savers._core.ListPages`)."""
        pages = ListPages(limit)
        for read in pages.reads(self._list, config, filter, before):
            yield from pages.take(self._call(read, False))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; values are written only for the channels in ``new_versions``."""

        def put() -> Operation[RunnableConfig]:
            return self._put(config, checkpoint, metadata, new_versions)

        with self._thread_locks[_stripe_of(config)]:
            try:
                return self._call(put, True)
            except Exception as exc:
                if not self._retry_stale(exc, config):
                    raise
            return self._call(put, True)  # again, every value stored whole

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for the checkpoint of ``config``."""
        with self._thread_locks[_stripe_of(config)]:
            self._call(lambda: self._put_writes(config, writes, task_id, task_path), True)

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread."""
        self._call(lambda: self._delete_thread(thread_id), True)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by the given runs."""
        self._call(lambda: self._delete_for_runs(run_ids), True)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread's whole history (every namespace, value and write) to another id."""
        self._call(lambda: self._copy_thread(source_thread_id, target_thread_id), True)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Drop old checkpoints: ``keep_latest`` keeps the newest per namespace (and
        what its DeltaChannels need), ``delete`` removes the threads."""
        self._call(lambda: self._prune(thread_ids, strategy), True)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per-channel writes and seed along the parent chain (for ``DeltaChannel``)."""
        return self._call(lambda: self._delta_channel_history(config, channels), False)

    # Async methods: the sync call, in a worker thread, so an event loop is not blocked.

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await _in_worker(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """The same from async code: each page read in a worker thread."""
        pages = ListPages(limit)
        for read in pages.reads(self._list, config, filter, before):
            for item in pages.take(await _in_worker(self._call, read, False)):
                yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await _in_worker(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await _in_worker(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await _in_worker(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await _in_worker(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await _in_worker(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await _in_worker(lambda: self.prune(thread_ids, strategy=strategy))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await _in_worker(
            lambda: self.get_delta_channel_history(config=config, channels=channels)
        )


class AsyncSaver(RetentionCore):
    """Base of the async savers (:class:`AsyncSqliteSaver`, :class:`AsyncPostgresSaver`)."""

    migrations: tuple[tuple[str, ...], ...] = ()
    _is_setup = False
    loop: asyncio.AbstractEventLoop | None = None
    _async_locks: tuple[asyncio.Lock, ...] | None = None

    def _thread_lock(self, config: RunnableConfig) -> asyncio.Lock:
        """The lock serializing one thread's checkpoint writes (see SyncSaver)."""
        if self._async_locks is None:
            self._async_locks = tuple(asyncio.Lock() for _ in range(_STRIPES))
        return self._async_locks[_stripe_of(config)]

    def run_op(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        """Run an operation from a thread other than the saver's event loop."""
        return self._sync(self._call(make_op, write, durable=durable))

    async def arun_op(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        """Run an operation in one transaction (for the journal; see SyncSaver.run_op)."""
        return await self._call(make_op, write, durable=durable)

    def _bind_loop(self) -> None:
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    async def _arun(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        raise NotImplementedError

    async def _call(
        self, make_op: Callable[[], Operation[T]], write: bool, *, durable: bool = True
    ) -> T:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        if not self._is_setup:
            await self.setup()
        return await self._arun(make_op, write, durable=durable)

    def refuses_sync_calls(self) -> bool:
        """Whether a synchronous call made here and now would be refused: it would be
        made on the saver's own event loop, which it would then wait for while blocking
        it, or before the saver has run on any loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        return self.loop is None or (running is not None and running is self.loop)

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the saver's loop from another thread."""
        loop = self.loop
        if loop is None or self.refuses_sync_calls():
            coro.close()
            raise asyncio.InvalidStateError(
                "synchronous calls to an async agentcheck saver are only allowed from "
                "another thread than its event loop's (for example graph.invoke in a "
                "worker thread); from async code use the a* methods (graph.ainvoke), or "
                "use the sync saver"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    async def setup(self) -> None:
        """Create or upgrade the tables. Idempotent, safe to call from several processes
        at once and inside an open transaction. Called automatically on first use."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        if not await self._arun(lambda: self._set_up_op(self.migrations), False):
            try:
                await self._arun(lambda: self._setup_op(self.migrations), True)
            except Exception as exc:
                _raise_if_read_only(exc)
                raise
        self._is_setup = True

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint of ``config`` (the latest of the thread when no id is given)."""
        self._loaded(config)
        return await self._call(lambda: self._get_tuple(config), False)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints matching ``config``, metadata ``filter`` and ``before``, newest first
        (read a page at a time, see :class:`~agentcheck.savers._core.ListPages`)."""
        pages = ListPages(limit)
        for read in pages.reads(self._list, config, filter, before):
            for item in pages.take(await self._call(read, False)):
                yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; values are written only for the channels in ``new_versions``."""

        def put() -> Operation[RunnableConfig]:
            return self._put(config, checkpoint, metadata, new_versions)

        async with self._thread_lock(config):
            try:
                return await self._call(put, True)
            except Exception as exc:
                if not self._retry_stale(exc, config):
                    raise
            return await self._call(put, True)  # again, every value stored whole

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for the checkpoint of ``config``."""
        async with self._thread_lock(config):
            await self._call(lambda: self._put_writes(config, writes, task_id, task_path), True)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread."""
        await self._call(lambda: self._delete_thread(thread_id), True)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) created by the given runs."""
        await self._call(lambda: self._delete_for_runs(run_ids), True)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread's whole history (every namespace, value and write) to another id."""
        await self._call(lambda: self._copy_thread(source_thread_id, target_thread_id), True)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Drop old checkpoints: ``keep_latest`` keeps the newest per namespace (and
        what its DeltaChannels need), ``delete`` removes the threads."""
        await self._call(lambda: self._prune(thread_ids, strategy), True)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per-channel writes and seed along the parent chain (for ``DeltaChannel``)."""
        return await self._call(lambda: self._delta_channel_history(config, channels), False)

    # Sync methods: submitted to the saver's loop from another thread.

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._sync(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        pages = ListPages(limit)
        for read in pages.reads(self._list, config, filter, before):
            yield from pages.take(self._sync(self._call(read, False)))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._sync(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._sync(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._sync(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._sync(self.aprune(thread_ids, strategy=strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._sync(self.aget_delta_channel_history(config=config, channels=channels))
