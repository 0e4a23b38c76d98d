"""A small batch reduced and typed as Arrow, without Spark: the rows a delta-rs
commit (`arrow_commit.py`) writes to the replica.

Spark's apply is a plan built in Python and a job per replica, most of a small apply's
time whatever its size. For a batch of row changes only (no DDL, truncates, cut-overs,
history or key override: `arrow_applies`; truncates only into a new replica, whose marker
rows it writes as Spark's would), the same result is computed here from the
changelog rows as Arrow (`changelog_arrow.py`): each key keeps its change of highest
position, and the winners' JSON images are typed by the replica's columns with Spark's
rules (`rows.cast_text` under ANSI casts, the session time zone UTC). An append-only
replica takes every change of a batch without DDL once, truncates included. A value
whose Spark cast this module does not reproduce exactly raises `NeedsSpark`, and the
apply goes the Spark way for the whole batch: the two ways never mix in one commit.
"""

from __future__ import annotations

import base64
import re
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import types as T

from binlog_assets.formats.event import OP_DELETE, OP_TRUNCATE
from binlog_assets.lakehouse.changelog_arrow import changes_of
from binlog_assets.lakehouse.columns import POSITION_FIELDS, split_table
from binlog_assets.lakehouse.replica.arrow_commit import arrow_commits
from binlog_assets.lakehouse.replica.plan import MERGED_OPS, ROW_OPS
from binlog_assets.lakehouse.replica.routes import SOURCE_KEY_COLUMNS
from binlog_assets.lakehouse.replica.rows import column_spellings

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import pyarrow as pa

    from binlog_assets.config import PipelineConfig
    from binlog_assets.lakehouse.replica.ddl_apply import Sources
    from binlog_assets.lakehouse.replica.plan import KeyRule, ReplicaTable, RowShape, Survey


class NeedsSpark(Exception):  # a decision, not an error
    """The batch holds something only Spark's apply reproduces; says what."""


_INT_RANGES = {T.IntegerType: (-(2**31), 2**31 - 1), T.LongType: (-(2**63), 2**63 - 1)}
_INTEGER_TEXT = re.compile(r"[+-]?\d+")
_DECIMAL_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
# Spark reads a date from the first ten characters when a time follows.
_DATE_TEXT = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[T ].*)?", re.DOTALL)
_TIMESTAMP_TEXT = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?)?"
    r"(Z|[+-]\d{2}:\d{2})?")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Wide enough for any decimal(38, s): the default context's 28 digits would refuse some.
_CONTEXT = Context(prec=80)
_QUANTA = [Decimal(1).scaleb(-scale) for scale in range(39)]
_TRUE = frozenset({"t", "true", "y", "yes", "1"})
_FALSE = frozenset({"f", "false", "n", "no", "0"})


def converter(data_type: T.DataType) -> Callable[[Any], Any]:
    """A JSON-decoded value -> the value Spark's `cast_text` gives `data_type` from its
    JSON text (None stays None); raises `NeedsSpark` where the two could differ."""
    kind = type(data_type)
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        return _nullable(lambda v: _integer(v, low, high))
    if kind in (T.DoubleType, T.FloatType):
        return _nullable(_floating)
    if kind is T.DecimalType:
        return _nullable(lambda v: _decimal(v, data_type.precision, data_type.scale))
    if kind is T.BooleanType:
        return _nullable(_boolean)
    if kind is T.StringType:
        return _nullable(_text)
    if kind is T.DateType:
        return _nullable(_date)
    if kind is T.TimestampType:
        return _nullable(_timestamp)
    if kind is T.BinaryType:
        return _nullable(_binary)
    raise NeedsSpark(f"column type {data_type.simpleString()}")


def _nullable(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else convert(v)


def _refuse(value: Any, what: str) -> NeedsSpark:
    return NeedsSpark(f"{type(value).__name__} value as {what}")


def _integer(value: Any, low: int, high: int) -> int:
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
        value = int(value)
    if type(value) is not int or not low <= value <= high:
        raise _refuse(value, "an integer")  # Spark's ANSI cast fails the apply or truncates
    return value


def _floating(value: Any) -> float:
    if type(value) not in (int, float):
        raise _refuse(value, "a floating-point number")
    return float(value)


def _decimal(value: Any, precision: int, scale: int) -> Decimal:
    if type(value) is int:
        text = str(value)
    elif type(value) is str and _DECIMAL_TEXT.fullmatch(value):
        text = value
    else:
        raise _refuse(value, "a decimal")
    try:
        number = Decimal(text).quantize(_QUANTA[scale], ROUND_HALF_UP, _CONTEXT)
    except InvalidOperation as exc:
        raise _refuse(value, "a decimal") from exc
    if number and number.adjusted() + 1 + scale > precision:
        raise _refuse(value, f"decimal({precision},{scale})")  # Spark: overflow error
    return number


def _boolean(value: Any) -> bool:
    if type(value) is bool:
        return value
    text = value if type(value) is str else str(value) if type(value) is int else None
    if text is not None and text.lower() in _TRUE:
        return True
    if text is not None and text.lower() in _FALSE:
        return False
    raise _refuse(value, "a boolean")


def _text(value: Any) -> str:
    if type(value) is str:
        return value
    if _rewritten(value):
        raise _refuse(value, "text")
    return orjson.dumps(value).decode()


# Control characters Spark's JSON writer and orjson escape alike (\b \t \n \f \r).
_SHORT_ESCAPES = frozenset("\b\t\n\f\r")


def _rewritten(value: Any) -> bool:
    """Whether Spark's text of a non-string JSON value may differ from orjson's: it
    writes numbers anew in Java's notation (1.0E20) and other control characters as
    upper-case \\u escapes."""
    if isinstance(value, float):
        return True
    if isinstance(value, str):
        return any(c < " " and c not in _SHORT_ESCAPES for c in value)
    if isinstance(value, dict):
        return any(_rewritten(k) or _rewritten(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_rewritten(v) for v in value)
    return False


def _date(value: Any) -> date:
    m = _DATE_TEXT.fullmatch(value) if type(value) is str else None
    if m is not None:
        try:
            return date(*(int(g) for g in m.groups()))
        except ValueError:
            pass
    raise _refuse(value, "a date")


def _timestamp(value: Any) -> datetime:
    m = _TIMESTAMP_TEXT.fullmatch(value) if type(value) is str else None
    if m is None:
        raise _refuse(value, "a timestamp")
    year, month, day, hour, minute, second, fraction, zone = m.groups()
    # Without a zone, the session's (UTC) applies.
    offset = timedelta(0)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        offset = sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    try:
        local = datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0),
                         int(second or 0), int((fraction or "0").ljust(6, "0")),
                         tzinfo=timezone(offset))
        return local.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise _refuse(value, "a timestamp") from exc


def _binary(value: Any) -> bytes:
    if type(value) is str:
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            pass
    raise _refuse(value, "base64")


def arrow_applies(rule: KeyRule, *, shape: RowShape, table: ReplicaTable, sources: Sources,
                  cutovers: list, limit: int) -> bool:
    """Whether the batch is small, without DDL, into a replica whose commit delta-rs
    makes: row changes into a keyed replica (`arrow_rows`, after `above_marks` of the
    truncates it holds), truncates too into a new one without history (nothing below
    them to delete), or any changes into an append-only one (`appended_rows`), computed
    as Spark's apply would."""
    survey, props, new = shape.survey, table.props, table.new
    if (cutovers or survey.ddl or sources.dropped
            or not arrow_commits(props if new is None else new.properties, survey.rows,
                                 limit, truncates=False)):
        return False
    # An append-only replica logs a truncate as a row of its own: no delete below it.
    if rule.append:
        return True
    # A snapshot ends with a truncate, so a replica's first batch usually holds one.
    new_marks = new is not None and not shape.route.history
    return not shape.route.key_columns and (not survey.truncates or new_marks)


def above_marks(changes: pa.Table, marks: list[tuple[str, str, tuple]]) -> pa.Table:
    """`changes` without those at or below their source table's latest truncate marker
    (`marks`: `delta_log.stored_truncates`, or a new replica's batch truncates), as
    Spark's apply joins them: the source had removed those rows already. The truncates
    themselves stay: they are the replica's markers."""
    if not marks or not changes.num_rows:
        return changes
    import pyarrow as pa

    latest: dict[tuple[str, str], tuple] = {}
    for db, table, position in marks:
        latest[(db, table)] = max(latest.get((db, table), position), position)
    data = changes.select(["table", "op", *(source for _, _, source in POSITION_FIELDS)]
                          ).to_pydict()
    tables = data["table"]
    positions = zip(*(data[source] for _, _, source in POSITION_FIELDS), strict=True)
    keep = []
    for table, op, position in zip(tables, data["op"], positions, strict=True):
        mark = latest.get(split_table(table))
        if mark is not None and None in position:
            raise NeedsSpark(f"a change of {table} without a position")
        keep.append(mark is None or op == OP_TRUNCATE or position > mark)
    return changes if all(keep) else changes.filter(pa.array(keep))


def batch_changes(pipeline: PipelineConfig, after_version: int | None, up_to: int,
                  survey: Survey, rule: KeyRule, without_topics: list[str] = ()) -> pa.Table:
    """The batch's changes of the replica's source tables, read once for the replica
    and its history table: row changes, with the truncates where the batch has some,
    or every merged op for an append-only replica; without the rows of the loads the
    replica holds (`without_topics`)."""
    from deltalake.exceptions import DeltaError

    try:
        return changes_of(pipeline, after_version, up_to, survey.tables,
                          MERGED_OPS if rule.append or survey.truncates else ROW_OPS,
                          without_topics)
    except DeltaError as exc:
        # Versions no longer in the log, say: Spark's read of them checks and says so.
        raise NeedsSpark(f"the changelog's versions: {exc}") from exc


def arrow_rows(changes: pa.Table, survey: Survey, rule: KeyRule, columns: dict[str, T.DataType],
               schema: pa.Schema | T.StructType, now: datetime) -> pa.Table:
    """The batch's rows for the replica, typed into `schema` (the replica's Arrow
    schema, or the Spark schema of a replica about to be created): reduced to one per
    key, or every change once for an append-only replica."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if isinstance(schema, T.StructType):
        schema = to_arrow_schema(schema, timezone="UTC")
    if rule.append:
        return appended_rows(changes, survey, columns, schema, now)
    return reduced_rows(changes, survey, rule.key, columns, schema, now)


def appended_rows(changes: pa.Table, survey: Survey, columns: dict[str, T.DataType],
                  schema: pa.Schema, now: datetime) -> pa.Table:
    """Each change among `changes` once (of copies with the same binlog coordinates,
    the first by Kafka offset), as rows of an append-only replica typed into `schema`:
    the after-image, a delete's before-image, nulls for a truncate."""
    import pyarrow as pa

    spellings = column_spellings(columns, survey)
    convert = {name: converter(t) for name, t in columns.items()}
    data = {name: changes.column(name).to_pylist() for name in changes.schema.names}
    ops, tables = data["op"], data["table"]
    positions = list(zip(*(data[source] for _, _, source in POSITION_FIELDS), strict=True))
    firsts: dict[tuple, int] = {}
    for i, _, _ in _keyed(data, positions, [], spellings, convert):
        change = (tables[i], *change_identity(positions[i]))
        first = firsts.get(change)
        if first is None or positions[i] < positions[first]:
            firsts[change] = i
    plan = _column_plan(schema, spellings, convert)
    out: list[list] = [[] for _ in plan]
    for i in sorted(firsts.values()):
        image = _json(_image(data, i, ops[i])) or {}
        meta = _meta(data, positions, i, now)
        for column, (kind, arg, cast) in zip(out, plan, strict=True):
            column.append(cast(_first(image, arg)) if kind == "image" else meta[kind])
    return pa.table([pa.array(column, type=schema.field(i).type)
                     for i, column in enumerate(out)], schema=schema)


def change_identity(position: tuple) -> tuple:
    """`columns.change_identity` of a position tuple (in `POSITION_FIELDS` order): the
    binlog coordinates, the Kafka offset and row only for a source without them."""
    phase, file, pos, row, offset, row_index = position
    no_coordinates = file == 0 and pos == 0
    return (phase, file, pos, row, offset if no_coordinates else -1,
            row_index if no_coordinates else -1)


def reduced_rows(changes: pa.Table, survey: Survey, key: list[str],
                 columns: dict[str, T.DataType], schema: pa.Schema, now: datetime
                 ) -> pa.Table:
    """Per key, the change of highest position among `changes` (changelog rows of the
    replica's tables), typed into the replica's Arrow `schema`, `_applied_at` = `now`.
    A truncate's key is null, as in Spark's reduce: one marker per source table of a
    sharded replica, the highest of all otherwise."""
    import pyarrow as pa

    source_key = [k for k in key if k not in SOURCE_KEY_COLUMNS]
    if not source_key and survey.truncates:
        raise NeedsSpark("a truncate into a replica without a key")
    sharded = len(key) > len(source_key)
    spellings = column_spellings(columns, survey)
    convert = {name: converter(t) for name, t in columns.items()}
    data = {name: changes.column(name).to_pylist() for name in changes.schema.names}
    ops, tables = data["op"], data["table"]
    positions = list(zip(*(data[source] for _, _, source in POSITION_FIELDS), strict=True))
    # group -> (row, typed key values, parsed image or None)
    winners: dict[tuple, tuple[int, list, dict | None]] = {}
    for i, values, image in _keyed(data, positions, source_key, spellings, convert):
        group = (*split_table(tables[i]), *values) if sharded else tuple(values)
        best = winners.get(group)
        if best is None or positions[i] > positions[best[0]]:
            winners[group] = (i, values, image)
    plan = _column_plan(schema, spellings, convert,
                        dict(zip(source_key, range(len(source_key)), strict=True)))
    out: list[list] = [[] for _ in plan]
    for i, values, image in winners.values():
        if image is None:
            image = _json(_image(data, i, ops[i])) or {}
        meta = _meta(data, positions, i, now)
        for column, (kind, arg, cast) in zip(out, plan, strict=True):
            if kind == "key":
                column.append(values[arg])
            elif kind == "image":
                column.append(cast(_first(image, arg)))
            else:
                column.append(meta[kind])
    return pa.table([pa.array(column, type=schema.field(i).type)
                     for i, column in enumerate(out)], schema=schema)


def _keyed(data: dict[str, list], positions: list[tuple], source_key: list[str],
           spellings: dict[str, list[str]], convert: dict[str, Callable[[Any], Any]]
           ) -> Iterator[tuple[int, list, dict | None]]:
    """(row, typed key values, parsed image or None) of each change: the key read off
    the record's key, else its image (parsed only then)."""
    ops, offsets = data["op"], data["offset"]
    key_spellings = [(k, spellings[k.lower()], convert[k]) for k in source_key]
    for i, record_text in enumerate(data["key"]):
        if None in positions[i]:
            raise NeedsSpark(f"a change at offset {offsets[i]} without a position")
        if ops[i] == OP_TRUNCATE:
            yield i, [None] * len(key_spellings), {}
            continue
        if not key_spellings:
            yield i, [], None
            continue
        record = _json(record_text) or {}
        image = None
        values = []
        for column, names, cast in key_spellings:
            value = record.get(column)
            if value is None:
                if image is None:
                    image = _json(_image(data, i, ops[i])) or {}
                value = _first(image, names)
            value = cast(value)
            if value is None:
                raise NeedsSpark(f"a change at offset {offsets[i]} without its key")
            values.append(value)
        yield i, values, image


def history_changes(changes: pa.Table, survey: Survey, key: list[str],
                    columns: dict[str, T.DataType], now: datetime) -> list[dict[str, Any]]:
    """Every row change among `changes` as a version of the history table (before its
    `_valid_to` and `_is_current`), typed as `history.merge_history` types them."""
    source_key = [k for k in key if k not in SOURCE_KEY_COLUMNS]
    spellings = column_spellings(columns, survey)
    convert = {name: converter(t) for name, t in columns.items()}
    data = {name: changes.column(name).to_pylist() for name in changes.schema.names}
    positions = list(zip(*(data[source] for _, _, source in POSITION_FIELDS), strict=True))
    out = []
    for i, values, image in _keyed(data, positions, source_key, spellings, convert):
        if image is None:
            image = _json(_image(data, i, data["op"][i])) or {}
        db, table, op, position, source_ts, applied_at = _meta(data, positions, i, now)
        row = {"_source_db": db, "_source_table": table,
               **{name: cast(_first(image, spellings[name.lower()]))
                  for name, cast in convert.items() if name not in source_key},
               **dict(zip(source_key, values, strict=True)),
               "_valid_from": position, "_op": op, "_source_ts": source_ts,
               "_applied_at": applied_at}
        out.append(row)
    return out


def _column_plan(schema: pa.Schema, spellings: dict[str, list[str]],
                 convert: dict[str, Callable[[Any], Any]], keyed: dict[str, int] | None = None
                 ) -> list[tuple]:
    """How each replica column is filled, decided once: (metadata index, ...), ("key",
    index in the key values, ...) or ("image", the column's spellings, its converter)."""
    plan: list[tuple] = []
    for name in schema.names:
        if name in _META:
            plan.append((_META[name], None, None))
        elif keyed and name in keyed:
            plan.append(("key", keyed[name], None))
        elif name in convert:
            plan.append(("image", spellings[name.lower()], convert[name]))
        else:
            raise NeedsSpark(f"replica column {name!r} the batch does not shape")
    return plan


_FIELD_NAMES = [n for n, _, _ in POSITION_FIELDS]


def _meta(data: dict[str, list], positions: list[tuple], i: int, now: datetime) -> tuple:
    """A change's metadata columns, in `_META`'s order."""
    db, table = split_table(data["table"][i])
    ts = data["source_ts"][i]
    return (db, table, data["op"][i], dict(zip(_FIELD_NAMES, positions[i], strict=True)),
            None if ts is None else _EPOCH + timedelta(milliseconds=ts), now)


# Replica metadata columns -> their index in a change's metadata tuple.
_META = {"_source_db": 0, "_source_table": 1, "_op": 2, "_position": 3, "_source_ts": 4,
         "_applied_at": 5}


def _image(data: dict[str, list], i: int, op: str) -> str | None:
    """A change's row values: the after-image, the before-image of a delete."""
    return data["before" if op == OP_DELETE else "after"][i]


def _first(image: dict, names: list[str]) -> Any:
    """The value under the first of `names` the image holds non-null."""
    for name in names:
        value = image.get(name)
        if value is not None:
            return value
    return None


def _json(text: str | None) -> dict | None:
    """A JSON object's text, parsed; None for null."""
    if text is None:
        return None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise NeedsSpark("an image or key that is not JSON") from exc
    if doc is not None and not isinstance(doc, dict):
        raise NeedsSpark("an image or key that is not a JSON object")
    return doc
