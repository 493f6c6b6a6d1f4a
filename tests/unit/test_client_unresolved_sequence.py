"""A given-up batch's sequence is *unresolved* (KIP-360, as Java's idempotent producer), sans-IO.

When a sent batch of a partition is given up while its fate is unknown (``delivery.timeout.ms`` or
``retries`` exhausted after a lost answer), Java marks its sequence unresolved
(TransactionManager.markSequenceUnresolved), keeps resending the partition's other sent batches under
the old epoch with their own sequences (an answer of success or DUPLICATE_SEQUENCE_NUMBER shows they
and the given-up one were written; OUT_OF_ORDER_SEQUENCE_NUMBER shows they were not), sends nothing new
for the partition meanwhile, and bumps the epoch only once none is left and a sequence gap remains
(maybeResolveSequences). Bumping at once (what the producer did before, review5 K1) resent a later
batch in doubt at epoch + 1 from sequence 0, and the broker wrote it a second time if its first
attempt had been written.

The broker here is a fake leader that decides every batch with the broker's own idempotence rules
(:func:`oncelog.broker.producer_state.check_batch`: duplicates by sequence within the last five
batches, OUT_OF_ORDER_SEQUENCE_NUMBER for a gap, a higher epoch from sequence 0) and keeps the values
it wrote; each request waits until the test delivers it, written or not, answered or not.
"""

from __future__ import annotations

import asyncio
import time
import types
from concurrent.futures import Future
from typing import Any

import pytest

from oncelog.broker.producer_state import Accept, Duplicate, Incoming, ProducerEntry, check_batch
from oncelog.client.aio.producer import ProducerCore
from oncelog.client.config import parse_config
from oncelog.client.errors import DeliveryTimeoutError, KafkaConnectionError, RequestTimeoutError
from oncelog.protocol.codec import decode_request
from oncelog.protocol.records import decode_records, parse_batch_header

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
NODE = 1


class _Leader:
    """The partition leader: the broker's sequence rules and a log of the values written."""

    closed = False
    conditional_produce = False

    def __init__(self) -> None:
        self.entry: ProducerEntry | None = None
        self.log: list[bytes] = []
        self.pending: list[Future[Any]] = []
        self.bodies: list[Any] = []
        self.sent: list[tuple[int, int, int]] = []  # (epoch, base sequence, records) of every batch received

    def version(self, api_key: int, versions: tuple[int, int]) -> int:
        return 9

    def send(self, api_key: int, version: int, body: Any, *, expect_response: bool = True,
             raw_response: bool = False) -> Future[Any]:
        fut: Future[Any] = Future()
        self.pending.append(fut)
        self.bodies.append(body)
        return fut

    def deliver(self, *, written: bool, answered: bool) -> None:
        """The oldest request: it reaches the broker (``written``: it is decided and appended if
        accepted) or not, and its answer reaches the producer or is lost (a closed connection)."""
        fut, body = self.pending.pop(0), self.bodies.pop(0)
        answer = self._decide(body) if written else None
        if answered:
            assert answer is not None, "an answer needs the request to reach the broker"
            fut.set_result(answer)
        else:
            fut.set_exception(KafkaConnectionError("connection closed"))

    def _decide(self, body: Any) -> Any:
        req = decode_request(0, 9, b"".join(bytes(part) for part in body), 0)
        topics = []
        for td in req.topic_data:
            parts = []
            for pd in td.partition_data:
                raw = pd.records
                hdr = parse_batch_header(raw)
                count = hdr.last_offset_delta + 1
                self.sent.append((hdr.producer_epoch, hdr.base_sequence, count))
                d = check_batch(self.entry, Incoming(hdr.producer_id, hdr.producer_epoch, hdr.base_sequence, count))
                code, base = 0, -1
                if isinstance(d, Accept):
                    base = len(self.log)
                    self.log.extend(r.value for r in decode_records(raw))
                    self.entry = d.entry_after(base, base + count - 1, 0)
                elif isinstance(d, Duplicate):
                    base = d.batch.first_offset  # nothing written: the original offsets (Kafka's answer)
                else:
                    code = int(d.code)
                parts.append(types.SimpleNamespace(index=pd.index, error_code=code, base_offset=base,
                                                   log_append_time=None, log_start_offset=0, error_message=None))
            topics.append(types.SimpleNamespace(name=td.name, partition_responses=parts))
        return types.SimpleNamespace(responses=topics)


def _producer(**config: Any) -> tuple[ProducerCore, _Leader]:
    core = ProducerCore(parse_config({"bootstrap.servers": "127.0.0.1:9", "delivery.timeout.ms": 3000,
                                      "request.timeout.ms": 1000, "linger.ms": 0, **config}, "producer"))
    core._idle = asyncio.Event()
    core.producer_id, core.producer_epoch = 7, 0
    leader = _Leader()
    known = types.SimpleNamespace(partitions=1)
    core.cluster.topic = lambda name: known  # type: ignore[method-assign]
    core.cluster.leader = lambda topic, partition: NODE  # type: ignore[method-assign]
    core.cluster.stale = lambda topic: False  # type: ignore[method-assign]
    core.cluster.last_refresh = time.monotonic() + 1e9  # no metadata refresh
    core.cluster.nodes = {NODE: types.SimpleNamespace(conn=leader)}
    return core, leader


def _produce(core: ProducerCore, name: str, n: int) -> tuple[Any, list[Future[Any]]]:
    """One batch of ``n`` records ``name-0`` ... (closed, ready to send)."""
    futs: list[Future[Any]] = [Future() for _ in range(n)]
    core.append_many("t", [b"%s-%d" % (name.encode(), i) for i in range(n)], None, 0, 1_700_000_000_000, futs)
    return core.partitions[("t", 0)].ready[-1], futs


def _pass(core: ProducerCore) -> None:
    """One sender pass, later than any retry backoff and earlier than any delivery timeout (the test ages a
    batch itself to expire it)."""
    core._pass(time.monotonic() + 1.0)


def _age(core: ProducerCore, b: Any) -> None:
    """Make ``b`` older than delivery.timeout.ms, as if produced that long ago (the others stay young)."""
    b.created -= core.delivery_timeout + 1
    oldest = getattr(core, "_request_oldest", {})  # a request in flight remembers its oldest batch
    for rid, sent in core._requests.items():
        if b in sent and rid in oldest:
            oldest[rid] = min(oldest[rid], b.created)


def _values(name: str, n: int) -> list[bytes]:
    return [b"%s-%d" % (name.encode(), i) for i in range(n)]


def _acked_first(core: ProducerCore, leader: _Leader) -> None:
    """A first batch, written and acknowledged: the broker knows the producer (a producer it has no state
    for would be accepted at any sequence)."""
    _produce(core, "p", 2)
    _pass(core)
    leader.deliver(written=True, answered=True)
    assert leader.log == _values("p", 2)


def _settle(core: ProducerCore, leader: _Leader) -> None:
    """Sender passes, every request now reaching the broker and answered, until nothing is left to send."""
    idle = 0
    for _ in range(20):
        _pass(core)
        idle = 0 if leader.pending else idle + 1
        if idle == 2:  # (a pass that bumps the epoch sends nothing; the next one sends)
            return
        while leader.pending:
            leader.deliver(written=True, answered=True)
    raise AssertionError("the producer kept sending")


def _two_in_doubt(core: ProducerCore, leader: _Leader, a_written: bool) -> tuple[Any, Any, list[Any], list[Any]]:
    """After an acknowledged batch, A then B sent (pipelined), both answers lost; A reached the broker
    or not, B did (written if A was, else refused for the gap)."""
    _acked_first(core, leader)
    a, a_futs = _produce(core, "a", 3)
    _pass(core)
    b, b_futs = _produce(core, "b", 2)
    _pass(core)
    assert (a.seq, b.seq, len(leader.pending)) == (2, 5, 2)
    leader.deliver(written=a_written, answered=False)
    leader.deliver(written=True, answered=False)
    return a, b, a_futs, b_futs



def _a_expired_in_flight_ahead_of_b() -> tuple[ProducerCore, _Leader, Any, list[Any], Any, list[Any]]:
    """A (3 records) and B (2) of one partition both in flight behind acknowledged ones; A then ages past
    delivery.timeout.ms and a sender pass fails it in flight."""
    core, leader = _producer()
    _acked_first(core, leader)
    a, a_futs = _produce(core, "a", 3)
    _pass(core)
    b, b_futs = _produce(core, "b", 2)
    _pass(core)
    _age(core, a)
    _pass(core)
    return core, leader, a, a_futs, b, b_futs

def test_expired_batch_then_a_later_written_batch_in_doubt_is_written_once() -> None:
    """A (written, answer lost) expires while B behind it (written, answer lost) is still retriable:
    B is resent under epoch 0 with its own sequence, answered as a duplicate, and every record is in the
    log once, in order; no epoch bump. It failed before: B was resent at epoch 1 from sequence 0 and
    written a second time."""
    core, leader = _producer()
    a, b, a_futs, b_futs = _two_in_doubt(core, leader, a_written=True)
    assert leader.log == _values("p", 2) + _values("a", 3) + _values("b", 2)
    _age(core, a)  # A is older than delivery.timeout.ms (B is not)
    _settle(core, leader)
    assert leader.log == _values("p", 2) + _values("a", 3) + _values("b", 2)  # B once
    assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in a_futs)
    assert [f.result(0).offset for f in b_futs] == [5, 6]
    _, c_futs = _produce(core, "c", 2)
    _settle(core, leader)
    assert [f.result(0).offset for f in c_futs] == [7, 8]
    assert leader.log == _values("p", 2) + _values("a", 3) + _values("b", 2) + _values("c", 2)  # each once
    assert leader.sent[-2:] == [(0, 5, 2), (0, 7, 2)]  # (epoch, sequence, records): B's resend, then C
    assert (core.producer_epoch, core.stats["epoch_bumps"]) == (0, 0)


def test_batch_out_of_retries_then_a_later_written_batch_in_doubt_is_written_once() -> None:
    """The same with ``retries`` exhausted instead of an expiry: A's second attempt is written and its
    answer lost (A has no retry left), B's first attempt is written and its answer lost (B has one
    left). B is resent under epoch 0, a duplicate: each record once. It failed before (B twice)."""
    core, leader = _producer(retries=1)
    _acked_first(core, leader)
    a, a_futs = _produce(core, "a", 3)
    _pass(core)
    leader.deliver(written=False, answered=False)  # A's first attempt never reached the broker
    _pass(core)  # A resent
    b, b_futs = _produce(core, "b", 2)
    _pass(core)  # B sent behind it
    assert (a.attempts, b.attempts, len(leader.pending)) == (2, 1, 2)
    leader.deliver(written=True, answered=False)
    assert all(isinstance(f.exception(0), KafkaConnectionError) for f in a_futs)  # out of retries
    leader.deliver(written=True, answered=False)
    _settle(core, leader)
    assert leader.log == _values("p", 2) + _values("a", 3) + _values("b", 2)  # B once
    assert [f.result(0).offset for f in b_futs] == [5, 6]
    _, c_futs = _produce(core, "c", 1)
    _settle(core, leader)
    assert c_futs[0].result(0).offset == 7
    assert leader.log == _values("p", 2) + _values("a", 3) + _values("b", 2) + _values("c", 1)
    assert (core.producer_epoch, core.stats["epoch_bumps"]) == (0, 0)


def test_expired_batch_not_written_then_the_later_batch_is_resent_after_the_bump_once() -> None:
    """A never reached the broker, so B (sent behind it, answer lost) was refused for the gap. After A
    expires, B is first resent under epoch 0 with its own sequence: OUT_OF_ORDER_SEQUENCE_NUMBER shows
    it was not written, so the epoch is bumped and B goes at epoch 1 from sequence 0, written once."""
    core, leader = _producer()
    a, b, a_futs, b_futs = _two_in_doubt(core, leader, a_written=False)
    assert leader.log == _values("p", 2)
    _age(core, a)
    before = len(leader.sent)
    _settle(core, leader)
    assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in a_futs)
    # (epoch, sequence, records) of B's resends: under epoch 0 with its own sequence, answered
    # OUT_OF_ORDER_SEQUENCE_NUMBER (not written), then after the bump at epoch 1 from sequence 0
    assert leader.sent[before:] == [(0, 5, 2), (1, 0, 2)]
    assert leader.log == _values("p", 2) + _values("b", 2)
    assert [f.result(0).offset for f in b_futs] == [2, 3]
    assert (core.producer_epoch, core.stats["epoch_bumps"]) == (1, 1)


def test_nothing_new_is_sent_while_a_given_up_sequence_is_unresolved() -> None:
    """Java's drain rule (RecordAccumulator: no new batch for a partition with an unresolved sequence):
    C, queued while B is resent to settle A's fate, gets no sequence until B's answer resolves the gap,
    then goes under the same epoch right after B."""
    core, leader = _producer()
    a, b, _, _ = _two_in_doubt(core, leader, a_written=True)
    _age(core, a)
    c, _ = _produce(core, "c", 2)
    for _ in range(3):
        _pass(core)
    p = core.partitions[("t", 0)]
    assert p.unresolved == 5 and not p.needs_bump  # the sequence after A
    assert (len(leader.pending), b.in_flight, c.seq, list(p.ready)) == (1, True, -1, [c])
    leader.deliver(written=True, answered=True)
    _pass(core)
    assert p.unresolved == -1 and c.seq == 7 and len(leader.pending) == 1


def test_expired_batch_with_nothing_sent_behind_it_bumps_the_epoch() -> None:
    """A sent batch expires and no later batch of the partition was sent: once nothing is in flight the
    gap remains (the last acknowledged sequence does not reach it), so the epoch is bumped and the next
    batch goes at epoch 1 from sequence 0, whether A was written or not."""
    core, leader = _producer()
    _acked_first(core, leader)
    a, a_futs = _produce(core, "a", 3)
    _pass(core)
    leader.deliver(written=True, answered=False)
    _age(core, a)
    _pass(core)
    assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in a_futs)
    assert core.stats["epoch_bumps"] == 1 and core.producer_epoch == 1
    _produce(core, "b", 2)
    _settle(core, leader)
    assert leader.sent[-1] == (1, 0, 2)
    assert leader.log == _values("p", 2) + _values("a", 3) + _values("b", 2)


# -- a batch in flight at delivery.timeout.ms (Java's Sender.getExpiredInflightBatches) ------------------


def test_batch_in_flight_fails_at_delivery_timeout_and_its_late_success_still_counts() -> None:
    """A batch whose request is still unanswered at delivery.timeout.ms fails then, not only once its
    request is answered or times out (it waited up to request.timeout.ms more before). Its late answer
    still counts: a success acknowledges its sequences, so the next batch follows under the same epoch,
    and its bytes are released once."""
    core, leader = _producer()
    _acked_first(core, leader)
    a, a_futs = _produce(core, "a", 3)
    _pass(core)
    _age(core, a)
    _pass(core)
    assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in a_futs)
    assert len(leader.pending) == 1 and a.in_flight  # its request is still out
    leader.deliver(written=True, answered=True)
    p = core.partitions[("t", 0)]
    assert (p.acked_seq, list(p.unacked), p.unresolved) == (5, [], -1)
    c, c_futs = _produce(core, "c", 2)
    _settle(core, leader)
    assert [f.result(0).offset for f in c_futs] == [5, 6]
    assert leader.log == _values("p", 2) + _values("a", 3) + _values("c", 2)
    assert leader.sent[-1] == (0, 5, 2) and core.stats["epoch_bumps"] == 0
    assert (core._outstanding, core.buffered_bytes) == (0, 0)


def test_batch_in_flight_expired_with_its_answer_lost_is_given_up_not_resent() -> None:
    """A expires in flight, then its answer is lost: it is not resent (its records failed already), its
    sequence is unresolved, and B behind it (written, answer lost) settles it under the same epoch."""
    core, leader, a, a_futs, b, b_futs = _a_expired_in_flight_ahead_of_b()
    assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in a_futs)
    assert not any(f.done() for f in b_futs) and len(leader.pending) == 2
    before = len(leader.sent)
    leader.deliver(written=True, answered=False)
    assert core.partitions[("t", 0)].unresolved == 5
    leader.deliver(written=True, answered=False)
    _settle(core, leader)
    assert leader.sent[before:] == [(0, 2, 3), (0, 5, 2), (0, 5, 2)]  # A once; B, then B's resend (a duplicate)
    assert [f.result(0).offset for f in b_futs] == [5, 6]
    assert leader.log == _values("p", 2) + _values("a", 3) + _values("b", 2)
    assert core.stats["epoch_bumps"] == 0


def test_batch_in_flight_expired_without_idempotence_is_not_resent() -> None:
    """The same deadline without idempotence: the batch fails at delivery.timeout.ms and a lost answer
    does not put it back in the queue (it was resent before)."""
    core, leader = _producer(**{"enable.idempotence": False, "acks": 1})
    core.producer_id, core.producer_epoch = -1, -1
    a, a_futs = _produce(core, "a", 3)
    _pass(core)
    _age(core, a)
    _pass(core)
    assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in a_futs)
    leader.deliver(written=False, answered=False)
    _settle(core, leader)
    assert leader.sent == [] and leader.log == [] and not core.partitions[("t", 0)].ready
    assert (core._outstanding, core.buffered_bytes) == (0, 0)


# -- review k1: the transaction's end and a batch failed in flight; acknowledgements out of order ---------


@pytest.mark.parametrize("tv2", [True, False])
def test_txn_abort_waits_for_the_request_of_a_batch_failed_in_flight(tv2: bool) -> None:
    """A transactional batch A fails at delivery.timeout.ms while its Produce request is out (its records
    complete, the transaction is abortable). abort_transaction() sends EndTxn (and, v1, the epoch bump) only
    once A's request is answered: before, the flush returned at once, the epoch moved on with A in flight,
    set_producer renumbered A into the new epoch, and the next transaction's first batch C went at epoch 1
    with sequence A.count instead of 0 (refused OUT_OF_ORDER_SEQUENCE_NUMBER); with v1, A could also land
    after the abort marker."""
    from oncelog.client.aio.transactions import S  # type: ignore[attr-defined]

    async def run() -> None:
        core, leader = _producer(**{"transactional.id": "tx", "enable.idempotence": True})
        txn = core.txn
        assert txn is not None
        txn.tv2 = tv2
        txn.state = S.IN_TRANSACTION
        txn.partitions.add(("t", 0))  # v1: already added (AddPartitionsToTxn is not under test)
        _acked_first(core, leader)
        txn.started = True
        a, a_futs = _produce(core, "a", 3)
        _pass(core)
        _age(core, a)
        _pass(core)
        assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in a_futs)
        assert txn.state is S.ABORTABLE_ERROR and a.in_flight and core._outstanding == 0
        calls: list[tuple[str, bool]] = []

        async def fake_call(what: str, *args: Any, **kw: Any) -> Any:  # EndTxn (v2: bumps) / InitProducerId
            calls.append((what, bool(core._requests)))
            return types.SimpleNamespace(error_code=0, producer_id=7, producer_epoch=1)
        txn._call = fake_call  # type: ignore[method-assign]
        abort = asyncio.ensure_future(txn.abort_transaction(5))
        for _ in range(10):
            await asyncio.sleep(0)
        assert calls == [] and not abort.done(), "EndTxn sent while A's request was in flight"
        leader.deliver(written=True, answered=True)  # A's late answer (epoch 0)
        await asyncio.wait_for(abort, 5)
        assert [c[1] for c in calls] == [False] * len(calls) and calls[0][0] == "EndTxn(abort)"
        assert core.producer_epoch == 1 and not core.partitions[("t", 0)].unacked
        txn.begin_transaction()
        txn.tv2 = tv2
        txn.partitions.add(("t", 0))
        c, c_futs = _produce(core, "c", 2)
        _pass(core)
        assert c.seq == 0
        leader.deliver(written=True, answered=True)
        assert leader.sent[-1] == (1, 0, 2)  # (epoch, sequence, records)
        assert [f.result(0).offset for f in c_futs] == [5, 6]
        assert leader.log == _values("p", 2) + _values("a", 3) + _values("c", 2)
    asyncio.run(run())


def test_txn_abort_times_out_while_the_request_of_a_batch_failed_in_flight_is_unanswered() -> None:
    """The wait is bounded by the call's timeout: abort_transaction() raises KafkaTimeoutError without
    sending EndTxn, and a later abort_transaction() (once the request is answered) finishes."""
    from oncelog.client.aio.transactions import S  # type: ignore[attr-defined]
    from oncelog.client.errors import KafkaTimeoutError

    async def run() -> None:
        core, leader = _producer(**{"transactional.id": "tx", "enable.idempotence": True})
        txn = core.txn
        assert txn is not None
        txn.tv2 = True
        txn.state = S.IN_TRANSACTION
        _acked_first(core, leader)
        txn.started = True
        a, _ = _produce(core, "a", 3)
        _pass(core)
        _age(core, a)
        _pass(core)
        calls: list[str] = []

        async def fake_call(what: str, *args: Any, **kw: Any) -> Any:
            calls.append(what)
            return types.SimpleNamespace(error_code=0, producer_id=7, producer_epoch=1)
        txn._call = fake_call  # type: ignore[method-assign]
        with pytest.raises(KafkaTimeoutError, match="Produce request"):
            await txn.abort_transaction(0.05)
        assert calls == [] and txn.state is S.ABORTING
        leader.deliver(written=True, answered=True)
        await txn.abort_transaction(1)
        assert calls == ["EndTxn(abort)"] and txn.state is S.READY and core.producer_epoch == 1
    asyncio.run(run())


def test_set_producer_gives_no_sequence_to_a_batch_failed_in_flight() -> None:
    """set_producer (the transaction's epoch change) drops a batch failed in flight at delivery.timeout.ms
    from the batches it renumbers: it is complete and never resent. The next batch goes at the new epoch
    from sequence 0 (before: A.count), and A's late answer under the old epoch changes nothing."""
    core, leader = _producer()
    _acked_first(core, leader)
    a, a_futs = _produce(core, "a", 3)
    _pass(core)
    _age(core, a)
    _pass(core)
    assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in a_futs) and a.in_flight
    core.set_producer(7, 1)
    p = core.partitions[("t", 0)]
    assert (list(p.unacked), p.next_seq) == ([], 0)
    c, c_futs = _produce(core, "c", 2)
    _pass(core)
    assert c.seq == 0
    leader.deliver(written=True, answered=True)  # A, late (epoch 0, sequence 2)
    assert (p.acked_seq, p.acked_max) == (0, 0)
    leader.deliver(written=True, answered=True)  # C
    assert leader.sent[-1] == (1, 0, 2)  # (epoch, sequence, records)
    assert [f.result(0).offset for f in c_futs] == [5, 6]
    assert (p.acked_seq, p.next_seq) == (2, 2)


def test_later_batch_acknowledged_before_the_head_resolves_the_head_given_up() -> None:
    """The fault proxy's "gap" mode: A's answer is missing on a live connection, B (pipelined behind it) is
    answered. When A (failed in flight at delivery.timeout.ms) is then given up as its request times out,
    B's acknowledgement shows A was written (Java keeps the highest acknowledged sequence): no epoch bump,
    and the next batch follows B under the same epoch. Before, the head's acknowledgement alone counted
    and the epoch was bumped."""
    core, leader, a, a_futs, b, b_futs = _a_expired_in_flight_ahead_of_b()
    fut_a, body_a = leader.pending.pop(0), leader.bodies.pop(0)
    leader._decide(body_a)  # A written, its answer missing
    leader.deliver(written=True, answered=True)  # B written and answered
    assert [f.result(0).offset for f in b_futs] == [5, 6]
    fut_a.set_exception(RequestTimeoutError("no response"))  # A's request times out
    _pass(core)
    _pass(core)
    assert (core.stats["epoch_bumps"], core.producer_epoch) == (0, 0)
    c, c_futs = _produce(core, "c", 2)
    _settle(core, leader)
    assert leader.sent[-1] == (0, 7, 2)
    assert [f.result(0).offset for f in c_futs] == [7, 8]
    assert leader.log == _values("p", 2) + _values("a", 3) + _values("b", 2) + _values("c", 2)


def test_resequencing_steps_over_a_batch_acknowledged_ahead_of_an_earlier_one() -> None:
    """A's answer is lost on a live connection, B's (after it) arrives, then A's request times out and takes
    C's with the connection: the re-sequencing keeps A's and C's own sequences and leaves B's taken. Before,
    C was renumbered onto B's sequences, answered as B's duplicate and reported written, but never written
    (review 6, finding 1)."""
    core, leader = _producer()
    _acked_first(core, leader)
    a, _ = _produce(core, "a", 2)
    _pass(core)
    b, b_futs = _produce(core, "b", 2)
    _pass(core)
    c, c_futs = _produce(core, "c", 2)
    _pass(core)
    assert (a.seq, b.seq, c.seq) == (2, 4, 6)
    fut_a, body_a = leader.pending.pop(0), leader.bodies.pop(0)
    leader._decide(body_a)  # A written, its answer lost
    leader.deliver(written=True, answered=True)  # B written and answered ahead of A
    assert [f.result(0).offset for f in b_futs] == [4, 5]
    fut_a.set_exception(RequestTimeoutError("no response"))  # A's request times out: the connection closes
    leader.deliver(written=False, answered=False)  # and C's request dies with it
    _settle(core, leader)
    assert leader.log == _values("p", 2) + _values("a", 2) + _values("b", 2) + _values("c", 2)
    assert [f.result(0).offset for f in c_futs] == [6, 7]
    assert core.stats["epoch_bumps"] == 0
