"""A partition's metadata checkpoint: the committed offset of its latest materialization,
and none before the first."""

from __future__ import annotations

import dagster as dg

from binlog_assets.consume.checkpoint import METADATA, Checkpoint
from binlog_assets.orchestration.metadata_checkpoint import (
    latest_metadata_checkpoint,
    latest_metadata_checkpoints,
)
from binlog_assets.orchestration.partitions import CHANGELOG_ASSET_KEY, KAFKA_PARTITIONS_NAME


def test_latest_materialization_is_the_checkpoint() -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, ["t:0", "t:1"])
        assert latest_metadata_checkpoint(instance, "t:0") is None
        for offset in (10, 25):
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset_key=CHANGELOG_ASSET_KEY, partition="t:0",
                metadata={"committed_offset": dg.MetadataValue.int(offset)}))
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=CHANGELOG_ASSET_KEY, partition="t:1", metadata={}))
        assert latest_metadata_checkpoint(instance, "t:0") == Checkpoint(25, METADATA)
        # A materialization without the key (an idle run of old) is no checkpoint.
        assert latest_metadata_checkpoint(instance, "t:1") is None


def test_the_checkpoints_of_many_partitions_are_each_ones_latest() -> None:
    keys = ["t:0", "t:1", "t:2", "u:0"]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KAFKA_PARTITIONS_NAME, keys)
        assert latest_metadata_checkpoints(instance, keys) == dict.fromkeys(keys)
        for key, offset in (("t:0", 10), ("t:2", 7), ("t:0", 25), ("u:0", 3), ("t:2", 9)):
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset_key=CHANGELOG_ASSET_KEY, partition=key,
                metadata={"committed_offset": dg.MetadataValue.int(offset)}))
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=CHANGELOG_ASSET_KEY, partition="u:0", metadata={}))
        found = latest_metadata_checkpoints(instance, keys)
        assert found == {key: latest_metadata_checkpoint(instance, key) for key in keys}
        assert found == {"t:0": Checkpoint(25, METADATA), "t:1": None,
                         "t:2": Checkpoint(9, METADATA), "u:0": None}
