"""Transaction administration rules (KIP-664, ``oncelog txns ...``): pure helpers and types.

The requests (FindCoordinator with key type 1, ListTransactions,
DescribeTransactions, DescribeProducers, WriteTxnMarkers) are made by
:class:`oncelog.client.Admin`; this module holds what needs no IO: the
hanging-transaction rule, request bodies, the DescribeTransactions v0
decoder and the result types.

Routing follows Kafka's admin client: DescribeTransactions goes to each
transactional id's coordinator, ListTransactions to every broker,
DescribeProducers and WriteTxnMarkers to the partition leader.

Hanging transactions (the rule of Kafka's ``kafka-transactions.sh
find-hanging``, plus a margin and one extension):

1. candidates: every producer with an open transaction on a searched
   partition (DescribeProducers ``current_txn_start_offset >= 0``) whose last
   append is older than ``max_transaction_timeout_ms + margin_ms``;
2. cross-check with the coordinator: the candidate's producer id is mapped
   to a transactional id with ListTransactions (producer id filter), then
   described. A candidate is hanging when no transactional id is found, the
   coordinator does not know the id, the coordinator's transaction does not
   include the partition (the coordinator will never write its marker), or
   - the extension - the coordinator lists the partition but its transaction
   is still Ongoing longer than its own timeout plus the margin (the
   coordinator failed to abort it in time). Kafka's tool does not report the
   last case; it is reported here with reason ``coordinator-overdue``. Note a
   KIP-939 prepared (2PC) transaction is exempt from the timeout on purpose;
   DescribeTransactions v0 cannot tell it apart, so check before aborting one.

A hanging transaction pins the partition's last stable offset: read_committed
consumers stop at its first offset until it is aborted with
:meth:`oncelog.client.Admin.abort_transaction` (Kafka's ``Admin.abortTransaction``: an
ABORT marker for that producer id/epoch/coordinator epoch on that partition).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from oncelog.client.errors import KafkaError
from oncelog.protocol.headers import read_uvarint, skip_tagged_fields

TXN_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
              "PrepareEpochFence", "Dead")
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms default (15 min)

TP = tuple[str, int]


class TxnAdminError(KafkaError):
    """A transaction-admin request the client cannot make (no open transaction at that offset, a filter the
    broker's ListTransactions version lacks, unknown state names); no Kafka code (-1)."""

    name = "TXN_ADMIN_ERROR"


@dataclass(frozen=True)
class ProducerInfo:
    """One active producer of a partition (DescribeProducers)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass(frozen=True)
class TxnDescription:
    """DescribeTransactions for one transactional id (``error`` set when the coordinator refused it)."""

    transactional_id: str
    coordinator_id: int
    state: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    timeout_ms: int = -1
    start_time_ms: int = -1
    partitions: tuple[TP, ...] = ()
    error: str | None = None

    def to_json(self, now_ms: int) -> dict[str, Any]:
        d = asdict(self)
        d["partitions"] = [{"topic": t, "partition": p} for t, p in self.partitions]
        d["duration_ms"] = now_ms - self.start_time_ms if self.start_time_ms >= 0 else None
        return d


@dataclass(frozen=True)
class OpenTxn:
    """An open transaction on one partition, as the partition leader sees it."""

    topic: str
    partition: int
    producer: ProducerInfo
    transactional_id: str | None = None
    reason: str = ""

    def to_json(self, now_ms: int) -> dict[str, Any]:
        p = self.producer
        return {"topic": self.topic, "partition": self.partition, "producer_id": p.producer_id,
                "producer_epoch": p.producer_epoch, "coordinator_epoch": p.coordinator_epoch,
                "start_offset": p.current_txn_start_offset, "last_timestamp": p.last_timestamp,
                "duration_ms": now_ms - p.last_timestamp, "transactional_id": self.transactional_id,
                "reason": self.reason}


@dataclass(frozen=True)
class AbortSpec:
    """Kafka's AbortTransactionSpec: the marker that aborts one producer's transaction on one partition."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int


# -- pure helpers (unit-tested without a broker) --------------------------------


def list_transactions_body(version: int, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                           duration_ms: int = -1) -> dict[str, Any]:
    """The ListTransactions request for ``version`` (v1 added the duration filter)."""
    if duration_ms >= 0 and version < 1:
        raise TxnAdminError("the broker does not support the duration filter (needs ListTransactions v1)")
    body: dict[str, Any] = {"state_filters": tuple(states), "producer_id_filters": tuple(int(p) for p in producer_ids)}
    if version >= 1:
        body["duration_filter"] = int(duration_ms) if duration_ms >= 0 else -1
    if version >= 2:
        body["transactional_id_pattern"] = None
    return body


def hanging_candidates(producers: Mapping[TP, Iterable[ProducerInfo]], now_ms: int, max_transaction_timeout_ms: int,
                       margin_ms: int = 0) -> list[OpenTxn]:
    """Open transactions whose last append is older than the max timeout plus the margin (step 1)."""
    limit = max_transaction_timeout_ms + margin_ms
    out = []
    for (topic, partition), states in sorted(producers.items()):
        for p in states:
            if p.current_txn_start_offset >= 0 and now_ms - p.last_timestamp > limit:
                out.append(OpenTxn(topic, partition, p))
    return out


def filter_hanging(candidates: Iterable[OpenTxn], transactional_ids: Mapping[int, str],
                   descriptions: Mapping[str, TxnDescription | None], now_ms: int, margin_ms: int = 0) -> list[OpenTxn]:
    """Step 2: keep the candidates the coordinator will not complete (see the module docstring)."""
    out = []
    for c in candidates:
        tid = transactional_ids.get(c.producer.producer_id)
        if tid is None:
            out.append(OpenTxn(c.topic, c.partition, c.producer, None, "no-transactional-id"))
            continue
        d = descriptions.get(tid)
        if d is None or d.error is not None:
            out.append(OpenTxn(c.topic, c.partition, c.producer, tid, "unknown-transactional-id"))
        elif (c.topic, c.partition) not in d.partitions:
            out.append(OpenTxn(c.topic, c.partition, c.producer, tid, "partition-not-in-transaction"))
        elif (d.state == "Ongoing" and d.start_time_ms >= 0 and d.timeout_ms >= 0
              and now_ms - d.start_time_ms > d.timeout_ms + margin_ms):
            out.append(OpenTxn(c.topic, c.partition, c.producer, tid, "coordinator-overdue"))
    return out


def abort_spec_for_offset(topic: str, partition: int, producers: Iterable[ProducerInfo],
                          start_offset: int) -> AbortSpec:
    """The abort spec of the producer whose open transaction starts at ``start_offset`` (as kafka-transactions)."""
    for p in producers:
        if p.current_txn_start_offset == start_offset:
            return AbortSpec(topic, partition, p.producer_id, p.producer_epoch, max(p.coordinator_epoch, 0))
    raise TxnAdminError(f"could not find any open transaction starting at offset {start_offset} "
                        f"on partition {topic}-{partition}")


class _Reader:
    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def fixed(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def count(self) -> int:
        n, self.pos = read_uvarint(self.buf, self.pos)
        return max(n - 1, 0)

    def string(self) -> str:
        n = self.count()
        value = self.buf[self.pos:self.pos + n].decode()
        self.pos += n
        return value

    def tags(self) -> None:
        self.pos = skip_tagged_fields(self.buf, self.pos)


def parse_describe_transactions_v0(body: bytes, pos: int = 0) -> list[dict[str, Any]]:
    """DescribeTransactions v0 response body (after the response header), decoded by hand.

    kio's datetime field rejects the -1 start time Kafka sends for a transactional id with no open
    transaction (Empty, Complete*), so this one response is not decoded with kio.
    """
    r = _Reader(body, pos)
    r.fixed(">i")  # throttle time
    states = []
    for _ in range(r.count()):
        s: dict[str, Any] = {"error_code": r.fixed(">h"), "transactional_id": r.string(),
                             "transaction_state": r.string(), "transaction_timeout_ms": r.fixed(">i"),
                             "transaction_start_time_ms": r.fixed(">q"), "producer_id": r.fixed(">q"),
                             "producer_epoch": r.fixed(">h")}
        topics = []
        for _ in range(r.count()):
            topic = r.string()
            topics.extend((topic, r.fixed(">i")) for _ in range(r.count()))
            r.tags()
        s["partitions"] = tuple(sorted(topics))
        r.tags()
        states.append(s)
    r.tags()
    return states


def __getattr__(name: str) -> Any:
    if name == "TxnAdmin":  # the admin client imports this module: resolved lazily
        from oncelog.client.admin import TxnAdmin

        return TxnAdmin
    raise AttributeError(name)
