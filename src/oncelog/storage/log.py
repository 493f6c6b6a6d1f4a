"""A durable, segmented partition log modelled on Kafka's.

Threading: every method runs on one thread (the event loop) except
:meth:`PartitionLog.sync`, which may run in a worker thread concurrently with
appends, rolls and retention.  Group commit works like this::

    end = await loop.run_in_executor(pool, log.sync)   # fdatasync outside the loop
    # every append that returned before sync() was called is durable now (< end)

Files in the partition directory besides the segments:

* ``log-start-offset``: checkpoint of the log start offset (retention moves it);
* ``recovery-point``: every segment below this base offset was fsynced whole,
  so an unclean restart only fully CRC-scans segments from here on;
* ``.clean_shutdown``: written by :meth:`close`; when present on open, no
  segment needs a full scan;
* ``leader-epoch-checkpoint``: the leader-epoch cache
  (:mod:`oncelog.storage.leader_epoch`), truncated on open to the recovered
  log and moved along with the log start offset (rebuilt from the batch headers
  when the file is missing or corrupt). :meth:`become_leader` starts
  a new epoch at the log end offset; every batch appended afterwards carries
  it in its ``partitionLeaderEpoch`` header field (outside the CRC, which
  covers attributes onwards, so patching it needs no new CRC).

Recovery that cuts a segment short (or finds a segment not starting where the
one before ends) deletes every later segment, with a warning, as Kafka's
``LogLoader`` does: the offsets never have a hole.

Listeners: ``on_roll(new_base)`` after every roll and
``on_segments_deleted(bases)`` after retention or DeleteRecords deleted
segments, so the partition can snapshot its producer state on each roll and
drop the snapshots of deleted segments (storage knows nothing of producers).

Compaction (:mod:`oncelog.storage.cleaner`; the broker's cleaner writes each
group of segments' replacement as ``<base>.*.cleaned`` files) swaps the
cleaned segments of a pass in, Kafka's way, in steps each safe against
kill -9:

1. ``cleaned``: the new files are complete and fsynced;
2. ``swapend``: ``cleaner-swap`` durably lists each group's base and end
   offsets (so recovery knows exactly which old segments each replaces), and
   ``cleaned-end-offset`` is raised to the last end;
3. ``swap``: ``.cleaned`` renamed to ``.swap`` (each log file last), directory
   fsynced: from here on the swaps are committed;
4. ``install-deleted`` / ``install`` (on the event loop, one group at a
   time, renames only): the old segments' files renamed to ``.deleted``, the
   ``.swap`` files to their final names, the segment list replaced in memory;
5. ``finish``: directory fsynced, ``.deleted`` files and ``cleaner-swap``
   removed.

On open, each group listed in ``cleaner-swap`` whose ``.log.swap`` is present
is rolled forward (old segments in ``[base, end)`` deleted, ``.swap`` renamed),
one whose ``.log.cleaned`` is still there is rolled back, one with neither has
its deletions finished; leftover ``.cleaned``, ``.swap`` and ``.deleted`` files
are removed. A group entirely below the log start offset is rolled back.
Compaction leaves offset gaps, also between segments: a segment starting at
or below ``cleaned-end-offset`` may start after the previous one ends.
``cleaner-offset-checkpoint`` holds the first dirty offset (Kafka keeps it per
log directory; here per partition).

Aborted transactions: each segment's ``.txnindex`` lists the aborted
transactions whose ABORT markers it holds. The log only stores and searches
them (:meth:`append_aborted_txn`, :meth:`collect_aborted_txns`,
:meth:`truncate_txn_indexes`, :meth:`sync_txn_indexes`); deciding what was
aborted is the partition's job. On open, entries for markers beyond the
recovered log end are dropped.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import struct
import threading
import uuid
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from pathlib import Path

from oncelog.protocol.compression import decompressed_batch
from oncelog.protocol.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_LOG_APPEND_TIME,
    BatchHeader,
    InvalidRecordError,
    iter_records,
    log_append_time_header,
    parse_batch_header,
)
from oncelog.storage.cleaner import SegmentInfo
from oncelog.storage.config import LOG_APPEND_TIME, LogConfig
from oncelog.storage.fileutil import atomic_write, fsync_dir, write_all
from oncelog.storage.leader_epoch import LeaderEpochCache
from oncelog.storage.log_dir import (
    DescriptorShortageError,
    LogClosedError,
    LogDirFailureChannel,
    guarded,
    is_descriptor_shortage,
)
from oncelog.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, Segment, segment_name, walk_batches
from oncelog.storage.txn_index import TXNINDEX_SUFFIX, AbortedTxn

CLEAN_SHUTDOWN_FILE = ".clean_shutdown"
LOG_START_FILE = "log-start-offset"
RECOVERY_POINT_FILE = "recovery-point"
DELETE_SUFFIX = "-delete"
_NAME_MAX = 255  # the longest file name (bytes) of Linux file systems


def delete_dir_name(name: str) -> str:
    """``<topic>-<partition>.<id>-delete`` for the log directory ``name``, the topic part cut
    so the whole fits in 255 bytes (Kafka's ``logDeleteDirName``, KAFKA-4893): a legal topic
    name has up to 249 characters, and the suffix adds 40 more."""
    topic, dash, partition = name.rpartition("-")
    if not dash or not partition.isdigit():
        topic, partition = name, ""
    suffix = f"{dash}{partition}.{uuid.uuid4().hex}{DELETE_SUFFIX}"
    head = topic.encode()[: max(0, _NAME_MAX - len(suffix.encode()))].decode(errors="ignore")
    return head + suffix
OFFSET_OUT_OF_RANGE = 1
# log compaction (see "Compaction" in the module docstring)
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
SWAP_MANIFEST = "cleaner-swap"
CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"
CLEANED_END_FILE = "cleaned-end-offset"
CRASH_ENV = "ONCELOG_CLEANER_CRASH_AT"  # test hook: os._exit at this step of a swap
SWAP_STEPS = ("cleaned", "swapend", "swap", "install-deleted", "install", "finish")
_SEGMENT_EXTS = (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX)

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")

logger = logging.getLogger(__name__)


class OffsetOutOfRangeError(Exception):
    """Fetch offset outside [log_start_offset, log_end_offset] (Kafka error 1)."""

    error_code = OFFSET_OUT_OF_RANGE

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


@dataclass(slots=True)
class AppendInfo:
    base_offset: int
    last_offset: int
    log_append_time_ms: int  # -1 unless the log uses LogAppendTime
    max_timestamp: int
    position: int  # byte position inside the segment
    segment_base_offset: int
    size: int


@dataclass(slots=True)
class ReadResult:
    data: bytes  # whole batches, possibly empty
    first_offset: int  # base offset of the first batch returned (the requested offset if none)
    next_offset: int  # offset after the last batch returned (the requested offset if none)
    log_start_offset: int
    log_end_offset: int


def _read_checkpoint(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _batch_epochs(segments: list[Segment]) -> Iterator[tuple[int, int]]:
    """``(partitionLeaderEpoch, base offset)`` of every batch, in offset order (headers only)."""
    for seg in segments:
        for hdr, _pos, _data in walk_batches(seg.fd, 0, seg.size, 1 << 16):
            yield hdr.partition_leader_epoch, hdr.base_offset


def _delete_segments_after(directory: Path, kept: Segment, bases: list[int]) -> None:
    """Recovery: delete the segments at ``bases`` (all after ``kept``, which now ends the log)."""
    logger.warning(
        "%s: recovery found segment %s ending at offset %d; deleting the %d segment(s) after it "
        "so the offsets stay contiguous: %s",
        directory.name,
        segment_name(kept.base_offset),
        kept.next_offset,
        len(bases),
        ", ".join(segment_name(b) + LOG_SUFFIX for b in bases),
    )
    for base in bases:
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX):
            (directory / (segment_name(base) + suffix)).unlink(missing_ok=True)
    fsync_dir(directory)


def crash_point(step: str) -> None:
    """Test hook: ``ONCELOG_CLEANER_CRASH_AT=<step>`` kills the process (as kill -9 would)
    at that step of a cleaner swap (:data:`SWAP_STEPS`)."""
    if os.environ.get(CRASH_ENV) == step:
        os._exit(137)


_F = TypeVar("_F", bound=Callable[..., Any])


def _log_dir_io(what: str) -> Callable[[_F], _F]:
    """Run a :class:`PartitionLog` method under :meth:`PartitionLog.io` (``what`` names it)."""

    def wrap(method: _F) -> _F:
        @functools.wraps(method)
        def under_io(self: PartitionLog, *args: Any, **kwargs: Any) -> Any:
            with self.io(what):
                return method(self, *args, **kwargs)

        return under_io  # type: ignore[return-value]

    return wrap


def _paths(directory: Path, base: int, suffix: str = "") -> list[Path]:
    return [directory / (segment_name(base) + ext + suffix) for ext in _SEGMENT_EXTS]


def _read_manifest(path: Path) -> list[tuple[int, int]]:
    try:
        lines = path.read_text().split("\n")
    except (OSError, UnicodeDecodeError):
        return []
    groups = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            groups.append((int(parts[0]), int(parts[1])))
    return groups


def _recover_swaps(directory: Path, log_start: int | None) -> None:
    """Finish or roll back the cleaner swaps a crash interrupted (see the module docstring)."""
    changed = False
    for p in directory.glob("*" + DELETED_SUFFIX):
        p.unlink(missing_ok=True)
        changed = True
    manifest = directory / SWAP_MANIFEST
    for base, end in _read_manifest(manifest):
        stem = segment_name(base)
        swapped = (directory / (stem + LOG_SUFFIX + SWAP_SUFFIX)).exists()
        cleaned = (directory / (stem + LOG_SUFFIX + CLEANED_SUFFIX)).exists()
        old = [int(p.stem) for p in directory.glob("*" + LOG_SUFFIX) if p.stem.isdigit() and base <= int(p.stem) < end]
        if swapped and (log_start is None or end > log_start):
            logger.warning("%s: completing an interrupted compaction swap of offsets [%d, %d)", directory.name, base, end)
            for b in old:
                for path in _paths(directory, b):
                    path.unlink(missing_ok=True)
            for path in reversed(_paths(directory, base, SWAP_SUFFIX)):  # indexes first, the log last
                if path.exists():
                    os.rename(path, path.with_name(path.name[: -len(SWAP_SUFFIX)]))
        elif not swapped and not cleaned:
            # the .swap files got their final names: only old segments after the base may be left
            for b in old:
                if b != base:
                    for path in _paths(directory, b):
                        path.unlink(missing_ok=True)
        else:
            logger.warning("%s: rolling back an interrupted compaction of offsets [%d, %d)", directory.name, base, end)
        changed = True
    if manifest.exists():
        manifest.unlink()
        changed = True
    for suffix in (CLEANED_SUFFIX, SWAP_SUFFIX):
        for p in directory.glob("*" + suffix):
            p.unlink(missing_ok=True)
            changed = True
    if changed:
        fsync_dir(directory)


@dataclass(slots=True)
class PinnedSegment:
    """A segment as the cleaner sees it: its own descriptor (valid even if the log
    deletes or replaces the segment meanwhile) and the base of the segment after it."""

    segment: Segment
    base_offset: int
    next_base: int
    size: int
    fd: int

    def batches(self) -> Iterator[tuple[BatchHeader, memoryview | bytes]]:
        for hdr, _pos, data in walk_batches(self.fd, 0, self.size, 1 << 20, with_data=True):
            yield hdr, data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PartitionLog:
    """Segments of one partition in ``directory`` (see module docstring)."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[Segment],
        log_start_offset: int,
        leader_epochs: LeaderEpochCache | None = None,
    ) -> None:
        self.directory = directory
        self.config = config
        self.segments = segments
        self._bases = [s.base_offset for s in segments]
        self._log_start = log_start_offset
        self._size = sum(s.size for s in segments)
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one sync at a time; taken before _lock
        self._unsynced: dict[Segment, None] = {}  # ordered set of segments with unsynced writes
        # segments whose .log descriptor the running sync fdatasyncs (no dup): closing one of
        # them (retention, DeleteRecords, a cleaner install) waits in _close_after_sync
        self._in_sync: dict[Segment, None] = {}
        self._close_after_sync: list[Segment] = []
        self._dir_dirty = False
        self._durable_end = self.log_end_offset
        self._recovery_point = segments[-1].base_offset
        self._closed = False
        self.leader_epochs = leader_epochs if leader_epochs is not None else LeaderEpochCache.load(directory)
        # the largest epoch the checkpoint ever named, before truncation: a new epoch is above it
        self._max_epoch_seen = self.leader_epochs.latest_epoch
        # stamped into every appended batch once become_leader() set it; until then (the
        # broker's internal logs) batches keep the epoch they came with
        self.leader_epoch: int | None = None
        self._cleaned_end = _read_checkpoint(directory / CLEANED_END_FILE) or 0
        # listeners of the partition (producer state): called outside the locks, on the
        # thread that rolled or deleted; None for logs without producer state
        self.on_roll: Callable[[int], None] | None = None
        self.on_segments_deleted: Callable[[list[int]], None] | None = None
        # the log directory's failure channel (storage/log_dir.py): an OSError of a write or
        # sync takes the directory offline, and nothing is written or synced once it is; a log
        # opened without one (alone, in tests) gets one of its own
        self.failure_channel = LogDirFailureChannel(directory)

    # -- opening and recovery ---------------------------------------------------

    @classmethod
    def open(
        cls, directory: Path, config: LogConfig, now_ms: int, failure_channel: LogDirFailureChannel | None = None
    ) -> PartitionLog:
        """Create or load the log in ``directory``, recovering from an unclean shutdown."""
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        recovery_point = _read_checkpoint(directory / RECOVERY_POINT_FILE) or 0
        _recover_swaps(directory, _read_checkpoint(directory / LOG_START_FILE))
        cleaned_end = _read_checkpoint(directory / CLEANED_END_FILE) or 0
        bases = sorted(int(p.stem) for p in directory.glob("*" + LOG_SUFFIX) if p.stem.isdigit())
        for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX):
            for p in directory.glob("*" + suffix):
                if not p.stem.isdigit() or int(p.stem) not in bases:
                    p.unlink()
        segments: list[Segment] = []
        for i, base in enumerate(bases):
            if segments and base != segments[-1].next_offset and not segments[-1].next_offset < base <= cleaned_end:
                # the segment before lost its tail (recovery truncated it, maybe in an earlier
                # run that crashed before deleting what follows): no hole in the offsets (a gap
                # that compaction left, at or below cleaned-end-offset, is no hole)
                _delete_segments_after(directory, segments[-1], bases[i:])
                break
            seg = Segment(directory, base, config.index_interval_bytes, existing=True)
            full = not clean and (i == len(bases) - 1 or base >= recovery_point)
            truncated = seg.load(now_ms, full_recovery=full)
            segments.append(seg)
            if truncated and i < len(bases) - 1:
                # Kafka's LogLoader: a corrupt segment ends the log; every later one goes
                _delete_segments_after(directory, seg, bases[i + 1 :])
                break
            if i < len(bases) - 1:
                seg.release_index_files()
        checkpoint = _read_checkpoint(directory / LOG_START_FILE)
        if segments and checkpoint is not None and segments[-1].next_offset < checkpoint:
            # recovery cut the log below its start offset: as Kafka does, drop everything and go
            # on from the start offset, so offsets consumers have seen are never handed out again
            logger.warning(
                "%s: log end offset %d is below the log start offset %d; deleting every segment",
                directory.name, segments[-1].next_offset, checkpoint,
            )
            for seg in segments:
                seg.delete()
            fsync_dir(directory)
            segments = []
        if not segments:
            segments.append(Segment(directory, max(checkpoint or 0, 0), config.index_interval_bytes))
        log_end = segments[-1].next_offset
        for seg in segments:  # markers lost with a truncated tail take their entries along
            seg.txn_index.truncate(log_end)
        log_start = min(max(checkpoint or 0, segments[0].base_offset), log_end)
        epochs, checkpoint_ok = LeaderEpochCache.load_checked(directory)
        if not checkpoint_ok and log_end > segments[0].base_offset:
            # the checkpoint is missing or corrupt: rebuild it from every batch's
            # partitionLeaderEpoch, as Kafka's segment recovery does, so OffsetForLeaderEpoch
            # answers as before and the next epoch stays above every one in the log
            corrupt = epochs.path.exists()  # missing is normal for the broker's internal logs
            epochs.rebuild(_batch_epochs(segments))
            logger.log(
                logging.WARNING if corrupt else logging.INFO,
                "%s: %s was %s; rebuilt from the batches: %s",
                directory.name, epochs.path.name, "corrupt" if corrupt else "missing", epochs.entries(),
            )
        max_epoch_seen = epochs.latest_epoch
        epochs.truncate_from_end(log_end + 1)  # an epoch starting at the log end has no records yet
        epochs.truncate_from_start(log_start)
        log = cls(directory, config, segments, log_start, epochs)
        log._max_epoch_seen = max_epoch_seen
        if clean:
            marker.unlink()
        if not clean and recovery_point > segments[-1].base_offset:
            # segments were deleted: segments written from here on must be scanned after a crash
            recovery_point = segments[-1].base_offset
            atomic_write(directory / RECOVERY_POINT_FILE, b"%d\n" % recovery_point)
        log._recovery_point = recovery_point if not clean else segments[-1].base_offset
        if failure_channel is not None:
            log.failure_channel = failure_channel
        fsync_dir(directory)
        fsync_dir(directory.parent)
        return log

    # -- properties ---------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        """Next offset to assign (the high watermark on a single node)."""
        return self.segments[-1].next_offset

    @property
    def durable_end_offset(self) -> int:
        """Every offset below this has been fdatasynced."""
        return self._durable_end

    @property
    def has_unsynced(self) -> bool:
        return bool(self._unsynced) or self._dir_dirty

    @property
    def closed(self) -> bool:
        """Closed or deleted: no more writes, and no cleaner swap."""
        return self._closed

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def active_segment(self) -> Segment:
        return self.segments[-1]

    @_log_dir_io("leader-epoch checkpoint")
    def become_leader(self) -> int:
        """Start a new leader epoch (one above any the checkpoint ever held) at the log end
        offset and stamp it into later appends; returns it. The checkpoint is written now
        and fsynced by the next :meth:`sync` (or :meth:`close`), before any batch of the
        new epoch is durable."""
        with self._lock:
            epoch = 0 if self._max_epoch_seen is None else self._max_epoch_seen + 1
            self.leader_epochs.assign(epoch, self.log_end_offset, durable=False)
            self._max_epoch_seen = epoch
            self.leader_epoch = epoch
            return epoch

    @contextmanager
    def io(self, what: str) -> Iterator[None]:
        """I/O of this log outside :meth:`append` and :meth:`sync` (retention, DeleteRecords,
        rolls, the cleaner's swaps and checkpoint, the partition's producer snapshots), under
        the log directory's failure channel, as Kafka's ``maybeHandleIOException`` wraps
        ``deleteSegments``, ``roll``, ``truncateTo`` and the cleaner's swap: it raises
        :class:`LogDirOfflineError` before touching a file if the directory is offline, and
        an ``OSError`` takes the directory offline (``what`` names the operation in the
        broker's one line). An error of a log closed meanwhile (its topic was deleted: its
        files went with it) is raised as is and leaves the directory online."""
        with guarded(self.failure_channel, f"{what} of {self.directory.name}", unless=lambda: self._closed):
            yield

    def set_config(self, config: LogConfig) -> None:
        """Apply new settings (used by later appends, rolls and retention)."""
        self.config = config
        self.segments[-1].index_interval_bytes = config.index_interval_bytes

    # -- appends ----------------------------------------------------------------

    def append(
        self, batch: bytes | bytearray | memoryview, now_ms: int, header: BatchHeader | None = None
    ) -> AppendInfo:
        """Append one validated batch, assigning offsets from the log end offset.

        ``header`` may pass the batch's already parsed header (it is not modified).
        Writes to the OS page cache only; call :meth:`sync` for durability.
        An OSError of the write (or of a roll's new files) takes the log directory
        offline (:mod:`oncelog.storage.log_dir`); once it is, nothing is appended.
        A closed (or deleted) log raises :class:`LogClosedError` before touching a
        file: its descriptors are gone, and an EBADF is no disk failure.
        """
        channel = self.failure_channel
        channel.check()
        try:
            return self._append(batch, now_ms, header)
        except OSError as exc:
            raise channel.failed(f"append to {self.directory.name}", exc) from exc

    def _append(
        self, batch: bytes | bytearray | memoryview, now_ms: int, header: BatchHeader | None
    ) -> AppendInfo:
        hdr = header or parse_batch_header(batch)
        size = LOG_OVERHEAD + hdr.batch_length
        if size != len(batch):
            raise ValueError(f"batch is {len(batch)} bytes but its header says {size}")
        cfg = self.config
        view = memoryview(batch)
        rolled = False
        with self._lock:
            if self._closed:
                raise LogClosedError(self.directory.name)
            active = self.segments[-1]
            base = active.next_offset
            last = base + hdr.last_offset_delta
            if not active.fits(size, last, cfg.segment_bytes) or self._roll_due(active, now_ms):
                active = self._roll()
                rolled = True
            epoch = self.leader_epoch
            if cfg.message_timestamp_type == LOG_APPEND_TIME:
                parts: list[bytes | memoryview] = [
                    log_append_time_header(view, base, now_ms, epoch),
                    view[HEADER_SIZE:],
                ]
                max_ts = append_time = now_ms
            elif epoch is None:
                parts = [_I64.pack(base), view[8:]]
                max_ts, append_time = hdr.max_timestamp, -1
            else:
                # baseOffset and partitionLeaderEpoch patched; both lie before the CRC's range
                parts = [_I64.pack(base), view[8:12], _I32.pack(epoch), view[16:]]
                max_ts, append_time = hdr.max_timestamp, -1
            pos = active.append(parts, size, base, last + 1, max_ts, now_ms)
            self._size += size
            self._unsynced[active] = None
        if rolled:
            self._rolled(base)
        return AppendInfo(base, last, append_time, max_ts, pos, active.base_offset, size)

    def append_control(self, batch: bytes | bytearray | memoryview, now_ms: int) -> AppendInfo:
        """Append a broker-built control batch (transaction marker)."""
        return self.append(batch, now_ms)

    def _roll_due(self, seg: Segment, now_ms: int) -> bool:
        return seg.size > 0 and seg.created_ms is not None and now_ms - seg.created_ms > self.config.max_segment_ms

    def _roll(self) -> Segment:
        """Seal the active segment and start a new one at the log end offset (lock held)."""
        old = self.segments[-1]
        old.seal()
        new = Segment(self.directory, old.next_offset, self.config.index_interval_bytes)
        self.segments.append(new)
        self._bases.append(new.base_offset)
        self._unsynced[old] = None
        self._dir_dirty = True
        return new

    def _rolled(self, new_base: int) -> None:
        """Tell the listener that a segment starting at ``new_base`` was rolled (locks released).

        Every roll, whatever its cause (size, segment.ms, retention, a forced
        roll), is reported, so the partition can snapshot its producer state at
        the new segment's base offset as Kafka does on every roll.
        """
        if self.on_roll is not None:
            self.on_roll(new_base)

    @_log_dir_io("roll")
    def maybe_roll(self, now_ms: int) -> bool:
        """Roll the active segment if it is older than segment.ms; True if rolled."""
        with self._lock:
            if not self._roll_due(self.segments[-1], now_ms):
                return False
            new = self._roll()
        self._rolled(new.base_offset)
        return True

    @_log_dir_io("roll")
    def roll(self) -> None:
        """Force a new active segment (no-op when the active one is empty)."""
        with self._lock:
            if self.segments[-1].size == 0:
                return
            new = self._roll()
        self._rolled(new.base_offset)

    # -- durability ---------------------------------------------------------------

    def sync(self) -> int:
        """fdatasync everything appended so far; returns the offset now durable below.

        Safe to call from worker threads while appends continue (appends made
        after the call started are left for the next sync).  Concurrent calls
        are serialised, so a return always means "durable up to the result".

        Segments may leave the log meanwhile (retention, DeleteRecords, a cleaner
        install). The ``.log`` files are fdatasynced through the segments' own
        descriptors (no ``dup``/``close`` per sync: two syscalls, and two GIL
        hand-offs of the worker, less), so a segment the running sync uses is
        not closed when it leaves the log: :meth:`_retire` removes its files
        and this sync closes the descriptor after its fdatasync. Closing it at
        once would be no EBADF for the running call (the kernel holds the file)
        but would let a new file take the number while the worker is about to
        use it, an fdatasync of the wrong file. Index files are synced through
        descriptors of their own (dup'd or opened under the lock).

        A closed or deleted log has nothing left to sync (``close`` synced it
        all; a deleted one's files are gone): it returns at once, so a
        group-commit round that still holds it does not fail with the
        partitions synced beside it.

        An OSError takes the log directory offline (:mod:`oncelog.storage.log_dir`):
        a failed fdatasync is never retried, since a later one may return 0 for
        pages the kernel dropped; once offline, nothing is synced (it raises).
        One exception (not Kafka's: its index files are memory-mapped and its segments'
        channels stay open, so its flush opens nothing): EMFILE/ENFILE while this sync
        gets the index files' descriptors, before any fdatasync ran, raises
        :class:`DescriptorShortageError` and leaves the directory online. Nothing was
        written or synced then, the segments stay marked unsynced, and the caller (the
        group committer) retries the sync later; nothing is reported durable meanwhile.
        """
        channel = self.failure_channel
        channel.check()
        try:
            return self._sync()
        except DescriptorShortageError:
            raise
        except OSError as exc:
            raise channel.failed(f"fsync of {self.directory.name}", exc) from exc

    def _sync(self) -> int:
        with self._sync_lock:
            if self._closed:
                return self._durable_end
            with self._lock:
                active = self.segments[-1]
                end = active.next_offset
                segs = list(self._unsynced)
                self._unsynced.clear()
                dir_dirty, self._dir_dirty = self._dir_dirty, False
                fds: list[int] = []  # the segments' own .log descriptors: not closed here
                own: list[int] = []  # index descriptors opened (or dup'd) for this sync
                in_sync = self._in_sync
                try:
                    for seg in segs:
                        if seg.fd >= 0:
                            fds.append(seg.fd)
                            in_sync[seg] = None
                            if seg is not active:
                                own += seg.index_sync_fds()
                except BaseException as exc:
                    # no descriptor (EMFILE, say): nothing was synced, so the segments stay unsynced (the
                    # next sync must fdatasync them before it reports them durable; review F5), nothing
                    # opened for this sync is left open
                    for fd in own:
                        os.close(fd)
                    in_sync.clear()
                    for seg in segs:
                        self._unsynced[seg] = None
                    self._dir_dirty |= dir_dirty
                    if is_descriptor_shortage(exc):  # retriable: the directory stays online
                        raise DescriptorShortageError(
                            exc.errno, f"fsync of {self.directory.name}: {exc.strerror or exc}"  # type: ignore[union-attr]
                        ) from exc
                    raise
            ok = False
            try:
                # a new leader epoch's checkpoint is durable before any batch stamped with it
                self.leader_epochs.make_durable()
                for fd in fds:
                    os.fdatasync(fd)
                for fd in own:
                    os.fdatasync(fd)
                if dir_dirty:
                    fsync_dir(self.directory)
                ok = True
            finally:
                for fd in own:
                    os.close(fd)
                with self._lock:
                    in_sync.clear()
                    if self._close_after_sync:  # dropped while their fdatasync ran
                        for seg in self._close_after_sync:
                            seg.close()
                        self._close_after_sync = []
                    if ok and end > self._durable_end:
                        self._durable_end = end
            if active.base_offset > self._recovery_point and not self._closed:
                # every segment before the active one is now fully on disk
                atomic_write(self.directory / RECOVERY_POINT_FILE, b"%d\n" % active.base_offset)
                self._recovery_point = active.base_offset
            return end

    # -- aborted transactions ----------------------------------------------------

    def append_aborted_txn(self, txn: AbortedTxn) -> None:
        """Record an aborted transaction in the index of the segment holding its marker
        (``txn.last_offset``); entries must come in increasing marker offsets.

        Part of the marker's append (Kafka updates the index inside the append's I/O
        guard): an OSError of the write takes the log directory offline, as the
        append's own would."""
        channel = self.failure_channel
        channel.check()
        try:
            self._append_aborted_txn(txn)
        except OSError as exc:
            raise channel.failed(f"append to the aborted-transaction index of {self.directory.name}", exc) from exc

    def _append_aborted_txn(self, txn: AbortedTxn) -> None:
        with self._lock:
            if self._closed:
                raise LogClosedError(self.directory.name)
            seg = self.segments[self._segment_index(txn.last_offset)]
            if not seg.base_offset <= txn.last_offset < seg.next_offset:
                raise ValueError(f"marker offset {txn.last_offset} is not in the log")
            seg.txn_index.append(txn)

    def collect_aborted_txns(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions with ``last_offset >= fetch_offset`` and ``first_offset < upper_offset``.

        Searches from the segment holding ``fetch_offset`` onwards and stops
        at the first segment whose index shows the search is complete
        (Kafka's ``collectAbortedTransactions``).
        """
        found: list[AbortedTxn] = []
        for seg in self.segments[self._segment_index(fetch_offset) :]:
            txns, complete = seg.txn_index.collect(fetch_offset, upper_offset)
            found += txns
            if complete:
                break
        return found

    @_log_dir_io("truncation of the aborted-transaction indexes")
    def truncate_txn_indexes(self, offset: int) -> int:
        """Drop every aborted-transaction entry with ``last_offset >= offset``; returns how many."""
        with self._lock:
            return sum(seg.txn_index.truncate(offset) for seg in self.segments[self._segment_index(offset) :])

    def sync_txn_indexes(self) -> None:
        """fdatasync every transaction index changed since its last sync. An OSError takes
        the log directory offline, as :meth:`sync`'s does (a failed fdatasync is not retried)."""
        channel = self.failure_channel
        channel.check()
        try:
            self._sync_txn_indexes()
        except OSError as exc:
            raise channel.failed(f"fsync of the aborted-transaction indexes of {self.directory.name}", exc) from exc

    def _sync_txn_indexes(self) -> None:
        with self._sync_lock:
            with self._lock:
                todo = []
                for seg in self.segments:
                    dirty, new_file = seg.txn_index.take_dirty()
                    if dirty or new_file:
                        todo.append((seg, new_file, seg.txn_index.sync_fd()))
            try:
                for _seg, _new, fd in todo:
                    if fd is not None:
                        os.fdatasync(fd)
                if any(new for _s, new, _fd in todo):
                    fsync_dir(self.directory)
            except BaseException:
                with self._lock:
                    for seg, new_file, _fd in todo:
                        seg.txn_index.mark_dirty(new_file)
                raise
            finally:
                for _seg, _new, fd in todo:
                    if fd is not None:
                        os.close(fd)

    # -- reads ------------------------------------------------------------------

    def _segment_index(self, offset: int) -> int:
        return max(bisect_right(self._bases, offset) - 1, 0)

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None, min_one: bool = True) -> ReadResult:
        """Whole batches starting with the one holding ``offset``.

        Stops before ``max_bytes`` (but returns the first batch whole when
        ``min_one``) and before the first batch whose last offset is >=
        ``max_offset``.  Continues into later segments while under budget.
        """
        start, end = self._log_start, self.log_end_offset
        if offset < start or offset > end:
            raise OffsetOutOfRangeError(offset, start, end)
        chunks: list[bytes] = []
        total = 0
        nxt = offset
        if offset < end and (max_offset is None or offset < max_offset):
            i = self._segment_index(offset)
            pos = self.segments[i].find(offset)
            while i < len(self.segments):
                if pos is not None:
                    budget = max(max_bytes - total, 0)
                    data, n, more = self.segments[i].read_at(pos, budget, max_offset, min_one and not chunks)
                    if data:
                        chunks.append(data)
                        total += len(data)
                        nxt = n
                    if not more or total >= max_bytes:
                        break
                i += 1
                pos = 0
        if not chunks:
            return ReadResult(b"", offset, offset, start, end)
        first = _I64.unpack_from(chunks[0])[0]
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return ReadResult(data, first, nxt, start, end)

    def scan_batches(self, start_offset: int | None = None) -> Iterator[tuple[BatchHeader, bytes | memoryview]]:
        """Every stored batch from the one holding ``start_offset`` (default: log start)."""
        offset = self._log_start if start_offset is None else start_offset
        i = self._segment_index(offset)
        for n, seg in enumerate(list(self.segments[i:])):
            pos = seg.find(offset) if n == 0 else 0
            if pos is None:
                continue
            for hdr, _pos, data in seg.iter_batches(pos):
                yield hdr, data

    # -- offsets by time ----------------------------------------------------------

    def earliest_offset(self) -> int:
        return self._log_start

    def latest_offset(self) -> int:
        return self.log_end_offset

    def offset_for_timestamp(self, ts_ms: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with timestamp >= ``ts_ms``.

        Batches are located by their maxTimestamp (time index, then header
        scan); the records of that batch (decompressed if need be) then give
        the exact record, as Kafka's ``FileRecords.searchForTimestamp``. Only
        if the batch cannot be decoded (no library for its codec) are its
        base offset and maxTimestamp returned.
        """
        for seg in list(self.segments):
            if seg.max_timestamp < ts_ms or seg.next_offset <= self._log_start:
                continue
            found = seg.find_timestamp(ts_ms)
            if found is None:
                continue
            hdr, pos = found
            if hdr.last_offset < self._log_start:
                continue
            exact = self._exact_record(seg, hdr, pos, ts_ms)
            if exact is not None:
                return exact
            return max(hdr.base_offset, self._log_start), hdr.max_timestamp
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with the largest timestamp (ListOffsets -3)."""
        live = [s.max_timestamp for s in self.segments if s.size > 0 and s.next_offset > self._log_start]
        if not live or max(live) < 0:
            return None
        return self.offset_for_timestamp(max(live))

    def _exact_record(self, seg: Segment, hdr: BatchHeader, pos: int, ts_ms: int) -> tuple[int, int] | None:
        """The first record of the batch at ``pos`` with timestamp >= ``ts_ms`` (Kafka's
        ``FileRecords.searchForTimestamp``); a compressed batch is decompressed for it."""
        if hdr.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:  # every record has the batch's time
            return max(hdr.base_offset, self._log_start), hdr.max_timestamp
        try:
            batch = decompressed_batch(seg.read_batch(pos, hdr.size))
            for off, ts, _rec in iter_records(batch):
                if ts >= ts_ms and off >= self._log_start:
                    return off, ts
        except InvalidRecordError as exc:  # e.g. no library for the codec: the batch's answer
            logger.warning("%s: ListOffsets by timestamp cannot read the batch at offset %d: %s",
                           self.directory.name, hdr.base_offset, exc.message)
            return None
        return None

    # -- retention ----------------------------------------------------------------

    @_log_dir_io("retention")
    def apply_retention(self, now_ms: int, upper_bound: int | None = None) -> int:
        """Delete whole segments breaching retention.ms / retention.bytes.

        Like Kafka, the active segment counts too: if it must go, a new one is
        rolled first.  Only segments entirely below ``upper_bound`` (default:
        the durable end offset) are deleted.  Returns the number deleted.
        """
        cfg = self.config
        if not cfg.delete_enabled:  # cleanup.policy without "delete": nothing expires (Kafka)
            return 0
        bound = self._durable_end if upper_bound is None else upper_bound
        deleted = 0
        if cfg.retention_ms >= 0:
            deleted += self._delete_oldest(lambda seg: now_ms - seg.largest_timestamp() > cfg.retention_ms, bound)
        if cfg.retention_bytes >= 0:
            excess = [self._size - cfg.retention_bytes]

            def over(seg: Segment) -> bool:
                if excess[0] - seg.size >= 0:
                    excess[0] -= seg.size
                    return True
                return False

            deleted += self._delete_oldest(over, bound)
        return deleted

    def _delete_oldest(self, predicate: Callable[[Segment], bool], bound: int) -> int:
        doomed: list[Segment] = []
        for seg in self.segments:
            if seg.next_offset > bound:
                break
            if seg.size == 0:  # emptied by recovery; an empty active segment stays
                if seg is self.segments[-1]:
                    break
            elif not predicate(seg):
                break
            doomed.append(seg)
        if not doomed:
            return 0
        new: Segment | None = None
        with self._lock:
            if len(doomed) == len(self.segments):
                new = self._roll()
        if new is not None:  # snapshot at the new segment before the old ones go
            self._rolled(new.base_offset)
        with self._lock:
            for seg in doomed:
                self._drop_segment(seg)
        self._set_log_start(self.segments[0].base_offset)
        self._segments_deleted([seg.base_offset for seg in doomed])
        return len(doomed)

    def _segments_deleted(self, bases: list[int]) -> None:
        if bases and self.on_segments_deleted is not None:
            self.on_segments_deleted(bases)

    def _drop_segment(self, seg: Segment) -> None:
        """Remove the oldest segment (lock held)."""
        assert self.segments[0] is seg
        self.segments.pop(0)
        self._bases.pop(0)
        self._unsynced.pop(seg, None)
        self._size -= seg.size
        self._retire(seg, delete=True)

    def _retire(self, seg: Segment, *, delete: bool) -> None:
        """Close (and with ``delete`` remove) a segment that left the log (lock held). If
        the running sync is fdatasyncing its ``.log`` descriptor, that one is closed by
        the sync when the fdatasync returns: closing it now would let a new file take
        the number while the worker still uses it."""
        if seg in self._in_sync:
            if delete:
                seg.delete(keep_log_fd=True)
            else:
                seg.release_index_files()
            self._close_after_sync.append(seg)
        elif delete:
            seg.delete()
        else:
            seg.close()

    @_log_dir_io("DeleteRecords")
    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start offset up to ``offset``; returns the new start."""
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(offset, self._log_start, self.log_end_offset)
        if offset > self._log_start:
            dropped: list[int] = []
            with self._lock:
                while len(self.segments) > 1 and self.segments[1].base_offset <= offset:
                    dropped.append(self.segments[0].base_offset)
                    self._drop_segment(self.segments[0])
            self._set_log_start(offset)
            self._segments_deleted(dropped)
        return self._log_start

    def _set_log_start(self, offset: int) -> None:
        if offset > self._log_start:
            self._log_start = offset
            # in memory only: opening the log truncates the loaded checkpoint to the start again
            self.leader_epochs.truncate_from_start(offset)
            atomic_write(self.directory / LOG_START_FILE, b"%d\n" % offset)

    # -- compaction (the cleaner's side; see the module docstring) ---------------------------

    def cleaner_checkpoint(self) -> int | None:
        """The first dirty offset the last cleaner pass left, None if never cleaned."""
        return _read_checkpoint(self.directory / CLEANER_CHECKPOINT_FILE)

    @_log_dir_io("cleaner checkpoint")
    def write_cleaner_checkpoint(self, offset: int) -> None:
        atomic_write(self.directory / CLEANER_CHECKPOINT_FILE, b"%d\n" % offset)

    def segment_infos(self) -> list[SegmentInfo]:
        """Every segment's base, size and timestamps, the active one last (event loop)."""
        infos = []
        for seg in self.segments:
            first_ts = -1
            if seg.size >= HEADER_SIZE:
                first_ts = parse_batch_header(seg.read_batch(0, HEADER_SIZE)).max_timestamp
            infos.append(SegmentInfo(seg.base_offset, seg.size, seg.largest_timestamp(), first_ts))
        return infos

    def pin_segments(self, upper: int) -> list[PinnedSegment]:
        """The segments with a base offset below ``upper`` (never the active one), each with
        a descriptor of its own for the cleaner's thread (event loop; the caller closes them)."""
        pinned = []
        with self._lock:
            for i, seg in enumerate(self.segments[:-1]):
                if seg.base_offset >= upper:
                    break
                nxt = self.segments[i + 1].base_offset
                pinned.append(PinnedSegment(seg, seg.base_offset, nxt, seg.size, os.dup(seg.fd)))
        return pinned

    @_log_dir_io("compaction")
    def new_cleaned_segment(self, base: int) -> Segment:
        """An empty ``<base>.*.cleaned`` segment for the cleaner to write (any thread)."""
        for path in _paths(self.directory, base, CLEANED_SUFFIX):
            path.unlink(missing_ok=True)
        return Segment(self.directory, base, self.config.index_interval_bytes, suffix=CLEANED_SUFFIX)

    @_log_dir_io("compaction")
    def open_cleaned_segment(self, base: int, now_ms: int) -> Segment:
        """The ``<base>.*.cleaned`` segment another process wrote (checked as on recovery)."""
        seg = Segment(self.directory, base, self.config.index_interval_bytes, existing=True, suffix=CLEANED_SUFFIX)
        seg.load(now_ms, full_recovery=False)
        return seg

    @_log_dir_io("compaction")
    def discard_cleaned(self, base: int) -> None:
        """Delete ``<base>.*.cleaned`` files that will not be swapped in."""
        for path in _paths(self.directory, base, CLEANED_SUFFIX):
            path.unlink(missing_ok=True)

    @_log_dir_io("compaction swap")
    def commit_cleaned(self, segs: list[Segment], groups: list[tuple[int, int]]) -> None:
        """Steps 1-3 of a pass's swaps (cleaner thread): make the cleaned files durable,
        list the groups in ``cleaner-swap``, rename the files to ``.swap``. After this the
        swaps survive a crash. ``groups`` holds each segment's (base, end of its group)."""
        for seg in segs:
            seg.seal()
            for fd in seg.sync_fds(with_indexes=True):
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
        crash_point("cleaned")
        self.raise_cleaned_end(max(end for _b, end in groups))
        # the manifest is written (and its data synced) before the renames; one directory
        # fsync then covers both: a .swap the manifest does not list is a stray to recovery
        manifest = self.directory / SWAP_MANIFEST
        tmp = manifest.with_name("." + manifest.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, "".join(f"{b} {e}\n" for b, e in groups).encode())
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, manifest)
        crash_point("swapend")
        for seg in segs:
            for path in reversed(_paths(self.directory, seg.base_offset, CLEANED_SUFFIX)):  # the log last
                if path.exists():
                    os.rename(path, path.with_name(path.name[: -len(CLEANED_SUFFIX)] + SWAP_SUFFIX))
            seg.set_suffix(SWAP_SUFFIX)
        fsync_dir(self.directory)
        crash_point("swap")

    @_log_dir_io("compaction checkpoint")
    def raise_cleaned_end(self, offset: int) -> None:
        """Durably allow compaction gaps between segments up to ``offset`` (before any swap
        that can leave one: the cleaner calls it once per pass, and per swap)."""
        if offset > self._cleaned_end:
            atomic_write(self.directory / CLEANED_END_FILE, b"%d\n" % offset)
            self._cleaned_end = offset

    @_log_dir_io("compaction swap")
    def install_cleaned(self, group: list[PinnedSegment], seg: Segment) -> bool:
        """Step 4 (event loop; renames and the in-memory list only): replace the group's
        segments by ``seg``. False, changing nothing, if the group is no longer in the log
        (retention, DeleteRecords or a close got there first)."""
        with self._lock:
            if self._closed or not group:
                return False
            try:
                i = next(n for n, s in enumerate(self.segments) if s is group[0].segment)
            except StopIteration:
                return False
            olds = self.segments[i : i + len(group)]
            if len(olds) != len(group) or any(a is not b.segment for a, b in zip(olds, group)) or olds[-1] is self.segments[-1]:
                return False
            for old in olds:
                for path in _paths(self.directory, old.base_offset):
                    try:
                        os.rename(path, path.with_name(path.name + DELETED_SUFFIX))
                    except FileNotFoundError:
                        pass
            crash_point("install-deleted")
            for path in reversed(_paths(self.directory, seg.base_offset, SWAP_SUFFIX)):
                if path.exists():
                    os.rename(path, path.with_name(path.name[: -len(SWAP_SUFFIX)]))
            seg.set_suffix("")
            crash_point("install")
            self.segments[i : i + len(olds)] = [seg]
            self._bases[i : i + len(olds)] = [seg.base_offset]
            self._size += seg.size - sum(o.size for o in olds)
            for old in olds:
                self._unsynced.pop(old, None)
                # reads run on the loop, none is in flight: the descriptors can go, under the
                # lock, as in _drop_segment (unless the running sync uses it)
                self._retire(old, delete=False)
            self._dir_dirty = True
        return True

    @_log_dir_io("compaction swap")
    def finish_swaps(
        self, installed: list[tuple[int, int]], dropped: list[Segment], unlink: bool = True
    ) -> list[Path]:
        """Step 5 (cleaner thread): make the installs durable, remove the manifest and the
        old files; then throw away the cleaned segments that were not installed (``dropped``).
        With ``unlink=False`` the old (``.deleted``) files are returned for the caller to
        remove at its own pace instead. The removals need no fsync of their own: if a crash
        loses them, recovery removes ``.deleted`` files, and a leftover manifest entry of an
        installed group only names old segments that no longer exist (no new segment ever
        gets a base offset inside a replaced group)."""
        fsync_dir(self.directory)
        crash_point("finish")
        old = []
        for p in self.directory.glob("*" + DELETED_SUFFIX):
            stem = p.name.split(".", 1)[0]
            if stem.isdigit() and any(b <= int(stem) < e for b, e in installed):
                old.append(p)
        (self.directory / SWAP_MANIFEST).unlink(missing_ok=True)
        if unlink:
            for p in old:
                p.unlink(missing_ok=True)
        if dropped:
            self.abort_cleaned(dropped)
        return [] if unlink else old

    def abort_cleaned(self, segs: list[Segment]) -> None:
        """Throw cleaned segments away (cleaner thread), whatever step they reached before
        install. Their descriptors are closed in any case; the files are removed under
        :meth:`io` (an error of a deleted log's, whose directory went, is raised as is)."""
        doomed = [(seg.base_offset, seg.suffix) for seg in segs]
        for seg in segs:
            seg.close()
        with self.io("compaction"):
            # the manifest first: without it, recovery takes leftover .swap files for strays
            # (with it and no .swap, recovery would take a swap for installed)
            (self.directory / SWAP_MANIFEST).unlink(missing_ok=True)
            fsync_dir(self.directory)
            for base, suffix in doomed:
                if suffix:
                    for path in _paths(self.directory, base, suffix):
                        path.unlink(missing_ok=True)

    # -- lifecycle ------------------------------------------------------------------

    def close(self) -> None:
        """Sync everything, mark a clean shutdown and close the files (only close them
        if the log directory is offline: :meth:`abandon`).

        An OSError of these last fsyncs (or of the marker) takes the log directory
        offline like any other sync's: the log is abandoned (no clean-shutdown
        marker, so the next start recovers it) and :class:`LogDirOfflineError` is
        raised; the caller abandons the other logs of the directory.

        Except EMFILE/ENFILE (no descriptor for an index file or the marker: no disk
        failure, as in :meth:`sync`): the log is abandoned without its marker (the next
        start recovers it, as after a crash), one WARNING, and the directory stays
        online. Each segment is closed right after its fdatasync, so a log's close
        needs one descriptor more than it holds at most (its index files') and frees
        its own as it goes: the next log's close has more room.
        """
        channel = self.failure_channel
        if channel.offline:
            self.abandon()
            return
        try:
            self._close()
        except OSError as exc:
            if is_descriptor_shortage(exc):
                logger.warning("closing %s without a clean-shutdown marker (the next start recovers it): %s",
                               self.directory.name, exc.strerror or exc)
                self._drop_marker()
                self.abandon()
                return
            error = channel.failed(f"fsync of {self.directory.name} at shutdown", exc)
            self._drop_marker()
            self.abandon()
            raise error from exc

    def _drop_marker(self) -> None:
        try:  # a marker renamed in place before its directory's fsync failed
            (self.directory / CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
        except OSError:
            pass

    def _close(self) -> None:
        with self._sync_lock, self._lock:
            if self._closed:
                return
            self.leader_epochs.make_durable()
            for seg in self.segments:
                # both locks are held: no sync or retention uses the segment's own descriptor
                # meanwhile, so it is synced (no dup) and closed at once (a tight open-files limit)
                fds = seg.index_sync_fds()
                try:
                    if seg.fd >= 0:
                        os.fdatasync(seg.fd)
                    for fd in fds:
                        os.fdatasync(fd)
                finally:
                    for fd in fds:
                        os.close(fd)
                seg.close()
            self._unsynced.clear()
            self._durable_end = self.log_end_offset
            self._closed = True
            atomic_write(self.directory / CLEAN_SHUTDOWN_FILE, b"")

    def abandon(self) -> None:
        """Close the files without writing or syncing anything (no clean-shutdown marker),
        after the log directory failed: the next start recovers the log as after a crash.
        A sync still running in a worker (a hung fdatasync) keeps its descriptors: they are
        left open rather than closed under it."""
        if not self._sync_lock.acquire(blocking=False):
            self._closed = True
            return
        try:
            with self._lock:
                self._closed = True
                self._unsynced.clear()
                for seg in self.segments:
                    try:
                        seg.close()
                    except OSError:  # a close may report the pending write error again
                        pass
        finally:
            self._sync_lock.release()

    def delete(self) -> None:
        """Close the files and remove the whole directory."""
        with self._sync_lock, self._lock:
            self._closed = True
            self._unsynced.clear()
            self._dir_dirty = False
            for seg in self.segments:
                seg.close()
        self.remove_directory(self.directory)

    @staticmethod
    def remove_directory(directory: Path) -> None:
        """Rename to ``<name>.<id>-delete`` (durably), then remove it; leftovers are
        cleared by :class:`~oncelog.storage.engine.LogManager` on startup."""
        doomed = directory.with_name(delete_dir_name(directory.name))
        os.rename(directory, doomed)
        fsync_dir(directory.parent)
        shutil.rmtree(doomed, ignore_errors=True)

