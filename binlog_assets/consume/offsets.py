"""Per-partition offset tracking: the committable offset and the commit metadata.

Events finish out of order (many lanes), but a Kafka commit is one number: the next
offset to read. `OffsetTracker` turns out-of-order completions into that number without
ever passing an offset that is not done (invariant 2): `committable()` is the lowest
offset received and not yet done, or the last received offset + 1 when nothing is
pending. Offsets that are never received (transaction markers, compacted records) are
simply absent, so they never block. What finished beyond the committable offset is not
lost either: `encode_metadata()` packs it into the commit's metadata string, and the
next run decodes it with `decode_metadata()` and skips those offsets. That includes the
committable offset itself when a previous run finished it and this run has not polled it
yet: the next run starts by reading that very offset.
"""

from __future__ import annotations

import base64
import logging
import threading
import zlib
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from operator import lt

from sortedcontainers import SortedSet

log = logging.getLogger(__name__)

METADATA_VERSION = "o1"
# o1 whose payload starts at the base itself, written only when the base is done: other
# commits stay readable by versions that know only o1 (which ignore o2, redoing work).
METADATA_VERSION_FROM_BASE = "o2"
DEFAULT_METADATA_MAX_BYTES = 4000  # Kafka's offset.metadata.max.bytes is 4096 by default

# Payload kinds: run-lengths suit sparse or clustered completions, a bitset dense noise.
_KIND_RUNS = "r"
_KIND_BITS = "b"
# Metadata describes at most this many offsets past its base: a larger span would decode
# into a set too big to hold, so encoding stops there and decoding refuses more.
_MAX_SPAN = 1 << 22

# Set-bit positions of every byte value, for decoding a bitset a byte at a time.
_BITS_OF_BYTE = tuple(tuple(i for i in range(8) if b >> i & 1) for b in range(256))


class OffsetTracker:
    """Received and done offsets of one topic-partition; thread-safe.

    `start` is the checkpoint the run resumes at; `already_done` holds offsets at or past
    it that a previous run finished (decoded from the commit metadata). The run skips
    those (`is_already_done`); whether it also calls `received` for them does not matter,
    they count as done either way.

    Receives arrive in poll order, so pending offsets live in a deque (append at the
    tail, pop at the head) and completions in a set; the head advances while it is done.
    Both ends are O(1), which a sorted structure cannot beat for monotonic input. The
    previous run's offsets, which need range queries when re-encoded, are a `SortedSet`.
    """

    def __init__(self, start: int, already_done: Iterable[int] = ()) -> None:
        if not isinstance(start, int) or start < 0:
            raise ValueError(f"OffsetTracker start must be an offset >= 0, got {start!r}")
        self._lock = threading.Lock()
        self._pending: deque[int] = deque()  # received, not yet passed by the head
        self._done: set[int] = set()  # done offsets still in _pending (never its head)
        self._last = start - 1  # last received offset
        self._prior = SortedSet(o for o in already_done if o >= start)

    def is_already_done(self, offset: int) -> bool:
        """True when a previous run finished `offset`: the run must not handle it again."""
        return offset in self._prior

    def has_prior(self) -> bool:
        """True while offsets finished by a previous run may still be ahead: only then
        does `is_already_done` need asking (the poll thread asks once per batch)."""
        return bool(self._prior)

    def received(self, offset: int) -> None:
        self.received_many((offset,))

    def received_many(self, offsets: Sequence[int]) -> None:
        """Offsets as polled: strictly increasing, gaps allowed. Call before dispatching."""
        if not offsets:
            return
        with self._lock:
            if offsets[0] <= self._last or not all(map(lt, offsets, islice(offsets, 1, None))):
                raise ValueError(
                    f"received offsets must be strictly increasing past {self._last}, "
                    f"got {offsets[0]}..{offsets[-1]} ({len(offsets)} offsets)"
                )
            self._pending.extend(offsets)
            self._last = offsets[-1]
            if self._prior:
                self._mark_prior(offsets)

    def skip_to(self, position: int) -> None:
        """The consumer's position reached `position`: offsets below it that were never
        received never will be (transaction markers, aborted or compacted records), so
        with nothing pending the committable offset moves up to `position`."""
        with self._lock:
            if position - 1 > self._last:
                self._last = position - 1

    def done(self, offset: int) -> None:
        self.done_many((offset,))

    def done_many(self, offsets: Sequence[int]) -> None:
        """Mark received offsets done, in any order; repeats are harmless."""
        if not offsets:
            return
        with self._lock:
            if max(offsets) > self._last:
                raise ValueError(
                    f"offset {max(offsets)} marked done but never received "
                    f"(last received {self._last})"
                )
            pending = self._pending
            head = pending[0] if pending else self._last + 1
            if min(offsets) < head:
                # Already passed: adding them back would leave stale entries in the set.
                offsets = [o for o in offsets if o >= head]
            self._done.update(offsets)
            self._advance()

    def committable(self) -> int:
        """The offset to commit: every received offset below it is done."""
        with self._lock:
            return self._pending[0] if self._pending else self._last + 1

    def pending_count(self) -> int:
        """Received offsets not yet done."""
        with self._lock:
            return len(self._pending) - len(self._done)

    def commit_point(self, max_bytes: int = DEFAULT_METADATA_MAX_BYTES) -> tuple[int, str]:
        """`committable()` and `encode_metadata()` of one moment: read apart, a completion
        in between would pair an offset with metadata for another (which the next run
        ignores, redoing finished work)."""
        with self._lock:
            base, done = self._base_and_done()
        return base, _encode(base, done, max_bytes)

    def encode_metadata(self, max_bytes: int = DEFAULT_METADATA_MAX_BYTES) -> str:
        """Offsets done beyond `committable()`, packed into at most `max_bytes` characters.

        Format `o1:<base>:<end>:<kind>:<payload>`: `base` is the committable offset the
        string belongs to, and the payload (zlib, then url-safe base64) lists exactly the
        done offsets in (base, end). When `base` itself is done (a previous run finished
        it, this run has not polled it yet) the version is `o2` and the payload lists
        those in [base, end). When everything does not fit, `end` is lowered to the
        longest prefix that fits: offsets past it are left out, so a restart redoes them
        rather than skipping anything undone. "" means nothing is done at or past `base`.
        """
        with self._lock:
            base, done = self._base_and_done()
        return _encode(base, done, max_bytes)

    def _base_and_done(self) -> tuple[int, list[int]]:
        """The committable offset and the done offsets at or past it (called with the
        lock held). Only a previous run's offset not polled yet can equal the base: it
        stays in `_prior`, or the run would hand it out again when it arrives."""
        base = self._pending[0] if self._pending else self._last + 1
        if self._prior:
            del self._prior[: self._prior.bisect_left(base)]
        return base, sorted(o for o in self._done.union(self._prior) if o >= base)

    @staticmethod
    def decode_metadata(committed: int, metadata: str | None) -> set[int]:
        """Offsets at or past `committed` that the metadata says are done; empty when
        unusable.

        Metadata written for another offset (the checkpoint was moved by hand, or another
        tool committed) is ignored: trusting it could skip work. Garbage is ignored too,
        with a warning, never an exception: losing it only means redoing some events.
        """
        if not metadata:
            return set()
        try:
            base, end, done = _decode(metadata)
        except Exception as exc:  # untrusted text: any failure only means redoing work
            log.warning("ignoring unreadable offset commit metadata %.80r: %s", metadata, exc)
            return set()
        if base != committed:
            log.warning(
                "ignoring offset commit metadata written for offset %d: committed offset is %d",
                base,
                committed,
            )
            return set()
        return done

    def _mark_prior(self, offsets: Sequence[int]) -> None:
        hits = list(self._prior.irange(offsets[0], offsets[-1]))
        if hits:
            polled = set(offsets)
            self._done.update(o for o in hits if o in polled)
            self._advance()

    def _advance(self) -> None:
        pending, done = self._pending, self._done
        while pending and pending[0] in done:
            done.remove(pending.popleft())
        if not pending:
            # Whatever is left was never received (a gap reported done): nothing to keep.
            done.clear()


def _encode(base: int, done: list[int], max_bytes: int) -> str:
    """`done`: sorted offsets >= base. Picks the smaller raw form, then the longest prefix."""
    if done and done[0] == base:
        version, first = METADATA_VERSION_FROM_BASE, base
    else:
        version, first = METADATA_VERSION, base + 1
    done = done[: bisect_left(done, first + _MAX_SPAN)]
    if not done:
        return ""
    starts, ends = _runs(done)
    runs_raw, bounds = _runs_payload(first, starts, ends)
    span_bytes = (done[-1] - first + 8) // 8
    if span_bytes < len(runs_raw):
        bits = _bits_payload(first, done, span_bytes)

        def bits_prefix(n: int) -> str:
            end = min(first + 8 * n, done[-1] + 1)
            return _format(version, base, end, _KIND_BITS, bits[:n])

        return _longest_fit(bits_prefix, len(bits), max_bytes)

    def runs_prefix(k: int) -> str:
        return _format(version, base, ends[k - 1], _KIND_RUNS, runs_raw[: bounds[k]])

    return _longest_fit(runs_prefix, len(starts), max_bytes)


def _longest_fit(encode_prefix: Callable[[int], str], size: int, max_bytes: int) -> str:
    """Largest n in 1..size whose encoding fits; "" when none does (nothing is claimed)."""
    full = encode_prefix(size)
    if len(full) <= max_bytes:
        return full
    best, lo, hi = "", 1, size - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = encode_prefix(mid)
        if len(candidate) <= max_bytes:
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    return best


def _format(version: str, base: int, end: int, kind: str, raw: bytes | bytearray) -> str:
    payload = base64.urlsafe_b64encode(zlib.compress(raw, 9)).rstrip(b"=").decode("ascii")
    return f"{version}:{base}:{end}:{kind}:{payload}"


def _runs(done: list[int]) -> tuple[list[int], list[int]]:
    """Sorted offsets -> half-open runs [start, end)."""
    starts = [done[0]]
    ends = []
    prev = done[0]
    for o in islice(done, 1, None):
        if o != prev + 1:
            ends.append(prev + 1)
            starts.append(o)
        prev = o
    ends.append(prev + 1)
    return starts, ends


def _runs_payload(first: int, starts: list[int], ends: list[int]) -> tuple[bytearray, list[int]]:
    """Varint (gap, length) pairs from `first`, and the byte length after each run."""
    raw = bytearray()
    bounds = [0]
    cursor = first
    for start, end in zip(starts, ends, strict=True):
        _put_varint(raw, start - cursor)
        _put_varint(raw, end - start)
        bounds.append(len(raw))
        cursor = end
    return raw, bounds


def _bits_payload(first: int, done: list[int], size: int) -> bytearray:
    """Bit i (little-endian within each byte) set when offset first + i is done."""
    bits = bytearray(size)
    for o in done:
        i = o - first
        bits[i >> 3] |= 1 << (i & 7)
    return bits


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _decode(metadata: str) -> tuple[int, int, set[int]]:
    parts = metadata.split(":")
    if len(parts) != 5 or parts[0] not in (METADATA_VERSION, METADATA_VERSION_FROM_BASE):
        raise ValueError(f"not {METADATA_VERSION} or {METADATA_VERSION_FROM_BASE} offset metadata")
    base, end, kind, payload = int(parts[1]), int(parts[2]), parts[3], parts[4]
    first = base if parts[0] == METADATA_VERSION_FROM_BASE else base + 1
    if not 0 <= base < end or end - first > _MAX_SPAN:
        raise ValueError(f"bad range {base}..{end}")
    packed = base64.b64decode(payload + "=" * (-len(payload) % 4), altchars=b"-_", validate=True)
    raw = zlib.decompress(packed)
    if kind == _KIND_RUNS:
        done = _decode_runs(first, end, raw)
    elif kind == _KIND_BITS:
        done = _decode_bits(first, end, raw)
    else:
        raise ValueError(f"unknown payload kind {kind!r}")
    return base, end, done


def _decode_runs(first: int, end: int, raw: bytes) -> set[int]:
    values = _read_varints(raw)
    if len(values) % 2:
        raise ValueError("odd number of run-length values")
    done: set[int] = set()
    cursor = first
    for gap, length in zip(values[::2], values[1::2], strict=True):
        start = cursor + gap
        cursor = start + length
        if length < 1 or cursor > end:
            raise ValueError(f"run {start}+{length} outside {first}..{end}")
        done.update(range(start, cursor))
    return done


def _decode_bits(first: int, end: int, raw: bytes) -> set[int]:
    done: set[int] = set()
    for index, byte in enumerate(raw):
        if byte:
            at = first + 8 * index
            done.update(at + bit for bit in _BITS_OF_BYTE[byte])
    if done and max(done) >= end:
        raise ValueError(f"bitset reaches past {end}")
    return done


def _read_varints(raw: bytes) -> list[int]:
    values = []
    value = shift = 0
    for byte in raw:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")
        else:
            values.append(value)
            value = shift = 0
    if shift:
        raise ValueError("truncated varint")
    return values
