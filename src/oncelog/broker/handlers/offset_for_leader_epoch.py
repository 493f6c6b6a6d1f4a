"""OffsetForLeaderEpoch (key 23, KIP-101/KIP-320).

Behavior: for each partition, the end offset of the requested leader epoch
from the partition's leader-epoch cache (Kafka's
``LeaderEpochFileCache.endOffsetFor``, ``storage/leader_epoch.py``): the
current epoch gets the log end offset; an older epoch gets the largest
cached epoch <= it and the start offset of the next higher epoch; an epoch
below every cached one gets itself and the first cached start offset; -1, an
epoch above the current one, or an empty cache get leader epoch -1 and end
offset -1 (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET) with no error. Clients
compare the end offset with their position to detect log truncation.

Errors per partition: UNKNOWN_TOPIC_OR_PARTITION; a ``current_leader_epoch``
other than -1 and the partition's epoch gets FENCED_LEADER_EPOCH (older) or
UNKNOWN_LEADER_EPOCH (newer), with epoch and end offset -1. ``replica_id``
(v3+) is not consulted: this node leads every partition, and Kafka answers
consumers (-1), debug clients (-2) and followers from the leader alike.

Leader epochs change when the broker starts: each partition then begins a
new epoch at its log end offset (``PartitionLog.become_leader``).

Version notes: v2-v4 (Kafka 4.x; v0-v1 were removed in 4.0). v2+
current_leader_epoch; v3+ replica_id; v4+ flexible.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import KafkaError

API_KEY = 23
MIN_VERSION = 2
MAX_VERSION = 4


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            entry: dict[str, Any] = {"partition": p.partition, "error_code": 0, "leader_epoch": -1, "end_offset": -1}
            try:
                part = broker.partition(t.topic, p.partition)
                part.check_leader_epoch(p.current_leader_epoch)
            except KafkaError as exc:
                entry["error_code"] = exc.code
            else:
                epoch, end = part.log.leader_epochs.end_offset_for(p.leader_epoch, part.log.log_end_offset)
                entry.update(leader_epoch=epoch, end_offset=end)
            parts.append(entry)
        topics.append({"topic": t.topic, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
