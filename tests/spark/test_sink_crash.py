"""The exactly-once sink when the driver is SIGKILLed (its whole process tree) at each point of the
protocol, then the query restarts from its checkpoint: every input id exactly once, order kept.

Each case runs the query in a subprocess (tests/spark/sink_job.py) twice: with the crash hook, then
without it. About 40 s a case (two Spark sessions).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.spark.helpers import make_topic, produce
from tests.spark.test_sink import check_exactly_once, committed

JOB = Path(__file__).with_name("sink_job.py")
N = 300


def run_job(bs: str, src: str, dst: str, ckpt: Path, crash: str | None) -> int:
    env = dict(os.environ)
    env.pop("ONCELOG_SPARK_SINK_CRASH", None)
    if crash:
        env["ONCELOG_SPARK_SINK_CRASH"] = crash
    proc = subprocess.Popen([sys.executable, str(JOB), bs, src, dst, str(ckpt)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the tree is left
        except ProcessLookupError:
            pass
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"job failed ({proc.returncode}): {err.decode()[-3000:]}")
    return proc.returncode


@pytest.mark.parametrize("point", ["during-write", "before-decision", "after-decision", "after-complete"])
def test_driver_killed_then_restarted(spark_broker: Any, tmp_path: Path, point: str) -> None:
    bs = spark_broker.bootstrap
    src, dst = f"s-{uuid.uuid4().hex[:8]}", f"d-{uuid.uuid4().hex[:8]}"
    make_topic(bs, src, 2)
    make_topic(bs, dst, 2)
    produce(bs, src, N, 2)
    ckpt = tmp_path / "ckpt"
    assert run_job(bs, src, dst, ckpt, f"{point}@1") == -signal.SIGKILL  # the hook fired
    assert run_job(bs, src, dst, ckpt, None) == 0
    check_exactly_once(committed(bs, dst, 2), N)
    if point in ("after-decision", "after-complete"):
        # batch 1 was decided before the kill: Spark's replay of it wrote nothing at all, not even
        # records that were aborted later
        assert len(committed(bs, dst, 2, "read_uncommitted")) == N
