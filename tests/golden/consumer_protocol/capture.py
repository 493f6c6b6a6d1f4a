"""Capture ConsumerProtocolSubscription bytes sent by librdkafka and kafka-python members.

Our :class:`~oncelog.client.aio.group.GroupMember` leads a group on a real
:class:`~oncelog.testing.EmbeddedBroker`; a confluent-kafka (librdkafka) and
a kafka-python consumer join it with the same assignor. The leader sees every
member's subscription in its JoinGroup response; after the group settled the
leader forces one more rebalance, so that cooperative members send their owned
partitions and generation too. Each member's last subscription is written as
``<client>_<assignor>.bin`` (the raw metadata bytes of the JoinGroup member)
and ``tests/unit/test_assignors.py`` decodes them.

Run from the repository root::

    .venv/bin/python tests/golden/consumer_protocol/capture.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOPIC = "golden-cp"
PARTITIONS = 4


def _consumer_thread(kind: str, bootstrap: str, group: str, assignor: str, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        if kind == "librdkafka":
            from confluent_kafka import Consumer

            c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "librdkafka",
                          "partition.assignment.strategy": assignor, "session.timeout.ms": 6000,
                          "heartbeat.interval.ms": 300})
            c.subscribe([TOPIC])
            while not stop.is_set():
                c.poll(0.1)
            c.close()
        else:
            from kafka import KafkaConsumer
            from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
            from kafka.coordinator.assignors.range import RangePartitionAssignor
            from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

            cls = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
                   "cooperative-sticky": CooperativeStickyAssignor}[assignor]
            c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, client_id="kafka-python",
                              partition_assignment_strategy=[cls], session_timeout_ms=6000,
                              heartbeat_interval_ms=300)
            c.subscribe([TOPIC])
            while not stop.is_set():
                c.poll(timeout_ms=100)
            c.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


async def capture(bootstrap: str, assignor: str) -> dict[str, bytes]:
    from oncelog.client.aio.cluster import Cluster
    from oncelog.client.aio.group import GroupMember
    from oncelog.client.config import parse_config

    group = f"golden-{assignor}"
    conf = parse_config({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "oncelog",
                         "partition.assignment.strategy": assignor, "session.timeout.ms": 6000,
                         "heartbeat.interval.ms": 300}, "consumer")
    cluster = Cluster(conf)
    await cluster.start()
    member = GroupMember(cluster, conf, [TOPIC])
    seen: dict[str, bytes] = {}
    orig = member._assign

    async def spy(protocol: str, members: Any) -> Any:
        for m in members:
            for name in ("librdkafka", "kafka-python"):
                if m.member_id.startswith(name):
                    seen[name] = bytes(m.metadata)
        return await orig(protocol, members)

    member._assign = spy  # type: ignore[method-assign]
    await member.start()
    await member.wait_assigned(30)
    stop = threading.Event()
    threads = [_consumer_thread(k, bootstrap, group, assignor, stop) for k in ("librdkafka", "kafka-python")]
    deadline = time.monotonic() + 60
    while len(member.assignment) != PARTITIONS // 3 + (1 if PARTITIONS % 3 else 0) or len(seen) < 2:
        member.poll_happened()
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(3)
    member.request_rejoin("capture owned partitions")
    for _ in range(50):
        member.poll_happened()
        await asyncio.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30)
    await member.close()
    await cluster.close()
    return seen


def main() -> int:
    from confluent_kafka.admin import AdminClient, NewTopic

    from oncelog.testing import EmbeddedBroker

    with tempfile.TemporaryDirectory() as d:
        with EmbeddedBroker(data_dir=Path(d) / "data", config={"group.initial.rebalance.delay.ms": "0"}) as b:
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])[TOPIC].result(20)
            for assignor in ("range", "roundrobin", "cooperative-sticky"):
                seen = asyncio.run(capture(b.bootstrap, assignor))
                for client, data in sorted(seen.items()):
                    path = HERE / f"{client}_{assignor}.bin"
                    path.write_bytes(data)
                    print(f"wrote {path.name} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
