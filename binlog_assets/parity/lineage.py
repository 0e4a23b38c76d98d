"""Which of the source's lineages a position read on the source server is in.

A parity check and a re-sync read the source in consistent snapshots at a binlog position
P, which counts only once it is placed in the source's lineages (`consume/lineage.py`):
after a failover, P is a position in the promoted server's binlog, which ranks above
everything before it only as a position of the lineage the failover started. P is
placed as the partitions place an event, against the furthest position the changelog
holds of the source (its partitions' tails), with the server's id and GTID: in the
lineage that event would be in. When that lineage has not been raised yet (the changelog
has not reached the server's binlog: a failover not consumed yet), or the server is not
the one the stream follows (a lagging replica, the old primary), P has no place yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlog_assets.consume.lineage import LineageRecord, Mark, Placer, UnorderedEventError
from binlog_assets.formats.event import ChangeEvent, Position
from binlog_assets.lakehouse.changelog import ChangelogWriter

if TYPE_CHECKING:
    import pymysql

    from binlog_assets.config import PipelineConfig, SourceConfig
    from binlog_assets.parity.source import BinlogPosition


class WouldRaise(Exception):
    """The position starts a lineage the source has not raised."""


@dataclass
class FrozenBook:
    """The source's lineages as read, for placing a position without raising any."""

    kept: list[LineageRecord]
    generation: int = 0

    def records(self) -> list[LineageRecord]:
        return list(self.kept)

    def raise_lineage(self, record: LineageRecord, expected: int) -> list[LineageRecord]:
        raise WouldRaise(record.describe())


@dataclass(frozen=True)
class Placed:
    """The lineage of a source position, or why it has none yet."""

    lineage: int | None
    reason: str = ""


def place_position(pipeline: PipelineConfig, source: SourceConfig, db: pymysql.Connection,
                   position: BinlogPosition, partitions: list[tuple[str, int]], group: str
                   ) -> Placed:
    """The lineage of `position`, read on `db` (the source's server), given the source's
    Kafka `partitions` whose changelog tails say how far the stream came."""
    writer = ChangelogWriter(pipeline)
    tails = [(t, topic, part) for topic, part in partitions
             if (t := writer.tail(group, topic, part)) is not None]
    tail = origin = None
    if tails:
        tail, topic, part = max(tails, key=lambda x: (x[0].lineage, *x[0].coordinates))
        origin = lambda: writer.tail_origin(topic, part, tail)  # noqa: E731
    server_id, gtid = _origin(db, position)
    taken = position.taken_ms if position.taken_ms is not None else int(time.time() * 1000)
    event = ChangeEvent("", "u", (), (), None, None, Position(file=position.file,
                                                              pos=position.pos),
                        taken, server_id=server_id, gtid=gtid)
    placer = Placer(FrozenBook(writer.lineages(source.name)), "the source's snapshot",
                    Mark(tail.lineage, tail.file, tail.pos) if tail else None, origin)
    try:
        placer.place(event)
    except WouldRaise as exc:
        return Placed(None, f"the changelog has not reached the binlog of server {server_id} "
                            f"yet ({exc})")
    except UnorderedEventError as exc:
        return Placed(None, f"the source connection's server (id {server_id}) is not where "
                            f"the stream is: {exc}")
    return Placed(event.position.lineage)


def _origin(db: pymysql.Connection, position: BinlogPosition
            ) -> tuple[int | None, str | None]:
    """The server's id and the GTID of its binlog at `position` (MariaDB's
    BINLOG_GTID_POS, its highest sequence); None where it has none (GTIDs off, or MySQL,
    whose GTIDs do not order across servers anyway)."""
    import pymysql

    with db.cursor() as cur:
        cur.execute("SELECT @@server_id")
        server_id = int(cur.fetchone()[0])
        try:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (position.name, position.pos))
            text = str(cur.fetchone()[0] or "")
        except pymysql.err.MySQLError:  # not MariaDB, or the file is purged already
            return server_id, None
    gtids = [g.strip() for g in text.split(",") if g.strip().count("-") == 2]
    if not gtids:
        return server_id, None
    return server_id, max(gtids, key=lambda g: int(g.rsplit("-", 1)[1]))


def lineage_placer(pipeline: PipelineConfig, source: SourceConfig, db: pymysql.Connection,
                   kafka_conf: dict, group: str) -> Callable[[BinlogPosition], int]:
    """The lineage of a position read on `db` for a re-sync or a load, where the source's
    partitions place it; a position with no place yet raises, saying why."""
    from binlog_assets.parity.lake import high_watermarks

    def lineage(position: BinlogPosition) -> int:
        partitions = list(high_watermarks(kafka_conf, group, source))
        placed = place_position(pipeline, source, db, position, partitions, group)
        if placed.lineage is None:
            raise ValueError(f"the snapshot at {position.name}:{position.pos} cannot be "
                             f"placed in the source's order: {placed.reason}; run it again "
                             f"once the changelog has caught up")
        return placed.lineage

    return lineage
