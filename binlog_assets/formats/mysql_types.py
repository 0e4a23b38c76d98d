"""MySQL column type names, as the producers spell them, mapped to binlake's canonical types.

Canal sends every value as text with the column's MySQL type beside it (`int(11)`,
`VARCHAR(255)`, `decimal(10,2)`, `bigint(20) unsigned`); Maxwell's and Debezium's DDL records
describe columns with the same names. `mysql_type` turns one such name into the canonical
type name (`int`, `bigint`, `double`, `float`, `decimal(p,s)`, `string`, `boolean`, `date`,
`timestamp`, `binary`, `json`) and a parser for the text form of its values. Names repeat
on every message, so results are cached.

TIME is a duration (-838:59:59 to 838:59:59, fractions to the microsecond), so no
time-of-day type holds it: every format gives it as `time_text` writes it, a string
`[-]HH:MM:SS[.ffffff]`, whether the producer sent text (Canal, DTS) or microseconds
(Debezium).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any, NamedTuple

_MODIFIERS = frozenset({"unsigned", "signed", "zerofill"})
_INT_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "year", "bool",
                        "boolean"})
_STRING_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext",
                           "enum", "set", "character", "nchar", "nvarchar"})
_BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob",
                           "longblob"})
_DECIMAL_TYPES = frozenset({"decimal", "numeric", "dec", "fixed"})
_DOUBLE_TYPES = frozenset({"double", "double precision", "real"})
_TIMESTAMP_TYPES = frozenset({"datetime", "timestamp"})

# MySQL writes an unknown date as all zeros; no calendar value exists for it.
_ZERO_DATE = "0000-00-00"


class MysqlType(NamedTuple):
    """A column type: its canonical name (None when binlake has none) and a text parser."""

    canonical: str | None
    parse: Callable[[str], Any]


def _parse_date(text: str) -> date | None:
    if text.startswith(_ZERO_DATE):
        return None
    return date.fromisoformat(text)


def _parse_datetime(text: str) -> datetime | None:
    if text.startswith(_ZERO_DATE):
        return None
    return datetime.fromisoformat(text)


def time_text(micros: int) -> str:
    """A TIME value given in microseconds as `[-]HH:MM:SS[.ffffff]`: hours may exceed 24,
    and the fraction is written, in six digits, only when it is not zero."""
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{sign}{hour:02d}:{minute:02d}:{second:02d}"
    return f"{text}.{fraction:06d}" if fraction else text


def _parse_time(text: str) -> str:
    # MySQL's own text (`-838:59:59`, `12:34:56.5`), rewritten as `time_text` writes it.
    body = text[1:] if text.startswith("-") else text
    clock, _, fraction = body.partition(".")
    hour, minute, second = clock.split(":")
    if not (clock.isascii() and hour.isdigit() and len(minute) == len(second) == 2
            and minute.isdigit() and second.isdigit() and minute < "60" and second < "60"
            and len(fraction) <= 6 and (fraction.isdigit() or not fraction)):
        raise ValueError(f"not a TIME value: {text!r}")
    micros = ((int(hour) * 60 + int(minute)) * 60 + int(second)) * 1_000_000
    micros += int(fraction.ljust(6, "0")) if fraction else 0
    return time_text(-micros if body is not text else micros)


def _parse_binary(text: str) -> bytes:
    # Canal renders binary columns as ISO-8859-1 text: one character per byte.
    return text.encode("latin-1")


def _keep_text(text: str) -> str:
    return text


@lru_cache(maxsize=4096)
def mysql_type(
    type_name: str, precision: int | None = None, scale: int | None = None
) -> MysqlType:
    """Canonical type and text parser for a MySQL type name such as `decimal(10,2) unsigned`.

    `precision`/`scale` fill in a decimal's digits when the name itself carries none
    (Debezium's and Maxwell's DDL records give them as separate fields).
    """
    head, _, rest = type_name.lower().partition("(")
    args, _, tail = rest.rpartition(")")
    words = head.split()
    base = " ".join(w for w in words if w not in _MODIFIERS)
    unsigned = "unsigned" in words or "unsigned" in tail.split()
    p, _, s = args.partition(",")
    p, s = p.strip(), s.strip()
    if base in _INT_TYPES:
        # An unsigned INT can exceed the 32-bit range.
        wide = unsigned and base in ("int", "integer")
        return MysqlType("bigint" if wide else "int", int)
    if base == "bigint":
        # An unsigned BIGINT can exceed the 64-bit range.
        return MysqlType("decimal(20,0)" if unsigned else "bigint", int)
    if base in _DECIMAL_TYPES:
        if p.isascii() and p.isdigit():
            digits = int(p)
        else:
            digits = precision if type(precision) is int and precision > 0 else 10
        if s.isascii() and s.isdigit():
            places = int(s)
        else:
            places = scale if type(scale) is int and scale >= 0 else 0
        return MysqlType(f"decimal({digits},{places})", Decimal)
    if base == "float":
        return MysqlType("float", float)
    if base in _DOUBLE_TYPES:
        return MysqlType("double", float)
    if base == "date":
        return MysqlType("date", _parse_date)
    if base in _TIMESTAMP_TYPES:
        return MysqlType("timestamp", _parse_datetime)
    if base == "time":
        return MysqlType("string", _parse_time)
    if base in _STRING_TYPES:
        return MysqlType("string", _keep_text)
    if base == "json":
        return MysqlType("json", _keep_text)
    if base in _BINARY_TYPES:
        return MysqlType("binary", _parse_binary)
    return MysqlType(None, _keep_text)


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def integer_type(value: int, declared: str = "int") -> str:
    """The narrowest of `declared` (`int` or `bigint`), `bigint` and a decimal of no
    fraction that holds `value`: an integer out of a type's range widens it, never wraps
    (a BIGINT UNSIGNED above 2^63 fits no bigint)."""
    if declared == "int" and _INT32_MIN <= value <= _INT32_MAX:
        return "int"
    if _INT64_MIN <= value <= _INT64_MAX:
        return "bigint"
    digits = len(str(abs(value)))
    return f"decimal({max(digits, 20)},0)"


# A Decimal with no declared type (a wide DECIMAL that Maxwell, or Debezium without a
# schema, sends as a JSON number) gets one fixed type when it fits, so that values of
# different scales never force a widening; one that does not fit gets its own digits.
_INFERRED_DECIMAL = "decimal(38,18)"
_INFERRED_WHOLE_DIGITS, _INFERRED_SCALE = 20, 18


def _decimal_type(value: Decimal) -> str:
    _, digits, exponent = value.as_tuple()
    if type(exponent) is not int:
        return "string"  # NaN or Infinity: no MySQL DECIMAL holds one
    scale = max(-exponent, 0)
    whole = max(len(digits) + exponent, 0)
    if whole <= _INFERRED_WHOLE_DIGITS and scale <= _INFERRED_SCALE:
        return _INFERRED_DECIMAL
    return f"decimal({whole + scale},{scale})"


# infer_type's answer for the classes whose every value has one canonical type.
_CLASS_TYPES: dict[type, str] = {
    str: "string", float: "double", bool: "boolean", dict: "json", list: "json",
    datetime: "timestamp", date: "date", bytes: "binary", bytearray: "binary",
}


def infer_types(images: tuple[dict[str, Any] | None, ...],
                declared: Mapping[str, str] | None) -> dict[str, str]:
    """Column -> `infer_type` of its first non-null value in `images`, for the columns
    `declared` has no type for. Per event on the consume path, hence the class lookup
    before the general case."""
    types: dict[str, str] = {}
    for image in images:
        if not image or (declared and declared.keys() >= image.keys()):
            continue
        for column, value in image.items():
            if value is None or column in types or (declared and column in declared):
                continue
            kind = type(value)
            if kind is int and _INT64_MIN <= value <= _INT64_MAX:
                types[column] = "bigint"
            else:
                types[column] = _CLASS_TYPES.get(kind) or infer_type(value)
    return types


def infer_type(value: Any) -> str | None:
    """The canonical type of a decoded Python value, or None for a null."""
    # bool before int: bool is an int subclass; datetime before date, for the same reason.
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return integer_type(value, "bigint")
    if isinstance(value, float):
        return "double"
    if isinstance(value, Decimal):
        return _decimal_type(value)
    if isinstance(value, datetime):
        return "timestamp"
    if isinstance(value, date):
        return "date"
    if isinstance(value, bytes | bytearray):
        return "binary"
    if isinstance(value, dict | list):
        return "json"
    return "string"
