"""A failed fsync of the log directory: never retried, the directory goes offline, the broker stops.

Linux reports a writeback error once (errseq) and may mark the failed pages clean, so
a later fdatasync can return 0 for data that never reached the disk: nothing may be
reported durable after a failed one. As Kafka's broker does when its last log
directory fails (LogDirFailureChannel, then a halt), the requests waiting on the
failed round and the requests already read behind them get Kafka's errors (produce
KAFKA_STORAGE_ERROR, the group coordinator NOT_COORDINATOR), and the broker stops:
``oncelog serve`` exits 1 after one line, an EmbeddedBroker stops serving. The next
start recovers the logs from the files.

Most tests run the broker in a thread of the test process so they can make an
fdatasync fail (``PartitionLog._sync``, under the failure channel, or ``os.fdatasync``
for the close at shutdown); three run ``oncelog serve`` as a process, two with the same
fault and one whose retention fails to delete a segment (an error outside the data path
takes the directory offline too). About 4 s in all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.broker.server import LogDirFailed
from oncelog.client.connection import Connection
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_record_batch
from oncelog.storage.log import PartitionLog
from oncelog.testing import EmbeddedBroker
from oncelog.testing.embedded import free_port
from tests.integration.test_txn_protocol import Pipelined, fetch

pytestmark = pytest.mark.timeout(120)

TOPIC = "lf"
PRODUCE, OFFSET_COMMIT, OFFSET_FETCH, INIT_PRODUCER_ID = 0, 8, 9, 22


class Faults:
    """The next ``fail[directory name]`` fdatasyncs of that log raise EIO."""

    def __init__(self) -> None:
        self.fail: dict[str, int] = {}
        self.lock = threading.Lock()


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    f = Faults()
    real_sync = PartitionLog._sync

    def sync(self: PartitionLog) -> int:
        with f.lock:
            if f.fail.get(self.directory.name, 0) > 0:
                f.fail[self.directory.name] -= 1
                raise OSError(5, "Input/output error")
        return real_sync(self)

    monkeypatch.setattr(PartitionLog, "_sync", sync)
    return f


def start(data: Path) -> EmbeddedBroker:
    return EmbeddedBroker(data_dir=data, mode="thread", config={"group.initial.rebalance.delay.ms": "0"}).start()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = start(tmp_path / "data")
    try:
        create_topic(b.bootstrap)
        yield b
    finally:
        b.close()


def create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(10)


def wait_stopped(b: EmbeddedBroker, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while b.running:
        assert time.monotonic() < deadline, "the broker kept running after its log directory failed"
        time.sleep(0.02)


def produce_body(batch: bytes) -> dict[str, Any]:
    return {"transactional_id": None, "acks": -1, "timeout": 10000,
            "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}]}


def partition_answer(r: Any) -> Any:
    (p,) = r.responses[0].partition_responses
    return p



def _exited_1_with_one_critical_line(code: int, err: str, expected: str) -> None:
    """The broker process exited 1, printed no traceback and exactly one ERROR/CRITICAL line: a CRITICAL one
    containing ``expected``."""
    assert code == 1, err
    assert "Traceback" not in err, err
    alarms = [line for line in err.splitlines() if " ERROR " in line or " CRITICAL " in line]
    assert len(alarms) == 1, err
    assert "CRITICAL" in alarms[0] and expected in alarms[0], err

def test_a_retried_idempotent_produce_is_not_acknowledged_after_a_failed_fsync(
    broker: EmbeddedBroker, faults: Faults, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The batch's fdatasync fails: KAFKA_STORAGE_ERROR, and so for its retry pipelined right
    behind it (a duplicate by sequence). The producer's retry after that answer is not
    acknowledged by this broker process (before: the next round's fdatasync returned 0 and
    the duplicate was acknowledged at offset 0 although the first copy may not be on disk):
    the broker has stopped reading and closes the connection. After a restart the recovered
    log answers the retry as the duplicate it is."""
    with Connection(broker.bootstrap) as conn:
        r = conn.request(INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": -1,
                                               "producer_id": -1, "producer_epoch": -1})
        assert r.error_code == 0
        pid, epoch = r.producer_id, r.producer_epoch
        batch = encode_record_batch([Record(None, b"once")], producer_id=pid, producer_epoch=epoch, base_sequence=0)
        faults.fail[f"{TOPIC}-0"] = 1
        first = Pipelined(conn, PRODUCE, 9, produce_body(batch), send=False)
        pipelined = Pipelined(conn, PRODUCE, 9, produce_body(batch), send=False)
        with caplog.at_level("INFO"):
            conn.sock.sendall(first.frame + pipelined.frame)  # back to back: both read before the failure
            a, b = partition_answer(first.result()), partition_answer(pipelined.result())
            assert (E(a.error_code), E(b.error_code)) == (E.kafka_storage_error, E.kafka_storage_error)
            assert faults.fail[f"{TOPIC}-0"] == 0
            try:  # the producer retries once more after the error (the disk would "work" now)
                retried = E(partition_answer(conn.request(PRODUCE, 9, produce_body(batch))).error_code)
            except (ConnectionError, OSError):
                retried = None  # not read: the broker stopped
            assert retried in (None, E.kafka_storage_error), retried
            wait_stopped(broker)
    assert isinstance(broker.failure, LogDirFailed), broker.failure
    critical = [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert len(critical) == 1 and f"fsync of {TOPIC}-0: Input/output error" in critical[0], critical
    broker.close()

    again = start(tmp_path / "data")  # recovery reads back what the file holds (here: the batch)
    try:
        with Connection(again.bootstrap) as conn:
            dup = partition_answer(conn.request(PRODUCE, 9, produce_body(batch)))
            assert (dup.error_code, dup.base_offset) == (0, 0)
            f = fetch(conn, TOPIC, 0, False)
            assert f.high_watermark == 1  # one copy
    finally:
        again.close()


def test_an_offset_commit_whose_fsync_failed_is_never_served(broker: EmbeddedBroker, faults: Faults) -> None:
    """The commit's fdatasync fails (NOT_COORDINATOR); a commit of another group pipelined
    behind it finds the log directory offline (NOT_COORDINATOR, nothing written), and so does
    the OffsetFetch behind that: the failed offset is never served (before: the second
    commit's successful fsync was taken to cover the first, and OffsetFetch served it)."""

    def commit(group: str, offset: int) -> Pipelined:
        return Pipelined(conn, OFFSET_COMMIT, 8, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]},
                         send=False)

    with Connection(broker.bootstrap) as conn:
        faults.fail["__consumer_offsets-0"] = 1
        failed, other = commit("g", 7), commit("h", 3)
        fetch = Pipelined(conn, OFFSET_FETCH, 8, {
            "groups": [{"group_id": "g", "topics": [{"name": TOPIC, "partition_indexes": [0]}]}],
            "require_stable": False}, send=False)
        conn.sock.sendall(failed.frame + other.frame + fetch.frame)
        assert failed.result().topics[0].partitions[0].error_code == E.not_coordinator
        assert other.result().topics[0].partitions[0].error_code == E.not_coordinator
        (group,) = fetch.result().groups
        served = [p.committed_offset for t in group.topics for p in t.partitions]
        assert (E(group.error_code), served) == (E.not_coordinator, [])
    wait_stopped(broker)
    assert isinstance(broker.failure, LogDirFailed)


PRELUDE = """
import sys
from oncelog.storage.log import PartitionLog

real_sync = PartitionLog._sync

def _sync(self):
    if self.directory.name == "lf-0":
        raise OSError(5, "Input/output error")
    return real_sync(self)

PartitionLog._sync = _sync
from oncelog.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_standalone_broker_exits_1_with_one_line(tmp_path: Path) -> None:
    """``oncelog serve`` whose fdatasync of lf-0 fails: the produce is answered
    KAFKA_STORAGE_ERROR, then the process logs one line (no traceback) and exits 1,
    without writing a clean-shutdown marker (the next start recovers the logs)."""
    port = free_port()
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE, "serve", "--listen", f"127.0.0.1:{port}",
                             "--data-dir", str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"oncelog listening on"), proc.stderr
        bootstrap = f"127.0.0.1:{port}"
        create_topic(bootstrap)
        with Connection(bootstrap) as conn:
            batch = encode_record_batch([Record(None, b"x")])
            answer = partition_answer(conn.request(PRODUCE, 9, produce_body(batch)))
            assert answer.error_code == E.kafka_storage_error
        code = proc.wait(15)
        err = proc.stderr.read().decode() if proc.stderr is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _exited_1_with_one_critical_line(code, err, f"log directory {data} failed (fsync of lf-0: Input/output error)")
    assert not (data / "lf-0" / ".clean_shutdown").exists()
    # nothing at all was written after the failure (review: the internal logs were not checked)
    assert not list(data.rglob(".clean_shutdown")), sorted(map(str, data.rglob(".clean_shutdown")))


CLOSE_PRELUDE = """
import os, sys
real = os.fdatasync
def fdatasync(fd):
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        path = ""
    if "/lf-0/" in path and os.path.exists(os.environ["FAILFLAG"]):
        raise OSError(5, "Input/output error")
    return real(fd)
os.fdatasync = fdatasync
from oncelog.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_fsync_error_at_a_clean_shutdown_exits_1_with_one_line(tmp_path: Path) -> None:
    """The disk fails after the last acknowledged round, then SIGTERM: the fdatasyncs of lf-0's
    close fail. That takes the directory offline like any other fsync (before: a traceback,
    the logs after lf-0 left open, no CRITICAL line): one line, exit 1, no clean-shutdown
    marker for lf-0 (the next start recovers it)."""
    port = free_port()
    data = tmp_path / "data"
    flag = tmp_path / "fail"
    env = {**__import__("os").environ, "FAILFLAG": str(flag)}
    proc = subprocess.Popen([sys.executable, "-c", CLOSE_PRELUDE, "serve", "--listen", f"127.0.0.1:{port}",
                             "--data-dir", str(data)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"oncelog listening on"), proc.stderr
        bootstrap = f"127.0.0.1:{port}"
        create_topic(bootstrap)
        with Connection(bootstrap) as conn:
            batch = encode_record_batch([Record(None, b"x")])
            assert partition_answer(conn.request(PRODUCE, 9, produce_body(batch))).error_code == 0
        flag.touch()  # the disk fails now
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
        err = proc.stderr.read().decode() if proc.stderr is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _exited_1_with_one_critical_line(code, err, f"log directory {data} failed (fsync of lf-0 at shutdown: ")
    assert not (data / "lf-0" / ".clean_shutdown").exists()


def test_a_thread_broker_whose_shutdown_fsync_failed_releases_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same in thread mode: ``failure`` is LogDirFailed and the data directory's lock is
    released, so a broker restarts on it in the same process and reads the record back
    (before: failure was the bare OSError and the lock stayed held)."""
    real = os.fdatasync
    failing = threading.Event()

    def fdatasync(fd: int) -> None:
        if failing.is_set():
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if f"/{TOPIC}-0/" in path:
                raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    data = tmp_path / "data"
    b = start(data)
    try:
        create_topic(b.bootstrap)
        with Connection(b.bootstrap) as conn:
            batch = encode_record_batch([Record(None, b"x")])
            assert partition_answer(conn.request(PRODUCE, 9, produce_body(batch))).error_code == 0
        failing.set()
    finally:
        b.close()
    assert isinstance(b.failure, LogDirFailed), repr(b.failure)
    assert not (data / f"{TOPIC}-0" / ".clean_shutdown").exists()
    failing.clear()
    again = start(data)
    try:
        with Connection(again.bootstrap) as conn:
            answer = partition_answer(conn.request(PRODUCE, 9, produce_body(encode_record_batch([Record(None, b"y")]))))
            assert answer.error_code == 0 and answer.base_offset == 1, answer  # recovered "x" at offset 0
    finally:
        again.close()


RETENTION_PRELUDE = """
import os, sys
real = os.unlink
def unlink(path, *args, **kwargs):
    if "/lf-0/" in str(path) and str(path).endswith(".log"):
        raise OSError(5, "Input/output error")
    return real(path, *args, **kwargs)
os.unlink = unlink
from oncelog.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_failed_segment_deletion_of_retention_stops_the_broker_with_one_line(tmp_path: Path) -> None:
    """Retention deletes lf-0's first segment and the unlink of its .log fails: the log directory
    goes offline as for a failed fsync (Kafka's deleteSegments runs under maybeHandleIOException;
    before, one ERROR line and the broker went on), the process logs one line (no traceback)
    and exits 1 without a clean-shutdown marker. About 2 s."""
    port = free_port()
    data = tmp_path / "data"
    props = tmp_path / "server.properties"
    props.write_text("log.retention.check.interval.ms=100\n")
    proc = subprocess.Popen([sys.executable, "-c", RETENTION_PRELUDE, "serve", "--listen", f"127.0.0.1:{port}",
                             "--data-dir", str(data), "--config", str(props)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"oncelog listening on"), proc.stderr
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topic = NewTopic(TOPIC, 1, 1, config={"retention.ms": "1", "segment.ms": "1"})
        admin.create_topics([topic])[TOPIC].result(10)
        with Connection(bootstrap) as conn:
            batch = encode_record_batch([Record(None, b"x")])
            assert partition_answer(conn.request(PRODUCE, 9, produce_body(batch))).error_code == 0
        code = proc.wait(15)  # the next retention pass rolls, then deletes the first segment
        err = proc.stderr.read().decode() if proc.stderr is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _exited_1_with_one_critical_line(code, err, f"log directory {data} failed (retention of lf-0: Input/output error)")
    assert not list(data.rglob(".clean_shutdown")), sorted(map(str, data.rglob(".clean_shutdown")))
