"""CreateTopics (key 19).

Behavior: creates each topic with its partition count and topic-level
configs. -1 partitions/replication factor take ``num.partitions`` /
``default.replication.factor``. Explicit replica assignments give the
partition count; they may name only this broker, once per partition
(INVALID_REPLICA_ASSIGNMENT otherwise). A replication factor above 1 gets
INVALID_REPLICATION_FACTOR, as a one-broker Kafka answers. Topic configs are
validated as Kafka's LogConfig does (unknown names, types, ranges and valid
values: INVALID_CONFIG with Kafka's message). ``validate_only`` checks everything and changes
nothing. A request whose topics would have more than 10,000 partitions in all
gets POLICY_VIOLATION ("Excessively large number of partitions per request.")
for every topic before anything is looked at, as Kafka's controller answers
(``ReplicationControlManager.validateTotalNumberOfPartitions``); it also keeps
one request from stalling the broker creating millions of directories.
Errors: TOPIC_ALREADY_EXISTS, INVALID_TOPIC_EXCEPTION,
INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, INVALID_CONFIG,
INVALID_REQUEST (duplicate names in one request).

Version notes:
- v2-v7 handled. v5+ returns partitions, replication factor and configs; v5+
  flexible; v7+ returns the topic id.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.handlers.describe_configs import topic_config_entries
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 19
MIN_VERSION = 2
MAX_VERSION = 7

_ZERO = uuid.UUID(int=0)


def _result(name: str, code: int, message: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "topic_id": _ZERO,
        "error_code": code,
        "error_message": message,
        "topic_config_error_code": 0,
        "num_partitions": -1,
        "replication_factor": -1,
        "configs": None,
    }


def _check_assignments(assignments: Any, node_id: int) -> str | None:
    """Kafka's checks of manual assignments, on a cluster of one broker."""
    indexes = sorted(a.partition_index for a in assignments)
    if indexes != list(range(len(indexes))):
        return "Partitions must be numbered 0 to n-1 in the manual partition assignment."
    for a in assignments:
        ids = list(a.broker_ids)
        if not ids:
            return "The manual partition assignment includes an empty replica list."
        if len(set(ids)) != len(ids):
            return f"The manual partition assignment includes the broker {ids[0]} more than once."
        for b in ids:
            if b != node_id:
                return f"The manual partition assignment includes broker {b}, but no such broker is registered."
    return None


# Kafka's controller refuses a request that would create more partitions than this
# (ReplicationControlManager.MAX_PARTITIONS_PER_BATCH), before looking at any topic
MAX_PARTITIONS_PER_REQUEST = 10_000
TOO_MANY_PARTITIONS = "Excessively large number of partitions per request."


def requested_partitions(request: Any, default: int) -> int:
    """An upper bound of the partitions ``request`` would create, counted as Kafka counts it."""
    total = 0
    for t in request.topics:
        if t.assignments:
            total += len(t.assignments)
        elif t.num_partitions == -1:
            total += default
        elif t.num_partitions > 0:
            total += t.num_partitions
    return total


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    counts = Counter(t.name for t in request.topics)
    results = []
    if requested_partitions(request, broker.config.num_partitions) > MAX_PARTITIONS_PER_REQUEST:
        return {"throttle_time": 0, "topics": [
            _result(t.name, ErrorCode.policy_violation, TOO_MANY_PARTITIONS) for t in request.topics]}
    for t in request.topics:
        if counts[t.name] > 1:
            results.append(_result(t.name, ErrorCode.invalid_request, "Duplicate topic name in request."))
            continue
        num_partitions = t.num_partitions
        replication = t.replication_factor
        if t.assignments:
            if num_partitions != -1 or replication != -1:
                results.append(
                    _result(
                        t.name,
                        ErrorCode.invalid_request,
                        "Both numPartitions or replicationFactor and replicasAssignments were set.",
                    )
                )
                continue
            num_partitions = len(t.assignments)
            problem = _check_assignments(t.assignments, broker.node_id)
            if problem is not None:
                results.append(_result(t.name, ErrorCode.invalid_replica_assignment, problem))
                continue
            replication = 1
        configs = {c.name: c.value for c in t.configs}
        try:
            topic = broker.create_topic(t.name, num_partitions, replication, configs, request.validate_only)
        except KafkaError as exc:
            results.append(_result(t.name, exc.code, str(exc)))
            continue
        n = len(topic.partitions) if topic else (num_partitions if num_partitions > 0 else broker.config.num_partitions)
        results.append(
            {
                "name": t.name,
                "topic_id": topic.topic_id if topic else _ZERO,
                "error_code": 0,
                "error_message": None,
                "topic_config_error_code": 0,
                "num_partitions": n,
                "replication_factor": 1,
                "configs": [
                    {
                        "name": e["name"],
                        "value": e["value"],
                        "read_only": e["read_only"],
                        "config_source": e["config_source"],
                        "is_sensitive": False,
                    }
                    for e in topic_config_entries(broker, t.name if topic else None, configs)
                ],
            }
        )
    return {"throttle_time": 0, "topics": results}
