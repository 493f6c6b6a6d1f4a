"""InitProducerId (key 22).

Behavior:
- No transactional id (idempotent producers): always a fresh producer id
  with epoch 0, unique across restarts (see :mod:`oncelog.broker.producer_ids`),
  whatever id and epoch the request passes, as Kafka answers (a KIP-360
  bump of an idempotent producer gets a new id; nothing is refused as stale).
- Either way, an id without an epoch or an epoch without an id (one of them
  -1, the other not) gets INVALID_REQUEST, as Kafka checks before asking its
  coordinator.
- With a transactional id the transaction coordinator answers
  (:meth:`oncelog.broker.txn.TransactionCoordinator.init_producer_id`): the
  id keeps its producer id and the epoch is bumped, fencing older producers;
  an Ongoing transaction is aborted first and the answer is
  CONCURRENT_TRANSACTIONS, so the client retries; a transaction still in
  PrepareCommit/PrepareAbort gets CONCURRENT_TRANSACTIONS; a timeout above
  ``transaction.max.timeout.ms`` (or <= 0) gets INVALID_TRANSACTION_TIMEOUT;
  an empty transactional id gets INVALID_REQUEST.

Version notes: v0-v6 handled. v2+ flexible; v3+ carries producer id/epoch
(KIP-360); v4 adds PRODUCER_FENCED (older versions get
INVALID_PRODUCER_EPOCH instead, as in Kafka); v5 adds TRANSACTION_ABORTABLE;
v6 (KIP-939) adds Enable2Pc and KeepPreparedTxn and answers the producer id
and epoch of a kept prepared transaction.
"""

from __future__ import annotations

import logging
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.build import to_ms
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.log_dir import log_level

log = logging.getLogger(__name__)

API_KEY = 22
MIN_VERSION = 0
MAX_VERSION = 6


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "throttle_time": 0,
        "error_code": 0,
        "producer_id": -1,
        "producer_epoch": -1,
        "ongoing_txn_producer_id": -1,
        "ongoing_txn_producer_epoch": -1,
    }
    pid = getattr(request, "producer_id", -1)
    epoch = getattr(request, "producer_epoch", -1)
    txn_id = request.transactional_id
    if (pid == -1) != (epoch == -1):
        # an id without an epoch or the reverse: Kafka refuses it before asking its coordinator
        out["error_code"] = ErrorCode.invalid_request
        return out
    if txn_id is not None:
        if txn_id == "":
            out["error_code"] = ErrorCode.invalid_request
            return out
        result = await ctx.broker.txn.init_producer_id(
            txn_id,
            to_ms(request.transaction_timeout),
            pid,
            epoch,
            enable_2pc=getattr(request, "enable2_pc", False),
            keep_prepared_txn=getattr(request, "keep_prepared_txn", False),
        )
        error = result.error
        if error == ErrorCode.producer_fenced and ctx.version < 4:
            error = ErrorCode.invalid_producer_epoch
        out["error_code"] = error
        if not error:
            out["producer_id"] = result.producer_id
            out["producer_epoch"] = result.producer_epoch
            out["ongoing_txn_producer_id"] = result.ongoing_txn_producer_id
            out["ongoing_txn_producer_epoch"] = result.ongoing_txn_producer_epoch
        return out
    try:
        result = ctx.broker.producer_ids.init_idempotent()
    except OSError as exc:  # the next block could not be written: the data directory is offline
        log.log(log_level(exc, logging.ERROR), "InitProducerId failed: %s", exc)
        out["error_code"] = ErrorCode.not_coordinator  # as the transaction coordinator answers then
        return out
    out["producer_id"] = result.producer_id
    out["producer_epoch"] = result.epoch
    return out
