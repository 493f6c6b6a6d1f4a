"""DescribeGroups (key 15).

Behavior: state, protocol type and members (id, group.instance.id, client
id and host) of each group. Only a Stable group shows its selected protocol
and each member's metadata and assignment, as in Kafka. A group that does
not exist is described as "Dead" with no members; from v6 it also carries
GROUP_ID_NOT_FOUND. v3+ with ``include_authorized_operations``: every
operation a group supports (no authorizer, as in Kafka without one), for
groups answered without error; otherwise -2147483648.

Version notes: v0-v6 handled. v1+ throttle time; v3+ authorized operations;
v4+ group.instance.id of members; v5+ flexible; v6+ error message and
GROUP_ID_NOT_FOUND for unknown groups.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.authorized_ops import GROUP_OPERATIONS, NOT_REQUESTED
from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode

API_KEY = 15
MIN_VERSION = 0
MAX_VERSION = 6


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    include_ops = ctx.version >= 3 and getattr(request, "include_authorized_operations", False)
    out = []
    for group_id in request.groups:
        described = ctx.broker.groups.describe_group(group_id)
        if described is None:
            missing = ctx.version >= 6
            described = {
                "group_id": group_id,
                "group_state": "Dead",
                "protocol_type": "",
                "protocol_data": "",
                "members": [],
                "error_code": ErrorCode.group_id_not_found if missing else 0,
                "error_message": f"Group {group_id} not found." if missing else None,
            }
        else:
            described = {**described, "error_code": 0, "error_message": None}
        ok = described["error_code"] == 0
        described["authorized_operations"] = GROUP_OPERATIONS if include_ops and ok else NOT_REQUESTED
        out.append(described)
    return {"throttle_time": 0, "groups": out}
