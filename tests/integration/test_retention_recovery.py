"""Producer state across retention and kill -9 (librdkafka clients).

The partition snapshots its producer state at segment rolls. A snapshot taken
while a transaction was open, and before an idempotent producer's later
batches, must never be used once retention deleted the segments holding the
marker and those batches: it would bring the finished transaction back (its
first offset pinned below the log start, the last stable offset stuck there,
read_committed consumers stalled) and rewind the idempotent producer's
sequence (its next batch OUT_OF_ORDER_SEQUENCE_NUMBER).

Scenario (one partition, ``segment.bytes=300``): a transaction opens at
offset 0, an idempotent producer's batches roll a segment while it is open
(snapshot with the open transaction), the transaction commits, the idempotent
producer writes once more (no roll); then ``retention.ms=1000`` lets retention
roll the active segment and delete every older one. Both orders are covered:

* ``retention-then-kill``: retention runs, then kill -9, restart;
* ``kill-then-retention``: kill -9 first (the stale snapshot present and its
  segments still there), restart, retention runs in the new process, kill -9
  again, restart.

After the last restart, the same idempotent producer (one librdkafka
instance across the restarts) writes more, and a read_committed consumer
must read up to the new high watermark; librdkafka must report no
OUT_OF_ORDER_SEQUENCE_NUMBER (it would otherwise bump the epoch and carry
on, so its error callback and delivery reports are checked, and the new
records must get the offsets right after the old log end).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing import EmbeddedBroker
from oncelog.testing.readback import end_offset

pytestmark = [pytest.mark.timeout(180)]

TOPIC = "ret-snap"
CONFIG = {
    "log.retention.check.interval.ms": "200",
    "group.initial.rebalance.delay.ms": "0",
}


class Idempotent:
    """A librdkafka idempotent producer that records every error it reports."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer

        self.errors: list[str] = []
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 0,
            "socket.timeout.ms": 3000,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 300,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 300,
            "error_cb": lambda err: self.errors.append(f"error_cb: {err}"),
        })

    def send(self, value: bytes) -> int:
        """Produce one record as its own batch; return its offset."""
        got: list[Any] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append(f"delivery: {err}")
            got.append(msg)

        self.producer.produce(TOPIC, value=value, partition=0, on_delivery=on_delivery)
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            self.producer.poll(0.1)
        assert got, f"no delivery report for {value!r}"
        assert got[0].error() is None, f"{value!r}: {got[0].error()}"
        return int(got[0].offset())


def txn_producer(bootstrap: str, tid: str) -> Any:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 0,
                  "socket.timeout.ms": 3000, "retry.backoff.ms": 50, "retry.backoff.max.ms": 300})
    p.init_transactions(30)
    return p


def set_retention(bootstrap: str, ms: int) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource("topic", TOPIC, set_config={"retention.ms": str(ms), "segment.bytes": "300"})
    for fut in admin.alter_configs([res]).values():
        fut.result(timeout=20)


def snapshots(data_dir: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (data_dir / f"{TOPIC}-0").glob("*.snapshot"))


def committed_end(bootstrap: str, timeout: float = 20.0) -> int:
    """Read read_committed from the log start until the partition's end; the offset after the last record."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(TOPIC, 0, -2)])  # OFFSET_BEGINNING
        last = -1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == -191:  # _PARTITION_EOF
                    return last + 1 if last >= 0 else m.offset()
                raise AssertionError(f"consumer error: {m.error()}")
            last = m.offset()
        raise AssertionError("no partition EOF")
    finally:
        c.close()


def wait_retention(kit: Any, bootstrap: str, data_dir: Path, log_end: int) -> None:
    """Retention rolled the active segment and deleted every older one."""
    kit.wait_until(lambda: [int(p.stem) for p in kit.segment_files(data_dir, TOPIC, 0)] == [log_end],
                   timeout=30, message="retention to delete every segment before the log end")


@pytest.mark.parametrize("order", ["retention-then-kill", "kill-then-retention"])
def test_stale_snapshot_does_not_revive_transaction_after_retention(
        tmp_path: Path, kit: Any, broker_factory: Callable[..., EmbeddedBroker], order: str) -> None:
    b = broker_factory(config=CONFIG)
    kit.create_topic(b.bootstrap, TOPIC, 1, {"segment.bytes": "300"})
    idem = Idempotent(b.bootstrap)
    tp = txn_producer(b.bootstrap, "ret-snap-txn")

    tp.begin_transaction()
    tp.produce(TOPIC, value=b"txn-0", partition=0)
    assert tp.flush(20) == 0
    offsets = [idem.send(b"idem-%d" % i) for i in range(4)]  # rolls at least once while the txn is open
    stale = [s for s in snapshots(b.data_dir) if s > 0]
    assert stale, "no snapshot was taken while the transaction was open"
    tp.commit_transaction(20)
    offsets.append(idem.send(b"idem-4"))
    log_end = end_offset(b.bootstrap, TOPIC, 0, 0)
    assert end_offset(b.bootstrap, TOPIC, 0, 1) == log_end  # committed: LSO == HW
    assert max(snapshots(b.data_dir)) < log_end - 1  # no snapshot after the marker (the case of the bug)

    if order == "kill-then-retention":
        b.restart(hard=True)
        assert end_offset(b.bootstrap, TOPIC, 0, 1) == log_end
        set_retention(b.bootstrap, 1000)
        wait_retention(kit, b.bootstrap, b.data_dir, log_end)
        b.restart(hard=True)
    else:
        set_retention(b.bootstrap, 1000)
        wait_retention(kit, b.bootstrap, b.data_dir, log_end)
        b.restart(hard=True)
    set_retention(b.bootstrap, 3_600_000)  # keep what follows

    assert end_offset(b.bootstrap, TOPIC, 0, 1) == log_end, "the finished transaction pinned the LSO"

    # a new transaction commits: the LSO follows and a read_committed consumer reads past it
    tp2 = txn_producer(b.bootstrap, "ret-snap-txn-2")
    tp2.begin_transaction()
    tp2.produce(TOPIC, value=b"txn2", partition=0)
    tp2.commit_transaction(20)
    hw = log_end + 2  # the record and its marker (written after EndTxn returns)
    kit.wait_until(lambda: end_offset(b.bootstrap, TOPIC, 0, 0) == hw, timeout=10, message="the marker")
    lso = end_offset(b.bootstrap, TOPIC, 0, 1)
    assert lso == hw, f"the finished transaction pinned the LSO at {lso}"
    assert committed_end(b.bootstrap) == hw - 1  # up to the record, before the marker
    # the same idempotent producer carries on: no OUT_OF_ORDER_SEQUENCE_NUMBER
    more = [idem.send(b"idem-after-%d" % i) for i in range(3)]
    assert more == list(range(hw, hw + 3))
    assert end_offset(b.bootstrap, TOPIC, 0, 1) == hw + 3
    assert committed_end(b.bootstrap) == hw + 3
    idem.producer.flush(5)
    # the kills themselves show up as connection errors; nothing else may
    assert [e for e in idem.errors if "_ALL_BROKERS_DOWN" not in e and "_TRANSPORT" not in e] == [], idem.errors
    assert [s for s in snapshots(b.data_dir) if s < log_end] == []  # the stale ones are gone
