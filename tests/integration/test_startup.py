"""Broker startup: the data-directory lock, the port bound before the data
directory is touched, and EmbeddedBroker's process hygiene.

Issue 10: a second ``oncelog serve`` on a live broker's data directory started,
and on shutdown snapshotted and deleted files the first broker still used; an
offset commit acknowledged by the first broker afterwards was lost after its
kill -9. Kafka locks each log directory (``.lock``) and refuses to start.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from oncelog.client.groups import GroupAdmin
from oncelog.testing import EmbeddedBroker
from oncelog.testing.embedded import free_port

pytestmark = pytest.mark.timeout(120)

TOPIC, GROUP = "locked", "lock-g"


def serve(*args: str, cwd: Path | None = None, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    """``oncelog serve ARGS``; a broker still running after ``timeout`` fails the test."""
    proc = subprocess.Popen([sys.executable, "-m", "oncelog.cli", "serve", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"oncelog serve {' '.join(args)} did not refuse to start; stderr: {err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_refused(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "oncelog listening" not in r.stdout


def tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file and directory under ``root``: (size, mtime_ns, content)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, p.read_bytes() if p.is_file() else b"")
    return out


def test_second_broker_on_a_locked_data_dir_refuses_and_changes_nothing(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    data = tmp_path / "data"
    first = EmbeddedBroker(data_dir=data, log_path=tmp_path / "first.log")
    first.start()
    try:
        p = Producer({"bootstrap.servers": first.bootstrap, "log_level": 0})
        for i in range(20):
            p.produce(TOPIC, value=b"v%d" % i)
        assert p.flush(30) == 0
        with GroupAdmin(first.bootstrap) as admin:
            assert admin.commit(GROUP, {(TOPIC, 0): 5}) == {}
        time.sleep(1.5)  # let the idle broker's periodic jobs run once before the snapshot
        before = tree(data)
        assert ".lock" in before

        r = serve("--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(data))
        assert_refused(r, 1, str(data), "in use")
        assert tree(data) == before  # nothing created, written, renamed or deleted

        # the first broker is unharmed: an offset commit it acknowledges now survives its kill -9
        with GroupAdmin(first.bootstrap) as admin:
            assert admin.commit(GROUP, {(TOPIC, 0): 17}) == {}
        first.kill()
        first.start()  # the kernel dropped the dead broker's lock: a restart is not blocked
        c = Consumer({"bootstrap.servers": first.bootstrap, "group.id": GROUP, "log_level": 0})
        try:
            got = c.committed([TopicPartition(TOPIC, 0)], timeout=20)
        finally:
            c.close()
        assert got[0].offset == 17
    finally:
        first.close()


def test_lock_is_released_on_clean_shutdown(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with EmbeddedBroker(data_dir=data, log_path=tmp_path / "a.log"):
        pass
    with EmbeddedBroker(data_dir=data, log_path=tmp_path / "b.log") as b:
        assert b.running


def test_two_brokers_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    """Thread mode: flock locks belong to the open file, so the same process cannot
    take the lock twice either (a POSIX fcntl lock would let it)."""
    data = tmp_path / "data"
    with EmbeddedBroker(data_dir=data, mode="thread", log_path=tmp_path / "a.log"):
        second = EmbeddedBroker(data_dir=data, mode="thread", log_path=tmp_path / "b.log")
        with pytest.raises(RuntimeError, match="in use by another broker"):
            second.start(timeout=20)


def test_port_taken_refuses_before_creating_the_data_dir(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = tmp_path / "new-data"
        r = serve("--listen", f"127.0.0.1:{port}", "--data-dir", str(data))
        assert_refused(r, 1, f"127.0.0.1:{port}")
        assert not data.exists()


def test_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_bytes(b"not a directory")
    r = serve("--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(data))
    assert_refused(r, 1, str(data), "not a directory")
    assert data.read_bytes() == b"not a directory"


# -- EmbeddedBroker -----------------------------------------------------------


@pytest.mark.parametrize("module", ["copy", "logging"])
def test_embedded_broker_ignores_the_callers_directory(tmp_path: Path, monkeypatch: Any, module: str) -> None:
    """A user's copy.py (or logging.py) in the current directory must not shadow the
    standard library in the broker process: auto-creating a topic deep-copies."""
    from confluent_kafka import Producer

    cwd = tmp_path / "project"
    cwd.mkdir()
    (cwd / f"{module}.py").write_text("X = 1  # a user's script that happens to share a stdlib module's name\n")
    monkeypatch.chdir(cwd)
    with EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log") as b:
        p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 15000, "log_level": 0})
        errors: list[Any] = []
        p.produce("auto-created", value=b"x", on_delivery=lambda err, _msg: errors.append(err))
        assert p.flush(30) == 0
        assert errors == [None]
    assert "Traceback" not in (tmp_path / "broker.log").read_text()


def test_embedded_broker_that_fails_to_start_keeps_its_log(tmp_path: Path) -> None:
    b = EmbeddedBroker(config={"num.partitions": "abc"})  # own temporary data dir and log
    with pytest.raises(RuntimeError) as info:
        b.start()
    b.close()
    assert str(b.log_path) in str(info.value)
    assert "num.partitions" in str(info.value)  # the broker's one-line reason
    assert b.log_path.exists(), "the log of a failed start was removed"
    assert "invalid value 'abc' for num.partitions" in b.log_path.read_text()
    b.log_path.unlink()
