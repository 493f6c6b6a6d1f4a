"""The sans-IO parts of the producer's transactions: PreparedTxnState, the accepted offsets and
group-metadata shapes, the config rule for 2PC (the protocol is tested in
tests/integration/test_client_transactions.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from oncelog.client import ConfigError, ConsumerGroupMetadata, PreparedTxnState, TopicPartition
from oncelog.client.aio.transactions import group_metadata_of, offsets_of
from oncelog.client.config import parse_config


def test_prepared_txn_state_round_trip() -> None:
    s = PreparedTxnState(123, 45)
    assert str(s) == "123:45" and s.has_transaction()
    assert PreparedTxnState.from_string(str(s)) == s
    assert PreparedTxnState.from_string("") == PreparedTxnState() and str(PreparedTxnState()) == ""
    assert PreparedTxnState.from_string(None) == PreparedTxnState()
    assert PreparedTxnState(1, 2) != PreparedTxnState(1, 3)
    for bad in ("123", "1:2:3", "a:1", "1:b", "-1:0", "0:-1", "1:40000"):
        with pytest.raises(ValueError):
            PreparedTxnState.from_string(bad)


def test_group_metadata_shapes() -> None:
    assert group_metadata_of("g") == ConsumerGroupMetadata("g", -1, "", None)
    full = ConsumerGroupMetadata("g", 7, "m-1", "static-1")
    assert group_metadata_of(full) is full

    @dataclass
    class Other:  # e.g. the group member's own class: duck-typed
        group_id: str
        generation_id: int
        member_id: str
        group_instance_id: str | None

    assert group_metadata_of(Other("g", 3, "m", None)) == ConsumerGroupMetadata("g", 3, "m", None)
    assert group_metadata_of({"group_id": "g", "generation_id": 2, "member_id": "x"}) == \
        ConsumerGroupMetadata("g", 2, "x", None)
    for bad in ("", {"generation_id": 1}, object(), ConsumerGroupMetadata("g", 3, "")):
        with pytest.raises(ValueError):
            group_metadata_of(bad)


def test_offsets_shapes() -> None:
    assert offsets_of({("t", 0): 5, TopicPartition("t", 1): (7, "meta")}) == {
        ("t", 0): (5, None, -1), ("t", 1): (7, "meta", -1)}
    assert offsets_of([TopicPartition("t", 2, 9)]) == {("t", 2): (9, None, -1)}

    @dataclass
    class OAM:
        offset: int
        metadata: str | None = None
        leader_epoch: int | None = 4

    assert offsets_of({("t", 3): OAM(11, "m")}) == {("t", 3): (11, "m", 4)}
    with pytest.raises(ValueError):
        offsets_of([TopicPartition("t", 0)])  # no offset (-1001)


def test_two_phase_commit_config_rules() -> None:
    with pytest.raises(ConfigError, match="transactional.id"):
        parse_config({"bootstrap.servers": "h:1", "transaction.two.phase.commit.enable": True}, "producer")
    cfg = parse_config({"bootstrap.servers": "h:1", "transaction.two.phase.commit.enable": "true",
                        "transactional.id": "t"}, "producer")
    assert cfg["transaction.two.phase.commit.enable"] is True
    with pytest.raises(ConfigError, match="transaction.timeout.ms"):  # Kafka 4.1: 2PC transactions never expire
        parse_config({"bootstrap.servers": "h:1", "transaction.two.phase.commit.enable": True,
                      "transactional.id": "t", "transaction.timeout.ms": 60000}, "producer")
