"""The log cleaner: compaction of ``cleanup.policy=compact`` topics in the background.

Kafka's ``LogCleaner`` with one cleaner (``log.cleaner.threads``): every
``log.cleaner.backoff.ms`` when idle, the event loop picks the filthiest
compacted partition (:func:`~oncelog.storage.cleaner.cleanable_range`: the
highest dirty ratio above ``min.cleanable.dirty.ratio``, or any whose dirty
data is older than ``max.compaction.lag.ms``), bounded by the partition's last
stable offset and the active segment. Then:

1. the cleaner process (``multiprocessing``, spawned once a compacted topic
   exists, nice 19)
   runs :func:`~oncelog.storage.cleaner.run_clean_job`: the offset map (memory
   bounded by ``log.cleaner.dedupe.buffer.size``) and every group's
   ``.cleaned`` segment, I/O throttled to
   ``log.cleaner.io.max.bytes.per.second``. A process, not a thread: the
   pure-Python work would hold the serving process's interpreter lock;
2. a worker thread commits the swaps (:meth:`PartitionLog.commit_cleaned`);
3. the event loop installs each group (:meth:`PartitionLog.install_cleaned`:
   renames and the in-memory segment list, the only part on the loop), and
   the worker thread finishes (:meth:`PartitionLog.finish_swaps`).

Each pass logs one INFO line: partition, bytes read and written, records
kept and removed, duration, throughput and the dirty ratio it started from.
The partition passes its producers' last offsets and the aborted
transactions in; storage knows no producers. See docs/compaction.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oncelog.protocol.records import InvalidRecordError
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


class LogCleaner:
    """One background cleaner for every compacted partition of a broker."""

    def __init__(self, broker: "Broker", config: CleanerConfig) -> None:
        self.broker = broker
        self.config = config
        self._pool: Any = None  # the cleaner process (multiprocessing, spawn), started on first use
        self._executor: ThreadPoolExecutor | None = None
        self._stopping = False
        self._wake = asyncio.Event()
        self.passes: list[PassResult] = []  # the last few, for tests and tools
        self.busy: str | None = None  # the partition being cleaned
        self.install_max_s = 0.0  # the longest in-loop step of a swap so far

    @property
    def enabled(self) -> bool:
        return self.config.enable and self.config.threads > 0

    # -- the loop side ------------------------------------------------------------------------

    def choose(self, now_ms: int) -> tuple["Partition", CleanableRange] | None:
        """The filthiest partition worth cleaning now (Kafka's grabFilthiestCompactedLog)."""
        best: tuple[Partition, CleanableRange] | None = None
        for p in self.broker.all_partitions():
            plog = p.log
            cfg = plog.config
            if not cfg.compact or plog.closed:
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
        """The cleaner task: clean while there is work, back off when there is none."""
        if not self.enabled:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="oncelog-cleaner")
        while not self._stopping:
            cleaned = False
            try:
                if self._pool is None and any(p.log.config.compact for p in self.broker.all_partitions()):
                    await self._step(self._ensure_pool)  # as soon as a compacted topic exists
                cleaned = await self.clean_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one bad log must not stop the cleaner
                log.exception("log cleaner pass failed")
            if not cleaned:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.config.backoff_ms / 1000)
                except asyncio.TimeoutError:
                    pass

    def wake(self) -> None:
        self._wake.set()

    async def stop(self, task: "asyncio.Task[None] | None" = None) -> None:
        """Stop after the current step; ``task`` is the :meth:`run` task to wait for. A pass
        stopped half-way leaves files that the next start rolls back or forward."""
        self._stopping = True
        self._wake.set()
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), 30)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                log.warning("log cleaner still busy at shutdown; recovery finishes its swap")
        if self._pool:
            self._pool.terminate()
        if self._executor is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)

    async def _step(self, fn: Any, *args: Any) -> Any:
        """Run one step in the cleaner thread (CleaningAborted once stopping)."""
        if self._stopping or self._executor is None:
            raise CleaningAborted()
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def clean_once(self) -> bool:
        """One pass over the filthiest partition; False if none needed cleaning."""
        now_ms = self.broker.clock()
        chosen = self.choose(now_ms)
        if chosen is None:
            return False
        partition, rng = chosen
        result = await self.clean_partition(partition, rng, now_ms)
        return result is not None and result.end_offset > rng.first_dirty

    async def clean_partition(self, partition: "Partition", rng: CleanableRange, now_ms: int) -> PassResult | None:
        plog = partition.log
        cfg = plog.config
        name = f"{partition.topic}-{partition.index}"
        pinned = plog.pin_segments(rng.first_uncleanable)
        for p in pinned:  # the cleaner process opens the files itself
            p.close()
        if not pinned:
            return None
        self.busy = name
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
            map_memory=max(self.config.dedupe_buffer_size // max(self.config.threads, 1), 24),
            load_factor=self.config.io_buffer_load_factor,
            io_max_bytes_per_second=self.config.io_max_bytes_per_second,
        )
        by_base = {p.base_offset: i for i, p in enumerate(pinned)}
        loop = asyncio.get_running_loop()
        segs: list[Any] = []
        result: CleanResult | None = None
        swapped = opened = 0
        try:
            result = await self._step(self._run_job, job)
            groups = result.groups
            for base, _end in groups:
                segs.append(await self._step(plog.open_cleaned_segment, base, now_ms))
                opened += 1
            if segs:
                await self._step(plog.commit_cleaned, segs, groups)
            installed: list[tuple[int, int]] = []
            for seg, (base, end) in zip(segs, groups):
                group = [p for p in pinned[by_base[base] :] if p.base_offset < end]
                t0 = time.perf_counter()
                ok = not self._stopping and plog.install_cleaned(group, seg)
                self.install_max_s = max(self.install_max_s, time.perf_counter() - t0)
                if not ok:
                    log.info("%s: compaction stopped: the segments changed under it or the broker is closing", name)
                    break
                installed.append((base, end))
                await asyncio.sleep(0)  # one group at a time: requests run in between
            swapped = len(installed)
            dropped, segs = segs[swapped:], []
            if installed or dropped:
                await loop.run_in_executor(self._executor, plog.finish_swaps, installed, dropped)
            if dropped:
                return None
            await self._step(plog.write_cleaner_checkpoint, result.end_offset)
        except CleaningAborted:
            return None
        except OSError as exc:
            if not plog.closed:
                log.error("%s: compaction failed: %s", name, exc)
            return None
        finally:
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
            self.busy = None
        assert result is not None
        stats = result.stats
        secs = max(time.monotonic() - started, 1e-9)
        read = stats.bytes_read + stats.map_bytes
        log.info(
            "%s: compaction pass done: offsets [%d, %d) dirty ratio %.2f, %d segment group(s); read %d bytes "
            "(%d records, %.1f MB/s), wrote %d bytes, kept %d records, removed %d, offset map %d keys "
            "(%.0f%% full), longest in-loop swap step %.1f ms, %.3f s",
            name, rng.first_dirty, result.end_offset, rng.ratio, swapped, read, stats.records_read,
            read / secs / 1e6, stats.bytes_written, stats.records_kept, stats.records_removed, result.map_size,
            100 * result.map_utilization, self.install_max_s * 1000, secs,
        )  # fmt: skip
        out = PassResult(name, rng.first_dirty, result.end_offset, rng.ratio, stats, swapped)
        self.passes = (self.passes + [out])[-20:]
        return out

    # -- the worker side ----------------------------------------------------------------------

    def _ensure_pool(self) -> Any:
        """The cleaner process, started (and its imports done) on first use; False where
        no process can be started (no POSIX semaphores, say): passes then run in the
        cleaner thread, sharing the serving process's interpreter lock."""
        if self._pool is None:
            try:
                ctx = multiprocessing.get_context("spawn")
                with _main_hidden():
                    self._pool = ctx.Pool(1, initializer=_child_init)
                self._pool.apply(_warm)
            except (OSError, ImportError) as exc:
                log.warning("cannot start the cleaner process (%s); cleaning in a thread of the broker", exc)
                self._pool = False
        return self._pool

    def _run_job(self, job: CleanJob) -> CleanResult:
        """Run the pass's heavy part in the cleaner process (started on first use) and wait,
        giving up if the broker is stopping (the process is then terminated)."""
        pool = self._ensure_pool()
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
                raise OSError(f"cleaning failed: {exc}") from None


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


def _warm() -> None:
    """Nothing: a first task makes the cleaner process import what a pass needs."""


def _child_init() -> None:
    """The cleaner process leaves Ctrl-C to the broker (which terminates it) and runs at the
    lowest CPU priority: on a busy machine the broker's serving thread goes first."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(CHILD_NICE)
    except OSError:  # not allowed here: run at the broker's priority
        pass
    # dies with the broker (kill -9 included): an orphan must not go on writing .cleaned
    # files into a data directory that a restarted broker recovers and cleans again
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the broker died before the line above ran
        os._exit(1)


def cleaner_config(broker_config: Any) -> CleanerConfig:
    return CleanerConfig(
        enable=broker_config.log_cleaner_enable,
        threads=broker_config.log_cleaner_threads,
        dedupe_buffer_size=broker_config.log_cleaner_dedupe_buffer_size,
        io_buffer_load_factor=broker_config.log_cleaner_io_buffer_load_factor,
        io_max_bytes_per_second=broker_config.log_cleaner_io_max_bytes_per_second,
        backoff_ms=broker_config.log_cleaner_backoff_ms,
    )
