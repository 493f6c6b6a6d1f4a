"""Jepsen's Bufstream scenario with real clients: a request of transaction N reaches the broker late.

Jepsen (2024) found that in Bufstream a Produce delayed in the network could
land after its client had given up on it and begun the next transaction, and
so leak into that transaction. Here the fault proxy *holds* the first Produce
of transaction N (it is neither forwarded nor answered), the client times
out and moves on, transaction N+1 begins and writes, and only then does the
proxy deliver the held Produce to the broker (on a fresh connection) and
decode the broker's answer. The broker must refuse or deduplicate it, and the
log must not hold the late record in any transaction but its own:

* librdkafka fails the timed-out message (``message.timeout.ms``), which
  makes the transaction abortable and bumps the producer epoch on
  ``abort_transaction`` (KIP-360); the late Produce carries the old epoch and
  gets INVALID_PRODUCER_EPOCH. read_committed then holds only N+1's record.
* kafka-python retries the Produce on a new connection (same sequence number)
  and commits N; the late original arrives during N+1 and is recognised as a
  duplicate of a batch already written (answered without an append), so the
  log holds the record once, in N.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing import EmbeddedBroker, free_port
from oncelog.testing.fault_proxy import PRODUCE, FaultProxy
from oncelog.testing.readback import read_to_eof

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

TOPIC = "late"


@pytest.fixture
def proxied(tmp_path: Path, kit: Any) -> Iterator[tuple[FaultProxy, EmbeddedBroker]]:
    """A broker that advertises the proxy, so every client connection goes through it."""
    port = free_port()
    proxy = FaultProxy(("127.0.0.1", port), seed=1)
    broker = EmbeddedBroker(data_dir=tmp_path / "data", port=port, log_path=tmp_path / "broker.log",
                            config={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"})
    proxy.start()
    try:
        broker.start()
        try:
            kit.create_topic(proxy.bootstrap, TOPIC, 1)
            yield proxy, broker
        finally:
            broker.close()
    finally:
        proxy.stop()


def test_late_produce_of_aborted_transaction_confluent(proxied: tuple[FaultProxy, EmbeddedBroker]) -> None:
    from confluent_kafka import KafkaException, Producer

    proxy, _ = proxied
    reports: list[Any] = []
    p = Producer({"bootstrap.servers": proxy.bootstrap, "transactional.id": "late-confluent",
                  "transaction.timeout.ms": 60_000, "socket.timeout.ms": 3000, "request.timeout.ms": 3000,
                  "message.timeout.ms": 1000, "linger.ms": 0})
    p.init_transactions(30)

    # transaction N: its only Produce is held "in the network"
    p.begin_transaction()
    proxy.hold(PRODUCE)
    p.produce(TOPIC, value=b"late-a", partition=0, on_delivery=lambda err, _m: reports.append(err))
    assert p.flush(15) == 0
    assert proxy.held() == 1
    assert reports[0] is not None and reports[0].code() == -192  # _MSG_TIMED_OUT: the client gave up
    with pytest.raises(KafkaException) as ei:
        p.commit_transaction(15)
    assert ei.value.args[0].txn_requires_abort()
    p.abort_transaction(30)

    # transaction N+1 begins and writes to the same partition
    p.begin_transaction()
    p.produce(TOPIC, value=b"b", partition=0, on_delivery=lambda err, _m: reports.append(err))
    assert p.flush(15) == 0 and reports[1] is None

    # now the held Produce of transaction N arrives
    (late,) = proxy.release_held()
    assert late.api_key == PRODUCE and late.answered, late
    assert late.error_codes == (E.invalid_producer_epoch,), late.error_names
    p.commit_transaction(30)

    assert read_to_eof(proxy.bootstrap, TOPIC, 1) == {0: [b"b"]}
    assert read_to_eof(proxy.bootstrap, TOPIC, 1, committed=False) == {0: [b"b"]}  # never appended at all


def test_late_duplicate_produce_kafka_python(proxied: tuple[FaultProxy, EmbeddedBroker]) -> None:
    from kafka import KafkaProducer

    proxy, _ = proxied
    p = KafkaProducer(bootstrap_servers=proxy.bootstrap, transactional_id="late-kafka-python",
                      request_timeout_ms=2000, linger_ms=0)
    try:
        p.init_transactions()
        # transaction N: the first Produce is held; the client times out and resends it (same sequence)
        p.begin_transaction()
        proxy.hold(PRODUCE)
        first = p.send(TOPIC, value=b"late-a", partition=0).get(20)
        assert proxy.held() == 1
        p.commit_transaction()

        # transaction N+1 writes; then the held original of N's Produce arrives
        p.begin_transaction()
        second = p.send(TOPIC, value=b"b", partition=0).get(20)
        (late,) = proxy.release_held()
        p.commit_transaction()
    finally:
        p.close(5)

    # a duplicate of a batch already in the log: answered, not appended again
    assert late.api_key == PRODUCE and late.answered and late.error_codes == (E.none,), late
    assert (first.offset, second.offset) == (0, 2)  # N's record, N's COMMIT marker, N+1's record
    assert read_to_eof(proxy.bootstrap, TOPIC, 1) == {0: [b"late-a", b"b"]}
    assert read_to_eof(proxy.bootstrap, TOPIC, 1, committed=False) == {0: [b"late-a", b"b"]}
