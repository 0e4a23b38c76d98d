"""Dagster's standard table metadata for binlake's Delta tables: each table's name, its
location and its columns on the asset's definition, and its row count (and, for a
replica, its columns as they are now) on each materialization, so that the UI shows
a Columns section and row counts as it does for any table asset.

Everything is read from the Delta log with delta-rs: no Spark job, no catalog call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

from binlog_assets.config import PipelineConfig
from binlog_assets.lakehouse.changelog import (
    changelog_name,
    changelog_uri,
)
from binlog_assets.lakehouse.changelog_rows import CHANGELOG_COLUMNS
from binlog_assets.lakehouse.delta_log import file_rows, open_log

if TYPE_CHECKING:
    from deltalake.schema import ArrayType, MapType, PrimitiveType, StructType

CHANGELOG_COLUMN_DOCS = {
    "topic": "Kafka topic of the record",
    "partition": "Kafka partition of the record",
    "offset": "Kafka offset of the record",
    "row_index": "row within the record (a record may carry several rows)",
    "table": "source table, db.table",
    "op": "c insert, u update, d delete, r snapshot read, t truncate, ddl",
    "key": "primary-key values (JSON)",
    "key_columns": "names of the key columns",
    "before": "row image before the change (JSON)",
    "after": "row image after the change (JSON)",
    "pos_phase": "the source lineage (a failover, binlog reset or re-snapshot starts the "
                 "next; 0: a snapshot read of a lake made before lineages)",
    "pos_file": "binlog file index",
    "pos_pos": "byte position in the binlog file",
    "pos_row": "row within the binlog event (negative: what a snapshot read there)",
    "source_ts": "source commit time (ms since the epoch)",
    "ddl": "the statement of a schema change",
    "column_types": "source column types (JSON)",
    "value_types": "types of values the producer sent without a schema (JSON)",
    "raw": "the Kafka record's value, when the source keeps it",
    "ingested_at": "when binlake appended the row",
    "server_id": "id of the server that wrote the change to its binlog, when the producer "
                 "says",
    "gtid": "the change's GTID, when the producer says",
}

# binlake's own columns of a replica (the rest are the source table's).
REPLICA_COLUMN_DOCS = {
    "_source_db": "source database of the row (shards of one replica keep theirs apart)",
    "_source_table": "source table of the row",
    "_position": "binlog position of the last change applied to the row (phase: its "
                 "lineage)",
    "_op": "that change's op: a deleted row stays as a tombstone (d, t) until purged; "
           "`<replica>_current` holds the live rows",
    "_source_ts": "source commit time of that change",
    "_applied_at": "when binlake applied it",
    "_valid_from": "history: position from which this version of the row held",
    "_valid_to": "history: position at which the next change replaced it (null: current)",
    "_is_current": "history: whether this is the row's current version",
}

# delta-rs spells Delta's primitive types as the protocol does; Spark SQL (what dbt and
# users query with) names some differently.
_SPARK_NAMES = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}


def table_uri(pipeline: PipelineConfig, table: str) -> str:
    """Where a managed table of the lakehouse database lives (the catalog's default)."""
    database = pipeline.lakehouse.database
    return pipeline.lakehouse.uri("warehouse", f"{database}.db", table)


def changelog_definition_metadata(pipeline: PipelineConfig) -> dict[str, object]:
    database, table = changelog_name(pipeline)
    return {
        "dagster/table_name": f"{database}.{table}",
        "dagster/uri": dg.MetadataValue.path(changelog_uri(pipeline)),
        "dagster/column_schema": dg.TableSchema(columns=[
            dg.TableColumn(name, kind, description=CHANGELOG_COLUMN_DOCS.get(name))
            for name, kind in CHANGELOG_COLUMNS]),
    }


def replica_definition_metadata(pipeline: PipelineConfig, name: str) -> dict[str, object]:
    database = pipeline.lakehouse.database
    md: dict[str, object] = {
        "dagster/table_name": f"{database}.{name}",
        "dagster/uri": dg.MetadataValue.path(table_uri(pipeline, name)),
        "current_view": f"{database}.{name}_current",
    }
    if any(t.history for s in pipeline.sources for t in s.tables if t.replica == name):
        md["history_table"] = f"{database}.{name}_history"
        md["history_uri"] = dg.MetadataValue.path(table_uri(pipeline, f"{name}_history"))
    return md


def type_name(kind: ArrayType | MapType | PrimitiveType | StructType) -> str:
    """A delta-rs schema type as Spark SQL names it (`decimal(20,0)`, `array<string>`)."""
    tag = getattr(kind, "type", None)
    if tag == "array":
        return f"array<{type_name(kind.element_type)}>"
    if tag == "map":
        return f"map<{type_name(kind.key_type)},{type_name(kind.value_type)}>"
    if tag == "struct":
        return "struct<" + ",".join(f"{f.name}:{type_name(f.type)}" for f in kind.fields) + ">"
    return _SPARK_NAMES.get(str(tag), str(tag))


def delta_column_schema(uri: str, docs: dict[str, str] | None = None) -> dg.TableSchema:
    """The table's columns as its Delta log declares them now (column mapping's logical
    names), with their nullability and, where `docs` has one, a description."""
    docs = docs or {}
    return dg.TableSchema(columns=[
        dg.TableColumn(f.name, type_name(f.type), description=docs.get(f.name),
                       constraints=dg.TableColumnConstraints(nullable=f.nullable))
        for f in open_log(uri).schema().fields])


def delta_row_count(uri: str) -> int | None:
    """Rows in the table by its log's file statistics (None: a file has none). For an
    append-only table, such as the changelog, that is its row count."""
    return file_rows(open_log(uri))
