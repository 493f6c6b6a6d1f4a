"""Sans-IO protocol layer: framing, headers, codec (incl. unknown tagged fields)."""

from __future__ import annotations

import struct

import pytest

from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_request, encode_request, is_flexible, request_type
from oncelog.protocol.framing import FrameDecoder, FrameError, frame
from oncelog.protocol.headers import HeaderError, parse_request_header_prefix, response_header, skip_tagged_fields


def _framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def test_frame_decoder_splits_across_arbitrary_chunks() -> None:
    bodies = [b"a" * 10, b"", b"xyz" * 1000, b"\x00\x01"]
    stream = b"".join(_framed(b) for b in bodies)
    for chunk in (1, 3, 7, 4096):
        dec = FrameDecoder()
        out: list[bytes] = []
        for i in range(0, len(stream), chunk):
            out += dec.feed(stream[i : i + chunk])
        assert out == bodies
        assert dec.buffered == 0


def test_frame_decoder_rejects_oversize_before_buffering() -> None:
    dec = FrameDecoder(max_frame_bytes=1000)
    with pytest.raises(FrameError, match="exceeds"):
        dec.feed(struct.pack(">i", 1001))
    with pytest.raises(FrameError, match="negative"):
        FrameDecoder().feed(struct.pack(">i", -5))


def test_frame_prefixes_total_length() -> None:
    parts = frame([b"ab", memoryview(b"cde")])
    assert b"".join(bytes(p) for p in parts) == b"\x00\x00\x00\x05abcde"


def test_request_header_parse_and_truncation() -> None:
    raw = struct.pack(">hhih", 0, 9, 42, 3) + b"cli" + b"\x00"
    header, pos = parse_request_header_prefix(raw)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (0, 9, 42, "cli")
    assert skip_tagged_fields(raw, pos) == len(raw)
    null_client = struct.pack(">hhih", 3, 1, 7, -1)
    assert parse_request_header_prefix(null_client)[0].client_id is None
    with pytest.raises(HeaderError):
        parse_request_header_prefix(raw[:5])
    with pytest.raises(HeaderError):
        parse_request_header_prefix(struct.pack(">hhih", 0, 9, 1, 50) + b"short")


def test_response_header_versions() -> None:
    assert response_header(7, False) == b"\x00\x00\x00\x07"
    assert response_header(7, True) == b"\x00\x00\x00\x07\x00"


def _metadata_v12_body() -> bytes:
    req = materialize(
        request_type(3, 12),
        {
            "topics": [{"name": "t1", "topic_id": None}],
            "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False,
        },
    )
    return encode_request(req)


def test_unknown_tagged_fields_are_skipped_at_every_level() -> None:
    body = _metadata_v12_body()
    # body ends with: topic entry tags (0), then request tags (0).
    # Inject an unknown tag (id 9, 3 bytes) into the nested topic and the top level.
    assert body[-1] == 0
    unknown = bytes([1, 9, 3]) + b"abc"
    # find the nested topic's tag block: it is right before the bool fields (2 bytes) + top tags
    nested_tags_pos = len(body) - 1 - 2 - 1
    assert body[nested_tags_pos] == 0
    mutated = body[:nested_tags_pos] + unknown + body[nested_tags_pos + 1 : -1] + unknown
    assert is_flexible(3, 12)
    decoded = decode_request(3, 12, mutated, 0)
    assert decoded.topics[0].name == "t1"
    assert decoded.allow_auto_topic_creation is True


def test_roundtrip_produce_v3_non_flexible() -> None:
    req = materialize(
        request_type(0, 3),
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1500,
            "topic_data": [{"name": "t", "partition_data": [{"index": 2, "records": b"\x01\x02"}]}],
        },
    )
    decoded = decode_request(0, 3, encode_request(req), 0)
    assert decoded.acks == -1
    assert decoded.topic_data[0].partition_data[0].index == 2
    assert bytes(decoded.topic_data[0].partition_data[0].records) == b"\x01\x02"
