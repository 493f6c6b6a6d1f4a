"""records.decode_section (the consumer's decoder) against iter_records, the reference decoder.

Random batches: keys, null keys, empty values, headers (null values too), one- to
many-byte varints (long values, big and negative timestamp deltas, big and
negative offset deltas), LogAppendTime, sections inside a larger buffer (the
consumer decodes straight from the Fetch blob), compressed batches through the
reader, control batches filtered out; damaged batches are refused as iter_records
refuses them.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.client.aio.consumer import Message
from oncelog.client import reader
from oncelog.client.aio.consumer import Consumer
from oncelog.client.reader import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    batch_section,
    fetched_batches,
    fetched_records,
    group_sections,
)
from oncelog.protocol import compression
from oncelog.protocol.records import (
    patch_log_append_time,
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    RECORDS_OFFSET,
    InvalidRecordError,
    Record,
    _encode_record,
    _equal_size_starts,
    _guessed_starts,
    _record_end,
    HAVE_NUMPY,
    decode_section,
    decode_spans,
    encode_control_batch,
    encode_record_batch,
    iter_records,
    log_append_time_header,
    parse_batch_header,
    update_crc,
)

# lengths around the one/two/three-byte varint steps (zigzag: 64 and 8192 bytes), cheap to generate
_bytes = st.one_of(st.none(), st.binary(max_size=40),
                   st.tuples(st.integers(60, 70), st.binary(min_size=1, max_size=1)).map(lambda t: t[1] * t[0]),
                   st.tuples(st.integers(8188, 8200), st.binary(min_size=1, max_size=1)).map(lambda t: t[1] * t[0]))
_record = st.builds(Record, key=st.one_of(st.none(), st.binary(max_size=80)), value=_bytes,
                    headers=st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=10))),
                                     max_size=3),
                    timestamp_delta=st.one_of(st.integers(-70, 70), st.integers(-(2**40), 2**40)))


def batch_with_deltas(records: list[Record], deltas: list[int], base: int, ts: int = 1_700_000_000_000) -> bytes:
    """A v2 batch whose records carry the given offset deltas (encode_record_batch numbers them 0, 1, ...)."""
    head = bytearray(encode_record_batch(records, base_offset=base, base_timestamp=ts)[:HEADER_SIZE])
    body = b"".join(_encode_record(r, d) for r, d in zip(records, deltas))
    struct.pack_into(">i", head, BATCH_LENGTH_OFFSET, HEADER_SIZE - LOG_OVERHEAD + len(body))
    out = head + body
    update_crc(out)
    return bytes(out)


def section(buf: bytes, pos: int = 0) -> tuple[list, list, list, list, list]:
    hdr = parse_batch_header(buf, pos)
    cols: tuple[list, list, list, list, list] = ([], [], [], [], [])
    decode_section(buf, pos + RECORDS_OFFSET, pos + hdr.size, hdr, *cols)
    return cols


def spans_of(blob: bytes, pos: int = 0) -> list[tuple[int, int, object]]:
    out = []
    while pos < len(blob):
        hdr = parse_batch_header(blob, pos)
        out.append((pos + RECORDS_OFFSET, pos + hdr.size, hdr))
        pos += hdr.size
    return out


def reference(buf: bytes, pos: int = 0) -> tuple[list, list, list, list, list]:
    want = list(iter_records(buf, pos))
    return ([o for o, _t, _r in want], [t for _o, t, _r in want], [r.key for _o, _t, r in want],
            [r.value for _o, _t, r in want], [r.headers or None for _o, _t, r in want])


@settings(max_examples=300, deadline=None)
@given(records=st.lists(_record, min_size=1, max_size=12), base=st.integers(0, 2**40),
       deltas=st.lists(st.one_of(st.integers(0, 70), st.integers(-(2**31), 2**31 - 1)), min_size=12, max_size=12),
       sequential=st.booleans(), prefix=st.binary(max_size=5))
def test_section_equals_iter_records(records: list[Record], base: int, deltas: list[int], sequential: bool,
                                     prefix: bytes) -> None:
    ds = list(range(len(records))) if sequential else deltas[: len(records)]
    batch = batch_with_deltas(records, ds, base)
    assert section(batch) == reference(batch)
    # inside a larger buffer (the Fetch blob): another batch after it is not read
    other = encode_record_batch([Record(b"x", b"y")], base_offset=base + 100)
    blob = prefix + batch + other
    assert section(blob, len(prefix)) == reference(batch)
    assert section(blob, len(prefix) + len(batch)) == reference(other)


def test_log_append_time_multibyte_length_and_headers() -> None:
    recs = [Record(None, b"v" * 20000, [("a", None), ("é", b"1")], timestamp_delta=-5), Record(b"k", None)]
    batch = encode_record_batch(recs, base_timestamp=1000)
    assert section(batch) == reference(batch)
    stamped = log_append_time_header(batch, 7, 42_000) + batch[HEADER_SIZE:]
    offs, stamps, keys, values, hs = section(stamped)
    assert offs == [7, 8] and stamps == [42_000, 42_000] and keys == [None, b"k"]
    assert values == [b"v" * 20000, None] and hs == [[("a", None), ("é", b"1")], None]


def damaged(batch: bytes, at: int, data: bytes) -> bytes:
    out = bytearray(batch)
    out[at:at + len(data)] = data
    return bytes(out)


@pytest.mark.parametrize("how", ["length past end", "negative length", "value past record", "trailing bytes",
                                 "short record", "negative header count", "truncated varint"])
def test_damage_is_refused_like_iter_records(how: str) -> None:
    batch = encode_record_batch([Record(b"k", b"value-1"), Record(None, b"value-2")], base_timestamp=0)
    p = RECORDS_OFFSET
    first_len = batch[p] >> 1  # one-byte length varint
    if how == "length past end":
        bad = damaged(batch, p, b"\x7e")
    elif how == "negative length":
        bad = damaged(batch, p, b"\x03")
    elif how == "value past record":  # the value's length varint (after attrs, ts, offset, key len 1 + 'k') grows
        bad = damaged(batch, p + 1 + 1 + 1 + 1 + 1 + 1, b"\x10")
    elif how == "trailing bytes":
        bad = batch + b"\x00"
        bad = bad[:BATCH_LENGTH_OFFSET] + struct.pack(">i", len(bad) - LOG_OVERHEAD) + bad[BATCH_LENGTH_OFFSET + 4:]
    elif how == "short record":  # the first record claims one byte less: its header count falls outside
        bad = damaged(batch, p, bytes([(first_len - 1) << 1]))
    elif how == "negative header count":  # the first record's last byte: header count 0 -> -1
        bad = damaged(batch, p + first_len, b"\x01")
    else:  # the last byte of the batch becomes a varint continuation
        bad = batch[:-1] + b"\x80"
    with pytest.raises(InvalidRecordError):
        section(bad)
    if how != "negative header count":  # iter_records reads a negative count as none; Kafka refuses it
        with pytest.raises(InvalidRecordError):
            list(iter_records(bad))


def compressed(codec: int, raw: bytes) -> bytes:
    body = compression.compress(codec, raw[HEADER_SIZE:])
    head = bytearray(raw[:HEADER_SIZE])
    struct.pack_into(">h", head, ATTRIBUTES_OFFSET, struct.unpack_from(">h", head, ATTRIBUTES_OFFSET)[0] | codec)
    struct.pack_into(">i", head, BATCH_LENGTH_OFFSET, HEADER_SIZE - LOG_OVERHEAD + len(body))
    out = head + body
    update_crc(out)
    return bytes(out)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(_record, min_size=1, max_size=8), codec=st.sampled_from([0, 1, 2, 3, 4]),
       isolation=st.sampled_from([READ_UNCOMMITTED, READ_COMMITTED]), cut=st.integers(0, 12))
def test_fetched_sections_equal_fetched_records(records: list[Record], codec: int, isolation: int, cut: int) -> None:
    """Through the reader as the consumer decodes: CRC check, decompression, control batches dropped."""
    first = encode_record_batch(records, base_offset=0, producer_id=3, producer_epoch=0, base_sequence=0,
                                is_transactional=True)
    n = len(records)
    blob = (compressed(codec, first) if codec else first) + encode_control_batch(3, 0, True, 0, base_offset=n)
    second = encode_record_batch(records, base_offset=n + 1)
    blob += compressed(codec, second) if codec else second
    position = min(cut, 2 * n)
    want, _b, _s, want_next = fetched_records(blob, 0, position, isolation, [])
    kept, _batches, _skipped, next_pos = fetched_batches(blob, 0, position, isolation, [])
    got = []
    for b in kept:
        assert b.section is not None and b.raw is None
        offs, stamps, keys, values, hs = batch_section(b, 0, position)
        got += [Message("t", 0, *row) for row in zip(offs, keys, values, hs, stamps)]
    assert next_pos == want_next
    assert [(m.offset, m.timestamp, m.key, m.value, m.headers) for m in got] == \
        [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in want]
    if codec == 0 and kept:  # uncompressed: decoded from the blob itself, no copy of the batch
        assert kept[0].section is not None and kept[0].section[0] is blob


def test_message_headers_made_on_read() -> None:
    m = Message("t", 0, 5, None, b"v", None, 9)
    h = m.headers
    assert h == [] and m.headers is h  # the same list every time: a caller's append sticks
    h.append(("a", b"1"))
    assert m.headers == [("a", b"1")]
    assert m == Message("t", 0, 5, None, b"v", [("a", b"1")], 9)
    assert m != Message("t", 0, 5, None, b"w", [("a", b"1")], 9)
    assert repr(Message("t", 1, 2, b"k", b"v", None, 3)) == \
        "Message(topic='t', partition=1, offset=2, key=b'k', value=b'v', headers=[], timestamp=3)"
    m.value = b"changed"
    assert m.value == b"changed"
    with pytest.raises(TypeError):
        hash(m)



needs_numpy = pytest.mark.skipif(not HAVE_NUMPY, reason="the vectorised path needs numpy")


@needs_numpy
@settings(max_examples=300, deadline=None)
@given(batches=st.lists(st.lists(_record, min_size=1, max_size=10), min_size=1, max_size=4),
       base=st.integers(0, 2**40), deltas=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=10, max_size=10),
       sequential=st.booleans(), prefix=st.binary(max_size=5),
       log_append=st.lists(st.one_of(st.none(), st.sampled_from([-1, -2, 0, 1_800_000_000_000])),
                           min_size=4, max_size=4))
def test_spans_equal_sections(batches: list[list[Record]], base: int, deltas: list[int], sequential: bool,
                              prefix: bytes, log_append: list[int | None]) -> None:
    """decode_spans (numpy) over several batches of one blob gives what decode_section gives batch by
    batch (LogAppendTime batches among them, whatever their maxTimestamp, -1 included); it declines
    (None) only for records with headers, and then decode_section is used."""
    parts = []
    for i, rs in enumerate(batches):
        b = bytearray(batch_with_deltas(rs, list(range(len(rs))) if sequential else deltas[: len(rs)],
                                        base + 1000 * i))
        if log_append[i] is not None:
            patch_log_append_time(b, 0, log_append[i])
        parts.append(bytes(b))
    blob = prefix + b"".join(parts)
    spans = spans_of(blob, len(prefix))
    want: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for start, end, hdr in spans:
        decode_section(blob, start, end, hdr, *want)
    got = decode_spans(blob, spans)
    if any(r.headers for rs in batches for r in rs):
        assert got is None
        return
    assert got is not None
    offs, stamps, keys, values, counts = got
    assert (offs, stamps, keys, values) == want[:4] and counts == [len(rs) for rs in batches]
    assert all(type(v) is bytes for v in values if v is not None)


@needs_numpy
@pytest.mark.parametrize("log_append", [[-1, None], [None, -1], [-2, 5, None], [0, None, -1], [-1, -1], [7, 7]])
def test_spans_log_append_time_among_create_time(log_append: list[int | None]) -> None:
    """A LogAppendTime batch's records all carry its maxTimestamp, even a negative one, also when it is
    decoded together with CreateTime batches (-1 once meant "not LogAppendTime" there)."""
    parts = []
    for i, lat in enumerate(log_append):
        b = bytearray(encode_record_batch([Record(None, b"v", [], 5), Record(b"k", b"w", [], 9)],
                                          base_offset=10 * i, base_timestamp=1000 * (i + 1)))
        if lat is not None:
            patch_log_append_time(b, 0, lat)
        parts.append(bytes(b))
    blob = b"".join(parts)
    spans = spans_of(blob)
    want: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for start, end, hdr in spans:
        decode_section(blob, start, end, hdr, *want)
    got = decode_spans(blob, spans)
    assert got is not None
    assert got[1] == want[1] == [x for i, lat in enumerate(log_append)
                                 for x in ([lat, lat] if lat is not None else [1000 * (i + 1) + 5, 1000 * (i + 1) + 9])]


@needs_numpy
@pytest.mark.parametrize("how", ["length past end", "negative length", "value past record", "trailing bytes",
                                 "short record", "negative header count", "truncated varint"])
def test_spans_decline_damage(how: str) -> None:
    """Whatever decode_section refuses, decode_spans does not decode (None: the caller's
    decode_section then raises the precise error)."""
    batch = encode_record_batch([Record(None, b"value-1"), Record(None, b"value-2")], base_timestamp=0)
    p = RECORDS_OFFSET
    first_len = batch[p] >> 1
    bad = {"length past end": lambda: damaged(batch, p, b"\x7e"),
           "negative length": lambda: damaged(batch, p, b"\x03"),
           "value past record": lambda: damaged(batch, p + 5, b"\x10"),
           "trailing bytes": lambda: batch + b"\x00",
           "short record": lambda: damaged(batch, p, bytes([(first_len - 1) << 1])),
           "negative header count": lambda: damaged(batch, p + first_len, b"\x01"),
           "truncated varint": lambda: batch[:-1] + b"\x80"}[how]()
    hdr = parse_batch_header(batch)
    end = len(bad) if how == "trailing bytes" else hdr.size
    with pytest.raises(InvalidRecordError):
        decode_section(bad, p, end, hdr, [], [], [], [], [])
    assert decode_spans(bad, [(p, end, hdr)]) is None


@pytest.mark.parametrize("numpy", [True, False])
@settings(max_examples=40, deadline=None)
@given(records=st.lists(_record, min_size=1, max_size=8), codec=st.sampled_from([0, 3]), cut=st.integers(0, 12),
       headers=st.booleans())
def test_group_sections_equal_batch_sections(numpy: bool, records: list[Record], codec: int, cut: int,
                                             headers: bool) -> None:
    if numpy and not HAVE_NUMPY:
        pytest.skip("numpy is not installed")
    saved = reader.HAVE_NUMPY
    reader.HAVE_NUMPY = numpy
    try:
        if not headers:
            records = [Record(r.key, r.value, [], r.timestamp_delta) for r in records]
        n = len(records)
        blob = b"".join(compressed(codec, raw) if codec else raw for raw in (
            encode_record_batch(records, base_offset=0), encode_record_batch(records, base_offset=n)))
        kept, _b, _s, _n = fetched_batches(blob, 0, cut, READ_UNCOMMITTED, [])
        if not kept:
            return
        got = group_sections(kept, cut)
        want = [batch_section(b, 0, cut) for b in kept]
        plain = not any(r.headers for r in records)
        if numpy and plain:
            assert got == want  # the vectorised path is taken, and agrees
        else:
            assert got is None  # batch by batch instead
    finally:
        reader.HAVE_NUMPY = saved


@pytest.mark.parametrize("numpy", [True, False])
def test_consumer_hands_out_the_same_with_and_without_numpy(numpy: bool) -> None:
    if numpy and not HAVE_NUMPY:
        pytest.skip("numpy is not installed")
    saved = reader.HAVE_NUMPY
    reader.HAVE_NUMPY = numpy
    try:
        from types import SimpleNamespace
        blob = b"".join(encode_record_batch([Record(None if i % 3 else b"k%d" % i, b"v" * (i * 50))
                                             for i in range(o, o + 10)], base_offset=o) for o in range(0, 40, 10))
        c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
        c.assign([("t", 0, 5)])
        st_ = c._parts[("t", 0)]
        assert c._apply(st_, SimpleNamespace(error_code=0, records=blob, aborted_transactions=[]))
        got = c.take_nowait(100)
        assert got is not None
        assert [(m.offset, m.key, m.value, m.headers) for m in got] == [
            (i, None if i % 3 else b"k%d" % i, b"v" * (i * 50), []) for i in range(5, 40)]
        assert st_.consumed == 40
    finally:
        reader.HAVE_NUMPY = saved


def _walk(buf: bytes, p: int, end: int) -> list[int]:
    out = []
    while p < end:
        out.append(p)
        p = _record_end(buf, p)
    return out


_SIZES = [[5] * 4, [5, 3, 7], [5, 7, 3, 5], [70, 60, 80], [0, 0], [3, 1, 2], [9] * 64, [9] * 65, [9] * 200,
          [9] * 10 + [8] + [9] * 60 + [10] + [9] * 3, [9] * 63 + [8, 10]]


@pytest.mark.parametrize("sizes", _SIZES)
def test_equal_size_starts(sizes: list[int]) -> None:
    """The guessed record starts of a batch of equal-size values (offset deltas 0, 1, ... whose varints
    grow from one to two bytes at 64) are the true ones; unequal values whose sizes add up the same
    give a guess the check must refute (decode_spans below)."""
    batch = encode_record_batch([Record(None, b"v" * n) for n in sizes], base_timestamp=0)
    hdr = parse_batch_header(batch)
    true = _walk(batch, RECORDS_OFFSET, hdr.size)
    guess = _equal_size_starts(RECORDS_OFFSET, hdr.size, _record_end(batch, RECORDS_OFFSET) - RECORDS_OFFSET,
                               len(sizes))
    if len(set(sizes)) == 1:
        assert guess == true
    elif guess is not None:
        assert guess != true


@needs_numpy
@pytest.mark.parametrize("sizes", _SIZES)
def test_spans_equal_size_guess_checked(sizes: list[int]) -> None:
    """A batch whose section is as long as its records would be if all had the first one's size is
    decoded as such records only if they are ([5, 3, 7]: the sizes add up, but the records differ;
    the guess is refuted and the batch walked record by record), also next to other batches."""
    rs = [Record(None, bytes([65 + i % 26]) * n) for i, n in enumerate(sizes)]
    blob = (encode_record_batch([Record(b"k", b"first")], base_offset=0)
            + encode_record_batch(rs, base_offset=10, base_timestamp=0))
    spans = spans_of(blob)
    want: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for start, end, hdr in spans:
        decode_section(blob, start, end, hdr, *want)
    got = decode_spans(blob, spans)
    assert got is not None
    assert got[:4] == want[:4] and got[2:4] == ([b"k"] + [None] * len(sizes), [b"first"] + [r.value for r in rs])
    assert decode_spans(blob, spans, False) == got


@needs_numpy
@pytest.mark.parametrize("batch_sizes", [[[5] * 4], [[9] * 65, [7] * 3], [[9] * 200, [1], [4] * 64],
                                         [[3] * 70, [5, 3, 7]], [[9] * 63 + [8, 10]], [[2] * 8200]])
def test_guessed_starts_all_spans_at_once(batch_sizes: list[list[int]]) -> None:
    """The record starts guessed for every span at once (numpy) are the walked ones when each batch's
    records are of one size (offset deltas' varints growing at 64 and 8192); when one batch's sizes
    differ, None or (their sizes adding up: [5, 3, 7]) a wrong guess, which decode_spans' check
    refutes: it decodes the same records either way."""
    blob = b"".join(encode_record_batch([Record(None, b"v" * n) for n in sizes], base_offset=1000 * i,
                                        base_timestamp=0) for i, sizes in enumerate(batch_sizes))
    spans = spans_of(blob)
    got = _guessed_starts(blob, spans)
    true = [p for start, end, _h in spans for p in _walk(blob, start, end)]
    if all(len(set(sizes)) == 1 for sizes in batch_sizes):
        assert got is not None and got.tolist() == true
    else:
        assert got is None or got.tolist() != true
    want: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for start, end, hdr in spans:
        decode_section(blob, start, end, hdr, *want)
    assert decode_spans(blob, spans)[:4] == want[:4]  # type: ignore[index]


def test_a_claimed_record_count_beyond_the_section_costs_nothing() -> None:
    """A CRC-valid batch whose header claims far more records than its bytes can hold (a hostile or
    broken broker) is refused at once with ReaderError, without listing a start per claimed record
    (review F4: 200 million claimed records raised MemoryError out of the consumer)."""
    import tracemalloc

    from oncelog.client.reader import ReaderError, batch_section, fetched_batches, group_sections
    from oncelog.protocol.records import update_crc

    raw = bytearray(encode_record_batch([Record(None, b"a" * 5) for _ in range(3)]))
    raw[57:61] = (200_000_000).to_bytes(4, "big")  # records_count
    update_crc(raw)
    tracemalloc.start()
    try:
        kept, *_ = fetched_batches(memoryview(bytearray(raw)), 0, 0, 0, [], True, defer=True)
        assert kept and kept[0].header.records_count == 200_000_000
        group_sections(kept, 0)
        with pytest.raises(ReaderError):
            batch_section(kept[0], 0, 0)
        assert _equal_size_starts(RECORDS_OFFSET, len(raw), 9, 200_000_000) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
