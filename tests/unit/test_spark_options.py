"""The Spark source's option checks and planning, without Spark or a broker (oncelog.spark.options)."""

from __future__ import annotations

import json

import pytest

from oncelog.spark.options import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    SourceOptionError,
    offsets_from_json,
    offsets_to_json,
    parse_options,
    rate_limit,
    split_ranges,
    time_string_ms,
)

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_offsets_json_round_trips_in_sparks_form() -> None:
    text = '{"b":{"0":-2},"a":{"10":5,"2":23,"1":-1}}'
    parsed = offsets_from_json(text)
    assert parsed == {("a", 1): -1, ("a", 2): 23, ("a", 10): 5, ("b", 0): -2}
    assert offsets_to_json(parsed) == {"a": {"1": -1, "2": 23, "10": 5}, "b": {"0": -2}}
    assert offsets_from_json(json.dumps(offsets_to_json(parsed))) == parsed
    for bad in ('{"a":[0]}', '{"a":{"0":"x"}}', "[1]", "nope", '{"a":{"x":1}}'):
        with pytest.raises(SourceOptionError, match="Expected e.g."):
            offsets_from_json(bad)


def test_defaults_follow_the_kafka_source_except_isolation() -> None:
    o = parse_options(BASE | {"subscribe": "a, b,"}, streaming=True)
    assert o.topics == ("a", "b") and o.starting.kind == "latest"
    assert o.isolation_level == READ_COMMITTED  # Spark's Kafka source: read_uncommitted
    assert o.fail_on_data_loss and not o.include_headers and o.max_trigger_delay_ms == 15 * 60_000
    b = parse_options(BASE | {"SUBSCRIBEPATTERN": "t.*", "kafka.isolation.level": "read_uncommitted"}, streaming=False)
    assert b.strategy == "subscribepattern" and b.starting.kind == "earliest" and b.ending.kind == "latest"
    assert b.isolation_level == READ_UNCOMMITTED
    a = parse_options(BASE | {"assign": '{"t":[0,1]}', "startingOffsetsByTimestamp": '{"t":{"0":5,"1":6}}',
                              "startingOffsets": "earliest"}, streaming=False)
    assert a.assign == (("t", 0), ("t", 1)) and a.starting.kind == "timestamps"  # timestamps win, as in Spark
    assert parse_options(BASE | {"subscribe": "t", "startingTimestamp": "7"}, streaming=True).starting.timestamp == 7


@pytest.mark.parametrize(("opts", "streaming", "message"), [
    ({"subscribe": "t", "startingOffsets": '{"t":{"0":-1}}'}, False, "startingOffsets for t-0 can't be latest"),
    ({"subscribe": "t", "endingOffsets": "earliest"}, False, "ending offset can't be earliest"),
    ({"subscribe": "t", "endingOffsetsByTimestamp": '{"t":{"0":1}}'}, True, "ending timestamp not valid"),
    ({"subscribe": " , "}, False, "No topics to subscribe to"),
    ({"assign": "t"}, False, "No topicpartitions to assign"),
    ({"subscribePattern": " "}, False, "Pattern to subscribe is empty"),
    ({"subscribe": "t", "minPartitions": "0"}, False, "minPartitions must be positive"),
    ({"subscribe": "t", "kafka.value.deserializer": "x"}, False, "'value.deserializer' is not supported"),
    ({"subscribe": "t", "kafka.enable.auto.commit": "true"}, False, "'enable.auto.commit' is not supported"),
    ({"subscribe": "t", "kafka.isolation.level": "dirty"}, False, "String must be one of"),
    ({"subscribe": "t", "maxTriggerDelay": "soon"}, True, "maxTriggerDelay"),
    ({"subscribe": "t", "failOnDataLoss": "maybe"}, True, "failOnDataLoss"),
])
def test_bad_options(opts: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        parse_options(BASE | opts, streaming=streaming)
    with pytest.raises(SourceOptionError, match="'kafka.bootstrap.servers' must be specified"):
        parse_options({"subscribe": "t"}, streaming=False)


def test_rate_limit_shares_by_backlog_and_never_passes_latest() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 300, ("t", 1): 200, ("t", 2): 50, ("t", 3): 10}
    out = rate_limit(40, start, latest, new_start={("t", 3): 0})
    # backlogs 300, 100, 0, 10 of 410: 29, 9, -, 0.97 -> ceil to 1 (small partitions are not starved)
    assert out == {("t", 0): 29, ("t", 1): 109, ("t", 2): 50, ("t", 3): 1}
    assert sum(out[tp] - start.get(tp, 0) for tp in out) <= 40
    assert rate_limit(1000, start, latest, {("t", 3): 0}) == latest


def test_split_ranges_for_min_partitions() -> None:
    ranges = [(("t", 0), 0, 1000), (("t", 1), 0, 10), (("t", 2), 5, 5)]
    assert split_ranges(ranges, None) == ranges[:2]
    out = split_ranges(ranges, 5)
    assert (("t", 1), 0, 10) in out and len(out) == 5
    assert sorted((f, u) for tp, f, u in out if tp == ("t", 0)) == [(0, 250), (250, 500), (500, 750), (750, 1000)]


def test_time_strings() -> None:
    assert [time_string_ms(v, "x") for v in ("15m", "30s", "500ms", "250", "1h")] == [900_000, 30_000, 500, 250,
                                                                                    3_600_000]


def test_spark_uses_the_client_layer_only() -> None:
    """oncelog.spark must work against Apache Kafka: importing it loads neither the broker nor storage."""
    import subprocess
    import sys

    code = ("import sys, oncelog.spark, oncelog.spark._kafka, oncelog.spark.source; "
            "print(sorted(m for m in sys.modules if m.startswith(('oncelog.broker', 'oncelog.storage'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_bootstrap_servers_are_tried_in_order() -> None:
    """A dead first bootstrap server is skipped, as a Kafka client skips it."""
    import socket

    from oncelog.spark._kafka import connect

    with socket.socket() as dead, socket.socket() as live:
        dead.bind(("127.0.0.1", 0))  # bound, not listening: connection refused
        live.bind(("127.0.0.1", 0))
        live.listen()
        d, lv = dead.getsockname()[1], live.getsockname()[1]
        o = parse_options(BASE | {"kafka.bootstrap.servers": f" 127.0.0.1:{d}, 127.0.0.1:{lv} ,", "subscribe": "t"},
                          streaming=False)
        assert o.bootstrap == f"127.0.0.1:{d},127.0.0.1:{lv}"
        with connect(o) as reader:
            assert reader.bootstrap == f"127.0.0.1:{lv}"
        only_dead = parse_options(BASE | {"kafka.bootstrap.servers": f"127.0.0.1:{d}", "subscribe": "t"}, streaming=False)
        with pytest.raises(OSError):
            connect(only_dead)
