"""Topic and broker configs as Kafka 4.x takes them (issue 10, items 9, 12, 13, 14).

Real clients (confluent-kafka and kafka-python admins, producers and
consumers) against a real broker; raw requests where the exact error message
or a protocol edge case is the point.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.client.connection import Connection
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.records import iter_batch_headers
from oncelog.testing import EmbeddedBroker

CREATE_TOPICS, DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE_PARTITIONS, INCREMENTAL_ALTER = 19, 32, 33, 37, 44

# a valid, non-default value for every topic config Kafka 4.x documents
EVERY_TOPIC_CONFIG = {
    "cleanup.policy": "delete",
    "compression.type": "zstd",
    "compression.gzip.level": "5",
    "compression.lz4.level": "3",
    "compression.zstd.level": "7",
    "delete.retention.ms": "1000",
    "file.delete.delay.ms": "1000",
    "flush.messages": "100",
    "flush.ms": "1000",
    "follower.replication.throttled.replicas": "0:1",
    "index.interval.bytes": "1024",
    "leader.replication.throttled.replicas": "*",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "max.compaction.lag.ms": "100000",
    "max.message.bytes": "2000000",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "86400000",
    "message.timestamp.type": "CreateTime",
    "min.cleanable.dirty.ratio": "0.25",
    "min.compaction.lag.ms": "10",
    "min.insync.replicas": "2",
    "preallocate": "true",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
    "remote.storage.enable": "false",
    "retention.bytes": "100000000",
    "retention.ms": "86400000",
    "segment.bytes": "10000000",
    "segment.index.bytes": "4096",
    "segment.jitter.ms": "5",
    "segment.ms": "3600000",
    "unclean.leader.election.enable": "true",
}


@pytest.fixture(scope="module")
def cb(tmp_path_factory: Any) -> Iterator[EmbeddedBroker]:
    d = tmp_path_factory.mktemp("configs")
    b = EmbeddedBroker(data_dir=d / "data", log_path=d / "broker.log")
    b.start()
    try:
        yield b
    finally:
        b.close()


def _admin(b: EmbeddedBroker) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": b.bootstrap})


def _create_raw(b: EmbeddedBroker, name: str, configs: dict[str, str | None], rf: int = -1,
                assignments: list[dict[str, Any]] | None = None, partitions: int = 1) -> Any:
    with Connection(b.bootstrap) as c:
        r = c.request(CREATE_TOPICS, 7, {
            "topics": [{"name": name, "num_partitions": -1 if assignments else partitions, "replication_factor": rf,
                        "assignments": assignments or [],
                        "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
            "timeout": 10000, "validate_only": False})
    return r.topics[0]


def _create(b: EmbeddedBroker, topics: list[Any], name: str) -> None:
    admin = _admin(b)
    admin.create_topics(topics)[name].result(timeout=20)


def _describe(b: EmbeddedBroker, rtype: Any, name: str) -> dict[str, Any]:
    from confluent_kafka.admin import ConfigResource

    res = ConfigResource(rtype, name)
    admin = _admin(b)
    return admin.describe_configs([res])[res].result(timeout=15)


def _incremental(b: EmbeddedBroker, rtype: Any, name: str, ops: list[tuple[str, str | None, Any]]) -> None:
    from confluent_kafka.admin import ConfigEntry, ConfigResource

    res = ConfigResource(rtype, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops])
    admin = _admin(b)
    admin.incremental_alter_configs([res])[res].result(timeout=15)


def _kafka_error_code(exc_info: Any) -> int:
    return exc_info.value.args[0].code()


# -- item 9: every topic config, Kafka's validation ---------------------------------------------


def test_every_kafka_topic_config_is_accepted_stored_and_described(cb: EmbeddedBroker) -> None:
    from confluent_kafka.admin import ConfigResource, ConfigSource, NewTopic

    topic = "every-config"
    admin = _admin(cb)
    fut = admin.create_topics([NewTopic(topic, 1, 1, config=EVERY_TOPIC_CONFIG)])[topic]
    fut.result(timeout=20)
    cfg = _describe(cb, ConfigResource.Type.TOPIC, topic)
    for name, value in EVERY_TOPIC_CONFIG.items():
        assert cfg[name].value == value, name
        assert cfg[name].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, name


def test_topic_configs_without_override_are_described_with_kafka_defaults(cb: EmbeddedBroker) -> None:
    from confluent_kafka.admin import ConfigResource, ConfigSource, NewTopic

    topic = "default-configs"
    _create(cb, [NewTopic(topic, 1, 1)], topic)
    cfg = _describe(cb, ConfigResource.Type.TOPIC, topic)
    assert set(EVERY_TOPIC_CONFIG) <= set(cfg)
    expected = {"cleanup.policy": "delete", "compression.type": "producer", "min.insync.replicas": "1",
                "unclean.leader.election.enable": "false", "min.cleanable.dirty.ratio": "0.5",
                "local.retention.ms": "-2", "segment.index.bytes": "10485760"}
    for name, value in expected.items():
        assert (cfg[name].value, cfg[name].source) == (value, ConfigSource.DEFAULT_CONFIG.value), name
    assert "message.format.version" not in cfg  # deprecated: listed only when set


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("segment.bytes", "10", "Invalid value 10 for configuration segment.bytes: Value must be at least 14"),
        ("segment.bytes", "big", "Invalid value big for configuration segment.bytes: Not a number of type INT"),
        ("segment.bytes", "3000000000", "Not a number of type INT"),
        ("retention.ms", "-2", "Value must be at least -1"),
        ("min.insync.replicas", "0", "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1"),
        ("compression.type", "brotli", "String must be one of: uncompressed, gzip, snappy, lz4, zstd, producer"),
        ("compression.gzip.level", "10", "Value must be between 1 and 9 or equal to -1"),
        ("compression.zstd.level", "23", "Value must be no more than 22"),
        ("cleanup.policy", "delete,forever", "Invalid value forever for configuration cleanup.policy: String must be one of: compact, delete"),
        ("unclean.leader.election.enable", "yes", "Expected value to be either true or false"),
        ("min.cleanable.dirty.ratio", "1.5", "Value must be no more than 1"),
        ("message.timestamp.type", "Whenever", "String must be one of: CreateTime, LogAppendTime"),
        ("leader.replication.throttled.replicas", "0-1", "[partitionId]:[brokerId]"),
        ("remote.storage.enable", "true", "Tiered Storage functionality is disabled in the broker"),
        ("no.such.config", "1", "Unknown topic config name: no.such.config"),
    ],
)
def test_bad_topic_config_gets_invalid_config_with_kafkas_message(
    cb: EmbeddedBroker, name: str, value: str, message: str
) -> None:
    t = _create_raw(cb, "bad-config", {name: value})
    assert t.error_code == ErrorCode.invalid_config, t
    assert message in t.error_message
    # nothing was created
    assert _create_raw(cb, "bad-config", {}).error_code == 0
    with Connection(cb.bootstrap) as c:
        assert c.request(20, 6, {"topics": [{"name": "bad-config", "topic_id": None}], "timeout": 10000}) is not None


def test_min_compaction_lag_above_max_is_refused(cb: EmbeddedBroker) -> None:
    t = _create_raw(cb, "lags", {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    assert t.error_code == ErrorCode.invalid_config
    assert "min.compaction.lag.ms (10) > max.compaction.lag.ms (5)" in t.error_message


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_cleanup_policy_compact_is_accepted_and_described(cb: EmbeddedBroker, policy: str) -> None:
    from confluent_kafka.admin import ConfigResource, NewTopic

    admin = _admin(cb)
    name = "compacted-" + policy.replace(",", "-")
    admin.create_topics([NewTopic(name, 1, 1, config={"cleanup.policy": policy})])[name].result(timeout=20)
    res = ConfigResource(ConfigResource.Type.TOPIC, name)
    described = admin.describe_configs([res])[res].result(timeout=20)
    assert described["cleanup.policy"].value == policy


def test_replication_factor_above_one_is_refused_as_a_one_broker_kafka(cb: EmbeddedBroker) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KNewTopic

    admin = _admin(cb)
    fut = admin.create_topics([NewTopic("rf3", 1, 3)])["rf3"]
    with pytest.raises(KafkaException) as e:
        fut.result(timeout=20)
    assert e.value.args[0].code() == ErrorCode.invalid_replication_factor
    assert "only 1 broker(s) are registered" in e.value.args[0].str()

    kadmin = KafkaAdminClient(bootstrap_servers=cb.bootstrap)
    try:
        resp = kadmin.create_topics([KNewTopic("rf2", 1, 2)], raise_errors=False)
        assert [t["error_code"] for t in resp["topics"]] == [ErrorCode.invalid_replication_factor]
    finally:
        kadmin.close()
    assert _create_raw(cb, "rf1", {}, rf=1).error_code == 0
    assert _create_raw(cb, "rf-default", {}, rf=-1).error_code == 0


def test_replica_assignments_may_name_only_this_broker(cb: EmbeddedBroker) -> None:
    two = _create_raw(cb, "assigned", {}, assignments=[{"partition_index": 0, "broker_ids": [1, 2]}])
    assert two.error_code == ErrorCode.invalid_replica_assignment
    other = _create_raw(cb, "assigned", {}, assignments=[{"partition_index": 0, "broker_ids": [7]}])
    assert other.error_code == ErrorCode.invalid_replica_assignment
    ok = _create_raw(cb, "assigned", {}, assignments=[{"partition_index": 0, "broker_ids": [1]},
                                                      {"partition_index": 1, "broker_ids": [1]}])
    assert (ok.error_code, ok.num_partitions) == (0, 2)
    with Connection(cb.bootstrap) as c:
        r = c.request(CREATE_PARTITIONS, 3, {"topics": [{"name": "assigned", "count": 3,
                                                         "assignments": [{"broker_ids": [1, 2]}]}],
                                             "timeout": 10000, "validate_only": False})
        assert r.results[0].error_code == ErrorCode.invalid_replica_assignment
        r = c.request(CREATE_PARTITIONS, 3, {"topics": [{"name": "assigned", "count": 3,
                                                         "assignments": [{"broker_ids": [1]}]}],
                                             "timeout": 10000, "validate_only": False})
        assert r.results[0].error_code == 0


# -- item 14: message.format.version -------------------------------------------------------------


def test_message_format_version_is_accepted_and_ignored(cb: EmbeddedBroker) -> None:
    from confluent_kafka.admin import ConfigResource
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KNewTopic

    kadmin = KafkaAdminClient(bootstrap_servers=cb.bootstrap)
    try:
        kadmin.create_topics([KNewTopic("old-format", 1, 1, topic_configs={"message.format.version": "2.8-IV1"})])
    finally:
        kadmin.close()
    cfg = _describe(cb, ConfigResource.Type.TOPIC, "old-format")
    assert cfg["message.format.version"].value == "2.8-IV1"
    bad = _create_raw(cb, "bad-format", {"message.format.version": "banana"})
    assert bad.error_code == ErrorCode.invalid_config


# -- item 12: APPEND and SUBTRACT on list configs ---------------------------------------------


def test_incremental_append_and_subtract_on_list_configs(cb: EmbeddedBroker) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigResource, NewTopic

    topic, T = "lists", ConfigResource.Type.TOPIC
    _create(cb, [NewTopic(topic, 1, 1)], topic)
    key = "leader.replication.throttled.replicas"
    _incremental(cb, T, topic, [(key, "0:1", AlterConfigOpType.APPEND)])
    _incremental(cb, T, topic, [(key, "1:1,0:1", AlterConfigOpType.APPEND)])
    assert _describe(cb, T, topic)[key].value == "0:1,1:1"
    _incremental(cb, T, topic, [(key, "0:1", AlterConfigOpType.SUBTRACT)])
    assert _describe(cb, T, topic)[key].value == "1:1"

    # cleanup.policy starts from its default, delete; removing it leaves no cleanup at all
    _incremental(cb, T, topic, [("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT)])
    assert _describe(cb, T, topic)["cleanup.policy"].value == ""
    _incremental(cb, T, topic, [("cleanup.policy", "delete", AlterConfigOpType.APPEND)])
    assert _describe(cb, T, topic)["cleanup.policy"].value == "delete"
    _incremental(cb, T, topic, [("cleanup.policy", "compact", AlterConfigOpType.APPEND)])  # compaction works
    assert _describe(cb, T, topic)["cleanup.policy"].value == "delete,compact"

    with pytest.raises(KafkaException) as e:  # not a list
        _incremental(cb, T, topic, [("segment.bytes", "1", AlterConfigOpType.APPEND)])
    assert _kafka_error_code(e) == ErrorCode.invalid_config
    assert "Can't APPEND to key segment.bytes because its type is not LIST." in e.value.args[0].str()


# -- item 13: dynamic broker configs -------------------------------------------------------------


def test_broker_configs_are_dynamic_stored_and_survive_restart(tmp_path: Path) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigResource, ConfigSource, NewTopic
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    B, T = ConfigResource.Type.BROKER, ConfigResource.Type.TOPIC
    b = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "b.log", config={"log.retention.hours": "5"})
    b.start()
    try:
        _create(b, [NewTopic("follows", 1, 1)], "follows")
        assert _describe(b, T, "follows")["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value

        # per broker, with kafka-python's legacy AlterConfigs: applies at once to topics
        # without their own override
        kadmin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
        try:
            kadmin.alter_configs([KConfigResource(ConfigResourceType.BROKER, "1", configs={
                "log.retention.ms": "1234567", "producer.id.expiration.ms": "600000"})])
        finally:
            kadmin.close()
        cfg = _describe(b, T, "follows")
        assert (cfg["retention.ms"].value, cfg["retention.ms"].source) == ("1234567", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        bcfg = _describe(b, B, "1")
        assert (bcfg["log.retention.ms"].value, bcfg["log.retention.ms"].source) == (
            "1234567", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        assert not bcfg["log.retention.ms"].is_read_only
        assert bcfg["num.partitions"].is_read_only

        # the cluster default: resource name "" (the admin clients here refuse an empty name)
        with Connection(b.bootstrap) as c:
            r = c.request(INCREMENTAL_ALTER, 1, {"resources": [{"resource_type": 4, "resource_name": "", "configs": [
                {"name": "log.segment.bytes", "config_operation": 0, "value": "5000000"}]}], "validate_only": False})
            assert r.responses[0].error_code == 0, r
            r = c.request(DESCRIBE_CONFIGS, 4, {"resources": [{"resource_type": 4, "resource_name": "",
                                                                "configuration_keys": None}],
                                                 "include_synonyms": False, "include_documentation": False})
        assert [(e.name, e.value, e.config_source) for e in r.results[0].configs] == [
            ("log.segment.bytes", "5000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)]
        cfg = _describe(b, T, "follows")
        assert (cfg["segment.bytes"].value, cfg["segment.bytes"].source) == (
            "5000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)

        # read-only ones, another broker id, bad values
        for name, value in [("num.partitions", "3"), ("log.retention.hours", "1")]:
            with pytest.raises(KafkaException) as e:
                _incremental(b, B, "1", [(name, value, AlterConfigOpType.SET)])
            assert _kafka_error_code(e) == ErrorCode.invalid_request
            assert "Cannot update these configs dynamically" in e.value.args[0].str()
        with pytest.raises(KafkaException) as e:
            _incremental(b, B, "1", [("log.segment.bytes", "1", AlterConfigOpType.SET)])
        assert _kafka_error_code(e) == ErrorCode.invalid_request
        with Connection(b.bootstrap) as c:
            r = c.request(INCREMENTAL_ALTER, 1, {"resources": [{"resource_type": 4, "resource_name": "2", "configs": [
                {"name": "log.retention.ms", "config_operation": 0, "value": "1"}]}], "validate_only": False})
            assert r.responses[0].error_code == ErrorCode.invalid_request
    finally:
        b.close()

    b = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "b2.log", config={"log.retention.hours": "5"})
    b.start()
    try:
        cfg = _describe(b, T, "follows")
        assert cfg["retention.ms"].value == "1234567" and cfg["segment.bytes"].value == "5000000"
        assert _describe(b, B, "1")["producer.id.expiration.ms"].value == "600000"
        # DELETE brings back the static value
        _incremental(b, B, "1", [("log.retention.ms", None, AlterConfigOpType.DELETE)])
        cfg = _describe(b, T, "follows")
        assert (cfg["retention.ms"].value, cfg["retention.ms"].source) == (
            str(5 * 3_600_000), ConfigSource.STATIC_BROKER_CONFIG.value)
    finally:
        b.close()


# -- item 9: compression.type recompresses -----------------------------------------------------


def _stored_codecs(b: EmbeddedBroker, topic: str) -> list[int]:
    data = b"".join(p.read_bytes() for p in sorted((Path(b.data_dir) / f"{topic}-0").glob("*.log")))
    return [h.compression for h, _s, _e in iter_batch_headers(data)]


@pytest.mark.parametrize(("producer_codec", "topic_codec", "stored"), [("gzip", "zstd", 4), ("lz4", "uncompressed", 0),
                                                                        ("none", "snappy", 2), ("zstd", "lz4", 3)])
def test_compression_type_recompresses_and_every_client_reads_the_same_records(
    cb: EmbeddedBroker, producer_codec: str, topic_codec: str, stored: int
) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    topic = f"recompress-{producer_codec}-{topic_codec}"
    _create(cb, [NewTopic(topic, 1, 1, config={"compression.type": topic_codec})], topic)
    now = int(time.time() * 1000)
    sent = [(f"k{i}".encode(), (f"value-{i}-" * (i % 50 + 1)).encode(), [("h", f"{i}".encode())], now - 1000 + i)
            for i in range(300)]
    p = Producer({"bootstrap.servers": cb.bootstrap, "compression.type": producer_codec, "linger.ms": 20,
                  "enable.idempotence": True})
    for key, value, headers, ts in sent:
        p.produce(topic, value=value, key=key, headers=headers, timestamp=ts)
    assert p.flush(30) == 0
    codecs = _stored_codecs(cb, topic)
    assert codecs and set(codecs) == {stored}

    c = Consumer({"bootstrap.servers": cb.bootstrap, "group.id": "unused", "enable.auto.commit": False})
    got = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                assert not m.error(), m.error()
                got.append((m.key(), m.value(), [(k, v) for k, v in (m.headers() or [])], m.timestamp()[1]))
    finally:
        c.close()
    assert got == sent

    kc = KafkaConsumer(bootstrap_servers=cb.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    kgot = []
    try:
        kc.assign([KTP(topic, 0)])
        kc.seek(KTP(topic, 0), 0)
        deadline = time.monotonic() + 30
        while len(kgot) < len(sent) and time.monotonic() < deadline:
            for recs in kc.poll(timeout_ms=500).values():
                kgot += [(r.key, r.value, list(r.headers), r.timestamp) for r in recs]
    finally:
        kc.close()
    assert kgot == sent


@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_message_timestamp_bounds_refuse_records_out_of_range(cb: EmbeddedBroker, codec: str) -> None:
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import NewTopic

    topic = f"ts-bounds-{codec}"
    _create(cb, [NewTopic(topic, 1, 1, config={"message.timestamp.before.max.ms": "3600000",
                                                  "message.timestamp.after.max.ms": "60000"})], topic)
    now = int(time.time() * 1000)
    results: dict[int, Any] = {}

    def report(err: Any, msg: Any) -> None:
        results[int(msg.key())] = err

    p = Producer({"bootstrap.servers": cb.bootstrap, "compression.type": codec, "linger.ms": 0, "retries": 0})
    for i, ts in enumerate([now - 7_200_000, now, now + 600_000, now - 60_000]):
        p.produce(topic, value=b"v", key=str(i).encode(), timestamp=ts, on_delivery=report)
        p.flush(15)
    assert results[1] is None and results[3] is None
    for i in (0, 2):
        assert results[i] is not None and results[i].code() == KafkaError.INVALID_TIMESTAMP, results[i]


def test_recompressed_transactional_batches_keep_their_transaction(cb: EmbeddedBroker) -> None:
    """A transactional producer's gzip batches stored as zstd: read_committed sees the committed
    transaction only, so the transactional flag, producer id and epoch survived recompression."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic

    topic = "recompress-txn"
    _create(cb, [NewTopic(topic, 1, 1, config={"compression.type": "zstd"})], topic)
    p = Producer({"bootstrap.servers": cb.bootstrap, "compression.type": "gzip", "transactional.id": "rc-txn",
                  "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(20):
        p.produce(topic, value=b"aborted-%d" % i)
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(20):
        p.produce(topic, value=b"committed-%d" % i)
    p.commit_transaction(30)
    assert set(_stored_codecs(cb, topic)) == {4, 0}  # data batches zstd; the markers stay uncompressed

    c = Consumer({"bootstrap.servers": cb.bootstrap, "group.id": "unused", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    got: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            for m in c.consume(100, 0.5):
                assert not m.error(), m.error()
                got.append(m.value())
        time.sleep(0.5)
        got += [m.value() for m in c.consume(100, 0.5) if not m.error()]
    finally:
        c.close()
    assert got == [b"committed-%d" % i for i in range(20)]


def test_alter_configs_protocol_edge_cases(cb: EmbeddedBroker) -> None:
    assert _create_raw(cb, "edges", {}).error_code == 0

    def incremental(resources: list[dict[str, Any]]) -> list[tuple[int, str | None]]:
        with Connection(cb.bootstrap) as c:
            r = c.request(INCREMENTAL_ALTER, 1, {"resources": resources, "validate_only": False})
        return [(x.error_code, x.error_message) for x in r.responses]

    def res(configs: list[tuple[str, int, str | None]], name: str = "edges", rtype: int = 2) -> dict[str, Any]:
        return {"resource_type": rtype, "resource_name": name,
                "configs": [{"name": n, "config_operation": op, "value": v} for n, op, v in configs]}

    [(code, _m)] = incremental([res([("retention.ms", 9, "1")])])
    assert code == ErrorCode.invalid_request  # unknown operation
    [(code, msg)] = incremental([res([("retention.ms", 0, None)])])
    assert code == ErrorCode.invalid_request and "Null value not supported" in (msg or "")
    [(code, msg)] = incremental([res([("retention.ms", 0, "1"), ("retention.ms", 0, "2")])])
    assert code == ErrorCode.invalid_request and "duplicate config keys" in (msg or "")
    codes = incremental([res([("retention.ms", 0, "1")]), res([("retention.ms", 0, "2")])])
    assert [c for c, _ in codes] == [ErrorCode.invalid_request] * 2  # the same resource twice
    [(code, _m)] = incremental([res([("retention.ms", 0, "1")], name="x", rtype=4)])
    assert code == ErrorCode.invalid_request  # not a broker id
    [(code, _m)] = incremental([res([("retention.ms", 0, "1")], rtype=3)])
    assert code == ErrorCode.invalid_request  # not a resource type configs live on here
    # APPEND with a list value several items long, and validate_only changes nothing
    with Connection(cb.bootstrap) as c:
        r = c.request(INCREMENTAL_ALTER, 1, {"resources": [res([("follower.replication.throttled.replicas", 2, "0:1,1:1")])],
                                              "validate_only": True})
        assert r.responses[0].error_code == 0
        d = c.request(DESCRIBE_CONFIGS, 4, {"resources": [{"resource_type": 2, "resource_name": "edges",
                                                           "configuration_keys": ["follower.replication.throttled.replicas",
                                                                                  "cleanup.policy", "segment.bytes",
                                                                                  "min.cleanable.dirty.ratio"]}],
                                            "include_synonyms": False, "include_documentation": False})
    got = {e.name: (e.value, e.config_type) for e in d.results[0].configs}
    assert got == {"follower.replication.throttled.replicas": ("", 7), "cleanup.policy": ("delete", 7),
                   "segment.bytes": ("1073741824", 3), "min.cleanable.dirty.ratio": ("0.5", 6)}


# -- min.insync.replicas: one replica is the whole ISR ------------------------------------------


def test_min_insync_replicas_above_one_refuses_acks_all_as_a_one_broker_kafka(cb: EmbeddedBroker) -> None:
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import NewTopic

    topic = "min-isr-2"
    _create(cb, [NewTopic(topic, 1, 1, config={"min.insync.replicas": "2"})], topic)
    results: dict[str, Any] = {}

    def report(err: Any, msg: Any) -> None:
        results[msg.value().decode()] = err

    # librdkafka retries NOT_ENOUGH_REPLICAS; with retries=0 the broker's answer reaches the callback
    for acks in ("all", "1", "0"):
        p = Producer({"bootstrap.servers": cb.bootstrap, "acks": acks, "retries": 0, "linger.ms": 0,
                      "enable.idempotence": False})
        p.produce(topic, value=acks.encode(), on_delivery=report)
        assert p.flush(15) == 0
    assert results["all"] is not None and results["all"].code() == KafkaError.NOT_ENOUGH_REPLICAS, results["all"]
    assert results["1"] is None and results["0"] is None
    # the refused record was not appended; the acks=1 and acks=0 ones were (acks=0 has no answer
    # to wait for, so its append may land a moment after flush returned)
    deadline, end = time.monotonic() + 10, -1
    with Connection(cb.bootstrap) as c:
        while end < 2 and time.monotonic() < deadline:
            r = c.request(2, 1, {"replica_id": -1, "topics": [
                {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
            end = r.topics[0].partitions[0].offset
            time.sleep(0.05)
    assert end == 2
