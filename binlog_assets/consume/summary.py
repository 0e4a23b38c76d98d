"""What a bounded run (`consume/run.py`) reports: its summary, and why it stopped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from binlog_assets.consume.checkpoint import Checkpoint
from binlog_assets.consume.invoke import HandlerMetrics

STOP_END = "end_offset"
STOP_MAX_RECORDS = "max_records"
STOP_MAX_SECONDS = "max_seconds"
STOP_INTERRUPTED = "interrupted"  # the run's `stop` was set (Dagster terminated the run)
STOP_AT_RECORD = "stopped_at_record"  # a record it may not pass (`errors.stops_partition`)
# A snapshot's end waits for its schema (`consume/snapshot_end.py`): the next run goes on.
STOP_SNAPSHOT_PENDING = "snapshot_pending"


@dataclass
class RunSummary:
    topic: str
    partition: int
    start_offset: int
    checkpoint_source: str
    end_offset: int
    committed_offset: int
    records: int = 0
    events: int = 0
    skipped_already_done: int = 0
    dead_lettered: int = 0
    decode_dead_lettered: int = 0
    # Keys whose later events went to the dead-letter topic without retries.
    breakers_open: int = 0
    counts: Counter = field(default_factory=Counter)  # (table, op) -> events
    skipped: Counter = field(default_factory=Counter)  # decoder skip reason -> records
    seconds: float = 0.0
    stop_reason: str = STOP_END
    checkpoint_candidates: tuple[Checkpoint, ...] = ()
    handlers: dict[str, HandlerMetrics] = field(default_factory=dict)  # by handler name
    # The longest the run waited on Kafka at once: for records below its end offset
    # (consecutive empty fetches), its end offset, or a commit. A frozen broker shows here.
    kafka_wait_seconds: float = 0.0
    # The source lineage the partition stands in at the end, and the lineages the run
    # raised or learned more of (`consume/lineage.py`), described.
    lineage: int = 1
    lineages_raised: list[str] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def per_table(self) -> dict[str, int]:
        out: Counter = Counter()
        for (table, _op), n in self.counts.items():
            out[table] += n
        return dict(out)

    def per_op(self) -> dict[str, int]:
        out: Counter = Counter()
        for (_table, op), n in self.counts.items():
            out[op] += n
        return dict(out)
