"""DeleteTopics (key 20).

Behavior: deletes each named topic (and its data) or answers
UNKNOWN_TOPIC_OR_PARTITION / UNKNOWN_TOPIC_ID. Deletion is immediate on one
node. Fetch waiters on the topic are woken and see the topic gone.

Version notes:
- v1-v6 handled. v1-v5 send topic names; v6 sends (name | topic id) pairs.
  v4+ flexible; v5+ error messages.
"""

from __future__ import annotations

import uuid
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 20
MIN_VERSION = 1
MAX_VERSION = 6

_ZERO = uuid.UUID(int=0)


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    if ctx.version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    results = []
    for name, topic_id in wanted:
        if not name and topic_id and topic_id != _ZERO:
            topic = broker.topics_by_id.get(topic_id)
            if topic is None:
                results.append(
                    {"name": None, "topic_id": topic_id, "error_code": ErrorCode.unknown_topic_id, "error_message": None}
                )
                continue
            name = topic.name
        topic = broker.topics.get(name)
        tid = topic.topic_id if topic else (topic_id or _ZERO)
        try:
            broker.delete_topic(name)
            code, message = 0, None
        except KafkaError as exc:
            code, message = exc.code, str(exc)
        results.append({"name": name, "topic_id": tid, "error_code": code, "error_message": message})
    return {"throttle_time": 0, "responses": results}
