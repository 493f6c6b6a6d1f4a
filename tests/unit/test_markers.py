"""BrokerMarkerWriter: each partition of a marker round gets its own outcome."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.broker.group import TopicPartition
from oncelog.protocol.errors import ErrorCode


def test_an_fsync_error_fails_the_whole_marker_round_and_every_later_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One partition's fdatasync fails: the log directory goes offline, so every partition of
    the round answers KAFKA_STORAGE_ERROR (none is reported durable, not even those whose own
    fdatasync returned 0) and the coordinator's retry is refused without writing anything.
    (Before: the failed partition alone was retried, and a later fsync was trusted to cover the
    marker whose fsync had failed.)"""
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        broker.create_topic("t", 3)
        parts = [broker.partition("t", i) for i in range(3)]
        bad = parts[1]

        def failing_sync() -> int:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(bad.log, "_sync", failing_sync)  # under the log directory's failure channel
        pid = broker.producer_ids.generate()
        tps = [TopicPartition("t", i) for i in range(3)]

        def write(partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
            return asyncio.run(broker.markers.write_markers(pid, 0, 0, True, partitions))

        storage_error = int(ErrorCode.kafka_storage_error)
        assert write(tps) == dict.fromkeys(tps, storage_error)
        assert broker.log_dir.offline
        assert [p.high_watermark for p in parts] == [0, 0, 0]  # nothing reported durable
        monkeypatch.undo()
        assert write([tps[1]]) == {tps[1]: storage_error}
        assert [p.log.log_end_offset for p in parts] == [1, 1, 1]  # the retry wrote nothing
        assert [p.high_watermark for p in parts] == [0, 0, 0]
    finally:
        broker.close()
    # closed without writing: no clean-shutdown marker, so the next start recovers the logs
    assert not list((tmp_path / "data").glob("t-*/.clean_shutdown"))


def test_a_failed_marker_append_takes_the_log_directory_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write error of one partition's marker append (ENOSPC) answers KAFKA_STORAGE_ERROR and, as
    an IOException of a Kafka append does, takes the log directory offline: the markers of the
    other partitions of the call are not reported durable either (the error no longer escapes
    the whole call, which closed the admin's WriteTxnMarkers connection)."""
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        broker.create_topic("t", 3)
        parts = [broker.partition("t", i) for i in range(3)]
        bad = parts[1]

        def full(*_a: object, **_k: object) -> object:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(bad.log, "_append", full)
        pid = broker.producer_ids.generate()
        tps = [TopicPartition("t", i) for i in range(3)]
        storage_error = int(ErrorCode.kafka_storage_error)
        for strict in (False, True):
            errors = asyncio.run(broker.markers.write_markers(pid, 0, 0, True, tps, strict=strict))
            assert errors == dict.fromkeys(tps, storage_error)
        assert broker.log_dir.offline
        # partition 0's marker was appended before the error, partition 2's was refused
        assert [p.log.log_end_offset for p in parts] == [1, 0, 0]
        assert [p.high_watermark for p in parts] == [0, 0, 0]
    finally:
        broker.close()
