"""AddOffsetsToTxn (key 25).

Behavior: adds the group's offsets partition (``__consumer_offsets-0`` on
this one node) to the producer's transaction, so a TxnOffsetCommit can
follow and the transaction's markers reach the offsets log. Errors as for
AddPartitionsToTxn (INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED,
CONCURRENT_TRANSACTIONS); an empty group id gets INVALID_GROUP_ID.

Version notes: v0-v4 handled. v2 adds PRODUCER_FENCED (v0-v1 get
INVALID_PRODUCER_EPOCH instead); v3+ flexible; v4 adds TRANSACTION_ABORTABLE.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode

API_KEY = 25
MIN_VERSION = 0
MAX_VERSION = 4


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if not request.group_id:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_group_id}
    error = await ctx.broker.txn.add_offsets(
        request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
    )
    if error == ErrorCode.producer_fenced and ctx.version < 2:
        error = ErrorCode.invalid_producer_epoch
    return {"throttle_time": 0, "error_code": error}
