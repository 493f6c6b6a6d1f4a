#!/usr/bin/env python3
"""Produce throughput benchmark: confluent-kafka Producer -> oncelog vs librdkafka's mock.

Paired runs (A B A B ...) per record size; one broker per side for the whole
benchmark and a fresh 8-partition topic per run. Wall time is measured from the
first produce() to flush() returning with every delivery report received; a run
with any delivery error (or undelivered message) is reported as failed and left
out of the medians. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from confluent_kafka import KafkaException, Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MockCluster, OncelogBroker, run_metadata  # noqa: E402

PARTITIONS = 8
BASE_CONFIG = {
    "acks": "all",
    "linger.ms": 5,
    "compression.type": "none",
    "enable.idempotence": False,
}


class Broker(Protocol):
    bootstrap: str

    def alive(self) -> bool: ...

    def create_topic(self, name: str, partitions: int) -> None: ...


@dataclass
class Side:
    label: str
    broker: Broker
    config: dict[str, object] = field(default_factory=dict)


@dataclass
class RunResult:
    side: str
    size: int
    round: int
    records: int
    topic: str
    config: dict[str, object]
    seconds: float | None = None
    delivered: int = 0
    errors: int = 0
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def msgs_per_s(self) -> float | None:
        return self.records / self.seconds if self.ok and self.seconds else None

    @property
    def mb_per_s(self) -> float | None:
        rate = self.msgs_per_s
        return rate * self.size / 1e6 if rate is not None else None


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def wait_for_metadata(producer: Producer, topic: str, timeout: float) -> None:
    """Connect and fetch metadata before the clock starts; require all partitions led."""
    deadline = time.monotonic() + timeout
    last = "no metadata"
    while time.monotonic() < deadline:
        try:
            md = producer.list_topics(topic, timeout=5).topics.get(topic)
        except KafkaException as e:
            last = str(e)
        else:
            if md is not None and md.error is None and len(md.partitions) == PARTITIONS \
                    and all(p.leader >= 0 and p.error is None for p in md.partitions.values()):
                return
            last = f"metadata: {md.error if md else 'missing'}, {len(md.partitions) if md else 0} partitions"
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} not ready after {timeout}s ({last})")


def produce_run(side: Side, size: int, rnd: int, records: int, timeout: float,
                roundrobin: bool = True) -> RunResult:
    topic = f"bench-{size}-{rnd}-{uuid.uuid4().hex[:8]}"
    config = {**BASE_CONFIG, **side.config}
    res = RunResult(side.label, size, rnd, records, topic, config)
    if not side.broker.alive():
        res.failure = "broker is not running"
        return res
    try:
        side.broker.create_topic(topic, PARTITIONS)
    except Exception as e:  # noqa: BLE001 - any failure makes the run failed
        res.failure = f"create topic: {e!r}"
        return res

    first_error: list[str] = []
    fatal: list[str] = []

    def on_error(err) -> None:  # client-level errors; a fatal one ends the run
        if err.fatal():
            fatal.append(err.str())

    def on_delivery(err, _msg) -> None:
        if err is None:
            res.delivered += 1
        else:
            res.errors += 1
            if not first_error:
                first_error.append(str(err))

    producer = Producer({
        **config,
        "bootstrap.servers": side.broker.bootstrap,
        "message.timeout.ms": int(timeout * 1000),
        "on_delivery": on_delivery,
        "error_cb": on_error,
    })
    try:
        wait_for_metadata(producer, topic, timeout=30)
    except Exception as e:  # noqa: BLE001
        res.failure = f"metadata: {e!r}"
        return res

    payload = os.urandom(size)
    produce, poll = producer.produce, producer.poll
    # roundrobin: record i goes to partition i % 8 on both brokers, so the
    # request shape does not depend on timing (the default sticky partitioner
    # switches partition every 10 ms and would spread fast and slow runs differently).
    t0 = time.perf_counter()
    try:
        for i in range(records):
            while True:
                try:
                    produce(topic, payload, partition=i % PARTITIONS if roundrobin else -1)
                    break
                except BufferError:  # local queue full: serve delivery reports and retry
                    poll(0.01)
            if i % 1000 == 0:
                poll(0)
        remaining = producer.flush(timeout + 30)
    except KafkaException as e:  # e.g. a fatal error (idempotence unsupported)
        res.failure = f"producer error: {fatal[0] if fatal else e.args[0].str()}"
        return res
    res.seconds = time.perf_counter() - t0

    if remaining:
        res.failure = f"{remaining} messages still undelivered after flush"
    elif res.errors:
        res.failure = f"{res.errors} delivery errors (first: {first_error[0]})"
    elif res.delivered != records:
        res.failure = f"{res.delivered} delivery reports for {records} records"
    return res


def fmt(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def render(meta: dict[str, object], results: list[RunResult], labels: list[str],
           ratio: tuple[str, str] | None = None) -> str:
    out = ["# Produce benchmark", ""]
    out += [f"- {k}: `{v}`" for k, v in meta.items()]
    out += ["", "## Runs", "",
            "| size (B) | round | broker | records | seconds | msg/s | MB/s | status |",
            "|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in results:
        secs = fmt(r.seconds, 3) if r.seconds is not None else "n/a"
        out.append(f"| {r.size} | {r.round} | {r.side} | {r.records:,} | {secs} | "
                   f"{fmt(r.msgs_per_s)} | {fmt(r.mb_per_s, 1)} | {'ok' if r.ok else 'FAILED: ' + r.failure} |")
    out += ["", "## Medians (successful runs only)", ""]
    head = " | ".join(f"{lb} msg/s | {lb} MB/s" for lb in labels)
    ratio_col = f"ratio {ratio[0]} / {ratio[1]}" if ratio else None
    out.append(f"| size (B) | {head} |" + (f" {ratio_col} |" if ratio_col else ""))
    out.append("|---:|" + "---:|" * (2 * len(labels) + (1 if ratio_col else 0)))
    for size in sorted({r.size for r in results}):
        meds = [median([r.msgs_per_s for r in results if r.size == size and r.side == lb])
                for lb in labels]
        cells = " | ".join(f"{fmt(m)} | {fmt(m * size / 1e6 if m else None, 1)}" for m in meds)
        row = f"| {size} | {cells} |"
        if ratio:
            a, b = (meds[labels.index(lb)] for lb in ratio)
            row += f" {fmt(a / b if a and b else None, 3)} |"
        out.append(row)
    out += ["", "MB = 10^6 bytes of record values (keys/headers/protocol overhead not counted)."]
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=200_000, help="records per run (default 200000)")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1024],
                   help="comma-separated record value sizes in bytes (default 100,1024)")
    p.add_argument("--rounds", type=int, default=2, help="paired rounds per size: 2 => A B A B (default 2)")
    p.add_argument("--mode", choices=["plain", "idempotent", "both"], default="plain",
                   help="plain/idempotent: oncelog vs mock with that producer; "
                        "both: oncelog plain vs oncelog idempotent (default plain)")
    p.add_argument("--idempotent", action="store_true", help="shorthand for --mode idempotent")
    p.add_argument("--only", choices=["oncelog", "mock"],
                   help="run a single broker (no ratio); plain/idempotent modes only")
    p.add_argument("--max-in-flight", type=int, default=None,
                   help="max.in.flight.requests.per.connection for every side (idempotent "
                        "producers allow at most 5; set 5 to compare plain and idempotent "
                        "at the same pipelining depth)")
    p.add_argument("--partitioner", choices=["roundrobin", "default"], default="roundrobin",
                   help="roundrobin: record i -> partition i %% 8; default: librdkafka's "
                        "sticky partitioner for null keys (default roundrobin)")
    p.add_argument("--timeout", type=float, default=120.0, help="per-run delivery timeout, s (default 120)")
    p.add_argument("--data-root", type=Path, help="parent directory for oncelog's temp data dir "
                                                  "(default: system temp dir)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write raw results as JSON")
    p.add_argument("--profile", action="store_true",
                   help="instead of the comparison: one oncelog run (first size) under pyinstrument")
    p.add_argument("--profile-out", type=Path, help="pyinstrument text report path "
                                                    "(default: <tmp>/oncelog-produce-profile-<time>.txt)")
    args = p.parse_args(argv)
    if args.idempotent:
        if args.mode == "both":
            p.error("--idempotent conflicts with --mode both")
        args.mode = "idempotent"
    if args.only and args.mode == "both":
        p.error("--only does not apply to --mode both (oncelog only)")
    if args.records <= 0 or args.rounds <= 0 or any(s <= 0 for s in args.sizes):
        p.error("--records, --rounds and --sizes must be positive")
    return args


def run_profile(args: argparse.Namespace, tmp: Path, meta: dict[str, object]) -> int:
    out = args.profile_out or Path(tempfile.gettempdir()) / \
        f"oncelog-produce-profile-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    config = {"enable.idempotence": True} if args.mode != "plain" else {}
    log(f"profiling oncelog under pyinstrument -> {out}")
    broker = OncelogBroker(tmp / "profile-data", profile_out=out)
    try:
        res = produce_run(Side("oncelog (pyinstrument)", broker, config),
                          args.sizes[0], 1, args.records, args.timeout,
                          args.partitioner == "roundrobin")
    finally:
        rc = broker.close()
    print(render(meta, [res], [res.side]))
    print()
    if not out.exists():
        print(f"pyinstrument wrote no report (broker exit {rc}); log tail:\n{broker.log_tail()}")
        return 1
    print(f"## pyinstrument report (top): {out}\n\n```")
    print("\n".join(out.read_text().splitlines()[:60]))
    print("```")
    return 0 if res.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    meta = {**run_metadata(), "mode": args.mode, "records": args.records, "sizes": args.sizes,
            "rounds": args.rounds, "partitions": PARTITIONS, "partitioner": args.partitioner,
            "producer": BASE_CONFIG}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="oncelog-bench-", dir=args.data_root)))
        if args.profile:
            return run_profile(args, tmp, meta)

        idem = {"enable.idempotence": True}
        if args.max_in_flight:
            inflight = {"max.in.flight.requests.per.connection": args.max_in_flight}
            meta["producer"] = {**BASE_CONFIG, **inflight}
            idem = {**idem, **inflight}
        else:
            inflight = {}
        want = {"oncelog", "mock"} if not args.only else {args.only}
        oncelog = stack.enter_context(OncelogBroker(tmp / "data")) if "oncelog" in want else None
        mock = stack.enter_context(MockCluster()) if "mock" in want else None
        if mock:
            meta["mock_librdkafka"] = mock.version
        if args.mode == "both":
            sides = [Side("oncelog plain", oncelog, dict(inflight)), Side("oncelog idempotent", oncelog, idem)]
        else:
            extra = idem if args.mode == "idempotent" else dict(inflight)
            sides = [s for s in (Side("oncelog", oncelog, extra), Side("mock", mock, extra))
                     if s.broker is not None]

        results: list[RunResult] = []
        for size in args.sizes:
            for rnd in range(1, args.rounds + 1):
                for side in sides:
                    log(f"size={size} round={rnd} {side.label}: {args.records} records ...")
                    r = produce_run(side, size, rnd, args.records, args.timeout,
                                    args.partitioner == "roundrobin")
                    log(f"  -> {fmt(r.msgs_per_s)} msg/s" if r.ok else f"  -> FAILED: {r.failure}")
                    results.append(r)

    labels = [s.label for s in sides]
    ratio = None
    if len(sides) == 2:  # thing under test / baseline
        ratio = (labels[1], labels[0]) if args.mode == "both" else (labels[0], labels[1])
    print(render(meta, results, labels, ratio))
    if args.json:
        rows = [{**asdict(r), "msgs_per_s": r.msgs_per_s, "mb_per_s": r.mb_per_s} for r in results]
        args.json.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:  # a broker failed to start
        log(f"error: {e}")
        sys.exit(2)
