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
        assert dec.buffered == (b - sum(4 + len(f) for f in got))
    assert got == bodies
    assert dec.buffered == 0
    assert all(type(f) is bytes for f in got)


def test_pieces_are_held_not_copied_until_complete() -> None:
    body = os.urandom(1 << 20)
    stream = framed(body) + framed(b"next")
    dec = FrameDecoder()
    assert dec.feed(stream[:100_000]) == []
    assert dec.buffered == 100_000 and not dec._buf  # the frame so far (its body as a piece)
    assert dec.feed(memoryview(stream)[100_000:500_000]) == []
    assert dec.buffered == 500_000
    assert dec.feed(stream[500_000:]) == [body, b"next"]


def test_tiny_reads_of_a_large_frame_hold_about_the_frame() -> None:
    # A peer may send a large frame in tiny TCP segments; keeping every read as its own object
    # held ~20 times the frame (87 MB for 4 MB in 2-byte reads).
    import tracemalloc

    size = 1 << 18
    body = os.urandom(size)
    stream = framed(body) + framed(b"after")
    for piece in (1, 8, 100, 5000):
        dec = FrameDecoder()
        tracemalloc.start()
        try:
            stop = len(stream) - 2000
            for i in range(0, stop, piece):
                assert dec.feed(stream[i : min(i + piece, stop)]) == []
            held, _peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert held < 1.5 * size, (piece, held)
        assert dec.buffered == stop
        assert dec.feed(stream[stop:]) == [body, b"after"]


def test_small_and_large_reads_mixed() -> None:
    import random

    rnd = random.Random(7)
    bodies = [os.urandom(n) for n in (300_000, 5, FrameDecoder.BIG, 1_000_000)]
    stream = b"".join(framed(b) for b in bodies)
    for _ in range(5):
        dec = FrameDecoder()
        got: list[bytes] = []
        i = 0
        while i < len(stream):
            n = rnd.choice((1, 3, 100, FrameDecoder.SMALL - 1, FrameDecoder.SMALL, 70_000))
            got += dec.feed(memoryview(stream)[i : i + n] if rnd.random() < 0.3 else stream[i : i + n])
            i += n
        assert got == bodies
        assert dec.buffered == 0
