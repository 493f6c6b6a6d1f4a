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


@pytest.mark.parametrize("lifetime_ms", [2**63 - 1, 86_399_999_999_999_999 + 1, -(2**63)])
def test_huge_sasl_session_lifetime_decodes_clamped(lifetime_ms: int) -> None:
    """Apache Kafka may answer SaslAuthenticate with a session_lifetime_ms up to Long.MAX_VALUE; kio builds a
    timedelta from it and raised ValueError ("timedelta milliseconds overflow"), failing the client's login.
    It decodes clamped to timedelta's range, a lifetime of millions of years, and the client's re-authentication
    delay from it is finite."""
    from datetime import timedelta

    from oncelog.client.security import reauthentication_delay
    from oncelog.protocol.build import to_ms
    from oncelog.protocol.codec import decode_response

    for version, auth_bytes in ((1, struct.pack(">i", 3) + b"abc"), (2, b"\x04abc")):
        flexible = b"\x00" if version == 2 else b""
        message = b"\x00" if version == 2 else struct.pack(">h", -1)  # compact null / null
        body = struct.pack(">h", 0) + message + auth_bytes + struct.pack(">q", lifetime_ms) + flexible
        resp = decode_response(36, version, body)
        assert bytes(resp.auth_bytes) == b"abc"
        expected = timedelta.max if lifetime_ms > 0 else timedelta.min
        assert abs(resp.session_lifetime - expected) < timedelta(milliseconds=1), version
        if lifetime_ms > 0:
            ms = to_ms(resp.session_lifetime)
            assert ms > 86_399_999 * 10**9 and reauthentication_delay(ms) > 7 * 10**13


def test_huge_offset_commit_retention_time_decodes_clamped() -> None:
    """The request side: OffsetCommit v2's retention_time_ms (an int64) of Long.MAX_VALUE decodes (clamped)
    rather than failing the request as undecodable."""
    from datetime import timedelta

    string = lambda s: struct.pack(">h", len(s)) + s.encode()  # noqa: E731
    body = (string("g") + struct.pack(">i", 1) + string("m") + struct.pack(">q", 2**63 - 1)
            + struct.pack(">i", 1) + string("t") + struct.pack(">i", 1) + struct.pack(">iq", 0, 5) + string(""))
    req = decode_request(8, 2, body, 0)
    assert req.retention_time == timedelta.max - timedelta(microseconds=999)  # whole milliseconds
    assert req.topics[0].partitions[0].committed_offset == 5
