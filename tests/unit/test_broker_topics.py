"""Topic creation that fails on the disk (EIO, ENOSPC ...) takes the log directory offline, as Kafka's
``LogManager.getOrCreateLog`` does: the request gets KAFKA_STORAGE_ERROR, nothing more is written, and
the next start creates the logs the catalog lists. Running out of file descriptors (EMFILE, ENFILE) is no
disk failure (oncelog opens descriptors lazily; docs/architecture.md): that topic (or those partitions) is
rolled back, the request gets KAFKA_STORAGE_ERROR and the directory stays online. Either way the catalog
and the broker's topics agree, so a retry gets Kafka's answer, never a bare TopicExistsError."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.protocol.records import Record, encode_record_batch
from oncelog.storage import engine
from tests.unit.test_log_dir_offline import call, produce

CREATE_TOPICS = 19


def _broker(tmp_path: Path) -> Broker:
    return Broker(BrokerConfig(data_dir=tmp_path / "data"))


def _fail_opens_after(monkeypatch: pytest.MonkeyPatch, n: int, err: int = errno.EMFILE) -> None:
    real = engine.PartitionLog.open
    opened = 0

    def failing(*args: object, **kwargs: object) -> object:
        nonlocal opened
        opened += 1
        if opened > n:
            raise OSError(err, os.strerror(err))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.PartitionLog, "open", failing)


def _fail_index_opens(monkeypatch: pytest.MonkeyPatch, partition_dir: str, err: int = errno.EMFILE) -> None:
    """os.open of ``<partition_dir>/*.index`` fails: the log's directory and .log file exist by then."""
    real_open = os.open

    def failing_open(path: Any, *args: Any, **kwargs: Any) -> int:
        if f"/{partition_dir}/" in str(path) and str(path).endswith(".index"):
            raise OSError(err, os.strerror(err))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)


@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENFILE])
def test_create_topic_out_of_file_descriptors_rolls_the_topic_back_and_stays_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    broker = _broker(tmp_path)
    _fail_opens_after(monkeypatch, 2, err)  # some partitions opened, then no descriptor
    with pytest.raises(KafkaError) as info:
        broker.create_topic("big", 10)
    assert info.value.code == ErrorCode.kafka_storage_error
    assert not broker.log_dir.offline
    assert "big" not in broker.topics and broker.catalog.get("big") is None
    assert not any(p.name.startswith("big-") for p in (tmp_path / "data").iterdir())
    monkeypatch.undo()
    assert len(broker.create_topic("big", 10).partitions) == 10  # descriptors are back: the retry works
    broker.close()
    reopened = _broker(tmp_path)
    assert len(reopened.topics["big"].partitions) == 10
    reopened.close()


def test_a_half_created_log_is_removed_by_the_rollback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EMFILE on the .index open, after the partition's directory and .log exist."""
    broker = _broker(tmp_path)
    _fail_index_opens(monkeypatch, "t-1")
    with pytest.raises(KafkaError) as info:
        broker.create_topic("t", 2)
    assert info.value.code == ErrorCode.kafka_storage_error
    monkeypatch.undo()
    assert not broker.log_dir.offline and broker.catalog.get("t") is None
    assert not (tmp_path / "data" / "t-0").exists() and not (tmp_path / "data" / "t-1").exists()
    broker.create_topic("t", 2)
    broker.close()


def test_a_log_half_created_when_the_disk_failed_is_loaded_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO on the .index open after the directory and .log exist: offline, and the next start loads
    that half-created log (the catalog lists the topic) and serves it."""
    broker = _broker(tmp_path)
    _fail_index_opens(monkeypatch, "t-0", errno.EIO)
    with pytest.raises(KafkaError):
        broker.create_topic("t", 1)
    monkeypatch.undo()
    assert broker.log_dir.offline and (tmp_path / "data" / "t-0").is_dir()
    broker.close()
    again = _broker(tmp_path)
    try:
        async def main() -> None:
            r = await call(again, 0, 9, produce(encode_record_batch([Record(None, b"v")])))
            assert r.responses[0].partition_responses[0].error_code == 0

        asyncio.run(main())
    finally:
        again.close()


def test_create_topic_disk_error_takes_the_log_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    _fail_opens_after(monkeypatch, 2, errno.EIO)
    with pytest.raises(KafkaError) as info:
        broker.create_topic("big", 10)
    assert info.value.code == ErrorCode.kafka_storage_error
    assert broker.log_dir.offline and "creation of the log big-2" in (broker.log_dir.cause or "")
    monkeypatch.undo()
    with pytest.raises(KafkaError) as info:  # nothing more is written to the directory
        broker.create_topic("other", 1)
    assert info.value.code == ErrorCode.kafka_storage_error
    assert not (tmp_path / "data" / "other-0").exists()
    with pytest.raises(KafkaError) as info:  # a retry: Kafka's code (was a bare TopicExistsError)
        broker.create_topic("big", 10)
    assert info.value.code == ErrorCode.kafka_storage_error
    broker.close()  # abandons: no clean-shutdown marker
    assert not (tmp_path / "data" / "big-0" / ".clean_shutdown").exists()
    reopened = _broker(tmp_path)  # the catalog lists the topic: its logs are created at start
    assert len(reopened.topics["big"].partitions) == 10 and "other" not in reopened.topics
    reopened.close()


def test_a_retried_create_topics_request_after_a_disk_error_answers_kafka_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding 3: the retry (or an auto-create) raised TopicExistsError out of the handler."""
    broker = _broker(tmp_path)
    body = {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1, "assignments": [],
                        "configs": []}], "timeout_ms": 1000, "validate_only": False}

    async def main() -> None:
        _fail_opens_after(monkeypatch, 0, errno.EIO)
        r = await call(broker, CREATE_TOPICS, 5, body)
        assert r.topics[0].error_code == ErrorCode.kafka_storage_error
        monkeypatch.undo()
        r = await call(broker, CREATE_TOPICS, 5, body)
        assert r.topics[0].error_code == ErrorCode.kafka_storage_error
        with pytest.raises(KafkaError) as info:  # Metadata's/Produce's auto-create: the same
            broker.auto_create("t")
        assert info.value.code == ErrorCode.kafka_storage_error
        r = await call(broker, 0, 9, produce(encode_record_batch([Record(None, b"v")])))
        assert r.responses[0].partition_responses[0].error_code != ErrorCode.none

    try:
        asyncio.run(main())
    finally:
        broker.close()


def test_delete_topic_while_offline_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _broker(tmp_path)
    broker.create_topic("t", 1)
    _fail_opens_after(monkeypatch, 0, errno.EIO)
    with pytest.raises(KafkaError):
        broker.create_topic("u", 1)
    assert broker.log_dir.offline
    with pytest.raises(KafkaError) as info:
        broker.delete_topic("t")
    assert info.value.code == ErrorCode.kafka_storage_error
    assert "t" in broker.topics and broker.catalog.get("t") is not None
    broker.close()


@pytest.mark.parametrize("err", [errno.EMFILE, errno.EIO])
def test_create_partitions_failure_keeps_the_old_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    broker = _broker(tmp_path)
    broker.create_topic("t", 2)
    _fail_opens_after(monkeypatch, 1, err)
    with pytest.raises(KafkaError) as info:
        broker.create_partitions("t", 5)
    assert info.value.code == ErrorCode.kafka_storage_error
    assert len(broker.topics["t"].partitions) == 2 and broker.catalog.get("t").num_partitions == 2
    assert broker.log_dir.offline == (err == errno.EIO)
    monkeypatch.undo()
    if err == errno.EMFILE:  # rolled back: no log of the new partitions is left, and a retry works
        assert not (tmp_path / "data" / "t-2").exists()
        broker.create_partitions("t", 5)
        assert len(broker.topics["t"].partitions) == 5
    broker.close()


def test_a_failed_topic_catalog_write_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    broker.create_topic("t", 1)
    from oncelog.storage import catalog

    def enospc(path: object, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(catalog, "atomic_write", enospc)
    with pytest.raises(KafkaError) as info:
        broker.alter_topic_configs("t", {"retention.ms": "1000"})
    assert info.value.code == ErrorCode.kafka_storage_error
    monkeypatch.undo()
    assert broker.log_dir.offline and "topic catalog" in (broker.log_dir.cause or "")
    with pytest.raises(KafkaError) as info:
        broker.create_topic("u", 1)
    assert info.value.code == ErrorCode.kafka_storage_error
    broker.close()


def test_a_failed_leader_epoch_checkpoint_of_a_new_topic_answers_kafka_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new partition writes its first leader epoch after its log is created: a failure there is
    the request's KAFKA_STORAGE_ERROR too (before: a bare OSError out of create_topic)."""
    broker = _broker(tmp_path)

    def enospc(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("oncelog.storage.leader_epoch.write_all", enospc)
    with pytest.raises(KafkaError) as info:
        broker.create_topic("t", 1)
    assert info.value.code == ErrorCode.kafka_storage_error
    assert broker.log_dir.cause == "leader-epoch checkpoint of t-0: No space left on device"
    assert "t" not in broker.topics
    broker.close()


@pytest.mark.parametrize("length", [213, 214, 249])
def test_deleting_a_topic_with_a_long_name_caps_the_delete_directory_name(tmp_path: Path, length: int) -> None:
    """``<topic>-0.<32 hex>-delete`` is 42 characters longer than the topic: over 255 for a
    name of 214..249 characters (legal), so the rename failed (ENAMETOOLONG), the directory
    went offline and every restart failed. The topic part is cut as Kafka's logDeleteDirName does."""
    name = "a" * length
    broker = _broker(tmp_path)
    broker.create_topic(name, 2)
    broker.delete_topic(name)
    assert not broker.log_dir.offline and name not in broker.topics
    assert sorted(p.name for p in (tmp_path / "data").iterdir() if p.name.startswith("a")) == []
    broker.close()
    _broker(tmp_path).close()


def test_a_log_directory_left_by_a_failed_long_name_delete_is_removed_at_start(tmp_path: Path) -> None:
    """Before the cap, the rename failed after the catalog had dropped the topic: its directory
    stays behind, and the start removes it (the same rename) instead of failing for good."""
    name = "b" * 249
    broker = _broker(tmp_path)
    broker.create_topic(name, 1)
    broker.catalog.delete_topic(name)  # what the failed delete left: catalog without, directory with
    broker.close()
    assert (tmp_path / "data" / f"{name}-0").is_dir()
    again = _broker(tmp_path)
    assert not (tmp_path / "data" / f"{name}-0").exists() and name not in again.topics
    assert not any(p.name.endswith("-delete") for p in (tmp_path / "data").iterdir())
    again.close()


def _snapshot_listing_fails(monkeypatch: pytest.MonkeyPatch, part_dir: str, err: int) -> None:
    """os.scandir of ``<data>/<part_dir>`` fails with ``err`` while the partition loads its producer
    state (Partition.__init__ lists its snapshots: Path.glob -> os.scandir), and only then."""
    import sys

    real = os.scandir

    def failing(path: Any = ".") -> Any:
        if str(path).endswith("/" + part_dir):
            f = sys._getframe(1)
            while f is not None:
                if f.f_code.co_name == "_load_producer_state":
                    raise OSError(err, os.strerror(err))
                f = f.f_back
        return real(path)

    monkeypatch.setattr(os, "scandir", failing)


def test_emfile_listing_a_new_partitions_snapshots_rolls_the_topic_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of iofix, finding 1: EMFILE in Partition.__init__ (outside any guard) left the topic in
    the catalog but not in broker.topics (a retry got TOPIC_ALREADY_EXISTS, Metadata and
    DeleteTopics said unknown). It now runs under the log's channel: rolled back, online, and the
    retry creates the topic."""
    broker = _broker(tmp_path)
    _snapshot_listing_fails(monkeypatch, "t-1", errno.EMFILE)
    with pytest.raises(KafkaError) as info:
        broker.create_topic("t", 2)
    assert info.value.code == ErrorCode.kafka_storage_error
    monkeypatch.undo()
    assert not broker.log_dir.offline
    assert "t" not in broker.topics and broker.catalog.get("t") is None
    assert not [p for p in (tmp_path / "data").iterdir() if p.name.startswith("t-")]
    broker.create_topic("t", 2)
    assert len(broker.topics["t"].partitions) == 2
    broker.close()


def test_another_error_listing_a_new_partitions_snapshots_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    _snapshot_listing_fails(monkeypatch, "t-1", errno.EIO)
    with pytest.raises(KafkaError) as info:
        broker.create_topic("t", 2)
    assert info.value.code == ErrorCode.kafka_storage_error
    monkeypatch.undo()
    assert broker.log_dir.offline
    broker.close()
