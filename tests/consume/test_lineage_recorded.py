"""The lineage rules on records Debezium's MariaDB connector wrote across a failover, a
failback and a binlog reset (tests/fixtures/debezium-mariadb): each partition placed as
a run places it, in either order of the partitions, and the changes reduced by position
as a replica reduces them end equal to the source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from binlog_assets.consume.lineage import SNAPSHOT, MemoryBook, Placer
from binlog_assets.consume.snapshot_end import snapshot_ends
from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.event import OP_TRUNCATE, ChangeEvent

FIXTURES = Path(__file__).parents[1] / "fixtures" / "debezium-mariadb"


def _records(name: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in (FIXTURES / name).read_text().splitlines():
        record = json.loads(line)
        out.setdefault(record["topic"], []).append(record)
    return out


def _place(topics: dict[str, list[dict]], order: list[str]) -> tuple[list[ChangeEvent],
                                                                      MemoryBook]:
    book = MemoryBook()
    events: list[ChangeEvent] = []
    for topic in order:
        decoder = DebeziumDecoder()
        placer = Placer(book, f"{topic}[0]")
        for r in topics[topic]:
            decoded = decoder.decode(r["value"].encode() if r["value"] else None,
                                     topic=topic, offset=r["offset"],
                                     key=r["key"].encode() if r["key"] else None)
            for e in decoded:
                placer.place(e)
            if decoder.snapshots_ended:
                decoded = snapshot_ends(decoded, decoder.snapshots_ended,
                                        lambda position, schema: ["inv.empty_t", "inv.items"])
                decoder.snapshots_ended.clear()
                for e in decoded:
                    placer.place(e)
            events += decoded
    return events, book


def _of(lineages: dict[tuple, int], topic: str, first: int, last: int) -> set[int]:
    return {n for (t, o, _), n in lineages.items() if t == topic and first <= o <= last}


def _reduce(events: list[ChangeEvent]) -> dict[tuple, dict]:
    """What a replica holds: per key the change with the highest position, live unless
    a delete or below its table's latest truncate."""
    last: dict[tuple, ChangeEvent] = {}
    cut: dict[str, tuple] = {}
    for e in events:
        if e.op == OP_TRUNCATE:
            cut[e.table] = max(cut.get(e.table, e.sort_key()), e.sort_key())
        elif e.op in ("c", "u", "r", "d") and (
                e.key not in last or e.sort_key() > last[(e.table, e.key)].sort_key()):
            last[(e.table, e.key)] = e
    return {k: e.after for k, e in last.items()
            if e.op != "d" and e.sort_key() > cut.get(e.table, ())}


@pytest.mark.parametrize("schema_first", [True, False])
def test_a_failover_failback_and_reset_end_equal_to_the_source(schema_first: bool) -> None:
    topics = _records("failover-failback-reset.jsonl")
    order = ["y", "y.inv.items"] if schema_first else ["y.inv.items", "y"]
    events, book = _place(topics, order)

    lineages = {(e.topic, e.offset, e.row_index): e.position.lineage for e in events}
    items = [e for e in events if e.topic == "y.inv.items" and e.op != OP_TRUNCATE]
    assert [e.position.lineage for e in items] == [1] * 5 + [2] * 5 + [3] * 6
    assert [r.number for r in book.records()] == [2, 3]
    assert book.records()[1].cause == SNAPSHOT
    # The ALTER on server 2 and its copy read from server 1 after the failback: one lineage.
    assert lineages[("y", 8, 0)] == lineages[("y", 17, 0)] == 2
    # Server 1's schema rebuilt after the failback is where the stream was: lineage 2.
    assert _of(lineages, "y", 9, 16) == {2}
    # The reset's schema: the snapshot's lineage when its rows raised it first, else
    # where the schema topic stood (a schema replay raises none).
    assert _of(lineages, "y", 18, 25) == {2 if schema_first else 3}
    assert _reduce(events) == {
        ("inv.items", (1,)): {"id": 1, "v": "gap", "w": None},
        ("inv.items", (2,)): {"id": 2, "v": "b3", "w": None},
        ("inv.items", (6,)): {"id": 6, "v": "after", "w": None},
        ("inv.items", (7,)): {"id": 7, "v": "g", "w": None},
        ("inv.items", (8,)): {"id": 8, "v": "h", "w": None},
    }


def test_an_initial_snapshot_and_its_stream_stay_in_lineage_1() -> None:
    topics = _records("snapshot-stream-heartbeat.jsonl")
    events, book = _place(topics, sorted(topics))
    assert book.records() == [] and {e.position.lineage for e in events} == {1}
    ends = [e for e in events if e.op == OP_TRUNCATE]
    # The snapshot's last row ends its table, and the empty table its schema named.
    assert sorted(e.table for e in ends) == ["inv.empty_t", "inv.items", "inv.items"]
    assert _reduce(events) == {("inv.items", (1,)): {"id": 1, "v": "a"},
                               ("inv.items", (2,)): {"id": 2, "v": "bb"},
                               ("inv.items", (4,)): {"id": 4, "v": "d"}}
    heartbeat = topics["__debezium-heartbeat.x"][0]["value"]
    assert json.loads(heartbeat)["payload"].keys() == {"ts_ms"}
