"""Exactly-once consume-transform-produce: :class:`TransactSession` (asyncio).

One object owns a group member (:class:`~oncelog.client.aio.group.GroupMember`),
a manual-assign consumer it assigns and seeks itself, and a transactional
producer, so the producer always knows the consumer's state (seed 003, after
franz-go's ``GroupTransactSession``)::

    async with TransactSession(config, ["in"]) as s:
        while True:
            for m in await s.poll(1.0):
                s.produce("out", m.value, key=m.key)
            await s.end(commit=True)      # False: aborted, consumer rewound

The rules (docs/client.md, "Exactly-once: TransactSession", says why each exists):

* abort on revoke: a revoke or loss while a transaction holds records makes
  it abort-only; ``end(commit=True)`` then aborts, returns False and rewinds
  every owned partition to its committed offset;
* heartbeat before commit: one successful ``heartbeat_now()`` right before
  EndTxn, else abort;
* ``transaction.timeout.ms < session.timeout.ms``, checked at construction
  (the default is set below the session timeout);
* revocation waits for EndTxn: the revoke/lost callbacks take the rebalance
  lock that ``end()`` holds across TxnOffsetCommit, the heartbeat and EndTxn;
* stable offsets: a new owner fetches offsets with ``require_stable``
  (KIP-447); when the coordinator's OffsetFetch is below v7 the session keeps
  the rebalance lock 200 ms after each commit (in the background: a new
  transaction may start, but cannot end, meanwhile);
* offsets go into the transaction with ``send_offsets_to_transaction`` and the
  member's current generation and member id (zombie fencing);
* fatal errors (fenced producer, fenced static member, authorisation) are
  raised and end the session; abortable ones abort and go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.consumer import Consumer, Message
from oncelog.client.aio.group import GroupMember
from oncelog.client.aio.offsets import fetch_offsets
from oncelog.client.aio.producer import Producer, RecordMetadata
from oncelog.client.aio.transactions import TxnState
from oncelog.client.config import ConfigError, parse_config
from oncelog.client.errors import ClientClosedError, KafkaError, UnsupportedApiError

__all__ = ["HEURISTIC_SLEEP", "TransactSession"]

log = logging.getLogger("oncelog.client.session")

SESSION_BATCH_SIZE = 1_000_000  # the session's default batch.size (see session_configs)
HEURISTIC_SLEEP = 0.2  # seed 003: franz-go's sleep before releasing the rebalance lock without KIP-447
EARLIEST, LATEST = -2, -1


def _retrieved(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled():
        fut.exception()


def _forget_failures(futs: list["asyncio.Future[Any]"]) -> None:
    """The records of an aborted transaction: their failure is end()'s answer, not an error for asyncio to
    log as "Future exception was never retrieved" (a caller may still await them)."""
    for f in futs:
        if f.done():
            _retrieved(f)
        else:
            f.add_done_callback(_retrieved)


def session_configs(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split and check one session config into (consumer, producer) configs; raises ConfigError."""
    conf = dict(config)
    if not conf.get("group.id"):
        raise ConfigError("group.id is required: a TransactSession is a member of a consumer group")
    for key, want in (("enable.auto.commit", False), ("isolation.level", "read_committed")):
        if key in conf and conf[key] not in (want, str(want).lower()):
            raise ConfigError(f"{key}={conf[key]!r}: a TransactSession needs {key}={str(want).lower()} "
                              "(offsets are committed inside the transaction; aborted input must stay hidden)")
        conf[key] = want
    cons = parse_config(conf, "consumer")
    session_ms = cons["session.timeout.ms"]
    if "transaction.timeout.ms" in conf:
        txn_ms = parse_config({**conf, "transactional.id": conf.get("transactional.id") or "x"},
                              "producer")["transaction.timeout.ms"]
        if txn_ms >= session_ms:
            raise ConfigError(
                f"transaction.timeout.ms ({txn_ms}) must be less than session.timeout.ms ({session_ms}): a commit "
                "that hangs after the session's last heartbeat must be aborted by the transaction coordinator "
                "before the group can give its partitions to another member (seed 003)")
    else:
        conf["transaction.timeout.ms"] = max(1, session_ms - max(1000, session_ms // 10))
    if "batch.size" not in conf:
        # a transaction's records are flushed together by end(): with Kafka's 16 KiB default a 500-record
        # transaction of 512 B records is 17 batches (requests) per partition, and the broker's per-batch
        # work dominated the copy (docs/benchmarks.md); franz-go's default batch limit is ~1 MB too
        try:
            conf["batch.size"] = min(SESSION_BATCH_SIZE, int(conf.get("max.request.size", SESSION_BATCH_SIZE)))
        except (TypeError, ValueError):
            pass  # a bad max.request.size: parse_config says so
    if not conf.get("transactional.id"):
        conf["transactional.id"] = f"{conf['group.id']}-session-{uuid.uuid4().hex[:12]}"
    return conf, conf


class TransactSession:
    """A group consumer and a transactional producer as one; see the module docstring."""

    def __init__(self, config: dict[str, Any], topics: Iterable[str]) -> None:
        cconf, pconf = session_configs(config)
        self.topics = sorted(set(topics))
        if not self.topics:
            raise ConfigError("TransactSession needs at least one topic")
        self._consumer = Consumer(cconf)
        self._producer = Producer(pconf)
        self.config = self._consumer.config
        self.transactional_id: str = pconf["transactional.id"]
        self.transaction_timeout_ms: int = self._producer.config["transaction.timeout.ms"]
        # the group's own connections (as Java's coordinator socket): on the consumer's, a heartbeat would
        # wait behind a Fetch the broker holds up to fetch.max.wait.ms (answers come in request order)
        self._group_cluster = Cluster(self._consumer.config)
        # and OffsetFetch (rewinds after an abort, committed()) on a third: on the group's connections it would
        # queue behind a JoinGroup the broker holds for the whole rebalance, time out after request.timeout.ms
        # and take the JoinGroup down with the connection (seen under member churn: the member then lost its
        # generation and every transaction in the meantime aborted on TxnOffsetCommit)
        self._offsets_cluster = Cluster(self._consumer.config)
        self._member = GroupMember(self._group_cluster, self._consumer.config, self.topics,
                                   on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        self._lock = asyncio.Lock()  # held across end(); the revoke callbacks wait for it
        self._in_txn = False
        self._last_end = True  # the last end()'s outcome (committed)
        self._abort_cause: str | None = None
        self._offsets: dict[tuple[str, int], int] = {}
        self._txn_in = self._txn_out = 0
        self._futs: list[asyncio.Future[Any]] = []  # the open transaction's records
        self._stable: bool | None = None  # None: not known yet; False: pre-KIP-447 heuristic
        self._error: KafkaError | None = None
        self._started = False
        self._closed = False
        self._release_task: asyncio.Task[None] | None = None
        self.counters: dict[str, Any] = {"committed": 0, "aborted": 0, "records_in": 0, "records_out": 0,
                                         "aborts_by_cause": {}}

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, init the transactional producer (fencing older instances) and join the group."""
        if self._started:
            return
        self._started = True
        await self._consumer.start()
        await self._group_cluster.start()
        await self._offsets_cluster.start()
        await self._producer.start()
        await self._producer.init_transactions()
        await self._member.start()

    async def __aenter__(self) -> "TransactSession":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def member(self) -> GroupMember:
        """The group member (classic protocol) the session consumes through."""
        return self._member

    @property
    def assignment(self) -> list[tuple[str, int]]:
        """The ``(topic, partition)`` pairs the session owns now."""
        return self._member.assignment

    @property
    def stable_offsets(self) -> bool | None:
        """True: KIP-447 ``require_stable``; False: the 200 ms heuristic; None: not known yet."""
        return self._stable

    async def wait_assigned(self, timeout: float | None = None) -> list[tuple[str, int]]:
        """Wait until the group has given this member partitions; returns them."""
        return await self._member.wait_assigned(timeout)

    async def close(self) -> None:
        """Abort an open transaction, leave the group, close the clients."""
        if self._closed:
            return
        try:
            if self._in_txn and self._error is None:
                try:
                    await self._producer.abort_transaction()
                    self._count_abort("close")
                except KafkaError as exc:
                    log.info("session %s: abort on close failed: %s", self.transactional_id, exc)
                _forget_failures(self._futs)
                self._in_txn = False
            if self._release_task is not None:
                await asyncio.gather(self._release_task, return_exceptions=True)
            await self._member.close()
        finally:
            self._closed = True
            await self._consumer.close()
            await self._group_cluster.close()
            await self._offsets_cluster.close()
            await self._producer.close(5.0)

    # -- consume and produce ----------------------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ClientClosedError("the transact session is closed")
        if not self._started:
            raise ClientClosedError("call await session.start() first")
        if self._member.error is not None:
            self._error = self._member.error
            raise self._error

    async def _begin(self) -> None:
        if not self._in_txn:
            await self._producer.begin_transaction()
            self._in_txn = True
            self._abort_cause = None
            self._offsets = {}
            self._txn_in = self._txn_out = 0
            self._futs = []
            self._txn_started = time.monotonic()

    async def poll(self, timeout: float | None = 1.0, max_records: int = 500) -> list[Message]:
        """Records of the owned partitions (up to ``max_records``); starts a transaction when there are some."""
        self._check()
        self._member.poll_happened()
        if not self._in_txn and not self._member.in_group:
            # a rebalance is under way (a cooperative member keeps its partitions meanwhile): a transaction
            # started now could not commit (no heartbeat succeeds before the rebalance ends), so wait for it
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(self._member._wait_assigned(), timeout)
            except asyncio.TimeoutError:
                return []
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - t0))
            self._check()
        msgs = await self._consumer.consume(max_records, timeout)
        self._check()
        if msgs:
            await self._begin()
            for m in msgs:
                self._offsets[(m.topic, m.partition)] = m.offset + 1
            self._txn_in += len(msgs)
            self.counters["records_in"] += len(msgs)
        return msgs

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                headers: Any = None, timestamp: int | None = None,
                on_delivery: Callable[[KafkaError | None, RecordMetadata | None], None] | None = None
                ) -> asyncio.Future[RecordMetadata]:
        """As :meth:`Producer.produce`, inside the session's transaction."""
        self._check()
        if not self._in_txn:
            self._begin_now()
        fut = self._producer.produce(topic, value, key, partition, headers, timestamp, on_delivery)
        self._futs.append(fut)
        self._txn_out += 1
        self.counters["records_out"] += 1
        return fut

    async def produce_batch(self, topic: str, values: Any, keys: Any = None, partition: int | None = None,
                            timestamp: int | None = None) -> Any:
        """As :meth:`Producer.produce_batch` (many records, no headers), inside the session's transaction.

        The records are encoded in bulk (with keys and no ``partition``, each partition's records of the
        call) and no future is made per record until one is looked at (the transaction's outcome is
        :meth:`end`'s answer)."""
        self._check()
        if not self._in_txn:
            self._begin_now()
        futs = await self._producer.produce_batch(topic, values, keys, partition, timestamp)
        self._txn_out += len(futs)
        self.counters["records_out"] += len(futs)
        return futs

    def _begin_now(self) -> None:
        self._producer._txn().begin_transaction()
        self._in_txn, self._abort_cause, self._offsets = True, None, {}
        self._txn_in = self._txn_out = 0
        self._futs = []
        self._txn_started = time.monotonic()

    # -- ending a transaction -----------------------------------------------------------------------

    def _count_abort(self, cause: str) -> None:
        self.counters["aborted"] += 1
        by = self.counters["aborts_by_cause"]
        by[cause] = by.get(cause, 0) + 1

    def _fatal(self, exc: KafkaError) -> bool:
        txn = self._producer._core.txn
        fatal = exc.fatal or (txn is not None and txn.state is TxnState.FATAL_ERROR) or \
            self._member.error is not None
        if fatal:
            log.error("session %s: fatal error, the session ends: %s", self.transactional_id, exc)
            self._error = self._member.error or exc
        return fatal

    async def end(self, commit: bool = True) -> bool:
        """End the transaction: True when it committed, False when it aborted (the consumer is rewound).

        Raises the typed error of a fatal failure (the session is then over).
        """
        self._check()
        if not self._in_txn:
            return True
        await self._lock.acquire()
        if not self._in_txn:
            # another end() held the lock and ended it (a blocking end() interrupted by Ctrl-C runs on
            # and the caller calls end() again, as Java's commitTransaction may be): its outcome, not a
            # second EndTxn for a transaction that is over
            self._lock.release()
            self._check()
            return self._last_end
        release_later = False
        try:
            cause = None if commit else "requested"
            cause = cause or self._abort_cause
            committed = False
            if cause is None:
                try:
                    # the offsets travel while the records' Produce requests are answered (as Java sends them
                    # before commitTransaction flushes): both belong to this transaction, EndTxn waits for both
                    offsets = None
                    if self._abort_cause is None and self._offsets:
                        offsets = asyncio.ensure_future(self._producer.send_offsets_to_transaction(
                            dict(self._offsets), self._member.group_metadata()))
                    try:
                        await self._producer.flush()
                    finally:
                        if offsets is not None:
                            await offsets
                except KafkaError as exc:
                    if self._fatal(exc):
                        raise
                    cause = "offset_commit"
                    log.info("session %s: TxnOffsetCommit failed, aborting: %s", self.transactional_id, exc)
                cause = cause or self._abort_cause
            if cause is None:
                try:
                    await self._member.heartbeat_now()  # seed 003: know we are in the group right before EndTxn
                except KafkaError as exc:
                    if self._fatal(exc):
                        raise
                    cause = "heartbeat"
                    log.info("session %s: heartbeat before commit failed, aborting: %s", self.transactional_id, exc)
            if cause is None:
                try:
                    await self._producer.commit_transaction()
                    committed = True
                except KafkaError as exc:
                    if self._fatal(exc):
                        raise
                    cause = "commit"
                    log.info("session %s: commit failed, aborting: %s", self.transactional_id, exc)
            if not committed:
                try:
                    await self._producer.abort_transaction()
                except KafkaError as exc:
                    self._fatal(exc)
                    self._error = self._error or exc
                    raise
                finally:
                    _forget_failures(self._futs)
            self._in_txn = False
            self._last_end = committed
            self._futs = []
            ms = (time.monotonic() - self._txn_started) * 1000
            if committed:
                self.counters["committed"] += 1
                log.debug("session %s: committed %d in, %d out, offsets %s (%.0f ms)", self.transactional_id,
                          self._txn_in, self._txn_out, self._offsets, ms)
                release_later = self._stable is False
            else:
                self._count_abort(cause or "commit")
                log.debug("session %s: aborted (%s) %d in, %d out (%.0f ms)", self.transactional_id, cause,
                          self._txn_in, self._txn_out, ms)
                await self._rewind()
            return committed
        finally:
            if release_later:
                # seed 003 without KIP-447: hold off a rebalance 200 ms so the markers land before a
                # new owner fetches offsets; a new transaction may start meanwhile but not end
                self._release_task = asyncio.ensure_future(self._release_after(HEURISTIC_SLEEP))
            else:
                self._lock.release()

    async def _release_after(self, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
        finally:
            self._lock.release()

    async def abort(self) -> bool:
        """Abort the open transaction (``end(commit=False)``)."""
        return await self.end(commit=False)

    async def run(self, transform: Callable[[Message], Any], *, poll_timeout: float = 1.0, max_records: int = 500,
                  stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """poll -> ``transform(record)`` -> produce -> end(commit=True), until ``stop()`` is true.

        ``transform`` returns (or awaits to) None or an iterable of
        ``(topic, key, value)`` tuples or of ``produce()`` keyword dicts.
        Returns the counters.
        """
        while stop is None or not stop():
            msgs = await self.poll(poll_timeout, max_records)
            for m in msgs:
                out = transform(m)
                if isinstance(out, Awaitable):
                    out = await out
                for item in out or ():
                    if isinstance(item, dict):
                        self.produce(**item)
                    else:
                        topic, key, value = item
                        self.produce(topic, value, key=key)
            await self.end(commit=True)
        return self.counters

    # -- offsets and rebalances ------------------------------------------------------------------

    async def _committed(self, parts: list[tuple[str, int]]) -> dict[tuple[str, int], Any]:
        cluster, gid = self._offsets_cluster, self._member.group_id
        if self._stable is not False:
            try:
                out = await fetch_offsets(cluster, gid, parts, require_stable=True, unstable_unsupported="raise")
                if self._stable is None:
                    self._stable = True
                    log.info("session %s: stable offsets with require_stable (KIP-447)", self.transactional_id)
                return out
            except UnsupportedApiError:
                self._stable = False
                log.warning("session %s: the group coordinator has no require_stable (OffsetFetch < v7, before "
                            "KIP-447); using the 200 ms heuristic after each commit (seed 003)", self.transactional_id)
        return await fetch_offsets(cluster, gid, parts)

    async def committed(self, partitions: Iterable[tuple[str, int]],
                        timeout: float | None = None) -> dict[tuple[str, int], Any]:
        """The group's committed offsets (``OffsetAndMetadata`` or None), stable ones where the broker can."""
        return await fetch_offsets(self._offsets_cluster, self._member.group_id, list(partitions),
                                   require_stable=self._stable is not False, timeout=timeout)

    async def _seek_committed(self, parts: list[tuple[str, int]], keep: list[tuple[str, int]]) -> None:
        committed = await self._committed(parts) if parts else {}
        reset = {"earliest": EARLIEST, "latest": LATEST}.get(self.config["auto.offset.reset"], -1001)
        items: list[tuple[str, int] | tuple[str, int, int]] = list(keep)
        for tp in parts:
            om = committed.get(tp)
            items.append((tp[0], tp[1], om.offset if om is not None else reset))
        self._consumer.assign(items)

    async def _rewind(self) -> None:
        owned = self._member.assignment
        try:
            await self._seek_committed(owned, [])
        except KafkaError as exc:
            log.info("session %s: rewinding failed (%s); rejoining the group", self.transactional_id, exc)
            self._consumer.assign([])
            self._member.request_rejoin("rewind after abort failed")

    async def _on_assign(self, parts: list[tuple[str, int]]) -> None:
        keep = [(t.topic, t.partition) for t in self._consumer.assignment() if (t.topic, t.partition) not in parts]
        await self._seek_committed(list(parts), keep)

    async def _gone(self, parts: list[tuple[str, int]], cause: str) -> None:
        if not parts:
            return
        async with self._lock:  # seed 003: an in-flight EndTxn finishes (or hangs) before the partitions move
            if self._in_txn and self._abort_cause is None:
                self._abort_cause = cause
                log.info("session %s: partitions %s %s during a transaction: it will abort", self.transactional_id,
                         parts, cause)
            gone = set(parts)
            self._consumer.assign([(t.topic, t.partition) for t in self._consumer.assignment()
                                   if (t.topic, t.partition) not in gone])

    async def _on_revoke(self, parts: list[tuple[str, int]]) -> None:
        await self._gone(parts, "revoked")

    async def _on_lost(self, parts: list[tuple[str, int]]) -> None:
        await self._gone(parts, "lost")
