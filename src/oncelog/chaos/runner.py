"""``oncelog chaos``: transactional copiers under a seeded fault schedule, audited by ``oncelog verify``.

The shape of Kafka's ``transactions_test.py``:

1. an embedded broker (its own process, data dir and port) is started behind
   a :class:`~oncelog.testing.fault_proxy.FaultProxy`; the broker advertises
   the proxy, so every client connection after bootstrap goes through it;
2. ``N`` records (key = a unique id, value = id + a seeded payload) are seeded
   into a 4-partition input topic by an idempotent producer;
3. ``K`` copier processes (:mod:`oncelog.chaos.copier`, confluent-kafka and
   kafka-python in turn) copy input to output in one consumer group;
4. faults are injected from a schedule drawn from ``--seed``, each at a
   fraction of the copy's progress:

   * ``broker_hard``: SIGKILL the broker, restart it on the same data dir and port;
   * ``broker_clean``: SIGTERM the broker, restart it;
   * ``copier_hard``: SIGKILL a copier (usually inside a transaction) and start a
     replacement with the same ``transactional.id`` (zombie fencing);
   * ``copier_clean``: SIGTERM a copier (it finishes its transaction and leaves
     the group) and start a replacement;
   * ``proxy_late``: for a burst, the proxy takes some Produce and
     AddPartitionsToTxn requests out of their connections and delivers them
     (on a fresh connection) later than the clients' request timeout: the
     client gives up, retries or aborts, and moves on, and the late request
     reaches the broker after the next transaction began (Jepsen's Bufstream
     scenario). The broker's answers to the late requests are in the summary.
     Late EndTxn and TxnOffsetCommit requests are left out: with the classic
     transactions these clients speak, a late EndTxn can end the *next*
     transaction in Apache Kafka too (KAFKA-17754); transactions v2 closes
     that, see ``tests/integration/test_txn_protocol.py``;
   * ``proxy_drop_dup``: for a burst, lost responses (gap or close) and duplicated
     requests of the transactional APIs (Produce, AddPartitionsToTxn,
     AddOffsetsToTxn, EndTxn, TxnOffsetCommit);
   * ``proxy_close``: for a burst, connections closed at random frames;

5. once the group's committed offsets reach the input end and every copier has
   exited, the copy is audited with :func:`oncelog.verify.run` (lost,
   duplicated, aborted_visible, out_of_order, offsets_ahead, unexpected).

The exit status is 0 only with zero anomalies and every record copied (the
output holds every input id and the committed offsets equal the input ends).
The seed fixes the data and the fault schedule (which fault, at which share
of progress, which copier, downtimes, burst rates, the proxy's own draws);
thread and network timing still vary between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FAULT_KINDS = ("broker_hard", "broker_clean", "copier_hard", "copier_clean", "proxy_late", "proxy_drop_dup",
               "proxy_close")
BOUNCES = ("broker_hard", "broker_clean", "copier_hard", "copier_clean")
TXN_APIS = frozenset({0, 24, 25, 26, 28})  # Produce, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
LATE_APIS = frozenset({0, 24})  # Produce, AddPartitionsToTxn: what proxy_late delivers late
LATE_MIN = 2  # a proxy_late burst lasts until it held back this many requests ...
LATE_GRACE_S = 30.0  # ... or this long
CLIENTS = ("confluent", "kafka-python", "session")
REQUEST_TIMEOUT_MS = 3000


@dataclass
class Profile:
    records: int
    partitions: int = 4
    copiers: int = 3
    clients: tuple[str, ...] = CLIENTS
    broker_hard: int = 3
    broker_clean: int = 1
    copier_hard: int = 3
    copier_clean: int = 1
    proxy_late: int = 2
    proxy_drop_dup: int = 2
    proxy_close: int = 1
    max_per_txn: int = 100
    rate: float = 200.0  # records/s for all copiers together (0: unpaced)
    timeout: float = 600.0
    session_timeout_ms: int = 6000
    progress_bar: bool = False
    assignor: str = ""  # partition.assignment.strategy of every copier ("": the client's default)
    churn: float = 0.0  # seconds between membership changes on a timer (0: off); see Runner.churn_step
    churn_gap: float = 1.0  # seconds a churned slot stays empty before its replacement joins


PROFILES = {
    # ~2 minutes of copying at 200 records/s; faults between 5 % and 85 % of the copy
    "ci": Profile(records=20_000),
    # 100 bounce cycles (40 + 10 broker, 40 + 10 copier) and 45 proxy bursts
    "long": Profile(records=200_000, copiers=4, broker_hard=40, broker_clean=10, copier_hard=40, copier_clean=10,
                    proxy_late=15, proxy_drop_dup=20, proxy_close=10, rate=250.0, timeout=3 * 3600.0,
                    progress_bar=True),
}


@dataclass
class Fault:
    kind: str
    at: float  # share of the records copied (committed) when it fires
    slot: int = -1  # copier faults: the preferred slot
    downtime: float = 0.0  # broker bounces: seconds down; bursts: seconds on
    params: dict[str, Any] = field(default_factory=dict)
    fired: float | None = None  # seconds since the copy started
    note: str = ""


def schedule(profile: Profile, seed: int) -> list[Fault]:
    """The fault schedule for ``seed``: same seed and profile, same faults in the same order."""
    rng = random.Random(f"oncelog-chaos-schedule-{seed}")
    kinds = [k for k in FAULT_KINDS for _ in range(getattr(profile, k))]
    rng.shuffle(kinds)
    ats = sorted(rng.uniform(0.05, 0.85) for _ in kinds)
    faults = []
    for kind, at in zip(kinds, ats):
        f = Fault(kind, round(at, 4))
        if kind.startswith("copier"):
            f.slot = rng.randrange(profile.copiers)
        elif kind.startswith("broker"):
            f.downtime = round(rng.uniform(0.1, 2.0), 2)
        elif kind == "proxy_late":
            lo = REQUEST_TIMEOUT_MS * rng.uniform(1.1, 1.5)
            f.downtime = round(rng.uniform(3.0, 6.0), 2)
            f.params = {"late_ms": (round(lo), round(lo + rng.uniform(500, 3000))),
                        "late_rate": round(rng.uniform(0.1, 0.3), 3)}
        elif kind == "proxy_drop_dup":
            f.downtime = round(rng.uniform(3.0, 8.0), 2)
            f.params = {"drop_response_rate": round(rng.uniform(0.02, 0.1), 3),
                        "duplicate_rate": round(rng.uniform(0.02, 0.15), 3),
                        "drop_mode": rng.choice(["gap", "close"])}
        elif kind == "proxy_close":
            f.downtime = round(rng.uniform(2.0, 5.0), 2)
            f.params = {"close_rate": round(rng.uniform(0.005, 0.03), 4)}
        faults.append(f)
    return faults


def records(n: int, seed: int) -> list[tuple[bytes, bytes]]:
    """The input records (key, value) for ``seed``: key = unique id, value = id + a seeded payload."""
    rng = random.Random(f"oncelog-chaos-data-{seed}")
    out = []
    for i in range(n):
        payload = rng.randbytes(rng.randrange(8, 96)).hex()
        out.append((b"%d" % i, b"%d:%s" % (i, payload.encode())))
    return out


# -- copier processes ------------------------------------------------------------------------------


class Slot:
    """One copier slot: a transactional.id and the process currently holding it."""

    def __init__(self, runner: "Runner", index: int, client: str) -> None:
        self.runner = runner
        self.index = index
        self.client = client
        self.txn_id = f"chaos-{runner.tag}-{index}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.gen = 0
        self.done = False
        self.expected_exit = False  # we signalled it
        self.commits = 0
        self.records = 0
        self.aborts = 0
        self.abort_reasons: Counter[str] = Counter()
        self.fatal: list[str] = []
        self.restarts_after_error = 0
        self.exit_codes: list[int] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        r = self.runner
        self.gen += 1
        self.expected_exit = False
        cmd = [sys.executable, "-m", "oncelog.chaos.copier", "--client", self.client,
               "--bootstrap", r.proxy.bootstrap, "--input", r.input, "--output", r.output, "--group", r.group,
               "--transactional-id", self.txn_id, "--client-id", f"copier{self.index}.{self.gen}",
               "--ends", ",".join(str(e) for e in r.ends), "--max-per-txn", str(r.profile.max_per_txn),
               "--rate", str(r.profile.rate / r.profile.copiers if r.profile.rate > 0 else 0),
               "--session-timeout-ms", str(r.profile.session_timeout_ms),
               *(["--assignor", r.profile.assignor] if r.profile.assignor else []),
               "--request-timeout-ms", str(REQUEST_TIMEOUT_MS), "--stuck-timeout", str(r.stuck_timeout)]
        log = open(r.work / f"copier{self.index}.log", "ab")
        log.write(f"--- start gen {self.gen} ({self.client}) at {r.elapsed():.1f}s\n".encode())
        log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
        log.close()
        threading.Thread(target=self._read, args=(self.proc,), daemon=True, name=f"copier{self.index}").start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            word, _, rest = line.partition(" ")
            with self.lock:
                if word == "commit":
                    self.commits += 1
                    self.records += int(rest)
                    self.runner.add_progress(int(rest))
                elif word == "abort":
                    self.aborts += 1
                    self.abort_reasons[rest.partition(" ")[2][:60] or "?"] += 1
                elif word == "done":
                    self.done = True
                elif word == "fatal":
                    self.fatal.append(rest[:300])
                    self.runner.event(f"copier{self.index}.{self.gen} fatal: {rest[:200]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.expected_exit = True
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


# -- the run ---------------------------------------------------------------------------------------


class Runner:
    def __init__(self, profile: Profile, seed: int, work: Path, json_mode: bool = False,
                 verbose: bool = True) -> None:
        self.profile = profile
        self.seed = seed
        self.work = work
        self.json_mode = json_mode
        self.verbose = verbose
        self.tag = f"s{seed}"
        self.input, self.output, self.group = f"chaos-in-{self.tag}", f"chaos-out-{self.tag}", f"chaos-{self.tag}"
        self.faults = schedule(profile, seed)
        self.progress = 0
        self.plock = threading.Lock()
        self.events: list[str] = []
        self.t0 = time.monotonic()
        self.ends: list[int] = []
        self.proxy: Any = None
        self.broker: Any = None
        self.slots: list[Slot] = []
        self.burst_until = 0.0
        self.burst_fault: Fault | None = None
        self.burst_late_from = 0  # proxy.stats.late_scheduled when a proxy_late burst began
        self.bar: Any = None
        self.bar_task: Any = None
        self.console: Any = None
        self.stuck_timeout = 90
        self.churn_rng = random.Random(f"oncelog-chaos-churn-{seed}")
        self.churn_count = 0
        self.next_churn = 0.0
        self.rejoin_at: dict[int, float] = {}  # slot index -> when its replacement starts (churn)

    # -- bookkeeping

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def add_progress(self, n: int) -> None:
        with self.plock:
            self.progress += n

    def event(self, msg: str) -> None:
        line = f"[{self.elapsed():7.1f}s] {msg}"
        self.events.append(line)
        if self.bar is not None:
            self.bar.console.print(line, highlight=False, markup=False)
        elif self.verbose:
            print(line, file=sys.stderr if self.json_mode else sys.stdout, flush=True)

    # -- setup

    def start_cluster(self) -> None:
        from oncelog.testing.embedded import EmbeddedBroker, free_port
        from oncelog.testing.fault_proxy import FaultProxy

        port = free_port()
        self.proxy = FaultProxy(("127.0.0.1", port), seed=self.seed, connect_timeout=2.0, api_keys=TXN_APIS,
                                late_api_keys=LATE_APIS)
        config = {
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.proxy.port}",
            "group.initial.rebalance.delay.ms": "0",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
        }
        self.broker = EmbeddedBroker(data_dir=self.work / "data", port=port, config=config,
                                     log_path=self.work / "broker.log")
        self.proxy.start()
        self.broker.start()

    def seed_input(self) -> None:
        from oncelog.client import Admin

        with Admin({"bootstrap.servers": self.broker.bootstrap}) as admin:
            for topic in (self.input, self.output):
                admin.create_topic(topic, self.profile.partitions)
        data = records(self.profile.records, self.seed)
        parts = self.profile.partitions
        try:
            from confluent_kafka import Producer
        except ImportError:
            Producer = None
        if Producer is not None:
            errors: list[str] = []
            p = Producer({"bootstrap.servers": self.broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
            for i, (k, v) in enumerate(data):
                while True:
                    try:
                        p.produce(self.input, key=k, value=v, partition=i % parts,
                                  on_delivery=lambda err, _m: err is not None and errors.append(str(err)))
                        break
                    except BufferError:
                        p.poll(0.05)
                p.poll(0)
            if p.flush(120) != 0 or errors:
                raise RuntimeError(f"seeding failed: {errors[:3]}")
        else:
            from kafka import KafkaProducer

            kp = KafkaProducer(bootstrap_servers=self.broker.bootstrap, enable_idempotence=True, linger_ms=5)
            futs = [kp.send(self.input, key=k, value=v, partition=i % parts) for i, (k, v) in enumerate(data)]
            kp.flush(120)
            for f in futs:
                f.get(timeout=60)
            kp.close()
        self.ends = [len(range(q, self.profile.records, parts)) for q in range(parts)]

    # -- faults

    def copier_for(self, fault: Fault) -> Slot | None:
        live = [s for s in self.slots if s.alive() and not s.done]
        if not live:
            return None
        preferred = self.slots[fault.slot % len(self.slots)]
        return preferred if preferred in live else live[fault.slot % len(live)]

    def fire(self, fault: Fault) -> None:
        fault.fired = round(self.elapsed(), 1)
        kind = fault.kind
        if kind in ("broker_hard", "broker_clean"):
            t = time.monotonic()
            if kind == "broker_hard":
                self.broker.kill()
            else:
                self.broker.stop()
            time.sleep(fault.downtime)
            self.broker.start(timeout=120)
            fault.note = f"down {time.monotonic() - t:.1f}s"
        elif kind in ("copier_hard", "copier_clean"):
            slot = self.copier_for(fault)
            if slot is None:
                fault.note = "no live copier"
                return
            if kind == "copier_hard":
                slot.signal(signal.SIGKILL)
                rc = slot.wait(30)
            else:
                slot.signal(signal.SIGTERM)
                rc = slot.wait(60)
                if rc is None:
                    slot.signal(signal.SIGKILL)
                    rc = slot.wait(30)
                    fault.note = "SIGTERM ignored for 60s, killed; "
            slot.exit_codes.append(rc if rc is not None else -999)
            if slot.done:  # it finished the copy on its way out
                fault.note += f"copier{slot.index} (done)"
                return
            fault.note += f"copier{slot.index}.{slot.gen} ({slot.client}) exit {rc}"
            slot.start()
        else:
            self.proxy.set_faults(**fault.params)
            self.burst_until = time.monotonic() + fault.downtime
            self.burst_fault = fault
            self.burst_late_from = self.proxy.stats.late_scheduled
            fault.note = f"{fault.downtime}s {fault.params}"
        self.event(f"fault {kind} at {fault.at:.0%}: {fault.note}")

    def end_burst(self, force: bool = False) -> None:
        if not self.burst_until or (not force and time.monotonic() < self.burst_until):
            return
        fault = self.burst_fault
        if fault is not None and fault.kind == "proxy_late":
            late = self.proxy.stats.late_scheduled - self.burst_late_from
            # a burst that met no transactional request (the copiers were rebalancing) goes on, up to LATE_GRACE_S
            if not force and late < LATE_MIN and time.monotonic() < self.burst_until - fault.downtime + LATE_GRACE_S:
                return
            fault.note += f"; {late} requests held back"
        self.burst_until = 0.0
        self.burst_fault = None
        self.proxy.set_faults(drop_response_rate=0.0, duplicate_rate=0.0, close_rate=0.0,
                              delay_ms=(0.0, 0.0), drop_mode="gap", late_rate=0.0)

    def churn_step(self) -> None:
        """One timed membership change: a copier is killed (SIGKILL) or leaves (SIGTERM: it ends its
        transaction and leaves the group), alternately, and its replacement joins ``churn_gap`` seconds
        later, so each step is a leave (or a death the session timeout notices) and then a join."""
        live = [s for s in self.slots if s.alive() and not s.done and s.index not in self.rejoin_at]
        if not live:
            return
        kind = "copier_hard" if self.churn_count % 2 == 0 else "copier_clean"
        self.churn_count += 1
        slot = live[self.churn_rng.randrange(len(live))]
        f = Fault(kind, round(self.progress / self.profile.records, 4), slot.index,
                  fired=round(self.elapsed(), 1), note="churn: ")
        self.faults.append(f)
        slot.signal(signal.SIGKILL if kind == "copier_hard" else signal.SIGTERM)
        rc = slot.wait(30 if kind == "copier_hard" else 60)
        if rc is None:
            slot.signal(signal.SIGKILL)
            rc = slot.wait(30)
            f.note += "SIGTERM ignored, killed; "
        slot.exit_codes.append(rc if rc is not None else -999)
        if slot.done:
            f.note += f"copier{slot.index} (done)"
        else:
            f.note += f"copier{slot.index}.{slot.gen} ({slot.client}) exit {rc}, rejoins in {self.profile.churn_gap}s"
            self.rejoin_at[slot.index] = time.monotonic() + self.profile.churn_gap
        self.event(f"{kind} (churn) at {f.at:.0%}: {f.note}")

    def rejoin(self, force: bool = False) -> None:
        now = time.monotonic()
        for i, t in list(self.rejoin_at.items()):
            if force or now >= t:
                del self.rejoin_at[i]
                if not force:
                    self.slots[i].start()

    def supervise(self) -> None:
        """Restart copiers that exited on their own (a fatal client error, the stuck watchdog)."""
        for s in self.slots:
            if s.proc is None or s.alive() or s.done or s.expected_exit:
                continue
            rc = s.proc.returncode
            s.exit_codes.append(rc)
            if rc == 2:
                raise RuntimeError(f"copier{s.index} ({s.client}) cannot run: see {self.work}/copier{s.index}.log")
            s.restarts_after_error += 1
            reason = s.fatal[-1] if s.fatal else "?"
            self.event(f"copier{s.index}.{s.gen} exited {rc} ({reason[:120]}); replacement started")
            s.start()

    def finished(self) -> bool:
        return any(s.done for s in self.slots) and not any(s.alive() for s in self.slots)

    # -- main

    def run(self) -> dict[str, Any]:
        p = self.profile
        self.event(f"seed {self.seed}; work dir {self.work}; {p.records} records, {p.partitions} partitions, "
                   f"{p.copiers} copiers ({', '.join(p.clients)})")
        self.event("schedule: " + ", ".join(f"{f.kind}@{f.at:.0%}" for f in self.faults))
        self.start_cluster()
        self.event(f"broker {self.broker.bootstrap} (pid {self.broker.proc.pid}), proxy {self.proxy.bootstrap}")
        self.seed_input()
        self.event(f"seeded {p.records} records into {self.input}, end offsets {self.ends}")
        self.t0 = time.monotonic()
        copy_t0 = self.t0
        for i in range(p.copiers):
            s = Slot(self, i, p.clients[i % len(p.clients)])
            self.slots.append(s)
            s.start()
        pending = list(self.faults)
        deadline = time.monotonic() + p.timeout
        timed_out = False
        last_fault = 0.0
        if p.progress_bar:
            self._start_bar()
        try:
            while not self.finished():
                if time.monotonic() > deadline:
                    timed_out = True
                    self.event(f"TIMEOUT after {p.timeout:.0f}s with {self.progress} records committed")
                    break
                self.supervise()
                self.end_burst()
                done_copying = any(s.done for s in self.slots)
                self.rejoin(force=done_copying)
                if p.churn > 0 and not done_copying and time.monotonic() >= self.next_churn:
                    if self.next_churn:
                        self.churn_step()
                    self.next_churn = time.monotonic() + p.churn
                if (pending and not done_copying and not self.burst_until
                        and self.progress >= pending[0].at * p.records and time.monotonic() - last_fault > 1.0):
                    self.fire(pending.pop(0))
                    last_fault = time.monotonic()
                self._update_bar()
                time.sleep(0.1)
        finally:
            self.end_burst(force=True)
            self.kill_copiers()
            self._stop_bar()
        copy_seconds = time.monotonic() - copy_t0
        for f in pending:
            f.note = "skipped: the copy finished first" if not timed_out else "skipped: timeout"
        self.event(f"copy finished in {copy_seconds:.1f}s; auditing")
        return self.audit(copy_seconds, timed_out)

    def audit(self, copy_seconds: float, timed_out: bool) -> dict[str, Any]:
        from oncelog import verify

        t = time.monotonic()
        report = verify.run(self.broker.bootstrap, self.input, self.output, "key", self.group, "partition",
                            max_examples=5, timeout=60)
        committed = verify.committed_offsets(self.broker.bootstrap, self.group, self.input, timeout=60)
        ends = dict(enumerate(self.ends))
        all_copied = (report.output_records >= self.profile.records and report.counts["lost"] == 0
                      and committed == ends)
        applied = Counter(f.kind for f in self.faults if f.fired is not None and not f.note.startswith("skipped")
                          and f.note != "no live copier")
        st = self.proxy.stats
        summary: dict[str, Any] = {
            "seed": self.seed,
            "records": self.profile.records,
            "partitions": self.profile.partitions,
            "copiers": self.profile.copiers,
            "clients": list(self.profile.clients),
            "assignor": self.profile.assignor or "default",
            "churn_steps": self.churn_count,
            "copy_seconds": round(copy_seconds, 1),
            "audit_seconds": round(time.monotonic() - t, 1),
            "timed_out": timed_out,
            "faults_scheduled": dict(Counter(f.kind for f in self.faults)),
            "faults_applied": dict(applied),
            "faults": [asdict(f) for f in self.faults],
            "copier": [{"slot": s.index, "client": s.client, "transactional_id": s.txn_id, "processes": s.gen,
                        "commits": s.commits, "records_committed": s.records, "aborts": s.aborts,
                        "abort_reasons": dict(s.abort_reasons.most_common(5)),
                        "restarts_after_error": s.restarts_after_error, "fatal": s.fatal[:5],
                        "exit_codes": s.exit_codes} for s in self.slots],
            "records_committed_by_copiers": self.progress,
            "proxy": {"connections": st.connections, "requests": st.requests, "delays": st.delays,
                      "dropped_responses": st.dropped_responses, "duplicated_requests": st.duplicated_requests,
                      "closes": st.closes, "upstream_connect_failures": st.upstream_connect_failures,
                      "late_scheduled": st.late_scheduled,
                      "late_requests": late_answers_by_api(self.proxy.late_answers())},
            "committed_offsets": {str(k): v for k, v in sorted(committed.items())},
            "input_ends": {str(k): v for k, v in ends.items()},
            "verify": report.to_json(),
            "all_copied": all_copied,
            "work_dir": str(self.work),
        }
        for a in verify.ANOMALIES:
            summary[a] = report.counts[a]
        summary["ok"] = bool(report.clean and all_copied and not timed_out)
        self._report = report
        return summary

    # -- progress bar (long profile)

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("[bold]chaos[/bold] seed {task.fields[seed]}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("records  faults {task.fields[faults]}"),
                            TextColumn("copiers {task.fields[live]}"), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=False)
        self.bar.start()
        self.bar_task = self.bar.add_task("copy", total=self.profile.records, seed=self.seed,
                                          faults=f"0/{len(self.faults)}", live=0)

    def _update_bar(self) -> None:
        if self.bar is not None:
            fired = sum(f.fired is not None for f in self.faults)
            self.bar.update(self.bar_task, completed=min(self.progress, self.profile.records),
                            faults=f"{fired}/{len(self.faults)}", live=sum(s.alive() for s in self.slots))

    def _stop_bar(self) -> None:
        if self.bar is not None:
            self._update_bar()
            self.bar.stop()
            self.bar = None

    def kill_copiers(self) -> None:
        for s in self.slots:
            if s.alive():
                s.signal(signal.SIGKILL)
                s.wait(10)

    def close(self) -> None:
        self.kill_copiers()
        if self.broker is not None:
            try:
                self.broker.stop()
            except Exception:  # noqa: BLE001 - best effort
                pass
        if self.proxy is not None:
            self.proxy.stop()


# -- output ----------------------------------------------------------------------------------------


def late_answers_by_api(answers: list[Any]) -> dict[str, dict[str, int]]:
    """Requests delivered after their client gave up (Jepsen's Bufstream scenario), by API and broker answer.

    An answer lists its error codes joined by ``+`` (a Produce to two
    partitions refused on both: ``INVALID_PRODUCER_EPOCH+INVALID_PRODUCER_EPOCH``);
    ``no answer`` means the broker was down or the request expected none.
    """
    out: dict[str, Counter[str]] = {}
    for a in answers:
        key = ("+".join(sorted(set(a.error_names))) or "no error code") if a.answered and not a.error else (
            "undecodable" if a.answered else "no answer")
        out.setdefault(a.api, Counter())[key] += 1
    return {api: dict(c) for api, c in sorted(out.items())}


def print_summary(summary: dict[str, Any], runner: Runner) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from oncelog import verify

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=max(console.width, 200))
    verify.print_table(runner._report, runner.input, runner.output, runner.group)
    faults = Table(title=f"oncelog chaos: seed {summary['seed']}", box=box.SIMPLE, title_justify="left")
    for h in ("fault", "at", "fired (s)", "what happened"):
        faults.add_column(h)
    for f in summary["faults"]:
        faults.add_row(f["kind"], f"{f['at']:.0%}", "-" if f["fired"] is None else str(f["fired"]), f["note"])
    console.print(faults)
    copiers = Table(box=box.SIMPLE)
    for h in ("slot", "client", "processes", "commits", "records", "aborts", "restarts after error", "abort reasons"):
        copiers.add_column(h)
    for c in summary["copier"]:
        copiers.add_row(str(c["slot"]), c["client"], str(c["processes"]), str(c["commits"]),
                        str(c["records_committed"]), str(c["aborts"]), str(c["restarts_after_error"]),
                        ", ".join(f"{k} x{v}" for k, v in c["abort_reasons"].items()))
    console.print(copiers)
    px = summary["proxy"]
    console.print(f"proxy: {px['connections']} connections, {px['requests']} requests, {px['delays']} delayed, "
                  f"{px['late_scheduled']} held back to arrive late, "
                  f"{px['dropped_responses']} responses dropped, {px['duplicated_requests']} requests duplicated, "
                  f"{px['closes']} connections closed")
    late = px["late_requests"]
    console.print("requests delivered after their client gave up: " + (
        "; ".join(f"{api}: " + ", ".join(f"{k} x{v}" for k, v in answers.items()) for api, answers in late.items())
        or "none"))
    console.print(f"copy {summary['copy_seconds']}s, audit {summary['audit_seconds']}s; committed offsets "
                  f"{summary['committed_offsets']} (input ends {summary['input_ends']}); all copied: "
                  f"{summary['all_copied']}")
    console.print(f"seed {summary['seed']}: " + ("[green]OK: zero anomalies, every record copied[/green]"
                                                  if summary["ok"] else "[bold red]FAILED[/bold red]")
                  + f"  (work dir {summary['work_dir']})")


# -- CLI -------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=sorted(PROFILES), default="ci",
                   help="ci: 20k records, 3+3 hard bounces (make test); long: 100 bounce cycles (soak)")
    p.add_argument("--seed", type=int, default=None, help="fixes the data and the fault schedule (default: random)")
    p.add_argument("--records", type=int, help="records to seed and copy")
    p.add_argument("--copiers", type=int, help="copier processes (slots)")
    p.add_argument("--clients", help="comma-separated copier clients, used in turn (confluent,kafka-python)")
    p.add_argument("--broker-bounces", type=int, help="broker hard bounces (kill -9, restart)")
    p.add_argument("--copier-bounces", type=int, help="copier hard bounces (SIGKILL, replacement)")
    p.add_argument("--clean-bounces", type=int, help="clean bounces (SIGTERM) of the broker and of a copier, each")
    p.add_argument("--proxy-bursts", type=int, help="bursts of each proxy fault kind (late, drop/dup, close)")
    p.add_argument("--rate", type=float, help="records/s for all copiers together, paced inside transactions (0: off)")
    p.add_argument("--timeout", type=float, help="give up (and fail) after this many seconds of copying")
    p.add_argument("--partitions", type=int, help="partitions of the input and output topics")
    p.add_argument("--max-per-txn", type=int, help="records per transaction at most")
    p.add_argument("--assignor", choices=("range", "roundrobin", "cooperative-sticky"),
                   help="partition.assignment.strategy of every copier (default: each client's default)")
    p.add_argument("--churn", type=float,
                   help="every this many seconds a copier is killed (SIGKILL) or leaves (SIGTERM), alternately, "
                        "and its replacement joins a second later (0: off)")
    p.add_argument("--work-dir", help="where the broker data and logs go (default: a new temporary directory)")
    p.add_argument("--keep-data", action="store_true", help="keep the work dir (always kept on failure)")
    p.add_argument("--json", action="store_true", help="print one JSON summary object on stdout")
    p.add_argument("--quiet", action="store_true", help="no event lines while running")


def profile_from_args(args: argparse.Namespace) -> Profile:
    prof = Profile(**asdict(PROFILES[args.profile]))
    prof.clients = tuple(PROFILES[args.profile].clients)
    if args.records is not None:
        prof.records = args.records
    if args.copiers is not None:
        prof.copiers = args.copiers
    if args.clients:
        prof.clients = tuple(c.strip() for c in args.clients.split(",") if c.strip())
        bad = [c for c in prof.clients if c not in CLIENTS]
        if bad:
            raise ValueError(f"unknown client {bad[0]!r} (choose from {', '.join(CLIENTS)})")
    if args.broker_bounces is not None:
        prof.broker_hard = args.broker_bounces
    if args.copier_bounces is not None:
        prof.copier_hard = args.copier_bounces
    if args.clean_bounces is not None:
        prof.broker_clean = prof.copier_clean = args.clean_bounces
    if args.proxy_bursts is not None:
        prof.proxy_late = prof.proxy_drop_dup = prof.proxy_close = args.proxy_bursts
    if args.rate is not None:
        prof.rate = args.rate
    if args.timeout is not None:
        prof.timeout = args.timeout
    if args.partitions is not None:
        prof.partitions = args.partitions
    if args.max_per_txn is not None:
        prof.max_per_txn = args.max_per_txn
    if args.assignor:
        prof.assignor = args.assignor
        if args.assignor == "cooperative-sticky" and "kafka-python" in prof.clients:
            raise ValueError("kafka-python has no cooperative-sticky assignor; use --clients confluent,session")
    if args.churn is not None:
        prof.churn = args.churn
    if prof.records < prof.partitions or prof.copiers < 1 or prof.partitions < 1 or prof.max_per_txn < 1:
        raise ValueError("need at least one partition, one record per partition, one record per transaction "
                         "and one copier")
    if prof.churn < 0:
        raise ValueError("--churn must be 0 (off) or a number of seconds")
    return prof


def missing_clients(clients: tuple[str, ...]) -> list[str]:
    import importlib.util

    mods = {"confluent": "confluent_kafka", "kafka-python": "kafka", "session": "oncelog.client"}
    return [c for c in clients if importlib.util.find_spec(mods[c]) is None]


def main(args: argparse.Namespace) -> int:
    try:
        profile = profile_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = missing_clients(profile.clients)
    if missing:
        print(f"error: oncelog chaos runs its copiers with {', '.join(missing)}, which is not installed; "
              "install the test extras: pip install 'oncelog[test]' (confluent-kafka, kafka-python)",
              file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    own_dir = args.work_dir is None
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix=f"oncelog-chaos-{seed}-"))
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(profile, seed, work, json_mode=args.json, verbose=not args.quiet)

    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    summary: dict[str, Any] | None = None
    try:
        summary = runner.run()
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - reported with the seed and the work dir
        print(f"error: chaos run with seed {seed} failed: {exc!r}; logs in {work}", file=sys.stderr)
        return 2
    finally:
        runner.close()
        keep = args.keep_data or summary is None or not summary.get("ok")
        if own_dir and not keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    else:
        print_summary(summary, runner)
    return 0 if summary["ok"] else 1
