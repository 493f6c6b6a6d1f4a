"""A storage error of the offsets log over the wire: NOT_COORDINATOR, the broker stops, clients recover.

The broker runs in a thread of the test process so the test can make the offsets
log's fdatasync fail (an OSError, as a failing disk gives); everything else is real.
Kafka answers a KAFKA_STORAGE_ERROR of an offsets-log append with NOT_COORDINATOR
(see tests/unit/test_group_write_errors.py). The failed fsync takes the log
directory offline and the broker stops, as Kafka's does when its last log directory
fails; a client that got NOT_COORDINATOR looks the coordinator up again and retries
until the broker is back (restarted on the same port and data directory, the logs
recovered). About 4 s.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition as KafkaTopicPartition

from oncelog.broker.handlers import HANDLERS
from oncelog.broker.server import LogDirFailed
from oncelog.client.connection import Connection
from oncelog.protocol.errors import ErrorCode as E
from oncelog.storage.log import PartitionLog
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "werr"
OFFSET_COMMIT, FIND_COORDINATOR = 8, 10


class Faults:
    """Makes the next ``fail`` fdatasyncs of the offsets log raise EIO; counts FindCoordinator."""

    def __init__(self) -> None:
        self.fail = 0
        self.failed = 0
        self.find_coordinator = 0
        self.lock = threading.Lock()


@pytest.fixture
def faulty(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[EmbeddedBroker, Faults]]:
    faults = Faults()
    real_sync = PartitionLog._sync

    def sync(self: PartitionLog) -> int:
        if self.directory.name == "__consumer_offsets-0":
            with faults.lock:
                if faults.fail > 0:
                    faults.fail -= 1
                    faults.failed += 1
                    raise OSError(5, "Input/output error")
        return real_sync(self)

    monkeypatch.setattr(PartitionLog, "_sync", sync)  # under the log directory's failure channel
    find = HANDLERS[FIND_COORDINATOR]

    async def counting(ctx: Any, request: Any) -> Any:
        with faults.lock:
            faults.find_coordinator += 1
        return await find.handle(ctx, request)

    monkeypatch.setitem(HANDLERS, FIND_COORDINATOR, dataclasses.replace(find, handle=counting))
    b = EmbeddedBroker(data_dir=tmp_path / "data", mode="thread", log_path=tmp_path / "broker.log",
                       config={"group.initial.rebalance.delay.ms": "0", "num.partitions": "2"})
    b.start()
    try:
        yield b, faults
    finally:
        b.close()


def test_offset_commit_answers_not_coordinator_on_the_wire(faulty: tuple[EmbeddedBroker, Faults]) -> None:
    b, faults = faulty
    p = Producer({"bootstrap.servers": b.bootstrap})
    p.produce(TOPIC, b"x", partition=0)
    assert p.flush(10) == 0
    with Connection(b.bootstrap) as c:
        def commit(offset: int) -> int:
            r = c.request(OFFSET_COMMIT, 8, {"group_id": "raw", "generation_id_or_member_epoch": -1, "member_id": "",
                                             "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
                                                 {"partition_index": 0, "committed_offset": offset,
                                                  "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
            return int(r.topics[0].partitions[0].error_code)

        faults.fail = 1
        assert commit(1) == E.not_coordinator
        assert faults.failed == 1
    stopped(b)
    b.start()  # an operator restarts the broker: recovery, then the retry is written
    with Connection(b.bootstrap) as c:
        assert commit(1) == 0


def stopped(b: EmbeddedBroker, timeout: float = 10) -> None:
    """Wait until the broker stopped by itself after its log directory failed; clean up."""
    deadline = time.monotonic() + timeout
    while b.running:
        assert time.monotonic() < deadline, "the broker kept running after its log directory failed"
        time.sleep(0.02)
    assert isinstance(b.failure, LogDirFailed), b.failure
    b.stop()


def test_kafka_python_consumer_commit_recovers_by_finding_the_coordinator_again(
    faulty: tuple[EmbeddedBroker, Faults],
) -> None:
    """kafka-python marks the coordinator dead on NOT_COORDINATOR, looks it up again and
    retries the commit, which succeeds once the broker is back (restarted after it stopped).
    (librdkafka 2.16 re-queries the coordinator too, for COORDINATOR_NOT_AVAILABLE as for
    NOT_COORDINATOR, but on a one-broker cluster it stays in the coordinator query until its
    session times out, then rejoins: no client recovery worth asserting here.)"""
    b, faults = faulty
    p = KafkaProducer(bootstrap_servers=b.bootstrap)
    for i in range(10):
        p.send(TOPIC, b"v%d" % i, partition=i % 2)
    p.flush(10)
    p.close()
    c = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id="werr-g", auto_offset_reset="earliest",
                      enable_auto_commit=False)
    try:
        c.subscribe([TOPIC])
        got = 0
        deadline = time.monotonic() + 30
        while got < 10 and time.monotonic() < deadline:
            got += sum(len(v) for v in c.poll(500).values())
        assert got == 10
        before = faults.find_coordinator
        faults.fail = 1
        restarted = threading.Thread(target=lambda: (stopped(b), b.start()))
        restarted.start()
        try:
            c.commit()  # NOT_COORDINATOR, FindCoordinator, retries until the restarted broker answers
        finally:
            restarted.join(30)
        assert faults.failed == 1
        assert faults.find_coordinator >= before + 1
        assert [c.committed(KafkaTopicPartition(TOPIC, i)) for i in range(2)] == [5, 5]
    finally:
        c.close()
