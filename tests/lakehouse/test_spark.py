"""Real Spark with the Delta jars from .cache: write, read, version history, catalog."""

from __future__ import annotations

from lake_events import MakeConfig, Partition, Source, row

from binlog_assets.config import PipelineConfig
from binlog_assets.lakehouse import spark as spark_module
from binlog_assets.lakehouse.changelog import ChangelogWriter
from binlog_assets.lakehouse.replica.builder import ReplicaBuilder
from binlog_assets.lakehouse.spark import delta_jars, spark_conf


def test_spark_conf_uses_local_delta_jars_only(pipeline_config: PipelineConfig) -> None:
    conf = spark_conf(pipeline_config)
    jars = conf["spark.jars"].split(",")
    assert jars == delta_jars()
    assert any("delta-spark_4.2_2.13" in j for j in jars)
    assert all(j.startswith("/") for j in jars)  # local files, never coordinates
    assert "spark.jars.packages" not in conf
    assert conf["spark.sql.warehouse.dir"].startswith(pipeline_config.lakehouse.path)


def test_delta_write_read_and_history(spark, pipeline_config: PipelineConfig) -> None:
    from delta.tables import DeltaTable

    db = pipeline_config.lakehouse.database
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {db}")
    name = f"{db}.spark_smoke"
    spark.createDataFrame([(1, "a"), (2, "b")], "id int, v string").write.format(
        "delta").mode("overwrite").saveAsTable(name)
    spark.createDataFrame([(3, "c")], "id int, v string").write.format(
        "delta").mode("append").saveAsTable(name)

    assert sorted(r.id for r in spark.table(name).collect()) == [1, 2, 3]
    table = DeltaTable.forName(spark, name)
    assert [r.version for r in table.history().orderBy("version").collect()] == [0, 1]
    assert spark.read.format("delta").option("versionAsOf", 0).table(name).count() == 2
    detail = spark.sql(f"DESCRIBE DETAIL {name}").first()
    assert detail["format"] == "delta"
    assert str(pipeline_config.lakehouse.path) in detail["location"]
    # The table is in the persistent catalog, where dbt (method: session) will find it.
    # SHOW TABLES, as dbt lists them: the session interprets (conftest), and Spark's
    # interpreted `catalog.listTables` fails to decode its rows (EXPRESSION_DECODING_FAILED).
    assert "spark_smoke" in [r.tableName for r in spark.sql(f"SHOW TABLES IN {db}").collect()]


def test_drivers_compile_with_c1_unless_configured_tiered(spark, tmp_path) -> None:
    """`spark.driver_jit`: c1 (the default) stops the driver's JIT at C1, and the test
    session's driver runs so; `tiered` leaves the JVM's default; anything else fails at
    load time, naming the field."""
    import pytest

    from binlog_assets.config import ConfigError, parse_config
    from binlog_assets.lakehouse.spark import C1_ONLY

    lake = {"path": str(tmp_path / "lake")}
    options = spark_conf(parse_config({"lakehouse": lake}))["spark.driver.extraJavaOptions"]
    assert C1_ONLY in options
    tiered = parse_config({"lakehouse": lake, "spark": {"driver_jit": "tiered"}})
    assert C1_ONLY not in spark_conf(tiered)["spark.driver.extraJavaOptions"]
    with pytest.raises(ConfigError, match="driver_jit"):
        parse_config({"lakehouse": lake, "spark": {"driver_jit": "c2"}})
    running = spark.sparkContext._jvm.java.lang.management.ManagementFactory \
        .getRuntimeMXBean().getInputArguments()
    assert set(C1_ONLY.split()) <= {str(a) for a in running}


def test_a_builder_interprets_small_batches_and_gives_back_the_users_settings(
        spark, make_config: MakeConfig) -> None:
    """A small batch's queries run interpreted (compiling their generated code was most of
    a small apply's JVM time); a batch past `INTERPRET_ROWS` gets Spark's compiled code
    again, with whatever the user's `spark.conf` set for it."""
    pipeline = make_config([{"source": "shop.orders", "replica": "orders"}])
    builder = ReplicaBuilder(spark, pipeline)
    # As a user's settings (the test session's own interpret: conftest).
    builder.spark.conf.set("spark.sql.codegen.wholeStage", "true")
    builder.spark.conf.set("spark.sql.codegen.factoryMode", "FALLBACK")
    builder._evaluation = spark_module.Evaluation(builder.spark)
    part, src = Partition(ChangelogWriter(pipeline)), Source("shop.orders")
    conf = builder.spark.conf

    part.write(part.records([[src.insert(row(1)), src.insert(row(2))]]))
    assert builder.apply("orders").written == 2
    assert (conf.get("spark.sql.codegen.wholeStage"),
            conf.get("spark.sql.codegen.factoryMode")) == ("false", "NO_CODEGEN")

    part.write(part.records([[src.insert(row(i)) for i in range(3, 3 + 1_200)]]))
    assert builder.apply("orders").written == 1_200 > spark_module.INTERPRET_ROWS
    assert (conf.get("spark.sql.codegen.wholeStage"),
            conf.get("spark.sql.codegen.factoryMode")) == ("true", "FALLBACK")
