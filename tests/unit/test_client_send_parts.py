"""How a request's parts reach the transport (oncelog.client.aio.connection.BrokerConnection.send).

A Produce request is a list of parts: per batch its 61-byte header and its records (up to
``batch.size`` bytes). asyncio's ``writelines`` (Python 3.11) joins the whole request into one
``bytes`` and a partial ``send`` then slices the rest, two copies of every 1 MB batch before the
transport's own buffer; large parts must reach ``transport.write`` as they are.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from oncelog.client.aio.connection import BrokerConnection, _Sent


class _Recorder(asyncio.WriteTransport):
    """A transport that keeps what it is given (``writelines`` is asyncio's own: join, then write)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[Any] = []

    def write(self, data: Any) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False


def _send(parts: list[Any], rec: "_Recorder | None" = None, conn: "BrokerConnection | None" = None) -> _Recorder:
    if conn is None:
        conn = BrokerConnection("127.0.0.1", 9, client_id="c")
    if rec is None:
        rec = _Recorder()
        conn._transport = rec  # type: ignore[assignment]

    async def go() -> None:
        conn.send(0, 3, parts, expect_response=False)

    asyncio.run(go())
    return rec


def test_large_parts_are_written_as_they_are_and_small_ones_joined() -> None:
    big1, big2 = bytes(range(256)) * 4096, b"\x07" * (1 << 20)  # two 1 MB batches' records
    parts = [b"\x00\x01", b"\x02", bytearray(b"h" * 61), big1, bytearray(b"H" * 61), big2, b"\x00"]
    rec = _send(parts)
    out = b"".join(bytes(w) for w in rec.writes)
    size = sum(map(len, parts)) + 2 + 2 + 4 + 2 + 1  # api key, version, correlation id, client id "c"
    assert out[:4] == struct.pack(">i", size)  # the frame's size covers exactly what was written
    assert len(out) == 4 + size and out.endswith(b"".join(parts))
    # each large part goes to the transport uncopied (views of the very object, 256 KiB at a time)
    views = [w for w in rec.writes if isinstance(w, memoryview)]
    assert [v.obj for v in views] == [big1] * 4 + [big2] * 4, [type(w) for w in rec.writes]
    assert len(rec.writes) == 11  # frame head + small parts, big1 (4), header, big2 (4), the last byte


def test_a_request_of_small_parts_is_one_write() -> None:
    parts = [b"a" * 100, bytearray(b"h" * 61), b"r" * 16384, b"\x00"]
    rec = _send(parts)
    assert len(rec.writes) == 1
    assert bytes(rec.writes[0]).endswith(b"".join(parts))


class _Slow(_Recorder):
    """A transport whose socket takes only the first write: it then buffers and pauses the protocol, as
    asyncio's does when ``send`` takes part of a write (high-water mark 0), until ``drain()``."""

    def __init__(self, conn: BrokerConnection) -> None:
        super().__init__()
        self.conn = conn
        self.buffered = False

    def write(self, data: Any) -> None:
        assert not self.buffered, "written to while it had asked to pause"
        super().write(data)
        self.buffered = True
        self.conn.pause_writing()

    def drain(self) -> None:
        self.buffered = False
        self.conn.resume_writing()


def test_writes_wait_uncopied_while_the_transport_is_paused_and_keep_their_order() -> None:
    """The transport copies into its buffer whatever the socket does not take; while it holds anything
    the connection keeps further writes itself (views, uncopied) and hands them over, in order, each
    time the transport has drained (asyncio's pause_writing / resume_writing)."""
    conn = BrokerConnection("127.0.0.1", 9, client_id="c")
    slow = _Slow(conn)
    conn._transport = slow  # type: ignore[assignment]
    big = bytes(range(256)) * 4096  # 1 MB
    first = [b"a" * 10, big]
    second = [b"b" * 10, b"\x07" * 100_000]
    _send(first, slow, conn)
    _send(second, slow, conn)  # a second request behind the first
    # (acks=0 requests: each also leaves a mark behind its data, resolved once the data went out)
    data = [w for w in conn._backlog if type(w) is not _Sent]
    assert len(slow.writes) == 1 and len(data) == 4 + 1 + 1  # big (4 chunks), head + b, the 100 kB
    assert all(isinstance(w, memoryview) and w.obj is big for w in data[:4])
    while conn._backlog:
        slow.drain()
    slow.drain()
    out = b"".join(bytes(w) for w in slow.writes)
    one = 4 + 11 + sum(map(len, first))
    assert out[4 + 11:one] == b"".join(first)
    assert out[one + 4 + 11:] == b"".join(second)
    assert len(out) == one + 4 + 11 + sum(map(len, second))
