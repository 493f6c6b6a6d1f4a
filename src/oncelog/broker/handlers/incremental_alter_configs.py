"""IncrementalAlterConfigs (key 44).

Behavior: applies SET (0), DELETE (1), APPEND (2) and SUBTRACT (3) to a
TOPIC or BROKER resource's overrides, then validates the result as
AlterConfigs does. APPEND and SUBTRACT work on LIST configs only
(``cleanup.policy``, ``leader.replication.throttled.replicas``, ...): they
start from the current value (the override, else the broker's default) and
add the values not yet in it, or remove the given ones; on any other config
they get INVALID_CONFIG ("Can't APPEND to key X because its type is not
LIST.", Kafka's KRaft controller's answer). A null value for anything but
DELETE gets INVALID_REQUEST; an unknown operation INVALID_REQUEST.

Version notes: v0-v1 handled; v1+ flexible.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.dynamic_config import LOG_CONFIGS
from oncelog.broker.handlers.alter_configs import alter_resource, duplicated_resources
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.storage.config import LIST, TOPIC_CONFIGS, format_value

API_KEY = 44
MIN_VERSION = 0
MAX_VERSION = 1

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def _list_key(name: str, kind: str) -> Any:
    """The topic ConfigKey behind a topic or broker config name, if it is a LIST."""
    if kind == "broker":
        name = LOG_CONFIGS.get(name, name)
    key = TOPIC_CONFIGS.get(name)
    return key if key is not None and key.type == LIST else None


def _make_apply(ctx: RequestContext) -> Any:
    def apply(current: dict[str, str], entries: Any, kind: str, effective: Any) -> dict[str, str]:
        nulls = [c.name for c in entries if c.config_operation != DELETE and c.value is None]
        if nulls:
            raise KafkaError(ErrorCode.invalid_request, "Null value not supported for : " + ", ".join(nulls))
        for c in entries:
            op = c.config_operation
            if op == SET:
                current[c.name] = c.value
            elif op == DELETE:
                current.pop(c.name, None)
            elif op in (APPEND, SUBTRACT):
                verb = "APPEND" if op == APPEND else "SUBTRACT"
                key = _list_key(c.name, kind)
                if key is None:
                    raise KafkaError(ErrorCode.invalid_config, f"Can't {verb} to key {c.name} because its type is not LIST.")
                if c.name in current:
                    old = current[c.name]
                else:  # the value it has now: the broker's default for this topic or broker
                    base = effective if effective is not None else ctx.broker.logs.defaults
                    old = format_value(key, base.get(key.name))
                items = [v for v in old.split(",") if v] if old.strip() else []
                given = c.value.split(",")
                if op == APPEND:
                    items += [v for v in given if v not in items]
                else:
                    items = [v for v in items if v not in given]
                current[c.name] = ",".join(items)
            else:
                raise KafkaError(ErrorCode.invalid_request, f"Unknown operations type {op}")
        return current

    return apply


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    dups = duplicated_resources(request.resources)
    apply = _make_apply(ctx)
    return {
        "throttle_time": 0,
        "responses": [
            alter_resource(ctx, r, apply, request.validate_only, (r.resource_type, r.resource_name) in dups)
            for r in request.resources
        ],
    }
