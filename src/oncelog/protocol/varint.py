"""Unsigned varints and tagged-field blocks, shared by the hand-written decoders.

The request and response headers (:mod:`.headers`), the consumer's Fetch
decoder (:mod:`.fetch`) and the codec's request guard (:mod:`.codec`) read the
same two things, each raising its own error class: :func:`varint_readers`
makes the pair for one error class. The hand-written encoders (the Produce
response, the Fetch request) write varints with :func:`encode_uvarint`. The loop indexes the buffer without a
bounds check per byte (Fetch decoding is on the consumer's hot path): running
off the end of the buffer is the ``IndexError`` that a ``try`` turns into the
error (free in CPython 3.11+ while nothing is raised), and a one-byte varint
(most lengths, counts and empty tag blocks) returns before the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["encode_uvarint", "varint_readers"]

ReadUvarint = Callable[[Any, int], tuple[int, int]]
SkipTaggedFields = Callable[[Any, int], int]


def varint_readers(error: Callable[[str], Exception]) -> tuple[ReadUvarint, SkipTaggedFields]:
    """``(read_uvarint, skip_tagged_fields)`` raising ``error(message)`` on bad input.

    ``read_uvarint(buf, pos)``: the unsigned varint (at most 5 bytes) at ``pos`` and
    the position after it. ``skip_tagged_fields(buf, pos)``: the position after the
    tagged-field block at ``pos`` (a count, then per field a tag, a size and that
    many bytes), which must lie within ``buf``. A caller whose field must end before
    the end of ``buf`` compares the position returned with its own end.
    """

    # the error and the reader are bound as (private) defaults, not closed over: no free
    # variables to copy into each call's frame, and a local is the cheapest name to load

    def read_uvarint(buf: Any, pos: int, _error: Callable[[str], Exception] = error) -> tuple[int, int]:
        try:
            b = buf[pos]
            if b < 0x80:  # one byte: most lengths, counts and tag blocks
                return b, pos + 1
            value = b & 0x7F
            shift = 7
            while True:
                pos += 1
                b = buf[pos]
                value |= (b & 0x7F) << shift
                if b < 0x80:
                    return value, pos + 1
                shift += 7
                if shift > 28:
                    raise _error("unsigned varint longer than 5 bytes")
        except IndexError:
            raise _error("truncated varint") from None

    def skip_tagged_fields(buf: Any, pos: int, _read: ReadUvarint = read_uvarint,
                           _error: Callable[[str], Exception] = error) -> int:
        count, pos = _read(buf, pos)
        for _ in range(count):
            _tag, pos = _read(buf, pos)
            size, pos = _read(buf, pos)
            pos += size
        if pos > len(buf):
            raise _error("tagged field runs past the end")
        return pos

    return read_uvarint, skip_tagged_fields


def encode_uvarint(n: int) -> bytes:
    """``n`` (>= 0) as an unsigned varint: seven bits a byte, low first, the high bit set on all but the last."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
