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

Two probes separate the causes of a latency jump, in both kinds of run: a
*disk* probe (a thread appending 4 KiB to a file in the broker's data
directory and ``fdatasync``-ing it every 10 ms: what a group commit waits for)
and a *broker* probe (a raw ApiVersions round trip every 10 ms: the event
loop's and the broker process's scheduling delay, no disk). CPU seconds of the
broker, the cleaner process and this process over the window come from
/proc/<pid>/stat.

Each pass's phases (map, copy, sync, commit, install, finish) and the event
loop's worst lag during it come from the pass's log line; ``--keep-logs DIR``
keeps every run's broker log. Prints a markdown report on stdout (with the
median over pairs of running/idle), progress and any ``fdatasync`` of the disk
probe slower than 100 ms (with its time, to match against the logs) on stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import struct
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
PHASES_RE = re.compile(r"phases: map ([\d.]+) s, copy ([\d.]+) s, sync ([\d.]+) s \(throttled [\d.]+ s\), "
                       r"commit ([\d.]+) s, install ([\d.]+) s, finish ([\d.]+) s; event-loop lag max ([\d.]+) ms")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """Child processes of every thread of ``pid``."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def disk_probe(directory: Path, stop: threading.Event, out: list[float]) -> None:
    """fdatasync latency of a small append on the broker's file system, every 10 ms."""
    fd = os.open(directory / "fsync-probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        block = b"p" * 4096
        while not stop.wait(0.01):
            t = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            out.append(time.perf_counter() - t)
            if out[-1] > 0.1:
                ts = time.time()
                print(f"  slow fdatasync: {out[-1] * 1000:.0f} ms, ended at "
                      f"{time.strftime('%H:%M:%S', time.gmtime(ts))}.{int(ts % 1 * 1000):03d}", file=sys.stderr)
    finally:
        os.close(fd)


def broker_probe(host: str, port: int, stop: threading.Event, out: list[float]) -> None:
    """Round trip of an ApiVersions v0 request, every 10 ms (no disk involved)."""
    req = struct.pack(">hhih", 18, 0, 1, 5) + b"probe"
    req = struct.pack(">i", len(req)) + req
    with socket.create_connection((host, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while not stop.wait(0.01):
            t = time.perf_counter()
            sock.sendall(req)
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            sock.recv(size, socket.MSG_WAITALL)
            out.append(time.perf_counter() - t)


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
            disk_lat: list[float] = []
            loop_lat: list[float] = []
            probes = [threading.Thread(target=disk_probe, args=(Path(tmp), stop, disk_lat)),
                      threading.Thread(target=broker_probe, args=(b.host, b.port, stop, loop_lat))]
            for t in probes:
                t.start()
            assert b.proc is not None
            pids = [b.proc.pid, *children(b.proc.pid)]  # the cleaner process runs from the first compacted topic
            cpu0 = {pid: cpu_seconds(pid) for pid in pids}
            me0 = time.process_time()
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
            cpu = {pid: cpu_seconds(pid) - cpu0[pid] for pid in pids}
            me = time.process_time() - me0
            stop.set()
            reader.join()
            for t in probes:
                t.join()
            if args.keep_logs:
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                (Path(args.keep_logs) / f"broker-{'cleaning' if clean else 'idle'}-{time.time():.0f}.log").write_text(
                    log_path.read_text())
            passes = PASS_RE.findall(log_path.read_text())
            cleaned = sum(int(x) for x, _, _ in passes)
            secs = sum(float(s) for _, _, s in passes)
            install_ms = max((float(ms) for _, ms, _ in passes), default=0.0)
            phases = [tuple(float(x) for x in m) for m in PHASES_RE.findall(log_path.read_text())]
            phase_sum = [sum(ph[i] for ph in phases) for i in range(6)]
            loop_lag_ms = max((ph[6] for ph in phases), default=0.0)
            return {
                "produced": n,
                "produce_p50_ms": pct(produce_lat, 50) * 1000,
                "produce_p99_ms": pct(produce_lat, 99) * 1000,
                "produce_p999_ms": pct(produce_lat, 99.9) * 1000,
                "fetch_p50_ms": pct(fetch_lat, 50) * 1000,
                "fetch_p99_ms": pct(fetch_lat, 99) * 1000,
                "fetch_p999_ms": pct(fetch_lat, 99.9) * 1000,
                "disk_p50_ms": pct(disk_lat, 50) * 1000,
                "disk_p99_ms": pct(disk_lat, 99) * 1000,
                "disk_max_ms": max(disk_lat, default=0.0) * 1000,
                "broker_rtt_p50_ms": pct(loop_lat, 50) * 1000,
                "broker_rtt_p99_ms": pct(loop_lat, 99) * 1000,
                "broker_rtt_max_ms": max(loop_lat, default=0.0) * 1000,
                "cpu_broker_s": cpu[pids[0]],
                "cpu_cleaner_s": sum(v for pid, v in cpu.items() if pid != pids[0]),
                "cpu_bench_s": me,
                "load1": os.getloadavg()[0],
                "cleaned_mb": cleaned / 1e6,
                "cleaner_mb_s": cleaned / secs / 1e6 if secs else 0.0,
                "passes": len(passes),
                "clean_s": secs,
                "install_ms": install_ms,
                "phases_s": "/".join(f"{x:.2f}" for x in phase_sum),
                "loop_lag_ms": loop_lag_ms,
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
    ap.add_argument("--keep-logs", metavar="DIR", help="copy each run's broker log there")
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
    print("| run | cleaner | produce p50 / p99 / p99.9 ms | fetch p50 / p99 / p99.9 ms | disk fdatasync p50 / p99 / max ms "
          "| broker RTT p50 / p99 / max ms | CPU s broker / cleaner / bench | load | cleaned MB | cleaner MB/s "
          "| longest in-loop swap step ms | loop lag max ms (pass) | phases s: map/copy/sync/commit/install/finish |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, (clean, m) in enumerate(rows):
        print(f"| {i + 1} | {'running' if clean else 'idle'} "
              f"| {m['produce_p50_ms']:.1f} / {m['produce_p99_ms']:.1f} / {m['produce_p999_ms']:.1f} "
              f"| {m['fetch_p50_ms']:.1f} / {m['fetch_p99_ms']:.1f} / {m['fetch_p999_ms']:.1f} "
              f"| {m['disk_p50_ms']:.1f} / {m['disk_p99_ms']:.1f} / {m['disk_max_ms']:.1f} "
              f"| {m['broker_rtt_p50_ms']:.1f} / {m['broker_rtt_p99_ms']:.1f} / {m['broker_rtt_max_ms']:.1f} "
              f"| {m['cpu_broker_s']:.2f} / {m['cpu_cleaner_s']:.2f} / {m['cpu_bench_s']:.2f} | {m['load1']:.1f} "
              f"| {m['cleaned_mb']:.1f} | {m['cleaner_mb_s']:.1f} | {m['install_ms']:.1f} "
              f"| {m['loop_lag_ms']:.1f} | {m['phases_s']} |")
    pairs = [(rows[i][1], rows[i + 1][1]) if not rows[i][0] else (rows[i + 1][1], rows[i][1])
             for i in range(0, len(rows) - 1, 2)]
    print()
    for key in ("produce_p50_ms", "produce_p99_ms", "produce_p999_ms", "fetch_p50_ms", "fetch_p99_ms",
                "fetch_p999_ms", "disk_p99_ms", "broker_rtt_p99_ms", "cpu_broker_s"):
        idle = statistics.median(a[key] for a, _b in pairs)
        busy = statistics.median(b_[key] for _a, b_ in pairs)
        ratio = statistics.median(b_[key] / a[key] if a[key] else float("nan") for a, b_ in pairs)
        print(f"- {key}: idle {idle:.2f}, cleaning {busy:.2f}, median of paired ratios {ratio:.2f}")

if __name__ == "__main__":
    main()
