"""ListTransactions (key 66, KIP-664).

Behavior: the transactional ids the coordinator knows with their producer id
and state, filtered by state names, producer ids, (v1+) a minimum running
time of the open transaction and (v2+) a regular expression on the id.
State names the broker does not know are echoed in
``unknown_state_filters`` and match nothing (a filter of only unknown names
lists nothing, as in Kafka).

Version notes: v0-v2 handled (all flexible). v1 adds DurationFilter; v2 adds
TransactionalIdPattern.
"""

from __future__ import annotations

import re
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.txn import STATE_NAMES
from oncelog.protocol.errors import ErrorCode

API_KEY = 66
MIN_VERSION = 0
MAX_VERSION = 2



async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    states = list(request.state_filters)
    pattern = getattr(request, "transactional_id_pattern", None) or None
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error:
            return {"throttle_time": 0, "error_code": ErrorCode.invalid_regular_expression,
                    "unknown_state_filters": [], "transaction_states": []}
    return {
        "throttle_time": 0,
        "error_code": 0,
        "unknown_state_filters": [s for s in states if s not in STATE_NAMES],
        # unknown names stay in the filter and match nothing, as in Kafka
        "transaction_states": ctx.broker.txn.list(
            states,
            list(request.producer_id_filters),
            getattr(request, "duration_filter", -1),
            pattern,
        ),
    }
