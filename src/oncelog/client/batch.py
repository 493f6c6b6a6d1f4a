"""Producer-side record batch encoding (magic v2), sans-IO.

A :class:`BatchBuilder` collects the records of one partition's next batch
as already-encoded bytes; :meth:`BatchBuilder.close` compresses the records
section once, and :func:`batch_bytes` adds the 61-byte header (producer id,
epoch, base sequence, transactional bit) and the CRC32C. The header is
cheap to rebuild, so a batch resent under a new producer epoch or with
shifted sequences (idempotent producer) is never recompressed.

Record layout (Kafka's DefaultRecord): varint length, then attributes
(int8 0), varint timestamp delta, varint offset delta, varint key length +
key (-1: null), varint value length + value, varint header count, headers.
Varints are zigzag. :data:`_VARINT` holds the encodings of 0..16383 so the
common lengths and deltas are a list lookup.

The bulk path :func:`encode_records` builds the records section of many
values with ``bytes.join`` over lists made by ``map`` (no Python-level loop
per record for records without headers); :func:`encode_sections` does the
same for the consecutive batches of one call at once, so the fixed cost of
the ``map`` passes (a dozen lists) is paid once per call, not once per batch.

Compression goes through ``cramjam`` (gzip, raw snappy like librdkafka,
zstd) and a small LZ4 frame writer with independent blocks and no
checksums, the frame shape Kafka's Java ``KafkaLZ4BlockInputStream`` reads.
"""

from __future__ import annotations

import struct
import time
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, chain, repeat
from operator import add
from typing import Any

import cramjam
from crc32c import crc32c

from oncelog.protocol.fast_produce import uvarint
from oncelog.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    TRANSACTIONAL_BIT,
)

__all__ = ["BatchBuilder", "CODECS", "batch_bytes", "batch_header", "compress", "encode_record", "encode_records",
           "encode_sections", "record_sizes", "varint"]

CODECS = {"none": COMPRESSION_NONE, "gzip": COMPRESSION_GZIP, "snappy": COMPRESSION_SNAPPY,
          "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}

_HEADER = struct.Struct(">qiibIhiqqqhii")
_U32 = struct.Struct(">I")
RECORD_OVERHEAD_MAX = 21  # length, attributes, ts delta, offset delta, key len, value len, header count


def _zz_bytes(n: int) -> bytes:
    return uvarint(((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF)


_VARINT: list[bytes] = [_zz_bytes(i) for i in range(16384)]
_NULL = _zz_bytes(-1)


def varint(n: int) -> bytes:
    """The zigzag varint of ``n`` (Kafka's record-level varint)."""
    if 0 <= n < 16384:
        return _VARINT[n]
    return _zz_bytes(n)


def _sized(data: bytes | None) -> bytes:
    if data is None:
        return _NULL
    n = len(data)
    return (_VARINT[n] if n < 16384 else _zz_bytes(n)) + data


def _headers(headers: Sequence[tuple[str, bytes | None]] | dict[str, bytes | None] | None) -> bytes:
    if not headers:
        return b"\x00"
    items = headers.items() if isinstance(headers, dict) else headers
    parts = [varint(len(items))]
    for k, v in items:
        kb = k.encode() if isinstance(k, str) else bytes(k)
        parts.append(_sized(kb))
        parts.append(_sized(None if v is None else (v.encode() if isinstance(v, str) else bytes(v))))
    return b"".join(parts)


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                  headers: Any = None) -> bytes:
    """One record (length prefix included)."""
    body = b"".join((b"\x00", varint(timestamp_delta), varint(offset_delta), _sized(key), _sized(value),
                     _headers(headers)))
    n = len(body)
    return (_VARINT[n] if n < 16384 else _zz_bytes(n)) + body


def _varints(lens: list[int]) -> list[bytes]:
    """The varint of each of ``lens`` (all >= 0), from the table when they are all small."""
    return list(map(_VARINT.__getitem__, lens)) if max(lens, default=0) < 16384 else list(map(varint, lens))


def _key_pieces(keys: Sequence[bytes | None] | None, n: int) -> tuple[Any, Any, Any]:
    """:func:`_pieces` of ``keys``, or of ``n`` null keys when there are none."""
    if keys is None:
        return repeat(_NULL, n), repeat(b"", n), repeat(1, n)
    return _pieces(keys)


def _record_prefixes(vsizes: list[int], ksizes: Any, deltas: Sequence[bytes], n: int) -> list[bytes]:
    """Each record's length varint: attributes (0) + ts delta (0) + offset delta + key + value + header count (0)."""
    return _varints(list(map(add, map(add, map(add, vsizes, ksizes), map(len, deltas)), repeat(3, n))))


def _pieces(data: Sequence[bytes | None]) -> tuple[list[bytes], Sequence[bytes], list[int]]:
    """Length varints, bodies (b"" for None) and encoded sizes of ``data``, by ``map`` (no Python loop)."""
    if None in data:
        heads = [_NULL if d is None else (_VARINT[len(d)] if len(d) < 16384 else _zz_bytes(len(d))) for d in data]
        data = [b"" if d is None else d for d in data]
        lens = [0 if h is _NULL else len(d) for d, h in zip(data, heads)]
    else:
        lens = list(map(len, data))
        heads = _varints(lens)
    return heads, data, list(map(add, lens, map(len, heads)))


def encode_records(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None,
                   first_offset_delta: int = 0) -> bytes:
    """The records section for ``values`` (and ``keys``), timestamp delta 0, no headers.

    Built with ``map`` and one ``bytes.join`` over each record's pieces (length,
    attributes + timestamp delta, offset delta, key length, key, value length,
    value, header count): no Python loop per record, and each value is copied
    once, into the section (no per-record ``bytes`` in between).
    """
    n = len(values)
    vheads, vbodies, vsizes = _pieces(values)
    kheads, kbodies, ksizes = _key_pieces(keys, n)
    end = first_offset_delta + n
    deltas = _VARINT[first_offset_delta:end] if end <= 16384 else list(map(varint, range(first_offset_delta, end)))
    prefixes = _record_prefixes(vsizes, ksizes, deltas, n)
    return b"".join(chain.from_iterable(zip(prefixes, repeat(b"\x00\x00", n), deltas, kheads, kbodies, vheads,
                                            vbodies, repeat(b"\x00", n))))


def encode_sections(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                    bounds: Sequence[tuple[int, int]]) -> list[bytes]:
    """The records sections of consecutive batches: batch ``b`` holds records ``bounds[b][0]`` up to
    ``bounds[b][1]`` (exclusive) of ``values`` (and ``keys``), offset deltas from 0 in each batch,
    timestamp delta 0, no headers. The same bytes as :func:`encode_records` per batch; the ``map``
    passes run once over the records of many batches (up to about 8192 records at a time, to bound
    the lists they make), then each batch is one ``bytes.join`` of a slice."""
    out: list[bytes] = []
    k = 0
    while k < len(bounds):
        start = bounds[k][0]
        m = k + 1
        while m < len(bounds) and bounds[m][1] - start <= _SECTIONS_CHUNK:
            m += 1
        end = bounds[m - 1][1]
        out += _sections(values[start:end], None if keys is None else keys[start:end],
                         [(i - start, j - start) for i, j in bounds[k:m]])
        k = m
    return out


_SECTIONS_CHUNK = 8192


# attributes (0), timestamp delta (0), offset delta k, key length -1 (null key): the middle of a record
# without a key whose offset delta is k < 16384, one bytes object
_MID_NULL_KEY: list[bytes] = [b"\x00\x00" + _VARINT[k] + _NULL for k in range(16384)]


def _sections(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
              bounds: list[tuple[int, int]]) -> list[bytes]:
    n = len(values)
    join = b"".join
    if keys is None and max(j - i for i, j in bounds) <= 16384 and None not in values:
        # records without a key: [length] [attributes, ts delta, offset delta, null key] [value length] value
        # [0 headers]; the middle part comes from a table by offset delta
        lens = list(map(len, values))
        first = lens[0] if n else 0
        if first < 16384 and lens.count(first) == n:
            # values of one length (fixed-size payloads): the record around value k of a batch is the same
            # in every batch, so each batch is one join over a zip (no map pass per record)
            vh = _VARINT[first]
            longest = max(j - i for i, j in bounds)
            pre = [varint(len(_MID_NULL_KEY[k]) + len(vh) + first + 1) for k in range(longest)]
            tail = repeat(b"\x00")
            out = []
            for i, j in bounds:
                m = j - i
                out.append(join(chain.from_iterable(zip(pre[:m], _MID_NULL_KEY[:m], repeat(vh, m), values[i:j],
                                                        tail))))
            return out
        vheads = _varints(lens)
        mids = list(chain.from_iterable(_MID_NULL_KEY[0:j - i] for i, j in bounds))
        prefixes = _varints(list(map(add, map(add, map(add, lens, map(len, vheads)), map(len, mids)), repeat(1, n))))
        flat = list(chain.from_iterable(zip(prefixes, mids, vheads, values, repeat(b"\x00", n))))
        return [join(flat[5 * i:5 * j]) for i, j in bounds]
    vheads, vbodies, vsizes = _pieces(values)
    kheads, kbodies, ksizes = _key_pieces(keys, n)
    deltas = list(chain.from_iterable(_VARINT[0:j - i] if j - i <= 16384 else map(varint, range(j - i))
                                      for i, j in bounds))
    prefixes = _record_prefixes(vsizes, ksizes, deltas, n)
    flat = list(chain.from_iterable(zip(prefixes, repeat(b"\x00\x00", n), deltas, kheads, kbodies, vheads,
                                        vbodies, repeat(b"\x00", n))))
    return [join(flat[8 * i:8 * j]) for i, j in bounds]


def record_sizes(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None) -> list[int]:
    """An upper bound of each record's encoded size (no headers): what ``batch.size`` is checked with."""
    vl = [0 if v is None else len(v) for v in values] if None in values else list(map(len, values))
    if keys is not None:
        kl = [0 if k is None else len(k) for k in keys] if None in keys else list(map(len, keys))
        vl = list(map(add, vl, kl))
    return list(map(add, vl, repeat(RECORD_OVERHEAD_MAX, len(vl))))


def batch_bounds(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None, room: int
                 ) -> list[tuple[int, int]]:
    """Records ``values[i:j]`` per batch, as ``(i, j)``: at most ``room`` bytes each by :func:`record_sizes`'
    bound (one record alone may be larger); ``ends[i]`` is the bytes of records ``0..i-1``."""
    ends = list(accumulate(record_sizes(values, keys), initial=0))
    bounds: list[tuple[int, int]] = []
    i, n = 0, len(values)
    while i < n:
        j = max(i + 1, bisect_right(ends, ends[i] + room, i + 1) - 1)
        bounds.append((i, j))
        i = j
    return bounds


# -- compression -------------------------------------------------------------------


def _xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 (only for the 2-byte LZ4 frame descriptor, computed once)."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    m = 0xFFFFFFFF
    h = (seed + p5 + len(data)) & m
    i = 0
    while i + 4 <= len(data):
        (k,) = struct.unpack_from("<I", data, i)
        h = (h + k * p3) & m
        h = (((h << 17) | (h >> 15)) & m) * p4 & m
        i += 4
    for b in data[i:]:
        h = (h + b * p5) & m
        h = (((h << 11) | (h >> 21)) & m) * p1 & m
    h ^= h >> 15
    h = (h * p2) & m
    h ^= h >> 13
    h = (h * p3) & m
    h ^= h >> 16
    return h


_LZ4_BLOCK = 64 * 1024
_LZ4_DESCRIPTOR = bytes([0x60, 0x40])  # version 01, independent blocks; 64 KiB max block size
_LZ4_HEADER = b"\x04\x22\x4d\x18" + _LZ4_DESCRIPTOR + bytes([(_xxh32(_LZ4_DESCRIPTOR) >> 8) & 0xFF])
_LE32 = struct.Struct("<I")


def _lz4_frame(data: bytes) -> bytes:
    out = [_LZ4_HEADER]
    view = memoryview(data)
    for pos in range(0, len(data), _LZ4_BLOCK):
        chunk = view[pos:pos + _LZ4_BLOCK]
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(block) >= len(chunk):
            out.append(_LE32.pack(len(chunk) | 0x80000000))
            out.append(bytes(chunk))
        else:
            out.append(_LE32.pack(len(block)))
            out.append(block)
    out.append(b"\x00\x00\x00\x00")
    return b"".join(out)


def compress(codec: int, data: bytes) -> bytes:
    """``data`` compressed with Kafka codec id ``codec``."""
    if codec == COMPRESSION_NONE:
        return data
    if codec == COMPRESSION_GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == COMPRESSION_SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == COMPRESSION_LZ4:
        return _lz4_frame(data)
    if codec == COMPRESSION_ZSTD:
        return bytes(cramjam.zstd.compress(data, level=3))
    raise ValueError(f"unknown compression codec {codec}")


# -- batches -----------------------------------------------------------------------


def batch_header(body: bytes, *, codec: int, count: int, base_timestamp: int, max_timestamp: int,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 transactional: bool = False) -> bytearray:
    """The 61-byte v2 batch header (base offset 0) for ``body`` (the records section, compressed), CRC set."""
    attributes = codec | (TRANSACTIONAL_BIT if transactional else 0)
    head = bytearray(HEADER_SIZE)
    _HEADER.pack_into(head, 0, 0, HEADER_SIZE - LOG_OVERHEAD + len(body), -1, MAGIC_V2, 0, attributes,
                      count - 1, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, count)
    crc = crc32c(body, crc32c(memoryview(head)[CRC_START:]))
    _U32.pack_into(head, 17, crc)
    return head


def batch_bytes(body: bytes, *, codec: int, count: int, base_timestamp: int, max_timestamp: int,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                transactional: bool = False) -> bytes:
    """A whole v2 batch: header (base offset 0) + ``body`` (the records section, compressed), CRC set."""
    return bytes(batch_header(body, codec=codec, count=count, base_timestamp=base_timestamp,
                              max_timestamp=max_timestamp, producer_id=producer_id, producer_epoch=producer_epoch,
                              base_sequence=base_sequence, transactional=transactional)) + body


class BatchBuilder:
    """The open batch of one partition: encoded records plus what the producer needs per record.

    ``append`` returns False (and adds nothing) when the record would take
    the batch past ``max_bytes`` and the batch is not empty; a first record
    is always taken (a batch larger than ``batch.size`` holds one record).
    """

    __slots__ = ("parts", "count", "size", "base_timestamp", "max_timestamp", "max_bytes", "created",
                 "body", "codec", "extra")

    def __init__(self, max_bytes: int, codec: int = COMPRESSION_NONE) -> None:
        self.parts: list[bytes] = []
        self.count = 0
        self.size = HEADER_SIZE
        self.base_timestamp = -1
        self.max_timestamp = -1
        self.max_bytes = max_bytes
        self.codec = codec
        self.created = time.monotonic()
        self.body: bytes | None = None  # set by close()
        self.extra: Any = None  # owner's per-batch data (the producer's delivery bookkeeping)

    def append(self, timestamp: int, key: bytes | None, value: bytes | None, headers: Any = None) -> bool:
        count = self.count
        if count == 0:
            self.base_timestamp = self.max_timestamp = timestamp
        # the record's pieces go into ``parts`` as they are (no copy of key or value until close())
        td = timestamp - self.base_timestamp
        tdv = _VARINT[td] if 0 <= td < 16384 else _zz_bytes(td)
        odv = _VARINT[count] if count < 16384 else _zz_bytes(count)
        if key is None:
            kh, key, klen = _NULL, b"", 1
        else:
            n = len(key)
            kh = _VARINT[n] if n < 16384 else _zz_bytes(n)
            klen = len(kh) + n
        if value is None:
            vh, value, vlen = _NULL, b"", 1
        else:
            n = len(value)
            vh = _VARINT[n] if n < 16384 else _zz_bytes(n)
            vlen = len(vh) + n
        hb = b"\x00" if not headers else _headers(headers)
        body = 1 + len(tdv) + len(odv) + klen + vlen + len(hb)
        prefix = _VARINT[body] if body < 16384 else _zz_bytes(body)
        total = len(prefix) + body
        if count and self.size + total > self.max_bytes:
            return False
        self.parts += (prefix, b"\x00", tdv, odv, kh, key, vh, value, hb)
        self.count = count + 1
        self.size += total
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        return True

    def append_encoded(self, section: bytes, count: int, timestamp: int) -> None:
        """Add ``count`` records already encoded by :func:`encode_records` (offset deltas from ``self.count``)."""
        if self.count == 0:
            self.base_timestamp = self.max_timestamp = timestamp
        self.parts.append(section)
        self.count += count
        self.size += len(section)

    def close(self) -> bytes:
        """Compress the records section (once); returns it."""
        if self.body is None:
            self.body = compress(self.codec, b"".join(self.parts))
            self.parts = []
        return self.body

    def header(self, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
               transactional: bool = False) -> bytearray:
        """The batch header for :meth:`close`'s body (send both, in that order, without joining them).

        :func:`batch_header`'s bytes, built here without its keyword-argument call (once per batch sent)."""
        body = self.body
        if body is None:
            body = self.close()
        count = self.count
        head = bytearray(HEADER_SIZE)
        _HEADER.pack_into(head, 0, 0, HEADER_SIZE - LOG_OVERHEAD + len(body), -1, MAGIC_V2, 0,
                          self.codec | TRANSACTIONAL_BIT if transactional else self.codec, count - 1,
                          self.base_timestamp, self.max_timestamp, producer_id, producer_epoch, base_sequence, count)
        _U32.pack_into(head, 17, crc32c(body, crc32c(memoryview(head)[CRC_START:])))
        return head

    def to_bytes(self, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 transactional: bool = False) -> bytes:
        return batch_bytes(self.close(), codec=self.codec, count=self.count, base_timestamp=self.base_timestamp,
                           max_timestamp=self.max_timestamp, producer_id=producer_id,
                           producer_epoch=producer_epoch, base_sequence=base_sequence,
                           transactional=transactional)


def split_builder(builder: BatchBuilder, max_bytes: int,
                  min_parts: int = 1) -> list[tuple[BatchBuilder, list[int], list[int]]]:
    """The records of a closed batch re-encoded into batches of at most ``max_bytes`` (uncompressed; one
    record alone may be larger), in order: ``(builder, each record's timestamp, each record's key + value
    bytes)`` per new batch. For the producer's split of a batch the broker refused as MESSAGE_TOO_LARGE
    (as Java's ProducerBatch.split: the records are read back from the batch and appended anew). As few
    batches as packing to ``max_bytes`` needs (at least ``min_parts`` if there are as many records), of
    near-equal size: the smallest largest batch for that count (packing greedily to a limit left a small
    last one, as 11/7/2 records)."""
    from oncelog.protocol.compression import decompress
    from oncelog.protocol.records import iter_records

    section = decompress(builder.codec, builder.close())
    whole = batch_bytes(section, codec=COMPRESSION_NONE, count=builder.count, base_timestamp=builder.base_timestamp,
                        max_timestamp=builder.max_timestamp)
    recs = [(ts, rec) for _off, ts, rec in iter_records(whole)]
    probe = BatchBuilder(1 << 62)  # each record's encoded size where it was (its deltas in a part are close)
    sizes = []
    for ts, rec in recs:
        before = probe.size
        probe.append(ts, rec.key, rec.value, rec.headers)
        sizes.append(probe.size - before)

    def packed(limit: int) -> list[int]:  # greedy: the number of records of each batch
        counts: list[int] = []
        size = HEADER_SIZE
        for n in sizes:
            if counts and size + n <= limit:
                counts[-1] += 1
                size += n
            else:
                counts.append(1)
                size = HEADER_SIZE + n
        return counts

    k = min(max(len(packed(max_bytes)), min_parts), len(sizes))
    lo = HEADER_SIZE + (sum(sizes) + k - 1) // k if k else max_bytes
    hi = max(lo, max_bytes)
    while lo < hi:  # the smallest limit that still packs into k batches
        mid = (lo + hi) // 2
        if len(packed(mid)) <= k:
            hi = mid
        else:
            lo = mid + 1
    counts = packed(lo)
    out: list[tuple[BatchBuilder, list[int], list[int]]] = []
    cut = set()
    first = 0
    for c in counts:
        cut.add(first)
        first += c
    cur: BatchBuilder | None = None
    for i, (ts, rec) in enumerate(recs):
        # a new batch at each planned cut, or when a record does not fit after all (its deltas grew)
        if cur is None or i in cut or not cur.append(ts, rec.key, rec.value, rec.headers):
            cur = BatchBuilder(max_bytes, builder.codec)
            cur.created = builder.created
            cur.append(ts, rec.key, rec.value, rec.headers)
            out.append((cur, [], []))
        out[-1][1].append(ts)
        out[-1][2].append((len(rec.key) if rec.key else 0) + (len(rec.value) if rec.value else 0))
    return out
