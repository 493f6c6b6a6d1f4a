"""Conditional produce's wire form (docs/conditional-publish.md), without a broker.

The byte layout of the request and response tags, the codec's unknown-tag
sink (filled only when a body carries an unknown tag; kio's native reader
handles the rest), oncelog's error codes kept apart from Kafka's, and the
response encoder's tag.
"""

from __future__ import annotations

import struct

import pytest

from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_request, decode_response, encode_request, request_type, unknown_tags_of
from oncelog.protocol.conditional import (
    EXPECTED_OFFSET_TAG,
    ConditionError,
    next_offset_tag_block,
    parse_offset_tag,
    partition_tag_block,
)
from oncelog.protocol.errors import ErrorCode, KafkaError, OncelogErrorCode, code_name
from oncelog.protocol.fast_produce import encode_produce_response
from oncelog.protocol.records import Record, encode_record_batch


def test_tag_block_layout() -> None:
    # count 1, tag 10000 as an unsigned varint (0x90 0x4E), size 8, int64 big-endian
    assert partition_tag_block(0x0102030405060708) == bytes.fromhex("01904e08") + bytes.fromhex("0102030405060708")
    assert next_offset_tag_block(7) == b"\x01\x90\x4e\x08" + struct.pack(">q", 7)
    assert EXPECTED_OFFSET_TAG == 10_000
    with pytest.raises(ValueError):
        partition_tag_block(-1)


@pytest.mark.parametrize("values, offset", [([struct.pack(">q", 5)], 5), ([struct.pack(">q", -1)], -1)])
def test_parse_offset_tag(values: list[bytes], offset: int) -> None:
    assert parse_offset_tag(values) == offset


@pytest.mark.parametrize("values", [[b""], [b"\x00" * 4], [b"\x00" * 9], [struct.pack(">q", -2)],
                                    [struct.pack(">q", 1)] * 2, []])
def test_parse_offset_tag_rejects(values: list[bytes]) -> None:
    with pytest.raises(ConditionError):
        parse_offset_tag(values)


def _produce_body(version: int, tags: list[bytes]) -> bytes:
    """kio encodes the request; each partition's empty tag block is swapped for ``tags[i]``."""
    batches = [encode_record_batch([Record(key=None, value=b"v%d" % i)], base_timestamp=0) for i in range(len(tags))]
    body = encode_request(materialize(request_type(0, version), {
        "transactional_id": None, "acks": -1, "timeout": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": i, "records": r} for i, r in enumerate(batches)]}],
    }))
    for records, tag in zip(batches, tags):
        assert body.count(records + b"\x00") == 1
        body = body.replace(records + b"\x00", records + tag)
    return body


@pytest.mark.parametrize("version", [9, 12])
def test_sink_gets_the_partition_tag(version: int) -> None:
    body = _produce_body(version, [b"\x00", partition_tag_block(42)])
    unknown: dict[int, object] = {}
    req = decode_request(0, version, body, 0, unknown)
    p0, p1 = req.topic_data[0].partition_data
    assert unknown_tags_of(unknown, p0) is None
    assert unknown_tags_of(unknown, p1) == {EXPECTED_OFFSET_TAG: [struct.pack(">q", 42)]}
    assert p1.index == 1 and b"v1" in bytes(p1.records)  # the rest decodes as before


def test_sink_untouched_without_unknown_tags() -> None:
    body = _produce_body(9, [b"\x00", b"\x00"])
    unknown: dict[int, object] = {}
    decode_request(0, 9, body, 0, unknown)
    assert unknown == {}


def test_error_codes_apart_from_kafka() -> None:
    kafka = {int(c) for c in ErrorCode}
    ours = {int(c) for c in OncelogErrorCode}
    assert not kafka & ours and min(ours) > 10 * max(kafka) and max(ours) < 2**15
    assert code_name(10_001) == "ONCELOG_OFFSET_MISMATCH"
    assert code_name(10_002) == "ONCELOG_CONDITIONAL_PRODUCE_REFUSED"
    assert KafkaError(10_001).code is OncelogErrorCode.oncelog_offset_mismatch
    assert code_name(3) == "UNKNOWN_TOPIC_OR_PARTITION" and code_name(9_999) == "UNKNOWN_ERROR_9999"


@pytest.mark.parametrize("version", [9, 10, 11, 12])
def test_response_tag_round_trip(version: int) -> None:
    parts = [
        {"index": 0, "error_code": OncelogErrorCode.oncelog_offset_mismatch, "base_offset": -1, "log_append_time": -1,
         "log_start_offset": -1, "record_errors": [], "error_message": "m", "next_offset": 12},
        {"index": 1, "error_code": 0, "base_offset": 3, "log_append_time": -1, "log_start_offset": 0,
         "record_errors": [], "error_message": None},
    ]
    raw = encode_produce_response(version, [{"name": "t", "partition_responses": parts}])
    unknown: dict[int, object] = {}
    resp = decode_response(0, version, raw, 0, unknown)
    p0, p1 = resp.responses[0].partition_responses
    assert p0.error_code == OncelogErrorCode.oncelog_offset_mismatch and p0.error_message == "m"
    assert parse_offset_tag(unknown_tags_of(unknown, p0)[EXPECTED_OFFSET_TAG]) == 12
    assert unknown_tags_of(unknown, p1) is None and p1.base_offset == 3
    # without the key the encoding is unchanged (kio's, byte for byte: test_fast_produce.py)
    plain = encode_produce_response(version, [{"name": "t", "partition_responses": parts[1:]}])
    assert b"\x90\x4e" not in plain
