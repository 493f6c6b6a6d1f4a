"""DescribeTransactions (key 65, KIP-664).

Behavior: for each transactional id, its state as the coordinator holds it:
state name (Kafka's: Empty, Ongoing, PrepareCommit, ...), timeout, start
time of the open transaction (-1 when none), producer id and epoch, and the
partitions of the transaction. An unknown id gets TRANSACTIONAL_ID_NOT_FOUND.

Version notes: v0 only (flexible).
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext

API_KEY = 65
MIN_VERSION = 0
MAX_VERSION = 0


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return {"throttle_time": 0, "transaction_states": ctx.broker.txn.describe(list(request.transactional_ids))}
