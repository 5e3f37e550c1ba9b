"""The README demo: a real SIGKILL mid-run, and a resume in a new process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_crash_demo_resumes_after_sigkill_without_repeating_finished_steps(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "crash_demo.py"), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "killed by signal 9" in out
    pids = re.findall(r"\[pid (\d+)\] (\w+): done", out)
    first, second = pids[0][0], pids[-1][0]
    assert first != second
    assert [step for pid, step in pids if pid == first] == ["plan", "research"]
    assert [step for pid, step in pids if pid == second] == ["write", "review"]
    assert "next to run: ['write']" in out
    assert f"finished: ['plan (pid {first})', 'research (pid {first})', " in out
