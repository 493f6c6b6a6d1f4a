"""An embedded broker on a free loopback port with a temporary data dir.

``with EmbeddedBroker() as b: b.bootstrap`` starts the real broker. The
default ``mode="subprocess"`` runs ``oncelog serve`` in a child process
(``python -P``: the caller's current directory cannot shadow a module): it
does not share the test's GIL (kafka-python and aiokafka are pure Python), it
can be killed -9 for crash tests, and it starts in well under a second
(see docs/architecture.md). ``mode="thread"`` runs the same server on an
event loop in a background thread of the test process. A broker that fails to
start raises with its log's path (and its last line) in the message, and that
log is kept.

A broker whose log directory fails (an I/O error of a write or fsync) stops
serving, as ``oncelog serve`` does: the subprocess exits with status 1 after
one CRITICAL line in its log (:attr:`returncode` holds 1 once it is
stopped or closed); a thread-mode broker's thread ends and :attr:`failure`
holds the reason. :attr:`running` is then False, and
:meth:`stop`/:meth:`close` just clean up.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class EmbeddedBroker:
    def __init__(
        self,
        data_dir: str | Path | None = None,
        port: int = 0,
        config: dict[str, str] | None = None,
        mode: str = "subprocess",
        host: str = "127.0.0.1",
        log_path: str | Path | None = None,
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="oncelog-"))
        self.host = host
        self.port = port or free_port(host)
        self.config = dict(config or {})
        self.mode = mode
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / f"{self.data_dir.name}.log"
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._failed = False  # a failed start keeps the log file for the post-mortem
        self.failure: BaseException | None = None  # thread mode: why the broker stopped by itself
        self.returncode: int | None = None  # subprocess mode: the exit status of the last process

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout: float = 30.0) -> "EmbeddedBroker":
        if self.mode == "thread":
            self._start_thread(timeout)
        else:
            self._start_process(timeout)
        return self

    def _config_file(self) -> Path | None:
        if not self.config:
            return None
        path = self.data_dir.parent / f"{self.data_dir.name}.properties"
        from oncelog.broker.config import format_properties

        path.write_text(format_properties(self.config))
        return path

    def _start_process(self, timeout: float) -> None:
        # -P: the caller's current directory is not put first on sys.path, so a
        # user's copy.py or logging.py there cannot shadow the standard library
        # (PYTHONPATH still applies, unlike -I)
        cmd = [
            sys.executable,
            "-P",
            "-m",
            "oncelog.cli",
            "serve",
            "--listen",
            self.bootstrap,
            "--data-dir",
            str(self.data_dir),
        ]
        cfg = self._config_file()
        if cfg:
            cmd += ["--config", str(cfg)]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if line.startswith(b"oncelog listening on"):
                break
            if not line and self.proc.poll() is not None:
                code = self.proc.returncode
                self._close_proc()
                self._failed = True  # close() keeps the log
                raise RuntimeError(f"broker exited with {code} before it was ready; its log: {self.log_path}"
                                   f"{_last_line(self.log_path)}")
            if time.monotonic() > deadline:
                self.kill()
                self._failed = True
                raise TimeoutError(f"broker did not start within {timeout:g} s; its log: {self.log_path}")

    def _start_thread(self, timeout: float) -> None:
        from oncelog.broker.config import BrokerConfig, parse_properties
        from oncelog.broker.server import serve

        props = parse_properties(self._config_file().read_text()) if self.config else {}
        cfg = BrokerConfig.from_properties(props, host=self.host, port=self.port, data_dir=self.data_dir)
        ready = threading.Event()
        failure: list[BaseException] = []

        def on_ready(_server: Any, stop: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
            self._stop_event, self._loop = stop, loop
            ready.set()

        def main() -> None:
            try:
                asyncio.run(serve(cfg, ready=on_ready))
            except BaseException as exc:  # reported by start() below, or kept in self.failure
                if ready.is_set():
                    self.failure = exc
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=main, name="oncelog-broker", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError("broker thread did not start")
        if failure:
            self._thread = None
            raise RuntimeError(f"broker did not start: {failure[0]}") from failure[0]

    def stop(self, timeout: float = 30.0) -> None:
        """Clean shutdown (SIGTERM)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self._close_proc()
        if self._thread is not None and self._loop is not None and self._stop_event is not None:
            if self._thread.is_alive():
                try:
                    self._loop.call_soon_threadsafe(self._stop_event.set)
                except RuntimeError:  # the loop closed meanwhile: the broker stopped by itself
                    pass
            self._thread.join(timeout)
            self._thread = None

    def kill(self) -> None:
        """Hard crash: SIGKILL, no shutdown code runs (subprocess mode only)."""
        if self.proc is None:
            raise RuntimeError("kill() needs mode='subprocess'")
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close_proc()

    def _close_proc(self) -> None:
        if self.proc is not None:
            self.returncode = self.proc.poll()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.proc = None

    def restart(self, hard: bool = False) -> None:
        if hard:
            self.kill()
        else:
            self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return (self.proc is not None and self.proc.poll() is None) or (
            self._thread is not None and self._thread.is_alive())

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            for suffix in (".properties",) if self._failed else (".log", ".properties"):
                p = self.data_dir.parent / f"{self.data_dir.name}{suffix}"
                if p.exists() and os.path.isfile(p):
                    p.unlink()


def _last_line(path: Path) -> str:
    """``: <last line of the log>`` (the broker's one-line reason), or nothing."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1]}" if lines else ""
