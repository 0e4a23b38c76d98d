"""The fence on a local lakehouse, without Kafka: a sink writes while the partition's
changelog checkpoint is where its run left it, and refuses once another run moved it."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from lake_events import Partition, Source, row

from binlog_assets.config import parse_config
from binlog_assets.lakehouse.changelog import (
    ChangelogWriter,
    ConcurrentPartitionWrite,
    PartitionWrite,
)
from binlog_assets.lakehouse.changelog_rows import (
    SURVEY_MAX_GROUPS,
    event_row,
    survey_of_rows,
)
from binlog_assets.lakehouse.fence import FencedChangelogSink, FencedRunError, write_together


def test_a_sink_stops_writing_once_another_run_moved_its_checkpoint(tmp_path: Path) -> None:
    pipeline = parse_config({"lakehouse": {"path": str(tmp_path / "lake"), "database": "fence"}})
    writer, other = ChangelogWriter(pipeline), ChangelogWriter(pipeline)
    part, src = Partition(writer), Source("shop.orders")
    sink = FencedChangelogSink(writer, group="g", topic=part.topic, partition=part.partition,
                               expected=None, lakehouse=pipeline.lakehouse.path)
    events = part.records([[src.insert(row(i))] for i in range(3)])
    sink(events, {}, part.end)
    assert (sink.rows, sink.expected) == (3, 3)
    assert writer.checkpoint("g", part.topic, part.partition) == 3

    # Another run (its own writer, as in another process) writes the partition on.
    later = part.records([[src.insert(row(9))]])
    assert other.write(PartitionWrite(later, None, group_id="g", topic=part.topic,
                                      partition=part.partition, end_offset=part.end)
                       ) is not None
    more = part.records([[src.insert(row(10))]])
    with pytest.raises(FencedRunError, match="overtaken: its changelog checkpoint is 4, "
                                             "this run expected 3"):
        sink(more, {}, part.end)
    assert (sink.rows, sink.expected) == (3, 3)
    assert writer.checkpoint("g", part.topic, part.partition) == 4


def _sinks(writer: ChangelogWriter, pipeline, partitions: int
           ) -> list[tuple[Partition, FencedChangelogSink]]:
    parts = [Partition(writer, p) for p in range(partitions)]
    return [(part, FencedChangelogSink(writer, group="g", topic=part.topic,
                                       partition=part.partition, expected=None,
                                       lakehouse=pipeline.lakehouse.path)) for part in parts]


def test_sinks_written_together_share_one_commit_and_a_fenced_one_leaves_the_rest(
        tmp_path: Path) -> None:
    from deltalake import DeltaTable

    pipeline = parse_config({"lakehouse": {"path": str(tmp_path / "lake"), "database": "fence"}})
    writer, other = ChangelogWriter(pipeline), ChangelogWriter(pipeline)
    src = Source("shop.orders")
    sinks = _sinks(writer, pipeline, 3)
    ranges = [(sink, part.records([[src.insert(row(10 * p + i))] for i in range(p + 1)]),
               {}, part.end) for p, (part, sink) in enumerate(sinks)]
    assert write_together(ranges) == [None, None, None]
    version = DeltaTable(writer.uri).version()
    # One commit carries each partition's rows and its own transaction.
    assert writer.checkpoints("g", [("binlog", p) for p in range(3)]) == {
        ("binlog", 0): 1, ("binlog", 1): 2, ("binlog", 2): 3}
    assert [(s.rows, s.expected, s.version) for _, s in sinks] == [
        (1, 1, version), (2, 2, version), (3, 3, version)]
    assert len(DeltaTable(writer.uri).to_pyarrow_table()) == 6

    # Another run (its own writer) moves partition 1 on: only that sink is fenced.
    (p1, _) = sinks[1]
    assert other.write(PartitionWrite(p1.records([[src.insert(row(99))]]), None,
                                      group_id="g", topic=p1.topic, partition=1,
                                      end_offset=p1.end)) is not None
    ranges = [(sink, part.records([[src.insert(row(50 + p))]]), {}, part.end)
              for p, (part, sink) in enumerate(sinks)]
    errors = write_together(ranges)
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], FencedRunError)
    assert "overtaken: its changelog checkpoint is 3, this run expected 2" in str(errors[1])
    assert writer.checkpoints("g", [("binlog", p) for p in range(3)]) == {
        ("binlog", 0): 2, ("binlog", 1): 3, ("binlog", 2): 4}
    assert [(s.rows, s.expected) for _, s in sinks] == [(2, 2), (2, 2), (4, 4)]
    assert DeltaTable(writer.uri).version() == version + 2  # the other run's, then ours


def test_a_commit_that_conflicts_is_tried_again_with_each_range_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = parse_config({"lakehouse": {"path": str(tmp_path / "lake"), "database": "fence"}})
    writer, other = ChangelogWriter(pipeline), ChangelogWriter(pipeline)
    src = Source("shop.orders")
    sinks = _sinks(writer, pipeline, 2)
    ranges = [(sink, part.records([[src.insert(row(p))]]), {}, part.end)
              for p, (part, sink) in enumerate(sinks)]
    real = writer.write_many
    calls = []

    def racing(parts):
        calls.append(len(parts))
        if len(calls) == 1:
            # Another run took partition 0's transaction while this commit was made.
            (p0, _) = sinks[0]
            other.write(PartitionWrite(p0.records([[src.insert(row(7))]]), None,
                                       group_id="g", topic=p0.topic, partition=0,
                                       end_offset=p0.end))
            raise ConcurrentPartitionWrite("binlog[0], binlog[1]: another run committed")
        return real(parts)

    monkeypatch.setattr(writer, "write_many", racing)
    errors = write_together(ranges)
    assert calls == [2, 2]
    assert isinstance(errors[0], FencedRunError) and errors[1] is None
    assert writer.checkpoints("g", [("binlog", 0), ("binlog", 1)]) == {
        ("binlog", 0): 2, ("binlog", 1): 1}
    assert [(s.rows, s.expected) for _, s in sinks] == [(0, None), (1, 1)]


def test_a_commit_of_many_partitions_keeps_a_survey_as_large_as_theirs() -> None:
    now = datetime.now()
    rows = [event_row(Source(f"shop.t{i}").insert(row(i)), None, now)
            for i in range(2 * SURVEY_MAX_GROUPS)]
    assert survey_of_rows(rows) is None
    assert len(survey_of_rows(rows, 2 * SURVEY_MAX_GROUPS)) == 2 * SURVEY_MAX_GROUPS
