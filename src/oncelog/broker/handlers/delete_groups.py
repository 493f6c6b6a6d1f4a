"""DeleteGroups (key 42).

Behavior: deletes Empty groups with their committed offsets (tombstones in
the offsets log, durable before the answer; if that write fails, NOT_COORDINATOR
as Kafka answers a storage error of the append). A group with members gets
NON_EMPTY_GROUP; one that does not exist GROUP_ID_NOT_FOUND.

Version notes: v0-v2 handled. v2+ flexible.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.group import write_error

API_KEY = 42
MIN_VERSION = 0
MAX_VERSION = 2


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    names = list(request.groups_names)
    errors, futures = ctx.broker.groups.delete_groups(names)
    failed = 0
    for fut in futures:
        failed = await write_error(fut) or failed  # NOT_COORDINATOR for a storage error, see append_error
    results = []
    for name in names:
        code = errors.get(name, 0) or failed
        results.append({"group_id": name, "error_code": code})
    return {"throttle_time": 0, "results": results}
