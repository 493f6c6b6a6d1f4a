"""Per-log configuration, using Kafka's broker- and topic-level property names.

:data:`TOPIC_CONFIGS` is Kafka 4.x's topic config definition as data: every
topic config with its type, default, validator and the broker configs it falls
back to (Kafka's ``ServerTopicConfigSynonyms``). :class:`LogConfig` holds the
parsed values: the ones the log uses as fields, the rest (accepted, stored and
described, but with no effect on one node) in ``extras``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"

_HOUR_MS = 3_600_000
_WEEK_MS = 7 * 24 * _HOUR_MS
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1

# Kafka ConfigDef types
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, CLASS, PASSWORD = (
    "BOOLEAN", "STRING", "INT", "SHORT", "LONG", "DOUBLE", "LIST", "CLASS", "PASSWORD",
)  # fmt: skip

# the compression.type values and the batch codec id each means (None: keep the producer's)
COMPRESSION_CODECS: dict[str, int | None] = {
    "uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4, "producer": None,
}  # fmt: skip


class ConfigError(ValueError):
    """A config value Kafka would refuse (Kafka's ConfigException); the message is Kafka's shape."""


def _invalid(name: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"Invalid value {value} for configuration {name}: {why}")


# --- validators (Kafka's ConfigDef.Range / ValidString / ValidList) -------------------

Validator = Callable[[str, object], None]


def at_least(low: float) -> Validator:
    def check(name: str, value: object) -> None:
        if value < low:  # type: ignore[operator]
            raise _invalid(name, value, f"Value must be at least {low}")

    return check


def between(low: float, high: float) -> Validator:
    def check(name: str, value: object) -> None:
        if value < low:  # type: ignore[operator]
            raise _invalid(name, value, f"Value must be at least {low}")
        if value > high:  # type: ignore[operator]
            raise _invalid(name, value, f"Value must be no more than {high}")

    return check


def one_of(*allowed: str) -> Validator:
    def check(name: str, value: object) -> None:
        items = value if isinstance(value, list) else [value]
        for item in items:
            if item not in allowed:
                raise _invalid(name, item, "String must be one of: " + ", ".join(allowed))

    return check


def _gzip_level(name: str, value: object) -> None:
    if value > 9 or (value < 1 and value != -1):  # type: ignore[operator]
        raise _invalid(name, value, "Value must be between 1 and 9 or equal to -1")


_THROTTLED = re.compile(r"^\d+:\d+$")


def _throttled_replicas(name: str, value: object) -> None:
    items = value if isinstance(value, list) else []
    if items == ["*"] or all(_THROTTLED.match(i) for i in items):
        return
    raise _invalid(name, ",".join(items), "must be the literal '*' or a list of replicas in the following format: [partitionId]:[brokerId],...")


_MESSAGE_FORMAT = re.compile(r"^\d+\.\d+(\.\d+)*(-IV\d+)?$")


def _message_format_version(name: str, value: object) -> None:
    if not _MESSAGE_FORMAT.match(str(value)):
        raise _invalid(name, value, f"Version `{value}` is not a valid version")


# --- the definition ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    type: str
    default: object
    validator: Validator | None = None
    # broker configs it falls back to, highest priority first: (name, multiplier to ms)
    synonyms: tuple[tuple[str, int], ...] = ()
    field: str | None = None  # LogConfig attribute when the log uses it
    listed: bool = True  # DescribeConfigs lists it even when not set
    effect: bool = True  # False: accepted and stored, no effect on a single node


def _log(name: str) -> tuple[tuple[str, int], ...]:
    return (("log." + name, 1),)


_KEYS = [
    ConfigKey("cleanup.policy", LIST, ["delete"], one_of("compact", "delete"), _log("cleanup.policy"), "cleanup_policy"),
    ConfigKey("compression.type", STRING, "producer", one_of(*COMPRESSION_CODECS), (("compression.type", 1),), "compression_type"),
    ConfigKey("compression.gzip.level", INT, -1, _gzip_level, (("compression.gzip.level", 1),), "compression_gzip_level"),
    ConfigKey("compression.lz4.level", INT, 9, between(1, 17), (("compression.lz4.level", 1),), "compression_lz4_level"),
    ConfigKey("compression.zstd.level", INT, 3, between(-131072, 22), (("compression.zstd.level", 1),), "compression_zstd_level"),
    ConfigKey("delete.retention.ms", LONG, 86_400_000, at_least(0), (("log.cleaner.delete.retention.ms", 1),)),
    ConfigKey("file.delete.delay.ms", LONG, 60_000, at_least(0), (("log.segment.delete.delay.ms", 1),), effect=False),
    ConfigKey("flush.messages", LONG, _LONG_MAX, at_least(1), (("log.flush.interval.messages", 1),), effect=False),
    ConfigKey("flush.ms", LONG, _LONG_MAX, at_least(0), (("log.flush.interval.ms", 1), ("log.flush.scheduler.interval.ms", 1)), effect=False),
    ConfigKey("follower.replication.throttled.replicas", LIST, [], _throttled_replicas, effect=False),
    ConfigKey("index.interval.bytes", INT, 4096, at_least(0), _log("index.interval.bytes"), "index_interval_bytes"),
    ConfigKey("leader.replication.throttled.replicas", LIST, [], _throttled_replicas, effect=False),
    ConfigKey("local.retention.bytes", LONG, -2, at_least(-2), _log("local.retention.bytes"), effect=False),
    ConfigKey("local.retention.ms", LONG, -2, at_least(-2), _log("local.retention.ms"), effect=False),
    ConfigKey("max.compaction.lag.ms", LONG, _LONG_MAX, at_least(1), (("log.cleaner.max.compaction.lag.ms", 1),)),
    ConfigKey("max.message.bytes", INT, 1_048_588, at_least(0), (("message.max.bytes", 1),), "max_message_bytes"),
    ConfigKey("message.timestamp.after.max.ms", LONG, _LONG_MAX, at_least(0), _log("message.timestamp.after.max.ms")),
    ConfigKey("message.timestamp.before.max.ms", LONG, _LONG_MAX, at_least(0), _log("message.timestamp.before.max.ms")),
    ConfigKey("message.timestamp.type", STRING, CREATE_TIME, one_of(CREATE_TIME, LOG_APPEND_TIME), _log("message.timestamp.type"), "message_timestamp_type"),
    ConfigKey("min.cleanable.dirty.ratio", DOUBLE, 0.5, between(0, 1), (("log.cleaner.min.cleanable.ratio", 1),)),
    ConfigKey("min.compaction.lag.ms", LONG, 0, at_least(0), (("log.cleaner.min.compaction.lag.ms", 1),)),
    ConfigKey("min.insync.replicas", INT, 1, at_least(1), (("min.insync.replicas", 1),)),
    ConfigKey("preallocate", BOOLEAN, False, None, _log("preallocate"), effect=False),
    ConfigKey("remote.log.copy.disable", BOOLEAN, False, None, effect=False),
    ConfigKey("remote.log.delete.on.disable", BOOLEAN, False, None, effect=False),
    ConfigKey("remote.storage.enable", BOOLEAN, False, None, effect=False),
    ConfigKey("retention.bytes", LONG, -1, None, _log("retention.bytes"), "retention_bytes"),
    ConfigKey("retention.ms", LONG, _WEEK_MS, at_least(-1),
              (("log.retention.ms", 1), ("log.retention.minutes", 60_000), ("log.retention.hours", _HOUR_MS)), "retention_ms"),
    ConfigKey("segment.bytes", INT, 1_073_741_824, at_least(14), _log("segment.bytes"), "segment_bytes"),
    ConfigKey("segment.index.bytes", INT, 10 * 1024 * 1024, at_least(4), (("log.index.size.max.bytes", 1),), effect=False),
    ConfigKey("segment.jitter.ms", LONG, 0, at_least(0), (("log.roll.jitter.ms", 1), ("log.roll.jitter.hours", _HOUR_MS)), effect=False),
    ConfigKey("segment.ms", LONG, _WEEK_MS, at_least(1), (("log.roll.ms", 1), ("log.roll.hours", _HOUR_MS)), "segment_ms"),
    ConfigKey("unclean.leader.election.enable", BOOLEAN, False, None, (("unclean.leader.election.enable", 1),), effect=False),
    # deprecated in Kafka 3.0 and removed in 4.0; clients that talk to 3.x brokers still
    # send it, and 3.x accepts and ignores it: so do we (listed only when set)
    ConfigKey("message.format.version", STRING, "3.0-IV1", _message_format_version, _log("message.format.version"),
              listed=False, effect=False),
]  # fmt: skip
TOPIC_CONFIGS: dict[str, ConfigKey] = {k.name: k for k in _KEYS}

# topic-level name -> LogConfig field (the configs the log itself uses)
TOPIC_KEYS: dict[str, str] = {k.name: k.field for k in _KEYS if k.field is not None}

# topic config -> the broker config with the highest priority (Kafka's TOPIC_CONFIG_SYNONYMS)
BROKER_SYNONYM: dict[str, str] = {k.name: k.synonyms[0][0] for k in _KEYS if k.synonyms}

# every broker-level name that sets a topic default (log.retention.hours, compression.type, ...)
BROKER_LOG_KEYS: frozenset[str] = frozenset(name for k in _KEYS for name, _mult in k.synonyms)


# --- parsing (Kafka's ConfigDef.parseType) ---------------------------------------------

_INTEGER = re.compile(r"^[+-]?\d+$")


def parse_value(key: ConfigKey, raw: str) -> object:
    """Parse and validate one string value; raises :class:`ConfigError`."""
    value = raw.strip() if isinstance(raw, str) else raw
    name = key.name
    t = key.type
    if t in (INT, LONG, SHORT):
        limit = {INT: 2**31, LONG: 2**63, SHORT: 2**15}[t]
        if not isinstance(value, str) or not _INTEGER.match(value) or not -limit <= int(value) < limit:
            raise _invalid(name, value, f"Not a number of type {t}")
        parsed: object = int(value)
    elif t == DOUBLE:
        try:
            parsed = float(value)
        except ValueError:
            raise _invalid(name, value, "Not a number of type DOUBLE") from None
    elif t == BOOLEAN:
        if value.lower() not in ("true", "false"):
            raise _invalid(name, value, "Expected value to be either true or false")
        parsed = value.lower() == "true"
    elif t == LIST:
        parsed = [] if value == "" else re.split(r"\s*,\s*", value)
    else:
        parsed = value
    if key.validator is not None:
        key.validator(name, parsed)
    return parsed


def format_value(key: ConfigKey, value: object) -> str:
    """A parsed value as Kafka shows it (lists comma-joined, booleans lower case)."""
    if key.type == LIST:
        return ",".join(value)  # type: ignore[arg-type]
    if key.type == BOOLEAN:
        return "true" if value else "false"
    return str(value)


def check_combination(values: Mapping[str, object]) -> None:
    """Kafka's cross-config checks (LogConfig.validateValues and the tiered-storage one)."""
    lo, hi = values.get("min.compaction.lag.ms", 0), values.get("max.compaction.lag.ms", _LONG_MAX)
    if lo > hi:  # type: ignore[operator]
        raise ConfigError(f"conflict topic config setting min.compaction.lag.ms ({lo}) > max.compaction.lag.ms ({hi})")
    if values.get("remote.storage.enable"):
        raise ConfigError("Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote log storage.")


@dataclass(slots=True)
class LogConfig:
    """Settings of one partition log (defaults are Kafka's)."""

    segment_bytes: int = 1_073_741_824
    segment_ms: int = _WEEK_MS
    retention_ms: int = _WEEK_MS  # -1 = keep forever
    retention_bytes: int = -1  # -1 = no size limit
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1_048_588
    message_timestamp_type: str = CREATE_TIME
    cleanup_policy: list[str] = field(default_factory=lambda: ["delete"])
    # "producer" keeps the producer's codec; any other value recompresses (Kafka's LogValidator)
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    # the other topic configs, parsed, where they differ from Kafka's default
    extras: dict[str, object] = field(default_factory=dict)

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == LOG_APPEND_TIME

    @property
    def compact(self) -> bool:
        """The log cleaner compacts this log (``compact`` in cleanup.policy)."""
        return "compact" in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """How old the active segment may get before a roll: segment.ms, or for a
        compacted log max.compaction.lag.ms if smaller (Kafka's maxSegmentMs)."""
        if self.compact:
            lag = self.extras.get("max.compaction.lag.ms")
            if lag is not None and 0 < lag < self.segment_ms:  # type: ignore[operator]
                return lag  # type: ignore[return-value]
        return self.segment_ms

    @property
    def delete_enabled(self) -> bool:
        """Retention deletes segments only with ``delete`` in cleanup.policy (as in Kafka)."""
        return "delete" in self.cleanup_policy

    @property
    def target_codec(self) -> int | None:
        """The batch codec the topic stores, or None to keep the producer's."""
        return COMPRESSION_CODECS.get(self.compression_type)

    def get(self, name: str) -> object:
        key = TOPIC_CONFIGS[name]
        if key.field is not None:
            return getattr(self, key.field)
        return self.extras.get(name, key.default)

    def _put(self, key: ConfigKey, value: object) -> None:
        if key.field is not None:
            setattr(self, key.field, value)
        elif value == key.default:
            self.extras.pop(key.name, None)
        else:
            self.extras[key.name] = value

    def validate(self) -> None:
        """Raise ConfigError if a value is outside Kafka's allowed range."""
        for key in _KEYS:
            if key.validator is not None:
                value = self.get(key.name)
                if value != key.default:
                    key.validator(key.name, value)
        check_combination({k: self.get(k) for k in ("min.compaction.lag.ms", "max.compaction.lag.ms", "remote.storage.enable")})

    @classmethod
    def from_properties(cls, props: Mapping[str, str | None], base: LogConfig | None = None) -> LogConfig:
        """Overlay ``props`` (broker names like log.retention.hours or topic names
        like retention.ms; unknown keys ignored) on ``base`` or the defaults."""
        cfg = dataclasses.replace(base) if base is not None else cls()
        cfg.cleanup_policy = list(cfg.cleanup_policy)
        cfg.extras = dict(cfg.extras)
        for key in _KEYS:
            raw = props.get(key.name)
            mult = 1
            if raw is None:
                for synonym, m in key.synonyms:
                    if props.get(synonym) is not None:
                        raw, mult = props[synonym], m
                        break
            if raw is None:
                continue
            if mult != 1:  # log.retention.hours and friends: validate as the broker config (an INT)
                value = parse_value(dataclasses.replace(key, type=INT, validator=None), raw)
                value = value * mult if value >= 0 else value  # type: ignore[operator]
                if key.validator is not None:
                    key.validator(key.name, value)
            else:
                value = parse_value(key, raw)
            cfg._put(key, value)
        cfg.validate()
        return cfg

    def to_topic_configs(self, all_keys: bool = False) -> dict[str, str]:
        """Topic-level names -> string values (the listed ones, or every one)."""
        return {
            key.name: format_value(key, self.get(key.name))
            for key in _KEYS
            if all_keys or key.listed or key.name in self.extras
        }


def internal_log_config() -> LogConfig:
    """Config of the broker's internal logs (offsets, transaction state): Kafka's
    default segment size for internal topics; time never rolls or deletes them."""
    return LogConfig(segment_bytes=100 * 1024 * 1024, segment_ms=2**62, retention_ms=-1, retention_bytes=-1)
