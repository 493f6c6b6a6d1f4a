"""kafkajs 2.2.4 transactions (tests/js/txn.js).

A transactional kafkajs producer (transactionalId, idempotent,
maxInFlightRequests 1) commits and aborts transactions over 3 partitions.
A confluent-kafka read_committed consumer and a kafkajs consumer with
``readUncommitted: false`` must both see exactly the committed records
(each once, per partition in send order, nothing of an aborted
transaction); a read_uncommitted consumer sees every record sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(180)

JS_DIR = Path(__file__).resolve().parent.parent / "js"
SCRIPT = JS_DIR / "txn.js"
NODE_TIMEOUT = 90
PARTITIONS = 3
PLAN = "C30,A20,C25,A15,A10,C20"


def run_txn_js(node: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [node, str(SCRIPT), *args],
        cwd=JS_DIR, capture_output=True, text=True, timeout=NODE_TIMEOUT,
        env={**os.environ, "KAFKAJS_NO_PARTITIONER_WARNING": "1", "TXN_DEADLINE_MS": str((NODE_TIMEOUT - 10) * 1000)},
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output from txn.js (rc={proc.returncode}); stderr:\n{proc.stderr[-4000:]}"
    summary = json.loads(lines[-1])
    assert proc.returncode == 0 and summary.get("ok") is True, (
        f"txn.js failed (rc={proc.returncode}): {summary.get('error')}\nstderr:\n{proc.stderr[-4000:]}")
    return summary


def confluent_read(bootstrap: str, topic: str, committed: bool, expected: int) -> dict[int, list[str]]:
    """Every record from offset 0 until ``expected`` and then a quiet 1.5 s more."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-js-txn", "enable.auto.commit": False,
                  "isolation.level": "read_committed" if committed else "read_uncommitted",
                  "fetch.wait.max.ms": 100})
    got: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 45
        quiet_until = None
        while True:
            for m in c.consume(num_messages=500, timeout=0.2):
                assert not m.error(), m.error()
                got[m.partition()].append(m.value().decode())
            if sum(map(len, got.values())) < expected and time.monotonic() < deadline:
                continue
            quiet_until = quiet_until or time.monotonic() + 1.5
            if time.monotonic() > quiet_until:
                return got
    finally:
        c.close()


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    """ListOffsets LATEST read_uncommitted (librdkafka's default isolation is read_committed: the LSO)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "js-txn-hw", "isolation.level": "read_uncommitted"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in range(PARTITIONS)}
    finally:
        c.close()


def per_partition(records: list[dict[str, Any]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for r in records:
        out[r["partition"]].append(r["value"])
    return out


def assert_exactly(got: dict[int, list[str]], want: dict[int, list[str]], who: str) -> None:
    for p in range(PARTITIONS):
        extra = sorted(set(got[p]) - set(want[p]))
        missing = sorted(set(want[p]) - set(got[p]))
        assert not extra, f"{who}: partition {p}: {len(extra)} records that must not be visible, e.g. {extra[:5]}"
        assert not missing, f"{who}: partition {p}: {len(missing)} committed records missing, e.g. {missing[:5]}"
        assert len(got[p]) == len(set(got[p])), f"{who}: partition {p}: duplicates"
        assert got[p] == want[p], f"{who}: partition {p}: not in send order"


def test_kafkajs_transactions_commit_and_abort(node: str, tmp_path: Path, kit: Any) -> None:
    broker = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log",
                            config={"group.initial.rebalance.delay.ms": "0"})
    broker.start()
    topic = "js-txn"
    try:
        kit.create_topic(broker.bootstrap, topic, PARTITIONS)
        summary = run_txn_js(node, "produce", broker.bootstrap, topic, "js-txn-id", PLAN, str(PARTITIONS))
        txns = summary["transactions"]
        assert [t["commit"] for t in txns] == [s[0] == "C" for s in PLAN.split(",")]
        committed = {p: [] for p in range(PARTITIONS)}
        everything = {p: [] for p in range(PARTITIONS)}
        for t in txns:
            for r in t["sent"]:
                everything[r["partition"]].append(r["value"])
                if t["commit"]:
                    committed[r["partition"]].append(r["value"])
        n_committed = sum(map(len, committed.values()))
        n_all = sum(map(len, everything.values()))
        assert n_committed == 75 and n_all == 120

        assert_exactly(confluent_read(broker.bootstrap, topic, True, n_committed), committed,
                       "confluent read_committed")
        assert_exactly(confluent_read(broker.bootstrap, topic, False, n_all), everything,
                       "confluent read_uncommitted")
        consumed = run_txn_js(node, "consume", broker.bootstrap, topic, "js-txn-group", str(n_committed))
        assert_exactly(per_partition(consumed["records"]), committed, "kafkajs readUncommitted=false")
        # offsets strictly increase per partition (markers and aborted records skipped, nothing re-read)
        for p in range(PARTITIONS):
            offs = [r["offset"] for r in consumed["records"] if r["partition"] == p]
            assert offs == sorted(set(offs)), f"partition {p}: offsets {offs}"
        # the log holds every record plus one marker per transaction per partition
        want = {p: len(everything[p]) + len(txns) for p in range(PARTITIONS)}
        kit.wait_until(lambda: high_watermarks(broker.bootstrap, topic) == want, timeout=15,
                       message=f"high watermarks {want}")
    finally:
        broker.close()
