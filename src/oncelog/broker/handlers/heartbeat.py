"""Heartbeat (key 12).

Behavior: keeps the member's session alive. NONE in Stable and
CompletingRebalance; REBALANCE_IN_PROGRESS while the group prepares a
rebalance (the member must rejoin); UNKNOWN_MEMBER_ID for an unknown group
or member (or an Empty group); FENCED_INSTANCE_ID when the
group.instance.id belongs to another member id; ILLEGAL_GENERATION for a
stale generation; INVALID_GROUP_ID for an empty group id.

Version notes: v0-v4 handled. v1+ throttle time; v3+ group.instance.id;
v4+ flexible.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext

API_KEY = 12
MIN_VERSION = 0
MAX_VERSION = 4


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    error = ctx.broker.groups.heartbeat(
        request.group_id, request.generation_id, request.member_id, getattr(request, "group_instance_id", None)
    )
    return {"throttle_time": 0, "error_code": error}
