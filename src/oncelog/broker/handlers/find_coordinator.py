"""FindCoordinator (key 10).

Behavior: on one node the coordinator of every group (key type 0) and every
transactional id (key type 1) is this broker: the answer is its node id and
advertised host and port. Any other key type (2 = share groups, which this
broker does not have) gets INVALID_REQUEST. Once the log directory failed
(the broker is stopping; it holds ``__consumer_offsets`` and
``__transaction_state``) every key answers COORDINATOR_NOT_AVAILABLE, as Kafka
answers when the coordinator's partition has no online leader.

Version notes: v0-v6 handled. v0 has only the key (a group); v1+ adds the
key type, throttle time and an error message; v3+ flexible; v4+ batches the
keys (``coordinator_keys``) and answers one ``coordinators`` entry per key,
each with its own error; v5 and v6 add nothing the broker must do
differently (v6 lets the key type be 2, which we reject).
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode

API_KEY = 10
MIN_VERSION = 0
MAX_VERSION = 6

GROUP = 0
TRANSACTION = 1


def _answer(ctx: RequestContext, key_type: int) -> dict[str, Any]:
    if key_type not in (GROUP, TRANSACTION):
        return {"error_code": ErrorCode.invalid_request, "error_message": f"unsupported coordinator key type {key_type}",
                "node_id": -1, "host": "", "port": -1}
    if ctx.broker.log_dir.offline:
        return {"error_code": ErrorCode.coordinator_not_available, "error_message": "the log directory is offline",
                "node_id": -1, "host": "", "port": -1}
    host, port = ctx.broker.config.advertised
    return {"error_code": 0, "error_message": None, "node_id": ctx.broker.node_id, "host": host, "port": port}


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    key_type = getattr(request, "key_type", GROUP)
    if ctx.version < 4:
        return {"throttle_time": 0, **_answer(ctx, key_type)}
    return {
        "throttle_time": 0,
        "coordinators": [{"key": key, **_answer(ctx, key_type)} for key in request.coordinator_keys],
    }
