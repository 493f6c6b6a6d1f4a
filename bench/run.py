#!/usr/bin/env python3
"""Benchmark report driver: every workload, paired runs, ratios, plots and a markdown report.

Workloads (confluent-kafka clients, loopback only):

* produce: ``produce.produce_run`` at several record sizes, oncelog vs
  librdkafka's mock cluster (A B A B per size); ratio oncelog / mock.
* idempotent: the same with ``enable.idempotence=true`` on both sides.
* consume: read a pre-filled 8-partition topic of 1 KiB records from offset 0
  (assigned, fresh group): read_uncommitted vs read_committed on oncelog.
* transactional: ``txn.throughput_run``, idempotent vs transactional
  (100 ms transactions) on oncelog, plus ``txn.client_latency`` (commit
  latency at light load) for the histogram.
* copy: consume-transform-produce from the pre-filled topic into a fresh one,
  at-least-once (idempotent producer, offsets committed after each flushed
  batch) vs exactly-once (transactional producer, offsets in the transaction
  with ``send_offsets_to_transaction``), read_committed input.

The mock runs only the produce workloads: it is wrong for read_committed.
Scale probes come from ``scale.py``. Progress goes to stderr; the report
(markdown) to stdout and, with ``--write-docs``, between the report markers of
docs/benchmarks.md with plots in docs/bench/. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale  # noqa: E402
import txn  # noqa: E402
from common import REPO, MockCluster, run_metadata  # noqa: E402
from produce import PARTITIONS, Side, produce_run  # noqa: E402
from txn import fmt, log, pct  # noqa: E402

from oncelog.testing import EmbeddedBroker  # noqa: E402

BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
DOC = REPO / "docs" / "benchmarks.md"
PLOTS = REPO / "docs" / "bench"
WORKLOADS = ("produce", "idempotent", "consume", "transactional", "copy", "scale")
COPY_SIZE = 1024
TXN_TIMEOUT = 60.0  # librdkafka: message.timeout.ms <= transaction.timeout.ms (60 s default)


@dataclass
class Pair:
    """One workload's paired runs: rates of A and B in run order, and the ratios B / A per pair."""
    workload: str
    a: str
    b: str
    unit: str
    size: int
    a_rates: list[float | None] = field(default_factory=list)
    b_rates: list[float | None] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return [b / a for a, b in zip(self.a_rates, self.b_rates) if a and b]


def med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v]
    return statistics.median(vals) if vals else None


def paired(pair: Pair, rounds: int, run_a: Callable[[int], tuple[float | None, str | None]],
           run_b: Callable[[int], tuple[float | None, str | None]]) -> Pair:
    """A B A B ...: each callable returns (rate, failure)."""
    for rnd in range(1, rounds + 1):
        for label, fn, rates in ((pair.a, run_a, pair.a_rates), (pair.b, run_b, pair.b_rates)):
            log(f"{pair.workload} {pair.size} B round {rnd}: {label} ...")
            rate, failure = fn(rnd)
            rates.append(rate)
            if failure:
                pair.failures.append(f"{label} round {rnd}: {failure}")
            log(f"  -> {fmt(rate)} {pair.unit}" if rate else f"  -> FAILED: {failure}")
    return pair


# -- consume and copy ----------------------------------------------------------------------------------


def consume_run(bootstrap: str, topic: str, records: int, isolation: str, timeout: float) -> tuple[float | None, str | None]:
    """Read ``records`` from offset 0 of every partition; records/s from assign() to the last one."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": False})
    try:
        c.list_topics(topic, timeout=10)  # connect before the clock starts
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        n, deadline = 0, t0 + timeout
        while n < records and time.perf_counter() < deadline:
            for m in c.consume(10_000, 0.5):
                if m.error():
                    return None, str(m.error())
                n += 1
        secs = time.perf_counter() - t0
    finally:
        c.close()
    if n != records:
        return None, f"read {n} of {records} records in {timeout} s"
    return records / secs, None


def copy_run(bootstrap: str, src: str, records: int, transactional: bool, batch: int,
             timeout: float) -> tuple[float | None, str | None]:
    """Consume-transform-produce ``src`` (assigned, read_committed) into a fresh topic.

    At-least-once: idempotent producer, flush, then commit the consumer's offsets.
    Exactly-once: begin / produce / send_offsets_to_transaction / commit per batch.
    """
    dst = f"copy-{'eos' if transactional else 'alo'}-{uuid.uuid4().hex[:8]}"
    scale.create_topics(bootstrap, [dst], PARTITIONS)
    group = f"copy-{uuid.uuid4().hex[:8]}"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": False})
    pconf: dict[str, object] = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                                "enable.idempotence": True,
                                "message.timeout.ms": int(min(timeout, TXN_TIMEOUT) * 1000)}
    if transactional:
        pconf["transactional.id"] = f"copy-{uuid.uuid4().hex[:12]}"
    p = Producer(pconf)
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    try:
        p.list_topics(dst, timeout=10)  # connect both clients before the clock starts
        c.list_topics(src, timeout=10)
        if transactional:
            p.init_transactions(30)
        t0 = time.perf_counter()
        c.assign([TopicPartition(src, i, 0) for i in range(PARTITIONS)])
        n, deadline = 0, t0 + timeout
        while n < records and time.perf_counter() < deadline:
            msgs = c.consume(batch, 0.5)
            if not msgs:
                continue
            if transactional:
                p.begin_transaction()
            for m in msgs:
                if m.error():
                    return None, str(m.error())
                p.produce(dst, m.value()[::-1], key=m.key(), partition=m.partition(), on_delivery=on_delivery)
                p.poll(0)
            n += len(msgs)
            if transactional:
                p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), timeout)
                p.commit_transaction(timeout)
            else:
                if p.flush(timeout):
                    return None, "flush timed out"
                c.commit(asynchronous=False)
        secs = time.perf_counter() - t0
    except KafkaException as e:
        return None, f"client error: {e.args[0].str() if e.args else e!r}"
    finally:
        c.close()
    if errors:
        return None, f"{len(errors)} delivery errors (first: {errors[0]})"
    if n != records:
        return None, f"copied {n} of {records} records in {timeout} s"
    return records / secs, None


# -- report -----------------------------------------------------------------------------------------------


def ratio_cell(pair: Pair) -> str:
    r = pair.ratios()
    if not r:
        return "n/a"
    spread = f" ({min(r):.2f}-{max(r):.2f})" if len(r) > 1 else ""
    return f"**{statistics.median(r):.2f}**{spread}"


def render(meta: dict[str, Any], pairs: list[Pair], lat: dict[str, list[float]], scale_res: dict[str, Any],
           plots: list[str], plot_dir: str) -> str:
    out = [f"Command: `{meta['command']}` (from the repository root), {meta['date']}, oncelog at "
           f"`{meta['oncelog_git']}`, Python {meta['python']}, {meta['cpu_count']} CPUs, confluent-kafka "
           f"{meta['confluent_kafka']} (librdkafka {meta['librdkafka']}). Load average (1 min) "
           f"{meta['load_avg_at_start'][0]:.1f} at the start and {meta['load_avg_at_end'][0]:.1f} at the end, "
           f"on 2 cores shared with other engineers' test runs: read the ratios, not the absolute numbers.", "",
           "Throughput: paired runs (A B A B ...) in one process tree; ratio = B / A per pair, median "
           "(min-max). oncelog is durable (fsync before `acks=all`); the mock keeps everything in memory.", "",
           "| workload | size | A | B | A median | B median | unit | ratio B / A |",
           "| --- | ---: | --- | --- | ---: | ---: | --- | ---: |"]
    for p in pairs:
        out.append(f"| {p.workload} | {p.size:,} B | {p.a} | {p.b} | {fmt(med(p.a_rates))} | "
                   f"{fmt(med(p.b_rates))} | {p.unit} | {ratio_cell(p)} |")
    fails = [f"{p.workload} {p.size} B {f}" for p in pairs for f in p.failures]
    if fails:
        out += ["", "Failed runs (left out of medians and ratios):", ""] + [f"- {f}" for f in fails]
    if lat:
        out += ["", "Commit latency (transactional workload), ms:", "",
                "| what | n | p50 | p99 | max |", "| --- | ---: | ---: | ---: | ---: |"]
        for name, vals in lat.items():
            out.append(txn.lat_row(name, vals))
    if scale_res:
        out += ["", "### Scale probes", ""] + scale.render(scale_res)
    if plots:
        out += ["", "Plots:", ""] + [f"![{Path(p).stem}]({plot_dir}/{Path(p).name})" for p in plots]
    return "\n".join(out).rstrip() + "\n"


def write_plots(pairs: list[Pair], lat: dict[str, list[float]], outdir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig: Any, path: Path) -> Path:
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    prod = sorted((p for p in pairs if p.workload == "produce"), key=lambda p: p.size)
    if prod:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        sizes = [p.size for p in prod]
        for label, get in (("oncelog (durable)", lambda p: p.b_rates), ("librdkafka mock (memory)", lambda p: p.a_rates)):
            rates = [med(get(p)) for p in prod]
            ax1.plot(sizes, [r or float("nan") for r in rates], marker="o", label=label)
            ax2.plot(sizes, [(r or float("nan")) * s / 1e6 for r, s in zip(rates, sizes)], marker="o", label=label)
        for ax, ylab in ((ax1, "records/s"), (ax2, "MB/s (record values)")):
            ax.set_xscale("log")
            ax.set_xlabel("record value size (bytes)")
            ax.set_ylabel(ylab)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle("Produce throughput vs record size (confluent-kafka, acks=all, 8 partitions; median of pairs)")
        written.append(save(fig, outdir / "produce-throughput.png"))
    if lat:
        fig, axes = plt.subplots(1, len(lat), figsize=(5 * len(lat), 4), squeeze=False)
        for ax, (name, vals) in zip(axes[0], lat.items()):
            ms = [v * 1000 for v in vals]
            if ms:
                ax.hist(ms, bins=40, color="tab:blue")
                for q, style in ((50, "--"), (99, ":")):
                    ax.axvline(pct(ms, q), color="black", linestyle=style, label=f"p{q} {pct(ms, q):.1f} ms")
                ax.legend()
            ax.set_title(name.split(" (")[0], fontsize=10)
            ax.set_xlabel("ms")
            ax.set_ylabel("commits")
        fig.suptitle("commit_transaction() latency, transactional workload (oncelog)")
        written.append(save(fig, outdir / "commit-latency.png"))
    return written


def write_doc(doc: Path, section: str) -> None:
    text = doc.read_text()
    block = f"{BEGIN}\n{section}{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Report\n\nGenerated by `bench/run.py --write-docs`; do not edit by hand.\n\n" \
            + block + "\n"
    doc.write_text(text)


# -- driver ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a 1-2 minute run: smaller sizes everywhere")
    p.add_argument("--rounds", type=int, help="pairs per workload (default 2: A B A B)")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   help="produce record sizes (default 100,1024,4096,16384; --quick 100,1024,16384)")
    p.add_argument("--records", type=int, help="produce records per run, capped by --run-mb (default 200000; "
                                               "--quick 30000)")
    p.add_argument("--run-mb", type=int, help="at most this many MB of values per produce run (default 400; "
                                              "--quick 60)")
    p.add_argument("--consume-records", type=int, help="records in the pre-filled topic (1 KiB each) for "
                                                       "consume and copy (default 200000; --quick 30000)")
    p.add_argument("--copy-batch", type=int, default=1000, help="records per copy transaction/batch (default 1000)")
    p.add_argument("--txn-seconds", type=float, help="seconds per transactional throughput run (default 8; "
                                                     "--quick 3)")
    p.add_argument("--latency-txns", type=int, help="light-load commits for the histogram (default 300; "
                                                    "--quick 50)")
    p.add_argument("--skip", default="", help=f"comma list of workloads to leave out: {','.join(WORKLOADS)}")
    scale.add_arguments(p)
    p.add_argument("--timeout", type=float, default=120.0, help="per-run timeout, s (default 120)")
    p.add_argument("--data-root", type=Path, help="parent directory for the brokers' temp data dirs")
    p.add_argument("--write-docs", action="store_true",
                   help="write the report between the markers in docs/benchmarks.md and plots to docs/bench/ "
                        "(otherwise both go to --out)")
    p.add_argument("--out", type=Path, help="output dir without --write-docs (default <tmp>/oncelog-bench-<time>)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write raw results as JSON")
    a = p.parse_args(argv)
    q = a.quick
    a.rounds = a.rounds or 2
    a.sizes = a.sizes or ([100, 1024, 16384] if q else [100, 1024, 4096, 16384])
    a.records = a.records or (30_000 if q else 200_000)
    a.run_mb = a.run_mb or (60 if q else 400)
    a.consume_records = a.consume_records or (30_000 if q else 200_000)
    a.txn_seconds = a.txn_seconds or (3.0 if q else 8.0)
    a.latency_txns = a.latency_txns or (50 if q else 300)
    a.skip = {s for s in a.skip.split(",") if s}
    if a.skip - set(WORKLOADS):
        p.error(f"unknown workload(s) in --skip: {a.skip - set(WORKLOADS)}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    meta: dict[str, Any] = {**run_metadata(), "nofile_limit": scale.raise_nofile(a.nofile),
                            "load_avg_at_start": os.getloadavg()}
    pairs: list[Pair] = []
    lat: dict[str, list[float]] = {}
    want = [w for w in WORKLOADS if w not in a.skip]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="oncelog-report-", dir=a.data_root)))
        eb = stack.enter_context(EmbeddedBroker(data_dir=tmp / "data", log_path=tmp / "broker.log",
                                                config=dict(scale.BROKER_CONFIG)))
        onc = scale.Oncelog(eb)
        boot = eb.bootstrap
        assert boot.startswith("127."), boot
        mock = stack.enter_context(MockCluster()) if {"produce", "idempotent"} & set(want) else None

        def produce_pair(workload: str, size: int, extra: dict[str, object]) -> None:
            records = max(1000, min(a.records, a.run_mb * 1_000_000 // size))
            sides = {n: Side(n, b, dict(extra)) for n, b in (("oncelog", onc), ("mock", mock))}

            def run(name: str) -> Callable[[int], tuple[float | None, str | None]]:
                def go(rnd: int) -> tuple[float | None, str | None]:
                    r = produce_run(sides[name], size, rnd, records, a.timeout)
                    return r.msgs_per_s, r.failure
                return go
            pairs.append(paired(Pair(workload, "mock", "oncelog", "records/s", size), a.rounds,
                                run("mock"), run("oncelog")))

        if "produce" in want:
            for size in a.sizes:
                produce_pair("produce", size, {})
        if "idempotent" in want:
            produce_pair("idempotent", 1024, {"enable.idempotence": True})
        src = None
        if {"consume", "copy"} & set(want):
            log(f"pre-filling {a.consume_records} x {COPY_SIZE} B ...")
            fill = produce_run(Side("fill", onc, {"enable.idempotence": True}), COPY_SIZE, 0,
                               a.consume_records, a.timeout)
            if fill.ok:
                src = fill.topic
            else:
                log(f"  fill FAILED: {fill.failure}")
        if "consume" in want and src:
            pairs.append(paired(Pair("consume", "read_uncommitted", "read_committed", "records/s", COPY_SIZE),
                                a.rounds,
                                lambda _r: consume_run(boot, src, a.consume_records, "read_uncommitted", a.timeout),
                                lambda _r: consume_run(boot, src, a.consume_records, "read_committed", a.timeout)))
        if "transactional" in want:
            def txn_side(side: str, commits: list[float]) -> Callable[[int], tuple[float | None, str | None]]:
                def go(rnd: int) -> tuple[float | None, str | None]:
                    r = txn.throughput_run(boot, side, rnd, "A/B", 0, a.txn_seconds, TXN_TIMEOUT)
                    txn.delete_topic(boot, r.topic)
                    if r.ok:
                        commits.extend(r.commit_s)
                    return r.rate, r.failure
                return go
            under_load: list[float] = []
            pairs.append(paired(Pair("transactional", "idempotent", "transactional", "records/s", txn.SIZE),
                                a.rounds, txn_side("idempotent", []), txn_side("transactional", under_load)))
            log(f"commit latency at light load: {a.latency_txns} transactions ...")
            cl = txn.client_latency(boot, a.latency_txns, 3, TXN_TIMEOUT, None)
            if cl.failure:
                log(f"  light-load latency: {cl.failure}")
            lat["commit_transaction() at light load (3 x 1 KiB, after flush())"] = cl.commit_s
            lat["commit_transaction() under load (100 ms transactions, includes their flush)"] = under_load
        if "copy" in want and src:
            pairs.append(paired(Pair("copy", "at-least-once", "exactly-once", "records/s", COPY_SIZE), a.rounds,
                                lambda _r: copy_run(boot, src, a.consume_records, False, a.copy_batch, a.timeout),
                                lambda _r: copy_run(boot, src, a.consume_records, True, a.copy_batch, a.timeout)))
        if not eb.running:
            log("the broker died; see its log")
    scale_res: dict[str, Any] = {}
    if "scale" in want:
        scale_res = scale.run_probes(set(scale.PROBES), scale.sizes_from_args(a), a.data_root)
    meta["load_avg_at_end"] = os.getloadavg()

    if a.write_docs:
        plot_dir, doc = PLOTS, DOC
    else:
        out = a.out or Path(tempfile.gettempdir()) / f"oncelog-bench-{time.strftime('%Y%m%d-%H%M%S')}"
        plot_dir, doc = out, out / "report.md"
    plots = write_plots(pairs, lat, plot_dir)
    rel = os.path.relpath(plot_dir, doc.parent)
    section = render(meta, pairs, lat, scale_res, [str(p) for p in plots], rel)
    print(section)
    if a.write_docs:
        write_doc(doc, section)
    else:
        doc.write_text(section)
    log(f"report: {doc}; plots: {', '.join(str(p) for p in plots)}")
    if a.json:
        a.json.write_text(json.dumps({"meta": meta, "pairs": [vars(p) for p in pairs], "latency": lat,
                                      "scale": scale_res, "written": dt.datetime.now().isoformat()}, indent=2) + "\n")
    bad = any(p.failures for p in pairs) or scale.failed(scale_res)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
