"""examples/kvstore (issue 13): competing leaders per shard over conditional produce, and the control.

Two shards, three processes per shard that all believe they lead it, one of
them kill -9'd mid-run and restarted, then the broker bounced. Then every shard's log must replay to a
legal history (every compare-and-set holds), with contiguous offsets; every
acknowledged operation is in the log exactly once; no operation a leader saw
refused is in it; every leader's final state (caught up as a follower)
equals a fresh replay of the log up to its next offset. The same scenario with plain (unconditional) produce must
produce an illegal history: that is what shows the check can fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest


pytestmark = pytest.mark.timeout(300)

KV = Path(__file__).resolve().parents[2] / "examples" / "kvstore" / "kvstore.py"
SHARDS, LEADERS, SECONDS = 2, 3, 6.0


def _leader(bootstrap: str, topic: str, shard: int, name: str, out: Path, plain: bool) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(KV), "leader", "--bootstrap", bootstrap, "--topic", topic, "--shard", str(shard),
           "--name", name, "--out", str(out), "--seconds", str(SECONDS)] + (["--plain"] if plain else [])
    return subprocess.Popen(cmd, env=os.environ.copy())


def _run(broker_factory: Any, kit: Any, tmp_path: Path, topic: str, plain: bool) -> tuple[dict[str, Any], Path]:
    broker = broker_factory()
    kit.create_topic(broker.bootstrap, topic, SHARDS)
    out = tmp_path / topic
    out.mkdir()
    procs = {(s, i): _leader(broker.bootstrap, topic, s, f"s{s}-l{i}", out, plain)
             for s in range(SHARDS) for i in range(LEADERS)}
    time.sleep(SECONDS / 2)
    for s in range(SHARDS):  # kill -9 one would-be leader per shard, then restart it
        victim = procs[(s, 0)]
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        procs[(s, 0)] = _leader(broker.bootstrap, topic, s, f"s{s}-l0", out, plain)
    time.sleep(1.5)
    broker.restart()  # bounce the broker under the leaders: same port, same data
    for p in procs.values():
        assert p.wait(120) in (0,), p.args
    ks = sorted({json.loads(f.read_text())["k"] for f in out.glob("*.state")})
    res = subprocess.run([sys.executable, str(KV), "check", "--bootstrap", broker.bootstrap, "--topic", topic,
                          "--shards", str(SHARDS)] + [a for k in ks for a in ("--prefix", str(k))],
                         capture_output=True, timeout=120, env=os.environ.copy())
    assert res.returncode == 0, res.stderr.decode()
    return json.loads(res.stdout), out


def _lines(out: Path, shard: int, suffix: str) -> list[str]:
    got: list[str] = []
    for f in out.glob(f"s{shard}-l*.{suffix}"):
        got.extend(line for line in f.read_text().splitlines() if line)
    return got


def test_competing_leaders_keep_every_shard_legal(broker_factory: Any, kit: Any, tmp_path: Path) -> None:
    report, out = _run(broker_factory, kit, tmp_path, "kv", plain=False)
    total_refused = 0
    for s in range(SHARDS):
        r = report[str(s)]
        ids = r["ids"]
        acked, refused = _lines(out, s, "acks"), _lines(out, s, "refused")
        total_refused += len(refused)
        assert r["illegal"] == 0, f"shard {s}: {r['illegal']} operations whose compare-and-set fails on replay"
        assert r["offsets_contiguous"]
        assert len(ids) == len(set(ids)), f"shard {s}: an operation is in the log twice"
        assert len(acked) >= 20, f"shard {s}: too little progress ({len(acked)} acks) to prove anything"
        log = set(ids)
        assert [a for a in acked if a not in log] == [], f"shard {s}: acknowledged operations missing"
        assert [x for x in refused if x in log] == [], f"shard {s}: refused operations in the log"
        states = sorted(out.glob(f"s{s}-l*.state"))
        assert len(states) == LEADERS
        for f in states:  # every leader, ending as a follower, equals a fresh replay
            st = json.loads(f.read_text())
            assert st["state"] == r["prefix_states"][str(st["k"])], f"{f.name}: differs from a replay"
    assert total_refused > 0, "the leaders never raced: the test proves nothing"


def test_control_plain_produce_corrupts_the_history(broker_factory: Any, kit: Any, tmp_path: Path) -> None:
    report, _ = _run(broker_factory, kit, tmp_path, "kvplain", plain=True)
    assert sum(report[str(s)]["illegal"] for s in range(SHARDS)) > 0, report
