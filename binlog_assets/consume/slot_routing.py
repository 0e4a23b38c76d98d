"""Which slot an event runs on: the ordering modes, the canonical key bytes whose crc32
picks the slot, and how each table's events find theirs (`TableSlots`, computed once
per table).

An event's slot is `crc32(ordering key bytes) % slots`: stable across processes, unlike
Python's salted `hash()`, so a key keeps its slot from run to run.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from binlog_assets.formats.event import ChangeEvent

ORDERING_PARTITION = "partition"
ORDERING_TABLE = "table"
ORDERING_KEY = "key"
ORDERING_MODES = (ORDERING_PARTITION, ORDERING_TABLE, ORDERING_KEY)

# Hashing a key costs more than looking its slot up, and hot keys repeat. The caches (one
# per table) hold at most this many keys in all and are cleared when full: bounded with
# no bookkeeping per hit. Keyed by equality (1 and 1.0 would share a slot; a decoder
# gives a column one type anyway).
KEY_SLOT_CACHE = 4096


class TableSlots(NamedTuple):
    """How one table's events find their slot."""

    fixed: int  # every event's slot, or -1 under key ordering
    seed: int  # crc32 of the key prefix, which the key's bytes continue
    table_slot: int  # the table's own slot (keyless events, DDL, truncates)
    key_slots: dict[tuple, int]  # key -> slot cache

    def slot(self, key: tuple, slots: int) -> int:
        """The slot of this table's event with `key`; the dispatcher's submit path computes
        the same inline, and fills the cache."""
        if self.fixed >= 0:
            return self.fixed
        if not key:
            return self.table_slot
        slot = self.key_slots.get(key)
        return zlib.crc32(repr(key).encode(), self.seed) % slots if slot is None else slot


def table_slots(event: ChangeEvent, mode: str, slots: int) -> TableSlots:
    """How `event`'s table finds its slots under ordering `mode` over `slots` slots."""
    table_slot = zlib.crc32(table_bytes(event.table)) % slots
    if mode == ORDERING_KEY:
        return TableSlots(-1, zlib.crc32(key_prefix(event.table)), table_slot, {})
    if mode == ORDERING_TABLE:
        return TableSlots(table_slot, 0, table_slot, {})
    return TableSlots(zlib.crc32(ordering_key_bytes(event, ORDERING_PARTITION)) % slots, 0,
                      table_slot, {})


def ordering_key_bytes(event: ChangeEvent, mode: str) -> bytes:
    """The canonical bytes whose crc32 picks an event's slot.

    `partition`: topic and partition; `table`: the table; `key`: the table and `repr` of
    the key values (deterministic for the int, str, Decimal, bytes and datetime values
    the decoders produce; a key without values falls back to its table). The dispatcher
    computes the same crc32 incrementally.
    """
    if mode == ORDERING_PARTITION:
        return f"partition\0{event.topic}\0{event.partition}".encode()
    if mode == ORDERING_KEY and event.key:
        return key_prefix(event.table) + repr(event.key).encode()
    if mode in (ORDERING_KEY, ORDERING_TABLE):
        return table_bytes(event.table)
    raise ValueError(f"ordering must be one of {ORDERING_MODES}, got {mode!r}")


def table_bytes(table: str) -> bytes:
    return b"table\0" + table.encode(errors="surrogatepass")


def key_prefix(table: str) -> bytes:
    return b"key\0" + table.encode(errors="surrogatepass") + b"\0"
