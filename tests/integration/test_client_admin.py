"""oncelog's Admin client (asyncio and blocking) against the real broker, checked against confluent-kafka.

Every operation runs through both APIs (the ``admin`` fixture drives the
asyncio ``oncelog.client.aio.Admin`` on a loop in the test thread, or the
blocking ``oncelog.client.Admin``). The state each test looks at is made or
read by confluent-kafka (librdkafka: its AdminClient, consumers in a group,
a transactional producer), so the results are compared with what a second,
independent client reports for the same state.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as KConsumer
from confluent_kafka import ConsumerGroupTopicPartitions, Producer as KProducer
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient, ConfigResource as KConfigResource, NewTopic as KNewTopic

from oncelog.client import Admin, AlterConfigOp, ConfigError, ConfigResource, NewTopic, OffsetSpec
from oncelog.client import aio
from oncelog.client import errors as E
from oncelog.client.aio.admin import CONFIG_SOURCES
from oncelog.client.txns import AbortSpec
from oncelog.testing import EmbeddedBroker
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    root = tmp_path_factory.mktemp("client_admin")
    with EmbeddedBroker(data_dir=root / "data", log_path=root / "broker.log",
                        config={"group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


class AioDriver:
    """Drives the asyncio Admin on an event loop owned by the test thread (no loop thread involved)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.admin = aio.Admin(conf)
        self.loop.run_until_complete(self.admin.start())

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.admin, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        return lambda *a, **k: self.loop.run_until_complete(attr(*a, **k))

    def close(self) -> None:
        self.loop.run_until_complete(self.admin.close())
        self.loop.close()


@pytest.fixture(params=["aio", "blocking"])
def admin(request: pytest.FixtureRequest, broker: EmbeddedBroker) -> Iterator[Any]:
    conf = {"bootstrap.servers": broker.bootstrap, "client.id": "admin-test", "default.api.timeout.ms": 20000}
    a = AioDriver(conf) if request.param == "aio" else Admin(conf)
    a.mode = request.param
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def kadmin(broker: EmbeddedBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def k_configs(kadmin: AdminClient, topic: str) -> dict[str, Any]:
    res = KConfigResource(KConfigResource.Type.TOPIC, topic)
    return kadmin.describe_configs([res])[res].result(15)


def produce(bootstrap: str, topic: str, per_partition: int, partitions: int) -> None:
    p = KProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for q in range(partitions):
        for i in range(per_partition):
            p.produce(topic, value=b"v%d" % i, partition=q, timestamp=1_700_000_000_000 + i * 1000)
    assert p.flush(30) == 0


# -- topics and configs ------------------------------------------------------------------------


def test_topic_lifecycle_matches_confluent(admin: Any, kadmin: AdminClient) -> None:
    name = f"adm-topic-{admin.mode}"
    admin.create_topic(name, 3, config={"retention.ms": "123456", "cleanup.policy": "delete"})
    md = kadmin.list_topics(timeout=10).topics
    assert name in md and len(md[name].partitions) == 3
    assert name in admin.list_topics()
    desc = admin.describe_topic(name)
    assert [(p.partition, p.leader, list(p.replicas), list(p.isr)) for p in desc.partitions] == \
        [(q, md[name].partitions[q].leader, md[name].partitions[q].replicas, md[name].partitions[q].isrs)
         for q in range(3)]
    assert desc.topic_id and not desc.is_internal

    # configs: the same values and sources as confluent-kafka's DescribeConfigs
    ours = admin.describe_configs([ConfigResource("topic", name)])[ConfigResource("topic", name)]
    theirs = k_configs(kadmin, name)
    assert {k: e.value for k, e in ours.items()} == {k: e.value for k, e in theirs.items()}
    assert {k: e.source for k, e in ours.items()} == {k: CONFIG_SOURCES[int(e.source)] for k, e in theirs.items()}
    assert ours["retention.ms"].value == "123456" and ours["retention.ms"].source == "DYNAMIC_TOPIC_CONFIG"
    assert ours["segment.ms"].is_default

    res = ConfigResource("topic", name)
    admin.incremental_alter_configs({res: [AlterConfigOp("segment.ms", "7200000"),
                                           AlterConfigOp("retention.ms", op="delete")]})[res]
    theirs = k_configs(kadmin, name)
    assert theirs["segment.ms"].value == "7200000" and not theirs["segment.ms"].is_default
    assert theirs["retention.ms"].is_default
    admin.alter_configs({res: {"retention.bytes": "1048576"}})[res]
    theirs = k_configs(kadmin, name)
    assert theirs["retention.bytes"].value == "1048576"
    assert theirs["segment.ms"].is_default  # AlterConfigs replaces the whole set, as in Kafka
    assert admin.describe_topic_configs(name)["retention.bytes"] == "1048576"

    admin.create_partitions({name: 5})[name]
    assert len(kadmin.list_topics(name, timeout=10).topics[name].partitions) == 5
    assert admin.partitions_of(name) == [0, 1, 2, 3, 4]

    admin.delete_topic(name)
    wait_until(lambda: name not in kadmin.list_topics(timeout=10).topics, 10, message="topic gone")
    assert name not in admin.list_topics()


def test_topic_created_by_confluent_described_alike(admin: Any, kadmin: AdminClient) -> None:
    name = f"adm-ktopic-{admin.mode}"
    kadmin.create_topics([KNewTopic(name, 4, 1, config={"max.message.bytes": "65536"})])[name].result(15)
    desc = admin.describe_topics([name, "adm-no-such-topic"])
    assert [p.partition for p in desc[name].partitions] == [0, 1, 2, 3]
    assert desc.errors["adm-no-such-topic"].name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert admin.describe_topic_configs(name)["max.message.bytes"] == "65536"
    results = admin.create_topics([NewTopic(name, 1), NewTopic(f"{name}-2", 2)])
    assert isinstance(results.errors[name], E.TopicAlreadyExistsError)
    assert results[f"{name}-2"] is None
    assert len(kadmin.list_topics(f"{name}-2", timeout=10).topics[f"{name}-2"].partitions) == 2
    cluster = admin.describe_cluster()
    assert cluster.cluster_id == kadmin.describe_cluster().result(10).cluster_id
    assert sorted(cluster.brokers) == [n.id for n in kadmin.describe_cluster().result(10).nodes]


def test_errors_are_typed(admin: Any, kadmin: AdminClient) -> None:
    name = f"adm-err-{admin.mode}"
    admin.create_topic(name, 1)
    with pytest.raises(E.TopicAlreadyExistsError) as exc:
        admin.create_topic(name, 1)
    assert (exc.value.code, exc.value.name) == (36, "TOPIC_ALREADY_EXISTS") and not exc.value.retriable
    with pytest.raises(E.InvalidConfigError) as exc:
        admin.create_topic(f"{name}-bad", 1, config={"retention.ms": "soon"})
    assert (exc.value.code, exc.value.name) == (40, "INVALID_CONFIG") and "retention.ms" in str(exc.value)
    assert f"{name}-bad" not in kadmin.list_topics(timeout=10).topics
    with pytest.raises(E.InvalidPartitionsError):
        admin.create_topic(f"{name}-zero", 0)
    started = time.monotonic()
    with pytest.raises(E.UnknownTopicOrPartitionError) as exc:
        admin.describe_topic("adm-missing")
    assert exc.value.code == 3
    with pytest.raises(E.UnknownTopicOrPartitionError):
        admin.delete_topic("adm-missing")
    with pytest.raises(E.UnknownTopicOrPartitionError):
        admin.delete_records({("adm-missing", 0): 0})[("adm-missing", 0)]
    with pytest.raises(E.UnknownTopicOrPartitionError):
        admin.describe_configs([ConfigResource("topic", "adm-missing")])[ConfigResource("topic", "adm-missing")]
    assert time.monotonic() - started < 10, "a topic that does not exist must not be retried until the timeout"
    res = ConfigResource("topic", name)
    with pytest.raises(E.InvalidConfigError):
        admin.incremental_alter_configs({res: [AlterConfigOp("no.such.config", "1")]})[res]
    with pytest.raises(E.GroupIdNotFoundError):
        admin.delete_group("adm-no-such-group")
    assert admin.describe_group("adm-no-such-group").state == "Dead"
    with pytest.raises(E.TransactionalIdNotFoundError) as exc:
        admin.describe_transaction("adm-no-such-txn")
    assert exc.value.code == 105
    with pytest.raises(ConfigError, match="no.such.key"):
        Admin({"bootstrap.servers": "127.0.0.1:1", "no.such.key": 1})


# -- records and offsets ------------------------------------------------------------------------


def test_offsets_and_delete_records_match_confluent(admin: Any, broker: EmbeddedBroker, kadmin: AdminClient) -> None:
    name = f"adm-rec-{admin.mode}"
    admin.create_topic(name, 2)
    produce(broker.bootstrap, name, 50, 2)
    c = KConsumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{name}-wm"})
    try:
        def watermarks() -> dict[int, tuple[int, int]]:
            return {q: c.get_watermark_offsets(KTP(name, q), timeout=10) for q in range(2)}
        early = admin.list_offsets({(name, q): OffsetSpec.EARLIEST for q in range(2)})
        late = admin.list_offsets({(name, q): OffsetSpec.LATEST for q in range(2)})
        assert {q: (early[(name, q)].offset, late[(name, q)].offset) for q in range(2)} == watermarks() == \
            {0: (0, 50), 1: (0, 50)}
        by_time = admin.list_offsets({(name, 0): 1_700_000_000_000 + 10_500})
        theirs = c.offsets_for_times([KTP(name, 0, 1_700_000_000_000 + 10_500)], timeout=10)[0]
        assert by_time[(name, 0)].offset == theirs.offset == 11
        assert by_time[(name, 0)].timestamp == 1_700_000_000_000 + 11_000
        newest = admin.list_offsets({(name, 1): OffsetSpec.MAX_TIMESTAMP})[(name, 1)]
        assert (newest.offset, newest.timestamp) == (49, 1_700_000_000_000 + 49_000)

        result = admin.delete_records({(name, 0): 30, (name, 1): -1, (name, 7): 0})
        assert result[(name, 0)] == 30 and result[(name, 1)] == 50
        assert result.errors[(name, 7)].name == "UNKNOWN_TOPIC_OR_PARTITION"
        assert watermarks() == {0: (30, 50), 1: (50, 50)}
        with pytest.raises(E.OffsetOutOfRangeError):
            admin.delete_records({(name, 0): 51})[(name, 0)]
    finally:
        c.close()
    # confluent-kafka's own DeleteRecords and ours agree on the low watermark afterwards
    (fut,) = kadmin.delete_records([KTP(name, 0, 40)]).values()
    assert fut.result(15).low_watermark == 40
    assert admin.list_offsets({(name, 0): OffsetSpec.EARLIEST})[(name, 0)].offset == 40


# -- groups ----------------------------------------------------------------------------------------


def test_groups_match_confluent(admin: Any, broker: EmbeddedBroker, kadmin: AdminClient) -> None:
    topic, group = f"adm-grp-{admin.mode}", f"adm-g-{admin.mode}"
    admin.create_topic(topic, 4)
    produce(broker.bootstrap, topic, 10, 4)
    consumers = [KConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "client.id": f"c{i}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False,
                            "partition.assignment.strategy": "range"}) for i in range(2)]
    try:
        for c in consumers:
            c.subscribe([topic])

        def settled() -> bool:
            for c in consumers:
                c.poll(0.1)
            return all(len(c.assignment()) == 2 for c in consumers)
        wait_until(settled, 60, interval=0, message="two members with two partitions each")
        for i, c in enumerate(consumers):
            for tp in c.assignment():
                c.commit(offsets=[KTP(topic, tp.partition, 3 + tp.partition)], asynchronous=False)

        listed = {g.group_id: g for g in admin.list_groups()}
        assert listed[group].state == "Stable" and listed[group].protocol_type == "consumer"
        theirs = {g.group_id: g for g in kadmin.list_consumer_groups().result(10).valid}
        assert theirs[group].state.name == "STABLE"
        assert [g.group_id for g in admin.list_groups(states=["Stable"]) if g.group_id == group] == [group]
        assert [g.group_id for g in admin.list_groups(states=["Empty"]) if g.group_id == group] == []

        info = admin.describe_group(group)
        kinfo = kadmin.describe_consumer_groups([group])[group].result(10)
        assert (info.state, info.protocol) == ("Stable", "range") and kinfo.partition_assignor == "range"
        ours = {m.member_id: (m.client_id, sorted((t, p) for t, ps in m.assignment.items() for p in ps))
                for m in info.members}
        assert ours == {m.member_id: (m.client_id, sorted((tp.topic, tp.partition)
                                                           for tp in m.assignment.topic_partitions))
                        for m in kinfo.members}
        assert sorted(tp for _, tps in ours.values() for tp in tps) == [(topic, q) for q in range(4)]

        committed = admin.list_group_offsets(group)
        kcommitted = kadmin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
        assert committed == {(tp.topic, tp.partition): tp.offset for tp in kcommitted.topic_partitions} == \
            {(topic, q): 3 + q for q in range(4)}
        assert admin.list_group_offsets(group, [(topic, 1)]) == {(topic, 1): 4}
        lag = {(r["topic"], r["partition"]): (r["committed"], r["log_end"], r["lag"], r["member"])
               for r in admin.group_lag(group)}
        owner = {tp: m for m, (_, tps) in ours.items() for tp in tps}
        assert lag == {(topic, q): (3 + q, 10, 7 - q, owner[(topic, q)]) for q in range(4)}

        # while the group has members, an admin commit is refused, and the group cannot be deleted
        with pytest.raises(E.UnknownMemberIdError):
            admin.alter_group_offsets(group, {(topic, 0): 1}).raise_first()
        with pytest.raises(E.NonEmptyGroupError):
            admin.delete_group(group)
    finally:
        for c in consumers:
            c.close()

    wait_until(lambda: admin.describe_group(group).state == "Empty", 30, message="group empty")
    assert kadmin.describe_consumer_groups([group])[group].result(10).state.name == "EMPTY"
    res = admin.alter_group_offsets(group, {(topic, 0): 9, (topic, 1): 8})
    assert dict(res) == {(topic, 0): None, (topic, 1): None}
    kcommitted = kadmin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    assert {tp.partition: tp.offset for tp in kcommitted.topic_partitions} == {0: 9, 1: 8, 2: 5, 3: 6}
    admin.delete_group_offsets(group, [(topic, 2)]).raise_first()
    assert admin.list_group_offsets(group) == {(topic, 0): 9, (topic, 1): 8, (topic, 3): 6}
    plan = admin.plan_offset_reset(group, topic, "shift:-20")
    assert plan == {(topic, q): 0 for q in range(4)}
    admin.delete_group(group)
    assert group not in {g.group_id for g in kadmin.list_consumer_groups().result(10).valid}
    assert group not in {g.group_id for g in admin.list_groups()}


# -- transactions and producers ------------------------------------------------------------------


def test_transactions_of_a_confluent_producer(admin: Any, broker: EmbeddedBroker) -> None:
    topic, tid = f"adm-txn-{admin.mode}", f"adm-tid-{admin.mode}"
    admin.create_topic(topic, 2)
    p = KProducer({"bootstrap.servers": broker.bootstrap, "transactional.id": tid, "linger.ms": 0})
    p.init_transactions(15)
    p.begin_transaction()
    for q in (0, 1):
        p.produce(topic, value=b"x", partition=q)
    assert p.flush(15) == 0

    listed = {r.transactional_id: r for r in admin.list_transactions()}
    assert listed[tid].state == "Ongoing"
    assert [r.transactional_id for r in admin.list_transactions(states=["Ongoing"])
            if r.transactional_id == tid] == [tid]
    assert [r for r in admin.list_transactions(states=["CompleteAbort"]) if r.transactional_id == tid] == []
    desc = admin.describe_transaction(tid)
    assert desc.state == "Ongoing" and desc.partitions == ((topic, 0), (topic, 1))
    assert desc.producer_id == listed[tid].producer_id >= 0 and desc.start_time_ms > 0
    producers = admin.describe_producers([(topic, 0), (topic, 1)])
    for q in (0, 1):
        (state,) = [s for s in producers[(topic, q)] if s.producer_id == desc.producer_id]
        assert state.producer_epoch == desc.producer_epoch and state.current_txn_start_offset == 0
    # the open transaction holds the last stable offset (read_committed ListOffsets) at its first record
    rc = admin.list_offsets({(topic, 0): OffsetSpec.LATEST}, isolation_level="read_committed")
    ru = admin.list_offsets({(topic, 0): OffsetSpec.LATEST})
    assert (rc[(topic, 0)].offset, ru[(topic, 0)].offset) == (0, 1)
    # an open transaction well within its timeout is not hanging
    assert admin.find_hanging(topic, max_transaction_timeout_ms=0) == []
    p.commit_transaction(15)

    # EndTxn answers before the markers are written (as in Kafka): PrepareCommit, then CompleteCommit
    desc = wait_until(lambda: (d := admin.describe_transaction(tid)).state == "CompleteCommit" and d, 15,
                      message="CompleteCommit")
    assert desc.partitions == ()
    assert all(s.current_txn_start_offset == -1 for s in admin.describe_producers([(topic, 0)])[(topic, 0)])

    # KIP-664 abort of the open transaction on one partition, at its leader, as kafka-transactions.sh does
    p.begin_transaction()
    p.produce(topic, value=b"y", partition=0)
    assert p.flush(15) == 0
    spec = admin.abort_spec(topic, 0, 2)  # offsets 0 (record) and 1 (commit marker) came before
    assert spec == AbortSpec(topic, 0, desc.producer_id, desc.producer_epoch, spec.coordinator_epoch)
    admin.abort_transaction(spec)
    assert all(s.current_txn_start_offset == -1 for s in admin.describe_producers([(topic, 0)])[(topic, 0)])
    c = KConsumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{tid}-rc", "isolation.level": "read_committed"})
    try:  # the last stable offset moved past the aborted record: read_committed sees the whole log
        assert c.get_watermark_offsets(KTP(topic, 0), timeout=10) == (0, 4)
    finally:
        c.close()
    with pytest.raises(E.KafkaError, match="starting at offset 2"):
        admin.abort_spec(topic, 0, 2)
    p.abort_transaction(15)
