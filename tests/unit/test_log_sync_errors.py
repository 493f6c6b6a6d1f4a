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
from tests.unit.test_group_commit import FakePartition

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


def test_the_group_committer_retries_a_round_that_had_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiters wait through two failed rounds and are released by the one that syncs."""
    log = _log_with_two_rolled_unsynced_segments(tmp_path)
    part = FakePartition(log)
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


def _always_emfile(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: segment_mod.Segment) -> list[int]:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(segment_mod.Segment, "index_sync_fds", fail)


def test_a_shutdown_drain_is_bounded_while_no_descriptor_can_be_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of iofix, finding 3: drain() waited for ever while EMFILE lasted (SIGTERM hung).
    drain_for gives up after its bound: the waiter fails with a retriable storage error (an
    OSError, answered KAFKA_STORAGE_ERROR), nothing is reported durable, the directory stays
    online and no retry is left scheduled."""
    log = _log_with_two_rolled_unsynced_segments(tmp_path)
    part = FakePartition(log)
    _always_emfile(monkeypatch)

    async def main() -> None:
        committer = GroupCommitter(log_dir=log.failure_channel)
        try:
            fut = committer.wait_durable(part)  # type: ignore[arg-type]
            assert fut is not None
            assert await asyncio.wait_for(committer.drain_for(0.3), 5) is False
            assert fut.done() and isinstance(fut.exception(), DescriptorShortageError)
            retries = committer.shortage_retries
            assert retries >= 1
            await asyncio.sleep(0.3)
            assert committer.shortage_retries == retries  # no retry left scheduled
            assert part.high_watermark == 0 and log.durable_end_offset == 0
            assert not log.failure_channel.offline
            late = committer.wait_durable(part)  # a round after the give-up fails instead of retrying
            assert late is not None
            with pytest.raises(DescriptorShortageError):
                await asyncio.wait_for(late, 5)
            assert committer.shortage_retries == retries and part.high_watermark == 0
        finally:
            committer.abandon()

    asyncio.run(main())
    log.abandon()


def test_the_shutdown_drain_still_waits_for_a_round_that_gets_its_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log_with_two_rolled_unsynced_segments(tmp_path)
    part = FakePartition(log)
    _fail_index_fds(monkeypatch, {0, 1})

    async def main() -> None:
        committer = GroupCommitter(log_dir=log.failure_channel)
        try:
            fut = committer.wait_durable(part)  # type: ignore[arg-type]
            assert await committer.drain_for(10) is True
            assert fut is not None and fut.done() and fut.exception() is None
            assert part.high_watermark == 3
        finally:
            committer.close()

    asyncio.run(main())
    log.close()


def test_postponed_rounds_warn_once_per_streak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A retry every 10 ms to 1 s logged a WARNING each (and another log's successful round reset
    the backoff to 10 ms): up to ~100 lines a second. Now one WARNING per streak of retries, and
    a success of a log that is not being retried does not reset the backoff."""
    log = _log_with_two_rolled_unsynced_segments(tmp_path)
    part = FakePartition(log)
    other_log = PartitionLog.open(tmp_path / "u-0", LogConfig(), T0)
    other_log.failure_channel = log.failure_channel
    other = FakePartition(other_log)
    real = segment_mod.Segment.index_sync_fds
    fail = {"on": True}

    def failing(self: segment_mod.Segment) -> list[int]:
        if fail["on"] and "t-0" in str(self.directory):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(self)

    monkeypatch.setattr(segment_mod.Segment, "index_sync_fds", failing)
    batch = encode_record_batch([Record(b"k", b"v")], base_timestamp=T0)

    async def main() -> None:
        committer = GroupCommitter(log_dir=log.failure_channel)
        try:
            fut = committer.wait_durable(part)  # type: ignore[arg-type]
            assert fut is not None
            for _ in range(4):  # the other log syncs (its round succeeds) while t-0's retries go on
                await asyncio.sleep(0.03)
                other_log.append(batch, T0)
                w = committer.wait_durable(other)  # type: ignore[arg-type]
                assert w is not None
                await asyncio.wait_for(w, 5)
            assert committer.shortage_retries >= 3
            assert committer._backoff >= 0.04  # 10, 20, 40 ms...: not back at 10 ms after other's rounds
            fail["on"] = False
            await asyncio.wait_for(fut, 10)
            assert part.high_watermark == 3
        finally:
            committer.close()

    with caplog.at_level("DEBUG", logger="oncelog"):
        asyncio.run(main())
    postponed = [r for r in caplog.records if "postponed" in r.getMessage() and r.levelname == "WARNING"]
    assert len(postponed) == 1, [r.getMessage() for r in postponed]
    log.close()
    other_log.close()


def test_a_log_that_synced_is_not_held_back_by_one_that_got_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of iofix, finding 4: a round of two logs where A synced and B got EMFILE released
    nothing, A's waiters included, and both went into every retry. Now A is durable at once and
    only B (and the waiter spanning both) waits for B's retry."""
    a_log = _log_with_two_rolled_unsynced_segments(tmp_path / "a")
    b_log = _log_with_two_rolled_unsynced_segments(tmp_path / "b")
    b_log.failure_channel = a_log.failure_channel
    a, b = FakePartition(a_log), FakePartition(b_log)
    real = segment_mod.Segment.index_sync_fds
    fail = {"on": True}

    def failing(self: segment_mod.Segment) -> list[int]:
        if fail["on"] and str(tmp_path / "b") in str(self.directory):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(self)

    monkeypatch.setattr(segment_mod.Segment, "index_sync_fds", failing)

    async def main() -> None:
        committer = GroupCommitter(log_dir=a_log.failure_channel)
        try:
            both = committer.wait_durable_all([a, b])  # type: ignore[list-item]
            only_a = committer.wait_durable(a)  # type: ignore[arg-type]
            assert both is not None and only_a is not None
            await asyncio.wait_for(only_a, 5)
            assert a.high_watermark == 3 and a_log.durable_end_offset == 3
            assert not both.done() and b.high_watermark == 0 and b_log.durable_end_offset == 0
            fail["on"] = False
            await asyncio.wait_for(both, 5)
            assert b.high_watermark == 3 and b_log.durable_end_offset == 3
        finally:
            committer.close()

    asyncio.run(main())
    a_log.close()
    b_log.close()


def test_server_stop_ends_while_a_log_can_get_no_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM while EMFILE lasted hung in server.stop() (committer.drain() had no bound).
    Now stop() ends after SHUTDOWN_SYNC_TIMEOUT_S, the waiting produce is answered
    KAFKA_STORAGE_ERROR (retriable; not acknowledged) and the directory never went offline."""
    from oncelog.broker import server as server_mod
    from oncelog.broker.broker import Broker
    from oncelog.broker.config import BrokerConfig
    from oncelog.protocol.errors import ErrorCode
    from tests.unit.test_log_dir_offline import call, produce

    monkeypatch.setattr(server_mod, "SHUTDOWN_SYNC_TIMEOUT_S", 0.3, raising=False)
    real_sync = PartitionLog.sync

    def no_descriptor(self: PartitionLog) -> int:
        if self.directory.name == "t-0":
            raise DescriptorShortageError(errno.EMFILE, f"fsync of {self.directory.name}: Too many open files")
        return real_sync(self)

    monkeypatch.setattr(PartitionLog, "sync", no_descriptor)
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data", host="127.0.0.1", port=0))
    broker.create_topic("t", 1)

    async def main() -> None:
        server = server_mod.BrokerServer(broker)
        await server.start()
        answer = asyncio.ensure_future(call(broker, 0, 9, produce(encode_record_batch([Record(None, b"v")]))))
        await asyncio.sleep(0.1)
        assert not answer.done()
        await asyncio.wait_for(server.stop(), 10)
        r = await asyncio.wait_for(answer, 5)
        assert r.responses[0].partition_responses[0].error_code == ErrorCode.kafka_storage_error
        assert broker.partition("t", 0).high_watermark == 0
        assert not broker.log_dir.offline

    asyncio.run(main())


_CLOSE_AT_THE_LIMIT = """
import os, resource, sys
from pathlib import Path
from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
data = Path(sys.argv[1])
broker = Broker(BrokerConfig(data_dir=data))
broker.create_topic("big", 40)
used = {int(fd) for fd in os.listdir("/proc/self/fd")}
lowest_free = next(fd for fd in range(1 << 20) if fd not in used)
# not one descriptor more can be opened now
resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
broker.close()
logs = [d for d in data.iterdir() if d.is_dir() and d.name.rsplit("-", 1)[-1].isdigit()]
print(broker.log_dir.offline, sum((d / ".clean_shutdown").exists() for d in logs), len(logs))
"""


def test_a_clean_shutdown_at_the_open_files_limit_stays_clean(tmp_path: Path) -> None:
    """Review of iofix, finding 2: closing a log dup'ed each segment's descriptor, so a broker at its
    open-files limit (a real RLIMIT_NOFILE, in a subprocess) met EMFILE at shutdown and took the
    directory offline (CRITICAL, exit 1, no clean-shutdown marker anywhere). Each log's close now
    syncs through the segment's own descriptor and closes it before writing its marker."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _CLOSE_AT_THE_LIMIT, str(tmp_path / "data")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    offline, markers, logs = out.stdout.split()
    assert offline == "False" and int(logs) == 42  # big-0..39, __consumer_offsets-0, __transaction_state-0
    assert int(markers) == int(logs)


def test_no_descriptor_at_close_skips_the_marker_but_the_directory_stays_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """EMFILE for an index file at close (no disk failure, as in sync): that log closes without its
    clean-shutdown marker (the next start recovers it), one WARNING, nothing left open, the
    directory stays online; what was appended is read back after recovery."""
    log = _log_with_two_rolled_unsynced_segments(tmp_path)
    directory = log.directory
    _fail_index_fds(monkeypatch, {1})  # the first segment is synced and closed by then
    before = _open_fds()
    with caplog.at_level("WARNING", logger="oncelog"):
        log.close()
    assert not log.failure_channel.offline and log.closed
    assert not (directory / ".clean_shutdown").exists()
    assert len(before - _open_fds()) == 3  # the three segments' .log descriptors, and nothing opened stays open
    assert [r.levelname for r in caplog.records if "clean-shutdown marker" in r.getMessage()] == ["WARNING"]
    monkeypatch.undo()
    again = PartitionLog.open(directory, LogConfig(), T0)
    assert again.log_end_offset == 3
    again.close()
    assert (directory / ".clean_shutdown").exists()


def test_the_periodic_flush_retries_a_log_that_had_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """log.flush.interval.messages > 1 (no fsync per ack): a background flush that gets no descriptor
    keeps the log dirty and syncs it at a later interval; the directory stays online."""
    log = _log_with_two_rolled_unsynced_segments(tmp_path)
    part = FakePartition(log)
    _fail_index_fds(monkeypatch, {0, 1})

    async def main() -> None:
        committer = GroupCommitter(fsync_on_ack=False, flush_interval_ms=20, log_dir=log.failure_channel)
        flusher = asyncio.ensure_future(committer.periodic_flush())
        try:
            assert committer.wait_durable(part) is None  # type: ignore[arg-type]
            for _ in range(250):
                if log.durable_end_offset == 3:
                    break
                await asyncio.sleep(0.02)
            assert log.durable_end_offset == 3 and not log.failure_channel.offline
        finally:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
            committer.close()

    asyncio.run(main())
    log.close()
