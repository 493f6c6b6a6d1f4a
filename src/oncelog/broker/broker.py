"""The broker's domain state: topics, partitions, durability. No socket IO here.

Handlers (one module per API under :mod:`oncelog.broker.handlers`) check the
request version and then call the methods of :class:`Broker`, which own the
state and enforce the rules.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from oncelog.broker import dynamic_config
from oncelog.broker.config import BrokerConfig, StartupError
from oncelog.broker.durability import GroupCommitter
from oncelog.broker.group import GroupConfig, GroupCoordinator, OffsetStore
from oncelog.broker.markers import BrokerMarkerWriter
from oncelog.broker.partition import Partition
from oncelog.broker.producer_ids import ProducerIdManager
from oncelog.broker.txn import FileTxnLog, TransactionCoordinator, TxnConfig
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.storage.catalog import TopicCatalog, TopicExistsError
from oncelog.storage.config import TOPIC_CONFIGS, ConfigError, LogConfig
from oncelog.storage.engine import LogManager
from oncelog.storage.fileutil import DirLock, atomic_write
from oncelog.storage.log_dir import DescriptorShortageError, LogDirFailureChannel, log_level

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"  # its one log is the offsets store's (broker/group/offsets.py)
TXN_TOPIC = "__transaction_state"  # its one log is the transaction coordinator's (broker/txn/log.py)
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def lock_data_dir(data_dir: Path) -> DirLock:
    """Create ``data_dir`` if needed and lock it; StartupError if it is not a
    usable directory or another broker holds it."""
    if data_dir.exists() and not data_dir.is_dir():
        raise StartupError(f"data directory {data_dir} is not a directory")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        return DirLock.acquire(data_dir)
    except OSError as exc:  # DirLockedError included: its message says who holds it
        raise StartupError(str(exc) if exc.strerror is None else f"data directory {data_dir}: {exc.strerror}") from None


def validate_topic_name(name: str) -> None:
    if name in (".", "..") or not _LEGAL_TOPIC.match(name or ""):
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f"topic name {name!r} is illegal: use 1-249 of [a-zA-Z0-9._-], not '.' or '..'",
        )


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: list[Partition] = field(default_factory=list)
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False


def _now_ms() -> int:
    return int(time.time() * 1000)


class Broker:
    def __init__(self, config: BrokerConfig, clock: Callable[[], int] = _now_ms) -> None:
        self.config = config
        self.clock = clock
        self.topics: dict[str, Topic] = {}
        self.topics_by_id: dict[uuid.UUID, Topic] = {}
        # bumped by every change of the topic/partition set (Metadata caches its all-topics answer on it)
        self.topology_version = 0
        self.metadata_cache: dict[int, tuple[object, bytes]] = {}  # handlers/metadata.py: version -> (key, body)
        # the one log directory: offline for good on the first I/O error of a log's append or
        # fsync (storage/log_dir.py); every log, the committer and the server share it
        self.log_dir = LogDirFailureChannel(config.data_dir)
        self.committer = GroupCommitter(config.fsync_on_ack, config.log_flush_interval_ms, self.log_dir)
        # the data directory is locked before anything in it is read or written (Kafka's .lock)
        self.dir_lock = lock_data_dir(config.data_dir)
        self.cluster_id = self._load_cluster_id()
        self.producer_ids = ProducerIdManager(config.data_dir / "meta", self.log_dir)
        self.catalog = TopicCatalog.load(config.data_dir)
        self.catalog.failure_channel = self.log_dir
        self._static_producer_id_expiration_ms = config.producer_id_expiration_ms
        self.dynamic = dynamic_config.DynamicBrokerConfigs.load(config.data_dir / "meta")
        self.cleaner_threads = config.log_cleaner_threads  # of the running log cleaner (set by the server)
        # called after dynamic broker configs change (the server restarts the log cleaner)
        self.config_listeners: list[Callable[[], None]] = []
        self.logs = LogManager(config.data_dir, self._dynamic_log_defaults(), self.log_dir)
        self._apply_dynamic_scalars()
        self.logs.open_all(self.catalog, self.clock())
        for meta in self.catalog.topics():
            self._attach_topic(meta.name, uuid.UUID(str(meta.topic_id)), meta.num_partitions, meta.configs)
        self.groups = GroupCoordinator(
            OffsetStore.open(config.data_dir, self.committer.wait_durable, self.clock, config.offsets_snapshot_bytes,
                             self.log_dir),
            self.clock,
            GroupConfig(
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                max_size=config.group_max_size,
                offset_metadata_max_bytes=config.offset_metadata_max_bytes,
                offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            ),
        )
        # transactions: the coordinator's log is __transaction_state-0; markers go
        # in-process to the partitions and the offsets store (broker/markers.py)
        self.markers = BrokerMarkerWriter(self)
        self.coordinator_epoch = self._bump_coordinator_epoch()
        self.txn_log = FileTxnLog.open(config.data_dir, self.committer.wait_durable, self.clock,
                                       failure_channel=self.log_dir)
        self.txn = TransactionCoordinator(
            self.txn_log,
            self.markers,
            self.producer_ids,
            self.clock,
            TxnConfig(
                transaction_max_timeout_ms=config.transaction_max_timeout_ms,
                transactional_id_expiration_ms=config.transactional_id_expiration_ms,
                abort_timed_out_interval_ms=config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
                remove_expired_interval_ms=config.transaction_remove_expired_transaction_cleanup_interval_ms,
                two_phase_commit_enable=config.transaction_two_phase_commit_enable,
                transaction_version=config.transaction_version,
            ),
            self.coordinator_epoch,
        )

    # -- identity ---------------------------------------------------------

    def _load_cluster_id(self) -> str:
        path = self.config.data_dir / "meta" / "cluster_id"
        if path.exists():
            return path.read_text().strip()
        cid = uuid.uuid4().hex[:22]
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, cid.encode())
        return cid

    def _bump_coordinator_epoch(self) -> int:
        """Kafka's coordinator epoch changes when a coordinator takes over; here
        every start is a take-over, so markers of a previous run are older.

        Only a missing file means "no epoch yet" (0). One that cannot be read or parsed
        fails the start (StartupError, one line): restarting at 0 would have the partitions
        that saw a later epoch's markers fence this coordinator's markers
        (TRANSACTION_COORDINATOR_FENCED), and its transactions would never complete."""
        path = self.config.data_dir / "meta" / "coordinator_epoch"
        try:
            text = path.read_text()
        except FileNotFoundError:
            epoch = 0
        except OSError as exc:
            raise StartupError(f"cannot read {path}: {exc.strerror or exc}") from None
        else:
            try:
                epoch = int(text.strip()) + 1
            except ValueError:
                epoch = 0
            if epoch <= 0:
                raise StartupError(
                    f"{path} is corrupt ({text.strip()[:40]!r} is no coordinator epoch); the partitions would"
                    " fence this coordinator's transaction markers: restore it, or write an epoch at least as"
                    " high as any used before"
                )
        atomic_write(path, str(epoch).encode())
        return epoch

    @property
    def txn_tick_ms(self) -> int:
        """How often the coordinator's timers run (it keeps Kafka's own intervals)."""
        return max(50, min(1000, self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms))

    @property
    def node_id(self) -> int:
        return self.config.node_id

    # -- topics -----------------------------------------------------------

    def _attach_topic(
        self, name: str, topic_id: uuid.UUID, n: int, configs: dict[str, str], partitions: list[Partition] | None = None
    ) -> Topic:
        topic = Topic(name, topic_id, [], dict(configs), internal=name.startswith("__"))
        if partitions is not None:
            topic.partitions.extend(partitions)
        else:
            for i in range(n):
                topic.partitions.append(self._new_partition(name, i, topic_id))
        self.topics[name] = topic
        self.topics_by_id[topic_id] = topic
        self.topology_version += 1
        return topic

    def _new_partition(self, name: str, index: int, topic_id: uuid.UUID) -> Partition:
        return Partition(name, index, topic_id, self.logs.get(name, index), self.config.max_producers_per_partition)

    def _created_partition(self, name: str, index: int, topic_id: uuid.UUID) -> Partition:
        """A partition of a topic (or of partitions) being created: its producer-state loading
        (the snapshots' listing) and its leader-epoch write run under its log's channel, so
        an OSError there is either spared (EMFILE/ENFILE, in the caller's sparing block: the
        creation is rolled back) or takes the directory offline, never raised unnoticed."""
        with self.logs.get(name, index).io("opening of the partition"):
            return self._new_partition(name, index, topic_id)

    def all_partitions(self) -> list[Partition]:
        return [p for t in self.topics.values() for p in t.partitions]

    def topic_log_config(self, name: str) -> LogConfig:
        return self.logs.effective_config(name)

    def check_topic_configs(self, configs: dict[str, str]) -> LogConfig:
        """Validate topic overrides as Kafka does (names, types, ranges); INVALID_CONFIG
        otherwise. Returns the effective config they give over the broker defaults."""
        for key in configs:
            if key not in TOPIC_CONFIGS:
                raise KafkaError(ErrorCode.invalid_config, f"Unknown topic config name: {key}")
        try:
            cfg = LogConfig.from_properties(configs, self.logs.defaults)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.invalid_config, str(exc)) from None
        return cfg

    def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        configs: dict[str, str] | None = None,
        validate_only: bool = False,
    ) -> Topic | None:
        validate_topic_name(name)
        if name in (OFFSETS_TOPIC, TXN_TOPIC):
            raise KafkaError(ErrorCode.invalid_request, f"{name} is internal to the broker's coordinators")
        if name in self.topics:
            raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        if num_partitions == -1:
            num_partitions = self.config.num_partitions
        if num_partitions <= 0:
            raise KafkaError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
        if replication_factor == -1:
            replication_factor = self.config.default_replication_factor
        if replication_factor <= 0:
            raise KafkaError(ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0.")
        if replication_factor > 1:  # one broker: what a one-broker Kafka answers
            raise KafkaError(
                ErrorCode.invalid_replication_factor,
                f"Unable to replicate the partition {replication_factor} time(s): The target replication factor "
                f"of {replication_factor} cannot be reached because only 1 broker(s) are registered.",
            )
        configs = {k: v for k, v in (configs or {}).items() if v is not None}
        self.check_topic_configs(configs)
        if validate_only:
            return None
        try:
            self.log_dir.check()  # offline: nothing changes, in memory or on disk
            meta = self.catalog.create_topic(name, num_partitions, configs)
            with self.log_dir.sparing_descriptor_errors():
                self.logs.create_partitions(name, 0, num_partitions, self.clock())
                # each partition loads its producer state and writes its new leader epoch
                partitions = [self._created_partition(name, i, uuid.UUID(str(meta.topic_id)))
                              for i in range(num_partitions)]
        except DescriptorShortageError as exc:
            # out of file descriptors (no disk error; docs/architecture.md): this topic is undone, the
            # directory stays online; an error of the undo takes it offline
            log.error("creating topic %s failed, rolling back: %s", name, exc)
            try:
                self.logs.discard(name, 0, num_partitions)
                self.catalog.delete_topic(name)
            except OSError as undo:
                log.log(log_level(undo, logging.ERROR), "rolling back topic %s failed: %s", name, undo)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot create topic {name!r}: {exc}") from None
        except OSError as exc:
            # the catalog's write or a log's creation failed: every step above runs under the log
            # directory's channel (the catalog, the logs, each partition's opening), so the directory
            # is offline (Kafka's getOrCreateLog), nothing more is written to it and the broker stops;
            # the next start creates the logs the catalog lists
            log.log(log_level(exc, logging.ERROR), "creating topic %s failed: %s", name, exc)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot create topic {name!r}: {exc}") from None
        except TopicExistsError:  # the catalog has it, broker.topics not (never expected): Kafka's answer
            raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.") from None
        log.info("created topic %s with %d partitions", name, num_partitions)
        return self._attach_topic(name, uuid.UUID(str(meta.topic_id)), num_partitions, configs, partitions)

    def delete_topic(self, name: str) -> None:
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")
        if not self.config.delete_topic_enable:
            raise KafkaError(ErrorCode.topic_deletion_disabled, "delete.topic.enable is false")
        try:
            self.log_dir.check()  # offline: the topic stays as it is, in memory and in the catalog
        except OSError as exc:
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot delete topic {name!r}: {exc}") from None
        del self.topics[name]
        self.topics_by_id.pop(topic.topic_id, None)
        self.topology_version += 1
        for p in topic.partitions:
            p.wake()
        try:
            self.catalog.delete_topic(name)
            self.logs.delete_topic(name)
        except OSError as exc:  # the log directory is offline (storage/log_dir.py): the broker stops
            log.log(log_level(exc, logging.ERROR), "deleting topic %s failed: %s", name, exc)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot delete topic {name!r}: {exc}") from None
        self.groups.on_topic_deleted(name)
        log.info("deleted topic %s", name)

    def create_partitions(self, name: str, total: int, validate_only: bool = False) -> None:
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")
        current = len(topic.partitions)
        if total <= current:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"Topic currently has {current} partitions, {total} would not be an increase.",
            )
        if validate_only:
            return
        try:
            self.log_dir.check()
            with self.log_dir.sparing_descriptor_errors():
                self.logs.create_partitions(name, current, total, self.clock())
                added = [self._created_partition(name, i, topic.topic_id) for i in range(current, total)]
            self.catalog.add_partitions(name, total)  # a failure here is the directory's (offline)
        except DescriptorShortageError as exc:  # out of descriptors: undo the new partitions, stay online
            log.error("adding partitions to %s failed, rolling back: %s", name, exc)
            try:
                self.logs.discard(name, current, total)
            except OSError as undo:
                log.log(log_level(undo, logging.ERROR), "rolling back partitions of %s failed: %s", name, undo)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot add partitions to {name!r}: {exc}") from None
        except OSError as exc:  # the log directory is offline (storage/log_dir.py): the broker stops
            log.log(log_level(exc, logging.ERROR), "adding partitions to %s failed: %s", name, exc)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot add partitions to {name!r}: {exc}") from None
        topic.partitions.extend(added)
        self.topology_version += 1

    def alter_topic_configs(self, name: str, configs: dict[str, str], validate_only: bool = False) -> None:
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")
        self.check_topic_configs({k: v for k, v in configs.items() if v is not None})
        if validate_only:
            return
        try:
            self.catalog.set_configs(name, configs)
        except OSError as exc:  # the log directory is offline (storage/log_dir.py): the broker stops
            log.log(log_level(exc, logging.ERROR), "storing the configs of topic %s failed: %s", name, exc)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot store the configs of {name!r}: {exc}") from None
        topic.configs = dict(configs)
        self.logs.reconfigure(name)

    # -- dynamic broker configs (KIP-226; broker/dynamic_config.py) ---------------

    def _dynamic_log_defaults(self, default: dict[str, str] | None = None, broker: dict[str, str] | None = None) -> LogConfig:
        if not (self.dynamic.default or self.dynamic.broker or default or broker):
            return self.config.log
        try:
            return LogConfig.from_properties(self.dynamic.overlay(self.config.raw, default, broker))
        except ConfigError as exc:  # a stored value that no longer validates: keep the static ones
            log.error("ignoring the dynamic log configs: %s", exc)
            return self.config.log

    def _apply_dynamic_scalars(self) -> None:
        merged = self.dynamic.overlay({})
        value = merged.get("producer.id.expiration.ms")
        self.config.producer_id_expiration_ms = (
            int(value) if value is not None else self._static_producer_id_expiration_ms
        )

    def check_broker_resource(self, name: str) -> bool:
        """True for this broker's id, False for the cluster default (""); INVALID_REQUEST otherwise."""
        if name == "":
            return False
        try:
            node = int(name)
        except ValueError:
            raise KafkaError(ErrorCode.invalid_request, f"Node id must be an integer, but it is: {name}") from None
        if node != self.node_id:
            raise KafkaError(ErrorCode.invalid_request, f"Unexpected broker id, expected {self.node_id}, but received {name}")
        return True

    def alter_broker_configs(self, name: str, configs: dict[str, str], validate_only: bool = False) -> None:
        """Replace the dynamic configs of one level (``""`` cluster default, or this node's id)."""
        per_broker = self.check_broker_resource(name)
        try:
            dynamic_config.validate(configs, per_broker, self.cleaner_threads)
            levels = {"broker": configs} if per_broker else {"default": configs}
            defaults = LogConfig.from_properties(self.dynamic.overlay(self.config.raw, **levels))
        except ConfigError as exc:  # Kafka answers INVALID_REQUEST here (KAFKA-13609)
            raise KafkaError(ErrorCode.invalid_request, str(exc)) from None
        if validate_only:
            return
        level = self.dynamic.level(per_broker)
        before = dict(level)
        level.clear()
        level.update(configs)
        try:
            self.log_dir.check()  # nothing is written to an offline directory
            self.dynamic.save()
        except OSError as exc:
            level.clear()
            level.update(before)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot store the broker configs: {exc}") from None
        self.logs.defaults = defaults
        for topic in self.topics:
            self.logs.reconfigure(topic)
        self._apply_dynamic_scalars()
        log.info("dynamic broker configs (%s) now %s", "broker " + name if per_broker else "cluster default", configs)
        for listener in self.config_listeners:
            listener()

    def auto_create(self, name: str) -> Topic | None:
        """Metadata/Produce auto-creation (``auto.create.topics.enable``)."""
        if not self.config.auto_create_topics_enable:
            return None
        try:
            return self.create_topic(name)
        except KafkaError as exc:
            if exc.code == ErrorCode.topic_already_exists:
                return self.topics[name]
            raise

    def partition(self, topic: str, index: int) -> Partition:
        t = self.topics.get(topic)
        if t is None or not 0 <= index < len(t.partitions):
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown partition {topic}-{index}")
        return t.partitions[index]

    # -- maintenance -------------------------------------------------------

    def retention_pass(self) -> int:
        deleted = self.logs.retention_pass(self.clock())
        if deleted:
            log.info("retention deleted %d segments", deleted)
        return deleted

    def expire_producers(self) -> int:
        now = self.clock()
        expired = sum(
            len(p.producers.expire(now, self.config.producer_id_expiration_ms)) for p in self.all_partitions()
        )
        if expired:
            log.info("expired %d idle producer ids (producer.id.expiration.ms)", expired)
        return expired

    def close(self) -> None:
        """Close cleanly: the last fsyncs, snapshots and clean-shutdown markers. If the log
        directory is offline, or goes offline on one of these fsyncs, the rest is closed
        without writing (:meth:`abandon`); it does not raise then: the caller checks
        ``log_dir.offline`` (the server reports the failure, one line). The directory's
        lock is released in every case."""
        if self.log_dir.offline:  # nothing more is written to a failed directory
            self.abandon()
            return
        self.txn.close()
        steps = (("the transaction log", self.txn_log.close), ("the offsets store", self.groups.store.close))
        for what, step in steps:
            try:
                step()
            except OSError as exc:
                log.log(log_level(exc, logging.ERROR), "closing %s failed: %s", what, exc)
            if self.log_dir.offline:
                self.abandon()
                return
        self.committer.close()
        for p in self.all_partitions():
            try:
                p.snapshot_producer_state()  # its aborted-transaction indexes' fsync is under the channel
            except OSError as exc:
                log.log(log_level(exc, logging.ERROR), "producer snapshot of %s failed: %s", p, exc)
            if self.log_dir.offline:
                self.abandon()
                return
        try:
            self.logs.close()
        except OSError as exc:
            if not self.log_dir.offline:  # not one of the channel's (no failure channel): close the rest anyway
                log.error("closing the logs failed: %s", exc)
                self.logs.abandon()
                self.dir_lock.release()
                raise
            self.abandon()
            return
        self.dir_lock.release()  # last: every file of the directory is closed

    def abandon(self) -> None:
        """Close after the log directory failed: nothing more is written or synced (no
        snapshot, producer snapshot or clean-shutdown marker), as Kafka's broker halts, so
        the next start recovers every log as after a crash and reads back what the files
        hold."""
        self.txn.close()
        self.committer.abandon()
        self.txn_log.abandon()
        self.groups.store.abandon()
        self.logs.abandon()
        self.dir_lock.release()
