"""Tests for oncelog.protocol.records."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol import records as R
from oncelog.protocol.records import (
    BatchHeader,
    InvalidRecordError,
    Record,
    decode_records,
    encode_control_batch,
    encode_record_batch,
    iter_batch_headers,
    parse_batch_header,
    patch_base_offset,
    patch_log_append_time,
    read_control_marker,
    validate_produce_records,
)

MAX = 1_048_588


def sample_batch(n: int = 3, **kw: object) -> bytes:
    recs = [Record(f"k{i}".encode(), f"value-{i}".encode(), [("h", b"x")], i) for i in range(n)]
    return encode_record_batch(recs, base_timestamp=1_700_000_000_000, **kw)  # type: ignore[arg-type]


def with_fixed_crc(buf: bytearray) -> bytes:
    R.update_crc(buf, 0)
    return bytes(buf)


# --- header parsing -----------------------------------------------------------


def test_header_fields_and_properties() -> None:
    b = sample_batch(4, producer_id=77, producer_epoch=3, base_sequence=10, is_transactional=True, base_offset=100)
    h = parse_batch_header(b)
    assert h.base_offset == 100
    assert h.size == len(b)
    assert h.batch_length == len(b) - 12
    assert h.magic == 2
    assert h.last_offset_delta == 3
    assert h.last_offset == 103
    assert h.next_offset == 104
    assert h.records_count == 4
    assert h.base_timestamp == 1_700_000_000_000
    assert h.max_timestamp == 1_700_000_000_003
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (77, 3, 10)
    assert h.last_sequence == 13
    assert h.is_transactional and not h.is_control
    assert h.compression == 0 and h.timestamp_type == 0
    assert h.crc == crc32c(b[21:])


def test_header_layout_matches_offsets() -> None:
    b = bytearray(sample_batch(2))
    struct.pack_into(">q", b, R.PRODUCER_ID_OFFSET, 0x0102030405060708)
    struct.pack_into(">i", b, R.BASE_SEQUENCE_OFFSET, 4242)
    struct.pack_into(">h", b, R.PRODUCER_EPOCH_OFFSET, 17)
    h = parse_batch_header(b)
    assert h.producer_id == 0x0102030405060708
    assert h.base_sequence == 4242
    assert h.producer_epoch == 17


def test_parse_at_position_and_truncated() -> None:
    b = sample_batch(1)
    h = parse_batch_header(b"xyz" + b, 3)
    assert h.size == len(b)
    with pytest.raises(InvalidRecordError) as ei:
        parse_batch_header(b[:60])
    assert ei.value.error_code == R.CORRUPT_MESSAGE


def test_last_sequence_wraps() -> None:
    h = parse_batch_header(sample_batch(3, base_sequence=2**31 - 2))
    assert h.last_sequence == 0
    assert parse_batch_header(sample_batch(3)).last_sequence == -1


# --- validation ---------------------------------------------------------------


def code_of(data: bytes, max_bytes: int = MAX) -> int:
    with pytest.raises(InvalidRecordError) as ei:
        validate_produce_records(data, max_bytes)
    assert str(ei.value)  # has a message
    return ei.value.error_code


def test_validate_accepts_good_batch_and_memoryview() -> None:
    b = sample_batch(5)
    hs = validate_produce_records(memoryview(b), MAX)
    assert len(hs) == 1 and hs[0].records_count == 5


def test_validate_bad_crc() -> None:
    b = bytearray(sample_batch())
    b[-1] ^= 0x01
    assert code_of(bytes(b)) == R.CORRUPT_MESSAGE


def test_validate_crc_field_flipped() -> None:
    b = bytearray(sample_batch())
    b[R.CRC_OFFSET] ^= 0x80
    assert code_of(bytes(b)) == R.CORRUPT_MESSAGE


def test_validate_wrong_magic() -> None:
    b = bytearray(sample_batch())
    b[R.MAGIC_OFFSET] = 1
    with pytest.raises(InvalidRecordError, match="magic 1") as ei:
        validate_produce_records(with_fixed_crc(b), MAX)
    assert ei.value.error_code == R.INVALID_RECORD


def test_validate_truncated() -> None:
    b = sample_batch()
    assert code_of(b[:-1]) == R.CORRUPT_MESSAGE
    assert code_of(b[:40]) == R.CORRUPT_MESSAGE
    assert code_of(b[:10]) == R.CORRUPT_MESSAGE


def test_validate_bad_length_field() -> None:
    b = bytearray(sample_batch())
    struct.pack_into(">i", b, R.BATCH_LENGTH_OFFSET, 20)
    assert code_of(bytes(b)) == R.CORRUPT_MESSAGE


def test_validate_empty() -> None:
    assert code_of(b"") == R.INVALID_RECORD


def test_validate_two_batches() -> None:
    b = sample_batch()
    with pytest.raises(InvalidRecordError, match="exactly one record batch") as ei:
        validate_produce_records(b + b, MAX)
    assert ei.value.error_code == R.INVALID_RECORD


def test_validate_control_from_client() -> None:
    c = encode_control_batch(1, 0, True, 5)
    with pytest.raises(InvalidRecordError, match="control") as ei:
        validate_produce_records(c, MAX)
    assert ei.value.error_code == R.INVALID_RECORD


def test_validate_too_large() -> None:
    b = sample_batch(3)
    assert validate_produce_records(b, len(b))[0].size == len(b)
    assert code_of(b, len(b) - 1) == R.MESSAGE_TOO_LARGE


def test_validate_unsupported_compression() -> None:
    b = bytearray(sample_batch())
    struct.pack_into(">h", b, R.ATTRIBUTES_OFFSET, 5)
    assert code_of(with_fixed_crc(b)) == R.UNSUPPORTED_COMPRESSION_TYPE
    for codec in range(5):  # 0..4 are valid codecs (the bytes are not decoded)
        struct.pack_into(">h", b, R.ATTRIBUTES_OFFSET, codec)
        assert validate_produce_records(with_fixed_crc(b), MAX)[0].compression == codec


def test_validate_count_mismatch_and_negative_delta() -> None:
    b = bytearray(sample_batch(3))
    struct.pack_into(">i", b, R.RECORDS_COUNT_OFFSET, 2)
    assert code_of(with_fixed_crc(b)) == R.INVALID_RECORD
    struct.pack_into(">i", b, R.RECORDS_COUNT_OFFSET, 0)
    struct.pack_into(">i", b, R.LAST_OFFSET_DELTA_OFFSET, -1)
    assert code_of(with_fixed_crc(b)) == R.INVALID_RECORD


def test_validate_nonzero_base_offset() -> None:
    assert code_of(sample_batch(base_offset=5)) == R.INVALID_RECORD


def test_validate_batch_from_kafka_python() -> None:
    kp = pytest.importorskip("kafka.record.default_records")
    builder = kp.DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    builder.append(0, timestamp=2000, key=b"a", value=b"b", headers=[("x", b"y")])
    builder.append(1, timestamp=2007, key=None, value=b"c" * 300, headers=[])
    raw = bytes(builder.build())
    (h,) = validate_produce_records(raw, MAX)
    assert (h.records_count, h.base_timestamp, h.max_timestamp) == (2, 2000, 2007)
    recs = decode_records(raw)
    assert recs[0] == Record(b"a", b"b", [("x", b"y")], 0)
    assert recs[1] == Record(None, b"c" * 300, [], 7)


def test_encoded_batch_readable_by_kafka_python() -> None:
    kp = pytest.importorskip("kafka.record.default_records")
    b = sample_batch(2, producer_id=9, producer_epoch=1, base_sequence=4, is_transactional=True)
    batch = kp.DefaultRecordBatch(b)
    assert batch.validate_crc()
    got = [(r.offset, r.timestamp, r.key, r.value) for r in batch]
    assert got == [(0, 1_700_000_000_000, b"k0", b"value-0"), (1, 1_700_000_000_001, b"k1", b"value-1")]


# --- scanning and patching ------------------------------------------------------


def test_iter_batch_headers_stops_at_incomplete_tail() -> None:
    a, b = sample_batch(1), sample_batch(2)
    buf = a + b + b[:30]
    got = [(h.records_count, s, e) for h, s, e in iter_batch_headers(buf)]
    assert got == [(1, 0, len(a)), (2, len(a), len(a) + len(b))]
    assert list(iter_batch_headers(a + b[:-1])) == [(parse_batch_header(a), 0, len(a))]
    assert list(iter_batch_headers(b"")) == []


def test_patch_base_offset_keeps_crc_valid() -> None:
    buf = bytearray(b"\x00" * 7 + sample_batch(2))
    patch_base_offset(buf, 7, 123456789)
    h = parse_batch_header(buf, 7)
    assert h.base_offset == 123456789 and h.last_offset == 123456790
    assert crc32c(bytes(buf[7 + 21 :])) == h.crc


def test_patch_log_append_time() -> None:
    buf = bytearray(sample_batch(2))
    patch_log_append_time(buf, 0, 1_800_000_000_000)
    h = parse_batch_header(buf)
    assert h.timestamp_type == 1
    assert h.max_timestamp == 1_800_000_000_000
    assert h.base_timestamp == 1_700_000_000_000
    assert crc32c(bytes(buf[21:])) == h.crc
    buf[0:8] = b"\x00" * 8
    assert validate_produce_records(bytes(buf), MAX)[0].timestamp_type == 1


def test_log_append_time_header_matches_in_place_patch() -> None:
    b = sample_batch(3)
    buf = bytearray(b)
    patch_base_offset(buf, 0, 99)
    patch_log_append_time(buf, 0, 5555)
    assert R.log_append_time_header(b, 99, 5555) + b[61:] == bytes(buf)


def test_log_append_time_records_report_batch_time() -> None:
    buf = bytearray(sample_batch(2))
    patch_log_append_time(buf, 0, 42)
    assert [ts for _o, ts, _r in R.iter_records(buf)] == [42, 42]


# --- encode / decode ------------------------------------------------------------


def test_control_batch() -> None:
    c = encode_control_batch(1234, 7, False, 9, base_offset=50, timestamp_ms=1000)
    h = parse_batch_header(c)
    assert h.is_control and h.is_transactional
    assert (h.producer_id, h.producer_epoch, h.base_offset, h.records_count) == (1234, 7, 50, 1)
    assert h.base_sequence == -1
    (rec,) = decode_records(c)
    assert rec.key == struct.pack(">hh", 0, 0)
    assert rec.value == struct.pack(">hi", 0, 9)
    assert read_control_marker(c) == R.ControlMarker(commit=False, coordinator_epoch=9)
    assert read_control_marker(encode_control_batch(1, 0, True, 2)).commit is True


def test_encode_rejects_empty() -> None:
    with pytest.raises(ValueError):
        encode_record_batch([])


def test_iter_records_offsets() -> None:
    b = sample_batch(3, base_offset=10)
    assert [(o, ts) for o, ts, _r in R.iter_records(b)] == [
        (10, 1_700_000_000_000), (11, 1_700_000_000_001), (12, 1_700_000_000_002)
    ]  # fmt: skip


def test_decode_detects_garbage_records() -> None:
    b = bytearray(sample_batch(2))
    b[R.RECORDS_OFFSET] = 0x7F  # absurd record length
    with pytest.raises(InvalidRecordError):
        decode_records(with_fixed_crc(b))


opt_bytes = st.one_of(st.none(), st.binary(max_size=300))
records_st = st.lists(
    st.builds(
        Record,
        key=opt_bytes,
        value=opt_bytes,
        headers=st.lists(st.tuples(st.text(max_size=10), opt_bytes), max_size=3),
        timestamp_delta=st.integers(min_value=0, max_value=2**40),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=150, deadline=None)
@given(
    recs=records_st,
    base_ts=st.integers(min_value=0, max_value=2**50),
    producer=st.one_of(
        st.just((-1, -1, False)),  # plain producer
        st.tuples(st.integers(0, 2**62), st.integers(0, 2**31 - 1), st.booleans()),  # idempotent / txn
    ),
)
def test_round_trip_property(recs: list[Record], base_ts: int, producer: tuple[int, int, bool]) -> None:
    pid, seq, txn = producer
    b = encode_record_batch(recs, base_timestamp=base_ts, producer_id=pid, base_sequence=seq, is_transactional=txn)
    (h,) = validate_produce_records(b, 1 << 30)
    assert isinstance(h, BatchHeader)
    assert h.records_count == len(recs)
    assert h.max_timestamp == base_ts + max(r.timestamp_delta for r in recs)
    assert (h.producer_id, h.base_sequence, h.is_transactional) == (pid, seq, txn)
    assert decode_records(b) == recs


def test_validate_segment_size_limit() -> None:
    b = sample_batch(3)
    assert validate_produce_records(b, MAX, segment_bytes=len(b))[0].size == len(b)
    with pytest.raises(InvalidRecordError) as ei:
        validate_produce_records(b, MAX, segment_bytes=len(b) - 1)
    assert ei.value.error_code == R.RECORD_LIST_TOO_LARGE


def test_validate_producer_fields() -> None:
    assert code_of(sample_batch(producer_id=5, producer_epoch=0, base_sequence=-1)) == R.INVALID_RECORD
    assert code_of(sample_batch(is_transactional=True)) == R.INVALID_RECORD
    ok = sample_batch(producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True)
    assert validate_produce_records(ok, MAX)[0].producer_id == 5


def test_decompress_errors_are_kafka_errors() -> None:
    import gzip

    from oncelog.protocol.compression import decompress, decompressed_batch
    from oncelog.protocol.records import CORRUPT_MESSAGE, UNSUPPORTED_COMPRESSION_TYPE, InvalidRecordError

    assert decompress(1, gzip.compress(b"abc")) == b"abc"
    with pytest.raises(InvalidRecordError) as exc:
        decompress(1, b"not gzip")
    assert exc.value.error_code == CORRUPT_MESSAGE
    with pytest.raises(InvalidRecordError) as exc:
        decompress(6, b"")
    assert exc.value.error_code == UNSUPPORTED_COMPRESSION_TYPE
    raw = encode_record_batch([Record(b"k", b"v")])
    assert decompressed_batch(raw) == raw  # uncompressed: as is
