"""TxnOffsetCommit (key 28).

Behavior: a transactional producer commits a consumer group's offsets inside
its transaction (KIP-98; "sendOffsetsToTransaction"). Partitions of unknown
topics get UNKNOWN_TOPIC_OR_PARTITION and are not committed; if none is left
the request ends there. An empty group id gets INVALID_GROUP_ID. Then the
transaction is verified with the transaction coordinator (KIP-890 part 1):
the producer id and epoch must belong to an ongoing transaction that holds
the group's offsets partition (``__consumer_offsets-0``, added by
AddOffsetsToTxn); otherwise the coordinator's error (INVALID_PRODUCER_EPOCH
for a stale epoch, PRODUCER_FENCED answered as INVALID_PRODUCER_EPOCH,
TRANSACTION_ABORTABLE when the offsets partition is not in the transaction,
...) goes to every partition. The group coordinator then
checks the group as Kafka's classic coordinator does (KIP-447, see
GroupCoordinator.txn_commit_offsets): a missing group is created as a simple
group only for generation -1 (else ILLEGAL_GENERATION); FENCED_INSTANCE_ID,
UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION for a zombie of an older generation;
generation -1 with no member id is accepted in any group state; no
REBALANCE_IN_PROGRESS. Metadata longer than ``offset.metadata.max.bytes``
gets OFFSET_METADATA_TOO_LARGE for that partition only. The offsets are
written to the offsets log as a transactional batch and the answer is sent
once it is durable; they stay invisible to OffsetFetch (and make OffsetFetch
with require_stable answer UNSTABLE_OFFSET_COMMIT) until the transaction's
COMMIT marker is durable, and an ABORT marker drops them.

Version notes: v0-v5 handled. v0-v1 offset and metadata; v2 adds the
committed leader epoch; v3 adds generation_id, member_id and
group_instance_id (KIP-447) and is the first flexible version; v0-v2
requests commit as generation -1 with no member, which passes in any state.
v4 changes only errors: the client understands TRANSACTION_ABORTABLE
(KIP-890); below v4 it is answered as INVALID_TXN_STATE, as Kafka's
AddPartitionsToTxnManager does for old clients. v5 (transaction version 2)
also does AddOffsetsToTxn's work: the offsets partition is added to the
ongoing transaction on the fly instead of only being verified, as Kafka
does for versions above 4.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.group import OffsetAndMetadata, TopicPartition
from oncelog.broker.handlers.offset_commit import await_stored
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 28
MIN_VERSION = 0
MAX_VERSION = 5

# Kafka's GroupMetadataManager.maybeConvertOffsetCommitError, for verification errors
_CONVERT = {
    int(ErrorCode.producer_fenced): int(ErrorCode.invalid_producer_epoch),
    int(ErrorCode.network_exception): int(ErrorCode.coordinator_load_in_progress),
    int(ErrorCode.unknown_topic_or_partition): int(ErrorCode.coordinator_not_available),
    int(ErrorCode.not_enough_replicas): int(ErrorCode.coordinator_not_available),
    int(ErrorCode.not_enough_replicas_after_append): int(ErrorCode.coordinator_not_available),
    int(ErrorCode.not_leader_or_follower): int(ErrorCode.not_coordinator),
    int(ErrorCode.kafka_storage_error): int(ErrorCode.not_coordinator),
}


def _offsets_tp() -> TopicPartition:
    try:
        from oncelog.broker.txn import OFFSETS_TP

        return OFFSETS_TP  # type: ignore[no-any-return]
    except ImportError:  # the transaction coordinator package is not there yet
        return TopicPartition("__consumer_offsets", 0)


def convert_verification_error(code: int, version: int) -> int:
    """The error a TxnOffsetCommit of ``version`` answers for a failed verification."""
    code = int(code)
    if code == ErrorCode.transaction_abortable and version < 4:
        return int(ErrorCode.invalid_txn_state)
    return _CONVERT.get(code, code)


async def verify_transaction(ctx: RequestContext, producer_id: int, producer_epoch: int) -> int | None:
    """None when the producer's ongoing transaction holds the offsets partition, else the error."""
    txn = getattr(ctx.broker, "txn", None)
    if txn is None:
        return None
    tp = _offsets_tp()
    try:
        error = None
        if ctx.version >= 5 and hasattr(txn, "add_partition_implicitly"):
            error = await txn.add_partition_implicitly(producer_id, producer_epoch, tp)
        if not error:
            error = txn.check_in_txn(producer_id, producer_epoch, tp)
            if error == ErrorCode.invalid_txn_state:
                # not in the transaction: Kafka's verification answers TRANSACTION_ABORTABLE
                # (folded back to INVALID_TXN_STATE below v4 by convert_verification_error)
                error = int(ErrorCode.transaction_abortable)
    except KafkaError as exc:
        error = int(exc.code)
    if not error:
        return None
    return convert_verification_error(error, ctx.version)


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    v = ctx.version
    broker = ctx.broker
    now = broker.clock()
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    plan: list[tuple[str, list[tuple[int, Any]]]] = []  # (topic name, [(partition, tp or error)])
    for t in request.topics:
        topic = broker.topics.get(t.name)
        parts: list[tuple[int, Any]] = []
        for p in t.partitions:
            if topic is None or not 0 <= p.partition_index < len(topic.partitions):
                parts.append((p.partition_index, int(ErrorCode.unknown_topic_or_partition)))
            else:
                tp = TopicPartition(topic.name, p.partition_index)
                epoch = getattr(p, "committed_leader_epoch", -1)
                offsets[tp] = OffsetAndMetadata(p.committed_offset, epoch, p.committed_metadata, now)
                parts.append((p.partition_index, tp))
        plan.append((t.name, parts))
    errors: dict[TopicPartition, int] = {}
    if offsets:
        error = None
        if request.group_id:  # an empty group id is the group coordinator's INVALID_GROUP_ID, checked first
            error = await verify_transaction(ctx, request.producer_id, request.producer_epoch)
        if error is not None:
            errors = {tp: error for tp in offsets}
        else:
            errors, fut = broker.groups.txn_commit_offsets(
                request.group_id,
                request.producer_id,
                request.producer_epoch,
                getattr(request, "generation_id", -1),
                getattr(request, "member_id", ""),
                getattr(request, "group_instance_id", None),
                offsets,
            )
            errors = await await_stored(fut, errors)
    topics = [
        {
            "name": name,
            "partitions": [
                {"partition_index": idx, "error_code": what if isinstance(what, int) else errors[what]}
                for idx, what in parts
            ],
        }
        for name, parts in plan
    ]
    return {"throttle_time": 0, "topics": topics}
