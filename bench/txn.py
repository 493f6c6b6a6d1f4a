#!/usr/bin/env python3
"""Transactions benchmark: transactional vs idempotent produce, EndTxn and LSO latency.

Three parts, all against one oncelog broker (``EmbeddedBroker``, subprocess
mode, free loopback port) for the whole benchmark:

1. Throughput, paired. confluent-kafka ``Producer``, 1 KiB records, a fresh
   3-partition topic per run. *idempotent*: ``enable.idempotence=true``,
   produce for ``--seconds`` then ``flush()``. *transactional*: the same
   settings plus a ``transactional.id``; ``begin_transaction()`` / produce for
   100 ms / ``commit_transaction()`` in a loop for ``--seconds``. Each round
   runs one idempotent/transactional pair (order alternates between rounds)
   and one idempotent/idempotent pair (A/A, to measure the noise).
2. EndTxn latency: ``commit_transaction()`` per transaction under load (from
   part 1; it includes librdkafka's flush of the transaction's records), the
   same call at light load after an explicit ``flush()``, and the raw EndTxn v3
   round trip with oncelog's protocol client (InitProducerId, then per
   transaction AddPartitionsToTxn v3, Produce v9, EndTxn v3).
3. LSO-advance latency: from ``commit_transaction()`` returning until a
   read_committed consumer (assigned, already polling) has received every
   record of the transaction.

Prints a markdown report on stdout, progress on stderr. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OncelogBroker, run_metadata  # noqa: E402

from oncelog.client.connection import Connection  # noqa: E402
from oncelog.protocol.errors import ErrorCode as E  # noqa: E402
from oncelog.protocol.records import Record, encode_record_batch  # noqa: E402
from oncelog.testing import EmbeddedBroker  # noqa: E402

PARTITIONS = 3
SIZE = 1024
TXN_MS = 100
PRODUCER_CONFIG: dict[str, object] = {
    "acks": "all",
    "linger.ms": 5,
    "compression.type": "none",
    "enable.idempotence": True,
    # librdkafka's default local queue (100,000 messages = 100 MB at 1 KiB) lets the producer
    # run about a second ahead of the broker, so a "100 ms" transaction would hold that much
    # and commit_transaction() would wait for it all. 10,000 (~0.1-0.2 s of broker throughput)
    # keeps transactions near 100 ms of produce plus the drain. Same for both sides.
    "queue.buffering.max.messages": 10_000,
}
BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0"}

PRODUCE, LIST_OFFSETS, INIT_PID, ADD_PARTITIONS, END_TXN = 0, 2, 22, 24, 26


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def create_topic(bootstrap: str, name: str, timeout: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)],
                              operation_timeout=timeout, request_timeout=timeout)
    fut[name].result(timeout=timeout + 5)


def delete_topic(bootstrap: str, name: str, timeout: float = 30.0) -> None:
    """Drop a finished run's topic so every run starts from the same broker state."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive until the result is in
    try:
        admin.delete_topics([name], operation_timeout=timeout,
                            request_timeout=timeout)[name].result(timeout=timeout + 5)
    except Exception as e:  # noqa: BLE001 - cleanup only
        log(f"  (delete topic {name}: {e!r})")


def wait_for_metadata(client: Producer, topic: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            md = client.list_topics(topic, timeout=5).topics.get(topic)
        except KafkaException:
            md = None
        if md is not None and md.error is None and len(md.partitions) == PARTITIONS \
                and all(p.leader >= 0 and p.error is None for p in md.partitions.values()):
            return
        time.sleep(0.05)
    raise TimeoutError(f"topic {topic} not ready after {timeout}s")


def pct(values: list[float], q: float) -> float | None:
    """Percentile q (0-100), linear interpolation between closest ranks."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def fmt(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


# -- part 1: throughput ------------------------------------------------------------------------


@dataclass
class Run:
    side: str  # "idempotent" | "transactional"
    round: int
    pair: str  # "I/T", "T/I" or "A/A"
    position: int  # 0 or 1 inside the pair
    topic: str
    seconds: float | None = None
    records: int = 0
    delivered: int = 0
    errors: int = 0
    commits: int = 0
    commit_s: list[float] = field(default_factory=list)
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def rate(self) -> float | None:
        return self.delivered / self.seconds if self.ok and self.seconds else None


def throughput_run(bootstrap: str, side: str, rnd: int, pair: str, position: int, seconds: float,
                   timeout: float) -> Run:
    topic = f"txnbench-{side[:3]}-{rnd}-{uuid.uuid4().hex[:8]}"
    run = Run(side, rnd, pair, position, topic)
    try:
        create_topic(bootstrap, topic)
    except Exception as e:  # noqa: BLE001
        run.failure = f"create topic: {e!r}"
        return run
    first_error: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            run.delivered += 1
        else:
            run.errors += 1
            if not first_error:
                first_error.append(str(err))

    conf: dict[str, object] = {**PRODUCER_CONFIG, "bootstrap.servers": bootstrap,
                               "message.timeout.ms": int(timeout * 1000), "on_delivery": on_delivery}
    txn = side == "transactional"
    if txn:
        conf["transactional.id"] = f"bench-{uuid.uuid4().hex[:12]}"
    producer = Producer(conf)
    try:
        wait_for_metadata(producer, topic)
        if txn:
            producer.init_transactions(30)
    except Exception as e:  # noqa: BLE001
        run.failure = f"setup: {e!r}"
        return run

    payload = os.urandom(SIZE)
    produce, poll, clock = producer.produce, producer.poll, time.perf_counter
    slice_s = TXN_MS / 1000
    i = 0
    t0 = clock()
    end = t0 + seconds
    try:
        while True:
            now = clock()
            if now >= end:
                break
            if txn:
                producer.begin_transaction()
            stop = min(now + slice_s, end) if not txn else now + slice_s
            while clock() < stop:
                for _ in range(100):  # check the clock every 100 records
                    try:
                        produce(topic, payload, partition=i % PARTITIONS)
                    except BufferError:  # local queue full: serve delivery reports, retry later
                        poll(0.005)
                        break
                    i += 1
                poll(0)
            if txn:
                c0 = clock()
                producer.commit_transaction(timeout)
                run.commit_s.append(clock() - c0)
                run.commits += 1
        remaining = producer.flush(timeout)
    except KafkaException as e:
        run.failure = f"producer error: {e.args[0].str() if e.args else e!r}"
        return run
    run.seconds = clock() - t0
    run.records = i
    if remaining:
        run.failure = f"{remaining} messages undelivered after flush"
    elif run.errors:
        run.failure = f"{run.errors} delivery errors (first: {first_error[0]})"
    elif run.delivered != run.records:
        run.failure = f"{run.delivered} delivery reports for {run.records} records"
    return run


def pair_schedule(rounds: int) -> list[tuple[int, str, list[str]]]:
    """Per round: an idempotent/transactional pair (order alternates) and an A/A pair."""
    out = []
    for r in range(1, rounds + 1):
        if r % 2:
            out.append((r, "I/T", ["idempotent", "transactional"]))
        else:
            out.append((r, "T/I", ["transactional", "idempotent"]))
        out.append((r, "A/A", ["idempotent", "idempotent"]))
    return out


def pair_ratios(runs: list[Run]) -> tuple[list[float], list[float]]:
    """(transactional/idempotent ratios, A/A ratios second/first), ok pairs only."""
    tx_i, a_a = [], []
    for r in sorted({x.round for x in runs}):
        for pair in ("I/T", "T/I", "A/A"):
            rs = sorted((x for x in runs if x.round == r and x.pair == pair), key=lambda x: x.position)
            if len(rs) != 2 or not all(x.rate for x in rs):
                continue
            if pair == "A/A":
                a_a.append(rs[1].rate / rs[0].rate)
            else:
                t = next(x for x in rs if x.side == "transactional")
                i = next(x for x in rs if x.side == "idempotent")
                tx_i.append(t.rate / i.rate)
    return tx_i, a_a


# -- part 2 and 3: latency with confluent-kafka ---------------------------------------------------


@dataclass
class ClientLatency:
    txns: int = 0
    commit_s: list[float] = field(default_factory=list)  # commit_transaction() after flush()
    first_flush_s: list[float] = field(default_factory=list)  # begin + produce + flush() right after a commit
    lso_from_return_s: list[float] = field(default_factory=list)
    lso_from_call_s: list[float] = field(default_factory=list)
    timeouts: int = 0
    failure: str | None = None


def client_latency(bootstrap: str, txns: int, records_per_txn: int, timeout: float,
                   fetch_wait_ms: int | None) -> ClientLatency:
    """Light load: per transaction produce a few records, flush, then time commit_transaction()
    and the arrival of the transaction's records at an already-polling read_committed consumer."""
    out = ClientLatency()
    topic = f"txnbench-lat-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic)
    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": bootstrap,
                         "transactional.id": f"bench-lat-{uuid.uuid4().hex[:12]}",
                         "message.timeout.ms": int(timeout * 1000)})
    cconf: dict[str, object] = {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                                "isolation.level": "read_committed", "enable.auto.commit": False,
                                "enable.partition.eof": False}
    if fetch_wait_ms is not None:
        cconf["fetch.wait.max.ms"] = fetch_wait_ms
    consumer = Consumer(cconf)
    wait_for_metadata(producer, topic)
    producer.init_transactions(30)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])

    lock = threading.Lock()
    seen: dict[int, int] = {}
    done: dict[int, float] = {}
    cv = threading.Condition(lock)
    stop = threading.Event()
    errors: list[str] = []

    def consume() -> None:
        while not stop.is_set():
            msg = consumer.poll(0.05)
            if msg is None:
                continue
            if msg.error():
                errors.append(str(msg.error()))
                continue
            now = time.perf_counter()
            n = int(msg.key())
            with cv:
                seen[n] = seen.get(n, 0) + 1
                if seen[n] == records_per_txn:
                    done[n] = now
                    cv.notify_all()

    th = threading.Thread(target=consume, name="rc-consumer", daemon=True)
    th.start()
    # Warm-up: one committed transaction so the consumer is connected and fetching.
    payload = os.urandom(SIZE)
    try:
        for n in range(-1, txns):
            f0 = time.perf_counter()
            producer.begin_transaction()
            for k in range(records_per_txn):
                producer.produce(topic, payload, key=str(n).encode(), partition=k % PARTITIONS)
            if producer.flush(timeout):
                raise RuntimeError("flush timed out")
            f1 = time.perf_counter()
            time.sleep(0.002)  # let the consumer's current fetch settle (it sees nothing new: not committed)
            c0 = time.perf_counter()
            producer.commit_transaction(timeout)
            c1 = time.perf_counter()
            with cv:
                if not cv.wait_for(lambda: n in done, timeout=10):
                    out.timeouts += 1
                    continue
                t = done[n]
            if n < 0:
                continue
            out.txns += 1
            out.commit_s.append(c1 - c0)
            out.first_flush_s.append(f1 - f0)
            out.lso_from_return_s.append(t - c1)
            out.lso_from_call_s.append(t - c0)
    except Exception as e:  # noqa: BLE001
        out.failure = repr(e)
    finally:
        stop.set()
        th.join(5)
        consumer.close()
    if errors:
        out.failure = (out.failure or "") + f" consumer errors: {errors[:3]}"
    return out


# -- part 2: raw protocol EndTxn round trip -----------------------------------------------------


@dataclass
class RawLatency:
    txns: int = 0
    add_partitions_s: list[float] = field(default_factory=list)
    produce_s: list[float] = field(default_factory=list)
    end_txn_s: list[float] = field(default_factory=list)
    lso_s: list[float] = field(default_factory=list)  # EndTxn response -> LSO past the records (all 3)
    concurrent_retries: int = 0
    failure: str | None = None


def raw_latency(bootstrap: str, txns: int, records_per_partition: int) -> RawLatency:
    out = RawLatency()
    topic = f"txnbench-raw-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic)
    tid = f"bench-raw-{uuid.uuid4().hex[:12]}"
    clock = time.perf_counter
    with Connection(bootstrap, client_id="txn-bench") as conn, \
            Connection(bootstrap, client_id="txn-bench-lso") as lconn:
        r = None
        for _ in range(200):
            r = conn.request(INIT_PID, 4, {"transactional_id": tid, "transaction_timeout": 60_000,
                                           "producer_id": -1, "producer_epoch": -1})
            if r.error_code != E.concurrent_transactions:
                break
            time.sleep(0.01)
        if r is None or r.error_code != 0:
            out.failure = f"InitProducerId: {E(r.error_code) if r else 'no answer'}"
            return out
        pid, epoch = int(r.producer_id), int(r.producer_epoch)
        seq = [0] * PARTITIONS
        value = os.urandom(SIZE)
        parts = list(range(PARTITIONS))
        for n in range(-1, txns):  # n = -1: warm-up (first use of each API/version)
            # AddPartitionsToTxn v3 (retry CONCURRENT_TRANSACTIONS: the previous commit's
            # markers may still be being written, as a client would).
            while True:
                a0 = clock()
                r = conn.request(ADD_PARTITIONS, 3, {
                    "v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
                    "v3_and_below_producer_epoch": epoch,
                    "v3_and_below_topics": [{"name": topic, "partitions": parts}]})
                a1 = clock()
                codes = {int(p.partition_error_code) for t in r.results_by_topic_v3_and_below
                         for p in t.results_by_partition}
                if codes == {int(E.concurrent_transactions)}:
                    out.concurrent_retries += 1
                    time.sleep(0.001)
                    continue
                break
            if codes != {0}:
                out.failure = f"AddPartitionsToTxn: {[E(c) for c in codes]}"
                return out
            pdata = []
            for p in parts:
                batch = encode_record_batch([Record(key=None, value=value)] * records_per_partition,
                                            producer_id=pid, producer_epoch=epoch, base_sequence=seq[p],
                                            is_transactional=True)
                seq[p] += records_per_partition
                pdata.append({"index": p, "records": batch})
            p0 = clock()
            r = conn.request(PRODUCE, 9, {"transactional_id": tid, "acks": -1, "timeout": 10_000,
                                          "topic_data": [{"name": topic, "partition_data": pdata}]})
            p1 = clock()
            prs = r.responses[0].partition_responses
            bad = [E(pr.error_code) for pr in prs if pr.error_code]
            if bad:
                out.failure = f"Produce: {bad}"
                return out
            # read_committed can see the records once the LSO is past the last of them
            need = {int(pr.index): int(pr.base_offset) + records_per_partition for pr in prs}
            e0 = clock()
            r = conn.request(END_TXN, 3, {"transactional_id": tid, "producer_id": pid,
                                          "producer_epoch": epoch, "committed": True})
            e1 = clock()
            if r.error_code != 0:
                out.failure = f"EndTxn: {E(r.error_code)}"
                return out
            # EndTxn is answered once PrepareCommit is durable; the markers follow. Poll the
            # last stable offset (ListOffsets v4, read_committed, latest) on a second connection.
            while need:
                r = lconn.request(LIST_OFFSETS, 4, {"replica_id": -1, "isolation_level": 1, "topics": [{
                    "name": topic, "partitions": [{"partition_index": p, "current_leader_epoch": -1,
                                                   "timestamp": -1} for p in need]}]})
                for lp in r.topics[0].partitions:
                    if lp.error_code == 0 and int(lp.offset) >= need[int(lp.partition_index)]:
                        del need[int(lp.partition_index)]
                if need and clock() - e1 > 10:
                    out.failure = f"LSO not past the records 10 s after EndTxn: {need}"
                    return out
            c1 = clock()
            if n < 0:
                continue
            out.txns += 1
            out.add_partitions_s.append(a1 - a0)
            out.produce_s.append(p1 - p0)
            out.end_txn_s.append(e1 - e0)
            out.lso_s.append(c1 - e1)
    return out


# -- report --------------------------------------------------------------------------------------


def lat_row(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (f"| {name} | {len(ms)} | {fmt(pct(ms, 50), 2)} | {fmt(pct(ms, 99), 2)} | "
            f"{fmt(max(ms) if ms else None, 2)} |")


def render(meta: dict[str, object], runs: list[Run], cl: ClientLatency | None,
           raw: RawLatency | None) -> str:
    out = ["# Transactions benchmark", ""]
    out += [f"- {k}: `{v}`" for k, v in meta.items()]
    out += ["", "## Throughput runs (1 KiB records, 3 partitions)", "",
            "| round | pair | side | seconds | records | records/s | MB/s | commits | ms/txn | status |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        out.append(f"| {r.round} | {r.pair} | {r.side} | {fmt(r.seconds, 2)} | {r.delivered:,} | "
                   f"{fmt(r.rate)} | {fmt(r.rate * SIZE / 1e6 if r.rate else None, 1)} | "
                   f"{r.commits if r.side == 'transactional' else '-'} | "
                   f"{fmt(r.seconds * 1000 / r.commits) if r.commits and r.seconds else '-'} | "
                   f"{'ok' if r.ok else 'FAILED: ' + str(r.failure)} |")
    tx_i, a_a = pair_ratios(runs)
    out += ["", "## Ratios (median of pairs, min-max)", "",
            "| ratio | pairs | median | min | max |", "|---|---:|---:|---:|---:|"]
    for name, vals in (("transactional / idempotent", tx_i), ("A/A idempotent / idempotent", a_a)):
        out.append(f"| {name} | {len(vals)} | {fmt(statistics.median(vals) if vals else None, 3)} | "
                   f"{fmt(min(vals) if vals else None, 3)} | {fmt(max(vals) if vals else None, 3)} |")
    for side in ("idempotent", "transactional"):
        rates = [r.rate for r in runs if r.side == side and r.rate]
        if rates:
            out.append(f"\nmedian {side}: {fmt(statistics.median(rates))} records/s over {len(rates)} runs")
    if tx_i and a_a:
        med = statistics.median(tx_i)
        noise = max(abs(x - 1) for x in a_a)
        if noise >= 0.02:
            verdict = (f"not decided by this run: A/A pairs deviate from 1 by up to {noise * 100:.1f} %, "
                       f"more than the 2 % to resolve, so the overhead is within this machine's noise")
        else:
            verdict = ("met" if med >= 0.98 else "not met") + \
                f" (A/A pairs within {noise * 100:.1f} % of 1)"
        out += ["", f"Overhead (1 - median transactional/idempotent ratio): {(1 - med) * 100:+.1f} %. "
                    f"Goal <= 2 %: {verdict}."]
    out += ["", "## Latency (ms)", "", "| what | n | p50 | p99 | max |", "|---|---:|---:|---:|---:|"]
    commits = [c for r in runs if r.ok for c in r.commit_s]
    if runs:
            out.append(lat_row("commit_transaction() under load (100 ms transactions; includes flushing them)",
                           commits))
    if cl is not None:
        out.append(lat_row("commit_transaction() at light load, after flush()", cl.commit_s))
        out.append(lat_row("next transaction right after the commit was seen: begin_transaction() + "
                           "produce 3 + flush() (AddPartitionsToTxn + Produce)", cl.first_flush_s))
        out.append(lat_row("LSO advance: commit_transaction() return -> read_committed consumer has "
                           "the whole transaction", cl.lso_from_return_s))
        out.append(lat_row("LSO advance: commit_transaction() call -> consumer has it", cl.lso_from_call_s))
    if raw is not None:
        out.append(lat_row("raw AddPartitionsToTxn v3 round trip (3 partitions)", raw.add_partitions_s))
        out.append(lat_row("raw Produce v9 round trip (transactional, acks=-1, 3 partitions)",
                           raw.produce_s))
        out.append(lat_row("raw EndTxn v3 round trip (commit)", raw.end_txn_s))
        out.append(lat_row("raw LSO advance: EndTxn response -> LSO past the records on all 3 "
                           "partitions (ListOffsets read_committed, polled back to back)", raw.lso_s))
    notes = []
    if cl is not None and (cl.failure or cl.timeouts):
        notes.append(f"client latency: failure={cl.failure} timeouts={cl.timeouts}")
    if raw is not None:
        if raw.failure:
            notes.append(f"raw latency: FAILED: {raw.failure}")
        notes.append(f"raw: AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS {raw.concurrent_retries} times")
    if notes:
        out += [""] + [f"- {n}" for n in notes]
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="CI-size run: 2 rounds of 3 s runs, 50 latency transactions")
    p.add_argument("--rounds", type=int, help="rounds; each = one I/T pair + one A/A pair (default 6)")
    p.add_argument("--seconds", type=float, help="seconds per throughput run (default 8)")
    p.add_argument("--latency-txns", type=int, help="transactions per latency part (default 300)")
    p.add_argument("--records-per-txn", type=int, default=3,
                   help="records per latency transaction, spread over the 3 partitions (default 3)")
    p.add_argument("--fetch-wait-ms", type=int, default=None,
                   help="consumer fetch.wait.max.ms for the LSO part (default: librdkafka's, 500)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: throughput,client,raw")
    p.add_argument("--queue-messages", type=int, default=10_000,
                   help="queue.buffering.max.messages for both producers (default 10000)")
    p.add_argument("--timeout", type=float, default=60.0, help="delivery/commit timeout, s (default 60)")
    p.add_argument("--data-root", type=Path, help="parent directory for the broker's temp data dir")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write raw results as JSON")
    p.add_argument("--profile", choices=["transactional", "idempotent"],
                   help="instead of the benchmark: one throughput run of that side (--seconds) against "
                        "a broker under pyinstrument (bench/common.py's OncelogBroker); prints the top "
                        "of the report")
    p.add_argument("--profile-out", type=Path, help="pyinstrument text report path "
                                                    "(default: <tmp>/oncelog-txn-profile-<side>-<time>.txt)")
    args = p.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (2 if quick else 6)
    args.seconds = args.seconds or (3.0 if quick else 8.0)
    args.latency_txns = args.latency_txns or (50 if quick else 300)
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - {"throughput", "client", "raw"}:
        p.error(f"unknown --skip part(s): {args.skip}")
    return args


def run_profile(args: argparse.Namespace, meta: dict[str, object]) -> int:
    side = args.profile
    out = args.profile_out or Path(tempfile.gettempdir()) / \
        f"oncelog-txn-profile-{side}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    log(f"profiling oncelog under pyinstrument ({side}, {args.seconds:g} s) -> {out}")
    with tempfile.TemporaryDirectory(prefix="oncelog-txnbench-", dir=args.data_root) as tmp:
        broker = OncelogBroker(Path(tmp) / "data", profile_out=out)
        try:
            r = throughput_run(broker.bootstrap, side, 1, "profile", 0, args.seconds, args.timeout)
        finally:
            rc = broker.close()
    print(render(meta, [r], None, None))
    if not out.exists():
        print(f"pyinstrument wrote no report (broker exit {rc})")
        return 1
    print(f"\n## pyinstrument report (top): {out}\n\n```")
    print("\n".join(out.read_text().splitlines()[:80]))
    print("```")
    return 0 if r.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    PRODUCER_CONFIG["queue.buffering.max.messages"] = args.queue_messages
    meta = {**run_metadata(), "rounds": args.rounds, "seconds_per_run": args.seconds,
            "latency_txns": args.latency_txns, "records_per_latency_txn": args.records_per_txn,
            "record_size": SIZE, "partitions": PARTITIONS, "txn_ms": TXN_MS,
            "producer": PRODUCER_CONFIG, "consumer_fetch_wait_ms": args.fetch_wait_ms or "default (500)",
            "broker_config": BROKER_CONFIG, "load_avg_at_start": os.getloadavg()}
    if args.profile:
        return run_profile(args, meta)
    runs: list[Run] = []
    cl = raw = None
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="oncelog-txnbench-",
                                                                   dir=args.data_root)))
        broker = stack.enter_context(EmbeddedBroker(data_dir=tmp / "data", log_path=tmp / "broker.log",
                                                    config=dict(BROKER_CONFIG)))
        bootstrap = broker.bootstrap
        assert bootstrap.startswith("127."), bootstrap
        log(f"oncelog at {bootstrap}")
        if "throughput" not in args.skip:
            for rnd, pair, sides in pair_schedule(args.rounds):
                for pos, side in enumerate(sides):
                    log(f"round {rnd} {pair} {side}: {args.seconds:g} s ...")
                    r = throughput_run(bootstrap, side, rnd, pair, pos, args.seconds, args.timeout)
                    delete_topic(bootstrap, r.topic)
                    log(f"  -> {fmt(r.rate)} records/s" + (f", {r.commits} commits" if r.commits else "")
                        if r.ok else f"  -> FAILED: {r.failure}")
                    runs.append(r)
        if "client" not in args.skip:
            log(f"client latency: {args.latency_txns} transactions ...")
            cl = client_latency(bootstrap, args.latency_txns, args.records_per_txn, args.timeout,
                                args.fetch_wait_ms)
        if "raw" not in args.skip:
            log(f"raw EndTxn latency: {args.latency_txns} transactions ...")
            raw = raw_latency(bootstrap, args.latency_txns, max(1, args.records_per_txn // PARTITIONS))
        meta["load_avg_at_end"] = os.getloadavg()
        if not broker.running:
            log("broker died; see its log")
    print(render(meta, runs, cl, raw))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "runs": [asdict(r) for r in runs],
                                         "client_latency": asdict(cl) if cl else None,
                                         "raw_latency": asdict(raw) if raw else None}, indent=2) + "\n")
    failed = any(not r.ok for r in runs) or (cl is not None and (cl.failure or cl.timeouts)) \
        or (raw is not None and raw.failure)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
