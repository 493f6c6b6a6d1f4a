"""records.decode_columns decodes exactly what iter_records decodes, and rejects the same damage."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.records import (
    InvalidRecordError,
    Record,
    decode_columns,
    encode_record_batch,
    iter_records,
    log_append_time_header,
)

_bytes = st.one_of(st.none(), st.binary(max_size=300))
_record = st.builds(Record, key=_bytes, value=_bytes,
                    headers=st.lists(st.tuples(st.text(max_size=8), _bytes), max_size=3),
                    timestamp_delta=st.integers(-(2**40), 2**40))


@settings(max_examples=200, deadline=None)
@given(records=st.lists(_record, min_size=1, max_size=20), base=st.integers(0, 2**40))
def test_columns_equal_iter_records(records: list[Record], base: int) -> None:
    batch = encode_record_batch(records, base_offset=base, base_timestamp=1_700_000_000_000)
    cols = decode_columns(batch)
    want = list(iter_records(batch))
    assert cols.offsets == [o for o, _t, _r in want]
    assert cols.timestamps == [t for _o, t, _r in want]
    assert cols.keys == [r.key for _o, _t, r in want]
    assert cols.values == [r.value for _o, _t, r in want]
    assert cols.headers == [r.headers for _o, _t, r in want]
    assert decode_columns(batch, with_headers=False).headers is None


def test_log_append_time_and_damage() -> None:
    batch = encode_record_batch([Record(b"k", b"v"), Record(None, b"w", timestamp_delta=5)], base_timestamp=1000)
    stamped = log_append_time_header(batch, 0, 42_000) + batch[61:]
    assert decode_columns(stamped).timestamps == [42_000, 42_000]
    # a record length that runs past the batch, and trailing bytes: same errors as iter_records
    bad = bytearray(batch)
    bad[61] = 0x7E  # first record's length varint: 63
    with pytest.raises(InvalidRecordError):
        list(iter_records(bytes(bad)))
    with pytest.raises(InvalidRecordError):
        decode_columns(bytes(bad))
    longer = bytearray(batch + b"\x00")
    struct.pack_into(">i", longer, 8, len(longer) - 12)
    with pytest.raises(InvalidRecordError, match="trailing bytes"):
        decode_columns(bytes(longer))
