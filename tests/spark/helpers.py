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


def settled(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Wait until no transaction is open on ``topic`` (LSO == high watermark on every partition): the
    markers of a completed transaction are written after complete_transaction() returns, as in Kafka."""
    deadline = time.monotonic() + timeout
    while offsets(bootstrap, topic, partitions) != offsets(bootstrap, topic, partitions, "read_uncommitted"):
        assert time.monotonic() < deadline, f"transactions still open on {topic}"
        time.sleep(0.1)


def verify_report(bootstrap: str, src: str, dst: str, id_spec: str = "value", order: str = "partition") -> dict:
    """``oncelog verify --json`` (the CLI, in a subprocess) on a copy ``src`` -> ``dst``."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "oncelog.cli", "verify", "--bootstrap", bootstrap, "--input", src,
                           "--output", dst, "--id", id_spec, "--order", order, "--json"],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode in (0, 1), f"verify failed ({proc.returncode}): {proc.stderr[-2000:]}"
    report = json.loads(proc.stdout)
    assert report["clean"] == (proc.returncode == 0)
    return report


def check_verified(bootstrap: str, src: str, dst: str, partitions: int, n: int, id_spec: str = "value") -> dict:
    """The crash matrix's end: verify's report on ``src`` -> ``dst`` has 0 lost, 0 duplicated, 0
    aborted-visible, 0 out of order (per output partition and input partition), 0 unexpected, and all
    ``n`` input records are in the output."""
    settled(bootstrap, dst, partitions)
    r = verify_report(bootstrap, src, dst, id_spec)
    anomalies = {k: r[k] for k in ("lost", "duplicated", "aborted_visible", "out_of_order", "unexpected")}
    assert anomalies == dict.fromkeys(anomalies, 0), f"verify found anomalies: {anomalies} {r['examples']}"
    assert r["unidentified"] == {"input": 0, "output": 0}, r["unidentified"]
    assert (r["input_records"], r["output_records"]) == (n, n), r
    return r
