"""The exactly-once sink when the driver is SIGKILLed (its whole process tree) at each point of the
protocol, then the query restarts from its checkpoint. Each case ends in ``oncelog verify``'s report on
src -> dst (id: the value, which the job copies): 0 lost, 0 duplicated, 0 aborted-visible, order kept.

Each case runs the query in a subprocess (tests/spark/sink_job.py) twice: with the crash hook, then
without it. About 40 s a case (two Spark sessions).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.spark.helpers import check_verified, make_topic, produce
from tests.spark.test_sink import committed

from oncelog.spark.sink import DecisionLog, parse_sink_options

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
    # ... at its point: batch 1 is decided exactly when the kill came after the decision
    query = json.loads((ckpt / "metadata").read_text())["id"]
    opts = parse_sink_options({"kafka.bootstrap.servers": bs, "topic": dst}, streaming=True)
    latest = DecisionLog(opts).latest(query)
    assert latest is not None and latest.batch == (1 if point in ("after-decision", "after-complete") else 0)
    assert run_job(bs, src, dst, ckpt, None) == 0
    check_verified(bs, src, dst, 2, N)
    if point in ("after-decision", "after-complete"):
        # batch 1 was decided before the kill: Spark's replay of it wrote nothing at all, not even
        # records that were aborted later
        assert len(committed(bs, dst, 2, "read_uncommitted")) == N


def test_broker_killed_during_a_batch(spark: Any, tmp_path: Path) -> None:
    """The broker is SIGKILLed while a batch of an exactly-once query is being written (a transaction of
    the query's task ids is open, seen with ListTransactions), then restarts on the same port and data
    dir. The query (restarted from its checkpoint when it failed) finishes; verify counts the copy.
    Its own broker (the shared one is not killed) and the shared Spark session: about 30-60 s here."""
    import time

    from oncelog.client.admin import Admin
    from oncelog.testing import EmbeddedBroker

    from tests.spark.test_sink import _stream

    n, parts = 1200, 2
    broker = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log",
                            config={"transaction.two.phase.commit.enable": "true"})
    broker.start()
    try:
        bs = broker.bootstrap
        src, dst = f"s-{uuid.uuid4().hex[:8]}", f"d-{uuid.uuid4().hex[:8]}"
        make_topic(bs, src, parts)
        make_topic(bs, dst, parts)
        produce(bs, src, n, parts)
        ckpt = tmp_path / "ckpt"
        q = _stream(spark, bs, src, dst, ckpt, per_trigger=300)
        deadline = time.monotonic() + 60
        seen: list[str] = []
        with Admin(bs) as admin:
            while not seen and q.isActive:
                assert time.monotonic() < deadline, "no transaction of the query was seen open"
                seen = [t.transactional_id for t in admin.list_transactions(states=["Ongoing"])
                        if t.transactional_id.startswith(f"oncelog-spark-{q.id}-")]
        assert seen, "the query ended before a batch could be caught in flight"
        broker.kill()  # SIGKILL, mid-batch: the query's transactions are open
        broker.start()  # same port, same data dir
        restarts = 0
        while True:
            q.awaitTermination(120)
            assert not q.isActive, "the query did not finish"
            if q.exception() is None:
                break
            restarts += 1
            assert restarts <= 3, f"the query keeps failing: {q.exception()}"
            q = _stream(spark, bs, src, dst, ckpt, per_trigger=300)  # from its checkpoint
        check_verified(bs, src, dst, parts, n)
    finally:
        broker.close()
