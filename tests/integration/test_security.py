"""TLS and SASL end to end: real brokers on loopback ports with throwaway certificates, and real clients.

Four brokers for the module (SSL; SASL_PLAINTEXT; SASL_SSL with client
certificates required and its key store given inline; SSL with a certificate
that names only ``localhost``), each started once. confluent-kafka
(librdkafka), kafka-python and oncelog's own client produce and consume over
them; raw-protocol checks cover what clients hide (the error code of a wrong
password, the connection closed before authentication). The whole module
runs in about 30 s here.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.sasl_wire import confluent_roundtrip
from tests.integration.tls_material import KEY_PASSWORD, Pki, make_pki  # cryptography: the test extra

from oncelog.client import Admin, Consumer, Producer, TopicPartition
from oncelog.client.config import ConfigError
from oncelog.client.errors import (
    KafkaConnectionError,
    SaslAuthenticationFailedError,
    SslAuthenticationError,
)
from oncelog.testing import EmbeddedBroker
from oncelog.testing.embedded import free_port

USERS = {"alice": "alice-secret", "bob": "b=o,b pw"}
JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
        + " ".join(f'user_{name}="{pw}"' for name, pw in USERS.items()) + ";")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
FAST = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _start(tmp: Path, name: str, config: dict[str, str], port: int = 0) -> EmbeddedBroker:
    b = EmbeddedBroker(data_dir=tmp / name, port=port, config={**FAST, **config}, log_path=tmp / f"{name}.log")
    b.start()
    return b


@pytest.fixture(scope="module")
def brokers(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, EmbeddedBroker]]:
    tmp = tmp_path_factory.mktemp("brokers")
    made: dict[str, EmbeddedBroker] = {}
    try:
        made["ssl"] = _start(tmp, "ssl", {
            "listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.broker_keystore)})
        made["sasl"] = _start(tmp, "sasl", {
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": ",".join(MECHANISMS),
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS})
        # key store inline, its PEM on one line (as a properties value joined by continuation lines arrives)
        made["sasl_ssl"] = _start(tmp, "sasl_ssl", {
            "listeners": "SASL_SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": " ".join(pki.broker_cert.read_text().split("\n")),
            "ssl.keystore.key": " ".join(pki.broker_key.read_text().split("\n")),
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca),
            "listener.name.sasl_ssl.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": ",".join(MECHANISMS),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS})
        port = free_port()
        made["localhost"] = _start(tmp, "localhost", {
            "listeners": "SSL://127.0.0.1:0", "advertised.listeners": f"SSL://localhost:{port}",
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.localhost_keystore)}, port=port)
        yield made
    finally:
        for b in made.values():
            b.close()


def _conf(b: EmbeddedBroker, pki: Pki, protocol: str, mechanism: str | None = None, user: str = "alice",
          password: str | None = None, client_cert: bool = False) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": b.bootstrap, "security.protocol": protocol}
    if "SSL" in protocol:
        conf["ssl.ca.location"] = str(pki.ca)
    if client_cert:
        conf.update({"ssl.certificate.location": str(pki.client_cert),
                     "ssl.key.location": str(pki.client_key_encrypted), "ssl.key.password": KEY_PASSWORD})
    if mechanism:
        conf.update({"sasl.mechanism": mechanism, "sasl.username": user,
                     "sasl.password": USERS[user] if password is None else password})
    return conf


def oncelog_roundtrip(conf: dict[str, Any], topic: str, n: int = 3) -> list[bytes]:
    p = Producer(conf)
    try:
        for i in range(n):
            p.produce(topic, f"o{i}".encode())
        assert p.flush(20) == 0
    finally:
        p.close()
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


# -- TLS ---------------------------------------------------------------------------------------


def test_ssl_confluent_and_oncelog_produce_and_consume(brokers: dict[str, EmbeddedBroker], pki: Pki) -> None:
    b = brokers["ssl"]
    assert confluent_roundtrip(_conf(b, pki, "SSL"), "tls-c") == [b"c0", b"c1", b"c2"]
    assert oncelog_roundtrip(_conf(b, pki, "SSL"), "tls-o") == [b"o0", b"o1", b"o2"]


def test_ssl_consumer_receives_large_fetch_answers_whole(brokers: dict[str, EmbeddedBroker], pki: Pki) -> None:
    """Fetch answers of megabytes over TLS: the client's connection receives them straight into a
    buffer of their size (asyncio.BufferedProtocol through the SSL transport, 1 MiB answers read
    in TLS records of 16 KiB), small and large values in order, none lost or cut."""
    import os

    conf = _conf(brokers["ssl"], pki, "SSL")
    values = [os.urandom(50_000) if i % 3 else f"small-{i}".encode() for i in range(90)]
    p = Producer({**conf, "linger.ms": 20})
    try:
        for i, v in enumerate(values):
            p.produce("tls-big", v)
        assert p.flush(20) == 0
    finally:
        p.close()
    c = Consumer({**conf, "enable.auto.commit": False})
    try:
        c.assign([TopicPartition("tls-big", 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < len(values) and time.monotonic() < deadline:
            got += [m.value for m in c.consume(500, 0.5)]
        assert got == values
    finally:
        c.close()


def test_plaintext_client_on_tls_port_fails_cleanly_and_broker_survives(
        brokers: dict[str, EmbeddedBroker], pki: Pki) -> None:
    b = brokers["ssl"]
    # a Kafka ApiVersions request in the clear: the TLS server drops the connection without a Kafka answer
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        s.sendall(struct.pack(">ihhih", 10 + 6, 18, 0, 1, 6) + b"oncetl")
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
    assert struct.pack(">i", 1) not in data[:8]  # no Kafka response with our correlation id
    # our client configured for PLAINTEXT gives up with a connection error, not a hang or a crash
    with pytest.raises(KafkaConnectionError, match="lost"):
        with Admin({"bootstrap.servers": b.bootstrap, "request.timeout.ms": 3000,
                    "default.api.timeout.ms": 3000}) as admin:
            admin.list_topics()
    # and the broker still serves TLS clients
    assert oncelog_roundtrip(_conf(b, pki, "SSL"), "tls-after", n=1) == [b"o0"]
    assert b.running


def test_untrusted_ca_is_a_typed_error(brokers: dict[str, EmbeddedBroker], pki: Pki) -> None:
    conf = {**_conf(brokers["ssl"], pki, "SSL"), "ssl.ca.location": str(pki.other_ca)}
    with pytest.raises(SslAuthenticationError, match="self-signed certificate in certificate chain|unable to get local issuer"):
        with Admin(conf) as admin:
            admin.list_topics()


def test_hostname_verification_on_and_off(brokers: dict[str, EmbeddedBroker], pki: Pki) -> None:
    """The localhost broker's certificate names DNS:localhost only and it advertises localhost."""
    b = brokers["localhost"]
    by_ip = _conf(b, pki, "SSL")  # bootstrap 127.0.0.1: not in the certificate
    with pytest.raises(SslAuthenticationError, match="(?i)hostname|IP address mismatch|doesn't match"):
        with Admin({**by_ip, "ssl.endpoint.identification.algorithm": "https"}) as admin:
            admin.list_topics()
    with Admin({**by_ip, "ssl.endpoint.identification.algorithm": "none"}) as admin:
        admin.list_topics()
    by_name = {**by_ip, "bootstrap.servers": f"localhost:{b.port}"}
    assert oncelog_roundtrip(by_name, "host-o", n=1) == [b"o0"]
    # librdkafka: the same check (its default is https since 2.0)
    from confluent_kafka.admin import AdminClient
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException):
        AdminClient({**by_ip}).list_topics(timeout=2)
    md = AdminClient({**by_ip, "ssl.endpoint.identification.algorithm": "none"}).list_topics(timeout=10)
    assert md.brokers
    assert confluent_roundtrip(by_name, "host-c", n=1) == [b"c0"]


# -- SASL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_plaintext_confluent_and_oncelog(brokers: dict[str, EmbeddedBroker], pki: Pki, mechanism: str) -> None:
    b = brokers["sasl"]
    topic = "sasl-" + mechanism.lower()
    # bob's password has '=' and ',' (SCRAM's saslname escaping is for names, the password goes through as is)
    assert confluent_roundtrip(_conf(b, pki, "SASL_PLAINTEXT", mechanism, user="bob"), topic) == [b"c0", b"c1", b"c2"]
    assert oncelog_roundtrip(_conf(b, pki, "SASL_PLAINTEXT", mechanism), topic + "-o") == [b"o0", b"o1", b"o2"]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_sasl_ssl_with_client_certificates(brokers: dict[str, EmbeddedBroker], pki: Pki, mechanism: str) -> None:
    b = brokers["sasl_ssl"]
    conf = _conf(b, pki, "SASL_SSL", mechanism, client_cert=True)
    assert confluent_roundtrip(conf, "ss-c-" + mechanism.lower()) == [b"c0", b"c1", b"c2"]
    assert oncelog_roundtrip(conf, "ss-o-" + mechanism.lower()) == [b"o0", b"o1", b"o2"]
    # ssl.client.auth=required: no client certificate, no connection (TLS 1.3 completes the client's side
    # of the handshake before the server refuses; oncelog's broker, on asyncio's TLS, closes without
    # sending its alert, so the client sees the connection lost; with the alert, as a JVM broker sends it,
    # the client raises SslAuthenticationError: test_tls_failures_are_sorted_as_the_java_client_does)
    with pytest.raises(KafkaConnectionError, match="lost"):
        with Admin({**_conf(b, pki, "SASL_SSL", mechanism), "request.timeout.ms": 3000,
                    "default.api.timeout.ms": 3000}) as admin:
            admin.list_topics()


def _tls_peer(pki: Pki, behaviour: str) -> tuple[int, threading.Thread]:
    """A one-connection TLS peer in a thread, with blocking OpenSSL (which, unlike asyncio's TLS, sends
    its alert before closing, as a JVM broker does). ``require_cert``: TLS with a client certificate
    required; ``close_mid_handshake``: read the ClientHello and close (a broker going away)."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(pki.broker_keystore))
        ctx.load_verify_locations(cafile=str(pki.ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
        srv.settimeout(10)
        with srv:
            s, _ = srv.accept()
            with s:
                if behaviour == "close_mid_handshake":
                    s.recv(100)
                    return
                # a second descriptor keeps the connection open after the failed TLS socket closes its own:
                # read until the client hangs up, so that closing with its request unread does not reset
                # the connection before the client has read the alert
                with s.dup() as raw:
                    try:
                        ctx.wrap_socket(s, server_side=True)
                    except OSError:  # the handshake failed, the alert is sent
                        raw.settimeout(5)
                        try:
                            while raw.recv(65536):
                                pass
                        except OSError:
                            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[1], t


def test_tls_failures_are_sorted_as_the_java_client_does(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    from oncelog.client.aio.connection import BrokerConnection
    from oncelog.client.security import Security

    def conn(port: int) -> BrokerConnection:
        return BrokerConnection("127.0.0.1", port, request_timeout_ms=5000, connect_timeout_ms=5000,
                                security=Security("SSL", ssl.create_default_context(cafile=str(pki.ca)), True))

    async def connect(port: int) -> None:
        await conn(port).connect()

    # TLS 1.3: the broker refuses the missing client certificate after the client's side of the handshake
    # is done; its alert answers the first request: an authentication failure, not a lost connection
    port, t = _tls_peer(pki, "require_cert")
    with pytest.raises(SslAuthenticationError, match="CERTIFICATE_REQUIRED"):
        asyncio.run(connect(port))
    t.join(5)
    # the peer closing mid-handshake is a retriable connection error, named as such
    port, t = _tls_peer(pki, "close_mid_handshake")
    with pytest.raises(KafkaConnectionError, match="by (the )?peer"):
        asyncio.run(connect(port))
    t.join(5)

    # ... and so is OpenSSL's own word for it, an SSLEOFError (or a close_notify) during the handshake
    async def eof_during_handshake(exc: ssl.SSLError) -> None:
        async def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise exc

        monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", refuse)
        await connect(1)

    for exc in (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), ssl.SSLZeroReturnError(6, "closed")):
        with pytest.raises(KafkaConnectionError, match="closed during the TLS handshake"):
            asyncio.run(eof_during_handshake(exc))

    # the blocking connection (CLI, verify): a broker closing mid-handshake stays an OSError (its callers try
    # the next bootstrap server on one), a certificate that does not verify is SslAuthenticationError
    from oncelog.client.connection import Connection

    security = Security("SSL", ssl.create_default_context(cafile=str(pki.ca)), True)
    port, t = _tls_peer(pki, "close_mid_handshake")
    with pytest.raises(OSError):
        Connection(f"127.0.0.1:{port}", timeout=5, security=security)
    t.join(5)

    class EofContext:  # OpenSSL's own word for it, as a TLS peer that closes mid-handshake can produce
        def wrap_socket(self, *_args: Any, **_kwargs: Any) -> Any:
            exc = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
            exc.reason = "UNEXPECTED_EOF_WHILE_READING"  # as OpenSSL 3 names it
            raise exc

    with socket.create_server(("127.0.0.1", 0)) as srv:
        with pytest.raises(ssl.SSLEOFError):
            Connection(f"127.0.0.1:{srv.getsockname()[1]}", timeout=5,
                       security=Security("SSL", EofContext(), True))  # type: ignore[arg-type]
    port, t = _tls_peer(pki, "require_cert")
    with pytest.raises(SslAuthenticationError, match="certificate"):
        Connection(f"127.0.0.1:{port}", timeout=5,
                   security=Security("SSL", ssl.create_default_context(cafile=str(pki.other_ca)), True))
    t.join(5)


def test_kafka_python_over_sasl_ssl_scram(brokers: dict[str, EmbeddedBroker], pki: Pki) -> None:
    """A second, independent SCRAM and TLS implementation."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTP

    b = brokers["sasl_ssl"]
    common = dict(bootstrap_servers=b.bootstrap, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                  sasl_plain_username="bob", sasl_plain_password=USERS["bob"], ssl_cafile=str(pki.ca),
                  ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key_encrypted),
                  ssl_password=KEY_PASSWORD, request_timeout_ms=10000)
    p = KafkaProducer(**common)
    try:
        for i in range(3):
            p.send("kp-scram", f"k{i}".encode()).get(timeout=15)
    finally:
        p.close(timeout=5)
    c = KafkaConsumer(**common, enable_auto_commit=False, consumer_timeout_ms=8000)
    try:
        c.assign([KTP("kp-scram", 0)])
        c.seek_to_beginning()
        got = [m.value for _, m in zip(range(3), c)]
    finally:
        c.close()
    assert got == [b"k0", b"k1", b"k2"]


def test_aiokafka_over_sasl_ssl_scram_sha_512(brokers: dict[str, EmbeddedBroker], pki: Pki) -> None:
    """A third implementation, asyncio, with SCRAM-SHA-512."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition as ATP
    from aiokafka.helpers import create_ssl_context

    b = brokers["sasl_ssl"]

    async def main() -> list[bytes]:
        ctx = create_ssl_context(cafile=str(pki.ca), certfile=str(pki.client_cert),
                                 keyfile=str(pki.client_key_encrypted), password=KEY_PASSWORD)
        common = dict(bootstrap_servers=b.bootstrap, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                      sasl_plain_username="alice", sasl_plain_password=USERS["alice"], ssl_context=ctx)
        p = AIOKafkaProducer(**common)
        await p.start()
        try:
            for i in range(3):
                await p.send_and_wait("aio-scram", f"a{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(**common, enable_auto_commit=False, auto_offset_reset="earliest")
        await c.start()
        try:
            c.assign([ATP("aio-scram", 0)])
            await c.seek_to_beginning()
            got: list[bytes] = []
            async with asyncio.timeout(15):
                while len(got) < 3:
                    got.append((await c.getone()).value)
            return got
        finally:
            await c.stop()

    assert asyncio.run(main()) == [b"a0", b"a1", b"a2"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_wrong_password_is_a_typed_error_and_the_broker_keeps_serving(
        brokers: dict[str, EmbeddedBroker], pki: Pki, mechanism: str) -> None:
    b = brokers["sasl"]
    bad = _conf(b, pki, "SASL_PLAINTEXT", mechanism, password="wrong")
    started = time.monotonic()
    with pytest.raises(SaslAuthenticationFailedError, match="Authentication failed"):
        with Admin(bad) as admin:
            admin.list_topics()
    assert time.monotonic() - started < 10, "an authentication failure must not be retried until a timeout"
    # confluent-kafka reports it too (an error naming the authentication failure)
    from confluent_kafka.admin import AdminClient
    from confluent_kafka import KafkaException

    from confluent_kafka import KafkaError as CKafkaError

    errors: list[Any] = []
    client = AdminClient({**bad, "error_cb": errors.append})
    with pytest.raises(KafkaException) as failed:
        client.list_topics(timeout=2)
    # librdkafka retries the login until the timeout, then names the broker connection as the cause (a broker
    # that never answered would give _TIMED_OUT)
    assert failed.value.args[0].code() == CKafkaError._TRANSPORT, failed.value
    client.poll(0.5)
    # librdkafka's error callback gets its authentication error, carrying the broker's message
    assert any(e.code() == CKafkaError._AUTHENTICATION and "Authentication failed" in e.str() for e in errors), \
        [str(e) for e in errors]
    # others are still served
    with Admin(_conf(b, pki, "SASL_PLAINTEXT", mechanism)) as admin:
        admin.list_topics()


def test_password_changed_while_connected_fails_sends_and_poll_with_the_auth_error(tmp_path: Path) -> None:
    """A connected producer and consumer whose broker comes back with another password: the reconnect is
    refused, which is not retried until delivery.timeout.ms: the pending records fail with the
    authentication error and poll() raises it (KafkaConsumer.poll(), and the Java client's requests to a
    node that failed authentication). Costs about 5 s."""
    def jaas(password: str) -> str:
        return f'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="{password}";'

    b = _start(tmp_path, "restarted", {"listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                                       "sasl.enabled.mechanisms": "SCRAM-SHA-256",
                                       "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas("old")})
    conf = {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "alice", "sasl.password": "old"}
    p = Producer({**conf, "linger.ms": 0, "delivery.timeout.ms": 60000})
    c = Consumer({**conf, "group.id": "g-restart", "enable.auto.commit": False})
    try:
        p.produce("t", b"before")
        assert p.flush(20) == 0
        c.assign([TopicPartition("t", 0, -2)])
        deadline = time.monotonic() + 20
        m = None
        while m is None and time.monotonic() < deadline:
            m = c.poll(0.5)
        assert m is not None and m.value == b"before"
        b.stop()
        b.config["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = jaas("new")
        b.start()
        started = time.monotonic()
        fut = p.produce("t", b"after")
        p.flush(20)
        with pytest.raises(SaslAuthenticationFailedError, match="Authentication failed"):
            fut.result(0)
        assert time.monotonic() - started < 10, "the refused login was retried until a timeout"
        started = time.monotonic()
        with pytest.raises(SaslAuthenticationFailedError, match="Authentication failed"):
            while time.monotonic() - started < 15:
                c.poll(0.5)
        assert time.monotonic() - started < 10
    finally:
        p.close()
        c.close()
        b.close()


# -- raw protocol -----------------------------------------------------------------------------


def _request(api_key: int, version: int, corr: int, body: bytes, flexible: bool = False) -> bytes:
    head = struct.pack(">hhih", api_key, version, corr, 3) + b"raw" + (b"\x00" if flexible else b"")
    return struct.pack(">i", len(head) + len(body)) + head + body


def _string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def _recv(sock: socket.socket) -> bytes | None:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (size,) = struct.unpack(">i", head)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, socket.timeout):
        return False


def test_raw_sasl_protocol(brokers: dict[str, EmbeddedBroker]) -> None:
    b = brokers["sasl"]
    # 1. anything but ApiVersions/SaslHandshake before authentication closes the connection
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        s.sendall(_request(3, 1, 1, struct.pack(">i", -1)))  # Metadata v1, all topics
        assert _recv(s) is None
    # 2. a mechanism not enabled: UNSUPPORTED_SASL_MECHANISM (33) with the enabled list, then closed
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        s.sendall(_request(17, 1, 2, _string("GSSAPI")))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">ih", resp) == (2, 33)
        assert b"SCRAM-SHA-512" in resp
        assert _closed(s)
    # 3. PLAIN with a wrong password via SaslAuthenticate v1: SASL_AUTHENTICATION_FAILED (58) + message, closed
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        s.sendall(_request(17, 1, 3, _string("PLAIN")))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">ih", resp) == (3, 0)
        token = b"\x00alice\x00nope"
        s.sendall(_request(36, 1, 4, struct.pack(">i", len(token)) + token))
        resp = _recv(s)
        assert resp is not None
        corr, code, msg_len = struct.unpack_from(">ihh", resp)
        assert (corr, code) == (4, 58)
        assert resp[8 : 8 + msg_len] == b"Authentication failed: Invalid username or password"
        assert _closed(s)
    # 4. SaslHandshake v0: bare tokens follow; then Kafka requests are served
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        s.sendall(_request(17, 0, 5, _string("PLAIN")))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">ih", resp) == (5, 0)
        token = b"\x00alice\x00" + USERS["alice"].encode()
        s.sendall(struct.pack(">i", len(token)) + token)
        assert _recv(s) == b""  # PLAIN's empty answer
        s.sendall(_request(3, 1, 6, struct.pack(">i", -1)))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">i", resp) == (6,)
        # no re-authentication without connections.max.reauth.ms: ILLEGAL_SASL_STATE (34)
        s.sendall(_request(17, 1, 7, _string("PLAIN")))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">ih", resp) == (7, 34)
        # once authenticated, frames above sasl.server.max.receive.size are fine again
        big = b"x" * 600_000
        s.sendall(_request(36, 1, 8, struct.pack(">i", len(big)) + big))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">ih", resp) == (8, 34)
    # 6. after a SaslHandshake v1 any request but SaslAuthenticate is answered ILLEGAL_SASL_STATE (34) in its
    #    own response type, then the connection closes (Kafka's SaslServerAuthenticator); it used to close unanswered
    with socket.create_connection((b.host, b.port), timeout=5) as s:  # Metadata v1 for one topic: the topic errs
        s.sendall(_request(17, 1, 9, _string("PLAIN")))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">ih", resp) == (9, 0)
        s.sendall(_request(3, 1, 10, struct.pack(">i", 1) + _string("t")))
        resp = _recv(s)
        assert resp is not None
        corr, n_brokers, controller, n_topics, code, name_len = struct.unpack_from(">iiiihh", resp)
        assert (corr, n_brokers, controller, n_topics, code) == (10, 0, -1, 1, 34)
        assert resp[20 : 20 + name_len] == b"t"
        assert _closed(s)
    for corr, api_key, version, body in [
        (11, 18, 0, b""),  # ApiVersions v0: a top-level error
        (12, 17, 1, _string("PLAIN")),  # a second SaslHandshake
        (13, 11, 0, _string("g") + struct.pack(">i", 6000) + _string("") + _string("consumer")
         + struct.pack(">i", 0)),  # JoinGroup v0
    ]:
        with socket.create_connection((b.host, b.port), timeout=5) as s:
            s.sendall(_request(17, 1, 1, _string("PLAIN")))
            assert struct.unpack_from(">ih", _recv(s) or b"") == (1, 0)
            s.sendall(_request(api_key, version, corr, body))
            resp = _recv(s)
            assert resp is not None and struct.unpack_from(">ih", resp) == (corr, 34), (api_key, resp)
            assert _closed(s)
    # 5. before authentication a frame above sasl.server.max.receive.size (512 KiB) closes the connection at once
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        s.sendall(struct.pack(">i", 600_000) + b"\x00" * 1000)
        assert _closed(s)


async def _scram_through_tampering_proxy(broker: EmbeddedBroker, tamper: Any) -> None:
    """oncelog's BrokerConnection logs in with SCRAM-SHA-256 through a man in the middle that passes
    everything on but rewrites the broker's SCRAM tokens with ``tamper(token) -> token``."""
    import dataclasses

    from oncelog.client.aio.connection import BrokerConnection
    from oncelog.client.security import Security
    from oncelog.protocol.codec import decode_response, encode_response, is_flexible
    from oncelog.protocol.framing import FrameDecoder, frame
    from oncelog.protocol.headers import parse_request_header_prefix, response_header, skip_tagged_fields

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(broker.host, broker.port)
        asked: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version)

        async def upstream() -> None:
            dec = FrameDecoder()
            while data := await client_r.read(65536):
                for body in dec.feed(data):
                    head, _ = parse_request_header_prefix(body)
                    asked[head.correlation_id] = (head.api_key, head.api_version)
                    up_w.writelines(frame([body]))

        async def downstream() -> None:
            dec = FrameDecoder()
            while data := await up_r.read(65536):
                for body in dec.feed(data):
                    (corr,) = struct.unpack_from(">i", body)
                    api_key, version = asked.pop(corr)
                    if api_key == 36:
                        flexible = is_flexible(36, version)
                        resp = decode_response(36, version, body, skip_tagged_fields(body, 4) if flexible else 4)
                        if resp.auth_bytes:
                            resp = dataclasses.replace(resp, auth_bytes=tamper(bytes(resp.auth_bytes)))
                        body = response_header(corr, flexible) + encode_response(resp)
                    client_w.writelines(frame([body]))

        try:
            await asyncio.gather(upstream(), downstream())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            up_w.close()
            client_w.close()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = BrokerConnection("127.0.0.1", port, request_timeout_ms=5000, security=Security(
        "SASL_PLAINTEXT", None, True, "SCRAM-SHA-256", "alice", USERS["alice"]))
    try:
        await conn.connect()
    finally:
        conn.close()
        server.close()


@pytest.mark.parametrize("tamper,message", [
    (lambda t: t, None),  # passed on untouched: the login succeeds
    (lambda t: t.replace(b"r=", b"r=X", 1) if t.startswith(b"r=") else t, "does not extend ours"),
    (lambda t: t.replace(b",i=4096", b",i=1") if t.startswith(b"r=") else t, "iterations 1 is less than"),
    (lambda t: b"v=" + base64.b64encode(b"\x00" * 32) if t.startswith(b"v=") else t, "server signature"),
    (lambda t: b"e=other-error" if t.startswith(b"v=") else t, "SCRAM server error"),
], ids=["untouched", "nonce", "iterations", "signature", "server-error"])
def test_client_checks_the_brokers_scram_messages(brokers: dict[str, EmbeddedBroker], tamper: Any,
                                                  message: str | None) -> None:
    if message is None:
        asyncio.run(_scram_through_tampering_proxy(brokers["sasl"], tamper))
        return
    with pytest.raises(SaslAuthenticationFailedError, match=message):
        asyncio.run(_scram_through_tampering_proxy(brokers["sasl"], tamper))


def _api_versions(corr: int) -> bytes:
    return _request(18, 0, corr, b"")


def _plain_auth(corr: int, password: str) -> bytes:
    token = b"\x00alice\x00" + password.encode()
    return _request(36, 1, corr, struct.pack(">i", len(token)) + token)


def test_unauthenticated_peer_gets_one_request_at_a_time(brokers: dict[str, EmbeddedBroker]) -> None:
    b = brokers["sasl"]
    # one ApiVersions before the handshake, as Kafka's SaslServerAuthenticator: a second closes the connection
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        s.sendall(_api_versions(1) + _api_versions(2))
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">ih", resp) == (1, 0)
        assert _recv(s) is None
    # requests pipelined after a good login are checked against socket.request.max.bytes, not against the
    # 512 KiB allowed before authentication, and every one is answered in order
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        big = b"x" * 600_000  # a SaslAuthenticate after authentication: ILLEGAL_SASL_STATE (34)
        s.sendall(_api_versions(1) + _request(17, 1, 2, _string("PLAIN")) + _plain_auth(3, USERS["alice"])
                  + _request(36, 1, 4, struct.pack(">i", len(big)) + big) + _request(3, 1, 5, struct.pack(">i", -1)))
        answers = [_recv(s) for _ in range(5)]
        assert all(a is not None for a in answers), answers
        assert [struct.unpack_from(">i", a)[0] for a in answers] == [1, 2, 3, 4, 5]  # type: ignore[arg-type]
        assert struct.unpack_from(">h", answers[3], 4)[0] == 34  # type: ignore[arg-type]
    # a wrong password with requests pipelined behind it: answered, then closed; nothing after it is served
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        s.sendall(_request(17, 1, 1, _string("PLAIN")) + _plain_auth(2, "wrong")
                  + _request(3, 1, 3, struct.pack(">i", -1)))
        assert struct.unpack_from(">ih", _recv(s) or b"") == (1, 0)
        resp = _recv(s)
        assert resp is not None and struct.unpack_from(">ih", resp) == (2, 58)
        assert _recv(s) is None


def test_idle_connections_are_closed_after_connections_max_idle_ms(tmp_path: Path) -> None:
    b = _start(tmp_path, "idle", {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
                                  "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
                                  "connections.max.idle.ms": "1000"})
    try:
        with socket.create_connection((b.host, b.port), timeout=10) as quiet, \
                socket.create_connection((b.host, b.port), timeout=10) as authenticated:
            authenticated.sendall(_request(17, 1, 1, _string("PLAIN")) + _plain_auth(2, USERS["alice"]))
            assert _recv(authenticated) is not None and _recv(authenticated) is not None
            started = time.monotonic()
            assert _recv(quiet) is None  # closed, never having sent a byte
            assert 0.9 < time.monotonic() - started < 5
            assert _recv(authenticated) is None  # Kafka's rule holds for every connection
    finally:
        b.close()


# -- bad configuration --------------------------------------------------------------------------


def test_bad_client_config_fails_at_construction(pki: Pki, tmp_path: Path) -> None:
    base = {"bootstrap.servers": "127.0.0.1:1"}
    with pytest.raises(ConfigError, match="security.protocol"):
        Producer({**base, "security.protocol": "TLS"})
    with pytest.raises(ConfigError, match="ssl.ca.location"):
        Producer({**base, "security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "missing.pem")})
    with pytest.raises(ConfigError, match="sasl.mechanism is required"):
        Producer({**base, "security.protocol": "SASL_SSL"})
    with pytest.raises(ConfigError, match="GSSAPI"):
        Consumer({**base, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "GSSAPI",
                  "sasl.username": "u", "sasl.password": "p", "group.id": "g"})
    with pytest.raises(ConfigError, match="ssl.key.password"):
        Admin({**base, "security.protocol": "SSL", "ssl.ca.location": str(pki.ca),
               "ssl.certificate.location": str(pki.client_cert), "ssl.key.location": str(pki.client_key_encrypted),
               "ssl.key.password": "wrong"})
    with pytest.raises(ConfigError, match="ssl.check.hostname"):
        Producer({**base, "ssl.check.hostname": "false"})


def test_encrypted_key_without_password_is_one_line_not_a_prompt(pki: Pki, tmp_path: Path) -> None:
    # without a password callback OpenSSL asks "Enter PEM pass phrase:" on the terminal, then raises a bare
    # OSError; both sides run without a controlling terminal and with stdin closed, so a prompt cannot block
    client = ("from oncelog.client import Producer\n"
              "Producer({'bootstrap.servers': '127.0.0.1:1', 'security.protocol': 'SSL', "
              f"'ssl.ca.location': {str(pki.ca)!r}, 'ssl.certificate.location': {str(pki.client_cert)!r}, "
              f"'ssl.key.location': {str(pki.client_key_encrypted)!r}}})\n")
    proc = subprocess.run([sys.executable, "-P", "-c", client], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, start_new_session=True)
    assert "ConfigError" in proc.stderr and "encrypted: set ssl.key.password" in proc.stderr, proc.stderr
    assert "pass phrase" not in proc.stderr + proc.stdout
    keystore = tmp_path / "keystore.pem"
    keystore.write_bytes(pki.client_key_encrypted.read_bytes() + pki.client_cert.read_bytes())
    cfg = tmp_path / "server.properties"
    cfg.write_text(f"listeners=SSL://127.0.0.1:0\nssl.keystore.type=PEM\nssl.keystore.location={keystore}\n")
    proc = subprocess.run([sys.executable, "-P", "-m", "oncelog.cli", "serve", "--config", str(cfg),
                           "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "encrypted: set ssl.key.password" in lines[0], proc.stderr


def test_unprefixed_ssl_client_auth_is_for_ssl_listeners_only(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    from oncelog.broker.config import BrokerConfig

    tls = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.broker_keystore),
           "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca)}
    sasl = {"listeners": "SASL_SSL://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS, **tls}
    assert BrokerConfig.from_properties({"listeners": "SSL://127.0.0.1:0", **tls, "ssl.client.auth": "required"}
                                        ).security.client_auth == "required"
    with caplog.at_level("WARNING", logger="oncelog.security"):
        cfg = BrokerConfig.from_properties({**sasl, "ssl.client.auth": "required"})
    assert cfg.security.client_auth == "none"  # KIP-684: only the listener-prefixed key reaches SASL_SSL
    assert any("listener.name.sasl_ssl.ssl.client.auth" in r.getMessage() for r in caplog.records)
    cfg = BrokerConfig.from_properties({**sasl, "listener.name.sasl_ssl.ssl.client.auth": "requested"})
    assert cfg.security.client_auth == "requested"


@pytest.mark.parametrize("props,expected", [
    ({"listeners": "SSL://127.0.0.1:0"}, "no key store is configured"),
    ({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.location": "/nonexistent.pem"}, "ssl.keystore.type must be PEM"),
    ({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "PEM", "ssl.keystore.location": "/nonexistent.pem"},
     "no such file"),
    ({"listeners": "SASL_PLAINTEXT://127.0.0.1:0"}, "sasl.enabled.mechanisms is not set"),
    ({"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN"}, "has no users"),
])
def test_bad_broker_config_is_one_line_and_exit_2(tmp_path: Path, props: dict[str, str], expected: str) -> None:
    cfg = tmp_path / "server.properties"
    cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    proc = subprocess.run([sys.executable, "-P", "-m", "oncelog.cli", "serve", "--config", str(cfg),
                           "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert not (tmp_path / "d").exists()


def test_plaintext_broker_answers_sasl_requests_with_illegal_sasl_state(tmp_path: Path) -> None:
    with EmbeddedBroker(data_dir=tmp_path / "d", log_path=tmp_path / "b.log") as b:
        with socket.create_connection((b.host, b.port), timeout=5) as s:
            s.sendall(_request(17, 1, 9, _string("PLAIN")))
            resp = _recv(s)
            assert resp is not None and struct.unpack_from(">ih", resp) == (9, 34)
        # a request that closes the connection (an unknown API key) pipelined behind ApiVersions: the
        # ApiVersions answer, finished in the same event-loop pass, still goes out first
        for _ in range(3):
            with socket.create_connection((b.host, b.port), timeout=5) as s:
                s.sendall(_api_versions(1) + _request(999, 0, 2, b""))
                resp = _recv(s)
                assert resp is not None and struct.unpack_from(">ih", resp) == (1, 0)
                assert _recv(s) is None

