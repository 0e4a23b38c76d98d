"""BoundedRun against the real broker: gaps, aborted transactions, compaction, crashes,
poison messages and a paused partition."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from binlog_assets.consume.checkpoint import retry_retriable
from binlog_assets.consume.errors import ErrorPolicy
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.offsets import OffsetTracker
from binlog_assets.consume.run import BoundedRun, RunSettings, StrictModeFailure
from binlog_assets.consume.run_settings import RunParts
from binlog_assets.dev.kafka import KafkaBroker, abort_transaction, create_topic


def debezium(table: str, op: str, key: int, value: str, pos: int) -> bytes:
    row = {"id": key, "v": value}
    db, tbl = table.split(".")
    return orjson.dumps({
        "before": row if op in ("u", "d") else None,
        "after": row if op != "d" else None,
        "op": op, "ts_ms": 1,
        "source": {"db": db, "table": tbl, "file": "mysql-bin.000001", "pos": pos, "row": 0,
                   "snapshot": "false", "ts_ms": 1},
    })


def key_bytes(key: int) -> bytes:
    return orjson.dumps({"id": key})


def make_topic(broker: KafkaBroker, partitions: int = 1, **config: str) -> str:
    return create_topic(broker.bootstrap_servers, "run", partitions, **config)


def settings(broker: KafkaBroker, group: str | None = None, **kw) -> RunSettings:
    return RunSettings(
        kafka_conf={"bootstrap.servers": broker.bootstrap_servers,
                    "auto.offset.reset": "earliest"},
        group_id=group or f"g-{uuid.uuid4().hex[:6]}",
        format="debezium",
        lanes=kw.pop("lanes", 4),
        commit_interval_seconds=kw.pop("commit_interval_seconds", 0.5),
        **kw,
    )


class Recorder:
    """A handler that records (table, key, position) in the order it saw them."""

    def __init__(self, delay: float = 0.0) -> None:
        self.seen: list[tuple[str, tuple, int, int]] = []
        self.lock = threading.Lock()
        self.delay = delay

    def __call__(self, event) -> None:
        if self.delay:
            time.sleep(self.delay)
        with self.lock:
            self.seen.append((event.table, event.key, event.position.pos, event.offset))

    def registry(self, pattern: str = r".*") -> HandlerRegistry:
        reg = HandlerRegistry()
        reg.register(pattern, self, name="recorder")
        return reg


def keyed_inserts(broker: KafkaBroker, records: int, keys: int) -> tuple[str, str]:
    """A new topic with `records` inserts over `keys` keys in turn, and a new group."""
    topic = make_topic(broker)
    p = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(records):
        p.produce(topic, key=key_bytes(i % keys), value=debezium("db.t", "c", i % keys, "x", i + 1))
    p.flush(10)
    return topic, f"g-{uuid.uuid4().hex[:6]}"


def committed(broker: KafkaBroker, group: str, topic: str, partition: int = 0):
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        return retry_retriable(
            lambda: c.committed([TopicPartition(topic, partition)], timeout=10)[0], "committed")
    finally:
        c.close()


def test_transactional_topic_with_aborted_transaction(kafka_broker: KafkaBroker) -> None:
    topic = make_topic(kafka_broker)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers,
                  "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    pos = 0
    for txn in range(6):
        p.begin_transaction()
        for k in range(5):
            pos += 1
            p.produce(topic, key=key_bytes(k), value=debezium("db.t", "u", k, f"{txn}", pos))
        if txn == 3:
            abort_transaction(p, 30)
        else:
            p.commit_transaction(30)

    rec = Recorder()
    s = settings(kafka_broker)
    summary = BoundedRun(topic, 0, rec.registry(), s).run()

    assert summary.records == 25  # 5 committed transactions of 5
    assert len(rec.seen) == 25
    # Gaps (markers, the aborted batch) never block: the commit reaches the end offset.
    assert summary.committed_offset == summary.end_offset
    assert committed(kafka_broker, s.group_id, topic).offset == summary.end_offset
    # Per key, positions arrive in order.
    for k in range(5):
        positions = [pos for (_, key, pos, _) in rec.seen if key == (k,)]
        assert positions == sorted(positions) and len(positions) == 5


def test_compacted_topic_offsets_gaps(kafka_broker: KafkaBroker) -> None:
    topic = make_topic(kafka_broker, **{
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100", "min.compaction.lag.ms": "0",
    })
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    pos = 0
    for rnd in range(30):
        for k in range(3):
            pos += 1
            p.produce(topic, key=key_bytes(k), value=debezium("db.t", "u", k, str(rnd), pos))
        p.flush(10)
        time.sleep(0.15)  # roll segments so the cleaner has something to compact
    # Wait until compaction removed records (the earliest offsets vanish from the log).
    deadline = time.monotonic() + 60
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "peek",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    delivered: list[int] = []
    while time.monotonic() < deadline:
        c.seek(TopicPartition(topic, 0, 0)) if delivered else None
        delivered = []
        for _ in range(20):
            msgs = c.consume(200, timeout=0.3)
            delivered += [m.offset() for m in msgs if m.error() is None]
            if not msgs:
                break
        if len(delivered) < 90:
            break
        time.sleep(1)
    c.close()
    if len(delivered) >= 90:
        pytest.fail("the log cleaner did not compact the topic within 60 s")

    rec = Recorder()
    s = settings(kafka_broker)
    summary = BoundedRun(topic, 0, rec.registry(), s).run()
    # The cleaner may keep compacting after the peek: the run sees no more than the peek.
    assert summary.records <= len(delivered) < 90
    assert summary.committed_offset == summary.end_offset == 90
    last = {key: pos for (_, key, pos, _) in rec.seen}
    assert last == {(0,): 88, (1,): 89, (2,): 90}


def test_crash_mid_run_then_rerun_skips_done_beyond_commit(kafka_broker: KafkaBroker) -> None:
    topic, group = keyed_inserts(kafka_broker, 200, keys=20)

    # A child run never finishes offset 0; everything else completes and is committed as
    # metadata. Then it is SIGKILLed: a crash, with no chance to clean up.
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("crash_child.py")),
                              kafka_broker.bootstrap_servers, topic, group])
    try:
        # Wait until the committed metadata stops growing: everything not stuck is done.
        # Stable only counts from the child's first commit (a loaded host may take
        # seconds to start it), and for 3 s, 15 of its commit intervals.
        deadline = time.monotonic() + 120
        done_beyond: set[int] = set()
        stable_since = time.monotonic()
        while time.monotonic() < deadline and (
                not done_beyond or time.monotonic() - stable_since < 3.0):
            time.sleep(0.3)
            got = committed(kafka_broker, group, topic)
            now = OffsetTracker.decode_metadata(got.offset, got.metadata) if got.offset >= 0 \
                else set()
            if now != done_beyond:
                done_beyond, stable_since = now, time.monotonic()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert got.offset == 0, "committed past an offset that was not done"
    # Offsets on other lanes than the stuck one finished and were recorded.
    assert 100 < len(done_beyond) < 200 and 0 not in done_beyond

    rec = Recorder()
    summary = BoundedRun(topic, 0, rec.registry(), settings(kafka_broker, group=group)).run()
    # Exactly what the crashed run had not finished is redone; nothing is done twice.
    assert sorted(off for (_, _, _, off) in rec.seen) == sorted(set(range(200)) - done_beyond)
    assert summary.skipped_already_done == len(done_beyond)
    assert summary.committed_offset == 200
    assert committed(kafka_broker, group, topic).offset == 200


def test_a_stopped_run_commits_what_is_done_and_the_next_run_does_the_rest(
        kafka_broker: KafkaBroker) -> None:
    """Its `stop` set (Dagster terminated the run), a run drops the events not started,
    lets the handler calls in progress finish, and commits: the contiguous done offset,
    with what is done beyond it in the metadata. The next run handles every event the
    first did not, and none twice."""
    topic, group = keyed_inserts(kafka_broker, 400, keys=40)
    stop = threading.Event()
    rec = Recorder(delay=0.02)  # four lanes: 2 s for the whole partition

    def handler(event) -> None:
        rec(event)
        if len(rec.seen) >= 60:
            stop.set()

    registry = HandlerRegistry()
    registry.register(r".*", handler, name="recorder")
    first = BoundedRun(topic, 0, registry, settings(kafka_broker, group=group),
                       RunParts(stop=stop)).run()
    assert first.stop_reason == "interrupted"
    handled = {off for (_, _, _, off) in rec.seen}
    # The run looks at its stop every 0.2 s while its lanes drain: it ended well before
    # the partition's end.
    assert 60 <= len(handled) <= 200, len(handled)
    assert len(rec.seen) == len(handled)
    got = committed(kafka_broker, group, topic)
    assert got.offset == first.committed_offset
    assert set(range(got.offset)) <= handled
    assert OffsetTracker.decode_metadata(got.offset, got.metadata) == {
        o for o in handled if o >= got.offset}

    rec.seen.clear()
    second = BoundedRun(topic, 0, rec.registry(), settings(kafka_broker, group=group)).run()
    assert sorted(off for (_, _, _, off) in rec.seen) == sorted(set(range(400)) - handled)
    assert second.committed_offset == 400 and second.stop_reason == "end_offset"


def test_poison_message_dead_lettered_with_coordinates(kafka_broker: KafkaBroker) -> None:
    topic = make_topic(kafka_broker)
    dlq = f"{topic}.dlq"
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    p.produce(topic, key=key_bytes(1), value=debezium("db.t", "c", 1, "a", 1))
    p.produce(topic, key=b"k", value=b"{not json")  # undecodable
    p.produce(topic, key=key_bytes(2), value=debezium("db.t", "c", 2, "poison", 3))
    p.produce(topic, key=key_bytes(3), value=debezium("db.t", "c", 3, "b", 4))
    p.flush(10)

    def handler(event) -> None:
        if event.after and event.after.get("v") == "poison":
            raise ValueError("cannot apply poison row")

    reg = HandlerRegistry()
    reg.register(r".*", handler, name="h")
    s = settings(kafka_broker, dead_letter_topic=dlq,
                 error_policy=ErrorPolicy(max_retries=2, backoff_initial=0.01))
    summary = BoundedRun(topic, 0, reg, s).run()
    assert summary.dead_lettered == 2
    assert summary.committed_offset == 4

    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "dlq-read",
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(dlq, 0, 0)])
    letters = []
    for _ in range(20):
        letters += [m for m in c.consume(10, timeout=0.5) if m.error() is None]
        if len(letters) >= 2:
            break
    c.close()
    headers = [dict(m.headers()) for m in letters]
    by_offset = {int(h["binlake.offset"]): h for h in headers}
    assert set(by_offset) == {1, 2}
    assert by_offset[1]["binlake.stage"] == b"decode"
    assert by_offset[1]["binlake.topic"] == topic.encode()
    assert by_offset[1]["binlake.partition"] == b"0"
    assert by_offset[2]["binlake.stage"] == b"handler"
    assert b"poison" in by_offset[2]["binlake.error"]
    assert by_offset[2]["binlake.attempts"] == b"3"
    assert [m.value() for m in letters if dict(m.headers())["binlake.offset"] == b"1"] == [
        b"{not json"]


def test_a_handler_failing_in_strict_mode_fails_the_run_at_its_contiguous_offset(
    kafka_broker: KafkaBroker,
) -> None:
    topic, group = keyed_inserts(kafka_broker, 20, 20)
    registry = HandlerRegistry()

    def refuse(event) -> None:
        if event.key == (7,):
            raise ValueError("refused")

    registry.register(r".*", refuse, name="refuse")
    s = settings(kafka_broker, group, error_policy=ErrorPolicy(max_retries=0, strict=True))
    # The message says how far the commit went and how much was still in flight.
    with pytest.raises(StrictModeFailure, match=r"committed up to \d+ \(\d+ records "
                                                r"received and not done\): .*refused") as e:
        BoundedRun(topic, 0, registry, s).run()
    said = int(re.search(r"committed up to (\d+)", str(e.value)).group(1))
    assert committed(kafka_broker, group, topic).offset == said <= 7


def test_strict_mode_fails_and_commits_nothing_past_the_failure(
    kafka_broker: KafkaBroker,
) -> None:
    topic = make_topic(kafka_broker)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for i in range(10):
        p.produce(topic, key=key_bytes(i), value=debezium("db.t", "c", i, "x", i + 1))
    p.produce(topic, key=b"k", value=b"garbage")
    for i in range(10, 15):
        p.produce(topic, key=key_bytes(i), value=debezium("db.t", "c", i, "x", i + 1))
    p.flush(10)
    s = settings(kafka_broker, error_policy=ErrorPolicy(strict=True))
    rec = Recorder()
    with pytest.raises(StrictModeFailure, match=r"@10 .*committed up to 10, nothing past it"):
        BoundedRun(topic, 0, rec.registry(), s).run()
    # What came before the bad message is handled and committed; nothing after it is.
    got = committed(kafka_broker, s.group_id, topic)
    assert got.offset == 10
    assert sorted(off for (_, _, _, off) in rec.seen) == list(range(10))


def test_paused_partition_while_another_keeps_flowing(kafka_broker: KafkaBroker) -> None:
    topic = make_topic(kafka_broker, partitions=2)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for i in range(300):
        p.produce(topic, partition=0, key=key_bytes(i % 3),
                  value=debezium("db.slow", "c", i % 3, "x", i + 1))
        p.produce(topic, partition=1, key=key_bytes(i),
                  value=debezium("db.fast", "c", i, "x", i + 1))
    p.flush(10)

    slow = Recorder(delay=0.01)
    fast = Recorder()
    s_slow = settings(kafka_broker, lanes=2, max_in_flight=20)
    s_fast = settings(kafka_broker, lanes=2, max_in_flight=20)
    slow_run = BoundedRun(topic, 0, slow.registry(), s_slow)
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("slow", slow_run.run()))
    t.start()
    fast_summary = BoundedRun(topic, 1, fast.registry(), s_fast).run()
    # The fast partition finished while the slow one was still throttled by backpressure.
    assert fast_summary.records == 300
    assert t.is_alive()
    t.join(60)
    assert results["slow"].records == 300
    assert results["slow"].committed_offset == 300
    assert slow_run.peak_in_flight <= 20


def test_a_finished_run_leaves_no_kafka_client_behind(kafka_broker: KafkaBroker) -> None:
    """A process that runs bounded runs one after another (the changelog follower) must
    get each run's consumer back at once: each client holds one of the process's 1,024
    thread-local keys, and a client left in cyclic garbage waits for a full collection
    (rare in a large process) while the next runs make more."""
    import gc

    from confluent_kafka import Consumer, Producer

    topic, group = keyed_inserts(kafka_broker, 20, keys=4)

    def clients() -> int:
        return sum(isinstance(o, Consumer | Producer) for o in gc.get_objects())

    gc.collect()
    gc.disable()  # what the run leaves in cycles stays visible to get_objects
    try:
        before = clients()
        for _ in range(3):
            summary = BoundedRun(topic, 0, Recorder().registry(),
                                 settings(kafka_broker, group=group)).run()
        assert summary.committed_offset == 20
        assert clients() == before
    finally:
        gc.enable()
