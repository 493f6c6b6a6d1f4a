"""Storage I/O outside append and sync takes the log directory offline, as in Kafka.

Kafka routes an IOException of these to its LogDirFailureChannel too: segment deletion
(``UnifiedLog.deleteSegments``, retention and DeleteRecords, with the log-start-offset
checkpoint), a roll's producer snapshot (``takeProducerSnapshot`` inside ``roll``),
``truncateTo`` (the transaction index), the cleaner's pass and swap (``LogCleaner``'s
IOException handler), the creation of a log (``getOrCreateLog``, see
test_broker_topics.py) and, here, the coordinators' snapshots of their internal logs and
the topic catalog. Before, each of these was logged (or raised alone) and the broker went
on with a directory whose state nobody knew. Each test injects the OSError at the os call
(or the one function doing it) and checks that the directory is offline, and for the
broker paths that later requests get Kafka's errors.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.broker.durability import DaemonThreadExecutor
from oncelog.broker.log_cleaner import CleanerConfig, LogCleaner, _Deleter
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_record_batch
from oncelog.storage import txn_index as txn_index_mod
from oncelog.storage.config import LogConfig
from oncelog.storage.engine import LogManager
from oncelog.storage.log import PartitionLog
from oncelog.storage.log_dir import LogDirFailureChannel, LogDirOfflineError
from oncelog.storage.txn_index import AbortedTxn
from tests.unit.test_log_dir_offline import (
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    call,
    init_txn,
    offset_commit,
    produce,
)

DELETE_RECORDS = 21
T0 = 1_700_000_000_000


def _eio(*args: object, **kwargs: object) -> Any:
    raise OSError(errno.EIO, "Input/output error")


def _enospc(*args: object, **kwargs: object) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def _batch(value: bytes = b"v", ts: int = T0) -> bytes:
    return encode_record_batch([Record(None, value)], base_timestamp=ts)


def _log(tmp_path: Path, channel: LogDirFailureChannel, **cfg: Any) -> PartitionLog:
    return PartitionLog.open(tmp_path / "t-0", LogConfig(**cfg), T0, failure_channel=channel)


# -- storage: retention, truncation ----------------------------------------------------------


def test_a_failed_segment_deletion_of_retention_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = LogDirFailureChannel(tmp_path)
    mgr = LogManager(tmp_path, LogConfig(retention_ms=1000), channel)
    (plog,) = mgr.create_partitions("t", 0, 1, T0)
    plog.append(_batch(), T0)
    plog.roll()
    plog.append(_batch(ts=T0 + 5000), T0 + 5000)
    plog.sync()
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).endswith(".log"):
            _eio()
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(LogDirOfflineError):  # before: logged, the pass went on, the directory stayed online
        mgr.retention_pass(T0 + 3000)
    monkeypatch.undo()
    assert channel.offline and channel.cause == "retention of t-0: Input/output error"
    with pytest.raises(LogDirOfflineError):  # nothing more is written
        plog.append(_batch(), T0 + 6000)
    with pytest.raises(LogDirOfflineError):  # nor deleted
        mgr.retention_pass(T0 + 3000)
    mgr.abandon()


def test_a_failed_log_start_checkpoint_of_delete_records_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = LogDirFailureChannel(tmp_path)
    plog = _log(tmp_path, channel)
    for _ in range(3):
        plog.append(_batch(), T0)
    plog.sync()
    monkeypatch.setattr("oncelog.storage.log.atomic_write", _enospc)
    with pytest.raises(LogDirOfflineError):
        plog.delete_records_before(2)
    assert channel.cause == "DeleteRecords of t-0: No space left on device"
    plog.abandon()


def test_a_failed_truncation_of_the_txn_index_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """truncate_txn_indexes (the partition's reload of its producer state) cuts .txnindex files:
    Kafka's truncateTo runs under maybeHandleIOException."""
    channel = LogDirFailureChannel(tmp_path)
    plog = _log(tmp_path, channel)
    plog.append(_batch(), T0)
    plog.append_aborted_txn(AbortedTxn(1000, 0, 0, 1))
    monkeypatch.setattr(txn_index_mod.os, "ftruncate", _eio)
    with pytest.raises(LogDirOfflineError):
        plog.truncate_txn_indexes(0)
    assert channel.cause == "truncation of the aborted-transaction indexes of t-0: Input/output error"
    plog.abandon()


def test_an_error_of_a_deleted_log_leaves_the_directory_online(tmp_path: Path) -> None:
    """The cleaner's clean-up of a log whose topic was deleted meanwhile finds its directory gone:
    no disk failure (Kafka aborts the cleaning before deleting a log)."""
    channel = LogDirFailureChannel(tmp_path)
    plog = _log(tmp_path, channel)
    plog.append(_batch(), T0)
    plog.roll()
    seg = plog.new_cleaned_segment(0)
    plog.delete()
    with pytest.raises(OSError) as info:
        plog.abort_cleaned([seg])
    assert not isinstance(info.value, LogDirOfflineError) and not channel.offline
    assert seg.fd < 0  # its descriptor is closed all the same


# -- storage: the cleaner's swap and checkpoint -----------------------------------------------


def _compacted(tmp_path: Path, channel: LogDirFailureChannel) -> PartitionLog:
    plog = _log(tmp_path, channel, segment_bytes=400, cleanup_policy=["compact"])
    for i in range(30):
        plog.append(encode_record_batch([Record(b"k%d" % (i % 3), b"v%d" % i)], base_timestamp=T0), T0)
    plog.sync()
    return plog


def test_a_failed_rename_of_the_cleaners_swap_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = LogDirFailureChannel(tmp_path)
    plog = _compacted(tmp_path, channel)
    pinned = plog.pin_segments(plog.active_segment.base_offset)
    seg = plog.new_cleaned_segment(pinned[0].base_offset)
    for p in pinned:
        for h, b in p.batches():
            seg.append([bytes(b)], len(b), h.base_offset, h.next_offset, h.max_timestamp, T0)
    monkeypatch.setattr("oncelog.storage.log.os.rename", _eio)
    with pytest.raises(LogDirOfflineError):
        plog.commit_cleaned([seg], [(seg.base_offset, pinned[-1].next_base)])
    monkeypatch.undo()
    assert channel.cause == "compaction swap of t-0: Input/output error"
    with pytest.raises(LogDirOfflineError):  # and nothing is installed after that
        plog.install_cleaned(pinned, seg)
    assert plog.segments[0] is pinned[0].segment
    for p in pinned:
        p.close()
    seg.close()
    plog.abandon()


def test_a_failed_cleaner_checkpoint_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = LogDirFailureChannel(tmp_path)
    plog = _compacted(tmp_path, channel)
    monkeypatch.setattr("oncelog.storage.log.atomic_write", _enospc)
    with pytest.raises(LogDirOfflineError):
        plog.write_cleaner_checkpoint(5)
    assert channel.cause == "cleaner checkpoint of t-0: No space left on device"
    plog.abandon()


# -- broker: producer snapshots, the cleaner's pass, its deleter --------------------------------


def _broker(tmp_path: Path) -> Broker:
    return Broker(BrokerConfig(data_dir=tmp_path / "data"))


def test_a_failed_producer_snapshot_at_a_roll_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the snapshot's error was logged and the roll went on (the snapshot is only an
    optimisation, but its failed write leaves the directory in the same doubt as any other)."""
    broker = _broker(tmp_path)
    try:
        broker.create_topic("t", 1)
        part = broker.partition("t", 0)
        part.log.append(_batch(), T0)
        monkeypatch.setattr("oncelog.broker.partition.write_offset_named", _enospc)
        with pytest.raises(LogDirOfflineError):
            part.log.roll()
        monkeypatch.undo()
        assert broker.log_dir.cause == "producer snapshot of t-0: No space left on device"

        async def main() -> None:
            (p,) = (await call(broker, 0, 9, produce(_batch()))).responses[0].partition_responses
            assert p.error_code == E.kafka_storage_error

        asyncio.run(main())
    finally:
        broker.close()
    assert not (tmp_path / "data" / "t-0" / ".clean_shutdown").exists()


def _compacted_topic(broker: Broker) -> Any:
    broker.create_topic("c", 1, configs={"cleanup.policy": "compact", "segment.bytes": "1024",
                                         "min.cleanable.dirty.ratio": "0.01"})
    part = broker.partition("c", 0)
    for i in range(60):
        part.log.append(encode_record_batch([Record(b"k%d" % (i % 3), b"v%d" % i)], base_timestamp=T0), T0)

    async def durable() -> None:  # the high watermark (and so the last stable offset) moves up
        await broker.committer.wait_durable(part)

    asyncio.run(durable())
    assert part.high_watermark == 60
    return part


async def _one_pass(cleaner: LogCleaner) -> bool:
    cleaner._pool = False  # the pass in the cleaner's thread (no process to spawn)
    cleaner._executor = DaemonThreadExecutor(1, "test-cleaner")
    try:
        return await cleaner.clean_once()
    finally:
        cleaner._executor.shutdown(wait=True)


def test_an_io_error_of_the_cleaners_pass_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An EIO while the cleaner writes its segments (in its job, before any swap step): Kafka's
    cleaner hands an IOException to the LogDirFailureChannel. Before: one ERROR line, and the
    next pass tried again on the same disk."""
    broker = _broker(tmp_path)
    try:
        _compacted_topic(broker)
        monkeypatch.setattr("oncelog.broker.log_cleaner.run_clean_job", _eio)
        cleaner = LogCleaner(broker, CleanerConfig())
        assert asyncio.run(_one_pass(cleaner)) is False
        assert broker.log_dir.offline and broker.log_dir.cause == "compaction of c-0: Input/output error"
    finally:
        broker.close()


def test_the_cleaner_starts_no_pass_once_the_directory_is_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's handleLogDirFailure aborts cleaning of the failed directory's logs. Before: a woken cleaner
    could pick a partition and have its job write .cleaned segments into the offline directory."""
    broker = _broker(tmp_path)
    try:
        part = _compacted_topic(broker)
        jobs: list[Any] = []
        monkeypatch.setattr("oncelog.broker.log_cleaner.run_clean_job", jobs.append)
        cleaner = LogCleaner(broker, CleanerConfig())
        chosen = cleaner.choose(broker.clock())
        assert chosen is not None and chosen[0] is part
        broker.log_dir.failed("fsync of t-0", OSError(errno.EIO, "Input/output error"))
        assert cleaner.choose(broker.clock()) is None
        assert asyncio.run(_one_pass(cleaner)) is False
        # a pass chosen just before the failure writes nothing either
        cleaner._executor = DaemonThreadExecutor(1, "test-cleaner")
        cleaner._pool = False
        try:
            assert asyncio.run(cleaner.clean_partition(part, chosen[1], broker.clock())) is None
        finally:
            cleaner._executor.shutdown(wait=True)
        assert jobs == [] and not list(part.log.directory.glob("*.cleaned"))
    finally:
        broker.close()


def test_a_segment_deleted_under_the_cleaners_job_leaves_the_directory_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention or DeleteRecords may delete a segment the cleaner's job is reading (the job opens the
    files itself): no disk failure, the pass is given up and logged."""
    broker = _broker(tmp_path)
    try:
        _compacted_topic(broker)

        def gone(job: Any) -> Any:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")

        monkeypatch.setattr("oncelog.broker.log_cleaner.run_clean_job", gone)
        cleaner = LogCleaner(broker, CleanerConfig())
        assert asyncio.run(_one_pass(cleaner)) is False
        assert not broker.log_dir.offline
        monkeypatch.undo()
        assert asyncio.run(_one_pass(cleaner)) is True  # the next pass cleans
    finally:
        broker.close()


def test_a_failed_swap_step_of_the_cleaners_pass_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    try:
        part = _compacted_topic(broker)
        segments = list(part.log.segments)
        real_rename = os.rename

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if str(src).endswith(".cleaned"):
                _eio()
            real_rename(src, dst, *args, **kwargs)

        monkeypatch.setattr("oncelog.storage.log.os.rename", rename)
        cleaner = LogCleaner(broker, CleanerConfig())
        assert asyncio.run(_one_pass(cleaner)) is False
        assert broker.log_dir.cause == "compaction swap of c-0: Input/output error"
        assert part.log.segments == segments  # nothing installed
    finally:
        broker.close()


def test_a_failed_removal_of_replaced_segments_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = LogDirFailureChannel(tmp_path)
    gone, failing = tmp_path / "00000000000000000000.log.deleted", tmp_path / "00000000000000000007.log.deleted"
    failing.write_bytes(b"x" * 100)
    deleter = _Deleter(channel)
    monkeypatch.setattr("oncelog.storage.fileutil.os.unlink", _eio)
    deleter.submit([gone, failing])  # a file already gone is no failure; the next one's EIO is
    assert deleter._thread is not None
    deleter._thread.join(5)
    assert not deleter._thread.is_alive()  # it stops removing once the directory is offline
    assert channel.cause == "removal of " + tmp_path.name + "/00000000000000000007.log.deleted: Input/output error"


# -- broker: the coordinators' snapshots, end to end through requests --------------------------


def test_a_failed_offsets_store_snapshot_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    try:
        broker.create_topic("t", 1)

        async def main() -> None:
            c = await call(broker, OFFSET_COMMIT, 8, offset_commit())
            assert c.topics[0].partitions[0].error_code == 0
            monkeypatch.setattr("oncelog.broker.group.offsets.write_offset_named", _enospc)
            with pytest.raises(LogDirOfflineError):  # before: an OSError, the directory online
                broker.groups.store.maybe_snapshot(force=True)
            monkeypatch.undo()
            assert broker.log_dir.cause == "offsets store snapshot of __consumer_offsets-0: No space left on device"
            o = await call(broker, OFFSET_FETCH, 8, {"groups": [{"group_id": "g", "topics": None}],
                                                     "require_stable": False})
            assert o.groups[0].error_code == E.not_coordinator
            fc = await call(broker, FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["g"]})
            assert fc.coordinators[0].error_code == E.coordinator_not_available

        asyncio.run(main())
    finally:
        broker.close()


def test_a_failed_transaction_log_snapshot_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    try:
        async def main() -> None:
            r = await call(broker, INIT_PRODUCER_ID, 4, init_txn())
            assert r.error_code == 0
            monkeypatch.setattr("oncelog.broker.txn.keyed_log.write_offset_named", _eio)
            with pytest.raises(LogDirOfflineError):
                broker.txn_log.maybe_snapshot(force=True)
            monkeypatch.undo()
            assert broker.log_dir.cause == "snapshot of __transaction_state-0: Input/output error"
            t = await call(broker, INIT_PRODUCER_ID, 4, init_txn())
            assert t.error_code == E.not_coordinator

        asyncio.run(broker.txn.start())
        asyncio.run(main())
    finally:
        broker.close()


def test_delete_records_whose_checkpoint_fails_answers_kafka_storage_error_and_stops_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    try:
        broker.create_topic("t", 1)

        async def main() -> None:
            for v in (b"a", b"b", b"c"):
                (p,) = (await call(broker, 0, 9, produce(_batch(v)))).responses[0].partition_responses
                assert p.error_code == 0
            monkeypatch.setattr("oncelog.storage.log.atomic_write", _eio)
            d = await call(broker, DELETE_RECORDS, 2, {
                "topics": [{"name": "t", "partitions": [{"partition_index": 0, "offset": 2}]}], "timeout": 1000})
            assert d.topics[0].partitions[0].error_code == E.kafka_storage_error
            monkeypatch.undo()
            assert broker.log_dir.cause == "DeleteRecords of t-0: Input/output error"
            (p,) = (await call(broker, 0, 9, produce(_batch()))).responses[0].partition_responses
            assert p.error_code == E.kafka_storage_error  # before: 0, the broker went on
            c = await call(broker, OFFSET_COMMIT, 8, offset_commit())
            assert c.topics[0].partitions[0].error_code == E.not_coordinator

        asyncio.run(main())
    finally:
        broker.close()


def test_a_failed_write_of_the_producer_id_block_takes_the_directory_offline_and_issues_no_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next block's end is written before any of its ids is handed out. Before: the block end
    was raised in memory first, so after a failed write the next InitProducerId was answered with
    an id of the unwritten block, which a restart hands out again."""
    broker = _broker(tmp_path)
    try:
        async def main() -> None:
            body = {"transactional_id": None, "transaction_timeout": -1, "producer_id": -1, "producer_epoch": -1}
            monkeypatch.setattr("oncelog.broker.producer_ids.atomic_write", _enospc)
            r = await call(broker, INIT_PRODUCER_ID, 4, body)
            assert r.error_code == E.not_coordinator and r.producer_id == -1
            assert broker.log_dir.cause == "write of the producer-id block: No space left on device"
            monkeypatch.undo()
            r = await call(broker, INIT_PRODUCER_ID, 4, body)
            assert r.error_code == E.not_coordinator and r.producer_id == -1  # still nothing written, no id

        asyncio.run(main())
    finally:
        broker.close()
    again = _broker(tmp_path)
    try:
        assert again.producer_ids.generate() == 0  # no id was ever issued
    finally:
        again.close()


def test_a_transactional_init_producer_id_whose_block_write_fails_answers_not_coordinator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new transactional id needs a new producer id, and the block's write fails (review of iofail,
    finding 2): the coordinator answers NOT_COORDINATOR, as the idempotent path does (Kafka's
    handleInitProducerId answers a failed generateProducerId with an error code). Before: the
    LogDirOfflineError escaped handle_frame (a traceback, the connection closed)."""
    broker = _broker(tmp_path)
    try:
        async def main() -> None:
            monkeypatch.setattr("oncelog.broker.producer_ids.atomic_write", _enospc)
            r = await call(broker, INIT_PRODUCER_ID, 4, init_txn("tx"))
            assert r.error_code == E.not_coordinator and r.producer_id == -1
            monkeypatch.undo()
            assert broker.log_dir.cause == "write of the producer-id block: No space left on device"
            r = await call(broker, INIT_PRODUCER_ID, 4, init_txn("tx2"))  # offline: still an error code
            assert r.error_code == E.not_coordinator and r.producer_id == -1
            assert broker.txn.metadata("tx") is None and broker.txn.metadata("tx2") is None

        asyncio.run(broker.txn.start())
        asyncio.run(main())
    finally:
        broker.close()


def test_a_failed_write_of_the_leader_epoch_checkpoint_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """become_leader writes the new epoch's checkpoint (Kafka's LeaderEpochCheckpointFile goes
    through CheckpointFileWithFailureHandler, which takes the directory offline)."""
    channel = LogDirFailureChannel(tmp_path)
    plog = _log(tmp_path, channel)
    monkeypatch.setattr("oncelog.storage.leader_epoch.write_all", _enospc)
    with pytest.raises(LogDirOfflineError):
        plog.become_leader()
    assert channel.cause == "leader-epoch checkpoint of t-0: No space left on device"
    plog.abandon()
