"""The source lineages and partition tails the changelog keeps (`lakehouse/lineage_log.py`),
on a local lakehouse without Kafka or Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from lake_events import GROUP, Partition, Source, row

from binlog_assets.config import parse_config
from binlog_assets.consume.lineage import FAILOVER, LineageRaced, LineageRecord, Placer
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.changelog_rows import CHANGELOG_COLUMNS

RECORD = LineageRecord(2, FAILOVER, 1, 1914, first_seq=8, domain="0", server_id=2,
                       start_seq=8, ts=5, previous_server_id=1, seen="t[0]@3")


def _pipeline(tmp_path: Path):
    return parse_config({"lakehouse": {"path": str(tmp_path / "lake"), "database": "lin"}})


def test_a_raise_is_a_property_and_a_transaction_and_the_second_of_two_raises_fails(
        tmp_path: Path) -> None:
    from deltalake import DeltaTable

    pipeline = _pipeline(tmp_path)
    first, second = ChangelogWriter(pipeline), ChangelogWriter(pipeline)
    first.ensure_table()
    assert first.lineages("shop") == [] and second.lineages("shop") == []
    assert first.raise_lineage("shop", RECORD, 0) == [RECORD]
    with pytest.raises(LineageRaced):
        second.raise_lineage("shop", LineageRecord(2, FAILOVER, 1, 2000), 0)
    assert second.lineages("shop") == [RECORD]
    assert second.lineages("other") == []
    table = DeltaTable(first.uri)
    assert table.transaction_version("binlake.lineage/shop") == 2
    doc = table.history(1)[0]["userMetadata"]
    assert '"survey":[]' in doc and '"lineage"' in doc  # replica planning skips it


def test_an_append_meeting_a_raise_is_written_again(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path)
    writer, raiser = ChangelogWriter(pipeline), ChangelogWriter(pipeline)
    part, src = Partition(writer), Source("shop.orders")
    part.write(part.records([[src.insert(row(1))]]))
    # The raise lands after the writer last read the table, before its next commit.
    writer._open()
    original = writer._open

    def open_then_raise():
        table = original()
        if not raiser.lineages("shop"):
            raiser.raise_lineage("shop", RECORD, 0)
        return table

    writer._open = open_then_raise
    assert part.write(part.records([[src.insert(row(2))]])) is not None
    assert writer.checkpoint(GROUP, part.topic, part.partition) == part.end
    assert writer.lineages("shop") == [RECORD]


def test_each_write_moves_the_partitions_tail_to_its_furthest_change(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path)
    writer = ChangelogWriter(pipeline)
    part, src = Partition(writer), Source("shop.orders")
    events = part.records([[src.insert(row(1))], [src.insert(row(2))]])
    for e in events:
        e.server_id, e.gtid = 7, f"0-7-{e.position.pos}"
    part.write(events)
    last = events[-1].position
    tail = writer.tail(GROUP, part.topic, part.partition)
    assert (tail.lineage, tail.file, tail.pos) == (1, last.file, last.pos)
    assert (tail.server_id, tail.gtid_text) == (7, f"0-7-{last.pos}")  # this process's
    # Another process reads the position from the log and the rest from the tail's row.
    fresh = ChangelogWriter(pipeline)
    stored = fresh.tail(GROUP, part.topic, part.partition)
    assert (stored.coordinates, stored.server_id, stored.gtid_text) == (
        tail.coordinates, 7, None)
    origin = fresh.tail_origin(part.topic, part.partition, stored)
    assert (origin.server_id, origin.gtid_text, origin.ts) == (7, f"0-7-{last.pos}",
                                                               events[-1].source_ts)
    # A copy below the tail (a change read again) does not move it back.
    copy = part.records([[src.insert(row(1))]])
    copy[0].position = events[0].position
    part.write(copy)
    assert fresh.tail(GROUP, part.topic, part.partition).coordinates == tail.coordinates
    # A later lineage does, whatever its coordinates.
    later = part.records([[src.insert(row(3))]])
    later[0].position = later[0].position._replace(lineage=2, file=1, pos=4)
    part.write(later)
    assert ChangelogWriter(pipeline).tail(GROUP, part.topic, part.partition).lineage == 2


def _one_change_of_server_1(tmp_path: Path):
    """A partition whose one change server 1 wrote, and a later run's writer (another
    process) with the tail it reads."""
    pipeline = _pipeline(tmp_path)
    part, src = Partition(ChangelogWriter(pipeline)), Source("shop.orders")
    events = part.records([[src.insert(row(1))]])
    events[0].server_id, events[0].gtid = 1, "0-1-7"
    part.write(events)
    other = ChangelogWriter(pipeline)
    return pipeline, part, src, other, other.tail(GROUP, part.topic, part.partition)


def test_a_run_places_its_partition_from_the_stored_tail(tmp_path: Path) -> None:
    # A later run meets a change of another server at lower coordinates with a newer
    # GTID: a failover, raised in the changelog.
    pipeline, part, src, other, tail = _one_change_of_server_1(tmp_path)
    placer = Placer(other.book("shop"), "t[0]", tail,
                    lambda: other.tail_origin(part.topic, part.partition, tail))
    [after] = part.records([[src.insert(row(2))]])
    after.position = after.position._replace(file=1, pos=10)
    after.server_id, after.gtid = 2, "0-2-8"
    placer.place(after)
    assert after.position.lineage == 2
    assert [r.number for r in ChangelogWriter(pipeline).lineages("shop")] == [2]


def test_a_changelog_made_before_the_origin_columns_gets_them(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    pipeline = _pipeline(tmp_path)
    writer = ChangelogWriter(pipeline)
    old = [(n, t) for n, t in CHANGELOG_COLUMNS if n not in ("server_id", "gtid")]
    types = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(),
             "binary": pa.binary(), "array<string>": pa.list_(pa.string()),
             "timestamp": pa.timestamp("us", tz="UTC")}
    schema = pa.schema([pa.field(n, types[t]) for n, t in old])
    write_deltalake(writer.uri, schema.empty_table(), configuration={"delta.appendOnly": "true"})
    part, src = Partition(writer), Source("shop.orders")
    part.write(part.records([[src.insert(row(1))]]))
    names = DeltaTable(writer.uri).schema().to_arrow().names
    assert names[-2:] == ["server_id", "gtid"]


def test_a_run_places_a_change_its_tails_server_wrote_further_on_without_its_row(
        tmp_path: Path) -> None:
    # The tail's server id rides in the log: the run's first change, of the same server
    # further on, is placed at once; another server's looks the tail's row up.
    _, part, src, other, tail = _one_change_of_server_1(tmp_path)
    looked: list[int] = []

    def origin():
        looked.append(1)
        return other.tail_origin(part.topic, part.partition, tail)

    placer = Placer(other.book("shop"), "t[0]", tail, origin)
    [same] = part.records([[src.insert(row(2))]])
    same.server_id, same.gtid = 1, "0-1-8"
    placer.place(same)
    assert (same.position.lineage, looked) == (1, [])
    [snapshot_read] = part.records([[src.insert(row(3))]])
    snapshot_read.server_id = 0
    placer.place(snapshot_read)
    assert looked == [1]


def test_a_run_that_moved_the_tail_it_read_still_commits_it(tmp_path: Path) -> None:
    # The placer moves the tail it was given in place: the commit compares against the
    # tail as read, not that one.
    pipeline = _pipeline(tmp_path)
    writer = ChangelogWriter(pipeline)
    part, src = Partition(writer), Source("shop.orders")
    part.write(part.records([[src.insert(row(1))]]))
    run = ChangelogWriter(pipeline)
    tail = run.tail(GROUP, part.topic, part.partition)
    events = part.records([[src.insert(row(2))]])
    tail.file, tail.pos = events[0].position.file, events[0].position.pos
    part.writer = run
    part.write(events)
    stored = ChangelogWriter(pipeline).tail(GROUP, part.topic, part.partition)
    assert stored.coordinates == (events[0].position.file, events[0].position.pos)


@pytest.mark.parametrize("parts", [(1, 1, 4, None), (2, 999_999, 2**32 - 1, 0),
                                   (7, 2**31 - 1, 0, 2**32 - 1)])
def test_a_tail_round_trips_through_its_two_transactions(parts: tuple) -> None:
    from binlog_assets.lakehouse.transactions import tail_parts, tail_versions

    versions = tail_versions(*parts)
    assert all(0 <= v < 2**63 for v in versions)
    assert tail_parts(*versions) == parts


def test_a_tail_part_out_of_range_is_named() -> None:
    from binlog_assets.lakehouse.transactions import tail_versions

    with pytest.raises(ValueError, match="binlog position 4294967296"):
        tail_versions(1, 1, 2**32, None)
