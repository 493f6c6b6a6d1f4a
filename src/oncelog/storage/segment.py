"""One log segment: ``<base>.log``, a sparse ``.index`` and ``.timeindex``, and
(only once a transaction is aborted in it) a ``.txnindex``.

* ``.log``: record batches back to back, exactly as produced (base offsets patched).
* ``.index``: big-endian (relative offset u32, file position u32) pairs, one per
  ``index_interval_bytes`` of appended data, keyed by the batch's base offset.
* ``.timeindex``: big-endian (timestamp i64, relative offset u32); an entry says
  "every batch up to and including the one at this offset has maxTimestamp <=
  timestamp".  Written together with ``.index`` entries when the maximum grows.

* ``.txnindex``: the aborted transactions whose ABORT markers are in this
  segment (see :mod:`oncelog.storage.txn_index`).

The offset and time indexes are kept in memory (arrays) and written through;
they can always be rebuilt by scanning the batch headers of the ``.log`` file.
The transaction index cannot (it needs producer state): the partition rebuilds
its entries above the producer snapshot it recovers from, and syncs it before
writing a snapshot. All three are fsynced with the sealed segment and on
close, except an offset or time index this process never wrote: its content is
on disk already (an earlier run synced it, or recovery rewrote it, which counts
as a write).

File descriptors: a segment holds its ``.log`` open for its whole life. The
index files are created with the segment (empty), but their descriptors are
only opened when the first entry is appended (:class:`LazyFile`, Kafka's
``LazyIndex`` idea) and closed again when the segment is sealed. Lookups use
the in-memory arrays; loading reads the files, and recovery rewrites them,
through short-lived descriptors. So an idle partition (an empty one, or one
not written to since it was opened) holds one descriptor: its active
``.log``. The ``.txnindex`` likewise is opened on its first entry only.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from pathlib import Path

from crc32c import crc32c

from oncelog.protocol.records import (
    CRC_START,
    HEADER_SIZE,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    BatchHeader,
    iter_batch_headers,
    parse_batch_header,
)
from oncelog.storage.fileutil import read_all, write_all
from oncelog.storage.txn_index import TXNINDEX_SUFFIX, TransactionIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"

_INDEX_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")
_HEADER = struct.Struct(">qiibIhiqqqhii")
_LOOKUP_CHUNK = 8192
_SCAN_CHUNK = 1 << 20
MAX_RELATIVE_OFFSET = 0x7FFFFFFF


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def walk_batches(
    fd: int, start: int, end: int, chunk: int, *, with_data: bool = False
) -> Iterator[tuple[BatchHeader, int, memoryview | bytes]]:
    """Yield ``(header, position, batch)`` for each structurally complete batch in the
    file ``fd`` between ``start`` and ``end``.

    ``batch`` (the whole batch's bytes) is only filled when ``with_data``.
    Stops at an impossible length or a batch running past ``end``.
    """
    buf: bytes = b""
    buf_pos = start
    pos = start
    unpack = _HEADER.unpack_from
    while pos + HEADER_SIZE <= end:
        rel = pos - buf_pos
        if rel < 0 or rel + HEADER_SIZE > len(buf):
            buf = read_all(fd, min(chunk, end - pos), pos)
            buf_pos, rel = pos, 0
            if len(buf) < HEADER_SIZE:
                return
        hdr = BatchHeader(*unpack(buf, rel))
        if hdr.batch_length < MIN_BATCH_LENGTH:
            return
        bend = pos + hdr.size
        if bend > end:
            return
        data: memoryview | bytes = b""
        if with_data:
            if bend - buf_pos <= len(buf):
                data = memoryview(buf)[rel : bend - buf_pos]
            else:
                data = read_all(fd, hdr.size, pos)
        yield hdr, pos, data
        pos = bend


class LazyFile:
    """An append-only file whose descriptor is opened on the first write and then
    kept until :meth:`close`.

    ``written`` remembers that this process changed the file (it stays set
    after :meth:`close`): only then can the page cache hold data of the file
    that is not on disk yet, so only then does :meth:`sync_fd` return a
    descriptor. Not thread-safe; the owning segment serialises access.
    """

    __slots__ = ("path", "fd", "written")

    _FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT

    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = path
        self.fd = -1
        self.written = False
        if create:
            os.close(os.open(path, self._FLAGS, 0o644))

    def _open(self) -> int:
        if self.fd < 0:
            self.fd = os.open(self.path, self._FLAGS, 0o644)
        self.written = True
        return self.fd

    def append(self, data: bytes) -> None:
        write_all(self._open(), data)

    def read(self) -> bytes:
        """The whole file (created empty if missing); does not keep a descriptor open."""
        if self.fd >= 0:
            return read_all(self.fd, os.fstat(self.fd).st_size, 0)
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            return read_all(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)

    def replace(self, data: bytes) -> None:
        """Make ``data`` the whole content. Through the open descriptor if there is
        one, else a short-lived one: rebuilding indexes (recovery) opens nothing
        that stays open."""
        if self.fd >= 0:
            os.ftruncate(self.fd, 0)
            write_all(self.fd, data)
            self.written = True
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if data or os.fstat(fd).st_size:
                os.ftruncate(fd, 0)
                write_all(fd, data)
                self.written = True
        finally:
            os.close(fd)

    def sync_fd(self) -> int | None:
        """A fresh descriptor to fdatasync (owned by the caller), or None when this
        process never changed the file (or it is gone)."""
        if self.fd >= 0:
            return os.dup(self.fd)
        if not self.written:
            return None
        try:
            return os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Segment:
    """A ``.log`` file with its in-memory sparse indexes.

    Not thread-safe; the owning :class:`PartitionLog` serialises access.
    ``existing=True`` opens a segment found on disk, to be :meth:`load`-ed
    (which creates missing index files); otherwise the index files are
    created empty now.
    """

    def __init__(
        self, directory: Path, base_offset: int, index_interval_bytes: int, *, existing: bool = False, suffix: str = ""
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.suffix = suffix  # ".cleaned" while the log cleaner writes it (see storage/log.py)
        self.log_path, self.index_path, self.timeindex_path, txn_path = self.file_paths(suffix)
        self.txn_index = TransactionIndex(txn_path, base_offset)
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._index_file = LazyFile(self.index_path, create=not existing)
        self._time_file = LazyFile(self.timeindex_path, create=not existing)
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.created_ms: int | None = None  # wall time of the first append
        self._idx_off = array("I")
        self._idx_pos = array("I")
        self._ts = array("q")
        self._ts_off = array("I")
        self._bytes_since_index = 0
        self._last_base = base_offset
        self._hint = (-1, 0)  # (offset, position) where the last read stopped

    def __repr__(self) -> str:
        return f"Segment({self.base_offset}, size={self.size}, next={self.next_offset})"

    def file_paths(self, suffix: str) -> tuple[Path, Path, Path, Path]:
        """``.log``, ``.index``, ``.timeindex`` and ``.txnindex`` paths, each + ``suffix``."""
        stem = segment_name(self.base_offset)
        return tuple(  # type: ignore[return-value]
            self.directory / (stem + ext + suffix) for ext in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX)
        )

    def set_suffix(self, suffix: str) -> None:
        """The files were renamed to carry ``suffix``: follow them (open descriptors stay valid)."""
        self.suffix = suffix
        self.log_path, self.index_path, self.timeindex_path, txn_path = self.file_paths(suffix)
        self._index_file.path = self.index_path
        self._time_file.path = self.timeindex_path
        self.txn_index.path = txn_path

    # -- loading and recovery ------------------------------------------------

    def load(self, now_ms: int, *, full_recovery: bool) -> int:
        """Establish size/offsets/indexes from disk; returns bytes truncated.

        With ``full_recovery`` (or when the index files look wrong) every batch
        is CRC-checked and the file is cut at the first bad one.  Otherwise the
        indexes are trusted and only the batches after the last index entry are
        checked; they must end exactly at end of file.
        """
        file_size = os.fstat(self.fd).st_size
        if not full_recovery and self._load_indexes(file_size):
            start = self._idx_pos[-1] if self._idx_pos else 0
            end = self._scan(start, file_size, self._first_expected(start), tail_only=True)
            ts_ok = not self._ts_off or self.base_offset + self._ts_off[-1] < self.next_offset
            if end == file_size and ts_ok:
                self._set_created(now_ms)
                return 0
        return self.rebuild(now_ms)

    def rebuild(self, now_ms: int) -> int:
        """Rescan the whole file with CRC checks, truncate any bad tail, rewrite indexes."""
        file_size = os.fstat(self.fd).st_size
        self._reset_indexes()
        end = self._scan(0, file_size, self.base_offset, tail_only=False)
        if end < file_size:
            os.ftruncate(self.fd, end)
        self._index_file.replace(b"".join(_INDEX_ENTRY.pack(o, p) for o, p in zip(self._idx_off, self._idx_pos)))
        self._time_file.replace(b"".join(_TIME_ENTRY.pack(t, o) for t, o in zip(self._ts, self._ts_off)))
        self._set_created(now_ms)
        return file_size - end

    def _first_expected(self, start: int) -> int:
        if start == 0 or not self._idx_off:
            return self.base_offset
        return self.base_offset + self._idx_off[-1]

    def _set_created(self, now_ms: int) -> None:
        if self.size == 0:
            self.created_ms = None
            return
        first = parse_batch_header(read_all(self.fd, HEADER_SIZE, 0))
        self.created_ms = min(first.max_timestamp, now_ms) if first.max_timestamp >= 0 else now_ms

    def _reset_indexes(self) -> None:
        for arr in (self._idx_off, self._idx_pos, self._ts, self._ts_off):
            del arr[:]
        self.size = 0
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self._bytes_since_index = 0
        self._hint = (-1, 0)

    def _load_indexes(self, file_size: int) -> bool:
        """Read both index files; False if they are inconsistent."""
        self._reset_indexes()
        raw = self._index_file.read()
        raw = raw[: len(raw) - len(raw) % _INDEX_ENTRY.size]
        prev_off, prev_pos = -1, -1
        for off, pos in _INDEX_ENTRY.iter_unpack(raw):
            if off <= prev_off or pos <= prev_pos or pos >= file_size:
                return False
            self._idx_off.append(off)
            self._idx_pos.append(pos)
            prev_off, prev_pos = off, pos
        raw = self._time_file.read()
        raw = raw[: len(raw) - len(raw) % _TIME_ENTRY.size]
        prev_ts, prev_off = -(2**63), -1
        for ts, off in _TIME_ENTRY.iter_unpack(raw):
            if ts <= prev_ts or off < prev_off:
                return False
            self._ts.append(ts)
            self._ts_off.append(off)
            prev_ts, prev_off = ts, off
        if self._ts:
            self.max_timestamp = self._ts[-1]
        if self._idx_pos:
            self.size = self._idx_pos[-1]
            self.next_offset = self.base_offset + self._idx_off[-1]
        return True

    def _scan(self, start: int, end: int, expected: int, *, tail_only: bool) -> int:
        """CRC-check and track batches from ``start``; return where the valid run ends.

        With ``tail_only`` the indexes up to ``start`` are already loaded: the
        batch at ``start`` must carry exactly ``expected`` as base offset, and
        new index entries are written through.  Otherwise indexes are rebuilt
        in memory only (the caller rewrites the files).
        """
        pos = start
        self._bytes_since_index = 0
        for hdr, bpos, data in self._walk(start, end, _SCAN_CHUNK, with_data=True):
            if hdr.magic != MAGIC_V2 or hdr.base_offset < expected or hdr.last_offset_delta < 0:
                break
            if tail_only and bpos == start and hdr.base_offset != expected:
                break
            if hdr.last_offset - self.base_offset > MAX_RELATIVE_OFFSET:
                break
            if crc32c(data[CRC_START:]) != hdr.crc:
                break
            self.track(hdr.base_offset, hdr.next_offset, hdr.max_timestamp, bpos, hdr.size, write=tail_only)
            expected = hdr.next_offset
            pos = bpos + hdr.size
        return pos

    def _walk(
        self, start: int, end: int, chunk: int, *, with_data: bool = False
    ) -> Iterator[tuple[BatchHeader, int, memoryview | bytes]]:
        """Yield ``(header, position, batch)`` for each structurally complete batch
        (:func:`walk_batches` on this segment's descriptor)."""
        return walk_batches(self.fd, start, end, chunk, with_data=with_data)

    # -- appends --------------------------------------------------------------

    def append(
        self, parts: list[bytes | memoryview], size: int, base_offset: int, next_offset: int, max_ts: int, now_ms: int
    ) -> int:
        """Write one batch (given as buffers, already patched) and index it; returns its position."""
        pos = self.size
        try:
            written = os.writev(self.fd, parts)
            if written != size:
                write_all(self.fd, b"".join(bytes(p) for p in parts)[written:])
        except BaseException:
            os.ftruncate(self.fd, pos)  # never leave a torn batch behind a live log
            raise
        if self.created_ms is None:
            self.created_ms = now_ms
        self.track(base_offset, next_offset, max_ts, pos, size, write=True)
        return pos

    def track(self, base_offset: int, next_offset: int, max_ts: int, pos: int, size: int, *, write: bool) -> None:
        """Account for a batch at ``pos``; add sparse index entries when due."""
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
        if self._bytes_since_index > self.index_interval_bytes:
            rel = base_offset - self.base_offset
            self._idx_off.append(rel)
            self._idx_pos.append(pos)
            if write:
                self._index_file.append(_INDEX_ENTRY.pack(rel, pos))
            self._add_time_entry(rel, write)
            self._bytes_since_index = 0
        self._bytes_since_index += size
        self.size = pos + size
        self.next_offset = next_offset
        self._last_base = base_offset

    def _add_time_entry(self, rel: int, write: bool) -> None:
        if self.max_timestamp >= 0 and (not self._ts or self.max_timestamp > self._ts[-1]):
            self._ts.append(self.max_timestamp)
            self._ts_off.append(rel)
            if write:
                self._time_file.append(_TIME_ENTRY.pack(self.max_timestamp, rel))

    def seal(self) -> None:
        """The segment stops being active: record its final max timestamp, release index fds."""
        self._add_time_entry(self._last_base - self.base_offset, True)
        self.release_index_files()

    def release_index_files(self) -> None:
        """Close the index fds that are open (sealed segments never write them again)."""
        self._index_file.close()
        self._time_file.close()
        self.txn_index.close()

    def largest_timestamp(self) -> int:
        """Largest batch timestamp, or the file's mtime if no batch has one (Kafka's rule)."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.fstat(self.fd).st_mtime * 1000)

    def fits(self, size: int, last_offset: int, segment_bytes: int) -> bool:
        """Can a batch of ``size`` bytes ending at ``last_offset`` go here?"""
        if self.size == 0:
            return True
        return self.size + size <= segment_bytes and last_offset - self.base_offset <= MAX_RELATIVE_OFFSET

    # -- reads ----------------------------------------------------------------

    def _index_floor(self, offset: int) -> int:
        i = bisect_right(self._idx_off, offset - self.base_offset) - 1
        return self._idx_pos[i] if i >= 0 else 0

    def find(self, offset: int) -> int | None:
        """Position of the batch holding ``offset`` (or the first batch after it), None if past the end."""
        if offset >= self.next_offset:
            return None
        if self._hint[0] == offset:
            return self._hint[1]
        start = self._index_floor(offset) if offset > self.base_offset else 0
        for hdr, pos, _ in self._walk(start, self.size, _LOOKUP_CHUNK):
            if hdr.base_offset + hdr.last_offset_delta >= offset:
                return pos
        return None

    def read_at(
        self, pos: int, max_bytes: int, max_offset: int | None, min_one: bool
    ) -> tuple[bytes, int, bool]:
        """Whole batches from ``pos``: ``(data, next_offset, more)``.

        ``more`` is True when reading stopped only because the segment ended.
        ``next_offset`` is the offset after the last returned batch (-1 if none).
        """
        avail = self.size - pos
        if avail <= 0:
            return b"", -1, True
        data = read_all(self.fd, min(max_bytes, avail), pos) if max_bytes > 0 else b""
        cut, nxt, limited = 0, -1, False
        for hdr, _s, e in iter_batch_headers(data):
            if max_offset is not None and hdr.base_offset + hdr.last_offset_delta >= max_offset:
                limited = True
                break
            cut, nxt = e, hdr.base_offset + hdr.last_offset_delta + 1
        if cut == 0 and min_one and not limited:
            hdr = parse_batch_header(data if len(data) >= HEADER_SIZE else read_all(self.fd, HEADER_SIZE, pos))
            if max_offset is not None and hdr.last_offset >= max_offset:
                limited = True
            else:
                data = read_all(self.fd, hdr.size, pos)
                cut, nxt = hdr.size, hdr.next_offset
        if cut < len(data):
            data = data[:cut]
        if nxt >= 0:
            self._hint = (nxt, pos + cut)
        return data, nxt, (not limited and pos + cut == self.size)

    def find_timestamp(self, ts: int) -> tuple[BatchHeader, int] | None:
        """First batch whose maxTimestamp >= ``ts``, with its position."""
        if self.max_timestamp < ts:
            return None
        i = bisect_left(self._ts, ts) - 1  # last entry with timestamp < ts
        start = self._index_floor(self.base_offset + self._ts_off[i]) if i >= 0 else 0
        for hdr, pos, _ in self._walk(start, self.size, _LOOKUP_CHUNK):
            if hdr.max_timestamp >= ts:
                return hdr, pos
        return None

    def iter_batches(self, start: int = 0) -> Iterator[tuple[BatchHeader, int, memoryview | bytes]]:
        """Yield ``(header, position, whole batch bytes)`` from ``start``."""
        yield from self._walk(start, self.size, _SCAN_CHUNK, with_data=True)

    def read_batch(self, pos: int, size: int) -> bytes:
        return read_all(self.fd, size, pos)

    # -- lifecycle --------------------------------------------------------------

    def sync_fds(self, *, with_indexes: bool) -> list[int]:
        """Fresh fds to fdatasync, owned by the caller (safe even if the segment
        is closed or deleted meanwhile). An index file this process never
        wrote has nothing to sync and is not opened."""
        fd = os.dup(self.fd)
        if not with_indexes:
            return [fd]
        try:
            return [fd, *self.index_sync_fds()]
        except BaseException:  # EMFILE, say: the .log's dup is not left open either
            os.close(fd)
            raise

    def index_sync_fds(self) -> list[int]:
        """Fresh fds of the index files to fdatasync, owned by the caller (see :meth:`sync_fds`)."""
        fds: list[int] = []
        try:
            for index in (self._index_file, self._time_file, self.txn_index):
                f = index.sync_fd()
                if f is not None:
                    fds.append(f)
        except BaseException:  # EMFILE, say: none of those opened so far is left open
            for f in fds:
                os.close(f)
            raise
        return fds

    def close(self) -> None:
        self.release_index_files()
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def delete(self, *, keep_log_fd: bool = False) -> None:
        """Close the files and remove them. ``keep_log_fd``: leave the ``.log``
        descriptor open (a running fdatasync uses it; its owner closes it later)."""
        if keep_log_fd:
            self.release_index_files()
        else:
            self.close()
        for path in (self.log_path, self.index_path, self.timeindex_path):
            path.unlink(missing_ok=True)
        self.txn_index.delete()

