"""Decompressing the records of a v2 batch (Kafka codecs 1-4).

The broker stores and serves batches as the producer sent them; it
decompresses one to answer ListOffsets by timestamp inside a compressed batch
(Kafka's ``FileRecords.searchForTimestamp``) and to recompress or check the
records of topics that ask for it (:mod:`oncelog.broker.recompress`). The
protocol-level reader in :mod:`oncelog.client.reader` decompresses what it
fetches. All of them use this module.

The codecs come from ``cramjam`` (a dependency), imported on first use.
Wire formats read: gzip (RFC 1952), snappy raw or in the xerial framing of
snappy-java, lz4 frames, zstd frames (with or without a content size).
Unknown codecs raise :class:`~oncelog.protocol.records.InvalidRecordError`
with UNSUPPORTED_COMPRESSION_TYPE, corrupt data with CORRUPT_MESSAGE.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from oncelog.protocol.records import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_OFFSET,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_MASK,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CORRUPT_MESSAGE,
    HEADER_SIZE,
    LOG_OVERHEAD,
    UNSUPPORTED_COMPRESSION_TYPE,
    InvalidRecordError,
    parse_batch_header,
    update_crc,
)

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER_SIZE = 16  # magic, version, compatible version
_BE32 = struct.Struct(">i")

_cramjam: Any = None


def codec_library() -> Any:
    """The ``cramjam`` module, imported on first use."""
    global _cramjam
    if _cramjam is None:
        try:
            import cramjam
        except ImportError:
            raise InvalidRecordError(UNSUPPORTED_COMPRESSION_TYPE, "compressed batch: install cramjam") from None
        _cramjam = cramjam
    return _cramjam


def _snappy(cj: Any, data: bytes) -> bytes:
    # Java clients write xerial-framed snappy (magic, version, compat, then length-prefixed blocks);
    # librdkafka writes raw snappy and reads both
    if not data.startswith(XERIAL_MAGIC):
        return bytes(cj.snappy.decompress_raw(data))
    out = bytearray()
    for block in _xerial_blocks(data):
        out += bytes(cj.snappy.decompress_raw(block))
    return bytes(out)


def _xerial_blocks(data: bytes | bytearray | memoryview) -> Iterator[memoryview]:
    """The snappy blocks of a xerial frame (after its header, each prefixed by its big-endian length);
    ValueError on a truncated one."""
    view, pos = memoryview(data), XERIAL_HEADER_SIZE
    while pos < len(view):
        (n,) = _BE32.unpack_from(view, pos)
        pos += 4
        if n < 0 or pos + n > len(view):
            raise ValueError("truncated xerial snappy block")
        yield view[pos:pos + n]
        pos += n


_CODECS = {
    COMPRESSION_GZIP: lambda cj, d: bytes(cj.gzip.decompress(d)),
    COMPRESSION_SNAPPY: _snappy,
    COMPRESSION_LZ4: lambda cj, d: bytes(cj.lz4.decompress(d)),
    COMPRESSION_ZSTD: lambda cj, d: bytes(cj.zstd.decompress(d)),
}


def decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """The records section of a batch compressed with Kafka codec ``codec``."""
    data = bytes(data)
    if codec == COMPRESSION_NONE:
        return data
    fn = _CODECS.get(codec)
    if fn is None:
        raise InvalidRecordError(UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression codec {codec}")
    cj = codec_library()
    try:
        return fn(cj, data)
    except Exception as exc:  # cramjam's decompression errors, a bad xerial frame
        raise InvalidRecordError(CORRUPT_MESSAGE, f"cannot decompress codec {codec} data: {exc}") from None


def decompress_buffer(codec: int, data: bytes | bytearray | memoryview) -> Any:
    """:func:`decompress` without the final copy into ``bytes``: a buffer (cramjam's, or
    ``bytes``) for a caller that copies it anyway (the consumer joins a Fetch answer's
    decompressed batches into one ``bytes``)."""
    if codec == COMPRESSION_LZ4:
        try:
            return codec_library().lz4.decompress(data)
        except InvalidRecordError:
            raise
        except Exception as exc:
            raise InvalidRecordError(CORRUPT_MESSAGE, f"cannot decompress codec {codec} data: {exc}") from None
    if codec == COMPRESSION_ZSTD or codec == COMPRESSION_GZIP:
        try:
            cj = codec_library()
            return (cj.zstd if codec == COMPRESSION_ZSTD else cj.gzip).decompress(data)
        except InvalidRecordError:
            raise
        except Exception as exc:
            raise InvalidRecordError(CORRUPT_MESSAGE, f"cannot decompress codec {codec} data: {exc}") from None
    return decompress(codec, data)


def size_hint(codec: int, data: bytes | bytearray | memoryview) -> int | None:
    """The decompressed size of a batch's records section when its format says it cheaply: gzip's
    trailer (ISIZE, the last member's size modulo 2**32), raw snappy's leading varint; else None
    (Kafka's lz4 and zstd frames, xerial snappy)."""
    if codec == COMPRESSION_GZIP and len(data) >= 18:
        n = int.from_bytes(data[len(data) - 4:], "little")
        return n if n <= 1032 * len(data) else None  # deflate expands 1032:1 at most: damage
    if codec == COMPRESSION_SNAPPY and bytes(data[:len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        n = shift = 0
        for i in range(min(5, len(data))):
            n |= (data[i] & 0x7F) << shift
            if data[i] < 0x80:
                return n if n <= 64 * len(data) else None  # snappy expands about 21:1 at most
            shift += 7
    return None


def decompress_into(codec: int, data: bytes | bytearray | memoryview, out: memoryview) -> int:
    """The records section of a batch compressed with ``codec`` decompressed into ``out`` (a writable
    view, e.g. the rest of a reused buffer); the number of bytes written, or -1 when ``out`` is too
    small or the data does not decompress (the caller then uses :func:`decompress_buffer`, which
    raises the precise error). Only raw snappy's size is checked first (xerial's per block);
    for the others cramjam refuses an output that is too small (it does not truncate), after
    decompressing into it as far as it goes. (Kafka's Java producer writes lz4 and zstd frames
    without a content size; gzip's ISIZE and raw snappy's length serve as :func:`size_hint`.)"""
    try:
        if codec == COMPRESSION_LZ4:
            return codec_library().lz4.decompress_into(data, out)
        if codec == COMPRESSION_ZSTD:
            return codec_library().zstd.decompress_into(data, out)
        if codec == COMPRESSION_GZIP:
            return codec_library().gzip.decompress_into(data, out)
        if codec == COMPRESSION_SNAPPY:
            snappy = codec_library().snappy
            if bytes(data[:len(XERIAL_MAGIC)]) != XERIAL_MAGIC:  # raw: the size is its first varint
                n = snappy.decompress_raw_len(data)
                return snappy.decompress_raw_into(data, out) if n <= len(out) else -1
            at = 0
            for block in _xerial_blocks(data):  # a truncated block: ValueError, -1 below
                n = snappy.decompress_raw_len(block)
                if at + n > len(out):
                    return -1
                at += snappy.decompress_raw_into(block, out[at:])
            return at
    except Exception:  # cramjam's errors: too small an output, or damage (told apart by decompress_buffer)
        return -1
    return -1  # no codec, or an unknown one


def decompressed_batch(buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None) -> bytes:
    """The batch at ``buf[start:end]`` with its records decompressed and its codec bits
    cleared, ready for :func:`~oncelog.protocol.records.iter_records` (its CRC no longer
    matches). An uncompressed batch is returned as is."""
    hdr = parse_batch_header(buf, start)
    end = start + hdr.size if end is None else end
    if hdr.compression == COMPRESSION_NONE:
        return bytes(buf[start:end])
    body = decompress(hdr.compression, buf[start + HEADER_SIZE : end])
    head = bytearray(buf[start : start + HEADER_SIZE])
    struct.pack_into(">h", head, ATTRIBUTES_OFFSET, hdr.attributes & ~COMPRESSION_MASK)
    struct.pack_into(">i", head, BATCH_LENGTH_OFFSET, HEADER_SIZE - LOG_OVERHEAD + len(body))
    return bytes(head) + body


def compressed_batch(raw: bytes | bytearray | memoryview, codec: int, body: bytes | None = None) -> bytes:
    """The inverse of :func:`decompressed_batch`: the uncompressed batch ``raw`` with its records
    section replaced by ``body`` (default: that section compressed by :func:`compress`), the codec bits
    set to ``codec``, the length and CRC fixed."""
    if body is None:
        body = compress(codec, bytes(memoryview(raw)[HEADER_SIZE:]))
    out = bytearray(memoryview(raw)[:HEADER_SIZE]) + body
    (attrs,) = struct.unpack_from(">h", out, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, (attrs & ~COMPRESSION_MASK) | codec)
    struct.pack_into(">i", out, BATCH_LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
    update_crc(out)
    return bytes(out)


_LE32 = struct.Struct("<I")
_XERIAL_HEADER = XERIAL_MAGIC + _BE32.pack(1) + _BE32.pack(1)  # version 1, compatible with 1
_XERIAL_BLOCK = 32 * 1024
# LZ4 frame: magic, FLG (version 01, independent blocks), BD (64 KiB blocks), header checksum
_LZ4_HEADER = b"\x04\x22\x4d\x18\x60\x40\x82"
_LZ4_BLOCK = 64 * 1024

def compress(codec: int, data: bytes, level: int | None = None) -> bytes:
    """``data`` compressed with Kafka codec ``codec`` in the wire format Kafka writes
    (``level`` None: the codec's default). Used by recompression and the log cleaner."""
    cj = codec_library()
    if codec == COMPRESSION_NONE:
        return data
    if codec == COMPRESSION_GZIP:
        return bytes(cj.gzip.compress(data, level=None if level is None or level < 0 else level))
    if codec == COMPRESSION_SNAPPY:
        out = bytearray(_XERIAL_HEADER)
        for i in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cj.snappy.compress_raw(data[i : i + _XERIAL_BLOCK]))
            out += _BE32.pack(len(block)) + block
        return bytes(out)
    if codec == COMPRESSION_LZ4:
        out = bytearray(_LZ4_HEADER)
        # Kafka: level 1 is LZ4's fast compressor, higher levels the high-compression one
        hc = {"mode": "high_compression", "compression": level} if level is not None and level > 1 else {}
        for i in range(0, len(data), _LZ4_BLOCK):
            chunk = data[i : i + _LZ4_BLOCK]
            block = bytes(cj.lz4.compress_block(chunk, store_size=False, **hc))
            if len(block) >= len(chunk):  # incompressible: stored as is (high bit of the size)
                out += _LE32.pack(len(chunk) | 0x80000000) + chunk
            else:
                out += _LE32.pack(len(block)) + block
        out += b"\x00\x00\x00\x00"  # end mark
        return bytes(out)
    if codec == COMPRESSION_ZSTD:
        return bytes(cj.zstd.compress(data, level=level))
    raise ValueError(f"unknown codec {codec}")
