"""The workloads. Each one runs agentcheck's saver and the official saver side by side, on
databases of their own, with the same data, alternating their samples."""

from __future__ import annotations

import os
import random
import sqlite3
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Durability

from agentcheck import side_effect
from agentcheck.adapters.langgraph import durable_model

from data import ChatThread, MessageCorpus, new_checkpoint_id
from harness import (
    IMPLS,
    POOL_MAX_SIZE,
    Databases,
    Db,
    Impl,
    Progress,
    Store,
    interleaved,
    open_official_sqlite,
    pool_of,
    timed_ms,
)
from report import Row, Summary, Target

__all__ = [
    "E2E_NODES",
    "FILTER_THREADS",
    "WINDOW",
    "WORKLOADS",
    "Context",
    "Workload",
    "filter_steps",
    "linear_graph",
    "measure_floor",
    "thread_config",
]

WINDOW = 50  # messages in the chat window
FLOOR_BYTES = 57 * 1024


@dataclass
class Context:
    databases: Databases
    dbs: tuple[Db, ...]
    quick: bool
    corpus: MessageCorpus
    log: Progress
    # A few repetitions of everything (tests/test_benchmarks.py): that every workload
    # runs and reports, not how fast.
    smoke: bool = False

    def scale(self, full: int, quick: int) -> int:
        if self.smoke:
            return max(3, quick // 20)
        return quick if self.quick else full


@dataclass(frozen=True)
class Workload:
    name: str
    summary: str
    run: Callable[[Context], list[Row]]


@contextmanager
def store_pair(ctx: Context, db: Db, name: str) -> Iterator[dict[Impl, Store]]:
    """agentcheck's and the official saver on two fresh databases."""
    with ExitStack() as stack:
        yield {impl: stack.enter_context(ctx.databases.open(impl, db, name)) for impl in IMPLS}


def on_each_db(
    name: str, run_on: Callable[[Context, Db, dict[Impl, Store]], list[Row]]
) -> Callable[[Context], list[Row]]:
    """A workload that runs ``run_on`` on each chosen database, with a fresh pair of
    stores (agentcheck and official) named ``name``."""

    def run(ctx: Context) -> list[Row]:
        rows: list[Row] = []
        for db in ctx.dbs:
            with store_pair(ctx, db, name) as stores:
                rows += run_on(ctx, db, stores)
        return rows

    return run


def _summaries(samples: dict[Impl, list[float]]) -> tuple[Summary, Summary]:
    return Summary.of(samples["agentcheck"]), Summary.of(samples["official"])


def thread_config(thread_id: str, checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _list(
    saver: BaseCheckpointSaver[Any], config: RunnableConfig | None, **kwargs: Any
) -> list[CheckpointTuple]:
    return list(saver.list(config, **kwargs))


def _ids(tuples: list[CheckpointTuple]) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in tuples]


def _compare(ctx: Context, what: str, results: dict[Impl, Any], problems: list[str]) -> None:
    """Both savers must answer the same: the figures compare equal work only then."""
    if results["agentcheck"] != results["official"]:
        problem = f"{what}: agentcheck and official answers differ"
        ctx.log(f"WARNING {problem}")
        problems.append(problem)


# -- the raw-insert floor ---------------------------------------------------------------


FLOOR_SIZES = {"57 KB": FLOOR_BYTES, "100 B": 100}


def measure_floor(ctx: Context) -> dict[str, dict[str, Summary]]:
    """One INSERT of a bytes value and its commit, per database and size: the least a
    durable put of the chat state (57 KB) or a small write (100 B) costs."""
    reps, warmup = ctx.scale(300, 60), 10
    floors: dict[str, dict[str, Summary]] = {}
    if "sqlite" in ctx.dbs:
        path = ctx.databases.tmp / "floor.db"
        conn = sqlite3.connect(str(path), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, v BLOB)")

        def sqlite_insert(value: bytes) -> None:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO raw (v) VALUES (?)", (value,))
            conn.execute("COMMIT")

        floors["sqlite"] = _floors(sqlite_insert, reps, warmup, ctx)
        conn.close()
    if "postgres" in ctx.dbs:
        assert ctx.databases.pg is not None
        url = ctx.databases.pg.create_database("bench_floor")
        # Through a pool made as the savers' is (same connection settings, a connection
        # taken from it for each insert), so the floor pays what their calls pay.
        pool = pool_of(url, max_size=1)
        try:
            with pool.connection() as pg:
                pg.execute("CREATE TABLE raw (id BIGSERIAL PRIMARY KEY, v BYTEA)")

            def pg_insert(value: bytes) -> None:
                with pool.connection() as pg:
                    pg.execute("INSERT INTO raw (v) VALUES (%s)", (value,))

            floors["postgres"] = _floors(pg_insert, reps, warmup, ctx)
        finally:
            pool.close()
        ctx.databases.pg.drop_database(url)
    return floors


def _floors(
    insert: Callable[[bytes], None], reps: int, warmup: int, ctx: Context
) -> dict[str, Summary]:
    # The 57 KB value is the chat state as LangGraph serializes it (PostgreSQL compresses
    # it as it does the official saver's rows); the 100-byte one is random.
    state = JsonPlusSerializer().dumps_typed(ctx.corpus.window(WINDOW, WINDOW))[1]
    found: dict[str, Summary] = {}
    for label, size in FLOOR_SIZES.items():
        value = state if size == FLOOR_BYTES else os.urandom(size)
        for _ in range(warmup):
            insert(value)
        found[label] = Summary.of([timed_ms(partial(insert, value)) for _ in range(reps)])
    return found


# -- a chat thread with a 50-message window ----------------------------------------------


def _chat_window_on(ctx: Context, db: Db, stores: dict[Impl, Store]) -> list[Row]:
    steps = ctx.scale(1000, 1000)
    reads = ctx.scale(300, 60)
    lists = ctx.scale(150, 40)
    corpus = ctx.corpus
    problems: list[str] = []

    def thread(impl: Impl, thread_id: str) -> ChatThread:
        return ChatThread(
            stores[impl].saver, thread_id, corpus, user="u-1", window=WINDOW, initial=WINDOW
        )

    # Warm up every code path (and PostgreSQL's prepared statements) on another thread.
    warm = {impl: thread(impl, "warm-up") for impl in IMPLS}
    for step in range(20):
        checkpoint_id = new_checkpoint_id(step)
        for impl in IMPLS:
            warm[impl].advance(checkpoint_id)
    for impl in IMPLS:
        saver = stores[impl].saver
        warm_writes = [("messages", [corpus.message(90_000)]), ("turn", 0)]
        for w in range(5):
            config = thread_config("warm-up", warm[impl].checkpoint_ids[5 + w])
            saver.put_writes(config, warm_writes, f"warm-{w}", "~__pregel_pull, agent")
        for _ in range(5):
            saver.get_tuple(thread_config("warm-up"))
            saver.get_tuple(thread_config("warm-up", warm[impl].checkpoint_ids[3]))
            _list(saver, thread_config("warm-up"), limit=10)

    ctx.log(f"chat/{db}: {steps} puts of a {WINDOW}-message window")
    size_before = {impl: stores[impl].size_bytes() for impl in IMPLS}
    main = {impl: thread(impl, "chat") for impl in IMPLS}
    ids = [new_checkpoint_id(step) for step in range(steps)]
    put_ms: dict[Impl, list[float]] = {impl: [] for impl in IMPLS}
    for step, impl in interleaved(steps, IMPLS):
        put_ms[impl].append(main[impl].advance(ids[step]) / 1e6)
    per_checkpoint = {
        impl: (stores[impl].size_bytes() - size_before[impl]) / steps for impl in IMPLS
    }

    ctx.log(f"chat/{db}: reads")
    for impl in IMPLS:
        stores[impl].analyze()
    latest = thread_config("chat")
    rng = random.Random(3)
    by_id = [thread_config("chat", rng.choice(ids)) for _ in range(reads)]
    get_latest: dict[Impl, list[float]] = {impl: [] for impl in IMPLS}
    get_by_id: dict[Impl, list[float]] = {impl: [] for impl in IMPLS}
    listed: dict[Impl, list[float]] = {impl: [] for impl in IMPLS}
    answers: dict[str, dict[Impl, Any]] = {"latest": {}, "by id": {}, "list": {}}
    for r, impl in interleaved(reads, IMPLS):
        saver = stores[impl].saver
        get_latest[impl].append(timed_ms(partial(saver.get_tuple, latest)))
        get_by_id[impl].append(timed_ms(partial(saver.get_tuple, by_id[r])))
    for _, impl in interleaved(lists, IMPLS):
        saver = stores[impl].saver
        listed[impl].append(timed_ms(partial(_list, saver, latest, limit=10)))
    for impl in IMPLS:
        saver = stores[impl].saver
        found = saver.get_tuple(latest)
        assert found is not None
        answers["latest"][impl] = (_ids([found]), found.checkpoint["channel_values"]["messages"])
        found = saver.get_tuple(by_id[0])
        assert found is not None
        answers["by id"][impl] = (_ids([found]), found.checkpoint["channel_values"]["messages"])
        answers["list"][impl] = _ids(_list(saver, latest, limit=10))
    for what, results in answers.items():
        _compare(ctx, f"chat/{db} {what}", results, problems)

    ctx.log(f"chat/{db}: put_writes")
    writes_ms: dict[Impl, list[float]] = {impl: [] for impl in IMPLS}
    for r, impl in interleaved(reads, IMPLS):
        saver = stores[impl].saver
        config = thread_config("chat", ids[r % steps])
        writes = [("messages", [corpus.message(100_000 + r)]), ("turn", r)]
        task_id = str(uuid.UUID(int=r + 1))
        put_writes = partial(saver.put_writes, config, writes, task_id, "~__pregel_pull, agent")
        writes_ms[impl].append(timed_ms(put_writes))

    note = "; ".join(problems)
    return [
        # The floor a write's target is set against (run.py notes it): a chat put stores a
        # delta of a message or two, so a small insert and its commit is its least.
        Row(
            "chat",
            "put, 57 KB state",
            db,
            "ms",
            *_summaries(put_ms),
            Target(0.4),
            extra={"floor": "100 B"},
        ),
        Row(
            "chat",
            "put_writes, 2 writes",
            db,
            "ms",
            *_summaries(writes_ms),
            Target(0.5),
            extra={"floor": "100 B"},
        ),
        Row("chat", "get_tuple latest", db, "ms", *_summaries(get_latest), Target(0.5), note),
        Row("chat", "get_tuple by id", db, "ms", *_summaries(get_by_id), Target(0.5), note),
        Row(
            "chat",
            f"list(limit=10), {steps:,} cps",
            db,
            "ms",
            *_summaries(listed),
            Target(0.3),
            note,
        ),
        Row(
            "chat",
            "bytes per checkpoint",
            db,
            "bytes",
            Summary.single(per_checkpoint["agentcheck"]),
            Summary.single(per_checkpoint["official"]),
            Target(0.3),
        ),
    ]


# -- metadata filters over many threads ---------------------------------------------------


FILTER_THREADS = 1000


def filter_steps(quick: bool, smoke: bool = False) -> int:
    """Checkpoints per thread: 100,000 in all, 20,000 in quick mode (3,000 in a smoke run)."""
    return 3 if smoke else 20 if quick else 100


def _metadata_filter_on(ctx: Context, db: Db, stores: dict[Impl, Store]) -> list[Row]:
    steps = filter_steps(ctx.quick, ctx.smoke)
    total = FILTER_THREADS * steps
    ctx.log(f"filter/{db}: filling {total:,} checkpoints in {FILTER_THREADS:,} threads")
    with ExitStack() as stack:
        bulk = {impl: stack.enter_context(stores[impl].bulk()) for impl in IMPLS}
        threads = {
            impl: [
                ChatThread(bulk[impl], f"t-{t:04d}", ctx.corpus, user=f"u-{t % 100}", window=2)
                for t in range(FILTER_THREADS)
            ]
            for impl in IMPLS
        }
        for step in range(steps):
            for t in range(FILTER_THREADS):
                checkpoint_id = new_checkpoint_id(step)
                for impl in IMPLS:
                    threads[impl][t].advance(checkpoint_id)
            if (step + 1) % max(1, steps // 5) == 0:
                ctx.log(f"filter/{db}: {(step + 1) * FILTER_THREADS:,} checkpoints")

    queries: list[tuple[str, dict[str, Any]]] = [
        ("user=u-17", {"user": "u-17"}),
        ("step=5 & source=loop", {"step": 5, "source": "loop"}),
    ]
    max_reps, min_reps, budget_ms = ctx.scale(40, 10), 3, ctx.scale(20_000, 4_000)
    rows: list[Row] = []
    for label, query in queries:
        problems: list[str] = []
        answers = {  # also the warm-up
            impl: _ids(_list(stores[impl].saver, None, filter=query, limit=10)) for impl in IMPLS
        }
        _compare(ctx, f"filter/{db} {label}", answers, problems)
        samples: dict[Impl, list[float]] = {impl: [] for impl in IMPLS}
        spent = 0.0
        for r, impl in interleaved(max_reps, IMPLS):
            if r >= min_reps and spent > budget_ms:
                break
            elapsed = timed_ms(partial(_list, stores[impl].saver, None, filter=query, limit=10))
            samples[impl].append(elapsed)
            spent += elapsed
        metric = f"list, filter {label}, limit=10, {total // 1000}k cps"
        rows.append(
            Row(
                "filter",
                metric,
                db,
                "ms",
                *_summaries(samples),
                Target(0.05),
                "; ".join(problems),
                {"filter": query, "checkpoints": total, "threads": FILTER_THREADS},
            )
        )
    return rows


# -- a chat thread that grows ----------------------------------------------------------


GROWING_TURNS = 200
EDGE = 5  # turns pooled at each end of the thread


# The last CYCLE turns are timed too, for their mean: at 200 messages agentcheck stores a
# whole snapshot of the list after 25 deltas (one per 8 items), and one always falls
# inside the last 32 turns but not inside the last EDGE, so the edge alone leaves it out.
CYCLE = 32


def _growing_thread_on(ctx: Context, db: Db, stores: dict[Impl, Store]) -> list[Row]:
    reps = ctx.scale(8, 5)
    ctx.log(f"growing/{db}: {reps} x {GROWING_TURNS} turns")
    # The bytes of one whole thread, measured on its own (untimed).
    grown: dict[Impl, int] = {}
    ids = [new_checkpoint_id(turn) for turn in range(GROWING_TURNS)]
    for impl in IMPLS:
        thread = ChatThread(stores[impl].saver, "grow-bytes", ctx.corpus, user="u-1")
        size_before = stores[impl].size_bytes()
        for checkpoint_id in ids:
            thread.advance(checkpoint_id)
        grown[impl] = stores[impl].size_bytes() - size_before
    # Each saver's thread runs whole on its own, the savers' order alternating by
    # repetition: growth compares a saver with itself. Interleaved turn by turn, one
    # saver's turn-200 put would run right after the other's (the official savers write
    # ~230 KB there, evicting the processor's caches) and its turn-1 put after a 1 KB
    # one, so each growth would also count the other saver's. Both ends of the thread
    # get the same lead-in, untimed: a pause (the database's background work on what
    # was written before, the other saver's thread included, settles) and a few puts of
    # the same saver on a thread of its own (a 10-message window: the same puts each
    # time).
    warm = {
        impl: ChatThread(stores[impl].saver, "warm-up", ctx.corpus, user="u-1", window=10)
        for impl in IMPLS
    }
    warm_steps = iter(range(10**6))

    def lead_in(impl: Impl) -> None:
        time.sleep(0.2)
        for _ in range(EDGE):
            warm[impl].advance(new_checkpoint_id(next(warm_steps)))

    early: dict[Impl, list[float]] = {impl: [] for impl in IMPLS}
    late: dict[Impl, list[float]] = {impl: [] for impl in IMPLS}
    cycle: dict[Impl, list[float]] = {impl: [] for impl in IMPLS}
    for rep in range(reps):
        ids = [new_checkpoint_id(turn) for turn in range(GROWING_TURNS)]
        for impl in IMPLS[rep % len(IMPLS) :] + IMPLS[: rep % len(IMPLS)]:
            thread = ChatThread(stores[impl].saver, f"grow-{rep}", ctx.corpus, user="u-1")
            for turn in range(GROWING_TURNS):
                if turn in (0, GROWING_TURNS - CYCLE, GROWING_TURNS - EDGE):
                    lead_in(impl)
                ms = thread.advance(ids[turn]) / 1e6
                if turn < EDGE:
                    early[impl].append(ms)
                if turn >= GROWING_TURNS - EDGE:
                    late[impl].append(ms)
                if turn >= GROWING_TURNS - CYCLE:
                    cycle[impl].append(ms)
    growth = {
        impl: statistics.median(late[impl]) / statistics.median(early[impl]) for impl in IMPLS
    }
    # The mean over a whole cycle, against the first turns' mean: what a put near turn
    # 200 costs on average, its snapshot included.
    mean_growth = {
        impl: statistics.fmean(cycle[impl]) / statistics.fmean(early[impl]) for impl in IMPLS
    }
    late_turns = f"turns {GROWING_TURNS - EDGE + 1}-{GROWING_TURNS}"
    cycle_turns = f"turns {GROWING_TURNS - CYCLE + 1}-{GROWING_TURNS}"
    return [
        Row(
            "growing",
            f"bytes after {GROWING_TURNS} turns",
            db,
            "bytes",
            Summary.single(grown["agentcheck"]),
            Summary.single(grown["official"]),
            Target(0.1 if db == "sqlite" else 0.3),
        ),
        Row("growing", f"put, turns 1-{EDGE}", db, "ms", *_summaries(early)),
        Row("growing", f"put, {late_turns}", db, "ms", *_summaries(late)),
        _growth_row(f"put growth, {late_turns} / 1-{EDGE}", db, growth),
        Row("growing", f"put, {cycle_turns}", db, "ms", *_summaries(cycle)),
        _growth_row(f"put growth of the mean, {cycle_turns} / 1-{EDGE}", db, mean_growth),
    ]


def _growth_row(metric: str, db: Db, growth: dict[Impl, float]) -> Row:
    """Each saver's growth, agentcheck's under the 1.5x target."""
    return Row(
        "growing",
        metric,
        db,
        "x",
        Summary.single(growth["agentcheck"]),
        Summary.single(growth["official"]),
        Target(1.5, on="agentcheck"),
    )


# -- end to end: a 10-node graph ------------------------------------------------------------


class Count(TypedDict):
    count: int


def _increment(state: Count) -> Count:
    return {"count": state["count"] + 1}


def linear_graph(nodes: int) -> StateGraph[Count]:
    builder: StateGraph[Count] = StateGraph(Count)
    previous = START
    for i in range(nodes):
        builder.add_node(f"n{i}", _increment)
        builder.add_edge(previous, f"n{i}")
        previous = f"n{i}"
    builder.add_edge(previous, END)
    return builder


E2E_NODES = 10
DURABILITIES: tuple[Durability, ...] = ("exit", "async", "sync")


class NullSaver(BaseCheckpointSaver[int]):  # the base class's own (int) versions
    """A checkpointer that stores nothing: what LangGraph itself spends per super-step
    once a graph has a checkpointer (creating checkpoints, submitting the writes), which
    no saver can go below."""

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return None

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return thread_config(config["configurable"]["thread_id"], checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        return None


class FloorSaver(NullSaver):
    """The least a durable checkpointer can do: each put and each put_writes serializes
    what it is given (LangGraph's own serializer, as the official savers do) and stores
    it as rows of one INSERT, committed; nothing is indexed, journaled, compared or read
    back. ``store(rows)`` inserts ``(thread_id, checkpoint_id, data)`` rows and commits.
    What a graph costs with it is what any saver with the same durability pays at least
    (on a state this small, storing the checkpoint whole is no waste)."""

    def __init__(self, store: Callable[[list[tuple[str, str, bytes]]], None]) -> None:
        super().__init__()
        self.store = store

    # get_tuple: NullSaver's None (every run is a new thread).

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        data = self.serde.dumps_typed(checkpoint)[1] + self.serde.dumps_typed(metadata)[1]
        self.store([(config["configurable"]["thread_id"], checkpoint["id"], data)])
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config["configurable"]
        thread_id, checkpoint_id = configurable["thread_id"], configurable["checkpoint_id"]
        self.store(
            [(thread_id, checkpoint_id, self.serde.dumps_typed(value)[1]) for _, value in writes]
        )


@contextmanager
def floor_saver(ctx: Context, db: Db) -> Iterator[FloorSaver]:
    """A FloorSaver on a database of its own, with the durability settings both savers
    have (SQLite: WAL, synchronous=FULL; PostgreSQL: the same pool settings)."""
    insert = "INSERT INTO floor (thread_id, checkpoint_id, data) VALUES "
    create = "CREATE TABLE floor (thread_id TEXT, checkpoint_id TEXT, data {})"
    if db == "sqlite":
        conn = open_official_sqlite(ctx.databases.tmp / f"floor-{uuid.uuid4().hex}.db")
        conn.isolation_level = None
        conn.execute(create.format("BLOB"))
        lock = threading.Lock()

        def sqlite_store(rows: list[tuple[str, str, bytes]]) -> None:
            with lock:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(insert + ", ".join(["(?, ?, ?)"] * len(rows)), _flat(rows))
                conn.execute("COMMIT")

        try:
            yield FloorSaver(sqlite_store)
        finally:
            conn.close()
        return
    assert ctx.databases.pg is not None
    url = ctx.databases.pg.create_database("bench_floor_saver")
    pool = pool_of(url, POOL_MAX_SIZE)
    # One call at a time, as both savers store a thread's writes (LangGraph hands a
    # step's put and put_writes to a thread pool; without it they would overlap here).
    pg_lock = threading.Lock()
    try:
        with pool.connection() as pg:
            pg.execute(create.format("BYTEA"))

        def pg_store(rows: list[tuple[str, str, bytes]]) -> None:
            # One statement in autocommit mode: one round trip, committed.
            with pg_lock, pool.connection() as pg:
                pg.execute(insert + ", ".join(["(%s, %s, %s)"] * len(rows)), _flat(rows))

        yield FloorSaver(pg_store)
    finally:
        pool.close()
        ctx.databases.pg.drop_database(url)


def _flat(rows: list[tuple[str, str, bytes]]) -> list[Any]:
    return [value for row in rows for value in row]


def chat_graph(corpus: MessageCorpus, nodes: int) -> tuple[StateGraph[Chat], Chat]:
    """A line of ``nodes`` nodes on a chat state (LangGraph's ``add_messages``), each
    appending one ~1.1 KB reply, and its input: the 50 messages (~57 KB) of the chat
    workload."""
    builder: StateGraph[Chat] = StateGraph(Chat)
    previous = START
    for i in range(nodes):
        reply = AIMessage(content=corpus.text(10_000 + i), id=f"reply-{i}")
        builder.add_node(f"n{i}", partial(_reply, reply))
        builder.add_edge(previous, f"n{i}")
        previous = f"n{i}"
    builder.add_edge(previous, END)
    return builder, {"messages": corpus.window(WINDOW, WINDOW)}


class Chat(TypedDict):
    messages: Annotated[list[BaseMessage], add_messages]


def _reply(reply: AIMessage, state: Chat) -> Chat:
    return {"messages": [reply]}


def _end_to_end_on(ctx: Context, db: Db, stores: dict[Impl, Store]) -> list[Row]:
    with floor_saver(ctx, db) as floor:
        rows = _graph_end_to_end(
            ctx, db, stores, "e2e", linear_graph(E2E_NODES), {"count": 0}, floor, DURABILITIES
        )
    builder, state = chat_graph(ctx.corpus, E2E_NODES)
    return rows + _graph_end_to_end(ctx, db, stores, "e2e-chat", builder, state, None, ())


def _graph_end_to_end(
    ctx: Context,
    db: Db,
    stores: dict[Impl, Store],
    workload: str,
    builder: StateGraph[Any],
    state: Any,
    floor: FloorSaver | None,
    floor_modes: tuple[Durability, ...],
) -> list[Row]:
    """Rows of ``ms added per super-step`` for each durability mode; with a FloorSaver,
    what it adds in the ``floor_modes`` too."""
    reps, warmup = ctx.scale(150, 40) if floor else ctx.scale(60, 20), 5
    graphs = {
        "none": builder.compile(),
        "null": builder.compile(checkpointer=NullSaver()),
        "agentcheck": builder.compile(checkpointer=stores["agentcheck"].saver),
        "official": builder.compile(checkpointer=stores["official"].saver),
    }
    rows: list[Row] = []
    for mode in DURABILITIES:
        ctx.log(f"{workload}/{db}: durability={mode}")
        with_floor = floor is not None and mode in floor_modes
        if with_floor:
            graphs["floor"] = builder.compile(checkpointer=floor)
        names = tuple(graphs)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for r, name in interleaved(warmup + reps, names):
            config: RunnableConfig = {"configurable": {"thread_id": f"{workload}-{mode}-{r}"}}
            # Without a checkpointer durability means nothing (and LangGraph refuses "sync").
            durability = None if name == "none" else mode
            elapsed = timed_ms(partial(graphs[name].invoke, state, config, durability=durability))
            if r >= warmup:
                samples[name].append(elapsed)
        graphs.pop("floor", None)
        base = statistics.median(samples["none"])
        added: dict[Impl, list[float]] = {
            impl: [(t - base) / E2E_NODES for t in samples[impl]] for impl in IMPLS
        }
        langgraph = (statistics.median(samples["null"]) - base) / E2E_NODES
        official = statistics.median(added["official"])
        target = Target(0.5)
        note = (
            f"without a checkpointer: {base / E2E_NODES:.3f} ms per super-step; a "
            f"checkpointer that stores nothing adds {langgraph:.3f} ms of LangGraph's "
            f"own work, so the target leaves {target.limit * official - langgraph:.3f} ms "
            "for storing"
        )
        extra = {
            "no_checkpointer_ms_per_step": base / E2E_NODES,
            "storing_nothing_ms_per_step": langgraph,
        }
        if with_floor:
            least = (statistics.median(samples["floor"]) - base) / E2E_NODES
            note += (
                f"; a saver that only inserts and commits each call's data (FloorSaver) adds "
                f"{least:.3f} ms, {least / official:.2f} of the official saver"
            )
            extra["floor_saver_ms_per_step"] = least
        what = "" if workload == "e2e" else ", 57 KB chat state"
        rows.append(
            Row(
                workload,
                f"ms added per super-step{what}, durability={mode}",
                db,
                "ms",
                *_summaries(added),
                target,
                note,
                extra,
            )
        )
    return rows


# -- journal overhead of wrapped calls ------------------------------------------------------


CALLS = 20  # wrapped calls per node run
JOURNAL_TARGET_MS: dict[Db, float] = {"sqlite": 0.5, "postgres": 1.5}


def _charge(amount: int) -> int:
    return amount


charge = side_effect(name="charge")(_charge)


def calls_graph(call: Callable[[int], object]) -> StateGraph[Count]:
    """One node that makes ``CALLS`` calls."""

    def work(state: Count) -> Count:
        for i in range(CALLS):
            call(i)
        return {"count": state["count"] + CALLS}

    builder: StateGraph[Count] = StateGraph(Count)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_edge("work", END)
    return builder


def _fake_model() -> BaseChatModel:
    return FakeMessagesListChatModel(responses=[AIMessage("ok"), AIMessage("done")])


def _invoke(model: BaseChatModel, prompt: list[BaseMessage]) -> Callable[[int], object]:
    return lambda _: model.invoke(prompt)


def journal_overhead(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    small: list[BaseMessage] = [HumanMessage("What is the weather in Paris?")]
    window = ctx.corpus.window(WINDOW, WINDOW)
    bare, durable = _fake_model(), durable_model(_fake_model())
    recording = durable_model(_fake_model(), record_prompt=True)
    # (label, unwrapped call, wrapped call, has a target, the commits it waits for: a side
    # effect's claim and completion; a model call's completion only, see the README)
    variants: list[tuple[str, Callable[[int], object], Callable[[int], object], bool, int]] = [
        ("@side_effect call", _charge, charge, True, 2),
        (
            "durable_model call, 1-msg prompt",
            _invoke(bare, small),
            _invoke(durable, small),
            True,
            1,
        ),
        (
            f"durable_model call, {WINDOW}-msg prompt",
            _invoke(bare, window),
            _invoke(durable, window),
            True,
            1,
        ),
        (
            f"durable_model(record_prompt=True), {WINDOW}-msg prompt",
            _invoke(bare, window),
            _invoke(recording, window),
            False,
            1,
        ),
    ]
    reps, warmup = ctx.scale(60, 15), 3
    for db in ctx.dbs:
        with ctx.databases.open("agentcheck", db, "journal") as store:
            for label, plain, wrapped, has_target, commits in variants:
                ctx.log(f"journal/{db}: {label}")
                graphs = {
                    "plain": calls_graph(plain).compile(checkpointer=store.saver),
                    "wrapped": calls_graph(wrapped).compile(checkpointer=store.saver),
                }
                samples: dict[str, list[float]] = {name: [] for name in graphs}
                for r, name in interleaved(warmup + reps, tuple(graphs)):
                    thread_id = f"{label}-{name}-{r}"  # a new thread for each invoke
                    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
                    invoke = partial(graphs[name].invoke, {"count": 0}, config, durability="exit")
                    elapsed = timed_ms(invoke)
                    if r >= warmup:
                        samples[name].append(elapsed)
                base = statistics.median(samples["plain"])
                overhead = [(t - base) / CALLS for t in samples["wrapped"]]
                target = Target(JOURNAL_TARGET_MS[db], on="agentcheck") if has_target else None
                rows.append(
                    Row(
                        "journal",
                        f"{label}: ms added",
                        db,
                        "ms",
                        Summary.of(overhead),
                        None,
                        target,
                        f"the unwrapped call: {base / CALLS:.3f} ms per call (graph included)",
                        {
                            "unwrapped_ms_per_call": base / CALLS,
                            "floor": "100 B",
                            "durable_commits": commits,
                        },
                    )
                )
    return rows


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "chat",
            "a 57 KB chat state: put, writes, reads, bytes",
            on_each_db("chat", _chat_window_on),
        ),
        Workload(
            "filter",
            "metadata filters over many threads",
            on_each_db("filter", _metadata_filter_on),
        ),
        Workload(
            "growing",
            "a chat thread growing for 200 turns",
            on_each_db("growing", _growing_thread_on),
        ),
        Workload(
            "e2e",
            "a 10-node graph, on a counter and on the chat state, with each saver vs none",
            on_each_db("e2e", _end_to_end_on),
        ),
        Workload("journal", "the journal's cost per wrapped tool or model call", journal_overhead),
    )
}
