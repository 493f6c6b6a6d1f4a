"""A partition as the broker sees it: a log plus its high watermark, fetch
waiters and idempotent-producer state."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from oncelog.broker.producer_state import Accept, Duplicate, Incoming, ProducerStateTable, Reject, check_batch
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.protocol.records import BatchHeader
from oncelog.storage.fileutil import atomic_write

if TYPE_CHECKING:
    from oncelog.broker.producer_ids import ProducerIdManager
    from oncelog.storage.log import PartitionLog

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 2


def _snapshot_offset(path: Path) -> int | None:
    try:
        return int(path.name[: -len(SNAPSHOT_SUFFIX)])
    except ValueError:
        return None


class Partition:
    """One topic partition on this (single) node.

    ``high_watermark`` is the end of the durable prefix of the log: with
    fsync-on-ack it advances only after fdatasync, so a consumer can never read
    a record that a crash could still take away (the analogue of Kafka's
    high watermark advancing only once the ISR has the data).

    Producer state is snapshotted to ``<offset>.snapshot`` in the partition
    directory at every segment roll and at clean shutdown; on open the newest
    snapshot not beyond the log end is loaded and the batches after it are
    replayed from their headers, so duplicate detection survives kill -9.
    """

    __slots__ = ("topic", "index", "topic_id", "log", "high_watermark", "_waiters", "producers", "__weakref__")

    def __init__(self, topic: str, index: int, topic_id: object, log: "PartitionLog", max_producers: int = 10_000) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.log = log
        # recovery left only valid batches on disk: treat them as durable
        self.high_watermark = log.log_end_offset
        self._waiters: set[asyncio.Future[None]] = set()
        self.producers = self._load_producer_state(max_producers)

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.index})"

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    # -- high watermark and fetch waiters -------------------------------------

    def advance_high_watermark(self, offset: int) -> None:
        if offset > self.high_watermark:
            self.high_watermark = offset
            self.wake()

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

    def append_batch(
        self, records: bytes, hdr: BatchHeader, now_ms: int, producer_ids: "ProducerIdManager"
    ) -> tuple[int, int]:
        """Append one validated client batch; return (base offset, log append time).

        Idempotent batches go through :func:`check_batch` first: a duplicate
        returns the original offsets and writes nothing; a rejection raises
        :class:`KafkaError` and changes nothing. The producer entry is
        committed only after the append succeeded.
        """
        decision: Accept | None = None
        if hdr.producer_id >= 0:
            if hdr.is_transactional:
                raise KafkaError(
                    ErrorCode.invalid_txn_state, "transactional batches need the transaction coordinator"
                )
            if not producer_ids.was_issued(hdr.producer_id):
                raise KafkaError(
                    ErrorCode.unknown_producer_id, f"producer id {hdr.producer_id} was never issued by this broker"
                )
            incoming = Incoming(hdr.producer_id, hdr.producer_epoch, hdr.base_sequence, hdr.last_offset_delta + 1)
            result = check_batch(self.producers.get(hdr.producer_id), incoming)
            if isinstance(result, Duplicate):
                return result.batch.first_offset, -1
            if isinstance(result, Reject):
                raise KafkaError(result.code, result.message)
            decision = result
        info = self.log.append(records, now_ms, header=hdr)
        if info.segment_base_offset == info.base_offset and info.base_offset > 0:
            # this append rolled a new segment: snapshot the state before it
            self._snapshot_quietly(info.base_offset)
        if decision is not None:
            self.producers.put(decision.entry_after(info.base_offset, info.last_offset, now_ms))
        return info.base_offset, info.log_append_time_ms

    # -- producer state snapshots --------------------------------------------

    def _snapshot_quietly(self, offset: int) -> None:
        try:
            self.snapshot_producer_state(offset)
        except OSError as exc:  # snapshots are an optimisation; replay covers a missing one
            log.error("producer snapshot of %s at %d failed: %s", self, offset, exc)

    def _snapshots(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.log.directory.glob("*" + SNAPSHOT_SUFFIX):
            offset = _snapshot_offset(path)
            if offset is not None:
                found.append((offset, path))
        return sorted(found)

    def _load_producer_state(self, max_producers: int) -> ProducerStateTable:
        end = self.log.log_end_offset
        table = ProducerStateTable(max_producers)
        start = self.log.log_start_offset
        for offset, path in reversed(self._snapshots()):
            if offset > end:
                path.unlink(missing_ok=True)  # the log was truncated below it
                continue
            try:
                table = ProducerStateTable.from_bytes(path.read_bytes(), max_producers)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable producer snapshot %s: %s", path, exc)
                continue
            start = max(offset, start)
            break
        if start < end:
            for hdr, _data in self.log.scan_batches(start):
                if hdr.base_offset < start or hdr.is_control:
                    continue
                table.replay(
                    hdr.producer_id,
                    hdr.producer_epoch,
                    hdr.base_sequence,
                    hdr.last_offset_delta + 1,
                    hdr.base_offset,
                    hdr.last_offset,
                    hdr.max_timestamp,
                )
        return table

    def snapshot_producer_state(self, offset: int | None = None) -> None:
        """Write the producer state as of ``offset`` (default: the log end)."""
        offset = self.log.log_end_offset if offset is None else offset
        path = self.log.directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"
        atomic_write(path, self.producers.to_bytes())
        for _, old in self._snapshots()[:-SNAPSHOTS_KEPT]:
            try:
                os.unlink(old)
            except FileNotFoundError:
                pass
