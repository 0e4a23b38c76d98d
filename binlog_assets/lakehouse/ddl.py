"""What a batch's DDL events say a replica must do, beyond the columns they declare: the
renames, drops, partition changes and added columns' defaults read from the statement
text (`plan_ddl`).

The statement shapes read and what each means: docs/architecture.md, "What DDL
statements say".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from binlog_assets.formats.event import (
    DATABASE_WIDE,
    LEGACY_SNAPSHOT_LINEAGE,
    dropped_database,
)

if TYPE_CHECKING:
    from collections.abc import Callable

_NAME = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_QUALIFIED = rf"{_NAME}(?:\s*\.\s*{_NAME})?"
_RENAME_COLUMN = re.compile(rf"\bRENAME\s+COLUMN\s+({_NAME})\s+TO\s+({_NAME})", re.I)
_CHANGE_COLUMN = re.compile(
    rf"\bCHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_NAME})\s+({_NAME})", re.I)
_RENAME_TABLE = re.compile(r"^\s*RENAME\s+TABLES?\s+(.*)$", re.I | re.S)
_RENAME_PAIR = re.compile(rf"({_QUALIFIED})\s+TO\s+({_QUALIFIED})", re.I)
_ALTER_RENAME = re.compile(
    rf"^\s*ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE\s+(?:IF\s+EXISTS\s+)?({_QUALIFIED})"
    rf".*?\bRENAME\s+(?:TO\s+|AS\s+)?({_QUALIFIED})\s*(?:,|$)", re.I | re.S)
_DROP_TABLE = re.compile(r"^\s*DROP\s+(?:TEMPORARY\s+)?TABLES?\b", re.I)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?TABLE\b", re.I)
_PARTITION_ROWS = re.compile(
    rf"\b(DROP|TRUNCATE|EXCHANGE)\s+PARTITION\s+(?:IF\s+EXISTS\s+)?({_NAME}(?:\s*,\s*{_NAME})*)",
    re.I)


_ADD_COLUMN = re.compile(
    rf"^\s*ADD\s+(COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?({_NAME})\s+(.+)$", re.I | re.S)
# `ADD [COLUMN] [IF NOT EXISTS] (c1 <definition>, c2 <definition>, ...)`.
_ADD_COLUMNS = re.compile(
    r"^\s*ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?\((.*)\)\s*$", re.I | re.S)
_COLUMN_DEFINITION = re.compile(rf"^\s*({_NAME})\s+(.+)$", re.S)
# What `ADD <word>` adds when the word is not a column's name (no COLUMN keyword).
_NOT_COLUMNS = frozenset({"index", "key", "primary", "unique", "fulltext", "spatial",
                          "constraint", "foreign", "check", "partition", "period",
                          "system", "vector"})
_ALTER_HEAD = re.compile(
    rf"^\s*ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE\s+(?:IF\s+EXISTS\s+)?{_QUALIFIED}\s+",
    re.I)
# One token of a column definition: a quoted string, a parenthesised group (flat), a word.
_TOKEN = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"|\([^()]*\)|[^\s(),'\"]+")
# The current time, as a column's DEFAULT names it.
_NOW = frozenset({"current_timestamp", "now", "localtime", "localtimestamp"})
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_NUMERIC_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint",
                            "decimal", "dec", "numeric", "fixed", "float", "double", "real",
                            "bit", "bool", "boolean", "year"})
_TEXT_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext",
                         "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob",
                         "enum", "set"})


@dataclass(frozen=True)
class ColumnAdd:
    """A column an `ADD` gives a table: older rows hold `default` (SQL text of a literal,
    None for NULL); `known` is False when the default is an expression (CURRENT_TIMESTAMP,
    a function) whose value for the older rows the binlog does not tell."""

    column: str
    default: str | None
    known: bool = True
    # The default is the statement's time (a TIMESTAMP's CURRENT_TIMESTAMP): older rows
    # hold when the ALTER ran, which its event's source time tells (`plan_ddl`).
    now: bool = False


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside parentheses and quotes."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _sql_literal(token: str) -> str:
    """A MariaDB string literal as a Spark SQL one (backslash and doubled-quote escapes)."""
    body = token[1:-1].replace(token[0] * 2, token[0])
    body = re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "0": "\0"}.get(
        m.group(1), m.group(1)), body)
    return "'" + body.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _column_default(definition: str) -> tuple[str | None, bool, bool]:
    """(SQL literal or None for NULL, whether known, whether the statement's time) of a
    column definition's default."""
    tokens = _TOKEN.findall(definition)
    words = [t.lower() for t in tokens]
    if "default" in words:
        i = words.index("default")
        value = tokens[i + 1] if i + 1 < len(tokens) else ""
        if value.lower() == "null":
            return None, True, False
        if value[:1] in ("'", '"'):
            return _sql_literal(value), True, False
        if _NUMBER.match(value):
            return value, True, False
        return None, False, _statement_time(words, i + 1)
    if "not" in words and words[words.index("not") + 1:][:1] == ["null"]:
        type_name = words[0]
        if type_name in _NUMERIC_TYPES:
            return "0", True, False
        if type_name in _TEXT_TYPES:
            return "''", True, False
        return None, False, False
    return None, True, False


def _statement_time(words: list[str], i: int) -> bool:
    """Whether `words[i:]` is a TIMESTAMP column's default of the current time, in
    seconds. Not a DATETIME's: that is the session's wall clock, in a time zone the
    binlog does not carry; nor a fraction of a second, which its event's time lacks."""
    precision = words[1] if len(words) > 1 and words[1].startswith("(") else "(0)"
    if words[0] != "timestamp" or precision != "(0)" or i >= len(words):
        return False
    after = words[i + 1] if i + 1 < len(words) else ""
    return words[i] in _NOW and (not after.startswith("(") or after in ("()", "(0)"))


def column_adds(ddl: str) -> list[ColumnAdd]:
    """Each column an `ALTER TABLE ... ADD [COLUMN] c <definition>` (or the parenthesised
    `ADD (c <definition>, ...)`) adds, with the value the table's existing rows take."""
    head = _ALTER_HEAD.match(ddl)
    if head is None:
        return []
    out = []
    for spec in _split_top(ddl[head.end():]):
        group = _ADD_COLUMNS.match(spec)
        if group is not None:
            for definition in _split_top(group.group(1)):
                m = _COLUMN_DEFINITION.match(definition)
                if m is not None and m.group(1).lower() not in _NOT_COLUMNS:
                    out.append(ColumnAdd(_unquote(m.group(1)), *_column_default(m.group(2))))
            continue
        m = _ADD_COLUMN.match(spec)
        if m is None or (not m.group(1) and m.group(2).lower() in _NOT_COLUMNS):
            continue
        out.append(ColumnAdd(_unquote(m.group(2)), *_column_default(m.group(3))))
    return out


def _timestamp_literal(source_ts: int) -> str:
    """The second of `source_ts` (ms since the epoch) as a Spark SQL literal, read in the
    sessions' UTC time zone (`spark_conf`)."""
    moment = datetime.fromtimestamp(source_ts // 1000, UTC)
    return f"TIMESTAMP '{moment:%Y-%m-%d %H:%M:%S}'"


def _unquote(name: str) -> str:
    name = name.strip()
    if name.startswith("`") and name.endswith("`"):
        return name[1:-1].replace("``", "`")
    return name


def _qualify(name: str, database: str) -> str:
    parts = [_unquote(p) for p in re.findall(_NAME, name)]
    return ".".join(parts) if len(parts) > 1 else f"{database}.{parts[0]}"


@dataclass(frozen=True)
class DdlEvent:
    """One DDL row of the changelog: `table` is `db.table` (`db.*` for a database-wide
    statement), `columns` its canonical types after the statement (None when not given)."""

    table: str
    position: tuple[int, ...]
    ddl: str
    columns: dict[str, str] | None = None
    source_ts: int | None = None

    @classmethod
    def from_row(cls, table: str, position: tuple, ddl: str | None,
                 column_types: str | None, source_ts: int | None = None) -> DdlEvent:
        return cls(table, tuple(position), ddl or "",
                   json.loads(column_types) if column_types else None, source_ts)

    @property
    def database(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def snapshot(self) -> bool:
        """Replayed by a snapshot (which states each table's schema as it reads it,
        dropping and creating it first), not a statement the source ran."""
        return self.position[0] == LEGACY_SNAPSHOT_LINEAGE or self.position[3] < 0


@dataclass
class DdlPlan:
    """What a batch's DDL asks of one replica, in binlog order."""

    # (db.table, old column, new column, position of the rename)
    column_renames: list[tuple[str, str, str, tuple[int, ...]]] = field(default_factory=list)
    # db.table -> its columns (lower-case) by its latest definition in the batch
    definitions: dict[str, tuple[tuple[int, ...], list[str]]] = field(default_factory=dict)
    # (old db.table, new db.table, position)
    table_renames: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    # db.table (or db.* for DROP DATABASE) -> position of its drop
    drops: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # (db.table, "DROP PARTITION p0", position): partitions whose rows went unlogged
    partition_rows: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    # (db.table, column, position): the latest ADD of each column of each table
    column_adds: dict[tuple[str, str], tuple[tuple[int, ...], ColumnAdd]] = field(
        default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.column_renames or self.definitions or self.table_renames
                    or self.drops or self.partition_rows)


def starts_table(ddl: str) -> bool:
    """A CREATE TABLE or DROP TABLE: the table's rows from before it are another's."""
    return bool(_CREATE_TABLE.match(ddl) or _DROP_TABLE.match(ddl))


def column_renames(ddl: str) -> list[tuple[str, str]]:
    """(old, new) of each column the statement renames, in statement order."""
    found = [(m.start(), _unquote(m.group(1)), _unquote(m.group(2)))
             for pattern in (_RENAME_COLUMN, _CHANGE_COLUMN) for m in pattern.finditer(ddl)]
    return [(old, new) for _, old, new in sorted(found) if old.lower() != new.lower()]


def table_renames(ddl: str, database: str) -> list[tuple[str, str]]:
    """(old db.table, new db.table) of each table the statement renames."""
    m = _RENAME_TABLE.match(ddl)
    if m is not None:
        return [(_qualify(a, database), _qualify(b, database))
                for a, b in _RENAME_PAIR.findall(m.group(1))]
    m = _ALTER_RENAME.match(ddl)
    if m is not None and not re.search(r"\bRENAME\s+(?:COLUMN|INDEX|KEY)\b", m.group(0), re.I):
        return [(_qualify(m.group(1), database), _qualify(m.group(2), database))]
    return []


def plan_ddl(events: list[DdlEvent], routed: Callable[[str], bool]) -> DdlPlan:
    """The plan for a replica whose source tables are those `routed(db.table)` accepts.

    A rename of a routed table is kept whichever way it goes (into or out of the
    replica); a database drop is kept as `db.*`, for the replica to match its tables.
    """
    plan = DdlPlan()
    for e in sorted(events, key=lambda e: e.position):
        if e.snapshot and not _CREATE_TABLE.match(e.ddl):
            # A snapshot's DROP ... IF EXISTS replays a schema; what its table lost while
            # no snapshot ran is the snapshot end's to remove.
            continue
        database = dropped_database(e.ddl)
        if database is not None:
            plan.drops[f"{database}.{DATABASE_WIDE}"] = e.position
            continue
        renamed = table_renames(e.ddl, e.database)
        for old, new in renamed:
            if routed(old) or routed(new):
                plan.table_renames.append((old, new, e.position))
        if not routed(e.table):
            continue
        if _DROP_TABLE.match(e.ddl):
            plan.drops[e.table] = e.position
            plan.definitions.pop(e.table, None)
            continue
        for old, new in column_renames(e.ddl):
            plan.column_renames.append((e.table, old, new, e.position))
        for m in _PARTITION_ROWS.finditer(e.ddl):
            plan.partition_rows.append(
                (e.table, f"{m.group(1).upper()} PARTITION {m.group(2)}", e.position))
        for add in column_adds(e.ddl):
            if add.now and e.source_ts is not None:
                add = ColumnAdd(add.column, _timestamp_literal(e.source_ts))
            plan.column_adds[(e.table, add.column.lower())] = (e.position, add)
        if e.columns is not None:
            plan.definitions[e.table] = (e.position, [c.lower() for c in e.columns])
    return plan
