"""Assignors and consumer-protocol encodings (oncelog.client.assignors), sans-IO.

Properties checked with hypothesis over random groups: every subscribed
partition assigned exactly once, Kafka's balance bounds, stickiness, and the
cooperative rule (a partition never goes from one owner straight to another;
moved partitions are held back one round and the group converges in two).
Encodings round-trip and match the bytes kafka-python's consumer protocol
classes produce and read.
"""

from __future__ import annotations

import struct
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.client.assignors import (
    ASSIGNORS,
    COOPERATIVE,
    EAGER,
    Assignment,
    MemberSubscription,
    ProtocolError,
    Subscription,
    cooperative_sticky_assign,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    range_assign,
    rebalance_protocol,
    roundrobin_assign,
    sticky_assign,
    sticky_generation,
)

TOPICS = ["a", "b", "c", "d"]


def members_of(subs: dict[str, list[str]], owned: dict[str, list[tuple[str, int]]] | None = None,
               generation: int = 1) -> list[MemberSubscription]:
    owned = owned or {}
    return [MemberSubscription(m, Subscription(sorted(t), owned_partitions=owned.get(m, []), generation_id=generation))
            for m, t in subs.items()]


def subscribed_partitions(ppt: dict[str, int], subs: dict[str, list[str]]) -> set[tuple[str, int]]:
    topics = set().union(*map(set, subs.values())) if subs else set()
    return {(t, p) for t in topics for p in range(ppt.get(t, 0))}


def check_exactly_once(result, ppt, subs):
    every = [tp for parts in result.values() for tp in parts]
    counts = Counter(every)
    assert all(c == 1 for c in counts.values()), f"assigned twice: {[tp for tp, c in counts.items() if c > 1]}"
    assert set(every) == subscribed_partitions(ppt, subs)
    for m, parts in result.items():
        assert all(t in subs[m] for t, _ in parts), f"{m} got a topic it did not subscribe to"


groups = st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.fixed_dictionaries({t: st.integers(0, 9) for t in TOPICS}),
    st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4).map(lambda s: "m-" + s),
                    st.lists(st.sampled_from(TOPICS), min_size=1, max_size=4, unique=True),
                    min_size=n, max_size=n),
))


@given(groups)
@settings(max_examples=200, deadline=None)
def test_range_assigns_each_partition_once_and_balances_per_topic(g):
    ppt, subs = g
    result = range_assign(ppt, members_of(subs))
    check_exactly_once(result, ppt, subs)
    for t in TOPICS:
        counts = [sum(1 for tt, _ in result[m] if tt == t) for m in subs if t in subs[m]]
        if counts:
            assert max(counts) - min(counts) <= 1


def test_range_matches_kafkas_example():
    # Kafka's RangeAssignor javadoc example: two consumers, two topics of three partitions
    ppt = {"t0": 3, "t1": 3}
    result = range_assign(ppt, members_of({"C0": ["t0", "t1"], "C1": ["t0", "t1"]}))
    assert result == {"C0": [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)], "C1": [("t0", 2), ("t1", 2)]}


def test_roundrobin_matches_kafkas_examples():
    ppt = {"t0": 3, "t1": 3}
    result = roundrobin_assign(ppt, members_of({"C0": ["t0", "t1"], "C1": ["t0", "t1"]}))
    assert result == {"C0": [("t0", 0), ("t0", 2), ("t1", 1)], "C1": [("t0", 1), ("t1", 0), ("t1", 2)]}
    # unequal subscriptions (RoundRobinAssignor javadoc): C0: t0; C1: t0, t1; C2: t0, t1, t2
    ppt = {"t0": 1, "t1": 2, "t2": 3}
    result = roundrobin_assign(ppt, members_of({"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}))
    assert result == {"C0": [("t0", 0)], "C1": [("t1", 0)], "C2": [("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)]}


def test_static_members_sort_first_by_instance_id():
    ms = [MemberSubscription("a-dynamic", Subscription(["t"])),
          MemberSubscription("z-static", Subscription(["t"]), group_instance_id="i-1")]
    result = range_assign({"t": 3}, ms)
    assert result["z-static"] == [("t", 0), ("t", 1)]


@given(groups)
@settings(max_examples=200, deadline=None)
def test_roundrobin_assigns_each_partition_once(g):
    ppt, subs = g
    result = roundrobin_assign(ppt, members_of(subs))
    check_exactly_once(result, ppt, subs)
    if len({frozenset(s) for s in subs.values()}) == 1:
        sizes = [len(p) for p in result.values()]
        assert max(sizes) - min(sizes) <= 1


def assert_balanced(result, ppt, subs):
    sizes = {m: len(p) for m, p in result.items()}
    if len({frozenset(s) for s in subs.values()}) == 1:
        assert max(sizes.values()) - min(sizes.values()) <= 1, sizes
    else:  # Kafka's general rule: nothing could move to an eligible member with two fewer
        for m, parts in result.items():
            for t, _ in parts:
                for other in subs:
                    if t in subs[other]:
                        assert sizes[other] + 1 >= sizes[m], (m, other, sizes)


@given(groups, st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_sticky_is_complete_balanced_and_keeps_a_balanced_assignment(g, rnd):
    ppt, subs = g
    # previous ownership: random, possibly stale (partitions that no longer exist, unsubscribed topics)
    owned: dict[str, list[tuple[str, int]]] = {m: [] for m in subs}
    for t in TOPICS:
        for p in range(ppt[t] + 2):
            if rnd.random() < 0.6:
                owned[rnd.choice(sorted(subs))].append((t, p))
    result = sticky_assign(ppt, members_of(subs, owned))
    check_exactly_once(result, ppt, subs)
    assert_balanced(result, ppt, subs)
    # a balanced assignment given back as ownership is kept as it is (stickiness)
    again = sticky_assign(ppt, members_of(subs, result, generation=2))
    assert again == result


@given(groups, st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_cooperative_never_moves_a_partition_directly_and_converges_in_two_rounds(g, rnd):
    ppt, subs = g
    names = sorted(subs)
    # a previous generation's valid ownership (disjoint): each existing partition owned by at most one member
    owned: dict[str, list[tuple[str, int]]] = {m: [] for m in subs}
    for tp in sorted(subscribed_partitions(ppt, subs)):
        if rnd.random() < 0.7:
            cands = [m for m in names if tp[0] in subs[m]]
            owned[rnd.choice(cands)].append(tp)
    prev_owner = {tp: m for m, parts in owned.items() for tp in parts}
    first = cooperative_sticky_assign(ppt, members_of(subs, owned, generation=1))
    counts = Counter(tp for parts in first.values() for tp in parts)
    assert all(c == 1 for c in counts.values())
    for m, parts in first.items():
        for tp in parts:
            assert prev_owner.get(tp, m) == m, f"{tp} moved from {prev_owner[tp]} to {m} in one rebalance"
    # members revoke what they lost and rejoin; with equal subscriptions the second round completes the
    # balanced assignment (as in Kafka), in general a few more rounds may hold partitions back
    current = first
    rounds = 1
    while set(tp for ps in current.values() for tp in ps) != subscribed_partitions(ppt, subs):
        rounds += 1
        assert rounds <= 5, "cooperative rebalancing does not converge"
        owner_now = {tp: m for m, ps in current.items() for tp in ps}
        nxt = cooperative_sticky_assign(ppt, members_of(subs, current, generation=rounds))
        for m, parts in nxt.items():
            for tp in parts:
                assert owner_now.get(tp, m) == m, f"{tp} moved from {owner_now[tp]} to {m} in one rebalance"
        current = nxt
    if len({frozenset(s) for s in subs.values()}) == 1:
        assert rounds <= 2
    check_exactly_once(current, ppt, subs)
    assert_balanced(current, ppt, subs)


def test_cooperative_claim_conflicts_follow_generations():
    ppt = {"t": 2}
    ms = [MemberSubscription("A", Subscription(["t"], owned_partitions=[("t", 0), ("t", 1)], generation_id=5)),
          MemberSubscription("B", Subscription(["t"], owned_partitions=[("t", 0)], generation_id=4))]
    result = cooperative_sticky_assign(ppt, ms)
    # A's newer claim wins: t-0 stays with A; t-1 would move to B for balance, so it is held back
    assert result == {"A": [("t", 0)], "B": []}


def test_rebalance_protocol():
    assert rebalance_protocol(["cooperative-sticky"]) == COOPERATIVE
    assert rebalance_protocol(["range", "cooperative-sticky"]) == EAGER
    assert rebalance_protocol(["roundrobin"]) == EAGER
    assert set(ASSIGNORS) == {"range", "roundrobin", "cooperative-sticky"}


# -- encodings ---------------------------------------------------------------------------------


tps = st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 50)), unique=True, max_size=20)


@given(st.integers(0, 3), st.lists(st.sampled_from(TOPICS), unique=True), st.one_of(st.none(), st.binary(max_size=8)),
       tps, st.integers(-1, 1000), st.one_of(st.none(), st.text(max_size=5)))
def test_subscription_round_trip(version, topics, user_data, owned, gen, rack):
    sub = Subscription(topics, user_data, owned, gen, rack, version=version)
    back = decode_subscription(encode_subscription(sub))
    assert back.version == version and back.topics == topics and back.user_data == user_data
    assert sorted(back.owned_partitions) == (sorted(owned) if version >= 1 else [])
    assert back.generation_id == (gen if version >= 2 else -1)
    assert back.rack_id == (rack if version >= 3 else None)


@given(st.integers(0, 3), tps, st.one_of(st.none(), st.binary(max_size=8)))
def test_assignment_round_trip(version, parts, user_data):
    back = decode_assignment(encode_assignment(Assignment(parts, user_data, version)))
    assert sorted(back.partitions) == sorted(parts) and back.user_data == user_data and back.version == version


def test_newer_subscription_version_is_read_as_v3_and_trailing_fields_ignored():
    data = encode_subscription(Subscription(["t"], None, [("t", 1)], 7, "r1", version=3))
    future = struct.pack(">h", 9) + data[2:] + b"\x00\x00\x00\x05extra"
    sub = decode_subscription(future)
    assert (sub.topics, sub.owned_partitions, sub.generation_id, sub.rack_id) == (["t"], [("t", 1)], 7, "r1")


def test_truncated_data_is_a_protocol_error():
    data = encode_subscription(Subscription(["topic"], None, [("topic", 1)], 3))
    for cut in (1, 5, len(data) - 1):
        with pytest.raises(ProtocolError):
            decode_subscription(data[:cut])
    assert decode_assignment(b"").partitions == []


def test_encodings_match_kafka_python():
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

    for version in range(4):
        theirs = ConsumerProtocolSubscription(
            version=version, topics=["t1", "t2"], user_data=b"\x00\x00\x00\x03",
            owned_partitions=[ConsumerProtocolSubscription.TopicPartition(topic="t1", partitions=[0, 2])],
            generation_id=3, rack_id="rack").encode()
        ours = encode_subscription(Subscription(["t1", "t2"], b"\x00\x00\x00\x03", [("t1", 0), ("t1", 2)], 3, "rack",
                                                version=version))
        assert ours == theirs, version
        back = decode_subscription(theirs)
        assert back.topics == ["t1", "t2"]
        decoded = ConsumerProtocolSubscription.decode(ours)
        assert list(decoded.topics) == ["t1", "t2"]
    theirs_a = ConsumerProtocolAssignment(version=0, assigned_partitions=[
        ConsumerProtocolAssignment.TopicPartition(topic="t1", partitions=[1, 3])], user_data=None).encode()
    assert encode_assignment(Assignment([("t1", 1), ("t1", 3)], None, 0)) == theirs_a
    assert [(tp.topic, tp.partition) for tp in ConsumerProtocolAssignment.decode(
        encode_assignment(Assignment([("t1", 3), ("t2", 0)]))).partitions()] == [("t1", 3), ("t2", 0)]


GOLDEN = __import__("pathlib").Path(__file__).resolve().parents[1] / "golden" / "consumer_protocol"


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.bin")))
def test_subscriptions_captured_from_librdkafka_and_kafka_python(name):
    """Bytes sent by real members (tests/golden/consumer_protocol/capture.py): decoded, re-encoded identically."""
    data = (GOLDEN / name).read_bytes()
    sub = decode_subscription(data)
    assert sub.topics == ["golden-cp"]
    assert encode_subscription(sub) == data
    client = name.split("_")[0]
    assert sub.version == (3 if client == "librdkafka" else 1 if "cooperative" in name else 0)
    if "cooperative" in name:
        # captured after a rebalance: the member lists what it owns
        assert sub.owned_partitions and all(t == "golden-cp" and 0 <= p < 4 for t, p in sub.owned_partitions)
        if client == "librdkafka":
            assert sub.generation_id >= 1 and sticky_generation(sub) == sub.generation_id


def test_golden_subscriptions_exist():
    assert len(list(GOLDEN.glob("*.bin"))) == 6


def test_cooperative_holds_back_a_partition_claimed_by_a_member_without_generation():
    # kafka-python's v1 subscription has no generation: its claim loses a conflict, but a partition it
    # alone lists is never handed straight to another member
    kp = MemberSubscription("kp", Subscription(["t"], owned_partitions=[("t", 0), ("t", 1), ("t", 2)], version=1))
    new = MemberSubscription("new", Subscription(["t"], generation_id=-1))
    result = cooperative_sticky_assign({"t": 4}, [kp, new])
    assert set(result["kp"]) | set(result["new"]) <= {("t", 0), ("t", 1), ("t", 2), ("t", 3)}
    assert not set(result["new"]) & {("t", 0), ("t", 1), ("t", 2)}
