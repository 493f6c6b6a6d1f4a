"""``oncelog chaos --profile ci``: transactional copiers under seeded faults, audited by verify.

Runs the CLI in a subprocess exactly as a user would (docs/chaos.md) with a
fixed seed, so a failure names a reproducible fault schedule. Any anomaly is a
bug to investigate, not a flake: this test is not rerun.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.chaos.runner import PROFILES, records, schedule

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]

SEED = 42


def test_schedule_and_data_follow_the_seed() -> None:
    ci = PROFILES["ci"]
    a, b, c = schedule(ci, SEED), schedule(ci, SEED), schedule(ci, SEED + 1)
    assert a == b and a != c
    kinds = [f.kind for f in a]
    assert kinds.count("broker_hard") == ci.broker_hard and kinds.count("copier_hard") == ci.copier_hard
    assert [f.at for f in a] == sorted(f.at for f in a)
    assert records(50, SEED) == records(50, SEED) != records(50, SEED + 1)
    assert len({k for k, _ in records(1000, SEED)}) == 1000


def test_chaos_ci_profile(tmp_path: Path) -> None:
    work = tmp_path / "chaos"
    proc = subprocess.run(
        [sys.executable, "-m", "oncelog.cli", "chaos", "--profile", "ci", "--seed", str(SEED), "--json",
         "--work-dir", str(work)],
        capture_output=True, text=True, timeout=1100,
    )
    assert proc.stdout.strip(), f"no summary (exit {proc.returncode}); stderr:\n{proc.stderr[-4000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    events = proc.stderr[-6000:]
    anomalies = {k: summary[k] for k in ("lost", "duplicated", "aborted_visible", "out_of_order",
                                         "offsets_ahead", "unexpected")}
    assert anomalies == dict.fromkeys(anomalies, 0), (
        f"seed {SEED}: anomalies {anomalies}; examples {summary['verify']['examples']}; "
        f"broker log {work / 'broker.log'}\n{events}")
    assert summary["all_copied"] and not summary["timed_out"], f"seed {SEED}: not all copied\n{events}"
    assert proc.returncode == 0 and summary["ok"], f"exit {proc.returncode}\n{events}"
    ci = PROFILES["ci"]
    assert summary["records"] == ci.records
    assert summary["verify"]["input_records"] == ci.records
    assert summary["verify"]["output_records"] == ci.records
    assert summary["committed_offsets"] == summary["input_ends"]
    assert sum(summary["input_ends"].values()) == ci.records
    # the faults really happened while the copy ran
    applied = summary["faults_applied"]
    assert applied.get("broker_hard", 0) == ci.broker_hard, summary["faults"]
    assert applied.get("copier_hard", 0) == ci.copier_hard, summary["faults"]
    # Jepsen's Bufstream scenario happened: transactional requests reached the broker after their client gave up
    late = summary["proxy"]["late_requests"]
    assert summary["proxy"]["late_scheduled"] > 0 and late, summary["proxy"]
    print(f"late requests by API and the broker's answer: {late}")
    # the copiers fenced zombies and aborted transactions, so read_committed filtering was exercised
    assert summary["verify"]["aborted_seen"] > 0, summary["verify"]
    assert sum(c["processes"] for c in summary["copier"]) >= ci.copiers + ci.copier_hard + ci.copier_clean


def test_chaos_session_copiers(tmp_path: Path) -> None:
    """Copiers built on oncelog's TransactSession only, under broker and copier bounces and proxy bursts."""
    work = tmp_path / "chaos-session"
    proc = subprocess.run(
        [sys.executable, "-m", "oncelog.cli", "chaos", "--records", "4000", "--copiers", "3", "--broker-bounces", "2",
         "--copier-bounces", "2", "--clean-bounces", "1", "--proxy-bursts", "1", "--clients", "session",
         "--seed", "7", "--rate", "400", "--json", "--quiet", "--work-dir", str(work)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.stdout.strip(), f"no summary (exit {proc.returncode}); stderr:\n{proc.stderr[-4000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    anomalies = {k: summary[k] for k in ("lost", "duplicated", "aborted_visible", "out_of_order",
                                         "offsets_ahead", "unexpected")}
    assert anomalies == dict.fromkeys(anomalies, 0), (anomalies, summary["verify"]["examples"])
    assert proc.returncode == 0 and summary["ok"] and summary["all_copied"], proc.stderr[-4000:]
    assert summary["committed_offsets"] == summary["input_ends"]
    assert {c["client"] for c in summary["copier"]} == {"session"}
    assert sum(c["commits"] for c in summary["copier"]) > 0
    assert summary["faults_applied"].get("broker_hard", 0) == 2, summary["faults"]
