"""How far the changelog reached, read from its commits' surveys: no broker, no Spark."""

from __future__ import annotations

from pathlib import Path

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.formats.event import ChangeEvent, Position
from binlog_assets.lakehouse.changelog import ChangelogWriter, PartitionWrite
from binlog_assets.lakehouse.replica.routes import replica_route
from binlog_assets.parity.lake import reached_position
from binlog_assets.parity.progress import unapplied_commits


def test_the_reached_position_counts_only_commits_up_to_the_version(tmp_path: Path) -> None:
    """delta-rs numbers the history of a log loaded at a version from that version while
    listing the latest commits: read so, a later commit's position passed for an earlier
    version's, and the check compared a replica that had not applied it."""
    pipeline, versions = _changelog(tmp_path, [("s.db.t", "db.t", 100), ("s.db.u", "db.u", 200),
                                               ("s.db.t", "db.t", 300)])
    source = pipeline.sources[0]
    assert reached_position(pipeline, source, versions[0]) == (1, 4, 100)
    assert reached_position(pipeline, source, versions[1]) == (1, 4, 200)
    assert reached_position(pipeline, source, versions[2]) == (1, 4, 300)
    # Commits touching replica `t`: the first and the third.
    route = replica_route(pipeline, "t")
    assert unapplied_commits(pipeline, route, None, versions[1]) == [versions[0]]
    assert unapplied_commits(pipeline, route, versions[0], versions[2]) == [versions[2]]
    assert unapplied_commits(pipeline, route, versions[2], versions[2]) == []


def test_a_commit_without_a_survey_is_pending_only_for_the_replicas_of_its_rows(
        tmp_path: Path) -> None:
    """A property change or a delete by hand carries no survey: the builder surveys its
    rows, finds none of an idle replica's and leaves that replica's applied version where
    it was; counted as pending, it held a parity check's wait until it gave up."""
    from deltalake import DeltaTable

    from binlog_assets.lakehouse.changelog import changelog_uri
    from binlog_assets.lakehouse.delta_log import delta_rs_uri

    pipeline, versions = _changelog(tmp_path, [("s.db.t", "db.t", 100), ("s.db.u", "db.u", 101),
                                               ("s.db.u", "db.u", 102)])
    last = versions[-1]
    log = DeltaTable(delta_rs_uri(changelog_uri(pipeline)))
    log.alter.set_table_properties({"delta.appendOnly": "false"})
    log.delete("`table` = 'db.u' AND after LIKE '%1%'")  # rewrites nothing of db.t
    log = DeltaTable(delta_rs_uri(changelog_uri(pipeline)))
    end = log.version()
    assert end == last + 2
    assert unapplied_commits(pipeline, replica_route(pipeline, "t"), last, end) == []
    deleted = unapplied_commits(pipeline, replica_route(pipeline, "u"), last, end)
    import pyarrow as pa

    changed = set(pa.table(log.load_cdf(starting_version=end, ending_version=end,
                                        columns=["table"]).read_all()).column("table").to_pylist())
    assert deleted == ([end] if changed else [])
    assert changed <= {"db.u"}


def _changelog(tmp_path: Path, rows: list[tuple[str, str, int]]
               ) -> tuple[PipelineConfig, list[int]]:
    """A changelog of replicas t and u, one commit per (topic, table, binlog position)."""
    pipeline = parse_config({
        "kafka": {"group.id": "g"}, "lakehouse": {"path": str(tmp_path), "database": "d"},
        "sources": [{"name": "s", "topics": ["s.db.t", "s.db.u"],
                     "tables": [{"source": "db.t", "replica": "t"},
                                {"source": "db.u", "replica": "u"}]}]})
    writer = ChangelogWriter(pipeline)
    versions = []
    for offset, (topic, table, pos) in enumerate(rows):
        event = ChangeEvent(table=table, op="c", key=(offset,), key_columns=("id",),
                            before=None, after={"id": offset}, position=Position(1, 4, pos, 0),
                            source_ts=0, topic=topic, partition=0, offset=offset,
                            column_types={"id": "int"})
        versions.append(writer.write(PartitionWrite([event], None, group_id="g", topic=topic,
                                                    partition=0, end_offset=offset + 1)))
    return pipeline, versions
