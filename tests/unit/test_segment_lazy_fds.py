"""Idle partitions hold one file descriptor: segment index files are opened lazily.

Every test counts the descriptors of this process that point into its own
``tmp_path`` (through /proc/self/fd), so descriptors of pytest or other
tests do not interfere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oncelog.storage.config import LogConfig
from oncelog.storage.engine import LogManager
from oncelog.storage.log import PartitionLog
from oncelog.storage.segment import LazyFile
from oncelog.storage.txn_index import AbortedTxn
from tests.unit.test_storage import T0, fill, mk, values_of  # the storage tests' batch helpers

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")


def open_files(root: Path) -> list[str]:
    """Paths (relative to ``root``) of this process's open descriptors under ``root``, sorted."""
    prefix = str(root) + os.sep
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor listdir itself used, closed meanwhile
            continue
        if target.startswith(prefix):
            out.append(target[len(prefix) :])
    return sorted(out)


def logs_of(log: PartitionLog, root: Path) -> list[str]:
    """The descriptor list an idle partition should hold: one ``.log`` per segment."""
    return sorted(str(s.log_path.relative_to(root)) for s in log.segments)


def crash(log: PartitionLog) -> None:
    """Drop the log without a clean shutdown (files stay as the OS has them)."""
    for seg in log.segments:
        seg.close()


def index_bytes(log: PartitionLog) -> list[tuple[bytes, bytes]]:
    return [(s.index_path.read_bytes(), s.timeindex_path.read_bytes()) for s in log.segments]


SMALL = LogConfig(segment_bytes=400, index_interval_bytes=100)


def record_fdatasync(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[str]:
    """Make os.fdatasync note the file it syncs (relative to ``root``) before syncing it."""
    synced: list[str] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), root))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return synced


# -- idle partitions ------------------------------------------------------------------------------


def test_new_partition_holds_only_its_log(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    seg = log.active_segment
    assert open_files(tmp_path) == ["t-0/00000000000000000000.log"]
    # the index files still exist from the start, as before (empty)
    assert seg.index_path.stat().st_size == 0 and seg.timeindex_path.stat().st_size == 0
    assert not seg.txn_index.exists
    log.close()
    assert open_files(tmp_path) == []


def test_many_partitions_one_descriptor_each(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, LogConfig())
    logs = mgr.create_partitions("t", 0, 40, T0) + mgr.create_partitions("u", 0, 25, T0)
    assert len(open_files(tmp_path)) == 65
    mgr.close()
    assert open_files(tmp_path) == []
    mgr = LogManager(tmp_path, LogConfig())  # reopen after a clean stop
    logs = mgr.create_partitions("t", 0, 40, T0) + mgr.create_partitions("u", 0, 25, T0)
    assert open_files(tmp_path) == sorted(f for plog in logs for f in logs_of(plog, tmp_path))
    assert len(open_files(tmp_path)) == 65
    mgr.close()


@pytest.mark.parametrize("clean", [True, False])
def test_reopened_partition_with_data_holds_one_descriptor_per_segment(tmp_path: Path, clean: bool) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, SMALL, T0)
    expected = fill(log, 30)
    assert len(log.segments) >= 4 and all(s._idx_off for s in log.segments[:-1])
    log.sync()  # moves the recovery point: after a crash only the active segment is scanned whole
    before = index_bytes(log)
    log.close() if clean else crash(log)
    assert open_files(tmp_path) == []
    log = PartitionLog.open(d, SMALL, T0)
    # after a clean stop the indexes are read, after a crash the active segment's
    # are rebuilt: either way through short-lived descriptors only
    assert open_files(tmp_path) == logs_of(log, tmp_path)
    assert index_bytes(log) == before
    assert values_of(log.read(0, 1 << 20).data) == expected
    assert log.offset_for_timestamp(T0 + 10) == (20, T0 + 10)
    assert open_files(tmp_path) == logs_of(log, tmp_path)
    log.close()


# -- opening on first use -----------------------------------------------------------------------------


def test_index_descriptors_open_with_the_first_entry_and_close_on_seal(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, LogConfig(index_interval_bytes=150), T0)
    seg = log.active_segment
    log.append(mk([b"a" * 50]), T0)
    log.append(mk([b"b" * 50]), T0)  # 2 batches: still not past index_interval_bytes
    assert not seg._idx_off
    assert open_files(tmp_path) == ["t-0/00000000000000000000.log"]
    log.append(mk([b"c" * 50]), T0)  # the first entry: now both indexes are open
    assert len(seg._idx_off) == 1
    assert open_files(tmp_path) == [
        "t-0/00000000000000000000.index",
        "t-0/00000000000000000000.log",
        "t-0/00000000000000000000.timeindex",
    ]
    for i in range(20):  # further entries reuse the same descriptors
        log.append(mk([b"%d" % i * 50]), T0)
    assert len(seg._idx_off) > 5 and len(open_files(tmp_path)) == 3
    log.roll()  # sealing closes them: the sealed segment and the new active one hold one each
    assert open_files(tmp_path) == logs_of(log, tmp_path) and len(log.segments) == 2
    log.close()
    log = PartitionLog.open(d, LogConfig(index_interval_bytes=150), T0)
    assert [len(s._idx_off) for s in log.segments] == [len(seg._idx_off), 0]
    log.close()


def test_txn_index_is_opened_on_its_first_entry_only(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, LogConfig(), T0)
    log.append(mk([b"x"]), T0)
    assert open_files(tmp_path) == ["t-0/00000000000000000000.log"]
    log.append_aborted_txn(AbortedTxn(producer_id=1, first_offset=0, last_offset=0, last_stable_offset=1))
    assert "t-0/00000000000000000000.txnindex" in open_files(tmp_path)
    log.roll()
    assert open_files(tmp_path) == logs_of(log, tmp_path)
    log.close()
    log = PartitionLog.open(d, LogConfig(), T0)  # loading it reads it and closes it again
    assert open_files(tmp_path) == logs_of(log, tmp_path)
    assert log.collect_aborted_txns(0, 10) == [AbortedTxn(1, 0, 0, 1)]
    log.close()


def test_reads_open_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "t-0"
    cfg = LogConfig(segment_bytes=3000, index_interval_bytes=100)
    log = PartitionLog.open(d, cfg, T0)
    expected = fill(log, 120)
    log.close()
    log = PartitionLog.open(d, cfg, T0)
    assert sum(len(s._idx_off) for s in log.segments) > 50  # lookups have a real index to use
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, *a, **kw):  # type: ignore[no-untyped-def]
        opened.append(str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(os, "open", counting_open)
    for offset in range(0, 240, 3):
        r = log.read(offset, 1)
        assert r.first_offset <= offset < r.next_offset
    assert values_of(log.read(0, 1 << 20).data) == expected
    assert log.offset_for_timestamp(T0 + 77) == (154, T0 + 77)
    assert opened == []
    assert open_files(tmp_path) == logs_of(log, tmp_path)
    log.close()


# -- recovery and sync ------------------------------------------------------------------------------------


def test_recovery_after_unclean_stop_with_a_torn_tail(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, SMALL, T0)
    expected = fill(log, 30)
    log.sync()
    before = index_bytes(log)
    active = log.active_segment.log_path
    crash(log)
    with open(active, "ab") as f:
        f.write(mk([b"torn"])[:-7])
    log = PartitionLog.open(d, SMALL, T0)
    assert open_files(tmp_path) == logs_of(log, tmp_path)
    assert log.log_end_offset == 60 and values_of(log.read(0, 1 << 20).data) == expected
    assert index_bytes(log) == before
    # appends go on, opening the active segment's index files when an entry is due
    more = fill(log, 3, now=T0 + 30)
    assert values_of(log.read(0, 1 << 20).data) == expected + more
    log.close()


def test_recovery_rewrites_indexes_without_keeping_them_open(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, SMALL, T0)
    fill(log, 30)
    before = [s.index_path.read_bytes() for s in log.segments]
    crash(log)  # never synced: no recovery point, so every segment is scanned whole
    assert not (d / "recovery-point").exists()
    for p in d.iterdir():
        if p.suffix in (".index", ".timeindex"):
            p.write_bytes(b"\xff" * 24)
    log = PartitionLog.open(d, SMALL, T0)
    assert [s.index_path.read_bytes() for s in log.segments] == before
    assert all(s.timeindex_path.read_bytes() != b"\xff" * 24 for s in log.segments)
    assert log.offset_for_timestamp(T0 + 10) == (20, T0 + 10)
    assert open_files(tmp_path) == logs_of(log, tmp_path)
    log.close()


def test_group_commit_sync_never_opens_unwritten_indexes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, LogConfig(index_interval_bytes=150), T0)
    synced = record_fdatasync(monkeypatch, tmp_path)
    log.append(mk([b"x"]), T0)
    assert log.sync() == 1
    assert synced == ["t-0/00000000000000000000.log"]  # the active segment: its .log only, as before
    assert open_files(tmp_path) == ["t-0/00000000000000000000.log"]
    log.roll()  # seals: writes its last time index entry, then closes the index files
    synced.clear()
    assert log.sync() == 1
    # the sealed segment: its .log and every index file it wrote (the offset index got no entry)
    assert sorted(synced) == ["t-0/00000000000000000000.log", "t-0/00000000000000000000.timeindex"]
    assert open_files(tmp_path) == logs_of(log, tmp_path)
    log.close()


def test_sealed_segment_indexes_are_synced_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, LogConfig(index_interval_bytes=150), T0)
    for i in range(10):
        log.append(mk([b"%d" % i * 50], ts=T0 + i), T0)
    assert log.active_segment._idx_off
    synced = record_fdatasync(monkeypatch, tmp_path)
    log.roll()
    log.sync()
    assert sorted(synced) == [
        "t-0/00000000000000000000.index",
        "t-0/00000000000000000000.log",
        "t-0/00000000000000000000.timeindex",
    ]
    log.close()


def test_close_syncs_what_this_process_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, SMALL, T0)
    fill(log, 31)
    assert log.active_segment._idx_off  # so that rebuilding it writes its index files
    log.sync()  # moves the recovery point: after a crash only the active segment is rebuilt
    n = len(log.segments)
    log.close()
    synced = record_fdatasync(monkeypatch, tmp_path)
    # reopened after a clean stop and left idle: nothing was written, only the logs are synced
    log = PartitionLog.open(d, SMALL, T0)
    log.close()
    assert sorted(synced) == sorted(f"t-0/{s.log_path.name}" for s in log.segments)
    # reopened after a crash: the active segment's indexes were rewritten by recovery, so they
    # are synced on close (through a short-lived descriptor)
    log = PartitionLog.open(d, SMALL, T0)
    crash(log)
    log = PartitionLog.open(d, SMALL, T0)
    synced.clear()
    log.close()
    last = log.active_segment
    assert len(log.segments) == n
    rebuilt = [f"t-0/{last.index_path.name}", f"t-0/{last.timeindex_path.name}"]
    assert sorted(synced) == sorted([f"t-0/{s.log_path.name}" for s in log.segments] + rebuilt)
    assert open_files(tmp_path) == []


# -- the helper ------------------------------------------------------------------------------------------


def test_lazy_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    f = LazyFile(path, create=False)
    assert not path.exists() and f.fd == -1 and f.sync_fd() is None
    assert f.read() == b"" and path.exists() and f.fd == -1  # read creates it, as opening used to
    f.replace(b"")  # nothing to write to an empty file: not a change
    assert f.fd == -1 and not f.written and f.sync_fd() is None
    f.replace(b"abc")  # recovery: a short-lived descriptor
    assert f.fd == -1 and f.written and path.read_bytes() == b"abc"
    fd = f.sync_fd()  # written by this process: syncable through the path
    assert fd is not None
    os.close(fd)
    f.append(b"de")
    assert f.fd >= 0 and f.read() == b"abcde"
    kept = f.fd
    f.append(b"f")
    assert f.fd == kept  # opened once, then kept
    f.replace(b"xy")
    assert f.fd == kept and path.read_bytes() == b"xy"
    f.close()
    assert f.fd == -1 and open_files(tmp_path) == []
    g = LazyFile(tmp_path / "g", create=True)
    assert (tmp_path / "g").exists() and g.fd == -1 and open_files(tmp_path) == []
