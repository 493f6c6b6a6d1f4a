"""The client's conditional-produce pieces without a broker: the request's tag and the error classes."""

from __future__ import annotations

import pickle

from oncelog.client import ConditionalProduceRefused, OffsetMismatch
from oncelog.client.aio.producer import encode_produce_request
from oncelog.client.errors import error_for
from oncelog.protocol.codec import decode_request, unknown_tags_of
from oncelog.protocol.conditional import EXPECTED_OFFSET_TAG, parse_offset_tag
from oncelog.protocol.records import Record, encode_record_batch


def test_expected_offset_is_tag_10000_of_its_partition_only() -> None:
    batch = encode_record_batch([Record(None, b"v")], base_offset=0)
    body = b"".join(encode_produce_request(9, None, -1, 1000, {"t": [(0, batch), (1, batch)]}, {("t", 1): 42}))
    tags: dict = {}
    req = decode_request(0, 9, body, 0, tags)
    parts = req.topic_data[0].partition_data
    assert unknown_tags_of(tags, parts[0]) is None
    found = unknown_tags_of(tags, parts[1])
    assert found is not None and parse_offset_tag(found[EXPECTED_OFFSET_TAG]) == 42
    # without conditions the request is byte for byte the unconditional one
    plain = b"".join(encode_produce_request(9, None, -1, 1000, {"t": [(0, batch), (1, batch)]}))
    assert len(body) == len(plain) + 11


def test_error_codes_map_to_typed_refusals() -> None:
    e = error_for(10001, "m")
    assert type(e) is OffsetMismatch and e.name == "ONCELOG_OFFSET_MISMATCH" and not e.retriable
    r = error_for(10002)
    assert isinstance(r, OffsetMismatch) and type(r) is ConditionalProduceRefused
    x = pickle.loads(pickle.dumps(OffsetMismatch("m", 7, 3, "t", 1)))
    assert (x.actual_offset, x.expected_offset, x.topic, x.partition) == (7, 3, "t", 1)
