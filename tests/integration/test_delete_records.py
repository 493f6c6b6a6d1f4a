"""DeleteRecords (key 21) against the real broker.

Real clients (confluent-kafka's and kafka-python's admin ``delete_records``)
move the log start offset; afterwards ListOffsets earliest returns it, Fetch
below it gets OFFSET_OUT_OF_RANGE, and it survives a restart (the
checkpoint is durable before the answer). Bad input over the raw protocol
gets Kafka's per-partition errors and changes nothing. ``oncelog topics
delete-records`` does the same from the command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from oncelog.client.admin import Admin
from oncelog.client.connection import Connection
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing import EmbeddedBroker

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

FETCH, LIST_OFFSETS, DELETE_RECORDS = 1, 2, 21


def start(tmp_path: Path, port: int = 0) -> EmbeddedBroker:
    # small segments, so a deletion drops whole segments as well as moving the start
    b = EmbeddedBroker(data_dir=tmp_path / "data", port=port, log_path=tmp_path / "broker.log",
                       config={"log.segment.bytes": "4096"})
    b.start()
    return b


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = start(tmp_path)
    try:
        yield b
    finally:
        b.close()


def fill(bootstrap: str, topic: str, n: int, partitions: int = 2) -> None:
    assert Admin(bootstrap).create_topic(topic, partitions=partitions) is None
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    for part in range(partitions):
        for i in range(n):
            p.produce(topic, value=b"v%04d" % i + b"x" * 100, partition=part)
    assert p.flush(30) == 0


def earliest_latest(conn: Connection, topic: str, partition: int) -> tuple[int, int]:
    out = []
    for ts in (-2, -1):
        r = conn.request(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                             "timestamp": ts}]}]})
        p = r.topics[0].partitions[0]
        assert p.error_code == 0
        out.append(int(p.offset))
    return out[0], out[1]


def fetch_code(conn: Connection, topic: str, partition: int, offset: int) -> tuple[int, int]:
    r = conn.request(FETCH, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [{"partition": partition, "current_leader_epoch": -1,
                                                     "fetch_offset": offset, "last_fetched_epoch": -1,
                                                     "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    p = r.responses[0].partitions[0]
    return int(p.error_code), int(p.log_start_offset)


def consume_first(bootstrap: str, topic: str, partition: int) -> bytes:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dr-{topic}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, partition, -2)])  # OFFSET_BEGINNING
        for _ in range(40):
            m = c.poll(0.5)
            if m is not None and not m.error():
                return bytes(m.value())
        raise AssertionError("nothing consumed")
    finally:
        c.close()


def delete_raw(conn: Connection, version: int, topic: str, parts: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    r = conn.request(DELETE_RECORDS, version, {"timeout": 10_000, "topics": [
        {"name": topic, "partitions": [{"partition_index": p, "offset": o} for p, o in parts]}]})
    (t,) = r.topics
    assert t.name == topic
    return {p.partition_index: (int(p.error_code), int(p.low_watermark)) for p in t.partitions}


def test_confluent_delete_records_moves_the_log_start(broker: EmbeddedBroker, tmp_path: Path) -> None:
    topic = "dr-confluent"
    fill(broker.bootstrap, topic, 200)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.delete_records([TopicPartition(topic, 0, 150), TopicPartition(topic, 1, -1)])
    low = {tp.partition: f.result(30).low_watermark for tp, f in futures.items()}
    assert low == {0: 150, 1: 200}
    with Connection(broker.bootstrap) as conn:
        assert earliest_latest(conn, topic, 0) == (150, 200)
        assert earliest_latest(conn, topic, 1) == (200, 200)
        assert fetch_code(conn, topic, 0, 149) == (E.offset_out_of_range, 150)
        assert fetch_code(conn, topic, 0, 150) == (0, 150)
        # an offset at or below the start changes nothing and answers the current start
        assert delete_raw(conn, 2, topic, [(0, 10)]) == {0: (0, 150)}
    assert consume_first(broker.bootstrap, topic, 0).startswith(b"v0150")
    # durable: the same after a restart
    port = broker.port
    broker.close()
    again = start(tmp_path, port)
    try:
        with Connection(again.bootstrap) as conn:
            assert earliest_latest(conn, topic, 0) == (150, 200)
            assert fetch_code(conn, topic, 0, 100)[0] == E.offset_out_of_range
    finally:
        again.close()


def test_confluent_delete_records_beyond_high_watermark(broker: EmbeddedBroker) -> None:
    topic = "dr-confluent-bad"
    fill(broker.bootstrap, topic, 20, partitions=1)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    (fut,) = admin.delete_records([TopicPartition(topic, 0, 21)]).values()
    with pytest.raises(KafkaException) as exc:
        fut.result(30)
    assert exc.value.args[0].code() == E.offset_out_of_range
    with Connection(broker.bootstrap) as conn:
        assert earliest_latest(conn, topic, 0) == (0, 20)


def test_kafka_python_delete_records(broker: EmbeddedBroker) -> None:
    from kafka import KafkaAdminClient
    from kafka.structs import TopicPartition as KTP

    topic = "dr-kafka-python"
    fill(broker.bootstrap, topic, 50)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = admin.delete_records({KTP(topic, 0): 30, KTP(topic, 1): 50})
        low = {tp.partition: r["low_watermark"] for tp, r in result.items()}
        assert low == {0: 30, 1: 50}
    finally:
        admin.close()
    with Connection(broker.bootstrap) as conn:
        assert earliest_latest(conn, topic, 0) == (30, 50)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_raw_bad_input_gets_kafka_errors_and_changes_nothing(broker: EmbeddedBroker, version: int) -> None:
    topic = f"dr-raw-{version}"
    fill(broker.bootstrap, topic, 10, partitions=1)
    with Connection(broker.bootstrap) as conn:
        assert delete_raw(conn, version, "no-such-topic", [(0, 1)]) == {0: (E.unknown_topic_or_partition, -1)}
        got = delete_raw(conn, version, topic, [(0, 11), (7, 1)])
        assert got == {0: (E.offset_out_of_range, -1), 7: (E.unknown_topic_or_partition, -1)}
        for bad in (-2, -1000):
            assert delete_raw(conn, version, topic, [(0, bad)]) == {0: (E.offset_out_of_range, -1)}
        assert earliest_latest(conn, topic, 0) == (0, 10)
        # a good partition next to a bad one in the same request still works
        assert delete_raw(conn, version, topic, [(0, 4), (3, 1)]) == {0: (0, 4), 3: (E.unknown_topic_or_partition, -1)}
        # 10 is the high watermark itself
        assert delete_raw(conn, version, topic, [(0, 10)]) == {0: (0, 10)}
        assert earliest_latest(conn, topic, 0) == (10, 10)
        assert fetch_code(conn, topic, 0, 9)[0] == E.offset_out_of_range
        assert fetch_code(conn, topic, 0, 10)[0] == 0


def cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog.cli", "topics", "delete-records", *args,
                           "--bootstrap", bootstrap], capture_output=True, text=True, timeout=60)


def test_cli_delete_records(broker: EmbeddedBroker, tmp_path: Path) -> None:
    topic = "dr-cli"
    fill(broker.bootstrap, topic, 30, partitions=3)
    r = cli(broker.bootstrap, topic, "--partition", "1", "--offset", "12")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"partition: {topic}-1\tlow_watermark: 12"]
    r = cli(broker.bootstrap, topic, "--offset", "-1")  # every partition, to the high watermark
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"partition: {topic}-{p}\tlow_watermark: 30" for p in range(3)]
    fill(broker.bootstrap, "dr-cli-2", 10, partitions=1)
    spec = tmp_path / "offsets.json"
    spec.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "dr-cli-2", "partition": 0, "offset": 4}, {"topic": "dr-cli-2", "partition": 5, "offset": 1}]}))
    r = cli(broker.bootstrap, "--offset-json-file", str(spec))
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["partition: dr-cli-2-0\tlow_watermark: 4"]
    assert r.stderr.splitlines() == ["partition: dr-cli-2-5\terror: UNKNOWN_TOPIC_OR_PARTITION"]
    r = cli(broker.bootstrap, topic, "--partition", "0", "--offset", "31")
    assert r.returncode == 1 and r.stderr.splitlines() == [f"partition: {topic}-0\terror: OFFSET_OUT_OF_RANGE"]
    r = cli(broker.bootstrap, "no-such-topic", "--offset", "1")
    assert r.returncode == 1 and r.stderr.splitlines() == ["error: topic no-such-topic not found"]
    with Connection(broker.bootstrap) as conn:
        assert earliest_latest(conn, topic, 1) == (30, 30)
        assert earliest_latest(conn, "dr-cli-2", 0) == (4, 10)


@pytest.mark.parametrize("args", [
    [],                                            # nothing to delete
    ["dr-x"],                                      # no offset
    ["dr-x", "--offset", "ten"],
    ["dr-x", "--offset", "-2"],
    ["dr-x", "--offset", "1", "--partition", "-1"],
    ["dr-x", "--offset", "1", "--partition", "x"],
    ["dr-x", "--offset-json-file", "FILE"],       # both ways at once
    ["--offset-json-file", "MISSING"],
    ["--offset-json-file", "NOTJSON"],
    ["--offset-json-file", "WRONGSHAPE"],
    ["--offset-json-file", "DUPLICATE"],
    ["--offset-json-file", "BADOFFSET"],
])
def test_cli_delete_records_bad_args(tmp_path: Path, args: list[str]) -> None:
    files = {
        "FILE": {"partitions": [{"topic": "t", "partition": 0, "offset": 1}]},
        "WRONGSHAPE": {"topics": []},
        "DUPLICATE": {"partitions": [{"topic": "t", "partition": 0, "offset": 1},
                                     {"topic": "t", "partition": 0, "offset": 2}]},
        "BADOFFSET": {"partitions": [{"topic": "t", "partition": 0, "offset": -5}]},
    }
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    (tmp_path / "NOTJSON").write_text("{partitions")
    args = [str(tmp_path / a) if a in (*files, "MISSING", "NOTJSON") else a for a in args]
    # no broker needed: usage errors are found before connecting
    r = cli("127.0.0.1:1", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
