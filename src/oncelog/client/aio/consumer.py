"""The asyncio consumer: manual assignment, or group ``subscribe`` by list or regex.

Public: :class:`Consumer` (``from oncelog.client.aio import Consumer``),
:class:`Message`, :class:`TopicPartition`.

Internal design (for the group consumer that builds on it):

* ``_parts``: per assigned partition a :class:`_PartitionState` with the
  *fetch position* (next offset to fetch), the *consumed position* (next
  offset :meth:`poll` returns, what :meth:`position` reports and a group
  would commit) and a buffer of fetched, not yet returned messages.
* One fetcher task keeps, per leader broker, at most one Fetch in flight for
  the partitions of that broker whose buffer is empty (with ``_fetch_hold``,
  the blocking facade's: once at most that many of its partitions have
  records left, see :meth:`Consumer._held`). Fetch v4-v12 (topics
  by name), encoded by hand and decoded by hand from the connection's receive buffer
  (:mod:`oncelog.protocol.fetch`): each partition's records stay a view of it.
  CRC checks and the read_committed filter are
  :func:`oncelog.client.reader.fetched_batches` when the answer arrives; the
  batches of one answer are decoded in groups of about ``GROUP_RECORDS``
  records (:func:`~oncelog.client.reader.group_sections`, numpy; else batch by
  batch, :func:`~oncelog.client.reader.batch_section`) when the first of their
  records is handed out, so the next Fetch goes out while records are decoded.
  A group's batches are copied out of the receive buffer, or decompressed (all
  four codecs), only then: the bytes are still in the cache when their values
  are sliced (a group's compressed batches into one buffer reused per thread,
  :func:`~oncelog.client.reader.unpack_group`; ``consume`` decompresses each group
  it reaches of ``OFFLOAD_BYTES`` of compressed zstd (a third as much gzip) in a
  worker thread first, so that the loop is not held: one job at a time, the
  consumer's, which a cancelled ``consume`` leaves running for the next). The receive buffer lives until its last group is decoded.
  A group spans the partitions of one answer, so an answer's chunks are
  published to the buffers together, under one ``_lock`` hold, once all are
  built (a half-built group must never be reachable by a decode).
* ``consume`` hands out one partition's buffer until it is empty before the
  next partition's (Java's fetch buffer), so partitions drain and are
  refetched one after another. ``take_nowait`` is the same hand-out callable
  from another thread (the blocking facade's fast path); every change to the
  buffers, positions and partition order holds ``_lock``. With nothing
  buffered, the facade's caller waits on ``_arrived`` (a condition on
  ``_lock``, notified with every ``_data.set()``) in :meth:`wait_take`.
* A partition without a position gets one from ``auto.offset.reset``
  (ListOffsets earliest/latest; ``none`` -> :class:`OffsetOutOfRangeError`
  from :meth:`poll`); OFFSET_OUT_OF_RANGE resets the same way; leadership
  errors refresh metadata.
* Groups: :meth:`subscribe` creates a :class:`oncelog.client.aio.group.GroupMember`
  whose callbacks add (``_add``) and remove (``_remove``) partition states
  incrementally; newly assigned partitions start at the group's committed
  offset (OffsetFetch, ``require_stable`` under read_committed, KIP-447),
  else at ``auto.offset.reset``. Removing a partition drops its buffered
  records; every state gets a fresh ``generation`` so an in-flight Fetch for a
  partition that was revoked and assigned again is ignored. Every
  :meth:`consume` calls ``member.poll_happened()`` (``max.poll.interval.ms``)
  and, with ``enable.auto.commit``, commits the positions of what earlier
  polls returned every ``auto.commit.interval.ms`` (as Kafka's poll does).
  A regex subscription lists the cluster's topics every
  ``metadata.max.age.ms`` and rejoins when the matched set changes.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any

from oncelog.client.aio.cluster import METADATA, METADATA_VERSIONS, REFRESH_ERRORS, Cluster
from oncelog.client.aio.group import GroupMember
from oncelog.client.aio.offsets import OffsetAndMetadata, commit_offsets, fetch_offsets
from oncelog.client.aio.transactions import ConsumerGroupMetadata
from oncelog.client.config import ClientConfig, ConfigError, parse_config
from oncelog.client.errors import (
    ClientClosedError,
    KafkaConnectionError,
    KafkaError,
    OffsetOutOfRangeError,
    error_for,
)
from oncelog.client.reader import (
    EARLIEST,
    LATEST,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Batch,
    ReaderError,
    batch_section,
    group_sections,
    fetched_batches,
    borrow_buffer,
    list_offsets_request,
    return_buffer,
    unpack_into,
    unpacked,
)
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.fetch import FetchDecodeError, decode_fetch_response, encode_fetch_request

__all__ = ["Consumer", "Message", "TopicPartition"]

log = logging.getLogger("oncelog.client.consumer")
_generations = itertools.count(1)
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})

FETCH, LIST_OFFSETS = 1, 2
FETCH_VERSIONS = (4, 12)  # v13+ address topics by id only (protocol.fetch decodes v4-v12)
LIST_OFFSETS_VERSIONS = (2, 8)
OFFSET_OUT_OF_RANGE = int(ErrorCode.offset_out_of_range.value)
CORRUPT_MESSAGE = int(ErrorCode.corrupt_message.value)
GROUP_RECORDS = 2048  # records decoded together (numpy) at most, plus the last batch's
# a decode group with this many compressed bytes of zstd, or a third as many of gzip, is decompressed in a
# worker thread by the asyncio consume(): about 0.85 ms or more on the loop for records 2-4x compressible
# (JSON-like: gzip ~10 us a compressed KiB, zstd ~3.3); cramjam releases the GIL meanwhile. The hop costs
# CPU (the data crosses cores): about 6 % for such gzip records, 10-25 % for the bench's 50x compressible
# ones, which decompress fast (1 MiB of values in 8.7 KiB: 0.6 ms) and so stay on the loop. lz4 and snappy
# (about 0.5 ms per MiB) stay on the loop (docs/benchmarks.md "Compressed consume")
OFFLOAD_BYTES = 256 * 1024
_GZIP, _ZSTD = 1, 4


@dataclass(frozen=True, slots=True)
class TopicPartition:
    """A partition of a topic, with an optional starting ``offset`` (-1: none; -2 earliest; -1001 unset)."""

    topic: str
    partition: int
    offset: int = -1001


class Message:
    """One consumed record: ``topic``, ``partition``, ``offset``, ``key``, ``value``,
    ``headers`` (a list of ``(str, bytes | None)``, empty if none) and ``timestamp`` (ms).

    A plain ``__slots__`` class (equality by fields, like the dataclass it was). A record
    without headers is stored with None and gets its empty list when ``headers`` is first
    read, so the consumer does not allocate a list per record.
    """

    __slots__ = ("topic", "partition", "offset", "key", "value", "_headers", "timestamp")
    __match_args__ = ("topic", "partition", "offset", "key", "value", "headers", "timestamp")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]] | None, timestamp: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self._headers = headers
        self.timestamp = timestamp

    @property
    def headers(self) -> list[tuple[str, bytes | None]]:
        """The record's headers as ``(key, value)`` pairs (an empty list when none)."""
        h = self._headers
        if h is None:
            h = self._headers = []
        return h

    @headers.setter
    def headers(self, value: list[tuple[str, bytes | None]]) -> None:
        self._headers = value

    def _fields(self) -> tuple[Any, ...]:
        return (self.topic, self.partition, self.offset, self.key, self.value, self.headers, self.timestamp)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    def __repr__(self) -> str:
        return (f"Message(topic={self.topic!r}, partition={self.partition!r}, offset={self.offset!r}, "
                f"key={self.key!r}, value={self.value!r}, headers={self.headers!r}, "
                f"timestamp={self.timestamp!r})")


class _Chunk:
    """A partition's fetched batches of one decode group (CRC checked, read_committed-filtered,
    compressed ones still compressed), decoded into columns when the first of their records is handed
    out; ``i`` is the index of the next record.

    Decoding at hand-out, not when the Fetch answer arrives, lets the next Fetch go out at once (one
    is in flight per broker) while the records are decoded, and puts the decoding on the blocking
    facade's caller thread. Messages are built at hand-out too, so they are short-lived (a whole
    fetch of live Messages cost about a fifth of the consumer's CPU in the garbage collector). One
    chunk for all of a partition's batches in a group (not one per batch): the hand-out's work per
    chunk (slices of the columns, a ``map``) is then done about once per ``consume(500)``.
    """

    __slots__ = ("batches", "start", "offsets", "keys", "values", "headers", "timestamps", "i", "n", "group",
                 "error", "__weakref__")

    def __init__(self, batches: list[Batch], start: int, group: list[weakref.ref[_Chunk]] | None = None) -> None:
        self.batches: list[Batch] | None = batches  # None once decoded
        # the chunks of the same decode group (of one Fetch answer, any partition's): decoded together by
        # the first decode (numpy), or, when that path does not apply, one by one. Weak references: a
        # chunk dropped before decoding (seek, revoke, close) is freed at once, with its share of the
        # Fetch data, instead of waiting in a reference cycle for the garbage collector
        self.group = group
        self.start = start  # the fetch position: records below it are not handed out
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[tuple[str, bytes | None]] | None] = []
        self.timestamps: list[int] = []
        # a batch that did not decode: (the error, the position to stay at), raised by the hand-out once
        # the records of the batches before it are handed out
        self.error: tuple[ReaderError, int] | None = None
        self.i, self.n = 0, -1  # n: -1 until decoded

    def _set(self, parts: list[tuple[list[Any], ...]]) -> None:
        if len(parts) == 1:
            self.offsets, self.timestamps, self.keys, self.values, self.headers = parts[0]
        else:
            self.offsets, self.timestamps, self.keys, self.values, self.headers = (
                list(chain.from_iterable(p[c] for p in parts)) for c in range(5))
        self.batches = None
        self.n = len(self.offsets)

    def decode(self, partition: int) -> None:
        """Decode the batches (a batch that does not decode ends the chunk: ``error``); ``n`` may be 0
        (a compacted batch). Idempotent, and safe to run in two threads at once (``n`` is set last)."""
        group = self.group
        if group is not None:
            self.group = None
            todo = []
            for ref in group:
                ch = ref()
                if ch is not None:  # else dropped from the buffer: nothing to decode
                    ch.group = None
                    if ch.batches is not None:
                        todo.append(ch)
            batches = [b for ch in todo for b in ch.batches]  # type: ignore[union-attr]
            # other partitions' chunks among them: each batch cut at its own chunk's start
            cols = group_sections(batches, [ch.start for ch in todo for _b in ch.batches],  # type: ignore[union-attr]
                                  [len(ch.batches) for ch in todo])  # type: ignore[arg-type]
            if cols is not None:
                for ch, piece in zip(todo, cols):
                    ch._set([piece])
        bs = self.batches
        if bs is None:
            return
        parts = []
        for b in bs:
            try:
                parts.append(batch_section(b, partition, self.start))
            except ReaderError as exc:  # the position stays at this batch
                self.error = (exc, max(b.header.base_offset, self.start))
                break
        self._set(parts or [([], [], [], [], [])])


@dataclass
class _PartitionState:
    topic: str
    partition: int
    fetch_pos: int | None = None
    consumed: int | None = None
    buffer: deque[_Chunk] = field(default_factory=deque)  # never holds an exhausted chunk (once decoded)
    in_flight: bool = False
    error: KafkaError | None = None
    paused: bool = False
    # unique per state and seek: answers to older fetches (or to a revoked state's) are dropped
    generation: int = field(default_factory=lambda: next(_generations))


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
        # the group's own connections (Java's coordinator socket): heartbeats, JoinGroup/SyncGroup,
        # OffsetCommit and OffsetFetch. On the fetch connections they would wait behind a Fetch the
        # broker holds up to fetch.max.wait.ms, since answers come in request order per connection
        self._group_cluster = Cluster(self.config)
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
        self.group_id: str | None = self.config["group.id"] or None
        self._member: GroupMember | None = None
        self._literal_topics: list[str] = []
        self._patterns: list[re.Pattern[str]] = []
        self._user_cbs: dict[str, Any] = {}
        self._regex_task: asyncio.Task[None] | None = None
        self._auto_commit = bool(self.config["enable.auto.commit"]) and self.group_id is not None
        self._next_auto_commit = time.monotonic() + self.config["auto.commit.interval.ms"] / 1000
        self._commits: set[asyncio.Task[None]] = set()
        self._closing = False
        # the partition states' buffers, positions and order are also read by take_nowait() from
        # the blocking facade's caller thread: every change to them holds this lock
        self._lock = threading.RLock()
        # the worker thread's decompression of a large group that consume() runs (_offload): kept
        # here, so that a consume() cancelled meanwhile does not throw the work away
        self._unpacking: asyncio.Future[Any] | None = None
        # _data for a caller on another thread (the blocking facade's wait_take): ``_signals`` counts
        # the _signal() calls, notified under _lock
        self._arrived = threading.Condition(self._lock)
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        # None: a leader's Fetch goes out as soon as one of its partitions has no records buffered (Java's
        # fetchablePartitions). A number (the blocking facade's 1): only once at most that many of its
        # partitions still have records to hand out, so that the fetches are fewer, larger, and overlap
        # the caller's thread less (see _held)
        self._fetch_hold: int | None = None
        for cluster in (self.cluster, self._group_cluster):  # a TLS/SASL failure wakes a waiting poll()
            cluster.on_auth_error(self._signal)

    async def start(self) -> None:
        """Connect and read metadata."""
        if not self._started:
            self._loop = asyncio.get_running_loop()
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
        tps = [_tp(item) for item in partitions]
        with self._lock:
            new: dict[tuple[str, int], _PartitionState] = {}
            for tp in tps:
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
        """The partitions currently assigned (by ``assign()`` or the group)."""
        return [TopicPartition(t, p) for t, p in self._parts]

    def unassign(self) -> None:
        """Drop the whole manual assignment."""
        self.assign([])

    def _seek_state(self, st: _PartitionState, offset: int | None) -> None:
        with self._lock:
            st.fetch_pos = st.consumed = offset
            st.buffer.clear()
            st.error = None
            st.generation = next(_generations)

    def seek(self, partition: Any, offset: int | None = None) -> None:
        """Continue ``partition`` (assigned) from ``offset`` (or the TopicPartition's offset)."""
        tp = _tp(partition)
        off = tp.offset if offset is None else offset
        st = self._parts.get((tp.topic, tp.partition))
        if st is None:
            raise KafkaError(f"{tp.topic}-{tp.partition} is not assigned")
        with self._lock:
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
        if st.error is not None and not st.buffer:
            # an error waits behind the records buffered before it (a CRC mismatch after good
            # batches): the position is the next of those until they are consumed, as Java's
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
                self._signal()  # a waiting consume() or wait_take() raises it
                continue
            gen = st.generation
            try:
                off = await self._list_offset(st.topic, st.partition, ts)
            except KafkaError as exc:
                st.error = exc
                self._signal()
                continue
            if st.generation == gen:
                st.fetch_pos = st.consumed = off

    def incremental_assign(self, partitions: Iterable[Any]) -> None:
        """Add partitions to the assignment, keeping the others (and their positions)."""
        self._add([_tp(p) for p in partitions])

    def incremental_unassign(self, partitions: Iterable[Any]) -> None:
        """Remove partitions from the assignment; their fetched, unreturned records are dropped."""
        self._remove([_tp(p) for p in partitions])

    def _add(self, tps: list[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                key = (tp.topic, tp.partition)
                st = self._parts.get(key)
                if st is None:
                    st = self._parts[key] = _PartitionState(tp.topic, tp.partition)
                    self._order.append(key)
                if tp.offset >= 0:
                    self._seek_state(st, tp.offset)
                elif tp.offset in (EARLIEST, LATEST):
                    self._seek_state(st, None)
                    st.fetch_pos = tp.offset
        self._wake.set()

    def _remove(self, tps: list[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                st = self._parts.pop((tp.topic, tp.partition), None)
                if st is not None:
                    st.buffer.clear()
            self._order = deque(k for k in self._order if k in self._parts)
        self._wake.set()

    # -- pause / resume ------------------------------------------------------------------

    def pause(self, partitions: Iterable[Any]) -> None:
        """Stop fetching and returning these (assigned) partitions until :meth:`resume`."""
        for item in partitions:
            tp = _tp(item)
            st = self._parts.get((tp.topic, tp.partition))
            if st is not None:
                st.paused = True
                self._detach(st)
        self._wake.set()  # a paused partition's records no longer hold its leader's Fetch back (_held)

    def _detach(self, st: _PartitionState) -> None:
        """Copy the undecoded batches of a partition that may stay buffered a long time (paused) out
        of their Fetch answer's receive buffer, which they would otherwise keep alive (up to
        ``fetch.max.bytes``, for the other partitions' records long handed out); and out of a
        ``bytes`` more than twice their size (a decode group's decompressed bodies, the other
        partitions' included: ``reader.unpack_group``)."""
        with self._lock:
            for ch in st.buffer:
                for b in ch.batches or ():
                    for name in ("section", "packed"):
                        sec = getattr(b, name)
                        if sec is not None and (type(sec[0]) is memoryview or len(sec[0]) > 2 * (sec[2] - sec[1])):
                            setattr(b, name, (bytes(sec[0][sec[1]:sec[2]]), 0, sec[2] - sec[1]))

    def resume(self, partitions: Iterable[Any]) -> None:
        """Fetch and return these partitions again."""
        for item in partitions:
            tp = _tp(item)
            st = self._parts.get((tp.topic, tp.partition))
            if st is not None:
                st.paused = False
        self._wake.set()

    def paused(self) -> list[TopicPartition]:
        """The paused partitions."""
        return [TopicPartition(st.topic, st.partition) for st in self._parts.values() if st.paused]

    async def offsets_for_times(self, partitions: Iterable[Any], timeout: float | None = None) -> list[TopicPartition]:
        """For each ``TopicPartition(topic, partition, timestamp_ms)`` the earliest offset whose
        timestamp is at least that timestamp (offset -1: none), as confluent-kafka's."""
        out = []
        for item in partitions:
            tp = _tp(item)
            off = await asyncio.wait_for(self._list_offset(tp.topic, tp.partition, tp.offset), timeout)
            out.append(TopicPartition(tp.topic, tp.partition, off))
        return out

    # -- groups --------------------------------------------------------------------------

    def subscribe(self, topics: Any, on_assign: Any = None, on_revoke: Any = None, on_lost: Any = None) -> None:
        """Join ``group.id`` consuming ``topics``: a list of names, where a name starting with ``^``
        is a regular expression (as in confluent-kafka), or one name, pattern string or compiled
        ``re.Pattern``. Replaces an earlier subscription.

        The callbacks get a list of :class:`TopicPartition` and may be coroutine functions
        (awaited; the rebalance waits for them). ``on_assign``: partitions now owned (eager: the
        whole assignment; cooperative: the added ones), after their positions were set from the
        committed offsets, so a :meth:`seek` there wins. ``on_revoke``: partitions given up in an
        orderly way (still assigned during the call, so it may :meth:`commit`). ``on_lost``:
        partitions another member may already own (defaults to ``on_revoke``).
        """
        if self._closed:
            raise ClientClosedError("consumer is closed")
        if self.group_id is None:
            raise ConfigError("subscribe() needs group.id")
        items = [topics] if isinstance(topics, (str, re.Pattern)) else list(topics)
        literal: list[str] = []
        patterns: list[re.Pattern[str]] = []
        for t in items:
            if isinstance(t, re.Pattern):
                patterns.append(t)
            elif isinstance(t, str) and t.startswith("^"):
                try:
                    patterns.append(re.compile(t))
                except re.error as exc:
                    raise ConfigError(f"subscribe: bad regular expression {t!r}: {exc}") from None
            elif isinstance(t, str) and t:
                literal.append(t)
            else:
                raise TypeError(f"subscribe: not a topic name or pattern: {t!r}")
        if not literal and not patterns:
            raise ValueError("subscribe: no topics (use unsubscribe())")
        self._literal_topics, self._patterns = sorted(set(literal)), patterns
        self._user_cbs = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}
        if self._member is None:
            if self._parts:
                self.assign([])  # a manual assignment ends with subscribe, as in Kafka
            self._member = GroupMember(self._group_cluster, self.config, self._literal_topics, on_assign=self._on_assign,
                                       on_revoke=self._on_revoke, on_lost=self._on_lost)
            if not patterns:
                asyncio.ensure_future(self._member.start())
        else:
            if not patterns:
                self._member.subscribe(self._literal_topics)
        if self._regex_task is not None:
            self._regex_task.cancel()
            self._regex_task = None
        if patterns:
            self._regex_task = asyncio.ensure_future(self._watch_topics(self._member))

    def subscription(self) -> list[str]:
        """The subscribed topic names (with a regex: the names it matches now)."""
        return self._member.subscription if self._member is not None else []

    async def unsubscribe(self) -> None:
        """Leave the group (revoking the partitions, committing first with auto-commit)."""
        if self._regex_task is not None:
            self._regex_task.cancel()
            self._regex_task = None
        member, self._member = self._member, None
        if member is not None:
            await member.close()
        self._literal_topics, self._patterns = [], []
        self.assign([])

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group generation for ``Producer.send_offsets_to_transaction`` (KIP-447)."""
        if self._member is not None:
            return self._member.group_metadata()
        if self.group_id is None:
            raise ConfigError("group_metadata() needs group.id")
        return ConsumerGroupMetadata(self.group_id, -1, "", self.config["group.instance.id"] or None)

    @property
    def member(self) -> GroupMember | None:
        """The group member while subscribed (its ``generation_id``, ``member_id``, ...)."""
        return self._member

    async def _all_topics(self) -> list[str]:
        conn = await self.cluster.any_connection()
        v = conn.version(METADATA, METADATA_VERSIONS)
        md = await conn.request(METADATA, v, {"topics": None, "allow_auto_topic_creation": False,
                                              "include_cluster_authorized_operations": False,
                                              "include_topic_authorized_operations": False})
        return [t.name for t in md.topics
                if int(t.error_code) == 0 and not getattr(t, "is_internal", False) and t.name not in INTERNAL_TOPICS]

    async def _watch_topics(self, member: GroupMember) -> None:
        """Regex subscription: match the cluster's topics now and every ``metadata.max.age.ms``."""
        period = max(self.config["metadata.max.age.ms"] / 1000, 0.1)
        backoff = self.config["retry.backoff.ms"] / 1000
        started = member._task is not None
        while self._member is member and not self._closing:
            try:
                names = await self._all_topics()
            except KafkaError as exc:
                log.info("listing topics for the regex subscription failed: %s", exc)
                await asyncio.sleep(backoff)
                continue
            matched = {n for n in names if any(p.search(n) for p in self._patterns)}
            want = sorted(matched | set(self._literal_topics))
            if not started:
                member._topics = want
                await member.start()
                started = True
            elif want != member.subscription:
                log.info("group %s: the regex subscription now matches %s", self.group_id, want)
                member.subscribe(want)
            await asyncio.sleep(period)

    async def _call_user(self, name: str, tps: list[TopicPartition]) -> None:
        cb = self._user_cbs.get(name)
        if cb is None and name == "on_lost":
            cb = self._user_cbs.get("on_revoke")
        if cb is None:
            return
        res = cb(tps)
        if inspect.isawaitable(res):
            await res

    async def _on_assign(self, parts: list[tuple[str, int]]) -> None:
        tps = [TopicPartition(t, p) for t, p in parts]
        if parts:
            committed = await fetch_offsets(self._group_cluster, self.group_id or "", parts,
                                            require_stable=self.isolation == READ_COMMITTED)
            starts = []
            for t, p in parts:
                om = committed.get((t, p))
                starts.append(TopicPartition(t, p, om.offset if om is not None and om.offset >= 0 else -1001))
            self._add(starts)
        await self._call_user("on_assign", tps)

    async def _on_revoke(self, parts: list[tuple[str, int]]) -> None:
        if self._auto_commit and not self._closing and parts:
            try:
                await self._commit_positions(parts)
            except KafkaError as exc:
                log.warning("auto-commit before revoking %s failed: %s", parts, exc)
        try:
            await self._call_user("on_revoke", [TopicPartition(t, p) for t, p in parts])
        finally:
            self._remove([TopicPartition(t, p) for t, p in parts])

    async def _on_lost(self, parts: list[tuple[str, int]]) -> None:
        try:
            await self._call_user("on_lost", [TopicPartition(t, p) for t, p in parts])
        finally:
            self._remove([TopicPartition(t, p) for t, p in parts])

    # -- offsets ---------------------------------------------------------------------------

    def _positions(self, keys: Iterable[tuple[str, int]] | None) -> dict[tuple[str, int], int]:
        sel = self._parts if keys is None else {k: self._parts[k] for k in keys if k in self._parts}
        return {k: st.consumed for k, st in sel.items() if st.consumed is not None and st.consumed >= 0}

    async def _commit_positions(self, keys: Iterable[tuple[str, int]] | None) -> None:
        offsets = self._positions(keys)
        if offsets:
            await self._commit(offsets)

    async def _commit(self, offsets: dict[tuple[str, int], int | OffsetAndMetadata]) -> None:
        if self.group_id is None:
            raise ConfigError("commit() needs group.id")
        if self._member is not None:
            await self._member.commit(offsets)
        else:
            await commit_offsets(self._group_cluster, self.group_id, offsets,
                                 group_instance_id=self.config["group.instance.id"] or None)

    def _maybe_auto_commit(self) -> None:
        if not self._auto_commit or time.monotonic() < self._next_auto_commit:
            return
        self._next_auto_commit = time.monotonic() + self.config["auto.commit.interval.ms"] / 1000
        if self._member is not None and not self._member.in_group:
            return
        offsets = self._positions(None)
        if offsets:
            task = asyncio.ensure_future(self._commit(offsets))
            self._commits.add(task)
            task.add_done_callback(self._commit_done)

    def _commit_done(self, task: asyncio.Task[None]) -> None:
        self._commits.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("asynchronous commit failed: %s", task.exception())

    async def commit(self, offsets: Any = None, asynchronous: bool = False) -> asyncio.Task[None] | None:
        """Commit ``offsets`` (``TopicPartition`` list with offsets, or ``{(topic, partition): offset}``;
        None: the current positions of every assigned partition) for ``group.id``.

        ``asynchronous=True`` returns at once with the task (its exception, if any, is the typed error);
        otherwise waits and raises typed errors (``IllegalGenerationError``, ... after a rebalance).
        """
        if self.group_id is None:
            raise ConfigError("commit() needs group.id")
        if offsets is None:
            norm: dict[tuple[str, int], int | OffsetAndMetadata] = dict(self._positions(None))
        elif isinstance(offsets, dict):
            norm = {(t, p): o for (t, p), o in offsets.items()}
        else:
            norm = {}
            for item in offsets:
                tp = _tp(item)
                if tp.offset < 0:
                    raise ValueError(f"commit: {tp.topic}-{tp.partition} has no offset")
                norm[(tp.topic, tp.partition)] = tp.offset
        if not norm:
            return None
        if asynchronous:
            task = asyncio.ensure_future(self._commit(norm))
            self._commits.add(task)
            task.add_done_callback(self._commit_done)
            return task
        await self._commit(norm)
        return None

    async def committed(self, partitions: Iterable[Any], timeout: float | None = None) -> list[TopicPartition]:
        """The group's committed offsets for ``partitions`` (offset -1001: none); ``require_stable``
        under read_committed (KIP-447)."""
        if self.group_id is None:
            raise ConfigError("committed() needs group.id")
        keys = [(tp.topic, tp.partition) for tp in map(_tp, partitions)]
        got = await fetch_offsets(self._group_cluster, self.group_id, keys, require_stable=self.isolation == READ_COMMITTED,
                                  timeout=timeout)
        return [TopicPartition(t, p, om.offset if (om := got.get((t, p))) is not None else -1001) for t, p in keys]

    # -- consuming ---------------------------------------------------------------------------

    async def poll(self, timeout: float | None = None) -> Message | None:
        """The next message of any assigned partition, or None after ``timeout`` seconds."""
        msgs = await self.consume(1, timeout)
        return msgs[0] if msgs else None

    async def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``num_messages`` messages; waits up to ``timeout`` s (None: until there is one).

        Raises ``ClientClosedError`` once ``close()`` began (as Java's poll() after close), and in a call
        that ``close()`` ends: nothing is handed out after the positions close() commits."""
        if self._closed or self._closing:
            raise ClientClosedError("consumer is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        member = self._member
        if member is not None:
            member.poll_happened()
            if member.error is not None:
                raise member.error
        self._maybe_auto_commit()
        while True:
            if self._closed or self._closing:  # woken by close() (_shutdown), or by data while it commits
                raise ClientClosedError("consumer is closed")
            if member is not None and member.error is not None:
                raise member.error
            # each large group the take reaches decompressed in a thread, one after another: the loop stays free
            while (big := self._big_group(num_messages)) is not None:
                ok = await self._offload(big)
                if self._closed or self._closing:  # close() ran meanwhile (and committed): as the wait
                    raise ClientClosedError("consumer is closed")
                if not ok:  # damage: _take decodes the group on the loop, which raises the precise error
                    break
            out, drained = self._take(num_messages)
            if drained:
                self._wake.set()
            if out:
                return out
            if (auth := self.cluster.take_auth_error() or self._group_cluster.take_auth_error()) is not None:
                raise auth  # as KafkaConsumer.poll(): a connection failed TLS/SASL authentication
            for st in self._parts.values():
                if st.error is not None and not st.buffer and not st.paused:
                    err, st.error = st.error, None
                    raise err
            self._data.clear()
            self._wake.set()
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return []
            try:
                # not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives as
                # the data does (it returns the inner result), and a caller's `while True: await
                # consume(...)` task then never ends when cancelled (the churn test's close hang)
                async with asyncio.timeout(wait):
                    await self._data.wait()
            except TimeoutError:
                return []

    async def _offload(self, batches: list[Batch]) -> bool:
        """Decompress ``batches`` (a group from :meth:`_big_group`) in a worker thread. The job belongs
        to the consumer, not to this call: if the caller is cancelled meanwhile (a timeout shorter than
        the decompression), it runs on and its result is applied when it ends (:meth:`_unpacked`), and
        the next call awaits it instead of starting another. One job at a time: a job already running
        (another task's, or one for a group a seek dropped) is awaited instead (the caller looks
        again). False if the job's batches do not decompress."""
        fut = self._unpacking
        if fut is None:
            fut = asyncio.get_running_loop().run_in_executor(None, unpack_into, batches, borrow_buffer())
            self._unpacking = fut
            fut.add_done_callback(self._unpacked)  # first: it runs before the awaiting task resumes
        got = await asyncio.shield(fut)
        return len(got[2]) == len(got[1])

    def _unpacked(self, fut: asyncio.Future[Any]) -> None:
        """The end of an :meth:`_offload` job, on the loop: the batches get their sections (the bytes
        made on the loop thread: made in the worker, they cost page faults), the buffer goes back."""
        if self._unpacking is fut:
            self._unpacking = None
        if fut.cancelled() or fut.exception() is not None:
            return  # the exception is raised by the awaiting consume() (if any)
        got = fut.result()
        unpacked(got)  # the batches up to a damaged one, if any (the loop decodes on and raises its error)
        return_buffer(got[0])
        # a partition paused while the worker ran: its batches copied out by pause() are skipped by
        # unpacked() (packed replaced); any other that got a section into the group's bytes is copied out
        for st in list(self._parts.values()):
            if st.paused and st.buffer:
                self._detach(st)

    def _big_group(self, n: int) -> list[Batch] | None:
        """The batches of a decode group that the next ``_take(n)`` would decode while still compressed,
        if it is large enough to decompress off the loop (``OFFLOAD_BYTES`` of zstd, a third as many of
        gzip, compressed), else None."""
        try:  # unlocked fast path (poll(), async for): the next chunk is decoded and holds the n records
            st = self._parts[self._order[0]]
            ch = st.buffer[0]
            if ch.n - ch.i >= n and not st.paused:  # (n is -1 while undecoded)
                return None
        except (IndexError, KeyError):
            pass
        with self._lock:  # the blocking facade's caller thread hands out too
            for key in self._order:  # the chunks in hand-out order, until n records
                st = self._parts.get(key)
                if st is None or st.paused:
                    continue
                for ch in st.buffer:
                    if ch.n >= 0:
                        n -= ch.n - ch.i
                    else:
                        refs = ch.group
                        chunks = [ch] if refs is None else [c for r in refs if (c := r()) is not None]
                        batches = [b for c in chunks for b in c.batches or ()]
                        size = 0
                        for b in batches:
                            packed = b.packed
                            if packed is not None and b.section is None:
                                codec = b.header.compression
                                if codec == _GZIP:
                                    size += 3 * (packed[2] - packed[1])
                                elif codec == _ZSTD:
                                    size += packed[2] - packed[1]
                        if size >= OFFLOAD_BYTES:
                            return batches
                        n -= sum(b.header.records_count for b in ch.batches or ())
                    if n <= 0:
                        return None
        return None

    def take_nowait(self, n: int) -> list[Message] | None:
        """Up to ``n`` already fetched messages, callable from any thread (the blocking facade's
        fast path: no hop to the loop thread while records are buffered).

        None when this must go through :meth:`consume` on the loop instead: nothing is buffered,
        the consumer is closed, the group member has an error or a ``max.poll.interval.ms``
        expiry to act on, or an auto-commit is due.
        """
        if self._leave_to_consume():
            return None
        member = self._member
        self._predecode()
        out, drained = self._take(n)
        if not out:
            return None
        if member is not None:
            member._last_poll = time.monotonic()  # poll_happened() without a pending expiry
        if drained and self._loop is not None and self._wake_needed(drained):
            self._loop.call_soon_threadsafe(self._wake.set)  # the fetcher refills the drained partitions
        return out

    def _leave_to_consume(self) -> bool:
        """Whether the caller-thread paths (:meth:`take_nowait`, :meth:`take_one_nowait`, :meth:`wait_take`)
        must leave this call to :meth:`consume`: the consumer is closed, the group member has an error or
        a ``max.poll.interval.ms`` expiry to act on, or an auto-commit is due."""
        member = self._member
        return (self._closed or self._closing or (member is not None and (member.error is not None or member._poll_expired))
                or (self._auto_commit and time.monotonic() >= self._next_auto_commit))

    def _signal(self) -> None:
        """Records or an error to hand out (on the loop): wakes :meth:`consume` and :meth:`wait_take`."""
        self._data.set()
        with self._lock:
            self._signals += 1
            self._arrived.notify_all()

    def wait_take(self, n: int, timeout: float) -> list[Message] | None:
        """Wait up to ``timeout`` s on this (another) thread for the next Fetch answer with records or an
        error, then :meth:`take_nowait`: the blocking facade's wait, when nothing is buffered, without a
        coroutine on the loop and a hand-off back (one per Fetch answer when the caller is faster than
        the fetches), and the records then decoded on the caller's thread rather than the loop's.

        None (at once) in the cases :meth:`take_nowait` leaves to :meth:`consume`, and when nothing
        came or nothing could be taken: the caller then goes through :meth:`consume`, which raises
        the errors and waits on. The ``max.poll.interval.ms`` clock restarts here, as in
        :meth:`consume`.

        An error :meth:`consume` would raise with nothing to hand out (a partition's, not paused, with
        no records left; a pending TLS/SASL failure) returns None at once, and ends a wait: the error is
        raised where :meth:`consume` raises it, after the records buffered before it."""
        if self._leave_to_consume():
            return None
        member = self._member
        if member is not None:
            member._last_poll = time.monotonic()
        with self._lock:
            seq = self._signals
            if not any(st.buffer and not st.paused for st in self._parts.values()):
                if self._error_pending() or not self._arrived.wait_for(
                        lambda: self._signals != seq or self._error_pending(), timeout):
                    return None
        return self.take_nowait(n)

    def _error_pending(self) -> bool:
        """Whether :meth:`consume`, with nothing to hand out, would raise: a TLS/SASL failure (looked at,
        not taken) or a partition's error (not paused, its records all handed out)."""
        return (self.cluster._auth_error is not None or self._group_cluster._auth_error is not None
                or any(st.error is not None and not st.buffer and not st.paused for st in list(self._parts.values())))

    def _held(self) -> dict[int | None, int]:
        """Per leader, how many of its partitions have records to hand out (not paused).

        With ``_fetch_hold`` the fetcher waits for these to drain (all but ``_fetch_hold``) before it
        fetches a leader's drained partitions: the blocking facade's caller thread then decodes while the
        loop thread waits for the next answer, not while it receives one. Fetching each partition as it
        drained (Java's policy) made two to three times as many, smaller Fetches, whose answers arrived
        while the caller decoded (GIL hand-offs, the receive and the decode competing for the caches):
        about 10 % more CPU per MB when the caller keeps up with the fetches (docs/benchmarks.md). With
        one partition left to hand out while the next Fetch is in flight, a slower caller still has
        records to work on meanwhile."""
        held: dict[int | None, int] = {}
        leader = self.cluster.leader
        # a snapshot (one C call): also called on the caller's thread, while the loop thread may add states
        for st in list(self._parts.values()):
            if st.buffer and not st.paused:
                node = leader(st.topic, st.partition)
                held[node] = held.get(node, 0) + 1
        return held

    def _wake_needed(self, drained: list[_PartitionState]) -> bool:
        """Whether the fetcher must be woken from another thread for these drained partitions: not when
        a Fetch is in flight to each one's leader, since the fetcher runs again when that answer is in
        (``_fetch`` sets ``_wake`` after it has cleared the node's busy mark; a drain seen here with the
        mark still set happened before that wake, so the fetcher's next pass sees it). Each wake from
        the caller's thread is a write to the loop's self-pipe and a hand-off of the GIL to the loop
        thread and back; about one per partition and Fetch answer, most while a Fetch is in flight."""
        busy = self._node_busy
        leader = self.cluster.leader
        idle = [node for node in (leader(st.topic, st.partition) for st in drained) if node not in busy]
        if not idle:
            return False
        if self._fetch_hold is None:
            return True
        held = self._held()  # the fetcher would not fetch yet: no wake until it would
        return any(node is None or held.get(node, 0) <= self._fetch_hold for node in idle)

    def take_one_nowait(self) -> Message | None:
        """:meth:`take_nowait` for one message (the blocking ``poll()``), without the list.

        Handles the common case, a message of the current partition that does not empty its
        buffer; anything else goes through :meth:`take_nowait`.
        """
        if self._leave_to_consume():
            return None
        member = self._member
        with self._lock:
            order = self._order
            st = self._parts.get(order[0]) if order else None
            if st is not None and st.buffer and not st.paused and not self._closing:
                ch = st.buffer[0]
                i = ch.i
                if i + 1 < ch.n:  # decoded, and the chunk (so the buffer) keeps records: nothing to wake
                    ch.i = i + 1
                    off = ch.offsets[i]
                    st.consumed = off + 1
                    msg = Message(st.topic, st.partition, off, ch.keys[i], ch.values[i], ch.headers[i],
                                  ch.timestamps[i])
                    if member is not None:
                        member._last_poll = time.monotonic()
                    return msg
        got = self.take_nowait(1)  # decodes the next chunk first, outside the lock
        return got[0] if got else None

    def _predecode(self) -> None:
        """Decode the next chunk to hand out before taking the lock (another thread's caller:
        the fetcher's answers need the lock meanwhile). Unlocked reads: anything that changed
        meanwhile is sorted out under the lock by :meth:`_take`, which reports decode errors."""
        try:
            st = self._parts.get(self._order[0])
            if st is not None and not st.paused:
                ch = st.buffer[0]
                if ch.n < 0:
                    ch.decode(st.partition)
        except (IndexError, ReaderError):
            pass

    def _take(self, n: int) -> tuple[list[Message], list[_PartitionState]]:
        """Up to ``n`` buffered messages; and the partitions whose buffer drained (the fetcher must be
        woken: asyncio.Event is not thread-safe, the caller wakes it).

        A partition's buffer is handed out until it is empty before the next partition's (round
        robin over partitions by fetch, as Java's fetch buffer does), so the partitions drain
        one after another and are refetched while the others' records are still being consumed,
        instead of all at once.
        """
        out: list[Message] = []
        drained: list[_PartitionState] = []
        with self._lock:
            if self._closing or self._closed:  # close() set _closing under the lock before its commit
                return out, drained
            order = self._order
            for _ in range(len(order)):
                key = order[0]
                st = self._parts.get(key)
                if st is None or not st.buffer or st.paused:
                    order.rotate(-1)
                    continue
                buf = st.buffer
                k = n - len(out)
                topic, part = st.topic, st.partition
                while buf and k > 0:
                    ch = buf[0]
                    if ch.n < 0:
                        ch.decode(part)
                    i = ch.i
                    if i < ch.n:
                        if k == 1:  # poll(): one message, no slicing
                            out.append(Message(topic, part, ch.offsets[i], ch.keys[i], ch.values[i], ch.headers[i],
                                               ch.timestamps[i]))
                            j = i + 1
                        elif i == 0 and ch.n <= k:  # the whole chunk: its columns as they are
                            j = ch.n
                            out.extend(map(Message, repeat(topic, j), repeat(part, j), ch.offsets, ch.keys,
                                           ch.values, ch.headers, ch.timestamps))
                        else:
                            j = min(ch.n, i + k)
                            out.extend(map(Message, repeat(topic, j - i), repeat(part, j - i), ch.offsets[i:j],
                                           ch.keys[i:j], ch.values[i:j], ch.headers[i:j], ch.timestamps[i:j]))
                        k -= j - i
                        ch.i = j
                        st.consumed = ch.offsets[j - 1] + 1
                    if ch.i == ch.n:
                        if ch.error is not None:  # consume() raises it; the position stays at the batch
                            exc, at = ch.error
                            st.error = error_for(CORRUPT_MESSAGE, str(exc))
                            st.fetch_pos = st.consumed = at
                            buf.clear()
                            break
                        buf.popleft()
                if not buf:
                    st.consumed = st.fetch_pos  # past trailing control/aborted batches too, as in Java
                    drained.append(st)
                    order.rotate(-1)
                if len(out) >= n:
                    break
        return out, drained

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        # close() (from another task) ends the iteration quietly, whether poll() waited or decompressed;
        # iterating a consumer closed before raises ClientClosedError (as Java's poll() after close)
        if self._closed or self._closing:
            raise ClientClosedError("consumer is closed")
        while True:
            try:
                msg = await self.poll(None)
            except ClientClosedError:
                return
            if msg is not None:
                yield msg

    async def close(self) -> None:
        """Commit (with ``enable.auto.commit``), leave the group (revoking the partitions), disconnect."""
        if self._closed:
            return
        with self._lock:  # a take on a caller's thread ends before, or hands out nothing (_take)
            self._closing = True
        try:
            if self._auto_commit:
                try:
                    await self._commit_positions(None)
                except KafkaError as exc:
                    log.warning("auto-commit on close failed: %s", exc)
            if self._regex_task is not None:
                self._regex_task.cancel()
            if self._member is not None:
                await self._member.close()
                self._member = None
            if self._commits:
                await asyncio.gather(*self._commits, return_exceptions=True)
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._closed = True
        self._signal()  # a caller in wait_take() returns (and finds the consumer closed)
        tasks = [t for t in (self._task, *self._fetches) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.cluster.close()
        await self._group_cluster.close()

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
                if (st.buffer or st.in_flight or st.paused or st.error is not None or st.fetch_pos is None
                        or st.fetch_pos < 0):
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
            if self._fetch_hold is not None and by_node:
                held = self._held()
                for node in [nd for nd in by_node if held.get(nd, 0) > self._fetch_hold]:
                    del by_node[node]  # the caller drains the others first; its last drain wakes us
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
            # by hand (one per answer): the generic encoder took ~80-190 us a Fetch, ~3 % of the CPU
            body = encode_fetch_request(v, parts, self.isolation, max_wait_ms=cfg["fetch.max.wait.ms"],
                                        min_bytes=cfg["fetch.min.bytes"], max_bytes=cfg["fetch.max.bytes"],
                                        partition_max_bytes=cfg["max.partition.fetch.bytes"])
            timeout = cfg["request.timeout.ms"] / 1000 + cfg["fetch.max.wait.ms"] / 1000
            frame, at = await conn.send(FETCH, v, body, timeout=timeout, raw_buffer=True)
            try:  # by hand from the receive buffer: each partition's records copied out once
                resp = decode_fetch_response(frame, at, v, copy=False)  # records: views of the frame
            except FetchDecodeError as exc:  # as a response kio cannot parse: the connection is unusable
                conn.close()
                raise KafkaConnectionError(f"cannot decode response to API {FETCH} v{v}: {exc}") from None
            del frame
            if int(resp.error_code):
                raise error_for(int(resp.error_code), "Fetch")
            if self._apply_answer(resp, gens):
                self._signal()
        except KafkaError as exc:
            for st in states:
                self.cluster.invalidate(st.topic)
            if not exc.retriable:
                for st in states:
                    st.error = exc
                self._signal()
            else:
                await asyncio.sleep(cfg["retry.backoff.ms"] / 1000)
        except Exception as exc:  # a bug must surface from poll(), not spin
            for st in states:
                st.error = KafkaError(f"fetch failed: {exc!r}")
            self._signal()
        finally:
            for st in states:
                st.in_flight = False
            self._node_busy.discard(node)
            self._wake.set()

    def _apply_answer(self, resp: Any, gens: dict[tuple[str, int], tuple[int, int | None]]) -> bool:
        """Buffer a Fetch answer's partitions (those still assigned at the generation fetched);
        whether any got records or an error to hand out."""
        got = False
        # the decode group being filled, across the answer's partitions, and what is to publish
        grouping: list[Any] = [[], 0, []]
        for t in resp.responses:
            for p in t.partitions:
                key = (t.topic, int(p.partition_index))
                st = self._parts.get(key)
                if st is None or gens.get(key, (None,))[0] != st.generation:
                    continue  # unassigned or sought meanwhile
                got |= self._apply(st, p, grouping)
        self._publish(grouping[2])
        return got

    def _publish(self, staged: list[tuple[_PartitionState, list[_Chunk], int]]) -> None:
        """Hand a Fetch answer's chunks to their partitions' buffers, all under one lock hold, once all
        are complete: a decode group spans the answer's partitions, and the blocking facade's caller
        thread decodes a whole group as soon as one of its chunks is reachable. A chunk published while
        another of its group was still being filled was decoded half-filled (its later batches lost)."""
        with self._lock:
            for st, chunks, next_pos in staged:
                st.buffer.extend(chunks)
                if not chunks and not st.buffer:
                    st.consumed = next_pos  # only markers or aborted batches: the position moves past them
                st.fetch_pos = next_pos
        for st, chunks, _next_pos in staged:
            if st.paused and chunks:  # paused while this Fetch was in flight: kept, but not as views of its answer
                self._detach(st)

    def _apply(self, st: _PartitionState, p: Any, grouping: list[Any] | None = None) -> bool:
        """Buffer one partition's part of a Fetch answer. ``grouping``: ``[group, records in it, staged]``,
        the decode group being filled, shared by the partitions of one answer, and the chunks built, which
        the caller publishes (:meth:`_publish`) once the whole answer is built. None: a group of its own,
        published at once."""
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
        data = p.records if p.records is not None else b""
        try:  # CRC checks, decompression, the read_committed filter; records are decoded at hand-out
            # a view of the receive buffer, copied batch group by batch group as they are decoded (hot in
            # the cache then: copied here, a Fetch answer's megabytes were cold by the time they were read)
            kept, _batches, _skipped, next_pos = fetched_batches(
                data, st.partition, pos, self.isolation, aborted, self.config["check.crcs"], defer=True)
        except ReaderError as exc:
            st.error = error_for(CORRUPT_MESSAGE, str(exc))
            # as Java's fetcher: the batches before the bad one (CRC mismatch, bad magic) are handed
            # out first and the error after them (st.error waits for an empty buffer); the position
            # stays at the bad batch. They were dropped with it, and re-fetched into the same error.
            if not exc.batch_start:
                return True
            try:
                kept, _batches, _skipped, next_pos = fetched_batches(
                    data[:exc.batch_start], st.partition, pos, self.isolation, aborted,
                    self.config["check.crcs"], defer=True)
            except ReaderError:
                return True
        # decoded together in groups of about GROUP_RECORDS records: a compressed batch is decompressed
        # when its group is decoded, so what is decompressed, copied and sliced stays cache-sized
        # (one group per partition decompressed 1 MiB of lz4 into ~50 MB at once, faulting in fresh memory).
        # A group goes on across the partitions of one answer: uncompressed, a partition's 1 MiB is about
        # 900 records of 1 KiB, and numpy's cost per call weighed 20 % more at 900 records than at 1,800
        chunks: list[_Chunk] = []
        group, n = (grouping[0], grouping[1]) if grouping is not None else ([], 0)
        ch = None  # this partition's chunk of the current group
        for b in kept:
            k = b.header.records_count
            if k > 0:
                if n >= GROUP_RECORDS:
                    group, n = [], 0
                    ch = None
                if ch is None:
                    ch = _Chunk([], pos, group)
                    group.append(weakref.ref(ch))
                    chunks.append(ch)
                ch.batches.append(b)  # type: ignore[union-attr]
                n += k
        if grouping is not None:  # unreachable from other threads until the whole answer is built
            grouping[0], grouping[1] = group, n
            grouping[2].append((st, chunks, next_pos))
        else:
            self._publish([(st, chunks, next_pos)])
        return bool(chunks)
