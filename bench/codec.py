"""Codec micro-benchmark: kio decode/encode of a Produce request and response.

Run: .venv/bin/python bench/codec.py  (a benchmark, not a test; prints µs per op)
"""

from __future__ import annotations

import timeit

from oncelog.protocol.build import materialize
from oncelog.protocol.fast_produce import encode_produce_response
from oncelog.protocol.codec import decode_request, encode_request, encode_response, request_type, response_type


def main() -> None:
    req = materialize(
        request_type(0, 9),
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 30000,
            "topic_data": [{"name": "t", "partition_data": [{"index": i, "records": b"x" * 1000} for i in range(8)]}],
        },
    )
    body = encode_request(req)
    resp = {
        "responses": [
            {
                "name": "t",
                "partition_responses": [
                    {"index": i, "error_code": 0, "base_offset": 100, "log_append_time": -1, "log_start_offset": 0,
                     "record_errors": [], "error_message": None}
                    for i in range(8)
                ],
            }
        ],
        "throttle_time": 0,
    }
    cls = response_type(0, 9)
    entity = materialize(cls, resp)
    n = 20000
    cases = {
        "encode Produce v9 response by hand": lambda: encode_produce_response(9, resp["responses"]),
        "decode Produce v9 request (8 partitions)": lambda: decode_request(0, 9, body, 0),
        "materialize Produce v9 response": lambda: materialize(cls, resp),
        "encode Produce v9 response": lambda: encode_response(entity),
    }
    for name, fn in cases.items():
        best = min(timeit.repeat(fn, number=n, repeat=3)) / n
        print(f"{name}: {best * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
