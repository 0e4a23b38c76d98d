"""A Redis cache kept in step with `shop.customers`: the README's handler example.

Each live row is a hash `customer:<id>` of its non-null columns as text. Every change
is applied by one Lua script that first compares the event's position with the one
stored for its key (`customer:positions`): a rerun after a crash replays events past the
committed offset, and a replayed event is older than or equal to what the cache holds,
so it changes nothing. Deletes keep their position there for the same reason (a
replayed insert must not bring a deleted row back), and a truncate records its position
(`customer:truncated`) so that no older change applies after it.

The server's URL, password included, comes from the environment (`REDIS_URL`), read when
the run opens its handlers; the client lives as long as the run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.formats.event import (
    OP_CREATE,
    OP_DELETE,
    OP_READ,
    OP_TRUNCATE,
    OP_UPDATE,
    ChangeEvent,
)

if TYPE_CHECKING:
    import redis

URL_ENV = "REDIS_URL"
TABLE = "shop.customers"
# How a source's config names this registry (binlake.yaml: `sources[].handlers`).
HANDLERS_SPEC = f"{__name__}:registry"

# KEYS: row hash, positions hash, live ids set, truncate marker.
# ARGV: id, position, 'set' or 'del', then field, value pairs of the row.
_APPLY = """
local cut = redis.call('GET', KEYS[4])
if cut and ARGV[2] <= cut then return 0 end
local seen = redis.call('HGET', KEYS[2], ARGV[1])
if seen and ARGV[2] <= seen then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('DEL', KEYS[1])
if ARGV[3] == 'del' then
  redis.call('SREM', KEYS[3], ARGV[1])
  return 1
end
redis.call('SADD', KEYS[3], ARGV[1])
if #ARGV > 3 then redis.call('HSET', KEYS[1], unpack(ARGV, 4)) end
return 1
"""

# KEYS: positions hash, live ids set, truncate marker. ARGV: position, row key prefix.
_TRUNCATE = """
local cut = redis.call('GET', KEYS[3])
if cut and ARGV[1] <= cut then return 0 end
redis.call('SET', KEYS[3], ARGV[1])
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local seen = redis.call('HGET', KEYS[1], id)
  if not seen or seen < ARGV[1] then
    redis.call('DEL', ARGV[2] .. id)
    redis.call('SREM', KEYS[2], id)
  end
end
return 1
"""


def position_text(event: ChangeEvent) -> str:
    """The event's place in its source's order as fixed-width digits (`sort_text`), so
    that Lua's string order is that order (lineage, binlog position, Kafka offset, row
    within the record)."""
    return event.sort_text()


def cell_text(value: object) -> str:
    """How a column value is stored: its text (the cache's readers parse what they need)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisTableCache:
    """A batch handler that mirrors one table's rows into Redis hashes `<prefix>:<key>`."""

    def __init__(self, prefix: str, url_env: str = URL_ENV) -> None:
        self.prefix = prefix
        self.url_env = url_env
        self.client = None
        self.applied = 0  # changes that changed the cache (replays do not count)

    @property
    def keys(self) -> tuple[str, str, str]:
        """The positions hash, the live ids set and the truncate marker."""
        return (f"{self.prefix}:positions", f"{self.prefix}:ids", f"{self.prefix}:truncated")

    def open(self) -> None:
        import redis

        url = os.environ.get(self.url_env)
        if not url:
            raise RuntimeError(f"{self.url_env} is not set: the Redis URL of the "
                               f"{self.prefix!r} cache (redis://:password@host:port/db)")
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.client.ping()
        self._apply = self.client.register_script(_APPLY)
        self._truncate = self.client.register_script(_TRUNCATE)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def __call__(self, events: Sequence[ChangeEvent]) -> None:
        # One round trip per batch; the scripts run in order on the server.
        pipe = self.client.pipeline(transaction=False)
        positions, ids, cut = self.keys
        for event in events:
            if event.op == OP_TRUNCATE:
                self._truncate(keys=[positions, ids, cut],
                               args=[position_text(event), f"{self.prefix}:"], client=pipe)
            elif event.op in (OP_CREATE, OP_READ, OP_UPDATE, OP_DELETE):
                key = "|".join(cell_text(k) for k in event.key)
                args = [key, position_text(event)]
                if event.op == OP_DELETE:
                    args.append("del")
                else:
                    args.append("set")
                    for column, value in (event.after or {}).items():
                        if value is not None:
                            args += [column, cell_text(value)]
                self._apply(keys=[f"{self.prefix}:{key}", positions, ids, cut], args=args,
                            client=pipe)
            # DDL needs nothing here: a new column shows up in the next row images.
        self.applied += sum(pipe.execute())

    def rows(self) -> dict[str, dict[str, str]]:
        """Every cached row by key, over the open client."""
        return _rows(self.client, self.prefix)

    def rows_at(self, url: str) -> dict[str, dict[str, str]]:
        """Every cached row by key, read from the server at `url` (checks, the demo)."""
        import redis

        with redis.Redis.from_url(url, decode_responses=True) as client:
            return _rows(client, self.prefix)


def _rows(client: redis.Redis, prefix: str) -> dict[str, dict[str, str]]:
    ids = sorted(client.smembers(f"{prefix}:ids"))
    pipe = client.pipeline(transaction=False)
    for key in ids:
        pipe.hgetall(f"{prefix}:{key}")
    return dict(zip(ids, pipe.execute(), strict=True))


customers = RedisTableCache("customer")
registry = HandlerRegistry()
registry.register(TABLE, customers, name="customer-cache", batch=True)
