"""ListGroups (key 16).

Behavior: every group this coordinator has (all groups, on one node), with
its protocol type ("" for groups that only store offsets), state and type
("classic"). Dead groups are not listed.

Version notes: v0-v5 handled. v1+ throttle time; v3+ flexible; v4+ states
filter (case-insensitive); v5+ types filter: only "classic" groups exist.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext

API_KEY = 16
MIN_VERSION = 0
MAX_VERSION = 5


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    groups = ctx.broker.groups.list_groups(
        getattr(request, "states_filter", ()) or (), getattr(request, "types_filter", ()) or ()
    )
    return {"throttle_time": 0, "error_code": 0, "groups": groups}
