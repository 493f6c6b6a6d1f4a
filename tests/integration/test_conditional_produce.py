"""Conditional produce (KIP-27, issue 13), over the wire against a real broker.

Produce v9+ requests are encoded by hand here, with oncelog's tagged field
10000 (the expected offset of the partition's batch) in a partition's tag
block (``protocol.conditional.partition_tag_block``); responses are decoded
with kio and the codec's unknown-tag sink, which yields the actual next
offset a refused partition carries in the same tag.

Covered: the ApiVersions feature; a match appends at the expected offsets;
one mismatch in a multi-partition request appends nothing anywhere (log end
offsets and a fetch), with ONCELOG_OFFSET_MISMATCH and the actual next offset
for the mismatched partition and ONCELOG_CONDITIONAL_PRODUCE_REFUSED for the
others; two competing "leaders" with the same expected offset, exactly one
wins each round; idempotent retries of applied conditional batches (responses
dropped by the fault proxy) are answered with their original offsets, never
refused; a request mixing such a duplicate and a mismatch; open transactions'
records count towards the expected offset (it is the log end offset); acks=0
is refused by closing the connection; malformed tags and a partition named
twice get INVALID_REQUEST and append nothing; a tag whose declared size runs
past the request closes only that connection.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.client.connection import Connection
from oncelog.protocol.codec import decode_response, unknown_tags_of
from oncelog.protocol.conditional import (
    EXPECTED_OFFSET_TAG,
    FEATURE_NAME,
    NEXT_OFFSET_TAG,
    feature_supported,
    parse_offset_tag,
    partition_tag_block,
)
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.fast_produce import array_len, string, uvarint
from oncelog.protocol.headers import skip_tagged_fields
from oncelog.protocol.records import Record, encode_record_batch, iter_batch_headers, iter_records
from oncelog.testing import EmbeddedBroker, free_port
from oncelog.testing.fault_proxy import FaultProxy

pytestmark = pytest.mark.timeout(180)

PRODUCE, FETCH, API_VERSIONS, CREATE_TOPICS, INIT_PID, ADD_PARTITIONS, END_TXN = 0, 1, 18, 19, 22, 24, 26
MISMATCH, REFUSED = 10_001, 10_002


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: Any) -> Iterator[EmbeddedBroker]:
    d = tmp_path_factory.mktemp("condpub")
    b = EmbeddedBroker(data_dir=d / "data", log_path=d / "broker.log")
    b.start()
    try:
        yield b
    finally:
        b.close()


_topics = iter(range(10_000))


def create_topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"cond-{next(_topics)}"
    with Connection(bootstrap) as c:
        r = c.request(CREATE_TOPICS, 5, {"topics": [{"name": name, "num_partitions": partitions,
                                                     "replication_factor": 1, "assignments": [], "configs": []}],
                                         "timeout": 10000, "validate_only": False})
        assert r.topics[0].error_code == 0, r.topics[0]
    return name


@pytest.fixture
def topic(broker: EmbeddedBroker) -> str:
    return create_topic(broker.bootstrap)


@pytest.fixture
def conn(broker: EmbeddedBroker) -> Iterator[Connection]:
    with Connection(broker.bootstrap, client_id="condpub") as c:
        yield c


# -- the conditional Produce request, by hand ---------------------------------------------------


def batch(values: list[bytes], pid: int = -1, epoch: int = -1, seq: int = -1, transactional: bool = False) -> bytes:
    return encode_record_batch([Record(key=None, value=v) for v in values], producer_id=pid, producer_epoch=epoch,
                               base_sequence=seq, is_transactional=transactional)


def produce_body(parts: list[tuple[str, int, bytes, bytes | None]], acks: int = -1,
                 txn_id: str | None = None, version: int = 9) -> bytes:
    """Produce v9+ body; ``parts`` = (topic, partition, records, tag block or None) in order,
    consecutive entries of one topic grouped under it (a partition may be repeated)."""
    assert version >= 9
    grouped: list[tuple[str, list[tuple[int, bytes, bytes | None]]]] = []
    for t, p, records, tags in parts:
        if not grouped or grouped[-1][0] != t:
            grouped.append((t, []))
        grouped[-1][1].append((p, records, tags))
    out = [string(txn_id, True), struct.pack(">hi", acks, 10_000), array_len(len(grouped), True)]
    for name, ps in grouped:
        out += [string(name, True), array_len(len(ps), True)]
        for index, records, tags in ps:
            out += [struct.pack(">i", index), uvarint(len(records) + 1), records, tags if tags is not None else b"\x00"]
        out.append(b"\x00")
    out.append(b"\x00")
    return b"".join(out)


def cond(expected: int) -> bytes:
    return partition_tag_block(expected)


def send_produce_all(conn: Connection, body: bytes, version: int = 9) -> list[tuple[tuple[str, int], dict[str, Any]]]:
    """Send a raw Produce body; every partition answer in order:
    ((topic, partition), {code, base_offset, message, next_offset})."""
    conn.correlation_id += 1
    client = conn.client_id.encode()
    header = struct.pack(">hhih", PRODUCE, version, conn.correlation_id, len(client)) + client + b"\x00"
    raw = conn.send_raw(header + body)
    (corr,) = struct.unpack_from(">i", raw, 0)
    assert corr == conn.correlation_id
    unknown: dict[int, Any] = {}
    r = decode_response(PRODUCE, version, raw, skip_tagged_fields(raw, 4), unknown)
    out = []
    for t in r.responses:
        for pr in t.partition_responses:
            tags = unknown_tags_of(unknown, pr)
            nxt = parse_offset_tag(tags[NEXT_OFFSET_TAG]) if tags and NEXT_OFFSET_TAG in tags else None
            out.append(((t.name, int(pr.index)), {"code": int(pr.error_code), "base_offset": int(pr.base_offset),
                                                   "message": pr.error_message, "next_offset": nxt}))
    return out


def send_produce(conn: Connection, body: bytes, version: int = 9) -> dict[tuple[str, int], dict[str, Any]]:
    """:func:`send_produce_all` by (topic, partition) (each named once in the request)."""
    answers = send_produce_all(conn, body, version)
    out = dict(answers)
    assert len(out) == len(answers), answers
    return out


def fetch_partition(conn: Connection, topic: str, partition: int,
                    committed: bool = False) -> tuple[int, list[bytes], list[int]]:
    """(high watermark, values, base offsets of the data batches) of a fetch from offset 0."""
    r = conn.request(FETCH, 12, {
        "cluster_id": None, "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 22,
        "isolation_level": 1 if committed else 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": 1 << 22}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    (p,) = r.responses[0].partitions
    assert p.error_code == 0, E(p.error_code)
    data = bytes(p.records or b"")
    values: list[bytes] = []
    bases: list[int] = []
    for hdr, start, end in iter_batch_headers(data):
        if hdr.is_control:
            continue
        bases.append(hdr.base_offset)
        values.extend(rec.value for _o, _t, rec in iter_records(data[start:end]))
    return int(p.high_watermark), values, bases


def ends(conn: Connection, topic: str, partitions: int = 3) -> list[int]:
    return [fetch_partition(conn, topic, p)[0] for p in range(partitions)]


def init_idempotent(conn: Connection) -> tuple[int, int]:
    r = conn.request(INIT_PID, 4, {"transactional_id": None, "transaction_timeout": 60_000,
                                   "producer_id": -1, "producer_epoch": -1})
    assert r.error_code == 0
    return int(r.producer_id), int(r.producer_epoch)


# -- feature advertisement ----------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 4])
def test_api_versions_advertise_conditional_produce(conn: Connection, version: int) -> None:
    r = conn.request(API_VERSIONS, version, {"client_software_name": "t", "client_software_version": "1"})
    assert r.error_code == 0
    names = {f.name: (int(f.min_version), int(f.max_version)) for f in r.supported_features}
    assert names[FEATURE_NAME] == (1, 1)
    assert feature_supported(r.supported_features)
    assert "transaction.version" in names  # the existing feature is still there
    produce_range = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in r.api_keys}[PRODUCE]
    assert produce_range[1] >= 9  # the tag needs a flexible Produce version


def test_feature_check_helper() -> None:
    assert not feature_supported(None) and not feature_supported([])
    assert not feature_supported([{"name": FEATURE_NAME, "min_version": 2, "max_version": 3}])
    assert feature_supported([{"name": "x", "min_version": 0, "max_version": 9},
                              {"name": FEATURE_NAME, "min_version": 1, "max_version": 2}])


# -- semantics ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [9, 11, 12])
def test_matching_conditions_append_at_the_expected_offsets(conn: Connection, topic: str, version: int) -> None:
    r = send_produce(conn, produce_body([(topic, 0, batch([b"a0", b"a1", b"a2"]), cond(0)),
                                         (topic, 1, batch([b"b0", b"b1"]), cond(0))], version=version), version)
    assert [(r[(topic, p)]["code"], r[(topic, p)]["base_offset"]) for p in (0, 1)] == [(0, 0), (0, 0)]
    assert r[(topic, 0)]["next_offset"] is None  # the tag is only on refusals
    r = send_produce(conn, produce_body([(topic, 0, batch([b"a3"]), cond(3)),
                                         (topic, 1, batch([b"b2"]), cond(2)),
                                         (topic, 2, batch([b"c0"]), None)], version=version), version)
    assert [(r[(topic, p)]["code"], r[(topic, p)]["base_offset"]) for p in (0, 1, 2)] == [(0, 3), (0, 2), (0, 0)]
    assert ends(conn, topic) == [4, 3, 1]
    assert fetch_partition(conn, topic, 0)[1] == [b"a0", b"a1", b"a2", b"a3"]


def test_minus_one_means_no_condition(conn: Connection, topic: str) -> None:
    send_produce(conn, produce_body([(topic, 0, batch([b"x", b"y"]), None)]))
    minus_one = b"\x01\x90\x4e\x08" + struct.pack(">q", -1)
    r = send_produce(conn, produce_body([(topic, 0, batch([b"z"]), minus_one)]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["base_offset"]) == (0, 2)


def test_one_mismatch_appends_nothing_anywhere(conn: Connection, topic: str) -> None:
    send_produce(conn, produce_body([(topic, 0, batch([b"p0", b"p1", b"p2"]), None)]))
    before = ends(conn, topic)
    assert before == [3, 0, 0]
    r = send_produce(conn, produce_body([(topic, 0, batch([b"late"]), cond(2)),  # stale: next is 3
                                         (topic, 1, batch([b"ok"]), cond(0)),  # holds
                                         (topic, 2, batch([b"plain"]), None)]))  # unconditional
    m, ok, plain = r[(topic, 0)], r[(topic, 1)], r[(topic, 2)]
    assert (m["code"], m["base_offset"], m["next_offset"]) == (MISMATCH, -1, 3)
    assert "expected offset 2" in m["message"] and "is 3" in m["message"], m["message"]
    assert (ok["code"], ok["base_offset"], ok["next_offset"]) == (REFUSED, -1, 0)
    assert f"{topic}-0" in ok["message"], ok["message"]
    assert (plain["code"], plain["next_offset"]) == (REFUSED, 0)
    assert ends(conn, topic) == before
    assert [fetch_partition(conn, topic, p)[1] for p in range(3)] == [[b"p0", b"p1", b"p2"], [], []]
    # and the actual offset is the one to use next
    r = send_produce(conn, produce_body([(topic, 0, batch([b"p3"]), cond(m["next_offset"])),
                                         (topic, 1, batch([b"ok"]), cond(0))]))
    assert [r[(topic, p)]["base_offset"] for p in (0, 1)] == [3, 0]


def test_two_competing_leaders_exactly_one_wins(broker: EmbeddedBroker, topic: str) -> None:
    """Two writers that both believe they lead partition 0 append with the same
    expected offset at the same moment, 40 rounds: one wins each round, the
    loser learns the winner's end, and the log is the winners' batches, whole
    and in order. Without the condition both would be appended."""
    rounds = 40
    conns = [Connection(broker.bootstrap, client_id=f"leader-{i}") for i in range(2)]
    results: list[list[dict[str, Any]]] = [[], []]
    barrier = threading.Barrier(2)
    next_offset = [0]

    def leader(i: int) -> None:
        for rnd in range(rounds):
            expected = next_offset[0]
            body = produce_body([(topic, 0, batch([b"L%d-r%d-%d" % (i, rnd, k) for k in range(3)]), cond(expected))])
            barrier.wait(timeout=30)
            results[i].append(send_produce(conns[i], body)[(topic, 0)] | {"expected": expected})
            barrier.wait(timeout=30)
            if i == 0:
                next_offset[0] += 3  # exactly one batch of 3 went in (checked below)
            barrier.wait(timeout=30)

    threads = [threading.Thread(target=leader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for c in conns:
        c.close()
    winners = []
    for rnd in range(rounds):
        a, b = results[0][rnd], results[1][rnd]
        codes = sorted([a["code"], b["code"]])
        assert codes == [0, MISMATCH], (rnd, a, b)
        win, lose = (0, b) if a["code"] == 0 else (1, a)
        assert lose["next_offset"] == lose["expected"] + 3
        assert (a if win == 0 else b)["base_offset"] == rnd * 3 == lose["expected"]
        winners.append(win)
    with Connection(broker.bootstrap) as c:
        hw, values, bases = fetch_partition(c, topic, 0)
    assert hw == rounds * 3 and bases == [3 * r for r in range(rounds)]
    assert values == [b"L%d-r%d-%d" % (winners[r], r, k) for r in range(rounds) for k in range(3)]


# -- idempotence -----------------------------------------------------------------------------------


def test_retry_of_an_appended_conditional_batch_gets_its_original_offset(broker: EmbeddedBroker) -> None:
    """A LogWriter-style loop (one request in flight, next expected offset
    tracked) whose Produce responses the fault proxy drops a third of the time
    after the broker applied them: the client retries the same bytes on a new
    connection. Every batch must be acknowledged at its expected offset, none
    refused (a retry is a duplicate by sequence, answered before its now stale
    condition), and the log holds each batch exactly once."""
    topic = create_topic(broker.bootstrap, 1)
    host, port = broker.bootstrap.rsplit(":", 1)
    batches, per = 40, 4
    with Connection(broker.bootstrap) as c:
        pid, epoch = init_idempotent(c)
    with FaultProxy((host, int(port)), seed=13, drop_response_rate=0.35, drop_mode="close") as proxy:
        conn = Connection(proxy.bootstrap, timeout=2.0)
        expected = 0
        retries = 0
        for n in range(batches):
            values = [b"w-%03d-%d" % (n, k) for k in range(per)]
            body = produce_body([(topic, 0, batch(values, pid, epoch, n * per), cond(expected))])
            for _attempt in range(20):
                try:
                    r = send_produce(conn, body)[(topic, 0)]
                    break
                except (ConnectionError, socket.timeout, OSError):
                    retries += 1
                    conn.close()
                    conn = Connection(proxy.bootstrap, timeout=2.0)
            else:
                pytest.fail(f"batch {n} never answered")
            assert r["code"] == 0, (n, r)  # no false refusal
            assert r["base_offset"] == expected, (n, r)
            expected += per
        conn.close()
        assert proxy.stats.dropped_responses >= 5 and retries >= 5, proxy.stats
    with Connection(broker.bootstrap) as c:
        hw, values, _ = fetch_partition(c, topic, 0)
    assert hw == batches * per
    assert values == [b"w-%03d-%d" % (n, k) for n in range(batches) for k in range(per)]


def test_duplicate_and_mismatch_in_one_request(conn: Connection, topic: str) -> None:
    """A retry (duplicate) of partition 0's applied batch next to a mismatching
    partition 1 and a matching partition 2: the duplicate is answered with its
    original offset (it *was* appended), partition 1 with the mismatch,
    partition 2 refused; nothing new is appended."""
    pid, epoch = init_idempotent(conn)
    first = batch([b"d0", b"d1"], pid, epoch, 0)
    r = send_produce(conn, produce_body([(topic, 0, first, cond(0))]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["base_offset"]) == (0, 0)
    send_produce(conn, produce_body([(topic, 1, batch([b"x"]), None)]))
    r = send_produce(conn, produce_body([(topic, 0, first, cond(0)),  # the retry: stale condition, duplicate
                                         (topic, 1, batch([b"y"], pid, epoch, 0), cond(0)),  # next is 1
                                         (topic, 2, batch([b"z"], pid, epoch, 0), cond(0))]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["base_offset"]) == (0, 0)
    assert (r[(topic, 1)]["code"], r[(topic, 1)]["next_offset"]) == (MISMATCH, 1)
    assert (r[(topic, 2)]["code"], r[(topic, 2)]["next_offset"]) == (REFUSED, 0)
    assert ends(conn, topic) == [2, 1, 0]


def test_duplicate_next_to_a_matching_partition_refuses_nothing(conn: Connection, topic: str) -> None:
    """A retry of partition 0's applied batch (its condition now stale) sent
    together with a new batch for partition 1 whose condition holds: the
    duplicate counts as holding (it was appended when it held), so partition 1
    is appended, not refused because of a stale condition on a duplicate."""
    pid, epoch = init_idempotent(conn)
    first = batch([b"d0", b"d1"], pid, epoch, 0)
    r = send_produce(conn, produce_body([(topic, 0, first, cond(0))]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["base_offset"]) == (0, 0)
    r = send_produce(conn, produce_body([(topic, 0, first, cond(0)),
                                         (topic, 1, batch([b"e0"], pid, epoch, 0), cond(0))]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["base_offset"]) == (0, 0), r
    assert (r[(topic, 1)]["code"], r[(topic, 1)]["base_offset"]) == (0, 0), r
    assert ends(conn, topic) == [2, 1, 0]


# -- transactions -------------------------------------------------------------------------------------


def test_open_transaction_records_count(conn: Connection, topic: str) -> None:
    """The expected offset is the log end offset, the offset the batch would
    get: an open transaction's records (above the last stable offset) count,
    and so does its marker once written."""
    txn = f"t-{topic}"
    r = conn.request(INIT_PID, 4, {"transactional_id": txn, "transaction_timeout": 60_000,
                                   "producer_id": -1, "producer_epoch": -1})
    assert r.error_code == 0
    pid, epoch = int(r.producer_id), int(r.producer_epoch)
    r = conn.request(ADD_PARTITIONS, 3, {"v3_and_below_transactional_id": txn, "v3_and_below_producer_id": pid,
                                         "v3_and_below_producer_epoch": epoch,
                                         "v3_and_below_topics": [{"name": topic, "partitions": [0]}]})
    assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
    r = send_produce(conn, produce_body([(topic, 0, batch([b"t0", b"t1", b"t2"], pid, epoch, 0, True), None)],
                                        txn_id=txn))
    assert r[(topic, 0)]["code"] == 0
    # the transaction is open: last stable offset 0, log end offset 3
    committed_hw = fetch_partition(conn, topic, 0, committed=True)
    assert committed_hw[1] == []
    r = send_produce(conn, produce_body([(topic, 0, batch([b"stale"]), cond(0))]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["next_offset"]) == (MISMATCH, 3)
    r = send_produce(conn, produce_body([(topic, 0, batch([b"n3"]), cond(3))]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["base_offset"]) == (0, 3)
    r = conn.request(END_TXN, 3, {"transactional_id": txn, "producer_id": pid, "producer_epoch": epoch,
                                  "committed": True})
    assert r.error_code == 0
    deadline = time.monotonic() + 15
    while ends(conn, topic, 1) != [5]:  # the COMMIT marker takes offset 4
        assert time.monotonic() < deadline, ends(conn, topic, 1)
        time.sleep(0.02)
    r = send_produce(conn, produce_body([(topic, 0, batch([b"n5"]), cond(4))]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["next_offset"]) == (MISMATCH, 5)
    r = send_produce(conn, produce_body([(topic, 0, batch([b"n5"]), cond(5))]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["base_offset"]) == (0, 5)


# -- acks=0 and bad input ------------------------------------------------------------------------------


def test_acks_0_conditional_is_refused_and_closes(broker: EmbeddedBroker, topic: str) -> None:
    with Connection(broker.bootstrap, timeout=10) as c:
        c.correlation_id += 1
        header = struct.pack(">hhih", PRODUCE, 9, c.correlation_id, 1) + b"t" + b"\x00"
        body = produce_body([(topic, 0, batch([b"fire-and-forget"]), cond(0))], acks=0)
        c.sock.sendall(struct.pack(">i", len(header + body)) + header + body)
        with pytest.raises(ConnectionError):
            c.recv_frame()
    with Connection(broker.bootstrap) as c:
        assert ends(c, topic) == [0, 0, 0]  # the condition held, yet nothing was appended


@pytest.mark.parametrize("tags, why", [
    (b"\x01\x90\x4e\x04" + struct.pack(">i", 0), "8 bytes"),  # an int32 where an int64 belongs
    (b"\x01\x90\x4e\x00", "8 bytes"),  # empty value
    (b"\x01\x90\x4e\x09" + struct.pack(">q", 0) + b"\x00", "8 bytes"),  # too long
    (b"\x01\x90\x4e\x08" + struct.pack(">q", -7), "negative"),
    (b"\x02\x90\x4e\x08" + struct.pack(">q", 0) + b"\x90\x4e\x08" + struct.pack(">q", 0), "2 times"),
])
def test_malformed_condition_appends_nothing(broker: EmbeddedBroker, conn: Connection, topic: str,
                                             tags: bytes, why: str) -> None:
    r = send_produce(conn, produce_body([(topic, 0, batch([b"bad"]), tags), (topic, 1, batch([b"good"]), cond(0))]))
    assert r[(topic, 0)]["code"] == E.invalid_request and why in r[(topic, 0)]["message"], r
    assert r[(topic, 1)]["code"] == REFUSED
    assert ends(conn, topic) == [0, 0, 0]
    # the connection and the broker still serve
    r = send_produce(conn, produce_body([(topic, 1, batch([b"good"]), cond(0))]))
    assert r[(topic, 1)]["code"] == 0


def test_partition_named_twice_in_a_conditional_request(conn: Connection, topic: str) -> None:
    body = produce_body([(topic, 0, batch([b"a"]), cond(0)), (topic, 0, batch([b"b"]), cond(1)),
                         (topic, 1, batch([b"c"]), None)])
    answers = send_produce_all(conn, body)
    assert [k for k, _ in answers] == [(topic, 0), (topic, 0), (topic, 1)]
    for _k, a in answers[:2]:
        assert a["code"] == E.invalid_request and "more than once" in a["message"], a
    assert answers[2][1]["code"] == REFUSED
    assert ends(conn, topic) == [0, 0, 0]


def test_tag_running_past_the_request_closes_only_that_connection(broker: EmbeddedBroker, topic: str) -> None:
    with Connection(broker.bootstrap, timeout=10) as c:
        c.correlation_id += 1
        header = struct.pack(">hhih", PRODUCE, 9, c.correlation_id, 1) + b"t" + b"\x00"
        body = produce_body([(topic, 0, batch([b"x"]), b"\x01\x90\x4e\x7f" + b"\x00" * 8)])
        c.sock.sendall(struct.pack(">i", len(header + body)) + header + body)
        with pytest.raises(ConnectionError):
            c.recv_frame()
    with Connection(broker.bootstrap) as c:
        assert ends(c, topic) == [0, 0, 0]
        r = send_produce(c, produce_body([(topic, 0, batch([b"x"]), cond(0))]))
        assert r[(topic, 0)]["code"] == 0


def test_unconditional_requests_unchanged(conn: Connection, topic: str) -> None:
    """Kafka's own unknown tags elsewhere in the request are still skipped and the
    request is appended unconditionally (only tag 10000 on a partition is ours)."""
    other_tag = b"\x01\x05\x02ab"  # an unknown tag 5 on the partition
    r = send_produce(conn, produce_body([(topic, 0, batch([b"x"]), other_tag)]))
    assert (r[(topic, 0)]["code"], r[(topic, 0)]["base_offset"], r[(topic, 0)]["next_offset"]) == (0, 0, None)
    assert EXPECTED_OFFSET_TAG == NEXT_OFFSET_TAG == 10_000


# -- fuzz: random tag blocks on a partition ------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def tag_blocks(draw: Any) -> bytes:
    """A partition tag block with tag 10000 (and maybe others) whose sizes and values are
    arbitrary, sometimes honest, sometimes lying about the size."""
    tags = []
    for _ in range(draw(st.integers(1, 3))):
        tag = draw(st.sampled_from([EXPECTED_OFFSET_TAG, EXPECTED_OFFSET_TAG, 0, 7, 9_999, 10_001]))
        value = draw(st.one_of(st.binary(max_size=12), st.integers(-2**63, 2**63 - 1).map(lambda v: struct.pack(">q", v))))
        size = draw(st.one_of(st.just(len(value)), st.integers(0, 20)))
        tags.append(uvarint(tag) + uvarint(size) + value)
    count = draw(st.one_of(st.just(len(tags)), st.integers(0, 4)))
    return uvarint(count) + b"".join(tags)


@settings(max_examples=60, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tags=tag_blocks())
def test_fuzzed_tag_blocks_get_clean_answers(broker: EmbeddedBroker, topic: str, tags: bytes) -> None:
    """Whatever the tag block, the broker answers the request with Kafka's or
    oncelog's documented codes or closes that connection; a refusal appends
    nothing, a success appends exactly the answered batches, and the broker
    keeps serving."""
    with Connection(broker.bootstrap, timeout=10) as c:
        before = ends(c, topic, 2)
        body = produce_body([(topic, 0, batch([b"f"]), tags), (topic, 1, batch([b"g"]), None)])
        try:
            r = [v for _k, v in send_produce_all(c, body)]
        except ConnectionError:
            r = None
    with Connection(broker.bootstrap, timeout=10) as c:
        after = ends(c, topic, 2)
    if r is None:  # undecodable: closed, nothing appended
        assert after == before
        return
    # a lying size or count shifts the rest of the request: it may decode as other partitions
    codes = {v["code"] for v in r}
    assert codes <= {0, E.invalid_request, MISMATCH, REFUSED, E.corrupt_message, E.invalid_record,
                     E.unknown_topic_or_partition}, r
    grown = sum(after) - sum(before)
    if codes & {MISMATCH, REFUSED}:
        assert grown == 0, r
    else:
        assert grown == sum(1 for v in r if v["code"] == 0), (r, before, after)
