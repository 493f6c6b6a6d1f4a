"""GroupCommitter: a round fdatasyncs every dirty log concurrently, then releases its waiters."""

from __future__ import annotations

import asyncio
import threading

import pytest

from oncelog.broker.durability import GroupCommitter
from oncelog.storage.log_dir import LogDirOfflineError


class FakeLog:
    def __init__(self, barrier: threading.Barrier | None = None, error: BaseException | None = None) -> None:
        self.log_end_offset = 0
        self.barrier = barrier
        self.error = error
        self.syncs = 0

    def sync(self) -> int:
        self.syncs += 1
        if self.barrier is not None:
            self.barrier.wait(timeout=5)  # every log of the round must be syncing at the same time
        if self.error is not None:
            raise self.error
        return self.log_end_offset


class FakePartition:
    def __init__(self, log: FakeLog) -> None:
        self.log = log
        self.high_watermark = 0

    def advance_high_watermark(self, offset: int) -> None:
        self.high_watermark = offset


def test_round_syncs_concurrently_and_releases_waiters() -> None:
    async def main() -> None:
        barrier = threading.Barrier(3)
        parts = [FakePartition(FakeLog(barrier)) for _ in range(3)]
        committer = GroupCommitter()
        try:
            for i, p in enumerate(parts):
                p.log.log_end_offset = 10 + i
            waits = [committer.wait_durable(p) for p in parts]
            await asyncio.wait_for(asyncio.gather(*waits), 10)
            assert [p.high_watermark for p in parts] == [10, 11, 12]
            assert [p.log.syncs for p in parts] == [1, 1, 1]
            assert committer.rounds == 1 and committer.synced_files == 3
        finally:
            committer.close()

    asyncio.run(main())


def test_failed_sync_takes_the_log_directory_offline_and_is_never_retried() -> None:
    """A failed fdatasync is not retried (a later one may return 0 for pages the kernel
    dropped): the log directory goes offline, the round's waiters fail, and every later
    wait fails at once without syncing; no high watermark moves again. (Before: the next
    round synced the log again and reported the failed data durable.)"""
    async def main() -> None:
        good, bad = FakePartition(FakeLog()), FakePartition(FakeLog(error=OSError(5, "I/O error")))
        good.log.log_end_offset = bad.log.log_end_offset = 7
        committer = GroupCommitter()
        try:
            waits = [committer.wait_durable(good), committer.wait_durable(bad)]
            results = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 10)
            assert all(isinstance(r, LogDirOfflineError) for r in results), results
            assert "I/O error" in str(results[0])
            assert committer.log_dir.offline
            assert good.high_watermark == 0 and bad.high_watermark == 0  # nothing of the round is durable
            assert good.log.syncs == 1 and bad.log.syncs == 1
            # the disk works again: still nothing is synced or reported durable
            bad.log.error = None
            for fut in (committer.wait_durable(bad), committer.wait_durable_all([good, bad])):
                with pytest.raises(LogDirOfflineError):
                    await asyncio.wait_for(fut, 10)
            assert bad.high_watermark == 0 and good.high_watermark == 0
            assert good.log.syncs == 1 and bad.log.syncs == 1
        finally:
            committer.close()

    asyncio.run(main())


def test_a_failed_round_fails_the_rounds_beside_it_and_the_waiters_queued_behind() -> None:
    """Rounds over other logs run beside the failing one: once the directory is offline, a
    round that synced fine reports nothing durable, and an append queued for its log's next
    round fails instead of being synced."""
    async def main() -> None:
        slow_log = GatedLog()
        gate = slow_log.gate
        slow = FakePartition(slow_log)
        bad = FakePartition(FakeLog(error=OSError(5, "I/O error")))
        slow.log.log_end_offset = bad.log.log_end_offset = 3
        committer = GroupCommitter()
        try:
            first = committer.wait_durable(slow)
            assert await asyncio.to_thread(slow_log.started.wait, 10)  # slow's round is running
            slow.log.log_end_offset = 4
            queued = committer.wait_durable(slow)  # waits for slow's next round
            failed = committer.wait_durable(bad)  # a round of its own, beside slow's
            with pytest.raises(LogDirOfflineError):
                await asyncio.wait_for(failed, 10)
            with pytest.raises(LogDirOfflineError):
                await asyncio.wait_for(queued, 10)
            gate.set()  # slow's fdatasync returns 0, after the directory went offline
            with pytest.raises(LogDirOfflineError):
                await asyncio.wait_for(first, 10)
            assert slow.high_watermark == 0 and bad.high_watermark == 0
        finally:
            gate.set()
            committer.close()

    asyncio.run(main())


@pytest.mark.parametrize("n", [1, 8])
def test_appends_during_a_round_wait_for_the_next(n: int) -> None:
    async def main() -> None:
        parts = [FakePartition(FakeLog()) for _ in range(n)]
        committer = GroupCommitter()
        try:
            first = [committer.wait_durable(p) for p in parts]
            for p in parts:
                p.log.log_end_offset = 5
            second = [committer.wait_durable(p) for p in parts]
            await asyncio.wait_for(asyncio.gather(*first, *second), 10)
            assert all(p.high_watermark == 5 for p in parts)
        finally:
            committer.close()

    asyncio.run(main())


def test_wait_durable_all_one_future_for_every_partition() -> None:
    async def main() -> None:
        parts = [FakePartition(FakeLog()) for _ in range(4)]
        for i, p in enumerate(parts):
            p.log.log_end_offset = 3 + i
        committer = GroupCommitter()
        try:
            assert committer.wait_durable_all([]) is None
            fut = committer.wait_durable_all(parts)
            assert fut is not None and not fut.done()
            await asyncio.wait_for(fut, 10)
            # resolved only after every partition's sync: all high watermarks moved
            assert [p.high_watermark for p in parts] == [3, 4, 5, 6]
            assert [p.log.syncs for p in parts] == [1, 1, 1, 1]
        finally:
            committer.close()

    asyncio.run(main())


def test_wait_durable_all_without_fsync_on_ack_advances_at_once() -> None:
    async def main() -> None:
        parts = [FakePartition(FakeLog()) for _ in range(2)]
        for p in parts:
            p.log.log_end_offset = 9
        committer = GroupCommitter(fsync_on_ack=False)
        try:
            assert committer.wait_durable_all(parts) is None
            assert [p.high_watermark for p in parts] == [9, 9]
        finally:
            committer.close()

    asyncio.run(main())


def test_sync_threads_start_on_demand_and_stop_on_close() -> None:
    from oncelog.broker.durability import SyncThreads

    threads = SyncThreads(max_threads=2)
    ran: list[int] = []
    done = threading.Event()
    threads.ensure(5)  # capped at max_threads
    assert len(threads._threads) == 2 and all(t.is_alive() for t in threads._threads)
    for i in range(3):
        threads.submit(lambda i=i: ran.append(i))
    threads.submit(done.set)
    assert done.wait(5)
    workers = list(threads._threads)
    threads.close()
    assert sorted(ran) == [0, 1, 2]
    assert not any(t.is_alive() for t in workers)
    with pytest.raises(RuntimeError):
        threads.submit(lambda: None)


def test_a_round_with_nothing_dirty_resolves() -> None:
    async def main() -> None:
        committer = GroupCommitter()
        try:
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(committer._sync_all(loop, []), 5)
        finally:
            committer.close()

    asyncio.run(main())


class GatedLog(FakeLog):
    """A log whose fsync blocks until ``gate`` is set (a slow fsync of a big partition round)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = threading.Event()

    def sync(self) -> int:
        self.started.set()
        assert self.gate.wait(timeout=10)
        return super().sync()


def test_a_round_of_other_logs_does_not_wait_behind_a_running_round() -> None:
    """A transaction-log record appended while a slow round of partition fsyncs runs is
    synced at once in a round of its own; the slow log, appended to again meanwhile, waits
    for its round and goes into the next (one fsync at a time per log); a waiter on both
    logs resolves only once both are synced after its append."""

    async def main() -> None:
        slow, txn_log = FakePartition(GatedLog()), FakePartition(FakeLog())
        committer = GroupCommitter()
        try:
            slow.log.log_end_offset = 4
            first = committer.wait_durable(slow)
            while not slow.log.started.is_set():
                await asyncio.sleep(0.001)
            txn_log.log.log_end_offset = 2
            both = committer.wait_durable_all([slow, txn_log])
            alone = committer.wait_durable(txn_log)
            await asyncio.wait_for(alone, 5)  # not behind the slow round
            assert txn_log.high_watermark == 2 and txn_log.log.syncs == 1
            assert not first.done() and not both.done() and slow.log.syncs == 0
            slow.log.log_end_offset = 6
            slow.log.gate.set()
            await asyncio.wait_for(first, 5)
            assert slow.high_watermark == 4 and not both.done()  # its append came during the first round
            await asyncio.wait_for(both, 5)
            assert slow.high_watermark == 6 and slow.log.syncs == 2
            await committer.drain()
        finally:
            slow.log.gate.set()
            committer.close()

    asyncio.run(main())


def test_a_round_that_cannot_start_fails_its_waiters_and_frees_the_log() -> None:
    """If the fsync threads cannot take the round (closed, or no thread could start), the
    round's waiters fail instead of hanging, and the log is not left in flight."""
    import asyncio as _asyncio
    import time as _time

    from oncelog.broker.durability import GroupCommitter as _GC

    class _Log:
        log_end_offset = 0

        def sync(self) -> int:
            _time.sleep(0)
            return 0

    class _P:
        def __init__(self) -> None:
            self.log, self.hw = _Log(), -1

        def advance_high_watermark(self, o: int) -> None:
            self.hw = o

    async def main() -> None:
        gc = _GC()
        gc.close()
        p = _P()
        fut = gc.wait_durable(p)
        done, _ = await _asyncio.wait([fut], timeout=2)
        assert fut in done and fut.exception() is not None
        assert not gc._inflight
        await _asyncio.wait_for(gc.drain(), 2)

    _asyncio.run(main())


def test_a_cancelled_drain_leaves_the_rounds_it_waited_on_running() -> None:
    """``drain()`` cancelled (shutdown's timeout, a cancelled stop) while a round runs:
    the round is not cancelled with it, and the produce waiting on that round is still
    released when its fdatasync finishes (before, the gather inside drain cancelled the
    round's future, and every waiter of the round failed with CancelledError)."""

    async def main() -> None:
        release = threading.Event()

        class SlowLog(FakeLog):
            def sync(self) -> int:
                release.wait(10)
                return super().sync()

        part = FakePartition(SlowLog())
        part.log.log_end_offset = 5
        committer = GroupCommitter()
        try:
            produce = committer.wait_durable(part)
            await asyncio.sleep(0.05)  # the round has started and is in its fdatasync
            drain = asyncio.ensure_future(committer.drain())
            await asyncio.sleep(0.05)
            drain.cancel()
            with pytest.raises(asyncio.CancelledError):
                await drain
            release.set()
            await asyncio.wait_for(produce, 10)  # resolved, not cancelled
            assert part.high_watermark == 5
            await asyncio.wait_for(committer.drain(), 10)
        finally:
            release.set()
            committer.close()

    asyncio.run(main())


def test_a_deleted_log_in_a_round_does_not_fail_the_live_ones(tmp_path) -> None:
    """DeleteTopics removes a log whose append waits for the next round, and another
    partition's append joins that round: the live partition's produce is released (it
    failed with FileNotFoundError from the deleted log's directory fsync)."""
    from oncelog.broker.durability import LogHandle
    from oncelog.protocol.records import Record, encode_record_batch
    from oncelog.storage.config import LogConfig
    from oncelog.storage.log import PartitionLog

    async def main() -> None:
        cfg = LogConfig(segment_bytes=400, index_interval_bytes=100)
        live = PartitionLog.open(tmp_path / "live-0", cfg, 0)
        gone = PartitionLog.open(tmp_path / "gone-0", cfg, 0)
        batch = encode_record_batch([Record(b"k", b"v" * 50, [], 0)], base_timestamp=0)
        for _ in range(10):  # rolls: directory fsyncs pending
            live.append(batch, 0)
            gone.append(batch, 0)
        committer = GroupCommitter()
        try:
            w_live = committer.wait_durable(LogHandle(live))
            w_gone = committer.wait_durable(LogHandle(gone))
            gone.delete()  # before the round starts (it starts in the next loop pass)
            await asyncio.wait_for(w_live, 10)
            await asyncio.wait_for(w_gone, 10)
            assert live.durable_end_offset == 10
        finally:
            committer.close()
            live.close()

    asyncio.run(main())
