"""A partition as the broker sees it: a log plus its high watermark and fetch waiters."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oncelog.storage.log import PartitionLog


class Partition:
    """One topic partition on this (single) node.

    ``high_watermark`` is the end of the durable prefix of the log: with
    fsync-on-ack it advances only after fdatasync, so a consumer can never read
    a record that a crash could still take away (the analogue of Kafka's
    high watermark advancing only once the ISR has the data).
    """

    __slots__ = ("topic", "index", "topic_id", "log", "high_watermark", "_waiters", "__weakref__")

    def __init__(self, topic: str, index: int, topic_id: object, log: "PartitionLog") -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.log = log
        # recovery left only valid batches on disk: treat them as durable
        self.high_watermark = log.log_end_offset
        self._waiters: set[asyncio.Future[None]] = set()

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.index})"

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    def advance_high_watermark(self, offset: int) -> None:
        if offset > self.high_watermark:
            self.high_watermark = offset
            self.wake()

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def add_waiter(self, fut: asyncio.Future[None]) -> None:
        self._waiters.add(fut)

    def remove_waiter(self, fut: asyncio.Future[None]) -> None:
        self._waiters.discard(fut)
