"""Log compaction: the pure parts of Kafka's log cleaner, on our segment files.

Semantics follow Kafka's ``LogCleaner`` / ``Cleaner`` / ``LogCleanerManager``
(4.x), re-implemented here:

* **Which log, which range** (:func:`cleanable_range`): the first dirty
  offset is the cleaner checkpoint (clamped to the log start); the first
  uncleanable offset is the smallest of the last stable offset, the active
  segment's base offset and, with ``min.compaction.lag.ms`` > 0, the base of
  the first segment holding a record younger than the lag; it is rounded
  down to the base of the segment containing it, so only whole, stable,
  inactive segments are cleaned. The dirty ratio is the bytes of
  ``[first dirty, first uncleanable)`` over those plus the bytes below the
  first dirty offset. A log is cleaned when the ratio exceeds
  ``min.cleanable.dirty.ratio``, or when its oldest dirty batch is older
  than ``max.compaction.lag.ms``.
* **The offset map** (:class:`OffsetMap`, Kafka's ``SkimpyOffsetMap``): key
  digests (16-byte BLAKE2b) to the latest offset, in one ``bytearray`` of
  24-byte slots with linear probing, so its memory is exactly bounded by
  ``log.cleaner.dedupe.buffer.size``; at most ``load factor`` of the slots
  are filled. It is built from the dirty range; if it fills up, the pass
  stops there (the rest is left dirty for the next pass).
* **What survives** (:class:`BatchFilter`, Kafka's ``RecordFilter`` and
  ``CleanedTransactionMetadata``): a keyed record survives if no later
  record has its key (offsets at or beyond the map's latest offset always
  survive); a keyless record never does. A tombstone (null value) survives
  until its batch's delete horizon: the first pass that keeps it stamps the
  batch with ``delete horizon = now + delete.retention.ms`` (attribute bit 6
  and the base timestamp, KIP-534), later passes drop it once the horizon has
  passed. Records of aborted transactions are dropped (from the
  aborted-transaction index). A COMMIT marker goes once no batch of its
  transaction was seen in the pass; an ABORT marker once its transaction's
  batches are gone; either only after its own delete horizon. The batch
  holding a producer's last data offset (or its last marker, when it has
  no data) is kept even if empty (header only) so its sequence and epoch
  survive; so is the last batch of the pass.
* **How batches are rewritten**: a batch that keeps every record and needs
  no horizon is copied as is; otherwise a new batch is built with the same
  base offset, last offset delta, producer id/epoch/base sequence,
  partition leader epoch, transactional and control flags and codec (the
  retained records recompressed with it); each record keeps its offset and
  timestamp. An emptied batch that must stay is a bare 61-byte header
  (no records, uncompressed), as Kafka writes it.

Nothing here knows partitions, producers or coordinators: the caller passes
the last stable offset, the producers' last offsets and the aborted
transactions in. File swapping lives in :mod:`oncelog.storage.log`.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from oncelog.protocol.compression import compress, decompress
from oncelog.protocol.records import (
    COMPRESSION_MASK,
    COMPRESSION_NONE,
    CONTROL_TYPE_ABORT,
    CONTROL_TYPE_COMMIT,
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    TIMESTAMP_LOG_APPEND_TIME,
    BatchHeader,
    update_crc,
)
from oncelog.storage.txn_index import AbortedTxn

DIGEST_SIZE = 16
SLOT_SIZE = DIGEST_SIZE + 8  # digest + offset, as Kafka's SkimpyOffsetMap (MD5 + long)
_EMPTY = bytes(DIGEST_SIZE)
_OFFSET = struct.Struct(">q")
_HEADER = struct.Struct(">qiibIhiqqqhii")


class CleaningAborted(Exception):
    """The pass stopped (broker closing, log deleted or changed under it)."""


# --- the offset map ------------------------------------------------------------------------


def key_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=DIGEST_SIZE).digest()


class OffsetMap:
    """Key digest -> latest offset in a fixed ``bytearray`` (Kafka's SkimpyOffsetMap).

    ``memory`` bytes give ``memory // 24`` slots; :meth:`clear` allocates at
    most that many (fewer when the caller knows fewer records can come), and
    :attr:`full` turns true once ``load_factor`` of them are used.
    """

    def __init__(self, memory: int, load_factor: float = 0.9) -> None:
        self.max_slots = max(memory // SLOT_SIZE, 1)
        self.load_factor = load_factor
        self.slots = 0
        self.capacity = 0
        self.size = 0
        self.latest_offset = -1
        self.lookups = 0
        self.probes = 0
        self._buf = bytearray()

    @property
    def memory(self) -> int:
        """Bytes held by the table now."""
        return len(self._buf)

    def clear(self, expected_entries: int | None = None) -> None:
        slots = self.max_slots
        if expected_entries is not None:
            slots = min(slots, max(int(expected_entries / self.load_factor) + 1, 16))
        self.slots = slots
        self.capacity = max(int(slots * self.load_factor), 1)
        self._buf = bytearray(slots * SLOT_SIZE)
        self.size = 0
        self.latest_offset = -1

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    def _slot(self, digest: bytes) -> int:
        """Index of the slot holding ``digest`` or of the empty slot where it goes."""
        buf, n = self._buf, self.slots
        i = int.from_bytes(digest[:8], "big") % n
        self.lookups += 1
        while True:
            pos = i * SLOT_SIZE
            found = buf[pos : pos + DIGEST_SIZE]
            if found == digest or found == _EMPTY:
                return i
            self.probes += 1
            i = i + 1 if i + 1 < n else 0

    def put(self, key: bytes, offset: int) -> None:
        """Map ``key`` to ``offset`` (callers check :attr:`full` first for new keys)."""
        if self.slots == 0:
            self.clear()
        digest = key_digest(key)
        pos = self._slot(digest) * SLOT_SIZE
        if self._buf[pos : pos + DIGEST_SIZE] == _EMPTY:
            if self.size >= self.capacity:
                raise OverflowError("offset map is full")
            self._buf[pos : pos + DIGEST_SIZE] = digest
            self.size += 1
        self._buf[pos + DIGEST_SIZE : pos + SLOT_SIZE] = _OFFSET.pack(offset)
        if offset > self.latest_offset:
            self.latest_offset = offset

    def get(self, key: bytes) -> int:
        """The offset stored for ``key``, -1 if none."""
        if self.slots == 0:
            return -1
        digest = key_digest(key)
        pos = self._slot(digest) * SLOT_SIZE
        if self._buf[pos : pos + DIGEST_SIZE] == _EMPTY:
            return -1
        return _OFFSET.unpack_from(self._buf, pos + DIGEST_SIZE)[0]

    def update_latest(self, offset: int) -> None:
        if offset > self.latest_offset:
            self.latest_offset = offset

    def utilization(self) -> float:
        return self.size / self.slots if self.slots else 0.0


# --- I/O rate limit --------------------------------------------------------------------------


class Throttler:
    """Bounds the cleaner's I/O to ``rate`` bytes/s (Kafka's Throttler: measured
    over ~300 ms windows, sleeping off any excess; here also a burst that gets more
    than a window ahead, so that short passes are bounded too)."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        window_s: float = 0.3,
    ) -> None:
        self.rate = rate
        self.clock = clock
        self.sleep = sleep
        self.window_s = window_s
        self._start = clock()
        self._observed = 0.0
        self.slept_s = 0.0

    def maybe_throttle(self, nbytes: int) -> None:
        if self.rate <= 0 or self.rate >= 1e300:
            return
        self._observed += nbytes
        now = self.clock()
        elapsed = now - self._start
        ahead = self._observed / self.rate - elapsed
        # measured per window; a burst more than one window ahead is paused at once
        if ahead > 0 and (elapsed >= self.window_s or ahead > self.window_s):
            self.sleep(ahead)
            self.slept_s += ahead
            now = self.clock()
            elapsed = self.window_s
        if elapsed >= self.window_s:
            self._start = now
            self._observed = 0.0


# --- stats -------------------------------------------------------------------------------------


@dataclass(slots=True)
class CleanerStats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    map_records: int = 0
    map_bytes: int = 0
    invalid_records: int = 0
    groups: int = 0
    start: float = field(default_factory=time.monotonic)
    end: float = 0.0
    # seconds spent in each phase of the heavy part (the cleaner process)
    map_s: float = 0.0  # reading the dirty range into the offset map
    copy_s: float = 0.0  # filtering and writing the groups
    sync_s: float = 0.0  # making the written files durable
    throttled_s: float = 0.0  # of those, sleeping for log.cleaner.io.max.bytes.per.second

    @property
    def records_removed(self) -> int:
        return self.records_read - self.records_kept

    @property
    def elapsed_s(self) -> float:
        return (self.end or time.monotonic()) - self.start


# --- records ------------------------------------------------------------------------------------


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    shift, v = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return (v >> 1) ^ -(v & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _put_varint(out: bytearray, n: int) -> None:
    v = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


@dataclass(slots=True)
class RawRecord:
    """One record of a batch, located in the batch's uncompressed records section."""

    offset: int
    timestamp: int
    key: bytes | None
    has_value: bool
    start: int  # where its length varint begins
    after_offset: int  # where its key length begins (after attributes, timestamp and offset deltas)
    end: int
    attributes: int

    def encode(self, body: bytes | memoryview, base_offset: int, base_timestamp: int) -> bytes:
        """The record with its deltas relative to ``base_offset``/``base_timestamp``."""
        inner = bytearray((self.attributes,))
        _put_varint(inner, self.timestamp - base_timestamp)
        _put_varint(inner, self.offset - base_offset)
        inner += body[self.after_offset : self.end]
        out = bytearray()
        _put_varint(out, len(inner))
        return bytes(out + inner)


def batch_records(hdr: BatchHeader, batch: bytes | memoryview) -> tuple[bytes | memoryview, list[RawRecord]]:
    """The uncompressed records section of ``batch`` and its records (offsets and
    timestamps absolute). Raises ValueError or InvalidRecordError on a bad batch."""
    raw = memoryview(batch)[HEADER_SIZE : hdr.size]
    body: bytes | memoryview = raw if hdr.compression == COMPRESSION_NONE else decompress(hdr.compression, raw)
    records = []
    p = 0
    log_append = hdr.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    for _ in range(hdr.records_count):
        start = p
        length, p = _varint(body, p)
        end = p + length
        if length < 0 or end > len(body):
            raise ValueError("record runs past the end of its batch")
        attributes = body[p]
        ts_delta, p = _varint(body, p + 1)
        off_delta, p = _varint(body, p)
        after = p
        klen, p = _varint(body, p)
        key = None if klen < 0 else bytes(body[p : p + klen])
        p += max(klen, 0)
        vlen, p = _varint(body, p)
        ts = hdr.max_timestamp if log_append else hdr.base_timestamp + ts_delta
        records.append(RawRecord(hdr.base_offset + off_delta, ts, key, vlen >= 0, start, after, end, attributes))
        p = end
    return body, records


def delete_horizon(hdr: BatchHeader) -> int | None:
    """The batch's delete horizon (KIP-534), None if it has none."""
    return hdr.base_timestamp if hdr.attributes & DELETE_HORIZON_BIT else None


def control_type(hdr: BatchHeader, batch: bytes | memoryview) -> int | None:
    """COMMIT/ABORT of a control batch, None for an empty (already cleaned) one."""
    if hdr.records_count == 0:
        return None
    _body, records = batch_records(hdr, batch)
    key = records[0].key if records else None
    if key is None or len(key) < 4:
        return -1
    return struct.unpack_from(">h", key, 2)[0]


def build_batch(
    hdr: BatchHeader,
    body: bytes | memoryview,
    kept: list[RawRecord],
    horizon: int | None,
) -> bytes:
    """A batch with only ``kept`` (non-empty) of ``hdr``'s records, Kafka's
    ``buildRetainedRecordsInto``: same base offset and last offset delta, codec,
    producer fields and flags; base timestamp = the delete horizon when set."""
    base_ts = horizon if horizon is not None else hdr.base_timestamp
    if base_ts == hdr.base_timestamp:  # deltas unchanged: copy the records byte for byte
        records = b"".join(bytes(body[r.start : r.end]) for r in kept)
    else:
        records = b"".join(r.encode(body, hdr.base_offset, base_ts) for r in kept)
    codec = hdr.compression
    payload = records if codec == COMPRESSION_NONE else compress(codec, records)
    attributes = hdr.attributes
    if horizon is not None:
        attributes |= DELETE_HORIZON_BIT
    if hdr.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
        max_ts = hdr.max_timestamp
    else:
        max_ts = max(r.timestamp for r in kept)
    buf = bytearray(HEADER_SIZE + len(payload))
    _HEADER.pack_into(
        buf, 0, hdr.base_offset, HEADER_SIZE - LOG_OVERHEAD + len(payload), hdr.partition_leader_epoch, MAGIC_V2, 0,
        attributes, hdr.last_offset_delta, base_ts, max_ts, hdr.producer_id, hdr.producer_epoch,
        hdr.base_sequence, len(kept),
    )  # fmt: skip
    buf[HEADER_SIZE:] = payload
    update_crc(buf, 0)
    return bytes(buf)


def empty_batch(hdr: BatchHeader) -> bytes:
    """A header-only batch (Kafka's ``writeEmptyHeader``): no records, no codec, the
    original offsets, producer fields, flags and max timestamp."""
    attributes = hdr.attributes & ~(COMPRESSION_MASK | DELETE_HORIZON_BIT)
    buf = bytearray(HEADER_SIZE)
    _HEADER.pack_into(
        buf, 0, hdr.base_offset, HEADER_SIZE - LOG_OVERHEAD, hdr.partition_leader_epoch, MAGIC_V2, 0, attributes,
        hdr.last_offset_delta, -1, hdr.max_timestamp, hdr.producer_id, hdr.producer_epoch, hdr.base_sequence, 0,
    )  # fmt: skip
    update_crc(buf, 0)
    return bytes(buf)


# --- transactions while cleaning (Kafka's CleanedTransactionMetadata) -----------------------------


class TxnTracker:
    """Follows transactions through a pass: which batches are aborted, which markers may go,
    and which aborted-transaction entries the cleaned segment keeps."""

    def __init__(self) -> None:
        self._aborted: list[tuple[int, int, AbortedTxn]] = []  # heap by first offset
        self._seq = 0
        self.ongoing_committed: set[int] = set()
        self.ongoing_aborted: dict[int, list] = {}  # pid -> [AbortedTxn, last batch offset seen or None]
        self.kept_aborted: list[AbortedTxn] = []  # entries for the cleaned segment's .txnindex

    def add_aborted(self, txns: Iterable[AbortedTxn]) -> None:
        for t in txns:
            heapq.heappush(self._aborted, (t.first_offset, self._seq, t))
            self._seq += 1

    def _consume_up_to(self, offset: int) -> None:
        while self._aborted and self._aborted[0][0] <= offset:
            txn = heapq.heappop(self._aborted)[2]
            self.ongoing_aborted.setdefault(txn.producer_id, [txn, None])

    def on_batch(self, hdr: BatchHeader) -> bool:
        """A data batch; True if it belongs to an aborted transaction (discard it)."""
        self._consume_up_to(hdr.last_offset)
        if not hdr.is_transactional:
            return False
        meta = self.ongoing_aborted.get(hdr.producer_id)
        if meta is not None:
            meta[1] = hdr.last_offset
            return True
        self.ongoing_committed.add(hdr.producer_id)
        return False

    def on_control(self, hdr: BatchHeader, ctype: int | None) -> bool:
        """A control batch; True if the marker may be discarded (its transaction left no batch)."""
        self._consume_up_to(hdr.last_offset)
        if ctype is None:
            return True  # an emptied control batch: already cleaned
        if ctype == CONTROL_TYPE_ABORT:
            meta = self.ongoing_aborted.pop(hdr.producer_id, None)
            if meta is not None and meta[1] is not None:
                self.kept_aborted.append(meta[0])
                return False
            return True
        if ctype == CONTROL_TYPE_COMMIT:
            if hdr.producer_id in self.ongoing_committed:
                self.ongoing_committed.discard(hdr.producer_id)
                return False
            return True
        return False


# --- the filter ------------------------------------------------------------------------------------


@dataclass(slots=True)
class LastRecord:
    """A producer's last data offset (None if its last entry is a marker) and epoch."""

    last_data_offset: int | None
    epoch: int


class BatchFilter:
    """Decides, batch by batch, what a pass writes (Kafka's cleaner ``RecordFilter`` + ``filterTo``)."""

    def __init__(
        self,
        offset_map: OffsetMap,
        now_ms: int,
        delete_retention_ms: int,
        last_records: dict[int, LastRecord],
        round_upper: int,
        txns: TxnTracker,
        stats: CleanerStats,
    ) -> None:
        self.map = offset_map
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.last_records = last_records
        self.round_upper = round_upper
        self.txns = txns
        self.stats = stats

    def _is_last_of_producer(self, hdr: BatchHeader) -> bool:
        last = self.last_records.get(hdr.producer_id)
        if last is None:
            return False
        if last.last_data_offset is not None:
            return hdr.last_offset == last.last_data_offset
        return hdr.is_control and hdr.producer_epoch == last.epoch

    def filter(self, hdr: BatchHeader, batch: bytes | memoryview) -> bytes | memoryview | None:
        """The bytes to write for this batch (itself, a rebuilt batch, a bare header) or None."""
        stats = self.stats
        stats.bytes_read += hdr.size
        horizon = delete_horizon(hdr)
        if hdr.is_control:
            ctype = control_type(hdr, batch)
            can_discard = self.txns.on_control(hdr, ctype)
            discard_records = can_discard and horizon is not None and horizon <= self.now_ms
        else:
            can_discard = self.txns.on_batch(hdr)
            discard_records = can_discard
        marker_for_empty_txn = can_discard and hdr.is_control
        if hdr.producer_id >= 0 and self._is_last_of_producer(hdr):
            retention = "retain_empty"
        elif hdr.next_offset == self.round_upper:
            retention = "retain_empty"  # the round's last batch keeps the last offset known
        elif discard_records:
            retention = "delete"
        else:
            retention = "delete_empty"
        stats.records_read += hdr.records_count
        if retention == "delete":
            return None
        body, records = batch_records(hdr, batch)
        kept: list[RawRecord] = []
        tombstones = False
        for rec in records:
            if self._retain(hdr, rec, discard_records, horizon):
                kept.append(rec)
                tombstones |= not rec.has_value
        out: bytes | memoryview | None = None
        if kept:
            set_horizon = (tombstones or marker_for_empty_txn) and horizon is None
            if len(kept) == len(records) and not set_horizon:
                out = batch
            else:
                new_horizon = self.now_ms + self.delete_retention_ms if set_horizon else horizon
                out = build_batch(hdr, body, kept, new_horizon)
        elif retention == "retain_empty":
            out = empty_batch(hdr)
        stats.records_kept += len(kept)
        if out is not None:
            stats.bytes_written += len(out)
        return out

    def _retain(self, hdr: BatchHeader, rec: RawRecord, discard_records: bool, horizon: int | None) -> bool:
        if discard_records:
            return False
        if hdr.is_control:
            return True
        if rec.offset > self.map.latest_offset:
            return True
        if rec.key is None:
            self.stats.invalid_records += 1
            return False
        latest = rec.offset >= self.map.get(rec.key)
        keep_deletes = horizon is None or self.now_ms < horizon
        return latest and (rec.has_value or keep_deletes)


# --- building the map ---------------------------------------------------------------------------------


BatchSource = Iterator[tuple[BatchHeader, bytes | memoryview]]


def build_offset_map(
    segments: list[tuple[int, int, Callable[[], BatchSource]]],
    start: int,
    offset_map: OffsetMap,
    aborted: Iterable[AbortedTxn],
    stats: CleanerStats,
    check: Callable[[int], None] = lambda _n: None,
) -> bool:
    """Fill ``offset_map`` from the dirty segments ``(base, next_base, batches)`` in
    offset order, from offset ``start``. Aborted and control batches add nothing.
    Returns True if the map filled up (its latest offset then says where it stopped).
    ``check(nbytes)`` is called per batch (throttling, aborting)."""
    txns = TxnTracker()
    txns.add_aborted(aborted)
    for _base, next_base, batches in segments:
        for hdr, batch in batches():
            check(hdr.size)
            stats.map_bytes += hdr.size
            if hdr.is_control:
                txns.on_control(hdr, control_type(hdr, batch))
            elif not txns.on_batch(hdr):
                _body, records = batch_records(hdr, batch)
                for rec in records:
                    if rec.key is not None and rec.offset >= start:
                        if offset_map.full and offset_map.get(rec.key) < 0:
                            return True
                        offset_map.put(rec.key, rec.offset)
                        stats.map_records += 1
            if hdr.last_offset >= start:
                offset_map.update_latest(hdr.last_offset)
        offset_map.update_latest(next_base - 1)  # gaps at the segment's end count as read
    return False


# --- choosing what to clean (Kafka's LogCleanerManager.cleanableOffsets) --------------------------


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base_offset: int
    size: int
    largest_timestamp: int
    first_timestamp: int  # the first batch's max timestamp, -1 if empty


@dataclass(frozen=True, slots=True)
class CleanableRange:
    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    cleanable_bytes: int
    needs_compaction_now: bool

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0

    def should_clean(self, min_cleanable_ratio: float) -> bool:
        if self.cleanable_bytes <= 0:
            return False
        return self.needs_compaction_now or self.ratio > min_cleanable_ratio


def cleanable_range(
    segments: list[SegmentInfo],
    log_start: int,
    checkpoint: int | None,
    last_stable_offset: int,
    now_ms: int,
    min_compaction_lag_ms: int,
    max_compaction_lag_ms: int,
) -> CleanableRange:
    """The range a pass may clean; ``segments`` in offset order, the active one last."""
    active = segments[-1].base_offset
    first_dirty = log_start if checkpoint is None or checkpoint < log_start or checkpoint > active else checkpoint
    limit = min(last_stable_offset, active)
    inactive = segments[:-1]
    dirty = [s for i, s in enumerate(inactive) if _next_base(segments, i) > first_dirty]
    if min_compaction_lag_ms > 0:
        for s in dirty:
            if s.largest_timestamp > now_ms - min_compaction_lag_ms:
                limit = min(limit, s.base_offset)
                break
    # rounded down to the segment holding it: only whole segments are cleaned
    first_uncleanable = max((s.base_offset for s in segments if s.base_offset <= limit), default=segments[0].base_offset)
    clean_bytes = sum(s.size for s in segments if s.base_offset < first_dirty and s.base_offset < active)
    lo = min(first_dirty, first_uncleanable)
    cleanable = [s for i, s in enumerate(segments) if s.base_offset < first_uncleanable and _next_base(segments, i) > lo]
    cleanable_bytes = sum(s.size for s in cleanable)
    needs_now = False
    if max_compaction_lag_ms < 2**63 - 1 and dirty:
        first_ts = next((s.first_timestamp for s in dirty if s.first_timestamp >= 0), -1)
        needs_now = 0 <= first_ts < now_ms - max_compaction_lag_ms
    return CleanableRange(first_dirty, first_uncleanable, clean_bytes, cleanable_bytes, needs_now)


def _next_base(segments: list[SegmentInfo], i: int) -> int:
    return segments[i + 1].base_offset if i + 1 < len(segments) else 2**63 - 1


def group_segments(
    segments: list[tuple[int, int, int]], max_size: int, first_uncleanable: int
) -> list[list[int]]:
    """Kafka's ``groupSegmentsBySize``: indexes of consecutive ``(base, next_base, size)``
    segments grouped so each group's bytes stay within ``max_size`` (segment.bytes) and
    its offsets within a segment's 2^31 relative range."""
    groups: list[list[int]] = []
    i = 0
    while i < len(segments):
        group = [i]
        size = segments[i][2]
        i += 1
        while i < len(segments):
            base, next_base, seg_size = segments[i]
            last = next_base - 1 if i + 1 < len(segments) else first_uncleanable - 1
            if size + seg_size > max_size:
                break
            if seg_size and last - segments[group[0]][0] > 0x7FFFFFFF:
                break
            group.append(i)
            size += seg_size
            i += 1
        groups.append(group)
    return groups


# --- a whole pass's heavy part, for a separate process ------------------------------------------------


@dataclass
class CleanJob:
    """What a pass needs, as plain data (it crosses into the cleaner process)."""

    directory: str
    segments: list[tuple[int, int, int]]  # (base offset, next segment's base, size), log start to the range end
    first_dirty: int
    first_uncleanable: int
    aborted: list[tuple[int, int, int, int]]  # AbortedTxn fields
    last_records: dict[int, tuple[int | None, int]]  # producer id -> (last data offset, epoch)
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    index_interval_bytes: int
    map_memory: int
    load_factor: float = 0.9
    io_max_bytes_per_second: float = 1.7976931348623157e308


@dataclass
class CleanResult:
    end_offset: int  # the first offset not cleaned (the new checkpoint)
    groups: list[tuple[int, int]]  # (base offset, end offset) of each .cleaned segment written
    stats: CleanerStats
    map_size: int
    map_utilization: float


def run_clean_job(job: CleanJob) -> CleanResult:
    """Build the offset map and write every group's ``<base>.*.cleaned`` segment, fsynced
    (the CPU-heavy part of a pass; the broker runs it in a process of its own so that the
    interpreter lock of the serving process stays free). Swapping them in is the caller's."""
    from pathlib import Path

    from oncelog.storage.segment import LOG_SUFFIX, Segment, segment_name, walk_batches

    directory = Path(job.directory)
    stats = CleanerStats()
    throttler = Throttler(job.io_max_bytes_per_second)
    fds: list[int] = []
    to_sync: list[int] = []
    try:
        for base, _nxt, _size in job.segments:  # opened at once: later deletions cannot pull them away
            fds.append(os.open(directory / (segment_name(base) + LOG_SUFFIX), os.O_RDONLY))

        def source(i: int) -> Callable[[], BatchSource]:
            def batches() -> BatchSource:
                for hdr, _pos, data in walk_batches(fds[i], 0, job.segments[i][2], 1 << 20, with_data=True):
                    yield hdr, data

            return batches

        aborted = [AbortedTxn(*t) for t in job.aborted]
        offset_map = OffsetMap(job.map_memory, job.load_factor)
        offset_map.clear(max(job.first_uncleanable - job.first_dirty, 1))
        dirty = [
            (base, min(nxt, job.first_uncleanable), source(i))
            for i, (base, nxt, _size) in enumerate(job.segments)
            if nxt > job.first_dirty
        ]
        t0 = time.monotonic()
        build_offset_map(dirty, job.first_dirty, offset_map, aborted, stats, throttler.maybe_throttle)
        t1 = time.monotonic()
        stats.map_s = t1 - t0
        end_offset = offset_map.latest_offset + 1
        to_clean = [(i, s) for i, s in enumerate(job.segments) if s[0] < end_offset]
        txns = TxnTracker()
        txns.add_aborted(aborted)
        last = {pid: LastRecord(off, epoch) for pid, (off, epoch) in job.last_records.items()}
        filt = BatchFilter(offset_map, job.now_ms, job.delete_retention_ms, last, job.first_uncleanable, txns, stats)
        groups = group_segments([s for _i, s in to_clean], job.segment_bytes, job.first_uncleanable)
        written: list[tuple[int, int]] = []  # every file written is synced together at the end
        for group in groups:
            members = [to_clean[g] for g in group]
            base = members[0][1][0]
            for ext in (".log", ".index", ".timeindex", ".txnindex"):
                (directory / (segment_name(base) + ext + ".cleaned")).unlink(missing_ok=True)
            seg = Segment(directory, base, job.index_interval_bytes, suffix=".cleaned")
            try:
                kept_before = len(txns.kept_aborted)
                for i, _s in members:
                    for hdr, data in source(i)():
                        throttler.maybe_throttle(hdr.size)
                        out = filt.filter(hdr, data)
                        if out is None:
                            continue
                        max_ts = hdr.max_timestamp if out is data else _max_ts(out)
                        seg.append([out], len(out), hdr.base_offset, hdr.next_offset, max_ts, job.now_ms)
                        throttler.maybe_throttle(len(out))
                for txn in txns.kept_aborted[kept_before:]:
                    seg.txn_index.append(txn)
                seg.seal()
                to_sync += seg.sync_fds(with_indexes=True)
            finally:
                seg.close()
            written.append((base, members[-1][1][1]))
            stats.groups += 1
        t2 = time.monotonic()
        stats.copy_s = t2 - t1
        sync_all(to_sync)
        stats.end = time.monotonic()
        stats.sync_s = stats.end - t2
        stats.throttled_s = throttler.slept_s
        return CleanResult(end_offset, written, stats, offset_map.size, offset_map.utilization())
    finally:
        for fd in fds + to_sync:
            os.close(fd)


def sync_all(fds: list[int]) -> None:
    """Make the files behind ``fds`` durable with as few journal commits as we can: on
    Linux, start the write-back of every file first (``sync_file_range``), so that their
    block allocations land in one journal transaction, which the first ``fdatasync``
    commits and the others find done. (One ``syncfs`` would commit once too, but it
    flushes everyone's dirty data on the file system: a broker's fdatasync behind it
    waited up to a second.) Elsewhere: ``fdatasync`` per file."""
    start_writeback = _sync_file_range()
    if start_writeback is not None:
        for fd in fds:
            start_writeback(fd, 0, 0, _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER)
    for fd in fds:
        os.fdatasync(fd)


_SYNC_FILE_RANGE_WRITE = 2
_SYNC_FILE_RANGE_WAIT_AFTER = 4
_SFR: list = []


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not _SFR:
        fn = None
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _SFR.append(fn)
    return _SFR[0]


def _max_ts(batch: bytes | memoryview) -> int:
    return _HEADER.unpack_from(batch, 0)[8]
