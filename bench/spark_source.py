#!/usr/bin/env python3
"""Spark source throughput: records/s of format("oncelog") into Spark's no-op sink, against plain reads.

One oncelog broker; one topic of ``--partitions`` partitions filled once with
``--records`` records of ``--size`` bytes (confluent-kafka, plain and
committed-transaction batches, so read_committed has markers to skip). Every
round reads all of it, read_committed, three ways in the same order (A B C):

* ``reader``: the baseline, ``oncelog.client.reader.PartitionReader.read_partition``
  over every partition in this process (one thread; Python records);
* ``read_arrow``: the source's task code, ``oncelog.spark._kafka.read_arrow``,
  over every partition in this process (one thread; Arrow batches, no Spark);
* ``spark``: ``spark.read.format("oncelog") ... .write.format("noop")`` on a
  ``local[N]`` session (one Spark task per partition, N Python workers).

Wall time per read; the table gives the median records/s and the ratio to
the baseline. The SparkSession is started (and warmed with one small read)
before the first round. Usage:
``python bench/spark_source.py --rounds 3 --records 200000 --size 100 --cores 2``.
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


def fill(bootstrap: str, topic: str, records: int, size: int, partitions: int) -> None:
    from confluent_kafka import Producer

    from oncelog.client.admin import Admin

    with Admin(bootstrap) as admin:
        assert admin.create_topic(topic, partitions) is None
    value = b"x" * size
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    tx = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "transactional.id": f"bench-{uuid.uuid4().hex[:6]}"})
    tx.init_transactions(30)
    per_txn = 5000
    for start in range(0, records, per_txn):
        n = min(per_txn, records - start)
        if (start // per_txn) % 2:
            tx.begin_transaction()
            for i in range(n):
                tx.produce(topic, key=b"%d" % (start + i), value=value, partition=(start + i) % partitions)
                if i % 10000 == 0:
                    tx.poll(0)
            tx.commit_transaction(60)
        else:
            for i in range(n):
                while True:
                    try:
                        plain.produce(topic, key=b"%d" % (start + i), value=value, partition=(start + i) % partitions)
                        break
                    except BufferError:
                        plain.poll(0.05)
            plain.flush(60)


def read_reader(bootstrap: str, topic: str, partitions: int) -> int:
    from oncelog.client.reader import READ_COMMITTED, PartitionReader

    with PartitionReader(bootstrap) as r:
        return sum(len(r.read_partition(topic, p, READ_COMMITTED).records) for p in range(partitions))


def read_arrow_all(bootstrap: str, topic: str, partitions: int) -> int:
    from oncelog.spark._kafka import KafkaAccess, read_arrow
    from oncelog.spark.options import parse_options

    opts = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic}, streaming=False)
    with KafkaAccess(opts) as k:
        tps = k.partitions()
        start, end = k.earliest(tps), k.latest(tps)
    return sum(b.num_rows for tp in sorted(tps) for b in read_arrow(opts, tp[0], tp[1], start[tp], end[tp]))


def read_spark(spark: Any, bootstrap: str, topic: str) -> None:
    (spark.read.format("oncelog").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic).load()
     .write.format("noop").mode("overwrite").save())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    args = ap.parse_args()
    meta = run_metadata()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(data_dir=Path(tmp) / "data",
                                                               log_path=Path(tmp) / "broker.log") as broker:
        b = broker.bootstrap
        topic = f"bench-{uuid.uuid4().hex[:6]}"
        print(f"filling {args.records} x {args.size} B into {args.partitions} partitions", file=sys.stderr)
        fill(b, topic, args.records, args.size, args.partitions)
        want = read_reader(b, topic, args.partitions)
        assert want == args.records, (want, args.records)
        spark = spark_session(args.cores, "oncelog-bench")
        warm = f"warm-{uuid.uuid4().hex[:6]}"
        fill(b, warm, 1000, 10, 2)
        read_spark(spark, b, warm)
        assert spark.read.format("oncelog").option("kafka.bootstrap.servers", b).option("subscribe", topic).load().count() == want
        sides = {
            "reader": lambda: read_reader(b, topic, args.partitions),
            "read_arrow": lambda: read_arrow_all(b, topic, args.partitions),
            "spark": lambda: read_spark(spark, b, topic),
        }
        runs: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(args.rounds):
            for name, fn in sides.items():
                t0 = time.perf_counter()
                n = fn()
                dt = time.perf_counter() - t0
                if n is not None:
                    assert n == want, (name, n, want)
                runs[name].append(want / dt)
                print(f"round {r + 1} {name}: {want / dt:,.0f} records/s", file=sys.stderr)
        spark.stop()
    base = statistics.median(runs["reader"])
    print(f"Read {args.records:,} x {args.size} B records (half in committed transactions), {args.partitions} "
          f"partitions, read_committed, {args.rounds} rounds A B C; Spark local[{args.cores}] into the noop sink; "
          f"python {meta['python']}, {meta['cpu_count']} CPUs, oncelog {meta['oncelog_git']}")
    print(f"`{meta['command']}`\n")
    print("| side | median records/s | runs | vs reader |\n|---|---:|---|---:|")
    for name, xs in runs.items():
        med = statistics.median(xs)
        print(f"| {name} | {med:,.0f} | {', '.join(f'{x:,.0f}' for x in xs)} | {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
