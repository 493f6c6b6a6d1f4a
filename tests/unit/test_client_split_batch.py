"""A batch refused as MESSAGE_TOO_LARGE is split and its records resent (Java's Sender.completeBatch ->
RecordAccumulator.splitAndReenqueue), sans-IO.

The leader is the fake of :mod:`tests.unit.test_client_unresolved_sequence` (the broker's own sequence
rules, a log of the values written) with a ``max.message.bytes``: a batch larger is refused
MESSAGE_TOO_LARGE before its sequence is looked at, as Kafka's broker does, so a batch sent behind a
refused one is refused OUT_OF_ORDER_SEQUENCE_NUMBER for the gap. Before the split, every record of a
refused batch failed.
"""

from __future__ import annotations

import collections
import threading
import types
from concurrent.futures import Future
from typing import Any

from oncelog.client.aio.producer import BatchFutures, BatchResult
from oncelog.client.errors import MessageTooLargeError
from oncelog.client.producer import DeliveryFuture, _complete_many, _Done
from oncelog.protocol.codec import decode_request
from oncelog.protocol.records import decode_records, parse_batch_header
from tests.unit.test_client_unresolved_sequence import (
    _acked_first,
    _age,
    _Leader,
    _pass,
    _produce,
    _producer,
    _settle,
    _values,
)

MESSAGE_TOO_LARGE = 10


class _SmallLeader(_Leader):
    """Refuses a batch of more than ``limit`` bytes (header included) as MESSAGE_TOO_LARGE."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.refused: list[int] = []  # records of each batch refused for its size

    def _decide(self, body: Any) -> Any:
        req = decode_request(0, 9, b"".join(bytes(part) for part in body), 0)
        (td,) = req.topic_data
        (pd,) = td.partition_data
        if len(pd.records) > self.limit:
            self.refused.append(parse_batch_header(pd.records).last_offset_delta + 1)
            part = types.SimpleNamespace(index=pd.index, error_code=MESSAGE_TOO_LARGE, base_offset=-1,
                                         log_append_time=None, log_start_offset=0, error_message="too large")
            return types.SimpleNamespace(responses=[types.SimpleNamespace(name=td.name,
                                                                          partition_responses=[part])])
        hdr = parse_batch_header(pd.records)
        if hdr.producer_id < 0:  # no idempotence: written as it comes (the base fake knows producers only)
            base = len(self.log)
            self.log.extend(r.value for r in decode_records(pd.records))
            part = types.SimpleNamespace(index=pd.index, error_code=0, base_offset=base, log_append_time=None,
                                         log_start_offset=0, error_message=None)
            return types.SimpleNamespace(responses=[types.SimpleNamespace(name=td.name,
                                                                          partition_responses=[part])])
        return super()._decide(body)


def _small(limit: int, **config: Any) -> tuple[Any, _SmallLeader]:
    core, _ = _producer(**config)
    leader = _SmallLeader(limit)
    core.cluster.nodes = {1: types.SimpleNamespace(conn=leader)}
    return core, leader


def _vals(name: str, n: int, size: int = 40) -> list[bytes]:
    return [(b"%s-%d-" % (name.encode(), i)).ljust(size, b"x") for i in range(n)]


def test_refused_batch_is_split_and_a_later_batch_in_flight_follows_it_in_order() -> None:
    """A (8 records of 40 bytes, ~500 bytes) refused by a 200-byte limit while B is in flight behind it
    (refused OUT_OF_ORDER for the gap): A's records go out in parts (split again while a part is still too
    large), renumbered from A's sequence, B after them; every record once, in order, at its future's
    offset; no epoch bump."""
    core, leader = _small(200)
    _acked_first(core, leader)
    a_futs: list[Future[Any]] = [Future() for _ in range(8)]
    core.append_many("t", _vals("a", 8), None, 0, 1_700_000_000_000, a_futs)
    _pass(core)
    b, b_futs = _produce(core, "b", 2)
    _pass(core)
    assert len(leader.pending) == 2  # A and B in flight
    _settle(core, leader)
    assert leader.refused[0] == 8 and len(leader.refused) >= 2  # A, then a part still too large
    assert leader.log == _values("p", 2) + _vals("a", 8) + _values("b", 2)
    assert [f.result(0).offset for f in a_futs] == list(range(2, 10))
    assert [f.result(0).offset for f in b_futs] == [10, 11]
    assert core.stats["epoch_bumps"] == 0 and core.producer_epoch == 0
    assert core.stats["batch_splits"] == len(leader.refused)
    # (epoch, sequence, records) the broker decided, after the size check: p, B refused for the gap, A's
    # parts of 2 records from A's sequence 2 (A split in 4 + 4, each split again), then B
    assert leader.refused == [8, 4, 4]
    assert leader.sent == [(0, 0, 2), (0, 10, 2), (0, 2, 2), (0, 4, 2), (0, 6, 2), (0, 8, 2), (0, 10, 2)]
    assert core._outstanding == 0 and core.buffered_bytes == 0


def test_a_single_record_too_large_fails_alone() -> None:
    """One 300-byte record among small ones, limit 200: the split leaves it alone in a batch, which fails
    with MessageTooLargeError; the others are written, in order."""
    core, leader = _small(200)
    _acked_first(core, leader)
    vals = _vals("s", 2) + [b"big".ljust(300, b"y")] + _vals("t", 2)
    futs: list[Future[Any]] = [Future() for _ in vals]
    core.append_many("t", vals, None, 0, 1_700_000_000_000, futs)
    _settle(core, leader)
    assert isinstance(futs[2].exception(0), MessageTooLargeError)
    assert leader.log == _values("p", 2) + _vals("s", 2) + _vals("t", 2)
    assert [f.result(0).offset for i, f in enumerate(futs) if i != 2] == [2, 3, 4, 5]
    _, c_futs = _produce(core, "c", 2)  # the partition goes on: the gap of the failed record is closed
    _settle(core, leader)
    assert [f.result(0).offset for f in c_futs] == [6, 7]
    assert core.stats["epoch_bumps"] == 0


def test_produce_batch_spans_are_split_with_their_futures() -> None:
    """produce_batch's one completion per batch (a _Span) is split with it: each record's future (also one
    asked for before the split) gets its own offset."""
    core, leader = _small(200)
    _acked_first(core, leader)
    bf = BatchFutures(8, Future)
    core.append_many("t", _vals("a", 8), None, 0, 1_700_000_000_000, bf)
    early = bf[5]  # a future handed out before the answer
    _settle(core, leader)
    assert leader.log == _values("p", 2) + _vals("a", 8)
    assert bf.done() and bf.exception() is None
    assert early.result(0).offset == 7
    assert [f.result(0).offset for f in bf] == list(range(2, 10))


def test_spread_spans_of_keyed_records_keep_their_record_map() -> None:
    """A keyed produce_batch spread over partitions (here all on partition 0, in a scattered order): after
    the split, record i's future still names the offset record i got."""
    core, leader = _small(200)
    _acked_first(core, leader)
    bf = BatchFutures(10, Future)
    idx = [1, 3, 4, 6, 7, 8, 9]  # the records of this partition, the others elsewhere
    vals = _vals("k", 7)
    core.append_many("t", vals, None, 0, 1_700_000_000_000, bf.spread(idx))
    core.append_many("t", _vals("o", 3), None, 0, 1_700_000_000_000, bf.spread([0, 2, 5]))
    _settle(core, leader)
    assert leader.log == _values("p", 2) + vals + _vals("o", 3)
    for pos, i in enumerate(idx):
        assert bf[i].result(0).offset == 2 + pos
    assert [bf[i].result(0).offset for i in (0, 2, 5)] == [9, 10, 11]


def test_without_idempotence_the_split_is_resent_first() -> None:
    """Without idempotence the parts go to the front of the partition's queue too (in order with one request
    in flight at a time; with more, as in Java, a later batch may be written before them)."""
    core, leader = _small(200, **{"enable.idempotence": False, "acks": 1,
                                  "max.in.flight.requests.per.connection": 1})
    futs: list[Future[Any]] = [Future() for _ in range(8)]
    core.append_many("t", _vals("a", 8), None, 0, 1_700_000_000_000, futs)
    _settle(core, leader)
    assert leader.log == _vals("a", 8)
    assert [f.result(0).offset for f in futs] == list(range(8))


def test_blocking_facade_completion_split() -> None:
    """The blocking facade's one completion for a batch filled by produce() (_Done, futures by index):
    split into parts completed separately (one failing), each record's future answers for its part, and
    the callbacks run once, when the last part is done."""
    sink: Any = collections.deque()
    g = _Done(sink)
    futs = [DeliveryFuture(None, None, g, i) for i in range(5)]
    cb = DeliveryFuture(None, lambda e, m: None, g, 4)  # a record with an on_delivery callback
    p1, p2 = g.split([3, 2])
    q1, q2 = p2.split([1, 1])
    b = types.SimpleNamespace(group=p1)
    _complete_many(b, [p1], BatchResult("t", 0, 100, -1, [1, 2, 3]))  # type: ignore[arg-type]
    assert not g.fin and not sink
    q2.set_exception(MessageTooLargeError("too large"))
    assert not g.fin
    _complete_many(types.SimpleNamespace(group=q1), [q1], BatchResult("t", 0, 200, -1, [4]))  # type: ignore[arg-type]
    assert g.fin and list(sink) == [cb]
    assert [f.result(0).offset for f in futs[:4]] == [100, 101, 102, 200]
    assert isinstance(futs[4].exception(0), MessageTooLargeError)
    assert futs[1].result(0).timestamp == 2


def test_span_split_under_the_facade_lock() -> None:
    """A span with a lock (the blocking facade's produce_batch): waiters move to the parts."""
    lock = threading.Lock()
    bf = BatchFutures(4, Future, lock)
    sp = bf._span(0, 4)
    w = bf[3]
    a, b2 = sp.split([2, 2])
    a.finish("t", 0, 10, 5, None)
    assert not sp.done and not w.done()
    b2.finish("t", 0, 20, 5, None)
    assert sp.done and w.result(0).offset == 21 and bf[0].result(0).offset == 10


def test_first_batch_of_a_producer_on_a_partition_goes_alone() -> None:
    """The broker has no state for the producer on the partition yet and would accept a batch at any
    sequence: B sent behind a refused first batch A was written ahead of A's parts (records out of order,
    and A's parts then refused OUT_OF_ORDER). Now B waits for A's answer; once a batch is acknowledged the
    partition pipelines again."""
    core, leader = _small(200)
    a_futs: list[Future[Any]] = [Future() for _ in range(8)]
    core.append_many("t", _vals("a", 8), None, 0, 1_700_000_000_000, a_futs)
    _pass(core)
    _, b_futs = _produce(core, "b", 2)
    _pass(core)
    assert len(leader.pending) == 1  # B is not sent while A, the first, is unanswered
    _settle(core, leader)
    assert leader.log == _vals("a", 8) + _values("b", 2)
    assert [f.result(0).offset for f in a_futs + b_futs] == list(range(10))
    _produce(core, "c", 2)
    _pass(core)
    _produce(core, "d", 2)
    _pass(core)
    assert len(leader.pending) == 2  # known now: pipelined
    _settle(core, leader)
    assert leader.log == _vals("a", 8) + _values("b", 2) + _values("c", 2) + _values("d", 2)


def _a_split_behind_b(core: Any, leader: _SmallLeader) -> tuple[list[Future[Any]], Any, list[Future[Any]]]:
    """A (8 records, too large, sequences 2..9) and B (2 records, 10..11) in flight; A's refusal is answered:
    A is split, B still in flight."""
    _acked_first(core, leader)
    a_futs: list[Future[Any]] = [Future() for _ in range(8)]
    core.append_many("t", _vals("a", 8), None, 0, 1_700_000_000_000, a_futs)
    _pass(core)
    b, b_futs = _produce(core, "b", 2)
    _pass(core)
    assert len(leader.pending) == 2
    leader.deliver(written=True, answered=True)
    assert core.stats["batch_splits"] == 1
    return a_futs, b, b_futs


def test_parts_take_the_refused_batch_sequences_at_split_time() -> None:
    """Numbered at the split (Java's assignProducerStateToBatches): the parts hold A's sequences 2..9 in
    order. Before, they held -1 until re-sequenced, and a later batch becoming unresolved meanwhile (B
    expired in flight, its answer lost) sent them with base sequence -1 (refused, records lost)."""
    core, leader = _small(200)
    a_futs, b, b_futs = _a_split_behind_b(core, leader)
    p = core.partitions[("t", 0)]
    parts = [x for x in p.unacked if x is not b]
    seq = 2
    for x in parts:
        assert x.seq == seq
        seq += x.count
    assert seq == 10 and b.seq == 10
    _age(core, b)
    _pass(core)  # B fails in flight at delivery.timeout.ms
    leader.deliver(written=True, answered=False)  # B reaches the broker (refused for the gap), answer lost
    assert p.unresolved == 12
    _settle(core, leader)
    assert all(s >= 0 for (_, s, _) in leader.sent), leader.sent
    assert leader.log == _values("p", 2) + _vals("a", 8)
    assert [f.result(0).offset for f in a_futs] == list(range(2, 10))
    assert all(f.exception(0) is not None for f in b_futs)


def test_split_part_expiring_before_its_first_send_costs_no_epoch_bump() -> None:
    """Parts never sent that reach delivery.timeout.ms were not written: they fail without marking a
    sequence unresolved, B (sent behind them, refused for the gap) is renumbered and written, no bump.
    Before, each part was marked unresolved (with a garbage end) and the epoch was bumped."""
    core, leader = _small(200)
    a_futs, b, b_futs = _a_split_behind_b(core, leader)
    p = core.partitions[("t", 0)]
    for x in p.unacked:
        if x is not b:
            _age(core, x)
    _pass(core)
    assert p.unresolved == -1
    assert all(f.exception(0) is not None for f in a_futs)
    _settle(core, leader)
    assert leader.log == _values("p", 2) + _values("b", 2)
    assert [f.result(0).offset for f in b_futs] == [2, 3]
    assert core.stats["epoch_bumps"] == 0 and core.producer_epoch == 0


def test_parts_are_not_written_after_a_later_batch_the_broker_took_as_a_new_producer() -> None:
    """The broker forgot the producer (producer.id.expiration.ms) after its first ack: A (too large) and B are
    in flight, B is accepted at any sequence. A's parts would be written after B: they fail with the refusal
    instead (as before splits existed), and the partition sends one request at a time again. Before, the
    log was p, b, a (every A future succeeding)."""
    core, leader = _small(200)
    _acked_first(core, leader)
    leader.entry = None  # the producer's state expired on the broker
    a_futs: list[Future[Any]] = [Future() for _ in range(8)]
    core.append_many("t", _vals("a", 8), None, 0, 1_700_000_000_000, a_futs)
    _pass(core)
    _, b_futs = _produce(core, "b", 2)
    _pass(core)
    assert len(leader.pending) == 2
    _settle(core, leader)
    assert leader.log == _values("p", 2) + _values("b", 2)
    assert all(isinstance(f.exception(0), MessageTooLargeError) for f in a_futs)
    assert [f.result(0).offset for f in b_futs] == [2, 3]
    assert core.partitions[("t", 0)].known == -1
    _, c_futs = _produce(core, "c", 2)
    _settle(core, leader)
    assert leader.log == _values("p", 2) + _values("b", 2) + _values("c", 2)
    assert [f.result(0).offset for f in c_futs] == [4, 5]


def test_after_overtaken_parts_are_dropped_the_next_batch_follows_the_acknowledged_one() -> None:
    """The same scenario, then one more batch: it goes at the sequence after B's (every sequence below the
    acknowledged maximum was dropped), accepted at once. Before, it went at A's old sequence, was refused
    OUT_OF_ORDER_SEQUENCE_NUMBER and cost an epoch bump."""
    core, leader = _small(200)
    _acked_first(core, leader)
    leader.entry = None
    a_futs: list[Future[Any]] = [Future() for _ in range(8)]
    core.append_many("t", _vals("a", 8), None, 0, 1_700_000_000_000, a_futs)
    _pass(core)
    _produce(core, "b", 2)
    _pass(core)
    _settle(core, leader)
    p = core.partitions[("t", 0)]
    assert (p.acked_seq, p.acked_ahead) == (p.acked_max, {})
    _, c_futs = _produce(core, "c", 2)
    _settle(core, leader)
    assert [f.result(0).offset for f in c_futs] == [4, 5]
    assert core.stats["epoch_bumps"] == 0


def test_unknown_producer_id_resets_the_known_partition() -> None:
    """UNKNOWN_PRODUCER_ID: the broker has no state for the producer there, so the partition's next first
    batch goes alone again (_Partition.known)."""
    from oncelog.client.errors import error_for
    core, leader = _small(200)
    _acked_first(core, leader)
    p = core.partitions[("t", 0)]
    assert p.known == core.producer_id
    b, _ = _produce(core, "b", 2)
    _pass(core)
    b.in_flight = False
    core._batch_failed(p, b, error_for(59, None), in_doubt=False, log_start_offset=0)
    assert p.known == -1


def test_txn_v1_abort_with_unsent_split_parts_bumps_the_epoch() -> None:
    """Transactions v1: A (sequences 2..9) split, the user aborts while its parts wait unsent. The parts hold
    A's sequences, so the abort bumps the epoch and the next transaction's first batch goes out at sequence 0
    of the new epoch, written. Before, the parts (sequence -1) were failed as unsequenced: no bump, and the
    next transaction's batch went out at sequence 10 where the broker expected 2 (OUT_OF_ORDER)."""
    import asyncio

    from oncelog.client.aio.transactions import S  # type: ignore[attr-defined]

    async def run() -> None:
        core, leader = _small(200, **{"transactional.id": "tx", "enable.idempotence": True})
        txn = core.txn
        txn.tv2 = False
        txn.state = S.IN_TRANSACTION
        txn.partitions.add(("t", 0))
        _acked_first(core, leader)
        txn.started = True
        a_futs: list[Future[Any]] = [Future() for _ in range(8)]
        core.append_many("t", _vals("a", 8), None, 0, 1_700_000_000_000, a_futs)
        _pass(core)
        leader.deliver(written=True, answered=True)  # A refused -> split; nothing in flight
        assert core.stats["batch_splits"] == 1
        calls = []

        async def fake_call(what: str, *args: Any, **kw: Any) -> Any:
            calls.append(what)
            return types.SimpleNamespace(error_code=0, producer_id=7, producer_epoch=1)
        txn._call = fake_call
        abort = asyncio.ensure_future(txn.abort_transaction(5))
        for _ in range(5):
            await asyncio.sleep(0)
        _pass(core)  # the sweep
        await asyncio.wait_for(abort, 5)
        assert all(f.exception(0) is not None for f in a_futs)
        assert core.producer_epoch == 1, calls
        txn.begin_transaction()
        txn.tv2 = False
        txn.partitions.add(("t", 0))
        c, c_futs = _produce(core, "c", 2)
        _pass(core)
        assert c.seq == 0
        leader.deliver(written=True, answered=True)
        assert leader.sent[-1] == (1, 0, 2)
        assert [f.result(0).offset for f in c_futs] == [2, 3]
    asyncio.run(run())


def test_split_parts_are_near_equal() -> None:
    """20 records of uneven size refused: two parts of near-equal size (10 and 10 records), not a greedy
    packing to half the batch that left three, the last one tiny (11/7/2 records, one more request)."""
    core, leader = _small(1000)
    _acked_first(core, leader)
    vals = [(b"u-%d-" % i).ljust(30 + (i * 37) % 50, b"z") for i in range(20)]
    futs: list[Future[Any]] = [Future() for _ in vals]
    core.append_many("t", vals, None, 0, 1_700_000_000_000, futs)
    _pass(core)
    leader.deliver(written=True, answered=True)  # refused: split
    p = core.partitions[("t", 0)]
    assert [x.count for x in p.unacked] == [10, 10]
    sizes = [x.builder.size for x in p.unacked]
    assert max(sizes) - min(sizes) < 80  # (at most one record's size apart)
    _settle(core, leader)
    assert leader.log == _values("p", 2) + vals
    assert leader.refused == [20] and core.stats["batch_splits"] == 1
    assert [f.result(0).offset for f in futs] == list(range(2, 22))


def test_blocking_facade_batch_is_split_by_the_producer_with_its_timestamps() -> None:
    """A batch filled by the blocking facade's produce() (one shared _Done, ``group``) refused as too large:
    ``_split`` splits the completion with it; each record's future gets its own offset and its own
    CreateTime (the parts' timestamps are the records'), and the callbacks go to the sink once."""
    from oncelog.client.aio.producer import _Batch
    from oncelog.client.batch import BatchBuilder

    core, leader = _small(200)
    core.complete_many = _complete_many  # as the blocking facade sets it
    _acked_first(core, leader)
    sink: Any = collections.deque()
    b = _Batch("t", 0, BatchBuilder(1 << 20))
    b.group = _Done(sink)
    b.futures.append(b.group)
    vals = _vals("g", 8)
    futs = []
    for i, v in enumerate(vals):
        ts = 1_700_000_000_000 + 1000 * (8 - i)  # not monotonic: each record its own
        b.builder.append(ts, None, v, None)
        b.timestamps.append(ts)
        b.nbytes += len(v)
        futs.append(DeliveryFuture(None, (lambda e, m: None) if i in (0, 7) else None, b.group, i))
    b.builder.close()
    core.adopt(b)
    _settle(core, leader)
    assert leader.refused[0] == 8 and core.stats["batch_splits"] >= 1
    assert leader.log == _values("p", 2) + vals
    assert [f.result(0).offset for f in futs] == list(range(2, 10))
    assert [f.result(0).timestamp for f in futs] == [1_700_000_000_000 + 1000 * (8 - i) for i in range(8)]
    assert b.group.fin and b.group.exc is None and len(sink) == 2


def test_batch_behind_one_refused_for_good_is_renumbered_without_a_bump() -> None:
    """A (one record too large, refused for good) and B in flight: B is refused OUT_OF_ORDER for A's gap,
    then (not the next sequence: Java's isNextSequence) renumbered and written under the same epoch. Before,
    B's refusal at the head bumped the epoch."""
    core, leader = _small(200)
    _acked_first(core, leader)
    big: list[Future[Any]] = [Future()]
    core.append_many("t", [b"big".ljust(300, b"y")], None, 0, 1_700_000_000_000, big)
    _pass(core)
    _, b_futs = _produce(core, "b", 2)
    _pass(core)
    assert len(leader.pending) == 2
    _settle(core, leader)
    assert isinstance(big[0].exception(0), MessageTooLargeError)
    assert leader.log == _values("p", 2) + _values("b", 2)
    assert [f.result(0).offset for f in b_futs] == [2, 3]
    assert leader.sent == [(0, 0, 2), (0, 3, 2), (0, 2, 2)]
    assert core.stats["epoch_bumps"] == 0 and core.producer_epoch == 0


def test_split_builder_keeps_keys_headers_timestamps_and_codec() -> None:
    """Every codec: the parts hold the records in order with their keys (null too), values (null too),
    headers (a null header value too) and their own CreateTime, compressed with the batch's codec; two parts
    of near-equal size, together the records once."""
    from oncelog.client.batch import BatchBuilder, batch_bytes, split_builder
    from oncelog.protocol.compression import decompress
    from oncelog.protocol.records import COMPRESSION_NONE, iter_records

    def records(b: Any) -> list[tuple[int, Any, Any, list[Any]]]:
        section = decompress(b.codec, b.close())
        whole = batch_bytes(section, codec=COMPRESSION_NONE, count=b.count, base_timestamp=b.base_timestamp,
                            max_timestamp=b.max_timestamp)
        return [(ts, r.key, r.value, [(k, None if v is None else bytes(v)) for k, v in r.headers])
                for _, ts, r in iter_records(whole)]

    want = []
    for i in range(20):
        key = None if i % 3 == 0 else b"k%d" % i
        value = None if i == 5 else (b"v%d-" % i).ljust(30 + (i * 37) % 50, b"z")
        headers = [("h", b"x%d" % i), ("n", None)] if i % 2 == 0 else []  # (the parts' first records too)
        want.append((1_700_000_000_000 + 1000 * ((i * 7) % 20), key, value, headers))
    for codec in range(5):
        b = BatchBuilder(1 << 20, codec)
        for ts, k, v, h in want:
            b.append(ts, k, v, h or None)
        pieces = split_builder(b, 16384, min_parts=2)
        assert len(pieces) == 2 and all(nb.codec == codec for nb, _, _ in pieces)
        got = [rec for nb, _, _ in pieces for rec in records(nb)]
        got = [(ts, None if k is None else bytes(k), None if v is None else bytes(v), h) for ts, k, v, h in got]
        assert got == want, codec
        assert [ts for _, tss, _ in pieces for ts in tss] == [w[0] for w in want]
        assert abs(pieces[0][0].count - pieces[1][0].count) <= 2
