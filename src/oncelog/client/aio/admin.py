"""The asyncio admin client: topics, configs, records, groups, transactions and producers.

``admin = Admin({"bootstrap.servers": "127.0.0.1:9092"})``; ``await admin.start()``
(or ``async with Admin(...) as admin``); then e.g. ``await admin.create_topic("t", 3)``.
The blocking :class:`oncelog.client.Admin` runs this on a background loop thread.

It speaks only the Kafka protocol, with versions negotiated per broker, and
routes every request as Kafka's Java admin client does:

* topics, configs, partitions, ListOffsets-free reads: any broker (Metadata,
  CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
  AlterConfigs, IncrementalAlterConfigs; BROKER resources to that broker);
* DeleteRecords, ListOffsets, DescribeProducers, WriteTxnMarkers: each
  partition's leader (metadata refreshed and the partition retried on
  NOT_LEADER_OR_FOLLOWER and the like);
* DescribeGroups, DeleteGroups, OffsetFetch, OffsetCommit, OffsetDelete: the
  group's coordinator (FindCoordinator key type 0); DescribeTransactions: the
  transactional id's coordinator (key type 1), re-looked-up after
  NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE / COORDINATOR_LOAD_IN_PROGRESS;
* ListGroups and ListTransactions: every broker, results merged.

Errors are the typed :mod:`oncelog.client.errors` (Kafka's name and code).
Retriable ones (per request or per resource) are retried with backoff
(``retry.backoff.ms`` .. ``retry.backoff.max.ms``) until
``default.api.timeout.ms``; each request waits at most ``request.timeout.ms``.
UNKNOWN_TOPIC_OR_PARTITION in the metadata of a named topic is final (the
topic does not exist), not retried.

Operations on several resources return :class:`Results`: a mapping from
resource to result in which a failed resource raises its typed error when
read (``results.errors`` lists them); the single-resource shorthands
(``create_topic``, ``describe_group``, ...) raise directly.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from oncelog.client.aio.cluster import COORDINATOR_ERRORS, REFRESH_ERRORS, Cluster
from oncelog.client.config import ClientConfig, parse_config
from oncelog.client.errors import (
    AUTHENTICATION_ERRORS,
    KafkaConnectionError,
    KafkaError,
    UnknownTopicOrPartitionError,
    error_for,
)
from oncelog.client.groups import GroupInfo, MemberInfo, parse_assignment
from oncelog.client.txns import (
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    AbortSpec,
    OpenTxn,
    ProducerInfo,
    TxnAdminError,
    TxnDescription,
    abort_spec_for_offset,
    filter_hanging,
    hanging_candidates,
    list_transactions_body,
    parse_describe_transactions_v0,
)
from oncelog.protocol.build import to_ms
from oncelog.protocol.errors import ErrorCode

__all__ = ["Admin", "AlterConfigOp", "ClusterDescription", "ConfigEntry", "ConfigResource", "ListedGroup",
           "NewTopic", "OffsetSpec", "PartitionDescription", "Results", "TopicDescription", "TransactionListing"]

K = TypeVar("K")
V = TypeVar("V")
TP = tuple[str, int]

LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH = 2, 3, 8, 9
DESCRIBE_GROUPS, LIST_GROUPS = 15, 16
CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, WRITE_TXN_MARKERS = 19, 20, 21, 27
DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE_PARTITIONS, DELETE_GROUPS = 32, 33, 37, 42
INCREMENTAL_ALTER_CONFIGS, OFFSET_DELETE, DESCRIBE_PRODUCERS = 44, 47, 61
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
GROUP_KEY, TXN_KEY = 0, 1

_UNKNOWN_TOPIC = int(ErrorCode.unknown_topic_or_partition.value)

# ConfigResource types (Kafka's ConfigResource.Type ids)
RESOURCE_TYPES = {"topic": 2, "broker": 4, "broker_logger": 8, "client_metrics": 16, "group": 32}
# DescribeConfigs config_source ids (Kafka's ConfigEntry.ConfigSource)
CONFIG_SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
                  3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
                  6: "DYNAMIC_BROKER_LOGGER_CONFIG", 7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}
ALTER_OPS = {"set": 0, "delete": 1, "append": 2, "subtract": 3}


# -- result types ------------------------------------------------------------------------------


class Results(Mapping[K, V], Generic[K, V]):
    """Per-resource results: ``results[key]`` is the value, or raises that resource's typed error.

    ``results.errors`` maps each failed resource to its :class:`KafkaError`;
    ``results.succeeded`` maps each other resource to its value;
    ``results.raise_first()`` raises the first error (in key order) or returns ``self``.
    """

    def __init__(self, succeeded: dict[K, V], errors: dict[K, KafkaError]) -> None:
        self.succeeded = succeeded
        self.errors = errors

    def __getitem__(self, key: K) -> V:
        if key in self.errors:
            raise self.errors[key]
        return self.succeeded[key]

    def __iter__(self) -> Iterator[K]:
        yield from self.succeeded
        yield from (k for k in self.errors if k not in self.succeeded)

    def __len__(self) -> int:
        return len(self.succeeded) + len(self.errors)

    def __repr__(self) -> str:
        return f"Results({self.succeeded!r}, errors={self.errors!r})"

    def raise_first(self) -> "Results[K, V]":
        """Raise the error of the first failed resource (sorted by key), if any; else return self."""
        if self.errors:
            raise self.errors[sorted(self.errors, key=repr)[0]]
        return self


@dataclass(frozen=True)
class NewTopic:
    """A topic to create: -1 partitions / replication factor take the broker's defaults."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    config: Mapping[str, str] = field(default_factory=dict)
    replica_assignment: Mapping[int, list[int]] | None = None


@dataclass(frozen=True)
class PartitionDescription:
    """One partition in a :class:`TopicDescription`."""

    partition: int
    leader: int
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()


@dataclass(frozen=True)
class TopicDescription:
    """Metadata of one topic (Kafka's ``TopicDescription``)."""

    name: str
    topic_id: str
    is_internal: bool
    partitions: tuple[PartitionDescription, ...]


@dataclass(frozen=True)
class ClusterDescription:
    """The cluster id, the controller and the brokers (node id -> ``host:port``)."""

    cluster_id: str | None
    controller_id: int
    brokers: dict[int, str]


@dataclass(frozen=True)
class ConfigResource:
    """A config resource: ``ConfigResource("topic", "events")`` or ``ConfigResource("broker", "1")``."""

    type: str
    name: str

    def __post_init__(self) -> None:
        if self.type not in RESOURCE_TYPES:
            raise ValueError(f"unknown config resource type {self.type!r} (one of {', '.join(RESOURCE_TYPES)})")

    @property
    def type_id(self) -> int:
        """The resource type's wire id (2 for a topic, 4 for a broker, ...)."""
        return RESOURCE_TYPES[self.type]


@dataclass(frozen=True)
class ConfigEntry:
    """One described config (``source`` is Kafka's ConfigSource name, e.g. DYNAMIC_TOPIC_CONFIG)."""

    name: str
    value: str | None
    source: str
    read_only: bool
    sensitive: bool

    @property
    def is_default(self) -> bool:
        return self.source == "DEFAULT_CONFIG"


@dataclass(frozen=True)
class AlterConfigOp:
    """One incremental config change: ``op`` is set, delete, append or subtract."""

    name: str
    value: str | None = None
    op: str = "set"

    def __post_init__(self) -> None:
        if self.op not in ALTER_OPS:
            raise ValueError(f"unknown config operation {self.op!r} (one of {', '.join(ALTER_OPS)})")


@dataclass(frozen=True)
class ListedGroup:
    """One group as ListGroups reports it (``state`` is empty when the broker's ListGroups is below v4)."""

    group_id: str
    protocol_type: str
    state: str
    coordinator: int


@dataclass(frozen=True)
class TransactionListing:
    """One transactional id as ListTransactions reports it."""

    transactional_id: str
    producer_id: int
    state: str
    coordinator: int


class OffsetSpec:
    """ListOffsets targets: :data:`EARLIEST`, :data:`LATEST`, :data:`MAX_TIMESTAMP`, or a timestamp in ms."""

    EARLIEST = -2
    LATEST = -1
    MAX_TIMESTAMP = -3


@dataclass(frozen=True)
class ListedOffset:
    """A ListOffsets answer: the offset and the timestamp of that record (-1 for earliest/latest)."""

    offset: int
    timestamp: int


# -- the client --------------------------------------------------------------------------------


def _tp(item: Any) -> TP:
    if isinstance(item, tuple) and len(item) >= 2:
        return str(item[0]), int(item[1])
    return str(item.topic), int(item.partition)


def _by_topic(tps: Iterable[TP]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for t, p in tps:
        out.setdefault(t, []).append(p)
    return out


class Admin:
    """The asyncio admin client (see the module docstring and docs/client.md)."""

    def __init__(self, config: Mapping[str, Any] | str, *, clock: Callable[[], int] | None = None) -> None:
        if isinstance(config, str):
            config = {"bootstrap.servers": config}
        self.config: ClientConfig = parse_config(config, "admin")
        self.cluster = Cluster(self.config)
        self.clock = clock or (lambda: int(time.time() * 1000))
        self._started = False

    async def start(self) -> None:
        """Connect to a bootstrap server and read the cluster's brokers.

        Fails at once (KafkaConnectionError) when no bootstrap server accepts a
        connection; once one has, requests are retried within ``default.api.timeout.ms``.
        """
        last: KafkaError | None = None
        for node in self.cluster._bootstrap:
            try:
                await self.cluster._open(node)
                break
            except AUTHENTICATION_ERRORS:
                raise  # TLS or SASL refused: typed, at once
            except KafkaError as exc:
                last = exc
        else:
            raise KafkaConnectionError(last.message if last else "no bootstrap server")
        await self._retry(lambda: self.cluster.start())
        self._started = True

    async def close(self) -> None:
        """Close every connection."""
        await self.cluster.close()

    async def __aenter__(self) -> "Admin":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- plumbing -----------------------------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self.config["default.api.timeout.ms"] / 1000

    async def _retry(self, attempt: Callable[[], Awaitable[V]], deadline: float | None = None) -> V:
        """Run ``attempt`` again after retriable errors, with backoff, until the API timeout."""
        deadline = deadline or self._deadline()
        backoff = self.config["retry.backoff.ms"] / 1000
        while True:
            try:
                return await attempt()
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() + backoff > deadline:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.config["retry.backoff.max.ms"] / 1000)

    async def _gather(self, keys: Iterable[K], attempt: Callable[[list[K]], Awaitable[dict[K, Any]]],
                      final: frozenset[int] = frozenset()) -> Results[K, Any]:
        """Per-resource retries: ``attempt(keys)`` -> key -> value or KafkaError; retriable ones go again."""
        deadline = self._deadline()
        backoff = self.config["retry.backoff.ms"] / 1000
        pending = list(dict.fromkeys(keys))
        done: dict[K, Any] = {}
        errors: dict[K, KafkaError] = {}
        while pending:
            try:
                got = await attempt(pending)
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() + backoff > deadline:
                    raise
                got = {k: exc for k in pending}
            retry = []
            for k in pending:
                v = got.get(k, UnknownTopicOrPartitionError(f"{k}: not in the response"))
                if isinstance(v, KafkaError):
                    if v.retriable and v.code not in final and time.monotonic() + backoff <= deadline:
                        retry.append(k)
                    else:
                        errors[k] = v
                        done.pop(k, None)
                else:
                    done[k] = v
            pending = retry
            if pending:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.config["retry.backoff.max.ms"] / 1000)
        return Results(done, errors)

    async def _any(self, api_key: int, versions: tuple[int, int], body: Any,
                   make: Callable[[int], Any] | None = None) -> Any:
        conn = await self.cluster.any_connection()
        v = conn.version(api_key, versions)
        return await conn.request(api_key, v, make(v) if make else body)

    async def _node(self, node: int, api_key: int, versions: tuple[int, int],
                    make: Callable[[int], Any], raw: bool = False) -> Any:
        conn = await self.cluster.connection(node)
        v = conn.version(api_key, versions)
        if raw:
            return await conn.send(api_key, v, make(v), raw_response=True)
        return await conn.request(api_key, v, make(v))

    async def _metadata(self, topics: list[str] | None) -> Any:
        def body(_v: int) -> dict[str, Any]:
            return {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
                    "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
                    "include_topic_authorized_operations": False}
        return await self._retry(lambda: self._any(METADATA, (1, 12), None, body))

    async def _leaders(self, tps: list[TP]) -> tuple[dict[int, list[TP]], dict[TP, KafkaError]]:
        """Group partitions by leader (fresh metadata); unknown topics/partitions are final errors."""
        topics = sorted({t for t, _ in tps})
        for t in topics:
            self.cluster.invalidate(t)
        await self._retry(lambda: self.cluster.refresh(topics))
        by_leader: dict[int, list[TP]] = {}
        errors: dict[TP, KafkaError] = {}
        for tp in tps:
            info = self.cluster.topic(tp[0])
            if info is None:
                code = self.cluster._errors.get(tp[0], _UNKNOWN_TOPIC)
                errors[tp] = error_for(code, f"topic {tp[0]}")
            elif tp[1] not in info.leaders:
                errors[tp] = UnknownTopicOrPartitionError(f"partition {tp[0]}-{tp[1]}")
            elif info.leaders[tp[1]] < 0:
                errors[tp] = error_for(int(ErrorCode.leader_not_available.value), f"{tp[0]}-{tp[1]}")
            else:
                by_leader.setdefault(info.leaders[tp[1]], []).append(tp)
        return by_leader, errors

    async def _per_leader(self, tps: Iterable[TP], api_key: int, versions: tuple[int, int],
                          make: Callable[[int, list[TP]], Any],
                          parse: Callable[[Any], dict[TP, Any]]) -> Results[TP, Any]:
        """Send one request per partition leader; refresh metadata and retry on leadership errors."""
        async def attempt(pending: list[TP]) -> dict[TP, Any]:
            by_leader, out = await self._leaders(pending)
            out = {k: (v if v.code != _UNKNOWN_TOPIC else _Final(v)) for k, v in out.items()}

            async def one(node: int, group: list[TP]) -> dict[TP, Any]:
                try:
                    return parse(await self._node(node, api_key, versions, lambda v: make(v, group)))
                except KafkaError as exc:
                    return {tp: exc for tp in group}
            for part in await asyncio.gather(*(one(n, g) for n, g in by_leader.items())):
                out.update(part)
            for tp, v in out.items():
                if isinstance(v, KafkaError) and v.code in REFRESH_ERRORS:
                    self.cluster.invalidate(tp[0])
            return out
        res = await self._gather(tps, attempt)
        for k, v in list(res.succeeded.items()):
            if isinstance(v, _Final):
                del res.succeeded[k]
                res.errors[k] = v.error
        return res

    async def _coordinated(self, key_type: int, keys: Iterable[str], api_key: int, versions: tuple[int, int],
                           make: Callable[[int, list[str]], Any], parse: Callable[[Any], dict[str, Any]],
                           raw: bool = False) -> Results[str, Any]:
        """One request per coordinator of the keys (groups or transactional ids), re-looked-up on moves."""
        async def attempt(pending: list[str]) -> dict[str, Any]:
            by_node: dict[int, list[str]] = {}
            out: dict[str, Any] = {}
            for key in pending:
                try:
                    by_node.setdefault(await self.cluster.coordinator(key_type, key), []).append(key)
                except KafkaError as exc:
                    out[key] = exc

            async def one(node: int, group: list[str]) -> dict[str, Any]:
                try:
                    return parse(await self._node(node, api_key, versions, lambda v: make(v, group), raw=raw))
                except KafkaError as exc:
                    return {k: exc for k in group}
            for part in await asyncio.gather(*(one(n, g) for n, g in by_node.items())):
                out.update(part)
            for key, v in out.items():
                if isinstance(v, KafkaError) and (v.code in COORDINATOR_ERRORS or v.name == "NETWORK_EXCEPTION"):
                    self.cluster.forget_coordinator(key_type, key)
            return out
        return await self._gather(keys, attempt)

    async def _every_broker(self, api_key: int, versions: tuple[int, int], make: Callable[[int], Any]
                            ) -> list[tuple[int, Any]]:
        await self._retry(lambda: self.cluster.refresh([]))
        nodes = sorted(self.cluster.nodes)

        async def one(node: int) -> tuple[int, Any]:
            return node, await self._retry(lambda: self._node(node, api_key, versions, make))
        return list(await asyncio.gather(*(one(n) for n in nodes)))

    # -- cluster and topics --------------------------------------------------------------------

    async def describe_cluster(self) -> ClusterDescription:
        """Cluster id, controller id and brokers (Metadata)."""
        md = await self._metadata([])
        return ClusterDescription(getattr(md, "cluster_id", None), int(getattr(md, "controller_id", -1)),
                                  {int(b.node_id): f"{b.host}:{int(b.port)}" for b in md.brokers})

    async def list_topics(self, internal: bool = False) -> list[str]:
        """The names of every topic, sorted (internal topics such as __consumer_offsets only with ``internal``)."""
        md = await self._metadata(None)
        return sorted(t.name for t in md.topics if internal or not getattr(t, "is_internal", False))

    async def describe_topics(self, names: Iterable[str]) -> Results[str, TopicDescription]:
        """Partitions, leaders, replicas and ISR of each topic (Metadata)."""
        names = list(dict.fromkeys(names))
        md = await self._metadata(names)
        done: dict[str, TopicDescription] = {}
        errors: dict[str, KafkaError] = {}
        for t in md.topics:
            if t.error_code:
                errors[t.name] = error_for(int(t.error_code), f"topic {t.name}")
                continue
            parts = tuple(sorted((PartitionDescription(int(p.partition_index), int(p.leader_id),
                                                       tuple(int(r) for r in p.replica_nodes),
                                                       tuple(int(r) for r in p.isr_nodes))
                                  for p in t.partitions), key=lambda p: p.partition))
            done[t.name] = TopicDescription(t.name, str(getattr(t, "topic_id", "")),
                                            bool(getattr(t, "is_internal", False)), parts)
        return Results({n: done[n] for n in names if n in done}, errors)

    async def describe_topic(self, name: str) -> TopicDescription:
        """:meth:`describe_topics` for one topic; raises its error (e.g. UnknownTopicOrPartitionError)."""
        return (await self.describe_topics([name]))[name]

    async def create_topics(self, topics: Iterable[NewTopic], validate_only: bool = False) -> Results[str, None]:
        """CreateTopics (the controller creates them; NOT_CONTROLLER is retried)."""
        topics = list(topics)
        timeout = self.config["request.timeout.ms"]

        def make(v: int, names: list[str]) -> dict[str, Any]:
            return {"topics": [{"name": t.name, "num_partitions": t.num_partitions,
                                "replication_factor": t.replication_factor,
                                "assignments": [{"partition_index": p, "broker_ids": list(b)}
                                                for p, b in (t.replica_assignment or {}).items()],
                                "configs": [{"name": k, "value": str(val)} for k, val in t.config.items()]}
                               for t in topics if t.name in names],
                    "timeout": timeout, "validate_only": validate_only}

        async def attempt(names: list[str]) -> dict[str, Any]:
            resp = await self._any(CREATE_TOPICS, (2, 7), None, lambda v: make(v, names))
            return {r.name: (error_for(int(r.error_code), r.error_message or f"topic {r.name}")
                             if r.error_code else None) for r in resp.topics}
        return await self._gather([t.name for t in topics], attempt)

    async def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                           config: Mapping[str, str] | None = None, validate_only: bool = False) -> None:
        """Create one topic; raises e.g. TopicAlreadyExistsError, InvalidConfigError."""
        res = await self.create_topics([NewTopic(name, partitions, replication_factor, dict(config or {}))],
                                       validate_only)
        res.raise_first()

    async def delete_topics(self, names: Iterable[str]) -> Results[str, None]:
        """DeleteTopics by name."""
        timeout = self.config["request.timeout.ms"]

        def make(v: int, names: list[str]) -> dict[str, Any]:
            if v >= 6:
                return {"topics": [{"name": n, "topic_id": None} for n in names], "timeout": timeout}
            return {"topic_names": list(names), "timeout": timeout}

        async def attempt(names: list[str]) -> dict[str, Any]:
            resp = await self._any(DELETE_TOPICS, (1, 6), None, lambda v: make(v, names))
            return {r.name: (error_for(int(r.error_code), getattr(r, "error_message", None) or f"topic {r.name}")
                             if r.error_code else None) for r in resp.responses}
        return await self._gather(names, attempt, final=frozenset({_UNKNOWN_TOPIC}))

    async def delete_topic(self, name: str) -> None:
        """Delete one topic; raises UnknownTopicOrPartitionError when it does not exist."""
        (await self.delete_topics([name])).raise_first()

    async def create_partitions(self, new_totals: Mapping[str, int], validate_only: bool = False
                                ) -> Results[str, None]:
        """CreatePartitions: grow each topic to its new total partition count."""
        timeout = self.config["request.timeout.ms"]

        async def attempt(names: list[str]) -> dict[str, Any]:
            body = {"topics": [{"name": n, "count": int(new_totals[n]), "assignments": None} for n in names],
                    "timeout": timeout, "validate_only": validate_only}
            resp = await self._any(CREATE_PARTITIONS, (0, 3), body)
            return {r.name: (error_for(int(r.error_code), r.error_message or f"topic {r.name}")
                             if r.error_code else None) for r in resp.results}
        return await self._gather(list(new_totals), attempt, final=frozenset({_UNKNOWN_TOPIC}))

    # -- configs ----------------------------------------------------------------------------------

    def _config_node(self, resource: ConfigResource) -> int | None:
        """BROKER and BROKER_LOGGER resources go to that broker; the rest to any broker."""
        if resource.type in ("broker", "broker_logger") and resource.name:
            return int(resource.name)
        return None

    async def _config_request(self, resources: list[ConfigResource], api_key: int, versions: tuple[int, int],
                              make: Callable[[int, list[ConfigResource]], Any], field_name: str
                              ) -> Results[ConfigResource, Any]:
        async def attempt(pending: list[ConfigResource]) -> dict[ConfigResource, Any]:
            groups: dict[int | None, list[ConfigResource]] = {}
            for r in pending:
                groups.setdefault(self._config_node(r), []).append(r)
            out: dict[ConfigResource, Any] = {}
            for node, group in groups.items():
                if node is None:
                    resp = await self._any(api_key, versions, None, lambda v: make(v, group))
                else:
                    resp = await self._node(node, api_key, versions, lambda v: make(v, group))
                by_key = {(int(r.resource_type), r.resource_name): r for r in getattr(resp, field_name)}
                for res in group:
                    r = by_key.get((res.type_id, res.name))
                    if r is None:
                        out[res] = error_for(int(ErrorCode.unknown_server_error.value), f"{res}: no answer")
                    elif r.error_code:
                        out[res] = error_for(int(r.error_code), r.error_message or f"{res.type} {res.name}")
                    else:
                        out[res] = r
            return out
        return await self._gather(resources, attempt, final=frozenset({_UNKNOWN_TOPIC}))

    async def describe_configs(self, resources: Iterable[ConfigResource], include_synonyms: bool = False
                               ) -> Results[ConfigResource, dict[str, ConfigEntry]]:
        """DescribeConfigs: every config of each resource, by name."""
        def make(v: int, group: list[ConfigResource]) -> dict[str, Any]:
            return {"resources": [{"resource_type": r.type_id, "resource_name": r.name, "configuration_keys": None}
                                  for r in group], "include_synonyms": include_synonyms,
                    "include_documentation": False}
        res = await self._config_request(list(resources), DESCRIBE_CONFIGS, (1, 4), make, "results")
        for key, r in list(res.succeeded.items()):
            res.succeeded[key] = {c.name: ConfigEntry(c.name, c.value, CONFIG_SOURCES.get(int(c.config_source),
                                                                                           "UNKNOWN"),
                                                      bool(c.read_only), bool(c.is_sensitive)) for c in r.configs}
        return res

    async def describe_topic_configs(self, topic: str) -> dict[str, str | None]:
        """Every config of one topic as ``{name: value}``; raises the topic's error."""
        entries = (await self.describe_configs([ConfigResource("topic", topic)]))[ConfigResource("topic", topic)]
        return {name: e.value for name, e in entries.items()}

    async def alter_configs(self, configs: Mapping[ConfigResource, Mapping[str, str]], validate_only: bool = False
                            ) -> Results[ConfigResource, None]:
        """AlterConfigs: replace each resource's dynamic configs with exactly these (Kafka's legacy API)."""
        def make(v: int, group: list[ConfigResource]) -> dict[str, Any]:
            return {"resources": [{"resource_type": r.type_id, "resource_name": r.name,
                                   "configs": [{"name": k, "value": val} for k, val in configs[r].items()]}
                                  for r in group], "validate_only": validate_only}
        res = await self._config_request(list(configs), ALTER_CONFIGS, (0, 2), make, "responses")
        return Results({k: None for k in res.succeeded}, res.errors)

    async def incremental_alter_configs(self, ops: Mapping[ConfigResource, Iterable[AlterConfigOp]],
                                        validate_only: bool = False) -> Results[ConfigResource, None]:
        """IncrementalAlterConfigs: set, delete, append to or subtract from single configs."""
        ops = {r: list(o) for r, o in ops.items()}

        def make(v: int, group: list[ConfigResource]) -> dict[str, Any]:
            return {"resources": [{"resource_type": r.type_id, "resource_name": r.name,
                                   "configs": [{"name": o.name, "config_operation": ALTER_OPS[o.op], "value": o.value}
                                               for o in ops[r]]} for r in group], "validate_only": validate_only}
        res = await self._config_request(list(ops), INCREMENTAL_ALTER_CONFIGS, (0, 1), make, "responses")
        return Results({k: None for k in res.succeeded}, res.errors)

    # -- records and offsets ------------------------------------------------------------------------

    async def delete_records(self, offsets: Mapping[Any, int]) -> Results[TP, int]:
        """DeleteRecords at each leader: delete the records below each offset (-1: the high watermark).

        Keys are ``(topic, partition)`` (or objects with ``.topic``/``.partition``); the
        result of each partition is its new low watermark (log start offset).
        """
        wanted = {_tp(k): int(v) for k, v in offsets.items()}
        timeout = self.config["request.timeout.ms"]

        def make(v: int, group: list[TP]) -> dict[str, Any]:
            return {"topics": [{"name": t, "partitions": [{"partition_index": p, "offset": wanted[(t, p)]}
                                                          for p in ps]} for t, ps in _by_topic(group).items()],
                    "timeout": timeout}

        def parse(resp: Any) -> dict[TP, Any]:
            return {(t.name, int(p.partition_index)): (error_for(int(p.error_code), f"{t.name}-{p.partition_index}")
                                                       if p.error_code else int(p.low_watermark))
                    for t in resp.topics for p in t.partitions}
        return await self._per_leader(list(wanted), DELETE_RECORDS, (0, 2), make, parse)

    async def list_offsets(self, specs: Mapping[Any, int], isolation_level: str = "read_uncommitted"
                           ) -> Results[TP, ListedOffset]:
        """ListOffsets at each leader; each spec is an :class:`OffsetSpec` constant or a timestamp (ms)."""
        wanted = {_tp(k): int(v) for k, v in specs.items()}
        iso = {"read_uncommitted": 0, "read_committed": 1}[isolation_level]
        lo = 7 if any(v == OffsetSpec.MAX_TIMESTAMP for v in wanted.values()) else 1

        def make(v: int, group: list[TP]) -> dict[str, Any]:
            return {"replica_id": -1, "isolation_level": iso,
                    "topics": [{"name": t, "partitions": [{"partition_index": p, "current_leader_epoch": -1,
                                                           "timestamp": wanted[(t, p)]} for p in ps]}
                               for t, ps in _by_topic(group).items()]}

        def parse(resp: Any) -> dict[TP, Any]:
            return {(t.name, int(p.partition_index)): (error_for(int(p.error_code), f"{t.name}-{p.partition_index}")
                                                       if p.error_code else
                                                       ListedOffset(int(p.offset), to_ms(p.timestamp)))
                    for t in resp.topics for p in t.partitions}
        return await self._per_leader(list(wanted), LIST_OFFSETS, (lo, 8), make, parse)

    async def _offsets(self, tps: Iterable[TP], spec: int) -> dict[TP, int]:
        res = (await self.list_offsets({tp: spec for tp in tps})).raise_first()
        return {tp: o.offset for tp, o in res.succeeded.items()}

    async def topic_summary(self, name: str) -> dict[str, Any]:
        """What ``oncelog topics describe`` prints: topic id, configs, and per partition its
        leader, log start offset and high watermark. Raises the topic's error."""
        desc = await self.describe_topic(name)
        tps = [(name, p.partition) for p in desc.partitions]
        starts = await self._offsets(tps, OffsetSpec.EARLIEST)
        ends = await self._offsets(tps, OffsetSpec.LATEST)
        return {"name": name, "topic_id": desc.topic_id, "configs": await self.describe_topic_configs(name),
                "partitions": [{"partition": p.partition, "leader": p.leader,
                                "log_start_offset": starts[(name, p.partition)],
                                "high_watermark": ends[(name, p.partition)]} for p in desc.partitions]}

    async def partitions_of(self, topic: str) -> list[int]:
        """The partition numbers of ``topic``; raises UnknownTopicOrPartitionError when it does not exist."""
        return [p.partition for p in (await self.describe_topic(topic)).partitions]

    # -- groups -----------------------------------------------------------------------------------

    async def list_groups(self, states: Iterable[str] = ()) -> list[ListedGroup]:
        """ListGroups on every broker (``states``: only groups in these states, ListGroups v4+)."""
        states = tuple(states)
        out = []
        for node, resp in await self._every_broker(
                LIST_GROUPS, (0, 5), lambda v: {"states_filter": states, "types_filter": ()}):
            if resp.error_code:
                raise error_for(int(resp.error_code), f"ListGroups on broker {node}")
            out.extend(ListedGroup(g.group_id, g.protocol_type, getattr(g, "group_state", ""), node)
                       for g in resp.groups)
        return sorted(out, key=lambda g: (g.group_id, g.coordinator))

    async def describe_groups(self, group_ids: Iterable[str]) -> Results[str, GroupInfo]:
        """DescribeGroups at each coordinator: state, protocol, members with their decoded assignment.

        A group the coordinator does not know is described as state ``Dead``, as Kafka does.
        """
        def make(v: int, ids: list[str]) -> dict[str, Any]:
            return {"groups": tuple(ids), "include_authorized_operations": False}

        def parse(resp: Any) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for g in resp.groups:
                if g.error_code:
                    out[g.group_id] = error_for(int(g.error_code), f"group {g.group_id}")
                    continue
                members = []
                for m in g.members:
                    try:
                        assignment = (parse_assignment(bytes(m.member_assignment))
                                      if g.protocol_type == "consumer" else {})
                    except (struct.error, UnicodeDecodeError):
                        assignment = {}
                    members.append(MemberInfo(m.member_id, getattr(m, "group_instance_id", None), m.client_id,
                                              m.client_host, assignment))
                out[g.group_id] = GroupInfo(g.group_id, g.group_state, g.protocol_type, g.protocol_data, members)
            return out
        return await self._coordinated(GROUP_KEY, group_ids, DESCRIBE_GROUPS, (0, 5), make, parse)

    async def describe_group(self, group_id: str) -> GroupInfo:
        """:meth:`describe_groups` for one group; raises its error."""
        return (await self.describe_groups([group_id]))[group_id]

    async def delete_groups(self, group_ids: Iterable[str]) -> Results[str, None]:
        """DeleteGroups at each coordinator (GroupNotEmptyError while it has members)."""
        def parse(resp: Any) -> dict[str, Any]:
            return {r.group_id: (error_for(int(r.error_code), f"group {r.group_id}") if r.error_code else None)
                    for r in resp.results}
        return await self._coordinated(GROUP_KEY, group_ids, DELETE_GROUPS, (0, 2),
                                       lambda v, ids: {"groups_names": tuple(ids)}, parse)

    async def delete_group(self, group_id: str) -> None:
        """Delete one group; raises e.g. GroupIdNotFoundError, NonEmptyGroupError."""
        (await self.delete_groups([group_id])).raise_first()

    async def list_group_offsets(self, group_id: str, partitions: Iterable[Any] | None = None,
                                 require_stable: bool = False) -> dict[TP, int]:
        """The group's committed offsets (OffsetFetch at its coordinator), only partitions with one.

        ``partitions=None``: every partition the group committed. ``require_stable``
        (KIP-447): wait while a transaction's offsets are pending (UNSTABLE_OFFSET_COMMIT is retried).
        """
        tps = None if partitions is None else [_tp(p) for p in partitions]

        def make(v: int, ids: list[str]) -> dict[str, Any]:
            topics = None if tps is None else [{"name": t, "partition_indexes": ps}
                                               for t, ps in _by_topic(tps).items()]
            if v >= 8:
                return {"groups": [{"group_id": ids[0], "topics": topics}], "require_stable": require_stable}
            return {"group_id": ids[0], "topics": topics, "require_stable": require_stable}

        def parse(resp: Any) -> dict[str, Any]:
            g = resp.groups[0] if hasattr(resp, "groups") else resp
            code = int(getattr(g, "error_code", 0))
            if code:
                return {group_id: error_for(code, f"OffsetFetch {group_id}")}
            out: dict[TP, int] = {}
            for t in g.topics or ():  # librdkafka's mock answers null for "every topic"
                for p in t.partitions:
                    if p.error_code:
                        return {group_id: error_for(int(p.error_code),
                                                    f"OffsetFetch {group_id} {t.name}-{p.partition_index}")}
                    if p.committed_offset >= 0:
                        out[(t.name, int(p.partition_index))] = int(p.committed_offset)
            return {group_id: out}
        res = await self._coordinated(GROUP_KEY, [group_id], OFFSET_FETCH, (1, 8), make, parse)
        return res[group_id]

    async def alter_group_offsets(self, group_id: str, offsets: Mapping[Any, int]) -> Results[TP, None]:
        """Commit offsets as an admin (OffsetCommit, generation -1): only while the group has no members."""
        wanted = {_tp(k): int(v) for k, v in offsets.items()}

        def make(v: int, _ids: list[str]) -> dict[str, Any]:
            return {"group_id": group_id, "generation_id_or_member_epoch": -1, "member_id": "",
                    "group_instance_id": None, "retention_time": -1,
                    "topics": [{"name": t, "partitions": [{"partition_index": p, "committed_offset": wanted[(t, p)],
                                                           "committed_leader_epoch": -1, "committed_metadata": ""}
                                                          for p in sorted(ps)]}
                               for t, ps in _by_topic(sorted(wanted)).items()]}

        def parse(resp: Any) -> dict[str, Any]:
            errs = {(t.name, int(p.partition_index)): error_for(int(p.error_code),
                                                                f"{group_id} {t.name}-{p.partition_index}")
                    for t in resp.topics for p in t.partitions if p.error_code}
            coordinator = [e for e in errs.values() if e.code in COORDINATOR_ERRORS]
            return {group_id: coordinator[0] if coordinator else errs}
        errs = (await self._coordinated(GROUP_KEY, [group_id], OFFSET_COMMIT, (2, 9), make, parse))[group_id]
        return Results({tp: None for tp in wanted if tp not in errs}, errs)

    async def delete_group_offsets(self, group_id: str, partitions: Iterable[Any]) -> Results[TP, None]:
        """OffsetDelete: forget the group's committed offsets of these partitions (not while subscribed)."""
        tps = [_tp(p) for p in partitions]

        def make(v: int, _ids: list[str]) -> dict[str, Any]:
            return {"group_id": group_id, "topics": [{"name": t, "partitions": [{"partition_index": p} for p in ps]}
                                                      for t, ps in _by_topic(tps).items()]}

        def parse(resp: Any) -> dict[str, Any]:
            if resp.error_code:
                return {group_id: error_for(int(resp.error_code), f"OffsetDelete {group_id}")}
            return {group_id: {(t.name, int(p.partition_index)): error_for(int(p.error_code),
                                                                           f"{t.name}-{p.partition_index}")
                               for t in resp.topics for p in t.partitions if p.error_code}}
        errs = (await self._coordinated(GROUP_KEY, [group_id], OFFSET_DELETE, (0, 0), make, parse))[group_id]
        return Results({tp: None for tp in tps if tp not in errs}, errs)

    async def group_lag(self, group_id: str) -> list[dict[str, Any]]:
        """Per partition (committed or assigned): ``topic, partition, committed, log_end, lag, member``."""
        info = await self.describe_group(group_id)
        owner: dict[TP, str] = {}
        for m in info.members:
            for topic, parts in m.assignment.items():
                for p in parts:
                    owner[(topic, p)] = m.member_id
        committed = await self.list_group_offsets(group_id)
        tps = sorted(set(committed) | set(owner))
        ends = await self._offsets(tps, OffsetSpec.LATEST) if tps else {}
        rows = []
        for tp in tps:
            c = committed.get(tp)
            end = ends.get(tp, -1)
            rows.append({"topic": tp[0], "partition": tp[1], "committed": c, "log_end": end,
                         "lag": None if c is None else max(end - c, 0), "member": owner.get(tp)})
        return rows

    async def plan_offset_reset(self, group_id: str, topic: str, to: str, partitions: list[int] | None = None
                                ) -> dict[TP, int]:
        """Target offsets for a reset (``earliest``, ``latest``, ``offset:N``, ``shift:N``), clamped to the log."""
        parts = partitions if partitions is not None else await self.partitions_of(topic)
        tps = [(topic, p) for p in parts]
        earliest = await self._offsets(tps, OffsetSpec.EARLIEST)
        latest = await self._offsets(tps, OffsetSpec.LATEST)
        if to == "earliest":
            return earliest
        if to == "latest":
            return latest
        kind, _, number = to.partition(":")
        n = int(number)
        if kind == "offset":
            return {tp: min(max(n, earliest[tp]), latest[tp]) for tp in tps}
        if kind == "shift":
            current = await self.list_group_offsets(group_id)
            return {tp: min(max(current.get(tp, latest[tp]) + n, earliest[tp]), latest[tp]) for tp in tps}
        raise ValueError(f"unknown reset target {to!r}")

    # -- transactions and producers (KIP-664) ---------------------------------------------------------

    async def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                                duration_ms: int = -1) -> list[TransactionListing]:
        """ListTransactions on every broker (filters: states, producer ids, open at least ``duration_ms``)."""
        states, producer_ids = list(states), list(producer_ids)
        out = []
        for node, resp in await self._every_broker(
                LIST_TRANSACTIONS, (0, 2), lambda v: list_transactions_body(v, states, producer_ids, duration_ms)):
            if resp.error_code:
                raise error_for(int(resp.error_code), f"ListTransactions on broker {node}")
            unknown = list(getattr(resp, "unknown_state_filters", ()) or ())
            if unknown:
                raise TxnAdminError(f"unknown transaction states: {', '.join(unknown)}")
            out.extend(TransactionListing(s.transactional_id, int(s.producer_id), s.transaction_state, node)
                       for s in resp.transaction_states)
        return sorted(out, key=lambda r: (r.transactional_id, r.coordinator))

    async def describe_transactions(self, transactional_ids: Iterable[str]) -> Results[str, TxnDescription]:
        """DescribeTransactions at each transactional id's coordinator."""
        def parse(raw: Any) -> dict[str, Any]:
            frame, pos = raw
            out: dict[str, Any] = {}
            for s in parse_describe_transactions_v0(frame, pos):
                tid, code = s["transactional_id"], s["error_code"]
                out[tid] = error_for(code, f"transactional id {tid}") if code else s
            return out
        res = await self._coordinated(TXN_KEY, transactional_ids, DESCRIBE_TRANSACTIONS, (0, 0),
                                      lambda v, ids: {"transactional_ids": tuple(ids)}, parse, raw=True)
        for tid, s in list(res.succeeded.items()):
            node = self.cluster._coordinators.get((TXN_KEY, tid), -1)
            res.succeeded[tid] = TxnDescription(tid, node, s["transaction_state"], s["producer_id"],
                                                s["producer_epoch"], s["transaction_timeout_ms"],
                                                s["transaction_start_time_ms"], s["partitions"])
        return res

    async def describe_transaction(self, transactional_id: str) -> TxnDescription:
        """:meth:`describe_transactions` for one id; raises e.g. TransactionalIdNotFoundError."""
        return (await self.describe_transactions([transactional_id]))[transactional_id]

    async def describe_producers(self, partitions: Iterable[Any]) -> Results[TP, list[ProducerInfo]]:
        """DescribeProducers at each partition's leader: the active (idempotent/transactional) producers."""
        def make(v: int, group: list[TP]) -> dict[str, Any]:
            return {"topics": [{"name": t, "partition_indexes": tuple(ps)} for t, ps in _by_topic(group).items()]}

        def parse(resp: Any) -> dict[TP, Any]:
            out: dict[TP, Any] = {}
            for t in resp.topics:
                for p in t.partitions:
                    tp = (t.name, int(p.partition_index))
                    if p.error_code:
                        out[tp] = error_for(int(p.error_code), p.error_message or f"{t.name}-{p.partition_index}")
                        continue
                    out[tp] = [ProducerInfo(int(s.producer_id), int(s.producer_epoch), int(s.last_sequence),
                                            to_ms(s.last_timestamp), int(s.coordinator_epoch),
                                            int(s.current_txn_start_offset)) for s in p.active_producers]
            return out
        return await self._per_leader(sorted({_tp(p) for p in partitions}), DESCRIBE_PRODUCERS, (0, 0), make, parse)

    async def find_hanging(self, topic: str | None = None, partition: int | None = None,
                           max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
                           margin_ms: int = 0) -> list[OpenTxn]:
        """Hanging transactions on the searched partitions (every partition of every topic by default).

        The rule is :mod:`oncelog.client.txns`'s (Kafka's ``kafka-transactions.sh find-hanging``).
        """
        if partition is not None and topic is None:
            raise TxnAdminError("--partition needs --topic")
        if partition is not None:
            tps = [(topic, partition)]
        elif topic is not None:
            tps = [(topic, p) for p in await self.partitions_of(topic)]
        else:
            md = await self._metadata(None)
            tps = sorted((t.name, int(p.partition_index)) for t in md.topics
                         if not t.error_code and not getattr(t, "is_internal", False) for p in t.partitions)
        res = await self.describe_producers(tps)
        if res.errors:
            raise type(res.errors[sorted(res.errors)[0]])(
                "DescribeProducers failed for "
                + ", ".join(f"{t}-{p}: {e}" for (t, p), e in sorted(res.errors.items())))
        candidates = hanging_candidates(res.succeeded, self.clock(), max_transaction_timeout_ms, margin_ms)
        if not candidates:
            return []
        pids = sorted({c.producer.producer_id for c in candidates})
        tids = {r.producer_id: r.transactional_id for r in await self.list_transactions(producer_ids=pids)
                if r.producer_id in pids}
        described = await self.describe_transactions(sorted(set(tids.values())))
        descriptions: dict[str, TxnDescription | None] = dict(described.succeeded)
        return filter_hanging(candidates, tids, descriptions, self.clock(), margin_ms)

    async def abort_spec(self, topic: str, partition: int, start_offset: int) -> AbortSpec:
        """The producer whose open transaction on the partition starts at ``start_offset`` (DescribeProducers)."""
        producers = (await self.describe_producers([(topic, partition)]))[(topic, partition)]
        return abort_spec_for_offset(topic, partition, producers, start_offset)

    async def abort_transaction(self, spec: AbortSpec) -> None:
        """Write one ABORT marker for ``spec`` at the partition leader (Kafka's ``Admin.abortTransaction``)."""
        tp = (spec.topic, spec.partition)

        def make(v: int, _group: list[TP]) -> dict[str, Any]:
            return {"markers": [{
                "producer_id": spec.producer_id, "producer_epoch": spec.producer_epoch, "transaction_result": False,
                "topics": [{"name": spec.topic, "partition_indexes": (spec.partition,)}],
                "coordinator_epoch": max(spec.coordinator_epoch, 0),
                "transaction_version": 0,  # v2+: classic marker semantics (the producer's own epoch)
            }]}

        def parse(resp: Any) -> dict[TP, Any]:
            m = resp.markers
            if (len(m) != 1 or m[0].producer_id != spec.producer_id or len(m[0].topics) != 1
                    or m[0].topics[0].name != spec.topic or len(m[0].topics[0].partitions) != 1
                    or m[0].topics[0].partitions[0].partition_index != spec.partition):
                return {tp: error_for(int(ErrorCode.unknown_server_error.value),
                                      f"WriteTxnMarkers: unexpected response {resp!r}")}
            code = int(m[0].topics[0].partitions[0].error_code)
            return {tp: error_for(code, f"failed to abort the transaction of producer {spec.producer_id} (epoch "
                                        f"{spec.producer_epoch}, coordinator epoch {spec.coordinator_epoch}) on "
                                        f"{spec.topic}-{spec.partition}") if code else None}
        (await self._per_leader([tp], WRITE_TXN_MARKERS, (1, 2), make, parse)).raise_first()


@dataclass
class _Final:
    """A per-resource error not to be retried (carried through :meth:`Admin._gather` as a value)."""

    error: KafkaError
