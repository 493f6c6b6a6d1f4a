"""Broker-side recompression: a topic's ``compression.type`` (Kafka's LogValidator).

With ``compression.type=producer`` (the default) the broker stores batches as
the producer sent them and never looks inside. With any other value, a batch
whose codec differs from the topic's is decompressed, its records checked,
and the same record bytes recompressed with the topic's codec (and level):
only the header's length, codec bits and CRC change. Producer id, epoch,
base sequence, timestamps, the transactional flag, the record count and every
record (offset and timestamp deltas, keys, values, headers) stay as sent, so
idempotence and transactions see the same batch.

This is the only place the append path decodes records, and it is off the
path of ``producer`` topics: the append path calls :func:`recompress` only
when the codecs differ. Decompression is :mod:`oncelog.protocol.compression`'s
(shared with ListOffsets by timestamp and the client reader); the codec
library (cramjam) is imported on first use.

Wire formats, as Kafka writes them: gzip (RFC 1952), snappy in the xerial
framing of snappy-java (raw snappy is read too), lz4 frames with independent
64 KiB blocks and no content size or checksum, zstd frames.
"""

from __future__ import annotations

import struct
from typing import Any

from oncelog.protocol.compression import compress, decompress
from oncelog.protocol.records import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_OFFSET,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_MASK,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    CORRUPT_MESSAGE,
    HEADER_SIZE,
    INVALID_RECORD,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidRecordError,
    iter_records,
    parse_batch_header,
    update_crc,
)

INVALID_TIMESTAMP = 32

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# --- batches --------------------------------------------------------------------------


def _with_body(batch: bytes | bytearray | memoryview, codec: int, body: bytes) -> bytearray:
    """The batch's header (attributes' codec bits set to ``codec``) + ``body``, with length and CRC fixed."""
    buf = bytearray(HEADER_SIZE + len(body))
    buf[:HEADER_SIZE] = memoryview(batch)[:HEADER_SIZE]
    buf[HEADER_SIZE:] = body
    _I32.pack_into(buf, BATCH_LENGTH_OFFSET, len(buf) - LOG_OVERHEAD)
    (attrs,) = _I16.unpack_from(buf, ATTRIBUTES_OFFSET)
    _I16.pack_into(buf, ATTRIBUTES_OFFSET, (attrs & ~COMPRESSION_MASK) | codec)
    update_crc(buf, 0)
    return buf


def recompress(batch: bytes, hdr: BatchHeader, codec: int, level: int | None = None) -> tuple[bytes, BatchHeader]:
    """Re-encode one validated v2 batch with ``codec``; returns the new batch and header.

    Raises :class:`InvalidRecordError`: CORRUPT_MESSAGE when the records do
    not decompress or parse, INVALID_RECORD when their count or offsets do not
    match the header (Kafka's inner-record checks).
    """
    body = memoryview(batch)[HEADER_SIZE : hdr.size]
    try:
        raw = decompress(hdr.compression, body)
    except Exception as exc:  # noqa: BLE001 - any codec failure is a corrupt batch
        raise InvalidRecordError(CORRUPT_MESSAGE, f"cannot decompress the record batch ({exc})") from None
    plain = _with_body(batch, COMPRESSION_NONE, raw)
    expected = 0
    for offset, _ts, _rec in iter_records(plain):
        if offset != expected:
            raise InvalidRecordError(INVALID_RECORD, f"record at position {expected} has offset delta {offset}, not {expected}")
        expected += 1
    if expected != hdr.records_count:
        raise InvalidRecordError(
            INVALID_RECORD, f"record batch holds {expected} records but its header says {hdr.records_count}"
        )
    out = plain if codec == COMPRESSION_NONE else _with_body(batch, codec, compress(codec, raw, level))
    return bytes(out), parse_batch_header(out)


def level_for(config: Any, codec: int) -> int | None:
    """The topic's compression level for ``codec`` (compression.gzip/lz4/zstd.level)."""
    if codec == COMPRESSION_GZIP:
        return config.compression_gzip_level
    if codec == COMPRESSION_LZ4:
        return config.compression_lz4_level
    if codec == COMPRESSION_ZSTD:
        return config.compression_zstd_level
    return None


def check_timestamps(batch: bytes, hdr: BatchHeader, now_ms: int, before_max_ms: int, after_max_ms: int) -> None:
    """Kafka's ``message.timestamp.before.max.ms`` / ``after.max.ms`` check (CreateTime topics).

    Every record's timestamp must lie within ``[now - before, now + after]``;
    otherwise INVALID_TIMESTAMP. Reads the records (decompressing if needed),
    so the append path calls it only when one of the two is set.
    """
    low, high = now_ms - before_max_ms, now_ms + after_max_ms
    body = memoryview(batch)[HEADER_SIZE : hdr.size]
    try:
        plain = batch if hdr.compression == COMPRESSION_NONE else _with_body(batch, COMPRESSION_NONE, decompress(hdr.compression, body))
    except Exception as exc:  # noqa: BLE001
        raise InvalidRecordError(CORRUPT_MESSAGE, f"cannot decompress the record batch ({exc})") from None
    for offset, ts, _rec in iter_records(plain):
        if not low <= ts <= high:
            raise InvalidRecordError(
                INVALID_TIMESTAMP,
                f"Timestamp {ts} of message with offset {offset} is out of range. "
                f"The timestamp should be within [{low}, {high}]",
            )


def keyless_record_indexes(batch: bytes, hdr: BatchHeader) -> list[int]:
    """Positions (within the batch) of the records that have no key: a compacted topic
    refuses them (Kafka's LogValidator ``validateKey``). Decompresses the batch, so the
    append path calls it only for compacted topics."""
    body = memoryview(batch)[HEADER_SIZE : hdr.size]
    try:
        plain = batch if hdr.compression == COMPRESSION_NONE else _with_body(batch, COMPRESSION_NONE, decompress(hdr.compression, body))
        return [i for i, (_off, _ts, rec) in enumerate(iter_records(plain)) if rec.key is None]
    except InvalidRecordError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise InvalidRecordError(CORRUPT_MESSAGE, f"cannot decompress the record batch ({exc})") from None
