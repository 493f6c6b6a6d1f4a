"""CreatePartitions (key 37).

Behavior: grows a topic to ``count`` partitions. Shrinking or keeping the
count gets INVALID_PARTITIONS; an unknown topic UNKNOWN_TOPIC_OR_PARTITION;
the same topic twice in one request INVALID_REQUEST. Replica assignments are
ignored beyond their count (one node). ``validate_only`` changes nothing.

Version notes: v0-v3 handled; v2+ flexible.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 37
MIN_VERSION = 0
MAX_VERSION = 3


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    counts = Counter(t.name for t in request.topics)
    results = []
    for t in request.topics:
        if counts[t.name] > 1:
            results.append({"name": t.name, "error_code": ErrorCode.invalid_request, "error_message": "Duplicate topic in request."})
            continue
        try:
            broker.create_partitions(t.name, t.count, request.validate_only)
            results.append({"name": t.name, "error_code": 0, "error_message": None})
        except KafkaError as exc:
            results.append({"name": t.name, "error_code": exc.code, "error_message": str(exc)})
    return {"throttle_time": 0, "results": results}
