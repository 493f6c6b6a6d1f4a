"""Metadata (key 3).

Behavior: this node is the only broker, the controller and the leader of
every partition (replicas = ISR = [this node]); a partition's leader epoch
is the one it got when this broker opened it (bumped at every start,
:meth:`PartitionLog.become_leader`), as Fetch, ListOffsets and
OffsetForLeaderEpoch check it. A null topic
list means all topics; a named topic that does not exist is auto-created
when ``auto.create.topics.enable`` is true and the request allows it,
otherwise it gets UNKNOWN_TOPIC_OR_PARTITION. An illegal name gets
INVALID_TOPIC_EXCEPTION. Lookups by topic id (v10+) that miss get
UNKNOWN_TOPIC_ID.

Version notes:
- v0: an empty topic list means all topics; auto-creation always allowed.
- v1+: null means all topics, an empty list means none.
- v4+: ``allow_auto_topic_creation``.
- v8+: authorized operations. With ``include_topic_authorized_operations``
  each topic answered by name carries every operation a topic supports, and
  v8-v10 with ``include_cluster_authorized_operations`` the cluster's (no
  authorizer, as in Kafka without one: :mod:`oncelog.broker.authorized_ops`);
  otherwise -2147483648. Lookups by id that miss and v10-v11 null names keep
  the default.
- v10+: topic ids; v10-v11 cannot look a topic up by id (a null name gets
  INVALID_REQUEST, as in Kafka), v12+ can. v9+ flexible.

Cost: the answer for all topics is encoded once per version and reused
until the topic/partition set changes (``broker.topology_version``): at
10,000 partitions encoding it takes hundreds of milliseconds on the event
loop (docs/benchmarks.md).
"""

from __future__ import annotations

import uuid
from typing import Any

from oncelog.broker.broker import Topic
from oncelog.broker.authorized_ops import CLUSTER_OPERATIONS, NOT_REQUESTED, TOPIC_OPERATIONS
from oncelog.broker.context import RequestContext
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import encode_response, response_type
from oncelog.protocol.errors import ErrorCode, KafkaError

API_KEY = 3
MIN_VERSION = 0
MAX_VERSION = 12

_ZERO_UUID = uuid.UUID(int=0)


def topic_entry(broker: Any, topic: Topic, ops: int = NOT_REQUESTED) -> dict[str, Any]:
    node = broker.node_id
    return {
        "error_code": 0,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": topic.internal,
        "partitions": [
            {
                "error_code": 0,
                "partition_index": p.index,
                "leader_id": node,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": [node],
                "isr_nodes": [node],
                "offline_replicas": [],
            }
            for p in topic.partitions
        ],
        "topic_authorized_operations": ops,
    }


def _error_entry(name: str | None, topic_id: uuid.UUID | None, code: int,
                 ops: int = NOT_REQUESTED) -> dict[str, Any]:
    return {
        "error_code": code,
        "name": name,
        "topic_id": topic_id or _ZERO_UUID,
        "is_internal": False,
        "partitions": [],
        "topic_authorized_operations": ops,
    }


def _all_topics(broker: Any, version: int, topic_ops: int, cluster_ops: int) -> bytes:
    """The encoded all-topics answer, cached per version (and authorized-operations
    choice) until the topology changes."""
    cache: dict[Any, tuple[Any, bytes]] = broker.metadata_cache
    key = (broker.topology_version, broker.config.advertised, broker.cluster_id, broker.node_id)
    slot = version if topic_ops == NOT_REQUESTED and cluster_ops == NOT_REQUESTED else (version, topic_ops, cluster_ops)
    hit = cache.get(slot)
    if hit is not None and hit[0] == key:
        return hit[1]
    body = _answer(broker, [topic_entry(broker, t, topic_ops) for t in list(broker.topics.values())], cluster_ops)
    encoded = encode_response(materialize(response_type(API_KEY, version), body))
    cache[slot] = (key, encoded)
    return encoded


def _answer(broker: Any, entries: list[dict[str, Any]], cluster_ops: int = NOT_REQUESTED) -> dict[str, Any]:
    host, port = broker.config.advertised
    return {
        "throttle_time": 0,
        "brokers": [{"node_id": broker.node_id, "host": host, "port": port, "rack": None}],
        "cluster_id": broker.cluster_id,
        "controller_id": broker.node_id,
        "topics": entries,
        "cluster_authorized_operations": cluster_ops,
    }


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any] | bytes:
    broker = ctx.broker
    version = ctx.version
    wanted = request.topics
    topic_ops = cluster_ops = NOT_REQUESTED
    if version >= 8 and getattr(request, "include_topic_authorized_operations", False):
        topic_ops = TOPIC_OPERATIONS
    if 8 <= version <= 10 and getattr(request, "include_cluster_authorized_operations", False):
        cluster_ops = CLUSTER_OPERATIONS
    if wanted is None or (version == 0 and not wanted):
        return _all_topics(broker, version, topic_ops, cluster_ops)
    else:
        allow_create = getattr(request, "allow_auto_topic_creation", True)
        entries = []
        for req_topic in wanted:
            name = req_topic.name
            topic_id = getattr(req_topic, "topic_id", None)
            if name is None and version < 12:
                # v10-v11 carry topic ids but cannot look them up (names are not
                # nullable in their responses): Kafka rejects it as INVALID_REQUEST
                entries.append(_error_entry("", topic_id, ErrorCode.invalid_request))
                continue
            if not name and version >= 12 and topic_id and topic_id != _ZERO_UUID:
                found = broker.topics_by_id.get(topic_id)
                entries.append(
                    topic_entry(broker, found, topic_ops)
                    if found
                    else _error_entry(None, topic_id, ErrorCode.unknown_topic_id)
                )
                continue
            topic = broker.topics.get(name)
            if topic is None:
                try:
                    topic = broker.auto_create(name) if allow_create else None
                except KafkaError as exc:
                    entries.append(_error_entry(name, None, exc.code, topic_ops))
                    continue
            if topic is None:
                entries.append(_error_entry(name, None, ErrorCode.unknown_topic_or_partition, topic_ops))
            else:
                entries.append(topic_entry(broker, topic, topic_ops))
    return _answer(broker, entries, cluster_ops)
