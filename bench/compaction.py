#!/usr/bin/env python3
"""Compaction benchmark: produce and fetch latency while the log cleaner runs, paired
against the same load without it, and the cleaner's throughput.

Each run starts a fresh broker (``EmbeddedBroker``, subprocess, durable defaults,
``log.cleaner.backoff.ms=100``) and fills a compacted topic ``kv`` with
``--prefill-mb`` MB of 1 KiB keyed records over ``--keys`` keys
(``segment.bytes`` 1 MiB) while cleaning cannot start
(``min.cleanable.dirty.ratio=1``: no ratio is above it). Then, for
``--seconds``, a steady load runs on another topic: a producer at ``--rate``
records/s (1 KiB, ``acks=all``, ``linger.ms=1``) and a consumer reading them;
produce latency is send -> delivery report, fetch latency is send -> receipt
by the consumer. In the *cleaning* run, the load starts together with an
IncrementalAlterConfigs that sets ``min.cleanable.dirty.ratio=0.01`` on ``kv``,
so the cleaner works through the whole prefill during the window; in the
*idle* run nothing is altered. Runs alternate idle/cleaning for ``--rounds``
pairs. The cleaner's throughput comes from its per-pass log lines (bytes read
for the map and the copy, over the pass's duration).

Prints a markdown report on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from oncelog.testing import EmbeddedBroker

EXTRA: dict[str, str] = {}
PASS_RE = re.compile(r"compaction pass done: .* read (\d+) bytes .* longest in-loop swap step ([\d.]+) ms, ([\d.]+) s$", re.M)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def prefill(bootstrap: str, mb: int, keys: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    value = b"v" * 1000
    for i in range(mb * 1024):
        while True:
            try:
                p.produce("kv", key=b"key-%06d" % (i % keys), value=value)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def run(clean: bool, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-compaction-") as tmp:
        log_path = Path(tmp) / "broker.log"
        b = EmbeddedBroker(data_dir=Path(tmp) / "data", log_path=log_path,
                           config={"log.cleaner.backoff.ms": "100", **EXTRA}).start()
        try:
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            fs = admin.create_topics([
                NewTopic("kv", 1, 1, config={"cleanup.policy": "compact", "segment.bytes": str(1 << 20),
                                             "min.cleanable.dirty.ratio": "1"}),
                NewTopic("load", 1, 1),
            ])
            for f in fs.values():
                f.result(20)
            t0 = time.monotonic()
            prefill(b.bootstrap, args.prefill_mb, args.keys)
            print(f"  prefill {args.prefill_mb} MB in {time.monotonic() - t0:.1f} s", file=sys.stderr)
            produce_lat: list[float] = []
            fetch_lat: list[float] = []
            stop = threading.Event()

            def consume() -> None:
                c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "bench", "fetch.wait.max.ms": 10,
                              "enable.auto.commit": False})
                c.assign([TopicPartition("load", 0, 0)])
                while not stop.is_set():
                    for m in c.consume(500, 0.05):
                        if not m.error():
                            fetch_lat.append(time.time() - float(m.value()[:20]))
                c.close()

            reader = threading.Thread(target=consume)
            reader.start()
            p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 1, "acks": "all"})
            if clean:
                res = ConfigResource(ConfigResource.Type.TOPIC, "kv", incremental_configs=[
                    ConfigEntry("min.cleanable.dirty.ratio", "0.01", incremental_operation=AlterConfigOpType.SET)])
                admin.incremental_alter_configs([res])[res].result(20)
            start = time.monotonic()
            n = 0
            pad = b"x" * 1004
            while time.monotonic() - start < args.seconds:
                due = start + n / args.rate
                now = time.monotonic()
                if due > now:
                    time.sleep(min(due - now, 0.005))
                    p.poll(0)
                    continue
                sent = time.monotonic()
                p.produce("load", value=b"%-20.6f" % time.time() + pad,
                          on_delivery=lambda err, _m, s=sent: produce_lat.append(time.monotonic() - s))
                n += 1
                p.poll(0)
            p.flush(30)
            time.sleep(0.5)
            stop.set()
            reader.join()
            passes = PASS_RE.findall(log_path.read_text())
            cleaned = sum(int(x) for x, _, _ in passes)
            secs = sum(float(s) for _, _, s in passes)
            install_ms = max((float(ms) for _, ms, _ in passes), default=0.0)
            return {
                "produced": n,
                "produce_p50_ms": pct(produce_lat, 50) * 1000,
                "produce_p99_ms": pct(produce_lat, 99) * 1000,
                "fetch_p50_ms": pct(fetch_lat, 50) * 1000,
                "fetch_p99_ms": pct(fetch_lat, 99) * 1000,
                "cleaned_mb": cleaned / 1e6,
                "cleaner_mb_s": cleaned / secs / 1e6 if secs else 0.0,
                "passes": len(passes),
                "clean_s": secs,
                "install_ms": install_ms,
            }
        finally:
            b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill-mb", type=int, default=40)
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--io-max-bytes-per-second", type=float, default=None,
                    help="log.cleaner.io.max.bytes.per.second for the broker (default: Kafka's, unlimited)")
    args = ap.parse_args()
    if args.io_max_bytes_per_second is not None:
        EXTRA["log.cleaner.io.max.bytes.per.second"] = str(args.io_max_bytes_per_second)
    rows = []
    for r in range(args.rounds):
        for clean in ((False, True) if r % 2 == 0 else (True, False)):
            print(f"round {r + 1}: {'cleaning' if clean else 'idle'}", file=sys.stderr)
            rows.append((clean, run(clean, args)))
            print(f"  {rows[-1][1]}", file=sys.stderr)
    print(f"prefill {args.prefill_mb} MB over {args.keys} keys, load {args.rate} records/s of 1 KiB for "
          f"{args.seconds:g} s, {args.rounds} pairs\n")
    print("| run | cleaner | produce p50 ms | produce p99 ms | fetch p50 ms | fetch p99 ms | cleaned MB | cleaner MB/s "
          "| cleaning s | longest in-loop swap step ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, (clean, m) in enumerate(rows):
        print(f"| {i + 1} | {'running' if clean else 'idle'} | {m['produce_p50_ms']:.1f} | {m['produce_p99_ms']:.1f} | "
              f"{m['fetch_p50_ms']:.1f} | {m['fetch_p99_ms']:.1f} | {m['cleaned_mb']:.1f} | {m['cleaner_mb_s']:.1f} | "
              f"{m['clean_s']:.1f} | {m['install_ms']:.1f} |")
    for key in ("produce_p99_ms", "fetch_p99_ms"):
        idle = statistics.median(m[key] for c, m in rows if not c)
        busy = statistics.median(m[key] for c, m in rows if c)
        print(f"\nmedian {key}: idle {idle:.1f}, cleaning {busy:.1f} (ratio {busy / idle:.2f})")


if __name__ == "__main__":
    main()
