"""Chunks of a table by ranges of its key: the SQL that walks and selects them on the
source, and the assignment of replica rows to the same ranges.

Chunk i holds the keys in (lower, upper]; the first has no lower bound and the last no
upper one, so the chunks cover every key, including keys inserted while the check runs.
A composite key compares as a tuple, written out as `a > x OR (a = x AND b > y)`, which
MariaDB's range optimizer reads as an index range (a row constructor it may not).

A range is only meaningful when the source and Python order keys alike: integers,
decimals, dates and times of day, binary strings and strings of a binary collation. A
key of another type (a case-insensitive string, say) is checked as one chunk.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from binlog_assets.parity.canonical import quote

_ORDERED_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint",
                            "year", "decimal", "numeric", "date", "datetime", "timestamp",
                            "binary", "varbinary"})
_STRINGS = frozenset({"char", "varchar"})

Key = tuple[Any, ...]


def orders_alike(data_type: str, collation: str | None) -> bool:
    """Whether MariaDB orders a key column of this type as Python orders its values."""
    kind = data_type.lower()
    if kind in _ORDERED_TYPES:
        return True
    return kind in _STRINGS and collation is not None and (
        collation.endswith("_bin") or collation == "binary")


@dataclass(frozen=True)
class KeyRange:
    """Keys in (lower, upper]; None: unbounded on that side."""

    lower: Key | None
    upper: Key | None

    def label(self) -> str:
        low = "-inf" if self.lower is None else _text(self.lower)
        high = "+inf" if self.upper is None else _text(self.upper)
        return f"({low}, {high}]"


def _text(key: Key) -> str:
    return ", ".join(str(v) for v in key) if len(key) > 1 else str(key[0])


def _compare(columns: Sequence[str], values: Key, last: str) -> tuple[str, list]:
    """`columns` > `values` (last: '>') or <= (last: '<='), as a tuple, expanded."""
    strict = ">" if last == ">" else "<"
    terms, params = [], []
    for i, column in enumerate(columns):
        eq = [f"{quote(c)} = %s" for c in columns[:i]]
        op = last if i == len(columns) - 1 else strict
        terms.append("(" + " AND ".join([*eq, f"{quote(column)} {op} %s"]) + ")")
        params += [*values[:i], values[i]]
    return "(" + " OR ".join(terms) + ")", params


def range_sql(columns: Sequence[str], key_range: KeyRange) -> tuple[str, list]:
    """The WHERE text and its parameters selecting `key_range`."""
    parts, params = [], []
    if key_range.lower is not None:
        sql, p = _compare(columns, key_range.lower, ">")
        parts.append(sql)
        params += p
    if key_range.upper is not None:
        sql, p = _compare(columns, key_range.upper, "<=")
        parts.append(sql)
        params += p
    return (" AND ".join(parts) or "TRUE"), params


def next_upper_sql(table: str, columns: Sequence[str], lower: Key | None, rows: int
                   ) -> tuple[str, list]:
    """The key `rows` keys past `lower` in key order (an index walk, as pt-table-checksum's
    nibbling): the chunk's upper bound; no row: the chunk is the last."""
    where, params = range_sql(columns, KeyRange(lower, None))
    order = ", ".join(quote(c) for c in columns)
    return (f"SELECT {order} FROM {table} WHERE {where} ORDER BY {order} "
            f"LIMIT 1 OFFSET {int(rows) - 1}", params)


def key_value(value: Any) -> Any:
    """A key value as both sides compare it: instants as naive UTC (the source session's
    time zone is UTC, the replica's timestamps are UTC), integral decimals as ints."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def chunk_index(uppers: Sequence[Key | None], key: Key) -> int:
    """The chunk holding `key`, given the chunks' upper bounds in order (the last None)."""
    bounded = uppers[:-1] if uppers and uppers[-1] is None else uppers
    return bisect.bisect_left(bounded, key)
