"""Kafka record batch (magic v2) header handling.

The broker treats batches as opaque bytes: it parses the fixed 61-byte header,
checks the CRC32C and patches a few header fields.  Record encoding/decoding
helpers at the bottom of this module are for tests and control markers only.

Batch layout (big-endian)::

    baseOffset i64 @0 | batchLength i32 @8 | partitionLeaderEpoch i32 @12
    magic i8 @16 | crc u32 @17 | attributes i16 @21 | lastOffsetDelta i32 @23
    baseTimestamp i64 @27 | maxTimestamp i64 @35 | producerId i64 @43
    producerEpoch i16 @51 | baseSequence i32 @53 | recordsCount i32 @57
    records...

``batchLength`` counts the bytes after itself, so a batch occupies
``12 + batchLength`` bytes.  The CRC covers everything from ``attributes``
to the end of the batch.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from crc32c import crc32c

# --- layout -----------------------------------------------------------------

BASE_OFFSET_OFFSET = 0
BATCH_LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57
RECORDS_OFFSET = 61

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # smallest legal batchLength (49)
CRC_START = ATTRIBUTES_OFFSET
MAGIC_V2 = 2

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")

# --- attributes ---------------------------------------------------------------

COMPRESSION_MASK = 0x07
COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
MAX_COMPRESSION_CODEC = COMPRESSION_ZSTD
TIMESTAMP_TYPE_BIT = 0x08  # set = LogAppendTime
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1
NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

# --- Kafka error codes used here ------------------------------------------------

CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
RECORD_LIST_TOO_LARGE = 18
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87

# Control record types (key: version i16, type i16).
CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1


class InvalidRecordError(Exception):
    """A record batch failed validation; ``error_code`` is the Kafka error code."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


@dataclass(slots=True)
class BatchHeader:
    """The fixed 61-byte header of a v2 record batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size(self) -> int:
        """Total bytes the batch occupies, including offset and length fields."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 = CreateTime, 1 = LogAppendTime."""
        return 1 if self.attributes & TIMESTAMP_TYPE_BIT else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping at 2**31 like Kafka (-1 if none)."""
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % 0x80000000


_Buffer = bytes | bytearray | memoryview


def parse_batch_header(buf: _Buffer, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos``; raises CORRUPT_MESSAGE if fewer than 61 bytes remain."""
    try:
        return BatchHeader(*_HEADER.unpack_from(buf, pos))
    except struct.error:
        raise InvalidRecordError(
            CORRUPT_MESSAGE,
            f"record batch header truncated: {len(buf) - pos} bytes available, {HEADER_SIZE} needed",
        ) from None


def compute_crc(buf: _Buffer, pos: int = 0, end: int | None = None) -> int:
    """CRC32C of a batch's checksummed region (attributes .. end of batch)."""
    if end is None:
        end = pos + LOG_OVERHEAD + _I32.unpack_from(buf, pos + BATCH_LENGTH_OFFSET)[0]
    return crc32c(memoryview(buf)[pos + CRC_START : end])


def update_crc(buf: bytearray | memoryview, pos: int = 0) -> int:
    """Recompute and store the CRC of the batch at ``pos``; returns it."""
    crc = compute_crc(buf, pos)
    _U32.pack_into(buf, pos + CRC_OFFSET, crc)
    return crc


def validate_produce_records(
    records: _Buffer, max_message_bytes: int, segment_bytes: int | None = None
) -> list[BatchHeader]:
    """Check a Produce v3+ partition payload as Kafka does; never decodes records.

    ``segment_bytes``, if given, rejects a batch that could never fit in a
    segment (RECORD_LIST_TOO_LARGE).  Raises :class:`InvalidRecordError` with
    the Kafka error code on failure.
    """
    n = len(records)
    if n == 0:
        raise InvalidRecordError(
            INVALID_RECORD, "Produce requests with version 3+ must contain exactly one record batch (got none)"
        )
    if n < MAGIC_OFFSET + 1:
        raise InvalidRecordError(CORRUPT_MESSAGE, f"record batch truncated: only {n} bytes")
    magic = records[MAGIC_OFFSET]
    if magic > 127:
        magic -= 256
    if magic != MAGIC_V2:
        raise InvalidRecordError(
            INVALID_RECORD, f"record batch magic {magic} is not supported; Produce v3+ requires magic 2"
        )
    hdr = parse_batch_header(records, 0)
    if hdr.batch_length < MIN_BATCH_LENGTH:
        raise InvalidRecordError(
            CORRUPT_MESSAGE, f"record batch length {hdr.batch_length} is smaller than the minimum {MIN_BATCH_LENGTH}"
        )
    size = hdr.size
    if size > n:
        raise InvalidRecordError(
            CORRUPT_MESSAGE, f"record batch truncated: header declares {size} bytes but only {n} were sent"
        )
    if size > max_message_bytes:
        raise InvalidRecordError(
            MESSAGE_TOO_LARGE, f"record batch of {size} bytes exceeds the maximum of {max_message_bytes} bytes"
        )
    if segment_bytes is not None and size > segment_bytes:
        raise InvalidRecordError(
            RECORD_LIST_TOO_LARGE, f"record batch of {size} bytes is larger than the segment size {segment_bytes}"
        )
    actual_crc = crc32c(memoryview(records)[CRC_START:size])
    if actual_crc != hdr.crc:
        raise InvalidRecordError(
            CORRUPT_MESSAGE, f"record batch CRC mismatch: stored {hdr.crc:#010x}, computed {actual_crc:#010x}"
        )
    # after the CRC check, as in Kafka: a batchLength smaller than the bytes sent
    # fails the CRC (CORRUPT_MESSAGE); only a sound first batch followed by more
    # bytes is the "more than one batch" error
    if size < n:
        raise InvalidRecordError(
            INVALID_RECORD,
            "Produce requests with version 3+ are only allowed to contain exactly one record batch "
            f"({n - size} bytes follow the first batch)",
        )
    if hdr.compression > MAX_COMPRESSION_CODEC:
        raise InvalidRecordError(UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression codec {hdr.compression}")
    if hdr.is_control:
        raise InvalidRecordError(INVALID_RECORD, "clients may not produce control batches")
    if hdr.base_offset != 0:
        raise InvalidRecordError(INVALID_RECORD, f"record batch baseOffset must be 0, got {hdr.base_offset}")
    if hdr.last_offset_delta < 0:
        raise InvalidRecordError(INVALID_RECORD, f"record batch lastOffsetDelta {hdr.last_offset_delta} is negative")
    if hdr.records_count != hdr.last_offset_delta + 1:
        raise InvalidRecordError(
            INVALID_RECORD,
            f"record batch recordsCount {hdr.records_count} does not match lastOffsetDelta {hdr.last_offset_delta}",
        )
    if hdr.producer_id >= 0 and hdr.base_sequence < 0:
        raise InvalidRecordError(
            INVALID_RECORD, f"invalid sequence {hdr.base_sequence} in a batch with producerId {hdr.producer_id}"
        )
    if hdr.is_transactional and hdr.producer_id < 0:
        raise InvalidRecordError(INVALID_RECORD, "transactional record batch without a producerId")
    return [hdr]


def iter_batch_headers(buf: _Buffer, pos: int = 0) -> Iterator[tuple[BatchHeader, int, int]]:
    """Yield ``(header, start, end)`` for each complete batch; stops at an incomplete tail.

    Does not check CRCs; stops at a header whose length field is impossible.
    """
    n = len(buf)
    unpack = _HEADER.unpack_from
    while pos + HEADER_SIZE <= n:
        hdr = BatchHeader(*unpack(buf, pos))
        if hdr.batch_length < MIN_BATCH_LENGTH:
            return
        end = pos + LOG_OVERHEAD + hdr.batch_length
        if end > n:
            return
        yield hdr, pos, end
        pos = end


def patch_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Overwrite the batch's baseOffset (not covered by the CRC)."""
    _I64.pack_into(buf, pos + BASE_OFFSET_OFFSET, base_offset)


def patch_log_append_time(buf: bytearray | memoryview, pos: int, ts_ms: int) -> None:
    """Mark the batch LogAppendTime with ``ts_ms`` as maxTimestamp and fix its CRC."""
    (attrs,) = _I16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    _I16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attrs | TIMESTAMP_TYPE_BIT)
    _I64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, ts_ms)
    update_crc(buf, pos)


def log_append_time_header(batch: _Buffer, base_offset: int, ts_ms: int, leader_epoch: int | None = None) -> bytes:
    """Patched 61-byte header for ``batch`` with base offset and LogAppendTime applied
    (and the partition leader epoch, when given: it is outside the CRC).

    The CRC covers the unchanged record bytes after the header too, so callers can
    write ``header + batch[61:]`` without copying the records.
    """
    hdr = bytearray(memoryview(batch)[:HEADER_SIZE])
    patch_base_offset(hdr, 0, base_offset)
    if leader_epoch is not None:
        _I32.pack_into(hdr, PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)
    (attrs,) = _I16.unpack_from(hdr, ATTRIBUTES_OFFSET)
    _I16.pack_into(hdr, ATTRIBUTES_OFFSET, attrs | TIMESTAMP_TYPE_BIT)
    _I64.pack_into(hdr, MAX_TIMESTAMP_OFFSET, ts_ms)
    crc = crc32c(memoryview(batch)[HEADER_SIZE:], crc32c(memoryview(hdr)[CRC_START:]))
    _U32.pack_into(hdr, CRC_OFFSET, crc)
    return bytes(hdr)


# --- record encoding (tests and control markers; not the hot path) -------------


@dataclass
class Record:
    """One record inside a batch, as used by the encode/decode helpers."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp_delta: int = 0


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _write_varint(out: bytearray, n: int) -> None:
    v = _zigzag(n) & 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_varint(buf: _Buffer, pos: int) -> tuple[int, int]:
    shift = 0
    v = 0
    while True:
        if pos >= len(buf):
            raise InvalidRecordError(CORRUPT_MESSAGE, "varint runs past the end of the batch")
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise InvalidRecordError(CORRUPT_MESSAGE, "varint too long")
    return (v >> 1) ^ -(v & 1), pos


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(data))
        out += data


def _read_bytes(buf: _Buffer, pos: int) -> tuple[bytes | None, int]:
    n, pos = _read_varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > len(buf):
        raise InvalidRecordError(CORRUPT_MESSAGE, "record field runs past the end of the batch")
    return bytes(buf[pos : pos + n]), pos + n


def _encode_record(rec: Record, offset_delta: int) -> bytes:
    body = bytearray(b"\x00")  # attributes (unused)
    _write_varint(body, rec.timestamp_delta)
    _write_varint(body, offset_delta)
    _write_bytes(body, rec.key)
    _write_bytes(body, rec.value)
    _write_varint(body, len(rec.headers))
    for hkey, hval in rec.headers:
        _write_bytes(body, hkey.encode())
        _write_bytes(body, hval)
    out = bytearray()
    _write_varint(out, len(body))
    return bytes(out + body)


def encode_record_batch(
    records: list[Record],
    *,
    base_offset: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    base_timestamp: int | None = None,
    partition_leader_epoch: int = 0,
) -> bytes:
    """Encode an uncompressed v2 batch (CreateTime) holding ``records``."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    if base_timestamp is None:
        base_timestamp = int(time.time() * 1000)
    body = b"".join(_encode_record(r, i) for i, r in enumerate(records))
    attributes = (TRANSACTIONAL_BIT if is_transactional else 0) | (CONTROL_BIT if is_control else 0)
    max_ts = base_timestamp + max(r.timestamp_delta for r in records)
    buf = bytearray(HEADER_SIZE + len(body))
    _HEADER.pack_into(
        buf, 0, base_offset, HEADER_SIZE - LOG_OVERHEAD + len(body), partition_leader_epoch, MAGIC_V2, 0,
        attributes, len(records) - 1, base_timestamp, max_ts, producer_id, producer_epoch, base_sequence,
        len(records),
    )  # fmt: skip
    buf[HEADER_SIZE:] = body
    update_crc(buf, 0)
    return bytes(buf)


def iter_records(batch: _Buffer, pos: int = 0) -> Iterator[tuple[int, int, Record]]:
    """Yield ``(offset, timestamp, record)`` for an uncompressed batch at ``pos``."""
    hdr = parse_batch_header(batch, pos)
    if hdr.compression != COMPRESSION_NONE:
        raise InvalidRecordError(
            UNSUPPORTED_COMPRESSION_TYPE, f"cannot decode compressed batch (codec {hdr.compression})"
        )
    end = pos + hdr.size
    if end > len(batch):
        raise InvalidRecordError(CORRUPT_MESSAGE, "record batch truncated")
    view = memoryview(batch)[:end]
    p = pos + RECORDS_OFFSET
    log_append = hdr.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    for _ in range(hdr.records_count):
        length, p = _read_varint(view, p)
        rec_end = p + length
        if length < 0 or rec_end > end:
            raise InvalidRecordError(CORRUPT_MESSAGE, "record runs past the end of the batch")
        p += 1  # attributes
        ts_delta, p = _read_varint(view, p)
        offset_delta, p = _read_varint(view, p)
        key, p = _read_bytes(view, p)
        value, p = _read_bytes(view, p)
        n_headers, p = _read_varint(view, p)
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(n_headers):
            hkey, p = _read_bytes(view, p)
            hval, p = _read_bytes(view, p)
            headers.append(((hkey or b"").decode(), hval))
        if p != rec_end:
            raise InvalidRecordError(CORRUPT_MESSAGE, "record length does not match its contents")
        ts = hdr.max_timestamp if log_append else hdr.base_timestamp + ts_delta
        yield hdr.base_offset + offset_delta, ts, Record(key, value, headers, ts_delta)
    if p != end:
        raise InvalidRecordError(CORRUPT_MESSAGE, "trailing bytes after the last record")


def decode_records(batch: _Buffer) -> list[Record]:
    """Decode all records of one uncompressed batch."""
    return [rec for _off, _ts, rec in iter_records(batch)]


def encode_control_batch(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    base_offset: int = 0,
    timestamp_ms: int | None = None,
) -> bytes:
    """Encode a transaction marker (COMMIT or ABORT) control batch with one record."""
    key = struct.pack(">hh", 0, CONTROL_TYPE_COMMIT if commit else CONTROL_TYPE_ABORT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    return encode_record_batch(
        [Record(key, value)],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
        base_timestamp=timestamp_ms,
    )


@dataclass(slots=True)
class ControlMarker:
    """Decoded transaction marker."""

    commit: bool
    coordinator_epoch: int


def read_control_marker(batch: _Buffer, pos: int = 0) -> ControlMarker:
    """Decode the marker held by the control batch at ``pos`` (uncompressed)."""
    for _off, _ts, rec in iter_records(batch, pos):
        if rec.key is None or len(rec.key) < 4:
            raise InvalidRecordError(CORRUPT_MESSAGE, "control record key too short")
        _version, ctype = struct.unpack_from(">hh", rec.key)
        epoch = -1
        if rec.value is not None and len(rec.value) >= 6:
            _v, epoch = struct.unpack_from(">hi", rec.value)
        return ControlMarker(ctype == CONTROL_TYPE_COMMIT, epoch)
    raise InvalidRecordError(CORRUPT_MESSAGE, "control batch holds no record")


@dataclass(slots=True)
class RecordColumns:
    """The records of one batch as columns (see :func:`decode_columns`)."""

    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[tuple[str, bytes | None]]] | None  # None unless asked for


def decode_columns(batch: bytes, pos: int = 0, with_headers: bool = True) -> RecordColumns:
    """Decode an uncompressed batch at ``pos`` straight into columns (no per-record objects).

    The same fields and checks as :func:`iter_records`, about twice as fast
    (:func:`decode_section`: one- and two-byte varints, the common case, are read
    inline). Used by readers that hand records on in bulk (the Spark source builds
    Arrow arrays from these). ``headers`` holds a list per record (empty if none).
    """
    hdr = parse_batch_header(batch, pos)
    if hdr.compression != COMPRESSION_NONE:
        raise InvalidRecordError(
            UNSUPPORTED_COMPRESSION_TYPE, f"cannot decode compressed batch (codec {hdr.compression})"
        )
    end = pos + hdr.size
    if end > len(batch):
        raise InvalidRecordError(CORRUPT_MESSAGE, "record batch truncated")
    buf = bytes(batch) if not isinstance(batch, bytes) else batch
    offsets: list[int] = []
    stamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    hcol: list[list[tuple[str, bytes | None]] | None] = []
    decode_section(buf, pos + RECORDS_OFFSET, end, hdr, offsets, stamps, keys, values, hcol)
    headers = [h if h is not None else [] for h in hcol] if with_headers else None
    return RecordColumns(offsets, stamps, keys, values, headers)


def _bad(message: str) -> InvalidRecordError:
    return InvalidRecordError(CORRUPT_MESSAGE, message)


def decode_section(
    buf: bytes,
    p: int,
    end: int,
    hdr: BatchHeader,
    offsets: list[int],
    stamps: list[int],
    keys: list[bytes | None],
    values: list[bytes | None],
    headers: list[list[tuple[str, bytes | None]] | None],
) -> None:
    """Decode the ``hdr.records_count`` records of the uncompressed records section
    ``buf[p:end]`` (``buf`` must be ``bytes``: values and keys are slices of it),
    appending each record's offset, timestamp, key, value and headers to the lists;
    a record without headers gets ``None`` in ``headers`` (no list per record: the
    consumer's :class:`Message` makes the empty list when it is asked for).

    The same fields and checks as :func:`iter_records`: a record's length must match
    its fields exactly and the records must fill the section; raises
    :class:`InvalidRecordError` (CORRUPT_MESSAGE) otherwise. The common shapes (one-
    or two-byte varints, a null or short key, no headers) are read inline; anything
    else goes through the general varint reader.
    """
    base_offset = hdr.base_offset
    base_ts = hdr.base_timestamp
    log_append = hdr.attributes & TIMESTAMP_TYPE_BIT
    fixed_ts = hdr.max_timestamp
    oapp = offsets.append
    sapp = stamps.append
    kapp = keys.append
    vapp = values.append
    happ = headers.append
    read_varint = _read_varint
    try:
        for _ in range(hdr.records_count):
            # length (zigzag: an odd unsigned value is negative), then skip the attributes byte
            b = buf[p]
            if b < 0x80:
                if b & 1:
                    raise _bad("record runs past the end of the batch")
                rec_end = p + 1 + (b >> 1)
                p += 2
            else:
                c = buf[p + 1]
                if c < 0x80:
                    if b & 1:
                        raise _bad("record runs past the end of the batch")
                    rec_end = p + 2 + (((b & 0x7F) | (c << 7)) >> 1)
                    p += 3
                else:
                    n, p = read_varint(buf, p)
                    if n < 0:
                        raise _bad("record runs past the end of the batch")
                    rec_end = p + n
                    p += 1
            if rec_end > end:
                raise _bad("record runs past the end of the batch")
            # timestampDelta
            b = buf[p]
            if b < 0x80:
                ts = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                ts, p = read_varint(buf, p)
            sapp(fixed_ts if log_append else base_ts + ts)
            # offsetDelta
            b = buf[p]
            if b < 0x80:
                oapp(base_offset + ((b >> 1) ^ -(b & 1)))
                p += 1
            else:
                c = buf[p + 1]
                if c < 0x80:
                    u = (b & 0x7F) | (c << 7)
                    oapp(base_offset + ((u >> 1) ^ -(u & 1)))
                    p += 2
                else:
                    n, p = read_varint(buf, p)
                    oapp(base_offset + n)
            # key: mostly null (varint -1 = 0x01) or short
            b = buf[p]
            if b == 1:
                kapp(None)
                p += 1
            elif b < 0x80 and not b & 1:
                p += 1
                n = p + (b >> 1)
                kapp(buf[p:n])
                p = n
            else:
                n, p = read_varint(buf, p)
                if n < 0:
                    kapp(None)
                else:
                    kapp(buf[p : p + n])
                    p += n
            # value
            b = buf[p]
            if b < 0x80:
                if b & 1:  # a negative length: null
                    vapp(None)
                    p += 1
                else:
                    p += 1
                    n = p + (b >> 1)
                    vapp(buf[p:n])
                    p = n
            else:
                c = buf[p + 1]
                if c < 0x80 and not b & 1:
                    p += 2
                    n = p + (((b & 0x7F) | (c << 7)) >> 1)
                    vapp(buf[p:n])
                    p = n
                else:
                    n, p = read_varint(buf, p)
                    if n < 0:
                        vapp(None)
                    else:
                        vapp(buf[p : p + n])
                        p += n
            # headers: mostly none (a zero count, the record's last byte)
            if p + 1 == rec_end and buf[p] == 0:
                happ(None)
                p = rec_end
                continue
            if p >= rec_end:
                raise _bad("record field runs past the end of the batch")
            n, p = read_varint(buf, p)
            if n < 0:  # as Kafka's DefaultRecord
                raise _bad(f"invalid number of record headers {n}")
            hs: list[tuple[str, bytes | None]] = []
            for _h in range(n):
                hkey, p = _read_bytes(buf, p)
                hval, p = _read_bytes(buf, p)
                hs.append(((hkey or b"").decode(), hval))
            if p != rec_end:
                raise _bad("record length does not match its contents")
            happ(hs if n else None)
    except IndexError:
        raise _bad("varint runs past the end of the batch") from None
    except UnicodeDecodeError:
        raise _bad("header key is not UTF-8") from None
    if p != end:
        raise _bad("trailing bytes after the last record")


# --- the vectorised decoder (numpy, optional) ------------------------------------------

try:  # an optional fast path: without numpy, callers decode batch by batch with decode_section
    import numpy as _np
except ImportError:  # pragma: no cover - exercised by the tests with HAVE_NUMPY patched off
    _np = None  # type: ignore[assignment]

HAVE_NUMPY = _np is not None


def _np_varints(arr: Any, pos: Any) -> tuple[Any, Any]:
    """The zigzag varints at byte positions ``pos`` (an int64 array) of ``arr`` (uint8):
    ``(values as int64, positions after them)``; IndexError past the end; ValueError for
    a varint longer than 10 bytes."""
    np = _np
    b = arr[pos]
    c0 = b >> 7
    if not c0.any():  # all one byte: the common case
        v = b.astype(np.int64)
        return (v >> 1) ^ -(v & 1), pos + 1
    c0 = c0.astype(np.int64)
    b1 = arr[pos + c0]  # the second byte where there is one (else the first again: never past the end)
    if not ((b1 >> 7) & c0).any():  # at most two bytes: no per-byte loop
        u = (b & 0x7F).astype(np.int64) | ((b1 & 0x7F).astype(np.int64) << 7) * c0
        return (u >> 1) ^ -(u & 1), pos + 1 + c0
    u = (b & 0x7F).astype(np.uint64)
    width = np.ones(len(pos), np.int64)
    active = np.flatnonzero(b & 0x80)
    shift = 7
    while len(active):
        if shift > 56:  # more than 63 bits: left to the exact Python reader
            raise ValueError("varint too long for the vectorised path")
        nb = arr[pos[active] + width[active]]
        u[active] |= (nb & 0x7F).astype(np.uint64) << np.uint64(shift)
        width[active] += 1
        active = active[(nb & 0x80) != 0]
        shift += 7
    v = ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(np.int64)
    return v, pos + width


def _record_end(buf: bytes, p: int) -> int:
    """Where the record whose length varint is at ``p`` ends (``p + 1`` when its length takes more than
    three bytes: :func:`decode_spans` declines such records anyway)."""
    b = buf[p]
    if b < 0x80:
        return p + 1 + (b >> 1)
    if buf[p + 1] < 0x80:
        return p + 2 + (((b & 0x7F) | (buf[p + 1] << 7)) >> 1)
    if buf[p + 2] < 0x80:
        return p + 3 + (((b & 0x7F) | ((buf[p + 1] & 0x7F) << 7) | (buf[p + 2] << 14)) >> 1)
    return p + 1


# the offset deltas from which a record's offsetDelta varint takes 1, 2, 3 bytes (zigzag)
_DELTA_WIDTHS = ((0, 1), (64, 2), (8192, 3), (1 << 20, 4))


def _equal_size_starts(p: int, end: int, size: int, count: int) -> list[int] | None:
    """Where the ``count`` records of the section ``[p, end)`` begin if they are all the size of the
    first (``size``, its offset delta 0) but for their offset deltas 0, 1, 2 ... written as varints of
    1 to 4 bytes (fixed-size records as a producer writes them); None if their sizes would not add up
    to the section's. A guess for the caller to check."""
    if size < 2:
        return None
    bands: list[tuple[int, int, int]] = []
    q = p
    for k, (lo, width) in enumerate(_DELTA_WIDTHS):
        if count <= lo:
            break
        hi = _DELTA_WIDTHS[k + 1][0] if k + 1 < len(_DELTA_WIDTHS) else count
        step = size - 1 + width
        stop = q + (min(count, hi) - lo) * step
        bands.append((q, stop, step))
        q = stop
    # the guessed end is checked before any start is listed: a header claiming more records than its
    # section can hold (damage, or a hostile broker) costs nothing (review F4: it listed them all first)
    if q != end:
        return None
    out: list[int] = []
    for a, b, step in bands:
        out += range(a, b, step)
    return out if len(out) == count else None


def decode_spans(buf: bytes, spans: list[tuple[int, int, BatchHeader]], guess: bool = True
                 ) -> tuple[list[int], list[int], list[bytes | None], list[bytes | None], list[int]] | None:
    """The records of several uncompressed records sections ``buf[start:end]`` (``spans``:
    ``(start, end, header)``, e.g. every batch of one Fetch answer) decoded at once, with
    numpy for the fields: ``(offsets, timestamps, keys, values, records per span)``.

    One Python loop finds the record boundaries; numpy reads every record's varints in
    bulk; keys and values are slices of ``buf``. A batch whose section is exactly as long as
    its records would be if they all had the first one's size (but for the offset delta's varint)
    is assumed to hold such records (no hop; ``guess=False``: never), and walked after all if
    the numpy check refutes it.
    Returns None when this path does not
    apply: numpy is not installed, a record has headers, a length takes more than three
    bytes, or anything does not add up (a damaged batch): the caller then decodes the
    batches one by one with :func:`decode_section`, which gives the same results and
    raises the precise error. Never returns a result :func:`decode_section` would refuse.
    """
    np = _np
    if np is None:
        return None
    rs = _guessed_starts(buf, spans) if guess else None
    if rs is not None:  # every span guessed: the starts computed in numpy, no per-record Python
        counts = [h.records_count for _s, _e, h in spans]
        last = [e for _s, e, _h in spans]
        guessed = True
        n = len(rs)
        if n == 0:
            return [], [], [], [], counts
        if any(b and buf[e - 1] for (_s, e, _h), b in zip(spans, counts)):
            return None  # a last record with headers
    else:
        got_walk = _walk_starts(buf, spans, guess)
        if got_walk is None:
            return None
        starts, counts, last, guessed = got_walk
        n = len(starts)
        if n == 0:
            return [], [], [], [], counts
        rs = _np.array(starts, _np.int64)
    return _decode_starts(buf, spans, rs, counts, last, guessed)


def _guessed_starts(buf: bytes, spans: list[tuple[int, int, BatchHeader]]) -> Any:
    """Every record start of ``spans`` as an int64 array if each span's section is exactly as long as
    its records would be if they all had the first one's size but for their offset delta's varint
    (see :func:`_equal_size_starts`; computed for all spans at once in numpy), else None. A guess
    for :func:`decode_spans` to check."""
    np = _np
    ps: list[int] = []
    sizes: list[int] = []
    cs: list[int] = []
    try:
        for p, end, hdr in spans:
            count = hdr.records_count
            if count <= 0:
                if count < 0 or p != end:
                    return None
                continue
            size = _record_end(buf, p) - p
            # a record without headers ends in a zero header count (the last one is checked by the caller)
            if size < 2 or buf[p + size - 1]:
                return None
            total = count * size
            for lo, _width in _DELTA_WIDTHS[1:]:  # each width step adds a byte to the records from lo on
                if count > lo:
                    total += count - lo
            if p + total != end:
                return None
            ps.append(p)
            sizes.append(size)
            cs.append(count)
    except IndexError:
        return None
    if not cs:
        return np.empty(0, np.int64)
    cnt = np.array(cs, np.int64)
    first = np.cumsum(cnt) - cnt  # the index of each span's first record
    k = np.arange(int(first[-1] + cnt[-1]), dtype=np.int64) - np.repeat(first, cnt)  # index in its span
    rs = np.repeat(np.array(ps, np.int64), cnt) + k * np.repeat(np.array(sizes, np.int64), cnt)
    for lo, _width in _DELTA_WIDTHS[1:]:
        if max(cs) > lo + 1:
            rs += np.maximum(k - lo, 0)
    return rs


def _walk_starts(buf: bytes, spans: list[tuple[int, int, BatchHeader]], guess: bool
                 ) -> tuple[list[int], list[int], list[int], bool] | None:
    """The record starts of ``spans`` found by hopping from record length to record length, but
    where a span's records may all be the first one's size (:func:`_equal_size_starts`);
    ``(starts, records per span, span ends, whether any was guessed)``, None if this path does
    not apply."""
    starts: list[int] = []  # where each record (its length varint) begins
    sapp = starts.append
    counts: list[int] = []
    last: list[int] = []  # where each span's records end
    guessed = False
    try:
        for p, end, hdr in spans:
            counts.append(hdr.records_count)
            # a record without headers ends in a zero header count: a batch whose first or last record
            # does not gives up here, before walking every record (a topic with headers: each batch)
            count = hdr.records_count
            if count and (buf[end - 1] or buf[(first := _record_end(buf, p)) - 1]):
                return None
            if guess and count > 1 and (got := _equal_size_starts(p, end, first - p, count)) is not None:
                # the records may all be the first one's size but for their offset delta's varint:
                # their starts are then known without the hop; the numpy check below that each
                # record ends where the next begins proves it (from the first, whose start is
                # certain), else all is walked again
                starts += got
                last.append(end)
                guessed = True
                continue
            for _ in range(count):  # the only per-record Python: hop from length to length
                sapp(p)
                b = buf[p]
                if b < 0x80:
                    p += 1 + (b >> 1)
                elif buf[p + 1] < 0x80:
                    p += 2 + (((b & 0x7F) | (buf[p + 1] << 7)) >> 1)
                elif buf[p + 2] < 0x80:
                    p += 3 + (((b & 0x7F) | ((buf[p + 1] & 0x7F) << 7) | (buf[p + 2] << 14)) >> 1)
                else:
                    return None
            if p != end:
                return None
            last.append(end)
    except IndexError:
        return None
    return starts, counts, last, guessed


def _decode_starts(buf: bytes, spans: list[tuple[int, int, BatchHeader]], rs: Any, counts: list[int],
                   last: list[int], guessed: bool
                   ) -> tuple[list[int], list[int], list[bytes | None], list[bytes | None], list[int]] | None:
    """The rest of :func:`decode_spans` from the record starts ``rs`` (int64 array, not empty)."""
    np = _np
    n = len(rs)
    arr = np.frombuffer(buf, np.uint8)
    cnt = np.array(counts, np.int64)
    try:
        length, a = _np_varints(arr, rs)
        e = a + length
        # each record ends where the next begins, and the last of a span at the span's end
        nxt = np.empty(n, np.int64)
        nxt[:-1] = rs[1:]
        nxt[np.cumsum(cnt)[cnt > 0] - 1] = [x for x, c in zip(last, counts) if c]
        if (length < 0).any() or not np.array_equal(e, nxt):
            return decode_spans(buf, spans, False) if guessed else None
        ts, p = _np_varints(arr, a + 1)  # after the attributes byte
        off, p = _np_varints(arr, p)
        klen, p = _np_varints(arr, p)
        kstart = p
        p = p + np.maximum(klen, 0)
        vlen, p = _np_varints(arr, p)
        vstart = p
        p = p + np.maximum(vlen, 0)
        # no headers: the count (a zero byte) is each record's last byte
        if not (np.array_equal(p, e - 1) and not arr[p].any()):
            return None
    except (IndexError, ValueError):
        # a wrong equal-size guess can make a varint read run off the end: walk instead (review N2)
        return decode_spans(buf, spans, False) if guessed else None
    # int64 arithmetic below must not wrap: anything this large goes the exact Python way
    lim = 1 << 61
    if (ts.min() < -lim or ts.max() > lim or off.min() < -lim or off.max() > lim
            or any(not -lim < h.base_offset < lim or not -lim < h.base_timestamp < lim for _s, _e, h in spans)):
        return None
    if len(spans) == 1:
        hdr = spans[0][2]
        offsets = (off + hdr.base_offset).tolist()
        if hdr.attributes & TIMESTAMP_TYPE_BIT:
            stamps = [hdr.max_timestamp] * n
        else:
            stamps = (ts + hdr.base_timestamp).tolist()
    else:
        bases = np.array([h.base_offset for _s, _e, h in spans], np.int64)
        offsets = (off + np.repeat(bases, cnt)).tolist()
        base_ts = np.array([h.base_timestamp for _s, _e, h in spans], np.int64)
        lat = [bool(h.attributes & TIMESTAMP_TYPE_BIT) for _s, _e, h in spans]  # LogAppendTime: maxTimestamp,
        if not any(lat):  # whatever its value (-1 included)
            stamps = (ts + np.repeat(base_ts, cnt)).tolist()
        else:
            fixed = np.array([h.max_timestamp for _s, _e, h in spans], np.int64)
            stamps = np.where(np.repeat(np.array(lat, bool), cnt), np.repeat(fixed, cnt),
                              ts + np.repeat(base_ts, cnt)).tolist()
    # a comprehension slices without a slice object per record (map(slice, ...) made one: 0.04 us)
    values: list[bytes | None] = [buf[a:b] for a, b in zip(vstart.tolist(), (vstart + np.maximum(vlen, 0)).tolist())]
    for i in np.flatnonzero(vlen < 0).tolist():
        values[i] = None
    knull = klen < 0
    if knull.all():
        keys: list[bytes | None] = [None] * n
    else:
        keys = [buf[a:b] for a, b in zip(kstart.tolist(), (kstart + np.maximum(klen, 0)).tolist())]
        for i in np.flatnonzero(knull).tolist():
            keys[i] = None
    return offsets, stamps, keys, values, counts


