"""Broker configuration with Kafka's property names.

``oncelog serve --config FILE`` reads a Java-style properties file. Broker-wide
log defaults (``log.segment.bytes``, ``log.retention.ms``, ...) are handed to
:class:`oncelog.storage.config.LogConfig`; the rest is read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from oncelog.storage.config import BROKER_SYNONYM, LogConfig

_LISTENER = re.compile(r"^(?:[A-Za-z_]+://)?\[?([^\]]*?)\]?:(\d+)$")


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java properties (``key=value`` or ``key: value``; # and ! comments)."""
    props: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep < 0:
            props[line] = ""
        else:
            props[line[:sep].strip()] = line[sep + 1 :].strip()
    return props


def parse_listener(value: str) -> tuple[str, int]:
    """``PLAINTEXT://127.0.0.1:19092`` or ``127.0.0.1:19092`` → (host, port)."""
    first = value.split(",")[0].strip()
    m = _LISTENER.match(first)
    if not m:
        raise ValueError(f"cannot parse listener {value!r}")
    return m.group(1) or "127.0.0.1", int(m.group(2))


def _bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


# Kafka property name -> BrokerConfig attribute, for the plain int and bool settings
_INTS = {
    "num.partitions": "num_partitions",
    "default.replication.factor": "default_replication_factor",
    "socket.request.max.bytes": "socket_request_max_bytes",
    "log.flush.interval.messages": "log_flush_interval_messages",
    "log.flush.interval.ms": "log_flush_interval_ms",
    "log.retention.check.interval.ms": "log_retention_check_interval_ms",
    "producer.id.expiration.ms": "producer_id_expiration_ms",
    "producer.id.expiration.check.interval.ms": "producer_id_expiration_check_interval_ms",
    "oncelog.producer.state.max.producers": "max_producers_per_partition",
    "group.min.session.timeout.ms": "group_min_session_timeout_ms",
    "group.max.session.timeout.ms": "group_max_session_timeout_ms",
    "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
    "group.max.size": "group_max_size",
    "offset.metadata.max.bytes": "offset_metadata_max_bytes",
    "offsets.retention.minutes": "offsets_retention_minutes",
    "offsets.retention.check.interval.ms": "offsets_retention_check_interval_ms",
    "oncelog.group.coordinator.tick.ms": "group_coordinator_tick_ms",
    "oncelog.offsets.snapshot.bytes": "offsets_snapshot_bytes",
    "transaction.max.timeout.ms": "transaction_max_timeout_ms",
    "transactional.id.expiration.ms": "transactional_id_expiration_ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "transaction_abort_timed_out_transaction_cleanup_interval_ms",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "transaction_remove_expired_transaction_cleanup_interval_ms",
    "oncelog.transaction.version": "transaction_version",
}
_BOOLS = {
    "auto.create.topics.enable": "auto_create_topics_enable",
    "delete.topic.enable": "delete_topic_enable",
    "transaction.two.phase.commit.enable": "transaction_two_phase_commit_enable",
}


@dataclass
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 9092
    data_dir: Path = Path("./data")
    node_id: int = 1
    advertised_host: str | None = None
    advertised_port: int | None = None
    auto_create_topics_enable: bool = True
    num_partitions: int = 1
    default_replication_factor: int = 1
    socket_request_max_bytes: int = 104857600
    # 1 = fsync before every acknowledgement (group commit); larger values leave
    # data in the page cache and flush every log_flush_interval_ms, as Kafka does.
    log_flush_interval_messages: int = 1
    log_flush_interval_ms: int = 1000
    log_retention_check_interval_ms: int = 300000
    delete_topic_enable: bool = True
    producer_id_expiration_ms: int = 86400000
    producer_id_expiration_check_interval_ms: int = 600000
    # oncelog's bound on idempotent-producer entries kept per partition (LRU)
    max_producers_per_partition: int = 10000
    # consumer groups (Kafka's names; see docs/groups.md)
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    group_initial_rebalance_delay_ms: int = 3000
    group_max_size: int = 2147483647
    offset_metadata_max_bytes: int = 4096
    offsets_retention_minutes: int = 10080
    offsets_retention_check_interval_ms: int = 600000
    # oncelog's own: coordinator timer resolution, offsets log snapshot threshold
    group_coordinator_tick_ms: int = 100
    offsets_snapshot_bytes: int = 8388608
    # transactions (Kafka's names; see docs/transactions.md)
    transaction_max_timeout_ms: int = 900000
    transactional_id_expiration_ms: int = 604800000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10000
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3600000
    transaction_two_phase_commit_enable: bool = False
    # the finalized level of the transaction.version feature (KIP-890): 2 = TV2
    transaction_version: int = 2
    log: LogConfig = field(default_factory=LogConfig)
    raw: dict[str, str] = field(default_factory=dict)

    @property
    def fsync_on_ack(self) -> bool:
        return self.log_flush_interval_messages <= 1

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    @classmethod
    def from_properties(cls, props: dict[str, str], **overrides: object) -> "BrokerConfig":
        cfg = cls(raw=dict(props))
        get = props.get
        if "node.id" in props or "broker.id" in props:
            cfg.node_id = int(get("node.id") or get("broker.id") or 1)
        if "listeners" in props:
            cfg.host, cfg.port = parse_listener(props["listeners"])
        if "advertised.listeners" in props:
            cfg.advertised_host, cfg.advertised_port = parse_listener(props["advertised.listeners"])
        if "log.dirs" in props or "log.dir" in props:
            cfg.data_dir = Path((get("log.dirs") or get("log.dir") or "./data").split(",")[0])
        for key, attr in _INTS.items():
            if key in props:
                setattr(cfg, attr, int(props[key]))
        for key, attr in _BOOLS.items():
            if key in props:
                setattr(cfg, attr, _bool(props[key]))
        cfg.log = LogConfig.from_properties(props)
        for key, value in overrides.items():
            if value is not None:
                setattr(cfg, key, value)
        return cfg

    @classmethod
    def load(cls, path: str | Path | None, **overrides: object) -> "BrokerConfig":
        props = parse_properties(Path(path).read_text()) if path else {}
        return cls.from_properties(props, **overrides)

    def broker_configs(self) -> dict[str, str]:
        """Broker-level configs as DescribeConfigs(BROKER) reports them."""
        out = {
            "node.id": str(self.node_id),
            "broker.id": str(self.node_id),
            "listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "advertised.listeners": "PLAINTEXT://%s:%d" % self.advertised,
            "log.dirs": str(self.data_dir),
        }
        out.update((key, str(getattr(self, attr))) for key, attr in _INTS.items())
        out.update((key, str(getattr(self, attr)).lower()) for key, attr in _BOOLS.items())
        for key, value in self.log.to_topic_configs().items():
            if key in BROKER_SYNONYM:  # oncelog's own meaning wins (log.flush.interval.messages)
                out.setdefault(BROKER_SYNONYM[key], value)
        return out

