"""Replica column types and their evolution: canonical type names in, Spark types out.

Decoders describe columns with canonical names (`int`, `bigint`, `decimal(10,2)`,
`timestamp`, ...; see `formats/mysql_types.py`), declared by the source: Debezium's
schema block, Canal's `mysqlType`, a DTS record, or a DDL event's table definition. Where
a format declares nothing (Maxwell rows, schema-less Debezium), the changelog writer
records the types of the decoded values instead (`mysql_types.infer_type`); those only ever add a
missing column, they never change a declared one.

`plan_changes` compares what a batch brings with the replica and applies the table's
mode: `evolve` adds columns and widens types (never narrows; drops and renames, which
only DDL tells, are `replica/ddl_apply.py`'s), `exception` refuses any change with
`SchemaEvolutionError`, `ignore` keeps the replica as it is and drops unknown fields.
Widening prefers Delta's type widening (a metadata-only change); a change Delta cannot
widen in place (a number becoming text, a date becoming a timestamp) rewrites the table
once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import types as T

from binlog_assets.config import SchemaEvolution
from binlog_assets.identifiers import check_columns, qualified, quote
from binlog_assets.lakehouse.delta_log import add_columns

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_MAX_DECIMAL_DIGITS = 38
# Decimal digits an integral type needs before the point.
_INTEGRAL_DIGITS = {T.IntegerType: 10, T.LongType: 19}
_FLOATING = (T.FloatType, T.DoubleType)

_SIMPLE = {
    "int": T.IntegerType(),
    "bigint": T.LongType(),
    "float": T.FloatType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "string": T.StringType(),
    # JSON documents stay text: their shape is the source's business, not the replica's.
    "json": T.StringType(),
    "date": T.DateType(),
    "timestamp": T.TimestampType(),
    "binary": T.BinaryType(),
}

class SchemaEvolutionError(ValueError):
    """A schema change the replica's mode forbids; the message names table and columns."""


def spark_type(canonical: str) -> T.DataType:
    """The Spark type of a canonical type name; names binlake does not know become text."""
    simple = _SIMPLE.get(canonical)
    if simple is not None:
        return simple
    m = _DECIMAL.fullmatch(canonical)
    if m is not None:
        precision, scale = int(m.group(1)), int(m.group(2))
        if 0 < precision <= _MAX_DECIMAL_DIGITS and scale <= precision:
            return T.DecimalType(precision, scale)
    return T.StringType()


def widen(a: T.DataType, b: T.DataType) -> T.DataType:
    """The narrowest type holding every value of both; text when nothing narrower does."""
    if a == b:
        return a
    if isinstance(a, T.DecimalType) and isinstance(b, T.DecimalType):
        scale = max(a.scale, b.scale)
        digits = max(a.precision - a.scale, b.precision - b.scale) + scale
        return T.DecimalType(digits, scale) if digits <= _MAX_DECIMAL_DIGITS else T.StringType()
    for x, y in ((a, b), (b, a)):
        if isinstance(x, T.DecimalType) and type(y) in _INTEGRAL_DIGITS:
            digits = max(x.precision - x.scale, _INTEGRAL_DIGITS[type(y)]) + x.scale
            return (T.DecimalType(digits, x.scale) if digits <= _MAX_DECIMAL_DIGITS
                    else T.StringType())
        if isinstance(x, T.DecimalType) and isinstance(y, _FLOATING):
            return T.DoubleType()
    kinds = {type(a), type(b)}
    if kinds == {T.IntegerType, T.LongType}:
        return T.LongType()
    numeric = {T.IntegerType, T.LongType, T.FloatType, T.DoubleType}
    if kinds <= numeric:
        return T.DoubleType()
    if kinds == {T.DateType, T.TimestampType}:
        return T.TimestampType()
    return T.StringType()


def widen_all(types: dict[str, T.DataType], more: dict[str, T.DataType]) -> None:
    """Merge `more` into `types` in place, widening where both name a column."""
    for column, t in more.items():
        types[column] = widen(types[column], t) if column in types else t


@dataclass
class SchemaChange:
    """What a batch changes in a replica's columns; `columns` is the schema after it."""

    add: list[T.StructField] = field(default_factory=list)
    retype: list[tuple[str, T.DataType, T.DataType]] = field(default_factory=list)
    columns: dict[str, T.DataType] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.add or self.retype)


def plan_changes(
    current: dict[str, T.DataType],
    declared: dict[str, T.DataType],
    inferred: dict[str, T.DataType],
    mode: SchemaEvolution,
    replica: str,
) -> SchemaChange:
    """The change a batch's `declared` and `inferred` column types ask of `current`.

    `current` maps the replica's source columns (in order) to their types. Names match
    case-insensitively, as in MySQL and Spark; a column keeps its first spelling.
    """
    by_lower = {name.lower(): name for name in current}
    change = SchemaChange(columns=dict(current))
    for column in check_columns([*declared, *(c for c in inferred if c not in declared)],
                                replica):
        existing = by_lower.get(column.lower())
        if existing is None:
            new_type = declared.get(column) or inferred[column]
            change.add.append(T.StructField(column, new_type, nullable=True))
            change.columns[column] = new_type
        elif column in declared:
            old = current[existing]
            new_type = widen(old, declared[column])
            if new_type != old:
                change.retype.append((existing, old, new_type))
                change.columns[existing] = new_type
    if not change or mode == "evolve":
        return change
    if mode == "exception":
        parts = [f"new column {f.name!r} {f.dataType.simpleString()}" for f in change.add]
        parts += [f"column {n!r} {o.simpleString()} -> {t.simpleString()}"
                  for n, o, t in change.retype]
        raise SchemaEvolutionError(
            f"replica {replica!r} has schema_evolution: exception and the source changed: "
            f"{'; '.join(parts)}")
    return SchemaChange(columns=dict(current))


def apply_changes(spark: SparkSession, table: tuple[str, str], change: SchemaChange) -> None:
    """Add and widen the table's columns, each change its own Delta commit.

    Done before the batch's MERGE; a crash in between leaves a wider table, from which
    the rerun plans again and finds nothing left to change.
    """
    from pyspark.errors import AnalysisException

    name = qualified(*table)
    if change.add:
        add_columns(spark, table, change.add)
    rewrite = []
    for column, _, new_type in change.retype:
        try:
            spark.sql(f"ALTER TABLE {name} ALTER COLUMN {quote(column)} TYPE "
                      f"{new_type.simpleString()}")
        except AnalysisException:
            # Delta widens in place only the pairs its type-widening feature supports,
            # and which pairs those are grows with Delta versions: ask, then rewrite.
            rewrite.append((column, new_type))
    if rewrite:
        _rewrite(spark, name, dict(rewrite))


def _rewrite(spark: SparkSession, name: str, retype: dict[str, T.DataType]) -> None:
    from pyspark.sql import functions as F

    df = spark.table(name)
    df = df.select([
        F.col(quote(c)).cast(retype[c]).alias(c) if c in retype else F.col(quote(c))
        for c in df.columns
    ])
    (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .saveAsTable(name))
