"""LeaveGroup (key 13).

Behavior: removes members; a Stable or CompletingRebalance group then
rebalances, a preparing one may complete its join. A member id of "" with a
group.instance.id removes that static member (administrative removal).
Per member: UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID; an unknown group
answers UNKNOWN_MEMBER_ID for every member.

Version notes: v0-v5 handled. v0-v2 carry one member id and answer with a
single error code (the member's); v3+ batch members with
group.instance.ids and answer per member; v4+ flexible; v5 adds a reason.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext

API_KEY = 13
MIN_VERSION = 0
MAX_VERSION = 5


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    groups = ctx.broker.groups
    if ctx.version < 3:
        top, errors = groups.leave_group(request.group_id, [(request.member_id, None)])
        return {"throttle_time": 0, "error_code": top or (errors[0] if errors else 0)}
    members = [(m.member_id, m.group_instance_id) for m in request.members]
    top, errors = groups.leave_group(request.group_id, members)
    return {
        "throttle_time": 0,
        "error_code": top,
        "members": [
            {"member_id": mid, "group_instance_id": iid, "error_code": err}
            for (mid, iid), err in zip(members, errors)
        ],
    }
