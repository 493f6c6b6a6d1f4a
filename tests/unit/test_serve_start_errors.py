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
from oncelog.broker.config import BrokerConfig, StartupError
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


def _start_error(data: Path) -> str:
    """The StartupError of Broker(data) (``oncelog serve`` prints it as one line, exit 1). Not via
    serve here: on a start that succeeds, serve would wait for a signal."""
    with pytest.raises(StartupError) as info:
        Broker(BrokerConfig(data_dir=data))
    return str(info.value)


@pytest.mark.parametrize("content", ["", "abc", "-5"])
def test_a_corrupt_producer_id_block_fails_the_start(tmp_path: Path, content: str) -> None:
    """Before, ids restarted at 0 and the ids issued before were handed out again."""
    data = _data_with_a_topic(tmp_path, 1)
    (data / "meta" / "producer_id_block").write_text(content)
    assert _start_error(data).startswith(f"{data / 'meta' / 'producer_id_block'} is corrupt")


def test_an_unreadable_producer_id_block_fails_the_start(tmp_path: Path) -> None:
    data = _data_with_a_topic(tmp_path, 1)
    block = data / "meta" / "producer_id_block"
    block.unlink(missing_ok=True)
    block.mkdir()  # read_text: IsADirectoryError, an OSError that is not ENOENT (as EIO or EACCES would be)
    assert _start_error(data).startswith(f"cannot read {block}:")


def test_a_missing_producer_id_block_starts_the_ids_at_0(tmp_path: Path) -> None:
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        assert broker.producer_ids.generate() == 0 and broker.producer_ids.generate() == 1
    finally:
        broker.close()
    again = Broker(BrokerConfig(data_dir=tmp_path / "data"))
    try:
        assert again.producer_ids.generate() == 1000  # the next block, above every id issued
    finally:
        again.close()


@pytest.mark.parametrize("content", ["", "garbage", "-5"])
def test_a_corrupt_coordinator_epoch_fails_the_start(tmp_path: Path, content: str) -> None:
    """Review of iofix, finding 7: the epoch silently restarted at 0 (and 0 was written back); a
    partition that saw a marker of a later epoch then fenced every marker of this coordinator."""
    data = _data_with_a_topic(tmp_path, 1)
    (data / "meta" / "coordinator_epoch").write_text(content)
    assert _start_error(data).startswith(f"{data / 'meta' / 'coordinator_epoch'} is corrupt")
    assert (data / "meta" / "coordinator_epoch").read_text() == content  # not overwritten


def test_an_unreadable_coordinator_epoch_fails_the_start(tmp_path: Path) -> None:
    data = _data_with_a_topic(tmp_path, 1)
    path = data / "meta" / "coordinator_epoch"
    path.unlink(missing_ok=True)
    path.mkdir()  # read_text: IsADirectoryError, an OSError that is not ENOENT (as EIO or EACCES would be)
    assert _start_error(data).startswith(f"cannot read {path}:")


def test_the_coordinator_epoch_grows_at_each_start_and_starts_at_0(tmp_path: Path) -> None:
    epochs = []
    for _ in range(3):
        broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
        epochs.append(broker.coordinator_epoch)
        broker.close()
    assert epochs == [0, 1, 2]


def test_oncelog_serve_with_a_corrupt_coordinator_epoch_exits_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data_with_a_topic(tmp_path, 1)
    (data / "meta" / "coordinator_epoch").write_text("garbage")
    assert _serve(data) == 1
    line = _one_line(capsys)
    assert "coordinator_epoch is corrupt" in line, line


def test_the_start_failure_line_names_the_file_of_an_unguarded_error(tmp_path: Path) -> None:
    """Review of iofix, finding 8: an OSError raised outside any guard (an open in Broker.__init__)
    gave "Too many open files" and no file name."""
    from oncelog.broker.server import start_failure

    config = BrokerConfig(data_dir=tmp_path / "data")
    exc = OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(tmp_path / "data" / "meta" / "some_file"))
    line = start_failure(config, exc)
    assert f"Too many open files: {tmp_path / 'data' / 'meta' / 'some_file'} (open files limit" in line, line
    line = start_failure(config, OSError(errno.EIO, os.strerror(errno.EIO)))  # no file name: as before
    assert line == f"cannot load the data directory {tmp_path / 'data'}: Input/output error"
