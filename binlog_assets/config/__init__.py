"""The pipeline config (`binlake.yaml`), one module per section: `source` (sources and
their tables), `lakehouse` (lakehouse and Spark), `dagster`, `parity`, `load`; `pipeline` loads
the file and checks what spans sections. Each section's defaults live in its class."""

from binlog_assets.config.base import ConfigError, ConfigModel, Identifier
from binlog_assets.config.dagster import DagsterConfig
from binlog_assets.config.lakehouse import LakehouseConfig, SparkConfig, TableFeature
from binlog_assets.config.load import LoadConfig
from binlog_assets.config.parity import ParityConfig, SourceConnection, TlsConfig
from binlog_assets.config.pipeline import (
    CONFIG_ENV,
    DEFAULT_CONFIG_PATH,
    PipelineConfig,
    load_config,
    parse_config,
    resolve_env,
)
from binlog_assets.config.source import (
    REPLICA_SETTINGS,
    Format,
    OnDrop,
    Ordering,
    ReplicaMode,
    SchemaEvolution,
    SourceConfig,
    TableConfig,
)

__all__ = [
    "CONFIG_ENV", "DEFAULT_CONFIG_PATH", "REPLICA_SETTINGS", "ConfigError", "ConfigModel",
    "DagsterConfig", "Format", "Identifier", "LakehouseConfig", "LoadConfig", "OnDrop", "Ordering",
    "ParityConfig", "PipelineConfig", "ReplicaMode", "SchemaEvolution", "SourceConfig",
    "SourceConnection", "SparkConfig", "TableConfig", "TableFeature", "TlsConfig",
    "load_config", "parse_config", "resolve_env",
]
