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
``acks`` gets INVALID_REQUIRED_ACKS for every partition. An I/O error of an
append or of the fsync round answers KAFKA_STORAGE_ERROR and takes the log
directory offline (storage/log_dir.py; the broker stops): every later
append and every durability wait fails the same way, a retried duplicate
included (its first copy may not be on disk), as Kafka answers for a
partition in an offline log directory.

Conditional produce (oncelog's KIP-27, docs/conditional-publish.md): on
v9+ a partition may carry the tagged field 10000, the offset its batch must
get. The tag is found by the codec's tolerant fallback (kio refuses unknown
tags, so a request without one never leaves kio's native decoder and pays
nothing here). All conditions are checked in pass 2, right before the
appends, with no ``await`` between the check and the last append, so no
other request (on any connection) can append in between. A retry that is a
duplicate by sequence is answered with its original offset before its
condition is looked at. If any condition fails (offset mismatch, a malformed
tag, a partition named twice) nothing of the request is appended:
mismatched partitions get ONCELOG_OFFSET_MISMATCH (10001), the others
ONCELOG_CONDITIONAL_PRODUCE_REFUSED (10002), both with the partition's
actual next offset in the response tag 10000 (a malformed tag gets
INVALID_REQUEST). Errors of other kinds stay per partition, as in Kafka. A
conditional produce with acks=0 is never appended and closes the connection
(its outcome could not be answered).

Version notes:
- v3-v12 handled (v3 is the first with magic v2 batches and transactional id).
- v5+ returns log_start_offset; v8+ record_errors / error_message; v9+ flexible.
- The response is encoded by hand (:mod:`oncelog.protocol.fast_produce`),
  byte-identical to kio's encoding, because it is the hot path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from oncelog.broker.context import CloseConnection, RequestContext
from oncelog.broker.group import TopicPartition
from oncelog.protocol.codec import unknown_tags_of
from oncelog.protocol.conditional import EXPECTED_OFFSET_TAG, NO_EXPECTED_OFFSET, ConditionError, parse_offset_tag
from oncelog.protocol.errors import ErrorCode, KafkaError, OncelogErrorCode, code_name
from oncelog.protocol.fast_produce import encode_produce_response
from oncelog.protocol.records import BatchHeader, InvalidRecordError, validate_produce_records
from oncelog.storage.log_dir import log_level

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


async def _add_implicitly(broker: Any, txn: Any, producer_id: int, producer_epoch: int,
                          tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """TV2's implicit add, retried here while the coordinator answers CONCURRENT_TRANSACTIONS (the producer's
    previous transaction is still writing its markers), every ``add.partitions.to.txn.retry.backoff.ms`` for
    up to ``add.partitions.to.txn.retry.backoff.max.ms``, as Kafka's ReplicaManager does for Produce v12: a
    client's produce backoff (retry.backoff.ms, 100 ms) after each transaction's first Produce costs too much."""
    cfg = broker.config
    deadline = time.monotonic() + cfg.add_partitions_to_txn_retry_backoff_max_ms / 1000
    codes = await txn.add_partitions_implicitly(producer_id, producer_epoch, tps)
    while (any(c == ErrorCode.concurrent_transactions for c in codes.values())
           and time.monotonic() + cfg.add_partitions_to_txn_retry_backoff_ms / 1000 <= deadline):
        await asyncio.sleep(cfg.add_partitions_to_txn_retry_backoff_ms / 1000)
        codes = await txn.add_partitions_implicitly(producer_id, producer_epoch, tps)
    return codes


# verification failed with an error the producer retries: answered NOT_ENOUGH_REPLICAS, as Kafka's
# ReplicaManager does (older clients retry it without a metadata refresh)
_VERIFY_RETRIABLE = frozenset(int(c) for c in (
    ErrorCode.concurrent_transactions, ErrorCode.network_exception, ErrorCode.coordinator_load_in_progress,
    ErrorCode.coordinator_not_available, ErrorCode.not_coordinator,
))


def _txn_error(code: int, version: int) -> KafkaError:
    """Map a coordinator answer for a transactional batch to Kafka's produce error."""
    if code in (ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch):
        return KafkaError(ErrorCode.invalid_producer_epoch, "the producer's epoch is fenced")
    if code in _VERIFY_RETRIABLE:
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
    conditions = _conditions(ctx.unknown_tags, request) if ctx.unknown_tags else None
    refusals: list[str] = []  # why a conditional request appends nothing (malformed conditions)
    repeated: set[tuple[str, int]] = set()
    if conditions is not None:
        if acks == 0:
            raise CloseConnection("a conditional produce with acks=0 is refused (its outcome cannot be answered)")
        repeated = _repeated_partitions(request)
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
            cond = conditions.get(id(pdata)) if conditions is not None else None
            if isinstance(cond, ConditionError) or (name, index) in repeated:
                why = (
                    str(cond)
                    if isinstance(cond, ConditionError)
                    else "the partition appears more than once in a conditional produce"
                )
                refusals.append(f"{name}-{index}: {why}")
                entries.append(_error(index, ErrorCode.invalid_request, why))
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
            entry = [index, partition, records, hdr, None, cond]
            if hdr.is_transactional and hdr.producer_id >= 0:
                tp = TopicPartition(name, index)
                if tv2 and txn.check_in_txn(hdr.producer_id, hdr.producer_epoch, tp) in (
                        ErrorCode.invalid_txn_state, ErrorCode.concurrent_transactions):
                    # KIP-890: Produce v12 adds the partition itself (after the previous transaction's markers)
                    implicit_adds.append((entry, hdr, tp))
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
            *(_add_implicitly(broker, txn, pid, epoch, tps) for (pid, epoch), tps in by_producer.items())
        )
        codes = dict(zip(by_producer, answers))
        for entry, h, tp in implicit_adds:
            code = codes[(h.producer_id, h.producer_epoch)][tp]
            entry[4] = _verifier(txn, tp, version) if not code else _failing(_txn_error(code, version))
        # a topic may have been deleted (or deleted and created again) during the await: look every
        # partition up again, as Kafka's ReplicaManager does at append time
        plan = [(name, [_still_hosted(broker, name, e) for e in entries]) for name, entries in plan]
    # pass 2: append, in request order, without awaiting; then the next request of the connection may start
    waits: list[asyncio.Future[None]] = []
    if conditions is not None:
        # checked here, synchronously with the appends below: nothing can append in between
        refused = _refuse_if_any_condition_fails(broker, plan, refusals, waits)
        if refused is not None:
            ctx.applied()
            return await _answer(version, refused, waits)
    topics_out = []
    now = broker.clock()
    appended: list[Any] = []  # partitions appended to (or answered as duplicates): one durable wait for all
    for name, entries in plan:
        parts_out = []
        for entry in entries:
            if isinstance(entry, dict):
                parts_out.append(entry)
                continue
            index, partition, records, hdr, verify, _ = entry
            try:
                base_offset, append_time = partition.append_batch(records, hdr, now, broker.producer_ids, verify)
            except KafkaError as exc:
                parts_out.append(_error(index, exc.code, str(exc)))
                continue
            except OSError as exc:  # the write failed, or the log directory is offline (Kafka's KafkaStorageException)
                log.log(log_level(exc, logging.ERROR), "produce to %s-%d not appended: %s", name, index, exc)
                parts_out.append(_error(index, ErrorCode.kafka_storage_error, str(exc)))
                continue
            appended.append(partition)
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
    # the appends above had no await between them, so one group-commit round covers them all
    fut = broker.committer.wait_durable_all(appended)
    if fut is not None:
        waits.append(fut)
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
    return await _answer(version, topics_out, waits)


async def _answer(version: int, topics_out: list[dict[str, Any]], waits: list[asyncio.Future[None]]) -> bytes:
    """Wait for the fsync round covering the appends (and duplicates), then encode."""
    if waits:
        try:
            if len(waits) == 1:
                await waits[0]
            else:
                await asyncio.gather(*waits)
        except OSError as exc:
            log.log(log_level(exc, logging.ERROR), "fsync failed, failing the produce: %s", exc)
            for t in topics_out:
                for p in t["partition_responses"]:
                    if p["error_code"] == 0:
                        p.update(_error(p["index"], ErrorCode.kafka_storage_error, str(exc)))
    return encode_produce_response(version, topics_out)


# -- conditional produce ------------------------------------------------------------


def _conditions(unknown_tags: Any, request: Any) -> dict[int, int | ConditionError] | None:
    """``{id(partition data): expected offset or the reason it is malformed}``; None if
    no partition carries the tag (or all carry -1, KIP-27's "no condition")."""
    out: dict[int, int | ConditionError] = {}
    for topic_data in request.topic_data:
        for pdata in topic_data.partition_data:
            tags = unknown_tags_of(unknown_tags, pdata)
            if not tags or EXPECTED_OFFSET_TAG not in tags:
                continue
            try:
                expected = parse_offset_tag(tags[EXPECTED_OFFSET_TAG])
            except ConditionError as exc:
                out[id(pdata)] = exc
                continue
            if expected != NO_EXPECTED_OFFSET:
                out[id(pdata)] = expected
    return out or None


def _repeated_partitions(request: Any) -> set[tuple[str, int]]:
    seen: set[tuple[str, int]] = set()
    repeated: set[tuple[str, int]] = set()
    for topic_data in request.topic_data:
        for pdata in topic_data.partition_data:
            key = (topic_data.name, pdata.index)
            (repeated if key in seen else seen).add(key)
    return repeated


def _refuse_if_any_condition_fails(
    broker: Any, plan: list[tuple[str, list[Any]]], refusals: list[str], waits: list[asyncio.Future[None]]
) -> list[dict[str, Any]] | None:
    """Check every condition of the request (no state change, no await).

    Returns None when all hold (the caller appends), else the whole response:
    nothing is appended. A duplicate by sequence (a retry of a batch already
    appended) is answered with its original offset whatever its condition,
    since it was appended when its condition held; the other partitions get
    ONCELOG_OFFSET_MISMATCH or ONCELOG_CONDITIONAL_PRODUCE_REFUSED with the
    partition's actual next offset."""
    mismatched: dict[int, tuple[int, int]] = {}
    failed = list(refusals)
    for name, entries in plan:
        for entry in entries:
            if isinstance(entry, dict) or entry[5] is None:
                continue
            index, partition, _records, hdr, _verify, expected = entry
            if partition.duplicate_offset(hdr) is not None:
                continue
            actual = partition.log.log_end_offset
            if actual != expected:
                mismatched[id(entry)] = (expected, actual)
                failed.append(f"{name}-{index}: expected offset {expected}, next offset {actual}")
    if not failed:
        return None
    log.debug("conditional produce refused: %s", "; ".join(failed))
    because = "; ".join(failed)
    topics_out = []
    for name, entries in plan:
        parts_out = []
        for entry in entries:
            if isinstance(entry, dict):
                parts_out.append(entry)
                continue
            index, partition, _records, hdr, _verify, _expected = entry
            dup = partition.duplicate_offset(hdr)
            if dup is not None:
                fut = broker.committer.wait_durable(partition)  # its first answer may not have been durable yet
                if fut is not None:
                    waits.append(fut)
                parts_out.append(
                    {
                        "index": index,
                        "error_code": 0,
                        "base_offset": dup,
                        "log_append_time": -1,
                        "log_start_offset": partition.log_start_offset,
                        "record_errors": [],
                        "error_message": None,
                    }
                )
                continue
            actual = partition.log.log_end_offset
            mismatch = mismatched.get(id(entry))
            if mismatch is not None:
                out = _error(
                    index,
                    OncelogErrorCode.oncelog_offset_mismatch,
                    f"ONCELOG_OFFSET_MISMATCH: expected offset {mismatch[0]} but the next offset of "
                    f"{name}-{index} is {actual}; nothing of the request was appended",
                )
            else:
                out = _error(
                    index,
                    OncelogErrorCode.oncelog_conditional_produce_refused,
                    f"ONCELOG_CONDITIONAL_PRODUCE_REFUSED: not appended because a condition of the same "
                    f"request failed ({because})",
                )
            out["next_offset"] = actual
            parts_out.append(out)
        topics_out.append({"name": name, "partition_responses": parts_out})
    return topics_out


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


def _still_hosted(broker: Any, name: str, entry: Any) -> Any:
    """``entry`` of pass 1, or the error for its partition if that was deleted meanwhile:
    UNKNOWN_TOPIC_OR_PARTITION if it is gone, NOT_LEADER_OR_FOLLOWER if a new topic of the
    same name holds it now (Kafka's answer for a topic it knows but a replica it no longer
    hosts: the client refreshes its metadata and retries)."""
    if isinstance(entry, dict):
        return entry
    index, partition = entry[0], entry[1]
    try:
        now = broker.partition(name, index)
    except KafkaError as exc:
        return _error(index, exc.code, str(exc))
    if now is not partition:
        return _error(index, ErrorCode.not_leader_or_follower, f"{name}-{index} was deleted and created again")
    return entry
