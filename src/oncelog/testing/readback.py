"""Read a topic back with librdkafka, for exactly-once checks in tests.

confluent-kafka is a test dependency, imported when called.
"""

from __future__ import annotations

import time


def read_to_eof(bootstrap: str, topic: str, partitions: int, committed: bool = True, timeout: float = 30.0,
                group_id: str = "oncelog-readback") -> dict[int, list[bytes]]:
    """Every record value per partition from offset 0 to partition EOF.

    With ``committed`` the consumer is read_committed, so EOF is the last
    stable offset (aborted records are filtered, open transactions stop it);
    otherwise EOF is the high watermark and everything in the log is returned.
    Fails (AssertionError) on a consumer error or when EOF is not reached in time.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group_id, "enable.auto.commit": False,
        "isolation.level": "read_committed" if committed else "read_uncommitted",
        "enable.partition.eof": True, "auto.offset.reset": "error", "fetch.wait.max.ms": 100,
    })
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    eof: set[int] = set()
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(eof) < partitions:
            assert time.monotonic() < deadline, f"read of {topic} timed out; EOF on {sorted(eof)}"
            for m in c.consume(num_messages=1000, timeout=0.2):
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, f"consumer error: {m.error()}"
                    eof.add(m.partition())
                    continue
                out[m.partition()].append(m.value())
    finally:
        c.close()
    return out


def end_offset(bootstrap: str, topic: str, partition: int, isolation_level: int) -> int:
    """ListOffsets LATEST: the high watermark (isolation 0) or the last stable offset (isolation 1)."""
    from oncelog.client.reader import LATEST, PartitionReader

    with PartitionReader(bootstrap, timeout=10) as reader:
        return reader.list_offset(topic, partition, LATEST, isolation_level)
