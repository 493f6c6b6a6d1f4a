"""EndTxn (key 26).

Behavior: two-phase commit. The coordinator writes PrepareCommit (or
PrepareAbort) durably to the transaction log and answers; it then writes a
COMMIT (ABORT) marker to every partition of the transaction and to the
offsets log when offsets were added, and finally CompleteCommit
(CompleteAbort). A retry of an EndTxn that already completed in the same
direction succeeds; the other direction gets INVALID_TXN_STATE, as does an
EndTxn with no transaction (Empty). A fenced producer gets PRODUCER_FENCED;
a state change in progress CONCURRENT_TRANSACTIONS.

KIP-890 (transaction version 2, EndTxn v5 when the broker finalizes
``transaction.version`` >= 2): every EndTxn bumps the producer epoch; the
markers carry the bumped epoch (partitions reject markers whose epoch is not
above the producer's, which stops a delayed EndTxn or Produce from leaking
into the next transaction) and the response returns the new producer id and
epoch. An abort of an Empty transaction is allowed.

Version notes: v0-v5 handled. v2 adds PRODUCER_FENCED (v0-v1 get
INVALID_PRODUCER_EPOCH instead); v3+ flexible; v4 adds TRANSACTION_ABORTABLE;
v5 returns producer id and epoch (TV2).
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode

API_KEY = 26
MIN_VERSION = 0
MAX_VERSION = 5


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    tv2 = ctx.version >= 5 and broker.config.transaction_version >= 2
    result = await broker.txn.end_txn(
        request.transactional_id, request.producer_id, request.producer_epoch, request.committed, tv2
    )
    error = result.error
    if error == ErrorCode.producer_fenced and ctx.version < 2:
        error = ErrorCode.invalid_producer_epoch
    return {
        "throttle_time": 0,
        "error_code": error,
        "producer_id": result.producer_id,
        "producer_epoch": result.producer_epoch,
    }
