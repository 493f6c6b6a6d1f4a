"""Transactions: the coordinator side (Kafka's transaction coordinator).

* :mod:`.state`: the state table, immutable metadata snapshots and transits (data);
* :mod:`.log`: the durable transaction log (``__transaction_state-0``) and an in-memory engine for tests;
* :mod:`.keyed_log`: the generic durable key -> value log it is built on;
* :mod:`.coordinator`: the sans-IO coordinator (InitProducerId, AddPartitions/AddOffsets, EndTxn with
  two-phase commit and markers, timeouts, expiry, recovery, DescribeTransactions/ListTransactions).
"""

from oncelog.broker.txn.coordinator import (
    OFFSETS_TP,
    EndTxnResult,
    InitProducerIdResult,
    MarkerWriter,
    ProducerIdSource,
    TransactionCoordinator,
    TxnConfig,
)
from oncelog.broker.txn.log import FileTxnLog, MemoryTxnLog, TxnLogError, TxnLogStore
from oncelog.broker.txn.state import STATE_NAMES, VALID_PREVIOUS, Transit, TxnMetadata, TxnState

__all__ = [
    "OFFSETS_TP",
    "STATE_NAMES",
    "VALID_PREVIOUS",
    "EndTxnResult",
    "FileTxnLog",
    "InitProducerIdResult",
    "MarkerWriter",
    "MemoryTxnLog",
    "ProducerIdSource",
    "TransactionCoordinator",
    "Transit",
    "TxnConfig",
    "TxnLogError",
    "TxnLogStore",
    "TxnMetadata",
    "TxnState",
]
