#!/usr/bin/env python3
"""Broker CPU seconds for one produce run: a load-insensitive before/after check.

Starts ``oncelog serve`` from the given source tree (``--tree``, default this
repository), creates an 8-partition topic, produces ``--records`` records of
``--size`` bytes with confluent-kafka (``acks=all``, ``linger.ms=5``, no
compression, not idempotent, round robin over the partitions), and prints the
broker process's user + sys CPU time (from ``/proc/<pid>/stat``) spent on
them, plus the wall time. Wall time on a shared machine swings with load;
the broker's CPU time much less, so alternating two trees compares their
per-request cost. Linux only.

    python bench/broker_cpu.py --tree <main> ; python bench/broker_cpu.py --tree <change>   # repeat
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent, help="source tree (has src/)")
    ap.add_argument("--size", type=int, default=100, help="record value size in bytes (default 100)")
    ap.add_argument("--records", type=int, default=1_000_000, help="records (default 1000000)")
    args = ap.parse_args()
    if not (args.tree / "src" / "oncelog").is_dir():
        print(f"broker_cpu: {args.tree} has no src/oncelog", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tempfile.mkdtemp(prefix="oncelog-cpu-")
    env = dict(os.environ, PYTHONPATH=str(args.tree / "src"))
    broker = subprocess.Popen(
        [sys.executable, "-m", "oncelog.cli", "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data],
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

        def cpu() -> float:
            fields = Path(f"/proc/{broker.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                             "compression.type": "none", "enable.idempotence": False})
        value = b"x" * args.size
        producer.produce("cpu", value)
        producer.flush(30)  # metadata and connections before the clock starts
        c0, t0 = cpu(), time.monotonic()
        for i in range(args.records):
            while True:
                try:
                    producer.produce("cpu", value, partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.01)
        left = producer.flush(120)
        wall, used = time.monotonic() - t0, cpu() - c0
        del producer, admin  # librdkafka handles closed before the broker goes away (no log noise)
        if left:
            print(f"broker_cpu: {left} records not delivered", file=sys.stderr)
            return 1
        print(f"{args.tree}: {args.records} x {args.size} B: broker cpu {used:.2f} s, wall {wall:.2f} s")
        return 0
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
