"""Authorized operations (Metadata v8+, DescribeCluster, DescribeGroups v3+).

oncelog has no authorizer, so, as Kafka without one, a request that asks for
authorized operations gets every operation the resource type supports, as a
bitfield of ACL operation codes; one that does not ask gets -2**31.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest

from oncelog.client.connection import Connection
from oncelog.testing import EmbeddedBroker

METADATA, OFFSET_COMMIT, DESCRIBE_GROUPS, DESCRIBE_CLUSTER = 3, 8, 15, 60
NOT_REQUESTED = -2147483648
# AclOperation codes: READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8,
# CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12
TOPIC_OPS = {3, 4, 5, 6, 7, 8, 10, 11}
GROUP_OPS = {3, 6, 8, 10, 11}
CLUSTER_OPS = {5, 7, 8, 9, 10, 11, 12}


def ops(field: int) -> set[int]:
    assert field >= 0, field
    return {bit for bit in range(32) if field & (1 << bit)}


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Connection]:
    tmp: Path = tmp_path_factory.mktemp("authops")
    with EmbeddedBroker(data_dir=tmp / "data", log_path=tmp / "broker.log") as b:
        with Connection(b.bootstrap, client_id="authops") as c:
            r = c.request(METADATA, 4, {"topics": [{"name": "authops"}], "allow_auto_topic_creation": True})
            assert r.topics[0].error_code == 0
            r = c.request(OFFSET_COMMIT, 2, {
                "group_id": "authops-group", "generation_id_or_member_epoch": -1, "member_id": "",
                "retention_time_ms": -1,
                "topics": [{"name": "authops", "partitions": [
                    {"partition_index": 0, "committed_offset": 0, "committed_metadata": ""}]}]})
            assert r.topics[0].partitions[0].error_code == 0
            yield c


def metadata(conn: Connection, version: int, topics: list[str] | None, include_topic: bool,
             include_cluster: bool) -> object:
    body: dict[str, object] = {
        "topics": None if topics is None else [
            {"name": t, **({"topic_id": uuid.UUID(int=0)} if version >= 10 else {})} for t in topics],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": include_topic,
    }
    if version <= 10:
        body["include_cluster_authorized_operations"] = include_cluster
    return conn.request(METADATA, version, body)


@pytest.mark.parametrize("version", range(8, 13))
@pytest.mark.parametrize("all_topics", [False, True])
def test_metadata_topic_operations(conn: Connection, version: int, all_topics: bool) -> None:
    names = None if all_topics else ["authops", "no-such-topic"]
    asked = metadata(conn, version, names, include_topic=True, include_cluster=False)
    by_name = {t.name: t for t in asked.topics}
    assert ops(by_name["authops"].topic_authorized_operations) == TOPIC_OPS
    if not all_topics:
        # Kafka sets them on every topic it answers by name, errors included
        assert by_name["no-such-topic"].error_code == 3
        assert ops(by_name["no-such-topic"].topic_authorized_operations) == TOPIC_OPS
    plain = metadata(conn, version, names, include_topic=False, include_cluster=False)
    assert {t.topic_authorized_operations for t in plain.topics} == {NOT_REQUESTED}
    # the cached all-topics answer must not leak one choice into the other
    again = metadata(conn, version, names, include_topic=True, include_cluster=False)
    assert ops({t.name: t for t in again.topics}["authops"].topic_authorized_operations) == TOPIC_OPS


@pytest.mark.parametrize("version", range(8, 11))
@pytest.mark.parametrize("all_topics", [False, True])
def test_metadata_cluster_operations_v8_to_v10(conn: Connection, version: int, all_topics: bool) -> None:
    names = None if all_topics else ["authops"]
    asked = metadata(conn, version, names, include_topic=False, include_cluster=True)
    assert ops(asked.cluster_authorized_operations) == CLUSTER_OPS
    assert {t.topic_authorized_operations for t in asked.topics} == {NOT_REQUESTED}
    plain = metadata(conn, version, names, include_topic=False, include_cluster=False)
    assert plain.cluster_authorized_operations == NOT_REQUESTED


@pytest.mark.parametrize("version", range(0, 3))
def test_describe_cluster_operations(conn: Connection, version: int) -> None:
    body: dict[str, object] = {"include_cluster_authorized_operations": True}
    if version >= 1:
        body["endpoint_type"] = 1
    if version >= 2:
        body["include_fenced_brokers"] = False
    asked = conn.request(DESCRIBE_CLUSTER, version, body)
    assert asked.error_code == 0
    assert ops(asked.cluster_authorized_operations) == CLUSTER_OPS
    body["include_cluster_authorized_operations"] = False
    assert conn.request(DESCRIBE_CLUSTER, version, body).cluster_authorized_operations == NOT_REQUESTED


@pytest.mark.parametrize("version", range(3, 7))
def test_describe_groups_operations(conn: Connection, version: int) -> None:
    asked = conn.request(DESCRIBE_GROUPS, version, {
        "groups": ["authops-group", "no-such-group"], "include_authorized_operations": True})
    found, missing = asked.groups
    assert found.error_code == 0 and found.group_state == "Empty"
    assert ops(found.authorized_operations) == GROUP_OPS
    if version >= 6:
        # an error answer carries no operations, as in Kafka
        assert missing.error_code != 0
        assert missing.authorized_operations == NOT_REQUESTED
    plain = conn.request(DESCRIBE_GROUPS, version, {
        "groups": ["authops-group"], "include_authorized_operations": False})
    assert plain.groups[0].authorized_operations == NOT_REQUESTED


def test_confluent_admin_sees_the_operations(tmp_path: Path) -> None:
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation, AdminClient

    with EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log") as b:
        with Connection(b.bootstrap) as c:
            c.request(METADATA, 4, {"topics": [{"name": "authops"}], "allow_auto_topic_creation": True})
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
        assert {op.value for op in cluster.authorized_operations} == CLUSTER_OPS
        (fut,) = admin.describe_topics(TopicCollection(["authops"]), include_authorized_operations=True).values()
        assert {op.value for op in fut.result(30).authorized_operations} == TOPIC_OPS
        assert AclOperation.WRITE in fut.result(30).authorized_operations
        plain = admin.describe_cluster(include_authorized_operations=False).result(30)
        assert not plain.authorized_operations
