"""A failed write to the offsets log answers NOT_COORDINATOR, as Kafka maps a storage error.

Kafka's group coordinator answers an append that failed with KAFKA_STORAGE_ERROR
(or NOT_LEADER_OR_FOLLOWER) with NOT_COORDINATOR (GroupMetadataManager's
appendGroupMetadataErrorToResponseError for JoinGroup/SyncGroup, coordinator-common's
handleOperationException for OffsetCommit, TxnOffsetCommit, OffsetDelete and
DeleteGroups). Here the offsets log is a real PartitionLog whose fsync or write
fails with an OSError. Either takes the log directory offline (a failed fsync is
never retried: docs/groups.md), so every later write answers NOT_COORDINATOR too and
nothing of the failed write is ever served; a restart reads back what the file holds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.broker.group import GroupConfig, GroupCoordinator, GroupState, OffsetAndMetadata, OffsetStore, TopicPartition
from oncelog.broker.handlers import delete_groups, offset_delete, offset_fetch
from oncelog.broker.handlers.offset_commit import await_stored
from oncelog.protocol.errors import ErrorCode as E
from oncelog.storage.log_dir import LogDirFailureChannel
from tests.unit.test_group_coordinator import RANGE, REBALANCE, SESSION, Clock

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)
EIO = OSError(5, "Input/output error")


class Env:
    """A coordinator on a file-backed offsets store (in a log directory with its failure
    channel) whose fdatasyncs fail while ``fail_sync`` is set."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.clock = Clock()
        self.fail_sync = False
        self.cancel_sync = False  # the fsync round is cancelled (the broker shutting down)
        self.log_dir = LogDirFailureChannel(tmp_path)
        self.store = OffsetStore.open(tmp_path, self._durability, self.clock, failure_channel=self.log_dir)
        plog = self.store._log
        assert plog is not None
        real_sync = plog._sync

        def sync() -> int:
            if self.fail_sync:
                raise EIO  # the batch stays in the file (page cache), not known durable
            return real_sync()

        plog._sync = sync  # type: ignore[method-assign]  # under the failure channel's wrapper
        self.c = GroupCoordinator(self.store, self.clock, GroupConfig(initial_rebalance_delay_ms=0))

    def _durability(self, handle: Any) -> asyncio.Future[None]:
        """The group committer's wait: the fsync round ends in a later loop pass; once the
        log directory is offline it fails at once (GroupCommitter does the same)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self.log_dir.offline:
            fut.set_exception(self.log_dir.error())
            return fut

        def round_done() -> None:
            if self.cancel_sync:
                fut.cancel()
                return
            try:
                handle.log.sync()
            except OSError as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(None)

        loop.call_soon(round_done)
        return fut

    def restart(self) -> OffsetStore:
        """What the next broker start loads from the files (after closing without writing)."""
        self.store.abandon()
        return OffsetStore.open(self.tmp_path, None, self.clock)

    def full(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The offsets log's next write() fails with ENOSPC (under the failure channel)."""
        plog = self.store._log
        assert plog is not None

        def full(*_a: Any, **_k: Any) -> Any:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(plog, "_append", full)

    async def commit(self, offsets: dict[TopicPartition, int], group: str = "g") -> dict[TopicPartition, int]:
        errors, fut = self.c.commit_offsets(group, -1, "", None, {tp: OffsetAndMetadata(o) for tp, o in offsets.items()})
        return await await_stored(fut, errors)

    def visible(self, group: str = "g") -> dict[TopicPartition, int]:
        return {tp: om.offset for tp, om in self.store.group_offsets(group).items()}

    async def stable_pair(self) -> tuple[str, str, int]:
        """Two members joined, generation done, nobody synced yet: (leader, follower, generation)."""
        c = self.c
        ids = []
        for _ in range(2):
            first = await c.join_group("g", "", None, SESSION, REBALANCE, "consumer", RANGE, "cl", "/h", True, True)
            ids.append(first["member_id"])
        a = c.join_group("g", ids[0], None, SESSION, REBALANCE, "consumer", RANGE, "cl", "/h", True, True)
        b = c.join_group("g", ids[1], None, SESSION, REBALANCE, "consumer", RANGE, "cl", "/h", True, True)
        ra, rb = await a, await b
        assert ra["error_code"] == rb["error_code"] == 0
        leader = ra["leader"]
        follower = ids[1] if leader == ids[0] else ids[0]
        return leader, follower, ra["generation_id"]


def test_offset_commit_whose_fsync_fails_is_never_served(tmp_path: Path) -> None:
    """The commit whose fdatasync failed answers NOT_COORDINATOR and is never served by
    OffsetFetch: the log directory is offline, so the retry (the disk "works" again: a
    later fdatasync would return 0) is not written and reports nothing durable, and
    OffsetFetch answers NOT_COORDINATOR. (Before: the retry's successful fsync was taken to
    cover the failed batch, and OffsetFetch served TP1=3, which a crash could take back.)
    After a restart the store holds what the file holds, as Kafka reads its logs back."""

    async def main() -> None:
        env = Env(tmp_path)
        assert await env.commit({TP0: 5}) == {TP0: 0}
        env.fail_sync = True
        assert await env.commit({TP0: 7, TP1: 3}) == {TP0: E.not_coordinator, TP1: E.not_coordinator}
        assert env.log_dir.offline
        assert env.visible() == {TP0: 5}  # not durable: not visible
        env.fail_sync = False
        assert await env.commit({TP0: 8}) == {TP0: E.not_coordinator}
        assert await env.commit({TP1: 4}, group="other") == {TP1: E.not_coordinator}
        assert env.visible() == {TP0: 5} and env.visible("other") == {}
        assert env.c.fetch_offsets("g", [TP0, TP1]) == (E.not_coordinator, [])
        ctx = SimpleNamespace(version=8, broker=SimpleNamespace(groups=env.c))
        req = SimpleNamespace(groups=[SimpleNamespace(group_id="g", topics=None)], require_stable=False)
        assert (await offset_fetch.handle(ctx, req))["groups"] == [
            {"group_id": "g", "topics": [], "error_code": E.not_coordinator}]
        # the failed batch did reach the file (only its fsync "failed"), the retries did not
        again = env.restart()
        assert {tp: om.offset for tp, om in again.group_offsets("g").items()} == {TP0: 7, TP1: 3}
        again.close()

    asyncio.run(main())


def test_txn_offset_commit_whose_fsync_fails_answers_not_coordinator(tmp_path: Path) -> None:
    async def main() -> None:
        env = Env(tmp_path)
        env.fail_sync = True
        errors, fut = env.c.txn_commit_offsets("g", 1000, 0, -1, "", None, {TP0: OffsetAndMetadata(4)})
        assert await await_stored(fut, errors) == {TP0: E.not_coordinator}
        assert not env.c.has_pending_txn_offsets("g", TP0)
        env.store.close()

    asyncio.run(main())


def test_offsets_log_append_error_answers_not_coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write() error of the offsets log (ENOSPC) fails the commit the same way, without an
    exception escaping into the request (which closed the client's connection)."""

    async def main() -> None:
        env = Env(tmp_path)
        plog = env.store._log
        assert plog is not None
        end = plog.log_end_offset
        env.full(monkeypatch)
        assert await env.commit({TP0: 7}) == {TP0: E.not_coordinator}
        monkeypatch.undo()
        assert plog.log_end_offset == end and env.visible() == {}
        # ENOSPC took the log directory offline (as an IOException of Kafka's append does):
        # nothing more is appended, even once there is room again
        assert env.log_dir.offline
        assert await env.commit({TP0: 9}) == {TP0: E.not_coordinator}
        assert plog.log_end_offset == end and env.visible() == {}
        env.store.close()

    asyncio.run(main())


def test_sync_group_whose_assignment_write_fails_answers_not_coordinator(tmp_path: Path) -> None:
    """Every member waiting in SyncGroup gets NOT_COORDINATOR and the group rebalances
    (Kafka: resetAndPropagateAssignmentWithError, then maybePrepareRebalance)."""

    async def main() -> None:
        env = Env(tmp_path)
        leader, follower, gen = await env.stable_pair()
        f = env.c.sync_group("g", gen, follower, None, None, None, {})
        env.fail_sync = True
        lf = env.c.sync_group("g", gen, leader, None, None, None, {leader: b"a", follower: b"b"})
        assert (await lf)["error_code"] == E.not_coordinator
        assert (await f)["error_code"] == E.not_coordinator
        assert env.c.groups["g"].state == GroupState.PREPARING_REBALANCE
        env.store.close()

    asyncio.run(main())


def test_delete_groups_and_offset_delete_whose_write_fails_answer_not_coordinator(tmp_path: Path) -> None:
    async def main() -> None:
        env = Env(tmp_path)
        assert await env.commit({TP0: 5}, group="a") == {TP0: 0}
        assert await env.commit({TP0: 5}, group="b") == {TP0: 0}
        env.fail_sync = True
        broker = SimpleNamespace(groups=env.c, topics={"t": SimpleNamespace(partitions=[0, 1])})
        req = SimpleNamespace(group_id="a", topics=[SimpleNamespace(name="t", partitions=[SimpleNamespace(partition_index=0)])])
        resp = await offset_delete.handle(SimpleNamespace(broker=broker), req)
        assert resp["error_code"] == E.not_coordinator
        resp = await delete_groups.handle(SimpleNamespace(broker=broker), SimpleNamespace(groups_names=["b", "nope"]))
        assert [(r["group_id"], r["error_code"]) for r in resp["results"]] == [
            ("b", E.not_coordinator), ("nope", E.group_id_not_found)]
        env.store.close()

    asyncio.run(main())


def test_static_member_rejoin_whose_write_fails_answers_not_coordinator(tmp_path: Path) -> None:
    """A static member that rejoins a Stable group under a new member id has the new id
    persisted before its answer; if that write fails it gets NOT_COORDINATOR and the old
    member id stays (Kafka's updateStaticMemberAndRebalance reverts it)."""

    async def main() -> None:
        env = Env(tmp_path)
        c = env.c
        first = await c.join_group("g", "", "inst", SESSION, REBALANCE, "consumer", RANGE, "cl", "/h", True, True)
        old_id, gen = first["member_id"], first["generation_id"]
        assert first["error_code"] == 0
        assert (await c.sync_group("g", gen, old_id, "inst", None, None, {old_id: b"a"}))["error_code"] == 0
        env.fail_sync = True
        again = await c.join_group("g", "", "inst", SESSION, REBALANCE, "consumer", RANGE, "cl", "/h", True, True)
        assert again["error_code"] == E.not_coordinator
        assert c.groups["g"].static_member_id("inst") == old_id
        env.store.close()

    asyncio.run(main())


def test_delete_groups_whose_write_fails_keeps_the_group_for_the_retry(tmp_path: Path) -> None:
    """Kafka reverts the in-memory state of a failed write: the group answered NOT_COORDINATOR
    is still there, so the client's retry deletes it (not GROUP_ID_NOT_FOUND while its
    offsets are still served)."""

    async def main() -> None:
        env = Env(tmp_path)
        assert await env.commit({TP0: 5}, group="b") == {TP0: 0}
        ctx = SimpleNamespace(broker=SimpleNamespace(groups=env.c))
        env.fail_sync = True
        resp = await delete_groups.handle(ctx, SimpleNamespace(groups_names=["b"]))
        assert [(r["group_id"], r["error_code"]) for r in resp["results"]] == [("b", E.not_coordinator)]
        assert "b" in env.c.groups and env.c.groups["b"].state == GroupState.EMPTY
        # the retry fails too (the log directory is offline), and the group is still kept
        env.fail_sync = False
        resp = await delete_groups.handle(ctx, SimpleNamespace(groups_names=["b"]))
        assert [(r["group_id"], r["error_code"]) for r in resp["results"]] == [("b", E.not_coordinator)]
        assert "b" in env.c.groups and env.c.groups["b"].state == GroupState.EMPTY
        assert env.visible("b") == {TP0: 5}
        env.store.close()

    asyncio.run(main())


def test_delete_groups_whose_append_fails_keeps_the_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        env = Env(tmp_path)
        assert await env.commit({TP0: 5}, group="b") == {TP0: 0}
        ctx = SimpleNamespace(broker=SimpleNamespace(groups=env.c))
        env.full(monkeypatch)
        resp = await delete_groups.handle(ctx, SimpleNamespace(groups_names=["b"]))
        monkeypatch.undo()
        assert [(r["group_id"], r["error_code"]) for r in resp["results"]] == [("b", E.not_coordinator)]
        assert env.c.groups["b"].state == GroupState.EMPTY and env.visible("b") == {TP0: 5}
        # the log directory is offline: the retry is refused the same way, the group stays
        resp = await delete_groups.handle(ctx, SimpleNamespace(groups_names=["b"]))
        assert [(r["group_id"], r["error_code"]) for r in resp["results"]] == [("b", E.not_coordinator)]
        assert env.c.groups["b"].state == GroupState.EMPTY and env.visible("b") == {TP0: 5}
        env.store.close()

    asyncio.run(main())


@pytest.mark.parametrize("trigger", ["topic_deleted", "expiry"])
def test_background_deletion_whose_append_fails_is_quiet_and_keeps_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, trigger: str
) -> None:
    """Offsets deleted in the background (topic deletion, expiry) with a failing append: one
    clear log line, no "Future exception was never retrieved" traceback, and the group is
    still there as long as its offsets are."""
    import gc

    async def main() -> None:
        env = Env(tmp_path)
        assert await env.commit({TP0: 5}, group="a") == {TP0: 0}
        assert "a" in env.c.groups
        env.full(monkeypatch)
        if trigger == "topic_deleted":
            env.c.on_topic_deleted("t")
        else:
            env.clock.now += 8 * 24 * 3600 * 1000  # past offsets.retention.minutes (7 days)
            env.c.expire_offsets()
        monkeypatch.undo()
        await asyncio.sleep(0)
        assert env.visible("a") == {TP0: 5}
        assert "a" in env.c.groups and env.c.groups["a"].state == GroupState.EMPTY
        env.store.close()

    with caplog.at_level("WARNING"):
        asyncio.run(main())
        gc.collect()
    texts = [r.getMessage() for r in caplog.records]
    assert not [t for t in texts if "never retrieved" in t], texts
    assert any("No space left on device" in t for t in texts)


def test_writes_cancelled_at_shutdown_answer_coordinator_not_available(tmp_path: Path) -> None:
    """A write whose durability future is cancelled (shutdown) answers COORDINATOR_NOT_AVAILABLE in
    OffsetCommit, TxnOffsetCommit, OffsetDelete and DeleteGroups, as documented (the request task
    ended cancelled and the request got no answer)."""

    async def main() -> None:
        env = Env(tmp_path)
        assert await env.commit({TP0: 5}, group="a") == {TP0: 0}
        assert await env.commit({TP0: 5}, group="b") == {TP0: 0}
        env.cancel_sync = True
        assert await env.commit({TP0: 6}, group="a") == {TP0: E.coordinator_not_available}
        errors, fut = env.c.txn_commit_offsets("g", 1000, 0, -1, "", None, {TP0: OffsetAndMetadata(4)})
        assert await await_stored(fut, errors) == {TP0: E.coordinator_not_available}
        broker = SimpleNamespace(groups=env.c, topics={"t": SimpleNamespace(partitions=[0, 1])})
        req = SimpleNamespace(group_id="a", topics=[SimpleNamespace(name="t", partitions=[SimpleNamespace(partition_index=0)])])
        resp = await offset_delete.handle(SimpleNamespace(broker=broker), req)
        assert resp["error_code"] == E.coordinator_not_available
        resp = await delete_groups.handle(SimpleNamespace(broker=broker), SimpleNamespace(groups_names=["b"]))
        assert [(r["group_id"], r["error_code"]) for r in resp["results"]] == [("b", E.coordinator_not_available)]
        assert "b" in env.c.groups  # the deletion was not written: the group stays
        env.store.close()

    asyncio.run(main())
