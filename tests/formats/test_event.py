"""The change-event model's order: positions and their text form for text stores."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from binlog_assets.formats.event import (
    SNAPSHOT_END_ROW,
    SNAPSHOT_ROW,
    ChangeEvent,
    Position,
)

events = st.builds(
    lambda lineage, file, pos, row, offset, index: ChangeEvent(
        "shop.t", "u", (1,), ("id",), None, {}, Position(lineage, file, pos, row), None,
        offset=offset, row_index=index),
    st.integers(0, 99), st.integers(0, 10**6), st.integers(0, 2**40),
    st.integers(SNAPSHOT_END_ROW, 10**5), st.integers(-1, 10**9), st.integers(0, 9))


@given(st.lists(events, min_size=2, max_size=20))
def test_sort_text_orders_as_sort_key(batch: list[ChangeEvent]) -> None:
    assert sorted(batch, key=ChangeEvent.sort_text) == sorted(batch, key=ChangeEvent.sort_key)


def test_a_snapshot_counts_just_below_what_streams_from_its_position() -> None:
    streamed_before = Position(1, 7, 99, 3)
    end, read, streamed = (Position(1, 7, 100, r) for r in (SNAPSHOT_END_ROW, SNAPSHOT_ROW, 0))
    assert streamed_before < end < read < streamed < Position(2, 1, 4, 0)
    assert read.snapshot and end.snapshot and not streamed.snapshot
    assert Position(0, 99, 99, 0).snapshot  # a snapshot read of a lake made before lineages
