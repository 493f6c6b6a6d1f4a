#!/usr/bin/env python3
"""Our producer's CPU per record, per thread: the caller's thread and the loop thread apart.

One oncelog broker (``common.OncelogBroker``); each run is a fresh
``oncelog.client.Producer`` and a fresh 8-partition topic: ``--records``
records of ``--size`` bytes with one ``produce()`` each (round-robin
partitions), or, with ``--batch``, one ``produce_batch`` call per partition,
then ``flush()``. Prints records/s and, for each thread, CPU microseconds per
record (utime+stime from ``/proc/self/task/<tid>/stat``, 10 ms ticks, so use
100,000 records or more) and the kernel's share of it (stime). ``--profile
loop`` or ``--profile caller`` runs cProfile on that thread only (cProfile is
per thread) during the last run and prints its top functions.

Usage: ``python bench/client_produce_threads.py --records 200000 --batch-size 1000000 --runs 2``
(``PYTHONPATH=<tree>/src`` to measure another tree's client: alternate trees
for a before/after, as the machine's load drifts).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OncelogBroker  # noqa: E402

PARTITIONS = 8


def thread_cpu(tid: int) -> tuple[float, float]:
    """(utime + stime, stime) of one thread of this process, in seconds."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[12]) / tick


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, help="batch.size (default: Kafka's 16384); max.request.size "
                    "becomes 8 x that when larger than 1 MiB")
    ap.add_argument("--batch", action="store_true", help="produce_batch, one call per partition")
    ap.add_argument("--profile", choices=("loop", "caller"), help="cProfile this thread in the last run")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    from oncelog.client import Producer

    conf: dict[str, object] = {"linger.ms": 5}
    if args.batch_size:
        conf["batch.size"] = args.batch_size
        conf["max.request.size"] = max(1 << 20, PARTITIONS * args.batch_size)
    n, payload = args.records, os.urandom(args.size)
    print(f"{'produce_batch' if args.batch else 'produce()'}, {n:,} x {args.size} B, config {conf}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, OncelogBroker(Path(tmp) / "data") as broker:
        for run in range(args.runs):
            topic = f"pt-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, PARTITIONS)
            p = Producer({"bootstrap.servers": broker.bootstrap, **conf})
            loop_tid, me = p._lt._thread.native_id, threading.get_native_id()
            prof = cProfile.Profile() if args.profile and run == args.runs - 1 else None
            if prof is not None:
                if args.profile == "loop":
                    ready = threading.Event()
                    p._lt.call(lambda: (prof.enable(), ready.set()))
                    ready.wait()
                else:
                    prof.enable()
            (c0, cs0), (l0, ls0) = thread_cpu(me), thread_cpu(loop_tid)
            t0 = time.perf_counter()
            if args.batch:
                for part in range(PARTITIONS):
                    p.produce_batch(topic, [payload] * (n // PARTITIONS), partition=part)
            else:
                produce = p.produce
                for i in range(n):
                    produce(topic, payload, partition=i % PARTITIONS)
            assert p.flush(300) == 0
            dt = time.perf_counter() - t0
            (c1, cs1), (l1, ls1) = thread_cpu(me), thread_cpu(loop_tid)
            if prof is not None:
                if args.profile == "loop":
                    done = threading.Event()
                    p._lt.call(lambda: (prof.disable(), done.set()))
                    done.wait()
                else:
                    prof.disable()
            p.close()
            us = 1e6 / n
            print(f"run {run}: {n / dt:,.0f} records/s; caller {(c1 - c0) * us:.2f} us/record "
                  f"(kernel {(cs1 - cs0) * us:.2f}), loop {(l1 - l0) * us:.2f} us/record (kernel {(ls1 - ls0) * us:.2f})",
                  flush=True)
            if prof is not None:
                pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
