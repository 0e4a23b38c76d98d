"""Every application transaction's version in a Delta table's log, read in one pass.

delta-rs answers `transaction_version(app_id)` by replaying the log from its last
checkpoint, once per id: a round that reads each partition's checkpoint and lineage tail
replays it hundreds of times, each replay longer as commits gather since the checkpoint.
`AppVersions` reads the checkpoint's `txn` column and the commits after it once, then
only the commits added since, and gives every id's version at the table's version.

It reads what the Delta protocol writes (a classic checkpoint, whole or in parts, and
JSON commits); for anything else (a v2 checkpoint, a table that expires transactions,
a commit already cleaned up) it says so (None) and the caller asks delta-rs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from binlog_assets.lakehouse.delta_log import delta_rs_uri

if TYPE_CHECKING:
    from collections.abc import Mapping

    from deltalake import DeltaTable

# Delta's readers drop transactions older than this property says; read by delta-rs then.
_EXPIRES = "delta.setTransactionRetentionDuration"


class Unreadable(Exception):
    """The log holds something this reader does not read: delta-rs answers instead."""


class AppVersions:
    """The transactions of the table at `uri`, kept up to date with the versions it is
    asked at. Not thread-safe: its owner holds its own lock around it."""

    def __init__(self, uri: str) -> None:
        self.uri = delta_rs_uri(uri)
        self._version: int | None = None  # the version `_versions` holds
        self._versions: dict[str, int] = {}
        self._asked: tuple[int, bool] | None = None  # last version asked, and if readable
        self._filesystem = None
        self._log = ""

    def of(self, table: DeltaTable) -> Mapping[str, int] | None:
        """Each app id's latest version at `table`'s version (the table opened at this
        reader's `uri`), or None where delta-rs must answer. Asked again at the same
        version (a round asks once per id), it answers from what it read."""
        version = table.version()
        if self._asked is None or self._asked[0] != version:
            self._asked = (version, self._read_at(version, table))
        return self._versions if self._asked[1] else None

    def _read_at(self, version: int, table: DeltaTable) -> bool:
        if _EXPIRES in table.metadata().configuration:
            return False
        if self._version is not None and version >= self._version:
            try:
                self._read_commits(self._version + 1, version, self._versions)
            except (OSError, ValueError, KeyError):  # a commit cleaned up since: anew
                self._version = None
        if self._version is None or version < self._version:
            try:
                self._versions = self._read_all(version)
            except (Unreadable, OSError, ValueError, KeyError):
                self._version = None
                return False
        self._version = version
        return True

    # -- reading the log -------------------------------------------------------------
    def _fs(self):  # noqa: ANN202
        if self._filesystem is None:
            import pyarrow.fs as pafs

            self._filesystem, root = pafs.FileSystem.from_uri(self.uri)
            self._log = f"{root.rstrip('/')}/_delta_log"
        return self._filesystem

    def _read_all(self, version: int) -> dict[str, int]:
        fs, versions = self._fs(), {}
        start = 0
        last = f"{self._log}/_last_checkpoint"
        if fs.get_file_info(last).type.name != "NotFound":
            with fs.open_input_stream(last) as f:
                doc = json.loads(f.read())
            checkpoint = int(doc["version"])
            if "v2Checkpoint" in doc or checkpoint > version:
                raise Unreadable(f"checkpoint {checkpoint} at version {version}")
            self._read_checkpoint(checkpoint, doc.get("parts"), versions)
            start = checkpoint + 1
        self._read_commits(start, version, versions)
        return versions

    def _read_checkpoint(self, checkpoint: int, parts: int | None,
                         versions: dict[str, int]) -> None:
        import pyarrow.parquet as pq

        names = ([f"{checkpoint:020d}.checkpoint.parquet"] if not parts else
                 [f"{checkpoint:020d}.checkpoint.{i:010d}.{parts:010d}.parquet"
                  for i in range(1, parts + 1)])
        for name in names:
            txns = pq.read_table(f"{self._log}/{name}", columns=["txn"],
                                 filesystem=self._fs()).column("txn")
            for txn in txns.drop_null().to_pylist():
                versions[txn["appId"]] = int(txn["version"])

    def _read_commits(self, first: int, last: int, versions: dict[str, int]) -> None:
        fs = self._fs()
        for version in range(first, last + 1):
            with fs.open_input_stream(f"{self._log}/{version:020d}.json") as f:
                for line in f.read().splitlines():
                    # Most lines are adds with their statistics: only txn lines parsed.
                    if b'"txn"' in line[:16]:
                        txn = json.loads(line)["txn"]
                        versions[txn["appId"]] = int(txn["version"])
