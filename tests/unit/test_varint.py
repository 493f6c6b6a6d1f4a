"""protocol.varint: the unsigned varint and tagged-field readers shared by the request/response
headers, the Fetch decoder and the codec's guard, each pair raising its own error class."""

from __future__ import annotations

import pytest

from oncelog.protocol import codec, fetch, headers
from oncelog.protocol.fast_produce import uvarint
from oncelog.protocol.varint import varint_readers


READERS = [
    (headers.read_uvarint, headers.skip_tagged_fields, headers.HeaderError),
    (fetch._uvarint, fetch._skip_tags, fetch.FetchDecodeError),
    (*varint_readers(KeyError), KeyError),
]


@pytest.mark.parametrize("read, skip, error", READERS)
def test_values_positions_and_errors(read, skip, error) -> None:  # type: ignore[no-untyped-def]
    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**32 - 1, 2**35 - 1):
        enc = uvarint(n)
        for buf in (b"xy" + enc + b"z", bytearray(b"xy" + enc), memoryview(b"xy" + enc)):
            assert read(buf, 2) == (n, 2 + len(enc))
    with pytest.raises(error, match="longer than 5 bytes"):
        read(b"\x80\x80\x80\x80\x80\x01", 0)
    for cut in (b"", b"\x80", b"\xff\xff\xff\xff"):
        with pytest.raises(error, match="truncated varint"):
            read(cut, 0)
    block = b"\x02" + b"\x00\x02ab" + uvarint(300) + b"\x01c"  # two fields: tag 0 (2 bytes), tag 300 (1 byte)
    assert skip(block + b"rest", 0) == len(block)
    assert skip(b"\x00", 0) == 1
    with pytest.raises(error, match="runs past the end"):
        skip(block[:-1], 0)
    with pytest.raises(error, match="truncated varint"):
        skip(b"\x02\x00\x00", 0)  # the second field is missing


def test_the_codec_guard_reads_within_its_end() -> None:
    buf = b"\x05" + uvarint(300) + b"\x07"
    assert codec._uvarint(buf, 1, len(buf)) == (300, 3)
    with pytest.raises(codec.GuardError, match="truncated varint"):
        codec._uvarint(buf, 1, 2)  # the varint runs past the field's end, though not past the buffer
    with pytest.raises(codec.GuardError, match="truncated varint"):
        codec._uvarint(b"\x80", 0, 1)
