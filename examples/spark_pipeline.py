"""`make run`: the exactly-once Spark pipeline, end to end, with a driver crash.

1. start an embedded oncelog broker (two-phase commit allowed);
2. seed topic `in`: 200k records over 8 partitions (key = the record's id), plus records in aborted
   transactions that read_committed must hide;
3. run a PySpark streaming query in a child process: format("oncelog") (read_committed) ->
   upper-case the value -> format("oncelog") exactly-once into topic `out`;
4. SIGKILL the driver's whole process tree while a batch is being written (its transactions are
   open), then restart the query from its checkpoint until the input is consumed;
5. `oncelog verify`'s report: exit 0 only when it is clean and every record arrived.

`python examples/spark_pipeline.py [--records N] [--partitions P] [--kills K]`.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IN, OUT = "in", "out"


def driver(bootstrap: str, ckpt: str, per_trigger: int) -> None:
    """The Spark driver (child process): prints one line per finished batch."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession, functions as F

    from oncelog.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("oncelog-pipeline")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    src = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", IN).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", str(per_trigger)).load())
    out = src.select("key", F.upper(F.col("value").cast("string")).alias("value"))
    q = (out.writeStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap).option("topic", OUT)
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    print("STARTED", flush=True)
    seen = -1
    while q.isActive:
        p = q.lastProgress
        if p and p["batchId"] != seen:
            seen = p["batchId"]
            print(f"BATCH {seen} {p['numInputRows']}", flush=True)
        time.sleep(0.2)
    q.awaitTermination()
    p = q.lastProgress
    if p and p["batchId"] != seen:
        print(f"BATCH {p['batchId']} {p['numInputRows']}", flush=True)
    spark.stop()


def seed(bootstrap: str, n: int, partitions: int) -> int:
    """n committed records (ids r0..) and some aborted ones; returns how many were aborted."""
    from oncelog.client.admin import Admin
    from oncelog.client.errors import KafkaError
    from oncelog.client.producer import Producer

    with Admin(bootstrap) as admin:
        for t in (IN, OUT):
            try:
                admin.create_topic(t, partitions)
            except KafkaError as exc:
                raise SystemExit(f"error: cannot create topic {t}: {exc}") from None
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    chunk = 5000
    for start in range(0, n, chunk):
        ids = range(start, min(n, start + chunk))
        for part in range(partitions):
            mine = [i for i in ids if i % partitions == part]
            p.produce_batch(IN, [f"value-{i}".encode() for i in mine], [f"r{i}".encode() for i in mine],
                            partition=part)
    if p.flush(120):
        raise SystemExit("error: seeding did not finish")
    p.close()
    aborted = 0
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": "pipeline-seed-aborted"})
    tx.init_transactions()
    for round_ in range(4):
        tx.begin_transaction()
        for part in range(partitions):
            vals = [f"aborted-{round_}-{part}-{i}".encode() for i in range(500)]
            tx.produce_batch(IN, vals, [f"x{round_}-{part}-{i}".encode() for i in range(500)], partition=part)
            aborted += len(vals)
        tx.abort_transaction()
    tx.close()
    return aborted


def open_txns(bootstrap: str, partitions: int) -> bool:
    """True while the output has records beyond its last stable offset (a batch is being written)."""
    from oncelog.client.reader import LATEST, READ_COMMITTED, READ_UNCOMMITTED, PartitionReader

    with PartitionReader(bootstrap) as r:
        return any(r.list_offset(OUT, p, LATEST, READ_COMMITTED) < r.list_offset(OUT, p, LATEST, READ_UNCOMMITTED)
                   for p in range(partitions))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--kills", type=int, default=1, help="driver kills mid-batch (default 1)")
    ap.add_argument("--per-trigger", type=int, default=40_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--driver", nargs=2, metavar=("BOOTSTRAP", "CHECKPOINT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.driver:
        driver(args.driver[0], args.driver[1], args.per_trigger)
        return 0

    from rich.console import Console

    from oncelog import verify
    from oncelog.testing import EmbeddedBroker

    console = Console(highlight=False)
    work = Path(tempfile.mkdtemp(prefix="oncelog-pipeline-"))
    broker = EmbeddedBroker(data_dir=work / "data", log_path=work / "broker.log",
                            config={"transaction.two.phase.commit.enable": "true"})
    broker.start()
    try:
        bs = broker.bootstrap
        console.print(f"[bold]broker[/bold] {bs} (data in {work})")
        t0 = time.monotonic()
        aborted = seed(bs, args.records, args.partitions)
        console.print(f"[bold]seeded[/bold] {IN}: {args.records} committed records over {args.partitions} "
                      f"partitions, {aborted} in aborted transactions ({time.monotonic() - t0:.1f} s)")
        ckpt = str(work / "checkpoint")
        kills_left, run = args.kills, 0
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                        os.environ.get("PYTHONPATH")])))
        while True:
            run += 1
            console.print(f"[bold]driver run {run}[/bold]: starting the streaming query"
                          + (" (it will be killed mid-batch)" if kills_left else ""))
            proc = subprocess.Popen([sys.executable, __file__, "--per-trigger", str(args.per_trigger),
                                     "--driver", bs, ckpt], env=env, start_new_session=True,
                                    stdout=subprocess.PIPE, stderr=open(work / f"driver-{run}.log", "wb"), text=True)
            batches = 0
            killed = False
            lines: queue.Queue[str] = queue.Queue()
            threading.Thread(target=lambda out=proc.stdout: [lines.put(x) for x in out], daemon=True).start()
            while proc.poll() is None:
                while not lines.empty():
                    line = lines.get()
                    if line.startswith("BATCH"):
                        _, b, rows = line.split()
                        batches += 1
                        console.print(f"  batch {b}: {rows} records in")
                if kills_left and batches >= 1 and open_txns(bs, args.partitions):
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    killed = True
                    kills_left -= 1
                    console.print("  [bold red]driver killed (SIGKILL, whole process tree) while a batch "
                                  "was being written[/bold red]; restarting from the checkpoint")
                    break
                time.sleep(0.2)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # Python workers left behind
            except ProcessLookupError:
                pass
            if killed:
                continue
            if proc.returncode != 0:
                console.print(f"[bold red]driver failed ({proc.returncode}); see {work}/driver-{run}.log[/bold red]")
                return 1
            if kills_left:
                console.print("[yellow]the query finished before a kill could land; running it again "
                              "is a no-op, so no kill happened[/yellow]")
            break
        console.print(f"[bold]query done[/bold] after {run} driver run(s), {time.monotonic() - t0:.0f} s")
        report = verify.run(bs, IN, OUT)
        verify.print_table(report, IN, OUT, None)
        complete = report.input_records == args.records == report.output_records
        if not complete:
            console.print(f"[bold red]expected {args.records} records in and out[/bold red]")
        return 0 if report.clean and complete and kills_left == 0 else 1
    finally:
        broker.close()


if __name__ == "__main__":
    sys.exit(main())
