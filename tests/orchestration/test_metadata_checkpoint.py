"""A partition's metadata checkpoint: the committed offset of its latest materialization,
and none before the first."""

from __future__ import annotations

import dagster as dg

from binlog_assets.consume.checkpoint import METADATA, Checkpoint
from binlog_assets.orchestration.metadata_checkpoint import latest_metadata_checkpoint
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
