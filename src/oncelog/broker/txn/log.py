"""The transaction log (Kafka's ``__transaction_state``).

One record per state change, keyed by transactional id; the value is the
whole :class:`~oncelog.broker.txn.state.TxnMetadata` (producer id,
previous/next producer id, epoch, last epoch, timeout, state, partitions,
start and last-update timestamps, client transaction version, 2PC flag) as
JSON; a tombstone (null value) when the id expires (Dead).

Two engines share the :class:`TxnLogStore` interface:

* :class:`FileTxnLog`: a :class:`~oncelog.broker.txn.keyed_log.DurableKeyedLog`
  in ``<data-dir>/__transaction_state-0`` (unknown to the topic catalog),
  made durable by the broker's group committer, compacted by snapshot;
* :class:`MemoryTxnLog`: for unit tests; durable at once, or only on
  :meth:`MemoryTxnLog.flush` (``auto_flush=False``) so a test can crash
  between an append and its durability (:meth:`MemoryTxnLog.crashed`).

``write`` returns only once the record is durable and raises
:class:`TxnLogError` when it will not be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from oncelog.broker.txn.keyed_log import DurableKeyedLog
from oncelog.broker.txn.state import TxnMetadata

TXN_LOG_DIR = "__transaction_state-0"
SNAPSHOT_SUFFIX = ".txn-snapshot"


class TxnLogError(Exception):
    """The record did not become durable (fsync error, injected failure, crash)."""


class TxnLogStore(Protocol):
    def load(self) -> dict[str, TxnMetadata]: ...

    async def write(self, transactional_id: str, metadata: TxnMetadata | None) -> None: ...


def _value(metadata: TxnMetadata | None) -> dict[str, Any] | None:
    return None if metadata is None else metadata.to_record()


class FileTxnLog:
    def __init__(self, keyed: DurableKeyedLog) -> None:
        self._log = keyed

    @classmethod
    def open(
        cls,
        data_dir: Path,
        durability: Callable[[Any], Any] | None,
        clock: Callable[[], int],
        snapshot_bytes: int = 8 * 1024 * 1024,
        failure_channel: Any = None,
    ) -> "FileTxnLog":
        keyed = DurableKeyedLog.open(
            Path(data_dir) / TXN_LOG_DIR, SNAPSHOT_SUFFIX, durability, clock, snapshot_bytes, failure_channel
        )
        return cls(keyed)

    @property
    def directory(self) -> Path:
        return self._log.log.directory

    def load(self) -> dict[str, TxnMetadata]:
        return {tid: TxnMetadata.from_record(tid, rec) for tid, rec in self._log.live.items()}

    async def write(self, transactional_id: str, metadata: TxnMetadata | None) -> None:
        try:
            fut = self._log.append([(transactional_id, _value(metadata))])
            if fut is not None:
                await fut
        except OSError as exc:
            raise TxnLogError(str(exc)) from exc
        self._log.maybe_snapshot()

    def maybe_snapshot(self, force: bool = False) -> bool:
        return self._log.maybe_snapshot(force)

    def close(self) -> None:
        self._log.close()

    def abandon(self) -> None:
        """Close without writing (the log directory failed)."""
        self._log.log.abandon()


class MemoryTxnLog:
    """``records`` = every appended (transactional id, record) in order; the first ``durable`` are durable."""

    def __init__(self, auto_flush: bool = True, records: list[tuple[str, dict[str, Any] | None]] | None = None) -> None:
        self.auto_flush = auto_flush
        self.records: list[tuple[str, dict[str, Any] | None]] = list(records or [])
        self.durable = len(self.records)
        self.fail_next = 0  # the next N writes fail (as an fsync error would)
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def load(self) -> dict[str, TxnMetadata]:
        return {tid: TxnMetadata.from_record(tid, rec) for tid, rec in self.durable_state().items()}

    def durable_state(self) -> dict[str, dict[str, Any]]:
        live: dict[str, dict[str, Any]] = {}
        for tid, rec in self.records[: self.durable]:
            if rec is None:
                live.pop(tid, None)
            else:
                live[tid] = rec
        return live

    def durable_history(self, transactional_id: str) -> list[TxnMetadata | None]:
        return [
            None if rec is None else TxnMetadata.from_record(tid, rec)
            for tid, rec in self.records[: self.durable]
            if tid == transactional_id
        ]

    async def write(self, transactional_id: str, metadata: TxnMetadata | None) -> None:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise TxnLogError("injected write failure")
        self.records.append((transactional_id, _value(metadata)))
        if self.auto_flush:
            self.durable = len(self.records)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((len(self.records), fut))
        await fut

    @property
    def unflushed(self) -> int:
        return len(self.records) - self.durable

    def flush(self) -> None:
        """Make every appended record durable and release its writer."""
        self.durable = len(self.records)
        waiters, self._waiters = self._waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def crashed(self) -> "MemoryTxnLog":
        """What a restarted broker finds: only the durable records (pending writers fail)."""
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(TxnLogError("crashed before the record was durable"))
        self._waiters = []
        return MemoryTxnLog(self.auto_flush, self.records[: self.durable])
