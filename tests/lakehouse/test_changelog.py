"""The bronze changelog on real Delta: rows as written, idempotent retries, checkpoints."""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime
from decimal import Decimal

import orjson
import pytest
from changelog_reads import changelog_checkpoint, changelog_frame
from lake_events import GROUP, MakeConfig, Partition, Source, row

from binlog_assets.formats.event import ChangeEvent, Position
from binlog_assets.lakehouse.changelog import ChangelogWriter, PartitionWrite
from binlog_assets.lakehouse.changelog_reader import (
    SurveyGroup,
    changelog_schema,
    changelog_version,
    read_changelog,
    read_survey,
    register_changelog,
    survey_of_frame,
)
from binlog_assets.lakehouse.changelog_rows import (
    SURVEY_MAX_BYTES,
    SURVEY_MAX_GROUPS,
    commit_metadata,
    event_row,
    source_times,
    survey_of_rows,
    to_json,
)

TABLES = [{"source": "shop.orders", "replica": "orders"}]


def test_to_json_keeps_types_recoverable() -> None:
    text = to_json({"d": Decimal("12345678901234567890.123456789"), "b": b"\x00\xff",
                    "day": date(2024, 2, 29), "at": datetime(2024, 2, 29, 1, 2, 3, 4)})
    assert orjson.loads(text) == {"d": "12345678901234567890.123456789", "b": "AP8=",
                                  "day": "2024-02-29", "at": "2024-02-29T01:02:03.000004"}
    assert to_json(None) is None


def test_decimals_are_written_in_plain_digits() -> None:
    values = [Decimal("1E-7"), Decimal("1.20E+3"), Decimal("-0.00"),
              Decimal("123456789012345678.91")]
    assert to_json(values) == '["0.0000001","1200","-0.00","123456789012345678.91"]'


def test_write_appends_every_field_once(spark, make_config: MakeConfig) -> None:
    pipeline = make_config(TABLES)
    part = Partition(ChangelogWriter(pipeline))
    src = Source("shop.orders")
    # A Maxwell-like event: no declared types, so the writer records the values' types.
    untyped = ChangeEvent("shop.orders", "c", (7,), ("id",), None,
                          {"id": 7, "when": datetime(2024, 1, 2, 3, 4, 5), "ok": True},
                          Position(1, 3, 4, 0), None)
    events = part.records([[src.insert(row(1, "2.50", "a", 3))], [untyped]])

    assert changelog_checkpoint(pipeline, GROUP, "binlog", 0) is None
    version = part.write(events)
    assert version == changelog_version(spark, pipeline)
    assert changelog_checkpoint(pipeline, GROUP, "binlog", 0) == 2

    rows = changelog_frame(spark, pipeline).orderBy("offset").collect()
    assert [r["offset"] for r in rows] == [0, 1]
    first, second = rows
    assert (first["topic"], first["partition"], first["row_index"]) == ("binlog", 0, 0)
    assert (first["table"], first["op"]) == ("shop.orders", "c")
    assert orjson.loads(first["key"]) == {"id": 1}
    assert first["key_columns"] == ["id"]
    assert first["before"] is None
    assert orjson.loads(first["after"]) == {"id": 1, "amount": "2.50", "note": "a", "qty": 3}
    assert (first["pos_phase"], first["pos_file"], first["pos_pos"]) == (1, 9, 96)
    assert orjson.loads(first["column_types"])["amount"] == "decimal(10,2)"
    assert first["value_types"] is None
    assert first["raw"] == b"raw-0"
    assert second["column_types"] is None
    assert orjson.loads(second["value_types"]) == {"id": "bigint", "when": "timestamp",
                                                    "ok": "boolean"}
    assert second["source_ts"] is None


def test_retried_and_overlapping_writes_add_nothing_twice(spark, make_config: MakeConfig
                                                          ) -> None:
    pipeline = make_config(TABLES)
    part = Partition(ChangelogWriter(pipeline))
    src = Source("shop.orders")
    events = part.records([[src.insert(row(i))] for i in range(8)])

    first = part.write(events[:5], end_offset=5)
    assert first is not None
    # The same range again (a retry after a crash before the Kafka commit): skipped.
    assert part.write(events[:5], end_offset=5) is None
    assert part.write(events[:3], end_offset=3) is None
    assert changelog_version(spark, pipeline) == first
    # A range overlapping the written one: only offsets from the checkpoint on land.
    second = part.write(events, end_offset=8)
    assert second == first + 1
    offsets = [r["offset"] for r in changelog_frame(spark, pipeline).select("offset").collect()]
    assert sorted(offsets) == list(range(8))
    assert changelog_checkpoint(pipeline, GROUP, "binlog", 0) == 8


def test_empty_range_still_moves_the_checkpoint(spark, make_config: MakeConfig) -> None:
    pipeline = make_config(TABLES)
    part = Partition(ChangelogWriter(pipeline))
    events = part.records([[Source("shop.orders").insert(row(1))]])
    part.write(events, end_offset=1)
    assert register_changelog(spark, pipeline)
    name = f"{pipeline.lakehouse.database}.changelog"
    files = spark.sql(f"DESCRIBE DETAIL {name}").first()["numFiles"]
    # Offsets 1..9 held no change (transaction markers, skipped records).
    version = part.write([], end_offset=10)
    assert version is not None
    assert changelog_checkpoint(pipeline, GROUP, "binlog", 0) == 10
    assert changelog_frame(spark, pipeline).count() == 1
    assert spark.sql(f"DESCRIBE DETAIL {name}").first()["numFiles"] == files
    assert part.write([], end_offset=10) is None


def test_partitions_and_groups_keep_their_own_checkpoints(spark, make_config: MakeConfig
                                                          ) -> None:
    pipeline = make_config(TABLES)
    writer = ChangelogWriter(pipeline)
    p0, p1 = Partition(writer, 0), Partition(writer, 1)
    src = Source("shop.orders")
    p0.write(p0.records([[src.insert(row(1))], [src.insert(row(2))]]))
    p1.write(p1.records([[src.insert(row(3))]]))
    assert changelog_checkpoint(pipeline, GROUP, "binlog", 0) == 2
    assert changelog_checkpoint(pipeline, GROUP, "binlog", 1) == 1
    assert changelog_checkpoint(pipeline, "other-group", "binlog", 0) is None


def test_write_refuses_events_outside_its_range(spark, make_config: MakeConfig) -> None:
    pipeline = make_config(TABLES)
    part = Partition(ChangelogWriter(pipeline))
    events = part.records([[Source("shop.orders").insert(row(1))]])
    with pytest.raises(ValueError, match="not below end_offset"):
        part.write(events, end_offset=0)
    with pytest.raises(ValueError, match=r"binlog\[0\] in a write for binlog\[3\]"):
        ChangelogWriter(pipeline).write(PartitionWrite(events, None, group_id=GROUP,
                                                       topic="binlog", partition=3,
                                                       end_offset=5))


def _groups(survey: list[list]) -> list[tuple]:
    return sorted(((*g[:4], tuple(g[4]), g[5], tuple(g[6]), *g[7:]) for g in survey),
                  key=repr)


def test_each_commit_carries_the_survey_a_scan_of_its_rows_gives(spark, make_config: MakeConfig
                                                                 ) -> None:
    pipeline = make_config(TABLES)
    part = Partition(ChangelogWriter(pipeline))
    orders, items = Source("shop.orders"), Source("shop.items")
    untyped = ChangeEvent("shop.orders", "c", (9,), ("id",), None, {"id": 9, "ok": True},
                          Position(1, 3, 4, 0), None)
    events = part.records([
        [orders.snapshot(row(1))], [orders.insert(row(2))],
        orders.update(row(2), row(2, "3.00")), orders.update(row(2, "3.00"), row(4, "3.00")),
        [orders.delete(row(1))], [items.insert(row(5))], [orders.truncate()],
        [orders.ddl({"id": "bigint", "extra": "int"})], [orders.insert(row(6))], [untyped],
    ])
    first = part.write(events[:6], end_offset=5)
    second = part.write(events[6:])
    assert first is not None and second == first + 1

    got = read_survey(spark, pipeline, first - 1, second)
    scanned = survey_of_frame(read_changelog(spark, pipeline, first - 1, second))
    assert _groups(got) == _groups(scanned)
    # Groups span commits: the orders inserts of both commits (declared types changed by
    # the DDL in between, so two groups) and one for the untyped insert.
    inserts = [g for g in _groups(got) if g[:2] == ("shop.orders", "c")]
    assert sorted(g[5] for g in inserts) == [1, 1, 2]
    rows = [event_row(e, None, datetime.now()) for e in events[6:]]
    times = source_times(rows)
    assert read_survey(spark, pipeline, second - 1, second) == [
        SurveyGroup(*g, times.get(g[0])) for g in survey_of_rows(rows)]
    # Each table's latest source time, the untyped insert's (no time) left out.
    assert {g.table: g.source_ts for g in got} == {
        table: max(e.source_ts for e in events if e.table == table and e.source_ts)
        for table in ("shop.orders", "shop.items")}


def test_a_range_reads_what_its_commits_added_as_parquet_files(spark, make_config: MakeConfig
                                                                ) -> None:
    pipeline = make_config(TABLES)
    part = Partition(ChangelogWriter(pipeline))
    src = Source("shop.orders")
    events = part.records([[src.insert(row(i))] for i in range(6)]
                          + [src.update(row(2), row(7, "4.00"))])  # delete + create
    first = part.write(events[:2], end_offset=2)
    second = part.write(events[2:4], end_offset=4)
    third = part.write(events[4:])
    assert (second, third) == (first + 1, first + 2)
    name = f"{pipeline.lakehouse.database}.changelog"

    def rows(frame) -> list:
        return sorted(tuple(r) for r in frame.collect())

    for after, up_to in ((first, second), (first, third), (second, third), (first - 1, first)):
        got = read_changelog(spark, pipeline, after, up_to)
        feed = (spark.read.format("delta").option("readChangeFeed", "true")
                .option("startingVersion", after + 1).option("endingVersion", up_to)
                .table(name).drop("_change_type", "_commit_version", "_commit_timestamp"))
        assert got.schema == feed.schema
        assert rows(got) == rows(feed)
    assert sorted(r["offset"] for r in read_changelog(spark, pipeline, first, third).collect()) \
        == [2, 3, 4, 5, 6, 6]
    # Scanned as Parquet (columnar), not through the feed relation's conversion to Rows.
    plan = read_changelog(spark, pipeline, first, third)._jdf.queryExecution() \
        .executedPlan().toString()
    assert "FileScan parquet" in plan and "DeltaCDFRelation" not in plan


def test_a_range_with_a_commit_without_survey_is_scanned(spark, make_config: MakeConfig
                                                         ) -> None:
    pipeline = make_config(TABLES)
    part = Partition(ChangelogWriter(pipeline))
    src = Source("shop.orders")
    first = part.write(part.records([[src.insert(row(1))]]))
    # Appended by something other than ChangelogWriter (Spark): no survey in its metadata.
    assert register_changelog(spark, pipeline)
    other = replace(Source("shop.other").insert(row(1)), topic="elsewhere")
    (spark.createDataFrame([event_row(other, None, datetime.now())], changelog_schema())
     .write.format("delta").mode("append")
     .saveAsTable(f"{pipeline.lakehouse.database}.changelog"))
    third = part.write(part.records([[src.insert(row(2))]]))
    assert third == first + 2

    assert read_survey(spark, pipeline, first - 1, first) is not None
    assert read_survey(spark, pipeline, first - 1, third) is None
    assert read_survey(spark, pipeline, first + 1, third) is not None
    # From the table's creation on (a first apply reads the whole table).
    whole = read_survey(spark, pipeline, None, first)
    assert _groups(whole) == _groups(survey_of_frame(read_changelog(spark, pipeline, None,
                                                                    first)))
    assert read_survey(spark, pipeline, None, third) is None


def test_a_commit_with_too_many_groups_carries_no_survey() -> None:
    now = datetime.now()
    rows = [event_row(Source(f"shop.t{i}").insert(row(i)), None, now)
            for i in range(SURVEY_MAX_GROUPS + 1)]
    assert survey_of_rows(rows[:-1]) is not None
    assert survey_of_rows(rows) is None


def test_a_survey_too_large_for_the_log_is_left_out() -> None:
    now = datetime.now()
    wide = Source("shop.wide", types={f"column_{i}": "bigint" for i in range(4000)})
    small = survey_of_rows([event_row(Source("shop.orders").insert(row(1)), None, now)])
    large = survey_of_rows([event_row(wide.insert({"id": 1}), None, now)])
    assert orjson.loads(commit_metadata("t", small)) == {"tag": "t", "survey": small}
    assert len(orjson.dumps(large)) > SURVEY_MAX_BYTES
    assert orjson.loads(commit_metadata("t", large)) == {"tag": "t"}
    assert orjson.loads(commit_metadata("t", None)) == {"tag": "t"}


def test_type_map_texts_follow_each_map_past_the_memo_bound() -> None:
    """The JSON text of declared and inferred type maps is remembered; each map still
    gets its own text, also once the memo has been cleared and maps' ids are reused."""
    from binlog_assets.lakehouse import changelog_rows

    for i in range(2500):
        declared = {"id": "int", f"c{i}": "string"}
        assert orjson.loads(changelog_rows._declared_json(declared)) == declared
        event = replace(Source("shop.orders").insert({"id": i, f"v{i % 1100}": "x"}),
                        column_types=None)
        assert orjson.loads(changelog_rows._value_types(event)) == {"id": "bigint",
                                                               f"v{i % 1100}": "string"}


def test_a_writer_kept_open_opens_the_table_anew_every_so_many_versions(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower keeps one writer for its rounds; delta-rs's update kept every commit's
    state since the open (the follower's RSS grew with each commit). The writer opens the
    table anew once REOPEN_VERSIONS versions passed since it opened it."""
    from binlog_assets.config import parse_config
    from binlog_assets.lakehouse import changelog

    monkeypatch.setattr(changelog, "REOPEN_VERSIONS", 3)
    pipeline = parse_config({"lakehouse": {"path": str(tmp_path / "lake")},
                             "sources": [{"name": "src", "topics": ["binlog"],
                                          "tables": TABLES}]})
    writer = ChangelogWriter(pipeline)
    part, src = Partition(writer), Source("shop.orders")
    tables, versions = [], []
    for i in range(7):
        versions.append(part.write(part.records([[src.insert(row(i))]])))
        tables.append(writer._table)  # kept: no id is reused
    assert versions == list(range(1, 8))
    # Opened at version 0 for the first write, anew at 3 and at 6.
    assert [next(i for i, u in enumerate(tables) if u is t) for t in tables
            ] == [0, 0, 0, 3, 3, 3, 6]
    assert writer.checkpoint(GROUP, "binlog", 0) == 7
