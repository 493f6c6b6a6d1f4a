"""A marker whose fsync failed: the broker stops, and the restarted coordinator writes it again.

When the fdatasync of a marker round fails, the log directory goes offline and the
broker stops (a failed fsync is never retried: docs/groups.md). The marker is in
the file (only its fsync failed), so the restarted broker recovers it; its
transaction coordinator, finding the transaction prepared, writes the markers
again. The partition (and the offsets log) then holds two COMMIT (or ABORT)
markers for one transaction, as a Kafka partition does when the coordinator
retries WriteTxnMarkers after an error raised once the marker was appended. The
second marker finds no open transaction: it completes nothing, adds no
aborted-transaction entry and moves neither the last stable offset nor the
offsets. This test shows what readers see: every committed record once, no
aborted one, the transactional offsets committed once; the same after a clean
restart (the markers are replayed). The broker runs in a thread of the test
process so the test can make the fsyncs fail; the clients stay connected to its
port across the restarts. About 5 s a client.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.broker.handlers import HANDLERS
from oncelog.broker.server import LogDirFailed
from oncelog.client import Producer as OncelogProducer
from oncelog.protocol.records import LOG_OVERHEAD, parse_batch_header, read_control_marker
from oncelog.storage.log import PartitionLog
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(120)

TOPIC, SOURCE, GROUP = "dup", "dup-src", "dup-g"
END_TXN = 26


class Faults:
    """The next ``fail[directory name]`` fdatasyncs of that log raise EIO."""

    def __init__(self) -> None:
        self.fail: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.lock = threading.Lock()

    def pending(self) -> int:
        with self.lock:
            return sum(self.fail.values())


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    f = Faults()
    real_sync = PartitionLog._sync

    def sync(self: PartitionLog) -> int:
        name = self.directory.name
        with f.lock:
            if f.fail.get(name, 0) > 0:
                f.fail[name] -= 1
                f.failed[name] = f.failed.get(name, 0) + 1
                raise OSError(5, "Input/output error")
        return real_sync(self)

    monkeypatch.setattr(PartitionLog, "_sync", sync)  # under the log directory's failure channel
    return f


def start(data: Path, log: Path) -> EmbeddedBroker:
    # the coordinator's timers (which retry failed markers) every 100 ms
    return EmbeddedBroker(data_dir=data, mode="thread", log_path=log, config={
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100"}).start()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = start(tmp_path / "data", tmp_path / "broker.log")
    try:
        yield b
    finally:
        b.close()


def wait_for(cond: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def read_all(bootstrap: str, isolation: str) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}", "enable.auto.commit": False,
                  "isolation.level": isolation, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return values
                raise AssertionError(m.error())
            values.append(m.value())
        raise AssertionError(f"no end of partition after {values}")
    finally:
        c.close()


def markers(directory: Path) -> list[tuple[int, bool]]:
    """(producer id, commit) of every control batch in the log's segments, in order."""
    out = []
    for seg in sorted(directory.glob("*.log")):
        data = seg.read_bytes()
        pos = 0
        while pos + LOG_OVERHEAD < len(data):
            hdr = parse_batch_header(data, pos)
            if hdr.is_control:
                out.append((hdr.producer_id, read_control_marker(data, pos).commit))
            pos += LOG_OVERHEAD + hdr.batch_length
    return out


def committed_offset(bootstrap: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        (tp,) = c.committed([TopicPartition(SOURCE, 0)], timeout=10)
        return int(tp.offset)
    finally:
        c.close()


@pytest.mark.parametrize("client", ["confluent-kafka", "oncelog"])
def test_rewritten_markers_leave_each_committed_record_once_and_no_aborted_one(
    broker: EmbeddedBroker, faults: Faults, tmp_path: Path, client: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka (EndTxn v1: transaction version 1, markers at the transaction's epoch) and
    oncelog's producer (EndTxn v5: transaction version 2, markers at the bumped epoch; the
    rewrite is the same-epoch retry that check_marker accepts as a no-op)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, 1, 1), NewTopic(SOURCE, 1, 1)]).values():
        f.result(10)
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": GROUP})
    config = {"bootstrap.servers": broker.bootstrap, "transactional.id": "dup-tx"}
    p: Any = Producer(config) if client == "confluent-kafka" else OncelogProducer(config)
    ends = []
    end_txn = HANDLERS[END_TXN]

    async def recording(ctx: Any, request: Any) -> Any:
        ends.append(ctx.version)
        return await end_txn.handle(ctx, request)

    monkeypatch.setitem(HANDLERS, END_TXN, dataclasses.replace(end_txn, handle=recording))
    p.init_transactions(10)

    def transaction(prefix: str, commit: bool, offset: int | None = None, **fail: int) -> None:
        p.begin_transaction()
        for i in range(5):
            p.produce(TOPIC, f"{prefix}{i}".encode(), partition=0)
        assert p.flush(10) == 0  # durable: only the marker round's fsync is left to fail
        if offset is not None:
            meta = group.consumer_group_metadata() if client == "confluent-kafka" else GROUP
            p.send_offsets_to_transaction([TopicPartition(SOURCE, 0, offset)], meta, 10)
        with faults.lock:
            faults.fail.update(fail)
        if commit:
            p.commit_transaction(10)
        else:
            p.abort_transaction(10)
        if fail:
            wait_for(lambda: faults.pending() == 0, f"the armed fsync failures of {prefix}")
            wait_for(lambda: not broker.running, "the broker to stop after its log directory failed")
            assert isinstance(broker.failure, LogDirFailed), broker.failure
            broker.stop()
            broker.start()  # same port and data: recovery, then the coordinator completes the transaction

    try:
        # the marker round of each of the first two transactions fails on the data partition:
        # the broker stops, and the restarted one writes the markers again (the offsets log's
        # too: the first transaction's markers were appended together)
        transaction("c", True, offset=42, **{"dup-0": 1})
        transaction("a", False, **{"dup-0": 1})
        transaction("k", True)  # the next transaction is untouched by the duplicates
        assert faults.failed == {"dup-0": 2}
        assert set(ends) == ({1} if client == "confluent-kafka" else {5}), ends
        expected = [f"{x}{i}".encode() for x in "ck" for i in range(5)]
        wait_for(lambda: read_all(broker.bootstrap, "read_committed") == expected, "the committed records")
        assert read_all(broker.bootstrap, "read_committed") == expected
        # the aborted records are in the log, once
        assert read_all(broker.bootstrap, "read_uncommitted") == [
            f"{x}{i}".encode() for x in "cak" for i in range(5)]
        assert committed_offset(broker.bootstrap) == 42
        # the logs as written (read while the broker idles: a clean shutdown snapshots the
        # offsets log and drops its segments)
        data = tmp_path / "data"
        dup = markers(data / "dup-0")
        pids = {pid for pid, _ in dup}
        assert len(pids) == 1, dup
        # COMMIT and ABORT written twice: the failed marker became durable with its rewrite
        assert [commit for _, commit in dup] == [True, True, False, False, True]
        assert [commit for pid, commit in markers(data / "__consumer_offsets-0") if pid in pids] == [True, True]
    finally:
        p.flush(5)
        if client == "oncelog":
            p.close()
        group.close()
    broker.stop()

    # after a restart the markers are replayed: the same records, offsets and stable offset
    again = start(data, tmp_path / "broker2.log")
    try:
        assert read_all(again.bootstrap, "read_committed") == expected
        assert committed_offset(again.bootstrap) == 42
    finally:
        again.close()
