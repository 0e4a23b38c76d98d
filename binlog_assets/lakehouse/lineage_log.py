"""The source lineages and partition tails the lineage rules read, kept in the changelog.

A source's lineages (`consume/lineage.py`) are a table property of the changelog,
`binlake.lineage.<source>` (JSON, one record per lineage), raised in a commit that also
moves the transaction `binlake.lineage/<source>` to the new number: Delta refuses the
second of two commits that change the table's metadata from the same version, so two
partitions that meet one failover at once raise it once, and the other reads it. The
commit adds no rows and carries an empty survey, so replica planning skips it.

A partition's tail (the furthest position it placed) rides in every commit of its rows
as two transactions beside its checkpoint (`transactions.tail_app_ids`): lineage and
server id, binlog file and position, read back in O(1) by the next run. The tail's GTID
and commit time are columns of its changelog row, looked up only when a rule needs them
(an event of another server).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from binlog_assets.consume.lineage import LineageRaced, LineageRecord, Mark
from binlog_assets.formats.event import SNAPSHOT_SCHEMA_ROW
from binlog_assets.lakehouse.transactions import (
    lineage_app_id,
    tail_app_ids,
    tail_parts,
    tail_versions,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable, Transaction

    from binlog_assets.formats.event import ChangeEvent, Position

LINEAGE_PROPERTY = "binlake.lineage.{source}"


def read_records(table: DeltaTable, source: str) -> list[LineageRecord]:
    """The lineages `source` has raised, in order, as the table's metadata holds them."""
    text = table.metadata().configuration.get(LINEAGE_PROPERTY.format(source=source))
    if not text:
        return []
    return sorted((LineageRecord.from_json(doc) for doc in json.loads(text)),
                  key=lambda r: r.number)


def commit_record(table: DeltaTable, source: str, record: LineageRecord, expected: int,
                  metadata: str) -> list[LineageRecord]:
    """Add `record` to the source's lineages (or replace the one of its number) in one
    commit, if they still number `expected`; raises LineageRaced when they do not or
    when another commit changed the table's metadata first."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError

    table.update_incremental()
    records = read_records(table, source)
    if len(records) != expected:
        raise LineageRaced(f"{source}: {len(records)} lineages recorded, {expected} expected")
    records = sorted([r for r in records if r.number != record.number] + [record],
                     key=lambda r: r.number)
    doc = json.dumps([r.to_json() for r in records], separators=(",", ":"), sort_keys=True)
    try:
        table.alter.set_table_properties(
            {LINEAGE_PROPERTY.format(source=source): doc}, raise_if_not_exists=False,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(lineage_app_id(source), records[-1].number)],
                custom_metadata={"userMetadata": metadata}))
    except CommitFailedError as e:
        raise LineageRaced(f"{source}: another commit changed the changelog first ({e})") \
            from e
    return records


def stored_tail(version_of: Callable[[str], int | None], txn: str) -> Mark | None:
    """The partition's tail as its last commit recorded it (without its origin), from
    `version_of` an app id (the changelog's transactions)."""
    found = [version_of(app_id) for app_id in tail_app_ids(txn)]
    if None in found:
        return None
    lineage, file, pos, server_id = tail_parts(*found)
    return Mark(lineage, file, pos, server_id)


def furthest(events: Sequence[ChangeEvent]) -> Mark | None:
    """The furthest-placed event of `events` with binlog coordinates, as a `Mark`."""
    best, at = None, None
    for e in events:
        p = e.position
        if (p.file or p.pos) and (at is None or (p.lineage, p.file, p.pos) > at):
            best, at = e, (p.lineage, p.file, p.pos)
    if best is None:
        return None
    p = best.position
    return Mark(p.lineage, p.file, p.pos, best.server_id, best.gtid, best.source_ts,
                p.snapshot)


def tail_transactions(txn: str, previous: Mark | None, events: Sequence[ChangeEvent]
                      ) -> tuple[list[Transaction], Mark | None]:
    """The transactions moving the partition's tail past `previous` to the furthest of
    `events`, and that tail; none when no event goes further."""
    from deltalake import Transaction

    new = furthest(events)
    if new is None or (previous is not None and (new.lineage, *new.coordinates)
                       <= (previous.lineage, *previous.coordinates)):
        return [], previous
    versions = tail_versions(new.lineage, new.file, new.pos, new.server_id)
    return [Transaction(i, v) for i, v in zip(tail_app_ids(txn), versions, strict=True)], new


def tail_origin(uri: str, topic: str, partition: int, tail: Mark) -> Mark | None:
    """The tail's server id, GTID and commit time, from its changelog row: the files whose
    statistics hold its position, topic and partition are read, no other (a query over
    the table planned and pruned by DataFusion took a second on 300 commits)."""
    from deltalake import DeltaTable

    table = DeltaTable(uri)
    if "gtid" not in table.schema().to_arrow().names:
        return None
    wanted = {"pos_phase": int(tail.lineage), "pos_file": int(tail.file),
              "pos_pos": int(tail.pos), "partition": int(partition), "topic": topic}
    row = None
    for rows in _rows_in_files(uri, table, wanted):
        for r in rows:
            if row is None or r["offset"] > row["offset"]:
                row = r
    if row is None:
        return None
    return Mark(tail.lineage, tail.file, tail.pos, row["server_id"], row["gtid"],
                row["source_ts"], row["pos_row"] is not None and row["pos_row"] < 0)


def _rows_in_files(uri: str, table: DeltaTable, wanted: dict):  # noqa: ANN202
    """The rows equal to `wanted` of the files whose min/max statistics may hold them."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    actions = pa.table(table.get_add_actions(flatten=True))
    keep = pa.array([True] * actions.num_rows)
    for column, value in wanted.items():
        lo, hi = f"min.{column}", f"max.{column}"
        if lo in actions.column_names and hi in actions.column_names:
            inside = pc.and_(pc.less_equal(actions[lo], value),
                             pc.greater_equal(actions[hi], value))
            keep = pc.and_kleene(keep, pc.fill_null(inside, True))
    paths = actions.filter(keep)["path"].to_pylist()
    filesystem, root = pafs.FileSystem.from_uri(uri)
    columns = [*wanted, "server_id", "gtid", "source_ts", "pos_row", "offset"]
    for path in paths:
        rows = pq.read_table(f"{root.rstrip('/')}/{path}", filesystem=filesystem,
                             columns=columns, filters=list(wanted.items()) and [
                                 (k, "=", v) for k, v in wanted.items()])
        yield rows.to_pylist()


def snapshot_tables(uri: str, position: Position) -> list[str]:
    """The tables a snapshot at `position` read: those whose CREATE TABLE it replayed into
    the changelog at those binlog coordinates (`consume/snapshot_end.py`), in whatever
    lineage its schema-change topic placed them (a schema replay raises none)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    if not DeltaTable.is_deltatable(uri):
        return []
    query = QueryBuilder().register("changelog", DeltaTable(uri))
    rows = pa.table(query.execute(
        'SELECT DISTINCT "table" FROM changelog WHERE "op" = \'ddl\' '
        f'AND "pos_file" = {int(position.file)} '
        f'AND "pos_pos" = {int(position.pos)} AND "pos_row" = {SNAPSHOT_SCHEMA_ROW} '
        'AND upper(ltrim("ddl")) LIKE \'CREATE TABLE%\'').read_all())
    return sorted(t for t in rows.column(0).to_pylist() if t)
