"""The blocking consumer: :class:`Consumer`, the asyncio consumer on a background loop thread.

Manual assignment only for now (``assign``/``seek``/``position``/
``get_watermark_offsets``, ``poll``/``consume``); group ``subscribe`` comes
later. See :mod:`oncelog.client.aio.consumer` for the design.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from oncelog.client._loop import LoopThread
from oncelog.client.aio.consumer import Consumer as AioConsumer
from oncelog.client.aio.consumer import Message, TopicPartition

__all__ = ["Consumer", "Message", "TopicPartition"]


class Consumer:
    """The blocking consumer (see docs/client.md).

    ``c = Consumer({"bootstrap.servers": "127.0.0.1:9092", "auto.offset.reset": "earliest"})``;
    ``c.assign([TopicPartition("events", 0)])``; ``msg = c.poll(1.0)``; ``c.close()``.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self._lt = LoopThread("oncelog-consumer")
        try:
            self._c = AioConsumer(config)
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

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        return self._lt.run(coro, timeout)

    def assign(self, partitions: Iterable[Any]) -> None:
        """Consume exactly these partitions (``TopicPartition`` or ``(topic, partition[, offset])``)."""
        parts = list(partitions)
        self._run(_call(self._c.assign, parts))

    def assignment(self) -> list[TopicPartition]:
        return self._c.assignment()

    def seek(self, partition: Any, offset: int | None = None) -> None:
        self._run(_call(self._c.seek, partition, offset))

    def position(self, partition: Any) -> int:
        return self._run(self._c.position(partition))

    def get_watermark_offsets(self, partition: Any, timeout: float | None = None) -> tuple[int, int]:
        return self._run(self._c.get_watermark_offsets(partition), timeout)

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (None: wait)."""
        return self._run(self._c.poll(timeout))

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``num_messages`` messages, waiting up to ``timeout`` s for the first."""
        return self._run(self._c.consume(num_messages, timeout))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._c.close(), 30)
        finally:
            self._lt.stop()


async def _call(fn: Any, *args: Any) -> Any:
    return fn(*args)
