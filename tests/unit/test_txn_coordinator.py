"""The transaction coordinator with a fake clock, an in-memory log and a recording marker writer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from oncelog.broker.group import TopicPartition
from oncelog.broker.txn import OFFSETS_TP, FileTxnLog, MemoryTxnLog, TransactionCoordinator, TxnConfig, TxnState
from oncelog.broker.txn.state import INT32_MAX, MAX_EPOCH, TxnMetadata
from oncelog.protocol.errors import ErrorCode as E

S = TxnState
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
C0 = TopicPartition("c", 0)
TID = "tx"


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Ids:
    def __init__(self, start: int = 1000) -> None:
        self.next = start

    def generate(self) -> int:
        self.next += 1
        return self.next - 1


class Markers:
    """Records every call; ``fail`` maps partitions to the error they answer; checks durability of Prepare*."""

    def __init__(self, log: MemoryTxnLog | None = None) -> None:
        self.calls: list[tuple[int, int, int, bool, tuple[TopicPartition, ...], int]] = []
        self.fail: dict[TopicPartition, int] = {}
        self.raise_error = False
        self.log = log
        self.violations: list[str] = []

    async def write_markers(self, producer_id, producer_epoch, coordinator_epoch, commit, partitions, transaction_version):
        if self.log is not None:
            prepared = [TxnMetadata.from_record(t, r) for t, r in self.log.durable_state().items()]
            want = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
            if not any(m.state is want and m.producer_id == producer_id and m.producer_epoch == producer_epoch for m in prepared):
                self.violations.append(f"marker {commit} for {producer_id}/{producer_epoch} without a durable {want}")
        self.calls.append((producer_id, producer_epoch, coordinator_epoch, commit, tuple(partitions), transaction_version))
        if self.raise_error:
            raise RuntimeError("broker unavailable")
        return {tp: self.fail.get(tp, 0) for tp in partitions}

    def written(self) -> list[tuple[int, int, bool, TopicPartition]]:
        """(pid, epoch, commit, tp) of each marker whose write succeeded."""
        return [(c[0], c[1], c[3], tp) for c in self.calls for tp in c[4] if tp not in self.fail]


class Env:
    def __init__(self, config: TxnConfig | None = None, log: MemoryTxnLog | None = None, epoch: int = 1) -> None:
        self.clock = Clock()
        self.ids = Ids()
        self.log = log if log is not None else MemoryTxnLog()
        self.markers = Markers(self.log)
        self.config = config or TxnConfig()
        self.coord = TransactionCoordinator(self.log, self.markers, self.ids, self.clock, self.config, epoch)

    def restart(self, markers: Markers | None = None) -> "Env":
        """A crash: a new coordinator (next coordinator epoch) on what the log made durable."""
        self.coord.close()
        env = Env.__new__(Env)
        env.clock, env.ids, env.config = self.clock, self.ids, self.config
        env.log = self.log.crashed()
        env.markers = markers or Markers(env.log)
        env.markers.log = env.log
        env.coord = TransactionCoordinator(env.log, env.markers, env.ids, env.clock, env.config, self.coord.coordinator_epoch + 1)
        return env

    def md(self, tid: str = TID) -> TxnMetadata:
        m = self.coord.metadata(tid)
        assert m is not None
        return m

    def states(self, tid: str = TID) -> list[str]:
        return [("Dead" if m is None else m.state.display_name) for m in self.log.durable_history(tid)]


TV0 = TxnConfig(transaction_version=0)
TV2 = TxnConfig(transaction_version=2)


def run(body: Callable[[Env], Awaitable[Any]], config: TxnConfig | None = None, log: MemoryTxnLog | None = None) -> Env:
    env = Env(config, log)

    async def main() -> None:
        await env.coord.start()
        await body(env)
        await env.coord.drain()

    asyncio.run(main())
    assert not env.markers.violations, env.markers.violations
    return env


async def begin(env: Env, tps=(A0, A1), tid: str = TID, timeout: int = 60_000) -> tuple[int, int]:
    r = await env.coord.init_producer_id(tid, timeout)
    assert r.error == 0, r
    res = await env.coord.add_partitions(tid, r.producer_id, r.producer_epoch, list(tps))
    assert set(res.values()) == {0}, res
    return r.producer_id, r.producer_epoch


def snapshot(env: Env) -> tuple[Any, ...]:
    return (env.coord.all_metadata(), list(env.log.records), list(env.markers.calls))


# -- InitProducerId ---------------------------------------------------------------


def test_new_transactional_id_gets_fresh_id_epoch_0_then_bumps():
    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, 60_000)
        assert r == (0, 1000, 0, -1, -1)
        r2 = await env.coord.init_producer_id(TID, 60_000)
        assert (r2.error, r2.producer_id, r2.producer_epoch) == (0, 1000, 1)
        assert env.md().state is S.EMPTY and env.md().last_producer_epoch == -1
        assert env.coord.transactional_id_of(1000) == TID

    env = run(body)
    assert env.states() == ["Empty", "Empty"]


@pytest.mark.parametrize("timeout", [0, -1, 900_001])
def test_invalid_timeout(timeout):
    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, timeout)
        assert r.error == E.invalid_transaction_timeout and r.producer_id == -1

    env = run(body)
    assert env.log.records == [] and env.ids.next == 1000


def test_invalid_requests():
    async def body(env: Env) -> None:
        assert (await env.coord.init_producer_id("", 1000)).error == E.invalid_request
        assert (await env.coord.init_producer_id(TID, 1000, producer_id=5)).error == E.invalid_request
        assert (await env.coord.add_partitions("", 1, 0, [A0])) == {A0: E.invalid_request}
        assert (await env.coord.end_txn("", 1, 0, True, False)).error == E.invalid_request

    assert run(body).log.records == []


def test_not_started_answers_coordinator_not_available():
    env = Env()

    async def main() -> None:
        assert (await env.coord.init_producer_id(TID, 1000)).error == E.coordinator_not_available
        assert (await env.coord.end_txn(TID, 1, 0, True, False)).error == E.coordinator_not_available
        assert (await env.coord.add_partitions(TID, 1, 0, [A0])) == {A0: E.coordinator_not_available}
        assert env.coord.describe([TID])[0]["error_code"] == E.coordinator_not_available

    asyncio.run(main())


@pytest.mark.parametrize("config,marker_epoch", [(TV0, 1), (TV2, 2)])
def test_init_on_ongoing_fences_aborts_and_answers_concurrent(config, marker_epoch):
    async def body(env: Env) -> None:
        pid, epoch = await begin(env)
        r = await env.coord.init_producer_id(TID, 60_000)
        assert r.error == E.concurrent_transactions and r.producer_id == -1
        await env.coord.drain()
        assert env.md().state is S.COMPLETE_ABORT
        assert env.markers.calls == [(pid, marker_epoch, 1, False, (A0, A1), 2 if config is TV2 else 0)]
        # the old producer is fenced
        assert (await env.coord.end_txn(TID, pid, epoch, True, config is TV2)).error in (E.producer_fenced,)
        assert (await env.coord.add_partitions(TID, pid, epoch, [B0])) == {B0: E.producer_fenced}
        r = await env.coord.init_producer_id(TID, 60_000)
        assert (r.error, r.producer_id, r.producer_epoch) == (0, pid, marker_epoch + 1)

    env = run(body, config)
    assert env.states() == ["Empty", "Ongoing", "PrepareAbort", "CompleteAbort", "Empty"]


def test_init_while_prepared_is_concurrent():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env)
        env.markers.fail = {A1: E.not_leader_or_follower}
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == 0
        await env.coord.drain()
        assert env.md().state is S.PREPARE_COMMIT
        before = snapshot(env)
        assert (await env.coord.init_producer_id(TID, 60_000)).error == E.concurrent_transactions
        assert snapshot(env) == before
        env.markers.fail = {}
        await env.coord.tick()
        assert env.md().state is S.COMPLETE_COMMIT

    run(body, TV0)


def test_kip360_expected_id_and_epoch():
    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, 60_000)
        pid = r.producer_id
        bumped = await env.coord.init_producer_id(TID, 60_000, pid, 0)
        assert (bumped.error, bumped.producer_id, bumped.producer_epoch) == (0, pid, 1)
        assert env.md().last_producer_epoch == 0
        retry = await env.coord.init_producer_id(TID, 60_000, pid, 0)  # the answer was lost: same epoch again
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (0, pid, 1)
        before = snapshot(env)
        assert (await env.coord.init_producer_id(TID, 60_000, pid, 7)).error == E.producer_fenced
        assert (await env.coord.init_producer_id(TID, 60_000, pid + 50, 1)).error == E.producer_fenced
        assert snapshot(env) == before
        # an unknown transactional id with an expected id: a fresh id (the metadata was just created)
        fresh = await env.coord.init_producer_id("other", 60_000, 4242, 3)
        assert fresh.error == 0 and fresh.producer_epoch == 0

    run(body)


def seeded_log(**fields: Any) -> MemoryTxnLog:
    base: dict[str, Any] = dict(transactional_id=TID, producer_id=500, producer_epoch=MAX_EPOCH - 1, timeout_ms=60_000, last_update_ms=1)
    base.update(fields)
    m = TxnMetadata(**base)
    return MemoryTxnLog(records=[(TID, m.to_record())])


def test_epoch_exhaustion_rotates_the_producer_id_on_init():
    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, 60_000, 500, MAX_EPOCH - 1)
        assert (r.error, r.producer_id, r.producer_epoch) == (0, 1000, 0)
        assert env.md().previous_producer_id == 500 and env.md().last_producer_epoch == MAX_EPOCH - 1
        assert env.coord.transactional_id_of(500) is None and env.coord.transactional_id_of(1000) == TID
        # retry of the rotation with the old id and exhausted epoch: the current answer
        retry = await env.coord.init_producer_id(TID, 60_000, 500, MAX_EPOCH - 1)
        assert (retry.error, retry.producer_id, retry.producer_epoch) == (0, 1000, 0)

    run(body, log=seeded_log())


def test_two_phase_commit_needs_the_broker_config():
    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, 60_000, enable_2pc=True)
        assert r.error == E.transactional_id_authorization_failed

    assert run(body).log.records == []


def test_two_phase_commit_txn_is_exempt_from_the_timeout():
    config = TxnConfig(two_phase_commit_enable=True, abort_timed_out_interval_ms=1)

    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, 0, enable_2pc=True)  # the timeout is not checked for 2PC
        assert r.error == 0
        assert env.md().two_phase_commit and env.md().timeout_ms == INT32_MAX
        await env.coord.add_partitions(TID, r.producer_id, r.producer_epoch, [A0])
        env.clock.now += 10**9
        await env.coord.tick()
        assert env.md().state is S.ONGOING

    run(body, config)


@pytest.mark.parametrize("config", [TV0, TV2])
def test_keep_prepared_txn_survives_a_restart_and_is_completed_by_the_new_session(config):
    config = TxnConfig(two_phase_commit_enable=True, transaction_version=config.transaction_version)

    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, 0, enable_2pc=True)
        pid, epoch = r.producer_id, r.producer_epoch
        await env.coord.add_partitions(TID, pid, epoch, [A0, B0])
        env2 = env.restart()
        await env2.coord.start()
        k = await env2.coord.init_producer_id(TID, 0, enable_2pc=True, keep_prepared_txn=True)
        assert k == (0, pid, epoch + 1, pid, epoch)
        md = env2.md()
        assert md.state is S.ONGOING and md.producer_epoch == epoch and md.partitions == {A0, B0}
        # the old session is fenced, its data too; the new session may not extend the kept txn
        assert (await env2.coord.add_partitions(TID, pid, epoch, [A1])) == {A1: E.producer_fenced}
        assert env2.coord.check_in_txn(pid, epoch, A0) == E.invalid_producer_epoch
        assert (await env2.coord.add_partitions(TID, pid, epoch + 1, [A1])) == {A1: E.invalid_txn_state}
        assert (await env2.coord.end_txn(TID, pid, epoch, True, True)).error == E.producer_fenced
        res = await env2.coord.end_txn(TID, pid, epoch + 1, True, config.transaction_version >= 2)
        assert res.error == 0
        await env2.coord.drain()
        assert env2.md().state is S.COMPLETE_COMMIT
        (call,) = env2.markers.calls
        marker_epoch = epoch + 2 if config.transaction_version >= 2 else epoch + 1
        assert call[:5] == (pid, marker_epoch, 2, True, (A0, B0))
        assert not env2.markers.violations

    run(body, config)


@pytest.mark.parametrize("how", ["commit", "abort", "fence", "restart"])
def test_keep_prepared_with_an_exhausted_client_epoch_gives_the_client_a_new_id(how: str) -> None:
    """KIP-939 at the edge: the kept transaction keeps id 500 and its epoch for its markers; the
    new client gets a new id (1000, epoch 0), ends the transaction with it, and moves on to a fresh id."""
    log = seeded_log(producer_epoch=MAX_EPOCH - 1, state=S.ONGOING, partitions=frozenset({A0}), txn_start_ms=999_999,
                     timeout_ms=INT32_MAX, two_phase_commit=True, client_transaction_version=2)
    config = TxnConfig(two_phase_commit_enable=True, transaction_version=2)

    async def body(env: Env) -> None:
        k = await env.coord.init_producer_id(TID, 0, enable_2pc=True, keep_prepared_txn=True)
        assert k == (0, 1000, 0, 500, MAX_EPOCH - 1)
        md = env.md()
        assert (md.producer_id, md.producer_epoch, md.client_producer_id, md.client_epoch) == (500, MAX_EPOCH - 1, 1000, 0)
        assert env.coord.transactional_id_of(1000) == TID
        # the old client is fenced; the new one may only complete the kept transaction
        assert (await env.coord.add_partitions(TID, 500, MAX_EPOCH - 1, [A1])) == {A1: E.invalid_producer_id_mapping}
        assert (await env.coord.end_txn(TID, 500, MAX_EPOCH - 1, True, True)).error == E.invalid_producer_id_mapping
        assert env.coord.check_in_txn(500, MAX_EPOCH - 1, A0) == E.invalid_producer_id_mapping
        assert (await env.coord.add_partitions(TID, 1000, 0, [A1])) == {A1: E.invalid_txn_state}
        coord = env.coord
        if how == "restart":
            env2 = env.restart()
            await env2.coord.start()
            assert env2.md() == md
            coord = env2.coord
        if how == "fence":  # a producer that does not keep it: the kept transaction is aborted
            r = await coord.init_producer_id(TID, 0, enable_2pc=True)
            assert r.error == E.concurrent_transactions
        else:
            res = await coord.end_txn(TID, 1000, 0, how != "abort", True)
            assert res == (0, 1001, 0)
        await coord.drain()
        markers = (env2 if how == "restart" else env).markers
        commit = how in ("commit", "restart")
        assert markers.calls == [(500, MAX_EPOCH, coord.coordinator_epoch, commit, (A0,), 2)]
        done = coord.metadata(TID)
        assert done is not None
        assert (done.producer_id, done.producer_epoch, done.state) == (
            1001, 0, S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
        assert coord.transactional_id_of(1000) is None and coord.transactional_id_of(500) is None
        r = await coord.init_producer_id(TID, 0, enable_2pc=True, keep_prepared_txn=True)
        assert r == (0, 1001, 1, -1, -1)

    run(body, config, log)


def test_keep_prepared_with_an_exhausted_epoch_on_tv1_is_refused() -> None:
    log = seeded_log(producer_epoch=MAX_EPOCH - 1, state=S.ONGOING, partitions=frozenset({A0}), txn_start_ms=999_999,
                     timeout_ms=INT32_MAX, two_phase_commit=True)

    async def body(env: Env) -> None:
        k = await env.coord.init_producer_id(TID, 0, enable_2pc=True, keep_prepared_txn=True)
        assert k.error == E.invalid_txn_state and env.md().state is S.ONGOING and not env.md().kept_prepared

    run(body, TxnConfig(two_phase_commit_enable=True, transaction_version=1), log)


def test_keep_prepared_without_an_ongoing_txn_is_a_plain_bump():
    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, 1000, keep_prepared_txn=True)
        assert r == (0, 1000, 0, -1, -1)

    run(body)


# -- AddPartitionsToTxn / AddOffsetsToTxn ----------------------------------------


def test_add_partitions_errors_change_nothing():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env, [A0])
        before = snapshot(env)
        assert await env.coord.add_partitions("nope", pid, epoch, [A1]) == {A1: E.invalid_producer_id_mapping}
        assert await env.coord.add_partitions(TID, pid + 1, epoch, [A1]) == {A1: E.invalid_producer_id_mapping}
        assert await env.coord.add_partitions(TID, pid, epoch + 1, [A1]) == {A1: E.producer_fenced}
        assert await env.coord.add_partitions(TID, pid, epoch - 1, [A1]) == {A1: E.producer_fenced}
        # already present: no write
        assert await env.coord.add_partitions(TID, pid, epoch, [A0]) == {A0: 0}
        # verify only
        assert await env.coord.add_partitions(TID, pid, epoch, [A0, A1], verify_only=True) == {A0: 0, A1: E.invalid_txn_state}
        assert snapshot(env) == before
        assert await env.coord.add_offsets(TID, pid, epoch, "g") == 0
        assert env.md().partitions == {A0, OFFSETS_TP}

    run(body)


async def begin_with_pending_add(env: Env) -> tuple[int, int, "asyncio.Task[dict[TopicPartition, int]]"]:
    """A transaction on A0 whose add of A1 is being logged; the log flushes only when told to."""
    await env.coord.start()
    pid, epoch = await begin(env, [A0])
    env.log.auto_flush = False
    first = asyncio.create_task(env.coord.add_partitions(TID, pid, epoch, [A1]))
    await asyncio.sleep(0)
    assert env.coord.pending_transit(TID) is not None
    return pid, epoch, first


def test_add_while_a_write_is_pending_is_chained_but_other_requests_are_concurrent():
    """Adds (AddPartitionsToTxn, AddOffsetsToTxn) that arrive while an add is being logged are
    chained on it: their records are appended right behind it, and each is answered and applied
    only once durable, in order. EndTxn and InitProducerId still get CONCURRENT_TRANSACTIONS."""
    env = Env(log=MemoryTxnLog(auto_flush=True))

    async def main() -> None:
        pid, epoch, first = await begin_with_pending_add(env)
        second = asyncio.create_task(env.coord.add_partitions(TID, pid, epoch, [B0]))
        third = asyncio.create_task(env.coord.add_offsets(TID, pid, epoch, "g"))
        await asyncio.sleep(0)
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == E.concurrent_transactions
        assert (await env.coord.init_producer_id(TID, 1000)).error == E.concurrent_transactions
        assert env.log.unflushed == 3  # all three appended before one flush (one group-commit round)
        assert not (second.done() or third.done())
        assert env.md().partitions == {A0}  # not applied before durable
        env.log.flush()
        assert await first == {A1: 0}
        assert await second == {B0: 0}
        assert await third == 0
        assert env.md().partitions == {A0, A1, B0, OFFSETS_TP}
        assert [len(m.partitions) for m in env.log.durable_history(TID)[-3:]] == [2, 3, 4]
        assert env.coord.pending_transit(TID) is None

    asyncio.run(main())


@pytest.mark.parametrize(("flush_after", "expected"), [(0.02, 0), (0.5, int(E.concurrent_transactions))])
def test_add_of_partitions_already_being_added_waits_briefly(flush_after: float, expected: int) -> None:
    """An add of partitions the pending add is already adding (a retry) writes nothing: it
    is answered once that write is durable, within the short wait; a slower write still
    gets CONCURRENT_TRANSACTIONS. Nothing is applied before it is durable either way."""
    env = Env(log=MemoryTxnLog(auto_flush=True))

    async def main() -> None:
        pid, epoch, first = await begin_with_pending_add(env)
        second = asyncio.create_task(env.coord.add_partitions(TID, pid, epoch, [A1]))
        await asyncio.sleep(0.005)
        assert env.md().partitions == {A0} and env.log.unflushed == 1
        asyncio.get_running_loop().call_later(flush_after, env.log.flush)
        assert await second == {A1: expected}
        assert await first == {A1: 0}
        assert env.md().partitions == {A0, A1} and env.log.unflushed == 0
        await env.coord.drain()

    asyncio.run(main())


class StepLog(MemoryTxnLog):
    """A log whose writes the test finishes one by one: ``finish(i, error)`` (error: the write fails)."""

    def __init__(self) -> None:
        super().__init__(auto_flush=True)
        self.held: list[asyncio.Future[None]] = []

    async def write(self, transactional_id: str, metadata: TxnMetadata | None) -> None:
        if self.auto_flush:
            return await super().write(transactional_id, metadata)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append(fut)
        await fut
        self.records.append((transactional_id, None if metadata is None else metadata.to_record()))
        self.durable = len(self.records)

    def finish(self, i: int, error: bool = False) -> None:
        if error:
            self.held[i].set_exception(OSError("injected fsync error"))
        else:
            self.held[i].set_result(None)


@pytest.mark.parametrize("own_write_fails", [False, True])
def test_add_chained_on_a_failed_write_fails_and_applies_nothing(own_write_fails: bool) -> None:
    """If the write an add was chained on fails, the chained add fails too, even when its
    own write succeeds; nothing is applied. It answers what it would have answered had it
    been appended on its own then (an fsync error of the transaction log: NOT_COORDINATOR,
    Kafka's answer for a KAFKA_STORAGE_ERROR of the append), not a code of its own."""
    log = StepLog()
    env = Env(log=log)

    async def main() -> None:
        await env.coord.start()
        pid, epoch = await begin(env, [A0])
        log.auto_flush = False
        # the same add on its own, its write failing
        alone = asyncio.create_task(env.coord.add_offsets(TID, pid, epoch, "g"))
        await asyncio.sleep(0)
        log.finish(0, error=True)
        unchained = await alone
        assert unchained == E.not_coordinator
        assert env.md().partitions == {A0} and env.coord.pending_transit(TID) is None
        log.held.clear()
        # now chained behind a failing add
        first = asyncio.create_task(env.coord.add_partitions(TID, pid, epoch, [A1]))
        await asyncio.sleep(0)
        second = asyncio.create_task(env.coord.add_offsets(TID, pid, epoch, "g"))
        await asyncio.sleep(0)
        assert len(log.held) == 2
        log.finish(0, error=True)
        await asyncio.sleep(0)
        log.finish(1, error=own_write_fails)
        assert await first == {A1: E.not_coordinator}
        assert await second == unchained
        assert env.md().partitions == {A0} and env.coord.pending_transit(TID) is None
        log.auto_flush = True
        assert await env.coord.add_offsets(TID, pid, epoch, "g") == 0
        assert env.md().partitions == {A0, OFFSETS_TP}

    asyncio.run(main())



def test_cancelled_chained_add_gives_the_chain_back() -> None:
    """A chained add whose request is cancelled (the client's connection closed) while the add it
    is chained on is still being logged leaves that add pending: a retry on a new connection is
    chained on it, and memory ends equal to the log's last record. Before, the cancelled add dropped
    the pending entry, the retry was built from the applied metadata and appended unchained behind
    the pending add, and its apply failed (IllegalTransition) with memory and log disagreeing."""
    env = Env(log=MemoryTxnLog(auto_flush=True))

    async def main() -> None:
        pid, epoch, first = await begin_with_pending_add(env)
        pending_first = env.coord.pending_transit(TID)
        second = asyncio.create_task(env.coord.add_partitions(TID, pid, epoch, [B0]))
        await asyncio.sleep(0)
        assert env.log.unflushed == 2  # chained: appended behind the first add
        second.cancel()
        await asyncio.sleep(0)
        assert env.coord.pending_transit(TID) is pending_first
        retry = asyncio.create_task(env.coord.add_partitions(TID, pid, epoch, [C0]))
        await asyncio.sleep(0)
        env.log.flush()
        assert await first == {A1: 0}
        await asyncio.sleep(0)
        env.log.auto_flush = True
        got = (await retry)[C0]
        assert got in (0, E.concurrent_transactions)
        await env.coord.drain()
        assert env.md().partitions == env.log.durable_history(TID)[-1].partitions
        assert {A0, A1} <= env.md().partitions
        if got == 0:
            assert C0 in env.md().partitions
        assert not env.coord.task_errors

    asyncio.run(main())


def test_several_adds_waiting_for_a_logged_add_take_turns() -> None:
    """Three adds sent together while a fourth is logged (TV2 produces to several new
    partitions do this): each is chained on the one before, all succeed, each write applied
    once durable."""
    env = Env(log=MemoryTxnLog(auto_flush=True))

    async def main() -> None:
        pid, epoch, first = await begin_with_pending_add(env)
        rest = [asyncio.create_task(env.coord.add_partitions(TID, pid, epoch, [tp])) for tp in (B0, C0)]
        rest.append(asyncio.create_task(env.coord.add_offsets(TID, pid, epoch, "g")))
        writes = len(env.log.records)

        async def flusher() -> None:
            while not all(t.done() for t in rest):
                await asyncio.sleep(0.005)
                env.log.flush()

        await asyncio.gather(flusher(), first, *rest)
        assert first.result() == {A1: 0}
        assert [t.result() for t in rest] == [{B0: 0}, {C0: 0}, 0]
        assert len(env.log.records) == writes + 3  # one write per add, in order
        assert env.md().partitions == {A0, A1, B0, C0, OFFSETS_TP}
        await env.coord.drain()

    asyncio.run(main())


def test_add_partitions_while_prepared_is_concurrent():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env, [A0])
        env.markers.fail = {A0: E.not_leader_or_follower}
        await env.coord.end_txn(TID, pid, epoch, True, False)
        await env.coord.drain()
        assert await env.coord.add_partitions(TID, pid, epoch, [A1]) == {A1: E.concurrent_transactions}
        assert await env.coord.add_partitions(TID, pid, epoch, [A1], verify_only=True) == {A1: E.concurrent_transactions}

    run(body, TV0)


def test_log_write_failure_changes_nothing():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env, [A0])
        before = snapshot(env)
        env.log.fail_next = 3
        # Kafka's TransactionStateManager answers NOT_COORDINATOR for a storage error of the append
        assert await env.coord.add_partitions(TID, pid, epoch, [A1]) == {A1: E.not_coordinator}
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == E.not_coordinator
        assert (await env.coord.init_producer_id(TID, 1000)).error == E.not_coordinator
        assert snapshot(env) == before and env.coord.pending_transit(TID) is None
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == 0

    run(body)


# -- EndTxn ----------------------------------------------------------------------


def test_commit_two_phase_classic():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env)
        await env.coord.add_offsets(TID, pid, epoch, "g")
        res = await env.coord.end_txn(TID, pid, epoch, True, False)
        assert res == (0, -1, -1)
        assert env.md().state is S.PREPARE_COMMIT and env.markers.calls == []  # answered before the markers
        await env.coord.drain()
        assert env.markers.calls == [(pid, epoch, 1, True, (OFFSETS_TP, A0, A1), 0)]
        assert env.md().state is S.COMPLETE_COMMIT and env.md().partitions == frozenset()
        assert env.md().producer_epoch == epoch
        # retries of the finished EndTxn succeed; the other direction does not
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == 0
        assert (await env.coord.end_txn(TID, pid, epoch, False, False)).error == E.invalid_txn_state

    env = run(body, TV0)
    assert env.states() == ["Empty", "Ongoing", "Ongoing", "PrepareCommit", "CompleteCommit"]


def test_end_txn_errors_change_nothing():
    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, 60_000)
        pid, epoch = r.producer_id, r.producer_epoch
        before = snapshot(env)
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == E.invalid_txn_state  # no txn
        assert (await env.coord.end_txn(TID, pid, epoch, False, False)).error == E.invalid_txn_state
        assert (await env.coord.end_txn(TID, pid, epoch, True, True)).error == E.invalid_txn_state  # TV2 commit of Empty
        assert (await env.coord.end_txn("nope", pid, epoch, True, False)).error == E.invalid_producer_id_mapping
        assert (await env.coord.end_txn(TID, pid + 1, epoch, True, False)).error == E.invalid_producer_id_mapping
        await env.coord.add_partitions(TID, pid, epoch, [A0])
        before = snapshot(env)
        assert (await env.coord.end_txn(TID, pid, epoch + 1, True, False)).error == E.producer_fenced
        assert (await env.coord.end_txn(TID, pid, epoch - 1, True, False)).error == E.producer_fenced
        assert (await env.coord.end_txn(TID, pid, epoch + 1, True, True)).error == E.producer_fenced
        assert snapshot(env) == before

    run(body)


def test_end_txn_while_prepared():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env, [A0])
        env.markers.fail = {A0: E.request_timed_out}
        await env.coord.end_txn(TID, pid, epoch, False, False)
        await env.coord.drain()
        assert (await env.coord.end_txn(TID, pid, epoch, False, False)).error == E.concurrent_transactions
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == E.invalid_txn_state

    run(body, TV0)


def test_tv2_end_txn_bumps_the_epoch():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env)
        res = await env.coord.end_txn(TID, pid, epoch, True, True)
        assert res == (0, pid, epoch + 1)
        await env.coord.drain()
        assert env.markers.calls == [(pid, epoch + 1, 1, True, (A0, A1), 2)]
        md = env.md()
        assert (md.state, md.producer_epoch, md.last_producer_epoch, md.client_transaction_version) == (S.COMPLETE_COMMIT, epoch + 1, epoch, 2)
        # a retry with the old epoch after completion succeeds with the current id/epoch
        assert await env.coord.end_txn(TID, pid, epoch, True, True) == (0, pid, epoch + 1)
        assert (await env.coord.end_txn(TID, pid, epoch, False, True)).error == E.invalid_txn_state
        # the next transaction runs at the bumped epoch
        assert (await env.coord.add_partitions(TID, pid, epoch + 1, [B0], client_tv2=True)) == {B0: 0}
        assert (await env.coord.add_partitions(TID, pid, epoch, [B0])) == {B0: E.producer_fenced}

    run(body, TV2)


def test_tv2_abort_of_empty_and_complete_is_allowed():
    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id(TID, 60_000)
        res = await env.coord.end_txn(TID, r.producer_id, r.producer_epoch, False, True)
        assert res == (0, r.producer_id, r.producer_epoch + 1)
        await env.coord.drain()
        assert env.md().state is S.COMPLETE_ABORT and env.markers.calls == []
        res2 = await env.coord.end_txn(TID, r.producer_id, r.producer_epoch + 1, False, True)  # current epoch: bump again
        assert res2 == (0, r.producer_id, r.producer_epoch + 2)

    env = run(body, TV2)
    assert env.states() == ["Empty", "PrepareAbort", "CompleteAbort", "PrepareAbort", "CompleteAbort"]


def test_tv2_needs_the_feature_level():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env)
        assert await env.coord.end_txn(TID, pid, epoch, True, True) == (0, -1, -1)
        await env.coord.drain()
        assert env.markers.calls[0][1] == epoch and env.markers.calls[0][5] == 0

    run(body, TxnConfig(transaction_version=1))


def test_tv2_epoch_exhaustion_rotates_at_end_txn():
    log = seeded_log(producer_epoch=MAX_EPOCH - 1, state=S.ONGOING, partitions=frozenset({A0}), txn_start_ms=999_999)

    async def body(env: Env) -> None:
        env.markers = env.coord._markers = SlowMarkers(env.log, 0.5)  # slower than the completion wait
        res = await env.coord.end_txn(TID, 500, MAX_EPOCH - 1, True, True)
        assert res == (0, 1000, 0)
        # while the markers are pending the new id is told to wait
        assert await env.coord.add_partitions(TID, 1000, 0, [A1]) == {A1: E.concurrent_transactions}
        # and so is its first batch (Produce v12), retriable: not a failed transaction
        assert env.coord.check_in_txn(1000, 0, A1) == E.concurrent_transactions
        assert env.coord.check_in_txn(1000, 1, A1) == E.invalid_producer_id_mapping
        await env.coord.drain()
        assert env.markers.calls == [(500, MAX_EPOCH, 1, True, (A0,), 2)]
        md = env.md()
        assert (md.producer_id, md.producer_epoch, md.previous_producer_id, md.state) == (1000, 0, 500, S.COMPLETE_COMMIT)
        assert await env.coord.end_txn(TID, 500, MAX_EPOCH - 1, True, True) == (0, 1000, 0)  # retry on overflow

    run(body, TV2, log)


# -- produce-side checks -----------------------------------------------------------


def test_check_in_txn_and_implicit_add():
    async def body(env: Env) -> None:
        env.markers = env.coord._markers = SlowMarkers(env.log, 0.5)  # slower than the completion wait
        pid, epoch = await begin(env, [A0])
        assert env.coord.check_in_txn(pid, epoch, A0) is None
        assert env.coord.check_in_txn(pid, epoch, A1) == E.invalid_txn_state
        assert env.coord.check_in_txn(pid, epoch - 1, A0) == E.invalid_producer_epoch
        assert env.coord.check_in_txn(pid + 99, 0, A0) == E.invalid_producer_id_mapping
        assert await env.coord.add_partition_implicitly(pid, epoch, A1) == 0
        assert env.coord.check_in_txn(pid, epoch, A1) is None
        assert await env.coord.add_partition_implicitly(pid + 99, 0, A1) == E.invalid_producer_id_mapping
        assert env.md().client_transaction_version == 2
        await env.coord.end_txn(TID, pid, epoch, True, True)
        # PrepareCommit while the (slow) markers are written: retriable, not "not in the transaction"
        assert env.md().state.name == "PREPARE_COMMIT"
        assert env.coord.check_in_txn(pid, epoch + 1, A0) == E.concurrent_transactions
        assert await env.coord.add_partition_implicitly(pid, epoch + 1, A0) == E.concurrent_transactions

    run(body, TV2)


# -- admin ---------------------------------------------------------------------------


def test_describe_and_list():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env, [A0, A1, B0])
        await env.coord.init_producer_id("idle", 5000)
        env.clock.now += 100
        (d, missing) = env.coord.describe([TID, "nope"])
        assert d == {
            "error_code": 0, "transactional_id": TID, "transaction_state": "Ongoing", "transaction_timeout_ms": 60_000,
            "transaction_start_time_ms": 1_000_000, "producer_id": pid, "producer_epoch": epoch,
            "topics": [{"topic": "a", "partitions": [0, 1]}, {"topic": "b", "partitions": [0]}],
        }
        assert missing["error_code"] == E.transactional_id_not_found
        names = lambda rows: [r["transactional_id"] for r in rows]  # noqa: E731
        assert names(env.coord.list()) == ["idle", TID]
        assert env.coord.list(states=["Ongoing"]) == [{"transactional_id": TID, "producer_id": pid, "transaction_state": "Ongoing"}]
        assert names(env.coord.list(states=["Bogus"])) == []
        assert names(env.coord.list(producer_ids=[pid])) == [TID]
        assert names(env.coord.list(states=["Ongoing"], duration_ms=99)) == [TID]
        assert names(env.coord.list(states=["Ongoing"], duration_ms=100)) == []
        assert names(env.coord.list(pattern="id.*")) == ["idle"]
        assert names(env.coord.list(pattern="dle")) == []

    run(body)


# -- timers ------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [TxnConfig(transaction_version=0, abort_timed_out_interval_ms=1000), TxnConfig(abort_timed_out_interval_ms=1000)])
def test_timed_out_txn_is_aborted_through_the_fence(config):
    async def body(env: Env) -> None:
        pid, epoch = await begin(env, [A0], timeout=5000)
        await env.coord.tick()
        env.clock.now += 5000
        await env.coord.tick()
        assert env.md().state is S.ONGOING  # not older than its timeout yet, and the check interval
        env.clock.now += 1000
        await env.coord.tick()
        await env.coord.drain()
        assert env.md().state is S.COMPLETE_ABORT
        assert env.markers.calls[0][3] is False and env.markers.calls[0][1] > epoch
        assert (await env.coord.end_txn(TID, pid, epoch, True, config.transaction_version >= 2)).error == E.producer_fenced

    run(body, config)


def test_idle_transactional_ids_expire_with_a_tombstone():
    config = TxnConfig(transactional_id_expiration_ms=10_000, remove_expired_interval_ms=1)

    async def body(env: Env) -> None:
        r = await env.coord.init_producer_id("idle", 5000)
        pid, epoch = await begin(env, [A0])
        env.clock.now += 10_000
        await env.coord.tick()
        assert env.coord.metadata("idle") is None and env.coord.transactional_id_of(r.producer_id) is None
        assert env.md().state is S.ONGOING  # never an ongoing txn
        assert env.log.records[-1] == ("idle", None)
        assert env.coord.describe(["idle"])[0]["error_code"] == E.transactional_id_not_found
        # the id can be used again: a fresh producer id
        r2 = await env.coord.init_producer_id("idle", 5000)
        assert r2.error == 0 and r2.producer_id != r.producer_id

    env = run(body, config)
    assert env.states("idle") == ["Empty", "Dead", "Empty"]


def test_markers_are_retried_by_tick_and_gone_partitions_dropped():
    async def body(env: Env) -> None:
        pid, epoch = await begin(env, [A0, A1, B0])
        env.markers.fail = {A1: E.not_leader_or_follower, B0: E.unknown_topic_or_partition}
        await env.coord.end_txn(TID, pid, epoch, True, False)
        await env.coord.drain()
        assert env.md().state is S.PREPARE_COMMIT
        env.markers.raise_error = True
        await env.coord.tick()
        assert env.md().state is S.PREPARE_COMMIT
        env.markers.raise_error = False
        env.markers.fail = {}
        await env.coord.tick()
        assert env.md().state is S.COMPLETE_COMMIT
        assert [c[4] for c in env.markers.calls] == [(A0, A1, B0), (A1,), (A1,)]

    run(body, TV0)


# -- crashes -----------------------------------------------------------------------------------


def test_crash_after_prepare_commit_before_any_marker():
    env = Env(TV0)

    async def main() -> None:
        await env.coord.start()
        pid, epoch = await begin(env)
        env.markers.raise_error = True
        await env.coord.end_txn(TID, pid, epoch, True, False)
        await env.coord.drain()
        env2 = env.restart()
        await env2.coord.start()
        assert env2.md().state is S.COMPLETE_COMMIT
        assert env2.markers.calls == [(pid, epoch, 2, True, (A0, A1), 0)]  # the new coordinator epoch
        assert not env2.markers.violations

    asyncio.run(main())


def test_crash_after_some_markers_completes_as_commit():
    env = Env(TV2)

    async def main() -> None:
        await env.coord.start()
        pid, epoch = await begin(env, [A0, A1, B0])
        env.markers.fail = {A1: E.not_leader_or_follower}
        await env.coord.end_txn(TID, pid, epoch, True, True)
        await env.coord.drain()
        env2 = env.restart()
        await env2.coord.start()
        assert env2.md().state is S.COMPLETE_COMMIT
        # every marker is written again (idempotently), all COMMIT with the same id/epoch
        assert env2.markers.calls == [(pid, epoch + 1, 2, True, (A0, A1, B0), 2)]

    asyncio.run(main())


def test_crash_before_prepare_is_durable_leaves_the_txn_ongoing():
    env = Env(TV0)

    async def main() -> None:
        await env.coord.start()
        pid, epoch = await begin(env)
        env.log.auto_flush = False
        task = asyncio.create_task(env.coord.end_txn(TID, pid, epoch, True, False))
        await asyncio.sleep(0)
        assert env.coord.pending_transit(TID) is not None
        env2 = env.restart()
        assert (await task).error == E.not_coordinator
        env2.log.auto_flush = True
        await env2.coord.start()
        assert env2.md().state is S.ONGOING and env2.md().partitions == {A0, A1}
        assert env.markers.calls == [] and env2.markers.calls == []
        # the client retries against the new coordinator
        assert (await env2.coord.end_txn(TID, pid, epoch, True, False)).error == 0
        await env2.coord.drain()
        assert env2.md().state is S.COMPLETE_COMMIT

    asyncio.run(main())


# -- the file engine -----------------------------------------------------------------------------


def test_file_log_reload_tombstone_and_snapshot(tmp_path):
    clock = Clock()

    async def main() -> None:
        store = FileTxnLog.open(tmp_path, None, clock, snapshot_bytes=1)
        coord = TransactionCoordinator(store, Markers(), Ids(), clock, TxnConfig(transactional_id_expiration_ms=10, remove_expired_interval_ms=1), 1)
        await coord.start()
        r = await coord.init_producer_id("gone", 1000)
        r = await coord.init_producer_id(TID, 1000)
        await coord.add_partitions(TID, r.producer_id, r.producer_epoch, [A0])
        clock.now += 10
        await coord.tick()
        assert coord.metadata("gone") is None
        store.close()
        snaps = list((tmp_path / "__transaction_state-0").glob("*.txn-snapshot"))
        assert snaps
        store2 = FileTxnLog.open(tmp_path, None, clock)
        loaded = store2.load()
        assert set(loaded) == {TID} and loaded[TID] == coord.metadata(TID)
        store2.close()

    asyncio.run(main())


def test_file_log_waits_for_the_durability_callback(tmp_path):
    clock = Clock()

    async def main() -> None:
        futures: list[asyncio.Future[None]] = []

        def durability(part: Any) -> asyncio.Future[None]:
            fut = asyncio.get_running_loop().create_future()
            futures.append(fut)
            return fut

        store = FileTxnLog.open(tmp_path, durability, clock)
        coord = TransactionCoordinator(store, Markers(), Ids(), clock, TxnConfig(), 1)
        await coord.start()
        task = asyncio.create_task(coord.init_producer_id(TID, 1000))
        await asyncio.sleep(0)
        assert coord.metadata(TID) is None and len(futures) == 1
        futures[0].set_exception(OSError("fsync failed"))
        assert (await task).error == E.not_coordinator
        assert coord.metadata(TID) is None
        task = asyncio.create_task(coord.init_producer_id(TID, 1000))
        await asyncio.sleep(0)
        store._log.log.sync()
        futures[1].set_result(None)
        assert (await task).error == 0
        store.close()
        reloaded = FileTxnLog.open(tmp_path, None, clock)
        assert reloaded.load()[TID].producer_epoch == 0
        raw = reloaded._log.live[TID]
        assert json.loads(json.dumps(raw))["state"] == 0
        reloaded.close()

    asyncio.run(main())


class SlowMarkers(Markers):
    """Markers that take ``delay`` seconds to become durable (a few fsync rounds)."""

    def __init__(self, log: MemoryTxnLog | None = None, delay: float = 0.02) -> None:
        super().__init__(log)
        self.delay = delay

    async def write_markers(self, *args: Any) -> dict[TopicPartition, int]:
        await asyncio.sleep(self.delay)
        return await super().write_markers(*args)


@pytest.mark.parametrize(
    ("delay", "expected"),
    [(0.02, 0), (0.5, int(E.concurrent_transactions))],
)
def test_next_transaction_waits_briefly_for_markers_in_flight(delay: float, expected: int) -> None:
    """AddPartitions right after EndTxn waits for markers that finish within the short
    completion wait (no CONCURRENT_TRANSACTIONS round trip); slower ones still get it."""
    seen: list[int] = []

    async def body(env: Env) -> None:
        env.markers = env.coord._markers = SlowMarkers(env.log, delay)
        pid, epoch = await begin(env)
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == 0
        res = await env.coord.add_partitions(TID, pid, epoch, [B0])
        seen.append(res[B0])

    env = run(body, TV0)
    assert seen == [expected]
    if expected == 0:
        assert env.states()[-2:] == ["CompleteCommit", "Ongoing"]


@pytest.mark.parametrize("config", [TV0, TV2])
def test_next_transaction_add_is_chained_on_the_complete_record(config: TxnConfig) -> None:
    """The next transaction's first adds (the produce's and the offsets') that arrive while the
    markers are written are appended right behind CompleteCommit, once the markers are durable:
    all three records are durable in one flush (one group-commit round), applied in order, and
    the adds are answered only then."""
    env = Env(config, log=MemoryTxnLog(auto_flush=True))

    async def main() -> None:
        env.markers = env.coord._markers = SlowMarkers(env.log, 0.01)
        await env.coord.start()
        pid, epoch = await begin(env, [A0])
        r = await env.coord.end_txn(TID, pid, epoch, True, config is TV2)
        assert r.error == 0
        if config is TV2:
            epoch = r.producer_epoch
        env.log.auto_flush = False
        adds = [asyncio.create_task(env.coord.add_partitions(TID, pid, epoch, [B0], client_tv2=config is TV2)),
                asyncio.create_task(env.coord.add_offsets(TID, pid, epoch, "g", client_tv2=config is TV2))]

        async def appended() -> None:
            while env.log.unflushed < 3:
                await asyncio.sleep(0.002)

        await asyncio.wait_for(appended(), 2.0)
        assert [rec["state"] for _, rec in env.log.records[-3:]] == [S.COMPLETE_COMMIT.id, S.ONGOING.id, S.ONGOING.id]
        assert env.md().state is S.PREPARE_COMMIT and not any(t.done() for t in adds)
        env.log.flush()
        assert [await t for t in adds] == [{B0: 0}, 0]
        assert env.states()[-3:] == ["CompleteCommit", "Ongoing", "Ongoing"]
        assert env.md().partitions == {B0, OFFSETS_TP}
        await env.coord.drain()

    asyncio.run(main())
    assert not env.markers.violations


def test_failed_write_answers_are_not_kept_for_ids_that_write_no_more():
    """Review N3: the answer of an id's failed write is kept for a write chained on it; an id whose
    first write failed (never in the metadata, so it never expires) or that never writes again does not
    keep it for ever: the expiry check drops it."""
    config = TxnConfig(transactional_id_expiration_ms=10_000, remove_expired_interval_ms=1)

    async def body(env: Env) -> None:
        env.log.fail_next = 1
        assert (await env.coord.init_producer_id("never-written", 60_000)).error == E.not_coordinator
        pid, epoch = await begin(env, [A0])
        env.log.fail_next = 1
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == E.not_coordinator
        assert set(env.coord._failed) == {"never-written", TID}
        env.clock.now += 5
        await env.coord.tick()
        assert env.coord._failed == {}
        assert env.coord.metadata("never-written") is None and env.md().state is S.ONGOING  # nothing else changed
        assert (await env.coord.end_txn(TID, pid, epoch, True, False)).error == 0

    run(body, config)


class _NoIds:
    """ProducerIdManager whose next block cannot be written (the data directory goes offline)."""

    def generate(self) -> int:
        from oncelog.storage.log_dir import LogDirOfflineError

        raise LogDirOfflineError(28, "the log directory is offline (write of the producer-id block: No space left)")


@pytest.mark.parametrize("case", ["new id", "exhausted epoch"])
def test_init_producer_id_that_cannot_get_a_producer_id_answers_not_coordinator(case: str) -> None:
    """Kafka's handleInitProducerId answers a failed generateProducerId with an error code (both the
    new-transactional-id and the epoch-exhausted branch); before, the OSError escaped the coordinator."""
    async def body(env: Env) -> None:
        env.coord._ids = _NoIds()
        if case == "new id":
            r = await env.coord.init_producer_id("other", 60_000)
        else:
            r = await env.coord.init_producer_id(TID, 60_000, 500, MAX_EPOCH - 1)
        assert r.error == E.not_coordinator and r.producer_id == -1
        assert env.coord.metadata("other") is None and env.md().producer_id == 500  # nothing changed

    run(body, log=seeded_log())


def test_tv2_end_txn_that_cannot_get_the_next_producer_id_answers_not_coordinator() -> None:
    log = seeded_log(producer_epoch=MAX_EPOCH - 1, state=S.ONGOING, partitions=frozenset({A0}), txn_start_ms=999_999)

    async def body(env: Env) -> None:
        env.coord._ids = _NoIds()
        res = await env.coord.end_txn(TID, 500, MAX_EPOCH - 1, True, True)
        assert res.error == E.not_coordinator
        assert env.md().state is S.ONGOING and env.markers.calls == []  # nothing written or sent

    run(body, TV2, log)
