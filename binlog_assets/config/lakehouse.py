"""`lakehouse:` and `spark:`: where the changelog and the replicas live, and the Spark
that builds the replicas."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import (
    Field,
    field_validator,
)

from binlog_assets.config.base import ConfigModel, Identifier
from binlog_assets.environment import REPO_ROOT

TableFeature = Literal["deletion_vectors", "column_mapping", "type_widening"]


class LakehouseConfig(ConfigModel):
    RENAMED: ClassVar[dict[str, str]] = {"driver_commit_rows": "arrow_commit_rows"}

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
    arrow_commit_rows: int = Field(
        200_000, ge=0,
        description="a batch of at most this many changelog rows for a replica is "
                    "committed by delta-rs as Arrow (MERGE with the same guard, or an "
                    "append), and one of row changes only is also reduced and typed as "
                    "Arrow, without a Spark job; 0: Spark does every batch")
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


class SparkConfig(ConfigModel):
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


