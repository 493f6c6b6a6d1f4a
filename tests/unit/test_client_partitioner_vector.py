"""Keyed produce_batch: murmur2 of many keys at once with numpy, and the grouping of records by partition.

The vectorised hash (oncelog.client.partitioner.murmur2_buffers / murmur2_many) must equal the scalar
``murmur2`` (Java's ``Utils.murmur2``) for every key, from a list of bytes or an Arrow array; key_groups
must put each record where ``partition_for_key`` does, keep the order given within a partition, and send
every null key to the one sticky partition, as the per-record loop did.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

np = pytest.importorskip("numpy")

from oncelog.client import partitioner  # noqa: E402
from oncelog.client.partitioner import (  # noqa: E402
    VECTOR_MIN,
    key_groups,
    murmur2,
    murmur2_many,
    partition_for_key,
)
from tests.unit.murmur2_vectors import MURMUR2_JAVA  # noqa: E402

# keys of every length 0..100 (all four lengths mod 4, empty keys, several blocks)
_keys = st.lists(st.binary(min_size=0, max_size=100), min_size=0, max_size=60)


@given(_keys)
@settings(max_examples=300, deadline=None)
def test_murmur2_many_equals_the_scalar_murmur2_for_a_list(keys: list[bytes]) -> None:
    assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]


@given(st.lists(st.integers(0, 100), min_size=1, max_size=40), st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_murmur2_many_equals_the_scalar_murmur2_whatever_the_lengths(lengths: list[int], rng: Any) -> None:
    """Lengths drawn first so that every mix of block counts and tails occurs: keys sorted by block count
    inside, the few longest finished key by key."""
    keys = [rng.randbytes(n) for n in lengths]
    assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]


def test_murmur2_many_long_keys_among_short_ones() -> None:
    """A batch with a few very long keys (the block loop stops when fewer than a handful of keys are left
    and finishes them key by key) and with many long keys (no early stop)."""
    rng = random.Random(5)
    for longs in (1, 3, 7, 8, 9, 15, 16, 17, 40):
        keys = [rng.randbytes(rng.randrange(0, 24)) for _ in range(200)]
        for _ in range(longs):
            keys.insert(rng.randrange(len(keys)), rng.randbytes(rng.randrange(1000, 5000)))
        assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys], longs


def test_murmur2_many_finishes_fewer_than_16_long_keys_key_by_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """When only a few keys still have blocks, a numpy pass per block costs more than their blocks key by key:
    measured break-even 16 keys (bench/murmur2_keys.py --column-min): 15 long keys among short ones are
    finished key by key, 16 take a numpy pass per block (with the same hashes either way)."""
    finished: list[int] = []
    mix = partitioner._mix_blocks

    def counting(h: int, blocks: list[int]) -> int:
        finished.append(len(blocks))
        return mix(h, blocks)

    monkeypatch.setattr(partitioner, "_mix_blocks", counting)
    rng = random.Random(6)
    for longs, by_key in ((8, 8), (15, 15), (16, 0), (30, 0)):
        finished.clear()
        keys = [rng.randbytes(rng.randrange(0, 24)) for _ in range(40)] + [rng.randbytes(4000) for _ in range(longs)]
        rng.shuffle(keys)
        assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]
        assert len(finished) == by_key, longs


def test_murmur2_many_matches_java() -> None:
    """Java's values (Kafka's UtilsTest and bytes >= 0x80, tests/unit/murmur2_vectors.py), all in one batch
    (a list and an Arrow array), and each key's partition (Java's toPositive(h) % n) from key_groups."""
    keys = [k for k, _ in MURMUR2_JAVA]
    want = [v for _, v in MURMUR2_JAVA]
    assert murmur2_many(keys).tolist() == want
    assert murmur2_many(keys[::-1] * 5).tolist() == want[::-1] * 5
    pa = pytest.importorskip("pyarrow")
    from oncelog.client.arrow import as_binary

    assert murmur2_many(as_binary(pa.array(keys, pa.binary()))).tolist() == want
    many = keys * 4  # from VECTOR_MIN keys: the numpy grouping
    assert len(many) >= VECTOR_MIN
    for src in (many, as_binary(pa.array(many, pa.binary()))):
        got = [-1] * len(many)
        for p, idx in key_groups(src, 7, lambda: 0):
            for i in idx:
                got[int(i)] = p
        assert got == [(v & 0x7FFFFFFF) % 7 for v in want * 4]


def test_murmur2_many_null_keys_in_a_list() -> None:
    keys = [b"21", None, b"abc", None]
    assert murmur2_many(keys).tolist() == [-973932308, 0, 479470107, 0]


# -- Arrow keys ----------------------------------------------------------------------------------------


def _arrow(values: list[Any], type_: Any, rng: random.Random, seen: set[str]) -> tuple[list[Any], Any]:
    """``values`` as a pyarrow array of ``type_``, sometimes sliced (offset > 0) or chunked; returns the
    values it holds and the array."""
    pa = pytest.importorskip("pyarrow")
    arr = pa.array(values, type_)
    if len(values) > 3 and rng.random() < 0.5:
        a = rng.randrange(1, len(values) - 1)
        b = rng.randrange(a, len(values) + 1)
        values, arr = values[a:b], arr.slice(a, b - a)
        seen.add("sliced")
    if len(values) > 2 and rng.random() < 0.3:
        m = len(values) // 2
        arr = pa.chunked_array([arr.slice(0, m), arr.slice(m)], type_)
        seen.add("chunked")
    return values, arr


@given(st.lists(st.one_of(st.none(), st.binary(max_size=100)), max_size=60), st.randoms(use_true_random=False),
       st.sampled_from(["binary", "large_binary"]))
@settings(max_examples=200, deadline=None)
def test_murmur2_many_equals_the_scalar_murmur2_for_arrow_binary(keys: list[bytes | None], rng: Any,
                                                                   kind: str) -> None:
    pa = pytest.importorskip("pyarrow")
    from oncelog.client.arrow import as_binary

    keys, arr = _arrow(keys, getattr(pa, kind)(), rng, set())
    got = murmur2_many(as_binary(arr)).tolist()
    assert got == [0 if k is None else murmur2(k) for k in keys]


@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=60), st.randoms(use_true_random=False),
       st.sampled_from(["string", "large_string"]))
@settings(max_examples=200, deadline=None)
def test_murmur2_many_equals_the_scalar_murmur2_for_arrow_strings(keys: list[str | None], rng: Any,
                                                                    kind: str) -> None:
    """Arrow string keys (any Unicode: non-ASCII text is hashed as its UTF-8 bytes, as produce() does)."""
    pa = pytest.importorskip("pyarrow")
    from oncelog.client.arrow import as_binary

    keys, arr = _arrow(keys, getattr(pa, kind)(), rng, set())
    got = murmur2_many(as_binary(arr)).tolist()
    assert got == [0 if k is None else murmur2(k.encode()) for k in keys]


def test_arrow_keys_sliced_and_chunked_are_covered() -> None:
    """The Arrow cases the property tests draw at random, made sure of once: sliced, chunked, non-ASCII,
    and a data buffer that ends right after the last key's tail (copied to read the tail as a word)."""
    pa = pytest.importorskip("pyarrow")
    from oncelog.client.arrow import as_binary

    rng = random.Random(3)
    seen: set[str] = set()
    for _ in range(200):
        keys = [None if rng.random() < 0.1 else "ключ-%d-€" % rng.randrange(10 ** rng.randrange(1, 12))
                for _ in range(rng.randrange(0, 50))]
        keys, arr = _arrow(keys, pa.string(), rng, seen)
        assert murmur2_many(as_binary(arr)).tolist() == [0 if k is None else murmur2(k.encode()) for k in keys]
    assert seen == {"sliced", "chunked"}
    # a buffer built by hand with no padding past the last key (lengths 5: a 1-byte tail at the very end)
    data = b"abcde" + b"12345"
    arr = pa.Array.from_buffers(pa.binary(), 2, [None, pa.py_buffer(np.array([0, 5, 10], np.int32).tobytes()),
                                                 pa.py_buffer(data)])
    assert murmur2_many(arr).tolist() == [murmur2(b"abcde"), murmur2(b"12345")]


def test_arrow_keys_of_a_slice_copy_only_the_slice_bytes() -> None:
    """A buffer with no room for the 3 bytes read past the last key is copied: only the slice's own byte
    range (the last 2 keys of 100 x 1000 bytes: 2,003 bytes, not the parent's 100,003); hashes unchanged."""
    pa = pytest.importorskip("pyarrow")
    from oncelog.client.arrow import arrow_key_buffers

    rng = random.Random(9)
    keys = [rng.randbytes(1000) for _ in range(100)]
    offsets = np.arange(0, 100_001, 1000, dtype=np.int32)
    arr = pa.Array.from_buffers(pa.binary(), 100, [None, pa.py_buffer(offsets.tobytes()),
                                                   pa.py_buffer(b"".join(keys))])  # exactly sized
    for a, b in ((98, 100), (0, 100), (99, 100)):  # the last key ends at the buffer's end: copied
        data, starts, lengths, nulls = arrow_key_buffers(arr.slice(a, b - a))
        assert len(data) == 1000 * (b - a) + 3 and starts.tolist() == list(range(0, 1000 * (b - a), 1000))
        assert murmur2_many(arr.slice(a, b - a)).tolist() == [murmur2(k) for k in keys[a:b]]
    inner = arr.slice(40, 3)  # room past its keys in the parent's buffer: not copied, the parent's offsets
    data, starts, _, _ = arrow_key_buffers(inner)
    assert np.shares_memory(data, np.frombuffer(inner.buffers()[2], np.uint8)) and int(starts[0]) == 40_000
    assert murmur2_many(inner).tolist() == [murmur2(k) for k in keys[40:43]]


# -- grouping by partition -----------------------------------------------------------------------------


def _scalar_groups(keys: list[bytes | None], n: int, sticky: int) -> list[tuple[int, list[int]]]:
    """The per-record loop produce_batch ran before: dict insertion order, indices in order."""
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(sticky if k is None else partition_for_key(k, n), []).append(i)
    return list(groups.items())


@given(st.lists(st.one_of(st.none(), st.binary(max_size=30)), max_size=200), st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_key_groups_equal_the_per_record_loop(keys: list[bytes | None], partitions: int) -> None:
    """Every record in its key's partition, each partition's records in the order given, partitions in
    the order of their first record, every null key in the sticky partition (asked once, only if needed)."""
    calls: list[int] = []
    sticky = partitions - 1

    def null_partition() -> int:
        calls.append(1)
        return sticky

    got = [(p, list(idx)) for p, idx in key_groups(keys, partitions, null_partition)]
    assert got == _scalar_groups(keys, partitions, sticky)
    assert len(calls) == (1 if None in keys else 0)
    for _, idx in got:
        assert idx == sorted(idx)  # input order within a partition


def test_key_groups_vectorised_from_vector_min_for_lists_and_arrow() -> None:
    """Small batches take the per-record loop (lists of indices), larger ones numpy (index arrays), for
    lists and Arrow keys: the same groups either way."""
    pa = pytest.importorskip("pyarrow")
    from oncelog.client.arrow import as_binary

    rng = random.Random(8)
    for n in (1, VECTOR_MIN - 1, VECTOR_MIN, 1000, 20000):
        keys: list[bytes | None] = [b"user-%011d" % rng.randrange(10 ** 9) for _ in range(n)]
        keys[rng.randrange(n)] = None
        want = _scalar_groups(keys, 12, 5)
        groups = key_groups(keys, 12, lambda: 5)
        assert all(isinstance(idx, list) for _, idx in groups) == (n < VECTOR_MIN)
        assert [(p, list(idx)) for p, idx in groups] == want
        agroups = key_groups(as_binary(pa.array(keys, pa.binary())), 12, lambda: 5)
        assert all(isinstance(idx, list) for _, idx in agroups) == (n < VECTOR_MIN)
        assert [(p, list(idx)) for p, idx in agroups] == want


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_key_groups_numpy_path_for_tiny_batches(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The numpy grouping needs no special case for 0 or 1 records (bench/murmur2_keys.py runs it with
    VECTOR_MIN = 0): the same groups as the per-record loop."""
    monkeypatch.setattr(partitioner, "VECTOR_MIN", 0)
    keys: list[bytes | None] = [b"a", None, b"bb", b"a", b"ccc"][:n]
    groups = key_groups(keys, 3, lambda: 2)
    assert all(not isinstance(idx, list) for _, idx in groups)
    assert [(p, list(idx)) for p, idx in groups] == _scalar_groups(keys, 3, 2)


def test_key_groups_without_numpy_loop_per_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy is optional (oncelog[fast]): without it a list of keys is grouped record by record."""
    monkeypatch.setattr(partitioner, "_HAVE_NUMPY", False)
    keys = [b"k%d" % i for i in range(100)] + [None]
    groups = key_groups(keys, 7, lambda: 3)
    assert all(isinstance(idx, list) for _, idx in groups)
    assert groups == _scalar_groups(keys, 7, 3)


# -- the futures of a keyed call: one span per batch, holding its records' indices ----------------------


def test_spread_spans_complete_the_records_they_hold() -> None:
    """A keyed call's records go to partitions out of order: each batch's span holds the indices of its
    records, and a record's future (made when asked for, before or after its batch completes) gets the
    offset of its position in that batch; exception() is the error of the lowest failed record."""
    from concurrent.futures import Future

    from oncelog.client.aio.producer import BatchFutures

    futs = BatchFutures(7, Future)
    a, b = futs.spread(np.array([0, 2, 5, 6])), futs.spread([1, 3, 4])
    s0, s1 = a._span(0, 2), a._span(2, 2)  # records 0, 2 | 5, 6 (two batches of partition 0)
    s2 = b._span(0, 3)  # records 1, 3, 4 (partition 1)
    early = futs[2], futs[6], futs[3]  # asked for before delivery
    assert not futs.done()
    s0.finish("t", 0, 10, 111, None)
    s1.finish("t", 0, 12, 111, None)
    assert not futs.done() and early[0].result().offset == 11 and early[1].result().offset == 13
    s2.finish("t", 1, -1, -1, KeyError("lost"))
    assert futs.done()
    assert [(f.result().partition, f.result().offset) for f in (futs[0], futs[2], futs[5], futs[6])] == \
        [(0, 10), (0, 11), (0, 12), (0, 13)]
    assert isinstance(early[2].exception(), KeyError) and isinstance(futs[4].exception(), KeyError)
    assert str(futs.exception()) == "'lost'"
    futs2 = BatchFutures(3, Future)
    x, y = futs2.spread([0, 2]), futs2.spread([1])
    sx, sy = x._span(0, 2), y._span(0, 1)
    sx.finish("t", 0, -1, -1, ValueError("later"))
    sy.finish("t", 1, -1, -1, KeyError("first"))
    assert isinstance(futs2.exception(), ValueError)  # record 0 failed: the lowest record's error


class _ProbeLock:
    """The call's lock, recording at each acquire whether the record map of ``futs`` existed already."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.futs: Any = None
        self.map_at_acquire: list[bool] = []

    def acquire(self) -> bool:
        self._lock.acquire()
        self.map_at_acquire.append(self.futs is not None and self.futs._where is not None)
        return True

    def release(self) -> None:
        self._lock.release()


@pytest.mark.parametrize("kind", ["arrays", "lists"])
def test_spread_record_map_is_built_before_the_lock_is_taken(kind: str) -> None:
    """The first future asked for maps every record of a keyed call to its span (milliseconds for a million
    records): that must happen before the lock the loop thread's completions take, so the first acquire
    already finds the map; the map gives every record its span and position, and the futures their offsets."""
    from concurrent.futures import Future

    from oncelog.client.aio.producer import BatchFutures

    rng = random.Random(4)
    n = 5000
    keys = [b"k%d" % rng.randrange(10 ** 6) for _ in range(n)]
    groups = key_groups(keys, 7, lambda: 0)
    if kind == "lists":
        groups = [(p, list(idx)) for p, idx in groups]
    lock = _ProbeLock()
    futs = lock.futs = BatchFutures(n, Future, lock)
    want: dict[int, tuple[int, int]] = {}  # record -> (its partition, its offset)
    for p, idx in groups:
        sf = futs.spread(idx)
        for i in range(0, len(idx), 100):
            s = len(futs._spans)  # the span's number: its batch gets offsets 1000 * s, 1000 * s + 1, ...
            sf._span(i, min(100, len(idx) - i))
            want.update((int(r), (p, 1000 * s + k)) for k, r in enumerate(idx[i:i + 100]))
    first = futs[n // 2]
    assert lock.map_at_acquire and all(lock.map_at_acquire), lock.map_at_acquire
    for s, sp in enumerate(futs._spans):
        sp.finish("t", want[sp.start][0], 1000 * s, 7, None)
    assert (first.result(0).partition, first.result(0).offset) == want[n // 2]
    assert [(f.result(0).partition, f.result(0).offset) for f in futs] == [want[i] for i in range(n)]


class _GatedIndex:
    """A record index whose use as a list index (``__index__``) waits on ``gate`` once: stops the record
    map's build half way, so a test can complete a batch meanwhile."""

    def __init__(self, value: int, gate: Any = None) -> None:
        self.value, self.gate = value, gate

    def __index__(self) -> int:
        if self.gate is not None:
            building, go = self.gate
            self.gate = None
            building.set()
            go.wait(10)
        return self.value

    __int__ = __index__


def test_spread_completion_is_not_held_up_by_the_record_map() -> None:
    """While the first future asked for of a keyed call builds the record map (on a caller's thread), the
    loop thread completes a batch: that completion must not wait for the build (it takes the call's lock)."""
    import threading
    from concurrent.futures import Future

    from oncelog.client.aio.producer import BatchFutures

    building, go = threading.Event(), threading.Event()
    futs = BatchFutures(6, Future, threading.Lock())
    a = futs.spread([_GatedIndex(0), _GatedIndex(2), _GatedIndex(4, (building, go))])
    b = futs.spread([_GatedIndex(1), _GatedIndex(3), _GatedIndex(5)])
    sa, sb = a._span(0, 3), b._span(0, 3)
    got: list[Any] = []
    asker = threading.Thread(target=lambda: got.append(futs[3]))
    asker.start()
    try:
        assert building.wait(10)
        finisher = threading.Thread(target=sb.finish, args=("t", 1, 20, 5, None))
        finisher.start()
        finisher.join(5)
        completed_meanwhile = not finisher.is_alive()
    finally:
        go.set()
        asker.join(10)
    finisher.join(10)
    assert completed_meanwhile, "the batch's completion waited for the record map"
    sa.finish("t", 0, 10, 5, None)
    assert got[0].result(0).offset == 21  # record 3: position 1 in the second span
    assert [futs[i].result(0).offset for i in range(6)] == [10, 20, 11, 21, 12, 22]
