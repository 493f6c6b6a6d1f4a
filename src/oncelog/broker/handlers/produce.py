"""Produce (key 0).

Behavior: for each partition, the record batch is validated as opaque
bytes (one v2 batch, length, magic, CRC32C, codec, size: see
:func:`oncelog.protocol.records.validate_produce_records`), its base offset is
patched and it is appended to the partition log. Nothing is decompressed.
All appends of the request happen before the handler first awaits, so the
requests of one connection are appended in arrival order even though their
fsync waits overlap. With acks=1 or acks=-1 the response is sent only after
the group-commit fdatasync covering the appends (one node: both mean
"durable here"); with acks=0 no response is sent at all, as in Kafka.

Idempotent batches (producer id >= 0) are checked against the partition's
producer state (:mod:`oncelog.broker.producer_state`): a retried batch that
is one of the producer's last 5 gets its original base offset back and is
not written again; an older epoch gets INVALID_PRODUCER_EPOCH; a sequence gap
or a new epoch not starting at 0 gets OUT_OF_ORDER_SEQUENCE_NUMBER; a
producer id this broker never issued gets UNKNOWN_PRODUCER_ID. A duplicate
still waits for the fsync round, so its answer never precedes durability.

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

from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.protocol.fast_produce import encode_produce_response
from oncelog.protocol.records import InvalidRecordError, validate_produce_records

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


async def handle(ctx: RequestContext, request: Any) -> bytes | None:
    broker = ctx.broker
    acks = request.acks
    waits: list[asyncio.Future[None]] = []
    topics_out = []
    for topic_data in request.topic_data:
        name = topic_data.name
        parts_out = []
        for pdata in topic_data.partition_data:
            index = pdata.index
            if acks not in (-1, 0, 1):
                parts_out.append(_error(index, ErrorCode.invalid_required_acks))
                continue
            try:
                partition = broker.partition(name, index)
                records = pdata.records or b""
                config = partition.log.config
                (hdr,) = validate_produce_records(records, config.max_message_bytes, config.segment_bytes)
                base_offset, append_time = partition.append_batch(records, hdr, broker.clock(), broker.producer_ids)
            except KafkaError as exc:
                parts_out.append(_error(index, exc.code, str(exc)))
                continue
            except InvalidRecordError as exc:
                log.info("produce to %s-%d rejected: %s", name, index, exc)
                parts_out.append(_error(index, exc.error_code, str(exc)))
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
    if acks == 0:
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
    return encode_produce_response(ctx.version, topics_out)
