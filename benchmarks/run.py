"""agentcheck's savers against the official LangGraph savers, in one run, on the same data.

    python benchmarks/run.py [--quick] [--json PATH] [--only NAME,...] [--db sqlite,postgres]

See benchmarks/README.md for the workloads, the durability settings and how to read the
table. Progress goes to stderr, the results to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import platform
import sqlite3
import sys
import tempfile
import time
import warnings
import zlib
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from data import MessageCorpus
from harness import (
    DBS,
    POOL_KWARGS,
    POOL_MAX_SIZE,
    Databases,
    PostgresServer,
    Progress,
    choices,
)
from report import Row, Summary, format_value, print_table, write_json
from workloads import FILTER_THREADS, WINDOW, WORKLOADS, Context, filter_steps, measure_floor

FLOOR = "floor"
NAMES = (FLOOR, *WORKLOADS)
PACKAGES = (
    "agentcheck",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "langchain-core",
    "psycopg",
    "psycopg-pool",
    "zstandard",
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer repetitions and 20,000 checkpoints (not 100,000) for the filter workload",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a few repetitions of everything, on small data: checks that the benchmark "
        "runs (the test suite does); its figures say nothing",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write all figures here")
    parser.add_argument(
        "--only",
        metavar="NAME,...",
        help=f"run only these: {', '.join(NAMES)} (default: all)",
    )
    parser.add_argument(
        "--db",
        metavar="DB,...",
        default=",".join(DBS),
        help="databases to run on: sqlite, postgres (default: both)",
    )
    args = parser.parse_args(argv)
    args.names = choices(parser, "--only", args.only, NAMES) if args.only else NAMES
    args.dbs = choices(parser, "--db", args.db, DBS)
    args.quick = args.quick or args.smoke
    return args


def environment(pg: PostgresServer | None, databases: Databases) -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "postgres": None,
        "packages": versions,
        "sqlite_connections": databases.settings,
    }
    if pg is not None:
        settings = postgres_settings(pg.url())
        env["postgres"] = settings.pop("server_version")
        env["postgres_settings"] = settings
        env["postgres_server"] = (
            "external ($AGENTCHECK_TEST_POSTGRES_URL)"
            if pg.external
            else "throwaway server started by tests/pg_server.py, loopback TCP"
        )
    return env


def postgres_settings(url: str) -> dict[str, str]:
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes")
    settings: dict[str, str] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name in names:
            row = conn.execute(f"SHOW {name}").fetchone()
            settings[name] = str(row[0]) if row else "?"
    return settings


def state_facts(corpus: MessageCorpus) -> dict[str, Any]:
    """What the 50-message chat state weighs, serialized as LangGraph does."""
    _, data = JsonPlusSerializer().dumps_typed(corpus.window(WINDOW, WINDOW))
    return {
        "messages": WINDOW,
        "serialized_bytes": len(data),
        "bytes_per_message": len(data) / WINDOW,
        "zlib1_ratio": len(data) / len(zlib.compress(data, 1)),
    }


def header(args: argparse.Namespace, env: dict[str, Any], state: dict[str, Any]) -> str:
    packages = env["packages"]
    filter_total = FILTER_THREADS * filter_steps(args.quick, args.smoke)
    mode = (
        "SMOKE RUN: a few repetitions on small data, the figures mean nothing"
        if args.smoke
        else "QUICK MODE: fewer repetitions"
    )
    lines = [
        "agentcheck vs the official LangGraph savers"
        + (
            f"  [{mode}; the filter workload uses {filter_total:,} checkpoints, not 100,000]"
            if args.quick
            else ""
        ),
        f"python {env['python']}, SQLite {env['sqlite']}, PostgreSQL {env['postgres'] or '-'}, "
        f"{env['cpu_count']} CPUs, {env['platform']}",
        f"agentcheck {packages['agentcheck']}, langgraph {packages['langgraph']}, "
        f"langgraph-checkpoint-sqlite {packages['langgraph-checkpoint-sqlite']}, "
        f"langgraph-checkpoint-postgres {packages['langgraph-checkpoint-postgres']}",
    ]
    durability: list[str] = []
    sqlite_settings = env["sqlite_connections"]
    if sqlite_settings:
        seen = ", ".join(
            f"{impl.removeprefix('sqlite_')}: journal_mode={s['journal_mode']} "
            f"synchronous={s['synchronous']} busy_timeout={s['busy_timeout']}"
            for impl, s in sorted(sqlite_settings.items())
        )
        durability += [
            "  SQLite: a file per saver; PRAGMA journal_mode=WAL, synchronous=FULL (2),",
            "    busy_timeout=30000 on both connections. The official saver gets the connection",
            "    its from_conn_string opens (sqlite3.connect(path, check_same_thread=False)),",
            "    plus those PRAGMAs: from_conn_string alone gives WAL (set by setup()),",
            "    synchronous=FULL (SQLite's default) and busy_timeout=5000 (sqlite3's timeout).",
            f"    Read back: {seen}",
        ]
    if env["postgres"]:
        s = env["postgres_settings"]
        durability += [
            f"  PostgreSQL: {env['postgres_server']}, a database per saver; fsync={s['fsync']}, "
            f"synchronous_commit={s['synchronous_commit']}, "
            f"full_page_writes={s['full_page_writes']}.",
            "    Both savers on a psycopg_pool.ConnectionPool(min_size=1, "
            f"max_size={POOL_MAX_SIZE}, kwargs={_kwargs_text()}); setup() called.",
        ]
    if durability:
        lines += ["Durability (the same for both savers):", *durability]
    lines += [
        f"Chat state: {state['messages']} messages, {state['serialized_bytes'] / 1024:.1f} KB "
        f"serialized ({state['bytes_per_message']:.0f} B per message; zlib level 1 shrinks "
        f"it {state['zlib1_ratio']:.1f}x).",
        "Times are per operation, median and p95 of the samples; ratio = agentcheck median / "
        "official median (lower is better).",
    ]
    return "\n".join(lines)


def _kwargs_text() -> str:
    items = ", ".join(f"{k}={getattr(v, '__name__', v)}" for k, v in POOL_KWARGS.items())
    return "{" + items + "}"


def floor_text(floor: dict[str, dict[str, Summary]]) -> str:
    lines = ["Raw-insert floor: one INSERT of a bytes value + commit, median (p95):"]
    for db, sizes in floor.items():
        for size, s in sizes.items():
            median, p95 = format_value(s.median, "ms"), format_value(s.p95, "ms")
            lines.append(f"  {db:<9} {size:>6}  {median} ({p95})")
    return "\n".join(lines)


def with_floor_notes(rows: Sequence[Row], floor: dict[str, dict[str, Summary]]) -> list[Row]:
    """The write rows (those naming a floor size in ``extra["floor"]``), with a note of
    what their target leaves next to that floor, measured in the same run: an insert of
    that size and its commit, which any durable write pays (``extra["durable_commits"]``
    times for a row with an absolute target: the commits a wrapped call waits for)."""
    noted = []
    for row in rows:
        size = row.extra.get("floor")
        least = floor.get(row.db, {}).get(size) if size else None
        target = row.target
        commits = int(row.extra.get("durable_commits", 1))
        if least is None or target is None:
            noted.append(row)
            continue
        if target.on == "ratio" and row.official is not None:
            budget = target.limit * row.official.median
            note = (
                f"the target leaves {budget:.3f} ms per call; one {size} insert and its commit "
                f"take {least.median:.3f} ms here, {least.median / budget:.0%} of it"
            )
        elif target.on == "agentcheck" and commits > 0:
            # An absolute target: the disk's speed decides much of it (the commits a call
            # waits for), so the floor says how much of the target the host leaves.
            each = "its commit" if commits == 1 else f"their {commits} commits"
            least_ms = commits * least.median
            note = (
                f"the call waits for {commits} durable commit{'s' * (commits > 1)}: "
                f"{commits} {size} insert{'s' * (commits > 1)} and {each} take "
                f"{least_ms:.3f} ms here, {least_ms / target.limit:.0%} of the target"
            )
        else:
            noted.append(row)
            continue
        noted.append(dataclasses.replace(row, note="; ".join(filter(None, [row.note, note]))))
    return noted


def with_mean_notes(rows: Sequence[Row]) -> list[Row]:
    """Rows whose ratio of means differs from the ratio of medians by 0.05 or more, with
    a note of it: the median leaves out costs that come every so many calls."""
    noted = []
    for row in rows:
        ratio, mean_ratio = row.ratio, row.mean_ratio
        if ratio is None or mean_ratio is None or abs(mean_ratio - ratio) < 0.05:
            noted.append(row)
            continue
        assert row.agentcheck is not None and row.official is not None  # a ratio of both
        note = (
            f"ratio of the means {mean_ratio:.2f} (agentcheck "
            f"{format_value(row.agentcheck.mean, row.unit)}, official "
            f"{format_value(row.official.mean, row.unit)})"
        )
        noted.append(dataclasses.replace(row, note="; ".join(filter(None, [row.note, note]))))
    return noted


def notes_text(rows: Sequence[Row]) -> str:
    notes = [f"  {r.workload} / {r.metric} / {r.db}: {r.note}" for r in rows if r.note]
    return "Notes:\n" + "\n".join(notes) if notes else ""


def verdict_text(rows: Sequence[Row]) -> str:
    judged = [r for r in rows if r.met is not None]
    missed = [r for r in judged if not r.met]
    return f"Targets met: {len(judged) - len(missed)} of {len(judged)} (see the met column)."


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    log = Progress()
    started = time.monotonic()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentcheck-bench-")))
        pg: PostgresServer | None = None
        if "postgres" in args.dbs:
            log("starting PostgreSQL")
            pg = stack.enter_context(PostgresServer())
        databases = Databases(tmp, pg)
        corpus = MessageCorpus()
        ctx = Context(databases, args.dbs, args.quick, corpus, log, smoke=args.smoke)
        floor: dict[str, dict[str, Summary]] = {}
        rows: list[Row] = []
        for name in args.names:
            if name == FLOOR:
                log("raw-insert floor")
                floor = measure_floor(ctx)
            else:
                log(f"workload {name}: {WORKLOADS[name].summary}")
                rows += WORKLOADS[name].run(ctx)
        env = environment(pg, databases)
    rows = with_mean_notes(with_floor_notes(rows, floor))
    state = state_facts(corpus)
    elapsed = time.monotonic() - started
    log(f"done in {elapsed:.0f}s")

    print(header(args, env, state))
    print()
    if floor:
        print(floor_text(floor))
        print()
    if rows:
        print_table(rows)
        print()
        notes = notes_text(rows)
        if notes:
            print(notes)
            print()
        print(verdict_text(rows))
    print(f"Total time: {elapsed:.0f}s")
    if args.json:
        write_json(
            args.json,
            {
                "quick": args.quick,
                "smoke": args.smoke,
                "only": list(args.names),
                "databases": list(args.dbs),
                "elapsed_s": elapsed,
                "environment": env,
                "chat_state": state,
                "floor": {
                    db: {size: s.__dict__ for size, s in sizes.items()}
                    for db, sizes in floor.items()
                },
                "rows": [r.as_dict() for r in rows],
            },
        )
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
