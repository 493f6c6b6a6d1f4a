"""Per-log configuration, using Kafka's broker- and topic-level property names."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"

_HOUR_MS = 3_600_000
_WEEK_MS = 7 * 24 * _HOUR_MS

# topic-level name -> LogConfig field
TOPIC_KEYS: dict[str, str] = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "max.message.bytes": "max_message_bytes",
    "message.timestamp.type": "message_timestamp_type",
}

# broker-level name -> (LogConfig field, multiplier to ms/bytes); later entries in
# a group lose to earlier ones (log.roll.ms beats log.roll.hours, as in Kafka)
_BROKER_KEYS: list[list[tuple[str, str, int]]] = [
    [("log.segment.bytes", "segment_bytes", 1)],
    [("log.roll.ms", "segment_ms", 1), ("log.roll.hours", "segment_ms", _HOUR_MS)],
    [
        ("log.retention.ms", "retention_ms", 1),
        ("log.retention.minutes", "retention_ms", 60_000),
        ("log.retention.hours", "retention_ms", _HOUR_MS),
    ],
    [("log.retention.bytes", "retention_bytes", 1)],
    [("log.index.interval.bytes", "index_interval_bytes", 1)],
    [("message.max.bytes", "max_message_bytes", 1)],
    [("log.message.timestamp.type", "message_timestamp_type", 1)],
]


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

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == LOG_APPEND_TIME

    def validate(self) -> None:
        """Raise ValueError if a value is outside Kafka's allowed range."""
        checks = [
            (self.segment_bytes >= 14 and self.segment_bytes <= 0x7FFFFFFF, "segment.bytes", self.segment_bytes),
            (self.segment_ms >= 1, "segment.ms", self.segment_ms),
            (self.retention_ms >= -1, "retention.ms", self.retention_ms),
            (self.index_interval_bytes >= 0, "index.interval.bytes", self.index_interval_bytes),
            (self.max_message_bytes >= 0, "max.message.bytes", self.max_message_bytes),
            (
                self.message_timestamp_type in (CREATE_TIME, LOG_APPEND_TIME),
                "message.timestamp.type",
                self.message_timestamp_type,
            ),
        ]
        for ok, key, value in checks:
            if not ok:
                raise ValueError(f"invalid value {value!r} for {key}")

    @classmethod
    def from_properties(cls, props: Mapping[str, str | None], base: LogConfig | None = None) -> LogConfig:
        """Overlay ``props`` (broker names like log.retention.hours or topic names
        like retention.ms; unknown keys ignored) on ``base`` or the defaults."""
        cfg = dataclasses.replace(base) if base is not None else cls()
        for group in _BROKER_KEYS:
            for key, attr, mult in group:
                value = props.get(key)
                if value is not None:
                    _set(cfg, attr, key, value, mult)
                    break
        for key, attr in TOPIC_KEYS.items():
            value = props.get(key)
            if value is not None:
                _set(cfg, attr, key, value, 1)
        cfg.validate()
        return cfg

    def to_topic_configs(self) -> dict[str, str]:
        """Topic-level names -> string values."""
        return {key: str(getattr(self, attr)) for key, attr in TOPIC_KEYS.items()}


def _set(cfg: LogConfig, attr: str, key: str, value: str, mult: int) -> None:
    if attr == "message_timestamp_type":
        setattr(cfg, attr, value.strip())
        return
    try:
        n = int(value.strip())
    except (ValueError, AttributeError):
        raise ValueError(f"invalid value {value!r} for {key}: not an integer") from None
    setattr(cfg, attr, n * mult if n >= 0 else n)


def internal_log_config() -> LogConfig:
    """Config of the broker's internal logs (offsets, transaction state): Kafka's
    default segment size for internal topics; time never rolls or deletes them."""
    return LogConfig(segment_bytes=100 * 1024 * 1024, segment_ms=2**62, retention_ms=-1, retention_bytes=-1)
