"""InitProducerId (key 22).

Behavior (no transactional id; idempotent producers): a fresh producer id
with epoch 0, unique across restarts (see :mod:`oncelog.broker.producer_ids`).
KIP-360 (v3+): a producer passing its current id and epoch gets the epoch
bumped; passing the previous epoch (a retried bump) returns the current one;
any other epoch of a remembered id gets INVALID_PRODUCER_EPOCH. An exhausted
epoch rotates to a new producer id with epoch 0.

With a transactional id the request belongs to the transaction coordinator,
which arrives with the transactions issue; until then it gets
COORDINATOR_NOT_AVAILABLE, a retriable error.

Version notes: v0-v5 handled. v2+ flexible; v3+ carries producer id/epoch
(KIP-360); v4 and v5 change only error semantics on the client side.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 22
MIN_VERSION = 0
MAX_VERSION = 5


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"throttle_time": 0, "error_code": 0, "producer_id": -1, "producer_epoch": -1}
    if request.transactional_id is not None:
        out["error_code"] = ErrorCode.coordinator_not_available
        return out
    pid = getattr(request, "producer_id", -1)
    epoch = getattr(request, "producer_epoch", -1)
    try:
        result = ctx.broker.producer_ids.init_idempotent(pid, epoch)
    except KafkaError as exc:
        out["error_code"] = exc.code
        return out
    out["producer_id"] = result.producer_id
    out["producer_epoch"] = result.epoch
    return out
