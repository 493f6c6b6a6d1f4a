"""Consumer-group partition assignors and the consumer protocol's encodings (sans-IO).

The classic group protocol leaves the assignment to the group's leader: every
member sends a *subscription* (ConsumerProtocolSubscription) for each
assignor it supports, the broker picks the assignor all members support, and
the leader runs it and hands each member an *assignment*
(ConsumerProtocolAssignment) through SyncGroup. Members of different clients
(Java, librdkafka, kafka-python, oncelog) share a group as long as they agree
on the assignor's name and the encodings, so both follow Apache Kafka:

* :func:`encode_subscription` / :func:`decode_subscription`: versions 0-3
  (v1 adds owned partitions, v2 the member's generation, v3 its rack). A
  newer version than we know is read as v3 and its trailing fields ignored,
  as Kafka's ConsumerProtocol does.
* :func:`encode_assignment` / :func:`decode_assignment`: versions 0-3 (the
  same layout).
* :data:`ASSIGNORS`: ``"range"`` (:func:`range_assign`), ``"roundrobin"``
  (:func:`roundrobin_assign`) and ``"cooperative-sticky"``
  (:func:`cooperative_sticky_assign`), each a pure function from the
  members' subscriptions and the partition counts to ``{member_id: [(topic,
  partition), ...]}``, with the semantics of Kafka's ``RangeAssignor``,
  ``RoundRobinAssignor`` and ``CooperativeStickyAssignor``:

  - range: per topic, the members subscribed to it in member order take
    consecutive ranges; the first ``partitions % members`` take one more;
  - roundrobin: every partition of every subscribed topic, in (topic,
    partition) order, goes to the next member in a circle that is subscribed
    to its topic;
  - cooperative-sticky: keeps each partition with its previous owner (from
    the owned partitions of the highest generation; a partition two members
    claim in the same generation is treated as unowned), then balances: with
    equal subscriptions no member has two more partitions than another, and
    in general no partition can move to a member with at least two fewer
    that is subscribed to it. Then the cooperative rule: a partition added to
    a member while another member still lists it as owned (in any
    generation) is *not* assigned in this rebalance; its owner revokes it and
    rejoins, and the next rebalance gives it to the new owner. So a partition
    never goes from one owner straight to another. (kafka-python's members
    send v1 subscriptions without a generation: their claims lose conflicts
    but still hold partitions back.)

  Member order is Kafka's: members with a ``group.instance.id`` first, by
  that id, then the others by member id.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ASSIGNORS",
    "COOPERATIVE",
    "EAGER",
    "Assignment",
    "MemberSubscription",
    "Subscription",
    "TopicPartition",
    "cooperative_sticky_assign",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
    "range_assign",
    "roundrobin_assign",
    "rebalance_protocol",
]

TopicPartition = tuple[str, int]
EAGER, COOPERATIVE = "eager", "cooperative"
SUBSCRIPTION_MAX_VERSION = 3
ASSIGNMENT_MAX_VERSION = 3
DEFAULT_GENERATION = -1


class ProtocolError(ValueError):
    """Bytes that are not a valid consumer-protocol subscription or assignment."""


# -- encodings --------------------------------------------------------------------------------


@dataclass
class Subscription:
    """A ConsumerProtocolSubscription: what one member sends for one assignor in JoinGroup."""

    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: list[TopicPartition] = field(default_factory=list)
    generation_id: int = DEFAULT_GENERATION
    rack_id: str | None = None
    version: int = SUBSCRIPTION_MAX_VERSION


@dataclass
class Assignment:
    """A ConsumerProtocolAssignment: what the leader hands one member in SyncGroup."""

    partitions: list[TopicPartition]
    user_data: bytes | None = None
    version: int = 0


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = bytes(buf)
        self.pos = 0

    def _take(self, fmt: str, size: int) -> int:
        if self.pos + size > len(self.buf):
            raise ProtocolError("consumer protocol data is truncated")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return int(v)

    def i16(self) -> int:
        return self._take(">h", 2)

    def i32(self) -> int:
        return self._take(">i", 4)

    def string(self, nullable: bool = False) -> str | None:
        n = self.i16()
        if n < 0:
            if nullable:
                return None
            raise ProtocolError("null string in consumer protocol data")
        if self.pos + n > len(self.buf):
            raise ProtocolError("consumer protocol data is truncated")
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def bytes_(self) -> bytes | None:
        n = self.i32()
        if n < 0:
            return None
        if self.pos + n > len(self.buf):
            raise ProtocolError("consumer protocol data is truncated")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def count(self) -> int:
        n = self.i32()
        if n > len(self.buf):
            raise ProtocolError(f"array length {n} larger than the data")
        return max(n, 0)

    def partitions(self) -> list[TopicPartition]:
        out: list[TopicPartition] = []
        for _ in range(self.count()):
            topic = self.string()
            assert topic is not None
            out.extend((topic, self.i32()) for _ in range(self.count()))
        return out

    def at_end(self) -> bool:
        return self.pos >= len(self.buf)


def _w_string(out: list[bytes], s: str | None) -> None:
    if s is None:
        out.append(struct.pack(">h", -1))
        return
    b = s.encode()
    out.append(struct.pack(">h", len(b)))
    out.append(b)


def _w_bytes(out: list[bytes], b: bytes | None) -> None:
    if b is None:
        out.append(struct.pack(">i", -1))
        return
    out.append(struct.pack(">i", len(b)))
    out.append(bytes(b))


def _w_partitions(out: list[bytes], parts: Iterable[TopicPartition]) -> None:
    by_topic: dict[str, list[int]] = {}
    for t, p in parts:
        by_topic.setdefault(t, []).append(p)
    out.append(struct.pack(">i", len(by_topic)))
    for t in sorted(by_topic):
        _w_string(out, t)
        ps = sorted(by_topic[t])
        out.append(struct.pack(f">i{len(ps)}i", len(ps), *ps))


def encode_subscription(sub: Subscription) -> bytes:
    """The bytes of ``sub`` at ``sub.version`` (fields that version lacks are left out)."""
    v = min(max(sub.version, 0), SUBSCRIPTION_MAX_VERSION)
    out = [struct.pack(">hi", v, len(sub.topics))]
    for t in sub.topics:
        _w_string(out, t)
    _w_bytes(out, sub.user_data)
    if v >= 1:
        _w_partitions(out, sub.owned_partitions)
    if v >= 2:
        out.append(struct.pack(">i", sub.generation_id))
    if v >= 3:
        _w_string(out, sub.rack_id)
    return b"".join(out)


def decode_subscription(data: bytes) -> Subscription:
    """A subscription of any version; raises :class:`ProtocolError` on malformed data."""
    r = _Reader(data)
    version = r.i16()
    if version < 0:
        raise ProtocolError(f"subscription version {version}")
    topics = [t for t in (r.string() for _ in range(r.count())) if t is not None]
    user_data = r.bytes_()
    sub = Subscription(topics, user_data, version=version)
    if version >= 1:
        sub.owned_partitions = r.partitions()
    if version >= 2:
        sub.generation_id = r.i32()
    if version >= 3:
        sub.rack_id = r.string(nullable=True)
    return sub


def encode_assignment(a: Assignment) -> bytes:
    out = [struct.pack(">h", min(max(a.version, 0), ASSIGNMENT_MAX_VERSION))]
    _w_partitions(out, a.partitions)
    _w_bytes(out, a.user_data)
    return b"".join(out)


def decode_assignment(data: bytes) -> Assignment:
    """An assignment of any version; empty bytes (a member the leader left out) is an empty one."""
    if not data:
        return Assignment([])
    r = _Reader(data)
    version = r.i16()
    if version < 0:
        raise ProtocolError(f"assignment version {version}")
    parts = r.partitions()
    user_data = None if r.at_end() else r.bytes_()
    return Assignment(parts, user_data, version)


def sticky_generation(sub: Subscription) -> int:
    """The member's generation for the sticky assignor: the v2+ field, else the 4-byte user data.

    Kafka's CooperativeStickyAssignor also puts the generation in its user data
    so that leaders reading an older subscription version still see it.
    """
    if sub.version >= 2:
        return sub.generation_id
    if sub.user_data is not None and len(sub.user_data) == 4:
        return struct.unpack(">i", sub.user_data)[0]
    return DEFAULT_GENERATION


# -- assignors --------------------------------------------------------------------------------


@dataclass
class MemberSubscription:
    """One member as the leader sees it: its ids and decoded subscription."""

    member_id: str
    subscription: Subscription
    group_instance_id: str | None = None


Assign = Callable[[Mapping[str, int], Sequence[MemberSubscription]], dict[str, list[TopicPartition]]]


def _member_key(m: MemberSubscription) -> tuple[int, str]:
    # Kafka's MemberInfo order: static members (by instance id) before dynamic ones (by member id)
    return (0, m.group_instance_id) if m.group_instance_id is not None else (1, m.member_id)


def _ordered(members: Sequence[MemberSubscription]) -> list[MemberSubscription]:
    return sorted(members, key=_member_key)


def range_assign(partitions_per_topic: Mapping[str, int],
                 members: Sequence[MemberSubscription]) -> dict[str, list[TopicPartition]]:
    """Kafka's RangeAssignor (without rack awareness)."""
    out: dict[str, list[TopicPartition]] = {m.member_id: [] for m in members}
    by_topic: dict[str, list[MemberSubscription]] = defaultdict(list)
    for m in members:
        for t in dict.fromkeys(m.subscription.topics):
            by_topic[t].append(m)
    for topic in sorted(by_topic):
        n = partitions_per_topic.get(topic)
        if not n:
            continue
        consumers = _ordered(by_topic[topic])
        per, extra = divmod(n, len(consumers))
        start = 0
        for i, m in enumerate(consumers):
            length = per + (1 if i < extra else 0)
            out[m.member_id].extend((topic, p) for p in range(start, start + length))
            start += length
    return out


def roundrobin_assign(partitions_per_topic: Mapping[str, int],
                      members: Sequence[MemberSubscription]) -> dict[str, list[TopicPartition]]:
    """Kafka's RoundRobinAssignor."""
    out: dict[str, list[TopicPartition]] = {m.member_id: [] for m in members}
    ordered = _ordered(members)
    if not ordered:
        return out
    subscribed = [set(m.subscription.topics) for m in ordered]
    topics = sorted(set().union(*subscribed))
    i = 0
    for topic in topics:
        for p in range(partitions_per_topic.get(topic) or 0):
            # the next member in the circle that is subscribed to the topic (one exists)
            while topic not in subscribed[i % len(ordered)]:
                i += 1
            out[ordered[i % len(ordered)].member_id].append((topic, p))
            i += 1
    return out


def _previous_owners(partitions_per_topic: Mapping[str, int],
                     members: Sequence[MemberSubscription]) -> dict[TopicPartition, str]:
    """Who owned what, from the highest generation's claims (Kafka's AbstractStickyAssignor rules).

    A claim from a lower generation than another member's claim of the same
    partition loses; two claims of the same partition in the same generation
    both lose (the partition is treated as unowned); claims of partitions that
    no longer exist, or of topics the member no longer subscribes to, are
    dropped.
    """
    best: dict[TopicPartition, tuple[int, str | None]] = {}
    for m in _ordered(members):
        gen = sticky_generation(m.subscription)
        subscribed = set(m.subscription.topics)
        for tp in dict.fromkeys(m.subscription.owned_partitions):
            t, p = tp
            if t not in subscribed or not 0 <= p < (partitions_per_topic.get(t) or 0):
                continue
            prev = best.get(tp)
            if prev is None or gen > prev[0]:
                best[tp] = (gen, m.member_id)
            elif gen == prev[0]:
                best[tp] = (gen, None)  # claimed twice in one generation: nobody keeps it
    return {tp: owner for tp, (_, owner) in best.items() if owner is not None}


def sticky_assign(partitions_per_topic: Mapping[str, int],
                  members: Sequence[MemberSubscription]) -> dict[str, list[TopicPartition]]:
    """The balanced sticky assignment before the cooperative adjustment (see the module docstring)."""
    ordered = _ordered(members)
    subs = {m.member_id: set(m.subscription.topics) for m in ordered}
    rank = {m.member_id: i for i, m in enumerate(ordered)}
    all_parts = [(t, p) for t in sorted(set().union(*subs.values())) if t in partitions_per_topic
                 for p in range(partitions_per_topic[t] or 0)]
    eligible: dict[TopicPartition, list[str]] = {tp: [m for m in subs if tp[0] in subs[m]] for tp in all_parts}
    owner: dict[TopicPartition, str] = {}
    have: dict[str, set[TopicPartition]] = {m: set() for m in subs}
    prev = _previous_owners(partitions_per_topic, members)
    equal_subscriptions = len({frozenset(s) for s in subs.values()}) <= 1
    if equal_subscriptions and subs:
        # quotas: everyone keeps at most ceil(P/N), and only P % N members may be at ceil
        n_members = len(subs)
        lo, extra = divmod(len(all_parts), n_members)
        kept_by: dict[str, list[TopicPartition]] = defaultdict(list)
        for tp in all_parts:
            if tp in prev:
                kept_by[prev[tp]].append(tp)
        # members that owned the most keep the extra slots (fewest moves)
        order = sorted(subs, key=lambda m: (-len(kept_by[m]), rank[m]))
        for m in order:
            quota = lo + (1 if extra > 0 and len(kept_by[m]) > lo else 0)
            if quota > lo:
                extra -= 1
            for tp in kept_by[m][:quota]:
                owner[tp] = m
                have[m].add(tp)
    else:
        for tp, m in prev.items():
            if tp in eligible and m in subs:
                owner[tp] = m
                have[m].add(tp)
    # unowned partitions, most constrained first, to the eligible member with the fewest
    free = sorted((tp for tp in all_parts if tp not in owner), key=lambda tp: (len(eligible[tp]), tp))
    for tp in free:
        if not eligible[tp]:
            continue
        m = min(eligible[tp], key=lambda x: (len(have[x]), rank[x]))
        owner[tp] = m
        have[m].add(tp)
    # balance: move partitions from a member to an eligible one with at least two fewer; members
    # subscribed to a topic are the same for all its partitions, so candidates are found per topic
    topic_members = {t: [m for m in subs if t in subs[m]] for t in {tp[0] for tp in all_parts}}
    moved = True
    while moved:
        moved = False
        for src in sorted(subs, key=lambda x: (-len(have[x]), rank[x])):
            by_topic: dict[str, list[TopicPartition]] = defaultdict(list)
            for tp in have[src]:
                by_topic[tp[0]].append(tp)
            best: tuple[int, int, str, str] | None = None
            for t in sorted(by_topic):
                dst = min(topic_members[t], key=lambda x: (len(have[x]), rank[x]))
                if len(have[dst]) + 1 < len(have[src]):
                    cand = (len(have[dst]), rank[dst], t, dst)
                    if best is None or cand < best:
                        best = cand
            if best is not None:
                _, _, t, dst = best
                # prefer moving a partition src did not own before (fewer revocations)
                tp = min(by_topic[t], key=lambda x: (prev.get(x) == src, x))
                have[src].discard(tp)
                have[dst].add(tp)
                owner[tp] = dst
                moved = True
                break
    return {m: sorted(have[m]) for m in subs}


def cooperative_sticky_assign(partitions_per_topic: Mapping[str, int],
                              members: Sequence[MemberSubscription]) -> dict[str, list[TopicPartition]]:
    """Kafka's CooperativeStickyAssignor: sticky and balanced, moved partitions held back one round."""
    target = sticky_assign(partitions_per_topic, members)
    # Kafka's "partitions transferring ownership": a partition added to a member that another member
    # still lists as owned (whatever its generation) waits one round, until that member revoked it
    claims: dict[TopicPartition, set[str]] = defaultdict(set)
    for m in members:
        for tp in m.subscription.owned_partitions:
            claims[tp].add(m.member_id)
    owned = {m.member_id: set(m.subscription.owned_partitions) for m in members}
    return {m: [tp for tp in parts if tp in owned.get(m, ()) or not (claims.get(tp, set()) - {m})]
            for m, parts in target.items()}


@dataclass(frozen=True)
class AssignorInfo:
    name: str
    assign: Assign
    protocols: tuple[str, ...]  # rebalance protocols it supports


ASSIGNORS: dict[str, AssignorInfo] = {
    "range": AssignorInfo("range", range_assign, (EAGER,)),
    "roundrobin": AssignorInfo("roundrobin", roundrobin_assign, (EAGER,)),
    "cooperative-sticky": AssignorInfo("cooperative-sticky", cooperative_sticky_assign, (EAGER, COOPERATIVE)),
}


def rebalance_protocol(names: Sequence[str]) -> str:
    """The protocol of a member configured with these assignors: cooperative only if all support it.

    As in Kafka's ConsumerCoordinator: the default ``["range",
    "cooperative-sticky"]`` is therefore eager.
    """
    common = set.intersection(*(set(ASSIGNORS[n].protocols) for n in names)) if names else {EAGER}
    return COOPERATIVE if COOPERATIVE in common else EAGER


def subscription_user_data(name: str, generation: int) -> bytes | None:
    """The user data a member sends for assignor ``name`` (the generation, for cooperative-sticky)."""
    if name == "cooperative-sticky":
        return struct.pack(">i", generation)
    return None
