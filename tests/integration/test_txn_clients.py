"""Transactions with real clients: confluent-kafka (librdkafka), kafka-python, aiokafka.

Each transactional producer library commits and aborts transactions over
several partitions; consumers of every library with
``isolation_level=read_committed`` must see exactly the committed records
(every id once, nothing of an aborted or still open transaction, per
partition in the order the producer sent them), while ``read_uncommitted``
sees every record that reached the log. The scenarios:

- one transaction over 3 partitions, committed;
- committed and aborted transactions interleaved;
- an open transaction of another producer bounds the last stable offset
  (read_committed watermark and position stop at its first offset) and
  hides everything after it on its partitions until it commits;
- zombie fencing: a second producer with the same transactional.id calls
  init_transactions; the first one's commit fails and its records never
  become visible;
- send_offsets_to_transaction: group offsets change only when the
  transaction commits, never on abort.

Checks are by counting ids; the consumers read until they have at least the
expected number and then for a quiet period more, so extra records (aborted
ones leaking) are seen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from oncelog.testing import EmbeddedBroker

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

PARTITIONS = 3
BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0"}
CLIENTS = ("confluent", "kafkapython", "aiokafka")
QUIET_S = 1.5  # after the expected count, keep reading this long to catch extra records


def value_of(txn: int, i: int) -> bytes:
    return b"t%03d:%06d" % (txn, i)


def id_of(value: bytes) -> int:
    return int(value.split(b":", 1)[1])


# -- transactional producers, one adapter per library ------------------------------------


class ConfluentTxn:
    name = "confluent"

    def __init__(self, bootstrap: str, txn_id: str) -> None:
        from confluent_kafka import Producer

        self.errors: list[str] = []
        self.delivered: dict[bytes, tuple[int, int]] = {}
        self.p = Producer({
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 60000,
            "linger.ms": 5,
            "error_cb": lambda err: self.errors.append(str(err)),
        })

    def _dr(self, err: Any, msg: Any) -> None:
        if err is None:
            self.delivered[msg.value()] = (msg.partition(), msg.offset())

    def init(self) -> None:
        self.p.init_transactions(30)

    def begin(self) -> None:
        self.p.begin_transaction()

    def send(self, topic: str, partition: int, value: bytes) -> None:
        while True:
            try:
                self.p.produce(topic, value=value, partition=partition, on_delivery=self._dr)
                break
            except BufferError:
                self.p.poll(0.05)
        self.p.poll(0)

    def flush(self) -> None:
        assert self.p.flush(30) == 0

    def commit(self) -> None:
        self.p.commit_transaction(30)

    def abort(self) -> None:
        self.p.abort_transaction(30)

    def send_offsets(self, offsets: dict[tuple[str, int], int], consumer: Any) -> None:
        from confluent_kafka import TopicPartition

        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        self.p.send_offsets_to_transaction(tps, consumer.consumer_group_metadata(), 30)

    def close(self) -> None:
        self.p.flush(5)


class KafkaPythonTxn:
    name = "kafkapython"

    def __init__(self, bootstrap: str, txn_id: str) -> None:
        from kafka import KafkaProducer

        self.futures: list[tuple[bytes, Any]] = []
        self.delivered: dict[bytes, tuple[int, int]] = {}
        self.p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id,
                               transaction_timeout_ms=60000, linger_ms=5, request_timeout_ms=15000)

    def init(self) -> None:
        self.p.init_transactions()

    def begin(self) -> None:
        self.p.begin_transaction()

    def send(self, topic: str, partition: int, value: bytes) -> None:
        self.futures.append((value, self.p.send(topic, value=value, partition=partition)))

    def flush(self) -> None:
        self.p.flush(timeout=30)
        for value, fut in self.futures:
            md = fut.get(timeout=30)
            self.delivered[value] = (md.partition, md.offset)
        self.futures.clear()

    def commit(self) -> None:
        self.p.commit_transaction()
        self.flush()

    def abort(self) -> None:
        self.p.abort_transaction()
        self.futures.clear()

    def send_offsets(self, offsets: dict[tuple[str, int], int], consumer: Any) -> None:
        from kafka import OffsetAndMetadata, TopicPartition

        offs = {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
        self.p.send_offsets_to_transaction(offs, consumer.group_metadata())

    def close(self) -> None:
        self.p.close(timeout=10)


class AioTxn:
    """aiokafka driven synchronously on a private event loop."""

    name = "aiokafka"

    def __init__(self, bootstrap: str, txn_id: str) -> None:
        from aiokafka import AIOKafkaProducer

        self.loop = asyncio.new_event_loop()
        self.futures: list[tuple[bytes, Any]] = []
        self.delivered: dict[bytes, tuple[int, int]] = {}

        async def make() -> Any:
            return AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id,
                                    enable_idempotence=True, transaction_timeout_ms=60000, linger_ms=5)

        self.p = self.run(make())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def init(self) -> None:
        self.run(self.p.start())  # start() runs InitProducerId for the transactional id

    def begin(self) -> None:
        self.run(self.p.begin_transaction())

    def send(self, topic: str, partition: int, value: bytes) -> None:
        self.futures.append((value, self.run(self.p.send(topic, value=value, partition=partition))))

    def flush(self) -> None:
        for value, fut in self.futures:
            md = self.run(asyncio.wait_for(fut, 30))
            self.delivered[value] = (md.partition, md.offset)
        self.futures.clear()

    def commit(self) -> None:
        self.flush()
        self.run(self.p.commit_transaction())

    def abort(self) -> None:
        self.run(self.p.abort_transaction())
        self.futures.clear()

    def send_offsets(self, offsets: dict[tuple[str, int], int], consumer: Any) -> None:
        from aiokafka.structs import OffsetAndMetadata, TopicPartition

        group = consumer if isinstance(consumer, str) else consumer.group_id
        offs = {TopicPartition(t, p): OffsetAndMetadata(o, "") for (t, p), o in offsets.items()}
        self.run(self.p.send_offsets_to_transaction(offs, group))

    def close(self) -> None:
        try:
            self.run(self.p.stop())
        finally:
            self.loop.close()


PRODUCERS: dict[str, Callable[[str, str], Any]] = {
    "confluent": ConfluentTxn,
    "kafkapython": KafkaPythonTxn,
    "aiokafka": AioTxn,
}


# -- consumers (manual assignment from offset 0) ----------------------------------------


def _finish(got: dict[int, list[bytes]], expected: int, started: float, timeout: float) -> bool:
    """True while the reader should go on."""
    return sum(len(v) for v in got.values()) < expected and time.monotonic() - started < timeout


def read_confluent(bootstrap: str, topic: str, expected: int, committed: bool,
                   timeout: float = 45.0) -> dict[int, list[bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "txn-reader", "enable.auto.commit": False,
        "isolation.level": "read_committed" if committed else "read_uncommitted",
        "enable.partition.eof": False, "fetch.wait.max.ms": 100,
    })
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        started = time.monotonic()
        quiet_until = None
        while True:
            for m in c.consume(num_messages=500, timeout=0.2):
                assert not m.error(), f"consumer error: {m.error()}"
                got[m.partition()].append(m.value())
            if _finish(got, expected, started, timeout):
                continue
            quiet_until = quiet_until or time.monotonic() + QUIET_S
            if time.monotonic() > quiet_until:
                break
    finally:
        c.close()
    return got


def read_kafkapython(bootstrap: str, topic: str, expected: int, committed: bool,
                     timeout: float = 45.0) -> dict[int, list[bytes]]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", fetch_max_wait_ms=100,
                      isolation_level="read_committed" if committed else "read_uncommitted")
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        started = time.monotonic()
        quiet_until = None
        while True:
            for tp, msgs in c.poll(timeout_ms=200).items():
                got[tp.partition].extend(m.value for m in msgs)
            if _finish(got, expected, started, timeout):
                continue
            quiet_until = quiet_until or time.monotonic() + QUIET_S
            if time.monotonic() > quiet_until:
                break
    finally:
        c.close()
    return got


def read_aiokafka(bootstrap: str, topic: str, expected: int, committed: bool,
                  timeout: float = 45.0) -> dict[int, list[bytes]]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    async def main() -> dict[int, list[bytes]]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                             fetch_max_wait_ms=100,
                             isolation_level="read_committed" if committed else "read_uncommitted")
        await c.start()
        got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)
            started = time.monotonic()
            quiet_until = None
            while True:
                for tp, msgs in (await c.getmany(timeout_ms=200)).items():
                    got[tp.partition].extend(m.value for m in msgs)
                if _finish(got, expected, started, timeout):
                    continue
                quiet_until = quiet_until or time.monotonic() + QUIET_S
                if time.monotonic() > quiet_until:
                    break
        finally:
            await c.stop()
        return got

    return asyncio.run(main())


READERS = {"confluent": read_confluent, "kafkapython": read_kafkapython, "aiokafka": read_aiokafka}


def assert_exactly(got: dict[int, list[bytes]], want: dict[int, list[bytes]], who: str) -> None:
    """Every wanted value exactly once, nothing else, per partition in send order."""
    for p in range(PARTITIONS):
        g, w = got.get(p, []), want.get(p, [])
        dups = len(g) - len(set(g))
        assert dups == 0, f"{who}: partition {p}: {dups} duplicates"
        extra = sorted(set(g) - set(w))
        assert not extra, f"{who}: partition {p}: {len(extra)} records that must not be visible, e.g. {extra[:5]}"
        missing = sorted(set(w) - set(g))
        assert not missing, f"{who}: partition {p}: {len(missing)} records missing, e.g. {missing[:5]}"
        assert g == w, f"{who}: partition {p}: records out of send order"


def run_txn(prod: Any, topic: str, txn: int, ids: range, commit: bool,
            sent: dict[int, list[bytes]]) -> None:
    """One transaction; ``sent`` collects its values per partition (send order)."""
    prod.begin()
    for i in ids:
        part = (i * 7 + i // 5) % PARTITIONS
        v = value_of(txn, i)
        prod.send(topic, part, v)
        sent[part].append(v)
    if commit:
        prod.commit()
    else:
        prod.flush()  # the records reach the log before the abort: read_uncommitted must see them
        prod.abort()


def empty() -> dict[int, list[bytes]]:
    return {p: [] for p in range(PARTITIONS)}


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_commit_over_three_partitions(client: str, broker_factory: Callable[..., EmbeddedBroker], kit: Any) -> None:
    b = broker_factory(config=BROKER_CONFIG)
    topic = f"txn-commit-{client}"
    kit.create_topic(b.bootstrap, topic, PARTITIONS)
    prod = PRODUCERS[client](b.bootstrap, f"tx-commit-{client}")
    sent = empty()
    try:
        prod.init()
        run_txn(prod, topic, 1, range(300), True, sent)
    finally:
        prod.close()
    assert all(len(v) > 50 for v in sent.values())
    assert sum(len(v) for v in sent.values()) == 300
    for committed in (True, False):
        got = read_confluent(b.bootstrap, topic, 300, committed)
        assert_exactly(got, sent, f"confluent {'read_committed' if committed else 'read_uncommitted'}")
    # the log holds 300 records plus one COMMIT marker per partition
    assert high_watermarks(kit, b.bootstrap, topic) == {p: len(sent[p]) + 1 for p in range(PARTITIONS)}


@pytest.mark.parametrize("client", CLIENTS)
def test_aborted_never_visible_read_committed(client: str, broker_factory: Callable[..., EmbeddedBroker],
                                              kit: Any) -> None:
    b = broker_factory(config=BROKER_CONFIG)
    topic = f"txn-abort-{client}"
    kit.create_topic(b.bootstrap, topic, PARTITIONS)
    prod = PRODUCERS[client](b.bootstrap, f"tx-abort-{client}")
    committed_sent, all_sent = empty(), empty()
    plan = [True, False, True, False, False, True, False, True]  # commit / abort per transaction
    try:
        prod.init()
        for txn, commit in enumerate(plan):
            sent = empty()
            run_txn(prod, topic, txn, range(txn * 40, txn * 40 + 40), commit, sent)
            for p in range(PARTITIONS):
                all_sent[p].extend(sent[p])
                if commit:
                    committed_sent[p].extend(sent[p])
    finally:
        prod.close()
    n_committed = sum(len(v) for v in committed_sent.values())
    n_all = sum(len(v) for v in all_sent.values())
    assert n_committed == 40 * plan.count(True) and n_all == 40 * len(plan)
    for reader in CLIENTS:
        got = READERS[reader](b.bootstrap, topic, n_committed, True)
        assert_exactly(got, committed_sent, f"{reader} read_committed (producer {client})")
    got = read_confluent(b.bootstrap, topic, n_all, False)
    assert_exactly(got, all_sent, f"confluent read_uncommitted (producer {client})")
    # log = records + one marker per transaction per partition
    assert high_watermarks(kit, b.bootstrap, topic) == {p: len(all_sent[p]) + len(plan) for p in range(PARTITIONS)}


def high_watermarks(kit: Any, bootstrap: str, topic: str) -> dict[int, int]:
    """ListOffsets LATEST read_uncommitted (librdkafka's default isolation is read_committed: the LSO)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-hw", "isolation.level": "read_uncommitted"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in range(PARTITIONS)}
    finally:
        c.close()


def wait_high_watermarks(kit: Any, bootstrap: str, topic: str, want: dict[int, int]) -> None:
    """EndTxn is answered once PrepareCommit is durable; the markers follow (as in Kafka)."""
    seen: list[dict[int, int]] = []

    def check() -> bool:
        seen.append(high_watermarks(kit, bootstrap, topic))
        return seen[-1] == want

    try:
        kit.wait_until(check, timeout=15, message=f"high watermarks {want} (markers written)")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last high watermarks {seen[-1]}") from None


def committed_view(bootstrap: str, topic: str) -> tuple[dict[int, int], dict[int, int], dict[int, list[bytes]]]:
    """read_committed: (watermark high per partition, position after reading to EOF, values read)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-lso", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True, "fetch.wait.max.ms": 100})
    try:
        highs = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                 for p in range(PARTITIONS)}
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got = empty()
        eof: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(eof) < PARTITIONS:
            assert time.monotonic() < deadline, f"no EOF on every partition: {eof}"
            for m in c.consume(num_messages=500, timeout=0.2):
                if m.error():
                    from confluent_kafka import KafkaError

                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    eof[m.partition()] = m.offset()
                    continue
                got[m.partition()].append(m.value())
        positions = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in range(PARTITIONS)])}
        return highs, positions, got
    finally:
        c.close()


def test_open_transaction_bounds_last_stable_offset(broker_factory: Callable[..., EmbeddedBroker],
                                                    kit: Any) -> None:
    b = broker_factory(config=BROKER_CONFIG)
    topic = "txn-lso"
    kit.create_topic(b.bootstrap, topic, PARTITIONS)
    a = ConfluentTxn(b.bootstrap, "tx-lso-a")
    other = ConfluentTxn(b.bootstrap, "tx-lso-b")
    try:
        a.init()
        other.init()
        # A: first transaction over every partition, committed
        a.begin()
        first = empty()
        for p in range(PARTITIONS):
            for i in range(10):
                v = value_of(1, p * 100 + i)
                a.send(topic, p, v)
                first[p].append(v)
        a.commit()
        wait_high_watermarks(kit, b.bootstrap, topic, {p: 11 for p in range(PARTITIONS)})
        # B: opens a transaction on partitions 0 and 1 and leaves it open
        other.begin()
        open_vals = empty()
        for p in (0, 1):
            for i in range(5):
                v = value_of(2, p * 100 + i)
                other.send(topic, p, v)
                open_vals[p].append(v)
        other.flush()
        open_first = {p: other.delivered[open_vals[p][0]][1] for p in (0, 1)}
        assert open_first == {0: 11, 1: 11}, open_first  # after A's 10 records and its COMMIT marker
        # A: second transaction over every partition, committed while B's is open
        a.begin()
        second = empty()
        for p in range(PARTITIONS):
            for i in range(10):
                v = value_of(3, p * 100 + i)
                a.send(topic, p, v)
                second[p].append(v)
        a.commit()
        wait_high_watermarks(kit, b.bootstrap, topic, {0: 27, 1: 27, 2: 22})

        highs, positions, got = committed_view(b.bootstrap, topic)
        # partitions 0/1: the LSO is B's first offset; everything from there on is hidden
        want = {0: first[0], 1: first[1], 2: first[2] + second[2]}
        assert_exactly(got, want, "read_committed with an open transaction")
        assert highs[0] == open_first[0] and highs[1] == open_first[1], f"read_committed watermarks {highs}"
        assert highs[2] == 22, f"partition 2 has no open transaction: LSO = high watermark, got {highs}"
        assert positions[0] == open_first[0] and positions[1] == open_first[1], positions
        assert positions[2] == 22, positions
        assert high_watermarks(kit, b.bootstrap, topic) == {0: 27, 1: 27, 2: 22}

        other.commit()
        wait_high_watermarks(kit, b.bootstrap, topic, {0: 28, 1: 28, 2: 22})
        highs, positions, got = committed_view(b.bootstrap, topic)
        # offset order: A1 + marker, B's records, A2 (written while B was open) + marker, B's marker
        want = {p: first[p] + open_vals[p] + second[p] for p in range(PARTITIONS)}
        assert_exactly(got, want, "read_committed after the open transaction commits")
        assert highs == {0: 28, 1: 28, 2: 22}, highs
    finally:
        a.close()
        other.close()


def _fence_error_expected(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return any(s in text for s in ("fenc", "epoch", "invalid_producer", "producer_fenced"))


@pytest.mark.parametrize("client", CLIENTS)
def test_zombie_is_fenced(client: str, broker_factory: Callable[..., EmbeddedBroker], kit: Any) -> None:
    b = broker_factory(config=BROKER_CONFIG)
    topic = f"txn-zombie-{client}"
    kit.create_topic(b.bootstrap, topic, PARTITIONS)
    txn_id = f"tx-zombie-{client}"
    zombie = PRODUCERS[client](b.bootstrap, txn_id)
    successor = None
    zombie_vals = empty()
    try:
        zombie.init()
        zombie.begin()
        for i in range(30):
            v = value_of(1, i)
            zombie.send(topic, i % PARTITIONS, v)
            zombie_vals[i % PARTITIONS].append(v)
        zombie.flush()  # the zombie's records are in the log
        successor = PRODUCERS[client](b.bootstrap, txn_id)
        successor.init()  # bumps the epoch: fences the zombie and aborts its open transaction
        failure: BaseException | None = None
        try:
            for i in range(30, 36):
                v = value_of(1, i)
                zombie.send(topic, i % PARTITIONS, v)
                zombie_vals[i % PARTITIONS].append(v)
            zombie.commit()
        except Exception as exc:  # noqa: BLE001 - any client's fenced error
            failure = exc
        assert failure is not None, f"{client}: the fenced producer committed"
        assert _fence_error_expected(failure), f"{client}: unexpected error {failure!r}"
        # the successor works normally
        successor_vals = empty()
        run_txn(successor, topic, 2, range(100, 130), True, successor_vals)
    finally:
        for prod in (zombie, successor):
            if prod is not None:
                try:
                    prod.close()
                except Exception:  # noqa: BLE001 - a fenced producer may fail to close cleanly
                    pass
    for reader in CLIENTS:
        got = READERS[reader](b.bootstrap, topic, 30, True)
        assert_exactly(got, successor_vals, f"{reader} read_committed after fencing ({client})")
    # the zombie's first 30 records did reach the log (aborted), so read_uncommitted sees them
    got = read_confluent(b.bootstrap, topic, 60, False)
    for p in range(PARTITIONS):
        early = [v for v in zombie_vals[p] if id_of(v) < 30]
        assert set(early) <= set(got[p]), f"partition {p}: zombie records not in the log (test premise)"
        assert set(successor_vals[p]) <= set(got[p])
        late = [v for v in got[p] if v in zombie_vals[p] and id_of(v) >= 30]
        # anything the zombie got in after the fence must still be invisible read_committed (checked above)
        print(f"partition {p}: {len(late)} zombie records written after the fence (aborted)")


# -- send_offsets_to_transaction ------------------------------------------------------------


def confluent_committed(bootstrap: str, group: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=15)
        assert tp.error is None, tp.error
        return tp.offset
    finally:
        c.close()


class GroupConsumer:
    """A consumer of the input topic in ``group``: joins and reads every input record."""

    def __init__(self, client: str, bootstrap: str, group: str, topic: str, n: int) -> None:
        self.client = client
        if client == "confluent":
            from confluent_kafka import Consumer

            self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                               "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
            self.c.subscribe([topic])
            seen = 0
            deadline = time.monotonic() + 30
            while seen < n:
                assert time.monotonic() < deadline, "confluent group consumer read nothing"
                for m in self.c.consume(num_messages=100, timeout=0.5):
                    assert not m.error(), m.error()
                    seen += 1
        elif client == "kafkapython":
            from kafka import KafkaConsumer

            self.c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                   auto_offset_reset="earliest", isolation_level="read_committed")
            seen = 0
            deadline = time.monotonic() + 30
            while seen < n:
                assert time.monotonic() < deadline, "kafka-python group consumer read nothing"
                seen += sum(len(v) for v in self.c.poll(timeout_ms=500).values())
        else:
            # aiokafka's producer takes the group id string (no generation/member checks)
            self.c = group

    def metadata_source(self) -> Any:
        return self.c

    def close(self) -> None:
        if self.client in ("confluent", "kafkapython"):
            self.c.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_send_offsets_to_transaction(client: str, broker_factory: Callable[..., EmbeddedBroker], kit: Any) -> None:
    b = broker_factory(config=BROKER_CONFIG)
    src, dst, group = f"txn-in-{client}", f"txn-out-{client}", f"txn-group-{client}"
    kit.create_topic(b.bootstrap, src, 1)
    kit.create_topic(b.bootstrap, dst, PARTITIONS)
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(50):
        plain.produce(src, value=b"in-%d" % i, partition=0)
    assert plain.flush(30) == 0

    consumer = GroupConsumer(client, b.bootstrap, group, src, 50)
    prod = PRODUCERS[client](b.bootstrap, f"tx-offsets-{client}")
    committed_out = empty()
    try:
        prod.init()
        # transaction 1: output + offset 20, committed
        prod.begin()
        for i in range(20):
            v = value_of(1, i)
            prod.send(dst, i % PARTITIONS, v)
            committed_out[i % PARTITIONS].append(v)
        prod.send_offsets({(src, 0): 20}, consumer.metadata_source())
        prod.commit()
        assert confluent_committed(b.bootstrap, group, src) == 20
        # transaction 2: output + offset 40, aborted: the committed offset stays 20
        prod.begin()
        for i in range(20, 40):
            prod.send(dst, i % PARTITIONS, value_of(2, i))
        prod.send_offsets({(src, 0): 40}, consumer.metadata_source())
        prod.flush()
        prod.abort()
        assert confluent_committed(b.bootstrap, group, src) == 20
        # transaction 3: offset 50, committed
        prod.begin()
        for i in range(40, 50):
            v = value_of(3, i)
            prod.send(dst, i % PARTITIONS, v)
            committed_out[i % PARTITIONS].append(v)
        prod.send_offsets({(src, 0): 50}, consumer.metadata_source())
        prod.commit()
        assert confluent_committed(b.bootstrap, group, src) == 50
    finally:
        prod.close()
        consumer.close()
    got = read_confluent(b.bootstrap, dst, 30, True)
    assert_exactly(got, committed_out, f"read_committed output ({client})")
