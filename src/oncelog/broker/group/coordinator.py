"""The classic group coordinator: a state machine driven by requests and a clock.

It does no IO of its own. Requests call the public methods; JoinGroup and
SyncGroup return futures the coordinator resolves when the rebalance gets
there; :meth:`GroupCoordinator.tick` (called periodically by the server, or
by a test with a fake clock) expires sessions, pending member ids,
rebalance timeouts and the wait for SyncGroup, and every request that
depends on membership first processes its group's due expirations, so the
deadlines are exact between ticks. Persistence goes through an
:class:`~oncelog.broker.group.offsets.OffsetStore`.

The rules follow Kafka's classic group coordinator (GroupCoordinator /
GroupMetadataManager's classic-group part): see docs/groups.md for the
summary and each method for the error codes.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from oncelog.broker.group.offsets import OffsetAndMetadata, OffsetStore, TopicPartition
from oncelog.broker.group.state import CONSUMER_PROTOCOL_TYPE, Group, GroupState, Member
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.storage.log_dir import log_level

log = logging.getLogger(__name__)

E = ErrorCode
EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD

GROUP_TYPE = "classic"


@dataclass
class GroupConfig:
    """Kafka's group coordinator settings (broker property names in docs/configuration.md)."""

    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    max_size: int = 2**31 - 1  # group.max.size
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes
    new_member_join_timeout_ms: int = 300_000  # Kafka's fixed NewMemberJoinTimeoutMs


def _default_future() -> Any:
    return asyncio.get_running_loop().create_future()


def _resolve(fut: Any, value: Any) -> None:
    if fut is not None and not fut.done():
        fut.set_result(value)


def join_error(code: int, member_id: str = "") -> dict[str, Any]:
    return {
        "error_code": int(code),
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None,
        "leader": "",
        "skip_assignment": False,
        "member_id": member_id,
        "members": [],
    }


def sync_error(code: int) -> dict[str, Any]:
    return {"error_code": int(code), "protocol_type": None, "protocol_name": None, "assignment": b""}


def append_error(exc: BaseException | None) -> int:
    """The answer for an offsets-log write (OffsetCommit, TxnOffsetCommit, OffsetDelete,
    DeleteGroups, the group metadata of SyncGroup and of a static member's JoinGroup)
    that failed with ``exc`` (None: the write was cancelled).

    Kafka's group coordinator maps the append's error by cause (GroupMetadataManager's
    appendGroupMetadataErrorToResponseError, coordinator-common's
    handleOperationException): UNKNOWN_TOPIC_OR_PARTITION, NOT_ENOUGH_REPLICAS and
    REQUEST_TIMED_OUT to COORDINATOR_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER and
    KAFKA_STORAGE_ERROR to NOT_COORDINATOR, MESSAGE_TOO_LARGE and RECORD_LIST_TOO_LARGE
    to UNKNOWN_SERVER_ERROR. A write fails here by the offsets log's own I/O (an
    OSError of its write or fsync): a storage error, so NOT_COORDINATOR (retriable: the
    client looks the coordinator up again), as the transaction coordinator answers for
    its log. A write that ended otherwise (cancelled, or its fsync round could not start
    because the broker is shutting down) answers COORDINATOR_NOT_AVAILABLE, as Kafka's
    inactive coordinator does."""
    if isinstance(exc, OSError):
        return int(E.not_coordinator)
    return int(E.coordinator_not_available)


async def write_error(fut: Any) -> int:
    """Wait for an offsets-log write (a store future, or None: nothing to wait for) and give the
    request's answer for it: 0 once durable, else :func:`append_error` of its failure. A write
    cancelled at shutdown answers COORDINATOR_NOT_AVAILABLE (awaiting it directly ended the request
    unanswered); only the request's own cancellation propagates. Not logged here: the store and
    the durability layer log the failure itself."""
    if fut is None:
        return 0
    if not fut.done():
        await asyncio.wait([fut])  # never cancels ``fut``, and is not cancelled by it
    if fut.cancelled():
        return append_error(None)
    exc = fut.exception()
    return 0 if exc is None else append_error(exc)


def _storage_error(fut: Any) -> int | None:
    """The error code for a finished store future (None = durable)."""
    if fut is None:
        return None
    if fut.cancelled():
        return append_error(None)
    exc = fut.exception()
    if exc is not None:
        log.log(log_level(exc, logging.ERROR), "offsets store write failed: %s", exc)
        return append_error(exc)
    return None


class GroupCoordinator:
    def __init__(
        self,
        store: OffsetStore,
        clock: Callable[[], int],
        config: GroupConfig | None = None,
        new_future: Callable[[], Any] = _default_future,
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config or GroupConfig()
        self._new_future = new_future
        self.groups: dict[str, Group] = {}
        self._load()

    # -- helpers ---------------------------------------------------------------

    def _resolved(self, value: Any) -> Any:
        fut = self._new_future()
        fut.set_result(value)
        return fut

    def group(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    def _maybe_drop(self, group: Group) -> None:
        """Forget a group that never held anything (e.g. a failed first join)."""
        if (
            group.state == EMPTY
            and not group.members
            and not group.pending_members
            and group.generation_id == 0
            and not self.store.has_offsets(group.group_id)
            and not self.store.has_pending(group.group_id)
            and group.group_id not in self.store.group_records
            and self.groups.get(group.group_id) is group
        ):
            del self.groups[group.group_id]

    def _reschedule(self, group: Group, member: Member) -> None:
        member.heartbeat_deadline = self.clock() + member.session_timeout_ms

    def _current_info(self, group: Group, member: Member, with_members: bool) -> dict[str, Any]:
        return {
            "error_code": 0,
            "generation_id": group.generation_id,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol_name,
            "leader": group.leader_id or "",
            "skip_assignment": False,
            "member_id": member.member_id,
            "members": group.member_metadata_list() if with_members else [],
        }

    @staticmethod
    def _validate_member(group: Group, member_id: str, instance_id: str | None) -> int | None:
        """Kafka's validateMember: a static id must map to ``member_id``, which must exist."""
        if instance_id is not None:
            current = group.static_member_id(instance_id)
            if current is None:
                return int(E.unknown_member_id)
            if current != member_id:
                return int(E.fenced_instance_id)
        if not group.has(member_id):
            return int(E.unknown_member_id)
        return None

    # -- JoinGroup ---------------------------------------------------------------

    def join_group(
        self,
        group_id: str | None,
        member_id: str,
        group_instance_id: str | None,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        client_id: str = "",
        client_host: str = "",
        require_known_member_id: bool = True,
        support_skip_assignment: bool = True,
    ) -> Any:
        """Returns a future of the JoinGroup response fields (see :func:`join_error`)."""
        self._expire_due(group_id)
        fut = self._new_future()
        cfg = self.config
        if not group_id:
            fut.set_result(join_error(E.invalid_group_id, member_id))
            return fut
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            fut.set_result(join_error(E.invalid_session_timeout, member_id))
            return fut
        unknown = member_id == ""
        group = self.groups.get(group_id)
        if group is None:
            if not unknown:
                fut.set_result(join_error(E.unknown_member_id, member_id))
                return fut
            group = self.groups[group_id] = Group(group_id, self.clock())
        protocols = [(name, bytes(meta)) for name, meta in protocols]
        if not self._accept_joining_member(group, member_id):
            self._drop_member(group, member_id, E.group_max_size_reached)
            fut.set_result(join_error(E.group_max_size_reached, ""))
        elif unknown:
            self._new_member_join(
                group, fut, group_instance_id, require_known_member_id, support_skip_assignment, client_id,
                client_host, rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols,
            )  # fmt: skip
        else:
            self._current_member_join(
                group, fut, member_id, group_instance_id, client_id, client_host, rebalance_timeout_ms,
                session_timeout_ms, protocol_type, protocols,
            )  # fmt: skip
        if group.state == PREPARING:
            self._try_complete_join(group)
        self._maybe_drop(group)
        return fut

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        if group.state in (EMPTY, DEAD):
            return True
        if group.state == PREPARING:
            m = group.members.get(member_id)
            return (m is not None and m.awaiting_join) or group.num_awaiting_join < self.config.max_size
        return group.has(member_id) or len(group.members) < self.config.max_size

    def _new_member_join(
        self,
        group: Group,
        fut: Any,
        instance_id: str | None,
        require_known_member_id: bool,
        support_skip_assignment: bool,
        client_id: str,
        client_host: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> None:
        if group.state == DEAD:
            fut.set_result(join_error(E.coordinator_not_available))
            return
        if not group.supports_protocols(protocol_type, {n for n, _ in protocols}):
            fut.set_result(join_error(E.inconsistent_group_protocol))
            return
        new_id = f"{instance_id if instance_id is not None else client_id}-{uuid.uuid4()}"
        if instance_id is not None:
            old_id = group.static_member_id(instance_id)
            if old_id is not None:
                log.info(
                    "group %s: static member %s rejoins with an unknown member id in %s; replacing %s by %s",
                    group.group_id, instance_id, group.state, old_id, new_id,
                )  # fmt: skip
                self._update_static_member_and_rebalance(
                    group, fut, old_id, new_id, instance_id, protocols, rebalance_timeout_ms, session_timeout_ms,
                    support_skip_assignment,
                )  # fmt: skip
                return
        elif require_known_member_id:
            group.pending_members[new_id] = self.clock() + session_timeout_ms
            fut.set_result(join_error(E.member_id_required, new_id))
            return
        self._add_member_and_rebalance(
            group, fut, new_id, instance_id, client_id, client_host, rebalance_timeout_ms, session_timeout_ms,
            protocol_type, protocols,
        )  # fmt: skip

    def _current_member_join(
        self,
        group: Group,
        fut: Any,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> None:
        if group.state == DEAD:
            fut.set_result(join_error(E.coordinator_not_available, member_id))
            return
        if not group.supports_protocols(protocol_type, {n for n, _ in protocols}):
            fut.set_result(join_error(E.inconsistent_group_protocol, member_id))
            return
        if member_id in group.pending_members:
            self._add_member_and_rebalance(
                group, fut, member_id, instance_id, client_id, client_host, rebalance_timeout_ms, session_timeout_ms,
                protocol_type, protocols,
            )  # fmt: skip
            return
        instance_unknown = instance_id is not None and instance_id not in group.static_members
        if group.is_static_member_fenced(member_id, instance_id):
            fut.set_result(join_error(E.fenced_instance_id, member_id))
            return
        if not group.has(member_id) or instance_unknown:
            fut.set_result(join_error(E.unknown_member_id, member_id))
            return
        member = group.members[member_id]
        state = group.state
        if state == PREPARING:
            self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms, session_timeout_ms, fut)
        elif state == COMPLETING:
            if member.matches(protocols):
                # the member may have missed the JoinGroup response: answer again
                fut.set_result(self._current_info(group, member, group.is_leader(member_id)))
            else:
                self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms, session_timeout_ms, fut)
        elif state == STABLE:
            if group.is_leader(member_id) or not member.matches(protocols):
                # a leader's JoinGroup forces a rebalance (e.g. for topic metadata changes)
                self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms, session_timeout_ms, fut)
            else:
                fut.set_result(self._current_info(group, member, False))
        else:
            fut.set_result(join_error(E.unknown_member_id, member_id))

    def _add_member_and_rebalance(
        self,
        group: Group,
        fut: Any,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> None:
        member = Member(
            member_id, instance_id, client_id, client_host, rebalance_timeout_ms, session_timeout_ms,
            protocol_type, list(protocols), is_new=True,
        )  # fmt: skip
        if group.state == PREPARING and group.generation_id == 0:
            group.new_member_added = True
        group.add(member, fut)
        # a new member cannot heartbeat before its JoinGroup completes; it is
        # dropped if that takes longer than this (it is expected to retry)
        member.heartbeat_deadline = self.clock() + self.config.new_member_join_timeout_ms
        self._maybe_prepare_rebalance(group, f"adding member {member_id}")

    def _update_member_and_rebalance(
        self,
        group: Group,
        member: Member,
        protocols: list[tuple[str, bytes]],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        fut: Any,
    ) -> None:
        previous = group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, fut)
        if previous is not fut:
            _resolve(previous, join_error(E.rebalance_in_progress, member.member_id))
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoined")

    def _update_static_member_and_rebalance(
        self,
        group: Group,
        fut: Any,
        old_id: str,
        new_id: str,
        instance_id: str,
        protocols: list[tuple[str, bytes]],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        support_skip_assignment: bool,
    ) -> None:
        current_leader = group.leader_id
        old = group.members[old_id]
        # fence whoever still waits under the old member id
        _resolve(group.take_join_future(old), join_error(E.fenced_instance_id, old_id))
        _resolve(old.sync_future, sync_error(E.fenced_instance_id))
        old.sync_future = None
        member = group.replace_static_member(instance_id, old_id, new_id)
        self._reschedule(group, member)
        old_protocols = list(member.protocols)
        old_timeouts = (member.rebalance_timeout_ms, member.session_timeout_ms)
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, fut)
        state = group.state
        if state == STABLE:
            if group.protocol_name == group.select_protocol():
                # no rebalance: persist the new member id and answer with the current generation
                assignment = {m.member_id: m.assignment for m in group.members.values()}
                generation = group.generation_id

                def stored(error: int | None) -> None:
                    if self.groups.get(group.group_id) is not group or not group.has(new_id):
                        _resolve(group.take_join_future(member), join_error(E.unknown_member_id))
                        return
                    if error is not None:
                        group.update_member(member, old_protocols, *old_timeouts, None)
                        group.replace_static_member(instance_id, new_id, old_id)
                        self._reschedule(group, member)
                        _resolve(fut, {**join_error(error), "generation_id": group.generation_id,
                                       "protocol_type": group.protocol_type, "protocol_name": group.protocol_name,
                                       "leader": current_leader or ""})  # fmt: skip
                        return
                    taken = group.take_join_future(member)
                    if support_skip_assignment:
                        # JoinGroup v9+ (KIP-814): a static leader learns it is the leader
                        # but skips the assignment, since a stable group would not broadcast it
                        leader = group.is_leader(new_id)
                        result = self._current_info(group, member, leader)
                        result["skip_assignment"] = leader
                    else:
                        # older clients: return the old leader id so the member never
                        # thinks it must assign
                        result = self._current_info(group, member, False)
                        result["leader"] = current_leader or ""
                    result["generation_id"] = generation
                    _resolve(taken, result)

                self._store_group(group, assignment, stored)
            else:
                self._maybe_prepare_rebalance(group, f"static member {instance_id} changed the selected protocol")
        elif state == COMPLETING:
            # the leader may already hold the old member id: rebalance so the new id gets an assignment
            self._prepare_rebalance(group, f"static member {instance_id} rejoined during CompletingRebalance")
        # PreparingRebalance: the member just waits for the join to complete

    # -- rebalance ---------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.can_rebalance:
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        now = self.clock()
        if group.state == COMPLETING:
            self._reset_and_propagate_assignment_error(group, E.rebalance_in_progress)
        group.sync_deadline = None
        was_empty = group.state == EMPTY
        group.transition(PREPARING, now)
        delay = self.config.initial_rebalance_delay_ms
        rebalance_timeout = group.rebalance_timeout_ms
        if was_empty and delay > 0:
            # InitialDelayedJoin: wait for more members before the first generation
            group.initial_delay = (delay, delay, max(rebalance_timeout - delay, 0))
            group.join_deadline = now + delay
        else:
            group.initial_delay = None
            group.join_deadline = now + rebalance_timeout
        log.info(
            "group %s: preparing to rebalance (generation %d, %d members): %s",
            group.group_id, group.generation_id, len(group.members), reason,
        )  # fmt: skip
        self._try_complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if group.state == PREPARING and group.initial_delay is None and group.all_joined:
            self._complete_join(group)

    def _on_join_deadline(self, group: Group) -> None:
        now = self.clock()
        if group.initial_delay is not None:
            configured, current, remaining = group.initial_delay
            if group.new_member_added and remaining > 0:
                group.new_member_added = False
                delay = min(configured, remaining)
                group.initial_delay = (configured, delay, max(remaining - current, 0))
                group.join_deadline = now + delay
                return
        self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """Kafka's onCompleteJoin: start the next generation with the members that rejoined."""
        now = self.clock()
        group.join_deadline = None
        group.initial_delay = None
        for m in group.not_yet_rejoined():
            if m.group_instance_id is None:  # static members stay until their session times out
                log.info("group %s: removing member %s, which did not rejoin in time", group.group_id, m.member_id)
                self._drop_member(group, m.member_id, E.unknown_member_id)
        if group.state == DEAD:
            return
        if not group.elect_joined_leader() and group.members:
            # only static members that did not rejoin are left: wait another round
            group.join_deadline = now + group.rebalance_timeout_ms
            return
        self._init_next_generation(group)
        if group.state == EMPTY:
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            self._store_group(group, {}, lambda err: None)
            return
        log.info(
            "group %s: generation %d with %d members, protocol %s, leader %s",
            group.group_id, group.generation_id, len(group.members), group.protocol_name, group.leader_id,
        )  # fmt: skip
        for m in list(group.members.values()):
            fut = group.take_join_future(m)
            _resolve(fut, self._current_info(group, m, group.is_leader(m.member_id)))
            self._reschedule(group, m)
            m.is_new = False
            group.pending_sync.add(m.member_id)
        group.sync_deadline = now + group.rebalance_timeout_ms

    def _init_next_generation(self, group: Group) -> None:
        now = self.clock()
        group.generation_id += 1
        if group.members:
            group.protocol_name = group.select_protocol()
            group.subscribed_topics = group.compute_subscribed_topics()
            group.transition(COMPLETING, now)
        else:
            group.protocol_name = None
            group.subscribed_topics = None
            group.transition(EMPTY, now)
        group.pending_sync.clear()

    def _drop_member(self, group: Group, member_id: str, code: int) -> Member | None:
        """Remove a member, answering whatever it still waits for with ``code``."""
        member = group.members.get(member_id)
        if member is None:
            return None
        _resolve(group.take_join_future(member), join_error(code))
        _resolve(member.sync_future, sync_error(code))
        member.sync_future = None
        group.remove(member_id)
        return member

    def _remove_member_and_update_group(self, group: Group, member: Member, reason: str) -> None:
        log.info("group %s: removing member %s: %s", group.group_id, member.member_id, reason)
        self._drop_member(group, member.member_id, E.unknown_member_id)
        if group.state in (STABLE, COMPLETING):
            self._maybe_prepare_rebalance(group, reason)
        elif group.state == PREPARING:
            self._try_complete_join(group)

    def _reset_and_propagate_assignment_error(self, group: Group, code: int) -> None:
        for m in group.members.values():
            m.assignment = b""
        self._propagate_assignment(group, code)

    def _propagate_assignment(self, group: Group, code: int) -> None:
        for m in group.members.values():
            fut, m.sync_future = m.sync_future, None
            if fut is None:
                continue
            if code:
                _resolve(fut, sync_error(code))
            else:
                _resolve(
                    fut,
                    {
                        "error_code": 0,
                        "protocol_type": group.protocol_type,
                        "protocol_name": group.protocol_name,
                        "assignment": m.assignment,
                    },
                )
            self._reschedule(group, m)

    # -- SyncGroup ---------------------------------------------------------------

    def sync_group(
        self,
        group_id: str | None,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
    ) -> Any:
        """Returns a future of the SyncGroup response fields (see :func:`sync_error`)."""
        self._expire_due(group_id)
        fut = self._new_future()
        if not group_id:
            fut.set_result(sync_error(E.invalid_group_id))
            return fut
        group = self.groups.get(group_id)
        if group is None:
            fut.set_result(sync_error(E.unknown_member_id))
            return fut
        error = self._validate_sync(group, generation_id, member_id, group_instance_id, protocol_type, protocol_name)
        if error is not None:
            fut.set_result(sync_error(error))
        elif group.state == EMPTY:
            fut.set_result(sync_error(E.unknown_member_id))
        elif group.state == PREPARING:
            fut.set_result(sync_error(E.rebalance_in_progress))
        elif group.state == COMPLETING:
            member = group.members[member_id]
            _resolve(member.sync_future, sync_error(E.rebalance_in_progress))
            member.sync_future = fut
            group.pending_sync.discard(member_id)
            if group.is_leader(member_id):
                full = {mid: bytes(assignments.get(mid, b"")) for mid in group.members}
                missing = [mid for mid in group.members if mid not in assignments]
                if missing:
                    log.warning("group %s: empty assignment for members %s", group_id, missing)
                generation = group.generation_id
                self._store_group(group, full, lambda err: self._on_assignment_stored(group, generation, full, err))
        else:  # STABLE
            group.pending_sync.discard(member_id)
            member = group.members[member_id]
            fut.set_result(
                {
                    "error_code": 0,
                    "protocol_type": group.protocol_type,
                    "protocol_name": group.protocol_name,
                    "assignment": member.assignment,
                }
            )
            self._reschedule(group, member)
        return fut

    def _validate_sync(
        self,
        group: Group,
        generation_id: int,
        member_id: str,
        instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
    ) -> int | None:
        if group.state == DEAD:
            return int(E.coordinator_not_available)
        error = self._validate_member(group, member_id, instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return int(E.illegal_generation)
        if protocol_type is not None and protocol_type != group.protocol_type:
            return int(E.inconsistent_group_protocol)
        if protocol_name is not None and protocol_name != group.protocol_name:
            return int(E.inconsistent_group_protocol)
        return None

    def _on_assignment_stored(self, group: Group, generation: int, assignment: dict[str, bytes], error: int | None) -> None:
        if self.groups.get(group.group_id) is not group:
            return
        if group.state != COMPLETING or group.generation_id != generation:
            return  # the group moved on while the write was in flight
        if error is not None:
            self._reset_and_propagate_assignment_error(group, error)
            self._maybe_prepare_rebalance(group, "storing the assignment failed")
            return
        for m in group.members.values():
            m.assignment = assignment.get(m.member_id, b"")
        self._propagate_assignment(group, 0)
        group.transition(STABLE, self.clock())
        log.info("group %s: generation %d is stable", group.group_id, generation)

    # -- Heartbeat / LeaveGroup --------------------------------------------------

    def heartbeat(self, group_id: str | None, generation_id: int, member_id: str, group_instance_id: str | None) -> int:
        self._expire_due(group_id)
        if not group_id:
            return int(E.invalid_group_id)
        group = self.groups.get(group_id)
        if group is None:
            return int(E.unknown_member_id)
        if group.state == DEAD:
            return int(E.coordinator_not_available)
        error = self._validate_member(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return int(E.illegal_generation)
        if group.state == EMPTY:
            return int(E.unknown_member_id)
        self._reschedule(group, group.members[member_id])
        if group.state == PREPARING:
            return int(E.rebalance_in_progress)
        return 0  # CompletingRebalance or Stable

    def leave_group(self, group_id: str | None, members: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """``members`` is ``[(member_id, group_instance_id)]``; returns (top error, per-member errors)."""
        self._expire_due(group_id)
        if not group_id:
            return int(E.invalid_group_id), []
        group = self.groups.get(group_id)
        if group is None:
            return 0, [int(E.unknown_member_id)] * len(members)
        if group.state == DEAD:
            return int(E.coordinator_not_available), []
        errors = []
        for member_id, instance_id in members:
            if member_id == "":
                # administrative removal by group.instance.id
                current = group.static_member_id(instance_id)
                if current is None:
                    errors.append(int(E.unknown_member_id))
                else:
                    self._remove_member_and_update_group(group, group.members[current], "LeaveGroup by instance id")
                    errors.append(0)
            elif member_id in group.pending_members:
                del group.pending_members[member_id]
                self._try_complete_join(group)
                errors.append(0)
            else:
                error = self._validate_member(group, member_id, instance_id)
                if error is None:
                    self._remove_member_and_update_group(group, group.members[member_id], "LeaveGroup")
                    errors.append(0)
                else:
                    errors.append(error)
        self._maybe_drop(group)
        return 0, errors

    # -- timers ----------------------------------------------------------------

    def tick(self, now: int | None = None) -> None:
        """Expire sessions, pending member ids, rebalance and sync timeouts that are due."""
        now = self.clock() if now is None else now
        for group in list(self.groups.values()):
            self._expire_group(group, now)

    def _expire_due(self, group_id: str | None) -> None:
        """Process ``group_id``'s timers that are due now. Every request that
        depends on membership calls this first, so deadlines are exact (as
        Kafka's per-member timers are): a member is gone from the moment its
        session timeout passes, not from the next ``tick``."""
        group = self.groups.get(group_id) if group_id else None
        if group is not None:
            self._expire_group(group, self.clock())

    def _expire_group(self, group: Group, now: int) -> None:
        """One group's due timers (what :meth:`tick` does for every group)."""
        if not group.members and not group.pending_members and group.state != PREPARING:
            return
        for pid, deadline in list(group.pending_members.items()):
            if now >= deadline:
                log.info("group %s: pending member %s expired (no JoinGroup with its id)", group.group_id, pid)
                del group.pending_members[pid]
                self._try_complete_join(group)
        for m in list(group.members.values()):
            if m.heartbeat_deadline is not None and now >= m.heartbeat_deadline and group.has(m.member_id):
                m.heartbeat_deadline = None
                # members waiting in a rebalance count as alive, except new ones
                if m.is_new or not (m.awaiting_join or m.awaiting_sync):
                    self._remove_member_and_update_group(group, m, "session timeout expired")
        if group.state == PREPARING and group.join_deadline is not None and now >= group.join_deadline:
            self._on_join_deadline(group)
        if group.sync_deadline is not None and now >= group.sync_deadline:
            group.sync_deadline = None
            if group.state in (COMPLETING, STABLE) and group.pending_sync:
                late = sorted(group.pending_sync)
                log.info("group %s: members %s sent no SyncGroup in time", group.group_id, late)
                for mid in late:
                    self._drop_member(group, mid, E.unknown_member_id)
                self._prepare_rebalance(group, "SyncGroup timeout")
        self._maybe_drop(group)

    # -- offsets -------------------------------------------------------------------

    def validate_offset_commit(
        self, group: Group, generation_id: int, member_id: str, instance_id: str | None, is_transactional: bool = False
    ) -> int | None:
        """Kafka's ClassicGroup.validateOffsetCommit (also for TxnOffsetCommit, KIP-447)."""
        if group.state == DEAD:
            return int(E.coordinator_not_available)
        if generation_id < 0 and group.state == EMPTY:
            return None  # admin client or a consumer without group management
        if generation_id >= 0 or member_id != "" or instance_id is not None:
            error = self._validate_member(group, member_id, instance_id)
            if error is not None:
                return error
            if generation_id != group.generation_id:
                return int(E.illegal_generation)
        elif not is_transactional and group.state != EMPTY:
            return int(E.unknown_member_id)
        if not is_transactional and group.state == COMPLETING:
            return int(E.rebalance_in_progress)
        return None

    def commit_offsets(
        self,
        group_id: str | None,
        generation_id: int,
        member_id: str,
        instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> tuple[dict[TopicPartition, int], Any]:
        """Validate and store; returns (per-partition errors, future of durability or None).

        Partitions with error 0 are stored once the future resolves.
        """
        self._expire_due(group_id)
        if group_id is None:
            return {tp: int(E.invalid_group_id) for tp in offsets}, None
        group = self._commit_group(group_id, generation_id)
        if group is None:
            return {tp: int(E.illegal_generation) for tp in offsets}, None
        error = self.validate_offset_commit(group, generation_id, member_id, instance_id)
        if error is not None:
            self._maybe_drop(group)
            return {tp: error for tp in offsets}, None
        if group.state in (STABLE, PREPARING) and group.has(member_id):
            self._reschedule(group, group.members[member_id])
        errors, accepted = self._check_metadata(offsets)
        fut = self.store.commit(group_id, accepted) if accepted else None
        if not accepted:
            self._maybe_drop(group)
        return errors, fut

    def _commit_group(self, group_id: str, generation_id: int) -> Group | None:
        """The group an offset commit is for; an unknown group is created as a "simple" group when the
        commit carries no generation (< 0), else None (ILLEGAL_GENERATION)."""
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return None
            group = self.groups[group_id] = Group(group_id, self.clock())
        return group

    def _check_metadata(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, OffsetAndMetadata]]:
        """(per-partition errors, the offsets to store): metadata above offset.metadata.max.bytes is
        OFFSET_METADATA_TOO_LARGE for its partition; a null metadata is stored as ""."""
        errors: dict[TopicPartition, int] = {}
        accepted: dict[TopicPartition, OffsetAndMetadata] = {}
        limit = self.config.offset_metadata_max_bytes
        for tp, om in offsets.items():
            if om.metadata is not None and len(om.metadata) > limit:
                errors[tp] = int(E.offset_metadata_too_large)
            else:
                errors[tp] = 0
                accepted[tp] = om if om.metadata is not None else om._replace(metadata="")
        return errors, accepted

    def txn_commit_offsets(
        self,
        group_id: str | None,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> tuple[dict[TopicPartition, int], Any]:
        """TxnOffsetCommit (Kafka's commitTransactionalOffset): validate and store as pending.

        Returns (per-partition errors, future of durability or None). The
        offsets stay invisible to OffsetFetch until the transaction's COMMIT
        marker is durable (:meth:`OffsetStore.write_marker`); an ABORT drops
        them. The transaction itself (is the producer in one that holds the
        offsets partition?) is checked by the caller, before this.

        Errors: an empty group id -> INVALID_GROUP_ID; a group that does not
        exist -> ILLEGAL_GENERATION if ``generation_id`` >= 0, else it is
        created as a simple group; then KIP-447's member checks
        (:meth:`validate_offset_commit` with ``is_transactional``: FENCED_INSTANCE_ID,
        UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION; generation -1 with an empty
        member id passes in any state, for v0-v2 clients and producers
        outside the group; no REBALANCE_IN_PROGRESS); metadata above
        ``offset.metadata.max.bytes`` -> OFFSET_METADATA_TOO_LARGE for that
        partition; a producer epoch older than the producer's pending
        offsets -> INVALID_PRODUCER_EPOCH. A transactional commit does not
        count as a heartbeat (Kafka does not reschedule the member either).
        """
        if not group_id:
            return {tp: int(E.invalid_group_id) for tp in offsets}, None
        self._expire_due(group_id)
        group = self._commit_group(group_id, generation_id)
        if group is None:
            return {tp: int(E.illegal_generation) for tp in offsets}, None
        error = self.validate_offset_commit(group, generation_id, member_id, instance_id, is_transactional=True)
        if error is not None:
            self._maybe_drop(group)
            return {tp: error for tp in offsets}, None
        errors, accepted = self._check_metadata(offsets)
        fut = None
        if accepted:
            try:
                fut = self.store.txn_commit(group_id, producer_id, producer_epoch, accepted)
            except KafkaError as exc:
                errors = {tp: int(exc.code) for tp in offsets}
                accepted = {}
        if not accepted:
            self._maybe_drop(group)
        return errors, fut

    def has_pending_txn_offsets(self, group_id: str | None, tp: TopicPartition) -> bool:
        """True while a transaction holds pending offsets of ``group_id`` for ``tp``
        (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT then)."""
        return group_id is not None and self.store.has_pending(group_id, tp)

    def fetch_offsets(
        self, group_id: str | None, partitions: Iterable[TopicPartition] | None
    ) -> tuple[int, list[tuple[TopicPartition, int, int, str]]]:
        """(group error, [(tp, offset, leader_epoch, metadata)]): -1 for unknown offsets, no error.

        A group that does not exist answers -1 everywhere without an error,
        as Kafka's classic coordinator does (librdkafka consumers in assign
        mode depend on it).
        """
        if group_id is None:
            return int(E.invalid_group_id), []
        if self.store.offline:
            # the offsets log's directory failed: this broker no longer coordinates (Kafka's
            # coordinator of a partition in an offline log directory resigns)
            return int(E.not_coordinator), []
        stored = self.store.group_offsets(group_id)
        group = self.groups.get(group_id)
        if group is not None and group.state == DEAD:
            stored = {}
        tps = list(stored) if partitions is None else [TopicPartition(*tp) for tp in partitions]
        out = []
        for tp in tps:
            om = stored.get(tp)
            if om is None:
                out.append((tp, -1, -1, ""))
            else:
                out.append((tp, om.offset, om.leader_epoch, om.metadata))
        return 0, out

    def delete_offsets(self, group_id: str | None, partitions: list[TopicPartition]) -> tuple[int, dict[TopicPartition, int], Any]:
        """OffsetDelete: (group error, per-partition errors, durability future or None)."""
        self._expire_due(group_id)
        if not group_id:
            return int(E.invalid_group_id), {}, None
        group = self.groups.get(group_id)
        if group is None or group.state == DEAD:
            return int(E.group_id_not_found), {}, None
        errors: dict[TopicPartition, int] = {}
        eligible: list[TopicPartition] = []
        if group.state == EMPTY:
            eligible = list(partitions)
        elif group.protocol_type == CONSUMER_PROTOCOL_TYPE:
            for tp in partitions:
                if group.is_subscribed_to(tp.topic):
                    errors[tp] = int(E.group_subscribed_to_topic)
                else:
                    eligible.append(tp)
        else:
            return int(E.non_empty_group), {}, None
        # a tombstone also drops pending transactional offsets (Kafka writes one for those too)
        present = [
            tp for tp in eligible if self.store.get(group_id, tp) is not None or self.store.has_pending(group_id, tp)
        ]
        fut = self.store.delete_offsets(group_id, present) if present else None
        for tp in eligible:
            errors[tp] = 0
        return 0, errors, fut

    def expire_offsets(self, now: int | None = None) -> int:
        """offsets.retention.minutes (KIP-211); drops empty groups left without offsets."""
        now = self.clock() if now is None else now
        retention = self.config.offsets_retention_ms
        removed = 0
        for group in list(self.groups.values()):
            offsets = dict(self.store.group_offsets(group.group_id))
            expired: list[TopicPartition] = []
            if offsets:
                if group.protocol_type is not None and group.state == EMPTY:
                    base = group.state_timestamp
                    expired = [tp for tp, om in offsets.items() if self._expired(om, now, retention, base)]
                elif (
                    group.protocol_type == CONSUMER_PROTOCOL_TYPE
                    and group.subscribed_topics is not None
                    and group.state == STABLE
                ):
                    expired = [
                        tp
                        for tp, om in offsets.items()
                        if tp.topic not in group.subscribed_topics and self._expired(om, now, retention, None)
                    ]
                elif group.protocol_type is None:
                    expired = [tp for tp, om in offsets.items() if self._expired(om, now, retention, None)]
            # an offset with pending transactional offsets does not expire yet (Kafka neither)
            expired = [tp for tp in expired if not self.store.has_pending(group.group_id, tp)]
            if expired:
                self.store.delete_offsets(group.group_id, expired)
                removed += len(expired)
                log.info("group %s: expired offsets of %d partitions", group.group_id, len(expired))
            if group.state == EMPTY and not group.members and not group.pending_members:
                if len(expired) == len(offsets) and not self.store.has_pending(group.group_id):
                    self._delete_group(group)
        return removed

    def on_topic_deleted(self, topic: str) -> int:
        """Forget the committed offsets of a deleted topic (Kafka does the same);
        Empty groups left without offsets are deleted."""
        removed = 0
        for gid in dict.fromkeys([*self.store.offsets, *self.store.pending_groups()]):
            # committed and pending offsets alike (Kafka deletes both)
            held = dict.fromkeys([*self.store.group_offsets(gid), *self.store.pending_partitions(gid)])
            doomed = [tp for tp in held if tp.topic == topic]
            if not doomed:
                continue
            left = len(held) - len(doomed)
            self.store.delete_offsets(gid, doomed)
            removed += len(doomed)
            group = self.groups.get(gid)
            if group is not None and not left and group.state == EMPTY and not group.members and not group.pending_members:
                self._delete_group(group)
        return removed

    @staticmethod
    def _expired(om: OffsetAndMetadata, now: int, retention: int, base: int | None) -> bool:
        if om.expire_timestamp is not None:
            return now >= om.expire_timestamp
        start = base if base is not None else om.commit_timestamp
        return now - start >= retention

    def _delete_group(self, group: Group) -> Any:
        """Mark ``group`` Dead, forget it and write its tombstones. If that write fails (the
        append's or the fsync's OSError, or a cancellation at shutdown) the group is put back
        as it was, as Kafka's runtime reverts the in-memory state of a failed write: the
        client's retry then finds it and deletes it again, rather than GROUP_ID_NOT_FOUND
        while its offsets are still served."""
        prev_state, prev_ts = group.state, group.state_timestamp
        if group.state != DEAD:
            group.transition(DEAD, self.clock())
        self.groups.pop(group.group_id, None)
        gid = group.group_id
        if not (self.store.has_offsets(gid) or self.store.has_pending(gid) or gid in self.store.group_records):
            return None
        fut = self.store.delete_group(gid)
        if fut is None:
            return None

        def revert(f: Any) -> None:
            exc = asyncio.CancelledError() if f.cancelled() else f.exception()
            if exc is None:
                return
            if prev_state == DEAD or self.groups.get(gid) is not None:
                return  # a new group of that id was created meanwhile: it stays
            group.state, group.state_timestamp = prev_state, prev_ts  # a revert, not a transition
            self.groups[gid] = group
            log.warning("group %s: its deletion was not written (%s); the group is kept", gid, exc or "cancelled")

        if fut.done():  # an append that failed at once: revert before anyone looks
            revert(fut)
        else:
            fut.add_done_callback(revert)
        return fut

    def delete_groups(self, group_ids: list[str]) -> tuple[dict[str, int], list[Any]]:
        errors: dict[str, int] = {}
        futures = []
        for gid in group_ids:
            if gid is None:
                errors[gid] = int(E.invalid_group_id)
                continue
            self._expire_due(gid)
            group = self.groups.get(gid)
            if group is None or group.state == DEAD:
                errors[gid] = int(E.group_id_not_found)
            elif group.state == EMPTY and not group.pending_members:
                fut = self._delete_group(group)
                if fut is not None:
                    futures.append(fut)
                errors[gid] = 0
            else:
                errors[gid] = int(E.non_empty_group)
        return errors, futures

    # -- listing -------------------------------------------------------------------

    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> list[dict[str, Any]]:
        self.tick()  # every group's due expirations first: states are exact
        states_l = {s.lower() for s in states}
        types_l = {t.lower() for t in types}
        if types_l and GROUP_TYPE not in types_l:
            return []
        out = []
        for group in self.groups.values():
            if group.state == DEAD:
                continue
            if states_l and str(group.state).lower() not in states_l:
                continue
            out.append(
                {
                    "group_id": group.group_id,
                    "protocol_type": group.protocol_type or "",
                    "group_state": str(group.state),
                    "group_type": GROUP_TYPE,
                }
            )
        return out

    def describe_group(self, group_id: str) -> dict[str, Any] | None:
        self._expire_due(group_id)
        group = self.groups.get(group_id)
        if group is None or group.state == DEAD:
            return None
        stable = group.state == STABLE and group.protocol_name is not None
        members = []
        for m in group.members.values():
            members.append(
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata(group.protocol_name) if stable else b"",  # type: ignore[arg-type]
                    "member_assignment": m.assignment if stable else b"",
                }
            )
        return {
            "group_id": group.group_id,
            "group_state": str(group.state),
            "protocol_type": group.protocol_type or "",
            "protocol_data": group.protocol_name if stable else "",
            "members": members,
        }

    # -- persistence -----------------------------------------------------------------

    def _group_record(self, group: Group, assignment: Mapping[str, bytes]) -> dict[str, Any]:
        members = []
        if group.protocol_name is not None:
            for m in group.members.values():
                members.append(
                    {
                        "id": m.member_id,
                        "instance": m.group_instance_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "rebalance_timeout": m.rebalance_timeout_ms,
                        "session_timeout": m.session_timeout_ms,
                        "subscription": base64.b64encode(m.metadata(group.protocol_name)).decode(),
                        "assignment": base64.b64encode(assignment.get(m.member_id, b"")).decode(),
                    }
                )
        return {
            "protocol_type": group.protocol_type,
            "generation": group.generation_id,
            "protocol": group.protocol_name,
            "leader": group.leader_id if members else None,
            "state_ts": group.state_timestamp,
            "members": members,
        }

    def _store_group(self, group: Group, assignment: Mapping[str, bytes], done: Callable[[int | None], None]) -> None:
        fut = self.store.store_group(group.group_id, self._group_record(group, assignment))
        if fut is None:
            done(None)
        else:
            fut.add_done_callback(lambda f: done(_storage_error(f)))

    def _load(self) -> None:
        now = self.clock()
        for gid, rec in self.store.group_records.items():
            group = Group(gid, now)
            group.generation_id = int(rec.get("generation", 0))
            group.protocol_type = rec.get("protocol_type")
            group.protocol_name = rec.get("protocol")
            if rec.get("state_ts") is not None:
                group.state_timestamp = int(rec["state_ts"])
            for mr in rec.get("members", []):
                member = Member(
                    mr["id"], mr.get("instance"), mr.get("client_id", ""), mr.get("client_host", ""),
                    int(mr["rebalance_timeout"]), int(mr["session_timeout"]), group.protocol_type or "",
                    [(group.protocol_name or "", base64.b64decode(mr["subscription"]))],
                    assignment=base64.b64decode(mr["assignment"]),
                )  # fmt: skip
                group.add(member)
                member.heartbeat_deadline = now + member.session_timeout_ms
            if group.members:
                group.leader_id = rec.get("leader") if rec.get("leader") in group.members else next(iter(group.members))
                group.state = STABLE
                group.subscribed_topics = group.compute_subscribed_topics()
            else:
                group.protocol_name = None
            self.groups[gid] = group
        for gid in [*self.store.offsets, *self.store.pending_groups()]:  # offsets, committed or pending, make a simple group
            if gid not in self.groups:
                self.groups[gid] = Group(gid, now)
        if self.groups:
            log.info("loaded %d groups", len(self.groups))
