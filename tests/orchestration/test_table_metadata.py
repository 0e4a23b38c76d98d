"""Dagster's standard table metadata on binlake's table assets, and the Kafka source
assets upstream of the changelog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pyarrow as pa
import yaml

from binlog_assets.orchestration.table_metadata import (
    CHANGELOG_COLUMN_DOCS,
    delta_column_schema,
    delta_row_count,
    type_name,
)


def test_table_assets_name_their_tables_columns_and_sources(binlake_env: Path) -> None:
    from binlog_assets.definitions import PIPELINE, defs
    from binlog_assets.lakehouse.changelog import changelog_uri
    from binlog_assets.lakehouse.changelog_rows import CHANGELOG_COLUMNS

    graph = defs.resolve_asset_graph()
    db = PIPELINE.lakehouse.database
    changelog = graph.get(dg.AssetKey("changelog"))
    md = changelog.metadata
    assert md["dagster/table_name"] == f"{db}.changelog"
    assert md["dagster/uri"].value == changelog_uri(PIPELINE)
    columns = md["dagster/column_schema"].columns
    assert [(c.name, c.type) for c in columns] == list(CHANGELOG_COLUMNS)
    assert all(c.description == CHANGELOG_COLUMN_DOCS[c.name] for c in columns)
    # Every source's topics are an asset upstream of the changelog.
    sources = {dg.AssetKey(["kafka", s.name]) for s in PIPELINE.sources}
    assert changelog.parent_keys == sources
    for key in sources:
        assert graph.get(key).is_external
    from binlog_assets.orchestration.replica_reports import replica_names

    assert replica_names(PIPELINE)
    for name in replica_names(PIPELINE):
        replica = graph.get(dg.AssetKey(["replica", name])).metadata
        assert replica["dagster/table_name"] == f"{db}.{name}"
        assert replica["dagster/uri"].value.endswith(f"{db}.db/{name}")


def test_delta_schema_types_read_as_spark_sql_names_them(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    data = pa.table({
        "id": pa.array([1, 2], pa.int64()),
        "n": pa.array([1, 2], pa.int32()),
        "amount": pa.array([Decimal("1.50"), None], pa.decimal128(20, 2)),
        "tags": pa.array([["a"], []], pa.list_(pa.string())),
        "at": pa.array([0, 1], pa.timestamp("us", tz="UTC")),
    })
    write_deltalake(str(tmp_path / "t"), data)
    schema = delta_column_schema(str(tmp_path / "t"))
    assert [(c.name, c.type) for c in schema.columns] == [
        ("id", "bigint"), ("n", "int"), ("amount", "decimal(20,2)"),
        ("tags", "array<string>"), ("at", "timestamp")]
    assert delta_row_count(str(tmp_path / "t")) == 2
    write_deltalake(str(tmp_path / "t"), data, mode="append")
    assert delta_row_count(str(tmp_path / "t")) == 4


def test_type_names_of_nested_types() -> None:
    from deltalake.schema import ArrayType, Field, MapType, PrimitiveType, StructType

    assert type_name(MapType(PrimitiveType("string"), PrimitiveType("long"))) == \
        "map<string,bigint>"
    assert type_name(StructType([Field("a", PrimitiveType("short")),
                                 Field("b", ArrayType(PrimitiveType("byte")))])) == \
        "struct<a:smallint,b:array<tinyint>>"


def test_assets_name_their_owners_and_link_to_their_code(tmp_path: Path) -> None:
    from binlog_assets.environment import REPO_ROOT

    pipeline = yaml.safe_load((REPO_ROOT / "binlake.yaml").read_text())
    pipeline["dagster"]["owners"] = ["data@example.com", "team:lakehouse"]
    path = tmp_path / "binlake.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    # In a fresh interpreter: the definitions module reads its config once, at import.
    probe = ("import json; import dagster as dg; from binlog_assets.definitions import defs;"
             "g = defs.resolve_asset_graph();"
             "print(json.dumps({k.to_user_string(): [list(g.get(k).owners), [r.file_path "
             "for r in g.get(k).metadata.get('dagster/code_references', "
             "dg.CodeReferencesMetadataValue(code_references=[])).code_references]] "
             "for k in g.get_all_asset_keys()}))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "BINLAKE_CONFIG": str(path)},
                          cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {k: owners for k, (owners, _) in found.items()} == {
        k: ["data@example.com", "team:lakehouse"] for k in found}
    assert found["changelog"][1][0].endswith("orchestration/changelog_asset.py")
    assert found["replica/customers"][1][0].endswith("orchestration/replica_assets.py")
