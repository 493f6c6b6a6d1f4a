"""Dynamic broker configs (Kafka's KIP-226 ``DynamicBrokerConfig``), one node.

AlterConfigs and IncrementalAlterConfigs on the BROKER resource set them: the
resource name ``""`` is the cluster-wide default, ``"<node id>"`` this broker.
Per-broker values win over cluster defaults, which win over the static config
file. They are kept in ``<data-dir>/meta/broker_configs.json`` (written
atomically) and survive restarts.

Which names are dynamic follows Kafka: the broker-level name of every topic
config (``log.retention.ms``, ``log.segment.bytes``, ``message.max.bytes``,
``compression.type``, ...; not the secondary ``log.retention.hours`` and the
like), ``producer.id.expiration.ms`` and the thread pool, connection-limit,
cleaner and listener settings. A config oncelog reads only at start (or a
read-only one) gets INVALID_REQUEST "Cannot update these configs
dynamically", as Kafka answers; names Kafka does not know are kept as custom
configs, as Kafka does.

Applied at run time: the log defaults (every topic without its own override
follows them at once; that includes the cleaner's topic defaults such as
``log.cleaner.min.cleanable.ratio``), ``producer.id.expiration.ms``, and the
``log.cleaner.*`` thread, buffer and I/O settings (the server restarts the
cleaners with them, as Kafka's LogCleaner.reconfigure does). The rest are
stored and described but change nothing until a restart (there are no thread
pools or replication to tune on one asyncio node).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from oncelog.broker.config import _BOOLS, _INTS
from oncelog.storage.config import BROKER_SYNONYM, TOPIC_CONFIGS, ConfigError, parse_value
from oncelog.storage.fileutil import atomic_write

log = logging.getLogger(__name__)

FILE_NAME = "broker_configs.json"

# the broker-level names of the topic configs (Kafka's DynamicLogConfig.ReconfigurableConfigs)
LOG_CONFIGS: dict[str, str] = {broker: topic for topic, broker in BROKER_SYNONYM.items()}

# Kafka's other dynamic broker configs that mean something for a broker like this one
_INT_CONFIGS = {
    "producer.id.expiration.ms": 1,  # min value
    "num.io.threads": 1,
    "num.network.threads": 1,
    "num.replica.fetchers": 1,
    "num.recovery.threads.per.data.dir": 1,
    "background.threads": 1,
    "max.connections": 0,
    "max.connection.creation.rate": 0,
    "max.connections.per.ip": 0,
    "log.cleaner.threads": 0,
    "log.cleaner.backoff.ms": 0,
}
_OTHER_DYNAMIC = {
    "max.connections.per.ip.overrides",
    "log.cleaner.dedupe.buffer.size",
    "log.cleaner.io.buffer.size",
    "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.max.bytes.per.second",
    "metric.reporters",
    "transaction.partition.verification.enable",
    "listeners",
    "listener.security.protocol.map",
}
# may be set only for a broker, not as the cluster default (Kafka's PerBrokerConfigs)
PER_BROKER_ONLY = {"listeners", "listener.security.protocol.map"}
DYNAMIC: set[str] = set(LOG_CONFIGS) | set(_INT_CONFIGS) | _OTHER_DYNAMIC
# applied at run time; the rest of DYNAMIC is stored and described only
APPLIED: set[str] = {
    name for name, topic in LOG_CONFIGS.items() if TOPIC_CONFIGS[topic].effect
} | {"producer.id.expiration.ms"}

# broker configs oncelog knows that Kafka cannot change without a restart
READ_ONLY: set[str] = (
    (set(_INTS) | set(_BOOLS) | {
        "node.id", "broker.id", "advertised.listeners", "log.dirs", "log.dir", "process.roles",
        "log.retention.minutes", "log.retention.hours", "log.roll.hours", "log.roll.jitter.hours",
        "log.flush.scheduler.interval.ms", "log.retention.check.interval.ms",
    })
    - DYNAMIC
)  # fmt: skip


@dataclass
class DynamicBrokerConfigs:
    """The stored cluster-default and per-broker dynamic configs."""

    path: Path
    default: dict[str, str] = field(default_factory=dict)
    broker: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, meta_dir: Path) -> DynamicBrokerConfigs:
        path = meta_dir / FILE_NAME
        try:
            data = json.loads(path.read_text())
            return cls(path, dict(data.get("default", {})), dict(data.get("broker", {})))
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError, AttributeError) as exc:
            log.error("ignoring unreadable %s: %s", path, exc)
            return cls(path)

    def save(self) -> None:
        data = {"default": self.default, "broker": self.broker}
        atomic_write(self.path, json.dumps(data, indent=1, sort_keys=True).encode())

    def level(self, per_broker: bool) -> dict[str, str]:
        return self.broker if per_broker else self.default

    def overlay(self, static: dict[str, str], default: dict[str, str] | None = None,
                broker: dict[str, str] | None = None) -> dict[str, str]:
        """Static file props overlaid with the cluster defaults, then the per-broker values."""
        return {**static, **(self.default if default is None else default), **(self.broker if broker is None else broker)}


def validate(configs: dict[str, str], per_broker: bool, cleaner_threads: int | None = None) -> None:
    """Kafka's DynamicBrokerConfig.validateConfigs (and LogCleaner.validateReconfiguration
    against ``cleaner_threads``, the running cleaner's count): raises ConfigError."""
    fixed = sorted(k for k in configs if k in READ_ONLY)
    if fixed:
        raise ConfigError(f"Cannot update these configs dynamically: Set({', '.join(fixed)})")
    if not per_broker:
        only = sorted(k for k in configs if k in PER_BROKER_ONLY)
        if only:
            raise ConfigError(
                f"Cannot update these configs at default cluster level, broker id must be specified: Set({', '.join(only)})"
            )
    for name, value in configs.items():
        if name in LOG_CONFIGS:  # checked as the topic config, named as the broker one
            parse_value(dataclasses.replace(TOPIC_CONFIGS[LOG_CONFIGS[name]], name=name), value)
        elif name in _INT_CONFIGS:
            try:
                n = int(value.strip())
            except ValueError:
                raise ConfigError(f"Invalid value {value} for configuration {name}: Not a number of type INT") from None
            if n < _INT_CONFIGS[name]:
                raise ConfigError(f"Invalid value {n} for configuration {name}: Value must be at least {_INT_CONFIGS[name]}")
            if name == "log.cleaner.threads" and cleaner_threads is not None:
                _validate_cleaner_threads(n, cleaner_threads)


def _validate_cleaner_threads(n: int, current: int) -> None:
    """Kafka's LogCleaner.validateReconfiguration: at least 1, and within half to double
    of the running count."""
    if n < 1:
        raise ConfigError("Log cleaner threads should be at least 1")
    if n < current // 2:
        raise ConfigError(f"Log cleaner threads cannot be reduced to less than half the current value {current}")
    if n > current * 2:
        raise ConfigError(f"Log cleaner threads cannot be increased to more than double the current value {current}")

