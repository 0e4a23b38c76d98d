"""The lineage rules (`consume/lineage.py`) on event sequences a source's life makes.

MariaDB server A (id 1) writes binlog 000004; it fails over to B (id 2, binlog 000001,
GTIDs going on under gtid_strict_mode), later back to A; a binlog reset restarts at
000001 and the connector re-snapshots. Partitions share one book, as the partitions of
a source share the changelog's.
"""

from __future__ import annotations

import pytest

from binlog_assets.consume.lineage import (
    FAILOVER,
    SNAPSHOT,
    LineageRaced,
    LineageRecord,
    Mark,
    MemoryBook,
    Placer,
    UnorderedEventError,
)
from binlog_assets.formats.event import (
    SNAPSHOT_END_ROW,
    SNAPSHOT_ROW,
    SNAPSHOT_SCHEMA_ROW,
    ChangeEvent,
    Position,
)

T0 = 1_800_000_000_000


def ev(file: int, pos: int, *, server: int | None = 1, seq: int | None = None,
       ts: int = 0, row: int = 0, offset: int = 0, op: str = "u", domain: int = 0,
       table: str = "shop.items") -> ChangeEvent:
    gtid = None if seq is None else f"{domain}-{server}-{seq}"
    return ChangeEvent(table, op, (1,), ("id",), None, {"id": 1}, Position(1, file, pos, row),
                       T0 + ts * 1000, "shop.shop.items", 0, offset, server_id=server,
                       gtid=gtid)


def snap(file: int, pos: int, *, ts: int = 0, row: int = SNAPSHOT_ROW, offset: int = 0
         ) -> ChangeEvent:
    return ev(file, pos, server=None, ts=ts, row=row, offset=offset, op="r")


def placed(placer: Placer, *events: ChangeEvent) -> list[int]:
    for e in events:
        placer.place(e)
    return [e.position.lineage for e in events]


def test_the_same_binlog_further_on_stays_in_its_lineage_redeliveries_too():
    p = Placer(MemoryBook(), "t[0]")
    got = placed(p, ev(4, 100, seq=5), ev(4, 200, seq=6), ev(4, 200, seq=6), ev(5, 4, seq=7))
    assert got == [1, 1, 1, 1]
    assert p.tail.coordinates == (5, 4) and p.raised == []


def test_a_failover_to_lower_numbering_starts_lineage_2_that_outranks_everything_before():
    book = MemoryBook()
    p = Placer(book, "t[0]")
    before = ev(4, 754, seq=7, ts=1)
    after = ev(1, 1914, server=2, seq=8, ts=5)
    assert placed(p, before, after) == [1, 2]
    assert after.position > before.position  # the binlog numbering alone says otherwise
    [record] = book.records()
    assert (record.number, record.cause, record.coordinates) == (2, FAILOVER, (1, 1914))
    assert (record.server_id, record.start_seq, record.previous_server_id) == (2, 8, 1)
    assert record.seen == "t[0]@0"
    # The new primary's binlog goes on in the new lineage.
    assert placed(p, ev(1, 2142, server=2, seq=9, ts=6)) == [2]


def test_another_partition_meeting_the_same_failover_joins_it():
    book = MemoryBook()
    first, second = Placer(book, "a[0]"), Placer(book, "b[0]")
    placed(first, ev(4, 754, seq=7, ts=1), ev(1, 2142, server=2, seq=9, ts=6))
    # The second partition's first change after the switch is an earlier one of B's.
    assert placed(second, ev(4, 530, seq=6, ts=1), ev(1, 1914, server=2, seq=8, ts=5)) == [1, 2]
    assert [r.number for r in book.records()] == [2]
    assert book.records()[0].coordinates == (1, 1914)  # learned the lower coordinates
    assert book.records()[0].start_seq == 8


def test_a_partition_that_lagged_behind_a_failback_catches_up_by_gtid():
    # A -> B (lineage 2) -> back to A, whose numbering (000004) is above B's: no backward
    # jump for anyone who saw B. A partition that saw nothing of B must still place A's
    # new changes in lineage 2, as the others do.
    book = MemoryBook()
    saw_b, lagged = Placer(book, "schema[0]"), Placer(book, "items[0]")
    placed(saw_b, ev(4, 754, seq=7, ts=1), ev(1, 2477, server=2, seq=11, ts=8))
    assert placed(saw_b, ev(4, 1814, seq=12, ts=20)) == [2]
    assert placed(lagged, ev(4, 530, seq=6, ts=1), ev(4, 2054, seq=13, ts=21)) == [1, 2]


def test_changes_read_again_from_the_new_server_stay_below_what_they_copy():
    book = MemoryBook()
    p = Placer(book, "t[0]")
    placed(p, ev(4, 530, seq=6, ts=1), ev(4, 754, seq=7, ts=2))
    # The connector resumed on B from GTID 5: B's binlog holds A's 6 and 7 (server id 1).
    copies = [ev(1, 300, seq=6, ts=1), ev(1, 500, seq=7, ts=2)]
    assert placed(p, *copies) == [1, 1]
    assert p.tail.coordinates == (4, 754)  # the tail did not move down
    assert all(c.position < Position(1, 4, 754, 0) for c in copies)
    assert book.records() == []
    assert placed(p, ev(1, 1914, server=2, seq=8, ts=5)) == [2]


def test_an_original_of_the_old_server_read_late_stays_in_the_old_lineage():
    # Lineage 2 was raised from a copy (server id 1, seq 6); B's own first change is seq
    # 8. A lagging partition's A-side seq 7 was committed before the switch.
    book = MemoryBook()
    raiser, lagged = Placer(book, "a[0]"), Placer(book, "b[0]")
    placed(raiser, ev(4, 900, seq=9, ts=3), ev(1, 300, seq=10, ts=4))
    placed(raiser, ev(1, 1914, server=2, seq=12, ts=5))
    record = book.records()[0]
    assert (record.first_seq, record.start_seq, record.server_id) == (10, 12, 2)
    assert placed(lagged, ev(4, 530, seq=6, ts=1), ev(4, 754, seq=11, ts=3)) == [1, 1]


def test_the_old_primary_writing_after_the_failover_stops_the_partition():
    book = MemoryBook()
    p = Placer(book, "shop.shop.items[0]")
    placed(p, ev(4, 754, seq=7, ts=1), ev(1, 1914, server=2, seq=8, ts=5),
           ev(1, 2435, server=2, seq=10, ts=6))
    split_brain = ev(4, 900, server=1, seq=8, ts=9, offset=41)
    with pytest.raises(UnorderedEventError) as stopped:
        p.place(split_brain)
    message = str(stopped.value)
    assert "shop.shop.items[0]@41" in message and "split brain" in message
    assert "binlog 000004:900" in message and "binlog 000001:2435" in message
    assert "start_offset: 42" in message
    assert p.tail.coordinates == (1, 2435)


def test_a_step_back_committed_later_with_no_sign_of_a_new_binlog_is_never_guessed():
    p = Placer(MemoryBook(), "t[0]")
    placed(p, ev(4, 754, ts=1))
    with pytest.raises(UnorderedEventError, match="no sign of a new binlog"):
        p.place(ev(4, 100, offset=3, ts=2))


def test_connect_redelivering_after_a_restart_changes_nothing():
    # Without GTIDs too: a change committed no later than the tail is one seen before.
    p = Placer(MemoryBook(), "t[0]")
    placed(p, ev(4, 500, ts=1, seq=5), ev(4, 754, ts=2, seq=6), ev(4, 900, ts=3, server=None))
    again = [ev(4, 500, ts=1, seq=5), ev(4, 754, ts=2, seq=6), ev(4, 900, ts=3, server=None)]
    assert placed(p, *again) == [1, 1, 1]
    assert p.tail.coordinates == (4, 900) and p.raised == []


def test_a_replay_places_each_change_the_changelog_holds_by_what_it_carries():
    # Replayed from an offset before a failover: the old primary's changes stay in
    # lineage 1 (their coordinates are above the new primary's), the tail does not move.
    book = MemoryBook([LineageRecord(2, FAILOVER, 1, 1914, first_seq=8, domain="0",
                                     server_id=2, start_seq=8, ts=T0 + 5000,
                                     previous_server_id=1)])
    p = Placer(book, "t[0]", Mark(2, 1, 2500, 2, "0-2-12", T0 + 9000), replayed_below=20)
    old, new = ev(4, 754, seq=7, ts=1, offset=3), ev(1, 2000, server=2, seq=9, ts=6, offset=9)
    assert placed(p, old, new) == [1, 2]
    assert p.tail.coordinates == (1, 2500)
    assert placed(p, ev(1, 2600, server=2, seq=13, ts=10, offset=20)) == [2]


def test_a_reset_binlog_and_its_re_snapshot_start_a_lineage_everyone_joins():
    book = MemoryBook()
    rows, idle = Placer(book, "items[0]"), Placer(book, "orders[0]")
    placed(rows, ev(4, 2054, seq=13, ts=10))
    placed(idle, ev(4, 1000, seq=9, ts=8))
    # RESET MASTER: GTIDs start again at 1, the binlog at 000001. A partition whose table
    # the snapshot found empty meets a streamed change first: it cannot be placed yet.
    post_reset = ev(1, 712, seq=2, ts=40, offset=7)
    with pytest.raises(UnorderedEventError):
        idle.place(post_reset)
    # The snapshot's rows reach another partition: a snapshot behind its tail.
    assert placed(rows, snap(1, 555, ts=30), snap(1, 555, ts=30)) == [2, 2]
    [record] = book.records()
    assert (record.cause, record.coordinates) == (SNAPSHOT, (1, 555))
    # Run again, the stopped partition joins it.
    again = ev(1, 712, seq=2, ts=40, offset=7)
    assert placed(idle, again) == [2]
    assert again.position > Position(1, 4, 2054, 0)


def test_a_snapshot_ahead_of_the_stream_stays_in_its_lineage():
    # Offsets lost or a binlog purged: the connector snapshots again where the binlog is.
    book = MemoryBook()
    p = Placer(book, "t[0]")
    assert placed(p, ev(4, 754, seq=7), snap(4, 9000, ts=5), ev(4, 9100, seq=30, ts=6)) == \
        [1, 1, 1]
    assert book.records() == []


def test_snapshot_ends_and_coordinate_less_events_keep_the_partitions_lineage():
    book = MemoryBook()
    p = Placer(book, "t[0]")
    placed(p, ev(4, 754, seq=7, ts=1), ev(1, 1914, server=2, seq=8, ts=5))
    end = snap(1, 1914, row=SNAPSHOT_END_ROW)
    schema = snap(1, 1914, row=SNAPSHOT_SCHEMA_ROW)
    canal = ev(0, 0, server=None)
    assert placed(p, canal, end) == [2, 2]
    assert p.tail.coordinates == (1, 1914)
    assert placed(p, schema) == [2]  # at the tail's own coordinates: not behind it


def test_two_partitions_raising_at_once_agree_on_one_lineage():
    class RacingBook(MemoryBook):
        """Another partition raises lineage 2 between this one's read and its raise."""

        def raise_lineage(self, record: LineageRecord, expected: int) -> list[LineageRecord]:
            if not self.kept:
                super().raise_lineage(LineageRecord(2, FAILOVER, 1, 1800, first_seq=7,
                                                    domain="0", server_id=2, start_seq=7,
                                                    ts=T0 + 4000, previous_server_id=1,
                                                    seen="other[0]@9"), 0)
                raise LineageRaced("raced")
            return super().raise_lineage(record, expected)

    book = RacingBook()
    p = Placer(book, "t[0]")
    assert placed(p, ev(4, 754, seq=6, ts=1), ev(1, 1914, server=2, seq=8, ts=5)) == [1, 2]
    assert [r.number for r in book.records()] == [2]
    assert book.records()[0].seen == "other[0]@9"


def test_a_run_starts_from_the_tail_the_changelog_recorded_and_looks_up_its_origin_once():
    looked = []

    def origin() -> Mark:
        looked.append(1)
        return Mark(1, 4, 754, 1, "0-1-7", T0 + 1000)

    p = Placer(MemoryBook(), "t[0]", Mark(1, 4, 754), origin)
    assert placed(p, ev(4, 800, seq=8, ts=2), ev(4, 900, seq=9, ts=3)) == [1, 1]
    assert looked == [1]
    p = Placer(MemoryBook(), "t[0]", Mark(1, 4, 754), origin)
    with pytest.raises(UnorderedEventError, match="no sign"):
        p.place(ev(4, 100, ts=5))  # behind, later: the looked-up origin says the same server


def test_a_new_partition_starts_in_the_latest_lineage_its_first_change_belongs_to():
    book = MemoryBook([LineageRecord(2, FAILOVER, 1, 1914, first_seq=8, domain="0",
                                     server_id=2, start_seq=8, ts=T0 + 5000,
                                     previous_server_id=1)])
    assert placed(Placer(book, "new[0]"), ev(1, 3000, server=2, seq=20, ts=9)) == [2]
    assert placed(Placer(book, "old[0]"), ev(4, 300, seq=3, ts=0)) == [1]


def test_records_round_trip_through_json():
    record = LineageRecord(3, SNAPSHOT, 1, 555, ts=T0, seen="x[0]@4", raised_at="2026-11-27")
    assert LineageRecord.from_json(record.to_json()) == record
    assert "re-snapshot" in record.describe() and "000001:555" in record.describe()


def test_a_schema_only_snapshot_in_the_binlog_of_a_later_lineage_joins_it():
    # The connector rebuilt its schema history after a failback (snapshot.mode recovery):
    # the schema-change topic, which saw nothing since the failover, gets the snapshot's
    # DDL at the coordinates of the promoted server's binlog, not a reset's.
    book = MemoryBook()
    rows, schema = Placer(book, "rows[0]"), Placer(book, "schema[0]")
    placed(schema, ev(4, 400, seq=3, ts=0, op="ddl"))
    placed(rows, ev(4, 754, seq=7, ts=1), ev(1, 1914, server=2, seq=8, ts=5))
    assert placed(schema, snap(1, 85975, row=SNAPSHOT_SCHEMA_ROW, ts=30)) == [2]
    assert [r.number for r in book.records()] == [2]
    # Behind the latest switch's binlog instead: a reset, a lineage of its own.
    assert placed(rows, snap(1, 500, ts=40)) == [3]


def test_a_change_behind_a_snapshot_and_committed_later_is_of_another_binlog():
    # The schema-change topic's last record is the snapshot's schema (no server, no
    # GTID); its next is an ALTER on the promoted server, at lower coordinates.
    book = MemoryBook()
    p = Placer(book, "schema[0]")
    schema = snap(4, 379, row=SNAPSHOT_SCHEMA_ROW, ts=0)
    alter = ev(1, 3275, server=2, seq=15, ts=30, op="ddl")
    assert placed(p, schema, alter) == [1, 2]
    assert book.records()[0].server_id == 2


def test_the_old_primary_behind_the_new_ones_coordinates_with_an_older_gtid_stops():
    # The new primary's numbering is higher (no lineage raised); the old one writes on.
    p = Placer(MemoryBook(), "t[0]")
    placed(p, ev(1, 900, seq=7, ts=1), ev(4, 300, server=2, seq=9, ts=5))
    with pytest.raises(UnorderedEventError):
        p.place(ev(1, 1200, seq=8, ts=9))
