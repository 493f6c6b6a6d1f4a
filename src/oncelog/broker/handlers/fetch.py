"""Fetch (key 1).

Behavior: for each partition, whole stored batches from the one holding
``fetch_offset`` up to the high watermark (the durable end of the log) are
returned as stored bytes; with ``isolation_level=1`` (read_committed) only
batches below the last stable offset are returned, together with the
aborted transactions (producer id, first offset) overlapping the returned
range (Kafka's ``collectAbortedTxns(fetch_offset, upper)``, upper = the
offset after the last returned batch; an empty list when there are none or
nothing is returned). Control batches (transaction markers) are returned
like data; clients skip them. The first batch of the response is returned whole
even when it exceeds ``partition_max_bytes``/``max_bytes`` (KIP-74), so a
consumer always makes progress; later partitions get nothing once the
request's ``max_bytes`` is used up. ``fetch_offset`` below the log start
offset or above the log end offset gets OFFSET_OUT_OF_RANGE. A
``current_leader_epoch`` other than -1 must be the partition's leader epoch:
an older one gets FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH
(v16+ then also name the leader and its epoch in ``current_leader``), as
Kafka's ``Partition.getLocalLog`` checks it. Once the log directory failed
(the broker is stopping) every partition answers KAFKA_STORAGE_ERROR, as
Kafka answers for a partition in an offline log directory.

Long poll: when fewer than ``min_bytes`` are available the handler waits up
to ``max_wait_ms`` for an append to any requested partition to become
durable (which also moves the last stable offset), then reads again. A fetch
has no effects, so it tells the connection at once that the next request may
start (its answer still goes out in request order).

Fetch sessions (KIP-227) are not kept: every response has session id 0, which
tells clients to send full fetch requests, as Kafka does when its session
cache is full.

Version notes:
- v4-v17 handled. v4+ carries isolation_level, last_stable_offset (always
  the partition's LSO) and aborted transactions (null for read_uncommitted).
- v12+ flexible; v13+ names topics by id (UNKNOWN_TOPIC_ID when unknown).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.partition import Partition
from oncelog.protocol.build import to_ms
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.storage.log import OffsetOutOfRangeError
from oncelog.storage.log_dir import log_level

log = logging.getLogger(__name__)

API_KEY = 1
MIN_VERSION = 4
MAX_VERSION = 17


def _empty(index: int, code: int, hw: int = -1, lso: int = -1, log_start: int = -1) -> dict[str, Any]:
    # records is empty, never null, even with an error: the schema allows null
    # but Kafka always sends empty records, and librdkafka rejects a null
    # (MessageSetSize -1) as a protocol parse failure for the whole response.
    return {
        "partition_index": index,
        "error_code": code,
        "high_watermark": hw,
        "last_stable_offset": lso,
        "log_start_offset": log_start,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        "records": b"",
    }


class _Plan:
    """The resolved partitions of one fetch request."""

    def __init__(self, ctx: RequestContext, request: Any) -> None:
        broker = ctx.broker
        self.by_id = ctx.version >= 13
        self.read_committed = request.isolation_level == 1
        self.broker = broker
        self.topics: list[tuple[Any, list[tuple[Any, Partition | None, int, Partition | None]]]] = []
        offline = broker.log_dir.offline  # the log directory failed (the broker is stopping)
        for t in request.topics:
            if self.by_id:
                topic = broker.topics_by_id.get(t.topic_id)
                missing = ErrorCode.unknown_topic_id
                key = t.topic_id
            else:
                topic = broker.topics.get(t.topic)
                missing = ErrorCode.unknown_topic_or_partition
                key = t.topic
            entries = []
            for p in t.partitions:
                part = None
                code = missing
                if topic is not None:
                    if offline and 0 <= p.partition < len(topic.partitions):
                        code = ErrorCode.kafka_storage_error  # Kafka: a partition in an offline log directory
                    elif 0 <= p.partition < len(topic.partitions):
                        part = topic.partitions[p.partition]
                        code = _epoch_error(part, getattr(p, "current_leader_epoch", -1))
                        if code:
                            entries.append((p, None, code, part))
                            continue
                    else:
                        code = ErrorCode.unknown_topic_or_partition
                entries.append((p, part, code, None))
            self.topics.append((key, entries))

    def partitions(self) -> list[Partition]:
        return [part for _, entries in self.topics for _, part, _, _ in entries if part is not None]

    def read(self, max_bytes: int) -> tuple[list[dict[str, Any]], int]:
        out = []
        total = 0
        for key, entries in self.topics:
            parts_out = []
            for req, part, code, fenced in entries:
                if part is None:
                    parts_out.append(_empty(req.partition, code))
                    if fenced is not None:  # Kafka (v16+) tells the client who leads, at which epoch
                        parts_out[-1]["current_leader"] = {"leader_id": self.broker.node_id, "leader_epoch": fenced.leader_epoch}
                    continue
                parts_out.append(self._read_partition(req, part, max_bytes - total, total == 0))
                records = parts_out[-1]["records"]
                if records:
                    total += len(records)
            topic_key = {"topic_id": key} if self.by_id else {"topic": key}
            out.append({**topic_key, "partitions": parts_out})
        return out, total

    def _read_partition(self, req: Any, part: Partition, budget: int, first: bool) -> dict[str, Any]:
        hw = part.high_watermark
        lso = part.last_stable_offset
        log_start = part.log_start_offset
        entry = _empty(req.partition, 0, hw, lso, log_start)
        if self.read_committed:
            entry["aborted_transactions"] = []
        offset = req.fetch_offset
        limit = min(req.partition_max_bytes, budget)
        if offset < log_start or offset > part.log.log_end_offset:
            entry["error_code"] = ErrorCode.offset_out_of_range
            return entry
        upper = lso if self.read_committed else hw
        if offset >= upper or (limit <= 0 and not first):
            entry["records"] = b""
            return entry
        try:
            result = part.log.read(offset, max(limit, 0), max_offset=upper, min_one=first)
            entry["records"] = bytes(result.data)
            if self.read_committed and result.data:
                entry["aborted_transactions"] = [
                    {"producer_id": pid, "first_offset": first}
                    for pid, first in part.aborted_transactions(offset, result.next_offset)
                ]
        except OffsetOutOfRangeError:
            entry["error_code"] = ErrorCode.offset_out_of_range
            return entry
        except OSError as exc:
            return self._read_failed(entry, part, exc)
        return entry

    def _read_failed(self, entry: dict[str, Any], part: Partition, exc: OSError) -> dict[str, Any]:
        """A read of the log failed. Kafka's LocalLog.read runs under maybeHandleIOException: the
        log directory goes offline and the partition is answered KAFKA_STORAGE_ERROR (the broker
        then stops). A log closed meanwhile (its topic deleted during the long poll) is no disk
        error: UNKNOWN_TOPIC_OR_PARTITION, the directory stays online."""
        entry["records"] = b""  # never null (see _empty)
        if self.read_committed:
            entry["aborted_transactions"] = []
        if part.log.closed and not self.broker.log_dir.offline:
            entry["error_code"] = ErrorCode.unknown_topic_or_partition
            return entry
        error = self.broker.log_dir.failed(f"read of {part.topic}-{part.index}", exc)
        log.log(log_level(error, logging.ERROR), "fetch from %s-%d failed: %s", part.topic, part.index, exc)
        entry["error_code"] = ErrorCode.kafka_storage_error
        return entry


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    ctx.applied()  # a fetch changes nothing: the connection's next request need not wait for the long poll
    plan = _Plan(ctx, request)
    max_bytes = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    wait_ms = to_ms(request.max_wait)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    topics, total = plan.read(max_bytes)
    while total < request.min_bytes and not _has_error(topics):
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        fut: asyncio.Future[None] = loop.create_future()
        parts = plan.partitions()
        if not parts:
            await asyncio.sleep(remaining)
            break
        for p in parts:
            p.add_waiter(fut)
        try:
            await asyncio.wait_for(fut, remaining)
        except asyncio.TimeoutError:
            pass
        finally:
            for p in parts:
                p.remove_waiter(fut)
        topics, total = plan.read(max_bytes)
    return {
        "throttle_time": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": topics,
        "node_endpoints": [],
    }


def _epoch_error(part: Partition, current_leader_epoch: int) -> int:
    try:
        part.check_leader_epoch(current_leader_epoch)
    except KafkaError as exc:
        return exc.code
    return 0


def _has_error(topics: list[dict[str, Any]]) -> bool:
    return any(p["error_code"] for t in topics for p in t["partitions"])

