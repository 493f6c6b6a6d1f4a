"""IncrementalAlterConfigs (key 44).

Behavior: applies SET (0) and DELETE (1) to a TOPIC resource's overrides;
APPEND (2) and SUBTRACT (3) apply only to list configs, and none of the
implemented configs is a list, so they get INVALID_CONFIG. Otherwise as
AlterConfigs.

Version notes: v0-v1 handled; v1+ flexible.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.handlers.alter_configs import alter_resource
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 44
MIN_VERSION = 0
MAX_VERSION = 1


def _apply(current: dict[str, str], entries: Any) -> dict[str, str]:
    for c in entries:
        if c.config_operation == 0:
            if c.value is None:
                raise KafkaError(ErrorCode.invalid_request, f"SET of {c.name} needs a value")
            current[c.name] = c.value
        elif c.config_operation == 1:
            current.pop(c.name, None)
        elif c.config_operation in (2, 3):
            raise KafkaError(ErrorCode.invalid_config, f"{c.name} is not a list config")
        else:
            raise KafkaError(ErrorCode.invalid_request, f"unknown config operation {c.config_operation}")
    return current


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "responses": [alter_resource(ctx, r, _apply, request.validate_only) for r in request.resources],
    }
