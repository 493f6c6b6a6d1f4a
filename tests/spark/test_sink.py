"""The oncelog sink: at-least-once and exactly-once, batch and streaming, and crash points in-session.

Counted with a librdkafka read_committed consumer (helpers.direct_read): every
input id exactly once, nothing aborted visible, order per partition kept.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.spark.helpers import check_verified, direct_read, make_topic, offsets, produce

from oncelog.spark.sink import (
    DECISION_TOPIC_CONFIG,
    DecisionHint,
    DecisionLog,
    OncelogStreamWriter,
    abort_batch,
    commit_batch,
    parse_sink_options,
    write_task,
)


def committed(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed",
              wait: bool = True) -> list[Any]:
    """Everything readable once no transaction is open (the markers of a completed transaction are
    written after complete_transaction() returns, as in Kafka: wait until the LSO reaches the end)."""
    deadline = time.monotonic() + 30
    while True:
        end = offsets(bootstrap, topic, partitions, isolation)
        if not wait or end == offsets(bootstrap, topic, partitions, "read_uncommitted") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return direct_read(bootstrap, topic, {p: 0 for p in range(partitions)}, end, isolation)


def check_exactly_once(rows: list[Any], n: int, prefix: str = "v") -> None:
    """Every id 0..n-1 once; within each output partition the ids keep their input order."""
    ids = [int(r[4].decode()[len(prefix):]) for r in rows]
    assert sorted(ids) == list(range(n)), f"lost {set(range(n)) - set(ids)}, duplicated {len(ids) - len(set(ids))}"
    by_part: dict[int, list[int]] = {}
    for _, p, _, _, v in sorted(rows, key=lambda r: (r[1], r[2])):
        by_part.setdefault(p, []).append(int(v.decode()[len(prefix):]))
    for p, seq in by_part.items():
        assert seq == sorted(seq), f"order broken in partition {p}"


def frame(spark: Any, n: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    # each output partition is written by one task, in id order: the order per partition is checkable
    return (spark.range(n).withColumn("partition", (F.col("id") % partitions).cast("int"))
            .repartition(2, "partition").sortWithinPartitions("id")
            .select(F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"), "partition"))


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_batch_write(spark: Any, spark_broker: Any, topic_name: str, guarantee: str) -> None:
    bs = spark_broker.bootstrap
    make_topic(bs, topic_name, 3)
    (frame(spark, 500, 3).write.format("oncelog").mode("append").option("kafka.bootstrap.servers", bs)
     .option("topic", topic_name).option("deliveryGuarantee", guarantee).save())
    check_exactly_once(committed(bs, topic_name, 3), 500)


def test_batch_write_key_headers_topic_column(spark: Any, spark_broker: Any, topic_name: str) -> None:
    bs = spark_broker.bootstrap
    make_topic(bs, topic_name, 1)
    df = spark.createDataFrame(
        [("k1", b"a", topic_name, [("h", b"x")]), (None, b"b", topic_name, [])],
        "key string, value binary, topic string, headers array<struct<key: string, value: binary>>")
    df.write.format("oncelog").mode("append").option("kafka.bootstrap.servers", bs).save()
    committed(bs, topic_name, 1)  # waits for the markers
    from oncelog.client.reader import PartitionReader

    with PartitionReader(bs) as r:
        recs = r.read_partition(topic_name, 0).records
    got = sorted((rec.value, rec.key, rec.headers) for rec in recs)
    assert got == [(b"a", b"k1", [("h", b"x")]), (b"b", None, [])]


def _stream(spark: Any, bs: str, src: str, dst: str, ckpt: Path, guarantee: str | None = None,
            crash: str = "", per_trigger: int = 150) -> Any:
    from pyspark.sql import functions as F

    df = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bs).option("subscribe", src)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_trigger)).load()
          .select(F.col("value"), F.col("partition")))
    w = (df.writeStream.format("oncelog").option("kafka.bootstrap.servers", bs).option("topic", dst)
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True))
    if guarantee:
        w = w.option("deliveryGuarantee", guarantee)
    if crash:
        w = w.option("_testCrashAt", crash)
    return w.start()


@pytest.mark.parametrize("guarantee", ["at_least_once", None])
def test_streaming_write(spark: Any, spark_broker: Any, tmp_path: Path, guarantee: str | None) -> None:
    bs = spark_broker.bootstrap
    src, dst = f"s-{uuid.uuid4().hex[:8]}", f"d-{uuid.uuid4().hex[:8]}"
    make_topic(bs, src, 2)
    make_topic(bs, dst, 2)
    produce(bs, src, 400, 2)
    q = _stream(spark, bs, src, dst, tmp_path / "ckpt", guarantee)
    q.awaitTermination(120)
    assert q.exception() is None
    check_verified(bs, src, dst, 2, 400)


def test_task_fails_after_prepare_then_retried(spark: Any, spark_broker: Any, tmp_path: Path) -> None:
    """Attempt 0 of every task prepares, then fails; attempt 1 fences it (its transaction is aborted)."""
    bs = spark_broker.bootstrap
    src, dst = f"s-{uuid.uuid4().hex[:8]}", f"d-{uuid.uuid4().hex[:8]}"
    make_topic(bs, src, 2)
    make_topic(bs, dst, 2)
    produce(bs, src, 300, 2)
    q = _stream(spark, bs, src, dst, tmp_path / "ckpt", crash="task-after-prepare")
    q.awaitTermination(120)
    assert q.exception() is None
    check_verified(bs, src, dst, 2, 300)
    # the orphaned attempts' records are in the log, aborted: read_uncommitted sees them
    assert len(committed(bs, dst, 2, "read_uncommitted")) > 300


def _task_batches(values: list[bytes]) -> Any:
    import pyarrow as pa

    return iter([pa.record_batch([pa.array(values, pa.binary())], names=["value"])])


def test_commit_twice_and_abort_after_commit(spark_broker: Any, topic_name: str) -> None:
    bs = spark_broker.bootstrap
    src = f"s-{uuid.uuid4().hex[:8]}"
    make_topic(bs, src, 1)
    produce(bs, src, 10, 1)  # what the two tasks below copy (verify's input)
    make_topic(bs, topic_name, 1)
    opts = parse_sink_options({"kafka.bootstrap.servers": bs, "topic": topic_name}, streaming=True)
    query = uuid.uuid4().hex
    msgs = [write_task(opts, query, 0, p, 0, _task_batches([f"v{i}".encode() for i in range(p * 5, p * 5 + 5)]))
            for p in range(2)]
    assert committed(bs, topic_name, 1, wait=False) == []  # prepared, not committed: nothing visible
    commit_batch(opts, msgs, 0)
    commit_batch(opts, msgs, 0)  # Spark after a crash: the same batch committed twice
    abort_batch(opts, msgs, 0)  # and an abort after the commit succeeded
    check_verified(bs, src, topic_name, 1, 10)
    rows = committed(bs, topic_name, 1)
    latest = DecisionLog(opts).latest(query)
    assert latest is not None and (latest.batch, latest.txns) == (0, {m.transactional_id: m.state for m in msgs})
    # a replay of the decided batch writes nothing new
    again = write_task(opts, query, 0, 0, 0, _task_batches([b"v99"]))
    assert again.skipped
    commit_batch(opts, [again, msgs[1]], 0)
    assert committed(bs, topic_name, 1) == rows


def test_abort_undecided_batch(spark_broker: Any, topic_name: str) -> None:
    bs = spark_broker.bootstrap
    make_topic(bs, topic_name, 1)
    opts = parse_sink_options({"kafka.bootstrap.servers": bs, "topic": topic_name}, streaming=True)
    query = uuid.uuid4().hex
    msgs = [write_task(opts, query, 3, 0, 0, _task_batches([b"v0", b"v1"]))]
    abort_batch(opts, msgs, 3)
    assert committed(bs, topic_name, 1) == []
    assert len(committed(bs, topic_name, 1, "read_uncommitted")) == 2
    # the next batch goes through: the aborted transaction no longer pins the LSO
    msgs = [write_task(opts, query, 4, 0, 0, _task_batches([b"v0", b"v1"]))]
    commit_batch(opts, msgs, 4)
    check_exactly_once(committed(bs, topic_name, 1), 2)


def test_orphans_of_a_larger_partition_count_are_swept(spark_broker: Any, topic_name: str) -> None:
    bs = spark_broker.bootstrap
    make_topic(bs, topic_name, 1)
    opts = parse_sink_options({"kafka.bootstrap.servers": bs, "topic": topic_name}, streaming=True)
    query = uuid.uuid4().hex
    # batch 0 ran with 3 tasks and the driver died before the decision
    for p in range(3):
        write_task(opts, query, 0, p, 0, _task_batches([f"x{p}".encode()]))
    # the replay runs with 1 task: ids -1 and -2 are left over, and pin the LSO until swept
    msgs = [write_task(opts, query, 0, 0, 0, _task_batches([b"v0"]))]
    commit_batch(opts, msgs, 0)
    check_exactly_once(committed(bs, topic_name, 1), 1)


def _batch(opts: Any, query: str, batch: int, values: list[bytes], hint: Any = None) -> list[Any]:
    msgs = [write_task(opts, query, batch, 0, 0, _task_batches(values), hint)]
    commit_batch(opts, msgs, batch)
    return msgs


def test_decisions_keyed_by_query_in_a_compacted_topic(spark_broker: Any, topic_name: str) -> None:
    """One key per query (compaction keeps its latest decision), and the topic is made compacted."""
    from oncelog.client.admin import Admin, ConfigResource
    from oncelog.client.reader import READ_UNCOMMITTED, PartitionReader

    bs = spark_broker.bootstrap
    make_topic(bs, topic_name, 1)
    decisions = f"dec-{uuid.uuid4().hex[:8]}"
    opts = parse_sink_options({"kafka.bootstrap.servers": bs, "topic": topic_name, "decisionTopic": decisions},
                              streaming=True)
    query = uuid.uuid4().hex
    for b in range(3):
        _batch(opts, query, b, [f"v{b}".encode()])
    with Admin(bs) as admin:
        res = ConfigResource("topic", decisions)
        cfg = admin.describe_configs([res])[res]
    assert {k: cfg[k].value for k in DECISION_TOPIC_CONFIG} == DECISION_TOPIC_CONFIG
    with PartitionReader(bs) as r:
        recs = r.read_partition(decisions, 0, READ_UNCOMMITTED).records
    assert [rec.key for rec in recs] == [query.encode()] * 3  # compaction may keep only the last
    latest = DecisionLog(opts).latest(query)
    assert latest is not None and latest.batch == 2
    check_exactly_once(committed(bs, topic_name, 1), 3)


def test_tasks_use_the_drivers_snapshot_and_read_no_decisions(spark_broker: Any, topic_name: str,
                                                               monkeypatch: Any) -> None:
    """Spark makes a stream writer per batch on the driver: it carries the query's latest decision
    (found by checkpoint location) to the tasks, which then never read the decision topic; the
    driver's reads are incremental (one new record per batch, whatever the history)."""
    bs = spark_broker.bootstrap
    make_topic(bs, topic_name, 1)
    ck = f"/tmp/ckpt-{uuid.uuid4().hex[:8]}"
    opts = parse_sink_options({"kafka.bootstrap.servers": bs, "topic": topic_name, "checkpointLocation": ck},
                              streaming=True)
    query = uuid.uuid4().hex
    log = DecisionLog(opts)
    assert OncelogStreamWriter(opts).hint is None  # nothing decided under this checkpoint yet
    _batch(opts, query, 0, [b"v0"])
    read_before = log.refresh().records_read
    _batch(opts, query, 1, [b"v1"], OncelogStreamWriter(opts).hint)
    assert log.refresh().records_read - read_before == 1  # the driver read the new decision only
    hint = OncelogStreamWriter(opts).hint  # the writer Spark would pickle to batch 2's tasks
    assert hint is not None and hint.query == query and hint.latest is not None and hint.latest.batch == 1

    def no_reads(self: Any, *a: Any) -> Any:
        raise AssertionError("a task read the decision topic")

    monkeypatch.setattr(DecisionLog, "refresh", no_reads)
    # a replay of decided batch 1 (the crash between our commit and Spark's commit log) writes
    # nothing, from the snapshot alone
    assert write_task(opts, query, 1, 0, 0, _task_batches([b"v99"]), hint).skipped
    new = write_task(opts, query, 2, 0, 0, _task_batches([b"v2"]), hint)
    assert not new.skipped and new.state
    # a snapshot of another query is not used: that task looks its decision up itself
    with pytest.raises(AssertionError, match="read the decision topic"):
        write_task(opts, uuid.uuid4().hex, 0, 0, 0, _task_batches([b"x"]), hint)
    monkeypatch.undo()
    commit_batch(opts, [new], 2)
    check_exactly_once(committed(bs, topic_name, 1), 3)


def test_missing_value_column_is_one_clear_error(spark: Any, spark_broker: Any, topic_name: str) -> None:
    df = spark.createDataFrame([("k",)], "key string")
    with pytest.raises(Exception, match="Required attribute 'value' not found"):
        (df.write.format("oncelog").mode("append").option("kafka.bootstrap.servers", spark_broker.bootstrap)
         .option("topic", topic_name).save())


def test_write_batches_hands_arrow_columns_to_produce_batch() -> None:
    """The sink passes Spark's Arrow value/key columns to produce_batch as Arrow arrays (encoded from
    their buffers, oncelog.client.arrow), a partition's subset as a take() of them; rows with headers
    still go one produce() each. No Spark, no broker: a recording producer."""
    import pyarrow as pa

    from oncelog.client.arrow import is_arrow
    from oncelog.spark.sink import write_batches

    calls: list[tuple[Any, ...]] = []

    class Recorder:
        def produce_batch(self, topic: str, values: Any, keys: Any = None, partition: int | None = None) -> None:
            calls.append(("batch", topic, values, keys, partition))

        def produce(self, topic: str, value: Any, key: Any = None, partition: Any = None, headers: Any = None) -> None:
            calls.append(("one", topic, value, key, partition, headers))

    opts = parse_sink_options({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t"}, False)
    rb = pa.record_batch({"value": pa.array(["a", None, "c", "d"]), "key": pa.array([b"k0", b"k1", None, b"k3"]),
                          "partition": pa.array([0, 1, 0, 1], pa.int32())})
    assert write_batches(Recorder(), opts, iter([rb])) == 4  # type: ignore[arg-type]
    assert [c[4] for c in calls] == [0, 1]
    for kind, topic, values, keys, part in calls:
        assert kind == "batch" and is_arrow(values) and is_arrow(keys)
    assert [calls[0][2].to_pylist(), calls[0][3].to_pylist()] == [["a", "c"], [b"k0", None]]
    assert [calls[1][2].to_pylist(), calls[1][3].to_pylist()] == [[None, "d"], [b"k1", b"k3"]]
    calls.clear()
    whole = pa.record_batch({"value": pa.array([b"x", b"y"])})
    assert write_batches(Recorder(), opts, iter([whole])) == 2  # type: ignore[arg-type]
    assert len(calls) == 1 and is_arrow(calls[0][2]) and calls[0][2].to_pylist() == [b"x", b"y"]
    calls.clear()
    hdr_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    with_headers = pa.record_batch({"value": pa.array(["v"]), "headers": pa.array([[{"key": "h", "value": b"1"}]],
                                                                                   hdr_type)})
    assert write_batches(Recorder(), opts, iter([with_headers])) == 1  # type: ignore[arg-type]
    assert calls == [("one", "t", b"v", None, None, [("h", b"1")])]
