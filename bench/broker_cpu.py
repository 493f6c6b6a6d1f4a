#!/usr/bin/env python3
"""Broker CPU seconds for one produce run: a load-insensitive before/after check.

Starts ``oncelog serve`` from the given source tree (``--tree``, default this
repository), creates an 8-partition topic, produces ``--records`` records of
``--size`` bytes with confluent-kafka (``acks=all``, ``linger.ms=5``, no
compression, not idempotent, round robin over the partitions), and prints the
broker process's user + sys CPU time (from ``/proc/<pid>/stat``) spent on
them, plus the wall time and the broker CPU per record batch (the batches
are counted in the segment files afterwards). Wall time on a shared machine
swings with load; the broker's CPU time much less, so alternating two trees
compares their per-request cost. Linux only.

``--idempotent`` and ``--batch-size N`` set the producer's
``enable.idempotence`` and ``batch.size``; ``--threads`` splits the broker's
CPU into the event-loop thread and the other threads (the fdatasync
workers); ``--profile FILE`` runs the broker under cProfile with a CPU-time
clock of the event-loop thread and writes the stats to FILE.

    python bench/broker_cpu.py --tree <main> ; python bench/broker_cpu.py --tree <change>   # repeat
    python bench/broker_cpu.py --idempotent --batch-size 16384 --size 1024 --records 100000 --threads
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 8
PROFILE_BROKER = """
import cProfile, sys, time
from oncelog.cli import main
out = sys.argv.pop(1)
prof = cProfile.Profile(time.thread_time)
try:
    prof.runcall(main, sys.argv[1:])
finally:
    prof.dump_stats(out)
"""


def count_batches(data: Path) -> int:
    """Record batches in the topic's segment files (each: 8-byte offset, 4-byte length, rest)."""
    n = 0
    for seg in data.glob("cpu-*/*.log"):
        raw = seg.read_bytes()
        pos = 0
        while pos + 12 <= len(raw):
            n += 1
            pos += 12 + int.from_bytes(raw[pos + 8 : pos + 12], "big")
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent, help="source tree (has src/)")
    ap.add_argument("--size", type=int, default=100, help="record value size in bytes (default 100)")
    ap.add_argument("--records", type=int, default=1_000_000, help="records (default 1000000)")
    ap.add_argument("--idempotent", action="store_true", help="enable.idempotence=true (default false)")
    ap.add_argument("--batch-size", type=int, default=None, metavar="N",
                    help="the producer's batch.size (default librdkafka's 1000000)")
    ap.add_argument("--profile", type=Path, default=None, metavar="FILE",
                    help="run the broker under cProfile and write its stats to FILE (slows the broker)")
    ap.add_argument("--threads", action="store_true", help="also print user/sys CPU per broker thread name")
    args = ap.parse_args()
    if not (args.tree / "src" / "oncelog").is_dir():
        print(f"broker_cpu: {args.tree} has no src/oncelog", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tempfile.mkdtemp(prefix="oncelog-cpu-")
    env = dict(os.environ, PYTHONPATH=str(args.tree / "src"))
    # the profile counts the event-loop thread's CPU time (not wall time, not the fsync threads)
    prof = ["-c", PROFILE_BROKER, str(args.profile)] if args.profile else ["-m", "oncelog.cli"]
    broker = subprocess.Popen(
        [sys.executable, *prof, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert broker.stdout is not None
        for line in broker.stdout:
            if "listening" in line:
                break
        else:
            print("broker_cpu: the broker did not start", file=sys.stderr)
            return 1
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("cpu", PARTITIONS, 1)])["cpu"].result()

        def threads() -> dict[str, tuple[float, float]]:  # event loop vs other threads: (user, sys) seconds
            out: dict[str, tuple[float, float]] = {}
            tck = os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{broker.pid}/task").iterdir():
                try:
                    f = task.joinpath("stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                name = "event loop" if task.name == str(broker.pid) else "other threads (fsync)"
                u, s = out.get(name, (0.0, 0.0))
                out[name] = (u + int(f[11]) / tck, s + int(f[12]) / tck)
            return out

        def cpu() -> float:
            fields = Path(f"/proc/{broker.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        conf: dict[str, object] = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                                   "compression.type": "none", "enable.idempotence": args.idempotent}
        if args.batch_size:
            conf["batch.size"] = args.batch_size
        producer = Producer(conf)
        value = b"x" * args.size
        producer.produce("cpu", value)
        producer.flush(30)  # metadata and connections before the clock starts
        th0, c0, t0 = threads(), cpu(), time.monotonic()
        for i in range(args.records):
            while True:
                try:
                    producer.produce("cpu", value, partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.01)
        left = producer.flush(120)
        wall, used, th1 = time.monotonic() - t0, cpu() - c0, threads()
        del producer, admin  # librdkafka handles closed before the broker goes away (no log noise)
        if left:
            print(f"broker_cpu: {left} records not delivered", file=sys.stderr)
            return 1
        mb = args.records * args.size / 1e6
        batches = count_batches(Path(data)) - 1  # less the warm-up record's batch
        print(f"{args.tree}: {args.records} x {args.size} B: broker cpu {used:.2f} s ({used / mb:.4f} s/MB), "
              f"wall {wall:.2f} s, {batches} batches ({used / max(batches, 1) * 1e6:.0f} µs broker cpu per batch)")
        if args.threads:
            for name, (u, s) in sorted(th1.items()):
                u0, s0 = th0.get(name, (0.0, 0.0))
                print(f"  thread {name}: user {u - u0:.2f} s, sys {s - s0:.2f} s")
        return 0
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
