"""protocol.fetch.encode_fetch_request (the consumer's hand-written Fetch request encoder) against
kio's encoder of reader.fetch_request's body, for every version it encodes (v4-v12): the same
bytes for random topics (non-ASCII names too), partitions, offsets, sizes and isolation levels;
and the broker's request decoder reads the fields back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.client.reader import fetch_request
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_request, encode_request, request_type
from oncelog.protocol.fetch import encode_fetch_request

_parts = st.dictionaries(st.text(min_size=1, max_size=12),
                         st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**62)), max_size=5),
                         max_size=3)
_sizes = st.fixed_dictionaries({"max_wait_ms": st.integers(0, 2**31 - 1), "min_bytes": st.integers(0, 2**31 - 1),
                                "max_bytes": st.integers(0, 2**31 - 1),
                                "partition_max_bytes": st.integers(0, 2**31 - 1)})


@pytest.mark.parametrize("version", range(4, 13))
@settings(max_examples=40, deadline=None)
@given(parts=_parts, iso=st.sampled_from([0, 1]), sizes=_sizes)
def test_the_same_bytes_as_the_generic_encoder(version: int, parts: dict, iso: int, sizes: dict) -> None:
    ref = encode_request(materialize(request_type(1, version), fetch_request(parts, iso, **sizes)))
    got = encode_fetch_request(version, parts, iso, **sizes)
    assert got == bytes(ref)
    req = decode_request(1, version, got, 0)
    assert int(req.isolation_level) == iso and int(req.min_bytes) == sizes["min_bytes"]
    assert [(t.topic, [(int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes)) for p in t.partitions])
            for t in req.topics] == [(t, [(p, o, sizes["partition_max_bytes"]) for p, o in ps])
                                     for t, ps in parts.items()]


@pytest.mark.parametrize("version", [3, 13])
def test_versions_outside_v4_v12_are_refused(version: int) -> None:
    with pytest.raises(ValueError):
        encode_fetch_request(version, {"t": [(0, 0)]}, 0, max_wait_ms=1, min_bytes=1, max_bytes=1,
                             partition_max_bytes=1)
