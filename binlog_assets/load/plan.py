"""A load's plan: its id, the source table, and the chunks' upper bounds by the primary
key, walked once on the source before any row is read. A resumed load keeps its plan, so
its chunks and their transactions (`loader.py`) are the ones it started with.

The bounds are walked and compared by the server (`ORDER BY` the key, `key > lower AND key
<= upper`), in the key's own collation: a key of any type or collation is chunked, and
the chunks cover every key, including keys inserted while the load runs.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson

from binlog_assets.parity.chunks import Key, KeyRange, next_upper_sql

if TYPE_CHECKING:
    from collections.abc import Callable

    from binlog_assets.parity.source import SourceTable


@dataclass(frozen=True)
class LoadPlan:
    """Chunk i holds the keys in (uppers[i-1], uppers[i]]; the last upper is None. Worker
    slot w reads chunks w, w + workers, w + 2 * workers, ... in that order."""

    load_id: str
    table: str  # db.table
    key: tuple[str, ...]
    uppers: tuple[Key | None, ...]
    workers: int

    def chunk(self, index: int) -> KeyRange:
        return KeyRange(None if index == 0 else self.uppers[index - 1], self.uppers[index])

    def slot_chunks(self, slot: int) -> range:
        return range(slot, len(self.uppers), self.workers)

    def to_json(self) -> str:
        return orjson.dumps({"load_id": self.load_id, "table": self.table,
                             "key": list(self.key), "workers": self.workers,
                             "uppers": [None if u is None else [_tagged(v) for v in u]
                                        for u in self.uppers]}).decode()

    @classmethod
    def from_json(cls, text: str) -> LoadPlan:
        doc = orjson.loads(text)
        return cls(doc["load_id"], doc["table"], tuple(doc["key"]),
                   tuple(None if u is None else tuple(_untagged(v) for v in u)
                         for u in doc["uppers"]), int(doc["workers"]))


# The first chunk's keys at most: small, since an apply reads it before the load goes on.
FIRST_ROWS = 1000


def plan_load(db: Any, table: SourceTable, chunk_rows: int, workers: int,
              pause: Callable[[], None] = lambda: None) -> LoadPlan:
    """Walk `table`'s primary key on `db` in steps of `chunk_rows` keys (an index walk, one
    short query per chunk) into a new plan; the first step is of at most `FIRST_ROWS`
    keys (a direct load makes its replica of the first chunk, by an apply, before the
    others are read: `direct.prepare_direct`)."""
    if not table.primary:
        raise ValueError(f"{table.name} has no primary key: a load reads a table by chunks "
                         f"of its primary key, and a keyless table has none (it comes in "
                         f"through the producer's own snapshot)")
    uppers: list[Key | None] = []
    lower: Key | None = None
    while True:
        step = chunk_rows if uppers else min(chunk_rows, FIRST_ROWS)
        sql, params = next_upper_sql(table.sql_name, table.primary, lower, step)
        with db.cursor() as cur:
            cur.execute(sql, params)
            found = cur.fetchone()
        upper = None if found is None else tuple(found)
        uppers.append(upper)
        if upper is None:
            break
        lower = upper
        pause()
    return LoadPlan(uuid.uuid4().hex[:12], table.name, table.primary, tuple(uppers),
                    max(1, min(workers, len(uppers))))


# A key value's JSON form keeps its type, so a resumed load compares as the first did.
_TAGS: tuple[tuple[type, str, Callable[[Any], Any], Callable[[Any], Any]], ...] = (
    (bool, "bool", bool, bool),
    (int, "int", int, int),
    (float, "float", float, float),
    (Decimal, "dec", str, Decimal),
    (datetime, "ts", datetime.isoformat, datetime.fromisoformat),
    (date, "date", date.isoformat, date.fromisoformat),
    (timedelta, "time", lambda v: v // timedelta(microseconds=1),
     lambda v: timedelta(microseconds=v)),
    (str, "str", str, str),
    (bytes, "bytes", lambda v: base64.b64encode(v).decode(), base64.b64decode),
)


def _tagged(value: Any) -> list:
    if value is None:
        return ["null", None]
    for kind, tag, dump, _load in _TAGS:
        if isinstance(value, kind):
            return [tag, dump(value)]
    raise ValueError(f"a key value of type {type(value).__name__} has no plan form: {value!r}")


def _untagged(item: list) -> Any:
    tag, value = item
    if tag == "null":
        return None
    for _kind, name, _dump, load in _TAGS:
        if name == tag:
            return load(value)
    raise ValueError(f"unknown key value tag {tag!r} in a load plan")
