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

from oncelog.client.aio.connection import BrokerConnection


class _Recorder(asyncio.WriteTransport):
    """A transport that keeps what it is given (``writelines`` is asyncio's own: join, then write)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[Any] = []

    def write(self, data: Any) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False


def _send(parts: list[Any]) -> _Recorder:
    conn = BrokerConnection("127.0.0.1", 9, client_id="c")
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
    # each large part goes to the transport uncopied (a view of the very object), the rest in few writes
    views = [w for w in rec.writes if isinstance(w, memoryview)]
    assert [v.obj for v in views] == [big1, big2], [type(w) for w in rec.writes]
    assert len(rec.writes) == 5  # frame head + small parts, big1, header, big2, the last byte


def test_a_request_of_small_parts_is_one_write() -> None:
    parts = [b"a" * 100, bytearray(b"h" * 61), b"r" * 16384, b"\x00"]
    rec = _send(parts)
    assert len(rec.writes) == 1
    assert bytes(rec.writes[0]).endswith(b"".join(parts))
