"""Transactional offset commits (KIP-98/447) on the group side: the store, the
coordinator, the TxnOffsetCommit and OffsetFetch handlers. Sans-IO: fake
clock, fake futures, an in-memory store or a real offsets log in a temp dir."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest as OffsetFetchV7
from kio.schema.offset_fetch.v7.request import OffsetFetchRequestTopic
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest as OffsetFetchV8
from kio.schema.offset_fetch.v8.request import OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.txn_offset_commit.v0 import request as txn_v0
from kio.schema.txn_offset_commit.v3 import request as txn_v3

from oncelog.broker.group import GroupConfig, GroupCoordinator, GroupState, OffsetAndMetadata, OffsetStore, TopicPartition
from oncelog.broker.handlers import offset_fetch, txn_offset_commit
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.errors import KafkaError
from oncelog.protocol.records import read_control_marker
from tests.unit.test_group_coordinator import Clock, FakeFuture  # the group tests' event-loop-free fakes

SESSION = 10_000
REBALANCE = 30_000
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)
PID, PID2 = 4000, 4001


def om(offset: int, metadata: str = "") -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, 0, metadata)


def coordinator(store: OffsetStore | None = None, clock: Clock | None = None, **cfg: Any) -> GroupCoordinator:
    clock = clock or Clock()
    return GroupCoordinator(store or OffsetStore(clock=clock), clock,
                            GroupConfig(initial_rebalance_delay_ms=0, **cfg), new_future=FakeFuture)


def visible(c: GroupCoordinator, group: str = "g", tps: list[TopicPartition] | None = None) -> dict[TopicPartition, int]:
    return {tp: off for tp, off, _e, _m in c.fetch_offsets(group, tps or [TP0, TP1])[1]}


def stable_member(c: GroupCoordinator, group: str = "g", instance: str | None = None) -> tuple[str, int]:
    first = c.join_group(group, "", instance, SESSION, REBALANCE, "consumer", [("range", b"")], "cl", "/h", True, True)
    r = first.result()
    if r["error_code"] == E.member_id_required:
        r = c.join_group(group, r["member_id"], instance, SESSION, REBALANCE, "consumer", [("range", b"")], "cl", "/h",
                         True, True).result()
    assert r["error_code"] == 0
    mid, gen = r["member_id"], r["generation_id"]
    assert c.sync_group(group, gen, mid, instance, None, None, {mid: b""}).result()["error_code"] == 0
    assert c.groups[group].state == GroupState.STABLE
    return mid, gen


def txn_commit(c: GroupCoordinator, offsets: dict[TopicPartition, OffsetAndMetadata], pid: int = PID, epoch: int = 0,
               gen: int = -1, member: str = "", instance: str | None = None, group: str = "g") -> dict[TopicPartition, int]:
    errors, fut = c.txn_commit_offsets(group, pid, epoch, gen, member, instance, offsets)
    assert fut is None  # in-memory store or a log without a durability callback
    return errors


# -- store and coordinator, in memory -------------------------------------------------------


def test_pending_offsets_are_invisible_until_commit_marker() -> None:
    c = coordinator()
    assert c.commit_offsets("g", -1, "", None, {TP0: om(3)})[0] == {TP0: 0}
    assert txn_commit(c, {TP0: om(10, "a"), TP1: om(20)}) == {TP0: 0, TP1: 0}
    assert visible(c) == {TP0: 3, TP1: -1}
    assert c.has_pending_txn_offsets("g", TP0) and c.has_pending_txn_offsets("g", TP1)
    assert not c.has_pending_txn_offsets("g", TopicPartition("t", 2))
    assert not c.has_pending_txn_offsets("other", TP0)
    assert c.store.pending_offsets(PID) == {"g": {TP0: om(10, "a")._replace(commit_timestamp=1_000_000),
                                                   TP1: om(20)._replace(commit_timestamp=1_000_000)}}
    assert c.store.write_marker(PID, 0, commit=True) is None
    assert visible(c) == {TP0: 10, TP1: 20}
    assert c.fetch_offsets("g", [TP0])[1] == [(TP0, 10, 0, "a")]
    assert not c.has_pending_txn_offsets("g", TP0) and c.store.pending_offsets(PID) == {}


def test_abort_marker_discards_pending_offsets() -> None:
    c = coordinator()
    c.commit_offsets("g", -1, "", None, {TP0: om(3)})
    txn_commit(c, {TP0: om(10), TP1: om(20)})
    c.store.write_marker(PID, 0, commit=False)
    assert visible(c) == {TP0: 3, TP1: -1}
    assert not c.has_pending_txn_offsets("g", TP0) and not c.has_pending_txn_offsets("g", TP1)
    # a later commit marker of the same producer has nothing left to commit
    c.store.write_marker(PID, 0, commit=True)
    assert visible(c) == {TP0: 3, TP1: -1}


def test_marker_without_pending_offsets_is_harmless() -> None:
    c = coordinator()
    c.commit_offsets("g", -1, "", None, {TP0: om(3)})
    txn_commit(c, {TP1: om(7)}, pid=PID2)
    c.store.write_marker(PID, 0, commit=True)
    c.store.write_marker(PID, 0, commit=False)
    assert visible(c) == {TP0: 3, TP1: -1}
    assert c.has_pending_txn_offsets("g", TP1)  # the other producer's offsets are untouched


def test_interleaved_producers_resolve_independently() -> None:
    c = coordinator()
    txn_commit(c, {TP0: om(10)}, pid=PID)
    txn_commit(c, {TP0: om(11), TP1: om(21)}, pid=PID2)
    txn_commit(c, {TP0: om(12)}, pid=PID)  # the same transaction commits again: the later offset counts
    assert visible(c) == {TP0: -1, TP1: -1}
    c.store.write_marker(PID2, 0, commit=False)
    assert visible(c) == {TP0: -1, TP1: -1}
    assert c.has_pending_txn_offsets("g", TP0) and not c.has_pending_txn_offsets("g", TP1)
    c.store.write_marker(PID, 0, commit=True)
    assert visible(c) == {TP0: 12, TP1: -1}
    assert not c.has_pending_txn_offsets("g", TP0)


def test_interleaved_commits_the_later_record_wins() -> None:
    # Kafka keeps the most recent record when plain and transactional commits mix
    c = coordinator()
    txn_commit(c, {TP0: om(10)}, pid=PID)
    c.commit_offsets("g", -1, "", None, {TP0: om(50)})  # written after the transactional record
    txn_commit(c, {TP1: om(20)}, pid=PID2)
    c.commit_offsets("g", -1, "", None, {TP1: om(5)})  # ... and this one too
    txn_commit(c, {TP1: om(30)}, pid=PID2)  # but the producer commits again, later still
    c.store.write_marker(PID, 0, commit=True)
    c.store.write_marker(PID2, 0, commit=True)
    assert visible(c) == {TP0: 50, TP1: 30}


def test_group_validation_kip447() -> None:
    c = coordinator()
    mid, gen = stable_member(c)
    assert txn_commit(c, {TP0: om(1)}, gen=gen + 1, member=mid) == {TP0: E.illegal_generation}
    assert txn_commit(c, {TP0: om(1)}, gen=gen, member="nobody") == {TP0: E.unknown_member_id}
    assert txn_commit(c, {TP0: om(1)}, gen=gen, member=mid) == {TP0: 0}
    # v0-v2 clients and producers outside the group: generation -1, no member id, accepted while Stable
    assert txn_commit(c, {TP1: om(2)}, pid=PID2) == {TP1: 0}
    assert c.store.pending_offsets(PID) == {"g": {TP0: om(1)._replace(commit_timestamp=1_000_000)}}
    # static membership: the instance id must map to the member id
    c2 = coordinator()
    smid, sgen = stable_member(c2, instance="i1")
    assert txn_commit(c2, {TP0: om(1)}, gen=sgen, member="other", instance="i1") == {TP0: E.fenced_instance_id}
    assert txn_commit(c2, {TP0: om(1)}, gen=sgen, member=smid, instance="i2") == {TP0: E.unknown_member_id}
    assert txn_commit(c2, {TP0: om(1)}, gen=sgen, member=smid, instance="i1") == {TP0: 0}
    assert not c.store.has_pending("g", TopicPartition("x", 0))


def test_completing_rebalance_does_not_block_txn_commits() -> None:
    c = coordinator()
    r = c.join_group("g", "", None, SESSION, REBALANCE, "consumer", [("range", b"")], "cl", "/h", False, True).result()
    mid, gen = r["member_id"], r["generation_id"]
    assert c.groups["g"].state == GroupState.COMPLETING_REBALANCE
    assert c.commit_offsets("g", gen, mid, None, {TP0: om(1)})[0] == {TP0: E.rebalance_in_progress}
    assert txn_commit(c, {TP0: om(1)}, gen=gen, member=mid) == {TP0: 0}


def test_missing_group_simple_group_and_bad_input() -> None:
    c = coordinator(offset_metadata_max_bytes=5)
    assert txn_commit(c, {TP0: om(1)}, gen=3, member="m", group="nope") == {TP0: E.illegal_generation}
    assert "nope" not in c.groups and not c.store.has_pending("nope")
    assert txn_commit(c, {TP0: om(1)}, group="simple") == {TP0: 0}
    assert c.groups["simple"].state == GroupState.EMPTY and c.store.has_pending("simple", TP0)
    assert txn_commit(c, {TP0: om(1)}, group="") == {TP0: E.invalid_group_id}
    assert txn_commit(c, {TP0: om(1, "123456"), TP1: om(2, "12345")}, group="m") == {
        TP0: E.offset_metadata_too_large, TP1: 0}
    assert c.store.pending_offsets(PID)["m"] == {TP1: om(2, "12345")._replace(commit_timestamp=1_000_000)}
    # a group left with nothing after a rejected commit is not kept
    assert txn_commit(c, {TP0: om(1, "123456")}, group="only-bad") == {TP0: E.offset_metadata_too_large}
    assert "only-bad" not in c.groups


def test_stale_epochs_are_refused() -> None:
    c = coordinator()
    txn_commit(c, {TP0: om(10)}, epoch=5)
    assert txn_commit(c, {TP1: om(1)}, epoch=4) == {TP1: E.invalid_producer_epoch}
    with pytest.raises(KafkaError) as exc:
        c.store.write_marker(PID, 4, commit=True)
    assert exc.value.code == E.invalid_producer_epoch
    assert visible(c) == {TP0: -1, TP1: -1} and c.has_pending_txn_offsets("g", TP0)
    # TV2: a marker must carry the epoch EndTxn bumped; one at the transaction's own epoch is a delayed one
    with pytest.raises(KafkaError):
        c.store.write_marker(PID, 5, commit=True, transaction_version=2)
    assert c.has_pending_txn_offsets("g", TP0)
    c.store.write_marker(PID, 6, commit=True, transaction_version=2)
    assert visible(c) == {TP0: 10, TP1: -1}
    # the transaction is over: the next one may use any epoch the coordinator allows
    assert txn_commit(c, {TP1: om(1)}, epoch=6) == {TP1: 0}


def test_tombstones_drop_pending_offsets_and_expiry_waits() -> None:
    c = coordinator(offsets_retention_ms=1000)
    c.commit_offsets("g", -1, "", None, {TP0: om(3)})
    txn_commit(c, {TP0: om(10), TP1: om(20)})
    # OffsetDelete on an Empty group deletes committed and pending-only partitions alike
    error, errors, _ = c.delete_offsets("g", [TP1])
    assert (error, errors) == (0, {TP1: 0})
    assert not c.has_pending_txn_offsets("g", TP1) and c.has_pending_txn_offsets("g", TP0)
    # expiry leaves an offset alone while a transaction holds a pending one for it, and keeps the group
    c.clock.now += 10_000  # type: ignore[attr-defined]
    assert c.expire_offsets() == 0
    assert visible(c) == {TP0: 3, TP1: -1} and "g" in c.groups
    c.store.write_marker(PID, 0, commit=True)
    assert visible(c) == {TP0: 10, TP1: -1}  # TP1's pending offset went with its tombstone
    # a group holding only pending offsets is kept by expiry, and DeleteGroups removes them too
    txn_commit(c, {TP0: om(1)}, pid=PID2, group="h")
    c.expire_offsets()  # expires g's now-visible TP0 offset, not h
    assert "h" in c.groups and c.store.has_pending("h", TP0) and "g" not in c.groups
    assert c.delete_groups(["h"])[0] == {"h": 0}
    assert not c.store.has_pending("h")
    c.store.write_marker(PID2, 0, commit=True)
    assert visible(c, "h") == {TP0: -1, TP1: -1}


def test_deleted_topic_drops_pending_offsets() -> None:
    c = coordinator()
    txn_commit(c, {TP0: om(10), TopicPartition("u", 0): om(5)})
    assert c.on_topic_deleted("t") == 1
    assert not c.has_pending_txn_offsets("g", TP0) and c.has_pending_txn_offsets("g", TopicPartition("u", 0))
    assert "g" in c.groups
    assert c.on_topic_deleted("u") == 1
    assert "g" not in c.groups  # empty, nothing left


# -- with a real offsets log --------------------------------------------------------------


def test_transactional_batches_and_markers_in_the_log(tmp_path: Path) -> None:
    clock = Clock()
    store = OffsetStore.open(tmp_path, None, clock)
    store.commit("g", {TP0: om(1)})
    store.txn_commit("g", PID, 3, {TP0: om(10)})
    store.write_marker(PID, 3, commit=True, coordinator_epoch=7)
    store.write_marker(PID2, 1, commit=False)
    assert store._log is not None
    batches = list(store._log.scan_batches())
    assert [(h.is_transactional, h.is_control, h.producer_id, h.producer_epoch) for h, _ in batches] == [
        (False, False, -1, -1), (True, False, PID, 3), (True, True, PID, 3), (True, True, PID2, 1)]
    markers = [read_control_marker(d) for h, d in batches if h.is_control]
    assert [(m.commit, m.coordinator_epoch) for m in markers] == [(True, 7), (False, 0)]
    assert store.get("g", TP0) == om(10)._replace(commit_timestamp=clock())


def test_pending_survive_reopen_without_clean_shutdown(tmp_path: Path) -> None:
    clock = Clock()
    c = coordinator(OffsetStore.open(tmp_path, None, clock), clock)
    c.commit_offsets("g", -1, "", None, {TP0: om(3)})
    txn_commit(c, {TP0: om(10)}, pid=PID, epoch=2)
    txn_commit(c, {TP1: om(20)}, pid=PID2)
    txn_commit(c, {TP0: om(7)}, pid=PID + 2, group="only-pending")
    c.store.write_marker(PID + 2, 0, commit=False)
    txn_commit(c, {TP0: om(8)}, pid=PID + 3, group="only-pending")
    # crash: no close, no snapshot
    c2 = coordinator(OffsetStore.open(tmp_path, None, clock), clock)
    assert visible(c2) == {TP0: 3, TP1: -1}
    assert c2.has_pending_txn_offsets("g", TP0) and c2.has_pending_txn_offsets("g", TP1)
    assert "only-pending" in c2.groups and c2.has_pending_txn_offsets("only-pending", TP0)
    assert c2.store.pending_offsets(PID + 2) == {}
    # the replayed epoch still fences a stale marker
    with pytest.raises(KafkaError):
        c2.store.write_marker(PID, 1, commit=True)
    c2.store.write_marker(PID, 2, commit=True)
    c2.store.write_marker(PID2, 0, commit=False)
    assert visible(c2) == {TP0: 10, TP1: -1}
    # and the markers written after the reopen replay too
    c3 = coordinator(OffsetStore.open(tmp_path, None, clock), clock)
    assert visible(c3) == {TP0: 10, TP1: -1}
    assert not c3.has_pending_txn_offsets("g", TP0) and not c3.has_pending_txn_offsets("g", TP1)
    assert c3.has_pending_txn_offsets("only-pending", TP0)


def test_snapshot_keeps_pending_offsets_and_record_order(tmp_path: Path) -> None:
    clock = Clock()
    store = OffsetStore.open(tmp_path, None, clock, snapshot_bytes=1)
    c = coordinator(store, clock)
    txn_commit(c, {TP0: om(10)}, pid=PID, epoch=4)
    c.commit_offsets("g", -1, "", None, {TP0: om(50)})  # later than the transactional record: it must win
    txn_commit(c, {TP1: om(20)}, pid=PID2)
    assert store.maybe_snapshot()
    assert store._log is not None and store._log.log_start_offset == store._log.log_end_offset
    store.close()  # a clean close snapshots again: nothing is left in the log
    c2 = coordinator(OffsetStore.open(tmp_path, None, clock), clock)
    assert c2.has_pending_txn_offsets("g", TP0) and c2.has_pending_txn_offsets("g", TP1)
    assert visible(c2) == {TP0: 50, TP1: -1}
    with pytest.raises(KafkaError):
        c2.store.write_marker(PID, 3, commit=True)  # the epoch came through the snapshot
    c2.store.write_marker(PID, 4, commit=True)
    c2.store.write_marker(PID2, 0, commit=True)
    assert visible(c2) == {TP0: 50, TP1: 20}
    assert not c2.has_pending_txn_offsets("g", TP0)


def test_format_1_snapshot_still_loads(tmp_path: Path) -> None:
    clock = Clock()
    store = OffsetStore.open(tmp_path, None, clock)
    store.commit("g", {TP0: om(5)})
    store.maybe_snapshot(force=True)
    store._log.close()  # type: ignore[union-attr]
    import json

    (snap,) = (tmp_path / "__consumer_offsets-0").glob("*.offsets-snapshot")
    data = json.loads(snap.read_bytes())
    data["format"] = 1
    data["offsets"] = {g: [row[:7] for row in rows] for g, rows in data["offsets"].items()}
    del data["txns"]
    snap.write_text(json.dumps(data))
    c = coordinator(OffsetStore.open(tmp_path, None, clock), clock)
    assert visible(c) == {TP0: 5, TP1: -1}
    txn_commit(c, {TP0: om(9)})
    c.store.write_marker(PID, 0, commit=True)
    assert visible(c) == {TP0: 9, TP1: -1}


def test_pending_and_marker_apply_only_when_durable(tmp_path: Path) -> None:
    clock = Clock()
    waiting: list[FakeFuture] = []

    def durability(_partition: Any) -> FakeFuture:
        waiting.append(FakeFuture())
        return waiting[-1]

    store = OffsetStore.open(tmp_path, durability, clock)
    c = coordinator(store, clock)
    errors, fut = c.txn_commit_offsets("g", PID, 0, -1, "", None, {TP0: om(10)})
    assert errors == {TP0: 0} and fut is waiting[0]
    assert not c.has_pending_txn_offsets("g", TP0)  # not durable yet
    store._log.sync()  # type: ignore[union-attr]
    fut.set_result(None)
    assert c.has_pending_txn_offsets("g", TP0) and visible(c) == {TP0: -1, TP1: -1}
    mfut = store.write_marker(PID, 0, commit=True)
    assert mfut is waiting[1] and visible(c) == {TP0: -1, TP1: -1}
    store._log.sync()  # type: ignore[union-attr]
    mfut.set_result(None)
    assert visible(c) == {TP0: 10, TP1: -1} and not c.has_pending_txn_offsets("g", TP0)


# -- handlers ---------------------------------------------------------------------------------


class FakeTxn:
    def __init__(self, error: int | None = None, add_error: int = 0) -> None:
        self.error = error
        self.add_error = add_error
        self.checked: list[tuple[int, int, TopicPartition]] = []
        self.added: list[tuple[int, int, TopicPartition]] = []

    def check_in_txn(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> int | None:
        self.checked.append((producer_id, producer_epoch, tp))
        return self.error

    async def add_partition_implicitly(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> int:
        self.added.append((producer_id, producer_epoch, tp))
        return self.add_error


def fake_ctx(c: GroupCoordinator, version: int, txn: Any = None) -> Any:
    broker = SimpleNamespace(clock=c.clock, groups=c, txn=txn,
                             topics={"t": SimpleNamespace(name="t", partitions=[0, 1, 2])})
    return SimpleNamespace(broker=broker, version=version)


def txn_request_v0(group: str = "g", epoch: int = 0) -> Any:
    parts = (txn_v0.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=10, committed_metadata="m"),
             txn_v0.TxnOffsetCommitRequestPartition(partition_index=9, committed_offset=1, committed_metadata=None))
    return txn_v0.TxnOffsetCommitRequest(
        transactional_id="tx", group_id=group, producer_id=PID, producer_epoch=epoch,
        topics=(txn_v0.TxnOffsetCommitRequestTopic(name="t", partitions=parts),
                txn_v0.TxnOffsetCommitRequestTopic(name="gone", partitions=(parts[0],))))


def txn_request_v3(gen: int, member: str, instance: str | None = None) -> Any:
    part = txn_v3.TxnOffsetCommitRequestPartition(partition_index=1, committed_offset=20, committed_leader_epoch=3,
                                                  committed_metadata=None)
    return txn_v3.TxnOffsetCommitRequest(
        transactional_id="tx", group_id="g", producer_id=PID, producer_epoch=0, generation_id=gen, member_id=member,
        group_instance_id=instance, topics=(txn_v3.TxnOffsetCommitRequestTopic(name="t", partitions=(part,)),))


def codes(resp: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {(t["name"], p["partition_index"]): int(p["error_code"]) for t in resp["topics"] for p in t["partitions"]}


def test_txn_offset_commit_handler_v0_verifies_then_commits_pending() -> None:
    c = coordinator()
    mid, gen = stable_member(c)
    txn = FakeTxn()
    resp = asyncio.run(txn_offset_commit.handle(fake_ctx(c, 0, txn), txn_request_v0()))
    # v0 has no generation fields: generation -1 and no member pass while the group is Stable
    assert codes(resp) == {("t", 0): 0, ("t", 9): E.unknown_topic_or_partition, ("gone", 0): E.unknown_topic_or_partition}
    assert txn.checked == [(PID, 0, TopicPartition("__consumer_offsets", 0))]
    assert c.has_pending_txn_offsets("g", TP0) and visible(c) == {TP0: -1, TP1: -1}
    assert c.store.pending_offsets(PID)["g"][TP0].metadata == "m"


def test_txn_offset_commit_handler_verification_errors() -> None:
    c = coordinator()
    cases = [
        (0, E.invalid_txn_state, E.invalid_txn_state),
        (3, E.transaction_abortable, E.invalid_txn_state),  # old clients do not know TRANSACTION_ABORTABLE
        (4, E.transaction_abortable, E.transaction_abortable),
        # the offsets partition not in the transaction: TRANSACTION_ABORTABLE from v4, as Kafka
        (3, E.invalid_txn_state, E.invalid_txn_state),
        (4, E.invalid_txn_state, E.transaction_abortable),
        (2, E.producer_fenced, E.invalid_producer_epoch),
        (4, E.invalid_producer_epoch, E.invalid_producer_epoch),
    ]
    for version, error, answered in cases:
        resp = asyncio.run(txn_offset_commit.handle(fake_ctx(c, version, FakeTxn(int(error))), txn_request_v0()))
        assert codes(resp)[("t", 0)] == answered, (version, error)
        assert codes(resp)[("gone", 0)] == E.unknown_topic_or_partition
    assert not c.store.has_pending("g") and "g" not in c.groups
    # an empty group id is INVALID_GROUP_ID before any verification
    txn = FakeTxn(int(E.invalid_txn_state))
    resp = asyncio.run(txn_offset_commit.handle(fake_ctx(c, 0, txn), txn_request_v0(group="")))
    assert codes(resp)[("t", 0)] == E.invalid_group_id and txn.checked == []
    # without a transaction coordinator there is nothing to verify
    resp = asyncio.run(txn_offset_commit.handle(fake_ctx(c, 0, None), txn_request_v0()))
    assert codes(resp)[("t", 0)] == 0 and c.has_pending_txn_offsets("g", TP0)


def test_txn_offset_commit_handler_v3_kip447_and_v5_adds_partition() -> None:
    c = coordinator()
    mid, gen = stable_member(c)
    ctx = fake_ctx(c, 3, FakeTxn())
    assert codes(asyncio.run(txn_offset_commit.handle(ctx, txn_request_v3(gen - 1, mid)))) == {("t", 1): E.illegal_generation}
    assert codes(asyncio.run(txn_offset_commit.handle(ctx, txn_request_v3(gen, "zombie")))) == {("t", 1): E.unknown_member_id}
    assert not c.store.has_pending("g")
    assert codes(asyncio.run(txn_offset_commit.handle(ctx, txn_request_v3(gen, mid)))) == {("t", 1): 0}
    assert c.store.pending_offsets(PID)["g"][TP1][:3] == (20, 3, "")
    # v5 (transaction version 2) adds the offsets partition to the transaction itself
    txn = FakeTxn()
    assert codes(asyncio.run(txn_offset_commit.handle(fake_ctx(c, 5, txn), txn_request_v3(gen, mid)))) == {("t", 1): 0}
    assert txn.added == [(PID, 0, TopicPartition("__consumer_offsets", 0))] and len(txn.checked) == 1
    txn = FakeTxn(add_error=int(E.concurrent_transactions))
    assert codes(asyncio.run(txn_offset_commit.handle(fake_ctx(c, 5, txn), txn_request_v3(gen, mid)))) == {
        ("t", 1): E.concurrent_transactions}
    # v4 only verifies
    txn = FakeTxn()
    asyncio.run(txn_offset_commit.handle(fake_ctx(c, 4, txn), txn_request_v3(gen, mid)))
    assert txn.added == [] and len(txn.checked) == 1


def fetch_v7(c: GroupCoordinator, require_stable: bool, topics: Any = "t") -> dict[int, tuple[int, int]]:
    req_topics = None if topics is None else (OffsetFetchRequestTopic(name="t", partition_indexes=(0, 1)),)
    req = OffsetFetchV7(group_id="g", topics=req_topics, require_stable=require_stable)
    resp = asyncio.run(offset_fetch.handle(fake_ctx(c, 7), req))
    assert resp["error_code"] == 0
    return {p["partition_index"]: (p["committed_offset"], int(p["error_code"]))
            for t in resp["topics"] for p in t["partitions"]}


def test_offset_fetch_require_stable() -> None:
    c = coordinator()
    c.commit_offsets("g", -1, "", None, {TP0: om(3), TP1: om(4)})
    txn_commit(c, {TP0: om(10)})
    assert fetch_v7(c, False) == {0: (3, 0), 1: (4, 0)}
    assert fetch_v7(c, True) == {0: (-1, E.unstable_offset_commit), 1: (4, 0)}
    assert fetch_v7(c, True, topics=None) == {0: (-1, E.unstable_offset_commit), 1: (4, 0)}
    # v8+: per group, require_stable at the top level
    req = OffsetFetchV8(groups=(OffsetFetchRequestGroup(group_id="g", topics=(
        OffsetFetchRequestTopics(name="t", partition_indexes=(0, 1)),)),), require_stable=True)
    resp = asyncio.run(offset_fetch.handle(fake_ctx(c, 8), req))
    parts = {p["partition_index"]: (p["committed_offset"], int(p["error_code"]))
             for t in resp["groups"][0]["topics"] for p in t["partitions"]}
    assert parts == {0: (-1, E.unstable_offset_commit), 1: (4, 0)}
    c.store.write_marker(PID, 0, commit=True)
    assert fetch_v7(c, True) == {0: (10, 0), 1: (4, 0)}
