"""kafkajs 2.2.4 joins a consumer group and commits (tests/js/group.js).

Two runs of a kafkajs Consumer in the same group: the first reads every
record from the beginning and commits; after more records arrive the second
resumes exactly at those commits. Both the kafkajs admin (OffsetFetch,
DescribeGroups) and oncelog's own protocol client must see the commits.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from oncelog.client.groups import GroupAdmin
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(180)

JS_DIR = Path(__file__).resolve().parent.parent / "js"
SCRIPT = JS_DIR / "group.js"
NODE_TIMEOUT = 90
PARTITIONS = 3


def run_group(node: str, bootstrap: str, topic: str, group: str, count: int) -> dict[str, Any]:
    proc = subprocess.run(
        [node, str(SCRIPT), bootstrap, topic, group, str(count)],
        cwd=JS_DIR, capture_output=True, text=True, timeout=NODE_TIMEOUT,
        env={**os.environ, "GROUP_DEADLINE_MS": str((NODE_TIMEOUT - 10) * 1000)},
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output from group.js (rc={proc.returncode}); stderr:\n{proc.stderr[-4000:]}"
    summary = json.loads(lines[-1])
    assert proc.returncode == 0 and summary.get("ok") is True, (
        f"group.js failed (rc={proc.returncode}): {summary.get('error')}\nstderr:\n{proc.stderr[-4000:]}")
    return summary


def produce(bootstrap: str, topic: str, start: int, per_partition: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(start, start + per_partition):
        for part in range(PARTITIONS):
            p.produce(topic, value=f"{part}-{i}".encode(), partition=part)
    assert p.flush(30) == 0


def test_kafkajs_joins_group_and_commits(node: str, tmp_path: Path, kit: Any) -> None:
    broker = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log",
                            config={"group.initial.rebalance.delay.ms": "0"})
    broker.start()
    topic, group = "js-group", "js-group"
    try:
        kit.create_topic(broker.bootstrap, topic, PARTITIONS)
        produce(broker.bootstrap, topic, 0, 20)

        first = run_group(node, broker.bootstrap, topic, group, 20 * PARTITIONS)
        [join] = first["joins"]
        assert join["isLeader"] and join["leaderId"] == join["memberId"]
        assert sorted(join["assignment"][topic]) == list(range(PARTITIONS))
        got = sorted((r["partition"], r["offset"]) for r in first["records"])
        assert got == [(p, o) for p in range(PARTITIONS) for o in range(20)]
        assert first["committed"] == {str(p): 20 for p in range(PARTITIONS)}
        assert first["fetched"] == [{"partition": p, "offset": 20} for p in range(PARTITIONS)]
        assert first["describedWhileMember"]["state"] == "Stable"
        assert first["describedWhileMember"]["protocolType"] == "consumer"
        assert first["describedWhileMember"]["members"] == [join["memberId"]]
        assert first["describedAfterLeave"] == {"state": "Empty", "members": 0}
        with GroupAdmin(broker.bootstrap) as admin:
            assert admin.committed(group) == {(topic, p): 20 for p in range(PARTITIONS)}

        # a new member of the group resumes at the commits
        produce(broker.bootstrap, topic, 20, 5)
        second = run_group(node, broker.bootstrap, topic, group, 5 * PARTITIONS)
        got = sorted((r["partition"], r["offset"]) for r in second["records"])
        assert got == [(p, o) for p in range(PARTITIONS) for o in range(20, 25)]
        assert second["fetched"] == [{"partition": p, "offset": 25} for p in range(PARTITIONS)]
        with GroupAdmin(broker.bootstrap) as admin:
            assert admin.committed(group) == {(topic, p): 25 for p in range(PARTITIONS)}
    finally:
        broker.close()
