"""Group commit: one round of fdatasync covers every append waiting for it.

Produce handlers append to the page cache and then await :meth:`wait_durable`.
A round takes every dirty log that is not already being synced, captures
each log's end offset, fdatasyncs all of them in worker threads
(concurrently, so the file system can fold them into one journal commit) and
then releases every waiter whose logs are all synced. A log appended to while
its round runs waits for that round and goes into the next one, so each log
has one fdatasync at a time, each append costs at most two fsync latencies
and a busy broker amortises one fsync over many requests. Rounds over
different logs run at the same time: a transaction-log or offsets record
does not wait behind a slow round of partition fsyncs it has nothing to do
with (the transaction path writes to three logs in turn).

A round hands its fdatasyncs to the worker threads directly and the last
one to finish wakes the event loop once (:meth:`GroupCommitter._sync_all`):
one loop wake-up per round, not one per partition (with 16 KiB batches a
busy broker runs a round per two or three batches, so this is per-batch
cost). The workers are plain threads fed by a ``queue.SimpleQueue``
(:class:`SyncThreads`), not a ``ThreadPoolExecutor``, whose futures, work
items and semaphores cost more per fdatasync than the rest of the round's
bookkeeping.

A failed round is never retried (docs/architecture.md, "When the log directory
fails"): an fsync error takes the log directory offline
(:class:`~oncelog.storage.log_dir.LogDirFailureChannel`, shared with every log of
the directory). The round's waiters fail with it, and so do the waiters of
every other log (queued for a later round, or in a round running beside it,
even one whose fdatasyncs returned 0) and every later :meth:`wait_durable`:
once the directory is offline no high watermark moves and nothing is reported
durable again. The broker then stops (``server.py``).

One exception: a round whose sync could not get a descriptor (EMFILE, ENFILE)
before any fdatasync ran (:class:`~oncelog.storage.log_dir.DescriptorShortageError`:
nothing was written or synced, the directory stays online) is retried after a
short backoff (10 ms, doubling up to 1 s) with its waiters still waiting; nothing
is reported durable before a later fdatasync succeeds. oncelog opens descriptors
lazily, so a burst of connections can exhaust them; it is no disk failure. One
WARNING is logged per streak of such retries (until every log that was retried
has synced), not one per retry, and only the success of a retried log resets the
backoff. At shutdown the retries are bounded (:meth:`GroupCommitter.drain_for`):
past the bound, the waiters still waiting fail (a storage error, retriable) and
nothing of theirs is reported durable.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any

from oncelog.storage.log_dir import DescriptorShortageError, LogDirFailureChannel

if TYPE_CHECKING:
    from oncelog.storage.log import PartitionLog
    from oncelog.broker.partition import Partition

log = logging.getLogger(__name__)


class LogHandle:
    """What :meth:`GroupCommitter.wait_durable` needs of a "partition", for the
    broker's internal logs (offsets store, transaction log), which have no
    high watermark of their own."""

    __slots__ = ("log",)

    def __init__(self, log: "PartitionLog") -> None:
        self.log = log

    def advance_high_watermark(self, offset: int) -> None:
        pass


class SyncThreads:
    """Up to ``max_threads`` worker threads running submitted callables, started on
    demand (a round of N partitions wants N of them at once, up to the limit) and
    kept until :meth:`close`. A callable must not raise (the round's ``sync``
    catches everything); one that does is logged and the thread carries on."""

    def __init__(self, max_threads: int = 8, name: str = "fsync") -> None:
        self.max_threads = max_threads
        self.name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def ensure(self, n: int) -> None:
        """Have at least ``min(n, max_threads)`` threads."""
        want = min(n, self.max_threads)
        while len(self._threads) < want and not self._closed:
            t = threading.Thread(target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True)
            t.start()
            self._threads.append(t)

    def submit(self, job: Callable[[], None]) -> None:
        if self._closed:
            raise RuntimeError("the fsync threads are closed")
        self._queue.put(job)

    def _work(self) -> None:
        get = self._queue.get
        while True:
            job = get()
            if job is None:
                return
            try:
                job()
            except BaseException:  # pragma: no cover - the jobs catch their errors
                log.exception("fsync worker job failed")

    def close(self, wait: bool = True) -> None:
        """Finish the queued jobs, then stop every thread (``wait=False``: without
        waiting for them, as after a log-directory failure, where an fdatasync may hang)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for t in self._threads:
                t.join()


class DaemonThreadExecutor(Executor):
    """A ``concurrent.futures`` executor on daemon threads, for work that may hang in a
    syscall (an fdatasync of a failing disk). A ``ThreadPoolExecutor``'s workers are
    joined at interpreter exit (Python 3.9+), so one stuck there would keep a broker whose
    log directory failed from exiting; these end with the process. ``shutdown(wait=False)``
    returns at once."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max_workers
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()  # (future, fn, args, kwargs), None: stop
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = threading.Semaphore(0)  # released by a worker that finished a job (as ThreadPoolExecutor)
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"the {self.name} threads are shut down")
            self._queue.put((fut, fn, args, kwargs))
            if not self._idle.acquire(timeout=0) and len(self._threads) < self.max_workers:
                t = threading.Thread(target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
        return fut

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    fut.set_exception(exc)
            del item, fut, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._shutdown:
                threads = []
            else:
                self._shutdown = True
                threads = list(self._threads)
                if cancel_futures:
                    while True:
                        try:
                            item = self._queue.get_nowait()
                        except queue.Empty:
                            break
                        if item is not None:
                            item[0].cancel()
                for _ in threads:
                    self._queue.put(None)
        if wait:
            for t in threads:
                t.join()


class _Waiter:
    """A future that resolves once each of ``left`` logs has been fsynced after the append it waits for."""

    __slots__ = ("fut", "left")

    def __init__(self, fut: asyncio.Future[None], left: int) -> None:
        self.fut = fut
        self.left = left


class GroupCommitter:
    def __init__(
        self, fsync_on_ack: bool = True, flush_interval_ms: int = 1000, log_dir: LogDirFailureChannel | None = None
    ) -> None:
        # the log directory of every log synced here: offline after the first fsync error
        self.log_dir = log_dir if log_dir is not None else LogDirFailureChannel()
        self.fsync_on_ack = fsync_on_ack
        self.flush_interval_ms = flush_interval_ms
        self._dirty: dict["Partition", None] = {}
        self._waiting: dict["Partition", list[_Waiter]] = {}  # waiters for each log's next fsync
        self._inflight: set["Partition"] = set()  # logs whose round is running
        self._rounds: set[asyncio.Future[None]] = set()  # the running rounds
        self._kick_scheduled = False
        self._pool = DaemonThreadExecutor(8, "flush")  # periodic_flush only (daemon: an fdatasync may hang)
        self._sync_threads = SyncThreads(16)  # the acks rounds (_sync_all); rounds may run side by side
        self.rounds = 0
        self.synced_files = 0
        self.shortage_retries = 0  # rounds retried for want of a descriptor (DescriptorShortageError)
        self._backoff = 0.0  # the next retry's delay (s); 0 once every retried log synced
        self._retrying: set["Partition"] = set()  # logs of the current streak of retries (warned once)
        self._streak_retries = 0
        self._retry_timer: asyncio.TimerHandle | None = None
        self._postponed: dict["Partition", None] = {}  # logs waiting for the retry timer
        self._given_up = False  # drain_for timed out (shutdown): no more retries

    def wait_durable(self, partition: "Partition") -> asyncio.Future[None] | None:
        """Mark ``partition`` dirty; return a future that resolves once durable.

        Returns ``None`` when acknowledgements do not wait for fsync (then the
        data is visible to consumers at once, as with Kafka's default flush).
        Once the log directory is offline: a failed future.
        """
        if self.log_dir.offline:
            return self._offline()
        self._dirty[partition] = None
        if not self.fsync_on_ack:
            partition.advance_high_watermark(partition.log.log_end_offset)
            return None
        return self._wait([partition])

    def wait_durable_all(self, partitions: list["Partition"]) -> asyncio.Future[None] | None:
        """:meth:`wait_durable` for several partitions appended together (no ``await``
        in between, so one round covers them all): one future for all of them.

        Returns ``None`` when acknowledgements do not wait for fsync, or when
        ``partitions`` is empty."""
        if not partitions:
            return None
        if self.log_dir.offline:
            return self._offline()
        if not self.fsync_on_ack:
            for p in partitions:
                self._dirty[p] = None
                p.advance_high_watermark(p.log.log_end_offset)
            return None
        for p in partitions:
            self._dirty[p] = None
        return self._wait(partitions)

    def _offline(self) -> asyncio.Future[None]:
        """A future failed with the offline directory's error (marked retrieved: a caller
        that drops it leaves no "never retrieved" warning; one that awaits it gets the error)."""
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(self.log_dir.error())
        fut.exception()
        return fut

    def _wait(self, partitions: list["Partition"]) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        unique = list(dict.fromkeys(partitions))
        waiter = _Waiter(loop.create_future(), len(unique))
        for p in unique:
            self._waiting.setdefault(p, []).append(waiter)
        if not self._kick_scheduled:
            # in the next loop pass: the appends of this pass (and of the tasks it woke) join the round
            self._kick_scheduled = True
            loop.call_soon(self._kick)
        return waiter.fut

    def _kick(self) -> None:
        """Start a round over every dirty log that is not in a running round.

        Rounds over different logs run at the same time (a transaction-log record
        does not wait behind a round of partition fsyncs it has nothing to do with);
        a log appended to while its round runs waits for that round and goes into
        the next one, so each log has one fsync at a time and a busy log still
        amortises one fsync over every append made meanwhile."""
        self._kick_scheduled = False
        if not self._dirty:
            return
        inflight = self._inflight
        files = [p for p in self._dirty if p not in inflight]
        if not files:
            return
        for p in files:
            del self._dirty[p]
        inflight.update(files)
        ends = [p.log.log_end_offset for p in files]
        waiters = [self._waiting.pop(p, ()) for p in files]
        loop = asyncio.get_running_loop()
        try:
            done = self._sync_all(loop, files)
        except BaseException as exc:  # the round could not start (threads closed, no thread): fail its waiters
            done = loop.create_future()
            done.set_exception(exc)
        self._rounds.add(done)
        done.add_done_callback(lambda fut: self._round_done(fut, files, ends, waiters))

    def _round_done(self, fut: asyncio.Future[Any], files: list["Partition"], ends: list[int],
                    waiters: list[Any]) -> None:
        self._rounds.discard(fut)
        error: BaseException | None = None
        short: dict["Partition", BaseException] = {}  # the logs that got no descriptor (nothing synced)
        if fut.cancelled():
            error = asyncio.CancelledError()
        elif isinstance(fut.exception(), DescriptorShortageError):  # the round could not start at all
            short = dict.fromkeys(files, fut.exception())  # type: ignore[arg-type]
        elif fut.exception() is not None:
            error = fut.exception()
            if isinstance(error, OSError):  # never retried: the log directory goes offline
                error = self.log_dir.failed("fsync", error)
            log.debug("fsync round failed: %s", error)
        else:
            short = dict(fut.result() or ())
        if error is None and self.log_dir.offline:
            # a round running beside the failed one: nothing is reported durable any more
            error = self.log_dir.error()
        if error is not None:
            short = {}
        self.rounds += 1
        self.synced_files += len(files) - len(short)
        self._inflight.difference_update(files)
        if short:
            # only the logs that got no descriptor wait for a retry, with their waiters (a waiter
            # of several logs is released once all are synced); the others are durable now
            pairs = [(p, ws) for p, ws in zip(files, waiters) if p in short]
            if self._given_up:  # shutting down: not retried, nothing of theirs is durable
                for p, ws in pairs:
                    for w in ws:
                        if not w.fut.done():
                            w.fut.set_exception(short[p])
            else:
                self._retry_round([p for p, _ in pairs], [ws for _, ws in pairs], next(iter(short.values())))
        if error is not None:
            self._retrying.difference_update(files)  # failed for good: not retried any more
        elif self._retrying:
            self._end_streak([p for p in files if p not in short])
        if error is None:
            for p, end in zip(files, ends):
                if p not in short:
                    p.advance_high_watermark(end)
        for p, ws in zip(files, waiters):
            if p in short:
                continue
            for w in ws:
                if w.fut.done():
                    continue
                if error is not None:  # nothing of the round is durable
                    w.fut.set_exception(error)
                else:
                    w.left -= 1
                    if w.left == 0:
                        w.fut.set_result(None)
        if self.log_dir.offline:
            self._fail_waiting()
            return
        if self._dirty and not self._kick_scheduled:
            # after the waiters just released: what they append at once joins the next round
            self._kick_scheduled = True
            asyncio.get_running_loop().call_soon(self._kick)

    def _retry_round(self, files: list["Partition"], waiters: list[Any], exc: BaseException | None) -> None:
        """These logs could not get a descriptor before any fdatasync (nothing synced, the
        segments stay marked unsynced): they wait with their waiters (ahead of those queued
        meanwhile) and go back to the dirty logs after a backoff. The other logs' rounds
        are not held back meanwhile (an append to one of these logs makes it dirty again
        at once, and its round may retry it sooner)."""
        for p, ws in zip(files, waiters):
            self._postponed[p] = None
            if ws:
                self._waiting[p] = list(ws) + self._waiting.get(p, [])
        self.shortage_retries += 1
        self._streak_retries = self._streak_retries + 1 if self._retrying else 1
        self._backoff = min(1.0, max(0.01, self._backoff * 2))
        # once per streak: a retry every 10 ms to 1 s would otherwise log up to ~100 lines a second
        level = logging.DEBUG if self._retrying else logging.WARNING
        log.log(level, "fsync round postponed %.0f ms (retried until a descriptor is free): %s",
                self._backoff * 1000, exc)
        self._retrying.update(files)
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        # drain() keeps waiting for the retry
        self._retry_timer = asyncio.get_running_loop().call_later(self._backoff, self._retried_kick)

    def _retried_kick(self) -> None:
        self._retry_timer = None
        postponed, self._postponed = self._postponed, {}
        self._dirty.update(postponed)
        if not self._kick_scheduled:
            self._kick()

    def _end_streak(self, synced: list["Partition"]) -> None:
        """Logs of the streak of retries synced: once all have, the streak ends (the next
        postponed round warns again, with the backoff back at its start). A round of other
        logs ends nothing."""
        before = len(self._retrying)
        self._retrying.difference_update(synced)
        if before and not self._retrying:
            self._backoff = 0.0
            log.info("fsync rounds resumed after %d postponed round(s)", self._streak_retries)

    def _cancel_retry(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        self._postponed.clear()

    def _give_up(self) -> None:
        """Shutdown past :meth:`drain_for`'s bound: no more retries; the waiters of the logs
        not in a running round fail now (those of running rounds fail if their round gets
        no descriptor either), with a retriable storage error. Their data stays unsynced:
        the log's close syncs it if it can, or leaves it to recovery."""
        self._given_up = True
        self._fail_waiting(DescriptorShortageError(errno.EMFILE, "no descriptor to sync the log before shutdown; "
                                                   "not acknowledged as durable"))

    def _fail_waiting(self, error: BaseException | None = None) -> None:
        """Fail every waiter of a log not in a running round with ``error`` (by default: the
        log directory is offline; those of running rounds fail when their round ends), and
        forget the dirty logs and any postponed retry."""
        if error is None:
            error = self.log_dir.error()
        self._cancel_retry()
        waiting, self._waiting = self._waiting, {}
        self._dirty.clear()
        for ws in waiting.values():
            for w in ws:
                if not w.fut.done():
                    w.fut.set_exception(error)

    def _sync_all(self, loop: asyncio.AbstractEventLoop, dirty: list["Partition"]) -> asyncio.Future[Any]:
        """fdatasync every log of ``dirty`` concurrently in the worker threads; the
        future resolves (on the loop) once all are done: with the first error if one
        failed otherwise than for want of a descriptor, else with the list of
        ``(log, DescriptorShortageError)`` of the logs that could not get one (the
        others are synced). Only the last worker to finish wakes the loop."""
        done: asyncio.Future[Any] = loop.create_future()
        if not dirty:  # waiters without a dirty log (none today): nothing to sync
            done.set_result(None)
            return done
        left = [len(dirty)]
        errors: list[tuple["Partition", BaseException]] = []
        lock = threading.Lock()

        def finish() -> None:
            if done.done():  # the round's task was cancelled (shutdown)
                return
            failed = [exc for _, exc in errors if not isinstance(exc, DescriptorShortageError)]
            if failed:
                done.set_exception(failed[0])
            else:
                done.set_result(errors)

        def sync(p: "Partition") -> None:
            try:
                p.log.sync()
            except BaseException as exc:
                errors.append((p, exc))
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                try:
                    loop.call_soon_threadsafe(finish)
                except RuntimeError:  # the loop is closed (shutdown)
                    pass

        threads = self._sync_threads
        threads.ensure(max(len(dirty), len(self._inflight)))  # a thread for every fsync running at once
        for p in dirty:
            threads.submit(lambda p=p: sync(p))
        return done

    async def periodic_flush(self) -> None:
        """Background flush for ``log.flush.interval.messages`` > 1."""
        loop = asyncio.get_running_loop()
        while not self.log_dir.offline:
            await asyncio.sleep(self.flush_interval_ms / 1000)
            dirty, self._dirty = list(self._dirty), {}
            for p in dirty:
                try:
                    await loop.run_in_executor(self._pool, p.log.sync)
                except DescriptorShortageError as exc:  # nothing synced: the next pass retries
                    self._dirty[p] = None
                    log.warning("background flush postponed: %s", exc)
                except OSError as exc:  # the log directory is offline: the broker stops
                    self.log_dir.failed("fsync", exc)
                    log.debug("background flush failed: %s", exc)
                    return

    async def drain(self) -> None:
        """Wait until every log appended so far is synced (the running rounds and the ones they lead to).

        Cancelling the drain cancels only the drain: the rounds it waits on go on, since
        produce answers wait on them too (``asyncio.wait`` does not cancel what it waits
        for; ``gather`` would, and every waiter of the round would fail)."""
        while (self._rounds or self._kick_scheduled or self._retry_timer is not None
               or (self._dirty and self.fsync_on_ack and self._waiting)):
            if self._rounds:
                await asyncio.wait(list(self._rounds))
            # a round postponed for want of a descriptor (_retry_round) starts later: no busy wait
            await asyncio.sleep(0.005 if self._retry_timer is not None else 0)

    async def drain_for(self, timeout: float) -> bool:
        """:meth:`drain`, for ``timeout`` seconds at most (shutdown): True if everything
        appended was synced; False if not, and then the rounds postponed for want of a
        descriptor are given up (their waiters fail; nothing of theirs is reported durable)."""
        try:
            await asyncio.wait_for(self.drain(), timeout)
            return True
        except asyncio.TimeoutError:
            self._give_up()
            log.warning("shutdown: appends still not synced after %.0f s (%d log(s) waiting for a file "
                        "descriptor); their requests fail, nothing unsynced is acknowledged",
                        timeout, len(self._retrying))
            return False

    def close(self) -> None:
        self._sync_threads.close()
        self._pool.shutdown(wait=True)

    def abandon(self) -> None:
        """Stop without waiting for the worker threads (the log directory failed: an
        fdatasync may hang); they are daemon threads (both kinds) and end with the process."""
        self._sync_threads.close(wait=False)
        self._pool.shutdown(wait=False, cancel_futures=True)
