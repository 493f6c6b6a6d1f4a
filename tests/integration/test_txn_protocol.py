"""The transaction APIs over the wire, with oncelog's protocol client.

Raw InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
TxnOffsetCommit, WriteTxnMarkers, DescribeTransactions, ListTransactions and
transactional Produce requests (batches built with
``protocol.records.encode_record_batch``) against a real broker. Every bad
input must get Kafka's error code *and change nothing*: afterwards a
read_committed Fetch (records below the last stable offset, minus the
aborted transactions the response lists, filtered the way a client does),
the high watermark and DescribeTransactions are compared with what they were.

Covered: transaction timeout above ``transaction.max.timeout.ms``; a fenced
producer's Produce / AddPartitionsToTxn / EndTxn per version; Produce to a
partition outside the transaction; EndTxn without a transaction; requests
racing an EndTxn; same- and wrong-direction EndTxn retries; TxnOffsetCommit
with a stale generation; WriteTxnMarkers with an old producer epoch or an
older coordinator epoch; KIP-890 transactions v2 (EndTxn v5 epoch bump, a
delayed Produce from the previous transaction, implicit partition add by
Produce v12, the ``transaction.version`` feature); KIP-939 two-phase commit
(Enable2Pc, KeepPreparedTxn); DescribeTransactions / ListTransactions.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.client.connection import Connection
from oncelog.client.txns import parse_describe_transactions_v0
from oncelog.protocol.codec import decode_response, encode_request, is_flexible, request_type
from oncelog.protocol.build import materialize
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.headers import skip_tagged_fields
from oncelog.protocol.records import Record, encode_record_batch, iter_batch_headers, iter_records, read_control_marker
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(120)

PRODUCE, FETCH, LIST_OFFSETS, OFFSET_FETCH, JOIN_GROUP, SYNC_GROUP, API_VERSIONS = 0, 1, 2, 9, 11, 14, 18
CREATE_TOPICS, INIT_PID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN, WRITE_MARKERS, TXN_OFFSET_COMMIT = 19, 22, 24, 25, 26, 27, 28
DESCRIBE_TXNS, LIST_TXNS = 65, 66
MAX_TIMEOUT_MS = 60_000
TIMEOUT_MS = 30_000
BROKER_CONFIG = {"transaction.max.timeout.ms": str(MAX_TIMEOUT_MS), "group.initial.rebalance.delay.ms": "0"}


# -- fixtures -------------------------------------------------------------------------------


def create_topic(b: EmbeddedBroker, name: str, partitions: int = 3) -> None:
    with Connection(b.bootstrap) as c:
        r = c.request(CREATE_TOPICS, 5, {"topics": [{"name": name, "num_partitions": partitions,
                                                     "replication_factor": 1, "assignments": [], "configs": []}],
                                         "timeout": 10000, "validate_only": False})
        assert r.topics[0].error_code == 0, r.topics[0]


@pytest.fixture(scope="module")
def tbroker(tmp_path_factory: Any) -> Iterator[EmbeddedBroker]:
    d = tmp_path_factory.mktemp("txn-proto")
    b = EmbeddedBroker(data_dir=d / "data", log_path=d / "broker.log", config=dict(BROKER_CONFIG))
    b.start()
    try:
        yield b
    finally:
        b.close()


_topics = iter(range(10_000))


@pytest.fixture
def topic(tbroker: EmbeddedBroker, request: pytest.FixtureRequest) -> str:
    """A fresh 3-partition topic per test."""
    name = f"tp{next(_topics)}-{re.sub(r'[^a-zA-Z0-9]', '-', request.node.name)[:60]}"
    create_topic(tbroker, name)
    return name


@pytest.fixture
def conn(tbroker: EmbeddedBroker) -> Iterator[Connection]:
    with Connection(tbroker.bootstrap, client_id="txn-proto") as c:
        yield c


# -- request helpers ---------------------------------------------------------------------------


def init_pid(conn: Connection, txn_id: str, timeout_ms: int = TIMEOUT_MS, version: int = 5,
             pid: int = -1, epoch: int = -1, **extra: Any) -> Any:
    return conn.request(INIT_PID, version, {"transactional_id": txn_id, "transaction_timeout": timeout_ms,
                                            "producer_id": pid, "producer_epoch": epoch, **extra})


def init_ok(conn: Connection, txn_id: str, **kw: Any) -> tuple[int, int]:
    """InitProducerId, retrying CONCURRENT_TRANSACTIONS (an abort in progress) like a client does."""
    for _ in range(100):
        r = init_pid(conn, txn_id, **kw)
        if r.error_code != E.concurrent_transactions:
            break
        time.sleep(0.05)
    assert r.error_code == 0, E(r.error_code)
    return r.producer_id, r.producer_epoch


def add_partitions(conn: Connection, txn_id: str, pid: int, epoch: int, tps: list[tuple[str, int]],
                   version: int = 3) -> dict[tuple[str, int], int]:
    topics: dict[str, list[int]] = {}
    for t, p in tps:
        topics.setdefault(t, []).append(p)
    tlist = [{"name": t, "partitions": ps} for t, ps in topics.items()]
    if version <= 3:
        r = conn.request(ADD_PARTITIONS, version, {
            "v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": tlist})
        return {(t.name, pr.partition_index): int(pr.partition_error_code)
                for t in r.results_by_topic_v3_and_below for pr in t.results_by_partition}
    r = conn.request(ADD_PARTITIONS, version, {"transactions": [{
        "transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch, "verify_only": False,
        "topics": tlist}]})
    assert r.error_code == 0, E(r.error_code)
    (tr,) = r.results_by_transaction
    return {(t.name, pr.partition_index): int(pr.partition_error_code)
            for t in tr.topic_results for pr in t.results_by_partition}


def end_txn(conn: Connection, txn_id: str, pid: int, epoch: int, commit: bool, version: int = 3,
            wait: bool = True) -> Any:
    """EndTxn; on success (by default) also wait until the markers are written.

    Like Kafka, the broker answers once PrepareCommit/PrepareAbort is durable and writes the
    markers afterwards; a client sees the outcome once the transaction is Complete*."""
    r = conn.request(END_TXN, version, {"transactional_id": txn_id, "producer_id": pid,
                                        "producer_epoch": epoch, "committed": commit})
    if wait and r.error_code == 0:
        wait_completed(conn, txn_id)
    return r


def wait_completed(conn: Connection, txn_id: str, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = describe(conn, txn_id).transaction_state
        if state in ("CompleteCommit", "CompleteAbort", "Empty"):
            return state
        assert time.monotonic() < deadline, f"{txn_id} still {state} after {timeout}s"
        time.sleep(0.02)


def values_batch(values: list[bytes], pid: int, epoch: int, seq: int, transactional: bool = True) -> bytes:
    return encode_record_batch([Record(key=None, value=v) for v in values], producer_id=pid,
                               producer_epoch=epoch, base_sequence=seq, is_transactional=transactional)


def produce(conn: Connection, txn_id: str | None, topic: str, partition: int, records: bytes,
            version: int = 9) -> Any:
    r = conn.request(PRODUCE, version, {
        "transactional_id": txn_id, "acks": -1, "timeout": 10000,
        "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]})
    (pr,) = r.responses[0].partition_responses
    return pr


def produce_ok(conn: Connection, txn_id: str, topic: str, partition: int, values: list[bytes], pid: int,
               epoch: int, seq: int, version: int = 9) -> int:
    pr = produce(conn, txn_id, topic, partition, values_batch(values, pid, epoch, seq), version)
    assert pr.error_code == 0, (E(pr.error_code), pr.error_message)
    return int(pr.base_offset)


def fetch(conn: Connection, topic: str, partition: int, committed: bool) -> Any:
    r = conn.request(FETCH, 12, {
        "cluster_id": None, "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 22,
        "isolation_level": 1 if committed else 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": 1 << 22}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    assert r.error_code == 0
    (p,) = r.responses[0].partitions
    assert p.error_code == 0, E(p.error_code)
    return p


def visible(conn: Connection, topic: str, partition: int) -> list[bytes]:
    """What a read_committed consumer sees, filtered the way Kafka clients filter."""
    p = fetch(conn, topic, partition, True)
    data = bytes(p.records or b"")
    aborted = sorted((int(a.first_offset), int(a.producer_id)) for a in (p.aborted_transactions or ()))
    active: set[int] = set()
    out: list[bytes] = []
    for hdr, start, end in iter_batch_headers(data):
        assert hdr.last_offset < p.last_stable_offset, "read_committed fetch returned data at or above the LSO"
        while aborted and aborted[0][0] <= hdr.last_offset:
            active.add(aborted.pop(0)[1])
        if hdr.is_control:
            if not read_control_marker(data[start:end]).commit:
                active.discard(hdr.producer_id)
            continue
        if hdr.is_transactional and hdr.producer_id in active:
            continue
        out.extend(rec.value for _off, _ts, rec in iter_records(data[start:end]))
    return out


def log_state(conn: Connection, topic: str, partitions: int = 3) -> dict[int, tuple[int, int, list[bytes]]]:
    """(high watermark, last stable offset, visible read_committed values) per partition."""
    out = {}
    for part in range(partitions):
        p = fetch(conn, topic, part, True)
        out[part] = (int(p.high_watermark), int(p.last_stable_offset), visible(conn, topic, part))
    return out


def describe_many(conn: Connection, txn_ids: list[str]) -> list[SimpleNamespace]:
    """DescribeTransactions v0, decoded by hand (kio rejects the -1 start time of a txn id with no open txn)."""
    call = Pipelined(conn, DESCRIBE_TXNS, 0, {"transactional_ids": txn_ids})
    raw = conn.recv_frame()
    (corr,) = struct.unpack_from(">i", raw, 0)
    assert corr == call.corr
    return [SimpleNamespace(**st) for st in parse_describe_transactions_v0(raw, skip_tagged_fields(raw, 4))]


def describe(conn: Connection, txn_id: str) -> SimpleNamespace:
    (st,) = describe_many(conn, [txn_id])
    assert st.transactional_id == txn_id
    return st


def described(conn: Connection, txn_id: str) -> tuple[str, int, int, list[tuple[str, int]]]:
    st = describe(conn, txn_id)
    assert st.error_code == 0, E(st.error_code)
    return (st.transaction_state, st.producer_id, st.producer_epoch, sorted(st.partitions))


def vals(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


class Pipelined:
    """Send a request now, read its answer later (to race two requests on two connections)."""

    def __init__(self, conn: Connection, api_key: int, version: int, body: dict[str, Any], send: bool = True) -> None:
        """With ``send=False`` the framed request is only built (``self.frame``), for the caller to send."""
        self.conn, self.api_key, self.version = conn, api_key, version
        entity = materialize(request_type(api_key, version), body)
        conn.correlation_id += 1
        self.corr = conn.correlation_id
        client = conn.client_id.encode()
        header = struct.pack(">hhih", api_key, version, self.corr, len(client)) + client
        if is_flexible(api_key, version):
            header += b"\x00"
        payload = header + encode_request(entity)
        self.frame = struct.pack(">i", len(payload)) + payload
        if send:
            conn.sock.sendall(self.frame)

    def result(self) -> Any:
        raw = self.conn.recv_frame()
        (corr,) = struct.unpack_from(">i", raw, 0)
        assert corr == self.corr
        pos = skip_tagged_fields(raw, 4) if is_flexible(self.api_key, self.version) else 4
        return decode_response(self.api_key, self.version, raw, pos)


# -- InitProducerId ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 3, 5])
def test_timeout_above_max_is_invalid_transaction_timeout(conn: Connection, version: int) -> None:
    txn_id = f"too-long-{version}"
    r = init_pid(conn, txn_id, timeout_ms=MAX_TIMEOUT_MS + 1, version=version)
    assert r.error_code == E.invalid_transaction_timeout, E(r.error_code)
    # nothing was created for the id
    assert describe(conn, txn_id).error_code == E.transactional_id_not_found
    # the maximum itself is fine
    r = init_pid(conn, txn_id, timeout_ms=MAX_TIMEOUT_MS, version=version)
    assert r.error_code == 0 and r.producer_id >= 0 and r.producer_epoch == 0, r
    st = describe(conn, txn_id)
    assert st.transaction_state == "Empty" and st.producer_id == r.producer_id
    assert st.transaction_timeout_ms == MAX_TIMEOUT_MS and st.transaction_start_time_ms == -1


# -- fencing -------------------------------------------------------------------------------------


def test_fenced_producer_gets_kafka_errors_per_version(conn: Connection, tbroker: EmbeddedBroker, topic: str) -> None:
    txn_id = f"fence-{topic}"
    pid, e0 = init_ok(conn, txn_id)
    assert add_partitions(conn, txn_id, pid, e0, [(topic, 0)]) == {(topic, 0): 0}
    produce_ok(conn, txn_id, topic, 0, vals("zombie", 3), pid, e0, 0)
    # a new instance with the same transactional id fences the first and aborts its transaction
    with Connection(tbroker.bootstrap, client_id="successor") as other:
        pid2, e1 = init_ok(other, txn_id)
    assert pid2 == pid and e1 > e0
    state = described(conn, txn_id)
    assert state[:3] in {("Empty", pid, e1), ("CompleteAbort", pid, e1)}, state
    before = log_state(conn, topic)
    assert before[0][2] == [] and before[0][0] == 4 and before[0][1] == 4, before  # 3 records + ABORT marker

    pr = produce(conn, txn_id, topic, 0, values_batch(vals("late", 2), pid, e0, 3), version=9)
    assert pr.error_code == E.invalid_producer_epoch, E(pr.error_code)
    pr = produce(conn, txn_id, topic, 1, values_batch(vals("late1", 2), pid, e0, 0), version=9)
    assert pr.error_code in (E.invalid_producer_epoch, E.invalid_txn_state), E(pr.error_code)
    for version, want in [(0, E.invalid_producer_epoch), (1, E.invalid_producer_epoch),
                          (2, E.producer_fenced), (3, E.producer_fenced)]:
        got = add_partitions(conn, txn_id, pid, e0, [(topic, 1)], version=version)
        assert got == {(topic, 1): want}, (version, {k: E(v) for k, v in got.items()})
    for version, want in [(0, E.invalid_producer_epoch), (1, E.invalid_producer_epoch),
                          (2, E.producer_fenced), (3, E.producer_fenced), (4, E.producer_fenced)]:
        for commit in (True, False):
            r = end_txn(conn, txn_id, pid, e0, commit, version=version)
            assert r.error_code == want, (version, commit, E(r.error_code))
    r = init_pid(conn, txn_id, version=3, pid=pid, epoch=e0)
    assert r.error_code == E.invalid_producer_epoch, E(r.error_code)  # v<4: no PRODUCER_FENCED
    r = init_pid(conn, txn_id, version=4, pid=pid, epoch=e0)
    assert r.error_code == E.producer_fenced, E(r.error_code)
    # nothing changed
    assert log_state(conn, topic) == before
    assert described(conn, txn_id) == state


@pytest.mark.parametrize("version, want", [(3, E.invalid_txn_state), (10, E.invalid_txn_state),
                                           (11, E.transaction_abortable)])
def test_produce_to_partition_not_in_transaction(conn: Connection, topic: str, version: int, want: int) -> None:
    # Kafka: TRANSACTION_ABORTABLE from Produce v11 (KIP-890), INVALID_TXN_STATE for older clients
    txn_id = f"not-added-{topic}"
    pid, epoch = init_ok(conn, txn_id)
    assert add_partitions(conn, txn_id, pid, epoch, [(topic, 0)]) == {(topic, 0): 0}
    produce_ok(conn, txn_id, topic, 0, vals("in", 2), pid, epoch, 0, version=version)
    before = log_state(conn, topic)
    pr = produce(conn, txn_id, topic, 1, values_batch(vals("out", 2), pid, epoch, 0), version=version)
    assert pr.error_code == want, E(pr.error_code)
    after = log_state(conn, topic)
    assert after == before and after[1][0] == 0, after
    assert described(conn, txn_id) == ("Ongoing", pid, epoch, [(topic, 0)])
    # the transaction is still usable
    assert end_txn(conn, txn_id, pid, epoch, True).error_code == 0
    assert visible(conn, topic, 0) == vals("in", 2)
    assert fetch(conn, topic, 1, False).high_watermark == 0


def test_non_transactional_batch_during_open_transaction(conn: Connection, topic: str) -> None:
    txn_id = f"mixed-{topic}"
    pid, epoch = init_ok(conn, txn_id)
    assert add_partitions(conn, txn_id, pid, epoch, [(topic, 0)]) == {(topic, 0): 0}
    produce_ok(conn, txn_id, topic, 0, vals("t", 2), pid, epoch, 0)
    before = log_state(conn, topic)
    pr = produce(conn, None, topic, 0, values_batch(vals("plain", 1), pid, epoch, 2, transactional=False))
    assert pr.error_code == E.invalid_txn_state, E(pr.error_code)
    assert log_state(conn, topic) == before
    assert end_txn(conn, txn_id, pid, epoch, False).error_code == 0
    assert visible(conn, topic, 0) == []


@pytest.mark.parametrize("version", [3, 5])
def test_end_txn_without_transaction(conn: Connection, topic: str, version: int) -> None:
    txn_id = f"no-txn-{version}-{topic}"
    pid, epoch = init_ok(conn, txn_id)
    r = end_txn(conn, txn_id, pid, epoch, True, version=version)
    assert r.error_code == E.invalid_txn_state, E(r.error_code)
    if version < 5:
        r = end_txn(conn, txn_id, pid, epoch, False, version=version)
        assert r.error_code == E.invalid_txn_state, E(r.error_code)
    assert described(conn, txn_id) == ("Empty", pid, epoch, [])
    # an id nobody initialised
    r = end_txn(conn, f"never-{version}-{topic}", 12345, 0, True, version=version)
    assert r.error_code in (E.invalid_producer_id_mapping, E.transactional_id_not_found), E(r.error_code)


# -- racing and retried EndTxn ----------------------------------------------------------------------


def test_requests_racing_end_txn(tbroker: EmbeddedBroker, conn: Connection, topic: str) -> None:
    """AddPartitionsToTxn / EndTxn sent while an EndTxn(commit) is being completed: CONCURRENT_TRANSACTIONS
    (or, for a request that lands before the EndTxn or after completion, success).

    The racers go on a second connection right behind the EndTxn: requests of
    one connection never race (each starts once the one before it has applied
    its effects, as with Kafka's one-request-at-a-time channel), so racing needs
    two. The event loop usually reads the EndTxn first; then the racers meet
    its PrepareCommit write or the prepared transaction. When a racer is read
    first, the EndTxn is the one that races; either way every answer is
    success or CONCURRENT_TRANSACTIONS and the committed data is exactly what
    was produced."""
    txn_id = f"race-{topic}"
    pid, epoch = init_ok(conn, txn_id)
    concurrent_seen = 0
    seq = 0
    committed: list[bytes] = []
    with Connection(tbroker.bootstrap, client_id="txn-proto-racer") as other:
        for attempt in range(8):
            assert add_partitions(conn, txn_id, pid, epoch, [(topic, 0), (topic, 1)]) == {(topic, 0): 0, (topic, 1): 0}
            v = vals(f"r{attempt}", 2)
            produce_ok(conn, txn_id, topic, 0, v, pid, epoch, seq)
            produce_ok(conn, txn_id, topic, 1, v, pid, epoch, seq)
            seq += 2
            committed.extend(v)
            first = Pipelined(conn, END_TXN, 3, {"transactional_id": txn_id, "producer_id": pid,
                                                 "producer_epoch": epoch, "committed": True})
            racing_add = Pipelined(other, ADD_PARTITIONS, 3, {
                "v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [{"name": topic, "partitions": [2]}]},
                send=False)
            racing_end = Pipelined(other, END_TXN, 3, {"transactional_id": txn_id, "producer_id": pid,
                                                    "producer_epoch": epoch, "committed": True}, send=False)
            other.sock.sendall(racing_add.frame + racing_end.frame)
            first_err = first.result().error_code
            add_err = racing_add.result().results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
            end_err = racing_end.result().error_code
            for err in (first_err, add_err, end_err):
                assert err in (0, E.concurrent_transactions), E(err)
            concurrent_seen += sum(err == E.concurrent_transactions for err in (first_err, add_err, end_err))
            for _ in range(100):
                state, _pid, _epoch, parts = described(conn, txn_id)
                if state == "Ongoing":
                    # (topic, 0) still in it: both EndTxns lost their race, commit this round's data;
                    # else an add that landed after completion began a new transaction (v3: same
                    # epoch) holding only partition 2 and no data: abort it
                    r = end_txn(conn, txn_id, pid, epoch, (topic, 0) in parts)
                    assert r.error_code in (0, E.concurrent_transactions), E(r.error_code)
                elif state in ("CompleteCommit", "CompleteAbort"):
                    break
                time.sleep(0.02)
    assert concurrent_seen > 0, "no request ever met the transaction's PrepareCommit"
    assert visible(conn, topic, 0) == committed and visible(conn, topic, 1) == committed
    assert visible(conn, topic, 2) == []


def test_end_txn_retries(conn: Connection, topic: str) -> None:
    txn_id = f"retry-{topic}"
    pid, epoch = init_ok(conn, txn_id)
    assert add_partitions(conn, txn_id, pid, epoch, [(topic, 0)]) == {(topic, 0): 0}
    produce_ok(conn, txn_id, topic, 0, vals("c", 3), pid, epoch, 0)
    assert end_txn(conn, txn_id, pid, epoch, True).error_code == 0
    state = described(conn, txn_id)
    assert state[0] == "CompleteCommit", state
    before = log_state(conn, topic)
    # same direction: a retry whose answer was lost succeeds and writes nothing
    assert end_txn(conn, txn_id, pid, epoch, True).error_code == 0
    # the other direction after completion
    r = end_txn(conn, txn_id, pid, epoch, False)
    assert r.error_code == E.invalid_txn_state, E(r.error_code)
    assert log_state(conn, topic) == before
    assert described(conn, txn_id) == state
    assert before[0][2] == vals("c", 3)

    # and the mirror image after an abort
    assert add_partitions(conn, txn_id, pid, epoch, [(topic, 1)]) == {(topic, 1): 0}
    produce_ok(conn, txn_id, topic, 1, vals("a", 2), pid, epoch, 0)
    assert end_txn(conn, txn_id, pid, epoch, False).error_code == 0
    before = log_state(conn, topic)
    assert end_txn(conn, txn_id, pid, epoch, False).error_code == 0
    assert end_txn(conn, txn_id, pid, epoch, True).error_code == E.invalid_txn_state
    assert log_state(conn, topic) == before and before[1][2] == []


def test_end_txn_v5_retries(conn: Connection, topic: str) -> None:
    txn_id = f"retry5-{topic}"
    pid, epoch = init_ok(conn, txn_id)
    produce_ok(conn, txn_id, topic, 0, vals("c", 2), pid, epoch, 0, version=12)
    r = end_txn(conn, txn_id, pid, epoch, True, version=5)
    assert r.error_code == 0 and (r.producer_id, r.producer_epoch) == (pid, epoch + 1), r
    before = log_state(conn, topic)
    r = end_txn(conn, txn_id, pid, epoch, True, version=5)  # retry with the epoch it was sent with
    assert r.error_code == 0 and (r.producer_id, r.producer_epoch) == (pid, epoch + 1), r
    r = end_txn(conn, txn_id, pid, epoch, False, version=5)
    assert r.error_code == E.invalid_txn_state, E(r.error_code)
    assert log_state(conn, topic) == before and before[0][2] == vals("c", 2)
    # an abort of an empty transaction with the current epoch is allowed with TV2 and bumps again
    r = end_txn(conn, txn_id, pid, epoch + 1, False, version=5)
    assert r.error_code == 0 and (r.producer_id, r.producer_epoch) == (pid, epoch + 2), r
    assert log_state(conn, topic) == before


# -- TxnOffsetCommit ---------------------------------------------------------------------------------


def subscription(topic: str) -> bytes:
    return struct.pack(">hih", 0, 1, len(topic)) + topic.encode() + struct.pack(">i", -1)


def test_txn_offset_commit_stale_generation(conn: Connection, topic: str) -> None:
    group = f"g-{topic}"
    join = lambda member: conn.request(JOIN_GROUP, 5, {  # noqa: E731
        "group_id": group, "session_timeout": 30000, "rebalance_timeout": 10000, "member_id": member,
        "group_instance_id": None, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": subscription(topic)}]})
    r = join("")
    if r.error_code == E.member_id_required:
        r = join(r.member_id)
    assert r.error_code == 0, E(r.error_code)
    member, gen = r.member_id, r.generation_id
    assert gen == 1
    s = conn.request(SYNC_GROUP, 3, {"group_id": group, "generation_id": gen, "member_id": member,
                                     "group_instance_id": None, "assignments": [{"member_id": member,
                                                                                  "assignment": b""}]})
    assert s.error_code == 0

    txn_id = f"offs-{topic}"
    pid, epoch = init_ok(conn, txn_id)
    r = conn.request(ADD_OFFSETS, 3, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                      "group_id": group})
    assert r.error_code == 0, E(r.error_code)

    def commit(generation: int, member_id: str, offset: int) -> int:
        r = conn.request(TXN_OFFSET_COMMIT, 3, {
            "transactional_id": txn_id, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
            "generation_id": generation, "member_id": member_id, "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                       "committed_leader_epoch": -1,
                                                       "committed_metadata": ""}]}]})
        return int(r.topics[0].partitions[0].error_code)

    assert commit(0, member, 7) == E.illegal_generation
    assert commit(gen, "not-a-member", 8) == E.unknown_member_id
    assert end_txn(conn, txn_id, pid, epoch, True).error_code == 0

    def fetched() -> int:
        r = conn.request(OFFSET_FETCH, 7, {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}],
                                           "require_stable": True})
        assert r.error_code == 0, E(r.error_code)
        p = r.topics[0].partitions[0]
        assert p.error_code == 0, E(p.error_code)
        return int(p.committed_offset)

    assert fetched() == -1, "a rejected transactional offset commit became visible"
    # the same with the right generation commits
    r = conn.request(ADD_OFFSETS, 3, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                      "group_id": group})
    assert r.error_code == 0
    assert commit(gen, member, 9) == 0
    assert end_txn(conn, txn_id, pid, epoch, True).error_code == 0
    assert fetched() == 9


@pytest.mark.parametrize("version, want", [(0, E.invalid_txn_state), (3, E.invalid_txn_state),
                                           (4, E.transaction_abortable)])
def test_txn_offset_commit_without_add_offsets(conn: Connection, topic: str, version: int, want: int) -> None:
    # the offsets partition is not in the transaction (no AddOffsetsToTxn): Kafka answers
    # TRANSACTION_ABORTABLE from TxnOffsetCommit v4 (KIP-890), INVALID_TXN_STATE below
    txn_id = f"no-add-offsets-{topic}"
    pid, epoch = init_ok(conn, txn_id)
    assert add_partitions(conn, txn_id, pid, epoch, [(topic, 0)]) == {(topic, 0): 0}
    body: dict[str, Any] = {
        "transactional_id": txn_id, "group_id": f"g-{topic}", "producer_id": pid, "producer_epoch": epoch,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 5,
                                                   "committed_leader_epoch": -1, "committed_metadata": ""}]}]}
    if version >= 3:
        body |= {"generation_id": -1, "member_id": "", "group_instance_id": None}
    r = conn.request(TXN_OFFSET_COMMIT, version, body)
    assert r.topics[0].partitions[0].error_code == want, E(r.topics[0].partitions[0].error_code)
    # nothing was committed and the transaction is still usable
    assert end_txn(conn, txn_id, pid, epoch, True).error_code == 0
    r = conn.request(OFFSET_FETCH, 7, {"group_id": f"g-{topic}", "topics": [{"name": topic, "partition_indexes": [0]}],
                                       "require_stable": True})
    assert r.topics[0].partitions[0].committed_offset == -1


# -- WriteTxnMarkers ------------------------------------------------------------------------------


def write_marker(conn: Connection, topic: str, partition: int, pid: int, epoch: int, commit: bool,
                 coordinator_epoch: int, version: int = 1) -> int:
    marker: dict[str, Any] = {"producer_id": pid, "producer_epoch": epoch, "transaction_result": commit,
                              "topics": [{"name": topic, "partition_indexes": [partition]}],
                              "coordinator_epoch": coordinator_epoch}
    if version >= 2:
        marker["transaction_version"] = 0
    r = conn.request(WRITE_MARKERS, version, {"markers": [marker]})
    (m,) = r.markers
    assert m.producer_id == pid
    return int(m.topics[0].partitions[0].error_code)


def test_write_txn_markers_fencing(conn: Connection, topic: str) -> None:
    txn_id = f"markers-{topic}"
    pid, e0 = init_ok(conn, txn_id)
    pid, e1 = init_ok(conn, txn_id)
    assert e1 == e0 + 1
    assert add_partitions(conn, txn_id, pid, e1, [(topic, 0)]) == {(topic, 0): 0}
    produce_ok(conn, txn_id, topic, 0, vals("ab", 2), pid, e1, 0)
    assert end_txn(conn, txn_id, pid, e1, False).error_code == 0
    before = log_state(conn, topic)
    assert before[0][0] == 3 and before[0][2] == []

    # a marker with an older producer epoch (and a huge coordinator epoch: the epoch check comes first)
    assert write_marker(conn, topic, 0, pid, e0, True, 1_000_000) == E.invalid_producer_epoch
    assert log_state(conn, topic) == before
    # a marker from a coordinator with a higher epoch is accepted (an admin abort, KIP-664) ...
    assert write_marker(conn, topic, 0, pid, e1, False, 1000) == 0
    after_admin = log_state(conn, topic)
    assert after_admin[0][0] == 4 and after_admin[0][2] == []
    # ... and from then on an older coordinator epoch is fenced
    assert write_marker(conn, topic, 0, pid, e1, False, 999) == E.transaction_coordinator_fenced
    assert write_marker(conn, topic, 0, pid, e1, True, 999, version=2) == E.transaction_coordinator_fenced
    assert log_state(conn, topic) == after_admin
    # unknown partition
    assert write_marker(conn, topic, 7, pid, e1, False, 1000) == E.unknown_topic_or_partition


# -- KIP-890: transactions v2 ------------------------------------------------------------------------


def test_api_versions_advertise_transaction_version(conn: Connection) -> None:
    r = conn.request(API_VERSIONS, 3, {"client_software_name": "oncelog-it", "client_software_version": "1"})
    assert r.error_code == 0
    supported = {f.name: (f.min_version, f.max_version) for f in r.supported_features}
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in r.finalized_features}
    assert "transaction.version" in supported and supported["transaction.version"][1] >= 2, supported
    assert finalized.get("transaction.version", (0, 0))[1] == 2, finalized
    keys = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert keys[END_TXN][1] >= 5 and keys[PRODUCE][1] >= 12 and keys[INIT_PID][1] >= 6
    assert keys[ADD_PARTITIONS][1] >= 5 and keys[TXN_OFFSET_COMMIT][1] >= 5
    assert DESCRIBE_TXNS in keys and LIST_TXNS in keys and WRITE_MARKERS in keys


def test_tv2_epoch_bump_and_delayed_produce(conn: Connection, topic: str) -> None:
    txn_id = f"tv2-{topic}"
    pid, e = init_ok(conn, txn_id)
    # Produce v12 adds the partition implicitly: no AddPartitionsToTxn
    produce_ok(conn, txn_id, topic, 0, vals("one", 3), pid, e, 0, version=12)
    assert described(conn, txn_id) == ("Ongoing", pid, e, [(topic, 0)])
    produce_ok(conn, txn_id, topic, 1, vals("one-p1", 1), pid, e, 0, version=12)
    assert described(conn, txn_id) == ("Ongoing", pid, e, [(topic, 0), (topic, 1)])
    r = end_txn(conn, txn_id, pid, e, True, version=5)
    assert r.error_code == 0, E(r.error_code)
    assert (r.producer_id, r.producer_epoch) == (pid, e + 1), "EndTxn v5 must return the bumped epoch"
    e2 = r.producer_epoch
    # the next transaction starts (sequences restart with the new epoch)
    produce_ok(conn, txn_id, topic, 1, vals("two", 2), pid, e2, 0, version=12)
    before = log_state(conn, topic)
    # a Produce of the previous transaction, delayed: to a partition of that transaction ...
    pr = produce(conn, txn_id, topic, 0, values_batch(vals("late", 2), pid, e, 3), version=12)
    assert pr.error_code == E.invalid_producer_epoch, E(pr.error_code)
    # ... and to one the new transaction has not touched yet
    pr = produce(conn, txn_id, topic, 2, values_batch(vals("late2", 2), pid, e, 0), version=12)
    assert pr.error_code == E.invalid_producer_epoch, E(pr.error_code)
    assert log_state(conn, topic) == before
    assert described(conn, txn_id) == ("Ongoing", pid, e2, [(topic, 1)])
    r = end_txn(conn, txn_id, pid, e2, True, version=5)
    assert r.error_code == 0 and r.producer_epoch == e2 + 1
    assert visible(conn, topic, 0) == vals("one", 3)
    assert visible(conn, topic, 1) == vals("one-p1", 1) + vals("two", 2)
    assert fetch(conn, topic, 2, False).high_watermark == 0
    everything = [v for part in range(3) for v in visible(conn, topic, part)]
    assert not [v for v in everything if v.startswith(b"late")]


def test_tv2_pipelined_produces_keep_their_order(tbroker: EmbeddedBroker, conn: Connection, topic: str) -> None:
    """Broker correctness item 2: a TV2 producer (Produce v12, implicit adds, pipelined as Java's
    client does) sends request A, with partitions new to the transaction and the next 50
    sequences of partition 0, and right behind it on the same connection request B, partition 0
    only, the sequences after A's. A waits for its implicit adds to be logged; B must not overtake
    it (B would get OUT_OF_ORDER_SEQUENCE_NUMBER, fatal for the client): both succeed, A first.
    Partition 0 is already in the transaction (B needs no add of its own) in the first rounds and
    new to it, like A's other partitions, in the last."""
    name = f"{topic}-wide"
    create_topic(tbroker, name, 8)
    txn_id = f"tv2-pipe-{topic}"
    expected: list[bytes] = []
    for round_ in range(4):
        pid, e = init_ok(conn, txn_id)
        seq = 0
        if round_ < 3:
            first = vals(f"f{round_}", 5)
            produce_ok(conn, txn_id, name, 0, first, pid, e, 0, version=12)
            expected += first
            seq = 5
        a_vals, b_vals = vals(f"a{round_}", 50), vals(f"b{round_}", 10)
        a = Pipelined(conn, PRODUCE, 12, {"transactional_id": txn_id, "acks": -1, "timeout": 10000, "topic_data": [
            {"name": name, "partition_data": [
                {"index": p, "records": values_batch(a_vals, pid, e, seq) if p == 0 else values_batch(vals(f"x{p}", 1), pid, e, 0)}
                for p in range(8)]}]}, send=False)
        b = Pipelined(conn, PRODUCE, 12, {"transactional_id": txn_id, "acks": -1, "timeout": 10000, "topic_data": [
            {"name": name, "partition_data": [{"index": 0, "records": values_batch(b_vals, pid, e, seq + 50)}]}]},
                      send=False)
        conn.sock.sendall(a.frame + b.frame)  # back to back, as a pipelining client sends them
        ra, rb = a.result(), b.result()
        errors_a = {p.index: E(p.error_code) for p in ra.responses[0].partition_responses}
        (pb,) = rb.responses[0].partition_responses
        assert set(errors_a.values()) == {E.none}, errors_a
        assert pb.error_code == 0, (E(pb.error_code), pb.error_message)
        pa0 = next(p for p in ra.responses[0].partition_responses if p.index == 0)
        assert pb.base_offset == pa0.base_offset + 50, "B was appended before A"
        assert described(conn, txn_id)[3] == [(name, p) for p in range(8)]
        r = end_txn(conn, txn_id, pid, e, True, version=5)
        assert r.error_code == 0, E(r.error_code)
        expected += a_vals + b_vals
    assert visible(conn, name, 0) == expected


def test_tv2_late_end_txn_does_not_end_the_next_transaction(conn: Connection, topic: str) -> None:
    """KAFKA-17754 (found by Jepsen in Bufstream): an EndTxn of transaction N delayed past N+1's start.

    With transactions v1 the late request carries the same producer epoch as
    N+1 and would end it, as in Apache Kafka. With v2 the epoch was bumped by
    N's EndTxn, so the late copy is fenced while N+1 is open and N+1 stays
    as it was.
    """
    txn_id = f"tv2-late-end-{topic}"
    pid, e = init_ok(conn, txn_id)
    produce_ok(conn, txn_id, topic, 0, vals("n", 2), pid, e, 0, version=12)
    r = end_txn(conn, txn_id, pid, e, True, version=5)
    assert r.error_code == 0 and r.producer_epoch == e + 1
    produce_ok(conn, txn_id, topic, 0, vals("n1", 2), pid, e + 1, 0, version=12)
    before = log_state(conn, topic)
    for commit in (True, False):  # the late EndTxn of N, either way
        r = end_txn(conn, txn_id, pid, e, commit, version=5)
        assert r.error_code == E.producer_fenced, E(r.error_code)
        assert described(conn, txn_id) == ("Ongoing", pid, e + 1, [(topic, 0)])
        assert log_state(conn, topic) == before
    assert visible(conn, topic, 0) == vals("n", 2)  # N+1 is still open: not visible
    r = end_txn(conn, txn_id, pid, e + 1, False, version=5)
    assert r.error_code == 0
    assert visible(conn, topic, 0) == vals("n", 2)


def test_tv2_abort_then_next_transaction(conn: Connection, topic: str) -> None:
    txn_id = f"tv2-abort-{topic}"
    pid, e = init_ok(conn, txn_id)
    produce_ok(conn, txn_id, topic, 0, vals("gone", 2), pid, e, 0, version=12)
    r = end_txn(conn, txn_id, pid, e, False, version=5)
    assert r.error_code == 0 and r.producer_epoch == e + 1
    produce_ok(conn, txn_id, topic, 0, vals("kept", 2), pid, e + 1, 0, version=12)
    r = end_txn(conn, txn_id, pid, e + 1, True, version=5)
    assert r.error_code == 0 and r.producer_epoch == e + 2
    assert visible(conn, topic, 0) == vals("kept", 2)
    p = fetch(conn, topic, 0, True)
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(pid, 0)]
    assert p.last_stable_offset == p.high_watermark == 6


def test_open_transaction_lso_and_list_offsets(conn: Connection, topic: str) -> None:
    txn_id = f"lso-{topic}"
    plain = encode_record_batch([Record(key=None, value=b"plain")])
    assert produce(conn, None, topic, 0, plain).error_code == 0
    pid, e = init_ok(conn, txn_id)
    first = produce_ok(conn, txn_id, topic, 0, vals("open", 2), pid, e, 0, version=12)
    assert first == 1
    assert produce(conn, None, topic, 0, plain).error_code == 0
    p = fetch(conn, topic, 0, True)
    assert (p.high_watermark, p.last_stable_offset) == (4, 1)
    assert visible(conn, topic, 0) == [b"plain"]
    r = conn.request(LIST_OFFSETS, 5, {"replica_id": -1, "isolation_level": 1, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]})
    assert r.topics[0].partitions[0].offset == 1
    r = conn.request(LIST_OFFSETS, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]})
    assert r.topics[0].partitions[0].offset == 4
    assert end_txn(conn, txn_id, pid, e, True, version=5).error_code == 0
    p = fetch(conn, topic, 0, True)
    assert (p.high_watermark, p.last_stable_offset) == (5, 5)
    assert visible(conn, topic, 0) == [b"plain"] + vals("open", 2) + [b"plain"]


# -- KIP-939: two-phase commit ---------------------------------------------------------------------------


def test_enable_2pc_refused_without_config(conn: Connection) -> None:
    r = init_pid(conn, "two-pc-off", version=6, enable2_pc=True, keep_prepared_txn=False)
    assert r.error_code == E.transactional_id_authorization_failed, E(r.error_code)
    assert describe(conn, "two-pc-off").error_code == E.transactional_id_not_found


def test_keep_prepared_transaction(broker_factory: Callable[..., EmbeddedBroker]) -> None:
    b = broker_factory(config={**BROKER_CONFIG, "transaction.two.phase.commit.enable": "true"}, name="2pc")
    create_topic(b, "two-pc")
    txn_id = "two-pc-app"
    with Connection(b.bootstrap) as conn:
        r = init_pid(conn, txn_id, version=6, enable2_pc=True, keep_prepared_txn=False)
        assert r.error_code == 0, E(r.error_code)
        pid, e = r.producer_id, r.producer_epoch
        assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (-1, -1)
        assert add_partitions(conn, txn_id, pid, e, [("two-pc", 0), ("two-pc", 1)]) == {
            ("two-pc", 0): 0, ("two-pc", 1): 0}
        produce_ok(conn, txn_id, "two-pc", 0, vals("p0", 3), pid, e, 0)
        produce_ok(conn, txn_id, "two-pc", 1, vals("p1", 2), pid, e, 0)
    # the application "restarts": a new client recovers the prepared transaction instead of aborting it
    with Connection(b.bootstrap) as conn:
        r = init_pid(conn, txn_id, version=6, enable2_pc=True, keep_prepared_txn=True)
        assert r.error_code == 0, E(r.error_code)
        assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (pid, e), r
        new_pid, new_epoch = r.producer_id, r.producer_epoch
        assert (new_pid, new_epoch) != (pid, e)
        state = described(conn, txn_id)
        assert state[0] == "Ongoing" and state[3] == [("two-pc", 0), ("two-pc", 1)], state
        st = log_state(conn, "two-pc")
        assert st[0][2] == [] and st[1][2] == [] and st[0][1] == 0, st
        r = end_txn(conn, txn_id, new_pid, new_epoch, True)
        assert r.error_code == 0, E(r.error_code)
        assert visible(conn, "two-pc", 0) == vals("p0", 3)
        assert visible(conn, "two-pc", 1) == vals("p1", 2)
        assert described(conn, txn_id)[0] == "CompleteCommit"
    # without keepPreparedTxn an ongoing 2PC transaction is aborted as usual
    with Connection(b.bootstrap) as conn:
        pid, e = init_ok(conn, txn_id, version=6, enable2_pc=True, keep_prepared_txn=False)
        assert add_partitions(conn, txn_id, pid, e, [("two-pc", 2)]) == {("two-pc", 2): 0}
        produce_ok(conn, txn_id, "two-pc", 2, vals("p2", 2), pid, e, 0)
        pid2, e2 = init_ok(conn, txn_id, version=6, enable2_pc=True, keep_prepared_txn=False)
        assert e2 > e
        assert visible(conn, "two-pc", 2) == []
        assert fetch(conn, "two-pc", 2, True).last_stable_offset == 3


# -- DescribeTransactions / ListTransactions -----------------------------------------------------------


def test_describe_and_list_transactions(conn: Connection, topic: str) -> None:
    ids = {s: f"lst-{s}-{topic}" for s in ("empty", "ongoing", "commit", "abort")}
    pids = {}
    for s, txn_id in ids.items():
        pids[s] = init_ok(conn, txn_id, timeout_ms=20_000)
    for s in ("ongoing", "commit", "abort"):
        pid, e = pids[s]
        assert add_partitions(conn, ids[s], pid, e, [(topic, 0), (topic, 2)]) == {(topic, 0): 0, (topic, 2): 0}
    for s in ("commit", "abort"):
        pid, e = pids[s]
        assert end_txn(conn, ids[s], pid, e, s == "commit").error_code == 0

    by_id = {st.transactional_id: st for st in describe_many(conn, list(ids.values()) + ["lst-unknown"])}
    assert by_id["lst-unknown"].error_code == E.transactional_id_not_found
    want_state = {"empty": "Empty", "ongoing": "Ongoing", "commit": "CompleteCommit", "abort": "CompleteAbort"}
    for s, txn_id in ids.items():
        st = by_id[txn_id]
        assert st.error_code == 0
        assert st.transaction_state == want_state[s], (s, st.transaction_state)
        assert (st.producer_id, st.producer_epoch) == pids[s]
        assert st.transaction_timeout_ms == 20_000
        parts = sorted(st.partitions)
        assert parts == ([(topic, 0), (topic, 2)] if s == "ongoing" else []), (s, parts)
        if s == "ongoing":
            assert abs(st.transaction_start_time_ms - time.time() * 1000) < 60_000, st
        elif s == "empty":
            assert st.transaction_start_time_ms == -1, st
    ours = set(ids.values())

    def listed(version: int = 1, **body: Any) -> tuple[Any, dict[str, tuple[int, str]]]:
        req = {"state_filters": [], "producer_id_filters": [], "duration_filter": -1, **body}
        r = conn.request(LIST_TXNS, version, req)
        assert r.error_code == 0, E(r.error_code)
        return r, {t.transactional_id: (t.producer_id, t.transaction_state)
                   for t in r.transaction_states if t.transactional_id in ours}

    _, every = listed()
    assert every == {ids[s]: (pids[s][0], want_state[s]) for s in ids}
    _, ongoing = listed(state_filters=["Ongoing"])
    assert ongoing == {ids["ongoing"]: (pids["ongoing"][0], "Ongoing")}
    _, two = listed(state_filters=["CompleteCommit", "CompleteAbort"])
    assert set(two) == {ids["commit"], ids["abort"]}
    _, one = listed(producer_id_filters=[pids["abort"][0]])
    assert set(one) == {ids["abort"]}
    r, mixed = listed(state_filters=["Ongoing", "NoSuchState"])
    assert set(mixed) == {ids["ongoing"]} and list(r.unknown_state_filters) == ["NoSuchState"]
    # duration filter: only transactions running longer than the given ms (the ongoing one, if old enough)
    _, long_running = listed(duration_filter=3_600_000)
    assert not {ids["ongoing"], ids["commit"], ids["abort"]} & set(long_running), long_running
    time.sleep(0.05)
    _, short = listed(duration_filter=10)
    assert ids["ongoing"] in short, short
    _, pattern = listed(version=2, transactional_id_pattern=f"^lst-(commit|empty)-{re.escape(topic)}$")
    assert set(pattern) == {ids["commit"], ids["empty"]}
    # clean up the ongoing one
    assert end_txn(conn, ids["ongoing"], *pids["ongoing"], False).error_code == 0


def test_list_transactions_only_unknown_state_filter(conn: Connection, topic: str) -> None:
    """Kafka (TransactionStateManager.listTransactionStates) filters on the names given: when every
    state filter is unknown nothing matches; the unknown names come back in UnknownStateFilters."""
    txn_id = f"unknown-filter-{topic}"
    init_ok(conn, txn_id)
    r = conn.request(LIST_TXNS, 1, {"state_filters": ["NoSuchState"], "producer_id_filters": [],
                                    "duration_filter": -1})
    assert r.error_code == 0 and list(r.unknown_state_filters) == ["NoSuchState"]
    listed = sorted(t.transactional_id for t in r.transaction_states)
    assert listed == [], f"an unknown state filter matched {len(listed)} transactional ids, e.g. {listed[:3]}"
