"""Routing rules from the table configs: exact names, regexes, conflicting settings."""

from __future__ import annotations

import pytest

from binlog_assets.config import ConfigError, parse_config
from binlog_assets.lakehouse.replica.routes import replica_route, replica_routes


def _config(*tables: dict) -> object:
    return parse_config({"sources": [{"name": "s", "topics": ["t"], "tables": list(tables)}]})


def test_regex_routes_shards_and_keys_on_the_source() -> None:
    route = replica_route(_config({"source": r"shop_\d+\.orders_\d+", "replica": "orders"}),
                          "orders")
    assert route.sharded
    assert route.select(["shop_1.orders_1", "shop_22.orders_7", "shop_1.customers",
                         "shop_x.orders_1", "shop_1.orders_1_archive", None]) == [
        "shop_1.orders_1", "shop_22.orders_7"]


def test_exact_name_is_literal_and_not_sharded() -> None:
    route = replica_route(_config({"source": "shop.orders", "replica": "orders"}), "orders")
    assert not route.sharded
    # The dot of an exact name is literal, not "any character".
    assert route.select(["shop.orders", "shopXorders", "shop.orders2"]) == ["shop.orders"]


def test_several_configs_into_one_replica_are_sharded() -> None:
    routes = replica_routes(_config({"source": "eu.orders", "replica": "orders"},
                                    {"source": "us.orders", "replica": "orders"},
                                    {"source": "eu.customers", "replica": "customers"}))
    assert routes["orders"].sharded and not routes["customers"].sharded
    assert routes["orders"].select(["eu.orders", "us.orders", "eu.customers"]) == [
        "eu.orders", "us.orders"]


@pytest.mark.parametrize("setting", [{"schema_evolution": "exception"},
                                     {"key_columns": ["id"]}, {"replica_mode": "append"},
                                     {"history": True}])
def test_disagreeing_settings_for_one_replica_fail_at_load_naming_them(setting: dict) -> None:
    # Checked when the config loads, not in the replica build that would use them.
    (name,) = setting
    with pytest.raises(ConfigError, match=rf"sources\[0\]\.tables\[1\]\.{name}: .*differs "
                                          rf"from sources\[0\]\.tables\[0\]\.{name}.*'orders'"):
        _config({"source": "eu.orders", "replica": "orders"},
                {"source": "us.orders", "replica": "orders", **setting})


def test_unknown_replica_names_the_configured_ones() -> None:
    with pytest.raises(KeyError, match=r"'nope'.*\['orders'\]"):
        replica_route(_config({"source": "shop.orders", "replica": "orders"}), "nope")
