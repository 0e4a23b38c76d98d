"""The one gate between names that come from change events and Spark: check, then quote.

Database, table and column names arrive inside Kafka records, so they are data, not
code. Table and database names never become Spark identifiers at all (a replica is
named by the config; the source's names are stored as values in `_source_db` and
`_source_table`). Column names do become replica columns: every one passes
`check_column` (a clear `UnsafeIdentifierError` for what no quoting can make safe) and
then reaches Spark as a StructField or `getField` name (never parsed), through `col` (a
`Column` of the quoted name) or, in the one place SQL text needs it (ALTER TABLE), as
`quote(name)`: in backticks, an embedded backtick doubled. Replica tables use Delta
column mapping, so a checked name may hold quotes, semicolons, spaces or dots and is
still stored as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

# MySQL caps identifiers at 64 characters; the margin admits other sources' longer names
# while still refusing a "name" that is really a payload.
MAX_IDENTIFIER_LENGTH = 128

# Columns binlake adds to every replica; a source column may not take one of these names.
RESERVED_COLUMNS = frozenset({
    "_source_db", "_source_table", "_position", "_op", "_source_ts", "_applied_at",
    "_valid_from", "_valid_to", "_is_current",
})

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnsafeIdentifierError(ValueError):
    """A name from a change event that binlake refuses to turn into a column."""


def check_column(name: object, table: str) -> str:
    """`name` if it can be a replica column of `table`, else UnsafeIdentifierError."""
    if not isinstance(name, str) or not name:
        raise UnsafeIdentifierError(f"table {table!r}: column name {name!r} is empty or not text")
    if len(name) > MAX_IDENTIFIER_LENGTH:
        raise UnsafeIdentifierError(
            f"table {table!r}: column name {name[:40]!r}... is longer than "
            f"{MAX_IDENTIFIER_LENGTH} characters")
    if _CONTROL.search(name):
        raise UnsafeIdentifierError(
            f"table {table!r}: column name {name!r} contains a control character")
    if name.lower() in RESERVED_COLUMNS:
        raise UnsafeIdentifierError(
            f"table {table!r}: column {name!r} collides with binlake's metadata column of "
            "that name; rename it at the source or map the table to another replica")
    return name


def check_columns(names: Iterable[str], table: str) -> list[str]:
    """Check every name, and refuse two that differ only in case (Spark resolves names
    case-insensitively, as MySQL does, so they would be one column)."""
    seen: dict[str, str] = {}
    out = []
    for name in names:
        check_column(name, table)
        other = seen.setdefault(name.lower(), name)
        if other != name:
            raise UnsafeIdentifierError(
                f"table {table!r}: columns {other!r} and {name!r} differ only in case")
        out.append(name)
    return out


# Characters Delta refuses in a column name unless the table maps its columns by name.
UNMAPPED_REFUSES = frozenset(" ,;{}()\n\t=")


def check_unmapped_names(names: Iterable[str], table: str) -> None:
    """Refuse, naming them, columns a Delta table without column mapping cannot hold."""
    bad = [n for n in names if UNMAPPED_REFUSES.intersection(n)]
    if bad:
        raise UnsafeIdentifierError(
            f"table {table!r}: column(s) {bad} hold characters Delta stores only with "
            f"column mapping (any of ' ,;{{}}()\\n\\t='): add column_mapping to "
            f"lakehouse.table_features (readers on delta-rs then cannot open the table)")


def quote(name: str) -> str:
    """`name` as one Spark SQL identifier: in backticks, any backtick doubled."""
    return "`" + name.replace("`", "``") + "`"


def qualified(*parts: str) -> str:
    """A dotted name of quoted parts: `db`.`table` or `alias`.`column`."""
    return ".".join(quote(p) for p in parts)


def col(name: str, alias: str | None = None) -> Column:
    """The column `name` (optionally of the DataFrame aliased `alias`), safely quoted."""
    from pyspark.sql import functions as F

    return F.col(qualified(alias, name) if alias else quote(name))
