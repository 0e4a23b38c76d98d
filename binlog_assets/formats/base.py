"""What every format decoder shares: the `decode` entry point and the rules common to all.

`ChangeDecoder.decode` is the one interface callers see. It counts Kafka tombstones,
turns any unexpected failure inside a format's `_decode` into a `DecodeError` (so a bad
message never escapes as a bare KeyError or TypeError), and gives each format the same
helpers: per-table primary-key overrides, a cache of binlog file name -> numeric index,
the split of an update that changed a row's primary key into delete + create, a table's
snapshot end, and the check that no JSON number of a row lost digits on its way through
a double.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any, ClassVar

import orjson

from binlog_assets.formats.event import (
    OP_CREATE,
    OP_DELETE,
    OP_TRUNCATE,
    SNAPSHOT_END_ROW,
    ChangeEvent,
    DecodeError,
    Position,
    SourceUnavailableError,
    binlog_file_index,
)

Headers = list[tuple[str, bytes]]
# One Kafka record as a decoder reads it: (value, topic, partition, offset, key, headers).
# A plain tuple: `decode` builds one per record, where a NamedTuple's constructor showed in
# the decode rate (bench/RESULTS.md, "P1 pipeline throughput").
KafkaRecord = tuple[bytes, str, int, int, bytes | None, Headers | None]

# Binlog files rotate, so the name cache only grows slowly; the bound guards a
# pathological stream of distinct names.
_MAX_CACHED_FILES = 10_000
# A table config's `source` that is a plain `db.table` (as `lakehouse/replica/routes.py` reads it).
_EXACT_NAME = re.compile(r"[\w$]+\.[\w$]+")

# orjson parses a JSON number with a fraction or an exponent, or an integer outside the
# 64-bit ranges, into a double. One of at most 15 digits comes back from the double as
# written; a longer one (a DECIMAL(20,2) sent as a number) may not. In the shape of the
# text (number characters as 0, the rest blank) such a number is a run of at least 17:
# 16 digits and a point, sign or exponent, or 20 digits. Runs of 17 to 19 digits alone are
# integers orjson keeps exactly (Debezium's `ts_ns` is one in every record).
_NUMBER_SHAPE = bytes(ord("0") if c in b"0123456789.-+eE" else ord(" ") for c in range(256))
_LONG_RUN = b"0" * 17
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


def long_number_in(raw: bytes) -> bool:
    """Whether `raw` holds a JSON number orjson may round (or text that looks like one)."""
    shape = raw.translate(_NUMBER_SHAPE)
    start = shape.find(_LONG_RUN)
    while start >= 0:
        end = shape.find(b" ", start)
        run = raw[start:end] if end >= 0 else raw[start:]
        if len(run) >= 20 or not run.isdigit():
            return True
        start = shape.find(_LONG_RUN, end) if end >= 0 else -1
    return False


def may_have_lost_digits(raw: bytes, *images: Any) -> bool:
    """Whether orjson may have rounded a value of `images` (row images it parsed from
    `raw`): they hold a double, and `raw` has a number too long for one. A long number
    inside a string only costs the exact parse of `loads_exact`."""
    for image in images:
        if type(image) is dict and float in map(type, image.values()):
            return long_number_in(raw)
    return False


def _exact_float(text: str) -> float | Decimal:
    value = float(text)
    # A double that prints back as the same number (a FLOAT or DOUBLE column's value, a
    # short decimal) stays a double; anything else keeps its digits.
    if math.isfinite(value) and Decimal(repr(value)) == Decimal(text):
        return value
    return Decimal(text)


def _exact_int(text: str) -> int | Decimal:
    value = int(text)
    # Past 64 bits an integer is a Decimal: the changelog's JSON writer takes no wider int.
    return value if _INT64_MIN <= value <= _UINT64_MAX else Decimal(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def loads_exact(data: bytes) -> Any:
    """`data` parsed as JSON with every number's value kept: a number a double would
    round becomes a Decimal (an integer past 64 bits too). The standard library's
    parser, several times orjson's cost: for records `may_have_lost_digits` flags.
    Raises ValueError for invalid JSON."""
    return json.loads(data, parse_float=_exact_float, parse_int=_exact_int,
                      parse_constant=_no_constant)


class ChangeDecoder:
    """Base of the format decoders; subclasses set `name` and implement `_decode`."""

    name: ClassVar[str] = ""

    def __init__(self, key_columns: Mapping[str, Sequence[str]] | None = None) -> None:
        """`key_columns` maps a table to its key columns, overriding the record's: by its
        `db.table` name, or by a regex fully matching the names (a table config's
        `source`, read as the replica routing reads it)."""
        self.skipped: Counter[str] = Counter()
        # Snapshots that ended in the records decoded since the caller last emptied it:
        # (the position they read at, their producer's schema-change topic).
        self.snapshots_ended: list[tuple[Position, str]] = []
        # Exact names, then table -> the first matching pattern's columns (None: no
        # match), filled as tables appear.
        self._key_overrides: dict[str, tuple[str, ...] | None] = {}
        self._key_patterns: list[tuple[re.Pattern[str], tuple[str, ...]]] = []
        for table, columns in (key_columns or {}).items():
            if isinstance(columns, str):
                raise ValueError(f"key_columns[{table!r}] must be a list of column names")
            if _EXACT_NAME.fullmatch(table):
                self._key_overrides[table] = tuple(columns)
            else:
                self._key_patterns.append((re.compile(table), tuple(columns)))
        self._binlog_files: dict[str, int] = {}

    def _key_override(self, table: str) -> tuple[str, ...] | None:
        """The configured key columns of `table`, None when the record's own decide."""
        try:
            return self._key_overrides[table]
        except KeyError:
            pass
        columns = next((c for p, c in self._key_patterns if p.fullmatch(table)), None)
        # Tables are few and long-lived; the bound guards a stream of distinct names.
        if len(self._key_overrides) < _MAX_CACHED_FILES:
            self._key_overrides[table] = columns
        return columns

    def decode(
        self,
        value: bytes | None,
        *,
        topic: str = "",
        partition: int = 0,
        offset: int = -1,
        key: bytes | None = None,
        headers: Headers | None = None,
    ) -> list[ChangeEvent]:
        """Decode one Kafka record into its row changes; [] for records that are not changes."""
        if value is None:
            return self._skip("tombstone")
        try:
            return self._decode((value, topic, partition, offset, key, headers))
        except (DecodeError, SourceUnavailableError):
            raise
        except Exception as exc:  # a decode boundary: any surprise means a malformed record
            raise DecodeError(
                f"{self.name}: malformed record: {type(exc).__name__}: {exc}"
            ) from exc

    def _decode(self, record: KafkaRecord) -> list[ChangeEvent]:
        raise NotImplementedError

    def _load_object(self, value: bytes, *, exact: bool = False) -> dict[str, Any]:
        """The record value as a JSON object, or a DecodeError saying what it is instead;
        `exact` parses it with `loads_exact`."""
        try:
            doc = loads_exact(value) if exact else orjson.loads(value)
        except ValueError as exc:  # orjson.JSONDecodeError is one
            raise self._fail(f"value is not valid JSON: {exc}") from None
        if type(doc) is not dict:
            raise self._fail("value must be a JSON object")
        return doc

    def _required_str(self, doc: dict[str, Any], name: str) -> str:
        value = doc.get(name)
        if value is None:
            raise self._fail(f"missing field '{name}'")
        if type(value) is not str:
            raise self._fail(f"field '{name}' must be a string")
        return value

    def _skip(self, reason: str) -> list[ChangeEvent]:
        self.skipped[reason] += 1
        return []

    def _fail(self, message: str) -> DecodeError:
        return DecodeError(f"{self.name}: {message}")

    def _binlog_index(self, file_name: Any, field: str) -> int:
        index = self._binlog_files.get(file_name) if type(file_name) is str else None
        if index is None:
            if type(file_name) is not str:
                raise self._fail(f"field {field!r} must be a binlog file name")
            try:
                index = binlog_file_index(file_name)
            except DecodeError as exc:
                raise self._fail(f"field {field!r}: {exc}") from None
            if len(self._binlog_files) >= _MAX_CACHED_FILES:
                self._binlog_files.clear()
            self._binlog_files[file_name] = index
        return index

    def _table(self, database: Any, table: Any, db_field: str, table_field: str) -> str:
        if not database or type(database) is not str:
            raise self._fail(f"missing or invalid field {db_field!r}")
        if not table or type(table) is not str:
            raise self._fail(f"missing or invalid field {table_field!r}")
        return f"{database}.{table}"

    def _declared_key_columns(self, declared: Any, field: str) -> tuple[str, ...]:
        if declared is None:
            return ()
        if type(declared) is not list or not all(type(column) is str for column in declared):
            raise self._fail(f"field {field!r} must be a list of column names or null")
        return tuple(declared)

    def _row_key(self, image: dict[str, Any], columns: tuple[str, ...], image_name: str) -> tuple:
        try:
            key = tuple([image[column] for column in columns])
        except KeyError as exc:
            raise self._fail(
                f"key column {exc.args[0]!r} missing from {image_name!r}"
            ) from None
        try:
            hash(key)
        except TypeError:
            # A JSON array or object is no primary-key value, and the lanes could not
            # route the event by it: the record is dead-lettered instead.
            bad = next(c for c, v in zip(columns, key, strict=True) if type(v) in (list, dict))
            raise self._fail(f"key column {bad!r} of {image_name!r} holds a "
                             f"{type(image[bad]).__name__}, not a value") from None
        return key


def split_key_change(update: ChangeEvent, old_key: tuple) -> list[ChangeEvent]:
    """An update that moved a row to a new primary key: delete the old key, create the new.

    Keyed downstream state (lanes, the replica MERGE) addresses rows by key, so the old
    key must disappear; the create follows at the next row index of the same record.
    """
    delete = replace(update, op=OP_DELETE, key=old_key, after=None)
    create = replace(update, op=OP_CREATE, before=None, row_index=update.row_index + 1)
    return [delete, create]


def snapshot_end(last_row: ChangeEvent) -> ChangeEvent:
    """The end of a table's snapshot, after the last row it read: a truncate of the table
    just below the snapshot's rows, so that the table keeps only what the snapshot read
    (a row deleted at the source while the snapshot was not running is deleted)."""
    return ChangeEvent(last_row.table, OP_TRUNCATE, (), (), None, None,
                       last_row.position._replace(row=SNAPSHOT_END_ROW), last_row.source_ts,
                       last_row.topic, last_row.partition, last_row.offset,
                       last_row.row_index + 1)
