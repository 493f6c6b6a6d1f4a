"""DescribeTransactions (key 65, KIP-664).

Behavior: for each transactional id, its state as the coordinator holds it:
state name (Kafka's: Empty, Ongoing, PrepareCommit, ...), timeout, start
time of the open transaction (-1 when none), producer id and epoch, and the
partitions of the transaction. An unknown id gets TRANSACTIONAL_ID_NOT_FOUND.

Version notes: v0 only (flexible). The response is encoded by hand: kio's
``datetime_i64`` type cannot carry the -1 start time Kafka sends for an id
with no open transaction.
"""

from __future__ import annotations

import struct
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.fast_produce import array_len, string

API_KEY = 65
MIN_VERSION = 0
MAX_VERSION = 0

_STATE_FIXED = struct.Struct(">iqqh")  # timeout ms, start time ms, producer id, producer epoch
_NO_TAGS = b"\x00"


def encode_response(states: list[dict[str, Any]], throttle_ms: int = 0) -> bytes:
    out = [struct.pack(">i", throttle_ms), array_len(len(states), True)]
    for s in states:
        out += [
            struct.pack(">h", s["error_code"]),
            string(s["transactional_id"], True),
            string(s["transaction_state"], True),
            _STATE_FIXED.pack(
                s["transaction_timeout_ms"], s["transaction_start_time_ms"], s["producer_id"], s["producer_epoch"]
            ),
            array_len(len(s["topics"]), True),
        ]
        for t in s["topics"]:
            parts = t["partitions"]
            out += [string(t["topic"], True), array_len(len(parts), True)]
            out += [struct.pack(">i", p) for p in parts]
            out.append(_NO_TAGS)
        out.append(_NO_TAGS)
    out.append(_NO_TAGS)
    return b"".join(out)


async def handle(ctx: RequestContext, request: Any) -> bytes:
    return encode_response(ctx.broker.txn.describe(list(request.transactional_ids)))
