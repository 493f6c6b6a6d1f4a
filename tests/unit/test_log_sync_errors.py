"""PartitionLog.sync when it cannot get a descriptor for an index file (EMFILE, say), review F5.

Nothing was synced then, and nothing may be reported durable. EMFILE/ENFILE is no disk failure (oncelog
opens descriptors lazily, so a burst of connections can exhaust them; Kafka's flush opens nothing): the
directory stays online, the segments stay marked unsynced, and the group committer retries the round
after a backoff, its waiters still waiting. Any other error there (EIO, say) takes the directory offline.
No descriptor opened for that sync is left open (Segment.sync_fds's dup of the .log included), and no
segment is left marked as being synced."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from oncelog.broker.durability import GroupCommitter
from oncelog.protocol.records import Record, encode_record_batch
from oncelog.storage import segment as segment_mod
from oncelog.storage.config import LogConfig
from oncelog.storage.log import PartitionLog
from oncelog.storage.log_dir import DescriptorShortageError, LogDirOfflineError

T0 = 1_700_000_000_000


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _log_with_two_rolled_unsynced_segments(tmp_path: Path) -> PartitionLog:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    batch = encode_record_batch([Record(b"k", b"v" * 100)], base_timestamp=T0)
    log.sync()
    log.append(batch, T0)
    log.roll()
    log.append(batch, T0)
    log.roll()
    log.append(batch, T0)  # two rolled segments with unsynced data, and the active one
    return log


def _fail_index_fds(monkeypatch: pytest.MonkeyPatch, fail: set[int], err: int = errno.EMFILE) -> None:
    """Segment.index_sync_fds raises ``err`` on the calls numbered in ``fail`` (0-based)."""
    real = segment_mod.Segment.index_sync_fds
    calls = 0

    def failing(self: segment_mod.Segment) -> list[int]:
        nonlocal calls
        calls += 1
        if calls - 1 in fail:
            raise OSError(err, os.strerror(err))
        return real(self)

    monkeypatch.setattr(segment_mod.Segment, "index_sync_fds", failing)


@pytest.mark.parametrize("fail_at", [0, 1])
def test_descriptor_shortage_leaves_the_segments_unsynced_and_the_directory_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    log = _log_with_two_rolled_unsynced_segments(tmp_path)
    before = _open_fds()
    _fail_index_fds(monkeypatch, {fail_at})  # fail_at=1: the first rolled segment's index fds are open by then
    with pytest.raises(DescriptorShortageError):
        log.sync()
    assert _open_fds() == before  # nothing opened for the failed sync is left open
    assert not log._in_sync
    assert log.durable_end_offset == 0
    assert not log.failure_channel.offline

    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def counting(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    assert log.sync() == 3  # descriptors are back: every segment is synced, then reported durable
    assert len(synced) >= 3 and log.durable_end_offset == 3  # the three .log files at least
    log.close()


def test_another_error_getting_the_index_descriptors_takes_the_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log_with_two_rolled_unsynced_segments(tmp_path)
    _fail_index_fds(monkeypatch, {0}, errno.EIO)
    with pytest.raises(LogDirOfflineError):
        log.sync()
    assert log.failure_channel.offline and log.durable_end_offset == 0
    with pytest.raises(LogDirOfflineError):
        log.sync()
    assert log.durable_end_offset == 0
    log.abandon()


class _Partition:
    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.high_watermark = 0

    def advance_high_watermark(self, offset: int) -> None:
        self.high_watermark = offset


def test_the_group_committer_retries_a_round_that_had_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiters wait through two failed rounds and are released by the one that syncs."""
    log = _log_with_two_rolled_unsynced_segments(tmp_path)
    part = _Partition(log)
    _fail_index_fds(monkeypatch, {0, 1})

    async def main() -> None:
        committer = GroupCommitter(log_dir=log.failure_channel)
        try:
            fut = committer.wait_durable(part)  # type: ignore[arg-type]
            assert fut is not None
            await asyncio.sleep(0.005)
            assert not fut.done() and part.high_watermark == 0
            await asyncio.wait_for(fut, 10)
            assert committer.shortage_retries == 2
            assert part.high_watermark == 3 and log.durable_end_offset == 3
            assert not log.failure_channel.offline
        finally:
            committer.close()

    asyncio.run(main())
    log.close()


def _rolled_segment(tmp_path: Path) -> tuple[PartitionLog, segment_mod.Segment, set[str]]:
    """A log with one rolled segment: (the log, that segment, the descriptors open now)."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    log.append(encode_record_batch([Record(b"k", b"v")], base_timestamp=T0), T0)
    log.roll()
    return log, log.segments[0], _open_fds()


def test_segment_sync_fds_closes_the_log_dup_when_an_index_fails(tmp_path: Path) -> None:
    """Segment.sync_fds dup's the .log descriptor first: an EMFILE on an index file must not leak it."""
    log, seg, before = _rolled_segment(tmp_path)

    def fail() -> list[int]:
        raise OSError(errno.EMFILE, "Too many open files")

    seg.index_sync_fds = fail  # type: ignore[method-assign]
    with pytest.raises(OSError):
        seg.sync_fds(with_indexes=True)
    assert _open_fds() == before
    del seg.index_sync_fds
    fds = seg.sync_fds(with_indexes=True)  # and it still works
    assert len(fds) >= 1
    for fd in fds:
        os.close(fd)
    log.close()


def test_segment_index_sync_fds_closes_what_it_opened_when_one_fails(tmp_path: Path) -> None:
    log, seg, before = _rolled_segment(tmp_path)

    def fail() -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    seg.txn_index.sync_fd = fail  # type: ignore[method-assign]  # the offset and time index fds open by then
    with pytest.raises(OSError):
        seg.index_sync_fds()
    assert _open_fds() == before
    del seg.txn_index.sync_fd
    log.close()
