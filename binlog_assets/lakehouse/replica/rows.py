"""Shaping one apply's rows: the batch's changes keyed (the key typed, the image still
JSON text, so only the changes that survive the reduce get parsed), deletes of moved
keys under a `key_columns` override, and the images typed by the replica's columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from binlog_assets.formats.event import OP_DELETE, OP_TRUNCATE, OP_UPDATE
from binlog_assets.identifiers import col
from binlog_assets.lakehouse.changelog_rows import to_json
from binlog_assets.lakehouse.columns import (
    binlog_before_sql,
    changelog_position,
    is_source_table,
    position_literal,
    working_column,
)
from binlog_assets.lakehouse.replica.plan import MERGED_OPS, RowShape, Survey
from binlog_assets.lakehouse.replica.routes import SOURCE_KEY_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Iterable

# Working columns of an apply, named so that no source column can clash with them: a
# change's image as JSON text, and a truncate's watermark (source table and position).
IMAGE = working_column("image")


def keyed_rows(batch: DataFrame, *, shape: RowShape) -> DataFrame:
    """The batch's row changes and truncates with their key typed and their image
    still JSON text, so that only the changes that survive the reduce get parsed.

    Columns: `_source_db`, `_source_table`, the key's source columns, `_position`,
    `_op`, `_source_ts`, `IMAGE` (the after-image, the before-image of a delete).
    Truncates have null keys. The key comes from the record's own key (`key`, a small
    JSON object the decoder took from the same image) and from the image only when the
    record has none; with a `key_columns` override it comes from the image (the record
    key is the decoder's), and updates that moved a row to another key add a delete of
    the old one (`key_change_deletes`).
    """
    b = batch.where(F.col("table").isin(shape.survey.tables) & F.col("op").isin(*MERGED_OPS))
    key_columns = shape.route.key_columns
    keyed = keyed_changes(b, row_image(), F.col("op"), shape=shape,
                          image_first=bool(key_columns))
    if key_columns:
        keyed = keyed.unionByName(key_change_deletes(b, shape=shape))
    return keyed


def keyed_changes(b: DataFrame, image: Column, op: Column, *, shape: RowShape,
                  image_first: bool) -> DataFrame:
    columns = shape.columns
    source_key = [k for k in shape.key if k not in SOURCE_KEY_COLUMNS]
    spellings = column_spellings({k: columns[k] for k in source_key}, shape.survey)
    in_record = F.from_json(F.col("key"), text_schema({k: [k] for k in source_key}))
    in_image = F.from_json(col(IMAGE), text_schema(spellings))
    framed = b.select(
        F.col("table"), F.col("offset"), F.col("key"), image.alias(IMAGE),
        op.alias("_op"), changelog_position().alias("_position"),
        F.timestamp_millis(F.col("source_ts")).alias("_source_ts"))
    table_parts = F.split(F.col("table"), r"\.", 2)
    out = [table_parts.getItem(0).alias("_source_db"),
           table_parts.getItem(1).alias("_source_table")]
    for column in source_key:
        from_image = [in_image.getField(n) for n in spellings[column.lower()]]
        from_record = [in_record.getField(column)]
        # Coalesce stops at its first non-null argument: the second source is parsed
        # only for rows whose first lacks the value.
        text = F.coalesce(*(from_image + from_record if image_first
                            else from_record + from_image))
        value = cast_text(require_key(text, column, shape.route.replica), columns[column])
        fast = None if image_first or len(source_key) != 1 else integer_key(
            column, columns[column])
        # Coalesce evaluates `value` (the JSON parse) only where `fast` is null.
        out.append((value if fast is None else F.coalesce(fast, value)).alias(column))
    return framed.select(*out, "_position", "_op", "_source_ts", col(IMAGE))


def key_change_deletes(b: DataFrame, *, shape: RowShape) -> DataFrame:
    """Deletes of the old key of updates that moved a row to another key.

    Only needed with a key_columns override: decoders split such updates themselves
    when they know the key, but an override of a sharded (regex) source reaches no
    decoder.
    """
    source_key = [k for k in shape.key if k not in SOURCE_KEY_COLUMNS]
    key_schema = text_schema({k: [k] for k in source_key})
    before = F.from_json(F.col("before"), key_schema)
    after = F.from_json(F.col("after"), key_schema)
    moved = F.lit(False)
    for k in source_key:
        moved = moved | ~before.getField(k).eqNullSafe(after.getField(k))
    updates = b.where((F.col("op") == OP_UPDATE) & F.col("before").isNotNull() & moved)
    return keyed_changes(updates, F.col("before"), F.lit(OP_DELETE), shape=shape,
                         image_first=True)


def typed_columns(frame: DataFrame, out: list[str], *, shape: RowShape,
                  stored: Column | None = None, image: str = IMAGE,
                  live: bool = False) -> DataFrame:
    """`frame`'s columns `out`, the replica's source columns among them parsed from
    the JSON column `image` and typed (those of rows where `stored` holds are kept as
    they are). `live`: rows of the replica's current state, where a column the batch
    ADDs holds its default in rows older than the ADD (`Survey.added`); a history or a
    log of changes keeps what each image held."""
    survey, key, columns = shape.survey, shape.key, shape.columns
    spellings = column_spellings(columns, survey)
    parsed = frame.withColumn(image, F.from_json(col(image), text_schema(spellings)))
    # Parsed once into a struct column and only then taken apart: a field read
    # straight off `from_json(...)` makes Spark parse the text once per field.
    select = []
    for name in out:
        if name in columns and name not in key:
            text = F.coalesce(*[col(image).getField(n) for n in spellings[name.lower()]])
            value = cast_text(text, columns[name])
            if stored is not None:
                value = F.when(stored, col(name)).otherwise(value)
            if live:
                value = added_default(value, survey.added.get(name.lower(), ()),
                                      columns[name])
            select.append(value.alias(name))
        else:
            select.append(col(name))
    return parsed.select(*select)


def added_default(value: Column, adds: Iterable[tuple[str, tuple[int, ...], str | None]],
                  data_type: T.DataType) -> Column:
    """`value`, or the default of the column where an ADD of it is newer than the row:
    `adds` are (db.table, position, SQL literal or None) from `Survey.added`."""
    for table, position, default in adds:
        literal = F.expr(default) if default is not None else F.lit(None)
        value = F.when(is_source_table(table) & F.expr(binlog_before_sql(position)),
                       literal.cast(data_type)).otherwise(value)
    return value


def row_image() -> Column:
    """A change's row values: the after-image, the before-image of a delete."""
    return F.when(F.col("op") == OP_DELETE, F.col("before")).otherwise(F.col("after"))


def below_truncates(truncates: dict[str, tuple[int, ...]], alias: str | None = None
                     ) -> Column:
    """The row (of DataFrame `alias`) comes from a truncated source table and is older
    than its truncate: `truncates` maps db.table to the truncate's position."""
    cleared = F.lit(False)
    for name, position in truncates.items():
        cleared = cleared | (is_source_table(name, alias)
                             & (col("_position", alias) < position_literal(position)))
    return cleared


def cast_text(text: Column, data_type: T.DataType) -> Column:
    """A value's JSON text (see changelog.to_json) as `data_type`."""
    if isinstance(data_type, T.BinaryType):
        return F.unbase64(text)
    if isinstance(data_type, T.StringType):
        return text
    return text.cast(data_type)


def require_key(value: Column, column: str, replica: str) -> Column:
    """`value`, or a clear job failure for a row change without a key value (a null key
    would collide with the truncate markers)."""
    message = F.concat(F.lit(f"replica {replica}: a change of "), F.col("table"),
                       F.lit(" at offset "), F.col("offset").cast("string"),
                       F.lit(f" has no value for key column {column!r}"))
    # `value` appears once: written into both the test and the result of a CASE, Spark
    # evaluated it twice (a key parsed from JSON twice per row, 1.2 s per 1M events).
    return F.coalesce(value, F.when(F.col("_op") != OP_TRUNCATE, F.raise_error(message)))


_INTEGER_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def integer_key(column: str, data_type: T.DataType) -> Column | None:
    """The value of an integer key column read straight from a record key that is just
    `{"<column>":<integer>}` (what the changelog writer writes for a one-column key),
    null for any other record key; None when `data_type` is not an integer type.

    Reading the digits between the braces costs about a fifth of `from_json` per row (the
    record key is parsed for every change of the batch) and gives the same value: the
    digits must be the number's own canonical text (no sign but minus, no leading zero,
    no space), and a number that does not fit the type is null here and left to the
    parse and its cast, as before.
    """
    if not isinstance(data_type, _INTEGER_TYPES):
        return None
    # The writer's own encoding of the key, up to the value: `{"<column>":`.
    prefix = to_json({column: 0}).removesuffix("0}")
    record_key = F.col("key")
    start = len(prefix) + 1
    digits = record_key.substr(F.lit(start), F.length(record_key) - F.lit(start))
    value = digits.try_cast(data_type)
    whole = (record_key.startswith(prefix) & record_key.endswith("}")
             & (value.cast(T.StringType()) == digits))
    return F.when(whole, value)


def column_spellings(columns: dict[str, T.DataType], survey: Survey) -> dict[str, list[str]]:
    """Per replica column (by its lower-case name), every spelling the batch uses for it,
    so a column whose case changed still finds its replica column (Spark and MySQL names
    are case-insensitive)."""
    spellings: dict[str, list[str]] = {c.lower(): [c] for c in columns}
    for name in [*survey.declared, *survey.inferred]:
        names = spellings.get(name.lower())
        if names is not None and name not in names:
            names.append(name)
    # A renamed column's older images still name it the old way (after the new name:
    # an image has one or the other), unless the old name is a replica column itself.
    for lower, names in spellings.items():
        names += [old for old in survey.aliases.get(lower, ())
                  if old.lower() not in spellings and old not in names]
    return spellings


def text_schema(spellings: dict[str, list[str]]) -> T.StructType:
    """Every spelling as a string field: values are parsed as JSON text, then cast."""
    return T.StructType([T.StructField(n, T.StringType())
                         for names in spellings.values() for n in names])
