"""Topic creation that runs out of resources fails alone and leaves nothing behind."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.protocol.errors import ErrorCode, KafkaError


def _broker(tmp_path: Path) -> Broker:
    return Broker(BrokerConfig(data_dir=tmp_path / "data"))


def test_create_topic_out_of_file_descriptors_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _broker(tmp_path)
    real = broker.logs.create_partitions

    def failing(topic: str, n_from: int, n_to: int, now_ms: int, config: object = None) -> object:
        real(topic, n_from, min(n_to, n_from + 2), now_ms)  # some partitions opened, then EMFILE
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(broker.logs, "create_partitions", failing)
    with pytest.raises(KafkaError) as info:
        broker.create_topic("big", 10)
    assert info.value.code == ErrorCode.kafka_storage_error
    assert "big" not in broker.topics and broker.catalog.get("big") is None
    monkeypatch.setattr(broker.logs, "create_partitions", real)
    # the broker keeps working: the same name can be created once resources are back
    topic = broker.create_topic("big", 3)
    assert topic is not None and len(topic.partitions) == 3
    broker.close()
    reopened = _broker(tmp_path)
    assert len(reopened.topics["big"].partitions) == 3
    reopened.close()


def test_create_partitions_failure_keeps_the_old_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _broker(tmp_path)
    broker.create_topic("t", 2)

    def failing(*args: object, **kwargs: object) -> object:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(broker.logs, "create_partitions", failing)
    with pytest.raises(KafkaError) as info:
        broker.create_partitions("t", 5)
    assert info.value.code == ErrorCode.kafka_storage_error
    assert len(broker.topics["t"].partitions) == 2 and broker.catalog.get("t").num_partitions == 2
    broker.close()
