"""PartitionLog.sync when it cannot get a descriptor for an index file (EMFILE, say), review F5.

Nothing was synced then, and nothing may be reported durable: the log directory goes offline (as Kafka's
does for any IOException of a flush; a retry would be safe here, but the group committer, like Kafka,
treats every failed flush alike), so no later sync reports the segments durable. No descriptor opened
for that sync is left open (Segment.sync_fds's dup of the .log included), and no segment is left marked
as being synced."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from oncelog.protocol.records import Record, encode_record_batch
from oncelog.storage import segment as segment_mod
from oncelog.storage.config import LogConfig
from oncelog.storage.log import PartitionLog
from oncelog.storage.log_dir import LogDirOfflineError

T0 = 1_700_000_000_000


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("fail_at", [0, 1])
def test_descriptor_failure_takes_the_directory_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        fail_at: int) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    batch = encode_record_batch([Record(b"k", b"v" * 100)], base_timestamp=T0)
    log.sync()
    log.append(batch, T0)
    log.roll()
    log.append(batch, T0)
    log.roll()
    log.append(batch, T0)  # two rolled segments with unsynced data, and the active one
    before = _open_fds()

    real_index_sync_fds = segment_mod.Segment.index_sync_fds
    calls = 0

    def failing(self: segment_mod.Segment) -> list[int]:
        nonlocal calls
        calls += 1
        if calls - 1 == fail_at:  # fail_at=1: the first rolled segment's index fds are open by then
            raise OSError(errno.EMFILE, "Too many open files")
        return real_index_sync_fds(self)

    monkeypatch.setattr(segment_mod.Segment, "index_sync_fds", failing)
    with pytest.raises(LogDirOfflineError):
        log.sync()
    monkeypatch.setattr(segment_mod.Segment, "index_sync_fds", real_index_sync_fds)
    assert _open_fds() == before  # nothing opened for the failed sync is left open
    assert not log._in_sync
    assert log.durable_end_offset == 0
    assert log.failure_channel.offline and "Too many open files" in (log.failure_channel.cause or "")

    synced: list[int] = []
    monkeypatch.setattr(os, "fdatasync", synced.append)
    with pytest.raises(LogDirOfflineError):  # descriptors are back: still nothing synced or reported durable
        log.sync()
    assert synced == [] and log.durable_end_offset == 0
    log.abandon()


def test_segment_sync_fds_closes_the_log_dup_when_an_index_fails(tmp_path: Path) -> None:
    """Segment.sync_fds dup's the .log descriptor first: an EMFILE on an index file must not leak it."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    log.append(encode_record_batch([Record(b"k", b"v")], base_timestamp=T0), T0)
    log.roll()
    seg = log.segments[0]
    before = _open_fds()

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
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    log.append(encode_record_batch([Record(b"k", b"v")], base_timestamp=T0), T0)
    log.roll()
    seg = log.segments[0]
    before = _open_fds()

    def fail() -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    seg.txn_index.sync_fd = fail  # type: ignore[method-assign]  # the offset and time index fds open by then
    with pytest.raises(OSError):
        seg.index_sync_fds()
    assert _open_fds() == before
    del seg.txn_index.sync_fd
    log.close()
