"""Which of its source's binlog histories (lineages) each event of a partition is in.

A position orders changes by binlog coordinates, and coordinates order one server's
binlog only. A source's life puts another binlog under the stream: a failover to a
promoted replica numbers its files on its own (often lower), `RESET MASTER` starts again
at file 1, and the connector then re-snapshots. Each such change starts a lineage,
numbered per source and ranked first in every position, so whatever comes after it
outranks whatever came before, whatever the coordinates say. The numbers are the
source's, not the partition's: positions are compared across a source's topics (its
schema changes, a table's truncates, a cut-over's helper table), so every partition
must place one change of the binlog in the same lineage.

Each partition compares every event with its tail (the furthest event it has placed):

1. Ahead of the tail, or at it (Connect redelivers after a restart at the same
   coordinates): the tail's lineage, unless the source has a later lineage the event
   belongs to (a partition that lagged behind a failover another partition placed).
   Ahead by coordinates but behind by GTID with a later commit time is the old
   primary still writing after a failover (split brain): the partition stops.
2. Behind the tail:
   - a snapshot read starts a lineage (a re-snapshot of a reset binlog), unless it is
     where a later lineage of the source already is; a snapshot's schema alone starts
     none (a connector rebuilding its schema history replays it where it resumes);
   - committed no later than the tail, with no newer GTID: a change read again (Connect
     redelivers after a restart; after a switch the connector reads again from the new
     server what it had read from the old one); it stays below what it copies;
   - a later lineage of the source the event belongs to: joined (another partition
     raised it first);
   - a newer GTID, another server id (GTIDs not comparable) or another GTID domain, or
     any change committed later than a snapshot read it follows: a failover starts a
     lineage;
   - anything else cannot be ordered: the partition stops at the record, naming both
     positions (`UnorderedEventError`), and never guesses.

A new lineage is raised durably (`LineageBook.raise_lineage`, the changelog's own
property) before any event of it is placed, so a partition that meets the same switch
later joins it instead of raising its own. A lineage records the first coordinates seen
in it and, once known, the server whose own changes it holds with the GTID sequence of
the first of them: an event that belongs to it by GTID is one committed after the
switch, and changes the connector read again from the new server are not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from binlog_assets.formats.event import (
    FIRST_LINEAGE,
    SNAPSHOT_END_ROW,
    SNAPSHOT_SCHEMA_ROW,
    ChangeEvent,
    DecodeError,
)

FAILOVER = "failover"
SNAPSHOT = "snapshot"
GTID_DOMAIN = "gtid_domain"


@dataclass(frozen=True, slots=True)
class Gtid:
    """A GTID as an order: MariaDB `domain-server-seq` (the sequence rises per domain
    across servers under gtid_strict_mode) or MySQL `uuid:n` (its own per server uuid)."""

    domain: str
    seq: int

    @classmethod
    def parse(cls, text: str | None) -> Gtid | None:
        if not text:
            return None
        if ":" in text:  # MySQL uuid:n (a set's single interval end, if given one)
            uuid, _, tail = text.rpartition(":")
            seq = tail.rpartition("-")[2]
            return cls(uuid, int(seq)) if seq.isdigit() else None
        parts = text.split("-")
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            return cls(parts[0], int(parts[2]))
        return None


@dataclass(slots=True)
class Mark:
    """What the rules read of a placed event: where and by whom it was written. Mutable:
    a partition's tail is moved in place on the hot path."""

    lineage: int
    file: int
    pos: int
    server_id: int | None = None
    gtid_text: str | None = None
    ts: int | None = None
    snapshot: bool = False

    @property
    def coordinates(self) -> tuple[int, int]:
        return self.file, self.pos

    @property
    def gtid(self) -> Gtid | None:
        return Gtid.parse(self.gtid_text)

    @classmethod
    def of(cls, event: ChangeEvent, lineage: int) -> Mark:
        p = event.position
        return cls(lineage, p.file, p.pos, event.server_id, event.gtid, event.source_ts,
                   p.snapshot)

    def label(self) -> str:
        parts = [f"lineage {self.lineage}, binlog {self.file:06d}:{self.pos}"]
        if self.server_id is not None:
            parts.append(f"server id {self.server_id}")
        if self.gtid_text:
            parts.append(f"GTID {self.gtid_text}")
        if self.snapshot:
            parts.append("snapshot")
        return ", ".join(parts)


@dataclass(frozen=True)
class LineageRecord:
    """A lineage the source has raised: what started it and how to recognise its events."""

    number: int
    cause: str  # FAILOVER, SNAPSHOT or GTID_DOMAIN
    file: int  # the lowest coordinates seen in it
    pos: int
    first_seq: int | None = None  # the GTID sequence at those coordinates
    domain: str | None = None  # the GTID domain (MariaDB) or server uuid (MySQL)
    server_id: int | None = None  # the server whose own changes it holds, once seen
    start_seq: int | None = None  # the GTID sequence of that server's first change
    ts: int | None = None  # commit time (ms) of its first change, or the snapshot's
    previous_server_id: int | None = None  # the server of the tail it was raised from
    seen: str = ""  # topic[partition]@offset of the event that raised it
    raised_at: str = ""  # ISO time of the raise

    @property
    def coordinates(self) -> tuple[int, int]:
        return self.file, self.pos

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != ""}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LineageRecord:
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        return cls(**known)

    def describe(self) -> str:
        what = {FAILOVER: "a change of server (failover)", SNAPSHOT: "a re-snapshot",
                GTID_DOMAIN: "a new GTID domain"}.get(self.cause, self.cause)
        server = f", server id {self.server_id}" if self.server_id is not None else ""
        return (f"lineage {self.number}: {what} at binlog {self.file:06d}:{self.pos}"
                f"{server}, first seen at {self.seen}")


class LineageRaced(RuntimeError):
    """Another partition raised or changed the source's lineages first: read them again."""


class LineageBook(Protocol):
    """The source's lineages, kept durably where every partition reads them. One book per
    source and process: `generation` changes whenever this process sees them change."""

    generation: int

    def records(self) -> list[LineageRecord]:
        """The raised lineages in order (lineage 1 is implicit and has none), read anew."""

    def raise_lineage(self, record: LineageRecord, expected: int) -> list[LineageRecord]:
        """Add `record` (or update the record of the same number) if the book still holds
        `expected` records; raises LineageRaced otherwise. Returns the records after."""


class UnorderedEventError(DecodeError):
    """An event the lineage rules cannot place: its partition stops at its record."""


@dataclass
class MemoryBook:
    """A `LineageBook` in memory: for runs without a changelog, and tests."""

    kept: list[LineageRecord] = field(default_factory=list)
    generation: int = 0

    def records(self) -> list[LineageRecord]:
        return list(self.kept)

    def raise_lineage(self, record: LineageRecord, expected: int) -> list[LineageRecord]:
        if len(self.kept) != expected:
            raise LineageRaced(f"{len(self.kept)} lineages, expected {expected}")
        self.kept = [r for r in self.kept if r.number != record.number] + [record]
        self.kept.sort(key=lambda r: r.number)
        self.generation += 1
        return list(self.kept)


def belongs(mark: Mark, record: LineageRecord) -> bool:
    """Whether an event was committed after `record`'s lineage started (so it is in that
    lineage or a later one)."""
    if record.cause == SNAPSHOT:
        # A reset binlog starts its coordinates and GTID sequences again: only the commit
        # time tells an event after the snapshot from one before the reset.
        return mark.coordinates >= record.coordinates and not _earlier(mark.ts, record.ts)
    if mark.gtid is not None and mark.gtid.domain == record.domain:
        # Changes the connector read again from the new server carry their old sequence.
        return record.start_seq is not None and mark.gtid.seq >= record.start_seq
    return (record.server_id is not None and mark.server_id == record.server_id
            and not _earlier(mark.ts, record.ts))


def _comparable(a: Gtid | None, b: Gtid | None) -> bool:
    return a is not None and b is not None and a.domain == b.domain


class Placer:
    """Places one partition's events in the source's lineages, in Kafka order.

    `tail` is the furthest event the partition has placed, as the changelog recorded it
    (a `Mark` whose server id, GTID and commit time may be unknown); `origin` looks those
    up the first time a rule needs them. `where` names the partition in errors
    (`topic[n]`).
    """

    def __init__(self, book: LineageBook, where: str, tail: Mark | None = None,
                 origin: Callable[[], Mark | None] | None = None,
                 replayed_below: int | None = None) -> None:
        self.book = book
        self.where = where
        self.tail = tail
        # Offsets the changelog holds already (a replay from the launchpad): each is placed
        # on its own by what it carries, and moves no tail.
        self.replayed_below = replayed_below
        self._origin = origin if tail is not None and tail.ts is None else None
        self._generation = book.generation
        self._records = book.records()
        self.lineage = tail.lineage if tail is not None else self._latest()
        self._newer = self._has_newer()
        self.raised: list[LineageRecord] = []  # what this placer raised or updated

    def place(self, event: ChangeEvent) -> None:
        """Set the event's lineage (its position's first field), or raise
        UnorderedEventError. Events must come in the partition's Kafka order."""
        p = event.position
        tail = self.tail
        if self.replayed_below is not None and event.offset < self.replayed_below:
            self._set(event, self._first(Mark.of(event, self.lineage)))
        elif (p.file == 0 and p.pos == 0) or p.row == SNAPSHOT_END_ROW:
            # No coordinates (Kafka order decides), or a snapshot's end after its rows.
            self._set(event, self.lineage)
        elif (tail is not None and not self._newer and event.server_id == tail.server_id
              and (p.file, p.pos) >= (tail.file, tail.pos)
              and self.book.generation == self._generation):
            # The common case: the same server's binlog, further on.
            self._set(event, tail.lineage)
            tail.file, tail.pos, tail.gtid_text, tail.ts = p.file, p.pos, event.gtid, \
                event.source_ts
            tail.snapshot = p.snapshot
        else:
            self._place_slowly(event)

    def _set(self, event: ChangeEvent, lineage: int) -> None:
        if event.position.lineage != lineage:
            event.position = event.position._replace(lineage=lineage)

    def _place_slowly(self, event: ChangeEvent) -> None:
        if self.book.generation != self._generation:
            self._reread()
        fresh = False
        for _ in range(_ATTEMPTS):
            mark = Mark.of(event, self.lineage)
            try:
                lineage, moves = self._decide(event, mark, self._known_tail(), fresh)
            except LineageRaced:
                self._reread()
                fresh = True
                continue
            self._set(event, lineage)
            if moves:
                self.tail = replace(mark, lineage=lineage)
                self.lineage = lineage
                self._newer = self._has_newer()
            return
        raise UnorderedEventError(f"{self.where}@{event.offset}: the source's lineages kept "
                                  f"changing while the event was placed")

    # -- the rules ------------------------------------------------------------------
    def _decide(self, event: ChangeEvent, m: Mark, t: Mark | None, fresh: bool
                ) -> tuple[int, bool]:
        """(the event's lineage, whether it becomes the partition's tail). Before it raises
        a lineage or stops, it reads the book again (LineageRaced) unless `fresh`: another
        partition may have raised the lineage this event is in."""
        if t is None:
            return self._first(m), True
        newer = [r for r in self._records if r.number > t.lineage]
        if m.coordinates >= t.coordinates:
            for r in reversed(newer):
                if belongs(m, r):
                    self._learn(r, m)
                    return r.number, True
            if (_comparable(m.gtid, t.gtid) and m.gtid.seq < t.gtid.seq
                    and m.server_id != t.server_id and _later(m.ts, t.ts)):
                raise self._unordered(event, m, t, "its GTID is older than the partition's "
                                      "last change while it was committed later: a server "
                                      "that is no longer the source's primary still writes "
                                      "(split brain)")
            if m.server_id not in (None, t.server_id):
                self._learn(self._record(t.lineage), m)
            return t.lineage, True
        if m.snapshot:
            for r in reversed(newer):
                if r.cause == SNAPSHOT and r.coordinates == m.coordinates:
                    return r.number, True
            for r in reversed(newer):
                # A partition behind a switch others placed, and a snapshot taken in the
                # binlog the switch went to (a schema-only one, say): that lineage's.
                if r.coordinates <= m.coordinates and not _later(r.ts, m.ts):
                    return r.number, True
            if event.position.row == SNAPSHOT_SCHEMA_ROW:
                # A schema replay alone starts nothing: a connector rebuilding its schema
                # history replays it at the position it resumes from, just behind.
                return t.lineage, False
            _reread_first(fresh)
            return self._raise(event, m, t, SNAPSHOT), True
        if not _later(m.ts, t.ts) and not (_comparable(m.gtid, t.gtid)
                                           and m.gtid.seq > t.gtid.seq):
            # Committed no later than the tail: a change read again (Connect redelivers
            # after a restart, a connector re-reads from another server after a switch).
            # It keeps its coordinates, below what it copies, and changes nothing.
            return t.lineage, False
        for r in reversed(newer):
            if belongs(m, r) or _same_switch(m, r):
                self._learn(r, m)
                return r.number, True
        _reread_first(fresh)
        if _comparable(m.gtid, t.gtid):
            if m.gtid.seq > t.gtid.seq:
                return self._raise(event, m, t, FAILOVER), True
        elif m.server_id is not None and t.server_id is not None and m.server_id != t.server_id:
            return self._raise(event, m, t, FAILOVER), True
        elif m.gtid is not None and t.gtid is not None and m.gtid.domain != t.gtid.domain:
            return self._raise(event, m, t, GTID_DOMAIN), True
        elif t.snapshot and t.server_id is None and t.gtid is None:
            # The tail is a snapshot read, which names no server: committed later at lower
            # coordinates, the change is of another binlog than the snapshot read.
            return self._raise(event, m, t, FAILOVER), True
        raise self._unordered(event, m, t, "it is behind the partition's last change with no "
                              "sign of a new binlog (no snapshot, no newer GTID, the same "
                              "server)")

    def _first(self, m: Mark) -> int:
        """A partition's first event: the latest lineage it was written in."""
        for r in reversed(self._records):
            if belongs(m, r) or (m.snapshot and r.cause == SNAPSHOT
                                 and r.coordinates == m.coordinates):
                return r.number
        return FIRST_LINEAGE

    def _raise(self, event: ChangeEvent, m: Mark, t: Mark, cause: str) -> int:
        number = max([FIRST_LINEAGE, *(r.number for r in self._records)]) + 1
        own = cause != SNAPSHOT and m.server_id is not None and m.server_id != t.server_id
        self._commit(LineageRecord(
            number, cause, m.file, m.pos,
            first_seq=m.gtid.seq if m.gtid else None,
            domain=m.gtid.domain if m.gtid else None,
            server_id=m.server_id if own else None,
            start_seq=m.gtid.seq if own and m.gtid else None,
            ts=m.ts, previous_server_id=t.server_id,
            seen=f"{self.where}@{event.offset}",
            raised_at=datetime.now(UTC).isoformat(timespec="seconds")))
        return number

    def _learn(self, r: LineageRecord | None, m: Mark) -> None:
        """Record what an event placed in `r` tells of it: lower first coordinates, and
        the first change of its own server (not the server of the lineage before)."""
        if r is None or r.cause == SNAPSHOT:
            return
        changes: dict[str, Any] = {}
        if m.coordinates < r.coordinates:
            changes.update(file=m.file, pos=m.pos,
                           first_seq=m.gtid.seq if m.gtid else r.first_seq)
        own = (m.server_id is not None and m.server_id != r.previous_server_id
               and r.server_id in (None, m.server_id))
        if own and (r.start_seq is None or (m.gtid is not None and m.gtid.seq < r.start_seq)):
            changes.update(server_id=m.server_id, start_seq=m.gtid.seq if m.gtid else None,
                           ts=m.ts if r.server_id is None else min(r.ts or m.ts, m.ts))
        if changes:
            self._commit(replace(r, **changes))

    def _commit(self, record: LineageRecord) -> None:
        self._records = self.book.raise_lineage(record, len(self._records))
        self._generation = self.book.generation
        self.raised.append(record)
        self._newer = self._has_newer()

    def _reread(self) -> None:
        self._generation = self.book.generation
        self._records = self.book.records()
        self._newer = self._has_newer()

    def _record(self, number: int) -> LineageRecord | None:
        return next((r for r in self._records if r.number == number), None)

    def _known_tail(self) -> Mark | None:
        """The tail with its server id, GTID and commit time, looked up once if the run
        started from a tail the changelog recorded without them."""
        if self._origin is not None:
            found, self._origin = self._origin(), None
            if found is not None and self.tail is not None and \
                    found.coordinates == self.tail.coordinates:
                self.tail = replace(self.tail, server_id=found.server_id,
                                    gtid_text=found.gtid_text, ts=found.ts)
        return self.tail

    def _latest(self) -> int:
        return self._records[-1].number if self._records else FIRST_LINEAGE

    def _has_newer(self) -> bool:
        return any(r.number > self.lineage for r in self._records)

    def _unordered(self, event: ChangeEvent, m: Mark, t: Mark, why: str
                   ) -> UnorderedEventError:
        return UnorderedEventError(
            f"{self.where}@{event.offset} ({event.table} {event.op}) cannot be placed in "
            f"the source's order: {why}. The event: {m.label()}; the partition's last "
            f"change: {t.label()}. Nothing at or past it is applied. If a server that is "
            f"no longer the primary still runs a connector into these topics, stop it and "
            f"run this partition again from the next offset (run config start_offset: "
            f"{event.offset + 1}); if the source's binlog was reset and the connector "
            f"re-snapshots, this resolves once the snapshot's first rows are consumed")


_ATTEMPTS = 5


def _reread_first(fresh: bool) -> None:
    if not fresh:
        raise LineageRaced("read the source's lineages again first")


def _same_switch(m: Mark, r: LineageRecord) -> bool:
    """An event of the binlog `r` was raised for, read before the event that raised it
    (its coordinates and GTID both lower, or both higher): it joins `r`."""
    if r.cause != FAILOVER or m.gtid is None or r.first_seq is None or \
            m.gtid.domain != r.domain:
        return False
    return (m.coordinates <= r.coordinates) == (m.gtid.seq <= r.first_seq)


def _later(a: int | None, b: int | None) -> bool:
    """`a` committed in a later second than `b` (a binlog keeps whole seconds; a
    snapshot's time, the connector's clock, has milliseconds)."""
    return a is not None and b is not None and a // 1000 > b // 1000


def _earlier(a: int | None, b: int | None) -> bool:
    """Not known to be in `b`'s second or later: unknown counts as earlier."""
    return a is None or b is None or a // 1000 < b // 1000


def describe_records(records: Sequence[LineageRecord]) -> list[str]:
    return [r.describe() for r in records]
