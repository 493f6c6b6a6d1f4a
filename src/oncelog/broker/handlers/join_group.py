"""JoinGroup (key 11).

Behavior: the classic group coordinator's join (see
:meth:`oncelog.broker.group.coordinator.GroupCoordinator.join_group` and
docs/groups.md). The response waits until the rebalance completes: all
members rejoined, the rebalance timeout passed, or (for a group leaving
Empty) ``group.initial.rebalance.delay.ms``. The leader gets every
member's metadata for the selected protocol; the others get an empty list.

Version notes: v0-v9 handled. v0 has no rebalance timeout (the session
timeout is used). v4+: a member without id gets MEMBER_ID_REQUIRED with an
id to join with (not for static members). v5+ group.instance.id (static
membership). v6+ flexible. v7+ protocol type in the response and a null
protocol name when there is none (older versions get ""). v8+ reason
(logged by nobody). v9+: a static leader that rejoins a stable group gets
skip_assignment=true with the member list (KIP-814); older versions get the
old leader id instead so they do not assign.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.build import to_ms

API_KEY = 11
MIN_VERSION = 0
MAX_VERSION = 9


def client_host(ctx: RequestContext) -> str:
    host = ctx.peer.rpartition(":")[0] or ctx.peer
    return "/" + host.strip("[]")


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    v = ctx.version
    session = to_ms(request.session_timeout)
    rebalance = to_ms(request.rebalance_timeout) if v >= 1 else session
    fut = ctx.broker.groups.join_group(
        request.group_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        session,
        rebalance,
        request.protocol_type,
        [(p.name, p.metadata) for p in request.protocols],
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
        require_known_member_id=v >= 4,
        support_skip_assignment=v >= 9,
    )
    if not fut.done():  # the member's join is registered; the rest only waits for the rebalance
        ctx.waiting()
    result = dict(await fut)
    if v < 7 and result["protocol_name"] is None:
        result["protocol_name"] = ""
    result["throttle_time"] = 0
    return result
