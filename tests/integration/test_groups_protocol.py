"""The group APIs over the wire, every version, with oncelog's protocol client.

Each version of FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, OffsetDelete, ListGroups,
DescribeGroups and DeleteGroups is sent to a real broker and its answer
decoded; the error codes Kafka gives for bad input are checked on the wire.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from oncelog.client.connection import Connection
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(120)

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 15, 16, 42, 47
TOPIC, PARTITIONS = "proto-t", 3


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


@pytest.fixture(scope="module")
def gbroker(tmp_path_factory: Any) -> Iterator[EmbeddedBroker]:
    d = tmp_path_factory.mktemp("groups-proto")
    b = EmbeddedBroker(data_dir=d / "data", log_path=d / "broker.log",
                       config={"group.initial.rebalance.delay.ms": "0"})
    b.start()
    try:
        with Connection(b.bootstrap) as c:
            resp = c.request(19, 5, {"topics": [{"name": TOPIC, "num_partitions": PARTITIONS, "replication_factor": 1,
                                                 "assignments": [], "configs": []}],
                                     "timeout": 10000, "validate_only": False})
            assert resp.topics[0].error_code == 0
        yield b
    finally:
        b.close()


@pytest.fixture
def conn(gbroker: EmbeddedBroker) -> Iterator[Connection]:
    with Connection(gbroker.bootstrap) as c:
        yield c


def topic_id(conn: Connection) -> uuid.UUID:
    md = conn.request(3, 12, {"topics": [{"name": TOPIC, "topic_id": None}], "allow_auto_topic_creation": False,
                              "include_topic_authorized_operations": False})
    return md.topics[0].topic_id


@pytest.mark.parametrize("version", range(0, 7))
def test_find_coordinator(conn: Connection, gbroker: EmbeddedBroker, version: int) -> None:
    port = gbroker.port
    if version < 4:
        for key_type in ((0,) if version == 0 else (0, 1)):
            r = conn.request(FIND_COORDINATOR, version, {"key": "any-group", "key_type": key_type})
            assert (r.error_code, r.node_id, r.host, r.port) == (0, 1, "127.0.0.1", port)
        if version >= 1:
            r = conn.request(FIND_COORDINATOR, version, {"key": "x", "key_type": 2})
            assert r.error_code == E.invalid_request
    else:
        r = conn.request(FIND_COORDINATOR, version, {"key_type": 1, "coordinator_keys": ("txn-a", "txn-b")})
        assert [(c.key, c.error_code, c.node_id, c.port) for c in r.coordinators] == [
            ("txn-a", 0, 1, port), ("txn-b", 0, 1, port)]
        r = conn.request(FIND_COORDINATOR, version, {"key_type": 0, "coordinator_keys": ("g",)})
        assert r.coordinators[0].error_code == 0 and r.coordinators[0].error_message is None


def join(conn: Connection, version: int, group: str, member_id: str = "", instance: str | None = None,
         session: int = 10000) -> Any:
    return conn.request(JOIN_GROUP, version, {
        "group_id": group, "session_timeout": session, "rebalance_timeout": 20000, "member_id": member_id,
        "group_instance_id": instance, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": subscription(TOPIC)}], "reason": None})


@pytest.mark.parametrize("version", range(0, 10))
def test_group_lifecycle_each_join_version(conn: Connection, version: int) -> None:
    """Join, sync, heartbeat, commit, fetch and leave with JoinGroup v<version> and
    the matching versions of the other APIs."""
    group = f"life-{version}"
    r = join(conn, version, group)
    if version >= 4:
        assert r.error_code == E.member_id_required and r.member_id.startswith("oncelog-cli-")
        r = join(conn, version, group, r.member_id)
    assert r.error_code == 0, E(r.error_code)
    me, gen = r.member_id, r.generation_id
    assert gen == 1 and r.leader == me
    assert [(m.member_id, bytes(m.metadata)) for m in r.members] == [(me, subscription(TOPIC))]
    assert r.protocol_name == "range"
    sync_v = min(version, 5)
    s = conn.request(SYNC_GROUP, sync_v, {
        "group_id": group, "generation_id": gen, "member_id": me, "group_instance_id": None,
        "protocol_type": "consumer", "protocol_name": "range",
        "assignments": [{"member_id": me, "assignment": b"assigned"}]})
    assert s.error_code == 0 and bytes(s.assignment) == b"assigned"
    hb_v = min(version, 4)
    h = conn.request(HEARTBEAT, hb_v, {"group_id": group, "generation_id": gen, "member_id": me,
                                        "group_instance_id": None})
    assert h.error_code == 0
    h = conn.request(HEARTBEAT, hb_v, {"group_id": group, "generation_id": gen + 5, "member_id": me,
                                        "group_instance_id": None})
    assert h.error_code == E.illegal_generation
    # commit with a wrong generation, then the right one
    commit_v = max(2, min(version, 9))
    body = {"group_id": group, "generation_id_or_member_epoch": gen + 1, "member_id": me, "group_instance_id": None,
            "retention_time": -1,
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 1, "committed_offset": 42,
                                                       "committed_leader_epoch": 0, "committed_metadata": "meta"}]}]}
    c = conn.request(OFFSET_COMMIT, commit_v, body)
    assert c.topics[0].partitions[0].error_code == E.illegal_generation
    body["generation_id_or_member_epoch"] = gen
    c = conn.request(OFFSET_COMMIT, commit_v, body)
    assert c.topics[0].partitions[0].error_code == 0
    fetch_v = max(1, min(version, 7))
    f = conn.request(OFFSET_FETCH, fetch_v, {"group_id": group, "topics": [{"name": TOPIC, "partition_indexes": (0, 1)}],
                                             "require_stable": False})
    got = {p.partition_index: (p.committed_offset, p.metadata, p.error_code) for p in f.topics[0].partitions}
    assert got == {0: (-1, "", 0), 1: (42, "meta", 0)}
    leave_v = min(version, 5)
    if leave_v < 3:
        lv = conn.request(LEAVE_GROUP, leave_v, {"group_id": group, "member_id": me})
        assert lv.error_code == 0
    else:
        lv = conn.request(LEAVE_GROUP, leave_v, {"group_id": group, "members": [
            {"member_id": me, "group_instance_id": None, "reason": "done"},
            {"member_id": "ghost", "group_instance_id": None, "reason": None}]})
        assert lv.error_code == 0
        assert [(m.member_id, m.error_code) for m in lv.members] == [(me, 0), ("ghost", E.unknown_member_id)]


@pytest.mark.parametrize("version", range(1, 11))
def test_offset_fetch_unknown_group_is_minus_one_without_error(conn: Connection, version: int) -> None:
    tid = topic_id(conn)
    if version < 8:
        f = conn.request(OFFSET_FETCH, version, {"group_id": "never-seen",
                                                 "topics": [{"name": TOPIC, "partition_indexes": (0, 2)}],
                                                 "require_stable": True})
        if version >= 2:
            assert f.error_code == 0
        parts = f.topics[0].partitions
    else:
        topic: dict[str, Any] = {"topic_id": tid} if version >= 10 else {"name": TOPIC}
        f = conn.request(OFFSET_FETCH, version, {"groups": [
            {"group_id": "never-seen", "member_id": None, "member_epoch": -1,
             "topics": [{**topic, "partition_indexes": (0, 2)}]},
            {"group_id": "never-seen-2", "member_id": None, "member_epoch": -1, "topics": None}],
            "require_stable": False})
        assert [g.error_code for g in f.groups] == [0, 0]
        assert f.groups[1].topics == ()
        parts = f.groups[0].topics[0].partitions
    assert [(p.partition_index, p.committed_offset, p.error_code) for p in parts] == [(0, -1, 0), (2, -1, 0)]


@pytest.mark.parametrize("version", range(2, 11))
def test_offset_commit_bad_input(conn: Connection, version: int) -> None:
    group = f"simple-{version}"
    tid = topic_id(conn)

    def topic(name: str, t_id: uuid.UUID, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return {"name": name, "topic_id": t_id, "partitions": parts}

    def part(i: int, offset: int, meta: str | None = "") -> dict[str, Any]:
        return {"partition_index": i, "committed_offset": offset, "committed_leader_epoch": -1, "committed_metadata": meta}

    c = conn.request(OFFSET_COMMIT, version, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
        "retention_time": -1,
        "topics": [topic(TOPIC, tid, [part(0, 7, None), part(1, 8, "x" * 4097), part(9, 1)]),
                   topic("no-such-topic", uuid.uuid4(), [part(0, 1)])]})
    errors = [[p.error_code for p in t.partitions] for t in c.topics]
    unknown_topic = E.unknown_topic_id if version >= 10 else E.unknown_topic_or_partition
    assert errors == [[0, E.offset_metadata_too_large, E.unknown_topic_or_partition], [unknown_topic]]
    # a generation for a group that does not exist
    c = conn.request(OFFSET_COMMIT, version, {
        "group_id": f"nonexistent-{version}", "generation_id_or_member_epoch": 3, "member_id": "m",
        "group_instance_id": None, "retention_time": -1, "topics": [topic(TOPIC, tid, [part(0, 1)])]})
    assert c.topics[0].partitions[0].error_code == E.illegal_generation
    f = conn.request(OFFSET_FETCH, 7, {"group_id": group, "topics": None, "require_stable": False})
    assert [(t.name, [(p.partition_index, p.committed_offset, p.metadata) for p in t.partitions]) for t in f.topics] == [
        (TOPIC, [(0, 7, "")])]


def test_static_member_over_the_wire(conn: Connection) -> None:
    group = "static-wire"
    r = join(conn, 9, group, instance="box-1")  # static members skip MEMBER_ID_REQUIRED
    assert r.error_code == 0 and r.member_id.startswith("box-1-")
    first = r.member_id
    s = conn.request(SYNC_GROUP, 5, {"group_id": group, "generation_id": 1, "member_id": first,
                                      "group_instance_id": "box-1", "protocol_type": "consumer",
                                      "protocol_name": "range", "assignments": [{"member_id": first, "assignment": b"a"}]})
    assert s.error_code == 0
    r = join(conn, 9, group, instance="box-1")  # a restart
    assert r.error_code == 0 and r.member_id != first and r.generation_id == 1 and r.skip_assignment
    h = conn.request(HEARTBEAT, 4, {"group_id": group, "generation_id": 1, "member_id": first,
                                     "group_instance_id": "box-1"})
    assert h.error_code == E.fenced_instance_id
    r2 = join(conn, 9, group, member_id=first, instance="box-1")
    assert r2.error_code == E.fenced_instance_id


@pytest.mark.parametrize("version", range(0, 7))
def test_describe_groups(conn: Connection, version: int) -> None:
    group = f"desc-{version}"
    r = join(conn, 5, group, instance=f"i-{version}")
    me = r.member_id
    conn.request(SYNC_GROUP, 3, {"group_id": group, "generation_id": r.generation_id, "member_id": me,
                                  "group_instance_id": f"i-{version}",
                                  "assignments": [{"member_id": me, "assignment": b"zz"}]})
    d = conn.request(DESCRIBE_GROUPS, version, {"groups": (group, "missing"), "include_authorized_operations": True})
    g, missing = d.groups
    assert (g.error_code, g.group_id, g.group_state, g.protocol_type, g.protocol_data) == (
        0, group, "Stable", "consumer", "range")
    [m] = g.members
    assert (m.member_id, m.client_id, m.client_host) == (me, "oncelog-cli", "/127.0.0.1")
    assert bytes(m.member_metadata) == subscription(TOPIC) and bytes(m.member_assignment) == b"zz"
    if version >= 4:
        assert m.group_instance_id == f"i-{version}"
    assert missing.group_state == "Dead" and missing.members == ()
    assert missing.error_code == (E.group_id_not_found if version >= 6 else 0)


@pytest.mark.parametrize("version", range(0, 6))
def test_list_groups(conn: Connection, version: int) -> None:
    group = f"list-{version}"
    conn.request(OFFSET_COMMIT, 2, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                                    "retention_time": -1, "topics": [{"name": TOPIC, "partitions": [
                                        {"partition_index": 0, "committed_offset": 1, "committed_metadata": None}]}]})
    resp = conn.request(LIST_GROUPS, version, {"states_filter": ("EMPTY",), "types_filter": ("classic",)})
    assert resp.error_code == 0
    listed = {g.group_id: g for g in resp.groups}
    assert listed[group].protocol_type == ""
    if version >= 4:
        assert listed[group].group_state == "Empty"
        assert all(g.group_state == "Empty" for g in resp.groups)
    if version >= 5:
        assert listed[group].group_type == "classic"
        none = conn.request(LIST_GROUPS, version, {"states_filter": (), "types_filter": ("consumer",)})
        assert none.groups == ()


@pytest.mark.parametrize("version", range(0, 3))
def test_delete_groups_and_offsets(conn: Connection, version: int) -> None:
    empty, busy = f"del-empty-{version}", f"del-busy-{version}"
    conn.request(OFFSET_COMMIT, 2, {"group_id": empty, "generation_id_or_member_epoch": -1, "member_id": "",
                                    "retention_time": -1, "topics": [{"name": TOPIC, "partitions": [
                                        {"partition_index": p, "committed_offset": 5, "committed_metadata": None}
                                        for p in range(PARTITIONS)]}]})
    od = conn.request(OFFSET_DELETE, 0, {"group_id": empty, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0}, {"partition_index": 99}]}]})
    assert od.error_code == 0
    assert [(p.partition_index, p.error_code) for p in od.topics[0].partitions] == [
        (0, 0), (99, E.unknown_topic_or_partition)]
    assert conn.request(OFFSET_DELETE, 0, {"group_id": "nope", "topics": []}).error_code == E.group_id_not_found
    r = join(conn, 5, busy, instance="x")
    assert r.error_code == 0
    d = conn.request(DELETE_GROUPS, version, {"groups_names": (empty, busy, "nope")})
    assert [(x.group_id, x.error_code) for x in d.results] == [
        (empty, 0), (busy, E.non_empty_group), ("nope", E.group_id_not_found)]
    f = conn.request(OFFSET_FETCH, 7, {"group_id": empty, "topics": None, "require_stable": False})
    assert f.topics == ()


def test_join_bad_input(conn: Connection) -> None:
    assert join(conn, 9, "bad", session=1000).error_code == E.invalid_session_timeout
    assert join(conn, 9, "").error_code == E.invalid_group_id
    assert join(conn, 9, "bad", member_id="made-up").error_code == E.unknown_member_id
    r = conn.request(JOIN_GROUP, 9, {
        "group_id": "bad2", "session_timeout": 10000, "rebalance_timeout": 20000, "member_id": "",
        "group_instance_id": "s", "protocol_type": "consumer", "protocols": []})
    assert r.error_code == E.inconsistent_group_protocol
    # v0-v6 carry "" (not null) as the protocol name of an error
    r = conn.request(JOIN_GROUP, 5, {"group_id": "", "session_timeout": 10000, "rebalance_timeout": 1, "member_id": "",
                                      "protocol_type": "consumer", "protocols": []})
    assert r.error_code == E.invalid_group_id and r.protocol_name == ""
