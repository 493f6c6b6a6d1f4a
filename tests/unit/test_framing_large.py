"""FrameDecoder with frames of megabytes (a Fetch answer) arriving in many reads: collected as
pieces and joined once; the frames and what follows them come out exactly as sent."""

from __future__ import annotations

import os
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.framing import FrameDecoder


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 3, FrameDecoder.BIG - 1, FrameDecoder.BIG, 300_000]), min_size=1,
                      max_size=4),
       cuts=st.lists(st.integers(0, 1_300_000), max_size=12), chunk=st.sampled_from([1, 7, 65536, 262144]))
def test_large_frames_in_any_pieces(sizes: list[int], cuts: list[int], chunk: int) -> None:
    bodies = [os.urandom(n) for n in sizes]
    stream = b"".join(framed(b) for b in bodies)
    points = sorted({0, len(stream), *[c for c in cuts if c < len(stream)],
                     *range(0, len(stream), max(chunk, 4096))})
    dec = FrameDecoder()
    got: list[bytes] = []
    for a, b in zip(points, points[1:]):
        got += dec.feed(stream[a:b])
        assert dec.buffered <= len(stream)
    assert got == bodies
    assert dec.buffered == 0
    assert all(type(f) is bytes for f in got)


def test_pieces_are_held_not_copied_until_complete() -> None:
    body = os.urandom(1 << 20)
    stream = framed(body) + framed(b"next")
    dec = FrameDecoder()
    assert dec.feed(stream[:100_000]) == []
    assert dec.buffered == 100_000 - 4 and not dec._buf  # the frame's body so far, as a piece
    assert dec.feed(memoryview(stream)[100_000:500_000]) == []
    assert dec.buffered == 500_000 - 4
    assert dec.feed(stream[500_000:]) == [body, b"next"]
