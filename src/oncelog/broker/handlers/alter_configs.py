"""AlterConfigs (key 33).

Behavior: replaces the whole set of overrides of a TOPIC resource (Kafka's
legacy, non-incremental semantics; configs absent from the request revert to
their defaults). Unknown or unsupported config names get INVALID_CONFIG, bad
values INVALID_CONFIG, unknown topics UNKNOWN_TOPIC_OR_PARTITION. Broker
configs are static here: BROKER resources get INVALID_REQUEST.
``validate_only`` changes nothing.

Version notes: v0-v2 handled; v2+ flexible.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 33
MIN_VERSION = 0
MAX_VERSION = 2

TOPIC = 2


def alter_resource(ctx: RequestContext, res: Any, compute: Any, validate_only: bool) -> dict[str, Any]:
    """Shared by AlterConfigs and IncrementalAlterConfigs."""
    out = {"resource_type": res.resource_type, "resource_name": res.resource_name}
    try:
        if res.resource_type != TOPIC:
            raise KafkaError(ErrorCode.invalid_request, "only TOPIC configs can be altered; broker configs are static")
        topic = ctx.broker.topics.get(res.resource_name)
        if topic is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown topic {res.resource_name!r}")
        new_configs = compute(dict(topic.configs), res.configs)
        ctx.broker.alter_topic_configs(res.resource_name, new_configs, validate_only)
    except KafkaError as exc:
        return {**out, "error_code": exc.code, "error_message": str(exc)}
    return {**out, "error_code": 0, "error_message": None}


def _replace(_current: dict[str, str], entries: Any) -> dict[str, str]:
    return {c.name: c.value for c in entries if c.value is not None}


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "responses": [alter_resource(ctx, r, _replace, request.validate_only) for r in request.resources],
    }
