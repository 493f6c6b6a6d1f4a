"""Produce (key 0).

Behavior: for each partition, the record batch is validated as opaque
bytes (one v2 batch, length, magic, CRC32C, codec, size: see
:func:`oncelog.protocol.records.validate_produce_records`), its base offset is
patched and it is appended to the partition log. Nothing is decompressed,
except in topics whose ``compression.type`` is not ``producer`` (the batch is
recompressed, :mod:`oncelog.broker.recompress`) or that set
``message.timestamp.before/after.max.ms`` (INVALID_TIMESTAMP out of range).
Once all appends of the request are done the handler calls ``ctx.applied()``
and only then waits for fsync: the next request of the connection starts
after the appends (so the requests of one connection are appended in arrival
order) while the fsync waits of successive requests overlap. With acks=1 or
acks=-1 the response is sent only after the group-commit fdatasync covering
the appends (one node: both mean "durable here"); with acks=0 no response is
sent at all, as in Kafka, and if any partition failed the connection is
closed (Kafka does so, so that the client refreshes its metadata).

Idempotent batches (producer id >= 0) are checked against the partition's
producer state (:mod:`oncelog.broker.producer_state`): a retried batch that
is one of the producer's last 5 gets its original base offset back and is
not written again; an older epoch gets INVALID_PRODUCER_EPOCH; a sequence gap
or a new epoch not starting at 0 gets OUT_OF_ORDER_SEQUENCE_NUMBER. A
producer id with no state on the partition (never issued here, e.g. after the
data dir was replaced, or expired) is accepted at any sequence, as Kafka
does: UNKNOWN_PRODUCER_ID is never answered. A duplicate
still waits for the fsync round, so its answer never precedes durability.

Transactional batches: a batch that opens a transaction on a partition is
verified with the transaction coordinator (KIP-890 part 1): the partition
must be in the producer's ongoing transaction with this epoch, else
TRANSACTION_ABORTABLE from v11, INVALID_TXN_STATE ("Partition was not added
to the transaction") below, as Kafka maps its verification answer per
version (``transactionSupportedOperation``); a fenced
epoch gets INVALID_PRODUCER_EPOCH and a state change in progress at the
coordinator NOT_ENOUGH_REPLICAS (retriable). With transaction version 2
(Produce v12 and ``transaction.version`` >= 2) the partition is added to the
transaction implicitly instead (KIP-890 part 2): all of a request's new
partitions in one coordinator write, awaited before appending (the next
request of the connection waits for it too). Other coordinator refusals get
TRANSACTION_ABORTABLE (v11+) or INVALID_TXN_STATE. A non-transactional batch from a producer with
an open transaction gets INVALID_TXN_STATE.

acks=-1 to a topic whose ``min.insync.replicas`` is above 1 gets NOT_ENOUGH_REPLICAS and
nothing is appended, as a one-broker Kafka answers (its one replica is the whole ISR).

Errors per partition: UNKNOWN_TOPIC_OR_PARTITION, CORRUPT_MESSAGE,
INVALID_RECORD, MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE,
UNSUPPORTED_COMPRESSION_TYPE, plus the idempotence errors above. Invalid
``acks`` gets INVALID_REQUIRED_ACKS for every partition.

Version notes:
- v3-v12 handled (v3 is the first with magic v2 batches and transactional id).
- v5+ returns log_start_offset; v8+ record_errors / error_message; v9+ flexible.
- The response is encoded by hand (:mod:`oncelog.protocol.fast_produce`),
  byte-identical to kio's encoding, because it is the hot path.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from oncelog.broker.context import CloseConnection, RequestContext
from oncelog.broker.group import TopicPartition
from oncelog.protocol.errors import ErrorCode, KafkaError, code_name
from oncelog.protocol.fast_produce import encode_produce_response
from oncelog.protocol.records import BatchHeader, InvalidRecordError, validate_produce_records

API_KEY = 0
MIN_VERSION = 3
MAX_VERSION = 12

log = logging.getLogger(__name__)


def _error(index: int, code: int, message: str | None = None) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": code,
        "base_offset": -1,
        "log_append_time": -1,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": message,
    }


def _refuse_keyless(topic: str, index: int, records: bytes, hdr: BatchHeader, config: Any) -> dict[str, Any] | None:
    """A compacted topic refuses records without a key: INVALID_RECORD with one record
    error per such record (Kafka's LogValidator). Other topics: None, records unread."""
    if not config.compact or hdr.is_control:
        return None
    from oncelog.broker.recompress import keyless_record_indexes

    try:
        missing = keyless_record_indexes(records, hdr)
    except InvalidRecordError as exc:
        return _error(index, exc.error_code, str(exc))
    if not missing:
        return None
    why = f"Compacted topic cannot accept message without key in topic partition {topic}-{index}."
    out = _error(
        index,
        ErrorCode.invalid_record,
        f"One or more records have been rejected due to {len(missing)} record errors in total, "
        f"and only showing the first three errors at most: {why}",
    )
    out["record_errors"] = [{"batch_index": i, "batch_index_error_message": why} for i in missing]
    log.info("produce to %s-%d rejected: %d record(s) without a key for a compacted topic", topic, index, len(missing))
    return out


def _txn_error(code: int, version: int) -> KafkaError:
    """Map a coordinator answer for a transactional batch to Kafka's produce error."""
    if code in (ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch):
        return KafkaError(ErrorCode.invalid_producer_epoch, "the producer's epoch is fenced")
    if code in (ErrorCode.concurrent_transactions, ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available):
        return KafkaError(ErrorCode.not_enough_replicas, "unable to verify the partition is in the transaction; retry")
    if code == ErrorCode.invalid_txn_state:
        return KafkaError(ErrorCode.invalid_txn_state, "Partition was not added to the transaction")
    if version >= 11:
        return KafkaError(ErrorCode.transaction_abortable, f"the transaction cannot take this batch ({code_name(code)})")
    return KafkaError(ErrorCode.invalid_txn_state, f"the transaction cannot take this batch ({code_name(code)})")


def _check_min_insync(topic: str, index: int, config: Any) -> None:
    """acks=all needs ``min.insync.replicas`` in-sync replicas; one node has one (Kafka's
    Partition.appendRecordsToLeader answers NOT_ENOUGH_REPLICAS and appends nothing)."""
    min_isr = config.get("min.insync.replicas")
    if min_isr > 1:
        raise KafkaError(
            ErrorCode.not_enough_replicas,
            f"The size of the current ISR Set(0) is insufficient to satisfy the min.isr requirement "
            f"of {min_isr} for partition {topic}-{index}",
        )


async def handle(ctx: RequestContext, request: Any) -> bytes | None:
    broker = ctx.broker
    acks = request.acks
    version = ctx.version
    txn = broker.txn
    tv2 = version >= 12 and broker.config.transaction_version >= 2
    # pass 1: validate every batch (no state change)
    plan: list[tuple[str, list[Any]]] = []
    implicit_adds: list[tuple[Any, BatchHeader, TopicPartition]] = []
    for topic_data in request.topic_data:
        name = topic_data.name
        entries: list[Any] = []
        for pdata in topic_data.partition_data:
            index = pdata.index
            if acks not in (-1, 0, 1):
                entries.append(_error(index, ErrorCode.invalid_required_acks))
                continue
            try:
                partition = broker.partition(name, index)
                records = pdata.records or b""
                config = partition.log.config
                (hdr,) = validate_produce_records(records, config.max_message_bytes, config.segment_bytes)
                if acks == -1:
                    _check_min_insync(name, index, config)
            except KafkaError as exc:
                entries.append(_error(index, exc.code, str(exc)))
                continue
            except InvalidRecordError as exc:
                log.info("produce to %s-%d rejected: %s", name, index, exc)
                entries.append(_error(index, exc.error_code, str(exc)))
                continue
            keyless = _refuse_keyless(name, index, records, hdr, config)
            if keyless is not None:
                entries.append(keyless)
                continue
            entry = [index, partition, records, hdr, None]
            if hdr.is_transactional and hdr.producer_id >= 0:
                tp = TopicPartition(name, index)
                if tv2 and txn.check_in_txn(hdr.producer_id, hdr.producer_epoch, tp) == ErrorCode.invalid_txn_state:
                    implicit_adds.append((entry, hdr, tp))  # KIP-890: Produce v12 adds the partition itself
                else:
                    entry[4] = _verifier(txn, tp, version)
            entries.append(entry)
        plan.append((name, entries))
    if implicit_adds:
        # one coordinator write per producer (a request normally has one) for all its new partitions
        by_producer: dict[tuple[int, int], list[TopicPartition]] = {}
        for _, h, tp in implicit_adds:
            by_producer.setdefault((h.producer_id, h.producer_epoch), []).append(tp)
        answers = await asyncio.gather(
            *(txn.add_partitions_implicitly(pid, epoch, tps) for (pid, epoch), tps in by_producer.items())
        )
        codes = dict(zip(by_producer, answers))
        for entry, h, tp in implicit_adds:
            code = codes[(h.producer_id, h.producer_epoch)][tp]
            entry[4] = _verifier(txn, tp, version) if not code else _failing(_txn_error(code, version))
    # pass 2: append, in request order, without awaiting; then the next request of the connection may start
    waits: list[asyncio.Future[None]] = []
    topics_out = []
    now = broker.clock()
    for name, entries in plan:
        parts_out = []
        for entry in entries:
            if isinstance(entry, dict):
                parts_out.append(entry)
                continue
            index, partition, records, hdr, verify = entry
            try:
                base_offset, append_time = partition.append_batch(records, hdr, now, broker.producer_ids, verify)
            except KafkaError as exc:
                parts_out.append(_error(index, exc.code, str(exc)))
                continue
            fut = broker.committer.wait_durable(partition)
            if fut is not None:
                waits.append(fut)
            parts_out.append(
                {
                    "index": index,
                    "error_code": 0,
                    "base_offset": base_offset,
                    "log_append_time": append_time,
                    "log_start_offset": partition.log_start_offset,
                    "record_errors": [],
                    "error_message": None,
                }
            )
        topics_out.append({"name": name, "partition_responses": parts_out})
    ctx.applied()
    if acks == 0:
        failed = [
            f"{t['name']}-{p['index']}: {code_name(p['error_code'])}"
            for t in topics_out
            for p in t["partition_responses"]
            if p["error_code"]
        ]
        if failed:
            # Kafka closes the connection so that the client, which gets no answer, refreshes its metadata
            raise CloseConnection(f"acks=0 produce failed ({', '.join(failed)})")
        return None
    if waits:
        try:
            await asyncio.gather(*waits)
        except OSError as exc:
            log.error("fsync failed, failing the produce: %s", exc)
            for t in topics_out:
                for p in t["partition_responses"]:
                    if p["error_code"] == 0:
                        p.update(_error(p["index"], ErrorCode.kafka_storage_error, str(exc)))
    return encode_produce_response(version, topics_out)


def _verifier(txn: Any, tp: TopicPartition, version: int) -> Any:
    """KIP-890 part 1: a batch that opens a transaction on a partition must
    belong to a partition of the producer's ongoing transaction."""

    def verify(producer_id: int, producer_epoch: int) -> None:
        code = txn.check_in_txn(producer_id, producer_epoch, tp)
        if code == ErrorCode.invalid_txn_state and version >= 11:
            # not in the transaction: Kafka's verification answers TRANSACTION_ABORTABLE and
            # folds it back to INVALID_TXN_STATE only for clients below v11
            raise KafkaError(ErrorCode.transaction_abortable, "Partition was not added to the transaction")
        if code is not None:
            raise _txn_error(code, version)

    return verify


def _failing(exc: KafkaError) -> Any:
    def verify(producer_id: int, producer_epoch: int) -> None:
        raise exc

    return verify
