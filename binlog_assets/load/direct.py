"""A load written straight into its replica, beside the changelog (the replica's record of
it: `lakehouse/replica/loads.py`).

Through the changelog alone, a loaded table is read once by the load, then parsed from
JSON, reduced and typed again by Spark's apply. Here each chunk's rows are committed to
the changelog under the load's topic, then typed as Arrow by the worker that read them
and appended to the replica by delta-rs, with the worker slot's transaction, so a chunk
reaches each table once. `prepare_direct` makes the replica ready first (an ordinary
apply of the load's first chunk where it does not exist yet) and records the load as
loading, so no apply writes it until `finish_direct`. Rows of keys the replica held
before (the stream's first changes, the first chunk) and values the typing here does not
reproduce exactly go the changelog's way: the apply after the load merges them, with the
position guard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from operator import itemgetter
from typing import TYPE_CHECKING

import orjson
from pyspark.sql import types as T

from binlog_assets.lakehouse.columns import split_table
from binlog_assets.lakehouse.replica.loads import (
    LOADED,
    LOADING,
    load_topic,
    record_load,
    recorded_loads,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa
    from pyspark.sql import SparkSession

    from binlog_assets.config import PipelineConfig

# Python values whose Arrow conversion is the value Spark's cast of their JSON text
# gives (`replica/rows.cast_text`), by the replica column's type; any other value takes
# the Arrow apply's per-value converter (`arrow_apply.converter`).
_FAST_TYPES: dict[type, type] = {
    T.ByteType: int, T.ShortType: int, T.IntegerType: int, T.LongType: int,
    T.DoubleType: float, T.DecimalType: Decimal, T.StringType: str, T.DateType: date,
    T.TimestampType: datetime, T.TimestampNTZType: datetime, T.BooleanType: bool}
_EPOCH = datetime(1970, 1, 1)
# event_row indexes (`lakehouse/changelog_rows.py`).
_OFFSET, _ROW_INDEX, _TABLE, _OP, _AFTER, _LINEAGE, _FILE, _POS, _ROW, _SOURCE_TS = (
    2, 3, 4, 5, 9, 10, 11, 12, 13, 14)


@dataclass(frozen=True)
class DirectTarget:
    """Where a direct load appends: the replica's table, the load's changelog topic, the
    first chunk written straight (earlier ones went the changelog's way), the replica's
    version before the load appended to it, its key, and its columns' Spark types (JSON,
    as the Delta log holds them)."""

    replica: str
    uri: str
    topic: str
    first: int
    version: int
    key: tuple[str, ...]
    columns: dict[str, str]


def direct_eligible(pipeline: PipelineConfig, replica: str) -> bool:
    """Whether the replica takes a direct load: one source table keyed by its primary
    key, merged, without a history table."""
    from binlog_assets.lakehouse.replica.routes import replica_route

    route = replica_route(pipeline, replica)
    return (not route.sharded and not route.key_columns and not route.history
            and route.replica_mode == "merge")


class ReplicaAppend:
    """One worker's side of a direct load: the replica's schema and the keys it held when
    the load began (at most a chunk's and the first chunk's: read as of that version,
    whatever a resumed load appended since)."""

    def __init__(self, target: DirectTarget, names: tuple[str, ...]) -> None:
        import pyarrow as pa
        from deltalake import DeltaTable

        self.target = target
        table = DeltaTable(target.uri, version=target.version)
        self.schema = pa.schema(table.schema().to_arrow())
        held = pa.table(table.to_pyarrow_table(columns=list(target.key)))
        self.held = set(zip(*(held.column(k).to_pylist() for k in target.key), strict=True))
        by_lower = {n.lower(): i for i, n in enumerate(names)}
        self.types = {n: T._parse_datatype_json_string(t) for n, t in target.columns.items()}
        missing = [n for n in self.types if n.lower() not in by_lower]
        if missing:
            raise ValueError(f"replica {target.replica}: columns {missing} are not in the "
                             f"loaded table: load it through the changelog")
        self.index = {n: by_lower[n.lower()] for n in self.types}
        self.names = names
        self._held_array: pa.Array | None = None

    def replica_version(self, app_id: str) -> int:
        from deltalake import DeltaTable

        return DeltaTable(self.target.uri).transaction_version(app_id) or 0

    def split(self, rows: list[tuple], values: list[list], now: datetime
              ) -> tuple[list[tuple], pa.Table]:
        """The chunk's changelog rows, read under the load's topic, with those the replica
        does not take now moved back to none; and the replica's rows of the others, typed."""
        import pyarrow as pa

        straight = [True] * len(rows)
        images = _Images(rows)
        by_column = list(zip(*values, strict=True)) or [()] * len(self.names)
        arrays = {name: self._column(name, by_column[self.index[name]], images, straight)
                  for name in self.types}
        for i, held in enumerate(self._held_of(arrays)):
            if held:
                straight[i] = False
        for i, kept in enumerate(straight):
            if not kept:
                rows[i] = ("", *rows[i][1:])
        columns = [arrays[f.name] if f.name in arrays else _meta(f, rows, now)
                   for f in self.schema]
        typed = pa.Table.from_arrays(columns, schema=self.schema)
        return rows, typed.filter(pa.array(straight, type=pa.bool_()))

    def _held_of(self, arrays: dict[str, pa.Array]) -> list[bool]:
        """Per row, whether the replica held its key before the load."""
        import pyarrow as pa
        import pyarrow.compute as pc

        key = self.target.key
        if not self.held:
            return []
        if len(key) == 1:  # by Arrow, not a Python lookup per row
            if self._held_array is None:
                self._held_array = pa.array([k for (k,) in self.held],
                                            type=arrays[key[0]].type)
            return pc.is_in(arrays[key[0]], value_set=self._held_array).to_pylist()
        keys = zip(*(arrays[k].to_pylist() for k in key), strict=True)
        return [k in self.held for k in keys]

    def append(self, typed: pa.Table, app_id: str, version: int) -> None:
        """Appends the chunk's typed rows to the replica with its slot's transaction."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        write_deltalake(self.target.uri, typed, mode="append",
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(app_id, version)]))

    def _column(self, name: str, column: tuple, images: _Images,
                straight: list[bool]) -> pa.Array:
        import pyarrow as pa

        data_type, at = self.types[name], self.index[name]
        arrow_type = self.schema.field(name).type
        kind = _FAST_TYPES.get(type(data_type))
        if kind is not None and _all_of(column, kind):
            try:
                return pa.array(column, type=arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                pass  # a value out of the type's range, say: the exact way below
        # The image names the column as the load read it, whatever case the replica has.
        return pa.array(_converted(self.names[at], data_type, images.parsed(), straight),
                        type=arrow_type)


def _all_of(column: tuple, kind: type) -> bool:
    """Every value of `column` is of type `kind` exactly, or None (a float finite: JSON
    has no NaN, so the changelog's image holds null for one)."""
    types = set(map(type, column))
    types.discard(type(None))
    if not types <= {kind}:
        return False
    return kind is not float or all(math.isfinite(v) for v in column if v is not None)


class _Images:
    """The chunk's after-images as the changelog holds them (JSON), parsed on first use."""

    def __init__(self, rows: list[tuple]) -> None:
        self.rows = rows
        self._parsed: list[dict] | None = None

    def parsed(self) -> list[dict]:
        if self._parsed is None:
            self._parsed = [orjson.loads(r[_AFTER]) if r[_AFTER] else {} for r in self.rows]
        return self._parsed


def _converted(name: str, data_type: T.DataType, images: list[dict], straight: list[bool]
               ) -> list:
    """The column typed from each row's JSON image as the Arrow apply types it; a row
    holding a value only Spark's apply types goes the changelog's way."""
    from binlog_assets.lakehouse.replica.arrow_apply import NeedsSpark, converter

    convert = converter(data_type)
    out = []
    for i, image in enumerate(images):
        value = image.get(name)
        try:
            out.append(convert(value))
        except NeedsSpark:
            straight[i] = False
            out.append(None)
    return out


def _meta(field: pa.Field, rows: list[tuple], now: datetime) -> pa.Array:
    """A replica metadata column of the chunk's rows, as `arrow_apply._meta` fills it."""
    import pyarrow as pa

    n, name = len(rows), field.name
    if name == "_position":
        sources = {"phase": _LINEAGE, "file": _FILE, "pos": _POS, "row": _ROW,
                   "offset": _OFFSET, "row_index": _ROW_INDEX}
        return pa.StructArray.from_arrays(
            [pa.array(list(map(itemgetter(sources[f.name]), rows)), type=f.type)
             for f in field.type], fields=list(field.type))
    if name == "_op":
        return pa.array(list(map(itemgetter(_OP), rows)), type=field.type)
    if name == "_source_ts":
        times = list(map(itemgetter(_SOURCE_TS), rows))
        return pa.array([None if ts is None else _EPOCH + timedelta(milliseconds=ts)
                         for ts in times] if any(t is not None for t in times) else [None] * n,
                        type=field.type)
    if name == "_applied_at":
        return pa.array([now] * n, type=field.type)
    if name in ("_source_db", "_source_table"):
        part = 0 if name == "_source_db" else 1
        # A chunk is of one table: each name split once.
        names = {t: split_table(t)[part] for t in set(map(itemgetter(_TABLE), rows))}
        return pa.array([names[t] for t in map(itemgetter(_TABLE), rows)], type=field.type)
    raise ValueError(f"replica column {name!r}: a direct load does not fill it")


def prepare_direct(spark: SparkSession, pipeline: PipelineConfig, replica: str, load_id: str,
                   first_chunk: Callable[[], object]) -> DirectTarget | None:
    """The replica made ready for the load `load_id` and recorded as loading, or None
    where it goes the changelog's way (not eligible, or a replica holding more than a
    chunk's rows already: a reload). `first_chunk()` loads the plan's first chunk the
    changelog's way; it is called when the replica does not exist yet, to make it."""
    from deltalake import DeltaTable

    from binlog_assets.lakehouse.delta_log import found_detail
    from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
    from binlog_assets.lakehouse.replica.plan import KEY_PROPERTY
    from binlog_assets.lakehouse.replica.tables import source_columns

    if not direct_eligible(pipeline, replica):
        return None
    name = (pipeline.lakehouse.database, replica)
    topic = load_topic(load_id)
    detail = found_detail(spark, *name)
    if detail is None:
        first_chunk()
        ReplicaBuilder(spark, pipeline).apply(replica)
        detail = found_detail(spark, *name)
        if detail is None:  # no rows at all: nothing to load straight
            return None
        first = 1
    else:
        recorded = recorded_loads(dict(detail["properties"] or {})).get(topic)
        if recorded is not None:  # a resumed load
            first = int(recorded["first"])
        elif _stored_rows(str(detail["location"])) > pipeline.load.chunk_rows:
            return None
        else:
            first = 0
    props, location = dict(detail["properties"] or {}), str(detail["location"])
    key = tuple(orjson.loads(props.get(KEY_PROPERTY, "[]")))
    if not key:
        return None
    recorded = recorded_loads(props).get(topic)
    if recorded is None:
        version = DeltaTable(location).version()
        record_load(spark, name, props, topic, state=LOADING, first=first, version=version)
    else:
        version = int(recorded["version"])
    columns = {n: t.json() for n, t in source_columns(spark, name).items()}
    return DirectTarget(replica, location, topic, first, version, key, columns)


def finish_direct(spark: SparkSession, pipeline: PipelineConfig, target: DirectTarget) -> None:
    """Records the load as done: applies of the replica go on, without its rows."""
    from binlog_assets.lakehouse.delta_log import found_detail

    name = (pipeline.lakehouse.database, target.replica)
    props = dict(found_detail(spark, *name)["properties"] or {})
    record_load(spark, name, props, target.topic, state=LOADED, first=target.first,
                version=target.version)


def _stored_rows(location: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(location).to_pyarrow_dataset().count_rows()
