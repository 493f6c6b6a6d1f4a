"""Random request sequences against the coordinator (hypothesis).

Whatever members do, in any order, with any ids and generations: the
group's bookkeeping stays consistent, no response is given twice, and once
time passes every JoinGroup and SyncGroup has been answered (no request
hangs forever, whatever the other members do).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from oncelog.broker.group import GroupConfig, GroupCoordinator, GroupState, OffsetAndMetadata, OffsetStore, TopicPartition

from tests.unit.test_group_coordinator import RANGE, Clock, FakeFuture, subscription

MEMBERS = ["a", "b", "c"]
PROTOCOLS = [RANGE, [("roundrobin", subscription("t")), ("range", subscription("t"))], [("other", b"")]]

op = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(MEMBERS), st.integers(0, 2).map(lambda x: x == 0),
              st.sampled_from([0, 0, 0, 1, 2]), st.integers(0, 4).map(lambda x: x == 0)),
    st.tuples(st.just("sync"), st.sampled_from(MEMBERS), st.integers(-1, 6), st.integers(0, 2).map(lambda x: x == 0)),
    st.tuples(st.just("sync"), st.sampled_from(MEMBERS), st.just(0), st.just(False)),
    st.tuples(st.just("heartbeat"), st.sampled_from(MEMBERS), st.integers(-1, 4)),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("commit"), st.sampled_from(MEMBERS), st.integers(-1, 4)),
    st.tuples(st.just("tick"), st.sampled_from([0, 100, 3000, 7000, 40000])),
    st.tuples(st.just("rejoin_all"), st.just("")),
    st.tuples(st.just("sync_all"), st.just("")),
)


def check_invariants(c: GroupCoordinator) -> None:
    for g in c.groups.values():
        assert g.num_awaiting_join == sum(1 for m in g.members.values() if m.awaiting_join), g
        if g.members:
            assert g.leader_id in g.members, g
            assert g.protocol_type is not None
        else:
            assert g.leader_id is None
        counts: dict[str, int] = {}
        for m in g.members.values():
            for name, _ in m.protocols:
                counts[name] = counts.get(name, 0) + 1
        assert counts == g.supported_protocols, (counts, g.supported_protocols)
        for instance, mid in g.static_members.items():
            assert g.members[mid].group_instance_id == instance
        assert g.pending_sync <= set(g.members)
        if g.state == GroupState.STABLE:
            assert g.protocol_name is not None
        if g.state == GroupState.EMPTY:
            assert not g.members
        if g.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            assert g.protocol_name in g.candidate_protocols()


@settings(max_examples=int(__import__("os").environ.get("GROUP_PROPERTY_EXAMPLES", "400")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=80), delay=st.sampled_from([0, 3000]))
def test_random_member_behaviour(ops: list[tuple[Any, ...]], delay: int) -> None:
    clock = Clock()
    c = GroupCoordinator(OffsetStore(clock=clock), clock, GroupConfig(initial_rebalance_delay_ms=delay),
                         new_future=FakeFuture)
    ids: dict[str, str] = {}  # our name -> the member id the coordinator gave it
    gens: dict[str, int] = {}
    futures: list[FakeFuture] = []
    expanded: list[tuple[Any, ...]] = []
    for o in ops:  # composite steps make multi-member generations likely
        if o[0] == "rejoin_all":
            expanded += [("join", m, False, 0, False) for m in MEMBERS] * 2
        elif o[0] == "sync_all":
            expanded += [("sync", m, 0, False) for m in MEMBERS]
        else:
            expanded.append(o)
    for o in expanded:
        kind, who = o[0], o[1]
        if kind == "join":
            _, _, static, proto, fresh = o
            member_id = "" if fresh else ids.get(who, "")
            fut = c.join_group("g", member_id, f"inst-{who}" if static else None, 6000, 10000, "consumer",
                               PROTOCOLS[proto], who, "/h", True, True)
            futures.append(fut)

            def learn(f: FakeFuture, who: str = who) -> None:
                r = f.result()
                if r["member_id"]:
                    ids[who] = r["member_id"]
                if r["error_code"] == 0:
                    gens[who] = r["generation_id"]

            fut.add_done_callback(learn)
        elif kind == "sync":
            _, _, gen_delta, static = o
            gen = gens.get(who, 0) + (gen_delta if gen_delta < 0 else 0)
            assignments = {mid: b"x" for mid in ids.values()}
            futures.append(c.sync_group("g", gen, ids.get(who, ""), f"inst-{who}" if static else None,
                                        "consumer", None, assignments))
        elif kind == "heartbeat":
            c.heartbeat("g", gens.get(who, 0) + (o[2] if o[2] < 0 else 0), ids.get(who, ""), None)
        elif kind == "leave":
            c.leave_group("g", [(ids.get(who, ""), None)])
        elif kind == "commit":
            c.commit_offsets("g", o[2], ids.get(who, ""), None, {TopicPartition("t", 0): OffsetAndMetadata(1)})
        else:
            clock.advance(o[1])
            c.tick()
        check_invariants(c)
        g = c.groups.get("g")
        if g is not None:
            event(f"reached {g.state} with {len(g.members)} members")
    # with nobody doing anything more, every timeout fires: nothing stays unanswered
    for _ in range(6):
        clock.advance(60_000)
        c.tick()
        check_invariants(c)
    pending = [f for f in futures if not f.done()]
    assert not pending, [c.groups.get("g")]
    g = c.groups.get("g")
    assert g is None or g.state == GroupState.EMPTY
