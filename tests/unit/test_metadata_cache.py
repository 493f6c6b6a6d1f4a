"""Metadata for all topics is encoded once per version and topology: the cached
answer follows every topic creation, deletion and partition increase."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.broker.handlers import metadata
from oncelog.protocol.codec import decode_response


def all_topics(broker: Broker, version: int) -> tuple[bytes, dict[str, int]]:
    ctx = SimpleNamespace(broker=broker, version=version)
    body = asyncio.run(metadata.handle(ctx, SimpleNamespace(topics=None)))  # type: ignore[arg-type]
    assert isinstance(body, bytes)
    decoded: Any = decode_response(metadata.API_KEY, version, body)
    assert [b.node_id for b in decoded.brokers] == [broker.node_id]
    return body, {t.name: len(t.partitions) for t in decoded.topics}


@pytest.mark.parametrize("version", [1, 9, 12])
def test_all_topics_answer_follows_the_topology(tmp_path: Path, version: int) -> None:
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    broker.create_topic("a", 2)
    first, topics = all_topics(broker, version)
    assert topics == {"a": 2}
    again, _ = all_topics(broker, version)
    assert again is first  # reused, not re-encoded

    broker.create_topic("b", 1)
    body, topics = all_topics(broker, version)
    assert topics == {"a": 2, "b": 1} and body is not first
    broker.create_partitions("a", 5)
    assert all_topics(broker, version)[1] == {"a": 5, "b": 1}
    broker.delete_topic("b")
    assert all_topics(broker, version)[1] == {"a": 5}
    assert broker.auto_create("c") is not None
    assert all_topics(broker, version)[1] == {"a": 5, "c": broker.config.num_partitions}


def test_each_version_has_its_own_answer(tmp_path: Path) -> None:
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    broker.create_topic("a", 1)
    v1, _ = all_topics(broker, 1)
    v12, _ = all_topics(broker, 12)
    assert v1 != v12  # v12 is flexible, with topic ids
    assert all_topics(broker, 1)[0] is v1 and all_topics(broker, 12)[0] is v12
