"""TLS and SASL settings among the Spark source's and sink's ``kafka.*`` options: what Spark's Kafka
connector passes to the Java client, mapped to oncelog's client (no Spark session, no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncelog.spark.options import SourceOptionError, parse_options

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}
SCRAM_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
              'password="alice-secret";')


def java_options(ca: Path) -> dict[str, str]:
    """A Spark job's options as written for Spark's Kafka connector (Java client names)."""
    return {**BASE, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-256",
            "kafka.sasl.jaas.config": SCRAM_JAAS, "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": str(ca)}


MAPPED = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
          "sasl.password": "alice-secret"}


def test_source_maps_java_security_options(pem_ca: Path) -> None:
    o = parse_options(java_options(pem_ca), streaming=True)
    assert o.client_config == {**MAPPED, "ssl.ca.location": str(pem_ca)}
    assert "alice-secret" not in repr(o)
    # librdkafka's names (oncelog's own) work as they are; other kafka.* options are not security settings
    o = parse_options({**BASE, "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanisms": "PLAIN",
                       "kafka.sasl.username": "u", "kafka.sasl.password": "p", "kafka.request.timeout.ms": "5"},
                      streaming=False)
    assert o.client_config == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                               "sasl.username": "u", "sasl.password": "p"}
    assert parse_options(BASE, streaming=False).client_config == {}


@pytest.mark.parametrize("extra, message", [
    ({"kafka.ssl.truststore.type": "JKS"}, "a JKS trust store is not supported.*ssl.truststore.type=PEM.*ssl.ca.location"),
    ({"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": "/no/ca.pem"}, "is not a file"),
    ({"kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a\";"},
     "password not given"),
    ({"kafka.sasl.mechanism": "GSSAPI"}, "'GSSAPI' is not supported"),
    ({"kafka.ssl.protocol": "TLSv1.3"}, "unknown configuration property 'ssl.protocol'"),
])
def test_source_refuses_what_the_client_cannot_do(pem_ca: Path, extra: dict[str, str], message: str) -> None:
    opts = {**java_options(pem_ca), **extra}
    if "kafka.ssl.truststore.type" in extra and extra["kafka.ssl.truststore.type"] == "JKS":
        opts["kafka.ssl.truststore.location"] = "/etc/kafka/truststore.jks"
    with pytest.raises(SourceOptionError, match="Invalid Kafka option: .*" + message):
        parse_options(opts, streaming=True)


def test_sink_maps_java_security_options_for_its_producers_and_decision_log(pem_ca: Path) -> None:
    pytest.importorskip("pyspark")  # the sink module imports pyspark's writer classes
    from oncelog.spark.sink import SinkOptionError, parse_sink_options

    o = parse_sink_options({**java_options(pem_ca), "kafka.linger.ms": "7"}, streaming=True)
    mapped = {**MAPPED, "ssl.ca.location": str(pem_ca)}
    assert o.security == mapped  # the driver's admin client, decision-log reader and writer
    assert o.producer == {**mapped, "bootstrap.servers": "127.0.0.1:9092", "linger.ms": "7", "batch.size": "262144"}
    assert o.client_conf("h:1") == {**mapped, "bootstrap.servers": "h:1"}
    assert "alice-secret" not in repr(o)
    with pytest.raises(SinkOptionError, match="Invalid Kafka option: ssl.truststore.location: a JKS trust store"):
        parse_sink_options({**BASE, "kafka.ssl.truststore.location": "/etc/kafka/truststore.jks"}, streaming=True)
