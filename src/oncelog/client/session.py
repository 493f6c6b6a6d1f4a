"""The blocking :class:`TransactSession`: the asyncio session on a background loop thread.

Same rules and API as :class:`oncelog.client.aio.session.TransactSession`
(docs/client.md, "Exactly-once: TransactSession"); every call runs on the
session's own loop thread (:mod:`oncelog.client._loop`), so the group's
heartbeats and rebalance callbacks go on while the caller transforms records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from oncelog.client._loop import LoopThread
from oncelog.client.aio.consumer import Message
from oncelog.client.aio.session import TransactSession as _AioSession

__all__ = ["TransactSession"]


_BULK_FIELDS = frozenset({"topic", "key", "value", "partition"})


def _by_partition(items: list[Any]) -> dict[tuple[str, int], tuple[list[Any], list[Any]]] | None:
    """``{(topic, partition): (keys, values)}`` in order, when every item is a dict naming only topic, key,
    value and a partition; else None (records with headers, timestamps or no partition go one by one)."""
    groups: dict[tuple[str, int], tuple[list[Any], list[Any]]] = {}
    for item in items:
        if not isinstance(item, dict) or not item.keys() <= _BULK_FIELDS:
            return None
        part = item.get("partition")
        if type(part) is not int or part < 0 or "topic" not in item:
            return None
        g = groups.get((item["topic"], part))
        if g is None:
            g = groups[(item["topic"], part)] = ([], [])
        g[0].append(item.get("key"))
        g[1].append(item.get("value"))
    return groups


class TransactSession:
    """``with TransactSession(config, ["in"]) as s: recs = s.poll(1.0); s.produce(...); s.end()``."""

    def __init__(self, config: dict[str, Any], topics: Iterable[str]) -> None:
        self._lt = LoopThread("oncelog-session")
        try:
            self._s: _AioSession = self._lt.run(self._make(dict(config), list(topics)))
            self._lt.run(self._s.start())
        except BaseException:
            self._lt.stop()
            raise
        self._closed = False

    @staticmethod
    async def _make(config: dict[str, Any], topics: list[str]) -> _AioSession:
        return _AioSession(config, topics)

    def __enter__(self) -> "TransactSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def counters(self) -> dict[str, Any]:
        """Running totals: transactions committed and aborted (with ``aborts_by_cause``), records in and out."""
        return self._s.counters

    @property
    def assignment(self) -> list[tuple[str, int]]:
        """The ``(topic, partition)`` pairs the session owns now."""
        return self._s.assignment

    @property
    def stable_offsets(self) -> bool | None:
        """True: KIP-447 ``require_stable``; False: the 200 ms heuristic; None: not known yet."""
        return self._s.stable_offsets

    @property
    def transactional_id(self) -> str:
        """The producer's ``transactional.id``."""
        return self._s.transactional_id

    def wait_assigned(self, timeout: float | None = None) -> list[tuple[str, int]]:
        """Wait until the group has given this member partitions; returns them."""
        return self._lt.run(self._s.wait_assigned(timeout), cancel_on_interrupt=True)

    def poll(self, timeout: float | None = 1.0, max_records: int = 500) -> list[Message]:
        """Records of the owned partitions (up to ``max_records``); starts a transaction when there are some."""
        return self._lt.run(self._s.poll(timeout, max_records), cancel_on_interrupt=True)

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                headers: Any = None, timestamp: int | None = None) -> None:
        """Queue one record in the transaction (its outcome is part of :meth:`end`)."""
        async def go() -> None:
            self._s.produce(topic, value, key, partition, headers, timestamp)
        self._lt.run(go())

    def produce_many(self, items: Iterable[tuple[str, Any, Any] | dict[str, Any]]) -> None:
        """Queue many records with one hand-over to the loop thread: ``(topic, key, value)`` tuples or
        ``produce()`` keyword dicts."""
        batch = list(items)
        groups = _by_partition(batch)

        async def go() -> None:
            if groups is not None:  # every record a (topic, key, value, partition) dict: in bulk per partition
                for (topic, partition), (keys, values) in groups.items():
                    await self._s.produce_batch(topic, values, keys, partition)
                return
            for item in batch:
                if isinstance(item, dict):
                    self._s.produce(**item)
                else:
                    topic, key, value = item
                    self._s.produce(topic, value, key=key)
        self._lt.run(go())

    def committed(self, partitions: Iterable[tuple[str, int]], timeout: float | None = None) -> dict[Any, Any]:
        """The group's committed offsets (``OffsetAndMetadata`` or None), stable ones where the broker can."""
        return self._lt.run(self._s.committed(list(partitions), timeout))

    def end(self, commit: bool = True) -> bool:
        """End the transaction: True when it committed, False when it aborted (the consumer is rewound).

        Raises the typed error of a fatal failure (the session is then over).
        """
        return self._lt.run(self._s.end(commit))

    def abort(self) -> bool:
        """Abort the open transaction (``end(commit=False)``); the consumer is rewound."""
        return self.end(commit=False)

    def run(self, transform: Callable[[Message], Any], *, poll_timeout: float = 1.0, max_records: int = 500,
            stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """poll -> ``transform(record)`` (in this thread) -> produce -> end(commit=True) until ``stop()``."""
        while stop is None or not stop():
            out: list[Any] = []
            for m in self.poll(poll_timeout, max_records):
                out.extend(transform(m) or ())
            if out:
                self.produce_many(out)
            self.end(commit=True)
        return self.counters

    def close(self) -> None:
        """Abort an open transaction, leave the group, close the clients and the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._s.close(), 60)
        finally:
            self._lt.stop()
