"""CreatePartitions (key 37).

Behavior: grows a topic to ``count`` partitions. A request that would add more
than 10,000 partitions in all gets POLICY_VIOLATION for every topic, as
CreateTopics does (Kafka's controller bounds the records of one request). Shrinking or keeping the
count gets INVALID_PARTITIONS; an unknown topic UNKNOWN_TOPIC_OR_PARTITION;
the same topic twice in one request INVALID_REQUEST. Replica assignments, if
given, must hold one per new partition, each naming only this broker once (the
topic has one replica): INVALID_REPLICA_ASSIGNMENT otherwise, as Kafka. ``validate_only`` changes nothing.

Version notes: v0-v3 handled; v2+ flexible.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.handlers.create_topics import MAX_PARTITIONS_PER_REQUEST, TOO_MANY_PARTITIONS
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 37
MIN_VERSION = 0
MAX_VERSION = 3


def _check_assignments(assignments: Any, added: int, node_id: int) -> None:
    if added > 0 and len(assignments) != added:
        raise KafkaError(
            ErrorCode.invalid_replica_assignment,
            f"Attempted to add {added} additional partition(s), but only {len(assignments)} assignment(s) were specified.",
        )
    for a in assignments:
        ids = list(a.broker_ids)
        if len(ids) != 1:
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes a partition with {len(ids)} replica(s), but this is not "
                "consistent with previous partitions, which have 1 replica(s).",
            )
        if ids[0] != node_id:
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes broker {ids[0]}, but no such broker is registered.",
            )


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    counts = Counter(t.name for t in request.topics)
    results = []
    new_partitions = sum(max(t.count - len(broker.topics[t.name].partitions), 0)
                         for t in request.topics if t.name in broker.topics)
    if new_partitions > MAX_PARTITIONS_PER_REQUEST:
        return {"throttle_time": 0, "results": [
            {"name": t.name, "error_code": ErrorCode.policy_violation, "error_message": TOO_MANY_PARTITIONS}
            for t in request.topics]}
    for t in request.topics:
        if counts[t.name] > 1:
            results.append({"name": t.name, "error_code": ErrorCode.invalid_request, "error_message": "Duplicate topic in request."})
            continue
        try:
            if t.assignments is not None and t.name in broker.topics:
                _check_assignments(t.assignments, t.count - len(broker.topics[t.name].partitions), broker.node_id)
            broker.create_partitions(t.name, t.count, request.validate_only)
            results.append({"name": t.name, "error_code": 0, "error_message": None})
        except KafkaError as exc:
            results.append({"name": t.name, "error_code": exc.code, "error_message": str(exc)})
    return {"throttle_time": 0, "results": results}
