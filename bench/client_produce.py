#!/usr/bin/env python3
"""Client produce throughput: oncelog's producer vs confluent-kafka, kafka-python and aiokafka, one broker.

One oncelog broker (``common.OncelogBroker``) for the whole run; every
round runs each client once, in the same order (A B C D E, A B C D E, ...),
each into a fresh 8-partition topic: ``--records`` records of ``--size``
bytes, round-robin over the partitions, ``acks=all``, ``linger.ms=5``, no
compression, idempotent (the default of oncelog and kafka-python; set for
confluent-kafka and aiokafka, whose default is off; ``confluent-default``
runs confluent-kafka at its own default, not idempotent). Every other setting
is the client's default (``batch.size``: 16384 for oncelog, kafka-python and
aiokafka, 1,000,000 for confluent-kafka; ``--same-batch-size N`` sets it for
all of them). Wall time from the first produce to flush() returning with
every record acknowledged, and CPU seconds (utime+stime from /proc) of this
process (the client: every thread, librdkafka's included) and of the
broker process during the run, per MB of record values. Clients:

* ``oncelog``: ``oncelog.client.Producer``, one ``produce()`` per record;
* ``oncelog-batch``: ``Producer.produce_batch`` with 8 lists (one a partition);
* ``oncelog-batch-inline``: ``oncelog-batch`` with no batch compressed in a worker thread
  (``--compression``: every batch compressed on the loop, as before that change);
* ``oncelog-arrow``: ``produce_batch`` with one pyarrow ``binary`` array per partition (made before
  the timed run), encoded from its buffers (``oncelog.client.arrow``);
* ``oncelog-arrow-list``: the same array's ``to_pylist()`` given to ``produce_batch`` (what the
  connector's sink and ``produce_batch`` itself did with Arrow input before);
* ``oncelog-keyed``: ``produce_batch`` with keys and no partition, lists, calls of 10,000 records
  (16-byte keys ``user-%011d`` of random numbers, made before the timed run): the keys' partitions
  by murmur2 (``oncelog.client.partitioner.key_groups``);
* ``oncelog-keyed-arrow``: the same with the values and keys as pyarrow ``binary`` arrays;
* ``confluent``: confluent-kafka ``Producer`` (librdkafka, C), idempotent;
* ``confluent-default``: the same at librdkafka's own default, ``enable.idempotence=false``
  (no sequence numbers, up to 1,000,000 requests in flight per connection);
* ``kafkapython``: kafka-python ``KafkaProducer``;
* ``aiokafka``: aiokafka ``AIOKafkaProducer`` (``await send()`` per record,
  on a fresh asyncio loop).

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
OTHER_BATCH_SIZE: int | None = None  # --same-batch-size: batch.size for confluent, kafka-python and aiokafka


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
        calls = [p.produce_batch(topic, [payload] * per, partition=part) for part in range(PARTITIONS)]
        assert p.flush(120) == 0
        for c in calls:  # BatchFutures (a list of futures before it existed: for before/after runs)
            assert c.done() and c.exception() is None if hasattr(c, "exception") else \
                all(f.done() and f.exception() is None for f in c)
    finally:
        p.close()


_ARROW: dict[tuple[int, bytes], object] = {}  # the arrays of the arrow clients, made once (not timed)


def _arrow_values(per: int, payload: bytes) -> object:
    import pyarrow as pa

    key = (per, payload)
    if key not in _ARROW:
        _ARROW[key] = pa.array([payload] * per, pa.binary())
    return _ARROW[key]


def run_oncelog_arrow(bootstrap: str, topic: str, n: int, payload: bytes, to_list: bool = False) -> None:
    from oncelog.client import Producer

    values = _arrow_values(n // PARTITIONS, payload)
    p = Producer({"bootstrap.servers": bootstrap, **ONCELOG_CONFIG})
    try:
        calls = [p.produce_batch(topic, values.to_pylist() if to_list else values, partition=part)  # type: ignore
                 for part in range(PARTITIONS)]
        assert p.flush(120) == 0
        for c in calls:
            assert c.done() and c.exception() is None
    finally:
        p.close()


def run_oncelog_arrow_list(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    run_oncelog_arrow(bootstrap, topic, n, payload, to_list=True)


_KEYS: dict[int, list[bytes]] = {}  # the keyed clients' keys, made once (not timed)
KEYED_CALL = 10_000  # records per produce_batch call of the keyed clients


def _keys(n: int) -> list[bytes]:
    import random

    if n not in _KEYS:
        rng = random.Random(n)
        _KEYS[n] = [b"user-%011d" % rng.randrange(10 ** 11) for _ in range(n)]
    return _KEYS[n]


_KEYED: dict[tuple[int, bytes, bool], list[tuple[object, object]]] = {}  # their calls' inputs (not timed)


def keyed_inputs(n: int, payload: bytes, arrow: bool) -> list[tuple[object, object]]:
    """(values, keys) of each produce_batch call of the keyed clients, made once before the timed runs."""
    if (n, payload, arrow) not in _KEYED:
        keys = _keys(n)
        calls = []
        for a in range(0, n, KEYED_CALL):
            ks: object = keys[a:a + KEYED_CALL]
            vs: object = [payload] * len(ks)  # type: ignore[arg-type]
            if arrow:
                import pyarrow as pa

                vs, ks = pa.array(vs, pa.binary()), pa.array(ks, pa.binary())
            calls.append((vs, ks))
        _KEYED[(n, payload, arrow)] = calls
    return _KEYED[(n, payload, arrow)]


def run_oncelog_keyed(bootstrap: str, topic: str, n: int, payload: bytes, arrow: bool = False) -> None:
    from oncelog.client import Producer

    calls_in = keyed_inputs(n, payload, arrow)
    p = Producer({"bootstrap.servers": bootstrap, **ONCELOG_CONFIG})
    try:
        calls = [p.produce_batch(topic, vs, keys=ks) for vs, ks in calls_in]
        assert p.flush(120) == 0
        for c in calls:
            assert c.done() and c.exception() is None
    finally:
        p.close()


def run_oncelog_keyed_arrow(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    run_oncelog_keyed(bootstrap, topic, n, payload, arrow=True)


def run_oncelog_batch_inline(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    """``oncelog-batch`` with every batch compressed on the loop (no worker thread: the client before
    large batches were compressed off the loop), for paired runs against ``oncelog-batch``."""
    from oncelog.client.aio import producer as aio_producer

    saved = dict(aio_producer._OFFLOAD_MIN)
    aio_producer._OFFLOAD_MIN.clear()
    try:
        run_oncelog_batch(bootstrap, topic, n, payload)
    finally:
        aio_producer._OFFLOAD_MIN.update(saved)


def run_confluent(bootstrap: str, topic: str, n: int, payload: bytes, idempotent: bool = True) -> None:
    from confluent_kafka import Producer

    # librdkafka's enable.idempotence defaults to false (unlike Java's, ours and kafka-python's):
    # ``confluent`` sets it, so that every client runs with at most 5 requests in flight and sequence
    # numbers; ``confluent-default`` leaves librdkafka's default
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"}
    if idempotent:
        conf["enable.idempotence"] = True
    if OTHER_BATCH_SIZE:
        conf["batch.size"] = OTHER_BATCH_SIZE
    p = Producer(conf)
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


def run_confluent_default(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    run_confluent(bootstrap, topic, n, payload, idempotent=False)


def run_kafkapython(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    from kafka import KafkaProducer

    extra = {"batch_size": OTHER_BATCH_SIZE} if OTHER_BATCH_SIZE else {}
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all", **extra)
    try:
        last = None
        for i in range(n):
            last = p.send(topic, payload, partition=i % PARTITIONS)
        p.flush(120)
        assert last is not None and last.get(30)
    finally:
        p.close(10)


def run_aiokafka(bootstrap: str, topic: str, n: int, payload: bytes) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def main() -> None:
        extra = {"max_batch_size": OTHER_BATCH_SIZE} if OTHER_BATCH_SIZE else {}
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all", enable_idempotence=True,
                             **extra)
        await p.start()
        try:
            send = p.send
            last = None
            for i in range(n):
                last = await send(topic, payload, partition=i % PARTITIONS)
            await p.flush()
            assert last is not None and (await last).offset >= 0
        finally:
            await p.stop()

    asyncio.run(main())


CLIENTS: dict[str, Callable[[str, str, int, bytes], None]] = {
    "oncelog": run_oncelog,
    "oncelog-batch": run_oncelog_batch,
    "oncelog-batch-inline": run_oncelog_batch_inline,
    "oncelog-arrow": run_oncelog_arrow,
    "oncelog-arrow-list": run_oncelog_arrow_list,
    "oncelog-keyed": run_oncelog_keyed,
    "oncelog-keyed-arrow": run_oncelog_keyed_arrow,
    "confluent": run_confluent,
    "confluent-default": run_confluent_default,
    "kafkapython": run_kafkapython,
    "aiokafka": run_aiokafka,
}


def cpu_seconds(pid: int | str = "self") -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    global OTHER_BATCH_SIZE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--batch-size", type=int, help="batch.size for oncelog's producer (default: Kafka's 16384); "
                    "max.request.size becomes 8 x that when larger than 1 MiB")
    ap.add_argument("--same-batch-size", type=int, metavar="N",
                    help="batch.size N for every client (confluent-kafka's default is 1,000,000)")
    ap.add_argument("--compression", default="none", help="compression.type of oncelog's producer (only)")
    ap.add_argument("--compressible", action="store_true",
                    help="JSON-like payloads (about 3x compressible) instead of random bytes")
    ap.add_argument("--profile", choices=list(CLIENTS), help="run one client once under pyinstrument")
    args = ap.parse_args(argv)
    if args.same_batch_size:
        args.batch_size = args.batch_size or args.same_batch_size
        OTHER_BATCH_SIZE = args.same_batch_size
    if args.batch_size:
        ONCELOG_CONFIG["batch.size"] = args.batch_size
        ONCELOG_CONFIG["max.request.size"] = max(1 << 20, PARTITIONS * args.batch_size)
    payload = os.urandom(args.size)
    if args.compressible:
        payload = (b'{"user": "user-00042", "event": "click", "payload": "' + os.urandom(args.size).hex().encode()
                   )[:args.size]
    if args.compression != "none":
        ONCELOG_CONFIG["compression.type"] = args.compression
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    mb = args.records * args.size / 1e6
    with tempfile.TemporaryDirectory() as tmp, OncelogBroker(Path(tmp) / "data") as broker:
        def one(client: str, rnd: int) -> tuple[float, float, float]:
            topic = f"cp-{client}-{rnd}-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, PARTITIONS)
            c0, b0 = cpu_seconds(), cpu_seconds(broker.proc.pid)
            t0 = time.perf_counter()
            CLIENTS[client](broker.bootstrap, topic, args.records, payload)
            dt = time.perf_counter() - t0
            return args.records / dt, (cpu_seconds() - c0) / mb, (cpu_seconds(broker.proc.pid) - b0) / mb

        for mod in ("oncelog.client", "confluent_kafka", "kafka", "aiokafka") + \
                (("pyarrow", "pyarrow.compute", "numpy") if any("arrow" in c for c in clients) else ()):  # imports are not part of a run
            __import__(mod)
        if any("arrow" in c for c in clients):  # pyarrow.compute loads its kernels at the first call
            import pyarrow as pa

            from oncelog.client.arrow import arrow_sections, as_binary

            arrow_sections(as_binary(pa.array([b"warm-up"])), None, [(0, 1)])
        for c in clients:  # the keyed clients' keys and arrays are not part of a run
            if c.startswith("oncelog-keyed"):
                keyed_inputs(args.records, payload, c.endswith("arrow"))
        if args.profile:
            from pyinstrument import Profiler

            prof = Profiler()
            with prof:
                rate, _, _ = one(args.profile, 0)
            print(prof.output_text(unicode=False, color=False, show_all=False))
            print(f"{args.profile}: {rate:,.0f} records/s")
            return 0
        runs: dict[str, list[tuple[float, float, float]]] = {c: [] for c in clients}
        for rnd in range(args.rounds):
            for c in clients:
                runs[c].append(one(c, rnd))
                r, cc, bc = runs[c][-1]
                print(f"round {rnd} {c}: {r:,.0f} records/s, client {cc:.4f} CPU s/MB "
                      f"({cc * args.size:.2f} us/record), broker {bc:.4f} CPU s/MB ({bc * args.size:.2f} us/record)",
                      file=sys.stderr)
    meta = run_metadata()
    print(f"Produce {args.records:,} x {args.size} B records, 8 partitions, acks=all, linger.ms=5, idempotent "
          f"(confluent-default: not), "
          f"{args.rounds} rounds paired ({' '.join(clients)}); oncelog config {ONCELOG_CONFIG}; batch.size of the "
          f"others: {OTHER_BATCH_SIZE or 'their defaults'}; python {meta['python']}, {meta['cpu_count']} CPUs "
          f"(shared), oncelog {meta['oncelog_git']}, librdkafka {meta['librdkafka']}\n`{meta['command']}`\n")
    refs = [r for r in ("confluent", "confluent-default", "kafkapython", "aiokafka", "oncelog-arrow-list",
                        "oncelog-batch-inline")
            if r in runs]

    def ratio(c: str, ref: str) -> str:  # the median of the per-round ratios (pairs run back to back)
        return f"{statistics.median(a[0] / b[0] for a, b in zip(runs[c], runs[ref])):.2f}x"

    print("| client | median records/s | runs | " + " | ".join(f"vs {r}" for r in refs)
          + " | client CPU s/MB | broker CPU s/MB | client CPU us/record |")
    print("|---|---:|---|" + "---:|" * len(refs) + "---:|---:|---:|")
    for c, rs in runs.items():
        med = statistics.median(r[0] for r in rs)
        print(f"| {c} | {med:,.0f} | {', '.join(f'{r[0]:,.0f}' for r in rs)} | "
              + " | ".join(ratio(c, r) for r in refs)
              + f" | {statistics.median(r[1] for r in rs):.4f} | {statistics.median(r[2] for r in rs):.4f} "
              f"| {statistics.median(r[1] for r in rs) * args.size:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
