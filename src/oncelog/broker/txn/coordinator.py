"""The transaction coordinator (Kafka's TransactionCoordinator with its
TransactionStateManager), sans-IO: the log, the marker writer, the producer
id source and the clock are passed in.

Every state change is prepared as a :class:`~oncelog.broker.txn.state.Transit`
(registered as the transactional id's pending transit, so that concurrent
requests get CONCURRENT_TRANSACTIONS), written to the transaction log and
applied only once the record is durable. A failed write changes nothing and
answers NOT_COORDINATOR (retriable: the client looks the coordinator up again),
as Kafka's TransactionStateManager maps a KAFKA_STORAGE_ERROR of its append;
an add chained on it answers the same (:func:`append_error`).

EndTxn is Kafka's two-phase commit: PrepareCommit/PrepareAbort is written
durably, the client is answered, then a background task writes the markers
(:class:`MarkerWriter`) to every partition of the transaction and, once all
are durable, writes CompleteCommit/CompleteAbort. Partitions whose marker
failed are retried by :meth:`TransactionCoordinator.tick`; after a restart
:meth:`TransactionCoordinator.start` rewrites the markers of every prepared
transaction (the partitions accept a repeated marker).

Transaction versions: a request uses TV2 (KIP-890) when the client sent
EndTxn v5 and the finalized ``transaction_version`` is >= 2: EndTxn then
bumps the epoch (markers carry the bumped epoch; the answer carries the new
id/epoch) and aborts of Empty/Complete* transactions are allowed.
Coordinator-initiated aborts (fence, timeout) use the finalized version.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from oncelog.broker.group import TopicPartition
from oncelog.broker.txn.log import TxnLogError, TxnLogStore
from oncelog.broker.txn.state import (
    EXPIRATION_ALLOWED,
    INT32_MAX,
    MAX_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    PREPARED,
    Transit,
    TxnMetadata,
    TxnState,
    complete,
    is_epoch_exhausted,
    prepare,
)
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.log_dir import log_level

log = logging.getLogger(__name__)

OFFSETS_TP = TopicPartition("__consumer_offsets", 0)

S = TxnState
E = ErrorCode
NONE = int(E.none)


def append_error(exc: BaseException) -> int:
    """The answer for a transaction-log write that failed with ``exc``.

    Kafka's TransactionStateManager maps the append's error by cause:
    UNKNOWN_TOPIC_OR_PARTITION, NOT_ENOUGH_REPLICAS(_AFTER_APPEND) and
    REQUEST_TIMED_OUT to COORDINATOR_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER and
    KAFKA_STORAGE_ERROR to NOT_COORDINATOR, MESSAGE_TOO_LARGE and
    RECORD_LIST_TOO_LARGE to UNKNOWN_SERVER_ERROR. The only way a write fails
    here is the log's own I/O (an fsync error, or the process dying before the
    record is durable): a storage error, so NOT_COORDINATOR."""
    if isinstance(exc, (TxnLogError, OSError)):
        return int(E.not_coordinator)
    return int(E.unknown_server_error)


class _NoProducerId(Exception):
    """A new producer id was needed and none could be had: the next id block's write failed,
    or the data directory is offline (``ProducerIdManager.generate``). The request is answered
    ``code``, as Kafka's handleInitProducerId answers a failed generateProducerId with an error."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_R = TypeVar("_R")


def _answers_no_producer_id(
    result: Callable[[int], _R],
) -> Callable[[Callable[..., Awaitable[_R]]], Callable[..., Awaitable[_R]]]:
    """A request handler that may need a new producer id: a :class:`_NoProducerId` (raised before
    anything changed) is answered ``result(code)`` (NOT_COORDINATOR, say)."""

    def wrap(handler: Callable[..., Awaitable[_R]]) -> Callable[..., Awaitable[_R]]:
        @functools.wraps(handler)
        async def answered(*args: Any, **kwargs: Any) -> _R:
            try:
                return await handler(*args, **kwargs)
            except _NoProducerId as exc:
                return result(exc.code)

        return answered

    return wrap


class MarkerWriter(Protocol):
    async def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        partitions: list[TopicPartition],
        transaction_version: int,
    ) -> dict[TopicPartition, int]: ...


class ProducerIdSource(Protocol):
    def generate(self) -> int: ...


COMPLETION_WAIT_S = 0.1  # see TransactionCoordinator._await_completion, _await_addable and _await_pending_add


async def _wait_notified(waiters: dict[str, list[asyncio.Future[bool]]], tid: str, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``_notify(waiters, tid)``; False on timeout.

    A bare future and a timer (not ``asyncio.wait_for`` on an ``Event``, which
    adds a task and two loop passes): the waiter resumes in the loop pass right
    after the notification, before a group-commit round started in the same pass
    takes its files, so what it appends then can still join that round."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[bool] = loop.create_future()
    waiters.setdefault(tid, []).append(fut)
    timer = loop.call_later(timeout, _expire, fut)
    try:
        return await fut
    finally:
        timer.cancel()
        pending = waiters.get(tid)
        if pending is not None and fut in pending:
            pending.remove(fut)
            if not pending:
                del waiters[tid]


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


def _notify(waiters: dict[str, list[asyncio.Future[bool]]], tid: str) -> None:
    """Wake every ``_wait_notified(waiters, tid)`` waiting now."""
    for fut in waiters.pop(tid, ()):
        if not fut.done():
            fut.set_result(True)


@dataclass(frozen=True)
class TxnConfig:
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000
    abort_timed_out_interval_ms: int = 10_000
    remove_expired_interval_ms: int = 3_600_000
    two_phase_commit_enable: bool = False
    transaction_version: int = 2  # the finalized feature level, 0..2


class InitProducerIdResult(NamedTuple):
    error: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    ongoing_txn_producer_id: int = NO_PRODUCER_ID
    ongoing_txn_producer_epoch: int = NO_PRODUCER_EPOCH


class EndTxnResult(NamedTuple):
    error: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


class TransactionCoordinator:
    def __init__(
        self,
        store: TxnLogStore,
        markers: MarkerWriter,
        producer_ids: ProducerIdSource,
        clock: Callable[[], int],
        config: TxnConfig,
        coordinator_epoch: int,
    ) -> None:
        self._store = store
        self._markers = markers
        self._ids = producer_ids
        self._clock = clock
        self.config = config
        self.coordinator_epoch = coordinator_epoch
        self.active = False
        self._txns: dict[str, TxnMetadata] = {}
        self._pending: dict[str, Transit] = {}
        self._by_pid: dict[int, str] = {}
        self._markers_done: dict[str, set[TopicPartition]] = {}
        self._completing: set[str] = set()
        self._completed: dict[str, list[asyncio.Future[bool]]] = {}  # woken when _send_markers ends
        self._written: dict[str, list[asyncio.Future[bool]]] = {}  # woken when a pending transit's write ends
        self._addable: dict[str, list[asyncio.Future[bool]]] = {}  # woken when Complete* is logged (or given up)
        # pending transits an add may be chained on (see add_partitions): adds and Complete*
        self._chainable: dict[str, Transit] = {}
        self._in_write: set[int] = set()  # id() of the transits whose write has not ended yet
        # the last failed write of each id and its answer: what an add chained on it answers
        self._failed: dict[str, tuple[Transit, int]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.task_errors: list[BaseException] = []  # unexpected failures of background marker tasks
        self._next_abort_check = 0
        self._next_expire_check = 0

    # -- lifecycle --------------------------------------------------------------

    async def start(self) -> None:
        """Load every transactional id from the log and complete the prepared transactions."""
        self._txns = dict(self._store.load())
        self._by_pid = {}
        for md in self._txns.values():
            self._index(md)
        self.active = True
        log.info("transaction coordinator epoch %d loaded %d transactional ids", self.coordinator_epoch, len(self._txns))
        for tid in [t for t, md in self._txns.items() if md.state in PREPARED]:
            await self._send_markers(tid)

    async def drain(self) -> None:
        """Wait for the background marker tasks (tests, clean shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def close(self) -> None:
        self.active = False
        for task in list(self._tasks):
            task.cancel()

    def metadata(self, transactional_id: str) -> TxnMetadata | None:
        return self._txns.get(transactional_id)

    def all_metadata(self) -> dict[str, TxnMetadata]:
        return dict(self._txns)

    def pending_transit(self, transactional_id: str) -> Transit | None:
        return self._pending.get(transactional_id)

    @property
    def _server_tv2(self) -> bool:
        return self.config.transaction_version >= 2

    # -- state changes ----------------------------------------------------------

    def _index(self, md: TxnMetadata) -> None:
        self._by_pid[md.producer_id] = md.transactional_id
        if md.next_producer_id >= 0:
            self._by_pid[md.next_producer_id] = md.transactional_id

    def _unindex(self, md: TxnMetadata) -> None:
        for pid in (md.producer_id, md.next_producer_id):
            if self._by_pid.get(pid) == md.transactional_id:
                del self._by_pid[pid]

    async def _write(self, transit: Transit, chainable: bool = False, chained: bool = False) -> int:
        """Log ``transit.target`` (a tombstone for Dead) and apply it once durable.

        ``chained``: ``transit`` starts from the target of the pending transit (an
        add or a Complete*, registered ``chainable``) instead of from the applied
        metadata; its record follows that one in the log, so it is durable only
        after it (often in the same group-commit round), and it is applied right
        after it. If that transit failed, this one fails too (nothing applied).
        """
        tid = transit.source.transactional_id
        pending = self._pending.get(tid)
        if chained:
            if pending is None or pending.target is not transit.source or self._chainable.get(tid) is not pending:
                return int(E.concurrent_transactions)
        elif pending is not None:
            return int(E.concurrent_transactions)
        before = pending if chained else None
        was_chainable = before is not None and self._chainable.get(tid) is before
        self._pending[tid] = transit
        if chainable:
            self._chainable[tid] = transit
        else:
            self._chainable.pop(tid, None)
        self._in_write.add(id(transit))
        try:
            await self._store.write(tid, None if transit.state is S.DEAD else transit.target)
        except (TxnLogError, OSError) as exc:
            log.log(log_level(exc, logging.WARNING), "transaction log write for %r (%s) failed: %s", tid,
                    transit.state.display_name, exc)
            code = append_error(exc)
            self._failed[tid] = (transit, code)
            return code
        finally:
            self._in_write.discard(id(transit))
            if self._pending.get(tid) is transit:
                if before is not None and id(before) in self._in_write:
                    # this chained write ended early (its request was cancelled: the client's connection
                    # closed) while the write it is chained on is still going: that one is pending again,
                    # so a retry is chained on it (or told CONCURRENT_TRANSACTIONS) instead of being built
                    # from the applied metadata and appended behind it unchained
                    self._pending[tid] = before
                    if was_chainable:
                        self._chainable[tid] = before
                else:
                    del self._pending[tid]
            if self._chainable.get(tid) is transit:
                del self._chainable[tid]
            # waiters resume only after this coroutine's next await: the transit is applied by then
            _notify(self._written, tid)
        current = self._txns.get(tid)
        if chained and current is not transit.source:
            # the transit this one was chained on failed (or was never applied): neither is applied.
            # Its record follows that one's in the log, so had it been appended on its own then it
            # would have failed the same way: it answers what that write answered (retriable
            # COORDINATOR_NOT_AVAILABLE when that write did not fail but ended otherwise, cancelled)
            failed = self._failed.get(tid)
            code = failed[1] if failed is not None and failed[0] is before else int(E.coordinator_not_available)
            log.warning("transaction log write for %r (%s) failed: the write before it failed", tid, transit.state.display_name)
            return code
        self._failed.pop(tid, None)
        new = complete(current, transit)
        if current is not None:
            self._unindex(current)
        if new.state is S.DEAD:
            self._txns.pop(tid, None)
            self._markers_done.pop(tid, None)
        else:
            self._txns[tid] = new
            self._index(new)
        return NONE

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            assert exc is not None
            self.task_errors.append(exc)
            log.error("transaction coordinator task failed", exc_info=exc)

    # -- InitProducerId ---------------------------------------------------------

    def _new_producer_id(self) -> int:
        try:
            return self._ids.generate()
        except OSError as exc:  # the block's write failed (the directory went offline), or it is offline
            log.log(log_level(exc, logging.ERROR), "no new producer id: %s", exc)
            raise _NoProducerId(append_error(exc)) from None

    @_answers_no_producer_id(InitProducerIdResult)  # NOT_COORDINATOR, as for the idempotent InitProducerId
    async def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        producer_id: int = -1,
        producer_epoch: int = -1,
        enable_2pc: bool = False,
        keep_prepared_txn: bool = False,
    ) -> InitProducerIdResult:
        if not self.active:
            return InitProducerIdResult(int(E.coordinator_not_available))
        if not transactional_id:
            return InitProducerIdResult(int(E.invalid_request))
        if enable_2pc and not self.config.two_phase_commit_enable:
            return InitProducerIdResult(int(E.transactional_id_authorization_failed))
        if not enable_2pc and not 0 < timeout_ms <= self.config.transaction_max_timeout_ms:
            return InitProducerIdResult(int(E.invalid_transaction_timeout))
        if (producer_id < 0) != (producer_epoch < 0):
            return InitProducerIdResult(int(E.invalid_request))
        expected = (producer_id, producer_epoch) if producer_id >= 0 else None
        timeout = INT32_MAX if enable_2pc else timeout_ms
        tid = transactional_id
        await self._await_completion(tid)
        if tid in self._pending:
            return InitProducerIdResult(int(E.concurrent_transactions))
        now = self._clock()
        md = self._txns.get(tid)
        if md is None:
            md = TxnMetadata(tid, producer_id=self._new_producer_id(), timeout_ms=timeout, last_update_ms=now)
        if expected is not None and not (
            md.producer_epoch == NO_PRODUCER_EPOCH
            or expected[0] == md.producer_id
            or (expected[0] == md.previous_producer_id and is_epoch_exhausted(expected[1]))
        ):
            return InitProducerIdResult(int(E.producer_fenced))

        if md.state in PREPARED:
            return InitProducerIdResult(int(E.concurrent_transactions))
        if md.state is S.ONGOING:
            if keep_prepared_txn:
                return await self._keep_prepared(md, now)
            # fence the current producer and abort its transaction; the client retries and gets a second bump
            err = (await self._fence_and_abort(md)).error
            return InitProducerIdResult(int(E.concurrent_transactions) if err == NONE else err)

        # Empty, CompleteCommit, CompleteAbort
        fresh: dict[str, Any] = dict(
            state=S.EMPTY,
            timeout_ms=timeout,
            two_phase_commit=enable_2pc,
            partitions=frozenset(),
            txn_start_ms=-1,
            last_update_ms=now,
            next_producer_id=NO_PRODUCER_ID,
            next_producer_epoch=NO_PRODUCER_EPOCH,
        )
        if is_epoch_exhausted(md.producer_epoch) and (expected is None or expected[1] == md.producer_epoch):
            transit = prepare(
                md,
                producer_id=self._new_producer_id(),
                producer_epoch=0,
                last_producer_epoch=md.producer_epoch if expected is not None else NO_PRODUCER_EPOCH,
                **fresh,
            )
        elif expected is None:
            transit = prepare(md, producer_epoch=md.producer_epoch + 1, last_producer_epoch=NO_PRODUCER_EPOCH, **fresh)
        elif md.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == md.producer_epoch:
            transit = prepare(md, producer_epoch=md.producer_epoch + 1, last_producer_epoch=md.producer_epoch, **fresh)
        elif expected[1] == md.last_producer_epoch:
            # a retry of a bump whose answer was lost: the current epoch again
            transit = prepare(md, **fresh)
        else:
            return InitProducerIdResult(int(E.producer_fenced))
        err = await self._write(transit)
        if err != NONE:
            return InitProducerIdResult(err)
        return InitProducerIdResult(NONE, transit.target.producer_id, transit.target.producer_epoch)

    async def _keep_prepared(self, md: TxnMetadata, now: int) -> InitProducerIdResult:
        """KIP-939: keep the Ongoing transaction; the new client gets a higher epoch, the txn keeps its own."""
        epoch = md.client_epoch
        if is_epoch_exhausted(epoch):
            if not self._server_tv2:
                # TV1 markers and completion carry the client's id: no room for a second one
                log.warning("%r: cannot keep the prepared transaction, the epoch is exhausted (TV1)", md.transactional_id)
                return InitProducerIdResult(int(E.invalid_txn_state))
            # the client's epochs ran out: it gets a new producer id at epoch 0; the kept transaction keeps
            # its own id and epoch (its markers use them, see _end_tv2)
            transit = prepare(md, next_producer_id=self._new_producer_id(), next_producer_epoch=0, last_update_ms=now)
        else:
            transit = prepare(md, next_producer_epoch=epoch + 1, last_update_ms=now)
        err = await self._write(transit)
        if err != NONE:
            return InitProducerIdResult(err)
        new = transit.target
        return InitProducerIdResult(NONE, new.client_producer_id, new.client_epoch, md.producer_id, md.producer_epoch)

    async def _fence_and_abort(self, md: TxnMetadata) -> EndTxnResult:
        """Kafka's PrepareEpochFence: bump the epoch (never returned to a client) and abort with it."""
        fence_epoch = md.client_epoch if md.client_epoch >= MAX_EPOCH else md.client_epoch + 1
        return await self._end(md.transactional_id, md.producer_id, fence_epoch, False, self._server_tv2, fence=True)

    # -- AddPartitionsToTxn / AddOffsetsToTxn -----------------------------------

    def _check_producer(self, md: TxnMetadata | None, producer_id: int, producer_epoch: int) -> int | None:
        if md is None:
            return int(E.invalid_producer_id_mapping)
        if producer_id != md.client_producer_id:
            if md.state in PREPARED and producer_id == md.next_producer_id and producer_epoch == 0:
                return int(E.concurrent_transactions)  # TV2 rotation answered; markers still being written
            return int(E.invalid_producer_id_mapping)
        if producer_epoch != md.client_epoch:
            return int(E.producer_fenced)
        return None

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[TopicPartition],
        verify_only: bool = False,
        client_tv2: bool = False,
    ) -> dict[TopicPartition, int]:
        tps = [TopicPartition(*tp) for tp in partitions]

        def every(code: int) -> dict[TopicPartition, int]:
            return {tp: code for tp in tps}

        if not self.active:
            return every(int(E.coordinator_not_available))
        if not transactional_id:
            return every(int(E.invalid_request))
        if verify_only:
            md = self._txns.get(transactional_id)
            err = self._check_producer(md, producer_id, producer_epoch)
            if err is not None:
                return every(err)
            assert md is not None
            if md.state in PREPARED:
                return every(int(E.concurrent_transactions))
            inside = md.partitions if md.state is S.ONGOING and not md.kept_prepared else frozenset()
            return {tp: NONE if tp in inside else int(E.invalid_txn_state) for tp in tps}
        await self._await_addable(transactional_id)
        chain = self._chain_base(transactional_id)

        def already_adding() -> bool:
            return chain is not None and chain.state is S.ONGOING and set(tps) <= chain.target.partitions

        pending = self._pending.get(transactional_id)
        if already_adding() or (chain is None and pending is not None and pending.state is S.ONGOING):
            # the pending add already adds these partitions (answered once it is durable), or a
            # pending transit an add cannot be chained on: wait for its write first
            await self._await_pending_add(transactional_id)
            chain = self._chain_base(transactional_id)
            if already_adding():
                return every(int(E.concurrent_transactions))  # still not durable after the short wait
        base = chain.target if chain is not None else self._txns.get(transactional_id)
        err = self._check_producer(base, producer_id, producer_epoch)
        if err is not None:
            return every(err)
        assert base is not None
        if chain is None and (transactional_id in self._pending or base.state in PREPARED):
            return every(int(E.concurrent_transactions))
        if base.kept_prepared:
            return every(int(E.invalid_txn_state))  # a kept (KIP-939) transaction can only be completed
        if base.state is S.ONGOING and set(tps) <= base.partitions:
            return every(NONE)
        now = self._clock()
        transit = prepare(
            base,
            state=S.ONGOING,
            partitions=base.partitions | set(tps),
            txn_start_ms=now if base.state is not S.ONGOING else base.txn_start_ms,
            last_update_ms=now,
            client_transaction_version=2 if (client_tv2 and self._server_tv2) else 0,
        )
        return every(await self._write(transit, chainable=True, chained=chain is not None))

    async def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str, client_tv2: bool = False
    ) -> int:
        result = await self.add_partitions(transactional_id, producer_id, producer_epoch, [OFFSETS_TP], client_tv2=client_tv2)
        return result[OFFSETS_TP]

    async def add_partition_implicitly(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> int:
        """TV2 (Produce v12+): the first produce to ``tp`` adds it to the producer's transaction."""
        tp = TopicPartition(*tp)
        return (await self.add_partitions_implicitly(producer_id, producer_epoch, [tp]))[tp]

    async def add_partitions_implicitly(
        self, producer_id: int, producer_epoch: int, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """TV2: every partition a request adds implicitly, in one transaction log write
        (one pending transit), so they do not compete with each other for it."""
        tps = [TopicPartition(*tp) for tp in partitions]
        tid = self._by_pid.get(producer_id)
        if tid is None:
            return {tp: int(E.invalid_producer_id_mapping) for tp in tps}
        return await self.add_partitions(tid, producer_id, producer_epoch, tps, client_tv2=True)

    def check_in_txn(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> int | None:
        """None when ``producer_id``'s transaction is Ongoing at this epoch and contains ``tp``; else the error."""
        tid = self._by_pid.get(producer_id)
        md = None if tid is None else self._txns.get(tid)
        if md is None:
            return int(E.invalid_producer_id_mapping)
        if md.client_producer_id != producer_id:
            if md.state in PREPARED and producer_id == md.next_producer_id and producer_epoch == 0:
                # TV2 rotation answered (the epoch was exhausted): the next transaction's first batch
                # waits for the markers like any other (retriable), instead of failing its transaction
                return int(E.concurrent_transactions)
            return int(E.invalid_producer_id_mapping)
        if producer_epoch != md.client_epoch:
            return int(E.invalid_producer_epoch)
        if md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            # being completed: retriable, as Kafka's verification answers (Produce maps it to NOT_ENOUGH_REPLICAS)
            return int(E.concurrent_transactions)
        if md.kept_prepared or md.state is not S.ONGOING or TopicPartition(*tp) not in md.partitions:
            return int(E.invalid_txn_state)
        return None

    def transactional_id_of(self, producer_id: int) -> str | None:
        return self._by_pid.get(producer_id)

    # -- EndTxn -----------------------------------------------------------------

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool, client_tv2: bool
    ) -> EndTxnResult:
        if not self.active:
            return EndTxnResult(int(E.coordinator_not_available))
        if not transactional_id:
            return EndTxnResult(int(E.invalid_request))
        tv2 = client_tv2 and self._server_tv2
        return await self._end(transactional_id, producer_id, producer_epoch, commit, tv2, fence=False)

    @_answers_no_producer_id(EndTxnResult)  # TV2's next producer id (epoch exhausted): nothing changed
    async def _end(self, tid: str, pid: int, epoch: int, commit: bool, tv2: bool, fence: bool) -> EndTxnResult:
        md = self._txns.get(tid)
        if md is None:
            return EndTxnResult(int(E.invalid_producer_id_mapping))
        decision = self._end_tv2(md, pid, epoch, commit, fence) if tv2 else self._end_tv1(md, pid, epoch, commit, fence)
        if isinstance(decision, EndTxnResult):
            return decision
        transit = decision
        err = await self._write(transit)
        if err != NONE:
            return EndTxnResult(err)
        self._spawn(self._send_markers(tid))
        if not tv2:
            return EndTxnResult(NONE)
        target = transit.target
        if target.next_producer_id >= 0:
            return EndTxnResult(NONE, target.next_producer_id, 0)
        return EndTxnResult(NONE, target.producer_id, target.producer_epoch)

    def _invalid_state(self, md: TxnMetadata, commit: bool) -> EndTxnResult:
        log.info("%r is %s: %s is not allowed", md.transactional_id, md.state.display_name, "commit" if commit else "abort")
        return EndTxnResult(int(E.invalid_txn_state))

    def _end_tv1(self, md: TxnMetadata, pid: int, epoch: int, commit: bool, fence: bool) -> Transit | EndTxnResult:
        if pid != md.producer_id:
            return EndTxnResult(int(E.invalid_producer_id_mapping))
        if (not fence and epoch != md.client_epoch) or epoch < md.client_epoch:
            return EndTxnResult(int(E.producer_fenced))
        if md.transactional_id in self._pending:
            return EndTxnResult(int(E.concurrent_transactions))
        st = md.state
        if st is S.ONGOING:
            via = (S.PREPARE_EPOCH_FENCE,) if fence else ()
            return prepare(
                md,
                via=via,
                state=S.PREPARE_COMMIT if commit else S.PREPARE_ABORT,
                producer_epoch=epoch,
                last_producer_epoch=NO_PRODUCER_EPOCH if fence else md.last_producer_epoch,
                next_producer_id=NO_PRODUCER_ID,
                next_producer_epoch=NO_PRODUCER_EPOCH,
                last_update_ms=self._clock(),
                client_transaction_version=0,
            )
        return self._end_other_state(md, commit, retry=True)

    def _end_other_state(self, md: TxnMetadata, commit: bool, retry: bool) -> EndTxnResult:
        st = md.state
        if st is S.COMPLETE_COMMIT and commit and retry or st is S.COMPLETE_ABORT and not commit and retry:
            return EndTxnResult(NONE, md.producer_id, md.producer_epoch)
        if st is S.PREPARE_COMMIT and commit or st is S.PREPARE_ABORT and not commit:
            return EndTxnResult(int(E.concurrent_transactions))
        return self._invalid_state(md, commit)

    def _end_tv2(self, md: TxnMetadata, pid: int, epoch: int, commit: bool, fence: bool) -> Transit | EndTxnResult:
        st = md.state
        retry_on_overflow = (
            not fence and md.previous_producer_id == pid and epoch == MAX_EPOCH - 1 and md.producer_epoch == 0
        )
        retry_on_bump = not fence and md.producer_epoch == epoch + 1
        if fence:
            valid = epoch >= md.client_epoch
        elif st in (S.ONGOING, S.EMPTY):
            valid = epoch == md.client_epoch
        elif st in PREPARED:
            valid = retry_on_bump
        else:
            valid = retry_on_bump or retry_on_overflow or epoch == md.producer_epoch
        is_retry = retry_on_bump or retry_on_overflow
        # a kept (KIP-939) transaction whose client was given a new id: the client ends it with that id
        kept_new_id = st is S.ONGOING and md.kept_prepared and md.client_producer_id != md.producer_id
        if (md.producer_id if fence else md.client_producer_id) != pid and not retry_on_overflow:
            return EndTxnResult(int(E.invalid_producer_id_mapping))
        if not valid:
            return EndTxnResult(int(E.producer_fenced))
        if md.transactional_id in self._pending:
            return EndTxnResult(int(E.concurrent_transactions))

        def prepare_end(state: TxnState, no_partitions: bool) -> Transit | EndTxnResult:
            base_epoch = epoch if fence else md.client_epoch
            if kept_new_id:
                # the markers go out with the transaction's own id, above the epoch of its batches
                # (at most 32766: a client never holds 32767); completion moves to a fresh id, as
                # the client's id and epoch are on another producer id than the markers'
                new_epoch = md.producer_epoch + 1
                base_epoch = md.producer_epoch
                next_pid = self._new_producer_id()
            elif base_epoch >= MAX_EPOCH and state is S.PREPARE_ABORT:
                new_epoch = base_epoch  # already broken: abort without overflowing, as Kafka does
            elif base_epoch >= MAX_EPOCH:
                return self._invalid_state(md, commit)
            else:
                new_epoch = base_epoch + 1
            if not kept_new_id:
                next_pid = self._new_producer_id() if not fence and is_epoch_exhausted(base_epoch) else NO_PRODUCER_ID
            now = self._clock()
            return prepare(
                md,
                via=(S.PREPARE_EPOCH_FENCE,) if fence else (),
                state=state,
                producer_epoch=new_epoch,
                last_producer_epoch=base_epoch,
                next_producer_id=next_pid,
                next_producer_epoch=NO_PRODUCER_EPOCH,
                partitions=frozenset() if no_partitions else md.partitions,
                txn_start_ms=now if no_partitions else md.txn_start_ms,
                last_update_ms=now,
                client_transaction_version=2,
            )

        if st is S.ONGOING:
            return prepare_end(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, False)
        if st is S.EMPTY:
            return prepare_end(S.PREPARE_ABORT, True) if not commit else self._invalid_state(md, commit)
        if st is S.COMPLETE_COMMIT and not commit and not is_retry:
            return prepare_end(S.PREPARE_ABORT, True)
        if st is S.COMPLETE_ABORT and not commit and not is_retry:
            return prepare_end(S.PREPARE_ABORT, True)
        return self._end_other_state(md, commit, retry=is_retry)

    # -- markers and completion -------------------------------------------------

    async def _send_markers(self, tid: str) -> None:
        """Write the markers of a prepared transaction; once all are durable, write Complete*."""
        if tid in self._completing:
            return
        self._completing.add(tid)
        try:
            md = self._txns.get(tid)
            if md is None or md.state not in PREPARED:
                return
            commit = md.state is S.PREPARE_COMMIT
            done = self._markers_done.setdefault(tid, set())
            todo = sorted(md.partitions - done)
            if todo:
                try:
                    errors = await self._markers.write_markers(
                        md.producer_id, md.producer_epoch, self.coordinator_epoch, commit, todo, md.client_transaction_version
                    )
                except Exception as exc:  # the writer's own failure: retried by tick
                    log.warning("writing markers for %r failed: %s", tid, exc)
                    errors = {}
                for tp in todo:
                    code = errors.get(tp, int(E.unknown_server_error))
                    if code in (NONE, int(E.unknown_topic_or_partition)):
                        done.add(tp)
                    else:
                        log.info("marker for %r on %s failed with %d; will retry", tid, tp, code)
            if md.partitions - done or self._txns.get(tid) is not md:
                return
            rotated = md.is_tv2 and md.next_producer_id >= 0
            transit = prepare(
                md,
                state=S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT,
                producer_id=md.next_producer_id if rotated else md.producer_id,
                producer_epoch=0 if rotated else md.producer_epoch,
                next_producer_id=NO_PRODUCER_ID,
                partitions=frozenset(),
                last_update_ms=self._clock(),
            )
            # adds waiting for this transaction to complete resume in the next loop pass, with
            # Complete* pending (appended right now by _write): they chain their record on it
            _notify(self._addable, tid)
            if await self._write(transit, chainable=True) == NONE:
                self._markers_done.pop(tid, None)
        finally:
            self._completing.discard(tid)
            _notify(self._completed, tid)
            _notify(self._addable, tid)

    async def _await_completion(self, tid: str) -> None:
        """Markers of a prepared transaction (being written, or about to be)
        finish within a few fsync rounds: a request that
        arrives meanwhile waits up to COMPLETION_WAIT_S for them instead of
        being answered CONCURRENT_TRANSACTIONS at once (the client would only
        retry after its backoff). The rules are unchanged: once the wait is
        over the request is decided on the state it finds."""
        md = self._txns.get(tid)
        if md is None or md.state not in PREPARED:
            return
        await _wait_notified(self._completed, tid, COMPLETION_WAIT_S)

    def _chain_base(self, tid: str) -> Transit | None:
        """The pending transit of ``tid`` an add may be chained on (an add or a Complete*), if any."""
        pending = self._pending.get(tid)
        return pending if pending is not None and self._chainable.get(tid) is pending else None

    async def _await_addable(self, tid: str) -> None:
        """An add (AddPartitionsToTxn, AddOffsetsToTxn, TV2's implicit adds) that
        arrives while the transaction's markers are being written waits up to
        COMPLETION_WAIT_S, but only until the markers are durable and Complete*
        is being logged: the add is then chained on it (see add_partitions), its
        record written right behind it. Afterwards the add is decided on the
        state it finds, as before (so CONCURRENT_TRANSACTIONS if the markers
        failed or are slower)."""
        md = self._txns.get(tid)
        if tid in self._pending or md is None or md.state not in PREPARED:
            return
        await _wait_notified(self._addable, tid, COMPLETION_WAIT_S)

    async def _await_pending_add(self, tid: str) -> None:
        """Wait up to COMPLETION_WAIT_S (one fsync round is enough) for the pending add of ``tid`` to
        be durable: an add of partitions that the pending add is already adding is answered then."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COMPLETION_WAIT_S
        while (transit := self._pending.get(tid)) is not None and transit.state is S.ONGOING:
            remaining = deadline - loop.time()
            if remaining <= 0 or not await _wait_notified(self._written, tid, remaining):
                return

    # -- timers -----------------------------------------------------------------

    async def tick(self) -> None:
        """Abort timed-out transactions, expire idle transactional ids, retry pending markers."""
        if not self.active:
            return
        now = self._clock()
        if now >= self._next_abort_check:
            self._next_abort_check = now + self.config.abort_timed_out_interval_ms
            for tid in list(self._txns):
                md = self._txns.get(tid)
                if md is not None and md.timed_out(now) and tid not in self._pending:
                    log.info("aborting %r: open for more than %d ms", tid, md.timeout_ms)
                    await self._fence_and_abort(md)
        if now >= self._next_expire_check:
            self._next_expire_check = now + self.config.remove_expired_interval_ms
            # a failed write's answer matters only to a write chained on it, which is pending until it has
            # read it: for an id with no write pending it is dropped (an id whose first write failed, or
            # that never writes again, would keep it for ever)
            for tid in [t for t in self._failed if t not in self._pending]:
                del self._failed[tid]
            horizon = now - self.config.transactional_id_expiration_ms
            for tid in list(self._txns):
                md = self._txns.get(tid)
                if (
                    md is not None
                    and md.state in EXPIRATION_ALLOWED
                    and tid not in self._pending
                    and md.last_update_ms <= horizon
                ):
                    await self._write(prepare(md, state=S.DEAD, partitions=frozenset()))
        for tid in [t for t, md in self._txns.items() if md.state in PREPARED]:
            if tid not in self._pending:
                await self._send_markers(tid)

    # -- admin (KIP-664) --------------------------------------------------------

    def describe(self, transactional_ids: Iterable[str]) -> list[dict[str, Any]]:
        """DescribeTransactions v0 ``transaction_states`` entries."""
        out = []
        for tid in transactional_ids:
            entry: dict[str, Any] = {
                "error_code": NONE,
                "transactional_id": tid,
                "transaction_state": "",
                "transaction_timeout_ms": 0,
                "transaction_start_time_ms": -1,
                "producer_id": NO_PRODUCER_ID,
                "producer_epoch": NO_PRODUCER_EPOCH,
                "topics": [],
            }
            md = self._txns.get(tid)
            if not self.active:
                entry["error_code"] = int(E.coordinator_not_available)
            elif not tid:
                entry["error_code"] = int(E.invalid_request)
            elif md is None:
                entry["error_code"] = int(E.transactional_id_not_found)
            else:
                topics: dict[str, list[int]] = {}
                for tp in sorted(md.partitions):
                    topics.setdefault(tp.topic, []).append(tp.partition)
                entry.update(
                    transaction_state=md.state.display_name,
                    transaction_timeout_ms=md.timeout_ms,
                    transaction_start_time_ms=md.txn_start_ms,
                    producer_id=md.producer_id,
                    producer_epoch=md.producer_epoch,
                    topics=[{"topic": t, "partitions": ps} for t, ps in topics.items()],
                )
            out.append(entry)
        return out

    def list(
        self, states: Iterable[str] = (), producer_ids: Iterable[int] = (), duration_ms: int = -1, pattern: str | None = None
    ) -> list[dict[str, Any]]:
        """ListTransactions v0-v2 ``transaction_states`` entries (unknown state names match nothing)."""
        want_states = set(states)
        want_pids = set(producer_ids)
        regex = re.compile(pattern) if pattern else None
        now = self._clock()
        out = []
        for tid, md in sorted(self._txns.items()):
            if want_pids and md.producer_id not in want_pids:
                continue
            if want_states and md.state.display_name not in want_states:
                continue
            if duration_ms >= 0 and now - md.txn_start_ms <= duration_ms:
                continue
            if regex is not None and not regex.fullmatch(tid):
                continue
            out.append({"transactional_id": tid, "producer_id": md.producer_id, "transaction_state": md.state.display_name})
        return out

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for md in self._txns.values():
            counts[md.state.display_name] = counts.get(md.state.display_name, 0) + 1
        return f"TransactionCoordinator(epoch={self.coordinator_epoch}, {counts})"


__all__ = [
    "EndTxnResult",
    "InitProducerIdResult",
    "MarkerWriter",
    "OFFSETS_TP",
    "ProducerIdSource",
    "TransactionCoordinator",
    "TxnConfig",
]
