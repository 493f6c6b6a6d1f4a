#!/usr/bin/env python3
"""Exactly-once copy: oncelog's ``TransactSession`` vs a confluent-kafka copier written the Java way.

One oncelog broker (``common.OncelogBroker``); an 8-partition input topic of
``--records`` keyed records of ``--size`` bytes, seeded once. Every round
runs each copier once, in the same order (paired: A B C, A B C, ...), each
into a fresh output topic with a fresh group, until it has consumed the whole
input. Wall time from the copier's construction (so the group join counts)
to its last commit, and from its first record to its last commit (the copy
itself: the first includes the group join, about 3 s with the broker's
default ``group.initial.rebalance.delay.ms``). Copiers:

* ``session``: one blocking ``oncelog.client.TransactSession``: poll(500) ->
  ``produce_many`` -> ``end(commit=True)``;
* ``confluent-eos``: confluent-kafka ``Consumer`` (subscribe, read_committed,
  no auto commit) + transactional ``Producer``: consume(500) -> begin ->
  produce -> ``send_offsets_to_transaction`` -> commit (Kafka's
  ``TransactionalMessageCopier``);
* ``confluent-alo``: the same consumer and an idempotent producer, at least
  once: consume(500) -> produce -> flush -> commit offsets;
* ``oncelog-alo``: the same at-least-once loop on oncelog's own client (the
  blocking ``oncelog.client.Consumer`` subscribed in the group, read_committed,
  no auto commit, + an idempotent ``oncelog.client.Producer``): the issue's
  denominator ("the at-least-once copy with the same client").

CPU: user + system seconds of this process (every copier runs in it, with
its client threads) and of the broker process, from ``/proc/<pid>/stat``,
per copied record: robust to the load of a shared machine.

Usage: ``python bench/session_copy.py --rounds 5 --records 20000 --size 512``.
Prints markdown tables (medians; ratios of each round's pair, then their median).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OncelogBroker, run_metadata  # noqa: E402

PARTITIONS = 8
BATCH = 500
ONCELOG_EXTRA: dict[str, object] = {}  # --batch-size: producer settings of both oncelog copiers
ALO_CONSUMER_EXTRA: dict[str, object] = {}  # --alo-fetch-wait-ms


def seed(bootstrap: str, topic: str, n: int, size: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    pad = b"x" * size
    for i in range(n):
        p.produce(topic, key=b"%08d" % i, value=pad, partition=i % PARTITIONS)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def cpu_seconds(pid: int | str = "self") -> float:
    """utime + stime of a process (all its threads), in seconds, from /proc."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_session(bootstrap: str, inp: str, out: str, n: int) -> float:
    from oncelog.client import TransactSession

    conf = {"bootstrap.servers": bootstrap, "group.id": f"b-{out}", "auto.offset.reset": "earliest",
            "linger.ms": 5, **ONCELOG_EXTRA}
    with TransactSession(conf, [inp]) as s:
        seen, first = 0, 0.0
        while seen < n:
            recs = s.poll(1.0, BATCH)
            first = first or (time.monotonic() if recs else 0.0)
            s.produce_many({"topic": out, "key": m.key, "value": m.value, "partition": m.partition} for m in recs)
            committed = s.end(commit=True)
            if committed:
                seen += len(recs)
        return first


def _confluent_consumer(bootstrap: str, inp: str, group: str):  # noqa: ANN202
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    c.subscribe([inp])
    return c


def run_confluent_eos(bootstrap: str, inp: str, out: str, n: int) -> float:
    from confluent_kafka import Producer

    c = _confluent_consumer(bootstrap, inp, f"b-{out}")
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"b-{out}", "linger.ms": 5})
    p.init_transactions(30)
    seen, first = 0, 0.0
    try:
        while seen < n:
            msgs = [m for m in c.consume(BATCH, 1.0) if not m.error()]
            if not msgs:
                continue
            first = first or time.monotonic()
            p.begin_transaction()
            for m in msgs:
                p.produce(out, key=m.key(), value=m.value(), partition=m.partition())
            p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
            seen += len(msgs)
    finally:
        c.close()
    return first


def run_confluent_alo(bootstrap: str, inp: str, out: str, n: int) -> float:
    from confluent_kafka import Producer

    c = _confluent_consumer(bootstrap, inp, f"b-{out}")
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    seen, first = 0, 0.0
    try:
        while seen < n:
            msgs = [m for m in c.consume(BATCH, 1.0) if not m.error()]
            if not msgs:
                continue
            first = first or time.monotonic()
            for m in msgs:
                p.produce(out, key=m.key(), value=m.value(), partition=m.partition())
            assert p.flush(30) == 0
            c.commit(asynchronous=False)
            seen += len(msgs)
    finally:
        c.close()
    return first


def run_oncelog_alo(bootstrap: str, inp: str, out: str, n: int) -> float:
    from oncelog.client import Consumer, Producer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"b-{out}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "isolation.level": "read_committed", **ALO_CONSUMER_EXTRA})
    c.subscribe([inp])
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **ONCELOG_EXTRA})
    seen, first = 0, 0.0
    try:
        while seen < n:
            msgs = c.consume(BATCH, 1.0)
            if not msgs:
                continue
            first = first or time.monotonic()
            for m in msgs:
                p.produce(out, m.value, key=m.key, partition=m.partition)
            assert p.flush(30) == 0
            c.commit()
            seen += len(msgs)
    finally:
        c.close()
        p.close()
    return first


COPIERS = {"session": run_session, "oncelog-alo": run_oncelog_alo, "confluent-eos": run_confluent_eos,
           "confluent-alo": run_confluent_alo}
BASE = {"session": "oncelog-alo", "oncelog-alo": "oncelog-alo", "confluent-eos": "confluent-alo",
        "confluent-alo": "confluent-alo"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--copiers", default=",".join(COPIERS))
    ap.add_argument("--alo-fetch-wait-ms", type=int,
                    help="fetch.max.wait.ms of the oncelog-alo consumer (default 500): its OffsetCommit shares the "
                         "connection with Fetch and can wait behind a held one")
    ap.add_argument("--batch-size", type=int, help="batch.size of the oncelog copiers' producer (default: Kafka's "
                                                      "16384; librdkafka's is 1000000)")
    a = ap.parse_args()
    names = [x for x in a.copiers.split(",") if x]
    if a.batch_size:
        ONCELOG_EXTRA["batch.size"] = a.batch_size
    if a.alo_fetch_wait_ms is not None:
        ALO_CONSUMER_EXTRA["fetch.max.wait.ms"] = a.alo_fetch_wait_ms
    import confluent_kafka  # noqa: F401 - imported before the first round: not in its CPU figures
    import oncelog.client  # noqa: F401
    results: dict[str, list[float]] = {k: [] for k in names}
    copy: dict[str, list[float]] = {k: [] for k in names}
    cpu_client: dict[str, list[float]] = {k: [] for k in names}
    cpu_broker: dict[str, list[float]] = {k: [] for k in names}
    with tempfile.TemporaryDirectory() as d, OncelogBroker(Path(d) / "data") as broker:
        inp = f"in-{uuid.uuid4().hex[:8]}"
        broker.create_topic(inp, PARTITIONS)
        seed(broker.bootstrap, inp, a.records, a.size)
        for r in range(a.rounds):
            for name in names:
                out = f"out-{name}-{r}-{uuid.uuid4().hex[:6]}"
                broker.create_topic(out, PARTITIONS)
                c0, b0 = cpu_seconds(), cpu_seconds(broker.proc.pid)
                t0 = time.monotonic()
                first = COPIERS[name](broker.bootstrap, inp, out, a.records)
                t1 = time.monotonic()
                c1, b1 = cpu_seconds(), cpu_seconds(broker.proc.pid)
                rate = a.records / (t1 - t0)
                results[name].append(rate)
                copy[name].append(a.records / (t1 - first))
                cpu_client[name].append((c1 - c0) / a.records * 1e6)
                cpu_broker[name].append((b1 - b0) / a.records * 1e6)
                print(f"round {r + 1} {name}: {rate:,.0f} records/s, copy {copy[name][-1]:,.0f}, "
                      f"cpu/record client {cpu_client[name][-1]:.0f} us broker {cpu_broker[name][-1]:.0f} us",
                      file=sys.stderr)
    meta = run_metadata()
    print(f"Exactly-once copy of {a.records:,} x {a.size} B records, {PARTITIONS} partitions, batches of {BATCH}, "
          f"{a.rounds} rounds paired; python {meta['python']}, {meta['cpu_count']} CPUs, oncelog "
          f"{meta['oncelog_git']}, librdkafka {meta['librdkafka']}")
    print(f"`{meta['command']}`\n")
    for title, res in (("with the group join", results), ("copy only (first record to last commit)", copy)):
        print(f"\n{title}:\n\n| copier | median records/s | runs | vs at-least-once, same client "
              f"(median of paired ratios) | vs confluent-eos |\n|---|---:|---|---:|---:|")
        for name in names:
            med = statistics.median(res[name])
            cols = []
            for base in (BASE[name], "confluent-eos"):
                if base in res and res[base]:
                    cols.append(f"{statistics.median(x / y for x, y in zip(res[name], res[base])):.2f}x ({base})")
                else:
                    cols.append("-")
            print(f"| {name} | {med:,.0f} | {', '.join(f'{x:,.0f}' for x in res[name])} | {cols[0]} | {cols[1]} |")
    print("\nCPU per copied record (median over rounds, microseconds; includes the group join):\n\n"
          "| copier | client process | broker process |\n|---|---:|---:|")
    for name in names:
        print(f"| {name} | {statistics.median(cpu_client[name]):.0f} | {statistics.median(cpu_broker[name]):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
