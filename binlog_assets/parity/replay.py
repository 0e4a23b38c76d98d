"""The rows an append-only replica says its keyless source table holds: its log of
changes replayed as a multiset, for the parity check.

An append-only replica keeps one row per change: the after-image of an insert or update,
the before-image of a delete, nulls for a truncate. Replayed in position order, an insert
adds its row, a delete removes its before-image, a truncate empties the table, and an
update removes its before-image and adds its after-image; the replica does not keep an
update's before-image, so it is read from the changelog (by the change's binlog
coordinates) and typed by the replica's value rules (`replica_driver.converter`). Rows
compare by their canonical text's CRC, as the source's aggregate sums them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from binlog_assets.lakehouse.changelog import changelog_uri
from binlog_assets.lakehouse.delta_log import delta_rs_uri
from binlog_assets.parity.canonical import Fingerprint, crcs_of
from binlog_assets.parity.lake import replica_uri

if TYPE_CHECKING:
    import pyarrow as pa

    from binlog_assets.config import PipelineConfig
    from binlog_assets.parity.source import SourceTable

_INSERTS, _DELETE, _UPDATE, _TRUNCATE = ("c", "r"), "d", "u", "t"
# A change's binlog coordinates: what the replica and the changelog both know it by.
_IDENTITY = ("phase", "file", "pos", "row")


@dataclass
class Replayed:
    """The multiset the log leaves (row CRC -> count), and what did not replay: a delete
    or update of a row the log never held (CRC -> where, for the report)."""

    rows: Counter = field(default_factory=Counter)
    unmatched: list[str] = field(default_factory=list)

    def fingerprint(self) -> Fingerprint:
        out = Fingerprint()
        for crc, n in self.rows.items():
            for _ in range(n):
                out.add(crc)
        return out


def replayed(pipeline: PipelineConfig, replica: str, table: SourceTable) -> Replayed:
    """The append-only replica's changes of source table `table`, replayed."""
    from deltalake import DeltaTable, QueryBuilder

    delta = DeltaTable(replica_uri(pipeline, replica))
    present = {f.name.lower(): f.name for f in delta.schema().fields}
    names = [present.get(c.lower()) for c, _ in table.columns]
    select = ", ".join(f'"{n}"' for n in names if n is not None)
    query = QueryBuilder().register("replica", delta).execute(
        f'SELECT {select + ", " if select else ""}"_op", "_position" FROM replica '
        f"WHERE _source_db = '{_escaped(table.database)}' "
        f"AND _source_table = '{_escaped(table.table)}'")
    import pyarrow as pa

    rows = pa.table(query.read_all())
    columns = [_column(rows, n) for n in names]
    crcs = crcs_of(columns, rows.num_rows)
    positions = rows.column("_position").to_pylist()
    ops = rows.column("_op").to_pylist()
    updates = [p for p, op in zip(positions, ops, strict=True) if op == _UPDATE]
    befores = _update_befores(pipeline, table, updates, columns, names) if updates else {}
    order = sorted(range(rows.num_rows), key=lambda i: _sort_key(positions[i]))
    out = Replayed()
    for i in order:
        op, crc = ops[i], crcs[i]
        if op in _INSERTS:
            out.rows[crc] += 1
        elif op == _TRUNCATE:
            out.rows.clear()
        else:
            gone = crc if op == _DELETE else befores.get(_identity(positions[i]))
            if gone is not None and out.rows[gone] > 0:
                out.rows[gone] -= 1
                if not out.rows[gone]:
                    del out.rows[gone]
            else:
                out.unmatched.append(f"{op} at {_label(positions[i])}: its row was not in "
                                     f"the log")
            if op == _UPDATE:
                out.rows[crc] += 1
    return out


def _column(rows: pa.Table, name: str | None) -> pa.Array:
    import pyarrow as pa

    if name is None:
        return pa.nulls(rows.num_rows, pa.string())
    column = rows.column(name).combine_chunks()
    # delta-rs reads text as views, which Spark's type mapping does not know.
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}.get(column.type)
    return column if plain is None else column.cast(plain)


def _update_befores(pipeline: PipelineConfig, table: SourceTable, updates: list[dict],
                    columns: list[pa.Array], names: list[str | None]) -> dict[tuple, int]:
    """Change identity -> the CRC of its before-image, for the updates of `table`, read
    from the changelog and typed as the replica's columns."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder
    from pyspark.sql.pandas.types import from_arrow_type

    from binlog_assets.lakehouse.replica.arrow_apply import converter

    wanted = {_identity(p) for p in updates}
    log = DeltaTable(delta_rs_uri(changelog_uri(pipeline)))
    found = pa.table(QueryBuilder().register("changelog", log).execute(
        'SELECT "before", pos_phase, pos_file, pos_pos, pos_row FROM changelog '
        f"WHERE \"table\" = '{_escaped(table.name)}' AND op = 'u'").read_all())
    images: dict[tuple, dict[str, Any]] = {}
    for text, *identity in zip(*(found.column(c).to_pylist() for c in found.column_names),
                               strict=True):
        if tuple(identity) in wanted and text is not None:
            images[tuple(identity)] = {k.lower(): v for k, v in orjson.loads(text).items()}
    convert = [converter(from_arrow_type(c.type)) if n is not None else (lambda _: None)
               for c, n in zip(columns, names, strict=True)]
    keys = list(images)
    typed = []
    for (source_name, _), cast, column in zip(table.columns, convert, columns, strict=True):
        values = [cast(images[k].get(source_name.lower())) for k in keys]
        typed.append(pa.array(values, type=column.type))
    return dict(zip(keys, crcs_of(typed, len(keys)), strict=True))


def _identity(position: dict) -> tuple:
    return tuple(position[f] for f in _IDENTITY)


def _sort_key(position: dict) -> tuple:
    return (*_identity(position), position["offset"], position["row_index"])


def _label(position: dict) -> str:
    return f"binlog {position['file']:06d}:{position['pos']} row {position['row']}"


def _escaped(text: str) -> str:
    return text.replace("'", "''")
