"""The log cleaner: compaction of ``cleanup.policy=compact`` topics in the background.

Kafka's ``LogCleaner`` with ``log.cleaner.threads`` cleaners (tasks here): each,
every ``log.cleaner.backoff.ms`` when idle, picks on the event loop the
filthiest compacted partition that no other cleaner holds
(:func:`~oncelog.storage.cleaner.cleanable_range`: the highest dirty ratio
above ``min.cleanable.dirty.ratio``, or any whose dirty data is older than
``max.compaction.lag.ms``), bounded by the partition's last stable offset and
the active segment; ``in_progress`` (Kafka's LogCleanerManager) keeps two
cleaners off one partition. Then:

1. a cleaner process (``multiprocessing``, spawned once a compacted topic
   exists, one per cleaner; nice 19, so also the lowest best-effort I/O
   priority) runs :func:`~oncelog.storage.cleaner.run_clean_job`: the offset map (memory bounded by ``log.cleaner.dedupe.buffer.size`` over the
   cleaners) and every group's ``.cleaned`` segment, I/O throttled to the
   cleaner's share of ``log.cleaner.io.max.bytes.per.second``. A process, not a
   thread: the pure-Python work would hold the serving process's interpreter lock;
2. a worker thread commits the swaps (:meth:`PartitionLog.commit_cleaned`);
3. the event loop installs each group (:meth:`PartitionLog.install_cleaned`:
   renames and the in-memory segment list, the only part on the loop), and
   the worker thread finishes (:meth:`PartitionLog.finish_swaps`);
4. a background thread removes the replaced files gradually (:class:`_Deleter`).

Each pass logs one INFO line: partition, cleaner, bytes read and written,
records kept and removed, the time of each phase, the event loop's worst lag
during the pass, duration, throughput and the dirty ratio it started from.
The partition passes its producers' last offsets and the aborted
transactions in; storage knows no producers. See docs/compaction.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oncelog.broker.durability import DaemonThreadExecutor
from oncelog.protocol.records import InvalidRecordError
from oncelog.storage.fileutil import remove_gradually
from oncelog.storage.log_dir import LogDirFailureChannel, guarded, log_level
from oncelog.storage.cleaner import (
    CleanableRange,
    CleanerStats,
    CleaningAborted,
    CleanJob,
    CleanResult,
    cleanable_range,
    run_clean_job,
)

if TYPE_CHECKING:
    from oncelog.broker.broker import Broker
    from oncelog.broker.partition import Partition

log = logging.getLogger("oncelog.cleaner")

_LONG_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The broker's ``log.cleaner.*`` settings (Kafka's names and defaults)."""

    enable: bool = True
    threads: int = 1
    dedupe_buffer_size: int = 134_217_728
    io_buffer_load_factor: float = 0.9
    io_max_bytes_per_second: float = 1.7976931348623157e308
    backoff_ms: int = 15_000


@dataclass(slots=True)
class PassResult:
    partition: str
    first_dirty: int
    end_offset: int
    ratio: float
    stats: CleanerStats
    swapped: int
    cleaner: int = 0
    started: float = 0.0  # time.monotonic()
    ended: float = 0.0


class LogCleaner:
    """One background cleaner for every compacted partition of a broker."""

    def __init__(self, broker: "Broker", config: CleanerConfig, deleter: "_Deleter | None" = None) -> None:
        self.broker = broker
        self.config = config
        self._pool: Any = None  # the cleaner processes (multiprocessing, spawn), started on first use
        self._pool_lock = threading.Lock()
        self._executor: DaemonThreadExecutor | None = None
        self._stopping = False
        self._wake = asyncio.Event()
        self.passes: list[PassResult] = []  # the last few, for tests and tools
        # partitions being cleaned, by name, with the cleaner (0 .. threads-1) on each (Kafka's
        # LogCleanerManager.inProgress): never two cleaners on one partition
        self.in_progress: dict[str, int] = {}
        self.install_max_s = 0.0  # the longest in-loop step of a swap so far
        # handed on to the next cleaner on a reconfiguration
        self.deleter = deleter or _Deleter(getattr(broker, "log_dir", None))

    @property
    def enabled(self) -> bool:
        return self.config.enable and self.config.threads > 0

    # -- the loop side ------------------------------------------------------------------------

    def choose(self, now_ms: int) -> tuple["Partition", CleanableRange] | None:
        """The filthiest partition worth cleaning now that no other cleaner is working on
        (Kafka's grabFilthiestCompactedLog)."""
        best: tuple[Partition, CleanableRange] | None = None
        log_dir = getattr(self.broker, "log_dir", None)
        if log_dir is not None and log_dir.offline:  # Kafka's cleaner drops a failed directory's logs
            return None
        for p in self.broker.all_partitions():
            plog = p.log
            cfg = plog.config
            if not cfg.compact or plog.closed or f"{p.topic}-{p.index}" in self.in_progress:
                continue
            rng = cleanable_range(
                plog.segment_infos(),
                plog.log_start_offset,
                plog.cleaner_checkpoint(),
                p.last_stable_offset,
                now_ms,
                int(cfg.get("min.compaction.lag.ms")),  # type: ignore[arg-type]
                int(cfg.get("max.compaction.lag.ms")),  # type: ignore[arg-type]
            )
            if not rng.should_clean(float(cfg.get("min.cleanable.dirty.ratio"))):  # type: ignore[arg-type]
                continue
            if best is None or (rng.needs_compaction_now, rng.ratio) > (best[1].needs_compaction_now, best[1].ratio):
                best = (p, rng)
        return best

    async def run(self) -> None:
        """The cleaners (``log.cleaner.threads`` of them, Kafka's CleanerThreads): each cleans
        while there is work no other cleaner has taken, and backs off when there is none."""
        if not self.enabled:
            return
        threads = self.config.threads
        # daemon threads: a step stuck in an fsync of a failing disk must not keep the process from exiting
        self._executor = DaemonThreadExecutor(threads, "oncelog-cleaner")
        await asyncio.gather(*(self._cleaner(i) for i in range(threads)))

    async def _cleaner(self, cleaner_id: int) -> None:
        while not self._stopping:
            cleaned = False
            try:
                if self._pool is None and any(p.log.config.compact for p in self.broker.all_partitions()):
                    await self._step(self._ensure_pool)  # as soon as a compacted topic exists
                cleaned = await self.clean_once(cleaner_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one bad log must not stop the cleaner
                if log_level(exc, logging.ERROR) == logging.DEBUG:  # the log directory is offline
                    log.debug("log cleaner pass failed: %s", exc)
                else:
                    log.exception("log cleaner pass failed")
            if not cleaned:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.config.backoff_ms / 1000)
                except asyncio.TimeoutError:
                    pass

    def wake(self) -> None:
        self._wake.set()

    async def stop(
        self, task: "asyncio.Task[None] | None" = None, keep_deleter: bool = False, timeout: float | None = None,
        quiet: bool = False,
    ) -> None:
        """Stop after the current step; ``task`` is the :meth:`run` task to wait for (at a
        normal stop for as long as the step takes; when halting, up to ``timeout`` seconds). A pass stopped half-way leaves files that the next start rolls
        back or forward. ``keep_deleter``: the replaced segments still being removed are left
        to :attr:`deleter`, which the next cleaner takes over (a reconfiguration). If the
        step is still running after ``timeout`` (stuck in an fsync of a failing disk, say),
        its thread is left behind: a daemon thread, it does not keep the process from
        exiting. ``quiet``: say so at DEBUG (the broker is halting and logged why)."""
        self._stopping = True
        self._wake.set()
        if not keep_deleter:
            self.deleter.stop()
        finished = True
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                finished = task.done()
                log.log(logging.DEBUG if quiet else logging.WARNING,
                        "log cleaner still busy at shutdown; recovery finishes its swap")
        if self._pool:
            self._pool.terminate()
        if self._executor is not None:
            if finished:  # its threads are idle: a quick join
                await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
            else:  # not from the default executor either, whose shutdown asyncio.run waits for
                self._executor.shutdown(wait=False, cancel_futures=True)

    async def _step(self, fn: Any, *args: Any) -> Any:
        """Run one step in the cleaner thread (CleaningAborted once stopping)."""
        if self._stopping or self._executor is None:
            raise CleaningAborted()
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def clean_once(self, cleaner_id: int = 0) -> bool:
        """One pass over the filthiest partition no other cleaner holds; False if none
        needed cleaning."""
        now_ms = self.broker.clock()
        chosen = self.choose(now_ms)
        if chosen is None:
            return False
        partition, rng = chosen
        name = f"{partition.topic}-{partition.index}"
        self.in_progress[name] = cleaner_id  # taken before the first await: no other cleaner picks it
        try:
            result = await self.clean_partition(partition, rng, now_ms, cleaner_id)
        finally:
            del self.in_progress[name]
        return result is not None and result.end_offset > rng.first_dirty

    async def clean_partition(
        self, partition: "Partition", rng: CleanableRange, now_ms: int, cleaner_id: int = 0
    ) -> PassResult | None:
        plog = partition.log
        cfg = plog.config
        name = f"{partition.topic}-{partition.index}"
        if plog.failure_channel.offline:  # it went offline since choose(): nothing more is written there
            return None
        pinned = plog.pin_segments(rng.first_uncleanable)
        for p in pinned:  # the cleaner process opens the files itself
            p.close()
        if not pinned:
            return None
        started = time.monotonic()
        job = CleanJob(
            directory=str(plog.directory),
            segments=[(p.base_offset, p.next_base, p.size) for p in pinned],
            first_dirty=rng.first_dirty,
            first_uncleanable=rng.first_uncleanable,
            aborted=[
                (t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
                for t in plog.collect_aborted_txns(pinned[0].base_offset, rng.first_uncleanable)
            ],
            last_records={
                e.producer_id: (e.last_offset if e.batches else None, e.epoch) for e in partition.producers
            },
            now_ms=now_ms,
            delete_retention_ms=int(cfg.get("delete.retention.ms")),  # type: ignore[arg-type]
            segment_bytes=cfg.segment_bytes,
            index_interval_bytes=cfg.index_interval_bytes,
            # Kafka's split: each cleaner gets its share of the dedupe buffer and of the I/O limit
            map_memory=max(self.config.dedupe_buffer_size // max(self.config.threads, 1), 24),
            load_factor=self.config.io_buffer_load_factor,
            io_max_bytes_per_second=self.config.io_max_bytes_per_second / max(self.config.threads, 1),
        )
        by_base = {p.base_offset: i for i, p in enumerate(pinned)}
        loop = asyncio.get_running_loop()
        segs: list[Any] = []
        result: CleanResult | None = None
        swapped = opened = 0
        phases: dict[str, float] = {}
        install_max = 0.0
        lag = _LoopLag()
        lag_task = loop.create_task(lag.run())
        try:
            t = time.monotonic()
            result = await self._step(self._run_job, job)
            groups = result.groups
            for base, _end in groups:
                segs.append(await self._step(plog.open_cleaned_segment, base, now_ms))
                opened += 1
            t, phases["job"] = time.monotonic(), time.monotonic() - t
            if segs:
                await self._step(plog.commit_cleaned, segs, groups)
            t, phases["commit"] = time.monotonic(), time.monotonic() - t
            installed: list[tuple[int, int]] = []
            for seg, (base, end) in zip(segs, groups):
                group = [p for p in pinned[by_base[base] :] if p.base_offset < end]
                t0 = time.perf_counter()
                ok = not self._stopping and plog.install_cleaned(group, seg)
                install_max = max(install_max, time.perf_counter() - t0)
                if not ok:
                    log.info("%s: compaction stopped: the segments changed under it or the broker is closing", name)
                    break
                installed.append((base, end))
                await asyncio.sleep(0)  # one group at a time: requests run in between
            self.install_max_s = max(self.install_max_s, install_max)
            t, phases["install"] = time.monotonic(), time.monotonic() - t
            swapped = len(installed)
            dropped, segs = segs[swapped:], []
            if installed or dropped:
                old = await loop.run_in_executor(self._executor, plog.finish_swaps, installed, dropped, False)
                self.deleter.submit(old)
            if dropped:
                return None
            await self._step(plog.write_cleaner_checkpoint, result.end_offset)
            phases["finish"] = time.monotonic() - t
        except CleaningAborted:
            return None
        except CleaningFailed as exc:  # a corrupt batch, or a segment retention deleted under the job
            if not plog.closed:
                log.error("%s: compaction failed: %s", name, exc)
            return None
        except OSError as exc:
            if not plog.closed:
                # Kafka's cleaner: an IOException takes the log directory offline (the broker
                # stops and says why, once); the steps under PartitionLog.io already did
                error = plog.failure_channel.failed(f"compaction of {name}", exc)
                log.log(log_level(error, logging.ERROR), "%s: compaction failed: %s", name, exc)
            return None
        finally:
            lag_task.cancel()
            if segs:  # opened or committed, never installed
                try:
                    await loop.run_in_executor(self._executor, plog.abort_cleaned, segs)
                except (OSError, RuntimeError):
                    pass
            if result is not None:
                for base, _end in result.groups[opened:]:  # written by the cleaner process, never opened
                    try:
                        plog.discard_cleaned(base)
                    except OSError:
                        pass
        assert result is not None
        stats = result.stats
        secs = max(time.monotonic() - started, 1e-9)
        read = stats.bytes_read + stats.map_bytes
        log.info(
            "%s: compaction pass done: offsets [%d, %d) by cleaner %d, dirty ratio %.2f, %d segment group(s); read %d bytes "
            "(%d records, %.1f MB/s), wrote %d bytes, kept %d records, removed %d, offset map %d keys "
            "(%.0f%% full); phases: map %.3f s, copy %.3f s, sync %.3f s (throttled %.3f s), commit %.3f s, "
            "install %.3f s, finish %.3f s; event-loop lag max %.1f ms; longest in-loop swap step %.1f ms, %.3f s",
            name, rng.first_dirty, result.end_offset, cleaner_id, rng.ratio, swapped, read, stats.records_read,
            read / secs / 1e6, stats.bytes_written, stats.records_kept, stats.records_removed, result.map_size,
            100 * result.map_utilization, stats.map_s, stats.copy_s, stats.sync_s, stats.throttled_s,
            phases.get("commit", 0.0), phases.get("install", 0.0), phases.get("finish", 0.0), lag.max_s * 1000,
            install_max * 1000, secs,
        )  # fmt: skip
        out = PassResult(name, rng.first_dirty, result.end_offset, rng.ratio, stats, swapped, cleaner_id, started,
                         time.monotonic())
        self.passes = (self.passes + [out])[-20:]
        return out

    # -- the worker side ----------------------------------------------------------------------

    def _ensure_pool(self) -> Any:
        """The cleaner processes (one per cleaner, ``log.cleaner.threads``), started (and
        their imports done) on first use; False where no process can be started (no POSIX
        semaphores, say): passes then run in the cleaner threads, sharing the serving
        process's interpreter lock."""
        with self._pool_lock:  # the cleaners' threads may ask at once
            if self._pool is None:
                n = max(self.config.threads, 1)
                try:
                    ctx = multiprocessing.get_context("spawn")
                    with _main_hidden():
                        pool = ctx.Pool(n, initializer=_child_init)
                    pool.map(_warm, range(n), chunksize=1)
                    self._pool = pool
                except (OSError, ImportError) as exc:
                    log.warning("cannot start the cleaner process (%s); cleaning in a thread of the broker", exc)
                    self._pool = False
            return self._pool

    def _run_job(self, job: CleanJob) -> CleanResult:
        """Run the pass's heavy part in the cleaner process (started on first use) and wait,
        giving up if the broker is stopping (the process is then terminated)."""
        pool = self._ensure_pool()
        try:
            if pool is False:
                return run_clean_job(job)
            pending = pool.apply_async(run_clean_job, (job,))
            while True:
                try:
                    return pending.get(0.2)
                except multiprocessing.TimeoutError:
                    if self._stopping:
                        raise CleaningAborted() from None
        except (FileNotFoundError, InvalidRecordError, ValueError) as exc:
            # no disk failure: a segment retention or DeleteRecords deleted while the job read it,
            # or a corrupt batch (Kafka's cleaner marks such a log uncleanable, its directory
            # stays online); any other OSError takes the log directory offline (clean_partition)
            raise CleaningFailed(f"cleaning failed: {exc}") from None


class CleaningFailed(Exception):
    """A pass that failed without a disk error (logged; the log directory stays online)."""


class _Deleter:
    """Removes the segment files a pass replaced, one at a time in the background, each cut
    down ``CHUNK`` bytes at a time with a ``PAUSE_S`` pause in between
    (:func:`~oncelog.storage.fileutil.remove_gradually`): a pass's worth of old segments
    unlinked at once (100 MB: 0.2-0.33 s on an ext4 mounted with ``discard``) puts every
    block free, and its TRIM, into one journal commit, which every fsync on the file
    system, the broker's group commit included, then waits for. Files left when the
    broker stops are ``.deleted`` files, which the next start removes (recovery)."""

    CHUNK = 2 << 20
    PAUSE_S = 0.02

    def __init__(self, log_dir: "LogDirFailureChannel | None" = None) -> None:
        self.log_dir = log_dir  # an OSError (but ENOENT: the file went) takes it offline
        self._queue: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.freed = 0

    def submit(self, paths: list[Path]) -> None:
        if not paths or self._stop.is_set():
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="oncelog-cleaner-deleter", daemon=True)
            self._thread.start()
        for p in paths:
            self._queue.put(p)

    def _run(self) -> None:
        while True:
            path = self._queue.get()
            if path is None or self._stop.is_set() or (self.log_dir is not None and self.log_dir.offline):
                return
            try:
                with guarded(self.log_dir, f"removal of {path.parent.name}/{path.name}"):
                    self.freed += remove_gradually(path, self.CHUNK, lambda: self._stop.wait(self.PAUSE_S))
            except OSError as exc:  # Kafka's async segment deletion: the log directory goes offline
                log.log(log_level(exc, logging.WARNING), "cannot remove %s: %s (the next start removes it)", path, exc)
                if self.log_dir is not None:
                    return

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(None)


class _LoopLag:
    """The event loop's lag while a pass runs: how late a 5 ms timer fires, at worst."""

    INTERVAL_S = 0.005

    def __init__(self) -> None:
        self.max_s = 0.0

    async def run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.INTERVAL_S)
            self.max_s = max(self.max_s, time.perf_counter() - t - self.INTERVAL_S)


CHILD_NICE = 19


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Start processes without multiprocessing's re-import of ``__main__`` in the child:
    an embedding program (``EmbeddedBroker(mode="thread")`` in a script with no
    ``if __name__ == "__main__"`` guard) would otherwise run again in the cleaner process.
    The cleaner process needs nothing from ``__main__``."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            if "__spec__" in saved:
                main.__spec__ = None
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


def _warm(_n: int = 0) -> None:
    """Nothing but a short wait: a first task makes a cleaner process import what a pass
    needs (the wait lets every process of the pool get one)."""
    time.sleep(0.05)


def _lower_priority() -> None:
    """Lowest CPU priority, nice 19, which on Linux also gives the lowest best-effort I/O
    priority (with no I/O class set, the kernel derives ``ionice -c2 -n7`` from nice 19;
    not the idle class, which a busy disk can starve). The process stays in the broker's
    session, so where the kernel groups tasks by session (Linux autogroup) or the broker
    runs in a cgroup of its own, the cleaner's CPU time counts against the broker's share,
    as a Kafka cleaner thread's does, and within that share the serving thread goes first.
    (A group of its own at nice 19 was tried: on a saturated machine the cleaner then got
    about 1.5 % of a core and a 100 MB pass outlasted the benchmark's 8 s window.)"""
    try:
        os.nice(CHILD_NICE)
    except OSError:  # not allowed here: run at the broker's priority
        pass


def _child_init() -> None:
    """The cleaner process leaves Ctrl-C to the broker (which terminates it) and runs at the
    lowest CPU and I/O priority (:func:`_lower_priority`): on a busy machine the broker's
    serving thread goes first."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _lower_priority()
    # dies with the broker (kill -9 included): an orphan must not go on writing .cleaned
    # files into a data directory that a restarted broker recovers and cleans again
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the broker died before the line above ran
        os._exit(1)


_DYNAMIC_SETTINGS = {  # dynamic broker config -> (CleanerConfig field, type)
    "log.cleaner.threads": ("threads", int),
    "log.cleaner.dedupe.buffer.size": ("dedupe_buffer_size", int),
    "log.cleaner.io.buffer.load.factor": ("io_buffer_load_factor", float),
    "log.cleaner.io.max.bytes.per.second": ("io_max_bytes_per_second", float),
    "log.cleaner.backoff.ms": ("backoff_ms", int),
}


def cleaner_config(broker_config: Any, dynamic: dict[str, str] | None = None) -> CleanerConfig:
    """The cleaner's settings: the static ones, overridden by the stored dynamic broker
    configs (``dynamic``; changed at run time, the server restarts the cleaners with them)."""
    values: dict[str, Any] = dict(
        enable=broker_config.log_cleaner_enable,
        threads=broker_config.log_cleaner_threads,
        dedupe_buffer_size=broker_config.log_cleaner_dedupe_buffer_size,
        io_buffer_load_factor=broker_config.log_cleaner_io_buffer_load_factor,
        io_max_bytes_per_second=broker_config.log_cleaner_io_max_bytes_per_second,
        backoff_ms=broker_config.log_cleaner_backoff_ms,
    )
    for name, raw in (dynamic or {}).items():
        if name in _DYNAMIC_SETTINGS:
            field_name, kind = _DYNAMIC_SETTINGS[name]
            try:
                values[field_name] = kind(raw.strip())
            except ValueError:
                log.error("ignoring the dynamic %s=%r", name, raw)
    return CleanerConfig(**values)
