"""AlterConfigs (key 33).

Behavior: replaces the whole set of overrides of a resource (Kafka's legacy,
non-incremental semantics; configs absent from the request revert to their
defaults).

- TOPIC: topic configs are checked as Kafka's LogConfig does: an unknown name,
  a value of the wrong type or out of range gets INVALID_CONFIG with Kafka's
  message; an unknown topic UNKNOWN_TOPIC_OR_PARTITION.
- BROKER: the name ``""`` is the cluster-wide default, the node id this
  broker (another id, or not a number, INVALID_REQUEST). Dynamic broker
  configs (:mod:`oncelog.broker.dynamic_config`) are stored durably; a
  config that cannot change at run time gets INVALID_REQUEST ("Cannot update
  these configs dynamically"), as do bad values (Kafka's KAFKA-13609).
- Other resource types: INVALID_REQUEST. The same resource twice in one
  request, duplicate config names or a null value: INVALID_REQUEST.

``validate_only`` changes nothing.

Version notes: v0-v2 handled; v2+ flexible.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 33
MIN_VERSION = 0
MAX_VERSION = 2

TOPIC = 2
BROKER = 4


def alter_resource(
    ctx: RequestContext, res: Any, compute: Any, validate_only: bool, duplicated: bool = False
) -> dict[str, Any]:
    """Shared by AlterConfigs and IncrementalAlterConfigs.

    ``compute(current, entries, kind)`` returns the new full set of overrides;
    ``kind`` is the resource's ConfigKey table ("topic" or "broker").
    """
    out = {"resource_type": res.resource_type, "resource_name": res.resource_name}
    broker = ctx.broker
    try:
        if duplicated:
            raise KafkaError(ErrorCode.invalid_request, "Each resource must appear at most once.")
        names = [c.name for c in res.configs]
        if len(set(names)) != len(names):
            raise KafkaError(ErrorCode.invalid_request, "Error due to duplicate config keys")
        if res.resource_type == TOPIC:
            topic = broker.topics.get(res.resource_name)
            if topic is None:
                raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown topic {res.resource_name!r}")
            new_configs = compute(dict(topic.configs), res.configs, "topic", broker.topic_log_config(res.resource_name))
            broker.alter_topic_configs(res.resource_name, new_configs, validate_only)
        elif res.resource_type == BROKER:
            per_broker = broker.check_broker_resource(res.resource_name)
            current = dict(broker.dynamic.level(per_broker))
            new_configs = compute(current, res.configs, "broker", None)
            broker.alter_broker_configs(res.resource_name, new_configs, validate_only)
        else:
            raise KafkaError(ErrorCode.invalid_request, f"Unknown resource type {res.resource_type}")
    except KafkaError as exc:
        return {**out, "error_code": exc.code, "error_message": str(exc)}
    return {**out, "error_code": 0, "error_message": None}


def duplicated_resources(resources: Any) -> set[tuple[int, str]]:
    counts = Counter((r.resource_type, r.resource_name) for r in resources)
    return {k for k, n in counts.items() if n > 1}


def _replace(_current: dict[str, str], entries: Any, _kind: str, _effective: Any) -> dict[str, str]:
    nulls = [c.name for c in entries if c.value is None]
    if nulls:
        raise KafkaError(ErrorCode.invalid_request, "Null value not supported for : " + ", ".join(nulls))
    return {c.name: c.value for c in entries}


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    dups = duplicated_resources(request.resources)
    return {
        "throttle_time": 0,
        "responses": [
            alter_resource(ctx, r, _replace, request.validate_only, (r.resource_type, r.resource_name) in dups)
            for r in request.resources
        ],
    }
