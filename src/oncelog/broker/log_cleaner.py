"""The log cleaner: compaction of ``cleanup.policy=compact`` topics in the background.

Kafka's ``LogCleaner`` with one cleaner thread (``log.cleaner.threads``): every
``log.cleaner.backoff.ms`` when idle, the event loop picks the filthiest
compacted partition (:func:`~oncelog.storage.cleaner.cleanable_range`: the
highest dirty ratio above ``min.cleanable.dirty.ratio``, or any whose dirty
data is older than ``max.compaction.lag.ms``), bounded by the partition's last
stable offset and the active segment. The work then runs in a dedicated
worker thread:

1. build the offset map from the dirty range (memory bounded by
   ``log.cleaner.dedupe.buffer.size``);
2. for each group of segments (``segment.bytes`` at most), write the
   retained batches to a ``.cleaned`` segment and commit the swap
   (:meth:`PartitionLog.commit_cleaned`);
3. back on the loop, :meth:`PartitionLog.install_cleaned` renames the files
   and replaces the segments in memory (a few renames: the only part on the
   loop), then the worker finishes the swap.

Reads and writes are throttled to ``log.cleaner.io.max.bytes.per.second``.
Each pass logs one INFO line: partition, bytes read and written, records
kept and removed, duration, throughput and the dirty ratio it started from.
The partition passes its producers' last offsets and the aborted
transactions in; storage knows no producers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oncelog.protocol.records import parse_batch_header
from oncelog.storage.cleaner import (
    BatchFilter,
    CleanableRange,
    CleanerStats,
    CleaningAborted,
    LastRecord,
    OffsetMap,
    Throttler,
    TxnTracker,
    build_offset_map,
    cleanable_range,
    group_segments,
)

if TYPE_CHECKING:
    from oncelog.broker.broker import Broker
    from oncelog.broker.partition import Partition
    from oncelog.storage.log import PartitionLog, PinnedSegment
    from oncelog.storage.segment import Segment

log = logging.getLogger("oncelog.cleaner")

_LONG_MAX = 2**63 - 1
YIELD_EVERY_S = 0.001  # the worker releases the GIL this often...
YIELD_S = 0.0002  # ...for this long


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
        self._map = OffsetMap(max(config.dedupe_buffer_size // max(config.threads, 1), 24), config.io_buffer_load_factor)
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
            if not cfg.compact or plog._closed:
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
        if not pinned:
            return None
        self.busy = name
        stats = CleanerStats()
        try:
            aborted = plog.collect_aborted_txns(pinned[0].base_offset, rng.first_uncleanable)
            last_records = {
                e.producer_id: LastRecord(e.last_offset if e.batches else None, e.epoch) for e in partition.producers
            }
            throttler = Throttler(self.config.io_max_bytes_per_second)
            check = self._checker(plog, throttler)
            dirty = [p for p in pinned if p.next_base > rng.first_dirty]
            end_offset = await self._step(self._build_map, dirty, rng, aborted, stats, check)
            txns = TxnTracker()
            txns.add_aborted(aborted)
            filt = BatchFilter(
                self._map, now_ms, int(cfg.get("delete.retention.ms")), last_records,  # type: ignore[arg-type]
                rng.first_uncleanable, txns, stats,
            )  # fmt: skip
            to_clean = [p for p in pinned if p.base_offset < end_offset]
            groups = group_segments(
                [(p.base_offset, p.next_base, p.size) for p in to_clean], cfg.segment_bytes, rng.first_uncleanable
            )
            if groups:  # gaps may appear anywhere below the last group's end
                await self._step(plog.raise_cleaned_end, to_clean[groups[-1][-1]].next_base)
            swapped = 0
            for group_idx in groups:
                group = [to_clean[i] for i in group_idx]
                seg = await self._step(self._clean_group, plog, group, filt, check, now_ms)
                t0 = time.perf_counter()
                installed = not self._stopping and plog.install_cleaned(group, seg)
                self.install_max_s = max(self.install_max_s, time.perf_counter() - t0)
                if not installed:
                    await asyncio.get_running_loop().run_in_executor(self._executor, plog.abort_cleaned, seg)
                    log.info("%s: compaction stopped: the segments changed under it or the broker is closing", name)
                    return None
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, plog.finish_swap, seg.base_offset, group[-1].next_base
                )
                swapped += 1
                stats.groups += 1
            await self._step(plog.write_cleaner_checkpoint, end_offset)
        except CleaningAborted:
            return None
        except OSError as exc:
            if plog._closed:
                return None
            log.error("%s: compaction failed: %s", name, exc)
            return None
        finally:
            for p in pinned:
                p.close()
            self.busy = None
        stats.end = time.monotonic()
        secs = max(stats.elapsed_s, 1e-9)
        log.info(
            "%s: compaction pass done: offsets [%d, %d) dirty ratio %.2f, %d segment group(s); read %d bytes "
            "(%d records, %.1f MB/s), wrote %d bytes, kept %d records, removed %d, offset map %d keys "
            "(%.0f%% full), longest in-loop swap step %.1f ms, %.3f s",
            name, rng.first_dirty, end_offset, rng.ratio, swapped, stats.bytes_read + stats.map_bytes,
            stats.records_read, (stats.bytes_read + stats.map_bytes) / secs / 1e6, stats.bytes_written,
            stats.records_kept, stats.records_removed, self._map.size, 100 * self._map.utilization(),
            self.install_max_s * 1000, secs,
        )  # fmt: skip
        result = PassResult(name, rng.first_dirty, end_offset, rng.ratio, stats, swapped)
        self.passes = (self.passes + [result])[-20:]
        return result

    def _checker(self, plog: "PartitionLog", throttler: Throttler) -> Any:
        """Called by the worker per batch: stop when asked, throttle, and hand the GIL to
        the event loop at least every :data:`YIELD_EVERY_S` (without that, the loop waits up
        to the interpreter's switch interval, 5 ms, for every syscall it makes while the
        cleaner's pure-Python loops run)."""
        last = [time.perf_counter()]

        def check(nbytes: int) -> None:
            if self._stopping or plog._closed:
                raise CleaningAborted()
            throttler.maybe_throttle(nbytes)
            now = time.perf_counter()
            if now - last[0] >= YIELD_EVERY_S:
                time.sleep(YIELD_S)
                last[0] = time.perf_counter()

        return check

    # -- the worker side ----------------------------------------------------------------------

    def _build_map(
        self, dirty: list["PinnedSegment"], rng: CleanableRange, aborted: list, stats: CleanerStats, check: Any
    ) -> int:
        # at most one entry per offset of the dirty range: no larger table than that is needed
        self._map.clear(max(rng.first_uncleanable - rng.first_dirty, 1))
        segs = [(p.base_offset, min(p.next_base, rng.first_uncleanable), p.batches) for p in dirty]
        build_offset_map(segs, rng.first_dirty, self._map, aborted, stats, check)
        return self._map.latest_offset + 1

    def _clean_group(
        self, plog: "PartitionLog", group: list["PinnedSegment"], filt: BatchFilter, check: Any, now_ms: int
    ) -> "Segment":
        seg = plog.new_cleaned_segment(group[0].base_offset)
        try:
            kept_before = len(filt.txns.kept_aborted)
            for pin in group:
                for hdr, batch in pin.batches():
                    check(hdr.size)
                    out = filt.filter(hdr, batch)
                    if out is None:
                        continue
                    max_ts = hdr.max_timestamp if out is batch else parse_batch_header(out).max_timestamp
                    seg.append([out], len(out), hdr.base_offset, hdr.next_offset, max_ts, now_ms)
                    check(len(out))
            for txn in filt.txns.kept_aborted[kept_before:]:
                if txn.last_offset >= seg.base_offset:
                    seg.txn_index.append(txn)
            plog.commit_cleaned(seg, group[-1].next_base)
        except BaseException:
            plog.abort_cleaned(seg)
            raise
        return seg


def cleaner_config(broker_config: Any) -> CleanerConfig:
    return CleanerConfig(
        enable=broker_config.log_cleaner_enable,
        threads=broker_config.log_cleaner_threads,
        dedupe_buffer_size=broker_config.log_cleaner_dedupe_buffer_size,
        io_buffer_load_factor=broker_config.log_cleaner_io_buffer_load_factor,
        io_max_bytes_per_second=broker_config.log_cleaner_io_max_bytes_per_second,
        backoff_ms=broker_config.log_cleaner_backoff_ms,
    )
