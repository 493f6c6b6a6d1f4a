"""Capture golden request/response frames from real Kafka clients.

A small asyncio TCP proxy on loopback sits between a client and a real
:class:`~oncelog.testing.embedded.EmbeddedBroker`. The broker advertises the
proxy's port (``advertised.listeners``), so Metadata sends the client back
through the proxy for every connection. The proxy forwards bytes unchanged in
both directions and, on the side, splits each direction into frames
(:class:`oncelog.protocol.framing.FrameDecoder`), parses request headers
(:mod:`oncelog.protocol.headers`) and pairs every response with its request by
correlation id (per connection). Each pair is written as::

    <api>_request_v<N>_<NNN>.bin    request header + body (no length prefix)
    <api>_response_v<N>_<NNN>.bin   response header + body (no length prefix)

where ``api`` is kio's snake_case API name and ``NNN`` counts pairs per
API/version. At most ``--max-per-version`` pairs are kept per API/version,
one per client first (the largest), so different clients' encodings of the
same version are both kept.

Run from the repository root::

    .venv/bin/python tests/golden/capture.py            # writes tests/golden/

It replaces the ``*.bin`` files and regenerates ``README.md`` there.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from oncelog.protocol.codec import api_name
from oncelog.protocol.framing import FrameDecoder
from oncelog.protocol.headers import HeaderError, parse_request_header_prefix
from oncelog.testing.embedded import EmbeddedBroker, free_port

HERE = Path(__file__).resolve().parent
_CORR = struct.Struct(">i")


@dataclass
class Exchange:
    client: str
    api_key: int
    version: int
    request: bytes
    response: bytes


class Recorder:
    """Collects request/response pairs; ``label`` names the client session."""

    def __init__(self) -> None:
        self.label = "?"
        self.exchanges: list[Exchange] = []
        self.unanswered: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def add(self, ex: Exchange) -> None:
        with self.lock:
            self.exchanges.append(ex)


class CaptureProxy:
    """Loopback proxy ``127.0.0.1:listen_port`` -> ``127.0.0.1:upstream_port`` on its own event loop thread."""

    def __init__(self, listen_port: int, upstream_port: int, recorder: Recorder) -> None:
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.recorder = recorder
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="capture-proxy", daemon=True)
        self.server: asyncio.base_events.Server | None = None

    def start(self) -> "CaptureProxy":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._on_client, "127.0.0.1", self.listen_port)

    def stop(self) -> None:
        async def _stop() -> None:
            if self.server is not None:
                self.server.close()
                await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _on_client(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            b_reader, b_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            c_writer.close()
            return
        pending: dict[int, tuple[str, int, int, bytes]] = {}

        def on_request(frame: bytes) -> None:
            try:
                header, _ = parse_request_header_prefix(frame)
            except HeaderError:
                return
            pending[header.correlation_id] = (self.recorder.label, header.api_key, header.api_version, frame)

        def on_response(frame: bytes) -> None:
            if len(frame) < 4:
                return
            (corr,) = _CORR.unpack_from(frame)
            req = pending.pop(corr, None)
            if req is not None:
                label, key, version, request = req
                self.recorder.add(Exchange(label, key, version, request, frame))

        await asyncio.gather(
            self._pump(c_reader, b_writer, on_request),
            self._pump(b_reader, c_writer, on_response),
        )
        for label, key, version, _ in pending.values():  # e.g. an API the broker closed on
            self.recorder.unanswered.append((label, key, version))

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_frame: Callable[[bytes], None]) -> None:
        decoder = FrameDecoder(max_frame_bytes=1 << 30)
        try:
            while data := await reader.read(65536):
                writer.write(data)  # forwarded unchanged
                for frame in decoder.feed(data):
                    on_frame(frame)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


# -- client sessions -----------------------------------------------------------

N_RECORDS = 3


def _records(client: str) -> list[tuple[bytes, bytes]]:
    return [(f"k{i}".encode(), f"{client} golden record {i}".encode()) for i in range(N_RECORDS)]


def session_confluent(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(20)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False, "compression.type": "none", "linger.ms": 50}
    )
    for key, value in _records("confluent-kafka"):
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(20) == 0
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "golden-unused", "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < N_RECORDS and time.monotonic() < deadline:
            got += [m for m in consumer.consume(10, 0.5) if not m.error()]
        assert len(got) == N_RECORDS, got
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False) == (0, N_RECORDS)
        assert topic in consumer.list_topics(timeout=10).topics
    finally:
        consumer.close()


def session_kafka_python(bootstrap: str, topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="golden-kafka-python")
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        producer = KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, compression_type=None, linger_ms=50
        )
        for key, value in _records("kafka-python"):
            producer.send(topic, key=key, value=value, partition=0)
        producer.flush(20)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            got: list[Any] = []
            deadline = time.monotonic() + 30
            while len(got) < N_RECORDS and time.monotonic() < deadline:
                for msgs in consumer.poll(500).values():
                    got += msgs
            assert len(got) == N_RECORDS, got
            assert consumer.end_offsets([tp]) == {tp: N_RECORDS}
            assert consumer.beginning_offsets([tp]) == {tp: 0}
        finally:
            consumer.close()
        assert topic in admin.list_topics()
    finally:
        admin.close()


def session_aiokafka(bootstrap: str, topic: str) -> None:
    async def main() -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="golden-aiokafka")
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, compression_type=None, linger_ms=50
            )
            await producer.start()
            try:
                batch = producer.create_batch()
                for key, value in _records("aiokafka"):
                    batch.append(key=key, value=value, timestamp=None)
                await (await producer.send_batch(batch, topic, partition=0))
            finally:
                await producer.stop()
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
            await consumer.start()
            try:
                tp = TopicPartition(topic, 0)
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                got: list[Any] = []
                deadline = time.monotonic() + 30
                while len(got) < N_RECORDS and time.monotonic() < deadline:
                    for msgs in (await consumer.getmany(timeout_ms=500)).values():
                        got += msgs
                assert len(got) == N_RECORDS, got
                assert await consumer.end_offsets([tp]) == {tp: N_RECORDS}
                assert await consumer.beginning_offsets([tp]) == {tp: 0}
            finally:
                await consumer.stop()
            assert topic in await admin.list_topics()
        finally:
            await admin.close()

    asyncio.run(main())


SESSIONS: dict[str, Callable[[str, str], None]] = {
    "confluent-kafka": session_confluent,
    "kafka-python": session_kafka_python,
    "aiokafka": session_aiokafka,
}


def topic_for(client: str) -> str:
    return "golden-" + client


# -- selection and output --------------------------------------------------------


def select(exchanges: list[Exchange], max_per_version: int) -> list[Exchange]:
    """At most ``max_per_version`` pairs per API/version, different clients first.

    Among a client's pairs of one API/version the largest is preferred: it is
    the Metadata naming a topic rather than the bootstrap one, the Fetch whose
    response carries records rather than an empty long poll.
    """
    def size(ex: Exchange) -> int:
        return len(ex.request) + len(ex.response)

    order = sorted(range(len(exchanges)), key=lambda i: (-size(exchanges[i]), i))
    chosen: list[int] = []
    count: Counter[tuple[int, int]] = Counter()
    seen: set[tuple[int, int, str]] = set()
    # pass 1: the largest pair of each client for each API/version
    for i in order:
        ex = exchanges[i]
        key = (ex.api_key, ex.version)
        if (ex.api_key, ex.version, ex.client) not in seen and count[key] < max_per_version:
            seen.add((ex.api_key, ex.version, ex.client))
            count[key] += 1
            chosen.append(i)
    # pass 2: fill the remaining slots with requests unlike those kept
    # (compared from the client_id on, i.e. without api key, version, correlation id)
    kept = {exchanges[i].request[8:] for i in chosen}
    for i in order:
        ex = exchanges[i]
        key = (ex.api_key, ex.version)
        if i in chosen or count[key] >= max_per_version or ex.request[8:] in kept:
            continue
        count[key] += 1
        kept.add(ex.request[8:])
        chosen.append(i)
    return [exchanges[i] for i in sorted(chosen)]


def write(out: Path, chosen: list[Exchange]) -> list[tuple[str, str, str, int]]:
    for old in out.glob("*.bin"):
        old.unlink()
    numbers: Counter[tuple[int, int]] = Counter()
    rows = []
    for ex in chosen:
        key = (ex.api_key, ex.version)
        n = numbers[key]
        numbers[key] += 1
        for kind, data in (("request", ex.request), ("response", ex.response)):
            name = f"{api_name(ex.api_key)}_{kind}_v{ex.version}_{n:03d}.bin"
            (out / name).write_bytes(data)
            rows.append((name, ex.client, kind, len(data)))
    return sorted(rows)


README_HEAD = """\
# Golden protocol fixtures

Real request and response frames exchanged between real Kafka clients and an
oncelog broker, used by `tests/unit/test_golden.py` to check that the
protocol layer parses what clients really send (and re-encodes it byte for
byte), that responses decode, and that the broker's dispatcher answers every
captured request with a response of the right schema.

## What a file is

`<api>_<request|response>_v<N>_<NNN>.bin` holds one frame **without** its
4-byte length prefix:

- `*_request_*`: request header (v1, or v2 with its tagged-field block for
  flexible versions) followed by the request body;
- `*_response_*`: response header (v0, or v1 for flexible versions except
  ApiVersions, which always uses v0) followed by the response body.

`<api>` is kio's snake_case API name (`produce`, `fetch`, `list_offsets`,
...), `<N>` the API version the client sent, and `<NNN>` a counter per
API/version; a request and the response with the same API, version and
counter belong together (same correlation id).

## How they were made

    .venv/bin/python tests/golden/capture.py

`capture.py` starts an `EmbeddedBroker` whose `advertised.listeners` point at
a loopback proxy (asyncio) in front of it, so every client connection goes
through the proxy. The proxy forwards bytes unchanged and, on the side, splits
both directions into frames and pairs each response with its request by
correlation id. It then drives one short session per client: create a
one-partition topic `golden-<client>`, produce {n} records (acks=all, no
compression, no idempotence), consume them back with a manually assigned
consumer (no group), list offsets and fetch metadata. At most {m} pairs are
kept per API/version (one per client first, the largest: a Metadata naming a
topic, a Fetch returning records) and the `*.bin` files here are replaced.
The frames carry wall-clock timestamps, topic ids and a cluster id, so a new
capture changes bytes but not structure; the tests check values that do not
depend on those (topic names, record values, offsets, error codes).

Client versions: {versions}.

## Files

| file | client | kind | bytes |
| --- | --- | --- | --- |
"""


def write_readme(out: Path, rows: list[tuple[str, str, str, int]], max_per_version: int, unanswered: list[Any]) -> None:
    versions = []
    for mod, label in (("confluent_kafka", "confluent-kafka"), ("kafka", "kafka-python"), ("aiokafka", "aiokafka")):
        try:
            m = __import__(mod)
            v = m.__version__
            extra = f" (librdkafka {m.libversion()[0]})" if mod == "confluent_kafka" else ""
            versions.append(f"{label} {v}{extra}")
        except Exception:  # pragma: no cover
            versions.append(label)
    text = README_HEAD.format(n=N_RECORDS, m=max_per_version, versions=", ".join(versions))
    text += "".join(f"| `{name}` | {client} | {kind} | {size} |\n" for name, client, kind, size in rows)
    total = sum(r[3] for r in rows)
    text += f"\n{len(rows)} files, {total} bytes.\n"
    if unanswered:
        names = sorted({f"{api_name(k)} v{v} ({c})" for c, k, v in unanswered})
        text += (
            "\nRequests still unanswered when their connection closed (a Fetch long "
            "poll cut short by the client closing, or an API the broker does not "
            "implement and closes the connection on) are not kept. In this capture: "
            + ", ".join(names) + ".\n"
        )
    (out / "README.md").write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--clients", default=",".join(SESSIONS))
    parser.add_argument("--max-per-version", type=int, default=2)
    args = parser.parse_args(argv)

    recorder = Recorder()
    proxy_port = free_port()
    broker = EmbeddedBroker(config={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}"})
    with broker:
        proxy = CaptureProxy(proxy_port, broker.port, recorder).start()
        bootstrap = f"127.0.0.1:{proxy_port}"
        try:
            for client in args.clients.split(","):
                recorder.label = client
                SESSIONS[client](bootstrap, topic_for(client))
                time.sleep(0.5)  # let the client's last connections close
        finally:
            proxy.stop()
    chosen = select(recorder.exchanges, args.max_per_version)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = write(args.out, chosen)
    write_readme(args.out, rows, args.max_per_version, recorder.unanswered)
    total = sum(r[3] for r in rows)
    print(f"{len(recorder.exchanges)} exchanges captured, {len(rows)} files written ({total} bytes) to {args.out}")
    for label, key, version in sorted(set(recorder.unanswered)):
        print(f"  unanswered: {label} {api_name(key)} v{version}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
