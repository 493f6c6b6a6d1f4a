"""Consumer-group pieces of the admin client: the consumer protocol's assignment decoding and the
group description types (:class:`GroupInfo`, :class:`MemberInfo`).

The requests themselves (ListGroups, DescribeGroups, OffsetFetch, OffsetCommit,
OffsetDelete, DeleteGroups) are made by :class:`oncelog.client.Admin`;
``GroupAdmin`` is importable from here for older callers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from oncelog.client.errors import KafkaError

GroupAdminError = KafkaError  # the former group admin's error: the admin client raises typed KafkaErrors


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


def __getattr__(name: str) -> Any:
    if name == "GroupAdmin":  # the admin client imports this module: resolved lazily
        from oncelog.client.admin import GroupAdmin

        return GroupAdmin
    raise AttributeError(name)
