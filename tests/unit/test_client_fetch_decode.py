"""The consumer's decode path (``reader.fetched_columns``) and its buffer (``take_nowait``), without a broker.

``fetched_columns`` must give exactly what ``fetched_records`` gives (same
records, filter, checks, next position), only as columns; the consumer's
``_apply`` builds its messages from it, and ``take_nowait`` hands them out
from any thread with the positions ``consume`` would report.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.client.aio.consumer import Consumer
from oncelog.client.reader import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ReaderError,
    fetched_columns,
    fetched_records,
)
from oncelog.protocol import compression
from oncelog.protocol.records import (
    HEADER_SIZE,
    Record,
    encode_control_batch,
    encode_record_batch,
    update_crc,
)


def txn(offset: int, pid: int, n: int = 3, transactional: bool = True) -> bytes:
    return encode_record_batch([Record(f"{pid}-{offset + i}".encode(), b"v%d" % (offset + i), [("h", b"%d" % i)])
                                for i in range(n)], base_offset=offset, producer_id=pid, producer_epoch=0,
                               base_sequence=offset, is_transactional=transactional)


def marker(offset: int, pid: int, commit: bool) -> bytes:
    return encode_control_batch(pid, 0, commit, 0, base_offset=offset)


def compressed(codec: int, raw: bytes) -> bytes:
    """``raw`` (one uncompressed batch) with its records compressed by ``codec``, CRC fixed."""
    return compression.compressed_batch(raw, codec)


# pid 1 aborts 0..2 (marker 3); pid 2 commits 4..6 (marker 7); an idempotent batch 8..9; pid 1 again 10..12 committed
LOG = [txn(0, 1), marker(3, 1, False), txn(4, 2), marker(7, 2, True), txn(8, 5, 2, transactional=False),
       txn(10, 1), marker(13, 1, True)]
ABORTED = [(1, 0)]


def flat(columns: list[Any]) -> list[tuple[int, bytes | None, bytes | None, list[Any], int]]:
    return [row for c in columns for row in zip(c.offsets, c.keys, c.values, c.headers, c.timestamps)]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("isolation", [READ_UNCOMMITTED, READ_COMMITTED])
@pytest.mark.parametrize("position", [0, 1, 5, 9, 12, 14])
def test_columns_equal_records(codec: int, isolation: int, position: int) -> None:
    data = b"".join(compressed(codec, b) if codec and i % 2 == 0 else b for i, b in enumerate(LOG))
    records, batches, skipped, nxt = fetched_records(data, 7, position, isolation, ABORTED)
    columns, cbatches, cskipped, cnxt = fetched_columns(data, 7, position, isolation, ABORTED)
    assert flat(columns) == [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in records]
    assert (len(cbatches), cskipped, cnxt) == (len(batches), skipped, nxt)
    assert all(c.offsets for c in columns)  # no empty column sets after the cut
    if position == 0:
        want = [0, 1, 2, 4, 5, 6, 8, 9, 10, 11, 12] if isolation == READ_UNCOMMITTED else [4, 5, 6, 8, 9, 10, 11, 12]
        assert [o for o, *_ in flat(columns)] == want and cnxt == 14
    if position == 14:
        assert columns == [] and cnxt == 14


def test_columns_check_crc_and_ignore_a_partial_tail() -> None:
    good = txn(0, 1)
    columns, _, _, nxt = fetched_columns(good + good[:30], 0, 0, READ_UNCOMMITTED, [])
    assert [o for o, *_ in flat(columns)] == [0, 1, 2] and nxt == 3
    bad = bytearray(good)
    bad[-1] ^= 1
    with pytest.raises(ReaderError, match="CRC"):
        fetched_columns(bytes(bad), 0, 0, READ_UNCOMMITTED, [])
    assert fetched_columns(bytes(bad), 0, 0, READ_UNCOMMITTED, [], check_crc=False)[3] == 3
    gz = bytearray(compressed(1, good))
    gz[HEADER_SIZE + 12] ^= 0xFF  # corrupt the gzip stream, CRC recomputed so only decompression fails
    update_crc(gz)
    with pytest.raises(ReaderError):
        fetched_columns(bytes(gz), 0, 0, READ_UNCOMMITTED, [])


def response(data: bytes, aborted: list[tuple[int, int]] = ()) -> Any:  # type: ignore[assignment]
    return SimpleNamespace(error_code=0, records=data, aborted_transactions=[
        SimpleNamespace(producer_id=p, first_offset=o) for p, o in aborted])


def test_apply_then_take_nowait_positions() -> None:
    c = Consumer({"bootstrap.servers": "127.0.0.1:1", "isolation.level": "read_committed"})
    c.assign([("t", 0, 1)])
    st = c._parts[("t", 0)]
    assert c.take_nowait(5) is None  # nothing buffered: the caller must go through consume()
    assert c._apply(st, response(b"".join(LOG), ABORTED))
    got = c.take_nowait(2)
    assert got is not None and [(m.topic, m.partition, m.offset, m.key) for m in got] == [
        ("t", 0, 4, b"2-4"), ("t", 0, 5, b"2-5")]
    assert got[0].headers == [("h", b"0")] and got[0].value == b"v4"
    assert st.consumed == 6  # what position() reports and a commit would store
    rest = c.take_nowait(100)
    assert rest is not None and [m.offset for m in rest] == [6, 8, 9, 10, 11, 12]
    assert st.consumed == 14  # past the trailing COMMIT marker, as in Java
    assert c.take_nowait(1) is None
    # only markers or aborted data: no messages, the position moves past them
    assert not c._apply(st, response(txn(14, 1) + marker(17, 1, False), [(1, 14)]))
    assert st.consumed == st.fetch_pos == 18
    c._closed = True
    assert c._apply(st, response(txn(18, 9, transactional=False))) and c.take_nowait(1) is None


def test_take_nowait_from_threads_returns_each_record_once() -> None:
    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
    c.assign([("t", p, 0) for p in range(4)])
    n = 300
    for p in range(4):
        batches = b"".join(txn(o, 9, 10, transactional=False) for o in range(0, n, 10))
        assert c._apply(c._parts[("t", p)], response(batches))
    got: list[list[Any]] = [[] for _ in range(4)]

    def worker(i: int) -> None:
        while (ms := c.take_nowait(7)) is not None:
            got[i].extend(ms)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    seen = sorted((m.partition, m.offset) for g in got for m in g)
    assert seen == [(p, o) for p in range(4) for o in range(n)]
    assert all(c._parts[("t", p)].consumed == n for p in range(4))


def test_take_one_nowait_hands_out_what_take_nowait_would() -> None:
    def filled() -> Consumer:
        c = Consumer({"bootstrap.servers": "127.0.0.1:1", "isolation.level": "read_committed"})
        c.assign([("t", p, 0) for p in range(3)])
        for p in range(3):
            assert c._apply(c._parts[("t", p)], response(b"".join(LOG), ABORTED))
        return c

    one, many = filled(), filled()
    got, positions = [], []
    while (m := one.take_one_nowait()) is not None:
        got.append(m)
        positions.append(one._parts[("t", m.partition)].consumed)
    want, want_positions = [], []
    while (ms := many.take_nowait(1)) is not None:
        want.extend(ms)
        want_positions.append(many._parts[("t", ms[0].partition)].consumed)
    assert got == want and positions == want_positions
    # one partition's records until they run out, then the next partition's
    assert [(m.partition, m.offset) for m in got] == [(p, o) for p in range(3) for o in (4, 5, 6, 8, 9, 10, 11, 12)]
    assert positions[-1] == 14 and all(one._parts[("t", p)].consumed == 14 for p in range(3))


def test_a_batch_that_does_not_decode_fails_at_hand_out_after_the_records_before_it() -> None:
    import asyncio

    from oncelog.client.errors import KafkaError
    from oncelog.protocol.records import RECORDS_OFFSET

    bad = bytearray(txn(3, 9, 3, transactional=False))
    bad[RECORDS_OFFSET] += 2  # the first record's length no longer matches its fields; the CRC is made valid
    update_crc(bad)
    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
    c.assign([("t", 0, 1)])
    st = c._parts[("t", 0)]
    assert c._apply(st, response(txn(0, 9, 3, transactional=False) + bytes(bad) + txn(6, 9, 3, transactional=False)))
    got = c.take_nowait(100)
    assert got is not None and [m.offset for m in got] == [1, 2]  # the good batch, from the position on
    assert st.consumed == st.fetch_pos == 3  # stays at the batch that does not decode (as Java's position)
    with pytest.raises(KafkaError, match="CORRUPT_MESSAGE|batch at offset 3"):
        asyncio.run(c.consume(10, 0.1))
    assert c.take_nowait(1) is None and not st.buffer


@pytest.mark.parametrize("drop", ["seek", "unassign", "assign other"])
def test_a_dropped_buffer_frees_the_fetch_data_without_the_cycle_collector(drop: str) -> None:
    import gc
    import tracemalloc

    from oncelog.protocol.records import Record, encode_record_batch

    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
    c.assign([("t", 0, 0)])
    st = c._parts[("t", 0)]
    enabled = gc.isenabled()
    gc.disable()
    tracemalloc.start()
    try:
        assert c._apply(st, response(b"".join(
            encode_record_batch([Record(None, bytes([o]) * 1_000_000)], base_offset=o) for o in range(3))))
        assert sum(len(ch.batches) for ch in st.buffer) == 3  # one chunk (one decode group) of 3 batches
        assert tracemalloc.get_traced_memory()[0] > 3_000_000  # the Fetch data, held by the undecoded chunks
        {"seek": lambda: c.seek(("t", 0), 0), "unassign": c.unassign,
         "assign other": lambda: c.assign([("t", 1, 0)])}[drop]()
        del st
        # freed by reference counting, not left for the cycle collector
        assert tracemalloc.get_traced_memory()[0] < 1_000_000
    finally:
        tracemalloc.stop()
        if enabled:
            gc.enable()


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
@pytest.mark.parametrize("isolation", [READ_UNCOMMITTED, READ_COMMITTED])
def test_consumer_decompresses_at_hand_out_in_groups(codec: int, isolation: int, monkeypatch: Any) -> None:
    """The consumer keeps a Fetch answer's compressed batches compressed until their group of about
    GROUP_RECORDS records is handed out (decompressed once each), and hands out the same messages as
    fetched_records, with the groups split (GROUP_RECORDS patched small) or not."""
    import oncelog.client.aio.consumer as consumer_mod

    data = b"".join(compressed(codec, b) if i % 2 == 0 else b for i, b in enumerate(LOG))
    want = fetched_records(data, 0, 0, isolation, ABORTED)[0]
    calls: list[int] = []
    real = compression.decompress_buffer
    monkeypatch.setattr(compression, "decompress_buffer", lambda c, d: calls.append(c) or real(c, d))
    real_into = compression.decompress_into  # a group's batches: into one reused buffer
    monkeypatch.setattr(compression, "decompress_into", lambda c, d, o: calls.append(c) or real_into(c, d, o))
    for group in (2048, 3):
        monkeypatch.setattr(consumer_mod, "GROUP_RECORDS", group)
        c = Consumer({"bootstrap.servers": "127.0.0.1:1",
                      "isolation.level": "read_committed" if isolation == READ_COMMITTED else "read_uncommitted"})
        c.assign([("t", 0, 0)])
        st = c._parts[("t", 0)]
        calls.clear()
        assert c._apply(st, response(data, ABORTED))
        assert calls == []  # data batches not decompressed yet (control batches are read as they come)
        chunks = list(st.buffer)
        groups = {id(ch.group) for ch in chunks}
        assert len(groups) == len(chunks)  # a partition's batches of one group are one chunk
        got = c.take_nowait(100)
        assert got is not None and [(m.offset, m.key, m.value, m.headers) for m in got] == [
            (r.offset, r.key, r.value, r.headers) for r in want]
        assert all(ch.batches is None for ch in chunks)  # all decoded
        # compressed data batches: 0..2 (aborted: read_committed skips it undecompressed), 4..6, 8..9
        assert len(calls) == (3 if isolation == READ_UNCOMMITTED else 2)
        # GROUP_RECORDS=3: a group is closed once it holds 3 records: [0..2] [4..6] [8, 9, 10..12], or
        # under read_committed [4..6] [8, 9, 10..12]
        assert len(groups) == (1 if group == 2048 else 3 if isolation == READ_UNCOMMITTED else 2)


def test_a_compressed_batch_that_does_not_decompress_fails_at_hand_out_after_the_records_before_it() -> None:
    """Decompressed when handed out, a damaged compressed batch fails there, as a batch that does not
    decode: the records before it are handed out, the position stays at it."""
    import asyncio

    from oncelog.client.errors import KafkaError

    gz = bytearray(compressed(1, txn(3, 9, 3, transactional=False)))
    gz[HEADER_SIZE + 12] ^= 0xFF  # corrupt the gzip stream, CRC recomputed so only decompression fails
    update_crc(gz)
    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
    c.assign([("t", 0, 1)])
    st = c._parts[("t", 0)]
    assert c._apply(st, response(txn(0, 9, 3, transactional=False) + bytes(gz) + txn(6, 9, 3, transactional=False)))
    got = c.take_nowait(100)
    assert got is not None and [m.offset for m in got] == [1, 2]
    assert st.consumed == st.fetch_pos == 3
    with pytest.raises(KafkaError, match="CORRUPT_MESSAGE|batch at offset 3"):
        asyncio.run(c.consume(10, 0.1))


@pytest.mark.parametrize("codec", [0, 3])
@pytest.mark.parametrize("isolation", [READ_UNCOMMITTED, READ_COMMITTED])
@pytest.mark.parametrize("numpy", [True, False])
@pytest.mark.parametrize("with_log", [True, False])
def test_consumer_reads_a_view_of_the_receive_buffer(codec: int, isolation: int, numpy: bool, with_log: bool,
                                                     monkeypatch: Any) -> None:
    """The consumer is given each partition's records as a view of the Fetch answer's receive buffer
    (not copied when the answer arrives): it hands out what fetched_records reads from bytes, with and
    without numpy, and the messages own their bytes (the buffer rewritten afterwards changes nothing)."""
    from oncelog.client import reader as reader_mod

    monkeypatch.setattr(reader_mod, "HAVE_NUMPY", numpy and reader_mod.HAVE_NUMPY)
    plain = [encode_record_batch([Record(None if i % 2 else b"k%d" % j, b"v%d" % j * (j + 1)) for j in range(i + 2)],
                                 base_offset=20 + 10 * i, base_timestamp=1000 + i) for i in range(3)]
    # with headers and markers (decoded batch by batch), or without (decoded together, with numpy)
    log = LOG + plain if with_log else plain
    data = b"".join(compressed(codec, b) if codec and i % 2 == 0 else b for i, b in enumerate(log))
    want = fetched_records(data, 0, 1, isolation, ABORTED)[0]
    frame = bytearray(b"\x00" * 7 + data + b"\x00" * 5)
    c = Consumer({"bootstrap.servers": "127.0.0.1:1",
                  "isolation.level": "read_committed" if isolation == READ_COMMITTED else "read_uncommitted"})
    c.assign([("t", 0, 1)])
    st = c._parts[("t", 0)]
    assert c._apply(st, response(memoryview(frame)[7:7 + len(data)], ABORTED))  # type: ignore[arg-type]
    got = c.take_nowait(100)
    frame[:] = b"\xff" * len(frame)
    assert got is not None and [(m.offset, m.key, m.value, m.headers, m.timestamp) for m in got] == [
        (r.offset, r.key, r.value, r.headers, r.timestamp) for r in want]
    assert all(type(m.value) is bytes and type(m.key) in (bytes, type(None)) for m in got)
    assert [m.offset for m in got][-4:] == [40, 41, 42, 43]


def three_batches_assigned(codec: int) -> tuple[bytearray, Consumer, Any]:
    """A Fetch answer's records (three batches of ``k<j>``/``v<j>``, offsets 0-8, in ``codec``) as the
    receive buffer ``frame``, and a consumer assigned ``t-0`` at 0 with that partition's state."""
    plain = [encode_record_batch([Record(b"k%d" % j, b"v%d" % j) for j in range(3)], base_offset=3 * i)
             for i in range(3)]
    frame = bytearray(b"".join(compressed(codec, b) if codec else b for b in plain))
    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
    c.assign([("t", 0, 0)])
    return frame, c, c._parts[("t", 0)]


@pytest.mark.parametrize("codec", [0, 3])
def test_pause_copies_the_partitions_records_out_of_the_receive_buffer(codec: int) -> None:
    """A paused partition's undecoded batches no longer point into the Fetch answer's receive
    buffer (which they would keep alive while paused): rewritten afterwards, the records handed
    out after resume are still the fetched ones."""
    frame, c, st = three_batches_assigned(codec)
    assert c._apply(st, response(memoryview(frame)))  # type: ignore[arg-type]
    c.pause([("t", 0)])
    frame[:] = b"\xff" * len(frame)
    c.resume([("t", 0)])
    got = c.take_nowait(100)
    assert got is not None and [(m.offset, m.key, m.value) for m in got] == [
        (j, b"k%d" % (j % 3), b"v%d" % (j % 3)) for j in range(9)]


@pytest.mark.parametrize("numpy", [True, False])
def test_a_decode_group_spans_the_partitions_of_one_answer(numpy: bool, monkeypatch: Any) -> None:
    """The partitions of one Fetch answer share decode groups (more records per numpy decode); each
    partition's records are still cut at its own position, and handed out partition by partition."""
    from oncelog.client import reader as reader_mod

    monkeypatch.setattr(reader_mod, "HAVE_NUMPY", numpy and reader_mod.HAVE_NUMPY)

    def log(p: int) -> bytes:
        return b"".join(encode_record_batch([Record(None, b"p%d-%d" % (p, o + i)) for i in range(4)], base_offset=o,
                                            base_timestamp=1000 * p) for o in range(0, 12, 4))

    starts = {0: 2, 1: 5, 2: 0}
    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
    c.assign([("t", p, s) for p, s in starts.items()])
    grouping: list[Any] = [[], 0, []]
    for p in starts:
        assert c._apply(c._parts[("t", p)], response(log(p)), grouping)
    assert not any(c._parts[("t", p)].buffer for p in starts)  # published only once the answer is built
    c._publish(grouping[2])
    chunks = [ch for p in starts for ch in c._parts[("t", p)].buffer]
    assert len({id(ch.group) for ch in chunks}) == 1  # one group for all three partitions
    got = c.take_nowait(100)
    assert got is not None
    want = [(p, r.offset, r.value, r.timestamp) for p, s in starts.items()
            for r in fetched_records(log(p), p, s, READ_UNCOMMITTED, [])[0]]
    assert [(m.partition, m.offset, m.value, m.timestamp) for m in got] == want
    assert [m.offset for m in got if m.partition == 1][0] == 5  # cut at partition 1's position, not 0's
    assert all(c._parts[("t", p)].consumed == 12 for p in starts)



@pytest.mark.parametrize("codec", [1, 4])  # gzip, zstd
@pytest.mark.parametrize("group", [2048, 300])
def test_a_large_gzip_or_zstd_group_is_decompressed_off_the_loop(codec: int, group: int, monkeypatch: Any) -> None:
    """The asyncio consume() decompresses a decode group of at least OFFLOAD_BYTES (256 KiB) of zstd or a
    third as much gzip (compressed) in a worker thread, so that the loop is not held (about 3.5 ms a 1 MiB
    gzip batch of JSON-like records); a small one, and lz4, on the loop. Every record is handed
    out once, in order. With groups of one batch (300 records) a consume(70) reaches the next group
    in the middle of its take: that group is decompressed in the thread too."""
    import asyncio
    import random

    import oncelog.client.aio.consumer as consumer_mod

    monkeypatch.setattr(consumer_mod, "GROUP_RECORDS", group)

    decompressed: list[tuple[int, bool]] = []  # (compressed size, on the loop's thread)
    loop_thread: list[int] = []
    for name in ("decompress_buffer", "decompress_into", "decompress"):  # whichever the code uses
        real = getattr(compression, name, None)
        if real is not None:
            def spy(c: int, d: Any, *a: Any, _real: Any = real) -> Any:
                decompressed.append((len(d), threading.get_ident() in loop_thread))
                return _real(c, d, *a)
            monkeypatch.setattr(compression, name, spy)
    rng = random.Random(7)
    # incompressible values: the zstd batches' compressed size passes the threshold too (2 x 300 KB)
    big = b"".join(compressed(codec, encode_record_batch([Record(None, rng.randbytes(1000)) for _ in range(300)],
                                                         base_offset=o)) for o in (0, 300))
    small = compressed(codec, encode_record_batch([Record(None, b"x" * 100) for _ in range(5)], base_offset=600))
    lz4 = b"".join(compressed(3, encode_record_batch([Record(None, rng.randbytes(1000)) for _ in range(300)],
                                                     base_offset=o)) for o in (0, 300))

    async def run(data: bytes, start: int) -> list[int]:
        loop_thread[:] = [threading.get_ident()]
        c = Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.auto.commit": False})
        c.assign([("t", 0, start)])
        assert c._apply(c._parts[("t", 0)], response(data))
        got: list[int] = []
        while msgs := await c.consume(70, 0):
            got += [m.offset for m in msgs]
        return got

    for data, start, want, in_thread in ((big + small, 0, range(605), True), (big, 100, range(100, 600), True),
                                         (small, 0, range(600, 605), False), (lz4, 0, range(600), False)):
        decompressed.clear()
        assert asyncio.run(run(data, start)) == list(want)
        # with group=300 the small batch is a group of its own, decompressed on the loop
        assert decompressed and all(on_loop is not (in_thread and (group == 2048 or size > 10_000))
                                    for size, on_loop in decompressed), (want, decompressed)
