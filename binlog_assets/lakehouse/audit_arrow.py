"""The row-count check's count of what a replica should hold, from the changelog, no Spark.

The same reduction as `audit.expected_live_rows` / `expected_log_rows` (per key the change
with the highest position wins; live when an insert, update or snapshot read that no
truncate of its source table follows; an append-only replica holds one row per distinct
change), read by delta-rs and reduced with pyarrow, so a follower can check a replica
seconds after each apply instead of once at the end of its run.

`LiveKeys` keeps the reduced state of one replica (the last change per key, the last
truncate per table) and brings it forward by the rows of the versions added since (the
change feed of the append-only table): a check costs the new rows plus one pass over the
keys, not a read of the whole changelog. Any commit in between that is not a plain
append (retention's rewrite, a re-created table) makes it count from the snapshot again.
It shares no code with the apply (`ReplicaBuilder`, `changelog_arrow`): a bug in how an
apply reads or reduces the changelog cannot hide itself from this count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from binlog_assets.config import PipelineConfig
from binlog_assets.formats.event import OP_CREATE, OP_DELETE, OP_READ, OP_TRUNCATE, OP_UPDATE
from binlog_assets.lakehouse.changelog import changelog_uri
from binlog_assets.lakehouse.changelog_rows import commit_doc
from binlog_assets.lakehouse.delta_log import delta_rs_uri
from binlog_assets.lakehouse.replica.routes import ReplicaRoute, replica_route

if TYPE_CHECKING:
    import pyarrow as pa

_LIVE = (OP_CREATE, OP_UPDATE, OP_READ)
_ROW = (*_LIVE, OP_DELETE)
# A position, field by field (`columns.POSITION_FIELDS`): compared in this order.
POSITION = ("pos_phase", "pos_file", "pos_pos", "pos_row", "offset", "row_index")
# Plain appends: the consumer's writes and the table's creation (no rows).
_APPENDS = {("WRITE", "Append"), ("CREATE TABLE", None)}


class LiveKeys:
    """The expected row count of one replica at a changelog version, brought forward
    from the count before it. Not for concurrent use: a follower keeps one per replica."""

    def __init__(self, pipeline: PipelineConfig, replica: str, *, append_only: bool) -> None:
        self.pipeline = pipeline
        self.route = replica_route(pipeline, replica)
        self.append_only = append_only
        self.uri = delta_rs_uri(changelog_uri(pipeline))
        self.version: int | None = None  # the version the state is at
        self.table_id: str | None = None
        self._state: pa.Table | None = None  # last change per key, or distinct changes
        self._truncated: dict[str, tuple] = {}  # source table -> its last truncate
        self.full_reads = 0  # how often it counted from the snapshot (for tests, benches)

    def count(self, version: int) -> int:
        """Live keys (distinct changes, append-only) of the replica at `version`."""
        from deltalake import DeltaTable

        if version < 0:
            return 0
        log = DeltaTable(self.uri, version=version)
        table_id = log.metadata().id
        if (self.version is None or version < self.version or table_id != self.table_id
                or not _appends_only(log, self.version + 1, version)):
            self._state, self._truncated = None, {}
            self._add(_snapshot(log, self.route, self._columns()))
            self.full_reads += 1
        elif version > self.version:
            self._add(_added(log, self.version + 1, version, self.route, self._columns()))
        self.version, self.table_id = version, table_id
        return self._counted()

    def _columns(self) -> list[str]:
        images = ["before", "after"] if self.route.key_columns and not self.append_only else []
        return ["offset", "op", "key", *images, "pos_phase", "pos_file", "pos_pos",
                "pos_row", "row_index", "table"]

    def _add(self, rows: pa.Table) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.append_only:
            changes = rows.filter(pc.is_in(rows["op"], pa.array([*_ROW, OP_TRUNCATE])))
            ids = _identities(changes)
            both = ids if self._state is None else pa.concat_tables([self._state, ids])
            self._state = both.group_by(both.column_names).aggregate([])
            return
        for t in rows.filter(pc.equal(rows["op"], OP_TRUNCATE)).to_pylist():
            at = tuple(t[c] for c in POSITION)
            if at > self._truncated.get(t["table"], ()):
                self._truncated[t["table"]] = at
        changes = rows.filter(pc.is_in(rows["op"], pa.array(_ROW)))
        keyed = changes.select(["table", "op", *POSITION]).append_column(
            "_key", self._keys(changes))
        both = keyed if self._state is None else pa.concat_tables([self._state, keyed])
        self._state = _last_per_key(both, sharded=self.route.sharded)

    def _keys(self, rows: pa.Table) -> pa.Array:
        """Each row's key: its `key`, or the configured key columns' values (as text, the
        way Spark's `get_json_object` gives them) from its after or before image."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self.route.key_columns:
            return pc.fill_null(rows["key"].cast(pa.string()), "\x00null")
        keys = []
        for after, before in zip(rows["after"].to_pylist(), rows["before"].to_pylist(),
                                 strict=True):
            image = orjson.loads(after if after is not None else before or "null") or {}
            keys.append(orjson.dumps([_text(image.get(c)) for c in self.route.key_columns]
                                     ).decode())
        return pa.array(keys, pa.string())

    def _counted(self) -> int:
        import pyarrow.compute as pc

        state = self._state
        if state is None or state.num_rows == 0:
            return 0
        if self.append_only:
            return state.num_rows
        live = pc.is_in(state["op"], value_set=_pa_strings(_LIVE))
        for table, at in self._truncated.items():
            # A truncate removes the rows of its table whose last change came before it.
            gone = pc.and_(pc.equal(state["table"], table), _at_or_before(state, at))
            live = pc.and_(live, pc.invert(gone))
        return int(pc.sum(live.cast("int64")).as_py() or 0)


def _pa_strings(values):  # noqa: ANN001, ANN202
    import pyarrow as pa

    return pa.array(list(values), pa.string())


def _text(value) -> str | None:  # noqa: ANN001
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _at_or_before(state: pa.Table, at: tuple) -> pa.Array:
    """Rows whose position is at or before `at`, compared field by field."""
    import pyarrow.compute as pc

    result = None
    for name, value in reversed(list(zip(POSITION, at, strict=True))):
        column = state[name]
        if result is None:
            result = pc.less_equal(column, value)
        else:
            result = pc.or_(pc.less(column, value),
                            pc.and_(pc.equal(column, value), result))
    return pc.fill_null(result, True)


def _last_per_key(rows: pa.Table, *, sharded: bool) -> pa.Table:
    """The row with the highest position of each key (of each source table's keys when
    the replica is sharded: the source table is part of its key)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    group = ["table", "_key"] if sharded else ["_key"]
    order = [(g, "ascending") for g in group] + [(p, "descending") for p in POSITION]
    rows = rows.take(pc.sort_indices(rows, sort_keys=order))
    if rows.num_rows <= 1:
        return rows
    first = None
    for g in group:
        column = pc.fill_null(rows[g], "\x00null")
        differs = pc.not_equal(column.slice(1), column.slice(0, rows.num_rows - 1))
        first = differs if first is None else pc.or_(first, differs)
    keep = pa.concat_arrays([pa.array([True]), *first.chunks]) if isinstance(
        first, pa.ChunkedArray) else pa.concat_arrays([pa.array([True]), first])
    return rows.filter(keep)


def _identities(rows: pa.Table) -> pa.Table:
    """What makes two copies of a change one change (`columns.change_identity`): the
    binlog coordinates, and the Kafka offset and row only for a source without them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bare = pc.and_(pc.equal(rows["pos_file"], 0), pc.equal(rows["pos_pos"], 0))
    return pa.table({
        "table": rows["table"], "pos_phase": rows["pos_phase"],
        "pos_file": rows["pos_file"], "pos_pos": rows["pos_pos"], "pos_row": rows["pos_row"],
        "offset": pc.if_else(bare, rows["offset"], pa.scalar(-1, pa.int64())),
        "row_index": pc.if_else(bare, rows["row_index"], pa.scalar(-1, pa.int32()))})


def _commits(log, first: int, last: int) -> dict[int, dict]:  # noqa: ANN001
    """The commits `first`..`last` by version. Read from the table's latest log: delta-rs
    numbers the history of a table loaded at an older version as if its newest commits
    were that version's."""
    from deltalake import DeltaTable

    latest = DeltaTable(log.table_uri)
    return {h["version"]: h for h in latest.history(latest.version() - first + 1)
            if first <= h.get("version", -1) <= last}


def _appends_only(log, first: int, last: int) -> bool:  # noqa: ANN001 - a DeltaTable
    """Whether versions `first`..`last` are all plain appends (their rows are all the
    change feed brings)."""
    if last < first:
        return True
    found = _commits(log, first, last)
    for version in range(first, last + 1):
        entry = found.get(version)
        if entry is None:
            return False
        mode = (entry.get("operationParameters") or {}).get("mode")
        if (entry.get("operation"), mode) not in _APPENDS:
            return False
    return True


# Commits whose surveys `_tables` reads at most; past that it reads the rows' tables.
SURVEYED_COMMITS = 2000


def _tables(log, route: ReplicaRoute, first: int, last: int) -> list[str]:  # noqa: ANN001
    """The source tables of versions `first`..`last` routed to `route`: from the
    commits' surveys, or from the rows' distinct tables when one carries none."""
    names: set[str] = set()
    found = _commits(log, first, last) if last - first < SURVEYED_COMMITS else {}
    surveyed = len(found.keys() & set(range(first, last + 1))) == last - first + 1
    for version in range(first, last + 1) if surveyed else ():
        entry = found[version]
        survey = commit_doc(entry.get("userMetadata")).get(
            "survey", [] if entry.get("operation") == "CREATE TABLE" else None)
        if survey is None:
            surveyed = False
            break
        names.update(group[0] for group in survey)
    if not surveyed:
        import pyarrow as pa
        from deltalake import QueryBuilder

        query = QueryBuilder().register("changelog", log)
        # delta-rs answers with an arro3 table, which has no `to_pylist`.
        names = set(pa.table(query.execute(
            'SELECT DISTINCT "table" FROM changelog').read_all()).column("table").to_pylist())
    return route.select(names)


def _snapshot(log, route: ReplicaRoute, columns: list[str]) -> pa.Table:  # noqa: ANN001
    """The routed rows of the table as of `log`'s version, as Spark reads it: rows
    retention removed stay out. The `table` statistics skip other tables' files."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    tables = _tables(log, route, 0, log.version())
    if not tables:
        return _empty(columns)
    listed = ", ".join(f'"{c}"' for c in columns)
    query = QueryBuilder().register("changelog", log)
    reader = query.execute(f'SELECT {listed} FROM changelog WHERE "table" IN '
                           f'({_sql_list(tables)})')
    return _plain(pa.table(reader.read_all()))


def _added(log, first: int, last: int, route: ReplicaRoute, columns: list[str]  # noqa: ANN001
           ) -> pa.Table:
    """The routed rows versions `first`..`last` added (all plain appends)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tables = _tables(log, route, first, last)
    if not tables:
        return _empty(columns)
    # delta-rs builds its projection from unquoted names: `table` and `offset` must not
    # follow another name (as `changelog_arrow.RANGE_COLUMNS` orders them).
    rows = _plain(pa.table(log.load_cdf(
        starting_version=first, ending_version=last, columns=columns,
        predicate=f"`table` IN ({_sql_list(tables)})").read_all()))
    if "_change_type" in rows.column_names:
        rows = rows.filter(pc.equal(rows["_change_type"], "insert"))
    return rows.select(columns)


def _empty(columns: list[str]) -> pa.Table:
    import pyarrow as pa

    types = {"offset": pa.int64(), "pos_file": pa.int64(), "pos_pos": pa.int64(),
             "pos_phase": pa.int32(), "pos_row": pa.int32(), "row_index": pa.int32()}
    return pa.table({c: pa.array([], types.get(c, pa.string())) for c in columns})


def _sql_list(texts: list[str]) -> str:
    return ", ".join("'" + t.replace("'", "''") + "'" for t in texts)


def _plain(rows: pa.Table) -> pa.Table:
    """String views as plain strings, which every compute kernel takes."""
    import pyarrow as pa

    return rows.cast(pa.schema([
        pa.field(f.name, pa.string()) if f.type == pa.string_view() else f
        for f in rows.schema]))


def expected_rows(pipeline: PipelineConfig, replica: str, version: int, *,
                  append_only: bool) -> int:
    """One count, from the snapshot at `version` (no state kept)."""
    return LiveKeys(pipeline, replica, append_only=append_only).count(version)
