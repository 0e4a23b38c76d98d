"""BoundedRun's settings without a broker: what `lanes` starts, the prefetch it derives
from `max_in_flight`, and the small first batches. A fake consumer serves the records."""

from __future__ import annotations

import gc
import itertools
import threading
import time

import orjson
import pytest
from confluent_kafka import TopicPartition

from binlog_assets.config import ConfigError, parse_config
from binlog_assets.consume import lanes as lanes_module
from binlog_assets.consume import run as run_module
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.consume.lanes import DispatchOptions
from binlog_assets.consume.run import BoundedRun, RunSettings
from binlog_assets.consume.runtime import consumer_defaults


class FakeMessage:
    def __init__(self, offset: int, key: int) -> None:
        self._offset = offset
        self._key = orjson.dumps({"id": key})
        self._value = orjson.dumps({
            "before": None, "after": {"id": key, "v": offset}, "op": "c", "ts_ms": 1,
            "source": {"db": "db", "table": "t", "file": "mysql-bin.000001",
                       "pos": 100 + offset, "row": 0, "snapshot": "false", "ts_ms": 1},
        })

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return self._key

    def headers(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0


class FakeConsumer:
    """Serves `records` from offset 0; remembers its config and every batch size asked."""

    def __init__(self, conf: dict, records: int) -> None:
        self.conf = conf
        self.messages = [FakeMessage(o, o % 7) for o in range(records)]
        self.position_ = 0
        self.asked: list[int] = []
        self.commits: list[int] = []

    def committed(self, tps, timeout=None):
        return [TopicPartition("t", 0, -1001)]

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        return 0, len(self.messages)

    def assign(self, tps) -> None:
        self.position_ = tps[0].offset

    def consume(self, num_messages=1, timeout=1.0):
        self.asked.append(num_messages)
        out = self.messages[self.position_ : self.position_ + num_messages]
        self.position_ += len(out)
        return out

    def position(self, tps):
        return [TopicPartition("t", 0, self.position_)]

    def pause(self, tps) -> None:
        self.paused = getattr(self, "paused", 0) + 1

    def resume(self, tps) -> None:
        pass

    def commit(self, offsets=None, asynchronous=False) -> None:
        self.commits.append(offsets[0].offset)

    def close(self) -> None:
        pass


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch):
    made: list[FakeConsumer] = []

    def make(records: int):
        def consumer(conf: dict) -> FakeConsumer:
            made.append(FakeConsumer(conf, records))
            return made[-1]

        monkeypatch.setattr(run_module, "Consumer", consumer)
        return made

    return make


@pytest.fixture
def dispatchers(monkeypatch: pytest.MonkeyPatch) -> list[DispatchOptions]:
    """The options of every LaneDispatcher a run creates."""
    created: list[DispatchOptions] = []
    real = run_module.LaneDispatcher

    def spy(registry, options, **kw):
        created.append(options)
        return real(registry, options, **kw)

    monkeypatch.setattr(run_module, "LaneDispatcher", spy)
    return created


def run(records: int, fake_kafka, delay: float = 0.0, **kw) -> tuple[FakeConsumer, list[int]]:
    handled: list[int] = []
    registry = HandlerRegistry()

    def handler(ev) -> None:
        if delay:
            time.sleep(delay)
        handled.append(ev.offset)

    registry.register("db.t", handler)
    settings = RunSettings(kafka_conf=kw.pop("kafka_conf", {}), group_id="g",
                           format="debezium", **kw)
    made = fake_kafka(records)
    bounded = BoundedRun("t", 0, registry, settings)
    summary = bounded.run()
    assert summary.committed_offset == records
    assert sorted(handled) == list(range(records))
    assert bounded.peak_in_flight <= settings.max_in_flight
    return made[-1], handled


@pytest.mark.parametrize(
    ("lanes", "workers", "slots", "threads"),
    [(16, None, 8, 16), (64, None, 8, 64), (100, None, 8, 64), (64, 8, 8, 8), (4, None, 1, 4)],
)
def test_lanes_are_the_parallelism_over_finer_key_slots(
    fake_kafka, dispatchers, lanes: int, workers: int | None, slots: int, threads: int
) -> None:
    run(50, fake_kafka, lanes=lanes, workers=workers, key_slots_per_lane=slots)
    assert dispatchers[0].slots == lanes * slots
    assert dispatchers[0].workers == threads


def test_prefetch_is_derived_from_max_in_flight_unless_configured(fake_kafka) -> None:
    assert consumer_defaults(10_000)["queued.min.messages"] == 5000
    assert consumer_defaults(500)["queued.min.messages"] == 1000
    consumer, _ = run(10, fake_kafka, max_in_flight=4000)
    assert consumer.conf["queued.min.messages"] == 2000
    assert consumer.conf["max.partition.fetch.bytes"] == 512 * 1024
    assert consumer.conf["fetch.queue.backoff.ms"] == 10
    assert consumer.conf["isolation.level"] == "read_committed"
    consumer, _ = run(10, fake_kafka, kafka_conf={"queued.min.messages": 123,
                                                  "max.partition.fetch.bytes": 1 << 20})
    assert consumer.conf["queued.min.messages"] == 123
    assert consumer.conf["max.partition.fetch.bytes"] == 1 << 20


def test_first_batches_are_small_and_double_up_to_batch_size(fake_kafka) -> None:
    consumer, _ = run(3000, fake_kafka, batch_size=1000)
    assert consumer.asked[:6] == [64, 128, 256, 512, 1000, 1000]
    assert sum(consumer.asked) >= 3000 and max(consumer.asked) == 1000


def test_per_key_order_through_a_run_with_key_slots(fake_kafka) -> None:
    _, handled = run(2000, fake_kafka, lanes=8, key_slots_per_lane=8, batch_size=300)
    for key in range(7):
        offsets = [o for o in handled if o % 7 == key]
        assert offsets == sorted(offsets)


@pytest.mark.parametrize(
    ("source", "field"),
    [({"key_slots_per_lane": 0}, "sources[0].key_slots_per_lane"),
     ({"key_slots_per_lane": 65}, "sources[0].key_slots_per_lane"),
     ({"lanes": 4096, "key_slots_per_lane": 16}, "sources[0]")],
)
def test_key_slots_are_validated(source: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"sources": [{"name": "s", "topics": ["t"], **source}]})
    assert f"{field}:" in str(err.value)


def test_config_defaults_match_the_run_defaults() -> None:
    source = parse_config({"sources": [{"name": "s", "topics": ["t"]}]}).sources[0]
    assert source.lanes == RunSettings.lanes
    assert source.key_slots_per_lane == RunSettings.key_slots_per_lane
    assert source.max_in_flight == RunSettings.max_in_flight


def test_at_max_in_flight_the_run_waits_for_the_lanes_without_pausing(fake_kafka) -> None:
    """Backpressure: never more than max_in_flight events in flight, and no pause (which
    would discard librdkafka's prefetch); the run picks up as soon as the lanes drain."""
    began = time.monotonic()
    consumer, _ = run(400, fake_kafka, delay=0.001, lanes=2, max_in_flight=20,
                      batch_size=50)
    assert not getattr(consumer, "paused", 0)
    # 400 handler calls of 1 ms on 2 lanes: about 0.2 s of handling; the waits for the
    # low-water mark (up to 0.2 s each, about 40 of them) must end as the lanes drain.
    assert time.monotonic() - began < 5


def test_gc_threshold_is_raised_during_runs_and_restored_after_concurrent_ones(
    fake_kafka,
) -> None:
    before = gc.get_threshold()
    seen: list[int] = []
    release = threading.Event()
    registry = HandlerRegistry()

    def handler(ev) -> None:
        seen.append(gc.get_threshold()[0])
        release.wait(5)

    registry.register("db.t", handler)
    fake_kafka(3)
    runs = [BoundedRun("t", 0, registry, RunSettings(kafka_conf={}, group_id=f"g{i}",
                                                     format="debezium", lanes=1))
            for i in range(2)]
    threads = [threading.Thread(target=r.run) for r in runs]
    threads[0].start()
    time.sleep(0.2)
    threads[1].start()
    time.sleep(0.2)
    release.set()
    for t in threads:
        t.join(10)
    assert len(seen) == 6 and min(seen) >= 20_000  # raised in both runs, throughout
    assert gc.get_threshold() == before  # and restored once the last one ended


def test_a_run_leaves_the_cycles_before_it_to_the_young_generations(fake_kafka) -> None:
    """A follower runs bounded runs round after round in one process. Each froze
    everything alive as it started and unfroze it as it ended, which put the last round's
    cycles (its lanes and their threads) in the oldest generation uncounted, where no
    automatic collection reached them: the follower grew 30-100 MB a minute. A cycle left
    before a run must stay where a young collection frees it."""
    import weakref

    registry = HandlerRegistry()
    registry.register("db.t", lambda ev: None)

    def one_run(group: str) -> None:
        fake_kafka(3)
        BoundedRun("t", 0, registry, RunSettings(kafka_conf={}, group_id=group,
                                                 format="debezium", lanes=1)).run()

    one_run("g-first")  # the process's first run (what is alive then may stay frozen)

    class Node:
        pass

    gc.disable()  # no collection before the run: the cycle is young garbage as it starts
    try:
        node = Node()
        node.me = node
        left = weakref.ref(node)
        del node
        one_run("g-next")
    finally:
        gc.enable()
    gc.collect(1)
    assert left() is None


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """(events per submit_many call, events submitted so far at each GIL yield)."""
    submitted: list[int] = []
    yields: list[int] = []
    real_submit = run_module.LaneDispatcher.submit_many

    def submit_many(self, events) -> None:
        submitted.append(len(events))
        real_submit(self, events)

    monkeypatch.setattr(run_module.LaneDispatcher, "submit_many", submit_many)
    monkeypatch.setattr(run_module, "yield_gil", lambda: yields.append(sum(submitted)))
    return submitted, yields


def test_poll_thread_yields_the_gil_between_slices_while_handlers_wait(
    fake_kafka, handed
) -> None:
    """Slow (I/O) handlers: the poll thread hands the lanes at most _YIELD_EVERY records
    at a time and gives the GIL up after each slice, so workers coming back from their
    I/O are not held up by a whole batch's decoding."""
    submitted, yields = handed
    run(400, fake_kafka, delay=0.002, lanes=16)
    assert sum(submitted) == 400
    assert max(submitted) <= run_module._YIELD_EVERY
    # a yield after every slice but the one that reaches the end offset
    assert len(yields) >= 400 // run_module._YIELD_EVERY - 1
    assert all(b - a <= run_module._YIELD_EVERY for a, b in itertools.pairwise(yields))


def test_cheap_handlers_get_whole_batches_without_yields(
    fake_kafka, handed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cheap handlers: once measured, whole batches go to the lanes in one call, and the
    poll thread (then the bottleneck) does not give the GIL away.

    The lanes measure by the clock; on a busy host a preempted lane run measured as a
    waiting one and the yields went on (to 1,960 events, in a clean-clone `make test`).
    Here the lanes' clock moves a microsecond per reading: the handlers measure cheap
    whatever the host does."""
    ticks = itertools.count()
    monkeypatch.setattr(lanes_module, "monotonic", lambda: next(ticks) * 1e-6)
    submitted, yields = handed
    run(5000, fake_kafka, batch_size=1000)
    assert sum(submitted) == 5000
    assert submitted.count(1000) >= 2, submitted  # the last batches, measured cheap, whole
    # before the handlers are measured they count as waiting: only early slices yield
    assert all(n <= 1000 for n in yields), (yields[-3:], submitted)


def test_run_without_handlers_decodes_whole_batches_without_yields(
    fake_kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changelog-only run (no handler for any table): no worker ever waits for the GIL,
    so the poll thread takes whole batches and never gives it away."""
    yields: list[int] = []
    slices: list[int] = []
    real_slice = run_module.BoundedRun._handle_slice

    def handle_slice(self, poll, msgs) -> None:
        slices.append(len(msgs))
        real_slice(self, poll, msgs)

    monkeypatch.setattr(run_module.BoundedRun, "_handle_slice", handle_slice)
    monkeypatch.setattr(run_module, "yield_gil", lambda: yields.append(1))
    fake_kafka(3000)
    bounded = BoundedRun("t", 0, HandlerRegistry(), RunSettings(
        kafka_conf={}, group_id="g", format="debezium", batch_size=1000))
    summary = bounded.run()
    assert summary.committed_offset == 3000 and summary.events == 3000
    assert yields == []
    assert max(slices) > run_module._YIELD_EVERY, slices


class StallingConsumer(FakeConsumer):
    """Delivers nothing for `stall` seconds from its first fetch (a frozen broker), then
    serves; each commit takes `commit_seconds`."""

    stall = 0.0
    commit_seconds = 0.0

    def consume(self, num_messages=1, timeout=1.0):
        self.first = getattr(self, "first", time.monotonic())
        if time.monotonic() - self.first < self.stall:
            time.sleep(0.02)
            return []
        return super().consume(num_messages, timeout)

    def commit(self, offsets=None, asynchronous=False) -> None:
        time.sleep(self.commit_seconds)
        super().commit(offsets, asynchronous)


@pytest.mark.parametrize(("stall", "commit_seconds"), [(0.6, 0.0), (0.0, 0.6)])
def test_the_longest_wait_on_kafka_is_in_the_summary(
    monkeypatch: pytest.MonkeyPatch, stall: float, commit_seconds: float
) -> None:
    """Empty fetches in a row while records are left, or a slow commit: a frozen broker
    that raises no error still shows in the run's summary, so its run can name it."""
    monkeypatch.setattr(StallingConsumer, "stall", stall)
    monkeypatch.setattr(StallingConsumer, "commit_seconds", commit_seconds)
    monkeypatch.setattr(run_module, "Consumer", lambda conf: StallingConsumer(conf, 300))
    summary = BoundedRun("t", 0, HandlerRegistry(), RunSettings(
        kafka_conf={}, group_id="g", format="debezium")).run()
    assert summary.committed_offset == 300
    assert summary.kafka_wait_seconds >= max(stall, commit_seconds)
