"""OffsetCommit (key 8).

Behavior: partitions of unknown topics get UNKNOWN_TOPIC_OR_PARTITION (v10:
unknown topic ids get UNKNOWN_TOPIC_ID); the rest go to the group
coordinator, which checks the group, member and generation exactly as
Kafka's classic coordinator does (see docs/groups.md): generation -1 with
an empty member id commits for a group without members (a "simple" group,
created if needed); a group that does not exist and a generation >= 0 gets
ILLEGAL_GENERATION; then FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID,
ILLEGAL_GENERATION and, while the group completes a rebalance,
REBALANCE_IN_PROGRESS. Metadata longer than ``offset.metadata.max.bytes``
gets OFFSET_METADATA_TOO_LARGE for that partition only. The answer is sent
once the offsets are durable in the offsets log; if that write fails (an I/O
error of the offsets log) the accepted partitions answer NOT_COORDINATOR, as
Kafka answers a KAFKA_STORAGE_ERROR of the append.

Version notes: v2-v10 handled (v0-v1 were removed in Kafka 4.0). v2-v4
retention time: when not -1 the offsets expire that long after the commit;
v5+ rely on ``offsets.retention.minutes``. v6+ committed leader epoch; v7+
group.instance.id; v8+ flexible; v9 changes nothing for classic groups;
v10 names topics by id.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.group import OffsetAndMetadata, TopicPartition, write_error
from oncelog.protocol.build import to_ms
from oncelog.protocol.errors import ErrorCode

API_KEY = 8
MIN_VERSION = 2
MAX_VERSION = 10


def resolve_topic(broker: Any, topic: Any, version: int, by_id_from: int) -> tuple[Any, int]:
    """(Topic or None, error for its partitions when unknown)."""
    if version >= by_id_from:
        return broker.topics_by_id.get(topic.topic_id), ErrorCode.unknown_topic_id
    return broker.topics.get(topic.name), ErrorCode.unknown_topic_or_partition


async def await_stored(fut: Any, errors: dict[Any, int]) -> dict[Any, int]:
    """Wait until the offsets store made the commit durable; if that failed,
    every partition accepted for it answers the write's error (NOT_COORDINATOR
    for a storage error, COORDINATOR_NOT_AVAILABLE for a write cancelled at shutdown,
    see :func:`~oncelog.broker.group.append_error`)."""
    code = await write_error(fut)
    if code:
        return {tp: (err or code) for tp, err in errors.items()}
    return errors


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    v = ctx.version
    broker = ctx.broker
    now = broker.clock()
    expire = None
    if v <= 4:
        retention = to_ms(request.retention_time)
        if retention != -1:
            expire = now + retention
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    plan: list[tuple[Any, list[tuple[int, Any]]]] = []  # (request topic, [(partition, tp or error)])
    for t in request.topics:
        topic, unknown = resolve_topic(broker, t, v, 10)
        parts: list[tuple[int, Any]] = []
        for p in t.partitions:
            if topic is None:
                parts.append((p.partition_index, int(unknown)))
            elif not 0 <= p.partition_index < len(topic.partitions):
                parts.append((p.partition_index, int(ErrorCode.unknown_topic_or_partition)))
            else:
                tp = TopicPartition(topic.name, p.partition_index)
                epoch = getattr(p, "committed_leader_epoch", -1)
                offsets[tp] = OffsetAndMetadata(p.committed_offset, epoch, p.committed_metadata, now, expire)
                parts.append((p.partition_index, tp))
        plan.append((t, parts))
    errors: dict[TopicPartition, int] = {}
    if offsets:
        errors, fut = broker.groups.commit_offsets(
            request.group_id,
            request.generation_id_or_member_epoch,
            request.member_id,
            getattr(request, "group_instance_id", None),
            offsets,
        )
        errors = await await_stored(fut, errors)
    topics = []
    for t, parts in plan:
        entry: dict[str, Any] = {
            "partitions": [
                {"partition_index": idx, "error_code": what if isinstance(what, int) else errors[what]}
                for idx, what in parts
            ]
        }
        if v >= 10:
            entry["topic_id"] = t.topic_id
        else:
            entry["name"] = t.name
        topics.append(entry)
    return {"throttle_time": 0, "topics": topics}
