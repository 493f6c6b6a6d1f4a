"""The leader-epoch cache (Kafka's LeaderEpochFileCache) and the epoch the log stamps into batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncelog.protocol.records import Record, encode_record_batch, iter_batch_headers, parse_batch_header, compute_crc
from oncelog.storage.config import LogConfig
from oncelog.storage.leader_epoch import CHECKPOINT_FILE, LeaderEpochCache, read_checkpoint
from oncelog.storage.log import PartitionLog

T0 = 1_700_000_000_000


def cache(tmp_path: Path, entries: list[tuple[int, int]]) -> LeaderEpochCache:
    return LeaderEpochCache(tmp_path / CHECKPOINT_FILE, entries)


def test_end_offset_for_follows_kafka(tmp_path: Path) -> None:
    c = cache(tmp_path, [(1, 0), (3, 10), (5, 20)])
    assert c.end_offset_for(5, 25) == (5, 25)  # the latest epoch: the log end offset
    assert c.end_offset_for(3, 25) == (3, 20)  # start of the next epoch
    assert c.end_offset_for(4, 25) == (3, 20)  # not cached: largest epoch below, next one's start
    assert c.end_offset_for(2, 25) == (1, 10)
    assert c.end_offset_for(0, 25) == (0, 0)  # below every epoch: itself, the first start offset
    assert c.end_offset_for(6, 25) == (-1, -1)  # above the latest
    assert c.end_offset_for(-1, 25) == (-1, -1)
    assert cache(tmp_path, []).end_offset_for(0, 25) == (-1, -1)


def test_epoch_for_offset_and_truncation(tmp_path: Path) -> None:
    c = cache(tmp_path, [(1, 0), (3, 10), (5, 20)])
    assert [c.epoch_for_offset(o) for o in (0, 9, 10, 19, 20, 99)] == [1, 1, 3, 3, 5, 5]
    c.truncate_from_start(15)  # the entry holding 15 now starts there
    assert c.entries() == [(3, 15), (5, 20)]
    assert c.epoch_for_offset(14) is None
    c.truncate_from_start(20)
    assert c.entries() == [(5, 20)]
    c2 = cache(tmp_path, [(1, 0), (3, 10), (5, 20)])
    c2.truncate_from_end(20)  # entries starting at or after 20 go
    assert c2.entries() == [(1, 0), (3, 10)]


def test_assign_keeps_entries_monotonic_and_writes_kafkas_format(tmp_path: Path) -> None:
    c = cache(tmp_path, [(1, 0), (3, 10)])
    c.assign(3, 12)  # same epoch, later start: nothing to do
    assert c.entries() == [(1, 0), (3, 10)]
    assert not (tmp_path / CHECKPOINT_FILE).exists()
    c.assign(4, 10)  # an epoch that wrote nothing is replaced
    assert c.entries() == [(1, 0), (4, 10)]
    assert (tmp_path / CHECKPOINT_FILE).read_text() == "0\n2\n1 0\n4 10\n"
    c.assign(6, 5)  # conflicting later entries go
    assert c.entries() == [(1, 0), (6, 5)]
    assert LeaderEpochCache.load(tmp_path).entries() == [(1, 0), (6, 5)]


def test_malformed_checkpoint_reads_as_empty(tmp_path: Path) -> None:
    p = tmp_path / CHECKPOINT_FILE
    for text in ("", "1\n1\n0 0\n", "0\n2\n0 0\n", "0\n1\nx y\n", "0\n1\n-3 0\n"):
        p.write_text(text)
        assert read_checkpoint(p) == []


def _batch(n: int = 2, epoch: int = 0) -> bytes:
    return bytes(encode_record_batch([Record(key=None, value=b"v%d" % i) for i in range(n)],
                                     base_timestamp=T0, partition_leader_epoch=epoch))


def test_become_leader_bumps_epoch_at_every_open_and_stamps_batches(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    cfg = LogConfig()
    log = PartitionLog.open(d, cfg, T0)
    assert log.become_leader() == 0
    log.append(_batch(epoch=-1), T0)  # producers send -1: the broker stamps its epoch
    log.close()
    log = PartitionLog.open(d, cfg, T0)
    assert log.become_leader() == 1
    log.append(_batch(epoch=7), T0)
    data = log.read(0, 1 << 20).data
    hdrs = [h for h, _pos, _end in iter_batch_headers(data)]
    assert [(h.base_offset, h.partition_leader_epoch) for h in hdrs] == [(0, 0), (2, 1)]
    for h, pos, _end in iter_batch_headers(data):  # the CRC does not cover the epoch: still valid
        assert compute_crc(data, pos) == h.crc
    assert log.leader_epochs.entries() == [(0, 0), (1, 2)]
    assert log.leader_epochs.end_offset_for(0, log.log_end_offset) == (0, 2)
    assert log.leader_epochs.end_offset_for(1, log.log_end_offset) == (1, 4)
    log.close()
    # a restart with nothing written replaces the empty epoch, never reuses a number
    log = PartitionLog.open(d, cfg, T0)
    assert log.become_leader() == 2
    log.close()
    log = PartitionLog.open(d, cfg, T0)
    assert log.become_leader() == 3
    assert log.leader_epochs.entries() == [(0, 0), (1, 2), (3, 4)]  # epoch 2 wrote nothing
    log.close()


def test_open_truncates_cache_to_log_and_delete_records_moves_first_entry(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, LogConfig(), T0)
    log.become_leader()
    log.append(_batch(4), T0)
    log.close()
    # a checkpoint naming an epoch beyond the recovered log end (the tail was lost)
    (d / CHECKPOINT_FILE).write_text("0\n2\n0 0\n1 9\n")
    log = PartitionLog.open(d, LogConfig(), T0)
    assert log.leader_epochs.entries() == [(0, 0)]
    assert log.become_leader() == 2  # above every epoch the file ever named
    log.append(_batch(2), T0)
    log.sync()
    log.delete_records_before(5)
    assert log.leader_epochs.entries() == [(2, 5)]
    log.close()
    log = PartitionLog.open(d, LogConfig(), T0)
    assert log.leader_epochs.entries() == [(2, 5)]
    log.close()


def test_internal_logs_keep_the_batch_epoch(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "x-0", LogConfig(), T0)
    log.append(_batch(epoch=5), T0)
    assert parse_batch_header(log.read(0, 1 << 20).data).partition_leader_epoch == 5
    assert not (tmp_path / "x-0" / CHECKPOINT_FILE).exists()
    log.close()


def test_new_epoch_checkpoint_is_fsynced_before_the_first_batch_of_the_epoch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    d = tmp_path / "t-0"
    log = PartitionLog.open(d, LogConfig(), T0)
    log.become_leader()
    # written at once (visible to a restart after kill -9), fsynced with the first sync
    assert (d / CHECKPOINT_FILE).read_text() == "0\n1\n0 0\n"
    assert log.leader_epochs.dirty
    calls: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    monkeypatch.setattr(os, "fdatasync",
                        lambda fd: (calls.append(os.readlink(f"/proc/self/fd/{fd}")), real_fdatasync(fd)))
    log.append(_batch(), T0)
    log.sync()
    assert not log.leader_epochs.dirty
    first_segment = next(i for i, c in enumerate(calls) if c.endswith(".log"))
    assert calls.index(str(d / CHECKPOINT_FILE)) < first_segment
    assert calls.index(str(d)) < first_segment  # the rename too
    calls.clear()
    log.append(_batch(), T0)
    log.sync()
    assert str(d / CHECKPOINT_FILE) not in calls  # only once per epoch
    log.close()


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated", "not monotonic"])
def test_lost_checkpoint_is_rebuilt_from_the_batch_headers(tmp_path: Path, damage: str) -> None:
    d = tmp_path / "t-0"
    cfg = LogConfig()
    for n in (3, 2, 4):  # epochs 0, 1, 2 start at offsets 0, 3, 5
        log = PartitionLog.open(d, cfg, T0)
        log.become_leader()
        for _ in range(n):
            log.append(_batch(1), T0)
        log.close()
    log = PartitionLog.open(d, cfg, T0)
    assert log.become_leader() == 3  # nothing written in epoch 3
    before = log.leader_epochs.entries()
    assert before == [(0, 0), (1, 3), (2, 5), (3, 9)]
    answers = [log.leader_epochs.end_offset_for(e, log.log_end_offset) for e in range(-1, 6)]
    log.close()
    path = d / CHECKPOINT_FILE
    if damage == "missing":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff garbage")
    elif damage == "truncated":
        path.write_text("0\n4\n0 0\n1 3\n")
    else:
        path.write_text("0\n2\n2 5\n1 3\n")
    log = PartitionLog.open(d, cfg, T0)
    assert log.leader_epochs.entries() == [(0, 0), (1, 3), (2, 5)]  # from the batches
    assert read_checkpoint(path) == [(0, 0), (1, 3), (2, 5)]  # and written back
    assert log.become_leader() == 3  # above every epoch in the log
    assert [log.leader_epochs.end_offset_for(e, log.log_end_offset) for e in range(-1, 6)] == answers
    log.close()


def test_rebuilt_cache_starts_at_the_log_start(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    for epoch_batches in (2, 2):
        log = PartitionLog.open(d, LogConfig(), T0)
        log.become_leader()
        for _ in range(epoch_batches):
            log.append(_batch(1), T0)
        log.sync()
        log.close()
    log = PartitionLog.open(d, LogConfig(), T0)
    log.delete_records_before(1)
    log.close()
    (d / CHECKPOINT_FILE).unlink()
    log = PartitionLog.open(d, LogConfig(), T0)
    assert log.leader_epochs.entries() == [(0, 1), (1, 2)]
    log.close()
