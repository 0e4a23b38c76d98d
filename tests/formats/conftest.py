"""Helpers shared by the format decoder tests: fixture files and a replay of events.

`replay` applies decoded events to a dict keyed by (table, key), the way the replica
would: c/r/u set the row, d deletes it (it must exist), t clears the table's rows older
than it (a snapshot's end follows the rows the snapshot read), ddl changes no row.
`decode_lines` decodes a fixture file line by line with offset = line index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from binlog_assets.formats.base import ChangeDecoder
from binlog_assets.formats.event import ChangeEvent

FIXTURES = Path(__file__).parents[1] / "fixtures"

State = dict[tuple[str, tuple], dict[str, Any]]


def _replay(events: Iterable[ChangeEvent]) -> State:
    state: State = {}
    at: dict[tuple[str, tuple], tuple] = {}
    for event in events:
        if event.op in ("c", "r", "u"):
            state[(event.table, event.key)] = event.after
            at[(event.table, event.key)] = event.sort_key()
        elif event.op == "d":
            del state[(event.table, event.key)]
        elif event.op == "t":
            for table_key in [k for k in state if k[0] == event.table
                              and at[k] < event.sort_key()]:
                del state[table_key]
    return state


def _decode_lines(decoder: ChangeDecoder, lines: Iterable[bytes]) -> list[ChangeEvent]:
    events: list[ChangeEvent] = []
    for offset, line in enumerate(lines):
        events.extend(decoder.decode(line, topic="fixture", partition=0, offset=offset))
    return events


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def flink_lines() -> Callable[[str], list[bytes]]:
    def read(name: str) -> list[bytes]:
        return (FIXTURES / "flink-json" / name).read_bytes().splitlines()

    return read


@pytest.fixture
def replay() -> Callable[[Iterable[ChangeEvent]], State]:
    return _replay


@pytest.fixture
def decode_lines() -> Callable[[ChangeDecoder, Iterable[bytes]], list[ChangeEvent]]:
    return _decode_lines
