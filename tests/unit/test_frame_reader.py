"""FrameReader (the client connection's receive-into-buffer framing) against the stream it is fed
in any pieces, the sizes a socket read into ``get_buffer()`` can give: every frame comes out whole
and in order, small ones as bytes cut from the receive buffer, large ones in their own buffer."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.framing import FrameError, FrameReader


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def feed(reader: FrameReader, stream: bytes, reads: list[int]) -> list[bytes | bytearray]:
    """Receive ``stream`` as a socket would: each read at most the buffer's room and the read size."""
    got: list[bytes | bytearray] = []
    pos = 0
    i = 0
    while pos < len(stream):
        buf = reader.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), len(stream) - pos, max(1, reads[i % len(reads)]) if reads else len(buf))
        i += 1
        buf[:n] = stream[pos:pos + n]
        del buf  # as the transport drops its view
        pos += n
        got += reader.updated(n)
        assert reader.buffered == pos - sum(4 + len(f) for f in got)
    return got


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 3, 100, 1019, 1020, 1021, 1024, 3000, 70_000]), min_size=1,
                      max_size=10),
       reads=st.lists(st.integers(1, 5000), max_size=8), chunk=st.sampled_from([8, 1024, 4096, 65536]))
def test_frames_in_any_reads(sizes: list[int], reads: list[int], chunk: int) -> None:
    bodies = [os.urandom(n) for n in sizes]
    reader = FrameReader(chunk=chunk)
    got = feed(reader, b"".join(framed(b) for b in bodies), reads)
    assert [bytes(f) for f in got] == bodies
    assert reader.buffered == 0
    for f, b in zip(got, bodies):  # fits the receive buffer: bytes; else its own bytearray
        assert type(f) is (bytes if len(b) + 4 <= chunk else bytearray)


def test_large_frame_is_received_in_place() -> None:
    """A large frame's rest is received straight into its own buffer, in as few reads as the
    socket gives, and that buffer is the frame handed out (no join, no copy)."""
    body = os.urandom(1 << 20)
    reader = FrameReader(chunk=65536)
    stream = framed(body) + framed(b"next")
    first = reader.get_buffer()
    first[:1000] = stream[:1000]
    assert reader.updated(1000) == []
    more = reader.get_buffer()  # its own buffer only once a chunk of it arrived (see the F3 test below)
    assert len(more) == 65536 - 1000
    more[:] = stream[1000:65536]
    assert reader.updated(65536 - 1000) == []
    rest = reader.get_buffer()
    assert len(rest) == len(body) - (65536 - 4)  # exactly the frame's remainder
    rest[:] = stream[65536:4 + len(body)]
    big = rest.obj
    del first, more, rest
    (frame,) = reader.updated(len(body) - (65536 - 4))
    assert frame is big and frame == body
    buf = reader.get_buffer()
    buf[:8] = stream[-8:]
    del buf
    assert reader.updated(8) == [b"next"]


@pytest.mark.parametrize("head, msg", [(struct.pack(">i", -1), "negative"), (struct.pack(">i", 101), "exceeds")])
def test_bad_sizes_refused_before_allocating(head: bytes, msg: str) -> None:
    reader = FrameReader(max_frame_bytes=100, chunk=64)
    buf = reader.get_buffer()
    buf[:4] = head
    del buf
    with pytest.raises(FrameError, match=msg):
        reader.updated(4)


def _tls_alert_peer_peak(reader: FrameReader, answer: bytes) -> tuple[int, Exception | None]:
    """Feed ``answer`` (then nothing: the peer closed); the tracemalloc peak and the error raised."""
    import tracemalloc

    tracemalloc.start()
    error: Exception | None = None
    try:
        buf = reader.get_buffer()
        buf[:len(answer)] = answer
        del buf
        reader.updated(len(answer))
    except FrameError as exc:
        error = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, error


def test_a_large_announced_size_allocates_nothing_until_its_body_arrives() -> None:
    """F3 (KAFKA-4090): four bytes announcing 300 MiB (within the client's 1 GiB limit), then the peer
    stops: nothing near that size is allocated."""
    reader = FrameReader(max_frame_bytes=1 << 30)
    reader.get_buffer()  # the receive buffer itself is allocated before tracing
    peak, error = _tls_alert_peer_peak(reader, struct.pack(">i", 300 << 20) + b"\x00" * 100)
    assert error is None and peak < 1 << 20, peak
    assert reader.buffered == 104


def test_a_tls_record_as_the_first_answer_is_refused_with_a_hint() -> None:
    """A plaintext client on a TLS port: the broker answers with an alert record (15 03 03 00 02 ...),
    whose header reads as a frame of 336 MiB: refused at once, naming the likely cause, nothing allocated."""
    reader = FrameReader(max_frame_bytes=1 << 30)
    reader.get_buffer()
    peak, error = _tls_alert_peer_peak(reader, b"\x15\x03\x03\x00\x02\x02\x32")
    assert isinstance(error, FrameError) and "TLS listener" in str(error) and "security.protocol" in str(error)
    assert peak < 1 << 20, peak


def test_only_the_first_size_is_checked_for_a_tls_header() -> None:
    """After the first frame the same bytes are an ordinary (large) size: no TLS refusal there."""
    reader = FrameReader(max_frame_bytes=1 << 30)
    buf = reader.get_buffer()
    buf[:10] = framed(b"ok") + b"\x15\x03\x03\x00"
    del buf
    assert reader.updated(10) == [b"ok"]
    assert reader.buffered == 4
