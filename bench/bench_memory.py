"""Bounded memory: peak RSS of one BoundedRun over a 10,000,000-record backlog vs 10,000.

A run's memory should depend on `max_in_flight` and librdkafka's prefetch (which a run
derives from `max_in_flight`: `consumer_defaults`), never on the backlog. Each
run is a fresh child process (this file with `--child`) whose handler does nothing; it
reports its own peak: `VmHWM` (the high-water RSS of its address space) and `ru_maxrss`.
Linux carries a parent's peak RSS into a child's `ru_maxrss` across fork+exec, so the
records are produced in other child processes too and the driver stays small; the
driver's own peak is printed to show that it is below every child's. Target: peak at
10M / peak at 10k <= 1.5. Small records (~210 B) keep production to about a minute.

The baseline, in the same run, is a plain loop (batch consume + Debezium decode, the same
consumer settings) over the first `--baseline-records` of the large backlog: its peak is
what librdkafka's prefetch and decoding cost without binlake, and the RSS quarters show
that each peak is reached early and then stays flat.

    .venv/bin/python bench/bench_memory.py                    # 10,000,000 vs 10,000
    .venv/bin/python bench/bench_memory.py --big 1000000      # quicker
    .venv/bin/python bench/bench_memory.py --conf queued.min.messages=2000    # less prefetch
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from harness import (
    create_topic,
    decode_message,
    end_offsets,
    group_id,
    kafka_conf,
    load_average,
    produce_debezium,
    rate,
    running_broker,
    serial_batches,
)

from binlog_assets.consume.run import RunSettings
from binlog_assets.consume.runtime import consumer_defaults

TARGET_RATIO = 1.5
_RSS_SAMPLE_SECONDS = 0.5


def status_kb(field: str) -> int:
    """A `/proc/self/status` memory field (VmRSS, VmHWM) in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def consumer_conf(args: argparse.Namespace, *, baseline: bool = False) -> dict:
    """binlake's Kafka config (the user's part), or for the plain loop the effective
    settings binlake runs with; `--conf` overrides either."""
    extra = dict(item.split("=", 1) for item in args.conf)
    base = ({**consumer_defaults(args.max_in_flight), **kafka_conf(args.bootstrap)}
            if baseline else kafka_conf(args.bootstrap))
    return {**base, **extra}


def measured(work: Callable[[], dict]) -> dict:
    """`work()`'s result with this process's memory: RSS before, quarters, peaks."""
    rss_before = status_kb("VmRSS")
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(_RSS_SAMPLE_SECONDS):
            samples.append(status_kb("VmRSS"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.perf_counter()
    out = work()
    seconds = time.perf_counter() - began
    stop.set()
    sampler.join()
    quarters = [samples[min(len(samples) - 1, len(samples) * q // 4)] for q in (1, 2, 3, 4)] \
        if samples else []
    return {**out, "seconds": seconds, "rss_before_kb": rss_before,
            "rss_quarters_kb": quarters, "vm_hwm_kb": status_kb("VmHWM"),
            "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def child_run(args: argparse.Namespace) -> dict:
    """One BoundedRun with a do-nothing handler over the whole topic; its memory."""
    from binlog_assets.consume.handlers import HandlerRegistry
    from binlog_assets.consume.run import BoundedRun, RunSettings

    registry = HandlerRegistry()
    registry.register(r".*", lambda _event: None, name="do_nothing")
    settings = RunSettings(
        kafka_conf=consumer_conf(args), group_id=group_id("memory"),
        format="debezium", lanes=args.lanes, max_in_flight=args.max_in_flight,
        batch_size=args.batch_size,
    )
    run = BoundedRun(args.topic, 0, registry, settings)

    def work() -> dict:
        summary = run.run()
        return {"records": summary.records, "committed": summary.committed_offset,
                "peak_in_flight": run.peak_in_flight}

    return measured(work)


def child_loop(args: argparse.Namespace) -> dict:
    """The baseline: batch consume + decode of the first `args.count` records."""
    from confluent_kafka import Consumer, TopicPartition

    from binlog_assets.formats import make_decoder

    decoder = make_decoder("debezium")
    end = args.count

    def work() -> dict:
        consumer = Consumer({**consumer_conf(args, baseline=True),
                             "group.id": group_id("memory-loop"),
                             "enable.partition.eof": True})
        last = -1
        try:
            for batch in serial_batches(consumer, [TopicPartition(args.topic, 0, 0)], end,
                                        args.batch_size):
                for msg in batch:
                    decode_message(decoder, msg)
                last = batch[-1].offset() if batch else last
        finally:
            consumer.close()
        return {"records": last + 1, "committed": last + 1, "peak_in_flight": 0}

    return measured(work)


def child_produce(args: argparse.Namespace) -> dict:
    produced = produce_debezium(args.bootstrap, args.topic, args.count, args.keys,
                                small=True, seed=args.seed, first_id=args.first_id,
                                expect_end=-1)
    return {"seconds": produced.seconds, "bytes": produced.payload_bytes}


def child(role: str, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--child", role, *argv],
                            stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen[str]) -> dict:
    out, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"child {proc.args} exited {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def produce(bootstrap: str, count: int, keys: int, producers: int, prefix: str
            ) -> tuple[str, float, float]:
    """`count` small records from `producers` processes: (topic, seconds, mean size)."""
    topic = create_topic(bootstrap, prefix)
    began = time.perf_counter()
    procs = []
    for j in range(producers):
        share = count // producers + (1 if j < count % producers else 0)
        procs.append(child("produce", "--bootstrap", bootstrap, "--topic", topic,
                           "--count", str(share), "--keys", str(keys // producers),
                           "--first-id", str(j * (keys // producers)), "--seed", str(j)))
    size = sum(result(p)["bytes"] for p in procs)
    seconds = time.perf_counter() - began
    _low, high = end_offsets(bootstrap, topic)
    if high != count:
        raise RuntimeError(f"{topic}: expected {count} records, the partition has {high}")
    return topic, seconds, size / count


def measure(role: str, bootstrap: str, topic: str, count: int, args: argparse.Namespace
            ) -> dict:
    conf = [arg for item in args.conf for arg in ("--conf", item)]
    run = result(child(role, "--bootstrap", bootstrap, "--topic", topic, "--count", str(count),
                       "--lanes", str(args.lanes), "--max-in-flight", str(args.max_in_flight),
                       "--batch-size", str(args.batch_size), *conf))
    if run["records"] != count or run["committed"] != count:
        raise RuntimeError(f"{topic}: {role} read {run['records']}, "
                           f"committed {run['committed']}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, default=10_000_000, help="large backlog")
    parser.add_argument("--small", type=int, default=10_000, help="small backlog")
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct primary keys")
    parser.add_argument("--producers", type=int, default=2, help="producer processes")
    parser.add_argument("--lanes", type=int, default=RunSettings.lanes)
    parser.add_argument("--max-in-flight", type=int, default=RunSettings.max_in_flight)
    parser.add_argument("--batch-size", type=int, default=RunSettings.batch_size)
    parser.add_argument("--baseline-records", type=int, default=1_000_000,
                        help="records of the large backlog the plain loop reads")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka consumer setting for every child")
    parser.add_argument("--heap", default="1g", help="broker JVM heap")
    parser.add_argument("--child", choices=list(_CHILDREN), help=argparse.SUPPRESS)
    for internal in ("--bootstrap", "--topic"):
        parser.add_argument(internal, help=argparse.SUPPRESS)
    for internal in ("--count", "--first-id", "--seed"):
        parser.add_argument(internal, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_CHILDREN[args.child](args)), flush=True)
        return

    began = time.perf_counter()
    runs: dict[str, dict] = {}
    baseline_count = min(args.baseline_records, args.big)
    with running_broker(args.heap) as broker:
        bootstrap = broker.bootstrap_servers
        topics = {}
        for count in (args.small, args.big):
            topic, seconds, size = produce(bootstrap, count, min(args.keys, count),
                                           args.producers, f"memory-{count}")
            topics[count] = topic
            print(f"produced {count:,} records (mean {size:.0f} B) in {seconds:.1f}s "
                  f"({rate(count, seconds):,.0f}/s, {args.producers} processes)", flush=True)
        sides = (("binlake", "run", args.small, args.small),
                 ("baseline", "loop", args.big, baseline_count),
                 ("binlake", "run", args.big, args.big))
        for name, role, backlog, count in sides:
            r = runs[f"{name} {backlog}"] = measure(role, bootstrap, topics[backlog], count,
                                                    args)
            print(f"{name} over {count:,} of {backlog:,}: {r['seconds']:.1f}s "
                  f"({rate(count, r['seconds']):,.0f} msgs/s), VmHWM "
                  f"{r['vm_hwm_kb'] / 1024:.0f} MiB", flush=True)

    small, big = runs[f"binlake {args.small}"], runs[f"binlake {args.big}"]
    settings = ", ".join([*(f"{k}={v}" for k, v in consumer_defaults(args.max_in_flight).items()),
                          *args.conf])
    print(f"\nlanes={args.lanes}, max_in_flight={args.max_in_flight}, batch={args.batch_size}, "
          f"{settings}; total {time.perf_counter() - began:.0f}s")
    print(f"{'side':<9}{'backlog':>12}{'read':>12}{'seconds':>9}{'msgs/s':>10}{'in-flight':>11}"
          f"{'RSS start':>11}{'VmHWM':>8}{'ru_maxrss':>11}  RSS at 1/4, 1/2, 3/4, end (MiB)")
    for name, _role, backlog, count in sides:
        r = runs[f"{name} {backlog}"]
        quarters = ", ".join(f"{kb / 1024:.0f}" for kb in r["rss_quarters_kb"]) or "-"
        print(f"{name:<9}{backlog:>12,}{count:>12,}{r['seconds']:>9.1f}"
              f"{rate(count, r['seconds']):>10,.0f}{r['peak_in_flight']:>11,}"
              f"{r['rss_before_kb'] / 1024:>10.0f}M{r['vm_hwm_kb'] / 1024:>7.0f}M"
              f"{r['ru_maxrss_kb'] / 1024:>10.0f}M  {quarters}")
    base = runs[f"baseline {args.big}"]
    ratio = big["vm_hwm_kb"] / small["vm_hwm_kb"]
    verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
    print(f"peak RSS {args.big:,} / {args.small:,} = {ratio:.2f} (VmHWM; {verdict} target <= "
          f"{TARGET_RATIO}); by ru_maxrss {big['ru_maxrss_kb'] / small['ru_maxrss_kb']:.2f}")
    print(f"binlake / baseline peak on the large backlog = "
          f"{big['vm_hwm_kb'] / base['vm_hwm_kb']:.2f} "
          f"(+{(big['vm_hwm_kb'] - base['vm_hwm_kb']) / 1024:.0f} MiB over the plain loop)")
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"driver peak RSS {driver / 1024:.0f} MiB (children's ru_maxrss cannot be below it)")
    print(f"at the end: {load_average()}")


_CHILDREN: dict[str, Callable[[argparse.Namespace], dict]] = {
    "run": child_run, "loop": child_loop, "produce": child_produce,
}

if __name__ == "__main__":
    main()
