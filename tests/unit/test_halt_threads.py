"""A broker halting after its log directory failed must exit even if an fdatasync hangs.

The fsync of a failing disk can block for good. The group committer's rounds run on
daemon threads; the periodic flush (``log.flush.interval.messages`` > 1) and the log
cleaner's steps ran on ``ThreadPoolExecutor`` workers, which Python (3.9+) joins at
interpreter exit, and the halt's cleaner stop left a default-executor thread joining the
stuck step, which ``asyncio.run`` waits for: the process never ended. Each case runs in a
child process whose stuck thread never returns; it must exit (about 1 s each)."""

from __future__ import annotations

import subprocess
import sys

import pytest

FLUSH = """
import asyncio, threading
from oncelog.broker.durability import GroupCommitter

started = threading.Event()

def hang():
    started.set()
    threading.Event().wait()  # an fdatasync that never returns

class Log:
    log_end_offset = 1
    sync = staticmethod(hang)

class Partition:
    log = Log()
    def advance_high_watermark(self, offset):
        pass

async def main():
    committer = GroupCommitter(fsync_on_ack=False, flush_interval_ms=10)
    committer.wait_durable(Partition())
    flush = asyncio.get_running_loop().create_task(committer.periodic_flush())
    while not started.is_set():
        await asyncio.sleep(0.01)
    flush.cancel()  # the broker halts: its tasks are cancelled, the committer abandoned
    committer.abandon()

asyncio.run(main())
print("exited", flush=True)
"""

CLEANER = """
import asyncio, sys, threading
from oncelog.broker.log_cleaner import CleanerConfig, LogCleaner

started = threading.Event()

def hang():
    started.set()
    threading.Event().wait()  # a cleaner step stuck in an fsync

class Broker:
    def all_partitions(self):
        return []

    def clock(self):
        return 0

async def main():
    cleaner = LogCleaner(Broker(), CleanerConfig(backoff_ms=10))

    async def clean_once(cleaner_id=0):  # a pass whose step (run in the cleaner's thread) hangs
        await cleaner._step(hang)

    cleaner.clean_once = clean_once
    run = asyncio.get_running_loop().create_task(cleaner.run())
    while not started.is_set():
        await asyncio.sleep(0.01)
    if sys.argv[1] == "bounded":  # as the halt does it
        await cleaner.stop(run, timeout=0.5, quiet=True)
    else:  # any caller that gives up on stop() after a while
        await asyncio.wait_for(cleaner.stop(run), 0.5)

asyncio.run(main())
print("exited", flush=True)
"""


def _exits(script: str, *args: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the process did not exit with a hung fsync thread: {out!r} {err.decode()[-2000:]}")
    assert proc.returncode == 0 and out == b"exited\n", err.decode()[-2000:]


def test_a_hung_periodic_flush_does_not_keep_the_process_alive() -> None:
    _exits(FLUSH)


@pytest.mark.parametrize("how", ["bounded", "wait_for"])
def test_a_hung_cleaner_step_does_not_keep_the_process_alive(how: str) -> None:
    _exits(CLEANER, how)
