"""The classic group coordinator as a state machine: fake clock, no sleeps, no sockets."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from oncelog.broker.group import GroupConfig, GroupCoordinator, GroupState, OffsetAndMetadata, OffsetStore, TopicPartition
from oncelog.protocol.errors import ErrorCode as E

SESSION = 10_000
REBALANCE = 30_000


class FakeFuture:
    """Just enough of asyncio.Future for the coordinator, without an event loop."""

    def __init__(self) -> None:
        self._done = False
        self._result: Any = None
        self._callbacks: list[Any] = []

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def exception(self) -> BaseException | None:
        return None

    def set_result(self, value: Any) -> None:
        assert not self._done, "future resolved twice"
        self._done, self._result = True, value
        for cb in self._callbacks:
            cb(self)

    def result(self) -> Any:
        assert self._done, "future not resolved"
        return self._result

    def add_done_callback(self, cb: Any) -> None:
        if self._done:
            cb(self)
        else:
            self._callbacks.append(cb)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


RANGE = [("range", subscription("t"))]


class Harness:
    def __init__(self, delay: int = 0, **cfg: Any) -> None:
        self.clock = Clock()
        self.store = OffsetStore(clock=self.clock)
        self.c = GroupCoordinator(
            self.store, self.clock, GroupConfig(initial_rebalance_delay_ms=delay, **cfg), new_future=FakeFuture
        )

    def join(
        self,
        member_id: str = "",
        group: str = "g",
        instance: str | None = None,
        protocols: list[tuple[str, bytes]] = RANGE,
        ptype: str = "consumer",
        session: int = SESSION,
        rebalance: int = REBALANCE,
        v4: bool = True,
        skip: bool = True,
    ) -> FakeFuture:
        return self.c.join_group(group, member_id, instance, session, rebalance, ptype, protocols, "client", "/127.0.0.1", v4, skip)

    def new_member(self, group: str = "g", **kw: Any) -> tuple[str, FakeFuture]:
        """The two-step v4+ join: MEMBER_ID_REQUIRED, then the real join."""
        first = self.join(group=group, **kw).result()
        assert first["error_code"] == E.member_id_required
        mid = first["member_id"]
        assert mid.startswith("client-")
        return mid, self.join(mid, group=group, **kw)

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None, group: str = "g",
             instance: str | None = None) -> FakeFuture:
        return self.c.sync_group(group, generation, member_id, instance, "consumer", "range", assignments or {})

    def hb(self, member_id: str, generation: int, group: str = "g", instance: str | None = None) -> int:
        return self.c.heartbeat(group, generation, member_id, instance)

    def state(self, group: str = "g") -> GroupState:
        g = self.c.groups.get(group)
        return GroupState.DEAD if g is None else g.state

    def stable_group(self, n: int, group: str = "g", instance_prefix: str | None = None) -> tuple[list[str], int]:
        """n members, one generation, synced (the first member leads)."""
        ids: list[str] = []
        futs: list[FakeFuture] = []
        for i in range(n):
            if instance_prefix is not None:
                fut = self.join(group=group, instance=f"{instance_prefix}{i}")
                ids.append("")
            else:
                mid, fut = self.new_member(group)
                ids.append(mid)
            futs.append(fut)
            # everyone who already has a generation rejoins (the rebalance the new member caused)
            for j in range(i):
                if futs[j].done():
                    futs[j] = self.join(ids[j], group=group,
                                        instance=None if instance_prefix is None else f"{instance_prefix}{j}")
        results = [f.result() for f in futs]
        ids = [r["member_id"] for r in results]
        gen = results[0]["generation_id"]
        assert all(r["generation_id"] == gen and r["error_code"] == 0 for r in results), results
        leader = results[0]["leader"]
        syncs = [self.sync(m, gen, {x: x.encode() for x in ids} if m == leader else None, group=group,
                           instance=None if instance_prefix is None else f"{instance_prefix}{k}")
                 for k, m in enumerate(ids)]
        for m, s in zip(ids, syncs):
            assert s.result() == {"error_code": 0, "protocol_type": "consumer", "protocol_name": "range",
                                  "assignment": m.encode()}
        assert self.state(group) == GroupState.STABLE
        return ids, gen


# -- join / sync / heartbeat --------------------------------------------------------


def test_single_member_join_sync_heartbeat() -> None:
    h = Harness()
    mid, fut = h.new_member()
    r = fut.result()
    assert r["error_code"] == 0 and r["generation_id"] == 1
    assert r["leader"] == mid and r["member_id"] == mid
    assert r["protocol_type"] == "consumer" and r["protocol_name"] == "range"
    assert r["members"] == [{"member_id": mid, "group_instance_id": None, "metadata": RANGE[0][1]}]
    assert h.state() == GroupState.COMPLETING_REBALANCE
    assert h.hb(mid, 1) == 0  # heartbeats are fine while completing
    s = h.sync(mid, 1, {mid: b"A"}).result()
    assert s == {"error_code": 0, "protocol_type": "consumer", "protocol_name": "range", "assignment": b"A"}
    assert h.state() == GroupState.STABLE
    assert h.hb(mid, 1) == 0
    # a SyncGroup in Stable returns the current assignment
    assert h.sync(mid, 1).result()["assignment"] == b"A"


def test_join_below_v4_needs_no_member_id_round() -> None:
    h = Harness()
    r = h.join(v4=False).result()
    assert r["error_code"] == 0 and r["generation_id"] == 1 and r["member_id"].startswith("client-")


def test_pending_member_id_expires_after_session_timeout() -> None:
    h = Harness()
    first = h.join().result()
    assert first["error_code"] == E.member_id_required
    h.clock.advance(SESSION)
    h.c.tick()
    r = h.join(first["member_id"]).result()
    assert r["error_code"] == E.unknown_member_id


def test_new_member_triggers_rebalance_and_leader_gets_metadata() -> None:
    h = Harness()
    (a,), gen = h.stable_group(1)
    b, fut_b = h.new_member(protocols=[("range", subscription("t", "u"))])
    assert not fut_b.done()
    assert h.state() == GroupState.PREPARING_REBALANCE
    assert h.hb(a, gen) == E.rebalance_in_progress
    # the old generation cannot commit its assignment any more once the rebalance completes
    fut_a = h.join(a)
    ra, rb = fut_a.result(), fut_b.result()
    assert ra["generation_id"] == rb["generation_id"] == gen + 1
    assert ra["leader"] == rb["leader"] == a
    assert {m["member_id"]: m["metadata"] for m in ra["members"]} == {
        a: subscription("t"), b: subscription("t", "u")}
    assert rb["members"] == []
    # a follower's SyncGroup waits for the leader's
    sb = h.sync(b, gen + 1)
    assert not sb.done()
    sa = h.sync(a, gen + 1, {a: b"pa", b: b"pb"})
    assert sa.result()["assignment"] == b"pa" and sb.result()["assignment"] == b"pb"
    assert h.state() == GroupState.STABLE
    assert h.hb(a, gen) == E.illegal_generation


def test_leave_triggers_rebalance() -> None:
    h = Harness()
    (a, b, c), gen = h.stable_group(3)
    assert h.c.leave_group("g", [(b, None)]) == (0, [0])
    assert h.state() == GroupState.PREPARING_REBALANCE
    assert h.hb(b, gen) == E.unknown_member_id
    fa, fc = h.join(a), h.join(c)
    assert fa.result()["generation_id"] == fc.result()["generation_id"] == gen + 1
    assert {m["member_id"] for m in fa.result()["members"]} == {a, c}
    # the last members leaving make the group Empty (a new generation)
    h.sync(a, gen + 1, {a: b"", c: b""})
    assert h.c.leave_group("g", [(a, None), (c, None), ("nobody", None)]) == (0, [0, 0, E.unknown_member_id])
    assert h.state() == GroupState.EMPTY
    assert h.c.groups["g"].generation_id == gen + 2
    assert h.c.leave_group("missing", [(a, None)]) == (0, [E.unknown_member_id])


def test_session_timeout_expires_silent_member() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2)
    for _ in range(3):
        h.clock.advance(SESSION // 3)
        assert h.hb(a, gen) == 0
        h.c.tick()
    h.clock.advance(SESSION // 3)
    # b never heartbeated: its session is over, and a's next heartbeat sees it (no tick needed)
    assert h.hb(a, gen) == E.rebalance_in_progress
    assert h.state() == GroupState.PREPARING_REBALANCE
    assert not h.c.groups["g"].has(b)
    assert h.hb(b, gen) == E.unknown_member_id
    r = h.join(a).result()
    assert r["generation_id"] == gen + 1 and [m["member_id"] for m in r["members"]] == [a]


def test_member_that_does_not_rejoin_is_dropped_at_rebalance_timeout() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2)
    c, fut_c = h.new_member()
    fut_a = h.join(a)
    # b keeps heartbeating (so its session lives) but never rejoins
    for _ in range(REBALANCE // 5000 - 1):
        h.clock.advance(5000)
        assert h.hb(b, gen) == E.rebalance_in_progress
        h.c.tick()
    assert not fut_a.done()
    h.clock.advance(5000)  # the rebalance timeout is over: b's next request finds itself dropped
    assert h.hb(b, gen) == E.unknown_member_id
    assert fut_a.done() and fut_c.done()
    assert {m["member_id"] for m in fut_a.result()["members"]} == {a, c}


def test_leader_that_never_syncs_is_removed_after_rebalance_timeout() -> None:
    h = Harness()
    a, fa = h.new_member()
    b, fb = h.new_member()
    fa2 = h.join(a)
    gen = fa2.result()["generation_id"]
    assert fb.result()["generation_id"] == gen
    sb = h.sync(b, gen)
    assert not sb.done()
    h.clock.advance(REBALANCE)
    h.c.tick()
    assert sb.result()["error_code"] == E.rebalance_in_progress
    assert not h.c.groups["g"].has(a)
    assert h.state() == GroupState.PREPARING_REBALANCE


def test_completing_rebalance_rejoin_with_same_metadata_gets_same_answer() -> None:
    h = Harness()
    a, fa = h.new_member()
    first = fa.result()
    again = h.join(a).result()
    assert again == first


def test_initial_rebalance_delay_waits_for_more_members() -> None:
    h = Harness(delay=3000)
    a, fa = h.new_member()
    assert not fa.done() and h.state() == GroupState.PREPARING_REBALANCE
    h.clock.advance(1000)
    h.c.tick()
    b, fb = h.new_member()
    h.clock.advance(2000)  # the first delay ends; b joined meanwhile: wait another delay
    h.c.tick()
    assert not fa.done()
    h.clock.advance(3000)
    h.c.tick()
    ra, rb = fa.result(), fb.result()
    assert ra["generation_id"] == rb["generation_id"] == 1
    assert len(ra["members"]) == 2


def test_rebalance_timeout_bounds_the_initial_delay() -> None:
    h = Harness(delay=3000)
    futs = []
    for _ in range(12):
        futs.append(h.new_member(rebalance=7000)[1])
        h.clock.advance(1000)
        h.c.tick()
    # each delay saw a new member, but 7000 ms of rebalance timeout allow only ~3 delays
    assert all(f.done() for f in futs[:7])


# -- static membership ---------------------------------------------------------------


def test_static_member_restart_causes_no_rebalance() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2, instance_prefix="inst-")
    assert a.startswith("inst-0-") and b.startswith("inst-1-")
    # the leader restarts (no LeaveGroup) and rejoins with its instance id
    r = h.join(instance="inst-0").result()
    assert r["error_code"] == 0
    new_a = r["member_id"]
    assert new_a != a and new_a.startswith("inst-0-")
    assert r["generation_id"] == gen
    assert h.state() == GroupState.STABLE
    # JoinGroup v9+: it learns it leads, but skips the assignment
    assert r["leader"] == new_a and r["skip_assignment"] is True
    assert {m["member_id"] for m in r["members"]} == {new_a, b}
    assert h.sync(new_a, gen, instance="inst-0").result()["assignment"] == a.encode()
    assert h.hb(b, gen, instance="inst-1") == 0
    # the old incarnation is fenced
    assert h.hb(a, gen, instance="inst-0") == E.fenced_instance_id
    assert h.sync(a, gen, instance="inst-0").result()["error_code"] == E.fenced_instance_id
    errors, _ = h.c.commit_offsets("g", gen, a, "inst-0", {TopicPartition("t", 0): OffsetAndMetadata(1)})
    assert errors == {TopicPartition("t", 0): E.fenced_instance_id}


def test_static_follower_restart_below_v9_keeps_old_leader_id() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2, instance_prefix="inst-")
    r = h.join(instance="inst-1", skip=False).result()
    assert r["generation_id"] == gen and r["leader"] == a and r["members"] == [] and not r["skip_assignment"]
    assert h.state() == GroupState.STABLE
    # restarting the leader below v9: the old leader id comes back, so it will not assign
    r = h.join(instance="inst-0", skip=False).result()
    assert r["leader"] == a and r["member_id"] != a and r["members"] == []


def test_static_member_with_wrong_member_id_is_fenced() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2, instance_prefix="inst-")
    r = h.join(b, instance="inst-0").result()
    assert r["error_code"] == E.fenced_instance_id
    r = h.join("made-up", instance="inst-9").result()
    assert r["error_code"] == E.unknown_member_id
    assert h.c.leave_group("g", [(b, "inst-0")]) == (0, [E.fenced_instance_id])
    # administrative removal by instance id alone
    assert h.c.leave_group("g", [("", "inst-1"), ("", "inst-7")]) == (0, [0, E.unknown_member_id])
    assert not h.c.groups["g"].has(b)


def test_static_member_expires_after_session_timeout() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2, instance_prefix="inst-")
    h.clock.advance(SESSION // 2)
    assert h.hb(a, gen, instance="inst-0") == 0
    h.clock.advance(SESSION // 2)
    h.c.tick()
    assert not h.c.groups["g"].has(b)
    assert "inst-1" not in h.c.groups["g"].static_members
    assert h.state() == GroupState.PREPARING_REBALANCE


def test_static_member_rejoin_during_rebalance_waits_for_the_generation() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2, instance_prefix="inst-")
    h.join(a, instance="inst-0", protocols=[("range", subscription("t", "v"))])  # metadata change: rebalance
    assert h.state() == GroupState.PREPARING_REBALANCE
    fb = h.join(instance="inst-1")  # b restarted meanwhile
    new_b = fb.result()["member_id"] if fb.done() else None
    assert new_b is not None and fb.result()["generation_id"] == gen + 1


# -- protocols ---------------------------------------------------------------------


def test_no_common_protocol_is_inconsistent() -> None:
    h = Harness()
    (a,), _ = h.stable_group(1)
    r = h.join(protocols=[("roundrobin", b"x")]).result()
    assert r["error_code"] == E.inconsistent_group_protocol
    r = h.join(ptype="connect").result()
    assert r["error_code"] == E.inconsistent_group_protocol
    # an empty group needs a protocol type and at least one protocol
    r = h.join(group="fresh", protocols=[]).result()
    assert r["error_code"] == E.inconsistent_group_protocol
    r = h.join(group="fresh2", ptype="").result()
    assert r["error_code"] == E.inconsistent_group_protocol
    assert "fresh" not in h.c.groups and "fresh2" not in h.c.groups


def test_protocol_selection_common_and_most_preferred() -> None:
    h = Harness()
    ma, fa = h.new_member(protocols=[("roundrobin", b"1"), ("range", b"2")])
    fa.result()
    mb, fb = h.new_member(protocols=[("range", b"3"), ("roundrobin", b"4")])
    mc, fc = h.new_member(protocols=[("range", b"5"), ("sticky", b"6")])
    fa = h.join(ma, protocols=[("roundrobin", b"1"), ("range", b"2")])
    fb = h.join(mb, protocols=[("range", b"3"), ("roundrobin", b"4")])
    r = fa.result()
    assert r["protocol_name"] == "range"  # the only one all three support
    assert {m["member_id"]: m["metadata"] for m in r["members"]} == {ma: b"2", mb: b"3", mc: b"5"}
    # two of three prefer cooperative-sticky: it wins
    h2 = Harness()
    x, fx = h2.new_member(group="h", protocols=[("range", b""), ("cooperative-sticky", b"")])
    y, fy = h2.new_member(group="h", protocols=[("cooperative-sticky", b""), ("range", b"")])
    z, fz = h2.new_member(group="h", protocols=[("cooperative-sticky", b""), ("range", b"")])
    fx = h2.join(x, group="h", protocols=[("range", b""), ("cooperative-sticky", b"")])
    fy = h2.join(y, group="h", protocols=[("cooperative-sticky", b""), ("range", b"")])
    assert fx.result()["protocol_name"] == fy.result()["protocol_name"] == fz.result()["protocol_name"] == "cooperative-sticky"


# -- bad input ---------------------------------------------------------------------


def test_bad_join_parameters() -> None:
    h = Harness(min_session_timeout_ms=6000, max_session_timeout_ms=300000)
    assert h.join(session=5999).result()["error_code"] == E.invalid_session_timeout
    assert h.join(session=300001).result()["error_code"] == E.invalid_session_timeout
    assert h.join(group="").result()["error_code"] == E.invalid_group_id
    assert h.join("someone", group="nope").result()["error_code"] == E.unknown_member_id
    assert h.c.heartbeat("nope", 1, "x", None) == E.unknown_member_id
    assert h.c.sync_group("nope", 1, "x", None, None, None, {}).result()["error_code"] == E.unknown_member_id
    assert h.c.heartbeat("", 1, "x", None) == E.invalid_group_id
    assert h.c.groups == {}


def test_wrong_generation_and_member_everywhere() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2)
    assert h.hb(a, gen + 1) == E.illegal_generation
    assert h.hb("ghost", gen) == E.unknown_member_id
    assert h.sync(a, gen - 1).result()["error_code"] == E.illegal_generation
    s = h.c.sync_group("g", gen, a, None, "consumer", "roundrobin", {}).result()
    assert s["error_code"] == E.inconsistent_group_protocol
    assert h.join("ghost").result()["error_code"] == E.unknown_member_id


def test_max_group_size() -> None:
    h = Harness(max_size=2)
    (a, b), gen = h.stable_group(2)
    mid = h.join().result()["member_id"]
    r = h.join(mid).result()
    assert r["error_code"] == E.group_max_size_reached and r["member_id"] == ""
    assert h.state() == GroupState.STABLE


def test_one_stuck_group_does_not_block_another() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2, group="stuck")
    h.new_member(group="stuck")  # b never rejoins: "stuck" waits up to its rebalance timeout
    assert h.state("stuck") == GroupState.PREPARING_REBALANCE
    (x, y), gen2 = h.stable_group(2, group="free")
    assert h.state("free") == GroupState.STABLE


# -- offsets -----------------------------------------------------------------------

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def test_commit_and_fetch_by_generation() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2)
    errors, fut = h.c.commit_offsets("g", gen, a, None, {TP0: OffsetAndMetadata(10, 3, "m"), TP1: OffsetAndMetadata(20)})
    assert errors == {TP0: 0, TP1: 0} and fut is None
    assert h.c.fetch_offsets("g", [TP0, TP1, TopicPartition("u", 0)]) == (
        0, [(TP0, 10, 3, "m"), (TP1, 20, -1, ""), (TopicPartition("u", 0), -1, -1, "")])
    assert h.c.fetch_offsets("g", None)[1] == [(TP0, 10, 3, "m"), (TP1, 20, -1, "")]
    # stale generation, unknown member
    assert h.c.commit_offsets("g", gen - 1, a, None, {TP0: OffsetAndMetadata(11)})[0] == {TP0: E.illegal_generation}
    assert h.c.commit_offsets("g", gen, "ghost", None, {TP0: OffsetAndMetadata(11)})[0] == {TP0: E.unknown_member_id}
    # no member id and no generation while the group has members
    assert h.c.commit_offsets("g", -1, "", None, {TP0: OffsetAndMetadata(11)})[0] == {TP0: E.unknown_member_id}
    # during CompletingRebalance
    c, fc = h.new_member()
    fa, fb = h.join(a), h.join(b)
    gen2 = fa.result()["generation_id"]
    assert h.c.commit_offsets("g", gen2, a, None, {TP0: OffsetAndMetadata(11)})[0] == {TP0: E.rebalance_in_progress}
    assert h.c.fetch_offsets("g", [TP0])[1] == [(TP0, 10, 3, "m")]


def test_commit_during_preparing_rebalance_is_accepted() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2)
    h.new_member()
    assert h.state() == GroupState.PREPARING_REBALANCE
    assert h.c.commit_offsets("g", gen, b, None, {TP0: OffsetAndMetadata(5)})[0] == {TP0: 0}


def test_simple_commits_without_group_management() -> None:
    h = Harness()
    assert h.c.commit_offsets("solo", 3, "", None, {TP0: OffsetAndMetadata(1)})[0] == {TP0: E.illegal_generation}
    assert "solo" not in h.c.groups
    assert h.c.commit_offsets("solo", -1, "", None, {TP0: OffsetAndMetadata(7)})[0] == {TP0: 0}
    assert h.c.fetch_offsets("solo", [TP0])[1] == [(TP0, 7, -1, "")]
    assert h.state("solo") == GroupState.EMPTY
    assert h.c.list_groups() == [{"group_id": "solo", "protocol_type": "", "group_state": "Empty", "group_type": "classic"}]


def test_fetch_of_unknown_group_is_minus_one_without_error() -> None:
    h = Harness()
    assert h.c.fetch_offsets("never", [TP0, TP1]) == (0, [(TP0, -1, -1, ""), (TP1, -1, -1, "")])
    assert h.c.fetch_offsets("never", None) == (0, [])
    assert "never" not in h.c.groups


def test_oversized_metadata_is_rejected_per_partition() -> None:
    h = Harness(offset_metadata_max_bytes=10)
    errors, _ = h.c.commit_offsets(
        "g", -1, "", None, {TP0: OffsetAndMetadata(1, -1, "x" * 11), TP1: OffsetAndMetadata(2, -1, "x" * 10)})
    assert errors == {TP0: E.offset_metadata_too_large, TP1: 0}
    assert h.c.fetch_offsets("g", [TP0, TP1])[1] == [(TP0, -1, -1, ""), (TP1, 2, -1, "x" * 10)]


def test_offsets_of_empty_group_expire_after_retention() -> None:
    h = Harness(offsets_retention_ms=60_000)
    (a,), gen = h.stable_group(1)
    h.c.commit_offsets("g", gen, a, None, {TP0: OffsetAndMetadata(1)})
    h.clock.advance(120_000)
    h.hb(a, gen)
    assert h.c.expire_offsets() == 0  # the group has a member: offsets stay
    h.c.leave_group("g", [(a, None)])
    assert h.state() == GroupState.EMPTY
    h.clock.advance(59_999)
    assert h.c.expire_offsets() == 0
    h.clock.advance(1)
    assert h.c.expire_offsets() == 1
    assert "g" not in h.c.groups and h.c.fetch_offsets("g", [TP0])[1] == [(TP0, -1, -1, "")]
    # simple groups expire by commit time; an explicit retention (OffsetCommit v2-v4) wins
    h.c.commit_offsets("s", -1, "", None, {TP0: OffsetAndMetadata(1), TP1: OffsetAndMetadata(2, expire_timestamp=h.clock() + 1000)})
    h.clock.advance(1000)
    assert h.c.expire_offsets() == 1
    assert h.c.fetch_offsets("s", None)[1] == [(TP0, 1, -1, "")]
    h.clock.advance(60_000)
    assert h.c.expire_offsets() == 1 and "s" not in h.c.groups


def test_unsubscribed_topics_expire_in_stable_group() -> None:
    h = Harness(offsets_retention_ms=60_000)
    (a,), gen = h.stable_group(1)  # subscribed to "t"
    h.c.commit_offsets("g", gen, a, None, {TP0: OffsetAndMetadata(1), TopicPartition("old", 0): OffsetAndMetadata(2)})
    for _ in range(12):  # a stays alive, heartbeating within its session timeout
        h.clock.advance(5_000)
        assert h.hb(a, gen) == 0
    assert h.c.expire_offsets() == 1
    assert [tp for tp, *_ in h.c.fetch_offsets("g", None)[1]] == [TP0]


def test_delete_groups() -> None:
    h = Harness()
    (a,), gen = h.stable_group(1)
    h.c.commit_offsets("g", gen, a, None, {TP0: OffsetAndMetadata(1)})
    h.c.commit_offsets("e", -1, "", None, {TP0: OffsetAndMetadata(1)})
    errors, _ = h.c.delete_groups(["g", "e", "missing"])
    assert errors == {"g": E.non_empty_group, "e": 0, "missing": E.group_id_not_found}
    assert "e" not in h.c.groups and h.c.fetch_offsets("e", [TP0])[1] == [(TP0, -1, -1, "")]
    h.c.leave_group("g", [(a, None)])
    assert h.c.delete_groups(["g"])[0] == {"g": 0}
    assert h.c.describe_group("g") is None


@pytest.mark.parametrize("first", ["delete", "describe", "list", "offset_delete"])
def test_requests_see_expired_sessions_without_a_tick(first: str) -> None:
    """Broker correctness item 16: the server ticks every 100 ms, but a request that arrives
    1 ms after every member's session timeout must already see them gone: DeleteGroups
    succeeds (not NON_EMPTY_GROUP), DescribeGroups and ListGroups show an Empty group,
    OffsetDelete may delete a subscribed topic's offsets. No tick is called here."""
    h = Harness()
    (a, b), gen = h.stable_group(2)
    h.c.commit_offsets("g", gen, a, None, {TP0: OffsetAndMetadata(1)})
    h.clock.advance(1000)
    assert h.hb(a, gen) == 0  # a's session now ends 1 s after b's
    h.clock.advance(SESSION - 1000 - 1)
    assert h.c.delete_groups(["g"])[0] == {"g": E.non_empty_group}  # still inside b's session
    h.clock.advance(2)  # just past b's deadline, not a's
    d = h.c.describe_group("g")
    assert d is not None and [m["member_id"] for m in d["members"]] == [a]
    h.clock.advance(SESSION)  # now past a's too
    if first == "delete":
        assert h.c.delete_groups(["g"])[0] == {"g": 0}
        assert h.c.describe_group("g") is None
    elif first == "describe":
        d = h.c.describe_group("g")
        assert d is not None and d["group_state"] == "Empty" and d["members"] == []
    elif first == "list":
        assert [(g["group_id"], g["group_state"]) for g in h.c.list_groups()] == [("g", "Empty")]
    else:
        err, errors, _ = h.c.delete_offsets("g", [TP0])
        assert err == 0 and errors == {TP0: 0}


def test_offset_delete() -> None:
    h = Harness()
    (a,), gen = h.stable_group(1)  # subscribed to "t"
    other = TopicPartition("other", 0)
    h.c.commit_offsets("g", gen, a, None, {TP0: OffsetAndMetadata(1), other: OffsetAndMetadata(2)})
    err, errors, _ = h.c.delete_offsets("g", [TP0, other])
    assert err == 0 and errors == {TP0: E.group_subscribed_to_topic, other: 0}
    assert [tp for tp, *_ in h.c.fetch_offsets("g", None)[1]] == [TP0]
    assert h.c.delete_offsets("nope", [TP0])[0] == E.group_id_not_found
    h.c.leave_group("g", [(a, None)])
    err, errors, _ = h.c.delete_offsets("g", [TP0])
    assert err == 0 and errors == {TP0: 0} and h.c.fetch_offsets("g", None)[1] == []


def test_offsets_of_deleted_topics_are_removed() -> None:
    h = Harness()
    (a,), gen = h.stable_group(1)
    h.c.commit_offsets("g", gen, a, None, {TP0: OffsetAndMetadata(1), TopicPartition("u", 0): OffsetAndMetadata(2)})
    h.c.commit_offsets("only-t", -1, "", None, {TP0: OffsetAndMetadata(3), TP1: OffsetAndMetadata(4)})
    assert h.c.on_topic_deleted("t") == 3
    assert h.c.fetch_offsets("g", None)[1] == [(TopicPartition("u", 0), 2, -1, "")]
    assert "only-t" not in h.c.groups and h.state("g") == GroupState.STABLE


def test_describe_and_list() -> None:
    h = Harness()
    (a, b), gen = h.stable_group(2)
    d = h.c.describe_group("g")
    assert d is not None and d["group_state"] == "Stable" and d["protocol_type"] == "consumer"
    assert d["protocol_data"] == "range"
    assert {m["member_id"]: m["member_assignment"] for m in d["members"]} == {a: a.encode(), b: b.encode()}
    assert all(m["member_metadata"] == RANGE[0][1] and m["client_host"] == "/127.0.0.1" for m in d["members"])
    h.new_member()
    d = h.c.describe_group("g")
    assert d["group_state"] == "PreparingRebalance" and d["protocol_data"] == ""
    assert all(m["member_metadata"] == b"" for m in d["members"])
    assert [g["group_id"] for g in h.c.list_groups(states=["preparingrebalance"])] == ["g"]
    assert h.c.list_groups(states=["Stable"]) == []
    assert h.c.list_groups(types=["consumer"]) == []
    assert len(h.c.list_groups(types=["Classic"])) == 1


# -- persistence --------------------------------------------------------------------


def test_offsets_and_groups_survive_reopen_and_snapshot(tmp_path: Any) -> None:
    clock = Clock()
    store = OffsetStore.open(tmp_path, None, clock, snapshot_bytes=2000)
    c = GroupCoordinator(store, clock, GroupConfig(initial_rebalance_delay_ms=0), new_future=FakeFuture)
    first = c.join_group("g", "", None, SESSION, REBALANCE, "consumer", RANGE, "cl", "/h", True, True).result()
    mid = first["member_id"]
    r = c.join_group("g", mid, None, SESSION, REBALANCE, "consumer", RANGE, "cl", "/h", True, True).result()
    c.sync_group("g", r["generation_id"], mid, None, None, None, {mid: b"assigned"}).result()
    for i in range(60):
        c.commit_offsets("g", 1, mid, None, {TopicPartition("t", i % 3): OffsetAndMetadata(i, 0, f"m{i}")})
    c.commit_offsets("gone", -1, "", None, {TP0: OffsetAndMetadata(5)})
    assert c.delete_groups(["gone"])[0] == {"gone": 0}
    assert store.maybe_snapshot()
    plog = store._log
    assert plog is not None and plog.log_start_offset > 0
    c.commit_offsets("g", 1, mid, None, {TopicPartition("t", 0): OffsetAndMetadata(1000, 1, "after")})
    # crash: no clean close, no final snapshot
    reopened = OffsetStore.open(tmp_path, None, clock)
    c2 = GroupCoordinator(reopened, clock, GroupConfig(), new_future=FakeFuture)
    assert c2.fetch_offsets("g", None)[1] == [
        (TopicPartition("t", 0), 1000, 1, "after"), (TopicPartition("t", 1), 58, 0, "m58"), (TopicPartition("t", 2), 59, 0, "m59")]
    assert "gone" not in c2.groups and c2.fetch_offsets("gone", [TP0])[1] == [(TP0, -1, -1, "")]
    g = c2.groups["g"]
    assert g.state == GroupState.STABLE and g.generation_id == 1 and g.leader_id == mid
    assert c2.heartbeat("g", 1, mid, None) == 0
    assert c2.sync_group("g", 1, mid, None, None, None, {}).result()["assignment"] == b"assigned"
    # ... and its session still expires if the member is gone
    clock.advance(SESSION)
    c2.tick()
    assert c2.groups["g"].state in (GroupState.PREPARING_REBALANCE, GroupState.EMPTY)


def test_commit_becomes_visible_only_when_durable(tmp_path: Any) -> None:
    clock = Clock()
    waiting: list[FakeFuture] = []

    def durability(_partition: Any) -> FakeFuture:
        fut = FakeFuture()
        waiting.append(fut)
        return fut

    store = OffsetStore.open(tmp_path, durability, clock)
    fut = store.commit("g", {TP0: (5, -1, "")})
    assert fut is waiting[0] and store.get("g", TP0) is None
    store._log.sync()  # type: ignore[union-attr]
    fut.set_result(None)
    assert store.get("g", TP0) == OffsetAndMetadata(5, -1, "", clock())
