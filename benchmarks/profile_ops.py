"""Where agentcheck's time goes: pyinstrument profiles of its saver on the benchmark's
workloads, and the SQLite pages each saver writes per put.

    python benchmarks/profile_ops.py [--db sqlite,postgres] [--only put,get_tuple,...] [--html DIR]

The profiles are of agentcheck alone (the official savers are timed by run.py). Each
operation runs on the same data as run.py (the 50-message chat, the 10-node graph) after
a warm-up, and its profile is printed as text (frames under 1% of the time hidden); with
``--html DIR`` each is also written as an HTML page. The page count comes from the WAL
(SQLite's write-ahead log): every page a transaction changes is written there once, and
a commit's cost grows with them (see benchmarks/README.md, "Profiles").
"""

from __future__ import annotations

import argparse
import collections
import copy
import random
import re
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pyinstrument import Profiler

from data import ChatThread, MessageCorpus, new_checkpoint_id
from harness import DBS, IMPLS, Databases, Db, PostgresServer, Progress, choices
from workloads import E2E_NODES, WINDOW, linear_graph, thread_config

OPS = ("put", "put_writes", "get_tuple", "list", "e2e")
WAL_HEADER, FRAME_HEADER = 32, 24


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", default=",".join(DBS), help="sqlite, postgres (default: both)")
    parser.add_argument("--only", default=",".join(OPS), help=f"some of: {', '.join(OPS)}")
    parser.add_argument("--html", type=Path, metavar="DIR", help="also write HTML profiles here")
    args = parser.parse_args(argv)
    args.dbs = choices(parser, "--db", args.db, DBS)
    args.ops = choices(parser, "--only", args.only, OPS)
    return args


def profiled(label: str, fn: Callable[[], object], html: Path | None) -> None:
    profiler = Profiler(interval=0.0001)
    profiler.start()
    fn()
    profiler.stop()
    print(f"\n=== {label} ===")
    print(profiler.output_text(unicode=False, color=False, show_all=False))
    if html is not None:
        html.mkdir(parents=True, exist_ok=True)
        name = label.replace(" ", "_").replace("/", "-").replace(",", "")
        (html / f"{name}.html").write_text(profiler.output_html())


def profile_db(db: Db, databases: Databases, ops: Sequence[str], html: Path | None) -> None:
    corpus = MessageCorpus()
    with databases.open("agentcheck", db, "profile") as store:
        saver = store.saver
        thread = ChatThread(saver, "chat", corpus, user="u-1", window=WINDOW, initial=WINDOW)
        for step in range(200):  # warm-up, and a thread to read
            thread.advance(new_checkpoint_id(step))
        latest = thread_config("chat")

        # The messages are built before profiling: the profile is of the saver, not of
        # the benchmark's data (a put then only assembles its checkpoint around them).
        for i in range(thread.next_message, thread.next_message + 500):
            corpus.message(i)

        # Each step also prepares its checkpoint (ChatThread.prepare): read the profile
        # under SqliteSaver.put / PostgresSaver.put.
        def puts() -> None:
            for step in range(200, 700):
                thread.advance(new_checkpoint_id(step))

        # The writes go to a checkpoint of another thread: 1,000 pending writes on the
        # chat's latest checkpoint would make every later read of it decode them all.
        other = ChatThread(saver, "writes", corpus, user="u-1", window=WINDOW, initial=WINDOW)
        other.advance(new_checkpoint_id(0))

        messages = [corpus.message(100_000 + r) for r in range(500)]
        task_writes = [[("messages", [m]), ("turn", r)] for r, m in enumerate(messages)]

        def put_writes() -> None:
            for r, writes in enumerate(task_writes):
                saver.put_writes(other.config, writes, f"task-{r}", "~__pregel_pull, agent")

        def gets() -> None:
            for _ in range(500):
                saver.get_tuple(latest)

        def lists() -> None:
            for _ in range(100):
                list(saver.list(latest, limit=10))

        # LangGraph calls the saver from worker threads, which pyinstrument does not see:
        # the graph's puts and put_writes are recorded once, then replayed here.
        calls = record_graph_calls(saver)

        def replays() -> None:
            for i in range(100):
                for method, args in calls:
                    config = copy.deepcopy(args[0])
                    config["configurable"]["thread_id"] = f"e2e-{i}"
                    getattr(saver, method)(config, *args[1:])

        runs = {
            "put": ("500 puts of the 57 KB chat state", puts),
            "put_writes": ("500 put_writes of 2 writes", put_writes),
            "get_tuple": ("500 get_tuple of the latest chat checkpoint", gets),
            "list": ("100 list(limit=10) of the chat thread", lists),
            "e2e": (f"the 10-node graph's {len(calls)} puts and put_writes, 100 times", replays),
        }
        for op in ops:
            what, fn = runs[op]
            profiled(f"{db}: {what}", fn, html)


def record_graph_calls(saver: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """The put and put_writes calls one invoke of the 10-node graph makes, in order."""
    calls: list[tuple[str, tuple[Any, ...]]] = []
    originals = {name: getattr(saver, name) for name in ("put", "put_writes")}

    def recorder(name: str) -> Callable[..., Any]:
        def record(*args: Any) -> Any:
            calls.append((name, copy.deepcopy(args)))
            return originals[name](*args)

        # LangGraph passes put_writes a task path only if the method names the parameter:
        # without it, the replay would write the journal's node events without node names.
        def record_writes(config: Any, writes: Any, task_id: str, task_path: str = "") -> Any:
            return record(config, writes, task_id, task_path)

        return record_writes if name == "put_writes" else record

    for name in originals:
        setattr(saver, name, recorder(name))
    try:
        graph = linear_graph(E2E_NODES).compile(checkpointer=saver)
        graph.invoke({"count": 0}, {"configurable": {"thread_id": "recorded"}}, durability="sync")
    finally:
        for name in originals:
            delattr(saver, name)
    return calls


def wal_pages(path: Path, work: Callable[[], int]) -> tuple[float, collections.Counter[str]]:
    """Pages written to the WAL per transaction by ``work`` (which returns how many it
    ran), and which table or index each belongs to."""
    conn = sqlite3.connect(str(path))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    count = work()
    wal = Path(f"{path}-wal").read_bytes()
    pages = []
    for offset in range(WAL_HEADER, len(wal) - FRAME_HEADER + 1, FRAME_HEADER + 4096):
        pages.append(struct.unpack(">I", wal[offset : offset + 4])[0])
    try:
        owner = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
    except sqlite3.OperationalError:  # SQLite built without the dbstat table
        owner = {}
    conn.close()
    return len(pages) / count, collections.Counter(owner.get(p, "?") for p in pages)


class TimedConnection:
    """A sqlite3 connection whose statements are timed: the nanoseconds of each, added
    to ``spent`` under the statement's kind (see :func:`statement_kind`). Either saver
    uses it as its own (agentcheck calls ``execute``, the official saver ``cursor()``
    and ``commit()``)."""

    def __init__(self, conn: sqlite3.Connection, spent: collections.Counter[str]) -> None:
        self._conn = conn
        self._spent = spent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def _timed(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            self._spent[kind] += time.perf_counter_ns() - start

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed(statement_kind(sql), self._conn.execute, sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed(statement_kind(sql), self._conn.executemany, sql, *args)

    def commit(self) -> None:
        self._timed("COMMIT", self._conn.commit)

    def cursor(self) -> Any:
        return TimedCursor(self._conn.cursor(), self)


class TimedCursor:
    """A cursor of a :class:`TimedConnection`, its statements timed the same way."""

    def __init__(self, cur: sqlite3.Cursor, conn: TimedConnection) -> None:
        self._cur = cur
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)

    def __iter__(self) -> Any:
        return iter(self._cur)

    def execute(self, sql: str, *args: Any) -> TimedCursor:
        self._conn._timed(statement_kind(sql), self._cur.execute, sql, *args)
        return self

    def executemany(self, sql: str, *args: Any) -> TimedCursor:
        self._conn._timed(statement_kind(sql), self._cur.executemany, sql, *args)
        return self


def statement_kind(sql: str) -> str:
    """``COMMIT``, ``BEGIN``, or the statement's verb and first table (``INSERT writes``)."""
    words = sql.split(None, 1)
    verb = words[0].upper() if words else "?"
    if verb in ("COMMIT", "BEGIN", "ROLLBACK", "SAVEPOINT", "RELEASE"):
        return "BEGIN" if verb == "BEGIN" else verb
    table = re.search(r"\b(?:INTO|FROM|UPDATE)\s+(\w+)", sql, re.IGNORECASE)
    verb = "INSERT" if verb == "WITH" and "INSERT" in sql.upper() else verb
    return f"{verb} {table.group(1) if table else '?'}"


def sql_split(databases: Databases, invokes: int = 400) -> None:
    """The 10-node graph's puts and put_writes replayed on both SQLite savers, the two
    alternating: per invoke, the time in SQLite's statements by kind (COMMIT apart),
    and the rest (Python: the saver's own work, and LangGraph's serializer)."""
    print("\n=== SQLite: the 10-node graph's 23 calls replayed, ms per invoke, by part ===")
    spent = {impl: collections.Counter[str]() for impl in IMPLS}
    totals: dict[str, list[int]] = {impl: [] for impl in IMPLS}
    with ExitStack() as stack:
        savers, calls = {}, {}
        for impl in IMPLS:
            store = stack.enter_context(databases.open(impl, "sqlite", "split"))
            calls[impl] = record_graph_calls(store.saver)
            saver: Any = store.saver  # both SQLite savers keep their connection in .conn
            saver.conn = TimedConnection(saver.conn, spent[impl])
            savers[impl] = store.saver
        warm = invokes // 8
        for i in range(invokes + warm):
            if i == warm:
                for counter in spent.values():
                    counter.clear()
            for impl in random.sample(IMPLS, len(IMPLS)):
                replay = []
                for method, args in calls[impl]:
                    config = copy.deepcopy(args[0])
                    config["configurable"]["thread_id"] = f"split-{i}"
                    replay.append(
                        (getattr(savers[impl], method), (config, *copy.deepcopy(args[1:])))
                    )
                start = time.perf_counter_ns()
                for fn, fn_args in replay:
                    fn(*fn_args)
                if i >= warm:
                    totals[impl].append(time.perf_counter_ns() - start)
    kinds = sorted({k for c in spent.values() for k in c}, key=lambda k: -spent["agentcheck"][k])
    print(f"{'part':34s} " + " ".join(f"{impl:>11s}" for impl in IMPLS))
    rows = [("total (mean)", {impl: statistics.mean(totals[impl]) for impl in IMPLS})]
    rows.append(
        ("SQLite statements, all", {impl: sum(spent[impl].values()) / invokes for impl in IMPLS})
    )
    rows += [(f"  {kind}", {impl: spent[impl][kind] / invokes for impl in IMPLS}) for kind in kinds]
    rows.append(("the rest (Python)", {
        impl: statistics.mean(totals[impl]) - sum(spent[impl].values()) / invokes for impl in IMPLS
    }))  # fmt: skip
    for label, by_impl in rows:
        print(f"{label:34s} " + " ".join(f"{by_impl[impl] / 1e6:11.3f}" for impl in IMPLS))


def page_counts(databases: Databases) -> None:
    print("\n=== SQLite pages written per transaction (WAL frames of 4 KiB) ===")
    for impl in IMPLS:
        with databases.open(impl, "sqlite", "pages") as store:
            assert store.path is not None
            _page_counts_of(impl, store.saver, store.path)


def _page_counts_of(impl: str, saver: Any, path: Path) -> None:
    saver.conn.execute("PRAGMA wal_autocheckpoint=0")  # keep every frame in the WAL
    thread = ChatThread(saver, "chat", MessageCorpus(), user="u-1", window=WINDOW, initial=WINDOW)
    for step in range(100):
        thread.advance(new_checkpoint_id(step))

    def chat_puts() -> int:
        for step in range(100, 400):
            thread.advance(new_checkpoint_id(step))
        return 300

    graph = linear_graph(E2E_NODES).compile(checkpointer=saver)
    writes_per_invoke = len(record_graph_calls(saver))

    def invokes() -> int:
        for i in range(30):
            config: Any = {"configurable": {"thread_id": f"g{i}"}}
            graph.invoke({"count": 0}, config, durability="sync")
        return 30 * writes_per_invoke

    for label, work in (("chat put", chat_puts), ("10-node graph, per write", invokes)):
        per, owners = wal_pages(path, work)
        total = sum(owners.values())
        top = ", ".join(f"{name} {n / total * per:.1f}" for name, n in owners.most_common(6))
        print(f"{impl:10s} {label:26s} {per:5.1f} pages   ({top})")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    log = Progress()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentcheck-prof-")))
        pg = None
        if "postgres" in args.dbs:
            log("starting PostgreSQL")
            pg = stack.enter_context(PostgresServer())
        databases = Databases(tmp, pg)
        for db in args.dbs:
            log(f"profiling on {db}")
            profile_db(db, databases, args.ops, args.html)
        if "sqlite" in args.dbs:
            if "e2e" in args.ops:
                log("timing the graph's SQLite statements")
                sql_split(databases)
            log("counting SQLite pages")
            page_counts(databases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
