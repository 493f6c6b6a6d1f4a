"""Idempotent producers against a real broker, through a fault proxy.

Producers (librdkafka with ``enable.idempotence=true``; kafka-python with its
default config, idempotent in 3.x; oncelog's own ``oncelog.client.Producer``
with its defaults, idempotent) send 50,000 records with unique ids to 4
partitions through :class:`oncelog.testing.fault_proxy.FaultProxy`, which
drops a share of Produce responses after the broker applied the request,
sends some Produce requests twice, and closes connections at random. The
broker advertises the proxy's address, so every client connection goes
through it. Retries are therefore forced; the broker must recognise them.

Afterwards the broker is restarted cleanly *without* the advertised proxy
address (the only way a Kafka client can reach it directly, since Metadata
names one address) and a consumer reads every partition from the broker to
its high watermark, read_uncommitted: every id exactly once, per partition
in the order the producer sent them, each at the offset its delivery report
acknowledged, and nothing else in the log.

The kill -9 variant also hard-kills the broker twice mid-stream and restarts
it on the same port and data dir (small segments, so producer-state
snapshots taken at segment roll are part of the recovery) while the producer
keeps retrying. Both variants also check with DescribeProducers that the
client never had to reset its sequences (one producer id, epoch 0, last
sequence = records - 1 on every partition).

A control test runs the same faults with a non-idempotent producer and
requires duplicates in the log, so the exactly-once tests cannot pass merely
because the proxy failed to force retries. Client timeouts are short
(``socket.timeout.ms`` / ``request_timeout_ms`` 2 s) so a lost response is
retried quickly, while the per-record delivery timeout is far beyond the
test: a record that expires makes librdkafka bump its epoch, after which
in-doubt records can legitimately be written twice (librdkafka documents
this), which is not what these tests are about.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from oncelog.client.admin import Admin
from oncelog.client.connection import Connection
from oncelog.testing import EmbeddedBroker, free_port
from oncelog.testing.fault_proxy import FaultProxy

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

PARTITIONS = 4
N = 50_000
DESCRIBE_PRODUCERS = 61
INIT_PRODUCER_ID = 22
PRODUCE_TIMEOUT = 150.0  # whole production, faults and restarts included
DELIVERY_TIMEOUT_MS = 300_000  # per record: far beyond the test, so no record expires
# per connection a lost response costs the client one socket timeout before it
# retries; keep it short so ~20 drops fit in the time budget
CLIENT_TIMEOUT_MS = 2_000

FAULTS: dict[str, Any] = {
    "drop_response_rate": 0.04,  # Produce responses lost after the append
    "duplicate_rate": 0.02,  # Produce requests delivered twice
    "close_rate": 0.005,  # any frame, either direction
}


# -- records -------------------------------------------------------------------


def partition_of(i: int) -> int:
    return (i * 7 + i // 13) % PARTITIONS  # interleaved, uneven runs


def value_of(client: str, i: int) -> bytes:
    pad = b"abcdefghij" * (1 + i % 9)
    return b"%s:%07d:" % (client.encode(), i) + pad


def id_of(value: bytes) -> int:
    return int(value.split(b":", 2)[1])


@dataclass
class Produced:
    client: str
    topic: str
    acks: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (partition, offset)
    send_order: dict[int, list[int]] = field(default_factory=lambda: {p: [] for p in range(PARTITIONS)})
    errors: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def ack(self, i: int, partition: int, offset: int) -> None:
        if i in self.acks:
            self.errors.append(f"second delivery report for id {i}")
        self.acks[i] = (partition, offset)


# -- producers --------------------------------------------------------------------


def produce_confluent(bootstrap: str, topic: str, n: int = N, out: Produced | None = None,
                      idempotence: bool = True) -> Produced:
    from confluent_kafka import Producer

    out = out or Produced("confluent", topic)

    def on_error(err: Any) -> None:
        if err.fatal():
            out.errors.append(f"fatal: {err}")

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": idempotence,
        "acks": "all",
        "max.in.flight.requests.per.connection": 5,
        "retries": 2**31 - 1,
        "message.timeout.ms": DELIVERY_TIMEOUT_MS,
        "socket.timeout.ms": CLIENT_TIMEOUT_MS,
        "linger.ms": 5,
        "batch.num.messages": 100,  # many requests, so many chances for faults
        "retry.backoff.ms": 50,
        "retry.backoff.max.ms": 500,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 500,
        "error_cb": on_error,
    }
    p = Producer(conf)

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            out.errors.append(str(err))
            return
        out.ack(id_of(msg.value()), msg.partition(), msg.offset())

    for i in range(n):
        part = partition_of(i)
        out.send_order[part].append(i)
        while True:
            try:
                p.produce(topic, value=value_of(out.client, i), key=b"%d" % i, partition=part,
                          on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    remaining = p.flush(PRODUCE_TIMEOUT)
    if remaining:
        out.errors.append(f"{remaining} records still undelivered after {PRODUCE_TIMEOUT}s")
    return out


def produce_kafkapython(bootstrap: str, topic: str, n: int = N, out: Produced | None = None) -> Produced:
    from kafka import KafkaProducer

    out = out or Produced("kafkapython", topic)
    # idempotence, acks, retries and max in flight stay at the 3.x defaults
    # (idempotent, acks=all, retries forever, 5); only timeouts are tuned
    conf: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "request_timeout_ms": CLIENT_TIMEOUT_MS,
        "delivery_timeout_ms": DELIVERY_TIMEOUT_MS,
        "linger_ms": 5,
        "batch_size": 4096,  # many requests, so many chances for faults
        "retry_backoff_ms": 50,
        "reconnect_backoff_ms": 20,
        "reconnect_backoff_max_ms": 500,
    }
    p = KafkaProducer(**conf)
    try:
        out.extra["idempotent"] = bool(p.config["enable_idempotence"]) and p._transaction_manager is not None
        for i in range(n):
            part = partition_of(i)
            out.send_order[part].append(i)
            fut = p.send(topic, value=value_of(out.client, i), key=b"%d" % i, partition=part)
            fut.add_callback(lambda md, i=i: out.ack(i, md.partition, md.offset))
            fut.add_errback(lambda exc, i=i: out.errors.append(f"id {i}: {exc!r}"))
        p.flush(timeout=PRODUCE_TIMEOUT)
    finally:
        p.close(timeout=10)
    return out


def produce_oncelog(bootstrap: str, topic: str, n: int = N, out: Produced | None = None,
                    idempotence: bool = True) -> Produced:
    """oncelog's own producer (``oncelog.client.Producer``), idempotent by default."""
    from oncelog.client import Producer

    out = out or Produced("oncelog", topic)
    p = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": idempotence,
        "request.timeout.ms": CLIENT_TIMEOUT_MS,
        "delivery.timeout.ms": DELIVERY_TIMEOUT_MS,
        "linger.ms": 5,
        "batch.size": 4096,  # many requests, so many chances for faults
        "retry.backoff.ms": 50,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 500,
    })

    def on_delivery(i: int, err: Any, md: Any) -> None:
        if err is not None:
            out.errors.append(f"id {i}: {err}")
        else:
            out.ack(i, md.partition, md.offset)

    try:
        out.extra["producer_id"] = p.producer_id
        for i in range(n):
            part = partition_of(i)
            out.send_order[part].append(i)
            p.produce(topic, value=value_of(out.client, i), key=b"%d" % i, partition=part,
                      on_delivery=lambda err, md, i=i: on_delivery(i, err, md))
            if i % 1000 == 0:
                p.poll(0)
        remaining = p.flush(PRODUCE_TIMEOUT)
        if remaining:
            out.errors.append(f"{remaining} records still undelivered after {PRODUCE_TIMEOUT}s")
    finally:
        p.close(10)
    return out


PRODUCERS: dict[str, Callable[..., Produced]] = {
    "confluent": produce_confluent,
    "kafkapython": produce_kafkapython,
    "oncelog": produce_oncelog,
}


# -- broker behind the proxy ---------------------------------------------------------


@dataclass
class Stack:
    broker: EmbeddedBroker
    proxy: FaultProxy

    def direct(self) -> None:
        """Clean restart without the advertised proxy address: clients now reach the broker itself."""
        self.broker.stop()
        self.broker.config.pop("advertised.listeners", None)
        self.broker.start()


@pytest.fixture
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """Proxy (paused: no faults yet) in front of a broker that advertises the proxy.

    Indirect parametrization (``parametrize("stack", [{...}], indirect=True)``)
    adds broker properties.
    """
    port = free_port()
    proxy = FaultProxy(("127.0.0.1", port), seed=20240607, connect_timeout=2.0, **FAULTS)
    proxy.pause()
    config = {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"}
    config.update(getattr(request, "param", {}))
    broker = EmbeddedBroker(data_dir=tmp_path / "data", port=port, log_path=tmp_path / "broker.log", config=config)
    proxy.start()
    try:
        broker.start()
        try:
            yield Stack(broker, proxy)
        finally:
            broker.close()
    finally:
        proxy.stop()


def create_topic(bootstrap: str, topic: str) -> None:
    with Admin(bootstrap) as admin:
        assert admin.create_topic(topic, PARTITIONS, 1) is None


def read_back(kit: Any, bootstrap: str, topic: str) -> tuple[dict[int, int], dict[int, list[tuple[int, int]]]]:
    """High watermarks and, per partition, every (offset, id) from offset 0 to them."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        c.close()
    msgs = kit.confluent_consume_all(bootstrap, topic, ends, timeout=90)
    return ends, {p: [(m.offset(), id_of(m.value())) for m in ms] for p, ms in msgs.items()}


def check_exactly_once(kit: Any, stack: Stack, prod: Produced, n: int = N) -> None:
    assert not prod.errors, f"{len(prod.errors)} delivery errors; first: {prod.errors[:3]}"
    assert len(prod.acks) == n and sorted(prod.acks) == list(range(n)), "not every record acknowledged"
    stack.direct()
    ends, got = read_back(kit, stack.broker.bootstrap, prod.topic)
    for p in range(PARTITIONS):
        sent = prod.send_order[p]
        assert len(sent) > n // PARTITIONS // 2
        ids = [i for _, i in got[p]]
        dups = len(ids) - len(set(ids))
        assert dups == 0, f"partition {p}: {dups} duplicate records"
        assert ends[p] == len(sent), f"partition {p}: log holds {ends[p]} records, producer sent {len(sent)}"
        assert ids == sent, f"partition {p}: ids not in send order (first difference at {_first_diff(ids, sent)})"
        wrong = [(off, i, prod.acks[i]) for off, i in got[p] if prod.acks[i] != (p, off)]
        assert not wrong, f"partition {p}: {len(wrong)} records not at their acknowledged offset; first {wrong[:3]}"
    # The broker never gave the client a reason to reset its sequences: one
    # producer id, epoch 0 (no KIP-360 bump), last sequence = records - 1.
    described = describe_producers(stack.broker.bootstrap, prod.topic)
    summary = {p: [(e.producer_id, e.producer_epoch, e.last_sequence) for e in es] for p, es in described.items()}
    print(f"{prod.client}: DescribeProducers (partition: [(id, epoch, last sequence)]) {summary}")
    assert len({e.producer_id for es in described.values() for e in es}) == 1, summary
    for p in range(PARTITIONS):
        assert [(e.producer_epoch, e.last_sequence) for e in described[p]] == [(0, len(prod.send_order[p]) - 1)], summary


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def describe_producers(bootstrap: str, topic: str) -> dict[int, list[Any]]:
    with Connection(bootstrap) as conn:
        resp = conn.request(DESCRIBE_PRODUCERS, 0, {
            "topics": [{"name": topic, "partition_indexes": list(range(PARTITIONS))}],
        })
    (t,) = resp.topics
    assert t.name == topic
    out = {}
    for part in t.partitions:
        assert part.error_code == 0, (part.partition_index, part.error_code, part.error_message)
        out[part.partition_index] = list(part.active_producers)
    return out


def assert_faults_injected(proxy: FaultProxy, client: str) -> dict[str, int]:
    st = proxy.stats
    summary = {
        "requests": st.requests,
        "produce_responses_dropped": st.dropped_by_api.get(0, 0),
        "produce_requests_duplicated": st.duplicated_requests,
        "connections_closed": st.closes,
        "client_connections": st.connections,
        "upstream_connect_failures": st.upstream_connect_failures,
    }
    print(f"\n{client}: proxy injected {summary}")
    assert summary["produce_responses_dropped"] >= 5, summary
    assert summary["produce_requests_duplicated"] >= 3, summary
    assert summary["connections_closed"] >= 1, summary
    return summary


@pytest.fixture(autouse=True)
def _needs_idempotence(stack: Stack, kit: Any) -> None:
    versions = kit.api_versions(stack.broker.bootstrap)
    assert INIT_PRODUCER_ID in versions and DESCRIBE_PRODUCERS in versions, "broker lacks the idempotent producer"


# -- tests ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("client", list(PRODUCERS))
def test_exactly_once_under_lost_responses_and_closes(client: str, stack: Stack, kit: Any) -> None:
    topic = f"idem-{client}"
    create_topic(stack.broker.bootstrap, topic)
    stack.proxy.resume()
    prod = PRODUCERS[client](stack.proxy.bootstrap, topic)
    stack.proxy.pause()
    if client == "kafkapython":
        assert prod.extra["idempotent"], "kafka-python did not enable idempotence"
    assert_faults_injected(stack.proxy, client)
    check_exactly_once(kit, stack, prod)


@pytest.mark.slow
# ~1.5 MB per partition: 256 KiB segments roll several times during the test, so recovery uses
# the producer-state snapshots taken at roll plus a replay of the newer batches
@pytest.mark.parametrize("stack", [{"log.segment.bytes": str(256 << 10)}], indirect=True, ids=["256KiB-segments"])
@pytest.mark.parametrize("client", list(PRODUCERS))
def test_exactly_once_across_broker_kill9(client: str, stack: Stack, kit: Any) -> None:
    """Two kill -9 + restarts (same port and data dir) while the producer retries through the proxy."""
    topic = f"idem-kill-{client}"
    create_topic(stack.broker.bootstrap, topic)
    prod = Produced(client, topic)  # filled by the producer thread as delivery reports arrive
    result: list[Produced] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(PRODUCERS[client](stack.proxy.bootstrap, topic, out=prod))
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    stack.proxy.resume()
    worker = threading.Thread(target=run, name=f"produce-{client}", daemon=True)
    worker.start()
    acked_at_kill: list[int] = []
    for share in (0.25, 0.6):
        kit.wait_until(lambda: result or failure or len(prod.acks) >= share * N,
                       timeout=PRODUCE_TIMEOUT, message=f"{share:.0%} of records acknowledged")
        assert not result and not failure, "production ended before the broker could be killed"
        acked_at_kill.append(len(prod.acks))
        failures_before = stack.proxy.stats.upstream_connect_failures
        stack.broker.kill()
        # the client really tried to reach the dead broker before it came back
        kit.wait_until(lambda: stack.proxy.stats.upstream_connect_failures > failures_before, timeout=20,
                       message="a client connection attempt while the broker is down")
        stack.broker.start()
    worker.join(PRODUCE_TIMEOUT + 30)
    assert not worker.is_alive(), "producer did not finish"
    stack.proxy.pause()
    if failure:
        raise failure[0]
    if client == "kafkapython":
        assert prod.extra["idempotent"], "kafka-python did not enable idempotence"
    print(f"\n{client}: broker killed at {acked_at_kill} acknowledged records")
    assert all(a < N for a in acked_at_kill)
    assert_faults_injected(stack.proxy, client)
    snapshots = sorted(stack.broker.data_dir.glob(f"{topic}-*/*.snapshot"))
    segments = sorted(stack.broker.data_dir.glob(f"{topic}-*/*.log"))
    assert len(segments) > PARTITIONS and snapshots, "segments did not roll, no producer snapshot taken"
    print(f"{client}: {len(segments)} segments, {len(snapshots)} producer snapshots")
    check_exactly_once(kit, stack, prod)


def test_control_same_faults_duplicate_without_idempotence(stack: Stack, kit: Any) -> None:
    """The faults are real: a non-idempotent producer under them leaves duplicates in the log.

    This is what makes the exactly-once tests above meaningful: the same
    proxy settings produce exactly the anomaly they check for when the
    broker cannot deduplicate (no producer id, so no sequence numbers).
    """
    topic = "idem-control"
    create_topic(stack.broker.bootstrap, topic)
    n = 10_000
    stack.proxy.resume()
    prod = produce_confluent(stack.proxy.bootstrap, topic, n=n, idempotence=False)
    stack.proxy.pause()
    st = stack.proxy.stats
    assert st.duplicated_requests + st.dropped_responses > 0
    assert not prod.errors and len(prod.acks) == n
    stack.direct()
    ends, got = read_back(kit, stack.broker.bootstrap, topic)
    stored = sum(ends.values())
    distinct = len({i for recs in got.values() for _, i in recs})
    print(f"\ncontrol: {stored} records stored for {distinct} ids; proxy {st.duplicated_requests} duplicated, "
          f"{st.dropped_responses} responses dropped, {st.closes} closes")
    assert distinct == n
    assert stored > n, "no duplicates without idempotence: the proxy's faults did not force any retry"


def test_describe_producers_lists_epoch_and_last_sequence(stack: Stack, kit: Any) -> None:
    """Without faults every record is sent once: sequences are 0..n-1 per partition, epoch 0."""
    topic = "idem-describe"
    bootstrap = stack.broker.bootstrap
    create_topic(bootstrap, topic)
    n = 5_000
    prod = produce_confluent(stack.proxy.bootstrap, topic, n=n)
    assert not prod.errors and len(prod.acks) == n
    counts = {p: len(ids) for p, ids in prod.send_order.items()}

    def check(where: str) -> int:
        described = describe_producers(bootstrap, topic)
        pids = set()
        for p in range(PARTITIONS):
            assert len(described[p]) == 1, f"{where}: partition {p}: {described[p]}"
            (e,) = described[p]
            pids.add(e.producer_id)
            assert e.producer_id >= 0 and e.producer_epoch == 0, (where, p, e)
            assert e.last_sequence == counts[p] - 1, (where, p, e.last_sequence, counts[p])
            assert e.current_txn_start_offset == -1
            assert e.last_timestamp > 0
        assert len(pids) == 1, f"{where}: one producer, one id: {pids}"
        return pids.pop()

    pid = check("after producing")
    stack.broker.restart(hard=True)
    assert check("after kill -9 (snapshot + replay)") == pid
    stack.broker.restart()
    assert check("after clean restart") == pid
