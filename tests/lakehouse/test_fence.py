"""The fence on a local lakehouse, without Kafka: a sink writes while the partition's
changelog checkpoint is where its run left it, and refuses once another run moved it."""

from __future__ import annotations

from pathlib import Path

import pytest
from lake_events import Partition, Source, row

from binlog_assets.config import parse_config
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.fence import FencedChangelogSink, FencedRunError


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
    assert other.write(later, None, group_id="g", topic=part.topic,
                       partition=part.partition, end_offset=part.end) is not None
    more = part.records([[src.insert(row(10))]])
    with pytest.raises(FencedRunError, match="overtaken: its changelog checkpoint is 4, "
                                             "this run expected 3"):
        sink(more, {}, part.end)
    assert (sink.rows, sink.expected) == (3, 3)
    assert writer.checkpoint("g", part.topic, part.partition) == 4
