"""SASL/OAUTHBEARER (KIP-255) against the real broker: Kafka's default unsecured validator on the listener;
confluent-kafka (librdkafka's unsecured JWT builder and oauth_cb), kafka-python and aiokafka (their token
providers) and our client (blocking and asyncio; oauth_cb and the unsecured builder) produce and consume,
every record counted; short-lived tokens re-authenticate (KIP-368: the token's expiry bounds the session)
with fresh tokens; refused tokens are SASL_AUTHENTICATION_FAILED with RFC 7628's JSON error while the
broker keeps serving others. About 15 s for the file (two brokers; the re-authentication tests run several
2-second token lifetimes)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from oncelog.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client import aio
from oncelog.client.config import ConfigError
from oncelog.client.errors import SaslAuthenticationFailedError
from oncelog.protocol.oauthbearer import client_initial_response, unsecured_jws
from oncelog.testing import EmbeddedBroker
from tests.integration.sasl_wire import confluent_roundtrip
from tests.integration.sasl_wire import recv_frame as _recv
from tests.integration.sasl_wire import request as _request

MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'
LIFE_S = 2  # short-lived tokens: the session ends with the token
REAUTH_MS = 1500


def _start(tmp: Path, name: str, config: dict[str, str]) -> EmbeddedBroker:
    b = EmbeddedBroker(data_dir=tmp / name, log_path=tmp / f"{name}.log", config={
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "group.initial.rebalance.delay.ms": "0", **config})
    b.start()
    return b


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, EmbeddedBroker]]:
    tmp = tmp_path_factory.mktemp("oauth")
    made: dict[str, EmbeddedBroker] = {}
    try:
        made["oauth"] = _start(tmp, "oauth", {
            "sasl.enabled.mechanisms": "OAUTHBEARER,PLAIN",
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": f"{MODULE} required;",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS})
        made["scoped"] = _start(tmp, "scoped", {
            "sasl.enabled.mechanisms": "OAUTHBEARER",
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config":
                f'{MODULE} required unsecuredValidatorRequiredScope="produce" '
                'unsecuredValidatorPrincipalClaimName="client_id";',
            # here the broker's session lifetime is shorter than the tokens'
            "listener.name.sasl_plaintext.oauthbearer.connections.max.reauth.ms": str(REAUTH_MS)})
        yield made
    finally:
        for b in made.values():
            b.close()


def _log(b: EmbeddedBroker) -> str:
    return Path(b.log_path).read_text(errors="replace")


def test_startup_warns_about_unsecured_oauthbearer_beside_plain(brokers: dict[str, EmbeddedBroker]) -> None:
    warning = "enables OAUTHBEARER with the unsecured validator beside PLAIN: any client can mint an unsigned token"
    assert any("WARNING" in line and warning in line for line in _log(brokers["oauth"]).splitlines())
    assert "unsecured validator beside" not in _log(brokers["scoped"])  # OAUTHBEARER alone


def _base(b: EmbeddedBroker) -> dict[str, Any]:
    return {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}


def _unsecure(b: EmbeddedBroker, config: str = "principal=alice") -> dict[str, Any]:
    return {**_base(b), "enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": config}


def _jwt(life: float = 60.0, principal: str = "alice", **claims: Any) -> tuple[str, float]:
    now = int(time.time() * 1000) / 1000
    return unsecured_jws({"sub": principal, "iat": now, "exp": now + life, **claims}), now + life


def _topic(b: EmbeddedBroker, prefix: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    with Admin({"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": "alice", "sasl.password": "alice-secret"}) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    return topic


# -- third-party clients ----------------------------------------------------------------------------------


def test_confluent_unsecured_jwt_and_oauth_cb(brokers: dict[str, EmbeddedBroker]) -> None:
    b = brokers["oauth"]
    n = 50
    topic = _topic(b, "cf")
    before = _log(b)
    got = confluent_roundtrip(_unsecure(b, "principal=alice scope=produce,consume extension_traceId=t1"), topic, n)
    assert got == [f"c{i}".encode() for i in range(n)]
    calls: list[str | None] = []

    def oauth_cb(config: str | None) -> tuple[str, float]:
        calls.append(config)
        return _jwt(principal="carol")

    topic2 = _topic(b, "cf-cb")
    got = confluent_roundtrip({**_base(b), "oauth_cb": oauth_cb, "sasl.oauthbearer.config": "anything"}, topic2, n)
    assert got == [f"c{i}".encode() for i in range(n)]
    assert calls and set(calls) == {"anything"}
    log = _log(b)[len(before):]
    assert "authenticated as User:alice with OAUTHBEARER" in log
    assert "authenticated as User:carol with OAUTHBEARER" in log


def test_kafka_python_and_aiokafka_token_providers(brokers: dict[str, EmbeddedBroker]) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as ATP
    from aiokafka.abc import AbstractTokenProvider as AioTokenProvider
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP
    from kafka.net.sasl.oauth import AbstractTokenProvider as KpTokenProvider

    b = brokers["oauth"]
    n = 30

    class KpTokens(KpTokenProvider):
        def token(self) -> str:
            return _jwt(principal="kp")[0]

        def extensions(self) -> dict[str, str]:
            return {"traceId": "kp1"}

    topic = _topic(b, "kp")
    common = dict(bootstrap_servers=b.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                  sasl_oauth_token_provider=KpTokens(), request_timeout_ms=10000)
    p = KafkaProducer(**common)
    try:
        for i in range(n):
            p.send(topic, f"k{i}".encode())
        p.flush(15)
    finally:
        p.close(timeout=5)
    c = KafkaConsumer(**common, enable_auto_commit=False, consumer_timeout_ms=8000)
    try:
        c.assign([KTP(topic, 0)])
        c.seek_to_beginning()
        got = [m.value for _, m in zip(range(n), c)]
    finally:
        c.close()
    assert got == [f"k{i}".encode() for i in range(n)]

    class AioTokens(AioTokenProvider):
        async def token(self) -> str:
            return _jwt(principal="aio")[0]

    topic2 = _topic(b, "aio")

    async def main() -> list[bytes]:
        common2 = dict(bootstrap_servers=b.bootstrap, security_protocol="SASL_PLAINTEXT",
                       sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=AioTokens())
        prod = AIOKafkaProducer(**common2)
        await prod.start()
        try:
            for i in range(n):
                await prod.send_and_wait(topic2, f"a{i}".encode())
        finally:
            await prod.stop()
        cons = AIOKafkaConsumer(**common2, enable_auto_commit=False, auto_offset_reset="earliest")
        await cons.start()
        try:
            cons.assign([ATP(topic2, 0)])
            await cons.seek_to_beginning()
            out: list[bytes] = []
            async with asyncio.timeout(15):
                while len(out) < n:
                    out.append((await cons.getone()).value)
            return out
        finally:
            await cons.stop()

    assert asyncio.run(main()) == [f"a{i}".encode() for i in range(n)]
    log = _log(b)
    assert "authenticated as User:kp with OAUTHBEARER" in log and "authenticated as User:aio with OAUTHBEARER" in log


# -- our client -----------------------------------------------------------------------------------------


def _oncelog_roundtrip(conf: dict[str, Any], topic: str, n: int) -> list[bytes]:
    with Producer(conf) as p:
        for i in range(n):
            p.produce(topic, f"o{i}".encode())
        assert p.flush(20) == 0
    c = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, -2)])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                got.append(m.value)
        return got
    finally:
        c.close()


def test_oncelog_blocking_and_asyncio_with_both_token_sources(brokers: dict[str, EmbeddedBroker]) -> None:
    b = brokers["oauth"]
    n = 40
    calls: list[str | None] = []

    def oauth_cb(config: str | None) -> tuple[str, float, str, dict[str, str]]:
        calls.append(config)
        token, expiry = _jwt(principal="dave")
        return token, expiry, "dave", {"traceId": "x"}

    topic = _topic(b, "ob")
    before = _log(b)
    assert _oncelog_roundtrip({**_base(b), "oauth_cb": oauth_cb}, topic, n) == [f"o{i}".encode() for i in range(n)]
    assert calls and set(calls) == {None}
    # its own topic: in the first one the records read back would be dave's (and flush() is 0 when all failed)
    assert _oncelog_roundtrip(_unsecure(b, "principal=erin"), _topic(b, "ob2"), n) == [f"o{i}".encode()
                                                                                       for i in range(n)]

    async def cb(config: str | None) -> tuple[str, float]:
        await asyncio.sleep(0)
        return _jwt(principal="frank")

    async def main(conf: dict[str, Any], topic: str) -> list[bytes]:
        async with aio.Producer(conf) as p:
            futs = [p.produce(topic, f"a{i}".encode()) for i in range(n)]
            await p.flush(20)
            assert all(f.result().offset >= 0 for f in futs)
        async with aio.Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False}) as c:
            c.assign([aio.TopicPartition(topic, 0, -2)])
            out: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(out) < n and time.monotonic() < deadline:
                out.extend(m.value for m in await c.consume(n, 0.5))
            return out

    for conf in ({**_base(b), "oauth_cb": cb}, _unsecure(b, "principal=gina"), {**_base(b), "oauth_cb": oauth_cb}):
        t = _topic(b, "oa")
        assert asyncio.run(main(conf, t)) == [f"a{i}".encode() for i in range(n)]
    log = _log(b)[len(before):]
    for who in ("dave", "erin", "frank", "gina"):
        assert f"authenticated as User:{who} with OAUTHBEARER" in log, who


def _pump(produce: Any, poll: Any, flush: Any, seconds: float) -> tuple[list[int], list[int]]:
    sent: list[int] = []
    got: list[int] = []
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < seconds:
        produce(str(i).encode())
        sent.append(i)
        i += 1
        got.extend(poll())
        time.sleep(0.02)
    flush()
    deadline = time.monotonic() + 15
    while len(got) < len(sent) and time.monotonic() < deadline:
        got.extend(poll())
    return sent, got


def test_short_lived_tokens_reauthenticate_with_fresh_tokens(brokers: dict[str, EmbeddedBroker]) -> None:
    """lifeSeconds=2 (and an oauth_cb token living 2 s): the broker bounds each session by the token's expiry
    (no connections.max.reauth.ms on this listener), so our producer and consumer re-authenticate, each time
    with a new token, across several lifetimes; confluent-kafka does so where connections.max.reauth.ms is
    shorter than its (hour-long) token (librdkafka checks for a token refresh once a second, too coarse for
    2-second tokens). Every record is consumed once and in order and no connection is closed for an expired
    session."""
    b = brokers["oauth"]
    before = _log(b)
    issued: list[float] = []

    def oauth_cb(config: str | None) -> tuple[str, float]:
        token, expiry = _jwt(life=LIFE_S, principal="henry")
        issued.append(expiry)
        return token, expiry

    def run(conf: dict[str, Any]) -> tuple[list[int], list[int]]:
        topic = _topic(b, "re")
        p = Producer({**conf, "linger.ms": 0})
        c = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, -2)])
        try:
            return _pump(lambda v: p.produce(topic, v), lambda: [int(m.value) for m in c.consume(100, 0.01)],
                         lambda: p.flush(15), 2.5 * LIFE_S)
        finally:
            p.close()
            c.close()

    from confluent_kafka import Consumer as CConsumer
    from confluent_kafka import Producer as CProducer
    from confluent_kafka import TopicPartition as CTP

    scoped = brokers["scoped"]
    scoped_before = _log(scoped)

    def run_confluent() -> tuple[list[int], list[int]]:
        topic = f"re-cf-{uuid.uuid4().hex[:6]}"
        conf = _unsecure(scoped, "principal=jack principalClaimName=client_id scope=produce")
        with Admin(conf) as admin:
            admin.create_topics([NewTopic(topic, 1)])
        cp = CProducer({**conf, "linger.ms": 0})
        cc = CConsumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
        cc.assign([CTP(topic, 0, 0)])
        try:
            def cpoll() -> list[int]:
                m = cc.poll(0.01)
                return [int(m.value())] if m is not None and m.error() is None else []

            return _pump(lambda v: (cp.produce(topic, v), cp.poll(0)), cpoll, lambda: cp.flush(15),
                         3 * REAUTH_MS / 1000)
        finally:
            cc.close()

    with ThreadPoolExecutor(3) as pool:  # all three at once: the test takes a third of the time
        futures = [pool.submit(run, _unsecure(b, f"principal=ivy lifeSeconds={LIFE_S}")),
                   pool.submit(run, {**_base(b), "oauth_cb": oauth_cb}), pool.submit(run_confluent)]
        runs = [f.result() for f in futures]
    for sent, got in runs:
        assert got == sent and len(sent) > 50
    assert len(issued) >= 3, "oauth_cb was not asked for fresh tokens"
    log = _log(b)[len(before):]
    for who in ("ivy", "henry"):
        assert log.count(f"re-authenticated as User:{who} with OAUTHBEARER") >= 2, (who, log[-3000:])
    assert "session expired" not in log
    log = _log(scoped)[len(scoped_before):]
    assert log.count("re-authenticated as User:jack with OAUTHBEARER") >= 2, log[-3000:]
    assert "session expired" not in log


# -- refused tokens -------------------------------------------------------------------------------------

def test_failed_refresh_keeps_the_consumer_going(brokers: dict[str, EmbeddedBroker]) -> None:
    """4-second tokens and an oauth_cb that fails once, at the first refresh: the consumer keeps its still
    valid token and reconnects or re-authenticates with the next one; consume() raises nothing and every
    record arrives (consume() raised SaslAuthenticationFailedError at the failed refresh). About 8 s."""
    b = brokers["oauth"]
    life = 4.0
    calls: list[float] = []

    def oauth_cb(config: str | None) -> tuple[str, float]:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise RuntimeError("token endpoint 503 (transient)")
        return _jwt(life=life, principal="hana")

    topic = _topic(b, "refresh")
    errors: list[str] = []
    got: list[bytes] = []
    with Producer(_unsecure(b)) as p:
        c = Consumer({**_base(b), "oauth_cb": oauth_cb, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": False})
        try:
            c.assign([TopicPartition(topic, 0, -2)])
            sent = 0
            started = time.monotonic()
            while time.monotonic() - started < 2 * life:
                p.produce(topic, str(sent).encode())
                sent += 1
                p.poll(0)
                try:
                    got.extend(m.value for m in c.consume(100, 0.05))
                except Exception as exc:  # noqa: BLE001 - what consume() raises is the finding
                    errors.append(f"{type(exc).__name__}: {exc}")
            assert p.flush(10) == 0
            deadline = time.monotonic() + 10
            while len(got) < sent and time.monotonic() < deadline and not errors:
                try:
                    got.extend(m.value for m in c.consume(100, 0.2))
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            c.close()
    assert errors == []
    assert len(calls) >= 3, "the failed refresh was retried"
    assert got == [str(i).encode() for i in range(sent)]


def _hanging_second_call(life: float, principal: str, release: threading.Event) -> tuple[Any, list[float]]:
    """An oauth_cb of ``life``-second tokens whose second call (the refresh at 80%) hangs until ``release``
    (at most 15 s), then fails."""
    calls: list[float] = []

    def oauth_cb(config: str | None) -> tuple[str, float]:
        calls.append(time.monotonic())
        if len(calls) == 2:
            release.wait(15)
            raise RuntimeError("token endpoint hung")
        return _jwt(life=life, principal=principal)

    return oauth_cb, calls


def test_hung_token_refresh_blocks_no_blocking_client(brokers: dict[str, EmbeddedBroker]) -> None:
    """6-second tokens from an oauth_cb whose refresh (at 80%, in the background) hangs: the blocking protocol
    connection (verify, the Spark source) keeps answering its requests and re-authenticates with the still
    valid token, and the blocking Producer and Consumer keep producing and consuming, each call quick while
    the callback hangs (the blocking connection called oauth_cb inline at its re-authentication, so the
    request hung as long as the callback; the Producer and Consumer run the asyncio client, which already
    refreshed in a worker thread). Stops before the token expires. About 6 s."""
    from oncelog.client.config import parse_config
    from oncelog.client.connection import Connection

    b = brokers["oauth"]
    life = 6.0
    window = 0.96 * life  # past the refresh (80%) and the connection's re-authentication (85-95%)
    release = threading.Event()
    before = _log(b)
    topic = _topic(b, "hung")

    def blocking_connection() -> tuple[float, list[float]]:
        cb, calls = _hanging_second_call(life, "kate", release)
        sec = parse_config({**_base(b), "oauth_cb": cb, "request.timeout.ms": 1000}, "consumer").security
        worst = 0.0
        with Connection(b.bootstrap, security=sec, timeout=20) as conn:
            conn.negotiate()
            started = time.monotonic()
            while time.monotonic() - started < window:
                t0 = time.monotonic()
                assert conn.request(3, 1, {"topics": None}).brokers
                worst = max(worst, time.monotonic() - t0)
                time.sleep(0.05)
        return worst, calls

    def blocking_clients() -> tuple[float, list[float], list[int], list[int]]:
        pcb, pcalls = _hanging_second_call(life, "liam", release)
        ccb, ccalls = _hanging_second_call(life, "liam", release)
        conf = {**_base(b), "request.timeout.ms": 1000}
        p = Producer({**conf, "oauth_cb": pcb, "linger.ms": 0})
        c = Consumer({**conf, "oauth_cb": ccb, "group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
        worst = 0.0
        sent: list[int] = []
        got: list[int] = []
        try:
            c.assign([TopicPartition(topic, 0, -2)])
            started = time.monotonic()
            while time.monotonic() - started < window - 0.5:
                t0 = time.monotonic()
                p.produce(topic, str(len(sent)).encode())
                sent.append(len(sent))
                p.poll(0)
                got.extend(int(m.value) for m in c.consume(100, 0.02))
                worst = max(worst, time.monotonic() - t0)
                time.sleep(0.03)
            assert p.flush(5) == 0
            deadline = time.monotonic() + 0.5
            while len(got) < len(sent) and time.monotonic() < deadline:
                got.extend(int(m.value) for m in c.consume(100, 0.05))
        finally:
            p.close()
            c.close()
        for client in (p, c):  # closed while their refresh hung: that task is cancelled, not left pending
            pending = client.config.security.oauth._pending
            assert pending is not None and pending.cancelled()
        return worst, pcalls + ccalls, sent, got

    try:
        with ThreadPoolExecutor(2) as pool:
            fconn, fclients = pool.submit(blocking_connection), pool.submit(blocking_clients)
            conn_worst, conn_calls = fconn.result()
            clients_worst, clients_calls, sent, got = fclients.result()
            hung_meanwhile = not release.is_set()
    finally:
        release.set()
    assert hung_meanwhile
    assert len(conn_calls) == 2 and conn_calls[1] - conn_calls[0] > 0.7 * life  # the refresh that hung
    assert conn_worst < 1.0, f"a request waited {conn_worst:.1f} s for the hung oauth_cb"
    assert len(clients_calls) == 4 and clients_worst < 1.0, clients_worst
    assert got == sent and len(sent) > 20
    log = _log(b)[len(before):]
    assert "re-authenticated as User:kate with OAUTHBEARER" in log, log[-3000:]
    assert "session expired" not in log


def test_closed_blocking_connections_stop_their_token_refresh(brokers: dict[str, EmbeddedBroker]) -> None:
    """PartitionReaders (the Spark sink opens one per check) and two Connections sharing one client's
    token source, with 2-second tokens, opened and closed: after close no oauth_cb call and no refresh
    timer thread is left (each closed reader's timer fired at 80% of the token's life, called oauth_cb
    once more and slept another 80%), while a source with a connection still open keeps refreshing.
    About 2 s."""
    from oncelog.client.config import parse_config
    from oncelog.client.connection import Connection
    from oncelog.client.reader import PartitionReader

    b = brokers["oauth"]
    calls: list[float] = []

    def cb(config: str | None) -> tuple[str, float]:
        calls.append(time.monotonic())
        return _jwt(life=LIFE_S, principal="otto")

    def timers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.is_alive()}

    before = timers()
    conf = {**_base(b), "oauth_cb": cb}
    for _ in range(3):
        with PartitionReader(b.bootstrap, timeout=10, config=conf) as reader:
            reader.conn.negotiate()
            assert reader.conn.request(3, 1, {"topics": None}).brokers
    sec = parse_config(conf, "consumer").security
    first = Connection(b.bootstrap, security=sec, timeout=10)
    second = Connection(b.bootstrap, security=sec, timeout=10)  # the same client's second connection
    first.close()
    assert len(calls) == 4
    time.sleep(0.9 * LIFE_S)  # past the 80% point of every token
    assert len(calls) == 5  # the open connection's source refreshed
    second.close()
    time.sleep(0.3)  # a cancelled timer's thread ends at once
    assert len(calls) == 5, "oauth_cb was called for a closed client"
    assert timers() - before == set(), "a closed client's refresh timer is still alive"


_HUNG_PRODUCER_SCRIPT = """
import sys, time
from oncelog.client import Producer
from oncelog.protocol.oauthbearer import unsecured_jws
calls = []
def oauth_cb(config):
    calls.append(time.monotonic())
    if len(calls) > 1:
        time.sleep(20)  # the token endpoint hangs on the refresh
    now = int(time.time() * 1000) / 1000
    return unsecured_jws({"sub": "pia", "iat": now, "exp": now + 2}), now + 2
p = Producer({"bootstrap.servers": sys.argv[1], "security.protocol": "SASL_PLAINTEXT",
              "sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb, "request.timeout.ms": 1000})
p.produce(sys.argv[2], b"x")
assert p.flush(10) == 0
time.sleep(1.8)  # past the refresh point (80% of 2 s): the refresh hangs
assert len(calls) == 2, calls
p.close()
print("closed", flush=True)
"""


def test_hung_oauth_cb_does_not_keep_a_closed_producers_process_alive(brokers: dict[str, EmbeddedBroker]) -> None:
    """A blocking Producer whose oauth_cb hangs in the background refresh, closed: the process exits at once
    (the plain callback ran in the client loop's default executor, whose worker Python joins at exit, so the
    process lived until the callback returned, 20 s here). About 3 s (a subprocess)."""
    import os
    import subprocess
    import sys

    b = brokers["oauth"]
    topic = _topic(b, "exit")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _HUNG_PRODUCER_SCRIPT, b.bootstrap, topic], capture_output=True,
                          text=True, timeout=60, env=os.environ.copy())
    took = time.monotonic() - t0
    assert done.returncode == 0 and done.stdout == "closed\n", done.stderr[-3000:]
    assert took < 8, f"the process took {took:.1f} s to exit after the Producer was closed"


def test_blocking_connection_waits_a_second_between_reauthentications(brokers: dict[str, EmbeddedBroker],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A token that expires 3 s after the login (the IdP hands out the same one) and re-authentication at 30%
    of the session (fixed, for a deterministic timeline): the re-authentication at ~1.1 s gets a session of
    ~1.9 s, whose 30% point (~1.67 s) is within a second of it, which the broker refuses to re-authenticate
    (KIP-368, Kafka's KafkaChannel); the blocking connection, as the asyncio one, waits until a second has
    passed, so its request at ~1.85 s is served (it began a re-authentication there and got
    ILLEGAL_SASL_STATE). About 2 s."""
    from oncelog.client import security
    from oncelog.client.config import parse_config
    from oncelog.client.connection import Connection

    b = brokers["oauth"]
    monkeypatch.setattr(security, "reauthentication_delay", lambda ms, rand=None: 0.3 * ms / 1000)
    token = _jwt(life=3.0, principal="mona")
    t0 = time.monotonic()
    sec = parse_config({**_base(b), "oauth_cb": lambda config: token}, "consumer").security
    before = _log(b)
    with Connection(b.bootstrap, security=sec) as conn:
        conn.negotiate()
        for at in (1.1, 1.85):  # the first re-authenticates (past 0.9 s), the second must not
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            assert conn.request(3, 1, {"topics": None}).brokers
        assert time.monotonic() - t0 < 2.05, "too slow to test the window"
    log = _log(b)[len(before):]
    assert log.count("re-authenticated as User:mona with OAUTHBEARER") == 1, log[-3000:]


BAD_TOKENS = {
    "expired": lambda: _jwt(life=-10)[0],
    "missing sub": lambda: unsecured_jws({"iat": time.time(), "exp": time.time() + 60}),
    "wrong alg": lambda: _jwt()[0].replace("eyJhbGciOiJub25lIn0", "eyJhbGciOiJIUzI1NiJ9") + "c2ln",
    "garbage": lambda: "not-a-jwt",
}


@pytest.mark.parametrize("kind", sorted(BAD_TOKENS))
def test_bad_tokens_are_refused_and_others_served(brokers: dict[str, EmbeddedBroker], kind: str) -> None:
    b = brokers["oauth"]
    bad = BAD_TOKENS[kind]()

    def oauth_cb(config: str | None) -> tuple[str, float]:
        return bad, time.time() + 60

    before = _log(b)
    started = time.monotonic()
    with pytest.raises(SaslAuthenticationFailedError, match='invalid_token.*refused the OAUTHBEARER token'):
        with Admin({**_base(b), "oauth_cb": oauth_cb}) as admin:
            admin.list_topics()
    assert time.monotonic() - started < 10, "an authentication failure must not be retried until a timeout"
    assert "token refused" in _log(b)[len(before):]
    with Admin(_unsecure(b)) as admin:  # the broker keeps serving others
        assert admin.list_topics() is not None


def test_missing_required_scope_and_confluent_sees_the_failure(brokers: dict[str, EmbeddedBroker]) -> None:
    """On the listener requiring scope "produce" (principal claim client_id): a token without it is
    insufficient_scope for our client and for confluent-kafka (its error callback gets the authentication
    error with the broker's JSON); with it, both are served."""
    from confluent_kafka import KafkaError as CKafkaError
    from confluent_kafka.admin import AdminClient

    b = brokers["scoped"]
    no_scope = _unsecure(b, "principal=kim principalClaimName=client_id scope=consume")
    with pytest.raises(SaslAuthenticationFailedError, match='"status":"insufficient_scope", "scope":"\\[produce\\]"'):
        with Admin(no_scope) as admin:
            admin.list_topics()
    errors: list[Any] = []
    client = AdminClient({**no_scope, "error_cb": errors.append})
    with pytest.raises(Exception):
        client.list_topics(timeout=2)
    client.poll(0.5)
    assert any(e.code() == CKafkaError._AUTHENTICATION and "insufficient_scope" in e.str() for e in errors), \
        [str(e) for e in errors]
    ok = _unsecure(b, "principal=kim principalClaimName=client_id scope=produce,consume")
    with Admin(ok) as admin:
        assert admin.list_topics() is not None
    # the default principal claim (sub) is not what this listener reads
    with pytest.raises(SaslAuthenticationFailedError, match="invalid_token"):
        with Admin(_unsecure(b, "principal=kim scope=produce")) as admin:
            admin.list_topics()


def _authenticate(corr: int, token: bytes) -> bytes:
    return _request(36, 1, corr, struct.pack(">i", len(token)) + token)


def _answer(resp: bytes | None) -> tuple[int, str | None, bytes, int]:
    """(error code, error message, auth bytes, session_lifetime_ms) of a SaslAuthenticate v1 answer."""
    assert resp is not None, "connection closed instead of a SaslAuthenticate answer"
    _corr, code, mlen = struct.unpack_from(">ihh", resp)
    pos = 8 + max(mlen, 0)
    message = resp[8:pos].decode() if mlen >= 0 else None
    (blen,) = struct.unpack_from(">i", resp, pos)
    auth = resp[pos + 4:pos + 4 + max(blen, 0)]
    (lifetime,) = struct.unpack_from(">q", resp, pos + 4 + max(blen, 0))
    return code, message, auth, lifetime


def test_raw_protocol_challenge_failure_and_session_lifetime(brokers: dict[str, EmbeddedBroker]) -> None:
    """On the wire, as Kafka: a valid token is answered with empty bytes and a session lifetime of the token's
    remaining life; a refused one with the JSON error (error code 0), the client's \\x01 then gets
    SASL_AUTHENTICATION_FAILED (58) with that JSON as the message and the connection closes; a malformed
    initial response gets 58 with Kafka's fixed text at once."""
    b = brokers["oauth"]
    handshake = _request(17, 1, 1, struct.pack(">h", 11) + b"OAUTHBEARER")
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        s.sendall(handshake + _authenticate(2, client_initial_response(_jwt(life=30)[0])))
        assert struct.unpack_from(">ih", _recv(s) or b"") == (1, 0)
        code, message, auth, lifetime = _answer(_recv(s))
        assert (code, message, auth) == (0, None, b"") and 28_000 <= lifetime <= 30_000
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        s.sendall(handshake + _authenticate(2, client_initial_response(_jwt(life=-1)[0])))
        _recv(s)
        assert _answer(_recv(s)) == (0, None, b'{"status":"invalid_token"}', 0)
        s.sendall(_authenticate(3, b"\x01"))
        assert _answer(_recv(s))[:2] == (58, '{"status":"invalid_token"}')
        assert _recv(s) is None, "the connection must close after a refused login"
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        s.sendall(handshake + _authenticate(2, b"n,,\x01auth=Bearer\x01\x01"))
        _recv(s)
        assert _answer(_recv(s))[:2] == (58, "Authentication failed during authentication due to invalid credentials "
                                              "with SASL mechanism OAUTHBEARER")
        assert _recv(s) is None


def test_raw_protocol_failed_login_is_answered_after_the_delay_then_closed(brokers: dict[str, EmbeddedBroker]) -> None:
    """As Kafka, SASL_AUTHENTICATION_FAILED comes connection.failed.authentication.delay.ms (100 ms by default)
    after the failing token, and the connection is then closed (it came at once)."""
    b = brokers["oauth"]
    handshake = _request(17, 1, 1, struct.pack(">h", 11) + b"OAUTHBEARER")
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        s.sendall(handshake + _authenticate(2, client_initial_response(_jwt(life=-1)[0])))
        _recv(s)
        assert _answer(_recv(s))[2] == b'{"status":"invalid_token"}'
        sent = time.monotonic()
        s.sendall(_authenticate(3, b"\x01"))
        assert _answer(_recv(s))[0] == 58
        assert time.monotonic() - sent >= 0.095
        assert _recv(s) is None


def test_raw_protocol_every_failed_authentication_is_delayed(brokers: dict[str, EmbeddedBroker]) -> None:
    """Kafka delays the close of every authentication failure by connection.failed.authentication.delay.ms
    (100 ms): SaslHandshake v0's bare PLAIN token that is wrong (closed without an answer: it closed at once,
    so a password guesser bypassed the delay), UNSUPPORTED_SASL_MECHANISM and ILLEGAL_SASL_STATE (answered at
    once); a good bare token is not delayed. About 0.5 s."""
    b = brokers["oauth"]
    before = _log(b)

    def raw(token: bytes) -> bytes:
        return struct.pack(">i", len(token)) + token

    v0 = _request(17, 0, 1, struct.pack(">h", 5) + b"PLAIN")
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        s.sendall(v0)
        assert _recv(s) is not None
        sent = time.monotonic()
        s.sendall(raw(b"\0alice\0wrong"))
        assert _recv(s) is None
        assert time.monotonic() - sent >= 0.095, "a wrong v0 token must be closed after the delay"
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        s.sendall(v0)
        assert _recv(s) is not None
        sent = time.monotonic()
        s.sendall(raw(b"\0alice\0alice-secret"))
        assert _recv(s) is not None and time.monotonic() - sent < 0.095  # the empty answer, at once
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        sent = time.monotonic()
        s.sendall(_request(17, 1, 1, struct.pack(">h", 6) + b"GSSAPI"))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">ih", resp) == (1, 33)
        assert time.monotonic() - sent >= 0.095, "UNSUPPORTED_SASL_MECHANISM comes after the delay"
        assert _recv(s) is None
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        s.sendall(_request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN"))
        assert _recv(s) is not None
        sent = time.monotonic()
        s.sendall(_request(3, 1, 2, struct.pack(">i", -1)))  # Metadata during authentication
        assert _recv(s) is not None
        assert time.monotonic() - sent >= 0.095, "ILLEGAL_SASL_STATE comes after the delay"
        assert _recv(s) is None
    assert "Traceback" not in _log(b)[len(before):]


def test_raw_protocol_crafted_tokens_are_answered_not_crashed(brokers: dict[str, EmbeddedBroker]) -> None:
    """Tokens with NaN, Infinity or too deeply nested JSON are invalid_token (the broker logged a traceback and
    dropped the connection); one valid until 1e20 s is accepted with a session lifetime the answer can carry
    (it crashed the response encoder) and the connection is served."""
    from oncelog.protocol.oauthbearer import b64url_encode

    b = brokers["oauth"]
    before = _log(b)
    handshake = _request(17, 1, 1, struct.pack(">h", 11) + b"OAUTHBEARER")

    def token(claims: bytes) -> bytes:
        header = b64url_encode(b'{"alg":"none"}')
        return client_initial_response(f"{header}.{b64url_encode(claims)}.")

    for claims in (b'{"sub":"a","exp":NaN}', b'{"sub":"a","exp":1e400}',
                   b'{"sub":"a","exp":9999999999,"x":' + b"[" * 50000 + b"]" * 50000 + b"}"):
        with socket.create_connection((b.host, b.port), timeout=10) as s:
            s.sendall(handshake + _authenticate(2, token(claims)))
            _recv(s)
            assert _answer(_recv(s)) == (0, None, b'{"status":"invalid_token"}', 0), claims[:40]
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        s.sendall(handshake + _authenticate(2, token(b'{"sub":"a","exp":1e20}')))
        _recv(s)
        code, message, auth, lifetime = _answer(_recv(s))
        assert (code, message, auth) == (0, None, b"") and lifetime > 10**16
        s.sendall(_request(3, 1, 3, struct.pack(">i", -1)))  # Metadata v1, all topics: served
        assert _recv(s) is not None
    assert "Traceback" not in _log(b)[len(before):]


def test_raw_protocol_session_ended_by_the_token_says_so(brokers: dict[str, EmbeddedBroker]) -> None:
    """A 1-second token and no re-authentication: the next request closes the connection, and the broker's log
    line names the token's expiry (it blamed connections.max.reauth.ms, which is not set here). About 1.5 s."""
    b = brokers["oauth"]
    before = _log(b)
    handshake = _request(17, 1, 1, struct.pack(">h", 11) + b"OAUTHBEARER")
    with socket.create_connection((b.host, b.port), timeout=10) as s:
        s.sendall(handshake + _authenticate(2, client_initial_response(_jwt(life=1.0, principal="ivy")[0])))
        _recv(s)
        assert _answer(_recv(s))[0] == 0
        time.sleep(1.2)
        s.sendall(_request(3, 1, 3, struct.pack(">i", -1)))
        assert _recv(s) is None, "a request after the session expired closes the connection"
    deadline = time.monotonic() + 5
    while "session expired" not in _log(b)[len(before):] and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(x for x in _log(b)[len(before):].splitlines() if "session expired" in x)
    assert "its SASL session expired (the expiry of its OAUTHBEARER token)" in line, line


def test_bad_client_config_fails_at_construction(brokers: dict[str, EmbeddedBroker]) -> None:
    b = brokers["oauth"]
    for conf, match in (({**_base(b)}, "needs a token"),
                        (_unsecure(b, "user=alice"), "Unrecognized sasl.oauthbearer.config"),
                        ({**_base(b), "oauth_cb": "token"}, "expected a callable")):
        started = time.monotonic()
        with pytest.raises(ConfigError, match=match):
            Producer(conf)
        with pytest.raises(ConfigError, match=match):
            aio.Consumer({**conf, "group.id": "g"})
        assert time.monotonic() - started < 2


def test_cli_command_config_with_javas_unsecured_login(brokers: dict[str, EmbeddedBroker], tmp_path: Path) -> None:
    """A Kafka user's client.properties for OAUTHBEARER (Java's OAuthBearerLoginModule with an unsecured
    token) works with the CLI's --command-config."""
    import subprocess
    import sys

    b = brokers["oauth"]
    topic = _topic(b, "cli")
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
                     f"sasl.jaas.config={MODULE} required \\\n    unsecuredLoginStringClaim_sub=\"lena\";\n")
    before = _log(b)
    r = subprocess.run([sys.executable, "-m", "oncelog.cli", "topics", "list", "--bootstrap", b.bootstrap,
                        "--command-config", str(props)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert topic in r.stdout.split()
    assert "authenticated as User:lena with OAUTHBEARER" in _log(b)[len(before):]
