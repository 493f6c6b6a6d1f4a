"""The oncelog Spark source against a real broker and a real PySpark session.

The oracle is librdkafka (confluent-kafka): a read_committed consumer assigned
to the same offsets. Data includes committed and aborted transactions, so
offsets have gaps (markers, aborted records) that the source must plan
around.
"""

from __future__ import annotations

import datetime
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from .helpers import direct_read, make_topic, offsets, produce, produce_txn, rows_of, txn_producer


def source(spark: Any, bootstrap: str, stream: bool = False, **opts: str) -> Any:
    r = (spark.readStream if stream else spark.read).format("oncelog").option("kafka.bootstrap.servers", bootstrap)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df: Any, name: str, checkpoint: Path) -> Any:
    q = (df.writeStream.format("memory").queryName(name).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert not q.isActive, "availableNow query did not finish"
    assert q.exception() is None, q.exception()
    return q


def mixed_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    """Plain records, a committed and an aborted transaction, more plain records."""
    make_topic(bootstrap, topic, partitions)
    produce(bootstrap, topic, 60, partitions, prefix="a", headers=True)
    produce_txn(bootstrap, topic, 30, partitions, prefix="committed", commit=True)
    produce_txn(bootstrap, topic, 30, partitions, prefix="aborted", commit=False)
    produce(bootstrap, topic, 60, partitions, prefix="b", start=60)


def test_batch_read_equals_direct_read(spark: Any, spark_broker: Any, topic_name: str) -> None:
    b = spark_broker.bootstrap
    mixed_topic(b, topic_name)
    latest = offsets(b, topic_name, 3)
    start = {0: 5, 1: 0, 2: 17}
    end = {0: latest[0] - 3, 1: latest[1], 2: latest[2]}
    df = source(spark, b, subscribe=topic_name, includeHeaders="true", minPartitions="5",
                startingOffsets=json.dumps({topic_name: {"0": 5, "1": -2, "2": 17}}),
                endingOffsets=json.dumps({topic_name: {"0": end[0], "1": -1, "2": -1}}))
    rows = df.collect()
    want = direct_read(b, topic_name, start, end)
    assert len(want) > 100
    assert rows_of(rows) == want
    assert not [r for r in rows if r.value.startswith(b"aborted")]
    # the Kafka source's schema and values
    assert [f.name for f in df.schema.fields] == ["key", "value", "topic", "partition", "offset", "timestamp",
                                                  "timestampType", "headers"]
    r = next(r for r in rows if r.value == b"a10")
    assert r.key == b"k10" and r.timestampType == 0
    assert [(h.key, h.value) for h in r.headers] == [("n", b"10"), ("e", None)]
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert abs((r.timestamp - now).total_seconds()) < 600
    assert next(r for r in rows if r.value == b"a7").key is None
    # minPartitions splits the big ranges into more Spark partitions
    assert df.rdd.getNumPartitions() >= 5


def test_read_committed_hides_aborted_and_waits_for_open(spark: Any, spark_broker: Any, topic_name: str,
                                                          tmp_path: Path) -> None:
    b = spark_broker.bootstrap
    make_topic(b, topic_name, 2)
    produce(b, topic_name, 10, 2, prefix="before")
    produce_txn(b, topic_name, 10, 2, prefix="aborted", commit=False)
    open_txn = txn_producer(b)
    open_txn.begin_transaction()
    for i in range(6):
        open_txn.produce(topic_name, value=f"open{i}".encode(), partition=i % 2)
    assert open_txn.flush(30) == 0
    produce(b, topic_name, 10, 2, prefix="after", start=10)  # behind the open transaction: not stable yet

    name = f"q_{uuid.uuid4().hex[:8]}"
    stream = source(spark, b, stream=True, subscribe=topic_name, startingOffsets="earliest")
    q = (stream.writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="200 milliseconds").start())
    committed = False
    try:
        q.processAllAvailable()
        values = sorted(r.value.decode() for r in spark.table(name).collect())
        assert values == sorted(f"before{i}" for i in range(10))  # stops at the last stable offset
        batch = source(spark, b, subscribe=topic_name).collect()
        assert sorted(r.value.decode() for r in batch) == values
        uncommitted = source(spark, b, subscribe=topic_name, **{"kafka.isolation.level": "read_uncommitted"})
        assert len([r for r in uncommitted.collect() if r.value.startswith(b"aborted")]) == 10

        open_txn.commit_transaction(30)
        committed = True
        deadline = time.monotonic() + 60
        while True:
            q.processAllAvailable()
            values = sorted(r.value.decode() for r in spark.table(name).collect())
            if len(values) >= 26 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
    finally:
        q.stop()
        if not committed:
            open_txn.abort_transaction(10)
    want = sorted([f"before{i}" for i in range(10)] + [f"open{i}" for i in range(6)]
                  + [f"after{i}" for i in range(10, 20)])
    assert values == want
    assert q.exception() is None


def test_streaming_max_offsets_per_trigger_and_offsets_round_trip(spark: Any, spark_broker: Any,
                                                                  topic_name: str, tmp_path: Path) -> None:
    b = spark_broker.bootstrap
    mixed_topic(b, topic_name)
    latest = offsets(b, topic_name, 3)
    name = f"q_{uuid.uuid4().hex[:8]}"
    df = source(spark, b, stream=True, subscribe=topic_name, startingOffsets="earliest", maxOffsetsPerTrigger="40")
    q = run_available_now(df, name, tmp_path / "ck")
    rows = spark.table(name).collect()
    assert rows_of(rows) == direct_read(b, topic_name, {p: 0 for p in range(3)}, latest)

    progress = [p for p in q.recentProgress if p["numInputRows"] > 0 or p["sources"][0]["endOffset"]]
    batches = [(json.loads(p["sources"][0]["startOffset"]) if p["sources"][0]["startOffset"] else None,
                json.loads(p["sources"][0]["endOffset"]), p["numInputRows"]) for p in progress]
    assert len(batches) >= 5
    for start, end, n in batches:
        assert n <= 40
        if start is not None:
            assert sum(end[topic_name][k] - start[topic_name].get(k, 0) for k in end[topic_name]) <= 40
    assert batches[-1][1] == {topic_name: {str(p): o for p, o in latest.items()}}

    # the JSON offsets round-trip: a batch end offset is a valid startingOffsets, for batch and streaming
    middle = batches[len(batches) // 2][1]
    mid = {int(p): o for p, o in middle[topic_name].items()}
    want = direct_read(b, topic_name, mid, latest)
    assert 0 < len(want) < len(rows)
    again = source(spark, b, subscribe=topic_name, startingOffsets=json.dumps(middle)).collect()
    assert rows_of(again) == want
    name2 = f"q_{uuid.uuid4().hex[:8]}"
    run_available_now(source(spark, b, stream=True, subscribe=topic_name, startingOffsets=json.dumps(middle)),
                      name2, tmp_path / "ck2")
    assert rows_of(spark.table(name2).collect()) == want


def test_new_partitions_are_picked_up(spark: Any, spark_broker: Any, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    b = spark_broker.bootstrap
    prefix = f"grow-{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}-x"
    make_topic(b, topic, 1)
    produce(b, topic, 10, 1, prefix="one")
    name = f"q_{uuid.uuid4().hex[:8]}"
    df = source(spark, b, stream=True, subscribePattern=f"{prefix}-.*", startingOffsets="earliest")
    q = (df.writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        assert len(spark.table(name).collect()) == 10
        admin = AdminClient({"bootstrap.servers": b})
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
        produce(b, topic, 30, 3, prefix="three")
        second = f"{prefix}-y"  # a new topic matching the pattern
        make_topic(b, second, 1)
        produce(b, second, 5, 1, prefix="y")
        deadline = time.monotonic() + 60
        while True:
            q.processAllAvailable()
            rows = spark.table(name).collect()
            if len(rows) >= 45 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
    finally:
        q.stop()
    assert q.exception() is None
    got = rows_of(rows)
    want = sorted(direct_read(b, topic, {0: 0, 1: 0, 2: 0}, offsets(b, topic, 3))
                  + direct_read(b, second, {0: 0}, offsets(b, second, 1)))
    assert got == want and len(got) == 45
    assert {r[1] for r in got if r[0] == topic} == {0, 1, 2}
    assert min(r[2] for r in got if r[0] == topic and r[1] == 2) == 0  # new partitions read from offset 0


def test_fail_on_data_loss(spark: Any, spark_broker: Any, topic_name: str) -> None:
    from oncelog.client.admin import Admin

    b = spark_broker.bootstrap
    make_topic(b, topic_name, 1)
    produce(b, topic_name, 20, 1)
    with Admin(b) as admin:
        assert admin.delete_records({(topic_name, 0): 8})[(topic_name, 0)][0] is None
    start = json.dumps({topic_name: {"0": 3}})
    with pytest.raises(Exception, match=r"KAFKA_DATA_LOSS.COULD_NOT_READ_OFFSET_RANGE.*\[3, 20\)"):
        source(spark, b, subscribe=topic_name, startingOffsets=start).collect()
    rows = source(spark, b, subscribe=topic_name, startingOffsets=start, failOnDataLoss="false").collect()
    assert sorted(r.offset for r in rows) == list(range(8, 20))


@pytest.mark.parametrize(("stream", "opts", "message"), [
    (False, {}, "One of the following options must be specified for Kafka source: subscribe, subscribepattern, assign"),
    (False, {"subscribe": "a", "assign": '{"a":[0]}'}, "Only one of the following options can be specified"),
    (False, {"subscribe": "a", "startingOffsets": "latest"}, "starting offset can't be latest for batch queries"),
    (False, {"subscribe": "a", "startingOffsets": "{bad"}, 'Expected e.g. {"topicA":{"0":23,"1":-1}'),
    (True, {"subscribe": "a", "endingOffsets": "latest"}, "ending offset not valid in streaming queries"),
    (False, {"subscribe": "a", "kafka.auto.offset.reset": "earliest"}, "Kafka option 'auto.offset.reset' is not supported"),
    (False, {"subscribe": "a", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
     r"minOffsetPerTrigger\(10\) is higher than the maxOffsetsPerTrigger\(5\)"),
])
def test_option_errors_have_clear_messages(spark: Any, spark_broker: Any, stream: bool, opts: dict[str, str],
                                           message: str) -> None:
    with pytest.raises(Exception, match=message) as info:
        df = source(spark, spark_broker.bootstrap, stream=stream, **opts)
        if stream:
            df.writeStream.format("memory").queryName(f"q_{uuid.uuid4().hex[:8]}").start().awaitTermination(30)
        else:
            df.collect()
    assert "SourceOptionError" in str(info.value)


def test_specific_offsets_must_name_every_partition(spark: Any, spark_broker: Any, topic_name: str) -> None:
    b = spark_broker.bootstrap
    make_topic(b, topic_name, 2)
    with pytest.raises(Exception, match=r"you must specify all TopicPartitions.*Specified: Set\(.*-0\) "
                                        r"Assigned: Set\(.*-0, .*-1\)"):
        source(spark, b, subscribe=topic_name, startingOffsets=json.dumps({topic_name: {"0": 0}})).collect()


@pytest.mark.parametrize("fail", [True, False])
def test_deleted_topic_follows_fail_on_data_loss(spark: Any, spark_broker: Any, tmp_path: Path, fail: bool) -> None:
    from oncelog.client.admin import Admin

    b = spark_broker.bootstrap
    keep, gone = f"keep-{uuid.uuid4().hex[:6]}", f"gone-{uuid.uuid4().hex[:6]}"
    make_topic(b, keep, 1)
    make_topic(b, gone, 2)
    produce(b, keep, 5, 1, prefix="k")
    produce(b, gone, 6, 2, prefix="g")
    name = f"q_{uuid.uuid4().hex[:8]}"
    df = source(spark, b, stream=True, subscribe=f"{keep},{gone}", startingOffsets="earliest",
                failOnDataLoss=str(fail).lower())
    q = (df.writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        assert len(spark.table(name).collect()) == 11
        with Admin(b) as admin:
            assert admin.delete_topic(gone) is None
        produce(b, keep, 5, 1, prefix="k", start=5)
        if fail:
            with pytest.raises(Exception, match=r"KAFKA_DATA_LOSS.PARTITIONS_DELETED.*Partitions \{gone-\w+-0, "
                                                r"gone-\w+-1\} have been deleted"):
                q.awaitTermination(60)
                q.processAllAvailable()
            return
        deadline = time.monotonic() + 60
        while len(spark.table(name).collect()) < 16 and time.monotonic() < deadline:
            q.processAllAvailable()
            time.sleep(0.3)
        assert q.isActive and q.exception() is None
        assert sorted(r.value for r in spark.table(name).collect() if r.topic == keep) == sorted(
            f"k{i}".encode() for i in range(10))
    finally:
        q.stop()


def test_starting_offsets_by_timestamp(spark: Any, spark_broker: Any, topic_name: str) -> None:
    from confluent_kafka import Producer

    b = spark_broker.bootstrap
    make_topic(b, topic_name, 2)
    p = Producer({"bootstrap.servers": b})
    base = 1_700_000_000_000
    for i in range(20):
        p.produce(topic_name, value=f"v{i}".encode(), partition=i % 2, timestamp=base + i * 1000)
    assert p.flush(30) == 0
    by_ts = json.dumps({topic_name: {"0": base + 10_000, "1": base + 15_000}})
    rows = source(spark, b, subscribe=topic_name, startingOffsetsByTimestamp=by_ts).collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(0, o) for o in range(5, 10)] + [(1, o) for o in range(7, 10)]
    assert all(r.timestamp >= datetime.datetime.fromtimestamp((base + 10_000) / 1000, datetime.timezone.utc)
               .replace(tzinfo=None) for r in rows)
    rows = source(spark, b, subscribe=topic_name, startingTimestamp=str(base + 18_000)).collect()
    assert sorted(r.value for r in rows) == [b"v18", b"v19"]
    with pytest.raises(Exception, match=r"No offset matched from request of topic-partition .*-0 and timestamp"):
        source(spark, b, subscribe=topic_name, startingTimestamp=str(base + 99_000)).collect()
    late = source(spark, b, subscribe=topic_name, startingTimestamp=str(base + 99_000),
                  startingOffsetsByTimestampStrategy="latest").collect()
    assert late == []
