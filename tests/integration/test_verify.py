"""``oncelog verify`` against a real broker and real confluent-kafka producers and copiers.

Each test makes an input topic and an output topic that is a copy of it -- clean, faulty in known
ways, or written by a real transactional consume-transform-produce copier with aborted
transactions mixed in -- and runs the CLI as a user would, checking the exit status and the
counts of ``--json``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from oncelog.client.connection import Connection
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(240)

PARTS = 3
N = 300  # records per input topic


@pytest.fixture(scope="module")
def vbroker(tmp_path_factory: Any) -> Iterator[EmbeddedBroker]:
    d = tmp_path_factory.mktemp("verify")
    b = EmbeddedBroker(data_dir=d / "data", log_path=d / "broker.log",
                       config={"group.initial.rebalance.delay.ms": "0"})
    b.start()
    try:
        yield b
    finally:
        b.close()


_names = iter(range(10_000))


@pytest.fixture
def topics(vbroker: EmbeddedBroker, request: pytest.FixtureRequest, kit: Any) -> tuple[str, str]:
    """A fresh (input, output) pair of 3-partition topics."""
    base = f"v{next(_names)}-{re.sub(r'[^a-zA-Z0-9]', '-', request.node.name)[:50]}"
    kit.create_topic(vbroker.bootstrap, f"{base}-in", PARTS)
    kit.create_topic(vbroker.bootstrap, f"{base}-out", PARTS)
    return f"{base}-in", f"{base}-out"


def verify(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog.cli", "verify", "--bootstrap", bootstrap, *args],
                          capture_output=True, text=True, timeout=120)


def verify_json(bootstrap: str, inp: str, out: str, *args: str, rc: int) -> dict[str, Any]:
    p = verify(bootstrap, "--input", inp, "--output", out, "--json", *args)
    assert p.returncode == rc, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    return json.loads(p.stdout)


def counts(doc: dict[str, Any]) -> dict[str, int]:
    return {k: doc[k] for k in ("lost", "duplicated", "aborted_visible", "out_of_order", "offsets_ahead",
                                "unexpected")}


CLEAN = {"lost": 0, "duplicated": 0, "aborted_visible": 0, "out_of_order": 0, "offsets_ahead": 0, "unexpected": 0}


def seed(bootstrap: str, topic: str, n: int = N, **conf: Any) -> list[tuple[int, bytes, bytes]]:
    """``n`` records with unique keys over the partitions (idempotent producer); returns them in order."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **conf})
    rows = []
    for i in range(n):
        key, value = f"id-{i:05d}".encode(), json.dumps({"n": i, "pad": "x" * 20}).encode()
        rows.append((i % PARTS, key, value))
        p.produce(topic, key=key, value=value, partition=i % PARTS, headers=[("rid", f"h{i}".encode())])
    assert p.flush(30) == 0
    return rows


def copy(bootstrap: str, topic: str, rows: list[tuple[int, bytes, bytes]], **conf: Any) -> None:
    """Write ``rows`` to ``topic`` in order, each to its partition (idempotent, so order is kept)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **conf})
    for part, key, value in rows:
        p.produce(topic, key=key, value=value, partition=part,
                  headers=[("rid", f"h{json.loads(value)['n']}".encode())])
    assert p.flush(30) == 0


# -- plain copies -------------------------------------------------------------------------------------


def test_clean_copy(vbroker: EmbeddedBroker, topics: tuple[str, str]) -> None:
    bs, (inp, out) = vbroker.bootstrap, topics
    rows = seed(bs, inp)
    copy(bs, out, rows, **{"compression.type": "zstd"})
    doc = verify_json(bs, inp, out, rc=0)
    assert counts(doc) == CLEAN
    assert doc["input_records"] == doc["output_records"] == N
    assert doc["aborted_seen"] == 0 and doc["unidentified"] == {"input": 0, "output": 0}
    # the table says so too
    p = verify(bs, "--input", inp, "--output", out)
    assert p.returncode == 0, p.stderr
    assert "clean: no anomalies" in p.stdout and "lost" in p.stdout and "duplicated" in p.stdout


@pytest.mark.parametrize("id_spec", ["header:rid", "json:n"])
def test_clean_copy_other_ids(vbroker: EmbeddedBroker, topics: tuple[str, str], id_spec: str) -> None:
    bs, (inp, out) = vbroker.bootstrap, topics
    rows = seed(bs, inp, **{"compression.type": "gzip"})
    # different keys in the output: only the chosen id has to match
    copy(bs, out, [(part, b"re-" + key, value) for part, key, value in rows], **{"compression.type": "lz4"})
    assert counts(verify_json(bs, inp, out, "--id", id_spec, rc=0)) == CLEAN
    # by key they are all lost and all unexpected
    doc = verify_json(bs, inp, out, rc=1)
    assert doc["lost"] == N and doc["unexpected"] == N


def test_faulty_copy(vbroker: EmbeddedBroker, topics: tuple[str, str]) -> None:
    bs, (inp, out) = vbroker.bootstrap, topics
    rows = seed(bs, inp)
    faulty = list(rows)
    lost = faulty.pop(10)                      # partition 1
    faulty.insert(50, faulty[40])              # partition 1 again later: a duplicate (not also out of order)
    faulty[60], faulty[63] = faulty[63], faulty[60]  # same partition (60 % 3 == 63 % 3): swapped
    copy(bs, out, faulty)
    doc = verify_json(bs, inp, out, rc=1)
    assert counts(doc) == {**CLEAN, "lost": 1, "duplicated": 1, "out_of_order": 1}, doc["examples"]
    assert doc["examples"]["lost"][0]["id"] == lost[1].decode()
    assert doc["examples"]["duplicated"][0]["id"] == faulty[40][1].decode()
    assert doc["input_records"] == N and doc["output_records"] == N
    p = verify(bs, "--input", inp, "--output", out)
    assert p.returncode == 1 and "ANOMALIES FOUND" in p.stdout
    # --order none ignores the swap
    assert counts(verify_json(bs, inp, out, "--order", "none", rc=1))["out_of_order"] == 0


def test_group_offsets_ahead(vbroker: EmbeddedBroker, topics: tuple[str, str]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    bs, (inp, out) = vbroker.bootstrap, topics
    rows = seed(bs, inp)
    by_part = {p: [r for r in rows if r[0] == p] for p in range(PARTS)}
    # the copy stopped after 50 records of each partition ...
    copy(bs, out, [r for p in range(PARTS) for r in by_part[p][:50]])
    group = f"g-{out}"
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
    try:
        # ... but committed 60 on partition 0 (10 records the output lacks) and 50 elsewhere
        c.commit(offsets=[TopicPartition(inp, 0, 60), TopicPartition(inp, 1, 50), TopicPartition(inp, 2, 50)],
                 asynchronous=False)
    finally:
        c.close()
    doc = verify_json(bs, inp, out, "--group", group, rc=1)
    assert doc["offsets_ahead"] == 10 and doc["lost"] == N - 150
    assert {e["partition"] for e in doc["examples"]["offsets_ahead"]} == {0}


def test_usage_and_missing_topic(vbroker: EmbeddedBroker, topics: tuple[str, str]) -> None:
    bs, (inp, out) = vbroker.bootstrap, topics
    assert verify(bs, "--input", inp, "--output", out, "--id", "nope").returncode == 2
    assert verify(bs, "--input", inp).returncode == 2  # argparse: --output missing
    p = verify(bs, "--input", inp, "--output", "no-such-topic", "--timeout", "3")
    assert p.returncode == 2 and "no-such-topic" in p.stderr


# -- transactions -------------------------------------------------------------------------------------


def aborted_txn(bootstrap: str, topic: str, txn_id: str, rows: list[tuple[int, bytes, bytes]]) -> None:
    """Produce ``rows`` in a transaction, flush (so they are in the log) and abort it."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    p.init_transactions(30)
    p.begin_transaction()
    for part, key, value in rows:
        p.produce(topic, key=key, value=value, partition=part)
    assert p.flush(30) == 0
    p.abort_transaction(30)


def test_aborted_transaction_in_output(vbroker: EmbeddedBroker, topics: tuple[str, str]) -> None:
    bs, (inp, out) = vbroker.bootstrap, topics
    rows = seed(bs, inp)
    copy(bs, out, rows[:150])
    # an aborted transaction holding copies of ids already copied (duplicates if visible) and ghosts
    junk = rows[:30] + [(p, f"ghost-{p}".encode(), b"") for p in range(PARTS)]
    aborted_txn(bs, out, f"abort-{out}", junk)
    copy(bs, out, rows[150:])
    doc = verify_json(bs, inp, out, rc=0)
    assert counts(doc) == CLEAN, doc["examples"]
    assert doc["aborted_seen"] == len(junk)
    assert doc["output_records"] == N and doc["undecided_seen"] == 0


def test_transactional_copier(vbroker: EmbeddedBroker, topics: tuple[str, str]) -> None:
    """A real EOS copier (read_committed consumer, transactional producer, offsets in the transaction),
    with aborted transactions from a zombie in between: clean, committed offsets at the input end."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    bs, (inp, out) = vbroker.bootstrap, topics
    rows = seed(bs, inp)
    group = f"copier-{out}"
    consumer = Consumer({"bootstrap.servers": bs, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": bs, "transactional.id": f"copier-{out}", "linger.ms": 5})
    producer.init_transactions(30)
    assignment = [TopicPartition(inp, p, 0) for p in range(PARTS)]
    consumer.assign(assignment)
    copied, rounds, deadline = 0, 0, time.monotonic() + 120
    try:
        while copied < N:
            assert time.monotonic() < deadline, f"copier stuck at {copied}/{N}"
            msgs = [m for m in consumer.consume(num_messages=40, timeout=1.0) if not m.error()]
            if not msgs:
                continue
            producer.begin_transaction()
            for m in msgs:
                producer.produce(out, key=m.key(), value=m.value(), headers=m.headers(), partition=m.partition())
            producer.send_offsets_to_transaction(consumer.position(assignment), consumer.consumer_group_metadata(),
                                                 30)
            producer.commit_transaction(30)
            copied += len(msgs)
            rounds += 1
            if rounds in (2, 4):  # a zombie's aborted transaction lands between committed ones
                aborted_txn(bs, out, f"zombie-{out}-{rounds}", [(m.partition(), m.key(), m.value()) for m in msgs])
    finally:
        consumer.close()
    doc = verify_json(bs, inp, out, "--group", group, rc=0)
    assert counts(doc) == CLEAN, doc["examples"]
    assert doc["input_records"] == doc["output_records"] == N
    assert doc["aborted_seen"] > 0
    # an uncommitted view would have been wrong: the zombies' records are in the log
    with Connection(bs) as conn:
        v = conn.best_version(2, (2, 8))
        hw = conn.request(2, v, {"replica_id": -1, "isolation_level": 0, "topics": [{"name": out, "partitions": [
            {"partition_index": p, "current_leader_epoch": -1, "timestamp": -1} for p in range(PARTS)]}]})
    assert sum(p.offset for p in hw.topics[0].partitions) > N + doc["aborted_seen"]


def test_command_config_bootstrap_list_with_a_dead_first_address(vbroker: EmbeddedBroker, topics: tuple[str, str],
                                                                 tmp_path: Any) -> None:
    """The file's bootstrap.servers is a list, as for Kafka's tools: verify reads through the first
    address that answers (it used only the first). Costs about two seconds."""
    import socket

    bs, (inp, out) = vbroker.bootstrap, topics
    rows = seed(bs, inp, n=30)
    copy(bs, out, rows)
    with socket.socket() as s:  # a loopback port nothing listens on: refused at once
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    props = tmp_path / "client.properties"
    props.write_text(f"bootstrap.servers={dead},{bs}\nclient.id=verify-from-file\n")
    p = subprocess.run([sys.executable, "-m", "oncelog.cli", "verify", "--command-config", str(props),
                        "--input", inp, "--output", out, "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert counts(doc) == CLEAN and doc["input_records"] == doc["output_records"] == 30


def test_main_called_directly_reads_the_command_config(vbroker: EmbeddedBroker, topics: tuple[str, str],
                                                       tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """verify.main without oncelog.cli.main before it (which resolves --command-config) still reads the
    file: here its bootstrap.servers (it was ignored: verify went to 127.0.0.1:9092)."""
    import argparse

    from oncelog import verify as verify_module

    bs, (inp, out) = vbroker.bootstrap, topics
    rows = seed(bs, inp, n=20)
    copy(bs, out, rows)
    props = tmp_path / "client.properties"
    props.write_text(f"bootstrap.servers={bs}\n")
    args = argparse.Namespace(command="verify", bootstrap=None, command_config=str(props), input=inp, output=out,
                              id_spec="key", group=None, order="partition", examples=10, timeout=30.0, json=True)
    code = verify_module.main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(captured.out)
    assert counts(doc) == CLEAN and doc["input_records"] == 20
    bad = argparse.Namespace(**{**vars(args), "client_config": None, "command_config": str(tmp_path / "nope")})
    assert verify_module.main(bad) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --command-config: cannot read {tmp_path / 'nope'}: No such file or directory"]
