"""Drill: malformed and poison messages mixed into a stream, fuzzed with hypothesis.

Each example is one topic holding a random mix of valid Debezium envelopes, Kafka
tombstones, undecodable values (bytes that are not JSON, truncated envelopes, JSON that
is not an object, envelopes with one field of the wrong type) and poison rows (valid,
but the table's handler raises on them). One bounded run (`consume_partition`, the
changelog asset's code) must finish without crashing; every undecodable message must be
in the dead-letter topic with its topic, partition, offset, stage `decode` and original
bytes; every poison row there with stage `handler` after its retries; every decodable
event in the changelog exactly once; every valid row handled once; the commit at the
end offset. The short variant runs 2 examples in `make test`, the long one 20.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter

import orjson
import pytest
from changelog_reads import changelog_frame
from confluent_kafka import Consumer, Producer, TopicPartition
from drill_lib import changelog_coordinates, coordinate_diff
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from binlog_assets.config import PipelineConfig, parse_config
from binlog_assets.consume.handlers import HandlerRegistry
from binlog_assets.dev import drills
from binlog_assets.dev.kafka import create_topics
from binlog_assets.formats.debezium import DebeziumDecoder
from binlog_assets.formats.event import DecodeError
from binlog_assets.orchestration.changelog_run_config import ChangelogRunConfig
from binlog_assets.rounds.round import consume_partition

TABLE = "poison.items"


def envelope(key: int, value: str, pos: int, op: str = "c") -> dict:
    row = {"id": key, "v": value}
    return {"before": row if op in ("u", "d") else None, "after": None if op == "d" else row,
            "op": op, "ts_ms": pos,
            "source": {"db": "poison", "table": "items", "file": "mysql-bin.000003",
                       "pos": pos, "row": 0, "snapshot": "false", "ts_ms": pos}}


def _mutate(doc: dict, how: str, junk) -> dict:
    doc = orjson.loads(orjson.dumps(doc))
    if how == "op":
        doc["op"] = junk if not isinstance(junk, str) else 7
    elif how == "source":
        doc["source"] = junk if not isinstance(junk, dict) else "nowhere"
    elif how == "after":
        doc["after"] = junk if not isinstance(junk, dict) and junk is not None else [junk]
    elif how == "after_null":
        doc["after"] = None
    elif how in ("pos", "row", "ts_ms"):
        doc["source"][how] = str(junk) + "x"
    return doc


_int = st.integers(-(10**9), 10**9)  # JSON numbers a decoder can read (orjson: 64 bits)
_junk = st.one_of(_int, st.text(max_size=8), st.lists(_int, max_size=3),
                  st.booleans(), st.floats(allow_nan=False, allow_infinity=False))


@st.composite
def malformed(draw, pos: int) -> tuple[str, bytes]:
    """(kind, value) of a message the Debezium decoder must reject."""
    kind = draw(st.sampled_from(["garbage", "truncated", "not_object", "op", "source",
                                 "after", "after_null", "pos", "row", "ts_ms"]))
    good = orjson.dumps(envelope(draw(st.integers(0, 50)), "x", pos))
    if kind == "garbage":
        return kind, b"\xff" + draw(st.binary(max_size=40))
    if kind == "truncated":
        return kind, good[:draw(st.integers(1, len(good) - 1))]
    if kind == "not_object":
        return kind, orjson.dumps(draw(st.one_of(st.none(), _junk)))
    return kind, orjson.dumps(_mutate(envelope(1, "x", pos), kind, draw(_junk)))


@st.composite
def streams(draw) -> list[tuple[str, bytes | None, bytes | None]]:
    """(kind, key, value): the messages of one topic, in order."""
    kinds = draw(st.lists(st.sampled_from(["good"] * 6 + ["bad"] * 2 + ["poison", "tombstone"]),
                          min_size=40, max_size=120))
    out = []
    for i, kind in enumerate(kinds):
        pos = 1000 + 10 * i
        if kind == "good":
            key = draw(st.integers(0, 30))
            op = draw(st.sampled_from(["c", "u", "d"]))
            out.append((kind, orjson.dumps({"id": key}),
                        orjson.dumps(envelope(key, f"v{i}", pos, op))))
        elif kind == "poison":
            key = 10_000 + i  # its own key: a breaker opening on it stops nothing else
            out.append((kind, orjson.dumps({"id": key}),
                        orjson.dumps(envelope(key, "poison", pos))))
        elif kind == "tombstone":
            out.append((kind, orjson.dumps({"id": draw(st.integers(0, 30))}), None))
        else:
            bad_kind, value = draw(malformed(pos))
            out.append((f"bad:{bad_kind}", draw(st.one_of(st.none(), st.binary(max_size=8))),
                        value))
    return out


class Recorder:
    def __init__(self) -> None:
        self.seen: Counter = Counter()
        self.lock = threading.Lock()

    def __call__(self, event) -> None:
        if event.after and event.after.get("v") == "poison":
            raise ValueError(f"cannot apply poison row {event.key}")
        with self.lock:
            self.seen[event.offset] += 1


def _read_all(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expected and time.monotonic() < deadline:
            got += [m for m in c.consume(200, timeout=0.5) if m.error() is None]
    finally:
        c.close()
    return got


def _poison_drill(pipeline_config: PipelineConfig, spark, examples: int, name: str) -> None:
    totals: Counter = Counter()
    kinds: Counter = Counter()
    began = time.monotonic()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=examples <= 2,
              suppress_health_check=list(HealthCheck))
    @given(stream=streams())
    def one_stream(stream) -> None:
        # The fuzzed bad values are bad for the decoder itself, not only in this run.
        for kind, key, value in stream:
            if kind.startswith("bad:"):
                with pytest.raises(DecodeError):
                    DebeziumDecoder().decode(value, topic="t", partition=0, offset=0, key=key)
        bootstrap = pipeline_config.bootstrap_servers
        topic = f"poison-{uuid.uuid4().hex[:8]}"
        dlq = f"{topic}.dlq"
        create_topics(bootstrap, [topic, dlq])
        p = Producer({"bootstrap.servers": bootstrap})
        for _kind, key, value in stream:
            p.produce(topic, key=key, value=value)
        assert p.flush(30) == 0

        data = pipeline_config.model_dump(mode="json", exclude_none=True)
        data["kafka"]["group.id"] = f"g-{topic}"
        data["lakehouse"] = {**data["lakehouse"], "database": "drill_poison"}
        data["sources"] = [{"name": "poison", "topics": [topic], "format": "debezium",
                            "lanes": 4, "max_retries": 1, "dead_letter_topic": dlq,
                            "tables": [{"source": TABLE, "replica": "items"}]}]
        pipeline = parse_config(data)
        recorder = Recorder()
        registry = HandlerRegistry()
        registry.register(r"poison\.items", recorder, name="recorder")
        try:
            summary, _sink = consume_partition(pipeline, dict(pipeline.kafka), f"{topic}:0",
                                               ChangelogRunConfig(), registry,
                                               group=pipeline.kafka["group.id"])
        except Exception:
            totals.update(crashes=1)
            raise

        bad = {o for o, (k, _, _) in enumerate(stream) if k.startswith("bad:")}
        poison = {o for o, (k, _, _) in enumerate(stream) if k == "poison"}
        good = {o for o, (k, _, _) in enumerate(stream) if k == "good"}
        letters = _read_all(bootstrap, dlq, len(bad) + len(poison))
        headers = [dict(m.headers()) for m in letters]
        coords = Counter((h["binlake.topic"].decode(), int(h["binlake.partition"]),
                          int(h["binlake.offset"]), h["binlake.stage"].decode())
                         for h in headers)
        expected = Counter({(topic, 0, o, "decode"): 1 for o in bad}
                           | {(topic, 0, o, "handler"): 1 for o in poison})
        changelog = changelog_frame(spark, pipeline).where(f"topic = '{topic}'")
        diff = coordinate_diff(Counter({(topic, 0, o, 0): 1 for o in good | poison}),
                               changelog_coordinates(changelog))
        originals = {int(dict(m.headers())["binlake.offset"]): m.value() for m in letters
                     if dict(m.headers())["binlake.stage"] == b"decode"}

        totals.update(examples=1, messages=len(stream), malformed=len(bad),
                      poison=len(poison), valid=len(good),
                      tombstones=sum(1 for k, _, _ in stream if k == "tombstone"),
                      dead_lettered=summary.dead_lettered, dlq_records=len(letters),
                      dlq_wrong_coordinates=sum((coords - expected).values()),
                      dlq_missing=sum((expected - coords).values()),
                      changelog_missing=diff["missing"],
                      changelog_duplicates=diff["duplicates"],
                      changelog_unexpected=diff["unexpected"],
                      handled_twice=sum(1 for n in recorder.seen.values() if n > 1),
                      handled_missing=len(good - set(recorder.seen)))
        kinds.update(k for k, _, _ in stream)

        assert summary.committed_offset == len(stream)
        assert summary.dead_lettered == len(bad) + len(poison)
        assert coords == expected, (coords - expected, expected - coords)
        assert all(originals[o] == stream[o][2] for o in bad)
        assert diff == {"missing": 0, "unexpected": 0, "duplicates": 0}, diff
        assert set(recorder.seen) == good and max(recorder.seen.values(), default=1) == 1

    try:
        one_stream()
    finally:
        drills.record(name, {"crashes": 0, **totals, "kinds": dict(kinds),
                             "seconds": round(time.monotonic() - began, 1)})
        print(f"\n{name}: {dict(totals)}")


def test_malformed_and_poison_messages_are_dead_lettered(pipeline_config, spark) -> None:
    _poison_drill(pipeline_config, spark, 2, "poison_fuzz")


@pytest.mark.long
def test_malformed_and_poison_messages_are_dead_lettered_long(pipeline_config, spark) -> None:
    _poison_drill(pipeline_config, spark,
                  int(os.environ.get("BINLAKE_DRILL_EXAMPLES") or 20), "poison_fuzz_long")
