"""Transactions across broker crashes, restarts and timeouts (librdkafka clients).

Each test drives a real ``oncelog serve`` subprocess and checks by counting:
every record of a transaction the client saw commit is visible to a
read_committed consumer exactly once, nothing of an aborted transaction is
visible, and a transaction whose outcome the client could not learn is all
or nothing. Scenarios:

* (a) kill -9 while a transaction is open (records acknowledged, no
  EndTxn); after the restart the transaction is aborted by the producer's
  re-init (a new producer with the same transactional.id) or by the
  coordinator's timeout, and its records are never visible read_committed;
* (b)/(c) the broker's crash hook ``oncelog.testing.crash.markers`` = N (0-3) kills
  the broker (like kill -9) during a commit over 3 data partitions plus
  group offsets, after PrepareCommit and N durable markers; the broker is
  restarted on the same data dir without the hook and the transaction must
  complete as a commit: every record visible, the group offsets committed,
  a COMMIT marker in every partition, no ABORT marker;
* a transaction that outlives its transaction.timeout.ms is aborted by the
  broker: its records are never visible, the last stable offset is pinned at
  its first offset until then and advances to the high watermark afterwards,
  and the producer's next commit fails;
* kill -9 three times under a steady transactional workload (committed and
  deliberately aborted transactions): after every restart, while the
  workload goes on, what the client saw committed before the kill is visible
  exactly once and aborted records never; at the end the same for every
  transaction, in-doubt ones all or nothing, per-partition order kept;
* the aborted-transaction index survives a clean restart and a kill -9: a
  read_committed reader from offset 0 (librdkafka and kafka-python) still
  filters aborted records spread over several rolled segments.

On-disk checks parse the segment files independently of the broker's code
(control batches: attributes bit 0x20; the control record key is version
i16 + type i16, 0 = ABORT, 1 = COMMIT).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing import EmbeddedBroker
from oncelog.testing.readback import end_offset, read_to_eof

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

CRASH_KEY = "oncelog.testing.crash.markers"
BASE_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    # the coordinator looks for timed-out transactions often (Kafka default: 10 s)
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
}
ABORT, COMMIT = 0, 1


# -- helpers ---------------------------------------------------------------------------------


def txn_producer(bootstrap: str, tid: str, timeout_ms: int = 60_000, **extra: Any) -> Any:
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "transactional.id": tid,
        "transaction.timeout.ms": timeout_ms,
        "socket.timeout.ms": min(3000, timeout_ms),
        "linger.ms": 2,
        "retry.backoff.ms": 50,
        "retry.backoff.max.ms": 300,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 300,
    }
    conf.update(extra)
    return Producer(conf)


def produce(p: Any, topic: str, partition: int, value: bytes, on_delivery: Callable[..., None] | None = None) -> None:
    while True:
        try:
            if on_delivery is None:
                p.produce(topic, value=value, partition=partition)
            else:
                p.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
            break
        except BufferError:
            p.poll(0.05)
    p.poll(0)


def lso_hw(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    return {p: (end_offset(bootstrap, topic, p, 1), end_offset(bootstrap, topic, p, 0)) for p in range(partitions)}


def wait_stable(kit: Any, bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> dict[int, int]:
    """Wait until LSO == HW on every partition (no open transaction); returns the high watermarks."""
    last: dict[int, tuple[int, int]] = {}

    def stable() -> bool:
        last.clear()
        last.update(lso_hw(bootstrap, topic, partitions))
        return all(lso == hw for lso, hw in last.values())

    kit.wait_until(stable, timeout=timeout, interval=0.1, message=f"LSO == HW on {topic} (last {{p: (lso, hw)}})")
    return {p: hw for p, (_, hw) in last.items()}


def read_all(bootstrap: str, topic: str, partitions: int, committed: bool = True,
             timeout: float = 30.0) -> dict[int, list[bytes]]:
    """Every record a librdkafka consumer returns from offset 0 to the end (partition EOF).

    read_committed reaches EOF at the last stable offset: call :func:`wait_stable` first when the
    whole log should be resolved."""
    return read_to_eof(bootstrap, topic, partitions, committed, timeout, group_id="txn-recovery-reader")


def read_all_kafkapython(bootstrap: str, topic: str, ends: dict[int, int], committed: bool = True,
                         timeout: float = 30.0) -> dict[int, list[bytes]]:
    """kafka-python reader from offset 0 until its position reaches ``ends`` on every partition."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", fetch_max_wait_ms=100,
                      isolation_level="read_committed" if committed else "read_uncommitted")
    out: dict[int, list[bytes]] = {p: [] for p in ends}
    try:
        tps = {p: TopicPartition(topic, p) for p in ends}
        c.assign(list(tps.values()))
        for tp in tps.values():
            c.seek(tp, 0)
        deadline = time.monotonic() + timeout
        while any(c.position(tps[p]) < ends[p] for p in ends):
            assert time.monotonic() < deadline, (
                f"kafka-python read of {topic} timed out: {({p: c.position(tps[p]) for p in ends})} vs {ends}")
            for tp, msgs in c.poll(timeout_ms=200).items():
                out[tp.partition].extend(m.value for m in msgs)
    finally:
        c.close()
    return out


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def disk_markers(data_dir: Path, topic: str, partition: int) -> list[tuple[int, int, int]]:
    """``(offset, producer_id, type)`` of every control batch in a partition's segment files."""
    out = []
    for path in sorted((Path(data_dir) / f"{topic}-{partition}").glob("*.log"), key=lambda p: int(p.stem)):
        data = path.read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            base, length = struct.unpack_from(">qi", data, pos)
            end = pos + 12 + length
            if length <= 0 or end > len(data):
                break  # torn tail: not a batch
            (attributes,) = struct.unpack_from(">h", data, pos + 21)
            if attributes & 0x20:
                (pid,) = struct.unpack_from(">q", data, pos + 43)
                rpos = pos + 61
                _length, rpos = _varint(data, rpos)
                rpos += 1  # record attributes
                _ts, rpos = _varint(data, rpos)
                _od, rpos = _varint(data, rpos)
                klen, rpos = _varint(data, rpos)
                assert klen >= 4, f"{path}: control record key of {klen} bytes at offset {base}"
                _version, kind = struct.unpack_from(">hh", data, rpos)
                out.append((base, pid, kind))
            pos = end
    return out


def values_of(got: dict[int, list[bytes]]) -> list[bytes]:
    return [v for vs in got.values() for v in vs]


def describe_txn(bootstrap: str, tid: str) -> Any:
    from oncelog.client.txns import TxnAdmin

    with TxnAdmin(bootstrap, timeout=10) as admin:
        return admin.describe_transactions([tid]).get(tid)


def group_committed(bootstrap: str, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """OffsetFetch for ``group`` (librdkafka asks for stable offsets, KIP-447)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        res = c.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        return {tp.partition: tp.offset for tp in res}
    finally:
        c.close()


def seed_plain(bootstrap: str, topic: str, partition: int, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2})
    for i in range(n):
        produce(p, topic, partition, b"in:%d" % i)
    assert p.flush(30) == 0


def hard_restart(broker: EmbeddedBroker) -> None:
    broker.kill()
    broker.start()


# -- (a) kill -9 mid-transaction --------------------------------------------------------------


@pytest.mark.parametrize("resolution", ["reinit", "timeout"])
def test_kill9_mid_transaction_is_aborted(resolution: str, broker_factory: Any, kit: Any) -> None:
    """Records of a transaction open at kill -9 are never visible; committed ones before it are."""
    from confluent_kafka import KafkaException

    b = broker_factory(config=dict(BASE_CONFIG))
    topic, tid = f"rec-a-{resolution}", f"rec-a-{resolution}"
    kit.create_topic(b.bootstrap, topic, 2)
    timeout_ms = 3000 if resolution == "timeout" else 60_000
    p = txn_producer(b.bootstrap, tid, timeout_ms=timeout_ms)
    p.init_transactions(30)
    committed = [b"c:%d" % i for i in range(10)]
    p.begin_transaction()
    for i, v in enumerate(committed):
        produce(p, topic, i % 2, v)
    p.commit_transaction(30)

    p.begin_transaction()
    open_vals = [b"open:%d" % i for i in range(20)]
    acked: list[bytes] = []
    for i, v in enumerate(open_vals):
        produce(p, topic, i % 2, v, on_delivery=lambda err, m: err is None and acked.append(m.value()))
    assert p.flush(30) == 0
    assert sorted(acked) == sorted(open_vals), "open transaction's records not all acknowledged"
    before = lso_hw(b.bootstrap, topic, 2)
    assert all(lso < hw for lso, hw in before.values()), f"open transaction does not pin the LSO: {before}"

    hard_restart(b)
    after_restart = lso_hw(b.bootstrap, topic, 2)
    if resolution == "reinit":
        # right after restart the transaction must still pin the LSO (it is neither committed nor lost)
        assert after_restart == before, f"LSO/HW changed across kill -9: {before} -> {after_restart}"
        p2 = txn_producer(b.bootstrap, tid)
        p2.init_transactions(30)  # fences p and aborts its open transaction
        later = [b"later:%d" % i for i in range(6)]
        p2.begin_transaction()
        for i, v in enumerate(later):
            produce(p2, topic, i % 2, v)
        p2.commit_transaction(30)
        committed += later
    else:
        t0 = time.monotonic()
        wait_stable(kit, b.bootstrap, topic, 2, timeout=30)
        print(f"\ntimed-out transaction aborted {time.monotonic() - t0:.1f}s after the restart")
        d = describe_txn(b.bootstrap, tid)
        assert d is not None and d.state == "CompleteAbort", f"DescribeTransactions after timeout: {d}"
    # the producer that was cut off can no longer commit its transaction
    with pytest.raises(KafkaException) as ei:
        p.commit_transaction(15)
    print(f"old producer's commit after {resolution}: {ei.value}")

    ends = wait_stable(kit, b.bootstrap, topic, 2)
    got = values_of(read_all(b.bootstrap, topic, 2))
    assert sorted(got) == sorted(committed), (
        f"read_committed: {len(got)} records; aborted visible: {sorted(set(got) & set(open_vals))[:5]}; "
        f"missing: {sorted(set(committed) - set(got))[:5]}")
    assert len(got) == len(set(got))
    raw = values_of(read_all(b.bootstrap, topic, 2, committed=False))
    assert set(open_vals) <= set(raw), "the open transaction's acknowledged records were lost by kill -9"
    for part in range(2):
        kinds = [k for _, _, k in disk_markers(b.data_dir, topic, part)]
        assert kinds.count(ABORT) >= 1, f"partition {part}: no ABORT marker on disk ({kinds}); ends {ends}"


# -- (b)/(c) crash during the commit's marker writes -------------------------------------------


@pytest.mark.parametrize("markers", [0, 1, 2, 3])
def test_crash_during_commit_markers_completes_commit(markers: int, broker_factory: Any, kit: Any) -> None:
    """PrepareCommit durable, N markers durable, broker dies: recovery completes the commit."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    config = dict(BASE_CONFIG)
    config[CRASH_KEY] = str(markers)
    b = broker_factory(config=config)
    src, out, group, tid = "crash-in", "crash-out", f"crash-group-{markers}", f"crash-tid-{markers}"
    kit.create_topic(b.bootstrap, src, 1)
    kit.create_topic(b.bootstrap, out, 3)
    seed_plain(b.bootstrap, src, 0, 10)

    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "session.timeout.ms": 30_000})
    consumer.subscribe([src])
    seen = 0
    deadline = time.monotonic() + 30
    while seen < 10:
        assert time.monotonic() < deadline, "group consumer got no records"
        for m in consumer.consume(num_messages=100, timeout=0.2):
            if not m.error():
                seen += 1
    metadata = consumer.consumer_group_metadata()

    p = txn_producer(b.bootstrap, tid)
    p.init_transactions(30)
    p.begin_transaction()
    vals = {part: [b"x:%d:%d" % (part, i) for i in range(5)] for part in range(3)}
    for part, vs in vals.items():
        for v in vs:
            produce(p, out, part, v)
    assert p.flush(30) == 0
    p.send_offsets_to_transaction([TopicPartition(src, 0, 10)], metadata, 30)
    commit_error = None
    try:
        p.commit_transaction(5)
    except KafkaException as exc:
        commit_error = exc
    print(f"\ncrash.markers={markers}: commit_transaction -> {commit_error or 'ok'}")

    assert b.proc is not None
    try:
        rc = b.proc.wait(timeout=30)
    except Exception:
        rc = None
    assert rc is not None, "the crash hook did not stop the broker during the commit"
    b.kill()  # reap the dead process
    # only the broker's recovery may complete the transaction: the client is gone
    del p
    on_disk = {part: disk_markers(b.data_dir, out, part) for part in range(3)}
    written = sum(len(m) for m in on_disk.values())
    print(f"crash.markers={markers}: broker exit code {rc}; data-partition markers on disk before restart {on_disk}")
    # N markers were durable at the crash, at most one of them in the offsets log: the partial state is real
    assert markers - 1 <= written <= markers or written == markers == 0, (
        f"{written} data-partition markers on disk, crash point after {markers} markers: {on_disk}")

    b.config.pop(CRASH_KEY)
    b.start()
    wait_stable(kit, b.bootstrap, out, 3, timeout=30)
    got = read_all(b.bootstrap, out, 3)
    for part in range(3):
        assert got[part] == vals[part], (
            f"partition {part}: read_committed {got[part]} after recovery, want {vals[part]} (committed)")
        kinds = [k for _, _, k in disk_markers(b.data_dir, out, part)]
        assert COMMIT in kinds and ABORT not in kinds, f"partition {part}: markers on disk {kinds}"
    offsets = kit.wait_until(lambda: (o := group_committed(b.bootstrap, group, src, [0])) and o[0] == 10 and o,
                             timeout=30, message="group offset committed by the recovered transaction")
    assert offsets == {0: 10}
    d = kit.wait_until(lambda: (x := describe_txn(b.bootstrap, tid)) is not None and x.state == "CompleteCommit" and x,
                       timeout=30, message="DescribeTransactions CompleteCommit")
    print(f"crash.markers={markers}: recovered {d}")
    consumer.close()


# -- timed-out transaction ----------------------------------------------------------------------


def test_timed_out_transaction_is_aborted_by_broker(broker_factory: Any, kit: Any) -> None:
    from confluent_kafka import KafkaException

    b = broker_factory(config=dict(BASE_CONFIG, **{"transaction.max.timeout.ms": "60000"}))
    topic, tid = "rec-timeout", "rec-timeout"
    kit.create_topic(b.bootstrap, topic, 2)
    timeout_ms = 2500
    p = txn_producer(b.bootstrap, tid, timeout_ms=timeout_ms)
    p.init_transactions(30)
    committed = [b"c:%d" % i for i in range(6)]
    p.begin_transaction()
    for i, v in enumerate(committed):
        produce(p, topic, i % 2, v)
    p.commit_transaction(30)

    p.begin_transaction()
    started = time.monotonic()
    first: dict[int, int] = {}

    def dr(err: Any, m: Any) -> None:
        if err is None:
            first[m.partition()] = min(first.get(m.partition(), m.offset()), m.offset())

    doomed = [b"doomed:%d" % i for i in range(10)]
    for i, v in enumerate(doomed):
        produce(p, topic, i % 2, v, on_delivery=dr)
    assert p.flush(30) == 0
    pinned = lso_hw(b.bootstrap, topic, 2)
    for part, (lso, hw) in pinned.items():
        assert lso == first[part] < hw, f"partition {part}: LSO {lso}, HW {hw}, open txn starts at {first[part]}"
    # not aborted before its timeout
    time.sleep(max(0.0, started + timeout_ms / 1000 * 0.5 - time.monotonic()))
    still = lso_hw(b.bootstrap, topic, 2)
    assert still == pinned, f"transaction resolved before half its timeout: {pinned} -> {still}"

    ends = wait_stable(kit, b.bootstrap, topic, 2, timeout=30)
    elapsed = time.monotonic() - started
    print(f"\ntimed-out transaction aborted after {elapsed:.1f}s (timeout {timeout_ms} ms); ends {ends}")
    assert elapsed >= timeout_ms / 1000 * 0.9
    for part in range(2):
        assert ends[part] > pinned[part][1], "no marker after the timed-out transaction"
    d = describe_txn(b.bootstrap, tid)
    assert d is not None and d.state == "CompleteAbort", f"DescribeTransactions: {d}"

    with pytest.raises(KafkaException) as ei:
        p.commit_transaction(15)
    err = ei.value.args[0]
    print(f"commit after the broker's abort: {err} (fatal={err.fatal()}, abortable={err.txn_requires_abort()})")
    assert err.fatal() or err.txn_requires_abort(), f"commit error neither fatal nor abortable: {err}"

    got = values_of(read_all(b.bootstrap, topic, 2))
    assert sorted(got) == sorted(committed), f"read_committed {got}"
    raw = values_of(read_all(b.bootstrap, topic, 2, committed=False))
    assert set(doomed) <= set(raw)

    # the transactional id is usable again; its next transaction is visible
    p2 = txn_producer(b.bootstrap, tid)
    p2.init_transactions(30)
    p2.begin_transaction()
    after = [b"after:%d" % i for i in range(4)]
    for i, v in enumerate(after):
        produce(p2, topic, i % 2, v)
    p2.commit_transaction(30)
    wait_stable(kit, b.bootstrap, topic, 2)
    got = values_of(read_all(b.bootstrap, topic, 2))
    assert sorted(got) == sorted(committed + after)


# -- kill -9 under a steady transactional workload ----------------------------------------------

STEADY_PARTS = 3
PER_TXN = 30  # ids per transaction, 10 per partition
ABORT_EVERY = 5  # every 5th transaction is aborted on purpose (after its records are acknowledged)


class SteadyWorker(threading.Thread):
    """Back-to-back transactions; records what the client learnt about each one."""

    def __init__(self, bootstrap: str, topic: str, tid: str) -> None:
        super().__init__(name="steady-txn", daemon=True)
        self.bootstrap, self.topic, self.tid = bootstrap, topic, tid
        self.outcomes: dict[int, str] = {}  # txn -> committed | aborted | in-doubt
        self.notes: list[str] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.producers = 0

    def committed(self) -> int:
        return sum(1 for o in list(self.outcomes.values()) if o == "committed")

    def _producer(self) -> Any:
        from confluent_kafka import KafkaException

        while not self.halt.is_set():
            p = txn_producer(self.bootstrap, self.tid, timeout_ms=20_000)
            try:
                p.init_transactions(10)
                self.producers += 1
                return p
            except KafkaException as exc:
                self.notes.append(f"init_transactions: {exc}")
                time.sleep(0.2)
        return None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc

    def _run(self) -> None:
        p = self._producer()
        k = 0
        while p is not None and not self.halt.is_set():
            k += 1
            outcome, replace = self._one(p, k)
            self.outcomes[k] = outcome
            if replace:
                p = self._producer()

    def _finish(self, p: Any, action: Callable[[float], None], what: str) -> tuple[str, bool] | None:
        """Run commit/abort, retrying retriable errors; None = done, else (outcome, replace producer)."""
        from confluent_kafka import KafkaException

        for _attempt in range(6):
            try:
                action(10)
                return None
            except KafkaException as exc:
                err = exc.args[0]
                self.notes.append(f"{what}: {err}")
                if err.fatal():
                    return "in-doubt", True
                if err.txn_requires_abort():
                    if what == "abort":
                        return "in-doubt", True
                    try:
                        p.abort_transaction(10)
                        return "aborted", False
                    except KafkaException as exc2:
                        self.notes.append(f"abort after {what}: {exc2}")
                        return "in-doubt", True
                if not err.retriable():
                    return "in-doubt", True
        return "in-doubt", True

    def _one(self, p: Any, k: int) -> tuple[str, bool]:
        from confluent_kafka import KafkaException

        try:
            p.begin_transaction()
        except KafkaException as exc:
            self.notes.append(f"begin: {exc}")
            return "in-doubt", True
        for j in range(PER_TXN):
            i = k * PER_TXN + j
            produce(p, self.topic, i % STEADY_PARTS, b"%d:%d" % (k, i))
        if k % ABORT_EVERY == 0:
            if p.flush(10) != 0:
                self.notes.append(f"txn {k}: flush before abort left records")
            res = self._finish(p, p.abort_transaction, "abort")
            return res or ("aborted", False)
        res = self._finish(p, p.commit_transaction, "commit")
        return res or ("committed", False)


def check_settled_before(bootstrap: str, topic: str, settled: dict[int, str], when: str) -> None:
    """While the workload goes on: transactions the client had finished are committed or aborted for good.

    A read_committed reader stops at the last stable offset; every transaction finished before the
    snapshot lies below it (one producer, transactions in sequence), so each committed one must be
    wholly visible and no aborted one at all."""
    got = read_all(bootstrap, topic, STEADY_PARTS)
    seen: dict[int, int] = {}
    ids: list[int] = []
    for vs in got.values():
        for v in vs:
            k, i = (int(x) for x in v.split(b":"))
            seen[k] = seen.get(k, 0) + 1
            ids.append(i)
    assert len(ids) == len(set(ids)), f"{when}: {len(ids) - len(set(ids))} duplicate ids visible"
    bad = [f"txn {k} {o}: {seen.get(k, 0)} visible" for k, o in sorted(settled.items())
           if (o == "committed" and seen.get(k, 0) != PER_TXN) or (o == "aborted" and seen.get(k, 0))]
    assert not bad, f"{when}: {bad[:10]}"


def test_kill9_under_steady_transactions(broker_factory: Any, kit: Any) -> None:
    b = broker_factory(config=dict(BASE_CONFIG, **{"log.segment.bytes": str(64 << 10)}))
    topic = "rec-steady"
    kit.create_topic(b.bootstrap, topic, STEADY_PARTS)
    w = SteadyWorker(b.bootstrap, topic, "rec-steady")
    w.start()
    kills = []
    try:
        target = 0
        for n in range(3):
            target = w.committed() + 8
            kit.wait_until(lambda: w.committed() >= target or not w.is_alive(), timeout=60,
                           message=f"{target} committed transactions")
            assert w.is_alive(), f"worker died: {w.error!r}"
            settled = {k: o for k, o in dict(w.outcomes).items() if o != "in-doubt"}
            kills.append((len(w.outcomes), w.committed()))
            hard_restart(b)
            check_settled_before(b.bootstrap, topic, settled, f"after kill -9 #{n + 1}")
        target = w.committed() + 8
        kit.wait_until(lambda: w.committed() >= target or not w.is_alive(), timeout=60,
                       message=f"{target} committed transactions after the last restart")
    finally:
        w.halt.set()
        w.join(60)
    assert not w.is_alive(), "worker did not stop"
    assert w.error is None, f"worker failed: {w.error!r}"
    outcomes = dict(w.outcomes)
    summary = {o: sum(1 for x in outcomes.values() if x == o) for o in ("committed", "aborted", "in-doubt")}
    print(f"\nkills at (txns, committed) {kills}; outcomes {summary}; producers {w.producers}; "
          f"client notes {w.notes[:8]}")

    wait_stable(kit, b.bootstrap, topic, STEADY_PARTS, timeout=40)
    got = read_all(b.bootstrap, topic, STEADY_PARTS)
    raw = read_all(b.bootstrap, topic, STEADY_PARTS, committed=False)
    seen: dict[int, int] = {}  # txn -> visible ids
    ids: list[int] = []
    for part, vs in got.items():
        pairs = [tuple(int(x) for x in v.split(b":")) for v in vs]
        assert pairs == sorted(pairs), f"partition {part}: records out of transaction order"
        for k, i in pairs:
            assert i % STEADY_PARTS == part
            seen[k] = seen.get(k, 0) + 1
            ids.append(i)
    dups = len(ids) - len(set(ids))
    assert dups == 0, f"{dups} duplicate ids visible read_committed"
    unknown = sorted(set(seen) - set(outcomes))
    assert not unknown, f"records of transactions the client never finished are visible: {unknown}"
    bad = []
    for k, o in sorted(outcomes.items()):
        n = seen.get(k, 0)
        if o == "committed" and n != PER_TXN:
            bad.append(f"txn {k} committed, {n}/{PER_TXN} visible")
        elif o == "aborted" and n:
            bad.append(f"txn {k} aborted, {n} visible")
        elif o == "in-doubt" and n not in (0, PER_TXN):
            bad.append(f"txn {k} in doubt, torn: {n}/{PER_TXN} visible")
    assert not bad, f"{len(bad)} anomalies: {bad[:10]}"
    aborted_in_log = sum(1 for v in values_of(raw) if outcomes.get(int(v.split(b":")[0])) == "aborted")
    assert summary["committed"] >= 30 and summary["aborted"] >= 3
    assert aborted_in_log >= PER_TXN, "no aborted records reached the log: read_committed filtering untested"


# -- the aborted-transaction index across restarts ------------------------------------------------


def test_aborted_index_survives_restarts(broker_factory: Any, kit: Any) -> None:
    b = broker_factory(config=dict(BASE_CONFIG))
    topic, tid, parts = "rec-index", "rec-index", 2
    kit.create_topic(b.bootstrap, topic, parts, config={"segment.bytes": str(8 << 10)})
    p = txn_producer(b.bootstrap, tid)
    p.init_transactions(30)
    pad = b"." * 150
    committed: dict[int, list[bytes]] = {q: [] for q in range(parts)}
    aborted: set[bytes] = set()
    txn = 0

    def run_txns(n: int, abort_when: Callable[[int], bool]) -> None:
        nonlocal txn
        for _ in range(n):
            txn += 1
            p.begin_transaction()
            vals = {q: [b"t%d:%d:%d:" % (txn, q, i) + pad for i in range(10)] for q in range(parts)}
            for q, vs in vals.items():
                for v in vs:
                    produce(p, topic, q, v)
            if abort_when(txn):
                assert p.flush(30) == 0
                p.abort_transaction(30)
                aborted.update(v for vs in vals.values() for v in vs)
            else:
                p.commit_transaction(30)
                for q, vs in vals.items():
                    committed[q].extend(vs)

    def check(when: str) -> None:
        ends = wait_stable(kit, b.bootstrap, topic, parts)
        got = read_all(b.bootstrap, topic, parts)
        for q in range(parts):
            leaked = [v[:12] for v in got[q] if v in aborted]
            assert not leaked, f"{when}: partition {q}: {len(leaked)} aborted records visible, e.g. {leaked[:3]}"
            assert got[q] == committed[q], f"{when}: partition {q}: {len(got[q])} records, want {len(committed[q])}"
        kp = read_all_kafkapython(b.bootstrap, topic, ends)
        for q in range(parts):
            assert kp[q] == committed[q], (
                f"{when}: kafka-python partition {q}: {len(kp[q])} records "
                f"({sum(1 for v in kp[q] if v in aborted)} aborted), want {len(committed[q])}")

    run_txns(12, lambda t: t % 3 == 1)
    check("before restart")
    segments = {q: kit.segment_files(b.data_dir, topic, q) for q in range(parts)}
    assert all(len(s) >= 3 for s in segments.values()), f"segments did not roll: {segments}"
    idx = sorted(b.data_dir.glob(f"{topic}-*/*.txnindex"))
    assert any(f.stat().st_size >= 34 for f in idx), f"no aborted-transaction index entries on disk: {idx}"

    b.stop()
    b.start()
    check("after clean restart")

    p = txn_producer(b.bootstrap, tid)
    p.init_transactions(30)
    run_txns(4, lambda t: t % 2 == 0)  # ends with an abort just before the crash
    check("before kill -9")
    hard_restart(b)
    check("after kill -9")
