"""Random request sequences against the transaction coordinator (hypothesis).

Two producers share one transactional id and send InitProducerId,
AddPartitions, AddOffsets and EndTxn (classic or v5) in any order; a third
plays zombie with credentials that were superseded. Between requests the
broker may crash (a new coordinator is rebuilt from what the log made
durable), markers may fail for some partitions, and the clock may advance
before a tick. After every step:

* every durable record of the transactional id follows the state table;
* every marker follows a durable Prepare* of the same direction and producer
  id/epoch, one transaction's markers are all COMMIT or all ABORT, and
  Complete* is written only once every partition has its marker;
* producer epochs never decrease for one producer id;
* a fenced producer never succeeds again;
* after a tick, no (non-2PC) Ongoing transaction is older than its timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from oncelog.broker.group import TopicPartition
from oncelog.broker.txn import MemoryTxnLog, TransactionCoordinator, TxnConfig, TxnState
from oncelog.broker.txn.state import TxnMetadata, is_valid_transition
from oncelog.protocol.errors import ErrorCode as E

from tests.unit.test_txn_coordinator import Clock, Ids

TID = "shared"
TPS = [TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)]
S = TxnState

init = st.tuples(st.just("init"), st.integers(0, 1), st.sampled_from([1000, 10_000]))
add = st.tuples(st.just("add"), st.integers(0, 1), st.sets(st.sampled_from(TPS), min_size=1))
end = st.tuples(st.just("end"), st.integers(0, 1), st.booleans(), st.booleans())
ops = st.one_of(  # requests that do something are drawn more often
    init,
    init,
    add,
    add,
    add,
    end,
    end,
    end,
    st.tuples(st.just("offsets"), st.integers(0, 1)),
    st.tuples(st.just("zombie"), st.integers(0, 10), st.booleans(), st.booleans()),
    st.tuples(st.just("crash"),),
    st.tuples(st.just("tick"), st.sampled_from([0, 500, 2000, 20_000, 60_000])),
    st.tuples(st.just("drain"),),
    st.tuples(st.just("fail_markers"), st.sets(st.sampled_from(TPS))),
)


class RecordingMarkers:
    def __init__(self, world: "World") -> None:
        self.world = world

    async def write_markers(self, producer_id, producer_epoch, coordinator_epoch, commit, partitions, transaction_version):
        w = self.world
        # the durable Prepare* this marker belongs to (its position in the log identifies the transaction)
        want = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        position = None
        for i, (tid, rec) in enumerate(w.log.records[: w.log.durable]):
            if rec is not None and tid == TID:
                m = TxnMetadata.from_record(tid, rec)
                if m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT) and m.producer_id == producer_id and m.producer_epoch == producer_epoch:
                    position = (i, m.state)
        assert position is not None and position[1] is want, (
            f"{'COMMIT' if commit else 'ABORT'} marker for {producer_id}/{producer_epoch} without a durable {want}"
        )
        for tp in partitions:
            if tp not in w.failing:
                w.markers.append((position[0], producer_id, producer_epoch, commit, tp))
        return {tp: (E.not_leader_or_follower if tp in w.failing else 0) for tp in partitions}


class World:
    def __init__(self, config: TxnConfig) -> None:
        self.config = config
        self.clock = Clock()
        self.ids = Ids()
        self.log = MemoryTxnLog()
        self.failing: set[TopicPartition] = set()
        self.markers: list[tuple[int, int, int, bool, TopicPartition]] = []
        self.epoch = 1
        self.coord = self._new()
        self.creds: list[tuple[int, int] | None] = [None, None]
        self.fenced: list[tuple[int, int]] = []

    def _new(self) -> TransactionCoordinator:
        return TransactionCoordinator(self.log, RecordingMarkers(self), self.ids, self.clock, self.config, self.epoch)

    async def crash(self) -> None:
        self.coord.close()
        assert not self.coord.task_errors
        self.log = self.log.crashed()
        self.epoch += 1
        self.coord = self._new()
        await self.coord.start()

    def check(self, after_tick: bool) -> None:
        assert not self.coord.task_errors, self.coord.task_errors
        history = self.log.durable_history(TID)
        prev: TxnMetadata | None = None
        for m in history:
            if m is None:
                assert prev is not None and is_valid_transition(prev.state, S.DEAD)
            elif prev is None:
                assert m.state is S.EMPTY, m
            else:
                assert is_valid_transition(prev.state, m.state), (prev.state, m.state)
                if m.producer_id == prev.producer_id:
                    assert m.producer_epoch >= prev.producer_epoch, (prev, m)
            assert m is None or m.state is not S.PREPARE_EPOCH_FENCE
            prev = m
        by_txn: dict[int, set[bool]] = {}
        marked: dict[int, set[TopicPartition]] = {}
        for position, _pid, _epoch, commit, tp in self.markers:
            by_txn.setdefault(position, set()).add(commit)
            marked.setdefault(position, set()).add(tp)
        assert all(len(v) == 1 for v in by_txn.values()), by_txn
        # a transaction is completed only once every one of its partitions has its marker
        prepared: tuple[int, TxnMetadata] | None = None
        for i, (tid, rec) in enumerate(self.log.records[: self.log.durable]):
            m = None if rec is None else TxnMetadata.from_record(tid, rec)
            if m is not None and m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                prepared = (i, m)
            elif m is not None and m.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                assert prepared is not None
                assert prepared[1].partitions <= marked.get(prepared[0], set()), (prepared, marked)
                prepared = None
        if after_tick:
            now = self.clock.now
            for md in self.coord.all_metadata().values():
                assert not md.timed_out(now), md


async def play(config: TxnConfig, steps: list[tuple[Any, ...]], settle: list[bool] | None = None) -> None:
    """``settle[i]``: let the background marker tasks run after step i (else a crash may come first)."""
    w = World(config)
    await w.coord.start()
    for i, step in enumerate(steps):
        if settle is not None and i > 0 and settle[i - 1]:
            await w.coord.drain()
        kind = step[0]
        c = w.coord
        if kind == "init":
            _, p, timeout = step
            before = c.metadata(TID)
            r = await c.init_producer_id(TID, timeout)
            if r.error == E.concurrent_transactions and before is not None and before.state is S.ONGOING:
                # the coordinator fenced the current epoch to abort its transaction
                w.fenced.append((before.producer_id, before.client_epoch))
            if r.error == 0:
                new = (r.producer_id, r.producer_epoch)
                for q, cred in enumerate(w.creds):
                    if cred is not None and cred != new:
                        w.fenced.append(cred)
                        if q != p:
                            w.creds[q] = None  # the other producer is a zombie now
                w.creds[p] = new
            else:
                assert r.error in (E.concurrent_transactions,), r
        elif kind in ("add", "offsets", "end"):
            cred = w.creds[step[1]]
            if cred is None:
                continue
            pid, epoch = cred
            if kind == "add":
                res = await c.add_partitions(TID, pid, epoch, sorted(step[2]))
                assert len(set(res.values())) == 1
                err = next(iter(res.values()))
                assert err in (0, E.concurrent_transactions, E.producer_fenced, E.invalid_producer_id_mapping), err
            elif kind == "offsets":
                err = await c.add_offsets(TID, pid, epoch, "g")
            else:
                _, p, commit, tv2 = step
                r = await c.end_txn(TID, pid, epoch, commit, tv2)
                err = r.error
                if err == 0 and r.producer_id >= 0:
                    w.creds[p] = (r.producer_id, r.producer_epoch)
            if cred in w.fenced:
                assert err != 0, (kind, cred)
        elif kind == "zombie":
            if not w.fenced:
                continue
            pid, epoch = w.fenced[step[1] % len(w.fenced)]
            if step[2]:
                errs = set((await c.add_partitions(TID, pid, epoch, [TPS[0]])).values())
                assert 0 not in errs, errs
            else:
                assert (await c.end_txn(TID, pid, epoch, True, step[3])).error != 0
                assert (await c.end_txn(TID, pid, epoch, False, step[3])).error != 0
        elif kind == "crash":
            await w.crash()
        elif kind == "tick":
            w.clock.now += step[1]
            await w.coord.tick()
            w.check(after_tick=True)
            continue
        elif kind == "drain":
            await w.coord.drain()
        elif kind == "fail_markers":
            w.failing = set(step[1])
        w.check(after_tick=False)
    w.failing = set()
    await w.coord.drain()
    await w.coord.tick()
    await w.coord.drain()
    w.check(after_tick=True)
    md = w.coord.metadata(TID)
    assert md is None or md.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT), md


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([0, 2]), st.lists(st.tuples(ops, st.booleans()), max_size=40))
@example(0, [(s, False) for s in [("fail_markers", {TPS[0]}), ("init", 0, 1000), ("add", 0, {TPS[0]}), ("end", 0, True, False), ("drain",), ("crash",)]])
@example(0, [(s, True) for s in [("init", 0, 1000), ("add", 0, {TPS[0]}), ("init", 1, 1000), ("zombie", 0, False, False)]])
@example(2, [(s, False) for s in [("init", 0, 1000), ("add", 0, {TPS[1]}), ("init", 1, 1000), ("zombie", 0, False, True), ("init", 1, 1000), ("tick", 2000)]])
def test_random_sequences_keep_the_invariants(tv, steps_and_settle):
    config = TxnConfig(
        transaction_version=tv,
        abort_timed_out_interval_ms=1,
        remove_expired_interval_ms=1,
        transactional_id_expiration_ms=50_000,
    )
    asyncio.run(play(config, [s for s, _ in steps_and_settle], [b for _, b in steps_and_settle]))
