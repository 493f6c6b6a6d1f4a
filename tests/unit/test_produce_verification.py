"""Produce (TV2): what a failed implicit add of the transaction coordinator becomes."""

from __future__ import annotations

import pytest

from oncelog.broker.handlers.produce import _txn_error
from oncelog.protocol.errors import ErrorCode as E


@pytest.mark.parametrize(
    "code",
    [E.concurrent_transactions, E.network_exception, E.coordinator_load_in_progress,
     E.coordinator_not_available, E.not_coordinator],
)
def test_retriable_verification_errors_answer_not_enough_replicas(code: E) -> None:
    # a transaction-log fsync error makes the implicit add answer NOT_COORDINATOR: the producer
    # retries the batch (Kafka's ReplicaManager), its transaction is not made abortable
    assert _txn_error(int(code), 12).code == E.not_enough_replicas
    assert _txn_error(int(code), 9).code == E.not_enough_replicas


def test_other_verification_errors() -> None:
    assert _txn_error(int(E.producer_fenced), 12).code == E.invalid_producer_epoch
    assert _txn_error(int(E.invalid_txn_state), 12).code == E.invalid_txn_state
    assert _txn_error(int(E.unknown_server_error), 12).code == E.transaction_abortable
    assert _txn_error(int(E.unknown_server_error), 10).code == E.invalid_txn_state
