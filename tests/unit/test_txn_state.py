"""The transaction state table and metadata snapshots (broker/txn/state.py)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from oncelog.broker.group import TopicPartition
from oncelog.broker.txn.state import (
    EXPIRATION_ALLOWED,
    MAX_EPOCH,
    STATE_NAMES,
    VALID_PREVIOUS,
    IllegalTransition,
    TxnMetadata,
    TxnState,
    complete,
    is_epoch_exhausted,
    is_valid_transition,
    prepare,
)

S = TxnState
TP = TopicPartition("t", 0)

# Kafka 4.x TransactionState.validPreviousStates, written out independently
KAFKA_TABLE = {
    "Empty": {"Empty", "CompleteCommit", "CompleteAbort"},
    "Ongoing": {"Ongoing", "Empty", "CompleteCommit", "CompleteAbort"},
    "PrepareCommit": {"Ongoing"},
    "PrepareAbort": {"Ongoing", "PrepareEpochFence", "Empty", "CompleteCommit", "CompleteAbort"},
    "CompleteCommit": {"PrepareCommit"},
    "CompleteAbort": {"PrepareAbort"},
    "Dead": {"Empty", "CompleteCommit", "CompleteAbort"},
    "PrepareEpochFence": {"Ongoing"},
}


def test_table_is_kafkas():
    got = {dst.display_name: {s.display_name for s in srcs} for dst, srcs in VALID_PREVIOUS.items()}
    assert got == KAFKA_TABLE


def test_state_ids_and_names():
    assert [s.id for s in TxnState] == list(range(8))
    assert STATE_NAMES == ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead", "PrepareEpochFence")
    assert TxnState.from_name("Ongoing") is S.ONGOING and TxnState.from_name("ongoing") is None
    assert TxnState.from_id(7) is S.PREPARE_EPOCH_FENCE
    with pytest.raises(ValueError):
        TxnState.from_id(8)
    assert EXPIRATION_ALLOWED == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}


@pytest.mark.parametrize("src,dst", list(itertools.product(TxnState, TxnState)))
def test_every_pair(src, dst):
    assert is_valid_transition(src, dst) == (src.display_name in KAFKA_TABLE[dst.display_name])


def md(**kw) -> TxnMetadata:
    base = dict(transactional_id="x", producer_id=7, producer_epoch=3, timeout_ms=1000, last_update_ms=5)
    base.update(kw)
    return TxnMetadata(**base)


def test_metadata_is_immutable():
    m = md()
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.state = S.ONGOING  # type: ignore[misc]
    assert m.replace(state=S.ONGOING).state is S.ONGOING and m.state is S.EMPTY


def test_prepare_valid_and_records_previous_producer_id():
    t = prepare(md(), state=S.ONGOING, partitions=frozenset({TP}), txn_start_ms=10)
    assert t.source.state is S.EMPTY and t.target.state is S.ONGOING
    assert t.target.previous_producer_id == 7
    assert complete(t.source, t) == t.target
    assert complete(None, t) == t.target


@pytest.mark.parametrize(
    "src,dst",
    [(S.EMPTY, S.PREPARE_COMMIT), (S.ONGOING, S.EMPTY), (S.PREPARE_COMMIT, S.COMPLETE_ABORT), (S.ONGOING, S.DEAD),
     (S.COMPLETE_COMMIT, S.PREPARE_COMMIT), (S.PREPARE_ABORT, S.ONGOING)],
)
def test_prepare_rejects_what_the_table_forbids(src, dst):
    with pytest.raises(IllegalTransition):
        prepare(md(state=src, partitions=frozenset({TP}) if src is not S.EMPTY else frozenset(), txn_start_ms=1), state=dst)


def test_via_chain_is_checked():
    ongoing = md(state=S.ONGOING, partitions=frozenset({TP}), txn_start_ms=1)
    t = prepare(ongoing, via=(S.PREPARE_EPOCH_FENCE,), state=S.PREPARE_ABORT, producer_epoch=4)
    assert t.via == (S.PREPARE_EPOCH_FENCE,)
    with pytest.raises(IllegalTransition):  # PrepareEpochFence -> PrepareCommit is not allowed
        prepare(ongoing, via=(S.PREPARE_EPOCH_FENCE,), state=S.PREPARE_COMMIT)


def test_completion_checks():
    ongoing = md(state=S.ONGOING, partitions=frozenset({TP}), txn_start_ms=1)
    with pytest.raises(IllegalTransition):  # epoch decreases
        prepare(ongoing, state=S.PREPARE_ABORT, producer_epoch=2)
    with pytest.raises(IllegalTransition):  # partitions removed while Ongoing
        prepare(ongoing, partitions=frozenset())
    with pytest.raises(IllegalTransition):  # Empty with partitions
        prepare(md(), partitions=frozenset({TP}))
    with pytest.raises(IllegalTransition):  # Empty epoch jump
        prepare(md(), producer_epoch=5)
    with pytest.raises(IllegalTransition):  # a new producer id must start at 0
        prepare(md(), producer_id=8, producer_epoch=1)
    with pytest.raises(IllegalTransition):  # epoch below zero
        prepare(md(producer_epoch=-1), producer_epoch=-1)
    prepared = md(state=S.PREPARE_COMMIT, partitions=frozenset({TP}), txn_start_ms=1, next_producer_id=9)
    with pytest.raises(IllegalTransition):  # complete with partitions still listed
        prepare(prepared, state=S.COMPLETE_COMMIT)
    with pytest.raises(IllegalTransition):  # rotate to an id that was not prepared
        prepare(prepared, state=S.COMPLETE_COMMIT, partitions=frozenset(), producer_id=10, producer_epoch=0)
    done = prepare(prepared, state=S.COMPLETE_COMMIT, partitions=frozenset(), producer_id=9, producer_epoch=0).target
    assert done.previous_producer_id == 7


def test_complete_refuses_a_changed_source():
    t = prepare(md(), state=S.ONGOING, partitions=frozenset({TP}), txn_start_ms=1)
    with pytest.raises(IllegalTransition):
        complete(md(producer_epoch=4), t)


def test_record_round_trip():
    m = md(state=S.PREPARE_ABORT, partitions=frozenset({TP, TopicPartition("u", 3)}), txn_start_ms=9, next_producer_id=11,
           previous_producer_id=6, last_producer_epoch=2, client_transaction_version=2, two_phase_commit=True,
           next_producer_epoch=5)
    assert TxnMetadata.from_record("x", m.to_record()) == m


def test_epoch_exhaustion_and_derived():
    assert not is_epoch_exhausted(MAX_EPOCH - 2)
    assert is_epoch_exhausted(MAX_EPOCH - 1) and is_epoch_exhausted(MAX_EPOCH)
    m = md(state=S.ONGOING, txn_start_ms=100, timeout_ms=50, partitions=frozenset({TP}))
    assert not m.timed_out(150) and m.timed_out(151)
    assert not m.replace(two_phase_commit=True).timed_out(10**9)
    assert m.client_epoch == 3 and m.replace(next_producer_epoch=4).client_epoch == 4
