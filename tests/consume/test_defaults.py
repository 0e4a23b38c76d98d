"""The consume defaults have one source: a source config left at its defaults, a
`RunSettings`, an `ErrorPolicy` and a `LaneDispatcher` all mean the same thing."""

from __future__ import annotations

from binlog_assets.config import parse_config
from binlog_assets.consume import defaults
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.lane_routing import ORDERING_KEY
from binlog_assets.consume.lanes import LaneDispatcher
from binlog_assets.consume.run import RunSettings


def test_config_run_settings_policy_and_lanes_share_the_defaults() -> None:
    source = parse_config({"sources": [{"name": "shop", "topics": ["t"]}]}).sources[0]
    settings = RunSettings(kafka_conf={}, group_id="g", format="debezium")
    assert (source.lanes, settings.lanes) == (defaults.LANES, defaults.LANES)
    assert (source.key_slots_per_lane, settings.key_slots_per_lane) == (
        defaults.KEY_SLOTS_PER_LANE, defaults.KEY_SLOTS_PER_LANE)
    assert (source.max_in_flight, settings.max_in_flight) == (
        defaults.MAX_IN_FLIGHT, defaults.MAX_IN_FLIGHT)
    assert (source.max_retries, ErrorPolicy().max_retries) == (
        defaults.MAX_RETRIES, defaults.MAX_RETRIES)
    assert source.handler_timeout_seconds == settings.handler_timeout_seconds == (
        defaults.HANDLER_TIMEOUT_SECONDS)
    assert source.ordering == settings.ordering == ORDERING_KEY
    with LaneDispatcher(HandlerRegistry()) as dispatcher:
        assert dispatcher._lane_count == defaults.LANES
        assert dispatcher._max_in_flight == defaults.MAX_IN_FLIGHT


def test_one_dead_letter_topic_rule() -> None:
    source = parse_config({"sources": [{"name": "shop", "topics": ["t"]}]}).sources[0]
    assert source.dlq_topic == defaults.dead_letter_topic("shop") == "binlake.dlq.shop"
    assert RunSettings(kafka_conf={}, group_id="g", format="debezium").source == (
        defaults.UNNAMED_SOURCE)
