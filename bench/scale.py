#!/usr/bin/env python3
"""Scale probes for oncelog: many partitions, many open transactions, restart of a large log.

Three probes, each against its own broker (``EmbeddedBroker``, subprocess
mode, free loopback port, temporary data dir, durable defaults):

* ``partitions``: create ``--topics`` x ``--partitions-per-topic`` partitions
  and read the broker's VmRSS (and open file descriptors) from /proc/<pid>
  before and after -> idle memory per partition; then the latency of a
  Metadata request for all topics (p50/p99), and the restart time with that
  many partitions after a clean stop and after kill -9 (descriptors after each).
* ``transactions``: ``--open-txns`` transactional ids opened with the raw
  protocol (InitProducerId, AddPartitionsToTxn, Produce of one transactional
  batch), all left open at once, then committed one EndTxn at a time
  (p50/p99 of the round trip) and checked: the last stable offset must reach
  the high watermark on every partition.
* ``restart``: fill ``--log-mb`` MB of 16 KiB records over 8 partitions, then
  time start -> "oncelog listening" after a clean stop (SIGTERM) and after
  kill -9, against an empty data dir as the baseline.

Run: .venv/bin/python bench/scale.py [--quick] [--only partitions,transactions,restart]
Prints markdown on stdout; progress on stderr. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import run_metadata  # noqa: E402
from produce import Side, produce_run  # noqa: E402
from txn import INIT_PID, ADD_PARTITIONS, END_TXN, LIST_OFFSETS, PRODUCE, fmt, log, pct  # noqa: E402

from oncelog.client.admin import Admin  # noqa: E402
from oncelog.client.connection import Connection  # noqa: E402
from oncelog.protocol.errors import ErrorCode as E  # noqa: E402
from oncelog.protocol.records import Record, encode_record_batch  # noqa: E402
from oncelog.testing import EmbeddedBroker  # noqa: E402

BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0"}
PROBES = ("partitions", "transactions", "restart")


def create_topics(bootstrap: str, names: list[str], partitions: int, timeout: float = 120.0) -> None:
    """Create topics (one CreateTopics request) and wait for every result."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names],
                               operation_timeout=timeout, request_timeout=timeout)
    for f in futs.values():
        f.result(timeout=timeout + 5)


class Oncelog:
    """An ``EmbeddedBroker`` with the interface ``produce.produce_run`` expects."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        self.broker = broker

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def pid(self) -> int:
        assert self.broker.proc is not None
        return self.broker.proc.pid

    def alive(self) -> bool:
        return self.broker.running

    def create_topic(self, name: str, partitions: int) -> None:
        create_topics(self.bootstrap, [name], partitions)


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS/VmHWM (KiB) and the open file descriptor count of ``pid``."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def settled_status(pid: int, seconds: float = 1.5) -> dict[str, int]:
    """Status after the broker has been idle for ``seconds`` (lets background work finish)."""
    time.sleep(seconds)
    return proc_status(pid)


def timed_start(broker: EmbeddedBroker) -> float:
    """Seconds from spawning ``oncelog serve`` until it prints "oncelog listening on"."""
    t0 = time.perf_counter()
    broker.start(timeout=600)
    return time.perf_counter() - t0


def lat_stats(values: list[float]) -> dict[str, float | int | None]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "max_ms": max(ms) if ms else None}


# -- partitions -------------------------------------------------------------------------------------


def probe_partitions(root: Path, topics: int, per_topic: int, metadata_samples: int,
                     batch: int = 10) -> dict[str, Any]:
    out: dict[str, Any] = {"topics": topics, "partitions_per_topic": per_topic,
                           "partitions": topics * per_topic}
    with EmbeddedBroker(data_dir=root / "partitions", config=dict(BROKER_CONFIG)) as eb:
        pid = eb.proc.pid  # type: ignore[union-attr]
        with Admin(eb.bootstrap) as admin:
            admin.list_topics()  # first use of Metadata: load its schema before measuring
            before = settled_status(pid)
            names = [f"scale-{i:04d}" for i in range(topics)]
            t0 = time.perf_counter()
            for i in range(0, topics, batch):
                create_topics(eb.bootstrap, names[i:i + batch], per_topic)
                log(f"  partitions: {min(i + batch, topics) * per_topic} created")
            out["create_s"] = time.perf_counter() - t0
            after = settled_status(pid, 3.0)
            samples = []
            for _ in range(metadata_samples):
                m0 = time.perf_counter()
                seen = admin.list_topics()
                samples.append(time.perf_counter() - m0)
            if not set(names) <= set(seen):
                out["failure"] = f"Metadata lists {len(set(names) & set(seen))} of {topics} topics"
            # the broker reuses its encoded all-topics answer until the topology changes: the
            # first request after a change (here: a new 1-partition topic) pays the encoding
            cold = []
            for k in range(max(3, metadata_samples // 10)):
                admin.create_topic(f"scale-cold-{k:03d}", 1)
                m0 = time.perf_counter()
                admin.list_topics()
                cold.append(time.perf_counter() - m0)
        out["metadata_all_topics"] = lat_stats(samples)
        out["metadata_all_topics_after_change"] = lat_stats(cold)
        out["status_before"], out["status_after"] = before, after
        out["rss_per_partition_kib"] = (after["VmRSS"] - before["VmRSS"]) / out["partitions"]
        out["fds_per_partition"] = (after["fds"] - before["fds"]) / out["partitions"]
        eb.stop()
        out["clean_restart_s"] = timed_start(eb)
        out["status_after_restart"] = settled_status(eb.proc.pid)  # type: ignore[union-attr]
        eb.kill()  # unclean: every partition's active segment is recovered (scanned, indexes rewritten)
        out["kill9_restart_s"] = timed_start(eb)
        out["status_after_kill9_restart"] = settled_status(eb.proc.pid)  # type: ignore[union-attr]
        out["data_dir_files"] = sum(len(f) for _, _, f in os.walk(eb.data_dir))
    return out


# -- open transactions --------------------------------------------------------------------------------


def probe_transactions(root: Path, n: int, partitions: int, value_size: int = 100) -> dict[str, Any]:
    out: dict[str, Any] = {"open_txns": n, "partitions": partitions, "value_size": value_size}
    topic = f"scale-txn-{uuid.uuid4().hex[:8]}"
    clock = time.perf_counter
    init_s: list[float] = []
    add_s: list[float] = []
    produce_s: list[float] = []
    end_s: list[float] = []
    concurrent = 0
    with EmbeddedBroker(data_dir=root / "transactions", config=dict(BROKER_CONFIG)) as eb, \
            Connection(eb.bootstrap, client_id="scale-txn") as conn:
        pid = eb.proc.pid  # type: ignore[union-attr]
        create_topics(eb.bootstrap, [topic], partitions)
        before = settled_status(pid)
        value = os.urandom(value_size)
        producers: list[tuple[str, int, int, int]] = []  # (transactional id, pid, epoch, partition)
        t_open = clock()
        for i in range(n):
            tid = f"scale-{topic}-{i}"
            t0 = clock()
            r = conn.request(INIT_PID, 4, {"transactional_id": tid, "transaction_timeout": 900_000,
                                           "producer_id": -1, "producer_epoch": -1})
            init_s.append(clock() - t0)
            if r.error_code:
                out["failure"] = f"InitProducerId #{i}: {E(r.error_code)}"
                return out
            p = i % partitions
            ident = (tid, int(r.producer_id), int(r.producer_epoch), p)
            while True:
                t0 = clock()
                r = conn.request(ADD_PARTITIONS, 3, {
                    "v3_and_below_transactional_id": tid, "v3_and_below_producer_id": ident[1],
                    "v3_and_below_producer_epoch": ident[2],
                    "v3_and_below_topics": [{"name": topic, "partitions": [p]}]})
                add_s.append(clock() - t0)
                code = int(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)
                if code != E.concurrent_transactions:
                    break
                concurrent += 1
                time.sleep(0.001)
            if code:
                out["failure"] = f"AddPartitionsToTxn #{i}: {E(code)}"
                return out
            batch = encode_record_batch([Record(key=str(i).encode(), value=value)], producer_id=ident[1],
                                        producer_epoch=ident[2], base_sequence=0, is_transactional=True)
            t0 = clock()
            r = conn.request(PRODUCE, 9, {"transactional_id": tid, "acks": -1, "timeout": 30_000,
                                          "topic_data": [{"name": topic, "partition_data": [
                                              {"index": p, "records": batch}]}]})
            produce_s.append(clock() - t0)
            code = int(r.responses[0].partition_responses[0].error_code)
            if code:
                out["failure"] = f"Produce #{i}: {E(code)}"
                return out
            producers.append(ident)
            if (i + 1) % 250 == 0:
                log(f"  transactions: {i + 1} open")
        out["open_s"] = clock() - t_open
        opened = settled_status(pid)
        lso_open = list_offsets(conn, topic, partitions, committed=True)
        hw = list_offsets(conn, topic, partitions, committed=False)
        t_commit = clock()
        for tid, prod_id, epoch, _ in producers:
            t0 = clock()
            r = conn.request(END_TXN, 3, {"transactional_id": tid, "producer_id": prod_id,
                                          "producer_epoch": epoch, "committed": True})
            end_s.append(clock() - t0)
            if r.error_code:
                out["failure"] = f"EndTxn {tid}: {E(r.error_code)}"
                return out
        out["commit_all_s"] = clock() - t_commit
        # the LSO must reach the high watermark (records + one marker per transaction) on every partition
        deadline = clock() + 60
        while clock() < deadline:
            lso, hw = list_offsets(conn, topic, partitions, True), list_offsets(conn, topic, partitions, False)
            if lso == hw:
                break
            time.sleep(0.05)
        out["lso_caught_up_s"] = clock() - t_commit
        if lso != hw:
            out["failure"] = f"LSO {lso} != high watermark {hw} 60 s after the last EndTxn"
        out["lso_while_open"], out["high_watermark"] = lso_open, hw
        out["status_before"], out["status_open"] = before, opened
        out["rss_per_open_txn_kib"] = (opened["VmRSS"] - before["VmRSS"]) / n
    out["init_producer_id"], out["add_partitions"] = lat_stats(init_s), lat_stats(add_s)
    out["produce"], out["end_txn"] = lat_stats(produce_s), lat_stats(end_s)
    out["concurrent_retries"] = concurrent
    return out


def list_offsets(conn: Connection, topic: str, partitions: int, committed: bool) -> list[int]:
    """Latest offsets: the last stable offset (read_committed) or the high watermark."""
    r = conn.request(LIST_OFFSETS, 4, {"replica_id": -1, "isolation_level": int(committed), "topics": [{
        "name": topic, "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": -1}
                                      for p in range(partitions)]}]})
    return [int(p.offset) for p in sorted(r.topics[0].partitions, key=lambda p: p.partition_index)]


# -- restart ------------------------------------------------------------------------------------------------


def probe_restart(root: Path, log_mb: int, rounds: int, record_size: int = 16384) -> dict[str, Any]:
    records = max(1, log_mb * 1_000_000 // record_size)
    out: dict[str, Any] = {"log_mb": log_mb, "record_size": record_size, "records": records,
                           "partitions": 8, "rounds": rounds, "empty_s": [], "clean_s": [], "kill9_s": []}
    eb = EmbeddedBroker(data_dir=root / "restart", config=dict(BROKER_CONFIG))
    try:
        out["empty_s"].append(timed_start(eb))
        for _ in range(rounds - 1):
            eb.kill()
            shutil.rmtree(eb.data_dir)
            out["empty_s"].append(timed_start(eb))
        log(f"  restart: filling {log_mb} MB ({records} x {record_size} B) ...")
        fill = produce_run(Side("fill", Oncelog(eb), {"linger.ms": 20}), record_size, 0, records, timeout=600)
        if not fill.ok:
            out["failure"] = f"fill: {fill.failure}"
            return out
        out["fill_s"] = fill.seconds
        out["data_dir_bytes"] = sum(f.stat().st_size for f in eb.data_dir.rglob("*") if f.is_file())
        for _ in range(rounds):
            eb.stop()
            out["clean_s"].append(timed_start(eb))
            eb.kill()
            out["kill9_s"].append(timed_start(eb))
        out["status_after_restart"] = settled_status(eb.proc.pid)  # type: ignore[union-attr]
        # nothing lost: the high watermarks still add up to what was acknowledged
        c = Consumer({"bootstrap.servers": eb.bootstrap, "group.id": "scale-restart"})
        try:
            total = sum(c.get_watermark_offsets(TopicPartition(fill.topic, p), timeout=30)[1] for p in range(8))
        finally:
            c.close()
        out["records_after"] = total
        if total != records:
            out["failure"] = f"{total} records after the restarts, {records} acknowledged"
    finally:
        eb.close()
    return out


# -- report ---------------------------------------------------------------------------------------------------


def _lat(d: dict[str, Any] | None) -> str:
    d = d or {}
    return f"{fmt(d.get('p50_ms'), 2)} | {fmt(d.get('p99_ms'), 2)} | {fmt(d.get('max_ms'), 2)}"


def _failure(d: dict[str, Any]) -> list[str]:
    """A probe's closing lines: its failure, if any, then a blank line."""
    return (["", f"FAILED: {d['failure']}"] if d.get("failure") else []) + [""]


def render(results: dict[str, Any]) -> list[str]:
    """Markdown lines (tables) for the probes that ran."""
    out: list[str] = []
    for name, d in results.items():
        if "broker_log_tail" in d:
            out += [f"**{d['what']}**: FAILED: `{d['failure']}`. Broker log from its first error:", "", "```",
                    *d["broker_log_tail"], "```", ""]
    results = {k: v for k, v in results.items() if "broker_log_tail" not in v}
    p = results.get("partitions")
    if p:
        b, a = p["status_before"], p["status_after"]
        out += [f"**{p['partitions']:,} partitions** ({p['topics']} topics x {p['partitions_per_topic']}), "
                f"created in {fmt(p['create_s'], 1)} s (CreateTopics of 10 topics at a time):", "",
                "| measure | value |", "| --- | ---: |",
                f"| broker RSS before / after | {b['VmRSS'] / 1024:,.1f} MiB / {a['VmRSS'] / 1024:,.1f} MiB |",
                f"| idle memory per partition | **{fmt(p['rss_per_partition_kib'], 1)} KiB** |",
                f"| open file descriptors before / after (per partition) | {b['fds']:,} / {a['fds']:,} "
                f"({fmt(p['fds_per_partition'], 2)}) |",
                f"| files in the data dir | {p['data_dir_files']:,} |",
                f"| Metadata (all topics) round trip p50 / p99 / max, ms ({p['metadata_all_topics']['n']} "
                f"requests) | {_lat(p['metadata_all_topics']).replace(' | ', ' / ')} |",
                f"| the same, first request after a topic was added ({p['metadata_all_topics_after_change']['n']} "
                f"requests) | {_lat(p['metadata_all_topics_after_change']).replace(' | ', ' / ')} |",
                f"| restart with all of them after a clean stop / after kill -9, s | "
                f"{fmt(p['clean_restart_s'], 2)} / {fmt(p.get('kill9_restart_s'), 2)} |",
                f"| broker RSS after those restarts | {p['status_after_restart']['VmRSS'] / 1024:,.1f} MiB / "
                f"{p.get('status_after_kill9_restart', {}).get('VmRSS', 0) / 1024:,.1f} MiB |",
                f"| open file descriptors after those restarts | {p['status_after_restart']['fds']:,} / "
                f"{p.get('status_after_kill9_restart', {}).get('fds', 0):,} |"]
        out += _failure(p)
    t = results.get("transactions")
    if t:
        out += [f"**{t['open_txns']:,} concurrent open transactions** (raw protocol, one connection; each "
                f"transactional id: InitProducerId, AddPartitionsToTxn of 1 of {t['partitions']} partitions, "
                f"Produce of one {t['value_size']} B transactional record; all open at once, then committed "
                f"one EndTxn at a time):", "",
                "| round trip | n | p50 ms | p99 ms | max ms |", "| --- | ---: | ---: | ---: | ---: |"]
        for key, name in (("init_producer_id", "InitProducerId v4"), ("add_partitions", "AddPartitionsToTxn v3"),
                          ("produce", "Produce v9 (transactional, acks=-1)"),
                          ("end_txn", f"**EndTxn v3 commit, with up to {t['open_txns']:,} open**")):
            out.append(f"| {name} | {(t.get(key) or {}).get('n', 0)} | {_lat(t.get(key))} |")
        if "rss_per_open_txn_kib" in t:
            out += ["", f"Opening them took {fmt(t['open_s'], 1)} s, committing all {fmt(t['commit_all_s'], 1)} s; "
                        f"the LSO reached the high watermark on every partition {fmt(t['lso_caught_up_s'], 2)} s "
                        f"after the first EndTxn was sent. Broker RSS grew by "
                        f"{fmt(t['rss_per_open_txn_kib'], 1)} KiB per open transaction. "
                        f"AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS {t['concurrent_retries']} times."]
        out += _failure(t)
    r = results.get("restart")
    if r:
        size = r.get("data_dir_bytes")
        out += [f"**Restart of a large log**: {r['records']:,} records of {r['record_size'] // 1024} KiB over "
                f"{r['partitions']} partitions ({fmt(size / 1e9 if size else None, 2)} GB in the data dir); "
                f"time from spawning `oncelog serve` to \"oncelog listening\", page cache warm:", "",
                "| start | runs | median s | min s | max s |", "| --- | ---: | ---: | ---: | ---: |"]
        for key, name in (("empty_s", "empty data dir (baseline: interpreter and imports)"),
                          ("clean_s", "after a clean stop (SIGTERM)"), ("kill9_s", "after kill -9")):
            v = r.get(key) or []
            out.append(f"| {name} | {len(v)} | {fmt(statistics.median(v) if v else None, 2)} | "
                       f"{fmt(min(v) if v else None, 2)} | {fmt(max(v) if v else None, 2)} |")
        if "records_after" in r:
            out += ["", f"After the last restart the partitions held {r['records_after']:,} records "
                        f"(all acknowledged ones)."]
        out += _failure(r)
    return out


@dataclass
class Sizes:
    topics: int
    per_topic: int
    metadata_samples: int
    open_txns: int
    txn_partitions: int
    log_mb: int
    restart_rounds: int


def sizes_from_args(args: argparse.Namespace) -> Sizes:
    q = args.quick
    return Sizes(topics=args.topics or (10 if q else 100), per_topic=args.partitions_per_topic or 100,
                 metadata_samples=args.metadata_samples or (20 if q else 100),
                 open_txns=args.open_txns or (100 if q else 1000), txn_partitions=args.txn_partitions,
                 log_mb=args.log_mb or (100 if q else 1500), restart_rounds=args.restart_rounds or (1 if q else 3))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topics", type=int, help="partitions probe: topics (default 100; --quick 10)")
    p.add_argument("--partitions-per-topic", type=int, help="partitions probe: partitions per topic (default 100)")
    p.add_argument("--metadata-samples", type=int, help="Metadata requests timed (default 100; --quick 20)")
    p.add_argument("--open-txns", type=int, help="transactions probe: open transactions (default 1000; --quick 100)")
    p.add_argument("--txn-partitions", type=int, default=10, help="transactions probe: topic partitions (default 10)")
    p.add_argument("--log-mb", type=int, help="restart probe: MB of records (default 1500; --quick 100)")
    p.add_argument("--nofile", type=int, help="raise the soft open-files limit (RLIMIT_NOFILE) to this, at most the hard "
                                              "limit, before starting brokers (default: leave it; oncelog holds 1 "
                                              "descriptor per idle partition, 3 while its active segment is written)")
    p.add_argument("--restart-rounds", type=int, help="restart probe: clean + kill -9 restarts each (default 3; "
                                                      "--quick 1)")


def run_probes(only: set[str], sz: Sizes, data_root: Path | None) -> dict[str, Any]:
    """Run the probes in ``only``; a probe that raises is reported as failed with its broker's log tail."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="oncelog-scale-", dir=data_root) as tmp:
        root = Path(tmp)
        probes: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
            "partitions": (f"{sz.topics} x {sz.per_topic} partitions",
                           lambda: probe_partitions(root, sz.topics, sz.per_topic, sz.metadata_samples)),
            "transactions": (f"{sz.open_txns} open transactions",
                             lambda: probe_transactions(root, sz.open_txns, sz.txn_partitions)),
            "restart": (f"restart of a {sz.log_mb} MB log",
                        lambda: probe_restart(root, sz.log_mb, sz.restart_rounds)),
        }
        for name in PROBES:
            if name not in only:
                continue
            what, probe = probes[name]
            log(f"scale: {what} ...")
            try:
                results[name] = probe()
            except Exception as e:  # noqa: BLE001 - report it, go on with the next probe
                broker_log = root / f"{name}.log"
                lines = broker_log.read_text(errors="replace").splitlines() if broker_log.exists() else []
                # the first error is the cause; what follows is often the failing shutdown
                first = next((i for i, ln in enumerate(lines) if "Error" in ln or "Traceback" in ln), len(lines))
                tail = lines[max(0, first - 2):first + 25] if first < len(lines) else lines[-15:]
                results[name] = {"what": what, "failure": repr(e), "broker_log_tail": tail}
                log(f"  FAILED: {e!r}\n  broker log tail:\n    " + "\n    ".join(tail))
    return results


def raise_nofile(n: int | None) -> tuple[int, int]:
    """Raise RLIMIT_NOFILE (inherited by the brokers started later) to ``n``; return the limits in force."""
    if n:  # the soft limit only: raising the hard one needs privileges containers rarely grant
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (n if hard == resource.RLIM_INFINITY else min(n, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def failed(results: dict[str, Any]) -> bool:
    return any(v.get("failure") for v in results.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (1,000 partitions, 100 transactions, 100 MB)")
    p.add_argument("--only", default=",".join(PROBES), help=f"comma list of probes (default {','.join(PROBES)})")
    add_arguments(p)
    p.add_argument("--data-root", type=Path, help="parent directory for the brokers' temp data dirs")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write raw results as JSON")
    args = p.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    if only - set(PROBES):
        p.error(f"unknown probe(s): {only - set(PROBES)}")
    meta = {**run_metadata(), "nofile_limit": raise_nofile(args.nofile), "load_avg_at_start": os.getloadavg()}
    results = run_probes(only, sizes_from_args(args), args.data_root)
    meta["load_avg_at_end"] = os.getloadavg()
    print("# Scale probes\n")
    print("\n".join([f"- {k}: `{v}`" for k, v in meta.items()] + [""] + render(results)))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    return 1 if failed(results) else 0


if __name__ == "__main__":
    sys.exit(main())
