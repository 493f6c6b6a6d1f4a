"""BrokerMarkerWriter: each partition of a marker round gets its own outcome."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.broker.group import TopicPartition
from oncelog.protocol.errors import ErrorCode


def test_fsync_error_fails_only_the_partitions_whose_marker_is_not_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        broker.create_topic("t", 3)
        good0, bad, good2 = (broker.partition("t", i) for i in range(3))
        real_sync = bad.log.sync

        def failing_sync() -> int:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(bad.log, "sync", failing_sync)
        pid = broker.producer_ids.generate()
        tps = [TopicPartition("t", i) for i in range(3)]

        def write(partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
            return asyncio.run(broker.markers.write_markers(pid, 0, 0, True, partitions))

        assert write(tps) == {tps[0]: 0, tps[1]: int(ErrorCode.kafka_storage_error), tps[2]: 0}
        # a partition answered NONE has its marker durable and visible
        for p in (good0, good2):
            assert p.log.durable_end_offset == 1
            assert p.high_watermark == 1 and p.last_stable_offset == 1
        assert bad.high_watermark == 0  # not durable: not visible

        # the coordinator retries the failed partition only; it works once fsync does
        monkeypatch.setattr(bad.log, "sync", real_sync)
        assert write([tps[1]]) == {tps[1]: 0}
        assert bad.high_watermark == bad.log.log_end_offset == bad.log.durable_end_offset
        assert good0.log.log_end_offset == good2.log.log_end_offset == 1
    finally:
        broker.close()


def test_a_failed_marker_append_fails_only_that_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write error of one partition's marker append (ENOSPC) answers KAFKA_STORAGE_ERROR for
    that partition only: the markers appended to the others are awaited and answered NONE (the
    error escaped the whole call: the coordinator rewrote every marker, and the admin's
    WriteTxnMarkers closed the connection)."""
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        broker.create_topic("t", 3)
        good0, bad, good2 = (broker.partition("t", i) for i in range(3))

        def full(*_a: object, **_k: object) -> object:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(bad.log, "append_control", full)
        pid = broker.producer_ids.generate()
        tps = [TopicPartition("t", i) for i in range(3)]
        for strict in (False, True):
            errors = asyncio.run(broker.markers.write_markers(pid, 0, 0, True, tps, strict=strict))
            assert errors == {tps[0]: 0, tps[1]: int(ErrorCode.kafka_storage_error), tps[2]: 0}
        for p in (good0, good2):
            assert p.log.durable_end_offset == p.high_watermark == 2  # both markers durable
        assert bad.log.log_end_offset == 0
    finally:
        broker.close()
