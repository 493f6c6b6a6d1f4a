"""Sans-IO fuzzing of the request decoder path (hypothesis).

FrameDecoder -> request header -> header tag block -> body codec, for every
(api_key, version) the broker advertises. Whatever the bytes, each stage
either succeeds or raises its documented error type (FrameError,
HeaderError, DecodeError) -- anything else would reach the server's
"internal error" path instead of the clean "close the connection" one.
``ONCELOG_FUZZ_EXAMPLES`` scales every test up (default 1: CI size).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from oncelog.protocol.codec import decode_request, encode_request, is_flexible
from oncelog.protocol.framing import FrameDecoder, FrameError
from oncelog.protocol.headers import HeaderError, parse_request_header_prefix, skip_tagged_fields
from oncelog.testing import fuzz

SCALE = max(1, int(os.environ.get("ONCELOG_FUZZ_EXAMPLES", "1")))


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=n * SCALE,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: a native crash costs a worker restart
        deadline=2000,  # a decoder that takes seconds on a small input is a bug too
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


PAIRS = fuzz.advertised_pairs()
FLEX_PAIRS = [(k, v) for k, v in PAIRS if is_flexible(k, v)]
MAX = 1 << 16


# -- framing -----------------------------------------------------------------


def _reference_frames(data: bytes, limit: int) -> tuple[list[bytes], bool]:
    """Frames of ``data`` parsed in one go (None error) or the point a FrameError is due."""
    out, pos = [], 0
    while len(data) - pos >= 4:
        (size,) = struct.unpack_from(">i", data, pos)
        if size < 0 or size > limit:
            return out, True
        if len(data) - pos - 4 < size:
            break
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out, False


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        choice = draw(st.integers(0, 4))
        if choice <= 2:
            parts.append(fuzz.framed(draw(st.binary(max_size=64))))
        elif choice == 3:
            parts.append(struct.pack(">i", draw(st.sampled_from([-1, 0, MAX, MAX + 1, 2**31 - 1, -(2**31)]))))
        else:
            parts.append(draw(st.binary(max_size=16)))
    return b"".join(parts)


@fuzz_settings(300)
@given(data=streams(), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_frame_decoder_any_chunking(data: bytes, cuts: list[int]) -> None:
    expected, refused = _reference_frames(data, MAX)
    dec = FrameDecoder(MAX)
    got: list[bytes] = []
    points = sorted({0, len(data), *[c for c in cuts if c < len(data)]})
    try:
        for a, b in zip(points, points[1:]):
            got += dec.feed(data[a:b])
            # only an incomplete frame is ever held back (a large one as pieces, awaiting _need bytes)
            if dec._need:
                assert not dec._buf and dec._need > 0
            else:
                assert dec.buffered < 4 or dec.buffered < 4 + struct.unpack_from(">i", bytes(dec._buf), 0)[0]
    except FrameError:
        assert refused
        assert got == expected[: len(got)]
        return
    assert not refused
    assert got == expected


@fuzz_settings(100)
@given(size=st.integers(MAX + 1, 2**31 - 1), tail=st.binary(max_size=32))
def test_oversize_frame_refused_before_buffering(size: int, tail: bytes) -> None:
    dec = FrameDecoder(MAX)
    with pytest.raises(FrameError):
        dec.feed(struct.pack(">i", size) + tail)


# -- header ------------------------------------------------------------------


@fuzz_settings(400)
@given(buf=st.one_of(st.binary(max_size=40), st.builds(
    lambda k, v, c, n, rest: struct.pack(">hhih", k, v, c, n) + rest,
    st.integers(-(2**15), 2**15 - 1), st.integers(-(2**15), 2**15 - 1), st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([-2, -1, 0, 1, 4, 0x7FFF, -(2**15)]), st.binary(max_size=40))))
def test_request_header_only_header_errors(buf: bytes) -> None:
    try:
        header, pos = parse_request_header_prefix(buf)
    except HeaderError:
        return
    assert 8 <= pos <= len(buf)
    assert header.client_id is None or isinstance(header.client_id, str)
    try:
        end = skip_tagged_fields(buf, pos)
    except HeaderError:
        return
    assert pos < end <= len(buf)


@fuzz_settings(300)
@given(block=fuzz.tagged_blocks(), tail=st.binary(max_size=8))
def test_header_tag_block_only_header_errors(block: bytes, tail: bytes) -> None:
    buf = fuzz.request_header(3, 12, 1, b"x", flexible=True, tags=block) + tail
    header, pos = parse_request_header_prefix(buf)
    try:
        end = skip_tagged_fields(buf, pos)
    except HeaderError:
        return
    assert end <= len(buf)


# -- body codec ----------------------------------------------------------------


# decode_request runs in a child process: an input that aborts the interpreter
# (kio's native reader) must fail a test, not kill the test run
WORKER = fuzz.DecoderWorker()


@pytest.fixture(scope="module", autouse=True)
def _close_worker() -> Iterator[None]:
    yield
    WORKER.close()


def _decode(api_key: int, version: int, buf: bytes, offset: int = 0) -> None:
    result = WORKER.decode(api_key, version, buf, offset)
    assert result in ("ok", "DecodeError"), (
        f"decode_request({api_key}, {version}, {buf[:300]!r}, {offset}) [{len(buf)} bytes] -> {result}"
    )


@pytest.mark.parametrize("api_key,version", PAIRS, ids=[f"{k}v{v}" for k, v in PAIRS])
def test_decode_every_advertised_pair_empty_and_short(api_key: int, version: int) -> None:
    """Every prefix of a valid request either decodes or raises DecodeError."""
    from oncelog.protocol.codec import request_type

    assert request_type(api_key, version) is not None
    for buf in (b"", b"\x00", b"\xff" * 3, b"\x80" * 16, b"\x7f\xff\xff\xff" * 8):
        _decode(api_key, version, buf)


@fuzz_settings(6)
@given(data=st.data())
@pytest.mark.parametrize("api_key,version", PAIRS, ids=[f"{k}v{v}" for k, v in PAIRS])
def test_decode_structured_mutated_prefixes(api_key: int, version: int, data: st.DataObject) -> None:
    """Valid random requests decode; their mutations and prefixes raise only DecodeError."""
    entity = data.draw(fuzz.structured_request(api_key, version))
    body = encode_request(entity)
    decode_request(api_key, version, body, 0)  # a valid encoding always decodes
    mutated = data.draw(fuzz.mutate(body))
    _decode(api_key, version, mutated)
    cut = data.draw(st.integers(0, max(0, len(body) - 1)))
    _decode(api_key, version, body[:cut])


@fuzz_settings(600)
@given(pair=st.sampled_from(PAIRS), buf=st.binary(max_size=300))
def test_decode_random_bytes(pair: tuple[int, int], buf: bytes) -> None:
    _decode(*pair, buf)


@fuzz_settings(300)
@given(pair=st.sampled_from(FLEX_PAIRS), block=fuzz.tagged_blocks(), data=st.data())
def test_decode_tagged_garbage(pair: tuple[int, int], block: bytes, data: st.DataObject) -> None:
    entity = data.draw(fuzz.structured_request(*pair))
    body = encode_request(entity)
    # only bodies whose top-level tag block is empty (tagged fields left at their defaults)
    assume(body.endswith(b"\x00"))
    _decode(*pair, body[:-1] + block)


@fuzz_settings(200)
@given(golden=st.sampled_from(fuzz.golden_requests()), data=st.data())
def test_decode_golden_mutated(golden: tuple[int, int, bytes], data: st.DataObject) -> None:
    api_key, version, frame = golden
    header, pos = parse_request_header_prefix(frame)
    assert (header.api_key, header.api_version) == (api_key, version)
    if is_flexible(api_key, version):
        pos = skip_tagged_fields(frame, pos)
    decode_request(api_key, version, frame, pos)
    mutated = data.draw(fuzz.mutate(frame, keep_prefix=pos))
    _decode(api_key, version, mutated, pos)


@fuzz_settings(300)
@given(case=fuzz.any_case())
def test_whole_decoder_path_only_documented_errors(case: fuzz.FuzzCase) -> None:
    """What the server does before a handler runs, on every generated case."""
    try:
        frames = FrameDecoder(1 << 20).feed(case.data)
    except FrameError:
        return
    for frame in frames:
        try:
            header, pos = parse_request_header_prefix(frame)
        except HeaderError:
            continue
        if (header.api_key, header.api_version) not in set(PAIRS):
            continue
        try:
            if is_flexible(header.api_key, header.api_version):
                pos = skip_tagged_fields(frame, pos)
        except HeaderError:
            continue
        _decode(header.api_key, header.api_version, frame, pos)


# -- regressions found by this fuzzer -------------------------------------------


@pytest.mark.parametrize("api_key,version", [(3, 12), (9, 8), (19, 7), (20, 6), (66, 2)])
def test_regression_huge_compact_array_length_aborts_interpreter(api_key: int, version: int) -> None:
    """A body of 5 bytes, a compact array length of 2**32-2, must raise DecodeError.

    kio 0.6.5's native reader preallocates from the untrusted length, the
    allocation of 32 GiB fails, and Rust aborts the process ("memory allocation
    of 34359738352 bytes failed", SIGABRT) -- in the broker that is the whole
    broker, from one 14-byte request (see tests/integration/test_fuzz.py).
    """
    result = WORKER.decode(api_key, version, b"\xff\xff\xff\xff\x0f")
    assert result == "DecodeError", result
