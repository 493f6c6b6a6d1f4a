"""PartitionLog.sync when it cannot get a descriptor for an index file (EMFILE, say), review F5.

Nothing was synced then, so the segments must stay unsynced: the next sync fdatasyncs them before it
reports them durable (before the fix it found nothing to sync and moved the durable end and the recovery
point past data never synced). No descriptor opened for that sync is left open, and no segment is left
marked as being synced."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from oncelog.protocol.records import Record, encode_record_batch
from oncelog.storage import segment as segment_mod
from oncelog.storage.config import LogConfig
from oncelog.storage.log import PartitionLog

T0 = 1_700_000_000_000


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("fail_at", [0, 1])
def test_descriptor_failure_leaves_the_segments_unsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
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
    with pytest.raises(OSError):
        log.sync()
    monkeypatch.setattr(segment_mod.Segment, "index_sync_fds", real_index_sync_fds)
    assert _open_fds() == before  # nothing opened for the failed sync is left open
    assert not log._in_sync
    assert log.durable_end_offset == 0

    synced: list[str] = []
    real_fdatasync = os.fdatasync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1])
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    assert log.sync() == 3
    logs = sorted(name for name in synced if name.endswith(".log"))
    assert logs == ["00000000000000000000.log", "00000000000000000001.log", "00000000000000000002.log"], synced
    assert log.durable_end_offset == 3
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
