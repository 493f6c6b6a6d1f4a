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

-5 (LATEST_TIERED, v9+) and -6 (EARLIEST_PENDING_UPLOAD, v11+) get offset -1
with timestamp -1 and leader epoch -1: nothing is tiered (Kafka's answer for
a topic without remote storage).

Per partition, as Kafka's ReplicaManager: a partition named twice gets
INVALID_REQUEST; a negative timestamp that is no sentinel, or a sentinel
newer than the request version, UNSUPPORTED_VERSION; a
``current_leader_epoch`` (v4+) other than -1 and the partition's epoch,
FENCED_LEADER_EPOCH (older) or UNKNOWN_LEADER_EPOCH (newer). The answer's
leader epoch is the partition's for -1, the earliest cached epoch for -2/-4
(if it starts at or below the log start), and the epoch of the offset found
otherwise (-1 when none).

Version notes: v1-v11 handled. v2+ isolation level; v4+ leader epoch; v6+
flexible; v10+ a timeout (for tiered storage; nothing here waits).
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 2
MIN_VERSION = 1
MAX_VERSION = 11

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6
# the first request version that may name each sentinel (Kafka's timestampMinSupportedVersion)
SENTINEL_MIN_VERSION = {LATEST: 1, EARLIEST: 1, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9,
                        EARLIEST_PENDING_UPLOAD: 11}


def _untiered() -> dict[str, Any]:
    """-5 and -6 on a log without remote storage: nothing, with no epoch."""
    return {"timestamp": -1, "offset": -1, "leader_epoch": -1}


def _epoch_of(part: Any, offset: int) -> int:
    """The leader epoch of ``offset`` from the epoch cache (-1 for none or no offset)."""
    if offset < 0:
        return -1
    epoch = part.log.leader_epochs.epoch_for_offset(offset)
    return -1 if epoch is None else epoch


def _earliest_epoch(part: Any) -> int:
    first = part.log.leader_epochs.earliest_entry
    return first[0] if first is not None and first[1] <= part.log_start_offset else -1


def _lookup(
    broker: Any, topic: str, index: int, ts: int, read_committed: bool, current_leader_epoch: int = -1
) -> dict[str, Any]:
    part = broker.partition(topic, index)
    part.check_leader_epoch(current_leader_epoch)
    if ts in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        return _untiered()
    if ts in (EARLIEST, EARLIEST_LOCAL):
        return {"timestamp": -1, "offset": part.log_start_offset, "leader_epoch": _earliest_epoch(part)}
    bound = part.last_stable_offset if read_committed else part.high_watermark
    if ts == LATEST:
        return {"timestamp": -1, "offset": bound, "leader_epoch": part.leader_epoch}
    if ts == MAX_TIMESTAMP:
        found = part.log.max_timestamp_offset()
    else:
        found = part.log.offset_for_timestamp(ts)
    if found is None or found[0] >= bound:
        return {"timestamp": -1, "offset": -1, "leader_epoch": -1}
    offset = max(found[0], part.log_start_offset)
    return {"timestamp": found[1], "offset": offset, "leader_epoch": _epoch_of(part, offset)}


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    read_committed = getattr(request, "isolation_level", 0) == 1
    named = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    twice = {tp for tp in named if named.count(tp) > 1} if len(set(named)) < len(named) else set()
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            entry = {"partition_index": p.partition_index, "leader_epoch": -1}
            try:
                if (t.name, p.partition_index) in twice:
                    raise KafkaError(ErrorCode.invalid_request, "partition named twice")
                if p.timestamp < 0 and ctx.version < SENTINEL_MIN_VERSION.get(p.timestamp, 1 << 15):
                    raise KafkaError(ErrorCode.unsupported_version, f"timestamp {p.timestamp} needs a newer version")
                entry.update(
                    _lookup(broker, t.name, p.partition_index, p.timestamp, read_committed,
                            getattr(p, "current_leader_epoch", -1)),
                    error_code=0,
                )
            except KafkaError as exc:
                entry.update(timestamp=-1, offset=-1, leader_epoch=-1, error_code=exc.code)
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
