"""A re-synced row's values as the replica holds them: no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from binlog_assets.parity.resync import _typed


@pytest.mark.parametrize(("value", "arrow_type", "held"), [
    (timedelta(hours=-1, microseconds=-500_000), pa.string(), "-01:00:00.500000"),
    (timedelta(hours=838, minutes=59, seconds=59), pa.string(), "838:59:59"),
    (datetime(2026, 11, 1, 9, 0, 0, 5), pa.timestamp("us", tz="UTC"),
     datetime(2026, 11, 1, 9, 0, 0, 5, tzinfo=UTC)),  # the session reads in UTC
    (18446744073709551615, pa.decimal128(20, 0), Decimal("18446744073709551615")),
    (1, pa.bool_(), True),
    (b"caf\xc3\xa9", pa.string(), "café"),
    (7, pa.string(), "7"),
    (None, pa.int32(), None),
    (Decimal("1.50"), pa.decimal128(10, 2), Decimal("1.50")),
])
def test_source_values_are_typed_as_the_replica_holds_them(value, arrow_type, held) -> None:
    assert _typed(value, arrow_type) == held
