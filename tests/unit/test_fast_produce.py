"""The hand-written Produce response encoder equals kio's, byte for byte."""

from __future__ import annotations

import pytest

from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_response, encode_response, response_type
from oncelog.protocol.fast_produce import encode_produce_response

TOPICS = [
    {
        "name": "orders",
        "partition_responses": [
            {"index": 0, "error_code": 0, "base_offset": 41, "log_append_time": -1, "log_start_offset": 3,
             "record_errors": [], "error_message": None},
            {"index": 5, "error_code": 87, "base_offset": -1, "log_append_time": -1, "log_start_offset": -1,
             "record_errors": [{"batch_index": 1, "batch_index_error_message": "no key"},
                               {"batch_index": 3, "batch_index_error_message": None}],
             "error_message": "one batch per partition"},
        ],
    },
    {"name": "é-topic", "partition_responses": [
        {"index": 2, "error_code": 0, "base_offset": 2**40, "log_append_time": 1700000000123, "log_start_offset": 0,
         "record_errors": [], "error_message": None}]},
]


@pytest.mark.parametrize("version", range(3, 13))
def test_matches_kio(version: int) -> None:
    cls = response_type(0, version)
    expected = encode_response(materialize(cls, {"responses": TOPICS, "throttle_time": 0}))
    got = encode_produce_response(version, TOPICS)
    assert got == expected
    decoded = decode_response(0, version, got)
    assert decoded.responses[0].partition_responses[1].error_code == 87
    if version >= 8:  # record errors (a compacted topic's keyless records)
        errs = decoded.responses[0].partition_responses[1].record_errors
        assert [(e.batch_index, e.batch_index_error_message) for e in errs] == [(1, "no key"), (3, None)]
    assert decoded.responses[1].partition_responses[0].base_offset == 2**40
