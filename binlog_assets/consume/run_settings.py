"""What a bounded run is given besides its partition and handlers: its settings
(`RunSettings`), and the parts its caller hands it (`RunParts`: the sink, the hold and
the stop, with their protocols, the decoder and the placer). `consume/run.py` runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from binlog_assets.consume import defaults
from binlog_assets.consume.checkpoint import CheckpointSource
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.slot_routing import ORDERING_KEY

if TYPE_CHECKING:
    from binlog_assets.consume.lineage import Placer
    from binlog_assets.consume.snapshot_end import CoveredTables
    from binlog_assets.formats.base import ChangeDecoder
    from binlog_assets.formats.event import ChangeEvent


class ContiguousSink(Protocol):
    """Receives, at each commit point, every event of the offsets below `end_offset` not
    yet given, in offset order, before Kafka's commit (the changelog writer)."""

    def __call__(self, events: list[ChangeEvent], raw: dict[int, bytes],
                 end_offset: int) -> None: ...


class LastCommitHold(Protocol):
    """Takes a run's last commit point, to commit it with other runs' (one changelog
    commit, one Kafka commit): the events not yet given to the sink, their raw values,
    the offset and its commit metadata. Until then nothing of it is committed."""

    def __call__(self, events: list[ChangeEvent], raw: dict[int, bytes], offset: int,
                 metadata: str) -> None: ...


class StopSignal(Protocol):
    """Asks a run to stop early: a `threading.Event`, or a process pool's `Event`."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class RunSettings:
    """What one bounded run needs besides the partition and its handlers."""

    kafka_conf: dict
    group_id: str
    format: str
    ordering: str = ORDERING_KEY
    table_ordering: dict[str, str] = field(default_factory=dict)
    # Parallel lanes: how many events (of different ordering keys) may be handled at
    # once. Ordering keys hash into lanes * key_slots_per_lane serial key slots, and a
    # lane takes whichever slot has work, so uneven hashing does not leave lanes idle.
    lanes: int = defaults.LANES
    workers: int | None = None  # threads serving the lanes; default `default_workers`
    key_slots_per_lane: int = defaults.KEY_SLOTS_PER_LANE
    max_in_flight: int = defaults.MAX_IN_FLIGHT
    error_policy: ErrorPolicy = field(default_factory=ErrorPolicy)
    handler_timeout_seconds: float | None = defaults.HANDLER_TIMEOUT_SECONDS
    source: str = defaults.UNNAMED_SOURCE  # the config's source name (its dead letters)
    dead_letter_topic: str | None = None  # default: the source's
    max_records: int | None = None
    max_seconds: float | None = None
    start_offset: int | None = None  # explicit override, first in the precedence
    extra_checkpoint_sources: tuple[CheckpointSource, ...] = ()
    # The group's committed offset as the caller read it (with other partitions' at once),
    # instead of the run's own read: with its last commit held (`LastCommitHold`), a run's
    # consumer then asks the group coordinator nothing unless it commits on its way.
    kafka_checkpoint: CheckpointSource | None = None
    commit_interval_seconds: float = defaults.COMMIT_INTERVAL_SECONDS
    # librdkafka's synchronous commit never times out by itself (Java's is 60 s).
    commit_timeout_seconds: float = defaults.COMMIT_TIMEOUT_SECONDS
    batch_size: int = defaults.BATCH_SIZE
    key_columns: dict[str, list[str]] | None = None
    # The schema registry client's settings, for formats that need one (secrets inside).
    schema_registry: dict[str, Any] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class RunParts:
    """What a caller hands a run besides its settings; a bare run needs none of them.

    `decoder`: the partition's (default: one made from the settings' format); `sink`,
    `hold`, `stop`: as their protocols say; `placer`: the source's lineages
    (`consume/lineage.py`; default: kept for the run alone); `covered`: the tables a
    snapshot read, for its end (`consume/snapshot_end.py`; default: none known)."""

    decoder: ChangeDecoder | None = None
    sink: ContiguousSink | None = None
    stop: StopSignal | None = None
    hold: LastCommitHold | None = None
    placer: Placer | None = None
    covered: CoveredTables | None = None


__all__ = ["ContiguousSink", "LastCommitHold", "RunParts", "RunSettings", "StopSignal"]
