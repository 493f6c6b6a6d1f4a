"""The blocking producer: :class:`Producer`, the asyncio core on a background loop thread.

``produce()`` never waits for the network: it hands the record to the loop
thread (records are passed over in bulk, one wake-up per burst) and returns
a :class:`DeliveryFuture`. ``on_delivery(err, metadata)`` callbacks run in
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
    BatchFutures,
    BatchResult,
    ProducerCore,
    RecordMetadata,
    _to_bytes,
    _values_list,
    produce_batch_into,
)
from oncelog.client.aio.transactions import PreparedTxnState, TransactionManager
from oncelog.client.config import parse_config
from oncelog.client.errors import ClientClosedError, IllegalStateError, KafkaError

__all__ = ["DeliveryFuture", "Producer"]

_lock = threading.Lock()


class DeliveryFuture:
    """The outcome of one produced record: ``result(timeout)`` -> :class:`RecordMetadata`, or raises its error."""

    __slots__ = ("_done", "_result", "_exc", "_event", "_owner", "_on_delivery", "_res", "_i")

    def __init__(self, owner: "Producer | None" = None,
                 on_delivery: Callable[[KafkaError | None, RecordMetadata | None], None] | None = None) -> None:
        self._done = False
        self._result: RecordMetadata | None = None
        self._exc: BaseException | None = None
        self._event: threading.Event | None = None
        self._owner = owner
        self._on_delivery = on_delivery
        self._res: BatchResult | None = None  # set with _i by _complete_many: the metadata, made when asked
        self._i = 0

    def done(self) -> bool:
        return self._done

    def set_result(self, value: RecordMetadata) -> None:
        self._result = value
        self._finish()

    def set_exception(self, exc: BaseException) -> None:
        self._exc = exc
        self._finish()

    def _finish(self) -> None:
        # no lock: _done is set before _event is read, and a waiter re-checks _done after creating
        # its event, so one of the two always sees the other
        self._done = True
        ev = self._event
        if ev is not None:
            ev.set()
        if self._on_delivery is not None and self._owner is not None:
            self._owner._delivered.append(self)

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        with _lock:
            if self._event is None:
                self._event = threading.Event()
            ev = self._event
        if not self._done and not ev.wait(timeout):
            raise TimeoutError("record not delivered yet")

    def _metadata(self) -> RecordMetadata | None:
        if self._result is None and self._res is not None:
            self._result = self._res.metadata(self._i)
        return self._result

    def result(self, timeout: float | None = None) -> RecordMetadata:
        self._wait(timeout)
        if self._exc is not None:
            raise self._exc
        md = self._metadata()
        assert md is not None
        return md

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._exc


def _complete_many(futs: list[Any], res: BatchResult, delivered: deque[DeliveryFuture]) -> None:
    """A successful batch: its records' futures done at once (their metadata is made when asked for).

    The same steps as :meth:`DeliveryFuture._finish`, in the same order (``_done``
    before ``_event`` is read), without a call and a RecordMetadata per record."""
    i = 0
    for fut in futs:
        if not fut._done:
            fut._res = res
            fut._i = i
            fut._done = True
            ev = fut._event
            if ev is not None:
                ev.set()
            if fut._on_delivery is not None and fut._owner is not None:
                delivered.append(fut)
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
        self._incoming: list[tuple[Any, ...]] = []
        self._scheduled = False
        self._lock = threading.Lock()
        self._delivered: deque[DeliveryFuture] = deque()
        self._closed = False
        self._buffer_memory = self.config["buffer.memory"]
        delivered = self._delivered
        self._core.complete_many = lambda futs, res: _complete_many(futs, res, delivered)
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
        return self._core._outstanding + len(self._incoming)

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
        core = self._core
        if self._closed:
            raise ClientClosedError("producer is closed")
        core.check_open()
        if expected_offset is not None:
            core.check_conditional(partition, expected_offset)
        if value is not None and type(value) is not bytes:
            value = _to_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = _to_bytes(key, "key")
        if core.buffered_bytes > self._buffer_memory:
            self._wait_for_space()
        fut = DeliveryFuture(self, on_delivery) if on_delivery is not None else DeliveryFuture()
        rec = (topic, value, key, partition, headers, int(_time() * 1000) if timestamp is None else timestamp, fut,
               -1 if expected_offset is None else expected_offset)
        with self._lock:
            self._incoming.append(rec)
            schedule = not self._scheduled
            self._scheduled = True
        if schedule:
            self._lt.call(self._drain)
        return fut

    def _wait_for_space(self) -> None:
        deadline = time.monotonic() + self.config["max.block.ms"] / 1000
        while self._core.buffered_bytes > self.config["buffer.memory"]:
            if time.monotonic() > deadline:
                raise BufferError("buffer.memory is full and max.block.ms passed")
            self.poll(0.01)

    def _drain(self) -> None:
        with self._lock:
            items, self._incoming = self._incoming, []
            self._scheduled = False
        append = self._core.append
        for rec in items:
            append(*rec)

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
        self._lt.run(produce_batch_into(self._core, topic, vals, keys, partition, timestamp, futs, expected_offset))
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
                    cb(fut._exc if isinstance(fut._exc, KafkaError) or fut._exc is None else KafkaError(str(fut._exc)),
                       fut._metadata())
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
