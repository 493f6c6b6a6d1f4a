"""ListOffsets (key 2).

Behavior: per partition, timestamp -2 (EARLIEST) gives the log start offset,
-1 (LATEST) the high watermark (read_uncommitted) or the last stable offset
(read_committed), -3 (MAX_TIMESTAMP, v7+) the offset of the batch with the
largest timestamp, -4 (EARLIEST_LOCAL, v8+) the log start offset (no tiered
storage); any other timestamp the offset and timestamp of the first record
whose timestamp is >= it, found in the first batch whose max timestamp is >=
it (decompressed if need be, Kafka's ``FileRecords.searchForTimestamp``), or
offset -1 when there is none. Lookups by timestamp (and -3) never
return an offset at or above the bound of the isolation level (the high
watermark, or the last stable offset for read_committed); they answer -1
instead, as Kafka does. Unknown partitions get UNKNOWN_TOPIC_OR_PARTITION.

Version notes: v1-v8 handled. v2+ isolation level; v4+ leader epoch; v6+
flexible.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import KafkaError

API_KEY = 2
MIN_VERSION = 1
MAX_VERSION = 8

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4


def _lookup(broker: Any, topic: str, index: int, ts: int, read_committed: bool) -> dict[str, Any]:
    part = broker.partition(topic, index)
    if ts in (EARLIEST, EARLIEST_LOCAL):
        return {"timestamp": -1, "offset": part.log_start_offset}
    bound = part.last_stable_offset if read_committed else part.high_watermark
    if ts == LATEST:
        return {"timestamp": -1, "offset": bound}
    if ts == MAX_TIMESTAMP:
        found = part.log.max_timestamp_offset()
    else:
        found = part.log.offset_for_timestamp(ts)
    if found is None or found[0] >= bound:
        return {"timestamp": -1, "offset": -1}
    offset, timestamp = found
    return {"timestamp": timestamp, "offset": max(offset, part.log_start_offset)}


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    read_committed = getattr(request, "isolation_level", 0) == 1
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            entry = {"partition_index": p.partition_index, "leader_epoch": 0}
            try:
                entry.update(_lookup(broker, t.name, p.partition_index, p.timestamp, read_committed), error_code=0)
            except KafkaError as exc:
                entry.update(timestamp=-1, offset=-1, error_code=exc.code)
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
