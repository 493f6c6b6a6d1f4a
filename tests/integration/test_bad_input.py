"""Bad input over raw sockets against a real broker process.

Every case sends one kind of malformed or invalid input and asserts what the
broker does about it: a Kafka error code in the response, or the offending
connection closed (with a line in the broker log naming that connection).
After every case a fresh, healthy connection must still be served, and a
confluent-kafka producer (acks=all) runs in a background thread for the whole
module; the last test consumes its topic back and checks that every record it
had acknowledged is there, at the acknowledged offset.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Producer
from kio.serial import entity_reader

from oncelog.broker.handlers import HANDLERS
from oncelog.client.admin import Admin
from oncelog.client.connection import Connection
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import encode_request, request_type, response_type
from oncelog.protocol.headers import HeaderError, parse_request_header_prefix
from oncelog.protocol.records import (
    BATCH_LENGTH_OFFSET,
    MAGIC_OFFSET,
    Record,
    encode_record_batch,
    iter_batch_headers,
    iter_records,
    update_crc,
)
from oncelog.testing.embedded import EmbeddedBroker

pytestmark = pytest.mark.timeout(180)

MAX_REQUEST = 1 << 20  # socket.request.max.bytes for this broker
TOPIC = "bad-input"  # target of the produce cases (1 partition)
BG_TOPIC = "bad-input-bg"  # the background producer's topic (2 partitions)

PRODUCE, FETCH, METADATA, API_VERSIONS = 0, 1, 3, 18
NONE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION = 0, 2, 3
INVALID_REQUIRED_ACKS, UNSUPPORTED_VERSION, INVALID_RECORD = 21, 35, 87

_I32 = struct.Struct(">i")


# -- fixtures ---------------------------------------------------------------


class BackgroundProducer(threading.Thread):
    """Produces to BG_TOPIC with acks=all until stopped; records every ack."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="bg-producer", daemon=True)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "compression.type": "none",
                "linger.ms": 2,
                "message.send.max.retries": 0,  # a retry could duplicate; we want exact counts
                "request.timeout.ms": 10000,
            }
        )
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> value
        self.errors: list[str] = []
        self.sent = 0

    def _on_delivery(self, err: Any, msg: Any) -> None:
        with self.lock:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked[(msg.partition(), msg.offset())] = msg.value()

    def run(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            self.producer.produce(BG_TOPIC, value=b"bg-%06d" % i, partition=i % 2, on_delivery=self._on_delivery)
            self.sent += 1
            i += 1
            self.producer.poll(0.005)
        self.producer.flush(30)

    def ack_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def wait_for_progress(self, more: int = 5, timeout: float = 15.0) -> None:
        """Assert the producer gets ``more`` new acknowledgements (it is still served)."""
        start = self.ack_count()
        deadline = time.monotonic() + timeout
        while self.ack_count() < start + more:
            assert self.is_alive(), "background producer thread died"
            assert time.monotonic() < deadline, f"background producer stalled at {self.ack_count()} acks"
            time.sleep(0.01)
        assert not self.errors, self.errors

    def finish(self) -> None:
        self.stop_event.set()
        self.join(60)
        assert not self.is_alive()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    root = tmp_path_factory.mktemp("bad_input")
    b = EmbeddedBroker(
        data_dir=root / "data",
        log_path=root / "broker.log",
        config={"socket.request.max.bytes": str(MAX_REQUEST), "auto.create.topics.enable": "false"},
    )
    with b:
        with Admin(b.bootstrap) as admin:
            assert admin.create_topic(TOPIC, 1) is None
            assert admin.create_topic(BG_TOPIC, 2) is None
        yield b


@pytest.fixture(scope="module", autouse=True)
def background(broker: EmbeddedBroker) -> Iterator[BackgroundProducer]:
    bg = BackgroundProducer(broker.bootstrap)
    bg.start()
    bg.wait_for_progress(20, timeout=30)
    yield bg
    if bg.is_alive():
        bg.finish()


# the offsets/values of TOPIC that the tests below had accepted (in order)
accepted: list[tuple[int, bytes]] = []


# -- helpers ----------------------------------------------------------------


def connect(broker: EmbeddedBroker) -> socket.socket:
    sock = socket.create_connection((broker.host, broker.port), timeout=10)
    return sock


def header(api_key: int, version: int, correlation_id: int, client_id: bytes = b"bad-input", tags: bool = False) -> bytes:
    out = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    return out + (b"\x00" if tags else b"")


def framed(body: bytes) -> bytes:
    return _I32.pack(len(body)) + body


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def recv_frame(sock: socket.socket) -> bytes:
    (size,) = _I32.unpack(recv_exact(sock, 4))
    return recv_exact(sock, size)


def assert_closed_by_broker(sock: socket.socket, timeout: float = 5.0) -> float:
    """Wait for EOF/RST without any response bytes; return how long it took."""
    start = time.monotonic()
    sock.settimeout(timeout)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    except socket.timeout:
        pytest.fail(f"broker did not close the connection within {timeout}s")
    finally:
        sock.close()
    assert got == b"", f"expected no response before the close, got {got[:64]!r}"
    return time.monotonic() - start


def log_size(broker: EmbeddedBroker) -> int:
    return Path(broker.log_path).stat().st_size


def log_line_for(broker: EmbeddedBroker, port: int, since: int, timeout: float = 5.0) -> str:
    """The broker log line (written after offset ``since``) about the connection from local ``port``."""
    needle = f"127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        with open(broker.log_path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        lines = [ln for ln in text.splitlines() if needle in ln and "connection" in ln]
        if lines:
            return lines[-1]
        if time.monotonic() > deadline:
            pytest.fail(f"no broker log line about connection {needle}; log tail:\n{text[-2000:]}")
        time.sleep(0.02)


def expect_close(broker: EmbeddedBroker, data: bytes, reason: str) -> str:
    """Send ``data`` on a new connection; assert it is closed and logged with ``reason``."""
    since = log_size(broker)
    sock = connect(broker)
    port = sock.getsockname()[1]
    try:
        sock.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        pass
    assert_closed_by_broker(sock)
    line = log_line_for(broker, port, since)
    assert "closing connection" in line and reason in line, line
    return line


def assert_serving(broker: EmbeddedBroker, bg: BackgroundProducer) -> None:
    """A second, healthy connection is answered, and the background producer progresses."""
    with Connection(broker.bootstrap, client_id="healthy") as conn:
        resp = conn.request(
            METADATA,
            12,
            {
                "topics": [{"name": TOPIC, "topic_id": None}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
        assert [(t.name, t.error_code) for t in resp.topics] == [(TOPIC, 0)]
        assert [p.partition_index for p in resp.topics[0].partitions] == [0]
    bg.wait_for_progress()


def produce_body(version: int, topic: str, partition: int, records: bytes | None, acks: int = -1) -> bytes:
    entity = materialize(
        request_type(PRODUCE, version),
        {
            "transactional_id": None,
            "acks": acks,
            "timeout": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}],
        },
    )
    return encode_request(entity)


def produce(broker: EmbeddedBroker, topic: str, partition: int, records: bytes | None, acks: int = -1, version: int = 9) -> Any:
    """One Produce request on its own connection; returns the partition response."""
    with Connection(broker.bootstrap, client_id="bad-input-produce") as conn:
        resp = conn.request(
            PRODUCE,
            version,
            {
                "transactional_id": None,
                "acks": acks,
                "timeout": 10000,
                "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}],
            },
        )
        # the connection stays usable after a per-partition error
        assert conn.request(API_VERSIONS, 0, {}).error_code == 0
    assert [t.name for t in resp.responses] == [topic]
    (presp,) = resp.responses[0].partition_responses
    assert presp.index == partition
    return presp


def batch(*values: bytes) -> bytes:
    return encode_record_batch([Record(key=None, value=v) for v in values])


def produce_valid(broker: EmbeddedBroker, tag: str) -> int:
    value = f"valid-{tag}".encode()
    presp = produce(broker, TOPIC, 0, batch(value))
    assert presp.error_code == NONE, presp
    accepted.append((presp.base_offset, value))
    return int(presp.base_offset)


def fetch_all(broker: EmbeddedBroker, topic: str, partition: int) -> tuple[int, list[tuple[int, bytes | None]]]:
    """(high watermark, [(offset, value)]) of a partition, read with Fetch v12."""
    out: list[tuple[int, bytes | None]] = []
    offset = 0
    with Connection(broker.bootstrap, client_id="bad-input-fetch") as conn:
        while True:
            resp = conn.request(
                FETCH,
                12,
                {
                    "cluster_id": None,
                    "replica_id": -1,
                    "max_wait": 0,
                    "min_bytes": 0,
                    "max_bytes": 1 << 20,
                    "isolation_level": 0,
                    "session_id": 0,
                    "session_epoch": -1,
                    "topics": [
                        {
                            "topic": topic,
                            "partitions": [
                                {
                                    "partition": partition,
                                    "current_leader_epoch": -1,
                                    "fetch_offset": offset,
                                    "last_fetched_epoch": -1,
                                    "log_start_offset": -1,
                                    "partition_max_bytes": 1 << 20,
                                }
                            ],
                        }
                    ],
                    "forgotten_topics_data": [],
                    "rack_id": "",
                },
            )
            assert resp.error_code == 0
            (p,) = resp.responses[0].partitions
            assert p.error_code == 0, p
            data = p.records or b""
            for _hdr, start, end in iter_batch_headers(data):
                for off, _ts, rec in iter_records(data[start:end]):
                    if off >= offset:
                        out.append((off, rec.value))
            if out:
                offset = out[-1][0] + 1
            if offset >= p.high_watermark or not data:
                return int(p.high_watermark), out


# -- framing and header level: the connection is closed ------------------------


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_junk_closes_connection(broker: EmbeddedBroker, background: BackgroundProducer, seed: int) -> None:
    junk = random.Random(seed).randbytes(4096)
    (announced,) = _I32.unpack_from(junk)
    # the first 4 junk bytes are read as the frame size: these seeds give sizes
    # the broker refuses before buffering anything (negative or over the limit)
    assert announced < 0 or announced > MAX_REQUEST
    reason = "negative frame size" if announced < 0 else "exceeds socket.request.max.bytes"
    expect_close(broker, junk, reason)
    assert_serving(broker, background)


def test_http_request_closes_connection(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    # "GET " read as a size is 1195725856 bytes
    expect_close(broker, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "exceeds socket.request.max.bytes")
    assert_serving(broker, background)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_length_prefix_then_junk_closes_connection(
    broker: EmbeddedBroker, background: BackgroundProducer, seed: int
) -> None:
    junk = random.Random(seed).randbytes(300)
    try:
        hdr, _ = parse_request_header_prefix(junk)
    except HeaderError:
        reason = "malformed request header"  # e.g. the client_id length runs past the frame
    else:
        assert hdr.api_key not in HANDLERS  # these seeds give an unknown API key
        reason = f"unknown API key {hdr.api_key}"
    expect_close(broker, framed(junk), reason)
    assert_serving(broker, background)


def test_length_prefix_then_short_junk_closes_connection(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    # a complete 5-byte frame cannot even hold the 10-byte request header
    expect_close(broker, framed(b"\x00\x03\x00\x0c\x00"), "malformed request header")
    assert_serving(broker, background)


def test_truncated_frame_then_client_close(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    body = header(METADATA, 12, 1, tags=True) + b"\x01\x00\x00\x00"
    since = log_size(broker)
    sock = connect(broker)
    port = sock.getsockname()[1]
    # announce 1000 bytes, send a few of them, then give up
    sock.sendall(_I32.pack(1000) + body)
    sock.settimeout(0.5)
    with pytest.raises(socket.timeout):
        sock.recv(1)  # the broker waits for the rest of the frame; no response
    sock.close()
    line = log_line_for(broker, port, since)
    assert "closed by the client" in line and f"{4 + len(body)} bytes of an incomplete request" in line, line
    assert_serving(broker, background)


def test_oversize_frame_closed_without_buffering(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    assert broker.proc is not None
    rss_before = _rss_kib(broker.proc.pid)
    announced = 100 * 1024 * 1024
    since = log_size(broker)
    sock = connect(broker)
    port = sock.getsockname()[1]
    chunk = b"\x00" * (256 * 1024)
    sent = 0
    start = time.monotonic()
    try:
        sock.sendall(_I32.pack(announced) + header(PRODUCE, 9, 1, tags=True))
        while sent < announced:
            sock.sendall(chunk)
            sent += len(chunk)
    except (ConnectionResetError, BrokenPipeError):
        pass
    elapsed = time.monotonic() - start
    assert_closed_by_broker(sock)
    assert elapsed < 5, f"the broker took {elapsed:.1f}s to refuse the frame"
    # the broker refused at the length prefix: only what the kernel buffers got through
    assert sent < 32 * 1024 * 1024, f"broker swallowed {sent} bytes of an oversize frame"
    line = log_line_for(broker, port, since)
    assert f"frame of {announced} bytes exceeds socket.request.max.bytes={MAX_REQUEST}" in line, line
    assert _rss_kib(broker.proc.pid) - rss_before < 16 * 1024
    assert_serving(broker, background)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_negative_length_closes_connection(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    expect_close(broker, _I32.pack(-16) + b"\x00" * 16, "negative frame size -16")
    assert_serving(broker, background)


def test_unknown_api_key_closes_connection(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    expect_close(broker, framed(header(999, 0, 1)), "unknown API key 999")
    assert_serving(broker, background)


def test_unsupported_metadata_version_closes_connection(
    broker: EmbeddedBroker, background: BackgroundProducer
) -> None:
    expect_close(broker, framed(header(METADATA, 99, 1, tags=True) + b"\x01\x00\x00\x00"), "unsupported version 99")
    assert_serving(broker, background)


def test_unsupported_produce_version_closes_connection(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    # Produce v0-v2 (magic 0/1 message sets) are below what the broker handles
    data = header(PRODUCE, 2, 1) + produce_body(3, TOPIC, 0, batch(b"REJECTED-v2"))
    expect_close(broker, framed(data), "unsupported version 2 of produce")
    assert_serving(broker, background)


def test_api_versions_v99_answered_in_v0_format(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    sock = connect(broker)
    try:
        # a future version's body is unknown to the broker: it must not matter
        sock.sendall(framed(header(API_VERSIONS, 99, 4242, tags=True) + b"\x07future\x041.0\x00"))
        sock.settimeout(5)
        raw = recv_frame(sock)
        # response header v0: the correlation id only
        (corr,) = _I32.unpack_from(raw, 0)
        assert corr == 4242
        error_code, count = struct.unpack_from(">hi", raw, 4)
        assert error_code == UNSUPPORTED_VERSION
        assert count > 0
        assert len(raw) == 4 + 2 + 4 + 6 * count  # v0 body: nothing after the list
        ranges = {k: (lo, hi) for k, lo, hi in struct.iter_unpack(">hhh", raw[10:])}
        assert ranges[API_VERSIONS] == (0, 4)
        assert ranges[PRODUCE] == (3, 12)
        assert ranges[METADATA] == (0, 12)
        assert ranges == {h.api_key: (h.min_version, h.max_version) for h in HANDLERS.values()}
        # the connection stays open: the client retries with a version we speak
        sock.sendall(framed(header(API_VERSIONS, 0, 4243)))
        raw = recv_frame(sock)
        assert _I32.unpack_from(raw, 0)[0] == 4243
        assert struct.unpack_from(">h", raw, 4)[0] == 0
    finally:
        sock.close()
    assert_serving(broker, background)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_api_versions_each_version(broker: EmbeddedBroker, background: BackgroundProducer, version: int) -> None:
    flexible = version >= 3
    body = b"\x0fbad-input-test\x040.1\x00" if flexible else b""
    sock = connect(broker)
    try:
        sock.sendall(framed(header(API_VERSIONS, version, 100 + version, tags=flexible) + body))
        sock.settimeout(5)
        raw = recv_frame(sock)
    finally:
        sock.close()
    assert _I32.unpack_from(raw, 0)[0] == 100 + version
    # ApiVersions responses use header v0 even when flexible: the body starts at 4
    # and must be consumed exactly by the schema of the requested version
    resp, size = entity_reader(response_type(API_VERSIONS, version))(raw, 4)
    assert 4 + size == len(raw)
    assert resp.error_code == 0
    ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
    assert ranges == {h.api_key: (h.min_version, h.max_version) for h in HANDLERS.values()}
    if version >= 1:
        assert resp.throttle_time.total_seconds() == 0


@pytest.mark.parametrize(
    "name,data",
    [
        ("metadata v12 body of 0xff", header(METADATA, 12, 1, tags=True) + b"\xff" * 40),
        ("produce v9 body cut in half", None),
        ("produce v3 body cut after acks", None),
        ("create_topics v7 empty body", header(19, 7, 1, tags=True)),
        ("flexible header with truncated tag block", header(METADATA, 12, 1) + b"\x05\x01"),
    ],
)
def test_valid_header_garbage_body_closes_connection(
    broker: EmbeddedBroker, background: BackgroundProducer, name: str, data: bytes | None
) -> None:
    if name == "produce v9 body cut in half":
        body = produce_body(9, TOPIC, 0, batch(b"REJECTED-truncated-body"))
        data = header(PRODUCE, 9, 1, tags=True) + body[: len(body) // 2]
    elif name == "produce v3 body cut after acks":
        body = produce_body(3, TOPIC, 0, batch(b"REJECTED-truncated-body"))
        data = header(PRODUCE, 3, 1) + body[:4]
    assert data is not None
    expect_close(broker, framed(data), "cannot decode")
    assert_serving(broker, background)


# -- Produce: per-partition Kafka error codes, the connection stays open -----


def test_produce_missing_topic(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    presp = produce(broker, "no-such-topic", 0, batch(b"REJECTED-missing-topic"))
    assert presp.error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert presp.base_offset == -1
    # auto.create.topics.enable=false: producing did not create it
    with Admin(broker.bootstrap) as admin:
        assert "no-such-topic" not in admin.list_topics()
    assert_serving(broker, background)


def test_produce_missing_partition(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    presp = produce(broker, TOPIC, 7, batch(b"REJECTED-missing-partition"))
    assert presp.error_code == UNKNOWN_TOPIC_OR_PARTITION
    presp = produce(broker, TOPIC, -1, batch(b"REJECTED-negative-partition"))
    assert presp.error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert_serving(broker, background)


def test_produce_bad_crc(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    produce_valid(broker, "before-crc")
    data = bytearray(batch(b"REJECTED-bad-crc"))
    data[-3] ^= 0x01  # flip a bit in the record value; the CRC no longer matches
    presp = produce(broker, TOPIC, 0, bytes(data))
    assert presp.error_code == CORRUPT_MESSAGE
    assert presp.base_offset == -1
    assert "CRC" in (presp.error_message or "")
    assert_serving(broker, background)


def test_produce_wrong_magic(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    data = bytearray(batch(b"REJECTED-magic-1"))
    data[MAGIC_OFFSET] = 1
    update_crc(data)  # a consistent batch apart from the magic byte
    presp = produce(broker, TOPIC, 0, bytes(data))
    # Kafka: "Produce requests with version 3+ are only allowed to contain record
    # batches with magic version 2" is an InvalidRecordException → INVALID_RECORD
    assert presp.error_code == INVALID_RECORD
    assert "magic" in (presp.error_message or "")
    data[MAGIC_OFFSET] = 0xFF  # magic -1
    presp = produce(broker, TOPIC, 0, bytes(data))
    assert presp.error_code in (INVALID_RECORD, CORRUPT_MESSAGE)
    assert_serving(broker, background)


@pytest.mark.parametrize("delta", [+10, -10, +1_000_000])
def test_produce_batch_length_disagrees_with_bytes(
    broker: EmbeddedBroker, background: BackgroundProducer, delta: int
) -> None:
    data = bytearray(batch(b"REJECTED-batch-length", b"REJECTED-batch-length-2"))
    (length,) = _I32.unpack_from(data, BATCH_LENGTH_OFFSET)
    _I32.pack_into(data, BATCH_LENGTH_OFFSET, length + delta)
    presp = produce(broker, TOPIC, 0, bytes(data))
    assert presp.error_code == CORRUPT_MESSAGE, presp
    assert presp.base_offset == -1
    assert_serving(broker, background)


def test_produce_truncated_batch_header(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    data = batch(b"REJECTED-short-header")
    presp = produce(broker, TOPIC, 0, data[:40])
    assert presp.error_code == CORRUPT_MESSAGE
    assert_serving(broker, background)


def test_produce_two_batches_in_one_partition(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    data = batch(b"REJECTED-two-batches-1") + batch(b"REJECTED-two-batches-2")
    presp = produce(broker, TOPIC, 0, data)
    assert presp.error_code == INVALID_RECORD
    assert presp.base_offset == -1
    assert_serving(broker, background)


def test_produce_no_batch(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    presp = produce(broker, TOPIC, 0, b"")
    assert presp.error_code == INVALID_RECORD
    assert_serving(broker, background)


@pytest.mark.parametrize("acks", [5, -2, 2])
def test_produce_invalid_acks(broker: EmbeddedBroker, background: BackgroundProducer, acks: int) -> None:
    presp = produce(broker, TOPIC, 0, batch(b"REJECTED-acks-%d" % acks), acks=acks)
    assert presp.error_code == INVALID_REQUIRED_ACKS
    assert presp.base_offset == -1
    assert_serving(broker, background)


def test_produce_mixed_request_rejects_only_the_bad_partition(
    broker: EmbeddedBroker, background: BackgroundProducer
) -> None:
    bad = bytearray(batch(b"REJECTED-mixed"))
    bad[-3] ^= 0x01
    with Connection(broker.bootstrap) as conn:
        resp = conn.request(
            PRODUCE,
            9,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout": 10000,
                "topic_data": [
                    {
                        "name": TOPIC,
                        "partition_data": [
                            {"index": 0, "records": bytes(bad)},
                            {"index": 3, "records": batch(b"REJECTED-mixed-missing")},
                        ],
                    },
                    {"name": "no-such-topic", "partition_data": [{"index": 0, "records": batch(b"REJECTED-x")}]},
                ],
            },
        )
    codes = {(t.name, p.index): p.error_code for t in resp.responses for p in t.partition_responses}
    assert codes == {
        (TOPIC, 0): CORRUPT_MESSAGE,
        (TOPIC, 3): UNKNOWN_TOPIC_OR_PARTITION,
        ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert_serving(broker, background)


# -- Produce with acks=0: no answer, so a failed partition closes the connection --------


def acks0_frame(correlation_id: int, topic: str, partitions: dict[int, bytes]) -> bytes:
    entity = materialize(
        request_type(PRODUCE, 9),
        {
            "transactional_id": None,
            "acks": 0,
            "timeout": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": i, "records": r} for i, r in partitions.items()]}],
        },
    )
    return framed(header(PRODUCE, 9, correlation_id, tags=True) + encode_request(entity))


@pytest.mark.parametrize(("topic", "partition"), [("no-such-topic", 0), (TOPIC, 7)])
def test_produce_acks0_failure_closes_connection(
    broker: EmbeddedBroker, background: BackgroundProducer, topic: str, partition: int
) -> None:
    """Kafka closes the connection when any partition of an acks=0 Produce fails, so that the
    client (which gets no answer) notices and refreshes its metadata."""
    line = expect_close(broker, acks0_frame(1, topic, {partition: batch(b"REJECTED-acks0")}), "acks=0")
    assert f"{topic}-{partition}" in line and "UNKNOWN_TOPIC_OR_PARTITION" in line.upper(), line
    assert_serving(broker, background)


def _offset_of(broker: EmbeddedBroker, value: bytes) -> int:
    """Where ``value`` landed in TOPIC (acks=0 answers nothing: wait until it is durable and readable)."""
    deadline = time.monotonic() + 5
    while True:
        _hw, records = fetch_all(broker, TOPIC, 0)
        found = [o for o, v in records if v == value]
        if found or time.monotonic() > deadline:
            (offset,) = found
            return offset
        time.sleep(0.02)


def test_produce_acks0_success_keeps_connection(broker: EmbeddedBroker, background: BackgroundProducer) -> None:
    sock = connect(broker)
    try:
        sock.sendall(acks0_frame(1, TOPIC, {0: batch(b"valid-acks0")}))
        # the next request on the same connection is answered: nothing was closed
        sock.sendall(framed(header(API_VERSIONS, 0, 2)))
        answer = recv_frame(sock)
        assert _I32.unpack_from(answer, 0)[0] == 2
    finally:
        sock.close()
    accepted.append((_offset_of(broker, b"valid-acks0"), b"valid-acks0"))
    assert_serving(broker, background)


def test_produce_acks0_mixed_appends_the_good_partition_then_closes(
    broker: EmbeddedBroker, background: BackgroundProducer
) -> None:
    """As in Kafka, the valid partitions of the request are appended; the connection is closed after."""
    expect_close(broker, acks0_frame(1, TOPIC, {0: batch(b"valid-acks0-mixed"), 5: batch(b"REJECTED-acks0-mixed")}), "acks=0")
    accepted.append((_offset_of(broker, b"valid-acks0-mixed"), b"valid-acks0-mixed"))
    assert_serving(broker, background)


# -- afterwards --------------------------------------------------------------


@pytest.mark.parametrize("count", [16_777_217, 10_001])
def test_create_topics_with_too_many_partitions_is_a_policy_violation(
    broker: EmbeddedBroker, background: BackgroundProducer, count: int
) -> None:
    """A fuzzed CreateTopics asked for 16,777,217 partitions and stalled the broker creating
    directories; Kafka's controller refuses more than 10,000 per request, for every topic."""
    with Connection(broker.bootstrap) as c:
        r = c.request(19, 4, {"topics": [
            {"name": f"huge-{count}", "num_partitions": count, "replication_factor": 1, "assignments": [], "configs": []},
            {"name": f"small-{count}", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []},
        ], "timeout_ms": 60000, "validate_only": False})
        assert [(t.name, t.error_code) for t in r.topics] == [(f"huge-{count}", 44), (f"small-{count}", 44)]
        assert r.topics[0].error_message == "Excessively large number of partitions per request."
        r = c.request(37, 1, {"topics": [{"name": f"small-{count}", "count": count, "assignments": None}],
                              "timeout": 1000, "validate_only": False})
        assert r.results[0].error_code == 3  # not created above
        c.request(19, 4, {"topics": [{"name": f"grow-{count}", "num_partitions": 1, "replication_factor": 1,
                                      "assignments": [], "configs": []}], "timeout_ms": 60000, "validate_only": False})
        r = c.request(37, 1, {"topics": [{"name": f"grow-{count}", "count": count + 1, "assignments": None}],
                              "timeout": 1000, "validate_only": False})
        assert (r.results[0].error_code, r.results[0].error_message) == (44, "Excessively large number of partitions per request.")
    with Admin(broker.bootstrap) as admin:
        assert f"huge-{count}" not in admin.list_topics()
        assert len(admin.topic_summary(f"grow-{count}")["partitions"]) == 1
    assert_serving(broker, background)


def test_zz_rejected_data_unreadable_and_partition_still_writable(
    broker: EmbeddedBroker, background: BackgroundProducer
) -> None:
    produce_valid(broker, "after-all")
    hw, records = fetch_all(broker, TOPIC, 0)
    values = [v for _o, v in records]
    assert not [v for v in values if v is None or b"REJECTED" in v], values
    assert records == accepted  # exactly the accepted writes, at their offsets
    assert hw == len(accepted) == accepted[-1][0] + 1
    assert values[-1] == b"valid-after-all"


def test_zz_background_producer_lost_nothing(
    broker: EmbeddedBroker, background: BackgroundProducer, kit: Any
) -> None:
    background.finish()
    assert not background.errors, background.errors[:5]
    acked = dict(background.acked)
    assert len(acked) == background.sent > 100
    with Admin(broker.bootstrap) as admin:
        info = admin.topic_summary(BG_TOPIC)
    assert info is not None
    ends = {p["partition"]: p["high_watermark"] for p in info["partitions"]}
    assert sum(ends.values()) == len(acked)
    got = kit.confluent_consume_all(broker.bootstrap, BG_TOPIC, ends)
    consumed = {(p, m.offset()): m.value() for p, msgs in got.items() for m in msgs}
    missing = {k: v for k, v in acked.items() if consumed.get(k) != v}
    assert not missing, f"{len(missing)} acknowledged records lost or changed, e.g. {list(missing.items())[:3]}"
    assert len(consumed) == len(acked)

