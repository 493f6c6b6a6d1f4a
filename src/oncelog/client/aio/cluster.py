"""The cluster view shared by one client: brokers, topics, leaders, coordinators, connections.

Internal API (the producer uses it; the consumer, transactions and admin
are meant to build on the same calls):

* ``cluster = Cluster(config)``; ``await cluster.start()`` connects to a
  bootstrap server (each in turn, with backoff) and reads Metadata for no
  topics, which names the brokers.
* ``await cluster.refresh(topics)``: Metadata for ``topics`` (None: all);
  concurrent callers share one request. ``cluster.topic(name)`` ->
  :class:`TopicInfo` or None; ``cluster.leader(topic, partition)`` -> node
  id or None. ``await cluster.wait_topic(name, timeout)`` refreshes until the
  topic has partitions with leaders (auto-creation allowed for producers, as
  ``allow.auto.create.topics`` defaults to true in Kafka).
* ``cluster.invalidate(topic)``: called on NOT_LEADER_OR_FOLLOWER,
  UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, ... (see
  :data:`REFRESH_ERRORS`): schedules a refresh of that topic.
* ``await cluster.connection(node_id)``: the one connection to that broker,
  opened on demand, reopened after it closed, with exponential backoff
  (``reconnect.backoff.ms`` .. ``reconnect.backoff.max.ms``) between failed
  attempts. ``await cluster.any_connection()``: a connection to some broker
  (the least loaded open one, else the first that connects).
* ``await cluster.coordinator(key_type, key)``: FindCoordinator (key type 0
  group, 1 transaction), cached; ``cluster.forget_coordinator(key_type, key)``
  after NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE.
* ``await cluster.request_any(api_key, versions, body)``: one request to any
  broker, version negotiated.
* ``await cluster.close()``.

Authentication failures (TLS or SASL, :data:`AUTHENTICATION_ERRORS`) are
never retried where they happen, and are recorded: ``cluster.node_auth_error(
node_id)`` is the failure of the node's last connection attempt (None once a
connection succeeds; the requests of the Java client's ConsumerNetworkClient
to such a node fail with it), and each failure is also kept cluster-wide, as
the Java client's ``Metadata.fatalError``: ``cluster.take_auth_error()``
returns it once and clears it (the consumer's ``poll()`` raises it, as
``KafkaConsumer.poll()`` does), and the callbacks given to
``cluster.on_auth_error(callback)`` are called on each failure (to wake a
waiting ``poll()``). A later attempt to connect still happens, after the
reconnect backoff, so a credential fixed on the broker is picked up.

Every version is min(ours, theirs) per API from the broker's ApiVersions.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from oncelog.client.aio.connection import BrokerConnection
from oncelog.client.config import ClientConfig
from oncelog.client.errors import (
    AUTHENTICATION_ERRORS,
    KafkaConnectionError,
    KafkaError,
    UnknownTopicOrPartitionError,
    error_for,
)
from oncelog.protocol.errors import ErrorCode

__all__ = ["Cluster", "REFRESH_ERRORS", "TopicInfo"]

METADATA, FIND_COORDINATOR = 3, 10
METADATA_VERSIONS = (1, 12)
FIND_COORDINATOR_VERSIONS = (1, 6)

# errors after which the client refreshes metadata before retrying
REFRESH_ERRORS = frozenset(int(c.value) for c in (
    ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition, ErrorCode.leader_not_available,
    ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch, ErrorCode.kafka_storage_error,
    ErrorCode.not_enough_replicas, ErrorCode.broker_not_available, ErrorCode.unknown_topic_id,
    ErrorCode.network_exception, ErrorCode.request_timed_out,
))
COORDINATOR_ERRORS = frozenset(int(c.value) for c in (
    ErrorCode.not_coordinator, ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress,
))


@dataclass
class TopicInfo:
    name: str
    topic_id: Any
    leaders: dict[int, int] = field(default_factory=dict)  # partition -> leader node id (-1: none)
    error: int = 0

    @property
    def partitions(self) -> int:
        return len(self.leaders)


@dataclass
class _Node:
    node_id: int
    host: str
    port: int
    conn: BrokerConnection | None = None
    connecting: asyncio.Task[BrokerConnection] | None = None
    failures: int = 0
    next_attempt: float = 0.0
    auth_error: KafkaError | None = None  # the last connection attempt failed TLS or SASL authentication


class Cluster:
    """See the module docstring."""

    def __init__(self, config: ClientConfig, *, allow_auto_create: bool = False) -> None:
        self.config = config
        self.allow_auto_create = allow_auto_create
        self.nodes: dict[int, _Node] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.cluster_id: str | None = None
        self.controller_id = -1
        self._bootstrap = [_Node(-1 - i, h, p) for i, (h, p) in enumerate(config.bootstrap)]
        self._wanted: set[str] = set()
        self._refreshing: asyncio.Task[None] | None = None
        self._stale: set[str] = set()
        self._coordinators: dict[tuple[int, str], int] = {}
        self._closed = False
        self.last_refresh = 0.0
        self._errors: dict[str, int] = {}
        self._auth_error: KafkaError | None = None  # Java's Metadata.fatalError: raised once by take_auth_error()
        self._auth_listeners: list[Any] = []

    def _conn_kwargs(self) -> dict[str, Any]:
        c = self.config
        return {"client_id": c["client.id"], "request_timeout_ms": c["request.timeout.ms"],
                "connect_timeout_ms": c["socket.connection.setup.timeout.ms"], "security": c.security}

    # -- connections -------------------------------------------------------------

    async def start(self) -> None:
        await self.refresh([])

    async def _open(self, node: _Node) -> BrokerConnection:
        if node.conn is not None and not node.conn.closed:
            return node.conn
        if node.connecting is None or node.connecting.done():
            node.connecting = asyncio.ensure_future(self._connect(node))
        return await asyncio.shield(node.connecting)

    async def _connect(self, node: _Node) -> BrokerConnection:
        wait = node.next_attempt - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if self._closed:
            raise KafkaConnectionError("client closed")
        conn = BrokerConnection(node.host, node.port, node_id=node.node_id, **self._conn_kwargs())
        try:
            await conn.connect()
        except KafkaError as exc:
            conn.close()
            node.failures += 1
            base = self.config["reconnect.backoff.ms"] * 2 ** min(node.failures - 1, 10)
            backoff = min(base, self.config["reconnect.backoff.max.ms"]) * random.uniform(0.8, 1.2)
            node.next_attempt = time.monotonic() + backoff / 1000
            if isinstance(exc, AUTHENTICATION_ERRORS):
                self._auth_failed(node, exc)
            raise
        node.failures = 0
        node.auth_error = None
        node.conn = conn
        return conn

    # -- authentication failures -----------------------------------------------------

    def _auth_failed(self, node: _Node, exc: KafkaError) -> None:
        node.auth_error = exc
        self._auth_error = exc
        for callback in list(self._auth_listeners):
            callback()

    def node_auth_error(self, node_id: int) -> KafkaError | None:
        """The authentication failure of the last attempt to connect to ``node_id``, or None."""
        node = self.nodes.get(node_id)
        return node.auth_error if node is not None else None

    def take_auth_error(self) -> KafkaError | None:
        """The latest authentication failure not taken yet (then cleared), or None."""
        exc, self._auth_error = self._auth_error, None
        return exc

    def on_auth_error(self, callback: Any) -> None:
        """Call ``callback()`` (on the loop) after each authentication failure."""
        self._auth_listeners.append(callback)

    async def connection(self, node_id: int) -> BrokerConnection:
        node = self.nodes.get(node_id)
        if node is None:
            await self.refresh(None if not self._wanted else sorted(self._wanted))
            node = self.nodes.get(node_id)
            if node is None:
                raise KafkaConnectionError(f"broker {node_id} is not in the cluster metadata")
        return await self._open(node)

    async def any_connection(self) -> BrokerConnection:
        open_ = [n.conn for n in [*self.nodes.values(), *self._bootstrap] if n.conn is not None and not n.conn.closed]
        if open_:
            return min(open_, key=lambda c: c.in_flight)
        candidates = list(self.nodes.values()) or list(self._bootstrap)
        deadline = time.monotonic() + self.config["request.timeout.ms"] / 1000
        last: Exception | None = None
        while time.monotonic() < deadline and not self._closed:
            for node in sorted(candidates, key=lambda n: n.next_attempt):
                try:
                    return await self._open(node)
                except AUTHENTICATION_ERRORS:
                    raise  # a TLS or SASL failure: retrying does not help (the Java client's AuthenticationException)
                except KafkaError as exc:
                    last = exc
            if self.nodes and candidates is not self._bootstrap:
                candidates = list(self.nodes.values()) + self._bootstrap
        raise KafkaConnectionError(f"no broker reachable: {last}")

    async def request_any(self, api_key: int, versions: tuple[int, int], body: Any) -> Any:
        conn = await self.any_connection()
        return await conn.request(api_key, conn.version(api_key, versions), body)

    async def close(self) -> None:
        self._closed = True
        if self._refreshing is not None:
            self._refreshing.cancel()
        for node in [*self.nodes.values(), *self._bootstrap]:
            if node.connecting is not None and not node.connecting.done():
                node.connecting.cancel()
            if node.conn is not None:
                node.conn.close()

    # -- metadata --------------------------------------------------------------------

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.get(name)

    def leader(self, topic: str, partition: int) -> int | None:
        t = self.topics.get(topic)
        if t is None:
            return None
        node = t.leaders.get(partition)
        return None if node is None or node < 0 else node

    def invalidate(self, topic: str) -> None:
        self._stale.add(topic)

    def stale(self, topic: str) -> bool:
        return topic in self._stale

    async def refresh(self, topics: list[str] | None) -> None:
        """Metadata for ``topics`` (None: all known/wanted); shared by concurrent callers."""
        if topics:
            self._wanted.update(topics)
        while self._refreshing is not None and not self._refreshing.done():
            await asyncio.shield(self._refreshing)
            if not topics or all(t in self.topics and t not in self._stale for t in topics):
                return
        self._refreshing = asyncio.ensure_future(self._refresh(sorted(self._wanted) if topics is None or topics
                                                              else []))
        await asyncio.shield(self._refreshing)

    async def _refresh(self, topics: list[str]) -> None:
        conn = await self.any_connection()
        v = conn.version(METADATA, METADATA_VERSIONS)
        body = {"topics": [{"name": t, "topic_id": None} for t in topics],
                "allow_auto_topic_creation": self.allow_auto_create,
                "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False}
        md = await conn.request(METADATA, v, body)
        seen: dict[int, _Node] = {}
        for b in md.brokers:
            nid = int(b.node_id)
            old = self.nodes.get(nid)
            if old is not None and (old.host, old.port) == (b.host, int(b.port)):
                seen[nid] = old
            else:
                if old is not None and old.conn is not None:
                    old.conn.close()
                seen[nid] = _Node(nid, b.host, int(b.port))
        # adopt the bootstrap connection for the broker it reached, so we keep one connection per broker
        if conn.node_id < 0:
            for n in seen.values():
                if (n.host, n.port) == (conn.host, conn.port) and (n.conn is None or n.conn.closed):
                    n.conn = conn
                    conn.node_id = n.node_id
                    for b in self._bootstrap:
                        if b.conn is conn:
                            b.conn = None
        self.nodes = seen
        self.cluster_id = getattr(md, "cluster_id", None)
        self.controller_id = int(getattr(md, "controller_id", -1))
        for t in md.topics:
            name = t.name
            self._stale.discard(name)
            code = int(t.error_code)
            info = TopicInfo(name, getattr(t, "topic_id", None), error=code)
            if code == 0:
                info.leaders = {int(p.partition_index): int(p.leader_id) for p in t.partitions}
                self.topics[name] = info
            else:
                self.topics.pop(name, None)
                self._errors[name] = code
        self.last_refresh = time.monotonic()

    async def wait_topic(self, name: str, timeout: float) -> TopicInfo:
        """The topic's metadata, refreshing until it has partitions or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        backoff = self.config["retry.backoff.ms"] / 1000
        while True:
            info = self.topics.get(name)
            if info is not None and info.leaders and name not in self._stale:
                return info
            try:
                await self.refresh([name])
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
            info = self.topics.get(name)
            if info is not None and info.leaders:
                return info
            if time.monotonic() > deadline:
                code = self._errors.get(name, int(ErrorCode.unknown_topic_or_partition.value))
                if code == int(ErrorCode.unknown_topic_or_partition.value):
                    raise UnknownTopicOrPartitionError(f"topic {name} not present in metadata after "
                                                       f"{timeout:g}s")
                raise error_for(code, f"topic {name}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.config["retry.backoff.max.ms"] / 1000)

    # -- coordinators --------------------------------------------------------------------

    async def coordinator(self, key_type: int, key: str, timeout: float | None = None) -> int:
        """The node id coordinating ``key`` (0: group, 1: transactional id), cached."""
        cached = self._coordinators.get((key_type, key))
        if cached is not None:
            return cached
        deadline = time.monotonic() + (timeout if timeout is not None else self.config["request.timeout.ms"] / 1000)
        backoff = self.config["retry.backoff.ms"] / 1000
        while True:
            conn = await self.any_connection()
            v = conn.version(FIND_COORDINATOR, FIND_COORDINATOR_VERSIONS)
            if v >= 4:
                resp = await conn.request(FIND_COORDINATOR, v, {"key_type": key_type, "coordinator_keys": [key]})
                c = resp.coordinators[0]
                code, node, host, port, msg = (int(c.error_code), int(c.node_id), c.host, int(c.port),
                                               c.error_message)
            else:
                resp = await conn.request(FIND_COORDINATOR, v, {"key": key, "key_type": key_type})
                code, node, host, port, msg = (int(resp.error_code), int(resp.node_id), resp.host, int(resp.port),
                                               getattr(resp, "error_message", None))
            if code == 0:
                n = self.nodes.get(node)
                if n is None or (n.host, n.port) != (host, port):
                    self.nodes[node] = _Node(node, host, port)
                self._coordinators[(key_type, key)] = node
                return node
            err = error_for(code, msg)
            if not err.retriable or time.monotonic() > deadline:
                raise err
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.config["retry.backoff.max.ms"] / 1000)

    def forget_coordinator(self, key_type: int, key: str) -> None:
        self._coordinators.pop((key_type, key), None)

    async def fresh_coordinator_connection(self, key_type: int, key: str,
                                           timeout: float | None = None) -> BrokerConnection:
        """A new connection to the coordinator of ``key`` (looked up as :meth:`coordinator`
        does), not shared and owned by the caller, who closes it.

        The coordinator answers one connection's requests in order and holds a
        JoinGroup's answer until the rebalance completes, so a request that must not
        wait behind one (a closing member's LeaveGroup) goes on its own connection."""
        node_id = await self.coordinator(key_type, key, timeout)
        node = self.nodes.get(node_id)
        if node is None:
            raise KafkaConnectionError(f"broker {node_id} is not in the cluster metadata")
        if self._closed:
            raise KafkaConnectionError("client closed")
        conn = BrokerConnection(node.host, node.port, node_id=node_id, **self._conn_kwargs())
        try:
            await conn.connect()
        except BaseException:
            conn.close()
            raise
        return conn
