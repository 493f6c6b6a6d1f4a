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
clock of the event-loop thread and writes the stats to FILE. ``--trace``
times each Produce request's phases in the broker (frame in, appended,
round start, the workers' fdatasyncs, the loop woken, response written;
monkeypatched, a few µs per request) and prints medians and means;
``--client oncelog`` / ``oncelog-batch`` produce with
``oncelog.client.Producer`` (``produce()`` per record / ``produce_batch``)
instead of confluent-kafka, and the client's own CPU is printed too.

    python bench/broker_cpu.py --tree <main> ; python bench/broker_cpu.py --tree <change>   # repeat
    python bench/broker_cpu.py --idempotent --batch-size 16384 --size 1024 --records 100000 --threads
    python bench/broker_cpu.py --client oncelog --size 1024 --records 100000 --trace
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

# --trace: time each Produce request's phases in the broker (monkeypatched; a few µs per request)
TRACE_BROKER = r"""
import atexit, json, os, sys, threading, time
from oncelog.cli import main
from oncelog.broker import durability, server

out = sys.argv.pop(1)
now = time.perf_counter_ns
recs = {}        # task -> [recv, wait, kick, sync start, sync end, loop woken, done, written, fdatasync ns, blocked]
by_fut = {}      # durable-wait future -> rec
written = []     # finished recs
rounds = []      # (files, requests) per round
tls = threading.local()
current = [None]
round_times = {}  # a round's future -> [(sync start, sync end, fdatasync ns)] per file

C = server.KafkaConnection
o_start, o_collect, o_flush = C._start, C._collect_done, C._flush
def _start(self, frames):
    t, n = now(), len(self.pending)
    o_start(self, frames)
    for task in list(self.pending)[n:]:
        recs[task] = [t, 0, 0, 0, 0, 0, 0, 0, 0, 0]
def _collect_done(self):
    t = now()
    for task in self.pending:
        if not task.done():
            break
        r = recs.get(task)
        if r is not None:
            r[6] = t
            self.__dict__.setdefault("_trace_out", []).append(r)
            del recs[task]
    o_collect(self)
def _flush(self):
    t = now()
    for r in self.__dict__.pop("_trace_out", ()):
        r[7] = t
        if r[1]:
            written.append(r)
    o_flush(self)
C._start, C._collect_done, C._flush = _start, _collect_done, _flush

import asyncio
G = durability.GroupCommitter
o_wait, o_kick, o_sync_all, o_round_done = G._wait, G._kick, G._sync_all, G._round_done
def _wait(self, partitions):
    t = now()
    fut = o_wait(self, partitions)
    r = recs.get(asyncio.current_task())
    if r is not None:
        r[1] = t
        by_fut[fut] = r
    return fut
def _kick(self):
    t = now()
    taken = [p for p in self._dirty if p not in self._inflight]
    for p in self._dirty:
        for w in self._waiting.get(p, ()):
            r = by_fut.get(w.fut)
            if r is not None:
                if p in taken:
                    r[2] = t
                else:
                    r[9] = 1  # its log was still in a running round
    o_kick(self)
def _sync_all(self, loop, dirty):
    current[0] = times = []
    done = o_sync_all(self, loop, dirty)
    current[0] = None
    round_times[done] = times
    return done
def _round_done(self, fut, files, ends, waiters):
    t = now()
    times = round_times.pop(fut, None) or [(0, 0, 0)]
    start, end, fd = min(x[0] for x in times), max(x[1] for x in times), max(x[2] for x in times)
    n = 0
    for ws in waiters:
        for w in ws:
            r = by_fut.pop(w.fut, None)
            if r is not None:
                n += 1
                r[3], r[4], r[5], r[8] = start, end, t, fd
    rounds.append((len(files), n))
    o_round_done(self, fut, files, ends, waiters)
G._wait, G._kick, G._sync_all, G._round_done = _wait, _kick, _sync_all, _round_done

S = durability.SyncThreads
o_submit = S.submit
def submit(self, job):
    times = current[0]
    if times is None:
        return o_submit(self, job)
    def timed():
        tls.times = times
        job()
    o_submit(self, timed)
S.submit = submit
from oncelog.storage.log import PartitionLog
o_sync = PartitionLog.sync
def log_sync(self):
    times = getattr(tls, "times", None)
    if times is None:
        return o_sync(self)
    tls.times, tls.fd = None, 0
    t0 = now()
    try:
        return o_sync(self)
    finally:
        times.append((t0, now(), tls.fd))
PartitionLog.sync = log_sync
o_fdatasync = os.fdatasync
def fdatasync(fd):
    t0 = now()
    try:
        o_fdatasync(fd)
    finally:
        tls.fd = getattr(tls, "fd", 0) + now() - t0
os.fdatasync = fdatasync

def dump():
    with open(out, "w") as f:
        json.dump({"requests": written, "rounds": rounds}, f)
atexit.register(dump)
sys.exit(main(sys.argv[1:]))
"""

PHASES = [  # (name, from index, to index) into a trace record
    ("event loop: frame in -> appended, waiting", 0, 1),
    ("waiting for the round to start", 1, 2),
    ("round start -> a worker has the job (hand-off)", 2, 3),
    ("workers: PartitionLog.sync (slowest file)", 3, 4),
    ("last worker done -> round's callback on the loop", 4, 5),
    ("waiters released -> response ready", 5, 6),
    ("response ready -> written", 6, 7),
    ("total: frame in -> response written", 0, 7),
]


def trace_report(path: Path, skip: float = 0.1) -> None:
    import json
    import statistics

    data = json.loads(path.read_text())
    reqs = [r for r in data["requests"] if all(r[:8])]
    reqs = reqs[int(len(reqs) * skip):]  # the warm-up
    if not reqs:
        print("trace: no complete Produce request traced")
        return
    print(f"trace: {len(reqs)} Produce requests; per request, µs: median / mean")
    for name, a, b in PHASES:
        d = [(r[b] - r[a]) / 1000 for r in reqs]
        print(f"  {name:50s} {statistics.median(d):8.0f} / {statistics.fmean(d):8.0f}")
    fd = [r[8] / 1000 for r in reqs]
    print(f"  {'  of which in os.fdatasync (slowest file)':50s} {statistics.median(fd):8.0f} / {statistics.fmean(fd):8.0f}")
    blocked = sum(1 for r in reqs if r[9]) / len(reqs)
    rounds = data["rounds"][len(data["rounds"]) // 10:]
    files = statistics.fmean(f for f, _n in rounds) if rounds else 0
    per = statistics.fmean(n for _f, n in rounds) if rounds else 0
    print(f"  {blocked:.0%} of the requests found their log in a running round; "
          f"{len(rounds)} rounds, {files:.2f} files and {per:.2f} requests a round")


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
    ap.add_argument("--trace", action="store_true",
                    help="time each Produce request's phases in the broker (round wait, fdatasync, hand-offs) "
                         "and print medians; adds a few µs of broker CPU per request")
    ap.add_argument("--client", choices=("confluent", "oncelog", "oncelog-batch"), default="confluent",
                    help="the producer: confluent-kafka (default), oncelog.client.Producer with one produce() "
                         "per record, or its produce_batch (one call per partition)")
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
    trace = Path(data + ".trace.json")
    if args.profile:
        prof = ["-c", PROFILE_BROKER, str(args.profile)]
    elif args.trace:
        prof = ["-c", TRACE_BROKER, str(trace)]
    else:
        prof = ["-m", "oncelog.cli"]
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

        value = b"x" * args.size
        if args.client == "confluent":
            conf: dict[str, object] = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                                       "compression.type": "none", "enable.idempotence": args.idempotent}
            if args.batch_size:
                conf["batch.size"] = args.batch_size
            producer = Producer(conf)
            producer.produce("cpu", value)
            producer.flush(30)  # metadata and connections before the clock starts
            th0, c0, t0, p0 = threads(), cpu(), time.monotonic(), time.process_time()
            for i in range(args.records):
                while True:
                    try:
                        producer.produce("cpu", value, partition=i % PARTITIONS)
                        break
                    except BufferError:
                        producer.poll(0.01)
            left = producer.flush(120)
        else:  # ours: idempotent (its default), acks=all, batch.size 16384 unless --batch-size
            from oncelog.client import Producer as OncelogProducer

            oconf: dict[str, object] = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5}
            if args.batch_size:
                oconf["batch.size"] = args.batch_size
                oconf["max.request.size"] = max(1048576, 8 * args.batch_size)
            producer = OncelogProducer(oconf)
            producer.produce("cpu", value, partition=0)
            producer.flush(30)
            th0, c0, t0, p0 = threads(), cpu(), time.monotonic(), time.process_time()
            if args.client == "oncelog":
                produce = producer.produce
                for i in range(args.records):
                    produce("cpu", value, partition=i % PARTITIONS)
            else:
                per = args.records // PARTITIONS
                for part in range(PARTITIONS):
                    producer.produce_batch("cpu", [value] * per, partition=part)
            left = producer.flush(120)
            producer.close()
        wall, used, th1, client_cpu = time.monotonic() - t0, cpu() - c0, threads(), time.process_time() - p0
        del producer, admin  # librdkafka handles closed before the broker goes away (no log noise)
        if left:
            print(f"broker_cpu: {left} records not delivered", file=sys.stderr)
            return 1
        mb = args.records * args.size / 1e6
        batches = count_batches(Path(data)) - 1  # less the warm-up record's batch
        print(f"{args.tree}: {args.client}: {args.records} x {args.size} B: broker cpu {used:.2f} s ({used / mb:.4f} s/MB), "
              f"wall {wall:.2f} s ({args.records / wall:,.0f} records/s), client cpu {client_cpu:.2f} s, "
              f"{batches} batches ({used / max(batches, 1) * 1e6:.0f} µs broker cpu per batch)")
        if args.threads:
            for name, (u, s) in sorted(th1.items()):
                u0, s0 = th0.get(name, (0.0, 0.0))
                print(f"  thread {name}: user {u - u0:.2f} s, sys {s - s0:.2f} s")
        return 0
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(data, ignore_errors=True)
        if args.trace and trace.exists():
            trace_report(trace)
            trace.unlink()


if __name__ == "__main__":
    sys.exit(main())
