#!/usr/bin/env python3
"""Broker CPU per transaction of the exactly-once copy: two broker source trees, paired.

Starts ``oncelog serve`` from each ``--tree`` (default: this repository twice),
seeds the same 8-partition input topic of ``--records`` keyed records on each,
then runs ``bench/session_copy.py``'s ``session`` copier (oncelog's
``TransactSession``: poll(``--batch``) -> produce_many -> end) against them in
turn, A B A B ..., for ``--rounds`` rounds, each into a fresh output topic and
group. The client is the same for every tree (the one this process imports).

Per run: the copy rate (first record to last commit), the number of committed
transactions, and the broker process's user + system CPU from
``/proc/<pid>/stat`` (and its event-loop thread vs the fsync threads, from
``/proc/<pid>/task``) per transaction and per record. CPU time does not depend
on the machine's load the way wall time does. Linux only.

    python bench/txn_broker_cpu.py --tree /tmp/old --tree . --rounds 4 --batch-size 1000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import session_copy  # noqa: E402
from common import free_port  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TCK = os.sysconf("SC_CLK_TCK")


class Broker:
    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self.data = tempfile.mkdtemp(prefix="oncelog-txncpu-")
        port = free_port()
        env = dict(os.environ, PYTHONPATH=str(tree / "src"), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oncelog.cli", "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", self.data],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "listening" in line:
                break
        else:
            raise RuntimeError(f"the broker of {tree} did not start")
        self.bootstrap = f"127.0.0.1:{port}"
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str) -> None:
        self.admin.create_topics([NewTopic(name, session_copy.PARTITIONS, 1)])[name].result(30)

    def cpu(self) -> dict[str, float]:
        """user + system seconds: the whole process (exited threads included), its event-loop (main)
        thread, and the difference (the fsync worker threads)."""

        def stat(path: str) -> float:
            f = Path(path).read_text().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / TCK

        total = stat(f"/proc/{self.proc.pid}/stat")
        loop = stat(f"/proc/{self.proc.pid}/task/{self.proc.pid}/stat")
        return {"total": total, "loop": loop, "threads": total - loop}

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, action="append", help="source tree with src/oncelog (give two; default: "
                    "this repository twice, an A/A run)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=500, help="records per poll, so per transaction (default 500)")
    ap.add_argument("--batch-size", type=int, help="batch.size of the session's producer (default: the session's)")
    ap.add_argument("--copier", choices=("session", "oncelog-alo"), default="session",
                    help="oncelog-alo: session_copy.py's at-least-once copier instead (a 'transaction' is then one "
                         "consume -> produce -> flush -> commit batch), for the at-least-once figures")
    a = ap.parse_args()
    trees = a.tree or [Path(__file__).resolve().parent.parent] * 2
    for t in trees:
        if not (t / "src" / "oncelog").is_dir():
            print(f"txn_broker_cpu: {t} has no src/oncelog", file=sys.stderr)
            return 2
    session_copy.BATCH = a.batch
    if a.batch_size:
        session_copy.ONCELOG_EXTRA["batch.size"] = a.batch_size
    from oncelog.client import Consumer, TransactSession

    commits = [0]
    end = TransactSession.end
    commit = Consumer.commit

    def counting_end(self: TransactSession, commit: bool = True) -> bool:
        ok = end(self, commit)
        commits[0] += bool(ok)
        return ok

    def counting_commit(self: Consumer, *args: object, **kwargs: object) -> object:
        out = commit(self, *args, **kwargs)
        commits[0] += 1
        return out

    TransactSession.end = counting_end  # type: ignore[method-assign]
    Consumer.commit = counting_commit  # type: ignore[method-assign]
    copier = session_copy.COPIERS[a.copier]
    brokers = [Broker(t) for t in trees]
    rows: list[list[dict[str, float]]] = [[] for _ in brokers]
    try:
        inp = f"in-{uuid.uuid4().hex[:8]}"
        for b in brokers:
            b.create_topic(inp)
            session_copy.seed(b.bootstrap, inp, a.records, a.size)
        for r in range(a.rounds):
            for i, b in enumerate(brokers):
                out = f"out-{r}-{uuid.uuid4().hex[:6]}"
                b.create_topic(out)
                commits[0] = 0
                c0, t0 = b.cpu(), time.monotonic()
                first = copier(b.bootstrap, inp, out, a.records)
                t1, c1 = time.monotonic(), b.cpu()
                n = commits[0]
                row = {"copy": a.records / (t1 - first), "txns": n,
                       **{f"{k}_txn": (c1[k] - c0[k]) / n * 1e6 for k in c1},
                       "total_rec": (c1["total"] - c0["total"]) / a.records * 1e6}
                rows[i].append(row)
                print(f"round {r + 1} tree {i} ({b.tree}): copy {row['copy']:,.0f} records/s, {n} transactions, broker "
                      f"cpu {row['total_txn']:,.0f} us/txn (loop {row['loop_txn']:,.0f}, threads "
                      f"{row['threads_txn']:,.0f}), {row['total_rec']:.1f} us/record", file=sys.stderr)
    finally:
        for b in brokers:
            b.close()
    print(f"{a.copier} copy of {a.records:,} x {a.size} B records, {a.batch} per poll, {a.rounds} rounds paired "
          f"(A B A B), batch.size {a.batch_size or 'default'}\n")
    print("| tree | copy only, median records/s | transactions (median) | broker CPU us/txn: total | event loop | "
          "fsync threads | broker CPU us/record |\n|---|---:|---:|---:|---:|---:|---:|")
    for i, b in enumerate(brokers):
        med = {k: statistics.median(x[k] for x in rows[i]) for k in rows[i][0]}
        print(f"| {i}: {b.tree} | {med['copy']:,.0f} | {med['txns']:.0f} | {med['total_txn']:,.0f} | "
              f"{med['loop_txn']:,.0f} | {med['threads_txn']:,.0f} | {med['total_rec']:.1f} |")
    if len(brokers) == 2:
        ratio = statistics.median(y["copy"] / x["copy"] for x, y in zip(rows[0], rows[1]))
        cpu = statistics.median(y["total_txn"] / x["total_txn"] for x, y in zip(rows[0], rows[1]))
        print(f"\ntree 1 vs tree 0, median of paired ratios: copy rate {ratio:.2f}x, broker CPU per transaction {cpu:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
