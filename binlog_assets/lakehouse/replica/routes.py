"""Which source tables feed which replica: the routing rules read from the table configs.

A `TableConfig.source` is read the way the handler registry reads a pattern: letters,
digits, `_` and `$` around exactly one dot is an exact `db.table` name; anything else is
a regular expression matched against the whole `db.table` (`shop_\\d+\\.orders_\\d+`).
Several table configs may name one replica. When a replica gathers more than one source
table (a regex, or several configs), `_source_db` and `_source_table` join its key, so
shards holding equal ids stay separate rows; a replica of one exact table keys on the
source's key alone (both columns are still stored, for lineage). The table configs of
one replica agree on its settings (`config.REPLICA_SETTINGS`, checked at load), so the
first one speaks for all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from binlog_assets.config import (
    OnDrop,
    PipelineConfig,
    ReplicaMode,
    SchemaEvolution,
    TableConfig,
)

_EXACT_NAME = re.compile(r"[\w$]+\.[\w$]+")

SOURCE_KEY_COLUMNS = ("_source_db", "_source_table")


@dataclass(frozen=True)
class ReplicaRoute:
    """Everything the replica build needs to know about one replica's sources."""

    replica: str
    tables: tuple[TableConfig, ...]
    key_columns: tuple[str, ...] | None
    replica_mode: ReplicaMode
    schema_evolution: SchemaEvolution
    history: bool
    sharded: bool
    on_drop: OnDrop
    _exact: frozenset[str]
    _patterns: tuple[re.Pattern[str], ...]

    def matches(self, table: str) -> bool:
        """True when the source table `db.table` feeds this replica."""
        return table in self._exact or any(p.fullmatch(table) for p in self._patterns)

    def select(self, tables: Iterable[str]) -> list[str]:
        """The subset of `tables` routed here, sorted (a stable filter for Spark)."""
        return sorted({t for t in tables if t is not None and self.matches(t)})


def replica_routes(pipeline: PipelineConfig) -> dict[str, ReplicaRoute]:
    """Every configured replica and its route."""
    by_replica: dict[str, list[TableConfig]] = {}
    for source in pipeline.sources:
        for table in source.tables:
            by_replica.setdefault(table.replica, []).append(table)
    return {name: _route(name, tables) for name, tables in by_replica.items()}


def replica_route(pipeline: PipelineConfig, replica: str) -> ReplicaRoute:
    """The route of one replica; a KeyError names the configured replicas otherwise."""
    routes = replica_routes(pipeline)
    if replica not in routes:
        raise KeyError(f"no table config has replica {replica!r}; configured: {sorted(routes)}")
    return routes[replica]


def _route(replica: str, tables: list[TableConfig]) -> ReplicaRoute:
    exact = frozenset(t.source for t in tables if _EXACT_NAME.fullmatch(t.source))
    patterns = tuple(re.compile(t.source) for t in tables if t.source not in exact)
    first = tables[0]
    return ReplicaRoute(
        replica=replica,
        tables=tuple(tables),
        key_columns=first.key_columns,
        replica_mode=first.replica_mode,
        schema_evolution=first.schema_evolution,
        history=first.history,
        on_drop=first.on_drop,
        sharded=bool(patterns) or len(tables) > 1,
        _exact=exact,
        _patterns=patterns,
    )
