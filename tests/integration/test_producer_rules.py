"""Producer-id rules Kafka applies, against the real broker.

- InitProducerId without a transactional id always answers a new producer
  id with epoch 0 (Kafka's coordinator keeps no epoch for idempotent
  producers): whatever (id, epoch) the request passes, current or stale, it
  is never refused, and it never bumps the id it was given.
- Produce accepts a producer id it has no state for, at any sequence (a
  client still holding its id after the data dir was replaced keeps
  working).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from oncelog.client.connection import Connection
from oncelog.testing import EmbeddedBroker, free_port

INIT_PRODUCER_ID = 22


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[Connection]:
    with EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log") as b:
        with Connection(b.bootstrap, client_id="producer-rules") as c:
            yield c


def init_idempotent(conn: Connection, version: int, pid: int = -1, epoch: int = -1) -> object:
    body: dict[str, object] = {"transactional_id": None, "transaction_timeout": 60_000}
    if version >= 3:
        body |= {"producer_id": pid, "producer_epoch": epoch}
    if version >= 6:
        body |= {"enable2_pc": False, "keep_prepared_txn": False}
    return conn.request(INIT_PRODUCER_ID, version, body)


@pytest.mark.parametrize("version", range(0, 7))
def test_init_producer_id_without_txn_id_is_always_a_new_id_epoch_0(conn: Connection, version: int) -> None:
    first = init_idempotent(conn, version)
    assert (first.error_code, first.producer_epoch) == (0, 0)
    seen = {first.producer_id}
    if version >= 3:
        # the current pair (a KIP-360 bump), the same pair again (a retry), a
        # stale epoch and an id never issued: each gets a new id with epoch 0
        for pid, epoch in [(first.producer_id, 0), (first.producer_id, 0),
                           (first.producer_id, 7), (first.producer_id + 10_000, 3)]:
            r = init_idempotent(conn, version, pid, epoch)
            assert r.error_code == 0, (pid, epoch, r)
            assert r.producer_epoch == 0 and r.producer_id not in seen, (pid, epoch, r)
            seen.add(r.producer_id)
    else:
        r = init_idempotent(conn, version)
        assert r.error_code == 0 and r.producer_epoch == 0 and r.producer_id not in seen


@pytest.mark.parametrize("txn_id", [None, "half-pair"])
@pytest.mark.parametrize("pid, epoch", [(5, -1), (-1, 0), (-5, -1)])
def test_init_producer_id_half_a_pair_is_invalid_request(conn: Connection, pid: int, epoch: int,
                                                         txn_id: str | None) -> None:
    body = {"transactional_id": txn_id, "transaction_timeout": 60_000, "producer_id": pid, "producer_epoch": epoch}
    r = conn.request(INIT_PRODUCER_ID, 4, body)
    assert r.error_code == 42  # INVALID_REQUEST, as Kafka checks before its coordinator
    assert (r.producer_id, r.producer_epoch) == (-1, -1)


def _fresh_broker(tmp_path: Path, name: str, port: int) -> EmbeddedBroker:
    b = EmbeddedBroker(data_dir=tmp_path / name, port=port, log_path=tmp_path / f"{name}.log")
    b.start()
    return b


def _read_values(bootstrap: str, topic: str) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rules-reader", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        deadline = time.monotonic() + 20
        while len(out) < high and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append(m.value())
        return out
    finally:
        c.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_idempotent_producer_keeps_working_after_the_data_dir_is_replaced(tmp_path: Path, client: str) -> None:
    from oncelog.client.admin import Admin

    port = free_port()
    topic = "replaced"
    first = _fresh_broker(tmp_path, "first", port)
    errors: list[Any] = []
    try:
        assert Admin(first.bootstrap).create_topic(topic, partitions=1) is None
        if client == "confluent":
            from confluent_kafka import Producer

            p = Producer({"bootstrap.servers": first.bootstrap, "enable.idempotence": True,
                          "socket.timeout.ms": 5000, "message.timeout.ms": 60_000, "linger.ms": 0})

            def send(value: bytes) -> None:
                p.produce(topic, value=value, partition=0,
                          on_delivery=lambda err, msg: errors.append(err) if err else None)
                assert p.flush(30) == 0
        else:
            from kafka import KafkaProducer

            kp = KafkaProducer(bootstrap_servers=first.bootstrap, enable_idempotence=True, linger_ms=0,
                               request_timeout_ms=5000, retry_backoff_ms=100)
            assert kp._transaction_manager is not None  # idempotent

            def send(value: bytes) -> None:
                try:
                    kp.send(topic, value=value, partition=0).get(timeout=30)
                except Exception as exc:  # noqa: BLE001 - the failure is what the test reports
                    errors.append(exc)
        for i in range(5):
            send(b"a%d" % i)
        assert errors == []
    finally:
        first.close()
    # same address, empty data dir: the broker has no state for the client's producer id
    second = _fresh_broker(tmp_path, "second", port)
    try:
        assert Admin(second.bootstrap).create_topic(topic, partitions=1) is None
        for i in range(5):
            send(b"b%d" % i)
        assert errors == []
        if client == "confluent":
            p.flush(10)
        else:
            kp.close(timeout=10)
        assert _read_values(second.bootstrap, topic) == [b"b%d" % i for i in range(5)]
    finally:
        second.close()
