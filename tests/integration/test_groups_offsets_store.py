"""The offsets store of a running broker: snapshots keep its log short, and
commits survive kill -9 and clean restarts, before and after a snapshot."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from oncelog.client.connection import Connection
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(120)

TOPIC, PARTITIONS = "store-t", 3
OFFSETS_DIR = "__consumer_offsets-0"


def commit(conn: Connection, group: str, partition: int, offset: int, metadata: str) -> None:
    r = conn.request(8, 8, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                            "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
                                {"partition_index": partition, "committed_offset": offset,
                                 "committed_leader_epoch": 0, "committed_metadata": metadata}]}]})
    assert r.topics[0].partitions[0].error_code == 0


def fetch(conn: Connection, group: str) -> dict[int, tuple[int, str]]:
    r = conn.request(9, 7, {"group_id": group, "topics": None, "require_stable": False})
    assert r.error_code == 0
    return {p.partition_index: (p.committed_offset, p.metadata) for t in r.topics for p in t.partitions}


def log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / OFFSETS_DIR).glob("*.log"))


def test_snapshots_compact_and_commits_survive_restarts(tmp_path: Path, kit: Any) -> None:
    data = tmp_path / "data"
    broker = EmbeddedBroker(data_dir=data, log_path=tmp_path / "broker.log",
                            config={"oncelog.offsets.snapshot.bytes": "8192"})
    broker.start()
    try:
        kit.create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        want: dict[str, dict[int, tuple[int, str]]] = {}
        with Connection(broker.bootstrap) as conn:
            for i in range(400):
                group, part = f"g{i % 4}", i % PARTITIONS
                commit(conn, group, part, i, f"meta-{i}")
                want.setdefault(group, {})[part] = (i, f"meta-{i}")
        # ~400 records of ~150 bytes were written; the periodic snapshot truncates the log
        deadline = time.monotonic() + 10
        while not list((data / OFFSETS_DIR).glob("*.offsets-snapshot")) or log_bytes(data) >= 8192:
            assert time.monotonic() < deadline, f"no snapshot (log {log_bytes(data)} bytes)"
            time.sleep(0.2)
        with Connection(broker.bootstrap) as conn:
            commit(conn, "g0", 0, 10_000, "after-snapshot")
            want["g0"][0] = (10_000, "after-snapshot")
            conn.request(42, 2, {"groups_names": ("g3",)})
            del want["g3"]

        broker.restart(hard=True)
        with Connection(broker.bootstrap) as conn:
            for group, parts in want.items():
                assert fetch(conn, group) == parts, group
            assert fetch(conn, "g3") == {}
            commit(conn, "g1", 2, 20_000, "before-clean-stop")
            want["g1"][2] = (20_000, "before-clean-stop")

        broker.restart()  # clean stop writes a final snapshot
        assert log_bytes(data) == 0
        with Connection(broker.bootstrap) as conn:
            for group, parts in want.items():
                assert fetch(conn, group) == parts, group
            # deleting a topic deletes its committed offsets (and groups left with none)
            r = conn.request(20, 6, {"topics": [{"name": TOPIC, "topic_id": None}], "timeout": 10000})
            assert r.responses[0].error_code == 0
            kit.wait_until(lambda: all(fetch(conn, group) == {} for group in want), 5, message="offsets to go")
            listed = conn.request(16, 4, {"states_filter": ()})
            assert not {g.group_id for g in listed.groups} & set(want)
    finally:
        broker.close()
