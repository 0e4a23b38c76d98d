"""The Redis cache example on a real redis-server: changes apply in position order,
replays change nothing, a truncate drops older rows only, and the client's life is the
run's (opened and closed by the registry)."""

from __future__ import annotations

import pytest

from binlog_assets.consume.handlers import HandlerOpenError, HandlerRegistry
from binlog_assets.examples.customer_cache import RedisTableCache, position_text
from binlog_assets.formats.event import ChangeEvent, Position


def change(op: str, key: int, pos: int, offset: int, **row) -> ChangeEvent:
    after = None if op in ("d", "t") else {"id": key, **row}
    return ChangeEvent(table="shop.customers", op=op, key=() if op == "t" else (key,),
                       key_columns=("id",), before=None, after=after,
                       position=Position(1, 1, pos, 0), source_ts=None, topic="t",
                       offset=offset)


@pytest.fixture
def cache(redis_url: str):
    registry = HandlerRegistry()
    handler = RedisTableCache("cust")
    registry.register("shop.customers", handler, batch=True)
    with registry.opened():
        yield handler
    assert handler.client is None  # closed with the run


def test_position_text_orders_as_the_binlog() -> None:
    a = change("c", 1, 9, 100)
    b = change("u", 1, 10, 5)  # later in the binlog, even at a lower Kafka offset
    c = change("u", 1, 10, 6)
    assert position_text(a) < position_text(b) < position_text(c)


def test_changes_apply_and_replays_change_nothing(cache: RedisTableCache) -> None:
    events = [change("c", 1, 10, 0, name="ann", email=None),
              change("c", 2, 11, 1, name="bob", email="b@x"),
              change("u", 1, 12, 2, name="ann2", email="a@x"),
              change("d", 2, 13, 3)]
    cache(events)
    assert cache.rows() == {"1": {"id": "1", "name": "ann2", "email": "a@x"}}
    assert cache.applied == 4
    # A rerun replays from an older offset: the insert of the deleted row must not
    # bring it back, and the older image of row 1 must not overwrite the newer one.
    cache(events)
    cache(events[:2])
    assert cache.rows() == {"1": {"id": "1", "name": "ann2", "email": "a@x"}}
    assert cache.applied == 4


def test_truncate_drops_rows_written_before_it_only(cache: RedisTableCache) -> None:
    cache([change("c", 1, 10, 0, name="a"), change("c", 2, 11, 1, name="b"),
           change("t", 0, 12, 2), change("c", 3, 13, 3, name="c")])
    assert set(cache.rows()) == {"3"}
    # Replaying the rows written before the truncate leaves them truncated.
    cache([change("c", 1, 10, 0, name="a"), change("t", 0, 12, 2)])
    assert set(cache.rows()) == {"3"}


def test_open_without_the_url_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    registry = HandlerRegistry()
    registry.register("shop.customers", RedisTableCache("cust"), name="cache", batch=True)
    with pytest.raises(HandlerOpenError, match="'cache'.*REDIS_URL is not set"), \
            registry.opened():
        pass
