"""SASL re-authentication (KIP-368) against the real broker: ``connections.max.reauth.ms``.

The broker tells the client the session lifetime in SaslAuthenticate (v1+), accepts a SaslHandshake +
SaslAuthenticate on the live connection (same mechanism and principal, at most one start a second) and
closes a connection that uses an expired session for anything else, after answering what came before.
Our client, confluent-kafka (librdkafka >= 1.9) and kafka-python (3.x) re-authenticate before the
session ends. Lifetimes are 1.5-2 s so that every test is bounded: about 35 s for the file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client.aio.connection import BrokerConnection
from oncelog.client.config import parse_config
from oncelog.client.errors import SaslAuthenticationFailedError
from oncelog.client.security import reauthentication_delay
from oncelog.testing import EmbeddedBroker
from tests.integration.sasl_wire import recv_frame as _recv
from tests.integration.sasl_wire import request as _request

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
        + " ".join(f'user_{name}="{pw}"' for name, pw in USERS.items()) + ";")
LIFETIME_MS = 2000  # the SCRAM mechanisms'; PLAIN's is set by the listener-and-mechanism key below
PLAIN_LIFETIME_MS = 1500


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    tmp = tmp_path_factory.mktemp("reauth")
    b = EmbeddedBroker(data_dir=tmp / "data", log_path=tmp / "broker.log", config={
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "group.initial.rebalance.delay.ms": "0",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "connections.max.reauth.ms": "600000",  # the listener-prefixed key wins over the plain one...
        "listener.name.sasl_plaintext.connections.max.reauth.ms": str(LIFETIME_MS),
        # ... and the listener-and-mechanism one over both
        "listener.name.sasl_plaintext.plain.connections.max.reauth.ms": str(PLAIN_LIFETIME_MS)})
    b.start()
    try:
        yield b
    finally:
        b.close()


def _log(b: EmbeddedBroker) -> str:
    return Path(b.log_path).read_text(errors="replace")


# -- raw protocol ------------------------------------------------------------------------------------


def _string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def _handshake(corr: int, mechanism: str = "PLAIN") -> bytes:
    return _request(17, 1, corr, _string(mechanism))


def _plain(corr: int, user: str = "alice", password: str | None = None) -> bytes:
    token = f"\x00{user}\x00{USERS[user] if password is None else password}".encode()
    return _request(36, 1, corr, struct.pack(">i", len(token)) + token)


def _metadata(corr: int) -> bytes:
    return _request(3, 1, corr, struct.pack(">i", -1))


def _auth_answer(resp: bytes | None) -> tuple[int, int, str | None, int]:
    """(correlation id, error code, error message, session_lifetime_ms) of a SaslAuthenticate v1 answer."""
    assert resp is not None, "connection closed instead of a SaslAuthenticate answer"
    corr, code, mlen = struct.unpack_from(">ihh", resp)
    pos = 8 + max(mlen, 0)
    message = resp[8:pos].decode() if mlen >= 0 else None
    (blen,) = struct.unpack_from(">i", resp, pos)
    (lifetime,) = struct.unpack_from(">q", resp, pos + 4 + max(blen, 0))
    return corr, code, message, lifetime


def _head(resp: bytes | None) -> tuple[int, int]:
    assert resp is not None, "connection closed instead of an answer"
    return struct.unpack_from(">ih", resp)  # type: ignore[return-value]


def _login(b: EmbeddedBroker, user: str = "alice") -> socket.socket:
    s = socket.create_connection((b.host, b.port), timeout=10)
    s.sendall(_handshake(1) + _plain(2, user))
    assert _head(_recv(s)) == (1, 0)
    _corr, code, _msg, lifetime = _auth_answer(_recv(s))
    assert (code, lifetime) == (0, PLAIN_LIFETIME_MS)
    return s


def test_session_lifetime_reauthentication_and_expiry_on_the_wire(broker: EmbeddedBroker, tmp_path: Path) -> None:
    """SaslAuthenticate v1 carries the lifetime (0 by default, and then no re-authentication); a
    re-authentication on the live connection is accepted and renews it; a second start within a second is
    ILLEGAL_SASL_STATE (34) on a connection that stays open; requests pipelined before a re-authentication
    are answered in order; once expired, any request but a SaslHandshake closes the connection unanswered,
    while a re-authentication after expiry is accepted."""
    with EmbeddedBroker(data_dir=tmp_path / "d", log_path=tmp_path / "b.log", config={
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS}) as default:
        with socket.create_connection((default.host, default.port), timeout=10) as s:
            s.sendall(_handshake(1) + _plain(2))
            assert _head(_recv(s)) == (1, 0)
            assert _auth_answer(_recv(s)) == (2, 0, None, 0)
            s.sendall(_handshake(3))  # no re-authentication without a lifetime
            assert _head(_recv(s)) == (3, 34)
            s.sendall(_metadata(4))
            assert _head(_recv(s))[0] == 4
    with _login(broker) as s:
        s.sendall(_handshake(3) + _plain(4))  # at once: the first re-authentication may come any time
        assert _head(_recv(s)) == (3, 0)
        assert _auth_answer(_recv(s)) == (4, 0, None, PLAIN_LIFETIME_MS)
        s.sendall(_handshake(5))  # within a second of the previous start: served as any request
        assert _head(_recv(s)) == (5, 34)
        s.sendall(_metadata(6))
        assert _head(_recv(s))[0] == 6
        time.sleep(1.05)
        # requests in flight before the handshake are answered first, in order
        s.sendall(_metadata(7) + _metadata(8) + _handshake(9) + _plain(10) + _metadata(11))
        assert [_head(_recv(s))[0] for _ in range(3)] == [7, 8, 9]
        assert _auth_answer(_recv(s)) == (10, 0, None, PLAIN_LIFETIME_MS)
        assert _head(_recv(s))[0] == 11
        renewed = time.monotonic()
        # the renewed session outlives the first one's end
        time.sleep(max(0.0, renewed + PLAIN_LIFETIME_MS / 1000 - 0.5 - time.monotonic()))
        s.sendall(_metadata(12))
        assert _head(_recv(s))[0] == 12
        # expired: a Metadata request closes the connection without an answer
        time.sleep(max(0.0, renewed + PLAIN_LIFETIME_MS / 1000 + 0.2 - time.monotonic()))
        s.sendall(_metadata(13))
        assert _recv(s) is None
    # a re-authentication after expiry is accepted (Kafka checks the handshake first)
    with _login(broker) as s:
        time.sleep(PLAIN_LIFETIME_MS / 1000 + 0.2)
        s.sendall(_handshake(3) + _plain(4) + _metadata(5))
        assert _head(_recv(s)) == (3, 0)
        assert _auth_answer(_recv(s))[:2] == (4, 0)
        assert _head(_recv(s))[0] == 5
    assert "its SASL session expired" in _log(broker)


def _topic_and_long_poll(b: EmbeddedBroker, wait_ms: int) -> bytes:
    """A new empty topic, and a Fetch v4 of its partition 0 that waits ``wait_ms`` for data."""
    conf = {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "alice", "sasl.password": USERS["alice"]}
    topic = f"lp-{uuid.uuid4().hex[:6]}"
    admin = Admin(conf)
    try:
        admin.create_topics([NewTopic(topic, 1)])
    finally:
        admin.close()
    # replica -1, max_wait, min_bytes 1, max_bytes, isolation 0, [topic [partition 0 at offset 0]]
    return struct.pack(">iiiib", -1, wait_ms, 1, 1 << 20, 0) + struct.pack(">i", 1) + _string(topic) \
        + struct.pack(">iiqi", 1, 0, 0, 1 << 20)


def test_requests_before_an_expired_request_are_answered(broker: EmbeddedBroker) -> None:
    """Requests received before the session expired are answered, a long poll still waiting included; the
    first one after it closes the connection once they are (nothing after it is served)."""
    fetch = _topic_and_long_poll(broker, 1500)
    with _login(broker) as s:
        logged_in = time.monotonic()
        s.sendall(_metadata(3) + _metadata(4))
        assert [_head(_recv(s))[0] for _ in range(2)] == [3, 4]
        time.sleep(max(0.0, logged_in + PLAIN_LIFETIME_MS / 1000 - 0.7 - time.monotonic()))
        s.sendall(_request(1, 4, 5, fetch))  # waits until about 0.8 s after the session's end
        time.sleep(max(0.0, logged_in + PLAIN_LIFETIME_MS / 1000 + 0.2 - time.monotonic()))
        s.sendall(_metadata(6) + _metadata(7))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">i", resp)[0] == 5
        assert _recv(s) is None


def test_changed_principal_or_mechanism_is_refused(broker: EmbeddedBroker) -> None:
    # another user's good credentials: SASL_AUTHENTICATION_FAILED (58) with Kafka's message, then closed
    with _login(broker, "alice") as s:
        s.sendall(_handshake(3) + _plain(4, "bob"))
        assert _head(_recv(s)) == (3, 0)
        corr, code, message, lifetime = _auth_answer(_recv(s))
        assert (corr, code, lifetime) == (4, 58, 0)
        assert message == "Cannot change principals during re-authentication from User.alice: User.bob"
        assert _recv(s) is None
    # another mechanism: the handshake is answered NONE, its first token closes the connection unanswered
    with _login(broker, "alice") as s:
        s.sendall(_handshake(3, "SCRAM-SHA-256"))
        assert _head(_recv(s)) == (3, 0)
        s.sendall(_request(36, 1, 4, struct.pack(">i", 3) + b"n,,"))
        assert _recv(s) is None
    # a wrong password on re-authentication: refused as at login
    with _login(broker, "alice") as s:
        s.sendall(_handshake(3) + _plain(4, "alice", "wrong"))
        assert _head(_recv(s)) == (3, 0)
        assert _auth_answer(_recv(s))[:2] == (4, 58)
        assert _recv(s) is None


def test_a_long_poll_in_flight_is_answered_before_the_reauthentication(broker: EmbeddedBroker) -> None:
    fetch = _topic_and_long_poll(broker, 800)
    with _login(broker) as s:
        started = time.monotonic()
        s.sendall(_request(1, 4, 3, fetch) + _handshake(4) + _plain(5))
        resp = _recv(s)  # the Fetch, after its wait
        assert resp is not None and struct.unpack_from(">i", resp)[0] == 3
        assert time.monotonic() - started > 0.7
        assert _head(_recv(s)) == (4, 0)
        assert _auth_answer(_recv(s)) == (5, 0, None, PLAIN_LIFETIME_MS)


# -- our client ------------------------------------------------------------------------------------------


def test_reauthentication_point_is_85_to_95_percent_of_the_lifetime() -> None:
    assert reauthentication_delay(10_000, 0.0) == pytest.approx(8.5)
    assert reauthentication_delay(10_000, 1.0) == pytest.approx(9.5)
    assert all(8.5 <= reauthentication_delay(10_000) <= 9.5 for _ in range(200))


def _conf(b: EmbeddedBroker, mechanism: str, user: str = "alice") -> dict[str, Any]:
    return {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": USERS[user]}


def test_oncelog_producer_and_consumer_across_reauthentications(broker: EmbeddedBroker) -> None:
    """Records produced and consumed without a pause for about four session lifetimes: every connection
    re-authenticates (the broker logs each) and none is closed for expiry; every record arrives exactly once
    and in order per partition. Costs about 9 s."""
    conf = _conf(broker, "SCRAM-SHA-256")
    topic = f"reauth-{uuid.uuid4().hex[:6]}"
    admin = Admin(conf)
    try:
        admin.create_topics([NewTopic(topic, 3)])
    finally:
        admin.close()
    before = _log(broker)
    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True})
    consumer = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest",
                         "fetch.max.wait.ms": 300})
    got: dict[int, list[int]] = {}
    stop = threading.Event()

    def consume() -> None:
        consumer.subscribe([topic])
        while not stop.is_set():
            m = consumer.poll(0.2)
            if m is not None:
                got.setdefault(m.partition, []).append(int(m.value))

    reader = threading.Thread(target=consume)
    reader.start()
    sent: dict[int, list[int]] = {}
    futures = []
    try:
        started = time.monotonic()
        i = 0
        while time.monotonic() - started < 4 * LIFETIME_MS / 1000:
            futures.append((i, producer.produce(topic, str(i).encode(), key=str(i % 7).encode())))
            i += 1
            time.sleep(0.005)
        assert producer.flush(20) == 0
        for n, fut in futures:
            sent.setdefault(fut.result(0).partition, []).append(n)
        deadline = time.monotonic() + 20
        while sum(map(len, got.values())) < i and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join(10)
        producer.close()
        consumer.close()
    assert got == sent, "records lost, duplicated or out of order"
    log = _log(broker)[len(before):]
    assert log.count("re-authenticated as User:alice with SCRAM-SHA-256") >= 6, log[-3000:]
    assert "session expired" not in log


def test_in_flight_and_held_requests_keep_their_order(broker: EmbeddedBroker) -> None:
    """Our connection re-authenticates while a long-poll Fetch is in flight: the Fetch is answered first,
    the requests sent during the re-authentication are held and then answered in the order sent, with
    increasing correlation ids."""
    topic = f"io-{uuid.uuid4().hex[:6]}"
    admin = Admin(_conf(broker, "PLAIN"))
    try:
        admin.create_topics([NewTopic(topic, 1)])
    finally:
        admin.close()
    fetch = {"replica_id": -1, "max_wait": 1500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
             "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                         "partition_max_bytes": 1 << 20}]}]}

    async def main() -> list[str]:
        conn = BrokerConnection(broker.host, broker.port, security=parse_config(_conf(broker, "SCRAM-SHA-256"),
                                                                                "consumer").security)
        await conn.connect()
        logged_in = time.monotonic()
        done: list[str] = []
        try:
            await asyncio.sleep(1.2)
            long_poll = conn.send(1, 4, fetch)
            long_poll.add_done_callback(lambda _f: done.append("fetch"))
            await asyncio.sleep(max(0.0, logged_in + 0.96 * LIFETIME_MS / 1000 - time.monotonic()))
            assert not long_poll.done()
            first_corr = conn._corr
            futs = []
            for n in range(5):
                futs.append(conn.send(3, 1, {"topics": None}))
                futs[-1].add_done_callback(lambda _f, n=n: done.append(f"metadata {n}"))
            assert conn.in_flight == 6  # the Fetch and the five held requests
            results = await asyncio.gather(long_poll, *futs)
            assert all(r.brokers for r in results[1:])
            # handshake and two SCRAM rounds, then the five held requests
            assert conn._corr == first_corr + 3 + 5
        finally:
            conn.close()
        return done

    before = _log(broker)
    assert asyncio.run(main()) == ["fetch"] + [f"metadata {n}" for n in range(5)]
    log = _log(broker)[len(before):]
    assert "re-authenticated as User:alice with SCRAM-SHA-256" in log and "session expired" not in log


def test_changed_credentials_on_reauthentication_are_the_typed_auth_error(broker: EmbeddedBroker) -> None:
    """A connection whose re-authentication is refused (another principal, then a wrong password) fails the
    request that was waiting for it with SaslAuthenticationFailedError and is closed, as a refused login."""
    async def main() -> None:
        sec = parse_config(_conf(broker, "SCRAM-SHA-512"), "admin").security
        for other, match in ((dataclasses.replace(sec, sasl_username="bob", sasl_password=USERS["bob"]),
                              "Cannot change principals during re-authentication from User.alice: User.bob"),
                             (dataclasses.replace(sec, sasl_password="wrong"), "Authentication failed")):
            conn = BrokerConnection(broker.host, broker.port, security=sec)
            await conn.connect()
            try:
                await conn.request(3, 1, {"topics": None})
                conn.security = other
                await asyncio.sleep(0.95 * LIFETIME_MS / 1000)
                with pytest.raises(SaslAuthenticationFailedError, match=match):
                    await conn.request(3, 1, {"topics": None})
                assert conn.closed
            finally:
                conn.close()

    asyncio.run(main())


def test_blocking_connection_reauthenticates(broker: EmbeddedBroker) -> None:
    """The blocking connection behind verify and the Spark source: a request after the session's end logs
    in again first instead of being closed."""
    from oncelog.client.connection import Connection

    sec = parse_config(_conf(broker, "SCRAM-SHA-256"), "consumer").security
    before = _log(broker)
    with Connection(broker.bootstrap, security=sec) as conn:
        conn.negotiate()
        for _ in range(2):
            time.sleep(1.05 * LIFETIME_MS / 1000)
            assert conn.request(3, 1, {"topics": None}).brokers
    log = _log(broker)[len(before):]
    assert log.count("re-authenticated as User:alice with SCRAM-SHA-256") == 2, log
    assert "session expired" not in log


# -- other clients ---------------------------------------------------------------------------------------


def _pump_through_lifetimes(produce: Any, poll: Any, flush: Any, lifetimes: float) -> tuple[list[int], list[int]]:
    sent: list[int] = []
    got: list[int] = []
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < lifetimes * LIFETIME_MS / 1000:
        produce(i)
        sent.append(i)
        i += 1
        got.extend(poll(0.05))
    flush()
    deadline = time.monotonic() + 20
    while len(got) < len(sent) and time.monotonic() < deadline:
        got.extend(poll(0.2))
    return sent, got


def test_confluent_kafka_reauthenticates(broker: EmbeddedBroker) -> None:
    """librdkafka (>= 1.9) re-authenticates before the session ends: its producer and consumer run for about
    three lifetimes without a connection closed for expiry, and every record is consumed once, in order.
    Costs about 8 s."""
    from confluent_kafka import Consumer as CConsumer
    from confluent_kafka import Producer as CProducer

    conf = {**_conf(broker, "SCRAM-SHA-512"), "sasl.mechanisms": "SCRAM-SHA-512"}
    del conf["sasl.mechanism"]
    topic = f"rk-{uuid.uuid4().hex[:6]}"
    before = _log(broker)
    p = CProducer({**conf, "linger.ms": 5})
    c = CConsumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest",
                   "topic.metadata.refresh.interval.ms": 500})
    p.produce(topic, b"-1")  # creates the topic
    assert p.flush(20) == 0
    c.subscribe([topic])

    def poll(timeout: float) -> list[int]:
        m = c.poll(timeout)
        return [] if m is None or m.error() is not None or m.value() == b"-1" else [int(m.value())]

    try:
        sent, got = _pump_through_lifetimes(lambda i: (p.produce(topic, str(i).encode()), p.poll(0)), poll,
                                            lambda: p.flush(20), 3)
    finally:
        c.close()
    assert got == sent
    log = _log(broker)[len(before):]
    assert log.count("re-authenticated as User:alice with SCRAM-SHA-512") >= 2, log[-3000:]
    assert "session expired" not in log


def test_kafka_python_reauthenticates(broker: EmbeddedBroker) -> None:
    """kafka-python (3.x, KIP-368 support) re-authenticates too. Costs about 8 s."""
    from kafka import KafkaConsumer, KafkaProducer

    conf = {"bootstrap_servers": broker.bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "alice",
            "sasl_plain_password": USERS["alice"]}
    topic = f"kp-{uuid.uuid4().hex[:6]}"
    admin = Admin(_conf(broker, "PLAIN"))
    try:
        admin.create_topics([NewTopic(topic, 1)])
    finally:
        admin.close()
    before = _log(broker)
    p = KafkaProducer(**conf, linger_ms=5)
    c = KafkaConsumer(topic, **conf, group_id=f"g-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest")

    def poll(timeout: float) -> list[int]:
        out: list[int] = []
        for records in c.poll(timeout_ms=int(timeout * 1000)).values():
            out.extend(int(r.value) for r in records)
        return out

    try:
        sent, got = _pump_through_lifetimes(lambda i: p.send(topic, str(i).encode()), poll, lambda: p.flush(20), 3)
    finally:
        p.close()
        c.close()
    assert got == sent
    log = _log(broker)[len(before):]
    assert log.count("re-authenticated as User:alice with SCRAM-SHA-256") >= 2, log[-3000:]
    assert "session expired" not in log
