"""Writing transaction markers: the broker's side of the coordinator's
``MarkerWriter`` (in Kafka, WriteTxnMarkers requests to partition leaders).

For each partition of a finished transaction one control batch is appended
(COMMIT or ABORT, with the producer id, epoch and coordinator epoch) and the
call returns once every marker is durable (the same group-commit fsync
rounds as produce requests). The offsets partition of a transaction
(``__consumer_offsets-0``) goes to the offsets store, where the marker also
commits or discards the producer's pending transactional offsets.

Errors per partition, as the coordinator reads them: 0 = durable; a
partition that no longer exists answers UNKNOWN_TOPIC_OR_PARTITION and the
coordinator drops it; a storage error answers KAFKA_STORAGE_ERROR. An fsync
or write error takes the log directory offline (storage/log_dir.py: a failed
fsync is never retried, since a later one may return 0 for pages the kernel
dropped), so every partition of the failed round, and every later marker,
answers KAFKA_STORAGE_ERROR, nothing is reported durable any more, and the
broker stops; the next start's coordinator completes the prepared
transaction by writing its markers again (a partition whose first marker did
reach the disk then holds two; the second finds no open transaction and
changes nothing, as in Kafka: docs/transactions.md, "A marker written
twice"). A partition that rejects the marker because the
producer or the coordinator moved on (INVALID_PRODUCER_EPOCH,
TRANSACTION_COORDINATOR_FENCED) answers 0 to the coordinator, which is how
Kafka's coordinator treats those answers (the transaction has nothing left to
do there); the admin path (WriteTxnMarkers, ``strict=True``) gets the real
error.

Crash points for tests (``oncelog.testing.crash.markers`` = N in the broker
config): the broker process exits at once (``os._exit``, like kill -9) in the
middle of the first commit whose markers it writes after start, once N
markers are durable (0 = after PrepareCommit, before any marker). Tests
use it to check recovery completes such a commit on restart; it is off by
default and never used outside tests.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from oncelog.broker.group import TopicPartition
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.storage.log_dir import log_level

if TYPE_CHECKING:
    from oncelog.broker.broker import Broker

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
_MOVED_ON = (ErrorCode.invalid_producer_epoch, ErrorCode.transaction_coordinator_fenced)


class BrokerMarkerWriter:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        crash = broker.config.raw.get("oncelog.testing.crash.markers")
        self._crash_after: int | None = int(crash) if crash not in (None, "") else None

    async def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        partitions: list[TopicPartition],
        transaction_version: int = 0,
        strict: bool = False,
    ) -> dict[TopicPartition, int]:
        broker = self.broker
        now = broker.clock()
        if self._crash_after is not None and commit and not strict:
            await self._crash_point(producer_id, producer_epoch, coordinator_epoch, partitions, transaction_version)
        errors: dict[TopicPartition, int] = {}
        waits: list[tuple[list[TopicPartition], Any]] = []
        appended: list[tuple[TopicPartition, Any, int]] = []  # (tp, partition, marker offset): one wait for all
        for tp in partitions:
            try:
                if tp.topic == OFFSETS_TOPIC:
                    if tp.partition != 0:
                        raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown partition {tp}")
                    fut = broker.groups.store.write_marker(
                        producer_id, producer_epoch, commit,
                        coordinator_epoch=coordinator_epoch, transaction_version=transaction_version,
                    )
                else:
                    partition = broker.partition(tp.topic, tp.partition)
                    offset = partition.write_marker(
                        producer_id, producer_epoch, coordinator_epoch, commit, now, transaction_version
                    )
                    appended.append((tp, partition, offset))
                    fut = None
            except KafkaError as exc:
                if exc.code in _MOVED_ON and not strict:
                    log.info("marker for producer %d on %s-%d not needed: %s", producer_id, tp.topic, tp.partition, exc)
                    errors[tp] = 0
                else:
                    errors[tp] = int(exc.code)
                continue
            except OSError as exc:  # the append or its aborted-txn index entry failed: the log directory is offline
                log.log(log_level(exc, logging.ERROR), "marker on %s-%d not written: %s", tp.topic, tp.partition, exc)
                errors[tp] = int(ErrorCode.kafka_storage_error)
                continue
            errors[tp] = 0
            if fut is not None:
                waits.append(([tp], fut))
        if appended:
            # no await since the appends: one group-commit round covers them (and their future)
            fut = broker.committer.wait_durable_all([p for _, p, _ in appended])
            if fut is not None:
                waits.append(([tp for tp, _, _ in appended], fut))
        if waits:
            results = await asyncio.gather(*(f for _, f in waits), return_exceptions=True)
            for (tps, _), result in zip(waits, results):
                if isinstance(result, BaseException):
                    for tp in tps:
                        log.log(log_level(result, logging.ERROR), "marker on %s-%d is not durable: %s",
                                tp.topic, tp.partition, result)
                        errors[tp] = int(ErrorCode.kafka_storage_error)
        return errors

    async def _crash_point(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, partitions: list[TopicPartition], tv: int
    ) -> None:
        """Test hook: write the first N markers durably, then die like kill -9."""
        n, self._crash_after = self._crash_after or 0, None
        if n:
            await self.write_markers(producer_id, producer_epoch, coordinator_epoch, True, partitions[:n], tv)
        log.warning("oncelog.testing.crash.markers: exiting after %d of %d commit markers", n, len(partitions))
        logging.shutdown()
        os._exit(9)
