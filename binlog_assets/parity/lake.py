"""The lakehouse side of the parity check, read by delta-rs (no Spark): a replica's live
rows summed per chunk by the same canonical text as the source's, its applied changelog
version, and how far the changelog has come in the source's binlog.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlog_assets.formats.event import FIRST_LINEAGE
from binlog_assets.lakehouse.changelog import changelog_uri
from binlog_assets.lakehouse.changelog_rows import commit_doc, tag_topic
from binlog_assets.lakehouse.delta_log import delta_rs_uri
from binlog_assets.lakehouse.transactions import APP_ID
from binlog_assets.parity.canonical import Fingerprint, crcs_of
from binlog_assets.parity.chunks import Key, chunk_index, key_value

if TYPE_CHECKING:
    import pyarrow as pa

    from binlog_assets.config import PipelineConfig, SourceConfig
    from binlog_assets.parity.source import SourceTable

# The replica's live rows, as its `_current` view keeps them.
LIVE_OPS = ("c", "u", "r")
# Commits read back from the changelog's log for the position it reached.
HISTORY_COMMITS = 2000


def replica_uri(pipeline: PipelineConfig, replica: str) -> str:
    """Where Spark's catalog keeps the replica's files (its warehouse folder)."""
    return delta_rs_uri(pipeline.lakehouse.uri("warehouse", f"{pipeline.lakehouse.database}.db",
                                             replica))


def applied_version(pipeline: PipelineConfig, replica: str) -> int | None:
    """The changelog version the replica reflects (None: no replica table yet)."""
    from deltalake import DeltaTable

    uri = replica_uri(pipeline, replica)
    if not DeltaTable.is_deltatable(uri):
        return None
    return DeltaTable(uri).transaction_version(APP_ID)


@dataclass
class ReplicaRows:
    """One source table's live rows in the replica: keys (as the source compares them)
    and row CRCs, in the order read."""

    keys: list[Key]
    crcs: list[int]

    def fingerprints(self, uppers: Sequence[Key | None]) -> list[Fingerprint]:
        """Per chunk (given its upper bounds, the last None), the fingerprint of its rows."""
        out = [Fingerprint() for _ in uppers]
        if len(uppers) == 1:
            out[0] = Fingerprint.of(self.crcs)
            return out
        for key, crc in zip(self.keys, self.crcs, strict=True):
            out[chunk_index(uppers, key)].add(crc)
        return out

    def in_chunk(self, uppers: Sequence[Key | None], index: int) -> dict[Key, list[int]]:
        """Key -> row CRCs of one chunk's rows (a key twice: both, so it shows)."""
        out: dict[Key, list[int]] = {}
        for key, crc in zip(self.keys, self.crcs, strict=True):
            if len(uppers) == 1 or chunk_index(uppers, key) == index:
                out.setdefault(key, []).append(crc)
        return out


def replica_rows(pipeline: PipelineConfig, replica: str, table: SourceTable) -> ReplicaRows:
    """The replica's live rows of source table `table`, canonical text and all, read by
    one delta-rs query (columns matched to the source's by name, case aside: a column
    the replica lacks reads as NULL, as its rows then differ)."""
    from deltalake import DeltaTable, QueryBuilder

    uri = replica_uri(pipeline, replica)
    delta = DeltaTable(uri)
    present = {f.name.lower(): f.name for f in delta.schema().fields}
    wanted = [*(c for c, _ in table.columns), *table.key]
    names = {c: present.get(c.lower()) for c in wanted}
    select = sorted({n for n in names.values() if n is not None})
    quoted = ", ".join(_ident(n) for n in select) or "1"
    reader = QueryBuilder().register("replica", delta).execute(
        f"SELECT {quoted} FROM replica WHERE _op IN ({_list(LIVE_OPS)}) "
        f"AND _source_db = {_literal(table.database)} "
        f"AND _source_table = {_literal(table.table)}")
    import pyarrow as pa

    rows = pa.table(reader.read_all())
    return _summed(rows, table, names)


def row_positions(pipeline: PipelineConfig, replica: str, table: SourceTable
                  ) -> dict[Key, tuple[int, int, int]]:
    """Key -> (lineage, binlog file, position) of the replica's row of each key of
    `table`, tombstones included: which rows a change after a snapshot has touched."""
    from deltalake import DeltaTable, QueryBuilder

    delta = DeltaTable(replica_uri(pipeline, replica))
    present = {f.name.lower(): f.name for f in delta.schema().fields}
    names = [present.get(k.lower()) for k in table.key]
    if None in names:
        return {}
    import pyarrow as pa

    rows = pa.table(QueryBuilder().register("replica", delta).execute(
        f"SELECT {', '.join(_ident(n) for n in names)}, _position FROM replica "
        f"WHERE _source_db = {_literal(table.database)} "
        f"AND _source_table = {_literal(table.table)}").read_all())
    keys = zip(*(rows.column(n).to_pylist() for n in names), strict=True)
    out: dict[Key, tuple[int, int, int]] = {}
    for key, p in zip(keys, rows.column("_position").to_pylist(), strict=True):
        at = (p["phase"], p["file"], p["pos"])
        k = tuple(key_value(v) for v in key)
        out[k] = max(out.get(k, at), at)
    return out


def _summed(rows: pa.Table, table: SourceTable, names: dict[str, str | None]) -> ReplicaRows:
    import pyarrow as pa

    def column(name: str | None) -> pa.Array:
        if name is None:  # the replica lacks it: NULL in every row
            return pa.nulls(rows.num_rows, pa.string())
        return rows.column(name).combine_chunks()

    crcs = crcs_of([column(names[c]) for c, _ in table.columns], rows.num_rows)
    keys_columns = []
    for k in table.key:
        values = column(names[k])
        plain = values.to_pylist()
        # Integers and text compare as they are; instants and decimals are normalized.
        keys_columns.append(plain if pa.types.is_integer(values.type) or
                            pa.types.is_string(values.type) else
                            [key_value(v) for v in plain])
    keys = list(zip(*keys_columns, strict=True)) if keys_columns else [()] * rows.num_rows
    return ReplicaRows(keys, crcs)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _list(texts: Sequence[str]) -> str:
    return ", ".join(_literal(t) for t in texts)


# How far the changelog has come in the source's binlog.


def changelog_version(pipeline: PipelineConfig) -> int | None:
    from deltalake import DeltaTable

    uri = delta_rs_uri(changelog_uri(pipeline))
    return DeltaTable(uri).version() if DeltaTable.is_deltatable(uri) else None


def reached_position(pipeline: PipelineConfig, source: SourceConfig, up_to: int
                     ) -> tuple[int, int, int] | None:
    """The highest (lineage, binlog file index, position) of a change of `source` among
    the changelog's commits up to version `up_to`, from the surveys the commits carry
    (their tag names the topic; no row is read). None: no such change in the recent
    commits."""
    from deltalake import DeltaTable

    # The latest log: one loaded at a version numbers its history wrongly (delta-rs).
    log = DeltaTable(delta_rs_uri(changelog_uri(pipeline)))
    best = None
    for commit in log.history(HISTORY_COMMITS):
        if commit.get("version", 0) > up_to:
            continue  # the log's history reaches past the version it was loaded at
        doc = commit_doc(commit.get("userMetadata"))
        tag = doc.get("tag") or ""
        topic = tag_topic(tag)
        if topic is None or not source.matches(topic):
            continue
        for entry in doc.get("survey") or ():
            last = entry[-1]
            position = (max(int(last[0]), FIRST_LINEAGE), int(last[1]), int(last[2]))
            if best is None or position > best:
                best = position
    return best


def high_watermarks(kafka_conf: dict, group: str, source: SourceConfig
                    ) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the high watermark now, for the source's partitions."""
    from binlog_assets.consume.lag import measure_lag

    return {(pl.topic, pl.partition): max(pl.high, pl.low)
            for pl in measure_lag(kafka_conf, group, list(source.topics))}


def partitions_behind(pipeline: PipelineConfig, group: str,
                      targets: dict[tuple[str, int], int]) -> dict[str, int]:
    """`topic:partition` -> records below its target that the changelog does not hold
    yet (a target is a high watermark read earlier: a fixed goal, which a busy partition
    reaches while its high watermark moves on)."""
    from binlog_assets.lakehouse.changelog import ChangelogWriter

    writer = ChangelogWriter(pipeline)
    behind = {}
    for (topic, partition), high in targets.items():
        done = writer.checkpoint(group, topic, partition) or 0
        if high > done:
            behind[f"{topic}:{partition}"] = high - done
    return behind
