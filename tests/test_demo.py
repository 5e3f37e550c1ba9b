"""The README demo: a real SIGKILL mid-run, and a resume in a new process that does not
charge the card again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_crash_demo_charges_once_across_a_sigkill_and_a_resume(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "crash_demo.py"), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "killed by signal 9" in out
    pids = sorted(set(re.findall(r"\[pid (\d+)\]", out)), key=out.index)
    assert len(pids) == 2
    first, second = pids
    # The card was charged in the killed process only; the new one sent the receipt.
    assert re.search(rf"\[pid {first}\] charge_card: charged \$42", out)
    assert not re.search(rf"\[pid {second}\] charge_card: charged", out)
    assert f"[pid {second}] send_receipt: sent" in out
    assert "The payment provider saw 1 charge(s)" in out
    assert "run order-1001: succeeded, attempt 2" in out
    assert re.search(r"tool\s+replay\s+charge_card", out)
    assert "step charge_card: completed, attempts 1" in out
