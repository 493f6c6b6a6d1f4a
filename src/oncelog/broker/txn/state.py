"""Transaction states and metadata, as data (Kafka's TransactionState,
TransactionMetadata and TxnTransitMetadata).

* :data:`VALID_PREVIOUS` is Kafka 4.x's table: for each state, the states it
  may be entered from (including transactions v2's Empty/Complete* ->
  PrepareAbort, for an abort sent when the client is unsure of the state).
* :class:`TxnMetadata` is an immutable snapshot of one transactional id: the
  value of its record in the transaction log.
* :class:`Transit` is a prepared ("pending") state change: the snapshot it
  starts from and the snapshot it leads to. :func:`prepare` validates it
  against the table; the coordinator writes ``transit.target`` to the log and
  calls :func:`complete` only once that record is durable.

Pure data and pure functions: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from oncelog.broker.group import TopicPartition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767  # Short.MAX_VALUE
INT32_MAX = 2**31 - 1  # a 2PC (KIP-939) transaction's timeout: no timeout


class TxnState(Enum):
    """value = (Kafka's state id byte, the name DescribeTransactions shows)."""

    EMPTY = (0, "Empty")
    ONGOING = (1, "Ongoing")
    PREPARE_COMMIT = (2, "PrepareCommit")
    PREPARE_ABORT = (3, "PrepareAbort")
    COMPLETE_COMMIT = (4, "CompleteCommit")
    COMPLETE_ABORT = (5, "CompleteAbort")
    DEAD = (6, "Dead")
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence")

    @property
    def id(self) -> int:
        return self.value[0]

    @property
    def display_name(self) -> str:
        return self.value[1]

    @classmethod
    def from_name(cls, name: str) -> "TxnState | None":
        return _BY_NAME.get(name)

    @classmethod
    def from_id(cls, state_id: int) -> "TxnState":
        try:
            return _BY_ID[state_id]
        except KeyError:
            raise ValueError(f"unknown transaction state id {state_id}") from None


_BY_NAME = {s.display_name: s for s in TxnState}
_BY_ID = {s.id: s for s in TxnState}
STATE_NAMES = tuple(_BY_NAME)

S = TxnState
VALID_PREVIOUS: Mapping[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
# states in which an idle transactional id may expire
EXPIRATION_ALLOWED = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
PREPARED = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
COMPLETED = frozenset({S.COMPLETE_COMMIT, S.COMPLETE_ABORT})


def is_valid_transition(src: TxnState, dst: TxnState) -> bool:
    return src in VALID_PREVIOUS[dst]


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps Short.MAX_VALUE free so that a fence can always bump once more."""
    return epoch >= MAX_EPOCH - 1


class IllegalTransition(Exception):
    """A transition the table (or Kafka's completion checks) does not allow: a coordinator bug."""


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    previous_producer_id: int = NO_PRODUCER_ID  # the producer id before the last transition
    next_producer_id: int = NO_PRODUCER_ID  # TV2: the id the producer moves to when the epoch is exhausted
    timeout_ms: int = 60_000
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[TopicPartition] = frozenset()
    txn_start_ms: int = -1
    last_update_ms: int = -1
    client_transaction_version: int = 0
    two_phase_commit: bool = False  # KIP-939: no timeout
    # KIP-939 keepPreparedTxn: the epoch handed to the current client while an Ongoing transaction keeps
    # its own (producer_id, producer_epoch) for its markers; -1 when no prepared transaction is kept.
    # When that epoch is exhausted the client is given a new id, kept in next_producer_id (client_producer_id)
    next_producer_epoch: int = NO_PRODUCER_EPOCH

    # -- derived ----------------------------------------------------------------

    @property
    def client_epoch(self) -> int:
        """The epoch the current producer of this transactional id holds."""
        return self.next_producer_epoch if self.next_producer_epoch >= 0 else self.producer_epoch

    @property
    def client_producer_id(self) -> int:
        """The producer id the current producer holds: ``next_producer_id`` when a kept (KIP-939)
        transaction ran out of client epochs and its new client was given a new id (the transaction
        keeps its own id and epoch for its markers); else ``producer_id``."""
        return self.next_producer_id if self.kept_prepared and self.next_producer_id >= 0 else self.producer_id

    @property
    def kept_prepared(self) -> bool:
        return self.next_producer_epoch >= 0

    @property
    def is_tv2(self) -> bool:
        return self.client_transaction_version >= 2

    def timed_out(self, now_ms: int) -> bool:
        return (
            self.state is S.ONGOING
            and not self.two_phase_commit
            and self.txn_start_ms >= 0
            and self.txn_start_ms + self.timeout_ms < now_ms
        )

    def replace(self, **changes: Any) -> "TxnMetadata":
        return dataclasses.replace(self, **changes)

    # -- the log record ---------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        return {
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "last_epoch": self.last_producer_epoch,
            "prev_pid": self.previous_producer_id,
            "next_pid": self.next_producer_id,
            "next_epoch": self.next_producer_epoch,
            "timeout": self.timeout_ms,
            "state": self.state.id,
            "partitions": sorted([tp.topic, tp.partition] for tp in self.partitions),
            "start": self.txn_start_ms,
            "update": self.last_update_ms,
            "tv": self.client_transaction_version,
            "2pc": self.two_phase_commit,
        }

    @classmethod
    def from_record(cls, transactional_id: str, rec: Mapping[str, Any]) -> "TxnMetadata":
        return cls(
            transactional_id=transactional_id,
            producer_id=int(rec["pid"]),
            producer_epoch=int(rec["epoch"]),
            last_producer_epoch=int(rec["last_epoch"]),
            previous_producer_id=int(rec["prev_pid"]),
            next_producer_id=int(rec["next_pid"]),
            next_producer_epoch=int(rec.get("next_epoch", NO_PRODUCER_EPOCH)),
            timeout_ms=int(rec["timeout"]),
            state=TxnState.from_id(int(rec["state"])),
            partitions=frozenset(TopicPartition(str(t), int(p)) for t, p in rec["partitions"]),
            txn_start_ms=int(rec["start"]),
            last_update_ms=int(rec["update"]),
            client_transaction_version=int(rec["tv"]),
            two_phase_commit=bool(rec["2pc"]),
        )


@dataclass(frozen=True, slots=True)
class Transit:
    """A pending state change: ``source`` -> (``via`` ...) -> ``target``.

    ``via`` lists states passed through without a log record of their own
    (PrepareEpochFence, which Kafka never writes: the fence goes straight on
    to PrepareAbort with the bumped epoch).
    """

    source: TxnMetadata
    target: TxnMetadata
    via: tuple[TxnState, ...] = ()

    @property
    def state(self) -> TxnState:
        return self.target.state


def prepare(source: TxnMetadata, via: tuple[TxnState, ...] = (), **changes: Any) -> Transit:
    """The transit from ``source`` to ``source`` with ``changes``, checked against the table.

    Every transition records the producer id it left as ``previous_producer_id`` (Kafka's prevProducerId).
    """
    target = source.replace(previous_producer_id=source.producer_id, **changes)
    path = (source.state, *via, target.state)
    for a, b in zip(path, path[1:]):
        if not is_valid_transition(a, b):
            raise IllegalTransition(f"{source.transactional_id}: {a.display_name} -> {b.display_name} is not allowed")
    if target.producer_id < 0:
        raise IllegalTransition(f"illegal producer id {target.producer_id}")
    if target.state is not S.DEAD and target.producer_epoch < 0:
        raise IllegalTransition(f"illegal producer epoch {target.producer_epoch}")
    _check_target(source, target)
    return Transit(source, target, via)


def _check_target(src: TxnMetadata, dst: TxnMetadata) -> None:
    """Kafka's completeTransitionTo checks, done at preparation so a bad transit is never logged."""
    st = dst.state

    def fail(why: str) -> None:
        raise IllegalTransition(f"{src.transactional_id}: {src.state.display_name} -> {st.display_name}: {why}")

    new_id = dst.producer_id != src.producer_id
    if dst.producer_epoch < src.producer_epoch and not new_id and st is not S.DEAD:
        fail("the producer epoch would decrease")
    if st is S.EMPTY:
        if dst.partitions or dst.txn_start_ms != -1:
            fail("an empty transaction has partitions or a start time")
        if not new_id and dst.producer_epoch not in (src.producer_epoch, src.producer_epoch + 1):
            fail("epoch bump by more than one")
        if new_id and dst.producer_epoch != 0:
            fail("a new producer id starts at epoch 0")
    elif st is S.ONGOING:
        if not dst.partitions >= src.partitions or new_id:
            fail("partitions removed or producer id changed")
    elif st in PREPARED:
        if new_id or (src.state is S.ONGOING and dst.partitions != src.partitions):
            fail("partitions or producer id changed")
    elif st in COMPLETED:
        if dst.txn_start_ms == -1 or dst.partitions:
            fail("a completed transaction has no start time or still lists partitions")
        if new_id and (dst.producer_epoch != 0 or src.next_producer_id != dst.producer_id):
            fail("producer id rotated to an id that was not prepared")


def complete(current: TxnMetadata | None, transit: Transit) -> TxnMetadata:
    """The metadata after ``transit`` is durable; ``current`` must still be its source."""
    if current is not None and current != transit.source:
        raise IllegalTransition(f"{transit.source.transactional_id}: metadata changed while a transit was pending")
    return transit.target
