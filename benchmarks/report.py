"""Figures, targets and the results table (plain text, or rich when it is installed)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["Row", "Summary", "Target", "render_table", "write_json"]

Unit = Literal["ms", "bytes", "x"]


@dataclass(frozen=True)
class Summary:
    """Median, 95th percentile and mean of a metric's samples (p95 and mean are None for
    one value). The p95 is the nearest-rank one: of fewer than 20 samples, their maximum."""

    median: float
    p95: float | None
    n: int
    mean: float | None = None

    @classmethod
    def of(cls, samples: Sequence[float]) -> Summary:
        if not samples:
            raise ValueError("no samples")
        ordered = sorted(samples)
        if len(ordered) == 1:
            return cls(ordered[0], None, 1)
        rank = max(1, math.ceil(0.95 * len(ordered)))  # nearest-rank percentile
        return cls(
            statistics.median(ordered), ordered[rank - 1], len(ordered), statistics.fmean(ordered)
        )

    @classmethod
    def single(cls, value: float) -> Summary:
        return cls(value, None, 1)


@dataclass(frozen=True)
class Target:
    """``limit`` applies to the ratio agentcheck/official of the medians (``on="ratio"``)
    or to agentcheck's own median (``on="agentcheck"``, an absolute target)."""

    limit: float
    on: Literal["ratio", "agentcheck"] = "ratio"


@dataclass
class Row:
    """One line of the table: one metric on one database."""

    workload: str
    metric: str
    db: str
    unit: Unit
    agentcheck: Summary | None
    official: Summary | None
    target: Target | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """agentcheck median / official median; None unless both are above zero (an
        added time, a difference of two medians, can come out at or below zero on noise,
        and a ratio of it means nothing)."""
        ours, theirs = self.agentcheck, self.official
        return _ratio(ours.median if ours else None, theirs.median if theirs else None)

    @property
    def mean_ratio(self) -> float | None:
        """agentcheck mean / official mean, where both have several samples: what the
        median leaves out shows here (agentcheck's put stores a whole snapshot of a list
        every so many deltas; the official saver's commits now and then run SQLite's
        WAL checkpoint)."""
        ours, theirs = self.agentcheck, self.official
        return _ratio(ours.mean if ours else None, theirs.mean if theirs else None)

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        value = self.ratio if self.target.on == "ratio" else self._agentcheck_median()
        return None if value is None else value <= self.target.limit

    def _agentcheck_median(self) -> float | None:
        return None if self.agentcheck is None else self.agentcheck.median

    def target_text(self) -> str:
        if self.target is None:
            return "-"
        if self.target.on == "ratio":
            return f"<= {self.target.limit:g}"
        return f"ac <= {format_value(self.target.limit, self.unit)}"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        data["mean_ratio"] = self.mean_ratio
        data["met"] = self.met
        data["target_text"] = self.target_text()
        return data


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or ours <= 0 or theirs <= 0:
        return None
    return ours / theirs


def format_value(value: float | None, unit: Unit) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.3f} ms" if abs(value) < 100 else f"{value:.1f} ms"
    if unit == "x":
        return f"{value:.2f}x"
    magnitude = abs(value)
    if magnitude >= 1024 * 1024:
        return f"{value / (1024 * 1024):.2f} MB"
    if magnitude >= 1024:
        return f"{value / 1024:.1f} KB"
    return f"{value:.0f} B"


HEADERS = (
    "workload",
    "metric",
    "db",
    "agentcheck med",
    "agentcheck p95",
    "official med",
    "official p95",
    "ratio",
    "target",
    "met",
)
_RIGHT = {3, 4, 5, 6, 7}  # numeric columns


def _cells(row: Row) -> list[str]:
    ac, off = row.agentcheck, row.official
    met = row.met
    return [
        row.workload,
        row.metric,
        row.db,
        format_value(ac.median if ac else None, row.unit),
        format_value(ac.p95 if ac else None, row.unit),
        format_value(off.median if off else None, row.unit),
        format_value(off.p95 if off else None, row.unit),
        "-" if row.ratio is None else f"{row.ratio:.2f}",
        row.target_text(),
        "-" if met is None else ("yes" if met else "NO"),
    ]


def render_table(rows: Sequence[Row]) -> str:
    """The results as aligned plain text (one blank line between workloads)."""
    table = [list(HEADERS)] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(widths[i]) if i in _RIGHT else c.ljust(widths[i]) for i, c in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    out = [line(HEADERS), "  ".join("-" * w for w in widths)]
    previous: str | None = None
    for row, cells in zip(rows, table[1:], strict=True):
        if previous is not None and row.workload != previous:
            out.append("")
        previous = row.workload
        out.append(line(cells))
    return "\n".join(out)


def print_table(rows: Sequence[Row]) -> None:
    """Print with rich when it is installed, else as plain text."""
    try:
        from rich.console import Console  # type: ignore[import-not-found, unused-ignore]
        from rich.table import Table  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print(render_table(rows))
        return
    table = Table(show_lines=False)
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="right" if i in _RIGHT else "left")
    previous: str | None = None
    for row in rows:
        if previous is not None and row.workload != previous:
            table.add_section()
        previous = row.workload
        table.add_row(*_cells(row))
    Console(width=200).print(table)


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
