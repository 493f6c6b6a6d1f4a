"""protocol.fetch.decode_fetch_response (the consumer's hand-written Fetch decoder) against kio's
encoder and decoder, for every version it decodes (v4-v12): random topics, partitions, error codes,
aborted transactions (null, empty, some), null and non-null records, v12's tagged fields; from
bytes and from a bytearray (the connection's receive buffer). Damaged answers raise
FetchDecodeError, never another exception."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_response, encode_response, response_type
from oncelog.protocol.fetch import FetchDecodeError, decode_fetch_response

_partition = st.fixed_dictionaries({
    "partition_index": st.integers(0, 2**31 - 1), "error_code": st.sampled_from([0, 1, 3, 6, 74]),
    "high_watermark": st.integers(-1, 2**62), "last_stable_offset": st.integers(-1, 2**62),
    "log_start_offset": st.integers(-1, 2**62),
    "aborted_transactions": st.one_of(st.none(), st.lists(st.fixed_dictionaries(
        {"producer_id": st.integers(0, 2**62), "first_offset": st.integers(0, 2**62)}), max_size=3)),
    "preferred_read_replica": st.integers(-1, 5),
    "records": st.one_of(st.none(), st.binary(max_size=300)),
    "diverging_epoch": st.one_of(st.just({"epoch": -1, "end_offset": -1}),
                                 st.fixed_dictionaries({"epoch": st.integers(0, 9), "end_offset": st.integers(0, 99)})),
    "current_leader": st.one_of(st.just({"leader_id": -1, "leader_epoch": -1}),
                                st.fixed_dictionaries({"leader_id": st.integers(0, 9),
                                                       "leader_epoch": st.integers(0, 9)})),
})
_topic = st.fixed_dictionaries({"topic": st.text(min_size=1, max_size=20),
                                "partitions": st.lists(_partition, max_size=4)})


def fields_of(resp: object, version: int) -> tuple:
    return (int(resp.error_code) if version >= 7 else 0, int(resp.session_id) if version >= 7 else 0,
            [(t.topic, [(int(p.partition_index), int(p.error_code), int(p.high_watermark),
                         int(p.last_stable_offset), int(p.log_start_offset) if version >= 5 else -1,
                         None if p.aborted_transactions is None else
                         [(int(a.producer_id), int(a.first_offset)) for a in p.aborted_transactions],
                         int(p.preferred_read_replica) if version >= 11 else -1,
                         None if p.records is None else bytes(p.records)) for p in t.partitions])
             for t in resp.responses])


@settings(max_examples=200, deadline=None)
@given(version=st.integers(4, 12), topics=st.lists(_topic, max_size=3), session=st.integers(0, 2**31 - 1),
       error=st.sampled_from([0, 71]), prefix=st.binary(max_size=6), buffer=st.booleans())
def test_equals_kio(version: int, topics: list[dict], session: int, error: int, prefix: bytes,
                    buffer: bool) -> None:
    entity = materialize(response_type(1, version), {"throttle_time": 7, "error_code": error, "session_id": session,
                                                     "responses": topics})
    body = prefix + encode_response(entity)
    want = decode_response(1, version, body, len(prefix))
    got = decode_fetch_response(bytearray(body) if buffer else body, len(prefix), version)
    assert fields_of(got, version) == fields_of(want, version)
    assert got.throttle_time_ms == 7
    assert all(type(p.records) is bytes for t in got.responses for p in t.partitions if p.records is not None)


@pytest.mark.parametrize("version", [4, 5, 7, 11, 12])
def test_damage_raises_decode_error(version: int) -> None:
    entity = materialize(response_type(1, version), {"throttle_time": 0, "error_code": 0, "session_id": 1,
        "responses": [{"topic": "t", "partitions": [
            {"partition_index": 0, "error_code": 0, "high_watermark": 5, "aborted_transactions": [
                {"producer_id": 1, "first_offset": 2}], "records": os.urandom(100)},
            {"partition_index": 1, "error_code": 0, "high_watermark": 5, "aborted_transactions": None,
             "records": None}]}]})
    body = encode_response(entity)
    assert fields_of(decode_fetch_response(body, 0, version), version) == fields_of(
        decode_response(1, version, body, 0), version)
    for cut in range(len(body)):  # every truncation
        with pytest.raises(FetchDecodeError):
            decode_fetch_response(body[:cut], 0, version)
    with pytest.raises(FetchDecodeError, match="after the Fetch response"):
        decode_fetch_response(body + b"\x00", 0, version)
    for bad in (3, 13):
        with pytest.raises(FetchDecodeError, match="not decoded here"):
            decode_fetch_response(body, 0, bad)


@settings(max_examples=50, deadline=None)
@given(version=st.sampled_from([4, 11, 12]), topics=st.lists(_topic, max_size=2))
def test_views_instead_of_copies(version: int, topics: list[dict]) -> None:
    """copy=False: each partition's records is a view of the buffer, with the same bytes."""
    entity = materialize(response_type(1, version), {"throttle_time": 0, "error_code": 0, "session_id": 0,
                                                     "responses": topics})
    body = bytearray(encode_response(entity))
    got = decode_fetch_response(body, 0, version, copy=False)
    want = decode_fetch_response(bytes(body), 0, version)
    assert fields_of(got, version) == fields_of(want, version)
    views = [p.records for t in got.responses for p in t.partitions if p.records is not None]
    assert all(type(v) is memoryview and v.obj is body for v in views)
