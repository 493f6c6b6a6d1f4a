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

* within an epoch whose batches were cleared by a transaction marker that
  bumped the epoch (KIP-890), the next batch must start at sequence 0.

Transactions (Kafka's ``ProducerAppendInfo``):

* the first transactional batch of a producer opens a transaction on the
  partition (``current_txn_first_offset`` := its base offset); later
  transactional batches join it;
* a non-transactional batch from a producer with an open transaction is
  INVALID_TXN_STATE;
* :func:`check_marker` decides whether a COMMIT/ABORT marker may be written:
  the epoch check (transaction version < 2: marker epoch < current epoch ->
  INVALID_PRODUCER_EPOCH; version 2, where the coordinator bumps the epoch
  at the end of each transaction: marker epoch <= current ->
  INVALID_PRODUCER_EPOCH, except epoch == current with no open transaction,
  an idempotent retry of a marker already written), then the coordinator
  epoch (older than the entry's -> TRANSACTION_COORDINATOR_FENCED). An
  accepted marker closes the open transaction and sets the entry's epoch and
  coordinator epoch (a new epoch clears the cached batches).

A decision that accepts the batch carries the *updated* entry, which the
partition commits only after the log append succeeded (Kafka's "prepare,
then commit after append"): a failed append leaves the state untouched.

:class:`ProducerStateTable` also tracks the partition's transactions (Kafka's
``ProducerStateManager``): the open ones by first offset, and the completed
ones whose marker is not yet below the high watermark. Their smallest first
offset is the *first undecided offset*, which bounds the last stable offset.

Snapshots (JSON, version 1) hold every entry, including its coordinator
epoch and the first offset of its open transaction; open transactions are
rebuilt from them on load.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
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
    is_transactional: bool = False

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
        txn_first = base.current_txn_first_offset
        if inc.is_transactional and txn_first < 0:
            txn_first = first_offset  # this batch begins a transaction on the partition
        # built directly: dataclasses.replace costs a few µs per idempotent batch
        return ProducerEntry(
            producer_id=base.producer_id,
            epoch=inc.epoch,
            batches=batches,
            last_timestamp=now_ms,
            coordinator_epoch=base.coordinator_epoch,
            current_txn_first_offset=txn_first,
        )


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
        elif entry.epoch != NO_EPOCH and not in_sequence(entry.last_seq, inc.first_seq):
            # with no cached batch (a marker began this epoch) last_seq is -1: sequence 0 is expected
            return Reject(
                ErrorCode.out_of_order_sequence_number,
                f"out of order sequence for producer {inc.producer_id} at epoch {inc.epoch}: "
                f"got {inc.first_seq}, expected {(entry.last_seq + 1) % (INT32_MAX + 1)}",
            )
        if entry.current_txn_first_offset >= 0 and not inc.is_transactional:
            return Reject(
                ErrorCode.invalid_txn_state,
                f"expected a transactional write from producer {inc.producer_id}: its transaction "
                f"from offset {entry.current_txn_first_offset} is still open",
            )
    return Accept(entry, inc)


def has_ongoing_txn(entry: ProducerEntry | None, epoch: int) -> bool:
    """Kafka's ``hasOngoingTransaction``: a transaction is open at exactly this epoch."""
    return entry is not None and entry.current_txn_first_offset >= 0 and entry.epoch == epoch


# -- transaction markers -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction closed by a marker at ``last_offset``."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass(frozen=True, slots=True)
class MarkerAccept:
    """Write the marker; then commit with :meth:`ProducerStateTable.complete`."""

    previous: ProducerEntry | None
    producer_id: int
    epoch: int
    coordinator_epoch: int

    @property
    def open_txn_first_offset(self) -> int:
        """First offset of the transaction the marker closes (-1: none is open)."""
        return self.previous.current_txn_first_offset if self.previous is not None else -1

    def entry_after(self, now_ms: int) -> ProducerEntry:
        prev = self.previous if self.previous is not None else ProducerEntry(self.producer_id, NO_EPOCH)
        batches = prev.batches if prev.epoch == self.epoch else ()
        return replace(
            prev,
            epoch=self.epoch,
            batches=batches,
            last_timestamp=now_ms,
            coordinator_epoch=self.coordinator_epoch,
            current_txn_first_offset=-1,
        )

    def completed(self, marker_offset: int, commit: bool) -> CompletedTxn | None:
        """The transaction this marker closes, None for a marker with no open transaction."""
        first = self.open_txn_first_offset
        if first < 0:
            return None
        return CompletedTxn(self.producer_id, first, marker_offset, not commit)


def check_marker(
    entry: ProducerEntry | None,
    producer_epoch: int,
    coordinator_epoch: int,
    transaction_version: int,
    *,
    producer_id: int = -1,
) -> MarkerAccept | Reject:
    """Kafka's epoch and coordinator-epoch checks for a COMMIT/ABORT marker (``appendEndTxnMarker``).

    ``producer_id`` names the producer when ``entry`` is None (no state on the partition yet).
    """
    pid = entry.producer_id if entry is not None else producer_id
    current = entry.epoch if entry is not None else NO_EPOCH
    open_txn = entry is not None and entry.current_txn_first_offset >= 0
    tv2 = transaction_version >= 2
    if producer_epoch <= current if tv2 else producer_epoch < current:
        if not (tv2 and producer_epoch == current and not open_txn):  # else: a retried TV2 marker
            op = "<=" if tv2 else "<"
            return Reject(
                ErrorCode.invalid_producer_epoch,
                f"marker epoch {producer_epoch} of producer {pid} is {op} the current epoch {current} "
                f"(transaction version {transaction_version})",
            )
    if entry is not None and coordinator_epoch < entry.coordinator_epoch:
        return Reject(
            ErrorCode.transaction_coordinator_fenced,
            f"marker from coordinator epoch {coordinator_epoch} for producer {pid} is older than the "
            f"last seen coordinator epoch {entry.coordinator_epoch}",
        )
    return MarkerAccept(entry, pid, producer_epoch, coordinator_epoch)


class ProducerStateTable:
    """Producer entries of one partition, least recently used first, and its transactions.

    ``max_producers`` bounds memory: beyond it the least recently active
    producer without an open transaction is evicted (it loses duplicate
    detection, like an expired one). A producer with an open transaction is
    never evicted or expired: it pins the last stable offset until a marker.
    """

    def __init__(self, max_producers: int = 10_000) -> None:
        self.entries: OrderedDict[int, ProducerEntry] = OrderedDict()
        self.max_producers = max_producers
        self.ongoing: dict[int, int] = {}  # first offset -> producer id, ascending offsets
        self.unreplicated: deque[CompletedTxn] = deque()  # marker not yet below the high watermark

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self.entries.get(producer_id)

    def put(self, entry: ProducerEntry) -> None:
        entries = self.entries
        old = entries.get(entry.producer_id)
        old_first = old.current_txn_first_offset if old is not None else -1
        new_first = entry.current_txn_first_offset
        if old_first != new_first:
            if old_first >= 0:
                self.ongoing.pop(old_first, None)
            if new_first >= 0:
                self._add_ongoing(new_first, entry.producer_id)
        entries[entry.producer_id] = entry
        entries.move_to_end(entry.producer_id)
        while len(entries) > self.max_producers:
            victim = next((pid for pid, e in entries.items() if e.current_txn_first_offset < 0), None)
            if victim is None:
                break
            del entries[victim]

    def _add_ongoing(self, first_offset: int, producer_id: int) -> None:
        ongoing = self.ongoing
        out_of_order = bool(ongoing) and first_offset < next(reversed(ongoing))
        ongoing[first_offset] = producer_id
        if out_of_order:  # only when loading a snapshot: appends open transactions in offset order
            self.ongoing = dict(sorted(ongoing.items()))

    # -- transactions -----------------------------------------------------------

    def complete(self, accept: MarkerAccept, marker_offset: int, commit: bool, now_ms: int) -> CompletedTxn | None:
        """Commit a marker written at ``marker_offset``: close the producer's open transaction (if any)."""
        completed = accept.completed(marker_offset, commit)
        self.put(accept.entry_after(now_ms))
        if completed is not None:
            self.unreplicated.append(completed)
        return completed

    def on_high_watermark(self, high_watermark: int) -> None:
        """Forget completed transactions whose marker is now below the high watermark."""
        unreplicated = self.unreplicated
        while unreplicated and unreplicated[0].last_offset < high_watermark:
            unreplicated.popleft()

    def first_undecided_offset(self) -> int | None:
        """Smallest first offset of an open transaction or of one whose marker is above the high watermark."""
        first = next(iter(self.ongoing), None)
        for txn in self.unreplicated:
            if first is None or txn.first_offset < first:
                first = txn.first_offset
        return first

    def next_incomplete_first_offset(self, producer_id: int) -> int | None:
        """First offset of the oldest open transaction of another producer (Kafka's ``findNextIncompleteTxn``)."""
        for first, pid in self.ongoing.items():
            if pid != producer_id:
                return first
        return None

    def open_transactions(self) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of every open transaction, oldest first."""
        return [(pid, first) for first, pid in self.ongoing.items()]

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

    def replay(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        record_count: int,
        first_offset: int,
        last_offset: int,
        ts: int,
        is_transactional: bool = False,
    ) -> None:
        """Rebuild state from a data batch found in the log (recovery; no checks)."""
        if producer_id < 0:
            return
        inc = Incoming(producer_id, epoch, first_seq, record_count, is_transactional)
        prev = self.get(producer_id)
        if prev is not None and epoch < prev.epoch:
            return
        self.put(Accept(prev, inc).entry_after(first_offset, last_offset, ts))

    def replay_marker(
        self, producer_id: int, epoch: int, coordinator_epoch: int, commit: bool, offset: int, ts: int
    ) -> CompletedTxn | None:
        """Rebuild state from a marker found in the log (recovery; applied without checks, as
        Kafka applies replicated markers)."""
        accept = MarkerAccept(self.get(producer_id), producer_id, epoch, coordinator_epoch)
        return self.complete(accept, offset, commit, ts)

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


