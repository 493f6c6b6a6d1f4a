"""KIP-664 client tooling without a broker: pure hanging-transaction rules with a fake clock, and the
TxnAdmin/CLI against a fake cluster whose every request and response goes through kio's encoders and
decoders at the negotiated version (so request shaping and response parsing are exercised)."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from typing import Any, Callable

import pytest

from oncelog import cli
from oncelog.client import txns as T
from oncelog.client.aio.admin import TransactionListing
from oncelog.client.errors import KafkaError, TransactionalIdNotFoundError
from oncelog.client.txns import AbortSpec, OpenTxn, ProducerInfo, TxnAdmin, TxnAdminError, TxnDescription
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import (decode_request, decode_response, encode_request, encode_response, request_type,
                                    response_type)
from oncelog.protocol.errors import ErrorCode as E

NOW = 10_000_000
MAX = 60_000


def prod(pid: int, start: int = -1, last: int = NOW - 2 * MAX, epoch: int = 3, coord_epoch: int = 0) -> ProducerInfo:
    return ProducerInfo(pid, epoch, 7, last, coord_epoch, start)


# -- pure rules ---------------------------------------------------------------------


def test_candidates_need_an_open_txn_older_than_max_plus_margin() -> None:
    producers = {
        ("t", 0): [prod(1, start=5), prod(2, start=-1), prod(3, start=9, last=NOW - MAX)],  # 3: exactly MAX, not older
        ("t", 1): [prod(4, start=0, last=NOW - MAX - 1)],
        ("u", 0): [prod(5, start=0, last=NOW - MAX - 500)],
    }
    got = T.hanging_candidates(producers, NOW, MAX)
    assert [(c.topic, c.partition, c.producer.producer_id) for c in got] == [("t", 0, 1), ("t", 1, 4), ("u", 0, 5)]
    got = T.hanging_candidates(producers, NOW, MAX, margin_ms=1000)
    assert [(c.topic, c.partition, c.producer.producer_id) for c in got] == [("t", 0, 1)]
    # the fake clock moves: producer 3 becomes a candidate one ms after MAX + margin
    assert [c.producer.producer_id for c in T.hanging_candidates(producers, NOW + 1001, MAX, 1000)] == [1, 3, 4, 5]


def desc(tid: str, parts: tuple[tuple[str, int], ...], state: str = "Ongoing", start: int = NOW - 1000,
         timeout: int = 60_000, error: str | None = None) -> TxnDescription:
    return TxnDescription(tid, 0, state, 1, 3, timeout, start, parts, error)


def test_filter_hanging_cross_checks_the_coordinator() -> None:
    cands = [OpenTxn("t", 0, prod(1, 0)), OpenTxn("t", 1, prod(1, 4)), OpenTxn("t", 2, prod(2, 0)),
             OpenTxn("t", 3, prod(3, 0)), OpenTxn("t", 4, prod(4, 0)), OpenTxn("t", 5, prod(5, 0))]
    tids = {1: "a", 3: "c", 4: "d", 5: "e"}
    descriptions: dict[str, TxnDescription | None] = {
        "a": desc("a", (("t", 0),)),                             # t-0 still in a's txn: coordinator will finish it
        "c": desc("c", (), error="TRANSACTIONAL_ID_NOT_FOUND"),
        "d": desc("d", (("t", 4),), state="PrepareAbort", start=NOW - 10 * MAX),  # markers pending: not hanging
        "e": desc("e", (("t", 5),), start=NOW - 61_001, timeout=60_000),        # coordinator failed to abort it
    }
    got = {(h.partition, h.reason, h.transactional_id) for h in T.filter_hanging(cands, tids, descriptions, NOW)}
    assert got == {(1, "partition-not-in-transaction", "a"), (2, "no-transactional-id", None),
                   (3, "unknown-transactional-id", "c"), (5, "coordinator-overdue", "e")}
    # with a margin the overdue one is not hanging yet
    got = T.filter_hanging(cands, tids, descriptions, NOW, margin_ms=5000)
    assert {h.partition for h in got} == {1, 2, 3}
    # a missing description (not returned at all) counts as unknown
    assert [h.reason for h in T.filter_hanging(cands[:1], {1: "z"}, {}, NOW)] == ["unknown-transactional-id"]


def test_abort_spec_for_offset() -> None:
    producers = [prod(1, start=-1), prod(2, start=10, epoch=5, coord_epoch=-1), prod(3, start=12, coord_epoch=4)]
    assert T.abort_spec_for_offset("t", 0, producers, 10) == AbortSpec("t", 0, 2, 5, 0)  # coordinator epoch -1 -> 0
    assert T.abort_spec_for_offset("t", 0, producers, 12) == AbortSpec("t", 0, 3, 3, 4)
    with pytest.raises(TxnAdminError, match="starting at offset 11"):
        T.abort_spec_for_offset("t", 0, producers, 11)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_list_transactions_body_encodes_at_every_version(version: int) -> None:
    body = T.list_transactions_body(version, ["Ongoing"], [7, 8], 1000 if version else -1)
    entity = materialize(request_type(66, version), body)
    back = decode_request(66, version, encode_request(entity), 0)
    assert back.state_filters == ("Ongoing",) and list(back.producer_id_filters) == [7, 8]
    if version >= 1:
        assert back.duration_filter == 1000


def test_duration_filter_needs_v1() -> None:
    with pytest.raises(TxnAdminError, match="duration filter"):
        T.list_transactions_body(0, (), (), 5)
    assert T.list_transactions_body(0, (), (), -1) == {"state_filters": (), "producer_id_filters": ()}


# -- a fake cluster over kio's codecs -------------------------------------------------


class FakeCluster:
    """Two brokers; node 1 leads t-0, node 2 leads t-1; node 2 coordinates every transactional id."""

    def __init__(self, versions: dict[int, tuple[int, int]] | None = None) -> None:
        self.versions = versions or {3: (0, 12), 10: (0, 6), 27: (0, 2), 61: (0, 0), 65: (0, 0), 66: (0, 2)}
        self.txns: dict[str, dict[str, Any]] = {}
        self.producers: dict[tuple[str, int], list[dict[str, Any]]] = {("t", 0): [], ("t", 1): []}
        self.leaders = {("t", 0): 1, ("t", 1): 2}
        self.requests: list[tuple[int, int, int, Any]] = []  # (node, api key, version, request)
        self.marker_error = 0
        self.coordinator_not_available = 0

    def handle(self, node: int, key: int, version: int, req: Any) -> dict[str, Any]:
        self.requests.append((node, key, version, req))
        if key == 3:
            names = [t.name for t in req.topics] if req.topics is not None else ["t"]
            topics = []
            for n in names:
                if n != "t":
                    topics.append({"error_code": E.unknown_topic_or_partition, "name": n, "topic_id": None,
                                   "partitions": []})
                    continue
                topics.append({"error_code": 0, "name": "t", "topic_id": None, "is_internal": False, "partitions": [
                    {"error_code": 0, "partition_index": p, "leader_id": self.leaders[("t", p)]} for p in (0, 1)]})
            return {"throttle_time": 0, "brokers": [{"node_id": 1, "host": "h1", "port": 1},
                                                    {"node_id": 2, "host": "h2", "port": 2}],
                    "cluster_id": "c", "controller_id": 1, "topics": topics}
        if key == 10:
            err = 0
            if self.coordinator_not_available:
                self.coordinator_not_available -= 1
                err = E.coordinator_not_available
            assert req.key_type == 1
            coord = {"error_code": err, "error_message": None, "node_id": 2, "host": "h2", "port": 2}
            if version >= 4:
                return {"throttle_time": 0, "coordinators": [{"key": k, **coord} for k in req.coordinator_keys]}
            return {"throttle_time": 0, **coord}
        if key == 66:
            rows = [{"transactional_id": tid, "producer_id": t["producer_id"], "transaction_state": t["state"]}
                    for tid, t in self.txns.items() if node == 2
                    and (not req.state_filters or t["state"] in req.state_filters)
                    and (not req.producer_id_filters or t["producer_id"] in req.producer_id_filters)]
            return {"throttle_time": 0, "error_code": 0, "unknown_state_filters": [], "transaction_states": rows}
        if key == 65:
            assert node == 2, "DescribeTransactions must go to the coordinator"
            out = []
            for tid in req.transactional_ids:
                t = self.txns.get(tid)
                if t is None:
                    out.append({"error_code": E.transactional_id_not_found, "transactional_id": tid,
                                "transaction_state": "", "transaction_timeout": 0, "transaction_start_time": -1,
                                "producer_id": -1, "producer_epoch": -1, "topics": []})
                else:
                    out.append({"error_code": 0, "transactional_id": tid, "transaction_state": t["state"],
                                "transaction_timeout": t["timeout"], "transaction_start_time": t["start"],
                                "producer_id": t["producer_id"], "producer_epoch": t["epoch"],
                                "topics": [{"topic": "t", "partitions": t["partitions"]}] if t["partitions"] else []})
            return {"throttle_time": 0, "transaction_states": out}
        if key == 61:
            topics = []
            for t in req.topics:
                parts = []
                for p in t.partition_indexes:
                    if (t.name, p) not in self.producers:
                        parts.append({"partition_index": p, "error_code": E.unknown_topic_or_partition,
                                      "error_message": None, "active_producers": []})
                        continue
                    assert self.leaders[(t.name, p)] == node, "DescribeProducers must go to the leader"
                    parts.append({"partition_index": p, "error_code": 0, "error_message": None,
                                  "active_producers": self.producers[(t.name, p)]})
                topics.append({"name": t.name, "partitions": parts})
            return {"throttle_time": 0, "topics": topics}
        if key == 27:
            m = req.markers[0]
            tp = (m.topics[0].name, m.topics[0].partition_indexes[0])
            assert self.leaders[tp] == node, "WriteTxnMarkers must go to the leader"
            if not self.marker_error:
                self.producers[tp] = [dict(p, current_txn_start_offset=-1) if p["producer_id"] == m.producer_id
                                      else p for p in self.producers[tp]]
            return {"markers": [{"producer_id": m.producer_id, "topics": [
                {"name": tp[0], "partitions": [{"partition_index": tp[1], "error_code": self.marker_error}]}]}]}
        raise AssertionError(f"unexpected api {key}")


def _uvarint(n: int) -> bytes:
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def _cstr(s: str) -> bytes:
    return _uvarint(len(s.encode()) + 1) + s.encode()


def encode_describe_transactions_v0(resp: dict[str, Any]) -> bytes:
    """By hand, independent of the client's decoder (kio cannot write the -1 start time)."""
    out = struct.pack(">i", resp["throttle_time"]) + _uvarint(len(resp["transaction_states"]) + 1)
    for s in resp["transaction_states"]:
        out += struct.pack(">h", int(s["error_code"])) + _cstr(s["transactional_id"]) + _cstr(s["transaction_state"])
        out += struct.pack(">iqqh", s["transaction_timeout"], s["transaction_start_time"], s["producer_id"],
                           s["producer_epoch"])
        out += _uvarint(len(s["topics"]) + 1)
        for t in s["topics"]:
            out += _cstr(t["topic"]) + _uvarint(len(t["partitions"]) + 1)
            out += b"".join(struct.pack(">i", p) for p in t["partitions"]) + b"\x00"
        out += b"\x00"
    return out + b"\x00"


class FakeConn:
    """Stands in for the client's asyncio BrokerConnection: each request is encoded and decoded with kio at the
    negotiated version, answered by the fake cluster, and the answer encoded and decoded again."""

    nodes = {("boot", 9): 1, ("h1", 1): 1, ("h2", 2): 2}

    def __init__(self, cluster: FakeCluster, host: str, port: int, node_id: int = -1, **_kw: Any) -> None:
        self.cluster, self.node = cluster, self.nodes[(host, port)]
        self.host, self.port, self.node_id = host, port, node_id
        self.closed = False
        self.in_flight = 0

    async def connect(self) -> None:
        pass

    def version(self, api_key: int, ours: tuple[int, int]) -> int:
        from oncelog.client.errors import UnsupportedApiError

        lo, hi = self.cluster.versions.get(api_key, (-1, -1))
        best = min(hi, ours[1])
        if best < max(lo, ours[0]):
            raise UnsupportedApiError(f"no common version for API {api_key}")
        return best

    def _answer(self, api_key: int, version: int, body: Any, raw: bool) -> Any:
        req = decode_request(api_key, version, encode_request(materialize(request_type(api_key, version), body)), 0)
        resp = self.cluster.handle(self.node, api_key, version, req)
        if raw:
            assert api_key == 65
            return struct.pack(">i", 1) + b"\x00" + encode_describe_transactions_v0(resp), 5
        return decode_response(api_key, version, encode_response(materialize(response_type(api_key, version), resp)), 0)

    def send(self, api_key: int, version: int, body: Any, *, raw_response: bool = False, **_kw: Any) -> Any:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(self._answer(api_key, version, body, raw_response))
        return fut

    async def request(self, api_key: int, version: int, body: Any, **_kw: Any) -> Any:
        return self._answer(api_key, version, body, False)

    def close(self, error: Any = None) -> None:
        self.closed = True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    from oncelog.client.aio import cluster as aio_cluster

    cluster = FakeCluster()
    monkeypatch.setattr(aio_cluster, "BrokerConnection", lambda host, port, **kw: FakeConn(cluster, host, port, **kw))
    return cluster


def admin(now: Callable[[], int] = lambda: NOW) -> TxnAdmin:
    return TxnAdmin("boot:9", clock=now)


def open_txn(cluster: FakeCluster, tid: str, pid: int, parts: list[int], start_offset: int = 0,
             last: int = NOW - 2 * MAX, state: str = "Ongoing", timeout: int = MAX, start: int = NOW - 2 * MAX,
             coord_parts: list[int] | None = None) -> None:
    cluster.txns[tid] = {"producer_id": pid, "epoch": 2, "state": state, "timeout": timeout, "start": start,
                         "partitions": parts if coord_parts is None else coord_parts}
    for p in parts:
        cluster.producers[("t", p)].append({"producer_id": pid, "producer_epoch": 2, "last_sequence": 4,
                                            "last_timestamp": last, "coordinator_epoch": -1,
                                            "current_txn_start_offset": start_offset})


def test_list_and_describe_route_and_parse(fake: FakeCluster) -> None:
    open_txn(fake, "tx-a", 11, [0, 1])
    open_txn(fake, "tx-b", 12, [], state="CompleteCommit", start=-1)
    with admin() as a:
        rows = a.list_transactions()
        assert rows == [TransactionListing("tx-a", 11, "Ongoing", 2),
                        TransactionListing("tx-b", 12, "CompleteCommit", 2)]
        assert {n for n, k, _, _ in fake.requests if k == 66} == {1, 2}  # every broker was asked
        assert [r.transactional_id for r in a.list_transactions(states=["Ongoing"])] == ["tx-a"]
        assert [r.transactional_id for r in a.list_transactions(producer_ids=[12])] == ["tx-b"]
        a.list_transactions(duration_ms=500)
        assert [v for _, k, v, _ in fake.requests if k == 66][-1] == 2  # highest advertised version
        d = a.describe_transactions(["tx-a", "nope", "tx-b"])
    assert d["tx-a"] == TxnDescription("tx-a", 2, "Ongoing", 11, 2, MAX, NOW - 2 * MAX, (("t", 0), ("t", 1)))
    assert d["tx-b"].start_time_ms == -1 and d["tx-b"].partitions == ()
    assert d.errors["nope"].name == "TRANSACTIONAL_ID_NOT_FOUND"
    with pytest.raises(TransactionalIdNotFoundError):
        d["nope"]
    assert [k for _, k, v, r in fake.requests if k == 10 and v == 6 and r.key_type == 1]


def test_find_coordinator_retries_and_old_versions(fake: FakeCluster) -> None:
    fake.versions[10] = (0, 3)
    fake.coordinator_not_available = 2
    open_txn(fake, "tx-a", 11, [0])
    with admin() as a:
        assert a.describe_transactions(["tx-a"])["tx-a"].state == "Ongoing"
    assert [v for _, k, v, _ in fake.requests if k == 10] == [3, 3, 3]


def test_list_duration_filter_on_a_v0_broker_is_an_error(fake: FakeCluster) -> None:
    fake.versions[66] = (0, 0)
    with admin() as a:
        assert a.list_transactions() == []
        with pytest.raises(TxnAdminError, match="duration filter"):
            a.list_transactions(duration_ms=10)


def test_find_hanging_end_to_end(fake: FakeCluster) -> None:
    # t-0 open but the coordinator's transaction lacks it: hanging; t-1 is within tx-a's own (long) timeout
    open_txn(fake, "tx-a", 11, [0, 1], coord_parts=[1], timeout=3 * MAX)
    open_txn(fake, "tx-young", 13, [1], start_offset=3, last=NOW - 10, start=NOW - 10, timeout=10 * MAX)
    fake.producers[("t", 0)].append({"producer_id": 99, "producer_epoch": 0, "last_sequence": 0,
                                     "last_timestamp": NOW - 5 * MAX, "coordinator_epoch": 1,
                                     "current_txn_start_offset": 7})  # no transactional id at all
    with admin() as a:
        got = a.find_hanging("t", max_transaction_timeout_ms=MAX)
        assert [(h.partition, h.producer.producer_id, h.reason) for h in got] == [
            (0, 11, "partition-not-in-transaction"), (0, 99, "no-transactional-id")]
        assert a.find_hanging(None, max_transaction_timeout_ms=MAX) == got
        assert [h.producer.producer_id for h in a.find_hanging("t", 0, MAX, margin_ms=3 * MAX)] == [99]
        assert a.find_hanging("t", 1, MAX) == []  # t-1's coordinator still owns tx-a's partition
        assert [h.reason for h in a.find_hanging("t", 1, MAX, margin_ms=0)] == []
    # once tx-a outlives its own timeout while Ongoing, the coordinator is overdue: t-1 is hanging too
    with admin(lambda: NOW + MAX + 1) as a:
        assert [(h.partition, h.reason) for h in a.find_hanging("t", 1, MAX)] == [(1, "coordinator-overdue")]
    with admin() as a:
        with pytest.raises(KafkaError, match="UNKNOWN_TOPIC_OR_PARTITION"):
            a.find_hanging("nope")
        with pytest.raises(KafkaError, match="t-5: UNKNOWN_TOPIC_OR_PARTITION"):
            a.find_hanging("t", 5)


def test_abort_by_start_offset_goes_to_the_leader(fake: FakeCluster) -> None:
    open_txn(fake, "tx-a", 11, [0, 1], start_offset=4)
    with admin() as a:
        spec = a.abort_spec("t", 1, 4)
        assert spec == AbortSpec("t", 1, 11, 2, 0)
        a.abort_transaction(spec)
        marker = [r for n, k, v, r in fake.requests if k == 27]
        assert len(marker) == 1 and marker[0].markers[0].transaction_result is False
        assert marker[0].markers[0].transaction_version == 0
        assert fake.producers[("t", 1)][0]["current_txn_start_offset"] == -1
        assert fake.producers[("t", 0)][0]["current_txn_start_offset"] == 4
        with pytest.raises(TxnAdminError, match="offset 4 on partition t-1"):
            a.abort_spec("t", 1, 4)
        fake.marker_error = E.transaction_coordinator_fenced
        with pytest.raises(KafkaError, match="TRANSACTION_COORDINATOR_FENCED"):
            a.abort_transaction(AbortSpec("t", 0, 11, 2, 0))


# -- the CLI over the fake cluster -------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["txns", *argv, "--bootstrap", "boot:9"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli(fake: FakeCluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: NOW / 1000)
    open_txn(fake, "tx-[a]", 11, [0, 1], coord_parts=[1], timeout=3 * MAX)
    code, out, _ = run(capsys, "list")
    assert code == 0 and "tx-[a]" in out and "Ongoing" in out and "TransactionalId" in out
    code, out, _ = run(capsys, "list", "--state", "Ongoing", "--producer-id", "11", "--duration-ms", "5", "--json")
    assert code == 0 and json.loads(out) == [{"transactional_id": "tx-[a]", "producer_id": 11, "state": "Ongoing",
                                              "coordinator": 2}]
    code, out, _ = run(capsys, "describe", "tx-[a]", "--json")
    assert code == 0
    assert json.loads(out) == [{"transactional_id": "tx-[a]", "coordinator_id": 2, "state": "Ongoing",
                                "producer_id": 11, "producer_epoch": 2, "timeout_ms": 3 * MAX,
                                "start_time_ms": NOW - 2 * MAX, "partitions": [{"topic": "t", "partition": 1}],
                                "error": None, "duration_ms": 2 * MAX}]
    code, out, err = run(capsys, "describe", "tx-[a]", "missing")
    assert code == 1 and "t-1" in out and "missing" in err and "TRANSACTIONAL_ID_NOT_FOUND" in err
    code, out, _ = run(capsys, "find-hanging", "--topic", "t", "--max-transaction-timeout-ms", str(MAX), "--json")
    assert code == 0
    assert json.loads(out) == [{"topic": "t", "partition": 0, "producer_id": 11, "producer_epoch": 2,
                                "coordinator_epoch": -1, "start_offset": 0, "last_timestamp": NOW - 2 * MAX,
                                "duration_ms": 2 * MAX, "transactional_id": "tx-[a]",
                                "reason": "partition-not-in-transaction"}]
    code, out, _ = run(capsys, "find-hanging", "--max-transaction-timeout-ms", str(MAX))
    assert code == 0 and "partition-not-in-transaction" in out
    code, _, err = run(capsys, "find-hanging", "--partition", "0")
    assert code == 1 and "--partition needs --topic" in err
    code, _, err = run(capsys, "abort", "--topic", "t", "--partition", "0")
    assert code == 1 and "--start-offset" in err
    code, _, err = run(capsys, "abort", "--topic", "t", "--partition", "0", "--start-offset", "0",
                       "--producer-id", "11")
    assert code == 1 and "either" in err
    code, _, err = run(capsys, "abort", "--topic", "t", "--partition", "0", "--start-offset", "9")
    assert code == 1 and "offset 9" in err
    code, out, _ = run(capsys, "abort", "--topic", "t", "--partition", "0", "--start-offset", "0", "--json")
    assert code == 0 and json.loads(out) == {"topic": "t", "partition": 0, "producer_id": 11, "producer_epoch": 2,
                                             "coordinator_epoch": 0, "aborted": True}
    code, out, _ = run(capsys, "abort", "--topic", "t", "--partition", "1", "--producer-id", "11",
                       "--producer-epoch", "2", "--coordinator-epoch", "-1")
    assert code == 0 and "aborted the transaction of producer 11" in out
    assert fake.requests[-1][3].markers[0].coordinator_epoch == 0
    code, out, _ = run(capsys, "find-hanging", "--topic", "t", "--json")
    assert code == 0 and json.loads(out) == []


def test_cli_connection_refused_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    from oncelog.testing import free_port

    code = cli.main(["txns", "list", "--bootstrap", f"127.0.0.1:{free_port()}"])
    assert code == 1 and capsys.readouterr().err.startswith("error: ")
