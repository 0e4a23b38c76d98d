"""What one changelog commit holds: its columns, each event as a row, and the commit's
metadata (its tag and the survey of its rows that replica builds plan from).

The columns and how replica builds read them: docs/architecture.md, "The changelog".
"""

from __future__ import annotations

from base64 import b64encode
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson

from binlog_assets.formats.event import ChangeEvent
from binlog_assets.formats.mysql_types import infer_types

if TYPE_CHECKING:
    from arro3.core import Schema, Table

# The changelog's columns and their Delta (Spark SQL) types; `changelog_reader` builds
# the Spark schema from the same list, so the two sides cannot drift apart.
CHANGELOG_COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("row_index", "int"),
    ("table", "string"),
    ("op", "string"),
    ("key", "string"),
    ("key_columns", "array<string>"),
    ("before", "string"),
    ("after", "string"),
    ("pos_phase", "int"),
    ("pos_file", "bigint"),
    ("pos_pos", "bigint"),
    ("pos_row", "int"),
    ("source_ts", "bigint"),
    ("ddl", "string"),
    ("column_types", "string"),
    ("value_types", "string"),
    ("raw", "binary"),
    ("ingested_at", "timestamp"),
    # Who wrote the change, as the producer says (added after the first release: a table
    # made before has them added, null for its older rows).
    ("server_id", "bigint"),
    ("gtid", "string"),
)
# Columns a changelog made before them lacks; the writer adds them on open.
ADDED_COLUMNS = (("server_id", "bigint"), ("gtid", "string"))


def _json_default(value: Any) -> Any:
    # Exact text for decimals (a JSON number would pass through a double), in plain digits
    # (str() writes 1E-7), and base64 for bytes; the replica casts both back by the
    # column's type.
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bytes | bytearray | memoryview):
        return b64encode(bytes(value)).decode("ascii")
    return str(value)


def to_json(value: Any) -> str | None:
    """`value` as JSON text for the changelog (None stays None)."""
    if value is None:
        return None
    return orjson.dumps(value, default=_json_default).decode()


# The JSON text of type maps seen before: every row of a table repeats the same few,
# and serializing them was a fifth of the changelog's per-event work. Bounded: a
# producer could vary them without end.
_TYPES_TEXT: dict[tuple, str] = {}
_DECLARED_TEXT: dict[int, tuple[Mapping[str, str], str]] = {}  # id -> (the map, its text)
_MAX_TYPES_TEXT = 1024


def _remembered(memo: dict, key: Any, value: Any) -> Any:
    if len(memo) >= _MAX_TYPES_TEXT:
        memo.clear()
    memo[key] = value
    return value


def _declared_json(column_types: Mapping[str, str]) -> str:
    """`to_json(column_types)`; a decoder shares one map among the events of a schema."""
    seen = _DECLARED_TEXT.get(id(column_types))
    if seen is not None and seen[0] is column_types:
        return seen[1]
    text = to_json(column_types)
    # The map is kept alive with its text, so its id cannot be reused meanwhile.
    return _remembered(_DECLARED_TEXT, id(column_types), (column_types, text))[1]


def _value_types(event: ChangeEvent) -> str | None:
    types = infer_types((event.before, event.after), event.column_types)
    if not types:
        return None
    key = tuple(types.items())
    text = _TYPES_TEXT.get(key)
    return text if text is not None else _remembered(_TYPES_TEXT, key, to_json(types))


def event_row(event: ChangeEvent, raw: bytes | None, ingested_at: datetime) -> tuple:
    """One changelog row, in `changelog_schema()` order."""
    position = event.position
    # DDL events name the key columns but carry no key values.
    key = dict(zip(event.key_columns, event.key, strict=True)) if event.key else None
    declared = event.column_types
    return (
        event.topic, event.partition, event.offset, event.row_index, event.table, event.op,
        to_json(key), list(event.key_columns), to_json(event.before), to_json(event.after),
        position.lineage, position.file, position.pos, position.row, event.source_ts,
        event.ddl, _declared_json(declared) if declared else None,
        _value_types(event), raw, ingested_at, event.server_id, event.gtid,
    )


# Each commit's `userMetadata` is a JSON object: its `tag` (see `ChangelogWriter.write`)
# and `survey`, a summary of the commit's rows that lets a replica build learn what a
# range of commits holds from the Delta log instead of scanning it: one entry per
# (table, op, column_types, value_types, key_columns) with its row count and highest
# position. A commit with more distinct entries than this carries none, and a range
# with such a commit (or one written by anything else) is scanned (`read_survey`).
SURVEY_MAX_GROUPS = 256
# Nor does one whose survey would take more than this much of the Delta log (wide tables'
# declared types): every commit's metadata is read again by history and log replays.
# A commit of several partitions' ranges (`write_many`) has both bounds once per
# partition: as much as the commits of each range alone would have.
SURVEY_MAX_BYTES = 64 * 1024
# A range of more commits than this is scanned rather than read from the log.
SURVEY_MAX_COMMITS = 2000
# The Delta operation of the table's creation (delta-rs and Spark alike): it adds no rows.
CREATE_OPERATION = "CREATE TABLE"

# event_row indexes of what the survey keeps.
_ROW_OFFSET, _ROW_INDEX, _ROW_TABLE, _ROW_OP, _ROW_KEY_COLUMNS = 2, 3, 4, 5, 7
_ROW_POSITION = slice(10, 14)
_ROW_COLUMN_TYPES, _ROW_VALUE_TYPES = 16, 17
_ROW_SOURCE_TS = 14
_ROW_SERVER_ID, _ROW_GTID = 20, 21


def survey_of_rows(rows: Sequence[tuple], max_groups: int = SURVEY_MAX_GROUPS
                   ) -> list[list] | None:
    """The survey of `event_row` tuples: [table, op, column_types, value_types,
    key_columns, rows, last position (phase, file, pos, row, offset, row_index)] per
    group, or None past `max_groups` groups."""
    groups: dict[tuple, list] = {}
    for r in rows:
        group = (r[_ROW_TABLE], r[_ROW_OP], r[_ROW_COLUMN_TYPES], r[_ROW_VALUE_TYPES],
                 tuple(r[_ROW_KEY_COLUMNS]))
        position = (*r[_ROW_POSITION], r[_ROW_OFFSET], r[_ROW_INDEX])
        entry = groups.get(group)
        if entry is None:
            if len(groups) >= max_groups:
                return None
            groups[group] = [1, position]
        else:
            entry[0] += 1
            if position > entry[1]:
                entry[1] = position
    return [[*g[:4], list(g[4]), n, list(last)] for g, (n, last) in groups.items()]


def source_times(rows: Sequence[tuple]) -> dict[str, int]:
    """Per source table of `event_row` tuples, the latest source commit time (ms)."""
    times: dict[str, int] = {}
    for r in rows:
        ts = r[_ROW_SOURCE_TS]
        if ts is not None and ts > times.get(r[_ROW_TABLE], -1):
            times[r[_ROW_TABLE]] = ts
    return times


def source_origins(rows: Sequence[tuple]) -> dict[str, list]:
    """Per source table of `event_row` tuples, where its furthest change was written:
    [position (lineage, file, pos, row), server id, GTID], for tables whose producer says."""
    origins: dict[str, list] = {}
    for r in rows:
        if r[_ROW_SERVER_ID] is None and r[_ROW_GTID] is None:
            continue
        position = list(r[_ROW_POSITION])
        seen = origins.get(r[_ROW_TABLE])
        if seen is None or position > seen[0]:
            origins[r[_ROW_TABLE]] = [position, r[_ROW_SERVER_ID], r[_ROW_GTID]]
    return origins


def commit_metadata(tag: str, survey: list[list] | None,
                    times: dict[str, int] | None = None,
                    max_bytes: int = SURVEY_MAX_BYTES,
                    origins: dict[str, list] | None = None,
                    loaded: dict[str, int] | None = None) -> str:
    """A changelog commit's `userMetadata`: the survey, the tables' latest source times
    (`times`), the origins of their furthest changes (`origins`) and the rows of the
    survey that a direct load's replica holds already, by the load's topic (`loaded`),
    left out when the survey is None or larger than `max_bytes`."""
    bare = orjson.dumps({"tag": tag}).decode()
    if survey is None:
        return bare
    doc = {"tag": tag, "survey": survey}
    if times:
        doc["times"] = times
    if origins:
        doc["origins"] = origins
    if loaded:
        doc["loaded"] = loaded
    full = orjson.dumps(doc).decode()
    return full if len(full) <= max_bytes else bare


def tag_topic(tag: str) -> str | None:
    """The topic of a consumer write's tag `group/topic/partition@end,…#id` (its first
    partition's: a commit holds one source's partitions)."""
    txn = tag.split("@", 1)[0]
    parts = txn.split("/")
    return "/".join(parts[1:-1]) if len(parts) >= 3 else None


def commit_doc(metadata: str | None) -> dict[str, Any]:
    if not metadata:
        return {}
    try:
        doc = orjson.loads(metadata)
    except orjson.JSONDecodeError:
        return {"tag": metadata}  # a plain tag, as written before surveys
    return doc if type(doc) is dict else {}


def changelog_arrow_schema() -> Schema:
    from arro3.core import DataType, Field, Schema

    types = {
        "string": DataType.string(), "int": DataType.int32(), "bigint": DataType.int64(),
        "binary": DataType.binary(), "array<string>": DataType.list(DataType.string()),
        "timestamp": DataType.timestamp("us", tz="UTC"),
    }
    return Schema([Field(name, types[t], nullable=True) for name, t in CHANGELOG_COLUMNS])


def arrow_table(rows: Sequence[tuple], ingested_at: datetime) -> Table:
    """`event_row` tuples as one Arrow table in the changelog's schema."""
    from arro3.core import Array, DataType, Table, list_array

    schema = changelog_arrow_schema()
    n = len(rows)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(CHANGELOG_COLUMNS)
    arrays = []
    for (_name, kind), field, values in zip(CHANGELOG_COLUMNS, schema, columns, strict=True):
        if kind == "array<string>":
            offsets, flat = [0], []
            for items in values:
                flat.extend(items)
                offsets.append(len(flat))
            arrays.append(list_array(Array(offsets, DataType.int32()),
                                     Array(flat, DataType.string())))
        elif kind == "timestamp":
            # One timestamp for the whole commit (`event_row` is given one `ingested_at`).
            micros = int(ingested_at.timestamp() * 1_000_000)
            arrays.append(Array([micros] * n, DataType.int64()).cast(field.type))
        else:
            arrays.append(Array(list(values), field.type))
    return Table.from_arrays(arrays, schema=schema)
