"""``oncelog serve`` whose start fails on the data directory (loading a log, an unreadable file of
``meta/``) ends with one clear line and exit status 1, never a Python traceback (review of iofail,
findings 4 and 7). Descriptor exhaustion (EMFILE) names the limit to raise: under the same limit
every start fails the same way."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.cli import main
from oncelog.storage import engine
from oncelog.testing.embedded import free_port


def _data_with_a_topic(tmp_path: Path, partitions: int = 3) -> Path:
    data = tmp_path / "data"
    broker = Broker(BrokerConfig(data_dir=data))
    broker.create_topic("t", partitions)
    broker.close()
    return data


def _serve(data: Path) -> int:
    return main(["serve", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(data)])


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_a_start_out_of_file_descriptors_exits_1_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data_with_a_topic(tmp_path)
    real = engine.PartitionLog.open

    def failing(directory: Path, *args: object, **kwargs: object) -> object:
        if directory.name == "t-1":
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(directory, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.PartitionLog, "open", failing)
    assert _serve(data) == 1
    line = _one_line(capsys)
    assert line.startswith(f"error: cannot load the data directory {data}:"), line
    assert "loading of the log t-1: Too many open files" in line and "RLIMIT_NOFILE" in line, line


def test_a_start_whose_recovery_fails_on_the_disk_exits_1_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data_with_a_topic(tmp_path)

    def eio(*args: object, **kwargs: object) -> object:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(engine.PartitionLog, "open", eio)
    assert _serve(data) == 1
    line = _one_line(capsys)
    assert "Input/output error" in line and "RLIMIT_NOFILE" not in line, line
