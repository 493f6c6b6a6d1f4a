"""After a failed fsync the log directory is offline: every later request touching it gets Kafka's error.

A Broker without its server (which would stop it at once), driven through
``dispatch.handle_frame`` as the server does, so the requests that a stopping
broker may still have read are checked one by one.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pytest

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.broker.dispatch import handle_frame
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_response, encode_request, is_flexible, request_type
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.headers import skip_tagged_fields
from oncelog.broker.group import TopicPartition
from oncelog.protocol.records import Record, encode_record_batch, parse_batch_header
from oncelog.storage.config import LogConfig
from oncelog.storage.log import PartitionLog
from oncelog.storage.log_dir import LogClosedError, LogDirFailureChannel, LogDirOfflineError
from oncelog.storage.txn_index import AbortedTxn, TransactionIndex

PRODUCE, FETCH, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, INIT_PRODUCER_ID = 0, 1, 8, 9, 10, 22


async def call(broker: Broker, api_key: int, version: int, body: dict[str, Any]) -> Any:
    header = struct.pack(">hhih", api_key, version, 1, 1) + b"t"
    if is_flexible(api_key, version):
        header += b"\x00"
    parts = await handle_frame(broker, header + encode_request(materialize(request_type(api_key, version), body)))
    assert parts is not None
    raw = b"".join(parts)
    pos = skip_tagged_fields(raw, 4) if is_flexible(api_key, version) else 4
    return decode_response(api_key, version, raw, pos)


def produce(batch: bytes) -> dict[str, Any]:
    return {"transactional_id": None, "acks": -1, "timeout": 10000,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": batch}]}]}


def offset_commit(group: str = "g", topic: str = "t", offset: int = 1) -> dict[str, Any]:
    """OffsetCommit v8 of one partition (partition 0), outside any generation."""
    return {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]}


def init_txn(transactional_id: str = "tx") -> dict[str, Any]:
    """InitProducerId (v4 and later) of a new transactional producer."""
    return {"transactional_id": transactional_id, "transaction_timeout": 60000, "producer_id": -1,
            "producer_epoch": -1}


def fetch_body(topic: str = "t", offset: int = 0) -> dict[str, Any]:
    """Fetch v12 of partition 0, no wait."""
    return {"cluster_id": None, "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def test_every_request_after_a_failed_fsync_gets_kafkas_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        broker.create_topic("t", 1)
        log = broker.partition("t", 0).log

        async def main() -> None:
            r = await call(broker, INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": -1,
                                                         "producer_id": -1, "producer_epoch": -1})
            batch = encode_record_batch([Record(None, b"v")], producer_id=r.producer_id,
                                        producer_epoch=r.producer_epoch, base_sequence=0)

            def eio() -> int:
                raise OSError(5, "Input/output error")

            monkeypatch.setattr(log, "_sync", eio)  # under the log directory's failure channel
            (p,) = (await call(broker, PRODUCE, 9, produce(batch))).responses[0].partition_responses
            assert p.error_code == E.kafka_storage_error
            assert broker.log_dir.offline
            monkeypatch.undo()  # the disk "works" again: a later fdatasync would return 0
            end = log.log_end_offset
            # the retried duplicate is not acknowledged; a new batch is not appended
            for b in (batch, encode_record_batch([Record(None, b"w")])):
                (p,) = (await call(broker, PRODUCE, 9, produce(b))).responses[0].partition_responses
                assert p.error_code == E.kafka_storage_error
            assert log.log_end_offset == end and broker.partition("t", 0).high_watermark == 0
            f = await call(broker, FETCH, 12, fetch_body())
            assert f.responses[0].partitions[0].error_code == E.kafka_storage_error
            c = await call(broker, OFFSET_COMMIT, 8, offset_commit())
            assert c.topics[0].partitions[0].error_code == E.not_coordinator
            o = await call(broker, OFFSET_FETCH, 8, {
                "groups": [{"group_id": "g", "topics": None}], "require_stable": False})
            assert o.groups[0].error_code == E.not_coordinator
            fc = await call(broker, FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["g"]})
            assert fc.coordinators[0].error_code == E.coordinator_not_available
            t = await call(broker, INIT_PRODUCER_ID, 4, init_txn())
            assert t.error_code == E.not_coordinator

        asyncio.run(broker.txn.start())
        asyncio.run(main())
    finally:
        broker.close()
    # closed without writing to the failed directory: the next start recovers as after a crash
    assert not (tmp_path / "data" / "t-0" / ".clean_shutdown").exists()


@pytest.mark.parametrize("recreate", [False, True])
def test_a_produce_to_a_topic_deleted_during_its_implicit_add_fails_alone(tmp_path: Path, recreate: bool) -> None:
    """Review ffix #1: Produce v12 (TV2) awaits the transaction log write of its implicit add; a
    DeleteTopics meanwhile closed the partition's log. The append used to hit the closed
    descriptors (EBADF), which took the whole log directory offline and stopped the broker."""
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        broker.create_topic("t", 1)
        broker.create_topic("other", 1)

        async def main() -> None:
            r = await call(broker, INIT_PRODUCER_ID, 5, init_txn())
            assert r.error_code == 0, r
            batch = encode_record_batch([Record(None, b"v")], producer_id=r.producer_id,
                                        producer_epoch=r.producer_epoch, base_sequence=0, is_transactional=True)
            body = {"transactional_id": "tx", "acks": -1, "timeout": 10000,
                    "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": batch}]}]}
            task = asyncio.create_task(call(broker, PRODUCE, 12, body))
            for _ in range(100):  # until the implicit add is being written to the transaction log
                await asyncio.sleep(0)
                if broker.txn.pending_transit("tx") is not None:
                    break
            assert broker.txn.pending_transit("tx") is not None
            broker.delete_topic("t")  # DeleteTopics on another connection
            if recreate:
                broker.create_topic("t", 1)
            (p,) = (await task).responses[0].partition_responses
            assert p.error_code == (E.not_leader_or_follower if recreate else E.unknown_topic_or_partition), p
            assert not broker.log_dir.offline, broker.log_dir.cause
            if recreate:  # nothing went to the new topic's log
                assert broker.partition("t", 0).log.log_end_offset == 0
            # the broker still serves everyone else
            other = encode_record_batch([Record(None, b"w")])
            (p,) = (await call(broker, PRODUCE, 9, {
                "transactional_id": None, "acks": -1, "timeout": 10000,
                "topic_data": [{"name": "other", "partition_data": [{"index": 0, "records": other}]}]})
            ).responses[0].partition_responses
            assert p.error_code == 0 and not broker.log_dir.offline

        asyncio.run(broker.txn.start())
        asyncio.run(main())
    finally:
        broker.close()


def test_an_append_to_a_deleted_log_is_no_disk_failure(tmp_path: Path) -> None:
    channel = LogDirFailureChannel(tmp_path)
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), 0, failure_channel=channel)
    batch = encode_record_batch([Record(None, b"v")])
    log.append(batch, 0)
    log.delete()
    with pytest.raises(LogClosedError) as info:
        log.append(batch, 0)
    assert info.value.code == E.unknown_topic_or_partition
    assert not channel.offline


def test_a_failed_fsync_at_close_takes_the_directory_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close()'s own fdatasyncs go through the channel like sync()'s: offline, no clean-shutdown
    marker, every file closed (before: a bare OSError, the files left open)."""
    channel = LogDirFailureChannel(tmp_path)
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), 0, failure_channel=channel)
    log.append(encode_record_batch([Record(None, b"v")]), 0)

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("oncelog.storage.log.os.fdatasync", eio)
    with pytest.raises(LogDirOfflineError):
        log.close()
    assert channel.offline and channel.cause == "fsync of t-0 at shutdown: Input/output error"
    assert log.closed and all(seg.fd < 0 for seg in log.segments)
    assert not (tmp_path / "t-0" / ".clean_shutdown").exists()


def test_a_failed_write_of_the_aborted_txn_index_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The .txnindex entry is part of an ABORT marker's append (Kafka updates the index under
    the append's I/O guard). Before: an ENOSPC there left the directory online and the
    transaction open, so the coordinator's retry appended a second marker and was answered OK."""
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        broker.create_topic("t", 1)
        part = broker.partition("t", 0)
        batch = encode_record_batch([Record(None, b"v")], producer_id=1000, producer_epoch=0, base_sequence=0,
                                    is_transactional=True)
        part.append_batch(batch, parse_batch_header(batch), broker.clock(), broker.producer_ids, None)

        def enospc(self: TransactionIndex, txn: Any) -> None:
            raise OSError(28, "No space left on device")

        async def main() -> None:
            await broker.committer.wait_durable(part)
            tp = TopicPartition("t", 0)
            monkeypatch.setattr(TransactionIndex, "append", enospc)
            errors = await broker.markers.write_markers(1000, 0, broker.coordinator_epoch, False, [tp])
            assert errors == {tp: E.kafka_storage_error}
            assert broker.log_dir.offline
            assert broker.log_dir.cause == "append to the aborted-transaction index of t-0: No space left on device"
            monkeypatch.undo()
            end = part.log.log_end_offset
            errors = await broker.markers.write_markers(1000, 0, broker.coordinator_epoch, False, [tp])
            assert errors == {tp: E.kafka_storage_error}  # the retry writes no second marker
            assert part.log.log_end_offset == end and part.high_watermark == 1

        asyncio.run(main())
    finally:
        broker.close()


def test_a_failed_fsync_of_the_aborted_txn_index_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = LogDirFailureChannel(tmp_path)
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), 0, failure_channel=channel)
    log.append(encode_record_batch([Record(None, b"v")]), 0)
    log.append_aborted_txn(AbortedTxn(1000, 0, 0, 1))

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("oncelog.storage.log.os.fdatasync", eio)
    with pytest.raises(LogDirOfflineError):
        log.sync_txn_indexes()
    assert channel.cause == "fsync of the aborted-transaction indexes of t-0: Input/output error"
    monkeypatch.undo()
    with pytest.raises(LogDirOfflineError):  # not retried: a later fdatasync may return 0 for lost pages
        log.sync_txn_indexes()
    log.abandon()


def test_a_read_error_in_fetch_takes_the_directory_offline_and_answers_kafka_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's LocalLog.read runs under maybeHandleIOException. Before: the EIO escaped the Fetch
    handler (a traceback, the connection closed) and the directory stayed online."""
    import errno
    import os

    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        broker.create_topic("t", 1)

        async def main() -> None:
            (p,) = (await call(broker, PRODUCE, 9, produce(encode_record_batch([Record(None, b"v")])))).responses[
                0].partition_responses
            assert p.error_code == 0

            def eio(*args: Any, **kwargs: Any) -> Any:
                raise OSError(errno.EIO, "Input/output error")

            monkeypatch.setattr(os, "pread", eio)
            f = await call(broker, FETCH, 12, fetch_body())
            monkeypatch.undo()
            assert f.responses[0].partitions[0].error_code == E.kafka_storage_error
            assert f.responses[0].partitions[0].records in (b"", None)
            assert broker.log_dir.cause == "read of t-0: Input/output error"
            f = await call(broker, FETCH, 12, fetch_body())  # offline: every later Fetch too
            assert f.responses[0].partitions[0].error_code == E.kafka_storage_error

        asyncio.run(main())
    finally:
        broker.close()


def test_a_topic_deleted_during_a_long_poll_below_the_high_watermark_is_no_disk_failure(tmp_path: Path) -> None:
    """The long poll (min_bytes not met) reads the log again when woken by the DeleteTopics: that
    read meets the closed log, which is no disk error (review of iofix, finding 5: the
    ``part.log.closed`` branch had no test; without it the fetch got KAFKA_STORAGE_ERROR and the
    directory went offline, a false halt on a normal race). UNKNOWN_TOPIC_OR_PARTITION, online."""
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        broker.create_topic("t", 1)

        async def main() -> None:
            (p,) = (await call(broker, PRODUCE, 9, produce(encode_record_batch([Record(None, b"v")])))).responses[
                0].partition_responses
            assert p.error_code == 0
            body = fetch_body()  # offset 0: below the high watermark (1), so the woken fetch reads again
            body.update(max_wait=3000, min_bytes=1 << 20)
            task = asyncio.ensure_future(call(broker, FETCH, 12, body))
            await asyncio.sleep(0.05)
            assert not task.done()  # waiting for more bytes
            broker.delete_topic("t")
            f = await asyncio.wait_for(task, 5)
            assert f.responses[0].partitions[0].error_code == E.unknown_topic_or_partition
            assert not broker.log_dir.offline and broker.log_dir.cause is None

        asyncio.run(main())
    finally:
        broker.close()
