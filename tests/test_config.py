"""Config errors fail at load and name the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from binlog_assets.config import ConfigError, load_config, parse_config
from binlog_assets.environment import REPO_ROOT


def test_repository_default_config_is_valid() -> None:
    pipeline = load_config(REPO_ROOT / "binlake.yaml")
    assert pipeline.sources and pipeline.sources[0].format == "debezium"
    assert pipeline.bootstrap_servers is None  # the embedded broker


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"kafka": {"no.such.property": 1}}, "kafka"),
        ({"lakehouse": {"pth": "x"}}, "lakehouse.pth"),
        ({"lakehouse": {"database": "bad; drop"}}, "lakehouse.database"),
        ({"sources": [{"name": "s", "topics": []}]}, "sources[0].topics"),
        ({"sources": [{"name": "s", "topics": ["t"], "format": "avro"}]}, "sources[0].format"),
        ({"sources": [{"name": "s", "topics": ["^shop\\.(orders"]}]}, "sources[0].topics"),
        ({"sources": [{"name": "s", "topics": ["t"],
                       "tables": [{"source": "a.b", "replica": "r", "on_drop": "delete"}]}]},
         "sources[0].tables[0].on_drop"),
        ({"sources": [{"name": "s", "topics": ["t"], "lanes": 0}]}, "sources[0].lanes"),
        ({"sources": [{"name": "s", "topics": ["t"],
                       "tables": [{"source": "a.b", "replica": "r", "ordering": "row"}]}]},
         "sources[0].tables[0].ordering"),
        ({"sources": [{"name": "s", "topics": ["t"],
                       "tables": [{"source": "shop_(\\d+.orders", "replica": "r"}]}]},
         "sources[0].tables[0].source"),
        ({"sources": [{"name": "s", "topics": ["t"],
                       "tables": [{"source": "a.b", "replica": "r`x"}]}]},
         "sources[0].tables[0].replica"),
        # Identifiers are matched whole: a trailing newline is no part of a name.
        ({"sources": [{"name": "s", "topics": ["t"],
                       "tables": [{"source": "a.b", "replica": "orders\n"}]}]},
         "sources[0].tables[0].replica"),
        ({"lakehouse": {"database": "binlake\n"}}, "lakehouse.database"),
        ({"sources": [{"name": "shop\n", "topics": ["t"]}]}, "sources[0].name"),
        ({"spark": {"remote": "localhost:15002"}}, "spark.remote"),
        ({"lakehouse": {"changelog_retention_days": 0}}, "lakehouse.changelog_retention_days"),
        ({"lakehouse": {"changelog_retention_days": "a week"}},
         "lakehouse.changelog_retention_days"),
        *[({"sources": [{"name": "s", "topics": ["t"],
                         "tables": [{"source": "a.b", "replica": "r", **table}]}]},
           f"sources[0].tables[0].{field}")
          for table, field in [
              ({"key_columns": []}, "key_columns"),
              ({"key_columns": "id"}, "key_columns"),
              ({"key_columns": ["id", "id"]}, "key_columns"),
              ({"key_columns": [""]}, "key_columns"),
              ({"key_columns": ["_op"]}, "key_columns"),
              ({"key_columns": [1]}, "key_columns[0]"),
              ({"replica_mode": "upsert"}, "replica_mode"),
          ]],
        ({"spark": {"remote": "sc://localhost:15002\n"}}, "spark.remote"),
        ({"dagster": {"owners": ["data engineering"]}}, "dagster.owners"),
        ({"dagster": {"owners": ["team:data eng"]}}, "dagster.owners"),
        *[({"sources": [{"name": "s", "topics": ["t"], "handlers": spec,
                         "tables": [{"source": "shop.products", "replica": "r"}]}]},
           "sources[0].handlers")
          for spec in ["no_such_module_xyz:registry", "binlog_assets.config:missing",
                       "binlog_assets.config:PipelineConfig", "binlog_assets.config",
                       # registers `shop.customers`, which no table of this source names
                       "binlog_assets.examples.customer_cache:registry"]],
    ],
)
def test_bad_config_names_the_field(data: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert f"{field}:" in str(err.value)


def _table(**settings: object) -> dict:
    return {"sources": [{"name": "s", "topics": ["t"],
                         "tables": [{"source": "a.b", "replica": "r", **settings}]}]}


@pytest.mark.parametrize(("settings", "says"), [
    ({"replica_mode": "append", "key_columns": ["id"]},
     "key_columns is set, but replica_mode: append"),
    ({"replica_mode": "append", "history": True}, "history: true needs a key"),
])
def test_conflicting_replica_settings_fail_at_load_naming_both(settings: dict, says: str
                                                                ) -> None:
    with pytest.raises(ConfigError, match=rf"sources\[0\]\.tables\[0\]: .*{says}"):
        parse_config(_table(**settings))


def test_keyless_table_rules_load() -> None:
    keyed = parse_config(_table(key_columns=["code", "site"])).sources[0].tables[0]
    assert (keyed.key_columns, keyed.replica_mode) == (("code", "site"), "merge")
    log = parse_config(_table(replica_mode="append")).sources[0].tables[0]
    assert (log.key_columns, log.replica_mode) == (None, "append")


def test_duplicate_topics_across_sources_rejected() -> None:
    with pytest.raises(ConfigError, match="belong to more than one source"):
        parse_config({"sources": [{"name": "a", "topics": ["t"]}, {"name": "b", "topics": ["t"]}]})


def test_librdkafka_keys_pass_through() -> None:
    pipeline = parse_config({"kafka": {"bootstrap.servers": "b:9092", "linger.ms": 5,
                                  "security.protocol": "PLAINTEXT", "fetch.min.bytes": 1}})
    assert pipeline.kafka["linger.ms"] == 5
    assert pipeline.bootstrap_servers == "b:9092"


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kafka: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_lakehouse_uri_keeps_object_store_schemes() -> None:
    remote = parse_config({"lakehouse": {"path": "s3a://bucket/lake/"}}).lakehouse
    assert not remote.is_local
    assert remote.uri("warehouse") == "s3a://bucket/lake/warehouse"
    with pytest.raises(ValueError, match="not a local path"):
        remote.resolved_path()
    local = parse_config({"lakehouse": {"path": "/data/lake"}}).lakehouse
    assert local.uri("warehouse") == "/data/lake/warehouse"


def test_spark_remote_names_a_local_server_or_not() -> None:
    local = parse_config({"spark": {"remote": "sc://127.0.0.1:15002"}}).spark
    assert (local.remote, local.remote_port) == ("sc://127.0.0.1:15002", 15002)
    theirs = parse_config({"spark": {"remote": "sc://spark.example:443/;use_ssl=true"}}).spark
    assert theirs.remote_port is None  # the stack starts nothing for someone else's server
    assert parse_config({}).spark.remote is None


def test_values_name_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_TEST_PASSWORD", "s3cr3t-Value")
    monkeypatch.delenv("BINLAKE_TEST_UNSET", raising=False)
    pipeline = parse_config({"kafka": {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "${BINLAKE_TEST_UNSET:-alice}",
        "sasl.password": "${BINLAKE_TEST_PASSWORD}",
        "client.id": "binlake-$${literal}"}})
    assert pipeline.kafka["sasl.password"] == "s3cr3t-Value"
    assert pipeline.kafka["sasl.username"] == "alice"  # the default after `:-`
    assert pipeline.kafka["client.id"] == "binlake-${literal}"


def test_a_missing_variable_fails_at_load_naming_the_field_and_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_PASSWORD_UNSET_X", raising=False)
    with pytest.raises(ConfigError) as err:
        parse_config({"sources": [{"name": "s", "topics": ["t"]}],
                      "kafka": {"sasl.password": "${KAFKA_PASSWORD_UNSET_X}"}},
                     origin="binlake.yaml")
    assert str(err.value) == ("binlake.yaml: kafka.sasl.password: environment variable "
                              "KAFKA_PASSWORD_UNSET_X is not set")


def test_topic_regexes_find_their_source_names_first() -> None:
    pipeline = parse_config({"sources": [
        {"name": "shards", "topics": [r"^shop\.shop_\d+\.orders$"]},
        {"name": "one", "topics": ["shop.shop_7.orders", "other"]},
    ]})
    assert pipeline.source_for_topic("shop.shop_3.orders").name == "shards"
    assert pipeline.source_for_topic("shop.shop_7.orders").name == "one"  # named beats regex
    assert not pipeline.sources[0].matches("shop.shop_3.orders_old")
    with pytest.raises(KeyError, match="belongs to no configured source"):
        pipeline.source_for_topic("shop.customers")


def test_changelog_retention_is_off_unless_set() -> None:
    assert parse_config({}).lakehouse.changelog_retention_days is None
    assert parse_config({"lakehouse": {"changelog_retention_days": 7}}
                        ).lakehouse.changelog_retention_days == 7


def test_the_commit_deadline_defaults_to_60_s_and_must_be_positive() -> None:
    assert parse_config({}).dagster.commit_timeout_seconds == 60
    assert parse_config({"dagster": {"commit_timeout_seconds": 5}}
                        ).dagster.commit_timeout_seconds == 5
    with pytest.raises(ConfigError, match=r"dagster\.commit_timeout_seconds"):
        parse_config({"dagster": {"commit_timeout_seconds": 0}})


@pytest.mark.parametrize(("data", "says"), [
    ({"sources": [{"name": "s", "topics": ["t"], "format": "debezium-avro"}]},
     "sources[0].format: 'debezium-avro' reads schemas from a registry, but "
     "`schema_registry` is not set"),
    ({"schema_registry": {"basic.auth.user.info": "a:b"}}, "schema_registry: Value error, "
     "`url` is required"),
    ({"schema_registry": {"url": "http://r:8081", "bogus.key": 1}},
     "schema_registry: Value error, the schema registry client rejects it: Unrecognized "
     "properties: bogus.key"),
    ({"schema_registry": {"url": "https://r:8081", "ssl.ca.location": "/nowhere/ca.pem"}},
     "schema_registry: Value error, `ssl.ca.location`: no such file '/nowhere/ca.pem'"),
    ({"schema_registry": {"url": "http://r:8081", "binlake.unknown.schema.id": "skip"}},
     "schema_registry: Value error, `binlake.unknown.schema.id` must be one of 'stop', "
     "'dead-letter', got 'skip'"),
])
def test_a_bad_schema_registry_setting_fails_at_load(data: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_config(data)


def test_unknown_schema_ids_stop_by_default_and_the_setting_is_binlake_s_own() -> None:
    from binlog_assets.formats.debezium_avro import registry_settings

    assert registry_settings(parse_config({"schema_registry": {
        "url": "http://r:8081"}}).schema_registry) == ({"url": "http://r:8081"}, False)
    # Accepted at load, and never handed to the client (which refuses keys it does not know).
    pipeline = parse_config({"schema_registry": {"url": "http://r:8081",
                                            "binlake.unknown.schema.id": "dead-letter"}})
    assert registry_settings(pipeline.schema_registry) == ({"url": "http://r:8081"}, True)


def test_registry_credentials_come_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_TEST_REGISTRY_PW", "r3g-Secret")
    pipeline = parse_config({
        "schema_registry": {"url": "http://127.0.0.1:8081",
                            "basic.auth.user.info": "binlake:${BINLAKE_TEST_REGISTRY_PW}"},
        "sources": [{"name": "s", "topics": ["t"], "format": "debezium-avro"}]})
    assert pipeline.schema_registry["basic.auth.user.info"] == "binlake:r3g-Secret"
    assert pipeline.sources[0].format == "debezium-avro"


def test_every_config_field_is_described_in_its_field() -> None:
    # One way to document a setting: `Field(description=...)`, which the config's schema
    # (and so any tool that shows it) carries.
    from pydantic import BaseModel

    import binlog_assets.config as config_module

    models = [m for m in vars(config_module).values()
              if isinstance(m, type) and issubclass(m, BaseModel)
              and m.__module__.startswith(f"{config_module.__name__}.") and m.model_fields]
    assert {m.__name__ for m in models} >= {"PipelineConfig", "SourceConfig", "TableConfig"}
    undescribed = [f"{m.__name__}.{name}" for m in models
                   for name, field in m.model_fields.items() if not field.description]
    assert undescribed == []


def test_the_readme_shows_each_settings_default() -> None:
    # The README's settings table repeats the defaults; they must be the config's own.
    import re

    from pydantic_core import PydanticUndefined

    from binlog_assets.config import PipelineConfig, SourceConfig, TableConfig
    from binlog_assets.environment import REPO_ROOT

    models = {"": PipelineConfig, "sources[].": SourceConfig, "sources[].tables[].": TableConfig}
    models |= {f"{name}.": field.annotation for name, field in PipelineConfig.model_fields.items()
               if hasattr(field.annotation, "model_fields")}
    cells = dict(re.findall(r"^\| `([a-z_.\[\]]+)` \| (.*?) \|",
                            (REPO_ROOT / "README.md").read_text(), re.MULTILINE))
    checked = 0
    for prefix, model in models.items():
        for name, field in model.model_fields.items():
            cell = cells.get(prefix + name)
            default = field.default
            if default is PydanticUndefined:
                default = field.default_factory() if field.default_factory else None
            if cell is None or (cell.startswith("unset") and default is None):
                continue
            literal = re.fullmatch(r"`([^`]*)`", cell)
            if literal is None or default is None:  # prose, or a default computed elsewhere
                continue
            shown = literal.group(1)
            if isinstance(default, bool):
                assert shown == str(default).lower(), prefix + name
            elif isinstance(default, int | float):
                assert float(shown) == float(default), prefix + name
            elif isinstance(default, str):
                assert shown == default, prefix + name
            else:
                assert not default and shown in ("{}", "[]"), prefix + name
            checked += 1
    assert checked >= 30  # the table covers every scalar setting


def _with_connection(connection: dict) -> dict:
    return {"sources": [{"name": "s", "topics": ["t"], "connection": connection}]}


@pytest.mark.parametrize(("connection", "field"), [
    ({"port": 3306, "user": "u"}, "sources[0].connection.host"),
    ({"host": "", "user": "u"}, "sources[0].connection.host"),
    ({"host": "db one", "user": "u"}, "sources[0].connection.host"),
    ({"host": "db", "user": "u", "port": 0}, "sources[0].connection.port"),
    ({"host": "db", "user": "u", "port": 70000}, "sources[0].connection.port"),
    ({"host": "db"}, "sources[0].connection.user"),
    ({"host": "db", "user": "u", "hostname": "x"}, "sources[0].connection.hostname"),
    ({"host": "db", "user": "u", "tls": {"mode": "on"}}, "sources[0].connection.tls.mode"),
    ({"host": "db", "user": "u", "tls": {"ca": "/no/such/ca.pem"}},
     "sources[0].connection.tls.ca"),
    ({"host": "db", "user": "u", "tls": {"mode": "verify_ca"}}, "sources[0].connection.tls"),
])
def test_a_bad_source_connection_fails_at_load_naming_the_field(connection: dict,
                                                                field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_with_connection(connection))
    assert f"{field}:" in str(err.value)


def test_a_source_connection_reads_its_password_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BINLAKE_TEST_DB_PW", "db-S3cret")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    pipeline = parse_config(_with_connection({
        "host": "db.example.com", "user": "binlake_check", "password": "${BINLAKE_TEST_DB_PW}",
        "tls": {"mode": "verify_identity", "ca": str(ca)}}))
    conn = pipeline.sources[0].connection
    assert conn.password == "db-S3cret" and conn.port == 3306
    assert conn.tls.mode == "verify_identity"
    assert "db-S3cret" not in repr(pipeline)  # a logged config never shows it
    assert parse_config({"sources": [{"name": "s", "topics": ["t"]}]}).sources[0].connection \
        is None
    monkeypatch.delenv("BINLAKE_TEST_DB_PW")
    with pytest.raises(ConfigError, match=r"sources\[0\]\.connection\.password: environment "
                                          r"variable BINLAKE_TEST_DB_PW is not set"):
        parse_config(_with_connection({"host": "db", "user": "u",
                                       "password": "${BINLAKE_TEST_DB_PW}"}))


@pytest.mark.parametrize(("parity", "field"), [
    ({"chunk_rows": 0}, "parity.chunk_rows"),
    ({"pause_seconds": -1}, "parity.pause_seconds"),
    ({"schedule": "every night"}, "parity.schedule"),
    ({"chunks": 10}, "parity.chunks"),
])
def test_bad_parity_settings_fail_at_load_naming_the_field(parity: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"parity": parity})
    assert f"{field}:" in str(err.value)


def test_a_renamed_key_is_still_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        config = parse_config({"lakehouse": {"driver_commit_rows": 5}})
    assert config.lakehouse.arrow_commit_rows == 5
    assert "'driver_commit_rows' is renamed 'arrow_commit_rows'" in caplog.text
    with pytest.raises(ConfigError, match="lakehouse: .*'driver_commit_rows' is the old name "
                                          "of 'arrow_commit_rows'"):
        parse_config({"lakehouse": {"driver_commit_rows": 5, "arrow_commit_rows": 3}})
