"""Shared helpers for the oncelog benchmarks: the two brokers and run metadata.

* ``MockCluster``: librdkafka's built-in mock cluster, driven through ctypes
  from the librdkafka that ships inside the confluent-kafka wheel. It runs in
  this process on its own C threads and listens on 127.0.0.1.
* ``OncelogBroker``: ``python -m oncelog.cli serve`` as a child process,
  optionally under pyinstrument.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import glob
import importlib.metadata
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent
READY_RE = re.compile(rb"oncelog listening on (\S+:\d+)")

RD_KAFKA_PRODUCER = 0


def find_librdkafka() -> str:
    """Path of the librdkafka bundled with the installed confluent_kafka wheel."""
    pkg = Path(confluent_kafka.__file__).resolve().parent
    patterns = [pkg.parent / "confluent_kafka.libs", pkg / ".libs", pkg]
    for d in patterns:
        hits = sorted(glob.glob(str(d / "librdkafka*.so*")))
        if hits:
            return hits[0]
    raise FileNotFoundError(f"no bundled librdkafka found near {pkg}")


def _load_librdkafka() -> ctypes.CDLL:
    lib = ctypes.CDLL(find_librdkafka())
    vp, cp, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "rd_kafka_version_str": ([], cp),
        "rd_kafka_conf_new": ([], vp),
        "rd_kafka_conf_set": ([vp, cp, cp, cp, sz], i),
        "rd_kafka_conf_destroy": ([vp], None),
        "rd_kafka_new": ([i, vp, cp, sz], vp),
        "rd_kafka_destroy": ([vp], None),
        "rd_kafka_mock_cluster_new": ([vp, i], vp),
        "rd_kafka_mock_cluster_bootstraps": ([vp], cp),
        "rd_kafka_mock_topic_create": ([vp, cp, i, i], i),
        "rd_kafka_mock_cluster_destroy": ([vp], None),
    }
    for name, (argtypes, restype) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


class MockCluster:
    """librdkafka's mock cluster (in this process), ``brokers`` brokers."""

    def __init__(self, brokers: int = 1) -> None:
        self.lib = lib = _load_librdkafka()
        self.version = lib.rd_kafka_version_str().decode()
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # The handle only hosts the mock; silence its "no bootstrap.servers" notice.
        if lib.rd_kafka_conf_set(conf, b"log_level", b"4", errstr, len(errstr)) != 0:
            lib.rd_kafka_conf_destroy(conf)
            raise RuntimeError(errstr.value.decode())
        # rd_kafka_new takes ownership of conf on success only.
        self.rk = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not self.rk:
            lib.rd_kafka_conf_destroy(conf)
            raise RuntimeError(f"rd_kafka_new: {errstr.value.decode()}")
        self.mcluster = lib.rd_kafka_mock_cluster_new(self.rk, brokers)
        if not self.mcluster:
            lib.rd_kafka_destroy(self.rk)
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap = lib.rd_kafka_mock_cluster_bootstraps(self.mcluster).decode()
        for hostport in self.bootstrap.split(","):
            host = hostport.rsplit(":", 1)[0]
            if not host.startswith("127."):
                self.close()
                raise RuntimeError(f"mock cluster is not on loopback: {self.bootstrap}")

    def alive(self) -> bool:
        return self.mcluster is not None

    def create_topic(self, name: str, partitions: int) -> None:
        err = self.lib.rd_kafka_mock_topic_create(self.mcluster, name.encode(), partitions, 1)
        if err != 0:
            raise RuntimeError(f"rd_kafka_mock_topic_create({name}) -> error {err}")

    def close(self) -> None:
        if self.mcluster:
            self.lib.rd_kafka_mock_cluster_destroy(self.mcluster)
            self.mcluster = None
        if self.rk:
            self.lib.rd_kafka_destroy(self.rk)
            self.rk = None

    def __enter__(self) -> MockCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spark_session(cores: int, app: str) -> "object":
    """A local SparkSession on loopback for the Spark benches, with format("oncelog") registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from oncelog.spark import register

    s = (SparkSession.builder.master(f"local[{cores}]").appName(app)
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    return s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OncelogBroker:
    """``oncelog serve`` as a child process; stdout+stderr go to ``<data_dir>.log``.

    With ``profile_out`` the broker runs under pyinstrument, which writes a
    text report there when the broker is stopped (SIGINT -> KeyboardInterrupt).
    """

    def __init__(self, data_dir: Path, profile_out: Path | None = None,
                 ready_timeout: float = 30.0) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir.with_suffix(".log")
        port = free_port()
        serve = ["serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir)]
        if profile_out is None:
            self.cmd = [sys.executable, "-m", "oncelog.cli", *serve]
        else:
            self.cmd = [sys.executable, "-m", "pyinstrument", "-r", "text",
                        "-o", str(profile_out), "-m", "oncelog.cli", *serve]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        self.bootstrap = self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = READY_RE.search(self.log_path.read_bytes())
            if m:
                return m.group(1).decode()
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        status = self.proc.poll()
        self.close()
        raise RuntimeError(
            f"oncelog did not become ready ({'exit ' + str(status) if status is not None else 'timeout'}): "
            f"{shlex.join(self.cmd)}\n--- {self.log_path} (tail) ---\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def create_topic(self, name: str, partitions: int, timeout: float = 30.0) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        fut = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                                  operation_timeout=timeout, request_timeout=timeout)
        fut[name].result(timeout=timeout + 5)

    def close(self, grace: float = 60.0) -> int | None:
        """SIGINT, then SIGTERM, then SIGKILL. pyinstrument needs the SIGINT path."""
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> OncelogBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        rev = ""
    return rev or "unknown"


def run_metadata() -> dict[str, object]:
    return {
        "command": shlex.join(sys.orig_argv),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "confluent_kafka": importlib.metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "oncelog_git": git_revision(),
    }
