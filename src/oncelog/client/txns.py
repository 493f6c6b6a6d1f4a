"""Transaction administration over the protocol (KIP-664, ``oncelog txns ...``).

Speaks only the Kafka protocol (Metadata, FindCoordinator with key type 1,
ListTransactions, DescribeTransactions, DescribeProducers, WriteTxnMarkers),
so it works against Apache Kafka too. Never imports the broker or storage.

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
:meth:`TxnAdmin.abort_transaction` (Kafka's ``Admin.abortTransaction``: an
ABORT marker for that producer id/epoch/coordinator epoch on that partition).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from oncelog.client.connection import Connection
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import encode_request, request_type
from oncelog.protocol.errors import ErrorCode, code_name
from oncelog.protocol.headers import read_uvarint, skip_tagged_fields

METADATA, FIND_COORDINATOR, WRITE_TXN_MARKERS = 3, 10, 27
DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 61, 65, 66
TRANSACTION_KEY_TYPE = 1

TXN_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
              "PrepareEpochFence", "Dead")
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms default (15 min)

# Coordinator errors after which the lookup is repeated (Kafka answers COORDINATOR_NOT_AVAILABLE while it
# creates __transaction_state on the first lookup).
_COORDINATOR_RETRIABLE = {ErrorCode.coordinator_not_available.value, ErrorCode.coordinator_load_in_progress.value,
                          ErrorCode.not_coordinator.value}
_LEADER_RETRIABLE = {ErrorCode.not_leader_or_follower.value, ErrorCode.leader_not_available.value,
                     ErrorCode.replica_not_available.value, ErrorCode.broker_not_available.value}

TP = tuple[str, int]


class TxnAdminError(Exception):
    pass


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


def _request_raw(conn: Connection, api_key: int, version: int, body: dict[str, Any], flexible: bool) -> bytes:
    """Send a request with ``conn`` and return the raw response body after its header."""
    conn.correlation_id += 1
    client = conn.client_id.encode()
    header = struct.pack(">hhih", api_key, version, conn.correlation_id, len(client)) + client
    if flexible:
        header += b"\x00"
    raw = conn.send_raw(header + encode_request(materialize(request_type(api_key, version), body)))
    (corr,) = struct.unpack_from(">i", raw, 0)
    if corr != conn.correlation_id:
        raise TxnAdminError(f"correlation id {corr} != {conn.correlation_id}")
    return raw[skip_tagged_fields(raw, 4) if flexible else 4:]


# -- the client -------------------------------------------------------------------


@dataclass
class _Cluster:
    brokers: dict[int, str] = field(default_factory=dict)  # node id -> host:port
    leaders: dict[TP, int] = field(default_factory=dict)
    topics: list[str] = field(default_factory=list)  # non-internal topics
    errors: dict[str, str] = field(default_factory=dict)  # topic -> error


class TxnAdmin:
    def __init__(self, bootstrap: str, timeout: float = 30.0, clock: Callable[[], int] | None = None,
                 retry_for: float = 10.0) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.retry_for = retry_for
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.conn = Connection(bootstrap, client_id="oncelog-txns", timeout=timeout)
        self._conns: dict[str, Connection] = {bootstrap: self.conn}

    def __enter__(self) -> "TxnAdmin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    # -- plumbing ---------------------------------------------------------------

    def _connect(self, address: str) -> Connection:
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = Connection(address, client_id="oncelog-txns", timeout=self.timeout)
        return conn

    def cluster(self, topics: list[str] | None = None) -> _Cluster:
        v = self.conn.best_version(METADATA, (1, 12))
        md = self.conn.request(METADATA, v, {
            "topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False})
        out = _Cluster(brokers={b.node_id: f"{b.host}:{b.port}" for b in md.brokers})
        for t in md.topics:
            if t.error_code:
                out.errors[t.name] = code_name(t.error_code)
                continue
            if not getattr(t, "is_internal", False):
                out.topics.append(t.name)
            for p in t.partitions:
                out.leaders[(t.name, p.partition_index)] = p.leader_id
        return out

    def _broker(self, cluster: _Cluster, node_id: int) -> Connection:
        address = cluster.brokers.get(node_id)
        if address is None:
            raise TxnAdminError(f"leader {node_id} is not among the brokers in the metadata")
        return self._connect(address)

    def find_coordinator(self, transactional_id: str) -> tuple[int, Connection]:
        """``(node id, connection)`` of the transaction coordinator of ``transactional_id`` (key type 1)."""
        v = self.conn.best_version(FIND_COORDINATOR, (1, 6))
        deadline = time.monotonic() + self.retry_for
        while True:
            if v >= 4:
                resp = self.conn.request(FIND_COORDINATOR, v, {"key_type": TRANSACTION_KEY_TYPE,
                                                               "coordinator_keys": (transactional_id,)})
                c = resp.coordinators[0]
            else:
                c = self.conn.request(FIND_COORDINATOR, v, {"key": transactional_id, "key_type": TRANSACTION_KEY_TYPE})
            if c.error_code == 0:
                return c.node_id, self._connect(f"{c.host}:{c.port}")
            if int(c.error_code) not in _COORDINATOR_RETRIABLE or time.monotonic() > deadline:
                raise TxnAdminError(f"FindCoordinator({transactional_id}): {code_name(c.error_code)}")
            time.sleep(0.2)

    # -- reads ------------------------------------------------------------------

    def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                          duration_ms: int = -1) -> list[dict[str, Any]]:
        """ListTransactions on every broker: ``[{transactional_id, producer_id, state, coordinator}]``."""
        states, producer_ids = list(states), list(producer_ids)
        out = []
        for node_id, address in sorted(self.cluster([]).brokers.items()):
            conn = self._connect(address)
            v = conn.best_version(LIST_TRANSACTIONS, (0, 2))
            resp = conn.request(LIST_TRANSACTIONS, v, list_transactions_body(v, states, producer_ids, duration_ms))
            if resp.error_code:
                raise TxnAdminError(f"ListTransactions on broker {node_id}: {code_name(resp.error_code)}")
            unknown = list(getattr(resp, "unknown_state_filters", ()) or ())
            if unknown:
                raise TxnAdminError(f"unknown transaction states: {', '.join(unknown)}")
            out.extend({"transactional_id": s.transactional_id, "producer_id": int(s.producer_id),
                        "state": s.transaction_state, "coordinator": node_id} for s in resp.transaction_states)
        return sorted(out, key=lambda r: (r["transactional_id"], r["coordinator"]))

    def describe_transactions(self, transactional_ids: Iterable[str]) -> dict[str, TxnDescription]:
        """DescribeTransactions at each id's coordinator (retrying coordinator moves and loads)."""
        ids = list(dict.fromkeys(transactional_ids))
        out: dict[str, TxnDescription] = {}
        deadline = time.monotonic() + self.retry_for
        pending = ids
        while pending:
            by_coordinator: dict[int, tuple[Connection, list[str]]] = {}
            for tid in pending:
                node_id, conn = self.find_coordinator(tid)
                by_coordinator.setdefault(node_id, (conn, []))[1].append(tid)
            retry = []
            for node_id, (conn, tids) in by_coordinator.items():
                conn.best_version(DESCRIBE_TRANSACTIONS, (0, 0))
                raw = _request_raw(conn, DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": tuple(tids)}, flexible=True)
                for s in parse_describe_transactions_v0(raw):
                    tid, code = s["transactional_id"], s["error_code"]
                    if code in _COORDINATOR_RETRIABLE and time.monotonic() < deadline:
                        retry.append(tid)
                        continue
                    if code:
                        out[tid] = TxnDescription(tid, node_id, error=code_name(code))
                        continue
                    out[tid] = TxnDescription(tid, node_id, s["transaction_state"], s["producer_id"],
                                              s["producer_epoch"], s["transaction_timeout_ms"],
                                              s["transaction_start_time_ms"], s["partitions"])
            pending = [t for t in retry if t in ids]
            if pending:
                time.sleep(0.2)
        return {tid: out[tid] for tid in ids if tid in out}

    def describe_producers(self, tps: Iterable[TP], cluster: _Cluster | None = None
                           ) -> tuple[dict[TP, list[ProducerInfo]], dict[TP, str]]:
        """DescribeProducers at each partition's leader: ``(producers by partition, errors by partition)``."""
        tps = sorted(set(tps))
        cluster = cluster or self.cluster(sorted({t for t, _ in tps}))
        producers: dict[TP, list[ProducerInfo]] = {}
        errors: dict[TP, str] = {}
        by_leader: dict[int, list[TP]] = {}
        for tp in tps:
            leader = cluster.leaders.get(tp)
            if leader is None:
                errors[tp] = cluster.errors.get(tp[0], "UNKNOWN_TOPIC_OR_PARTITION")
            elif leader < 0:
                errors[tp] = "LEADER_NOT_AVAILABLE"
            else:
                by_leader.setdefault(leader, []).append(tp)
        for leader, group in by_leader.items():
            conn = self._broker(cluster, leader)
            v = conn.best_version(DESCRIBE_PRODUCERS, (0, 0))
            topics: dict[str, list[int]] = {}
            for t, p in group:
                topics.setdefault(t, []).append(p)
            resp = conn.request(DESCRIBE_PRODUCERS, v, {
                "topics": [{"name": t, "partition_indexes": tuple(ps)} for t, ps in topics.items()]})
            for t in resp.topics:
                for p in t.partitions:
                    tp = (t.name, int(p.partition_index))
                    if p.error_code:
                        msg = code_name(p.error_code)
                        errors[tp] = f"{msg}: {p.error_message}" if p.error_message else msg
                        continue
                    producers[tp] = [ProducerInfo(int(s.producer_id), int(s.producer_epoch), int(s.last_sequence),
                                                  int(s.last_timestamp), int(s.coordinator_epoch),
                                                  int(s.current_txn_start_offset)) for s in p.active_producers]
        return producers, errors

    def find_hanging(self, topic: str | None = None, partition: int | None = None,
                     max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
                     margin_ms: int = 0) -> list[OpenTxn]:
        """Hanging transactions on the searched partitions (all partitions of all topics by default)."""
        if partition is not None and topic is None:
            raise TxnAdminError("--partition needs --topic")
        cluster = self.cluster(None if topic is None else [topic])
        if topic is not None and topic in cluster.errors:
            raise TxnAdminError(f"topic {topic}: {cluster.errors[topic]}")
        if partition is not None:
            tps = [(topic, partition)]
        else:
            tps = sorted(tp for tp in cluster.leaders if topic is None or tp[0] == topic)
            if topic is None:
                tps = [tp for tp in tps if tp[0] in cluster.topics]
        producers, errors = self.describe_producers(tps, cluster)
        if errors:
            first = sorted(errors.items())
            raise TxnAdminError("DescribeProducers failed for " +
                                ", ".join(f"{t}-{p}: {e}" for (t, p), e in first))
        candidates = hanging_candidates(producers, self.clock(), max_transaction_timeout_ms, margin_ms)
        if not candidates:
            return []
        pids = sorted({c.producer.producer_id for c in candidates})
        tids = {r["producer_id"]: r["transactional_id"] for r in self.list_transactions(producer_ids=pids)
                if r["producer_id"] in pids}
        descriptions: dict[str, TxnDescription | None] = dict(self.describe_transactions(sorted(set(tids.values()))))
        return filter_hanging(candidates, tids, descriptions, self.clock(), margin_ms)

    # -- writes -----------------------------------------------------------------

    def abort_spec(self, topic: str, partition: int, start_offset: int) -> AbortSpec:
        """Look up the producer whose open transaction starts at ``start_offset`` (DescribeProducers)."""
        producers, errors = self.describe_producers([(topic, partition)])
        if (topic, partition) in errors:
            raise TxnAdminError(f"failed to describe producers of {topic}-{partition}: {errors[(topic, partition)]}")
        return abort_spec_for_offset(topic, partition, producers.get((topic, partition), []), start_offset)

    def abort_transaction(self, spec: AbortSpec) -> None:
        """WriteTxnMarkers (v1+) with one ABORT marker for ``spec`` at the partition leader (Admin.abortTransaction)."""
        tp = (spec.topic, spec.partition)
        deadline = time.monotonic() + self.retry_for
        body = {"markers": [{
            "producer_id": spec.producer_id, "producer_epoch": spec.producer_epoch, "transaction_result": False,
            "topics": [{"name": spec.topic, "partition_indexes": (spec.partition,)}],
            "coordinator_epoch": max(spec.coordinator_epoch, 0),
            "transaction_version": 0,  # v2+: classic marker semantics (the producer's own epoch)
        }]}
        while True:
            cluster = self.cluster([spec.topic])
            leader = cluster.leaders.get(tp)
            if leader is None:
                raise TxnAdminError(f"partition {spec.topic}-{spec.partition}: "
                                    f"{cluster.errors.get(spec.topic, 'UNKNOWN_TOPIC_OR_PARTITION')}")
            conn = self._broker(cluster, leader)
            v = conn.best_version(WRITE_TXN_MARKERS, (1, 2))
            resp = conn.request(WRITE_TXN_MARKERS, v, body)
            markers = resp.markers
            if (len(markers) != 1 or markers[0].producer_id != spec.producer_id or len(markers[0].topics) != 1
                    or markers[0].topics[0].name != spec.topic or len(markers[0].topics[0].partitions) != 1
                    or markers[0].topics[0].partitions[0].partition_index != spec.partition):
                raise TxnAdminError(f"WriteTxnMarkers: unexpected response {resp!r}")
            code = int(markers[0].topics[0].partitions[0].error_code)
            if code == 0:
                return
            if code in _LEADER_RETRIABLE and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise TxnAdminError(f"failed to abort the transaction of producer {spec.producer_id} "
                                f"(epoch {spec.producer_epoch}, coordinator epoch {spec.coordinator_epoch}) "
                                f"on {spec.topic}-{spec.partition}: {code_name(code)}")
