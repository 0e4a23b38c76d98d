"""Test helpers: ChangeEvents as a Debezium decoder would make them, and a Kafka stand-in.

`Source` plays a MySQL table: each statement gets the next binlog position (numbers
that cross digit boundaries, so a string comparison would misorder them) and yields the
events a decoder produces, typed like Debezium's schema block. `Partition` plays one
Kafka topic-partition: it gives each record the next offset and writes ranges to the
changelog through the real `ChangelogWriter`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.formats.event import SNAPSHOT_ROW, ChangeEvent, Position
from binlog_assets.lakehouse.changelog import ChangelogWriter, PartitionWrite
from binlog_assets.lakehouse.delta_log import open_log, table_location

TOPIC = "binlog"
GROUP = "test-group"
TYPES = {"id": "bigint", "amount": "decimal(10,2)", "note": "string", "qty": "int"}

MakeConfig = Callable[..., PipelineConfig]


def row(id_: int, amount: str = "1.00", note: str = "n", qty: int = 1) -> dict[str, Any]:
    return {"id": id_, "amount": Decimal(amount), "note": note, "qty": qty}


@dataclass
class Source:
    """A source table; `file`/`pos` is its binlog cursor."""

    table: str
    types: dict[str, str] = field(default_factory=lambda: dict(TYPES))
    key_columns: tuple[str, ...] = ("id",)
    file: int = 9
    pos: int = 95

    def _next(self, step: int = 1, rotate: bool = False) -> Position:
        if rotate:
            self.file, self.pos = self.file + 1, 4
        else:
            self.pos += step
        return Position(1, self.file, self.pos, 0)

    def _event(self, op: str, key_row: dict[str, Any], before, after, position: Position,
               ts: int | None = None) -> ChangeEvent:
        key = tuple(key_row[k] for k in self.key_columns)
        return ChangeEvent(self.table, op, key, self.key_columns, before, after, position,
                           ts if ts is not None else 1_700_000_000_000 + position.pos,
                           column_types=self.types)

    def snapshot(self, after: dict[str, Any]) -> ChangeEvent:
        # A snapshot read counts at the binlog position the snapshot was taken at (where
        # the source's binlog stands now), just below what streams from there.
        return self._event("r", after, None, after,
                           Position(1, self.file, self.pos, SNAPSHOT_ROW))

    def insert(self, after: dict[str, Any], **step: Any) -> ChangeEvent:
        return self._event("c", after, None, after, self._next(**step))

    def update(self, before: dict[str, Any], after: dict[str, Any], **step: Any
               ) -> list[ChangeEvent]:
        """An update; one that moves the key is split into delete + create, as decoders do."""
        position = self._next(**step)
        event = self._event("u", after, before, after, position)
        if all(before[k] == after[k] for k in self.key_columns):
            return [event]
        return [self._event("d", before, before, None, position),
                self._event("c", after, None, after, position)]

    def delete(self, before: dict[str, Any], **step: Any) -> ChangeEvent:
        return self._event("d", before, before, None, self._next(**step))

    def truncate(self, **step: Any) -> ChangeEvent:
        return ChangeEvent(self.table, "t", (), (), None, None, self._next(**step),
                           1_700_000_000_000, column_types=None)

    def ddl(self, types: dict[str, str], **step: Any) -> ChangeEvent:
        self.types = dict(types)
        return ChangeEvent(self.table, "ddl", (), self.key_columns, None, None,
                           self._next(**step), 1_700_000_000_000, ddl="ALTER TABLE ...",
                           column_types=self.types)


# `lakehouse.rewrite_ratio` values that force each way of applying a batch to a replica
# that has rows: MERGE, or the one-pass rewrite.
ALWAYS_MERGE = 1e12
ALWAYS_REWRITE = 0.0

# `lakehouse` settings that force each way a batch reaches a replica that has rows:
# delta-rs's MERGE from the driver (`replica/arrow_commit.py`), Spark's MERGE, Spark's rewrite.
APPLY_PATHS = {
    "driver": {"rewrite_ratio": ALWAYS_MERGE},
    "spark_merge": {"rewrite_ratio": ALWAYS_MERGE, "arrow_commit_rows": 0},
    "rewrite": {"rewrite_ratio": ALWAYS_REWRITE, "arrow_commit_rows": 0},
}


def config_for(base: PipelineConfig, tables: list[dict[str, Any]], *,
               retention_hours: float | None = None,
               rewrite_ratio: float | None = None,
               arrow_commit_rows: int | None = None,
               table_features: list[str] | None = None,
               dagster: dict[str, Any] | None = None) -> PipelineConfig:
    """`base` with a new database and one source whose table configs are `tables`
    (and `dagster` settings on top of the base's)."""
    data = base.model_dump(mode="json", exclude_none=True)
    data["dagster"] = {**data.get("dagster", {}), **(dagster or {})}
    data["lakehouse"]["database"] = f"lake_{uuid.uuid4().hex[:10]}"
    if retention_hours is not None:
        data["lakehouse"]["tombstone_retention_hours"] = retention_hours
    if rewrite_ratio is not None:
        data["lakehouse"]["rewrite_ratio"] = rewrite_ratio
    if arrow_commit_rows is not None:
        data["lakehouse"]["arrow_commit_rows"] = arrow_commit_rows
    if table_features is not None:
        data["lakehouse"]["table_features"] = table_features
    data["sources"] = [{"name": "src", "topics": ["binlog"], "format": "debezium",
                        "tables": tables}]
    return parse_config(data)


class Partition:
    """One Kafka topic-partition in front of the changelog."""

    def __init__(self, writer: ChangelogWriter, partition: int = 0, topic: str = TOPIC
                 ) -> None:
        self.writer = writer
        self.topic = topic
        self.partition = partition
        self.end = 0

    def records(self, records: Sequence[Sequence[ChangeEvent]]) -> list[ChangeEvent]:
        """Give each record (the events decoded from one Kafka message) the next offset."""
        out = []
        for events in records:
            for index, event in enumerate(events):
                out.append(replace(event, topic=self.topic, partition=self.partition,
                                   offset=self.end, row_index=index))
            self.end += 1
        return out

    def write(self, events: Sequence[ChangeEvent], end_offset: int | None = None
              ) -> int | None:
        raw = {e.offset: f"raw-{e.offset}".encode() for e in events}
        return self.writer.write(PartitionWrite(
            events, raw, group_id=GROUP, topic=self.topic, partition=self.partition,
            end_offset=self.end if end_offset is None else end_offset))


def execute_job(job, pipeline: PipelineConfig, tmp_path: Path):
    """Run `job` in process with `pipeline` (written as YAML under `tmp_path`) as its
    `binlake` resource, on an ephemeral instance; its result, which must be a success."""
    import dagster as dg
    import yaml

    from binlog_assets.orchestration.resources import BinlakeResource

    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    result = job.execute_in_process(
        resources={"binlake": BinlakeResource(config_path=str(path))},
        instance=dg.DagsterInstance.ephemeral())
    assert result.success
    return result


LIVE_OPS = ("c", "u", "r")  # the README's filter for readers outside Spark


def live_rows(spark, pipeline: PipelineConfig, replica: str) -> list[dict[str, Any]]:
    """The replica's live rows as a reader outside Spark gets them: delta-rs and the
    README's `_op` filter (a second of Spark per read cheaper than `_current`, whose
    equality with this read tests/lakehouse/test_delta_readers.py proves)."""
    location = table_location(spark, pipeline.lakehouse.database, replica)
    return [r for r in open_log(location).to_pyarrow_table().to_pylist()
            if r["_op"] in LIVE_OPS]


@contextmanager
def follower_beside(writer: Callable[[Any], None], config_path: str, seconds: float,
                    **execute: Any) -> Iterator[tuple[Any, Any]]:
    """(instance, result) of a `follow_replicas_job` run in process on a test instance
    with one `spark` slot, while `writer(instance)` runs in a thread; the writer ends the
    run by claiming the slot (the follower hands it over)."""
    import dagster as dg

    from binlog_assets.orchestration.replica_follower import follow_replicas_job
    from binlog_assets.orchestration.resources import BinlakeResource
    from binlog_assets.orchestration.shared import SPARK_POOL

    with dg.instance_for_test() as instance:
        instance.event_log_storage.set_concurrency_slots(SPARK_POOL, 1)
        thread = threading.Thread(target=writer, args=(instance,))
        thread.start()
        result = follow_replicas_job.execute_in_process(
            instance=instance, resources={"binlake": BinlakeResource(config_path=config_path)},
            run_config={"ops": {"follow_replicas": {"config": {"seconds": seconds}}}},
            **execute)
        thread.join()
        yield instance, result
