"""Data of the classic group protocol: groups, members, states (no IO, no clock).

The rules that move a group between states live in
:mod:`oncelog.broker.group.coordinator`; this module only holds the data and
the bookkeeping Kafka's ``GroupMetadata``/``MemberMetadata`` do (supported
protocol counts, the static-member map, the awaiting-join count, protocol
selection).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Any

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    def __str__(self) -> str:
        return self.value


# the states each state may be entered from (Kafka's validPreviousStates)
VALID_PREVIOUS = {
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.DEAD: {
        GroupState.STABLE,
        GroupState.PREPARING_REBALANCE,
        GroupState.COMPLETING_REBALANCE,
        GroupState.EMPTY,
        GroupState.DEAD,
    },
}


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # in the member's order of preference
    assignment: bytes = b""
    join_future: Any = None  # set while the member awaits a JoinGroup response
    sync_future: Any = None  # set while the member awaits a SyncGroup response
    is_new: bool = False
    # when the member must have heartbeated again; None = no expiry scheduled
    heartbeat_deadline: int | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None

    def metadata(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        raise KeyError(protocol)

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return list(self.protocols) == list(protocols)

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError("member supports none of the candidate protocols")


class Group:
    """One classic group. Times are milliseconds of the coordinator's clock."""

    def __init__(self, group_id: str, now_ms: int, state: GroupState = GroupState.EMPTY) -> None:
        self.group_id = group_id
        self.state = state
        self.state_timestamp: int | None = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_members: dict[str, int] = {}  # MEMBER_ID_REQUIRED ids -> expiry deadline
        self.pending_sync: set[str] = set()
        self.supported_protocols: dict[str, int] = {}
        self.num_awaiting_join = 0
        self.new_member_added = False
        self.subscribed_topics: set[str] | None = None
        # deadlines driven by the coordinator's tick
        self.join_deadline: int | None = None
        self.initial_delay: tuple[int, int] | None = None  # (configured delay, remaining) while InitialDelayedJoin
        self.sync_deadline: int | None = None

    def __repr__(self) -> str:
        return f"Group({self.group_id!r}, {self.state}, gen={self.generation_id}, members={len(self.members)})"

    # -- state -----------------------------------------------------------------

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS[target]:
            raise AssertionError(f"group {self.group_id}: illegal transition {self.state} -> {target}")
        self.state = target
        self.state_timestamp = now_ms

    @property
    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    # -- members ---------------------------------------------------------------

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        if self.state == GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols.get(n, 0) == len(self.members) for n in names
        )

    def add(self, member: Member, join_future: Any = None) -> None:
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        for name, _ in member.protocols:
            self.supported_protocols[name] = self.supported_protocols.get(name, 0) + 1
        member.join_future = join_future
        if join_future is not None:
            self.num_awaiting_join += 1
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            for name, _ in member.protocols:
                self.supported_protocols[name] -= 1
                if not self.supported_protocols[name]:
                    del self.supported_protocols[name]
            if member.awaiting_join:
                self.num_awaiting_join -= 1
            if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
                del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        return member

    def update_member(
        self,
        member: Member,
        protocols: list[tuple[str, bytes]],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        join_future: Any,
    ) -> Any:
        """Replace the member's protocols and timeouts and set its join future.

        Returns the previous join future if there was one (the caller answers it).
        """
        for name, _ in member.protocols:
            self.supported_protocols[name] -= 1
            if not self.supported_protocols[name]:
                del self.supported_protocols[name]
        for name, _ in protocols:
            self.supported_protocols[name] = self.supported_protocols.get(name, 0) + 1
        member.protocols = list(protocols)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        previous = member.join_future
        if join_future is not None and previous is None:
            self.num_awaiting_join += 1
        elif join_future is None and previous is not None:
            self.num_awaiting_join -= 1
        member.join_future = join_future
        return previous

    def take_join_future(self, member: Member) -> Any:
        fut, member.join_future = member.join_future, None
        if fut is not None:
            self.num_awaiting_join -= 1
        return fut

    def static_member_id(self, instance_id: str | None) -> str | None:
        return None if instance_id is None else self.static_members.get(instance_id)

    def is_static_member_fenced(self, member_id: str, instance_id: str | None) -> bool:
        current = self.static_member_id(instance_id)
        return current is not None and current != member_id

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        self.static_members[instance_id] = new_id
        return member

    @property
    def all_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_members

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if not m.awaiting_join]

    def elect_joined_leader(self) -> bool:
        """Kafka's maybeElectNewJoinedLeader: keep a leader that rejoined, else pick one that did."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for m in self.members.values():
            if m.awaiting_join:
                self.leader_id = m.member_id
                return True
        return False

    # -- protocols -------------------------------------------------------------

    def candidate_protocols(self) -> set[str]:
        n = len(self.members)
        return {p for p, count in self.supported_protocols.items() if count == n}

    def select_protocol(self) -> str:
        """The protocol every member supports with the most first-preference votes.

        Ties go to the protocol the leader prefers (Kafka leaves ties unspecified).
        """
        if not self.members:
            raise AssertionError("cannot select a protocol for an empty group")
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        best = max(votes.values())
        leader = self.members.get(self.leader_id or "") or next(iter(self.members.values()))
        for name, _ in leader.protocols:
            if votes.get(name) == best:
                return name
        return min(n for n, c in votes.items() if c == best)

    def compute_subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol only); None = unknown."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None or not self.members:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            try:
                topics.update(subscription_topics(m.metadata(self.protocol_name)))
            except (KeyError, ValueError, struct.error, UnicodeDecodeError):
                return None
        return topics

    def is_subscribed_to(self, topic: str) -> bool:
        return self.subscribed_topics is None or topic in self.subscribed_topics

    def member_metadata_list(self) -> list[dict[str, Any]]:
        """The JoinGroup response's member list (metadata of the selected protocol)."""
        assert self.protocol_name is not None
        return [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata(self.protocol_name)}
            for m in self.members.values()
        ]


def subscription_topics(data: bytes) -> list[str]:
    """Topics of a ConsumerProtocolSubscription (any version: they come first)."""
    if len(data) < 6:
        raise ValueError("subscription too short")
    (count,) = struct.unpack_from(">i", data, 2)
    pos = 6
    out = []
    for _ in range(max(count, 0)):
        (n,) = struct.unpack_from(">h", data, pos)
        pos += 2
        if n < 0 or pos + n > len(data):
            raise ValueError("bad topic name in subscription")
        out.append(data[pos : pos + n].decode("utf-8"))
        pos += n
    return out
