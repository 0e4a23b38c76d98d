"""`sources:`: the change streams, their format, how their events are handled, and
the tables they feed."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from binlog_assets.config.base import ConfigModel, Identifier
from binlog_assets.config.parity import SourceConnection
from binlog_assets.consume import defaults
from binlog_assets.consume.slot_routing import ORDERING_KEY, ORDERING_MODES

if TYPE_CHECKING:
    from binlog_assets.consume.handlers import HandlerRegistry

Ordering = Literal[ORDERING_MODES]
# `debezium-avro`: Debezium through an Avro converter and a schema registry (see
# PipelineConfig.schema_registry).
Format = Literal["debezium", "debezium-avro", "maxwell", "canal", "dts"]
SchemaEvolution = Literal["evolve", "exception", "ignore"]
# `merge`: one row per key (the primary key, or `key_columns`), MERGEd by position;
# `append`: the log of the table's changes, one row per change, no key.
ReplicaMode = Literal["merge", "append"]
# What a replica does when its source table (or database) is dropped.
OnDrop = Literal["truncate", "keep"]

# Key slots are small objects, but a DDL barrier visits every one of them.
_MAX_KEY_SLOTS = 32_768


# Settings of a table config that shape its replica table, equal for all its sources.
REPLICA_SETTINGS = ("key_columns", "replica_mode", "schema_evolution", "history", "on_drop")



class TableConfig(ConfigModel):
    """One source table (or a regex over sharded tables) and the replica it feeds."""

    source: str = Field(description="`db.table`, or a regex fully matching sharded names")
    replica: Identifier = Field(description="replica table name in the lakehouse")
    ordering: Ordering | None = Field(None, description="overrides the source's ordering")
    key_columns: tuple[str, ...] | None = Field(
        None, description="the replica's key instead of the primary key the changes carry "
                          "(for a table without one: columns unique and never null)")
    replica_mode: ReplicaMode = Field(
        "merge", description="`merge`: a row per key; `append`: a row per change. A table "
                             "whose changes carry no key and that sets no key_columns is "
                             "replicated as `append` either way, with a warning")
    schema_evolution: SchemaEvolution = Field(
        "evolve", description="`evolve`, `exception` or `ignore`: what a column change of "
                              "the source does to the replica (README: Schema changes)")
    history: bool = Field(False, description="also keep an SCD type 2 history table")
    on_drop: OnDrop = Field(
        "truncate", description="when the source table or its database is dropped: "
                                "`truncate` its rows leave the replica (as a TRUNCATE "
                                "would); `keep` they stay as they last were")

    @field_validator("key_columns")
    @classmethod
    def _key_columns_named(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("must name at least one column; leave it out to key the "
                             "replica by the primary key its changes carry")
        from binlog_assets.identifiers import UnsafeIdentifierError, check_columns

        try:
            check_columns(v, "key_columns")
        except UnsafeIdentifierError as e:
            raise ValueError(str(e)) from None
        dup = sorted({c for c in v if v.count(c) > 1})
        if dup:
            raise ValueError(f"names {dup} more than once")
        return v

    @model_validator(mode="after")
    def _mode_fits(self) -> TableConfig:
        # An append-only replica has no key to MERGE on and no versions per key to keep.
        if self.replica_mode == "append" and self.key_columns is not None:
            raise ValueError("key_columns is set, but replica_mode: append keeps every change "
                             "and has no key: remove one of the two")
        if self.replica_mode == "append" and self.history:
            raise ValueError("history: true needs a key, but replica_mode: append has none "
                             "(the append-only replica already holds every change): remove "
                             "one of the two")
        return self

    @field_validator("source")
    @classmethod
    def _source_compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid table name or regex: {e}") from e
        return v



class SourceConfig(ConfigModel):
    """A set of Kafka topics in one change-event format."""

    name: Identifier = Field(description="identifier of the source")
    topics: tuple[str, ...] = Field(
        min_length=1, description="topic names; one starting with `^` is a regex (as in "
                                  "Kafka's subscriptions) over the cluster's topics, so a "
                                  "new table's topic joins without a config change")
    format: Format = Field("debezium", description="`debezium`, `debezium-avro`, `maxwell`, "
                                                   "`canal` or `dts`")
    ordering: Ordering = Field(ORDERING_KEY, description="what stays in order: `partition`, "
                                                         "`table` or `key`")
    lanes: int = Field(defaults.LANES, ge=1, le=4096, description="events handled at once, at most")
    workers: int | None = Field(
        None, ge=1, le=256,
        description="threads serving the lanes; unset: min(lanes, "
                    f"{defaults.MAX_DEFAULT_WORKERS})")
    key_slots_per_lane: int = Field(
        defaults.KEY_SLOTS_PER_LANE, ge=1, le=64,
        description="serial key slots per lane: ordering keys hash into lanes * this many "
                    "slots, and a free lane takes any slot with work (1: a key's lane is "
                    "crc32(key) % lanes, and hash skew can leave lanes idle)",
    )
    max_in_flight: int = Field(
        defaults.MAX_IN_FLIGHT, ge=1,
        description="records in flight before the partition is paused (librdkafka's "
                    "prefetch is derived from it unless `kafka` sets it)")
    max_retries: int = Field(defaults.MAX_RETRIES, ge=0,
                             description="retries of a failing handler before dead-lettering")
    handler_timeout_seconds: float | None = Field(
        defaults.HANDLER_TIMEOUT_SECONDS, gt=0,
        description="a handler call running longer is named in the run's log and counted "
                    "in its metadata (`timeouts`); null: never")
    strict: bool = Field(False, description="fail the run on a bad message instead of DLQ")
    dead_letter_topic: str | None = Field(
        None, description="where bad messages go, with their coordinates; unset: "
                          f"`{defaults.dead_letter_topic('<name>')}`")
    tables: tuple[TableConfig, ...] = Field(
        (), description="the source tables this source replicates, and their replicas")
    connection: SourceConnection | None = Field(
        None, description="the source database, read-only, for the parity check; unset: "
                          "the source's replicas are not checked")
    # After `tables`: its check reads them.
    handlers: str | None = Field(
        None, description="`package.module:attribute` naming the HandlerRegistry whose "
                          "handlers this source's events go through")


    @field_validator("topics")
    @classmethod
    def _patterns_compile(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for topic in v:
            if topic.startswith("^"):
                try:
                    re.compile(topic)
                except re.error as e:
                    raise ValueError(f"{topic!r} is not a valid topic regex: {e}") from e
        return v

    def matches(self, topic: str) -> bool:
        """Whether `topic` is one of this source's: named, or matched by a `^` regex."""
        return topic in self.topics or any(
            t.startswith("^") and re.match(t, topic) for t in self.topics)

    @model_validator(mode="after")
    def _slots_bounded(self) -> SourceConfig:
        if self.lanes * self.key_slots_per_lane > _MAX_KEY_SLOTS:
            raise ValueError(
                f"lanes * key_slots_per_lane must be at most {_MAX_KEY_SLOTS:,}, got "
                f"{self.lanes} * {self.key_slots_per_lane}"
            )
        return self

    @field_validator("handlers")
    @classmethod
    def _handlers_fit(cls, v: str | None, info: ValidationInfo) -> str | None:
        from binlog_assets.consume.handlers import load_registry, pattern_covers

        sources = [t.source for t in info.data.get("tables", ())]
        for pattern in load_registry(v).patterns:
            if not any(pattern_covers(pattern, s) for s in sources):
                raise ValueError(
                    f"{v!r} registers a handler for {pattern!r}, which matches none of "
                    f"this source's tables {sources} (a regex must be spelled as the "
                    f"table's source regex)")
        return v

    def handler_registry(self) -> HandlerRegistry:
        """The registry `handlers` names (empty when unset); Python caches the import."""
        from binlog_assets.consume.handlers import load_registry

        return load_registry(self.handlers)

    @property
    def dlq_topic(self) -> str:
        return self.dead_letter_topic or defaults.dead_letter_topic(self.name)


