"""The asyncio producer: batching, partitioning, compression, idempotence, retries.

Public: :class:`Producer` (``from oncelog.client.aio import Producer``) and
:class:`RecordMetadata`. The blocking :class:`oncelog.client.Producer` runs
the same :class:`ProducerCore` on a background loop thread.

Internal design (for the transactions work that builds on it):

* ``ProducerCore.append(topic, value, key, partition, headers, timestamp,
  future)`` runs on the loop. It partitions (murmur2 / sticky, see
  :mod:`oncelog.client.partitioner`) and appends the encoded record to the
  partition's open :class:`~oncelog.client.batch.BatchBuilder`. Records for
  a topic without metadata wait in ``_waiting`` (one FIFO per topic) until
  :meth:`Cluster.wait_topic` answers (or ``max.block.ms`` passes); a
  ``produce_batch`` call for that topic meanwhile waits in the same FIFO (a
  ``_WaitingBatch``), and one pass places them all in call order, so a
  partition's log follows the order of produce() and produce_batch() calls.
* One sender task (:meth:`ProducerCore._run`) closes batches that are full,
  older than ``linger.ms`` or flushed, and sends, per leader, one Produce
  request holding at most one batch per partition, with at most
  ``max.in.flight.requests.per.connection`` unanswered requests per broker.
  A full batch wakes it at once; each wake-up repeats the pass while it sends
  something, so a backlog goes out as up to that many pipelined requests.
  Requests go to the connection as parts (batch header and body apart);
  it joins only the small ones, and large bodies reach the socket uncopied
  (:func:`oncelog.client.aio.connection._write_parts`).
* ``produce_batch`` (:func:`produce_batch_into`) encodes a partition's values
  in bulk (:func:`~oncelog.client.batch.encode_sections`: every batch of the
  call in one pass) and puts one
  ``_Span`` per batch in ``_Batch.futures`` instead of a future per record:
  the batch completes them at once, and :class:`BatchFutures` makes a
  record's future when it is asked for. Keyed records without a partition
  are hashed all at once (:func:`~oncelog.client.partitioner.key_groups`)
  and each partition's records go the same way: their spans hold the
  records' indices in the call instead of a first index.
* Per partition (:class:`_Partition`): ``ready`` (closed, no sequence yet),
  ``unacked`` (sequenced, sent at least once, not acknowledged; in sequence
  order), ``acked_seq`` (the sequence after the last acknowledged batch),
  ``acked_max`` (the end of the furthest acknowledged batch, also one answered
  while an earlier answer is missing) and ``acked_ahead`` (the sequences of
  such batches, which a re-sequencing steps over).
  Sequences are given when a batch is first sent. When a batch fails, the
  partition is *blocked*: nothing more is sent for it until every request
  in flight for it has been answered. Then the unacked batches are
  re-sequenced from ``acked_seq`` (a batch the broker definitely refused,
  e.g. MESSAGE_TOO_LARGE, has left the list, so the later ones close the
  gap) and resent in order. A batch whose fate is unknown (network error,
  timeout) keeps its sequence, so a resend is recognised by the broker as a
  duplicate. That is franz-go's per-partition sequence buffer idea.
  A batch of several records refused MESSAGE_TOO_LARGE is split instead
  (:meth:`ProducerCore._split`, Java's splitAndReenqueue): its parts take its
  place in ``unacked`` and its sequences (Java's assignProducerStateToBatches).
  Until a batch of the producer id is acknowledged on a partition, the
  partition has one request in flight (``_Partition.known``; reset when the
  broker shows it lost the producer's state, see ``_drop_overtaken_parts``).
  OUT_OF_ORDER_SEQUENCE_NUMBER for a head batch that is not the next sequence
  (the batches before it dropped unwritten) re-sequences it without a bump.
* Epoch bump (KIP-360, as Java's idempotent producer): OUT_OF_ORDER_SEQUENCE_NUMBER
  or UNKNOWN_PRODUCER_ID on the first unacked batch (the batch is kept and
  retried; UNKNOWN_PRODUCER_ID with log start offset -1 is retried without a
  bump) marks the partition ``needs_bump``. Giving up on a sent batch whose
  fate is unknown (``retries`` or ``delivery.timeout.ms`` exhausted) marks its
  sequence *unresolved* instead (``_Partition.unresolved``, Java's
  markSequenceUnresolved): the partition's other sent batches are resent under
  the old epoch with their own sequences (no renumbering) and nothing new is
  sequenced; once none is left (acknowledged or failed), the partition goes on
  if the last acknowledged sequence reaches the last one handed out (a later
  batch was written, so the given-up one was too), else it is marked
  ``needs_bump`` (Java's maybeResolveSequences). The bump waits until no other
  partition has a batch in doubt (those are resent under the old epoch first,
  so nothing is written twice), then the epoch goes to epoch + 1 client-side
  (same id, no request; InitProducerId(-1, -1) for a fresh id only at epoch
  32767) and every partition's sequences restart at 0.
* Helper tasks (metadata waits and refreshes, connects, the id request) are
  kept in ``_helpers``; ``close()`` cancels and awaits them.
* Conditional produce (``expected_offset``, docs/conditional-publish.md):
  ``_Batch.expected`` >= 0. Such a batch holds only records with contiguous
  expected offsets, is sent only in requests of conditional batches (tag
  10000, the answer decoded with its unknown tags for the actual next
  offset), one request per partition at a time, and only over a connection
  whose ApiVersions advertised the feature (else
  ``ConditionalProduceNotSupported``). A refusal (10001/10002) fails it and
  the queued batches continuing it, and re-sequences the partition's rest.
* ``delivery.timeout.ms``: a batch whose first record is older fails with
  :class:`~oncelog.client.errors.DeliveryTimeoutError`. One in flight fails
  then too (``_Batch.expired``, Java's getExpiredInflightBatches) but stays
  in ``unacked`` until its request is answered: a success acknowledges its
  sequences, a failure gives it up (sequence unresolved); it is not resent.
* Transactions (``transactional.id``): ``self.txn`` is a
  :class:`~oncelog.client.aio.transactions.TransactionManager`. No producer
  id is fetched at start (``init_transactions()`` does it). The sender asks
  ``txn.needs_add(tp)`` before a partition's batch goes out (transactions
  v1: AddPartitionsToTxn first, batched per sender pass), fails every batch
  not in flight with ``txn.sweep_error()`` while the transaction aborts or
  has failed, and tells ``txn.batch_failed()`` about every failed batch
  instead of bumping the epoch itself: in a transaction an
  OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH
  or a batch given up makes the transaction abortable (or fatal), and the
  epoch changes only between transactions (:meth:`ProducerCore.set_producer`
  restarts every partition's sequences). Produce is capped at v11 under
  transactions v1 (v12 means implicit adds, KIP-890).
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from oncelog.client.aio.cluster import REFRESH_ERRORS, Cluster, TopicInfo
from oncelog.client.arrow import arrow_bounds, arrow_sections, as_binary, is_arrow
from oncelog.client.aio.transactions import PreparedTxnState, TransactionManager
from oncelog.client.batch import CODECS, RECORD_OVERHEAD_MAX, BatchBuilder, batch_bounds, encode_sections, split_builder
from oncelog.client.config import ClientConfig, parse_config
from oncelog.client.config import ConfigError
from oncelog.client.errors import (
    ClientClosedError,
    ConditionalProduceNotSupported,
    OffsetMismatch,
    DeliveryTimeoutError,
    IllegalStateError,
    KafkaError,
    MessageTooLargeError,
    UnknownTopicOrPartitionError,
    error_class,
    error_for,
)
from oncelog.client.partitioner import StickyPartitioner, key_groups, partition_for_key
from oncelog.protocol.build import to_ms
from oncelog.protocol.codec import decode_response, unknown_tags_of
from oncelog.protocol.conditional import NEXT_OFFSET_TAG, parse_offset_tag, partition_tag_block
from oncelog.protocol.fast_produce import array_len, string, uvarint
from oncelog.protocol.records import HEADER_SIZE

__all__ = ["BatchFutures", "Producer", "ProducerCore", "RecordMetadata"]

PRODUCE, INIT_PRODUCER_ID = 0, 22
PRODUCE_VERSIONS = (3, 12)  # v13 addresses topics by id
PRODUCE_VERSIONS_TV1 = (3, 11)  # v12 is transactions v2 (implicit adds)
INIT_PRODUCER_ID_VERSIONS = (0, 6)
OUT_OF_ORDER_SEQUENCE_NUMBER, DUPLICATE_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID = 45, 46, 59
_EPOCH_MAX = 32767  # Short.MAX_VALUE: an idempotent producer at this epoch takes a fresh id to bump
INVALID_PRODUCER_EPOCH = 47
MESSAGE_TOO_LARGE = 10  # a batch of several records refused so is split (_split); RECORD_LIST_TOO_LARGE is not (as Java)
OFFSET_MISMATCH, CONDITIONAL_PRODUCE_REFUSED = 10_001, 10_002  # conditional produce (KIP-27)
_SEQ_MOD = 0x80000000
# uncompressed batch size from which the sender compresses a batch in a worker thread, per codec: where
# the paired measurement showed the hop (about 0.1 ms) small next to the loop time it frees; lz4 and
# snappy (2 ms per MiB) did not pay (docs/benchmarks.md "Compression on the loop or in a thread")
_OFFLOAD_MIN = {CODECS["gzip"]: 256 * 1024, CODECS["zstd"]: 256 * 1024}


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record was written: ``topic``, ``partition``, ``offset``, ``timestamp`` (ms).

    ``offset`` is -1 when the broker acknowledged a retry as a duplicate
    without naming the offset (DUPLICATE_SEQUENCE_NUMBER), as in Java.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int


# -- the Produce request (hand-encoded: kio's Python writer costs ~100 us a request) ------

_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")


def encode_produce_request(version: int, transactional_id: str | None, acks: int, timeout_ms: int,
                           topics: dict[str, list[tuple[int, Any]]],
                           expected: dict[tuple[str, int], int] | None = None) -> list[Any]:
    """A Produce v3-v12 request body as a list of parts (records are not copied).

    A partition's records are ``bytes`` or a tuple of parts (batch header, body).

    ``expected``: ``{(topic, partition): expected offset}`` for conditional
    partitions (v9+ only; tag 10000, docs/conditional-publish.md)."""
    flex = version >= 9
    out = [string(transactional_id, flex), _I16.pack(acks) + _I32.pack(timeout_ms), array_len(len(topics), flex)]
    for name, parts in topics.items():
        out.append(string(name, flex))
        out.append(array_len(len(parts), flex))
        for index, records in parts:
            out.append(_I32.pack(index))
            if type(records) is tuple:
                size = sum(map(len, records))
                out.append(uvarint(size + 1) if flex else _I32.pack(size))
                out.extend(records)
            else:
                out.append(uvarint(len(records) + 1) if flex else _I32.pack(len(records)))
                out.append(records)
            if flex:
                k = expected.get((name, index), -1) if expected else -1
                out.append(partition_tag_block(k) if k >= 0 else b"\x00")
        if flex:
            out.append(b"\x00")
    if flex:
        out.append(b"\x00")
    return out


# -- bookkeeping --------------------------------------------------------------------


class _Batch:
    __slots__ = ("topic", "partition", "builder", "futures", "timestamps", "seq", "attempts", "in_flight",
                 "created", "last_error", "in_doubt", "nbytes", "expected", "spans", "group", "compressing",
                 "expired", "part")

    def __init__(self, topic: str, partition: int, builder: BatchBuilder) -> None:
        self.topic = topic
        self.partition = partition
        self.builder = builder
        # one per record, or a _Span for many records of produce_batch, or the blocking facade's one
        # completion (``group``) for all the records of a batch filled by its produce()
        self.futures: list[Any] = []
        self.timestamps: list[int] = []  # one per record (``group``) or per entry of ``futures``
        self.spans = False  # ``futures`` holds a _Span
        self.seq = -1
        self.attempts = 0
        self.in_flight = False
        self.created = builder.created
        self.last_error: KafkaError | None = None
        self.in_doubt = False  # sent and not answered (its fate on the broker is unknown)
        self.nbytes = 0
        self.expected = -1  # conditional produce: the offset its first record must get (-1: none)
        self.group: Any = None  # the blocking facade's completion shared by the batch's records' futures
        self.compressing: Any = None  # the worker thread's future compressing a large batch (see _OFFLOAD_MIN)
        # failed by delivery.timeout.ms while in flight (Java's getExpiredInflightBatches): its records are
        # completed; its answer still counts for the sequences, and it is never resent
        self.expired = False
        # a part of a batch refused as MESSAGE_TOO_LARGE (ProducerCore._split), not sent yet: ``last_error`` is
        # that refusal, which it fails with if a later batch of the partition was written meanwhile
        self.part = False

    @property
    def count(self) -> int:
        return self.builder.count


class _Partition:
    __slots__ = ("topic", "partition", "open", "ready", "unacked", "inflight", "acked_seq", "next_seq", "blocked",
                 "acked_max", "acked_ahead", "retry_at", "needs_bump", "unresolved", "node", "known")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.open: _Batch | None = None
        self.ready: deque[_Batch] = deque()
        self.unacked: deque[_Batch] = deque()
        self.inflight = 0
        self.acked_seq = 0
        # the end of the furthest acknowledged batch, head or not (Java's maybeUpdateLastAckedSequence keeps
        # the maximum): a later batch acknowledged while an earlier one is unanswered shows that one written
        self.acked_max = 0
        # (start, end) of each batch acknowledged while an earlier one is still unacknowledged: it has left
        # ``unacked``, but its sequences stay taken, so a re-sequencing steps over them (without this a later
        # batch took them and the broker answered it as a duplicate of the acknowledged one: never written)
        self.acked_ahead: dict[int, int] = {}
        self.next_seq = 0
        self.blocked = False
        self.retry_at = 0.0
        self.needs_bump = False
        # the sequence after the last batch given up while its fate was unknown (Java's
        # partitionsWithUnresolvedSequences), -1: none. While set, the partition's other sent batches keep their
        # sequences and are resent under the old epoch; nothing new is sent; once none is left, the gap is
        # resolved (every sequence acknowledged) or the epoch is bumped (see ProducerCore._resolve)
        self.unresolved = -1
        self.node = -1  # the broker its in-flight batches went to
        # the producer id the partition's leader acknowledged a batch of (-1: none yet). Until then the
        # broker has no state for the id there and accepts a batch at any sequence (Kafka's rule for a new
        # producer), so a batch sent behind a refused first one would be written ahead of it: one at a time
        self.known = -1

    def has_data(self) -> bool:
        return bool(self.open or self.ready or self.unacked)


def _set_result(fut: Any, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_error(fut: Any, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


class BatchResult:
    """Where a successful batch's records went: record ``i``'s :class:`RecordMetadata` is made from it
    only when asked for (:meth:`metadata`); see ``ProducerCore.complete_many``."""

    __slots__ = ("topic", "partition", "base_offset", "log_append_time", "timestamps")

    def __init__(self, topic: str, partition: int, base_offset: int, log_append_time: int,
                 timestamps: list[int]) -> None:
        self.topic = topic
        self.partition = partition
        self.base_offset = base_offset  # -1: unknown (acknowledged as a duplicate)
        self.log_append_time = log_append_time  # -1: CreateTime, the records' own timestamps
        self.timestamps = timestamps

    def metadata(self, i: int) -> RecordMetadata:
        return RecordMetadata(self.topic, self.partition, self.base_offset + i if self.base_offset >= 0 else -1,
                              self.log_append_time if self.log_append_time >= 0 else self.timestamps[i])


def split_leaf(node: Any, pos: int) -> tuple[Any, int]:
    """The completion of record ``pos`` of a completion split with its batch (``parts``: (first position,
    part) pairs, None unless split; :class:`_Span` and the blocking facade's ``_Done``), and the record's
    position there: the node itself unless split."""
    while node.parts is not None:
        parts = node.parts
        k = bisect_right(parts, pos, key=lambda part: part[0]) - 1
        first, node = parts[k]
        pos -= first
    return node, pos


class _Span:
    """``count`` consecutive records of one ``produce_batch`` call inside one batch: one completion for
    all of them (the per-record futures are made only when asked for, by :class:`BatchFutures`)."""

    __slots__ = ("start", "count", "topic", "partition", "offset", "timestamp", "error", "done", "waiters", "lock",
                 "parts", "left", "parent")

    def __init__(self, start: int, count: int, lock: Any) -> None:
        self.start = start
        self.count = count
        self.topic = ""
        self.partition = -1
        self.offset = -1  # of record ``start`` (-1: unknown, a duplicate)
        self.timestamp = -1
        self.error: BaseException | None = None
        self.done = False
        self.waiters: dict[int, Any] | None = None  # position in the span -> future handed out before completion
        self.lock = lock  # the blocking facade's (futures are asked for from other threads), else None
        # split (the broker refused its batch as MESSAGE_TOO_LARGE, see :meth:`split`): (first position, span)
        # of each part, the parts not done yet, and a part's span it belongs to
        self.parts: list[tuple[int, _Span]] | None = None
        self.left = 0
        self.parent: _Span | None = None

    def metadata(self, pos: int) -> RecordMetadata:
        """The metadata of the span's record ``pos`` (0..count-1)."""
        return RecordMetadata(self.topic, self.partition, self.offset + pos if self.offset >= 0 else -1,
                              self.timestamp)

    def split(self, counts: list[int]) -> list[_Span]:
        """Parts of ``counts`` consecutive records each (their sum is ``count``), each completed by the batch
        it went to; this span is done once they all are, and a record's metadata or error is its part's
        (:meth:`leaf`). The futures already handed out go to their parts."""
        lock = self.lock
        if lock is not None:
            lock.acquire()
        try:
            parts, pos = [], 0
            for c in counts:
                sp = _Span(self.start + pos, c, lock)
                sp.parent = self
                parts.append((pos, sp))
                pos += c
            self.parts, self.left = parts, len(parts)
            waiters, self.waiters = self.waiters, None
            for i, fut in (waiters or {}).items():
                sp, j = self.leaf(i)
                if sp.waiters is None:
                    sp.waiters = {}
                sp.waiters[j] = fut
        finally:
            if lock is not None:
                lock.release()
        return [sp for _, sp in parts]

    def leaf(self, pos: int) -> tuple[_Span, int]:
        """The span completing the record at ``pos`` and its position there (itself unless split)."""
        return split_leaf(self, pos)

    def finish(self, topic: str, partition: int, offset: int, timestamp: int, error: BaseException | None) -> None:
        lock = self.lock
        if lock is not None:
            lock.acquire()
        try:
            if self.done:
                return
            self.topic, self.partition, self.offset, self.timestamp = topic, partition, offset, timestamp
            self.error = error
            self.done = True
            waiters, self.waiters = self.waiters, None
            up = self.parent
            while up is not None:  # the split span is done with its last part (its error: the first part's)
                up.left -= 1
                if up.left:
                    break
                up.error = next((sp.error for _, sp in up.parts or () if sp.error is not None), None)
                up.done = True
                up = up.parent
        finally:
            if lock is not None:
                lock.release()
        if waiters:
            for i, fut in waiters.items():
                if error is not None:
                    _set_error(fut, error)
                else:
                    _set_result(fut, self.metadata(i))


class BatchFutures(Sequence[Any]):
    """What ``produce_batch`` returns: the records' futures, in order, made on first access.

    A sequence (``len``, indexing, slicing, iteration) of futures of
    :class:`RecordMetadata` (blocking: :class:`~oncelog.client.producer.DeliveryFuture`;
    asyncio: ``asyncio.Future``). The producer completes the records of one
    batch at once, so a caller that never looks at a record's future costs
    nothing per record. :meth:`done` and :meth:`exception` answer for the
    whole call without making the futures.
    """

    def __init__(self, n: int, make: Callable[[], Any], lock: Any = None) -> None:
        self._n = n
        self._make = make
        self._lock = lock
        self._spans: list[_Span] = []  # in record order, covering 0..n-1 once placed (spread: placing order)
        self._made: dict[int, Any] = {}
        # keyed records spread over partitions (spread()): each span's record indices (ascending), and,
        # once a record's future is asked for, (span number, position in it) of every record (two int32
        # arrays, or lists without numpy), built by _record_map outside ``lock``; with ``lock`` (several
        # threads) a second asker waits for the first one's map on ``_map_lock``, which completions never take
        self._records: list[Any] | None = None
        self._where: tuple[Any, Any] | None = None
        self._map_lock = threading.Lock() if lock is not None else None

    def spread(self, indices: Any) -> "_SpreadFutures":
        """The futures of the records ``indices`` (ascending) of this call, for ``append_many`` of one
        partition: its spans hold those records (keyed records spread over partitions)."""
        if self._records is None:
            self._records = []
        return _SpreadFutures(self, indices)

    def _span(self, start: int, count: int, records: Any = None) -> _Span:
        sp = _Span(start, count, self._lock)
        self._spans.append(sp)
        if records is not None:
            self._records.append(records)  # type: ignore[union-attr]
        return sp

    def _locate(self, i: int) -> tuple[_Span, int]:
        """The span holding record ``i`` and ``i``'s position in it."""
        spans = self._spans
        if self._records is None:
            lo, hi = 0, len(spans)
            while lo < hi:  # the span holding record i
                mid = (lo + hi) // 2
                if spans[mid].start + spans[mid].count <= i:
                    lo = mid + 1
                else:
                    hi = mid
            return spans[lo], i - spans[lo].start
        span_of, pos = self._where if self._where is not None else self._record_map()
        return spans[int(span_of[i])], int(pos[i])

    def _record_map(self) -> tuple[Any, Any]:
        """(span number, position in it) of every record of a spread call, built when the first record's
        future is asked for (every span is placed by then) and published with one assignment. Called before
        ``_lock`` is taken: the loop thread's completions (``_Span.finish``) take that lock, and building
        the map of a million records takes milliseconds (docs/benchmarks.md "Keyed batches")."""
        map_lock = self._map_lock
        if map_lock is not None:
            map_lock.acquire()
        try:
            where = self._where
            if where is not None:  # built meanwhile by another thread
                return where
            records, n = self._records, self._n
            assert records is not None
            if records and not isinstance(records[0], list):  # index arrays: key_groups hashed with numpy
                import numpy as np

                counts = np.fromiter(map(len, records), np.int64, len(records))
                placed = np.concatenate(records)  # every record once, span after span
                span_of = np.empty(n, np.int32)
                span_of[placed] = np.repeat(np.arange(len(records), dtype=np.int32), counts)
                pos = np.empty(n, np.int32)  # a record's place in the concatenation minus its span's first
                pos[placed] = np.arange(n, dtype=np.int32) - np.repeat((np.cumsum(counts) - counts).astype(np.int32),
                                                                       counts)
                where = (span_of, pos)
            else:  # lists (a small call, or no numpy)
                span_list, pos_list = [0] * n, [0] * n
                for s, recs in enumerate(records):
                    for p, r in enumerate(recs):
                        span_list[r] = s
                        pos_list[r] = p
                where = (span_list, pos_list)
            self._where = where
            return where
        finally:
            if map_lock is not None:
                map_lock.release()

    def __len__(self) -> int:
        return self._n

    def _future(self, i: int) -> Any:
        fut = self._made.get(i)
        if fut is not None:
            return fut
        if self._records is not None and self._where is None:
            self._record_map()  # not under the lock: completions would wait for the map
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            sp, pos = self._locate(i)
            if sp.parts is not None:
                sp, pos = sp.leaf(pos)  # its batch was split: the part holding the record
            fut = self._made.get(i)
            if fut is not None:  # made meanwhile by another thread
                return fut
            fut = self._made[i] = self._make()
            if not sp.done:
                if sp.waiters is None:
                    sp.waiters = {}
                sp.waiters[pos] = fut
                return fut
        finally:
            if lock is not None:
                lock.release()
        if sp.error is not None:
            _set_error(fut, sp.error)
        else:
            _set_result(fut, sp.metadata(pos))
        return fut

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._future(j) for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("record index out of range")
        return self._future(i)

    def __iter__(self) -> Any:
        return (self._future(i) for i in range(self._n))

    def done(self) -> bool:
        """True when every record of the call is delivered or failed (say, after ``flush()``)."""
        return all(sp.done for sp in self._spans)

    def exception(self) -> BaseException | None:
        """The first record error of the call, or None when every record was delivered; does not wait
        (raises TimeoutError while records are outstanding: ``flush()`` first)."""
        if not self.done():
            raise TimeoutError("records not delivered yet")
        if self._records is not None:  # spread: the failed span holding the lowest record
            failed = [(int(self._records[s][0]), sp.error) for s, sp in enumerate(self._spans) if sp.error is not None]
            return min(failed, key=lambda f: f[0])[1] if failed else None
        return next((sp.error for sp in self._spans if sp.error is not None), None)


class _SpreadFutures:
    """:meth:`BatchFutures.spread`: what ``append_many`` gets for one partition's records of a keyed call."""

    __slots__ = ("futs", "indices")

    def __init__(self, futs: BatchFutures, indices: Any) -> None:
        self.futs = futs
        self.indices = indices

    def _span(self, start: int, count: int) -> _Span:
        recs = self.indices[start:start + count]
        return self.futs._span(int(recs[0]), count, recs)


class ProducerCore:
    """The loop-side producer engine (see the module docstring). Not thread-safe: call on its loop."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.cluster = Cluster(config, allow_auto_create=True)
        self.codec = CODECS[config["compression.type"]]
        # batches at least this large (uncompressed) are compressed off the loop (docs/benchmarks.md
        # "Compression on the loop or in a thread"); none for no compression
        self.offload_min = _OFFLOAD_MIN.get(self.codec, 1 << 62)
        self.acks = config["acks"]
        self.idempotent = bool(config["enable.idempotence"])
        self.transactional_id: str | None = config["transactional.id"]
        self.linger = config["linger.ms"] / 1000
        self.batch_size = config["batch.size"]
        self.max_request = config["max.request.size"]
        self.max_in_flight = config["max.in.flight.requests.per.connection"]
        self.delivery_timeout = config["delivery.timeout.ms"] / 1000
        self.request_timeout_ms = config["request.timeout.ms"]
        self.retries = config["retries"]
        self.backoff = config["retry.backoff.ms"] / 1000
        self.max_block = config["max.block.ms"] / 1000
        self.metadata_max_age = config["metadata.max.age.ms"] / 1000
        self.producer_id = -1
        self.producer_epoch = -1
        self.partitions: dict[tuple[str, int], _Partition] = {}
        self.sticky = StickyPartitioner()
        # per topic without metadata yet: its produce() records (tuples of _place's arguments) and
        # produce_batch() calls (_WaitingBatch), in call order, placed in that order once it arrives
        self._waiting: dict[str, list[Any]] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._node_inflight: dict[int, int] = {}
        # the batches of every Produce request whose answer has not come (by id of its list): what
        # close() fails once flushing gave up, idempotent or not (Java's forced close)
        self._requests: dict[int, list[_Batch]] = {}
        # the same requests' oldest batch creation time (inf once their expired batches are failed): the
        # sender fails a batch in flight at delivery.timeout.ms without scanning every batch of every pass
        self._request_oldest: dict[int, float] = {}
        self._no_requests: asyncio.Event | None = None  # set when _requests empties (wait_requests())
        self._connecting: set[int] = set()
        self._refreshing: set[str] = set()
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._outstanding = 0  # records produced and not yet completed
        self._idle: asyncio.Event | None = None
        self._init_task: asyncio.Task[None] | None = None
        self._helpers: set[asyncio.Task[Any]] = set()  # metadata refreshes, connects, the id reset: close() ends them
        self._bump_wanted = False
        self._fatal: KafkaError | None = None
        self.buffered_bytes = 0
        self.on_complete: Callable[[int], None] | None = None  # called with bytes released (blocking facade)
        # the blocking facade's: completes a successful batch's per-record futures from one BatchResult
        self.complete_many: Callable[[_Batch, list[Any], BatchResult], None] | None = None
        # the blocking facade's accumulator: called at the start of every sender pass with (now, flushing);
        # hands over the batches its callers' threads filled (adopt()) and returns seconds to its next linger
        self.collect: Callable[[float, bool], float] | None = None
        self.stats = {"batches_sent": 0, "requests": 0, "retries": 0, "epoch_bumps": 0, "batch_splits": 0}
        self.txn: TransactionManager | None = TransactionManager(self) if self.transactional_id else None

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        await self.cluster.start()
        if self.idempotent and self.txn is None:  # a transactional producer gets its id in init_transactions()
            await self._init_producer_id()
        self._task = asyncio.ensure_future(self._run())

    async def flush(self, timeout: float | None = None) -> int:
        """Send everything now and wait until every record is acknowledged or failed; returns the count left."""
        assert self._idle is not None
        self._flushing += 1
        self._kick()
        try:
            if timeout is None:
                await self._idle.wait()
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(self._idle.wait()), timeout)
                except asyncio.TimeoutError:
                    pass
        finally:
            self._flushing -= 1
        return self._outstanding

    async def wait_requests(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds until no Produce request of this producer is unanswered; returns
        how many still are. After flush() one can remain: a batch failed in flight at delivery.timeout.ms
        completes its records while its request is out (each request ends within request.timeout.ms)."""
        deadline = time.monotonic() + timeout
        while self._requests:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self._no_requests is None:
                self._no_requests = asyncio.Event()
            self._no_requests.clear()
            try:
                await asyncio.wait_for(self._no_requests.wait(), left)
            except asyncio.TimeoutError:
                break
        return len(self._requests)

    async def close(self, timeout: float | None = None) -> None:
        if self._closed or self._closing:
            return
        if self._task is not None and self._fatal is None:
            await self.flush(timeout)
        # ``_closing`` stops the sending side; ``_closed`` (answers no longer read) only once nothing
        # awaited here is left: an answer read while the sender and the helpers end is processed (its
        # batch completed, or put back in its queue and failed below), never dropped with its batch
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        helpers = list(self._helpers)
        for task in helpers:
            task.cancel()
        if helpers:  # awaited, so none is destroyed pending when the loop goes
            await asyncio.gather(*helpers, return_exceptions=True)
        self._closed = True
        err = ClientClosedError("producer closed before the record was delivered")
        for p in self.partitions.values():
            for b in ([p.open] if p.open else []) + list(p.ready) + list(p.unacked):
                self._fail_batch(b, err)
        # batches in requests still unanswered that no partition queue holds (a producer that is not
        # idempotent keeps none in ``unacked``): their answers are no longer read, so they fail here
        for sent in list(self._requests.values()):
            for b in sent:
                if b.futures:
                    self._fail_batch(b, err)
        self._requests.clear()
        self._request_oldest.clear()
        if self._no_requests is not None:
            self._no_requests.set()
        for recs in self._waiting.values():
            for r in recs:
                self._fail_waiting(r, err)
        self._waiting.clear()
        await self.cluster.close()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run a helper coroutine of the sender; a reference is kept until it ends, and close() cancels it."""
        task = asyncio.ensure_future(coro)
        self._helpers.add(task)
        task.add_done_callback(self._helpers.discard)
        return task

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- producing ------------------------------------------------------------------------

    def check_open_only(self) -> None:
        if self._closed or self._closing:
            raise ClientClosedError("producer is closed")

    def check_open(self) -> None:
        if self._closed or self._closing:
            raise ClientClosedError("producer is closed")
        if self._fatal is not None:
            raise self._fatal
        if self.txn is not None:
            self.txn.check_send()

    def set_producer(self, producer_id: int, epoch: int) -> None:
        """Adopt a new producer id/epoch (transactions); every partition's sequences restart at 0."""
        if (producer_id, epoch) == (self.producer_id, self.producer_epoch):
            return
        self.producer_id, self.producer_epoch = producer_id, epoch
        for p in self.partitions.values():
            if any(b.expired for b in p.unacked):
                # failed in flight at delivery.timeout.ms: completed and never resent, so it takes no
                # sequence under the new epoch (its late answer finds it gone and changes nothing)
                p.unacked = deque(b for b in p.unacked if not b.expired)
            p.acked_seq = p.acked_max = 0
            p.acked_ahead.clear()
            p.needs_bump = False
            p.unresolved = -1
            self._resequence(p)

    def check_conditional(self, partition: int | None, expected_offset: int) -> None:
        """Raise at the call when ``expected_offset`` cannot be honoured by this producer's configuration."""
        if expected_offset < 0:
            raise ValueError(f"expected_offset {expected_offset} must be >= 0")
        if partition is None or partition < 0:
            raise ValueError("expected_offset needs an explicit partition")
        if not self.idempotent:
            raise ConfigError("expected_offset needs enable.idempotence=true")
        if self.acks == 0:
            raise ConfigError("expected_offset needs acks=all (or 1), not acks=0")

    def append(self, topic: str, value: bytes | None, key: bytes | None, partition: int | None,
               headers: Any, timestamp: int, future: Any, expected: int = -1) -> None:
        """Add one record (see module docstring); ``future`` gets its RecordMetadata or error."""
        if not self._outstanding:
            self._idle.clear()  # type: ignore[union-attr]  # set only while nothing is outstanding
        self._outstanding += 1
        self.buffered_bytes += (len(value) if value else 0) + (len(key) if key else 0)
        self._place(topic, value, key, partition, headers, timestamp, future, expected)

    def _place(self, topic: str, value: bytes | None, key: bytes | None, partition: int | None,
               headers: Any, timestamp: int, future: Any, expected: int = -1) -> None:
        info = self.cluster.topics.get(topic)
        if info is None or not info.leaders or topic in self._waiting:
            self._wait_for_topic(topic, (topic, value, key, partition, headers, timestamp, future, expected))
            return
        n = len(info.leaders)
        if partition is None or partition < 0:
            partition = self.sticky.partition(topic, n) if key is None else partition_for_key(key, n)
        elif partition >= n:
            self._fail_record(future, value, key,
                              UnknownTopicOrPartitionError(f"partition {partition} of {topic} does not exist "
                                                           f"(it has {n})"))
            return
        nbytes = (len(value) if value else 0) + (len(key) if key else 0)
        if nbytes + HEADER_SIZE + RECORD_OVERHEAD_MAX > self.max_request:
            self._fail_record(future, value, key, MessageTooLargeError(
                f"the record is {nbytes + HEADER_SIZE + RECORD_OVERHEAD_MAX} bytes, more than "
                f"max.request.size={self.max_request}"))
            return
        p = self.partitions.get((topic, partition))
        if p is None:
            p = self.partitions[(topic, partition)] = _Partition(topic, partition)
        b = p.open
        if b is not None and (b.expected >= 0 or expected >= 0) and \
                (b.expected < 0 or expected < 0 or b.expected + b.count != expected):
            self._close_open(p)  # conditional records share a batch only with their contiguous successors
            b = None
        if b is None or not b.builder.append(timestamp, key, value, headers):
            if b is not None:
                self._close_open(p)
            b = p.open = _Batch(topic, partition, BatchBuilder(self.batch_size, self.codec))
            b.expected = expected
            b.builder.append(timestamp, key, value, headers)
            self._kick()  # the sender learns the new batch's linger deadline
        b.nbytes += nbytes
        b.futures.append(future)
        b.timestamps.append(timestamp)
        if b.builder.size >= self.batch_size:
            self._close_open(p)
            self._kick()

    def append_many(self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                    partition: int, timestamp: int, futures: "list[Any] | BatchFutures | _SpreadFutures",
                    expected: int = -1) -> None:
        """Add many records with no headers to one known partition, encoded in bulk.

        ``futures``: one per record, or a :class:`BatchFutures` whose records
        0..n-1 these are, or its :meth:`~BatchFutures.spread` of the records these are (then each batch
        completes them with one :class:`_Span`).

        ``expected`` >= 0: they must get offsets ``expected, expected+1, ...``
        (conditional batches; all placed now, so a sender pass cannot split them
        other than at ``batch.size``)."""
        info = self.cluster.topic(topic)
        assert info is not None
        p = self.partitions.get((topic, partition))
        if p is None:
            p = self.partitions[(topic, partition)] = _Partition(topic, partition)
        if not self._outstanding:
            self._idle.clear()  # type: ignore[union-attr]
        self._outstanding += len(values)
        # records per batch: at most batch.size bytes (one record alone may be larger), by an upper bound
        # of each record's size
        room = self.batch_size - HEADER_SIZE
        if is_arrow(values):  # pyarrow binary arrays (oncelog.client.arrow): the same bounds and bytes
            bounds = arrow_bounds(values, keys, room)
            sections: Sequence[Any] = arrow_sections(values, keys, bounds)
        else:
            bounds = batch_bounds(values, keys, room)
            # every batch's records section at once (the bulk encoding's fixed cost once per call)
            sections = encode_sections(values, keys, bounds)
        spans = isinstance(futures, (BatchFutures, _SpreadFutures))
        for (i, j), section in zip(bounds, sections):
            if p.open is not None:
                self._close_open(p)
            b = p.open = _Batch(topic, partition, BatchBuilder(self.batch_size, self.codec))
            b.expected = expected + i if expected >= 0 else -1
            b.builder.append_encoded(section, j - i, timestamp)
            b.nbytes = len(section)
            self.buffered_bytes += b.nbytes
            if spans:
                b.futures.append(futures._span(i, j - i))  # type: ignore[union-attr]
                b.timestamps.append(timestamp)
                b.spans = True
            else:
                b.futures.extend(futures[i:j])
                b.timestamps.extend([timestamp] * (j - i))
        self._close_open(p)
        self._kick()

    def answer_pending(self, topic: str, partition: int) -> bool:
        """(Callable from any thread; it only reads.) True when a sender pass is sure to run before the
        partition's next batch could be sent anyway: the partition has a request in flight and its broker
        has ``max.in.flight`` unanswered, so the next answer (or failure) of that broker, which kicks the
        sender, comes first. The blocking facade then skips waking the loop thread for a batch that fills
        or opens: that wake-up would find nothing it may send."""
        p = self.partitions.get((topic, partition))
        return p is not None and p.inflight > 0 and self._node_inflight.get(p.node, 0) >= self.max_in_flight

    def adopt(self, b: _Batch) -> None:
        """Take a closed batch filled outside the loop (the blocking facade's callers), behind the
        partition's records placed before it; it is sent like any other ready batch."""
        key = (b.topic, b.partition)
        p = self.partitions.get(key)
        if p is None:
            p = self.partitions[key] = _Partition(b.topic, b.partition)
        if p.open is not None:
            self._close_open(p)
        if not self._outstanding:
            self._idle.clear()  # type: ignore[union-attr]
        self._outstanding += b.builder.count
        self.buffered_bytes += b.nbytes
        p.ready.append(b)

    def hold_waiting(self) -> None:
        """A produce_batch() call starts waiting for its topic's metadata: one outstanding until it ends."""
        if not self._outstanding:
            self._idle.clear()  # type: ignore[union-attr]
        self._outstanding += 1

    def release_waiting(self) -> None:
        """A waiting produce_batch() call was placed (its records now count), failed or was cancelled."""
        self._outstanding -= 1
        if self._outstanding == 0 and self._idle is not None:
            self._idle.set()

    def wait_in_line(self, topic: str, call: "_WaitingBatch") -> None:
        """Queue a produce_batch() call behind everything already waiting for ``topic``'s metadata
        (the caller checked that the topic has none, or that records wait for it): it is placed in call
        order once the metadata arrives, or fails with the same error as the records ahead of it."""
        self._wait_for_topic(topic, call)

    def _wait_for_topic(self, topic: str, record: Any) -> None:
        waiting = self._waiting.get(topic)
        if waiting is not None:
            waiting.append(record)
            return
        self._waiting[topic] = [record]
        self._spawn(self._fetch_topic(topic))

    async def _fetch_topic(self, topic: str) -> None:
        info: TopicInfo | None = None
        try:
            info = await self.cluster.wait_topic(topic, self.max_block)
            error: KafkaError | None = None
        except KafkaError as exc:
            error = exc
        except Exception as exc:  # pragma: no cover - defensive
            error = KafkaError(str(exc))
        records = self._waiting.pop(topic, [])
        # in call order: produce() and produce_batch() queue behind them while the topic is waited for,
        # and all are placed here, synchronously, so a later call cannot come between them
        for r in records:
            if error is not None:
                self._fail_waiting(r, error)
            elif type(r) is _WaitingBatch:
                r.run(info)
            else:
                self._place(*r)
        self._kick()

    def _fail_waiting(self, r: Any, exc: KafkaError) -> None:
        """Fail a record or a produce_batch() call that waits for its topic's metadata."""
        if type(r) is _WaitingBatch:
            if not r.done.done():
                r.done.set_exception(exc)  # produce_batch() raises it, as when its own wait failed
        else:
            self._fail_record(r[6], r[1], r[2], exc)

    def _close_open(self, p: _Partition) -> None:
        b = p.open
        if b is None:
            return
        p.open = None
        p.ready.append(b)
        if b.builder.count:
            info = self.cluster.topic(p.topic)
            self.sticky.next(p.topic, info.partitions if info else 1, p.partition)

    # -- completion -----------------------------------------------------------------

    def _fail_record(self, fut: Any, value: Any, key: Any, exc: KafkaError) -> None:
        if self.txn is not None and not isinstance(exc, ClientClosedError):
            self.txn.batch_failed(exc, False)  # a record of the transaction is lost: abortable (Java's doSend)
        _set_error(fut, exc)
        self._complete_n(1, (len(value) if value else 0) + (len(key) if key else 0))

    def _fail_batch(self, b: _Batch, exc: KafkaError) -> None:
        if self.txn is not None and b.futures:
            self.txn.batch_failed(exc, b.seq >= 0)
        if not b.futures:
            return  # completed already (its bytes released then): never subtracted twice
        per = b.nbytes
        futs, b.futures = b.futures, []
        if b.spans:
            for fut in futs:
                if type(fut) is _Span:
                    fut.finish(b.topic, b.partition, -1, -1, exc)
                else:
                    _set_error(fut, exc)
        else:
            for fut in futs:
                _set_error(fut, exc)
        self._complete_n(b.count if futs else 0, per)

    def _complete_n(self, n: int, nbytes: int) -> None:
        self._outstanding -= n
        self.buffered_bytes -= nbytes
        if self.on_complete is not None:
            self.on_complete(nbytes)
        if self._outstanding == 0 and self._idle is not None:
            self._idle.set()

    def _succeed_batch(self, b: _Batch, base_offset: int, log_append_time: int) -> None:
        if not b.futures:
            return  # failed already (expired in flight): its bytes were released then
        topic, part = b.topic, b.partition
        futs, b.futures = b.futures, []
        if self.complete_many is not None and not b.spans:
            self.complete_many(b, futs, BatchResult(topic, part, base_offset, log_append_time, b.timestamps))
        elif b.spans:
            i = 0
            for fut, ts in zip(futs, b.timestamps):
                off = base_offset + i if base_offset >= 0 else -1
                ts = log_append_time if log_append_time >= 0 else ts
                if type(fut) is _Span:
                    fut.finish(topic, part, off, ts, None)
                    i += fut.count
                else:
                    _set_result(fut, RecordMetadata(topic, part, off, ts))
                    i += 1
        elif log_append_time >= 0:
            for i, fut in enumerate(futs):
                _set_result(fut, RecordMetadata(topic, part, base_offset + i if base_offset >= 0 else -1,
                                                log_append_time))
        elif base_offset >= 0:
            for i, (fut, ts) in enumerate(zip(futs, b.timestamps)):
                _set_result(fut, RecordMetadata(topic, part, base_offset + i, ts))
        else:
            for fut, ts in zip(futs, b.timestamps):
                _set_result(fut, RecordMetadata(topic, part, -1, ts))
        self._complete_n(b.count if futs else 0, b.nbytes)

    # -- idempotence ------------------------------------------------------------------

    async def _init_producer_id(self) -> None:
        deadline = time.monotonic() + self.max_block
        backoff = self.backoff
        while True:
            try:
                conn = await self.cluster.any_connection()
                v = conn.version(INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSIONS)
                body = {"transactional_id": self.transactional_id,
                        "transaction_timeout": self.config["transaction.timeout.ms"],
                        "producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                        "enable2_pc": False, "keep_prepared_txn": False}
                resp = await conn.request(INIT_PRODUCER_ID, v, body)
                code = int(resp.error_code)
                if code == 0:
                    self.producer_id = int(resp.producer_id)
                    self.producer_epoch = int(resp.producer_epoch)
                    return
                err: KafkaError = error_for(code)
            except KafkaError as exc:
                err = exc
            if not err.retriable or time.monotonic() > deadline:
                raise err
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.config["retry.backoff.max.ms"] / 1000)

    def _maybe_bump(self) -> bool:
        """Start the epoch bump when it is safe; True while a bump is wanted or running."""
        if not self._bump_wanted or self._fatal is not None:
            return False  # a fatal producer sends nothing more (Java's FATAL_ERROR state)
        if self._init_task is not None:
            return True
        for p in self.partitions.values():
            if p.inflight:
                return True
            if not p.needs_bump and p.unacked:
                return True  # batches in doubt under the old epoch go first
        if self.producer_id >= 0 and 0 <= self.producer_epoch < _EPOCH_MAX:
            # Java's bumpIdempotentProducerEpoch: the same id, epoch + 1, no request (a broker accepts a
            # known producer id at a higher epoch from sequence 0)
            self.producer_epoch += 1
            self._bumped()
            return False
        # the epoch is exhausted (or there is no id): a fresh id, InitProducerId(-1, -1)
        self.producer_id = self.producer_epoch = -1
        self._init_task = self._spawn(self._bump())
        return True

    async def _bump(self) -> None:
        try:
            await self._init_producer_id()
        except KafkaError as exc:
            if exc.retriable:  # asked again by the next sender pass (Java re-enqueues the request)
                self._kick()
                return
            self._fatal = exc
            self._bump_wanted = False  # no further InitProducerId (the next pass would ask again)
            for p in self.partitions.values():
                for b in ([p.open] if p.open else []) + list(p.ready) + list(p.unacked):
                    self._fail_batch(b, exc)
                p.open = None
                p.ready.clear()
                p.unacked.clear()
            for recs in self._waiting.values():  # records waiting for their topic's metadata
                for r in recs:
                    self._fail_waiting(r, exc)
                recs.clear()
            return
        finally:
            self._init_task = None
        self._bumped()

    def _bumped(self) -> None:
        self.stats["epoch_bumps"] += 1
        for p in self.partitions.values():
            p.acked_seq = p.acked_max = 0
            p.acked_ahead.clear()
            p.needs_bump = False
            p.unresolved = -1
            self._resequence(p)
        self._bump_wanted = False
        self._kick()

    def _sweep(self, err: KafkaError) -> None:
        """Transactions: fail every record not in flight (the transaction is aborting or has failed)."""
        for p in self.partitions.values():
            if p.open is not None:
                self._close_open(p)
            while p.ready:
                self._fail_batch(p.ready.popleft(), err)
            keep = deque(b for b in p.unacked if b.in_flight)
            for b in p.unacked:
                if not b.in_flight:
                    self._fail_batch(b, err)
            p.unacked = keep
            if not keep:
                p.blocked = False
        for recs in self._waiting.values():
            for r in recs:
                self._fail_waiting(r, err)
            recs.clear()

    def _resequence(self, p: _Partition) -> None:
        seq = p.acked_seq
        ahead = p.acked_ahead
        for b in p.unacked:
            while seq in ahead:  # sequences of a batch acknowledged ahead of an earlier one stay taken
                seq = ahead[seq]
            b.seq = seq
            seq = (seq + b.count) % _SEQ_MOD
        while seq in ahead:
            seq = ahead[seq]
        p.next_seq = seq
        p.blocked = False

    def _mark_unresolved(self, p: _Partition, b: _Batch) -> None:
        """``b`` (sent, so it holds a sequence) is given up while it may have been written (Java's
        markSequenceUnresolved): its sequences stay spent, the partition's later sent batches keep theirs and
        are resent under the old epoch, and :meth:`_resolve` decides once none of them is left."""
        end = (b.seq + b.count) % _SEQ_MOD
        if p.unresolved < 0 or (end - p.acked_seq) % _SEQ_MOD > (p.unresolved - p.acked_seq) % _SEQ_MOD:
            p.unresolved = end
        p.blocked = True

    def _resolve(self, p: _Partition) -> None:
        """Java's maybeResolveSequences for one partition with a given-up sequence and nothing sent left
        (``unacked`` empty, nothing in flight): if every sequence it handed out is acknowledged (a later
        batch was, so the given-up one was written too), the partition goes on under this epoch;
        otherwise a gap may remain and the epoch is bumped."""
        p.unresolved = -1
        if p.acked_max != p.next_seq:
            p.needs_bump = True
            p.blocked = True
        else:
            p.acked_seq = p.next_seq  # nothing is unacknowledged: later batches are numbered from here
            p.acked_ahead.clear()

    # -- the sender -------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            try:
                # Each pass sends at most one request per leader (the first sendable batch of each of its
                # partitions, as Java's drain). While a pass sent something, run another one for the
                # batches queued behind, up to max.in.flight requests: with one pass per wake-up, a
                # backlog went out one request per answer, one request in flight whatever max.in.flight.
                for _ in range(max(1, self.max_in_flight)):
                    requests = self.stats["requests"]
                    wait = self._pass(time.monotonic())
                    if self.stats["requests"] == requests or \
                            min(self._node_inflight.values(), default=0) >= self.max_in_flight:
                        break  # nothing sent, or every broker has max.in.flight requests out: the next pass
                        # could send nothing (each answer starts one)
            except Exception as exc:  # a bug must not silently stop all delivery
                self._fatal = KafkaError(f"producer sender failed: {exc!r}")
                raise
            if not self._wake.is_set():
                timer = loop.call_later(wait, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()

    def _compressed(self, fut: Any) -> None:
        if not fut.cancelled():
            fut.exception()  # retrieved here (a batch failed meanwhile is dropped); _pass fails its batch
        self._kick()

    def _pass(self, now: float) -> float:
        """Close due batches, expire old ones, send what can go; returns seconds until the next due time."""
        next_due = 1.0
        txn = self.txn
        if txn is not None:
            err = txn.sweep_error()
            if err is not None:
                self._sweep(err)
        bumping = self.idempotent and txn is None and self._maybe_bump()
        by_node: dict[int, list[tuple[_Partition, _Batch]]] = {}
        refresh: set[str] = set()
        flushing = self._flushing > 0 or self._closing
        if self.collect is not None:
            next_due = min(next_due, self.collect(now, flushing))
        limit = now - self.delivery_timeout
        linger = self.linger
        if self._request_oldest:
            next_due = min(next_due, self._expire_in_flight(limit))
        for p in list(self.partitions.values()):
            o = p.open
            ready, unacked = p.ready, p.unacked
            if o is None and not ready and not unacked and p.unresolved < 0:
                continue
            if (ready and ready[0].created <= limit) or (unacked and unacked[0].created <= limit) or \
                    (o is not None and o.created <= limit):
                self._expire(p, now)  # (it looks at each queue's head the same way)
                o = p.open
            # transactions v1: a partition with records is added at once (AddPartitionsToTxn overlaps linger)
            adding = txn is not None and p.has_data() and txn.needs_add((p.topic, p.partition))
            if o is not None:
                due = o.created + linger
                if flushing or due <= now:
                    self._close_open(p)
                elif due - now < next_due:
                    next_due = due - now
            if p.unresolved >= 0 and not p.unacked and p.inflight == 0:
                self._resolve(p)
            if p.blocked:
                if p.inflight == 0:
                    if p.needs_bump:
                        self._bump_wanted = True
                        continue
                    if p.retry_at > now:
                        next_due = min(next_due, p.retry_at - now)
                        continue
                    if self.idempotent and any(x.part and x.attempts == 0 for x in p.unacked):
                        self._drop_overtaken_parts(p)
                    if p.unresolved >= 0:
                        p.blocked = False  # the sent batches are resent with their own sequences (no renumbering)
                    else:
                        self._resequence(p)
                else:
                    continue
            if p.needs_bump or p.inflight >= self.max_in_flight:
                continue
            if p.inflight and self.idempotent and p.known != self.producer_id:
                continue  # the first batch of a producer id on the partition goes alone (see _Partition.known)
            b = None
            for cand in p.unacked:
                if not cand.in_flight:
                    b = cand
                    break
            if b is None:
                if not p.ready or (bumping and self.idempotent) or p.unresolved >= 0:
                    continue  # (nothing new is sequenced while a given-up sequence is unresolved)
                b = p.ready[0]
                if b.builder.body is None and b.builder.size >= self.offload_min:
                    # a large batch is compressed in a worker thread (cramjam releases the GIL: the loop
                    # keeps serving meanwhile); the partition's batches behind it wait, so order is kept
                    if b.compressing is None:
                        b.compressing = asyncio.get_running_loop().run_in_executor(None, b.builder.close)
                        b.compressing.add_done_callback(self._compressed)
                    if not b.compressing.done():
                        continue
                    if b.builder.body is None:  # the worker raised (codec error, MemoryError): that batch fails
                        exc = None if b.compressing.cancelled() else b.compressing.exception()
                        p.ready.popleft()
                        self._fail_batch(b, KafkaError(f"compression failed: {exc!r}"))
                        self._kick()  # the partition's next batch goes on the next pass
                        continue
            if b.expected >= 0 and p.inflight:
                continue  # a conditional batch waits for the partition's answers: a refusal may take it down
            if adding:
                continue  # transactions v1: AddPartitionsToTxn first
            node = self.cluster.leader(p.topic, p.partition)
            if node is None or self.cluster.stale(p.topic):
                refresh.add(p.topic)
                continue
            if p.inflight and p.node != node:
                continue  # wait for the answers from the old leader first
            by_node.setdefault(node, []).append((p, b))
        if txn is not None:
            txn.send_adds()
        elif self._bump_wanted and not bumping:
            if self._maybe_bump() and self.producer_id < 0:
                # a fresh id was just asked for (exhausted epoch): the new batches picked above wait for
                # it (never sent with producer id -1, which the broker could not deduplicate)
                by_node.clear()
        if now - self.cluster.last_refresh > self.metadata_max_age and self.partitions:
            refresh.update(t for t, _ in self.partitions)  # metadata.max.age.ms
        for topic in refresh - self._refreshing:
            self._refreshing.add(topic)
            self._spawn(self._refresh(topic))
        for node, items in by_node.items():
            self._send(node, items, now)
        return max(next_due, 0.001)

    async def _refresh(self, topic: str) -> None:
        try:
            await self.cluster.refresh([topic])
        except KafkaError as exc:
            if not exc.retriable:  # e.g. TLS/SASL authentication failed: the topic's batches fail with it
                for p in list(self.partitions.values()):
                    if p.topic == topic:
                        self._expire(p, float("inf"), exc)
            await asyncio.sleep(self.backoff)
        finally:
            self._refreshing.discard(topic)
        self._kick()

    def _expire_in_flight(self, limit: float) -> float:
        """Fail the records of every batch in flight created before ``limit`` (delivery.timeout.ms), as
        Java's Sender.getExpiredInflightBatches. The batch stays where it is until its request is answered:
        a success still acknowledges its sequences (and so resolves an earlier given-up one), a failure
        gives it up (its sequence unresolved, see _batch_failed); it is never resent. Returns seconds until
        the next batch in flight would expire."""
        due = 1.0
        for rid, oldest in self._request_oldest.items():
            if oldest > limit:
                due = min(due, oldest - limit)
                continue
            left = float("inf")
            for b in self._requests[rid]:
                if b.created > limit:
                    left = min(left, b.created)
                elif not b.expired:
                    b.expired = True
                    err = b.last_error
                    self._fail_batch(b, DeliveryTimeoutError(
                        f"{b.count} record(s) for {b.topic}-{b.partition} not delivered within "
                        f"delivery.timeout.ms={self.config['delivery.timeout.ms']} (in flight)"
                        f"{f' (last error: {err})' if err else ''}"))
            self._request_oldest[rid] = left
            if left != float("inf"):
                due = min(due, left - limit)
        return due

    def _expire(self, p: _Partition, now: float, error: KafkaError | None = None) -> None:
        """Fail the batches older than delivery.timeout.ms (with ``error``: every batch not in flight)."""
        limit = now - self.delivery_timeout if error is None else now
        for queue in (p.ready, p.unacked):
            if not queue or queue[0].created > limit:
                continue
            keep: deque[_Batch] = deque()
            for b in queue:
                if b.in_flight or b.created > limit:
                    keep.append(b)
                    continue
                if self.idempotent and queue is p.unacked:
                    if b.attempts == 0:  # a split part never sent: not written, its sequences are closed
                        p.blocked = True  # by the re-sequencing once nothing is in flight
                    elif self.txn is None:
                        self._mark_unresolved(p, b)  # sent: its fate is unknown
                err = b.last_error
                self._fail_batch(b, error or DeliveryTimeoutError(
                    f"{b.count} record(s) for {b.topic}-{b.partition} not delivered within "
                    f"delivery.timeout.ms={self.config['delivery.timeout.ms']}"
                    f"{f' (last error: {err})' if err else ''}"))
            queue.clear()
            queue.extend(keep)
        o = p.open
        if o is not None and o.created <= limit:
            p.open = None
            self._fail_batch(o, error or DeliveryTimeoutError(f"{o.count} record(s) for {o.topic}-{o.partition} "
                                                              "expired before they could be sent"))

    def _send(self, node: int, items: list[tuple[_Partition, _Batch]], now: float) -> None:
        conn_node = self.cluster.nodes.get(node)
        conn = conn_node.conn if conn_node is not None else None
        if conn is None or conn.closed:
            if node not in self._connecting:
                self._connecting.add(node)
                self._spawn(self._connect(node))
            return
        txn = self.txn
        version = conn.version(PRODUCE, PRODUCE_VERSIONS if txn is None or txn.tv2 else PRODUCE_VERSIONS_TV1)
        cond = [(p, b) for p, b in items if b.expected >= 0]
        if cond:
            # conditional batches never share a request with unconditional ones (a refusal would take
            # them down too), and go only to a broker that advertised the feature
            if not conn.conditional_produce or version < 9:
                for p, b in cond:
                    self._not_supported(p, b, conn, version)
            else:
                self._send_request(node, conn, version, cond, True)
            items = [(p, b) for p, b in items if b.expected < 0]
        if items:
            self._send_request(node, conn, version, items, False)

    def _not_supported(self, p: _Partition, b: _Batch, conn: Any, version: int) -> None:
        """Fail a conditional batch the broker could not honour; it was never sent with this sequence."""
        if b in p.ready:
            p.ready.remove(b)
        elif b in p.unacked:  # a resend to a broker that lost the feature: its earlier fate is unknown
            p.unacked.remove(b)
            p.blocked = True
            if b.in_doubt:
                if self.txn is None:
                    self._mark_unresolved(p, b)
                else:
                    p.needs_bump = True
        why = "the broker does not advertise the feature oncelog.conditional.produce" \
            if not conn.conditional_produce else f"the broker speaks Produce v{version} (v9+ needed)"
        self._fail_batch(b, ConditionalProduceNotSupported(
            f"conditional produce is not supported by this broker ({conn.host}:{conn.port}): {why}"))

    def _send_request(self, node: int, conn: Any, version: int, items: list[tuple[_Partition, _Batch]],
                      conditional: bool) -> None:
        if self._node_inflight.get(node, 0) >= self.max_in_flight:
            return
        topics: dict[str, list[tuple[int, bytes]]] = {}
        sent: list[_Batch] = []
        total = 0
        for p, b in items:
            if b.seq < 0 and b in p.ready:
                if total and total + b.builder.size > self.max_request:
                    continue
                p.ready.popleft()
                b.builder.close()
                if self.idempotent:
                    b.seq = p.next_seq
                    p.next_seq = (p.next_seq + b.count) % _SEQ_MOD
                    p.unacked.append(b)
            elif total and total + b.builder.size > self.max_request:
                continue
            head = b.builder.header(self.producer_id if self.idempotent else -1,
                                    self.producer_epoch if self.idempotent else -1,
                                    b.seq, self.transactional_id is not None)
            data = (head, b.builder.body)  # handed to the socket as parts: the records are not copied here
            total += HEADER_SIZE + len(data[1])
            topics.setdefault(b.topic, []).append((b.partition, data))
            b.in_flight = True
            b.attempts += 1
            if b.attempts > 1:
                self.stats["retries"] += 1
            p.inflight += 1
            p.node = node
            sent.append(b)
        if not sent:
            return
        expected = {(b.topic, b.partition): b.expected for b in sent} if conditional else None
        body = encode_produce_request(version, self.transactional_id, self.acks, self.request_timeout_ms,
                                      topics, expected)
        # a conditional request's answer is decoded here, keeping the unknown tags (the actual next offset)
        fut = conn.send(PRODUCE, version, body, expect_response=self.acks != 0, raw_response=conditional)
        self._node_inflight[node] = self._node_inflight.get(node, 0) + 1
        self._requests[id(sent)] = sent
        self._request_oldest[id(sent)] = min(b.created for b in sent)
        self.stats["requests"] += 1
        self.stats["batches_sent"] += len(sent)
        fut.add_done_callback(lambda f: self._on_response(node, sent, f, version if conditional else -1))

    async def _connect(self, node: int) -> None:
        try:
            await self.cluster.connection(node)
        except KafkaError:
            # unreachable leader: the metadata may be stale
            auth = self.cluster.node_auth_error(node)  # not retried: the node's batches fail with it
            for p in list(self.partitions.values()):
                if self.cluster.leader(p.topic, p.partition) == node:
                    if auth is not None:
                        self._expire(p, float("inf"), auth)
                    self.cluster.invalidate(p.topic)
        finally:
            self._connecting.discard(node)
            self._kick()

    # -- responses ----------------------------------------------------------------------

    def _on_response(self, node: int, sent: list[_Batch], fut: asyncio.Future[Any], raw_version: int = -1) -> None:
        self._node_inflight[node] -= 1
        self._requests.pop(id(sent), None)
        self._request_oldest.pop(id(sent), None)
        if not self._requests and self._no_requests is not None:
            self._no_requests.set()
        if self._closed:
            if not fut.cancelled():
                fut.exception()  # marked retrieved: a closed producer reads no answer (its batches failed)
            return
        exc = fut.exception()
        results: dict[tuple[str, int], tuple[int, int, int, str | None, int]] = {}
        actual: dict[tuple[str, int], int] = {}  # conditional refusals: the partition's actual next offset
        resp = None
        if exc is None:
            resp = fut.result()
            if raw_version >= 0 and resp is not None:
                tags: dict[int, Any] = {}
                try:
                    frame, pos = resp
                    resp = decode_response(PRODUCE, raw_version, frame, pos, tags)
                except Exception as e:  # pragma: no cover - the connection decodes the same way
                    exc = KafkaError(f"cannot decode the Produce response: {e}")
                    resp = None
                else:
                    for t in resp.responses:
                        for pr in t.partition_responses:
                            found = unknown_tags_of(tags, pr)
                            if found and NEXT_OFFSET_TAG in found:
                                try:
                                    actual[(t.name, int(pr.index))] = parse_offset_tag(found[NEXT_OFFSET_TAG])
                                except ValueError:
                                    pass
        if exc is None:
            if resp is None:  # acks=0
                for b in sent:
                    results[(b.topic, b.partition)] = (0, -1, -1, None, -1)
            else:
                for t in resp.responses:
                    for pr in t.partition_responses:
                        lat = pr.log_append_time
                        lso = getattr(pr, "log_start_offset", None)
                        results[(t.name, int(pr.index))] = (int(pr.error_code), int(pr.base_offset),
                                                            to_ms(lat) if lat is not None else -1,
                                                            getattr(pr, "error_message", None),
                                                            int(lso) if lso is not None else -2)
            network_error: KafkaError | None = None
        else:
            network_error = exc if isinstance(exc, KafkaError) else KafkaError(str(exc))
        txn = self.txn
        if txn is not None and txn.tv2 and not txn.started:
            # KIP-890: a Produce v12 adds its partitions implicitly, unless it was refused (retriable)
            txn.started = network_error is not None or any(
                results.get((b.topic, b.partition), (-2,))[0] in (0, DUPLICATE_SEQUENCE_NUMBER, -2)
                or not error_class(results[(b.topic, b.partition)][0]).retriable for b in sent)
        for b in sent:
            p = self.partitions[(b.topic, b.partition)]
            p.inflight -= 1
            b.in_flight = False
            if network_error is not None:
                self._batch_failed(p, b, network_error, in_doubt=True)
                continue
            code, base, lat, msg, log_start = results.get((b.topic, b.partition), (-2, -1, -1, None, -1))
            if code == -2:
                self._batch_failed(p, b, KafkaError("the response did not mention the partition"), in_doubt=True)
            elif code == 0 or (code == DUPLICATE_SEQUENCE_NUMBER and self.idempotent):
                if self.idempotent:
                    p.known = self.producer_id
                    end = (b.seq + b.count) % _SEQ_MOD
                    head = bool(p.unacked) and p.unacked[0] is b
                    if head or b in p.unacked:  # (not a batch dropped at an epoch change: an old sequence)
                        if (end - p.acked_seq) % _SEQ_MOD > (p.acked_max - p.acked_seq) % _SEQ_MOD:
                            p.acked_max = end
                    if head:
                        p.unacked.popleft()
                        # past the batches acknowledged out of order too once none below them is left
                        if not p.unacked:
                            p.acked_seq = p.acked_max
                            p.acked_ahead.clear()
                        else:
                            while end in p.acked_ahead:
                                end = p.acked_ahead.pop(end)
                            p.acked_seq = end
                    else:
                        # acknowledged out of order: an earlier batch's answer is missing (lost on a live
                        # connection, as the fault proxy's "gap" mode) or this one was dropped at an epoch change
                        try:
                            p.unacked.remove(b)
                        except ValueError:
                            pass
                        else:
                            p.acked_ahead[b.seq] = end
                self._succeed_batch(b, base if code == 0 else -1, lat)
            elif code in (OFFSET_MISMATCH, CONDITIONAL_PRODUCE_REFUSED):
                err = error_for(code, msg)
                assert isinstance(err, OffsetMismatch)
                err.actual_offset = actual.get((b.topic, b.partition), -1)
                err.expected_offset, err.topic, err.partition = b.expected, b.topic, b.partition
                self._refused(p, b, err)
            else:
                self._batch_failed(p, b, error_for(code, msg), in_doubt=False, log_start_offset=log_start)
        self._kick()

    def _split(self, p: _Partition, b: _Batch) -> bool:
        """MESSAGE_TOO_LARGE for a batch of several records (Java's Sender.completeBatch ->
        RecordAccumulator.splitAndReenqueue): its records go into new batches, in its place at the front of
        the partition's queue (before every later batch), to be sent as if never tried. The new batches are
        at most ``batch.size``, at least two, of near-equal size (about half the refused batch or less), so a
        topic whose ``max.message.bytes`` is below ``batch.size`` is reached in a few refusals (Java splits
        to ``batch.size`` only); a single record still too large fails alone with MessageTooLargeError.

        Idempotence: the parts take the refused batch's place in ``unacked`` and its sequences, in order
        (their counts add up to its count, so no other batch is renumbered: Java's
        assignProducerStateToBatches); the partition is blocked until every request in flight for it is
        answered (its later batches are refused OUT_OF_ORDER_SEQUENCE_NUMBER behind the gap and kept), then
        resent in order (re-sequenced from ``acked_seq`` as after any refusal, :meth:`_resequence`, or with
        their own sequences while a sequence is unresolved). Unless a later batch was written meanwhile
        (:meth:`_drop_overtaken_parts`). No split while the batch may have been written (in doubt): it fails
        as before. Returns False when not split."""
        if b.count < 2 or b.expired or not b.futures or b.builder.body is None:
            return False
        if self.idempotent:
            if b.in_doubt or b not in p.unacked:
                return False
        # at least two parts of near-equal size, each at most batch.size
        pieces = split_builder(b.builder, self.batch_size, min_parts=2)
        counts = [nb.count for nb, _, _ in pieces]
        parts = []
        seq = b.seq
        for nb, _, _ in pieces:
            part = _Batch(b.topic, b.partition, nb)
            part.created = b.created  # delivery.timeout.ms counts from the first record, as before
            part.spans = b.spans
            part.part = True
            part.last_error = b.last_error
            if self.idempotent:  # the refused batch's sequences, in order (Java's assignProducerStateToBatches)
                part.seq, seq = seq, (seq + nb.count) % _SEQ_MOD
            parts.append(part)
        if b.group is not None:  # the blocking facade's one completion for all the batch's records
            for part, child, (_, ts, _) in zip(parts, b.group.split(counts), pieces):
                part.group = child
                part.futures.append(child)
                part.timestamps.extend(ts)
        else:
            k = 0  # the part the next record goes to, and the records of it placed already
            used = 0
            for fut, ts in zip(b.futures, b.timestamps):
                n = fut.count if type(fut) is _Span else 1
                if used + n <= counts[k]:
                    parts[k].futures.append(fut)
                    parts[k].timestamps.append(ts)
                    used += n
                else:  # a produce_batch span across parts: one span per part, the call's futures follow them
                    cut, left = [], n
                    while left:
                        take = min(left, counts[k] - used)
                        cut.append(take)
                        left -= take
                        used += take
                        if left:
                            k, used = k + 1, 0
                    for j, child in enumerate(fut.split(cut)):
                        part = parts[k - len(cut) + 1 + j]
                        part.futures.append(child)
                        part.timestamps.append(ts)
                if used == counts[k] and k + 1 < len(parts):
                    k, used = k + 1, 0
        rest = b.nbytes
        for part, (_, _, sizes) in zip(parts[:-1], pieces):
            part.nbytes = min(sum(sizes), rest)
            rest -= part.nbytes
        parts[-1].nbytes = rest
        if b.expected >= 0:
            first = b.expected
            for part in parts:
                part.expected, first = first, first + part.count
        b.futures = []  # its records are the parts' now
        if self.idempotent:
            queue = list(p.unacked)
            i = queue.index(b)
            p.unacked = deque(queue[:i] + parts + queue[i + 1:])
        else:
            p.ready.extendleft(reversed(parts))
        p.retry_at = 0.0  # sent again at once, as new batches (Java counts no attempt for a split)
        self.stats["batch_splits"] += 1
        return True

    def _drop_overtaken_parts(self, p: _Partition) -> None:
        """Before the unsent parts of a split batch go out (nothing in flight for the partition): if a later
        batch was acknowledged meanwhile, the broker wrote it although the parts' sequences come first, so it
        had lost the producer's state (``producer.id.expiration.ms``) and accepted it as a new producer's.
        Writing the parts now would put them after it: they fail with the refusal instead (as a batch too large
        did before splits existed), and the partition goes back to one request in flight."""
        base = p.acked_seq
        reach = (p.acked_max - base) % _SEQ_MOD
        keep: deque[_Batch] = deque()
        dropped = False
        for x in p.unacked:
            if x.part and x.attempts == 0 and reach > (x.seq - base) % _SEQ_MOD:
                dropped = True
                self._fail_batch(x, x.last_error or MessageTooLargeError("the batch is too large"))
            else:
                keep.append(x)
        if dropped:
            p.unacked = keep
            p.known = -1
            if not any(reach > (x.seq - base) % _SEQ_MOD for x in keep):
                # no sequence below the acknowledged maximum is still owed: the next batch follows it
                # (else it went out at the dropped parts' old sequence, refused, and the epoch bumped)
                p.acked_seq = p.acked_max
                p.acked_ahead.clear()

    def _refused(self, p: _Partition, b: _Batch, err: KafkaError) -> None:
        """A conditional refusal: the broker appended nothing of the batch (a retry of an appended batch is
        answered as a duplicate, never refused), so its sequences are free; the later batches of the
        partition are re-sequenced to close the gap once nothing is in flight for it. Not retried."""
        b.last_error = err
        try:
            p.unacked.remove(b)
        except ValueError:
            pass
        p.blocked = True
        p.retry_at = 0.0
        self._fail_batch(b, err)
        # the queued conditional batches that continue it were written against the same belief: they
        # fail with it (sent alone, one could match an offset another writer happened to reach)
        end = b.expected + b.count
        for queue in (p.unacked, p.ready):
            for later in list(queue):
                if not later.in_flight and later.expected == end and end > 0:
                    queue.remove(later)
                    end = later.expected + later.count
                    self._fail_batch(later, type(err)(err.message, getattr(err, "actual_offset", -1),
                                                      later.expected, later.topic, later.partition))
        if p.open is not None and p.open.expected == end and end > 0:
            o, p.open = p.open, None
            self._fail_batch(o, type(err)(err.message, getattr(err, "actual_offset", -1), o.expected, o.topic,
                                          o.partition))

    def _batch_failed(self, p: _Partition, b: _Batch, err: KafkaError, in_doubt: bool,
                      log_start_offset: int = -2) -> None:
        """``log_start_offset``: the partition's, from the Produce answer (-1: the broker did not know it,
        -2: not in that answer)."""
        b.last_error = err
        b.in_doubt = b.in_doubt or in_doubt
        if err.code in REFRESH_ERRORS:
            self.cluster.invalidate(b.topic)
        p.blocked = True
        p.retry_at = time.monotonic() + self.backoff
        if err.code == MESSAGE_TOO_LARGE and self._split(p, b):
            return
        if not self.idempotent:
            if (err.retriable or in_doubt) and b.attempts <= self.retries and not b.expired:
                p.ready.appendleft(b)  # resent as is (duplicates possible: that is what idempotence prevents)
            else:
                self._fail_batch(b, err)
            return
        head = bool(p.unacked) and p.unacked[0] is b
        code = err.code
        if code == UNKNOWN_PRODUCER_ID:
            p.known = -1  # the broker lost the producer's state there: the next first batch goes alone again
        expired = b.expired  # failed at delivery.timeout.ms while in flight: given up now, never resent
        if expired and not head:
            # an earlier batch is still unacknowledged: the partition's later answers settle this one's fate
            if b in p.unacked:
                p.unacked.remove(b)
                if self.txn is None:
                    self._mark_unresolved(p, b)
            return
        if not head and (code in (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID) or err.retriable or in_doubt):
            return  # an earlier batch failed first; this one is resent after it
        if code == OUT_OF_ORDER_SEQUENCE_NUMBER and b.seq != p.acked_seq and p.unresolved < 0 \
                and self.txn is None and b.attempts <= self.retries and not expired:
            # not the next sequence: the batches before it were dropped unwritten (an unsent split part that
            # expired, a batch refused for good) after it was sent; re-sequenced and resent, no bump (Java's
            # canRetry, isNextSequence). (In a transaction it fails: the transaction is abortable already.)
            return
        if self.txn is not None:
            # in a transaction the epoch is not bumped here: the batch fails, which makes the
            # transaction abortable (or fatal); the epoch changes after the abort
            if (err.retriable or in_doubt) and code not in (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID) \
                    and b.attempts <= self.retries and not expired:
                return
            p.unacked.remove(b)
            self._fail_batch(b, err)
            return
        # KIP-360, as Java's idempotent producer (TransactionManager.canRetry): both codes mean the broker
        # appended nothing of the batch, so it is retried (while retries last); UNKNOWN_PRODUCER_ID with no
        # log start offset in the answer is retried as is, else (and OUT_OF_ORDER_SEQUENCE_NUMBER on the
        # next batch to be acknowledged, the head) the epoch is bumped client-side and the partition's
        # sequences restart at 0 (_maybe_bump).
        if code in (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID):
            if b.attempts <= self.retries and not expired:
                if not (code == UNKNOWN_PRODUCER_ID and log_start_offset == -1):
                    p.needs_bump = True
                return
            p.unacked.remove(b)
            p.needs_bump = True
            self._fail_batch(b, err)
            return
        if code == INVALID_PRODUCER_EPOCH:
            p.unacked.remove(b)
            p.needs_bump = True
            self._fail_batch(b, err)
            return
        if err.retriable or in_doubt:
            if b.attempts <= self.retries and not expired:
                return
            p.unacked.remove(b)
            if b.in_doubt:
                self._mark_unresolved(p, b)  # retries exhausted, an attempt may have been written
            self._fail_batch(b, err)
            return
        # refused for good (MESSAGE_TOO_LARGE, INVALID_RECORD, ...): later batches close the sequence gap (not
        # while a sequence is unresolved: then the partition's next batch is answered OUT_OF_ORDER at the head
        # and the epoch is bumped)
        p.unacked.remove(b)
        if b.in_doubt:
            self._mark_unresolved(p, b)  # an earlier attempt may have been written
        self._fail_batch(b, err)


def _to_bytes(v: Any, what: str) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{what} must be bytes, str or None, not {type(v).__name__}")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _values_list(values: Any) -> Any:
    """A list of bytes from a list/tuple, or a pyarrow array: a binary, string, large_binary or
    large_string one (chunked or not) comes back as one binary Array (:func:`oncelog.client.arrow.as_binary`,
    encoded without a list), any other type as a list. pyarrow is not a dependency."""
    if isinstance(values, (list, tuple)):
        if values and set(map(type, values)) != {bytes}:  # (a set of types: no Python loop per value)
            return [_to_bytes(v, "value") for v in values]
        return list(values)
    if is_arrow(values):
        binary = as_binary(values)
        if binary is not None:
            return binary
    to_pylist = getattr(values, "to_pylist", None)
    if to_pylist is not None:  # pyarrow Array / ChunkedArray of another type
        return [_to_bytes(v, "value") for v in to_pylist()]
    return [_to_bytes(v, "value") for v in values]


def _as_list(values: Any) -> Any:
    """``values`` (from :func:`_values_list`) as a list of bytes when it is an Arrow array."""
    return [_to_bytes(v, "value") for v in values.to_pylist()] if is_arrow(values) else values


class _WaitingBatch:
    """A produce_batch() call queued in ``ProducerCore._waiting`` behind the records (and calls) made
    before it for a topic without metadata: ``run(info)`` places its records when the metadata comes
    (in the same synchronous pass as those ahead of it) and completes ``done`` (the call's awaited
    future) with the outcome.

    While it waits it counts as one outstanding record (``_outstanding``), so flush() and a
    transaction's end wait until it is placed or fails (as Java's send() returns only once the record
    is appended: a commit after it always includes it). Cancelled, it is dropped at once: its values
    are released and it no longer counts."""

    __slots__ = ("core", "topic", "place", "done")

    def __init__(self, core: "ProducerCore", topic: str, place: Callable[[TopicInfo], None],
                 done: asyncio.Future[None]) -> None:
        self.core = core
        self.topic = topic
        self.place: Callable[[TopicInfo], None] | None = place
        self.done = done
        core.hold_waiting()
        done.add_done_callback(self._ended)

    def _ended(self, done: asyncio.Future[None]) -> None:
        self.place = None  # the values (a closure over them) go now, not when the metadata wait ends
        if done.cancelled():
            waiting = self.core._waiting.get(self.topic)
            if waiting is not None and self in waiting:
                waiting.remove(self)
        self.core.release_waiting()

    def run(self, info: Any) -> None:
        if self.done.done() or self.place is None:
            return  # the call was cancelled while it waited: none of its records is placed
        try:
            txn = self.core.txn
            if txn is not None:
                txn.check_send_waited()  # the transaction it was made in is still open (or committing)
            self.place(info)
        except Exception as exc:  # partition out of range, ...: produce_batch() raises it
            self.done.set_exception(exc)
        else:
            self.done.set_result(None)


async def produce_batch_into(core: ProducerCore, topic: str, vals: list[bytes | None], keys: Any,
                             partition: int | None, timestamp: int | None, futs: BatchFutures,
                             expected_offset: int | None = None) -> None:
    """The batch API shared by both facades: ``futs[i]`` completes with record ``i``'s metadata."""
    if expected_offset is not None:
        core.check_conditional(partition, expected_offset)
    ks = None if keys is None else _values_list(keys)
    if ks is not None and len(ks) != len(vals):
        raise ValueError("keys and values differ in length")
    if ks is not None and is_arrow(vals) != is_arrow(ks):
        vals, ks = _as_list(vals), _as_list(ks)  # Arrow mixed with a list

    def place(info: TopicInfo) -> None:
        _place_batch(core, topic, info, vals, ks, partition, timestamp, futs, expected_offset)

    known = core.cluster.topics.get(topic)
    if known is not None and known.leaders and topic not in core._waiting:
        # placed at once, with no await, by the same rule as produce()'s _place: metadata marked stale
        # (after NOT_LEADER_OR_FOLLOWER) is refreshed by the sender before it sends, so a produce() made
        # after this call cannot land ahead of it
        place(known)
        return
    # the topic's first use (or records still wait for it): in line behind the produce() records and
    # produce_batch() calls made before this one, so each partition's log follows the call order
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    core.wait_in_line(topic, _WaitingBatch(core, topic, place, done))
    await done


def _place_batch(core: ProducerCore, topic: str, info: TopicInfo, vals: Any, ks: Any, partition: int | None,
                 timestamp: int | None, futs: BatchFutures, expected_offset: int | None) -> None:
    """Place a produce_batch() call's records, the topic's metadata known (on the loop, synchronously)."""
    ts = _now_ms() if timestamp is None else timestamp
    n = info.partitions
    if partition is not None and not 0 <= partition < n:
        raise UnknownTopicOrPartitionError(f"partition {partition} of {topic} does not exist")
    if expected_offset is not None:
        core.append_many(topic, vals, ks, partition, ts, futs, expected_offset)  # type: ignore[arg-type]
    elif partition is None and ks is not None:
        # every key hashed at once (numpy, from VECTOR_MIN records), records grouped by
        # partition in the order given; Arrow arrays stay Arrow (take) and are encoded from their buffers;
        # a span per batch holds its records' indices (no future per record until one is asked for)
        arrow = is_arrow(ks)
        for part, idx in key_groups(ks, n, lambda: core.sticky.partition(topic, n)):
            if arrow:
                core.append_many(topic, vals.take(idx), ks.take(idx), part, ts, futs.spread(idx))
            else:
                il = idx if isinstance(idx, list) else idx.tolist()
                core.append_many(topic, list(map(vals.__getitem__, il)), list(map(ks.__getitem__, il)), part, ts,
                                 futs.spread(idx))
    else:
        part = core.sticky.partition(topic, n) if partition is None else partition
        core.append_many(topic, vals, ks, part, ts, futs)


class Producer:
    """The asyncio producer.

    ``producer = Producer({"bootstrap.servers": "host:9092", ...})``; ``await
    producer.start()`` (or ``async with Producer(conf) as producer``);
    ``fut = producer.produce(topic, value, ...)``; ``md = await fut``;
    ``await producer.flush()``; ``await producer.close()``.

    With ``transactional.id``: ``await producer.init_transactions()``, then
    ``begin_transaction()`` / ``produce()`` / ``send_offsets_to_transaction()``
    / ``commit_transaction()`` or ``abort_transaction()``; KIP-939:
    ``prepare_transaction()`` and ``complete_transaction()`` (docs/client.md).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = parse_config(config, "producer")
        self._core = ProducerCore(self.config)
        self._started = False

    async def start(self) -> None:
        """Connect, read metadata and (idempotent producer) get a producer id."""
        if not self._started:
            await self._core.start()
            self._started = True

    async def __aenter__(self) -> "Producer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                headers: Any = None, timestamp: int | None = None,
                on_delivery: Callable[[KafkaError | None, RecordMetadata | None], None] | None = None,
                expected_offset: int | None = None) -> asyncio.Future[RecordMetadata]:
        """Queue one record; returns a future of its :class:`RecordMetadata`.

        ``on_delivery(err, metadata)`` is called on the loop when it completes.
        Raises :class:`BufferError` when ``buffer.memory`` bytes are waiting (await
        :meth:`flush` and retry), like confluent-kafka.

        ``expected_offset=k`` (with ``partition``): the record must get offset
        ``k`` or not be written (conditional produce, docs/conditional-publish.md);
        a refusal fails it with :class:`~oncelog.client.errors.OffsetMismatch`.
        """
        core = self._core
        if not self._started:
            raise ClientClosedError("call await producer.start() first")
        core.check_open()
        if expected_offset is not None:
            core.check_conditional(partition, expected_offset)
        value, key = _to_bytes(value, "value"), _to_bytes(key, "key")
        n = (len(value) if value else 0) + (len(key) if key else 0)
        if core.buffered_bytes + n > self.config["buffer.memory"] and core.buffered_bytes:
            raise BufferError("buffer.memory is full: await flush() and produce again")
        fut: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        if on_delivery is not None:
            fut.add_done_callback(lambda f: on_delivery(f.exception(), None if f.exception() else f.result()))
        core.append(topic, value, key, partition, headers, _now_ms() if timestamp is None else timestamp, fut,
                    -1 if expected_offset is None else expected_offset)
        return fut

    async def produce_batch(self, topic: str, values: Any, keys: Any = None, partition: int | None = None,
                            timestamp: int | None = None, expected_offset: int | None = None
                            ) -> BatchFutures:
        """Queue many records at once (a list, or a pyarrow array); returns their futures, in order.

        With ``partition`` (or without keys) the records section is encoded in
        bulk; with keys each record goes to its key's partition. The result is
        a :class:`BatchFutures` sequence: a record's ``asyncio.Future`` is made
        when it is first looked at.
        """
        self._core.check_open()
        vals = _values_list(values)
        futs = BatchFutures(len(vals), asyncio.get_running_loop().create_future)
        await produce_batch_into(self._core, topic, vals, keys, partition, timestamp, futs, expected_offset)
        return futs

    def poll(self, timeout: float = 0) -> int:
        """For confluent-kafka compatibility: callbacks run on the loop as records complete. Returns 0."""
        return 0

    async def flush(self, timeout: float | None = None) -> int:
        """Send everything and wait for every outstanding record; returns how many are still outstanding."""
        return await self._core.flush(timeout)

    # -- transactions (see docs/client.md and oncelog.client.aio.transactions) ------------

    def _txn(self) -> TransactionManager:
        if not self._started:
            raise ClientClosedError("call await producer.start() first")
        self._core.check_open_only()
        if self._core.txn is None:
            raise IllegalStateError("transactions need a transactional.id in the producer's configuration")
        return self._core.txn

    async def init_transactions(self, timeout: float | None = None, *, keep_prepared_txn: bool = False) -> None:
        """Get the producer id and epoch of ``transactional.id``, fencing older producers with the same id.

        Their open transaction is aborted, unless ``keep_prepared_txn=True``
        (KIP-939, with ``transaction.two.phase.commit.enable=true``): then an
        open transaction is kept, the producer is left in the prepared state and
        :meth:`complete_transaction` (or commit/abort) decides it. Raises
        :class:`~oncelog.client.errors.KafkaTimeoutError` after ``max.block.ms``
        (call again to resume).
        """
        await self._txn().init_transactions(keep_prepared_txn, timeout)

    async def begin_transaction(self) -> None:
        """Start a transaction: records produced from now on belong to it."""
        self._txn().begin_transaction()

    async def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any,
                                    timeout: float | None = None) -> None:
        """Commit a consumer group's ``offsets`` as part of the transaction (consume-transform-produce).

        ``offsets``: ``{(topic, partition): next offset}`` (or a list of
        TopicPartition with ``offset``); ``group_metadata``: the consumer's
        ``group_metadata()`` (a :class:`ConsumerGroupMetadata`, for KIP-447
        generation fencing) or just the group id.
        """
        await self._txn().send_offsets_to_transaction(offsets, group_metadata, timeout)

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit. Raises the abortable error if a record failed (then call abort)."""
        await self._txn().commit_transaction(timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """Drop unsent records, wait for those in flight, then abort."""
        await self._txn().abort_transaction(timeout)

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """KIP-939: flush and return the transaction's :class:`PreparedTxnState` (needs 2PC enabled)."""
        return await self._txn().prepare_transaction(timeout)

    async def complete_transaction(self, prepared_state: PreparedTxnState, timeout: float | None = None) -> None:
        """KIP-939: commit the prepared transaction if ``prepared_state`` is its state, else abort it."""
        await self._txn().complete_transaction(prepared_state, timeout)

    async def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout``), then close connections; unsent records fail with ClientClosedError."""
        await self._core.close(timeout)

    @property
    def producer_id(self) -> tuple[int, int]:
        """``(producer id, epoch)``, (-1, -1) when not idempotent."""
        return self._core.producer_id, self._core.producer_epoch
