"""DescribeProducers (key 61, KIP-664).

Behavior: for each requested partition, the producers with state on it:
id, epoch, last sequence, last append time, coordinator epoch and the first
offset of the open transaction (-1 when none). Unknown partitions get
UNKNOWN_TOPIC_OR_PARTITION.

Version notes: v0 only (flexible).
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import KafkaError

API_KEY = 61
MIN_VERSION = 0
MAX_VERSION = 0


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    topics = []
    for t in request.topics:
        parts = []
        for index in t.partition_indexes:
            entry: dict[str, Any] = {"partition_index": index, "error_code": 0, "error_message": None}
            try:
                partition = ctx.broker.partition(t.name, index)
            except KafkaError as exc:
                parts.append({**entry, "error_code": exc.code, "error_message": str(exc), "active_producers": []})
                continue
            entry["active_producers"] = [
                {
                    "producer_id": e.producer_id,
                    "producer_epoch": e.epoch,
                    "last_sequence": e.last_seq,
                    "last_timestamp": e.last_timestamp,
                    "coordinator_epoch": e.coordinator_epoch,
                    "current_txn_start_offset": e.current_txn_first_offset,
                }
                for e in partition.producers
            ]
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
