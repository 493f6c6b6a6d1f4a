"""An orphaned JoinGroup, or a follower's SyncGroup, does not hold up the requests read after it
(review3 B1).

A JoinGroup that waits for a rebalance (a follower's SyncGroup that waits for the leader's assignment)
holds its connection's request order while the connection is open (as Kafka's muted channel does), but
once the client has closed the connection its answer has no one to go to: the requests read after it run
at once instead of waiting up to the rebalance timeout. Cost: about 1 s per case.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Any, Callable

import pytest

from oncelog.client.admin import Admin
from oncelog.client.aio.connection import BrokerConnection
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import encode_request, request_type
from oncelog.testing import EmbeddedBroker
from tests.integration.conftest import create_topic

JOIN, SYNC, COMMIT = 11, 14, 8


def _request(api_key: int, version: int, corr: int, body: dict) -> bytes:
    payload = encode_request(materialize(request_type(api_key, version), body))
    head = struct.pack(">hhih", api_key, version, corr, 3) + b"raw"
    return struct.pack(">i", len(head) + len(payload)) + head + payload


def _join(member_id: str) -> dict[str, Any]:
    return {"group_id": "g", "session_timeout": 30000, "rebalance_timeout": 30000, "member_id": member_id,
            "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]}


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_requests_after_an_orphaned_join_run_at_once(broker_factory: Callable[..., EmbeddedBroker],
                                                     delay: float) -> None:
    """``delay``: 0, the close arrives before the JoinGroup starts; 0.3, while it waits for the rebalance
    (and the open connection's commit behind it waits too)."""
    broker = broker_factory({"group.initial.rebalance.delay.ms": "0"})
    create_topic(broker.bootstrap, "t", 1)

    async def stable_member() -> None:  # member A: joined and synced; it will not rejoin for 30 s
        conn = BrokerConnection(broker.host, broker.port)
        await conn.connect()
        r = await conn.request(JOIN, 3, _join(""))
        assert r.error_code == 0
        s = await conn.request(SYNC, 1, {"group_id": "g", "generation_id": r.generation_id,
                                         "member_id": r.member_id,
                                         "assignments": [{"member_id": r.member_id, "assignment": b""}]})
        assert s.error_code == 0
        conn.close()

    asyncio.run(stable_member())
    commit = _request(COMMIT, 2, 2, {
        "group_id": "other", "generation_id_or_member_epoch": -1, "member_id": "", "retention_time_ms": -1,
        "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 7,
                                                 "committed_metadata": ""}]}]})
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
            sock.sendall(_request(JOIN, 3, 1, _join("")))  # a new member: waits until A rejoins (up to 30 s)
            time.sleep(delay)
            sock.sendall(commit)
            if delay:  # the connection open: the commit waits behind the join, as behind Kafka's muted channel
                time.sleep(0.5)
                assert admin.list_group_offsets("other") == {}
        start = time.monotonic()
        while (got := admin.list_group_offsets("other")) != {("t", 0): 7} and time.monotonic() - start < 5:
            time.sleep(0.05)
    assert got == {("t", 0): 7}  # before: only once the rebalance ended (30 s)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_requests_after_an_orphaned_follower_sync_run_at_once(broker_factory: Callable[..., EmbeddedBroker],
                                                              delay: float) -> None:
    """The SyncGroup half of review3 B1: a follower's SyncGroup waits for the leader's assignment, which does
    not come (the leader never syncs generation 2); once its connection is closed, the OffsetCommit read
    after it on that connection runs at once, not after the rebalance (the members' 30 s sessions).
    ``delay`` as for the JoinGroup."""
    broker = broker_factory({"group.initial.rebalance.delay.ms": "0"})
    create_topic(broker.bootstrap, "t", 1)

    async def generation_two() -> tuple[str, int]:
        """A joins and syncs (generation 1); B joins and A rejoins: generation 2, A the leader. B's id and
        the generation; B's SyncGroup is left to the raw connection."""
        a, b = BrokerConnection(broker.host, broker.port), BrokerConnection(broker.host, broker.port)
        await a.connect()
        await b.connect()
        r = await a.request(JOIN, 3, _join(""))
        s = await a.request(SYNC, 1, {"group_id": "g", "generation_id": r.generation_id, "member_id": r.member_id,
                                      "assignments": [{"member_id": r.member_id, "assignment": b""}]})
        assert r.error_code == 0 and s.error_code == 0
        b_join = asyncio.ensure_future(b.request(JOIN, 3, _join("")))
        await asyncio.sleep(0.2)  # B is waiting in the rebalance it started
        ra = await a.request(JOIN, 3, _join(r.member_id))
        rb = await b_join
        assert ra.error_code == 0 and rb.error_code == 0 and ra.generation_id == rb.generation_id == 2
        assert ra.leader == ra.member_id != rb.member_id
        a.close()
        b.close()
        return rb.member_id, rb.generation_id

    follower, generation = asyncio.run(generation_two())
    sync = _request(SYNC, 1, 1, {"group_id": "g", "generation_id": generation, "member_id": follower,
                                 "assignments": []})
    commit = _request(COMMIT, 2, 2, {
        "group_id": "other", "generation_id_or_member_epoch": -1, "member_id": "", "retention_time_ms": -1,
        "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 7,
                                                 "committed_metadata": ""}]}]})
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
            sock.sendall(sync)  # a follower: waits for the leader's assignment (until the group expires A)
            time.sleep(delay)
            sock.sendall(commit)
            if delay:  # the connection open: the commit waits behind the sync, as behind Kafka's muted channel
                time.sleep(0.5)
                assert admin.list_group_offsets("other") == {}
        start = time.monotonic()
        while (got := admin.list_group_offsets("other")) != {("t", 0): 7} and time.monotonic() - start < 5:
            time.sleep(0.05)
    assert got == {("t", 0): 7}  # with the follower's SyncGroup holding the order gate: only after 30 s
    assert time.monotonic() - start < 2
