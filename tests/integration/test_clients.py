"""Round trips with real third-party clients: confluent-kafka, kafka-python, aiokafka
and oncelog's own producer and consumer (``oncelog.client``), each against all the others.

Each client produces 20,000 records (5,000 per compression codec: gzip,
snappy, lz4, zstd) with unique keys, ids in the values, headers and explicit
timestamps, acks=all, spread over 4 partitions, and records every delivery
offset.  Then every client reads every producer's topic back from offset 0 by
manual assignment (groups are covered by test_groups_clients.py): the diagonal of the matrix is the
per-client round trip, the rest is the cross-client check.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from oncelog.testing import EmbeddedBroker

pytestmark = [
    pytest.mark.timeout(240),
    # kafka-python loads its protocol schemas with deprecated importlib.resources calls
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

PARTITIONS = 4
CODECS = ("gzip", "snappy", "lz4", "zstd")
PER_CODEC = 5_000
TOTAL = PER_CODEC * len(CODECS)
FIND_COORDINATOR = 10
CLIENTS = ("confluent", "kafkapython", "aiokafka")
PRODUCE_TIMEOUT = 90.0
CONSUME_TIMEOUT = 90.0
# explicit CreateTime timestamps: a fixed recent base (inside the default 7-day
# retention) plus a per-record step, so each id has its own timestamp
BASE_TS = (int(time.time() * 1000) // 1000) * 1000 - 3_600_000


# -- the records ---------------------------------------------------------------


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


def rid(codec_index: int, n: int) -> int:
    return codec_index * PER_CODEC + n


def make(i: int, codec: str, client: str) -> tuple[int, bytes, bytes, list[tuple[str, bytes]], int]:
    """Deterministic content of record ``i``: (partition, key, value, headers, timestamp)."""
    partition = (i * 7 + i // 13) % PARTITIONS  # interleaved, uneven runs per partition
    key = f"{client}-key-{i:06d}".encode()
    pad = ("abcdefghij" * (1 + i % 23))[: 5 + (i * 31) % 200]
    value = f'{{"id":{i},"codec":"{codec}","client":"{client}","pad":"{pad}"}}'.encode()
    headers = [("id", str(i).encode())]
    if i % 2 == 0:
        headers.append(("codec", codec.encode()))
    if i % 5 == 0:
        headers.append(("bin", bytes([i % 256, 0, 255, (i >> 8) % 256])))
    ts = BASE_TS + i * 3
    return partition, key, value, headers, ts


def id_of(value: bytes) -> int:
    head = value.split(b",", 1)[0]
    assert head.startswith(b'{"id":'), value[:60]
    return int(head[6:])


@dataclass
class Produced:
    client: str
    topic: str
    # id -> acknowledged (partition, offset)
    acks: dict[int, tuple[int, int]] = field(default_factory=dict)
    # partition -> ids in the order the producer was asked to send them
    send_order: dict[int, list[int]] = field(default_factory=lambda: {p: [] for p in range(PARTITIONS)})
    # codec -> ids
    by_codec: dict[str, list[int]] = field(default_factory=dict)
    codec_of: dict[int, str] = field(default_factory=dict)

    def note_send(self, i: int, codec: str, partition: int) -> None:
        self.send_order[partition].append(i)
        self.by_codec.setdefault(codec, []).append(i)
        self.codec_of[i] = codec

    def expected(self, i: int) -> Rec:
        partition, key, value, headers, ts = make(i, self.codec_of[i], self.client)
        ack_p, ack_off = self.acks[i]
        assert ack_p == partition
        return Rec(partition, ack_off, key, value, tuple(headers), ts)

    def end_offsets(self) -> dict[int, int]:
        return {p: len(ids) for p, ids in self.send_order.items()}


# -- producers -------------------------------------------------------------------


def produce_confluent(bootstrap: str, topic: str) -> Produced:
    from confluent_kafka import KafkaException, Producer

    out = Produced("confluent", topic)
    errors: list[str] = []
    for ci, codec in enumerate(CODECS):
        p = Producer({
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 10,
            "enable.idempotence": False,
            "message.timeout.ms": int(PRODUCE_TIMEOUT * 1000),
        })

        def on_delivery(err, msg, _out=out):  # type: ignore[no-untyped-def]
            if err is not None:
                errors.append(str(err))
                return
            i = id_of(msg.value())
            assert i not in _out.acks, f"duplicate delivery report for {i}"
            _out.acks[i] = (msg.partition(), msg.offset())

        for n in range(PER_CODEC):
            i = rid(ci, n)
            partition, key, value, headers, ts = make(i, codec, out.client)
            out.note_send(i, codec, partition)
            while True:
                try:
                    p.produce(topic, value=value, key=key, partition=partition, headers=headers,
                              timestamp=ts, on_delivery=on_delivery)
                    break
                except BufferError:
                    p.poll(0.1)
            p.poll(0)
        remaining = p.flush(PRODUCE_TIMEOUT)
        assert remaining == 0, f"{remaining} confluent messages undelivered ({codec})"
        if errors:
            raise KafkaException(errors[0])
    return out


def produce_kafkapython(bootstrap: str, topic: str) -> Produced:
    from kafka import KafkaProducer

    out = Produced("kafkapython", topic)
    for ci, codec in enumerate(CODECS):
        p = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            compression_type=codec,
            enable_idempotence=False,
            linger_ms=10,
            request_timeout_ms=30_000,
        )
        try:
            futures = []
            for n in range(PER_CODEC):
                i = rid(ci, n)
                partition, key, value, headers, ts = make(i, codec, out.client)
                out.note_send(i, codec, partition)
                futures.append((i, p.send(topic, value=value, key=key, headers=headers,
                                          partition=partition, timestamp_ms=ts)))
            p.flush(timeout=PRODUCE_TIMEOUT)
            for i, fut in futures:
                md = fut.get(timeout=PRODUCE_TIMEOUT)
                out.acks[i] = (md.partition, md.offset)
        finally:
            p.close(timeout=10)
    return out


def produce_aiokafka(bootstrap: str, topic: str) -> Produced:
    from aiokafka import AIOKafkaProducer

    out = Produced("aiokafka", topic)

    async def run() -> None:
        for ci, codec in enumerate(CODECS):
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type=codec,
                                 enable_idempotence=False, linger_ms=10)
            await p.start()
            try:
                futures = []
                for n in range(PER_CODEC):
                    i = rid(ci, n)
                    partition, key, value, headers, ts = make(i, codec, out.client)
                    out.note_send(i, codec, partition)
                    fut = await p.send(topic, value=value, key=key, headers=headers,
                                       partition=partition, timestamp_ms=ts)
                    futures.append((i, fut))
                await p.flush()
                for i, fut in futures:
                    md = await asyncio.wait_for(fut, PRODUCE_TIMEOUT)
                    out.acks[i] = (md.partition, md.offset)
            finally:
                await p.stop()

    asyncio.run(asyncio.wait_for(run(), PRODUCE_TIMEOUT * 2))
    return out


def produce_oncelog(bootstrap: str, topic: str) -> Produced:
    """oncelog's own blocking producer (``oncelog.client.Producer``), idempotent by default."""
    from oncelog.client import Producer

    out = Produced("oncelog", topic)
    for ci, codec in enumerate(CODECS):
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 10})
        try:
            futures = []
            for n in range(PER_CODEC):
                i = rid(ci, n)
                partition, key, value, headers, ts = make(i, codec, out.client)
                out.note_send(i, codec, partition)
                futures.append((i, p.produce(topic, value, key=key, partition=partition, headers=headers,
                                             timestamp=ts)))
            assert p.flush(PRODUCE_TIMEOUT) == 0
            for i, fut in futures:
                md = fut.result(PRODUCE_TIMEOUT)
                assert (md.topic, md.timestamp) == (topic, make(i, codec, out.client)[4])
                out.acks[i] = (md.partition, md.offset)
        finally:
            p.close(10)
    return out


PRODUCERS: dict[str, Callable[[str, str], Produced]] = {
    "confluent": produce_confluent,
    "kafkapython": produce_kafkapython,
    "aiokafka": produce_aiokafka,
    "oncelog": produce_oncelog,
}
PRODUCER_CLIENTS = (*CLIENTS, "oncelog")


# -- consumers (manual assignment from offset 0, read_uncommitted) ---------------


def consume_confluent(kit: Any, bootstrap: str, topic: str, ends: dict[int, int]) -> list[Rec]:
    from confluent_kafka import TIMESTAMP_CREATE_TIME

    msgs = kit.confluent_consume_all(bootstrap, topic, ends, timeout=CONSUME_TIMEOUT)
    out = []
    for p, lst in msgs.items():
        for m in lst:
            ts_type, ts = m.timestamp()
            assert ts_type == TIMESTAMP_CREATE_TIME, (p, m.offset(), ts_type)
            out.append(Rec(p, m.offset(), m.key(), m.value(), tuple(m.headers() or ()), ts))
    return out


def consume_kafkapython(_kit: Any, bootstrap: str, topic: str, ends: dict[int, int]) -> list[Rec]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                      auto_offset_reset="none", isolation_level="read_uncommitted",
                      max_poll_records=5000)
    out = []
    try:
        tps = [TopicPartition(topic, p) for p in ends]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        pos = {p: 0 for p in ends}
        deadline = time.monotonic() + CONSUME_TIMEOUT
        while any(pos[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"kafka-python consume timed out at {pos}, want {ends}"
            for tp, records in c.poll(timeout_ms=500).items():
                for r in records:
                    assert r.timestamp_type == 0, (tp, r.offset, r.timestamp_type)
                    out.append(Rec(tp.partition, r.offset, r.key, r.value,
                                   tuple((k, v) for k, v in r.headers), r.timestamp))
                    pos[tp.partition] = r.offset + 1
    finally:
        c.close()
    return out


def consume_aiokafka(_kit: Any, bootstrap: str, topic: str, ends: dict[int, int]) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> list[Rec]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             auto_offset_reset="none", isolation_level="read_uncommitted")
        await c.start()
        out = []
        try:
            tps = [TopicPartition(topic, p) for p in ends]
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)
            pos = {p: 0 for p in ends}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + CONSUME_TIMEOUT
            while any(pos[p] < ends[p] for p in ends):
                assert loop.time() < deadline, f"aiokafka consume timed out at {pos}, want {ends}"
                batches = await c.getmany(*tps, timeout_ms=500, max_records=5000)
                for tp, records in batches.items():
                    for r in records:
                        assert r.timestamp_type == 0, (tp, r.offset, r.timestamp_type)
                        out.append(Rec(tp.partition, r.offset, r.key, r.value,
                                       tuple((k, v) for k, v in r.headers), r.timestamp))
                        pos[tp.partition] = r.offset + 1
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


def consume_oncelog(_kit: Any, bootstrap: str, topic: str, ends: dict[int, int]) -> list[Rec]:
    """oncelog's own blocking consumer (``oncelog.client.Consumer``), manual assignment."""
    from oncelog.client import Consumer, TopicPartition

    out = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "none"}) as c:
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        pos = {p: 0 for p in ends}
        deadline = time.monotonic() + CONSUME_TIMEOUT
        while any(pos[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"oncelog consume timed out at {pos}, want {ends}"
            for m in c.consume(5000, 0.5):
                out.append(Rec(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp))
                pos[m.partition] = m.offset + 1
        assert c.position((topic, 0)) == ends[0]
    return out


CONSUMERS: dict[str, Callable[[Any, str, str, dict[int, int]], list[Rec]]] = {
    "confluent": consume_confluent,
    "kafkapython": consume_kafkapython,
    "aiokafka": consume_aiokafka,
    "oncelog": consume_oncelog,
}
CONSUMER_CLIENTS = (*CLIENTS, "oncelog")


# -- fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory, kit: Any) -> Iterator[EmbeddedBroker]:
    b = kit.start_broker(tmp_path_factory.mktemp("clients"))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def produced(shared_broker: EmbeddedBroker, kit: Any) -> Iterator[Callable[[str], Produced]]:
    """``produced(client)`` -> that client's topic, produced once per module."""
    _produced: dict[str, Produced] = {}

    def get(client: str) -> Produced:
        if client not in _produced:
            topic = f"roundtrip-{client}"
            kit.create_topic(shared_broker.bootstrap, topic, PARTITIONS)
            _produced[client] = PRODUCERS[client](shared_broker.bootstrap, topic)
        return _produced[client]

    yield get


# -- tests --------------------------------------------------------------------------


@pytest.mark.parametrize("client", PRODUCER_CLIENTS)
def test_produce_acks(client: str, produced: Callable[[str], Produced], shared_broker: EmbeddedBroker,
                      kit: Any) -> None:
    """Every send acknowledged once, offsets dense per partition in send order,
    and every codec really stored as produced."""
    prod = produced(client)
    assert len(prod.acks) == TOTAL
    assert sorted(prod.acks) == list(range(TOTAL))
    for p, ids in prod.send_order.items():
        assert len(ids) > TOTAL // PARTITIONS // 2, f"partition {p} got too few records"
        offsets = [prod.acks[i] for i in ids]
        assert offsets == [(p, n) for n in range(len(ids))], f"partition {p}: acked offsets not dense in send order"
    for codec in CODECS:
        assert len(prod.by_codec[codec]) == PER_CODEC
    counts = kit.stored_codecs(shared_broker.data_dir, prod.topic, PARTITIONS)
    assert sum(counts.values()) == TOTAL, counts
    codecs = list(CODECS)
    if client == "confluent" and FIND_COORDINATOR not in kit.api_versions(shared_broker.bootstrap):
        # librdkafka only enables its LZ4 feature when the broker advertises
        # FindCoordinator (rdkafka_feature.c: LZ4 "depends" on FindCoordinator
        # v0, a proxy for brokers >= 0.8.2) and otherwise silently sends the
        # batch uncompressed.  Until consumer groups land, confluent's lz4
        # round is therefore stored as codec none; the other clients still
        # exercise lz4.
        codecs.remove("lz4")
        assert counts.get("lz4", 0) == 0, counts
        counts["none"] = counts.get("none", 0) - PER_CODEC
    # Clients may send a tiny batch (a record or two at the end of a round)
    # uncompressed when compression would not make it smaller (librdkafka
    # does), so allow a few uncompressed records per round, no more.
    for codec in codecs:
        assert PER_CODEC - 50 <= counts.get(codec, 0) <= PER_CODEC, counts
    assert 0 <= counts.get("none", 0) <= 50 * len(codecs), counts


@pytest.mark.parametrize("consumer", CONSUMER_CLIENTS)
@pytest.mark.parametrize("producer", PRODUCER_CLIENTS)
def test_round_trip(producer: str, consumer: str, produced: Callable[[str], Produced],
                    shared_broker: EmbeddedBroker, kit: Any) -> None:
    prod = produced(producer)
    assert len(prod.acks) == TOTAL
    got = CONSUMERS[consumer](kit, shared_broker.bootstrap, prod.topic, prod.end_offsets())

    # every id exactly once, nothing extra
    ids = [id_of(r.value) for r in got]
    assert len(ids) == TOTAL, f"read {len(ids)} records, want {TOTAL}"
    assert len(set(ids)) == TOTAL, "duplicate records"
    assert set(ids) == set(range(TOTAL))

    # per-partition order equals produce order, offsets equal the acked ones
    by_part: dict[int, list[Rec]] = {p: [] for p in range(PARTITIONS)}
    for r in got:
        by_part[r.partition].append(r)
    for p in range(PARTITIONS):
        assert [id_of(r.value) for r in by_part[p]] == prod.send_order[p], f"partition {p} order differs"
        assert [r.offset for r in by_part[p]] == [prod.acks[i][1] for i in prod.send_order[p]]

    # exact content
    mismatches = [(r, prod.expected(id_of(r.value))) for r in got if r != prod.expected(id_of(r.value))]
    assert not mismatches, f"{len(mismatches)} records differ; first: {mismatches[0]}"
