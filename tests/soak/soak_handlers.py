"""The soak's handlers (`sources[].handlers: soak_handlers:registry`).

- `calls`: a batch handler on every soak table that counts each call per event
  coordinate (topic, partition, offset, row index) in Redis, with the process and the
  time of the first call and of each repeat, so the soak can count every handler call
  beyond the first for an event and say which fault preceded it.
- the README's Redis cache example (`RedisTableCache`) on one soak table, whose cache
  the soak compares with the table at the end.

Both read `REDIS_URL` when the run opens its handlers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.examples.customer_cache import URL_ENV, RedisTableCache
from binlog_assets.formats.event import ChangeEvent

DATABASE = "soak"
CACHED_TABLE = f"{DATABASE}.t0"
CACHE_PREFIX = "soak-cache"
# Redis keys of the call counter.
CALLS = "soak:calls"          # hash: coordinate -> calls
FIRST = "soak:first"          # hash: coordinate -> JSON {pid, t} of its first call
REPEATS = "soak:repeats"      # list: JSON {coord, pid, t, n} of each call beyond the first

# KEYS: calls, first, repeats. ARGV: pid, time, then coordinates.
_COUNT = """
for i = 3, #ARGV do
  local n = redis.call('HINCRBY', KEYS[1], ARGV[i], 1)
  if n == 1 then
    redis.call('HSET', KEYS[2], ARGV[i], '{"pid":' .. ARGV[1] .. ',"t":' .. ARGV[2] .. '}')
  else
    redis.call('RPUSH', KEYS[3], '{"coord":"' .. ARGV[i] .. '","pid":' .. ARGV[1]
      .. ',"t":' .. ARGV[2] .. ',"n":' .. n .. '}')
  end
end
return 1
"""


def coordinate(event: ChangeEvent) -> str:
    return f"{event.topic}|{event.partition}|{event.offset}|{event.row_index}"


def parse_coordinate(text: str) -> tuple[str, int, int, int]:
    topic, partition, offset, row = text.rsplit("|", 3)
    return topic, int(partition), int(offset), int(row)


class CallCounter:
    """Counts the calls per event coordinate in Redis (one script call per batch)."""

    def __init__(self) -> None:
        self.client = None

    def open(self) -> None:
        import redis

        url = os.environ.get(URL_ENV)
        if not url:
            raise RuntimeError(f"{URL_ENV} is not set: the soak's call counter needs Redis")
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self._count = self.client.register_script(_COUNT)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def __call__(self, events: Sequence[ChangeEvent]) -> None:
        self._count(keys=[CALLS, FIRST, REPEATS],
                    args=[os.getpid(), f"{time.time():.3f}", *map(coordinate, events)])


def read_calls(url: str) -> tuple[dict[str, int], dict[str, dict], list[dict]]:
    """(calls by coordinate, first call by coordinate, repeats) as the handlers left them."""
    import redis

    with redis.Redis.from_url(url, decode_responses=True) as client:
        calls = {k: int(v) for k, v in client.hgetall(CALLS).items()}
        first = {k: json.loads(v) for k, v in client.hgetall(FIRST).items()}
        repeats = [json.loads(v) for v in client.lrange(REPEATS, 0, -1)]
    return calls, first, repeats


cache = RedisTableCache(CACHE_PREFIX)
registry = HandlerRegistry()
registry.register(rf"{DATABASE}\.t\d+", CallCounter(), name="soak-calls", batch=True)
registry.register(CACHED_TABLE, cache, name="soak-cache", batch=True)
