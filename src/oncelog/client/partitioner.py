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
from collections.abc import Callable
from typing import Any

__all__ = ["StickyPartitioner", "key_groups", "murmur2", "murmur2_buffers", "murmur2_many", "partition_for_key"]

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


def _mix_blocks(h: int, blocks: list[int]) -> int:
    """The hash state ``h`` after mixing in the 4-byte ``blocks`` (little-endian words), as in :func:`murmur2`."""
    for k in blocks:
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    return h


def _words(data: bytes, n4: int) -> list[int]:
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, n4, 4)]


_LITTLE = memoryview(b"\x01\x00\x00\x00").cast("I")[0] == 1


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Java's default partitioner and librdkafka's murmur2_random pick for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# keyed batches of at least this many records are hashed and grouped with numpy (when it is installed);
# smaller ones key by key (docs/benchmarks.md "Keyed batches: murmur2 vectorised")
VECTOR_MIN = 32
# the block loop of murmur2_buffers runs while at least this many keys still have a block at its column;
# the few longer keys left are hashed key by key (one very long key must not cost a numpy pass per block):
# a numpy pass over a column costs about what 16 keys' blocks cost key by key (measured break-even 16-18,
# docs/benchmarks.md "Keyed batches: murmur2 vectorised", bench/murmur2_keys.py --column-min)
_COLUMN_MIN = 16


def murmur2_buffers(data: Any, starts: Any, lengths: Any) -> Any:
    """:func:`murmur2` of many keys at once, with numpy: key ``i`` is ``data[starts[i]:starts[i] + lengths[i]]``
    (``data`` a uint8 array, ``starts`` and ``lengths`` int64 arrays); a uint32 array of the hashes (view it
    as int32 for Java's signed value).

    The 4-byte blocks are mixed column by column: block ``j`` of every key that has one, with the keys
    ordered by their block count (longest first) so that the keys of column ``j`` are a prefix. ``data``
    must have 3 readable bytes past the last key that has tail bytes (the tail is read as one word)."""
    import numpy as np

    n = len(lengths)
    m32 = np.uint32(_M)
    h = (np.uint32(0x9747B28C) ^ lengths.astype(np.uint32))
    if n == 0:
        return h
    nblocks = lengths >> 2
    top = int(nblocks.max())
    if len(data) >= 4:  # every 4-byte word of data, at any byte offset (an unaligned, overlapping view)
        words = np.ndarray((len(data) - 3,), "<u4", buffer=data, strides=(1,))
    if top:
        if int(nblocks.min()) == top:  # one block count (keys of one length): no reordering
            order = None
            hs, st, counts = h, starts, None
        else:  # longest first, stable (a radix sort for small counts)
            key = (top - nblocks).astype(np.uint16 if top < 1 << 16 else np.int64)
            order = np.argsort(key, kind="stable")
            hs, st = h[order], starts[order]
            counts = n - np.cumsum(np.bincount(nblocks, minlength=top + 1))[:top]  # keys with > j blocks
        for j in range(top):
            c = n if counts is None else int(counts[j])
            if c < _COLUMN_MIN and counts is not None:  # the few longest keys: their other blocks key by key
                assert order is not None
                for r in range(c):
                    s = int(st[r])
                    hs[r] = _mix_blocks(int(hs[r]), words[s + 4 * j:s + 4 * int(nblocks[order[r]]):4].tolist())
                break
            k = words[st[:c] + 4 * j] * m32
            k ^= k >> np.uint32(24)
            k *= m32
            if c == n:
                hs *= m32
                hs ^= k
            else:
                hs[:c] = (hs[:c] * m32) ^ k
        if order is not None:
            h = np.empty_like(hs)
            h[order] = hs
        else:
            h = hs
    rest = lengths & 3
    tails = np.flatnonzero(rest)
    if len(tails):
        at = starts[tails] + 4 * nblocks[tails]
        t = words[at] & np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], np.uint32)[rest[tails]]
        h[tails] = (h[tails] ^ t) * m32
    h ^= h >> np.uint32(13)
    h *= m32
    h ^= h >> np.uint32(15)
    return h


def key_groups(keys: Any, partitions: int, null_partition: Callable[[], int]) -> list[tuple[int, Any]]:
    """The records of a keyed batch by partition: ``[(partition, indices)]``, partitions in the order of
    their first record, each one's indices ascending (the order given, which is Kafka's order in it).

    ``keys``: a list of ``bytes`` / ``None``, or a pyarrow ``binary``/``large_binary`` Array
    (:func:`oncelog.client.arrow.as_binary`; then numpy is installed). A keyed record goes to
    :func:`partition_for_key`, every null key to ``null_partition()`` (called once, and only when there
    is one: the sticky partition). ``indices`` is a list of ints, or an int64 array when numpy hashed the
    batch: from :data:`VECTOR_MIN` records on, every key is hashed with :func:`murmur2_buffers` and the
    records are grouped with a stable sort (below it, key by key: numpy's fixed cost is larger)."""
    n = len(keys)
    if n < VECTOR_MIN or not _numpy():
        if not isinstance(keys, (list, tuple)):  # a few Arrow keys (a larger array implies numpy)
            keys = keys.to_pylist()
        groups: dict[int, list[int]] = {}
        sticky = -1
        for i, k in enumerate(keys):
            if k is None:
                if sticky < 0:
                    sticky = null_partition()
                groups.setdefault(sticky, []).append(i)
            else:
                groups.setdefault(partition_for_key(k, partitions), []).append(i)
        return list(groups.items())
    import numpy as np

    hashes, nulls = _hash_keys(keys)
    parts = ((hashes & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int64)
    if nulls is not None and nulls.any():
        parts[nulls] = null_partition()
    order = np.argsort(parts.astype(np.uint16) if partitions <= 1 << 16 else parts, kind="stable")
    ordered = parts[order]
    firsts = np.flatnonzero(np.diff(ordered, prepend=-1))  # where a partition's run starts (none: no records)
    ends = np.append(firsts[1:], n)
    by_first = np.argsort(order[firsts], kind="stable")  # partitions in the order of their first record
    return [(int(ordered[firsts[g]]), order[firsts[g]:ends[g]]) for g in by_first.tolist()]


def murmur2_many(keys: Any) -> Any:
    """:func:`murmur2` of every key (signed, as an int32 numpy array; 0 for a null key) of a list of
    ``bytes`` / ``None`` or an :func:`~oncelog.client.arrow.as_binary` Array, with numpy."""
    import numpy as np

    hashes, nulls = _hash_keys(keys)
    if nulls is not None:
        hashes[nulls] = 0
    return hashes.view(np.int32)


def _hash_keys(keys: Any) -> tuple[Any, Any]:
    """(uint32 murmur2 of every key, bool null mask or None) of a list or an Arrow binary Array."""
    import numpy as np

    if not isinstance(keys, (list, tuple)):
        from oncelog.client.arrow import arrow_key_buffers

        data, starts, lengths, nulls = arrow_key_buffers(keys)
        return murmur2_buffers(data, starts, lengths), nulls
    n = len(keys)
    nulls = None
    if None in keys:
        nulls = np.fromiter((k is None for k in keys), bool, n)
        keys = [b"" if k is None else k for k in keys]
    lengths = np.fromiter(map(len, keys), np.int64, n)
    starts = np.zeros(n, np.int64)
    if n:
        np.cumsum(lengths[:-1], out=starts[1:])
    data = np.frombuffer(b"".join([*keys, b"\0\0\0"]), np.uint8)  # the last key's tail is read as a word
    return murmur2_buffers(data, starts, lengths), nulls


def _numpy() -> bool:
    global _HAVE_NUMPY
    if _HAVE_NUMPY is None:
        try:
            import numpy  # noqa: F401
            _HAVE_NUMPY = True
        except ImportError:
            _HAVE_NUMPY = False
    return _HAVE_NUMPY


_HAVE_NUMPY: bool | None = None


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
