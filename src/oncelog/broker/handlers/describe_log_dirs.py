"""DescribeLogDirs (key 35).

Behavior: one log directory, the broker's data directory (absolute path).
As Kafka's ``ReplicaManager.describeLogDirs``, every topic of the directory
is listed, each with the requested partitions it holds: a null topic list
means every partition; a requested partition or topic this broker does not
have is left out (no error). Per partition: its size in bytes (the sum of its
segment files), offset lag 0 (the log end offset minus the high watermark is
never counted for the current log: Kafka reports max(hw - leo, 0)), not a
future log. v4+ carry the total and usable bytes of the file system holding
the directory (``statvfs``: blocks and blocks available to unprivileged
users, times the fragment size). The broker's internal logs
(``__consumer_offsets-0``, ``__transaction_state-0``) are not listed: they
are no topics here.

Version notes: v1-v4 (Kafka 4.x; v0 was removed in 4.0). v2+ flexible; v3+
a top-level error code; v4+ total/usable bytes.
"""

from __future__ import annotations

import os
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode

API_KEY = 35
MIN_VERSION = 1
MAX_VERSION = 4


def _volume(path: str) -> tuple[int, int]:
    try:
        st = os.statvfs(path)
    except OSError:
        return -1, -1
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    wanted: dict[str, set[int]] | None = None
    if request.topics is not None:
        wanted = {}
        for t in request.topics:
            wanted.setdefault(t.topic, set()).update(t.partitions)
    log_dir = str(broker.config.data_dir.resolve())
    topics = []
    for name, topic in list(broker.topics.items()):
        chosen = topic.partitions if wanted is None else [p for p in topic.partitions if p.index in wanted.get(name, ())]
        topics.append({
            "name": name,
            "partitions": [
                {"partition_index": p.index, "partition_size": p.log.size_bytes, "offset_lag": 0, "is_future_key": False}
                for p in chosen
            ],
        })
    total, usable = _volume(log_dir)
    result = {"error_code": ErrorCode.none, "log_dir": log_dir, "topics": topics,
              "total_bytes": total, "usable_bytes": usable}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "results": [result]}
