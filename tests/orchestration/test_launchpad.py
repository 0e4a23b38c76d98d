"""What the launchpad opens on: the consume job's replay fields, documented, and no
infrastructure settings."""

from __future__ import annotations

from pathlib import Path


def _fields(config_type) -> dict:  # a Dagster config type
    return dict(config_type.fields)


def test_the_consume_job_opens_on_its_replay_fields(binlake_env: Path) -> None:
    from binlog_assets.definitions import defs

    job = defs.resolve_job_def("consume_changelog_job")
    scaffold = job.get_run_config_for_partition_key("shop:0")
    # Only the op's replay and limit fields, replay first; nothing about resources.
    assert list(scaffold) == ["ops"]
    assert list(scaffold["ops"]["changelog"]["config"]) == [
        "start_offset", "start_timestamp_ms", "max_records", "max_seconds"]
    assert set(scaffold["ops"]["changelog"]["config"].values()) == {None}

    op_config = _fields(_fields(_fields(job.run_config_schema.config_type)["ops"]
                                .config_type)["changelog"].config_type)["config"]
    docs = {name: field.description for name, field in _fields(op_config.config_type).items()}
    # Which wins when both are set, said on both fields.
    assert "wins over start_timestamp_ms" in docs["start_offset"]
    assert "Ignored when start_offset is set" in docs["start_timestamp_ms"]
    assert all(docs.values())
