"""Committed offsets of a consumer group: OffsetCommit and OffsetFetch (asyncio, internal API).

Used by :class:`~oncelog.client.aio.group.GroupMember` and by a consumer that
commits without group membership (manual ``assign()``): both go through

* ``await commit_offsets(cluster, group_id, offsets, generation_id=-1,
  member_id="", group_instance_id=None, timeout=None)``: ``offsets`` maps
  ``(topic, partition)`` to the next offset to consume, or to an
  :class:`OffsetAndMetadata`. Versions v2-v9 (v9 is what Kafka 4 clients use
  for classic groups; v10 names topics by id). Coordinator errors
  (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS)
  and connection failures are retried, after a new FindCoordinator, until
  ``timeout`` (default 60 s, Kafka's ``default.api.timeout.ms``); any other
  error raises the typed :class:`~oncelog.client.errors.KafkaError` of the
  first failing partition (e.g. ``IllegalGenerationError``,
  ``UnknownMemberIdError``, ``RebalanceInProgressError``,
  ``FencedInstanceIdError``, ``OffsetMetadataTooLargeError``).
* ``await fetch_offsets(cluster, group_id, partitions, require_stable=False,
  timeout=None)`` -> ``{(topic, partition): OffsetAndMetadata | None}``
  (None: nothing committed). Versions v1-v9; v8+ use the multi-group form
  (one group per request here). With ``require_stable`` (KIP-447, v7+) a
  partition with a pending transactional offset answers
  UNSTABLE_OFFSET_COMMIT; the fetch is retried with backoff
  (``retry.backoff.ms`` growing to ``retry.backoff.max.ms``) until the
  transaction completes or ``timeout`` passes (then
  ``UnstableOffsetCommitError``). A broker older than v7 cannot honour
  ``require_stable``: by default the fetch goes on without it and logs a
  warning once, as Kafka's consumer does; ``unstable_unsupported="raise"``
  raises ``UnsupportedApiError`` instead (the transact session uses it to
  pick its fallback).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from oncelog.client.aio.cluster import COORDINATOR_ERRORS, Cluster
from oncelog.client.errors import KafkaError, UnsupportedApiError, error_for
from oncelog.protocol.errors import ErrorCode

__all__ = ["OffsetAndMetadata", "commit_offsets", "fetch_offsets"]

log = logging.getLogger("oncelog.client.group")

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
OFFSET_COMMIT_VERSIONS = (2, 9)
OFFSET_FETCH_VERSIONS = (1, 9)
GROUP_KEY = 0
DEFAULT_API_TIMEOUT = 60.0
UNSTABLE = int(ErrorCode.unstable_offset_commit.value)

TopicPartition = tuple[str, int]
_warned_stable = False


@dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed offset (the next offset to consume), its metadata string and leader epoch (-1: unknown)."""

    offset: int
    metadata: str | None = None
    leader_epoch: int = -1


def _by_topic(items: Iterable[tuple[TopicPartition, Any]]) -> dict[str, list[tuple[int, Any]]]:
    out: dict[str, list[tuple[int, Any]]] = {}
    for (t, p), v in items:
        out.setdefault(t, []).append((p, v))
    return out


async def _coordinator_request(cluster: Cluster, group_id: str, api_key: int, versions: tuple[int, int],
                               build: Any, deadline: float) -> tuple[Any, int]:
    """Send to the group coordinator; retries lookup and connection failures until ``deadline``."""
    backoff = cluster.config["retry.backoff.ms"] / 1000
    while True:
        try:
            node = await cluster.coordinator(GROUP_KEY, group_id, timeout=max(deadline - time.monotonic(), 0.1))
            conn = await cluster.connection(node)
            v = conn.version(api_key, versions)
            return await conn.request(api_key, v, build(v)), v
        except UnsupportedApiError:
            raise
        except KafkaError as exc:
            cluster.forget_coordinator(GROUP_KEY, group_id)
            if not exc.retriable or time.monotonic() + backoff > deadline:
                raise
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, cluster.config["retry.backoff.max.ms"] / 1000)


async def commit_offsets(cluster: Cluster, group_id: str,
                         offsets: Mapping[TopicPartition, int | OffsetAndMetadata], *,
                         generation_id: int = -1, member_id: str = "", group_instance_id: str | None = None,
                         timeout: float | None = None) -> None:
    """OffsetCommit for ``group_id``; see the module docstring."""
    if not offsets:
        return
    norm = {tp: (o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(int(o))) for tp, o in offsets.items()}
    deadline = time.monotonic() + (DEFAULT_API_TIMEOUT if timeout is None else timeout)
    backoff = cluster.config["retry.backoff.ms"] / 1000

    def build(v: int) -> dict[str, Any]:
        return {
            "group_id": group_id, "generation_id_or_member_epoch": generation_id, "member_id": member_id,
            "group_instance_id": group_instance_id if v >= 7 else None, "retention_time": -1,
            "topics": [{"name": t, "partitions": [
                {"partition_index": p, "committed_offset": om.offset, "committed_leader_epoch": om.leader_epoch,
                 "committed_metadata": om.metadata if om.metadata is not None else "", "commit_timestamp": -1}
                for p, om in sorted(parts)]} for t, parts in sorted(_by_topic(norm.items()).items())],
        }

    while True:
        resp, _ = await _coordinator_request(cluster, group_id, OFFSET_COMMIT, OFFSET_COMMIT_VERSIONS, build, deadline)
        first: tuple[int, str] | None = None
        for t in resp.topics:
            for p in t.partitions:
                code = int(p.error_code)
                if code and first is None:
                    first = (code, f"{t.name}-{int(p.partition_index)}")
        if first is None:
            return
        code, where = first
        if code in COORDINATOR_ERRORS or code == int(ErrorCode.request_timed_out.value):
            cluster.forget_coordinator(GROUP_KEY, group_id)
            if time.monotonic() + backoff < deadline:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, cluster.config["retry.backoff.max.ms"] / 1000)
                continue
        raise error_for(code, f"OffsetCommit of group {group_id!r} failed for {where}")


async def fetch_offsets(cluster: Cluster, group_id: str, partitions: Iterable[TopicPartition] | None, *,
                        require_stable: bool = False, timeout: float | None = None,
                        unstable_unsupported: str = "ignore") -> dict[TopicPartition, OffsetAndMetadata | None]:
    """OffsetFetch for ``group_id`` (``partitions`` None: every partition it has offsets for)."""
    global _warned_stable
    parts = None if partitions is None else sorted(set(partitions))
    deadline = time.monotonic() + (DEFAULT_API_TIMEOUT if timeout is None else timeout)
    backoff = cluster.config["retry.backoff.ms"] / 1000
    topics = None if parts is None else [{"name": t, "partition_indexes": [p for p, _ in ps]}
                                         for t, ps in sorted(_by_topic((tp, None) for tp in parts).items())]

    def build(v: int) -> dict[str, Any]:
        global _warned_stable
        stable = require_stable
        if require_stable and v < 7:
            if unstable_unsupported == "raise":
                raise UnsupportedApiError(f"OffsetFetch v{v}: the broker does not support require_stable (KIP-447)")
            if not _warned_stable:
                log.warning("the broker's OffsetFetch (v%d) has no require_stable (KIP-447); fetching without it", v)
                _warned_stable = True
            stable = False
        if v >= 8:
            return {"groups": [{"group_id": group_id, "member_id": None, "member_epoch": -1, "topics": topics}],
                    "require_stable": stable}
        return {"group_id": group_id, "topics": topics, "require_stable": stable}

    while True:
        resp, v = await _coordinator_request(cluster, group_id, OFFSET_FETCH, OFFSET_FETCH_VERSIONS, build, deadline)
        if v >= 8:
            g = resp.groups[0]
            top_code, resp_topics = int(g.error_code), g.topics
        else:
            top_code, resp_topics = int(getattr(resp, "error_code", 0)), resp.topics
        retry_code = 0
        if top_code:
            if top_code not in COORDINATOR_ERRORS:
                raise error_for(top_code, f"OffsetFetch of group {group_id!r}")
            cluster.forget_coordinator(GROUP_KEY, group_id)
            retry_code = top_code
        out: dict[TopicPartition, OffsetAndMetadata | None] = {}
        if not retry_code:
            for t in resp_topics:
                for p in t.partitions:
                    tp = (t.name, int(p.partition_index))
                    code = int(p.error_code)
                    if code == UNSTABLE:
                        retry_code = code
                    elif code:
                        raise error_for(code, f"OffsetFetch of group {group_id!r} for {tp[0]}-{tp[1]}")
                    off = int(p.committed_offset)
                    out[tp] = None if off < 0 else OffsetAndMetadata(
                        off, p.metadata, int(getattr(p, "committed_leader_epoch", -1)))
        if not retry_code:
            if parts is not None:
                for tp in parts:
                    out.setdefault(tp, None)
            return out
        if time.monotonic() + backoff > deadline:
            raise error_for(retry_code, f"OffsetFetch of group {group_id!r}: still {ErrorCode(retry_code).name.upper()} "
                                        f"after {DEFAULT_API_TIMEOUT if timeout is None else timeout:g}s")
        log.debug("OffsetFetch of group %r: %s, retrying in %.0f ms", group_id, ErrorCode(retry_code).name.upper(),
                  backoff * 1000)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, cluster.config["retry.backoff.max.ms"] / 1000)
