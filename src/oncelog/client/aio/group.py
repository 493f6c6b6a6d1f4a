"""Consumer-group membership (the classic group protocol), asyncio.

:class:`GroupMember` is one member of a consumer group: it finds the group
coordinator, joins (JoinGroup, with the KIP-394 MEMBER_ID_REQUIRED retry),
synchronises (SyncGroup; as leader it runs the assignor the group agreed
on, see :mod:`oncelog.client.assignors`), heartbeats every
``heartbeat.interval.ms``, and leaves (LeaveGroup) on close unless it is a
static member (``group.instance.id``). The consumer and the transact session
build on it; it needs no fetching and can be driven on its own::

    member = GroupMember(cluster, config, ["orders"], on_assign=..., on_revoke=..., on_lost=...)
    await member.start()
    await member.wait_assigned()        # first assignment done (callbacks completed)
    ...
    member.poll_happened()              # the consumer calls this on every poll
    await member.commit({("orders", 0): 42})
    await member.close()

Callbacks get a sorted list of ``(topic, partition)`` and may be coroutine
functions: the member awaits them before it goes on, so a revoke callback can
hold a rebalance until, say, an in-flight EndTxn completes. Heartbeats keep
running meanwhile (as in Kafka's consumer, whose heartbeat thread runs while
the application's callbacks do); the coordinator waits for the member's
JoinGroup up to the rebalance timeout.

* ``on_assign(partitions)``: partitions the member now owns. Eager: the whole
  new assignment; cooperative: the added ones (possibly none).
* ``on_revoke(partitions)``: partitions given up in an orderly way, before
  another member may get them. Eager: everything, before every JoinGroup
  (and on close); cooperative: only the partitions that move, after
  SyncGroup, followed by a new JoinGroup (as Kafka's ConsumerCoordinator).
* ``on_lost(partitions)``: partitions the member no longer owns and that
  another member may already own: its generation ended without an orderly
  revoke (ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID from Heartbeat, SyncGroup or
  OffsetCommit, the poll interval expired). Defaults to ``on_revoke`` when not
  given, as in Kafka.

The rebalance protocol is cooperative when every configured assignor
supports it (``partition.assignment.strategy = cooperative-sticky``), eager
otherwise (Kafka's rule; the default ``range, cooperative-sticky`` is eager).

``max.poll.interval.ms``: if :meth:`GroupMember.poll_happened` is not called
for that long while the member is in the group, it leaves as Kafka's consumer
does: LeaveGroup (dynamic members only; a static member stops heartbeating),
its generation is reset, its partitions are ``on_lost``, and it rejoins on the
next ``poll_happened()``.
The rebalance timeout sent in JoinGroup is ``max.poll.interval.ms``, as in
Kafka's consumer (which has no separate ``rebalance.timeout.ms``); the
``rebalance_timeout_ms`` argument overrides it.

Fatal errors (FENCED_INSTANCE_ID, GROUP_AUTHORIZATION_FAILED,
INCONSISTENT_GROUP_PROTOCOL, GROUP_MAX_SIZE_REACHED, INVALID_SESSION_TIMEOUT,
...) stop the member; ``member.error`` holds the typed exception and every
later call raises it.

For exactly-once (KIP-447) the member exposes :attr:`generation_id`,
:attr:`member_id`, :attr:`group_instance_id`, :meth:`group_metadata` (what
``send_offsets_to_transaction`` takes) and :meth:`heartbeat_now`, which
sends one heartbeat and raises unless it succeeds with the member still in
its generation (heartbeat before commit).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from oncelog.client.aio.transactions import ConsumerGroupMetadata
from oncelog.client.aio.cluster import COORDINATOR_ERRORS, Cluster
from oncelog.client.aio.offsets import (
    OffsetAndMetadata,
    commit_offsets,
    fetch_offsets,
)
from oncelog.client.assignors import (
    ASSIGNORS,
    COOPERATIVE,
    Assignment,
    MemberSubscription,
    ProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    rebalance_protocol,
    subscription_user_data,
)
from oncelog.client.config import ClientConfig, ConfigError
from oncelog.client.errors import ClientClosedError, KafkaError, error_for
from oncelog.protocol.errors import ErrorCode

__all__ = ["ConsumerGroupMetadata", "GroupMember", "TopicPartition"]

log = logging.getLogger("oncelog.client.group")

JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
JOIN_GROUP_VERSIONS = (2, 9)
SYNC_GROUP_VERSIONS = (1, 5)
HEARTBEAT_VERSIONS = (1, 4)
LEAVE_GROUP_VERSIONS = (1, 5)
GROUP_KEY = 0
PROTOCOL_TYPE = "consumer"

TopicPartition = tuple[str, int]
Callback = Callable[[list[TopicPartition]], Any]


def _code(name: str) -> int:
    return int(getattr(ErrorCode, name).value)


REBALANCE_IN_PROGRESS = _code("rebalance_in_progress")
ILLEGAL_GENERATION = _code("illegal_generation")
UNKNOWN_MEMBER_ID = _code("unknown_member_id")
MEMBER_ID_REQUIRED = _code("member_id_required")
FENCED_INSTANCE_ID = _code("fenced_instance_id")
GENERATION_LOST = frozenset({ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID})


class _Rejoin(Exception):
    """Internal: the join/sync round must start again (after ``delay`` seconds)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay


class GroupMember:
    """One member of a consumer group; see the module docstring."""

    def __init__(self, cluster: Cluster, config: ClientConfig, topics: Iterable[str] = (), *,
                 on_assign: Callback | None = None, on_revoke: Callback | None = None,
                 on_lost: Callback | None = None, rebalance_timeout_ms: int | None = None) -> None:
        group_id = config["group.id"]
        if not group_id:
            raise ConfigError("group.id is required for group membership")
        self.cluster = cluster
        self.config = config
        self.group_id: str = group_id
        self.group_instance_id: str | None = config["group.instance.id"] or None
        self.assignor_names: list[str] = list(config["partition.assignment.strategy"])
        for n in self.assignor_names:
            if n not in ASSIGNORS:
                raise ConfigError(f"partition.assignment.strategy: unknown assignor {n!r}")
        self.protocol = rebalance_protocol(self.assignor_names)
        self.session_timeout_ms: int = config["session.timeout.ms"]
        self.heartbeat_interval_ms: int = config["heartbeat.interval.ms"]
        self.max_poll_interval_ms: int = config["max.poll.interval.ms"]
        self.rebalance_timeout_ms: int = rebalance_timeout_ms or self.max_poll_interval_ms
        self.on_assign, self.on_revoke, self.on_lost = on_assign, on_revoke, on_lost
        self._topics: list[str] = sorted(set(topics))
        self.generation_id = -1
        self.member_id = ""
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self._assignment: set[TopicPartition] = set()
        self.error: KafkaError | None = None
        self._state = "unjoined"  # unjoined | joining | stable | closed
        self._rejoin_needed = True
        self._lost_pending = False
        self._poll_expired = False
        self._wakeup = asyncio.Event()
        self._assigned = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._hb_task: asyncio.Task[None] | None = None
        self._join_conn: Any = None  # the connection of the last JoinGroup (see _drop_join_connection)
        self._last_poll = time.monotonic()
        self._last_heartbeat_ok = time.monotonic()
        self._group_metadata_topics: dict[str, int] = {}
        self.rebalances = 0
        self._join_epoch = 0
        self._metadata_checked = time.monotonic()
        self._metadata_task: asyncio.Task[None] | None = None

    # -- public state -------------------------------------------------------------------

    @property
    def assignment(self) -> list[TopicPartition]:
        """The partitions this member owns now (after ``on_assign`` ran, before ``on_revoke``/``on_lost``)."""
        return sorted(self._assignment)

    @property
    def in_group(self) -> bool:
        """True while the member holds a generation of the group (stable, callbacks may still run)."""
        return self._state == "stable" and self.generation_id >= 0 and bool(self.member_id)

    @property
    def subscription(self) -> list[str]:
        """The topics this member subscribes to (sorted)."""
        return list(self._topics)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group's generation as ``send_offsets_to_transaction`` takes it (KIP-447)."""
        return ConsumerGroupMetadata(self.group_id, self.generation_id, self.member_id, self.group_instance_id)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start joining the group in the background (returns at once)."""
        if self._task is None:
            self._last_poll = time.monotonic()
            self._task = asyncio.ensure_future(self._run())
            self._hb_task = asyncio.ensure_future(self._heartbeat_loop())

    async def wait_assigned(self, timeout: float | None = None) -> list[TopicPartition]:
        """Wait until the member completed a rebalance (``on_assign`` done); returns its assignment."""
        self._check()
        await asyncio.wait_for(self._wait_assigned(), timeout)
        return self.assignment

    async def _wait_assigned(self) -> None:
        while True:
            self._check()
            if self._assigned.is_set() and self._state == "stable" and not self._rejoin_needed:
                return
            if self._task is not None and self._task.done():
                raise ClientClosedError("group member stopped")
            try:
                async with asyncio.timeout(0.1):  # not wait_for: it can swallow a cancellation (3.11)
                    await self._assigned.wait()
            except TimeoutError:
                pass

    def subscribe(self, topics: Iterable[str]) -> None:
        """Change the subscription; rejoins when it differs."""
        new = sorted(set(topics))
        if new != self._topics:
            self._topics = new
            self.request_rejoin("subscription changed")

    def request_rejoin(self, reason: str = "requested") -> None:
        """Start a new rebalance (as Kafka's ``enforceRebalance``)."""
        if not self._rejoin_needed:
            log.info("group %s member %s: rejoining (%s)", self.group_id, self.member_id, reason)
        self._rejoin_needed = True
        self._assigned.clear()
        self._wakeup.set()

    def poll_happened(self) -> None:
        """The consumer polled: resets the ``max.poll.interval.ms`` clock, rejoins after an expiry."""
        self._last_poll = time.monotonic()
        if self._poll_expired:
            self._poll_expired = False
            self.request_rejoin("poll after max.poll.interval.ms expired")

    async def close(self, *, leave: bool = True) -> None:
        """Revoke the assignment (awaiting ``on_revoke``), leave the group (dynamic members), stop.

        ``leave=False`` skips LeaveGroup (the member's session then times out),
        as a consumer closed with ``internal.leave.group.on.close=false``.
        """
        if self._state == "closed":
            return
        self._closing = True
        joining = self._state == "joining"
        for t in (self._task, self._hb_task, self._metadata_task):
            if t is not None and not t.done():
                t.cancel()
        for t in (self._task, self._hb_task, self._metadata_task):
            if t is not None:
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        if joining:
            self._drop_join_connection()
        try:
            if self._assignment:
                # Java's onLeavePrepare: lost, not revoked, without a generation or while a rebalance is in
                # progress (a commit from on_revoke would fail with REBALANCE_IN_PROGRESS)
                if self.generation_id >= 0 and not self._lost_pending and not joining:
                    await self._invoke(self.on_revoke, self._assignment)
                else:
                    await self._invoke(self.on_lost or self.on_revoke, self._assignment)
                self._assignment = set()
            if leave and self.group_instance_id is None and self.member_id:
                await self._leave("the consumer is being closed", fresh=True)
        finally:
            self._state = "closed"
            self.generation_id, self.member_id = -1, ""
            self._wakeup.set()

    # -- heartbeats --------------------------------------------------------------------------------

    async def heartbeat_now(self) -> None:
        """Send one heartbeat now; raises unless the member is in the group and the heartbeat succeeded.

        Raises the typed error (``RebalanceInProgressError``,
        ``IllegalGenerationError``, ``UnknownMemberIdError``,
        ``FencedInstanceIdError``, a connection error, ...) or
        ``IllegalGenerationError`` when the member holds no generation. For the
        transact session's heartbeat before commit: a rebalance in progress
        means the partitions may move, so it fails too.
        """
        self._check()
        if not self.in_group:
            raise error_for(ILLEGAL_GENERATION, f"member {self.member_id!r} of group {self.group_id!r} is not "
                                                f"in a generation (state {self._state})")
        code = await self._send_heartbeat()
        if code:
            raise error_for(code, f"heartbeat of member {self.member_id!r} in group {self.group_id!r}")

    async def _send_heartbeat(self) -> int:
        """One Heartbeat; handles its error (rejoin, lost, fatal) and returns the error code (0: ok)."""
        gen, mid, epoch = self.generation_id, self.member_id, self._join_epoch
        try:
            conn = await self._coordinator_conn()
            v = conn.version(HEARTBEAT, HEARTBEAT_VERSIONS)
            resp = await conn.request(HEARTBEAT, v, {"group_id": self.group_id, "generation_id": gen,
                                                     "member_id": mid, "group_instance_id": self.group_instance_id})
            code = int(resp.error_code)
        except KafkaError as exc:
            self.cluster.forget_coordinator(GROUP_KEY, self.group_id)
            if not exc.retriable:
                raise
            return exc.code
        if code == 0:
            self._last_heartbeat_ok = time.monotonic()
        elif (gen, mid, epoch) != (self.generation_id, self.member_id, self._join_epoch):
            pass  # sent before the current join round began: its news is already acted on
        elif code == REBALANCE_IN_PROGRESS:
            self.request_rejoin("the coordinator started a rebalance")
        elif code in GENERATION_LOST:
            self._generation_lost(code, "heartbeat")
        elif code == FENCED_INSTANCE_ID:
            self._fatal(error_for(code, f"group.instance.id {self.group_instance_id!r} was fenced by another "
                                        f"member with the same id"))
        elif code in COORDINATOR_ERRORS:
            self.cluster.forget_coordinator(GROUP_KEY, self.group_id)
        elif not error_for(code).retriable:
            self._fatal(error_for(code, "heartbeat"))
        return code

    async def _heartbeat_loop(self) -> None:
        interval = self.heartbeat_interval_ms / 1000
        while not self._closing:
            await asyncio.sleep(min(interval, 0.1) if self._state != "stable" else interval)
            if self._closing or self.error is not None:
                return
            now = time.monotonic()
            if (self._state == "stable" and not self._poll_expired
                    and now - self._last_poll > self.max_poll_interval_ms / 1000):
                log.warning("group %s member %s: no poll for max.poll.interval.ms (%d ms); leaving the group",
                            self.group_id, self.member_id, self.max_poll_interval_ms)
                self._poll_expired = True
                if self.group_instance_id is None and self.member_id:
                    try:
                        await self._leave("consumer poll timeout has expired")
                    except KafkaError as exc:
                        log.info("LeaveGroup failed: %s", exc)
                self._generation_lost(0, "poll timeout", reset_member=True)
                continue
            if (self.in_group and self.leader_id == self.member_id and self._group_metadata_topics
                    and now - self._metadata_checked > self.config["metadata.max.age.ms"] / 1000
                    and (self._metadata_task is None or self._metadata_task.done())):
                self._metadata_checked = now
                self._metadata_task = asyncio.ensure_future(self._check_metadata())
            if self.in_group:
                try:
                    await self._send_heartbeat()
                except KafkaError as exc:
                    log.info("group %s: heartbeat failed: %s", self.group_id, exc)
                if now - self._last_heartbeat_ok > self.session_timeout_ms / 1000:
                    # the coordinator has probably expired us; find it again (Kafka marks it unknown)
                    self.cluster.forget_coordinator(GROUP_KEY, self.group_id)

    async def _check_metadata(self) -> None:
        """The leader's watch (as Kafka's): partitions added to a subscribed topic start a rebalance."""
        topics = sorted(self._group_metadata_topics)
        try:
            for t in topics:
                self.cluster.invalidate(t)
            await self.cluster.refresh(topics)
        except KafkaError as exc:
            log.info("group %s: metadata refresh failed: %s", self.group_id, exc)
            return
        now_counts = {t: (info.partitions if (info := self.cluster.topic(t)) is not None else 0) for t in topics}
        if self.in_group and now_counts != self._group_metadata_topics:
            self.request_rejoin(f"the partitions of subscribed topics changed: {self._group_metadata_topics} -> "
                                f"{now_counts}")

    # -- errors and state ---------------------------------------------------------------------------

    def _check(self) -> None:
        if self.error is not None:
            raise self.error
        if self._state == "closed":
            raise ClientClosedError(f"group member of {self.group_id!r} is closed")

    def _fatal(self, exc: KafkaError) -> None:
        if self.error is None:
            log.error("group %s: fatal error: %s", self.group_id, exc)
            self.error = exc
        self._assigned.set()
        self._wakeup.set()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    def _generation_lost(self, code: int, where: str, *, reset_member: bool | None = None) -> None:
        """The generation ended without an orderly revoke: partitions are lost, rejoin."""
        log.info("group %s member %s generation %d: %s after %s; partitions lost, rejoining", self.group_id,
                 self.member_id, self.generation_id, ErrorCode(code).name.upper() if code else "left", where)
        if reset_member is None:
            reset_member = code == UNKNOWN_MEMBER_ID  # Kafka keeps the member id on ILLEGAL_GENERATION
        self.generation_id = -1
        if reset_member:
            self.member_id = ""
        if self._assignment:
            self._lost_pending = True
        self._state = "unjoined"
        self.request_rejoin(where)

    async def _invoke(self, cb: Callback | None, parts: Iterable[TopicPartition]) -> None:
        if cb is None:
            return
        result = cb(sorted(parts))
        if inspect.isawaitable(result):
            await result

    async def _coordinator_conn(self) -> Any:
        node = await self.cluster.coordinator(GROUP_KEY, self.group_id)
        return await self.cluster.connection(node)

    # -- the join/sync loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.config["retry.backoff.ms"] / 1000
        while not self._closing and self.error is None:
            if self._lost_pending:
                self._lost_pending = False
                lost, self._assignment = self._assignment, set()
                await self._invoke(self.on_lost or self.on_revoke, lost)
            if self._poll_expired or not self._rejoin_needed:
                self._wakeup.clear()
                if self._poll_expired or not self._rejoin_needed:
                    await self._wakeup.wait()
                continue
            try:
                await self._join_and_sync()
                backoff = self.config["retry.backoff.ms"] / 1000
            except _Rejoin as r:
                self._rejoin_needed = True
                if r.delay:
                    await asyncio.sleep(r.delay)
            except KafkaError as exc:
                if not exc.retriable:
                    self._fatal(exc)
                    return
                log.info("group %s: join failed (%s); retrying in %.0f ms", self.group_id, exc, backoff * 1000)
                self.cluster.forget_coordinator(GROUP_KEY, self.group_id)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.config["retry.backoff.max.ms"] / 1000)

    async def _prepare_join(self) -> None:
        """Kafka's onJoinPrepare: eager revokes everything; cooperative only unsubscribed topics."""
        if not self._assignment:
            return
        if self.generation_id < 0:
            lost, self._assignment = self._assignment, set()
            await self._invoke(self.on_lost or self.on_revoke, lost)
            return
        if self.protocol == COOPERATIVE:
            gone = {tp for tp in self._assignment if tp[0] not in self._topics}
        else:
            gone = set(self._assignment)
        if gone:
            await self._invoke(self.on_revoke, gone)
            self._assignment -= gone

    def _protocols(self) -> list[dict[str, Any]]:
        owned = sorted(self._assignment)
        return [{"name": n, "metadata": encode_subscription(Subscription(
            self._topics, subscription_user_data(n, self.generation_id), owned, self.generation_id))}
            for n in self.assignor_names]

    async def _join_and_sync(self) -> None:
        await self._prepare_join()
        if self._closing:
            return
        self._state = "joining"
        self._join_epoch += 1
        self._rejoin_needed = False
        self._assigned.clear()
        conn = self._join_conn = await self._coordinator_conn()
        v = conn.version(JOIN_GROUP, JOIN_GROUP_VERSIONS)
        if self.group_instance_id is not None and v < 5:
            self._fatal(error_for(int(ErrorCode.unsupported_version.value),
                                  "static membership (group.instance.id) needs JoinGroup v5+"))
            return
        join_timeout = max(self.config["request.timeout.ms"] / 1000, self.rebalance_timeout_ms / 1000 + 5)
        while True:
            body = {"group_id": self.group_id, "session_timeout": self.session_timeout_ms,
                    "rebalance_timeout": self.rebalance_timeout_ms, "member_id": self.member_id,
                    "group_instance_id": self.group_instance_id, "protocol_type": PROTOCOL_TYPE,
                    "protocols": self._protocols(), "reason": None}
            resp = await conn.request(JOIN_GROUP, v, body, timeout=join_timeout)
            code = int(resp.error_code)
            if code == MEMBER_ID_REQUIRED:  # KIP-394: join again with the id the coordinator gave
                self.member_id = resp.member_id
                continue
            break
        if code:
            self._join_error(code, "JoinGroup")
        self.generation_id = int(resp.generation_id)
        self.member_id = resp.member_id
        self.protocol_name = resp.protocol_name
        self.leader_id = resp.leader
        self.rebalances += 1
        assignments: list[dict[str, Any]] = []
        if resp.leader == resp.member_id and not getattr(resp, "skip_assignment", False):
            assignments = await self._assign(resp.protocol_name or "", resp.members)
        sv = conn.version(SYNC_GROUP, SYNC_GROUP_VERSIONS)
        sresp = await conn.request(SYNC_GROUP, sv, {
            "group_id": self.group_id, "generation_id": self.generation_id, "member_id": self.member_id,
            "group_instance_id": self.group_instance_id, "protocol_type": PROTOCOL_TYPE,
            "protocol_name": self.protocol_name, "assignments": assignments}, timeout=join_timeout)
        code = int(sresp.error_code)
        if code:
            self._join_error(code, "SyncGroup")
        try:
            new = set(decode_assignment(sresp.assignment).partitions)
        except ProtocolError as exc:
            self._fatal(error_for(int(ErrorCode.inconsistent_group_protocol.value),
                                  f"cannot decode the assignment: {exc}"))
            return
        self._state = "stable"
        self._last_heartbeat_ok = time.monotonic()
        log.info("group %s member %s generation %d (%s, %s): assigned %s", self.group_id, self.member_id,
                 self.generation_id, self.protocol_name, self.protocol, sorted(new))
        if self.protocol == COOPERATIVE:
            revoked = self._assignment - new
            added = new - self._assignment
            if revoked:
                await self._invoke(self.on_revoke, revoked)
                self._assignment -= revoked
            self._assignment |= added
            await self._invoke(self.on_assign, added)
            if revoked:
                self.request_rejoin("cooperative: partitions revoked, rejoining so they can move")
                return
        else:
            self._assignment = new
            await self._invoke(self.on_assign, new)
        if not self._rejoin_needed:
            self._assigned.set()

    def _join_error(self, code: int, where: str) -> None:
        if code == REBALANCE_IN_PROGRESS:
            raise _Rejoin()
        if code in GENERATION_LOST:
            self._generation_lost(code, where)
            raise _Rejoin()
        if code in COORDINATOR_ERRORS:
            self.cluster.forget_coordinator(GROUP_KEY, self.group_id)
            raise _Rejoin(self.config["retry.backoff.ms"] / 1000)
        if code == FENCED_INSTANCE_ID:
            self._fatal(error_for(code, f"group.instance.id {self.group_instance_id!r} was fenced"))
            raise _Rejoin()
        err = error_for(code, f"{where} of group {self.group_id!r}")
        if err.retriable:
            raise _Rejoin(self.config["retry.backoff.ms"] / 1000)
        self._fatal(err)
        raise _Rejoin()

    async def _assign(self, protocol_name: str, members: Any) -> list[dict[str, Any]]:
        """The leader's part: run the agreed assignor over every member's subscription."""
        info = ASSIGNORS.get(protocol_name)
        if info is None:
            raise error_for(int(ErrorCode.inconsistent_group_protocol.value),
                            f"the group chose assignor {protocol_name!r}, which this client does not have")
        subs: list[MemberSubscription] = []
        for m in members:
            try:
                sub = decode_subscription(m.metadata)
            except ProtocolError as exc:
                log.warning("group %s: member %s sent an undecodable subscription (%s); treating it as empty",
                            self.group_id, m.member_id, exc)
                sub = Subscription([])
            subs.append(MemberSubscription(m.member_id, sub, m.group_instance_id))
        topics = sorted({t for s in subs for t in s.subscription.topics})
        if topics:
            await self.cluster.refresh(topics)
        ppt = {}
        for t in topics:
            info_t = self.cluster.topic(t)
            if info_t is not None and info_t.partitions:
                ppt[t] = info_t.partitions
        self._group_metadata_topics = {t: ppt.get(t, 0) for t in topics}
        self._metadata_checked = time.monotonic()
        result = info.assign(ppt, subs)
        log.info("group %s: leader %s assigned generation %d with %s: %s", self.group_id, self.member_id,
                 self.generation_id, protocol_name, {m: len(p) for m, p in result.items()})
        versions = {s.member_id: s.subscription.version for s in subs}
        return [{"member_id": mid, "assignment": encode_assignment(Assignment(
            parts, None, min(versions.get(mid, 0), 3)))} for mid, parts in sorted(result.items())]

    def _drop_join_connection(self) -> None:
        """Close the coordinator connection a cancelled JoinGroup/SyncGroup is still waiting on.

        The coordinator holds a JoinGroup's answer until the rebalance completes
        and answers one connection's requests in order, so a LeaveGroup sent
        behind it would only be read once the next generation had formed, with
        this member in it: the leave then starts yet another rebalance, and
        close() waits for the whole current one. On a new connection the
        coordinator reads the LeaveGroup at once and drops the member from the
        rebalance in progress (no new one): close() sends it on a connection of
        its own (:meth:`Cluster.fresh_coordinator_connection`), and the one the
        JoinGroup went on is closed here (known without the coordinator cache,
        which may have been cleared since)."""
        conn, self._join_conn = self._join_conn, None
        if conn is not None and not conn.closed and conn.in_flight:
            conn.close()

    async def _leave(self, reason: str, *, fresh: bool = False) -> None:
        """LeaveGroup; ``fresh``: on a new connection of its own, so that no request of the shared
        one (this member's JoinGroup, which the coordinator holds) is ahead of it."""
        own = None
        try:
            if fresh:
                conn = own = await self.cluster.fresh_coordinator_connection(GROUP_KEY, self.group_id)
            else:
                conn = await self._coordinator_conn()
            v = conn.version(LEAVE_GROUP, LEAVE_GROUP_VERSIONS)
            body = {"group_id": self.group_id, "member_id": self.member_id,
                    "members": [{"member_id": self.member_id, "group_instance_id": None, "reason": reason}]}
            resp = await conn.request(LEAVE_GROUP, v, body)
            code = int(resp.error_code)
            if code and code != UNKNOWN_MEMBER_ID:
                log.info("group %s: LeaveGroup answered %s", self.group_id, ErrorCode(code).name.upper())
        except KafkaError as exc:
            log.info("group %s: LeaveGroup failed: %s", self.group_id, exc)
        finally:
            if own is not None:
                own.close()

    # -- offsets ----------------------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata], *,
                     timeout: float | None = None) -> None:
        """Commit ``offsets`` (next offsets to consume) with this member's generation; raises typed errors.

        ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID mean the generation is over:
        the partitions are lost and the member rejoins (the error is raised,
        like Kafka's CommitFailedException). REBALANCE_IN_PROGRESS requests a
        rejoin and is raised.
        """
        self._check()
        gen, mid = self.generation_id, self.member_id
        try:
            await commit_offsets(self.cluster, self.group_id, offsets, generation_id=gen, member_id=mid,
                                 group_instance_id=self.group_instance_id, timeout=timeout)
        except KafkaError as exc:
            if (gen, mid) == (self.generation_id, self.member_id):
                if exc.code in GENERATION_LOST:
                    self._generation_lost(exc.code, "OffsetCommit")
                elif exc.code == REBALANCE_IN_PROGRESS:
                    self.request_rejoin("OffsetCommit: rebalance in progress")
                elif exc.code == FENCED_INSTANCE_ID:
                    self._fatal(exc)
            raise

    def commit_async(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata], *,
                     timeout: float | None = None) -> asyncio.Task[None]:
        """:meth:`commit` in the background; the task holds the result or the typed error."""
        return asyncio.ensure_future(self.commit(dict(offsets), timeout=timeout))

    async def committed(self, partitions: Iterable[TopicPartition] | None = None, *, require_stable: bool = False,
                        timeout: float | None = None) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets (None: none); ``require_stable`` waits out pending transactions."""
        self._check()
        return await fetch_offsets(self.cluster, self.group_id, self.assignment if partitions is None else partitions,
                                   require_stable=require_stable, timeout=timeout)

