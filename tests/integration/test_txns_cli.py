"""``oncelog txns list|describe|find-hanging|abort`` against a real broker and a real hanging transaction.

A confluent-kafka transactional producer writes to two partitions and never commits. The broker's
``transaction.max.timeout.ms`` is small and its timed-out-transaction abort runs only once an hour, so the
transaction outlives its timeout and pins the last stable offset: the KIP-664 tooling must show it, find it
as hanging and abort it partition by partition, after which a read_committed consumer gets past it without
seeing the aborted records.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing import EmbeddedBroker
from oncelog.testing.readback import end_offset

pytestmark = pytest.mark.timeout(180)

TOPIC, TXN_ID, TIMEOUT_MS = "hang-t", "hang-tx", 5000


def cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog.cli", "txns", *args, "--bootstrap", bootstrap],
                          capture_output=True, text=True, timeout=60)


def cli_json(bootstrap: str, *args: str) -> Any:
    out = cli(bootstrap, *args, "--json")
    assert out.returncode == 0, f"txns {' '.join(args)}: {out.stderr}"
    return json.loads(out.stdout)


def fixed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """find-hanging rows without the clock-dependent duration."""
    return [{k: v for k, v in r.items() if k != "duration_ms"} for r in rows]


@pytest.fixture
def txn_broker(tmp_path: Path) -> Any:
    broker = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log", config={
        "transaction.max.timeout.ms": str(TIMEOUT_MS),
        # the coordinator would abort the timed-out transaction itself; make it wait an hour
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "3600000",
    })
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


def test_hanging_transaction_found_and_aborted(txn_broker: EmbeddedBroker, kit: Any) -> None:
    from confluent_kafka import Producer

    bs = txn_broker.bootstrap
    kit.create_topic(bs, TOPIC, 2)
    assert cli_json(bs, "list") == []
    assert cli_json(bs, "find-hanging", "--topic", TOPIC, "--max-transaction-timeout-ms", "0") == []

    txp = Producer({"bootstrap.servers": bs, "transactional.id": TXN_ID, "transaction.timeout.ms": TIMEOUT_MS})
    txp.init_transactions(30)
    txp.begin_transaction()
    for i in range(5):
        for part in (0, 1):
            txp.produce(TOPIC, key=b"k", value=f"aborted-{part}-{i}".encode(), partition=part)
    assert txp.flush(30) == 0  # sent and acked, never committed
    plain = Producer({"bootstrap.servers": bs})
    for i in range(3):
        plain.produce(TOPIC, value=f"after-{i}".encode(), partition=0)
    assert plain.flush(30) == 0
    try:
        # -- list / describe: the coordinator's view ---------------------------------------
        rows = cli_json(bs, "list")
        assert [(r["transactional_id"], r["state"]) for r in rows] == [(TXN_ID, "Ongoing")]
        pid = rows[0]["producer_id"]
        assert cli_json(bs, "list", "--state", "Ongoing", "--producer-id", str(pid)) == rows
        assert cli_json(bs, "list", "--state", "CompleteCommit") == []
        assert cli_json(bs, "list", "--producer-id", str(pid + 1000)) == []
        assert cli_json(bs, "list", "--duration-ms", "3600000") == []
        assert cli_json(bs, "list", "--duration-ms", "0") == rows
        out = cli(bs, "list")
        assert out.returncode == 0 and TXN_ID in out.stdout and "Ongoing" in out.stdout

        (d,) = cli_json(bs, "describe", TXN_ID)
        assert (d["transactional_id"], d["state"], d["producer_id"], d["timeout_ms"]) == (TXN_ID, "Ongoing", pid,
                                                                                          TIMEOUT_MS)
        assert d["partitions"] == [{"topic": TOPIC, "partition": 0}, {"topic": TOPIC, "partition": 1}]
        assert d["start_time_ms"] > 0
        out = cli(bs, "describe", TXN_ID, "no-such-txn")
        assert out.returncode == 1 and "no-such-txn" in out.stderr and "TRANSACTIONAL_ID_NOT_FOUND" in out.stderr
        assert f"{TOPIC}-0,{TOPIC}-1" in out.stdout

        # -- the open transaction pins the LSO of both partitions ---------------------------
        assert [end_offset(bs, TOPIC, p, 0) for p in (0, 1)] == [8, 5]
        assert [end_offset(bs, TOPIC, p, 1) for p in (0, 1)] == [0, 0]

        # within the (given) max timeout it is not hanging yet
        assert cli_json(bs, "find-hanging", "--topic", TOPIC, "--max-transaction-timeout-ms", "600000") == []

        def hanging() -> list[dict[str, Any]]:
            return cli_json(bs, "find-hanging", "--topic", TOPIC, "--max-transaction-timeout-ms", str(TIMEOUT_MS),
                            "--margin-ms", "0")

        found = kit.wait_until(lambda: len(hanging()) == 2 and hanging(), timeout=30, interval=0.5,
                               message="both partitions reported hanging")
        assert [(h["topic"], h["partition"], h["producer_id"], h["start_offset"], h["transactional_id"])
                for h in found] == [(TOPIC, 0, pid, 0, TXN_ID), (TOPIC, 1, pid, 0, TXN_ID)]
        assert all(h["duration_ms"] > TIMEOUT_MS for h in found)
        # the coordinator still lists both partitions but let the transaction outlive its timeout
        assert {h["reason"] for h in found} == {"coordinator-overdue"}
        all_topics = cli_json(bs, "find-hanging", "--max-transaction-timeout-ms", str(TIMEOUT_MS))
        assert fixed(all_topics) == fixed(found)
        assert fixed(cli_json(bs, "find-hanging", "--topic", TOPIC, "--partition", "1",
                              "--max-transaction-timeout-ms", str(TIMEOUT_MS))) == fixed(found[1:])
        assert cli_json(bs, "find-hanging", "--topic", TOPIC, "--max-transaction-timeout-ms", str(TIMEOUT_MS),
                        "--margin-ms", "3600000") == []
        out = cli(bs, "find-hanging", "--topic", TOPIC, "--max-transaction-timeout-ms", str(TIMEOUT_MS))
        assert out.returncode == 0 and TOPIC in out.stdout and "coordinator-overdue" in out.stdout

        # -- abort partition 0 by its start offset --------------------------------------------
        out = cli(bs, "abort", "--topic", TOPIC, "--partition", "0", "--start-offset", "0")
        assert out.returncode == 0, out.stderr
        assert f"aborted the transaction of producer {pid}" in out.stdout
        kit.wait_until(lambda: end_offset(bs, TOPIC, 0, 1) == 9, timeout=10, message="LSO of partition 0 past the marker")
        assert end_offset(bs, TOPIC, 0, 0) == 9
        assert end_offset(bs, TOPIC, 1, 1) == 0  # partition 1 still pinned
        msgs = kit.confluent_consume_all(bs, TOPIC, {0: 8}, timeout=30,
                                         extra={"isolation.level": "read_committed", "group.id": "rc-hang"})
        assert [m.value() for m in msgs[0]] == [b"after-0", b"after-1", b"after-2"]
        assert [m.offset() for m in msgs[0]] == [5, 6, 7]

        # aborting again finds nothing open at that offset; an unknown topic is an error
        out = cli(bs, "abort", "--topic", TOPIC, "--partition", "0", "--start-offset", "0")
        assert out.returncode == 1 and "could not find any open transaction starting at offset 0" in out.stderr
        out = cli(bs, "abort", "--topic", "no-such-topic", "--partition", "0", "--start-offset", "0")
        assert out.returncode == 1 and out.stderr.startswith("error:")

        # -- abort partition 1 with explicit producer id / epoch / coordinator epoch ------------
        (left,) = hanging()
        assert (left["partition"], left["producer_id"]) == (1, pid)
        out = cli(bs, "abort", "--topic", TOPIC, "--partition", "1", "--producer-id", str(pid),
                  "--producer-epoch", str(left["producer_epoch"]),
                  "--coordinator-epoch", str(left["coordinator_epoch"]), "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["aborted"] is True
        kit.wait_until(lambda: end_offset(bs, TOPIC, 1, 1) == 6, timeout=10, message="LSO of partition 1 past the marker")
        assert hanging() == []
        assert cli_json(bs, "find-hanging", "--topic", TOPIC, "--max-transaction-timeout-ms", "0") == []
    finally:
        try:
            txp.abort_transaction(10)
        except Exception:  # pragma: no cover - best effort; the test's subject is the admin abort
            pass
