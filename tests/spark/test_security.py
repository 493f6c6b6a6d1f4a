"""The Spark source and the exactly-once sink over SASL_SSL (SCRAM-SHA-512), configured as a Spark user
configures Spark's Kafka connector: ``kafka.security.protocol``, ``kafka.sasl.mechanism``,
``kafka.sasl.jaas.config`` and a PEM ``kafka.ssl.truststore.location``.

A streaming query reads a topic from the oncelog source (driver-side offset queries and executor reads)
and writes it through the exactly-once sink (transactional producers, the decision topic created,
written and read by the driver); ``oncelog verify`` then audits the copy over SASL_SSL. Its own broker
(the shared one is plaintext), the shared Spark session; about 15 s here.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.tls_material import Pki, make_pki

from oncelog.client import Admin, Producer
from oncelog.client.reader import LATEST, READ_COMMITTED, READ_UNCOMMITTED, PartitionReader
from oncelog.testing import EmbeddedBroker

BROKER_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_spark="spark-secret";'
CLIENT_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="spark" '
               'password="spark-secret";')


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki(Path(tempfile.mkdtemp(prefix="oncelog-spark-pki-")))


@pytest.fixture(scope="module")
def secure_broker(pki: Pki) -> Iterator[EmbeddedBroker]:
    tmp = Path(tempfile.mkdtemp(prefix="oncelog-spark-sasl-"))
    with EmbeddedBroker(data_dir=tmp / "data", log_path=tmp / "broker.log", config={
            "transaction.two.phase.commit.enable": "true",  # the exactly-once sink prepares KIP-939 transactions
            "listeners": "SASL_SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.broker_keystore), "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": BROKER_JAAS}) as b:
        yield b


def spark_options(b: EmbeddedBroker, pki: Pki) -> dict[str, str]:
    """What a Spark job written for Spark's Kafka connector sets."""
    return {"kafka.bootstrap.servers": b.bootstrap, "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.jaas.config": CLIENT_JAAS,
            "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(pki.ca)}


def client_conf(b: EmbeddedBroker, pki: Pki) -> dict[str, Any]:
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "spark",
            "sasl.password": "spark-secret", "ssl.ca.location": str(pki.ca)}


def test_source_and_exactly_once_sink_over_sasl_ssl(spark: Any, secure_broker: EmbeddedBroker, pki: Pki,
                                                    tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from oncelog import verify

    b, conf = secure_broker, client_conf(secure_broker, pki)
    n, parts = 300, 2
    with Admin({**conf, "bootstrap.servers": b.bootstrap}) as admin:
        admin.create_topic("sec-in", parts)
        admin.create_topic("sec-out", parts)
    p = Producer({**conf, "bootstrap.servers": b.bootstrap})
    try:
        for i in range(n):
            p.produce("sec-in", f"v{i}".encode(), partition=i % parts)
        assert p.flush(30) == 0
    finally:
        p.close()

    opts = spark_options(b, pki)
    df = (spark.readStream.format("oncelog").options(**opts).option("subscribe", "sec-in")
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "200").load()
          .select(F.col("value"), F.col("partition")))
    q = (df.writeStream.format("oncelog").options(**opts).option("topic", "sec-out")
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()

    with PartitionReader(b.bootstrap, config=conf) as r:  # the markers follow completion: wait for the LSO
        deadline = time.monotonic() + 30
        while any(r.list_offset("sec-out", i, LATEST, READ_COMMITTED) != r.list_offset("sec-out", i, LATEST,
                                                                                        READ_UNCOMMITTED)
                  for i in range(parts)):
            assert time.monotonic() < deadline, "transactions still open on sec-out"
            time.sleep(0.1)
    report = verify.run(b.bootstrap, "sec-in", "sec-out", id_spec="value", config=conf)
    assert report.clean, report.to_json()
    assert (report.input_records, report.output_records) == (n, n)
    # the decision log was written and read over SASL_SSL too: the sink's decision topic holds this query
    with PartitionReader(b.bootstrap, config=conf) as r:
        assert r.list_offset("__oncelog_spark_decisions", 0, LATEST) >= 1
