"""oncelog's producer transactions (``oncelog.client``) against the real broker.

Under both transaction versions (the broker's ``oncelog.transaction.version``:
1 = classic AddPartitionsToTxn/EndTxn v4, 2 = KIP-890's implicit adds and
epoch bump per EndTxn):

* commit/abort visibility, read back with confluent-kafka and with our own
  consumer under read_committed: every committed record exactly once, no
  aborted one;
* a zombie fenced by a second producer with the same transactional id;
* consume-transform-produce with ``send_offsets_to_transaction`` (the group's
  offsets move only on commit; a stale generation is refused, KIP-447);
* KIP-939: a subprocess prepares and is killed with SIGKILL after printing
  its ``PreparedTxnState``; another process recovers with
  ``init_transactions(keep_prepared_txn=True)`` and ``complete_transaction``
  commits exactly the prepared records (or aborts them for a mismatched state).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest

from oncelog.client import Consumer, ConsumerGroupMetadata, PreparedTxnState, Producer, TopicPartition, aio
from oncelog.client.connection import Connection
from oncelog.client.errors import (
    IllegalGenerationError,
    IllegalStateError,
    InvalidTxnStateError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortedError,
)
from oncelog.testing import EmbeddedBroker

pytestmark = [pytest.mark.timeout(240)]

TV = [1, 2]


def _broker(factory: Callable[..., EmbeddedBroker], tv: int, **extra: str) -> EmbeddedBroker:
    return factory(config={"oncelog.transaction.version": str(tv), **extra}, name=f"tv{tv}")


def _settled_ends(bootstrap: str, topic: str, partitions: int, kit: Any) -> dict[int, int]:
    """The end offsets once every transaction marker is written (LSO == high watermark)."""
    with Consumer({"bootstrap.servers": bootstrap, "isolation.level": "read_committed"}) as c:
        def settled() -> dict[int, int] | None:
            hws = {q: hw for q, (_, hw) in kit.confluent_watermarks(bootstrap, topic, partitions).items()}
            return hws if all(c.get_watermark_offsets((topic, q)) == (0, hws[q]) for q in hws) else None

        return kit.wait_until(settled, timeout=30, message="LSO at the high watermark")


def read_ours(bootstrap: str, topic: str, ends: dict[int, int], committed: bool = True,
              extra: dict[str, Any] | None = None) -> list[bytes]:
    """Every value our consumer returns up to ``ends`` (read_committed by default)."""
    out: list[bytes] = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                   "isolation.level": "read_committed" if committed else "read_uncommitted", **(extra or {})}) as c:
        c.assign([TopicPartition(topic, q) for q in ends])
        deadline = time.monotonic() + 60
        while any(c.position((topic, q)) < ends[q] for q in ends):
            assert time.monotonic() < deadline, ({q: c.position((topic, q)) for q in ends}, ends)
            out.extend(m.value for m in c.consume(1000, 0.2))
    return out


def read_confluent(bootstrap: str, topic: str, partitions: int, expect: int) -> list[bytes]:
    """librdkafka under read_committed: read until ``expect`` values, then 1.5 s more for any extra."""
    from confluent_kafka import Consumer as CConsumer
    from confluent_kafka import TopicPartition as CTP

    c = CConsumer({"bootstrap.servers": bootstrap, "group.id": "txn-check", "enable.auto.commit": False,
                   "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    out: list[bytes] = []
    try:
        c.assign([CTP(topic, q, 0) for q in range(partitions)])
        deadline = time.monotonic() + 60
        quiet_until = None
        while True:
            for m in c.consume(1000, 0.2):
                assert not m.error(), m.error()
                out.append(m.value())
            if len(out) >= expect and quiet_until is None:
                quiet_until = time.monotonic() + 1.5
            if quiet_until is not None and time.monotonic() > quiet_until:
                return out
            assert time.monotonic() < deadline, f"read {len(out)} of {expect}"
    finally:
        c.close()


# -- commit / abort visibility --------------------------------------------------------------------


@pytest.mark.parametrize("tv", TV)
def test_commit_and_abort_visibility(broker_factory: Callable[..., EmbeddedBroker], kit: Any, tv: int) -> None:
    b = _broker(broker_factory, tv)
    kit.create_topic(b.bootstrap, "vis", 3)
    committed: list[bytes] = []
    aborted: list[bytes] = []
    epochs = []
    with Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"vis-{tv}", "linger.ms": 2,
                   "compression.type": "zstd"}) as p:
        with pytest.raises(IllegalStateError):
            p.produce("vis", b"too early")  # before init_transactions()
        p.init_transactions()
        with pytest.raises(IllegalStateError):
            p.produce("vis", b"no transaction")  # before begin_transaction()
        epochs.append(p.producer_id)
        for t in range(8):
            p.begin_transaction()
            vals = [b"t%d-%d" % (t, i) for i in range(300)]
            for i, v in enumerate(vals):
                p.produce("vis", v, key=b"%d" % i)
            if t % 4 == 1:
                p.flush()  # written, then aborted
                p.abort_transaction()
                aborted += vals
            elif t % 4 == 3:
                p.abort_transaction()  # aborted with records still buffered or in flight
                aborted += vals
            else:
                p.commit_transaction()
                committed += vals
            epochs.append(p.producer_id)
        # the batch API inside a transaction
        p.begin_transaction()
        futs = p.produce_batch("vis", [b"batch-%d" % i for i in range(500)], partition=2)
        p.commit_transaction()
        assert all(f.result(0).offset >= 0 for f in futs)
        committed += [b"batch-%d" % i for i in range(500)]
    pid = epochs[0][0]
    if tv >= 2:
        # KIP-890: every EndTxn bumps the epoch, and the producer adopts it; an abort before anything
        # was sent sends no EndTxn (nothing was added to the transaction), as in Java
        steps = [e2[1] - e1[1] for e1, e2 in zip(epochs, epochs[1:])]
        assert {e[0] for e in epochs} == {pid}
        assert [s for t, s in enumerate(steps) if t % 4 != 3] == [1] * 6 and set(steps) <= {0, 1}, epochs
    else:
        assert {e[0] for e in epochs} == {pid}
    ends = _settled_ends(b.bootstrap, "vis", 3, kit)
    ours = read_ours(b.bootstrap, "vis", ends)
    assert len(ours) == len(set(ours)) == len(committed) == 1700
    assert set(ours) == set(committed)
    theirs = read_confluent(b.bootstrap, "vis", 3, len(committed))
    assert sorted(theirs) == sorted(committed)
    everything = read_ours(b.bootstrap, "vis", ends, committed=False)
    flushed_aborts = {v for v in aborted if v.startswith((b"t1-", b"t5-"))}
    assert flushed_aborts <= set(everything)  # the aborted records were written, and are hidden above


def test_asyncio_transactions(broker_factory: Callable[..., EmbeddedBroker], kit: Any) -> None:
    b = _broker(broker_factory, 2)
    kit.create_topic(b.bootstrap, "avis", 2)

    async def run() -> None:
        async with aio.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "avis"}) as p:
            await p.init_transactions()
            await p.begin_transaction()
            futs = [p.produce("avis", b"c%d" % i) for i in range(100)]
            await p.commit_transaction()
            assert all(f.done() and f.result().offset >= 0 for f in futs)
            await p.begin_transaction()
            futs = [p.produce("avis", b"a%d" % i) for i in range(100)]
            await p.abort_transaction()
            done = await asyncio.gather(*futs, return_exceptions=True)
            # records still unsent when the abort began fail with TransactionAbortedError
            assert all(isinstance(x, TransactionAbortedError) or x.offset >= 0 for x in done), done

    asyncio.run(asyncio.wait_for(run(), 60))
    ends = _settled_ends(b.bootstrap, "avis", 2, kit)
    assert sorted(read_ours(b.bootstrap, "avis", ends)) == sorted(b"c%d" % i for i in range(100))


@pytest.mark.parametrize("tv", TV)
def test_failed_record_makes_the_transaction_abortable(broker_factory: Callable[..., EmbeddedBroker], kit: Any,
                                                       tv: int) -> None:
    """A record refused in a transaction (MESSAGE_TOO_LARGE) is an abortable error: commit raises it,
    abort clears it, and the next transaction starts on a new epoch (the refused batch left a
    sequence gap) and commits normally."""
    b = _broker(broker_factory, tv)
    kit.create_topic(b.bootstrap, "big", 1, {"max.message.bytes": "3000"})
    with Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"big-{tv}", "linger.ms": 0}) as p:
        p.init_transactions()
        p.begin_transaction()
        small = p.produce("big", b"ok-before")
        assert p.flush() == 0 and small.result(0).offset == 0
        big = p.produce("big", b"x" * 5000)
        with pytest.raises(KafkaError) as info:
            p.commit_transaction()
        assert info.value.name == "MESSAGE_TOO_LARGE" and info.value.txn_requires_abort and not info.value.fatal
        assert big.exception(0) is not None
        with pytest.raises(KafkaError):
            p.produce("big", b"refused while abortable")
        epoch = p.producer_id[1]
        p.abort_transaction()
        assert p.producer_id[1] == epoch + 1  # v1: InitProducerId bump; v2: EndTxn's bump
        p.begin_transaction()
        for i in range(20):
            p.produce("big", b"ok-%d" % i)
        p.commit_transaction()
    ends = _settled_ends(b.bootstrap, "big", 1, kit)
    assert read_ours(b.bootstrap, "big", ends) == [b"ok-%d" % i for i in range(20)]


@pytest.mark.parametrize("tv", TV)
def test_commit_times_out_then_resumes(broker_factory: Callable[..., EmbeddedBroker], kit: Any, tv: int) -> None:
    """The coordinator is unreachable (the broker was killed -9): commit retries until its timeout
    and raises KafkaTimeoutError (retriable); called again once the broker is back, it finishes the
    same transaction. Also: confluent-kafka's positional timeouts are accepted."""
    b = _broker(broker_factory, tv)
    kit.create_topic(b.bootstrap, "resume", 2)
    with Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"resume-{tv}",
                   "request.timeout.ms": 2000}) as p:
        p.init_transactions(20)  # a timeout in seconds, as in confluent-kafka (not keep_prepared_txn)
        p.begin_transaction()
        for i in range(50):
            p.produce("resume", b"r%d" % i, partition=i % 2)
        assert p.flush(20) == 0
        b.kill()
        t0 = time.monotonic()
        with pytest.raises(KafkaTimeoutError) as info:
            p.commit_transaction(2)
        assert info.value.retriable and 1.5 < time.monotonic() - t0 < 15
        with pytest.raises(IllegalStateError):
            p.begin_transaction()  # still committing
        b.start()
        p.commit_transaction(30)
        p.begin_transaction()
        p.produce("resume", b"next", partition=0)
        p.commit_transaction(30)
    ends = _settled_ends(b.bootstrap, "resume", 2, kit)
    assert sorted(read_ours(b.bootstrap, "resume", ends)) == sorted([b"r%d" % i for i in range(50)] + [b"next"])


def test_abort_right_after_a_commit_is_not_fenced(broker_factory: Callable[..., EmbeddedBroker], kit: Any) -> None:
    """Transactions v2: right after a commit the coordinator still writes its markers (PrepareCommit,
    already at the bumped epoch), so the next transaction's first Produce is refused (retriable) and
    adds nothing. Aborting then must not send EndTxn: Kafka answers an EndTxn at that epoch in
    PrepareCommit with PRODUCER_FENCED (fatal)."""
    b = _broker(broker_factory, 2)
    kit.create_topic(b.bootstrap, "race", 24)
    with Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "race", "linger.ms": 0}) as p:
        p.init_transactions()
        for t in range(30):
            p.begin_transaction()
            for q in range(24):
                p.produce("race", b"%d-%d" % (t, q), partition=q)
            if t % 2:
                p.abort_transaction()
            else:
                p.commit_transaction()
    ends = _settled_ends(b.bootstrap, "race", 24, kit)
    assert sorted(read_ours(b.bootstrap, "race", ends)) == sorted(
        b"%d-%d" % (t, q) for t in range(0, 30, 2) for q in range(24))


# -- zombie fencing -------------------------------------------------------------------------------


@pytest.mark.parametrize("tv", TV)
def test_zombie_is_fenced(broker_factory: Callable[..., EmbeddedBroker], kit: Any, tv: int) -> None:
    b = _broker(broker_factory, tv)
    kit.create_topic(b.bootstrap, "zombie", 2)
    conf = {"bootstrap.servers": b.bootstrap, "transactional.id": f"zombie-{tv}"}
    zombie = Producer(conf)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        for i in range(50):
            zombie.produce("zombie", b"zombie-%d" % i, partition=i % 2)
        assert zombie.flush() == 0  # written in the zombie's open transaction
        with Producer(conf) as fresh:
            fresh.init_transactions()  # fences the zombie and aborts its transaction
            assert fresh.producer_id[1] > zombie.producer_id[1]
            with pytest.raises(ProducerFencedError) as info:
                zombie.commit_transaction()
            assert info.value.fatal and not info.value.txn_requires_abort
            # fatal: every later call raises the same error
            for call in (zombie.begin_transaction, zombie.abort_transaction, zombie.commit_transaction,
                         lambda: zombie.produce("zombie", b"late")):
                with pytest.raises(ProducerFencedError):
                    call()
            fresh.begin_transaction()
            for i in range(30):
                fresh.produce("zombie", b"fresh-%d" % i, partition=i % 2)
            fresh.commit_transaction()
        # a zombie that only produces after it was fenced: its records fail (v1: AddPartitionsToTxn is
        # fenced, fatal; v2: the Produce is refused, abortable) and ending the transaction is fenced
        late = Producer(conf)
        try:
            late.init_transactions()
            late.begin_transaction()
            with Producer(conf) as fresh2:
                fresh2.init_transactions()
                fut = late.produce("zombie", b"late-zombie", partition=0)
                late.flush()
                assert isinstance(fut.exception(0), KafkaError)
                with pytest.raises(ProducerFencedError):
                    late.abort_transaction()
                with pytest.raises(ProducerFencedError):
                    late.begin_transaction()
        finally:
            late.close()
    finally:
        zombie.close()
    ends = _settled_ends(b.bootstrap, "zombie", 2, kit)
    want = sorted(b"fresh-%d" % i for i in range(30))
    assert sorted(read_ours(b.bootstrap, "zombie", ends)) == want
    assert sorted(read_confluent(b.bootstrap, "zombie", 2, 30)) == want


# -- consume-transform-produce --------------------------------------------------------------------


def _raw_join(bootstrap: str, group: str) -> tuple[Connection, str, int]:
    conn = Connection(bootstrap)
    body = {"group_id": group, "session_timeout": 30000, "rebalance_timeout": 30000, "member_id": "",
            "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}],
            "reason": None}
    r = conn.request(11, 5, body)
    if int(r.error_code) == 79:  # MEMBER_ID_REQUIRED
        body["member_id"] = r.member_id
        r = conn.request(11, 5, body)
    assert int(r.error_code) == 0, r
    me, gen = r.member_id, int(r.generation_id)
    s = conn.request(14, 3, {"group_id": group, "generation_id": gen, "member_id": me, "group_instance_id": None,
                             "assignments": [{"member_id": me, "assignment": b""}]})
    assert int(s.error_code) == 0, s
    return conn, me, gen


def stable_committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    """The group's committed offsets once no transaction holds pending ones (OffsetFetch v7, require_stable:
    UNSTABLE_OFFSET_COMMIT while a transaction's offsets await their marker)."""
    with Connection(bootstrap) as conn:
        deadline = time.monotonic() + 30
        while True:
            r = conn.request(9, 7, {"group_id": group, "require_stable": True,
                                    "topics": [{"name": topic, "partition_indexes": list(range(partitions))}]})
            codes = {int(pp.error_code) for t in r.topics for pp in t.partitions} | {int(r.error_code)}
            if codes == {0}:
                return {(t.name, int(pp.partition_index)): int(pp.committed_offset)
                        for t in r.topics for pp in t.partitions if pp.committed_offset >= 0}
            assert codes <= {0, 88}, codes  # 88: UNSTABLE_OFFSET_COMMIT
            assert time.monotonic() < deadline, "offsets never became stable"
            time.sleep(0.05)


@pytest.mark.parametrize("tv", TV)
def test_consume_transform_produce(broker_factory: Callable[..., EmbeddedBroker], kit: Any, tv: int) -> None:
    b = _broker(broker_factory, tv)
    kit.create_topic(b.bootstrap, "in", 2)
    kit.create_topic(b.bootstrap, "out", 2)
    with Producer({"bootstrap.servers": b.bootstrap}) as p:
        for i in range(400):
            p.produce("in", b"%d" % i, partition=i % 2)
    group = f"ctp-{tv}"
    conn, member, gen = _raw_join(b.bootstrap, group)
    meta = ConsumerGroupMetadata(group, gen, member)
    try:
        with Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"ctp-{tv}"}) as p, \
                Consumer({"bootstrap.servers": b.bootstrap, "auto.offset.reset": "earliest"}) as c:
            p.init_transactions()
            c.assign([("in", 0), ("in", 1)])

            def transform(n: int) -> dict[tuple[str, int], int]:
                got = 0
                while got < n:
                    for m in c.consume(n - got, 1.0):
                        p.produce("out", m.value + b"!", partition=m.partition)
                        got += 1
                return {("in", q): c.position(("in", q)) for q in (0, 1)}

            # 1: committed with the member's real generation
            p.begin_transaction()
            first = transform(200)
            p.send_offsets_to_transaction(first, meta)
            p.commit_transaction()
            assert stable_committed(b.bootstrap, group, "in", 2) == first
            # 2: aborted: the offsets stay where they were
            p.begin_transaction()
            second = transform(100)
            p.send_offsets_to_transaction(second, meta)
            p.abort_transaction()
            assert stable_committed(b.bootstrap, group, "in", 2) == first
            # 3: a zombie generation is refused (KIP-447): abortable, the offsets do not move
            p.begin_transaction()
            with pytest.raises(IllegalGenerationError) as info:
                p.send_offsets_to_transaction(second, ConsumerGroupMetadata(group, gen + 7, member))
            assert info.value.txn_requires_abort and not info.value.fatal
            with pytest.raises(IllegalGenerationError):
                p.commit_transaction()  # abortable: only abort_transaction() goes on
            p.abort_transaction()
            assert stable_committed(b.bootstrap, group, "in", 2) == first
            # 4: a plain group id (generation -1, no member): accepted, as in Kafka
            p.begin_transaction()
            p.produce("out", b"plain", partition=0)
            p.send_offsets_to_transaction({("in", 0): first[("in", 0)] + 1}, group)
            p.commit_transaction()
            assert stable_committed(b.bootstrap, group, "in", 2) == {("in", 0): first[("in", 0)] + 1, ("in", 1): first[("in", 1)]}
    finally:
        conn.close()
    ends = _settled_ends(b.bootstrap, "out", 2, kit)
    got = read_ours(b.bootstrap, "out", ends)
    assert len(got) == 201 and b"plain" in got
    assert sorted(got) == sorted([b"%d!" % i for i in sorted(range(400), key=lambda i: (i % 2, i))
                                  if (i // 2) < first[("in", i % 2)]] + [b"plain"])


# -- KIP-939 two-phase commit -----------------------------------------------------------------------

_PREPARE = textwrap.dedent("""
    import sys, time
    from oncelog.client import Producer
    bootstrap, topic, tid, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                  "transaction.two.phase.commit.enable": "true"})
    p.init_transactions()
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, b"prepared-%d" % i, partition=i % 3)
    state = p.prepare_transaction()
    print(str(state), flush=True)
    time.sleep(600)  # killed with SIGKILL before it decides anything
""")


def _prepare_in_subprocess(bootstrap: str, topic: str, tid: str, n: int) -> str:
    proc = subprocess.Popen([sys.executable, "-c", _PREPARE, bootstrap, topic, tid, str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line, proc.stderr.read() if proc.poll() is not None else "no state printed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    return line


_COMPLETE = textwrap.dedent("""
    import sys
    from oncelog.client import PreparedTxnState, Producer
    bootstrap, tid, state = sys.argv[1], sys.argv[2], sys.argv[3]
    with Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                   "transaction.two.phase.commit.enable": "true"}) as p:
        p.init_transactions(keep_prepared_txn=True)
        p.complete_transaction(PreparedTxnState.from_string(state))
    print("completed", flush=True)
""")


@pytest.mark.parametrize("tv", TV)
@pytest.mark.parametrize("decision", ["match", "mismatch"])
def test_two_phase_commit_across_processes(broker_factory: Callable[..., EmbeddedBroker], kit: Any, tv: int,
                                           decision: str) -> None:
    b = _broker(broker_factory, tv, **{"transaction.two.phase.commit.enable": "true"})
    kit.create_topic(b.bootstrap, "tpc", 3)
    tid = f"tpc-{tv}-{decision}"
    # an earlier committed transaction of the same id, so that a stale state exists
    with Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid,
                   "transaction.two.phase.commit.enable": "true"}) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce("tpc", b"before", partition=0)
        stale = p.prepare_transaction()
        p.commit_transaction()
    s = _prepare_in_subprocess(b.bootstrap, "tpc", tid, 600)
    prepared = PreparedTxnState.from_string(s)
    assert str(prepared) == s and prepared.has_transaction() and prepared != stale
    # nothing of the prepared transaction is visible while it is undecided
    with Consumer({"bootstrap.servers": b.bootstrap, "isolation.level": "read_committed"}) as c:
        assert c.get_watermark_offsets(("tpc", 0))[1] == 2  # "before" and its commit marker
    given = s if decision == "match" else str(PreparedTxnState(prepared.producer_id, prepared.epoch + 1)
                                              if tv < 2 else stale)
    out = subprocess.run([sys.executable, "-c", _COMPLETE, b.bootstrap, tid, given], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0 and out.stdout.strip() == "completed", out.stderr
    ends = _settled_ends(b.bootstrap, "tpc", 3, kit)
    want = [b"before"] + ([b"prepared-%d" % i for i in range(600)] if decision == "match" else [])
    got = read_ours(b.bootstrap, "tpc", ends)
    assert sorted(got) == sorted(want)
    assert sorted(read_confluent(b.bootstrap, "tpc", 3, len(want))) == sorted(want)
    # the id goes on normally afterwards
    with Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid,
                   "transaction.two.phase.commit.enable": "true"}) as p:
        p.init_transactions(keep_prepared_txn=True)  # nothing kept: an ordinary start
        with pytest.raises(InvalidTxnStateError):
            p.complete_transaction(prepared)
        p.begin_transaction()
        p.produce("tpc", b"after", partition=1)
        p.commit_transaction()


def test_two_phase_commit_errors(broker_factory: Callable[..., EmbeddedBroker], kit: Any) -> None:
    b = _broker(broker_factory, 2)
    kit.create_topic(b.bootstrap, "tpcx", 1)
    with Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "no-2pc"}) as p:
        p.init_transactions()
        p.begin_transaction()
        with pytest.raises(InvalidTxnStateError):
            p.prepare_transaction()  # transaction.two.phase.commit.enable is false
        p.abort_transaction()
    # the broker refuses 2PC unless transaction.two.phase.commit.enable is set on it: fatal
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "2pc-refused",
                  "transaction.two.phase.commit.enable": True})
    try:
        with pytest.raises(KafkaError) as info:
            p.init_transactions()
        assert info.value.name == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" and info.value.fatal
    finally:
        p.close()
    for bad in ("1", "1:2:3", "x:1", "-1:0", "5:-2"):
        with pytest.raises(ValueError):
            PreparedTxnState.from_string(bad)
    assert str(PreparedTxnState.from_string("")) == "" and not PreparedTxnState().has_transaction()


# -- lost answers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("tv", TV)
def test_transactions_survive_lost_answers(tmp_path: Any, kit: Any, tv: int) -> None:
    """Answers to Produce, FindCoordinator, InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and
    TxnOffsetCommit are dropped and the connection closed (the broker applied the request): the producer
    looks the coordinator up again and retries, and every committed record is there once, no aborted one."""
    from oncelog.testing import free_port
    from oncelog.testing.fault_proxy import FaultProxy

    port = free_port()
    proxy = FaultProxy(("127.0.0.1", port), seed=939 + tv, connect_timeout=2.0)
    proxy.pause()
    config = {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}", "oncelog.transaction.version": str(tv)}
    broker = EmbeddedBroker(data_dir=tmp_path / "data", port=port, log_path=tmp_path / "broker.log", config=config)
    proxy.start()
    committed: list[bytes] = []
    try:
        broker.start()
        kit.create_topic(proxy.bootstrap, "lossy", 3)
        proxy.set_faults(drop_response_rate=0.15, drop_mode="close", api_keys={0, 10, 22, 24, 25, 26, 28})
        proxy.resume()
        with Producer({"bootstrap.servers": proxy.bootstrap, "transactional.id": f"lossy-{tv}",
                       "linger.ms": 1, "request.timeout.ms": 5000}) as p:
            p.init_transactions()
            for t in range(24):
                p.begin_transaction()
                vals = [b"%d-%d" % (t, i) for i in range(60)]
                for i, v in enumerate(vals):
                    p.produce("lossy", v, partition=i % 3)
                p.send_offsets_to_transaction({("lossy", 0): t + 1}, f"lossy-group-{tv}")
                if t % 3 == 2:
                    p.abort_transaction()
                else:
                    p.commit_transaction()
                    committed += vals
        faults = proxy.stats.faults
        proxy.pause()
        assert faults >= 3, proxy.stats  # the faults really happened
        ends = _settled_ends(broker.bootstrap, "lossy", 3, kit)
        got = read_ours(broker.bootstrap, "lossy", ends)
        assert len(got) == len(set(got)) == len(committed) == 16 * 60
        assert set(got) == set(committed)
        assert stable_committed(broker.bootstrap, f"lossy-group-{tv}", "lossy", 1) == {("lossy", 0): 23}
    finally:
        broker.close()
        proxy.stop()


# -- a second Kafka implementation ------------------------------------------------------------------


def test_transactions_against_librdkafka_mock() -> None:
    """librdkafka's 3-broker mock cluster (another implementation; no transaction.version feature, so
    transactions v1, leaders spread over the brokers): commit, abort and send_offsets complete, and each
    committed record is in the log once (its read_committed is wrong, so read_uncommitted)."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "common.py")
    spec = importlib.util.spec_from_file_location("oncelog_bench_common", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("oncelog_bench_common", module)
    spec.loader.exec_module(module)
    with module.MockCluster(3) as mock:
        mock.create_topic("mt", 6)
        committed: list[bytes] = []
        with Producer({"bootstrap.servers": mock.bootstrap, "transactional.id": "mock-txn"}) as p:
            p.init_transactions()
            assert not p._core.txn.tv2
            for t in range(6):
                p.begin_transaction()
                futs = [p.produce("mt", b"%d-%d" % (t, i), partition=i % 6) for i in range(120)]
                p.send_offsets_to_transaction({("mt", 0): t + 1}, "mock-group")
                if t % 2:
                    p.abort_transaction()
                    assert all(f.exception(0) is None or isinstance(f.exception(0), TransactionAbortedError)
                               for f in futs)
                else:
                    p.commit_transaction()
                    assert all(f.result(0).offset >= 0 for f in futs)
                    committed += [b"%d-%d" % (t, i) for i in range(120)]
            leaders = {p._core.cluster.leader("mt", q) for q in range(6)}
        assert len(leaders) > 1 and None not in leaders
        with Consumer({"bootstrap.servers": mock.bootstrap, "auto.offset.reset": "earliest"}) as c:
            ends = {q: c.get_watermark_offsets(("mt", q))[1] for q in range(6)}
        # the mock writes its transaction markers with CRC 0 (librdkafka's own consumer refuses them too)
        got = read_ours(mock.bootstrap, "mt", ends, committed=False, extra={"check.crcs": False})
        assert set(committed) <= set(got) and len(set(got)) == len(got)
