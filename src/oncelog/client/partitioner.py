"""The default partitioner: murmur2 for keyed records, sticky for null keys.

Keyed records go to ``(murmur2(key) & 0x7fffffff) % partitions``: the Java
client's ``Utils.murmur2`` / ``toPositive`` (seed 0x9747b28c) and
librdkafka's ``murmur2_random`` partitioner, so the same key lands on the
same partition with Java, librdkafka (confluent-kafka with
``partitioner=murmur2_random``) and oncelog.

Records without a key stick to one partition until that partition's batch
is sent or full, then move to another (KIP-480's sticky partitioner); the
producer calls :meth:`StickyPartitioner.next` when that happens. The blocking
producer calls it from its callers' threads (under its own lock) and from its
loop thread (not under that lock), so the partitioner makes each of its
read-then-move steps atomic with a lock of its own; the common read (the
topic's current partition) takes no lock.
"""

from __future__ import annotations

import random
import threading

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key"]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` as a signed 32-bit int (Java's ``Utils.murmur2``)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    n4 = length & ~3
    mv = memoryview(data)
    if n4:
        for k in mv[:n4].cast("I") if _LITTLE else _words(data, n4):
            k = (k * _M) & _MASK
            k ^= k >> 24
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[n4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 + 1] << 8
    if rest >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def _words(data: bytes, n4: int) -> list[int]:
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, n4, 4)]


_LITTLE = memoryview(b"\x01\x00\x00\x00").cast("I")[0] == 1


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Java's default partitioner and librdkafka's murmur2_random pick for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class StickyPartitioner:
    """Per-topic sticky partition for records without a key."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._current: dict[str, int] = {}
        self._rng = rng or random.Random()
        self._lock = threading.Lock()

    def partition(self, topic: str, partitions: int) -> int:
        p = self._current.get(topic)
        if p is not None and p < partitions:
            return p
        with self._lock:
            p = self._current.get(topic)
            if p is None or p >= partitions:
                p = self._rng.randrange(partitions)
                self._current[topic] = p
            return p

    def next(self, topic: str, partitions: int, previous: int) -> None:
        """The batch of ``previous`` is done: pick another partition (a different one if there are several).

        Two threads finishing the same batch at once move it once: the second sees it moved. A batch of a
        partition the topic is not stuck to (explicit partitions, keyed records) takes no lock."""
        if self._current.get(topic) != previous:
            return
        with self._lock:
            if self._current.get(topic) != previous:
                return
            if partitions <= 1:
                self._current[topic] = 0
                return
            p = self._rng.randrange(partitions - 1)
            self._current[topic] = p if p < previous else p + 1
