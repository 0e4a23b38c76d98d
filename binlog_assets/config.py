"""Pipeline configuration: one YAML file turned into validated, typed models.

The file is named by `BINLAKE_CONFIG` (default: `binlake.yaml` at the repository root).
Any string value may name environment variables, `${NAME}` or `${NAME:-default}`
(`$${` is a literal `${`), resolved when the file loads, so secrets stay out of it.
Everything is checked when the code location loads: an unknown field, a bad value, an
invalid regex or an unknown librdkafka property fails with `ConfigError` naming the
field by its path (`sources[0].tables[1].ordering`), never later inside a run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from binlog_assets.consume import defaults
from binlog_assets.consume.lane_routing import ORDERING_KEY, ORDERING_MODES
from binlog_assets.environment import REPO_ROOT
from binlog_assets.parity.settings import ParityConfig, SourceConnection

if TYPE_CHECKING:
    from binlog_assets.consume.handlers import HandlerRegistry

CONFIG_ENV = "BINLAKE_CONFIG"
DEFAULT_CONFIG_PATH = REPO_ROOT / "binlake.yaml"

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

# Matched whole (`fullmatch`): `$` would also match before a trailing newline.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _plain_identifier(v: str) -> str:
    if not _IDENT.fullmatch(v):
        raise ValueError("must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*)")
    return v


# A name that goes into SQL and topic names unquoted: checked whole, once, here.
Identifier = Annotated[str, AfterValidator(_plain_identifier)]
# Key slots are small objects, but a DDL barrier visits every one of them.
_MAX_KEY_SLOTS = 32_768


# Settings of a table config that shape its replica table, equal for all its sources.
REPLICA_SETTINGS = ("key_columns", "replica_mode", "schema_evolution", "history", "on_drop")


class ConfigError(ValueError):
    """A configuration problem; the message names the offending field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TableConfig(_Model):
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
        from binlog_assets.lakehouse.identifiers import UnsafeIdentifierError, check_columns

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



class SourceConfig(_Model):
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


TableFeature = Literal["deletion_vectors", "column_mapping", "type_widening"]


class LakehouseConfig(_Model):
    path: str = Field("var/lakehouse", description="root of the warehouse and the catalog")
    database: Identifier = Field(
        "binlake", description="catalog database of the changelog and replica tables")
    tombstone_retention_hours: float = Field(
        168.0, gt=0, description="how long a delete's tombstone keeps late older changes out")
    rewrite_ratio: float = Field(
        0.5, ge=0,
        description="a batch with at least this many changes per row already in the "
                    "replica rewrites it in one pass (one ranking per key, one overwrite) "
                    "instead of MERGEing: a catch-up touches every file anyway; 0: always")
    driver_commit_rows: int = Field(
        200_000, ge=0,
        description="a batch of at most this many changelog rows for a replica is "
                    "committed from the driver by delta-rs (MERGE with the same guard, or "
                    "an append), and one of row changes only is also reduced and typed "
                    "there, without a Spark job; 0: Spark does every batch")
    table_features: list[TableFeature] = Field(
        default_factory=list,
        description="opt-in Delta features of new replica tables (and their history "
                    "tables) beyond what every mainstream reader opens (delta-rs, polars, "
                    "DuckDB, Trino): deletion_vectors, column_mapping, type_widening "
                    "(README: Table features)")

    vacuum_retention_hours: float = Field(
        168.0, ge=168,
        description="VACUUM keeps every file a version this recent needs (Delta refuses "
                    "less than its 7-day default, and binlake keeps that check)")
    zorder_replicas: bool = Field(
        False, description="maintenance clusters each replica by its key (OPTIMIZE ZORDER "
                           "BY) instead of compacting it only")
    changelog_retention_days: int | None = Field(
        None, ge=1,
        description="maintenance deletes changelog rows ingested more than this many days "
                    "ago that every replica has applied (unset: the changelog keeps every row)")

    @field_validator("table_features")
    @classmethod
    def _no_repeats(cls, features: list[str]) -> list[str]:
        if len(set(features)) != len(features):
            raise ValueError(f"{features} names a feature twice")
        return features

    @property
    def is_local(self) -> bool:
        return "://" not in self.path

    def resolved_path(self) -> Path:
        """The local lakehouse directory (relative paths are under the repository)."""
        if not self.is_local:
            raise ValueError(f"lakehouse.path {self.path!r} is not a local path")
        p = Path(self.path)
        return p if p.is_absolute() else (REPO_ROOT / p).resolve()

    def uri(self, *parts: str) -> str:
        """A location under the lakehouse, for local paths and `s3a://` URIs alike
        (`Path` would fold the `//` of a URI)."""
        base = str(self.resolved_path()) if self.is_local else self.path.rstrip("/")
        return "/".join([base, *parts])


class SparkConfig(_Model):
    master: str = Field(
        "local[2]", pattern=r"^\S+$",
        description="`local[N]`, or a cluster (`spark://host:port`, `yarn`, `k8s://...`); a "
                    "standalone master on this machine is started by the local stack")
    remote: str | None = Field(
        None, pattern=r"^sc://[^\s/:]+:[0-9]+(/[^\s]*)?$",
        description="a Spark Connect server (`sc://host:port`) that runs every Spark step: "
                    "one warm JVM for all runs instead of one per run; unset: Spark in "
                    "each run's process")
    conf: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="any Spark setting; overrides binlake's own")
    parallel_replicas: int = Field(
        2, ge=1, le=64, description="replicas one build applies at once, each in a Spark "
                                    "session of its own")
    class_archive: bool = Field(
        True, description="map the driver class archive `make setup` builds "
                          "(dev/class_archive.py) into each driver JVM this process starts; "
                          "off: every driver loads its classes anew")
    driver_jit: Literal["c1", "tiered"] = Field(
        "c1", description="the JIT of the driver JVMs binlake starts: `c1` stops at the quick "
                          "compiler (-XX:TieredStopAtLevel=1); `tiered` is the JVM's "
                          "default, whose C2 only pays off in long jobs with cores to spare "
                          "(bench/RESULTS.md, \"The driver's JIT\")")

    @property
    def master_port(self) -> int | None:
        """The port of a standalone master on this machine, None for any other master."""
        m = re.fullmatch(r"spark://(127\.0\.0\.1|localhost):([0-9]+)", self.master)
        return int(m.group(2)) if m else None

    @property
    def remote_port(self) -> int | None:
        """The port of a Spark Connect server on this machine, None for any other."""
        if self.remote is None:
            return None
        host, _, rest = self.remote[len("sc://"):].partition(":")
        if host not in ("127.0.0.1", "localhost"):
            return None
        return int(rest.split("/", 1)[0])


_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_TEAM = re.compile(r"team:[A-Za-z0-9_-]+")


class DagsterConfig(_Model):
    lag_threshold: int = Field(1, ge=0, description="records of lag that trigger a run")
    max_staleness_seconds: int = Field(
        300, ge=0, description="request a run for any lag older than this")
    max_lag_records: int = Field(10_000, ge=0, description="the lag check fails above this")
    max_records_per_run: int | None = Field(
        None, ge=1, description="cap on records per bounded run; unset: none")
    max_seconds_per_run: float | None = Field(
        None, gt=0, description="cap on seconds per bounded run; unset: none")
    commit_timeout_seconds: float = Field(
        defaults.COMMIT_TIMEOUT_SECONDS, gt=0, le=3600,
        description="a Kafka offset commit with no answer within this fails the run")
    max_partitions_per_run: int = Field(
        50, ge=1, le=10_000,
        description="topic-partitions one consumer run serves at most (lag sensor batches, "
                    "backfill runs)")
    worker_processes: int | None = Field(
        None, ge=0, le=64,
        description="processes besides its own that a consumer run hands partitions to "
                    "when its backlog is large (unset: one per CPU core beyond the first; "
                    "0: none)")
    worker_backlog_records: int = Field(
        200_000, ge=1,
        description="records to read across a run's partitions from which it uses "
                    "worker processes")
    changelog_follow_seconds: float = Field(
        0, ge=0, le=86_400,
        description="0: `kafka_lag_sensor` launches bounded consumer runs where lag builds "
                    "up; above 0, a changelog follower run (`follow_changelog_job`, kept "
                    "going by `changelog_follower_sensor`) consumes each partition's new "
                    "records as they arrive, for this many seconds per run")
    changelog_poll_seconds: float = Field(
        0.5, gt=0, le=60, description="how often an idle changelog follower run measures "
                                      "the partitions' lag")
    replica_follow_seconds: float = Field(
        0, ge=0, le=86_400,
        description="0: automation builds the replicas after each consumer run; above 0, a "
                    "follower run (`follow_replicas_job`, kept going by "
                    "`replica_follower_sensor`) applies each new changelog version as it "
                    "lands, for this many seconds per run")
    replica_poll_seconds: float = Field(
        0.5, gt=0, le=60, description="how often a follower run looks for a new changelog "
                                      "version (a read of the changelog's log)")
    replica_delay_alert_seconds: float = Field(
        900.0, gt=0,
        description="a replica's `source_delay` check warns when the newest change an apply "
                    "wrote reached the replica more than this many seconds after its "
                    "source commit")
    owners: list[str] = Field(
        default_factory=list,
        description="owners of binlake's assets in the UI: emails or `team:<name>`")

    @field_validator("owners")
    @classmethod
    def _owners_are_emails_or_teams(cls, owners: list[str]) -> list[str]:
        # Dagster's own rule, checked here so a bad owner fails at load naming the field.
        for owner in owners:
            if not (_EMAIL.fullmatch(owner) or _TEAM.fullmatch(owner)):
                raise ValueError(f"{owner!r} is neither an email nor 'team:<name>'")
        return owners


class PipelineConfig(_Model):
    """The whole pipeline: Kafka client settings, the lakehouse, Spark and the sources."""

    kafka: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="librdkafka properties, passed through; `bootstrap.servers` unset means "
                    "the embedded broker")
    lakehouse: LakehouseConfig = Field(
        LakehouseConfig(), description="where the changelog and the replicas are kept")
    spark: SparkConfig = Field(SparkConfig(), description="the Spark that builds the replicas")
    dagster: DagsterConfig = Field(
        DagsterConfig(), description="runs, sensors and checks of the code location")
    schema_registry: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="the schema registry client's settings (confluent-kafka's "
                    "SchemaRegistryClient keys: url, basic.auth.user.info, "
                    "ssl.ca.location, ...), for `debezium-avro` sources, and binlake's "
                    "`binlake.unknown.schema.id` (`stop`, the default, or `dead-letter`)")
    sources: tuple[SourceConfig, ...] = Field(
        (), description="the change streams: Kafka topics in one format, and their tables")
    parity: ParityConfig = Field(
        ParityConfig(), description="how the parity check reads its sources and when it runs")

    @field_validator("kafka")
    @classmethod
    def _kafka_keys_known(cls, v: dict[str, Any]) -> dict[str, Any]:
        # librdkafka knows its own properties best: a client built without brokers
        # rejects an unknown key at once and never touches the network. A consumer
        # accepts producer-only keys (it warns and ignores them), so one probe covers both.
        from confluent_kafka import Consumer, KafkaException

        probe = {k: val for k, val in v.items() if k != "bootstrap.servers"}
        try:
            Consumer({**probe, "group.id": "binlake-config-probe", "log_level": 0}).close()
        except (KafkaException, ValueError, TypeError) as e:
            raise ValueError(f"librdkafka rejects it: {e}") from e
        return v

    @field_validator("schema_registry")
    @classmethod
    def _registry_keys_known(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not v:
            return v
        from binlog_assets.formats.debezium_avro import registry_settings

        client, _ = registry_settings(v)  # its error names binlake's key and its values
        if not v.get("url"):
            raise ValueError("`url` is required (the registry's http(s) address)")
        for key, value in client.items():  # the client's own error would not name the file
            if key.endswith(".location") and not Path(str(value)).is_file():
                raise ValueError(f"`{key}`: no such file {value!r}")
        # The client checks its keys when built, without a request.
        from confluent_kafka.schema_registry import SchemaRegistryClient

        try:
            SchemaRegistryClient(client)
        except (ValueError, TypeError, OSError) as e:
            raise ValueError(f"the schema registry client rejects it: {e}") from e
        return v

    @model_validator(mode="after")
    def _avro_has_registry(self) -> PipelineConfig:
        for i, source in enumerate(self.sources):
            if source.format == "debezium-avro" and not self.schema_registry:
                raise ValueError(
                    f"sources[{i}].format: 'debezium-avro' reads schemas from a registry, "
                    f"but `schema_registry` is not set (give at least its `url`)")
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> PipelineConfig:
        names = [s.name for s in self.sources]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"sources: duplicate source name(s) {sorted(dup)}")
        topics = [t for s in self.sources for t in s.topics]
        dup = {t for t in topics if topics.count(t) > 1}
        if dup:
            raise ValueError(f"sources: topic(s) {sorted(dup)} belong to more than one source")
        return self

    @model_validator(mode="after")
    def _one_setting_per_replica(self) -> PipelineConfig:
        # Table configs naming one replica build one table: they must agree on its shape,
        # here at load rather than in the first replica build.
        first: dict[str, tuple[str, TableConfig]] = {}
        for i, source in enumerate(self.sources):
            for j, table in enumerate(source.tables):
                path = f"sources[{i}].tables[{j}]"
                seen = first.setdefault(table.replica, (path, table))
                for setting in REPLICA_SETTINGS:
                    if getattr(table, setting) != getattr(seen[1], setting):
                        raise ValueError(
                            f"{path}.{setting}: {getattr(table, setting)!r} differs from "
                            f"{seen[0]}.{setting} ({getattr(seen[1], setting)!r}), and both "
                            f"build replica {table.replica!r}: one replica has one setting")
        return self

    @property
    def bootstrap_servers(self) -> str | None:
        v = self.kafka.get("bootstrap.servers")
        return str(v) if v else None

    def source(self, name: str) -> SourceConfig:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(f"no source named {name!r}; configured: {[s.name for s in self.sources]}")

    def source_for_topic(self, topic: str) -> SourceConfig:
        # A name wins over a regex; between regexes, the first source listed.
        for s in [*(s for s in self.sources if topic in s.topics), *self.sources]:
            if s.matches(topic):
                return s
        raise KeyError(f"topic {topic!r} belongs to no configured source")


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(root)"


_ENV_REF = re.compile(r"\$(\$)?\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env(data: Any, origin: str = "<config>", path: tuple[Any, ...] = ()) -> Any:
    """`data` with every `${NAME}` in its strings replaced by the environment's value; a
    variable that is not set (and has no default) fails naming the field and the
    variable, never a value."""
    if isinstance(data, dict):
        return {k: resolve_env(v, origin, (*path, k)) for k, v in data.items()}
    if isinstance(data, list):
        return [resolve_env(v, origin, (*path, i)) for i, v in enumerate(data)]
    if not isinstance(data, str) or "${" not in data:
        return data

    def value(ref: re.Match[str]) -> str:
        if ref.group(1):
            return ref.group(0)[1:]
        name, default = ref.group(2), ref.group(3)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{origin}: {_field_path(path)}: environment variable {name} is "
                          f"not set")

    return _ENV_REF.sub(value, data)


def parse_config(data: Any, origin: str = "<config>") -> PipelineConfig:
    """Validate a parsed YAML document (its `${NAME}` references resolved); raises
    ConfigError naming each bad field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping, got {type(data).__name__}")
    data = resolve_env(data, origin)
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{_field_path(err['loc'])}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"{origin}: {problems}") from None


def load_config(path: str | os.PathLike[str] | None = None) -> PipelineConfig:
    """Read and validate the pipeline config from `path`, `$BINLAKE_CONFIG` or the default."""
    p = Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {p} not found (set {CONFIG_ENV})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    return parse_config(data, origin=str(p))
