"""OffsetFetch (key 9).

Behavior: the committed offset, leader epoch and metadata of each requested
partition, or of every partition the group has offsets for when the topic
list is null (v2+). A partition without an offset, and every partition of a
group that does not exist, answers offset -1 with no error, exactly like
Kafka's classic coordinator (GROUP_ID_NOT_FOUND here makes librdkafka
consumers using assign() stall). Offsets become visible once durable.
Transactional offsets (TxnOffsetCommit) stay invisible until their
transaction's COMMIT marker is durable: until then the last committed offset
is answered, or, with require_stable (v7+), UNSTABLE_OFFSET_COMMIT with
offset -1 for each partition a transaction holds pending offsets of (KIP-447;
the consumer retries until the transaction completes). With a null topic
list only partitions with a committed offset are listed, each checked the
same way, as Kafka does. Once the log directory failed (the broker is
stopping) every group answers NOT_COORDINATOR, as a Kafka coordinator
resigns the partitions of an offline log directory: an offset whose write
failed is never served.

Version notes: v1-v10 handled (v0 was removed in Kafka 4.0). v2+ null topics
means all, and a top-level error code; v3+ throttle time; v5+ leader epoch;
v6+ flexible; v7+ require_stable; v8+ several groups per request, each with
its own error; v9 member id/epoch (not checked for classic groups); v10
names topics by id (unknown ids get UNKNOWN_TOPIC_ID).
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.group import TopicPartition
from oncelog.protocol.errors import ErrorCode

API_KEY = 9
MIN_VERSION = 1
MAX_VERSION = 10


def _fetch_group(
    ctx: RequestContext, group_id: str, topics: Any, by_id: bool, require_stable: bool = False
) -> tuple[int, list[dict[str, Any]]]:
    broker = ctx.broker
    coordinator = broker.groups
    if coordinator.store.offline:  # the log directory failed: no longer the coordinator (group-level error)
        return int(ErrorCode.not_coordinator), []

    def part(tp: TopicPartition, offset: int, epoch: int, meta: str, error: int) -> dict[str, Any]:
        if require_stable and not error and coordinator.has_pending_txn_offsets(group_id, tp):
            return _part(tp.partition, -1, -1, "", ErrorCode.unstable_offset_commit)
        return _part(tp.partition, offset, epoch, meta, error)

    if topics is None:
        error, rows = coordinator.fetch_offsets(group_id, None)
        grouped: dict[str, list[dict[str, Any]]] = {}
        for tp, offset, epoch, meta in rows:
            grouped.setdefault(tp.topic, []).append(part(tp, offset, epoch, meta, 0))
        out = []
        for name, parts in grouped.items():
            if by_id:
                topic = broker.topics.get(name)
                if topic is None:
                    continue  # the topic is gone: it has no id to answer with
                out.append({"topic_id": topic.topic_id, "partitions": parts})
            else:
                out.append({"name": name, "partitions": parts})
        return error, out
    out = []
    for t in topics:
        if by_id:
            topic = broker.topics_by_id.get(t.topic_id)
            if topic is None:
                out.append({"topic_id": t.topic_id, "partitions": [
                    _part(p, -1, -1, "", ErrorCode.unknown_topic_id) for p in t.partition_indexes]})
                continue
            name = topic.name
        else:
            name = t.name
        error, rows = coordinator.fetch_offsets(group_id, [TopicPartition(name, p) for p in t.partition_indexes])
        parts = [part(tp, offset, epoch, meta, error) for tp, offset, epoch, meta in rows]
        out.append({"topic_id": t.topic_id, "partitions": parts} if by_id else {"name": name, "partitions": parts})
    return 0, out


def _part(index: int, offset: int, epoch: int, metadata: str, error: int) -> dict[str, Any]:
    return {"partition_index": index, "committed_offset": offset, "committed_leader_epoch": epoch,
            "metadata": metadata, "error_code": error}


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    v = ctx.version
    if v < 8:
        stable = v >= 7 and bool(getattr(request, "require_stable", False))
        error, topics = _fetch_group(ctx, request.group_id, request.topics, False, stable)
        return {"throttle_time": 0, "error_code": error, "topics": topics}
    groups = []
    stable = bool(getattr(request, "require_stable", False))
    for g in request.groups:
        error, topics = _fetch_group(ctx, g.group_id, g.topics, v >= 10, stable)
        groups.append({"group_id": g.group_id, "topics": topics, "error_code": error})
    return {"throttle_time": 0, "groups": groups}
