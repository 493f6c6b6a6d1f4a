"""SyncGroup (key 14).

Behavior: followers wait for the leader's SyncGroup; the leader's
assignments (members it left out get an empty one) are written durably with
the group metadata, then every waiting member gets its assignment and the
group becomes Stable. In Stable a SyncGroup returns the current assignment.
Errors: UNKNOWN_MEMBER_ID (unknown group or member, or an Empty group),
FENCED_INSTANCE_ID, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL (v5+
protocol type/name not the group's), REBALANCE_IN_PROGRESS (the group is
preparing a rebalance, or one started while waiting), NOT_COORDINATOR to
every waiting member when writing the assignment fails (an I/O error of the
offsets log; the group then rebalances).

Version notes: v0-v5 handled. v3+ group.instance.id; v4+ flexible; v5+
protocol type and name in request and response.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext

API_KEY = 14
MIN_VERSION = 0
MAX_VERSION = 5


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    fut = ctx.broker.groups.sync_group(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        getattr(request, "protocol_type", None),
        getattr(request, "protocol_name", None),
        {a.member_id: a.assignment for a in request.assignments},
    )
    if not fut.done():
        group = ctx.broker.groups.group(request.group_id)
        if group is not None and not group.is_leader(request.member_id):
            ctx.waiting()  # a follower only waits for the leader's assignment (the leader's is stored first)
    result = dict(await fut)
    result["throttle_time"] = 0
    return result
