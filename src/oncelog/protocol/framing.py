"""Size-prefixed framing, sans-IO.

Every Kafka request and response is an int32 big-endian length followed by
that many bytes. :class:`FrameDecoder` takes bytes as they arrive and yields
whole frames; it never touches a socket.
"""

from __future__ import annotations

import struct

_LEN = struct.Struct(">i")
_TLS_RECORD_TYPES = frozenset((0x14, 0x15, 0x16, 0x17))  # change_cipher_spec, alert, handshake, application_data


class FrameError(Exception):
    """The peer sent a frame we refuse (negative or over the size limit)."""


class FrameDecoder:
    """Accumulates bytes and splits them into frames.

    ``max_frame_bytes`` mirrors Kafka's ``socket.request.max.bytes``: a frame
    that announces a larger size raises :class:`FrameError` before any of its
    body is buffered, so an oversize request cannot exhaust memory.

    A large frame (a Fetch answer of megabytes arrives in many reads) is kept as
    the list of the pieces read and joined once when complete: growing one buffer
    and slicing the frame out of it copied every byte three times into fresh memory.
    A read smaller than ``SMALL`` is not kept as its own piece but copied onto the end
    of a growing bytearray piece: a peer sending a large frame in tiny segments would
    otherwise make the decoder hold an object header (tens of bytes) per byte or two.
    """

    __slots__ = ("_buf", "max_frame_bytes", "_parts", "_need")

    BIG = 64 * 1024  # frames at least this large are collected as pieces
    SMALL = 1024  # reads shorter than this are copied onto the last piece, not kept as one (an object
    # per read costs ~40 bytes: at most 4% here, while a read of a TCP segment or more is kept as is)

    def __init__(self, max_frame_bytes: int = 100 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self.max_frame_bytes = max_frame_bytes
        self._parts: list[bytes | bytearray | memoryview] = []  # the body so far of a large frame
        self._need = 0  # bytes the large frame still lacks (0: not collecting one)

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return every frame it completes (bodies only)."""
        need = self._need
        if need:
            n = len(data)
            if n < need:
                parts = self._parts
                if n < self.SMALL:
                    last = parts[-1]
                    if type(last) is bytearray:
                        last += data
                    else:
                        parts.append(bytearray(data))
                else:
                    parts.append(data if isinstance(data, bytes) else bytes(data))
                self._need = need - n
                return []
            view = memoryview(data)
            self._parts.append(view[:need])
            frames = [b"".join(self._parts)]
            self._parts = []
            self._need = 0
            if n > need:
                frames += self._feed_buffer(view[need:])
            return frames
        return self._feed_buffer(data)

    def _feed_buffer(self, data: bytes | memoryview) -> list[bytes]:
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < 4:
                return []
            (size,) = _LEN.unpack_from(buf, 0)
            if 0 <= size <= self.max_frame_bytes and len(buf) - 4 < size and size < self.BIG:
                return []  # still no whole frame: nothing copied
            src = bytes(buf)  # frames are cut from bytes by slicing: no view per frame
            buf.clear()
        else:
            src = data if type(data) is bytes else bytes(data)
        frames: list[bytes] = []
        pos = 0
        end = len(src)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(src, pos)
            if size < 0:
                raise FrameError(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameError(
                    f"frame of {size} bytes exceeds socket.request.max.bytes={self.max_frame_bytes}"
                )
            if end - pos - 4 < size:
                if size >= self.BIG:  # collect the rest as pieces
                    self._parts = [src[pos + 4 :]]
                    self._need = size - (end - pos - 4)
                    pos = end
                break
            frames.append(src[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if pos < end:
            buf += memoryview(src)[pos:] if pos else src
        return frames

    def add(self, data: bytes) -> None:
        """Buffer ``data`` without splitting it (see :meth:`next_frame`)."""
        self._buf += data

    def next_frame(self) -> bytes | None:
        """The first whole frame buffered, or None; only its size is checked, the bytes after it are
        left unparsed (a peer served one request at a time, such as one not yet authenticated)."""
        buf = self._buf
        if len(buf) < 4:
            return None
        (size,) = _LEN.unpack_from(buf, 0)
        if size < 0:
            raise FrameError(f"negative frame size {size}")
        if size > self.max_frame_bytes:
            raise FrameError(f"frame of {size} bytes exceeds socket.request.max.bytes={self.max_frame_bytes}")
        if len(buf) - 4 < size:
            return None
        body = bytes(buf[4 : 4 + size])
        del buf[: 4 + size]
        return body

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a whole frame (a large frame's length prefix included)."""
        return len(self._buf) + (4 + sum(map(len, self._parts)) if self._need else 0)


class FrameReader:
    """Framing for a reader that receives straight into buffers (``asyncio.BufferedProtocol``).

    :meth:`get_buffer` gives the writable space to receive into, :meth:`updated` takes the
    number of bytes received there and returns the frames it completed (bodies only). A frame
    that fits the ``chunk``-sized receive buffer is cut from it as ``bytes``; a larger one (a
    Fetch answer of megabytes) gets its own ``bytearray`` of exactly its size, received into
    directly and returned as that ``bytearray``: no joining of pieces, no fresh 256 KiB read
    buffer per read. ``max_frame_bytes`` as :class:`FrameDecoder`'s (checked before anything
    of the frame's body is allocated). Only the client's connection uses it.

    The large frame's buffer is allocated only once its start filled the receive buffer (a
    ``chunk`` of it arrived), not when its four size bytes did: a peer that is no Kafka plaintext
    listener (a TLS port answers with a record whose header reads as a size of 336 MiB, Kafka's
    KAFKA-4090) sends a few bytes and closes, and nothing of that size is allocated. The first
    frame's size bytes reading as a TLS record header are refused at once with a hint.
    """

    __slots__ = ("max_frame_bytes", "_buf", "_view", "_start", "_end", "_big", "_fill", "_first")

    def __init__(self, max_frame_bytes: int = 100 * 1024 * 1024, chunk: int = 64 * 1024) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray(chunk)
        self._view = memoryview(self._buf)
        self._start = 0  # the first byte not yet framed in _buf
        self._end = 0  # the end of the bytes received in _buf
        self._big: bytearray | None = None  # the large frame being received
        self._fill = 0  # bytes of it received
        self._first = True  # no frame size read yet

    def get_buffer(self) -> memoryview:
        big = self._big
        if big is not None:
            return memoryview(big)[self._fill:]
        return self._view[self._end:]

    def updated(self, n: int) -> list[bytes | bytearray]:
        """``n`` bytes were received into the last :meth:`get_buffer`; the frames completed."""
        big = self._big
        if big is not None:
            self._fill += n
            if self._fill < len(big):
                return []
            self._big = None
            return [big]
        end = self._end = self._end + n
        buf = self._buf
        pos = self._start
        frames: list[bytes | bytearray] = []
        if self._first and end - pos >= 4:
            self._first = False
            if buf[pos] in _TLS_RECORD_TYPES and buf[pos + 1] == 3 and buf[pos + 2] <= 4:
                raise FrameError(f"the answer starts with a TLS record header ({bytes(buf[pos:pos + 4]).hex(' ')}), "
                                 f"not a Kafka frame size: is this a TLS listener? check security.protocol")
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if size < 0:
                raise FrameError(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameError(f"frame of {size} bytes exceeds socket.request.max.bytes={self.max_frame_bytes}")
            if end - pos - 4 >= size:
                frames.append(bytes(self._view[pos + 4:pos + 4 + size]))
                pos += 4 + size
                continue
            if size + 4 > len(buf) and pos == 0 and end == len(buf):
                # does not fit, and its start filled the receive buffer: now its own buffer, with that start
                have = end - 4
                big = self._big = bytearray(size)
                big[:have] = self._view[4:end]
                self._fill = have
                pos = end
            break
        rest = end - pos
        if not rest:
            self._start = self._end = 0
        elif pos and pos + (4 if rest < 4 else 4 + _LEN.unpack_from(buf, pos)[0]) > len(buf):
            # the start of a frame that fits the buffer, but not from where it starts: moved to the front
            buf[:rest] = self._view[pos:end]
            self._start, self._end = 0, rest
        else:
            self._start = pos
        return frames

    def release(self) -> None:
        """Forget what is buffered, a partly received large frame included (its connection closed)."""
        self._big = None
        self._fill = self._start = self._end = 0

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return (self._end - self._start) + (4 + self._fill if self._big is not None else 0)


def frame(payload_parts: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """Prefix ``payload_parts`` with their total length; returns the parts to write."""
    total = sum(len(p) for p in payload_parts)
    return [_LEN.pack(total), *payload_parts]
