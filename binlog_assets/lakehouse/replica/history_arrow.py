"""A small batch's versions merged into a history table by delta-rs, without Spark.

`history.merge_history` is Spark's MERGE: each change of the batch is a version, a
stored version of the same change (binlog coordinates) wins over a copy, and every
version of a touched key gets its `_valid_to` (the next version's position, or its
table's next truncate) and `_is_current` again from the key's whole chain. Here the
same chains are computed in Python from the batch's changes (`arrow_apply.history_changes`)
and the touched keys' stored versions (read by delta-rs), and one delta-rs MERGE inserts
the new versions and updates the stored ones whose chain values moved. A batch with a
truncate (a marker that closes versions of keys it does not touch) stays with Spark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from binlog_assets.formats.event import OP_DELETE, OP_TRUNCATE
from binlog_assets.lakehouse.delta_log import open_log
from binlog_assets.lakehouse.replica.arrow_apply import change_identity
from binlog_assets.lakehouse.replica.arrow_commit import commit_version, identity_sql

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

# Position struct fields, in the order a position tuple holds them.
_FIELDS = ("phase", "file", "pos", "row", "offset", "row_index")


def merge_history_versions(location: str, incoming: list[dict[str, Any]], key: list[str],
                           app_id: str, version: int) -> int:
    """MERGE `incoming` (the batch's changes as history rows without `_valid_to` and
    `_is_current`, `_valid_from` a position dict) into the history table at `location`,
    committing the transaction (`app_id`, `version`). Returns the versions written."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction

    log = open_log(location)
    schema = pa.schema(log.schema().to_arrow())
    touched = {tuple(r[k] for k in key) for r in incoming}
    truncates, stored = [], []
    for r in _stored_versions(log, key[-1], {k[-1] for k in touched},
                              schema.field(key[-1]).type):
        if r["_op"] == OP_TRUNCATE:
            truncates.append((r["_source_db"], r["_source_table"], _tuple(r["_valid_from"])))
        elif tuple(r[k] for k in key) in touched:
            stored.append(r)

    # key -> change -> (version, stored): rows are dicts of the table's columns, which
    # may have any name, so whether a version is stored is kept beside it.
    chains: dict[tuple, dict[tuple, tuple[dict[str, Any], bool]]] = {}
    for r in stored:
        chains.setdefault(tuple(r[k] for k in key), {})[
            change_identity(_tuple(r["_valid_from"]))] = (r, True)
    # Copies of one change in the batch: the first by Kafka offset; a stored one wins.
    for r in sorted(incoming, key=lambda r: r["_valid_from"]["offset"]):
        chain = chains.setdefault(tuple(r[k] for k in key), {})
        chain.setdefault(change_identity(_tuple(r["_valid_from"])), (r, False))

    out: list[dict[str, Any]] = []
    for chain in chains.values():
        ordered = sorted(chain.values(), key=lambda v: _tuple(v[0]["_valid_from"]))
        for i, (r, was_stored) in enumerate(ordered):
            start = _tuple(r["_valid_from"])
            ends = [_tuple(ordered[i + 1][0]["_valid_from"])] if i + 1 < len(ordered) else []
            ends += [at for db, table, at in truncates
                     if (db, table) == (r["_source_db"], r["_source_table"]) and start < at]
            valid_to = dict(zip(_FIELDS, min(ends), strict=True)) if ends else None
            current = valid_to is None and r["_op"] != OP_DELETE
            if was_stored and (_same(r["_valid_to"], valid_to) and r["_is_current"] == current):
                continue  # nothing moved: not in the MERGE's source
            out.append({**r, "_valid_to": valid_to, "_is_current": current})

    commit = CommitProperties(app_transactions=[Transaction(app_id, version)])
    if not out:
        commit_version(location, app_id, version)
        return 0
    source = pa.Table.from_pylist(out, schema=schema)
    match = " AND ".join([*(f"t.{_ticked(k)} = s.{_ticked(k)}" for k in key),
                          identity_sql("t", "s", "_valid_from")])
    metrics = (log.merge(source, match, source_alias="s", target_alias="t",
                         commit_properties=commit)
               .when_matched_update({"_valid_to": "s._valid_to",
                                     "_is_current": "s._is_current"})
               .when_not_matched_insert_all().execute())
    return int(metrics.get("num_target_rows_inserted", 0)
               + metrics.get("num_target_rows_updated", 0))


def _stored_versions(log: DeltaTable, column: str, values: set, data_type: pa.DataType
                     ) -> list[dict[str, Any]]:
    """The table's truncate markers and the versions whose `column` is one of `values`
    (all versions where the type has no SQL literal here), read by delta-rs's query
    engine, which skips files by their statistics."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    where = f"\"_op\" = '{OP_TRUNCATE}'"
    literals = _literals(values, data_type)
    if literals is not None:
        where += f" OR {_quoted(column)} IN ({literals})"
    reader = QueryBuilder().register("h", log).execute(
        "SELECT * FROM h" + (f" WHERE {where}" if literals is not None else ""))
    rows = pa.table(reader.read_all())
    # delta-rs hands strings and binaries back as views, which pylist reads alike.
    return rows.to_pylist()


def _literals(values: set, data_type: pa.DataType) -> str | None:
    """SQL literals of `values` (integers or strings), else None."""
    import pyarrow as pa

    if pa.types.is_integer(data_type):
        return ", ".join(str(int(v)) for v in sorted(values))
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return ", ".join("'" + str(v).replace("'", "''") + "'" for v in sorted(values))
    return None


def _ticked(name: str) -> str:
    """A column name as delta-rs's MERGE predicates take it (case kept)."""
    return "`" + name.replace("`", "``") + "`"


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _tuple(position: dict[str, Any]) -> tuple:
    return tuple(position[f] for f in _FIELDS)


def _same(stored: dict[str, Any] | None, computed: dict[str, Any] | None) -> bool:
    return (stored is None) == (computed is None) and (
        stored is None or _tuple(stored) == _tuple(computed))
