"""Column expressions the replica and history MERGEs share: positions, keys, source tables.

A position is one struct, `(phase, file, pos, row, offset, row_index)`: the binlog
position as numbers (`phase` holds the position's lineage: `formats/event.py`), then the
Kafka offset and the row within one record as tie-breakers. Spark orders structs field
by field, so one `>` compares two positions exactly and never as text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.formats.event import FIRST_LINEAGE
from binlog_assets.identifiers import col

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# (struct field, type, changelog column)
POSITION_FIELDS = (
    ("phase", T.IntegerType(), "pos_phase"),
    ("file", T.LongType(), "pos_file"),
    ("pos", T.LongType(), "pos_pos"),
    ("row", T.IntegerType(), "pos_row"),
    ("offset", T.LongType(), "offset"),
    ("row_index", T.IntegerType(), "row_index"),
)
POSITION_TYPE = T.StructType([T.StructField(n, t) for n, t, _ in POSITION_FIELDS])


def changelog_position() -> Column:
    """The position struct of a changelog row."""
    return F.struct(*[F.col(source).cast(t).alias(name) for name, t, source in POSITION_FIELDS])


def position_literal(position: tuple[int, ...]) -> Column:
    return F.struct(*[F.lit(v).cast(t).alias(name)
                      for (name, t, _), v in zip(POSITION_FIELDS, position, strict=True)])


def position_sql(position: tuple[int, ...]) -> str:
    """A position as a SQL struct literal (Delta's UPDATE binds no SQL parameters; the
    values are integers)."""
    parts = [f"'{name}', CAST({int(value)} AS {data_type.simpleString()})"
             for (name, data_type, _), value in zip(POSITION_FIELDS, position, strict=True)]
    return f"named_struct({', '.join(parts)})"


def binlog_before_sql(position: tuple[int, ...]) -> str:
    """SQL: the row's `_position` is older in the binlog than `position`, a streamed
    event's (a DDL). By lineage and binlog coordinates, whatever the row's `row`: a
    snapshot row carries the binlog position it was read at, so an initial snapshot is
    older than a later ALTER and an incremental one taken after it is not; a snapshot
    read of a lake made before lineages (lineage 0) was read in lineage 1. A source
    without coordinates (file and pos zero) compares whole positions."""
    lineage, file, pos = (int(v) for v in position[:3])
    if file == 0 and pos == 0:
        return f"_position < {position_sql(position)}"
    lineage = max(lineage, FIRST_LINEAGE)
    row = f"GREATEST(_position.phase, {FIRST_LINEAGE})"
    return (f"({row} < {lineage} OR ({row} = {lineage} AND (_position.file < {file} OR "
            f"(_position.file = {file} AND _position.pos < {pos}))))")


def change_identity(position: Column) -> Column:
    """What makes two copies of one source change the same change.

    A producer that re-sends after a restart gives the copy a new Kafka offset but the
    same binlog coordinates, so those decide; only a source without coordinates (file and
    pos zero) falls back to the Kafka offset and row.
    """
    no_coordinates = (position.getField("file") == 0) & (position.getField("pos") == 0)
    return F.struct(
        position.getField("phase").alias("phase"),
        position.getField("file").alias("file"),
        position.getField("pos").alias("pos"),
        position.getField("row").alias("row"),
        F.when(no_coordinates, position.getField("offset")).otherwise(F.lit(-1).cast("long"))
        .alias("offset"),
        F.when(no_coordinates, position.getField("row_index")).otherwise(F.lit(-1))
        .alias("row_index"),
    )


def key_match(key: list[str], left: str = "t", right: str = "s") -> Column:
    """Rows `left` and `right` have the same key; null-safe, so truncate markers (null
    key columns) match each other and nothing else."""
    cond = F.lit(True)
    for k in key:
        cond = cond & col(k, left).eqNullSafe(col(k, right))
    return cond


def working_column(name: str) -> str:
    """The name of a column an apply adds beside the replica's for a while (a change's
    JSON image, a truncate's watermark): `name` after U+001F. `check_column` refuses
    control characters in every source column, keys included, so no source column can
    ever be called the same, whatever it is called."""
    return "\x1f" + name


def free_name(name: str, taken: list[str]) -> str:
    """`name`, with underscores added until no column of `taken` has it (Spark compares
    column names without case): a working column beside source columns, which may be
    called anything."""
    used = {c.lower() for c in taken}
    while name.lower() in used:
        name += "_"
    return name


def first_per_group(frame: DataFrame, group: list[Column], order: list[Column]
                    ) -> DataFrame:
    """Per group (null-safe: truncate markers with their null keys form one), the row
    that comes first by the sort expressions `order`.

    `row_number() = 1` over the group, rather than `max_by` of a struct of the other
    columns: Spark turns the filter into a group limit that already keeps one row per
    group before the shuffle and moves the rows as they are, where `max_by` over a struct
    takes the sort-based aggregate and copies every row into a generic buffer (for the
    replica rewrite's 1.5M rows: a quarter less CPU in the map stage, 15% less time
    without the write; bench/RESULTS.md, "Replica apply against a plain Delta write").
    """
    rank = free_name("_rank", frame.columns)
    window = Window.partitionBy(*group).orderBy(*order)
    return (frame.withColumn(rank, F.row_number().over(window))
            .where(col(rank) == 1).drop(rank))


def split_table(name: str) -> tuple[str, str]:
    """`db.table` -> (db, table)."""
    db, _, table = name.partition(".")
    return db, table


def is_source_table(name: str, alias: str | None = None) -> Column:
    """The row (of DataFrame `alias`) comes from source table `db.table`."""
    db, table = split_table(name)
    return (col("_source_db", alias) == F.lit(db)) & (col("_source_table", alias) == F.lit(table))


def first_truncate_after(
    truncates: list[tuple[str, tuple[int, ...]]], position: Column, alias: str | None = None
) -> Column:
    """The earliest truncate of the row's source table above `position`, else null.

    `truncates` are (db.table, position) pairs; few in practice, so a CASE of literals.
    """
    expr = None
    for name, at in sorted(truncates, key=lambda t: t[1]):
        branch = is_source_table(name, alias) & (position < position_literal(at))
        expr = (F.when(branch, position_literal(at)) if expr is None
                else expr.when(branch, position_literal(at)))
    return F.lit(None).cast(POSITION_TYPE) if expr is None else expr
