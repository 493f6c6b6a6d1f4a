"""The asyncio consumer, manual assignment only (group subscribe comes later).

Public: :class:`Consumer` (``from oncelog.client.aio import Consumer``),
:class:`Message`, :class:`TopicPartition`.

Internal design (for the group consumer that builds on it):

* ``_parts``: per assigned partition a :class:`_PartitionState` with the
  *fetch position* (next offset to fetch), the *consumed position* (next
  offset :meth:`poll` returns, what :meth:`position` reports and a group
  would commit) and a buffer of fetched, not yet returned messages.
* One fetcher task keeps, per leader broker, at most one Fetch in flight for
  the partitions of that broker whose buffer is empty. Fetch v4-v12 (topics
  by name); decoding, CRC checks, decompression of all four codecs and the
  read_committed filter are :func:`oncelog.client.reader.fetched_records`.
* A partition without a position gets one from ``auto.offset.reset``
  (ListOffsets earliest/latest; ``none`` -> :class:`OffsetOutOfRangeError`
  from :meth:`poll`); OFFSET_OUT_OF_RANGE resets the same way; leadership
  errors refresh metadata.
* A group layer would call :meth:`assign` / :meth:`seek` from its rebalance
  callbacks and read :meth:`position` to commit.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from oncelog.client.aio.cluster import REFRESH_ERRORS, Cluster
from oncelog.client.config import ClientConfig, parse_config
from oncelog.client.errors import (
    ClientClosedError,
    KafkaError,
    OffsetOutOfRangeError,
    error_for,
)
from oncelog.client.reader import (
    EARLIEST,
    LATEST,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ReaderError,
    fetch_request,
    fetched_records,
    list_offsets_request,
)
from oncelog.protocol.errors import ErrorCode

__all__ = ["Consumer", "Message", "TopicPartition"]

FETCH, LIST_OFFSETS = 1, 2
FETCH_VERSIONS = (4, 12)  # v13+ address topics by id only
LIST_OFFSETS_VERSIONS = (2, 8)
OFFSET_OUT_OF_RANGE = int(ErrorCode.offset_out_of_range.value)


@dataclass(frozen=True, slots=True)
class TopicPartition:
    """A partition of a topic, with an optional starting ``offset`` (-1: none; -2 earliest; -1001 unset)."""

    topic: str
    partition: int
    offset: int = -1001


@dataclass(slots=True)
class Message:
    """One consumed record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp: int


@dataclass
class _PartitionState:
    topic: str
    partition: int
    fetch_pos: int | None = None
    consumed: int | None = None
    buffer: deque[Message] = field(default_factory=deque)
    in_flight: bool = False
    error: KafkaError | None = None
    generation: int = 0  # bumped by seek/assign: answers to older fetches are dropped


def _tp(item: Any) -> TopicPartition:
    if isinstance(item, TopicPartition):
        return item
    if isinstance(item, tuple) and len(item) in (2, 3):
        return TopicPartition(*item)
    topic, part = getattr(item, "topic", None), getattr(item, "partition", None)
    if isinstance(topic, str) and isinstance(part, int):  # e.g. a confluent-kafka TopicPartition
        return TopicPartition(topic, part, int(getattr(item, "offset", -1001)))
    raise TypeError(f"not a topic partition: {item!r}")


class Consumer:
    """The asyncio consumer with manual assignment.

    ``c = Consumer({"bootstrap.servers": ..., "auto.offset.reset": "earliest"})``;
    ``await c.start()``; ``c.assign([("topic", 0)])``; ``msg = await c.poll(1.0)``;
    ``async for msg in c: ...``; ``await c.close()``.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config: ClientConfig = parse_config(config, "consumer")
        self.cluster = Cluster(self.config)
        self.isolation = READ_COMMITTED if self.config["isolation.level"] == "read_committed" else READ_UNCOMMITTED
        self._parts: dict[tuple[str, int], _PartitionState] = {}
        self._order: deque[tuple[str, int]] = deque()
        self._data = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._node_busy: set[int] = set()
        self._fetches: set[asyncio.Task[None]] = set()
        self._closed = False
        self._started = False

    async def start(self) -> None:
        """Connect and read metadata."""
        if not self._started:
            await self.cluster.start()
            self._task = asyncio.ensure_future(self._run())
            self._started = True

    async def __aenter__(self) -> "Consumer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- assignment and positions ------------------------------------------------------

    def assign(self, partitions: Iterable[Any]) -> None:
        """Consume exactly these partitions (``TopicPartition``, ``(topic, partition[, offset])``)."""
        new: dict[tuple[str, int], _PartitionState] = {}
        for item in partitions:
            tp = _tp(item)
            st = self._parts.get((tp.topic, tp.partition)) or _PartitionState(tp.topic, tp.partition)
            if tp.offset >= 0:
                self._seek_state(st, tp.offset)
            elif tp.offset in (EARLIEST, LATEST):
                self._seek_state(st, None)
                st.fetch_pos = tp.offset  # resolved by ListOffsets
            new[(tp.topic, tp.partition)] = st
        self._parts = new
        self._order = deque(new)
        self._wake.set()

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self._parts]

    def unassign(self) -> None:
        self.assign([])

    def _seek_state(self, st: _PartitionState, offset: int | None) -> None:
        st.fetch_pos = st.consumed = offset
        st.buffer.clear()
        st.error = None
        st.generation += 1

    def seek(self, partition: Any, offset: int | None = None) -> None:
        """Continue ``partition`` (assigned) from ``offset`` (or the TopicPartition's offset)."""
        tp = _tp(partition)
        off = tp.offset if offset is None else offset
        st = self._parts.get((tp.topic, tp.partition))
        if st is None:
            raise KafkaError(f"{tp.topic}-{tp.partition} is not assigned")
        self._seek_state(st, off if off >= 0 else None)
        if off in (EARLIEST, LATEST):
            st.fetch_pos = off
        self._wake.set()

    async def position(self, partition: Any) -> int:
        """The offset of the next record :meth:`poll` returns for ``partition``."""
        tp = _tp(partition)
        st = self._parts.get((tp.topic, tp.partition))
        if st is None:
            raise KafkaError(f"{tp.topic}-{tp.partition} is not assigned")
        if st.consumed is None:
            await self._resolve([st])
        if st.error is not None:
            raise st.error
        assert st.consumed is not None
        return st.consumed

    async def get_watermark_offsets(self, partition: Any, timeout: float | None = None) -> tuple[int, int]:
        """``(low, high)``: the log start offset and the high watermark (the LSO under read_committed)."""
        tp = _tp(partition)
        low = await self._list_offset(tp.topic, tp.partition, EARLIEST)
        high = await self._list_offset(tp.topic, tp.partition, LATEST)
        return low, high

    async def _list_offset(self, topic: str, partition: int, timestamp: int) -> int:
        deadline = time.monotonic() + self.config["request.timeout.ms"] / 1000
        backoff = self.config["retry.backoff.ms"] / 1000
        while True:
            try:
                await self.cluster.wait_topic(topic, max(0.0, deadline - time.monotonic()))
                node = self.cluster.leader(topic, partition)
                if node is None:
                    raise error_for(int(ErrorCode.leader_not_available.value), f"{topic}-{partition}")
                conn = await self.cluster.connection(node)
                v = conn.version(LIST_OFFSETS, LIST_OFFSETS_VERSIONS)
                resp = await conn.request(LIST_OFFSETS, v, list_offsets_request({topic: [(partition, timestamp)]},
                                                                               self.isolation))
                p = resp.topics[0].partitions[0]
                code = int(p.error_code)
                if code == 0:
                    return int(p.offset)
                err: KafkaError = error_for(code, f"ListOffsets {topic}-{partition}")
            except KafkaError as exc:
                err = exc
            if err.code in REFRESH_ERRORS:
                self.cluster.invalidate(topic)
            if not err.retriable or time.monotonic() > deadline:
                raise err
            await asyncio.sleep(backoff)

    async def _resolve(self, states: list[_PartitionState]) -> None:
        reset = self.config["auto.offset.reset"]
        for st in states:
            if st.fetch_pos is not None and st.fetch_pos >= 0:
                continue
            ts = st.fetch_pos if st.fetch_pos in (EARLIEST, LATEST) else {"earliest": EARLIEST,
                                                                          "latest": LATEST}.get(reset)
            if ts is None:
                st.error = OffsetOutOfRangeError(f"{st.topic}-{st.partition} has no position and "
                                                 "auto.offset.reset=none")
                continue
            gen = st.generation
            try:
                off = await self._list_offset(st.topic, st.partition, ts)
            except KafkaError as exc:
                st.error = exc
                continue
            if st.generation == gen:
                st.fetch_pos = st.consumed = off

    # -- consuming ---------------------------------------------------------------------------

    async def poll(self, timeout: float | None = None) -> Message | None:
        """The next message of any assigned partition, or None after ``timeout`` seconds."""
        msgs = await self.consume(1, timeout)
        return msgs[0] if msgs else None

    async def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``num_messages`` messages; waits up to ``timeout`` s (None: until there is one)."""
        if self._closed:
            raise ClientClosedError("consumer is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            out = self._take(num_messages)
            if out:
                return out
            for st in self._parts.values():
                if st.error is not None and not st.buffer:
                    err, st.error = st.error, None
                    raise err
            self._data.clear()
            self._wake.set()
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return []
            try:
                await asyncio.wait_for(self._data.wait(), wait)
            except asyncio.TimeoutError:
                return []

    def _take(self, n: int) -> list[Message]:
        out: list[Message] = []
        order = self._order
        for _ in range(len(order)):
            key = order[0]
            order.rotate(-1)  # round robin over partitions
            st = self._parts.get(key)
            if st is None or not st.buffer:
                continue
            buf = st.buffer
            while buf and len(out) < n:
                m = buf.popleft()
                out.append(m)
                st.consumed = m.offset + 1
            if not buf:
                st.consumed = st.fetch_pos  # past trailing control/aborted batches too, as in Java
                self._wake.set()
            if len(out) >= n:
                break
        return out

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while not self._closed:
            msg = await self.poll(None)
            if msg is not None:
                yield msg

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._task, *self._fetches) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.cluster.close()

    # -- the fetcher -------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            self._wake.clear()
            unresolved = [st for st in self._parts.values()
                          if (st.fetch_pos is None or st.fetch_pos < 0) and st.error is None]
            if unresolved:
                await self._resolve(unresolved)
            by_node: dict[int, list[_PartitionState]] = {}
            refresh: set[str] = set()
            for st in self._parts.values():
                if st.buffer or st.in_flight or st.error is not None or st.fetch_pos is None or st.fetch_pos < 0:
                    continue
                node = self.cluster.leader(st.topic, st.partition)
                if node is None or self.cluster.stale(st.topic):
                    refresh.add(st.topic)
                    continue
                if node not in self._node_busy:
                    by_node.setdefault(node, []).append(st)
            if refresh:
                try:
                    await self.cluster.refresh(sorted(refresh))
                except KafkaError:
                    await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
                continue
            for node, states in by_node.items():
                self._node_busy.add(node)
                for st in states:
                    st.in_flight = True
                task = asyncio.ensure_future(self._fetch(node, states))
                self._fetches.add(task)
                task.add_done_callback(self._fetches.discard)
            if not self._wake.is_set():
                timer = loop.call_later(1.0, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()

    async def _fetch(self, node: int, states: list[_PartitionState]) -> None:
        cfg = self.config
        gens = {(st.topic, st.partition): (st.generation, st.fetch_pos) for st in states}
        try:
            conn = await self.cluster.connection(node)
            v = conn.version(FETCH, FETCH_VERSIONS)
            parts: dict[str, list[tuple[int, int]]] = {}
            for st in states:
                parts.setdefault(st.topic, []).append((st.partition, st.fetch_pos))  # type: ignore[arg-type]
            body = fetch_request(parts, self.isolation, max_wait_ms=cfg["fetch.max.wait.ms"],
                                 min_bytes=cfg["fetch.min.bytes"], max_bytes=cfg["fetch.max.bytes"],
                                 partition_max_bytes=cfg["max.partition.fetch.bytes"])
            timeout = cfg["request.timeout.ms"] / 1000 + cfg["fetch.max.wait.ms"] / 1000
            resp = await conn.request(FETCH, v, body, timeout=timeout)
            if int(resp.error_code):
                raise error_for(int(resp.error_code), "Fetch")
            got = False
            for t in resp.responses:
                for p in t.partitions:
                    key = (t.topic, int(p.partition_index))
                    st = self._parts.get(key)
                    if st is None or gens.get(key, (None,))[0] != st.generation:
                        continue  # unassigned or sought meanwhile
                    got |= self._apply(st, p)
            if got:
                self._data.set()
        except KafkaError as exc:
            for st in states:
                self.cluster.invalidate(st.topic)
            if not exc.retriable:
                for st in states:
                    st.error = exc
                self._data.set()
            else:
                await asyncio.sleep(cfg["retry.backoff.ms"] / 1000)
        except Exception as exc:  # a bug must surface from poll(), not spin
            for st in states:
                st.error = KafkaError(f"fetch failed: {exc!r}")
            self._data.set()
        finally:
            for st in states:
                st.in_flight = False
            self._node_busy.discard(node)
            self._wake.set()

    def _apply(self, st: _PartitionState, p: Any) -> bool:
        code = int(p.error_code)
        if code == OFFSET_OUT_OF_RANGE:
            reset = self.config["auto.offset.reset"]
            if reset == "none":
                st.error = OffsetOutOfRangeError(f"{st.topic}-{st.partition}: offset {st.fetch_pos} out of range")
                return True
            st.fetch_pos = EARLIEST if reset == "earliest" else LATEST
            return False
        if code:
            err = error_for(code, f"Fetch {st.topic}-{st.partition}")
            if err.code in REFRESH_ERRORS or err.retriable:
                self.cluster.invalidate(st.topic)
                return False
            st.error = err
            return True
        aborted = [(int(a.producer_id), int(a.first_offset)) for a in (p.aborted_transactions or ())]
        pos = st.fetch_pos
        assert pos is not None
        try:
            records, _batches, _skipped, next_pos = fetched_records(
                bytes(p.records or b""), st.partition, pos, self.isolation, aborted, self.config["check.crcs"])
        except ReaderError as exc:
            st.error = error_for(int(ErrorCode.corrupt_message.value), str(exc))
            return True
        topic = st.topic
        st.buffer.extend(Message(topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
                         for r in records)
        if not records and not st.buffer:
            st.consumed = next_pos  # only markers or aborted batches: the position moves past them
        st.fetch_pos = next_pos
        return bool(records)
