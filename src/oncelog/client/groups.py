"""Consumer-group administration over the protocol (``oncelog groups ...``).

Speaks only the Kafka protocol (FindCoordinator, ListGroups, DescribeGroups,
OffsetFetch, OffsetCommit, ListOffsets, DeleteGroups, Metadata), so it works
against Apache Kafka too. Never imports the broker.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from oncelog.client.connection import Connection
from oncelog.protocol.errors import code_name

LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 2, 3, 8, 9, 10
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 15, 16, 42


class GroupAdminError(Exception):
    pass


def parse_assignment(data: bytes) -> dict[str, list[int]]:
    """A ConsumerProtocolAssignment (any version): ``{topic: [partitions]}``."""
    if not data:
        return {}
    pos = 2  # version
    (n_topics,) = struct.unpack_from(">i", data, pos)
    pos += 4
    out: dict[str, list[int]] = {}
    for _ in range(max(n_topics, 0)):
        (n,) = struct.unpack_from(">h", data, pos)
        pos += 2
        topic = data[pos : pos + n].decode()
        pos += n
        (n_parts,) = struct.unpack_from(">i", data, pos)
        pos += 4
        parts = list(struct.unpack_from(f">{max(n_parts, 0)}i", data, pos))
        pos += 4 * max(n_parts, 0)
        out.setdefault(topic, []).extend(parts)
    return out


@dataclass
class MemberInfo:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    assignment: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class GroupInfo:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberInfo]
    error: str | None = None


class GroupAdmin:
    def __init__(self, bootstrap: str, timeout: float = 30.0) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.conn = Connection(bootstrap, client_id="oncelog-groups", timeout=timeout)
        self._coordinators: dict[str, Connection] = {}

    def __enter__(self) -> "GroupAdmin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for c in self._coordinators.values():
            if c is not self.conn:
                c.close()
        self.conn.close()

    # -- plumbing ---------------------------------------------------------------

    def coordinator(self, group: str) -> Connection:
        """The connection to the group's coordinator (FindCoordinator)."""
        v = self.conn.best_version(FIND_COORDINATOR, (0, 3))
        body: dict[str, Any] = {"key": group, "key_type": 0}
        resp = self.conn.request(FIND_COORDINATOR, v, body)
        if resp.error_code:
            raise GroupAdminError(f"FindCoordinator: {code_name(resp.error_code)}")
        address = f"{resp.host}:{resp.port}"
        if address == self.bootstrap:
            return self.conn
        conn = self._coordinators.get(address)
        if conn is None:
            conn = self._coordinators[address] = Connection(address, client_id="oncelog-groups", timeout=self.timeout)
        return conn

    # -- reads ------------------------------------------------------------------

    def list_groups(self) -> list[dict[str, str]]:
        v = self.conn.best_version(LIST_GROUPS, (0, 5))
        resp = self.conn.request(LIST_GROUPS, v, {"states_filter": (), "types_filter": ()})
        if resp.error_code:
            raise GroupAdminError(f"ListGroups: {code_name(resp.error_code)}")
        return [
            {"group_id": g.group_id, "protocol_type": g.protocol_type, "state": getattr(g, "group_state", "")}
            for g in resp.groups
        ]

    def describe(self, group: str) -> GroupInfo:
        conn = self.coordinator(group)
        v = conn.best_version(DESCRIBE_GROUPS, (0, 6))
        resp = conn.request(DESCRIBE_GROUPS, v, {"groups": (group,), "include_authorized_operations": False})
        g = resp.groups[0]
        members = []
        for m in g.members:
            try:
                assignment = parse_assignment(bytes(m.member_assignment)) if g.protocol_type == "consumer" else {}
            except (struct.error, UnicodeDecodeError):
                assignment = {}
            members.append(MemberInfo(m.member_id, getattr(m, "group_instance_id", None), m.client_id,
                                      m.client_host, assignment))
        return GroupInfo(g.group_id, g.group_state, g.protocol_type, g.protocol_data, members,
                         code_name(g.error_code) if g.error_code else None)

    def committed(self, group: str) -> dict[tuple[str, int], int]:
        """Every committed offset of ``group`` (OffsetFetch with all topics)."""
        conn = self.coordinator(group)
        v = conn.best_version(OFFSET_FETCH, (2, 7))
        resp = conn.request(OFFSET_FETCH, v, {"group_id": group, "topics": None, "require_stable": False})
        if resp.error_code:
            raise GroupAdminError(f"OffsetFetch: {code_name(resp.error_code)}")
        out = {}
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    raise GroupAdminError(f"OffsetFetch {t.name}-{p.partition_index}: {code_name(p.error_code)}")
                if p.committed_offset >= 0:
                    out[(t.name, p.partition_index)] = p.committed_offset
        return out

    def partitions(self, topic: str) -> list[int]:
        v = self.conn.best_version(METADATA, (1, 12))
        md = self.conn.request(METADATA, v, {
            "topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False})
        t = md.topics[0]
        if t.error_code:
            raise GroupAdminError(f"topic {topic}: {code_name(t.error_code)}")
        return sorted(p.partition_index for p in t.partitions)

    def list_offsets(self, tps: list[tuple[str, int]], timestamp: int) -> dict[tuple[str, int], int]:
        """ListOffsets: -1 latest (high watermark), -2 earliest, else by time."""
        if not tps:
            return {}
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        v = self.conn.best_version(LIST_OFFSETS, (1, 8))
        resp = self.conn.request(LIST_OFFSETS, v, {
            "replica_id": -1, "isolation_level": 0,
            "topics": [{"name": t, "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": timestamp}
                                                  for p in ps]} for t, ps in by_topic.items()]})
        out = {}
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    raise GroupAdminError(f"ListOffsets {t.name}-{p.partition_index}: {code_name(p.error_code)}")
                out[(t.name, p.partition_index)] = p.offset
        return out

    def lag(self, group: str) -> list[dict[str, Any]]:
        """Per partition (committed or assigned): committed offset, log end, lag and owner."""
        info = self.describe(group)
        owner: dict[tuple[str, int], str] = {}
        for m in info.members:
            for topic, parts in m.assignment.items():
                for p in parts:
                    owner[(topic, p)] = m.member_id
        committed = self.committed(group)
        tps = sorted(set(committed) | set(owner))
        ends = self.list_offsets(tps, -1)
        rows = []
        for tp in tps:
            c = committed.get(tp)
            end = ends.get(tp, -1)
            rows.append({"topic": tp[0], "partition": tp[1], "committed": c, "log_end": end,
                         "lag": None if c is None else max(end - c, 0), "member": owner.get(tp)})
        return rows

    # -- writes -----------------------------------------------------------------

    def delete(self, group: str) -> str | None:
        conn = self.coordinator(group)
        v = conn.best_version(DELETE_GROUPS, (0, 2))
        resp = conn.request(DELETE_GROUPS, v, {"groups_names": (group,)})
        code = resp.results[0].error_code
        return None if code == 0 else code_name(code)

    def commit(self, group: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], str]:
        """Commit as an admin (generation -1, no member): only allowed while the group is empty."""
        conn = self.coordinator(group)
        v = conn.best_version(OFFSET_COMMIT, (2, 9))
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for (t, p), off in sorted(offsets.items()):
            by_topic.setdefault(t, []).append((p, off))
        body = {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "retention_time": -1,
            "topics": [{"name": t, "partitions": [{"partition_index": p, "committed_offset": off,
                                                   "committed_leader_epoch": -1, "committed_metadata": ""}
                                                  for p, off in parts]} for t, parts in by_topic.items()],
        }
        resp = conn.request(OFFSET_COMMIT, v, body)
        errors = {}
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    errors[(t.name, p.partition_index)] = code_name(p.error_code)
        return errors

    def plan_reset(self, group: str, topic: str, to: str, partitions: list[int] | None = None) -> dict[tuple[str, int], int]:
        """Target offsets for ``--to-earliest``/``--to-latest``/``--to-offset N``/``--shift-by N``."""
        parts = partitions if partitions is not None else self.partitions(topic)
        tps = [(topic, p) for p in parts]
        earliest = self.list_offsets(tps, -2)
        latest = self.list_offsets(tps, -1)
        if to == "earliest":
            return earliest
        if to == "latest":
            return latest
        kind, _, number = to.partition(":")
        n = int(number)
        if kind == "offset":
            return {tp: min(max(n, earliest[tp]), latest[tp]) for tp in tps}
        if kind == "shift":
            current = self.committed(group)
            return {tp: min(max(current.get(tp, latest[tp]) + n, earliest[tp]), latest[tp]) for tp in tps}
        raise ValueError(f"unknown reset target {to!r}")
