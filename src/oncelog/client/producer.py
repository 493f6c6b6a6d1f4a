"""The blocking producer: :class:`Producer`, the asyncio core on a background loop thread.

``produce()`` appends the record to its partition's open batch on the
caller's thread, under one lock (Java's RecordAccumulator), and returns a
:class:`DeliveryFuture`; the loop thread is woken once per batch that fills
or opens, and at its next pass takes the full and lingered batches, sends and
completes them. Conditional and transactional records are handed to the loop
thread one by one instead. ``produce()`` waits for the network only for a
topic's metadata on its first record (``max.block.ms``, as Java's ``send()``)
and when ``buffer.memory`` is full. ``on_delivery(err, metadata)`` callbacks run in
the caller's thread from :meth:`Producer.poll` and :meth:`Producer.flush`,
as in confluent-kafka.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque
from time import time as _time
from collections.abc import Callable
from typing import Any

from oncelog.client._loop import LoopThread
from oncelog.client.aio.producer import (
    _Batch,
    BatchFutures,
    BatchResult,
    ProducerCore,
    RecordMetadata,
    _to_bytes,
    _values_list,
    produce_batch_into,
    split_leaf,
)
from oncelog.client.aio.transactions import PreparedTxnState, TransactionManager
from oncelog.client.batch import CODECS, RECORD_OVERHEAD_MAX, BatchBuilder
from oncelog.client.config import parse_config
from oncelog.client.partitioner import partition_for_key
from oncelog.protocol.records import HEADER_SIZE
from oncelog.client.errors import ClientClosedError, IllegalStateError, KafkaError

__all__ = ["DeliveryFuture", "Producer"]

_lock = threading.Lock()
_RECORD_MAX_OVERHEAD = HEADER_SIZE + RECORD_OVERHEAD_MAX


class _Done:
    """The completion state of futures that complete together: the records of one batch filled by
    ``produce()`` share one (a batch is delivered or failed as a whole), any other future has its own.

    The batch refers to it and not to its records' futures, so a future its caller drops is freed at
    once (no garbage-collected object per record outlives ``produce()`` for fire-and-forget callers).
    ``res``: a :class:`BatchResult` (record ``i``'s metadata is made from it when asked for) or a
    :class:`RecordMetadata`; ``exc``: the error; ``event``: made by the first thread that waits;
    ``cbs``: the futures with an ``on_delivery`` callback, in record order, handed to ``sink`` (the
    producer's queue for :meth:`Producer.poll`) on completion."""

    __slots__ = ("fin", "res", "exc", "event", "cbs", "sink", "parts", "left", "parent")

    def __init__(self, sink: "deque[DeliveryFuture] | None" = None) -> None:
        self.fin = False
        self.res: BatchResult | RecordMetadata | None = None
        self.exc: BaseException | None = None
        self.event: threading.Event | None = None
        self.cbs: list[DeliveryFuture] | None = None
        self.sink = sink
        # its batch was split (refused as MESSAGE_TOO_LARGE): (first record index, completion) of each part,
        # the parts not done yet; done once they all are, a record's outcome is its part's (leaf)
        self.parts: list[tuple[int, _Done]] | None = None
        self.left = 0
        self.parent: _Done | None = None

    def split(self, counts: list[int]) -> "list[_Done]":
        """One completion per part of ``counts`` consecutive records (called on the loop thread)."""
        parts, pos = [], 0
        for c in counts:
            d = _Done()
            d.parent = self
            parts.append((pos, d))
            pos += c
        self.left = len(parts)
        self.parts = parts
        return [d for _, d in parts]

    def leaf(self, i: int) -> "tuple[_Done, int]":
        """The completion of record ``i`` and its index there (itself unless split)."""
        return split_leaf(self, i)

    def done(self) -> bool:
        return self.fin

    def set_result(self, res: "BatchResult | RecordMetadata") -> None:
        self.res = res
        self.finish()

    def set_exception(self, exc: BaseException) -> None:
        self.exc = exc
        self.finish()

    def finish(self) -> None:
        # no lock: fin is set before event is read, and a waiter re-checks fin after creating
        # its event, so one of the two always sees the other
        self.fin = True
        ev = self.event
        if ev is not None:
            ev.set()
        if self.cbs is not None and self.sink is not None:
            self.sink.extend(self.cbs)
        up = self.parent
        if up is not None:
            up.left -= 1
            if not up.left:  # the last part: the split batch's records are all done
                up.exc = next((d.exc for _, d in up.parts or () if d.exc is not None), None)
                up.finish()


class DeliveryFuture:
    """The outcome of one produced record: ``result(timeout)`` -> :class:`RecordMetadata`, or raises its error."""

    __slots__ = ("_g", "_i", "_on_delivery")

    def __init__(self, owner: "Producer | None" = None,
                 on_delivery: Callable[[KafkaError | None, RecordMetadata | None], None] | None = None,
                 group: _Done | None = None, index: int = 0) -> None:
        if group is None:
            group = _Done(owner._delivered if owner is not None else None)
        self._g = group  # shared with the other records of its batch when produce() placed it in one
        self._i = index  # its index in the batch
        self._on_delivery = on_delivery
        if on_delivery is not None:
            if group.cbs is None:
                group.cbs = [self]
            else:
                group.cbs.append(self)

    def done(self) -> bool:
        """True once the record is acknowledged or failed."""
        return self._g.fin

    def set_result(self, value: RecordMetadata) -> None:
        """Resolve the future (used by the producer)."""
        self._g.set_result(value)

    def set_exception(self, exc: BaseException) -> None:
        """Fail the future (used by the producer)."""
        self._g.set_exception(exc)

    def _wait(self, timeout: float | None) -> None:
        g = self._g
        if g.fin:
            return
        with _lock:
            if g.event is None:
                g.event = threading.Event()
            ev = g.event
        if not g.fin and not ev.wait(timeout):
            raise TimeoutError("record not delivered yet")

    def _metadata(self) -> RecordMetadata | None:
        g, i = self._g.leaf(self._i)
        res = g.res
        if type(res) is BatchResult:
            return res.metadata(i)
        return res  # type: ignore[return-value]

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """The record's metadata once acknowledged; raises its error, or TimeoutError after ``timeout`` s."""
        self._wait(timeout)
        exc = self._g.leaf(self._i)[0].exc
        if exc is not None:
            raise exc
        md = self._metadata()
        assert md is not None
        return md

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The record's error, or None once acknowledged; TimeoutError after ``timeout`` s."""
        self._wait(timeout)
        return self._g.leaf(self._i)[0].exc


def _complete_many(b: _Batch, futs: list[Any], res: BatchResult) -> None:
    """A successful batch: its records' futures done at once (their metadata is made when asked for).

    A batch filled by ``produce()`` completes its one shared :class:`_Done`; the futures of records
    placed by the loop thread (each with its own) learn their index in the batch."""
    g = b.group
    if g is not None:  # futs is [g]
        if not g.fin:
            g.set_result(res)
        return
    i = 0
    for fut in futs:
        g = fut._g
        if not g.fin:
            fut._i = i
            g.set_result(res)
        i += 1


class Producer:
    """The blocking producer (see docs/client.md). Thread-safe.

    ``p = Producer({"bootstrap.servers": "127.0.0.1:9092"})``;
    ``p.produce("topic", b"value", key=b"k")``; ``p.flush()``; ``p.close()``.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = parse_config(config, "producer")
        self._lt = LoopThread("oncelog-producer")
        self._core = ProducerCore(self.config)
        self._incoming: list[tuple[Any, ...]] = []  # records for the loop thread to place (the slow path)
        self._open: dict[tuple[str, int], _Batch] = {}  # batches filled by produce() on callers' threads
        self._sealed: list[_Batch] = []  # full or lingered, for the loop thread's next pass
        self._staged = 0  # records in _open and _sealed
        self._staged_bytes = 0
        self._scheduled = False  # a wake-up of the loop thread is pending
        self._lock = threading.Lock()
        self._fast = self._core.txn is None  # transactional records all go through the loop thread
        self._batch_size = self.config["batch.size"]
        self._codec = CODECS[self.config["compression.type"]]
        self._max_record = self.config["max.request.size"] - _RECORD_MAX_OVERHEAD  # key + value bytes
        self._core.collect = self._collect
        self._delivered: deque[DeliveryFuture] = deque()
        self._closed = False
        self._buffer_memory = self.config["buffer.memory"]
        self._core.complete_many = _complete_many
        # set by the loop thread when records complete (bytes leave buffer.memory) while a produce() waits
        # for space: it wakes then, not at its next poll tick
        self._space = threading.Event()
        self._space_waiters = 0
        self._core.on_complete = self._released
        try:
            self._lt.run(self._core.start(), self.config["max.block.ms"] / 1000 + 5)
        except BaseException:
            self._lt.run(self._core.close(0))
            self._lt.stop()
            raise

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Records produced and not yet delivered or failed (confluent-kafka's ``len(producer)``)."""
        return self._core._outstanding + self._staged + len(self._incoming)

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                headers: Any = None, timestamp: int | None = None,
                on_delivery: Callable[[KafkaError | None, RecordMetadata | None], None] | None = None,
                expected_offset: int | None = None) -> DeliveryFuture:
        """Queue one record; returns a :class:`DeliveryFuture` of its :class:`RecordMetadata`.

        Waits up to ``max.block.ms`` while ``buffer.memory`` bytes are queued,
        then raises :class:`BufferError`.

        ``expected_offset=k`` (with ``partition``): the record must get offset
        ``k`` or not be written (conditional produce, docs/conditional-publish.md);
        a refusal fails it with :class:`~oncelog.client.errors.OffsetMismatch`.
        """
        if self._closed:
            raise ClientClosedError("producer is closed")
        core = self._core
        if core._fatal is not None or core._closing or not self._fast:
            core.check_open()
        if expected_offset is not None:
            core.check_conditional(partition, expected_offset)
        if value is not None and type(value) is not bytes:
            value = _to_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = _to_bytes(key, "key")
        if core.buffered_bytes + self._staged_bytes > self._buffer_memory:
            self._wait_for_space()
        if timestamp is None:
            timestamp = int(_time() * 1000)
        if expected_offset is None and self._fast:
            fast = True
            info = core.cluster.topics.get(topic)
            if (info is None or not info.leaders) and topic not in core._waiting:
                # as Java's send(): wait up to max.block.ms for the topic's metadata (once per topic), so
                # that its records take the fast path below rather than queue for the loop thread
                try:
                    info = self._lt.run(core.cluster.wait_topic(topic, core.max_block), core.max_block + 5)
                except ClientClosedError:  # closed meanwhile by another thread (the loop thread stopped)
                    raise
                except KafkaError as exc:
                    fut = DeliveryFuture(self, on_delivery)
                    fut.set_exception(exc)
                    return fut
                except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                    if self._closed:  # closed meanwhile by another thread
                        raise ClientClosedError("producer is closed") from None
                    info = None  # the loop thread's own wait decides (the slow path below)
                except Exception as exc:  # pragma: no cover - defensive, as the loop thread's topic wait
                    fut = DeliveryFuture(self, on_delivery)
                    fut.set_exception(KafkaError(str(exc)))
                    return fut
        else:
            fast = False
            info = None
        nbytes = (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        with self._lock:
            if self._closed:  # checked again under the lock close() sets it with: nothing is left behind
                raise ClientClosedError("producer is closed")
            # the fast path: the record goes into its partition's open batch here, on the caller's thread
            # (Java's RecordAccumulator); the loop thread hears of a batch when it is full or new, and takes
            # it at its next pass. Anything unusual (topic not known yet, conditional, transactional, a
            # record for the loop thread to fail) goes the slow way, in order behind the batches open here.
            if fast and info is not None and not self._incoming and info.leaders and topic not in core._waiting:
                n = len(info.leaders)
                if partition is None or partition < 0:
                    partition = core.sticky.partition(topic, n) if key is None else partition_for_key(key, n)
                if partition < n and nbytes <= self._max_record:
                    b = self._open.get((topic, partition))
                    if b is None or not b.builder.append(timestamp, key, value, headers):
                        if b is not None:
                            self._seal(b, n)
                        b = _Batch(topic, partition, BatchBuilder(self._batch_size, self._codec))
                        b.group = _Done(self._delivered)
                        b.futures.append(b.group)  # the batch's records complete through it (not one by one)
                        b.builder.append(timestamp, key, value, headers)
                        self._open[(topic, partition)] = b
                        # the loop thread learns the new batch's linger deadline (at its next pass; none is
                        # needed now when an answer it waits for starts one first)
                        if not self._scheduled and not core.answer_pending(topic, partition):
                            self._scheduled = True
                            self._wake()
                    # the record's future shares its batch's completion; the batch does not hold it
                    fut = DeliveryFuture(self, on_delivery, b.group, b.builder.count - 1)
                    b.timestamps.append(timestamp)
                    b.nbytes += nbytes
                    self._staged_bytes += nbytes
                    self._staged += 1
                    if b.builder.size >= self._batch_size:
                        self._seal(b, n)
                        if not self._scheduled and not core.answer_pending(topic, partition):
                            self._scheduled = True
                            self._wake()
                    return fut
            if self._open:
                self._seal_all()  # records placed on the loop thread come after those batches
            fut = DeliveryFuture(self, on_delivery)
            self._incoming.append((topic, value, key, partition, headers, timestamp, fut,
                                   -1 if expected_offset is None else expected_offset))
            schedule = not self._scheduled
            self._scheduled = True
        if schedule:
            self._wake()
        return fut

    def _seal(self, b: _Batch, partitions: int) -> None:
        """(Under ``_lock``.) Close a batch open here: it waits in ``_sealed`` for the loop thread."""
        del self._open[(b.topic, b.partition)]
        self._sealed.append(b)
        self._core.sticky.next(b.topic, partitions, b.partition)

    def _seal_all(self) -> None:
        for b in list(self._open.values()):
            info = self._core.cluster.topics.get(b.topic)
            self._seal(b, len(info.leaders) if info is not None and info.leaders else 1)

    def _collect(self, now: float, flushing: bool) -> float:
        """(On the loop thread, at every sender pass.) Take the batches filled by callers' threads: the
        full ones, those whose ``linger.ms`` passed (all when flushing), then the records handed over
        one by one; returns the seconds until the next open batch's linger deadline."""
        next_due = 1.0
        core = self._core
        if not flushing:
            # most passes (those an answer started) find nothing handed over and no open batch due: they
            # end here, without the lock. The flag is cleared before _sealed and _incoming are read, and
            # produce() fills them before it reads the flag (under its lock), so a batch sealed meanwhile
            # is either seen here or wakes the loop thread again. (list() of the dict's values is one step
            # under the GIL.)
            self._scheduled = False
            if not self._sealed and not self._incoming:
                linger = core.linger
                for b in list(self._open.values()):
                    due = b.created + linger
                    if due <= now:
                        break
                    if due - now < next_due:
                        next_due = due - now
                else:
                    return next_due
                next_due = 1.0
        with self._lock:
            self._scheduled = False
            if self._open:
                linger = core.linger
                for b in list(self._open.values()):
                    due = b.created + linger
                    if flushing or due <= now:
                        info = core.cluster.topics.get(b.topic)
                        self._seal(b, len(info.leaders) if info is not None and info.leaders else 1)
                    elif due - now < next_due:
                        next_due = due - now
            if self._sealed:
                sealed, self._sealed = self._sealed, []
                adopt = core.adopt
                for b in sealed:
                    self._staged -= b.builder.count
                    self._staged_bytes -= b.nbytes
                    adopt(b)
            if self._incoming:
                items, self._incoming = self._incoming, []
                append = core.append
                for rec in items:
                    append(*rec)
        return next_due

    def _wake(self) -> None:
        try:
            self._lt.call(self._core._kick)
        except RuntimeError:  # the loop is closed (the producer was closed meanwhile)
            pass

    def _released(self, nbytes: int) -> None:
        """(On the loop thread.) Records completed and their bytes left ``buffer.memory``."""
        if self._space_waiters and not self._space.is_set() and \
                self._core.buffered_bytes + self._staged_bytes <= self._buffer_memory:
            self._space.set()  # once per wait, when there is room (not at every batch completed)

    def _wait_for_space(self) -> None:
        """Wait (serving callbacks) until ``buffer.memory`` has room, up to ``max.block.ms``: woken when the
        loop thread completes records (Java's BufferPool wait), not at a fixed tick."""
        deadline = time.monotonic() + self.config["max.block.ms"] / 1000
        space, limit = self._space, self._buffer_memory
        with self._lock:
            self._space_waiters += 1
        try:
            while self._core.buffered_bytes + self._staged_bytes > limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BufferError("buffer.memory is full and max.block.ms passed")
                space.clear()
                self.poll(0)
                if self._core.buffered_bytes + self._staged_bytes <= limit:  # freed before the clear
                    break
                space.wait(min(0.05, left))
        finally:
            with self._lock:
                self._space_waiters -= 1

    def _drain(self) -> None:
        """(On the loop thread.) Hand everything over now (flush, close, transactions, produce_batch)."""
        self._collect(time.monotonic(), True)
        self._core._kick()

    def produce_batch(self, topic: str, values: Any, keys: Any = None, partition: int | None = None,
                      timestamp: int | None = None, expected_offset: int | None = None) -> BatchFutures:
        """Queue many records (a list, or a pyarrow array); returns their futures in order.

        The result is a :class:`~oncelog.client.aio.producer.BatchFutures`
        sequence of :class:`DeliveryFuture`, each made when first looked at
        (``futs.done()`` / ``futs.exception()`` answer for the whole call)."""
        if self._closed:
            raise ClientClosedError("producer is closed")
        self._core.check_open()
        vals = _values_list(values)
        futs = BatchFutures(len(vals), DeliveryFuture, threading.Lock())

        async def run() -> None:
            self._drain()  # records produce()d before this call go first
            await produce_batch_into(self._core, topic, vals, keys, partition, timestamp, futs, expected_offset)

        self._lt.run(run())
        return futs

    def poll(self, timeout: float = 0) -> int:
        """Run the ``on_delivery`` callbacks of completed records; waits up to ``timeout`` s for one."""
        deadline = time.monotonic() + timeout
        served = 0
        while True:
            while self._delivered:
                fut = self._delivered.popleft()
                cb = fut._on_delivery
                if cb is not None:
                    exc = fut._g.leaf(fut._i)[0].exc
                    cb(exc if isinstance(exc, KafkaError) or exc is None else KafkaError(str(exc)),
                       fut._metadata() if exc is None else None)
                served += 1
            if served or time.monotonic() >= deadline:
                return served
            time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))

    def flush(self, timeout: float | None = None) -> int:
        """Send everything and wait for every record to complete; runs callbacks; returns how many remain."""
        self._lt.call(self._drain)
        fut = asyncio.run_coroutine_threadsafe(self._core.flush(timeout), self._lt.loop)
        while True:  # serve delivery callbacks while waiting, as confluent-kafka's flush does
            try:
                left = fut.result(0.05)
                break
            except concurrent.futures.TimeoutError:
                self.poll(0)
        self.poll(0)
        return left

    # -- transactions: the asyncio Producer's, run on the loop thread (see docs/client.md) --------

    def _txn(self) -> TransactionManager:
        if self._closed:
            raise ClientClosedError("producer is closed")
        if self._core.txn is None:
            raise IllegalStateError("transactions need a transactional.id in the producer's configuration")
        return self._core.txn

    def init_transactions(self, timeout: float | None = None, *, keep_prepared_txn: bool = False) -> None:
        """Get the producer id and epoch of ``transactional.id``, fencing older producers with the same id.

        Their open transaction is aborted, unless ``keep_prepared_txn=True``
        (KIP-939, ``transaction.two.phase.commit.enable=true``): an open
        transaction is then kept and this producer is left in the prepared
        state, for :meth:`complete_transaction`. Waits up to ``max.block.ms``.
        """
        self._lt.run(self._txn().init_transactions(keep_prepared_txn, timeout))

    def begin_transaction(self) -> None:
        """Start a transaction: records produced from now on belong to it."""
        txn = self._txn()

        async def begin() -> None:
            txn.begin_transaction()

        self._lt.run(begin())

    def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any,
                                    timeout: float | None = None) -> None:
        """Commit a consumer group's ``offsets`` (``{(topic, partition): next offset}``, or a list of
        TopicPartition with ``offset``) in the transaction; ``group_metadata`` is the consumer's
        ``group_metadata()`` (KIP-447 fencing) or the group id."""
        self._lt.run(self._txn().send_offsets_to_transaction(offsets, group_metadata, timeout))

    def _run_flushing(self, coro: Any) -> Any:
        self._lt.call(self._drain)  # records handed over before this call belong to the transaction
        fut = asyncio.run_coroutine_threadsafe(coro, self._lt.loop)
        while True:  # serve delivery callbacks meanwhile, as flush() does
            try:
                result = fut.result(0.05)
                break
            except concurrent.futures.TimeoutError:
                self.poll(0)
        self.poll(0)
        return result

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit. Raises the abortable error if a record failed (then call abort_transaction())."""
        self._run_flushing(self._txn().commit_transaction(timeout))

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Drop unsent records, wait for those in flight, then abort."""
        self._run_flushing(self._txn().abort_transaction(timeout))

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """KIP-939: flush and return the transaction's :class:`PreparedTxnState` (needs 2PC enabled)."""
        return self._run_flushing(self._txn().prepare_transaction(timeout))

    def complete_transaction(self, prepared_state: PreparedTxnState, timeout: float | None = None) -> None:
        """KIP-939: commit the prepared transaction if ``prepared_state`` is its state, else abort it."""
        self._run_flushing(self._txn().complete_transaction(prepared_state, timeout))

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` s), then close connections and the loop thread."""
        with self._lock:  # a produce() on another thread either got its record in before, or raises
            if self._closed:
                return
            self._closed = True
        try:
            self._lt.call(self._drain)
            self._lt.run(self._core.close(timeout))
            self.poll(0)
        finally:
            self._lt.stop()

    @property
    def producer_id(self) -> tuple[int, int]:
        """``(producer id, epoch)``, (-1, -1) when not idempotent."""
        return self._core.producer_id, self._core.producer_epoch
