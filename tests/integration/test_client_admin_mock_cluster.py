"""oncelog's Admin against librdkafka's mock cluster: a second, independent Kafka implementation.

The mock (3 brokers, leaders spread over them) implements Metadata,
ListOffsets, FindCoordinator, OffsetCommit and OffsetFetch but not
CreateTopics, DeleteTopics or the describe/list-groups APIs, so here:
topics are created through the mock's own call, described and listed by the
Admin and compared with confluent-kafka's view of the same mock; offsets are
listed at three different leaders; group offsets go through the mock's
coordinator; and the APIs the mock lacks fail at once with the typed
UNSUPPORTED_VERSION error (version negotiation, not a hang or a crash).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as KConsumer
from confluent_kafka import Producer as KProducer
from confluent_kafka import TopicPartition as KTP

from oncelog.client import Admin, OffsetSpec
from oncelog.client import errors as E
from tests.integration.test_client_mock_cluster import _mock_cluster_class

pytestmark = [pytest.mark.timeout(120)]

PARTITIONS = 6


@pytest.fixture
def mock() -> Iterator[Any]:
    with _mock_cluster_class()(3) as m:
        yield m


def test_admin_topics_offsets_and_group_offsets_on_the_mock(mock: Any) -> None:
    mock.create_topic("t", PARTITIONS)
    mock.create_topic("u", 2)
    p = KProducer({"bootstrap.servers": mock.bootstrap, "linger.ms": 5})
    for q in range(PARTITIONS):
        for i in range(q + 1):
            p.produce("t", value=b"v%d" % i, partition=q)
    assert p.flush(30) == 0
    c = KConsumer({"bootstrap.servers": mock.bootstrap, "group.id": "mock-admin"})
    try:
        kmd = c.list_topics(timeout=10)
        kwm = {q: c.get_watermark_offsets(KTP("t", q), timeout=10) for q in range(PARTITIONS)}
    finally:
        c.close()
    with Admin({"bootstrap.servers": mock.bootstrap, "default.api.timeout.ms": 15000}) as admin:
        cluster = admin.describe_cluster()
        assert sorted(cluster.brokers) == sorted(kmd.brokers) and len(cluster.brokers) == 3
        assert admin.list_topics() == sorted(t for t in kmd.topics if not t.startswith("__")) == ["t", "u"]
        desc = admin.describe_topic("t")
        leaders = {p.partition: p.leader for p in desc.partitions}
        assert leaders == {q: kmd.topics["t"].partitions[q].leader for q in range(PARTITIONS)}
        assert len(set(leaders.values())) > 1, "all leaders on one broker: routing would not be checked"
        assert [list(p.replicas) for p in desc.partitions] == \
            [kmd.topics["t"].partitions[q].replicas for q in range(PARTITIONS)]
        with pytest.raises(E.UnknownTopicOrPartitionError):
            admin.describe_topic("nope")

        # ListOffsets goes to each partition's leader (the mock answers NOT_LEADER_OR_FOLLOWER elsewhere)
        tps = [("t", q) for q in range(PARTITIONS)]
        early = admin.list_offsets({tp: OffsetSpec.EARLIEST for tp in tps})
        late = admin.list_offsets({tp: OffsetSpec.LATEST for tp in tps})
        assert {q: (early[("t", q)].offset, late[("t", q)].offset) for q in range(PARTITIONS)} == kwm == \
            {q: (0, q + 1) for q in range(PARTITIONS)}

        # group offsets through the mock's coordinator, read back by a confluent-kafka consumer
        admin.alter_group_offsets("mock-g", {("t", 0): 1, ("t", 5): 4}).raise_first()
        # (the mock cannot list "every committed partition": ask for the partitions)
        assert admin.list_group_offsets("mock-g", [("t", 0), ("t", 1), ("t", 5)]) == {("t", 0): 1, ("t", 5): 4}
        k = KConsumer({"bootstrap.servers": mock.bootstrap, "group.id": "mock-g"})
        try:
            got = k.committed([KTP("t", 0), KTP("t", 5)], timeout=10)
        finally:
            k.close()
        assert [(tp.partition, tp.offset) for tp in got] == [(0, 1), (5, 4)]

        # what the mock does not implement is refused at once, typed
        started = time.monotonic()
        for call in (lambda: admin.create_topic("new", 1), lambda: admin.delete_topic("u"),
                     lambda: admin.list_groups()):
            with pytest.raises(E.UnsupportedApiError) as exc:
                call()
            assert (exc.value.code, exc.value.name) == (35, "UNSUPPORTED_VERSION")
        assert time.monotonic() - started < 5
        assert admin.list_topics() == ["t", "u"]
