"""The benchmark command (benchmarks/run.py) runs: a smoke run of every workload on both
databases, in a child process, as a person would run it. Its figures are not judged
here (timing asserts do not belong in the test suite); that it measures what its table
says, and that both savers answered its reads alike, is."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from pg_server import PostgresServer

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("chat", "filter", "growing", "e2e", "e2e-chat", "journal")
DBS = ("sqlite", "postgres")


def test_the_benchmark_runs_every_workload_on_both_databases(
    pg_server: PostgresServer, tmp_path: Path
) -> None:
    out = tmp_path / "figures.json"
    env = {**os.environ, "AGENTCHECK_TEST_POSTGRES_URL": pg_server.url()}
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]

    figures = json.loads(out.read_text())
    assert figures["smoke"] and figures["databases"] == list(DBS)
    rows = figures["rows"]
    assert {(r["workload"], r["db"]) for r in rows} == {(w, db) for w in WORKLOADS for db in DBS}
    for row in rows:
        where = f"{row['workload']} / {row['metric']} / {row['db']}"
        # (A time "added" is a difference of two medians: on 3 samples it may even be
        # below zero; it must be a number.)
        mine = row["agentcheck"]
        assert mine["n"] >= 1 and math.isfinite(mine["median"]), where
        if row["workload"] == "journal":  # agentcheck alone: what its wrapping adds
            target = row["target"]
            assert row["official"] is None and (target is None or target["on"] == "agentcheck")
        else:
            theirs = row["official"]
            assert theirs["n"] >= 1 and math.isfinite(theirs["median"]), where
            if theirs["median"]:
                assert math.isclose(row["ratio"], mine["median"] / theirs["median"]), where
        # The reads of both savers are compared as the benchmark runs: any difference
        # would be a note on the row (and the figures would compare unequal work).
        assert "answers differ" not in (row["note"] or ""), f"{where}: {row['note']}"
    # The floor both savers are measured against, on each database.
    assert {db: sorted(sizes) for db, sizes in figures["floor"].items()} == {
        db: ["100 B", "57 KB"] for db in DBS
    }
    # The table a person reads: a row per figure, and the verdict on the targets.
    table = run.stdout
    assert "SMOKE RUN" in table.splitlines()[0]
    judged = [r for r in rows if r["met"] is not None]
    met = sum(1 for r in judged if r["met"])
    assert f"Targets met: {met} of {len(judged)}" in table
    for row in rows:
        assert any(
            line.startswith(row["workload"]) and row["metric"] in line and row["db"] in line
            for line in table.splitlines()
        ), row["metric"]
