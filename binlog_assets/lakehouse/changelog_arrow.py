"""The changelog's row changes as Arrow, read by delta-rs: what an Arrow apply reduces.

A follower cycle or a replica build applies many replicas to the same changelog
versions. A Spark read per replica plans and runs a job of its own; here the versions
are read once (the change feed of the append-only table, by delta-rs, no JVM), kept for
the next replica of the same range, and each replica takes the rows of its own tables
from them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from binlog_assets.lakehouse.changelog import changelog_uri
from binlog_assets.lakehouse.delta_log import delta_rs_uri, open_log

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

    from binlog_assets.config import PipelineConfig

# The columns an Arrow apply reads. delta-rs builds a SQL projection from the names
# without quoting them, and `table` or `offset` after another name does not parse: they
# come first and last.
RANGE_COLUMNS = ("offset", "op", "key", "before", "after", "pos_phase", "pos_file",
                 "pos_pos", "pos_row", "row_index", "source_ts", "_commit_version", "table")
# The range kept for the next replica holds at most this many rows (a catch-up's whole
# backlog is read per replica, by its tables, instead).
KEPT_ROWS = 100_000

_lock = threading.Lock()
# changelog location -> (table id, first version, last version, their rows)
_kept: dict[str, tuple[str, int, int, pa.Table]] = {}


def changes_of(pipeline: PipelineConfig, after_version: int | None, up_to: int,
               tables: list[str], ops: tuple[str, ...], without_topics: list[str] = ()
               ) -> pa.Table:
    """Rows of changelog versions (`after_version`, `up_to`] (the table as of `up_to`
    when None) whose table is one of `tables` and op one of `ops`, columns `RANGE_COLUMNS`;
    `without_topics`: but those of these topics (a direct load's, `replica/loads.py`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, QueryBuilder

    uri = delta_rs_uri(changelog_uri(pipeline))
    if after_version is None:
        # The table as of `up_to`, as Spark reads it: rows retention removed stay out,
        # where the change feed of every version would bring them back. delta-rs's query
        # skips files by their `table` statistics; a pyarrow dataset would open every
        # file's footer, a cost per replica that grows with the number of tables.
        columns = ", ".join(f'"{c}"' for c in RANGE_COLUMNS if c != "_commit_version")
        query = QueryBuilder().register("changelog", DeltaTable(uri, version=up_to))
        unloaded = (f' AND "topic" NOT IN ({_sql_list(list(without_topics))})'
                    if without_topics else "")
        reader = query.execute(
            f'SELECT {columns} FROM changelog WHERE "table" IN ({_sql_list(tables)}) '
            f'AND "op" IN ({_sql_list(list(ops))}){unloaded}')
        return _plain(pa.table(reader.read_all()))
    log = open_log(uri)
    # A changelog made again at the same location counts its versions from 0 again.
    table_id = log.metadata().id
    first = after_version + 1
    # A range with a direct load's rows is read without them, and kept for no other.
    rows = (_read(log, first, up_to, tables, without_topics) if without_topics
            else _kept_rows(log, uri, table_id, first, up_to))
    if rows is None:
        rows = _read(log, first, up_to, None)
        if rows.num_rows > KEPT_ROWS:
            rows = _read(log, first, up_to, tables)
        else:
            with _lock:
                _kept[uri] = (table_id, first, up_to, rows)
    version = rows.column("_commit_version")
    keep = pc.and_(
        pc.and_(pc.is_in(rows.column("table"), value_set=pa.array(tables, pa.string())),
                pc.is_in(rows.column("op"), value_set=pa.array(list(ops), pa.string()))),
        pc.and_(pc.greater_equal(version, first), pc.less_equal(version, up_to)))
    return rows.filter(keep)


def _kept_rows(log: DeltaTable, uri: str, table_id: str, first: int, last: int
               ) -> pa.Table | None:
    """The kept rows when they cover versions `first`..`last`, extended by the versions
    after them when `last` is newer (a follower's next cycle) and trimmed below `first`;
    None when they do not reach back to `first`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    with _lock:
        kept = _kept.get(uri)
    if kept is None or kept[0] != table_id or not kept[1] <= first <= kept[2] + 1:
        return None
    _, lo, hi, rows = kept
    if hi >= last:
        return rows
    if lo < first:
        rows = rows.filter(pc.greater_equal(rows.column("_commit_version"), first))
    rows = pa.concat_tables([rows, _read(log, hi + 1, last, None)])
    if rows.num_rows > KEPT_ROWS:
        return None
    with _lock:
        _kept[uri] = (table_id, first, last, rows)
    return rows


def _read(log: DeltaTable, first: int, last: int, tables: list[str] | None,
          without_topics: list[str] = ()) -> pa.Table:
    """Versions `first`..`last` of the append-only changelog `log`: the rows they added
    (of `tables`, not of `without_topics`)."""
    import pyarrow as pa

    # Files hold one partition's events each, so their `table` statistics skip most.
    predicate = None if tables is None else f"`table` IN ({_sql_list(tables)})"
    if without_topics:
        predicate = " AND ".join(
            p for p in (predicate, f"`topic` NOT IN ({_sql_list(list(without_topics))})") if p)
    reader = log.load_cdf(starting_version=first, ending_version=last,
                          columns=list(RANGE_COLUMNS), predicate=predicate)
    return _plain(pa.table(reader.read_all()))


def _sql_list(texts: list[str]) -> str:
    """SQL string literals, comma-separated."""
    return ", ".join("'" + t.replace("'", "''") + "'" for t in texts)


def _plain(rows: pa.Table) -> pa.Table:
    """`rows` with delta-rs's string views as plain strings, which every compute kernel
    takes."""
    import pyarrow as pa

    return rows.cast(pa.schema([
        pa.field(f.name, pa.string()) if f.type == pa.string_view() else f
        for f in rows.schema]))
