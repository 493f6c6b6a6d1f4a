"""AddPartitionsToTxn (key 24).

Behavior: adds partitions to the producer's transaction (Empty or
Complete* -> Ongoing), durably in the transaction log before answering.
Partitions of unknown topics get UNKNOWN_TOPIC_OR_PARTITION and the other
partitions of the request OPERATION_NOT_ATTEMPTED (nothing is added), as in
Kafka. Coordinator errors apply to every partition: a producer id that does
not belong to the transactional id gets INVALID_PRODUCER_ID_MAPPING, an old
epoch PRODUCER_FENCED, a pending state change or a transaction in
PrepareCommit/PrepareAbort CONCURRENT_TRANSACTIONS. Partitions already in
the transaction are answered at once without a log write.

Version notes: v0-v5 handled.
- v0-v3 carry one transaction (fields ``v3_and_below_*``); v2 adds
  PRODUCER_FENCED (v0-v1 get INVALID_PRODUCER_EPOCH instead); v3+ flexible.
- v4+ (KIP-890, broker-to-broker in Kafka) batch several transactions, each
  with ``verify_only``: verification answers INVALID_TXN_STATE for
  partitions that are not in the ongoing transaction and changes nothing.
  v5 adds TRANSACTION_ABORTABLE.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.group import TopicPartition
from oncelog.protocol.errors import ErrorCode

API_KEY = 24
MIN_VERSION = 0
MAX_VERSION = 5


async def _one(ctx: RequestContext, txn_id: str, pid: int, epoch: int, topics: Any, verify_only: bool) -> list[dict[str, Any]]:
    broker = ctx.broker
    wanted = [TopicPartition(t.name, p) for t in topics for p in t.partitions]
    unknown = set()
    for tp in wanted:
        topic = broker.topics.get(tp.topic)
        if topic is None or not 0 <= tp.partition < len(topic.partitions) or topic.internal:
            unknown.add(tp)
    if unknown:
        errors = {
            tp: int(ErrorCode.unknown_topic_or_partition if tp in unknown else ErrorCode.operation_not_attempted)
            for tp in wanted
        }
    else:
        errors = await broker.txn.add_partitions(txn_id, pid, epoch, wanted, verify_only=verify_only)
    if ctx.version < 2:
        errors = {
            tp: int(ErrorCode.invalid_producer_epoch) if e == ErrorCode.producer_fenced else e for tp, e in errors.items()
        }
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for tp in wanted:
        by_topic.setdefault(tp.topic, []).append(
            {"partition_index": tp.partition, "partition_error_code": errors.get(tp, 0)}
        )
    return [{"name": name, "results_by_partition": parts} for name, parts in by_topic.items()]


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if ctx.version < 4:
        results = await _one(
            ctx,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            request.v3_and_below_topics,
            False,
        )
        return {"throttle_time": 0, "results_by_topic_v3_and_below": results}
    out = []
    for txn in request.transactions:
        results = await _one(ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.topics, txn.verify_only)
        out.append({"transactional_id": txn.transactional_id, "topic_results": results})
    return {"throttle_time": 0, "error_code": 0, "results_by_transaction": out}
