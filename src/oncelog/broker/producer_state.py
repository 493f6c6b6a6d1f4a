"""Per-partition state of idempotent producers (sans-IO).

For every producer id the partition remembers its epoch and the metadata of
its last :data:`BATCH_WINDOW` batches (sequence range, offsets, timestamp),
as Kafka's ``ProducerStateEntry`` does. :func:`check_batch` is the pure
decision made for each incoming batch:

* a batch equal (same epoch, first and last sequence) to one of the cached
  batches is a **duplicate**: the original offsets are returned, nothing is
  written;
* an older epoch is fenced (INVALID_PRODUCER_EPOCH);
* a new epoch must start at sequence 0 (else OUT_OF_ORDER_SEQUENCE_NUMBER);
* within an epoch the first sequence must follow the last one (wrapping at
  2^31 - 1 to 0), else OUT_OF_ORDER_SEQUENCE_NUMBER;
* a producer with no state on this partition (new, or expired) is accepted
  at any sequence, as Kafka does since KIP-360.

A decision that accepts the batch carries the *updated* entry, which the
partition commits only after the log append succeeded (Kafka's "prepare,
then commit after append"): a failed append leaves the state untouched.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Iterable

from oncelog.protocol.errors import ErrorCode

BATCH_WINDOW = 5
INT32_MAX = 0x7FFFFFFF
NO_EPOCH = -1
NO_SEQUENCE = -1


@dataclass(frozen=True, slots=True)
class BatchMeta:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: tuple[BatchMeta, ...] = ()
    last_timestamp: int = -1  # broker time of the last append (expiry clock)
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMeta | None:
        if epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


@dataclass(frozen=True, slots=True)
class Incoming:
    """What the check needs of a batch header."""

    producer_id: int
    epoch: int
    first_seq: int
    record_count: int  # last_offset_delta + 1

    @property
    def last_seq(self) -> int:
        return last_sequence(self.first_seq, self.record_count)


@dataclass(frozen=True, slots=True)
class Accept:
    """Append the batch; then commit ``entry_for(first_offset, ...)``."""

    previous: ProducerEntry | None
    incoming: Incoming

    def entry_after(self, first_offset: int, last_offset: int, now_ms: int) -> ProducerEntry:
        inc = self.incoming
        meta = BatchMeta(inc.first_seq, inc.last_seq, first_offset, last_offset, now_ms)
        prev = self.previous
        if prev is None or prev.epoch != inc.epoch:
            batches: tuple[BatchMeta, ...] = (meta,)
            base = prev if prev is not None else ProducerEntry(inc.producer_id, inc.epoch)
        else:
            batches = (prev.batches + (meta,))[-BATCH_WINDOW:]
            base = prev
        return replace(base, epoch=inc.epoch, batches=batches, last_timestamp=now_ms)


@dataclass(frozen=True, slots=True)
class Duplicate:
    batch: BatchMeta


@dataclass(frozen=True, slots=True)
class Reject:
    code: ErrorCode
    message: str


Decision = Accept | Duplicate | Reject


def last_sequence(first_seq: int, record_count: int) -> int:
    """Sequence of the last record; sequences wrap from 2^31-1 to 0."""
    return (first_seq + record_count - 1) % (INT32_MAX + 1)


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def check_batch(entry: ProducerEntry | None, inc: Incoming) -> Decision:
    """Kafka's duplicate, epoch and sequence rules for one idempotent batch."""
    if entry is not None:
        if inc.epoch < entry.epoch:
            return Reject(
                ErrorCode.invalid_producer_epoch,
                f"producer {inc.producer_id} epoch {inc.epoch} is older than the current epoch {entry.epoch}",
            )
        dup = entry.find_duplicate(inc.epoch, inc.first_seq, inc.last_seq)
        if dup is not None:
            return Duplicate(dup)
        if inc.epoch > entry.epoch:
            if inc.first_seq != 0:
                return Reject(
                    ErrorCode.out_of_order_sequence_number,
                    f"invalid sequence {inc.first_seq} for new epoch {inc.epoch} of producer "
                    f"{inc.producer_id}: a new epoch starts at 0",
                )
        elif entry.batches and not in_sequence(entry.last_seq, inc.first_seq):
            return Reject(
                ErrorCode.out_of_order_sequence_number,
                f"out of order sequence for producer {inc.producer_id} at epoch {inc.epoch}: "
                f"got {inc.first_seq}, expected {(entry.last_seq + 1) % (INT32_MAX + 1)}",
            )
    return Accept(entry, inc)


class ProducerStateTable:
    """Producer entries of one partition, least recently used first.

    ``max_producers`` bounds memory: beyond it the least recently active
    producer is evicted (it loses duplicate detection, like an expired one).
    """

    def __init__(self, max_producers: int = 10_000) -> None:
        self.entries: OrderedDict[int, ProducerEntry] = OrderedDict()
        self.max_producers = max_producers

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self.entries.get(producer_id)

    def put(self, entry: ProducerEntry) -> None:
        entries = self.entries
        entries[entry.producer_id] = entry
        entries.move_to_end(entry.producer_id)
        while len(entries) > self.max_producers:
            entries.popitem(last=False)

    def expire(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Drop producers idle for ``expiration_ms`` (``producer.id.expiration.ms``)."""
        gone = [
            pid
            for pid, e in self.entries.items()
            if e.current_txn_first_offset < 0 and now_ms - e.last_timestamp >= expiration_ms
        ]
        for pid in gone:
            del self.entries[pid]
        return gone

    def replay(self, producer_id: int, epoch: int, first_seq: int, record_count: int, first_offset: int, last_offset: int, ts: int) -> None:
        """Rebuild state from a batch found in the log (recovery; no checks)."""
        if producer_id < 0:
            return
        inc = Incoming(producer_id, epoch, first_seq, record_count)
        prev = self.get(producer_id)
        if prev is not None and epoch < prev.epoch:
            return
        self.put(Accept(prev, inc).entry_after(first_offset, last_offset, ts))

    # -- snapshots ------------------------------------------------------------

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "producers": [
                    {
                        "pid": e.producer_id,
                        "epoch": e.epoch,
                        "ts": e.last_timestamp,
                        "coordinator_epoch": e.coordinator_epoch,
                        "txn_first_offset": e.current_txn_first_offset,
                        "batches": [[b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp] for b in e.batches],
                    }
                    for e in self.entries.values()
                ],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, max_producers: int = 10_000) -> "ProducerStateTable":
        doc = json.loads(data)
        if doc.get("version") != 1:
            raise ValueError(f"unknown producer snapshot version {doc.get('version')!r}")
        table = cls(max_producers)
        for p in doc["producers"]:
            table.put(
                ProducerEntry(
                    p["pid"],
                    p["epoch"],
                    tuple(BatchMeta(*b) for b in p["batches"]),
                    p["ts"],
                    p.get("coordinator_epoch", -1),
                    p.get("txn_first_offset", -1),
                )
            )
        return table

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterable[ProducerEntry]:  # type: ignore[override]
        return iter(list(self.entries.values()))


