"""The blocking consumer: :class:`Consumer`, the asyncio consumer on a background loop thread.

Manual ``assign`` or group ``subscribe`` (list or regex), ``poll``/``consume``,
``commit``/``committed``, ``pause``/``resume``, ``offsets_for_times``. Rebalance
callbacks run on a worker thread while the rebalance waits for them, so they
may call this consumer's blocking methods (``commit``, ``seek``, ...). See
:mod:`oncelog.client.aio.consumer` for the design.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterable
from typing import Any

from oncelog.client._loop import LoopThread
from oncelog.client.aio.consumer import Consumer as AioConsumer
from oncelog.client.aio.consumer import Message, TopicPartition
from oncelog.client.aio.transactions import ConsumerGroupMetadata

__all__ = ["Consumer", "Message", "TopicPartition"]

# seconds a blocking poll()/consume() with nothing buffered waits on its own thread for the next Fetch
# answer before it waits through the loop thread (AioConsumer.consume). A pending error goes to consume()
# (which raises it) at once, and one arriving ends the wait (AioConsumer.wait_take)
FAST_WAIT = 1.0
FETCH_HOLD: int | None = 1


class Consumer:
    """The blocking consumer (see docs/client.md).

    ``c = Consumer({"bootstrap.servers": "127.0.0.1:9092", "auto.offset.reset": "earliest"})``;
    ``c.assign([TopicPartition("events", 0)])``; ``msg = c.poll(1.0)``; ``c.close()``.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self._lt = LoopThread("oncelog-consumer")
        try:
            self._c = AioConsumer(config)
            # a leader's Fetch waits until at most one of its partitions has records left (see
            # AioConsumer._held): fewer, larger Fetches whose answers do not arrive during the decode
            self._c._fetch_hold = FETCH_HOLD
            self.config = self._c.config
            self._lt.run(self._c.start(), self.config["request.timeout.ms"] / 1000 + 5)
        except BaseException:
            self._lt.stop()
            raise
        self._closed = False

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Any, timeout: float | None = None, wait: bool = False) -> Any:
        # close() on another thread stops the loop: LoopThread.run raises ClientClosedError. Ctrl-C cancels
        # only a wait (``wait``: consume/poll, which would take records for nobody); any other call runs on
        return self._lt.run(coro, timeout, cancel_on_interrupt=wait)

    def assign(self, partitions: Iterable[Any]) -> None:
        """Consume exactly these partitions (``TopicPartition`` or ``(topic, partition[, offset])``)."""
        parts = list(partitions)
        self._run(_call(self._c.assign, parts))

    def assignment(self) -> list[TopicPartition]:
        """The partitions currently assigned (by ``assign()`` or the group)."""
        return self._c.assignment()

    def seek(self, partition: Any, offset: int | None = None) -> None:
        """Fetch ``partition`` from ``offset`` next (None: the partition's ``offset`` attribute)."""
        self._run(_call(self._c.seek, partition, offset))

    def position(self, partition: Any) -> int:
        """The offset of the next record ``poll()`` will return for ``partition``."""
        return self._run(self._c.position(partition))

    def get_watermark_offsets(self, partition: Any, timeout: float | None = None) -> tuple[int, int]:
        """``(low, high)``: the log start offset and the high watermark (LSO under read_committed), asked of the leader."""
        return self._run(self._c.get_watermark_offsets(partition), timeout)

    def incremental_assign(self, partitions: Iterable[Any]) -> None:
        """Add partitions to the assignment."""
        self._run(_call(self._c.incremental_assign, list(partitions)))

    def incremental_unassign(self, partitions: Iterable[Any]) -> None:
        """Remove partitions from the assignment."""
        self._run(_call(self._c.incremental_unassign, list(partitions)))

    def unassign(self) -> None:
        """Drop the whole manual assignment."""
        self._run(_call(self._c.unassign))

    def subscribe(self, topics: Any, on_assign: Any = None, on_revoke: Any = None, on_lost: Any = None) -> None:
        """Join ``group.id`` consuming ``topics`` (names; ``^``-prefixed names and ``re.Pattern`` are regexes).

        Callbacks get a list of :class:`TopicPartition`; see :meth:`oncelog.client.aio.Consumer.subscribe`.
        """
        cbs = [None if cb is None else _threaded(cb) for cb in (on_assign, on_revoke, on_lost)]
        self._run(_call(self._c.subscribe, topics, *cbs))

    def unsubscribe(self) -> None:
        """Leave the group (revoking the partitions)."""
        self._run(self._c.unsubscribe())

    def subscription(self) -> list[str]:
        """The topics (and patterns) passed to ``subscribe()``."""
        return self._c.subscription()

    def commit(self, offsets: Any = None, asynchronous: bool = False) -> concurrent.futures.Future[None] | None:
        """Commit ``offsets`` (None: the current positions); ``asynchronous=True`` returns a future."""
        if asynchronous:
            async def start() -> Any:
                return await self._c.commit(offsets, asynchronous=True)

            task = self._run(start())
            if task is None:
                return None
            fut: concurrent.futures.Future[None] = concurrent.futures.Future()

            def done(t: asyncio.Task[None]) -> None:
                if t.cancelled():
                    fut.cancel()
                elif t.exception() is not None:
                    fut.set_exception(t.exception())  # type: ignore[arg-type]
                else:
                    fut.set_result(None)

            self._lt.call(task.add_done_callback, done)
            return fut
        self._run(self._c.commit(offsets))
        return None

    def committed(self, partitions: Iterable[Any], timeout: float | None = None) -> list[TopicPartition]:
        """The group's committed offsets (offset -1001: none)."""
        return self._run(self._c.committed(list(partitions), timeout))

    def pause(self, partitions: Iterable[Any]) -> None:
        """Stop fetching ``partitions`` (they stay assigned) until ``resume()``."""
        self._run(_call(self._c.pause, list(partitions)))

    def resume(self, partitions: Iterable[Any]) -> None:
        """Fetch paused ``partitions`` again."""
        self._run(_call(self._c.resume, list(partitions)))

    def paused(self) -> list[TopicPartition]:
        """The partitions paused by ``pause()``."""
        return self._c.paused()

    def offsets_for_times(self, partitions: Iterable[Any], timeout: float | None = None) -> list[TopicPartition]:
        """Earliest offsets with a timestamp at least each TopicPartition's ``offset`` (a timestamp in ms)."""
        return self._run(self._c.offsets_for_times(list(partitions)), timeout)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """For ``Producer.send_offsets_to_transaction``."""
        return self._c.group_metadata()

    @property
    def member(self) -> Any:
        """The asyncio group member while subscribed."""
        return self._c.member

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (None: wait)."""
        msg = self._c.take_one_nowait()  # buffered records: no hop to the loop thread
        if msg is not None:
            return msg
        got, timeout = self._wait_take(1, timeout)
        if got:
            return got[0]
        return self._run(self._c.poll(timeout), wait=True)

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``num_messages`` messages, waiting up to ``timeout`` s for the first."""
        got = self._c.take_nowait(num_messages)
        if got:
            return got
        got, timeout = self._wait_take(num_messages, timeout)
        if got:
            return got
        return self._run(self._c.consume(num_messages, timeout), wait=True)

    def _wait_take(self, n: int, timeout: float | None) -> tuple[list[Message] | None, float | None]:
        """Nothing buffered: wait on this thread for the next Fetch answer (up to ``timeout``, at most
        ``FAST_WAIT`` s) and take from it; and what is left of ``timeout`` for :meth:`AioConsumer.consume`
        on the loop, which does the longer waits and raises the errors (an error pending or arriving
        ends the wait at once)."""
        if not FAST_WAIT or (timeout is not None and timeout <= 0):
            return None, timeout
        wait = FAST_WAIT if timeout is None else min(timeout, FAST_WAIT)
        t0 = time.monotonic()
        got = self._c.wait_take(n, wait)
        if got or timeout is None:
            return got, timeout
        return None, max(0.0, timeout - (time.monotonic() - t0))

    def close(self) -> None:
        """Commit (with ``enable.auto.commit``), leave the group and close the connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._c.close(), 30)
        finally:
            self._lt.stop()


async def _call(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _threaded(cb: Any) -> Any:
    """Run a blocking user callback on a worker thread, so it can call the blocking consumer."""
    async def run(parts: list[TopicPartition]) -> None:
        await asyncio.get_running_loop().run_in_executor(None, cb, parts)

    return run
