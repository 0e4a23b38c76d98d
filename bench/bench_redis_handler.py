"""The handler example's throughput: a Redis cache kept in step through the lanes.

`binlog_assets.examples.customer_cache.RedisTableCache` (a batch handler: one pipeline of
position-guarded Lua calls per batch) mirrors the `shop.orders` rows of a backlog of
Debezium events into a real `redis-server`. binlake is a `BoundedRun` with the handler
registered `batch=True`, at each `--lanes`; the baseline is one thread that consumes,
decodes and sends each consumed batch to the same handler, in partition order (the
fewest round trips a serial consumer can make). Each side writes its own key prefix on
an emptied server, and the cached rows of every side must be equal.

    .venv/bin/python bench/bench_redis_handler.py                      # 100,000 events
    .venv/bin/python bench/bench_redis_handler.py --messages 20000     # quick
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from confluent_kafka import TopicPartition
from harness import (
    create_topic,
    decode_message,
    group_id,
    kafka_conf,
    load_average,
    plain_consumer,
    produce_debezium,
    running_broker,
    serial_batches,
)

from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.run import BoundedRun, RunSettings
from binlog_assets.dev.redis import REDIS_URL_ENV, RedisServer
from binlog_assets.examples.customer_cache import RedisTableCache
from binlog_assets.formats import make_decoder

TABLE = "shop.orders"


def baseline(bootstrap: str, topic: str, end: int, cache: RedisTableCache,
             batch_size: int) -> float:
    decoder = make_decoder("debezium")
    began = time.perf_counter()
    consumer = plain_consumer(bootstrap, "redis-serial")
    try:
        for batch in serial_batches(consumer, [TopicPartition(topic, 0, 0)], end, batch_size):
            events = [e for msg in batch for e in decode_message(decoder, msg)]
            if events:
                cache(events)
    finally:
        consumer.close()
    return time.perf_counter() - began


def binlake(bootstrap: str, topic: str, end: int, cache: RedisTableCache, lanes: int,
            batch_size: int) -> float:
    registry = HandlerRegistry()
    registry.register(TABLE, cache, name="redis-cache", batch=True)
    settings = RunSettings(kafka_conf=kafka_conf(bootstrap), group_id=group_id(f"r{lanes}"),
                           format="debezium", lanes=lanes, batch_size=batch_size)
    began = time.perf_counter()
    with registry.opened():
        summary = BoundedRun(topic, 0, registry, settings).run()
    seconds = time.perf_counter() - began
    if summary.committed_offset != end or summary.dead_lettered:
        raise RuntimeError(f"lanes={lanes}: committed {summary.committed_offset} of {end}, "
                           f"{summary.dead_lettered} dead-lettered")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--batch-size", type=int, default=1000)
    args = parser.parse_args()

    with running_broker() as broker, tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp) / "redis")
        redis.start()
        os.environ[REDIS_URL_ENV] = redis.url
        try:
            bootstrap = broker.bootstrap_servers
            topic = create_topic(bootstrap, "redis")
            end = produce_debezium(bootstrap, topic, args.messages, args.keys).messages
            sides: list[tuple[str, float, dict]] = []
            cache = RedisTableCache("base")
            cache.open()
            try:
                seconds = baseline(bootstrap, topic, end, cache, args.batch_size)
                sides.append(("baseline (1 thread, a pipeline per batch)", seconds,
                              cache.rows()))
            finally:
                cache.close()
            print(f"baseline {seconds:.2f}s", flush=True)
            for lanes in args.lanes:
                cache = RedisTableCache(f"l{lanes}")
                seconds = binlake(bootstrap, topic, end, cache, lanes, args.batch_size)
                sides.append((f"binlake lanes={lanes}", seconds, cache.rows_at(redis.url)))
                print(f"lanes={lanes} {seconds:.2f}s", flush=True)
        finally:
            redis.stop()

    base_seconds, base_rows = sides[0][1], sides[0][2]
    print(f"\n{end:,} events of {TABLE} ({args.keys:,} keys) into redis-server")
    print(f"{'side':<44}{'seconds':>9}{'events/s':>11}{'vs base':>9}  cache equal")
    for name, seconds, rows in sides:
        print(f"{name:<44}{seconds:>9.2f}{end / seconds:>11,.0f}{base_seconds / seconds:>8.2f}x"
              f"  {'yes' if rows == base_rows else 'NO'} ({len(rows):,} rows)")
    if any(rows != base_rows for _, _, rows in sides):
        raise SystemExit("the caches differ")
    best = max(sides[1:], key=lambda s: end / s[1])
    print(f"binlake best ({best[0]}) / baseline = {base_seconds / best[1]:.2f}x")
    print(f"at the end: {load_average()}")


if __name__ == "__main__":
    main()
