"""WriteTxnMarkers (key 27).

Behavior: in Kafka the transaction coordinator sends this to partition
leaders; here the coordinator writes markers in-process, so this API is what
KIP-664's ``Admin.abortTransaction`` uses to abort a hanging transaction on
a partition: for each marker and partition it appends a COMMIT or ABORT
control batch for the producer with the given epoch and coordinator epoch,
after the same checks a coordinator's marker gets (an older coordinator
epoch gets TRANSACTION_COORDINATOR_FENCED, an older producer epoch
INVALID_PRODUCER_EPOCH), and answers once it is durable. Unknown partitions
get UNKNOWN_TOPIC_OR_PARTITION. Markers for the offsets log
(``__consumer_offsets``) resolve the producer's pending offsets.

Version notes: v1-v2 handled (v0 was removed in Kafka 4.0). v1+ flexible;
v2 adds the transaction version of the marker.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.group import TopicPartition

API_KEY = 27
MIN_VERSION = 1
MAX_VERSION = 2


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    out = []
    for marker in request.markers:
        tps = [TopicPartition(t.name, p) for t in marker.topics for p in t.partition_indexes]
        errors = await ctx.broker.markers.write_markers(
            marker.producer_id,
            marker.producer_epoch,
            marker.coordinator_epoch,
            marker.transaction_result,
            tps,
            getattr(marker, "transaction_version", 0),
            strict=True,
        )
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append({"partition_index": tp.partition, "error_code": errors.get(tp, 0)})
        out.append(
            {
                "producer_id": marker.producer_id,
                "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
            }
        )
    return {"markers": out}
