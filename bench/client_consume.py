#!/usr/bin/env python3
"""Client consume throughput: oncelog's consumer vs confluent-kafka, kafka-python and aiokafka, one broker.

One oncelog broker (``common.OncelogBroker``) for the whole run. The topic
(8 partitions, ``--records`` records of ``--size`` random bytes, round-robin
over the partitions, ``--compression`` for the producer, default none) is
filled once with confluent-kafka. Every round runs each client once, in the
same order (A B C ..., A B C ...), and each reads the whole topic from offset
0: manual assignment of all 8 partitions at offset 0 (no group membership, no commits;
confluent-kafka is given a random group.id because librdkafka requires one),
``isolation.level`` set explicitly and equally for every client
(``--isolation``, default read_uncommitted), every other setting each client's
default (fetch sizes, fetch.min.bytes, check.crcs ...). A run counts records
and value bytes until it has them all; its time and CPU are from the
constructor to the last record (close not included). CPU is the bench
process's user+system seconds (``time.process_time()``: every thread, so librdkafka's
and our loop thread's too) and the broker's (``/proc/<pid>/stat``), per MB of
values read: robust to other load on the machine, unlike records/s.

Clients:

* ``oncelog``: ``oncelog.client.Consumer`` (blocking facade), ``consume(500, 1.0)``;
* ``oncelog-poll``: the same, one ``poll(1.0)`` per record;
* ``oncelog-aio``: ``oncelog.client.aio.Consumer``, ``await consume(500, 1.0)``;
* ``oncelog-aio-nonumpy``: the same without the optional numpy decode (not in the default list);
* ``oncelog-prev``, ``oncelog-poll-prev``: ``oncelog``/``oncelog-poll`` with the blocking facade's
  earlier fetch policy and wait (each partition fetched as it drains, Java's; waits for data through
  the loop thread): ``FETCH_HOLD = None``, ``FAST_WAIT = 0`` (not in the default list; for in-process
  before/after comparisons);
* ``oncelog-columns``: ``PartitionReader.iter_range(records=False)`` and
  ``decode_columns``, the path the Spark source uses (blocking, one partition
  after another, no prefetch);
* ``confluent``: confluent-kafka ``Consumer.consume(500, 1.0)``;
* ``confluent-poll``: one ``poll(1.0)`` per record;
* ``kafkapython``: kafka-python ``KafkaConsumer.poll(1000, max_records=500)``;
* ``kafkapython-iter``: kafka-python, one record a step of ``for m in consumer``;
* ``aiokafka``: aiokafka ``AIOKafkaConsumer.getmany(timeout_ms=1000, max_records=500)``;
* ``aiokafka-getone``: aiokafka, one ``await getone()`` per record.

The ``-poll``/``-iter``/``-getone`` variants are the per-record APIs; compare
them with each other, and the batch APIs with each other.

Usage: ``python bench/client_consume.py --rounds 5 --records 100000 --size 1024``
(``--profile oncelog`` runs one client once under pyinstrument, the calling
thread only, and prints its profile). Prints a markdown table: median
records/s, the median of the per-round ratios to each reference client of the
same kind (batch API against batch API, per-record against per-record),
client and broker CPU seconds per MB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OncelogBroker, run_metadata  # noqa: E402

PARTITIONS = 8
BATCH = 500


class Run:
    """What one client read: records, value bytes; the caller adds times."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self.t_end = 0.0
        self.cpu_end = 0.0


def _cpu() -> float:
    return time.process_time()  # user + system of every thread, in ns (os.times() counts 10 ms ticks)


def _done(run: Run) -> None:
    run.t_end = time.perf_counter()
    run.cpu_end = _cpu()


def run_oncelog(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from oncelog.client import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "isolation.level": iso, "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        records = size = 0
        while records < n:
            for m in c.consume(BATCH, 1.0):
                records += 1
                size += len(m.value)
        run.records, run.bytes = records, size
        _done(run)
    finally:
        c.close()


def run_oncelog_poll(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from oncelog.client import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "isolation.level": iso, "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        records = size = 0
        poll = c.poll
        while records < n:
            m = poll(1.0)
            if m is not None:
                records += 1
                size += len(m.value)
        run.records, run.bytes = records, size
        _done(run)
    finally:
        c.close()


def run_oncelog_aio(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from oncelog.client.aio import Consumer, TopicPartition

    async def main() -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "isolation.level": iso, "enable.auto.commit": False})
        await c.start()
        try:
            c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
            records = size = 0
            while records < n:
                for m in await c.consume(BATCH, 1.0):
                    records += 1
                    size += len(m.value)
            run.records, run.bytes = records, size
            _done(run)
        finally:
            await c.close()

    asyncio.run(main())


def run_oncelog_aio_nonumpy(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    """``oncelog-aio`` without the optional numpy decode (the pure-Python path, as without numpy)."""
    from oncelog.client import reader

    saved = reader.HAVE_NUMPY
    reader.HAVE_NUMPY = False
    try:
        run_oncelog_aio(bootstrap, topic, n, iso, run)
    finally:
        reader.HAVE_NUMPY = saved


def run_oncelog_columns(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from oncelog.client.reader import EARLIEST, LATEST, READ_COMMITTED, READ_UNCOMMITTED, PartitionReader
    from oncelog.protocol.records import decode_columns

    level = READ_COMMITTED if iso == "read_committed" else READ_UNCOMMITTED
    with PartitionReader(bootstrap) as r:
        records = size = 0
        for p in range(PARTITIONS):
            start = r.list_offset(topic, p, EARLIEST)
            end = r.list_offset(topic, p, LATEST, level)
            for batches, _pos in r.iter_range(topic, p, start, end, level, records=False):
                for b in batches:
                    cols = decode_columns(b.raw, 0, True)
                    records += len(cols.offsets)
                    size += sum(map(len, cols.values))
        run.records, run.bytes = records, size
        _done(run)


def run_confluent(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "isolation.level": iso})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        records = size = 0
        while records < n:
            for m in c.consume(BATCH, 1.0):
                if m.error():
                    raise RuntimeError(m.error())
                records += 1
                size += len(m.value())
        run.records, run.bytes = records, size
        _done(run)
    finally:
        c.close()


def run_confluent_poll(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "isolation.level": iso})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        records = size = 0
        poll = c.poll
        while records < n:
            m = poll(1.0)
            if m is not None:
                if m.error():
                    raise RuntimeError(m.error())
                records += 1
                size += len(m.value())
        run.records, run.bytes = records, size
        _done(run)
    finally:
        c.close()


def run_kafkapython(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level=iso)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        records = size = 0
        while records < n:
            for msgs in c.poll(1000, max_records=BATCH).values():
                for m in msgs:
                    records += 1
                    size += len(m.value)
        run.records, run.bytes = records, size
        _done(run)
    finally:
        c.close()


def run_aiokafka(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def main() -> None:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             isolation_level=iso)
        await c.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)
            records = size = 0
            while records < n:
                for msgs in (await c.getmany(timeout_ms=1000, max_records=BATCH)).values():
                    for m in msgs:
                        records += 1
                        size += len(m.value)
            run.records, run.bytes = records, size
            _done(run)
        finally:
            await c.stop()

    asyncio.run(main())


def run_kafkapython_iter(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level=iso)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        records = size = 0
        for m in c:
            records += 1
            size += len(m.value)
            if records >= n:
                break
        run.records, run.bytes = records, size
        _done(run)
    finally:
        c.close()


def run_aiokafka_getone(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def main() -> None:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             isolation_level=iso)
        await c.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)
            records = size = 0
            getone = c.getone
            while records < n:
                m = await getone()
                records += 1
                size += len(m.value)
            run.records, run.bytes = records, size
            _done(run)
        finally:
            await c.stop()

    asyncio.run(main())


def _prev(run_fn: Callable[[str, str, int, str, Run], None]) -> Callable[[str, str, int, str, Run], None]:
    def run_prev(bootstrap: str, topic: str, n: int, iso: str, run: Run) -> None:
        from oncelog.client import consumer

        saved = consumer.FETCH_HOLD, consumer.FAST_WAIT
        consumer.FETCH_HOLD, consumer.FAST_WAIT = None, 0
        try:
            run_fn(bootstrap, topic, n, iso, run)
        finally:
            consumer.FETCH_HOLD, consumer.FAST_WAIT = saved

    return run_prev


CLIENTS: dict[str, Callable[[str, str, int, str, Run], None]] = {
    "oncelog": run_oncelog,
    "oncelog-poll": run_oncelog_poll,
    "oncelog-aio": run_oncelog_aio,
    "oncelog-aio-nonumpy": run_oncelog_aio_nonumpy,
    "oncelog-prev": _prev(run_oncelog),
    "oncelog-poll-prev": _prev(run_oncelog_poll),
    "oncelog-columns": run_oncelog_columns,
    "confluent": run_confluent,
    "confluent-poll": run_confluent_poll,
    "kafkapython": run_kafkapython,
    "kafkapython-iter": run_kafkapython_iter,
    "aiokafka": run_aiokafka,
    "aiokafka-getone": run_aiokafka_getone,
}
PER_RECORD = {"oncelog-poll", "oncelog-poll-prev", "confluent-poll", "kafkapython-iter", "aiokafka-getone"}
# the ratio columns: each client against the reference of its kind (per-record API vs per-record API)
REFERENCES = {"confluent": ("confluent", "confluent-poll"), "kafka-python": ("kafkapython", "kafkapython-iter"),
              "aiokafka": ("aiokafka", "aiokafka-getone")}


def broker_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prefill(bootstrap: str, topic: str, n: int, size: int, compression: str) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "compression.type": compression})
    errors: list[object] = []
    for i in range(n):
        payload = os.urandom(size) if compression == "none" else (b"%08d" % i) * (size // 8) + b"x" * (size % 8)
        while True:
            try:
                p.produce(topic, payload, partition=i % PARTITIONS, on_delivery=lambda e, m: e and errors.append(e))
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0 and not errors, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--isolation", choices=["read_uncommitted", "read_committed"], default="read_uncommitted")
    ap.add_argument("--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none",
                    help="the prefill producer's compression.type (compressed values are repetitive, not random)")
    ap.add_argument("--clients", default=",".join(c for c in CLIENTS if c not in (
        "oncelog-aio-nonumpy", "oncelog-prev", "oncelog-poll-prev")))
    ap.add_argument("--profile", choices=list(CLIENTS), help="run one client once under pyinstrument")
    args = ap.parse_args(argv)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    with tempfile.TemporaryDirectory() as tmp, OncelogBroker(Path(tmp) / "data") as broker:
        topic = f"cc-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, PARTITIONS)
        prefill(broker.bootstrap, topic, args.records, args.size, args.compression)
        for mod in ("oncelog.client", "oncelog.client.aio", "confluent_kafka", "kafka", "aiokafka"):
            __import__(mod)  # imports are not part of a run

        def one(client: str) -> tuple[float, float, float, float]:
            run = Run()
            b0, c0, t0 = broker_cpu(broker.proc.pid), _cpu(), time.perf_counter()
            CLIENTS[client](broker.bootstrap, topic, args.records, args.isolation, run)
            assert run.records == args.records, (client, run.records)
            mb = run.bytes / 1e6
            bcpu = broker_cpu(broker.proc.pid) - b0  # includes the client's close: an upper bound
            return args.records / (run.t_end - t0), (run.cpu_end - c0) / mb, bcpu / mb, run.bytes

        if args.profile:
            from pyinstrument import Profiler

            prof = Profiler(async_mode="disabled")
            with prof:
                rate, cpu, bcpu, _ = one(args.profile)
            print(prof.output_text(unicode=False, color=False, show_all=False))
            print(f"{args.profile}: {rate:,.0f} records/s, {cpu:.4f} client CPU s/MB")
            return 0
        rates: dict[str, list[float]] = {c: [] for c in clients}
        cpus: dict[str, list[float]] = {c: [] for c in clients}
        bcpus: dict[str, list[float]] = {c: [] for c in clients}
        for rnd in range(args.rounds):
            for c in clients:
                rate, cpu, bcpu, nbytes = one(c)
                rates[c].append(rate)
                cpus[c].append(cpu)
                bcpus[c].append(bcpu)
                print(f"round {rnd} {c}: {rate:,.0f} records/s, {cpu:.5f} client CPU s/MB, "
                      f"{bcpu:.4f} broker CPU s/MB ({nbytes:,} B)", file=sys.stderr)
    meta = run_metadata()
    def ref_of(client: str, name: str) -> str:
        return REFERENCES[name][client in PER_RECORD]

    refs = [name for name in REFERENCES if any(ref_of(c, name) in rates for c in rates)]
    print(f"Consume {args.records:,} x {args.size} B records, 8 partitions, manual assign from offset 0, "
          f"{args.isolation}, producer compression {args.compression}, {args.rounds} rounds in turn; "
          f"python {meta['python']}, {meta['cpu_count']} CPUs (shared), oncelog {meta['oncelog_git']}, "
          f"librdkafka {meta['librdkafka']}\n`{meta['command']}`\n")
    head = "".join(f" vs {r} (same kind of API) |" for r in refs)
    print(f"| client | median records/s | runs |{head} client CPU s/MB | broker CPU s/MB |")
    print("|---|---:|---|" + "---:|" * len(refs) + "---:|---:|")
    for c, rs in rates.items():
        ratios = "".join(f" {statistics.median(a / b for a, b in zip(rs, rates[ref_of(c, r)])):.2f}x |"
                         if ref_of(c, r) in rates else " |" for r in refs)
        print(f"| {c} | {statistics.median(rs):,.0f} | {', '.join(f'{r:,.0f}' for r in rs)} |{ratios} "
              f"{statistics.median(cpus[c]):.4f} | {statistics.median(bcpus[c]):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
