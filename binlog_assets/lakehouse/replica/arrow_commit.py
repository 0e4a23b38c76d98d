"""A small batch's commit to a replica by delta-rs, as Arrow, without a Spark job.

A batch of at most `lakehouse.arrow_commit_rows` changes is reduced to the last change
of each key and typed as Arrow (`arrow_apply.py`), or by Spark and collected as
Arrow where only Spark reproduces its values, and committed by delta-rs in the statement
Spark would run: a MERGE on the key whose update is guarded by the position, or an
append (into a replica without data files, or one just created by Spark's CREATE TABLE,
which keeps its catalog entry, schema and properties); into an append-only replica, an
insert of the changes it does not hold yet (`commit_appended`). Spark's Delta MERGE or CTAS of a
few rows is a second or more of driver planning and jobs; delta-rs commits the same rows
in tens of milliseconds. The commit carries the replica's transaction (`APP_ID`, the
changelog version), as Spark's does.

Spark still writes a batch that holds a truncate (its delete of the rows below the
watermark), a table with an opt-in Delta feature delta-rs does not write (deletion
vectors, column mapping, type widening), and a rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlog_assets.lakehouse.delta_log import SPARK_ONLY_PROPERTIES, open_log

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame



def arrow_commits(props: dict[str, str], rows: int, limit: int, *, truncates: bool) -> bool:
    """Whether a batch of `rows` changelog rows into a replica with table properties
    `props` is committed by delta-rs (`commit_rows`)."""
    return (rows <= limit and not truncates
            and not SPARK_ONLY_PROPERTIES.intersection(props))


def commit_rows(location: str, rows: DataFrame, key: list[str], app_id: str, version: int,
                *, merge: bool) -> int:
    """Commit `rows` (reduced, typed: one per key) to the replica at `location` with the
    transaction (`app_id`, `version`): MERGE them when `merge` (a matched row is updated
    only by a newer `_position`), else append them. Returns the rows written."""
    return commit_arrow(location, rows.toArrow(), key, app_id, version, merge=merge)


def commit_arrow(location: str, batch: pa.Table, key: list[str], app_id: str, version: int,
                 *, merge: bool) -> int:
    """`commit_rows` of rows already in Arrow."""
    # Every column the batch has, as Spark's MERGE assigns them; the key match is plain
    # equality: batches with truncate markers (null keys) stay with Spark.
    assign = {_quoted(n): f"s.{_quoted(n)}" for n in batch.schema.names}
    match = " AND ".join(f"t.{_quoted(k)} = s.{_quoted(k)}" for k in key)
    return _commit(location, batch, app_id, version,
                   merge=_Merge(match, assign) if merge else None)


@dataclass(frozen=True)
class _Merge:
    """A MERGE's match of a batch row (`s`) to a table row (`t`), and the assignments of
    a matched row updated when the change is newer and of an unmatched one inserted;
    None: every column inserted, nothing updated."""

    match: str
    assign: dict[str, str] | None


def _commit(location: str, batch: pa.Table, app_id: str, version: int, *,
            merge: _Merge | None) -> int:
    """Append `batch` with the transaction (`app_id`, `version`), or MERGE it as `merge`
    says. Returns the rows written."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    log = open_log(location)
    target = pa.schema(log.schema().to_arrow())
    batch = batch.cast(pa.schema([target.field(n) for n in batch.schema.names]))
    commit = CommitProperties(app_transactions=[Transaction(app_id, version)])
    if merge is None:
        write_deltalake(log, batch, mode="append", commit_properties=commit)
        return batch.num_rows
    assign = merge.assign
    merger = log.merge(batch, merge.match, source_alias="s", target_alias="t",
                       commit_properties=commit)
    merger = (merger.when_not_matched_insert_all() if assign is None else
              merger.when_matched_update(assign, predicate="s._position > t._position")
              .when_not_matched_insert(assign))
    metrics = merger.execute()
    done = open_log(location).transaction_version(app_id)
    if done is None or done < version:
        # delta-rs commits nothing for a MERGE that changes no row (an empty batch, or
        # every change older than its row); Spark's commits the transaction regardless.
        commit_version(location, app_id, version)
    return int(metrics.get("num_target_rows_inserted", 0)
               + metrics.get("num_target_rows_updated", 0))


def identity_sql(target: str, source: str, column: str = "_position") -> str:
    """`columns.change_identity(target.column) = change_identity(source.column)` as
    delta-rs's SQL compares positions."""
    def identity(alias: str, field: str) -> str:
        p = f"{alias}.{column}"
        return f"(CASE WHEN {p}.file = 0 AND {p}.pos = 0 THEN {p}.{field} ELSE -1 END)"

    return " AND ".join(
        [*(f"{target}.{column}.{f} = {source}.{column}.{f}" for f in ("phase", "file", "pos",
                                                                       "row")),
         *(f"{identity(target, f)} = {identity(source, f)}" for f in ("offset", "row_index"))])


_SAME_CHANGE = ("t._source_db = s._source_db AND t._source_table = s._source_table AND "
                + identity_sql("t", "s"))


def commit_appended(location: str, batch: pa.Table, app_id: str, version: int, *,
                    merge: bool) -> int:
    """Append the changes `batch` (each once, `driver.appended_rows`) to the append-only
    replica at `location` with the transaction (`app_id`, `version`); with `merge`, only
    those whose change the replica does not hold yet (a copy delivered again at another
    Kafka offset, or by a second consumer group), as Spark's MERGE on the change's
    identity does. Returns the rows written."""
    return _commit(location, batch, app_id, version,
                   merge=_Merge(_SAME_CHANGE, None) if merge else None)


def commit_version(location: str, app_id: str, version: int) -> None:
    """Move the replica's applied version to `version` with a commit that adds no file."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    log = open_log(location)
    empty = pa.schema(log.schema().to_arrow()).empty_table()
    write_deltalake(log, empty, mode="append", commit_properties=CommitProperties(
        app_transactions=[Transaction(app_id, version)]))


def _quoted(name: str) -> str:
    """A column name as delta-rs's SQL predicates take it (case kept)."""
    return "`" + name.replace("`", "``") + "`"
