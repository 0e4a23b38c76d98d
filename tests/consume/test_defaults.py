"""The consume defaults have one source: a source config left at its defaults, a
`RunSettings`, an `ErrorPolicy` and a `LaneDispatcher` all mean the same thing."""

from __future__ import annotations

from binlog_assets.config import parse_config
from binlog_assets.consume import defaults
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.lanes import DispatchOptions, LaneDispatcher
from binlog_assets.consume.run import RunSettings
from binlog_assets.consume.slot_routing import ORDERING_KEY
from binlog_assets.environment import REPO_ROOT


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
        assert dispatcher._slot_count == defaults.LANES
        assert dispatcher._max_in_flight == defaults.MAX_IN_FLIGHT


def test_one_dead_letter_topic_rule() -> None:
    source = parse_config({"sources": [{"name": "shop", "topics": ["t"]}]}).sources[0]
    assert source.dlq_topic == defaults.dead_letter_topic("shop") == "binlake.dlq.shop"
    assert RunSettings(kafka_conf={}, group_id="g", format="debezium").source == (
        defaults.UNNAMED_SOURCE)


def test_run_settings_take_their_commit_and_batch_defaults_from_defaults() -> None:
    settings = RunSettings(kafka_conf={}, group_id="g", format="debezium")
    assert settings.commit_interval_seconds == defaults.COMMIT_INTERVAL_SECONDS
    assert settings.commit_timeout_seconds == defaults.COMMIT_TIMEOUT_SECONDS
    assert settings.batch_size == defaults.BATCH_SIZE
    assert settings.workers is None  # the run then serves its lanes with default_workers


def test_one_default_worker_count() -> None:
    assert defaults.default_workers(4) == 4
    assert defaults.default_workers(10_000) == defaults.MAX_DEFAULT_WORKERS
    with LaneDispatcher(HandlerRegistry(),
                        DispatchOptions(slots=defaults.MAX_DEFAULT_WORKERS + 1)) as many:
        assert len(many._workers) == defaults.MAX_DEFAULT_WORKERS


def test_the_readme_shows_the_source_defaults() -> None:
    rows = {}
    for line in (REPO_ROOT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[1].startswith("`sources[]."):
            rows[cells[1].strip("`")] = cells[2]
    assert rows["sources[].lanes"] == f"`{defaults.LANES}`"
    assert rows["sources[].workers"] == f"`min(lanes, {defaults.MAX_DEFAULT_WORKERS})`"
    assert rows["sources[].key_slots_per_lane"] == f"`{defaults.KEY_SLOTS_PER_LANE}`"
    assert rows["sources[].max_in_flight"] == f"`{defaults.MAX_IN_FLIGHT}`"
    assert rows["sources[].max_retries"] == f"`{defaults.MAX_RETRIES}`"
    assert rows["sources[].dead_letter_topic"] == (
        f"`{defaults.dead_letter_topic('<name>')}`")
