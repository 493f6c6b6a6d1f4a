"""OffsetDelete (key 47).

Behavior: deletes committed offsets of a group. A group that does not exist
gets GROUP_ID_NOT_FOUND. An Empty group loses the requested offsets; a
consumer group with members keeps those of topics its members subscribe to
(GROUP_SUBSCRIBED_TO_TOPIC per partition) and loses the others; a
non-consumer group with members gets NON_EMPTY_GROUP. Unknown topics get
UNKNOWN_TOPIC_OR_PARTITION. Answered once the deletion is durable (NOT_COORDINATOR
if that write fails, Kafka's answer for a storage error of the append).

Version notes: v0 only.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.group import TopicPartition, write_error
from oncelog.protocol.errors import ErrorCode

API_KEY = 47
MIN_VERSION = 0
MAX_VERSION = 0


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    known: list[TopicPartition] = []
    unknown: set[TopicPartition] = set()
    for t in request.topics:
        topic = broker.topics.get(t.name)
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition_index)
            if topic is None or not 0 <= p.partition_index < len(topic.partitions):
                unknown.add(tp)
            else:
                known.append(tp)
    error, errors, fut = broker.groups.delete_offsets(request.group_id, known)
    if error:
        return {"error_code": error, "throttle_time": 0, "topics": []}
    failed = await write_error(fut)  # NOT_COORDINATOR for a storage error, see append_error
    if failed:
        return {"error_code": failed, "throttle_time": 0, "topics": []}
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition_index)
            code = ErrorCode.unknown_topic_or_partition if tp in unknown else errors.get(tp, 0)
            parts.append({"partition_index": p.partition_index, "error_code": code})
        topics.append({"name": t.name, "partitions": parts})
    return {"error_code": 0, "throttle_time": 0, "topics": topics}
