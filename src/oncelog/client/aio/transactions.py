"""Transactions for the producer: Kafka's ``TransactionManager`` semantics on the asyncio core.

Public names (re-exported by :mod:`oncelog.client` and :mod:`oncelog.client.aio`):
:class:`PreparedTxnState` (KIP-939) and :class:`ConsumerGroupMetadata` (KIP-447).

Internal API: :class:`TransactionManager` is owned by a transactional
:class:`~oncelog.client.aio.producer.ProducerCore` (``core.txn``); the
producers' ``init_transactions`` ... ``complete_transaction`` call its
coroutines, and the core's sender calls its hooks:

* ``check_send()`` before a record is accepted (raises outside a transaction);
* ``needs_add(tp)`` before a partition's batch is sent: with transactions v1
  the partition must first be added with AddPartitionsToTxn, batched: every
  partition found missing in one sender pass goes in one request
  (``send_adds()``), as Java's TransactionManager does; with v2 (KIP-890,
  Produce v12) the broker adds it implicitly;
* ``sweep_error()``: while the transaction is aborting or failed, the sender
  fails every batch that is not in flight with it (Java's
  ``abortUndrainedBatches``);
* ``batch_failed(err)``: a record of the transaction failed; the state
  becomes abortable, or fatal for PRODUCER_FENCED and the other errors
  Java treats as fatal.

States are Java's: UNINITIALIZED, INITIALIZING, READY, IN_TRANSACTION,
COMMITTING, ABORTING, ABORTABLE_ERROR, FATAL_ERROR, and KIP-939's
PREPARED. A fatal error makes every later call raise it; an abortable one
makes every call but ``abort_transaction()`` raise it.

Transaction version: v2 when the transaction coordinator's ApiVersions
finalizes ``transaction.version`` >= 2 (checked at ``init_transactions`` and
at each ``begin_transaction``): Produce v12 (implicit adds), EndTxn v5 (its
answer carries the bumped epoch, adopted with sequences restarting at 0),
TxnOffsetCommit v5 without AddOffsetsToTxn. Otherwise v1: Produce <= v11,
AddPartitionsToTxn (<= v3, the client versions), AddOffsetsToTxn, EndTxn
<= v4, TxnOffsetCommit <= v4; after an aborted transaction that lost records
with sequence numbers, InitProducerId (v3+, with the current id and epoch)
bumps the epoch before the next one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from oncelog.client.errors import (
    IllegalStateError,
    InvalidTxnStateError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortedError,
    UnsupportedApiError,
    error_for,
)
from oncelog.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from oncelog.client.aio.producer import ProducerCore

__all__ = ["ConsumerGroupMetadata", "PreparedTxnState", "TransactionManager", "TxnState"]

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
INIT_PRODUCER_ID_VERSIONS = (0, 6)
ADD_PARTITIONS_VERSIONS = (0, 3)  # v4+ is the brokers' batched form
ADD_OFFSETS_VERSIONS = (0, 4)
GROUP_KEY, TXN_KEY = 0, 1
ADD_PARTITIONS_RETRY_BACKOFF = 0.02


def _c(name: str) -> int:
    return int(getattr(ErrorCode, name).value)


NONE = 0
NOT_COORDINATOR = _c("not_coordinator")
COORDINATOR_NOT_AVAILABLE = _c("coordinator_not_available")
COORDINATOR_LOAD_IN_PROGRESS = _c("coordinator_load_in_progress")
CONCURRENT_TRANSACTIONS = _c("concurrent_transactions")
REQUEST_TIMED_OUT = _c("request_timed_out")
UNKNOWN_TOPIC_OR_PARTITION = _c("unknown_topic_or_partition")
INVALID_PRODUCER_EPOCH = _c("invalid_producer_epoch")
PRODUCER_FENCED = _c("producer_fenced")
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = _c("transactional_id_authorization_failed")
CLUSTER_AUTHORIZATION_FAILED = _c("cluster_authorization_failed")
GROUP_AUTHORIZATION_FAILED = _c("group_authorization_failed")
TOPIC_AUTHORIZATION_FAILED = _c("topic_authorization_failed")
INVALID_TXN_STATE = _c("invalid_txn_state")
UNKNOWN_PRODUCER_ID = _c("unknown_producer_id")
INVALID_PRODUCER_ID_MAPPING = _c("invalid_producer_id_mapping")
OPERATION_NOT_ATTEMPTED = _c("operation_not_attempted")
TRANSACTION_ABORTABLE = _c("transaction_abortable")
FENCED_INSTANCE_ID = _c("fenced_instance_id")
UNKNOWN_MEMBER_ID = _c("unknown_member_id")
ILLEGAL_GENERATION = _c("illegal_generation")
UNSUPPORTED_VERSION = _c("unsupported_version")
UNSUPPORTED_FOR_MESSAGE_FORMAT = _c("unsupported_for_message_format")

# produce errors that make a transactional producer fatal (Java's maybeTransitionToErrorState)
FATAL_PRODUCE = frozenset({CLUSTER_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, PRODUCER_FENCED,
                           UNSUPPORTED_VERSION})
REFIND = frozenset({NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE})
RETRY = frozenset({COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS})


class TxnState(Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING = "COMMITTING_TRANSACTION"
    ABORTING = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"
    PREPARED = "PREPARED_TRANSACTION"


S = TxnState


@dataclass(frozen=True, slots=True)
class PreparedTxnState:
    """The producer id and epoch of a prepared (KIP-939) transaction.

    ``str(state)`` is ``"<producer id>:<epoch>"`` (the empty string for no
    transaction) and :meth:`from_string` reads it back, as Kafka 4.1's
    ``PreparedTxnState``: a participant prepares and hands the string to
    whoever decides; that side calls ``complete_transaction(
    PreparedTxnState.from_string(s))``.
    """

    producer_id: int = -1
    epoch: int = -1

    @classmethod
    def from_string(cls, s: str | None) -> "PreparedTxnState":
        """Parse ``str(state)``; raises ValueError on anything else."""
        if s is None or s == "":
            return cls()
        parts = s.split(":")
        if len(parts) != 2:
            raise ValueError(f"invalid serialized transaction state {s!r} (expected producerId:epoch)")
        try:
            pid, epoch = int(parts[0]), int(parts[1])
        except ValueError:
            raise ValueError(f"invalid serialized transaction state {s!r} (expected producerId:epoch)") from None
        if pid < 0 or not 0 <= epoch <= 32767:
            raise ValueError(f"invalid producer id and epoch {s!r}: both must be >= 0")
        return cls(pid, epoch)

    def has_transaction(self) -> bool:
        """False for the empty state (nothing was prepared)."""
        return self.producer_id != -1

    def __str__(self) -> str:
        return f"{self.producer_id}:{self.epoch}" if self.has_transaction() else ""


@dataclass(frozen=True)
class ConsumerGroupMetadata:
    """What ``send_offsets_to_transaction`` needs of a consumer group (KIP-447 fencing).

    A consumer in a group returns it (``consumer.group_metadata()``); built
    from a group id alone it has generation -1 and no member id, which the
    coordinator accepts without generation fencing, as in Kafka.
    """

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


def group_metadata_of(value: Any) -> ConsumerGroupMetadata:
    """A :class:`ConsumerGroupMetadata` from a group id, a mapping or any object with the same attributes."""
    if isinstance(value, ConsumerGroupMetadata):
        if value.generation_id > 0 and not value.member_id:
            raise ValueError(f"group metadata {value} has a generation but no member id")
        return value
    if isinstance(value, str):
        if not value:
            raise ValueError("group id must not be empty")
        return ConsumerGroupMetadata(value)
    if isinstance(value, Mapping):
        get = value.get
    else:
        def get(k: str, d: Any = None) -> Any:
            return getattr(value, k, d)
    gid = get("group_id")
    if not isinstance(gid, str) or not gid:
        raise ValueError(f"group metadata without a group id: {value!r}")
    meta = ConsumerGroupMetadata(gid, int(get("generation_id", -1)), get("member_id", "") or "",
                                 get("group_instance_id", None))
    if meta.generation_id > 0 and not meta.member_id:
        # Java's throwIfInvalidGroupMetadata: a generation belongs to a member
        raise ValueError(f"group metadata {meta} has a generation but no member id")
    return meta


def offsets_of(offsets: Any) -> dict[tuple[str, int], tuple[int, str | None, int]]:
    """``{(topic, partition): (offset, metadata, leader_epoch)}`` from the accepted shapes.

    A mapping from ``(topic, partition)`` (or a TopicPartition) to an offset,
    to ``(offset, metadata)`` or to an object with ``offset`` (and optional
    ``metadata``, ``leader_epoch``); or, confluent-kafka style, a list of
    TopicPartition objects carrying ``offset``.
    """
    out: dict[tuple[str, int], tuple[int, str | None, int]] = {}
    items: Iterable[tuple[Any, Any]]
    if isinstance(offsets, Mapping):
        items = offsets.items()
    else:
        items = [(tp, tp) for tp in offsets]
    for tp, val in items:
        if isinstance(tp, tuple):
            topic, part = tp[0], tp[1]
        else:
            topic, part = tp.topic, tp.partition
        meta: str | None = None
        epoch = -1
        if isinstance(val, int) and not isinstance(val, bool):
            off = val
        elif isinstance(val, tuple):
            off = int(val[0])
            meta = val[1] if len(val) > 1 else None
        else:
            off = int(val.offset)
            meta = getattr(val, "metadata", None)
            epoch = getattr(val, "leader_epoch", -1)
            epoch = -1 if epoch is None else int(epoch)
        if off < 0:
            raise ValueError(f"invalid offset {off} for {topic}-{part}")
        out[(str(topic), int(part))] = (int(off), meta, epoch)
    return out


class TransactionManager:
    """See the module docstring. Runs on the producer's loop; one transactional call at a time."""

    def __init__(self, core: "ProducerCore") -> None:
        self.core = core
        self.cluster = core.cluster
        cfg = core.config
        self.transactional_id: str = cfg["transactional.id"]
        self.timeout_ms: int = cfg["transaction.timeout.ms"]
        self.enable_2pc: bool = bool(cfg["transaction.two.phase.commit.enable"])
        self.max_block = cfg["max.block.ms"] / 1000
        self.backoff = cfg["retry.backoff.ms"] / 1000
        self.backoff_max = cfg["retry.backoff.max.ms"] / 1000
        self.state = S.UNINITIALIZED
        self.last_error: KafkaError | None = None
        self.tv2 = False
        self.partitions: set[tuple[str, int]] = set()  # in the transaction (v1: added)
        self.new_partitions: set[tuple[str, int]] = set()  # v1: waiting for AddPartitionsToTxn
        self.pending_partitions: set[tuple[str, int]] = set()  # v1: AddPartitionsToTxn in flight
        # something was (or may have been) added to the transaction, so EndTxn must be sent. v2: set by
        # the sender when a Produce was not refused: an EndTxn with the bumped epoch that reaches the
        # coordinator while the previous transaction is still PrepareCommit is answered PRODUCER_FENCED
        self.started = False
        self.bump_required = False  # v1: InitProducerId bumps the epoch after the abort
        self.prepared: PreparedTxnState | None = None
        self._add_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # -- state ---------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        """When a call gives up: ``timeout`` seconds (confluent-kafka's argument), else ``max.block.ms``."""
        return time.monotonic() + (self.max_block if timeout is None or timeout < 0 else timeout)

    def _raise_if_error(self, allow_abortable: bool = False) -> None:
        if self.state is S.FATAL_ERROR:
            assert self.last_error is not None
            raise self.last_error
        if self.state is S.ABORTABLE_ERROR and not allow_abortable:
            assert self.last_error is not None
            raise self.last_error

    def _fatal(self, err: KafkaError) -> KafkaError:
        """Enter FATAL_ERROR with ``err`` (returned, for ``raise``)."""
        if self.state is S.FATAL_ERROR and self.last_error is not None:
            return self.last_error
        err.fatal = True
        self.state = S.FATAL_ERROR
        self.last_error = err
        self.core._fatal = err
        self.core._kick()
        return err

    def _abortable(self, err: KafkaError, bump: bool = False) -> KafkaError:
        """Enter ABORTABLE_ERROR with ``err`` unless already aborting or failed."""
        err.txn_requires_abort = True
        if bump:
            self.bump_required = True
        if self.state in (S.IN_TRANSACTION, S.COMMITTING, S.PREPARED):
            self.state = S.ABORTABLE_ERROR
            self.last_error = err
            self.core._kick()
        return err

    def check_send(self) -> None:
        """Raise unless records may be produced now (Java's failIfNotReadyForSend)."""
        if self.state in (S.ABORTABLE_ERROR, S.FATAL_ERROR):
            self._raise_if_error()
        if self.state is S.UNINITIALIZED or self.state is S.INITIALIZING:
            raise IllegalStateError("cannot produce before init_transactions() completes on a transactional producer")
        if self.state is not S.IN_TRANSACTION:
            raise IllegalStateError(f"cannot produce in state {self.state.value}: call begin_transaction() first")

    def check_send_waited(self) -> None:
        """Raise unless a produce_batch() call made in this transaction, which waited for its topic's
        metadata, may be placed now: still in the transaction, or committing it (commit_transaction()'s
        flush waits for such a call, so it belongs to the transaction being committed)."""
        if self.state in (S.ABORTABLE_ERROR, S.FATAL_ERROR):
            self._raise_if_error()
        if self.state is not S.IN_TRANSACTION and self.state is not S.COMMITTING:
            raise IllegalStateError(f"cannot produce in state {self.state.value}: the transaction ended")

    # -- sender hooks ----------------------------------------------------------------

    def needs_add(self, tp: tuple[str, int]) -> bool:
        """True while ``tp`` may not be sent yet (v1: not added to the transaction)."""
        if self.tv2:
            return False
        if tp in self.partitions:
            return False
        if tp not in self.pending_partitions:
            self.new_partitions.add(tp)
        return True

    def sweep_error(self) -> KafkaError | None:
        """The error to fail unsent batches with, or None while they may be sent."""
        if self.state in (S.ABORTABLE_ERROR, S.FATAL_ERROR):
            return self.last_error
        if self.state is S.ABORTING:
            return self.last_error or TransactionAbortedError("the transaction was aborted")
        return None

    def batch_failed(self, err: KafkaError, sequenced: bool) -> None:
        """A batch of the transaction failed with ``err`` (maybeTransitionToErrorState)."""
        if sequenced:
            self.bump_required = True  # its sequence numbers left a gap
        if isinstance(err, TransactionAbortedError) or err is self.last_error:
            return
        if self.state in (S.UNINITIALIZED, S.READY, S.FATAL_ERROR):
            return
        if err.code in FATAL_PRODUCE:
            if err.code == PRODUCER_FENCED and not isinstance(err, ProducerFencedError):
                err = ProducerFencedError(err.message)
            self._fatal(err)
        else:
            self._abortable(err, bump=True)

    def send_adds(self) -> None:
        """v1: start one AddPartitionsToTxn for every partition found missing (one request in flight)."""
        if self.new_partitions and (self._add_task is None or self._add_task.done()) \
                and self.state in (S.IN_TRANSACTION, S.COMMITTING, S.PREPARED):
            self.pending_partitions |= self.new_partitions
            self.new_partitions = set()
            self._add_task = asyncio.ensure_future(self._add_partitions())

    # -- requests to a coordinator -----------------------------------------------------

    async def _call(self, what: str, key_type: int, key: str, api: int, versions: tuple[int, int],
                    build: Callable[[int], dict[str, Any]], handle: Callable[[Any, int], Any],
                    deadline: float) -> Any:
        """Send to the coordinator of ``key`` until ``handle(resp, version)`` returns a result.

        ``handle`` returns ``("done", value)``, ``("retry", err)`` or
        ``("refind", err)``, or raises (after classifying the error).
        """
        backoff = self.backoff
        cluster = self.cluster
        while True:
            try:
                node = await cluster.coordinator(key_type, key, max(0.1, deadline - time.monotonic()))
                conn = await cluster.connection(node)
                v = conn.version(api, versions)
                resp = await conn.request(api, v, build(v))
            except UnsupportedApiError as exc:
                raise self._fatal(exc) from None
            except KafkaError as exc:
                if exc.retriable:
                    cluster.forget_coordinator(key_type, key)
                    last: KafkaError = exc
                elif exc.code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                    raise self._fatal(exc) from None
                elif exc.code == GROUP_AUTHORIZATION_FAILED:
                    raise self._abortable(exc) from None
                else:
                    raise self._fatal(exc) from None
            else:
                action, value = handle(resp, v)
                if action == "done":
                    return value
                if action == "refind":
                    cluster.forget_coordinator(key_type, key)
                last = value
                if action == "retry_fast" and time.monotonic() + ADD_PARTITIONS_RETRY_BACKOFF < deadline:
                    await asyncio.sleep(ADD_PARTITIONS_RETRY_BACKOFF)
                    continue
            if time.monotonic() + backoff > deadline:
                raise KafkaTimeoutError(f"{what} did not complete in time (max.block.ms or the call's timeout); "
                                        f"last error: {last}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.backoff_max)

    def _txn_common(self, code: int, msg: str | None, what: str) -> tuple[str, Any]:
        """The answer to an error code of InitProducerId/AddOffsetsToTxn/EndTxn (Java's handlers)."""
        err = error_for(code, msg or what)
        if code in REFIND:
            return "refind", err
        if code in RETRY:
            return "retry", err
        if code in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED):
            raise self._fatal(ProducerFencedError(
                f"{what}: another producer with transactional.id {self.transactional_id!r} fenced this one"))
        if code in (UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_ID_MAPPING):
            raise self._abortable(err, bump=True)
        if code == TRANSACTION_ABORTABLE:
            raise self._abortable(err)
        raise self._fatal(err)

    # -- init ----------------------------------------------------------------------------

    def _tv2_now(self, conn_features: dict[str, int]) -> bool:
        return conn_features.get("transaction.version", 0) >= 2

    def _cached_features(self) -> dict[str, int] | None:
        """The finalized features of the open connection to the known coordinator, if there is one."""
        node_id = self.cluster._coordinators.get((TXN_KEY, self.transactional_id))
        node = self.cluster.nodes.get(node_id) if node_id is not None else None
        conn = node.conn if node is not None else None
        return conn.features if conn is not None and not conn.closed else None

    async def _coordinator_features(self) -> dict[str, int]:
        node = await self.cluster.coordinator(TXN_KEY, self.transactional_id, self.max_block)
        conn = await self.cluster.connection(node)
        return conn.features

    async def init_transactions(self, keep_prepared_txn: bool = False, timeout: float | None = None) -> None:
        async with self._lock:
            self._raise_if_error()
            if self.state is S.PREPARED:
                raise IllegalStateError("a prepared transaction must be completed first")
            if self.state not in (S.UNINITIALIZED, S.INITIALIZING):
                raise IllegalStateError(f"init_transactions() was already called (state {self.state.value})")
            self.state = S.INITIALIZING
            core = self.core
            deadline = self._deadline(timeout)

            def build(v: int) -> dict[str, Any]:
                if v < 6 and (self.enable_2pc or keep_prepared_txn):
                    raise UnsupportedApiError("the broker does not support KIP-939 two-phase commit "
                                              f"(InitProducerId v{v} < v6)")
                return {"transactional_id": self.transactional_id, "transaction_timeout": self.timeout_ms,
                        "producer_id": -1, "producer_epoch": -1, "enable2_pc": self.enable_2pc,
                        "keep_prepared_txn": keep_prepared_txn}

            def handle(resp: Any, v: int) -> tuple[str, Any]:
                code = int(resp.error_code)
                if code == NONE:
                    return "done", resp
                if code in (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED):
                    raise self._fatal(error_for(code, "InitProducerId"))
                return self._txn_common(code, None, "InitProducerId")

            try:
                resp = await self._call("init_transactions()", TXN_KEY, self.transactional_id, INIT_PRODUCER_ID,
                                        INIT_PRODUCER_ID_VERSIONS, build, handle, deadline)
            except KafkaTimeoutError:
                raise  # state stays INITIALIZING: calling again resumes
            except KafkaError as exc:
                if self.state is not S.FATAL_ERROR:
                    raise self._fatal(exc) from None
                raise
            core.set_producer(int(resp.producer_id), int(resp.producer_epoch))
            self.tv2 = self._tv2_now(await self._coordinator_features())
            self._reset_txn()
            ongoing = int(getattr(resp, "ongoing_txn_producer_id", -1))
            if keep_prepared_txn and ongoing >= 0:
                self.prepared = PreparedTxnState(ongoing, int(resp.ongoing_txn_producer_epoch))
                self.started = True
                self.state = S.PREPARED
            else:
                self.state = S.READY

    def _reset_txn(self) -> None:
        self.partitions = set()
        self.new_partitions = set()
        self.pending_partitions = set()
        self.started = False
        self.prepared = None
        self.last_error = None

    # -- begin -----------------------------------------------------------------------------

    def begin_transaction(self) -> None:
        self._raise_if_error()
        if self.state is not S.READY:
            raise IllegalStateError(f"cannot begin a transaction in state {self.state.value}"
                                    + (" (call init_transactions() first)" if self.state is S.UNINITIALIZED else ""))
        features = self._cached_features()  # never blocks, as Java's beginTransaction
        if features is not None:
            self.tv2 = self._tv2_now(features)
        self._reset_txn()
        self.state = S.IN_TRANSACTION

    # -- AddPartitionsToTxn (v1) ---------------------------------------------------------------

    async def _add_partitions(self) -> None:
        tps = sorted(self.pending_partitions)
        core = self.core
        deadline = time.monotonic() + max(self.max_block, core.delivery_timeout)

        def build(v: int) -> dict[str, Any]:
            topics: dict[str, list[int]] = {}
            for t, p in tps:
                topics.setdefault(t, []).append(p)
            return {"v3_and_below_transactional_id": self.transactional_id,
                    "v3_and_below_producer_id": core.producer_id,
                    "v3_and_below_producer_epoch": core.producer_epoch,
                    "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

        def handle(resp: Any, v: int) -> tuple[str, Any]:
            errors = {(r.name, int(pr.partition_index)): int(pr.partition_error_code)
                      for r in resp.results_by_topic_v3_and_below for pr in r.results_by_partition}
            unauthorized: set[str] = set()
            other: dict[tuple[str, int], int] = {}
            for tp, code in errors.items():
                if code == NONE:
                    continue
                if code in REFIND:
                    return "refind", error_for(code, "AddPartitionsToTxn")
                if code == CONCURRENT_TRANSACTIONS and not self.partitions:
                    # the previous transaction is still completing: retry soon (Java's 20 ms for the first add)
                    return "retry_fast", error_for(code, "AddPartitionsToTxn")
                if code in RETRY or code == UNKNOWN_TOPIC_OR_PARTITION:
                    return "retry", error_for(code, "AddPartitionsToTxn")
                if code in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED):
                    raise self._fatal(ProducerFencedError(
                        f"AddPartitionsToTxn: another producer with transactional.id {self.transactional_id!r} "
                        "fenced this one"))
                if code in (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, INVALID_TXN_STATE):
                    raise self._fatal(error_for(code, "AddPartitionsToTxn"))
                if code == TOPIC_AUTHORIZATION_FAILED:
                    unauthorized.add(tp[0])
                elif code in (UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_ID_MAPPING):
                    raise self._abortable(error_for(code, "AddPartitionsToTxn"), bump=True)
                elif code == TRANSACTION_ABORTABLE:
                    raise self._abortable(error_for(code, "AddPartitionsToTxn"))
                elif code != OPERATION_NOT_ATTEMPTED:
                    other[tp] = code
            if unauthorized:
                raise self._abortable(error_for(TOPIC_AUTHORIZATION_FAILED, f"topics {sorted(unauthorized)}"))
            if other or any(c == OPERATION_NOT_ATTEMPTED for c in errors.values()):
                first = next(iter(other.values()), OPERATION_NOT_ATTEMPTED)
                raise self._abortable(error_for(first, f"could not add partitions to the transaction: {other}"))
            return "done", None

        try:
            await self._call("AddPartitionsToTxn", TXN_KEY, self.transactional_id, ADD_PARTITIONS_TO_TXN,
                             ADD_PARTITIONS_VERSIONS, build, handle, deadline)
        except KafkaTimeoutError as exc:
            self._abortable(exc)
        except KafkaError:
            pass  # classified by handle/_call: the sweep fails the partitions' batches
        except Exception as exc:  # pragma: no cover - a bug must not leave batches waiting forever
            self._fatal(KafkaError(f"AddPartitionsToTxn failed: {exc!r}"))
        else:
            self.partitions.update(tps)
            self.started = True
        finally:
            self.pending_partitions.difference_update(tps)
            self.core._kick()

    # -- offsets -----------------------------------------------------------------------------

    async def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any,
                                          timeout: float | None = None) -> None:
        meta = group_metadata_of(group_metadata)
        offs = offsets_of(offsets)
        async with self._lock:
            self._raise_if_error()
            if self.state is S.PREPARED:
                raise IllegalStateError("cannot send offsets: the transaction is prepared")
            if self.state is not S.IN_TRANSACTION:
                raise IllegalStateError(f"cannot send offsets in state {self.state.value}: no transaction")
            if not offs:
                return
            deadline = self._deadline(timeout)
            core = self.core
            if not self.tv2:
                def build_add(v: int) -> dict[str, Any]:
                    return {"transactional_id": self.transactional_id, "producer_id": core.producer_id,
                            "producer_epoch": core.producer_epoch, "group_id": meta.group_id}

                def handle_add(resp: Any, v: int) -> tuple[str, Any]:
                    code = int(resp.error_code)
                    if code == NONE:
                        return "done", None
                    if code == GROUP_AUTHORIZATION_FAILED:
                        raise self._abortable(error_for(code, f"group {meta.group_id}"))
                    if code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                        raise self._fatal(error_for(code, "AddOffsetsToTxn"))
                    return self._txn_common(code, None, "AddOffsetsToTxn")

                await self._call("AddOffsetsToTxn", TXN_KEY, self.transactional_id, ADD_OFFSETS_TO_TXN,
                                 ADD_OFFSETS_VERSIONS, build_add, handle_add, deadline)
                self.started = True
            pending = dict(offs)

            def build_commit(v: int) -> dict[str, Any]:
                if v < 3 and (meta.generation_id != -1 or meta.member_id or meta.group_instance_id is not None):
                    # KIP-447 fencing needs v3+; silently dropping the generation would lose it (as Java refuses)
                    raise UnsupportedApiError(f"the group coordinator speaks TxnOffsetCommit v{v}, which cannot "
                                              "carry the group generation and member id (v3+)")
                topics: dict[str, list[dict[str, Any]]] = {}
                for (t, p), (off, md, le) in sorted(pending.items()):
                    topics.setdefault(t, []).append({"partition_index": p, "committed_offset": off,
                                                     "committed_leader_epoch": le, "committed_metadata": md})
                return {"transactional_id": self.transactional_id, "group_id": meta.group_id,
                        "producer_id": core.producer_id, "producer_epoch": core.producer_epoch,
                        "generation_id": meta.generation_id, "member_id": meta.member_id,
                        "group_instance_id": meta.group_instance_id,
                        "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

            def handle_commit(resp: Any, v: int) -> tuple[str, Any]:
                refind: KafkaError | None = None
                retry: KafkaError | None = None
                for t in resp.topics:
                    for pr in t.partitions:
                        code = int(pr.error_code)
                        tp = (t.name, int(pr.partition_index))
                        if code == NONE:
                            pending.pop(tp, None)
                        elif code in REFIND or code == REQUEST_TIMED_OUT:
                            refind = error_for(code, "TxnOffsetCommit")
                        elif code in (UNKNOWN_TOPIC_OR_PARTITION, COORDINATOR_LOAD_IN_PROGRESS,
                                      CONCURRENT_TRANSACTIONS):
                            retry = error_for(code, "TxnOffsetCommit")
                        elif code in (GROUP_AUTHORIZATION_FAILED, FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID,
                                      ILLEGAL_GENERATION, TRANSACTION_ABORTABLE):
                            raise self._abortable(error_for(code, f"TxnOffsetCommit for group {meta.group_id} "
                                                                  f"(generation {meta.generation_id}, member "
                                                                  f"{meta.member_id!r}) failed"))
                        elif code in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED):
                            raise self._fatal(ProducerFencedError(
                                f"TxnOffsetCommit: transactional.id {self.transactional_id!r} was fenced"))
                        else:
                            raise self._fatal(error_for(code, "TxnOffsetCommit"))
                if not pending:
                    return "done", None
                if refind is not None:
                    return "refind", refind
                return "retry", retry or KafkaError("TxnOffsetCommit did not answer for every partition")

            versions = (0, 5) if self.tv2 else (0, 4)
            await self._call("TxnOffsetCommit", GROUP_KEY, meta.group_id, TXN_OFFSET_COMMIT, versions,
                             build_commit, handle_commit, deadline)
            self.started = True

    # -- prepare / commit / abort ------------------------------------------------------------

    async def _flush(self, deadline: float, what: str) -> None:
        left = await self.core.flush(max(0.0, deadline - time.monotonic()))
        if left:
            raise KafkaTimeoutError(f"{what}: {left} record(s) still not acknowledged after max.block.ms")
        # A batch failed in flight at delivery.timeout.ms has completed its records, but its Produce request
        # may still be out. The transaction ends (EndTxn, the epoch bump) only once it is answered: else
        # the bump renumbered it, and with transactions v1 it could land after the abort marker and open a
        # transaction nobody ends. (Java sends EndTxn once no batch is incomplete, which such a batch no
        # longer is; waiting here is stricter.) Bounded: a request ends within request.timeout.ms.
        requests = await self.core.wait_requests(max(0.0, deadline - time.monotonic()))
        if requests:
            raise KafkaTimeoutError(f"{what}: {requests} Produce request(s) still unanswered after max.block.ms")

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        async with self._lock:
            self._raise_if_error()
            if self.state is S.PREPARED:
                raise IllegalStateError("the transaction is already prepared")
            if not self.enable_2pc:
                raise InvalidTxnStateError("cannot prepare a transaction when transaction.two.phase.commit.enable "
                                           "is false")
            if self.state is not S.IN_TRANSACTION:
                raise IllegalStateError(f"cannot prepare in state {self.state.value}: no transaction")
            await self._flush(self._deadline(timeout), "prepare_transaction()")
            self._raise_if_error()  # a record failed meanwhile: the transaction must be aborted
            self.prepared = PreparedTxnState(self.core.producer_id, self.core.producer_epoch)
            self.state = S.PREPARED
            return self.prepared

    async def complete_transaction(self, state: PreparedTxnState, timeout: float | None = None) -> None:
        self._raise_if_error()
        if self.state is not S.PREPARED or self.prepared is None:
            raise InvalidTxnStateError("cannot complete a transaction: none has been prepared (call "
                                       "prepare_transaction(), or init_transactions(keep_prepared_txn=True))")
        if not isinstance(state, PreparedTxnState):
            state = PreparedTxnState.from_string(str(state))
        if state == self.prepared:
            await self.commit_transaction(timeout)
        else:
            await self.abort_transaction(timeout)

    async def commit_transaction(self, timeout: float | None = None) -> None:
        async with self._lock:
            self._raise_if_error()
            if self.state not in (S.IN_TRANSACTION, S.PREPARED, S.COMMITTING):
                raise IllegalStateError(f"cannot commit in state {self.state.value}: no transaction")
            deadline = self._deadline(timeout)
            self.state = S.COMMITTING
            await self._flush(deadline, "commit_transaction()")
            self._raise_if_error()  # a record failed: abortable (or fatal)
            await self._end(True, deadline)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        async with self._lock:
            if self.state is S.FATAL_ERROR:
                self._raise_if_error()
            if self.state not in (S.IN_TRANSACTION, S.PREPARED, S.ABORTABLE_ERROR, S.ABORTING):
                raise IllegalStateError(f"cannot abort in state {self.state.value}: no transaction")
            deadline = self._deadline(timeout)
            self.last_error = self.last_error if self.state is S.ABORTABLE_ERROR else None
            self.state = S.ABORTING
            self.new_partitions = set()
            self.core._kick()  # the sweep fails every record not in flight
            await self._flush(deadline, "abort_transaction()")
            if self.state is S.FATAL_ERROR:
                self._raise_if_error()
            await self._end(False, deadline)

    async def _end(self, commit: bool, deadline: float) -> None:
        core = self.core
        what = "EndTxn(commit)" if commit else "EndTxn(abort)"
        add = self._add_task
        if add is not None and not add.done():
            # one transactional request at a time, EndTxn last (Java's priorities): an
            # AddPartitionsToTxn landing after the EndTxn would open the next transaction
            await asyncio.wait([add], timeout=max(0.0, deadline - time.monotonic()))
            if not add.done():
                raise KafkaTimeoutError(f"{what}: AddPartitionsToTxn still unanswered after max.block.ms")
        self._raise_if_error(allow_abortable=not commit)
        last = self.last_error
        # after INVALID_PRODUCER_ID_MAPPING the coordinator refuses EndTxn: go straight to the epoch bump (Java)
        if self.started and not (last is not None and last.code == INVALID_PRODUCER_ID_MAPPING):
            def build(v: int) -> dict[str, Any]:
                return {"transactional_id": self.transactional_id, "producer_id": core.producer_id,
                        "producer_epoch": core.producer_epoch, "committed": commit}

            def handle(resp: Any, v: int) -> tuple[str, Any]:
                code = int(resp.error_code)
                if code == NONE:
                    return "done", resp
                if code in (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, INVALID_TXN_STATE):
                    raise self._fatal(error_for(code, what))
                return self._txn_common(code, None, what)

            versions = (0, 5) if self.tv2 else (0, 4)
            resp = await self._call(what, TXN_KEY, self.transactional_id, END_TXN, versions, build, handle, deadline)
            pid = int(getattr(resp, "producer_id", -1))
            epoch = int(getattr(resp, "producer_epoch", -1))
            if self.tv2 and pid >= 0 and epoch >= 0:
                core.set_producer(pid, epoch)  # KIP-890: every EndTxn bumps the epoch
                self.bump_required = False
        if self.bump_required and not commit:
            await self._bump_epoch(deadline)
        self.bump_required = False
        self._reset_txn()
        self.state = S.READY

    async def _bump_epoch(self, deadline: float) -> None:
        """v1 after an abort that lost sequenced records: InitProducerId v3+ with the current id and epoch."""
        core = self.core

        def build(v: int) -> dict[str, Any]:
            if v < 3:
                raise UnsupportedApiError("the broker cannot bump the epoch of a transactional producer "
                                          f"(InitProducerId v{v} < v3)")
            return {"transactional_id": self.transactional_id, "transaction_timeout": self.timeout_ms,
                    "producer_id": core.producer_id, "producer_epoch": core.producer_epoch,
                    "enable2_pc": self.enable_2pc, "keep_prepared_txn": False}

        def handle(resp: Any, v: int) -> tuple[str, Any]:
            code = int(resp.error_code)
            if code == NONE:
                return "done", resp
            return self._txn_common(code, None, "InitProducerId (epoch bump)")

        resp = await self._call("InitProducerId", TXN_KEY, self.transactional_id, INIT_PRODUCER_ID,
                                INIT_PRODUCER_ID_VERSIONS, build, handle, deadline)
        core.set_producer(int(resp.producer_id), int(resp.producer_epoch))
