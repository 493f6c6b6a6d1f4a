"""A partition as the broker sees it: a log plus its high watermark, last
stable offset, fetch waiters, and idempotent/transactional producer state.

Transactions on the partition (Kafka's ``UnifiedLog`` + ``ProducerStateManager``):

* a transactional batch opens its producer's transaction at its base offset
  (after ``verify_txn`` confirmed the partition is in the producer's ongoing
  transaction, when it was not open here yet at that epoch);
* :meth:`Partition.write_marker` appends a COMMIT/ABORT control batch for the
  coordinator and closes the transaction; an aborted one is added to the
  segment's transaction index (producer id, first offset, marker offset, and
  the first offset of the oldest other open transaction);
* the last stable offset is the smallest of the high watermark, the first
  offset of each open transaction and the first offset of each closed one
  whose marker is not yet below the high watermark (not yet durable), so
  read_committed consumers never see a transaction before its outcome is
  durable. It moves only when the high watermark moves, which wakes fetch
  waiters.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from collections.abc import Callable

from oncelog.broker.producer_state import (
    Accept,
    CompletedTxn,
    Duplicate,
    Incoming,
    ProducerStateTable,
    Reject,
    check_batch,
    check_marker,
    has_ongoing_txn,
)
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.protocol.records import BatchHeader, InvalidRecordError, encode_control_batch, read_control_marker
from oncelog.storage.fileutil import offset_named_files, write_offset_named
from oncelog.storage.txn_index import AbortedTxn

if TYPE_CHECKING:
    from oncelog.broker.producer_ids import ProducerIdManager
    from oncelog.storage.log import PartitionLog

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 2


class Partition:
    """One topic partition on this (single) node.

    ``high_watermark`` is the end of the durable prefix of the log: with
    fsync-on-ack it advances only after fdatasync, so a consumer can never read
    a record that a crash could still take away (the analogue of Kafka's
    high watermark advancing only once the ISR has the data).

    Producer state is snapshotted to ``<offset>.snapshot`` in the partition
    directory at every segment roll (appends, ``segment.ms`` and retention
    rolls alike: the log calls :meth:`_snapshot_on_roll` through its
    ``on_roll`` hook) and at clean shutdown; the snapshots of segments that
    retention or DeleteRecords delete go with them. On open, snapshots beyond
    the log end or at or below the log start offset are deleted (Kafka's
    ``truncateAndReload``: a snapshot at or below the log start describes
    producers whose batches may be gone, and would revive transactions and
    sequences the deleted segments closed), the newest remaining one is
    loaded, and the batches after it (or from the log start) are replayed
    from their headers (and the one record of each control batch), so
    duplicate detection, open transactions and the last stable offset survive
    kill -9. The aborted-transaction index is rebuilt from the same replay
    start: entries at or above it are dropped and re-added by the replay;
    entries below it were fsynced before the snapshot was written.
    """

    __slots__ = (
        "topic", "index", "topic_id", "log", "high_watermark", "_waiters", "producers", "leader_epoch", "__weakref__",
    )

    def __init__(self, topic: str, index: int, topic_id: object, log: "PartitionLog", max_producers: int = 10_000) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.log = log
        # recovery left only valid batches on disk: treat them as durable
        self.high_watermark = log.log_end_offset
        self._waiters: set[asyncio.Future[None]] = set()
        self.producers = self._load_producer_state(max_producers)
        self.producers.on_high_watermark(self.high_watermark)
        # this node becomes the partition's leader: a new leader epoch, as a KRaft
        # controller elects a restarted broker again with a bumped epoch
        self.leader_epoch = log.become_leader()
        log.on_roll = self._snapshot_on_roll
        log.on_segments_deleted = self._delete_snapshots

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.index})"

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    def check_leader_epoch(self, current_leader_epoch: int) -> None:
        """A request's ``current_leader_epoch`` against ours (Kafka's ``Partition.getLocalLog``):
        -1 skips the check, an older one is FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH."""
        if current_leader_epoch == -1 or current_leader_epoch == self.leader_epoch:
            return
        if current_leader_epoch < self.leader_epoch:
            raise KafkaError(
                ErrorCode.fenced_leader_epoch,
                f"{self}: current leader epoch {current_leader_epoch} is older than {self.leader_epoch}",
            )
        raise KafkaError(
            ErrorCode.unknown_leader_epoch,
            f"{self}: current leader epoch {current_leader_epoch} is newer than {self.leader_epoch}",
        )

    # -- high watermark and fetch waiters -------------------------------------

    def advance_high_watermark(self, offset: int) -> None:
        """Move the high watermark (and with it the last stable offset) and wake fetch waiters."""
        if offset > self.high_watermark:
            self.high_watermark = offset
            self.producers.on_high_watermark(offset)
            self.wake()

    @property
    def last_stable_offset(self) -> int:
        """min(high watermark, first offset of every open or not yet durably completed transaction).

        A transaction that began below the log start offset (retention or
        DeleteRecords removed its first batches) counts from the log start
        offset, as Kafka clamps its first unstable offset.
        """
        hw = self.high_watermark
        first = self.producers.first_undecided_offset()
        if first is None:
            return hw
        return min(max(first, self.log.log_start_offset), hw)

    def open_transactions(self) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of the open transactions, oldest first."""
        return self.producers.open_transactions()

    def aborted_transactions(self, fetch_offset: int, upper_offset: int) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of the aborted transactions overlapping
        ``[fetch_offset, upper_offset)`` (last offset >= fetch_offset, first offset < upper_offset)."""
        return [(t.producer_id, t.first_offset) for t in self.log.collect_aborted_txns(fetch_offset, upper_offset)]

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def add_waiter(self, fut: asyncio.Future[None]) -> None:
        self._waiters.add(fut)

    def remove_waiter(self, fut: asyncio.Future[None]) -> None:
        self._waiters.discard(fut)

    # -- appends ---------------------------------------------------------------

    def duplicate_offset(self, hdr: BatchHeader) -> int | None:
        """The original base offset if ``hdr`` is a retry of one of its producer's
        cached batches (what :meth:`append_batch` would answer without writing),
        else None. Pure: conditional produce asks it before its offset check."""
        if hdr.producer_id < 0:
            return None
        entry = self.producers.get(hdr.producer_id)
        if entry is None:
            return None
        incoming = Incoming(
            hdr.producer_id, hdr.producer_epoch, hdr.base_sequence, hdr.last_offset_delta + 1, hdr.is_transactional
        )
        result = check_batch(entry, incoming)
        return result.batch.first_offset if isinstance(result, Duplicate) else None

    def append_batch(
        self,
        records: bytes,
        hdr: BatchHeader,
        now_ms: int,
        producer_ids: "ProducerIdManager",
        verify_txn: Callable[[int, int], None] | None = None,
    ) -> tuple[int, int]:
        """Append one validated client batch; return (base offset, log append time).

        Idempotent batches go through :func:`check_batch` first (a producer id
        with no state here is accepted at any sequence, issued by this broker
        or not, as Kafka does; ``producer_ids`` is not consulted): a duplicate
        returns the original offsets and writes nothing; a rejection raises
        :class:`KafkaError` and changes nothing. A transactional batch from a
        producer with no transaction open here at its epoch is first passed to
        ``verify_txn(producer_id, producer_epoch)``, which raises
        :class:`KafkaError` when the partition is not in that producer's
        ongoing transaction (KIP-890 part 1; None skips the check). The
        producer entry is committed only after the append succeeded.
        """
        decision: Accept | None = None
        if hdr.producer_id >= 0:
            entry = self.producers.get(hdr.producer_id)
            incoming = Incoming(
                hdr.producer_id, hdr.producer_epoch, hdr.base_sequence, hdr.last_offset_delta + 1, hdr.is_transactional
            )
            result = check_batch(entry, incoming)
            if isinstance(result, Duplicate):
                return result.batch.first_offset, -1
            # Kafka's order: duplicates first, then transaction verification, then epoch/sequence/txn state
            if hdr.is_transactional and verify_txn is not None and not has_ongoing_txn(entry, hdr.producer_epoch):
                verify_txn(hdr.producer_id, hdr.producer_epoch)
            if isinstance(result, Reject):
                raise KafkaError(result.code, result.message)
            decision = result
        cfg = self.log.config
        if cfg.extras and not cfg.log_append_time:  # message.timestamp.before/after.max.ms, when set
            _check_timestamps(records, hdr, now_ms, cfg)
        if cfg.compression_type != "producer" and cfg.target_codec != hdr.compression:
            records, hdr = _recompress(records, hdr, cfg)  # the topic's compression.type (Kafka's LogValidator)
        # a roll by this append snapshots the state before the batch (the log's on_roll hook)
        info = self.log.append(records, now_ms, header=hdr)
        if decision is not None:
            self.producers.put(decision.entry_after(info.base_offset, info.last_offset, now_ms))
        return info.base_offset, info.log_append_time_ms

    def write_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        now_ms: int,
        transaction_version: int = 0,
    ) -> int:
        """Append a COMMIT/ABORT marker for the coordinator; return its offset.

        :func:`check_marker` decides first (a rejection raises
        :class:`KafkaError` and writes nothing). The marker closes the
        producer's open transaction here, if any; an aborted one goes to the
        transaction index. The caller waits for durability (group commit);
        until the high watermark passes the marker the transaction still
        holds the last stable offset.
        """
        decision = check_marker(
            self.producers.get(producer_id),
            producer_epoch,
            coordinator_epoch,
            transaction_version,
            producer_id=producer_id,
        )
        if isinstance(decision, Reject):
            raise KafkaError(decision.code, decision.message)
        batch = encode_control_batch(producer_id, producer_epoch, commit, coordinator_epoch, timestamp_ms=now_ms)
        info = self.log.append_control(batch, now_ms)
        completed = decision.completed(info.base_offset, commit)
        if completed is not None and completed.aborted:
            self._index_abort(completed)
        self.producers.complete(decision, info.base_offset, commit, now_ms)
        return info.base_offset

    def _index_abort(self, txn: CompletedTxn) -> None:
        """Add an aborted transaction (before the table completes it) to the active segment's index."""
        nxt = self.producers.next_incomplete_first_offset(txn.producer_id)
        lso = txn.last_offset + 1 if nxt is None else nxt
        self.log.append_aborted_txn(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, lso))

    # -- producer state snapshots --------------------------------------------

    def _snapshot_on_roll(self, offset: int) -> None:
        """The log's ``on_roll`` hook. Called inside the roll's I/O guard: an OSError takes
        the log directory offline and fails the roll's caller (as Kafka's ``roll`` does
        with ``takeProducerSnapshot``'s IOException)."""
        self.snapshot_producer_state(offset)

    def _snapshots(self) -> list[tuple[int, Path]]:
        return offset_named_files(self.log.directory, SNAPSHOT_SUFFIX)

    def _delete_snapshots(self, offsets: list[int]) -> None:
        """Delete the snapshots taken at these offsets (the base offsets of deleted segments)."""
        doomed = set(offsets)
        for offset, path in self._snapshots():
            if offset in doomed:
                path.unlink(missing_ok=True)

    def _load_producer_state(self, max_producers: int) -> ProducerStateTable:
        end = self.log.log_end_offset
        table = ProducerStateTable(max_producers)
        start = self.log.log_start_offset
        log_start = start
        for offset, path in reversed(self._snapshots()):
            if offset > end or offset <= log_start:
                # beyond the end: the log was truncated below it; at or below the log start:
                # it may hold producers and open transactions whose later batches and markers
                # were deleted with their segments (replay from the log start rebuilds the rest)
                path.unlink(missing_ok=True)
                continue
            try:
                table = ProducerStateTable.from_bytes(path.read_bytes(), max_producers)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable producer snapshot %s: %s", path, exc)
                continue
            start = max(offset, start)
            break
        # the transaction index is rebuilt from the replay start; old entries are kept
        # aside for markers whose transaction began before the replay start but is
        # unknown to the loaded state (no usable snapshot)
        previous = {t.last_offset: t for t in self.log.collect_aborted_txns(start, 1 << 63)}
        self.log.truncate_txn_indexes(start)
        self.producers = table
        if start < end:
            for hdr, data in self.log.scan_batches(start):
                if hdr.base_offset < start:
                    continue
                if hdr.is_control:
                    if hdr.records_count:  # an empty one: compaction removed its whole transaction (Kafka skips it)
                        self._replay_marker(hdr, data, previous.get(hdr.base_offset))
                    continue
                table.replay(
                    hdr.producer_id,
                    hdr.producer_epoch,
                    hdr.base_sequence,
                    hdr.last_offset_delta + 1,
                    hdr.base_offset,
                    hdr.last_offset,
                    hdr.max_timestamp,
                    hdr.is_transactional,
                )
        return table

    def _replay_marker(self, hdr: BatchHeader, data: bytes | memoryview, previous: AbortedTxn | None) -> None:
        try:
            marker = read_control_marker(data)
        except InvalidRecordError as exc:  # not a transaction marker we can read: skip it
            log.warning("%s: unreadable control batch at offset %d: %s", self, hdr.base_offset, exc)
            return
        table = self.producers
        entry = table.get(hdr.producer_id)
        first = entry.current_txn_first_offset if entry is not None else -1
        if not marker.commit:
            if previous is not None and previous.producer_id == hdr.producer_id and (first < 0 or previous.first_offset < first):
                # the loaded state cannot see where this transaction began (it predates the
                # replay start): the durable entry knows better
                self.log.append_aborted_txn(previous)
            elif first >= 0:
                self._index_abort(CompletedTxn(hdr.producer_id, first, hdr.base_offset, True))
        table.replay_marker(
            hdr.producer_id, hdr.producer_epoch, marker.coordinator_epoch, marker.commit, hdr.base_offset, hdr.max_timestamp
        )

    def snapshot_producer_state(self, offset: int | None = None) -> None:
        """Write the producer state as of ``offset`` (default: the log end). An OSError takes
        the log directory offline (Kafka's ``takeProducerSnapshot`` runs inside the log's
        IOException handler)."""
        offset = self.log.log_end_offset if offset is None else offset
        with self.log.io("producer snapshot"):
            # the snapshot ends replay there on the next open: the index entries below must be durable first
            self.log.sync_txn_indexes()
            write_offset_named(self.log.directory, offset, SNAPSHOT_SUFFIX, self.producers.to_bytes(), SNAPSHOTS_KEPT)


def _recompress(records: bytes, hdr: BatchHeader, cfg: object) -> tuple[bytes, BatchHeader]:
    """Re-encode a batch with the topic's codec (broker/recompress.py); the result must still fit."""
    from oncelog.broker import recompress

    codec = cfg.target_codec  # type: ignore[attr-defined]
    try:
        out, new_hdr = recompress.recompress(records, hdr, codec, recompress.level_for(cfg, codec))
    except InvalidRecordError as exc:
        raise KafkaError(exc.error_code, exc.message) from None
    if new_hdr.size > cfg.max_message_bytes:  # type: ignore[attr-defined]
        raise KafkaError(
            ErrorCode.message_too_large,
            f"the record batch is {new_hdr.size} bytes after recompression, above max.message.bytes "
            f"{cfg.max_message_bytes}",  # type: ignore[attr-defined]
        )
    if new_hdr.size > cfg.segment_bytes:  # type: ignore[attr-defined]
        raise KafkaError(ErrorCode.record_list_too_large, f"the record batch is {new_hdr.size} bytes after recompression, above segment.bytes")
    return out, new_hdr


def _check_timestamps(records: bytes, hdr: BatchHeader, now_ms: int, cfg: object) -> None:
    extras = cfg.extras  # type: ignore[attr-defined]
    before = extras.get("message.timestamp.before.max.ms")
    after = extras.get("message.timestamp.after.max.ms")
    if before is None and after is None:
        return
    from oncelog.broker import recompress

    limit = (1 << 63) - 1
    try:
        recompress.check_timestamps(records, hdr, now_ms, limit if before is None else before, limit if after is None else after)
    except InvalidRecordError as exc:
        raise KafkaError(exc.error_code, exc.message) from None
