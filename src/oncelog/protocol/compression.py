"""Decompressing the records of a v2 batch (Kafka codecs 1-4).

The broker stores and serves batches as the producer sent them; it
decompresses one only to answer ListOffsets by timestamp inside a compressed
batch (Kafka's ``FileRecords.searchForTimestamp``). The protocol-level reader
in :mod:`oncelog.client.reader` decompresses what it fetches. Both use this
module.

gzip uses the standard library; snappy, lz4 and zstd use ``cramjam`` or the
``python-snappy`` / ``lz4`` / ``zstandard`` packages, whichever is
importable (they are optional: without one, that codec raises
:class:`~oncelog.protocol.records.InvalidRecordError` with
UNSUPPORTED_COMPRESSION_TYPE). Corrupt compressed data raises it with
CORRUPT_MESSAGE.
"""

from __future__ import annotations

import gzip
import importlib
import struct
from collections.abc import Callable
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
)

_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _with_library(codec: str, *choices: tuple[str, Callable[[Any], Any]]) -> bytes:
    """Run the call of the first importable module among ``choices`` (module name, call)."""
    for module, call in choices:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        return bytes(call(mod))
    names = " or ".join(m.split(".")[0] for m, _ in choices)
    raise InvalidRecordError(UNSUPPORTED_COMPRESSION_TYPE, f"{codec}-compressed batch: install {names}")


def _snappy_raw(data: bytes) -> bytes:
    return _with_library(
        "snappy", ("cramjam", lambda m: m.snappy.decompress_raw(data)), ("snappy", lambda m: m.uncompress(data))
    )


def _snappy(data: bytes) -> bytes:
    # Java clients write xerial-framed snappy (magic, version, compat, then length-prefixed blocks);
    # librdkafka writes raw snappy and reads both
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_raw(data)
    pos, out = 16, []
    while pos < len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out.append(_snappy_raw(data[pos : pos + n]))
        pos += n
    return b"".join(out)


def _lz4(data: bytes) -> bytes:
    return _with_library("lz4", ("lz4.frame", lambda m: m.decompress(data)), ("cramjam", lambda m: m.lz4.decompress(data)))


def _zstd(data: bytes) -> bytes:
    # zstandard: a streaming decompressor, as frames written without a content size are legal
    return _with_library(
        "zstd",
        ("zstandard", lambda m: m.ZstdDecompressor().decompressobj().decompress(data)),
        ("cramjam", lambda m: m.zstd.decompress(data)),
    )


_CODECS = {COMPRESSION_GZIP: gzip.decompress, COMPRESSION_SNAPPY: _snappy, COMPRESSION_LZ4: _lz4, COMPRESSION_ZSTD: _zstd}


def decompress(codec: int, data: bytes) -> bytes:
    """The records section of a batch compressed with Kafka codec ``codec``."""
    if codec == COMPRESSION_NONE:
        return data
    fn = _CODECS.get(codec)
    if fn is None:
        raise InvalidRecordError(UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression codec {codec}")
    try:
        return fn(data)
    except InvalidRecordError:
        raise
    except Exception as exc:  # each library has its own error types for bad input
        raise InvalidRecordError(CORRUPT_MESSAGE, f"cannot decompress codec {codec} data: {exc}") from None


def decompressed_batch(buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None) -> bytes:
    """The batch at ``buf[start:end]`` with its records decompressed and its codec bits
    cleared, ready for :func:`~oncelog.protocol.records.iter_records` (its CRC no longer
    matches). An uncompressed batch is returned as is."""
    hdr = parse_batch_header(buf, start)
    end = start + hdr.size if end is None else end
    if hdr.compression == COMPRESSION_NONE:
        return bytes(buf[start:end])
    body = decompress(hdr.compression, bytes(buf[start + HEADER_SIZE : end]))
    head = bytearray(buf[start : start + HEADER_SIZE])
    struct.pack_into(">h", head, ATTRIBUTES_OFFSET, hdr.attributes & ~COMPRESSION_MASK)
    struct.pack_into(">i", head, BATCH_LENGTH_OFFSET, HEADER_SIZE - LOG_OVERHEAD + len(body))
    return bytes(head) + body
