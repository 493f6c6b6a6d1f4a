"""Shared helpers of the SASL tests (test_security, test_sasl_reauth, test_oauthbearer): raw
request frames on a socket, and a confluent-kafka produce-then-read round trip."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from typing import Any


def request(api_key: int, version: int, corr: int, body: bytes) -> bytes:
    """One request frame with a non-flexible header v1 (client id ``raw``)."""
    head = struct.pack(">hhih", api_key, version, corr, 3) + b"raw"
    return struct.pack(">i", len(head) + len(body)) + head + body


def recv_frame(sock: socket.socket) -> bytes | None:
    """The next answer's bytes without its size, or None once the broker closed (or reset) the connection."""
    data = b""
    want = 4
    while len(data) < want:
        try:
            chunk = sock.recv(want - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
        if want == 4 and len(data) == 4:
            want = 4 + struct.unpack(">i", data)[0]
    return data[4:]


def confluent_roundtrip(conf: dict[str, Any], topic: str, n: int = 3) -> list[bytes]:
    """confluent-kafka produces ``c0``..``c<n-1>`` to ``topic`` partition 0 with ``conf``, then reads the
    partition from offset 0 (up to 20 s); returns the values read."""
    from confluent_kafka import Consumer as CConsumer
    from confluent_kafka import Producer as CProducer
    from confluent_kafka import TopicPartition as CTP

    p = CProducer({**conf, "linger.ms": 0})
    for i in range(n):
        p.produce(topic, f"c{i}".encode())
    assert p.flush(20) == 0, "confluent-kafka could not deliver"
    c = CConsumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
    try:
        c.assign([CTP(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        return got
    finally:
        c.close()
