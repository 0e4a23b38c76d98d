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
from typing import Any

import yaml
from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from binlog_assets.config.base import ConfigError, ConfigModel
from binlog_assets.config.dagster import DagsterConfig
from binlog_assets.config.lakehouse import LakehouseConfig, SparkConfig
from binlog_assets.config.load import LoadConfig
from binlog_assets.config.parity import ParityConfig
from binlog_assets.config.source import REPLICA_SETTINGS, SourceConfig, TableConfig
from binlog_assets.environment import REPO_ROOT

CONFIG_ENV = "BINLAKE_CONFIG"
DEFAULT_CONFIG_PATH = REPO_ROOT / "binlake.yaml"


class PipelineConfig(ConfigModel):
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
    load: LoadConfig = Field(
        LoadConfig(), description="how an initial load reads its source tables")

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
