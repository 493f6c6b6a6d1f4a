"""Hand-encoded transaction admin responses decode as Kafka's schema says."""

from __future__ import annotations

import datetime

from kio.schema.describe_transactions.v0.response import DescribeTransactionsResponse
from kio.serial import entity_reader

from oncelog.broker.handlers.describe_transactions import encode_response
from oncelog.client.txns import parse_describe_transactions_v0

STATES = [
    {
        "error_code": 0,
        "transactional_id": "tx-1",
        "transaction_state": "Ongoing",
        "transaction_timeout_ms": 60000,
        "transaction_start_time_ms": 1_700_000_000_123,
        "producer_id": 7,
        "producer_epoch": 3,
        "topics": [{"topic": "a", "partitions": [0, 2]}, {"topic": "__consumer_offsets", "partitions": [0]}],
    },
    {
        "error_code": 105,
        "transactional_id": "missing",
        "transaction_state": "",
        "transaction_timeout_ms": 0,
        "transaction_start_time_ms": -1,
        "producer_id": -1,
        "producer_epoch": -1,
        "topics": [],
    },
]


def test_describe_transactions_matches_kio_schema() -> None:
    body = encode_response(STATES[:1], throttle_ms=5)
    decoded, used = entity_reader(DescribeTransactionsResponse)(memoryview(body), 0)
    assert used == len(body)
    (state,) = decoded.transaction_states
    assert decoded.throttle_time == datetime.timedelta(milliseconds=5)
    assert state.transactional_id == "tx-1" and state.transaction_state == "Ongoing"
    assert state.transaction_start_time == datetime.datetime.fromtimestamp(1_700_000_000.123, tz=datetime.timezone.utc)
    assert (state.producer_id, state.producer_epoch) == (7, 3)
    assert [(t.topic, list(t.partitions)) for t in state.topics] == [("a", [0, 2]), ("__consumer_offsets", [0])]


def test_describe_transactions_carries_negative_start_time() -> None:
    parsed = parse_describe_transactions_v0(encode_response(STATES))
    assert [s["transactional_id"] for s in parsed] == ["tx-1", "missing"]
    assert parsed[1]["transaction_start_time_ms"] == -1 and parsed[1]["error_code"] == 105
    assert parsed[0]["partitions"] == (("__consumer_offsets", 0), ("a", 0), ("a", 2))
    assert parsed[1]["partitions"] == ()
