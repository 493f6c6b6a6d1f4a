"""DeleteRecords (key 21).

Behavior: moves each partition's log start offset up to the requested
offset (``kafka-delete-records.sh``, AdminClient ``deleteRecords``); whole
segments below it are deleted and the rest of the first one becomes
unreadable. Offset -1 means the high watermark. The new log start offset is
written durably (``log-start-offset`` checkpoint, fsynced) before the answer,
which carries it as ``low_watermark``. An offset at or below the current log
start changes nothing and answers the current one. Afterwards Fetch below it
gets OFFSET_OUT_OF_RANGE and ListOffsets earliest returns it.

Errors per partition (``low_watermark`` -1), as Kafka's
``Partition.deleteRecordsOnLeader`` / ``UnifiedLog.maybeIncrementLogStartOffset``:
UNKNOWN_TOPIC_OR_PARTITION; OFFSET_OUT_OF_RANGE for an offset beyond the high
watermark or negative other than -1. With one replica there is nothing to
wait for: ``timeout`` is not used.

Version notes: v0-v2 handled (Kafka 4.x's range); v1 changes nothing on the
wire; v2 is flexible.
"""

from __future__ import annotations

import logging
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.storage.log_dir import log_level

API_KEY = 21
MIN_VERSION = 0
MAX_VERSION = 2

HIGH_WATERMARK = -1

log = logging.getLogger(__name__)


def _delete(ctx: RequestContext, topic: str, index: int, offset: int) -> tuple[int, int]:
    """(error code, low watermark) for one partition."""
    try:
        partition = ctx.broker.partition(topic, index)
    except KafkaError as exc:
        return int(exc.code), -1
    hw = partition.high_watermark
    target = hw if offset == HIGH_WATERMARK else offset
    if target < 0 or target > hw:
        log.info("delete records of %s-%d to %d refused: high watermark is %d", topic, index, offset, hw)
        return int(ErrorCode.offset_out_of_range), -1
    before = partition.log_start_offset
    try:
        low = partition.log.delete_records_before(target)
    except OSError as exc:  # the log directory went (or was) offline (PartitionLog.io)
        log.log(log_level(exc, logging.ERROR), "delete records of %s-%d failed: %s", topic, index, exc)
        return int(ErrorCode.kafka_storage_error), -1
    if low > before:
        log.info("deleted records of %s-%d: log start offset %d -> %d", topic, index, before, low)
    return 0, low


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            code, low = _delete(ctx, t.name, p.partition_index, p.offset)
            parts.append({"partition_index": p.partition_index, "low_watermark": low, "error_code": code})
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
