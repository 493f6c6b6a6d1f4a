#!/usr/bin/env python3
"""Client produce throughput: oncelog's producer vs confluent-kafka vs kafka-python, one broker.

One oncelog broker (``common.OncelogBroker``) for the whole run; every
round runs each client once, in the same order (A B C D, A B C D, ...), each
into a fresh 8-partition topic: ``--records`` records of ``--size`` bytes,
round-robin over the partitions, ``acks=all``, ``linger.ms=5``, no
compression, each client with its default idempotence (on for all three).
Wall time from the first produce to flush() returning with every record
acknowledged. Clients:

* ``oncelog``: ``oncelog.client.Producer``, one ``produce()`` per record;
* ``oncelog-batch``: ``Producer.produce_batch`` with 8 lists (one a partition);
* ``confluent``: confluent-kafka ``Producer`` (librdkafka, C);
* ``kafkapython``: kafka-python ``KafkaProducer``.

Usage: ``python bench/client_produce.py --rounds 3 --records 50000 --size 1024``
(``--profile oncelog`` runs only our per-record client under pyinstrument and
prints its profile). Prints a markdown table (median records/s per client and
the ratio to confluent-kafka).
"""

from __future__ import annotations

import argparse
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
ONCELOG_CONFIG: dict[str, object] = {"linger.ms": 5}  # --batch-size adds batch.size (and max.request.size)


def run_oncelog(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    from oncelog.client import Producer

    p = Producer({"bootstrap.servers": bootstrap, **ONCELOG_CONFIG})
    try:
        produce = p.produce
        for i in range(n):
            produce(topic, payload, partition=i % PARTITIONS)
        assert p.flush(120) == 0
    finally:
        p.close()


def run_oncelog_batch(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    from oncelog.client import Producer

    p = Producer({"bootstrap.servers": bootstrap, **ONCELOG_CONFIG})
    try:
        per = n // PARTITIONS
        futs = []
        for part in range(PARTITIONS):
            futs.extend(p.produce_batch(topic, [payload] * per, partition=part))
        assert p.flush(120) == 0
        assert all(f.done() and f.exception() is None for f in futs)
    finally:
        p.close()


def run_confluent(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    errors = []
    p.produce(topic, b"warm-up", partition=0, on_delivery=lambda e, m: e and errors.append(e))
    p.flush(30)
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(120) == 0 and not errors


def run_kafkapython(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    try:
        last = None
        for i in range(n):
            last = p.send(topic, payload, partition=i % PARTITIONS)
        p.flush(120)
        assert last is not None and last.get(30)
    finally:
        p.close(10)


CLIENTS: dict[str, Callable[[str, str, int, bytes], None]] = {
    "oncelog": run_oncelog,
    "oncelog-batch": run_oncelog_batch,
    "confluent": run_confluent,
    "kafkapython": run_kafkapython,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--batch-size", type=int, help="batch.size for oncelog's producer (default: Kafka's 16384); "
                    "max.request.size becomes 8 x that when larger than 1 MiB")
    ap.add_argument("--profile", choices=list(CLIENTS), help="run one client once under pyinstrument")
    args = ap.parse_args(argv)
    if args.batch_size:
        ONCELOG_CONFIG["batch.size"] = args.batch_size
        ONCELOG_CONFIG["max.request.size"] = max(1 << 20, PARTITIONS * args.batch_size)
    payload = os.urandom(args.size)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    with tempfile.TemporaryDirectory() as tmp, OncelogBroker(Path(tmp) / "data") as broker:
        def one(client: str, rnd: int) -> float:
            topic = f"cp-{client}-{rnd}-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, PARTITIONS)
            t0 = time.perf_counter()
            CLIENTS[client](broker.bootstrap, topic, args.records, payload)
            return args.records / (time.perf_counter() - t0)

        for mod in ("oncelog.client", "confluent_kafka", "kafka"):  # imports are not part of a run
            __import__(mod)
        if args.profile:
            from pyinstrument import Profiler

            prof = Profiler()
            with prof:
                rate = one(args.profile, 0)
            print(prof.output_text(unicode=False, color=False, show_all=False))
            print(f"{args.profile}: {rate:,.0f} records/s")
            return 0
        rates: dict[str, list[float]] = {c: [] for c in clients}
        for rnd in range(args.rounds):
            for c in clients:
                rates[c].append(one(c, rnd))
                print(f"round {rnd} {c}: {rates[c][-1]:,.0f} records/s", file=sys.stderr)
    meta = run_metadata()
    ref = statistics.median(rates["confluent"]) if "confluent" in rates else None
    print(f"Produce {args.records:,} x {args.size} B records, 8 partitions, acks=all, linger.ms=5, idempotent "
          f"(each client's default), {args.rounds} rounds A B C D; oncelog config {ONCELOG_CONFIG}; "
          f"python {meta['python']}, {meta['cpu_count']} CPUs, oncelog {meta['oncelog_git']}, "
          f"librdkafka {meta['librdkafka']}\n`{meta['command']}`\n")
    print("| client | median records/s | runs | vs confluent-kafka |")
    print("|---|---:|---|---:|")
    for c, rs in rates.items():
        med = statistics.median(rs)
        ratio = f"{med / ref:.2f}x" if ref else "n/a"
        print(f"| {c} | {med:,.0f} | {', '.join(f'{r:,.0f}' for r in rs)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
