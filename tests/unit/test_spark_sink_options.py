"""Options of the oncelog Spark sink (pure parsing; no Spark session, no broker)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")  # the spark extra is part of `make test`

from oncelog.spark.sink import (  # noqa: E402
    AT_LEAST_ONCE,
    CRASH_ENV,
    EXACTLY_ONCE,
    SinkOptionError,
    crash_point,
    parse_sink_options,
)

BS = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_defaults_streaming_exactly_once_batch_at_least_once() -> None:
    assert parse_sink_options(BS, streaming=True).guarantee == EXACTLY_ONCE
    assert parse_sink_options(BS, streaming=False).guarantee == AT_LEAST_ONCE
    o = parse_sink_options({**BS, "deliveryGuarantee": "AT_LEAST_ONCE", "topic": " out "}, streaming=True)
    assert (o.guarantee, o.topic) == (AT_LEAST_ONCE, "out")
    assert (o.txn_prefix, o.decision_topic) == ("oncelog-spark", "__oncelog_spark_decisions")


def test_kafka_properties_pass_to_the_producer() -> None:
    o = parse_sink_options({**BS, "kafka.linger.ms": "7", "kafka.compression.type": "lz4"}, streaming=True)
    assert o.producer == {"bootstrap.servers": "127.0.0.1:9092", "linger.ms": "7", "compression.type": "lz4",
                          "batch.size": "262144"}  # the sink's default
    # a kafka.* option wins over the sink's defaults
    assert parse_sink_options({**BS, "kafka.batch.size": "16384"}, streaming=True).producer["batch.size"] == "16384"


@pytest.mark.parametrize("opts, message", [
    ({}, "kafka.bootstrap.servers"),
    ({**BS, "deliveryGuarantee": "twice"}, "deliveryGuarantee"),
    ({**BS, "kafka.transactional.id": "x"}, "transactional.id"),
    ({**BS, "kafka.value.serializer": "x"}, "value.serializer"),
])
def test_bad_options_name_the_option(opts: dict[str, str], message: str) -> None:
    with pytest.raises(SinkOptionError, match=message):
        parse_sink_options(opts, streaming=True)


def test_crash_point_names_a_point_and_optionally_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not crash_point("after-decision", 1)
    monkeypatch.setenv(CRASH_ENV, "after-decision@1")
    assert crash_point("after-decision", 1)
    assert not crash_point("after-decision", 2)
    assert not crash_point("before-decision", 1)
    monkeypatch.setenv(CRASH_ENV, "before-decision")
    assert crash_point("before-decision", 5)
    opts = parse_sink_options({**BS, "_testCrashAt": "during-write@0"}, streaming=True)
    assert crash_point("during-write", 0, opts) and not crash_point("before-decision", 5, opts)
