"""Log APIs over the raw protocol: OffsetForLeaderEpoch (23), DescribeLogDirs (35),
ListOffsets v9-v11 sentinels, and the leader epoch that Metadata, Fetch, ListOffsets
and OffsetForLeaderEpoch agree on (bumped at every broker start).

Every value is checked against what the test itself produced or found on disk.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Producer

from oncelog.client.admin import Admin
from oncelog.client.connection import Connection
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing import EmbeddedBroker

pytestmark = [pytest.mark.timeout(120)]

FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, O4LE, DESCRIBE_LOG_DIRS = 1, 2, 3, 18, 23, 35
T0 = 1_700_000_000_000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log")
    b.start()
    try:
        yield b
    finally:
        b.close()


def produce(bootstrap: str, topic: str, partition: int, n: int, timestamps: list[int] | None = None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=partition,
                  timestamp=timestamps[i] if timestamps else T0 + i)
        p.flush(10)  # one batch per record: offsets map to batches
    assert p.flush(10) == 0


def o4le(conn: Connection, topic: str, partition: int, epoch: int, current: int = -1, version: int = 4,
         replica_id: int = -1) -> tuple[int, int, int]:
    r = conn.request(O4LE, version, {"replica_id": replica_id, "topics": [
        {"topic": topic, "partitions": [{"partition": partition, "current_leader_epoch": current,
                                         "leader_epoch": epoch}]}]})
    p = r.topics[0].partitions[0]
    return int(p.error_code), int(p.leader_epoch), int(p.end_offset)


def metadata_epoch(conn: Connection, topic: str, partition: int = 0) -> int:
    r = conn.request(METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                    "allow_auto_topic_creation": False,
                                    "include_topic_authorized_operations": False})
    return int(r.topics[0].partitions[partition].leader_epoch)


def list_offsets(conn: Connection, topic: str, partition: int, ts: int, version: int = 11,
                 current: int = -1) -> tuple[int, int, int, int]:
    body: dict[str, Any] = {"replica_id": -1, "isolation_level": 0, "timeout": 1000, "topics": [
        {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": current,
                                         "timestamp": ts}]}]}
    p = conn.request(LIST_OFFSETS, version, body).topics[0].partitions[0]
    return int(p.error_code), int(p.offset), int(p.timestamp), int(p.leader_epoch)


def fetch(conn: Connection, topic: str, partition: int, offset: int, current: int, version: int = 12) -> Any:
    if version >= 13:  # topics by id
        md = conn.request(METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                         "allow_auto_topic_creation": False,
                                         "include_topic_authorized_operations": False})
        key: dict[str, Any] = {"topic_id": md.topics[0].topic_id}
    else:
        key = {"topic": topic}
    r = conn.request(FETCH, version, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{**key, "partitions": [{"partition": partition, "current_leader_epoch": current,
                                            "fetch_offset": offset, "last_fetched_epoch": -1,
                                            "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    return r.responses[0].partitions[0]


def batch_epochs(records: bytes) -> list[tuple[int, int]]:
    """(base offset, partitionLeaderEpoch) of each batch, parsed here by hand."""
    out, pos = [], 0
    while pos + 61 <= len(records):
        base, length, epoch = struct.unpack_from(">qii", records, pos)
        out.append((base, epoch))
        pos += 12 + length
    return out


# -- OffsetForLeaderEpoch and the epoch across restarts ------------------------------


def test_epoch_bumps_at_restart_and_every_api_agrees(broker: EmbeddedBroker) -> None:
    assert Admin(broker.bootstrap).create_topic("e", partitions=2) is None
    produce(broker.bootstrap, "e", 0, 3)  # offsets 0-2 in epoch 0
    with Connection(broker.bootstrap) as c:
        assert metadata_epoch(c, "e") == 0
        assert o4le(c, "e", 0, 0) == (0, 0, 3)
    broker.restart()
    produce(broker.bootstrap, "e", 0, 2, timestamps=[T0 + 10, T0 + 11])  # offsets 3-4 in epoch 1
    broker.restart()  # epoch 2, nothing written in it
    with Connection(broker.bootstrap) as c:
        assert metadata_epoch(c, "e", 0) == 2
        assert metadata_epoch(c, "e", 1) == 2
        for version in (2, 3, 4):
            assert o4le(c, "e", 0, 0, version=version) == (0, 0, 3)  # epoch 0 ended where epoch 1 began
            assert o4le(c, "e", 0, 1, version=version) == (0, 1, 5)
            assert o4le(c, "e", 0, 2, version=version) == (0, 2, 5)  # the current epoch: the log end
        assert o4le(c, "e", 0, 3) == (0, -1, -1)  # newer than any: undefined
        assert o4le(c, "e", 0, -1) == (0, -1, -1)
        assert o4le(c, "e", 1, 0) == (0, 0, 0)  # partition 1 holds only epoch 2 (from 0): below it, itself
        # replica_id is not consulted (consumer, debug, a follower id)
        assert o4le(c, "e", 0, 1, replica_id=-2) == o4le(c, "e", 0, 1, replica_id=1) == (0, 1, 5)
        # current_leader_epoch fencing
        assert o4le(c, "e", 0, 1, current=2) == (0, 1, 5)
        assert o4le(c, "e", 0, 1, current=1) == (E.fenced_leader_epoch, -1, -1)
        assert o4le(c, "e", 0, 1, current=3) == (E.unknown_leader_epoch, -1, -1)
        assert o4le(c, "nope", 0, 0) == (E.unknown_topic_or_partition, -1, -1)
        assert o4le(c, "e", 2, 0) == (E.unknown_topic_or_partition, -1, -1)
        assert o4le(c, "e", -1, 0) == (E.unknown_topic_or_partition, -1, -1)

        # the stored batches carry the epoch they were appended in
        p = fetch(c, "e", 0, 0, current=2)
        assert p.error_code == 0
        assert batch_epochs(bytes(p.records)) == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1)]
        # Fetch checks current_leader_epoch the same way
        assert fetch(c, "e", 0, 0, current=-1).error_code == 0
        fenced = fetch(c, "e", 0, 0, current=1, version=16)
        assert fenced.error_code == E.fenced_leader_epoch and not fenced.records
        assert (fenced.current_leader.leader_id, fenced.current_leader.leader_epoch) == (1, 2)
        assert fetch(c, "e", 0, 0, current=3).error_code == E.unknown_leader_epoch

        # ListOffsets: leader epochs in the answer, current_leader_epoch fencing
        assert list_offsets(c, "e", 0, -1) == (0, 5, -1, 2)  # latest: the current epoch
        assert list_offsets(c, "e", 0, -2) == (0, 0, -1, 0)  # earliest: the first cached epoch
        assert list_offsets(c, "e", 0, T0 + 5) == (0, 3, T0 + 10, 1)  # by timestamp: the batch's epoch
        assert list_offsets(c, "e", 0, T0 + 1) == (0, 1, T0 + 1, 0)
        assert list_offsets(c, "e", 0, -3) == (0, 4, T0 + 11, 1)
        assert list_offsets(c, "e", 0, -1, current=2)[0] == 0
        assert list_offsets(c, "e", 0, -1, current=1) == (E.fenced_leader_epoch, -1, -1, -1)
        assert list_offsets(c, "e", 0, -1, current=9) == (E.unknown_leader_epoch, -1, -1, -1)
    # the checkpoint file is Kafka's format, one line per epoch that holds records
    text = (broker.data_dir / "e-0" / "leader-epoch-checkpoint").read_text()
    assert text == "0\n3\n0 0\n1 3\n2 5\n"


def test_epoch_cache_follows_delete_records(broker: EmbeddedBroker) -> None:
    assert Admin(broker.bootstrap).create_topic("d", partitions=1) is None
    produce(broker.bootstrap, "d", 0, 3)
    broker.restart()
    produce(broker.bootstrap, "d", 0, 3)  # epoch 1 from offset 3
    with Connection(broker.bootstrap) as c:
        r = c.request(21, 2, {"topics": [{"name": "d", "partitions": [{"partition_index": 0, "offset": 4}]}],
                              "timeout": 5000})
        assert r.topics[0].partitions[0].error_code == 0
        # epoch 0 is gone with its records: a request for it now gets the start of what remains
        assert o4le(c, "d", 0, 0) == (0, 0, 4)
        assert list_offsets(c, "d", 0, -2) == (0, 4, -1, 1)
        assert list_offsets(c, "d", 0, -4, version=8) == (0, 4, -1, 1)


@pytest.mark.parametrize("damage", ["deleted", "corrupt"])
def test_epoch_cache_is_rebuilt_from_the_batches_when_its_checkpoint_is_lost(
        broker: EmbeddedBroker, damage: str) -> None:
    assert Admin(broker.bootstrap).create_topic("lost", partitions=1) is None
    produce(broker.bootstrap, "lost", 0, 3)  # epoch 0: offsets 0-2
    broker.restart()
    produce(broker.bootstrap, "lost", 0, 2)  # epoch 1: 3-4
    broker.restart()
    produce(broker.bootstrap, "lost", 0, 2)  # epoch 2: 5-6
    broker.restart()  # epoch 3, nothing in it

    def answers() -> list[Any]:
        with Connection(broker.bootstrap) as c:
            return [metadata_epoch(c, "lost")] + [o4le(c, "lost", 0, e) for e in range(-1, 6)] + [
                list_offsets(c, "lost", 0, ts) for ts in (-2, -1, T0 + 1)]

    before = answers()
    assert before[:6] == [3, (0, -1, -1), (0, 0, 3), (0, 1, 5), (0, 2, 7), (0, 3, 7)]
    broker.stop()
    checkpoint = broker.data_dir / "lost-0" / "leader-epoch-checkpoint"
    if damage == "deleted":
        checkpoint.unlink()
    else:
        checkpoint.write_text("0\n4\n0 0\n1 3\n")  # cut short
    broker.start()
    assert answers() == before
    # rebuilt from the batches' partitionLeaderEpoch; the empty epoch 3 was started again
    assert checkpoint.read_text() == "0\n4\n0 0\n1 3\n2 5\n3 7\n"
    produce(broker.bootstrap, "lost", 0, 1)
    with Connection(broker.bootstrap) as c:
        assert o4le(c, "lost", 0, 2) == (0, 2, 7)
        assert o4le(c, "lost", 0, 3) == (0, 3, 8)
        assert batch_epochs(bytes(fetch(c, "lost", 0, 0, current=3).records))[-2:] == [(6, 2), (7, 3)]


def _raw_request(bootstrap: str, api_key: int, version: int) -> bytes:
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        header = struct.pack(">hhih", api_key, version, 7, 1) + b"x"
        s.sendall(struct.pack(">i", len(header)) + header)
        return s.recv(4)


@pytest.mark.parametrize("api_key,version", [(O4LE, 1), (O4LE, 5), (DESCRIBE_LOG_DIRS, 0),
                                             (DESCRIBE_LOG_DIRS, 5), (LIST_OFFSETS, 12)])
def test_unsupported_versions_close_the_connection(broker: EmbeddedBroker, api_key: int, version: int) -> None:
    assert _raw_request(broker.bootstrap, api_key, version) == b""  # closed, as Kafka does
    with Connection(broker.bootstrap) as c:  # everyone else is still served
        versions = c.negotiate()
    assert versions[O4LE] == (2, 4)
    assert versions[DESCRIBE_LOG_DIRS] == (1, 4)
    assert versions[LIST_OFFSETS] == (1, 11)


# -- ListOffsets sentinels -----------------------------------------------------------


@pytest.mark.parametrize("ts,first_version", [(-3, 7), (-4, 8), (-5, 9), (-6, 11)])
def test_list_offsets_sentinel_needs_its_version(broker: EmbeddedBroker, ts: int, first_version: int) -> None:
    assert Admin(broker.bootstrap).create_topic("s", partitions=1) is None
    produce(broker.bootstrap, "s", 0, 4, timestamps=[T0 + 5, T0 + 9, T0 + 9, T0 + 1])
    with Connection(broker.bootstrap) as c:
        assert list_offsets(c, "s", 0, ts, version=first_version - 1) == (E.unsupported_version, -1, -1, -1)
        got = list_offsets(c, "s", 0, ts, version=first_version)
        want = {-3: (0, 1, T0 + 9, 0),  # the first record with the largest timestamp
                -4: (0, 0, -1, 0),  # no tiered storage: the log start offset
                -5: (0, -1, -1, -1),  # nothing tiered
                -6: (0, -1, -1, -1)}[ts]
        assert got == want
        assert list_offsets(c, "s", 0, ts, version=11) == want


def test_list_offsets_bad_input(broker: EmbeddedBroker) -> None:
    assert Admin(broker.bootstrap).create_topic("b", partitions=1) is None
    produce(broker.bootstrap, "b", 0, 2)
    with Connection(broker.bootstrap) as c:
        for ts in (-7, -100):  # negative and no sentinel
            assert list_offsets(c, "b", 0, ts) == (E.unsupported_version, -1, -1, -1)
        assert list_offsets(c, "b", 1, -1) == (E.unknown_topic_or_partition, -1, -1, -1)
        assert list_offsets(c, "zz", 0, -1) == (E.unknown_topic_or_partition, -1, -1, -1)
        r = c.request(LIST_OFFSETS, 11, {"replica_id": -1, "isolation_level": 0, "timeout": 1000, "topics": [
            {"name": "b", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1},
                                         {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -2}]}]})
        assert [int(p.error_code) for p in r.topics[0].partitions] == [E.invalid_request, E.invalid_request]
        assert list_offsets(c, "b", 0, -1) == (0, 2, -1, 0)  # still served


# -- DescribeLogDirs -------------------------------------------------------------------


def _on_disk(data_dir: Path, topic: str, partition: int) -> int:
    return sum(p.stat().st_size for p in (data_dir / f"{topic}-{partition}").glob("*.log"))


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_describe_log_dirs(broker: EmbeddedBroker, version: int) -> None:
    admin = Admin(broker.bootstrap)
    assert admin.create_topic("a", partitions=2) is None
    assert admin.create_topic("b", partitions=1) is None
    produce(broker.bootstrap, "a", 1, 5)
    produce(broker.bootstrap, "b", 0, 2)
    with Connection(broker.bootstrap) as c:
        r = c.request(DESCRIBE_LOG_DIRS, version, {"topics": None})
        if version >= 3:
            assert r.error_code == 0
        assert len(r.results) == 1
        res = r.results[0]
        assert res.error_code == 0 and res.log_dir == str(broker.data_dir.resolve())
        sizes = {(t.name, p.partition_index): (int(p.partition_size), int(p.offset_lag), p.is_future_key)
                 for t in res.topics for p in t.partitions}
        assert sizes == {(t, i): (_on_disk(broker.data_dir, t, i), 0, False)
                         for t, i in (("a", 0), ("a", 1), ("b", 0))}
        assert sizes[("a", 1)][0] > 0 and sizes[("a", 0)][0] == 0
        if version >= 4:
            st = os.statvfs(broker.data_dir)
            assert res.total_bytes == st.f_blocks * st.f_frsize
            assert 0 < res.usable_bytes <= res.total_bytes
        # a subset; unknown topics and partitions are left out, every topic is listed
        r = c.request(DESCRIBE_LOG_DIRS, version, {"topics": [
            {"topic": "a", "partitions": [1, 7]}, {"topic": "nope", "partitions": [0]}]})
        got = {t.name: [(p.partition_index, int(p.partition_size)) for p in t.partitions]
               for t in r.results[0].topics}
        assert got == {"a": [(1, _on_disk(broker.data_dir, "a", 1))], "b": []}
        r = c.request(DESCRIBE_LOG_DIRS, version, {"topics": []})
        assert {t.name: list(t.partitions) for t in r.results[0].topics} == {"a": [], "b": []}
