"""OffsetTracker: the committable offset never passes an undone offset (invariant 2), gaps
never block, and the commit metadata round-trips within its byte budget."""

from __future__ import annotations

import logging
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from binlog_assets.consume.offsets import OffsetTracker


def metadata_end(metadata: str) -> int:
    return int(metadata.split(":")[2])


def test_nothing_received_commits_the_start() -> None:
    tracker = OffsetTracker(42)
    assert tracker.committable() == 42
    assert tracker.pending_count() == 0
    assert tracker.encode_metadata() == ""


def test_gaps_never_block() -> None:
    tracker = OffsetTracker(0)
    tracker.received_many([0, 1, 5, 9])  # 2-4 and 6-8: markers or compacted away
    tracker.done_many([9, 5, 1, 0])
    assert tracker.committable() == 10
    assert tracker.pending_count() == 0


def test_committable_is_the_lowest_undone_offset() -> None:
    tracker = OffsetTracker(100)
    tracker.received_many(range(100, 110))
    tracker.done_many([105, 106, 107, 108, 109, 101])
    assert tracker.committable() == 100
    assert tracker.pending_count() == 4
    tracker.done(100)
    assert tracker.committable() == 102
    tracker.done_many([103, 102, 104])
    assert tracker.committable() == 110


def test_repeated_done_is_harmless() -> None:
    tracker = OffsetTracker(0)
    tracker.received_many([0, 1, 2])
    tracker.done_many([0, 0, 2])
    tracker.done_many([0, 2])
    assert tracker.committable() == 1
    assert tracker.pending_count() == 1


def test_a_gap_reported_done_never_moves_the_commit_or_breaks_the_metadata() -> None:
    tracker = OffsetTracker(0)
    tracker.received_many([5, 7, 8])
    tracker.done_many([6, 8])  # 6 was never received
    assert tracker.committable() == 5
    assert OffsetTracker.decode_metadata(5, tracker.encode_metadata()) == {6, 8}
    tracker.done_many([5, 7])
    assert tracker.committable() == 9
    assert tracker.encode_metadata() == ""


def test_received_offsets_must_increase() -> None:
    tracker = OffsetTracker(0)
    tracker.received_many([0, 1])
    with pytest.raises(ValueError, match="strictly increasing"):
        tracker.received(1)
    with pytest.raises(ValueError, match="strictly increasing"):
        tracker.received_many([5, 4])
    with pytest.raises(ValueError, match="strictly increasing"):
        OffsetTracker(10).received(9)


def test_done_before_received_is_an_error() -> None:
    tracker = OffsetTracker(0)
    tracker.received(0)
    with pytest.raises(ValueError, match="never received"):
        tracker.done(1)


def test_start_must_be_an_offset() -> None:
    with pytest.raises(ValueError, match="start"):
        OffsetTracker(-1)


def test_already_done_offsets_are_skipped_and_count_as_done() -> None:
    tracker = OffsetTracker(10, already_done=[3, 12, 13])  # 3 is below the checkpoint
    assert not tracker.is_already_done(3)
    assert tracker.is_already_done(12) and tracker.is_already_done(13)
    assert not tracker.is_already_done(11)
    # The run may report a skipped offset as received, or leave it out entirely.
    tracker.received_many([10, 11, 12])
    tracker.received_many([14])
    tracker.done_many([10, 14])
    assert tracker.committable() == 11
    assert OffsetTracker.decode_metadata(11, tracker.encode_metadata()) == {12, 13, 14}
    tracker.done(11)
    assert tracker.committable() == 15


def test_already_done_survive_a_run_that_never_reaches_them() -> None:
    tracker = OffsetTracker(0, already_done=range(50, 60))
    tracker.received_many([0, 1])
    tracker.done(1)
    assert OffsetTracker.decode_metadata(0, tracker.encode_metadata()) == {1, *range(50, 60)}


@st.composite
def tracker_scripts(draw: st.DrawFn) -> tuple[int, list[int], list[list[int]], list[int]]:
    """A start, offsets with random gaps, poll batches and a random completion order."""
    start = draw(st.integers(0, 1000))
    gaps = draw(st.lists(st.integers(1, 6), min_size=1, max_size=120))
    offsets, at = [], start
    for gap in gaps:
        at += gap - 1
        offsets.append(at)
        at += 1
    cuts = sorted(draw(st.sets(st.integers(1, len(offsets)), max_size=8)) | {len(offsets)})
    batches = [offsets[a:b] for a, b in zip([0, *cuts], cuts, strict=False) if a < b]
    order = draw(st.permutations(range(len(offsets))))
    return start, offsets, batches, list(order)


@given(script=tracker_scripts(), data=st.data())
@settings(max_examples=200, deadline=None)
def test_committable_never_passes_an_undone_offset(script, data: st.DataObject) -> None:
    """Invariant 2 against a model, at every step of a random interleaving."""
    start, offsets, batches, order = script
    tracker = OffsetTracker(start)
    received: list[int] = []
    done: set[int] = set()
    to_finish = [offsets[i] for i in order]
    while batches or to_finish:
        finishable = [o for o in to_finish if o in set(received)]
        if batches and (not finishable or data.draw(st.booleans())):
            batch = batches.pop(0)
            tracker.received_many(batch)
            received += batch
        else:
            n = data.draw(st.integers(1, len(finishable)))
            chunk = finishable[:n]
            tracker.done_many(chunk)
            done.update(chunk)
            to_finish = [o for o in to_finish if o not in done]
        committable = tracker.committable()
        undone = [o for o in received if o not in done]
        expected = min(undone) if undone else (received[-1] + 1 if received else start)
        assert committable == expected
        assert all(o in done for o in received if o < committable)
        assert tracker.pending_count() == len(undone)
        metadata = tracker.encode_metadata(max_bytes=data.draw(st.sampled_from([60, 4000])))
        claimed = OffsetTracker.decode_metadata(committable, metadata)
        assert claimed <= done  # never claims an undone offset
        end = metadata_end(metadata) if metadata else committable
        assert claimed == {o for o in done if committable < o < end}


@given(
    done=st.sets(st.integers(1, 5000), max_size=600),
    max_bytes=st.integers(0, 400),
)
@settings(max_examples=200, deadline=None)
def test_metadata_fits_its_budget_and_is_exact_below_its_end(done: set[int], max_bytes) -> None:
    tracker = OffsetTracker(0)
    tracker.received_many(range(5001))
    tracker.done_many(sorted(done))
    base = tracker.committable()
    metadata = tracker.encode_metadata(max_bytes=max_bytes)
    assert len(metadata.encode()) <= max_bytes
    claimed = OffsetTracker.decode_metadata(base, metadata)
    end = metadata_end(metadata) if metadata else base
    assert claimed == {o for o in done if base < o < end}


@given(
    prior=st.sets(st.integers(1, 3000), min_size=1, max_size=400),
    max_bytes=st.integers(0, 400),
)
@settings(max_examples=200, deadline=None)
def test_metadata_naming_its_base_fits_its_budget_and_is_exact_below_its_end(
        prior: set[int], max_bytes: int) -> None:
    """The base is a previous run's done offset not polled yet: the metadata (o2) starts
    at the base itself, and any prefix that fits still names it."""
    base = min(prior)
    tracker = OffsetTracker(0, prior)
    tracker.received_many(range(base))
    tracker.done_many(range(base))
    committed, metadata = tracker.commit_point(max_bytes=max_bytes)
    assert committed == base
    assert len(metadata.encode()) <= max_bytes
    claimed = OffsetTracker.decode_metadata(base, metadata)
    end = metadata_end(metadata) if metadata else base
    assert claimed == {o for o in prior if o < end}
    assert not metadata or (metadata.startswith(f"o2:{base}:") and base in claimed)


def _worst_case(done: list[int]) -> tuple[str, set[int], int]:
    tracker = OffsetTracker(0)
    tracker.received_many(range(done[-1] + 1))
    tracker.done_many(done)
    assert tracker.committable() == 0  # offset 0 is stuck: everything else is "beyond"
    metadata = tracker.encode_metadata(max_bytes=4000)
    assert len(metadata) <= 4000
    return metadata, OffsetTracker.decode_metadata(0, metadata), metadata_end(metadata)


def test_metadata_one_done_offset_a_million_past_the_commit() -> None:
    _, claimed, _ = _worst_case([1_000_000])
    assert claimed == {1_000_000}


def test_metadata_a_million_done_in_a_row() -> None:
    _, claimed, _ = _worst_case(list(range(1, 1_000_001)))
    assert claimed == set(range(1, 1_000_001))


def test_metadata_every_other_offset_of_a_million() -> None:
    done = list(range(1, 1_000_001, 2))
    _, claimed, _ = _worst_case(done)
    assert claimed == set(done)


def test_metadata_random_million_degrades_to_an_exact_prefix() -> None:
    rng = random.Random(7)
    done = [o for o in range(1, 1_000_001) if rng.random() < 0.5]
    metadata, claimed, end = _worst_case(done)
    assert 1 < end < 1_000_001  # incompressible: only a prefix fits
    assert claimed == {o for o in done if o < end}
    assert len(claimed) > 10_000


def test_metadata_too_small_a_budget_claims_nothing() -> None:
    tracker = OffsetTracker(0)
    tracker.received_many(range(10))
    tracker.done_many([3, 5, 7])
    assert tracker.encode_metadata(max_bytes=5) == ""


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        "",
        "garbage",
        "o1:0:10:r:!!!",  # not base64
        "o1:0:10:r:AAAA",  # not zlib
        "o1:0:10:z:eNoDAAAAAAE",  # unknown payload kind
        "o9:0:10:r:eNoDAAAAAAE",  # unknown version
        "o1:0:10:r:eNpjAAAAAQAB",  # an odd number of varints
        "o1:0:3:r:eNpjYAUAAAcABg",  # a run reaching past the stated end
        "o1:9:3:r:eNoDAAAAAAE",  # end before base
    ],
)
def test_decode_tolerates_missing_or_garbage_metadata(metadata, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert OffsetTracker.decode_metadata(0, metadata) == set()
    if metadata:
        assert "ignoring" in caplog.text


@given(text=st.text() | st.from_regex(r"o[12]:0:[0-9]{1,4}:[rb]:[A-Za-z0-9_-]{0,40}"))
@settings(max_examples=300, deadline=None)
def test_decode_never_raises(text: str) -> None:
    claimed = OffsetTracker.decode_metadata(0, text)
    assert isinstance(claimed, set)
    assert all(o > 0 or text.startswith("o2:") for o in claimed)


def test_decode_ignores_metadata_written_for_another_offset(caplog) -> None:
    tracker = OffsetTracker(5)
    tracker.received_many([5, 6, 7])
    tracker.done(7)
    metadata = tracker.encode_metadata()
    assert OffsetTracker.decode_metadata(5, metadata) == {7}
    with caplog.at_level(logging.WARNING):
        assert OffsetTracker.decode_metadata(6, metadata) == set()
    assert "written for offset 5" in caplog.text


def test_a_million_offsets_in_poll_batches_is_fast() -> None:
    tracker = OffsetTracker(0)
    rng = random.Random(1)
    began = time.perf_counter()
    for start in range(0, 1_000_000, 1000):
        batch = list(range(start, start + 1000))
        tracker.received_many(batch)
        rng.shuffle(batch)
        tracker.done_many(batch)
    assert tracker.committable() == 1_000_000
    # About 0.2 s here; the bound only catches an accidental quadratic.
    assert time.perf_counter() - began < 5


def test_skip_to_passes_never_delivered_offsets_but_not_pending_ones() -> None:
    t = OffsetTracker(0)
    t.received_many([0, 1, 2])
    t.done_many([0, 1, 2])
    t.skip_to(5)  # 3 and 4 were a commit marker and an aborted record
    assert t.committable() == 5
    t.received_many([5, 6])
    t.done(6)
    t.skip_to(9)
    assert t.committable() == 5  # 5 is pending: never passed
    t.done(5)
    assert t.committable() == 9


def test_a_prior_done_offset_equal_to_the_commit_base_is_still_skipped() -> None:
    """A commit point taken when the base is a previous run's done offset,
    not yet polled, must not forget it (the run would hand it to the handlers again)."""
    t = OffsetTracker(100, {102})
    t.received_many([100, 101])
    t.done_many([100, 101])
    t.commit_point()
    assert t.is_already_done(102)
    t.received_many([102])
    assert t.committable() == 103


def test_a_commit_at_a_prior_done_offset_carries_it_to_the_next_run() -> None:
    """The same commit, restarted from: its metadata must name the base itself as done,
    since the next run starts by reading that very offset."""
    t = OffsetTracker(100, {102, 104})
    t.received_many([100, 101])
    t.done_many([100, 101])
    base, metadata = t.commit_point()
    assert base == 102
    assert OffsetTracker.decode_metadata(base, metadata) == {102, 104}
    again = OffsetTracker(base, OffsetTracker.decode_metadata(base, metadata))
    assert again.is_already_done(102) and again.is_already_done(104)
    assert not again.is_already_done(103)


def _commit_point(tracker: OffsetTracker, offsets: list[int], finished: set[int]
                  ) -> tuple[int, str, frozenset[int]]:
    """A commit point, checked: nothing undone below it, and its metadata names exactly
    what is done at or past it (the base included)."""
    base, metadata = tracker.commit_point()
    assert all(o in finished for o in offsets if o < base)
    assert OffsetTracker.decode_metadata(base, metadata) == {o for o in finished if o >= base}
    return base, metadata, frozenset(finished)


@st.composite
def partitions(draw: st.DrawFn) -> tuple[int, list[int]]:
    """A partition's end offset and the offsets it delivers (the rest are markers or
    aborted records, never delivered)."""
    end = draw(st.integers(1, 24))
    present = draw(st.lists(st.booleans(), min_size=end, max_size=end))
    return end, [o for o, p in enumerate(present) if p or o % 3 == 0]


@given(partition=partitions(), data=st.data())
@settings(max_examples=150, deadline=None)
def test_no_offset_finished_by_an_earlier_run_is_handled_again(partition, data) -> None:
    """Runs in a row, each from the last commit (its offset and its done-beyond metadata):
    slices polled in order, completions in any order, commit points at any moment, a
    run that stops (with its final commit) or crashes (without) anywhere. No offset an
    earlier run finished, as far as the commit resumed from knows, is handed out again;
    nothing undone is ever skipped or committed past; a last whole run finishes all."""
    end, offsets = partition
    # The commit resumed from: offset, metadata, and what was finished when it was taken.
    commit: tuple[int, str, frozenset[int]] = (0, "", frozenset())
    runs = data.draw(st.integers(1, 6), label="runs before the last")
    for run in range(runs + 1):
        last = run == runs
        start, metadata, inherited = commit
        tracker = OffsetTracker(start, OffsetTracker.decode_metadata(start, metadata))
        ahead = [o for o in offsets if o >= start]
        finished = set(inherited)  # done as far as this run's commits can know
        in_flight: list[int] = []
        while ahead or in_flight:
            # Only steps that can act, progress first: the smallest example is a short one.
            steps = ["poll"] * bool(ahead) + ["finish"] * bool(in_flight) + ["commit"] * 2
            step = data.draw(st.sampled_from(steps if last else [*steps, "stop"]))
            if step == "poll":
                n = data.draw(st.integers(1, 3))
                batch, ahead = ahead[:n], ahead[n:]
                # As the poll thread does: ask per record, then report the whole slice.
                asked = tracker.has_prior()
                skipped = [o for o in batch if asked and tracker.is_already_done(o)]
                for o in batch:
                    assert (o in skipped) == (o in inherited), (o, run)
                tracker.received_many(batch)
                tracker.done_many(skipped)
                in_flight += [o for o in batch if o not in skipped]
            elif step == "finish":
                chunk = data.draw(st.lists(st.sampled_from(in_flight), min_size=1, unique=True))
                tracker.done_many(chunk)
                finished.update(chunk)
                in_flight = [o for o in in_flight if o not in finished]
            elif step == "commit":
                commit = _commit_point(tracker, offsets, finished)
            elif step == "stop":
                if data.draw(st.booleans(), label="stop with a final commit, else crash"):
                    commit = _commit_point(tracker, offsets, finished)
                break
            assert all(o in finished for o in offsets if o < tracker.committable())
        else:
            tracker.skip_to(end)  # the run reached the end offset
            commit = _commit_point(tracker, offsets, finished)
    assert commit[0] == end and commit[1] == ""
    assert set(offsets) <= commit[2]
