"""The seed-003 consume-transform-produce loop, exactly once, with real clients.

An input topic is seeded with unique ids by an idempotent producer
(partition ``p`` holds the ids ``p, p + P, p + 2P, ...`` in that order).
Three copier workers join one consumer group (``subscribe``,
``isolation.level=read_committed``, no auto commit), each with its own
transactional producer (one transactional.id per worker). A worker's loop:
consume a batch, begin a transaction, produce a transformed record per input
record to the output partition with the input's partition number,
``send_offsets_to_transaction(positions, group metadata)`` (KIP-447), commit.
One transaction in ten is aborted on purpose after its records reached
the log (so aborted data exists for read_committed to hide); on an abort,
deliberate or after an abortable error, the worker rewinds to the group's
committed offsets. Workers start staggered and one stops mid-run, so the
group rebalances while transactions are in flight (the test releases the
input of every partition in stages - 15 %, 30 %, 55 %, all - so every worker
joins, and the zombie stops, while input is left for it; records of a
partition already copied up to the stage's share are handed back with a seek
and wait):

* librdkafka: the stopping worker becomes a zombie - it leaves the group in
  the middle of a transaction that already holds records and offsets, and
  never ends it. The broker must abort it at its (short) transaction
  timeout; until then the new owners' offset fetches are unstable (KIP-447
  require_stable) and the output partitions' LSO is pinned.
* kafka-python (threads): the stopping worker aborts its open transaction and
  closes.

The check is by counting, with a read_committed reader over the whole
output: every input id exactly once, each output partition holds exactly the
ids of its input partition in input order, the group's committed offsets
equal the input end offsets, the LSO equals the high watermark, and the log
itself (read_uncommitted) holds aborted records, so the filtering was tested.

A third variant runs the librdkafka loop through the fault proxy (seeded
delays on every frame; lost responses to Produce and to the transactional
requests) between every client and the broker.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing import EmbeddedBroker, free_port
from oncelog.testing.readback import end_offset, read_to_eof
from oncelog.testing.fault_proxy import FaultProxy

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

PARTS = 4
MAX_PER_TXN = 40  # records per transaction: many transactions, so rebalances hit running loops
ABORT_EVERY = 10
SESSION_MS = 10_000
BROKER_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
}
TXN_TIMEOUT_MS = 20_000
ZOMBIE_TIMEOUT_MS = 4_000


# -- records ---------------------------------------------------------------------------------------


def transform(value: bytes, offset: int) -> bytes:
    return b"out:%s:%d" % (value, offset)


def id_of_output(value: bytes) -> int:
    return int(value.split(b":")[1])


def seed_input(bootstrap: str, topic: str, n: int) -> dict[int, list[int]]:
    """Ids 0..n-1, id i on partition i % PARTS; returns the ids per partition in log order."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    errors: list[str] = []
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=b"%d" % i, key=b"%d" % i, partition=i % PARTS,
                          on_delivery=lambda err, _m: err is not None and errors.append(str(err)))
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0 and not errors, errors[:3]
    return {q: list(range(q, n, PARTS)) for q in range(PARTS)}


# -- shared state --------------------------------------------------------------------------------


class Progress:
    """Records copied in committed transactions, per input partition, and the stage's allowance.

    The allowance is per partition: a global one let a worker alone on one
    partition copy all of it while the others were still behind, and the
    zombie stage then waited forever for input that w1 no longer had.
    """

    def __init__(self, per_partition: int) -> None:
        self.lock = threading.Lock()
        self.per_partition = per_partition
        self.copied = [0] * PARTS
        self.allowance = 0  # no transaction takes records of a partition with copied >= allowance
        self.events: list[str] = []

    @property
    def records(self) -> int:
        return sum(self.copied)

    def allow(self, share: float) -> None:
        self.allowance = math.ceil(share * self.per_partition)
        self.log(f"allowance {self.allowance} records per partition")

    def held(self, partition: int) -> bool:
        return self.copied[partition] >= self.allowance

    def add(self, counts: Mapping[int, int]) -> None:
        with self.lock:
            for q, k in counts.items():
                self.copied[q] += k

    def log(self, msg: str) -> None:
        with self.lock:
            self.events.append(f"{time.monotonic():.2f} {msg}")


class Copier(threading.Thread):
    """One worker: a group consumer plus a transactional producer."""

    def __init__(self, name: str, bootstrap: str, group: str, src: str, dst: str, progress: Progress,
                 txn_timeout_ms: int = TXN_TIMEOUT_MS, extra: dict[str, Any] | None = None) -> None:
        super().__init__(name=f"copier-{name}", daemon=True)
        self.wname, self.bootstrap, self.group, self.src, self.dst = name, bootstrap, group, src, dst
        self.progress = progress
        self.txns = 0  # transactions begun
        self.txn_timeout_ms = txn_timeout_ms
        self.extra = extra or {}
        self.halt = threading.Event()
        self.zombify = threading.Event()  # leave the group mid-transaction, never end it
        self.zombie = threading.Event()  # set once the worker is a zombie
        self.committed_txns = 0
        self.aborted_txns = 0
        self.assigned: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.notes: list[str] = []
        self.error: BaseException | None = None
        self.keep: list[Any] = []  # clients kept alive (the zombie's producer)
        self.phase = "starting"  # what the loop is doing now (for failure reports)

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as exc:  # reported by stop()
            self.error = exc
            self.progress.log(f"{self.wname} failed: {exc!r}")

    def stop(self, timeout: float = 60) -> None:
        self.halt.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.wname} did not stop"
        if self.error is not None:
            raise AssertionError(f"{self.wname} failed: {self.error!r}; notes {self.notes[:5]}") from self.error

    def deliberate_abort(self) -> bool:
        """Every ABORT_EVERY-th transaction of a worker is aborted on purpose (the 4th, 14th, ...)."""
        self.txns += 1
        return self.txns % ABORT_EVERY == 4

    def loop(self) -> None:  # pragma: no cover - per client
        raise NotImplementedError


class ConfluentCopier(Copier):
    def loop(self) -> None:
        from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

        producer = Producer({
            "bootstrap.servers": self.bootstrap, "transactional.id": f"eos-{self.group}-{self.wname}",
            "transaction.timeout.ms": self.txn_timeout_ms, "socket.timeout.ms": 3000, "linger.ms": 5,
            "retry.backoff.ms": 50, "reconnect.backoff.max.ms": 300, **self.extra,
        })
        producer.init_transactions(30)
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": self.wname,
            "isolation.level": "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 300, "socket.timeout.ms": 3000,
            "fetch.wait.max.ms": 100, "reconnect.backoff.max.ms": 300, **self.extra,
        })

        def on_assign(_c: Any, tps: list[Any]) -> None:
            self.assigned.append(sorted(tp.partition for tp in tps))
            self.progress.log(f"{self.wname} assigned {self.assigned[-1]}")

        def on_revoke(_c: Any, tps: list[Any]) -> None:
            self.revoked.append(sorted(tp.partition for tp in tps))
            self.progress.log(f"{self.wname} revoked {self.revoked[-1]}")

        consumer.subscribe([self.src], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)

        def rewind() -> None:
            assignment = consumer.assignment()
            if not assignment:
                return
            self.phase = "rewind: committed()"
            for tp in consumer.committed(assignment, timeout=30):
                if tp.offset < 0:
                    tp.offset = -2  # OFFSET_BEGINNING
                consumer.seek(tp)

        try:
            while not self.halt.is_set():
                self.phase = f"consume (assigned {self.assigned[-1] if self.assigned else None})"
                msgs = [m for m in consumer.consume(num_messages=MAX_PER_TXN, timeout=0.2)]
                for m in msgs:
                    if m.error():
                        self.notes.append(f"consume: {m.error()}")
                        if m.error().fatal():
                            raise KafkaException(m.error())
                msgs = [m for m in msgs if not m.error()]
                if not msgs:
                    continue
                held = set() if self.zombify.is_set() else \
                    {q for q in {m.partition() for m in msgs} if self.progress.held(q)}
                for q in sorted(held):  # hand these records back
                    first = min(m.offset() for m in msgs if m.partition() == q)
                    consumer.seek(TopicPartition(self.src, q, first))
                msgs = [m for m in msgs if m.partition() not in held]
                if not msgs:
                    time.sleep(0.05)
                    continue
                self.phase = f"transaction with {len(msgs)} records"
                producer.begin_transaction()
                try:
                    for m in msgs:
                        while True:
                            try:
                                producer.produce(self.dst, key=m.key(), value=transform(m.value(), m.offset()),
                                                 partition=m.partition())
                                break
                            except BufferError:
                                producer.poll(0.05)
                    parts = sorted({m.partition() for m in msgs})
                    positions = consumer.position([TopicPartition(self.src, q) for q in parts])
                    for tp, q in zip(positions, parts):
                        last = max(m.offset() for m in msgs if m.partition() == q)
                        assert tp.offset == last + 1, f"position {tp} after offset {last}"
                    self.phase = "send_offsets_to_transaction"
                    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
                    if self.zombify.is_set():
                        assert producer.flush(30) == 0
                        self.progress.log(f"{self.wname} zombie: leaves the group with its transaction open")
                        self.keep.append(producer)
                        self.zombie.set()
                        return
                    if self.deliberate_abort():
                        self.phase = "deliberate abort"
                        assert producer.flush(30) == 0  # the aborted records reach the log
                        producer.abort_transaction(30)
                        self.aborted_txns += 1
                        rewind()
                        continue
                    self.phase = "commit_transaction"
                    self._commit(producer)
                    self.committed_txns += 1
                    self.progress.add(Counter(m.partition() for m in msgs))
                except KafkaException as exc:
                    err = exc.args[0]
                    self.notes.append(f"txn: {err}")
                    self.progress.log(f"{self.wname} txn error {err}")
                    if not err.txn_requires_abort():
                        raise
                    self.phase = "abort after error"
                    producer.abort_transaction(30)
                    self.aborted_txns += 1
                    rewind()
        finally:
            consumer.close()

    def _commit(self, producer: Any) -> None:
        from confluent_kafka import KafkaException

        for attempt in range(5):
            try:
                producer.commit_transaction(30)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or attempt == 4:
                    raise
                self.notes.append(f"commit retried: {exc.args[0]}")


class KafkaPythonCopier(Copier):
    def loop(self) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
        from kafka.errors import KafkaError

        worker = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                worker.revoked.append(sorted(tp.partition for tp in revoked))
                worker.progress.log(f"{worker.wname} revoked {worker.revoked[-1]}")

            def on_partitions_assigned(self, assigned: Any) -> None:
                worker.assigned.append(sorted(tp.partition for tp in assigned))
                worker.progress.log(f"{worker.wname} assigned {worker.assigned[-1]}")

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, transactional_id=f"eos-{self.group}-{self.wname}",
                                 transaction_timeout_ms=self.txn_timeout_ms, linger_ms=5, request_timeout_ms=10_000,
                                 client_id=f"{self.wname}-p")
        producer.init_transactions()
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group, client_id=self.wname,
                                 isolation_level="read_committed", enable_auto_commit=False,
                                 auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                                 heartbeat_interval_ms=300, fetch_max_wait_ms=100, max_poll_records=MAX_PER_TXN)
        # see tests/integration/test_groups_clients.py: load metadata before joining, and finish
        # (re)joins with a long timer (kafka-python 3.0.x drops a join round that outlives poll's timer)
        consumer.partitions_for_topic(self.src)
        consumer.subscribe([self.src], listener=Listener())
        coordinator = consumer._coordinator
        manager = producer._transaction_manager

        def rewind() -> None:
            for tp in consumer.assignment():
                committed = consumer.committed(tp)
                if committed is None:
                    consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, committed)

        in_txn = False
        try:
            while not self.halt.is_set():
                if coordinator.need_rejoin():
                    coordinator.ensure_active_group(timeout_ms=10_000)
                batch = consumer.poll(timeout_ms=200, max_records=MAX_PER_TXN)
                if not batch:
                    continue
                for tp in [tp for tp in batch if self.progress.held(tp.partition)]:  # hand these back
                    consumer.seek(tp, batch.pop(tp)[0].offset)
                if not batch:  # wait (rebalances go on meanwhile)
                    time.sleep(0.05)
                    continue
                try:
                    producer.begin_transaction()
                    in_txn = True
                    offsets = {}
                    for tp, msgs in batch.items():
                        for m in msgs:
                            producer.send(self.dst, key=m.key, value=transform(m.value, m.offset),
                                          partition=tp.partition)
                        offsets[TopicPartition(self.src, tp.partition)] = OffsetAndMetadata(msgs[-1].offset + 1, "", -1)
                        assert consumer.position(tp) == msgs[-1].offset + 1
                    producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                    if self.deliberate_abort():
                        producer.flush(timeout=30)
                        producer.abort_transaction()
                        in_txn = False
                        self.aborted_txns += 1
                        rewind()
                        continue
                    producer.commit_transaction()
                    in_txn = False
                    self.committed_txns += 1
                    self.progress.add({tp.partition: len(v) for tp, v in batch.items()})
                except KafkaError as exc:
                    self.notes.append(f"txn: {exc!r}")
                    self.progress.log(f"{self.wname} txn error {exc!r}")
                    if manager.has_fatal_error() or not manager.has_abortable_error():
                        raise
                    producer.abort_transaction()
                    in_txn = False
                    self.aborted_txns += 1
                    rewind()
            if in_txn:  # not reached: the loop ends transactions before checking halt
                producer.abort_transaction()
        finally:
            consumer.close()
            producer.close(timeout=10)


# -- checks ----------------------------------------------------------------------------------------


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int] | None:
    """Stable committed offsets (OffsetFetch require_stable via librdkafka), None while unstable."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        res = c.committed([TopicPartition(topic, q) for q in range(PARTS)], timeout=5)
        return {tp.partition: tp.offset for tp in res}
    except KafkaException:
        return None
    finally:
        c.close()


def read_output(bootstrap: str, topic: str, committed: bool, timeout: float = 60) -> dict[int, list[bytes]]:
    """Every record from offset 0 to partition EOF (read_committed: EOF at the LSO)."""
    return read_to_eof(bootstrap, topic, PARTS, committed, timeout, group_id="eos-verify")


def check_exactly_once(kit: Any, bootstrap: str, src: str, dst: str, group: str,
                       expected: dict[int, list[int]]) -> dict[str, int]:
    n = sum(len(v) for v in expected.values())
    ends = {q: end_offset(bootstrap, src, q, 0) for q in range(PARTS)}
    assert ends == {q: len(expected[q]) for q in range(PARTS)}, f"input end offsets {ends}"

    def stable() -> Any:
        lso = {q: end_offset(bootstrap, dst, q, 1) for q in range(PARTS)}
        hw = {q: end_offset(bootstrap, dst, q, 0) for q in range(PARTS)}
        return lso == hw and hw

    kit.wait_until(stable, timeout=30, interval=0.2, message=f"LSO == HW on {dst}")
    got = read_output(bootstrap, dst, committed=True)
    problems = []
    for q in range(PARTS):
        ids = [id_of_output(v) for v in got[q]]
        if ids != expected[q]:
            dups = len(ids) - len(set(ids))
            missing = sorted(set(expected[q]) - set(ids))
            foreign = sorted(set(ids) - set(expected[q]))
            problems.append(f"partition {q}: {len(ids)} records, want {len(expected[q])}; {dups} duplicates, "
                            f"{len(missing)} missing (e.g. {missing[:5]}), {len(foreign)} foreign (e.g. {foreign[:5]}), "
                            f"order kept: {sorted(ids) == ids}")
    assert not problems, "exactly-once violated:\n" + "\n".join(problems)
    offsets = kit.wait_until(lambda: group_offsets(bootstrap, group, src), timeout=30,
                             message="stable group offsets")
    assert offsets == ends, f"group {group} committed {offsets}, input ends {ends}"
    raw = read_output(bootstrap, dst, committed=False)
    stored = sum(len(v) for v in raw.values())
    assert stored > n, f"no aborted records in the output log ({stored} for {n} ids): filtering untested"
    return {"ids": n, "output_log_records": stored, "aborted_records_hidden": stored - n}


# -- the loop --------------------------------------------------------------------------------------


def run_loop(kit: Any, bootstrap: str, make: Callable[..., Copier], n: int, tag: str, zombie: bool,
             faults: tuple[Callable[[], None], Callable[[], None]] | None = None,
             budget: float = 90) -> dict[str, Any]:
    """``faults`` = (start, stop) callbacks run around the copiers (not around seeding and checks)."""
    src, dst, group = f"eos-in-{tag}", f"eos-out-{tag}", f"eos-group-{tag}"
    kit.create_topic(bootstrap, src, PARTS)
    kit.create_topic(bootstrap, dst, PARTS)
    expected = seed_input(bootstrap, src, n)
    assert n % PARTS == 0
    progress = Progress(n // PARTS)
    wb = bootstrap
    workers = [
        make("w0", wb, group, src, dst, progress),
        make("w1", wb, group, src, dst, progress,
             txn_timeout_ms=ZOMBIE_TIMEOUT_MS if zombie else TXN_TIMEOUT_MS),
        make("w2", wb, group, src, dst, progress),
    ]
    w0, w1, w2 = workers
    started = time.monotonic()

    def state() -> str:
        per = {w.wname: (w.committed_txns, w.aborted_txns, w.phase, w.notes[-2:]) for w in workers}
        return f"{progress.records} records committed (per partition {progress.copied}); " \
            f"(committed, aborted, phase, notes) {per}; events:\n" + \
            "\n".join(progress.events[-30:])

    def at(share: float, extra: Callable[[], bool] = lambda: True) -> None:
        try:
            kit.wait_until(lambda: (progress.records >= share * n and extra()) or any(w.error for w in workers),
                           timeout=budget, interval=0.02, message=f"{share:.0%} copied")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {state()}") from None
        failed = [w for w in workers if w.error]
        if failed:
            failed[0].stop()

    allow = progress.allow

    def owns(w: Copier) -> bool:
        return bool(w.assigned and w.assigned[-1])

    if faults:
        faults[0]()
    try:
        # copying is released stage by stage, so every worker joins while input is left for it
        allow(0.15)
        w0.start()
        at(0.15)
        w1.start()
        at(0.15, lambda: owns(w1))
        allow(0.30)
        at(0.30, lambda: w1.committed_txns >= 1)
        w2.start()
        at(0.30, lambda: owns(w2))
        allow(0.55)
        at(0.55, lambda: w1.committed_txns >= 2 and w2.committed_txns >= 1)
        progress.log(f"stopping w1 ({'zombie' if zombie else 'clean'}) at {progress.records} records")
        if zombie:
            w1.zombify.set()
            try:
                kit.wait_until(lambda: w1.zombie.is_set() or not w1.is_alive(), timeout=budget,
                               message="w1 zombie")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; {state()}") from None
        w1.stop()
        allow(2.0)
        ends = {q: len(expected[q]) for q in range(PARTS)}
        try:
            kit.wait_until(lambda: progress.records >= n and group_offsets(bootstrap, group, src) == ends
                           or any(w.error for w in (w0, w2)),
                           timeout=budget, interval=0.25, message="every input record copied and committed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {state()}") from None
        for w in (w0, w2):
            assert w.error is None, f"{w.wname} failed: {w.error!r}"
    finally:
        for w in workers:
            w.halt.set()
        for w in workers:
            if w.is_alive():
                w.join(60)
        if faults:
            faults[1]()
    for w in (w0, w2):
        w.stop()
    elapsed = time.monotonic() - started
    summary = check_exactly_once(kit, bootstrap, src, dst, group, expected)
    summary.update({w.wname: {"committed": w.committed_txns, "aborted": w.aborted_txns, "assigned": w.assigned,
                              "notes": w.notes[:3]} for w in workers})
    print(f"\n{tag}: {elapsed:.1f}s; {summary}\n" + "\n".join(progress.events[-40:]))
    # the scenario really happened: every worker copied, the group rebalanced around them
    for w in workers:
        assert w.committed_txns >= 1, f"{w.wname} committed nothing"
    assert len(w0.assigned) >= 3, f"w0 saw {len(w0.assigned)} assignments; expected rebalances on join and leave"
    assert sum(w.aborted_txns for w in workers) >= 2
    # records copied twice in committed transactions would break exactly-once; copied at most once each
    assert progress.records == n, f"{progress.records} records in committed transactions for {n} ids"
    if zombie:
        # the broker aborted the zombie's transaction at its timeout (bumping the epoch): too late to commit
        from confluent_kafka import KafkaException

        (zp,) = w1.keep
        with pytest.raises(KafkaException) as ei:
            zp.commit_transaction(15)
        print(f"zombie's late commit: {ei.value}")
    return summary


def test_eos_loop_confluent(broker_factory: Any, kit: Any) -> None:
    b = broker_factory(config=dict(BROKER_CONFIG))
    run_loop(kit, b.bootstrap, ConfluentCopier, n=4000, tag="confluent", zombie=True)


def test_eos_loop_kafkapython(broker_factory: Any, kit: Any) -> None:
    b = broker_factory(config=dict(BROKER_CONFIG))
    run_loop(kit, b.bootstrap, KafkaPythonCopier, n=3000, tag="kafkapython", zombie=False)


# -- through the fault proxy -----------------------------------------------------------------------


def test_eos_loop_confluent_through_fault_proxy(tmp_path: Path, kit: Any) -> None:
    """Delays on every frame and lost responses between the copiers and the broker.

    The broker advertises the proxy's address, so every client connection goes
    through it; the proxy is paused (forwarding untouched) while the input is
    seeded and while the output is verified. Lost responses hit Produce,
    AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and TxnOffsetCommit: the broker
    already applied the request, and the client's retry (same sequence
    numbers, or the same transactional request again) must be recognised. A
    lost response costs librdkafka one socket timeout (1.5 s here) before it
    retries on a new connection; the transaction timeout is far above that.
    """
    port = free_port()
    proxy = FaultProxy(("127.0.0.1", port), seed=3003, connect_timeout=2.0,
                       delay_ms=(0.0, 15.0), delay_rate=0.3, drop_response_rate=0.02, drop_mode="gap",
                       api_keys={0, 24, 25, 26, 28})
    proxy.pause()
    broker = EmbeddedBroker(data_dir=tmp_path / "data", port=port, log_path=tmp_path / "broker.log",
                            config=dict(BROKER_CONFIG, **{"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"}))
    proxy.start()
    try:
        broker.start()
        try:
            # a lost response costs librdkafka one socket.timeout.ms before it retries on a new connection
            make = functools.partial(ConfluentCopier, extra={"socket.timeout.ms": 1500})
            run_loop(kit, proxy.bootstrap, make, n=3000, tag="proxy", zombie=False,
                     faults=(proxy.resume, proxy.pause))
            stats = proxy.stats
            print(f"proxy: {stats.delays} delays, {stats.dropped_responses} dropped responses "
                  f"(by api key {stats.dropped_by_api}), "
                  f"{stats.requests} requests")
            assert stats.delays > 100 and stats.dropped_responses >= 1, stats
        finally:
            broker.close()
    finally:
        proxy.stop()
