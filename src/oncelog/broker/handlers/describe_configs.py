"""DescribeConfigs (key 32).

Behavior: TOPIC resources (type 2) list the topic configs this broker
implements with their effective values: a topic override has source
DYNAMIC_TOPIC_CONFIG (1), a value from the broker's config file
STATIC_BROKER_CONFIG (4), otherwise DEFAULT_CONFIG (5). BROKER resources
(type 4, name = node id or empty) list the broker configs, all read-only.
``configuration_keys`` filters by name. Unknown topics get
UNKNOWN_TOPIC_OR_PARTITION; other resource types INVALID_REQUEST.

Version notes: v1-v4 handled. v1+ synonyms; v3+ config type and
documentation; v4+ flexible.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.config import _BROKER_NAME
from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode

API_KEY = 32
MIN_VERSION = 1
MAX_VERSION = 4

TOPIC = 2
BROKER = 4
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# Kafka ConfigType: 3 INT, 5 LONG, 2 STRING
_TYPES = {
    "segment.bytes": 3,
    "segment.ms": 5,
    "retention.ms": 5,
    "retention.bytes": 5,
    "max.message.bytes": 3,
    "message.timestamp.type": 2,
    "index.interval.bytes": 3,
}


def topic_config_entries(broker: Any, topic: str | None, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Effective topic configs with their source, Kafka-style."""
    if topic is not None:
        overrides = broker.topics[topic].configs
        effective = broker.topic_log_config(topic).to_topic_configs()
    else:
        from oncelog.storage.config import LogConfig

        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        effective = LogConfig.from_properties(overrides, broker.config.log).to_topic_configs()
    raw = broker.config.raw
    entries = []
    for name, value in effective.items():
        if name in overrides:
            source = DYNAMIC_TOPIC_CONFIG
        elif _BROKER_NAME.get(name) in raw:
            source = STATIC_BROKER_CONFIG
        else:
            source = DEFAULT_CONFIG
        entries.append({"name": name, "value": value, "read_only": False, "config_source": source})
    return entries


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
            if res.resource_name not in ("", str(broker.node_id)):
                results.append(
                    _result(BROKER, res.resource_name, ErrorCode.invalid_request, "not this broker's id", [])
                )
                continue
            raw = broker.config.raw
            entries = [
                {
                    "name": k,
                    "value": v,
                    "read_only": True,
                    "config_source": STATIC_BROKER_CONFIG if k in raw else DEFAULT_CONFIG,
                }
                for k, v in broker.config.broker_configs().items()
            ]
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
                "config_type": _TYPES.get(e["name"], 0),
                "documentation": None,
            }
            for e in entries
            if keys is None or e["name"] in keys
        ]
        results.append(_result(res.resource_type, res.resource_name, 0, None, configs))
    return {"throttle_time": 0, "results": results}
