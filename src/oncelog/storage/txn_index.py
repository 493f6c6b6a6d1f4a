"""Per-segment index of aborted transactions (``<base>.txnindex``), as Kafka's.

Each entry records one aborted transaction whose ABORT marker lies in the
segment: big-endian ``version i16 (0), producer_id i64, first_offset i64,
last_offset i64 (the marker's offset), last_stable_offset i64`` (34 bytes),
appended in increasing ``last_offset`` order. ``last_stable_offset`` is the
first offset of the oldest transaction of another producer still open when
the marker was written (the marker's offset + 1 when none was), so a search
for a fetch range ending at ``upper`` can stop at the first entry whose
``last_stable_offset >= upper``: every later abort belongs to a transaction
that started at or after it.

The file is created on the first append only (most segments never see an
abort). Entries are kept in memory as well; the file is read once, when the
segment is opened. A damaged tail (a torn or zero-filled entry after a crash)
is cut at the first entry that breaks the file's invariants (version 0,
``first_offset <= last_offset``, ``last_offset`` >= the segment's base offset
and strictly increasing): the partition rebuilds entries above its producer
snapshot by replaying the log, and entries below a snapshot were fsynced
before the snapshot was written.

Not thread-safe; the owning :class:`~oncelog.storage.log.PartitionLog`
serialises access.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from oncelog.storage.fileutil import fsync_dir, read_all, write_all

TXNINDEX_SUFFIX = ".txnindex"
CURRENT_VERSION = 0

_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size  # 34


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # offset of the ABORT marker
    last_stable_offset: int

    def pack(self) -> bytes:
        return _ENTRY.pack(CURRENT_VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)


class TransactionIndex:
    """The aborted transactions whose markers are in one segment."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entries: list[AbortedTxn] = []
        self._fd = -1
        self._dirty = False  # written (or truncated) since the last sync
        self._new_file = False  # created since the last sync (its directory entry is not durable yet)
        self._load()

    def __repr__(self) -> str:
        return f"TransactionIndex({self.path.name}, {len(self.entries)} entries)"

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def exists(self) -> bool:
        return self._fd >= 0 or self.path.exists()

    @property
    def last_offset(self) -> int:
        return self.entries[-1].last_offset if self.entries else -1

    def _load(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            raw = read_all(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
        good = 0
        prev_last = -1
        for pos in range(0, len(raw) - ENTRY_SIZE + 1, ENTRY_SIZE):
            version, pid, first, last, lso = _ENTRY.unpack_from(raw, pos)
            if version != CURRENT_VERSION or last < self.base_offset or first > last or last <= prev_last:
                break
            self.entries.append(AbortedTxn(pid, first, last, lso))
            prev_last = last
            good = pos + ENTRY_SIZE
        if good < len(raw):
            os.truncate(self.path, good)
            self._dirty = True

    # -- writes ------------------------------------------------------------------

    def _open(self) -> int:
        if self._fd < 0:
            created = not self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._new_file |= created
        return self._fd

    def append(self, txn: AbortedTxn) -> None:
        """Add an entry; its ``last_offset`` must exceed every earlier one (else ValueError)."""
        if self.entries and txn.last_offset <= self.entries[-1].last_offset:
            raise ValueError(
                f"aborted transaction last offset {txn.last_offset} is not above {self.entries[-1].last_offset} "
                f"in {self.path}"
            )
        if txn.last_offset < self.base_offset:
            raise ValueError(f"aborted transaction last offset {txn.last_offset} is below the segment base {self.base_offset}")
        write_all(self._open(), txn.pack())
        self.entries.append(txn)
        self._dirty = True

    def truncate(self, offset: int) -> int:
        """Drop the entries with ``last_offset >= offset``; returns how many were dropped."""
        keep = len(self.entries)
        while keep and self.entries[keep - 1].last_offset >= offset:
            keep -= 1
        dropped = len(self.entries) - keep
        if dropped:
            del self.entries[keep:]
            if self._fd >= 0:
                os.ftruncate(self._fd, keep * ENTRY_SIZE)
            else:
                os.truncate(self.path, keep * ENTRY_SIZE)
            self._dirty = True
        return dropped

    # -- reads -------------------------------------------------------------------

    def collect(self, fetch_offset: int, upper_offset: int) -> tuple[list[AbortedTxn], bool]:
        """Aborted transactions overlapping ``[fetch_offset, upper_offset)``.

        Returns ``(entries, complete)``; ``complete`` means later segments
        cannot hold more (Kafka's ``TxnIndexSearchResult.isComplete``).
        """
        found = []
        for txn in self.entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_offset:
                found.append(txn)
            if txn.last_stable_offset >= upper_offset:
                return found, True
        return found, False

    # -- durability and lifecycle ---------------------------------------------------

    @property
    def dirty(self) -> bool:
        return self._dirty

    def sync_fd(self) -> int | None:
        """A fresh fd of the file to fdatasync (owned by the caller), or None if there is no file."""
        if self._fd >= 0:
            return os.dup(self._fd)
        try:
            return os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None

    def take_dirty(self) -> tuple[bool, bool]:
        """Clear and return ``(dirty, new_file)`` (the caller syncs, or calls :meth:`mark_dirty` on failure)."""
        state = (self._dirty, self._new_file)
        self._dirty = self._new_file = False
        return state

    def mark_dirty(self, new_file: bool = False) -> None:
        self._dirty = True
        self._new_file |= new_file

    def sync(self) -> None:
        """fdatasync the file (and its directory when it is new) if anything changed."""
        dirty, new_file = self.take_dirty()
        if not dirty and not new_file:
            return
        fd = self.sync_fd()
        try:
            if fd is not None:
                os.fdatasync(fd)
            if new_file:
                fsync_dir(self.path.parent)
        except BaseException:
            self.mark_dirty(new_file)
            raise
        finally:
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        self.entries.clear()
        self.path.unlink(missing_ok=True)
