"""``LogWriter``: a partition as a write-ahead log with single-writer fencing (conditional produce).

``LogWriter(producer, topic, partition, next_offset)`` appends with
``expected_offset`` (docs/conditional-publish.md): at most one append in
flight, the next expected offset tracked. ``append(values)`` returns the
base offset of the values (they got ``base, base+1, ...``); on refusal it
raises :class:`~oncelog.client.errors.OffsetMismatch` whose
``.actual_offset`` is the partition's next offset, so the caller can
re-bootstrap (read up to it) and start a new ``LogWriter`` at its own next
offset. After a refusal the writer stays refused: every later ``append``
raises the same error without sending (the tracked offset is no longer a
state the caller has seen).

The blocking :class:`LogWriter` wraps :class:`oncelog.client.Producer`; the
asyncio :class:`AsyncLogWriter` wraps :class:`oncelog.client.aio.Producer`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from oncelog.client.errors import KafkaError, OffsetMismatch

__all__ = ["AsyncLogWriter", "LogWriter"]


class _Base:
    def __init__(self, producer: Any, topic: str, partition: int, next_offset: int) -> None:
        if next_offset < 0:
            raise ValueError(f"next_offset {next_offset} must be >= 0")
        self.producer = producer
        self.topic = topic
        self.partition = partition
        self.next_offset = next_offset
        self.refused: OffsetMismatch | None = None

    def _check(self, values: list[Any]) -> None:
        if self.refused is not None:
            raise self.refused
        if not values:
            raise ValueError("append() needs at least one value")

    def _settle(self, errors: list[BaseException | None], offsets: list[int], n: int) -> int:
        """The base offset, or raise the first refusal (or other error) of the append."""
        for e in errors:
            if isinstance(e, OffsetMismatch):
                self.refused = e
                raise e
        for e in errors:
            if e is not None:
                raise e
        base = self.next_offset
        if offsets != list(range(base, base + n)):  # pragma: no cover - the broker promised exactly these
            raise KafkaError(f"conditional append at {base} got offsets {offsets[:3]}...")
        self.next_offset = base + n
        return base


class LogWriter(_Base):
    """Blocking writer over :class:`oncelog.client.Producer` (see the module docstring)."""

    def __init__(self, producer: Any, topic: str, partition: int, next_offset: int) -> None:
        super().__init__(producer, topic, partition, next_offset)
        self._lock = threading.Lock()

    def append(self, values: list[Any], timeout: float | None = None) -> int:
        """Append ``values`` at the tracked next offset; returns their base offset."""
        values = list(values)
        with self._lock:  # at most one append in flight
            self._check(values)
            base = self.next_offset
            futs = self.producer.produce_batch(self.topic, values, partition=self.partition, expected_offset=base)
            self.producer.flush(timeout)
            errors: list[BaseException | None] = []
            offsets: list[int] = []
            for f in futs:
                e = f.exception(timeout)
                errors.append(e)
                offsets.append(-1 if e is not None else f.result(0).offset)
            return self._settle(errors, offsets, len(values))


class AsyncLogWriter(_Base):
    """asyncio writer over :class:`oncelog.client.aio.Producer` (see the module docstring)."""

    def __init__(self, producer: Any, topic: str, partition: int, next_offset: int) -> None:
        super().__init__(producer, topic, partition, next_offset)
        self._lock = asyncio.Lock()

    async def append(self, values: list[Any]) -> int:
        """Append ``values`` at the tracked next offset; returns their base offset."""
        values = list(values)
        async with self._lock:  # at most one append in flight
            self._check(values)
            base = self.next_offset
            futs = await self.producer.produce_batch(self.topic, values, partition=self.partition,
                                                     expected_offset=base)
            done = await asyncio.gather(*futs, return_exceptions=True)
            errors = [d if isinstance(d, BaseException) else None for d in done]
            offsets = [-1 if isinstance(d, BaseException) else d.offset for d in done]
            return self._settle(errors, offsets, len(values))
