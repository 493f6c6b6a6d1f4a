"""The leader-epoch cache of a partition (Kafka's ``LeaderEpochFileCache``).

Entries ``(epoch, start_offset)``: the first offset written in each leader
epoch, both increasing. They are kept in ``leader-epoch-checkpoint`` in the
partition directory, in Kafka's checkpoint format (a version line ``0``, the
entry count, then one ``epoch start_offset`` line per entry).

The checkpoint is rewritten by :meth:`LeaderEpochCache.assign` only: durably
(fsync of the file and the directory) unless the caller defers that with
``durable=False`` and calls :meth:`LeaderEpochCache.make_durable` before any
batch of the new epoch is made durable (the partition log does it in its
next ``sync``, so a broker start does not pay two fsyncs per partition).
Truncations (from the end after recovery cut the log, from the start when the
log start offset moves) change the cache in memory; the file may keep stale
entries until the next :meth:`assign`, which is harmless because opening a log
truncates the loaded cache again to the recovered ``[log start, log end]``
(Kafka flushes truncations asynchronously for the same reason).

A missing or corrupt checkpoint (:meth:`LeaderEpochCache.load_checked`) is
rebuilt by the partition log on open from its batches' ``partitionLeaderEpoch``
(:meth:`LeaderEpochCache.rebuild`, Kafka's segment recovery rule: a batch
whose epoch is above the latest entry starts a new one).

Answers, as Kafka's:

* :meth:`end_offset_for` (OffsetForLeaderEpoch): the requested epoch if it is
  the latest, with the log end offset; otherwise the largest epoch <= the
  requested one with the start offset of the next higher epoch; a requested
  epoch below every entry gets itself with the start offset of the first
  entry; an epoch of -1, or above every entry, or an empty cache gives
  ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)`` = ``(-1, -1)``.
* :meth:`epoch_for_offset`: the epoch whose range holds ``offset`` (None
  before the first entry).
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path

from oncelog.storage.fileutil import atomic_write, fsync_dir, write_all

CHECKPOINT_FILE = "leader-epoch-checkpoint"
CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """``(epoch, start_offset)`` entries of one partition, backed by its checkpoint file."""

    __slots__ = ("path", "_epochs", "_starts", "dirty")

    def __init__(self, path: Path, entries: list[tuple[int, int]] | None = None) -> None:
        self.path = path
        self.dirty = False  # the file was replaced but not yet fsynced
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in entries or ():
            self._put(epoch, start)

    # -- loading and writing ------------------------------------------------------

    @classmethod
    def load(cls, directory: Path) -> LeaderEpochCache:
        """Read ``leader-epoch-checkpoint`` (an unreadable or missing file gives an empty cache)."""
        path = directory / CHECKPOINT_FILE
        return cls(path, read_checkpoint(path))

    @classmethod
    def load_checked(cls, directory: Path) -> tuple[LeaderEpochCache, bool]:
        """The cache and whether the checkpoint was there and well-formed (False: missing,
        unreadable or corrupt, so the caller rebuilds it from the batches, see
        :meth:`rebuild`)."""
        path = directory / CHECKPOINT_FILE
        entries = _parse_checkpoint(path)
        return cls(path, entries or []), entries is not None

    def rebuild(self, batch_epochs: Iterable[tuple[int, int]]) -> None:
        """Replace the entries with those found in the log's batches, ``(partitionLeaderEpoch,
        base offset)`` in offset order, as Kafka's segment recovery assigns them: a batch
        starts an entry when its epoch is set (>= 0) and above the latest one so far. The
        checkpoint is written durably."""
        self._epochs.clear()
        self._starts.clear()
        for epoch, base in batch_epochs:
            if epoch >= 0 and (not self._epochs or epoch > self._epochs[-1]):
                self._put(epoch, base)
        self._write(durable=True)

    def _write(self, durable: bool) -> None:
        lines = [str(CHECKPOINT_VERSION), str(len(self._epochs))]
        lines += [f"{e} {s}" for e, s in zip(self._epochs, self._starts)]
        data = ("\n".join(lines) + "\n").encode()
        if durable:
            atomic_write(self.path, data)
            self.dirty = False
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.dirty = True

    def make_durable(self) -> None:
        """fsync a checkpoint written with ``durable=False`` (file, then directory)."""
        if not self.dirty:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:  # the partition was deleted meanwhile
            self.dirty = False
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.path.parent)
        self.dirty = False

    # -- queries --------------------------------------------------------------------

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts))

    @property
    def latest_epoch(self) -> int | None:
        return self._epochs[-1] if self._epochs else None

    @property
    def earliest_entry(self) -> tuple[int, int] | None:
        return (self._epochs[0], self._starts[0]) if self._epochs else None

    def end_offset_for(self, requested: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end_offset)`` for OffsetForLeaderEpoch (see the module docstring)."""
        if requested == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested == self._epochs[-1]:
            return requested, log_end_offset
        higher = bisect_right(self._epochs, requested)  # index of the first epoch > requested
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch of the entry with the largest start offset <= ``offset``."""
        i = bisect_right(self._starts, offset)
        return self._epochs[i - 1] if i else None

    # -- changes ----------------------------------------------------------------------

    def _put(self, epoch: int, start: int) -> bool:
        if epoch < 0 or start < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start})")
        if self._epochs and self._epochs[-1] == epoch and start >= self._starts[-1]:
            return False  # already the latest epoch, started no later
        # entries that would break monotonicity go (Kafka's maybeTruncateNonMonotonicEntries)
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start)
        return True

    def assign(self, epoch: int, start_offset: int, durable: bool = True) -> None:
        """Record that ``epoch`` starts at ``start_offset`` and write the checkpoint
        (durably, or left to :meth:`make_durable` with ``durable=False``)."""
        if self._put(epoch, start_offset):
            self._write(durable)

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop every entry starting at or after ``end_offset`` (the log was cut there)."""
        while self._starts and self._starts[-1] >= end_offset >= 0:
            self._epochs.pop()
            self._starts.pop()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: entries starting at or below it go, except
        the last of them, which now starts at ``start_offset`` (Kafka's truncateFromStart)."""
        i = bisect_right(self._starts, start_offset)
        if i == 0:
            return
        kept = self._epochs[i - 1]
        del self._epochs[:i], self._starts[:i]
        self._epochs.insert(0, kept)
        self._starts.insert(0, start_offset)


def read_checkpoint(path: Path) -> list[tuple[int, int]]:
    """Entries of a checkpoint file; [] when it is missing or malformed."""
    return _parse_checkpoint(path) or []


def _parse_checkpoint(path: Path) -> list[tuple[int, int]] | None:
    """Entries of a checkpoint file; None when it is missing, unreadable or malformed."""
    try:
        lines = path.read_text().split("\n")
    except (OSError, UnicodeDecodeError):
        return None
    try:
        if int(lines[0]) != CHECKPOINT_VERSION:
            return None
        count = int(lines[1])
        out = []
        for line in lines[2 : 2 + count]:
            epoch, start = (int(x) for x in line.split())
            if epoch < 0 or start < 0:
                return None
            if out and (epoch <= out[-1][0] or start < out[-1][1]):
                return None  # entries must increase
            out.append((epoch, start))
        return out if len(out) == count else None
    except (ValueError, IndexError):
        return None
