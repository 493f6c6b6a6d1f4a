#!/usr/bin/env python3
"""Spark sink throughput: format("oncelog") exactly-once vs at-least-once vs foreachBatch + confluent-kafka.

One oncelog broker (two-phase commit allowed), one SparkSession (``local[N]``),
one input topic filled once with ``--records`` records of ``--size`` bytes over
``--partitions`` partitions. Every round copies all of it with a streaming
query (``Trigger.AvailableNow``, ``maxOffsetsPerTrigger``) from the oncelog
source (read_committed) into a fresh output topic, three ways in the same
order (A B C):

* ``exactly_once``: ``writeStream.format("oncelog")`` (the default guarantee);
* ``at_least_once``: the same sink with ``deliveryGuarantee=at_least_once``;
* ``foreachBatch``: what a PySpark user without the connector writes today:
  ``foreachBatch`` -> ``foreachPartition`` with a confluent-kafka producer per
  task, one ``produce`` per Row, ``flush`` at the end (at-least-once);
* ``noop`` (D, not a sink under test): the same query into Spark's ``noop``
  sink, so that "side minus noop" is what the sink itself costs.

Same source, same data, same broker, same session; the output partition is
the input's. Per run: wall time (records/s), and CPU seconds read from /proc:
the Spark side (this process's tree without the broker: the JVM and the Python
workers, with reaped children) and the broker. The last round's outputs are
checked with ``oncelog verify`` (every record once; ``--check all`` checks
every round's, ``--check none`` none).
Usage: ``python bench/spark_sink.py --rounds 3 --records 200000``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import run_metadata, spark_session  # noqa: E402

from oncelog.testing import EmbeddedBroker  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime+stime+cutime+cstime in seconds) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / TICK


def tree_cpu(root: int, exclude: set[int]) -> float:
    """CPU seconds of ``root`` and its descendants (live, plus the children they reaped), minus the
    subtrees rooted at ``exclude``."""
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = _stat(int(name))
            if s is not None:
                stats[int(name)] = s
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in exclude or pid not in stats:
            continue
        total += stats[pid][1]
        todo.extend(kids.get(pid, []))
    return total


def fill(bootstrap: str, topic: str, records: int, size: int, partitions: int) -> None:
    from oncelog.client.admin import Admin
    from oncelog.client.producer import Producer

    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    pad = b"x" * max(0, size - 9)
    for part in range(partitions):
        ids = range(part, records, partitions)
        p.produce_batch(topic, [b"%08d-" % i + pad for i in ids], partition=part)
    assert p.flush(120) == 0
    p.close()


def confluent_partition_writer(bootstrap: str, topic: str) -> Any:
    """The foreachPartition function of the baseline (runs in Spark's Python workers)."""

    def write(rows: Any) -> None:
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": bootstrap})
        for r in rows:
            while True:
                try:
                    p.produce(topic, value=r.value, partition=r.partition)
                    break
                except BufferError:
                    p.poll(0.05)
        if p.flush(120):
            raise RuntimeError("records not delivered")

    return write


def copy(spark: Any, bootstrap: str, src: str, dst: str, ckpt: str, how: str, per_trigger: int) -> None:
    df = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap).option("subscribe", src)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_trigger)).load()
          .select("value", "partition"))
    if how == "foreachBatch":
        fn = confluent_partition_writer(bootstrap, dst)
        w = df.writeStream.foreachBatch(lambda batch, _id: batch.foreachPartition(fn))
    elif how == "noop":
        w = df.writeStream.format("noop")
    else:
        w = (df.writeStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap).option("topic", dst)
             .option("deliveryGuarantee", how))
    q = w.option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"{how}: {q.exception()}")


def check(bootstrap: str, src: str, dst: str, how: str, records: int) -> None:
    from oncelog import verify

    report = verify.run(bootstrap, src, dst, id_spec="value")
    assert report.clean and report.output_records == records, (how, report.to_json())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--per-trigger", type=int, default=50_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    ap.add_argument("--check", choices=("last", "all", "none"), default="last",
                    help="verify the output of the last round (default), of every round, or never")
    args = ap.parse_args()
    meta = run_metadata()
    sides = ("exactly_once", "at_least_once", "foreachBatch", "noop")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(
            data_dir=Path(tmp) / "data", log_path=Path(tmp) / "broker.log",
            config={"transaction.two.phase.commit.enable": "true"}) as broker:
        b = broker.bootstrap
        assert broker.proc is not None
        bpid = broker.proc.pid
        src = f"in-{uuid.uuid4().hex[:6]}"
        print(f"filling {args.records} x {args.size} B into {args.partitions} partitions", file=sys.stderr)
        fill(b, src, args.records, args.size, args.partitions)
        spark = spark_session(args.cores, "oncelog-bench-sink")
        # warm every path once (the session's first jobs, the Python workers' imports)
        warm = f"warm-{uuid.uuid4().hex[:6]}"
        fill(b, warm, 2000, 10, args.partitions)
        from oncelog.client.admin import Admin

        def new_topic() -> str:
            t = f"out-{uuid.uuid4().hex[:8]}"
            with Admin(b) as admin:
                admin.create_topic(t, args.partitions)
            return t

        for how in sides:
            copy(spark, b, warm, new_topic(), f"{tmp}/ck-{uuid.uuid4().hex[:6]}", how, args.per_trigger)
        rate: dict[str, list[float]] = {k: [] for k in sides}
        cpu: dict[str, list[float]] = {k: [] for k in sides}
        bcpu: dict[str, list[float]] = {k: [] for k in sides}
        me = os.getpid()
        for r in range(args.rounds):
            for how in sides:
                dst = new_topic()
                c0, b0, t0 = tree_cpu(me, {bpid}), tree_cpu(bpid, set()), time.perf_counter()
                copy(spark, b, src, dst, f"{tmp}/ck-{uuid.uuid4().hex[:6]}", how, args.per_trigger)
                dt = time.perf_counter() - t0
                c1, b1 = tree_cpu(me, {bpid}), tree_cpu(bpid, set())
                rate[how].append(args.records / dt)
                cpu[how].append((c1 - c0) / args.records * 1e6)
                bcpu[how].append((b1 - b0) / args.records * 1e6)
                print(f"round {r + 1} {how}: {args.records / dt:,.0f} records/s, spark {cpu[how][-1]:.1f} "
                      f"+ broker {bcpu[how][-1]:.1f} CPU us/record", file=sys.stderr)
                if how != "noop" and (args.check == "all" or (args.check == "last" and r == args.rounds - 1)):
                    check(b, src, dst, how, args.records)
        spark.stop()
    print(f"Copy {args.records:,} x {args.size} B records, {args.partitions} partitions, oncelog source "
          f"(read_committed, maxOffsetsPerTrigger {args.per_trigger:,}, AvailableNow) into each sink; "
          f"{args.rounds} rounds A B C D; Spark local[{args.cores}]; python {meta['python']}, {meta['cpu_count']} "
          f"CPUs (shared), oncelog {meta['oncelog_git']}")
    print(f"`{meta['command']}`\n")
    print("| sink | median records/s | runs | vs at_least_once | vs foreachBatch | Spark CPU us/record | "
          "of it the sink (minus noop) | broker CPU us/record |\n|---|---:|---|---:|---:|---:|---:|---:|")
    noop = statistics.median(cpu["noop"])
    for how in sides:
        med = statistics.median(rate[how])
        # paired ratios: run i of this side against run i of the other, then the median
        vs_alo = statistics.median(x / y for x, y in zip(rate[how], rate["at_least_once"]))
        vs_fb = statistics.median(x / y for x, y in zip(rate[how], rate["foreachBatch"]))
        print(f"| {how} | {med:,.0f} | {', '.join(f'{x:,.0f}' for x in rate[how])} | {vs_alo:.2f}x | "
              f"{vs_fb:.2f}x | {statistics.median(cpu[how]):.1f} | {statistics.median(cpu[how]) - noop:.1f} | "
              f"{statistics.median(bcpu[how]):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
