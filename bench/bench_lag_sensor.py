"""Lag sensor tick over 1,000 topic-partitions: `measure_lag` against raw admin requests.

What `kafka_lag_sensor` does on every tick is one `measure_lag(kafka_conf, group, topics)`
call: partition discovery, the group's committed offsets, and the low and high watermarks
of every partition (the high one under the client's isolation level, `read_committed`
here, so the last stable offset). This script creates `--topics` topics of `--partitions`
partitions each (1,000 in all by default), produces `--records` records to every
partition, and commits offsets for one group on every other partition (1 to `--records`,
varying), so the tick meets committed and never-committed partitions alike.

The baseline is the cheapest raw equivalent with confluent-kafka: a fresh `AdminClient`,
one metadata request, then `list_consumer_group_offsets` and two `list_offsets` (earliest,
latest under READ_COMMITTED) for all partitions, each one request, issued together. Both
sides create their client on every call, as a sensor tick does, and both must return the
same (low, high, committed) for every partition. They run `--rounds` times, interleaved;
printed: min and median seconds of each, binlake / baseline, and binlake's median against
the target (< 5 s per tick), with the load average.

    .venv/bin/python bench/bench_lag_sensor.py                               # 100 x 10
    .venv/bin/python bench/bench_lag_sensor.py --topics 20 --partitions 5    # quick
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from statistics import median

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, IsolationLevel, Producer
from confluent_kafka import TopicPartition as TP
from confluent_kafka.admin import AdminClient, OffsetSpec
from harness import PRODUCER_CONF, group_id, kafka_conf, load_average, running_broker

from binlog_assets.consume.lag import measure_lag
from binlog_assets.dev.kafka import create_topics

TARGET_SECONDS = 5.0

# (topic, partition) -> (low, high, committed or None)
Offsets = dict[tuple[str, int], tuple[int, int, int | None]]


def binlake_tick(bootstrap: str, group: str, topics: list[str]) -> Offsets:
    return {(pl.topic, pl.partition): (pl.low, pl.high, pl.committed)
            for pl in measure_lag(kafka_conf(bootstrap), group, topics)}


def baseline_tick(bootstrap: str, group: str, topics: list[str]) -> Offsets:
    """One metadata request, then committed offsets and both ends in one request each."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(timeout=30)
    tps = [TP(t, p) for t in topics for p in sorted(meta.topics[t].partitions)]
    committed_f = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, tps)], request_timeout=30)[group]
    level = IsolationLevel.READ_COMMITTED
    low_f = admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps},
                               isolation_level=level, request_timeout=30)
    high_f = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                isolation_level=level, request_timeout=30)
    committed = {(tp.topic, tp.partition): tp.offset
                 for tp in committed_f.result().topic_partitions}
    lows = {(tp.topic, tp.partition): f.result().offset for tp, f in low_f.items()}
    highs = {(tp.topic, tp.partition): f.result().offset for tp, f in high_f.items()}
    return {(tp.topic, tp.partition): (
        lows[tp.topic, tp.partition], highs[tp.topic, tp.partition],
        c if (c := committed[tp.topic, tp.partition]) >= 0 else None) for tp in tps}


def produce_everywhere(bootstrap: str, topics: list[str], partitions: int,
                       records: int) -> None:
    """`records` records to every partition. The first write to a fresh partition waits
    until the broker leads it: for 1,000 new partitions, 10-35 s here (a second round
    takes under 1 s), none of it in what is measured."""
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONF,
                         "delivery.report.only.error": False})
    delivered: list[int] = []
    errors: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        (delivered if err is None else errors).append(1 if err is None else err)

    for topic in topics:
        for p in range(partitions):
            for i in range(records):
                producer.produce(topic, b'{"n":%d}' % i, b"%d" % i, p, on_delivery)
        producer.poll(0)
    left = producer.flush(120)
    if left or errors or len(delivered) != len(topics) * partitions * records:
        raise RuntimeError(f"{left} undelivered, {len(delivered)} delivered, errors "
                           f"{errors[:3]}")


def commit_half(bootstrap: str, group: str, topics: list[str], partitions: int,
                records: int) -> dict[tuple[str, int], int]:
    """Commit every other partition, at offsets 1..records; what was committed."""
    want = {(t, p): 1 + (i + p) % records for i, t in enumerate(topics)
            for p in range(partitions) if (i * partitions + p) % 2 == 0}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        for attempt in range(50):  # a fresh broker's group coordinator is still loading
            try:
                consumer.commit(offsets=[TP(t, p, o) for (t, p), o in want.items()],
                                asynchronous=False)
                break
            except Exception:  # retried, then raised below
                if attempt == 49:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()
    return want


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=10, help="partitions per topic")
    parser.add_argument("--records", type=int, default=3, help="records per partition")
    parser.add_argument("--rounds", type=int, default=5,
                        help="each side runs this many times, interleaved")
    parser.add_argument("--heap", default="1g", help="broker JVM heap")
    args = parser.parse_args()
    total = args.topics * args.partitions

    with running_broker(args.heap) as broker:
        bootstrap = broker.bootstrap_servers
        run = uuid.uuid4().hex[:6]
        topics = [f"lag-{run}-{i:04d}" for i in range(args.topics)]
        began = time.perf_counter()
        create_topics(bootstrap, topics, args.partitions, timeout=120)
        print(f"created {args.topics} topics x {args.partitions} partitions = {total:,} in "
              f"{time.perf_counter() - began:.1f}s", flush=True)
        began = time.perf_counter()
        produce_everywhere(bootstrap, topics, args.partitions, args.records)
        print(f"produced {total * args.records:,} records in "
              f"{time.perf_counter() - began:.1f}s", flush=True)
        began = time.perf_counter()
        group = group_id("lag")
        committed = commit_half(bootstrap, group, topics, args.partitions, args.records)
        print(f"committed {len(committed):,} partitions in {time.perf_counter() - began:.1f}s;"
              f" {load_average()}", flush=True)

        sides: dict[str, Callable[[], Offsets]] = {
            "baseline": lambda: baseline_tick(bootstrap, group, topics),
            "binlake": lambda: binlake_tick(bootstrap, group, topics),
        }
        times: dict[str, list[float]] = {side: [] for side in sides}
        results: dict[str, Offsets] = {}
        for round_no in range(1, args.rounds + 1):
            for side, tick in sides.items():
                began = time.perf_counter()
                results[side] = tick()
                seconds = time.perf_counter() - began
                times[side].append(seconds)
                print(f"round {round_no} {side:<8} {seconds:7.3f}s  {load_average()}",
                      flush=True)
            check(results, committed, total, args.records)

    base, ours = median(times["baseline"]), median(times["binlake"])
    print(f"\n{total:,} topic-partitions ({args.topics} topics x {args.partitions}), "
          f"{len(committed):,} committed by the group, {args.rounds} rounds")
    print(f"{'side':<10}{'min s':>9}{'median s':>10}")
    for side in sides:
        print(f"{side:<10}{min(times[side]):>9.3f}{median(times[side]):>10.3f}")
    print(f"binlake/baseline = {ours / base:.2f} (medians; mins "
          f"{min(times['binlake']) / min(times['baseline']):.2f})")
    verdict = "meets" if ours < TARGET_SECONDS else "MISSES"
    print(f"binlake tick = {ours:.3f}s median ({verdict} target < {TARGET_SECONDS:g}s)")
    print(f"at the end: {load_average()}")


def check(results: dict[str, Offsets], committed: dict[tuple[str, int], int], total: int,
          records: int) -> None:
    """Both sides agree on every partition, and what they see is what was written."""
    ours, base = results["binlake"], results["baseline"]
    if ours != base:
        diff = [k for k in sorted(set(ours) | set(base)) if ours.get(k) != base.get(k)]
        raise RuntimeError(f"binlake and baseline differ on {len(diff)} partitions, e.g. "
                           f"{[(k, ours.get(k), base.get(k)) for k in diff[:3]]}")
    if len(ours) != total:
        raise RuntimeError(f"{len(ours)} partitions measured, {total} expected")
    for key, (low, high, c) in ours.items():
        if (low, high, c) != (0, records, committed.get(key)):
            raise RuntimeError(f"{key}: low={low} high={high} committed={c}")


if __name__ == "__main__":
    main()
