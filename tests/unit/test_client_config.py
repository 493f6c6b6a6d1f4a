"""Client configuration validation and typed errors (no broker)."""

from __future__ import annotations

import pytest

from oncelog.client.config import ConfigError, parse_config
from oncelog.client import errors


def test_defaults_are_kafkas() -> None:
    """Every key issue 11 lists, at Kafka's default (producer keys read in a producer config,
    consumer keys in a consumer config; client.id has no fixed Java default, see docs/client.md)."""
    cfg = parse_config({"bootstrap.servers": "127.0.0.1:9092"}, "producer")
    assert cfg.bootstrap == [("127.0.0.1", 9092)]
    producer_defaults = {
        "acks": -1,                                   # "all"
        "linger.ms": 5,                               # Kafka 4.0 (KIP-1030)
        "batch.size": 16384,
        "compression.type": "none",
        "enable.idempotence": True,
        "max.in.flight.requests.per.connection": 5,
        "delivery.timeout.ms": 120000,
        "request.timeout.ms": 30000,
        "retries": 2**31 - 1,
        "transactional.id": None,
        "transaction.timeout.ms": 60000,
    }
    assert {k: cfg[k] for k in producer_defaults} == producer_defaults
    assert isinstance(cfg["client.id"], str) and cfg["client.id"]
    c = parse_config({"bootstrap.servers": "h:1"}, "consumer")
    consumer_defaults = {
        "group.id": None,
        "group.instance.id": None,
        "session.timeout.ms": 45000,
        "heartbeat.interval.ms": 3000,
        "max.poll.interval.ms": 300000,
        "auto.offset.reset": "latest",
        "enable.auto.commit": True,
        "isolation.level": "read_uncommitted",
        "partition.assignment.strategy": ["range", "cooperative-sticky"],
        "request.timeout.ms": 30000,
    }
    assert {k: c[k] for k in consumer_defaults} == consumer_defaults
    # 1 (bootstrap.servers) + 1 (client.id) + 11 producer + 9 consumer = the 22 keys of issue 11
    assert len(set(producer_defaults) | set(consumer_defaults)) + 2 == 22


def test_values_are_normalised() -> None:
    cfg = parse_config({"bootstrap.servers": "a:1,b:2", "acks": "all", "linger.ms": "10",
                        "enable.idempotence": "true", "compression.type": "ZSTD"}, "producer")
    assert (cfg["acks"], cfg["linger.ms"], cfg["compression.type"]) == (-1, 10, "zstd")
    assert cfg.bootstrap == [("a", 1), ("b", 2)]
    c = parse_config({"bootstrap.servers": "h:1", "auto.offset.reset": "smallest",
                      "partition.assignment.strategy": "roundrobin, range"}, "consumer")
    assert c["auto.offset.reset"] == "earliest"
    assert c["partition.assignment.strategy"] == ["roundrobin", "range"]


@pytest.mark.parametrize("conf, message", [
    ({"bootstrap.servers": "h:1", "linger.mss": 5}, "unknown configuration property 'linger.mss' (did you mean linger.ms?)"),
    ({"bootstrap.servers": "h:1", "acks": 2}, "acks: invalid value 2 (expected all, -1, 0 or 1)"),
    ({"bootstrap.servers": "h:1", "linger.ms": -1}, "linger.ms: -1 is out of range"),
    ({"bootstrap.servers": "h:1", "linger.ms": "soon"}, "linger.ms: invalid value 'soon'"),
    ({"bootstrap.servers": "h:1", "compression.type": "brotli"}, "compression.type: invalid value 'brotli' (expected none or gzip"),
    ({"bootstrap.servers": "h:1", "enable.idempotence": "yes"}, "enable.idempotence: invalid value 'yes' (expected true or false)"),
    ({"linger.ms": 1}, "bootstrap.servers is required"),
    ({"bootstrap.servers": "nohostport"}, "bootstrap.servers: 'nohostport' is not host:port"),
    ({"bootstrap.servers": "h:1", "enable.idempotence": True, "acks": 1}, "enable.idempotence=true requires acks=all"),
    ({"bootstrap.servers": "h:1", "transactional.id": "t", "enable.idempotence": False}, "transactional.id requires"),
    ({"bootstrap.servers": "h:1", "isolation.level": "read_committed"}, None),  # consumer key in a producer: ignored
])
def test_invalid_producer_config(conf: dict, message: str | None) -> None:
    if message is None:
        parse_config(conf, "producer")
        return
    with pytest.raises(ConfigError) as exc:
        parse_config(conf, "producer")
    assert message in str(exc.value)


def test_consumer_keys_validated_even_without_a_consumer() -> None:
    with pytest.raises(ConfigError, match="isolation.level: invalid value 'read_dirty'"):
        parse_config({"bootstrap.servers": "h:1", "isolation.level": "read_dirty"}, "producer")
    with pytest.raises(ConfigError, match="partition.assignment.strategy: invalid value"):
        parse_config({"bootstrap.servers": "h:1", "partition.assignment.strategy": "sticky-ish"}, "consumer")


def test_conflicting_defaults_turn_idempotence_off_as_in_kafka() -> None:
    cfg = parse_config({"bootstrap.servers": "h:1", "acks": 1}, "producer")
    assert cfg["enable.idempotence"] is False


def test_errors_carry_name_code_and_retriable() -> None:
    e = errors.error_for(6, "moved")
    assert isinstance(e, errors.NotLeaderOrFollowerError) and isinstance(e, errors.KafkaError)
    assert (e.code, e.name, e.retriable) == (6, "NOT_LEADER_OR_FOLLOWER", True)
    assert str(e) == "NOT_LEADER_OR_FOLLOWER: moved"
    o = errors.error_for(45)
    assert type(o).__name__ == "OutOfOrderSequenceNumberError" and not o.retriable
    assert errors.error_for(10).name == "MESSAGE_TOO_LARGE"
    assert errors.error_for(9999).name == "UNKNOWN_ERROR_9999"
    assert issubclass(errors.KafkaConnectionError, errors.NetworkExceptionError)
    assert errors.KafkaConnectionError().retriable


def test_secrets_are_not_in_reprs() -> None:
    cfg = parse_config({"bootstrap.servers": "127.0.0.1:9092", "security.protocol": "SASL_PLAINTEXT",
                        "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "s3cret-sasl",
                        "ssl.key.password": "s3cret-key"}, "producer")
    for text in (repr(cfg), repr(cfg.security), str(cfg.security)):
        assert "s3cret" not in text, text
    assert "alice" in repr(cfg) and "sasl.password" in repr(cfg)  # the keys are still shown
    assert cfg["sasl.password"] == "s3cret-sasl" and cfg.security.sasl_password == "s3cret-sasl"


_BAD_CONSUMER_CONFIGS = [
    ({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "sesion.timeout.ms": 1000},
     "unknown configuration property 'sesion.timeout.ms' (did you mean session.timeout.ms?)"),
    ({"bootstrap.servers": "127.0.0.1:1", "isolation.level": "read_dirty"}, "isolation.level: invalid value 'read_dirty'"),
    ({"bootstrap.servers": "127.0.0.1:1", "partition.assignment.strategy": "sticky-ish"},
     "partition.assignment.strategy: invalid value"),
    ({"bootstrap.servers": "127.0.0.1:1", "session.timeout.ms": -5}, "session.timeout.ms: -5 is out of range"),
    ({"group.id": "g"}, "bootstrap.servers is required"),
]
_BAD_ADMIN_CONFIGS = [
    ({"bootstrap.servers": "127.0.0.1:1", "request.timeout.msec": 1000}, "unknown configuration property 'request.timeout.msec'"),
    ({"bootstrap.servers": "127.0.0.1:1", "request.timeout.ms": "soon"}, "request.timeout.ms: invalid value 'soon'"),
    ({"bootstrap.servers": "nohostport"}, "bootstrap.servers: 'nohostport' is not host:port"),
]


@pytest.mark.parametrize("conf, message", _BAD_CONSUMER_CONFIGS)
@pytest.mark.parametrize("flavour", ["blocking", "asyncio"])
def test_consumer_construction_refuses_a_bad_config(flavour: str, conf: dict, message: str) -> None:
    """The ConfigError comes from the constructor itself (issue 11: "at construction, not later");
    nothing is connected (port 1 is never listened on)."""
    import asyncio

    from oncelog.client import Consumer
    from oncelog.client.aio import Consumer as AioConsumer

    if flavour == "blocking":
        with pytest.raises(ConfigError) as exc:
            Consumer(conf)
    else:
        async def build() -> None:
            AioConsumer(conf)
        with pytest.raises(ConfigError) as exc:
            asyncio.run(build())
    assert message in str(exc.value)


@pytest.mark.parametrize("conf, message", _BAD_ADMIN_CONFIGS)
@pytest.mark.parametrize("flavour", ["blocking", "asyncio"])
def test_admin_construction_refuses_a_bad_config(flavour: str, conf: dict, message: str) -> None:
    import asyncio

    from oncelog.client import Admin
    from oncelog.client.aio import Admin as AioAdmin

    if flavour == "blocking":
        with pytest.raises(ConfigError) as exc:
            Admin(conf)
    else:
        async def build() -> None:
            AioAdmin(conf)
        with pytest.raises(ConfigError) as exc:
            asyncio.run(build())
    assert message in str(exc.value)
