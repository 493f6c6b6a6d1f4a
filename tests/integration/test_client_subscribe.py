"""oncelog.client's Consumer in a consumer group (``subscribe``) against the real broker.

* Churn under each assignor: three of our asyncio consumers in one group on a
  keyed topic, committing what they processed; one closes (LeaveGroup), one
  joins, one is killed (no LeaveGroup, its session expires), another joins,
  more records arrive. Every record is consumed, the final committed offsets
  are the end offsets and a new member starts there (nothing re-read), and
  the ownership log (test_client_groups.Ownership) never sees a partition
  given to a member while another live member holds it.
* Interop: our blocking consumer with two confluent-kafka consumers in one
  group (same assignor), commit-on-process: the records are split between
  them, none lost, none duplicated.
* Auto-commit on close: a restarted consumer continues at the closed one's
  position.
* A regex subscription picks up a topic created later.
* librdkafka's mock cluster: a basic group consume with commits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from oncelog.client import Consumer, Producer, TopicPartition
from oncelog.client import aio
from oncelog.client.errors import KafkaError
from oncelog.client.groups import GroupAdmin
from oncelog.testing import EmbeddedBroker

from tests.integration.conftest import create_topic, wait_until
from tests.integration.test_client_groups import BROKER_CONFIG, HEARTBEAT_MS, PARTITIONS, SESSION_MS, Ownership, fresh

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def gbroker(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("client-subscribe")
    b = EmbeddedBroker(data_dir=d / "data", config=BROKER_CONFIG, log_path=d / "broker.log")
    b.start()
    try:
        yield b
    finally:
        b.close()


def conf(bootstrap: str, group: str, name: str, **extra: Any) -> dict[str, Any]:
    c = {"bootstrap.servers": bootstrap, "group.id": group, "client.id": name, "session.timeout.ms": SESSION_MS,
         "heartbeat.interval.ms": HEARTBEAT_MS, "auto.offset.reset": "earliest", "retry.backoff.ms": 50,
         "reconnect.backoff.max.ms": 500}
    c.update(extra)
    return c


def produce_keyed(bootstrap: str, topic: str, start: int, n: int) -> dict[bytes, int]:
    """n keyed records; returns value -> partition."""
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
        futs = {b"v%06d" % i: p.produce(topic, b"v%06d" % i, key=b"k%d" % (i % 37)) for i in range(start, start + n)}
        assert p.flush(30) == 0
        return {v: f.result().partition for v, f in futs.items()}


def end_offsets(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    with Consumer({"bootstrap.servers": bootstrap}) as c:
        return {p: c.get_watermark_offsets((topic, p))[1] for p in range(partitions)}


# -- churn with our consumers -------------------------------------------------------------------------


class Ours:
    """One of our asyncio consumers in the group, consuming and committing what it processed."""

    def __init__(self, name: str, config: dict[str, Any], topic: str, own: Ownership,
                 seen: list[tuple[str, int, int, bytes]]) -> None:
        self.name, self.topic, self.own, self.seen = name, topic, own, seen
        self.c = aio.Consumer(config)
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    async def start(self) -> None:
        await self.c.start()
        tup = lambda tps: [(tp.topic, tp.partition) for tp in tps]  # noqa: E731
        self.c.subscribe([self.topic], on_assign=lambda tps: self.own.assign(self.name, tup(tps)),
                         on_revoke=lambda tps: self.own.release(self.name, tup(tps), "revoke"),
                         on_lost=lambda tps: self.own.release(self.name, tup(tps), "lost"))
        self.task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        # processed, not yet committed: a commit that fails in a rebalance (REBALANCE_IN_PROGRESS
        # while the group completes it, as Java's RebalanceInProgressException) is tried again for
        # the partitions still owned, else a partition that stays here and gets no more records
        # would keep its committed offset behind the records this member processed
        pending: dict[tuple[str, int], int] = {}
        try:
            while True:
                msgs = await self.c.consume(500, 0.2)
                for m in msgs:
                    self.seen.append((self.name, m.partition, m.offset, m.value))
                    pending[(m.topic, m.partition)] = m.offset + 1
                if pending:
                    owned = self.owns()
                    pending = {tp: o for tp, o in pending.items() if tp in owned}  # moved: the owner re-reads
                    try:
                        await self.c.commit([TopicPartition(t, p, o) for (t, p), o in pending.items()])
                        pending = {}
                    except KafkaError:
                        pass  # the generation ended or is completing: commit again next round
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.error = exc

    def owns(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self.c.assignment()}

    async def close(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.c.close()
        assert self.error is None, self.error

    async def kill(self) -> None:
        """As SIGKILL: the tasks stop, the connections close, no callbacks, no LeaveGroup, no commit."""
        c = self.c
        member = c.member
        assert member is not None and self.task is not None
        tasks = [self.task, member._task, member._hb_task, c._task, *c._fetches]
        for t in tasks:
            if t is not None:
                t.cancel()
        await asyncio.gather(*[t for t in tasks if t is not None], return_exceptions=True)
        c._closed = True
        self.own.died(self.name)
        await c.cluster.close()


async def settled(members: list[Ours], own: Ownership, topic: str, timeout: float = 60.0) -> None:
    want = {(topic, p) for p in range(PARTITIONS)}
    deadline = time.monotonic() + timeout
    while True:
        for m in members:
            assert m.error is None, f"{m.name}: {m.error!r}"
        owned = {tp: w for tp, w in own.owner.items() if w not in own.dead}
        views = [m.owns() for m in members]
        if (set(owned) == want and sum(map(len, views)) == PARTITIONS and set().union(*views) == want
                and all(v == {tp for tp, w in owned.items() if w == m.name} for m, v in zip(members, views))
                and all(m.c.member is not None and m.c.member.in_group and not m.c.member._rejoin_needed
                        for m in members)
                and max(map(len, views)) - min(map(len, views)) <= 1):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no settled assignment: owner={owned} views={views}")
        await asyncio.sleep(0.05)


async def wait_seen(seen: list[Any], values: set[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not values <= {v for *_, v in seen}:
        assert time.monotonic() < deadline, f"missing {len(values - {v for *_, v in seen})} records"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_three_consumers_with_churn_consume_everything(gbroker: EmbeddedBroker, assignor: str) -> None:
    topic, group = fresh("sub-churn"), fresh("g-churn")
    create_topic(gbroker.bootstrap, topic, PARTITIONS)
    first = produce_keyed(gbroker.bootstrap, topic, 0, 3000)
    asyncio.run(_churn(gbroker.bootstrap, topic, group, assignor, first))


async def step(what: str, aw: Any, timeout: float = 90.0) -> Any:
    """Await ``aw``; a hang fails the test naming the step instead of stalling it."""
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} did not finish in {timeout} s") from None


async def _churn(bootstrap: str, topic: str, group: str, assignor: str, first: dict[bytes, int]) -> None:
    own = Ownership()
    seen: list[tuple[str, int, int, bytes]] = []

    def member(name: str) -> Ours:
        return Ours(name, conf(bootstrap, group, name, **{"partition.assignment.strategy": assignor,
                                                         "enable.auto.commit": False}), topic, own, seen)

    a, b, c = member("a"), member("b"), member("c")
    for m in (a, b, c):
        await step("start m", m.start())
    live = [a, b, c]
    await settled(live, own, topic)
    await step("close a", a.close())  # leaves the group
    live.remove(a)
    d = member("d")
    await step("start d", d.start())
    live.append(d)
    await settled(live, own, topic)
    await step("kill b", b.kill())  # no LeaveGroup: its partitions move once its session expires
    live.remove(b)
    await settled(live, own, topic)
    second = await step("produce", asyncio.to_thread(produce_keyed, bootstrap, topic, 3000, 2000))
    e = member("e")
    await step("start e", e.start())
    live.append(e)
    await settled(live, own, topic)
    values = set(first) | set(second)
    await wait_seen(seen, values)
    # every record consumed at the offset of its partition; keyed records stay on the partition of their key
    by_value = {v: p for _, p, _, v in seen}
    assert {v: by_value[v] for v in values} == {**first, **second}
    ends = await step("end offsets", asyncio.to_thread(end_offsets, bootstrap, topic))
    assert sum(ends.values()) == len(values)

    async def all_committed() -> None:
        deadline = time.monotonic() + 30
        while True:
            got = await step("committed", live[0].c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)]))
            if {tp.partition: tp.offset for tp in got} == ends:
                return
            assert time.monotonic() < deadline, (got, ends)
            await asyncio.sleep(0.2)

    await all_committed()
    for m in live:
        await step(f"close {m.name}", m.close())
    assert not own.violations, own.violations
    # the committed offsets survive the churn: a new member starts at the end, re-reading nothing
    f = member("f")
    await step("start f", f.start())
    await settled([f], own, topic)
    positions = {p: await step("position", f.c.position((topic, p))) for p in range(PARTITIONS)}
    n_before = len(seen)
    await asyncio.sleep(1.0)
    await step("close f", f.close())
    assert positions == ends
    assert len(seen) == n_before
    assert not own.violations, own.violations


# -- interop with confluent-kafka ----------------------------------------------------------------------


def test_group_with_confluent_consumers_splits_records_exactly_once(gbroker: EmbeddedBroker) -> None:
    from confluent_kafka import Consumer as CConsumer

    topic, group = fresh("sub-interop"), fresh("g-interop")
    create_topic(gbroker.bootstrap, topic, PARTITIONS)
    produced = produce_keyed(gbroker.bootstrap, topic, 0, 2000)
    assignor = "roundrobin"
    halt = threading.Event()
    got: dict[str, list[tuple[int, int]]] = {"ours": [], "c1": [], "c2": []}
    errors: list[BaseException] = []

    def ours() -> None:
        owned: set[int] = set()
        lock = threading.Lock()

        def on_assign(tps: list[TopicPartition]) -> None:
            with lock:
                owned.update(tp.partition for tp in tps)

        def on_revoke(tps: list[TopicPartition]) -> None:
            with lock:  # waits for a batch being processed and committed
                owned.difference_update(tp.partition for tp in tps)

        try:
            c = Consumer(conf(gbroker.bootstrap, group, "ours", **{"partition.assignment.strategy": assignor,
                                                                  "enable.auto.commit": False}))
            c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
            while not halt.is_set():
                msgs = c.consume(200, 0.1)
                with lock:
                    # records of partitions revoked since consume() returned go to their new owner
                    mine = [m for m in msgs if m.partition in owned]
                    for m in mine:
                        got["ours"].append((m.partition, m.offset))
                    last = {m.partition: m.offset + 1 for m in mine}
                    if last:
                        c.commit([TopicPartition(topic, p, o) for p, o in last.items()])
            c.close()
        except BaseException as exc:
            errors.append(exc)

    def theirs(name: str) -> None:
        try:
            c = CConsumer({"bootstrap.servers": gbroker.bootstrap, "group.id": group, "client.id": name,
                           "auto.offset.reset": "earliest", "enable.auto.commit": False,
                           "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
                           "partition.assignment.strategy": assignor})
            c.subscribe([topic])
            while not halt.is_set():
                for m in c.consume(200, 0.1):
                    if m.error():
                        continue
                    got[name].append((m.partition(), m.offset()))
                    c.commit(m, asynchronous=False)
            c.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ours, daemon=True),
               threading.Thread(target=theirs, args=("c1",), daemon=True),
               threading.Thread(target=theirs, args=("c2",), daemon=True)]
    for i, t in enumerate(threads):
        t.start()
        time.sleep(1.5)  # members join one by one: rebalances while records flow
        if i == 0:
            produced.update(produce_keyed(gbroker.bootstrap, topic, 2000, 2000))

    def stable() -> bool:
        with GroupAdmin(gbroker.bootstrap) as admin:
            info = admin.describe(group)
        return (info.state == "Stable" and len(info.members) == 3
                and all(len(m.assignment.get(topic, [])) == 2 for m in info.members))

    wait_until(stable, 60, interval=0.2, message="three members with two partitions each")
    produced.update(produce_keyed(gbroker.bootstrap, topic, 4000, 2000))  # reaches every member
    ends = end_offsets(gbroker.bootstrap, topic)
    try:
        wait_until(lambda: errors or sum(len(v) for v in got.values()) >= len(produced), 90,
                   message="every record consumed")
        time.sleep(1.0)
    finally:
        halt.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    every = sorted(x for v in got.values() for x in v)
    assert every == sorted((p, o) for p, n in ends.items() for o in range(n)), "records lost or duplicated"
    assert all(got[k] for k in got), {k: len(v) for k, v in got.items()}  # split between the three


# -- auto commit ---------------------------------------------------------------------------------------


def test_auto_commit_on_close_lets_a_restarted_consumer_continue(gbroker: EmbeddedBroker) -> None:
    topic, group = fresh("sub-autocommit"), fresh("g-autocommit")
    create_topic(gbroker.bootstrap, topic, 3)
    produced = produce_keyed(gbroker.bootstrap, topic, 0, 900)
    counts = {p: sum(1 for q in produced.values() if q == p) for p in range(3)}
    # a long interval: only the commit on close can have stored the position
    cfg = conf(gbroker.bootstrap, group, "first", **{"auto.commit.interval.ms": 600000})
    first: list[tuple[int, int]] = []
    with Consumer(cfg) as c:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(first) < 400:
            assert time.monotonic() < deadline
            first.extend((m.partition, m.offset) for m in c.consume(50, 0.5))
        positions = {p: c.position((topic, p)) for p in range(3)}
    assert sum(positions.values()) == len(first) < 900
    second: list[tuple[int, int]] = []
    with Consumer({**cfg, "client.id": "second"}) as c:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(first) + len(second) < 900:
            assert time.monotonic() < deadline, (len(first), len(second))
            second.extend((m.partition, m.offset) for m in c.consume(500, 0.5))
    for p in range(3):
        offs = sorted(o for q, o in second if q == p)
        assert offs == list(range(positions[p], counts[p])), (p, positions)
    assert sorted(first + second) == sorted((p, o) for p in range(3) for o in range(counts[p]))


# -- regex ----------------------------------------------------------------------------------------------


def test_regex_subscription_picks_up_a_topic_created_later(gbroker: EmbeddedBroker) -> None:
    prefix = fresh("rx")
    t1, t2 = f"{prefix}-one", f"{prefix}-two"
    create_topic(gbroker.bootstrap, t1, 2)
    create_topic(gbroker.bootstrap, fresh("other"), 1)
    with Consumer(conf(gbroker.bootstrap, fresh("g-rx"), "rx", **{"metadata.max.age.ms": 500})) as c:
        assigned: list[TopicPartition] = []
        c.subscribe(f"^{prefix}-.*", on_assign=lambda tps: assigned.extend(tps))
        with Producer({"bootstrap.servers": gbroker.bootstrap}) as p:
            p.produce(t1, b"one")
            p.flush(10)
        got: list[Any] = []
        wait_until(lambda: got.extend(c.consume(10, 0.2)) or got, 30, message="a record of the first topic")
        assert [(m.topic, m.value) for m in got] == [(t1, b"one")]
        create_topic(gbroker.bootstrap, t2, 1)
        with Producer({"bootstrap.servers": gbroker.bootstrap}) as p:
            p.produce(t2, b"two")
            p.flush(10)
        wait_until(lambda: got.extend(c.consume(10, 0.2)) or len(got) > 1, 30,
                   message="a record of the topic created later")
        assert [(m.topic, m.value) for m in got] == [(t1, b"one"), (t2, b"two")]
        assert c.subscription() == [t1, t2]
        assert {(tp.topic, tp.partition) for tp in c.assignment()} == {(t1, 0), (t1, 1), (t2, 0)}


# -- a second broker: librdkafka's mock cluster ------------------------------------------------------------


def test_group_consume_against_librdkafkas_mock_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mock misreads the flexible JoinGroup v6 / SyncGroup v4: hold the member to older versions."""
    from tests.integration.test_client_mock_cluster import _mock_cluster_class

    from oncelog.client.aio import group as group_mod
    from oncelog.client.aio import offsets as offsets_mod

    for mod, name, versions in ((group_mod, "JOIN_GROUP_VERSIONS", (2, 5)), (group_mod, "SYNC_GROUP_VERSIONS", (1, 3)),
                                (group_mod, "HEARTBEAT_VERSIONS", (1, 3)), (group_mod, "LEAVE_GROUP_VERSIONS", (1, 3)),
                                (offsets_mod, "OFFSET_COMMIT_VERSIONS", (2, 7)),
                                (offsets_mod, "OFFSET_FETCH_VERSIONS", (1, 5))):
        monkeypatch.setattr(mod, name, versions)
    with _mock_cluster_class()(3) as mock:
        mock.create_topic("g", PARTITIONS)
        produced = produce_keyed(mock.bootstrap, "g", 0, 1200)
        cfg = conf(mock.bootstrap, "mock-group", "m1", **{"enable.auto.commit": False})
        got: list[Any] = []
        with Consumer(cfg) as c:
            c.subscribe(["g"])
            deadline = time.monotonic() + 60
            while len(got) < len(produced):
                assert time.monotonic() < deadline, len(got)
                got.extend(c.consume(500, 0.5))
            c.commit()
            committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition("g", p)
                                                                         for p in range(PARTITIONS)])}
        assert sorted(m.value for m in got) == sorted(produced)
        assert {m.value: m.partition for m in got} == produced
        assert committed == {p: sum(1 for q in produced.values() if q == p) for p in range(PARTITIONS)}


# -- pause/resume, offsets_for_times, asynchronous commit, max.poll.interval.ms ----------------------------


def test_pause_resume_offsets_for_times_and_asynchronous_commit(gbroker: EmbeddedBroker) -> None:
    topic, group = fresh("sub-pause"), fresh("g-pause")
    create_topic(gbroker.bootstrap, topic, 2)
    with Producer({"bootstrap.servers": gbroker.bootstrap}) as p:
        for q in range(2):
            for i in range(10):
                p.produce(topic, b"%d-%d" % (q, i), partition=q, timestamp=1_000 * (i + 1))
        assert p.flush(10) == 0
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Consumer(conf(gbroker.bootstrap, group, "pause", **{"enable.auto.commit": False})) as c:
        # a blocking callback may call the consumer: pause partition 0 before anything is fetched
        c.subscribe([topic], on_assign=lambda tps: c.pause([tp for tp in tps if tp.partition == 0]))
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 10 or time.monotonic() < deadline - 28:
            assert time.monotonic() < deadline, len(got)
            got.extend(c.consume(100, 0.3))
        assert sorted(m.value for m in got) == sorted(b"1-%d" % i for i in range(10))
        assert c.paused() == [p0]
        c.resume([p0])
        wait_until(lambda: got.extend(c.consume(100, 0.3)) or len(got) >= 20, 30, message="partition 0 after resume")
        assert sorted(m.value for m in got if m.partition == 0) == sorted(b"0-%d" % i for i in range(10))
        assert [tp.offset for tp in c.offsets_for_times([TopicPartition(topic, 0, 5_500),
                                                         TopicPartition(topic, 1, 99_000)])] == [5, -1]
        fut = c.commit(asynchronous=True)
        assert fut is not None
        fut.result(10)
        assert [tp.offset for tp in c.committed([p0, p1])] == [10, 10]


def test_max_poll_interval_expiry_loses_the_partitions_and_poll_rejoins(gbroker: EmbeddedBroker) -> None:
    topic, group = fresh("sub-maxpoll"), fresh("g-maxpoll")
    create_topic(gbroker.bootstrap, topic, 2)
    events: list[tuple[str, list[int]]] = []
    cfg = conf(gbroker.bootstrap, group, "slow", **{"max.poll.interval.ms": 1500})
    with Consumer(cfg) as c:
        c.subscribe([topic], on_assign=lambda tps: events.append(("assign", [tp.partition for tp in tps])),
                     on_lost=lambda tps: events.append(("lost", [tp.partition for tp in tps])))
        wait_until(lambda: c.consume(1, 0.2) is not None and len(c.assignment()) == 2, 30, message="assigned")
        time.sleep(3.5)  # no poll for longer than max.poll.interval.ms
        assert ("lost", [0, 1]) in events
        assert c.assignment() == []
        assert c.member is not None and not c.member.in_group
        wait_until(lambda: c.consume(1, 0.2) is not None and len(c.assignment()) == 2, 30,
                   message="rejoined after polling again")
    assert [e for e, _ in events] == ["assign", "lost", "assign"]


def test_read_committed_group_consumer_waits_for_pending_transactional_offsets(gbroker: EmbeddedBroker) -> None:
    """KIP-447: require_stable is on by default under read_committed, so a new owner starts at the
    offsets the pending transaction commits, not at auto.offset.reset."""
    from confluent_kafka import Consumer as CConsumer
    from confluent_kafka import Producer as CProducer
    from confluent_kafka import TopicPartition as CTP

    topic, group = fresh("sub-stable"), fresh("g-stable")
    create_topic(gbroker.bootstrap, topic, 2)
    with Producer({"bootstrap.servers": gbroker.bootstrap}) as p:
        for q in range(2):
            for i in range(10):
                p.produce(topic, b"%d-%d" % (q, i), partition=q)
        assert p.flush(10) == 0
    tp = CProducer({"bootstrap.servers": gbroker.bootstrap, "transactional.id": fresh("txn"), "linger.ms": 0})
    tp.init_transactions(30)
    meta = CConsumer({"bootstrap.servers": gbroker.bootstrap, "group.id": group})
    try:
        tp.begin_transaction()
        tp.produce(topic, b"in-txn", partition=1)
        tp.send_offsets_to_transaction([CTP(topic, 0, 5), CTP(topic, 1, 7)], meta.consumer_group_metadata(), 30)
        tp.flush(10)
        with Consumer(conf(gbroker.bootstrap, group, "stable", **{"isolation.level": "read_committed",
                                                                  "enable.auto.commit": False})) as c:
            c.subscribe([topic])
            early = c.consume(100, 2.0)  # the assignment waits for the pending offsets
            assert early == []
            tp.commit_transaction(30)
            got: list[Any] = []
            wait_until(lambda: got.extend(c.consume(100, 0.3)) or len(got) >= 9, 30, message="records")
        assert sorted((m.partition, m.offset) for m in got) == [(0, o) for o in range(5, 10)] + \
            [(1, o) for o in range(7, 11)]
    finally:
        meta.close()
