"""The canonical text of a row, computed alike inside the source server (SQL) and over a
replica's rows (Python), and the checksum of a set of rows.

pt-table-checksum's way: each row becomes one text, `CONCAT_WS('#', values..., null
flags)`, hashed by CRC32; a chunk's fingerprint is its row count, the sum and the XOR of
its rows' CRCs (a multiset checksum: the order of rows never matters, and the sum keeps
two equal rows from cancelling as a XOR alone would). The values' text follows the
replica's value rules (README: Exact values), so an exact replica checks equal:

- integers (signed, unsigned, YEAR): decimal digits;
- DECIMAL(p,s): fixed notation with s digits;
- FLOAT, DOUBLE: fixed notation rounded half up to 6 decimals (a float's own text
  differs between MariaDB and Python in its 17th digit and its exponent notation);
- DATE: `YYYY-MM-DD`; DATETIME, TIMESTAMP: `YYYY-MM-DD HH:MM:SS.ffffff`, a TIMESTAMP in
  UTC (the check's session time zone);
- TIME: `[-]HH:MM:SS[.ffffff]`, the fraction only when not zero (`time_text`);
- CHAR, VARCHAR, TEXT, ENUM, SET, JSON: the text as UTF-8, whatever the column's charset;
- BINARY, VARBINARY, BLOB: upper-case hex.

Other types (BIT, spatial) are left out of the text and named in the check's report.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

SEPARATOR = "#"
FLOAT_PLACES = 6
_FLOAT_QUANTUM = Decimal(1).scaleb(-FLOAT_PLACES)

_INTEGERS = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year",
                       "bool", "boolean"})
_TEXTS = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum",
                    "set", "json"})
_BINARIES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
_FLOATS = frozenset({"float", "double", "real"})


def quote(name: str) -> str:
    """A MariaDB identifier, back-quoted (a back quote inside doubled)."""
    return "`" + name.replace("`", "``") + "`"


def source_expression(column: str, data_type: str) -> str | None:
    """The SQL text of one column's value by the rules above (`data_type` as
    information_schema.columns.DATA_TYPE spells it); None for a type left out. Written
    for a DB-API driver with `%s` parameters: a literal `%` is doubled."""
    q = quote(column)
    kind = data_type.lower()
    if kind in _INTEGERS or kind in ("decimal", "numeric", "date"):
        return q
    if kind in _FLOATS:
        return f"CAST({q} AS DECIMAL(65,{FLOAT_PLACES}))"
    if kind in ("datetime", "timestamp"):
        return f"DATE_FORMAT({q}, '%%Y-%%m-%%d %%H:%%i:%%s.%%f')"
    if kind == "time":
        return (f"IF(MICROSECOND({q}) = 0, TIME_FORMAT({q}, '%%H:%%i:%%s'), "
                f"TIME_FORMAT({q}, '%%H:%%i:%%s.%%f'))")
    if kind in _TEXTS:
        return f"CONVERT({q} USING utf8mb4)"
    if kind in _BINARIES:
        return f"HEX({q})"
    return None


def row_crc_sql(columns: Sequence[tuple[str, str]]) -> str:
    """CRC32 of a row's canonical text; `columns` are (name, DATA_TYPE) of compared
    columns, in the order the replica side uses."""
    values = [source_expression(name, kind) for name, kind in columns]
    flags = ", ".join(f"ISNULL({quote(name)})" for name, _ in columns)
    parts = [*values, f"CONCAT({flags})" if columns else "''"]
    return f"CRC32(CONVERT(CONCAT_WS('{SEPARATOR}', {', '.join(parts)}) USING utf8mb4))"


def chunk_sql(table: str, columns: Sequence[tuple[str, str]], where: str) -> str:
    """One aggregate over the rows `where` selects: count, sum and XOR of their CRCs,
    computed by the server (no row leaves it)."""
    return (f"SELECT COUNT(*), COALESCE(SUM(c), 0), COALESCE(BIT_XOR(c), 0) FROM "
            f"(SELECT {row_crc_sql(columns)} AS c FROM {table} WHERE {where}) AS rows_")


# Python side: a formatter per replica column, chosen once by its Arrow type.


def _integer(v: Any) -> str:
    return "1" if v is True else "0" if v is False else str(v)


def _decimal(v: Decimal) -> str:
    return format(v, "f")


def _floating(v: float) -> str:
    # repr's digits are the shortest that read back as the value, as MariaDB's double to
    # DECIMAL conversion takes them.
    return format(Decimal(repr(float(v))).quantize(_FLOAT_QUANTUM, ROUND_HALF_UP), "f")


def _date(v: date) -> str:
    return f"{v.year:04d}-{v.month:02d}-{v.day:02d}"


def _timestamp(v: datetime) -> str:
    # Arrow gives the replica's UTC instants; strftime would not pad years below 1000.
    return (f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:"
            f"{v.second:02d}.{v.microsecond:06d}")


def _text(v: Any) -> str:
    return v if isinstance(v, str) else str(v)


def _binary(v: bytes) -> str:
    return v.hex().upper()


def formatter(arrow_type: Any) -> Callable[[Any], str]:
    """The text of a replica value of `arrow_type` (a pyarrow DataType) by the rules
    above; a type the rules do not cover raises ValueError naming it."""
    import pyarrow as pa

    t = pa.types
    if t.is_integer(arrow_type) or t.is_boolean(arrow_type):
        return _integer
    if t.is_decimal(arrow_type):
        return _decimal
    if t.is_floating(arrow_type):
        return _floating
    if t.is_date(arrow_type):
        return _date
    if t.is_timestamp(arrow_type):
        return _timestamp
    if t.is_string(arrow_type) or t.is_large_string(arrow_type) or \
            t.is_string_view(arrow_type):
        return _text
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type) or \
            t.is_binary_view(arrow_type):
        return _binary
    raise ValueError(f"no canonical text for replica type {arrow_type}")


def texts(columns: Sequence[Any]) -> Any:
    """The canonical texts of many rows at once, as a pyarrow string array: `columns` are
    pyarrow arrays of one length, in the compared order. Arrow's kernels format what they
    format as the rules say (a decimal of more than 6 places they would write in exponent
    notation, a float by other digits, binary not as hex: those go through `formatter`),
    and `binary_join_element_wise` skips NULLs as CONCAT_WS does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts, flags = [], []
    for column in columns:
        kind = column.type
        if pa.types.is_integer(kind) or (pa.types.is_decimal(kind) and kind.scale <= 6) or \
                pa.types.is_date(kind):
            parts.append(pc.cast(column, pa.string()))
        elif pa.types.is_boolean(kind):
            parts.append(pc.cast(pc.cast(column, pa.int8()), pa.string()))
        elif pa.types.is_timestamp(kind) and kind.unit == "us":
            # %S of a microsecond timestamp writes the seconds with their six decimals.
            parts.append(pc.strftime(column, format="%Y-%m-%d %H:%M:%S"))
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
                pa.types.is_string_view(kind) or pa.types.is_null(kind):
            parts.append(pc.cast(column, pa.string()))
        else:
            text = formatter(kind)
            parts.append(pa.array([None if v is None else text(v)
                                   for v in column.to_pylist()], pa.string()))
        flags.append(pc.if_else(pc.is_null(column), "1", "0"))
    if not columns:
        return pa.array([], pa.string())
    flag_text = pc.binary_join_element_wise(*flags, "") if len(flags) > 1 else flags[0]
    return pc.binary_join_element_wise(*parts, flag_text, SEPARATOR, null_handling="skip")


def crcs_of(columns: Sequence[Any], rows: int) -> list[int]:
    """CRC32 of each row's canonical text (`texts`); `rows` when there is no column."""
    if not columns:
        return [zlib.crc32(b"")] * rows
    crc = zlib.crc32
    return [crc(t.encode("utf-8")) for t in texts(columns).to_pylist()]


@dataclass
class Fingerprint:
    """A multiset checksum of rows: their count, and the sum and XOR of their CRCs."""

    rows: int = 0
    total: int = 0
    xor: int = 0

    def add(self, crc: int) -> None:
        self.rows += 1
        self.total += crc
        self.xor ^= crc

    def __iadd__(self, other: Fingerprint) -> Fingerprint:
        self.rows += other.rows
        self.total += other.total
        self.xor ^= other.xor
        return self

    @classmethod
    def of(cls, crcs: Sequence[int]) -> Fingerprint:
        out = cls()
        for crc in crcs:
            out.add(crc)
        return out
