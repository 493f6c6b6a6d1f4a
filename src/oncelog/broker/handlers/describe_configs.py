"""DescribeConfigs (key 32).

Behavior: TOPIC resources (type 2) list the topic configs this broker
implements with their effective values: a topic override has source
DYNAMIC_TOPIC_CONFIG (1), a value from the broker's config file
STATIC_BROKER_CONFIG (4), otherwise DEFAULT_CONFIG (5). BROKER resources
(type 4): the node id lists this broker's configs with their source
(DYNAMIC_BROKER_CONFIG 2, DYNAMIC_DEFAULT_BROKER_CONFIG 3, STATIC_BROKER_CONFIG,
DEFAULT_CONFIG); the dynamic ones (:mod:`oncelog.broker.dynamic_config`) are
not read-only. The empty name lists only the cluster-wide defaults set
dynamically, as Kafka does; another id gets INVALID_REQUEST.
Every Kafka 4.x topic config is listed for a topic (plus the deprecated
``message.format.version`` when set), including those with no effect on one
node (see docs/configuration.md).
``configuration_keys`` filters by name. Unknown topics get
UNKNOWN_TOPIC_OR_PARTITION; other resource types INVALID_REQUEST.

Version notes: v1-v4 handled. v1+ synonyms; v3+ config type and
documentation; v4+ flexible.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker import dynamic_config
from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.storage.config import TOPIC_CONFIGS, LogConfig

API_KEY = 32
MIN_VERSION = 1
MAX_VERSION = 4

TOPIC = 2
BROKER = 4
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# Kafka's DescribeConfigs ConfigType
_CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6, "LIST": 7, "CLASS": 8, "PASSWORD": 9}


def config_type(name: str) -> int:
    key = TOPIC_CONFIGS.get(dynamic_config.LOG_CONFIGS.get(name, name))
    return _CONFIG_TYPES.get(key.type, 0) if key is not None else 0


def _broker_source(broker: Any, names: list[str]) -> int:
    """Where a broker-level value comes from (the first of ``names``, a config and its synonyms, that is set)."""
    for name in names:
        if name in broker.dynamic.broker:
            return DYNAMIC_BROKER_CONFIG
        if name in broker.dynamic.default:
            return DYNAMIC_DEFAULT_BROKER_CONFIG
    if any(n in broker.config.raw for n in names):
        return STATIC_BROKER_CONFIG
    return DEFAULT_CONFIG


def topic_config_entries(broker: Any, topic: str | None, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Effective topic configs with their source, Kafka-style."""
    if topic is not None:
        overrides = broker.topics[topic].configs
        effective = broker.topic_log_config(topic).to_topic_configs()
    else:
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        effective = LogConfig.from_properties(overrides, broker.logs.defaults).to_topic_configs()
    entries = []
    for name, value in effective.items():
        if name in overrides:
            source = DYNAMIC_TOPIC_CONFIG
        else:
            source = _broker_source(broker, [s for s, _m in TOPIC_CONFIGS[name].synonyms])
        entries.append({"name": name, "value": value, "read_only": False, "config_source": source})
    return entries


def broker_config_entries(broker: Any, per_broker: bool) -> list[dict[str, Any]]:
    """A BROKER resource: this broker's configs (``per_broker``), or only the cluster defaults set dynamically."""
    dyn = broker.dynamic
    if not per_broker:
        return [
            {"name": k, "value": v, "read_only": False, "config_source": DYNAMIC_DEFAULT_BROKER_CONFIG}
            for k, v in sorted(dyn.default.items())
        ]
    values = broker.config.broker_configs()
    # the other log defaults, under their broker names (dynamic values are laid over below)
    for topic_name, value in broker.logs.defaults.to_topic_configs().items():
        name = TOPIC_CONFIGS[topic_name].synonyms[0][0] if TOPIC_CONFIGS[topic_name].synonyms else None
        if name is not None:
            values.setdefault(name, value)  # oncelog's own meaning wins (log.flush.interval.messages)
    values.update(dyn.default)
    values.update(dyn.broker)
    if "producer.id.expiration.ms" in values:
        values["producer.id.expiration.ms"] = str(broker.config.producer_id_expiration_ms)
    known = dynamic_config.READ_ONLY | set(broker.config.broker_configs())
    return [
        {
            "name": k,
            "value": v,
            "read_only": k not in dynamic_config.DYNAMIC and k in known,
            "config_source": _broker_source(broker, [k]),
        }
        for k, v in values.items()
    ]


def _result(rtype: int, rname: str, code: int, message: str | None, configs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "error_code": code,
        "error_message": message,
        "resource_type": rtype,
        "resource_name": rname,
        "configs": configs,
    }


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    results = []
    for res in request.resources:
        keys = set(res.configuration_keys) if res.configuration_keys is not None else None
        if res.resource_type == TOPIC:
            if res.resource_name not in broker.topics:
                results.append(
                    _result(TOPIC, res.resource_name, ErrorCode.unknown_topic_or_partition, "unknown topic", [])
                )
                continue
            entries = topic_config_entries(broker, res.resource_name)
        elif res.resource_type == BROKER:
            try:
                per_broker = broker.check_broker_resource(res.resource_name)
            except KafkaError as exc:
                results.append(_result(BROKER, res.resource_name, exc.code, str(exc), []))
                continue
            entries = broker_config_entries(broker, per_broker)
        else:
            results.append(
                _result(res.resource_type, res.resource_name, ErrorCode.invalid_request, "unsupported resource type", [])
            )
            continue
        configs = [
            {
                **e,
                "is_sensitive": False,
                "is_default": e["config_source"] == DEFAULT_CONFIG,
                "synonyms": [],
                "config_type": config_type(e["name"]),
                "documentation": None,
            }
            for e in entries
            if keys is None or e["name"] in keys
        ]
        results.append(_result(res.resource_type, res.resource_name, 0, None, configs))
    return {"throttle_time": 0, "results": results}
