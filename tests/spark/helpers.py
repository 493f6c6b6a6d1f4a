"""Data makers and an independent oracle (librdkafka) for the Spark source tests."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

Row = tuple[str, int, int, bytes | None, bytes | None]  # topic, partition, offset, key, value


def produce(bootstrap: str, topic: str, n: int, partitions: int, prefix: str = "v", start: int = 0,
            headers: bool = False) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + n):
        p.produce(topic, key=None if i % 7 == 0 else f"k{i}".encode(), value=f"{prefix}{i}".encode(),
                  partition=i % partitions, headers=[("n", str(i).encode()), ("e", None)] if headers else None)
    assert p.flush(30) == 0


def txn_producer(bootstrap: str) -> Any:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
                  "linger.ms": 5})
    p.init_transactions(30)
    return p


def produce_txn(bootstrap: str, topic: str, n: int, partitions: int, prefix: str, commit: bool) -> None:
    """One transaction of ``n`` records over ``partitions``, committed or aborted."""
    p = txn_producer(bootstrap)
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, key=b"t", value=f"{prefix}{i}".encode(), partition=i % partitions)
    assert p.flush(30) == 0
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)


def direct_read(bootstrap: str, topic: str, start: dict[int, int], end: dict[int, int],
                isolation: str = "read_committed", timeout: float = 30.0) -> list[Row]:
    """Records with offsets in [start[p], end[p]) as a librdkafka consumer returns them."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oracle-{uuid.uuid4().hex[:8]}",
                  "isolation.level": isolation, "enable.auto.commit": False,
                  "enable.partition.eof": True})
    todo = {p for p in start if start[p] < end[p]}
    c.assign([TopicPartition(topic, p, start[p]) for p in sorted(todo)])
    out: list[Row] = []
    deadline = time.monotonic() + timeout
    try:
        while todo:
            assert time.monotonic() < deadline, f"oracle timed out, partitions left: {todo}"
            m = c.poll(0.5)
            if m is None:
                pass
            elif m.error():
                pass  # partition EOF; position decides
            elif m.partition() in todo and m.offset() < end[m.partition()]:
                out.append((m.topic(), m.partition(), m.offset(), m.key(), m.value()))
            for tp in c.position([TopicPartition(topic, p) for p in list(todo)]):
                if tp.offset >= end[tp.partition]:
                    todo.discard(tp.partition)
    finally:
        c.close()
    return sorted(out)


def offsets(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed") -> dict[int, int]:
    """The latest offset of each partition (the LSO under read_committed)."""
    from oncelog.client.reader import LATEST, READ_COMMITTED, READ_UNCOMMITTED, PartitionReader

    level = READ_COMMITTED if isolation == "read_committed" else READ_UNCOMMITTED
    with PartitionReader(bootstrap) as r:
        return {p: r.list_offset(topic, p, LATEST, level) for p in range(partitions)}


def rows_of(df_rows: list[Any]) -> list[Row]:
    return sorted((r.topic, r.partition, r.offset, r.key, r.value) for r in df_rows)


def make_topic(bootstrap: str, name: str, partitions: int) -> None:
    from oncelog.client.admin import Admin

    with Admin(bootstrap) as admin:
        err = admin.create_topic(name, partitions)
    assert err is None, err
