"""A small protocol-level partition reader (``oncelog verify`` and tests).

It speaks only the Kafka protocol -- Metadata, ListOffsets and Fetch over the
blocking :class:`~oncelog.client.connection.Connection` -- so it reads from
Apache Kafka as well as from oncelog. It never imports the broker.

What it adds over a plain Fetch:

* requests go to each partition's leader (Metadata), with versions from
  ApiVersions (Fetch v4..v12: the versions that name topics, not topic ids);
* batch CRCs are checked and compressed batches are decompressed
  (:mod:`oncelog.protocol.compression`, with ``cramjam``);
* read_committed responses are filtered client-side exactly as the Java
  consumer does (``CompletedFetch.nextFetchedBatch``), see
  :func:`filter_read_committed`.

:func:`decode_batches` and :func:`filter_read_committed` are pure functions
over bytes and lists, unit-tested without a broker.
"""

from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Mapping
from itertools import chain
from typing import Any, Iterable

from crc32c import crc32c

from oncelog.client.connection import Connection
from oncelog.protocol import compression
from oncelog.protocol.errors import code_name
from oncelog.protocol.records import (
    COMPRESSION_NONE,
    CRC_START,
    HAVE_NUMPY,
    MAGIC_V2,
    RECORDS_OFFSET,
    BatchHeader,
    InvalidRecordError,
    iter_batch_headers,
    iter_records,
    RecordColumns,
    decode_columns,
    decode_section,
    decode_spans,
    read_control_marker,
)

LIST_OFFSETS, FETCH, METADATA = 2, 1, 3
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
EARLIEST, LATEST = -2, -1
FETCH_VERSIONS = (4, 12)  # v13+ addresses topics by id only
LIST_OFFSETS_VERSIONS = (2, 8)  # v2+ carries the isolation level
METADATA_VERSIONS = (1, 12)

# errors worth a retry after refreshing metadata
_RETRIABLE = {3, 5, 6, 7, 13, 14, 15, 74, 75}  # UNKNOWN_TOPIC..., LEADER_NOT_AVAILABLE, NOT_LEADER, ..., FENCED/UNKNOWN_LEADER_EPOCH


class ReaderError(Exception):
    """The cluster answered with an error we cannot read past (``error_code``: Kafka's, or None)."""

    def __init__(self, message: str, error_code: int | None = None, batch_start: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        #: from :func:`decode_batches`: where the batch that failed starts in the data (the batches
        #: before it passed), so a consumer can hand those out first as Java's does
        self.batch_start = batch_start


# -- decoded data -----------------------------------------------------------------


@dataclass(slots=True)
class ReadRecord:
    """One data record as read from a partition."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    producer_id: int
    producer_epoch: int
    transactional: bool


@dataclass(slots=True)
class Marker:
    """A transaction marker (control batch)."""

    partition: int
    offset: int
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


@dataclass(slots=True)
class Batch:
    """A decoded batch: its header and either its records or its marker."""

    header: BatchHeader
    records: list[ReadRecord] = field(default_factory=list)
    marker: Marker | None = None  # control batches with a COMMIT/ABORT marker
    raw: bytes | None = None  # the uncompressed batch, when decoded with records=False
    # with share=True instead of raw: the uncompressed records section as (buffer, start, end),
    # the Fetch blob itself for an uncompressed batch (no copy), the decompressed body otherwise
    section: tuple[bytes, int, int] | None = None
    # with defer=True, a compressed data batch instead: its compressed records section as (buffer,
    # start, end), decompressed when decoded (section_of)
    packed: tuple[bytes, int, int] | None = None


@dataclass
class PartitionData:
    """Everything one read of a partition returned."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int  # the high watermark (read_uncommitted) or the LSO (read_committed) read up to
    records: list[ReadRecord]
    markers: list[Marker]
    batches: int = 0
    skipped_aborted_batches: int = 0


# -- decompression ------------------------------------------------------------------


def decompress(codec: int, data: bytes) -> bytes:
    """The records section of a batch compressed with Kafka codec ``codec``
    (:func:`oncelog.protocol.compression.decompress`, errors as :class:`ReaderError`)."""
    try:
        return compression.decompress(codec, data)
    except InvalidRecordError as exc:
        raise ReaderError(exc.message) from None


# -- pure decoding and filtering ---------------------------------------------------------


def decode_batches(data: bytes, partition: int = 0, check_crc: bool = True, records: bool = True,
                   share: bool = False, defer: bool = False) -> list[Batch]:
    """Decode every complete v2 batch in a Fetch ``records`` blob (a partial tail is ignored).

    ``records=False`` leaves data batches' ``records`` empty and keeps the
    uncompressed batch in ``raw`` instead (for :func:`~oncelog.protocol.records.decode_columns`);
    with ``share=True`` as well, ``section`` instead of ``raw``: the records section without
    a copy of the batch (for :func:`~oncelog.protocol.records.decode_section`); with
    ``defer=True`` too, a compressed data batch is not decompressed here: it carries ``packed``
    instead of ``section`` (:func:`section_of` decompresses it), and ``data`` may be a
    ``memoryview`` (of a Fetch answer's receive buffer) that is not copied: an uncompressed
    batch's ``section`` is then a view, copied when the batch is decoded (batch_section,
    group_sections), so that its bytes are in the cache as they are read.
    """
    if not (defer and type(data) is memoryview):
        data = bytes(data)
    out: list[Batch] = []
    for hdr, start, end in iter_batch_headers(data):
        if hdr.magic != MAGIC_V2:
            raise ReaderError(f"partition {partition}: batch at offset {hdr.base_offset} has magic {hdr.magic}",
                              batch_start=start)
        if check_crc:
            crc = crc32c(memoryview(data)[start + CRC_START : end])
            if crc != hdr.crc:
                raise ReaderError(f"partition {partition}: CRC mismatch in batch at offset {hdr.base_offset}",
                                  batch_start=start)
        batch = Batch(hdr)
        try:
            if hdr.is_control:
                if hdr.compression == COMPRESSION_NONE and hdr.records_count > 0:
                    m = read_control_marker(data if type(data) is bytes else bytes(data[start:end]),
                                            start if type(data) is bytes else 0)
                else:
                    m = read_control_marker(compression.decompressed_batch(data, start, end))
                batch.marker = Marker(partition, hdr.base_offset, hdr.producer_id, hdr.producer_epoch,
                                      m.commit, m.coordinator_epoch)
            elif not records:
                if not share:
                    batch.raw = compression.decompressed_batch(data, start, end)
                elif hdr.compression == COMPRESSION_NONE:
                    batch.section = (data, start + RECORDS_OFFSET, end)
                elif defer:
                    batch.packed = (data, start + RECORDS_OFFSET, end)
                else:
                    body = compression.decompress_buffer(hdr.compression,
                                                         memoryview(data)[start + RECORDS_OFFSET:end])
                    batch.section = (body, 0, len(body))  # a buffer, made bytes when decoded
            else:
                raw = compression.decompressed_batch(data, start, end)
                batch.records = [
                    ReadRecord(partition, off, ts, rec.key, rec.value, rec.headers, hdr.producer_id,
                               hdr.producer_epoch, hdr.is_transactional)
                    for off, ts, rec in iter_records(raw)
                ]
        except InvalidRecordError as exc:
            raise ReaderError(f"partition {partition}: batch at offset {hdr.base_offset}: {exc.message}",
                              batch_start=start) from None
        out.append(batch)
    return out


def filter_read_committed(batches: list[Batch], aborted: list[tuple[int, int]]) -> tuple[list[Batch], int]:
    """The batches a read_committed Java consumer returns from one fetch response.

    ``aborted`` is the response's ``aborted_transactions`` as ``(producer_id,
    first_offset)``. Exactly ``CompletedFetch.nextFetchedBatch``: for a batch
    with a producer id, first every aborted transaction whose first offset is
    at or below the batch's last offset makes its producer "aborted"; then an
    ABORT marker of that producer ends it, and a transactional batch of an
    aborted producer is skipped. Control batches are never returned. Returns
    ``(kept batches, number of skipped aborted batches)``.
    """
    queue = [(first, pid) for pid, first in aborted]
    heapq.heapify(queue)
    aborted_pids: set[int] = set()
    kept: list[Batch] = []
    skipped = 0
    for b in batches:
        h = b.header
        if h.producer_id >= 0:
            while queue and queue[0][0] <= h.last_offset:
                aborted_pids.add(heapq.heappop(queue)[1])
            if h.is_control and b.marker is not None and not b.marker.commit:
                aborted_pids.discard(h.producer_id)
            elif h.is_transactional and h.producer_id in aborted_pids:
                skipped += 1
                continue
        if not h.is_control:
            kept.append(b)
    return kept, skipped


def fetched_records(data: bytes, partition: int, position: int, isolation_level: int,
                    aborted: list[tuple[int, int]], check_crc: bool = True) -> tuple[list[ReadRecord], list[Batch], int, int]:
    """What one partition of a Fetch response yields to a consumer at ``position``.

    Returns ``(records at or after position, batches decoded, skipped aborted
    batches, next position)``; the next position is past the last whole batch
    (control and aborted batches included), or ``position`` if none.
    Shared by :class:`PartitionReader` and the consumer.
    """
    kept, batches, skipped, next_position = _select_batches(
        decode_batches(data, partition, check_crc), position, isolation_level, aborted)
    records = [r for b in kept for r in b.records if r.offset >= position]
    return records, batches, skipped, next_position


def _select_batches(decoded: Iterable[Batch], position: int, isolation_level: int, aborted: list[tuple[int, int]]
                    ) -> tuple[list[Batch], list[Batch], int, int]:
    """The batches reaching ``position``, the data batches of them the isolation level shows,
    the aborted ones skipped, and the next position (past the last batch, or ``position``)."""
    batches = [b for b in decoded if b.header.last_offset >= position]
    if not batches:
        return [], [], 0, position
    if isolation_level == READ_COMMITTED:
        kept, skipped = filter_read_committed(batches, aborted)
    else:
        kept, skipped = [b for b in batches if not b.header.is_control], 0
    return kept, batches, skipped, batches[-1].header.next_offset


def fetched_batches(data: bytes, partition: int, position: int, isolation_level: int,
                    aborted: list[tuple[int, int]], check_crc: bool = True, defer: bool = False
                    ) -> tuple[list[Batch], list[Batch], int, int]:
    """The first half of :func:`fetched_columns`: CRC checks, decompression and the
    read_committed filter, without decoding the records (C work, no per-record Python).

    Returns ``(kept data batches with ``section`` set, batches decoded, skipped aborted
    batches, next position)``; :func:`batch_columns` decodes a kept batch. The consumer
    decodes each batch when it hands its records out, so a Fetch answer is processed at
    once and the next Fetch goes out while the records are decoded. ``defer=True``: compressed
    data batches are decompressed when decoded, not here (``packed``, :func:`section_of`).
    """
    return _select_batches(decode_batches(data, partition, check_crc, records=False, share=True, defer=defer),
                           position, isolation_level, aborted)


def section_of(batch: Batch, partition: int) -> tuple[Any, int, int]:
    """A batch's uncompressed records section ``(buffer, start, end)``: its ``section``, or its
    ``packed`` body decompressed (ReaderError if it cannot be)."""
    packed = batch.packed  # first: unpack_group in another thread sets section, then clears packed
    sec = batch.section
    if sec is not None:
        return sec
    assert packed is not None
    buf, start, end = packed
    try:
        body = compression.decompress_buffer(batch.header.compression, memoryview(buf)[start:end])
    except InvalidRecordError as exc:
        raise ReaderError(f"partition {partition}: batch at offset {batch.header.base_offset}: "
                          f"{exc.message}") from None
    return body, 0, len(body)


_scratch = threading.local()  # per thread: the reused buffer a group's batches are decompressed into
# a larger buffer (a group of large records: up to GROW_MAX) is dropped after its group, not kept for
# the next: each thread that decodes keeps at most this much, and the worker threads' pool two more
SCRATCH_KEEP = 4 << 20


def unpack_group(batches: list[Batch]) -> bool:
    """Decompress the compressed (``packed``) batches among ``batches`` into one ``bytes``: each gets
    ``section`` = (that bytes, its start, its end), so that their records are decoded in place
    (:func:`group_sections`) and their values sliced from it. False if one of them does not
    decompress (the batches before it keep their sections, so they are not decompressed again):
    :func:`batch_section` then raises the precise error.

    They are decompressed one after another into a buffer reused by the thread (``decompress_into``:
    no buffer of the codec's per batch, grown as it decompresses, and no join of those buffers), and
    that is copied once into the ``bytes`` the values are sliced from. :func:`unpack_into` and
    :func:`unpacked` are the two halves (the asyncio consumer runs the first in a worker thread)."""
    buf = getattr(_scratch, "buf", None)
    got = unpack_into(batches, buf if buf is not None else bytearray(1 << 20))
    if got[2]:
        unpacked(got)
    _scratch.buf = got[0] if len(got[0]) <= SCRATCH_KEEP else None
    return len(got[2]) == len(got[1])


Unpacked = tuple[bytearray, list[Batch], list[tuple[int, int]], list[Any]]
_spare: list[bytearray] = []  # buffers for unpack_into in worker threads, shared by the consumers


def borrow_buffer() -> bytearray:
    """A buffer for :func:`unpack_into` in a worker thread (one a process reuses: new memory costs
    page faults); give it back with :func:`return_buffer` once :func:`unpacked` has copied it."""
    try:
        return _spare.pop()
    except IndexError:
        return bytearray(1 << 20)


def return_buffer(buf: bytearray) -> None:
    if len(buf) <= SCRATCH_KEEP and len(_spare) < 2:
        _spare.append(buf)


HINT_RATIO = 64  # a size hint (gzip's ISIZE, raw snappy's length) trusted up to this times the compressed size
GROW_MAX = 32 << 20  # nor beyond this: the fallback (decompress_buffer) sizes the buffer from the data


def _grow(buf: bytearray, view: memoryview, at: int, need: int) -> tuple[bytearray, memoryview]:
    """``buf`` replaced by one of at least ``need`` bytes (half as much again, for the next batches, but
    at most twice ``buf``), its first ``at`` bytes copied; ``view`` (of ``buf``) released."""
    grown = bytearray(max(need, min(2 * len(buf), need * 3 // 2)))
    grown[:at] = view[:at]
    view.release()
    return grown, memoryview(grown)


def unpack_into(batches: list[Batch], buf: bytearray) -> Unpacked:
    """The first half of :func:`unpack_group`: the packed batches among ``batches`` decompressed one
    after another into ``buf`` (grown if too small): ``(the buffer, those batches, their spans in
    it, the ``packed`` each was read from)``; fewer spans than batches if one does not decompress (the spans of those before it). Touches no batch: cramjam releases the GIL while it
    decompresses, so the asyncio consumer runs this in a worker thread, into a buffer of its own,
    and :func:`unpacked` on the loop (the ``bytes`` made there, in the loop thread's memory: made in
    the worker, they cost page faults and about 10 % more CPU in the paired runs)."""
    todo: list[Batch] = []
    packs = []
    for b in batches:  # packed read once: another thread's unpacked() may clear it meanwhile
        p = b.packed
        if p is not None and b.section is None:
            todo.append(b)
            packs.append(p)
    spans: list[tuple[int, int]] = []
    if not todo:
        return buf, todo, spans, packs
    view = memoryview(buf)
    at = 0
    try:
        for b, (data, start, end) in zip(todo, packs):
            src = memoryview(data)[start:end]
            codec = b.header.compression
            hint = compression.size_hint(codec, src)
            # grown first (no second decompression) if the size is plausible: the hint is not covered
            # by anything the sender cannot forge, so it may not allocate more than HINT_RATIO times
            # the batch's compressed size (a 20 KB batch claiming 20 MB took 30 MB)
            if hint is not None and len(buf) < at + hint <= GROW_MAX and hint <= HINT_RATIO * len(src):
                buf, view = _grow(buf, view, at, at + hint)
            n = compression.decompress_into(codec, src, view[at:])
            if n < 0:  # the buffer is too small (or the batch is damaged: decompress_buffer raises)
                try:
                    body = compression.decompress_buffer(codec, src)
                except InvalidRecordError:
                    break  # the batches before it are kept: batch_section raises the precise error
                n = len(body)
                if at + n > len(buf):
                    buf, view = _grow(buf, view, at, at + n)
                view[at:at + n] = body
            spans.append((at, at + n))
            at += n
    finally:
        view.release()
    return buf, todo, spans, packs


def unpacked(got: Unpacked) -> None:
    """The second half of :func:`unpack_group`: the decompressed bodies copied once into ``bytes``,
    each batch's ``section`` set to its part (unless another thread decoded it meanwhile, or its
    ``packed`` is no longer the one decompressed: a paused partition's batch copied out of its Fetch
    answer meanwhile, which must not then point into the whole group's bytes); a batch without a span
    (it did not decompress) keeps its ``packed``."""
    buf, todo, spans, packs = got
    out = bytes(memoryview(buf)[:spans[-1][1]]) if spans else b""
    for b, (s, e), p in zip(todo, spans, packs):
        if b.section is None and b.packed is p:
            b.section = (out, s, e)
            b.packed = None  # after section: section_of reads packed first


def batch_section(batch: Batch, partition: int, position: int
                  ) -> tuple[list[int], list[int], list[bytes | None], list[bytes | None],
                             list[list[tuple[str, bytes | None]] | None]]:
    """A batch from :func:`fetched_batches` decoded by :func:`~oncelog.protocol.records.decode_section`:
    ``(offsets, timestamps, keys, values, headers)``, a record without headers has None in
    ``headers``; cut to the offsets at or after ``position`` (may be empty: compaction can
    leave a batch without such records)."""
    sec = section_of(batch, partition)
    offs: list[int] = []
    stamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    hs: list[list[tuple[str, bytes | None]] | None] = []
    buf, start, end = sec
    if type(buf) is not bytes:  # a decompressed batch in the codec's buffer, or a view of the receive
        # buffer (defer): copied into bytes (values are slices of bytes)
        buf = bytes(memoryview(buf)[start:end])
        start, end = 0, len(buf)
    try:
        decode_section(buf, start, end, batch.header, offs, stamps, keys, values, hs)
    except InvalidRecordError as exc:
        raise ReaderError(f"partition {partition}: batch at offset {batch.header.base_offset}: "
                          f"{exc.message}") from None
    if batch.header.base_offset < position:
        i = 0
        while i < len(offs) and offs[i] < position:
            i += 1
        return offs[i:], stamps[i:], keys[i:], values[i:], hs[i:]
    return offs, stamps, keys, values, hs


def group_sections(batches: list[Batch], position: int | list[int], pieces: list[int] | None = None
                   ) -> list[tuple[list[int], list[int], list[bytes | None], list[bytes | None],
                                   list[list[tuple[str, bytes | None]] | None]]] | None:
    """:func:`batch_section` for each of ``batches`` (from :func:`fetched_batches`, of one partition or
    of several: ``position`` is then a list, each batch's own), or with ``pieces`` (how many batches
    each) for each piece of consecutive batches, their columns joined; decoded together by
    :func:`~oncelog.protocol.records.decode_spans` (numpy: the more records at once, the less its
    per-call cost weighs); None when that path does not apply (no numpy, headers, damage...): the
    caller then decodes batch by batch with :func:`batch_section`, which gives the same records and
    raises the precise error."""
    if not HAVE_NUMPY or not batches:
        return None
    # compressed batches (defer=True) are decompressed here, as their records are read, into one bytes
    if not unpack_group(batches):
        return None  # batch_section raises the precise error
    secs = [b.section for b in batches]
    buf = secs[0][0]  # type: ignore[index]
    if type(buf) is bytes and all(sec[0] is buf for sec in secs):  # type: ignore[index]
        # one bytes for all: the Fetch blob (uncompressed), or unpack_group's (all compressed), decoded in place
        spans = [(sec[1], sec[2], b.header) for sec, b in zip(secs, batches)]  # type: ignore[index]
    else:  # decompressed bodies in the codec's buffers, or views of the receive buffer (defer):
        # joined into one bytes (the copy into bytes that batch_section would make anyway, made as
        # the records are read: hot in the cache), then one numpy pass
        spans = []
        pos = 0
        for sec, b in zip(secs, batches):
            size = sec[2] - sec[1]  # type: ignore[index]
            spans.append((pos, pos + size, b.header))
            pos += size
        buf = b"".join(sec[0] if sec[1] == 0 and sec[2] == len(sec[0])  # type: ignore[index]
                       else memoryview(sec[0])[sec[1]:sec[2]] for sec in secs)  # type: ignore[index]
    got = decode_spans(buf, spans)
    if got is None:
        return None
    offs, stamps, keys, values, counts = got
    out = []
    positions = position if isinstance(position, list) else [position] * len(batches)
    i = bi = 0
    for m in pieces if pieces is not None else [1] * len(batches):
        j = i + sum(counts[bi:bi + m])
        if all(b.header.base_offset >= at for b, at in zip(batches[bi:bi + m], positions[bi:bi + m])):
            if i == 0 and j == len(offs):  # the whole group: its lists as they are
                out.append((offs, stamps, keys, values, [None] * j))
            else:
                out.append((offs[i:j], stamps[i:j], keys[i:j], values[i:j], [None] * (j - i)))
        else:  # cut each batch to its position, as batch_section
            keep = []
            a = i
            for b, k, at in zip(batches[bi:bi + m], counts[bi:bi + m], positions[bi:bi + m]):
                s, e = a, a + k
                if b.header.base_offset < at:
                    while s < e and offs[s] < at:
                        s += 1
                keep.append((s, e))
                a = e
            cols = tuple(list(chain.from_iterable(col[s:e] for s, e in keep)) for col in (offs, stamps, keys, values))
            out.append((*cols, [None] * len(cols[0])))  # type: ignore[arg-type]
        i = j
        bi += m
    return out


def batch_columns(batch: Batch, partition: int, position: int) -> RecordColumns:
    """A batch from :func:`fetched_batches` decoded into columns, cut to the offsets at or
    after ``position`` (may be empty: compaction can leave a batch without such records)."""
    offs, stamps, keys, values, hs = batch_section(batch, partition, position)
    return RecordColumns(offs, stamps, keys, values, [h if h is not None else [] for h in hs])


def fetched_columns(data: bytes, partition: int, position: int, isolation_level: int,
                    aborted: list[tuple[int, int]], check_crc: bool = True
                    ) -> tuple[list[RecordColumns], list[Batch], int, int]:
    """:func:`fetched_records` as columns: the same batches, filter, checks and next position,
    but each kept data batch decoded by :func:`~oncelog.protocol.records.decode_columns`
    (no per-record objects) and cut to the offsets at or after ``position``.

    Returns ``(columns per kept batch with records, batches decoded, skipped aborted
    batches, next position)``: :func:`fetched_batches` then :func:`batch_columns`.
    """
    kept, batches, skipped, next_pos = fetched_batches(data, partition, position, isolation_level, aborted,
                                                       check_crc)
    out = [c for b in kept if (c := batch_columns(b, partition, position)).offsets]
    return out, batches, skipped, next_pos


def fetch_request(partitions: dict[str, list[tuple[int, int]]], isolation_level: int, *, max_wait_ms: int = 100,
                  min_bytes: int = 0, max_bytes: int = 4 << 20, partition_max_bytes: int = 4 << 20) -> dict[str, Any]:
    """A Fetch v4-v12 request body: ``partitions`` is ``{topic: [(partition, fetch offset)]}``."""
    return {
        "cluster_id": None, "replica_id": -1, "replica_state": None, "max_wait": max_wait_ms,
        "min_bytes": min_bytes, "max_bytes": max_bytes, "isolation_level": isolation_level, "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic": t, "topic_id": None, "partitions": [{
            "partition": p, "current_leader_epoch": -1, "fetch_offset": off, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": partition_max_bytes, "replica_directory_id": None}
            for p, off in parts]} for t, parts in partitions.items()],
        "forgotten_topics_data": [], "rack_id": ""}


def list_offsets_request(partitions: dict[str, list[tuple[int, int]]], isolation_level: int) -> dict[str, Any]:
    """A ListOffsets v1+ request body: ``partitions`` is ``{topic: [(partition, timestamp)]}``."""
    return {"replica_id": -1, "isolation_level": isolation_level,
            "topics": [{"name": t, "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": ts}
                                                  for p, ts in parts]} for t, parts in partitions.items()]}


# -- the IO shell ----------------------------------------------------------------------


class PartitionReader:
    """Reads whole partitions, from each partition's leader.

    ``config``: client properties for the connections, in practice the TLS and
    SASL ones (``security.protocol``, ``ssl.*``, ``sasl.*``; docs/client.md),
    checked as a consumer's (:class:`~oncelog.client.config.ConfigError`).
    """

    def __init__(self, bootstrap: str, timeout: float = 30.0, client_id: str = "oncelog-reader",
                 config: Mapping[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.client_id = client_id
        self.security = None
        if config:
            from oncelog.client.config import parse_config

            self.security = parse_config({**config, "bootstrap.servers": bootstrap}, "consumer").security
        self.conn = Connection(bootstrap, client_id=client_id, timeout=timeout, security=self.security)
        self._nodes: dict[int, Connection] = {}
        self._addresses: dict[int, str] = {}
        self._leaders: dict[tuple[str, int], int] = {}

    def __enter__(self) -> "PartitionReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for c in self._nodes.values():
            if c is not self.conn:
                c.close()
        self._nodes.clear()
        self.conn.close()

    # -- metadata ---------------------------------------------------------------

    def refresh(self, topic: str) -> list[int]:
        """Metadata for ``topic``: its partitions (sorted); remembers leaders and broker addresses."""
        v = self.conn.best_version(METADATA, METADATA_VERSIONS)
        md = self.conn.request(METADATA, v, {
            "topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False})
        for b in md.brokers:
            self._addresses[int(b.node_id)] = f"{b.host}:{b.port}"
        t = md.topics[0]
        if t.error_code:
            raise ReaderError(f"topic {topic}: {code_name(t.error_code)}", int(t.error_code))
        for p in t.partitions:
            self._leaders[(topic, int(p.partition_index))] = int(p.leader_id)
        return sorted(int(p.partition_index) for p in t.partitions)

    def partitions(self, topic: str) -> list[int]:
        return self.refresh(topic)

    def leader(self, topic: str, partition: int) -> Connection:
        node = self._leaders.get((topic, partition))
        if node is None:
            self.refresh(topic)
            node = self._leaders.get((topic, partition))
        if node is None or node < 0 or node not in self._addresses:
            raise ReaderError(f"{topic}-{partition}: no leader")
        conn = self._nodes.get(node)
        if conn is None:
            address = self._addresses[node]
            conn = self.conn if address == self.bootstrap else Connection(address, self.client_id, self.timeout,
                                                                           self.security)
            self._nodes[node] = conn
        return conn

    def _retry(self, topic: str, what: str, call: Any) -> Any:
        """Run ``call()`` -> (error_code, result); refresh metadata and retry on leadership errors."""
        deadline = time.monotonic() + self.timeout
        while True:
            code, result = call()
            if code == 0:
                return result
            if code not in _RETRIABLE or time.monotonic() > deadline:
                raise ReaderError(f"{what}: {code_name(code)}", code)
            time.sleep(0.2)
            self._leaders = {k: v for k, v in self._leaders.items() if k[0] != topic}
            self.refresh(topic)

    # -- ListOffsets -----------------------------------------------------------------

    def list_offset(self, topic: str, partition: int, timestamp: int, isolation_level: int = READ_UNCOMMITTED) -> int:
        """ListOffsets: ``EARLIEST`` (-2), ``LATEST`` (-1: the high watermark, or the LSO under read_committed)."""

        def call() -> tuple[int, int]:
            conn = self.leader(topic, partition)
            v = conn.best_version(LIST_OFFSETS, LIST_OFFSETS_VERSIONS)
            resp = conn.request(LIST_OFFSETS, v, list_offsets_request({topic: [(partition, timestamp)]},
                                                                      isolation_level))
            p = resp.topics[0].partitions[0]
            return int(p.error_code), int(p.offset)

        return self._retry(topic, f"ListOffsets {topic}-{partition}", call)

    # -- Fetch -----------------------------------------------------------------------

    def fetch(self, topic: str, partition: int, offset: int, isolation_level: int,
              max_bytes: int = 4 << 20) -> Any:
        """One Fetch of one partition from ``offset``; returns the decoded PartitionData entity."""

        def call() -> tuple[int, Any]:
            conn = self.leader(topic, partition)
            v = conn.best_version(FETCH, FETCH_VERSIONS)
            resp = conn.request(FETCH, v, fetch_request({topic: [(partition, offset)]}, isolation_level,
                                                        max_bytes=max_bytes, partition_max_bytes=max_bytes))
            if resp.error_code:
                return int(resp.error_code), None
            p = resp.responses[0].partitions[0]
            return int(p.error_code), p

        return self._retry(topic, f"Fetch {topic}-{partition}", call)

    def read_partition(self, topic: str, partition: int, isolation_level: int = READ_COMMITTED,
                       start: int | None = None, end: int | None = None) -> PartitionData:
        """Read ``[start, end)`` (default: log start to the LSO or high watermark, as of now).

        Under read_committed the records are filtered as a Java consumer
        filters them; ``markers`` lists every control batch either way.
        """
        if start is None:
            start = self.list_offset(topic, partition, EARLIEST)
        if end is None:
            end = self.list_offset(topic, partition, LATEST, isolation_level)
        out = PartitionData(topic, partition, start, end, [], [])
        pos = start
        empty = 0
        while pos < end:
            p = self.fetch(topic, partition, pos, isolation_level)
            aborted = [(int(a.producer_id), int(a.first_offset)) for a in (p.aborted_transactions or ())]
            records, batches, skipped, next_pos = fetched_records(bytes(p.records or b""), partition, pos,
                                                                  isolation_level, aborted)
            if not batches:
                empty += 1
                if empty > 50:
                    raise ReaderError(f"{topic}-{partition}: no data at offset {pos} below {end}")
                time.sleep(0.1)
                continue
            empty = 0
            out.batches += len(batches)
            out.markers.extend(b.marker for b in batches if b.marker is not None)
            out.skipped_aborted_batches += skipped
            out.records.extend(r for r in records if r.offset < end)
            pos = next_pos
        return out

    def read_topic(self, topic: str, isolation_level: int = READ_COMMITTED) -> list[PartitionData]:
        return [self.read_partition(topic, p, isolation_level) for p in self.partitions(topic)]

    # -- bounded reads and many-topic metadata (the Spark source) ----------------------

    def topic_partitions(self, topics: list[str] | None = None) -> dict[str, list[int] | None]:
        """One Metadata request: ``{topic: sorted partitions}``, None for a topic that does not exist.

        ``topics=None`` lists every topic the cluster reports except internal ones
        (as a Java consumer with ``exclude.internal.topics=true`` sees them).
        Remembers leaders and broker addresses, as :meth:`refresh` does.
        """
        v = self.conn.best_version(METADATA, METADATA_VERSIONS)
        md = self.conn.request(METADATA, v, {
            "topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False})
        for b in md.brokers:
            self._addresses[int(b.node_id)] = f"{b.host}:{b.port}"
        out: dict[str, list[int] | None] = {}
        for t in md.topics:
            if t.error_code:
                out[t.name] = None
                continue
            if topics is None and getattr(t, "is_internal", False):
                continue
            for p in t.partitions:
                self._leaders[(t.name, int(p.partition_index))] = int(p.leader_id)
            out[t.name] = sorted(int(p.partition_index) for p in t.partitions)
        return out

    def iter_range(self, topic: str, partition: int, start: int, end: int,
                   isolation_level: int = READ_COMMITTED, max_bytes: int = 4 << 20,
                   poll_timeout: float = 120.0, records: bool = True) -> Any:
        """Read offsets ``[start, end)``: yields, per Fetch, the data batches a consumer returns.

        Each yielded item is ``(batches, next position)``: the :class:`Batch`
        list (control batches and, under read_committed, aborted batches
        removed) has its ``records`` cut to ``[start, end)``, and may be empty
        when a Fetch held only markers or aborted data. Offsets are positions, not record counts:
        ``end`` may be a marker or an aborted record, and the read ends once the
        position reaches it. An offset below the log start raises
        :class:`ReaderError` with ``error_code`` 1 (OFFSET_OUT_OF_RANGE); no
        data at the position for ``poll_timeout`` seconds raises ReaderError.
        With ``records=False`` the batches carry ``raw`` (uncompressed) instead
        of records and are not cut: the caller cuts its columns to ``[start, end)``.
        """
        pos = start
        waited_since: float | None = None
        while pos < end:
            p = self.fetch(topic, partition, pos, isolation_level, max_bytes)
            batches = [b for b in decode_batches(bytes(p.records or b""), partition, records=records)
                       if b.header.last_offset >= pos]
            if not batches:
                now = time.monotonic()
                if waited_since is None:
                    waited_since = now
                elif now - waited_since > poll_timeout:
                    raise ReaderError(f"{topic}-{partition}: no data at offset {pos} below {end} "
                                      f"after {poll_timeout:g} s")
                time.sleep(0.05)
                continue
            waited_since = None
            if isolation_level == READ_COMMITTED:
                aborted = [(int(a.producer_id), int(a.first_offset)) for a in (p.aborted_transactions or ())]
                kept, _skipped = filter_read_committed(batches, aborted)
            else:
                kept = [b for b in batches if not b.header.is_control]
            out = []
            for b in kept:
                h = b.header
                if not records:
                    out.append(b)
                    continue
                if h.base_offset < pos or h.last_offset >= end:
                    b = Batch(h, [r for r in b.records if pos <= r.offset < end], b.marker)
                if b.records:
                    out.append(b)
            pos = batches[-1].header.next_offset
            yield out, pos
