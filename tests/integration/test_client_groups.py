"""oncelog.client's group membership (aio.group.GroupMember) against the real broker.

* Churn under each assignor: three of our members; one leaves, one joins,
  one is killed (its tasks stop and its connections close without
  LeaveGroup), another joins. Every assign/revoke/lost callback goes to one
  ownership log that fails on a partition handed to a member while another
  live member still holds it (revoke callbacks complete before the
  coordinator can give the partition away, so this is the "never owned twice
  at once" rule as the application sees it). After every step all partitions
  are owned, and offsets committed with the member's generation survive the
  rebalances.
* Mixed groups: our member with confluent-kafka and kafka-python consumers
  using the same assignor, ours first (our leader assigns for them) and
  theirs first (their leader assigns for us): the broker's view
  (DescribeGroups) and each member's own view are disjoint and complete.
* heartbeat_now raises once the member was kicked: the fault proxy holds its
  Heartbeats until the session times out.
* require_stable: OffsetFetch with require_stable waits while a transactional
  offset commit (confluent-kafka's send_offsets_to_transaction) is pending
  and returns it once the transaction commits.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.group import GroupMember
from oncelog.client.aio.offsets import fetch_offsets
from oncelog.client.config import parse_config
from oncelog.client.errors import KafkaError
from oncelog.client.groups import GroupAdmin
from oncelog.testing import EmbeddedBroker

from tests.integration.conftest import create_topic, wait_until

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

PARTITIONS = 6
SESSION_MS = 6000
HEARTBEAT_MS = 300
BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0", "oncelog.group.coordinator.tick.ms": "50"}


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def gbroker(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("client-groups")
    b = EmbeddedBroker(data_dir=d / "data", config=BROKER_CONFIG, log_path=d / "broker.log")
    b.start()
    try:
        yield b
    finally:
        b.close()


def member_config(bootstrap: str, group: str, assignor: str, **extra: Any):
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS, "partition.assignment.strategy": assignor,
            "retry.backoff.ms": 50, "reconnect.backoff.max.ms": 500}
    conf.update(extra)
    return parse_config(conf, "consumer")


class Ownership:
    """Assign/revoke/lost events of every member, checked as they arrive (one event loop, no locks)."""

    def __init__(self) -> None:
        self.owner: dict[tuple[str, int], str] = {}
        self.events: list[tuple[float, str, str, tuple[tuple[str, int], ...]]] = []
        self.violations: list[str] = []
        self.dead: set[str] = set()

    def assign(self, who: str, parts: list[tuple[str, int]]) -> None:
        self.events.append((time.monotonic(), who, "assign", tuple(parts)))
        for tp in parts:
            holder = self.owner.get(tp)
            if holder is not None and holder != who and holder not in self.dead:
                self.violations.append(f"{tp} assigned to {who} while {holder} holds it")
            self.owner[tp] = who

    def release(self, who: str, parts: list[tuple[str, int]], kind: str) -> None:
        self.events.append((time.monotonic(), who, kind, tuple(parts)))
        for tp in parts:
            if self.owner.get(tp) == who:
                del self.owner[tp]

    def died(self, who: str) -> None:
        self.dead.add(who)
        held = [tp for tp, w in self.owner.items() if w == who]
        self.release(who, held, "killed")

    def callbacks(self, who: str, slow_revoke: float = 0.0) -> dict[str, Any]:
        async def on_revoke(parts: list[tuple[str, int]]) -> None:
            if slow_revoke:  # a revoke that blocks (an in-flight EndTxn): nobody may get these meanwhile
                await asyncio.sleep(slow_revoke)
            self.release(who, parts, "revoke")

        return {"on_assign": lambda parts: self.assign(who, parts), "on_revoke": on_revoke,
                "on_lost": lambda parts: self.release(who, parts, "lost")}


async def start_member(name: str, own: Ownership, conf, topic: str, slow_revoke: float = 0.0) -> GroupMember:
    cluster = Cluster(conf)
    await cluster.start()
    m = GroupMember(cluster, conf, [topic], **own.callbacks(name, slow_revoke))
    m.name = name  # type: ignore[attr-defined]
    await m.start()
    return m


async def stop_member(m: GroupMember) -> None:
    await m.close()
    await m.cluster.close()


async def kill_member(m: GroupMember, own: Ownership) -> None:
    """As a process killed with SIGKILL: no callbacks, no LeaveGroup, connections just close."""
    for t in (m._task, m._hb_task):
        if t is not None:
            t.cancel()
    own.died(m.name)  # type: ignore[attr-defined]
    await m.cluster.close()


async def settled(members: list[GroupMember], own: Ownership, topic: str, timeout: float = 45.0,
                  partitions: int = PARTITIONS) -> None:
    """Wait until the live members own every partition between them, each in a stable generation."""
    want = {(topic, p) for p in range(partitions)}
    deadline = time.monotonic() + timeout
    while True:
        owned = {tp: w for tp, w in own.owner.items() if w not in own.dead}
        views = [set(m.assignment) for m in members]
        balanced = max(map(len, views)) - min(map(len, views)) <= 1  # one topic, equal subscriptions
        consistent = all(v == {tp for tp, w in owned.items() if w == m.name}  # type: ignore[attr-defined]
                         for m, v in zip(members, views))
        if (set(owned) == want and all(m.in_group and not m._rejoin_needed for m in members) and balanced
                and consistent and sum(len(v) for v in views) == partitions and set().union(*views) == want):
            gens = {m.generation_id for m in members}
            if len(gens) == 1:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"group did not settle: owner={owned}, views={[sorted(v) for v in views]}, "
                                 f"gens={[m.generation_id for m in members]}")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_three_members_with_churn_never_share_a_partition(gbroker: EmbeddedBroker, assignor: str) -> None:
    topic = fresh("churn")
    create_topic(gbroker.bootstrap, topic, PARTITIONS)
    asyncio.run(churn(gbroker.bootstrap, topic, assignor))


async def churn(bootstrap: str, topic: str, assignor: str) -> None:
    """A, B, C join; A leaves; D joins; B is killed; E joins. Checked after every step."""
    group = fresh("g-churn")
    own = Ownership()
    conf = member_config(bootstrap, group, assignor)
    committed: dict[tuple[str, int], int] = {}

    async def commit_round(members: list[GroupMember]) -> None:
        for m in members:
            offs = {tp: committed.get(tp, 0) + 10 for tp in m.assignment}
            await m.commit(offs)
            committed.update(offs)

    a = await start_member("A", own, conf, topic, slow_revoke=0.3)
    b = await start_member("B", own, conf, topic, slow_revoke=0.3)
    c = await start_member("C", own, conf, topic)
    live = [a, b, c]
    await settled(live, own, topic)
    await commit_round(live)
    # A leaves (LeaveGroup, revoke first)
    await stop_member(a)
    live = [b, c]
    await settled(live, own, topic)
    await commit_round(live)
    # D joins
    d = await start_member("D", own, conf, topic)
    live = [b, c, d]
    await settled(live, own, topic)
    await commit_round(live)
    # B is killed: no leave; its session expires and its partitions move
    await kill_member(b, own)
    live = [c, d]
    await settled(live, own, topic, timeout=SESSION_MS / 1000 + 30)
    await commit_round(live)
    # E joins
    e = await start_member("E", own, conf, topic)
    live = [c, d, e]
    await settled(live, own, topic)
    # offsets committed before the rebalances are still there, for every partition
    got = await e.committed([(topic, p) for p in range(PARTITIONS)])
    assert {tp: om.offset for tp, om in got.items() if om is not None} == committed
    assert len(committed) == PARTITIONS
    for m in live:
        await stop_member(m)
    assert not own.violations, own.violations
    kinds = {k for _, _, k, _ in own.events}
    assert {"assign", "revoke", "killed"} <= kinds
    if assignor == "cooperative-sticky":
        # incremental: the members that stayed never gave up everything at a rebalance
        assert all(len(ps) < PARTITIONS for _, w, k, ps in own.events if k == "revoke" and w != "A")


# -- a second, independent broker: librdkafka's mock cluster ----------------------------------------------


@pytest.fixture
def mock_cluster():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "common.py"
    spec = importlib.util.spec_from_file_location("oncelog_bench_common", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with mod.MockCluster(1) as mc:
        yield mc


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_churn_against_librdkafkas_mock_cluster(mock_cluster: Any, assignor: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The same churn against another Kafka implementation, so nothing depends on oncelog's quirks.

    The mock advertises flexible versions of the group APIs that librdkafka's own
    client never sends, and misreads them (SyncGroup v4: "Protocol read buffer
    underflow"; JoinGroup v6 closes the connection). Here the member is held to
    the versions librdkafka's client uses, as a broker advertising only those would.
    """
    from oncelog.client.aio import group as group_mod
    from oncelog.client.aio import offsets as offsets_mod

    for mod, name, versions in ((group_mod, "JOIN_GROUP_VERSIONS", (2, 5)), (group_mod, "SYNC_GROUP_VERSIONS", (1, 3)),
                                (group_mod, "HEARTBEAT_VERSIONS", (1, 3)), (group_mod, "LEAVE_GROUP_VERSIONS", (1, 3)),
                                (offsets_mod, "OFFSET_COMMIT_VERSIONS", (2, 7)),
                                (offsets_mod, "OFFSET_FETCH_VERSIONS", (1, 5))):
        monkeypatch.setattr(mod, name, versions)
    topic = fresh("mock-churn")
    mock_cluster.create_topic(topic, PARTITIONS)
    asyncio.run(churn(mock_cluster.bootstrap, topic, assignor))


# -- mixed groups --------------------------------------------------------------------------------------


class OurRunner(threading.Thread):
    """Our GroupMember on its own event loop thread, with the interface of test_groups_clients.Runner."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str, assignor: str, log: Any) -> None:
        super().__init__(name=f"member-{name}", daemon=True)
        self.cname, self.log = name, log
        self.conf = member_config(bootstrap, group, assignor, **{"client.id": name})
        self.topic = topic
        self.owned: set[int] = set()
        self.error: BaseException | None = None
        self.started_ok = threading.Event()
        self.subscriptions: list[tuple[str, Any]] = []
        self._halt = threading.Event()

    def _assign(self, parts: list[tuple[str, int]]) -> None:
        self.owned |= {p for _, p in parts}
        self.log.assign(self.cname, [p for _, p in parts])

    def _revoke(self, parts: list[tuple[str, int]]) -> None:
        self.owned -= {p for _, p in parts}
        self.log.revoke(self.cname, [p for _, p in parts])

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    async def _main(self) -> None:
        cluster = Cluster(self.conf)
        await cluster.start()
        member = GroupMember(cluster, self.conf, [self.topic], on_assign=self._assign, on_revoke=self._revoke,
                             on_lost=self._revoke)
        # record what the other members sent when ours leads (their subscriptions, decoded by us)
        orig = member._assign

        async def spy(protocol: str, members: Any) -> Any:
            from oncelog.client.assignors import decode_subscription
            self.subscriptions.extend((m.member_id, decode_subscription(m.metadata)) for m in members)
            return await orig(protocol, members)

        member._assign = spy  # type: ignore[method-assign]
        await member.start()
        self.member = member
        self.started_ok.set()
        while not self._halt.is_set():
            member.poll_happened()
            if member.error is not None:
                raise member.error
            await asyncio.sleep(0.05)
        self.log.release_all(self.cname)
        await member.close()
        await cluster.close()

    def stop(self, timeout: float = 30) -> None:
        self._halt.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.cname} did not stop"
        if self.error is not None:
            raise AssertionError(f"{self.cname} failed: {self.error!r}") from self.error


def kafka_python_assignor(name: str) -> Any:
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    return {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
            "cooperative-sticky": CooperativeStickyAssignor}[name]


@pytest.mark.parametrize("first", ["ours", "theirs"])
@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_mixed_group_with_confluent_and_kafka_python(gbroker: EmbeddedBroker, assignor: str, first: str) -> None:
    from tests.integration.test_groups_clients import OwnershipLog, Runner

    topic, group = fresh("mixed"), fresh("g-mixed")
    create_topic(gbroker.bootstrap, topic, PARTITIONS)
    log = OwnershipLog()
    ours = OurRunner("ours", gbroker.bootstrap, group, topic, assignor, log)
    conf_extra = {"partition.assignment.strategy": assignor}
    confluent = Runner("confluent", "librdkafka", gbroker.bootstrap, group, topic, log, extra=conf_extra)
    kp = Runner("kafkapython", "kafka-python", gbroker.bootstrap, group, topic, log,
                extra={"partition_assignment_strategy": [kafka_python_assignor(assignor)]})
    order = [ours, confluent, kp] if first == "ours" else [confluent, kp, ours]
    started: list[Any] = []
    try:
        for r in order:
            r.start()
            assert r.started_ok.wait(30), f"{r.cname} did not start"
            started.append(r)
            if r is order[0]:
                time.sleep(1.0)  # let the first member become the leader

        def complete() -> Any:
            for r in started:
                if r.error is not None:
                    raise AssertionError(f"{r.cname} failed: {r.error!r}")
            with GroupAdmin(gbroker.bootstrap) as admin:
                info = admin.describe(group)
            if info.state != "Stable" or len(info.members) != 3:
                return None
            views = {m.client_id: set(m.assignment.get(topic, [])) for m in info.members}
            every = [p for v in views.values() for p in v]
            if sorted(every) != list(range(PARTITIONS)):
                return None
            # each member's own view (its callbacks) equals the broker's
            if any(r.owned != views.get(r.cname) for r in started):
                return None
            return info

        info = wait_until(complete, 90, interval=0.2, message=f"a complete disjoint {assignor} assignment")
        assert info.protocol == assignor
        if assignor in ("range", "roundrobin"):
            # whoever led, the assignment is the one Kafka's algorithm gives for these member ids
            from oncelog.client.assignors import ASSIGNORS, MemberSubscription, Subscription

            expected = ASSIGNORS[assignor].assign({topic: PARTITIONS}, [
                MemberSubscription(m.member_id, Subscription([topic])) for m in info.members])
            assert {m.member_id: sorted(m.assignment.get(topic, [])) for m in info.members} == \
                {mid: [p for _, p in parts] for mid, parts in expected.items()}
        assert all(len(r.owned) == 2 for r in started), {r.cname: r.owned for r in started}
        assert not log.violations, log.violations
        leader_is_ours = ours.member.leader_id == ours.member.member_id
        assert leader_is_ours == (first == "ours")
        if leader_is_ours:
            # we decoded librdkafka's and kafka-python's subscriptions
            assert len({mid for mid, _ in ours.subscriptions}) >= 3
            assert all(sub.topics == [topic] for _, sub in ours.subscriptions)
    finally:
        for r in reversed(started):
            r.stop()
    assert not log.violations, log.violations


# -- heartbeat before commit ---------------------------------------------------------------------------


def test_heartbeat_now_raises_after_the_member_was_kicked(tmp_path: Any) -> None:
    from oncelog.testing.embedded import free_port
    from oncelog.testing.fault_proxy import FaultProxy

    HEARTBEAT = 12
    port = free_port()
    proxy = FaultProxy(("127.0.0.1", port), seed=1)
    broker = EmbeddedBroker(data_dir=tmp_path / "data", port=port, log_path=tmp_path / "broker.log",
                            config={**BROKER_CONFIG, "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"})
    proxy.start()
    try:
        broker.start()
        topic, group = fresh("hb"), fresh("g-hb")
        create_topic(proxy.bootstrap, topic, 2)

        async def main() -> None:
            own = Ownership()
            conf = member_config(proxy.bootstrap, group, "range",
                                 **{"request.timeout.ms": 2000, "heartbeat.interval.ms": 3000})
            m = await start_member("A", own, conf, topic)
            await m.wait_assigned(30)
            assert m.assignment == [(topic, 0), (topic, 1)]
            await m.heartbeat_now()  # in the group: succeeds
            first_generation = m.generation_id
            proxy.hold(HEARTBEAT, 10**6)  # heartbeats hang in the network from now on

            def expired() -> bool:
                with GroupAdmin(proxy.bootstrap) as admin:
                    return not admin.describe(group).members

            deadline = time.monotonic() + SESSION_MS / 1000 + 30
            while not await asyncio.to_thread(expired):
                assert time.monotonic() < deadline, "the coordinator never expired the member"
                m.poll_happened()
                await asyncio.sleep(0.2)
            proxy.release_held()  # later heartbeats reach the broker again
            # the connection that carried a held heartbeat closes at its request timeout: until then
            # heartbeat_now fails with a connection error; it must never succeed
            kicked: KafkaError | None = None
            for _ in range(50):
                assert m.generation_id == first_generation, "the member rejoined before heartbeat_now ran"
                try:
                    await m.heartbeat_now()
                except KafkaError as exc:
                    if exc.name in ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION"):
                        kicked = exc
                        break
                    assert exc.retriable, exc
                else:
                    raise AssertionError("heartbeat_now succeeded for a member the coordinator removed")
                await asyncio.sleep(0.1)
            assert kicked is not None
            assert not m.in_group
            # the partitions were lost, not revoked in order; the member rejoins and gets them back
            for _ in range(100):
                if any(k == "lost" and set(ps) == {(topic, 0), (topic, 1)} for _, w, k, ps in own.events):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"on_lost was not called: {own.events}")
            assert not any(k == "revoke" for _, w, k, ps in own.events)
            await m.wait_assigned(30)
            assert m.generation_id > first_generation and m.assignment == [(topic, 0), (topic, 1)]
            await m.heartbeat_now()
            await stop_member(m)

        asyncio.run(main())
    finally:
        broker.close()
        proxy.stop()


# -- require_stable (KIP-447) ----------------------------------------------------------------------------


def test_require_stable_waits_for_a_pending_transactional_offset(gbroker: EmbeddedBroker) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka import TopicPartition as CTP

    topic, group = fresh("stable"), fresh("g-stable")
    create_topic(gbroker.bootstrap, topic, 2)
    p = Producer({"bootstrap.servers": gbroker.bootstrap, "transactional.id": fresh("txn"), "linger.ms": 0})
    p.init_transactions(30)
    meta_consumer = Consumer({"bootstrap.servers": gbroker.bootstrap, "group.id": group})

    async def main() -> None:
        conf = member_config(gbroker.bootstrap, group, "range")
        cluster = Cluster(conf)
        await cluster.start()
        tps = [(topic, 0), (topic, 1)]
        try:
            from oncelog.client.aio.offsets import commit_offsets

            await commit_offsets(cluster, group, {(topic, 0): 3})  # a plain commit first
            p.begin_transaction()
            p.produce(topic, b"x", partition=1)
            p.send_offsets_to_transaction([CTP(topic, 0, 5), CTP(topic, 1, 7)],
                                          meta_consumer.consumer_group_metadata(), 30)
            p.flush(10)
            # without require_stable: the last committed offsets, the pending ones invisible
            plain = await fetch_offsets(cluster, group, tps)
            assert plain[(topic, 0)] is not None and plain[(topic, 0)].offset == 3 and plain[(topic, 1)] is None
            # with require_stable and a short timeout: UNSTABLE_OFFSET_COMMIT, retried, then raised
            with pytest.raises(KafkaError) as info:
                await fetch_offsets(cluster, group, tps, require_stable=True, timeout=1.0)
            assert info.value.name == "UNSTABLE_OFFSET_COMMIT"
            # a waiting fetch completes only after the transaction commits, with the committed offsets
            waiting = asyncio.ensure_future(fetch_offsets(cluster, group, tps, require_stable=True, timeout=30))
            await asyncio.sleep(1.5)
            assert not waiting.done(), waiting
            t0 = time.monotonic()
            await asyncio.to_thread(p.commit_transaction, 30)
            got = await asyncio.wait_for(waiting, 30)
            assert {tp: om.offset for tp, om in got.items()} == {(topic, 0): 5, (topic, 1): 7}
            assert time.monotonic() - t0 < 10
        finally:
            await cluster.close()

    try:
        asyncio.run(main())
    finally:
        meta_consumer.close()


# -- callbacks that block, poll interval, static membership -------------------------------------------------


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_a_blocking_revoke_holds_the_rebalance_and_keeps_the_member_alive(gbroker: EmbeddedBroker,
                                                                           assignor: str) -> None:
    """A revoke that blocks longer than the session timeout (an EndTxn in flight): heartbeats go on, the
    member is not kicked, and nobody gets its partitions before the revoke returns."""
    topic, group = fresh("block"), fresh("g-block")
    create_topic(gbroker.bootstrap, topic, 2)

    async def main() -> None:
        own = Ownership()
        gate = asyncio.Event()
        revoke_done: list[float] = []
        conf = member_config(gbroker.bootstrap, group, assignor)
        a_cluster = Cluster(conf)
        await a_cluster.start()
        cbs = own.callbacks("A")

        blocked_in: list[int] = []

        async def blocking_revoke(parts: list[tuple[str, int]]) -> None:
            blocked_in.append(a.generation_id)
            await gate.wait()
            revoke_done.append(time.monotonic())
            await cbs["on_revoke"](parts)

        a = GroupMember(a_cluster, conf, [topic], on_assign=cbs["on_assign"], on_revoke=blocking_revoke,
                        on_lost=cbs["on_lost"])
        a.name = "A"  # type: ignore[attr-defined]
        await a.start()
        await a.wait_assigned(30)
        b = await start_member("B", own, conf, topic)
        await asyncio.sleep(SESSION_MS / 1000 + 2)  # longer than the session timeout
        # eager: blocked before JoinGroup; cooperative: after SyncGroup, in the new generation
        assert blocked_in and a.in_group and a.generation_id == blocked_in[0], "the blocked member lost its generation"
        assert a.assignment and not b.assignment
        assert not any(k == "lost" for _, _, k, _ in own.events)
        gate.set()
        await settled([a, b], own, topic, partitions=2)
        first_b_assign = min(t for t, w, k, ps in own.events if w == "B" and k == "assign" and ps)
        assert first_b_assign > revoke_done[0]
        assert not own.violations, own.violations
        await stop_member(b)
        await stop_member(a)

    asyncio.run(main())


def test_max_poll_interval_expiry_leaves_the_group_and_rejoins_on_poll(gbroker: EmbeddedBroker) -> None:
    topic, group = fresh("poll"), fresh("g-poll")
    create_topic(gbroker.bootstrap, topic, 2)

    async def main() -> None:
        own = Ownership()
        conf = member_config(gbroker.bootstrap, group, "range", **{"max.poll.interval.ms": 2000})
        a = await start_member("A", own, conf, topic)
        b = await start_member("B", own, conf, topic)
        stop = asyncio.Event()

        async def poll_b() -> None:  # B polls; A does not
            while not stop.is_set():
                b.poll_happened()
                await asyncio.sleep(0.1)

        poller = asyncio.ensure_future(poll_b())
        deadline = time.monotonic() + 30
        while not any(w == "A" and k == "lost" for _, w, k, _ in own.events):
            assert time.monotonic() < deadline, f"A never left after max.poll.interval.ms: {own.events}"
            await asyncio.sleep(0.1)
        await settled([b], own, topic, partitions=2)  # B took everything, A is out of the group
        with GroupAdmin(gbroker.bootstrap) as admin:
            assert len(admin.describe(group).members) == 1
        assert not a.in_group and a.assignment == []
        await asyncio.sleep(1.0)
        assert not a.in_group, "rejoined without a poll"
        a.poll_happened()
        a.poll_happened()
        stop2 = asyncio.Event()

        async def poll_a() -> None:
            while not stop2.is_set():
                a.poll_happened()
                await asyncio.sleep(0.1)

        poller_a = asyncio.ensure_future(poll_a())
        await settled([a, b], own, topic, partitions=2)
        assert not own.violations, own.violations
        stop.set()
        stop2.set()
        await poller
        await poller_a
        await stop_member(a)
        await stop_member(b)

    asyncio.run(main())


def test_static_member_restarts_without_rebalance_and_a_duplicate_instance_is_fenced(
        gbroker: EmbeddedBroker) -> None:
    topic, group = fresh("static"), fresh("g-static")
    create_topic(gbroker.bootstrap, topic, 4)

    async def main() -> None:
        own = Ownership()
        conf_a = member_config(gbroker.bootstrap, group, "range", **{"group.instance.id": "inst-a"})
        conf_b = member_config(gbroker.bootstrap, group, "range", **{"group.instance.id": "inst-b"})
        a = await start_member("A", own, conf_a, topic)
        b = await start_member("B", own, conf_b, topic)
        for _ in range(300):
            if a.in_group and b.in_group and len(a.assignment) == 2 and len(b.assignment) == 2 \
                    and a.generation_id == b.generation_id:
                break
            await asyncio.sleep(0.05)
        gen, a_parts = a.generation_id, a.assignment
        # a static member closes without LeaveGroup and comes back within its session: no rebalance
        await stop_member(a)
        a2 = await start_member("A2", own, conf_a, topic)
        await a2.wait_assigned(30)
        assert a2.assignment == a_parts
        assert b.generation_id == gen and b.in_group
        with GroupAdmin(gbroker.bootstrap) as admin:
            info = admin.describe(group)
        assert sorted(m.group_instance_id for m in info.members) == ["inst-a", "inst-b"]
        # a second member with the same instance id fences the first: FENCED_INSTANCE_ID is fatal
        a3 = await start_member("A3", own, conf_a, topic)
        await a3.wait_assigned(30)
        deadline = time.monotonic() + 20
        while a2.error is None:
            assert time.monotonic() < deadline, "the duplicate static member was not fenced"
            await asyncio.sleep(0.1)
        assert a2.error.name == "FENCED_INSTANCE_ID"
        with pytest.raises(KafkaError):
            await a2.heartbeat_now()
        await a2.cluster.close()
        await stop_member(a3)
        await stop_member(b)

    asyncio.run(main())


def test_the_leader_rebalances_when_partitions_are_added(gbroker: EmbeddedBroker) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic, group = fresh("grow"), fresh("g-grow")
    create_topic(gbroker.bootstrap, topic, 2)

    async def main() -> None:
        own = Ownership()
        conf = member_config(gbroker.bootstrap, group, "roundrobin", **{"metadata.max.age.ms": 500})
        a = await start_member("A", own, conf, topic)
        b = await start_member("B", own, conf, topic)
        await settled([a, b], own, topic, partitions=2)
        admin = AdminClient({"bootstrap.servers": gbroker.bootstrap})
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(20)
        await settled([a, b], own, topic, partitions=4)
        assert not own.violations, own.violations
        await stop_member(a)
        await stop_member(b)

    asyncio.run(main())


def test_commit_errors_are_typed_and_a_stale_generation_loses_the_partitions(gbroker: EmbeddedBroker) -> None:
    from oncelog.client.aio.offsets import commit_offsets
    from oncelog.client.errors import IllegalGenerationError, UnknownMemberIdError

    topic, group = fresh("commit"), fresh("g-commit")
    create_topic(gbroker.bootstrap, topic, 2)

    async def main() -> None:
        own = Ownership()
        conf = member_config(gbroker.bootstrap, group, "range")
        # A heartbeats rarely, so that it is its commit, not a heartbeat, that finds the stale generation
        a = await start_member("A", own, member_config(gbroker.bootstrap, group, "range",
                                                       **{"heartbeat.interval.ms": 3000}), topic)
        await a.wait_assigned(30)
        old = a.group_metadata()
        b = await start_member("B", own, conf, topic)
        await settled([a, b], own, topic, partitions=2)
        assert a.generation_id > old.generation_id
        with pytest.raises(IllegalGenerationError):
            await commit_offsets(a.cluster, group, {(topic, 0): 1}, generation_id=old.generation_id,
                                 member_id=a.member_id)
        with pytest.raises(UnknownMemberIdError):
            await commit_offsets(a.cluster, group, {(topic, 0): 1}, generation_id=a.generation_id,
                                 member_id="not-a-member")
        # the member's own commit with a generation the coordinator no longer has: typed error, partitions lost
        a.generation_id = old.generation_id  # as if A had missed the last rebalance (a zombie)
        with pytest.raises(IllegalGenerationError):
            await a.commit({tp: 1 for tp in a.assignment})
        assert not a.in_group and a.generation_id == -1  # the commit itself ended the generation
        for _ in range(100):
            if any(w == "A" and k == "lost" for _, w, k, _ in own.events):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"no on_lost after ILLEGAL_GENERATION: {own.events}")
        await settled([a, b], own, topic, partitions=2)
        await a.commit({tp: 2 for tp in a.assignment})  # back in the group: commits work
        assert not own.violations, own.violations
        await stop_member(a)
        await stop_member(b)

    asyncio.run(main())


def test_members_survive_a_broker_kill_and_restart(broker_factory: Any) -> None:
    """kill -9 of the broker: the members find the coordinator again, rejoin, keep their commits, and
    no partition is owned twice at any moment."""
    b = broker_factory(config=BROKER_CONFIG)
    port = int(b.bootstrap.rsplit(":", 1)[1])
    topic, group = fresh("bounce"), fresh("g-bounce")
    create_topic(b.bootstrap, topic, 4)

    async def main() -> None:
        own = Ownership()
        conf = member_config(b.bootstrap, group, "cooperative-sticky")
        a = await start_member("A", own, conf, topic)
        c = await start_member("C", own, conf, topic)
        await settled([a, c], own, topic, partitions=4)
        await a.commit({tp: 11 for tp in a.assignment})
        await c.commit({tp: 22 for tp in c.assignment})
        expected = {**{tp: 11 for tp in a.assignment}, **{tp: 22 for tp in c.assignment}}
        await asyncio.to_thread(b.restart, True)
        assert int(b.bootstrap.rsplit(":", 1)[1]) == port
        d = await start_member("D", own, conf, topic)  # a join right after the restart
        await settled([a, c, d], own, topic, partitions=4, timeout=SESSION_MS / 1000 + 45)
        got = await d.committed([(topic, p) for p in range(4)])
        assert {tp: om.offset for tp, om in got.items() if om is not None} == expected
        assert not own.violations, own.violations
        for m in (a, c, d):
            await stop_member(m)

    asyncio.run(main())


@pytest.mark.parametrize("assignor,forget", [("range", False), ("cooperative-sticky", False), ("range", True)])
def test_a_member_closed_during_a_rebalance_leaves_it_at_once(gbroker: EmbeddedBroker, assignor: str,
                                                             forget: bool) -> None:
    """close() while the member's JoinGroup waits in a rebalance (the group waits for a killed member's
    session to expire). The coordinator holds that JoinGroup's answer until the rebalance completes and
    answers one connection's requests in order, so a LeaveGroup sent behind it was read only once the
    next generation had formed, with the closed member in it: close() took the whole rebalance, and the
    leave started another one at once (issue 12's churn run at 2 s repeated that every session timeout,
    72 generations, none of them ever synced). Now the member leaves on a new connection: close() returns
    at once, and the rebalance completes without it, in one generation. ``forget``: the coordinator cache
    was cleared just before close() (a coordinator error elsewhere): the leave used to find the
    coordinator again, get the shared connection its JoinGroup blocks, and wait behind it."""
    topic, group = fresh("leave-join"), fresh("g-leave-join")
    create_topic(gbroker.bootstrap, topic, PARTITIONS)

    async def main() -> None:
        own = Ownership()
        conf = member_config(gbroker.bootstrap, group, assignor)
        a = await start_member("A", own, conf, topic)
        b = await start_member("B", own, conf, topic)
        c = await start_member("C", own, conf, topic)
        await settled([a, b, c], own, topic)
        gen = b.generation_id
        await kill_member(c, own)  # stays in the group until its session times out (6 s)
        d = await start_member("D", own, conf, topic)  # its join starts a rebalance that waits for C
        node = await a.cluster.coordinator(0, group)

        def a_waits_in_join_group() -> bool:
            conn = a.cluster.nodes[node].conn
            return a._state == "joining" and conn is not None and conn.in_flight > 0

        deadline = time.monotonic() + 5
        while not a_waits_in_join_group():
            assert time.monotonic() < deadline, "A never sent its JoinGroup"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # the coordinator has it
        if forget:
            a.cluster.forget_coordinator(0, group)
        t0 = time.monotonic()
        await stop_member(a)
        took = time.monotonic() - t0
        assert took < 2.0, f"close() took {took:.1f} s: its LeaveGroup waited behind its JoinGroup"
        # closed while a rebalance is in progress: what A still holds is lost, not revoked (Java's
        # onLeavePrepare: a commit from on_revoke would fail with REBALANCE_IN_PROGRESS). Eager members
        # gave theirs up when the join started; a cooperative member still holds its share here
        at_close = [kind for ts, who, kind, parts in own.events if who == "A" and ts >= t0 and parts]
        assert "revoke" not in at_close, at_close
        if assignor == "cooperative-sticky":
            assert at_close == ["lost"], at_close
        await settled([b, d], own, topic, timeout=SESSION_MS / 1000 + 30)
        # one rebalance: the generation that dropped C (and never had A in it); the old code formed gen + 1
        # with A in it and then rebalanced again for A's late LeaveGroup
        await asyncio.sleep(1.0)
        assert b.generation_id == d.generation_id == gen + 1, (gen, b.generation_id, d.generation_id)
        assert not own.violations, own.violations
        for m in (b, d):
            await stop_member(m)

    asyncio.run(main())
