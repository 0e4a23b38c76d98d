"""The drill report: figures the end-to-end test and the failure drills record.

Each drill calls `record(name, figures)`; the report file (`BINLAKE_DRILL_REPORT`, default
`var/drills/report.json`) keeps the latest figures per drill, so a run of one drill
updates its entry and leaves the others, and `report.md` next to it is rewritten as a
table from the JSON. Figures are plain numbers and short strings: trials, kills, rows
compared, mismatches, seconds, throughput.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from binlog_assets.environment import var_dir

REPORT_ENV = "BINLAKE_DRILL_REPORT"


def report_path() -> Path:
    return Path(os.environ.get(REPORT_ENV) or var_dir() / "drills" / "report.json")


def record(drill: str, figures: dict[str, Any]) -> Path:
    """Store `figures` as drill `drill`'s latest entry; returns the report's path."""
    path = report_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Drills run side by side (test workers): each read-modify-write holds the lock, so
    # no drill's entry is lost to another's.
    with path.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            report = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            report = {}
        report[drill] = {"recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **figures}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(path)
        path.with_suffix(".md").write_text(markdown(report))
    return path


def markdown(report: dict[str, dict[str, Any]]) -> str:
    lines = ["# binlake drill report", "",
             f"Regenerated from `{report_path().name}` by the tests that record figures.", ""]
    for drill in sorted(report):
        figures = report[drill]
        lines += [f"## {drill}", "", "| figure | value |", "| --- | --- |"]
        for key in sorted(figures):
            value = figures[key]
            if isinstance(value, dict | list):
                value = json.dumps(value, sort_keys=True, default=str)
            lines.append(f"| {key} | {value} |")
        lines.append("")
    return "\n".join(lines)
